#!/usr/bin/env python3
"""Autotune the tile table of bigmm's GEMM kernels (bigmm/backends/kernel_table.json).

Times every candidate tile config of each dtype (those in the current table that the GPU can
run: the sm_90a wgmma configs on compute capability 9.0 only, whose rules go under
"<precision>@sm_90a") on products of
growing output size (M = N = s, K = max(s, 2048)), each result checked against cuBLAS first,
and writes a table whose rules pick, for each M*N bucket, the fastest config.  Run on the GPU
the table is for:

    CUPY_TF32=0 PYTHONPATH=. python scripts/autotune_kernels.py --out bigmm/backends/kernel_table.json
"""

from __future__ import annotations

import os

os.environ.setdefault("CUPY_TF32", "0")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_kernels import device_info, operands, rel_diff, reps_for, time_interleaved  # noqa: E402

from bigmm.backends import cuda_kernels as ck  # noqa: E402
from bigmm.backends import kernel_configs as kc  # noqa: E402

SIZES = (256, 512, 1024, 2048, 4096, 8192)


def tune(precision: str, sizes=SIZES, table=None) -> tuple[list[dict], list[dict]]:
    """(timings, rules) for one precision: "float32", "float64" (the dtypes' own), "tf32x3" or
    "tf32" (float32 operands on the TF32 tensor cores)."""
    import cupy as cp

    dtype = "float64" if precision == "float64" else "float32"
    tol = {"float64": 1e-13, "tf32": 3e-3}.get(precision, 1e-5)  # against cuBLAS, same dtype
    # the configs this device can run (the sm_90a wgmma configs only on compute capability 9.0)
    configs = ck._runnable(ck.tile_configs(dtype, table, precision=precision).values())
    timings, best = [], []
    for s in sizes:
        k = max(s, 2048)
        a, b, c0 = operands(dtype, s, s, k)
        ref = cp.matmul(a, b)
        flops = 2.0 * s * s * k
        reps = reps_for(flops, 30e12)
        row = {"dtype": dtype, "precision": precision, "m": s, "n": s, "k": k, "configs": {}}
        fns = {}
        for cfg in configs:
            c = cp.full((s, s), cp.nan, dtype=dtype)
            ck.gemm(a, b, c, config=cfg, precision=precision)
            row["configs"][cfg.name] = None  # failed the check: never chosen
            if rel_diff(c, ref) <= tol:
                fns[cfg.name] = (lambda cfg, c: lambda: ck.gemm(a, b, c, config=cfg,
                                                               precision=precision))(cfg, c)
        # interleaved rounds: clock changes during the tuning move every candidate alike
        ms = time_interleaved([lambda: cp.matmul(a, b, out=c0)] + list(fns.values()), reps)
        t_blas = row["cublas_ms"] = ms[0]
        row["configs"].update(zip(fns, ms[1:]))
        ok = {n: t for n, t in row["configs"].items() if t}
        row["best"] = min(ok, key=ok.get)
        timings.append(row)
        best.append((s * s, row["best"]))
        print(f"{dtype} {s}x{s}x{k}: cuBLAS {flops / t_blas / 1e9:.1f} TFLOP/s; "
              + ", ".join(f"{n} {flops / t / 1e9:.1f}" for n, t in ok.items()) + f" -> {row['best']}", flush=True)
        a = b = c0 = c = ref = None
        cp.get_default_memory_pool().free_all_blocks()
    rules = []
    for i, (mn, name) in enumerate(best):
        last = i == len(best) - 1
        if rules and rules[-1]["config"] == name:
            rules[-1]["max_mn"] = None if last else mn
        else:
            rules.append({"max_mn": None if last else mn, "config": name})
    # bucket edges halfway (geometrically) between tuned sizes
    for r, nxt in zip(rules, rules[1:]):
        if r["max_mn"] is not None:
            r["max_mn"] = int(r["max_mn"] * 2)
    return timings, rules


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="where to write the new table")
    ap.add_argument("--table", help="table holding the candidate configs (default: the packaged one)")
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"],
                    help="precisions to tune (float32, float64, tf32x3, tf32); the others keep "
                         "the source table's rules")
    args = ap.parse_args(argv)

    src = json.loads(Path(args.table or kc._TABLE_PATH).read_text())
    dev = device_info()
    new = {"about": src["about"], "device": dev["name"],
           "command": "CUPY_TF32=0 PYTHONPATH=. python scripts/autotune_kernels.py " + " ".join(argv or sys.argv[1:]),
           "configs": src["configs"], "select": dict(src["select"]),
           "timings": dict(src.get("timings", {}))}
    arch = ck.device_arch()
    for dtype in args.dtypes:
        timings, rules = tune(dtype, args.sizes, args.table)
        # rules that may pick an arch-specific config go under "<precision>@<arch>": devices
        # without that target keep the plain rules
        cfgs = ck.tile_configs(table=args.table)
        key = f"{dtype}@{arch}" if arch and any(cfgs[r["config"]].arch for r in rules) else dtype
        new["select"][key] = rules
        new["timings"][key] = timings
    Path(args.out).write_text(json.dumps(new, indent=1) + "\n")
    print(f"wrote {args.out}: {json.dumps(new['select'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
