"""Helpers shared by the tests and the scripts: GPU detection, operands, float64 references,
fault injection (disks that fill up, corrupted values under the checks)."""

from __future__ import annotations

import contextlib
import errno
import functools
import glob
import hashlib
import importlib.util
import mmap
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import Interrupted, OptionError
from .planner import Plan, Step
from .units import HALF_DTYPES, accumulate_dtype, dtype_name


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    """True when cupy imports and sees at least one CUDA device."""
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        from .backends import probe_cuda

        return probe_cuda()
    except Exception:
        return False


def random_matrix(shape, dtype=np.float32, seed=0) -> np.ndarray:
    """Fresh standard-normal data (never zeros) in the given dtype."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape, dtype=np.float64).astype(dtype)


def pinned_array(shape, dtype=np.float32, fill=None) -> np.ndarray:
    """A NumPy array in page-locked host memory (``cupy.cuda.alloc_pinned_memory``; the array
    keeps the block alive), a copy of ``fill`` when given (needs cupy)."""
    import cupy

    dtype = np.dtype(dtype)
    size = int(np.prod(shape))
    mem = cupy.cuda.alloc_pinned_memory(max(size, 1) * dtype.itemsize)
    x = np.frombuffer(mem, dtype, size).reshape(shape)
    if fill is not None:
        x[...] = fill
    return x


def own_pages(x: np.ndarray) -> np.ndarray:
    """A copy of ``x`` on pages of its own (small arrays otherwise share heap pages, and
    page-locking covers whole pages)."""
    page = mmap.PAGESIZE
    raw = np.empty(x.nbytes + 3 * page, np.uint8)
    start = -raw.ctypes.data % page + page
    out = raw[start:start + x.nbytes].view(x.dtype).reshape(x.shape)
    out[...] = x
    return out


def reference_gemm(a, b, *, alpha=1.0, beta=0.0, c=None, trans_a=False, trans_b=False) -> np.ndarray:
    """alpha * op(A) @ op(B) + beta * C in float64."""
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b, dtype=np.float64)
    if trans_a:
        a64 = a64.T
    if trans_b:
        b64 = b64.T
    out = alpha * (a64 @ b64)
    if beta != 0:
        out += beta * np.asarray(c, dtype=np.float64)
    return out


def magnitude(a, b, *, alpha=1.0, beta=0.0, c=None, trans_a=False, trans_b=False) -> np.ndarray:
    """|alpha| |op(A)| |op(B)| + |beta| |C| in float64: the scale a product's rounding error is
    bounded against (each element's error within eps times its terms' magnitudes, however
    much the terms cancel)."""
    return reference_gemm(np.abs(a), np.abs(b), alpha=abs(alpha), beta=abs(beta),
                          c=None if c is None else np.abs(c), trans_a=trans_a, trans_b=trans_b)


def relative_error(out, ref) -> float:
    """||out - ref||_F / ||ref||_F in float64 (inf if out has NaN)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    denom = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (denom if denom else 1.0))


def tolerance(dtype, k: int, out=None) -> float:
    """Relative-error bound (Frobenius norm, against a float64 reference computed from the
    operands as stored) for a product of depth k of ``dtype`` operands, with C in ``out``
    (default: the dtype the products accumulate in).

    float32 and float64: 8 sqrt(k) eps. float16 and bfloat16 accumulate in float32 (their
    products are exact in it), so float32's eps, and k/16 eps more: tensor cores add each
    16-deep block of exact products to the float32 accumulator with truncation rather than
    rounding (Fasi et al. 2021), an error that grows with k, not sqrt(k). A C in a 16-bit dtype
    adds its own rounding, eps_C."""
    name = dtype_name(dtype)
    eps = float(np.finfo(accumulate_dtype(name)).eps)
    bound = eps * 8 * max(1.0, np.sqrt(k)) + (eps * k / 16 if name in HALF_DTYPES else 0.0)
    out = dtype_name(out) if out is not None else accumulate_dtype(name)
    if out != accumulate_dtype(name):
        bound += 2.0 ** -7 if out == "bfloat16" else float(np.finfo(out).eps)
    return float(bound)


def wait_for_journaled_tiles(folder, proc, timeout: float, output: str = "c.h5") -> str:
    """The journal path of ``output`` in ``folder`` once it records finished tiles, while the
    run in subprocess ``proc`` goes on; AssertionError if ``proc`` ends first or ``timeout``
    seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for j in glob.glob(os.path.join(os.fspath(folder), output + ".*journal")):
            if '"tiles"' in open(j).read():
                return j
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("no tile was journaled in time")


# ----- fault injection ------------------------------------------------------------------------

@dataclass
class Faults:
    """Corrupts one value at one point of a run, ``times`` times: a hook of the executor
    (:mod:`bigmm.executor.hooks`, ``execute(..., faults=)``) for tests of the checks.

    ``where="A"`` or ``"B"``: after K panel ``kp`` of tile ``tile`` landed in its buffer (and
    its checksum vector was taken), flip an exponent bit of ``element`` of the stored panel.
    ``where="C"``: flip one of ``element`` of the finished tile ``tile`` before it is checked
    and written back. Elements are clipped to the array's shape. The corruption is issued on
    the run's compute stream (the backend's ``run_on``); ``fired`` records (where, tile, old
    value, new value).
    """

    where: str
    tile: tuple[int, int] = (0, 0)
    kp: int = 0
    element: tuple[int, int] = (0, 0)
    times: int = 1
    fired: list = field(default_factory=list)
    #: The run's backend (set when the run begins).
    backend: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.where not in ("A", "B", "C"):
            raise OptionError(f"Expected where to be 'A', 'B' or 'C'. Got {self.where!r}.")

    # ----- the hook's points ----------------------------------------------------------------
    def begin(self, be, plan: Plan, alpha: float, beta: float) -> None:
        self.backend = be

    def landed(self, st: Step, a, b, stream) -> None:
        with self.backend.run_on(stream):
            self.corrupt_panel(st, a, b)

    def finished(self, st: Step, c, stream) -> None:
        with self.backend.run_on(stream):
            self.corrupt_tile(st, c)

    # ----- the corruptions ------------------------------------------------------------------
    def _due(self, where: str, st: Step) -> bool:
        return (self.where == where and st.tile.index == tuple(self.tile)
                and (where == "C" or st.kp == self.kp) and len(self.fired) < self.times)

    def corrupt_panel(self, st: Step, a, b) -> None:
        for where, x in (("A", a), ("B", b)):
            if self._due(where, st):
                self.fired.append((where, st.tile.index) + flip_exponent(x, self.element))

    def corrupt_tile(self, st: Step, c) -> None:
        if self._due("C", st):
            self.fired.append(("C", st.tile.index) + flip_exponent(c, self.element))


def run_stopped(call, stops, *, resumed: dict, seen=None) -> None:
    """A job run in tries stopped by their progress callbacks: ``call(progress=..., **extra)``
    runs it (``bigmm.matmul`` with its arguments bound), try i stopped (KeyboardInterrupt)
    once ``stops[i]`` tiles of its own are done, each later try with ``resumed`` as extra
    keywords, and a last try without a stop where every try was stopped. ``seen(p)`` is called
    with every Progress first."""
    again: dict = {}
    for stop in stops:
        def progress(p, stop=stop):
            if seen is not None:
                seen(p)
            if p.tiles_done - p.tiles_skipped >= stop:
                raise KeyboardInterrupt
        try:
            call(progress=progress, **again)
        except Interrupted:
            again = resumed
            continue
        return
    call(**again)


def kill_at(owner, name: str, when, before: bool, wrap=lambda f: f) -> None:
    """Make the process SIGKILL itself at a call of ``owner.name`` (a function of the output
    layer, of h5py, of os) for which ``when(*args)`` holds: before the call, or after it
    returned. ``wrap``: how the replacement is set on ``owner`` (``staticmethod`` for a static
    method). For the kill tests' child processes."""
    orig = getattr(owner, name)

    def f(*args, **kwargs):
        if before and when(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)
        result = orig(*args, **kwargs)
        if not before and when(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(owner, name, wrap(f))


def flip_exponent(x, element: tuple[int, int]) -> tuple[float, float]:
    """Flip the highest clear exponent bit of one element of the 2-D array ``x`` (NumPy or a
    device array); returns (old, new). For values of ordinary size this multiplies them by
    2**64 or more, or makes them Inf."""
    i, j = (min(max(int(e), 0), s - 1) for e, s in zip(element, x.shape))
    dt = np.dtype(x.dtype)
    info = np.finfo(dt)
    uint = np.dtype(f"u{dt.itemsize}")
    old = np.array(float(x[i, j]), dtype=dt)
    bits = int(old.view(uint))
    exponent = (bits >> info.nmant) & ((1 << info.nexp) - 1)
    p = next((p for p in range(info.nexp - 1, -1, -1) if not exponent >> p & 1), info.nexp - 1)
    new = np.array(bits ^ (1 << (info.nmant + p)), dtype=uint).view(dt)
    x[i, j] = new[()]
    return float(old), float(new)


def sha256(path) -> str:
    """The SHA-256 of a file's bytes (inputs must be byte-identical after any run)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def evict(path) -> None:
    """Evict one file's pages from the page cache (flushed first, so that they can be
    dropped)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def fail_after(call, n: int, code: int = errno.ENOSPC):
    """``call`` for its first ``n`` uses, then OSError(``code``) on every later one (a disk
    that fills up, or a device that starts failing, after ``n`` operations). ``.calls`` counts
    the uses."""

    @functools.wraps(call)
    def wrapped(*args, **kwargs):
        wrapped.calls += 1
        if wrapped.calls > n:
            raise OSError(code, os.strerror(code))
        return call(*args, **kwargs)

    wrapped.calls = 0
    return wrapped


def mount_prefix() -> list[str] | None:
    """A command prefix running its command in a private mount namespace where it may mount a
    tmpfs (``unshare -m`` as root, ``unshare -rm`` in a user namespace otherwise), or None
    where neither works."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return None
    for prefix in (["unshare", "-m"], ["unshare", "-rm"]):
        if prefix == ["unshare", "-m"] and os.geteuid() != 0:
            continue
        probe = subprocess.run([*prefix, "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt "
                                "|| mount -t tmpfs -o size=64k tmpfs /tmp"],
                               capture_output=True)
        if probe.returncode == 0:
            return prefix
    return None


@contextlib.contextmanager
def small_filesystem(folder, size: int, fstype: str = "tmpfs"):
    """Mount a ``size``-byte file system (``tmpfs``, or ``ext4`` on a loop device) on the new
    directory ``folder`` for the block; raises ``Unavailable`` where this process cannot mount
    (needs root; tests skip then)."""
    folder = os.fspath(folder)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        raise Unavailable("mounting a file system needs root")
    os.makedirs(folder, exist_ok=True)
    if fstype == "tmpfs":
        cmd = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", folder]
    else:
        image = folder.rstrip("/") + ".img"
        with open(image, "wb") as fh:
            fh.truncate(size)
        made = subprocess.run(["mkfs." + fstype, "-q", "-F", image], capture_output=True,
                              text=True)
        if made.returncode:
            raise Unavailable(f"cannot make {fstype}: {made.stderr.strip()}")
        cmd = ["mount", "-o", "loop", image, folder]
    made = subprocess.run(cmd, capture_output=True, text=True)
    if made.returncode:
        raise Unavailable(f"cannot mount {fstype} here: {made.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", folder], check=False)


class Unavailable(RuntimeError):
    """A test facility (a mount, a namespace) is not available on this machine."""


#: Zarr codec settings by name, for :func:`zarr_array` (the layouts bigmm reads directly, and
#: some it reads through zarr-python).
ZARR_CODECS = ("raw", "zstd", "blosc", "gzip", "crc32c", "transpose", "sharded")


def zarr_array(store, data: np.ndarray, *, path: str | None = None, chunks=None,
               codec: str = "raw", endian: str = "little", fill_value=0.0, attributes=None):
    """Write ``data`` as a Zarr v3 array at ``path`` ("" or None: the root) in the local
    ``store`` and return it (a ``zarr.Array``). ``codec``: one of ZARR_CODECS; ``endian``:
    the byte order of the ``bytes`` codec; ``chunks`` default to the whole array."""
    import zarr
    from zarr import codecs

    chunks = tuple(chunks or data.shape)
    kw: dict[str, Any] = dict(compressors=None, filters=None)
    if codec in ("zstd", "blosc", "gzip"):
        kw["compressors"] = [{"zstd": codecs.ZstdCodec(level=1),
                              "blosc": codecs.BloscCodec(cname="lz4", shuffle="shuffle"),
                              "gzip": codecs.GzipCodec(level=1)}[codec]]
    elif codec == "crc32c":
        kw["compressors"] = [codecs.Crc32cCodec()]
    elif codec == "transpose":
        kw["filters"] = [codecs.TransposeCodec(order=(1, 0))]
    elif codec == "sharded":
        kw["shards"] = tuple(2 * c for c in chunks)
    elif codec != "raw":
        raise OptionError(f"Expected codec to be one of {', '.join(ZARR_CODECS)}. Got {codec!r}.")
    arr = zarr.create_array(store=zarr.storage.LocalStore(os.fspath(store)), name=path or None,
                            shape=data.shape, chunks=chunks, dtype=data.dtype,
                            serializer=codecs.BytesCodec(endian=endian), fill_value=fill_value,
                            attributes=attributes or {}, zarr_format=3, overwrite=True, **kw)
    arr[...] = data
    return arr


class NoPool:
    """Stands in for a source's thread pool where no task may be queued (reads that must run
    on the calling thread)."""

    def submit(self, *args, **kwargs):
        raise AssertionError("a task was queued on the source's thread pool")

    def shutdown(self, *args, **kwargs) -> None:
        pass
