"""The cupy backend's rank-k update of a tile's upper triangle (:class:`.base.Syrk`):
``cublasSsyrk``/``cublasDsyrk`` on the backend's cuBLAS handle, or the upper sub-blocks by its
gemm (:mod:`.syrk_blocks`; half-precision panels always, as cuBLAS has no syrk for them).

Row-major to cuBLAS's column-major: a row-major n x n C is the same symmetric matrix read
column-major, with its upper triangle in cuBLAS's lower (``CUBLAS_FILL_MODE_LOWER``). For C =
a^T a (a row-major k x n, read column-major as the n x k a^T with ld n) cuBLAS computes
a^T (a^T)^T with ``CUBLAS_OP_N``; for C = a a^T (a row-major n x k, read as the k x n a^T)
it computes (a^T)^T a^T with ``CUBLAS_OP_T``.
"""

from __future__ import annotations

import numpy as np

from ..errors import OptionError, ShapeError
from .cupy_arrays import _ld
from .syrk_blocks import syrk_by_blocks

#: How diagonal tiles are updated: "cublas" (cublasSsyrk/Dsyrk), "blocks" (the upper
#: sub-blocks by the backend's own gemm kernel), "split" (2 x 2 blocks: the diagonal ones
#: by cuBLAS syrk, the one above by the backend's gemm) or "triangle" (one launch of bigmm's
#: kernel that computes only its tiles on or above the diagonal: ``be.upper_gemm``).
MODES = ("cublas", "blocks", "split", "triangle")
_FILL_LOWER = 0  # cublasFillMode_t
_OP_N, _OP_T = 0, 1


def syrk(be, handle, a, c, alpha: float, beta: float, trans: bool, stream, mode: str) -> None:
    """The upper triangle of c = alpha * op(a) op(a)^T + beta * c on ``stream`` (see
    :meth:`.base.Syrk.syrk`), by ``mode``; ``handle``: a callable giving the cuBLAS handle."""
    n, k = _check(a, c, trans)
    if n == 0:
        return
    if mode not in MODES:
        raise OptionError(f"Expected a syrk mode in {MODES}. Got {mode!r}.")
    if mode == "blocks" or c.dtype not in (np.float32, np.float64) or a.dtype != c.dtype:
        syrk_by_blocks(be.gemm, a, c, alpha, beta, trans, stream)
        return
    if mode == "triangle":
        be.upper_gemm(a, a, c, alpha, beta, trans, not trans, stream)
        return
    if mode == "split" and n >= 512:
        def diagonal(a, c, alpha, beta, trans, stream):
            _cublas_syrk(handle, a, c, alpha, beta, trans, stream)

        syrk_by_blocks(be.gemm, a, c, alpha, beta, trans, stream, parts=2, diagonal=diagonal)
        return
    _cublas_syrk(handle, a, c, alpha, beta, trans, stream)


def _cublas_syrk(handle, a, c, alpha: float, beta: float, trans: bool, stream) -> None:
    """cublasSsyrk/Dsyrk of the upper triangle (row-major) of c."""
    from cupy_backends.cuda.libs import cublas

    n, k = _check(a, c, trans)
    fn = cublas.ssyrk if c.dtype == np.float32 else cublas.dsyrk
    scalars = np.array([alpha, beta], dtype=c.dtype)  # host pointer mode: read during the call
    h = handle()
    cublas.setStream(h, stream.ptr)
    with stream:  # cupy's wrappers re-set the handle's stream to the current one
        fn(h, _FILL_LOWER, _OP_N if trans else _OP_T, n, k, scalars.ctypes.data,
           a.data.ptr, _ld(a), scalars.ctypes.data + scalars.itemsize, c.data.ptr, _ld(c))


def _check(a, c, trans: bool) -> tuple[int, int]:
    """(n, k) of op(a) (n x k) and the square c, with contiguous rows; ShapeError otherwise."""
    n, k = a.shape[::-1] if trans else a.shape
    if c.shape != (n, n):
        raise ShapeError(f"Expected c of shape {(n, n)} for op(a) of shape {(n, k)}. "
                         f"Got {c.shape}.")
    for name, x in (("a", a), ("c", c)):
        if x.ndim != 2 or (x.shape[1] > 1 and x.strides[1] != x.itemsize):
            raise ShapeError(f"Expected {name} with contiguous rows. Got strides {x.strides}.")
    return n, k
