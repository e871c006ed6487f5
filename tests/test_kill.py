"""Kill anywhere: ``bigmm multiply`` killed with SIGKILL at many points, resumed each time, ends
with the C of an uninterrupted run, bit for bit.

Two kinds of kill points:

* **Random** (seeded): the command is killed after a delay drawn from ``random.Random(seed)``
  as a fraction of the measured time of an uninterrupted run (so a slow machine stretches the
  points with it): early (start-up, opening and creating the output), anywhere, and late
  (the last tiles, the swap of the partial dataset for beta != 0, the completion mark, the
  journal's removal). Then it runs again, with ``--resume`` where a journal exists, and is
  killed again, until the case's number of kills have landed; a run that finishes before
  its kill point is checked and the output started over. A last run completes it.
* **Injected**: the command runs with a hook that SIGKILLs the process itself at one exact
  point of the output's life (after the journal is written, after the dataset is created,
  between a flush and its journal record, after the swap is journaled, between deleting old C
  and moving the partial dataset in its place, after the completion mark is set in the open
  file, before the journal is removed); then it is resumed.

At the end: C is bit-identical to an uninterrupted run of the same command (same plan), its
layout is the same, it is marked complete, the journal and the partial dataset are gone and
the inputs are byte-identical. Both beta == 0 and beta != 0 (old C read, partial dataset
swapped in at the end), contiguous and tile-chunked outputs (the output layer chunks C by the
plan's tiles when they are narrower than C and at least 1 MiB), and each way tiles are written
(``O_DIRECT`` runs, copies into a shared map; where the file system opens no ``O_DIRECT``, those
cases are skipped).
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import h5py
import numpy as np
import pytest

from bigmm.io import direct
from bigmm.io.generate import generate
from bigmm.io.journal import journal_path
from bigmm.io.spec import parse_spec

PROBLEMS = {
    # (m, k, n, dtype, --memory): 48 tiles of 128 x 96 in 2 K panels, C 4.5 MiB contiguous
    # (tiles under 1 MiB)
    "contiguous": (768, 256, 768, "float64", "700000"),
    # 24 tiles of 512 x 256 (1 MiB), C 24 MiB chunked by the tiles
    "chunked": (1536, 128, 2048, "float64", "4000000"),
}
ALPHA, BETA = 0.5, -1.5  # the beta != 0 runs: C = 0.5 * A @ B - 1.5 * C
HOST = "64MiB"  # fixed host staging budget (GPU): plans do not depend on the machine's RAM
RUN_TIMEOUT = 300.0


#: ``bigmm ARGS`` as ``python -m bigmm ARGS`` runs it (the CLI's main), with three test hooks
#: chosen by the first three arguments: a point (a name from ``points``, or "none") at which
#: the process SIGKILLs itself, before or after a call of a function of the output layer or of
#: h5py; seconds to sleep after each tile write (0: none); and how tiles are written
#: (``bigmm.io.direct.MODE``: "auto", "direct" or "mapped"). The sleep stretches the tile
#: phase of a small problem past the interpreter's start-up without costing CPU time, so that
#: random kill points fall among the tiles and between journal commits, not only in start-up.
CLI = textwrap.dedent("""
    import os, signal, sys, time
    import h5py
    from bigmm.cli import main
    from bigmm.executor import calibrate
    from bigmm.io import direct, filesink, h5atomic, journal, output
    from bigmm.testing import kill_at

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    always = lambda *a, **k: True
    J = journal.Journal
    points = {
        "none": None,
        "journal-created": (J, "create", always, False, staticmethod),
        "dataset-created": (output, "_create", always, False),
        "flushed-not-journaled": (J, "append", lambda self, rec: "tiles" in rec, True),
        "tiles-journaled": (J, "append", lambda self, rec: "tiles" in rec, False),
        "swap-journaled": (J, "append", lambda self, rec: bool(rec.get("swap")), False),
        "old-c-deleted": (h5py.Group, "move", always, True),
        "complete-set": (h5py.AttributeManager, "modify",
                         lambda self, key, value: key == "bigmm_complete" and bool(value), False),
        "journal-not-removed": (J, "remove", always, True),
    }
    if sys.argv[1].startswith("h5-step-"):  # the Nth step of the changes to the file's
        # structure (see bigmm.io.h5atomic): a commit begun, each write of a committed change
        # into the file, each removal of a log
        nth, steps = int(sys.argv[1].rsplit("-", 1)[1]), [0]
        def step():
            steps[0] += 1
            if steps[0] == nth:
                die()
        commit, recover = h5atomic.H5Atomic._commit, h5atomic._recover_locked
        def counted_commit(self):
            step()
            commit(self)
        def counted_recover(fd, path):
            real = os.pwrite, os.unlink
            def pwrite(*args):
                step()
                return real[0](*args)
            def unlink(*args):
                step()
                return real[1](*args)
            os.pwrite, os.unlink = pwrite, unlink
            try:
                return recover(fd, path)
            finally:
                os.pwrite, os.unlink = real
        h5atomic.H5Atomic._commit, h5atomic._recover_locked = counted_commit, counted_recover
    elif points[sys.argv[1]] is not None:
        kill_at(*points[sys.argv[1]])
    pause, write = float(sys.argv[2]), filesink.FileSink.write
    if pause > 0:
        def slow_write(self, *args):
            write(self, *args)
            time.sleep(pause)
        filesink.FileSink.write = slow_write
    direct.MODE = sys.argv[3]
    # one per-read cost for every run: it is timed per process, and a plan chosen by it
    # could differ from the reference run's (a resumed run keeps its journal's plan)
    calibrate.load_seconds = lambda src, repeat=3: 1e-3
    if direct.MODE == "direct":  # a run that falls back to the page cache would prove nothing
        init = filesink.FileSink._map_target
        def checked(self):
            init(self)
            assert self.writes in ("direct", "pwritev"), self.writes
        filesink.FileSink._map_target = checked
    sys.exit(main(sys.argv[4:]))
""")
#: Seconds the writer sleeps after each tile in the random-kill runs (and the reference run
#: whose time sets their kill points): 24-48 tiles take about a second more.
TILE_SLEEP = 0.03


class Job:
    """One problem's files in ``folder``: inputs, old C (beta != 0) and the reference C of an
    uninterrupted run, and the command line that computes C."""

    def __init__(self, folder, problem: str, beta: float, backend: str):
        self.folder, self.beta, self.backend = folder, beta, backend
        m, k, n, dtype, self.memory = PROBLEMS[problem]
        self.a, self.b = f"{folder / 'a.h5'}:/A", f"{folder / 'b.h5'}:/B"
        generate(self.a, (m, k), dtype=dtype, seed=1)
        generate(self.b, (k, n), dtype=dtype, seed=2)
        if beta:  # old C as a user's dataset: without bigmm's completion mark, so that
            # the mark after a kill tells whether the run got to its end
            generate(f"{folder / 'c0.h5'}:/C", (m, n), dtype=dtype, seed=3)
            with h5py.File(folder / "c0.h5", "r+") as f:
                del f["C"].attrs["bigmm_complete"]
        self.hashes = self.input_hashes()
        t0 = time.monotonic()
        self.reset("ref.h5")
        rc, err = run_cli(self.argv("ref.h5"), folder)
        assert rc == 0, err
        self.seconds = time.monotonic() - t0  # start-up included: kill points scale with it
        with h5py.File(folder / "ref.h5", "r") as f:
            self.reference, self.chunks = f["C"][...], f["C"].chunks
        self.expected_layout = "contiguous" if problem == "contiguous" else "chunked"
        if backend == "numpy":  # GPU plans are chosen by predicted time: for these small
            # problems 256 x 256 tiles, whose chunks would be under the minimum chunk size, so
            # C is contiguous there; the CPU runs cover both layouts
            assert (self.chunks is None) == (self.expected_layout == "contiguous"), self.chunks

    def argv(self, out: str, resume: bool = False) -> list[str]:
        args = ["multiply", self.a, self.b, "-o", f"{self.folder / out}:/C", "--memory",
                self.memory, "--host-memory", HOST, "--backend", self.backend, "--quiet"]
        if self.beta:
            args += ["--alpha", str(ALPHA), "--beta", str(self.beta)]
        return args + (["--resume"] if resume else [])

    def reset(self, out: str) -> None:
        """A fresh output: old C copied in (beta != 0), else nothing there."""
        path = self.folder / out
        for p in self.folder.glob(out + "*"):
            p.unlink()
        if self.beta:
            shutil.copyfile(self.folder / "c0.h5", path)

    def journal(self, out: str) -> str:
        return journal_path(parse_spec(f"{self.folder / out}:/C"))

    def finished(self, out: str) -> bool:
        """No journal and C marked complete by bigmm (old C for beta != 0 has no mark)."""
        if os.path.exists(self.journal(out)) or not os.path.exists(self.folder / out):
            return False
        with h5py.File(self.folder / out, "r") as f:
            return "C" in f and f["C"].attrs.get("bigmm_complete") is not None and bool(
                f["C"].attrs["bigmm_complete"])

    def next_argv(self, out: str) -> list[str]:
        """What a user runs after a kill: --resume where a journal exists, else the command."""
        return self.argv(out, resume=os.path.exists(self.journal(out)))

    def input_hashes(self) -> list[str]:
        return [hashlib.sha256((self.folder / f).read_bytes()).hexdigest()
                for f in ("a.h5", "b.h5")]

    def check(self, out: str) -> None:
        """C bit-identical to the reference, same layout, complete, nothing left behind."""
        assert self.finished(out)
        with h5py.File(self.folder / out, "r") as f:
            c = f["C"]
            assert c.chunks == self.chunks
            got = c[...]
            assert sorted(f) == ["C"], sorted(f)  # no partial dataset left
        assert got.dtype == self.reference.dtype
        assert np.array_equal(got, self.reference)
        assert got.tobytes() == self.reference.tobytes()  # bit for bit (signs of zeros too)
        # no journal, no temp file; a lock file stays only where a kill came after the journal
        # was removed (the next run on this output takes it over and removes it)
        assert not [p.name for p in self.folder.glob(out + ".*")
                    if not p.name.endswith(".bigmm-lock")]
        assert self.input_hashes() == self.hashes


def run_cli(argv: list[str], cwd, kill_after: float | None = None, point: str = "none",
            sleep: float = TILE_SLEEP, writes: str = "auto") -> tuple[int, str]:
    """Run ``bigmm argv`` (with the hooks of ``CLI``) to its end, or SIGKILL it after
    ``kill_after`` seconds; (exit status, stderr). -9 means killed."""
    proc = subprocess.Popen([sys.executable, "-c", CLI, point, str(sleep), writes, *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            cwd=cwd)
    try:
        _, err = proc.communicate(timeout=RUN_TIMEOUT if kill_after is None else kill_after)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=RUN_TIMEOUT)
    return proc.returncode, err


def resume_to_the_end(job: Job, out: str, limit: int = 5) -> None:
    """Run the next command until the output is finished (at most ``limit`` runs)."""
    for _ in range(limit):
        if job.finished(out):
            return
        rc, err = run_cli(job.next_argv(out), job.folder, sleep=0)
        assert rc == 0, err
    assert job.finished(out)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """One Job per (problem, beta, backend), made once for the module."""
    made = {}

    def get(problem: str, beta: float, backend: str = "numpy") -> Job:
        key = (problem, beta, backend)
        if key not in made:
            made[key] = Job(tmp_path_factory.mktemp(problem), problem, beta, backend)
        return made[key]
    return get


# ----- random kill points ---------------------------------------------------------------------

#: Where a delay falls, as fractions of an uninterrupted run's time.
PHASES = {"early": (0.0, 0.3), "anywhere": (0.0, 1.0), "late": (0.85, 1.1)}

RANDOM = [
    # (problem, beta, backend, seed, kills, writes); with the injected points below, every pair
    # of beta == 0 / beta != 0 and contiguous / chunked output is covered, and each write path
    ("contiguous", BETA, "numpy", 1, 5, "auto"),  # old C read, partial dataset swapped in
    ("chunked", 0.0, "numpy", 2, 4, "direct"),    # beta 0: C created fresh, chunked by tiles,
    #                                               its tiles written with O_DIRECT
    ("chunked", 0.0, "numpy", 5, 4, "mapped"),    # the same, tiles copied into a shared map
    pytest.param("contiguous", BETA, "cupy", 3, 5, "auto", marks=pytest.mark.gpu),  # the GPU
    pytest.param("chunked", 0.0, "cupy", 4, 4, "direct", marks=pytest.mark.gpu),    # pipeline
]


def skip_without_direct(job, writes: str) -> None:
    if writes == "direct" and not direct.supports_direct(str(job.folder)):
        pytest.skip("no O_DIRECT on this file system")


@pytest.mark.slow
@pytest.mark.parametrize("problem,beta,backend,seed,kills,writes", RANDOM)
def test_random_kills_then_resume_bit_identical(jobs, problem, beta, backend, seed, kills,
                                                writes):
    job = jobs(problem, beta, backend)
    skip_without_direct(job, writes)
    rng = random.Random(seed)
    out = f"c-random-{seed}.h5"
    job.reset(out)
    log = []  # (phase, delay, resumed, exit status) per run
    while sum(rc == -signal.SIGKILL for *_, rc in log) < kills:
        assert len(log) < 4 * kills, log  # runs keep finishing before their kill points
        if job.finished(out):  # the last run beat its kill point: check, start over
            job.check(out)
            job.reset(out)
        phase = rng.choice(sorted(PHASES))
        lo, hi = PHASES[phase]
        delay = rng.uniform(lo, hi) * job.seconds
        argv = job.next_argv(out)
        rc, err = run_cli(argv, job.folder, kill_after=delay, writes=writes)
        assert rc in (0, -signal.SIGKILL), err  # killed, or it finished first: never an error
        log.append((phase, round(delay, 3), "--resume" in argv, rc))
    resume_to_the_end(job, out)
    print(f"{problem} beta={beta} {backend} {writes}: run {job.seconds:.2f} s; runs {log}")
    job.check(out)


# ----- injected kill points -------------------------------------------------------------------

INJECTED = [
    # (problem, beta, point, writes): the process kills itself ...
    ("contiguous", 0.0, "journal-created", "auto"),         # journal written, no dataset yet
    ("contiguous", 0.0, "flushed-not-journaled", "auto"),   # tiles flushed to C, not journaled
    ("contiguous", 0.0, "complete-set", "auto"),            # C marked complete in the open file
    ("chunked", 0.0, "flushed-not-journaled", "direct"),    # direct tiles synced, not journaled
    ("chunked", 0.0, "tiles-journaled", "direct"),          # direct tiles journaled
    ("chunked", 0.0, "flushed-not-journaled", "mapped"),    # mapped tiles synced, not journaled
    ("chunked", BETA, "dataset-created", "direct"),         # partial dataset beside old C
    ("chunked", BETA, "swap-journaled", "direct"),          # every tile durable, swap journaled
    ("chunked", BETA, "old-c-deleted", "direct"),           # old C deleted, partial not moved
    ("chunked", BETA, "complete-set", "direct"),            # swapped, complete mark not flushed
    ("chunked", BETA, "journal-not-removed", "direct"),     # complete, journal still there
]


@pytest.mark.slow
@pytest.mark.parametrize("problem,beta,point,writes", INJECTED)
def test_kill_at_a_point_then_resume_bit_identical(jobs, problem, beta, point, writes):
    job = jobs(problem, beta)
    skip_without_direct(job, writes)
    out = f"c-{point}-{writes}.h5"
    job.reset(out)
    rc, err = run_cli(job.argv(out), job.folder, point=point, sleep=0, writes=writes)
    assert rc == -signal.SIGKILL, f"the hook at {point} did not fire (exit {rc}): {err}"
    resume_to_the_end(job, out)
    job.check(out)


#: Runs whose output's structure changes at both ends: C created in a new file, then marked
#: complete with its job recorded (beta == 0); a partial dataset created beside old C, then
#: swapped in for it (beta != 0).
ENDS = [
    ("chunked", 0.0),   # a new file
    ("chunked", BETA),  # the user's file holding old C
]


def kill_at_step_then_resume(job: Job, nth: int) -> int:
    """Run the command killed at the ``nth`` step of a change to the file, resume it to the end
    and check C; the first run's exit status (0: there is no ``nth`` step)."""
    out = f"c-step-{nth}.h5"
    job.reset(out)
    rc, err = run_cli(job.argv(out), job.folder, point=f"h5-step-{nth}", sleep=0)
    if rc != 0:
        assert rc == -signal.SIGKILL, err
        resume_to_the_end(job, out)
    job.check(out)
    return rc


#: Steps killed at once (each on an output of its own): the runs are mostly the interpreter's
#: start-up, one core each.
STEP_WORKERS = max(1, min(4, os.cpu_count() or 1))


@pytest.mark.slow
@pytest.mark.parametrize("problem,beta", ENDS)
def test_kill_at_each_step_of_a_change_to_the_file_then_resume_bit_identical(jobs, problem,
                                                                             beta):
    job = jobs(problem, beta)
    codes = {}  # step -> exit status of the run killed there
    with ThreadPoolExecutor(STEP_WORKERS) as pool:
        while 0 not in codes.values():  # until a run goes past the last step
            assert len(codes) < 100, codes
            steps = range(len(codes) + 1, len(codes) + 1 + STEP_WORKERS)
            codes.update(zip(steps, pool.map(lambda nth: kill_at_step_then_resume(job, nth),
                                             steps)))
    last = min(nth for nth, rc in codes.items() if rc == 0)
    assert all(codes[nth] == -signal.SIGKILL for nth in range(1, last)), codes
    assert all(rc == 0 for nth, rc in codes.items() if nth > last), codes
    assert last > 6, codes  # two commits, each with writes: every step killed once
