"""Storage measurements for ``bench_e2e.py``: the disk's floor for an HDF5 job, cold caches,
and a job run in a cgroup whose memory limit is far below its data.

The storage floor is the least time this disk needs to read the inputs once and write C once,
measured in the run that times bigmm, by several ways of doing it; the floor is the fastest:

* ``sequential``: read the inputs (buffered, ``threads`` threads, ``REQUEST`` bytes per call),
  then write C (buffered ``pwrite`` into a file reserved with ``posix_fallocate``, as bigmm
  reserves its output) and ``fdatasync``;
* ``buffered``: the same reads and writes at once (reads on their threads, writes on theirs),
  each write's write-back started at once (``sync_file_range``), one ``fdatasync`` at the end;
* ``direct``: at once, reads and writes with ``O_DIRECT`` from page-aligned buffers;
* ``mixed``: at once, buffered reads and ``O_DIRECT`` writes (what bigmm does).

Warm (the inputs in the page cache), the reads are always buffered. Cold means the inputs'
pages dropped: ``/proc/sys/vm/drop_caches`` where writable (root), else ``posix_fadvise
(DONTNEED)`` on the files after an fsync.

``bounded_run`` runs a command in a new cgroup v2 with ``memory.max`` set (page-cache pages
count against it), samples the cgroup's memory (``memory.current``, and ``anon`` and ``file``
of ``memory.stat``) and reports their peaks with the kernel's own ``memory.peak``, and the
bytes its processes read and wrote (``io.stat``: what the disk saw, read-ahead included).
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import mmap
import os
import subprocess
import threading
import time

import numpy as np

from bigmm.testing import evict

REQUEST = 16 << 20
ALIGN = 4096
CGROUP_ROOT = "/sys/fs/cgroup"
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]


def drop_caches(*paths) -> str:
    """Evict the files' pages (and, where allowed, the whole page cache); says how."""
    for p in paths:
        evict(p)
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return "drop_caches"
    except OSError:
        return "fadvise"


def aligned(nbytes: int) -> np.ndarray:
    """A page-aligned uint8 buffer of ``nbytes`` (anonymous memory)."""
    return np.frombuffer(mmap.mmap(-1, max(ALIGN, nbytes)), np.uint8)[:nbytes]


def warm(paths, threads: int) -> None:
    """Read the files once through the page cache."""
    read_files(paths, threads, direct=False)


def read_files(paths, threads: int, direct: bool) -> float:
    """Read every byte of the files, ``REQUEST`` bytes per call on ``threads`` threads;
    seconds."""
    jobs = []
    fds = []
    for p in paths:
        fd = os.open(p, os.O_RDONLY | (os.O_DIRECT if direct else 0))
        fds.append(fd)
        size = os.fstat(fd).st_size
        jobs += [(fd, off, min(REQUEST, size - off)) for off in range(0, size, REQUEST)]
    local = threading.local()

    def one(job):
        fd, off, n = job
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = aligned(REQUEST)
        want = -(-n // ALIGN) * ALIGN if direct else n  # O_DIRECT: whole blocks (EOF stops it)
        got = os.preadv(fd, [memoryview(buf)[:want]], off)
        if got < n:
            raise OSError(f"short read at {off}: {got} of {n}")

    t0 = time.perf_counter()
    try:
        with cf.ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, jobs))
    finally:
        for fd in fds:
            os.close(fd)
    return time.perf_counter() - t0


def write_file(path, data: np.ndarray, threads: int, direct: bool) -> float:
    """Write ``data`` (page-aligned uint8) to a new file reserved with ``posix_fallocate``,
    ``REQUEST`` bytes per call on ``threads`` threads (buffered: each call's write-back
    started at once), then ``fdatasync``; seconds, reservation included."""
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    dfd = None
    try:
        os.posix_fallocate(fd, 0, data.size)
        dfd = os.open(path, os.O_WRONLY | os.O_DIRECT) if direct else None

        def one(off):
            part = data[off:off + REQUEST]
            if direct and len(part) % ALIGN:  # the last partial block through the cache
                whole = len(part) // ALIGN * ALIGN
                os.pwrite(dfd, part[:whole], off)
                os.pwrite(fd, part[whole:], off + whole)
                return
            os.pwrite(dfd if direct else fd, part, off)
            if not direct:
                _LIBC.sync_file_range(fd, off, len(part), 2)  # SYNC_FILE_RANGE_WRITE

        with cf.ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(0, data.size, REQUEST)))
        os.fdatasync(fd)
    finally:
        if dfd is not None:
            os.close(dfd)
        os.close(fd)
    return time.perf_counter() - t0


#: name, reads, writes, at once (see the module docstring)
VARIANTS = {
    "sequential": ("buffered", "buffered", False),
    "buffered": ("buffered", "buffered", True),
    "direct": ("direct", "direct", True),
    "mixed": ("buffered", "direct", True),
}


def floor_variant(inputs, c_path, c_data, threads: int, name: str, cache: str) -> dict:
    """Time one way of reading the inputs and writing C: seconds to the end of both, and
    when the reads and the write each ended (from the start)."""
    reads, writes, together = VARIANTS[name]
    direct_reads = reads == "direct" and cache == "cold"
    t0 = time.perf_counter()
    if together:
        half = max(1, threads // 2)
        with cf.ThreadPoolExecutor(2) as pool:
            r = pool.submit(lambda: (read_files(inputs, half, direct_reads),
                                     time.perf_counter() - t0))
            w = pool.submit(lambda: (write_file(c_path, c_data, half, writes == "direct"),
                                     time.perf_counter() - t0))
            read_end, write_end = r.result()[1], w.result()[1]
    else:
        read_files(inputs, threads, direct_reads)
        read_end = time.perf_counter() - t0
        write_file(c_path, c_data, threads, writes == "direct")
        write_end = time.perf_counter() - t0
    os.unlink(c_path)
    nread = sum(os.path.getsize(p) for p in inputs)
    return {"seconds": max(read_end, write_end), "read_end": read_end, "write_end": write_end,
            "read_gbps": nread / read_end / 1e9,
            "write_gbps": c_data.size / (write_end - (read_end if not together else 0)) / 1e9}


def storage_floor(inputs, c_data, folder, threads: int, log,
                  cold=("sequential", "buffered", "direct", "mixed"),
                  warm_variants=("buffered", "mixed")) -> dict:
    """Every variant cold, then the warm ones; the floor of each cache state is the fastest."""
    out = {"variants": {}, "request_bytes": REQUEST, "threads": threads}
    c_path = os.path.join(folder, "floor_c.bin")
    for cache, names in (("cold", cold), ("warm", warm_variants)):
        for name in names:
            if cache == "cold":
                out["cold_by"] = drop_caches(*inputs)
            else:
                warm(inputs, threads)
            v = floor_variant(inputs, c_path, c_data, threads, name, cache)
            out["variants"][f"{cache}_{name}"] = v
            log(f"storage floor {cache:4s} {name:10s}: {v['seconds']:6.2f} s (reads end "
                f"{v['read_end']:.2f} s, {v['read_gbps']:.2f} GB/s; write ends "
                f"{v['write_end']:.2f} s, {v['write_gbps']:.2f} GB/s)")
        best = min((k for k in out["variants"] if k.startswith(cache + "_")),
                   key=lambda k: out["variants"][k]["seconds"])
        out[f"floor_{cache}_seconds"] = out["variants"][best]["seconds"]
        out[f"floor_{cache}_by"] = best.split("_", 1)[1]
    return out


# ----- cgroup v2 ------------------------------------------------------------------------------

def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def make_cgroup(name: str, limit: int) -> str:
    """A new cgroup under the root of the cgroup v2 tree with ``memory.max`` = ``limit``
    (the memory controller enabled for the root's children first, where it is not); OSError
    with the reason where that cannot be."""
    if "memory" not in _read(f"{CGROUP_ROOT}/cgroup.controllers").split():
        raise OSError("no memory controller in cgroup v2 here")
    if "memory" not in _read(f"{CGROUP_ROOT}/cgroup.subtree_control").split():
        _write(f"{CGROUP_ROOT}/cgroup.subtree_control", "+memory")
    path = f"{CGROUP_ROOT}/{name}"
    os.mkdir(path)
    try:
        _write(f"{path}/memory.max", str(int(limit)))
        if os.path.exists(f"{path}/memory.swap.max"):
            _write(f"{path}/memory.swap.max", "0")
    except OSError:
        os.rmdir(path)
        raise
    return path


def _stat(path: str) -> dict:
    out = {}
    for line in _read(f"{path}/memory.stat").splitlines():
        key, value = line.split()
        out[key] = int(value)
    return out


def bounded_run(cmd: list[str], limit: int, env=None, timeout: float = 600) -> dict:
    """Run ``cmd`` in a new cgroup with ``memory.max`` = ``limit``; its exit status, output,
    seconds, and the cgroup's peaks: total (``memory.peak``, else the sampled
    ``memory.current``), anonymous and page-cache memory (sampled every 20 ms), and whether
    it met the limit (``memory.events`` max/oom counts)."""
    cg = make_cgroup(f"bigmm-bench-{os.getpid()}", limit)
    peaks = {"current": 0, "anon": 0, "file": 0}
    done = threading.Event()

    def sample():
        while not done.is_set():
            try:
                peaks["current"] = max(peaks["current"], int(_read(f"{cg}/memory.current")))
                st = _stat(cg)
                peaks["anon"] = max(peaks["anon"], st.get("anon", 0))
                peaks["file"] = max(peaks["file"], st.get("file", 0))
            except OSError:
                pass
            done.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                              preexec_fn=lambda: _write(f"{cg}/cgroup.procs", str(os.getpid())))
        seconds = time.perf_counter() - t0
        done.set()
        sampler.join()
        events = dict(line.split() for line in _read(f"{cg}/memory.events").splitlines())
        io = _io_stat(cg)
        peak = int(_read(f"{cg}/memory.peak")) if os.path.exists(f"{cg}/memory.peak") else None
    finally:
        done.set()
        for _ in range(50):  # the cgroup empties once its processes are reaped
            try:
                os.rmdir(cg)
                break
            except OSError:
                time.sleep(0.1)
    return {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr[-4000:],
            "seconds": seconds, "limit": limit, "peak": peak if peak is not None
            else peaks["current"], "peak_sampled": peaks["current"],
            "peak_anon": peaks["anon"], "peak_file": peaks["file"],
            "events": {k: int(v) for k, v in events.items()}, "io": io}


def _io_stat(path: str) -> dict:
    """Bytes read and written by the cgroup's processes, summed over devices (io.stat)."""
    out = {"rbytes": 0, "wbytes": 0}
    try:
        text = _read(f"{path}/io.stat")
    except OSError:
        return out
    for line in text.splitlines():
        for field in line.split()[1:]:
            key, _, value = field.partition("=")
            if key in out:
                out[key] += int(value)
    return out
