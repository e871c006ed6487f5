#!/usr/bin/env python3
"""A sweep of the planner: one canonical line per plan, to hold two versions of it side by side.

For a fixed, seeded sample of jobs (square and skinny shapes from 1 to 131072, float32 and
float64, transposes, beta != 0, chunked inputs), budgets (512 bytes, too small for most jobs,
and 1 MiB to 80 GiB of device memory, with several host budgets), staging on and off, and
rates (none: the byte objective; CUDA cores, TF32-like and bf16-like tensor cores, a slow disk,
checks, a CPU), ``make_plan`` is called and one line is printed per call: the arguments, then
``plan.key()``, ``str(plan)`` (its lines joined by " | ") and the predicted time rounded to
1e-9 s; or the error it raised. A change that must not change plans leaves the output byte
for byte the same:

    PYTHONPATH=. python scripts/plan_sweep.py --out before.txt    # on the old code
    PYTHONPATH=. python scripts/plan_sweep.py --out after.txt     # on the new code
    cmp before.txt after.txt

``--time`` also reports, on standard error, the seconds spent planning the sweep: the best of
``--repeat`` passes of the uncached ``make_plan`` (its ``__wrapped__``), so that every pass
plans every job anew.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time

from bigmm.errors import BigmmError
from bigmm.planner import Rates, cpu_step_bytes, make_plan

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

#: (M, N, K): square products and skinny ones (a few rows or columns, a short or a long depth).
SHAPES = [
    (1, 1, 1), (7, 5, 3), (256, 256, 256), (1000, 1000, 1000), (4096, 4096, 4096),
    (12288, 12288, 12288), (32768, 32768, 32768), (131072, 131072, 131072),
    (131072, 64, 131072), (64, 131072, 131072), (131072, 131072, 16), (1, 131072, 4096),
    (131072, 1, 4096), (5000, 3, 70000), (3001, 2003, 1009), (20000, 700, 90000),
    (65536, 65536, 1024), (1024, 1024, 131072),
]
DTYPES = ["float32", "float64"]
#: (trans_a, trans_b, reads_c, a_chunks, b_chunks)
VARIANTS = [
    (False, False, False, None, None),
    (True, False, False, None, None),
    (False, True, True, None, None),
    (True, True, False, None, None),
    (False, False, True, (1000, 1000), (512, 4096)),
    (True, False, False, (64, 64), (300, 700)),
]
DEVICE_BUDGETS = [512, 1 * MiB, 16 * MiB, 256 * MiB, 2 * GiB, 8 * GiB, 80 * GiB]
#: Host budgets: None (the device budget), or a factor of the device budget, or a fixed size.
HOST_BUDGETS = [None, 1, 4, 32 * GiB]
#: Named rates: None plans by bytes moved; the others by predicted time.
RATES = {
    "bytes": None,
    "cuda-core": Rates(flops=50e12, read_bytes=15e9, write_bytes=5e9, h2d_bytes=54e9,
                       memory_bytes=2.9e12, wave_flops=2.0 * 128 * 128 * 132),
    "tf32": Rates(flops=370e12, read_bytes=15e9, write_bytes=5e9, h2d_bytes=54e9,
                  memory_bytes=2.9e12, wave_flops=2.0 * 128 * 256 * 132),
    "bf16": Rates(flops=700e12, read_bytes=33e9, write_bytes=5e9, h2d_bytes=54e9),
    "slow-disk": Rates(flops=50e12, read_bytes=1.9e9, write_bytes=0.8e9, h2d_bytes=54e9),
    "checked": Rates(flops=50e12, read_bytes=2e9, write_bytes=1e9, h2d_bytes=54e9,
                     check_bytes=2e12, check_step=40e-6),
    "checked-fused": Rates(flops=50e12, read_bytes=2e9, write_bytes=1e9, h2d_bytes=54e9,
                           check_bytes=2e12, check_step=40e-6, check_fused=True),
    "cpu": Rates(flops=1.5e12, read_bytes=2e9, write_bytes=1e9),
}


def cases(count: int, seed: int) -> list[dict]:
    """``count`` keyword sets for make_plan, a seeded sample of the whole product, plus every
    shape, dtype and rates once with a middling budget (so each value is covered)."""
    product = list(itertools.product(SHAPES, DTYPES, VARIANTS, DEVICE_BUDGETS, HOST_BUDGETS,
                                     (True, False), RATES))
    rng = random.Random(seed)
    picked = rng.sample(product, min(count, len(product)))
    covered = [(s, d, VARIANTS[0], 2 * GiB, None, True, r)
               for s, d, r in itertools.product(SHAPES, DTYPES, RATES)]
    out = []
    for shape, dtype, (ta, tb, rc, ach, bch), device, host, staging, rates in covered + picked:
        m, n, k = shape
        kw = dict(m=m, n=n, k=k, dtype=dtype, trans_a=ta, trans_b=tb, reads_c=rc,
                  device_budget=device, staging=staging, rates_name=rates)
        if host is not None:
            kw["host_budget"] = host * device if host < 1024 else host
        if ach is not None:
            kw["a_chunks"], kw["b_chunks"] = ach, bch
        if not staging and rates in ("bytes", "cpu") and rng.random() < 0.5:
            kw["step_bytes"] = cpu_step_bytes(16)
        out.append(kw)
    # a few schedules fixed as a resumed run fixes them
    for order in ("stream", "resident-a", "resident-b"):
        out.append(dict(m=3001, n=2003, k=1009, dtype="float32", device_budget=64 * MiB,
                        tile=(1024, 512, 256), order=order, rates_name="cuda-core"))
    return out


def line(kw: dict, plan=None, error: Exception | None = None) -> str:
    """The canonical line of one make_plan call."""
    args = json.dumps(kw, sort_keys=True, default=str)
    if error is not None:
        return f"{args} -> {type(error).__name__}: {error}"
    t = plan.predicted_seconds
    t = "None" if t is None else f"{round(t, 9):.9f}"
    text = " | ".join(str(plan).splitlines())
    return f"{args} -> {json.dumps(plan.key(), sort_keys=True)} || {text} || {t}"


def plan_all(jobs: list[dict], plan=make_plan) -> tuple[list, float]:
    """(plan or error per job, seconds spent in ``plan``)."""
    results, spent = [], 0.0
    for kw in jobs:
        args = {k: v for k, v in kw.items() if k != "rates_name"}
        args["rates"] = RATES[kw["rates_name"]]
        t0 = time.perf_counter()
        try:
            results.append((plan(**args), None))
        except BigmmError as e:
            results.append((None, e))
        spent += time.perf_counter() - t0
    return results, spent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=3000, help="sampled jobs (default 3000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the lines here (default: standard output)")
    ap.add_argument("--time", action="store_true", help="report make_plan's time on stderr")
    ap.add_argument("--repeat", type=int, default=1, help="timed passes (the best counts)")
    args = ap.parse_args(argv)
    jobs = cases(args.count, args.seed)
    results, _ = plan_all(jobs)
    lines = [line(kw, p, e) for kw, (p, e) in zip(jobs, results)]
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    if args.time:
        best = min(plan_all(jobs, make_plan.__wrapped__)[1] for _ in range(args.repeat))
        errors = sum(e is not None for _, e in results)
        print(f"{len(jobs)} make_plan calls ({errors} errors): best of {args.repeat} passes "
              f"{best:.3f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
