"""Plain TF32 reading one operand as stored (bigmm.backends.cuda_direct,
kernels/gemm_wgmma_direct.cu): which products take it, and GPU checks of its results against a
float64 reference (within twice cuBLAS's own TF32 error), as the launcher runs it."""

from __future__ import annotations

import os

import numpy as np
import pytest
from test_tf32_kernels import T1, _check, _ids, _presplit_device, stream_order_check

from bigmm.backends.cuda_direct import direct_pays

SEED = int.from_bytes(os.urandom(4), "little")  # fresh data every run; printed on failure


@pytest.fixture(scope="module")
def cp():
    return pytest.importorskip("cupy")


@pytest.mark.parametrize("m, n, k, layout, pays", [
    (256, 16384, 4096, "nn", True),  # the planner's TF32 tile: op(A) the smaller operand
    (16384, 256, 4096, "nn", False),  # op(A) the larger: its rounding would cost as much as the product
    (1000, 1000, 1000, "nn", True),  # equal: either way
    (16384, 256, 4096, "tt", True),  # TT rounds op(B)^T, N rows
    (256, 16384, 4096, "tt", False),  # TT with op(B)^T the larger
    (256, 16384, 4096, None, False),  # NT, TN, unaligned: not this way at all
    (2304, 32768, 4096, "nn", True),  # the 8 GiB job's strips: faster than rounding both ahead
    (4608, 32768, 4096, "nn", True),  # the most rows rounded ahead alone
    (6144, 32768, 4096, "nn", False),  # more rows: rounding both ahead is faster
    (0, 16384, 4096, "nn", False),  # no rows: nothing to launch
    (256, 16384, 2**29, "nn", False),  # K of 2^29 and more: the other paths
])
def test_direct_is_chosen_where_the_operand_rounded_ahead_is_the_smaller(m, n, k, layout, pays):
    assert direct_pays(m, n, k, layout) == pays


# (precision, M, N, K, trans_a, trans_b, alpha, beta, view): products the launcher runs this
# way (NN or TT, the smaller operand rounded ahead).
CASES = [
    (T1, 1, 1, 1, False, False, 1.0, 0.0, None),  # one element, K = 1
    (T1, 7, 9, 17, False, False, 1.0, 0.0, None),  # under every tile, K one past 16
    (T1, 127, 129, 33, False, False, 1.0, 0.0, None),  # K one past a k-tile
    (T1, 255, 4097, 1000, False, False, 1.0, 0.0, None),  # one S tile less a row, R ragged
    (T1, 257, 1000, 4097, False, False, 1.0, 0.0, None),  # one S row past a tile, K ragged
    (T1, 256, 16384, 4096, False, False, 1.0, 0.0, None),  # the planner's TF32 tile
    (T1, 4608, 4700, 1000, False, False, 1.0, 0.0, None),  # the most rows rounded ahead
    (T1, 7, 300, 100003, False, False, 1.0, 0.0, None),  # long sums, tiny M (no split K)
    (T1, 1000, 129, 127, True, True, 1.0, 0.0, None),  # TT
    (T1, 4097, 300, 1000, True, True, -0.5, 0.75, None),  # TT with alpha and beta
    (T1, 129, 1000, 70, False, False, 2.0, 1.0, "ld"),  # NN views, aligned, beta = 1
    (T1, 1000, 129, 127, True, True, 1.5, -1.0, "ld"),  # TT views
    (T1, 300, 1000, 129, False, False, 0.0, 1.0, None),  # alpha = 0: C scaled by beta only
]


def _takes_direct(cp, case):
    from bigmm.backends.cuda_direct import direct_layout

    _, m, n, k, ta, tb, _, _, _ = case
    assert direct_pays(m, n, k, "tt" if ta else "nn")
    r = cp.empty((16, 16), np.float32)
    assert direct_layout(ta, tb, r.data.ptr, 16) == ("tt" if ta else "nn")


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_direct_tf32_matches_float64_reference(cp, case):
    _presplit_device()
    _takes_direct(cp, case)
    _check(cp, case, SEED + 11 * CASES.index(case))


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
def test_direct_keeps_the_order_of_the_callers_stream(cp):
    from bigmm.planner import direct_workspace_bytes

    _presplit_device()
    assert direct_pays(256, 8192, 2048, "nn")
    stream_order_check(cp, 256, 8192, 2048, direct_workspace_bytes(256, 8192, 2048))
