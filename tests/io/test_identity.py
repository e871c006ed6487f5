"""What identifies an operand's data (file, object, storage, fingerprint) and where an operand
lies (HDF5 objects, mapped file ranges, memory), on real files, links, maps and shared memory."""

from __future__ import annotations

import hashlib
import mmap
import os
from multiprocessing import shared_memory

import h5py
import hdf5plugin
import ml_dtypes
import numpy as np
import pytest

import bigmm
from bigmm.io import open_input
from bigmm.io import identity
from bigmm.io.identity import (SAMPLE_MAX, WrittenFingerprint, _mappings, array_footprint,
                               describe, differences, fingerprint, mappings_once, overlaps,
                               sample_regions)
from bigmm.errors import OutputIsInputError
from bigmm.testing import random_matrix, relative_error, tolerance

SHAPE = (301, 257)  # multiples of nothing; 600 KiB of float64: sampled, not hashed whole


def write(path, data, **storage):
    with h5py.File(path, "a") as f:
        if "A" in f:
            del f["A"]
        f.create_dataset("A", data=data, **storage)


def ident(spec, **kw):
    with open_input(spec, name="A") as src:
        return describe(src, **kw)


# storage of A: contiguous, chunked, gzip and zstd (read raw), lz4 (read through h5py)
STORAGE = [
    {},                                     # contiguous
    {"chunks": (64, 50)},                   # chunked, unfiltered
    {"chunks": (64, 50), "compression": "gzip"},  # deflate, inflated by bigmm
    {"chunks": (64, 50), **hdf5plugin.Zstd()},    # a plugin filter bigmm decodes
    {"chunks": (64, 50), **hdf5plugin.LZ4()},     # a plugin filter, read by h5py
]


@pytest.mark.parametrize("storage", STORAGE, ids=["contiguous", "chunked", "gzip", "zstd",
                                                  "lz4"])
def test_identity_is_stable_and_sees_changes(tmp_path, storage):
    path = str(tmp_path / "a.h5")
    data = random_matrix(SHAPE, np.float64, seed=1)
    write(path, data, **storage)
    rec = ident(f"{path}:/A")
    assert differences(rec, ident(f"{path}:/A")) == []  # read twice: the same
    # the same file by other spellings: relative path, symlink, hard link
    os.symlink(path, tmp_path / "link.h5")
    os.link(path, tmp_path / "hard.h5")
    here = os.getcwd()
    try:
        os.chdir(tmp_path)
        for spelling in ("a.h5:/A", "link.h5:/A", "hard.h5:/A", "./sub/../a.h5:/A"):
            os.makedirs("sub", exist_ok=True)
            assert differences(rec, ident(spelling)) == [], spelling
    finally:
        os.chdir(here)
    # regenerated with another seed (same shape, same storage): another object, new contents
    write(path, random_matrix(SHAPE, np.float64, seed=2), **storage)
    assert differences(rec, ident(f"{path}:/A"))


def test_in_place_edit_is_seen_by_the_file_and_by_the_samples(tmp_path):
    path = str(tmp_path / "a.h5")
    write(path, random_matrix(SHAPE, np.float64, seed=1))
    rec = ident(f"{path}:/A")
    with h5py.File(path, "r+") as f:
        f["A"][151, 3] += 1.0  # one element the samples (every tenth row here) miss
    diff = differences(rec, ident(f"{path}:/A"))
    assert len(diff) == 1 and "modified" in diff[0], diff
    # where the run writes this file too (C beside A), its times are not compared, and its
    # contents are hashed whole: the edit of one element is seen
    rec = ident(f"{path}:/A", volatile=True)
    assert differences(rec, ident(f"{path}:/A", volatile=True), volatile=True) == []
    with h5py.File(path, "r+") as f:
        f["A"][151, 3] += 1.0
    diff = differences(rec, ident(f"{path}:/A", volatile=True), volatile=True)
    assert diff == ["different contents (the hash of all its data differs)"]


def edit_keeping_time(path):
    st = os.stat(path)
    with h5py.File(path, "r+") as f:
        f["A"][151, 3] += 1.0  # one element the samples miss
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def external_raw(tmp_path):
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("A", data=random_matrix(SHAPE, np.float64, seed=1),
                         external=[(str(tmp_path / "raw.bin"), 0, SHAPE[0] * SHAPE[1] * 8)])
    return tmp_path / "raw.bin"


def virtual(tmp_path):
    write(str(tmp_path / "src.h5"), random_matrix(SHAPE, np.float64, seed=1))
    with h5py.File(tmp_path / "a.h5", "w") as f:
        layout = h5py.VirtualLayout(shape=SHAPE, dtype=np.float64)
        layout[:] = h5py.VirtualSource(str(tmp_path / "src.h5"), "A", shape=SHAPE)
        f.create_virtual_dataset("A", layout)
    return tmp_path / "src.h5"


def edit_raw(path):
    with open(path, "r+b") as f:
        f.seek((151 * SHAPE[1] + 3) * 8)
        f.write(np.float64(7.0).tobytes())


# where A's data changes, how, and a word of what differences() says
ELSEWHERE = [
    (lambda tmp: write(str(tmp / "a.h5"), random_matrix(SHAPE, np.float64, seed=1))
     or tmp / "a.h5", edit_keeping_time, "changed at"),  # its own file, time put back
    (external_raw, edit_raw, "raw.bin"),  # its external raw file
    (virtual, lambda p: write(str(p), random_matrix(SHAPE, np.float64, seed=2)),
     "src.h5"),  # a virtual dataset's source file
]


@pytest.mark.parametrize("make, change, word", ELSEWHERE, ids=["time-put-back", "external",
                                                                "virtual"])
def test_changes_to_the_files_holding_the_data_are_seen(tmp_path, make, change, word):
    path = make(tmp_path)
    rec = ident(f"{tmp_path / 'a.h5'}:/A")
    assert differences(rec, ident(f"{tmp_path / 'a.h5'}:/A")) == []
    change(path)
    diff = differences(rec, ident(f"{tmp_path / 'a.h5'}:/A"))
    assert any(word in d for d in diff), diff


def test_a_new_mode_or_link_is_not_an_edit(tmp_path):
    path = str(tmp_path / "a.h5")
    write(path, random_matrix(SHAPE, np.float64, seed=1))
    rec = ident(f"{path}:/A")
    os.chmod(path, 0o444)
    os.link(path, tmp_path / "hard.h5")
    assert differences(rec, ident(f"{path}:/A")) == []


def test_a_replaced_file_is_another_file(tmp_path):
    path = str(tmp_path / "a.h5")
    data = random_matrix(SHAPE, np.float64, seed=1)
    write(path, data)
    rec = ident(f"{path}:/A")
    write(str(tmp_path / "new.h5"), data)  # the same bytes, another file moved in its place
    os.replace(tmp_path / "new.h5", path)
    diff = differences(rec, ident(f"{path}:/A"))
    assert len(diff) == 1 and "another file" in diff[0] and "replaced" in diff[0]


def test_arrays_are_identified_by_their_contents():
    a = random_matrix(SHAPE, np.float32, seed=3)
    with open_input(a) as src:
        rec = describe(src)
    with open_input(a.copy()) as src:
        assert differences(rec, describe(src)) == []
    b = a.copy()
    b[-1, -1] += 1  # the last element is always sampled
    with open_input(b) as src:
        assert differences(rec, describe(src)) == [
            "different contents (the hash of the sampled blocks differs)"]


@pytest.mark.parametrize("shape, chunks, total", [
    ((100, 100), None, 100 * 100 * 4),             # small: hashed whole
    ((5000, 3000), None, 5000 * 3000 * 4),         # row segments
    ((5000, 3000), (512, 512), 5000 * 3000 * 4),   # whole chunks
    ((70000, 70000), (1, 70000), 70000**2 * 4),     # one-row chunks wider than the budget
    ((200000, 7), None, 200000 * 7 * 8),            # tall and narrow
])
def test_samples_cover_the_ends_within_a_budget(shape, chunks, total):
    regions = sample_regions(shape, total // (shape[0] * shape[1]), chunks, total)
    assert regions[0][0] == 0 and regions[0][2] == 0  # the first element
    assert any(r1 == shape[0] and c1 == shape[1] for _, r1, _, c1 in regions)  # the last
    read = sum((r1 - r0) * (c1 - c0) for r0, r1, c0, c1 in regions) * (total // np.prod(shape))
    assert read <= max(2 * SAMPLE_MAX, 2 * shape[1] * 4), read
    for r0, r1, c0, c1 in regions:
        assert 0 <= r0 < r1 <= shape[0] and 0 <= c0 < c1 <= shape[1]


def test_fingerprint_reads_a_sliver_of_a_large_operand():
    big = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (40000, 40000), (0, 0))
    reads = []

    class Counting:
        shape, dtype, chunks = big.shape, np.dtype(np.float32), None

        def read(self, r0, r1, c0, c1, out):
            reads.append((r1 - r0) * (c1 - c0) * 4)
            out[...] = 0

    fingerprint(Counting())
    assert sum(reads) <= SAMPLE_MAX < 40000**2 * 4 / 700


@pytest.mark.parametrize("shape", [(3, 140000), (700, 600)])  # rows over 1 MiB; whole rows
def test_whole_fingerprint_hashes_the_data_in_order_a_piece_at_a_time(tmp_path, shape):
    # read in pieces into one buffer (rows in bands, a long row in parts): the hash is still
    # that of all the data in row-major order, little-endian
    data = random_matrix(shape, np.float64, seed=2)
    write(str(tmp_path / "a.h5"), data.astype(">f8"))  # big-endian: converted as hashed
    with open_input(f"{tmp_path}/a.h5:/A", name="A") as src:
        h = hashlib.blake2b(f"{shape[0]}x{shape[1]}:{src.dtype.str}".encode(), digest_size=16)
        h.update(data.astype("<f8").tobytes())
        assert fingerprint(src, whole=True) == h.hexdigest()


# ----- footprints -------------------------------------------------------------------------

def test_hdf5_objects_by_any_link_are_the_same(tmp_path):
    path = str(tmp_path / "in.h5")
    with h5py.File(path, "w") as f:
        f["A"] = random_matrix((20, 30), np.float64)
        f["B"] = random_matrix((20, 30), np.float64, seed=1)
        f["soft"] = h5py.SoftLink("/A")
        f["hard"] = f["A"]
    with h5py.File(tmp_path / "ext.h5", "w") as f:
        f["ext"] = h5py.ExternalLink(path, "/A")
    os.link(path, tmp_path / "alias.h5")
    with open_input(f"{path}:/A") as a:
        fa = a.footprint()
        for spec in (f"{path}:/soft", f"{path}:/hard", f"{tmp_path}/ext.h5:/ext",
                     f"{tmp_path}/alias.h5:/A"):
            with open_input(spec) as other:
                assert overlaps(fa, other.footprint()), spec
        with open_input(f"{path}:/B") as b:  # another dataset of the same file
            assert not overlaps(fa, b.footprint())


def test_maps_of_one_file_overlap_by_bytes(tmp_path):
    path = tmp_path / "raw.bin"
    np.arange(4096, dtype=np.float64).tofile(path)
    x = np.memmap(path, np.float64, "r", shape=(64, 64))
    y = np.memmap(path, np.float64, "r+", shape=(32, 64), offset=32 * 64 * 8)  # rows 32:64
    z = np.memmap(path, np.float64, "r+", shape=(16, 64))  # rows 0:16
    assert not np.may_share_memory(x, y)  # two mappings: NumPy cannot tell
    assert overlaps(array_footprint(x), array_footprint(y))
    assert overlaps(array_footprint(x[40:]), array_footprint(y))
    assert not overlaps(array_footprint(x[:32]), array_footprint(y))
    assert not overlaps(array_footprint(z), array_footprint(y))


def test_maps_of_a_device_are_memory_not_file_bytes(tmp_path):
    # two maps of /dev/zero (as a GPU driver's node maps page-locked host memory) at offset 0
    # share nothing; two maps of one regular file at disjoint offsets are an input and an
    # output that share nothing either
    fd = os.open("/dev/zero", os.O_RDWR)
    maps = [mmap.mmap(fd, 1 << 20, mmap.MAP_PRIVATE) for _ in range(2)]
    os.close(fd)
    a = np.frombuffer(maps[0], np.float64, 300 * 200).reshape(300, 200)
    c = np.frombuffer(maps[1], np.float64, 300 * 300).reshape(300, 300)
    a[...] = random_matrix((300, 200), np.float64, seed=3)
    c[...] = np.nan
    assert not overlaps(array_footprint(a), array_footprint(c))
    bigmm.matmul(a, a.T.copy(), c, backend="numpy", gram=False)
    assert relative_error(c, a @ a.T) <= tolerance(np.float64, 200)
    path = tmp_path / "raw.bin"
    random_matrix((128, 64), np.float64, seed=4).tofile(path)
    x = np.memmap(path, np.float64, "r", shape=(64, 64))  # rows 0:64 in, rows 64:128 out
    y = np.memmap(path, np.float64, "r+", shape=(64, 64), offset=64 * 64 * 8)
    y[...] = np.nan
    b = random_matrix((64, 64), np.float64, seed=5)
    bigmm.matmul(x, b, y, backend="numpy")
    assert relative_error(y, np.asarray(x) @ b) <= tolerance(np.float64, 64)
    with pytest.raises(OutputIsInputError, match="mapping bytes of the same file"):
        bigmm.matmul(x, b, np.memmap(path, np.float64, "r+", shape=(64, 64), offset=8),
                     backend="numpy")
    del a, c, x, y
    for m in maps:
        m.close()


def test_shared_memory_mapped_twice_overlaps():
    shm = shared_memory.SharedMemory(create=True, size=64 * 64 * 4)
    other = shared_memory.SharedMemory(name=shm.name)
    try:
        a = np.ndarray((64, 64), np.float32, buffer=shm.buf)
        b = np.ndarray((64, 64), np.float32, buffer=other.buf)
        assert not np.may_share_memory(a, b)
        assert overlaps(array_footprint(a), array_footprint(b))
        c = np.ndarray((64, 64), np.float32)
        assert not overlaps(array_footprint(a), array_footprint(c))
        del a, b
    finally:
        other.close()
        shm.close()
        shm.unlink()


def test_footprints_name_files_among_many_anonymous_mappings(tmp_path):
    # thousands of anonymous mappings (as in a CUDA process) are skipped, a file's is found
    path = tmp_path / "raw.bin"
    np.arange(4096, dtype=np.float64).tofile(path)
    anonymous = [mmap.mmap(-1, mmap.PAGESIZE) for _ in range(2000)]
    try:
        x = np.memmap(path, np.float64, "r", shape=(64, 64))
        fp = array_footprint(x)
        st = os.stat(path)
        assert fp.files == ((st.st_dev, st.st_ino),)
        assert (st.st_dev, st.st_ino) in fp.within  # the file and the folders above it
        assert fp.ranges == ((st.st_dev, st.st_ino, 0, x.nbytes),)
        assert all(ino for *_, ino, _path in _mappings())
        del x
    finally:
        for m in anonymous:
            m.close()


def test_a_jobs_array_footprints_read_the_mappings_once(tmp_path, monkeypatch):
    reads = []
    real = identity._read_mappings
    monkeypatch.setattr(identity, "_read_mappings", lambda: reads.append(1) or real())
    a, b = random_matrix((40, 30), np.float32, seed=1), random_matrix((30, 20), np.float32)
    c = np.empty((40, 20), np.float32)
    bigmm.matmul(a, b, c, backend="numpy")
    assert not reads  # NumPy's own memory: no file maps it
    path = tmp_path / "raw.bin"
    (np.arange(64 * 64, dtype=np.float32) / 4096).tofile(path)
    bigmm.matmul(np.memmap(path, np.float32, "r", shape=(64, 64))[:40, :30], b, c,
                 backend="numpy")
    assert len(reads) == 1  # A, B and C: one snapshot
    ref = (np.arange(64 * 64, dtype=np.float64) / 4096).reshape(64, 64)[:40, :30] @ b
    assert np.allclose(c, ref, rtol=1e-5, atol=1e-5)
    x = np.memmap(path, np.float32, "r+", shape=(64, 64))
    with mappings_once():
        with mappings_once():  # nested: the same snapshot
            assert overlaps(array_footprint(x), array_footprint(x[32:]))
    assert len(reads) == 2
    y = np.memmap(path, np.float32, "r+", shape=(64, 64))  # mapped after that snapshot
    assert overlaps(array_footprint(x), array_footprint(y))  # outside it: read afresh
    assert len(reads) == 4
    del x, y


def test_views_of_one_array_share_memory():
    a = random_matrix((50, 40), np.float32)
    assert overlaps(array_footprint(a), array_footprint(a.T[::2]))
    assert not overlaps(array_footprint(a), array_footprint(a.copy()))
    assert array_footprint(a).ranges == ()  # private memory: no file
    # a view of a buffer that is not NumPy's (a shared map of /dev/zero): its mapping found
    buf = mmap.mmap(-1, 64 * 64 * 4)
    x = np.frombuffer(buf, np.float32).reshape(64, 64)
    assert overlaps(array_footprint(x), array_footprint(x[10:20]))
    assert len(array_footprint(x).ranges) == 1
    del x
    buf.close()


@pytest.mark.parametrize("a, c, shared", [
    ((slice(None), slice(0, 200)), (slice(None), slice(200, None)), False),  # side by side
    ((slice(None), slice(0, None, 2)), (slice(None), slice(1, None, 2)), False),  # interleaved
    ((slice(0, None, 2), slice(None)), (slice(1, None, 2), slice(None)), False),  # alternate rows
    ((slice(None), slice(0, 201)), (slice(None), slice(200, None)), True),  # one column shared
    ((slice(None), slice(0, None, 2)), (slice(None), slice(0, None, 4)), True),  # every 4th
])
def test_views_of_one_buffer_overlap_only_where_they_share_an_element(a, c, shared):
    work = random_matrix((200, 400), np.float32, seed=3)
    assert bool(overlaps(array_footprint(work[a]), array_footprint(work[c]))) == shared


def test_views_too_hard_to_tell_apart_are_refused(monkeypatch):
    work = np.zeros((200, 400), np.float32)
    monkeypatch.setattr(identity, "SHARE_WORK", 0)  # NumPy gives up at once: counted as shared
    assert overlaps(array_footprint(work[:, 0::2]), array_footprint(work[:, 1::2]))


@pytest.mark.parametrize("cols_a, cols_c", [
    (slice(0, 200), slice(200, None)),          # C beside A in one buffer
    (slice(0, None, 2), slice(1, None, 2)),     # C's columns between A's
])
def test_matmul_into_a_disjoint_view_of_the_inputs_buffer(cols_a, cols_c):
    work = random_matrix((200, 400), np.float32, seed=4)
    a, b = work[:, cols_a].copy(), random_matrix((200, 200), np.float32, seed=5)
    out = bigmm.matmul(work[:, cols_a], b, out=work[:, cols_c], memory="256KiB",
                       backend="numpy")
    assert np.shares_memory(out, work)  # written in place
    assert relative_error(work[:, cols_c], a.astype(np.float64) @ b) <= tolerance(np.float32, 200)
    np.testing.assert_array_equal(work[:, cols_a], a)  # A untouched
    with pytest.raises(OutputIsInputError, match="sharing memory"):  # a real overlap
        bigmm.matmul(work[:, :200], b, out=work[:, 199:399], backend="numpy")


# ----- the fingerprint of an output, taken as it is written ----------------------------------

@pytest.mark.parametrize("shape, chunks, dtype", [
    ((700, 650), None, np.float32),         # row segments
    ((700, 650), (128, 96), np.float32),    # whole chunks' first rows, chunks cut by the tiles
    ((90, 70), None, np.float64),           # small: hashed whole
    ((1500, 400), (1500, 1), np.float16),   # one-column chunks
    ((600, 800), (64, 800), "bfloat16"),    # whole-row chunks; compared by bits
])
def test_written_fingerprint_is_the_fingerprint_read_back(shape, chunks, dtype):
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    data = random_matrix(shape, np.float32, seed=5).astype(dt)
    taken = WrittenFingerprint(shape, dt, chunks)
    rng = np.random.default_rng(7)
    rows, cols = np.unique(rng.integers(1, shape[0], 6)), np.unique(rng.integers(1, shape[1], 5))
    rows, cols = [0, *rows, shape[0]], [0, *cols, shape[1]]
    cells = [(a, b, c, d) for a, b in zip(rows, rows[1:]) for c, d in zip(cols, cols[1:])]
    rng.shuffle(cells)
    for r0, r1, c0, c1 in cells[:-1]:
        taken.add(r0, r1, c0, c1, data[r0:r1, c0:c1].copy())
    r0, r1, c0, c1 = cells[-1]
    if shape[0] * shape[1] > 90 * 70:  # a region the samples miss leaves the digest open
        assert taken.digest() is None or not any(
            a < r1 and b > r0 and c < c1 and d > c0
            for a, b, c, d in sample_regions(shape, dt.itemsize, chunks, data.nbytes))
    taken.add(r0, r1, c0, c1, np.full((r1 - r0, c1 - c0), np.nan, dt))  # written twice:
    taken.add(r0, r1, c0, c1, data[r0:r1, c0:c1].copy())                # the last counts

    class Src:
        def read(self, r0, r1, c0, c1, out):
            out[...] = data[r0:r1, c0:c1]

    Src.shape, Src.dtype, Src.chunks = shape, dt, chunks
    assert taken.digest() == fingerprint(Src())


def test_written_fingerprint_needs_every_sampled_element():
    shape = (700, 650)
    data = random_matrix(shape, np.float32, seed=6)
    taken = WrittenFingerprint(shape, np.float32, None)
    taken.add(0, 700, 0, 650, data)
    assert taken.digest() is not None
    taken = WrittenFingerprint(shape, np.float32, None)
    taken.add(0, 700, 0, 649, data[:, :649])  # the last column (and element) never written
    taken.add(0, 699, 649, 650, data[:699, 649:])
    assert taken.digest() is None
