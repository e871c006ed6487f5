"""Helpers shared by the tests and the scripts: GPU detection, operands, float64 references."""

from __future__ import annotations

import contextlib
import errno
import functools
import glob
import hashlib
import importlib.util
import os
import shutil
import subprocess
import time

import numpy as np


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


def relative_error(out, ref) -> float:
    """||out - ref||_F / ||ref||_F in float64 (inf if out has NaN)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    denom = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (denom if denom else 1.0))


def tolerance(dtype, k: int) -> float:
    """Relative-error bound for a float product of depth k."""
    eps = np.finfo(dtype).eps
    return float(eps * 8 * max(1.0, np.sqrt(k)))


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

def sha256(path) -> str:
    """The SHA-256 of a file's bytes (inputs must be byte-identical after any run)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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
