#!/usr/bin/env python3
"""Benchmark bigmm's CUDA GEMM kernels against cuBLAS, side by side in one process.

For each shape and dtype: cuBLAS (cupy.matmul, TF32 off; cupy.cublas.gemm where beta = 1)
and bigmm's kernel (the table's config, plus --variants), each result checked against cuBLAS
before it is timed; CUDA events after warm-up, median of repeats; TFLOP/s = 2*M*N*K/t.
Also measures the FP32 and FP64 FMA ceilings (kernels/peak_fma.cu) and the progression of
kernels/README.md (kernel 01 and the register-blocked steps) at 4096^3 and 8192^3.

Writes bench_kernels.json (and bench_kernels.png when matplotlib is there) under --out and
prints a short table last.

    CUPY_TF32=0 PYTHONPATH=. python scripts/bench_kernels.py --out results [--quick]

With --tf32: the precisions section instead (float32 operands): cuBLAS SGEMM, cuBLAS in TF32
mode (compute type TF32), bigmm float32, 3xTF32 and TF32 (the table's configs, or every config
of each precision with --variants), interleaved in one process, each with its relative error
against a float64 reference (cuBLAS DGEMM on the upcast operands) printed beside its speed;
writes bench_precisions.json (and bench_precisions.png when matplotlib is there):

    CUPY_TF32=0 PYTHONPATH=. python scripts/bench_kernels.py --tf32 --out results [--variants]
"""

from __future__ import annotations

import os

os.environ.setdefault("CUPY_TF32", "0")  # before cupy is imported anywhere

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from bigmm.backends import cuda_kernels as ck  # noqa: E402

# (label, M, N, K, beta): squares, the planner's panels, tall-skinny.
SHAPES = {
    "float32": [
        ("square", 2048, 2048, 2048, 0.0),
        ("square", 4096, 4096, 4096, 0.0),
        ("square", 8192, 8192, 8192, 0.0),
        ("square", 16384, 16384, 16384, 0.0),
        ("panel", 16384, 16384, 2048, 0.0),
        ("panel+acc", 8192, 8192, 4096, 1.0),
        ("panel+acc", 16384, 16384, 4096, 1.0),
        ("tall-skinny", 65536, 256, 4096, 0.0),
        ("skinny-K", 1024, 1024, 65536, 0.0),
    ],
    "float64": [
        ("square", 2048, 2048, 2048, 0.0),
        ("square", 4096, 4096, 4096, 0.0),
        ("square", 8192, 8192, 8192, 0.0),
        ("panel", 16384, 16384, 2048, 0.0),
        ("panel+acc", 8192, 8192, 4096, 1.0),
        ("tall-skinny", 65536, 256, 4096, 0.0),
    ],
}
QUICK = {"float32": [SHAPES["float32"][2], SHAPES["float32"][4], SHAPES["float32"][5]],
         "float64": [SHAPES["float64"][2], SHAPES["float64"][4]]}

# Progression steps (kernels/README.md): each a TileConfig of the register-blocked family.
PROGRESSION = [
    ck.TileConfig("02_regblock_64x64_t8x4_2stage", "float32", 64, 64, 16, 32, 32, 8, 4, 2, 4),
    ck.TileConfig("03_128x128_t8x8_2stage_nopad", "float32", 128, 128, 16, 32, 64, 8, 8, 2, 2, 0),
    ck.TileConfig("04_128x128_t8x8_2stage", "float32", 128, 128, 16, 32, 64, 8, 8, 2, 2),
    ck.TileConfig("05_128x128_t8x8_3stage", "float32", 128, 128, 16, 32, 64, 8, 8, 3, 2),
    ck.TileConfig("06_128x128_t8x8_4stage", "float32", 128, 128, 16, 32, 64, 8, 8, 4, 2),
    ck.TileConfig("07_128x256_t8x16_3stage", "float32", 128, 256, 16, 64, 64, 8, 16, 3, 1),
]


def cupy_module():
    import cupy

    return cupy


def time_ms(fn, reps: int, warmup: int = 2) -> float:
    """Median milliseconds of fn() over reps runs, CUDA events, after warmup runs."""
    cp = cupy_module()
    for _ in range(warmup):
        fn()
    times = []
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(reps):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


def time_interleaved(fns, reps: int, warmup: int = 2) -> list[float]:
    """Median milliseconds of each fn over reps rounds that run every fn once, in turn (CUDA
    events, after warmup runs of each): a change in the GPU's clocks during the measurement
    then moves every fn alike, so their ratios hold."""
    cp = cupy_module()
    for fn in fns:
        for _ in range(warmup):
            fn()
    times = [[] for _ in fns]
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(reps):
        for fn, t in zip(fns, times):
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            t.append(cp.cuda.get_elapsed_time(start, stop))
    return [float(np.median(t)) for t in times]


def reps_for(flops: float, rate: float = 40e12, budget_s: float = 0.4) -> int:
    return int(min(20, max(3, budget_s / (flops / rate))))


def check_tf32_off() -> str:
    """cupy's compute type for float32 matmul; raises when it is TF32."""
    try:
        from cupy._core import _routines_linalg as rl

        ct = rl.get_compute_type(np.dtype(np.float32))
        name = {getattr(rl, n): n for n in dir(rl) if n.startswith("COMPUTE_TYPE_")}.get(ct, str(ct))
    except Exception as exc:  # internal API moved: report, do not fail
        return f"unknown ({exc.__class__.__name__})"
    if "TF32" in name:
        raise SystemExit(f"cupy float32 matmul uses {name}; set CUPY_TF32=0")
    return name


def device_info() -> dict:
    cp = cupy_module()
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())
    return {
        "name": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
        "sm_count": props["multiProcessorCount"],
        "cc": f"{props['major']}.{props['minor']}",
        "clock_mhz": props.get("clockRate", 0) // 1000,
        "cupy": cp.__version__,
        "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
    }


def peak_fma(dtype: str) -> float:
    """Measured ceiling, TFLOP/s (kernels/peak_fma.cu): FMA for "float32" and "float64", the
    FP64 tensor cores for "float64_dmma"."""
    cp = cupy_module()
    entry = {"float32": "peak_fma_f32", "float64": "peak_fma_f64",
             "float64_dmma": "peak_dmma_f64"}[dtype]
    dtype = dtype.split("_")[0]
    kern = ck.raw_kernel("peak_fma.cu", entry)
    sms = device_info()["sm_count"]
    blocks, threads, iters = sms * 16, 256, 4096
    out = cp.empty(blocks * threads, dtype=dtype)
    t = np.dtype(dtype).type
    ms = time_ms(lambda: kern((blocks,), (threads,), (out, np.int32(iters), t(0.999), t(1e-3))), 5)
    per_thread = 2 * 8 * 8 * iters  # 8 chains x 8 steps x iters FMAs
    if entry == "peak_dmma_f64":
        per_thread = 2 * 16 * 8 * 4 * 8 * 8 * iters // 32  # 16x8x4 products, per warp
    return per_thread * blocks * threads / (ms * 1e-3) / 1e12


def operands(dtype, m, n, k, seed=0):
    cp = cupy_module()
    rng = cp.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=dtype)
    b = rng.standard_normal((k, n), dtype=dtype)
    c0 = rng.standard_normal((m, n), dtype=dtype)
    return a, b, c0


def cublas_fn(a, b, c, beta):
    cp = cupy_module()
    if beta == 0:
        return lambda: cp.matmul(a, b, out=c)
    from cupy import cublas

    return lambda: cublas.gemm("N", "N", a, b, out=c, alpha=1.0, beta=beta)


def rel_diff(x, ref) -> float:
    cp = cupy_module()
    x64, r64 = x.astype(cp.float64), ref.astype(cp.float64)
    if not bool(cp.isfinite(x64).all()):
        return float("inf")
    return float(cp.linalg.norm(x64 - r64) / cp.linalg.norm(r64))


def run_shape(dtype, label, m, n, k, beta, configs, table=None):
    """Check then time cuBLAS and each config on one shape; returns result rows."""
    cp = cupy_module()
    a, b, c0 = operands(dtype, m, n, k)
    flops = 2.0 * m * n * k
    reps = reps_for(flops, 40e12 if dtype == "float32" else 25e12)
    c_ref = c0.copy()
    cublas_fn(a, b, c_ref, beta)()  # one product for the check
    chosen = ck.select_config(dtype, m, n, k, table)
    tol = 1e-5 if dtype == "float32" else 1e-13
    rows, fns = [], []
    for cfg in configs:
        c = c0.copy()
        ck.gemm(a, b, c, 1.0, beta, config=cfg)
        err = rel_diff(c, c_ref)
        row = {"dtype": dtype, "shape": label, "m": m, "n": n, "k": k, "beta": beta,
               "kernel": cfg.name + (" *" if cfg.name == chosen.name else ""), "check": err}
        if err <= tol * max(1.0, np.sqrt(k / 1024)):
            fns.append((row, (lambda cfg, c: lambda: ck.gemm(a, b, c, 1.0, beta, config=cfg))(cfg, c)))
        else:
            row.update(ms=None, tflops=None, pct_cublas=None, error="CHECK FAILED")
        rows.append(row)
    c = c0.copy()  # cuBLAS accumulates into its own c: timing only
    ms = time_interleaved([cublas_fn(a, b, c, beta)] + [fn for _, fn in fns], reps)
    t_blas = ms[0]
    for (row, _), t in zip(fns, ms[1:]):
        row.update(ms=t, tflops=flops / t / 1e9, pct_cublas=100.0 * t_blas / t)
    rows.insert(0, {"dtype": dtype, "shape": label, "m": m, "n": n, "k": k, "beta": beta,
                    "kernel": "cuBLAS", "ms": t_blas, "tflops": flops / t_blas / 1e9,
                    "pct_cublas": 100.0, "check": 0.0})
    a = b = c0 = c = c_ref = None
    cp.get_default_memory_pool().free_all_blocks()
    return rows


def correctness_sweep(configs) -> list[dict]:
    """Odd shapes, all transposes and views, each config vs a float64 reference."""
    cp = cupy_module()
    out = []
    for cfg in configs:
        for (m, n, k) in ((1000, 1027, 333), (129, 4097, 7)):
            for ta in (False, True):
                for tb in (False, True):
                    a = cp.random.standard_normal((k, m) if ta else (m, k)).astype(cfg.dtype)
                    b = cp.random.standard_normal((n, k) if tb else (k, n)).astype(cfg.dtype)
                    big = cp.full((m + 1, n + 3), cp.nan, dtype=cfg.dtype)
                    c = big[1:, 1 : n + 1]  # unaligned view: scalar stores
                    ck.gemm(a, b, c, 1.0, 0.0, ta, tb, config=cfg)
                    ref = (a.astype(cp.float64).T if ta else a.astype(cp.float64)) @ (
                        b.astype(cp.float64).T if tb else b.astype(cp.float64))
                    err = rel_diff(c, ref)
                    eps = float(np.finfo(cfg.dtype).eps)
                    out.append({"config": cfg.name, "m": m, "n": n, "k": k, "ta": ta, "tb": tb,
                                "err": err, "ok": bool(err < 8 * eps * np.sqrt(k))})
    return out


def progression(sizes=(4096, 8192)) -> list[dict]:
    cp = cupy_module()
    rows = []
    for s in sizes:
        a, b, c0 = operands("float32", s, s, s)
        flops = 2.0 * s**3
        reps = reps_for(flops, 20e12)
        c_ref = cp.matmul(a, b)
        t_blas = time_ms(lambda: cp.matmul(a, b, out=c0), reps)
        steps = [("01_naive_tiled_16x16", lambda c: ck.baseline_gemm(a, b, c))]
        steps += [(cfg.name, (lambda cfg: lambda c: ck.gemm(a, b, c, config=cfg))(cfg)) for cfg in PROGRESSION]
        rows.append({"step": "cuBLAS", "n": s, "ms": t_blas, "tflops": flops / t_blas / 1e9, "pct_cublas": 100.0})
        for name, fn in steps:
            c = cp.full((s, s), cp.nan, dtype=cp.float32)
            fn(c)
            err = rel_diff(c, c_ref)
            t = time_ms(lambda: fn(c), max(3, reps // 2) if name.startswith("01") else reps)
            rows.append({"step": name, "n": s, "ms": t, "tflops": flops / t / 1e9,
                         "pct_cublas": 100.0 * t_blas / t, "check": err})
        a = b = c0 = c = c_ref = None
        cp.get_default_memory_pool().free_all_blocks()
    return rows


# (label, M, N, K): the precisions section's shapes (the planner's HDF5 tile is 256 x 16384 x 4096).
TF32_SHAPES = [
    ("square", 8192, 8192, 8192),
    ("planner tile", 256, 16384, 4096),
    ("planner strip", 2304, 32768, 4096),
    ("ragged", 4097, 4097, 4097),
    ("panel", 16384, 16384, 4096),
    ("square", 32768, 32768, 32768),
]


def cublas_tf32_fn(a, b, c):
    """cupy.matmul with the float32 compute type set to TF32 for the call."""
    cp = cupy_module()
    from cupy._core import _routines_linalg as rl

    def run():
        before = rl.get_compute_type(np.float32)
        rl.set_compute_type(np.float32, rl.COMPUTE_TYPE_TF32)
        try:
            cp.matmul(a, b, out=c)
        finally:
            rl.set_compute_type(np.float32, before)

    return run


def precompile(configs, jobs: int = 16) -> float:
    """Compile every entry of these configs into cupy's disk cache in parallel processes (NVRTC
    is slow; the timed process then loads binaries).  Returns the seconds it took."""
    import subprocess

    t0 = time.time()
    code = ("import sys; from bigmm.backends import cuda_kernels as ck; "
            "cfgs = ck.tile_configs(); "
            "[ck._gemm_kernel(cfgs[n], e) for n, e in (x.split(':') for x in sys.argv[1:])]")
    work = [f"{c.name}:{e}" for c in ck._runnable(configs) for e in c.entries]
    chunks = [work[i::jobs] for i in range(jobs)]
    procs = [subprocess.Popen([sys.executable, "-c", code, *ch]) for ch in chunks if ch]
    for proc in procs:
        proc.wait()
    return time.time() - t0


def run_precisions(label, m, n, k, configs, reps=None, reference=True) -> list[dict]:
    """Check then time, interleaved: cuBLAS SGEMM, cuBLAS TF32 and each config (its own
    precision) on one shape; errors against float64 (when ``reference``)."""
    cp = cupy_module()
    a, b, _ = operands("float32", m, n, k)
    flops = 2.0 * m * n * k
    reps = reps or reps_for(flops, 100e12, 1.0)
    ref = None
    if reference:
        ref = cp.matmul(a.astype(cp.float64), b.astype(cp.float64))
    rows, fns = [], []
    # 3xTF32 and TF32 as the launcher runs them (operands split or rounded ahead on sm_90a
    # where it pays): each call checked and set up again ("as launched"), or set up once and
    # issued again as the out-of-core run issues its steps ("prepared"); beside each config
    def prepared(p):
        def of(c):
            launch = ck.prepare_gemm(a, b, c, precision=p)
            return lambda: launch(cp.cuda.get_current_stream())
        return of

    split = [row for p in ("tf32x3", "tf32") for row in (
        (f"bigmm {p} (as launched)", (lambda p: lambda c: lambda: ck.gemm(a, b, c, precision=p))(p)),
        (f"bigmm {p} (prepared)", prepared(p)))
             ] if ck.device_arch() == "sm_90a" and k >= ck.TF32X3_WGMMA_MIN_K else []
    for name, fn_of in [("cuBLAS SGEMM", lambda c: lambda: cp.matmul(a, b, out=c)),
                        ("cuBLAS TF32", lambda c: cublas_tf32_fn(a, b, c))] + split + [
            (cfg, (lambda cfg: lambda c: lambda: ck.gemm(a, b, c, config=cfg,
                                                         precision=cfg.precision))(cfg))
            for cfg in configs]:
        c = cp.full((m, n), cp.nan, dtype=cp.float32)
        fn = fn_of(c)
        fn()
        cp.cuda.get_current_stream().synchronize()
        kernel = name if isinstance(name, str) else f"{name.name} ({name.precision})"
        err = rel_diff(c, ref) if ref is not None else None
        row = {"shape": label, "m": m, "n": n, "k": k, "kernel": kernel, "error": err,
               "finite": bool(cp.isfinite(c).all())}
        rows.append(row)
        if row["finite"]:
            fns.append((row, fn))
        else:
            row.update(ms=None, tflops=None, error="NOT FINITE")
    ms = time_interleaved([fn for _, fn in fns], reps, warmup=1)
    t_sgemm = ms[0]
    for (row, _), t in zip(fns, ms):
        row.update(ms=t, tflops=flops / t / 1e9, x_sgemm=t_sgemm / t, x_tf32=ms[1] / t)
    a = b = c = ref = None
    fns = None
    cp.get_default_memory_pool().free_all_blocks()
    return rows


def precisions_section(args) -> list[dict]:
    precisions = ("float32", "tf32x3", "tf32")
    out = []
    for label, m, n, k in TF32_SHAPES:
        if m * n * k > args.max_volume:
            continue
        big = m * n * k >= 2**45
        if args.variants and not big:
            configs = [c for p in precisions for c in ck._runnable(
                ck.tile_configs("float32", args.table, precision=p).values())]
        else:
            configs = [ck.select_config("float32", m, n, k, args.table, precision=p) for p in precisions]
        rows = run_precisions(label, m, n, k, configs, reps=2 if big else None, reference=not big)
        out += rows
        for r in rows:
            err = r["error"]
            print(f"{label:13s} {m}x{n}x{k} {r['kernel']:44s} {r.get('tflops') or 0:7.1f} TFLOP/s "
                  f"x{r.get('x_sgemm') or 0:5.2f} SGEMM x{r.get('x_tf32') or 0:5.2f} TF32  err "
                  + (f"{err:.2e}" if isinstance(err, float) else str(err)), flush=True)
    return out


def plot(results: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    for ax, dtype in zip(axes, ("float32", "float64")):
        rows = [r for r in results["shapes"] if r["dtype"] == dtype and r.get("tflops")]
        labels = sorted({f"{r['m']}x{r['n']}x{r['k']}" + (" b=1" if r["beta"] else "") for r in rows},
                        key=lambda s: [r["m"] for r in rows if f"{r['m']}x{r['n']}x{r['k']}" in s][0])
        for r in rows:  # the table's choice is marked in the printed table, not the plot
            r["kernel"] = r["kernel"].rstrip(" *")
        kernels = list(dict.fromkeys(r["kernel"] for r in rows))
        width = 0.8 / max(1, len(kernels))
        for i, kn in enumerate(kernels):
            ys = []
            for lab in labels:
                hit = [r["tflops"] for r in rows if r["kernel"] == kn and
                       f"{r['m']}x{r['n']}x{r['k']}" + (" b=1" if r["beta"] else "") == lab]
                ys.append(hit[0] if hit else 0)
            ax.bar(np.arange(len(labels)) + i * width, ys, width, label=kn)
        ax.set_xticks(np.arange(len(labels)) + 0.4 - width / 2)
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"{dtype} GEMM, {results['device']['name']}")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def plot_precisions(results: dict, path: Path) -> bool:
    """The precisions section as bars: TFLOP/s of cuBLAS SGEMM and TF32 and of bigmm's float32,
    3xTF32 and TF32 (prepared launches) per shape, each kernel's relative error in its label."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return False
    rows = [r for r in results["precisions"] if r.get("tflops")]
    series = {"cuBLAS SGEMM": lambda kn: kn == "cuBLAS SGEMM",
              "bigmm float32": lambda kn: kn.endswith("(float32)"),
              "bigmm 3xTF32": lambda kn: kn == "bigmm tf32x3 (prepared)",
              "cuBLAS TF32": lambda kn: kn == "cuBLAS TF32",
              "bigmm TF32": lambda kn: kn == "bigmm tf32 (prepared)"}
    shapes = list(dict.fromkeys((r["m"], r["n"], r["k"]) for r in rows))
    fig, ax = plt.subplots(figsize=(13, 4.5))
    width = 0.8 / len(series)
    for i, (name, match) in enumerate(series.items()):
        ys, errs = [], []
        for shape in shapes:
            hit = [r for r in rows if (r["m"], r["n"], r["k"]) == shape and match(r["kernel"])]
            ys.append(hit[0]["tflops"] if hit else 0)
            errs += [hit[0]["error"]] if hit and isinstance(hit[0]["error"], float) else []
        err = f", error {max(errs):.1e}" if errs else ""
        ax.bar(np.arange(len(shapes)) + i * width, ys, width, label=name + err)
    ax.set_xticks(np.arange(len(shapes)) + 0.4 - width / 2)
    ax.set_xticklabels([f"{m} x {n} x {k}" for m, n, k in shapes], fontsize=8)
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"float32 operands by precision, {results['device']['name']}, {results['date']}")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--table", help="kernel table to select from (default: the packaged one)")
    ap.add_argument("--quick", action="store_true", help="a few shapes only")
    ap.add_argument("--variants", action="store_true", help="time every table config, not only the chosen")
    ap.add_argument("--no-progression", action="store_true")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    ap.add_argument("--tf32", action="store_true", help="the precisions section (float32, 3xTF32, TF32)")
    ap.add_argument("--max-volume", type=float, default=2.0**46, help="skip shapes with M*N*K above")
    ap.add_argument("--precompile", type=int, default=0, help="compile in N processes first")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.precompile:
        cfgs = list(ck.tile_configs("float32" if args.tf32 else None, args.table).values())
        print(f"precompiled {len(cfgs)} configs in {precompile(cfgs, args.precompile):.0f} s", flush=True)
    if args.tf32:
        results = {"device": device_info(), "date": time.strftime("%Y-%m-%d"),
                   "command": "CUPY_TF32=0 PYTHONPATH=. python scripts/bench_kernels.py "
                              + " ".join(argv or sys.argv[1:])}
        print(f"device {results['device']}", flush=True)
        results["precisions"] = precisions_section(args)
        (out / "bench_precisions.json").write_text(json.dumps(results, indent=1))
        plot_precisions(results, out / "bench_precisions.png")
        print(f"\n== {results['device']['name']}, {results['date']} ==")
        print("| shape | M x N x K | kernel | TFLOP/s | x SGEMM | x cuBLAS TF32 | rel. error |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in results["precisions"]:
            err = r["error"]
            print(f"| {r['shape']} | {r['m']}x{r['n']}x{r['k']} | {r['kernel']} | {r.get('tflops') or 0:.1f} | "
                  f"{r.get('x_sgemm') or 0:.2f} | {r.get('x_tf32') or 0:.2f} | "
                  + (f"{err:.1e} |" if isinstance(err, float) else f"{err} |"))
        return 0 if all(r.get("tflops") for r in results["precisions"]) else 1

    t0 = time.time()
    results = {"device": device_info(), "compute_type_f32": check_tf32_off(),
               "command": "CUPY_TF32=0 PYTHONPATH=. python scripts/bench_kernels.py " + " ".join(argv or sys.argv[1:])}
    print(f"device {results['device']}  cupy f32 compute type {results['compute_type_f32']}", flush=True)
    results["peak_tflops"] = {d: peak_fma(d) for d in ("float32", "float64", "float64_dmma")}
    print(f"FMA ceilings: {results['peak_tflops']}", flush=True)

    table_cfgs = {d: list(ck.tile_configs(d, args.table, precision=d).values()) for d in args.dtypes}
    results["correctness"] = correctness_sweep([c for d in args.dtypes for c in table_cfgs[d]])
    bad = [r for r in results["correctness"] if not r["ok"]]
    print(f"correctness: {len(results['correctness']) - len(bad)}/{len(results['correctness'])} ok", flush=True)
    for r in bad:
        print("  FAIL", r, flush=True)

    results["shapes"] = []
    for dtype in args.dtypes:
        for label, m, n, k, beta in (QUICK if args.quick else SHAPES)[dtype]:
            chosen = ck.select_config(dtype, m, n, k, args.table)
            configs = table_cfgs[dtype] if args.variants else [chosen]
            rows = run_shape(dtype, label, m, n, k, beta, configs, args.table)
            results["shapes"] += rows
            best = max((r for r in rows[1:] if r.get("tflops")), key=lambda r: r["tflops"], default=None)
            print(f"{dtype} {label:11s} {m}x{n}x{k} b={beta:g}: cuBLAS {rows[0]['tflops']:.1f}  "
                  + "  ".join(f"{r['kernel']} {r['tflops'] or 0:.1f}" for r in rows[1:])
                  + (f"  best {best['pct_cublas']:.0f}%" if best else ""), flush=True)
    if not args.no_progression and "float32" in args.dtypes:
        results["progression"] = progression((8192,) if args.quick else (4096, 8192))
    results["wall_s"] = time.time() - t0
    (out / "bench_kernels.json").write_text(json.dumps(results, indent=1))
    plotted = plot(results, out / "bench_kernels.png")

    # The short table, last.
    print(f"\n== {results['device']['name']}: FMA ceilings f32 {results['peak_tflops']['float32']:.1f}, "
          f"f64 {results['peak_tflops']['float64']:.1f}; FP64 tensor cores "
          f"{results['peak_tflops']['float64_dmma']:.1f} TFLOP/s ==")
    print(f"{'dtype':8s} {'shape':12s} {'M x N x K':>20s} {'beta':>4s} {'kernel':30s} {'TFLOP/s':>8s} {'%cuBLAS':>8s} {'%FMA':>6s}")
    for r in results["shapes"]:
        pk = results["peak_tflops"][r["dtype"]]
        tf = r.get("tflops")
        print(f"{r['dtype']:8s} {r['shape']:12s} {r['m']:>6d}x{r['n']:>6d}x{r['k']:>6d} {r['beta']:4g} "
              f"{r['kernel']:30s} {tf or 0:8.2f} {r.get('pct_cublas') or 0:8.1f} {100 * (tf or 0) / pk:6.1f}"
              + ("" if tf else "  " + r.get("error", "")))
    for r in results.get("progression", []):
        print(f"progression n={r['n']:5d} {r['step']:32s} {r['tflops']:7.2f} TFLOP/s {r['pct_cublas']:6.1f}% of cuBLAS")
    print(f"wrote {out / 'bench_kernels.json'}" + (f" and {out / 'bench_kernels.png'}" if plotted else " (no matplotlib: no plot)"))
    return 1 if bad or any(r.get("error") for r in results["shapes"]) else 0


if __name__ == "__main__":
    sys.exit(main())
