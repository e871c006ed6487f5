"""C tiles with NaN or infinities: written where an operand holds one, an OutputOverflowError
where A, B and the old C are all finite (the arithmetic overflowed), on the NumPy backend and
the asynchronous staging one; alpha == 0 reads neither A nor B."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from executor_cases import BACKENDS, array_run

import bigmm
from bigmm.errors import OutputOverflowError
from bigmm.planner import make_plan
from bigmm.testing import random_matrix, relative_error, tolerance

M, N, K = 61, 47, 53
F32 = np.float32


def _plan(backend, order=None, beta=0.0, m=M, n=N, k=K):
    return make_plan(m, n, k, "float32", reads_c=beta != 0, device_budget=4 * 40000,
                     staging=backend.staging, align=8,
                     tile=(16, n if order == "resident-c" else 16, 16), order=order)


def _operands(seed=0):
    return random_matrix((M, K), F32, seed), random_matrix((K, N), F32, seed + 1)


def _product(a, b, c, alpha, beta):
    with np.errstate(all="ignore"):
        return (alpha * (a.astype(np.float64) @ b.astype(np.float64))
                + (beta * c.astype(np.float64) if beta else 0))


CASES = [
    # (what is put where, beta, order, error expected)
    ("big A row", 0.0, None, True),              # finite A and B, one product past float32
    ("big A row, NaN elsewhere", 0.0, None, True),  # a NaN in another tile's rows explains nothing
    ("big A row, NaN in the tile", 0.0, None, True),  # nor one in another row of the same tile
    ("NaN in the tile's A row", 0.0, None, False),  # NaN carried, as NumPy's
    ("inf in B's column", 0.0, "resident-b", False),  # infinity carried
    ("inf in old C", 1.0, None, False),          # the old C's infinity carried
    ("big old C", 2.0, "stream", True),          # beta * C past float32
    ("big A row", 0.0, "resident-c", True),      # every strip on the device
    ("big A row", 0.0, "whole-b", True),         # all of B on the device
]


@pytest.mark.parametrize("bname", list(BACKENDS))
@pytest.mark.parametrize("what,beta,order,error", CASES)
def test_non_finite_tiles(bname, what, beta, order, error):
    backend = BACKENDS[bname]()
    a, b = _operands()
    c0 = random_matrix((M, N), F32, 7)
    if what.startswith("big A row"):
        a[40, 3], b[3, 30] = 3e37, 1e3  # C[40, 30] about 3e40
    if what.endswith("NaN elsewhere"):
        a[2, 5] = np.nan  # rows 0:16, not those of C[40, 30]
    if what.endswith("NaN in the tile"):
        a[41, 5] = np.nan  # row 41: C[41, :] NaN, carried; C[40, 30] still the overflow
    if what == "NaN in the tile's A row":
        a[40, 3] = np.nan
    if what == "inf in B's column":
        b[10, 30] = np.inf
    if what == "inf in old C":
        c0[40, 30] = -np.inf
    if what == "big old C":
        c0[40, 30] = 3e38
    c = c0.copy()
    plan = _plan(backend, order, beta)
    if error:
        # only C[40, 30] unexplained, whatever else its tile holds
        with pytest.raises(OutputOverflowError,
                           match=r"Got 1 infinite .* rows 32:48, columns \d+:\d+ of .* finite"):
            array_run(backend, a, b, c, plan, 1.0, beta)
        return
    array_run(backend, a, b, c, plan, 1.0, beta)
    want = _product(a, b, c0, 1.0, beta)
    bad = ~np.isfinite(want)
    assert bad.any() and np.array_equal(np.isnan(c), np.isnan(want))
    assert np.array_equal(c[bad & ~np.isnan(want)], want[bad & ~np.isnan(want)].astype(F32))
    assert relative_error(np.where(bad, 0, c), np.where(bad, 0, want)) <= tolerance(F32, K)


@pytest.mark.parametrize("bname", list(BACKENDS))
@pytest.mark.parametrize("beta", [0.0, 0.5])  # C zeros; C scaled
def test_alpha_zero_reads_neither_operand(bname, beta):
    backend = BACKENDS[bname]()
    a, b = _operands()
    a[3, :], b[:, 9] = np.nan, np.inf
    c0 = random_matrix((M, N), F32, 7)
    c = c0.copy()
    array_run(backend, a, b, c, _plan(backend, beta=beta), 0.0, beta)
    assert np.array_equal(c, (c0 * F32(beta)) if beta else np.zeros_like(c))


def test_overflow_leaves_a_file_output_incomplete(tmp_path):
    a, b = _operands()
    a[40, 3], b[3, 30] = 3e37, 1e3
    with h5py.File(tmp_path / "ab.h5", "w") as f:
        f["A"], f["B"] = a, b
    out = f"{tmp_path / 'c.h5'}:/C"
    with pytest.raises(OutputOverflowError, match="scale the operands down"):
        bigmm.matmul(f"{tmp_path / 'ab.h5'}:/A", f"{tmp_path / 'ab.h5'}:/B", out=out,
                     memory="16KiB")
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert not f["C"].attrs["bigmm_complete"]
    with pytest.raises(OutputOverflowError):  # a resume meets the same tile again
        bigmm.matmul(f"{tmp_path / 'ab.h5'}:/A", f"{tmp_path / 'ab.h5'}:/B", out=out,
                     memory="16KiB", resume=True)


@pytest.mark.parametrize("poison,error", [
    (3e20, True),    # A^T A past float32 on the diagonal tile
    (np.nan, False),  # a NaN carried into its row and column of C
])
def test_gram_tiles(poison, error):
    a = random_matrix((300, 40), F32, 3)
    a[100, 7] = poison
    if error:
        with pytest.raises(OutputOverflowError):
            bigmm.gram(a, memory="64KiB")
        return
    c = bigmm.gram(a, memory="64KiB")
    assert np.isnan(c[7]).all() and np.isnan(c[:, 7]).all()
    assert np.isfinite(np.delete(np.delete(c, 7, 0), 7, 1)).all()


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["bigmm", "cublas", "cublas-tf32"])
def test_gpu_overflow_and_alpha_zero(kernel):
    a, b = _operands()
    a[40, 3], b[3, 30] = 3e37, 1e3
    with pytest.raises(OutputOverflowError, match=r"rows \d+:\d+, columns \d+:\d+"):
        bigmm.matmul(a, b, backend="cupy", kernel=kernel, memory="16KiB")
    a[2, 2] = np.nan
    c = bigmm.matmul(a, b, backend="cupy", kernel=kernel, memory="16KiB", alpha=0.0)
    assert np.array_equal(c, np.zeros((M, N), F32))  # A and B not read
    a[40, 3] = np.inf  # now from the operands: written
    c = bigmm.matmul(a, b, backend="cupy", kernel=kernel, memory="16KiB")
    assert np.isnan(c[2]).all() and np.isinf(c[40, 30])
