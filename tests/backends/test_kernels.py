"""GPU tests of bigmm's CUDA GEMM kernels (bigmm.backends.cuda_kernels.gemm).

Every case draws fresh random operands, poisons the output (NaN) and compares against a
float64 reference: the kernel's relative error must be no worse than twice cuBLAS's own
(cupy, same dtype, same operands) plus a small floor.  Views are cut out of NaN-filled
buffers, and the bytes around them must stay NaN (nothing written out of bounds).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from bigmm.errors import DtypeError, KernelError, ShapeError
from bigmm.testing import random_matrix, reference_gemm, relative_error, tolerance

os.environ.setdefault("CUPY_TF32", "0")  # cuBLAS SGEMM in plain float32 (before cupy loads)

pytestmark = pytest.mark.gpu

F32, F64 = "float32", "float64"
SEED = int.from_bytes(os.urandom(4), "little")  # fresh data every run; printed on failure

# (dtype, M, N, K, trans_a, trans_b, alpha, beta, view)
# view: None = contiguous arrays; "ld" = rows padded to an aligned leading dimension;
# "odd" = odd leading dimension and a pointer 1 element past 16-byte alignment.
CASES = [
    (F32, 1, 1, 1, False, False, 1.0, 0.0, None),  # one element, one product term
    (F32, 7, 7, 7, False, False, 1.0, 0.0, None),  # every dim under one 16-byte vector
    (F32, 127, 129, 127, False, False, 1.0, 0.0, None),  # M, K just under a tile, N just over
    (F32, 129, 127, 129, False, False, 1.0, 0.0, None),  # M, K just over a tile, N just under
    (F32, 1000, 1000, 1000, False, False, 1.0, 0.0, None),  # medium, no tile multiple
    (F32, 4097, 129, 7, False, False, 1.0, 0.0, None),  # tall: M past 4096, K < one k-tile
    (F32, 129, 4097, 1, False, False, 1.0, 0.0, None),  # wide: N past 4096, K = 1
    (F32, 1, 1000, 4097, False, False, 1.0, 0.0, None),  # a single row of C
    (F32, 1000, 1, 4097, False, False, 1.0, 0.0, None),  # a single column of C
    (F32, 7, 7, 100003, False, False, 1.0, 0.0, None),  # large K, tiny M and N
    (F32, 129, 127, 20001, False, False, 1.0, 0.0, None),  # large K over a few tiles
    (F32, 2049, 2047, 1000, False, False, 1.0, 0.0, None),  # the large-tile config, ragged
    (F32, 4097, 4097, 129, False, False, 1.0, 0.0, None),  # largest C, ragged everywhere
    (F32, 127, 129, 1000, True, False, 1.0, 0.0, None),  # TN
    (F32, 127, 129, 1000, False, True, 1.0, 0.0, None),  # NT
    (F32, 127, 129, 1000, True, True, 1.0, 0.0, None),  # TT
    (F32, 1000, 1000, 129, True, True, 1.0, 0.0, None),  # TT on the large-tile config
    (F32, 129, 1000, 7, True, False, -0.5, 0.75, None),  # TN with alpha and beta
    (F32, 1000, 127, 129, False, False, 2.0, 1.0, None),  # beta = 1: the K-panel accumulate
    (F32, 127, 1000, 129, False, True, 0.0, 1.0, None),  # alpha = 0: C scaled by beta only
    (F32, 129, 127, 1000, False, False, 1.0, 0.0, "ld"),  # NN views, aligned leading dims
    (F32, 129, 127, 1000, False, False, 1.0, 0.5, "odd"),  # NN views, unaligned ld and pointers
    (F32, 1000, 129, 127, True, False, 1.0, 0.0, "odd"),  # TN unaligned: the element-copy path
    (F32, 1000, 129, 127, True, True, 1.5, 0.0, "ld"),  # TT aligned views
    (F32, 127, 1000, 129, False, True, 1.0, -1.0, "odd"),  # NT unaligned, beta = -1
    (F32, 2049, 2047, 129, True, False, 1.0, 0.0, "odd"),  # large tile, unaligned TN
    (F64, 1, 1, 1, False, False, 1.0, 0.0, None),  # one element
    (F64, 7, 127, 129, False, False, 1.0, 0.0, None),  # small M, ragged N and K
    (F64, 129, 127, 1000, True, False, 1.0, 0.0, None),  # TN
    (F64, 129, 127, 1000, False, True, 1.0, 0.0, None),  # NT
    (F64, 1000, 1000, 129, True, True, 1.0, 0.0, None),  # TT on the large-tile config
    (F64, 1000, 1000, 1000, False, False, 1.0, 0.0, None),  # medium NN
    (F64, 7, 7, 100003, False, False, 1.0, 0.0, None),  # large K, tiny M and N
    (F64, 2049, 129, 4097, False, False, -1.0, 0.5, None),  # alpha and beta, K past 4096
    (F64, 129, 1000, 127, True, False, 1.0, 1.0, "odd"),  # TN unaligned views, accumulate
    (F64, 1000, 129, 127, False, False, 1.0, 0.0, "ld"),  # NN aligned views
]


def _ids(case):
    dt, m, n, k, ta, tb, al, be, view = case
    return f"{dt}-{m}x{n}x{k}-{'T' if ta else 'N'}{'T' if tb else 'N'}-a{al}-b{be}-{view}"


def _embed(cp, host, view, dtype, salt):
    """A device copy of `host`, as a view into a NaN-filled buffer when `view` is set.
    Returns (array, buffer or None, (row, col) of the view in the buffer)."""
    rows, cols = host.shape
    if view is None:
        return cp.asarray(host), None, (0, 0)
    if view == "ld":
        ld, c0 = -(-(cols + 5) // 4) * 4, 4  # padded 16-byte multiple; view starts aligned
    else:
        ld, c0 = cols + 3 + (salt % 2) * 2, 1  # odd leading dimension; pointer off by one
    big = cp.full((rows + 2, ld), np.nan, dtype=dtype)
    v = big[1 : rows + 1, c0 : c0 + cols]
    v[...] = cp.asarray(host)
    return v, big, (1, c0)


@pytest.fixture(scope="module")
def cp():
    return pytest.importorskip("cupy")


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_gemm_matches_float64_reference(cp, case):
    _check_case(cp, case, SEED + 10 * CASES.index(case))


def _table_configs():
    from bigmm.backends import cuda_kernels

    # the dtype's own precision; the TF32 configs are tests/backends/test_tf32_kernels.py's
    return sorted(n for n, c in cuda_kernels.tile_configs().items() if c.precision == c.dtype)


# Every config of the table (not only those the rules pick today), on ragged shapes in all four
# transposes, unaligned views with alpha and beta: what the autotuner may choose must be right.
CONFIG_SHAPES = [
    (1000, 1027, 333, False, False, 1.0, 0.0, "odd"),  # NN, unaligned views, C never read
    (1000, 1027, 333, True, False, -0.5, 0.75, "odd"),  # TN, alpha and beta
    (129, 4097, 7, False, True, 1.0, 1.0, "ld"),  # NT, K under one k-tile, accumulate
    (129, 4097, 7, True, True, 2.0, 0.0, None),  # TT, wide
]


@pytest.mark.parametrize("name", _table_configs())
@pytest.mark.parametrize("shape", CONFIG_SHAPES, ids=[_ids(("", *s)) for s in CONFIG_SHAPES])
def test_every_table_config(cp, name, shape):
    from bigmm.backends import cuda_kernels

    cfg = cuda_kernels.tile_configs()[name]
    _check_case(cp, (cfg.dtype, *shape), SEED + 7 * CONFIG_SHAPES.index(shape), config=cfg)


def _check_case(cp, case, seed, config=None):
    from bigmm.backends import cuda_kernels

    dtype, m, n, k, ta, tb, alpha, beta, view = case
    a_h = random_matrix((k, m) if ta else (m, k), dtype, seed)
    b_h = random_matrix((n, k) if tb else (k, n), dtype, seed + 1)
    c_h = random_matrix((m, n), dtype, seed + 2)
    ref = reference_gemm(a_h, b_h, alpha=alpha, beta=beta, c=c_h, trans_a=ta, trans_b=tb)

    a, _, _ = _embed(cp, a_h, view, dtype, 0)
    b, _, _ = _embed(cp, b_h, view, dtype, 1)
    c, c_big, (r0, c0) = _embed(cp, c_h, view, dtype, 2)
    if beta == 0:
        c.fill(np.nan)  # must never be read
    cuda_kernels.gemm(a, b, c, alpha, beta, trans_a=ta, trans_b=tb, config=config)
    out = cp.asnumpy(c)

    # cuBLAS on the same operands, same dtype.
    opa = cp.asarray(a_h).T if ta else cp.asarray(a_h)
    opb = cp.asarray(b_h).T if tb else cp.asarray(b_h)
    blas = alpha * cp.matmul(opa, opb)
    if beta != 0:
        blas += beta * cp.asarray(c_h)
    err_blas = relative_error(cp.asnumpy(blas), ref)
    err = relative_error(out, ref)
    eps = float(np.finfo(dtype).eps)
    bound = 2 * err_blas + 4 * eps
    assert err <= bound, f"seed {SEED}: error {err:.3e} > bound {bound:.3e} (cuBLAS {err_blas:.3e})"
    assert err <= tolerance(dtype, k), f"seed {SEED}: error {err:.3e} over the float bound"
    if c_big is not None:  # nothing written around the view
        outside = cp.ones(c_big.shape, dtype=bool)
        outside[r0 : r0 + m, c0 : c0 + n] = False
        assert bool(cp.isnan(c_big[outside]).all()), f"seed {SEED}: wrote outside the view of C"


# (dtype, M, N, K, trans_a, trans_b) products run on a non-default stream.
STREAM_CASES = [
    (F32, 300, 200, 100, False, False),  # small config on a stream
    (F64, 300, 2000, 100, True, True),  # large config on a stream
]


@pytest.mark.parametrize("case", STREAM_CASES)
def test_gemm_on_a_stream(cp, case):
    from bigmm.backends import cuda_kernels

    dtype, m, n, k, ta, tb = case
    a = cp.asarray(random_matrix((k, m) if ta else (m, k), dtype, SEED))
    b = cp.asarray(random_matrix((n, k) if tb else (k, n), dtype, SEED + 1))
    c = cp.full((m, n), np.nan, dtype=dtype)
    stream = cp.cuda.Stream(non_blocking=True)
    cuda_kernels.gemm(a, b, c, 1.0, 0.0, ta, tb, stream=stream)
    stream.synchronize()
    ref = reference_gemm(cp.asnumpy(a), cp.asnumpy(b), trans_a=ta, trans_b=tb)
    assert relative_error(cp.asnumpy(c), ref) < 1e-5


# (dtype, M, N, K, split_k, beta): K split across blocks, partials summed by the reduction.
SPLIT_CASES = [
    (F32, 129, 127, 4097, 7, 0.0),  # forced 7 splits, NaN-poisoned C never read
    (F32, 7, 1000, 3000, 3, 0.5),  # 3 splits with beta: C read once, in the reduction
    (F64, 1000, 7, 2049, 64, 1.0),  # many short splits (the last one partial)
    (F32, 200, 300, 100, 1, 0.0),  # split_k = 1 turns splitting off
]


@pytest.mark.parametrize("case", SPLIT_CASES)
def test_split_k(cp, case):
    from bigmm.backends import cuda_kernels

    dtype, m, n, k, splits, beta = case
    a_h = random_matrix((m, k), dtype, SEED + 3)
    b_h = random_matrix((k, n), dtype, SEED + 4)
    c_h = random_matrix((m, n), dtype, SEED + 5)
    c = cp.asarray(c_h) if beta else cp.full((m, n), np.nan, dtype=dtype)
    cuda_kernels.gemm(cp.asarray(a_h), cp.asarray(b_h), c, 1.0, beta, split_k=splits)
    ref = reference_gemm(a_h, b_h, beta=beta, c=c_h)
    assert relative_error(cp.asnumpy(c), ref) <= tolerance(dtype, k)


def test_k_zero_scales_c(cp):
    from bigmm.backends import cuda_kernels

    # K = 0: op(A) @ op(B) is all zeros, C = beta * C; beta = 0 overwrites NaN with zeros.
    c = cp.full((5, 9), 2.0, dtype=np.float32)
    cuda_kernels.gemm(cp.zeros((5, 0), np.float32), cp.zeros((0, 9), np.float32), c, 1.0, 0.5)
    assert bool((c == 1.0).all())
    c.fill(np.nan)
    cuda_kernels.gemm(cp.zeros((5, 0), np.float32), cp.zeros((0, 9), np.float32), c, 1.0, 0.0)
    assert bool((c == 0.0).all())


# (what is wrong, a, b, c, expected error) -- built from lambdas over cupy.
ERROR_CASES = [
    ("float16", lambda cp: (cp.ones((4, 4), cp.float16),) * 3, DtypeError),  # unsupported dtype
    ("mixed", lambda cp: (cp.ones((4, 4), cp.float32), cp.ones((4, 4), cp.float64), cp.ones((4, 4), cp.float32)), DtypeError),  # dtypes disagree
    ("inner", lambda cp: (cp.ones((4, 5), cp.float32), cp.ones((4, 4), cp.float32), cp.ones((4, 4), cp.float32)), ShapeError),  # K mismatch
    ("c shape", lambda cp: (cp.ones((4, 4), cp.float32), cp.ones((4, 4), cp.float32), cp.ones((4, 5), cp.float32)), ShapeError),  # C wrong shape
    ("1-d", lambda cp: (cp.ones(4, cp.float32), cp.ones((4, 4), cp.float32), cp.ones((4, 4), cp.float32)), ShapeError),  # not 2-D
    ("numpy", lambda cp: (np.ones((4, 4), np.float32), cp.ones((4, 4), cp.float32), cp.ones((4, 4), cp.float32)), KernelError),  # host array
    ("stride", lambda cp: (cp.ones((4, 8), cp.float32)[:, ::2], cp.ones((4, 4), cp.float32), cp.ones((4, 4), cp.float32)), KernelError),  # non-unit inner stride
    ("overlap", lambda cp: (lambda x: (x[:, :4], cp.ones((4, 4), cp.float32), x[:, 2:6]))(cp.ones((4, 8), cp.float32)), KernelError),  # C overlaps A
]


@pytest.mark.parametrize("what, make, error", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_gemm_rejects_bad_arguments(cp, what, make, error):
    from bigmm.backends import cuda_kernels

    a, b, c = make(cp)
    with pytest.raises(error):
        cuda_kernels.gemm(a, b, c)


def test_resource_usage_has_no_local_memory(cp):
    from bigmm.backends import cuda_kernels

    # The configs the table picks by default: compiled here by NVRTC, no spills.
    for dtype in (F32, F64):
        cfg = cuda_kernels.select_config(dtype, 8192, 8192, 8192)
        kern = cuda_kernels._gemm_kernel(cfg, "kv")
        assert kern.attributes["local_size_bytes"] == 0, (cfg.name, kern.attributes)


# ----- checksum updates fused into the product ---------------------------------------------
# (case from CASES, accumulate): every transpose and load path, unaligned views, both dtypes,
# K under one k-tile and K over thousands, the large-tile config, one row or column of C.
FUSED = [(CASES[i], acc) for i, acc in (
    (2, False),   # NN, M, K just under a tile, N just over
    (5, True),    # tall, K < one k-tile (the first k-tile partial and the only one)
    (7, False),   # a single row of C, deep K
    (8, True),    # a single column of C
    (11, False),  # the large-tile config, ragged
    (13, True),   # TN
    (14, False),  # NT
    (15, True),   # TT
    (21, True),   # NN unaligned views and pointers (element copies), beta
    (22, False),  # TN unaligned
    (24, True),   # NT unaligned
    (28, False),  # float64 TN (DMMA)
    (33, True),   # float64 alpha and beta, K past 4096
    (34, False),  # float64 TN unaligned
)]


@pytest.mark.parametrize("case, accumulate", FUSED,
                         ids=[f"{_ids(c)}-{'acc' if a else 'set'}" for c, a in FUSED])
def test_fused_checks_match_the_float64_sums(cp, case, accumulate):
    """gemm(..., checks=) leaves C exactly as without, and its column and row updates are
    the float64 weighted sums of op(B) and op(A) within the bound the checks allow."""
    from bigmm.backends import cuda_kernels
    from bigmm.backends.base import GemmChecks
    from bigmm.checksum import FUSED_ROUNDINGS

    dtype, m, n, k, ta, tb, alpha, beta, view = case
    seed = SEED + 13 * FUSED.index((case, accumulate))
    rng = np.random.default_rng(seed)
    a_h = random_matrix((k, m) if ta else (m, k), dtype, seed)
    b_h = random_matrix((n, k) if tb else (k, n), dtype, seed + 1)
    c_h = random_matrix((m, n), dtype, seed + 2)
    a, _, _ = _embed(cp, a_h, view, dtype, 0)
    b, _, _ = _embed(cp, b_h, view, dtype, 1)
    c = cp.asarray(c_h)
    plain = c.copy()
    cuda_kernels.gemm(a, b, plain, alpha, beta, trans_a=ta, trans_b=tb, split_k=1)  # as with checks
    w = {name: rng.standard_normal(k) for name in ("col_w", "row_w")}
    w.update(col_wa=np.abs(w["col_w"]) + rng.random(k), row_wa=np.abs(w["row_w"]) + rng.random(k))
    start = {name: rng.standard_normal(size) for name, size in
             (("col", n), ("col_abs", n), ("row", m), ("row_abs", m))}
    out = {name: cp.asarray(v) for name, v in start.items()}
    checks = GemmChecks(**{name: cp.asarray(v) for name, v in w.items()}, **out,
                        scale=alpha, accumulate=accumulate)
    cuda_kernels.gemm(a, b, c, alpha, beta, trans_a=ta, trans_b=tb, checks=checks)
    assert bool((c == plain).all()), f"seed {seed}: C differs with the checks"

    opa = (a_h.T if ta else a_h).astype(np.float64)
    opb = (b_h.T if tb else b_h).astype(np.float64)
    ref = {"col": alpha * (w["col_w"] @ opb), "col_abs": abs(alpha) * (w["col_wa"] @ np.abs(opb)),
           "row": alpha * (opa @ w["row_w"]), "row_abs": abs(alpha) * (np.abs(opa) @ w["row_wa"])}
    # a k-tile summed in the dtype, then float64 sums over K (and the reference's own)
    rel = (FUSED_ROUNDINGS + 4) * float(np.finfo(dtype).eps) + 2 * k * float(np.finfo(F64).eps)
    for name, expect in ref.items():
        got = cp.asnumpy(out[name]) - (start[name] if accumulate else 0.0)
        bound = rel * ref[name.split("_")[0] + "_abs"] + 1e-300
        err = np.abs(got - expect)
        assert (err <= bound).all(), (f"seed {seed}: {name} off by {float((err / bound).max()):.3g}"
                                      " x the bound")


def test_fused_checks_compile_without_local_memory(cp):
    from bigmm.backends import cuda_kernels

    # float32 (the configs the table picks for large, thin and small tiles): no spills; the
    # float64 tensor-core configs, at 512 threads a block, spill a few bytes with the checks
    for dtype, most in ((F32, 0), (F64, 64)):
        for shape in ((8192, 8192), (256, 16384), (512, 512)):
            cfg = cuda_kernels.select_config(dtype, *shape, 4096)
            for entry in ("kv", "vk", "ss"):
                kern = cuda_kernels._gemm_kernel(cfg, entry, checks=True)
                assert kern.attributes["local_size_bytes"] <= most, (cfg.name, entry,
                                                                     kern.attributes)


# (scale of A, scale of B): float32 operands whose elements and products are subnormal in part,
# which IEEE float32 (and cuBLAS SGEMM) keeps and a flush-to-zero build would lose.
SUBNORMAL = [
    (2.0**-122, 2.0**40),  # many elements of A below 2^-126
    (2.0**-60, 2.0**-64),  # products near and below 2^-126
]


@pytest.mark.parametrize("scale_a, scale_b", SUBNORMAL)
def test_float32_kernel_keeps_subnormals(cp, scale_a, scale_b):
    from bigmm.backends import cuda_kernels

    rng = np.random.default_rng(SEED)
    a = (rng.standard_normal((256, 300)) * scale_a).astype(np.float32)
    b = (rng.standard_normal((300, 200)) * scale_b).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    c = cp.full((256, 200), np.nan, dtype=np.float32)
    cuda_kernels.gemm(cp.asarray(a), cp.asarray(b), c)
    got = cp.asnumpy(c)
    sgemm = cp.asnumpy(cp.asarray(a) @ cp.asarray(b))
    assert relative_error(got, ref) <= 2 * max(relative_error(sgemm, ref), 1e-7), (
        f"seed {SEED}: {relative_error(got, ref):.2e} against cuBLAS {relative_error(sgemm, ref):.2e}")


# (dtype, precision, n, k, trans, beta): the upper triangle of C = op(a) op(a)^T + beta C in
# one launch that computes only the kernel's tiles on or above the diagonal (Gram products)
UPPER = [
    (F32, "float32", 1031, 700, True, 0.0),    # A^T A, ragged: the diagonal cuts the tiles
    (F32, "float32", 2049, 129, False, 0.5),   # A A^T with beta: skipped tiles keep old C
    (F32, "tf32x3", 1031, 700, True, 0.0),     # the tensor-core family (wgmma on sm_90a)
    (F32, "tf32", 1031, 700, False, 0.0),
    (F64, "float64", 1031, 300, True, 1.0),    # float64, accumulate
    (F32, "float32", 100, 50, True, 0.0),      # one or a few tiles
]


@pytest.mark.parametrize("case", UPPER, ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[4]}-b{c[5]}"
                                            for c in UPPER])
def test_upper_computes_the_tiles_on_and_above_the_diagonal(cp, case):
    from bigmm.backends import cuda_kernels

    dtype, precision, n, k, trans, beta = case
    rng = np.random.default_rng(SEED)
    a = rng.standard_normal((k, n) if trans else (n, k)).astype(dtype)
    old = rng.standard_normal((n, n)).astype(dtype) if beta else np.full((n, n), np.nan, dtype)
    ref = reference_gemm(a, a, beta=beta, c=old if beta else None, trans_a=trans,
                         trans_b=not trans)
    c = cp.asarray(old)
    da = cp.asarray(a)
    cuda_kernels.gemm(da, da, c, 1.0, beta, trans, not trans, upper=True,
                      precision=None if precision == dtype else precision)
    got = cp.asnumpy(c)
    upper = np.triu(np.ones((n, n), bool))
    tol = 4e-3 if precision == "tf32" else tolerance(dtype, k)
    assert relative_error(got[upper], ref[upper]) <= tol, f"seed {SEED}"
    # below the diagonal: each element computed (in a tile the diagonal crosses) or untouched
    lower = ~upper
    done = np.isclose(got, ref, rtol=0, atol=10 * tol * np.abs(ref).max()) & lower
    kept = (np.isnan(got) if not beta else got == old) & lower
    assert np.all(done | kept | upper), f"seed {SEED}"
    if n > 512:  # most tiles below the diagonal were not computed
        assert kept.sum() > 0.3 * lower.sum()
