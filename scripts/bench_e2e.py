#!/usr/bin/env python3
"""End-to-end benchmark of bigmm's GPU out-of-core pipeline against its peers, in one run.

Host-memory inputs (NumPy float32 n x n arrays, device budget ``--memory``):
  bigmm with its own kernel and with ``kernel="cublas"``, against in-core (device-resident)
  bigmm kernel and cuBLAS, and against cuBLASXt (ctypes, ``scripts/cublasxt.py``) from ordinary
  pageable arrays and from pre-pinned arrays at each block dimension of ``--xt-blocks``. bigmm
  runs from the pageable arrays (staged through its pinned buffers) and, both kernels again,
  from the same pre-pinned arrays cuBLASXt uses (copied to and from the device directly), so
  each comparison is like with like.
HDF5 files (float32 n x n in ``--dir``, chunked ``--h5-chunk`` or contiguous, ``--layouts``):
  ``--parts floor``: the storage floor measured in the same run (``storage.py``): the least
  time this disk needs to read A and B once and write C once, reads and writes one after the
  other and at once, buffered and ``O_DIRECT``, cold and warm; ``--parts h5``: bigmm on the
  files, each of ``--h5-runs`` (cold or warm page cache, C's tiles written ``O_DIRECT``, as
  chosen for the disk, or copied into a shared map), against that floor; ``--parts dask``:
  dask.array + CuPy (``da.from_array`` on the h5py datasets, ``map_blocks(cupy.asarray)``,
  ``@``, ``da.store`` into HDF5) at each of ``--dask-chunks``, cold and warm; ``--parts
  bounded``: the same job in a cgroup v2 whose ``memory.max`` (``--bounded-limits``, tried in
  turn) is far below A, B and C together, cold (page-cache pages count against the limit),
  against the cold floor, with the cgroup's peak memory. Cold = the inputs' pages dropped
  (``/proc/sys/vm/drop_caches`` where writable, else ``posix_fadvise(DONTNEED)``).

Checksum overhead (``--parts verify``): the same HDF5 files (first of ``--layouts``, warm page
cache) and the same host arrays multiplied with ``verify=None`` and ``verify="checksum"``,
alternating (which goes first alternates too), ``--verify-repeat`` times each after a warm-up
of both; the medians and the overhead in per cent of the unchecked run, and the median of
each round's ratio with a bootstrap 90% interval; the device cost of one step's checks against its
gemm. Checksum kernels (``--parts kernels``): the bandwidth of each checksum kernel (the fast
path the layout gets and the generic fallback) on the run's A and B panels, summed both ways,
with weights and absolute sums, against a device-to-device copy of the same bytes (CUDA
events around calls queued behind a spinning kernel, so the device time alone; median of
``--kernel-repeat`` after warm-up; each result checked against float64 sums first).

Every product is checked before its time counts: against the in-core cuBLAS product on the
device (relative Frobenius error) and, for that reference, by float64 probes
(C x against A (B x)). In-core GPU times come from CUDA events after a warm-up (median of
``--repeat``); end-to-end times from the host clock around the whole call (best of
``--repeat`` after a checked warm-up run). Profiled bigmm runs (stage utilisation, Chrome
trace, PNG timeline) are separate runs. Writes ``bench_e2e.json`` and the profiles under
``--out`` and prints a short table last.

    PYTHONPATH=. python scripts/bench_e2e.py --n 32768 --memory 8GiB --dir bench-out --out res
    PYTHONPATH=. python scripts/bench_e2e.py --n 8192 --memory 256MiB     # a smoke run
    PYTHONPATH=. python scripts/bench_e2e.py --n 16384 --parts verify --layouts contiguous
    PYTHONPATH=. python scripts/bench_e2e.py --n 16384 --parts kernels
    PYTHONPATH=. python scripts/bench_e2e.py --n 32768 --memory 8GiB --dir /tmp/bench \
        --repeat 1 --parts floor,h5,bounded,dask --layouts chunked --in-core cublas \
        --h5-prewarm --dask-chunks 16384 --dask-caches warm,cold     # storage (root for cgroups)
"""

from __future__ import annotations

import os

os.environ.setdefault("CUPY_TF32", "0")  # cupy.matmul (dask's chunks) without TF32

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import h5py  # noqa: E402
import numpy as np  # noqa: E402

import bigmm  # noqa: E402
import storage  # noqa: E402
from e2e_checks import checksum_kernels, verify_overhead  # noqa: E402
from e2e_common import (F32, Reference, fsync, log, random_f32, read_all, tflops,  # noqa: E402
                        time_events, write_h5)
from e2e_report import summary_table  # noqa: E402
from orders import use_orders  # noqa: E402
from bigmm.profile import Profile  # noqa: E402
from bigmm.units import parse_size  # noqa: E402


# ----- parts --------------------------------------------------------------------------------

def in_core(a, b, n, repeat, res, kernels=("cublas", "bigmm")):
    """Device-resident products: cuBLAS (the reference) and bigmm's kernel."""
    import cupy

    from bigmm.backends import get_backend

    a_d, b_d = cupy.asarray(a), cupy.asarray(b)
    out = {}
    c_ref = cupy.empty((n, n), F32)
    for kernel in kernels:
        be = get_backend("cupy", kernel=kernel)
        s = be.stream()
        c = c_ref if kernel == "cublas" else cupy.full((n, n), np.nan, F32)
        cupy.cuda.runtime.deviceSynchronize()  # fills and copies ran on the default stream
        t = time_events(lambda: be.gemm(a_d, b_d, c, 1.0, 0.0, False, False, s), s, repeat)
        if kernel == "cublas":
            ref = Reference(a_d, b_d, c_ref, n)
            err = 0.0
        else:
            err = ref.check(c, "in-core bigmm kernel")
            del c
        be.close()
        out[kernel] = {"seconds": t, "tflops": tflops(n, t), "rel_error_vs_cublas": err}
        log(f"in-core {kernel:6s}: {t:.3f} s, {tflops(n, t):.1f} TFLOP/s")
    out["reference_probe_error"] = ref.probe_error
    res["in_core"] = out
    a_d = b_d = None  # noqa: F841  (frees the device copies)
    cupy.get_default_memory_pool().free_all_blocks()
    return ref


def bigmm_host(a, b, n, memory, repeat, ref, out_dir, res, host_variants=(), pinned=None):
    """bigmm from NumPy arrays into a NumPy array, both kernels (and the own kernel under each
    host staging budget of ``host_variants``); with ``pinned`` (A, B, C in page-locked memory)
    both kernels again from those ("bigmm_pinned", "cublas_pinned"). A profiled run each."""
    out = {}
    pageable = (a, b, np.empty((n, n), F32))
    runs = [("bigmm", None, pageable), ("cublas", None, pageable)]
    runs += [("bigmm", h, pageable) for h in host_variants]
    if pinned is not None:
        runs += [("bigmm", None, pinned), ("cublas", None, pinned)]
    for kernel, host, (a, b, c) in runs:
        key = kernel if host is None else f"{kernel}_host{host}"
        key += "_pinned" if c is not pageable[2] else ""
        kw = dict(memory=memory, backend="cupy", kernel=kernel, host_memory=host)
        plan = bigmm.plan(a, b, c, **kw)
        times, stats = [], None
        for i in range(repeat + 1):  # the first run is the warm-up (pins staging, loads kernels)
            c.fill(np.nan)
            t0 = time.perf_counter()
            _, stats = bigmm.matmul(a, b, c, stats=True, **kw)
            times.append(time.perf_counter() - t0)
            if i == 0:
                err = ref.check(c, f"bigmm host {key}")
        err = ref.check(c, f"bigmm host {key}")
        prof = Profile()
        c.fill(np.nan)
        t0 = time.perf_counter()
        bigmm.matmul(a, b, c, profile=prof, **kw)
        t_prof = time.perf_counter() - t0
        ref.check(c, f"bigmm host {key} (profiled)")
        files = prof.save(out_dir / f"host_{key}")
        best = min(times[1:])
        out[key] = {"seconds": best, "tflops": tflops(n, best), "first_run_seconds": times[0],
                       "all_seconds": times, "rel_error": err, "plan": plan.to_dict(),
                       "stats": stats.to_dict(), "profiled_seconds": t_prof,
                       "profile": prof.summary(), "profile_table": prof.table(),
                       "files": {k: os.path.basename(v) for k, v in files.items()}}
        log(f"bigmm host {key}: best {best:.3f} s ({tflops(n, best):.1f} TFLOP/s), "
            f"first {times[0]:.3f} s; plan {plan.order} {plan.bm}x{plan.bn}x{plan.bk}; "
            f"{stats.bytes_staged / 2**30:.2f} GiB through host staging")
        log(prof.table())
    res["bigmm_host"] = out


def pinned_operands(a, b, n, res):
    """A and B copied into page-locked arrays, and a page-locked C: the pre-pinned operands of
    cuBLASXt and of bigmm's pinned runs."""
    from cublasxt import pinned_empty

    t0 = time.perf_counter()
    a_x, b_x, c_x = pinned_empty(a.shape), pinned_empty(b.shape), pinned_empty((n, n))
    a_x[...], b_x[...] = a, b
    res["pin_and_copy_seconds"] = time.perf_counter() - t0
    return a_x, b_x, c_x


def cublasxt(a, b, n, blocks, ref, res, pinned):
    """cuBLASXt from pageable arrays and from the pre-pinned ``pinned`` (A, B, C), each block
    dimension."""
    from cublasxt import CublasXt

    out = {"pageable": {}, "pinned": {}, "pin_and_copy_seconds": res.get("pin_and_copy_seconds")}
    small = np.ones((512, 512), F32)
    for mode in ("pageable", "pinned"):
        a_x, b_x, c_x = pinned if mode == "pinned" else (a, b, np.empty((n, n), F32))
        for bd in blocks:
            xt = CublasXt(block_dim=bd)
            xt.gemm(small, small, np.empty_like(small))  # warm-up: handle, streams, buffers
            c_x.fill(np.nan)
            t0 = time.perf_counter()
            xt.gemm(a_x, b_x, c_x)
            t = time.perf_counter() - t0
            xt.close()
            err = ref.check(c_x, f"cuBLASXt {mode} block {bd}")
            out[mode][str(bd)] = {"seconds": t, "tflops": tflops(n, t), "rel_error": err}
            log(f"cuBLASXt {mode:8s} block {bd:5d}: {t:.3f} s, {tflops(n, t):.1f} TFLOP/s")
    for mode in ("pageable", "pinned"):
        bd, best = max(out[mode].items(), key=lambda kv: kv[1]["tflops"])
        out[mode + "_best"] = {"block": int(bd), **best}
    res["cublasxt"] = out


def floor(path_a, path_b, c_host, threads, d, res):
    """The storage floor (see storage.py): read A and B once and write C once, every way."""
    c_data = storage.aligned(c_host.nbytes)
    c_data[...] = c_host.reshape(-1).view(np.uint8)
    res["storage_floor"] = storage.storage_floor([str(path_a), str(path_b)], c_data, str(d),
                                                 threads, log)


def bigmm_h5(spec_a, spec_b, path_a, path_b, n, memory, ref, d, out_dir, res, layout,
             host_memory=None, prewarm=False, runs=("cold:auto", "warm:auto")):
    """bigmm on the HDF5 files, each of ``runs`` ("cache:writes[:plans]": cold or warm page
    cache, tiles written as ``bigmm.io.direct.MODE`` says, the planner's orders as
    :func:`orders.use_orders` says, default all), each profiled and checked. ``prewarm``: one
    untimed run first (kernels compiled, pinned staging allocated)."""
    from bigmm.io import direct

    out = {"runs": []}
    c_path = d / "c.h5"
    buf = np.empty((n, n), F32)
    kw = dict(memory=memory, host_memory=host_memory, backend="cupy")
    plan = bigmm.plan(spec_a, spec_b, f"{c_path}:/C", **kw)  # the plan for a file C
    out["plan"], out["plan_text"] = plan.to_dict(), str(plan)
    log(str(plan))
    if prewarm:
        t0 = time.perf_counter()
        bigmm.matmul(spec_a, spec_b, f"{c_path}:/C", overwrite=True, **kw)
        out["prewarm_seconds"] = time.perf_counter() - t0
    for run in runs:
        cache, mode, plans = (run + ":all").split(":")[:3]
        direct.MODE = mode
        use_orders(plans)
        if c_path.exists():
            c_path.unlink()
        p = bigmm.plan(spec_a, spec_b, f"{c_path}:/C", **kw)
        used = f"{p.order} {p.bm}x{p.bn}x{p.bk}"
        if cache == "cold":
            out["cold_by"] = storage.drop_caches(path_a, path_b)
        else:
            storage.warm([str(path_a), str(path_b)], 8)
        prof = Profile()
        t0 = time.perf_counter()
        _, stats = bigmm.matmul(spec_a, spec_b, f"{c_path}:/C", stats=True, profile=prof, **kw)
        t = time.perf_counter() - t0
        read_all(f"{c_path}:/C", buf)
        err = ref.check(buf, f"bigmm HDF5 {layout} {run}")
        summ = prof.summary()
        busy = {k: v["busy_seconds"] for k, v in summ.items()}
        out["runs"].append({"cache": cache, "writes": mode, "plans": plans,
                            "plan": used, "seconds": t,
                            "tflops": tflops(n, t), "rel_error": err,
                            "stats": stats.to_dict(), "busy": busy,
                            "profile_table": prof.table()})
        log(f"bigmm HDF5 {layout} {cache} writes={mode} plans={plans} ({used}): {t:.2f} s "
            f"({tflops(n, t):.1f} "
            f"TFLOP/s); busy " + ", ".join(f"{k} {v:.2f} s" for k, v in busy.items()))
        log(prof.table())
    direct.MODE = "auto"
    use_orders("all")
    c_path.unlink()
    for cache in ("cold", "warm"):
        times = [r for r in out["runs"] if r["cache"] == cache and r["writes"] == "auto"
                 and r["plans"] == "all"]
        if times:
            out[cache] = min(times, key=lambda r: r["seconds"])
    res.setdefault("bigmm_h5", {})[layout] = out


BOUNDED_CHILD = r"""
import json, sys, time
import bigmm
from bigmm.backends.cupy import pinned_bytes_held
a, b, c, memory, host, plans, scripts = sys.argv[1:8]
sys.path.insert(0, scripts)
from orders import use_orders
use_orders(plans)
kw = dict(memory=memory, host_memory=host, backend="cupy")
plan = bigmm.plan(a, b, c, **kw)
t0 = time.perf_counter()
_, stats = bigmm.matmul(a, b, c, overwrite=True, stats=True, **kw)
t = time.perf_counter() - t0
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print(json.dumps({"seconds": t, "plan": str(plan), "stats": stats.to_dict(),
                  "pinned_held": pinned_bytes_held(),
                  "vm_hwm": status["VmHWM"].strip(), "rss_anon": status["RssAnon"].strip()}))
"""


def bounded(spec_a, spec_b, path_a, path_b, n, memory, host_memory, limits, ref, d, res,
            plans=("all",)):
    """The job in a cgroup whose memory.max is far below A, B and C (cold page cache), at the
    first of ``limits`` it completes under; C checked; peaks of the cgroup's memory. The
    planner's orders as the first of ``plans`` says (:func:`orders.use_orders`); the others run
    after it at the same limit, each once (``res["bounded"]["plans"]``)."""
    out = {"attempts": [], "plans": {}}
    c_spec = f"{d / 'c_bounded.h5'}:/C"
    env = dict(os.environ)

    def attempt(limit: str, kind: str) -> dict:
        out["cold_by"] = storage.drop_caches(path_a, path_b)
        r = storage.bounded_run([sys.executable, "-c", BOUNDED_CHILD, spec_a, spec_b, c_spec,
                                 memory, host_memory, kind, str(Path(__file__).parent)],
                                parse_size(limit), env=env)
        r["limit_text"], r["plans"] = limit, kind
        log(f"bounded job, memory.max {limit}, plans {kind}: exit {r['rc']}, "
            f"{r['seconds']:.2f} s; peak {r['peak'] / 2**30:.2f} GiB (anon "
            f"{r['peak_anon'] / 2**30:.2f}, page cache {r['peak_file'] / 2**30:.2f}); events "
            f"{r['events']}; disk read {r['io']['rbytes'] / 2**30:.2f} GiB, written "
            f"{r['io']['wbytes'] / 2**30:.2f} GiB")
        if r["rc"] != 0:
            log(r["stderr"][-2000:])
            return r
        child = json.loads(r["stdout"].strip().splitlines()[-1])
        r["child"] = child
        buf = np.empty((n, n), F32)
        read_all(c_spec, buf)
        r["rel_error"] = ref.check(buf, f"bounded job {limit}")
        log(child["plan"])
        log(f"bounded job: matmul {child['seconds']:.2f} s, VmHWM {child['vm_hwm']}, "
            f"pinned {child['pinned_held'] / 2**30:.2f} GiB, C error {r['rel_error']:.2e}")
        return r

    for limit in limits:
        try:
            r = attempt(limit, plans[0])
        except OSError as exc:
            out["unavailable"] = str(exc)
            log(f"bounded job: no cgroup ({exc})")
            break
        out["attempts"].append(r)
        if r["rc"] != 0:
            continue
        out["result"] = r
        for kind in plans[1:]:
            out["plans"][kind] = attempt(limit, kind)
        break
    path = Path(c_spec.split(":/")[0])
    if path.exists():
        path.unlink()
    res["bounded"] = out


def dask_h5(path_a, path_b, n, chunk_list, caches, ref, d, res):
    """dask.array + CuPy on the same files, per chunk size and cache state."""
    import cupy
    import dask
    import dask.array as da

    out = {"dask_version": dask.__version__}
    c_path = d / "dask_c.h5"
    buf = np.empty((n, n), F32)
    meta_gpu, meta_cpu = cupy.empty((0, 0), F32), np.empty((0, 0), F32)
    for cache in caches:
        for ch in chunk_list:
            if c_path.exists():
                c_path.unlink()
            if cache == "cold":
                storage.drop_caches(path_a, path_b)
            else:
                storage.warm([str(path_a), str(path_b)], 8)
            t0 = time.perf_counter()
            with h5py.File(path_a, "r") as fa, h5py.File(path_b, "r") as fb, \
                    h5py.File(c_path, "w") as fc:
                a = da.from_array(fa["A"], chunks=(ch, ch)).map_blocks(
                    cupy.asarray, dtype=F32, meta=meta_gpu)
                b = da.from_array(fb["B"], chunks=(ch, ch)).map_blocks(
                    cupy.asarray, dtype=F32, meta=meta_gpu)
                c = (a @ b).map_blocks(cupy.asnumpy, dtype=F32, meta=meta_cpu)
                dset = fc.create_dataset("C", shape=(n, n), dtype=F32)
                da.store(c, dset, lock=True)
            fsync(c_path)
            t = time.perf_counter() - t0
            cupy.get_default_memory_pool().free_all_blocks()
            with h5py.File(c_path, "r") as fc:
                fc["C"].read_direct(buf)
            err = ref.check(buf, f"dask {cache} chunks {ch}")
            out[f"{cache}_{ch}"] = {"seconds": t, "tflops": tflops(n, t), "rel_error": err}
            log(f"dask+CuPy {cache} chunks {ch}: {t:.2f} s ({tflops(n, t):.1f} TFLOP/s)")
    if c_path.exists():
        c_path.unlink()
    res["dask"] = out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=32768)
    ap.add_argument("--memory", default="8GiB", help="bigmm's device budget")
    ap.add_argument("--dir", default="bench-out", help="directory for the HDF5 files")
    ap.add_argument("--out", default="bench-out/results", help="directory for results")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--parts", default="host,xt,floor,h5,dask")
    ap.add_argument("--xt-blocks", default="2048,4096,8192,16384")
    ap.add_argument("--dask-chunks", default="8192,16384")
    ap.add_argument("--dask-caches", default="cold,warm")
    ap.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--layouts", default="chunked,contiguous",
                    help="HDF5 layouts of the inputs; the first also gets the floor and dask")
    ap.add_argument("--h5-chunk", type=int, default=4096, help="chunk edge of 'chunked'")
    ap.add_argument("--h5-host-memory", default=None,
                    help="host staging budget of the HDF5 runs (default: bigmm's)")
    ap.add_argument("--h5-prewarm", action="store_true",
                    help="an untimed HDF5 run first (pins the staging buffers)")
    ap.add_argument("--verify-repeat", type=int, default=11,
                    help="timed runs each with and without checksums (--parts verify)")
    ap.add_argument("--kernel-repeat", type=int, default=50,
                    help="timed calls of each checksum kernel (--parts kernels)")
    ap.add_argument("--host-variants", default="",
                    help="extra host staging budgets for the own-kernel host run, e.g. 2GiB")
    ap.add_argument("--h5-runs", default="cold:auto,warm:auto,warm:mapped,warm:auto",
                    help="HDF5 runs as cache:writes[:plans] (cold|warm : auto|direct|mapped "
                         ": all|resident|quarter; resident: whole-a/-b not tried, "
                         "quarter: their tiles down to a quarter of C's width)")
    ap.add_argument("--bounded-plans", default="all",
                    help="the bounded job's planner orders, each run once: all, resident")
    ap.add_argument("--bounded-limits", default="4GiB,6GiB",
                    help="memory.max of the bounded job's cgroup, tried in turn (--parts "
                         "bounded)")
    ap.add_argument("--bounded-host-memory", default="2GiB",
                    help="host staging budget of the bounded job")
    ap.add_argument("--in-core", default="cublas,bigmm",
                    help="in-core products to time (cublas is the reference)")
    args = ap.parse_args(argv)

    import cupy

    n, parts = args.n, set(args.parts.split(","))
    d, out_dir = Path(args.dir), Path(args.out)
    d.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    res = {"n": n, "memory": args.memory, "memory_bytes": parse_size(args.memory),
           "h5_host_memory": args.h5_host_memory, "h5_prewarm": args.h5_prewarm,
           "device": name, "command": " ".join(sys.argv), "host": platform.node(),
           "cpus": os.cpu_count(), "cupy": cupy.__version__,
           "disk": {"dir": str(d.resolve()), "free_bytes": shutil.disk_usage(d).free}}
    json_path = out_dir / "bench_e2e.json"

    def save():
        json_path.write_text(json.dumps(res, indent=1, default=str))

    t0 = time.perf_counter()
    a, b = random_f32(n, 1, args.threads), random_f32(n, 2, args.threads)
    res["generate_seconds"] = time.perf_counter() - t0
    log(f"generated A, B ({n} x {n} float32) in {res['generate_seconds']:.1f} s on {name}")
    ref = in_core(a, b, n, args.repeat, res, tuple(args.in_core.split(",")))
    save()
    prof_dir = out_dir / "profiles"
    prof_dir.mkdir(exist_ok=True)
    if "kernels" in parts:
        checksum_kernels(a, b, args.memory, args.kernel_repeat, res)
        save()
    pinned = pinned_operands(a, b, n, res) if parts & {"host", "xt"} else None
    if "host" in parts:
        variants = [v for v in args.host_variants.split(",") if v]
        bigmm_host(a, b, n, args.memory, args.repeat, ref, prof_dir, res, variants, pinned)
        save()
    if "xt" in parts:
        cublasxt(a, b, n, [int(x) for x in args.xt_blocks.split(",")], ref, res, pinned)
        save()
    pinned = None  # frees the page-locked operands
    if parts & {"h5", "dask", "verify", "floor", "bounded"}:
        c_host = ref.c.get()
        for i, layout in enumerate(args.layouts.split(",")):
            chunk = args.h5_chunk if layout == "chunked" else None
            t0 = time.perf_counter()
            path_a, path_b = d / f"a_{layout}.h5", d / f"b_{layout}.h5"
            spec_a, spec_b = write_h5(path_a, "A", a, chunk), write_h5(path_b, "B", b, chunk)
            res[f"write_inputs_{layout}_seconds"] = time.perf_counter() - t0
            if "floor" in parts and i == 0:
                floor(path_a, path_b, c_host, args.threads, d, res)
                save()
            if "h5" in parts:
                bigmm_h5(spec_a, spec_b, path_a, path_b, n, args.memory, ref, d, prof_dir, res,
                         layout, args.h5_host_memory, args.h5_prewarm,
                         args.h5_runs.split(","))
                save()
            if "bounded" in parts and i == 0:
                bounded(spec_a, spec_b, path_a, path_b, n, args.memory,
                        args.bounded_host_memory, args.bounded_limits.split(","), ref, d, res,
                        args.bounded_plans.split(","))
                save()
            if "verify" in parts and i == 0:
                verify_overhead(spec_a, spec_b, a, b, n, args.memory, ref, d,
                                args.verify_repeat, res)
                save()
            if "dask" in parts and i == 0:
                res["dask_layout"] = layout
                dask_h5(path_a, path_b, n, [int(x) for x in args.dask_chunks.split(",")],
                        args.dask_caches.split(","), ref, d, res)
                save()
            path_a.unlink()
            path_b.unlink()
    res["table"] = summary_table(res)
    save()
    log("")
    log(res["table"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
