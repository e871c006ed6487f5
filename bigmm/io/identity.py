"""What identifies an operand's data, and where in memory or on disk an operand lies.

:func:`describe` records, for an opened input (or old C), what a resumed run compares before it
keeps the finished tiles of an interrupted one: the file (device, inode, size, modification
time), the HDF5 object (its address in the file), its storage (shape, dtype, layout: the offset
of contiguous storage or a hash of the chunk index) and a content fingerprint, a hash of
sampled blocks (:func:`fingerprint`). :func:`differences` names what changed. Identity is by
file and object, never by spelling: a relative path, a symlink or a hard link to the same file
is the same operand.

:func:`footprint` says where an operand's bytes lie (HDF5 objects by file and address, arrays by
the file ranges their memory maps, through ``/proc/self/maps``), so that an output that is an
input by any route is refused (:func:`overlaps`).
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..errors import OutputIsInputError
from ..units import format_time_ns

#: The fingerprint samples about this share of an operand's bytes, at least SAMPLE_MIN and at
#: most SAMPLE_MAX; operands up to SAMPLE_WHOLE bytes are hashed whole.
SAMPLE_SHARE = 1 / 4096
SAMPLE_MIN, SAMPLE_MAX, SAMPLE_WHOLE = 64 << 10, 4 << 20, 256 << 10
#: Bytes per block (in the hash's order) where a fingerprint hashes all of an operand.
WHOLE_BLOCK = 16 << 20
#: Bytes read into one buffer at a time, rows of a block in order (of an input decoding
#: chunks: the block, each of its chunks decoded once), so the hash holds no more memory.
PIECE = 1 << 20
#: Elements per sampled row segment of an unchunked operand.
SEGMENT = 8192


# ----- identity of the data ---------------------------------------------------------------------

def file_facts(path: str) -> dict:
    """Device, inode, size, modification time of the file at ``path``, and its change time
    with what else changes it (:func:`status`)."""
    st = os.stat(path)
    return {"dev": st.st_dev, "ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            **status([st])}


def status(stats) -> dict:
    """The latest change time (ctime) of files ``stats`` (os.stat results), and their modes,
    owners and link counts, whose changes also move it. A write sets ctime to the time of the
    write even where the modification time is put back afterwards (``os.utime``, ``touch
    -d``), so that an edit in place is seen where the file's size and time are not."""
    meta = ";".join(f"{st.st_mode}:{st.st_uid}:{st.st_gid}:{st.st_nlink}" for st in stats)
    if len(stats) > 1:
        meta = hashlib.blake2b(meta.encode(), digest_size=16).hexdigest()
    return {"ctime_ns": max((st.st_ctime_ns for st in stats), default=0), "meta": meta}


def describe(src, *, volatile: bool = False) -> dict:
    """The identity record of an opened Source (JSON-able). ``volatile``: its file is written by
    the run (the output's file), so its size and modification time are not compared, and its
    fingerprint hashes all of it (a sample would miss an element changed in place)."""
    rec = {"label": src.label, "shape": list(src.shape), "dtype": _dtype_key(src.dtype),
           "fingerprint": fingerprint(src, whole=volatile)}
    where = src.where()
    if where is not None:
        rec.update(file=dict(where["file"], path=where["path"]), object=where["object"],
                   storage=where["storage"], volatile=bool(volatile))
        if where.get("data"):  # other files holding its data (external, virtual sources)
            rec["data"] = [dict(f) for f in where["data"]]
    return rec


def same_data(a, b) -> bool:
    """Whether two opened Sources are one operand's data: the same object, NumPy arrays over
    the same memory with the same shape, strides and dtype, or the same stored object in the
    same file (by device, inode and object, never by spelling)."""
    if a is b:
        return True
    x, y = getattr(a, "array", None), getattr(b, "array", None)
    if isinstance(x, np.ndarray) and isinstance(y, np.ndarray):
        return (x is y or (x.__array_interface__["data"][0] == y.__array_interface__["data"][0]
                           and x.shape == y.shape and x.strides == y.strides
                           and x.dtype == y.dtype))
    wa, wb = a.where(), b.where()
    if wa is None or wb is None:
        return False
    return ((wa["file"]["dev"], wa["file"]["ino"], wa["object"])
            == (wb["file"]["dev"], wb["file"]["ino"], wb["object"]))


def differences(recorded: dict, now: dict, *, volatile: bool = False) -> list[str]:
    """What differs between two identity records of one operand (empty: the same data)."""
    out = []
    rf, nf = recorded.get("file"), now.get("file")
    if (rf is None) != (nf is None):
        return ["another kind of operand (a file and an array)"]
    if rf is not None:
        if (rf["dev"], rf["ino"]) != (nf["dev"], nf["ino"]):
            return [f"another file at '{nf['path']}' (device {nf['dev']}, inode {nf['ino']}; "
                    f"the run read device {rf['dev']}, inode {rf['ino']}: replaced?)"]
        skip = volatile or recorded.get("volatile") or now.get("volatile")
        if not skip:
            out += _file_changes(rf, nf, "a file")
        rd, nd = recorded.get("data"), now.get("data")
        if rd is not None and nd is not None:  # (journals of older bigmm record none)
            if [(f["dev"], f["ino"]) for f in rd] != [(f["dev"], f["ino"]) for f in nd]:
                out.append(f"other files holding its data ({', '.join(_paths(nd))}; the run "
                           f"read {', '.join(_paths(rd))})")
            elif not skip:
                for r, n in zip(rd, nd):
                    out += _file_changes(r, n, f"its data file '{n['path']}'")
        if recorded.get("object") != now.get("object"):
            out.append(f"another object at that name (address {now.get('object')}, was "
                       f"{recorded.get('object')}: recreated?)")
    for key, what in (("shape", "shape"), ("dtype", "dtype")):
        if recorded.get(key) != now.get(key):
            out.append(f"{what} {now.get(key)} (was {recorded.get(key)})")
    if rf is not None and recorded.get("storage") != now.get("storage"):
        out.append(f"its storage moved ({_storage(now['storage'])}, was "
                   f"{_storage(recorded['storage'])})")
    if recorded.get("fingerprint") != now.get("fingerprint"):
        what = "all its data" if now.get("volatile") else "the sampled blocks"
        out.append(f"different contents (the hash of {what} differs)")
    return out


def _file_changes(rf: dict, nf: dict, what: str) -> list[str]:
    """How the file facts ``nf`` differ from those a run recorded, ``rf``, in words."""
    if (rf["size"], rf["mtime_ns"]) != (nf["size"], nf["mtime_ns"]):
        return [f"{what} modified at {format_time_ns(nf['mtime_ns'])} (size {nf['size']}); "
                f"the run read it as modified at {format_time_ns(rf['mtime_ns'])} "
                f"(size {rf['size']})"]
    # only where both record it, and modes, owners and links stayed (a chmod or a new hard
    # link moves the change time too)
    if ("ctime_ns" in rf and "ctime_ns" in nf and rf.get("meta") == nf.get("meta")
            and rf["ctime_ns"] != nf["ctime_ns"]):
        return [f"{what} changed at {format_time_ns(nf['ctime_ns'])}, after the run read it "
                f"(changed at {format_time_ns(rf['ctime_ns'])}) with its size and modification "
                f"time kept (written in place with its time put back, or renamed)"]
    return []


def _paths(files: list[dict]) -> list[str]:
    return [f"'{f['path']}'" for f in files]


def _storage(s: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(s.items()))


def fingerprint(src, whole: bool = False) -> str:
    """A hash of sampled blocks of ``src`` (all of it when small, or ``whole``), read through
    ``src.read``.

    Chunked operands are sampled by whole chunks (or their first rows), evenly spread through
    the chunk grid; others by row segments spread over rows and columns. The samples always
    hold the first and the last element."""
    m, n = src.shape
    dt = np.dtype(src.dtype)
    total = m * n * dt.itemsize
    h = _fingerprint_hash(src.shape, dt)
    regions = (_blocks(m, n, dt.itemsize) if whole and total > SAMPLE_WHOLE
               else sample_regions(src.shape, dt.itemsize, src.chunks, total))
    piece = WHOLE_BLOCK if getattr(src, "decode_bytes", 0) else PIECE
    flat = None
    for r0, r1, c0, c1 in regions:
        for p0, p1, q0, q1 in _pieces(r0, r1, c0, c1, dt.itemsize, piece):
            size = (p1 - p0) * (q1 - q0)
            if flat is None or flat.size < size:
                flat = None  # the one buffer, grown in place of the last
                flat = np.empty(size, dt)
            buf = flat[:size].reshape(p1 - p0, q1 - q0)
            src.read(p0, p1, q0, q1, buf)
            _hash_values(h, buf)
    return h.hexdigest()


def _fingerprint_hash(shape, dtype):
    m, n = shape
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{m}x{n}:{np.dtype(dtype).str}".encode())
    return h


def _hash_values(h, buf: np.ndarray) -> None:
    """Feed ``buf``'s elements to ``h`` in row-major order, little-endian."""
    if buf.dtype.kind != "f":  # bfloat16 (native, as NumPy holds it): its bits, little-endian
        buf = buf.view(f"=u{buf.dtype.itemsize}")
    h.update(np.ascontiguousarray(buf, dtype=buf.dtype.newbyteorder("<")))


class WrittenFingerprint:
    """The :func:`fingerprint` of an output taken from its tiles as they are written, so that
    a finished output need not be read back: :meth:`add` keeps the elements of the sampled
    regions a write holds (from any thread); :meth:`digest` is the fingerprint where every
    sampled element was written through :meth:`add`, else None (tiles an earlier run or
    another process wrote: read the output back). ``chunks``: the output's as its Source
    reports them."""

    def __init__(self, shape, dtype, chunks):
        dt = np.dtype(dtype)
        self.shape, self.dtype = tuple(int(x) for x in shape), dt
        total = self.shape[0] * self.shape[1] * dt.itemsize
        self._regions = sample_regions(self.shape, dt.itemsize, chunks, total)
        self._bounds = np.array(self._regions, dtype=np.int64).reshape(-1, 4)
        self._values = [np.empty((r1 - r0, c1 - c0), dt) for r0, r1, c0, c1 in self._regions]
        self._written = [np.zeros((r1 - r0, c1 - c0), bool) for r0, r1, c0, c1 in self._regions]
        self._lock = threading.Lock()

    def add(self, r0: int, r1: int, c0: int, c1: int, src: np.ndarray) -> None:
        """Keep what ``src`` (rows r0:r1, columns c0:c1, as written) holds of the samples."""
        b = self._bounds
        hits = np.flatnonzero((b[:, 0] < r1) & (b[:, 1] > r0) & (b[:, 2] < c1) & (b[:, 3] > c0))
        for k in hits:
            g0, g1, h0, h1 = self._regions[k]
            a0, a1, b0, b1 = max(r0, g0), min(r1, g1), max(c0, h0), min(c1, h1)
            with self._lock:
                self._values[k][a0 - g0:a1 - g0, b0 - h0:b1 - h0] = \
                    src[a0 - r0:a1 - r0, b0 - c0:b1 - c0]
                self._written[k][a0 - g0:a1 - g0, b0 - h0:b1 - h0] = True

    def digest(self) -> str | None:
        with self._lock:
            if not all(w.all() for w in self._written):
                return None
            h = _fingerprint_hash(self.shape, self.dtype)
            for v in self._values:
                _hash_values(h, v)
        return h.hexdigest()


def _pieces(r0: int, r1: int, c0: int, c1: int, itemsize: int, piece: int):
    """Region [r0, r1) x [c0, c1) in pieces of at most ``piece`` bytes (one element at least)
    whose bytes, one after another, are the region's in row-major order: bands of whole rows,
    or a row in parts where one row is larger."""
    width = min(c1 - c0, max(1, piece // itemsize))
    rows = max(1, piece // (width * itemsize)) if width == c1 - c0 else 1
    return [(p0, min(r1, p0 + rows), q0, min(c1, q0 + width))
            for p0 in range(r0, r1, rows) for q0 in range(c0, c1, width)]


def _blocks(m: int, n: int, itemsize: int) -> list[tuple[int, int, int, int]]:
    """All of an m x n matrix in row-major blocks of about WHOLE_BLOCK bytes."""
    cols = max(1, min(n, WHOLE_BLOCK // itemsize))
    rows = max(1, WHOLE_BLOCK // (cols * itemsize))
    return [(r0, min(m, r0 + rows), c0, min(n, c0 + cols))
            for r0 in range(0, m, rows) for c0 in range(0, n, cols)]


def _dtype_key(dtype) -> str:
    """How an identity records a dtype: NumPy's type string ('<f4'), or the name where NumPy's
    string does not say it (bfloat16 is '<V2')."""
    dt = np.dtype(dtype)
    return dt.str if dt.kind == "f" else dt.name


def sample_regions(shape, itemsize: int, chunks, total: int) -> list[tuple[int, int, int, int]]:
    """The regions :func:`fingerprint` reads, about ``SAMPLE_SHARE`` of ``total`` bytes."""
    m, n = shape
    if total <= SAMPLE_WHOLE:
        return [(0, m, 0, n)]
    budget = int(min(SAMPLE_MAX, max(SAMPLE_MIN, total * SAMPLE_SHARE)))
    if chunks:
        cr, cc = min(chunks[0], m), min(chunks[1], n)
        gi, gj = -(-m // cr), -(-n // cc)
        rows = max(1, min(cr, budget // 2 // (cc * itemsize)))  # at least two chunks' samples
        count = max(2, min(gi * gj, budget // (rows * cc * itemsize)))
        cells = sorted({round(t * (gi * gj - 1) / (count - 1)) for t in range(count)})
        out = []
        for cell in cells:
            ci, cj = divmod(cell, gj)
            r0, c0 = ci * cr, cj * cc
            r1 = min(m, r0 + rows) if cell != gi * gj - 1 else min(m, r0 + cr)
            r0 = r0 if cell != gi * gj - 1 else max(r0, r1 - rows)
            out.append((r0, r1, c0, min(n, c0 + cc)))
        return out
    seg = min(n, SEGMENT)
    count = max(2, budget // (seg * itemsize))
    out = []
    for t in range(count):
        r = t * (m - 1) // (count - 1)
        c = 0 if t == 0 else (n - seg if t == count - 1 else (t * 2654435761) % (n - seg + 1))
        out.append((r, r + 1, c, c + seg))
    return out


# ----- where an operand lies --------------------------------------------------------------------

@dataclass(frozen=True)
class Footprint:
    """Where an operand's bytes are: HDF5 objects as (device, inode, address), file byte ranges
    as (device, inode, lo, hi), and for in-memory arrays the array itself."""

    objects: tuple = ()
    ranges: tuple = ()
    files: tuple = ()  # (device, inode) of files the operand is stored in
    array: object = None
    #: A Zarr array: (device, inode) of its directory, and of that directory (where it exists)
    #: and every directory above it; one array inside another's directory overlaps it.
    tree: tuple | None = None
    within: tuple = ()
    #: (device, inode) of other files holding its data: an HDF5 dataset's external raw files
    #: and virtual sources, which HDF5 reads behind the dataset's own file.
    elsewhere: tuple = ()


def overlaps(a: Footprint, b: Footprint) -> str:
    """How two footprints share a byte or an HDF5 object ("" when they do not), as words
    that complete "C ... A"."""
    if set(a.objects) & set(b.objects):
        return "which is the same HDF5 object (by another name or link) as"
    if a.array is not None and b.array is not None and _share_memory(a.array, b.array):
        return "sharing memory with"
    if a.tree is not None and a.tree == b.tree:
        return "which is the same Zarr array (by another name or link) as"
    for dev, ino, lo, hi in a.ranges:
        for dev2, ino2, lo2, hi2 in b.ranges:
            if (dev, ino) == (dev2, ino2) and lo < hi2 and lo2 < hi:
                return "mapping bytes of the same file as"
    if (a.tree is not None and a.tree in b.within) or (b.tree is not None and b.tree in a.within):
        return "nested with (in, or holding, the directory of)"
    if set(a.files) & set(b.elsewhere) or set(b.files) & set(a.elsewhere):
        return "in a file holding data (external raw storage or a virtual source) of"
    return ""


#: The most work NumPy may spend proving two strided views disjoint (see :func:`_share_memory`).
SHARE_WORK = 1 << 16


def _share_memory(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether two arrays share an element's byte (interleaved or side-by-side views of one
    buffer do not); True where NumPy finds that too hard to tell within SHARE_WORK."""
    try:
        return bool(np.shares_memory(x, y, max_work=SHARE_WORK))
    except np.exceptions.TooHardError:
        return True


def array_footprint(x: np.ndarray) -> Footprint:
    """The footprint of an in-memory array: itself, and the file ranges its pages map (a
    ``numpy.memmap``, shared memory, any file mapping), read from ``/proc/self/maps``; none
    for memory NumPy allocated itself (anonymous: no file maps it, and a CUDA process's
    mappings take milliseconds to read)."""
    if x.size == 0 or _numpy_owned(x):
        return Footprint(array=x)
    lo = x.__array_interface__["data"][0]
    lo += sum((k - 1) * s for k, s in zip(x.shape, x.strides) if s < 0)
    hi = lo + sum((k - 1) * abs(s) for k, s in zip(x.shape, x.strides)) + x.itemsize
    ranges, paths = [], set()
    for start, end, offset, dev, ino, path in _mappings():
        if start < hi and lo < end:
            ranges.append((dev, ino, offset + max(lo, start) - start,
                           offset + min(hi, end) - start))
            paths.add(path)
    within = tuple({d for path in paths if path.startswith("/") for d in ancestors(path)})
    return Footprint(ranges=tuple(ranges), files=tuple({r[:2] for r in ranges}), array=x,
                     within=within)


def _numpy_owned(x: np.ndarray) -> bool:
    """Whether ``x`` views memory that NumPy allocated (an array owning its data at the end
    of its chain of bases), not a buffer of another object (a file map, shared memory)."""
    base = x
    while isinstance(base, np.ndarray):
        if base.flags.owndata:
            return True
        base = base.base
    return False


_ONCE = threading.local()


@contextmanager
def mappings_once():
    """Within it, this thread's footprints of arrays read ``/proc/self/maps`` once: the
    footprints of a job's arrays (A, B and C, taken together while the output is opened) see
    one snapshot of mappings that all of them had before the call. Nests."""
    outer = getattr(_ONCE, "depth", 0)
    _ONCE.depth = outer + 1
    try:
        yield
    finally:
        _ONCE.depth = outer
        if not outer:
            _ONCE.maps = None


def _mappings() -> list[tuple[int, int, int, int, int, str]]:
    """(start, end, file offset, device, inode, path) of this process's mappings of files (those of
    inode 0, anonymous memory, are left out unparsed: a CUDA process has thousands); within
    :func:`mappings_once`, read once."""
    if getattr(_ONCE, "depth", 0):
        if getattr(_ONCE, "maps", None) is None:
            _ONCE.maps = _read_mappings()
        return _ONCE.maps
    return _read_mappings()


#: (device, inode) of mapped files -> whether the file is a character or block device.
_DEVICE_FILES: dict[tuple[int, int], bool] = {}


def _device_file(key: tuple[int, int], path: str) -> bool:
    """Whether the mapped file ``key`` (at ``path``) is a device (``/dev/zero``, a GPU
    driver's node pinning host memory): its mappings are memory, not bytes of one file, and
    two of them at different addresses share nothing."""
    if key not in _DEVICE_FILES:
        try:
            st = os.stat(path)
        except OSError:
            return False  # gone or renamed: counted as a file
        _DEVICE_FILES[key] = ((st.st_dev, st.st_ino) == key
                              and (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)))
    return _DEVICE_FILES[key]


def _read_mappings() -> list[tuple[int, int, int, int, int, str]]:
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        span, _perms, offset, dev, ino = parts[:5]
        if ino == "0":
            continue
        start, end = (int(v, 16) for v in span.split("-"))
        major, minor = (int(v, 16) for v in dev.split(":"))
        key = (os.makedev(major, minor), int(ino))
        path = parts[5] if len(parts) > 5 else ""
        if path.startswith("/dev/") and _device_file(key, path):
            continue
        out.append((start, end, int(offset, 16), *key, path))
    return out


def overlaps_itself(x: np.ndarray) -> bool:
    """Whether two elements of the 2-D array ``x`` share memory (a strided view such as
    ``as_strided`` makes): its shorter stride must step past an element, its longer past a
    whole line of the other."""
    dims = sorted((abs(s), k) for k, s in zip(x.shape, x.strides) if k > 1)
    if not dims:
        return False
    reach = x.itemsize
    for stride, k in dims:
        if stride < reach:
            return True
        reach = stride * (k - 1) + reach
    return False


def refuse_alias(out: Footprint, inputs, label: str) -> None:
    """OutputIsInputError when the output's footprint shares a byte or an HDF5 object with an
    input's (same file by any name, same object by any link, overlapping maps or memory)."""
    with mappings_once():
        for src in inputs:
            fp = src.footprint()
            how = overlaps(out, fp)
            if (not how and src.layout == "array" and out.array is None
                    and set(fp.files) & set(out.files)):
                how = "in a file that the input array maps"  # a file output: any of its bytes
            if how:
                raise OutputIsInputError(f"Expected an output other than the inputs. Got "
                                         f"{label}, {how} {src.label}.")


def ancestors(path: str) -> tuple:
    """(device, inode) of ``path`` (where it exists) and of every directory above it."""
    out = []
    path = os.path.realpath(path)
    while True:
        try:
            st = os.stat(path)
            out.append((st.st_dev, st.st_ino))
        except OSError:
            pass
        parent = os.path.dirname(path)
        if parent == path:
            return tuple(out)
        path = parent
