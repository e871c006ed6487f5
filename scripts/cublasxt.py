"""cuBLASXt SGEMM/DGEMM through ctypes, for the end-to-end comparison (not library code).

cuBLASXt multiplies matrices that live in host memory: it tiles them (``block_dim``), streams
the tiles through the GPU and writes C back, all inside one blocking call. Its API is
column-major; a row-major C = A @ B is computed as the column-major C^T = B^T @ A^T, so no data
is transposed. The library is the ``libcublas`` that cupy loaded (cuBLASXt is part of it).

    xt = CublasXt(block_dim=8192)
    xt.gemm(a, b, c)          # C-contiguous float32/float64 NumPy arrays (pageable or pinned)
    xt.close()

``pinned_empty`` gives NumPy arrays in page-locked memory, for the "pre-pinned" measurement.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

_OP_N = 0
_PINNING = {"off": 0, "on": 1}  # cublasXtPinnedMemMode_t


def _libcublas() -> ctypes.CDLL:
    """The libcublas this process has loaded through cupy (loading it first if needed)."""
    import cupy

    cupy.cuda.device.get_cublas_handle()  # makes cupy load libcublas
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if os.path.basename(path).startswith("libcublas.so"):
                return ctypes.CDLL(path)
    return ctypes.CDLL("libcublas.so")


class CublasXt:
    """One cuBLASXt handle on ``devices`` with a fixed block dimension."""

    def __init__(self, block_dim: int = 4096, devices: tuple[int, ...] = (0,),
                 pinning: str = "off"):
        self.lib = lib = _libcublas()
        self.handle = ctypes.c_void_p()
        self._check(lib.cublasXtCreate(ctypes.byref(self.handle)), "cublasXtCreate")
        ids = (ctypes.c_int * len(devices))(*devices)
        self._check(lib.cublasXtDeviceSelect(self.handle, len(devices), ids),
                    "cublasXtDeviceSelect")
        self._check(lib.cublasXtSetBlockDim(self.handle, int(block_dim)), "cublasXtSetBlockDim")
        self._check(lib.cublasXtSetPinningMemMode(self.handle, _PINNING[pinning]),
                    "cublasXtSetPinningMemMode")
        self.block_dim = int(block_dim)
        sz = ctypes.c_size_t
        for name, real in (("cublasXtSgemm", ctypes.c_float), ("cublasXtDgemm", ctypes.c_double)):
            fn = getattr(lib, name)
            fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, sz, sz, sz,
                           ctypes.POINTER(real), ctypes.c_void_p, sz, ctypes.c_void_p, sz,
                           ctypes.POINTER(real), ctypes.c_void_p, sz]
            fn.restype = ctypes.c_int

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed with cuBLAS status {status}")

    def gemm(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, alpha: float = 1.0,
             beta: float = 0.0) -> np.ndarray:
        """c = alpha * a @ b + beta * c for C-contiguous host arrays; blocks until done."""
        for x in (a, b, c):
            if not x.flags.c_contiguous or x.dtype != c.dtype:
                raise ValueError("expected C-contiguous arrays of one dtype")
        m, k = a.shape
        k2, n = b.shape
        if k != k2 or c.shape != (m, n):
            raise ValueError(f"shapes {a.shape} @ {b.shape} -> {c.shape} do not match")
        if c.dtype == np.float32:
            fn, real = self.lib.cublasXtSgemm, ctypes.c_float
        elif c.dtype == np.float64:
            fn, real = self.lib.cublasXtDgemm, ctypes.c_double
        else:
            raise ValueError(f"expected float32 or float64, got {c.dtype}")
        al, be = real(alpha), real(beta)
        self._check(fn(self.handle, _OP_N, _OP_N, n, m, k, ctypes.byref(al), b.ctypes.data, n,
                       a.ctypes.data, k, ctypes.byref(be), c.ctypes.data, n), "cublasXtSgemm")
        return c

    def syrk(self, a: np.ndarray, c: np.ndarray, alpha: float = 1.0, beta: float = 0.0,
             trans: bool = True) -> np.ndarray:
        """The upper triangle (row-major) of c = alpha * a^T a + beta * c (``trans``, c n x n
        for a m x n) or alpha * a a^T + beta * c, for C-contiguous host arrays
        (``cublasXtSsyrk``/``Dsyrk``: the column-major lower triangle); blocks until done."""
        for x in (a, c):
            if not x.flags.c_contiguous or x.dtype != c.dtype:
                raise ValueError("expected C-contiguous arrays of one dtype")
        rows, cols = a.shape
        n, k = (cols, rows) if trans else (rows, cols)
        if c.shape != (n, n):
            raise ValueError(f"shapes {a.shape} -> {c.shape} do not match")
        name = {np.dtype(np.float32): "cublasXtSsyrk", np.dtype(np.float64): "cublasXtDsyrk"}
        real = ctypes.c_float if c.dtype == np.float32 else ctypes.c_double
        fn = getattr(self.lib, name[c.dtype])
        sz = ctypes.c_size_t
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, sz, sz,
                       ctypes.POINTER(real), ctypes.c_void_p, sz, ctypes.POINTER(real),
                       ctypes.c_void_p, sz]
        fn.restype = ctypes.c_int
        al, be = real(alpha), real(beta)
        # row-major a (rows x cols) is the column-major cols x rows a^T, ld cols
        self._check(fn(self.handle, 0, _OP_N if trans else 1, n, k, ctypes.byref(al),
                       a.ctypes.data, cols, ctypes.byref(be), c.ctypes.data, n), name[c.dtype])
        return c

    def close(self) -> None:
        if self.handle:
            self.lib.cublasXtDestroy(self.handle)
            self.handle = ctypes.c_void_p()


def pinned_empty(shape, dtype=np.float32):
    """A NumPy array in page-locked host memory (cudaHostAlloc); freed with the array."""
    import cupy

    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    mem = cupy.cuda.PinnedMemory(nbytes)
    return np.ndarray(shape, dtype, buffer=cupy.cuda.PinnedMemoryPointer(mem, 0))
