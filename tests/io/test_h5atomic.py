"""Changes to an HDF5 file's structure, all or nothing: the overlay against a real file, commits,
a real kill between a commit and its writes, damaged logs, HDF5's lock."""

import os
import signal
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from bigmm.errors import ResumeError
from bigmm.io import h5atomic
from bigmm.io.h5atomic import H5Atomic, recover, redo_path

# one operation on a file: ("write", offset, bytes), ("truncate", size), ("read", offset, size)
OPS = st.lists(st.one_of(
    st.tuples(st.just("write"), st.integers(0, 6000), st.binary(min_size=1, max_size=700)),
    st.tuples(st.just("truncate"), st.integers(0, 6000)),
    st.tuples(st.just("read"), st.integers(0, 7000), st.integers(1, 900))), max_size=40)


@settings(max_examples=150, deadline=None)
@given(initial=st.binary(max_size=5000), ops=OPS)
def test_overlay_reads_as_the_file_would_and_its_log_makes_the_file(tmp_path_factory, initial,
                                                                   ops):
    folder = tmp_path_factory.mktemp("overlay")
    over, plain = folder / "over", folder / "plain"
    over.write_bytes(initial)
    plain.write_bytes(initial)
    fd = os.open(over, os.O_RDWR)
    try:
        overlay = h5atomic._Overlay(fd)
        with open(plain, "r+b") as ref:
            for op in ops:
                if op[0] == "write":
                    overlay.seek(op[1]), ref.seek(op[1])
                    overlay.write(op[2]), ref.write(op[2])
                elif op[0] == "truncate":
                    overlay.truncate(op[1]), ref.truncate(op[1])
                else:
                    buf = bytearray(op[2])
                    overlay.seek(op[1]), ref.seek(op[1])
                    overlay.readinto(buf)
                    got = ref.read(op[2])
                    assert bytes(buf) == got + bytes(op[2] - len(got))  # zeros past the end
                assert overlay.seek(0, os.SEEK_END) == ref.seek(0, os.SEEK_END)
        assert over.read_bytes() == initial  # nothing reached the file yet
        h5atomic._apply(fd, h5atomic._parse(overlay.log(str(over)), str(over)))
    finally:
        os.close(fd)
    assert over.read_bytes() == plain.read_bytes()


def _with_dataset(path):
    """A file with one dataset, and the journal that owns changes to it."""
    with h5py.File(path, "w") as f:
        f["A"] = np.arange(12.0).reshape(3, 4)
        f["A"].attrs["note"] = "kept"
    owner = str(path) + ".journal"
    open(owner, "w").close()
    return owner


def test_changes_reach_the_file_when_the_block_ends(tmp_path):
    path = tmp_path / "f.h5"
    owner = _with_dataset(path)
    with H5Atomic(str(path), owner) as f:
        del f["A"]
        f["B"] = np.ones((5, 7), np.float32)
        f["B"].attrs["bigmm_complete"] = True
    with h5py.File(path, "r") as f:
        assert sorted(f) == ["B"]
        np.testing.assert_array_equal(f["B"][...], np.ones((5, 7), np.float32))
        assert bool(f["B"].attrs["bigmm_complete"])
    assert not os.path.exists(redo_path(str(path)))


@pytest.mark.parametrize("existing", [False, True])  # a new path; an empty file left by a kill
def test_a_missing_or_empty_file_is_created(tmp_path, existing):
    path = tmp_path / "new.h5"
    if existing:
        path.write_bytes(b"")
    owner = tmp_path / "journal"
    owner.write_text("")
    with H5Atomic(str(path), str(owner)) as f:
        f["C"] = np.arange(6)
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["C"][...], np.arange(6))


def test_an_exception_in_the_block_leaves_the_file_as_it_was(tmp_path):
    path = tmp_path / "f.h5"
    owner = _with_dataset(path)
    before = path.read_bytes()
    with pytest.raises(RuntimeError, match="midway"):
        with H5Atomic(str(path), owner) as f:
            del f["A"]
            f["B"] = np.zeros(3)
            raise RuntimeError("midway")
    assert path.read_bytes() == before
    assert not os.path.exists(redo_path(str(path)))


def test_a_new_file_is_not_left_behind_by_a_change_that_failed(tmp_path):
    path = tmp_path / "new.h5"
    owner = tmp_path / "journal"
    owner.write_text("")
    with pytest.raises(RuntimeError, match="midway"):
        with H5Atomic(str(path), str(owner)) as f:
            f["C"] = np.zeros(3)
            raise RuntimeError("midway")
    assert not path.exists()
    assert not os.path.exists(redo_path(str(path)))


#: A process that commits a change to argv[1] and is killed before any of it reaches the file.
KILLED_AFTER_COMMIT = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from bigmm.io import h5atomic

    recover = h5atomic._recover_locked
    def killed(fd, path):
        if os.path.exists(h5atomic.redo_path(path)):
            os.kill(os.getpid(), signal.SIGKILL)
        return recover(fd, path)
    h5atomic._recover_locked = killed
    with h5atomic.H5Atomic(sys.argv[1], sys.argv[2]) as f:
        del f["A"]
        f["B"] = np.arange(100.0)
""")


def test_a_change_committed_before_a_kill_is_finished_by_recover(tmp_path):
    path = tmp_path / "f.h5"
    owner = _with_dataset(path)
    before = path.read_bytes()
    proc = subprocess.run([sys.executable, "-c", KILLED_AFTER_COMMIT, str(path), owner])
    assert proc.returncode == -signal.SIGKILL
    assert path.read_bytes() == before  # committed, not written: the file as it was
    assert os.path.exists(redo_path(str(path)))
    recover(str(path))
    assert not os.path.exists(redo_path(str(path)))
    with h5py.File(path, "r") as f:
        assert sorted(f) == ["B"]
        np.testing.assert_array_equal(f["B"][...], np.arange(100.0))
    recover(str(path))  # nothing left to do


#: The same, killed while the committed change is copied into the file (cut at its first
#: write): HDF5 cannot open the file until the log is applied again.
KILLED_WHILE_APPLIED = KILLED_AFTER_COMMIT.replace("""    recover = h5atomic._recover_locked
    def killed(fd, path):
        if os.path.exists(h5atomic.redo_path(path)):
            os.kill(os.getpid(), signal.SIGKILL)
        return recover(fd, path)
    h5atomic._recover_locked = killed""", """    def killed(fd, log):
        os.ftruncate(fd, log.low)
        os.fsync(fd)
        os.kill(os.getpid(), signal.SIGKILL)
    h5atomic._apply = killed""")


@pytest.mark.parametrize("script", [KILLED_AFTER_COMMIT,  # before the file was written
                                    KILLED_WHILE_APPLIED])  # while it was
def test_reading_the_file_finishes_a_committed_change_first(tmp_path, script):
    # an output written into the inputs' own file, killed as its change reached the file:
    # opening an input there applies the log first, so the inputs stay readable
    from bigmm.io import open_input

    path = tmp_path / "f.h5"
    owner = _with_dataset(path)
    script = script.replace("np.arange(100.0)", "np.arange(100.0).reshape(10, 10)")
    proc = subprocess.run([sys.executable, "-c", script, str(path), owner])
    assert proc.returncode == -signal.SIGKILL and os.path.exists(redo_path(str(path)))
    got = np.empty((10, 10))
    with open_input(f"{path}:/B", name="B") as src:
        src.read(0, 10, 0, 10, got)
    assert not os.path.exists(redo_path(str(path)))
    np.testing.assert_array_equal(got, np.arange(100.0).reshape(10, 10))


def test_a_log_never_committed_is_dropped(tmp_path):
    path = tmp_path / "f.h5"
    owner = _with_dataset(path)
    before = path.read_bytes()
    partial = redo_path(str(path)) + ".tmp"
    with open(partial, "wb") as f:
        f.write(b"bigmm redo 1\n" + b"\x01" * 40)  # killed while writing it
    recover(str(path))
    assert path.read_bytes() == before
    assert not os.path.exists(partial)


def test_a_damaged_log_is_refused_and_the_file_left_alone(tmp_path):
    path = tmp_path / "f.h5"
    owner = _with_dataset(path)
    before = path.read_bytes()
    fd = os.open(path, os.O_RDWR)
    try:
        overlay = h5atomic._Overlay(fd)
        overlay.write(b"changed")
        log = bytearray(overlay.log(owner))
    finally:
        os.close(fd)
    log[len(log) // 2] ^= 0xFF
    with open(redo_path(str(path)), "wb") as f:
        f.write(bytes(log))
    with pytest.raises(ResumeError, match="Expected a whole redo log") as err:
        recover(str(path))
    assert "damaged" in str(err.value)
    assert path.read_bytes() == before


def test_the_file_is_locked_as_hdf5_locks_it(tmp_path):
    path = tmp_path / "f.h5"
    owner = _with_dataset(path)
    with h5py.File(path, "r"):  # an HDF5 reader holds the file
        with pytest.raises(BlockingIOError):
            H5Atomic(str(path), owner)
    with H5Atomic(str(path), owner) as f:
        with pytest.raises(OSError):  # and HDF5 waits for the change to end
            h5py.File(path, "r")
        f.attrs["x"] = 1
    with h5py.File(path, "r") as f:
        assert f.attrs["x"] == 1


@pytest.mark.parametrize("why", [
    "owner-removed",  # the run given up (its journal removed)
    "file-replaced",  # another file at the path
    "file-removed",   # no file at the path: none is made
])
def test_a_stale_log_is_dropped_unapplied(tmp_path, why):
    path = tmp_path / "f.h5"
    owner = _with_dataset(path)
    proc = subprocess.run([sys.executable, "-c", KILLED_AFTER_COMMIT, str(path), owner])
    assert proc.returncode == -signal.SIGKILL and os.path.exists(redo_path(str(path)))
    if why == "owner-removed":
        os.unlink(owner)
    elif why == "file-replaced":
        os.rename(path, tmp_path / "old.h5")
        _with_dataset(path)
    else:
        os.unlink(path)
    before = path.read_bytes() if path.exists() else None
    recover(str(path))
    assert (path.read_bytes() if path.exists() else None) == before
    assert not os.path.exists(redo_path(str(path)))


def test_open_here_finds_this_process_s_hdf5_handles_by_file(tmp_path):
    path = tmp_path / "f.h5"
    _with_dataset(path)
    other = tmp_path / "other.h5"
    _with_dataset(other)
    os.link(path, tmp_path / "alias.h5")
    assert not h5atomic.open_here(str(path))
    with h5py.File(tmp_path / "alias.h5", "r"):  # the same file under another name
        assert h5atomic.open_here(str(path))
        assert not h5atomic.open_here(str(other))
    assert not h5atomic.open_here(str(path))
    assert not h5atomic.open_here(str(tmp_path / "missing.h5"))


def test_a_pending_log_under_a_file_open_here_is_one_clear_error(tmp_path, monkeypatch):
    from bigmm import io
    from bigmm.errors import OutputNotWritable

    path = tmp_path / "f.h5"
    owner = _with_dataset(path)
    with monkeypatch.context() as mp:  # committed, then killed before it reached the file
        mp.setattr(h5atomic, "_recover_locked", lambda fd, p: None)
        with H5Atomic(str(path), owner) as f:
            f["B"] = np.arange(4.0)
    assert os.path.exists(redo_path(str(path)))
    with h5py.File(path, "r") as f:  # the user's handle: the log cannot be applied under it
        with pytest.raises(OutputNotWritable, match="close it and run again"):
            io.open_output(f"{path}:/C", shape=(3, 4), dtype=np.float64, inputs={},
                           job={"plan": {}, "alpha": 1.0, "beta": 0.0})
        assert sorted(f) == ["A"]
    recover(str(path))
    with h5py.File(path, "r") as f:
        assert sorted(f) == ["A", "B"]
