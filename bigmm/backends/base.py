"""The Backend protocols: what the executor needs from a compute device, and what some
devices can do besides.

:class:`Backend` is the core every backend implements: buffers, copies on streams, gemm,
events. Optional abilities are protocols of their own, which code tests for explicitly with
``isinstance`` (they are ``runtime_checkable``) before it uses them:

* :class:`Checksums`: the reductions behind ``verify="checksum"``, and their costs;
* :class:`Calibrates`: the rates the planner predicts a plan's time with;
* :class:`TimesShapes`: its gemm timed at a plan's step shape;
* :class:`Profiles`: timing its own copies and kernels into a :class:`bigmm.profile.Profile`;
* :class:`HostHints`: how the host work around it is best sized (reader threads, map blocks,
  the threads its gemm computes with);
* :class:`Registers`: page-locking a user's host memory in place for a run, so that copies
  use the user's arrays without staging;
* :class:`Syrk`: a rank-k update of a square tile's upper triangle (BLAS syrk), the diagonal
  tiles of Gram plans at half a gemm's flops;
* :class:`DeviceBlocks`: a run's equal buffers from one allocation (one call to allocate and
  one to free them, where a device's allocator costs a fraction of a millisecond a call).

Buffers are allocated once per run as flat 1-D arrays; a panel or tile is a contiguous view of
a buffer's first rows*cols elements (``view``), so edge tiles need no strided kernels or copies.

Ordering is expressed with streams and events. A backend whose compute memory is host memory
(``staging = False``, NumPy) has trivial streams and events: every call completes before it
returns. A GPU backend (``staging = True``) issues copies and kernels asynchronously; the
executor orders them with ``record``/``wait`` and blocks the host only through ``synchronize``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from ..errors import DtypeError, ShapeError
from ..planner.model import Rates
from ..precision import Rounding
from ..units import DTYPES, accumulate_dtype, dtype_name, numpy_dtype

#: The operand dtypes every backend's gemm takes (a and b of one of them); c is in the dtype
#: they accumulate in (:func:`bigmm.units.accumulate_dtype`: float32 for float16 and bfloat16).
GEMM_DTYPES = tuple(numpy_dtype(name) for name in DTYPES)


@dataclass(frozen=True)
class GemmChecks:
    """Checksum updates a gemm does as it multiplies (``gemm(..., checks=)`` on a backend whose
    ``fuses_checks`` is true): with X = op(b) for the columns and X = op(a)^T for the rows,
    ``col[j] (+)= scale * sum_k col_w[k] X[k, j]`` and ``col_abs[j] (+)= |scale| * sum_k
    col_wa[k] |X[k, j]|``, and the same for ``row`` from ``row_w`` and ``row_wa``: what
    ``weighted_sums`` gives over the panels, without reading them again. Flat float64 device
    vectors: weights of length k, ``col`` of n and ``row`` of m; without ``accumulate`` the
    outputs are overwritten. A k-tile's terms may be summed in the operands' dtype first
    (at most 32 roundings of its epsilon, which the checks' bounds allow for)."""

    col_w: Any
    col_wa: Any
    col: Any
    col_abs: Any
    row_w: Any
    row_wa: Any
    row: Any
    row_abs: Any
    scale: float = 1.0
    accumulate: bool = False


@runtime_checkable
class Backend(Protocol):
    """The core every backend implements."""

    #: Registry name ("numpy", "cupy").
    name: str
    #: True when device buffers are separate from host buffers (copies in and out are needed).
    staging: bool

    def host_buffer(self, size: int, dtype: np.dtype) -> np.ndarray:
        """A flat host array of ``size`` elements (pinned where the backend copies)."""

    def device_buffer(self, size: int, dtype: np.dtype) -> Any:
        """A flat device array of ``size`` elements. Without staging: a host array."""

    def view(self, buf: Any, shape: tuple[int, int]) -> Any:
        """A C-contiguous 2-D view of the first rows*cols elements of ``buf``."""

    def stream(self) -> Any:
        """A new (non-blocking) stream."""

    def host_pinned(self, arr: np.ndarray) -> bool:
        """True when the whole host array ``arr`` lies in page-locked memory the device can
        copy from and to asynchronously (always False without staging)."""

    def copy_in(self, host: np.ndarray, dev: Any, stream: Any) -> None:
        """Asynchronous host -> device copy of equal-shaped 2-D arrays on ``stream``. Rows are
        contiguous, the row pitch any (``host`` may be a region of a larger array); a contiguous
        array is the case pitch == width."""

    def copy_out(self, dev: Any, host: np.ndarray, stream: Any) -> None:
        """Asynchronous device -> host copy on ``stream`` (``host`` as for copy_in)."""

    def gemm(self, a: Any, b: Any, c: Any, alpha: float, beta: float,
             trans_a: bool, trans_b: bool, stream: Any, checks: GemmChecks | None = None) -> None:
        """c = alpha * op(a) @ op(b) + beta * c on ``stream``; beta == 0 never reads c. With
        ``checks`` (only on a :class:`Checksums` backend whose ``fuses_checks`` is true) the
        gemm also does those checksum updates."""

    def gemm_launcher(self, a: Any, b: Any, c: Any, alpha: float, beta: float, trans_a: bool,
                      trans_b: bool, checks: GemmChecks | None = None) -> Callable[[Any], None]:
        """``gemm`` with these arguments checked and set up once: calling the result with a
        stream issues it (again and again, on the same views, as the steps of a run that
        reuse their slots do)."""

    def scale(self, c: Any, beta: float, stream: Any) -> None:
        """c = beta * c on ``stream``; beta == 0 never reads c (zeros). What a gemm with
        alpha == 0 is (BLAS's convention: A and B are not read)."""

    def nonfinite(self, c: Any, stream: Any) -> Callable[[], int]:
        """Look for NaN and infinities in c after the work issued so far on ``stream``: the
        callable returned gives, once an event recorded on ``stream`` after this call has
        completed, their count, or 1 where the backend only flags them (0: none)."""

    def record(self, stream: Any) -> Any:
        """An event that completes when the work issued so far on ``stream`` is done."""

    def wait(self, stream: Any, event: Any) -> None:
        """Make later work on ``stream`` wait for ``event`` (does not block the host)."""

    def synchronize(self, event: Any) -> None:
        """Block the host until ``event`` has completed."""

    def memory_available(self) -> int:
        """Bytes the backend could allocate now (free device memory, or available RAM)."""

    def close(self) -> None:
        """Release buffers, streams and handles."""


@runtime_checkable
class Checksums(Protocol):
    """Checksum reductions for ``verify="checksum"`` (see :mod:`bigmm.checksum`)."""

    #: Whether ``gemm`` takes ``checks=`` and does a step's checksum updates itself.
    fuses_checks: bool
    #: For the planner's time model: bytes per second the reductions read (None: not
    #: counted) and the seconds their launches add to each step.
    checksum_rate: float | None
    checksum_step: float

    def weighted_sums(self, x: Any, out: Any, out_abs: Any = None, *, weights: Any = None,
                      abs_weights: Any = None, scale: float = 1.0, accumulate: bool = False,
                      stream: Any = None) -> None:
        """Checksums: sums along axis 0 of the 2-D view ``x`` (any strides; ``x.T`` gives row
        sums), in float64 on ``stream``: ``out[j] (+)= scale * sum_i w[i] x[i, j]`` and
        ``out_abs[j] (+)= |scale| * sum_i wa[i] |x[i, j]|`` (w: ``weights`` or ones; wa:
        ``abs_weights`` or |w|; ``out_abs`` optional). Vectors are flat float64 device arrays;
        without ``accumulate`` the outputs are overwritten."""

    def sums_launcher(self, x: Any, out: Any, out_abs: Any = None, *, weights: Any = None,
                      abs_weights: Any = None, scale: float = 1.0,
                      accumulate: bool = False) -> Callable[[Any], None]:
        """``weighted_sums`` with these arguments checked and set up once: calling the result
        with a stream issues it (again and again, on the same views, as the checks of every
        step do)."""

    def compare_launcher(self, expected: Any, magnitude: Any, actual: Any, rel_tol: float,
                         floor: float, result: Any,
                         limit: float = float("inf")) -> Callable[[Any], None]:
        """``compare_sums`` set up once, like :meth:`sums_launcher`."""

    def compare_sums(self, expected: Any, magnitude: Any, actual: Any, rel_tol: float,
                     floor: float, result: Any, stream: Any,
                     limit: float = float("inf")) -> None:
        """``result[0] = max_j |expected_j - actual_j| / (rel_tol * magnitude_j + floor)``,
        ``result[1]`` = that j (-1 for empty vectors), on ``stream``. Non-finite expected or
        magnitude counts 0 (nothing to check against). Non-finite actual counts +inf, unless
        ``magnitude_j * (1 + rel_tol)`` reaches ``limit`` (the dtype's largest finite value):
        then an element of C may truly have overflowed, and it counts 0."""

    def rounding(self, dtype: np.dtype) -> Rounding:
        """How ``gemm`` rounds products of ``dtype`` operands: the epsilon of its additions,
        the terms per product and the relative error of a product from its inputs' rounding
        (:class:`bigmm.precision.Rounding`: TF32 tensor cores round the inputs, an FMA does
        not)."""

    def run_on(self, stream: Any) -> Any:
        """A context manager in which array operations on device arrays are issued on
        ``stream`` (used by fault-injection tests)."""


@runtime_checkable
class Calibrates(Protocol):
    """A backend that knows its own speeds."""

    def rates(self, dtype: str, limit: int | None = None) -> Rates:
        """Rates for the predicted time of a job in ``dtype`` (timed on this machine, not
        yet snapped to the rates' grid); what the timing holds on the device and in pinned
        memory stays within ``limit`` bytes where given."""


@runtime_checkable
class TimesShapes(Protocol):
    """A backend that times its gemm at the shape of a plan's steps (a library's kernels run
    some shapes markedly slower than others of the same size)."""

    def shape_flops(self, rows: int, cols: int, depth: int, dtype: str) -> float | None:
        """Flops per second of a gemm step of ``dtype`` operands, ``rows`` x ``cols`` over
        ``depth``, adding into its C tile, timed on the device (or kept by an earlier
        process); None where it cannot be timed now (the device memory it needs is not
        free)."""


@runtime_checkable
class Describes(Protocol):
    """A backend that can say what it runs on (the device, its kernel), for reports."""

    def describe(self) -> str:
        """What it runs on, in words, e.g. "NVIDIA H100 80GB HBM3 (device 0), kernel bigmm"."""


@runtime_checkable
class Profiles(Protocol):
    """A backend that times its own copies and kernels."""

    def start_profile(self, profile) -> None:
        """Time every later copy and kernel into ``profile`` (a bigmm.profile.Profile),
        whose ``device_stages`` it names."""

    def stop_profile(self) -> None:
        """Wait for the timed work and add its intervals to the profile."""


@runtime_checkable
class HostHints(Protocol):
    """How the host work around a backend is best sized; None where it has no say."""

    #: Reader threads per input file.
    reader_threads: int | None
    #: Bytes of file per block of copies out of an input's file map.
    map_step: int | None

    def gemm_threads(self) -> int | None:
        """The host threads its gemm computes with (None: it does not compute on the
        host)."""


@runtime_checkable
class Registers(Protocol):
    """A staging backend that can page-lock a range of the user's host memory in place
    (``cudaHostRegister``), so that copies to and from it are asynchronous DMA like those of
    its own pinned buffers, and release it after the run."""

    def register(self, ptr: int, nbytes: int, read_only: bool = False) -> None:
        """Page-lock the host bytes [ptr, ptr + nbytes) (whole pages: the driver rounds the
        range out to them); ``read_only``: the device only reads them (memory the process may
        not write can be locked so). RegisterError when the driver refuses, with nothing
        left locked."""

    def unregister(self, ptr: int) -> None:
        """Release a range locked by :meth:`register` at ``ptr`` (no copy may still use it)."""


@runtime_checkable
class SplitsPanels(Protocol):
    """A backend whose gemm splits a step's A and B panels ahead into a device workspace of
    ``bigmm.planner.split_workspace_bytes`` of the step's tile, held with its buffers (the
    plan counts it: ``Plan.presplit``)."""

    #: The parts an element its products split into ahead (2: 3xTF32, 1: TF32 on Hopper; 0:
    #: none).
    split_parts: int


@runtime_checkable
class Syrk(Protocol):
    """A backend that updates the upper triangle of a square tile by a rank-k product of one
    panel with itself (BLAS ``syrk``): half the flops of the gemm of the panel with its own
    transpose. Without it, the diagonal tiles of a Gram plan are multiplied whole by
    ``gemm``."""

    def syrk(self, a: Any, c: Any, alpha: float, beta: float, trans: bool,
             stream: Any = None) -> None:
        """The upper triangle of the square ``c`` (row-major: ``c[i, j]`` for ``j >= i``) =
        alpha * op(a) @ op(a)^T + beta * c on ``stream``, op(a) = a^T when ``trans`` (c = alpha
        a^T a + beta c) else a (c = alpha a a^T + beta c); beta == 0 never reads c. The strictly
        lower triangle of c is left undefined (untouched, or overwritten)."""


@runtime_checkable
class DeviceBlocks(Protocol):
    """A backend that allocates several equal device buffers at once."""

    def device_buffers(self, size: int, count: int, dtype: np.dtype) -> list:
        """``count`` flat device arrays of ``size`` elements each, disjoint, from one
        allocation (freed by ``close``), as ``device_buffer`` gives one."""


def rows_contiguous(x) -> bool:
    """Whether the 2-D array ``x`` has contiguous rows that do not overlap (any row pitch):
    the layout one 2-D copy (cudaMemcpy2D) moves."""
    if x.ndim != 2:
        return False
    rows, cols = x.shape
    return ((cols <= 1 or x.strides[1] == x.itemsize)
            and (rows <= 1 or x.strides[0] >= cols * x.itemsize))


def check_gemm_dtypes(a, b, c) -> str:
    """The name of the operands' dtype, given the dtypes of a, b and c: DtypeError unless a
    and b share one of GEMM_DTYPES and c is in the dtype it accumulates in."""
    name = dtype_name(a) if np.dtype(a).isnative else None
    if (name is None or np.dtype(b) != np.dtype(a) or not np.dtype(c).isnative
            or dtype_name(c) != accumulate_dtype(name)):
        raise DtypeError(f"Expected a and b of one dtype ({', '.join(DTYPES)}) and c in the "
                         f"dtype it accumulates in (float32 for float16 and bfloat16, else "
                         f"the same). Got {np.dtype(a)}, {np.dtype(b)} and {np.dtype(c)}.")
    return name


def gemm_shape(a, b, c, trans_a: bool, trans_b: bool) -> tuple[int, int, int]:
    """(m, k, n) of c = op(a) @ op(b) for 2-D a, b and c; ShapeError unless they match."""
    m, k = a.shape[::-1] if trans_a else a.shape
    kb, n = b.shape[::-1] if trans_b else b.shape
    if k != kb or c.shape != (m, n):
        raise ShapeError(f"Expected op(a) (m x k), op(b) (k x n) and c (m x n). Got op(a) "
                         f"{(m, k)}, op(b) {(kb, n)} and c {c.shape}.")
    return m, k, n


def flat_view(buf, shape: tuple[int, int]):
    """The first rows * cols elements of a flat buffer (NumPy or device array) as a row-major
    (rows, cols) view; ShapeError when the buffer is smaller."""
    rows, cols = shape
    if rows * cols > buf.size:
        raise ShapeError(f"Expected a view of at most {buf.size} elements. "
                         f"Got shape {shape}.")
    return buf[: rows * cols].reshape(rows, cols)
