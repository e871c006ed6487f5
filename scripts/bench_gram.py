#!/usr/bin/env python3
"""Gram products on the GPU: ``bigmm.gram`` against bigmm's general product of the same
operands and cuBLASXt ``cublasXtSsyrk``, for a tall-skinny float32 A (default 2,000,000 x
4096, 32 GiB) in page-locked host memory, C = A^T A (4096 x 4096) on the device.

Parts (``--parts``):

* ``kernels``: one diagonal-tile step, C (n x n) += P^T P for a K panel P of the plan's depth,
  on device arrays with CUDA events (median of ``--kernel-repeats`` interleaved rounds after a
  warm-up): cuBLAS ``ssyrk``, the upper sub-blocks by bigmm's own gemm kernel (what the
  backend's ``syrk_mode`` chooses between), and the whole gemm with bigmm's kernel and with
  cuBLAS, for the flops each reaches; and the one launch of bigmm's kernel over the tiles on
  and above the diagonal ("triangle").
* ``e2e``: whole products from the host array into a NumPy C poisoned with NaN, in interleaved
  rounds (``--repeats``): ``bigmm.gram`` (the backend's default syrk mode, cuBLAS syrk, and
  optionally sub-block gemms or the 2 x 2 split), bigmm's
  general product of the same operands (``matmul(a, a, trans_a=True, gram=False)``), and
  cuBLASXt ``cublasXtSsyrk`` from the same page-locked array (upper triangle only; block
  dimension ``--xt-block``). Host clock around each call (each returns once C is on the
  host); the median counts.
* ``h5``: A written to an HDF5 file under ``--dir`` once, then ``bigmm.gram`` from the file
  (warm page cache unless the file is larger than the free memory) (optional: writing it
  takes a minute or more at 32 GiB).

Every product is checked before its time counts: a float64 Freivalds probe, C X against
A^T (A X) for two random float64 vectors X (all in float64 on the host's threads, in row
blocks), relative error within ``tolerance(float32, rows)``. A is generated in host memory
with several threads (standard normal, seeded by block). Writes ``bench_gram.json`` under
``--out`` and prints a table last.

    PYTHONPATH=. python scripts/bench_gram.py --rows 500000 --out /tmp/g   # a quick run
"""

from __future__ import annotations

import os

os.environ.setdefault("CUPY_TF32", "0")

import argparse  # noqa: E402
import concurrent.futures as cf  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import bigmm  # noqa: E402
from bigmm.testing import tolerance  # noqa: E402

BLOCK_ROWS = 1 << 16  # rows per generation and probe block


def generate(a: np.ndarray, threads: int, seed: int = 0) -> None:
    """Fill ``a`` with standard normal float32, block by block on ``threads`` threads."""
    def fill(i: int) -> None:
        r0 = i * BLOCK_ROWS
        rng = np.random.default_rng([seed, i])
        rng.standard_normal(out=a[r0:r0 + BLOCK_ROWS], dtype=np.float32)

    with cf.ThreadPoolExecutor(threads) as pool:
        list(pool.map(fill, range(-(-a.shape[0] // BLOCK_ROWS))))


def probe(a: np.ndarray, x: np.ndarray, threads: int) -> np.ndarray:
    """A^T (A x) in float64, in row blocks on ``threads`` threads."""
    def part(i: int) -> np.ndarray:
        blk = a[i * BLOCK_ROWS:(i + 1) * BLOCK_ROWS].astype(np.float64)
        return blk.T @ (blk @ x)

    with cf.ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(part, range(-(-a.shape[0] // BLOCK_ROWS))))


def check(c: np.ndarray, x: np.ndarray, ref: np.ndarray, bound: float) -> float:
    """Relative error of C x against the reference; AssertionError past ``bound``."""
    err = float(np.linalg.norm(c.astype(np.float64) @ x - ref) / np.linalg.norm(ref))
    if not np.isfinite(err) or err > bound:
        raise AssertionError(f"product check failed: relative error {err:.3g} > {bound:.3g}")
    return err


def kernels(n: int, depth: int, repeats: int) -> dict:
    """One diagonal step's update by each way, CUDA events, median seconds and TFLOP/s."""
    import cupy

    from bigmm.backends.cupy import CupyBackend

    be = CupyBackend(kernel="bigmm")
    cub = CupyBackend(kernel="cublas")
    p = cupy.random.standard_normal((depth, n), dtype=cupy.float32)
    c = cupy.zeros((n, n), cupy.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    ways = {
        "syrk cublas": (lambda: _mode(be, "cublas").syrk(p, c, 1.0, 1.0, True, s), n * (n + 1)),
        "syrk blocks (bigmm gemm)": (lambda: _mode(be, "blocks").syrk(p, c, 1.0, 1.0, True, s),
                                     n * (n + 1)),
        "syrk split (2x2: cuBLAS syrk, bigmm gemm)": (
            lambda: _mode(be, "split").syrk(p, c, 1.0, 1.0, True, s), n * (n + 1)),
        "syrk triangle (bigmm gemm, upper tiles)": (
            lambda: _mode(be, "triangle").syrk(p, c, 1.0, 1.0, True, s), n * (n + 1)),
        "gemm bigmm (whole)": (lambda: be.gemm(p, p, c, 1.0, 1.0, True, False, s), 2 * n * n),
        "gemm cublas (whole)": (lambda: cub.gemm(p, p, c, 1.0, 1.0, True, False, s), 2 * n * n),
    }
    times: dict[str, list] = {k: [] for k in ways}
    for rnd in range(repeats + 1):
        for name, (fn, _) in ways.items():
            e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
            e0.record(s)
            fn()
            e1.record(s)
            e1.synchronize()
            if rnd:  # the first round warms up
                times[name].append(cupy.cuda.get_elapsed_time(e0, e1) / 1e3)
    out = {}
    for name, (_, per_depth) in ways.items():
        t = statistics.median(times[name])
        out[name] = {"seconds": t, "tflops_done": per_depth * depth / t / 1e12,
                     "tflops_equivalent": 2 * n * n * depth / t / 1e12}
    be.syrk_mode = "cublas"
    be.close()
    cub.close()
    return out


def _mode(be, mode: str):
    be.syrk_mode = mode
    return be


def e2e(a: np.ndarray, x, ref, bound: float, repeats: int, xt_block: int, memory, parts):
    """Interleaved rounds of each way of computing C = A^T A; median seconds."""
    from bigmm.backends.cupy import CupyBackend

    n = a.shape[1]
    runs = {}

    def timed(fn):
        def run(c):
            t0 = time.perf_counter()
            st = fn(c)
            return time.perf_counter() - t0, st
        return run

    def gram(mode: str):
        def run(c):
            old = CupyBackend.syrk_mode
            CupyBackend.syrk_mode = mode
            try:
                return bigmm.gram(a, c, memory=memory, stats=True)[1]
            finally:
                CupyBackend.syrk_mode = old
        return timed(run)

    runs["bigmm.gram (default)"] = gram(None)
    runs["bigmm.gram (cuBLAS syrk)"] = gram("cublas")
    if "blocks" in parts:
        runs["bigmm.gram (sub-block gemms)"] = gram("blocks")
    if "split" in parts:
        runs["bigmm.gram (split 2x2)"] = gram("split")
    runs["bigmm.matmul general"] = timed(
        lambda c: bigmm.matmul(a, a, c, trans_a=True, gram=False, memory=memory,
                               stats=True)[1])
    xt = None
    if "xt" in parts:
        from cublasxt import CublasXt

        xt = CublasXt(block_dim=xt_block)
        small = np.ones((1024, 256), np.float32)
        xt.syrk(small, np.empty((256, 256), np.float32))  # warm-up: handle, streams

        def run_xt(c):
            t0 = time.perf_counter()
            xt.syrk(a, c)
            dt = time.perf_counter() - t0
            c[...] = np.triu(c) + np.triu(c, 1).T  # not timed: the probe reads all of C
            return dt, None

        runs["cuBLASXt ssyrk (pinned)"] = run_xt
    res = {name: {"seconds": [], "errors": []} for name in runs}
    c = np.empty((n, n), np.float32)
    warm = a[:min(len(a), 1 << 16)]  # calibration, handles, kernels: not timed
    bigmm.gram(warm, c, memory=memory)
    bigmm.matmul(warm, warm, c, trans_a=True, gram=False, memory=memory)
    names = list(runs)
    for rnd in range(repeats):  # each round starts one way later: none always runs first
        for name in names[rnd % len(names):] + names[:rnd % len(names)]:
            run = runs[name]
            c.fill(np.nan)
            dt, st = run(c)
            res[name]["errors"].append(check(c, x, ref, bound))
            res[name]["seconds"].append(dt)
            if st is not None:
                res[name]["stats"] = {"bytes_read": st.bytes_read, "flops": st.flops,
                                      "tiles": st.tiles_done}
            print(f"  {name}: {dt:.3f} s, error {res[name]['errors'][-1]:.2e}", flush=True)
    if xt is not None:
        xt.close()
    for name, r in res.items():
        r["median"] = statistics.median(r["seconds"])
    plan = bigmm.plan(a, a, trans_a=True, memory=memory)
    general = bigmm.plan(a, a, trans_a=True, gram=False, memory=memory)
    return res, {"gram": str(plan), "general": str(general),
                 "gram_predicted": plan.predicted_seconds,
                 "general_predicted": general.predicted_seconds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--parts", default="kernels,e2e,xt,split",
                    help="comma-separated: kernels, e2e, xt, blocks, split, h5")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kernel-repeats", type=int, default=10)
    ap.add_argument("--xt-block", type=int, default=4096)
    ap.add_argument("--memory", default=None, help="bigmm's device budget (default: its own)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--dir", default="/tmp", help="where --parts h5 writes A")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"rows": args.rows, "cols": args.cols, "date": time.strftime("%Y-%m-%d")}
    import cupy

    res["device"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    m, n = args.rows, args.cols
    if "kernels" in parts:
        plan = bigmm.planner.make_plan(n, n, m, "float32", trans_a=True, device_budget=8 << 30,
                                       symmetric=True)
        res["kernels"] = kernels(n, plan.bk, args.kernel_repeats)
        res["kernel_depth"] = plan.bk
        for name, r in res["kernels"].items():
            print(f"{name}: {r['seconds'] * 1e3:.2f} ms, {r['tflops_done']:.1f} TFLOP/s done, "
                  f"{r['tflops_equivalent']:.1f} general-equivalent", flush=True)
    t0 = time.perf_counter()
    from cublasxt import pinned_empty

    a = pinned_empty((m, n), np.float32)
    res["pin_seconds"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    generate(a, args.threads)
    res["generate_seconds"] = time.perf_counter() - t0
    x = np.random.default_rng(99).standard_normal((n, 2))
    t0 = time.perf_counter()
    ref = probe(a, x, args.threads)
    res["probe_seconds"] = time.perf_counter() - t0
    bound = tolerance(np.float32, m)
    print(f"A {m} x {n} float32 pinned in {res['pin_seconds']:.1f} s, generated in "
          f"{res['generate_seconds']:.1f} s, probe reference in {res['probe_seconds']:.1f} s",
          flush=True)
    if "e2e" in parts:
        res["e2e"], res["plans"] = e2e(a, x, ref, bound, args.repeats, args.xt_block,
                                       args.memory, parts)
        print(res["plans"]["gram"], flush=True)
    if "h5" in parts:
        import h5py

        path = Path(args.dir) / "bench_gram_a.h5"
        t0 = time.perf_counter()
        with h5py.File(path, "w") as f:
            f.create_dataset("A", data=a)
        res["h5_write_seconds"] = time.perf_counter() - t0
        c = np.full((n, n), np.nan, np.float32)
        times = []
        for _ in range(args.repeats):
            c.fill(np.nan)
            t0 = time.perf_counter()
            bigmm.gram(f"{path}:/A", c, memory=args.memory)
            times.append(time.perf_counter() - t0)
            check(c, x, ref, bound)
        res["h5"] = {"seconds": times, "median": statistics.median(times)}
        path.unlink()
    (out / "bench_gram.json").write_text(json.dumps(res, indent=2, default=str))
    print(f"\nC = A^T A, A {m} x {n} float32 ({a.nbytes / 2**30:.1f} GiB, page-locked), "
          f"{res['device']}, {res['date']}")
    flops = 2 * n * n * m
    if "e2e" in res:
        base = res["e2e"]["bigmm.gram (default)"]["median"]
        print(f"{'way':<32} {'median s':>9} {'eq. TFLOP/s':>12} {'vs gram':>8}  runs")
        for name, r in res["e2e"].items():
            print(f"{name:<32} {r['median']:>9.3f} {flops / r['median'] / 1e12:>12.1f} "
                  f"{r['median'] / base:>7.2f}x  "
                  + ", ".join(f"{s:.3f}" for s in r["seconds"]))
    if "h5" in res:
        print(f"{'bigmm.gram from HDF5':<32} {res['h5']['median']:>9.3f} "
              f"{flops / res['h5']['median'] / 1e12:>12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
