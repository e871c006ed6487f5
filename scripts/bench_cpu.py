"""CPU engine benchmark: out-of-core bigmm on HDF5 files against in-core numpy.matmul.

Writes A (M x K) and B (K x N) to contiguous HDF5 files, warms the page cache, then in one
process and with the same BLAS settings alternates

* in core:     numpy.matmul on A and B loaded in RAM, into a preallocated C;
* out of core: bigmm.matmul(a.h5:/A, b.h5:/B, out=c.h5:/C, memory=BUDGET, backend="numpy"),

checks the out-of-core C against the in-core one, and prints both throughputs, their ratio and
the time each pipeline stage was busy.

    python scripts/bench_cpu.py --size 8192 --memory 128MiB
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

import bigmm
from bigmm.backends.numpy import NumpyBackend
from bigmm.units import format_bytes, parse_size


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown"


def _blas_info() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    return "; ".join(f"{i.get('internal_api')} {i.get('version')} {i.get('num_threads')} threads "
                     f"({os.path.basename(i.get('filepath', ''))})"
                     for i in threadpool_info() if i.get("user_api") == "blas")


def _cpu() -> float:
    """CPU seconds (user + system) of this process so far, all threads."""
    t = os.times()
    return t.user + t.system


def _write(path: str, name: str, shape, dtype, seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = max(1, (64 << 20) // (shape[1] * np.dtype(dtype).itemsize))
    with h5py.File(path, "w") as f:
        d = f.create_dataset(name, shape=shape, dtype=dtype)
        for r0 in range(0, shape[0], rows):
            r1 = min(shape[0], r0 + rows)
            d[r0:r1] = rng.standard_normal((r1 - r0, shape[1]), dtype=np.float32).astype(dtype)


def _warm(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=8192, help="M = N = K (default 8192)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--memory", default="128MiB", help="bigmm memory budget (default 128MiB)")
    ap.add_argument("--repeat", type=int, default=2, help="alternating rounds (best kept)")
    ap.add_argument("--io-threads", type=int, default=None)
    ap.add_argument("--dir", default=None, help="folder for the HDF5 files (default: a temp dir)")
    ap.add_argument("--inputs", default="h5", choices=["h5", "array"],
                    help="bigmm reads A and B from the HDF5 files (default) or from the arrays "
                         "in RAM (isolates the executor from file reads)")
    ap.add_argument("--out", default="h5", choices=["h5", "array"],
                    help="bigmm writes C to an HDF5 file (default) or to an array in RAM")
    args = ap.parse_args(argv)

    n, dtype = args.size, np.dtype(args.dtype)
    budget = parse_size(args.memory)
    flops = 2.0 * n**3
    tmp = tempfile.TemporaryDirectory(dir=args.dir)
    pa, pb, pc = (os.path.join(tmp.name, f"{x}.h5") for x in "abc")
    _write(pa, "A", (n, n), dtype, 1)
    _write(pb, "B", (n, n), dtype, 2)
    for p in (pa, pb):
        _warm(p)
    in_bytes = 2 * n * n * dtype.itemsize
    plan = bigmm.plan(f"{pa}:/A", f"{pb}:/B", memory=budget, backend="numpy")
    print(f"cpu: {_cpu_model()} ({os.cpu_count()} logical CPUs)")
    print(f"blas: {_blas_info()}")
    print(f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    print(f"BLAS threads bigmm plans for: {NumpyBackend().gemm_threads()} (its gemm steps "
          f"cost more with more threads, so the plan takes fewer, larger ones)")
    print(f"job: {n}^3 {dtype.name}, inputs {format_bytes(in_bytes)} = "
          f"{in_bytes / budget:.1f}x the budget {format_bytes(budget)}")
    print(plan, "\n")

    with h5py.File(pa, "r") as f:
        a = f["A"][...]
    with h5py.File(pb, "r") as f:
        b = f["B"][...]
    c_ref = np.empty((n, n), dtype)
    np.matmul(a[:256], b[:, :256], out=c_ref[:256, :256])  # warm-up of the BLAS threads

    print(f"load average before: {os.getloadavg()[0]:.2f}")
    c_out = np.full((n, n), np.nan, dtype) if args.out == "array" else None
    target = c_out if args.out == "array" else f"{pc}:/C"
    ins = (a, b) if args.inputs == "array" else (f"{pa}:/A", f"{pb}:/B")
    best_in, best_out, best_stats = float("inf"), float("inf"), None
    cpu_in = cpu_out = float("inf")
    for r in range(args.repeat):
        t0, u0 = time.perf_counter(), _cpu()
        np.matmul(a, b, out=c_ref)
        t_in, u_in = time.perf_counter() - t0, _cpu() - u0
        t0, u0 = time.perf_counter(), _cpu()
        _, stats = bigmm.matmul(*ins, target, memory=budget,
                                backend="numpy", overwrite=True, stats=True,
                                io_threads=args.io_threads)
        t_out, u_out = time.perf_counter() - t0, _cpu() - u0
        print(f"round {r + 1}: in-core {flops / t_in / 1e9:6.1f} GFLOP/s ({t_in:.2f} s, cpu "
              f"{u_in:.2f} s), bigmm {flops / t_out / 1e9:6.1f} GFLOP/s ({t_out:.2f} s, cpu "
              f"{u_out:.2f} s)")
        best_in, cpu_in, cpu_out = min(best_in, t_in), min(cpu_in, u_in), min(cpu_out, u_out)
        if t_out < best_out:
            best_out, best_stats = t_out, stats

    if c_out is None:
        with h5py.File(pc, "r") as f:
            c_out = f["C"][...]
    c = c_out
    err = float(np.linalg.norm((c - c_ref).astype(np.float64)) /
                np.linalg.norm(c_ref.astype(np.float64)))
    tol = float(np.finfo(dtype).eps * 8 * np.sqrt(n))
    print(f"\ncheck: relative difference to in-core C {err:.2e} (tolerance {tol:.2e})")
    print(f"in-core numpy.matmul  {flops / best_in / 1e9:7.1f} GFLOP/s  ({best_in:.2f} s)")
    print(f"out-of-core bigmm     {flops / best_out / 1e9:7.1f} GFLOP/s  ({best_out:.2f} s)")
    print(f"ratio                 {best_in / best_out:7.1%}  (target >= 85%)")
    print(f"cpu seconds           in-core {cpu_in:.2f}, bigmm {cpu_out:.2f}: ratio "
          f"{cpu_in / cpu_out:.1%} (the wall ratio on an otherwise idle machine)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    s = best_stats
    print(f"read {format_bytes(s.bytes_read)}, wrote {format_bytes(s.bytes_written)}")
    for stage, busy in s.busy.items():
        print(f"  {stage:<9} busy {busy:7.2f} s  ({busy / s.seconds:6.1%} of {s.seconds:.2f} s)")
    tmp.cleanup()
    return 0 if err <= tol else 1


if __name__ == "__main__":
    sys.exit(main())
