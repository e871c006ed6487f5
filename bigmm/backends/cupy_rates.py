"""The cupy backend's calibration: its rates for the planner's time model, measured once per
process, device, kernel, precision and size (or kept from an earlier process on a quiet
machine: :mod:`bigmm.calibration`).

A backend's gemm (its kernel and precision: TF32 tensor cores run several times faster than
IEEE float32 on the CUDA cores), pinned host-to-device copies (whole, both ways at once, and
pitched beside the gemms, as a run's copies are: the cost of a row), device memory (a copy
within it), allocating pinned memory and page-locking a host array in place are each timed
with CUDA events and the host clock.

This module imports cupy at its top: only the cupy backend imports it.
"""

from __future__ import annotations

import dataclasses
import math

import cupy
import numpy as np

from ..calibration import host_quiet, on_measuring, remembered
from ..planner.model import MIN_DUPLEX, READ_RATE, WRITE_RATE, Rates
from ..units import HALF_DTYPES, accumulate_dtype, numpy_dtype
from .base import SplitsPanels
from .cupy_arrays import device_dtype
from . import cupy_pinned
from .cupy_pinned import choose, lock_rate

_H2D, _D2H, _D2D = 1, 2, 3  # cudaMemcpyHostToDevice, DeviceToHost, DeviceToDevice
_HOST_ALLOC_PORTABLE = getattr(cupy.cuda.runtime, "hostAllocPortable", 1)
#: Bytes per row of the pitched copies timed (a 4096-wide float32 panel) and bytes of the host
#: array page-locked and released.
ROW_BYTES, LOCK_BYTES = 16 << 10, 64 << 20
#: What the rates kept by an earlier process must have been measured as (with the copies
#: both ways at once).
MEASURED_AS = "duplex"
#: Device memory other processes may hold while the GPU still counts as quiet for a kept
#: calibration (the driver's own context takes a few hundred MiB).
OTHERS_BYTES = 1 << 30
#: Rows apart of the pitched copy's rows: on an H100, rows of 16 KiB one in two came in at
#: 54 GB/s with gemms running or not; one in four or eight, as a panel's rows in a user's
#: array lie, at 49 alone and 30 beside gemms.
PITCH = 4

_RATES: dict[tuple, Rates] = {}
_SHAPES: dict[tuple, float] = {}
on_measuring(_RATES.clear)  # bigmm calibrate measures them again
on_measuring(_SHAPES.clear)
#: Timed calls of a step's shape (after two untimed ones), and the shapes' rates kept for
#: later processes at most (the newest).
SHAPE_REPEAT, SHAPES_KEPT = 2, 256


def rates(be, dtype: str, limit: int | None = None) -> Rates:
    """Rates of the cupy backend ``be`` for ``dtype`` operands: its gemm (its kernel and
    precision, and the waves of its thread blocks), pinned host-to-device copies (whole, both
    ways at once, and pitched in rows of 16 KiB beside its gemms: the cost of a row), device
    memory (a copy within it), allocating pinned memory and page-locking a host array in place
    (and releasing them), measured once per process and size (a 4096^3 product, 4096 x 4096 x
    16384 for half-precision operands, a 256 MiB copy in, a 128 MiB copy on the device, 256
    MiB pinned (64 MiB by cudaHostAlloc) and a 64 MiB array locked, timed with events and the
    host clock; smaller when ``limit``, the bytes the run may hold on the device and in pinned
    memory, is less, so that planning stays within the run's budgets)."""
    item = numpy_dtype(str(dtype)).itemsize
    nbytes = 256 << 20 if limit is None else max(1 << 20, min(256 << 20, int(limit) // 2))
    n = min(4096, math.isqrt(nbytes // item))  # an n^2 operand fits in the copied buffer
    key = (be.device_id, be.kernel, be.precision, str(dtype), nbytes, n)
    if key not in _RATES:
        # kept between processes (:mod:`bigmm.calibration`) with the way pinned blocks are made
        measured, how = remembered(
            "cupy-rates", [_device_facts(be.device_id), *key[1:], MEASURED_AS],
            lambda: (_calibrate(be, numpy_dtype(str(dtype)), nbytes, n), cupy_pinned.method()),
            quiet=lambda: host_quiet() and gpu_quiet(be.device_id),
            encode=lambda v: {"rates": dataclasses.asdict(v[0]), "pinned": v[1]},
            decode=lambda d: (Rates(**d["rates"]), d["pinned"]))
        cupy_pinned.use(how)
        _RATES[key] = measured
    return _RATES[key]


def shape_flops(be, rows: int, cols: int, depth: int, dtype: str) -> float | None:
    """Flops per second of ``be``'s gemm at one step of a plan, ``rows`` x ``cols`` over
    ``depth`` of ``dtype`` operands, adding into C (beta 1): random normal operands on the
    device, the fastest of SHAPE_REPEAT calls after two (:func:`time_events`); once per
    process, device, kernel, precision and shape, kept between processes as the rates are.
    None where the operands do not fit in the device memory free now."""
    key = (be.device_id, be.kernel, be.precision, str(dtype), rows, cols, depth)
    if key not in _SHAPES:
        item = device_dtype(numpy_dtype(str(dtype))).itemsize
        wc = numpy_dtype(accumulate_dtype(str(dtype))).itemsize
        need = item * depth * (rows + cols) + wc * rows * cols
        with cupy.cuda.Device(be.device_id):
            free, _ = cupy.cuda.runtime.memGetInfo()
        if need > free:
            return None
        _SHAPES[key] = remembered(
            "cupy-shape", [_device_facts(be.device_id), *key[1:]],
            lambda: _time_shape(be, numpy_dtype(str(dtype)), rows, cols, depth),
            quiet=lambda: host_quiet() and gpu_quiet(be.device_id), limit=SHAPES_KEPT)
    return _SHAPES[key]


def _time_shape(be, dtype: np.dtype, rows: int, cols: int, depth: int) -> float:
    with cupy.cuda.Device(be.device_id):
        s = cupy.cuda.Stream(non_blocking=True)
        a = _normal((rows, depth), dtype)
        b = _normal((depth, cols), dtype)
        c = _normal((rows, cols), numpy_dtype(accumulate_dtype(str(dtype))))
        t = time_events(lambda: be.gemm(a, b, c, 1.0, 1.0, False, False, s), s,
                        repeat=SHAPE_REPEAT)
    return 2.0 * rows * cols * depth / t


def _normal(shape: tuple, dtype: np.dtype, block: int = 1 << 16) -> cupy.ndarray:
    """A device array of its own allocation (:func:`_direct`) holding a block of random
    normal values of ``dtype`` over and over, as the backend holds ``dtype`` (bfloat16 as
    its uint16 bits)."""
    size = shape[0] * shape[1]
    host = np.random.default_rng(0).standard_normal(min(block, size)).astype(np.float32)
    host = ((host.view(np.uint32) >> 16).astype(np.uint16) if str(dtype) == "bfloat16"
            else host.astype(dtype))
    x = _direct(host.size, dtype)  # nothing from cupy's memory pool
    x.set(host)
    flat = _direct(size, dtype)
    whole = size - size % x.size
    flat[:whole].reshape(-1, x.size)[:] = x
    flat[whole:] = x[:size - whole]
    return flat.reshape(shape)


def _device_facts(device_id: int) -> list:
    """What identifies the GPU and its software: name, PCI bus, memory, driver, runtime."""
    p = cupy.cuda.runtime.getDeviceProperties(device_id)
    name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
    return [name, p.get("pciBusID"), p.get("pciDeviceID"), p.get("totalGlobalMem"),
            cupy.cuda.runtime.driverGetVersion(), cupy.cuda.runtime.runtimeGetVersion()]


def gpu_quiet(device_id: int) -> bool:
    """Whether other processes hold at most OTHERS_BYTES of the GPU's memory (what is in
    use beyond this process's memory pool)."""
    with cupy.cuda.Device(device_id):
        free, total = cupy.cuda.runtime.memGetInfo()
        ours = cupy.get_default_memory_pool().total_bytes()
    return total - free - ours <= OTHERS_BYTES


def _calibrate(be, dtype: np.dtype, nbytes: int, n: int) -> Rates:
    with cupy.cuda.Device(be.device_id):
        s = cupy.cuda.Stream(non_blocking=True)
        pinned = cupy.cuda.PinnedMemory(nbytes, _HOST_ALLOC_PORTABLE)
        host = np.ndarray((nbytes // dtype.itemsize,), dtype,
                          buffer=cupy.cuda.PinnedMemoryPointer(pinned, 0))
        block = np.random.default_rng(0).standard_normal(1 << 16).astype(dtype)
        host[: host.size - host.size % block.size].reshape(-1, block.size)[:] = block
        host[host.size - host.size % block.size:] = 1.0
        dev = _direct(host.size, dtype)
        c = _direct(n * n, numpy_dtype(accumulate_dtype(str(dtype)))).reshape(n, n)
        t_copy = time_events(lambda: cupy.cuda.runtime.memcpyAsync(
            dev.data.ptr, host.ctypes.data, nbytes, _H2D, s.ptr), s)
        half = nbytes // 2
        t_move = time_events(lambda: cupy.cuda.runtime.memcpyAsync(
            dev.data.ptr + half, dev.data.ptr, half, _D2D, s.ptr), s)
        x = dev[: n * n].reshape(n, n)
        depth = n * deep_factor(dtype, host.size, n)
        xa, xb = dev[: n * depth].reshape(n, depth), dev[-depth * n:].reshape(depth, n)
        t_gemm = time_events(lambda: be.gemm(xa, xb, c, 1.0, 0.0, False, False, s), s)
        duplex = _duplex(host, dev, nbytes, s)
        rows = nbytes // (PITCH * ROW_BYTES)  # one row in PITCH of the buffer's
        # a copy's own start cost apart: the slope between copies of all and half the rows
        t_rows = _pitched_slope(be, host, rows, t_gemm, (xa, xb, c), s) if rows >= 2 else 0.0
        # a gemm that splits large products ahead: also a product too small for it (plain
        # TF32 reads both operands of this one and of the product above as stored)
        narrow = n // 4 if isinstance(be, SplitsPanels) and be.split_parts else 0
        t_unsplit = time_events(lambda: be.gemm(x[:narrow], x, c[:narrow], 1.0, 0.0, False,
                                                False, s), s) if narrow else 0.0
        # the faster way (later blocks are made so), at the copy's size: a run's blocks are
        # larger, and a small block's fixed costs would read as a slower rate
        pin = choose(nbytes)
        lock = lock_rate(min(nbytes, LOCK_BYTES))
    # a product smaller than 4096^3 (a budget under 64 MiB) is too short to tell what
    # a step's C traffic and last wave cost: those terms are left out
    full = n == 4096
    h2d = nbytes / t_copy
    more = rows - rows // 2
    per_row = max(0.0, t_rows - more * ROW_BYTES / h2d) / more if rows >= 2 else 0.0
    return Rates(flops=2 * n * n * depth / t_gemm, read_bytes=READ_RATE, write_bytes=WRITE_RATE,
                 h2d_bytes=h2d, duplex=duplex,
                 memory_bytes=2 * half / t_move if full else None,
                 wave_flops=(wave_flops(be, dtype)
                             if full and str(dtype) not in HALF_DTYPES else None),
                 per_row=per_row, register_bytes=lock, pin_bytes=pin,
                 unsplit_flops=2 * narrow * n * n / t_unsplit if narrow else None)


def _pitched_slope(be, host: np.ndarray, rows: int, t_gemm: float, gemm_args, s) -> float:
    """Seconds a pitched copy of ``rows`` rows of ROW_BYTES (one in PITCH of ``host``'s) takes
    beyond one of half as many, while the backend's gemms run on another stream, as a run's
    copies in do (see PITCH): the rows' cost without the copy's own start."""
    dst = _direct(rows * ROW_BYTES // host.itemsize, host.dtype)
    pitch = PITCH * ROW_BYTES
    other = cupy.cuda.Stream(non_blocking=True)

    def pitched(count: int) -> None:
        cupy.cuda.runtime.memcpy2DAsync(dst.data.ptr, ROW_BYTES, host.ctypes.data, pitch,
                                        ROW_BYTES, count, _H2D, s.ptr)

    alone = time_events(lambda: pitched(rows), s, repeat=2)
    gemms = min(64, 2 + math.ceil(1.5 * alone / t_gemm))  # outlasting the copy

    def beside(count: int) -> None:
        for _ in range(gemms):
            be.gemm(*gemm_args, 1.0, 0.0, False, False, other)
        pitched(count)

    try:
        return (time_events(lambda: beside(rows), s)
                - time_events(lambda: beside(rows // 2), s))
    finally:
        other.synchronize()


def _duplex(host: np.ndarray, dev: cupy.ndarray, nbytes: int, s) -> float:
    """The share of its one-way time a pinned copy keeps while a copy of as many bytes runs
    the other way at once (half of ``host`` in, the other half out on a second stream): the
    slower alone over both at once, at most 1 and at least MIN_DUPLEX."""
    half = nbytes // 2
    other = cupy.cuda.Stream(non_blocking=True)
    rt = cupy.cuda.runtime

    def copies(up: bool, down: bool) -> None:
        start = cupy.cuda.Event()
        start.record(s)
        other.wait_event(start)
        if up:
            rt.memcpyAsync(dev.data.ptr, host.ctypes.data, half, _H2D, s.ptr)
        if down:
            rt.memcpyAsync(host.ctypes.data + half, dev.data.ptr + half, half, _D2H, other.ptr)
        done = cupy.cuda.Event()
        done.record(other)
        s.wait_event(done)

    alone = max(time_events(lambda: copies(True, False), s),
                time_events(lambda: copies(False, True), s))
    both = time_events(lambda: copies(True, True), s)
    return max(MIN_DUPLEX, min(1.0, alone / both))


def deep_factor(dtype: np.dtype, elements: int, n: int) -> int:
    """How many times n deep the timed product is: 4 for half-precision operands where
    ``elements`` hold both n x 4n operands, else 1. A 4096^3 half-precision product lasts a
    fifth of a millisecond on tensor cores, and its start and last wave weigh more there than
    in the deep steps of the planner's tiles (see BENCHMARKS.md)."""
    return 4 if str(dtype) in HALF_DTYPES and 2 * 4 * n * n <= elements else 1


def wave_flops(be, dtype: np.dtype) -> float:
    """Flops per unit of depth of one wave of thread blocks of the own kernel on large tiles
    (of ``be``'s precision for float32): blocks per SM times SMs times a block's tile.
    cuBLAS's kernels are not visible and are taken as the same."""
    from . import cuda_kernels

    big = 16384
    precision = be.precision if str(dtype) == "float32" else None
    with cupy.cuda.Device(be.device_id):
        cfg = cuda_kernels.select_config(str(dtype), big, big, big, precision=precision)
    sms = cuda_kernels.sm_count_of(be.device_id)
    return 2.0 * cfg.bm * cfg.bn * max(1, cfg.min_blocks) * sms


def time_events(fn, stream, repeat: int = 5) -> float:
    """The fastest of ``repeat`` calls, each timed with events, after two untimed ones (the
    kernel compiled; the first copies of a process ran up to 30% slower)."""
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


def _direct(size: int, dtype: np.dtype) -> cupy.ndarray:
    """A flat device array with its own cudaMalloc, freed when the last view of it goes."""
    dtype = device_dtype(dtype)
    mem = cupy.cuda.Memory(size * dtype.itemsize)
    return cupy.ndarray((size,), dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))
