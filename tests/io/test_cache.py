"""Page-cache residency of files, as the planner's rates ask for it."""

from __future__ import annotations

import os

import pytest

from bigmm.io.cache import resident_fraction


def test_a_file_just_read_is_resident(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(os.urandom(8 << 20))
    path.read_bytes()  # in the page cache now (written and read back)
    assert resident_fraction(str(path)) >= 0.9


def test_a_dropped_file_is_not_resident(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(os.urandom(8 << 20))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    f = resident_fraction(str(path))
    if f is not None and f > 0.5:
        pytest.skip(f"this file system keeps pages after DONTNEED (tmpfs): {f:.2f} resident")
    assert f is not None and f <= 0.5


@pytest.mark.parametrize("name", [
    "missing.bin",  # no such file
    "empty.bin",    # nothing to be resident
])
def test_unknown_residency_is_none(tmp_path, name):
    if name == "empty.bin":
        (tmp_path / name).write_bytes(b"")
    assert resident_fraction(str(tmp_path / name)) is None
