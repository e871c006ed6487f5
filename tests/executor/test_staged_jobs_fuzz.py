"""Random jobs through ``bigmm.matmul`` on a staging backend that plans as a GPU does
(hypothesis): the asynchronous test backend with the Registers ability and calibrated rates,
so that the API's host paths (staged, copied in place from arrays the user page-locked, locked
for the run) are planned, run, interrupted and resumed as on a GPU. C against the float64
reference, bit for bit against the uninterrupted run where both ran one schedule; no copy from
memory that was not locked, nothing left locked."""

from __future__ import annotations

import os
import tempfile

import h5py
import numpy as np
from executor_cases import RegisteringAsyncBackend
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bigmm
from bigmm import api, io
from bigmm.errors import BudgetError
from bigmm.planner import Rates
from bigmm.testing import (random_matrix, reference_gemm, relative_error, run_stopped,
                           tolerance)

#: A GPU's rates (an H100's gemm and link; page-locking at the rate each job draws).
GPU = dict(flops=50e12, read_bytes=2e9, write_bytes=1e9, h2d_bytes=50e9, duplex=0.85)


class _PlannedAsGpu(RegisteringAsyncBackend):
    """The registering test backend with rates: the API plans its host paths as on a GPU."""

    def __init__(self, seed, lock, pinned):
        super().__init__(seed)
        self.lock_rate = lock
        for x in pinned:  # the arrays the user page-locked
            self.pin(x)

    def rates(self, dtype, limit=None):
        return Rates(**GPU, register_bytes=self.lock_rate)


dims = st.one_of(st.integers(1, 40), st.integers(100, 300))


@st.composite
def jobs(draw):
    return dict(m=draw(dims), n=draw(dims), k=draw(dims),
                dtype=draw(st.sampled_from(["float32", "float64"])),
                ta=draw(st.booleans()), tb=draw(st.booleans()),
                alpha=draw(st.sampled_from([1.0, -0.5])),
                beta=draw(st.sampled_from([0.0, 1.0, -0.5])),
                kinds=[draw(st.sampled_from(["array", "pinned", "h5"])) for _ in "ab"],
                out=draw(st.sampled_from(["h5", "zarr", "array", "pinned"])),
                budgets=draw(st.sampled_from([("256KiB", "128KiB"), ("1MiB", "512KiB"),
                                              ("2MiB", "1MiB"), ("4MiB", "8MiB")])),
                lock=draw(st.sampled_from([None, 1e6, 1e12])),  # locking: unknown, slow, fast
                stops=draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)),
                seed=draw(st.integers(0, 2**16)))


def _operand(folder, name, kind, data):
    if kind != "h5":
        return data.copy()
    with h5py.File(os.path.join(folder, f"{name}.h5"), "w") as f:
        f[name] = data
    return f"{os.path.join(folder, name)}.h5:/{name}"


def _output(folder, name, kind, c0, beta):
    """C for the job: an array (old C, or NaN where beta == 0), or a file spec (holding old C
    where beta != 0; not there yet where beta == 0)."""
    if kind in ("array", "pinned"):
        return c0.copy()
    if kind == "zarr":
        spec = os.path.join(folder, f"{name}.zarr")
        if beta:
            import zarr

            zarr.create_array(spec, data=c0, chunks=tuple(max(1, d // 3) for d in c0.shape))
        return spec
    spec = f"{os.path.join(folder, name)}.h5:/{name}"
    if beta:
        with h5py.File(os.path.join(folder, f"{name}.h5"), "w") as f:
            f[name] = c0
    return spec


def _load(out):
    if isinstance(out, np.ndarray):
        return out
    if out.endswith(".zarr"):
        import zarr

        return zarr.open_array(out, mode="r")[...]
    path, name = out.rsplit(":/", 1)
    with h5py.File(path, "r") as f:
        return f[name][...]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(jobs())
def test_staged_jobs_resume_to_the_uninterrupted_run(job):
    m, n, k, dtype = job["m"], job["n"], job["k"], np.dtype(job["dtype"])
    with tempfile.TemporaryDirectory() as folder:
        a = random_matrix((k, m) if job["ta"] else (m, k), dtype, job["seed"])
        b = random_matrix((n, k) if job["tb"] else (k, n), dtype, job["seed"] + 1)
        c0 = random_matrix((m, n), dtype, job["seed"] + 2)
        if not job["beta"]:
            c0[...] = np.nan  # must never leak into the result
        A, B = (_operand(folder, name, kind, x)
                for name, kind, x in zip("AB", job["kinds"], (a, b)))
        outs = [_output(folder, name, job["out"], c0, job["beta"]) for name in ("C1", "C2")]
        pinned = [x for x, kind in zip((A, B), job["kinds"]) if kind == "pinned"]
        pinned += [x for x in outs if job["out"] == "pinned"]
        made = []

        def resolve(name, kernel, precision=None):
            made.append(_PlannedAsGpu(len(made), job["lock"], pinned))
            return made[-1]

        saved = api.resolve_backend
        api.resolve_backend = resolve
        job["schedules"] = []
        try:
            if not _run(job, A, B, outs):
                return
        finally:
            api.resolve_backend = saved
        got = [_load(x) for x in outs]
        ref = reference_gemm(a, b, alpha=job["alpha"], beta=job["beta"], c=c0,
                             trans_a=job["ta"], trans_b=job["tb"])
        for x in got:
            assert np.isfinite(x).all() and relative_error(x, ref) <= tolerance(dtype, k), job
        if job["schedules"][0] is not None and job["schedules"][0] == job["schedules"][1]:
            assert np.array_equal(got[1], got[0]), job
        for be in made:
            assert not be.violations and not be.locked, job  # every lock released


def _run(job, A, B, outs):
    """The uninterrupted run into outs[0]; into outs[1] (a file) runs stopped after a few
    tiles and resumed, or (an array) one run. Records each run's schedule in
    job["schedules"] (a file's as its journal records it). False where the budgets are under
    the job's minimum (refused before anything ran)."""
    memory, host = job["budgets"]
    kw = dict(alpha=job["alpha"], beta=job["beta"], trans_a=job["ta"], trans_b=job["tb"],
              memory=memory, host_memory=host, backend="numpy", io_threads=2)
    try:
        job["schedules"].append(bigmm.plan(A, B, outs[0], **kw).key())
    except BudgetError:  # budgets under the job's minimum: refused, as stated
        return False
    if isinstance(outs[1], np.ndarray):  # no journal: the schedules as planned just before
        bigmm.matmul(A, B, outs[0], **kw)
        job["schedules"].append(bigmm.plan(A, B, outs[1], **kw).key())
        bigmm.matmul(A, B, outs[1], **kw)
        return True

    def first(p):
        if len(job["schedules"]) < 2:  # as run (its journal), not as planned before
            job["schedules"][0] = (io.read_journal(outs[0]) or {}).get("plan")

    bigmm.matmul(A, B, outs[0], progress=first, **kw)
    def second(p):
        if len(job["schedules"]) < 2:
            job["schedules"].append((io.read_journal(outs[1]) or {}).get("plan"))

    run_stopped(lambda **x: bigmm.matmul(A, B, outs[1], **kw, **x), job["stops"],
                resumed=dict(resume=True), seen=second)
    return True
