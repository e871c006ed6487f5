"""Bounded memory: a ``bigmm multiply`` process holds the budget it is given, not the matrices.

Each run is a fresh ``python -m bigmm multiply`` process on HDF5 operands several times larger
than its budget. What is measured, and why:

* **Private memory** (``RssAnon`` of ``/proc/PID/status``, sampled every few milliseconds from
  this process): the heap, NumPy buffers, thread stacks, BLAS workspace. This is the memory the
  engine allocates, and it must stay within the budget plus the interpreter's own: the peak,
  less the peak of the same command on a tiny problem (the fixed overhead: the interpreter,
  NumPy, h5py, BLAS and the CLI's planning, measured here, not assumed), is at most
  ``--memory`` plus ``ANON_SLACK``. The engine allocates its buffers once per run and holds
  them to the end, so the sampled peak is the plateau of the run; a spike shorter than a
  sample could be missed, which is why the total below is also taken from the kernel.
* **Total resident memory** (the kernel's high-water mark ``VmHWM``, exact, which the
  process reads when the command has finished): private memory plus the pages of the inputs
  and the output mapped into the process. The io layer reads inputs and writes C through
  shared file mappings, and every page touched stays counted in RSS until it is unmapped;
  those pages are page cache (clean for the inputs, written back for C) that the kernel can
  reclaim, but RSS-based limits (batch schedulers, dask's worker memory monitor) see them. The
  io layer therefore drops the pages behind each copy as it goes
  (``bigmm.io.mapped.FileMap.copy``), and the total is asserted against the same bound plus
  ``MAPPED_SLACK`` for the file pages of the copies in flight.

On the GPU the device memory a run holds is measured with the CUDA driver's used memory
(``cudaMemGetInfo``), sampled during the run, against the device budget: the multiplication
itself, and the whole command, whose plan first calibrates the backend within the budget.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from bigmm.io.generate import generate
from bigmm.io.mapped import HELD_BYTES
from bigmm.io.source import DEFAULT_THREADS
from bigmm.units import parse_size

MiB = 1 << 20
#: Private memory beyond the budget and the tiny run's peak: BLAS's per-thread workspace,
#: which a large gemm touches more of than a tiny one (measured 2-4 MiB on 2 cores), the
#: reader and writer threads' stacks, the plan's steps and the page-rounding of the buffers.
ANON_SLACK = 16 * MiB
#: File pages mapped at once, beyond the tiny run's: each thread copying through a map holds at
#: most ``HELD_BYTES`` of it mapped (a 4 MiB block of the copy and a 2 MiB fault window at
#: either end; see bigmm.io.mapped), and such copies run only on the reader threads of A and
#: of B (``DEFAULT_THREADS`` each) and on the one writer thread: 72 MiB with 4 reader threads
#: (2 cores). Plus 8 MiB of library code a large run touches beyond a tiny one (measured 1-3
#: MiB: BLAS kernels, more of HDF5). A bound, not the usual figure: the runs measured here
#: held up to 25 MiB of the files' pages at their peaks.
MAPPED_SLACK = (2 * DEFAULT_THREADS + 1) * HELD_BYTES + 8 * MiB
#: Between samples of /proc/PID/status.
SAMPLE_SECONDS = 0.002

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc/PID/status (Linux)")

SHAPES = {
    # A 1024 x 65536 and B 65536 x 1024 float32: 256 MiB each, C 4 MiB; read in K panels
    "tall-k": ((1024, 65536), (65536, 1024)),
    # A 8192 x 1024 and B 1024 x 8192: 32 MiB each, C 8192 x 8192 (256 MiB) written in tiles
    "big-c": ((8192, 1024), (1024, 8192)),
    # the fixed overhead: the same command on 64 x 64 operands
    "tiny": ((64, 64), (64, 64)),
}

CASES = [
    # (shape, budget)
    ("tall-k", "16MiB"),  # inputs 16x the budget each
    ("tall-k", "64MiB"),  # the same inputs at 4x the budget: the peak follows the budget
    ("big-c", "16MiB"),   # C 16x the budget, the inputs 2x
    ("big-c", "64MiB"),   # C 4x the budget
]


def _pairs(d, shapes: dict, a_dtype: str = "float32") -> dict:
    """Spec pairs (A, B) in folder ``d`` per shape name, A in ``a_dtype``, B float32."""
    specs = {}
    for name, (sa, sb) in shapes.items():
        specs[name] = (f"{d / name}-a.h5:/A", f"{d / name}-b.h5:/B")
        generate(specs[name][0], sa, dtype=a_dtype, seed=1)
        generate(specs[name][1], sb, seed=2)
    return specs


@pytest.fixture(scope="module")
def operands(tmp_path_factory):
    """Spec pairs (A, B) per shape name, generated once for the module."""
    d = tmp_path_factory.mktemp("memory")
    return d, _pairs(d, SHAPES)


def _status(pid: int) -> dict[str, int]:
    """RssAnon, RssFile and RssShmem of process ``pid`` in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile", "RssShmem"):
                out[key] = int(value.split()[0]) * 1024
    return out


#: ``python -m bigmm ARGS`` (the CLI's main), then the process's own peak total RSS (VmHWM) on
#: stdout. ru_maxrss of the child would not do: Linux carries the forked parent's high-water
#: mark across exec, so it would count this test process's memory.
CLI = textwrap.dedent("""
    import sys
    from bigmm.cli import main
    rc = main(sys.argv[1:])
    with open("/proc/self/status") as f:
        print([line.split()[1] for line in f if line.startswith("VmHWM:")][0])
    sys.exit(rc)
""")


def measure(argv: list[str], cwd, script: str = CLI) -> dict[str, int]:
    """Run ``bigmm argv`` (or ``script`` with ``argv``) in a fresh process to its end; its peak
    private memory (sampled RssAnon), peak mapped file pages (sampled RssFile) and exact peak
    total RSS (VmHWM), in bytes."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # this bigmm
    proc = subprocess.Popen([sys.executable, "-c", script, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd, env=env)
    peak = {"RssAnon": 0, "RssFile": 0}
    done = threading.Event()

    def sample():
        while not done.is_set():
            try:
                now = _status(proc.pid)
            except (OSError, ValueError):  # gone
                return
            for key in peak:
                peak[key] = max(peak[key], now.get(key, 0))
            time.sleep(SAMPLE_SECONDS)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate(timeout=300)
    done.set()
    sampler.join()
    assert proc.returncode == 0, err
    return {"anon": peak["RssAnon"], "file": peak["RssFile"],
            "total": int(out.split()[-1]) * 1024}


def _multiply(specs, name: str, budget: str, out: str) -> list[str]:
    a, b = specs[name]
    return ["multiply", a, b, "-o", out, "--memory", budget, "--host-memory", budget,
            "--backend", "numpy", "--overwrite", "--quiet"]


@pytest.fixture(scope="module")
def peaks(operands):
    """Peaks per (shape, budget), each measured once for the module; "tiny" is the baseline."""
    d, specs = operands
    cache = {}

    def get(name: str, budget: str = "16MiB") -> dict[str, int]:
        if (name, budget) not in cache:
            cache[name, budget] = measure(_multiply(specs, name, budget, f"{d / name}-c.h5:/C"),
                                          d)
        return cache[name, budget]
    return get


def _report(name, budget, base, peak) -> str:
    return (f"{name} at {budget}: peak private {peak['anon'] / MiB:.0f} MiB, mapped files "
            f"{peak['file'] / MiB:.0f} MiB, total {peak['total'] / MiB:.0f} MiB; baseline "
            f"private {base['anon'] / MiB:.0f}, total {base['total'] / MiB:.0f} MiB")


@pytest.mark.slow
@pytest.mark.parametrize("name,budget", CASES)
def test_private_memory_within_budget(peaks, name, budget):
    base, peak = peaks("tiny"), peaks(name, budget)
    print(_report(name, budget, base, peak))
    assert peak["anon"] <= base["anon"] + parse_size(budget) + ANON_SLACK, \
        _report(name, budget, base, peak)


@pytest.mark.slow
@pytest.mark.parametrize("name,budget", CASES)
def test_total_rss_within_budget(peaks, name, budget):
    base, peak = peaks("tiny"), peaks(name, budget)
    print(_report(name, budget, base, peak))
    bound = base["total"] + parse_size(budget) + ANON_SLACK + MAPPED_SLACK
    assert peak["total"] <= bound, _report(name, budget, base, peak)


#: Compressed inputs: A 4096 x 4096 float32 in zstd chunks of 2048 x 2048 (16 MiB decoded,
#: about as much stored), in HDF5 or Zarr, B 4096 x 256 contiguous; "tiny" the baseline.
COMPRESSED = {"h5": "{d}/z-a.h5:/A", "zarr": "{d}/z-a.zarr:/A", "tiny": "{d}/z-tiny.zarr:/A"}


@pytest.fixture(scope="module")
def compressed(tmp_path_factory):
    """Specs of the compressed A per store, and of B."""
    d = tmp_path_factory.mktemp("compressed")
    specs = {name: spec.format(d=d) for name, spec in COMPRESSED.items()}
    for name in ("h5", "zarr"):
        generate(specs[name], (4096, 4096), layout="compressed", compression="zstd",
                 chunks=(2048, 2048), seed=1)
    generate(specs["tiny"], (64, 64), compression="zstd", chunks=(32, 32), seed=1)
    b, tiny_b = f"{d}/z-b.h5:/B", f"{d}/z-b.h5:/T"
    generate(b, (4096, 256), seed=2)
    generate(tiny_b, (64, 64), seed=2)
    return d, specs, b, tiny_b


@pytest.mark.slow
@pytest.mark.parametrize("store", [
    "h5",    # HDF5 zstd chunks, decoded by bigmm's readers
    "zarr",  # Zarr zstd chunks
])
def test_private_memory_within_budget_with_compressed_chunks(compressed, store):
    # each decoded chunk and its stored bytes count in the budget: at most the decoders the
    # budget holds beside the staging decode at once, however many readers there are
    d, specs, b, tiny_b = compressed
    budget = "40MiB"  # one decoded chunk and tiles beside it

    def argv(a, b, budget):
        return ["multiply", a, b, "-o", f"{d}/z-c.h5:/C", "--memory", budget, "--host-memory",
                budget, "--backend", "numpy", "--overwrite", "--quiet", "--io-threads", "4"]

    base = measure(argv(specs["tiny"], tiny_b, "1MiB"), d)
    peak = measure(argv(specs[store], b, budget), d)
    report = _report(f"zstd {store}", budget, base, peak)
    print(report)
    assert peak["anon"] <= base["anon"] + parse_size(budget) + ANON_SLACK, report


@pytest.mark.slow
@pytest.mark.parametrize("command", ["multiply", "plan"])  # its budget note; a printed plan
def test_planning_measures_within_the_budget(operands, peaks, command):
    # without --quiet multiply plans the default budgets too (the note on a slow budget), and
    # plan predicts a time: the machine's rates are timed within the budget given
    d, specs = operands
    a, b = specs["tall-k"]
    argv = ([command, a, b] + (["-o", f"{d}/note-c.h5:/C", "--overwrite"]
                               if command == "multiply" else [])
            + ["--memory", "1MiB", "--backend", "numpy"])
    base, peak = peaks("tiny"), measure(argv, d)
    print(_report(command, "1MiB", base, peak))
    assert peak["anon"] <= base["anon"] + parse_size("1MiB") + ANON_SLACK, \
        _report(command, "1MiB", base, peak)


#: ``bigmm.matmul(A, B, C, memory=BUDGET)`` on the CPU (ARGS: A, B, C and BUDGET), then the
#: process's peak total RSS as CLI prints it. matmul plans on the CPU without timing the
#: machine, where the command's plan does (copies of 16 MiB or more, which the tiny run's
#: peak then holds too): its peak is the run's.
API = textwrap.dedent("""
    import sys
    import bigmm
    a, b, c, budget = sys.argv[1:]
    bigmm.matmul(a, b, c, memory=budget, backend="numpy", overwrite=True)
    with open("/proc/self/status") as f:
        print([line.split()[1] for line in f if line.startswith("VmHWM:")][0])
""")

@pytest.mark.slow
def test_old_c_private_memory_within_budget(tmp_path):
    # beta != 0 hashes all of old C when the run starts (its identity): read a piece at a time
    # into one buffer, not in 16 MiB blocks held twice beside their copies (48 MiB at any budget)
    budget = "4MiB"
    for name, (m, k) in {"tiny": (64, 64), "old": (2048, 256)}.items():
        generate(f"{tmp_path}/{name}.h5:/A", (m, k), seed=1)
        generate(f"{tmp_path}/{name}.h5:/B", (k, m), seed=2)
        generate(f"{tmp_path}/{name}.h5:/C", (m, m), seed=3)  # old C: 16 MiB
    base, peak = (measure([f"{name}.h5:/A", f"{name}.h5:/B", f"{name}.h5:/C", budget], tmp_path,
                          API.replace("overwrite=True", "beta=1.0"))
                  for name in ("tiny", "old"))
    print(_report("old C", budget, base, peak))
    assert peak["anon"] <= base["anon"] + parse_size(budget) + ANON_SLACK, \
        _report("old C", budget, base, peak)


#: A float16 A and a float32 B: a float32 product, A's panels widened as they load.
MIXED = {"mixed": ((20000, 5000), (5000, 300)), "tiny": ((64, 64), (64, 64))}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """(directory, {name: (A, B)}) of MIXED, generated once for the module."""
    d = tmp_path_factory.mktemp("mixed")
    return d, _pairs(d, MIXED, "float16")


@pytest.mark.slow
def test_mixed_dtypes_private_memory_within_budget(mixed):
    # A's 2560 x 2560 panels (25 MiB as float32) are read as float16 into their own buffers:
    # no float16 copy of a panel beside them
    d, specs = mixed
    budget = "64MiB"
    base, peak = (measure([*specs[name], f"{d / name}-c.h5:/C", budget], d, API)
                  for name in ("tiny", "mixed"))
    print(_report("mixed", budget, base, peak))
    assert peak["anon"] <= base["anon"] + parse_size(budget) + ANON_SLACK, \
        _report("mixed", budget, base, peak)


# ----- device memory (GPU) ------------------------------------------------------------------

#: Device memory beyond the budget: cuBLAS/NVRTC module code and local memory loaded on first
#: use that the warm-up did not load, and the driver's allocation granularity (2 MiB pages).
DEVICE_SLACK = 32 * MiB

#: Runs ``bigmm multiply`` in process (through the CLI's main) while a thread samples the
#: device's used memory; prints the used memory before the run and its peak during it. A small
#: product first loads the kernels and sizes the context, so the baseline holds them. With
#: "warm" as the first argument the backend's rate calibration (which the CLI's plan runs for
#: the predicted time, and caches per process) runs before the baseline too, so that only
#: the multiplication itself is measured.
GPU_SCRIPT = textwrap.dedent("""
    import json, sys, threading, time
    import cupy, numpy as np
    import bigmm
    from bigmm.backends import get_backend
    from bigmm.cli import main

    a = np.ones((300, 300), np.float32)
    bigmm.matmul(a, a, memory="1MiB", backend="cupy")
    if sys.argv[1] == "warm":
        be = get_backend("cupy")
        be.rates("float32")
        be.close()
    def used():
        free, total = cupy.cuda.runtime.memGetInfo()
        return total - free
    before = used()
    peak = [before]
    done = threading.Event()
    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], used())
            time.sleep(0.001)
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    rc = main(sys.argv[2:])
    done.set()
    t.join()
    print(json.dumps({"rc": rc, "before": before, "peak": max(peak[0], used())}))
""")

GPU_CASES = [
    # (shape, device budget)
    ("tall-k", "64MiB"),   # inputs 4x the budget each
    ("big-c", "64MiB"),    # C 4x the budget
    ("big-c", "256MiB"),   # 4x the budget: the plan already moves the fewest bytes with
                           # 62 MiB and holds no more; the peak follows the plan
]


def device_memory_held(operands, name: str, budget: str, calibration: str) -> int:
    """Bytes of device memory a ``bigmm multiply`` of the operands ``name`` held at its peak
    beyond what the process held before (``calibration``: "warm" or "cold", see GPU_SCRIPT)."""
    d, specs = operands
    a, b = specs[name]
    argv = ["multiply", a, b, "-o", f"{d / name}-gc.h5:/C", "--memory", budget,
            "--host-memory", budget, "--backend", "cupy", "--overwrite", "--quiet"]
    p = subprocess.run([sys.executable, "-c", GPU_SCRIPT, calibration, *argv],
                       capture_output=True, text=True, cwd=d, timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["rc"] == 0, p.stderr
    held = r["peak"] - r["before"]
    print(f"{name} at {budget} ({calibration}): device memory held {held / MiB:.0f} MiB")
    return held


@pytest.mark.device_memory
@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("name,budget", GPU_CASES)
def test_device_memory_of_the_run_within_budget(operands, name, budget):
    held = device_memory_held(operands, name, budget, "warm")
    assert held <= parse_size(budget) + DEVICE_SLACK, f"{held / MiB:.0f} MiB"


# The whole command, the plan's rate calibration included (it holds at most the run's smaller
# budget: a copy buffer of half of it and one square operand).
@pytest.mark.device_memory
@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("name,budget", GPU_CASES[:1])
def test_device_memory_of_the_command_within_budget(operands, name, budget):
    held = device_memory_held(operands, name, budget, "cold")
    assert held <= parse_size(budget) + DEVICE_SLACK, f"{held / MiB:.0f} MiB"
