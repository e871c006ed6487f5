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
from bigmm.io.generate import generate
from bigmm.job import decoding
from bigmm.planner import make_plan
from bigmm.testing import magnitude, random_matrix, reference_gemm, run_stopped, tolerance

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
        # against C, or against the magnitude of its terms where they cancel (the error of
        # each element is within eps times its terms' magnitudes, however small their sum)
        terms = magnitude(xa, xb, alpha=job["alpha"], beta=job["beta"], c=old,
                          trans_a=job["trans_a"], trans_b=job["trans_b"])
        assert np.isfinite(got).all(), (job, plan.bm, plan.bn, plan.bk)
        bound = tolerance(dtype, k) * max(scale * np.linalg.norm(ref), np.linalg.norm(terms))
        assert np.linalg.norm(got.astype(np.float64) - ref) <= bound, (
            job, plan.bm, plan.bn, plan.bk)


STORES = ["contiguous", "chunked", "zstd", "gzip", "zarr", "zarr-zstd"]


@st.composite
def interrupted_jobs(draw):
    side = st.one_of(st.integers(1, 40), st.integers(100, 400))  # most take several tiles
    m, n, k = draw(side), draw(side), draw(side)
    dtypes = st.sampled_from(["float16", "float32", "float64"])
    return dict(m=m, n=n, k=k, dtypes=(draw(dtypes), draw(dtypes)),
                trans_a=draw(st.booleans()), trans_b=draw(st.booleans()),
                alpha=draw(scalars), beta=draw(st.sampled_from([0.0, 1.0, -0.5])),
                stores=(draw(st.sampled_from(STORES)), draw(st.sampled_from(STORES))),
                out=draw(st.sampled_from(["h5", "zarr"])),
                memory=draw(st.sampled_from(["256KiB", "1MiB"])),
                stops=draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)),
                io_threads=draw(st.sampled_from([1, 2, 4])))


def _stored(folder, name, store, shape, dtype, seed):
    """A spec of a generated operand stored as ``store`` (chunks of a third of each side)."""
    zarr_store = store.startswith("zarr")
    spec = f"{folder}/{name}.zarr" if zarr_store else f"{folder}/{name}.h5:/{name}"
    kw = {}
    if store != "contiguous":
        kw["chunks"] = tuple(max(1, -(-x // 3)) for x in shape)
        kw["layout"] = "chunked" if store in ("chunked", "zarr") else "compressed"
        if kw["layout"] == "compressed":
            kw["compression"] = "gzip" if store == "gzip" else "zstd"
    generate(spec, shape, dtype=dtype, seed=seed, overwrite=True, **kw)
    return spec


def _read(spec):
    with open_input(spec, name="C") as src:
        out = np.empty(src.shape, src.dtype)
        src.read(0, src.shape[0], 0, src.shape[1], out)
        return out


@FUZZ
@given(interrupted_jobs())
def test_interrupted_and_resumed_jobs_are_the_uninterrupted_run(job):
    """Stopped after a few tiles, one to three times, and resumed: C bit for bit the
    uninterrupted run's (HDF5 and Zarr, compressed or not, mixed dtypes, old C read)."""
    m, n, k = job["m"], job["n"], job["k"]
    with tempfile.TemporaryDirectory() as folder:
        ta, tb = job["trans_a"], job["trans_b"]
        a = _stored(folder, "A", job["stores"][0], (k, m) if ta else (m, k), job["dtypes"][0], 1)
        b = _stored(folder, "B", job["stores"][1], (n, k) if tb else (k, n), job["dtypes"][1], 2)
        specs = [f"{folder}/{c}.zarr" if job["out"] == "zarr" else f"{folder}/{c}.h5:/C"
                 for c in ("C1", "C2")]
        c_dtype = "float64" if "float64" in job["dtypes"] else "float32"
        if job["beta"]:
            for spec in specs:
                generate(spec, (m, n), dtype=c_dtype, seed=3, overwrite=True)
        kw = dict(alpha=job["alpha"], beta=job["beta"], trans_a=ta, trans_b=tb,
                  memory=job["memory"], backend="numpy", io_threads=job["io_threads"],
                  overwrite=not job["beta"])
        try:
            bigmm.matmul(a, b, specs[0], **kw)
        except BudgetError:  # compressed chunks larger than the budget: refused, as stated
            return
        run_stopped(lambda **x: bigmm.matmul(a, b, specs[1], **dict(kw, **x)), job["stops"],
                    resumed=dict(resume=True, overwrite=False))
        assert np.array_equal(_read(specs[1]), _read(specs[0]), equal_nan=True)
