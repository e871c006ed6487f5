"""TMA tensor maps for the sm_90a kernels: the map of a 2-D float32 device array (a view of any
leading dimension) with the TFLOAT32 data type, whose copies round float32 to TF32 (to nearest,
ties to even) on the way into shared memory and fill zeros past the array's edges. Encoded by
the CUDA driver (``cuTensorMapEncodeTiled``, through ctypes: cupy does not wrap it) into the
128 bytes a kernel takes by value (``const __grid_constant__``).

cupy is imported inside functions only: importing this module needs no GPU.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from ..errors import KernelError

_TFLOAT32 = 11  # CU_TENSOR_MAP_DATA_TYPE_TFLOAT32
#: CU_TENSOR_MAP_SWIZZLE_128B: a box's 16-byte chunks XORed by its row (mod 8), as wgmma's
#: 128-byte swizzle descriptors read them.
SWIZZLE_128B = 3
_L2_PROMOTION_256B = 3
_MAP = np.dtype((np.void, 128))


def tma_aligned(ptr: int, ld: int) -> bool:
    """Whether a float32 array at device address ``ptr`` with rows ``ld`` elements apart can be
    read through a tensor map (16-byte aligned start and rows)."""
    return ptr % 16 == 0 and ld % 4 == 0


@functools.lru_cache(maxsize=1)
def _encoder():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise KernelError(f"Expected the CUDA driver library libcuda.so.1. Got {exc}.") from exc
    fn = lib.cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    return fn


def tensor_map(x, rows: int, cols: int, ld: int, box_cols: int, box_rows: int,
               swizzle: int) -> np.ndarray:
    """The TFLOAT32 tensor map of the ``rows`` x ``cols`` float32 array at ``x`` (a cupy array or
    view whose rows are ``ld`` elements apart), copied in boxes of ``box_rows`` x ``box_cols``;
    a one-element array that a cupy kernel call passes by value (not to be written)."""
    if not tma_aligned(x.data.ptr, ld):
        raise KernelError(f"Expected a 16-byte aligned float32 array for a tensor map. Got "
                          f"address {x.data.ptr:#x} with rows {ld} elements apart.")
    return _encoded(x.data.ptr, rows, cols, ld, box_cols, box_rows, swizzle)


@functools.lru_cache(maxsize=256)
def _encoded(ptr: int, rows: int, cols: int, ld: int, box_cols: int, box_rows: int,
             swizzle: int) -> np.ndarray:
    """The map, a function of these numbers alone: encoded once for each (the out-of-core
    run's slots give the same ones step after step)."""
    out = np.zeros(1, dtype=_MAP)
    dims = (ctypes.c_uint64 * 2)(max(cols, 1), max(rows, 1))
    strides = (ctypes.c_uint64 * 1)(4 * ld)
    box = (ctypes.c_uint32 * 2)(box_cols, box_rows)
    ones = (ctypes.c_uint32 * 2)(1, 1)
    code = _encoder()(ctypes.c_void_p(out.ctypes.data), _TFLOAT32, 2, ctypes.c_void_p(ptr),
                      dims, strides, box, ones, 0, swizzle, _L2_PROMOTION_256B, 0)
    if code != 0:
        raise KernelError(f"Expected the driver to encode a tensor map of {rows} x {cols} float32 "
                          f"(rows {ld} apart, boxes {box_rows} x {box_cols}). Got CUresult {code}.")
    out.flags.writeable = False
    return out
