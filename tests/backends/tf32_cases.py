"""The TF32 split in NumPy and the operand distributions of the 3xTF32 accuracy contract, shared
by the CPU tests (test_tf32_split.py) and the GPU tests (test_tf32_kernels.py).

The emulation follows kernels/common.cuh bit for bit where the kernels do plain integer and
float32 arithmetic (tf32_rna, tf32_rne, tf32_split); the tensor core's sum of one k-step's products is
modelled as the exact sum rounded once toward zero (the tensor cores truncate), and the kernel's
float32 accumulator as float32 additions rounded to nearest.
"""

from __future__ import annotations

import numpy as np

_GUARD = np.uint32(0x7F7FF000)  # |x| at and above this would round up to infinity


def tf32_rna(x) -> np.ndarray:
    """float32 -> TF32 (as float32): round to nearest, ties away from zero, on the top 19 bits
    (cvt.rna.tf32.f32); magnitudes that would round up to infinity are truncated instead."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    mag = u & np.uint32(0x7FFFFFFF)
    finite_low = mag < _GUARD  # NaN and Inf compare above the guard as integers too
    r = np.where(finite_low, u + np.uint32(0x1000), u) & np.uint32(0xFFFFE000)
    return r.astype(np.uint32).view(np.float32)


def tf32_rne(x) -> np.ndarray:
    """float32 -> TF32 (as float32) as plain TF32 products round it (kernels/common.cuh
    tf32_rne, and the TMA unit reading a TFLOAT32 tensor map): to nearest, ties to even;
    magnitudes from 0x1.ffep127 up round to infinity; NaN stays NaN."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0xFFF + ((u >> 13) & 1)) & 0xFFFFE000).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, r)


SMALL_SCALE = 2.0**10  # kernels/common.cuh TF32_SMALL_SCALE


def tf32_split(x, scaled: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(big, small): big = tf32(x), small = tf32(2^10 (x - big)) (``scaled``; else tf32(x -
    big)), the 3xTF32 split of kernels/common.cuh (no overflow guard on small: x - big is far
    from overflow).  x = big + small / 2^10 to within 2^-23 |x|."""
    x = np.asarray(x, dtype=np.float32)
    big = tf32_rna(x)
    with np.errstate(invalid="ignore", over="ignore"):
        rest = ((x - big) * np.float32(SMALL_SCALE if scaled else 1.0)).astype(np.float32)
    small = ((rest.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
    return big, small


def _rz32(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounded toward zero."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = x.astype(np.float32)
        away = np.abs(f.astype(np.float64)) > np.abs(x)
    return np.where(away & np.isfinite(x), np.nextafter(f, np.float32(0)), f)


def emulate_gemm(a, b, passes: int = 3, kstep: int = 8, ktile: int = 1) -> np.ndarray:
    """A @ B as the TF32 kernels compute it (float32 in and out).  ``passes`` 3 (3xTF32,
    gemm_tf32.cu with TF32_ACC 1): per k-step of 8, big*big summed exactly and rounded toward
    zero (the mma onto zero), added to a float32 accumulator with round to nearest; the scaled
    corrections small*big + big*small accumulated in the tensor cores (each mma's sum rounded
    toward zero); result = acc + cor / 2^10 rounded once.  ``ktile`` > 1 (gemm_wgmma.cu with
    three register tiles: ktile = 4): big*big of ``ktile`` k-steps accumulates in the tensor cores
    (a fresh sum per k-tile, each step rounded toward zero) before its one rounded addition to
    acc; the k-tiles end at K (the first one is partial).  ``passes`` 1 (TF32): tf32(a) tf32(b)
    accumulated in the tensor cores."""
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    k = a.shape[1]
    ab, as_ = tf32_split(a)
    bb, bs = tf32_split(b)
    shape = (a.shape[0], b.shape[1])
    acc = np.zeros(shape, np.float32)
    cor = np.zeros(shape, np.float32)
    span = kstep * ktile
    first = k - (-(-k // span)) * span  # start of the first (partial) k-tile, <= 0
    part = np.zeros(shape, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for k0 in range(first if ktile > 1 else 0, k, kstep):
            s = slice(max(k0, 0), min(k, max(k0 + kstep, 0)))  # empty for k-steps before 0
            a_b, b_b = ab[:, s].astype(np.float64), bb[s].astype(np.float64)
            if passes == 3 and ktile > 1:
                step = (k0 - first) // kstep % ktile
                part = _rz32((part.astype(np.float64) if step else 0.0) + a_b @ b_b)
                if step == ktile - 1:
                    acc = (acc + part).astype(np.float32)
                cor = _rz32(cor.astype(np.float64) + as_[:, s].astype(np.float64) @ b_b)
                cor = _rz32(cor.astype(np.float64) + a_b @ bs[s].astype(np.float64))
            elif passes == 3:
                acc = (acc + _rz32(a_b @ b_b)).astype(np.float32)
                cor = _rz32(cor.astype(np.float64) + as_[:, s].astype(np.float64) @ b_b)
                cor = _rz32(cor.astype(np.float64) + a_b @ bs[s].astype(np.float64))
            else:
                acc = _rz32(acc.astype(np.float64) + a_b @ b_b)
        if passes == 3:
            acc = (acc.astype(np.float64) + cor.astype(np.float64) / SMALL_SCALE).astype(np.float32)
    return acc


def chain_sgemm(a, b) -> np.ndarray:
    """A float32 FMA chain over k in order (what cuBLAS SGEMM and the float32 kernel do per
    element): the float32 peer of the accuracy contract."""
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    acc = np.zeros((a.shape[0], b.shape[1]), np.float64)
    for kk in range(a.shape[1]):  # fma: exact product + accumulator, one rounding
        acc = (acc + np.outer(a[:, kk].astype(np.float64), b[kk].astype(np.float64))).astype(
            np.float32).astype(np.float64)
    return acc.astype(np.float32)


# (name, what): the operand distributions of the contract.
DISTRIBUTIONS = {
    "normal": "standard normal",
    "uniform": "uniform [0, 1): positive, no cancellation",
    "wide": "rows of A and columns of B scaled by 2^e, e uniform in -40..40",
    "wide_k": "columns of A and rows of B scaled by 2^e, e in -40..40 (range inside each sum)",
    "huge": "A near the largest float32 (up to 0x1.fffffep127, exact maxima included), B small",
    "tiny": "A near the smallest normal float32 (its small parts subnormal), B large",
}


def operands(dist: str, m: int, n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(A (m, k), B (k, n)) float32 drawn from DISTRIBUTIONS[dist]; products stay finite."""
    rng = np.random.default_rng(seed)
    if dist == "uniform":
        return (rng.random((m, k), dtype=np.float32), rng.random((k, n), dtype=np.float32))
    a = rng.standard_normal((m, k))
    b = rng.standard_normal((k, n))
    if dist == "wide":
        a *= np.exp2(rng.integers(-40, 41, (m, 1)))
        b *= np.exp2(rng.integers(-40, 41, (1, n)))
    elif dist == "wide_k":
        e = rng.integers(-40, 41, k)
        a *= np.exp2(e)[None, :]
        b *= np.exp2(-rng.integers(-40, 41, k))[:, None]
    elif dist == "huge":
        a = np.clip(a, -1.99, 1.99) * 2.0**127
        a.flat[:: max(1, a.size // 7)] = np.finfo(np.float32).max  # exact maxima
        b *= 2.0**-40 / np.sqrt(k)
    elif dist == "tiny":
        a *= 2.0**-122
        b *= 2.0**40
    elif dist != "normal":
        raise ValueError(f"Expected one of {sorted(DISTRIBUTIONS)}. Got {dist!r}.")
    return a.astype(np.float32), b.astype(np.float32)


def errors(out, ref, a, b) -> tuple[float, float]:
    """(relative Frobenius error, largest element error): ||out - ref||_F / ||ref||_F and
    max |out - ref| / (|A| |B|) elementwise (the scale of a dot product's rounding), against a
    float64 ``ref``; inf when out is not finite."""
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    if not np.isfinite(out).all():
        return float("inf"), float("inf")
    scale = np.abs(np.asarray(a, np.float64)) @ np.abs(np.asarray(b, np.float64))
    fro = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
    elem = float(np.max(np.abs(out - ref) / np.where(scale > 0, scale, 1.0)))
    return fro, elem
