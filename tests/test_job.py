"""A run never reports success with a wrong C, and loses nothing the user owns.

Real files, real links and maps, real processes killed with SIGKILL: a resumed run refuses
inputs (or old C) that changed; an output that is an input by any route is refused; one writer
per output; outputs passed as objects say truthfully whether they can be resumed; ``--resume``
is idempotent (a retry loop under a scheduler that kills jobs ends with the right C).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import h5py
import numpy as np
import pytest

import bigmm
from bigmm import errors
from bigmm.io import lock, open_input, read_journal
from bigmm.io.spec import parse_spec
from bigmm.testing import random_matrix, relative_error, sha256, tolerance

M, K, N = 130, 120, 110  # multiples of nothing
BUDGET = "60000"          # 9 tiles of 44 x 37, 5 K panels each
ALPHA, BETA = 1.5, -0.5

#: ``python -m bigmm ARGS`` with two hooks: SIGKILL itself once this run has journaled KILL_AT
#: tiles (0: never), and sleep PAUSE seconds after each tile write (to overlap two runs).
CLI = textwrap.dedent("""
    import os, signal, sys, time
    import bigmm.executor.tuning as tuning
    from bigmm.cli import main
    from bigmm.io import filesink, journal

    tuning.COMMIT_INTERVAL = 0  # one journal record per tile
    kill_at, pause = int(sys.argv[1]), float(sys.argv[2])
    append, seen = journal.Journal.append, [0]
    def counted(self, record):
        append(self, record)
        if "tiles" in record:  # one record may hold several tiles on a loaded machine
            seen[0] += len(record["tiles"])
            if kill_at and seen[0] >= kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
    journal.Journal.append = counted
    write = filesink.FileSink.write
    def slow(self, *args):
        write(self, *args)
        time.sleep(pause)
    if pause:
        filesink.FileSink.write = slow
    sys.exit(main(sys.argv[3:]))
""")


def cli(*argv, kill_at=0, pause=0.0, cwd=None, wait=True):
    cmd = [sys.executable, "-c", CLI, str(kill_at), str(pause), *map(str, argv)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=cwd, env=env)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def h5(path, name, data, **kw):
    with h5py.File(path, "a") as f:
        if name in f:
            del f[name]
        f.create_dataset(name, data=data, **kw)
    return f"{path}:/{name}"


def read(spec):
    s = parse_spec(spec)
    with h5py.File(s.path, "r") as f:
        return f[s.dataset][...]


@pytest.fixture
def job(tmp_path):
    """A, B (and old C) in files; the multiply arguments; the uninterrupted product's file."""
    a = h5(tmp_path / "a.h5", "A", random_matrix((M, K), np.float64, seed=1))
    b = h5(tmp_path / "b.h5", "B", random_matrix((K, N), np.float64, seed=2), chunks=(30, 50))
    return a, b


def killed(a, b, c, *extra, kill_at=2):
    """A run of a, b -> c killed with SIGKILL after ``kill_at`` journal records."""
    rc, _, err = cli("multiply", a, b, "-o", c, "--memory", BUDGET, "--backend", "numpy",
                     *extra, kill_at=kill_at)
    assert rc == -signal.SIGKILL, err
    assert read_journal(c) is not None
    return c


def one_line(rc, err, *words):
    assert rc == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bigmm: error: Expected"), err
    for w in words:
        assert w in lines[0], err


# ----- 1. a resume refuses inputs that changed --------------------------------------------------

def regenerate(path):
    h5(path, "A", random_matrix((M, K), np.float64, seed=99))


def edit_in_place(path):
    with h5py.File(path, "r+") as f:
        f["A"][57, 13] += 1.0


def replace_file(path):
    tmp = str(path) + ".new"
    h5(tmp, "A", random_matrix((M, K), np.float64, seed=98))
    os.replace(tmp, path)


# how A changes between the kill and the resume, and a word the refusal names
CHANGES = [
    (regenerate, "contents"),         # regenerated with another seed (same shape)
    (edit_in_place, "modified"),      # one element edited with h5py
    (replace_file, "another file"),   # a new file moved over the old one
]


@pytest.mark.parametrize("change, word", CHANGES, ids=["regenerated", "edited", "replaced"])
def test_resume_refuses_a_changed_input(tmp_path, job, change, word):
    a, b = job
    c = killed(a, b, f"{tmp_path / 'c.h5'}:/C")
    change(tmp_path / "a.h5")
    rc, out, err = cli("multiply", a, b, "-o", c, "--memory", BUDGET, "--backend", "numpy",
                       "--resume")
    one_line(rc, err, "Expected A", word, "resume", "--overwrite")
    assert read_journal(c) is not None  # still resumable once A is restored
    with pytest.raises(errors.IncompleteOutputError):
        open_input(c)
    rc, _, err = cli("multiply", a, b, "-o", c, "--memory", BUDGET, "--backend", "numpy",
                     "--overwrite")
    assert rc == 0, err
    assert relative_error(read(c), read(a) @ read(b)) < tolerance(np.float64, K)


def test_resume_refuses_an_input_edited_with_its_time_put_back(tmp_path, job):
    # 960 KB: the fingerprint samples A (a few rows), the element is in none of them
    a = h5(tmp_path / "big.h5", "A", random_matrix((400, K), np.float64, seed=1))
    c = killed(a, job[1], f"{tmp_path / 'c.h5'}:/C")
    st = os.stat(tmp_path / "big.h5")
    with h5py.File(tmp_path / "big.h5", "r+") as f:
        f["A"][5, 33] += 1.0
    os.utime(tmp_path / "big.h5", ns=(st.st_atime_ns, st.st_mtime_ns))
    rc, _, err = cli("multiply", a, job[1], "-o", c, "--memory", BUDGET, "--backend", "numpy",
                     "--resume")
    one_line(rc, err, "Expected A", "changed at", "modification time kept")


@pytest.mark.parametrize("finished", [False, True])  # killed part way; run to the end
def test_resume_names_inputs_given_swapped(tmp_path, finished):
    a = h5(tmp_path / "a.h5", "A", random_matrix((K, K), np.float64, seed=1))
    b = h5(tmp_path / "b.h5", "B", random_matrix((K, K), np.float64, seed=2))
    c = f"{tmp_path / 'c.h5'}:/C"
    if finished:
        rc, _, err = cli("multiply", a, b, "-o", c, "--memory", BUDGET, "--backend", "numpy")
        assert rc == 0, err
    else:
        killed(a, b, c)
    rc, _, err = cli("multiply", b, a, "-o", c, "--memory", BUDGET, "--backend", "numpy",
                     "--resume")
    one_line(rc, err, "Expected", "swapped", "overwrite")


def test_resume_refuses_an_edited_old_c(tmp_path, job):
    a, b = job
    c = h5(tmp_path / "c.h5", "C", random_matrix((M, N), np.float64, seed=3))
    killed(a, b, c, "--alpha", ALPHA, "--beta", BETA)
    with h5py.File(tmp_path / "c.h5", "r+") as f:
        f["C"][:, 0] += 1.0  # every row of old C: in the samples
    rc, _, err = cli("multiply", a, b, "-o", c, "--memory", BUDGET, "--backend", "numpy",
                     "--alpha", ALPHA, "--beta", BETA, "--resume")
    one_line(rc, err, "Expected old C", "contents")


def test_resume_from_another_directory_and_through_a_symlink(tmp_path, job):
    a, b = job
    ref = f"{tmp_path / 'ref.h5'}:/C"
    assert cli("multiply", a, b, "-o", ref, "--memory", BUDGET, "--backend", "numpy")[0] == 0
    c = killed(a, b, f"{tmp_path / 'c.h5'}:/C")
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "a.h5", tmp_path / "elsewhere" / "link-a.h5")
    # relative paths from another working directory, A through a symlink, C by another name
    rc, _, err = cli("multiply", "link-a.h5:/A", "../b.h5:/B", "-o", "../c.h5:/C", "--memory",
                     BUDGET, "--backend", "numpy", "--resume", kill_at=1,
                     cwd=tmp_path / "elsewhere")
    # killed again, later (at its first record: on a loaded machine the first run's records
    # may hold several tiles, leaving fewer to resume)
    assert rc == -signal.SIGKILL, err
    rc, out, err = cli("multiply", "link-a.h5:/A", "../b.h5:/B", "-o", "../c.h5:/C",
                       "--memory", BUDGET, "--backend", "numpy", "--resume", "--json",
                       cwd=tmp_path / "elsewhere")
    assert rc == 0, err
    assert json.loads(out)["tiles_skipped"] > 0
    assert read(c).tobytes() == read(ref).tobytes()


# ----- 1b. a resume trusts only the tiles the output still holds as written ------------------

def _journaled(c):
    from bigmm.io.journal import journal_path, parse_journal
    return parse_journal(journal_path(parse_spec(c)))


def _overwrite(c, value):
    """Every element of C's dataset set to ``value`` (an older copy of the file restored, or
    another program writing into it)."""
    s = parse_spec(c)
    with h5py.File(s.path, "r+") as f:
        f[s.dataset][...] = value


def test_resume_computes_again_the_tiles_the_output_lost(tmp_path, job):
    a, b = job
    c = killed(a, b, f"{tmp_path / 'c.h5'}:/C", kill_at=2)
    samples = _journaled(c)[4]
    assert len(samples) >= 2  # each journaled tile has its sample
    _overwrite(c, 7.0)
    rc, out, err = cli("multiply", a, b, "-o", c, "--memory", BUDGET, "--backend", "numpy",
                       "--resume", "--json")
    assert rc == 0, err
    summary = json.loads(out)
    assert summary["tiles_redone"] == len(samples)
    assert summary["tiles_skipped"] == 0 and summary["tiles_done"] == summary["tiles_total"]
    assert "computed again" in err and "bigmm: note:" in err
    assert relative_error(read(c), read(a) @ read(b)) < tolerance(np.float64, K)


def test_an_untouched_resume_redoes_nothing_and_ends_bit_identical(tmp_path, job):
    a, b = job
    whole = f"{tmp_path / 'whole.h5'}:/C"
    rc, _, err = cli("multiply", a, b, "-o", whole, "--memory", BUDGET, "--backend", "numpy")
    assert rc == 0, err
    c = killed(a, b, f"{tmp_path / 'c.h5'}:/C", kill_at=3)
    rc, out, err = cli("multiply", a, b, "-o", c, "--memory", BUDGET, "--backend", "numpy",
                       "--resume", "--json")
    summary = json.loads(out)
    assert rc == 0 and summary["tiles_redone"] == 0 and summary["tiles_skipped"] >= 3, err
    assert "bigmm: note:" not in err
    assert read(c).tobytes() == read(whole).tobytes()


def test_a_journal_without_samples_still_resumes(tmp_path, job):
    a, b = job
    c = killed(a, b, f"{tmp_path / 'c.h5'}:/C", kill_at=2)
    from bigmm.io.journal import journal_path
    path = journal_path(parse_spec(c))
    with open(path) as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    assert any("samples" in r for r in records)
    with open(path, "w") as fh:  # as an earlier bigmm wrote it: tiles alone
        fh.writelines(json.dumps({k: v for k, v in r.items() if k != "samples"}) + "\n"
                      for r in records)
    assert not _journaled(c)[4]
    rc, out, err = cli("multiply", a, b, "-o", c, "--memory", BUDGET, "--backend", "numpy",
                       "--resume", "--json")
    summary = json.loads(out)
    assert rc == 0 and summary["tiles_redone"] == 0 and summary["tiles_skipped"] >= 2, err
    assert relative_error(read(c), read(a) @ read(b)) < tolerance(np.float64, K)


def test_a_zarr_output_that_lost_tiles_is_computed_again(tmp_path, job):
    zarr = pytest.importorskip("zarr")
    a, b = job
    c = str(tmp_path / "c.zarr")
    with pytest.raises(errors.Interrupted, match="resumable"):
        bigmm.matmul(a, b, out=c, memory=BUDGET, backend="numpy", progress=stop_after(3))
    arr = zarr.open_array(c, mode="r+")
    arr[...] = np.float64(-3.0)
    got, stats = bigmm.matmul(a, b, out=c, memory=BUDGET, backend="numpy", resume=True,
                              stats=True)
    assert stats.tiles_redone >= 3 and stats.tiles_skipped == 0
    assert any("computed again" in n for n in stats.notes)
    ref = read(a) @ read(b)
    assert relative_error(zarr.open_array(c, mode="r")[...], ref) < tolerance(np.float64, K)


def test_a_gram_output_whose_mirror_changed_is_computed_again(tmp_path):
    a = h5(tmp_path / "a.h5", "A", random_matrix((150, 70), np.float64, seed=4))
    c = f"{tmp_path / 'c.h5'}:/C"
    with pytest.raises(errors.Interrupted):
        bigmm.gram(a, c, memory="40000", backend="numpy", progress=stop_after(2))
    done = _journaled(c)[1]
    (i, j) = next(t for t in sorted(done) if t[0] != t[1])  # an off-diagonal tile
    spans = _journaled(c)[4][(i, j)][0]
    r, col, n = spans[-1]  # the last span lies in the tile's mirror, below the diagonal
    s = parse_spec(c)
    with h5py.File(s.path, "r+") as f:
        assert r > col  # below the diagonal
        f[s.dataset][r, col:col + n] += 1.0
    got, stats = bigmm.gram(a, c, memory="40000", backend="numpy", resume=True, stats=True)
    assert stats.tiles_redone == 1
    x = read(a)
    assert relative_error(read(c), x.T @ x) < tolerance(np.float64, 150)


# ----- 2. an output that is an input, by any route ----------------------------------------------

def hard_link(tmp):
    os.link(tmp / "in.h5", tmp / "alias.h5")
    return f"{tmp / 'alias.h5'}:/A"


def symlink(tmp):
    os.symlink(tmp / "in.h5", tmp / "alias.h5")
    return f"{tmp / 'alias.h5'}:/A"


def soft_link_as_output(tmp):
    with h5py.File(tmp / "in.h5", "a") as f:
        f["L"] = h5py.SoftLink("/A")
    return f"{tmp / 'in.h5'}:/L"


def external_link(tmp):
    with h5py.File(tmp / "ext.h5", "w") as f:
        f["E"] = h5py.ExternalLink(str(tmp / "in.h5"), "/A")
    return f"{tmp / 'ext.h5'}:/E"


def hdf5_hard_link(tmp):
    with h5py.File(tmp / "in.h5", "a") as f:
        f["A2"] = f["A"]
    return f"{tmp / 'in.h5'}:/A2"


# how C names A
ALIASES = [hard_link, symlink, soft_link_as_output, external_link, hdf5_hard_link]


@pytest.mark.parametrize("alias", ALIASES, ids=[f.__name__ for f in ALIASES])
def test_an_output_that_is_an_input_is_refused(tmp_path, alias):
    a = h5(tmp_path / "in.h5", "A", random_matrix((60, 60), np.float64, seed=1))
    b = h5(tmp_path / "in.h5", "B", random_matrix((60, 60), np.float64, seed=2))
    out = alias(tmp_path)
    before = sha256(tmp_path / "in.h5")
    for resume in ((), ("--resume",)):
        rc, _, err = cli("multiply", a, b, "-o", out, "--overwrite", "--backend", "numpy",
                         *resume)
        one_line(rc, err, "Expected an output other than the inputs", "A (")
    assert sha256(tmp_path / "in.h5") == before


@pytest.mark.parametrize("name", ["S", "C"], ids=["the-source", "beside-it"])
def test_an_output_in_a_virtual_inputs_source_file_is_refused(tmp_path, monkeypatch, name):
    # A is a virtual dataset over src.h5:/S; C is S itself, or another dataset of src.h5
    # (HDF5 without file locks, as on many parallel file systems, does not stop the run)
    monkeypatch.setenv("HDF5_USE_FILE_LOCKING", "FALSE")
    h5(tmp_path / "src.h5", "S", random_matrix((60, 60), np.float64, seed=1))
    b = h5(tmp_path / "b.h5", "B", random_matrix((60, 60), np.float64, seed=2))
    with h5py.File(tmp_path / "v.h5", "w") as f:
        layout = h5py.VirtualLayout(shape=(60, 60), dtype=np.float64)
        layout[:] = h5py.VirtualSource(str(tmp_path / "src.h5"), "S", shape=(60, 60))
        f.create_virtual_dataset("A", layout)
    before = sha256(tmp_path / "src.h5")
    rc, _, err = cli("multiply", f"{tmp_path / 'v.h5'}:/A", b, "-o",
                     f"{tmp_path / 'src.h5'}:/{name}", "--overwrite", "--backend", "numpy")
    one_line(rc, err, "Expected an output other than the inputs", "virtual source", "A (")
    assert sha256(tmp_path / "src.h5") == before


def test_a_soft_link_as_input_protects_its_target(tmp_path):
    a = h5(tmp_path / "in.h5", "A", random_matrix((60, 60), np.float64, seed=1))
    with h5py.File(tmp_path / "in.h5", "a") as f:
        f["L"] = h5py.SoftLink("/A")
    before = sha256(tmp_path / "in.h5")
    rc, _, err = cli("multiply", f"{tmp_path / 'in.h5'}:/L", a, "-o", a, "--overwrite",
                     "--backend", "numpy")
    one_line(rc, err, "Expected an output other than the inputs")
    assert sha256(tmp_path / "in.h5") == before


def test_memmaps_of_one_file_are_refused(tmp_path):
    path = tmp_path / "raw.bin"
    random_matrix((64, 64), np.float64, seed=1).tofile(path)
    a = np.memmap(path, np.float64, "r", shape=(64, 64))
    c = np.memmap(path, np.float64, "r+", shape=(32, 64), offset=16 * 64 * 8)
    before = sha256(path)
    with pytest.raises(errors.OutputIsInputError, match="mapping bytes of the same file"):
        bigmm.matmul(a[:32, :], a, out=c, backend="numpy")
    assert sha256(path) == before
    other = tmp_path / "other.bin"
    np.zeros((32, 64)).tofile(other)
    ok = np.memmap(other, np.float64, "r+", shape=(32, 64))
    bigmm.matmul(a[:32, :], a, out=ok, backend="numpy")  # another file: fine
    np.testing.assert_allclose(ok, np.asarray(a[:32]) @ np.asarray(a), rtol=1e-12)


def test_an_array_mapping_an_input_file_is_refused(tmp_path):
    a = h5(tmp_path / "in.h5", "A", random_matrix((64, 64), np.float64, seed=1))
    with h5py.File(tmp_path / "in.h5", "r") as f:
        offset = f["A"].id.get_offset()
    c = np.memmap(tmp_path / "in.h5", np.float64, "r+", shape=(64, 64), offset=offset)
    before = sha256(tmp_path / "in.h5")
    with pytest.raises(errors.OutputIsInputError):
        bigmm.matmul(a, a, out=c, backend="numpy")
    assert sha256(tmp_path / "in.h5") == before


def test_shared_memory_mapped_twice_is_refused():
    from multiprocessing import shared_memory

    shm = shared_memory.SharedMemory(create=True, size=40 * 40 * 8)
    again = shared_memory.SharedMemory(name=shm.name)
    try:
        a = np.ndarray((40, 40), np.float64, buffer=shm.buf)
        a[...] = random_matrix((40, 40), np.float64)
        c = np.ndarray((40, 40), np.float64, buffer=again.buf)
        with pytest.raises(errors.OutputIsInputError):
            bigmm.matmul(a, a, out=c, backend="numpy")
        with pytest.raises(errors.OutputIsInputError, match="sharing memory"):
            bigmm.matmul(a, a, out=a.T, backend="numpy")
        del a, c
    finally:
        again.close()
        shm.close()
        shm.unlink()


# ----- 3. one writer per output ------------------------------------------------------------------

def test_two_runs_on_one_output(tmp_path, job):
    a, b = job
    c = f"{tmp_path / 'c.h5'}:/C"
    common = ("--memory", BUDGET, "--backend", "numpy", "--overwrite")
    first = cli("multiply", a, b, "-o", c, "--alpha", "2", *common, pause=0.5, wait=False)
    deadline = time.monotonic() + 60
    while read_journal(c) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    rc, _, err = cli("multiply", a, b, "-o", c, "--alpha", "3", *common)
    one_line(rc, err, "no other bigmm run writing", f"PID {first.pid}")
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert relative_error(read(c), 2 * read(a) @ read(b)) < tolerance(np.float64, K)
    assert not [p for p in os.listdir(tmp_path) if "bigmm-lock" in p]


def test_runs_on_two_datasets_of_one_file_at_once(tmp_path, job):
    a, b = job
    procs = [cli("multiply", a, b, "-o", f"{tmp_path / 'c.h5'}:/C{i}", "--alpha", i,
                 "--memory", BUDGET, "--backend", "numpy", pause=0.02, wait=False)
             for i in (1, 2)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    for i in (1, 2):
        got = read(f"{tmp_path / 'c.h5'}:/C{i}")
        assert relative_error(got, i * read(a) @ read(b)) < tolerance(np.float64, K)


def test_a_file_created_by_another_run_between_open_and_create_is_opened(tmp_path):
    # Mode "a" on a missing file opens, then creates exclusively: a file another run creates
    # in between is an EEXIST from HDF5, and the open is tried again (the race of the test
    # above, made certain).
    path = str(tmp_path / "c.h5")
    calls = []

    def open_fn():
        calls.append(1)
        if len(calls) == 1:
            with h5py.File(path, "w") as other:  # the other run
                other["C1"] = np.arange(3.0)
            return h5py.File(path, "x")  # this run's exclusive create
        return h5py.File(path, "a")

    with lock.h5_open_retry(open_fn, path, "C") as f:
        assert list(f) == ["C1"]
    assert len(calls) == 2


def test_a_killed_run_never_blocks_its_resume(tmp_path, job):
    a, b = job
    c = killed(a, b, f"{tmp_path / 'c.h5'}:/C")
    assert os.path.exists(parse_spec(c).path + ".C.bigmm-lock")  # left by the dead process
    rc, _, err = cli("multiply", a, b, "-o", c, "--memory", BUDGET, "--backend", "numpy",
                     "--resume")
    assert rc == 0, err


def test_lock_in_one_process(tmp_path):
    path = str(tmp_path / "x.bigmm-lock")
    held = lock.OutputLock(path, "C (x)")
    with pytest.raises(errors.OutputBusyError, match=f"PID {os.getpid()}"):
        lock.OutputLock(path, "C (x)")
    held.release()
    assert not os.path.exists(path)
    lock.OutputLock(path, "C (x)").release()


def test_an_output_file_held_open_by_another_process(tmp_path, job, monkeypatch):
    a, b = job
    path = tmp_path / "c.h5"
    h5(path, "other", np.arange(3.0))
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time, h5py
        f = h5py.File({str(path)!r}, "a")
        print("open", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        monkeypatch.setattr(lock, "H5_LOCK_WAIT", 0.3)
        with pytest.raises(errors.OutputBusyError, match="locked by another process"):
            bigmm.matmul(a, b, out=f"{path}:/C", backend="numpy")
    finally:
        holder.kill()
        holder.wait()
    assert not [p for p in os.listdir(tmp_path) if "bigmm-" in p]


# ----- 4. outputs passed as objects --------------------------------------------------------------

def stop_after(n):
    def progress(p):
        if p.tiles_done - p.tiles_skipped >= n:
            raise KeyboardInterrupt
    return progress


def test_an_h5py_dataset_output_is_journaled_and_resumable(tmp_path, job):
    a, b = job
    h5(tmp_path / "c.h5", "C", np.full((M, N), np.nan))
    with h5py.File(tmp_path / "c.h5", "r+") as f:
        with pytest.raises(errors.Interrupted, match="resumable") as e:
            bigmm.matmul(a, b, out=f["C"], memory=BUDGET, backend="numpy",
                         progress=stop_after(3))
        assert "array(" not in str(e.value)
        assert not f["C"].attrs["bigmm_complete"]
        out, stats = bigmm.matmul(a, b, out=f["C"], memory=BUDGET, backend="numpy",
                                  resume=True, stats=True)
        assert out is f["C"] or out == f["C"]
        assert stats.tiles_skipped >= 3 and f["C"].attrs["bigmm_complete"]
        got = f["C"][...]
    assert relative_error(got, read(a) @ read(b)) < tolerance(np.float64, K)
    assert not [p for p in os.listdir(tmp_path) if "bigmm-" in p]


def test_an_h5py_dataset_output_with_beta_is_refused(tmp_path, job):
    a, b = job
    c0 = random_matrix((M, N), np.float64, seed=3)
    h5(tmp_path / "c.h5", "C", c0)
    with h5py.File(tmp_path / "c.h5", "r+") as f:
        with pytest.raises(errors.OptionError, match="spec") as e:
            bigmm.matmul(a, b, out=f["C"], beta=1.0, backend="numpy")
        assert f"{tmp_path / 'c.h5'}:/C" in str(e.value)
        np.testing.assert_array_equal(f["C"][...], c0)


def test_an_array_output_says_it_cannot_be_resumed(job):
    a, b = job
    c0 = random_matrix((M, N), np.float64, seed=3)
    c = c0.copy()
    with pytest.raises(errors.Interrupted) as e:
        bigmm.matmul(a, b, out=c, beta=2.0, memory=BUDGET, backend="numpy",
                     progress=stop_after(2))
    msg = str(e.value)
    assert "partial product" in msg and "beta applied" in msg and "cannot be resumed" in msg
    assert "resumable" not in msg and len(msg) < 400
    with pytest.raises(errors.ResumeError, match="NumPy array") as e:
        bigmm.matmul(a, b, out=c, beta=2.0, backend="numpy", resume=True)
    assert len(str(e.value)) < 300


# ----- 5. an idempotent --resume -----------------------------------------------------------------

def test_resume_is_idempotent(tmp_path, job):
    a, b = job
    c = f"{tmp_path / 'c.h5'}:/C"
    args = ("multiply", a, b, "-o", c, "--memory", BUDGET, "--backend", "numpy", "--resume")
    rc, out, err = cli(*args)  # nothing there yet: the run starts
    assert rc == 0, err
    first = read(c)
    rc, out, err = cli(*args)  # finished by the same job: success, nothing computed
    assert rc == 0 and "is complete" in out, out + err
    rc, out, err = cli(*args, "--json")
    summary = json.loads(out)
    assert rc == 0 and summary["tiles_skipped"] == summary["tiles_total"] > 1
    assert summary["flops"] == 0 and read(c).tobytes() == first.tobytes()
    rc, _, err = cli(*args, "--alpha", "2")  # finished by another job
    one_line(rc, err, "another job", "alpha")
    h5(tmp_path / "a.h5", "A", random_matrix((M, K), np.float64, seed=5))  # A changed since
    rc, _, err = cli(*args)
    one_line(rc, err, "another job", "A (")


@pytest.mark.parametrize("beta", [0.0, BETA])
def test_a_retry_loop_under_a_killing_scheduler(tmp_path, job, beta):
    a, b = job
    c0 = random_matrix((M, N), np.float64, seed=3)
    ref, c = (f"{tmp_path / n}.h5:/C" for n in ("ref", "c"))
    if beta:  # old C to update
        ref, c = (h5(tmp_path / f"{n}.h5", "C", c0) for n in ("ref", "c"))
    opts = ("--memory", BUDGET, "--backend", "numpy", "--alpha", ALPHA, "--beta", beta)
    assert cli("multiply", a, b, "-o", ref, *opts, "--overwrite")[0] == 0
    # until bigmm multiply ... --resume; do sleep; done  -- each try killed a little later
    for attempt in range(1, 20):
        rc, _, err = cli("multiply", a, b, "-o", c, *opts, "--resume", kill_at=attempt % 3 + 1)
        if rc == 0:
            break
        assert rc == -signal.SIGKILL, err
    assert rc == 0 and attempt > 1
    assert read(c).tobytes() == read(ref).tobytes()
    assert cli("multiply", a, b, "-o", c, *opts, "--resume")[0] == 0  # and once more: done
    assert read(c).tobytes() == read(ref).tobytes()


def test_a_closed_stdout_after_c_is_complete(tmp_path, job):
    a, b = job
    c = f"{tmp_path / 'c.h5'}:/C"
    proc = cli("multiply", a, b, "-o", c, "--memory", BUDGET, "--backend", "numpy", "--json",
               wait=False)
    proc.stdout.close()  # `... --json | head -0`
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0 and "Traceback" not in err and "Error" not in err, err
    assert relative_error(read(c), read(a) @ read(b)) < tolerance(np.float64, K)


# ----- every error a bigmm error -----------------------------------------------------------------

@pytest.mark.parametrize("memory", [float("inf"), float("nan"), "inf", "nan", "1e400", 1e400])
def test_budgets_that_are_not_finite(job, memory):
    a, b = job
    with pytest.raises(errors.SizeParseError, match="Expected memory"):
        bigmm.matmul(a, b, memory=memory, backend="numpy")
    with pytest.raises(errors.SizeParseError, match="Expected host_memory"):
        bigmm.plan(a, b, host_memory=memory, backend="numpy")


@pytest.mark.parametrize("memory", [
    0.5,                # a fraction of a byte: not 0 bytes
    "0.5",              # the same as a string
    "0.9B",             # with a unit
    np.float32(0.25),   # a NumPy float
])
def test_budgets_below_one_byte_are_named_as_given(job, memory):
    a, b = job
    with pytest.raises(errors.SizeParseError, match="at least 1 byte") as err:
        bigmm.plan(a, b, memory=memory, backend="numpy")
    assert str(err.value).endswith(f"Got {memory!r}."), str(err.value)


@pytest.mark.parametrize("memory, threads", [
    (np.int64(64 << 20), np.int64(2)),     # NumPy's default integer
    (np.uint32(64 << 20), np.uint8(3)),    # unsigned
    (np.float64(64e6), 2),                 # a NumPy float budget
])
def test_numpy_numbers_as_budgets_and_threads(job, memory, threads):
    a, b = job
    p = bigmm.plan(a, b, memory=memory, host_memory=memory, io_threads=threads,
                   backend="numpy")
    assert p.n_tiles >= 1
    c = bigmm.matmul(a, b, memory=memory, io_threads=threads, backend="numpy")
    assert relative_error(c, read(a) @ read(b)) < tolerance(np.float64, K)


@pytest.mark.parametrize("threads", [
    True,              # a bool is not a count
    np.bool_(True),    # nor NumPy's
    2.0,               # a float
    np.int64(0),       # no threads
    10**7,             # more than any machine runs (the calibration started them all)
])
def test_io_threads_that_are_not_counts(job, threads):
    a, b = job
    with pytest.raises(errors.OptionError, match="io_threads"):
        bigmm.plan(a, b, io_threads=threads, backend="numpy")


def test_plan_refuses_unknown_keywords(job):
    a, b = job
    with pytest.raises(TypeError, match="memroy"):
        bigmm.plan(a, b, memroy="1MiB")
    with pytest.raises(TypeError, match="memroy"):
        bigmm.matmul(a, b, memroy="1MiB")


def test_an_unreadable_input(tmp_path, job):
    a, b = job
    os.chmod(tmp_path / "a.h5", 0)
    cmd = [sys.executable, "-m", "bigmm", "multiply", a, b, "-o", f"{tmp_path / 'c.h5'}:/C",
           "--backend", "numpy"]
    if os.geteuid() == 0:  # root reads anything: run the command without that privilege
        if shutil.which("capsh") is None:
            pytest.skip("running as root without capsh to drop CAP_DAC_OVERRIDE")
        cmd = ["capsh", "--drop=cap_dac_override,cap_dac_read_search", "--", "-c",
               shlex.join(cmd)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    one_line(proc.returncode, proc.stderr, "readable", "a.h5", "permission denied")


@pytest.mark.parametrize("shape", [(50, 40), (30, 30)])  # not square; square but too small
def test_gram_old_c_of_another_shape_is_a_shape_error(tmp_path, shape):
    # the symmetry check of old C names C's shape, not a region or an element
    a = random_matrix((60, 50), np.float64, seed=1)
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f["C"] = random_matrix(shape, np.float64, seed=2)
    with pytest.raises(errors.ShapeError, match=r"Expected shape \(50, 50\) for C .*Got "
                       + repr(shape).replace("(", r"\(").replace(")", r"\)")):
        bigmm.gram(a, f"{tmp_path}/c.h5:/C", beta=1.0, memory="64KiB", backend="numpy")
