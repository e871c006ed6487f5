import os
import sys

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
