#!/usr/bin/env python3
"""Zarr against HDF5 on the same data: bigmm's readers, bigmm jobs, and dask.array + CuPy.

One n x n float32 A and B (standard normal, made once in memory) are written in every layout
of ``--layouts`` to both formats (all files fsynced):

* ``contiguous``: HDF5 contiguous; Zarr uncompressed chunks of whole rows (``--row-chunk``
  rows each), the nearest Zarr has to contiguous;
* ``chunked``: both uncompressed, ``--chunk`` x ``--chunk`` chunks;
* ``gzip``: both gzip level 1 (HDF5's deflate filter, Zarr's gzip codec), ``--chunk`` square;
* ``zstd``: both zstd level 1 (hdf5plugin's filter, Zarr's zstd codec), ``--chunk`` square.

Parts (``--parts``):

* ``io`` (no GPU needed): the read throughput of A, in row panels of ``--panel`` rows, by
  bigmm's HDF5 reader and its Zarr reader (``--threads`` reader threads), and by zarr-python
  itself (``Array.get_basic_selection`` into the same buffer; with zarr >= 3.4 also under its
  opt-in FusedCodecPipeline), cold page cache (``posix_fadvise(DONTNEED)`` on every file after
  an fsync) and warm; each result checked against A.
* ``jobs``: ``bigmm.matmul`` of the HDF5 files into an HDF5 C against the same job on the Zarr
  stores into a Zarr C (same budgets, so the same plan), cold and warm (each the median of
  ``--repeat``, the two formats interleaved, the first of each pair alternating); every C
  checked against the in-core product (cuBLAS without TF32 on the GPU) before its time counts.
  C goes to ``--out-dir`` (default: beside the inputs; a tmpfs such as /dev/shm takes the disk
  out of the comparison).
* ``dask``: dask.array + CuPy reading the Zarr store of each of ``--dask-layouts``
  (``da.from_zarr`` at ``--dask-chunks``, ``map_blocks(cupy.asarray)``, ``@``, back to NumPy,
  ``to_zarr``), cold and warm, checked like the jobs.

Writes ``bench_zarr.json`` to ``--out`` and prints a short table last: per layout the warm
and cold seconds of both formats and Zarr/HDF5 (targets: warm <= 1.1, cold <= 1.0).

    PYTHONPATH=. python scripts/bench_zarr.py --n 16384 --memory 2GiB --dir /tmp/bz --out res
    PYTHONPATH=. python scripts/bench_zarr.py --n 4096 --parts io --threads 2   # CPU only

Under a time limit, ``timeout -s INT`` stops it with the JSON and the table of what was measured.
"""

from __future__ import annotations

import os

os.environ.setdefault("CUPY_TF32", "0")  # cupy.matmul (reference, dask chunks) without TF32

import argparse  # noqa: E402
import concurrent.futures as cf  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import zlib  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import h5py  # noqa: E402
import numpy as np  # noqa: E402

import bigmm  # noqa: E402
from bigmm import io as bio  # noqa: E402
from bigmm.io.zarrsource import ZarrSource  # noqa: E402
from e2e_common import log, random_f32, tflops  # noqa: E402
from orders import PLANS, use_orders  # noqa: E402
from storage import evict  # noqa: E402

F32 = np.float32
LAYOUTS = ("contiguous", "chunked", "gzip", "zstd")


def files_of(path: Path) -> list[str]:
    if path.is_dir():
        return [os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs]
    return [str(path)]


def fsync_tree(path: Path) -> None:
    for p in files_of(path):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def drop_cache(*paths: Path) -> None:
    """Evict the files' pages (flushed first, so that they can be dropped)."""
    for path in paths:
        for p in files_of(path):
            evict(p)


def _compress(codec: str, block: np.ndarray) -> bytes:
    data = np.ascontiguousarray(block).tobytes()
    if codec == "gzip":
        return zlib.compress(data, 1)
    import numcodecs

    return numcodecs.Zstd(level=1).encode(data)


def write_h5(path: Path, x: np.ndarray, layout: str, chunk: int, threads: int) -> str:
    """x as dataset /X: contiguous, chunked, or chunks compressed in parallel threads and
    written with write_direct_chunk (the bytes HDF5's filter would write)."""
    import hdf5plugin

    n = x.shape[0]
    with h5py.File(path, "w") as f:
        if layout == "contiguous":
            d = f.create_dataset("X", shape=x.shape, dtype=F32)
            step = max(1, (256 << 20) // (n * 4))
            for r in range(0, n, step):
                d[r:r + step] = x[r:r + step]
        elif layout == "chunked":
            d = f.create_dataset("X", shape=x.shape, dtype=F32, chunks=(chunk, chunk))
            for r in range(0, n, chunk):
                d[r:r + chunk] = x[r:r + chunk]
        else:
            filt = ({"compression": "gzip", "compression_opts": 1} if layout == "gzip"
                    else dict(hdf5plugin.Zstd(clevel=1)))
            d = f.create_dataset("X", shape=x.shape, dtype=F32, chunks=(chunk, chunk), **filt)
            cells = [(i, j) for i in range(0, n, chunk) for j in range(0, n, chunk)]

            def one(cell):
                i, j = cell
                blk = np.zeros((chunk, chunk), F32)
                part = x[i:i + chunk, j:j + chunk]
                blk[:part.shape[0], :part.shape[1]] = part
                return cell, _compress(layout, blk)

            with cf.ThreadPoolExecutor(threads) as pool:
                for (i, j), raw in pool.map(one, cells):
                    d.id.write_direct_chunk((i, j), raw, 0)
    fsync_tree(path)
    return f"{path}:/X"


def write_zarr(path: Path, x: np.ndarray, layout: str, chunk: int, row_chunk: int) -> str:
    import zarr
    from zarr import codecs

    n = x.shape[0]
    chunks = (row_chunk, n) if layout == "contiguous" else (chunk, chunk)
    comp = {"gzip": [codecs.GzipCodec(level=1)], "zstd": [codecs.ZstdCodec(level=1)]}.get(layout)
    if path.exists():
        shutil.rmtree(path)
    arr = zarr.create_array(store=str(path), shape=x.shape, chunks=chunks, dtype=F32,
                            compressors=comp, filters=None, fill_value=0.0)
    step = max(chunks[0], (512 << 20) // (n * 4) // chunks[0] * chunks[0])
    for r in range(0, n, step):
        arr[r:r + step] = x[r:r + step]
    fsync_tree(path)
    return str(path)


def make_data(args, d: Path) -> dict:
    t0 = time.perf_counter()
    a = random_f32(args.n, 1, args.threads)
    b = random_f32(args.n, 2, args.threads)
    specs = {}
    for lay in args.layouts:
        row = {}
        for name, x in (("A", a), ("B", b)):
            row[("h5", name)] = write_h5(d / f"{lay}_{name}.h5", x, lay, args.chunk,
                                         args.threads)
            row[("zarr", name)] = write_zarr(d / f"{lay}_{name}.zarr", x, lay, args.chunk,
                                             args.row_chunk)
        specs[lay] = row
        log(f"wrote {lay}: {time.perf_counter() - t0:.1f} s so far")
    return {"a": a, "b": b, "specs": specs}


def spec_path(spec: str) -> Path:
    return Path(bio.parse_spec(spec).path)


# ----- checks -------------------------------------------------------------------------------

class Reference:
    """The in-core product (cuBLAS without TF32 on the GPU, else NumPy) and a check of a C."""

    def __init__(self, a, b, gpu: bool):
        self.gpu = gpu
        if gpu:
            import cupy

            c = cupy.asarray(a) @ cupy.asarray(b)
            self.c = cupy.asnumpy(c)
            del c
            cupy.get_default_memory_pool().free_all_blocks()
        else:
            self.c = a @ b
        self.norm = float(np.linalg.norm(self.c))
        self.tol = 1e-5

    def check(self, spec_or_array, what: str) -> float:
        if isinstance(spec_or_array, np.ndarray):
            got = spec_or_array
        else:
            src = bio.open_input(spec_or_array)
            got = np.empty(src.shape, F32)
            src.read(0, src.shape[0], 0, src.shape[1], got)
            src.close()
        err = float(np.linalg.norm(got - self.c)) / self.norm
        if not err <= self.tol:
            raise SystemExit(f"{what}: relative error {err:.3g} > {self.tol} (wrong product)")
        return err


# ----- io -----------------------------------------------------------------------------------

def read_panels(read, n: int, panel: int, buf: np.ndarray) -> None:
    for r in range(0, n, panel):
        r1 = min(n, r + panel)
        read(r, r1, buf[:r1 - r])


def io_part(args, data, res) -> None:
    import zarr

    out = {}
    n, panel = args.n, args.panel
    buf = np.empty((panel, n), F32)
    a = data["a"]
    fused = "zarr.core.codec_pipeline.FusedCodecPipeline"
    has_fused = hasattr(__import__("zarr.core.codec_pipeline").core.codec_pipeline,
                        "FusedCodecPipeline")
    for lay in args.layouts:
        h5, zs = data["specs"][lay][("h5", "A")], data["specs"][lay][("zarr", "A")]
        readers = {
            "bigmm-hdf5": (h5, lambda s: bio.open_input(s, threads=args.threads)),
            "bigmm-zarr": (zs, lambda s: bio.open_input(s, threads=args.threads)),
            "zarr-python": (zs, lambda s: bio.open_input(s)),
        }
        if has_fused:
            readers["zarr-python-fused"] = (zs, lambda s: bio.open_input(s))
        for cache in ("cold", "warm"):
            for name, (spec, opener) in readers.items():
                if name == "zarr-python-fused":
                    zarr.config.set({"codec_pipeline.path": fused})
                src = opener(spec)
                if name.startswith("zarr-python"):
                    def read(r0, r1, o, src=src):
                        ZarrSource._read_zarr(src, r0, r1, 0, n, o)
                else:
                    def read(r0, r1, o, src=src):
                        src.read(r0, r1, 0, n, o)
                best = []
                for rep in range(1 if cache == "cold" else args.repeat):
                    if cache == "cold":
                        drop_cache(spec_path(spec))
                    t0 = time.perf_counter()
                    read_panels(read, n, panel, buf)
                    best.append(time.perf_counter() - t0)
                src.close()
                if name == "zarr-python-fused":
                    zarr.config.set({"codec_pipeline.path":
                                     "zarr.core.codec_pipeline.BatchedCodecPipeline"})
                last = n - (n - 1) // panel * panel
                assert np.array_equal(buf[:last], a[n - last:]), (lay, name)
                t = min(best)
                key = f"{lay}/{name}/{cache}"
                out[key] = {"seconds": t, "gb_per_s": a.nbytes / t / 1e9,
                            "layout": getattr(src, "layout", "")}
                log(f"io {key:38s} {a.nbytes / t / 1e9:7.2f} GB/s ({src.layout})")
    res["io"] = out


# ----- jobs ---------------------------------------------------------------------------------

def job_part(args, data, ref, res, out_dir: Path) -> None:
    out = {}
    kw = dict(memory=args.memory, backend=args.backend)
    if args.host_memory:
        kw["host_memory"] = args.host_memory
    for lay in args.layouts:
        sp = data["specs"][lay]
        outs = {"h5": out_dir / "c.h5", "zarr": out_dir / "c.zarr"}
        targets = {"h5": f"{outs['h5']}:/C", "zarr": str(outs["zarr"])}

        def run(fmt, cold: bool):
            p = outs[fmt]
            if p.exists():
                shutil.rmtree(p) if p.is_dir() else p.unlink()
            if cold:
                drop_cache(*(spec_path(sp[(fmt, x)]) for x in "AB"))
            t0 = time.perf_counter()
            _, st = bigmm.matmul(sp[(fmt, "A")], sp[(fmt, "B")], targets[fmt], stats=True, **kw)
            t = time.perf_counter() - t0
            err = ref.check(targets[fmt], f"{lay} {fmt}")
            return t, err, st

        plan = bigmm.plan(sp[("h5", "A")], sp[("h5", "B")], targets["h5"], **kw)
        zplan = bigmm.plan(sp[("zarr", "A")], sp[("zarr", "B")], targets["zarr"], **kw)
        row = {"plan": plan.key(), "zarr_plan": zplan.key(), "plans": args.plans,
               "same_plan": (plan.bm, plan.bn, plan.bk, plan.order)
               == (zplan.bm, zplan.bn, zplan.bk, zplan.order)}
        log(f"plans {args.plans}: HDF5 job {plan.order} {plan.bm}x{plan.bn}x{plan.bk}, Zarr job "
            f"{zplan.order} {zplan.bm}x{zplan.bn}x{zplan.bk}")
        for fmt in ("h5", "zarr"):  # warm-up (kernels, pinned buffers), checked
            run(fmt, cold=False)
        for cache in ("cold", "warm"):  # each the median of --repeat, the formats interleaved
            times = {"h5": [], "zarr": []}
            busy = {"h5": [], "zarr": []}
            for rep in range(args.repeat):
                order = ("h5", "zarr") if rep % 2 == 0 else ("zarr", "h5")
                for fmt in order:
                    t, err, st = run(fmt, cold=cache == "cold")
                    times[fmt].append(t)
                    busy[fmt].append((st.read_busy, st.write_busy))
            for fmt in ("h5", "zarr"):
                t = statistics.median(times[fmt])
                row[f"{fmt}_{cache}"] = {"seconds": t, "tflops": tflops(args.n, t),
                                         "all": times[fmt], "busy": busy[fmt]}
                log(f"job {lay} {fmt} {cache}: median {t:.3f} s of "
                    f"{[round(x, 3) for x in times[fmt]]}")
            row[f"{cache}_ratio"] = row[f"zarr_{cache}"]["seconds"] / row[f"h5_{cache}"]["seconds"]
            row[f"{cache}_ratio_pairs"] = [z / h for z, h in zip(times["zarr"], times["h5"])]
        out[lay] = row
        for p in outs.values():
            if p.exists():
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    res["jobs"] = out


# ----- dask ---------------------------------------------------------------------------------

def dask_part(args, data, ref, res, out_dir: Path) -> None:
    import dask
    import dask.array as da

    gpu = args.backend != "numpy"
    if gpu:
        import cupy

        meta_gpu = cupy.empty((0, 0), F32)
    meta_cpu = np.empty((0, 0), F32)
    out = {"dask_version": dask.__version__}
    c_path = out_dir / "dask_c.zarr"
    for lay in args.dask_layouts:
        sp = data["specs"][lay]
        for ch in args.dask_chunks:
            for cache in ("cold", "warm"):
                if c_path.exists():
                    shutil.rmtree(c_path)
                if cache == "cold":
                    drop_cache(*(spec_path(sp[("zarr", x)]) for x in "AB"))
                t0 = time.perf_counter()
                a = da.from_zarr(sp[("zarr", "A")], chunks=(ch, ch))
                b = da.from_zarr(sp[("zarr", "B")], chunks=(ch, ch))
                if gpu:
                    a = a.map_blocks(cupy.asarray, dtype=F32, meta=meta_gpu)
                    b = b.map_blocks(cupy.asarray, dtype=F32, meta=meta_gpu)
                    c = (a @ b).map_blocks(cupy.asnumpy, dtype=F32, meta=meta_cpu)
                else:
                    c = a @ b
                c.to_zarr(str(c_path), overwrite=True)
                fsync_tree(c_path)
                t = time.perf_counter() - t0
                if gpu:
                    cupy.get_default_memory_pool().free_all_blocks()
                err = ref.check(str(c_path), f"dask {lay} {ch} {cache}")
                out[f"{lay}/{ch}/{cache}"] = {"seconds": t, "tflops": tflops(args.n, t),
                                              "rel_error": err}
                log(f"dask+{'CuPy' if gpu else 'NumPy'} {lay} chunks {ch} {cache}: {t:.2f} s")
    if c_path.exists():
        shutil.rmtree(c_path)
    res["dask"] = out


# ----- report -------------------------------------------------------------------------------

def table(res) -> str:
    lines = [f"== bench_zarr n={res['n']} float32, {res['device']}, budget {res['memory']}, "
             f"zarr {res['zarr_version']} =="]
    for key, v in (res.get("io") or {}).items():
        lines.append(f"read {key:40s} {v['gb_per_s']:7.2f} GB/s")
    for lay, row in (res.get("jobs") or {}).items():
        w, c = row["warm_ratio"], row["cold_ratio"]
        lines.append(
            f"job {lay:10s} warm h5 {row['h5_warm']['seconds']:7.3f} s zarr "
            f"{row['zarr_warm']['seconds']:7.3f} s ratio {w:5.2f} ({'met' if w <= 1.1 else 'MISSED'}"
            f" <= 1.1) | cold h5 {row['h5_cold']['seconds']:7.3f} s zarr "
            f"{row['zarr_cold']['seconds']:7.3f} s ratio {c:5.2f} "
            f"({'met' if c <= 1.0 else 'MISSED'} <= 1.0)")
    for key, v in (res.get("dask") or {}).items():
        if key != "dask_version":
            lines.append(f"dask {key:20s} {v['seconds']:8.3f} s {v['tflops']:6.1f} TFLOP/s")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--layouts", default="contiguous,chunked,gzip,zstd")
    ap.add_argument("--parts", default="io,jobs,dask")
    ap.add_argument("--chunk", type=int, default=1024, help="square chunk edge")
    ap.add_argument("--row-chunk", type=int, default=256, help="rows per Zarr 'contiguous' chunk")
    ap.add_argument("--panel", type=int, default=4096, help="rows per read in the io part")
    ap.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--memory", default="2GiB", help="device budget of the jobs")
    ap.add_argument("--host-memory", default=None)
    ap.add_argument("--backend", default="cupy")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--plans", default="all", choices=PLANS,
                    help="the planner's orders (resident: whole-a/-b not tried; quarter: "
                         "their tiles down to a quarter of C's width)")
    ap.add_argument("--dask-layouts", default="chunked")
    ap.add_argument("--dask-chunks", default="4096")
    ap.add_argument("--dir", default="bench-zarr-data")
    ap.add_argument("--out-dir", default=None, help="where C goes (default: --dir)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--keep", action="store_true", help="keep the data files")
    args = ap.parse_args(argv)
    args.layouts = [x for x in args.layouts.split(",") if x]
    args.parts = [x for x in args.parts.split(",") if x]
    args.dask_layouts = [x for x in args.dask_layouts.split(",") if x in args.layouts]
    use_orders(args.plans)
    args.dask_chunks = [int(x) for x in args.dask_chunks.split(",") if x]
    for lay in args.layouts:
        if lay not in LAYOUTS:
            raise SystemExit(f"unknown layout {lay!r}; choose from {', '.join(LAYOUTS)}")
    import zarr

    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    out_dir = Path(args.out_dir) if args.out_dir else d
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = args.backend != "numpy"
    device = f"CPU {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"
    if gpu:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        device = f"{props['name'].decode()}, {os.cpu_count()} CPU cores"
    res = {"n": args.n, "memory": args.memory, "device": device, "zarr_version": zarr.__version__,
           "threads": args.threads, "layouts": args.layouts, "date": time.strftime("%Y-%m-%d"),
           "argv": sys.argv[1:]}
    t0 = time.perf_counter()
    data = make_data(args, d)
    res["write_seconds"] = time.perf_counter() - t0
    try:
        if "io" in args.parts:
            io_part(args, data, res)
        ref = Reference(data["a"], data["b"], gpu) if {"jobs", "dask"} & set(args.parts) \
            else None
        if "jobs" in args.parts:
            job_part(args, data, ref, res, out_dir)
        if "dask" in args.parts:
            dask_part(args, data, ref, res, out_dir)
    finally:
        res["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        res["seconds"] = time.perf_counter() - t0
        Path(args.out).mkdir(parents=True, exist_ok=True)
        with open(Path(args.out) / "bench_zarr.json", "w") as f:
            json.dump(res, f, indent=2, default=str)
        if not args.keep:
            shutil.rmtree(d, ignore_errors=True)
        log(table(res))  # what was measured, even after an interruption (timeout -s INT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
