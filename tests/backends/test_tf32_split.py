"""CPU checks of the 3xTF32 split's arithmetic (kernels/common.cuh tf32_rna, tf32_split) and of
plain TF32's rounding (tf32_rne), emulated in NumPy bit for bit (tests/backends/tf32_cases.py):
the split's TF32 rounding is round to nearest with ties away from zero on the top 19 bits
(cvt.rna.tf32.f32), plain TF32's ties to even, big + small reconstructs x to 2^-23, the
three-term product's error against float64 stays within 2x a float32 FMA chain's on the
contract's distributions for K >= 64, and nothing near the float32 limits turns into Inf or NaN.
"""

from __future__ import annotations

import numpy as np
import pytest

from tf32_cases import (DISTRIBUTIONS, SMALL_SCALE, chain_sgemm, emulate_gemm, errors, operands, tf32_rna,
                        tf32_rne, tf32_split)

F32_MAX = np.finfo(np.float32).max


def _bits(x) -> np.ndarray:
    return np.asarray(x, np.float32).reshape(-1).view(np.uint32)


# (x, expected TF32 bits): ties away from zero, carries into the exponent, the overflow guard.
RNA_CASES = [
    (1.0, 0x3F800000),  # exact
    (np.uint32(0x3F801000).view(np.float32), 0x3F802000),  # a tie rounds away from zero (up)
    (np.uint32(0xBF801000).view(np.float32), 0xBF802000),  # negative tie: away from zero (down)
    (np.uint32(0x3F800FFF).view(np.float32), 0x3F800000),  # just under the tie: down
    (np.uint32(0x3FFFF000).view(np.float32), 0x40000000),  # carry into the exponent: 2.0
    (np.uint32(0x00001000).view(np.float32), 0x00002000),  # subnormal tie
    (np.uint32(0x7F7FEFFF).view(np.float32), 0x7F7FE000),  # largest magnitude still rounded
    (F32_MAX, 0x7F7FE000),  # would round to Inf: truncated instead
    (-F32_MAX, 0xFF7FE000),
    (np.float32(np.inf), 0x7F800000),  # Inf stays Inf
]


@pytest.mark.parametrize("x, expected", RNA_CASES)
def test_tf32_rna_rounds_like_cvt_rna(x, expected):
    assert int(_bits(tf32_rna(np.float32(x)))[0]) == expected


def test_tf32_rna_keeps_nan_non_finite():
    x = np.array([np.nan, -np.nan], np.float32)
    x = np.concatenate([x, np.uint32([0x7FFFFFFF, 0xFFC00001]).view(np.float32)])
    assert not np.isfinite(tf32_rna(x)).any()


# (x bits, expected TF32 bits) of plain TF32's rounding: what the TMA unit gave for these
# values read through a TFLOAT32 tensor map on an H100.
RNE_CASES = [
    (0x3F801000, 0x3F800000),  # a tie to the even neighbour: down
    (0x3F803000, 0x3F804000),  # a tie to the even neighbour: up
    (0xBF801000, 0xBF800000),  # negative tie: to even
    (0x3F801001, 0x3F802000),  # just over the tie: up
    (0x3F800FFF, 0x3F800000),  # just under: down
    (0x00003000, 0x00004000),  # subnormal tie, kept (not flushed)
    (0x00001000, 0x00000000),  # subnormal tie to even: zero
    (0x007FFFFF, 0x00800000),  # the largest subnormal rounds up to the smallest normal
    (0x7F7FEFFF, 0x7F7FE000),  # the largest magnitude that stays finite
    (0x7F7FF000, 0x7F800000),  # the tie above it rounds to Inf (as cuBLAS's TF32 mode)
    (0xFF7FFFFF, 0xFF800000),  # -float32 max: -Inf
    (0x7F800000, 0x7F800000),  # Inf stays Inf
]


@pytest.mark.parametrize("x, expected", RNE_CASES)
def test_tf32_rne_rounds_ties_to_even_as_tensor_maps_do(x, expected):
    assert int(_bits(tf32_rne(np.uint32(x).view(np.float32)))[0]) == expected


def test_tf32_rne_keeps_nan_nan():
    x = np.uint32([0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF]).view(np.float32)
    assert np.isnan(tf32_rne(x)).all()


def test_tf32_rne_differs_from_rna_on_ties_only():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(200_000).astype(np.float32)
    x[:1000] = (x[:1000].view(np.uint32) & np.uint32(0xFFFFE000) | np.uint32(0x1000)).view(np.float32)
    tie = (_bits(x) & 0x1FFF) == 0x1000
    differ = _bits(tf32_rne(x)) != _bits(tf32_rna(x))
    assert tie[:1000].all() and (differ == (tie & ((_bits(x) & 0x2000) == 0))).all()


def test_tf32_rna_is_nearest_on_random_floats():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(100_000).astype(np.float32) * np.exp2(rng.integers(-100, 100, 100_000)).astype(np.float32)
    t = tf32_rna(x)
    assert not (_bits(t) & 0x1FFF).any()  # 10 mantissa bits left
    err = np.abs(t.astype(np.float64) - x) / np.abs(x.astype(np.float64))
    assert err.max() <= 2.0**-11 * (1 + 1e-7)  # half a TF32 ulp


@pytest.mark.parametrize("scale", [1.0, 2.0**-120, 2.0**100, 2.0**127])
def test_split_reconstructs_to_float32(scale):
    rng = np.random.default_rng(2)
    x = (np.clip(rng.standard_normal(100_000), -1.99, 1.99) * scale).astype(np.float32)
    x[:7] = [F32_MAX, -F32_MAX, np.float32(3.3e38), 1.0, -2.0, np.float32(2.0**-126), 0.0]
    big, small = tf32_split(x)
    assert np.isfinite(big).all() and np.isfinite(small).all()
    assert not (_bits(big) & 0x1FFF).any() and not (_bits(small) & 0x1FFF).any()
    back = big.astype(np.float64) + small.astype(np.float64) / SMALL_SCALE
    err = np.abs(back - x)
    # 2^-23 relative (the small part's own rounding); below 2^-115 also TF32's subnormal spacing
    bound = 2.0**-23 * np.abs(x.astype(np.float64)) + 2.0**-136 / SMALL_SCALE
    assert (err <= bound).all()


def test_split_of_non_finite_stays_non_finite():
    x = np.array([np.inf, -np.inf, np.nan], np.float32)
    big, _ = tf32_split(x)
    assert not np.isfinite(big).any()


# (distribution, K): the contract's distributions, K from the smallest 3xTF32 sum up.
CONTRACT = [(d, k) for d in DISTRIBUTIONS if d != "wide_k" for k in (64, 100, 300)] + [
    ("wide_k", 512),  # range inside each sum: about one term dominates until K is large
]


@pytest.mark.parametrize("dist, k", CONTRACT)
def test_three_terms_within_twice_float32(dist, k):
    a, b = operands(dist, 160, 144, k, seed=k)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    fro, elem = errors(emulate_gemm(a, b, passes=3), ref, a, b)
    fro32, elem32 = errors(chain_sgemm(a, b), ref, a, b)
    assert fro <= 2 * fro32 and elem <= 2 * elem32, (fro, fro32, elem, elem32)


@pytest.mark.parametrize("dist", sorted(DISTRIBUTIONS))
def test_no_inf_or_nan_from_the_split(dist):
    a, b = operands(dist, 64, 48, 40, seed=3)
    for passes in (3, 1):
        assert np.isfinite(emulate_gemm(a, b, passes=passes)).all(), passes


def test_one_pass_tf32_error_is_tf32s():
    a, b = operands("normal", 128, 128, 512, seed=4)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    fro, _ = errors(emulate_gemm(a, b, passes=1), ref, a, b)
    assert 2.0**-14 < fro < 2.0**-10  # about 3e-4: the operands' 11 significant bits


def test_small_k_is_why_tf32x3_starts_at_64():
    # At K = 1 the split's own error (its small parts' rounding, the dropped small*small) is
    # about 3x one float32 rounding, and at K = 16 some draws of the "wide" operands (a few
    # large elements carry the Frobenius norm) still pass 2x: the launcher runs K <
    # TF32X3_MIN_K in float32.
    from bigmm.backends.kernel_configs import TF32X3_MIN_K

    a, b = operands("normal", 256, 256, 1, seed=5)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    fro, _ = errors(emulate_gemm(a, b, passes=3), ref, a, b)
    fro32, _ = errors(chain_sgemm(a, b), ref, a, b)
    assert fro > 2 * fro32 and TF32X3_MIN_K == 64
    worst = 0.0
    for seed in range(1, 211, 7):  # 30 draws
        a, b = operands("wide", 256, 256, 16, seed=seed)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        fro, _ = errors(emulate_gemm(a, b, passes=3), ref, a, b)
        fro32, _ = errors(chain_sgemm(a, b), ref, a, b)
        worst = max(worst, fro / fro32)
    assert worst > 2


# The wgmma kernel (gemm_wgmma.cu, three register tiles) sums big*big over k-tiles of 4 k-steps in
# the tensor cores before each rounded addition; cuda_kernels runs it from K = 64 on
# (TF32X3_WGMMA_MIN_K), shorter products on mma.sync.
WGMMA_CONTRACT = [(d, k) for d in DISTRIBUTIONS if d != "wide_k" for k in (64, 100, 300)] + [
    ("wide_k", 512),
]


@pytest.mark.parametrize("dist, k", WGMMA_CONTRACT)
def test_wgmma_k_tiles_within_twice_float32(dist, k):
    from bigmm.backends.kernel_configs import TF32X3_WGMMA_MIN_K

    assert k >= TF32X3_WGMMA_MIN_K
    a, b = operands(dist, 160, 144, k, seed=k + 1)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    fro, elem = errors(emulate_gemm(a, b, passes=3, ktile=4), ref, a, b)
    fro32, elem32 = errors(chain_sgemm(a, b), ref, a, b)
    assert fro <= 2 * fro32 and elem <= 2 * elem32, (fro, fro32, elem, elem32)


def test_wgmma_k_tiles_match_per_step_sums_when_one_step():
    # ktile = 1 is the mma.sync emulation itself
    a, b = operands("normal", 32, 24, 40, seed=6)
    assert np.array_equal(emulate_gemm(a, b, ktile=1), emulate_gemm(a, b))
