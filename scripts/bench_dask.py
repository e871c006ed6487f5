"""dask benchmarks: bigmm.dask.matmul against dask.array's own ``@``, and GPU scaling.

CPU mode (default): on a fresh LocalCluster of worker processes for every measured run, the
same random dask arrays (generated on the workers from one seed) are multiplied by
``bigmm.dask.matmul`` and by ``a @ b``; the two products are checked against each other and
with Freivalds' probe in float64 before anything is timed. Each method runs once to warm up,
then the peak resident memory of every worker is reset (Linux ``/proc/self/clear_refs``) and
the timed run persists the product on the workers (every C block stays in worker memory:
n*n*w/workers bytes per worker belong to C itself). Reported: wall time, peak RSS per worker,
and the worker's RSS before the run.

    python scripts/bench_dask.py --size 6000 --chunks 1000 --workers 2
    python scripts/bench_dask.py --m 2000 --k 24000 --n 2000 --chunks 1000 --workers 2

GPU mode (``--gpus``): the scaling of one HDF5 job (n x n float32, compute-bound) on a
LocalCUDACluster of 1 GPU and then of ``--gpus`` GPUs (one worker per GPU, one bigmm task per
GPU at a time) through ``bigmm.dask.matmul_files``. The same job runs once to warm up (kernels
compiled, pinned buffers made in every worker), then is timed and verified. Each worker writes
its tiles of C (4 GiB at n = 32768) durably into C's file: at about 1 GB/s to disk that alone
can take longer than the product on one GPU, so ``--out-dir /dev/shm`` measures the compute
scaling and the default (C beside the inputs) the end-to-end time; the busy times printed
tell which bound. ``--backend numpy`` runs the same flow on CPU worker processes (a check of
the script, not a measurement).

    python scripts/bench_dask.py --gpus 2 --size 32768 --dir /data/bench --out-dir /dev/shm
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np

import bigmm.dask as bd
from bigmm.units import format_bytes


# ----- per-worker memory --------------------------------------------------------------------

def _status() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) * 1024
    return out


def _reset_peak() -> int:
    """Reset this process's peak RSS to its current RSS; return the current RSS."""
    import gc

    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status()["VmRSS"]


def _peak() -> int:
    return _status()["VmHWM"]


# ----- CPU: bigmm.dask.matmul against dask.array @ ------------------------------------------

def _inputs(m, k, n, chunks_a, chunks_b, dtype, seed):
    import dask.array as da

    rng = da.random.default_rng(seed)
    a = rng.standard_normal((m, k), chunks=chunks_a, dtype=np.float64).astype(dtype)
    b = rng.standard_normal((k, n), chunks=chunks_b, dtype=np.float64).astype(dtype)
    return a, b


def _product(method, a, b):
    return bd.matmul(a, b) if method == "bigmm" else a @ b


def _check(args) -> dict:
    """Both products on one cluster: against each other and Freivalds' probe in float64."""
    import distributed

    with _cluster(args) as client:
        a, b = _inputs(*_shape(args), args.dtype, args.seed)
        A, B = client.persist([a, b])
        distributed.wait([A, B])
        ours = _product("bigmm", A, B).compute()
        theirs = _product("dask", A, B).compute()
        x = np.random.default_rng(1).standard_normal(ours.shape[1])
        bx = (B.astype(np.float64) @ x).compute()
        probe = (A.astype(np.float64) @ bx).compute()
    scale = np.linalg.norm(probe)
    return {"bigmm_vs_dask": float(np.linalg.norm(ours - theirs) / np.linalg.norm(theirs)),
            "freivalds_bigmm": float(np.linalg.norm(ours.astype(np.float64) @ x - probe) / scale),
            "freivalds_dask": float(np.linalg.norm(theirs.astype(np.float64) @ x - probe) / scale)}


def _shape(args):
    m, k, n = args.m or args.size, args.k or args.size, args.n or args.size
    ca = (args.chunks, args.chunks_k or args.chunks)
    cb = (args.chunks_k_b or args.chunks_k or args.chunks, args.chunks)
    return m, k, n, ca, cb


class _cluster:
    def __init__(self, args):
        self.args = args

    def __enter__(self):
        import dask

        # Measure memory as used: no spilling, pausing or restarting on memory thresholds.
        self._cfg = dask.config.set({"distributed.worker.memory.target": False,
                                     "distributed.worker.memory.spill": False,
                                     "distributed.worker.memory.pause": False,
                                     "distributed.worker.memory.terminate": False})
        self._cfg.__enter__()
        self._cm = bd.local_cluster(self.args.workers, backend="numpy",
                                    memory_limit=self.args.worker_memory)
        return self._cm.__enter__()

    def __exit__(self, *exc):
        self._cm.__exit__(*exc)
        self._cfg.__exit__(*exc)
        return False


def _measure(args, method) -> dict:
    import distributed

    with _cluster(args) as client:
        a, b = _inputs(*_shape(args), args.dtype, args.seed)
        a, b = client.persist([a, b])  # the inputs live on the workers before the clock starts
        distributed.wait([a, b])
        c = client.persist(_product(method, a, b))  # warm-up
        distributed.wait(c)
        del c
        _settle(client, len(a.dask) + len(b.dask))
        base = client.run(_reset_peak)
        t0 = time.perf_counter()
        c = client.persist(_product(method, a, b))
        distributed.wait(c)
        seconds = time.perf_counter() - t0
        peak = client.run(_peak)
        tasks = len(_product(method, a, b).dask) - len(a.dask) - len(b.dask)
        del c
    return {"method": method, "seconds": seconds, "tasks": tasks,
            "rss_before": sorted(base.values()), "peak_rss": sorted(peak.values()),
            "peak_over_before": sorted(peak[w] - base[w] for w in peak)}


def _settle(client, keys: int, timeout: float = 60.0) -> None:
    """Wait until the scheduler holds only the inputs (the warm-up's product is released)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) <= keys:
            return
        time.sleep(0.1)
    raise SystemExit("the warm-up product was not released")


def run_cpu(args) -> dict:
    m, k, n, ca, cb = _shape(args)
    w = np.dtype(args.dtype).itemsize
    result = {"mode": "cpu", "m": m, "k": k, "n": n, "dtype": args.dtype, "chunks_a": ca,
              "chunks_b": cb, "workers": args.workers, "threads_per_worker": 1,
              "machine": f"{platform.node()} {os.cpu_count()} cores {platform.machine()}",
              "python": sys.version.split()[0]}
    import dask
    import distributed

    result["versions"] = f"dask {dask.__version__}, distributed {distributed.__version__}"
    result["check"] = _check(args)
    tol = 1e-4 if args.dtype == "float32" else 1e-10
    if max(result["check"].values()) > tol:
        raise SystemExit(f"products disagree: {result['check']}")
    runs = []
    for _ in range(args.repeat):
        for method in ("dask", "bigmm"):
            runs.append(_measure(args, method))
    result["runs"] = runs
    for method in ("dask", "bigmm"):
        mine = [r for r in runs if r["method"] == method]
        result[method] = {"seconds_best": min(r["seconds"] for r in mine),
                          "gflops_best": 2 * m * n * k / min(r["seconds"] for r in mine) / 1e9,
                          "peak_rss_max": max(max(r["peak_rss"]) for r in mine),
                          "peak_over_before_max": max(max(r["peak_over_before"]) for r in mine),
                          "tasks": mine[0]["tasks"]}
    result["c_bytes_per_worker"] = m * n * w // args.workers
    return result


def _print_cpu(r: dict) -> None:
    print(f"C[{r['m']} x {r['n']}] = A @ B, depth {r['k']}, {r['dtype']}; chunks A {r['chunks_a']}, "
          f"B {r['chunks_b']}; {r['workers']} workers x 1 thread; {r['versions']}")
    print(f"check: {r['check']}")
    print(f"C itself: {format_bytes(r['c_bytes_per_worker'])} per worker")
    for method in ("dask", "bigmm"):
        s = r[method]
        print(f"{method:6s} best {s['seconds_best']:.2f} s ({s['gflops_best']:.1f} GFLOP/s), "
              f"{s['tasks']} tasks, peak RSS per worker {format_bytes(s['peak_rss_max'])} "
              f"(+{format_bytes(s['peak_over_before_max'])} over its RSS before the run)")
    for x in r["runs"]:
        print(f"  {x['method']:6s} {x['seconds']:.2f} s  peak {[format_bytes(p) for p in x['peak_rss']]}"
              f"  before {[format_bytes(p) for p in x['rss_before']]}")


# ----- GPUs: one job on 1 GPU and on N GPUs ---------------------------------------------------

def run_gpus(args) -> dict:
    from bigmm.io.generate import generate
    from bigmm.verify import verify

    n, dtype = args.size, args.dtype
    folder = args.dir or tempfile.mkdtemp(prefix="bigmm-dask-")
    out_dir = args.out_dir or folder
    os.makedirs(folder, exist_ok=True)
    os.makedirs(out_dir, exist_ok=True)
    a, b = f"{folder}/a{n}.h5:/A", f"{folder}/b{n}.h5:/B"
    for spec, seed in ((a, 1), (b, 2)):
        if not os.path.exists(spec.rsplit(":", 1)[0]):
            generate(spec, (n, n), dtype=dtype, seed=seed)
    for path in (a, b):  # warm the page cache
        with open(path.rsplit(":", 1)[0], "rb") as f:
            while f.read(1 << 26):
                pass
    result = {"mode": "gpus", "n": n, "dtype": dtype, "memory": args.memory, "out_dir": out_dir,
              "runs": []}
    for gpus in sorted({1, args.gpus}):
        with bd.local_cluster(gpus, backend=args.backend) as client:
            kw = dict(client=client, backend=args.backend, memory=args.memory, overwrite=True,
                      stats=True)
            c = f"{out_dir}/c{n}-{gpus}.h5:/C"
            bd.matmul_files(a, b, c, **kw)  # warm-up: kernels compiled, pinned buffers made
            t0 = time.perf_counter()
            _, stats = bd.matmul_files(a, b, c, **kw)
            seconds = time.perf_counter() - t0
            check = verify(a, b, c)
            if not check.passed:
                raise SystemExit(f"wrong product on {gpus} GPU(s): {check}")
            busy = {k: round(v, 3) for k, v in stats.busy.items()}
            # the calling process's own time: before the first tile task is submitted (the
            # workers' budgets, the inputs opened, the plan, C created and reserved) and after
            # the last tile is journaled (C marked complete)
            setup = seconds - stats.seconds
            result["runs"].append({"gpus": gpus, "seconds": seconds, "setup_seconds": setup,
                                   "tflops": 2 * n ** 3 / seconds / 1e12,
                                   "tiles": stats.tiles_total, "busy_summed": busy,
                                   "verified": str(check)})
            print(f"{gpus} GPU(s): {seconds:.2f} s (set-up and finish {setup:.2f} s), "
                  f"{2 * n ** 3 / seconds / 1e12:.2f} TFLOP/s, {stats.tiles_total} tiles; busy (summed over tasks; write = the workers' "
                  f"writes into C and this process's journaling) "
                  f"{busy}; {check}", flush=True)
    if len(result["runs"]) == 2:
        one, many = result["runs"]
        result["speedup"] = one["seconds"] / many["seconds"]
        print(f"speedup {args.gpus} GPUs / 1 GPU: {result['speedup']:.2f}x")
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=6000, help="n for n x n operands")
    p.add_argument("--m", type=int, default=None)
    p.add_argument("--k", type=int, default=None)
    p.add_argument("--n", type=int, default=None)
    p.add_argument("--chunks", type=int, default=1000, help="chunk edge of A rows, B columns")
    p.add_argument("--chunks-k", type=int, default=None, help="K chunk of A (default --chunks)")
    p.add_argument("--chunks-k-b", type=int, default=None,
                   help="K chunk of B (default: A's); unequal K chunkings are the general case")
    p.add_argument("--dtype", default="float64", choices=("float32", "float64"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--worker-memory", default="8GiB", help="dask memory limit per worker")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gpus", type=int, default=None,
                   help="GPU mode: one HDF5 job on 1 GPU, then on this many")
    p.add_argument("--backend", default="cupy",
                   help="GPU mode: backend of the workers (numpy runs the same flow on CPU "
                        "worker processes, to check the script)")
    p.add_argument("--memory", default=None, help="GPU mode: budget per task (default: auto)")
    p.add_argument("--dir", default=None, help="GPU mode: folder for the HDF5 files")
    p.add_argument("--out-dir", default=None,
                   help="GPU mode: folder for C (default --dir; /dev/shm takes the disk's "
                        "write speed out of the measurement)")
    p.add_argument("--json", default=None, help="also write the result as JSON here")
    args = p.parse_args(argv)
    if args.gpus:
        if args.dtype == "float64" and "--dtype" not in (argv or sys.argv):
            args.dtype = "float32"
        if args.size == 6000 and "--size" not in (argv or sys.argv):
            args.size = 32768
        result = run_gpus(args)
    else:
        result = run_cpu(args)
        _print_cpu(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
