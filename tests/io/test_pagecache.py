"""What the page cache holds of an input's files, sampled with mincore, and the disk a path is
on: real files, read into the cache and dropped from it."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest

from bigmm.io import open_input, pagecache
from bigmm.testing import evict, random_matrix

MiB = 1 << 20


def _read(path):
    with open(path, "rb") as f:
        while f.read(8 * MiB):
            pass


@pytest.mark.parametrize("ranges, samples, window, expect", [
    ([(0, 100)], 20, 10, [(0, 0, 100)]),                 # shorter than the windows: all of it
    ([(0, 30), (5, 5), (7, 27)], 8, 10, [(0, 0, 30), (2, 7, 27)]),  # empty ranges left out
    ([(0, 1000)], 3, 10, [(0, 0, 10), (0, 495, 505), (0, 990, 1000)]),  # first, middle, last
    # two files end to end, at their own offsets; a window at a file's end is cut there
    ([(100, 600), (0, 500)], 3, 10, [(0, 100, 110), (0, 595, 600), (1, 490, 500)]),
])
def test_windows_spread_over_the_ranges(ranges, samples, window, expect):
    assert pagecache.windows(ranges, samples, window) == expect


def test_windows_of_no_bytes():
    assert pagecache.windows([(5, 5)]) == []


def test_cached_share_of_a_file_read_and_dropped(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(np.random.default_rng(0).bytes(48 * MiB + 123))
    _read(path)
    size = os.path.getsize(path)
    assert pagecache.cached_share([(str(path), 0, size)]) == 1.0
    evict(path)
    share = pagecache.cached_share([(str(path), 0, size)])
    if share > 0.5:
        pytest.skip("this file system keeps the file's pages (a memory file system)")
    assert share < 0.1
    with open(path, "rb") as f:  # the second half read again: about half cached
        f.seek(size // 2)
        while f.read(8 * MiB):
            pass
    assert 0.4 < pagecache.cached_share([(str(path), 0, size)]) < 0.6


def test_cached_share_without_files(tmp_path):
    assert pagecache.cached_share([]) is None
    assert pagecache.cached_share([(str(tmp_path / "missing"), 0, 100)]) is None
    (tmp_path / "empty").write_bytes(b"")
    assert pagecache.cached_share([(str(tmp_path / "empty"), 0, 0)]) is None


def test_an_hdf5_input_names_its_dataset_bytes(tmp_path):
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("A", data=random_matrix((203, 157), seed=1))
    src = open_input(f"{path}:/A")
    try:
        ((p, lo, hi),) = src.stored_files()
        assert p == os.path.realpath(path) and hi - lo == 203 * 157 * 4
        assert pagecache.cached_share(src.stored_files()) == 1.0  # just written
    finally:
        src.close()
    assert open_input(random_matrix((4, 4), seed=1)).stored_files() == ()


def test_device_of_a_path_not_made_yet(tmp_path):
    here = pagecache.device(str(tmp_path))
    assert here is not None and ":" in here
    assert pagecache.device(str(tmp_path / "new" / "c.h5")) == here


def test_a_zarr_input_names_a_sample_of_its_chunk_files(tmp_path, monkeypatch):
    import zarr

    from bigmm.io import zarrsource

    monkeypatch.setattr(zarrsource, "STORED_SAMPLE", 5)
    z = zarr.create_array(str(tmp_path / "a.zarr"), shape=(203, 157), chunks=(20, 40),
                          dtype="f4")
    z[:] = random_matrix((203, 157), seed=2)
    src = open_input(f"{tmp_path}/a.zarr")
    try:
        files = src.stored_files()
        # 11 x 4 chunk files, every 8th named: 6 of them, each whole
        assert len(files) == 6 and all(lo == 0 and hi == os.path.getsize(p) > 0
                                       for p, lo, hi in files)
        assert pagecache.cached_share(files) == 1.0
    finally:
        src.close()
