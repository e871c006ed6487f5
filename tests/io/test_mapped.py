import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bigmm.io import mapped
from bigmm.io.mapped import HELD_BYTES, FileMap

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc/self/smaps (Linux)")

HEADER = 4096 + 8  # the data starts past a page boundary, like a dataset after HDF5 metadata


def mapped_rss(fm: FileMap) -> int:
    """Bytes of ``fm``'s mapping resident in this process (its /proc/self/smaps entry)."""
    start = f"{fm._addr - (fm._addr % mapped.PAGE):x}-"
    with open("/proc/self/smaps") as f:
        lines = iter(f)
        for line in lines:
            if line.startswith(start):
                for field in lines:
                    if field.startswith("Rss:"):
                        return int(field.split()[1]) * 1024
    raise AssertionError("mapping not found")


@pytest.fixture
def matrix_file(tmp_path):
    """A file holding a float32 matrix at byte HEADER; returns (path, matrix)."""
    def make(shape):
        data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        path = tmp_path / "m.bin"
        with open(path, "wb") as f:
            f.write(b"\xff" * HEADER)
            f.write(data.tobytes())
        return path, data
    return make


# (shape of the matrix in the file, region rows, region columns)
CASES = [
    ((2048, 8192), (0, 2048), (100, 740)),  # a narrow panel: every row a separate short span
    ((2048, 8192), (100, 1900), (0, 8192)),  # full rows: one long contiguous span
    ((3, 3 << 20), (1, 3), (5, (3 << 20) - 1)),  # rows of 12 MiB: blocks split the columns
    ((64, 64), (3, 60), (7, 9)),  # smaller than one block and one fault window
]


@pytest.mark.parametrize("shape,rows,cols", CASES)
@pytest.mark.parametrize("writable", [False, True])
def test_copy_holds_at_most_one_block_mapped(matrix_file, monkeypatch, shape, rows, cols,
                                             writable):
    path, data = matrix_file(shape)
    fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    try:
        nbytes = data.nbytes
        fm = FileMap(fd, HEADER, HEADER + nbytes, path=str(path), writable=writable)
        held = []
        real_drop = FileMap._drop

        def drop(self, lo, hi):  # what the copy holds mapped just before it releases pages
            held.append(mapped_rss(self))
            real_drop(self, lo, hi)

        monkeypatch.setattr(FileMap, "_drop", drop)
        view = fm.array(HEADER, shape, np.float32)[rows[0]:rows[1], cols[0]:cols[1]]
        if writable:
            new = -data[rows[0]:rows[1], cols[0]:cols[1]]
            fm.copy(view, new, view=view)
        else:
            out = np.empty(view.shape, np.float32)
            fm.copy(out, view, view=view)
            assert np.array_equal(out, data[rows[0]:rows[1], cols[0]:cols[1]])
        assert held and max(held) <= HELD_BYTES, [h >> 20 for h in held]
        assert mapped_rss(fm) == 0  # everything the copy mapped was dropped at its end
        if writable:  # the written pages left RSS, not the page cache: sync writes them
            fm.sync(HEADER, HEADER + nbytes)
            fm.close()
            back = np.frombuffer(os.pread(fd, nbytes, HEADER), np.float32).reshape(shape)
            expect = data.copy()
            expect[rows[0]:rows[1], cols[0]:cols[1]] = new
            assert np.array_equal(back, expect)
        else:
            fm.close()
    finally:
        os.close(fd)


def test_a_copy_leaves_a_neighbours_pages_mapped_for_it_to_drop(matrix_file):
    """Two pieces of the same rows copied at once: the first to finish keeps the fault window
    they share mapped (the other is copying from it); the last drops it."""
    shape = (64, 16384)  # 4 MiB of 64 KiB rows: the pieces share a fault window
    path, data = matrix_file(shape)
    fd = os.open(path, os.O_RDONLY)
    try:
        fm = FileMap(fd, HEADER, HEADER + data.nbytes, path=str(path))
        whole = fm.array(HEADER, shape, np.float32)
        first, second = whole[:32], whole[32:]
        lo, hi = mapped._bounds(second)
        grain = mapped.FAULT_GRAIN
        fm._spans["neighbour"] = (lo - lo % grain, hi + (-hi) % grain)  # copying meanwhile
        assert float(second.sum()) == float(data[32:].sum())  # its pages, mapped
        out = np.empty(first.shape, np.float32)
        fm.copy(out, first, view=first)
        assert np.array_equal(out, data[:32])
        assert mapped_rss(fm) >= min(second.nbytes, grain) // 2  # the neighbour's kept
        del fm._spans["neighbour"]
        out = np.empty(second.shape, np.float32)
        fm.copy(out, second, view=second)  # the neighbour's own copy, the last out
        assert np.array_equal(out, data[32:]) and mapped_rss(fm) == 0
        fm.close()
    finally:
        os.close(fd)


def test_pieces_copied_from_many_threads_leave_nothing_mapped(matrix_file):
    shape = (512, 8192)  # 16 MiB of 32 KiB rows, in pieces of 24 rows: windows are shared
    path, data = matrix_file(shape)
    fd = os.open(path, os.O_RDONLY)
    try:
        fm = FileMap(fd, HEADER, HEADER + data.nbytes, path=str(path))
        whole = fm.array(HEADER, shape, np.float32)
        out = np.full(shape, np.nan, np.float32)
        pieces = [(r, min(r + 24, 512), c, c + 4096) for r in range(0, 512, 24)
                  for c in (0, 4096)]

        def copy(piece):
            r0, r1, c0, c1 = piece
            view = whole[r0:r1, c0:c1]
            fm.copy(out[r0:r1, c0:c1], view, view=view)

        with ThreadPoolExecutor(8) as pool:
            for _ in range(3):
                list(pool.map(copy, pieces))
        assert np.array_equal(out, data)
        assert not fm._spans and not fm._left and mapped_rss(fm) == 0  # the last copy out
        # dropped what the others left
        fm.close()
    finally:
        os.close(fd)


def test_wider_step_copies_in_fewer_blocks(matrix_file, monkeypatch):
    """A map made with a wider step releases its pages once per wider block, and holds at
    most that block (and its fault windows) mapped."""
    shape, rows, cols = (2048, 8192), (0, 2048), (100, 740)  # 64 MiB, a narrow panel
    path, data = matrix_file(shape)
    fd = os.open(path, os.O_RDONLY)
    try:
        drops = {}
        for step in (mapped.STEP_BYTES, 16 << 20):
            fm = FileMap(fd, HEADER, HEADER + data.nbytes, path=str(path), step=step)
            held = []
            real_drop = FileMap._drop

            def drop(self, lo, hi):
                held.append(mapped_rss(self))
                real_drop(self, lo, hi)

            monkeypatch.setattr(FileMap, "_drop", drop)
            view = fm.array(HEADER, shape, np.float32)[rows[0]:rows[1], cols[0]:cols[1]]
            out = np.empty(view.shape, np.float32)
            fm.copy(out, view, view=view)
            monkeypatch.setattr(FileMap, "_drop", real_drop)
            assert np.array_equal(out, data[rows[0]:rows[1], cols[0]:cols[1]])
            assert fm.held_bytes == step + 2 * mapped.FAULT_GRAIN
            assert max(held) <= fm.held_bytes, [h >> 20 for h in held]
            assert mapped_rss(fm) == 0
            drops[step] = len(held)
            fm.close()
        # 64 MiB of file: about 16 blocks of 4 MiB, 4 of 16 MiB (and a final release each)
        assert drops[16 << 20] <= 6 < 14 <= drops[mapped.STEP_BYTES], drops
    finally:
        os.close(fd)


def test_step_below_a_page_is_refused(matrix_file):
    path, data = matrix_file((64, 64))
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match="step=100"):
            FileMap(fd, HEADER, HEADER + data.nbytes, path=str(path), step=100)
    finally:
        os.close(fd)


def _files(tmp_path, count, size):
    paths = []
    for i in range(count):
        p = tmp_path / f"f{i}"
        p.write_bytes(np.arange(size // 4, dtype=np.float32).tobytes() if i % 2 == 0
                      else np.full(size // 4, i, np.float32).tobytes())
        paths.append(str(p))
    return paths


def test_file_maps_are_kept_and_reused_up_to_the_limit(tmp_path):
    paths = _files(tmp_path, 6, 4 * 4096)
    maps = mapped.FileMaps(4 * 4096, limit=3)
    first = {}
    for p in paths[:3]:
        with maps.use(p) as fmap:
            first[p] = fmap
    for p in paths[:3]:  # a second use gets the same map, its file still open
        with maps.use(p) as fmap:
            assert fmap is first[p]
            os.fstat(fmap.fd)
    with maps.use(paths[0]):  # in use: never closed, even as the least recently used
        for p in paths[3:]:
            i = paths.index(p)
            with maps.use(p) as fmap:  # each map shows its own file
                assert fmap.array(4, (1, 2), np.float32).tolist() == [[1, 2] if i % 2 == 0
                                                                       else [i, i]]
        assert len(maps) == 3 and paths[0] in maps._maps
    # the maps dropped were closed
    gone = [m for p, m in first.items() if p not in maps._maps]
    assert gone
    assert all(m._bytes is None for m in gone)
    assert all(m._bytes is not None for p, m in first.items() if p in maps._maps)
    maps.close()
    assert len(maps) == 0


@pytest.mark.parametrize("spoil,error,words", [
    # (what happens to the file, the error, words of it)
    (lambda p: os.remove(p), None, ""),                       # missing: None, not an error
    (lambda p: os.truncate(p, 100), OSError, "holds 100 bytes"),  # another size when mapped
])
def test_file_maps_of_missing_or_wrong_files(tmp_path, spoil, error, words):
    (path,) = _files(tmp_path, 1, 8192)
    spoil(path)
    maps = mapped.FileMaps(8192)
    if error is None:
        with maps.use(path) as fmap:
            assert fmap is None
    else:
        with pytest.raises(error, match=words), maps.use(path):
            pass
    assert len(maps) == 0


def test_a_kept_map_of_a_file_cut_short_raises_instead_of_sigbus(tmp_path):
    (path,) = _files(tmp_path, 1, 8192)
    maps = mapped.FileMaps(8192)
    with maps.use(path) as fmap:
        assert fmap.array(0, (2,), np.float32).tolist() == [0, 1]
    os.truncate(path, 4096)
    with pytest.raises(mapped.FileShortError, match="shorter"), maps.use(path):
        pass
    maps.close()


def test_file_maps_from_many_threads(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    paths = _files(tmp_path, 8, 4096)
    maps = mapped.FileMaps(4096, limit=4)

    def read(i):
        p = paths[i % len(paths)]
        with maps.use(p) as fmap:
            return p, float(fmap.array(4, (1,), np.float32)[0])

    with ThreadPoolExecutor(8) as pool:
        for p, value in pool.map(read, range(400)):
            i = paths.index(p)
            assert value == (1.0 if i % 2 == 0 else float(i))
    assert len(maps) <= 4
    maps.close()
