"""HDF5 datasets as the output C (:class:`bigmm.io.filesink.FileSink`): tiles written raw,
committed and journaled, finished and resumed; old C kept through a crash, then swapped; a full
disk at creation and while writing; mapped commits; datasets only h5py can write."""

import errno
import json
import os
import shutil
import subprocess

import h5py
import hdf5plugin
import numpy as np
import pytest

import bigmm

from bigmm.errors import DiskFullError, IncompleteOutputError, OutputExistsError, WriteError
from bigmm.io import mapped, open_input, open_output, read_journal
from bigmm.io.filesink import FileSink
from bigmm.io.identity import fingerprint
from bigmm.io.journal import Journal, journal_path, parse_journal
from bigmm.io.spec import parse_spec
from bigmm.testing import random_matrix
from sink_cases import (BM, JOB, SHAPE, fallocate_fails, finish_all, new_sink, read_back, region,
                        tiles, write_tiles)


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


def test_h5py_dataset_output(tmp_path, inputs):
    _, srcs = inputs
    data = random_matrix(SHAPE, np.float32, seed=14)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        d = f.create_dataset("C", shape=SHAPE, dtype="f4", chunks=(9, 9), compression="gzip")
        sink = new_sink(d, srcs)
        finish_all(sink, data)
        assert sink.result is d
        np.testing.assert_array_equal(d[...], data)


@pytest.mark.parametrize("chunks", [
    None,  # contiguous: HDF5's sieve buffer held the old values
    (9, 9),  # chunked: its chunk cache held them
    (97, 61),  # one chunk of all of C
])
def test_h5py_dataset_output_reads_back_through_the_callers_handle(tmp_path, inputs, chunks):
    _, srcs = inputs
    data = random_matrix(SHAPE, np.float32, seed=17)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        d = f.create_dataset("C", data=np.full(SHAPE, np.nan, np.float32), chunks=chunks)
        assert np.isnan(d[0, 0])  # old C in HDF5's caches of this handle
        sink = new_sink(d, srcs)
        finish_all(sink, data)
        sink.close()
        np.testing.assert_array_equal(d[...], data)
    with h5py.File(tmp_path / "d.h5", "r") as f:
        np.testing.assert_array_equal(f["C"][...], data)


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


@pytest.mark.parametrize("given", [False, True])  # a new contiguous C; the caller's chunked one
def test_a_finished_output_is_fingerprinted_from_its_tiles(tmp_path, monkeypatch, given):
    # the finished product's fingerprint is taken from the tiles as written (C is not read
    # back), and it is the one a resume reads back: the finished output is the job's
    a = random_matrix((530, 170), np.float32, seed=11)
    b = random_matrix((170, 410), np.float32, seed=12)  # C of 850 KiB: sampled
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["A"], f["B"] = a, b
        if given:
            f.create_dataset("C", shape=(530, 410), dtype="f4", chunks=(64, 50),
                             compression="gzip")
    sa, sb, sc = f"{tmp_path}/in.h5:/A", f"{tmp_path}/in.h5:/B", f"{tmp_path}/c.h5:/C"
    kw = dict(memory=400_000, backend="numpy")

    def read_back_instead(self):
        raise AssertionError("the finished output was read back")

    monkeypatch.setattr(FileSink, "_fingerprint", read_back_instead)
    if given:
        sc = f"{tmp_path}/in.h5:/C"
        with h5py.File(tmp_path / "in.h5", "r+") as f:
            bigmm.matmul(sa, sb, f["C"], overwrite=True, **kw)
    else:
        bigmm.matmul(sa, sb, sc, **kw)
    monkeypatch.undo()
    with open_input(sc, name="C") as src:
        assert (src.chunks is not None) == given
        with h5py.File(src.where()["path"], "r") as f:
            record = json.loads(f["C"].attrs["bigmm_job"])
        assert record["result"] == fingerprint(src)
    _, stats = bigmm.matmul(sa, sb, sc, resume=True, stats=True, **kw)
    assert stats.tiles_done == 0
