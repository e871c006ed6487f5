import ctypes
import hashlib
import os
import threading

import h5py
import hdf5plugin
import numpy as np
import pytest

from bigmm.errors import (DtypeError, IncompleteOutputError, OperandNotFound, OptionError,
                          ReadError, ShapeError, SpecError)
from bigmm.io import _h5, open_input, rawio, source
from bigmm.io.inputs import on_caller_thread
from bigmm.testing import NoPool, random_matrix

SHAPE = (203, 157)  # multiples of nothing

# name, h5py create_dataset keywords, stored dtype, expected layout
LAYOUTS = [
    ("contiguous", {}, "<f4", "contiguous"),                   # plain row-major block
    ("contiguous64", {}, "<f8", "contiguous"),                 # float64
    ("chunked", {"chunks": (37, 23)}, "<f4", "chunked"),       # chunks not dividing the shape
    ("chunked-rows", {"chunks": (5, 157)}, "<f8", "chunked"),  # full-width chunks
    # one chunk larger than the data (extendible: another chunk index)
    ("chunked-big", {"chunks": (300, 200), "maxshape": (None, None)}, "<f4", "chunked"),
    ("big-endian", {}, ">f4", "contiguous"),                   # swapped after the raw read
    ("big-endian-chunked", {"chunks": (19, 41)}, ">f8", "chunked"),  # swapped, chunked
    ("gzip", {"chunks": (37, 23), "compression": "gzip"}, "<f4", "deflate"),  # inflated by zlib
    ("shuffle-gzip", {"chunks": (50, 50), "shuffle": True, "compression": "gzip"}, "<f8",
     "deflate"),                                               # unshuffled after inflating
    ("gzip-big-endian", {"chunks": (30, 70), "compression": "gzip", "compression_opts": 9,
                         "shuffle": True}, ">f4", "deflate"),  # swapped while copying out
    ("gzip-fletcher", {"chunks": (37, 23), "compression": "gzip", "fletcher32": True}, "<f4",
     "h5py"),                                                  # checksum filter: fallback
    ("zstd", {"chunks": (37, 23), **hdf5plugin.Zstd()}, "<f4", "zstd"),  # decoded by numcodecs
    ("shuffle-zstd", {"chunks": (50, 50), "shuffle": True, **hdf5plugin.Zstd()}, ">f8",
     "zstd"),                                                  # unshuffled, swapped
    ("blosc", {"chunks": (40, 30), **hdf5plugin.Blosc()}, "<f4", "blosc"),  # blosc 1 buffers
    ("lz4", {"chunks": (64, 64), **hdf5plugin.LZ4()}, "<f8", "h5py"),  # plugin filter
]


def sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def regions(shape, seed, count=12):
    """Edge cases plus random regions."""
    m, n = shape
    out = [(0, m, 0, n), (0, 1, 0, 1), (m - 1, m, n - 1, n), (0, m, n - 1, n), (m - 1, m, 0, n),
           (3, 3, 0, n)]
    rng = np.random.default_rng(seed)
    for _ in range(count):
        r0, r1 = sorted(rng.integers(0, m + 1, 2))
        c0, c1 = sorted(rng.integers(0, n + 1, 2))
        out.append((int(r0), int(r1) + (r0 == r1), int(c0), int(c1) + (c0 == c1)))
    return [(r0, min(r1, m), c0, min(c1, n)) for r0, r1, c0, c1 in out]


def make(tmp_path, kwargs, dtype, seed=1):
    data = random_matrix(SHAPE, np.dtype(dtype).newbyteorder("="), seed=seed)
    path = str(tmp_path / "in.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("A", data=data.astype(dtype), **kwargs)
    return path, data


def check_reads(src, data, seed=0):
    for r0, r1, c0, c1 in regions(data.shape, seed):
        out = np.full((r1 - r0, c1 - c0), np.nan, src.dtype)
        src.read(r0, r1, c0, c1, out)
        np.testing.assert_array_equal(out, data[r0:r1, c0:c1], err_msg=f"{(r0, r1, c0, c1)}")


# reader: memory map or not, full-width rows by preadv from what size, preadv flavour
READERS = {
    "mmap": (True, 16 << 20, rawio.GAP_MAX, True),        # mapped copies (the default)
    "mmap-rows-preadv": (True, 0, rawio.GAP_MAX, True),  # mapped; full-width rows by preadv
    "libc-per-row": (False, 0, 0, True),                 # libc preadv, one call per row
    "libc-read-through": (False, 0, rawio.GAP_MAX, True),  # libc preadv, gaps into scratch
    "os-per-row": (False, 0, 0, False),                  # os.preadv, one call per row
    "os-read-through": (False, 0, 1 << 30, False),       # os.preadv, gaps into scratch
}


@pytest.mark.parametrize("name, kwargs, dtype, layout", LAYOUTS, ids=[c[0] for c in LAYOUTS])
@pytest.mark.parametrize("reader", list(READERS))
def test_reads_equal_h5py(tmp_path, monkeypatch, name, kwargs, dtype, layout, reader):
    use_mmap, full_rows, gap_max, native = READERS[reader]
    monkeypatch.setattr(source, "PREAD_FULL_ROWS", full_rows)
    monkeypatch.setattr(rawio, "GAP_MAX", gap_max)
    monkeypatch.setattr(rawio, "NATIVE", native and rawio.NATIVE)
    path, data = make(tmp_path, kwargs, dtype)
    before = sha(path)
    with open_input(f"{path}:/A", use_mmap=use_mmap) as src:
        assert src.layout == layout, getattr(src, "reason", "")
        assert src.fast == (layout != "h5py")
        assert src.mapped == (use_mmap and layout in ("contiguous", "chunked"))
        assert src.dtype == np.dtype(dtype).newbyteorder("=")
        assert src.shape == SHAPE
        # panels align to chunks read whole (compressed); raw chunks are read in part
        assert src.panel_chunks == (None if layout == "chunked" else src.chunks)
        assert src.where()["path"] == os.path.realpath(path)
        assert src.where()["file"]["ino"] == os.stat(path).st_ino
        check_reads(src, data)
    assert sha(path) == before


@pytest.mark.parametrize("kwargs", [{}, {"chunks": (32, 48)}])  # contiguous, chunked
@pytest.mark.parametrize("dtype", ["<f4", ">f8"])              # both byte orders
def test_mapped_reads_of_random_regions(tmp_path, kwargs, dtype):
    shape = (517, 389)
    data = random_matrix(shape, np.dtype(dtype).newbyteorder("="), seed=21)
    path = str(tmp_path / "r.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("A", data=data.astype(dtype), **kwargs)
        d = f["A"]
        with open_input(f"{path}:/A", threads=3) as src:  # h5py still holds the file
            assert src.mapped
            for r0, r1, c0, c1 in regions(shape, seed=22, count=40):
                out = np.full((r1 - r0, c1 - c0), np.nan, src.dtype)
                src.read(r0, r1, c0, c1, out)
                np.testing.assert_array_equal(out, d[r0:r1, c0:c1], err_msg=f"{r0, r1, c0, c1}")


def test_unmappable_file_reads_with_preadv(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(19, "No such device")  # ENODEV: the file system cannot mmap

    monkeypatch.setattr(source, "FileMap", refuse)
    path, data = make(tmp_path, {"chunks": (37, 23)}, ">f4", seed=14)
    with open_input(f"{path}:/A") as src:
        assert src.layout == "chunked" and not src.mapped
        check_reads(src, data)


@pytest.mark.parametrize("task_bytes", [1, 4096, 1 << 20])  # many tiny tasks, some, one
@pytest.mark.parametrize("kwargs", [{}, {"chunks": (11, 13)}])  # contiguous, chunked
@pytest.mark.parametrize("use_mmap", [True, False])  # mapped copies, preadv
def test_region_split_over_pool(tmp_path, monkeypatch, task_bytes, kwargs, use_mmap):
    monkeypatch.setattr(source, "TASK_BYTES", task_bytes)
    path, data = make(tmp_path, kwargs, "<f8")
    with open_input(f"{path}:/A", threads=3, use_mmap=use_mmap) as src:
        check_reads(src, data, seed=5)


@pytest.mark.parametrize("grain, per", [
    (8 * 13 * 3, 3),  # windows of three rows: blocks of whole windows within a 512-byte task
    (1, 4),  # windows smaller than a row: blocks of as many rows as a task holds
])
def test_large_chunks_are_copied_in_blocks_of_rows(tmp_path, monkeypatch, grain, per):
    monkeypatch.setattr(source, "TASK_BYTES", 64)
    monkeypatch.setattr(source, "FAULT_GRAIN", grain)
    path, data = make(tmp_path, {"chunks": (41, 13)}, "<f8", seed=9)
    with open_input(f"{path}:/A", threads=3) as src:
        assert src.mapped
        tasks = src._mapped_chunks(0, 41, 0, 13, np.empty((41, 13)), 512)
        rows = [dest.shape[0] for task in tasks for dest, _, _ in task]
        assert rows == [per] * (41 // per) + ([41 % per] if 41 % per else [])
        check_reads(src, data, seed=10)


@pytest.mark.parametrize("kwargs", [
    {},                                          # contiguous
    {"chunks": (11, 13)},                        # raw chunks
    {"chunks": (40, 30), "compression": "gzip"},  # compressed chunks, inflated here
])
@pytest.mark.parametrize("use_mmap", [True, False])  # mapped copies, preadv
def test_reads_on_the_callers_thread_use_no_pool(tmp_path, monkeypatch, kwargs, use_mmap):
    monkeypatch.setattr(source, "TASK_BYTES", 64)  # many tasks even for small regions
    path, data = make(tmp_path, kwargs, "<f4", seed=6)
    with open_input(f"{path}:/A", threads=3, use_mmap=use_mmap) as src:
        src._pool = NoPool()
        with on_caller_thread():  # every copy and inflate on this thread
            check_reads(src, data, seed=7)
        src._pool = None
        check_reads(src, data, seed=8)
        assert src._pool is not None  # outside, regions are split over the source's threads


@pytest.mark.parametrize("limit", [13, 777, 5000])  # bytes the fake preadv returns at most
def test_short_reads_are_resumed(tmp_path, monkeypatch, limit):
    real = rawio._C_PREADV
    if real is None:
        pytest.skip("no libc preadv")

    def short(fd, iov_addr, cnt, offset):
        iov = np.ctypeslib.as_array((ctypes.c_uint64 * 2).from_address(iov_addr)).copy()
        iov[1] = min(int(iov[1]), limit)
        return real(fd, iov.ctypes.data, 1, offset)

    monkeypatch.setattr(rawio, "_C_PREADV", short)
    monkeypatch.setattr(source, "TASK_BYTES", 1 << 30)  # read inline, in this thread
    path, data = make(tmp_path, {"chunks": (30, 40)}, "<f4", seed=11)
    with open_input(f"{path}:/A", use_mmap=False) as src:
        for r0, r1, c0, c1 in [(3, 50, 5, 100), (0, 203, 1, 157)]:
            out = np.full((r1 - r0, c1 - c0), np.nan, np.float32)
            src.read(r0, r1, c0, c1, out)
            np.testing.assert_array_equal(out, data[r0:r1, c0:c1])


@pytest.mark.parametrize("kwargs, layout", [
    ({}, "chunked"),                         # raw chunks
    ({"compression": "gzip"}, "deflate"),    # compressed chunks
])
def test_unallocated_chunks_read_as_fill(tmp_path, kwargs, layout):
    data = random_matrix(SHAPE, np.float32, seed=3)
    path = str(tmp_path / "sparse.h5")
    with h5py.File(path, "w") as f:
        d = f.create_dataset("A", shape=SHAPE, dtype="<f4", chunks=(40, 30), fillvalue=-2.5,
                             **kwargs)
        d[0:40, 0:30] = data[0:40, 0:30]      # one chunk
        d[150:, 100:] = data[150:, 100:]      # edge chunks, partly
        expected = d[...]
    assert np.count_nonzero(expected == -2.5) > 1000
    with open_input(f"{path}:/A") as src:
        assert src.layout == layout
        check_reads(src, expected, seed=4)


@pytest.mark.parametrize("kwargs, layout", [
    ({"chunks": (40, 30)}, "chunked"),                           # raw chunks
    ({"chunks": (40, 30), "compression": "gzip"}, "deflate"),    # compressed chunks
    ({"chunks": (40, 30), **hdf5plugin.LZ4()}, "h5py"),          # HDF5's own filter
    ({}, "h5py"),                                                # contiguous, never allocated
])
def test_storage_never_written_with_fill_time_never_reads_as_h5py_does(tmp_path, kwargs,
                                                                      layout):
    # HDF5 leaves the reader's buffer as it was there: h5py's reads (into zeros) give 0, and
    # a buffer bigmm reuses must not keep the values of an earlier region
    data = random_matrix(SHAPE, np.float32, seed=3)
    path = str(tmp_path / "never.h5")
    with h5py.File(path, "w") as f:
        d = f.create_dataset("A", shape=SHAPE, dtype="<f4", fillvalue=-2.5,
                             fill_time="never", **kwargs)
        if kwargs:
            d[0:40, 0:30] = data[0:40, 0:30]
        expected = d[...]
    assert np.count_nonzero(expected == 0) > 1000
    with open_input(f"{path}:/A") as src:
        assert src.layout == layout
        check_reads(src, expected, seed=4)


def test_big_endian_fill_value(tmp_path):
    path = str(tmp_path / "be.h5")
    with h5py.File(path, "w") as f:
        d = f.create_dataset("A", shape=(30, 20), dtype=">f8", chunks=(7, 6), fillvalue=1.25)
        d[7:14, 6:12] = 3.0
        expected = d[...].astype("<f8")
    with open_input(f"{path}:/A") as src:
        assert src.layout == "chunked"
        check_reads(src, expected)


def test_external_storage_falls_back(tmp_path):
    data = random_matrix((20, 30), np.float32, seed=6)
    path = str(tmp_path / "ext.h5")
    with h5py.File(path, "w") as f:
        external = [(str(tmp_path / "raw.bin"), 0, h5py.h5f.UNLIMITED)]
        f.create_dataset("A", data=data, external=external)
    with open_input(f"{path}:/A") as src:
        assert src.layout == "h5py" and "external" in src.reason
        check_reads(src, data)


def test_a_dataset_reached_by_an_external_link_releases_the_file_holding_the_link(tmp_path):
    # an output written into the file of the link (read through h5py: a filter) opens it
    data = random_matrix((60, 50), np.float32, seed=6)
    with h5py.File(tmp_path / "target.h5", "w") as f:
        f.create_dataset("g/A", data=data, chunks=(20, 20), fletcher32=True)
    link = str(tmp_path / "link.h5")
    with h5py.File(link, "w") as f:
        f["ext"] = h5py.ExternalLink("target.h5", "/g/A")
    with open_input(f"{link}:/ext") as src:
        assert src.layout == "h5py" and src.path == str(tmp_path / "target.h5")
        with _h5.H5LOCK:
            _h5.release_h5_handles(link)
            h5py.File(link, "a").close()  # (refused while the source held it read-only)
        check_reads(src, data)


def test_userblock_file(tmp_path):
    data = random_matrix((40, 33), np.float64, seed=7)
    path = str(tmp_path / "ub.h5")
    with h5py.File(path, "w", userblock_size=512) as f:
        f["A"] = data
    with open_input(f"{path}:/A") as src:
        check_reads(src, data)


def test_parallel_reads_from_threads(tmp_path):
    path, data = make(tmp_path, {"chunks": (17, 29)}, "<f4", seed=8)
    errors = []

    def worker(seed):
        try:
            check_reads(src, data, seed=seed)
        except Exception as exc:  # reported below
            errors.append(exc)

    with open_input(f"{path}:/A", threads=4) as src:
        threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors


def test_h5py_dataset_and_array_inputs(tmp_path):
    path, data = make(tmp_path, {}, "<f4", seed=9)
    with h5py.File(path, "r") as f:
        with open_input(f["A"]) as src:
            assert src.layout == "contiguous"
            check_reads(src, data)
    strided = np.asfortranarray(data.astype(">f8"))  # any strides, any byte order
    with open_input(strided, name="B") as src:
        assert src.layout == "array" and src.where() is None and "B" in src.label
        assert src.dtype == np.float64
        check_reads(src, data.astype(np.float64))


def data_end(path) -> int:
    """The end of dataset /A's stored bytes in its file."""
    with h5py.File(path, "r") as f:
        d = f["A"]
        if d.chunks is None:
            return d.id.get_offset() + d.id.get_storage_size()
        return max(info.byte_offset + info.size
                   for info in map(d.id.get_chunk_info, range(d.id.get_num_chunks())))


# contiguous; chunked with chunks dividing the shape (so the last stored byte is data)
@pytest.mark.parametrize("kwargs", [{}, {"chunks": (29, 157)}])
@pytest.mark.parametrize("use_mmap", [True, False])  # mapped copies, preadv
@pytest.mark.parametrize("cut", [4096, 1])  # most of the data gone; only its last byte
def test_truncated_file_is_a_read_error(tmp_path, kwargs, use_mmap, cut):
    path, data = make(tmp_path, kwargs, "<f4", seed=10)
    src = open_input(f"{path}:/A", use_mmap=use_mmap)
    assert src.mapped == use_mmap
    out = np.empty(SHAPE, np.float32)
    src.read(0, SHAPE[0], 0, SHAPE[1], out)
    os.truncate(path, cut if cut > 1 else data_end(path) - 1)
    with pytest.raises(ReadError) as err:  # not SIGBUS: the mapped size is checked first
        src.read(0, SHAPE[0], 0, SHAPE[1], out)
    src.close()
    assert f"rows 0:{SHAPE[0]}, columns 0:{SHAPE[1]}" in str(err.value)
    assert path in str(err.value)


@pytest.mark.parametrize("kwargs", [{}, {"chunks": (40, 30)}])  # contiguous, chunked
def test_truncated_copy_cannot_be_opened(tmp_path, kwargs):
    path, _ = make(tmp_path, kwargs, "<f4", seed=13)
    for cut in sorted({data_end(path) - 1, os.path.getsize(path) - 1}):
        copy = str(tmp_path / f"cut{cut}.h5")
        with open(path, "rb") as fh, open(copy, "wb") as out:
            out.write(fh.read(cut))
        with pytest.raises(ReadError) as err:
            open_input(f"{copy}:/A")
        assert copy in str(err.value)


def test_corrupt_compressed_chunk_is_a_read_error(tmp_path):
    path, _ = make(tmp_path, {"chunks": (50, 40), "compression": "gzip"}, "<f4", seed=12)
    with h5py.File(path, "r") as f:
        info = f["A"].id.get_chunk_info_by_coord((50, 40))
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset)
        fh.write(b"\xff" * info.size)
    with open_input(f"{path}:/A") as src:
        out = np.empty((10, 10), np.float32)
        src.read(0, 10, 0, 10, out)  # other chunks still read
        with pytest.raises(ReadError) as err:
            src.read(55, 60, 45, 50, np.empty((5, 5), np.float32))
    assert "rows 55:60, columns 45:50" in str(err.value) and path in str(err.value)


@pytest.mark.parametrize("kwargs", [
    {"compression": "gzip"},      # decoded by bigmm (its sample read by both)
    {**hdf5plugin.Blosc()},       # decoded by bigmm; numcodecs raises its own errors
    {"fletcher32": True},         # HDF5's checksum: read through h5py
])
def test_a_corrupt_first_chunk_is_a_read_error_at_open(tmp_path, kwargs):
    path, _ = make(tmp_path, {"chunks": (50, 40), **kwargs}, "<f4", seed=12)
    with h5py.File(path, "r") as f:
        info = f["A"].id.get_chunk_info_by_coord((0, 0))
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset)
        fh.write(b"\x5a" * info.size)  # (all 0xff would pass Fletcher-32: 0xffff is 0)
    with pytest.raises(ReadError, match="Expected a readable dataset") as err:
        open_input(f"{path}:/A")
    assert path in str(err.value)


@pytest.mark.parametrize("region, shape, dtype", [
    ((0, 5, 0, 5), (5, 4), np.float32),      # wrong buffer shape
    ((0, 5, 0, 5), (5, 5), np.float64),      # wrong buffer dtype
    ((0, 500, 0, 5), (500, 5), np.float32),  # region outside the matrix
])
def test_read_checks_buffer(tmp_path, region, shape, dtype):
    path, _ = make(tmp_path, {}, "<f4")
    with open_input(f"{path}:/A") as src:
        with pytest.raises(ShapeError, match="Expected"):
            src.read(*region, np.empty(shape, dtype))


def _bad_file(tmp_path):
    path = str(tmp_path / "bad.h5")
    with h5py.File(path, "w") as f:
        f["vec"] = random_matrix((7,), np.float32)
        f["cube"] = random_matrix((2, 3, 4), np.float32)
        f["int"] = np.arange(12, dtype=np.int32).reshape(3, 4)
        f["cplx"] = np.ones((3, 4), np.complex64)
        f["half"] = np.ones((3, 4), np.float16)
        f["str"] = np.array([["ab", "cd"], ["ef", "gh"]], dtype="S2")
        f["vstr"] = np.array([["ab", "c"], ["e", "f"]], dtype=h5py.string_dtype())
        f["comp"] = np.zeros((2, 2), dtype=[("x", "f4"), ("y", "f4")])
        f.create_group("grp")
        d = f.create_dataset("partial", data=random_matrix((3, 3), np.float32))
        d.attrs["bigmm_complete"] = False
    return path


# spec suffix, error, words the message must contain
INVALID = [
    ("nofile.h5:/A", OperandNotFound, ["nofile.h5", "no such file"]),  # missing file
    ("{bad}:/nope", OperandNotFound, ["/nope", "/vec"]),               # missing dataset, lists some
    ("{bad}:/grp", OperandNotFound, ["/grp", "group"]),                # a group, not a dataset
    ("{txt}:/A", OperandNotFound, ["not HDF5"]),                       # not an HDF5 file
    ("{bad}:/vec", ShapeError, ["2-D", "(7,)"]),                       # 1-D
    ("{bad}:/cube", ShapeError, ["2-D", "(2, 3, 4)"]),                 # 3-D
    ("{bad}:/int", DtypeError, ["bfloat16, float32, float64", "int32"]),       # integer
    ("{bad}:/cplx", DtypeError, ["bfloat16, float32, float64", "complex64"]),  # complex
    ("{bad}:/str", DtypeError, ["bfloat16, float32, float64", "string"]),      # fixed strings
    ("{bad}:/vstr", DtypeError, ["bfloat16, float32, float64", "string"]),     # variable strings
    ("{bad}:/comp", DtypeError, ["bfloat16, float32, float64", "compound"]),   # compound
    ("{bad}:/partial", IncompleteOutputError, ["incomplete", "resume=True", "overwrite=True"]),
]


@pytest.mark.parametrize("spec, error, words", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_inputs(tmp_path, spec, error, words):
    bad = _bad_file(tmp_path)
    txt = tmp_path / "plain.txt"
    txt.write_text("not hdf5")
    before = {p: sha(p) for p in (bad, txt)}
    spec = spec.format(bad=bad, txt=txt)
    with pytest.raises(error) as err:
        open_input(spec if not spec.startswith("nofile") else str(tmp_path / spec), name="A")
    message = str(err.value)
    assert message.startswith("Expected"), message
    for word in words:
        assert word in message, message
    assert {p: sha(p) for p in (bad, txt)} == before


@pytest.mark.parametrize("value, error, word", [
    (np.arange(6, dtype=np.int64).reshape(2, 3), DtypeError, "int64"),  # integer array
    (np.ones(4), ShapeError, "(4,)"),                                  # 1-D array
    ([[1.0, 2.0]], SpecError, "list"),                                 # unsupported type
])
def test_invalid_in_memory_inputs(value, error, word):
    with pytest.raises(error, match="Expected") as err:
        open_input(value, name="B")
    assert word in str(err.value)


@pytest.mark.parametrize("step", [
    100,          # below one page
    0,            # nothing
    2.5e6,        # not a whole number
    True,         # a flag, not a size
])
def test_bad_map_step_is_refused(tmp_path, step):
    path, _ = make(tmp_path, {}, "<f4", seed=3)
    with pytest.raises(OptionError, match=f"map_step.*Got {step!r}"):
        open_input(f"{path}:/A", map_step=step)


def test_map_step_reaches_the_map(tmp_path):
    """A source copies out of its map in the blocks it was opened with (here one page: the
    region below spans eight), and reads right."""
    path, data = make(tmp_path, {}, "<f4", seed=4)
    with open_input(f"{path}:/A", map_step=4096) as src:
        assert src.mapped and src._map.step == 4096
        out = np.full((50, 60), np.nan, np.float32)
        src.read(10, 60, 7, 67, out)
        np.testing.assert_array_equal(out, data[10:60, 7:67])


def test_a_masked_array_is_refused():
    # its mask would be ignored: the product of every element, masked or not
    a = np.ma.masked_array(np.ones((3, 4)), mask=np.eye(3, 4, dtype=bool))
    with pytest.raises(SpecError, match=r"Expected a NumPy array for A.*Got a masked array"):
        open_input(a, name="A")
