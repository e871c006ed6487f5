"""Outputs chunked by the plan's C tiles: each tile is one byte range of the file."""

import os

import h5py
import numpy as np
import pytest

import bigmm
from bigmm.io import filesink as sink_mod, mapped, open_input, open_output
from bigmm.io.layout import probe_layout
from bigmm.io.filesink import tile_chunks
from bigmm.testing import random_matrix

SHAPE = (97, 61)
TILE = (20, 17)  # divides nothing: edge chunks are partly outside the dataset
JOB = {"plan": "bm=20 bn=17"}
MiB, GiB = 1 << 20, 1 << 30


@pytest.mark.parametrize("shape, tile, itemsize, want", [
    ((32768, 32768), (32768, 4096), 4, (32768, 4096)),  # the GPU job: 512 MiB chunks
    ((4096, 4096), (1024, 2048), 8, (1024, 2048)),  # 16 MiB chunks
    ((1000, 3000), (2048, 2048), 4, (1000, 2048)),  # clipped to the dataset
    ((32768, 32768), (4096, 32768), 4, None),  # full-width tiles: contiguous is one range
    ((4096, 4096), (256, 256), 4, None),  # 256 KiB tiles: too small to chunk
    (SHAPE, TILE, 4, None),  # tiny
    ((200000, 100000), (65536, 40000), 4, (16384, 40000)),  # 10 GiB tile: divisor under 4 GiB
    ((4096, 4096), None, 4, None),  # no tile given
])
def test_tile_chunks(shape, tile, itemsize, want):
    got = tile_chunks(shape, tile, itemsize)
    assert got == want
    if got is not None:
        assert got[0] * got[1] * itemsize < 4 * GiB and tile[0] % got[0] == 0 or got[0] == shape[0]


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(sink_mod, "MIN_CHUNK_BYTES", 0)  # chunk the small test outputs too


def regions():
    (m, n), (bm, bn) = SHAPE, TILE
    return [(i, j, r, min(r + bm, m), c, min(c + bn, n))
            for i, r in enumerate(range(0, m, bm)) for j, c in enumerate(range(0, n, bn))]


def write_all(sink, data, which=None):
    for i, j, r0, r1, c0, c1 in regions():
        if which is None or (i, j) in which:
            sink.write(r0, r1, c0, c1, np.ascontiguousarray(data[r0:r1, c0:c1]))


def chunk_layout(path, name="C"):
    with h5py.File(path, "r") as f:
        d = f[name]
        return d.chunks, probe_layout(d), dict(d.attrs)


def test_each_tile_is_one_chunk_and_one_range(tmp_path, small_chunks, monkeypatch):
    path = str(tmp_path / "c.h5")
    data = random_matrix(SHAPE, np.float32, seed=1)
    syncs = []
    real_sync = mapped.FileMap.sync
    monkeypatch.setattr(mapped.FileMap, "sync",
                        lambda self, lo, hi: (syncs.append((lo, hi)), real_sync(self, lo, hi)))
    with open_output(f"{path}:/C", shape=SHAPE, dtype=np.float32, inputs=[], job=JOB,
                     tile=TILE) as sink:
        assert sink.layout == "chunked" and sink.mapped
        chunks, lay, _ = chunk_layout(path)
        assert chunks == TILE and lay.kind == "chunked" and (lay.chunk_offsets >= 0).all()
        cr, cc = TILE
        for i, j, r0, r1, c0, c1 in regions():
            sink.write(r0, r1, c0, c1, np.ascontiguousarray(data[r0:r1, c0:c1]))
            syncs.clear()
            sink.commit([(i, j)])
            off = int(lay.chunk_offsets[i, j])
            # one msync: the chunk's bytes up to the tile's last element
            assert syncs == [(off, off + ((r1 - r0 - 1) * cc + (c1 - c0)) * 4)]
            if (r1 - r0, c1 - c0) == TILE:  # a whole tile: its bytes, in order, at the chunk
                assert os.pread(sink._fd, cr * cc * 4, off) == data[r0:r1, c0:c1].tobytes()
        sink.finish()
    chunks, _, attrs = chunk_layout(path)
    assert chunks == TILE and attrs["bigmm_complete"]
    with open_input(f"{path}:/C", name="C") as src:  # read back on the fast mapped path
        assert src.layout == "chunked" and src.fast and src.mapped
        out = np.full(SHAPE, np.nan, np.float32)
        src.read(0, SHAPE[0], 0, SHAPE[1], out)
    np.testing.assert_array_equal(out, data)


def test_unaligned_writes_span_chunks(tmp_path, small_chunks):
    """Regions that cut across chunks (a dataset chunked by other tiles) still land right."""
    path = str(tmp_path / "c.h5")
    data = random_matrix(SHAPE, np.float32, seed=2)
    with open_output(f"{path}:/C", shape=SHAPE, dtype=np.float32, inputs=[], job=JOB,
                     tile=TILE) as sink:
        for r0 in range(0, SHAPE[0], 33):
            for c0 in range(0, SHAPE[1], 25):
                r1, c1 = min(r0 + 33, SHAPE[0]), min(c0 + 25, SHAPE[1])
                sink.write(r0, r1, c0, c1, np.ascontiguousarray(data[r0:r1, c0:c1]))
        sink.commit([])
        sink.finish()
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["C"][...], data)


@pytest.mark.parametrize("code", [95, 22])  # EOPNOTSUPP, EINVAL: pwritev per chunk
def test_pwrite_fallback(tmp_path, small_chunks, monkeypatch, code):
    def fail(fd, offset, length):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "posix_fallocate", fail)
    path = str(tmp_path / "c.h5")
    data = random_matrix(SHAPE, np.float32, seed=3)
    with open_output(f"{path}:/C", shape=SHAPE, dtype=np.float32, inputs=[], job=JOB,
                     tile=TILE) as sink:
        assert sink.layout == "chunked" and not sink.mapped
        write_all(sink, data)
        sink.commit([])
        sink.finish()
    with h5py.File(path, "r") as f:
        assert f["C"].chunks == TILE
        np.testing.assert_array_equal(f["C"][...], data)


def test_resume_keeps_the_chunks(tmp_path, small_chunks):
    spec = f"{tmp_path}/c.h5:/C"
    data = random_matrix(SHAPE, np.float32, seed=4)
    first = {(0, 0), (1, 2), (4, 3)}
    kw = dict(shape=SHAPE, dtype=np.float32, inputs=[], job=JOB, tile=TILE)
    sink = open_output(spec, **kw)
    write_all(sink, data, first)
    sink.commit(sorted(first))
    sink.close()  # interrupted
    with open_output(spec, resume=True, **kw) as sink:
        assert sink.done == frozenset(first) and sink.layout == "chunked"
        rest = {(i, j) for i, j, *_ in regions()} - first
        write_all(sink, data, rest)
        sink.commit(sorted(rest))
        sink.finish()
    chunks, _, attrs = chunk_layout(str(tmp_path / "c.h5"))
    assert chunks == TILE and attrs["bigmm_complete"]
    with h5py.File(str(tmp_path / "c.h5"), "r") as f:
        np.testing.assert_array_equal(f["C"][...], data)


def test_overwrite_and_beta_partial_get_the_tile_layout(tmp_path, small_chunks):
    path = str(tmp_path / "c.h5")
    old, new = random_matrix(SHAPE, np.float32, seed=5), random_matrix(SHAPE, np.float32, seed=6)
    with h5py.File(path, "w") as f:
        f["C"] = old  # contiguous, written by someone else
        f["C"].attrs["units"] = "m"
    kw = dict(shape=SHAPE, dtype=np.float32, inputs=[], job=JOB, tile=TILE)
    with open_output(f"{path}:/C", reads_c=True, **kw) as sink:  # beta != 0: C kept beside
        assert chunk_layout(path, "C.bigmm-partial")[0] == TILE
        assert chunk_layout(path, "C")[0] is None
        buf = np.empty(SHAPE, np.float32)
        sink.read(0, SHAPE[0], 0, SHAPE[1], buf)
        np.testing.assert_array_equal(buf, old)
        write_all(sink, new)
        sink.commit([])
        sink.finish()
    chunks, _, attrs = chunk_layout(path)
    assert chunks == TILE and attrs["bigmm_complete"] and attrs["units"] == "m"
    with open_output(f"{path}:/C", overwrite=True, **{**kw, "tile": (40, 34)}) as sink:
        write_all(sink, old)
        sink.commit([])
        sink.finish()
    with h5py.File(path, "r") as f:
        assert f["C"].chunks == (40, 34) and list(f) == ["C"]
        np.testing.assert_array_equal(f["C"][...], old)


def test_matmul_writes_its_tiles_as_chunks_bit_identical(tmp_path, monkeypatch):
    monkeypatch.setattr(sink_mod, "MIN_CHUNK_BYTES", 0)
    path = str(tmp_path / "ab.h5")
    with h5py.File(path, "w") as f:
        f["A"] = random_matrix((300, 200), np.float64, seed=7)
        f["B"] = random_matrix((200, 250), np.float64, seed=8)
    a, b = f"{path}:/A", f"{path}:/B"
    kw = dict(memory="400KB", backend="numpy")
    p = bigmm.plan(a, b, **kw)
    assert p.bn < 250  # tiles narrower than C: chunked
    bigmm.matmul(a, b, out=f"{tmp_path}/c.h5:/C", **kw)
    monkeypatch.setattr(sink_mod, "MIN_CHUNK_BYTES", 1 << 62)  # the contiguous output
    bigmm.matmul(a, b, out=f"{tmp_path}/d.h5:/C", **kw)
    with h5py.File(f"{tmp_path}/c.h5", "r") as f, h5py.File(f"{tmp_path}/d.h5", "r") as g:
        assert f["C"].chunks == (min(p.bm, 300), p.bn) and g["C"].chunks is None
        assert f["C"][...].tobytes() == g["C"][...].tobytes()
