"""Device arrays as the cupy backend sees them: bfloat16 held as uint16 bits, a host array's
byte extent and page-locking, row pitches and leading dimensions, and the checks of a gemm's
operands.

This module imports cupy at its top: only the cupy backend imports it.
"""

from __future__ import annotations

import cupy
import cupyx
import numpy as np

from ..errors import KernelError, ShapeError
from ..units import numpy_dtype
from .base import check_gemm_dtypes, gemm_shape

_MEMORY_TYPE_HOST = 1  # cudaMemoryTypeHost: page-locked host memory known to CUDA
_BF16 = numpy_dtype("bfloat16")


def device_dtype(dtype) -> np.dtype:
    """The dtype of device arrays holding elements of ``dtype``: uint16 for bfloat16 (its
    bits; cupy has no bfloat16), else ``dtype``."""
    dtype = np.dtype(dtype)
    return np.dtype(np.uint16) if dtype == _BF16 else dtype


def _logical(dtype) -> np.dtype:
    """The element dtype a device array of ``dtype`` holds: bfloat16 for uint16."""
    dtype = np.dtype(dtype)
    return _BF16 if dtype == np.uint16 else dtype


def _page_locked(ptr: int) -> bool:
    """Whether CUDA reports the host address ``ptr`` as page-locked (errors: not)."""
    try:
        attrs = cupy.cuda.runtime.pointerGetAttributes(ptr)
    except Exception:  # older CUDA: cudaErrorInvalidValue for pageable memory
        return False
    kind = getattr(attrs, "type", None)  # cupy names the field "type" (CUDA >= 10) ...
    if kind is None:
        kind = getattr(attrs, "memoryType", None)  # ... or "memoryType" (older cupy)
    return kind == _MEMORY_TYPE_HOST


def _extent(arr) -> tuple[int, int]:
    """[first byte, last byte + 1) of a 2-D (or flat) array with non-negative strides."""
    lo = arr.ctypes.data
    if arr.size == 0:
        return lo, lo
    return lo, lo + sum((n - 1) * st for n, st in zip(arr.shape, arr.strides)) + arr.itemsize


def _pitch(x) -> int:
    """Bytes between the starts of consecutive rows of a 2-D array with contiguous rows."""
    rows, cols = x.shape
    return x.strides[0] if rows > 1 else cols * x.itemsize


def _scalars_by_pointer(fn) -> bool:
    """Whether this cupy's cuBLAS wrapper takes alpha/beta as addresses (``size_t alpha`` in
    its signature, cupy >= 14) rather than as values."""
    doc = getattr(fn, "__doc__", None) or ""
    return "size_t alpha" in doc or "float alpha" not in doc and "double alpha" not in doc


def _ld(x) -> int:
    """Leading dimension (elements between rows) of a row-major 2-D device array."""
    rows, cols = x.shape
    return max(x.strides[0] // x.itemsize if rows > 1 else cols, cols, 1)


def _check_gemm(a, b, c, trans_a: bool, trans_b: bool) -> tuple[str, tuple[int, int, int]]:
    """(the operands' dtype name, (m, k, n)) after checking the operands are 2-D device arrays
    with contiguous rows and matching shapes, a and b of one dtype (uint16: bfloat16) and c in
    the dtype they accumulate in."""
    for name, x in (("a", a), ("b", b), ("c", c)):
        if not isinstance(x, cupy.ndarray):
            raise KernelError(f"Expected {name} to be a cupy.ndarray on the GPU. "
                              f"Got {type(x).__module__}.{type(x).__name__}.")
        if x.ndim != 2 or (x.shape[1] > 1 and x.strides[1] != x.itemsize):
            raise ShapeError(f"Expected {name} as a 2-D array with contiguous rows. "
                             f"Got shape {x.shape}, strides {x.strides}.")
    name = check_gemm_dtypes(_logical(a.dtype), _logical(b.dtype), c.dtype)
    return name, gemm_shape(a, b, c, trans_a, trans_b)


#: Sets its flag where an element of x is NaN or infinite (one pass, no temporaries: nothing
#: from cupy's memory pool; the flag is the caller's).
_NONFINITE = cupy.ElementwiseKernel("T x", "raw uint64 flag", "if (!isfinite(x)) flag[0] = 1;",
                                    "bigmm_nonfinite_flag")


class FiniteFlags:
    """Device flags for :meth:`CupyBackend.nonfinite`, one per call (never reused while the
    backend lives: a flag may wait long to be read, as resident-c's old C strips do), made
    ``BLOCK`` at a time by ``allocate`` (flat uint64 device arrays), each copied into
    page-locked host memory on its stream."""

    BLOCK = 4096

    def __init__(self, allocate):
        self.allocate, self.blocks, self.used = allocate, [], 0

    def flag(self, c: cupy.ndarray, stream):
        """Whether ``c`` holds a NaN or an infinity, found on ``stream``: the callable returned
        reads 1 or 0 once an event recorded on ``stream`` after this call has completed."""
        i = self.used % self.BLOCK
        if i == 0:
            self.blocks.append((self.allocate(self.BLOCK),
                                cupyx.empty_pinned((self.BLOCK,), np.uint64)))
        self.used += 1
        dev, host = self.blocks[-1]
        slot, out = dev[i:i + 1], host[i:i + 1]
        with stream:
            slot.fill(0)
            if c.size:
                _NONFINITE(c, slot)
            cupy.asnumpy(slot, stream=stream, out=out, blocking=False)
        return lambda: int(out[0])


def scale(c: cupy.ndarray, beta: float) -> None:
    """c = beta * c on the current stream; beta == 0: zeros, c not read."""
    if beta == 0:
        c.fill(0)
    elif beta != 1:
        cupy.multiply(c, c.dtype.type(beta), out=c)
