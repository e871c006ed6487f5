#!/usr/bin/env python3
"""Interleaved rounds: bigmm's plans (its own, or tiles forced) against cuBLASXt, host arrays.

One n x n float32 product from NumPy arrays in page-locked memory (and, for the variants marked
pageable, from ordinary copies of them), with a device budget of ``--memory``. Every variant
runs once to warm up; then ``--rounds`` rounds run each variant once, in alternating order (the
even rounds forwards, the odd ones backwards), so that drifts of the machine fall on all of
them alike. Each product is checked at 16 random rows x 64 columns against float64 (NaN
written there first). Prints, per variant, the best and the median seconds, TFLOP/s at the best
and the plan; writes ``bench_rounds.json`` into ``--out``.

Variants (``--variants``, comma-separated):
  ``cublas`` / ``bigmm``          the planner's own plan with that kernel, pinned arrays
  ``cublas:BMxBNxBK:ORDER``       tiles and loop order forced (e.g. ``cublas:8192x8192x32768:stream``)
  ``pageable-cublas``, ``pageable-bigmm``   the own plan from pageable arrays
  ``xt:BLOCK``                    cuBLASXt from the pinned arrays with that block dimension

    PYTHONPATH=. python scripts/bench_rounds.py --n 32768 --memory 8GiB --rounds 4 \\
        --variants cublas,cublas:8192x8192x32768:stream,xt:8192,bigmm,pageable-bigmm
"""

from __future__ import annotations

import os

os.environ.setdefault("CUPY_TF32", "0")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cublasxt import CublasXt, pinned_empty  # noqa: E402

import bigmm  # noqa: E402
from bigmm.backends import get_backend  # noqa: E402
from bigmm.executor import execute  # noqa: E402
from bigmm import io  # noqa: E402
from bigmm.planner import make_plan  # noqa: E402


def _variant(spec: str, arrays: dict, memory: str):
    """(label, run() -> seconds, plan text) for one variant spec."""
    if spec.startswith("xt:"):
        xt = CublasXt(block_dim=int(spec[3:]))
        small = np.ones((512, 512), np.float32)
        xt.gemm(small, small, np.empty_like(small))
        a, b, c = arrays["pinned"]

        def run_xt() -> float:
            t0 = time.perf_counter()
            xt.gemm(a, b, c)
            return time.perf_counter() - t0
        return spec, run_xt, "", c
    pageable = spec.startswith("pageable-")
    kernel, _, rest = spec.removeprefix("pageable-").partition(":")
    a, b, c = arrays["pageable" if pageable else "pinned"]
    kw = dict(memory=memory, backend="cupy", kernel=kernel)
    if not rest:
        p = bigmm.plan(a, b, c, **kw)

        def run_own() -> float:
            t0 = time.perf_counter()
            bigmm.matmul(a, b, c, overwrite=True, **kw)
            return time.perf_counter() - t0
        return spec, run_own, f"{p.order} {p.bm}x{p.bn}x{p.bk}", c
    tile, order = rest.split(":")
    bm, bn, bk = (int(x) for x in tile.split("x"))
    base = bigmm.plan(a, b, c, **kw)
    p = make_plan(a.shape[0], b.shape[1], a.shape[1], "float32", staging=True,
                  device_budget=base.device_budget, host_budget=base.host_budget,
                  tile=(bm, bn, bk), order=order)

    def run_forced() -> float:  # what matmul does, with the plan given
        t0 = time.perf_counter()
        be = get_backend("cupy", kernel=kernel)
        A, B = io.open_input(a, name="A"), io.open_input(b, name="B")
        sink = io.open_output(c, shape=c.shape, dtype=c.dtype, inputs=[A, B], job={},
                              overwrite=True)
        try:
            execute(p, A, B, sink, be)
        finally:
            for x in (sink, A, B):
                x.close()
            be.close()
        return time.perf_counter() - t0
    return spec, run_forced, f"{p.order} {p.bm}x{p.bn}x{p.bk} (forced)", c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=32768)
    ap.add_argument("--memory", default="8GiB")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--variants", default="cublas,xt:8192,bigmm,pageable-bigmm")
    ap.add_argument("--out", default="bench-out/results")
    args = ap.parse_args()
    n = args.n
    rng = np.random.default_rng(0)
    a, b, c = (pinned_empty((n, n)) for _ in range(3))
    for x in (a, b):
        for r in range(0, n, 4096):
            x[r:r + 4096] = rng.standard_normal((min(4096, n - r), n), dtype=np.float32)
    arrays = {"pinned": (a, b, c)}
    specs = args.variants.split(",")
    if any(s.startswith("pageable-") for s in specs):
        arrays["pageable"] = (np.array(a), np.array(b), np.empty((n, n), np.float32))
    variants = [_variant(s, arrays, args.memory) for s in specs]
    for _, run, _, _ in variants:
        run()  # warm-up
    probe = rng.integers(0, n, 16)
    ref = a[probe].astype(np.float64) @ b[:, :64].astype(np.float64)
    times: dict[str, list[float]] = {label: [] for label, *_ in variants}
    for r in range(args.rounds):
        for label, run, _, out in (variants if r % 2 == 0 else variants[::-1]):
            out[probe, :64] = np.nan
            times[label].append(run())
            err = np.abs(out[probe, :64] - ref).max() / np.abs(ref).max()
            if not err < 1e-4:
                raise SystemExit(f"{label}: relative error {err:.3g} at the probes")
    import cupy

    device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_rounds.json"), "w") as f:
        json.dump({"n": n, "memory": args.memory, "rounds": args.rounds, "device": device,
                   "times": times, "plans": {label: plan for label, _, plan, _ in variants}},
                  f, indent=1)
    print(f"== bench_rounds n={n} float32, device budget {args.memory}, {device}, "
          f"{args.rounds} rounds")
    print(f"{'variant':34s} {'best s':>7s} {'median':>7s} {'TFLOP/s':>8s}  plan")
    for label, _, plan, _ in variants:
        v = times[label]
        print(f"{label:34s} {min(v):7.3f} {np.median(v):7.3f} {2 * n**3 / min(v) / 1e12:8.1f}"
              f"  {plan}")


if __name__ == "__main__":
    main()
