"""Random schedules through the asynchronous staging backend (hypothesis): every order, resident-c
with any tail and A load width, old C read or not, transposes, reader threads. Streams run late
and at random, so a buffer reused before its last copy is done shows up as a wrong C."""

from __future__ import annotations

import pathlib
import tempfile

import numpy as np
from executor_cases import AsyncBackend, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bigmm.planner.schedule import ORDERS
from bigmm.testing import relative_error, tolerance

#: K panels of the runs' plans (``executor_cases.run``'s tiles are 16 x 16 x 24).
BK = 24


@st.composite
def schedules(draw):
    order = draw(st.sampled_from(ORDERS + ("resident-c",) * 3))
    m, n, k = draw(st.integers(1, 90)), draw(st.integers(1, 60)), draw(st.integers(1, 100))
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
    assert relative_error(out, ref) <= tolerance(np.float64, job["k"]), plan
