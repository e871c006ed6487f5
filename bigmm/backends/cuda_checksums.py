"""Launchers of the checksum kernels of ``verify="checksum"`` (``kernels/abft_checksum.cu``):
weighted column sums of a strided view in float64, and the comparison of expected and actual
sums under a rounding bound. cupy is imported inside functions only."""

from __future__ import annotations

from ..errors import KernelError, ShapeError
from .cuda_build import raw_kernel, sm_count
from .cuda_kernels import _vector
from .kernel_configs import _DTYPES

_CHECKSUM_SOURCE = "abft_checksum.cu"
_SUMS_TILE = 32  # columns per block and rows per shared-memory tile (kernels/abft_checksum.cu)
_SUMS_ROWS = 8  # thread rows per block (generic, strided), warps per block (contig)
_SUMS_OUTS = 4  # columns per warp (contig)
_SUMS_UNROLL = 4  # row loads in flight per thread (strided)
_SUMS_BLOCKS_PER_SM = 4  # the fast kernels' __launch_bounds__ minimum
#: Kernels of weighted_sums: "contig" (summed axis contiguous, 16-byte vectors along it),
#: "strided" (columns contiguous, 16-byte vectors across them), "generic" (any strides).
SUMS_PATHS = ("contig", "strided", "generic")


def sums_path(rows: int, cols: int, sr: int, sc: int, itemsize: int, ptr: int) -> str:
    """The kernel weighted_sums uses for a rows x cols view with element strides (sr, sc) at
    address ``ptr``: a fast path when the 16-byte vectors it reads are aligned, else
    "generic"."""
    def aligned(stride: int, count: int) -> bool:  # every line of the view starts aligned
        return count <= 1 or (stride * itemsize) % 16 == 0

    if ptr % 16:
        return "generic"
    if sr == 1 and (sc != 1 or cols == 1) and aligned(sc, cols):
        return "contig"
    if sc == 1 and aligned(sr, rows):
        return "strided"
    return "generic"


def _sums_launch(path: str, rows: int, cols: int, itemsize: int) -> tuple[tuple, tuple, int]:
    """(grid, block, rows_per_block) of one weighted_sums kernel. The fast paths fill the
    GPU in one wave (their __launch_bounds__ blocks per SM): blocks over the columns first,
    then over the rows while there are SMs left."""
    target = _SUMS_BLOCKS_PER_SM * sm_count()
    vec = 16 // itemsize
    if path == "contig":  # rows_per_block a multiple of the vector: every chunk aligned
        gx = min(-(-cols // (_SUMS_ROWS * _SUMS_OUTS)), target)  # warps stride over columns
        line = 32 * vec  # one vector per lane
        gy = max(1, min(target // gx, -(-rows // line)))
        per_block = -(-rows // (gy * line)) * line
        return (gx, -(-rows // per_block), 1), (32 * _SUMS_ROWS, 1, 1), per_block
    if path == "strided":
        gx = -(-cols // (_SUMS_TILE * vec))
        gy = max(1, min(target // gx, -(-rows // (_SUMS_ROWS * _SUMS_UNROLL))))
        per_block = -(-rows // gy)
        return (gx, -(-rows // per_block), 1), (_SUMS_TILE, _SUMS_ROWS, 1), per_block
    gx = -(-cols // _SUMS_TILE)
    tiles_i = -(-rows // _SUMS_TILE)
    gy = max(1, min(tiles_i, (8 * sm_count()) // gx))  # about 8 blocks per SM in all
    per_block = -(-tiles_i // gy) * _SUMS_TILE
    return (gx, -(-rows // per_block), 1), (_SUMS_TILE, _SUMS_ROWS, 1), per_block


def weighted_sums(x, out, out_abs=None, *, weights=None, abs_weights=None, scale=1.0,
                  accumulate=False, stream=None, path: str | None = None) -> str:
    """Sums along axis 0 of the 2-D cupy view ``x`` (float32 or float64, any strides: pass
    ``x.T`` for row sums), accumulated in float64 on ``stream``:
    ``out[j] (+)= scale * sum_i w[i] x[i, j]`` and ``out_abs[j] (+)= |scale| * sum_i wa[i]
    |x[i, j]|``. ``weights`` (w) default to ones, ``abs_weights`` (wa) to ``|w|``; without
    ``accumulate`` the outputs are overwritten. Not synchronised. ``path`` forces a kernel
    (:data:`SUMS_PATHS`; a fast one only where :func:`sums_path` allows it, "generic"
    always); returns the one used."""
    import cupy

    launch, chosen = prepare_sums(x, out, out_abs, weights=weights, abs_weights=abs_weights,
                                  scale=scale, accumulate=accumulate, path=path)
    launch(stream if stream is not None else cupy.cuda.get_current_stream())
    return chosen


def prepare_sums(x, out, out_abs=None, *, weights=None, abs_weights=None, scale=1.0,
                 accumulate=False, path: str | None = None):
    """(launch, path): :func:`weighted_sums` checked and set up once, ``launch(stream)``
    issuing it. The launch holds the views, so a caller issuing the same sums over the same
    buffers again and again (the checks of every step of a run) pays the checks and the
    kernel choice once."""
    import cupy
    import numpy as np

    if not isinstance(x, cupy.ndarray) or x.ndim != 2 or str(x.dtype) not in _DTYPES:
        raise KernelError(f"Expected x as a 2-D float32 or float64 cupy array. Got "
                          f"{type(x).__name__} {getattr(x, 'dtype', '')} {getattr(x, 'shape', '')}.")
    rows, cols = x.shape
    if any(s % x.itemsize for s in x.strides):
        raise ShapeError(f"Expected x's strides in whole elements. Got {x.strides}.")
    sr, sc = (s // x.itemsize for s in x.strides)
    chosen = sums_path(rows, cols, sr, sc, x.itemsize, x.data.ptr)
    if path is not None:
        if path not in SUMS_PATHS or path not in (chosen, "generic"):
            raise KernelError(f"Expected path to be None, 'generic' or {chosen!r} for this view "
                              f"(strides {x.strides}). Got {path!r}.")
        chosen = path
    args = [_vector(out, cols, "out"), _vector(out_abs, cols, "out_abs"),
            _vector(weights, rows, "weights"), _vector(abs_weights, rows, "abs_weights")]
    zero = [(v.data.ptr, v.nbytes) for v in (out, out_abs)
            if not accumulate and v is not None and v.size]
    memset = cupy.cuda.runtime.memsetAsync
    kern = None
    if rows and cols:
        suffix = "f32" if x.itemsize == 4 else "f64"
        name = "abft_sums_" + (suffix if chosen == "generic" else f"{chosen}_{suffix}")
        grid, block, per_block = _sums_launch(chosen, rows, cols, x.itemsize)
        kern = raw_kernel(_CHECKSUM_SOURCE, name)
        kargs = (np.int32(rows), np.int32(cols), x, np.int64(sr), np.int64(sc), args[2],
                 args[3], np.float64(scale), np.int32(per_block), args[0], args[1])

    def launch(stream) -> None:
        with stream:
            for ptr, nbytes in zero:
                memset(ptr, 0, nbytes, stream.ptr)
            if kern is not None:
                kern(grid, block, kargs)

    return launch, chosen


def compare_sums(expected, magnitude, actual, rel_tol: float, floor: float, result,
                 stream=None) -> None:
    """``result[0] = max_j |expected_j - actual_j| / (rel_tol * magnitude_j + floor)`` and
    ``result[1]`` = that j, on ``stream`` (float64 cupy vectors; ``result`` holds 2)."""
    import cupy

    prepare_compare(expected, magnitude, actual, rel_tol, floor, result)(
        stream if stream is not None else cupy.cuda.get_current_stream())


def prepare_compare(expected, magnitude, actual, rel_tol: float, floor: float, result,
                    limit: float = float("inf")):
    """:func:`compare_sums` checked and set up once: ``launch(stream)`` issues it."""
    import numpy as np

    n = expected.size
    args = [_vector(v, n, what) for v, what in ((expected, "expected"), (magnitude, "magnitude"),
                                                (actual, "actual"))]
    res = _vector(result, 2, "result")
    kern = raw_kernel(_CHECKSUM_SOURCE, "abft_compare")
    kargs = (np.int32(n), *args, np.float64(rel_tol), np.float64(floor), np.float64(limit),
             res)

    def launch(stream) -> None:
        with stream:
            kern((1,), (256,), kargs)

    return launch
