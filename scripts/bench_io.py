"""Warm-file read throughput: bigmm's parallel pread fast path against h5py ``read_direct``.

Creates (once) an HDF5 file with a contiguous, a chunked and a gzip-compressed (shuffled,
level 1) float32 dataset of about ``--gib`` GiB each, reads it once to warm the page cache, then reads it panel by panel
(``--block`` x ``--block``, row panels as the executor reads A) both ways and prints GB/s and
the ratio. Example::

    python scripts/bench_io.py --dir /tmp/bench --gib 1 --block 2048 --threads 8
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time

import h5py
import numpy as np

from bigmm.io import open_input, rawio


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


def panels(n: int, block: int):
    for r in range(0, n, block):
        for c in range(0, n, block):
            yield r, min(r + block, n), c, min(c + block, n)


def time_reads(read, n: int, block: int, repeat: int) -> float:
    """Best seconds over ``repeat`` passes of reading every panel once."""
    buf = np.empty((block, block), np.float32)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for r0, r1, c0, c1 in panels(n, block):
            out = buf[: r1 - r0, : c1 - c0] if (r1 - r0, c1 - c0) == buf.shape else \
                np.empty((r1 - r0, c1 - c0), np.float32)
            read(r0, r1, c0, c1, out)
        best = min(best, time.perf_counter() - t0)
    return best


def bench(path: str, name: str, n: int, block: int, threads: int, repeat: int) -> dict:
    nbytes = n * n * 4
    with h5py.File(path, "r") as f:
        dset = f[name]
        direct = time_reads(lambda r0, r1, c0, c1, out:
                            dset.read_direct(out, np.s_[r0:r1, c0:c1]), n, block, repeat)
        ref = dset[: min(n, 512), : min(n, 512)]
    with open_input(f"{path}:/{name}", threads=threads) as src:
        assert src.fast, src
        check = np.empty(ref.shape, np.float32)
        src.read(0, ref.shape[0], 0, ref.shape[1], check)
        assert np.array_equal(check, ref)
        fast = time_reads(src.read, n, block, repeat)
    return {"dataset": name, "bytes": nbytes, "read_direct_GBps": nbytes / direct / 1e9,
            "fast_GBps": nbytes / fast / 1e9, "ratio": direct / fast}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/bigmm-bench-io")
    ap.add_argument("--gib", type=float, default=1.0, help="size of each dataset (GiB)")
    ap.add_argument("--block", type=int, default=2048)
    ap.add_argument("--chunk", type=int, default=1024, help="chunk edge of the chunked dataset")
    ap.add_argument("--threads", type=int, default=min(16, 2 * (os.cpu_count() or 1)))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gap-max", type=int, default=rawio.GAP_MAX,
                    help="largest gap between row segments read through in one preadv (bytes)")
    ap.add_argument("--os-preadv", action="store_true",
                    help="build iovecs as memoryviews for os.preadv instead of libc preadv")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rawio.GAP_MAX = args.gap_max
    rawio.NATIVE = rawio.NATIVE and not args.os_preadv
    n = int((args.gib * 2**30 / 4) ** 0.5)
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, f"bench-{n}.h5")
    make_file(path, n, args.chunk)
    warm(path)
    rows = [bench(path, name, n, args.block, args.threads, args.repeat)
            for name in ("contiguous", "chunked", "gzip")]
    meta = {"cpu": cpu_model(), "cores": os.cpu_count(), "n": n, "block": args.block,
            "chunk": args.chunk, "threads": args.threads, "gap_max": args.gap_max,
            "iovecs": "libc" if rawio.NATIVE else "os.preadv"}
    if args.json:
        print(json.dumps({"meta": meta, "results": rows}, indent=2))
        return
    print(f"{meta['cpu']}, {meta['cores']} cores; float32 {n} x {n} "
          f"({rows[0]['bytes'] / 2**30:.2f} GiB), panels {args.block}^2, "
          f"chunks {args.chunk}^2, {args.threads} threads, gap_max {args.gap_max}, "
          f"iovecs {meta['iovecs']}, warm page cache")
    print(f"{'dataset':<12}{'read_direct GB/s':>18}{'fast GB/s':>12}{'ratio':>8}")
    for r in rows:
        print(f"{r['dataset']:<12}{r['read_direct_GBps']:>18.2f}{r['fast_GBps']:>12.2f}"
              f"{r['ratio']:>8.2f}")


if __name__ == "__main__":
    main()
