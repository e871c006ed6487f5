"""precision= on the GPU end to end: the out-of-core pipeline with bigmm's 3xTF32 and TF32
kernels and cuBLAS's TF32 mode, on NumPy arrays and HDF5 files under small budgets.

Every product is checked against a float64 reference on fresh random data (array outputs
poisoned with NaN first) with the bounds of tests/backends/test_tf32_kernels.py: 3xTF32 within
twice cuBLAS SGEMM's error on the same operands plus 4 eps, TF32 within twice cuBLAS TF32's
plus 2^-11; float32 within float32's tolerance.
"""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest

os.environ.setdefault("CUPY_TF32", "0")  # cuBLAS SGEMM in plain float32 (before cupy loads)

import bigmm  # noqa: E402
from bigmm.errors import OptionError  # noqa: E402
from bigmm.testing import random_matrix, reference_gemm, relative_error, tolerance  # noqa: E402

pytestmark = pytest.mark.gpu

HOST = "64MiB"  # fixed host staging budget: plans do not depend on the machine's RAM
F32 = np.float32
EPS = float(np.finfo(F32).eps)

CASES = [
    # (precision, kernel, m, n, k, trans_a, trans_b, alpha, beta, memory, inputs, output)
    # 3xTF32, ragged shapes, many tiles and K panels, HDF5 in and out
    ("tf32x3", "bigmm", 1000, 900, 1100, False, False, 1.0, 0.0, 500_000, "h5", "h5"),
    # 3xTF32, A transposed, alpha and beta (old C read), arrays in and out
    ("tf32x3", "bigmm", 777, 1031, 1201, True, False, -1.5, 0.5, 1_000_000, "array", "array"),
    # 3xTF32, both transposed, deep panels (the wgmma kernels, K >= 64), HDF5 in; C fits on
    # the device (order resident-c)
    ("tf32x3", "bigmm", 1297, 613, 3001, True, True, 2.0, 0.0, 8_000_000, "h5", "array"),
    # TF32, B transposed, arrays in, HDF5 out
    ("tf32", "bigmm", 1000, 900, 1100, False, True, 1.0, 0.0, 500_000, "array", "h5"),
    # TF32, both transposed, negative beta
    ("tf32", "bigmm", 611, 701, 1023, True, True, 1.0, -1.0, 500_000, "h5", "array"),
    # cuBLAS's TF32 mode by precision
    ("tf32", "cublas", 1000, 900, 1100, False, False, 1.0, 0.0, 500_000, "h5", "h5"),
    # the default named, bigmm's kernel and cuBLAS
    ("float32", "bigmm", 999, 1001, 700, False, False, 1.0, 0.0, 500_000, "array", "array"),
    ("float32", "cublas", 999, 1001, 700, True, False, 1.0, 0.0, 500_000, "h5", "array"),
]


def _ids(c):
    return (f"{c[0]}-{c[1]}-{c[2]}x{c[3]}x{c[4]}-{'T' if c[5] else 'N'}{'T' if c[6] else 'N'}"
            f"-{c[10]}-{c[11]}")


def _h5(path, name, array):
    with h5py.File(path, "a") as f:
        if name in f:
            del f[name]
        f.create_dataset(name, data=array)
    return f"{path}:/{name}"


def _cublas_error(a, b, c0, alpha, beta, ta, tb, tf32: bool, ref) -> float:
    """cuBLAS's error on the same product in core: SGEMM, or its TF32 mode."""
    import cupy
    from cupy._core import _routines_linalg as rl

    opa = cupy.asarray(a).T if ta else cupy.asarray(a)
    opb = cupy.asarray(b).T if tb else cupy.asarray(b)
    before = rl.get_compute_type(np.float32)
    rl.set_compute_type(np.float32, rl.COMPUTE_TYPE_TF32 if tf32 else rl.COMPUTE_TYPE_DEFAULT)
    try:
        got = alpha * cupy.matmul(opa, opb)
    finally:
        rl.set_compute_type(np.float32, before)
    if beta != 0:
        got += beta * cupy.asarray(c0)
    return relative_error(cupy.asnumpy(got), ref)


def _bound(precision, k, a, b, c0, alpha, beta, ta, tb, ref) -> float:
    if precision == "float32":
        return tolerance(F32, k)
    if precision == "tf32x3":
        return 2 * _cublas_error(a, b, c0, alpha, beta, ta, tb, False, ref) + 4 * EPS
    return 2 * _cublas_error(a, b, c0, alpha, beta, ta, tb, True, ref) + 2.0 ** -11


@pytest.mark.parametrize("precision, kernel, m, n, k, ta, tb, alpha, beta, memory, inputs, "
                         "output", CASES, ids=[_ids(c) for c in CASES])
def test_out_of_core_product_in_each_precision(tmp_path, precision, kernel, m, n, k, ta, tb,
                                               alpha, beta, memory, inputs, output):
    seed = int.from_bytes(os.urandom(4), "little")  # fresh data every run
    a = random_matrix((k, m) if ta else (m, k), F32, seed)
    b = random_matrix((n, k) if tb else (k, n), F32, seed + 1)
    c0 = random_matrix((m, n), F32, seed + 2)
    a_in = _h5(tmp_path / "a.h5", "A", a) if inputs == "h5" else a
    b_in = _h5(tmp_path / "b.h5", "B", b) if inputs == "h5" else b
    if output == "h5":
        out = _h5(tmp_path / "c.h5", "C", c0) if beta != 0 else f"{tmp_path / 'c.h5'}:/C"
    else:
        out = c0.copy() if beta != 0 else np.full((m, n), np.nan, F32)
    kw = dict(alpha=alpha, beta=beta, trans_a=ta, trans_b=tb, memory=memory, host_memory=HOST,
              backend="cupy", kernel=kernel, precision=precision)
    p = bigmm.plan(a_in, b_in, out, **kw)
    # many steps: many C tiles, or every tile resident on the device while its K panels stream
    assert p.n_tiles * p.nk >= 8 and (p.n_tiles >= 4 or p.order == "resident-c"), str(p)
    assert p.arithmetic == {"float32": "IEEE float32 (CUDA cores)",
                            "tf32x3": "3xTF32 (float32 accuracy on tensor cores)"}.get(
        precision, p.arithmetic) and "CPU" not in p.arithmetic
    result, stats = bigmm.matmul(a_in, b_in, out, stats=True, **kw)
    if output == "h5":
        with h5py.File(tmp_path / "c.h5", "r") as f:
            got = f["C"][...]
            assert f["C"].attrs["bigmm_complete"]
    else:
        got = result
    ref = reference_gemm(a, b, alpha=alpha, beta=beta, c=c0, trans_a=ta, trans_b=tb)
    err, bound = relative_error(got, ref), _bound(precision, k, a, b, c0, alpha, beta, ta, tb,
                                                  ref)
    assert err <= bound, f"seed {seed}: error {err:.3e} > bound {bound:.3e}"
    assert stats.tiles_done == p.n_tiles


def test_presplit_plan_holds_its_workspace_in_the_budget(monkeypatch):
    from dataclasses import replace

    from bigmm import planstore
    from bigmm.planner import split_workspace_bytes

    seed = int.from_bytes(os.urandom(4), "little")
    m, n, k = 3000, 2600, 5000
    a, b = random_matrix((m, k), F32, seed), random_matrix((k, n), F32, seed + 1)
    out = np.full((m, n), np.nan, F32)
    kw = dict(memory=160_000_000, host_memory="256MiB", backend="cupy", precision="tf32x3")
    # tiles large enough to split ahead (staged within 256 MiB): in a job of a millisecond's
    # arithmetic the steps' fixed costs may make the planner prefer fewer, unsplit ones
    real = planstore.make_plan  # (a plan searched by time goes through the plan store)
    monkeypatch.setattr(planstore, "make_plan", lambda *args, **kwargs: real(
        *args, **dict(kwargs, tile=(2048, 2600, 1024), order="stream")))
    p = bigmm.plan(a, b, out, **kw)
    if not p.presplit:
        pytest.skip("splitting ahead runs on compute capability 9.0 (sm_90a) only")
    assert p.splits_ahead, str(p)
    # out of core (more than one step, whichever tiles the calibrated rates choose)
    assert p.n_tiles * p.nk >= 2 and p.device_bytes <= p.device_budget, str(p)
    assert (p.device_bytes - replace(p, presplit=0).device_bytes
            == split_workspace_bytes(p.bm, p.bn, p.bk, 2))
    assert "split panels" in str(p)
    got = bigmm.matmul(a, b, out, **kw)
    ref = reference_gemm(a, b)
    err, bound = relative_error(got, ref), _bound("tf32x3", k, a, b, None, 1.0, 0.0, False,
                                                  False, ref)
    assert err <= bound, f"seed {seed}: error {err:.3e} > bound {bound:.3e}"


@pytest.mark.parametrize("precision, kernel", [("tf32", "bigmm"), ("tf32x3", "bigmm"),
                                               ("tf32", "cublas")])
def test_checksums_pass_on_correct_tensor_core_products(tmp_path, precision, kernel):
    a, b = random_matrix((900, 1500), F32, 3), random_matrix((1500, 700), F32, 4)
    sa, sb = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
    out, stats = bigmm.matmul(sa, sb, f"{tmp_path / 'c.h5'}:/C", memory=800_000,
                              host_memory=HOST, backend="cupy", kernel=kernel,
                              precision=precision, verify="checksum", stats=True)
    assert stats.tiles_checked == stats.tiles_total > 4 and stats.checksum_mismatches == 0
    assert bigmm.verify.verify(sa, sb, out, precision=precision).passed


def test_backend_precision_options_and_rates():
    import cupy

    from bigmm.backends import get_backend

    with pytest.raises(OptionError, match="cuBLAS has no float32-accurate"):
        get_backend("cupy", kernel="cublas", precision="tf32x3")
    with pytest.raises(OptionError, match="kernel='cublas-tf32'"):
        get_backend("cupy", kernel="cublas-tf32", precision="float32")
    rates = {}
    for precision in ("float32", "tf32x3", "tf32"):
        be = get_backend("cupy", precision=precision.upper())
        try:
            assert be.precision == precision
            assert be.fuses_checks == (precision == "float32")
            assert ("precision" in be.describe()) == (precision != "float32")
            rates[precision] = be.rates("float32", 256 << 20).flops
            if precision != "float32":  # float64 products stay in float64
                x = cupy.ones((4, 4), np.float64)
                with pytest.raises(OptionError, match="float32 operands"):
                    be.gemm(x, x, cupy.zeros((4, 4)), 1.0, 0.0, False, False)
        finally:
            be.close()
    # tensor cores: 3xTF32 about 1.7x and TF32 about 3.5x the CUDA cores' rate (H100)
    assert rates["float32"] < rates["tf32x3"] < rates["tf32"], rates
    legacy = get_backend("cupy", kernel="cublas-tf32")
    try:
        assert legacy.precision == "tf32" and legacy.kernel == "cublas-tf32"
    finally:
        legacy.close()
