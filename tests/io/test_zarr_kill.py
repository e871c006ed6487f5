"""Kill anywhere, Zarr edition: ``bigmm multiply`` into a Zarr array, killed with SIGKILL at
random points and at injected points of the output's life, resumed each time, ends with the C
of an uninterrupted run, bit for bit.

Injected points (the process SIGKILLs itself): after the journal is written; after the array is
created; with chunks written to their temporary files; after chunks were made durable and put
in place but before their tiles are journaled; after the swap is journaled; with old C moved
aside and the partial array not yet in its place; after the completion mark; before the
journal is removed. Random points: the command is killed after a seeded delay drawn as a
fraction of an uninterrupted run's time, resumed, killed again, then run to the end.

At the end: C equals the reference bit for bit, it is marked complete with its job, no
journal, lock, partial or old array or temporary chunk file is left, and the input stores are
byte-identical.
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

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")

from bigmm.io import direct  # noqa: E402
from bigmm.io.generate import generate  # noqa: E402
from bigmm.io.journal import journal_path  # noqa: E402
from bigmm.io.spec import parse_spec  # noqa: E402

M, K, N, DTYPE, MEMORY = 640, 256, 600, "float64", "700000"  # 40-odd tiles of C
ALPHA, BETA = 0.5, -1.5
RUN_TIMEOUT = 300.0
TILE_SLEEP = 0.03  # seconds after each tile write in the random-kill runs

CLI = textwrap.dedent("""
    import os, sys, time
    from bigmm.cli import main
    from bigmm.io import direct, journal, zarrsink
    from bigmm.testing import kill_at

    always = lambda *a, **k: True
    J, F = journal.Journal, zarrsink.ChunkFiles
    points = {
        "none": None,
        "journal-created": (J, "create", always, False, staticmethod),
        "array-created": (zarrsink, "create", always, False),
        "chunks-in-temporary-files": (F, "write", always, False),
        "published-not-journaled": (os, "replace", lambda a, b: str(a).endswith(".bigmm-tmp")
                                    and not str(b).endswith("zarr.json"), False),
        "swap-journaled": (J, "append", lambda self, rec: bool(rec.get("swap")), False),
        "old-moved-aside": (os, "rename",
                            lambda a, b: str(b).endswith(zarrsink.OLD_SUFFIX), False),
        "complete-set": (zarrsink, "write_attributes",
                         lambda folder, values: values.get("bigmm_complete") is True, False),
        "journal-not-removed": (J, "remove", always, True),
    }
    if points[sys.argv[1]] is not None:
        kill_at(*points[sys.argv[1]])
    pause, write = float(sys.argv[2]), zarrsink.ZarrSink.write
    if pause > 0:
        def slow_write(self, *args):
            write(self, *args)
            time.sleep(pause)
        zarrsink.ZarrSink.write = slow_write
    if sys.argv[3] == "direct":  # every whole page of a chunk written with O_DIRECT
        direct.MODE, direct.DIRECT_MIN = "direct", 0
        reserve = F._reserve
        def checked(self, fd, tmp):
            writes = reserve(self, fd, tmp)
            assert writes is not None, "chunk files fell back to the page cache"
            return writes
        F._reserve = checked
    sys.exit(main(sys.argv[4:]))
""")


def run_cli(argv, cwd, kill_after=None, point="none", sleep=TILE_SLEEP, writes="auto"):
    """Run ``bigmm argv`` with the hooks above to its end, or SIGKILL it after
    ``kill_after`` seconds; (exit status, stderr). ``writes``: "direct" forces ``O_DIRECT``
    chunk writes (and fails the run where they fall back), "auto" leaves them to bigmm."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", CLI, point, str(sleep), writes, *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            cwd=cwd, env=env)
    try:
        _, err = proc.communicate(timeout=RUN_TIMEOUT if kill_after is None else kill_after)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=RUN_TIMEOUT)
    return proc.returncode, err


def tree_hash(folder) -> str:
    h = hashlib.sha256()
    for root, dirs, files in sorted(os.walk(folder)):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            h.update(os.path.relpath(path, folder).encode())
            with open(path, "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()


class Job:
    """Inputs (a zstd-compressed A and an uncompressed B in one store), old C (beta != 0) and
    the reference C of an uninterrupted run, in ``folder``."""

    def __init__(self, folder, beta: float):
        self.folder, self.beta = folder, beta
        self.a, self.b = f"{folder / 'in.zarr'}:/A", f"{folder / 'in.zarr'}:/B"
        generate(self.a, (M, K), dtype=DTYPE, seed=1, compression="zstd", chunks=(100, 100))
        generate(self.b, (K, N), dtype=DTYPE, seed=2, chunks=(128, 150))
        if beta:  # old C as a user's array: gzip, other chunks, no completion mark
            generate(str(folder / "c0.zarr"), (M, N), dtype=DTYPE, seed=3, compression="gzip",
                     chunks=(200, 200))
            arr = zarr.open_array(str(folder / "c0.zarr"), mode="r+")
            arr.attrs.clear()
            arr.update_attributes({"units": "m"})
        self.inputs = tree_hash(folder / "in.zarr")
        t0 = time.monotonic()
        self.reset("ref.zarr")
        rc, err = run_cli(self.argv("ref.zarr"), folder)
        assert rc == 0, err
        self.seconds = time.monotonic() - t0
        self.reference = self.read("ref.zarr")

    def spec(self, out: str) -> str:
        return f"{self.folder / out}:/C"

    def argv(self, out: str, resume: bool = False) -> list[str]:
        args = ["multiply", self.a, self.b, "-o", self.spec(out), "--memory", MEMORY,
                "--backend", "numpy", "--quiet"]
        if self.beta:
            args += ["--alpha", str(ALPHA), "--beta", str(self.beta)]
        return args + (["--resume"] if resume else [])

    def reset(self, out: str) -> None:
        for p in self.folder.glob(out + "*"):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        if self.beta:  # old C in the output store, at /C
            zarr.create_group(str(self.folder / out))
            shutil.copytree(self.folder / "c0.zarr", self.folder / out / "C")

    def read(self, out: str) -> np.ndarray:
        return zarr.open_array(str(self.folder / out), path="C", mode="r")[...]

    def journal(self, out: str) -> str:
        return journal_path(parse_spec(self.spec(out)))

    def finished(self, out: str) -> bool:
        if os.path.exists(self.journal(out)):
            return False
        try:
            arr = zarr.open_array(str(self.folder / out), path="C", mode="r")
        except Exception:
            return False
        return arr.attrs.get("bigmm_complete") is True

    def next_argv(self, out: str) -> list[str]:
        return self.argv(out, resume=os.path.exists(self.journal(out)))

    def check(self, out: str) -> None:
        assert self.finished(out)
        got = self.read(out)
        assert got.tobytes() == self.reference.tobytes()  # bit for bit
        arr = zarr.open_array(str(self.folder / out), path="C", mode="r")
        assert "bigmm_job" in arr.attrs and (not self.beta or arr.attrs["units"] == "m")
        store = self.folder / out
        assert sorted(os.listdir(store)) == ["C", "zarr.json"]  # no partial, no old C
        left = [f for _, _, fs in os.walk(store) for f in fs if f.endswith(".bigmm-tmp")]
        assert not left
        assert not [p.name for p in self.folder.glob(out + ".*")
                    if not p.name.endswith(".bigmm-lock")]
        assert tree_hash(self.folder / "in.zarr") == self.inputs


def resume_to_the_end(job: Job, out: str, limit: int = 5, writes: str = "auto") -> None:
    for _ in range(limit):
        if job.finished(out):
            return
        rc, err = run_cli(job.next_argv(out), job.folder, sleep=0, writes=writes)
        assert rc == 0, err
    assert job.finished(out)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    made = {}

    def get(beta: float) -> Job:
        if beta not in made:
            made[beta] = Job(tmp_path_factory.mktemp(f"zkill{int(bool(beta))}"), beta)
        return made[beta]
    return get


INJECTED = [
    # (beta, point): the process kills itself ...
    (0.0, "journal-created"),            # with the journal written, no array yet
    (0.0, "array-created"),              # with the array created, no tile
    (0.0, "chunks-in-temporary-files"),  # with a chunk in its temporary file
    (0.0, "published-not-journaled"),    # chunks durable and in place, tiles not journaled
    (0.0, "complete-set"),               # with C marked complete, journal still there
    (BETA, "array-created"),             # the partial array created beside old C
    (BETA, "published-not-journaled"),
    (BETA, "swap-journaled"),            # every tile durable, swap journaled
    (BETA, "old-moved-aside"),           # old C moved aside, the partial not yet in place
    (BETA, "journal-not-removed"),       # complete and durable, journal still there
]


@pytest.mark.slow
@pytest.mark.parametrize("beta,point", INJECTED)
def test_kill_at_a_point_then_resume_bit_identical(jobs, beta, point):
    job = jobs(beta)
    out = f"c-{point}.zarr"
    job.reset(out)
    rc, err = run_cli(job.argv(out), job.folder, point=point, sleep=0)
    assert rc == -signal.SIGKILL, f"the hook at {point} did not fire (exit {rc}): {err}"
    resume_to_the_end(job, out)
    job.check(out)


PHASES = {"early": (0.0, 0.3), "anywhere": (0.0, 1.0), "late": (0.85, 1.1)}


@pytest.mark.slow
@pytest.mark.parametrize("beta,seed,kills,writes", [
    (0.0, 1, 3, "auto"),
    (BETA, 2, 3, "auto"),
    (0.0, 3, 3, "direct"),   # chunk files written with O_DIRECT
])
def test_random_kills_then_resume_bit_identical(jobs, beta, seed, kills, writes):
    job = jobs(beta)
    if writes == "direct" and not direct.supports_direct(str(job.folder)):
        pytest.skip("no O_DIRECT on this file system")
    rng = random.Random(seed)
    out = f"c-random-{seed}.zarr"
    job.reset(out)
    log = []
    while sum(rc == -signal.SIGKILL for *_, rc in log) < kills:
        assert len(log) < 4 * kills, log
        if job.finished(out):
            job.check(out)
            job.reset(out)
        phase = rng.choice(sorted(PHASES))
        lo, hi = PHASES[phase]
        delay = rng.uniform(lo, hi) * job.seconds
        argv = job.next_argv(out)
        rc, err = run_cli(argv, job.folder, kill_after=delay, writes=writes)
        assert rc in (0, -signal.SIGKILL), err
        log.append((phase, round(delay, 3), "--resume" in argv, rc))
    resume_to_the_end(job, out, writes=writes)
    print(f"beta={beta}: run {job.seconds:.2f} s; runs {log}")
    job.check(out)
