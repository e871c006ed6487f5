"""Zarr inputs: specs, every codec, chunking, byte order and place in a store, read by bigmm's
direct path and through zarr-python, and what a Zarr operand's identity and footprint say.

Real Zarr v3 stores on disk, written by zarr-python; every read is compared with the NumPy
array the store was written from (fresh random data, shapes multiples of nothing).
"""

from __future__ import annotations

import errno
import mmap
import os
import time

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

zarr = pytest.importorskip("zarr")

import bigmm  # noqa: E402
from bigmm import errors  # noqa: E402
from bigmm.io import Spec, open_input, parse_spec  # noqa: E402
from bigmm.io.identity import describe, differences  # noqa: E402
from bigmm.io import pagecache, zarrsource  # noqa: E402
from bigmm.io.inputs import on_caller_thread  # noqa: E402
from bigmm.io.zarrsource import ZarrSource, chunk_files  # noqa: E402
from bigmm.testing import NoPool, random_matrix, zarr_array  # noqa: E402

M, N = 157, 131  # multiples of nothing


# ----- specs ------------------------------------------------------------------------------------

SPECS = [
    # (text, path, array path, kind)
    ("s.zarr", "s.zarr", "/", "zarr"),                      # the root array of a store
    ("s.zarr/", "s.zarr", "/", "zarr"),                     # trailing slash
    ("dir/S.ZARR", "dir/S.ZARR", "/", "zarr"),              # any case
    ("s.zarr:/grp/A", "s.zarr", "/grp/A", "zarr"),          # an array in a group
    ("s.zarr:A", "s.zarr", "/A", "zarr"),                   # leading slash optional
    ("s.zarr:/", "s.zarr", "/", "zarr"),                    # the root, spelled out
    ("/d/run:1/s.zarr", "/d/run:1/s.zarr", "/", "zarr"),    # a colon inside the path
    ("a.h5:/A", "a.h5", "/A", "hdf5"),                      # HDF5 unchanged
]


@pytest.mark.parametrize("text,path,array,kind", SPECS)
def test_zarr_specs(text, path, array, kind):
    spec = parse_spec(text)
    assert spec == Spec(path, array, kind)
    assert parse_spec(str(spec)) == spec
    assert spec.zarr == (kind == "zarr")


def test_an_existing_store_without_the_suffix_is_zarr(tmp_path):
    zarr_array(tmp_path / "plain", random_matrix((4, 3), np.float64), path="g/A")
    assert parse_spec(f"{tmp_path / 'plain'}:/g/A") == Spec(str(tmp_path / "plain"), "/g/A",
                                                            "zarr")
    # the array's own directory works as a store of its own
    assert parse_spec(str(tmp_path / "plain" / "g" / "A")).zarr
    # a directory without Zarr metadata stays an HDF5 path (and fails as one)
    assert not parse_spec(f"{tmp_path}:/C").zarr


def test_a_bad_zarr_spec_is_refused():
    with pytest.raises(errors.SpecError, match="store.zarr:/group/array"):
        parse_spec("s.zarr:/g//A")


def test_a_missing_array_is_named_beside_a_corrupt_one(tmp_path):
    # the message lists the store's readable arrays; a sibling with broken metadata is skipped
    zarr_array(tmp_path / "s.zarr", np.ones((4, 4)), path="A")
    (tmp_path / "s.zarr" / "bad").mkdir()
    (tmp_path / "s.zarr" / "bad" / "zarr.json").write_text("{not json")
    with pytest.raises(errors.OperandNotFound, match=r"'/nosuch'.*the store holds /A\)"):
        open_input(f"{tmp_path / 's.zarr'}:/nosuch")


def test_bfloat16_zarr_arrays_are_refused_before_anything_is_made(tmp_path):
    # Zarr has no bfloat16 data type: generate and a new output refuse it, creating nothing
    from bigmm.io.generate import generate

    with pytest.raises(errors.DtypeError, match="Got bfloat16"):
        generate(f"{tmp_path / 'g.zarr'}:/A", (30, 20), dtype="bfloat16")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = random_matrix((30, 20), ml_dtypes.bfloat16)
    with pytest.raises(errors.DtypeError, match="Got bfloat16"):
        bigmm.matmul(a, a.T.copy(), str(tmp_path / "c.zarr"), out_dtype="bfloat16",
                     backend="numpy")
    assert not os.listdir(tmp_path)


def test_a_store_named_from_its_outermost_group(tmp_path):
    # the array's own folder, or a group's, names the array from the outermost group
    zarr_array(tmp_path / "s.zarr", np.ones((4, 4)), path="g/A")
    for text in (f"{tmp_path / 's.zarr'}:/g/A", str(tmp_path / "s.zarr" / "g" / "A"),
                 f"{tmp_path / 's.zarr' / 'g'}:/A"):
        assert parse_spec(text) == Spec(str(tmp_path / "s.zarr"), "/g/A", "zarr"), text


# ----- every layout read right ------------------------------------------------------------------

LAYOUTS = [
    # (codec, chunks, byte order, dtype, array path, layout bigmm reads it by)
    ("raw", (40, 50), "little", np.float64, "A", "zarr-raw"),       # uncompressed chunks
    ("raw", (40, 50), "big", np.float32, "A", "zarr-raw"),          # big-endian, swapped
    ("raw", (M, N), "little", np.float32, "", "zarr-raw"),          # one chunk, root array
    ("raw", (16, N), "little", np.float64, "g/h/A", "zarr-raw"),    # whole-row chunks, nested
    ("raw", (200, 300), "little", np.float32, "A", "zarr-raw"),     # chunks larger than it
    ("zstd", (33, 64), "little", np.float32, "A", "zarr-zstd"),     # zstd
    ("zstd", (64, 33), "big", np.float64, "A", "zarr-zstd"),        # zstd over big-endian
    ("blosc", (50, 40), "little", np.float32, "A", "zarr-blosc"),   # blosc (lz4, shuffle)
    ("blosc", (N, 7), "big", np.float64, "", "zarr-blosc"),         # thin column chunks
    ("gzip", (29, 31), "little", np.float64, "A", "zarr-gzip"),     # gzip
    ("gzip", (29, 31), "big", np.float32, "g/A", "zarr-gzip"),
    # layouts zarr-python reads for bigmm
    ("crc32c", (40, 50), "little", np.float32, "A", "zarr"),        # checksummed chunks
    ("transpose", (40, 50), "little", np.float64, "A", "zarr"),     # column-major chunks
    ("sharded", (20, 25), "big", np.float32, "A", "zarr"),          # shards of 2 x 2 chunks
]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """One store per layout: (spec, the array's data)."""
    folder = tmp_path_factory.mktemp("zarr")
    made = []
    for i, (codec, chunks, endian, dtype, path, _) in enumerate(LAYOUTS):
        data = random_matrix((M, N), dtype, seed=i)
        store = folder / f"s{i}.zarr"
        zarr_array(store, data, path=path, chunks=chunks, codec=codec, endian=endian)
        made.append((f"{store}:/{path}" if path else str(store), data))
    return made


def _regions(m, n):
    return [(0, m, 0, n), (0, 1, 0, 1), (m - 1, m, n - 1, n), (13, 101, 7, 88),
            (40, 80, 50, 100), (5, 6, 0, n), (0, m, 129, 130)]


@pytest.mark.parametrize("mapped,step", [
    (True, 4 << 20),  # raw chunks copied through maps of their files (of any size here)
    (True, 4096),     # the same in blocks of one page, each released before the next
    (False, 4 << 20), # raw chunks read with preadv, their rows gathered
])
@pytest.mark.parametrize("case", range(len(LAYOUTS)), ids=[
    f"{c}-{e}-{np.dtype(d).name}-{p or 'root'}" for c, _, e, d, p, _ in LAYOUTS])
def test_every_layout_reads_right(stores, monkeypatch, case, mapped, step):
    monkeypatch.setattr(zarrsource, "MAPPED_MIN_BYTES", 0 if mapped else 1 << 62)
    spec, data = stores[case]
    with open_input(spec, name="A", threads=3, map_step=step) as src:
        assert src._map_step == step
        assert (src._maps is not None) == (mapped and LAYOUTS[case][5] == "zarr-raw")
        assert src.layout == LAYOUTS[case][5]
        assert src.shape == (M, N) and src.dtype == np.dtype(data.dtype).newbyteorder("=")
        assert src.chunks == LAYOUTS[case][1]
        # panels align to chunks read whole; raw chunks are read in part
        assert src.panel_chunks == (None if LAYOUTS[case][5] == "zarr-raw" else src.chunks)
        for r0, r1, c0, c1 in _regions(M, N):
            out = np.full((r1 - r0, c1 - c0), np.nan, src.dtype)
            src.read(r0, r1, c0, c1, out)
            assert np.array_equal(out, data[r0:r1, c0:c1]), (r0, r1, c0, c1)


@pytest.mark.parametrize("least,mapped", [
    (40 * 50 * 8, True),      # chunk files of the threshold's size and up: through maps
    (40 * 50 * 8 + 1, False), # smaller ones: read with preadv
])
def test_raw_chunk_files_are_mapped_from_a_size_up(stores, monkeypatch, least, mapped):
    monkeypatch.setattr(zarrsource, "MAPPED_MIN_BYTES", least)
    spec, data = stores[0]  # float64 chunks of 40 x 50
    with open_input(spec, name="A", threads=3) as src:
        assert (src._maps is not None) == mapped
        out = np.full((M, N), np.nan)
        src.read(0, M, 0, N, out)
        assert np.array_equal(out, data)


@pytest.mark.parametrize("case", [i for i, c in enumerate(LAYOUTS) if c[5] != "zarr"])
def test_direct_path_equals_zarr_python(stores, case):
    spec, _ = stores[case]
    direct = open_input(spec)
    arr = zarr.open_array(parse_spec(spec).path, path=parse_spec(spec).dataset.strip("/"),
                          mode="r")
    out, ref = np.empty((M, N), direct.dtype), np.empty((M, N), direct.dtype)
    direct.read(0, M, 0, N, out)
    ZarrSource._read_zarr(direct, 0, M, 0, N, ref)  # the same region through zarr-python
    assert np.array_equal(out, ref) and np.array_equal(ref, arr[...])
    direct.close()


@pytest.fixture(scope="module")
def hypo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hypo")
    data = random_matrix((97, 83), np.float64, seed=7)
    return {codec: open_input(zarr_array(folder / f"{codec}.zarr", data, chunks=(13, 17),
                                         codec=codec, endian="big"), threads=2)
            for codec in ("raw", "zstd")}, data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_region_reads_its_elements(hypo, data):
    sources, ref = hypo
    r0 = data.draw(st.integers(0, 96))
    r1 = data.draw(st.integers(r0, 97))
    c0 = data.draw(st.integers(0, 82))
    c1 = data.draw(st.integers(c0, 83))
    for src in sources.values():
        out = np.full((r1 - r0, c1 - c0), np.nan)
        src.read(r0, r1, c0, c1, out)
        assert np.array_equal(out, ref[r0:r1, c0:c1])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 1000), min_size=1, max_size=40), st.integers(0, 20))
def test_cells_are_grouped_whole_in_runs_of_about_equal_bytes(sizes, k):
    groups = zarrsource._even_groups([(i, b) for i, b in enumerate(sizes)], k)
    assert len(groups) == max(1, min(k, len(sizes)))  # no group left empty
    assert [i for g in groups for i in g] == list(range(len(sizes)))  # in order, each once
    total, k = sum(sizes), len(groups)
    for g, group in enumerate(groups[:-1]):  # a group takes more items only below its share
        if len(group) > 1:
            assert sum(sizes[: group[-1]]) * k < total * (g + 1)


@pytest.mark.parametrize("codec", [
    "raw",   # uncompressed chunks, parts of them grouped over the threads
    "zstd",  # compressed chunks, decoded whole
])
def test_regions_split_over_reader_threads_read_right(tmp_path, monkeypatch, codec):
    monkeypatch.setattr(zarrsource, "TASK_BYTES", 64)  # many tasks even for small regions
    data = random_matrix((M, N), np.float32, seed=9)
    arr = zarr_array(tmp_path / "a.zarr", data, chunks=(13, 17), codec=codec)
    with open_input(arr, threads=3) as src:
        for r0, r1, c0, c1 in _regions(M, N):
            out = np.full((r1 - r0, c1 - c0), np.nan, np.float32)
            src.read(r0, r1, c0, c1, out)
            assert np.array_equal(out, data[r0:r1, c0:c1]), (r0, r1, c0, c1)


@pytest.mark.parametrize("codec", [
    "raw",   # uncompressed chunks, copied in part
    "zstd",  # compressed chunks, decoded whole
])
def test_reads_on_the_callers_thread_use_no_pool(tmp_path, monkeypatch, codec):
    monkeypatch.setattr(zarrsource, "TASK_BYTES", 64)
    data = random_matrix((M, N), np.float32, seed=10)
    arr = zarr_array(tmp_path / "a.zarr", data, chunks=(13, 17), codec=codec)
    with open_input(arr, threads=3) as src:
        src._pool = NoPool()
        with on_caller_thread():
            for r0, r1, c0, c1 in _regions(M, N):
                out = np.full((r1 - r0, c1 - c0), np.nan, np.float32)
                src.read(r0, r1, c0, c1, out)
                assert np.array_equal(out, data[r0:r1, c0:c1]), (r0, r1, c0, c1)
        src._pool = None
        src.read(0, M, 0, N, np.empty((M, N), np.float32))
        assert src._pool is not None


@pytest.mark.parametrize("codec,cached,advised", [
    ("raw", False, True),    # uncompressed, cold: every chunk part read ahead before the copies
    ("raw", True, False),    # uncompressed, the first part cached: the region taken as cached
    ("zstd", False, True),   # compressed, cold: the files of the region's chunks, whole
    ("zstd", True, False),   # compressed, the first file cached: the region taken as cached
])
def test_the_parts_a_region_needs_are_read_ahead(tmp_path, monkeypatch, codec, cached, advised):
    data = random_matrix((50, 40), np.float32, seed=12)
    arr = zarr_array(tmp_path / "h.zarr", data, chunks=(20, 15), codec=codec)
    os.remove(tmp_path / "h.zarr" / "c" / "1" / "1")  # a missing chunk is passed over
    monkeypatch.setattr(zarrsource, "_cached", lambda fd, offset: cached)
    calls = []
    real = os.posix_fadvise
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, off, n, advice: (
        calls.append((os.readlink(f"/proc/self/fd/{fd}"), off, n, advice)),
        real(fd, off, n, advice))[1])
    r0, r1, c0, c1 = 7, 43, 3, 34  # column parts 12, 15 and 4 wide of 15: the 4 not asked for
    with open_input(arr, threads=2) as src:
        out = np.empty((r1 - r0, c1 - c0), np.float32)
        src.read(r0, r1, c0, c1, out)
    assert np.array_equal(out, np.where(
        (np.arange(r0, r1)[:, None] // 20 == 1) & (np.arange(c0, c1)[None, :] // 15 == 1),
        0.0, data[r0:r1, c0:c1]))
    expect = set()
    for ci in range(r0 // 20, (r1 - 1) // 20 + 1):
        for cj in range(c0 // 15, (c1 - 1) // 15 + 1):
            if (ci, cj) == (1, 1):
                continue
            a0, a1 = max(r0, 20 * ci) - 20 * ci, min(r1, 20 * ci + 20) - 20 * ci
            b0, b1 = max(c0, 15 * cj) - 15 * cj, min(c1, 15 * cj + 15) - 15 * cj
            path = str(tmp_path / "h.zarr" / "c" / str(ci) / str(cj))
            if codec == "zstd":  # a compressed chunk is read whole: its file to the end
                expect.add((path, 0, 0, os.POSIX_FADV_WILLNEED))
                continue
            if 2 * (b1 - b0) < 15:  # mostly bytes the region does not need: not asked for
                continue
            lo, hi = 4 * (a0 * 15 + b0), 4 * ((a1 - 1) * 15 + b1)  # first and past last byte
            expect.add((path, lo, hi - lo, os.POSIX_FADV_WILLNEED))
    assert set(calls) == (expect if advised else set())


def test_a_refused_read_ahead_hint_changes_nothing(tmp_path, monkeypatch):
    data = random_matrix((50, 40), np.float32, seed=13)
    arr = zarr_array(tmp_path / "r.zarr", data, chunks=(20, 15))
    monkeypatch.setattr(zarrsource, "_cached", lambda fd, offset: False)
    asked = []

    def refuse(fd, off, n, advice):
        asked.append(off)
        raise OSError(errno.EIO, "hint refused")

    monkeypatch.setattr(os, "posix_fadvise", refuse)
    with open_input(arr, threads=2) as src:
        out = np.full((50, 40), np.nan, np.float32)
        src.read(0, 50, 0, 40, out)
    assert asked and np.array_equal(out, data)


@pytest.mark.skipif(not hasattr(os, "RWF_NOWAIT") or not hasattr(os, "O_DIRECT"),
                    reason="no RWF_NOWAIT reads or O_DIRECT writes here")
def test_cached_tells_bytes_in_the_page_cache(tmp_path):
    path = tmp_path / "f.bin"
    block = mmap.mmap(-1, 1 << 20)  # page-aligned, for O_DIRECT
    block.write(os.urandom(1 << 20))
    try:  # 64 MiB written around the page cache: none of it cached
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT)
    except OSError:
        pytest.skip("this file system refuses O_DIRECT")
    try:
        for i in range(64):
            os.pwrite(fd, block, i << 20)
    finally:
        os.close(fd)
    def resident(off: int) -> bool:  # the page holding byte ``off``, as mincore sees it
        return pagecache.cached_share([(str(path), off, off + 1)]) == 1.0

    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # (any pages a write did leave in the cache: dropped)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if resident(300_000):
            pytest.skip("this file system keeps the file's pages")
        os.pread(fd, 4096, 299_008)  # the page holding byte 300000, and what is read ahead
        assert resident(300_000) and zarrsource._cached(fd, 300_000)
        whole, before = [(str(path), 0, 64 << 20)], -1.0
        for _ in range(40):  # until the read-ahead the read started has landed
            now = pagecache.cached_share(whole)
            if now == before:
                break
            before = now
            time.sleep(0.05)
        # a page past what was read ahead (a probe that finds a page missing may start
        # reading it: probed once, where mincore saw it missing); read-ahead still landing
        # may bring a page in between mincore and the probe: a page the probe finds cached
        # is then in the cache after it too, and the next one is probed
        for far in (off for off in range(16 << 20, 64 << 20, 1 << 20) if not resident(off)):
            if not zarrsource._cached(fd, far):
                break
            assert resident(far), far  # found cached: there indeed
        else:
            pytest.skip("the read-ahead reached every page probed")
    finally:
        os.close(fd)


def test_missing_chunks_read_as_the_fill_value(tmp_path):
    data = random_matrix((50, 40), np.float32, seed=3)
    arr = zarr_array(tmp_path / "f.zarr", data, chunks=(20, 20), fill_value=-7.5)
    os.remove(tmp_path / "f.zarr" / "c" / "1" / "1")  # never written, as zarr leaves it
    expect = data.copy()
    expect[20:40, 20:40] = -7.5
    for src in (open_input(arr), open_input(str(tmp_path / "f.zarr"))):
        out = np.empty((50, 40), np.float32)
        src.read(0, 50, 0, 40, out)
        assert np.array_equal(out, expect)
        src.close()


BROKEN = [
    # (codec, how the chunk file is spoiled, words of the error)
    ("raw", lambda p: os.truncate(p, 100), "holds 100 bytes"),          # truncated
    ("zstd", lambda p: open(p, "r+b").write(b"garbage!"), "Expected to read"),  # corrupt
    ("gzip", lambda p: os.truncate(p, 10), "Expected to read"),         # cut short
    ("blosc", lambda p: os.truncate(p, os.path.getsize(p) - 1), "Blosc header"),  # a byte short
    ("blosc", lambda p: os.truncate(p, 0), "Blosc header"),             # emptied
]


@pytest.mark.parametrize("codec,spoil,words", BROKEN)
def test_a_spoiled_chunk_is_a_read_error(tmp_path, codec, spoil, words):
    data = random_matrix((30, 30), np.float64, seed=4)
    zarr_array(tmp_path / "b.zarr", data, chunks=(10, 10), codec=codec)
    spoil(tmp_path / "b.zarr" / "c" / "1" / "2")
    with open_input(str(tmp_path / "b.zarr")) as src:
        out = np.empty((30, 30))
        src.read(0, 10, 0, 30, out[:10])  # other chunks read
        with pytest.raises(errors.ReadError, match=words) as err:
            src.read(0, 30, 0, 30, out)
        assert "rows 0:30" in str(err.value)


@pytest.mark.parametrize("least,words", [
    (0, "shorter"),           # mapped: the map is kept, the file's size checked again
    (1 << 30, "holds 100 b"), # read with preadv: its size checked at every read
])
def test_a_raw_chunk_cut_short_after_it_was_read_is_a_read_error(tmp_path, monkeypatch, least,
                                                                  words):
    monkeypatch.setattr(zarrsource, "MAPPED_MIN_BYTES", least)
    data = random_matrix((30, 30), np.float32, seed=5)
    zarr_array(tmp_path / "b.zarr", data, chunks=(10, 10))
    with open_input(str(tmp_path / "b.zarr")) as src:
        out = np.empty((30, 30), np.float32)
        src.read(0, 30, 0, 30, out)
        assert np.array_equal(out, data)
        os.truncate(tmp_path / "b.zarr" / "c" / "1" / "2", 100)
        with pytest.raises(errors.ReadError, match=words):
            src.read(0, 30, 0, 30, out)


OPEN_ERRORS = [
    # (how the operand is made, spec suffix, error, words)
    ("none", "", errors.OperandNotFound, "no such directory"),       # no store
    ("array", ":/B", errors.OperandNotFound, "holds /A"),            # no such array
    ("array", ":/g", errors.OperandNotFound, "a group"),             # a group, not an array
    ("3d", ":/A", errors.ShapeError, "2-D"),                         # 3-D
    ("int", ":/A", errors.DtypeError, "float32, float64"),         # integers
    ("incomplete", ":/A", errors.IncompleteOutputError, "resume"),   # left by a killed run
]


@pytest.mark.parametrize("made,suffix,error,words", OPEN_ERRORS)
def test_open_errors(tmp_path, made, suffix, error, words):
    store = tmp_path / "e.zarr"
    if made != "none":
        zarr.create_group(str(store)).create_group("g")
        shape, dtype = ((4, 3, 2), "f4") if made == "3d" else ((4, 3), "i4" if made == "int"
                                                                 else "f8")
        attrs = {"bigmm_complete": False} if made == "incomplete" else {}
        zarr.create_array(str(store), name="A", shape=shape, dtype=dtype, attributes=attrs)
    with pytest.raises(error, match=words):
        open_input(f"{store}{suffix}", name="A")


def test_arrays_in_other_stores_are_read_through_zarr():
    arr = zarr.create_array(zarr.storage.MemoryStore(), shape=(9, 7), chunks=(4, 4), dtype="f8")
    data = random_matrix((9, 7), np.float64, seed=2)
    arr[...] = data
    with open_input(arr) as src:
        assert src.layout == "zarr" and "MemoryStore" in src.reason and src.where() is None
        out = np.empty((9, 7))
        src.read(0, 9, 0, 7, out)
        assert np.array_equal(out, data)


# ----- identity ---------------------------------------------------------------------------------

def _record(spec):
    with open_input(spec) as src:
        return describe(src)


CHANGES = [
    # (what happens to the array, a word of what differences() says)
    ("rewrite a chunk", "storage"),          # a chunk file rewritten (same values)
    ("edit a value", "contents"),            # a value changed in place through zarr
    ("recreate", "another file"),            # the store removed and written again
    ("attributes", "modified"),              # its metadata rewritten
]


@pytest.mark.parametrize("change,word", CHANGES)
def test_identity_sees_what_changed(tmp_path, change, word):
    data = random_matrix((60, 50), np.float32, seed=8)
    store = tmp_path / "i.zarr"
    zarr_array(store, data, chunks=(20, 25), codec="zstd")
    before = _record(str(store))
    assert differences(before, _record(str(store))) == []  # read twice: the same
    arr = zarr.open_array(str(store), mode="r+")
    if change == "rewrite a chunk":
        arr[0:20, 0:25] = data[0:20, 0:25]
        os.utime(store / "c" / "0" / "0", ns=(1, 1))
    elif change == "edit a value":
        arr[59, 49] = arr[59, 49] + 1
    elif change == "recreate":
        os.rename(store, tmp_path / "old.zarr")
        zarr_array(store, data, chunks=(20, 25), codec="zstd")
    else:
        os.utime(store / "zarr.json", ns=(2, 2))
    diff = differences(before, _record(str(store)))
    assert any(word in d for d in diff), diff


@pytest.mark.parametrize("rename", [False, True], ids=["in-place", "renamed-in"])
def test_a_chunk_rewritten_with_its_time_put_back_is_seen(tmp_path, rename):
    # 2.4 MB: sampled, by its first and last chunks; chunk (0, 1) is not among them
    data = random_matrix((600, 500), np.float64, seed=8)
    store = tmp_path / "i.zarr"
    zarr_array(store, data, chunks=(100, 100), codec="raw")
    before = _record(str(store))
    chunk = store / "c" / "0" / "1"
    st = os.stat(chunk)
    new = chunk.with_name("1.new") if rename else chunk
    new.write_bytes(np.full((100, 100), 7.0).tobytes())  # same size, other values
    if rename:
        os.replace(new, chunk)
    os.utime(chunk, ns=(st.st_atime_ns, st.st_mtime_ns))
    diff = differences(before, _record(str(store)))
    assert any("changed at" in d for d in diff), diff


def test_identity_is_by_directory_not_spelling(tmp_path):
    zarr_array(tmp_path / "s.zarr", random_matrix((20, 10), np.float64), path="g/A")
    os.symlink(tmp_path / "s.zarr", tmp_path / "link.zarr")
    a = _record(f"{tmp_path / 's.zarr'}:/g/A")
    b = _record(f"{tmp_path / 'link.zarr'}:/g/A")
    c = _record(str(tmp_path / "s.zarr" / "g" / "A"))  # the array's directory as a store
    assert differences(a, b) == [] and differences(a, c) == []


def test_chunk_files_leave_out_metadata_and_temporary_files(tmp_path):
    zarr_array(tmp_path / "c.zarr", random_matrix((20, 20), np.float32), chunks=(10, 10))
    (tmp_path / "c.zarr" / "c" / "0" / "0.bigmm-tmp").write_bytes(b"x")
    files = chunk_files(str(tmp_path / "c.zarr"))
    assert [f[0] for f in files] == [os.path.join("c", i, j) for i in "01" for j in "01"]
    assert chunk_files(str(tmp_path / "c.zarr"), limit=3) is None


def test_whole_row_raw_chunks_plan_as_contiguous_hdf5(tmp_path):
    # chunks of whole rows hold all of K: aligned to them, every K panel would be all of K
    a = random_matrix((300, 400), np.float32, seed=1)
    b = random_matrix((400, 350), np.float32, seed=2)
    zarr_array(tmp_path / "in.zarr", a, path="A", chunks=(16, 400))
    zarr_array(tmp_path / "in.zarr", b, path="B", chunks=(16, 350))
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["A"], f["B"] = a, b
    kw = dict(memory="200KiB", backend="numpy")
    by_zarr = bigmm.plan(f"{tmp_path / 'in.zarr'}:/A", f"{tmp_path / 'in.zarr'}:/B", **kw)
    by_h5 = bigmm.plan(f"{tmp_path / 'in.h5'}:/A", f"{tmp_path / 'in.h5'}:/B", **kw)
    assert (by_zarr.bm, by_zarr.bn, by_zarr.bk, by_zarr.order) == \
        (by_h5.bm, by_h5.bn, by_h5.bk, by_h5.order)
    assert by_zarr.bk < 400
