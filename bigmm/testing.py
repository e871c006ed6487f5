"""Helpers shared by the tests and the scripts: GPU detection, operands, float64 references."""

from __future__ import annotations

import functools
import glob
import importlib.util
import os
import time

import numpy as np


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    """True when cupy imports and sees at least one CUDA device."""
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        from .backends import probe_cuda

        return probe_cuda()
    except Exception:
        return False


def random_matrix(shape, dtype=np.float32, seed=0) -> np.ndarray:
    """Fresh standard-normal data (never zeros) in the given dtype."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape, dtype=np.float64).astype(dtype)


def reference_gemm(a, b, *, alpha=1.0, beta=0.0, c=None, trans_a=False, trans_b=False) -> np.ndarray:
    """alpha * op(A) @ op(B) + beta * C in float64."""
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b, dtype=np.float64)
    if trans_a:
        a64 = a64.T
    if trans_b:
        b64 = b64.T
    out = alpha * (a64 @ b64)
    if beta != 0:
        out += beta * np.asarray(c, dtype=np.float64)
    return out


def relative_error(out, ref) -> float:
    """||out - ref||_F / ||ref||_F in float64 (inf if out has NaN)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    denom = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (denom if denom else 1.0))


def tolerance(dtype, k: int) -> float:
    """Relative-error bound for a float product of depth k."""
    eps = np.finfo(dtype).eps
    return float(eps * 8 * max(1.0, np.sqrt(k)))


def wait_for_journaled_tiles(folder, proc, timeout: float, output: str = "c.h5") -> str:
    """The journal path of ``output`` in ``folder`` once it records finished tiles, while the
    run in subprocess ``proc`` goes on; AssertionError if ``proc`` ends first or ``timeout``
    seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for j in glob.glob(os.path.join(os.fspath(folder), output + ".*journal")):
            if '"tiles"' in open(j).read():
                return j
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("no tile was journaled in time")
