import errno
import hashlib
import json
import os
import pickle
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import h5py
import hdf5plugin
import numpy as np
import pytest

from bigmm.errors import (BigmmError, DiskFullError, DtypeError, IncompleteOutputError,
                          OperandNotFound, OutputExistsError, OutputIsInputError,
                          OutputNotWritable, ResumeError, ShapeError, WriteError)
from bigmm.io import mapped, open_input, open_output, read_journal
from bigmm.io import filesink
from bigmm.io import direct as direct_io
from bigmm.io import mapped as mapped_io
from bigmm.io import region as region_mod
from bigmm.io.journal import Journal, journal_path, parse_journal
from bigmm.io.spec import parse_spec
from bigmm.io.region import write_region
from bigmm.testing import random_matrix

SHAPE = (97, 61)
BM, BN = 20, 17  # tiles that divide nothing
JOB = {"plan": {"bm": 20, "bn": 17}, "alpha": 1.5, "beta": 0.0}


def sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def tiles():
    return [(i, j) for i in range(-(-SHAPE[0] // BM)) for j in range(-(-SHAPE[1] // BN))]


def region(t):
    i, j = t
    return i * BM, min((i + 1) * BM, SHAPE[0]), j * BN, min((j + 1) * BN, SHAPE[1])


def write_tiles(sink, data, which):
    def one(t):
        r0, r1, c0, c1 = region(t)
        sink.write(r0, r1, c0, c1, np.ascontiguousarray(data[r0:r1, c0:c1]))

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, which))


@pytest.fixture
def inputs(tmp_path):
    path = str(tmp_path / "ab.h5")
    with h5py.File(path, "w") as f:
        f["A"] = random_matrix(SHAPE, np.float32, seed=1)
        f["B"] = random_matrix(SHAPE, np.float32, seed=2)
    srcs = [open_input(f"{path}:/A", name="A"), open_input(f"{path}:/B", name="B")]
    before = sha(path)
    yield path, srcs
    for s in srcs:
        s.close()
    assert sha(path) == before  # inputs are never modified


def finish_all(sink, data):
    """Every tile of ``data`` written, committed, and the output marked complete."""
    write_tiles(sink, data, tiles())
    sink.commit(tiles())
    sink.finish()


def read_back(spec):
    with open_input(spec, name="C") as src:
        out = np.full(src.shape, np.nan, src.dtype)
        src.read(0, src.shape[0], 0, src.shape[1], out)
    return out


def new_sink(spec, srcs, **kw):
    kw.setdefault("job", JOB)
    return open_output(spec, shape=SHAPE, dtype=np.float32, inputs=srcs, **kw)


def test_create_write_commit_finish(tmp_path, inputs):
    _, srcs = inputs
    spec = f"{tmp_path}/out.h5:/grp/C"
    data = random_matrix(SHAPE, np.float32, seed=3)
    with new_sink(spec, srcs) as sink:
        assert sink.layout == "contiguous" and sink.done == frozenset() and sink.result == spec
        assert sink.mapped
        write_tiles(sink, data, tiles())
        sink.commit(tiles())
        with pytest.raises(IncompleteOutputError, match="resume"):
            open_input(spec)
        job = read_journal(spec)
        assert {k: v for k, v in job.items() if k != "inputs"} == JOB
        assert sorted(job["inputs"]) == ["A", "B"]
        sink.finish()
    assert read_journal(spec) is None
    assert not [p for p in os.listdir(tmp_path) if "journal" in p]
    with h5py.File(f"{tmp_path}/out.h5", "r") as f:
        d = f["grp/C"]
        assert d.chunks is None and d.compression is None and bool(d.attrs["bigmm_complete"])
    np.testing.assert_array_equal(read_back(spec), data)


def test_resume_skips_committed_tiles(tmp_path, inputs):
    _, srcs = inputs
    spec = f"{tmp_path}/out.h5:/C"
    data = random_matrix(SHAPE, np.float32, seed=4)
    first = tiles()[:7]
    sink = new_sink(spec, srcs)
    write_tiles(sink, data, first)
    sink.commit(first[:5])      # two tiles written but never committed
    sink.close()                # "crash"
    with pytest.raises(OutputExistsError, match="resume"):
        new_sink(spec, srcs)
    with new_sink(spec, srcs, resume=True) as sink:
        assert sink.done == frozenset(first[:5])
        todo = [t for t in tiles() if t not in sink.done]
        write_tiles(sink, data, todo)
        sink.commit(todo)
        sink.finish()
    np.testing.assert_array_equal(read_back(spec), data)


# (truncate C's file to this many bytes, resume recreates it): a run killed while HDF5 was
# creating the file it had just begun leaves a file HDF5 cannot open
BEGUN_FILE = [
    (96, True),    # cut inside the superblock, nothing journaled: created again, then resumed
    (0, True),     # an empty file
]


@pytest.mark.parametrize("size, recreated", BEGUN_FILE)
def test_resume_a_file_killed_while_being_created(tmp_path, inputs, size, recreated):
    _, srcs = inputs
    spec = f"{tmp_path}/out.h5:/C"
    new_sink(spec, srcs).close()  # journal written, file created, no tile finished
    os.truncate(f"{tmp_path}/out.h5", size)
    data = random_matrix(SHAPE, np.float32, seed=5)
    with new_sink(spec, srcs, resume=True) as sink:
        assert sink.done == frozenset()
        finish_all(sink, data)
    np.testing.assert_array_equal(read_back(spec), data)


def test_a_broken_file_with_finished_tiles_is_not_recreated(tmp_path, inputs):
    _, srcs = inputs
    spec = f"{tmp_path}/out.h5:/C"
    sink = new_sink(spec, srcs)
    write_tiles(sink, random_matrix(SHAPE, np.float32), tiles()[:2])
    sink.commit(tiles()[:2])
    sink.close()
    os.truncate(f"{tmp_path}/out.h5", 96)
    with pytest.raises(OSError):  # finished tiles were in it: never deleted behind the user
        new_sink(spec, srcs, resume=True)
    assert os.path.getsize(f"{tmp_path}/out.h5") == 96


def test_a_broken_file_the_run_did_not_create_is_not_recreated(tmp_path, inputs):
    _, srcs = inputs
    with h5py.File(tmp_path / "out.h5", "w") as f:
        f["other"] = np.arange(3)  # the user's file, C added to it
    spec = f"{tmp_path}/out.h5:/C"
    new_sink(spec, srcs).close()
    os.truncate(f"{tmp_path}/out.h5", 96)
    with pytest.raises(OSError):
        new_sink(spec, srcs, resume=True)
    assert os.path.getsize(f"{tmp_path}/out.h5") == 96


@pytest.mark.parametrize("change, word", [
    ({"alpha": 2.0}, "alpha"),           # a different alpha
    ({"plan": "bm=8 bn=8"}, "plan"),     # a different plan
    ({"extra": 1}, "extra"),             # a key the recorded job lacks
])
def test_resume_with_another_job(tmp_path, inputs, change, word):
    _, srcs = inputs
    spec = f"{tmp_path}/out.h5:/C"
    new_sink(spec, srcs).close()
    with pytest.raises(ResumeError, match="Expected the job recorded") as err:
        new_sink(spec, srcs, resume=True, job={**JOB, **change})
    assert word in str(err.value)


def test_resume_without_journal(tmp_path, inputs):
    _, srcs = inputs
    spec = f"{tmp_path}/out.h5:/C"
    with new_sink(spec, srcs, resume=True) as sink:  # nothing to resume: the run starts
        assert not sink.complete and sink.done == frozenset()
        finish_all(sink, random_matrix(SHAPE, np.float32))
    with new_sink(spec, srcs, resume=True) as sink:  # finished by this job: complete
        assert sink.complete and sink.result == spec
    with pytest.raises(ResumeError, match="another job"):
        new_sink(spec, srcs, resume=True, job={**JOB, "alpha": 3.0})


def test_exists_and_overwrite_keeps_other_datasets(tmp_path, inputs):
    _, srcs = inputs
    path = str(tmp_path / "out.h5")
    keep = random_matrix((5, 7), np.float64, seed=5)
    with h5py.File(path, "w") as f:
        f["C"] = random_matrix((3, 3), np.float32)
        f["keep"] = keep
    with pytest.raises(OutputExistsError, match="overwrite") as err:
        new_sink(f"{path}:/C", srcs)
    assert f"{path}:/C" in str(err.value)
    data = random_matrix(SHAPE, np.float32, seed=6)
    with new_sink(f"{path}:/C", srcs, overwrite=True) as sink:
        finish_all(sink, data)
    np.testing.assert_array_equal(read_back(f"{path}:/C"), data)
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["keep"][...], keep)


def test_output_is_input(tmp_path, inputs):
    path, srcs = inputs
    os.symlink(path, tmp_path / "link.h5")
    for spec in (f"{path}:/A", f"{tmp_path}/link.h5:B"):  # same file, or through a link
        with pytest.raises(OutputIsInputError, match="Expected an output other than the inputs"):
            new_sink(spec, srcs, overwrite=True)
    a = random_matrix(SHAPE, np.float32)
    with open_input(a) as src:
        with pytest.raises(OutputIsInputError, match="sharing memory"):
            new_sink(a[:, :], [src])


def test_output_in_the_same_file_as_a_compressed_input(tmp_path):
    path = str(tmp_path / "all.h5")
    a = random_matrix(SHAPE, np.float32, seed=7)
    with h5py.File(path, "w") as f:
        f.create_dataset("A", data=a, chunks=(10, 10), **hdf5plugin.LZ4())  # read by h5py
    with open_input(f"{path}:/A") as src:
        assert src.layout == "h5py"
        with new_sink(f"{path}:/C", [src]) as sink:
            for t in tiles():
                r0, r1, c0, c1 = region(t)
                buf = np.empty((r1 - r0, c1 - c0), np.float32)
                src.read(r0, r1, c0, c1, buf)  # reading while the output is open
                sink.write(r0, r1, c0, c1, 2 * buf)
            sink.commit(tiles())
            sink.finish()
        buf = np.empty(SHAPE, np.float32)
        src.read(0, SHAPE[0], 0, SHAPE[1], buf)
        np.testing.assert_array_equal(buf, a)
    np.testing.assert_array_equal(read_back(f"{path}:/C"), 2 * a)


def test_unwritable_locations(tmp_path, inputs):
    _, srcs = inputs
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    cases = [
        (f"{tmp_path}/missing/c.h5:/C", "does not exist"),    # directory missing
        (f"{plain}/c.h5:/C", "is not a directory"),           # path under a regular file
        (f"{plain}:/C", "not HDF5"),                          # existing file that is not HDF5
        (f"{tmp_path}:/C", "a directory"),                    # a directory as the file
    ]
    for spec, word in cases:
        with pytest.raises(OutputNotWritable, match="Expected") as err:
            new_sink(spec, srcs)
        assert word in str(err.value), str(err.value)
    assert plain.read_text() == "x"


@pytest.mark.parametrize("dataset, word", [
    ("/A/C", "Expected a group at '/A'"),      # below a dataset
    ("/A/x/C", "Expected a group at '/A'"),    # below a dataset, through a missing group
    ("/T/C", "a committed datatype"),          # below a committed datatype
    ("/T", "which is a committed datatype"),   # a committed datatype itself
    ("/G", "which is a group"),                # a group itself
])
def test_output_path_through_a_non_group(tmp_path, inputs, dataset, word):
    _, srcs = inputs
    path = str(tmp_path / "c.h5")
    with h5py.File(path, "w") as f:
        f["A"] = random_matrix((2, 2), np.float32)
        f["T"] = np.dtype("f4")
        f.create_group("G")
    before = sha(path)
    with pytest.raises(OutputNotWritable, match="Expected") as err:
        new_sink(f"{path}:{dataset}", srcs, overwrite=True)
    assert word in str(err.value) and ". Got " in str(err.value), str(err.value)
    assert sha(path) == before


@pytest.mark.parametrize("kw, error, word", [
    ({"overwrite": True}, None, None),                            # replaced as any other
    ({}, OutputExistsError, "overwrite"),                         # kept without overwrite
    ({"reads_c": True}, ShapeError, "empty dataset (no dataspace)"),  # old C for beta != 0
    ({"resume": True}, ResumeError, "not written by bigmm"),      # nothing to resume
    ({"dataset": True}, ShapeError, "empty dataset (no dataspace)"),  # an h5py.Dataset as out
])
def test_output_with_a_null_dataspace(tmp_path, inputs, kw, error, word):
    _, srcs = inputs
    path = str(tmp_path / "c.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("C", data=h5py.Empty("f4"))
    if kw.pop("dataset", False):
        with h5py.File(path, "a") as f, pytest.raises(error, match="Expected") as err:
            new_sink(f["C"], srcs)
        assert word in str(err.value)
        return
    if error is not None:
        with pytest.raises(error, match="Expected") as err:
            new_sink(f"{path}:/C", srcs, **kw)
        assert word in str(err.value)
        return
    data = random_matrix(SHAPE, np.float32, seed=19)
    with new_sink(f"{path}:/C", srcs, **kw) as sink:
        finish_all(sink, data)
    np.testing.assert_array_equal(read_back(f"{path}:/C"), data)


def test_an_empty_file_at_the_output_is_written_as_a_new_one(tmp_path, inputs):
    _, srcs = inputs  # what a kill leaves before HDF5 first writes a new file
    path = tmp_path / "c.h5"
    path.write_bytes(b"")
    data = random_matrix(SHAPE, np.float32, seed=17)
    with new_sink(f"{path}:/C", srcs) as sink:
        finish_all(sink, data)
    np.testing.assert_array_equal(read_back(f"{path}:/C"), data)


def test_a_finished_output_reserves_its_record_and_rewrites_it_in_place(tmp_path, inputs):
    _, srcs = inputs  # finishing allocates nothing in the file (see bigmm.io.h5atomic)
    path = tmp_path / "c.h5"
    sink = new_sink(f"{path}:/C", srcs)
    with h5py.File(path, "r") as f:
        reserved = f["C"].attrs.get_id("bigmm_job").dtype
        assert reserved.kind == "S" and f["C"].attrs["bigmm_job"] == b""
        assert not f["C"].attrs["bigmm_complete"]
    size = os.path.getsize(path)
    with sink:
        finish_all(sink, random_matrix(SHAPE, np.float32, seed=18))
    assert os.path.getsize(path) == size
    with h5py.File(path, "r") as f:
        assert f["C"].attrs.get_id("bigmm_job").dtype == reserved
        assert json.loads(f["C"].attrs["bigmm_job"])["job"]["alpha"] == JOB["alpha"]
        assert f["C"].attrs["bigmm_complete"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_read_only_directory(tmp_path, inputs):
    _, srcs = inputs
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(OutputNotWritable, match="permission denied"):
            new_sink(f"{locked}/c.h5:/C", srcs)
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize("setup, error, word", [
    (None, OperandNotFound, "no such dataset"),            # C missing for beta != 0
    ((SHAPE[0] + 1, SHAPE[1]), ShapeError, "(98, 61)"),    # wrong shape
    ("float64", DtypeError, "float64"),                    # wrong dtype
])
def test_reads_c_needs_matching_c(tmp_path, inputs, setup, error, word):
    _, srcs = inputs
    path = str(tmp_path / "c.h5")
    with h5py.File(path, "w") as f:
        f["other"] = random_matrix((2, 2), np.float32)
        if isinstance(setup, tuple):
            f["C"] = random_matrix(setup, np.float32)
        elif setup:
            f["C"] = random_matrix(SHAPE, setup)
    with pytest.raises(error, match="Expected") as err:
        new_sink(f"{path}:/C", srcs, reads_c=True)
    assert word in str(err.value)
    with pytest.raises(OperandNotFound, match="beta != 0"):
        new_sink(None, srcs, reads_c=True)


def test_beta_old_c_survives_a_crash(tmp_path, inputs):
    _, srcs = inputs
    path = str(tmp_path / "c.h5")
    old = random_matrix(SHAPE, np.float32, seed=8)
    new = random_matrix(SHAPE, np.float32, seed=9)
    with h5py.File(path, "w") as f:
        f["C"] = old
        f["C"].attrs["units"] = "m"
    spec = f"{path}:/C"
    job = {**JOB, "beta": 0.5}
    sink = new_sink(spec, srcs, job=job, reads_c=True)
    half = tiles()[:6]
    for t in half:  # read old C of the tile, then write the tile
        r0, r1, c0, c1 = region(t)
        buf = np.full((r1 - r0, c1 - c0), np.nan, np.float32)
        sink.read(r0, r1, c0, c1, buf)
        np.testing.assert_array_equal(buf, old[r0:r1, c0:c1])
        sink.write(r0, r1, c0, c1, new[r0:r1, c0:c1])
    sink.commit(half)
    sink.close()  # crash: old C must be intact
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["C"][...], old)
    np.testing.assert_array_equal(read_back(spec), old)
    with new_sink(spec, srcs, job=job, reads_c=True, resume=True) as sink:
        assert sink.done == frozenset(half)
        buf = np.full(SHAPE, np.nan, np.float32)
        sink.read(0, SHAPE[0], 0, SHAPE[1], buf)  # old values everywhere, even written tiles
        np.testing.assert_array_equal(buf, old)
        rest = [t for t in tiles() if t not in sink.done]
        write_tiles(sink, new, rest)
        sink.commit(rest)
        sink.finish()
    np.testing.assert_array_equal(read_back(spec), new)
    with h5py.File(path, "r") as f:
        assert sorted(f) == ["C"] and f["C"].attrs["units"] == "m"


@pytest.mark.parametrize("stage", ["journaled", "deleted", "moved"])  # crash points of the swap
def test_crash_during_swap_recovers(tmp_path, inputs, stage):
    _, srcs = inputs
    path = str(tmp_path / "c.h5")
    old, new = random_matrix(SHAPE, np.float32, seed=10), random_matrix(SHAPE, np.float32, seed=11)
    with h5py.File(path, "w") as f:
        f["C"] = old
    spec = f"{path}:/C"
    sink = new_sink(spec, srcs, reads_c=True)
    write_tiles(sink, new, tiles())
    sink.commit(tiles())
    sink.journal.append({"swap": True})
    sink.close()
    with h5py.File(path, "r+") as f:
        if stage in ("deleted", "moved"):
            del f["C"]
        if stage == "moved":
            f.move("C.bigmm-partial", "C")
    with new_sink(spec, srcs, reads_c=True, resume=True) as sink:
        assert sink.done == frozenset(tiles())
        sink.finish()
    np.testing.assert_array_equal(read_back(spec), new)


@pytest.fixture
def small_fs(tmp_path):
    """A 1 MiB tmpfs: a real full disk (needs root and mount; skipped elsewhere)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small file system needs root")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fallocate_fails(monkeypatch, code):
    def fail(fd, offset, length):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "posix_fallocate", fail)


def check_full_at_creation(err, spec, needed):
    msg = str(err.value)
    assert "free" in msg and f"{needed} bytes" in msg and spec.split(":/")[0] in msg, msg
    assert "Nothing was computed" in msg and "resume" in msg


@pytest.mark.parametrize("reads_c", [False, True])  # new output; partial dataset beside old C
def test_disk_full_at_creation_then_resume(tmp_path, inputs, monkeypatch, reads_c):
    _, srcs = inputs
    path = str(tmp_path / "out.h5")
    spec = f"{path}:/C"
    if reads_c:
        with h5py.File(path, "w") as f:
            f["C"] = random_matrix(SHAPE, np.float32, seed=20)
    fallocate_fails(monkeypatch, errno.ENOSPC)
    with pytest.raises(DiskFullError) as err:
        new_sink(spec, srcs, reads_c=reads_c)
    check_full_at_creation(err, spec, SHAPE[0] * SHAPE[1] * 4)
    monkeypatch.undo()
    data = random_matrix(SHAPE, np.float32, seed=12)
    with pytest.raises(OutputExistsError, match="resume"):  # the journal was kept
        new_sink(spec, srcs, reads_c=reads_c)
    with new_sink(spec, srcs, reads_c=reads_c, resume=True) as sink:
        assert sink.mapped and sink.done == frozenset()
        finish_all(sink, data)
    np.testing.assert_array_equal(read_back(spec), data)


def test_disk_full_at_creation_on_a_small_file_system(small_fs, inputs):
    _, srcs = inputs
    spec = f"{small_fs}/c.h5:/C"
    shape = (2048, 2048)  # 16 MiB on a 1 MiB file system
    with pytest.raises(DiskFullError) as err:
        open_output(spec, shape=shape, dtype=np.float32, inputs=srcs, job=JOB)
    check_full_at_creation(err, spec, shape[0] * shape[1] * 4)


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.EINVAL])  # fallocate unsupported
def test_disk_full_in_pwrite_fallback_is_resumable(tmp_path, inputs, monkeypatch, code):
    _, srcs = inputs
    spec = f"{tmp_path}/out.h5:/C"
    data = random_matrix(SHAPE, np.float32, seed=12)
    fallocate_fails(monkeypatch, code)
    sink = new_sink(spec, srcs)
    assert sink.layout == "contiguous" and not sink.mapped
    write_tiles(sink, data, tiles()[:3])
    sink.commit(tiles()[:3])

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwritev", full)
    r0, r1, c0, c1 = region(tiles()[3])
    with pytest.raises(DiskFullError, match="resume") as err:
        sink.write(r0, r1, c0, c1, data[r0:r1, c0:c1].copy())
    assert f"rows {r0}:{r1}, columns {c0}:{c1}" in str(err.value) and "out.h5" in str(err.value)
    sink.close()
    monkeypatch.undo()
    with new_sink(spec, srcs, resume=True) as sink:
        assert sink.mapped and sink.done == frozenset(tiles()[:3])
        rest = tiles()[3:]
        write_tiles(sink, data, rest)
        sink.commit(rest)
        sink.finish()
    np.testing.assert_array_equal(read_back(spec), data)


def test_disk_full_in_pwrite_fallback_on_a_small_file_system(small_fs, inputs, monkeypatch):
    _, srcs = inputs
    fallocate_fails(monkeypatch, errno.EOPNOTSUPP)
    shape = (512, 256)  # 512 KiB: fits on the 1 MiB file system when the output is created
    sink = open_output(f"{small_fs}/c.h5:/C", shape=shape, dtype=np.float32, inputs=srcs,
                       job=JOB)
    assert not sink.mapped
    fd = os.open(small_fs / "filler", os.O_WRONLY | os.O_CREAT)
    try:  # then another file fills the disk
        while os.write(fd, bytes(1 << 16)):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    rows = np.ones((64, shape[1]), np.float32)
    with pytest.raises(DiskFullError, match="disk full") as err:
        for r0 in range(0, shape[0], 64):
            sink.write(r0, r0 + 64, 0, shape[1], rows)
        sink.commit([(0, 0)])
    sink.close()
    assert "c.h5" in str(err.value)


def read_journal_target(spec):
    return parse_journal(journal_path(parse_spec(spec)))[0]["target"]


def test_mapped_commit_syncs_before_journaling(tmp_path, inputs, monkeypatch):
    _, srcs = inputs
    spec = f"{tmp_path}/out.h5:/C"
    data = random_matrix(SHAPE, np.float32, seed=17)
    events = []
    real_sync, real_append = mapped.FileMap.sync, Journal.append

    def sync(self, lo, hi):
        events.append(("sync", lo, hi))
        real_sync(self, lo, hi)

    def append(self, record):
        events.append(("journal", record))
        real_append(self, record)

    monkeypatch.setattr(mapped.FileMap, "sync", sync)
    monkeypatch.setattr(Journal, "append", append)
    with new_sink(spec, srcs) as sink:
        assert sink.mapped
        assert [r for _, r in events] == [{"target": read_journal_target(spec)}]
        events.clear()  # the output's identity, journaled as it opened
        first = [t for t in tiles() if t[0] == 1]  # one row of tiles
        write_tiles(sink, data, first)
        sink.commit(first)
        (_, lo, hi), (_, record) = events
        assert hi - lo == BM * SHAPE[1] * 4  # the rows written, no more
        assert record == {"tiles": [list(t) for t in first]}
        sink.commit([])  # nothing new written: no sync
        assert len(events) == 2
        finish_all(sink, data)
    np.testing.assert_array_equal(read_back(spec), data)


def test_mapped_write_to_a_truncated_output_is_an_error(tmp_path, inputs):
    _, srcs = inputs
    path = str(tmp_path / "out.h5")
    data = random_matrix(SHAPE, np.float32, seed=18)
    sink = new_sink(f"{path}:/C", srcs)
    assert sink.mapped
    write_tiles(sink, data, tiles()[:2])
    os.truncate(path, 2048)
    r0, r1, c0, c1 = region(tiles()[-1])
    with pytest.raises(WriteError) as err:  # not SIGBUS: the file size is checked first
        sink.write(r0, r1, c0, c1, data[r0:r1, c0:c1].copy())
    sink.close()
    assert "truncated" in str(err.value) and path in str(err.value)


def test_array_outputs():
    data = random_matrix(SHAPE, np.float32, seed=13)
    sink = new_sink(None, [])
    write_tiles(sink, data, tiles())
    sink.finish()
    np.testing.assert_array_equal(sink.result, data)
    target = np.full(SHAPE, np.nan, np.float32)
    sink = new_sink(target, [], reads_c=True)
    buf = np.empty((BM, BN), np.float32)
    sink.read(0, BM, 0, BN, buf)
    assert np.isnan(buf).all()
    write_tiles(sink, data, tiles())
    assert sink.result is target
    np.testing.assert_array_equal(target, data)


@pytest.mark.parametrize("array, error, word", [
    (np.empty((SHAPE[0], SHAPE[1] + 1), np.float32), ShapeError, "(97, 62)"),  # wrong shape
    (np.empty(SHAPE, np.float64), DtypeError, "float64"),                       # wrong dtype
    (np.broadcast_to(np.float32(1), SHAPE), OutputNotWritable, "read-only"),    # read-only
])
def test_bad_array_outputs(array, error, word):
    with pytest.raises(error, match="Expected") as err:
        new_sink(array, [])
    assert word in str(err.value)


def test_h5py_dataset_output(tmp_path, inputs):
    _, srcs = inputs
    data = random_matrix(SHAPE, np.float32, seed=14)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        d = f.create_dataset("C", shape=SHAPE, dtype="f4", chunks=(9, 9), compression="gzip")
        sink = new_sink(d, srcs)
        finish_all(sink, data)
        assert sink.result is d
        np.testing.assert_array_equal(d[...], data)


@pytest.mark.parametrize("reads_c", [False, True])  # plain output, old C kept beside it
def test_resume_into_a_dataset_that_is_not_raw_writable(tmp_path, inputs, reads_c):
    _, srcs = inputs
    path = str(tmp_path / "c.h5")
    old, new = random_matrix(SHAPE, np.float32, seed=15), random_matrix(SHAPE, np.float32, seed=16)
    if reads_c:
        with h5py.File(path, "w") as f:
            f["C"] = old
    spec = f"{path}:/C"
    new_sink(spec, srcs, reads_c=reads_c).close()  # crash before any tile
    target = "C.bigmm-partial" if reads_c else "C"
    with h5py.File(path, "r+") as f:  # someone swapped in a compressed dataset
        del f[target]
        d = f.create_dataset(target, shape=SHAPE, dtype="f4", chunks=(8, 8), compression="gzip")
        d.attrs["bigmm_complete"] = False
    with new_sink(spec, srcs, reads_c=reads_c, resume=True) as sink:
        assert sink.layout == "h5py"
        if reads_c:
            buf = np.full(SHAPE, np.nan, np.float32)
            sink.read(0, SHAPE[0], 0, SHAPE[1], buf)
            np.testing.assert_array_equal(buf, old)
        finish_all(sink, new)
    np.testing.assert_array_equal(read_back(spec), new)


def write_from_elsewhere(sink, data, which):
    """Write tiles the way another process does: a pickled RawRegion and write_region."""
    for t in which:
        r0, r1, c0, c1 = region(t)
        where = pickle.loads(pickle.dumps(sink.raw_region(r0, r1, c0, c1)))
        assert where.shape == (r1 - r0, c1 - c0) and len(pickle.dumps(where)) < 2048
        write_region(where, np.ascontiguousarray(data[r0:r1, c0:c1]))


RAW_REGION_CASES = [
    # (output chunks, whether posix_fallocate works, beta != 0)
    # contiguous, reserved and mapped by the sink
    (None, True, False),
    # chunked by other tiles: every region cuts across chunks, several pieces each
    ((16, 11), True, False),
    # chunked by the regions' own tiles: one piece each
    ((BM, BN), True, False),
    # no posix_fallocate: the sink itself would write with pwritev
    (None, False, False),
    # beta != 0: regions lie in the partial dataset while old C stays readable
    ((BM, BN), True, True),
]


@pytest.mark.parametrize("chunks,fallocate,reads_c", RAW_REGION_CASES)
def test_raw_regions_written_elsewhere(tmp_path, inputs, monkeypatch, chunks, fallocate,
                                       reads_c):
    _, srcs = inputs
    path = str(tmp_path / "c.h5")
    spec = f"{path}:/C"
    old, new = random_matrix(SHAPE, np.float32, seed=30), random_matrix(SHAPE, np.float32, seed=31)
    if reads_c:
        with h5py.File(path, "w") as f:
            f["C"] = old
    monkeypatch.setattr(filesink, "MIN_CHUNK_BYTES", 0)
    if not fallocate:
        fallocate_fails(monkeypatch, errno.EOPNOTSUPP)
    sink = new_sink(spec, srcs, reads_c=reads_c, tile=chunks)
    assert sink.mapped == fallocate
    with h5py.File(path, "r") as f:
        assert f[sink.target].chunks == chunks
    pieces = {t: len(sink.raw_region(*region(t)).pieces) for t in tiles()}
    if chunks in (None, (BM, BN)):
        assert set(pieces.values()) == {1}
    else:
        assert min(pieces.values()) > 1
    half = tiles()[:5]
    write_from_elsewhere(sink, new, half)
    sink.commit(half)
    sink.close()  # crash: the written tiles are journaled, old C is intact
    if reads_c:
        np.testing.assert_array_equal(read_back(spec), old)
    with new_sink(spec, srcs, reads_c=reads_c, resume=True) as sink:
        assert sink.done == frozenset(half)
        rest = [t for t in tiles() if t not in sink.done]
        write_from_elsewhere(sink, new, rest)
        sink.commit(rest)
        sink.finish()
    np.testing.assert_array_equal(read_back(spec), new)


def test_no_raw_regions_through_h5py(tmp_path, inputs):
    """Outputs written through h5py (or arrays) have no raw regions: only the sink writes."""
    _, srcs = inputs
    assert new_sink(None, []).raw_region(0, BM, 0, BN) is None
    with h5py.File(tmp_path / "d.h5", "w") as f:
        d = f.create_dataset("C", shape=SHAPE, dtype="f4", chunks=(9, 9), compression="gzip")
        assert new_sink(d, srcs).raw_region(0, BM, 0, BN) is None
    path = str(tmp_path / "c.h5")
    new_sink(f"{path}:/C", srcs).close()
    with h5py.File(path, "r+") as f:  # a filtered dataset in its place
        del f["C"]
        f.create_dataset("C", shape=SHAPE, dtype="f4", chunks=(8, 8), compression="gzip")
    with new_sink(f"{path}:/C", srcs, resume=True) as sink:
        assert sink.layout == "h5py" and sink.raw_region(0, BM, 0, BN) is None


def test_write_region_errors(tmp_path, inputs):
    _, srcs = inputs
    path = str(tmp_path / "c.h5")
    with new_sink(f"{path}:/C", srcs) as sink:
        with pytest.raises(ShapeError, match="Expected"):
            sink.raw_region(0, SHAPE[0] + 1, 0, BN)  # outside C
        where = sink.raw_region(0, BM, 0, BN)
    with pytest.raises(ShapeError, match=r"\(20, 17\)"):  # a tile of another shape
        write_region(where, np.zeros((BM, BN + 1), np.float32))
    with pytest.raises(ShapeError, match="float32"):  # or dtype
        write_region(where, np.zeros((BM, BN), np.float64))
    os.remove(path)
    with pytest.raises(WriteError) as err:  # the file is gone
        write_region(where, np.zeros((BM, BN), np.float32))
    assert f"rows 0:{BM}, columns 0:{BN}" in str(err.value) and "c.h5" in str(err.value)


def sub_regions(h, w):
    """A region split three ways: the top half, and the bottom half in two column parts."""
    return [(0, h // 2, 0, w), (h // 2, h, 0, w // 3), (h // 2, h, w // 3, w)]


REGION_SINK_CASES = [
    # (output chunks, beta != 0)
    # contiguous C: every sub-region is strided rows of the file
    (None, False),
    # chunked by other tiles: regions and their sub-regions cut across chunks
    ((16, 11), False),
    # chunked by the regions' own tiles: each sub-region lies in one chunk
    ((BM, BN), False),
    # beta != 0: old C read through the region's sink, the new values go to the partial dataset
    ((BM, BN), True),
    ((16, 11), True),
]


#: writes mode (bigmm.io.direct.MODE), whether the region's rows can be mapped, and the path
#: the region's sink then takes
REGION_WRITES = [
    ("mapped", True, "mapped"),    # copies into a map of the region's rows, msync in commit
    ("mapped", False, "pwritev"),  # the file cannot be mapped: pwritev, fdatasync in commit
    ("direct", True, "direct"),    # O_DIRECT runs (short ones into the map), fdatasync
    ("direct", False, "direct"),   # O_DIRECT runs, short ones by pwrite, fdatasync
]


@pytest.mark.parametrize("mode,mapped,writes", REGION_WRITES)
@pytest.mark.parametrize("chunks,reads_c", REGION_SINK_CASES)
def test_region_sink_writes_sub_regions(tmp_path, inputs, monkeypatch, chunks, reads_c, mode,
                                        mapped, writes):
    """A RegionSink (what a dask worker's executor writes to) writes each sub-region at its
    byte offsets and nothing else, reads old C from its source, and makes what it wrote
    durable in commit, once."""
    _, srcs = inputs
    path = str(tmp_path / "c.h5")
    spec = f"{path}:/C"
    old, new = random_matrix(SHAPE, np.float32, seed=32), random_matrix(SHAPE, np.float32, seed=33)
    if reads_c:
        with h5py.File(path, "w") as f:
            f["C"] = old
    if writes == "direct" and not direct_io.supports_direct(str(tmp_path)):
        pytest.skip("no O_DIRECT on this file system")
    monkeypatch.setattr(filesink, "MIN_CHUNK_BYTES", 0)
    monkeypatch.setattr(direct_io, "MODE", mode)
    monkeypatch.setattr(direct_io, "DIRECT_MIN", 0)  # every run with a whole page goes direct
    syncs = []
    real_sync, real_msync = region_mod._fdatasync, mapped_io.MappedWrites.sync
    real_dsync = direct_io._fdatasync
    monkeypatch.setattr(region_mod, "_fdatasync", lambda fd: (syncs.append(fd), real_sync(fd)))
    monkeypatch.setattr(direct_io, "_fdatasync", lambda fd: (syncs.append(fd), real_dsync(fd)))
    monkeypatch.setattr(mapped_io.MappedWrites, "sync",
                        lambda self: (syncs.append(self), real_msync(self)))
    per_commit = 2 if (writes, mapped) == ("direct", True) else 1  # msync and fdatasync

    def no_map(*args, **kwargs):
        raise OSError(errno.ENODEV, "no mapping here")

    def stored():
        with h5py.File(path, "r") as f:
            return f[sink.target][...]

    with new_sink(spec, srcs, reads_c=reads_c, tile=chunks) as sink:
        for n, t in enumerate(tiles()):
            r0, r1, c0, c1 = region(t)
            where = pickle.loads(pickle.dumps(sink.raw_region(r0, r1, c0, c1)))
            prior = open_input(np.ascontiguousarray(old[r0:r1, c0:c1])) if reads_c else None
            before = stored() if n == 0 else None
            with monkeypatch.context() as mp:
                if not mapped:
                    mp.setattr(region_mod, "FileMap", no_map)
                rs = region_mod.RegionSink(where, prior)
            with rs:
                assert rs.shape == (r1 - r0, c1 - c0) and rs.done == frozenset()
                assert rs.mapped == mapped and rs.writes == writes
                assert rs.parallel_writes == (writes != "pwritev")
                for a, b, c, d in sub_regions(*rs.shape):
                    # the sub-region's pieces are C's own pieces of it
                    assert region_mod.clip_pieces(where.pieces, a, b, c, d) == \
                        sink._pieces(r0 + a, r0 + b, c0 + c, c0 + d)
                    if reads_c:
                        buf = np.full((b - a, d - c), np.nan, np.float32)
                        rs.read(a, b, c, d, buf)
                        np.testing.assert_array_equal(buf, old[r0 + a:r0 + b, c0 + c:c0 + d])
                    rs.write(a, b, c, d,
                             np.ascontiguousarray(new[r0 + a:r0 + b, c0 + c:c0 + d]))
                assert syncs == []  # writes alone are not synced
                rs.commit([t])
                assert len(syncs) == per_commit  # one msync (fdatasync) makes it durable
                rs.commit([t])
                rs.finish()
                assert len(syncs) == per_commit  # nothing written since: no sync
                syncs.clear()
            if n == 0:  # exactly the region's bytes changed
                want = before.copy()
                want[r0:r1, c0:c1] = new[r0:r1, c0:c1]
                np.testing.assert_array_equal(stored(), want)
        sink.commit(tiles())
        sink.finish()
    np.testing.assert_array_equal(read_back(spec), new)


def test_region_sink_errors(tmp_path, inputs):
    _, srcs = inputs
    path = str(tmp_path / "c.h5")
    with new_sink(f"{path}:/C", srcs) as sink:
        where = sink.raw_region(BM, 2 * BM, BN, 2 * BN)
    with region_mod.RegionSink(where) as rs:
        with pytest.raises(BigmmError, match="old C"):  # beta != 0 needs a source of old C
            rs.read(0, 2, 0, 2, np.zeros((2, 2), np.float32))
        with pytest.raises(ShapeError, match="within"):  # outside the region
            rs.write(0, BM + 1, 0, 2, np.zeros((BM + 1, 2), np.float32))
        with pytest.raises(ShapeError, match=r"\(2, 3\)"):
            rs.write(0, 2, 0, 3, np.zeros((2, 2), np.float32))
    os.remove(path)
    with pytest.raises(WriteError) as err:  # the file is gone
        region_mod.RegionSink(where)
    assert f"rows {BM}:{2 * BM}, columns {BN}:{2 * BN}" in str(err.value)
