"""Random jobs against the float64 reference (hypothesis): shapes that are multiples of nothing,
both dtypes and byte orders, transposes, alpha/beta including 0 and negatives, old C poisoned
with NaN when beta == 0, inputs as arrays or HDF5 datasets (contiguous, randomly chunked,
gzip-compressed), output to a file or an array, budgets from the planner's stated minimum up."""

from __future__ import annotations

import os
import tempfile

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bigmm
from bigmm.errors import BudgetError
from bigmm.io import open_input
from bigmm.job import decoding
from bigmm.planner import make_plan
from bigmm.testing import random_matrix, reference_gemm, relative_error, tolerance

FUZZ = settings(max_examples=50, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
#: Runs are kept to at most this many tile steps (tiles x K panels) so that the budget search
#: stays fast; smaller budgets are checked by planning only.
MAX_STEPS = 400

dims = st.integers(1, 300)
scalars = st.sampled_from([0.0, 1.0, -1.0, 0.5, -2.25, 3.0])
storages = st.sampled_from(["array", "fortran-array", "contiguous", "chunked", "gzip"])


@st.composite
def jobs(draw):
    m, n, k = draw(dims), draw(dims), draw(dims)
    job = dict(m=m, n=n, k=k, dtype=draw(st.sampled_from(["float32", "float64"])),
               trans_a=draw(st.booleans()), trans_b=draw(st.booleans()),
               alpha=draw(scalars), beta=draw(scalars), seed=draw(st.integers(0, 2**16)),
               out=draw(st.sampled_from(["file", "array"])),
               factor=draw(st.sampled_from([1.0, 1.3, 3.0, 20.0, 1000.0])))
    if job["beta"] == 0 and draw(st.booleans()):
        job["out"] = "none"  # a new array
    for name, shape in (("a", (k, m) if job["trans_a"] else (m, k)),
                        ("b", (n, k) if job["trans_b"] else (k, n))):
        storage = draw(storages)
        chunks = None
        if storage in ("chunked", "gzip"):  # random chunk shapes, at most ~16 per dimension
            chunks = tuple(draw(st.integers(max(1, d // 16), d)) for d in shape)
        job[name] = dict(shape=shape, storage=storage, chunks=chunks,
                         big_endian=draw(st.booleans()))
    return job


def operand(folder, name, spec, dtype, seed):
    """(what bigmm is given, the stored values)."""
    data = random_matrix(spec["shape"], dtype, seed=seed)
    if spec["storage"] == "array":
        return data, data
    if spec["storage"] == "fortran-array":
        return np.asfortranarray(data), data
    path = os.path.join(folder, f"{name}.h5")
    stored = data.astype(np.dtype(dtype).newbyteorder(">" if spec["big_endian"] else "<"))
    extra = {"compression": "gzip", "shuffle": True} if spec["storage"] == "gzip" else {}
    with h5py.File(path, "w") as f:
        f.create_dataset(name.upper(), data=stored, chunks=spec["chunks"], **extra)
    return f"{path}:/{name.upper()}", data


def planner(job, a_chunks, b_chunks, decoded=None):
    """make_plan for the job with a budget (the planner bigmm.matmul runs, minus the timing;
    ``decoded``: the decode buffers of its gzip inputs)."""
    return lambda budget: make_plan(
        job["m"], job["n"], job["k"], job["dtype"], trans_a=job["trans_a"],
        trans_b=job["trans_b"], reads_c=job["beta"] != 0, device_budget=budget, staging=False,
        a_chunks=a_chunks, b_chunks=b_chunks, decoding=decoded)


@FUZZ
@given(jobs())
def test_random_jobs_match_the_float64_reference(job):
    m, n, k, dtype = job["m"], job["n"], job["k"], job["dtype"]
    with tempfile.TemporaryDirectory() as folder:
        a, xa = operand(folder, "a", job["a"], dtype, job["seed"])
        b, xb = operand(folder, "b", job["b"], dtype, job["seed"] + 1)
        old = random_matrix((m, n), dtype, seed=job["seed"] + 2)
        if job["beta"] == 0:
            old[...] = np.nan  # must never leak into the result
        kw = dict(alpha=job["alpha"], beta=job["beta"], trans_a=job["trans_a"],
                  trans_b=job["trans_b"], backend="numpy", io_threads=2)

        out = None
        if job["out"] == "file":
            out = os.path.join(folder, "c.h5") + ":/C"
            with h5py.File(out[:-3], "w") as f:
                f["C"] = old
        elif job["out"] == "array":
            out = old.copy()

        # The stated minimum: a plan there; one byte below, refused with the minimum named.
        chunks = [s["chunks"] if s["storage"] in ("chunked", "gzip") else None
                  for s in (job["a"], job["b"])]
        with open_input(a, name="A") as sa, open_input(b, name="B") as sb:
            plan_for = planner(job, *chunks, decoding(sa, sb, False, kw["io_threads"]))
        with pytest.raises(BudgetError) as err:
            plan_for(1)
        low = err.value.minimum
        assert low and str(low) in str(err.value)
        assert plan_for(low).device_bytes <= low
        with pytest.raises(BudgetError, match=str(low)):
            bigmm.matmul(a, b, out, memory=low - 1, overwrite=True, **kw)

        # A run from the minimum up (larger where the minimum would take many small steps).
        budget = int(low * job["factor"])
        while True:
            plan = plan_for(budget)
            if plan.n_tiles * plan.nk <= MAX_STEPS:
                break
            budget *= 4
        got = bigmm.matmul(a, b, out, memory=budget, overwrite=job["beta"] == 0, **kw)
        if job["out"] == "file":
            with h5py.File(out[:-3], "r") as f:
                got = f["C"][...]
        elif job["out"] == "array":
            assert got is out
        assert got.shape == (m, n) and got.dtype == np.dtype(dtype)
        ref = reference_gemm(xa, xb, alpha=job["alpha"], beta=job["beta"], c=old,
                             trans_a=job["trans_a"], trans_b=job["trans_b"])
        scale = 1.0 + abs(job["beta"]) / max(abs(job["alpha"]), 1e-3)
        assert relative_error(got, ref) <= scale * tolerance(dtype, k), (
            job, plan.bm, plan.bn, plan.bk)
