"""Plain TF32 reading its operands as stored (bigmm.backends.cuda_direct,
kernels/gemm_wgmma_direct.cu): which products take it, GPU checks of its results against a
float64 reference (within twice cuBLAS's own TF32 error), as the launcher runs it, both
through tensor maps or with the unaligned operand rounded ahead, and the rounding every plain
TF32 kernel applies (ties to even, as the tensor maps and cuBLAS's TF32 mode round)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from test_tf32_kernels import T1, _check, _ids, _presplit_device, stream_order_check
from tf32_cases import tf32_rne

from bigmm.backends.cuda_direct import direct_pays

SEED = int.from_bytes(os.urandom(4), "little")  # fresh data every run; printed on failure


@pytest.fixture(scope="module")
def cp():
    return pytest.importorskip("cupy")


@pytest.mark.parametrize("m, n, k, layout, s_aligned, pays", [
    (256, 16384, 4096, "nn", True, True),  # the planner's TF32 tile, through tensor maps
    (8192, 8192, 8192, "nn", True, True),  # square: through tensor maps too, nothing ahead
    (3072, 81920, 8192, "nn", True, True),  # 2.8 GB of operands: the n = 81920 job's steps
    (24576, 24576, 24576, "nn", True, False),  # 4.8 GB: both rounded ahead into tile order
    (16384, 256, 4096, "nn", True, True),  # op(A) the larger: read as stored all the same
    (256, 16384, 4096, "tt", True, True),  # TT
    (256, 16384, 4096, "nn", False, True),  # op(A) unaligned, the smaller: rounded ahead
    (16384, 256, 4096, "nn", False, False),  # op(A) unaligned, the larger: not this way
    (16384, 256, 4096, "tt", False, True),  # TT rounds op(B)^T ahead, N rows
    (4608, 32768, 4096, "nn", False, True),  # the most rows rounded ahead alone
    (6144, 32768, 4096, "nn", False, False),  # more rows: rounding both ahead is faster
    (256, 16384, 4096, None, True, False),  # NT, TN, op(B) unaligned (NN): not this way at all
    (0, 16384, 4096, "nn", False, False),  # no rows to round ahead
    (256, 16384, 2**29, "nn", True, False),  # K of 2^29 and more: the other paths
])
def test_direct_is_chosen_where_its_operands_can_be_read(m, n, k, layout, s_aligned, pays):
    assert direct_pays(m, n, k, layout, s_aligned) == pays


# (precision, M, N, K, trans_a, trans_b, alpha, beta, view): products the launcher runs this
# way through tensor maps (NN or TT, both operands' rows 16-byte aligned).
CASES = [
    (T1, 7, 12, 20, False, False, 1.0, 0.0, None),  # under every tile, K short of a k-tile
    (T1, 127, 132, 36, False, False, 1.0, 0.0, None),  # K one k-step past a k-tile
    (T1, 255, 4100, 1000, False, False, 1.0, 0.0, None),  # one S tile less a row, R ragged
    (T1, 257, 1000, 4100, False, False, 1.0, 0.0, None),  # one S row past a tile, K ragged
    (T1, 256, 16384, 4096, False, False, 1.0, 0.0, None),  # the planner's TF32 tile
    (T1, 6144, 1028, 1000, False, False, 1.0, 0.0, None),  # op(A) the larger, past DIRECT_ROWS
    (T1, 8, 300, 100004, False, False, 1.0, 0.0, None),  # long sums, tiny M (no split K)
    (T1, 1000, 132, 128, True, True, 1.0, 0.0, None),  # TT
    (T1, 4100, 300, 1000, True, True, -0.5, 0.75, None),  # TT with alpha and beta
    (T1, 129, 1000, 70, False, False, 2.0, 1.0, "ld"),  # NN views in NaN, beta = 1
    (T1, 1000, 129, 127, True, True, 1.5, -1.0, "ld"),  # TT views in NaN
    (T1, 300, 1000, 128, False, False, 0.0, 1.0, None),  # alpha = 0: C scaled by beta only
]

# NN and TT products whose operand along K (NN's A, TT's B) has unaligned rows and is the
# smaller: rounded ahead, the other through its tensor map.
AHEAD = [
    (T1, 7, 12, 17, False, False, 1.0, 0.0, None),  # K one past 16
    (T1, 127, 132, 33, False, False, 1.0, 0.0, None),  # K one past a k-tile
    (T1, 257, 1000, 4097, False, False, 1.0, 0.0, None),  # ragged K, one S row past a tile
    (T1, 4608, 4700, 999, False, False, 1.0, 0.0, None),  # the most rows rounded ahead
    (T1, 1000, 129, 127, True, True, 1.0, 0.5, None),  # TT, beta
]


def _s_aligned(case) -> bool:
    view, k = case[8], case[3]
    return view == "ld" or (view is None and k % 4 == 0)


def _takes_direct(cp, case):
    from bigmm.backends.cuda_direct import direct_layout

    _, m, n, k, ta, tb, _, _, _ = case
    assert direct_pays(m, n, k, "tt" if ta else "nn", _s_aligned(case))
    r = cp.empty((16, 16), np.float32)
    assert direct_layout(ta, tb, r.data.ptr, 16) == ("tt" if ta else "nn")


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_direct_tf32_matches_float64_reference(cp, case):
    _presplit_device()
    assert _s_aligned(case)
    _takes_direct(cp, case)
    _check(cp, case, SEED + 11 * CASES.index(case))


@pytest.mark.gpu
@pytest.mark.parametrize("case", AHEAD, ids=[_ids(c) for c in AHEAD])
def test_direct_with_one_operand_rounded_ahead_matches_float64_reference(cp, case):
    _presplit_device()
    assert not _s_aligned(case)
    _takes_direct(cp, case)
    _check(cp, case, SEED + 5 + 11 * AHEAD.index(case))


# NN and TT products whose operand read as stored has unaligned rows: the other kernels.
FALLBACK = [
    (T1, 129, 1000, 70, False, False, 1.0, 0.5, "odd"),  # NN unaligned views
    (T1, 1000, 129, 127, True, True, 1.0, 0.0, "odd"),  # TT unaligned views
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", FALLBACK, ids=[_ids(c) for c in FALLBACK])
def test_unaligned_products_fall_back_and_match_float64_reference(cp, case):
    _presplit_device()
    _check(cp, case, SEED + 7 + 11 * FALLBACK.index(case))


@pytest.mark.gpu
def test_direct_layout_needs_nn_or_tt_and_aligned_rows(cp):
    from bigmm.backends.cuda_direct import direct_layout

    _presplit_device()
    x = cp.empty(64, np.float32)
    assert direct_layout(False, False, x.data.ptr, 8) == "nn"
    assert direct_layout(True, True, x.data.ptr, 8) == "tt"
    assert direct_layout(False, True, x.data.ptr, 8) is None  # NT: both contiguous along K
    assert direct_layout(True, False, x.data.ptr, 8) is None  # TN: neither
    assert direct_layout(False, False, x[1:].data.ptr, 8) is None  # rows not 16-byte aligned
    assert direct_layout(False, False, x.data.ptr, 7) is None


@pytest.mark.gpu
@pytest.mark.parametrize("k", [
    2048,  # through tensor maps: no workspace
    2047,  # op(A)'s rows unaligned: rounded ahead into the shared workspace
])
def test_direct_keeps_the_order_of_the_callers_stream(cp, k):
    from bigmm.planner import direct_workspace_bytes

    _presplit_device()
    assert direct_pays(256, 8192, k, "nn", k % 4 == 0)
    stream_order_check(cp, 256, 8192, k, direct_workspace_bytes(256, 8192, k))


def _mma_sync_config():
    from bigmm.backends.kernel_configs import tile_configs

    return next(c for c in tile_configs(precision=T1).values() if c.arch is None)


@pytest.mark.gpu
@pytest.mark.parametrize("side", ["A", "B"])
@pytest.mark.parametrize("path", [
    "maps",  # both operands through tensor maps
    "ahead",  # the operand along K (rows of 255) rounded ahead by round_tiles
    "presplit",  # both rounded ahead (gemm_wgmma_split.cu)
    "in-loop",  # rounded as the wgmma kernel loads them (gemm_wgmma.cu)
    "mma.sync",  # rounded in registers (gemm_tf32.cu)
])
def test_every_plain_tf32_kernel_rounds_ties_to_even(cp, side, path):
    """x @ I (side "A") and I @ x ("B") give each kernel's TF32 value of x exactly: rounded to
    nearest with ties to even, as the tensor maps round (and cuBLAS's TF32 mode, measured)."""
    from bigmm.backends import cuda_kernels

    _presplit_device()
    rng = np.random.default_rng(SEED)
    n, k = 256, 255 if path == "ahead" else 256
    x = rng.standard_normal((n, k)).astype(np.float32)
    x[:, :8] = (x[:, :8].view(np.uint32) & np.uint32(0xFFFFE000) | np.uint32(0x1000)).view(np.float32)
    if side == "B":
        x = np.ascontiguousarray(x.T[:k])  # k x n: rows contiguous along C's columns
    eye = np.eye(k if side == "A" else n, n if side == "A" else k, dtype=np.float32)
    a, b = (x, eye) if side == "A" else (eye, x)
    c = cp.full((a.shape[0], b.shape[1]), np.nan, np.float32)
    kw = {"presplit": True} if path == "presplit" else {"presplit": False} if path == "in-loop" else (
        {"config": _mma_sync_config()} if path == "mma.sync" else {})
    cuda_kernels.gemm(cp.asarray(a), cp.asarray(b), c, precision=T1, **kw)
    want = tf32_rne(x)
    assert np.array_equal(cp.asnumpy(c)[:x.shape[0], :x.shape[1]], want), f"seed {SEED}"
