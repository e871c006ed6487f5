#!/usr/bin/env python3
"""Jobs larger than the GPU: bigmm from host arrays at growing sizes, against in-core rates.

For each n of ``--sizes`` (float32 n x n host arrays; sizes beyond the host's memory are
skipped) and each kernel of ``--kernels``, one ``bigmm.matmul`` with default budgets from
ordinary (pageable) NumPy arrays into a NumPy C; then the ``--job-n`` job under
``--job-memory`` (the issue's 8 GiB job) with each kernel from pageable arrays, and with the
first kernel also from page-locked arrays (the same arrays locked in place by
``bigmm.page_locked``; how long that took is reported, beside the host's copy rate into
staging, which is what bigmm's planner chooses between, and that rate while the device
copies both ways at once, which the readers and the writer share). ``--locked`` runs the
rows at default budgets from page-locked arrays instead (A, B and C locked in place once,
before them): what the job costs where the host's copies are not what bounds it.

The in-core rate of the same arithmetic (device-resident operands, the same kernel through
the same backend, CUDA events) is measured in the same process at the largest size of
``--sizes`` whose three matrices fit in the device's free memory (``--in-core-n`` to choose),
and at ``--job-n``. Each row reports its seconds (host clock around the whole call, whose
plan ``bigmm.plan`` made just before it: its planning time, which a user's first call of a
shape pays inside the call, is reported apart, with any timing of rates it did), TFLOP/s, the ratio to the in-core rate, the plan (order, tiles), the plan's input bytes
against the Hong-Kung bound for its budget, the link time (the plan's host-to-device bytes
over the calibrated link rate, and C's copy out over the same rate the other way), the
predicted time against the measured one, and the host path the job chose (staged, in place,
page-locked for the run) with the RunStats' bytes staged and locked.

``--dtype bfloat16`` (or float16) makes A and B half precision (drawn in float32, rounded; C
float32): the backend multiplies them on tensor cores through ``cublasGemmEx`` whatever the
kernel, in core as out of core.

Every product is checked before its time counts: a float64 Freivalds probe, C x against
A (B x) (x float64 random normal; all in float64 on the host's threads, in row blocks), the
relative error of every block of PROBE_BLOCK rows against its bound (float32 products
``tolerance(float32, n)``; TF32 ``TF32_TOLERANCE``). C is poisoned with NaN before each run.

Device time is scarce: rows run smallest size first, then the largest, then the others, and
a row whose predicted time (with its checks) would end past ``--deadline`` seconds after the
start is skipped and listed. A kernel name the backend does not take (the tensor-core
kernels of ``bigmm.backends.cuda_kernels`` until the backend exposes them, or a bf16 mode)
is listed as a skipped row: add it to ``--kernels`` once it is there. Writes
``bench_scale.json`` under ``--out`` and prints a table last.

    PYTHONPATH=. python scripts/bench_scale.py --out results
    PYTHONPATH=. python scripts/bench_scale.py --sizes 8192,12288 --job-n 8192 \\
        --job-memory 256MiB --out /tmp/smoke      # a smoke run
"""

from __future__ import annotations

import os

os.environ.setdefault("CUPY_TF32", "0")

import argparse  # noqa: E402
import concurrent.futures as cf  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import bigmm  # noqa: E402
from bigmm.testing import tolerance  # noqa: E402
from bigmm.units import DTYPES, dtype_name, format_bytes, numpy_dtype  # noqa: E402

F32 = np.float32
#: Rows per block of the Freivalds probe, and the bound of a TF32 product's probe (inputs
#: rounded to 10 bits: relative errors near 5e-4 on this data).
PROBE_BLOCK, TF32_TOLERANCE = 4096, 5e-3
#: Share of the host's memory the operands may take.
HOST_SHARE = 0.7
#: Seconds a row's checks and poisoning take per byte of C, beyond its run (for --deadline).
CHECK_SECONDS_PER_BYTE = 1 / 10e9


def log(*a) -> None:
    print(*a, flush=True)


# ----- data -----------------------------------------------------------------------------------

def parallel(fn, parts, threads: int) -> None:
    with cf.ThreadPoolExecutor(threads) as pool:
        list(pool.map(fn, parts))


def split(n: int, parts: int) -> list[tuple[int, int]]:
    edges = np.linspace(0, n, parts + 1).astype(int)
    return [(int(a), int(b)) for a, b in zip(edges, edges[1:]) if b > a]


def random_flat(size: int, seed: int, threads: int, dtype=F32) -> np.ndarray:
    """``size`` elements of ``dtype`` uniform in [-0.5, 0.5) (drawn in float32, then rounded
    to a half-precision ``dtype``), filled by ``threads`` generators."""
    out = np.empty(size, dtype)

    def fill(i_part):
        i, (a, b) = i_part
        x = out[a:b] if out.dtype == F32 else np.empty(b - a, F32)
        np.random.default_rng([seed, i]).random(out=x, dtype=F32)
        x -= 0.5
        if x is not out[a:b]:
            out[a:b] = x.astype(out.dtype)

    parallel(fill, list(enumerate(split(size, 8 * threads))), threads)
    return out


def poison(x: np.ndarray, threads: int) -> None:
    flat = x.reshape(-1)
    parallel(lambda ab: flat[ab[0]:ab[1]].fill(np.nan), split(flat.size, 4 * threads), threads)


def square(flat: np.ndarray, n: int) -> np.ndarray:
    """The first n*n elements of a flat buffer as a contiguous n x n matrix."""
    return flat[: n * n].reshape(n, n)


def copies_beside_dma(threads: int, nbytes: int = 256 << 20) -> dict:
    """What ``threads`` host threads copy (pageable into pinned, as the readers stage panels)
    while the device copies both ways through pinned buffers, against alone; bytes per second
    of each (the best of three), and of the device's copies while the host's ran."""
    import threading

    import cupy

    src = np.ones(nbytes // 8)
    block = cupy.cuda.alloc_pinned_memory(nbytes)
    dst = np.frombuffer(block, np.float64, src.size)
    dst[:] = 0.0
    parts = split(src.size, threads)

    def copy(ab):
        dst[ab[0]:ab[1]] = src[ab[0]:ab[1]]

    def host_rate(pool) -> float:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            list(pool.map(copy, parts))
            best = min(best, time.perf_counter() - t0)
        return nbytes / best

    stop, moved = threading.Event(), [0, 0]
    hosts = [cupy.cuda.alloc_pinned_memory(nbytes) for _ in range(2)]
    devs = [cupy.empty(nbytes, cupy.uint8) for _ in range(2)]

    def dma(i: int) -> None:  # 0: host to device, 1: device to host
        s = cupy.cuda.Stream(non_blocking=True)
        while not stop.is_set():
            args = ((devs[0].data.ptr, hosts[0].ptr, nbytes, 1) if i == 0
                    else (hosts[1].ptr, devs[1].data.ptr, nbytes, 2))
            cupy.cuda.runtime.memcpyAsync(*args, s.ptr)
            s.synchronize()
            moved[i] += nbytes

    with cf.ThreadPoolExecutor(threads) as pool:
        list(pool.map(copy, parts))
        alone = host_rate(pool)
        movers = [threading.Thread(target=dma, args=(i,)) for i in (0, 1)]
        for t in movers:
            t.start()
        time.sleep(0.2)
        t0, before = time.perf_counter(), list(moved)
        beside = host_rate(pool)
        seconds = time.perf_counter() - t0
        stop.set()
        for t in movers:
            t.join()
    return {"alone": alone, "beside_dma": beside, "share": beside / alone,
            "h2d_beside": (moved[0] - before[0]) / seconds,
            "d2h_beside": (moved[1] - before[1]) / seconds}


# ----- checks ---------------------------------------------------------------------------------

def matvec64(m: np.ndarray, x: np.ndarray, threads: int, rows: int = 8) -> np.ndarray:
    """m @ x in float64 for a float32 m, in blocks of ``rows`` rows on ``threads`` threads
    (each block converted to float64 in cache)."""
    out = np.empty(m.shape[0])

    def part(ab):
        a, b = ab
        for r in range(a, b, rows):
            out[r:min(b, r + rows)] = m[r:min(b, r + rows)].astype(np.float64) @ x

    parallel(part, split(m.shape[0], 4 * threads), threads)
    return out


class Probe:
    """Freivalds probe of C = A @ B: x float64 random normal, r = A (B x) in float64."""

    def __init__(self, a, b, threads: int, seed: int = 7):
        self.threads = threads
        self.x = np.random.default_rng(seed).standard_normal(a.shape[1])
        t0 = time.perf_counter()
        self.r = matvec64(a, matvec64(b, self.x, threads), threads)
        self.seconds = time.perf_counter() - t0

    def error(self, c) -> float:
        """The largest relative error over blocks of PROBE_BLOCK rows of C x (inf for NaN)."""
        y = matvec64(c, self.x, self.threads)
        worst = 0.0
        for a in range(0, y.size, PROBE_BLOCK):
            d = np.linalg.norm(y[a:a + PROBE_BLOCK] - self.r[a:a + PROBE_BLOCK])
            worst = max(worst, d / max(np.linalg.norm(self.r[a:a + PROBE_BLOCK]), 1e-300))
        return worst if np.isfinite(worst) else float("inf")


def options(kernel: str | None) -> dict:
    """``kernel=`` and ``precision=`` of a ``--kernels`` name: "bigmm/tf32x3" is kernel
    "bigmm" with precision "tf32x3"."""
    if kernel is None:
        return {"kernel": None}
    name, _, precision = kernel.partition("/")
    return {"kernel": name, **({"precision": precision} if precision else {})}


def bound(kernel: str | None, n: int, dtype: str = "float32") -> float:
    """The probe's bound: a TF32 product's, else ``tolerance`` of the operands' dtype (the
    probe's reference is computed from the operands as stored, rounding included)."""
    tf32 = kernel and ("tf32" in kernel and not kernel.endswith("tf32x3"))
    return TF32_TOLERANCE if tf32 else tolerance(dtype, n)


# ----- in core --------------------------------------------------------------------------------

def device_operand(x, dtype: str):
    """A float32 device array as the backend holds ``dtype`` operands: float16 rounded,
    bfloat16 rounded to nearest even and held as its uint16 bits, float32 as it is."""
    import cupy

    if dtype == "float16":
        return x.astype(cupy.float16)
    if dtype == "bfloat16":
        bits = x.view(cupy.uint32)
        return ((bits + cupy.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16).astype(cupy.uint16)
    return x


def device_float64(x, dtype: str):
    """The values of a device operand (:func:`device_operand`) in float64."""
    import cupy

    if dtype == "bfloat16":
        return (x.astype(cupy.uint32) << 16).view(cupy.float32).astype(cupy.float64)
    return x.astype(cupy.float64)


def in_core(kernel: str, n: int, repeat: int, dtype: str = "float32") -> dict:
    """Median seconds of one n^3 product of ``dtype`` operands (C in float32) on
    device-resident operands through the backend's gemm with ``kernel`` (CUDA events, after a
    warm-up), checked against a float64 probe on the device. ``kernel`` None: the NumPy
    backend (host clock; a smoke run)."""
    if kernel is None:
        return _in_core_host(n, repeat, dtype)
    import cupy

    from bigmm.backends import get_backend

    be = get_backend("cupy", **options(kernel))
    a = b = c = None
    try:
        s = be.stream()
        with s:
            rng = cupy.random.default_rng(11)
            a = rng.random((n, n), dtype=F32)
            a -= F32(0.5)
            a = device_operand(a, dtype)
            b = rng.random((n, n), dtype=F32)
            b -= F32(0.5)
            b = device_operand(b, dtype)
            c = cupy.full((n, n), np.nan, F32)
        small = slice(0, min(n, 2048))
        be.gemm(a[small, small], b[small, small], c[small, small], 1.0, 0.0, False, False, s)
        times = []
        for _ in range(repeat):
            e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
            e0.record(s)
            be.gemm(a, b, c, 1.0, 0.0, False, False, s)
            e1.record(s)
            e1.synchronize()
            times.append(cupy.cuda.get_elapsed_time(e0, e1) / 1e3)
        with s:
            x = rng.standard_normal(n, dtype=np.float64)
            rows = 8192
            err = 0.0
            bx = cupy.concatenate([device_float64(b[r:r + rows], dtype) @ x
                                   for r in range(0, n, rows)])
            for r in range(0, n, rows):
                ref = device_float64(a[r:r + rows], dtype) @ bx
                got = c[r:r + rows].astype(np.float64) @ x
                err = max(err, float(cupy.linalg.norm(got - ref) / cupy.linalg.norm(ref)))
        s.synchronize()
        if not err <= bound(kernel, n, dtype):
            raise AssertionError(f"in-core {kernel} n={n}: probe error {err:.2e}")
        t = float(np.median(times))
        return {"kernel": kernel, "n": n, "dtype": dtype, "seconds": t,
                "tflops": 2 * n**3 / t / 1e12, "probe_error": err, "repeat": repeat}
    finally:
        del a, b, c
        be.close()
        cupy.get_default_memory_pool().free_all_blocks()


def _in_core_host(n: int, repeat: int, dtype: str = "float32") -> dict:
    from bigmm.backends.numpy import NumpyBackend

    rng = np.random.default_rng(11)
    a, b = ((rng.random((n, n), dtype=F32) - F32(0.5)).astype(numpy_dtype(dtype))
            for _ in range(2))
    c = np.full((n, n), np.nan, F32)
    be, times = NumpyBackend(), []
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        be.gemm(a, b, c, 1.0, 0.0, False, False, None)
        times.append(time.perf_counter() - t0)
    probe = Probe(a, b, 2)
    err = probe.error(c)
    assert err <= bound(None, n, dtype), err
    t = float(np.median(times[1:]))
    return {"kernel": None, "n": n, "dtype": dtype, "seconds": t,
            "tflops": 2 * n**3 / t / 1e12, "probe_error": err, "repeat": repeat}


# ----- out of core ----------------------------------------------------------------------------

def plan_facts(p) -> dict:
    """What a row reports of its plan."""
    r = p.rates
    link = r.h2d_bytes if r is not None and r.h2d_bytes else None
    moved_in = p.itemsize * (p.a_reads * p.m * p.k + p.b_reads * p.k * p.n)
    return {"order": p.order, "tile": [p.bm, p.bn, p.bk], "tail": p.tail, "a_span": p.a_span,
            "in_place": p.in_place, "registered": p.registered,
            "device_bytes": p.device_bytes, "device_budget": p.device_budget,
            "host_bytes": p.host_bytes, "host_budget": p.host_budget,
            "bytes_in": moved_in, "bound_bytes": p.lower_bound_bytes,
            "bound_ratio": p.bound_ratio,
            "link_in_seconds": p.bytes_h2d / link if link else None,
            "link_out_seconds": p.bytes_written / link if link else None,
            "link_rate": link, "predicted_seconds": p.predicted_seconds,
            "rates": {k: v for k, v in vars(r).items()} if r is not None else None}


def run_row(job: str, a, b, c, kernel: str | None, memory, probe: Probe, threads: int) -> dict:
    """One checked, timed bigmm.matmul of a @ b into c (``kernel`` None: the NumPy backend)."""
    kw = dict(backend="cupy" if kernel else "numpy", **options(kernel), memory=memory)
    t0 = time.perf_counter()
    p = bigmm.plan(a, b, c, **kw)  # the call below takes this plan from the planner's cache
    plan_seconds = time.perf_counter() - t0
    poison(c, threads)
    t0 = time.perf_counter()
    _, stats = bigmm.matmul(a, b, c, stats=True, **kw)
    seconds = time.perf_counter() - t0
    err = probe.error(c)
    n, dtype = a.shape[0], dtype_name(a.dtype)
    if not err <= bound(kernel, n, dtype):
        raise AssertionError(f"{job} {kernel}: probe error {err:.2e} > "
                             f"{bound(kernel, n, dtype):.1e}")
    row = {"job": job, "n": n, "kernel": kernel, "dtype": dtype, "memory": memory,
           "seconds": seconds, "plan_seconds": plan_seconds,
           "tflops": 2 * n**3 / seconds / 1e12, "probe_error": err,
           "stats": stats.to_dict(), **plan_facts(p)}
    row["predicted_over_measured"] = p.predicted_seconds / seconds
    log(f"{job:>10} {kernel or 'numpy':12s} {seconds:8.3f} s {row['tflops']:6.1f} TFLOP/s  plan "
        f"{p.order} {p.bm}x{p.bn}x{p.bk} tail {p.tail} A loads {p.a_span} panels, in place "
        f"{p.in_place!r} locked "
        f"{p.registered!r}; predicted {p.predicted_seconds:.3f} s; staged "
        f"{format_bytes(stats.bytes_staged)}, locked {format_bytes(stats.bytes_locked)} in "
        f"{stats.lock_seconds:.2f} s; planned in {plan_seconds:.3f} s; probe {err:.1e}" + (f"; {stats.notes}" if stats.notes
                                                            else ""))
    return row


# ----- the table ------------------------------------------------------------------------------

def table(res: dict) -> str:
    lines = ["| job | kernel | s | planning s | TFLOP/s | in-core | ratio | plan | bytes/bound | "
             "link s | predicted / measured | path |", "|" + " --- |" * 12]
    for r in res["rows"]:
        if "skipped" in r:
            lines.append(f"| {r['job']} | {r['kernel']} | skipped: {r['skipped']} |" + " |" * 9)
            continue
        inc = r.get("in_core_tflops")
        link = r["link_in_seconds"]
        link = f"{link:.2f} / {r['link_out_seconds']:.2f}" if link else "-"
        path = (f"in place {r['in_place'] or '-'}, locked {r['registered'] or '-'}"
                if r["in_place"] is not None else "executor")
        planning = f"{r['plan_seconds']:.3f}" if "plan_seconds" in r else "-"
        lines.append(
            f"| {r['job']} | {r['kernel'] or 'numpy'} | {r['seconds']:.3f} | {planning} | "
            f"{r['tflops']:.1f} | "
            f"{inc:.1f} | {r['tflops'] / inc:.3f} | {r['order']} "
            f"{'x'.join(map(str, r['tile']))}{' t' + str(r['tail']) if r['tail'] else ''}"
            f"{' a' + str(r['a_span']) if r.get('a_span', 1) > 1 else ''} | "
            f"{r['bound_ratio']:.2f} | {link} | "
            f"{r['predicted_seconds']:.3f} / {r['seconds']:.3f} = "
            f"{r['predicted_over_measured']:.2f} | {path} |" if inc else
            f"| {r['job']} | {r['kernel']} | {r['seconds']:.3f} | {planning} | {r['tflops']:.1f} | "
            f"- | - | "
            f"{r['order']} | {r['bound_ratio']:.2f} | {link} | "
            f"{r['predicted_over_measured']:.2f} | {path} |")
    return "\n".join(lines)


# ----- main -----------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="32768,49152,65536,81920")
    ap.add_argument("--kernels", default="cublas-tf32,cublas,bigmm",
                    help="kernels in the order each size runs them; kernel/precision for "
                         "another precision (bigmm/tf32x3)")
    ap.add_argument("--job-n", type=int, default=32768)
    ap.add_argument("--job-memory", default="8GiB")
    ap.add_argument("--in-core-n", type=int, default=None,
                    help="size of the in-core rates (default: the largest of --sizes that fits)")
    ap.add_argument("--in-core-repeat", type=int, default=1)
    ap.add_argument("--deadline", type=float, default=float("inf"),
                    help="skip rows predicted to end later than this many seconds from start")
    ap.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--out", default="bench-out/scale")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                    help="A's and B's dtype (C is float32): half precision runs on tensor "
                         "cores through cublasGemmEx whatever the kernel")
    ap.add_argument("--locked", action="store_true",
                    help="the rows at default budgets from page-locked arrays (locked in "
                         "place once, before them)")
    ap.add_argument("--cpu", action="store_true",
                    help="the NumPy backend, no GPU (a smoke run of the script itself)")
    args = ap.parse_args(argv)

    from bigmm.backends.numpy import memory_available
    from bigmm.executor.calibrate import copy_rate

    start = time.perf_counter()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.cpu:
        name, free_dev, total_dev, version, KERNELS = "CPU", 1 << 30, 1 << 30, None, (None,)
        args.kernels = ""

        def free_device():
            pass
    else:
        import cupy

        from bigmm.backends.cupy import KERNELS, release_pinned

        def free_device():
            """Each row a first run, as the model counts it: no pinned staging kept, no
            device memory held by cupy's pool."""
            release_pinned()
            cupy.get_default_memory_pool().free_all_blocks()

        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        free_dev, total_dev = cupy.cuda.runtime.memGetInfo()
        version = cupy.__version__
    ram = memory_available()
    sizes = [int(x) for x in args.sizes.split(",")]
    item = DTYPES[args.dtype]
    fits = [n for n in sizes if (2 * item + 4) * n * n <= HOST_SHARE * ram]
    res = {"command": " ".join(sys.argv), "dtype": args.dtype, "device": name,
           "device_memory": total_dev,
           "host": platform.node(), "cpus": os.cpu_count(), "host_memory_available": ram,
           "cupy": version, "date": time.strftime("%Y-%m-%d"), "rows": [],
           "in_core": [], "skipped_sizes": [n for n in sizes if n not in fits]}
    path = out_dir / "bench_scale.json"

    def save():
        path.write_text(json.dumps(res, indent=1, default=str))

    def left() -> float:
        return args.deadline - (time.perf_counter() - start)

    top = max(fits + [args.job_n])
    t0 = time.perf_counter()
    flat = {x: random_flat(top * top, seed, args.threads, numpy_dtype(args.dtype))
            for x, seed in (("A", 1), ("B", 2))}
    flat["C"] = np.empty(top * top, F32)
    poison(flat["C"], args.threads)
    res["generate_seconds"] = time.perf_counter() - t0
    res["host_copy_rate"] = copy_rate(args.threads)
    log(f"{name}: A, B of {top}^2 {args.dtype}, C float32 ready in "
        f"{res['generate_seconds']:.1f} s; host "
        f"copies {res['host_copy_rate'] / 1e9:.1f} GB/s on {args.threads} threads; sizes "
        f"{fits} (skipped for host memory: {res['skipped_sizes']})")
    if not args.cpu:  # host copies beside the device's both ways (they share the memory)
        res["copies_beside_dma"] = copies_beside_dma(args.threads)
        c = res["copies_beside_dma"]
        log(f"host copies {c['alone'] / 1e9:.1f} GB/s alone, {c['beside_dma'] / 1e9:.1f} "
            f"beside the device's copies both ways ({c['share']:.2f}; those at "
            f"{c['h2d_beside'] / 1e9:.1f} and {c['d2h_beside'] / 1e9:.1f} GB/s)")
    if not args.cpu:  # pinning fresh memory (staging) against locking a touched array
        t0 = time.perf_counter()
        cupy.cuda.PinnedMemory(1 << 30)  # allocated, then freed
        res["pin_1gib_seconds"] = time.perf_counter() - t0
        x = np.ones(1 << 27)
        t0 = time.perf_counter()
        cupy.cuda.runtime.hostRegister(x.ctypes.data, x.nbytes, 1)
        res["lock_1gib_seconds"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        cupy.cuda.runtime.hostUnregister(x.ctypes.data)
        res["unlock_1gib_seconds"] = time.perf_counter() - t0
        log(f"pinning 1 GiB: {res['pin_1gib_seconds']:.3f} s; locking a touched 1 GiB array: "
            f"{res['lock_1gib_seconds']:.3f} s, releasing it {res['unlock_1gib_seconds']:.3f} s")
        del x
    kernels = [k for k in args.kernels.split(",") if k] if not args.cpu else [None]
    for k in kernels:
        if options(k)["kernel"] not in KERNELS:
            res["rows"].append({"job": "all", "kernel": k,
                                "skipped": "not a kernel the cupy backend takes"})
    kernels = [k for k in kernels if options(k)["kernel"] in KERNELS]

    # warm-up: kernels compiled, calibrations taken, on small views
    for k in kernels:
        w = min(4096, top)
        bigmm.matmul(square(flat["A"], w), square(flat["B"], w), square(flat["C"], w),
                     backend="cupy" if k else "numpy", **options(k))
    res["warm_up_seconds"] = time.perf_counter() - start - res["generate_seconds"]

    # in-core rates
    in_core_n = args.in_core_n or max(
        [n for n in sizes if (2 * item + 4) * n * n <= 0.9 * free_dev] or [args.job_n])
    rates = {}
    for n in dict.fromkeys([in_core_n, args.job_n]):
        for k in kernels:
            est = 2 * n**3 / (300e12 if k and "tf32" in k else 45e12) * (args.in_core_repeat + 1)
            if est > left():
                continue
            try:
                r = in_core(k, n, args.in_core_repeat, args.dtype)
            except Exception as e:  # recorded; the other rows still run
                res["in_core"].append({"kernel": k, "n": n, "error": repr(e)})
                log(f"in core {k} n={n} failed: {e!r}")
                continue
            finally:
                free_device()
            rates[(k, n)] = r["tflops"]
            res["in_core"].append(r)
            log(f"in core {k or 'numpy':12s} n={n}: {r['seconds']:.3f} s, "
                f"{r['tflops']:.1f} TFLOP/s")
            save()

    def in_core_rate(k, n):
        if (k, n) in rates:
            return rates[(k, n)]
        return rates.get((k, in_core_n))

    def do(job, n, memory, kernel, probe, arrays):
        a, b, c = arrays
        free_device()
        try:
            p = bigmm.plan(a, b, c, backend="cupy" if kernel else "numpy", **options(kernel),
                           memory=memory)
            need = p.predicted_seconds * 1.3 + c.nbytes * CHECK_SECONDS_PER_BYTE + 2
            if need > left():
                res["rows"].append({"job": job, "kernel": kernel, "n": n,
                                    "skipped": f"predicted {p.predicted_seconds:.1f} s, "
                                               f"{left():.0f} s left"})
                log(f"skipped {job} {kernel}: predicted {p.predicted_seconds:.1f} s")
                return
            row = run_row(job, a, b, c, kernel, memory, probe, args.threads)
        except Exception as e:  # recorded; the other rows still run
            res["rows"].append({"job": job, "kernel": kernel, "n": n, "skipped": repr(e)})
            log(f"{job} {kernel} failed: {e!r}")
            return
        row["in_core_tflops"] = in_core_rate(kernel, n)
        res["rows"].append(row)
        save()

    # the 8 GiB job, from pageable arrays, then the first kernel from page-locked ones
    n = args.job_n
    arrays = [square(flat[x], n) for x in "ABC"]
    probe = Probe(arrays[0], arrays[1], args.threads)
    res["probe_seconds"] = {n: probe.seconds}
    job = f"{n} {args.job_memory}"
    for k in kernels:
        do(job, n, args.job_memory, k, probe, arrays)
    if not args.cpu:
        with bigmm.page_locked(*arrays) as held:
            res["lock_seconds"], res["lock_bytes"] = held.seconds, held.nbytes
            do(job + " pinned", n, args.job_memory, kernels[0], probe, arrays)
            t0 = time.perf_counter()
        res["unlock_seconds"] = time.perf_counter() - t0
        log(f"locking A, B, C ({format_bytes(res['lock_bytes'])}) took "
            f"{res['lock_seconds']:.2f} s, releasing {res['unlock_seconds']:.2f} s"
            + "".join(f"; {note}" for note in held.notes()))

    # default budgets at each size: smallest, largest, then the others
    order = sorted(fits)
    order = order[:1] + order[-1:] + order[1:-1] if len(order) > 1 else order
    locked = bool(args.locked and not args.cpu and order)
    with bigmm.page_locked(*(flat[x] for x in "ABC")) if locked else \
            contextlib.nullcontext() as held:
        if locked:
            res["sweep_lock_seconds"] = held.seconds
            log(f"locking A, B, C of {top}^2 for the sizes took {held.seconds:.2f} s"
                + "".join(f"; {note}" for note in held.notes()))
        for n in order:
            arrays = [square(flat[x], n) for x in "ABC"]
            probe = Probe(arrays[0], arrays[1], args.threads)
            res["probe_seconds"][n] = probe.seconds
            for k in kernels:
                do(f"{n}" + (" locked" if locked else ""), n, None, k, probe, arrays)
    res["seconds"] = time.perf_counter() - start
    save()
    log(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
