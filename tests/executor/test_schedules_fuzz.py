"""Random schedules through the asynchronous staging backend (hypothesis): every order, resident-c
with any tail and A load width, old C read or not, transposes, reader threads, operands staged
or copied in place from page-locked arrays. Streams run late and at random, so a buffer reused
before its last copy is done shows up as a wrong C."""

from __future__ import annotations

import pathlib
import tempfile

import numpy as np
from executor_cases import AsyncBackend, PinnedAsyncBackend, array_run, operands, run
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bigmm.planner import make_plan
from bigmm.planner.schedule import ORDERS
from bigmm.testing import magnitude, reference_gemm, tolerance

#: K panels of the runs' plans (``executor_cases.run``'s tiles are 16 x 16 x 24).
BK = 24


@st.composite
def schedules(draw):
    order = draw(st.sampled_from(ORDERS + ("resident-c",) * 3))
    m, n, k = draw(st.integers(1, 90)), draw(st.integers(1, 60)), draw(st.integers(1, 220))
    nk = -(-k // BK)
    job = dict(order=order, m=m, n=n, k=k, beta=draw(st.sampled_from([0.0, 1.0, -0.5])),
               ta=draw(st.booleans()), tb=draw(st.booleans()),
               io_threads=draw(st.sampled_from([1, 2, 4])), seed=draw(st.integers(0, 999)))
    if order == "resident-c":  # often all of K in the tail: strips finished while others load
        job["tail"] = nk if draw(st.booleans()) else draw(st.integers(1, nk))
        job["a_span"] = draw(st.sampled_from([None, 2, 3]))
    return job


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules())
def test_random_schedules_through_staging(job):
    seed = job.pop("seed")
    with tempfile.TemporaryDirectory() as folder:
        out, ref, _, plan = run(pathlib.Path(folder), AsyncBackend(seed=seed), alpha=0.5, **job)
    assert plan.order == job["order"]
    a, b, c0 = operands(job["m"], job["n"], job["k"], job["ta"], job["tb"])
    scale = magnitude(a, b, alpha=0.5, beta=job["beta"], c=c0, trans_a=job["ta"],
                      trans_b=job["tb"])
    _check(out, ref, scale, job["k"], plan)


def _check(out, ref, scale, k, plan) -> None:
    """C within float64's bound of the reference, against the magnitude of its terms (a
    small C whose terms cancel is no less exact than a large one)."""
    assert np.isfinite(out).all(), plan
    assert np.linalg.norm(out - ref) <= tolerance(np.float64, k) * np.linalg.norm(scale), plan


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules(), st.sets(st.sampled_from("ABC")))
# one element whose 212 terms cancel to a thousandth of their magnitude
@example(dict(order="stream", m=1, n=1, k=212, beta=-0.5, ta=False, tb=False, io_threads=1,
              seed=209), set())
def test_random_schedules_with_page_locked_arrays(job, pinned):
    """Some of A, B and C page-locked (copied in place), the others staged."""
    m, n, k, order = job["m"], job["n"], job["k"], job["order"]
    plan = make_plan(m, n, k, "float64", trans_a=job["ta"], trans_b=job["tb"],
                     reads_c=job["beta"] != 0, device_budget=1 << 30, staging=True, align=8,
                     tile=(16, n if order == "resident-c" else 16, BK), order=order,
                     tail=job.get("tail"), a_span=job.get("a_span"))
    a, b, c0 = operands(m, n, k, job["ta"], job["tb"], seed=job["seed"])
    c = c0.copy() if job["beta"] else np.full((m, n), np.nan)
    be = PinnedAsyncBackend(job["seed"])
    for name, x in (("A", a), ("B", b), ("C", c)):
        if name in pinned:
            be.pin(x)
    array_run(be, a, b, c, plan, 0.5, job["beta"])
    ref = reference_gemm(a, b, alpha=0.5, beta=job["beta"], c=c0, trans_a=job["ta"],
                         trans_b=job["tb"])
    _check(c, ref, magnitude(a, b, alpha=0.5, beta=job["beta"], c=c0, trans_a=job["ta"],
                             trans_b=job["tb"]), k, plan)
