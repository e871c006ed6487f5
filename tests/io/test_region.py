"""Regions of a file output written by other processes (:mod:`bigmm.io.region`): a pickled
RawRegion written whole by write_region, or sub-region by sub-region through a RegionSink, and
journaled by the output's own sink."""

import errno
import os
import pickle

import h5py
import numpy as np
import pytest

from bigmm.errors import BigmmError, ShapeError, WriteError
from bigmm.io import open_input
from bigmm.io import filesink
from bigmm.io import direct as direct_io
from bigmm.io import mapped as mapped_io
from bigmm.io import region as region_mod
from bigmm.io.region import write_region
from bigmm.testing import random_matrix
from sink_cases import BM, BN, SHAPE, fallocate_fails, new_sink, read_back, region, tiles


def write_from_elsewhere(sink, data, which):
    """Write tiles the way another process does: a pickled RawRegion and write_region."""
    for t in which:
        r0, r1, c0, c1 = region(t)
        where = pickle.loads(pickle.dumps(sink.raw_region(r0, r1, c0, c1)))
        assert where.shape == (r1 - r0, c1 - c0) and len(pickle.dumps(where)) < 2048
        write_region(where, np.ascontiguousarray(data[r0:r1, c0:c1]))


RAW_REGION_CASES = [
    # (output chunks, whether posix_fallocate works, beta != 0)
    # contiguous, reserved and mapped by the sink
    (None, True, False),
    # chunked by other tiles: every region cuts across chunks, several pieces each
    ((16, 11), True, False),
    # chunked by the regions' own tiles: one piece each
    ((BM, BN), True, False),
    # no posix_fallocate: the sink itself would write with pwritev
    (None, False, False),
    # beta != 0: regions lie in the partial dataset while old C stays readable
    ((BM, BN), True, True),
]


@pytest.mark.parametrize("chunks,fallocate,reads_c", RAW_REGION_CASES)
def test_raw_regions_written_elsewhere(tmp_path, inputs, monkeypatch, chunks, fallocate,
                                       reads_c):
    _, srcs = inputs
    path = str(tmp_path / "c.h5")
    spec = f"{path}:/C"
    old, new = random_matrix(SHAPE, np.float32, seed=30), random_matrix(SHAPE, np.float32, seed=31)
    if reads_c:
        with h5py.File(path, "w") as f:
            f["C"] = old
    monkeypatch.setattr(filesink, "MIN_CHUNK_BYTES", 0)
    if not fallocate:
        fallocate_fails(monkeypatch, errno.EOPNOTSUPP)
    sink = new_sink(spec, srcs, reads_c=reads_c, tile=chunks)
    assert sink.mapped == fallocate
    with h5py.File(path, "r") as f:
        assert f[sink.target].chunks == chunks
    pieces = {t: len(sink.raw_region(*region(t)).pieces) for t in tiles()}
    if chunks in (None, (BM, BN)):
        assert set(pieces.values()) == {1}
    else:
        assert min(pieces.values()) > 1
    half = tiles()[:5]
    write_from_elsewhere(sink, new, half)
    sink.commit(half)
    sink.close()  # crash: the written tiles are journaled, old C is intact
    if reads_c:
        np.testing.assert_array_equal(read_back(spec), old)
    with new_sink(spec, srcs, reads_c=reads_c, resume=True) as sink:
        assert sink.done == frozenset(half)
        rest = [t for t in tiles() if t not in sink.done]
        write_from_elsewhere(sink, new, rest)
        sink.commit(rest)
        sink.finish()
    np.testing.assert_array_equal(read_back(spec), new)


def test_no_raw_regions_through_h5py(tmp_path, inputs):
    """Outputs written through h5py (or arrays) have no raw regions: only the sink writes."""
    _, srcs = inputs
    assert new_sink(None, []).raw_region(0, BM, 0, BN) is None
    with h5py.File(tmp_path / "d.h5", "w") as f:
        d = f.create_dataset("C", shape=SHAPE, dtype="f4", chunks=(9, 9), compression="gzip")
        assert new_sink(d, srcs).raw_region(0, BM, 0, BN) is None
    path = str(tmp_path / "c.h5")
    new_sink(f"{path}:/C", srcs).close()
    with h5py.File(path, "r+") as f:  # a filtered dataset in its place
        del f["C"]
        f.create_dataset("C", shape=SHAPE, dtype="f4", chunks=(8, 8), compression="gzip")
    with new_sink(f"{path}:/C", srcs, resume=True) as sink:
        assert sink.layout == "h5py" and sink.raw_region(0, BM, 0, BN) is None


def test_write_region_errors(tmp_path, inputs):
    _, srcs = inputs
    path = str(tmp_path / "c.h5")
    with new_sink(f"{path}:/C", srcs) as sink:
        with pytest.raises(ShapeError, match="Expected"):
            sink.raw_region(0, SHAPE[0] + 1, 0, BN)  # outside C
        where = sink.raw_region(0, BM, 0, BN)
    with pytest.raises(ShapeError, match=r"\(20, 17\)"):  # a tile of another shape
        write_region(where, np.zeros((BM, BN + 1), np.float32))
    with pytest.raises(ShapeError, match="float32"):  # or dtype
        write_region(where, np.zeros((BM, BN), np.float64))
    os.remove(path)
    with pytest.raises(WriteError) as err:  # the file is gone
        write_region(where, np.zeros((BM, BN), np.float32))
    assert f"rows 0:{BM}, columns 0:{BN}" in str(err.value) and "c.h5" in str(err.value)


def sub_regions(h, w):
    """A region split three ways: the top half, and the bottom half in two column parts."""
    return [(0, h // 2, 0, w), (h // 2, h, 0, w // 3), (h // 2, h, w // 3, w)]


REGION_SINK_CASES = [
    # (output chunks, beta != 0)
    # contiguous C: every sub-region is strided rows of the file
    (None, False),
    # chunked by other tiles: regions and their sub-regions cut across chunks
    ((16, 11), False),
    # chunked by the regions' own tiles: each sub-region lies in one chunk
    ((BM, BN), False),
    # beta != 0: old C read through the region's sink, the new values go to the partial dataset
    ((BM, BN), True),
    ((16, 11), True),
]


#: writes mode (bigmm.io.direct.MODE), whether the region's rows can be mapped, and the path
#: the region's sink then takes
REGION_WRITES = [
    ("mapped", True, "mapped"),    # copies into a map of the region's rows, msync in commit
    ("mapped", False, "pwritev"),  # the file cannot be mapped: pwritev, fdatasync in commit
    ("direct", True, "direct"),    # O_DIRECT runs (short ones into the map), fdatasync
    ("direct", False, "direct"),   # O_DIRECT runs, short ones by pwrite, fdatasync
]


@pytest.mark.parametrize("mode,mapped,writes", REGION_WRITES)
@pytest.mark.parametrize("chunks,reads_c", REGION_SINK_CASES)
def test_region_sink_writes_sub_regions(tmp_path, inputs, monkeypatch, chunks, reads_c, mode,
                                        mapped, writes):
    """A RegionSink (what a dask worker's executor writes to) writes each sub-region at its
    byte offsets and nothing else, reads old C from its source, and makes what it wrote
    durable in commit, once."""
    _, srcs = inputs
    path = str(tmp_path / "c.h5")
    spec = f"{path}:/C"
    old, new = random_matrix(SHAPE, np.float32, seed=32), random_matrix(SHAPE, np.float32, seed=33)
    if reads_c:
        with h5py.File(path, "w") as f:
            f["C"] = old
    if writes == "direct" and not direct_io.supports_direct(str(tmp_path)):
        pytest.skip("no O_DIRECT on this file system")
    monkeypatch.setattr(filesink, "MIN_CHUNK_BYTES", 0)
    monkeypatch.setattr(direct_io, "MODE", mode)
    monkeypatch.setattr(direct_io, "DIRECT_MIN", 0)  # every run with a whole page goes direct
    syncs = []
    real_sync, real_msync = region_mod._fdatasync, mapped_io.MappedWrites.sync
    real_dsync = direct_io._fdatasync
    monkeypatch.setattr(region_mod, "_fdatasync", lambda fd: (syncs.append(fd), real_sync(fd)))
    monkeypatch.setattr(direct_io, "_fdatasync", lambda fd: (syncs.append(fd), real_dsync(fd)))
    monkeypatch.setattr(mapped_io.MappedWrites, "sync",
                        lambda self: (syncs.append(self), real_msync(self)))
    per_commit = 2 if (writes, mapped) == ("direct", True) else 1  # msync and fdatasync

    def no_map(*args, **kwargs):
        raise OSError(errno.ENODEV, "no mapping here")

    def stored():
        with h5py.File(path, "r") as f:
            return f[sink.target][...]

    with new_sink(spec, srcs, reads_c=reads_c, tile=chunks) as sink:
        for n, t in enumerate(tiles()):
            r0, r1, c0, c1 = region(t)
            where = pickle.loads(pickle.dumps(sink.raw_region(r0, r1, c0, c1)))
            prior = open_input(np.ascontiguousarray(old[r0:r1, c0:c1])) if reads_c else None
            before = stored() if n == 0 else None
            with monkeypatch.context() as mp:
                if not mapped:
                    mp.setattr(region_mod, "FileMap", no_map)
                rs = region_mod.RegionSink(where, prior)
            with rs:
                assert rs.shape == (r1 - r0, c1 - c0) and rs.done == frozenset()
                assert rs.mapped == mapped and rs.writes == writes
                assert rs.parallel_writes == (writes != "pwritev")
                for a, b, c, d in sub_regions(*rs.shape):
                    # the sub-region's pieces are C's own pieces of it
                    assert region_mod.clip_pieces(where.pieces, a, b, c, d) == \
                        sink._pieces(r0 + a, r0 + b, c0 + c, c0 + d)
                    if reads_c:
                        buf = np.full((b - a, d - c), np.nan, np.float32)
                        rs.read(a, b, c, d, buf)
                        np.testing.assert_array_equal(buf, old[r0 + a:r0 + b, c0 + c:c0 + d])
                    rs.write(a, b, c, d,
                             np.ascontiguousarray(new[r0 + a:r0 + b, c0 + c:c0 + d]))
                assert syncs == []  # writes alone are not synced
                rs.commit([t])
                assert len(syncs) == per_commit  # one msync (fdatasync) makes it durable
                rs.commit([t])
                rs.finish()
                assert len(syncs) == per_commit  # nothing written since: no sync
                syncs.clear()
            if n == 0:  # exactly the region's bytes changed
                want = before.copy()
                want[r0:r1, c0:c1] = new[r0:r1, c0:c1]
                np.testing.assert_array_equal(stored(), want)
        sink.commit(tiles())
        sink.finish()
    np.testing.assert_array_equal(read_back(spec), new)


def test_region_sink_errors(tmp_path, inputs):
    _, srcs = inputs
    path = str(tmp_path / "c.h5")
    with new_sink(f"{path}:/C", srcs) as sink:
        where = sink.raw_region(BM, 2 * BM, BN, 2 * BN)
    with region_mod.RegionSink(where) as rs:
        with pytest.raises(BigmmError, match="old C"):  # beta != 0 needs a source of old C
            rs.read(0, 2, 0, 2, np.zeros((2, 2), np.float32))
        with pytest.raises(ShapeError, match="within"):  # outside the region
            rs.write(0, BM + 1, 0, 2, np.zeros((BM + 1, 2), np.float32))
        with pytest.raises(ShapeError, match=r"\(2, 3\)"):
            rs.write(0, 2, 0, 3, np.zeros((2, 2), np.float32))
    os.remove(path)
    with pytest.raises(WriteError) as err:  # the file is gone
        region_mod.RegionSink(where)
    assert f"rows {BM}:{2 * BM}, columns {BN}:{2 * BN}" in str(err.value)
