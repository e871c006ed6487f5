"""The CuPy backend: pinned host staging, device buffers within the budget, streams and events,
bigmm's own GEMM kernel (or cuBLAS).

``staging = True``: the executor fills pinned host buffers from disk, copies them in on one
non-blocking stream, multiplies on a second and copies finished C tiles out on a third; events
order the streams, and the host blocks only in :meth:`synchronize` (reader and writer threads
waiting for a buffer to be free or full).

* Host buffers are page-locked, so every copy is a true asynchronous DMA
  (``cudaMemcpyAsync``); a pageable array handed to ``copy_in``/``copy_out`` is refused rather
  than copied synchronously. They are made the way the calibration timed faster
  (:mod:`.cupy_pinned`: ``cudaHostAlloc``, or ordinary pages touched and locked in place),
  and kept for the next run in this process (:func:`release_pinned` frees them;
  ``keep_pinned=False`` frees them at :meth:`close`).
* Device buffers are plain ``cudaMalloc`` allocations (not cupy's memory pool), one per slot of
  the plan, so the device memory a run holds is exactly the plan's ``device_bytes``
  (:attr:`device_bytes`), freed at :meth:`close`.
* ``kernel``: "bigmm" (default; :mod:`.cuda_kernels`, without split-K, whose workspace would
  come from cupy's memory pool, outside the budget), "cublas" (cuBLAS SGEMM/DGEMM on a
  handle this backend holds alone, kept for the next one: :mod:`.cupy_handles`) or
  "cublas-tf32" (kernel "cublas" with precision "tf32").
* ``precision`` (:mod:`bigmm.precision`) of float32 products: "float32" (default; IEEE on
  the CUDA cores), "tf32x3" (bigmm's 3xTF32 kernels: float32's accuracy on the tensor cores;
  not with cuBLAS) or "tf32" (bigmm's TF32 kernels, or cuBLAS's TF32 math mode: inputs
  rounded to 11 significant bits). Other dtypes take the default only.
* float16 and bfloat16 operands are multiplied by ``cublasGemmEx`` whatever the kernel: A and
  B in their 16-bit type on tensor cores, products accumulated in float32
  (``CUBLAS_COMPUTE_32F``), C in float32. CuPy has no bfloat16 dtype: bfloat16 device arrays
  are uint16 arrays holding the bits (:func:`device_dtype`), copied to and from ml_dtypes'
  bfloat16 host arrays as they are; the gemm takes uint16 a and b as bfloat16
  (``CUDA_R_16BF``). Half-precision panels are copied in as they are stored (2 bytes an
  element) and never converted on the host.
* Profiling (:meth:`start_profile`/:meth:`stop_profile`): every copy and kernel is bracketed by
  timing events; after the run their times are converted to host ``perf_counter`` seconds
  through an anchor event and added to the :class:`~bigmm.profile.Profile`.

Besides the core :class:`~.base.Backend` it is :class:`~.base.Checksums` (kernels/
abft_checksum.cu; bigmm's float32-precision kernel fuses a step's updates),
:class:`~.base.Calibrates` (:mod:`.cupy_rates`: its gemm, copies, pitched copies, device
memory and page-locking timed), :class:`~.base.TimesShapes` (its gemm at a plan's step
shape), :class:`~.base.Profiles`,
:class:`~.base.HostHints` (wide blocks for copies out of file maps),
:class:`~.base.Registers` (``cudaHostRegister``: a user's array page-locked in place for a
run, read-only where the process may not write it; anything still locked is released at
:meth:`close`) and :class:`~.base.DeviceBlocks` (a run's slots of one operand from one
cudaMalloc).

Its device-array helpers (bfloat16 as uint16 bits, extents, pitches, the gemm's operand
checks) are in :mod:`.cupy_arrays`. This module imports cupy at its top: the registry imports
it only when the cupy backend is asked for.
"""

from __future__ import annotations

import time
from dataclasses import replace

import cupy
import numpy as np

from ..errors import OptionError, ShapeError
from ..io.mapped import WIDE_STEP_BYTES
from ..planner.model import Rates
from ..precision import DEFAULT, ROUNDING, Rounding, kernel_precision
from ..units import HALF_DTYPES
from .base import flat_view, rows_contiguous
from .cupy_arrays import (_check_gemm, _extent, _page_locked, _pitch, FiniteFlags, device_dtype,
                          scale)
from .cupy_handles import HandlePool, cublas_gemm, cublas_gemm_ex
from .cupy_pinned import KEPT, as_array, lock_range
from .cupy_pinned import pinned_bytes_held, release_pinned  # noqa: F401 (this module's API)

#: Names ``kernel=`` accepts.
KERNELS = ("bigmm", "cublas", "cublas-tf32")
_H2D, _D2H = 1, 2  # cudaMemcpyHostToDevice, DeviceToHost
_DEFAULT_MATH, _TF32_MATH = 0, 3  # cublasMath_t: CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH
_LANES = {"copy_in": "GPU copy-in stream", "compute": "GPU compute stream",
          "copy_out": "GPU copy-out stream"}
#: The profile's anchor (the host time of one event): host clock readings around its record
#: and wait, retried until they are at most ANCHOR_WINDOW seconds apart (a thread descheduled
#: between them would shift every interval), at most ANCHOR_TRIES times.
ANCHOR_TRIES, ANCHOR_WINDOW = 8, 50e-6
#: Buffers of one :meth:`CupyBackend.device_buffers` block start on multiples of this many
#: bytes (cudaMalloc's own alignment).
BLOCK_ALIGN = 256


_HANDLES = HandlePool()


class CupyBackend:
    """GPU backend on one CUDA device (default: the current one). See the module docstring."""

    name = "cupy"
    staging = True
    #: For the planner's time model with checksums: bytes per second the sums kernels read
    #: (2.0-2.4 TB/s measured on an H100 for panels beyond L2) and the seconds their launches
    #: add to a step (two per step, about 20 us each).
    checksum_rate = 2.0e12
    checksum_step = 40e-6
    #: Inputs are copied out of their file maps in blocks of this many file bytes: a GPU
    #: process runs many threads, and each block's release flushes the TLB of every CPU they
    #: run on (see bigmm.io.mapped.WIDE_STEP_BYTES).
    map_step = WIDE_STEP_BYTES
    #: The inputs' readers as the sources choose them.
    reader_threads = None

    def gemm_threads(self) -> None:
        """None: the gemm runs on the GPU, not on host threads."""
        return None

    def __init__(self, *, kernel: str = "bigmm", precision: str | None = None,
                 device: int | None = None, keep_pinned: bool = True):
        if not isinstance(kernel, str) or kernel.lower() not in KERNELS:
            raise OptionError(f"Expected kernel to be one of {', '.join(KERNELS)}. "
                              f"Got {kernel!r}.")
        self.kernel = kernel.lower()
        #: The arithmetic of float32 products (see :mod:`bigmm.precision`).
        self.precision = kernel_precision(self.kernel, precision)
        self._device = cupy.cuda.Device(device)
        self.keep_pinned = keep_pinned
        self._pinned: list = []  # (start, end, block) of this backend's pinned blocks
        self._user_pinned: list = []  # (start, end, None) of user arrays found pinned
        self._registered: dict[int, int] = {}  # start -> bytes of ranges locked by register
        self._device_ptrs: list[int] = []
        self._streams: list = []
        self._handle: int | None = None
        self._profile = None
        self._marks: list = []
        self.device_bytes = 0  # bytes of device buffers held
        self.host_bytes = 0  # bytes of pinned host buffers held
        self._split_work = None  # (pointer, array) of the split panels' workspace
        self._flags: FiniteFlags | None = None  # for nonfinite, made at its first call
        if self.kernel == "bigmm":
            from . import cuda_kernels

            self._kernels = cuda_kernels

    @property
    def device_id(self) -> int:
        return self._device.id

    def describe(self) -> str:
        """The device, kernel and (where not the default) precision, e.g. "NVIDIA H100 80GB
        HBM3 (device 0), kernel bigmm, precision tf32x3"."""
        props = cupy.cuda.runtime.getDeviceProperties(self._device.id)
        name = props["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        shown = self.precision != DEFAULT and self.kernel != "cublas-tf32"
        return (f"{name} (device {self._device.id}), kernel {self.kernel}"
                + (f", precision {self.precision}" if shown else ""))

    # ----- buffers --------------------------------------------------------------------------
    def host_buffer(self, size: int, dtype) -> np.ndarray:
        """A flat pinned host array (page-locked; reused from the last run when sizes match)."""
        dtype = np.dtype(dtype)
        nbytes = int(size) * dtype.itemsize
        with self._device:
            mem = KEPT.take(nbytes)
        self._pinned.append((mem.ptr, mem.ptr + nbytes, mem))
        self.host_bytes += nbytes
        return as_array(mem, int(size), dtype)

    def device_buffer(self, size: int, dtype) -> cupy.ndarray:
        """A flat device array from its own cudaMalloc (not the memory pool), freed by
        :meth:`close` (views of it must not be used after that); bfloat16 as uint16 bits."""
        dtype = device_dtype(dtype)
        mem = self._allocate(int(size) * dtype.itemsize)
        return cupy.ndarray((int(size),), dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))

    def device_buffers(self, size: int, count: int, dtype) -> list:
        """``count`` flat device arrays of ``size`` elements from one cudaMalloc (freed by
        :meth:`close`), each starting on a BLOCK_ALIGN boundary."""
        dtype = device_dtype(dtype)
        step = -(-int(size) * dtype.itemsize // BLOCK_ALIGN) * BLOCK_ALIGN
        mem = self._allocate(step * int(count))
        return [cupy.ndarray((int(size),), dtype, memptr=cupy.cuda.MemoryPointer(mem, i * step))
                for i in range(int(count))]

    def _allocate(self, nbytes: int):
        """``nbytes`` of device memory from a cudaMalloc of its own, counted in
        ``device_bytes`` and freed by :meth:`close`."""
        with self._device:
            ptr = cupy.cuda.runtime.malloc(max(nbytes, 1))
        self._device_ptrs.append(ptr)
        self.device_bytes += nbytes
        return cupy.cuda.UnownedMemory(ptr, max(nbytes, 1), self, self._device.id)

    def view(self, buf, shape: tuple[int, int]):
        return flat_view(buf, shape)

    def is_pinned(self, arr: np.ndarray) -> bool:
        """True when ``arr`` (any strides) lies inside one of this backend's pinned host buffers
        or inside a user array :meth:`host_pinned` found pinned during this run."""
        lo, hi = _extent(arr)
        return any(a <= lo and hi <= b for a, b, _ in self._pinned + self._user_pinned)

    def host_pinned(self, arr: np.ndarray) -> bool:
        """True when the whole of the host array ``arr`` lies in page-locked memory registered
        with CUDA (``cudaHostAlloc``, ``cupy.cuda.alloc_pinned_memory``, ``cudaHostRegister``):
        ``cudaPointerGetAttributes`` reports ``cudaMemoryTypeHost`` for its first and its last
        byte. The runtime does not say whether both lie in one allocation; a NumPy array is one
        range of virtual memory, pinned at both ends. Any error counts as not pinned."""
        if not isinstance(arr, np.ndarray) or arr.size == 0:
            return False
        lo, hi = _extent(arr)
        if self.is_pinned(arr):
            return True
        with self._device:
            pinned = _page_locked(lo) and _page_locked(hi - 1)
        if pinned:  # later copies of views of it skip the query
            self._user_pinned.append((lo, hi, None))
        return pinned

    # ----- page-locking the user's memory ----------------------------------------------------
    def register(self, ptr: int, nbytes: int, read_only: bool = False) -> None:
        """Page-lock host bytes [ptr, ptr + nbytes) in place (``cudaHostRegister``, portable;
        read-only where asked, and then again without the flag where the driver does not
        know it); RegisterError when the driver refuses."""
        with self._device:
            lock_range(int(ptr), int(nbytes), read_only)
        self._registered[int(ptr)] = int(nbytes)

    def unregister(self, ptr: int) -> None:
        """Release a range locked by :meth:`register` (``cudaHostUnregister``)."""
        nbytes = self._registered.pop(int(ptr))
        self._user_pinned = [(a, b, x) for a, b, x in self._user_pinned
                             if not (ptr <= a and b <= ptr + nbytes)]
        with self._device:
            cupy.cuda.runtime.hostUnregister(int(ptr))

    # ----- streams, events, copies ----------------------------------------------------------
    def stream(self) -> cupy.cuda.Stream:
        with self._device:
            s = cupy.cuda.Stream(non_blocking=True)
        self._streams.append(s)
        return s

    def copy_in(self, host: np.ndarray, dev: cupy.ndarray, stream) -> None:
        """Asynchronous copy of a pinned host 2-D array (rows contiguous, any row pitch: a
        region of a larger array) into the device array ``dev`` on ``stream``."""
        self._copy("copy_in", host, dev, stream)

    def copy_out(self, dev: cupy.ndarray, host: np.ndarray, stream) -> None:
        """Asynchronous copy of ``dev`` into a pinned host 2-D array (rows contiguous, any row
        pitch) on ``stream``."""
        self._copy("copy_out", host, dev, stream)

    def _copy(self, stage: str, host, dev, stream) -> None:
        """One cudaMemcpy2DAsync (a plain cudaMemcpyAsync where both sides are contiguous, the
        pitch == width case)."""
        self._check_copy(host, dev, stage)
        rows, cols = host.shape
        width = cols * host.itemsize
        h, d = (host.ctypes.data, _pitch(host)), (dev.data.ptr, _pitch(dev))
        (dst, dpitch), (src, spitch), kind = ((d, h, _H2D) if stage == "copy_in" else
                                              (h, d, _D2H))
        e0 = self._mark(stream)
        if rows and width:
            if dpitch == spitch == width:
                cupy.cuda.runtime.memcpyAsync(dst, src, width * rows, kind, stream.ptr)
            else:
                cupy.cuda.runtime.memcpy2DAsync(dst, dpitch, src, spitch, width, rows, kind,
                                                stream.ptr)
        self._marked(stage, e0, stream, f"{'H2D' if kind == _H2D else 'D2H'} {rows}x{cols}",
                     nbytes=host.nbytes)

    def _check_copy(self, host, dev, what: str) -> None:
        if not isinstance(host, np.ndarray) or not isinstance(dev, cupy.ndarray):
            raise ShapeError(f"Expected a NumPy host array and a cupy device array for {what}. "
                             f"Got {type(host).__name__} and {type(dev).__name__}.")
        if host.shape != dev.shape or device_dtype(host.dtype) != dev.dtype or host.ndim != 2:
            raise ShapeError(f"Expected 2-D host and device arrays of one shape and dtype for "
                             f"{what}. Got {host.dtype} {host.shape} and {dev.dtype} {dev.shape}.")
        if not (rows_contiguous(host) and rows_contiguous(dev)):
            raise ShapeError(f"Expected arrays with contiguous rows (any row pitch) for {what}. "
                             f"Got host strides {host.strides} and device strides "
                             f"{dev.strides}.")
        if host.size and not self.host_pinned(host):
            raise ShapeError(f"Expected a pinned host array for {what} (pageable copies are "
                             f"synchronous). Got an ordinary array.")

    def scale(self, c, beta: float, stream) -> None:
        with self._device, stream:
            scale(c, beta)

    def nonfinite(self, c, stream):
        """1 where ``c`` holds a NaN or an infinity, else 0 (not a count: see
        :class:`.cupy_arrays.FiniteFlags`)."""
        with self._device:
            if self._flags is None:
                self._flags = FiniteFlags(lambda n: self.device_buffer(n, np.uint64))
            return self._flags.flag(c, stream)

    def record(self, stream) -> cupy.cuda.Event:
        ev = cupy.cuda.Event(block=True, disable_timing=True)
        ev.record(stream)
        return ev

    def wait(self, stream, event) -> None:
        stream.wait_event(event)

    def synchronize(self, event) -> None:
        event.synchronize()

    # ----- compute --------------------------------------------------------------------------
    @property
    def split_parts(self) -> int:
        """The parts an element float32 products split their panels into ahead, in a
        workspace (bigmm's TF32 kernels on a compute capability 9.0 GPU: 2 for 3xTF32, 1 for
        TF32, where :func:`.cuda_kernels.presplit_pays`); 0 where they do not."""
        if self.kernel != "bigmm":
            return 0
        with self._device:
            return self._kernels.split_parts(self.precision)

    def _split_workspace(self, nbytes: int):
        """The split panels' workspace, of at least ``nbytes``: one device buffer, replaced
        by a larger one (after the device's work is done) where a product needs more."""
        if self._split_work is None or self._split_work[1].nbytes < nbytes:
            if self._split_work is not None:
                ptr, held = self._split_work[0], self._split_work[1].nbytes
                self._split_work = None
                with self._device:
                    cupy.cuda.runtime.deviceSynchronize()
                    cupy.cuda.runtime.free(ptr)
                self._device_ptrs.remove(ptr)
                self.device_bytes -= held
            buf = self.device_buffer(nbytes, np.uint8)
            self._split_work = (self._device_ptrs[-1], buf)
        return self._split_work[1]

    @property
    def fuses_checks(self) -> bool:
        """Whether gemm takes ``checks`` (bigmm's kernel in precision float32: cuBLAS's and
        the tensor-core kernels cannot do them)."""
        return self.kernel == "bigmm" and self.precision == DEFAULT

    def gemm(self, a, b, c, alpha: float, beta: float, trans_a: bool, trans_b: bool,
             stream=None, checks=None) -> None:
        """c = alpha * op(a) @ op(b) + beta * c on ``stream``; beta == 0 never reads c. With
        ``checks`` (:class:`.base.GemmChecks`, bigmm's kernel only) the kernel also does
        those checksum updates."""
        self.gemm_launcher(a, b, c, alpha, beta, trans_a, trans_b, checks)(stream)

    def gemm_launcher(self, a, b, c, alpha: float, beta: float, trans_a: bool, trans_b: bool,
                      checks=None):
        """See :meth:`bigmm.backends.base.Backend.gemm_launcher`: bigmm's kernel checked and
        its arguments packed once (:func:`.cuda_kernels.prepare_gemm`); cuBLAS's call as it
        is."""
        name, (m, k, n) = _check_gemm(a, b, c, trans_a, trans_b)
        half = name in HALF_DTYPES
        if checks is not None and (half or not self.fuses_checks):
            raise OptionError(f"Expected checks= only with kernel='bigmm', precision "
                              f"'float32' and float32 or float64. Got kernel={self.kernel!r}, "
                              f"precision={self.precision!r}, {name}.")
        if name != "float32" and self.precision != DEFAULT:
            raise OptionError(f"Expected float32 operands for precision={self.precision!r}. "
                              f"Got {name}.")
        alpha, beta, trans_a, trans_b = float(alpha), float(beta), bool(trans_a), bool(trans_b)
        if half:
            def launch(stream) -> None:
                cublas_gemm_ex(self._cublas_handle(), name, a, b, c, m, n, k, alpha, beta,
                               trans_a, trans_b, stream)
        elif self.kernel == "bigmm":
            with self._device:
                launch = self._kernels.prepare_gemm(
                    a, b, c, alpha, beta, trans_a, trans_b, split_k=1, checks=checks,
                    precision=self.precision if name == "float32" else None,
                    workspace=self._split_workspace)
        else:
            def launch(stream) -> None:
                cublas_gemm(self._cublas_handle(), a, b, c, m, n, k, alpha, beta, trans_a,
                            trans_b, stream)
        return self._launcher(launch, f"gemm {m}x{n}x{k}", flops=2 * m * n * k)

    #: How the diagonal tiles of Gram plans are updated (:mod:`.cupy_syrk`'s MODES); None:
    #: "triangle" (bigmm's kernel on the tiles on and above the diagonal) with kernel "bigmm",
    #: else "split" (2 x 2 blocks, cuBLAS syrk on the diagonal ones). See BENCHMARKS.md.
    syrk_mode: str | None = None

    def syrk(self, a, c, alpha: float, beta: float, trans: bool, stream=None) -> None:
        """See :meth:`bigmm.backends.base.Syrk.syrk` (:mod:`.cupy_syrk`)."""
        from .cupy_syrk import syrk

        mode = self.syrk_mode or ("triangle" if self.kernel == "bigmm" else "split")
        with self._device:
            syrk(self, self._cublas_handle, a, c, float(alpha), float(beta), bool(trans),
                 stream if stream is not None else cupy.cuda.get_current_stream(), mode)

    def upper_gemm(self, a, b, c, alpha: float, beta: float, trans_a: bool, trans_b: bool,
                   stream) -> None:
        """:meth:`gemm` by bigmm's kernel on its tiles of c on or above the diagonal only
        (those wholly below are left as they were)."""
        name = str(c.dtype)
        with self._device:
            self._kernels.prepare_gemm(
                a, b, c, alpha, beta, trans_a, trans_b, split_k=1, upper=True,
                precision=self.precision if name == "float32" else None)(stream)

    def _cublas_handle(self) -> int:
        """This backend's cuBLAS handle (taken from those kept by earlier backends)."""
        if self._handle is None:
            with self._device:
                self._handle = _HANDLES.take(self._device.id, _TF32_MATH if
                                             self.precision == "tf32" else _DEFAULT_MATH)
        return self._handle

    # ----- checksums ------------------------------------------------------------------------
    def weighted_sums(self, x, out, out_abs=None, *, weights=None, abs_weights=None,
                      scale: float = 1.0, accumulate: bool = False, stream=None) -> None:
        """See :meth:`bigmm.backends.base.Backend.weighted_sums` (kernels/abft_checksum.cu)."""
        self.sums_launcher(x, out, out_abs, weights=weights, abs_weights=abs_weights,
                           scale=scale, accumulate=accumulate)(stream)

    def sums_launcher(self, x, out, out_abs=None, *, weights=None, abs_weights=None,
                      scale: float = 1.0, accumulate: bool = False):
        """See :meth:`bigmm.backends.base.Backend.sums_launcher`."""
        from . import cuda_checksums

        with self._device:
            launch, _ = cuda_checksums.prepare_sums(x, out, out_abs, weights=weights,
                                                  abs_weights=abs_weights, scale=scale,
                                                  accumulate=accumulate)
        return self._launcher(launch, f"checksum {x.shape[0]}x{x.shape[1]}")

    def compare_sums(self, expected, magnitude, actual, rel_tol: float, floor: float, result,
                     stream=None, limit: float = float("inf")) -> None:
        self.compare_launcher(expected, magnitude, actual, rel_tol, floor, result,
                              limit)(stream)

    def compare_launcher(self, expected, magnitude, actual, rel_tol: float, floor: float,
                         result, limit: float = float("inf")):
        from . import cuda_checksums

        with self._device:
            launch = cuda_checksums.prepare_compare(expected, magnitude, actual, rel_tol, floor,
                                                  result, limit)
        return self._launcher(launch, "checksum compare")

    def _launcher(self, launch, label: str, flops: int = 0):
        """``launch(stream)`` on this device (the current stream for None), timed as compute
        while profiling."""
        def run(stream=None) -> None:
            stream = stream if stream is not None else cupy.cuda.get_current_stream()
            e0 = self._mark(stream)
            with self._device:
                launch(stream)
            self._marked("compute", e0, stream, label, flops=flops)

        return run

    def rounding(self, dtype) -> Rounding:
        """float32 products: their precision's (:data:`bigmm.precision.ROUNDING`: TF32
        rounds the inputs); half-precision ones: float32's (their products are exact in
        float32, and accumulate in it); float64: IEEE."""
        name = str(np.dtype(dtype))
        if name == "float32":
            return ROUNDING[self.precision]
        if name in HALF_DTYPES:
            return Rounding(float(np.finfo(np.float32).eps))
        return Rounding(float(np.finfo(dtype).eps))

    def run_on(self, stream):
        return _OnStream(self._device, stream)

    # ----- profiling ------------------------------------------------------------------------
    def start_profile(self, profile) -> None:
        """Time every later copy and kernel with events; see :meth:`stop_profile`."""
        self._profile, self._marks = profile, []
        profile.device_stages = tuple(dict.fromkeys(profile.device_stages + tuple(_LANES)))
        profile.device = self.describe()
        with self._device:
            s = cupy.cuda.Stream(non_blocking=True)
            best = None
            for _ in range(ANCHOR_TRIES):  # the tightest bracket of host clock readings
                anchor = cupy.cuda.Event(block=False, disable_timing=False)
                before = time.perf_counter()
                anchor.record(s)
                anchor.synchronize()
                after = time.perf_counter()
                if best is None or after - before < best[1] - best[0]:
                    best = (before, after, anchor)
                if after - before < ANCHOR_WINDOW:
                    break
            before, after, anchor = best
            self._anchor = (anchor, (before + after) / 2)

    def stop_profile(self) -> None:
        """Wait for the timed work, convert its event times to host seconds, add them."""
        profile, marks = self._profile, self._marks
        self._profile, self._marks = None, []
        if profile is None:
            return
        anchor, t_anchor = self._anchor
        for stage, e0, e1, enqueued, label, nbytes, flops in marks:
            e1.synchronize()
            t1 = t_anchor + cupy.cuda.get_elapsed_time(anchor, e1) / 1e3
            t0 = t_anchor + cupy.cuda.get_elapsed_time(anchor, e0) / 1e3
            t0 = min(max(t0, enqueued), t1)
            profile.add(stage, t0, t1, lane=_LANES[stage], label=label, nbytes=nbytes,
                        flops=flops)

    def _mark(self, stream):
        if self._profile is None:
            return None
        ev = cupy.cuda.Event(block=False, disable_timing=False)
        ev.record(stream)
        return ev

    def _marked(self, stage: str, e0, stream, label: str, nbytes: int = 0,
                flops: int = 0) -> None:
        """Close the interval opened by ``e0``. The work cannot have started before it was
        enqueued (a first launch compiles its kernel in between), so the host time now bounds
        its start from below."""
        if e0 is not None:
            self._marks.append((stage, e0, self._mark(stream), time.perf_counter(), label,
                                nbytes, flops))

    # ----- resources ------------------------------------------------------------------------
    def memory_available(self) -> int:
        """Free device memory in bytes (cudaMemGetInfo)."""
        with self._device:
            free, _ = cupy.cuda.runtime.memGetInfo()
        return int(free)

    def rates(self, dtype: str, limit: int | None = None) -> Rates:
        """Rates for the predicted time, measured once per process, precision and size
        (:func:`.cupy_rates.rates`), with the pinned blocks an earlier run kept."""
        from . import cupy_rates

        return replace(cupy_rates.rates(self, dtype, limit), kept_pinned=KEPT.sizes())

    def shape_flops(self, rows: int, cols: int, depth: int, dtype: str) -> float | None:
        """Its gemm's rate at a step of this shape (:func:`.cupy_rates.shape_flops`); None
        where float32 steps take panels split ahead (a call alone would time the split too,
        which a run does once a panel)."""
        from . import cupy_rates

        if self.split_parts and str(dtype) == "float32":
            return None
        return cupy_rates.shape_flops(self, rows, cols, depth, dtype)

    def close(self) -> None:
        """Wait for this backend's streams, then free its device buffers (now, not when the
        last view is garbage); its cuBLAS handle is kept for the next backend, and pinned
        blocks for the next run (or freed with ``keep_pinned=False`` once no array uses
        them). Idempotent."""
        with self._device:
            for s in self._streams:
                s.synchronize()
            if self._handle is not None:
                _HANDLES.give(self._device.id, self._handle)
                self._handle = None
            for ptr in self._device_ptrs:
                cupy.cuda.runtime.free(ptr)
            for ptr in list(self._registered):  # a run that could not release them
                self.unregister(ptr)
        blocks = [mem for _, _, mem in self._pinned]
        if self.keep_pinned and blocks:
            KEPT.keep(blocks)
        self._pinned, self._device_ptrs, self._streams = [], [], []
        self._user_pinned, self._split_work, self._flags = [], None, None
        self.device_bytes = self.host_bytes = 0


class _OnStream:
    """Context: this backend's device current and ``stream`` the current stream."""

    def __init__(self, device, stream):
        self.device, self.stream = device, stream

    def __enter__(self):
        self.device.__enter__()
        self.stream.__enter__()
        return self.stream

    def __exit__(self, *exc):
        self.stream.__exit__(*exc)
        self.device.__exit__(*exc)
        return False
