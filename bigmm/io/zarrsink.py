"""A Zarr v3 array as the output (:class:`ZarrSink`), with the guarantees of HDF5 outputs.

The array bigmm creates is chunked by the run's tiles (one chunk per C tile, clipped to C),
stored uncompressed (the ``bytes`` codec, little-endian) with NaN as its fill value, so a tile
is one chunk file: a row-major block any Zarr reader decodes, which bigmm writes at byte
offsets as the tile's rows arrive (:class:`ChunkFiles`).

Crash safety. A chunk is written to a temporary file beside its place (``<key>.bigmm-tmp``); a
commit makes every finished chunk durable (``fsync``), renames it into place and ``fsync``\\ s
its directory, and only then journals its tile (:mod:`.journal`, beside the store: one journal
and one lock per array, ``store.zarr.<array>.bigmm-journal``). A chunk file is therefore either
absent or whole; a crash loses only unjournaled tiles, which a resumed run writes again. The
array carries ``bigmm_complete: false`` in its attributes (``zarr.json``, rewritten atomically:
temporary file, ``fsync``, rename, ``fsync`` of the directory) until :meth:`ZarrSink.finish`
sets it, with the job record (``bigmm_job``). When old C must be read (beta != 0) the new values
go to an array ``<name>.bigmm-partial`` beside it (for a root array, a store
``store.zarr.bigmm-partial`` beside the store); ``finish`` journals the swap, then renames the
directories (idempotent: a crash midway is finished by the resume).

Other processes (dask workers) write whole tiles of such an array directly:
:meth:`ZarrSink.raw_region` describes a tile's chunk files in a small picklable
:class:`ZarrRegion`, :class:`ZarrRegionSink` writes them the same way and makes them durable
before the task returns, and the owner journals the tile.

An existing array written in place (a ``zarr.Array`` passed as ``out``) keeps its chunks and
codecs: tiles go through zarr-python (its chunk writes replace whole files atomically), one at a
time, and a commit ``fsync``\\ s the chunk files the tiles touched before journaling them.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass

import numpy as np

from ..errors import BigmmError, OutputNotWritable, ReadError, WriteError
from ._h5 import COMPLETE_ATTR, JOB_ATTR, RUN_ATTR, load_record
from .identity import Footprint, WrittenFingerprint, ancestors
from .journal import Journal, finished_job
from .layout import chunk_cells
from .sink import JournaledSink, Sink, _check_tile, _write_error
from .durable import fsync_path
from .inputs import DEFAULT_THREADS
from .spec import ZARR, Spec
from .zarrfiles import (AHEAD, OLD_SUFFIX, ChunkFiles, drop_stale, remove_set_aside, remove_tree,
                        swap, write_attributes)
from .zarrmeta import META, node_type, read_meta
from .zarrsource import (ZarrSource, array_dir, direct_codec, enclosing_array, open_array,
                         v2_group_above, zarr_module)

PARTIAL_SUFFIX = ".bigmm-partial"
#: Chunk edge of an output created without a tile shape.
DEFAULT_CHUNK = 4096


# ----- the sink -------------------------------------------------------------------------------

def target_location(spec: Spec, target: str) -> tuple[str, str]:
    """(store, array path) of ``target``: the spec's array, or its partial array (for a root
    array, the root of a store beside the spec's)."""
    if spec.dataset == "/" and target != "/":
        return spec.path + PARTIAL_SUFFIX, ""
    return spec.path, target.strip("/")


def target_dir(spec: Spec, target: str) -> str:
    return os.path.realpath(array_dir(*target_location(spec, target)))


def stored_dtype(arr) -> np.dtype:
    order = arr.serializer.endian
    big = getattr(order, "value", order) == "big"
    return np.dtype(arr.dtype).newbyteorder(">" if big else "<")


def tiles_hold_chunks(arr, chunks) -> bool:
    """Whether every chunk of ``arr`` lies inside one tile of shape ``chunks`` (the tile
    clipped to the array)."""
    if chunks is None:
        return False
    return all(t % c == 0 or t == d for t, c, d in zip(chunks, arr.chunks, arr.shape))


class ZarrSink(JournaledSink):
    """A Zarr v3 array named by a spec (or passed in place), written by whole chunk files where
    the tiles hold whole chunks of an uncompressed array, else through zarr-python."""

    resumable = True

    def __init__(self, spec: Spec, shape, dtype, journal: Journal, target: str, reads_c: bool,
                 threads: int = DEFAULT_THREADS, result=None, chunks=None):
        self.spec, self.shape, self.dtype = spec, tuple(shape), np.dtype(dtype)
        self.label, self.result = f"C ({spec})", str(spec) if result is None else result
        self.journal, self.target, self.reads_c = journal, target, reads_c
        self.done = frozenset(journal.tiles)
        self.dir = target_dir(spec, target)
        self._threads = threads
        self._files: ChunkFiles | None = None
        self._arr = self._old = None
        self._touched: set[tuple] = set()
        self._lock = threading.Lock()
        self._finished = False
        if journal.swap:  # all tiles are durable; finish() completes the swap
            self.layout = "done"
            return
        store, path = target_location(spec, target)
        arr = open_array(Spec(store, "/" + path, ZARR), self.label, mode="r+")
        self.done = self._trusted(journal, lambda found: _read_spans(arr, self.dtype, found))
        self._taken = WrittenFingerprint(self.shape, self.dtype, arr.chunks)
        codec, _ = direct_codec(arr)
        drop_stale(self.dir, store)
        if codec == "" and result is None and tiles_hold_chunks(arr, chunks):
            self._files = ChunkFiles(self.dir, self.shape, arr.chunks, stored_dtype(arr),
                                     arr.metadata.encode_chunk_key, ahead=AHEAD)
            self._key = arr.metadata.encode_chunk_key
            self._chunks = tuple(arr.chunks)
            self.layout, self.parallel_writes = "zarr-chunks", True
        else:
            self._arr = result if result is not None else arr
            self.layout = "zarr"
        if reads_c:
            self._old = _open_old(spec, self.label, threads)

    # ----- tiles ----------------------------------------------------------------------------
    def read(self, r0, r1, c0, c1, out) -> None:
        self._check(r0, r1, c0, c1, out)
        if self._old is None:
            raise BigmmError(f"Expected a sink opened with reads_c=True to read old C. "
                             f"Got reads_c=False for {self.label}.")
        self._old.read(r0, r1, c0, c1, out)

    def write(self, r0, r1, c0, c1, src) -> None:
        self._check(r0, r1, c0, c1, src)
        if r0 == r1 or c0 == c1:
            return
        try:
            if self._files is not None:
                self._files.write(r0, r1, c0, c1, src)
            else:
                with self._lock:
                    self._arr[r0:r1, c0:c1] = src
                    self._touched.update(_storage_cells(self._arr, r0, r1, c0, c1))
        except BigmmError:
            raise
        except Exception as exc:
            raise self._write_error(r0, r1, c0, c1, exc) from exc
        self._taken.add(r0, r1, c0, c1, src)

    @property
    def writes(self) -> str:
        """How tiles reach the disk: chunk files "direct" or "cached", else "zarr"."""
        return self._files.writes if self._files is not None else "zarr"

    def raw_region(self, r0, r1, c0, c1):
        """The chunk files of a region made of whole chunks (:class:`ZarrRegion`), for another
        process to write; None where the region cuts chunks or tiles go through zarr."""
        self._check_region(r0, r1, c0, c1)
        if self._files is None:
            return None
        (cr, cc), (m, n) = self._chunks, self.shape
        if r0 % cr or c0 % cc or (r1 % cr and r1 != m) or (c1 % cc and c1 != n):
            return None
        keys = tuple(((ci, cj), self._key((ci, cj)))
                     for ci, cj, *_ in chunk_cells(self._chunks, r0, r1, c0, c1))
        return ZarrRegion(self.dir, self.label, self._files.stored.str, self.shape,
                          self._chunks, (r0, r1), (c0, c1), keys)

    def _sync(self) -> None:
        try:
            if self._files is not None:
                self._files.publish()
            elif self._arr is not None:
                with self._lock:
                    touched, self._touched = self._touched, set()
                _sync_cells(self.dir, self._arr, touched)
        except OSError as exc:
            raise self._write_error(0, self.shape[0], 0, self.shape[1], exc) from exc

    def finish(self) -> None:
        """Sync, swap in the partial array (beta != 0), mark complete, drop the journal."""
        if self._finished:
            return
        self._sync()
        if self._files is not None and self._files.unfinished:
            raise WriteError(f"Expected every chunk of {self.label} written. Got "
                             f"{self._files.unfinished} unfinished.")
        self._close_handles()
        name = target_dir(self.spec, self.spec.dataset)
        if self.reads_c:
            if not self.journal.swap:
                self.journal.append({"swap": True})
            swap(name, target_dir(self.spec, self.target))
        record = finished_job(self.journal.header.get("job") or {})
        record["result"] = self._result()
        write_attributes(name, {JOB_ATTR: json.dumps(record, sort_keys=True),
                                COMPLETE_ATTR: True})
        self.journal.remove()
        self._finished = True
        self.layout = "done"

    def _fingerprint(self) -> str:
        from .identity import fingerprint

        src = ZarrSource(open_array(self.spec, self.label), self.label, threads=self._threads)
        try:
            return fingerprint(src)
        finally:
            src.close()

    def _close_handles(self) -> None:
        if self._old is not None:
            self._old.close()
            self._old = None
        if self._files is not None:
            self._files.close()

    def close(self) -> None:
        """Release everything; an unfinished output stays marked incomplete and resumable."""
        try:
            self._close_handles()
            self.journal.close()
        finally:
            self._release()


def _open_old(spec: Spec, label: str, threads: int) -> ZarrSource:
    from .zarrsource import open_zarr

    return open_zarr(spec, name="old " + label, threads=threads)


def _storage_cells(arr, r0, r1, c0, c1) -> list[tuple[int, int]]:
    """The stored blocks (shards where sharded, else chunks) a region touches."""
    grid = getattr(arr, "shards", None) or arr.chunks
    return [(ci, cj) for ci, cj, *_ in chunk_cells(tuple(grid), r0, r1, c0, c1)]


def _sync_cells(folder: str, arr, cells) -> None:
    dirs = set()
    for cell in cells:
        path = os.path.join(folder, *arr.metadata.encode_chunk_key(cell).split("/"))
        if os.path.exists(path):
            fsync_path(path)
        dirs.add(os.path.dirname(path))
    for d in sorted(dirs, key=len, reverse=True):
        if os.path.isdir(d):
            fsync_path(d)


# ----- regions written by other processes ---------------------------------------------------------

@dataclass(frozen=True)
class ZarrRegion:
    """Whole chunks of an uncompressed Zarr output (a C tile), for another process to write:
    small and picklable (the array's directory, its geometry and the chunks' keys)."""

    folder: str
    label: str
    dtype: str  # as stored
    array_shape: tuple[int, int]
    chunks: tuple[int, int]
    rows: tuple[int, int]
    cols: tuple[int, int]
    keys: tuple  # ((ci, cj), key) of the chunks in the region

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows[1] - self.rows[0], self.cols[1] - self.cols[0]


class ZarrRegionSink(Sink):
    """A :class:`ZarrRegion` as a Sink of the region's shape, written from any process (a dask
    worker computing one C tile): sub-regions go into its chunks' temporary files as they
    arrive, and ``finish`` makes the chunks durable and puts them in place. ``read`` reads
    old C from ``old`` (a Source in region coordinates). Nothing is journaled here: the
    output's owner journals the tile once its task reports it, with the sample ``sampler``
    (a :class:`.tilesums.Sampler`, where given) kept of what was written."""

    layout = "region"
    resumable = True
    parallel_writes = True

    def __init__(self, where: ZarrRegion, old=None, sampler=None):
        self.where, self.old, self.sampler = where, old, sampler
        self.dtype = np.dtype(where.dtype).newbyteorder("=")
        self.shape = where.shape
        (self._r0, r1), (self._c0, c1) = where.rows, where.cols
        self.label = f"{where.label} rows {self._r0}:{r1}, columns {self._c0}:{c1}"
        keys = dict(where.keys)
        self._files = ChunkFiles(where.folder, where.array_shape, where.chunks,
                                 np.dtype(where.dtype), keys.__getitem__)

    def read(self, r0, r1, c0, c1, out) -> None:
        self._check(r0, r1, c0, c1, out)
        if self.old is None:
            raise BigmmError(f"Expected a source of old C to read {self.label}. Got none.")
        self.old.read(r0, r1, c0, c1, out)

    def write(self, r0, r1, c0, c1, src) -> None:
        self._check(r0, r1, c0, c1, src)
        try:
            self._files.write(self._r0 + r0, self._r0 + r1, self._c0 + c0, self._c0 + c1, src)
        except BigmmError:
            raise
        except Exception as exc:
            raise self._write_error(r0, r1, c0, c1, exc) from exc
        if self.sampler is not None:
            self.sampler.add(r0, r1, c0, c1, src)

    def commit(self, tiles, samples=None) -> None:
        try:
            self._files.publish()
        except OSError as exc:
            raise self._write_error(0, self.shape[0], 0, self.shape[1], exc) from exc

    def finish(self) -> None:
        self.commit([])
        if self._files.unfinished:
            raise WriteError(f"Expected every chunk of {self.label} written. Got "
                             f"{self._files.unfinished} unfinished.")

    def close(self) -> None:
        self._files.close()
        self._release()

    def _write_error(self, r0, r1, c0, c1, exc) -> WriteError:
        return _write_error(self.where.label, self._r0 + r0, self._r0 + r1, self._c0 + c0,
                            self._c0 + c1, exc)


def write_zarr_region(where: ZarrRegion, src) -> None:
    """Write ``src`` as the whole region ``where`` from any process, durably."""
    _check_tile(np.dtype(where.dtype).newbyteorder("="), where.shape, src)
    sink = ZarrRegionSink(where)
    try:
        sink.write(0, where.shape[0], 0, where.shape[1], src)
        sink.finish()
    finally:
        sink.close()


# ----- what open_output needs -----------------------------------------------------------------

def tile_chunks(shape, tile, itemsize: int = 4) -> tuple[int, int]:
    """The chunk shape of an output bigmm creates: the run's tile clipped to C (one chunk per
    tile), else DEFAULT_CHUNK square."""
    m, n = (int(d) for d in shape)
    if tile is None:
        return min(m, DEFAULT_CHUNK), min(n, DEFAULT_CHUNK)
    return min(int(tile[0]), m), min(int(tile[1]), n)


def check(spec: Spec) -> None:
    """OutputNotWritable unless the output's place is a new path or a Zarr v3 array."""
    if os.path.exists(spec.path) and not os.path.isdir(spec.path):
        raise OutputNotWritable(f"Expected a Zarr store (a directory) or a new path for the "
                                f"output. Got '{spec.path}', a file.")
    link = _link_on_the_way(spec)
    if link is not None:  # replacing it would remove the array it names, elsewhere
        raise OutputNotWritable(f"Expected the output array's own path. Got {spec}, through "
                                f"the symbolic link '{link}' (to "
                                f"'{os.path.realpath(link)}'): name the array where it lies.")
    inside = enclosing_array(spec.path, spec.dataset)
    if inside is not None:
        raise OutputNotWritable(f"Expected a place for the output array in a group. Got "
                                f"{spec}, inside the array '{inside}' of '{spec.path}'.")
    refuse_v2_group(spec)
    folder = array_dir(spec.path, spec.dataset)
    if not os.path.isdir(folder):
        return
    kind = node_type(folder)
    if kind == "group":
        raise OutputNotWritable(f"Expected an array path for the output. Got '{spec.dataset}' "
                                f"in '{spec.path}', which is a group.")
    if kind == "array" and read_meta(folder) is None:
        raise OutputNotWritable(f"Expected a Zarr v3 array (or a new path) for the output. Got "
                                f"a Zarr v2 array at {spec}.")
    if kind is None and os.listdir(folder):
        raise OutputNotWritable(f"Expected a Zarr array (or a new path) for the output. Got "
                                f"'{folder}', a directory that holds no Zarr array.")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputNotWritable(f"Expected a writable Zarr array for the output. Got "
                                f"'{folder}' (permission denied).")


def _link_on_the_way(spec: Spec) -> str | None:
    """The first symbolic link among the directories from the store to the output array
    (the store itself only where the array is its root), or None."""
    parts = [p for p in spec.dataset.strip("/").split("/") if p]
    here = spec.path
    if not parts and os.path.islink(here):
        return here
    for part in parts:
        here = os.path.join(here, part)
        if os.path.islink(here):
            return here
    return None


def refuse_v2_group(spec: Spec) -> None:
    """OutputNotWritable where the array ``spec`` would be made inside a Zarr v2 group: the
    v3 metadata written beside it would hide the group's v2 arrays from zarr-python."""
    old = v2_group_above(spec.path, spec.dataset)
    if old is not None:
        raise OutputNotWritable(f"Expected a Zarr v3 store for {spec}. Got a Zarr v2 group at "
                                f"'{old}' (.zgroup), whose arrays a v3 array beside them would "
                                f"hide: write it to another store.")


def exists(spec: Spec) -> bool:
    return node_type(array_dir(spec.path, spec.dataset)) == "array"


def inspect(spec: Spec, partial: str, label: str) -> dict:
    """What exists at the output (as ``output._inspect`` tells of an HDF5 one)."""
    folder = target_dir(spec, spec.dataset)
    info = {"exists": False, "partial": False,
            "footprint": Footprint(within=ancestors(folder))}
    meta = read_meta(folder)
    if meta is not None and meta.get("node_type") == "array":
        st = os.stat(folder)
        attrs = meta.get("attributes") or {}
        info.update(exists=True, shape=tuple(meta.get("shape") or ()),
                    dtype=_meta_dtype(meta), complete=bool(attrs.get(COMPLETE_ATTR, True)),
                    flagged=COMPLETE_ATTR in attrs, record=load_record(attrs.get(JOB_ATTR)),
                    footprint=Footprint(tree=(st.st_dev, st.st_ino), within=ancestors(folder)),
                    file=(st.st_dev, st.st_ino))
    _stale_partial(spec, target_dir(spec, partial))
    info["partial"] = node_type(target_dir(spec, partial)) == "array"
    return info


def _stale_partial(spec: Spec, folder: str) -> None:
    """Refuse what lies at the partial array's place unless bigmm left it there (an array
    marked incomplete): a run removes that, and must not remove anything else
    (:func:`.output._stale_partial` for HDF5)."""
    if not os.path.lexists(folder):
        return
    attrs = ((read_meta(folder) or {}).get("attributes") or {}) if os.path.isdir(folder) else {}
    if attrs.get(COMPLETE_ATTR, True) is not False:
        raise OutputNotWritable(f"Expected nothing at '{folder}' but a partial output bigmm "
                                f"left there (the array it writes C into while old C "
                                f"survives). Got one it did not leave: rename it, or write C "
                                f"elsewhere.")


def _meta_dtype(meta: dict):
    name = meta.get("data_type")
    try:
        return np.dtype(name if isinstance(name, str) else str(name))
    except TypeError:
        return np.dtype("V1")  # reported by the shape/dtype check as not float


def create(spec: Spec, label: str, shape, dtype, partial: str | None, drop_old: bool,
           chunks=None) -> str:
    """Create the array the run writes (the partial one when old C must survive), chunked by
    ``chunks``, uncompressed, marked incomplete; return its target name."""
    zarr = zarr_module()
    target = partial or spec.dataset
    remove_tree(target_dir(spec, spec.dataset + PARTIAL_SUFFIX))
    name = array_dir(spec.path, spec.dataset)
    remove_set_aside(name + OLD_SUFFIX)
    attrs = {}
    if partial:  # the original's attributes live on in the array that replaces it
        attrs = {k: v for k, v in ((read_meta(name) or {}).get("attributes") or {}).items()
                 if k not in (COMPLETE_ATTR, JOB_ATTR)}
    elif drop_old and exists(spec):
        remove_tree(os.path.realpath(name))
    store, path = target_location(spec, target)
    chunks = chunks or tile_chunks(shape, None)
    try:
        arr = zarr.create_array(
            store=zarr.storage.LocalStore(store), name=path or None, shape=tuple(shape),
            chunks=tuple(int(c) for c in chunks), dtype=np.dtype(dtype), compressors=None,
            filters=None, serializer=zarr.codecs.BytesCodec(endian="little"),
            fill_value=float("nan"),
            attributes=dict(attrs, **{COMPLETE_ATTR: False, RUN_ATTR: os.urandom(8).hex()}),
            zarr_format=3)
        del arr
        folder = array_dir(store, path)
        fsync_path(os.path.join(folder, META))
        here = os.path.realpath(folder)
        top = os.path.dirname(os.path.realpath(store))
        while len(here) >= len(top):  # the array and any group or store created above it
            if os.path.isfile(os.path.join(here, META)):
                fsync_path(os.path.join(here, META))
            fsync_path(here)
            if here == top:
                break
            here = os.path.dirname(here)
    except BigmmError:
        raise
    except Exception as exc:
        raise OutputNotWritable(f"Expected to create the Zarr array {label}. Got "
                                f"{type(exc).__name__}: {exc}.") from exc
    return target


def _read_spans(arr, dtype, found) -> list:
    """The spans [row, column, length] of ``arr`` in ``dtype``: one orthogonal selection per
    chunk a span starts in (each chunk decoded once)."""
    cr, cc = arr.chunks
    groups: dict[tuple, list] = {}
    for k, (r, c, n) in enumerate(found):
        groups.setdefault((r // cr, c // cc), []).append(k)
    out: list = [None] * len(found)
    for ks in groups.values():
        rows = sorted({found[k][0] for k in ks})
        cols = sorted({c for k in ks for c in range(found[k][1], found[k][1] + found[k][2])})
        block = np.asarray(arr.get_orthogonal_selection((rows, cols))).astype(dtype)
        for k in ks:  # a span's columns are consecutive in the sorted ``cols``
            r, c, n = found[k]
            at = cols.index(c)
            out[k] = block[rows.index(r), at:at + n]
    return out


def drop_begun(spec: Spec, journal) -> None:
    """Remove an output array that cannot be opened when the interrupted run whose journal
    parsed to ``journal`` created it and finished nothing in it (killed while creating it)."""
    if journal is None:
        return
    header, tiles, swapped = journal[0], journal[1], journal[2]
    if not header.get("new_file") or tiles or swapped:
        return
    folder = target_dir(spec, header.get("partial") or spec.dataset)
    if not os.path.isdir(folder):
        return
    try:
        if node_type(folder) == "array":
            return
    except ReadError:
        pass
    remove_tree(folder)


def mark_incomplete(arr) -> None:
    """Mark an array written in place as incomplete (durably) before its first tile."""
    from .zarrsource import spec_of

    spec = spec_of(arr)
    write_attributes(os.path.realpath(array_dir(spec.path, spec.dataset)),
                     {COMPLETE_ATTR: False})


def sink(spec, shape, dtype, journal, target, reads_c, threads, result, chunks) -> ZarrSink:
    return ZarrSink(spec, shape, dtype, journal, target, reads_c, threads, result=result,
                    chunks=chunks)
