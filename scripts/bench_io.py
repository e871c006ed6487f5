"""Warm-file I/O throughput: bigmm's raw read paths against h5py ``read_direct``, and C writes.

Creates (once) an HDF5 file with a contiguous, a chunked and a gzip-compressed (shuffled,
level 1) float32 dataset of about ``--gib`` GiB each, reads it once to warm the page cache,
then reads it panel by panel (``--rows`` x ``--cols`` panels, default ``--block`` square) with
h5py ``read_direct``, with bigmm's memory-mapped copies and with its parallel ``preadv``, and
prints GB/s, CPU seconds per pass (all threads) and the ratio of the default path (mapped for
raw datasets) to ``read_direct``. ``--writes`` also times writing a C of the same shape tile by
tile through the output layer: copies into a shared memory map (the default, after
``posix_fallocate``) and ``O_DIRECT`` writes (the default on a disk) against ``pwritev`` (the
fallback), each into a contiguous dataset and into one chunked by the tiles (as bigmm creates
outputs for its plan's tiles), tiles from a page-aligned buffer in row pieces on ``--threads``
threads, a commit per row of tiles (``--commit tile``: per tile).
``--split`` also reads each panel as the executor does: in row pieces, one per thread, each
read on its thread alone and, as before, split again between the source's threads.
``--gil`` measures how much a pure-Python thread keeps running while a mapped read copies
(near 100%: the copy released the GIL). Example::

    python scripts/bench_io.py --dir /tmp/bench --gib 1 --block 2048 --threads 8
    python scripts/bench_io.py --gib 0.25 --rows 4096 --cols 640 --threads 4 --writes --gil
    python scripts/bench_io.py --gib 1 --block 4096 --threads 16 --reads contiguous,chunked --split
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import h5py
import numpy as np

from bigmm.executor.tuning import io_pieces
from bigmm.io import open_input, open_output, rawio
from bigmm.io.inputs import on_caller_thread


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown"


def make_file(path: str, n: int, chunk: int) -> None:
    if os.path.exists(path):
        with h5py.File(path, "r") as f:
            if f.get("gzip") is not None and f["gzip"].shape == (n, n):
                return
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        dc = f.create_dataset("contiguous", shape=(n, n), dtype="f4")
        dk = f.create_dataset("chunked", shape=(n, n), dtype="f4", chunks=(chunk, chunk))
        dz = f.create_dataset("gzip", shape=(n, n), dtype="f4", chunks=(chunk, chunk),
                              compression="gzip", compression_opts=1, shuffle=True)
        step = max(1, (64 << 20) // (4 * n))
        for r in range(0, n, step):
            block = rng.standard_normal((min(step, n - r), n), dtype=np.float32)
            dc[r:r + len(block)] = block
            dk[r:r + len(block)] = block
            dz[r:r + len(block)] = np.round(block, 2)  # compressible, like real data


def warm(path: str) -> None:
    with open(path, "rb") as fh:
        while fh.read(64 << 20):
            pass


def panels(n: int, rows: int, cols: int):
    for r in range(0, n, rows):
        for c in range(0, n, cols):
            yield r, min(r + rows, n), c, min(c + cols, n)


def time_reads(read, n: int, rows: int, cols: int, repeat: int) -> tuple[float, float]:
    """(seconds, CPU seconds) of the fastest of ``repeat`` passes reading every panel once."""
    buf = np.empty((rows, cols), np.float32)
    best = (float("inf"), float("inf"))
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        for r0, r1, c0_, c1 in panels(n, rows, cols):
            out = buf[: r1 - r0, : c1 - c0_] if (r1 - r0, c1 - c0_) == buf.shape else \
                np.empty((r1 - r0, c1 - c0_), np.float32)
            read(r0, r1, c0_, c1, out)
        best = min(best, (time.perf_counter() - t0, time.process_time() - c0))
    return best


def bench(path: str, name: str, n: int, rows: int, cols: int, threads: int,
          repeat: int, split: bool = False) -> dict:
    nbytes = n * n * 4
    with h5py.File(path, "r") as f:
        dset = f[name]
        direct, direct_cpu = time_reads(lambda r0, r1, c0, c1, out:
                                        dset.read_direct(out, np.s_[r0:r1, c0:c1]),
                                        n, rows, cols, repeat)
        ref = dset[: min(n, 512), : min(n, 512)]
    row = {"dataset": name, "bytes": nbytes, "read_direct_GBps": nbytes / direct / 1e9,
           "read_direct_cpu_s": direct_cpu}
    ways = [("mmap", True, None), ("preadv", False, None)]
    if split:
        ways += [("split-pool", True, False), ("split-caller", True, True),
                 ("split-chunks", True, "chunks")]
    for how, use_mmap, caller in ways:
        with open_input(f"{path}:/{name}", threads=threads, use_mmap=use_mmap) as src, \
                ThreadPoolExecutor(threads) as pool:
            assert src.fast, src
            if use_mmap and not src.mapped:
                continue
            check = np.empty(ref.shape, np.float32)
            src.read(0, ref.shape[0], 0, ref.shape[1], check)
            assert np.array_equal(check, ref)
            read = src.read if caller is None else split_reads(src, pool, threads, caller)
            t, cpu = time_reads(read, n, rows, cols, repeat)
        row[f"{how}_GBps"], row[f"{how}_cpu_s"] = nbytes / t / 1e9, cpu
        row.setdefault("ratio", direct / t)  # the default path (mapped where it maps)
    return row


def split_reads(src, pool, threads: int, caller):
    """Reads of a panel as the executor makes them: in row pieces of at least PIECE_BYTES, one
    per thread of ``pool``, each piece on its thread alone (``caller``, as the executor reads;
    "chunks": pieces of whole chunk rows) or split again between the source's own threads."""
    def piece(r0, r1, c0, c1, out) -> None:
        with on_caller_thread() if caller else contextlib.nullcontext():
            src.read(r0, r1, c0, c1, out)

    def read(r0, r1, c0, c1, out) -> None:
        futures = [pool.submit(piece, a, b, c0, c1, out[a - r0:b - r0])
                   for a, b in io_pieces(r0, r1, c1 - c0, 4, threads,
                                         src.chunks if caller == "chunks" else None)]
        for f in futures:
            f.result()

    return read


def bench_writes(folder: str, n: int, rows: int, cols: int, repeat: int, threads: int,
                 commit: str = "row", modes=("direct", "mapped", "pwritev")) -> list:
    """Write an n x n float32 C in ``rows`` x ``cols`` tiles through the output layer, each
    write path of ``modes`` (O_DIRECT, copies into a shared map, ``pwritev`` where storage
    cannot be reserved), into a contiguous dataset and into one chunked by the tiles (as
    bigmm creates its outputs). Tiles come from a page-aligned buffer (as the GPU's pinned
    ones) and go in row pieces on ``threads`` threads where the sink takes them (as the
    executor's writer does); a commit per row of tiles or per tile."""
    import mmap
    from concurrent.futures import ThreadPoolExecutor

    from bigmm.executor.tuning import io_pieces
    from bigmm.io import direct

    buf = np.frombuffer(mmap.mmap(-1, rows * cols * 4), np.float32).reshape(rows, cols)
    buf[...] = np.random.default_rng(1).standard_normal((rows, cols), dtype=np.float32)
    spec = f"{os.path.join(folder, 'bench-c.h5')}:/C"
    out = []
    pool = ThreadPoolExecutor(threads)
    for how in modes:
        for by_tiles in (False, True):
            best = (float("inf"), float("inf"))
            for _ in range(repeat):
                real = os.posix_fallocate
                direct.MODE = "mapped" if how == "pwritev" else how
                if how == "pwritev":  # as where posix_fallocate is unsupported
                    def unsupported(*args):
                        raise OSError(95, "Operation not supported")
                    os.posix_fallocate = unsupported
                try:
                    t0, c0 = time.perf_counter(), time.process_time()
                    sink = open_output(spec, shape=(n, n), dtype=np.float32, inputs=[],
                                       job={}, overwrite=True,
                                       tile=(rows, cols) if by_tiles else None)
                finally:
                    os.posix_fallocate = real
                    direct.MODE = "auto"
                assert sink.writes == how, (sink.writes, how)
                layout = sink.layout
                for i, r in enumerate(range(0, n, rows)):
                    done = []
                    for j, c in enumerate(range(0, n, cols)):
                        r1, c1 = min(r + rows, n), min(c + cols, n)
                        pieces = (io_pieces(r, r1, c1 - c, 4, threads)
                                  if sink.parallel_writes else [(r, r1)])
                        list(pool.map(lambda p: sink.write(p[0], p[1], c, c1,
                                                           buf[p[0] - r:p[1] - r, :c1 - c]),
                                      pieces))
                        done.append((i, j))
                        if commit == "tile":
                            sink.commit(done)
                            done = []
                    sink.commit(done)
                sink.finish()
                sink.close()
                best = min(best, (time.perf_counter() - t0, time.process_time() - c0))
            out.append({"writes": how, "layout": layout, "bytes": n * n * 4,
                        "GBps": n * n * 4 / best[0] / 1e9, "cpu_s": best[1]})
    os.unlink(spec.rsplit(":/", 1)[0])
    return out


def gil_share(path: str, n: int, rows: int, cols: int) -> float:
    """A counting Python thread's rate while one reader thread copies mapped panels, as a
    share of its rate alone (about 100% when the copies release the GIL; near 0 if not)."""
    def spin(seconds=None, during=None):
        count, stop = [0], threading.Event()

        def loop():
            while not stop.is_set():
                count[0] += 1
        t = threading.Thread(target=loop, daemon=True)
        t0 = time.perf_counter()
        t.start()
        try:
            if during is None:
                time.sleep(seconds)
            else:
                during()
        finally:
            stop.set()
            t.join()
        return count[0] / (time.perf_counter() - t0)

    def read_all():
        for r0, r1, c0, c1 in panels(n, rows, cols):
            src.read(r0, r1, c0, c1, np.empty((r1 - r0, c1 - c0), np.float32))

    with open_input(f"{path}:/contiguous", threads=1) as src:
        assert src.mapped
        idle = spin(seconds=0.5)
        busy = spin(during=read_all)
    return busy / idle


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/bigmm-bench-io")
    ap.add_argument("--gib", type=float, default=1.0, help="size of each dataset (GiB)")
    ap.add_argument("--block", type=int, default=2048, help="square panel edge")
    ap.add_argument("--rows", type=int, default=None, help="panel rows (default --block)")
    ap.add_argument("--cols", type=int, default=None, help="panel columns (default --block)")
    ap.add_argument("--chunk", type=int, default=1024, help="chunk edge of the chunked dataset")
    ap.add_argument("--threads", type=int, default=min(16, 2 * (os.cpu_count() or 1)))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gap-max", type=int, default=rawio.GAP_MAX,
                    help="largest gap between row segments read through in one preadv (bytes)")
    ap.add_argument("--os-preadv", action="store_true",
                    help="build iovecs as memoryviews for os.preadv instead of libc preadv")
    ap.add_argument("--writes", action="store_true", help="also time tile writes of C")
    ap.add_argument("--commit", choices=("row", "tile"), default="row",
                    help="--writes: commit (msync/fsync) per row of tiles or per tile")
    ap.add_argument("--write-modes", default="direct,mapped,pwritev",
                    help="--writes: the write paths to time")
    ap.add_argument("--reads", default="contiguous,chunked,gzip",
                    help="datasets to time reads of (none: '')")
    ap.add_argument("--gil", action="store_true",
                    help="also measure a Python thread's progress during mapped reads")
    ap.add_argument("--split", action="store_true",
                    help="also read each panel in pieces on --threads threads, as the executor "
                         "does: each piece on its thread alone, and split again by the source")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rawio.GAP_MAX = args.gap_max
    rawio.NATIVE = rawio.NATIVE and not args.os_preadv
    rows, cols = args.rows or args.block, args.cols or args.block
    n = int((args.gib * 2**30 / 4) ** 0.5)
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, f"bench-{n}.h5")
    if args.reads:
        make_file(path, n, args.chunk)
        warm(path)
    load = os.getloadavg()[0]
    results = [bench(path, name, n, rows, cols, args.threads, args.repeat, args.split)
               for name in args.reads.split(",") if name]
    writes = (bench_writes(args.dir, n, rows, cols, args.repeat, args.threads, args.commit,
                           args.write_modes.split(","))
              if args.writes else [])
    gil = gil_share(path, n, rows, cols) if args.gil else None
    meta = {"cpu": cpu_model(), "cores": os.cpu_count(), "n": n, "rows": rows, "cols": cols,
            "chunk": args.chunk, "threads": args.threads, "gap_max": args.gap_max,
            "iovecs": "libc" if rawio.NATIVE else "os.preadv", "load": load}
    if args.json:
        print(json.dumps({"meta": meta, "results": results, "writes": writes, "gil": gil},
                         indent=2))
        return
    print(f"{meta['cpu']}, {meta['cores']} cores, load average {load:.2f}; float32 {n} x {n} "
          f"({n * n * 4 / 2**30:.2f} GiB), panels {rows} x {cols}, "
          f"chunks {args.chunk}^2, {args.threads} threads, gap_max {args.gap_max}, "
          f"iovecs {meta['iovecs']}, warm page cache; GB/s (CPU-s per pass)")
    ways = ("read_direct", "mmap", "preadv") + (
        ("split-pool", "split-caller", "split-chunks") if args.split else ())
    print(f"{'dataset':<12}" + "".join(f"{w:>18}" for w in ways) + f"{'ratio':>8}")
    for r in results:
        cells = [f"{r[k + '_GBps']:.2f} ({r[k + '_cpu_s']:.2f})" if k + "_GBps" in r else "-"
                 for k in ways]
        print(f"{r['dataset']:<12}" + "".join(f"{c:>18}" for c in cells) + f"{r['ratio']:>8.2f}")
    for w in writes:
        print(f"write C by {w['writes']:<8} into {w['layout']:<10} {w['GBps']:.2f} GB/s, "
              f"{w['cpu_s']:.2f} CPU-s")
    if gil is not None:
        print(f"a Python thread ran at {gil:.0%} of its rate alone while one thread copied "
              f"mapped panels")


if __name__ == "__main__":
    main()
