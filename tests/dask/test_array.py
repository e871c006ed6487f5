"""bigmm.dask.matmul: dask arrays in and out (NumPy or CuPy chunks, from Zarr too), against
a float64 reference and dask's own matmul; its task graph, budgets, errors and precisions.

The tests that compute on the cluster use the local cluster of conftest.py (``client``).
"""

from __future__ import annotations

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import bigmm.dask as bd  # noqa: E402
from bigmm.dask.array import _k_pieces, _operand, _rechunk_to_budget  # noqa: E402
from bigmm.errors import (BackendUnavailable, DtypeError, OptionError,  # noqa: E402
                          OutputOverflowError, ShapeError, SpecError)
from bigmm.testing import random_matrix, reference_gemm, relative_error, tolerance  # noqa: E402
from dask_cases import _stored  # noqa: E402


# ----- dask arrays ----------------------------------------------------------------------------

ARRAY_CASES = [
    # (m, k, n, A chunks, B chunks, trans_a, trans_b, dtype, alpha, memory)
    # uneven chunks on every axis; A's and B's K chunks disagree (refined, not concatenated)
    (37, 53, 29, ((10, 27), (5, 20, 28)), ((7, 46), (13, 16)), False, False, "float64", 1.0, None),
    # one block each: one task per output block, one K piece
    (31, 17, 23, ((31,), (17,)), ((17,), (23,)), False, False, "float64", 1.0, None),
    # regular chunks that divide nothing, alpha scales every K piece
    (41, 47, 33, (19, 17), (17, 13), False, False, "float64", -2.5, None),
    # one output row and one output column (1xN, Nx1 products)
    (1, 41, 19, (1, 16), (13, 8), False, False, "float64", 1.0, None),
    (23, 41, 1, (9, 14), (20, 1), False, False, "float64", 1.0, None),
    # depth 1, and K chunks of size 1 against one K chunk
    (13, 1, 11, (5, 1), (1, 4), False, False, "float64", 1.0, None),
    (13, 4, 11, (7, 1), (4, 5), False, False, "float64", 1.0, None),
    # transposed operands (stored K x M and N x K), uneven chunks
    (29, 37, 31, ((20, 17), (3, 26)), (12, 16), True, False, "float64", 1.0, None),
    (29, 37, 31, (10, 19), ((30, 1), (11, 26)), False, True, "float64", 1.0, None),
    (29, 37, 31, (15, 12), (17, 14), True, True, "float64", 0.5, None),
    # float32
    (45, 70, 38, (16, 23), (31, 20), False, False, "float32", 1.0, None),
    # a budget: the planner's tiles replace the chunks; each task fits in it
    (90, 120, 80, (25, 33), (30, 17), False, False, "float64", 1.0, 48 * 1024),
    (90, 120, 80, (33, 25), (17, 30), True, True, "float32", 1.0, "40KiB"),
]


@pytest.mark.parametrize("m,k,n,ach,bch,ta,tb,dtype,alpha,memory", ARRAY_CASES)
def test_matmul_matches_reference_and_dask(client, m, k, n, ach, bch, ta, tb, dtype, alpha,
                                            memory):
    a = random_matrix(_stored((m, k), ta), dtype, seed=m + k)
    b = random_matrix(_stored((k, n), tb), dtype, seed=k + n + 1)
    A, B = da.from_array(a, chunks=ach), da.from_array(b, chunks=bch)
    C = bd.matmul(A, B, alpha=alpha, trans_a=ta, trans_b=tb, memory=memory)
    assert C.shape == (m, n) and C.dtype == np.dtype(dtype)
    assert isinstance(C._meta, np.ndarray)
    got = client.compute(C).result()  # on the cluster
    ref = reference_gemm(a, b, alpha=alpha, trans_a=ta, trans_b=tb)
    assert got.shape == (m, n) and got.dtype == np.dtype(dtype)
    assert relative_error(got, ref) <= tolerance(dtype, k)
    theirs = alpha * ((A.T if ta else A) @ (B.T if tb else B))  # dask.array's own matmul
    assert relative_error(got, theirs.compute(scheduler="threads")) <= tolerance(dtype, k)
    if memory is None:  # the output blocks follow the inputs' chunks
        assert C.chunks == ((A.chunks[1] if ta else A.chunks[0]),
                            (B.chunks[0] if tb else B.chunks[1]))


def test_matmul_task_holds_one_block_of_each():
    """No task concatenates K blocks, also after dask's graph optimisation: each depends on at
    most the partial C, one A block and one B block; block (i, j) is a chain of one task per
    K piece."""
    from dask.core import get_dependencies

    A = da.from_array(random_matrix((40, 50), np.float64), chunks=((15, 25), (10, 30, 10)))
    B = da.from_array(random_matrix((50, 30), np.float64, seed=1), chunks=((20, 30), (30,)))
    C = bd.matmul(A, B)
    pieces = len(_k_pieces(A.chunks[1], B.chunks[0]))
    assert pieces == 4  # edges 0, 10, 20, 40, 50
    graph = dict(C.__dask_optimize__(C.__dask_graph__(), C.__dask_keys__()))
    ours = {k: get_dependencies(graph, k) for k in graph if "bigmm" in str(k[0])}
    assert len(ours) == C.numblocks[0] * C.numblocks[1] * pieces
    for deps in ours.values():
        assert len(deps) <= 3
        assert sum(d[0] == A.name for d in deps) == 1 and sum(d[0] == B.name for d in deps) == 1


BUDGETS = [
    # (memory, trans_a, trans_b)
    # small: many tiles and K pieces
    (24 * 1024, False, False),
    # middle, both operands stored transposed
    (100 * 1024, True, True),
    # large: fewer, larger blocks than the inputs' own chunks
    (1 << 20, False, True),
]


@pytest.mark.parametrize("memory,ta,tb", BUDGETS)
def test_matmul_budget_bounds_each_task(client, memory, ta, tb):
    m, k, n = 110, 150, 95
    a = random_matrix(_stored((m, k), ta), np.float64)
    b = random_matrix(_stored((k, n), tb), np.float64, seed=2)
    A, B = da.from_array(a, chunks=(17, 19)), da.from_array(b, chunks=(23, 11))
    A2, B2 = _rechunk_to_budget(A, B, m, n, k, np.dtype(np.float64), ta, tb, memory)
    bm, bk = max(A2.chunks[1 if ta else 0]), max(A2.chunks[0 if ta else 1])
    bk2, bn = max(B2.chunks[1 if tb else 0]), max(B2.chunks[0 if tb else 1])
    assert bk == bk2
    assert 8 * (2 * bm * bn + 2 * bm * bk + 2 * bk * bn) <= memory  # the docstring's bound
    C = bd.matmul(A, B, trans_a=ta, trans_b=tb, memory=memory)
    assert C.chunks == (A2.chunks[1 if ta else 0], B2.chunks[0 if tb else 1])
    got = client.compute(C).result()
    assert relative_error(got, reference_gemm(a, b, trans_a=ta, trans_b=tb)) <= \
        tolerance(np.float64, k)


def test_matmul_odd_blocks(client):
    """Fortran-ordered and strided blocks, mixed float32/float64, zero depth."""
    a = random_matrix((30, 44), np.float64)
    b = random_matrix((44, 25), np.float32, seed=3)
    A = da.from_array(np.asfortranarray(a), chunks=(30, 13))  # F-contiguous blocks
    B = da.from_array(b, chunks=(5, 6))[:, ::-1]  # strided (reversed) blocks
    C = bd.matmul(A, B)
    assert C.dtype == np.float64  # mixed inputs in float64
    assert relative_error(client.compute(C).result(), a @ b[:, ::-1].astype(np.float64)) <= \
        tolerance(np.float32, 44)
    Z = bd.matmul(da.zeros((6, 0), chunks=3), da.zeros((0, 4), chunks=2))
    assert np.array_equal(client.compute(Z).result(), np.zeros((6, 4)))


EMPTY_CASES = [
    # (a's shape, b's shape): with a budget, as without one
    # no rows
    ((0, 5), (5, 3)),
    # no columns
    ((4, 5), (5, 0)),
    # depth 0: zeros
    ((4, 0), (0, 3)),
]


@pytest.mark.parametrize("sa,sb", EMPTY_CASES)
def test_matmul_empty_products_with_a_budget(sa, sb):
    C = bd.matmul(da.ones(sa, chunks=2), da.ones(sb, chunks=2), memory="1MiB")
    assert np.array_equal(C.compute(scheduler="sync"), np.zeros((sa[0], sb[1])))


def test_operand_layouts():
    """Blocks reach the gemm C-contiguous: F-ordered ones as their transpose, others copied."""
    x = np.asfortranarray(random_matrix((6, 9), np.float64))
    y, t = _operand(x, None, 1, False)
    assert t is True and y.flags.c_contiguous and np.shares_memory(x, y)
    y, t = _operand(x, (2, 5), 1, False)
    assert t is True and np.array_equal(y.T, x[:, 2:5])
    z = random_matrix((6, 9), np.float64)[:, ::2]
    y, t = _operand(z, None, 0, False)
    assert t is False and y.flags.c_contiguous and np.array_equal(y, z)


ARRAY_ERRORS = [
    # (a, b, kwargs, error, message)
    # inner dimensions differ
    (np.ones((3, 4)), np.ones((5, 2)), {}, ShapeError, "4 != 5"),
    # 1-D operand
    (np.ones(4), np.ones((4, 2)), {}, ShapeError, "2-D"),
    # integer dtype
    (np.ones((3, 4), int), np.ones((4, 2)), {}, DtypeError, "bfloat16, float32, float64"),
    # out_dtype not among those of float64 operands
    (np.ones((3, 4)), np.ones((4, 2)), {"out_dtype": "float16"}, OptionError, "out_dtype"),
    # cupy backend for NumPy chunks
    (np.ones((3, 4)), np.ones((4, 2)), {"backend": "cupy"}, BackendUnavailable, "CuPy chunks"),
    # unknown backend name
    (np.ones((3, 4)), np.ones((4, 2)), {"backend": "tpu"}, BackendUnavailable, "one of"),
    # alpha that is not a number
    (np.ones((3, 4)), np.ones((4, 2)), {"alpha": "x"}, ValueError, "alpha"),
    # masked chunks, in a or in b: the gemm would count masked elements as data
    (np.ma.masked_greater(np.arange(12.0).reshape(3, 4), 5), np.ones((4, 2)), {}, DtypeError,
     "Expected a with NumPy or CuPy chunks. Got numpy.ma.MaskedArray chunks"),
    (np.ones((3, 4)), np.ma.masked_less(np.ones((4, 2)), 2), {}, DtypeError,
     "Expected b with NumPy or CuPy chunks"),
]


@pytest.mark.parametrize("a,b,kwargs,error,message", ARRAY_ERRORS)
def test_matmul_errors(a, b, kwargs, error, message):
    with pytest.raises(error, match=message):
        bd.matmul(da.from_array(a), da.from_array(b), **kwargs)


@pytest.mark.parametrize("a", [
    "a.h5:/A",  # a spec: a 0-D array of text to dask
    b"a.h5:/A",  # the same in bytes
], ids=["str", "bytes"])
def test_matmul_refuses_a_file_spec(a):
    with pytest.raises(SpecError, match=r"Expected a dask array for a .*matmul_files.*Got"):
        bd.matmul(a, da.ones((4, 2)))


@pytest.mark.gpu
def test_matmul_cupy_chunks_keep_their_type():
    import cupy

    a, b = random_matrix((300, 500), np.float32), random_matrix((500, 200), np.float32, seed=1)
    A = da.from_array(cupy.asarray(a), chunks=(128, 96), asarray=False)
    B = da.from_array(cupy.asarray(b), chunks=(70, 128), asarray=False)
    C = bd.matmul(A, B)
    assert isinstance(C._meta, cupy.ndarray)
    got = C.compute(scheduler="sync")
    assert isinstance(got, cupy.ndarray)
    assert relative_error(cupy.asnumpy(got), reference_gemm(a, b)) <= tolerance(np.float32, 500)


def test_matmul_narrowed_past_the_output_dtype_raises():
    a, b = np.full((4, 4096), 200, np.float16), np.full((4096, 4), 200, np.float16)
    C = bd.matmul(da.from_array(a, chunks=(4, 1024)), da.from_array(b, chunks=(1024, 4)),
                  out_dtype="float16")
    with pytest.raises(OutputOverflowError, match="largest finite value 65504"):
        C.compute(scheduler="sync")


def test_matmul_alpha_zero_reads_neither_operand():
    a = random_matrix((40, 30), np.float32)
    a[3, 4] = np.nan
    C = bd.matmul(da.from_array(a, chunks=(16, 8)),
                  da.from_array(random_matrix((30, 20), np.float32, 1), chunks=(8, 16)),
                  alpha=0.0)
    assert np.array_equal(C.compute(scheduler="sync"), np.zeros((40, 20), np.float32))


# ----- Zarr ---------------------------------------------------------------------------------------

def test_matmul_on_from_zarr_arrays(client, tmp_path):
    """bigmm.dask.matmul on da.from_zarr arrays: their chunks are the stores' chunks."""
    from bigmm.testing import zarr_array

    a = random_matrix((83, 97), np.float64, seed=51)
    b = random_matrix((97, 61), np.float64, seed=52)
    za = zarr_array(tmp_path / "a.zarr", a, chunks=(30, 40), codec="zstd")
    zb = zarr_array(tmp_path / "s.zarr", b, path="B", chunks=(25, 33), endian="big")
    x, y = da.from_zarr(za), da.from_zarr(str(tmp_path / "s.zarr"), component="B")
    c = bd.matmul(x, y, alpha=2.0)
    assert c.chunks == (x.chunks[0], y.chunks[1])
    got = c.compute()
    assert relative_error(got, 2.0 * (a @ b)) <= tolerance(np.float64, 97)
    # and back into a Zarr store through dask
    c.to_zarr(str(tmp_path / "c.zarr"))
    assert np.array_equal(da.from_zarr(str(tmp_path / "c.zarr")).compute(), got)
    del zb


# ----- precision= -------------------------------------------------------------------------

PRECISION_ERRORS = [
    # (a dtype, b dtype, precision, message)
    # not a precision
    ("float32", "float32", "fp8", "Expected precision to be one of"),
    # float64 runs in float64
    ("float64", "float64", "tf32", "float64 operands"),
    # float32 @ float64 is multiplied in float64
    ("float32", "float64", "tf32x3", "float64 operands"),
]


@pytest.mark.parametrize("ta, tb, precision, message", PRECISION_ERRORS)
def test_matmul_precision_errors(ta, tb, precision, message):
    a, b = da.from_array(np.ones((3, 4), ta)), da.from_array(np.ones((4, 2), tb))
    with pytest.raises(OptionError, match=message):
        bd.matmul(a, b, precision=precision)


@pytest.mark.parametrize("precision", ["float32", "TF32x3", "tf32"])
def test_matmul_numpy_chunks_in_any_precision_are_float32(client, precision):
    a, b = random_matrix((61, 83), np.float32, 41), random_matrix((83, 47), np.float32, 42)
    C = bd.matmul(da.from_array(a, chunks=(20, 30)), da.from_array(b, chunks=(30, 25)),
                  precision=precision)
    got = C.compute()
    assert got.dtype == np.float32
    assert relative_error(got, reference_gemm(a, b)) <= tolerance(np.float32, 83)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tf32x3", "tf32"])
def test_matmul_cupy_chunks_in_a_tensor_core_precision(precision):
    import cupy

    a, b = random_matrix((300, 500), np.float32, 47), random_matrix((500, 200), np.float32, 48)
    A = da.from_array(cupy.asarray(a), chunks=(128, 96), asarray=False)
    B = da.from_array(cupy.asarray(b), chunks=(70, 128), asarray=False)
    got = cupy.asnumpy(bd.matmul(A, B, precision=precision).compute(scheduler="sync"))
    bound = tolerance(np.float32, 500) if precision == "tf32x3" else 2e-3
    assert relative_error(got, reference_gemm(a, b)) <= bound
