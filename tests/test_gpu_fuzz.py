"""Random jobs on the GPU against the float64 reference (hypothesis): each kernel and precision,
float16, bfloat16, float32, float64 and mixed operands, transposes, alpha/beta (old C poisoned
with NaN when beta == 0), operands and outputs as pageable, Fortran-ordered and page-locked
arrays, HDF5 datasets (contiguous and randomly chunked) and Zarr arrays, Gram products of one
operand, and budgets from a few MiB up; and such jobs stopped after a few tiles and resumed,
C bit for bit the uninterrupted run's."""

from __future__ import annotations

import os
import tempfile

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

os.environ.setdefault("CUPY_TF32", "0")  # cuBLAS SGEMM in plain float32 (before cupy loads)

import bigmm  # noqa: E402
from bigmm import io  # noqa: E402
from bigmm.errors import BudgetError  # noqa: E402
from bigmm.testing import (pinned_array, random_matrix, reference_gemm,  # noqa: E402
                           relative_error, run_stopped, tolerance)
from bigmm.units import numpy_dtype  # noqa: E402

pytestmark = pytest.mark.gpu

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

ARITHMETIC = [("bigmm", None), ("bigmm", "tf32x3"), ("bigmm", "tf32"), ("cublas", None),
              ("cublas-tf32", None)]
DTYPES = ["float32", "float64", "float16", "bfloat16", "mixed"]
KINDS = ["array", "fortran", "pinned", "h5", "h5-chunked", "zarr"]
dims = st.one_of(st.integers(1, 3), st.integers(4, 300), st.integers(300, 2500))


@st.composite
def jobs(draw):
    dtype = draw(st.sampled_from(DTYPES))
    kernel, precision = draw(st.sampled_from(ARITHMETIC if dtype == "float32"
                                             else ARITHMETIC[:1] + ARITHMETIC[3:4]))
    gram = draw(st.booleans()) and draw(st.booleans())  # a quarter of the jobs
    m, n, k = draw(dims), draw(dims), draw(dims)
    ta, tb = draw(st.booleans()), draw(st.booleans())
    if gram:
        n, tb = m, not ta
    beta = draw(st.sampled_from([0.0, 0.0, 1.0, -0.5]))
    kinds = [draw(st.sampled_from(KINDS)) for _ in "ab"]
    if gram:
        kinds[1] = kinds[0]
    if dtype == "bfloat16":  # Zarr holds no bfloat16; HDF5 needs bigmm's own type
        kinds = ["array" if x in ("zarr", "h5", "h5-chunked") else x for x in kinds]
    return dict(dtype=dtype, kernel=kernel, precision=precision, gram=gram, m=m, n=n, k=k,
                ta=ta, tb=tb, alpha=draw(st.sampled_from([1.0, -1.0, 0.5, 2.25])), beta=beta,
                kinds=kinds, out=draw(st.sampled_from(["none", "array", "pinned", "h5", "zarr"]
                                                      if beta == 0 else
                                                      ["array", "pinned", "h5", "zarr"])),
                memory=draw(st.sampled_from([None, "4MiB", "16MiB", "64MiB"])),
                seed=draw(st.integers(0, 2**31)))


def _store(folder, name, kind, data, draw_chunks):
    if kind == "array":
        return data
    if kind == "fortran":
        return np.asfortranarray(data)
    if kind == "pinned":
        return pinned_array(data.shape, data.dtype, fill=data)
    if kind == "zarr":
        zarr = pytest.importorskip("zarr")
        path = os.path.join(folder, f"{name}.zarr")
        zarr.create_array(path, data=data, chunks=draw_chunks(data.shape), overwrite=True)
        return path
    with h5py.File(os.path.join(folder, f"{name}.h5"), "w") as f:
        f.create_dataset(name, data=data,
                         chunks=draw_chunks(data.shape) if kind == "h5-chunked" else None)
    return f"{os.path.join(folder, name)}.h5:/{name}"


@FUZZ
@given(jobs(), st.data())
def test_random_gpu_jobs_match_the_float64_reference(job, data):
    m, n, k, dtype = job["m"], job["n"], job["k"], job["dtype"]
    da = numpy_dtype("float32" if dtype == "mixed" else dtype)
    db = np.dtype(np.float64) if dtype == "mixed" and not job["gram"] else da
    cdt = np.float64 if np.float64 in (da, db) else np.float32

    def chunks(shape):
        return tuple(data.draw(st.integers(max(1, d // 6), d)) for d in shape)

    with tempfile.TemporaryDirectory() as folder:
        a = random_matrix((k, m) if job["ta"] else (m, k), da, job["seed"])
        b = a if job["gram"] else random_matrix((n, k) if job["tb"] else (k, n), db,
                                                job["seed"] + 1)
        c0 = random_matrix((m, n), cdt, job["seed"] + 2)
        if job["gram"]:
            c0 = (c0 + c0.T) / 2  # a Gram product with beta != 0 needs a symmetric old C
        A = _store(folder, "A", job["kinds"][0], a, chunks)
        B = A if job["gram"] else _store(folder, "B", job["kinds"][1], b, chunks)
        old = c0 if job["beta"] else np.full((m, n), np.nan, cdt)
        out = None
        if job["out"] == "array":
            out = old.copy()
        elif job["out"] == "pinned":
            out = pinned_array((m, n), cdt, fill=old)
        elif job["out"] in ("h5", "zarr"):
            out = _store(folder, "C", job["out"], old, lambda s: s) if job["beta"] else (
                os.path.join(folder, "C.zarr") if job["out"] == "zarr"
                else f"{os.path.join(folder, 'C')}.h5:/C")
        got = bigmm.matmul(A, B, out, alpha=job["alpha"], beta=job["beta"], trans_a=job["ta"],
                           trans_b=job["tb"], memory=job["memory"], host_memory="64MiB",
                           backend="cupy", kernel=job["kernel"], precision=job["precision"])
        if job["out"] in ("h5", "zarr"):
            got = _load(out)
        ref = reference_gemm(a, b, alpha=job["alpha"], beta=job["beta"], c=c0,
                             trans_a=job["ta"], trans_b=job["tb"])
        assert relative_error(got, ref) <= _bound(job, cdt, da, k, a, b, ref), job
        if job["gram"] and job["beta"] == 0:  # detected as a Gram product: mirrored
            assert np.array_equal(got, got.T), job


@st.composite
def interrupted_jobs(draw):
    dtype = draw(st.sampled_from(["float32", "float32", "float64", "float16", "mixed"]))
    kernel, precision = draw(st.sampled_from(ARITHMETIC if dtype == "float32"
                                             else ARITHMETIC[:1] + ARITHMETIC[3:4]))
    side = st.one_of(st.integers(1, 40), st.integers(300, 2500))
    return dict(dtype=dtype, kernel=kernel, precision=precision, m=draw(side), n=draw(side),
                k=draw(side), ta=draw(st.booleans()), tb=draw(st.booleans()),
                alpha=draw(st.sampled_from([1.0, -0.5])),
                beta=draw(st.sampled_from([0.0, 1.0, -0.5])),
                kinds=[draw(st.sampled_from(["array", "h5", "h5-chunked", "zarr"]))
                       for _ in "ab"],
                out=draw(st.sampled_from(["h5", "zarr"])),
                memory=draw(st.sampled_from(["4MiB", "16MiB", "64MiB"])),
                stops=draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)),
                seed=draw(st.integers(0, 2**31)))


@settings(FUZZ, max_examples=60)
@given(interrupted_jobs(), st.data())
def test_interrupted_gpu_jobs_resume_to_the_uninterrupted_run(job, data):
    m, n, k = job["m"], job["n"], job["k"]
    da = numpy_dtype("float32" if job["dtype"] == "mixed" else job["dtype"])
    db = np.dtype(np.float64) if job["dtype"] == "mixed" else da
    cdt = np.float64 if np.float64 in (da, db) else np.float32

    def chunks(shape):
        return tuple(data.draw(st.integers(max(1, d // 6), d)) for d in shape)

    with tempfile.TemporaryDirectory() as folder:
        a = random_matrix((k, m) if job["ta"] else (m, k), da, job["seed"])
        b = random_matrix((n, k) if job["tb"] else (k, n), db, job["seed"] + 1)
        c0 = random_matrix((m, n), cdt, job["seed"] + 2)
        A = _store(folder, "A", job["kinds"][0], a, chunks)
        B = _store(folder, "B", job["kinds"][1], b, chunks)
        outs = []
        for name in ("C1", "C2"):
            if job["beta"]:
                outs.append(_store(folder, name, job["out"], c0, chunks))
            else:
                outs.append(os.path.join(folder, f"{name}.zarr") if job["out"] == "zarr"
                            else f"{os.path.join(folder, name)}.h5:/{name}")
        kw = dict(alpha=job["alpha"], beta=job["beta"], trans_a=job["ta"], trans_b=job["tb"],
                  memory=job["memory"], host_memory="64MiB", backend="cupy",
                  kernel=job["kernel"], precision=job["precision"])
        schedules = []  # each run's schedule, as its journal records it

        def record(p, out):
            if len(schedules) < 1 + (out is outs[1]):
                schedules.append((io.read_journal(out) or {}).get("plan"))

        try:
            bigmm.matmul(A, B, outs[0], progress=lambda p: record(p, outs[0]), **kw)
        except BudgetError:  # chunks larger than the budget: refused, as stated
            return
        run_stopped(lambda **x: bigmm.matmul(A, B, outs[1], **kw, **x), job["stops"],
                    resumed=dict(resume=True), seen=lambda p: record(p, outs[1]))
        got = [_load(spec) for spec in outs]
        ref = reference_gemm(a, b, alpha=job["alpha"], beta=job["beta"], c=c0,
                             trans_a=job["ta"], trans_b=job["tb"])
        for x in got:
            assert relative_error(x, ref) <= _bound(job, cdt, da, k, a, b, ref), job
        # the same schedule, bit for bit (a later call may plan another: the page-locked
        # staging an earlier call kept is in its rates; it then resumes with its own)
        if schedules[0] == schedules[1]:
            assert np.array_equal(got[1], got[0], equal_nan=True), job


def _bound(job, cdt, da, k, a, b, ref) -> float:
    """The job's relative error bound against the float64 reference, by its arithmetic."""
    if job["precision"] == "tf32" or job["kernel"] == "cublas-tf32":
        return 2e-3 * _cancellation(job, a, b, ref)  # one TF32 pass: inputs rounded to 10 bits
    if job["precision"] == "tf32x3":
        return 4 * tolerance(np.float32, k)
    return tolerance(np.float64 if cdt == np.float64 else da, k)


def _cancellation(job, a, b, ref) -> float:
    """How much larger the scale of the products' rounding errors is than the result (at least
    1): each C element's error is a sum of k terms of relative size u, which is about u times
    the root of the sum of its squared terms, far more than u times the element where its
    terms cancel (a 1 x 8 row times an 8 x 1 column summing to a tenth of its terms, say)."""
    a = (a.T if job["ta"] else a).astype(np.float64)
    b = (b.T if job["tb"] else b).astype(np.float64)
    scale = abs(job["alpha"]) * np.linalg.norm(np.sqrt((a * a) @ (b * b)))
    return max(1.0, scale / max(np.linalg.norm(ref), np.finfo(np.float64).tiny))


def _load(spec):
    if spec.endswith(".zarr"):
        import zarr

        return zarr.open_array(spec, mode="r")[...]
    path, name = spec.rsplit(":/", 1)
    with h5py.File(path, "r") as f:
        return f[name][...]
