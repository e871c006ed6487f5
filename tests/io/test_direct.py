"""O_DIRECT tile writes (bigmm.io.direct): exactly the pieces' bytes land, whatever the
alignment of the file offsets and of the source; durable after sync; the page cache takes what
cannot go direct; outputs are created page-aligned; a run writes the same bytes by every path."""

from __future__ import annotations

import errno
import mmap
import os

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bigmm
from bigmm.io import direct, filesink, open_input, open_output
from bigmm.io.layout import probe_layout
from bigmm.io.mapped import FileMap, MappedWrites
from bigmm.io.region import clip_pieces
from bigmm.testing import random_matrix

POISON = 0xAB


@pytest.fixture
def folder(tmp_path):
    if not direct.supports_direct(str(tmp_path)):
        pytest.skip("no O_DIRECT on this file system")
    return tmp_path


def poisoned_file(path, size: int) -> int:
    """A file of ``size`` poison bytes, open read-write, reserved like an output."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.pwrite(fd, bytes([POISON]) * size, 0)
    os.fsync(fd)
    return fd


def aligned(shape, dtype, shift: int = 0) -> np.ndarray:
    """A C-contiguous array whose data start ``shift`` bytes after a page boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.frombuffer(mmap.mmap(-1, nbytes + shift + mmap.PAGESIZE), np.uint8)
    return raw[shift:shift + nbytes].view(dtype).reshape(shape)


def block_pieces(base: int, block, rows, cols):
    """The pieces of region ``rows`` x ``cols`` of one stored block at byte ``base``."""
    br, bc = block
    return clip_pieces([(base, (br, bc), (0, br, 0, bc), (0, br, 0, bc))], *rows, *cols)


def expected(size: int, base: int, block, rows, cols, src) -> bytes:
    want = np.full(size, POISON, np.uint8)
    view = want[base:base + block[0] * block[1] * src.itemsize].view(src.dtype).reshape(block)
    view[rows[0]:rows[1], cols[0]:cols[1]] = src
    return want.tobytes()


def read_file(path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


# case: block (rows, columns) at byte base, region rows and columns, source shift from a page,
# DIRECT_MIN, and which counters must be non-zero
CASES = [
    # full-width rows from page 0 of a page-aligned source: one zero-copy direct run
    ("zero-copy", 0, (64, 1024), (0, 64), (0, 1024), 0, 4096, {"direct"}),
    # a chunk of narrow rows (2 KiB each, 128 KiB in all) written whole: one run, direct
    ("narrow-chunk", 0, (64, 512), (0, 64), (0, 512), 0, 64 << 10, {"direct"}),
    # the same rows from a source 16 bytes past a page (malloc's habit): the bounce buffer
    ("bounced", 0, (64, 1024), (8, 40), (0, 1024), 16, 4096, {"bounced"}),
    # a block at an odd offset: partial pages at both ends through the page cache
    ("unaligned-file", 1000, (64, 1024), (3, 61), (0, 1024), 1000, 4096,
     {"direct", "cached"}),
    # a narrow region of long rows: each row its own run, its source row off the pages
    ("long-rows", 4096, (40, 3000), (5, 17), (7, 2900), 0, 4096, {"bounced", "cached"}),
    # rows of whole pages at page offsets in file and source: each row a zero-copy run
    ("page-rows", 4096, (40, 3072), (5, 17), (0, 1024), 0, 4096, {"direct"}),
    # short rows: nothing direct
    ("short-rows", 4096, (40, 3000), (5, 17), (7, 300), 0, 4096, {"cached"}),
    # long runs below DIRECT_MIN: through the page cache
    ("below-minimum", 0, (64, 1024), (0, 64), (0, 1024), 0, 1 << 20, {"cached"}),
]


@pytest.mark.parametrize("mapped", [False, True], ids=["pwrite", "map"])
@pytest.mark.parametrize("case,base,block,rows,cols,shift,minimum,used", CASES,
                         ids=[c[0] for c in CASES])
def test_exactly_the_pieces_bytes_land(folder, monkeypatch, case, base, block, rows, cols,
                                       shift, minimum, used, mapped):
    monkeypatch.setattr(direct, "DIRECT_MIN", minimum)
    path = str(folder / "c.bin")
    size = base + block[0] * block[1] * 4 + 5000
    fd = poisoned_file(path, size)
    fmap = FileMap(fd, base, size, path=path, writable=True) if mapped else None
    w = direct.DirectWrites(fd, path, np.float32, MappedWrites(fmap, np.float32)
                            if mapped else None)
    try:
        src = aligned((rows[1] - rows[0], cols[1] - cols[0]), np.float32, shift)
        src[...] = random_matrix(src.shape, np.float32, seed=3)
        w.write(block_pieces(base, block, rows, cols), src)
        w.sync()
    finally:
        w.close()
        if fmap is not None:
            fmap.close()
        os.close(fd)
    assert read_file(path) == expected(size, base, block, rows, cols, src)
    assert {k for k, v in w.bytes.items() if v} == used, w.bytes
    assert sum(w.bytes.values()) == src.nbytes


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=st.integers(0, 3 * 4096), br=st.integers(1, 24), bc=st.integers(1, 3000),
       data=st.data(), shift=st.sampled_from([0, 8, 4000]), minimum=st.sampled_from([0, 4096]))
def test_any_piece_any_alignment(folder, base, br, bc, data, shift, minimum):
    """Any region of a block at any byte offset, from a source at any alignment: exactly its
    bytes land (nothing beside them changes)."""
    r0 = data.draw(st.integers(0, br - 1))
    r1 = data.draw(st.integers(r0 + 1, br))
    c0 = data.draw(st.integers(0, bc - 1))
    c1 = data.draw(st.integers(c0 + 1, bc))
    old = direct.DIRECT_MIN
    direct.DIRECT_MIN = minimum
    path = str(folder / "h.bin")
    size = base + br * bc * 4 + 4096
    fd = poisoned_file(path, size)
    try:
        w = direct.DirectWrites(fd, path, np.float32)
        src = aligned((r1 - r0, c1 - c0), np.float32, shift)
        src[...] = random_matrix(src.shape, np.float32, seed=br * bc)
        w.write(block_pieces(base, (br, bc), (r0, r1), (c0, c1)), src)
        w.sync()
        w.close()
    finally:
        direct.DIRECT_MIN = old
        os.close(fd)
    assert read_file(path) == expected(size, base, (br, bc), (r0, r1), (c0, c1), src)


def test_runs_of_a_piece():
    src = np.arange(6 * 10, dtype=np.float64).reshape(6, 10)
    # a piece spanning its block's full width (and the source's): one run
    full = direct.runs((800, (9, 10), (2, 8, 0, 10), (0, 6, 0, 10)), src, 8)
    assert [(o, len(v)) for o, v in full] == [(800 + 2 * 10 * 8, 6 * 10 * 8)]
    assert full[0][1].tobytes() == src.tobytes()
    # a narrower piece: one run per row, each row's columns
    rows = direct.runs((0, (9, 20), (1, 3, 4, 9), (2, 4, 3, 8)), src, 8)
    assert [(o, len(v)) for o, v in rows] == [((1 * 20 + 4) * 8, 40), ((2 * 20 + 4) * 8, 40)]
    assert rows[1][1].tobytes() == src[3, 3:8].tobytes()


def test_a_refused_alignment_goes_through_the_page_cache(folder, monkeypatch):
    """EINVAL from a direct write (a device with larger blocks): the run is written through
    the page cache, and every later one too."""
    monkeypatch.setattr(direct, "DIRECT_MIN", 4096)
    path = str(folder / "c.bin")
    size = 64 * 1024 * 4
    fd = poisoned_file(path, size)
    calls = []

    def refuse(fd_, view, offset):
        calls.append(offset)
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))

    monkeypatch.setattr(direct, "_write_direct", refuse)
    w = direct.DirectWrites(fd, path, np.float32)
    src = aligned((64, 1024), np.float32)
    src[...] = random_matrix(src.shape, np.float32, seed=4)
    try:
        w.write(block_pieces(0, (64, 1024), (0, 32), (0, 1024)), src[:32])
        w.write(block_pieces(0, (64, 1024), (32, 64), (0, 1024)), src[32:])
        w.sync()
    finally:
        w.close()
        os.close(fd)
    assert len(calls) == 1 and not w.direct
    assert read_file(path) == src.tobytes()


def test_other_write_errors_are_raised(folder, monkeypatch):
    monkeypatch.setattr(direct, "DIRECT_MIN", 4096)
    path = str(folder / "c.bin")
    fd = poisoned_file(path, 1 << 20)

    def full(fd_, view, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(direct, "_write_direct", full)
    w = direct.DirectWrites(fd, path, np.float32)
    try:
        with pytest.raises(OSError) as err:
            w.write(block_pieces(0, (64, 1024), (0, 64), (0, 1024)), aligned((64, 1024),
                                                                             np.float32))
        assert err.value.errno == errno.ENOSPC and w.direct
    finally:
        w.close()
        os.close(fd)


def test_sync_is_one_fdatasync_after_writes(folder, monkeypatch):
    path = str(folder / "c.bin")
    fd = poisoned_file(path, 1 << 20)
    syncs = []
    real = direct._fdatasync
    monkeypatch.setattr(direct, "_fdatasync", lambda f: (syncs.append(f), real(f)))
    w = direct.DirectWrites(fd, path, np.float32)
    try:
        w.sync()
        assert syncs == []  # nothing written: nothing to sync
        w.write(block_pieces(0, (64, 1024), (0, 64), (0, 1024)), aligned((64, 1024),
                                                                         np.float32))
        assert syncs == []  # writes alone are not synced
        w.sync()
        w.sync()
        assert syncs == [fd]
        monkeypatch.setattr(direct, "_fdatasync", lambda f: (_ for _ in ()).throw(
            OSError(errno.EIO, "bad")))
        w.write(block_pieces(0, (64, 1024), (0, 1), (0, 1024)), aligned((1, 1024), np.float32))
        with pytest.raises(OSError):
            w.sync()
        monkeypatch.setattr(direct, "_fdatasync", lambda f: (syncs.append(f), real(f)))
        w.sync()  # a failed sync is tried again
        assert syncs == [fd, fd]
    finally:
        w.close()
        os.close(fd)


def mounts() -> dict:
    with open("/proc/mounts") as fh:
        return {line.split()[1]: line.split()[2] for line in fh}


def test_in_memory_file_systems(tmp_path):
    for folder in (str(tmp_path), "/dev/shm"):
        if not os.path.isdir(folder):
            continue
        probe = os.path.join(folder, f"bigmm-probe-{os.getpid()}")
        fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            mount = max((m for m in mounts() if folder.startswith(m.rstrip("/") + "/")
                         or folder == m), key=len)
            assert direct.in_memory(fd) == (mounts()[mount] in ("tmpfs", "ramfs"))
        finally:
            os.close(fd)
            os.unlink(probe)


# mode, folder kind, the writes a reserved output gets
MODES = [
    ("mapped", "disk", MappedWrites),
    ("direct", "disk", direct.DirectWrites),
    ("auto", "disk", direct.DirectWrites),    # a device to bypass the page cache for
    ("auto", "memory", MappedWrites),         # tmpfs: copies into a shared map
]


@pytest.mark.parametrize("mode,kind,cls", MODES)
def test_modes_choose_the_writes(folder, monkeypatch, mode, kind, cls):
    where = str(folder)
    if kind == "memory":
        if mounts().get("/dev/shm") != "tmpfs":
            pytest.skip("no tmpfs at /dev/shm")
        where = "/dev/shm"
    monkeypatch.setattr(direct, "MODE", mode)
    path = os.path.join(where, f"bigmm-mode-{os.getpid()}.bin")
    fd = poisoned_file(path, 1 << 16)
    fmap = FileMap(fd, 0, 1 << 16, path=path, writable=True)
    try:
        w = direct.tile_writes(fd, path, fmap, np.float32)
        assert type(w) is cls
        w.close()
        unmapped = direct.tile_writes(fd, path, None, np.float32)  # the file cannot be mapped
        if cls is MappedWrites:
            assert unmapped is None  # the caller writes with pwritev
        else:
            assert type(unmapped) is cls and unmapped.cached is None
            unmapped.close()
        monkeypatch.setattr(direct, "MODE", "bogus")
        with pytest.raises(ValueError, match="MODE"):
            direct.tile_writes(fd, path, fmap, np.float32)
    finally:
        fmap.close()
        os.close(fd)
        os.unlink(path)


@pytest.mark.parametrize("shape,tile", [
    ((300, 2000), (100, 700)),   # chunked by the tiles
    ((300, 2000), (100, 2000)),  # full-width tiles: contiguous
])
def test_outputs_are_created_page_aligned(tmp_path, shape, tile):
    spec = f"{tmp_path / 'c.h5'}:/C"
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f["small"] = np.arange(7)  # something before it in the file
    sink = open_output(spec, shape=shape, dtype=np.float32, inputs=[], job={}, tile=tile)
    sink.close()
    with h5py.File(tmp_path / "c.h5", "r") as f:
        lay = probe_layout(f["C"])
    if lay.kind == "chunked":
        assert (lay.chunk_offsets % direct.ALIGN == 0).all()
    else:
        assert lay.offset % direct.ALIGN == 0


def run_job(tmp_path, monkeypatch, mode, name):
    """A run on the NumPy backend whose C tiles are chunks of several pages each."""
    monkeypatch.setattr(direct, "MODE", mode)
    made = []
    real = direct.DirectWrites.__init__

    def init(self, *args, **kwargs):
        real(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(direct.DirectWrites, "__init__", init)
    a = f"{tmp_path / 'a.h5'}:/A"
    b = f"{tmp_path / 'b.h5'}:/B"
    if not os.path.exists(tmp_path / "a.h5"):
        with h5py.File(tmp_path / "a.h5", "w") as f:
            f["A"] = random_matrix((301, 37), np.float64, seed=1)
        with h5py.File(tmp_path / "b.h5", "w") as f:
            f["B"] = random_matrix((37, 1303), np.float64, seed=2)
    out = f"{tmp_path / name}:/C"
    bigmm.matmul(a, b, out=out, memory="3000000", backend="numpy", io_threads=3)
    with open_input(out) as src:
        c = np.full(src.shape, np.nan)
        src.read(0, src.shape[0], 0, src.shape[1], c)
    return c, made


def test_a_run_writes_the_same_bytes_by_every_path(folder, monkeypatch):
    monkeypatch.setattr(filesink, "MIN_CHUNK_BYTES", 0)
    monkeypatch.setattr(direct, "DIRECT_MIN", 4096)
    c_direct, made = run_job(folder, monkeypatch, "direct", "c1.h5")
    assert made and sum(w.bytes["direct"] + w.bytes["bounced"] for w in made) > 0
    c_mapped, none = run_job(folder, monkeypatch, "mapped", "c2.h5")
    assert not none
    assert c_direct.tobytes() == c_mapped.tobytes()
    with h5py.File(folder / "a.h5", "r") as fa, h5py.File(folder / "b.h5", "r") as fb:
        ref = fa["A"][...] @ fb["B"][...]
    np.testing.assert_allclose(c_direct, ref, rtol=1e-12, atol=1e-12)


def test_commit_syncs_direct_tiles_before_journaling(folder, monkeypatch):
    """A file output with direct tiles: each commit is one fdatasync after the tiles' writes
    and before their journal line; nothing new written, no sync."""
    from bigmm.io.journal import Journal

    monkeypatch.setattr(direct, "MODE", "direct")
    monkeypatch.setattr(direct, "DIRECT_MIN", 4096)
    events = []
    real_sync, real_append = direct._fdatasync, Journal.append
    real_write = direct._write_direct
    monkeypatch.setattr(direct, "_fdatasync", lambda fd: (events.append("sync"), real_sync(fd)))
    monkeypatch.setattr(direct, "_write_direct",
                        lambda *a: (events.append("write"), real_write(*a)))
    monkeypatch.setattr(Journal, "append",
                        lambda self, rec: (events.append(rec), real_append(self, rec)))
    shape, tile = (256, 3000), (64, 1500)  # 4 x 2 tiles, each a 375 KiB chunk
    data = random_matrix(shape, np.float64, seed=5)
    spec = f"{folder / 'c.h5'}:/C"
    with open_output(spec, shape=shape, dtype=np.float64, inputs=[], job={}, tile=tile) as sink:
        assert sink.writes == "direct" and sink.parallel_writes
        for i in range(4):
            done = []
            for j in range(2):
                r0, c0 = i * tile[0], j * tile[1]
                src = aligned(tile, np.float64)
                src[...] = data[r0:r0 + tile[0], c0:c0 + tile[1]]
                sink.write(r0, r0 + tile[0], c0, c0 + tile[1], src)
                done.append((i, j))
            assert "write" in events and "sync" not in events  # writes alone: no sync
            sink.commit(done)
            assert events[-2:] == ["sync", {"tiles": [list(t) for t in done]}], events
            events.clear()
        sink.commit([])
        assert events == []  # nothing new written: no sync, no line
        sink.finish()
    with open_input(spec) as src:
        c = np.full(shape, np.nan)
        src.read(0, shape[0], 0, shape[1], c)
    assert c.tobytes() == data.tobytes()


def test_a_source_the_kernel_cannot_pin_goes_through_the_bounce_buffer(folder, monkeypatch):
    """EFAULT from a zero-copy write (memory the kernel cannot use for I/O in place): that
    run and every later one go through the bounce buffer, still direct."""
    monkeypatch.setattr(direct, "DIRECT_MIN", 4096)
    path = str(folder / "c.bin")
    fd = poisoned_file(path, 64 * 1024 * 4)
    real = direct._write_direct
    refused = []

    def write(fd_, view, offset):
        if isinstance(view, np.ndarray):  # in place from the source
            refused.append(offset)
            raise OSError(errno.EFAULT, os.strerror(errno.EFAULT))
        real(fd_, view, offset)

    monkeypatch.setattr(direct, "_write_direct", write)
    w = direct.DirectWrites(fd, path, np.float32)
    src = aligned((64, 1024), np.float32)
    src[...] = random_matrix(src.shape, np.float32, seed=6)
    try:
        w.write(block_pieces(0, (64, 1024), (0, 32), (0, 1024)), src[:32])
        w.write(block_pieces(0, (64, 1024), (32, 64), (0, 1024)), src[32:])
        w.sync()
    finally:
        w.close()
        os.close(fd)
    assert len(refused) == 1 and w.direct and not w.zero_copy
    assert w.bytes["bounced"] == src.nbytes and w.bytes["direct"] == 0
    assert read_file(path) == src.tobytes()
