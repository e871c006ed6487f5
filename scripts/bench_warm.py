#!/usr/bin/env python3
"""The warm HDF5 job against its floor, round by round: bigmm's run over the warm storage
floor measured in the same round.

Writes A and B (n x n float32, standard normal, chunked ``--chunk`` square) into ``--dir``, reads them once so
that they are cached, and checks one run's C with a float64 probe (C x = A (B x) for a random
x). Then each of ``--rounds`` rounds measures the warm floor (``storage.py``: A and B read and
C written once, at once, buffered and with ``O_DIRECT`` writes, the faster) and runs bigmm's
job once (C into a new file), and reports the run over that round's floor; the disk's rate
moves between rounds, so a run is only compared with its own round's floor. Per run: the
seconds of the whole call, its first write (from the call's start), the writer's span (first
to last write) and what followed the last write. Prints the medians and the range of the
ratios; writes ``bench_warm.json`` into ``--out``.

    PYTHONPATH=. python scripts/bench_warm.py --n 32768 --memory 8GiB --rounds 6 --dir /tmp/bw
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import storage  # noqa: E402
from e2e_common import random_f32, write_h5  # noqa: E402

import bigmm  # noqa: E402
from bigmm.profile import Profile  # noqa: E402

#: The probe's largest relative error accepted (float32 products of depth up to 10^5).
PROBE_TOLERANCE = 1e-4


def write_inputs(folder: str, n: int, chunk: int, seed: int, threads: int) -> tuple[str, str]:
    """A and B, standard normal, as chunked HDF5 files (``e2e_common``); their specs."""
    return tuple(write_h5(Path(folder) / f"{name.lower()}.h5", name,
                          random_f32(n, seed + i, threads), chunk)
                 for i, name in enumerate("AB"))


def probe(spec_a: str, spec_b: str, spec_c: str, n: int, rows: int, x) -> float:
    """The relative error of C x against A (B x), in float64."""
    def times(spec, v):
        path, name = spec.rsplit(":/", 1)
        out = np.empty(n)
        with h5py.File(path, "r") as f:
            for r in range(0, n, rows):
                out[r:r + rows] = f[name][r:r + rows].astype(np.float64) @ v
        return out

    ref = times(spec_a, times(spec_b, x))
    return float(np.linalg.norm(times(spec_c, x) - ref) / np.linalg.norm(ref))


def run(spec_a: str, spec_b: str, spec_c: str, args) -> dict:
    """One call of the job into a new C: its seconds and its writes' times."""
    path = spec_c.rsplit(":/", 1)[0]
    if os.path.exists(path):
        os.unlink(path)
    prof = Profile()
    t0 = time.perf_counter()
    bigmm.matmul(spec_a, spec_b, spec_c, memory=args.memory, backend=args.backend,
                 profile=prof)
    t1 = time.perf_counter()
    w = prof.merged("write")
    return {"seconds": t1 - t0, "first_write": w[0][0] - t0 if w else None,
            "write_span": w[-1][1] - w[0][0] if w else None,
            "after_writes": t1 - w[-1][1] if w else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=32768)
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--memory", default="8GiB", help="bigmm's budget (--memory)")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1),
                    help="the floor's threads")
    ap.add_argument("--dir", default="bench-warm-data")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    spec_a, spec_b = write_inputs(args.dir, args.n, args.chunk, args.seed, args.threads)
    spec_c = f"{os.path.join(args.dir, 'c.h5')}:/C"
    inputs = [s.rsplit(":/", 1)[0] for s in (spec_a, spec_b)]
    storage.warm(inputs, args.threads)
    first = run(spec_a, spec_b, spec_c, args)  # (the process's first call: not counted)
    x = np.random.default_rng(args.seed + 1).standard_normal(args.n)
    error = probe(spec_a, spec_b, spec_c, args.n, args.chunk, x)
    if not error <= PROBE_TOLERANCE:
        print(f"C failed its probe: relative error {error:.3g}", file=sys.stderr)
        return 1
    c_data = storage.aligned(args.n * args.n * 4)
    c_data[:] = 7
    floor_c = os.path.join(args.dir, "floor_c.bin")
    rows = []
    for r in range(args.rounds):
        floor = min(storage.floor_variant(inputs, floor_c, c_data, args.threads, way,
                                          "warm")["seconds"] for way in ("buffered", "mixed"))
        row = run(spec_a, spec_b, spec_c, args)
        row.update(round=r, floor=floor, ratio=row["seconds"] / floor)
        rows.append(row)
        print(f"round {r}: floor {floor:.3f} s, run {row['seconds']:.3f} s "
              f"({row['ratio']:.3f}x)", flush=True)

    def median(key):
        values = [row[key] for row in rows if row[key] is not None]
        return statistics.median(values) if values else float("nan")

    ratios = [row["ratio"] for row in rows]
    summary = {"n": args.n, "chunk": args.chunk, "memory": args.memory, "probe": error,
               "first_call": first, "rounds": rows, "median_ratio": statistics.median(ratios),
               "plan": str(bigmm.plan(spec_a, spec_b, spec_c, memory=args.memory,
                                      backend=args.backend))}
    with open(os.path.join(args.out, "bench_warm.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"warm HDF5 n={args.n} over the round's floor: median {summary['median_ratio']:.3f}x "
          f"({min(ratios):.3f}-{max(ratios):.3f}), run {median('seconds'):.3f} s, floor "
          f"{median('floor'):.3f} s, first write {1e3 * median('first_write'):.0f} ms, writer "
          f"span {median('write_span'):.3f} s, after the last write "
          f"{1e3 * median('after_writes'):.0f} ms; probe {error:.2g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
