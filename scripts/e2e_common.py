"""Helpers of ``bench_e2e.py`` and its parts: data, the reference product, GPU timing."""

from __future__ import annotations

import concurrent.futures as cf
import os
import time
from pathlib import Path

import h5py
import numpy as np

from bigmm import io as bio
from bigmm.testing import tolerance

F32 = np.float32


def log(*a) -> None:
    print(*a, flush=True)


# ----- data ---------------------------------------------------------------------------------

def random_f32(n: int, seed: int, threads: int) -> np.ndarray:
    """Standard-normal float32 n x n, filled by ``threads`` generators in parallel."""
    out = np.empty((n, n), F32)
    edges = np.linspace(0, n, threads + 1).astype(int)

    def fill(i):
        rng = np.random.default_rng([seed, i])
        rng.standard_normal(out=out[edges[i]:edges[i + 1]], dtype=F32)

    with cf.ThreadPoolExecutor(threads) as pool:
        list(pool.map(fill, range(threads)))
    return out


def fsync(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_h5(path: Path, name: str, x: np.ndarray, chunk: int | None = None) -> str:
    """x as a dataset: contiguous, or chunked chunk x chunk (unfiltered); fsynced."""
    with h5py.File(path, "w") as f:
        d = f.create_dataset(name, shape=x.shape, dtype=x.dtype,
                             chunks=(chunk, chunk) if chunk else None)
        step = chunk or max(1, (256 << 20) // (x.shape[1] * x.itemsize))  # whole chunk rows
        for r in range(0, x.shape[0], step):
            d[r:r + step] = x[r:r + step]
    fsync(path)
    return f"{path}:/{name}"


def read_all(spec: str, buf: np.ndarray) -> None:
    """Read a whole dataset with bigmm's parallel reader, in row blocks of about 512 MiB."""
    src = bio.open_input(spec)
    try:
        m, n = src.shape
        step = max(1, (512 << 20) // (n * 4))
        for r in range(0, m, step):
            r1 = min(m, r + step)
            src.read(r, r1, 0, n, buf[r:r1])
    finally:
        src.close()


# ----- checks -------------------------------------------------------------------------------

class Reference:
    """The in-core cuBLAS product on the device, itself checked by float64 probes."""

    def __init__(self, a_d, b_d, c_d, n: int):
        import cupy

        self.c, self.n = c_d, n
        self.tol = tolerance(F32, n)
        self.norm = float(cupy.linalg.norm(c_d))
        rng = cupy.random.default_rng(1)
        errs = []
        for _ in range(2):
            x = rng.standard_normal(n, dtype=np.float64)
            bx = b_d.astype(np.float64) @ x
            abx = a_d.astype(np.float64) @ bx
            cx = c_d.astype(np.float64) @ x
            errs.append(float(cupy.linalg.norm(cx - abx) / cupy.linalg.norm(abx)))
            del bx, abx, cx
        self.probe_error = max(errs)
        cupy.get_default_memory_pool().free_all_blocks()
        assert self.probe_error <= self.tol, f"reference fails its probes: {errs}"

    def error(self, c) -> float:
        """||c - ref||_F / ||ref||_F for a host or device array (inf when NaN)."""
        import cupy

        d = cupy.asarray(c)
        err = float(cupy.linalg.norm(d - self.c)) / self.norm
        del d
        cupy.get_default_memory_pool().free_all_blocks()
        return err if np.isfinite(err) else float("inf")

    def check(self, c, what: str) -> float:
        err = self.error(c)
        if not err <= self.tol:
            raise AssertionError(f"{what}: relative error {err:.3e} > {self.tol:.1e}")
        return err


# ----- timing -------------------------------------------------------------------------------

def time_events(fn, stream, repeat: int) -> float:
    """Median seconds of fn() on ``stream``, CUDA events, after one warm-up call."""
    import cupy

    fn()
    stream.synchronize()
    times = []
    for _ in range(repeat):
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        e0.record(stream)
        fn()
        e1.record(stream)
        e1.synchronize()
        times.append(cupy.cuda.get_elapsed_time(e0, e1) / 1e3)
    return float(np.median(times))


_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}
"""


def time_gpu(fn, stream, repeat: int, calls: int = 10, hold: float = 5e-3) -> tuple[float, float]:
    """(median GPU seconds, median host issue seconds) of one fn() call: ``calls`` calls are
    queued behind a kernel that holds the stream for ``hold`` seconds, so the events time the
    device work alone, back to back, without the host's issue time between calls (which the
    executor overlaps with the previous gemm). One warm-up call first."""
    import cupy

    spin = cupy.RawKernel(_SPIN, "spin")
    khz = cupy.cuda.Device().attributes["ClockRate"]
    fn()
    stream.synchronize()
    gpu, host = [], []
    for _ in range(repeat):
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        with stream:
            spin((1,), (1,), (np.int64(hold * khz * 1e3),))
        e0.record(stream)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host.append((time.perf_counter() - t0) / calls)
        e1.record(stream)
        e1.synchronize()
        gpu.append(cupy.cuda.get_elapsed_time(e0, e1) / 1e3 / calls)
    return float(np.median(gpu)), float(np.median(host))


def tflops(n: int, seconds: float) -> float:
    return 2.0 * n**3 / seconds / 1e12
