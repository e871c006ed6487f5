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
  come from cupy's memory pool, outside the budget), "cublas" (cuBLAS SGEMM/DGEMM on this
  backend's own handle) or "cublas-tf32" (the same with TF32 tensor cores for float32: about
  10 bits of mantissa in the products, relative errors near 1e-3 instead of 1e-6).
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
abft_checksum.cu; bigmm's kernel fuses a step's updates), :class:`~.base.Calibrates` (its
gemm, copies, pitched copies, device memory and page-locking timed), :class:`~.base.Profiles`,
:class:`~.base.HostHints` (wide blocks for copies out of file maps) and
:class:`~.base.Registers` (``cudaHostRegister``: a user's array page-locked in place for a
run, read-only where the process may not write it; anything still locked is released at
:meth:`close`).

This module imports cupy at its top: the registry imports it only when the cupy backend is
asked for.
"""

from __future__ import annotations

import math
import time

import cupy
import numpy as np

from ..errors import KernelError, OptionError, ShapeError
from ..io.mapped import WIDE_STEP_BYTES
from ..planner.model import READ_RATE, WRITE_RATE, Rates
from ..units import HALF_DTYPES, accumulate_dtype, numpy_dtype
from .base import check_gemm_dtypes, flat_view, gemm_shape, rows_contiguous
from .cupy_pinned import PinnedCache, as_array, choose, lock_range, lock_rate

#: Names ``kernel=`` accepts.
KERNELS = ("bigmm", "cublas", "cublas-tf32")
_H2D, _D2H, _D2D = 1, 2, 3  # cudaMemcpyHostToDevice, DeviceToHost, DeviceToDevice
_MEMORY_TYPE_HOST = 1  # cudaMemoryTypeHost: page-locked host memory known to CUDA
_OP_N, _OP_T = 0, 1  # cublasOperation_t
_DEFAULT_MATH, _TF32_MATH = 0, 3  # cublasMath_t: CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH
#: cudaDataType_t of GemmEx's operands, CUBLAS_COMPUTE_32F and CUBLAS_GEMM_DEFAULT.
_CUDA_TYPES = {"float16": 2, "bfloat16": 14, "float32": 0}
_COMPUTE_32F, _GEMM_DEFAULT = 68, -1
_BF16 = numpy_dtype("bfloat16")
_HOST_ALLOC_PORTABLE = getattr(cupy.cuda.runtime, "hostAllocPortable", 1)
#: Bytes per row of the pitched copies timed at calibration (a 4096-wide float32 panel) and
#: bytes of the host array page-locked and released there.
_ROW_BYTES, _LOCK_BYTES = 16 << 10, 64 << 20
_LANES = {"copy_in": "GPU copy-in stream", "compute": "GPU compute stream",
          "copy_out": "GPU copy-out stream"}


_PINNED = PinnedCache()
_RATES: dict[tuple, Rates] = {}


def release_pinned() -> None:
    """Free the pinned host blocks kept for the next run."""
    _PINNED.release()


def pinned_bytes_held() -> int:
    """Bytes of pinned host memory kept for the next run."""
    return _PINNED.held_bytes()


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

    def __init__(self, *, kernel: str = "bigmm", device: int | None = None,
                 keep_pinned: bool = True):
        if not isinstance(kernel, str) or kernel.lower() not in KERNELS:
            raise OptionError(f"Expected kernel to be one of {', '.join(KERNELS)}. "
                              f"Got {kernel!r}.")
        self.kernel = kernel.lower()
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
        if self.kernel == "bigmm":
            from . import cuda_kernels

            self._kernels = cuda_kernels

    @property
    def device_id(self) -> int:
        return self._device.id

    def describe(self) -> str:
        """The device and kernel, e.g. "NVIDIA H100 80GB HBM3 (device 0), kernel bigmm"."""
        props = cupy.cuda.runtime.getDeviceProperties(self._device.id)
        name = props["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        return f"{name} (device {self._device.id}), kernel {self.kernel}"

    # ----- buffers --------------------------------------------------------------------------
    def host_buffer(self, size: int, dtype) -> np.ndarray:
        """A flat pinned host array (page-locked; reused from the last run when sizes match)."""
        dtype = np.dtype(dtype)
        nbytes = int(size) * dtype.itemsize
        with self._device:
            mem = _PINNED.take(nbytes)
        self._pinned.append((mem.ptr, mem.ptr + nbytes, mem))
        self.host_bytes += nbytes
        return as_array(mem, int(size), dtype)

    def device_buffer(self, size: int, dtype) -> cupy.ndarray:
        """A flat device array from its own cudaMalloc (not the memory pool), freed by
        :meth:`close` (views of it must not be used after that); bfloat16 as uint16 bits."""
        dtype = device_dtype(dtype)
        nbytes = int(size) * dtype.itemsize
        with self._device:
            ptr = cupy.cuda.runtime.malloc(nbytes)
        self._device_ptrs.append(ptr)
        self.device_bytes += nbytes
        mem = cupy.cuda.UnownedMemory(ptr, nbytes, self, self._device.id)
        return cupy.ndarray((int(size),), dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))

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
    def fuses_checks(self) -> bool:
        """Whether gemm takes ``checks`` (bigmm's kernel; cuBLAS's cannot do them)."""
        return self.kernel == "bigmm"

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
            raise OptionError(f"Expected checks= only with kernel='bigmm' and float32 or "
                              f"float64. Got kernel={self.kernel!r}, {name}.")
        alpha, beta, trans_a, trans_b = float(alpha), float(beta), bool(trans_a), bool(trans_b)
        if half:
            def launch(stream) -> None:
                self._gemm_ex(name, a, b, c, m, n, k, alpha, beta, trans_a, trans_b, stream)
        elif self.kernel == "bigmm":
            with self._device:
                launch = self._kernels.prepare_gemm(a, b, c, alpha, beta, trans_a, trans_b,
                                                    split_k=1, checks=checks)
        else:
            def launch(stream) -> None:
                self._cublas(a, b, c, m, n, k, alpha, beta, trans_a, trans_b, stream)
        return self._launcher(launch, f"gemm {m}x{n}x{k}", flops=2 * m * n * k)

    def _cublas(self, a, b, c, m, n, k, alpha, beta, trans_a, trans_b, stream) -> None:
        """Row-major C = op(A) op(B) as column-major C^T = op(B)^T op(A)^T."""
        from cupy_backends.cuda.libs import cublas

        if m == 0 or n == 0:
            return
        h = self._cublas_handle()
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

    def _gemm_ex(self, name, a, b, c, m, n, k, alpha, beta, trans_a, trans_b, stream) -> None:
        """``cublasGemmEx``: row-major C (float32) = op(A) op(B) of half-precision A and B
        (``name``) on tensor cores, accumulated in float32, as column-major C^T = op(B)^T
        op(A)^T."""
        from cupy_backends.cuda.libs import cublas

        if m == 0 or n == 0:
            return
        h = self._cublas_handle()
        scalars = np.array([alpha, beta], dtype=np.float32)  # read during the call (host mode)
        ab, c32 = _CUDA_TYPES[name], _CUDA_TYPES["float32"]
        cublas.setStream(h, stream.ptr)
        with stream:  # cupy's wrappers re-set the handle's stream to the current one
            cublas.gemmEx(h, _OP_T if trans_b else _OP_N, _OP_T if trans_a else _OP_N, n, m, k,
                          scalars.ctypes.data, b.data.ptr, ab, _ld(b), a.data.ptr, ab, _ld(a),
                          scalars.ctypes.data + scalars.itemsize, c.data.ptr, c32, _ld(c),
                          _COMPUTE_32F, _GEMM_DEFAULT)

    #: How the diagonal tiles of Gram plans are updated (:mod:`.cupy_syrk`'s MODES): "split"
    #: (2 x 2 blocks, cuBLAS syrk on the diagonal ones) measured 2% faster than one cuBLAS
    #: ssyrk per 4096^2 step (H100, depth 3584: 1.435 against 1.468 ms), sub-block gemms by
    #: bigmm's kernel 2.3x slower.
    syrk_mode = "split"

    def syrk(self, a, c, alpha: float, beta: float, trans: bool, stream=None) -> None:
        """See :meth:`bigmm.backends.base.Syrk.syrk` (:mod:`.cupy_syrk`)."""
        from .cupy_syrk import syrk

        with self._device:
            syrk(self, self._cublas_handle, a, c, float(alpha), float(beta), bool(trans),
                 stream if stream is not None else cupy.cuda.get_current_stream(),
                 self.syrk_mode)

    def _cublas_handle(self) -> int:
        if self._handle is None:
            from cupy_backends.cuda.libs import cublas

            self._handle = cublas.create()
            cublas.setMathMode(self._handle,
                               _TF32_MATH if self.kernel == "cublas-tf32" else _DEFAULT_MATH)
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

    def epsilon(self, dtype) -> float:
        """The dtype's machine epsilon; 2**-10 for float32 products on TF32 tensor cores
        (inputs rounded to 10 mantissa bits); float32's for half-precision operands (their
        products are exact in float32, and accumulate in it)."""
        if self.kernel == "cublas-tf32" and np.dtype(dtype) == np.float32:
            return 2.0 ** -10
        if str(np.dtype(dtype)) in HALF_DTYPES:
            return float(np.finfo(np.float32).eps)
        return float(np.finfo(dtype).eps)

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
            anchor = cupy.cuda.Event(block=False, disable_timing=False)
            anchor.record(s)
            anchor.synchronize()
            self._anchor = (anchor, time.perf_counter())

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
        """Rates for the predicted time: this kernel's gemm (and its waves of thread blocks),
        pinned host-to-device copies (whole, and pitched in rows of 16 KiB: the cost of a
        row), device memory (a copy within it), allocating pinned memory and page-locking a
        host array in place (and releasing them), measured once per process and size (a
        4096^3 product, a 256 MiB copy in, a 128 MiB copy on the device, 64 MiB pinned and a
        64 MiB array locked, timed with events and the host clock; smaller when ``limit``,
        the bytes the run may hold on the device and in pinned memory, is less, so that
        planning stays within the run's budgets)."""
        item = numpy_dtype(str(dtype)).itemsize
        nbytes = 256 << 20 if limit is None else max(1 << 20, min(256 << 20, int(limit) // 2))
        n = min(4096, math.isqrt(nbytes // item))  # an n^2 operand fits in the copied buffer
        key = (self._device.id, self.kernel, str(dtype), nbytes, n)
        if key not in _RATES:
            _RATES[key] = self._calibrate(numpy_dtype(str(dtype)), nbytes, n)
        return _RATES[key]

    def _calibrate(self, dtype: np.dtype, nbytes: int, n: int) -> Rates:
        with self._device:
            s = cupy.cuda.Stream(non_blocking=True)
            pinned = cupy.cuda.PinnedMemory(nbytes, _HOST_ALLOC_PORTABLE)
            host = np.ndarray((nbytes // dtype.itemsize,), dtype,
                              buffer=cupy.cuda.PinnedMemoryPointer(pinned, 0))
            block = np.random.default_rng(0).standard_normal(1 << 16).astype(dtype)
            host[: host.size - host.size % block.size].reshape(-1, block.size)[:] = block
            host[host.size - host.size % block.size:] = 1.0
            dev = _direct(host.size, dtype)
            c = _direct(n * n, numpy_dtype(accumulate_dtype(str(dtype)))).reshape(n, n)
            t_copy = self._time(lambda: cupy.cuda.runtime.memcpyAsync(
                dev.data.ptr, host.ctypes.data, nbytes, _H2D, s.ptr), s)
            rows = nbytes // (2 * _ROW_BYTES)  # every other row of the buffer, pitched
            t_rows = self._time(lambda: cupy.cuda.runtime.memcpy2DAsync(
                dev.data.ptr, _ROW_BYTES, host.ctypes.data, 2 * _ROW_BYTES, _ROW_BYTES, rows,
                _H2D, s.ptr), s) if rows else 0.0
            half = nbytes // 2
            t_move = self._time(lambda: cupy.cuda.runtime.memcpyAsync(
                dev.data.ptr + half, dev.data.ptr, half, _D2D, s.ptr), s)
            x = dev[: n * n].reshape(n, n)
            t_gemm = self._time(lambda: self.gemm(x, x, c, 1.0, 0.0, False, False, s), s)
        # a product smaller than 4096^3 (a budget under 64 MiB) is too short to tell what
        # a step's C traffic and last wave cost: those terms are left out
        full = n == 4096
        h2d = nbytes / t_copy
        per_row = max(0.0, t_rows - rows * _ROW_BYTES / h2d) / rows if rows else 0.0
        return Rates(flops=2 * n**3 / t_gemm, read_bytes=READ_RATE, write_bytes=WRITE_RATE,
                     h2d_bytes=h2d,
                     memory_bytes=2 * half / t_move if full else None,
                     wave_flops=(self._wave_flops(dtype)
                                 if full and str(dtype) not in HALF_DTYPES else None),
                     per_row=per_row, register_bytes=self._lock_rate(min(nbytes, _LOCK_BYTES)),
                     pin_bytes=self._pin_rate(min(nbytes, _LOCK_BYTES)))

    def _pin_rate(self, nbytes: int) -> float | None:
        """Bytes per second of making a staging block of ``nbytes`` and freeing it, the faster
        of the two ways (:func:`.cupy_pinned.choose`), which later blocks are made."""
        with self._device:
            return choose(nbytes)

    def _lock_rate(self, nbytes: int) -> float | None:
        """See :func:`.cupy_pinned.lock_rate`."""
        with self._device:
            return lock_rate(nbytes)

    def _wave_flops(self, dtype: np.dtype) -> float:
        """Flops per unit of depth of one wave of thread blocks of the own kernel on large
        tiles: blocks per SM times SMs times a block's tile. cuBLAS's kernels are not visible
        and are taken as the same."""
        from . import cuda_kernels

        big = 16384
        cfg = cuda_kernels.select_config(str(dtype), big, big, big)
        sms = cuda_kernels.sm_count_of(self._device.id)
        return 2.0 * cfg.bm * cfg.bn * max(1, cfg.min_blocks) * sms

    @staticmethod
    def _time(fn, stream, repeat: int = 5) -> float:
        """The fastest of ``repeat`` calls, each timed with events, after two untimed ones
        (the kernel compiled; the first copies of a process ran up to 30% slower)."""
        fn()
        fn()
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        best = math.inf
        for _ in range(repeat):
            e0.record(stream)
            fn()
            e1.record(stream)
            e1.synchronize()
            best = min(best, cupy.cuda.get_elapsed_time(e0, e1) / 1e3)
        return max(best, 1e-9)

    def close(self) -> None:
        """Wait for this backend's streams, then free its device buffers (now, not when the
        last view is garbage) and cuBLAS handle; pinned blocks are kept for the next run (or
        freed with ``keep_pinned=False`` once no array uses them). Idempotent."""
        with self._device:
            for s in self._streams:
                s.synchronize()
            if self._handle is not None:
                from cupy_backends.cuda.libs import cublas

                cublas.destroy(self._handle)
                self._handle = None
            for ptr in self._device_ptrs:
                cupy.cuda.runtime.free(ptr)
            for ptr in list(self._registered):  # a run that could not release them
                self.unregister(ptr)
        blocks = [mem for _, _, mem in self._pinned]
        if self.keep_pinned and blocks:
            _PINNED.keep(blocks)
        self._pinned, self._device_ptrs, self._streams = [], [], []
        self._user_pinned = []
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


def device_dtype(dtype) -> np.dtype:
    """The dtype of device arrays holding elements of ``dtype``: uint16 for bfloat16 (its
    bits; cupy has no bfloat16), else ``dtype``."""
    dtype = np.dtype(dtype)
    return np.dtype(np.uint16) if dtype == _BF16 else dtype


def _logical(dtype) -> np.dtype:
    """The element dtype a device array of ``dtype`` holds: bfloat16 for uint16."""
    dtype = np.dtype(dtype)
    return _BF16 if dtype == np.uint16 else dtype


def _direct(size: int, dtype: np.dtype) -> cupy.ndarray:
    """A flat device array with its own cudaMalloc, freed when the last view of it goes."""
    dtype = device_dtype(dtype)
    mem = cupy.cuda.Memory(size * dtype.itemsize)
    return cupy.ndarray((size,), dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))


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
