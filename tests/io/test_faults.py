"""Faults under a run: a disk that fills up, and inputs that fail to read.

Every case ends in one clear error (DiskFullError / ReadError naming the file and what failed),
leaves the inputs byte-identical and the output marked incomplete, and ``resume=True``
(``--resume``) then finishes it with the same bytes as an uninterrupted run.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import h5py
import hdf5plugin
import numpy as np
import pytest

import bigmm
from bigmm import api, executor, io
from bigmm.cli import main
from bigmm.errors import DiskFullError, IncompleteOutputError, OutputExistsError, ReadError
from bigmm.executor import loads, tuning
from bigmm.io import direct, filesink, h5atomic, journal, mapped, rawio
from bigmm.testing import (Unavailable, fail_after, mount_prefix, random_matrix, sha256,
                           small_filesystem)

M, K, N = 130, 120, 110  # multiples of nothing
BUDGET = "60000"          # 9 tiles of 44 x 37, 5 K panels each
RUN = dict(memory=BUDGET, backend="numpy", io_threads=2)
#: A worker thread dying of an exception would print a traceback: fail instead.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


@pytest.fixture
def job(tmp_path):
    """A (contiguous), B (chunked) and the product of an uninterrupted run."""
    a, b = str(tmp_path / "a.h5"), str(tmp_path / "b.h5")
    with h5py.File(a, "w") as f:
        f["A"] = random_matrix((M, K), np.float64, seed=1)
    with h5py.File(b, "w") as f:
        f.create_dataset("B", data=random_matrix((K, N), np.float64, seed=2), chunks=(30, 50))
    ref = f"{tmp_path / 'ref.h5'}:/C"
    bigmm.matmul(f"{a}:/A", f"{b}:/B", out=ref, **RUN)
    hashes = {p: sha256(p) for p in (a, b)}
    yield f"{a}:/A", f"{b}:/B", read(ref)
    assert {p: sha256(p) for p in hashes} == hashes  # inputs are never modified


def read(spec: str) -> np.ndarray:
    path, name = spec.split(":/")
    with h5py.File(path, "r") as f:
        return f[name][...]


def check_incomplete(spec: str) -> None:
    """A journal to resume from; the output, where it was created, is marked incomplete and
    refuses to be read as an input."""
    assert io.read_journal(spec) is not None
    if os.path.exists(spec.split(":/")[0]):
        with pytest.raises(IncompleteOutputError, match="resume"):
            io.open_input(spec, name="C")


def check_one_line(rc: int, err: str, *words) -> None:
    assert rc == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bigmm: error: Expected"), err
    for word in words:
        assert word in lines[0], err


# ----- a disk that fills up -------------------------------------------------------------------

def full_at_creation(mp):
    mp.setattr(os, "posix_fallocate", fail_after(os.posix_fallocate, 0))


def full_after_partial_reservation(mp):
    """posix_fallocate takes some blocks, then fails (as on ext4): they must be given back."""
    real = os.posix_fallocate

    def partial(fd, offset, length):
        real(fd, offset, max(1, length // 2))
        if length > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    mp.setattr(os, "posix_fallocate", partial)


def full_at_sync(mp):
    """Mapped tiles: msync of the written pages fails after the first commit (writeback
    ENOSPC; commits run beside the writes, so a run of 9 tiles commits at least twice)."""
    mp.setattr(direct, "MODE", "mapped")
    mp.setattr(executor.tuning, "COMMIT_INTERVAL", 0)  # commit as often as it can
    mp.setattr(mapped.FileMap, "sync", fail_after(mapped.FileMap.sync, 1))


def full_at_pwrite(mp):
    """No posix_fallocate here (tiles written with pwritev): a write fails after 40 rows."""
    mp.setattr(os, "posix_fallocate", fail_after(os.posix_fallocate, 0, errno.EOPNOTSUPP))
    mp.setattr(os, "pwritev", fail_after(os.pwritev, 40))


def direct_tiles(mp):
    """Tiles written with O_DIRECT: C chunked by the 44 x 37 tiles (13 KiB each), every run
    with a whole page written direct (through the bounce buffer: NumPy's tile buffers are not
    page-aligned)."""
    mp.setattr(filesink, "MIN_CHUNK_BYTES", 0)
    mp.setattr(direct, "MODE", "direct")
    mp.setattr(direct, "DIRECT_MIN", 0)


def full_at_direct(mp):
    """The third O_DIRECT write of a tile's run fails (a disk that fills up)."""
    direct_tiles(mp)
    mp.setattr(direct, "_write_direct", fail_after(direct._write_direct, 2))


def full_at_fdatasync(mp):
    """Direct tiles: the fdatasync before the second commit's journal line fails."""
    direct_tiles(mp)
    mp.setattr(executor.tuning, "COMMIT_INTERVAL", 0)  # commit every tile
    mp.setattr(direct, "_fdatasync", fail_after(direct._fdatasync, 1))


def full_at_journal(mp):
    """The journal's second line is cut short by a full disk, the next write fails (commits
    run beside the writes and take what was written meanwhile: a run of 9 tiles journals at
    least twice). Only the journal's writes count."""
    mp.setattr(executor.tuning, "COMMIT_INTERVAL", 0)  # commit as often as it can
    real = os.pwrite
    state = {"calls": 0}

    def pwrite(fd, data, offset):
        if not os.readlink(f"/proc/self/fd/{fd}").endswith(journal.SUFFIX):
            return real(fd, data, offset)
        state["calls"] += 1
        if state["calls"] == 2:
            return real(fd, data[:len(data) // 2], offset)
        if state["calls"] > 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data, offset)

    mp.setattr(journal.os, "pwrite", pwrite)


def full_at_redo_log(mp, after: int):
    """The redo logs of changes to the output file (see bigmm.io.h5atomic) cannot be written
    after the first ``after`` of them: the file stays as it was."""
    real, logs = os.write, {"begun": 0}

    def write(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(h5atomic.REDO_SUFFIX + ".tmp"):
            logs["begun"] += os.lseek(fd, 0, os.SEEK_CUR) == 0  # a log's first write
            if logs["begun"] > after:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    mp.setattr(h5atomic.os, "write", write)


def full_at_creation_log(mp):
    """The redo log creating C cannot be written."""
    full_at_redo_log(mp, 0)


def full_at_finish(mp):
    """Every tile durable and journaled; the redo log of the end (record, completion mark)
    cannot be written."""
    full_at_redo_log(mp, 1)


# case, injection, words the message must hold
DISK_FULL = [
    ("creation", full_at_creation, ["c.h5", "bytes", "free", "Nothing was computed"]),
    ("creation-partial", full_after_partial_reservation, ["c.h5", "bytes", "free"]),
    ("msync", full_at_sync, ["c.h5", "disk full", "resume"]),
    ("pwritev", full_at_pwrite, ["c.h5", "rows", "columns", "disk full", "resume"]),
    ("journal", full_at_journal, ["c.h5", "disk full", "resume"]),
    ("direct", full_at_direct, ["c.h5", "rows", "columns", "disk full", "resume"]),
    ("fdatasync", full_at_fdatasync, ["c.h5", "disk full", "resume"]),
    ("creation-log", full_at_creation_log, ["c.h5", "disk full", "Nothing was computed"]),
    ("finish", full_at_finish, ["c.h5", "disk full", "resume"]),
]
#: The cases that need O_DIRECT where the test's files lie.
DIRECT = {"direct", "fdatasync"}


def skip_without_direct(case: str, folder) -> None:
    if case in DIRECT and not direct.supports_direct(str(folder)):
        pytest.skip("no O_DIRECT on this file system")


@pytest.mark.parametrize("case, inject, words", DISK_FULL, ids=[c[0] for c in DISK_FULL])
def test_disk_full_is_one_error_and_resumes(tmp_path, job, monkeypatch, case, inject, words):
    a, b, ref = job
    skip_without_direct(case, tmp_path)
    out = f"{tmp_path / 'c.h5'}:/C"
    with monkeypatch.context() as mp:
        inject(mp)
        with pytest.raises(DiskFullError) as err:
            bigmm.matmul(a, b, out=out, **RUN)
    for word in words:
        assert word in str(err.value), err.value
    check_incomplete(out)
    if case == "creation-partial":  # the blocks the failed reservation took were given back
        assert os.stat(tmp_path / "c.h5").st_blocks * 512 < M * N * 8 // 4
    if case == "journal":  # no torn line left behind
        text = open(journal.journal_path(io.parse_spec(out))).read()
        assert text.endswith("\n") and all(line.startswith("{") for line in text.splitlines())
    with pytest.raises(OutputExistsError, match="resume"):
        bigmm.matmul(a, b, out=out, **RUN)
    bigmm.matmul(a, b, out=out, resume=True, **RUN)
    assert read(out).tobytes() == ref.tobytes()
    assert io.read_journal(out) is None


@pytest.mark.parametrize("case, inject, words", DISK_FULL, ids=[c[0] for c in DISK_FULL])
def test_disk_full_through_the_cli(tmp_path, job, monkeypatch, capsys, case, inject, words):
    a, b, ref = job
    skip_without_direct(case, tmp_path)
    out = f"{tmp_path / 'c.h5'}:/C"
    argv = ["multiply", a, b, "-o", out, "--memory", BUDGET, "--backend", "numpy", "--quiet"]
    with monkeypatch.context() as mp:
        inject(mp)
        rc = main(argv)
    check_one_line(rc, capsys.readouterr().err, *words)
    check_incomplete(out)
    assert main(argv + ["--resume"]) == 0, capsys.readouterr().err
    assert read(out).tobytes() == ref.tobytes()


@pytest.mark.parametrize("fstype", ["tmpfs", "ext4"])
def test_disk_full_on_a_small_file_system(tmp_path, job, fstype):
    """A real full disk: the output's file system is smaller than C. Needs root to mount."""
    a, b, ref = job
    try:
        with small_filesystem(tmp_path / "small", 1 << 20, fstype) as mnt:
            out = f"{mnt}/c.h5:/C"
            shape = (2000, 2000)  # C of 30 MiB on a 1 MiB file system
            big = str(tmp_path / "big.h5")
            with h5py.File(big, "w") as f:
                f.create_dataset("A", shape=(shape[0], 1), dtype="f8", fillvalue=1.0)
                f.create_dataset("B", shape=(1, shape[1]), dtype="f8", fillvalue=2.0)
            free = os.statvfs(mnt).f_bavail
            with pytest.raises(DiskFullError) as err:
                bigmm.matmul(f"{big}:/A", f"{big}:/B", out=out, **RUN)
            assert f"{shape[0] * shape[1] * 8} bytes" in str(err.value) and mnt in str(err.value)
            assert os.statvfs(mnt).f_bavail >= free - 16  # nothing kept of a failed reservation
            check_incomplete(out)
    except Unavailable as exc:
        pytest.skip(str(exc))


SCRIPT = """
set -u
mount -t tmpfs -o size=64k tmpfs "$MNT"
"$PY" -m bigmm multiply "$A" "$B" -o "$MNT/c.h5:/C" --memory {budget} --backend numpy --quiet
echo "rc=$?"
mount -o remount,size=16m "$MNT"  # space freed
"$PY" -m bigmm multiply "$A" "$B" -o "$MNT/c.h5:/C" --memory {budget} --backend numpy \\
    --quiet --resume || exit 3
cp "$MNT/c.h5" "$OUT/c.h5"
""".format(budget=BUDGET)


def test_disk_full_on_a_tmpfs_through_the_cli_then_resume(tmp_path, job):
    """In a private mount namespace (root or a user namespace): C (112 KiB) on a 64 KiB tmpfs,
    then the tmpfs grows and --resume finishes it."""
    a, b, ref = job
    prefix = mount_prefix()
    if prefix is None:
        pytest.skip("no mount namespace with tmpfs here")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = dict(os.environ, MNT=str(mnt), PY=sys.executable, A=a, B=b, OUT=str(tmp_path),
               PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(os.path.dirname(
                   bigmm.__file__)), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([*prefix, "sh", "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rc=2" in done.stdout, done.stdout
    check_one_line(2, done.stderr, "c.h5", "free")
    assert read(f"{tmp_path / 'c.h5'}:/C").tobytes() == ref.tobytes()


# ----- read errors on an input ----------------------------------------------------------------
# Each injection starts after the input is opened: three reads succeed, then every one fails.

def eio_mapped(mp):
    """Copies out of the input's memory map fail (a bad sector under the mapping)."""
    real = mapped.FileMap.array
    count = {"n": 0}

    def array(self, offset, shape, dtype):
        if not self.writable:
            count["n"] += 1
            if count["n"] > 3:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(self, offset, shape, dtype)

    mp.setattr(mapped.FileMap, "array", array)


def eio_preadv(mp):
    """libc preadv fails."""
    mp.setattr(rawio, "preadv_iov", fail_after(rawio.preadv_iov, 3, errno.EIO))


def eio_os_preadv(mp):
    """os.preadv (used where libc is not reachable) fails."""
    mp.setattr(rawio, "NATIVE", False)
    mp.setattr(os, "preadv", fail_after(os.preadv, 3, errno.EIO))


def eio_deflate(mp):
    """Raw reads of compressed chunks (into their decode buffers) fail."""
    mp.setattr(os, "preadv", fail_after(os.preadv, 3, errno.EIO))


def eio_h5py(mp):
    """h5py's read_direct (the fallback for plugin filters) fails."""
    mp.setattr(h5py.Dataset, "read_direct", fail_after(h5py.Dataset.read_direct, 3, errno.EIO))


# case, A's storage, memory map, injection, the layout its reads take
READ_FAULTS = [
    ("mmap", {}, True, eio_mapped, "contiguous"),
    ("preadv", {"chunks": (40, 30)}, False, eio_preadv, "chunked"),
    ("os-preadv", {}, False, eio_os_preadv, "contiguous"),
    ("deflate", {"chunks": (40, 30), "compression": "gzip"}, True, eio_deflate, "deflate"),
    ("zstd", {"chunks": (40, 30), **hdf5plugin.Zstd()}, True, eio_deflate, "zstd"),
    ("h5py", {"chunks": (40, 30), **hdf5plugin.LZ4()}, True, eio_h5py, "h5py"),
]


@pytest.mark.parametrize("split", [
    False,  # each panel read by one reader (the source may split it between its own threads)
    True,   # panels split between the readers, each piece read on its reader thread alone
])
@pytest.mark.parametrize("case, storage, use_mmap, inject, layout", READ_FAULTS,
                         ids=[c[0] for c in READ_FAULTS])
def test_read_error_names_file_and_region_and_resumes(tmp_path, job, monkeypatch, case,
                                                      storage, use_mmap, inject, layout, split):
    _, b, _ = job
    alone = []
    if split:
        monkeypatch.setattr(tuning, "PIECE_BYTES", 1024)
        real_alone = loads.on_caller_thread
        monkeypatch.setattr(loads, "on_caller_thread",
                            lambda: alone.append(1) or real_alone())
    path = str(tmp_path / "fa.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("A", data=random_matrix((M, K), np.float64, seed=1), **storage)
    a = f"{path}:/A"
    before = sha256(path)
    out = f"{tmp_path / 'c.h5'}:/C"
    src = io.open_input(a, name="A", use_mmap=use_mmap)
    assert src.layout == layout and src.mapped == (use_mmap and layout in ("contiguous",
                                                                           "chunked"))
    real = api.execute

    def execute(*args, **kwargs):  # the disk goes bad once the run has begun
        inject(mp)
        return real(*args, **kwargs)

    with monkeypatch.context() as mp:
        mp.setattr(api, "execute", execute)
        with pytest.raises(ReadError) as err:
            bigmm.matmul(src, b, out=out, **RUN)  # closes src
    assert bool(alone) == split  # the pieces that failed were read alone where split
    msg = str(err.value)
    assert msg.startswith("Expected to read rows") and "columns" in msg, msg
    assert (f"{path}:/A" in msg or b in msg) and "Input/output error" in msg, msg
    assert sha256(path) == before
    check_incomplete(out)
    bigmm.matmul(a, b, out=out, resume=True, **RUN)
    ref = f"{tmp_path / 'ref2.h5'}:/C"
    bigmm.matmul(a, b, out=ref, **RUN)
    assert read(out).tobytes() == read(ref).tobytes()


def test_read_error_before_the_run_creates_nothing(tmp_path, job, monkeypatch):
    # the disk is bad from the start: the inputs' fingerprints fail to read, nothing is made
    a, b, _ = job
    out = f"{tmp_path / 'c.h5'}:/C"
    src = io.open_input(a, name="A", use_mmap=False)
    with monkeypatch.context() as mp:
        mp.setattr(os, "preadv", fail_after(os.preadv, 0, errno.EIO))
        with pytest.raises(ReadError, match="Input/output error"):
            bigmm.matmul(src, b, out=out, **RUN)
    assert sorted(os.listdir(tmp_path)) == ["a.h5", "b.h5", "ref.h5"]


def test_read_error_through_the_cli(tmp_path, job, monkeypatch, capsys):
    a, b, ref = job
    out = f"{tmp_path / 'c.h5'}:/C"
    argv = ["multiply", a, b, "-o", out, "--memory", BUDGET, "--backend", "numpy", "--quiet"]
    real = api.execute

    def execute(*args, **kwargs):  # the disk goes bad once the run has begun
        eio_mapped(monkeypatch)
        return real(*args, **kwargs)

    with monkeypatch.context() as mp:
        mp.setattr(api, "execute", execute)
        rc = main(argv)
    err = capsys.readouterr().err
    check_one_line(rc, err, "rows", "columns", "Input/output error")
    assert a in err or b in err, err  # names the file and the dataset
    assert main(argv + ["--resume"]) == 0, capsys.readouterr().err
    assert read(out).tobytes() == ref.tobytes()
