"""cuBLAS handles kept between the cupy backends of a process, and the cuBLAS calls the cupy
backend makes with them (row-major products as column-major ones). Imported by :mod:`.cupy`
only (it imports cupy).

A backend takes a handle when it first calls cuBLAS and gives it back when it closes, so that
the next backend on the same device takes it instead of creating one, and no run ends
destroying one (which waits for the device and frees the handle's workspace). A handle is
used by one backend at a time; its math mode is set whenever it is taken, and every call
sets its stream first.
"""

from __future__ import annotations

import threading

import numpy as np

from .cupy_arrays import _ld, _scalars_by_pointer

#: Handles kept per device, at most (more backends closing at once destroy theirs).
KEEP_PER_DEVICE = 8
_OP_N, _OP_T = 0, 1  # cublasOperation_t
#: cudaDataType_t of GemmEx's operands, CUBLAS_COMPUTE_32F and CUBLAS_GEMM_DEFAULT.
_CUDA_TYPES = {"float16": 2, "bfloat16": 14, "float32": 0}
_COMPUTE_32F, _GEMM_DEFAULT = 68, -1


class HandlePool:
    """Free cuBLAS handles per device id (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._free: dict[int, list[int]] = {}

    def take(self, device_id: int, math_mode: int) -> int:
        """A handle for the current device ``device_id`` (kept, else new) in ``math_mode``."""
        from cupy_backends.cuda.libs import cublas

        with self._lock:
            free = self._free.get(device_id)
            handle = free.pop() if free else None
        if handle is None:
            handle = cublas.create()
        cublas.setMathMode(handle, math_mode)
        return handle

    def give(self, device_id: int, handle: int) -> None:
        """Keep ``handle`` (its work done) for the next backend on ``device_id``; destroy it
        where KEEP_PER_DEVICE are kept already (the device current)."""
        with self._lock:
            free = self._free.setdefault(device_id, [])
            if len(free) < KEEP_PER_DEVICE:
                free.append(handle)
                return
        from cupy_backends.cuda.libs import cublas

        cublas.destroy(handle)

    def kept(self, device_id: int) -> list[int]:
        """The handles kept for ``device_id`` now."""
        with self._lock:
            return list(self._free.get(device_id, ()))


def cublas_gemm(h: int, a, b, c, m, n, k, alpha, beta, trans_a, trans_b, stream) -> None:
    """Row-major C = alpha op(A) op(B) + beta C (float32 or float64) on handle ``h`` as
    column-major C^T = op(B)^T op(A)^T."""
    from cupy_backends.cuda.libs import cublas

    if m == 0 or n == 0:
        return
    fn = cublas.sgemm if c.dtype == np.float32 else cublas.dgemm
    # cupy 14 takes alpha and beta by address (host pointer mode: read during the call)
    scalars = np.array([alpha, beta], dtype=c.dtype)
    if _scalars_by_pointer(fn):
        al, be = scalars.ctypes.data, scalars.ctypes.data + scalars.itemsize
    else:
        al, be = alpha, beta
    cublas.setStream(h, stream.ptr)
    with stream:  # cupy's wrappers re-set the handle's stream to the current one
        fn(h, _OP_T if trans_b else _OP_N, _OP_T if trans_a else _OP_N, n, m, k, al,
           b.data.ptr, _ld(b), a.data.ptr, _ld(a), be, c.data.ptr, _ld(c))


def cublas_gemm_ex(h: int, name: str, a, b, c, m, n, k, alpha, beta, trans_a, trans_b,
                   stream) -> None:
    """``cublasGemmEx`` on handle ``h``: row-major C (float32) = op(A) op(B) of half-precision
    A and B (``name``) on tensor cores, accumulated in float32, as column-major C^T = op(B)^T
    op(A)^T."""
    from cupy_backends.cuda.libs import cublas

    if m == 0 or n == 0:
        return
    scalars = np.array([alpha, beta], dtype=np.float32)  # read during the call (host mode)
    ab, c32 = _CUDA_TYPES[name], _CUDA_TYPES["float32"]
    cublas.setStream(h, stream.ptr)
    with stream:  # cupy's wrappers re-set the handle's stream to the current one
        cublas.gemmEx(h, _OP_T if trans_b else _OP_N, _OP_T if trans_a else _OP_N, n, m, k,
                      scalars.ctypes.data, b.data.ptr, ab, _ld(b), a.data.ptr, ab, _ld(a),
                      scalars.ctypes.data + scalars.itemsize, c.data.ptr, c32, _ld(c),
                      _COMPUTE_32F, _GEMM_DEFAULT)
