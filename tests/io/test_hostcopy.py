import platform
import shutil
import tempfile

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bigmm
from bigmm.io import hostcopy

X86 = platform.machine().lower() in ("x86_64", "amd64")
CC = shutil.which("cc") is not None


def framed(shape, dtype, pad=(3, 5)):
    """A view of ``shape`` inside a larger array filled with sevens (its rows pitched, its
    start off any alignment), and the larger array."""
    big = np.full((shape[0] + 2 * pad[0], shape[1] + 2 * pad[1]), 7, dtype)
    return big[pad[0]:pad[0] + shape[0], pad[1]:pad[1] + shape[1]], big


@pytest.mark.parametrize("shape, dtype", [
    ((513, 1031), np.float32),  # rows of 4124 bytes: not whole lines, pitched
    ((300, 4097), np.float64),  # rows past a line by one element
    ((1, 262147), np.float32),  # one long row
    ((70000, 1), np.float64),  # one element a row: rows of 8 bytes
    ((257, 2050), np.float16),
    ((129, 4099), ml_dtypes.bfloat16),
    ((1000, 300), np.dtype(">f4")),  # big-endian both sides: the same bytes
])
def test_a_copy_has_the_source_s_values_and_touches_nothing_else(shape, dtype):
    rng = np.random.default_rng(1)
    src_view, _ = framed(shape, dtype, pad=(1, 2))
    src_view[...] = rng.standard_normal(shape).astype(dtype)
    dest, big = framed(shape, dtype)
    before = big.copy()
    hostcopy.copy(dest, src_view)
    assert np.array_equal(dest, src_view)
    mask = np.ones(big.shape, bool)
    mask[3:3 + shape[0], 5:5 + shape[1]] = False
    assert np.array_equal(big[mask], before[mask])


@pytest.mark.skipif(not (X86 and CC), reason="streams on x86-64 with a C compiler")
def test_large_rows_stream_on_x86_with_a_compiler():
    assert hostcopy.kind() == "stream", hostcopy.why_numpy()
    dest, src = np.empty((600, 700)), np.ones((600, 700))
    assert hostcopy._rows(dest, src) == (600, 5600, 5600, 5600)


@pytest.mark.parametrize("case", [
    "small",  # under MIN_BYTES
    "columns",  # rows not contiguous (a Fortran-ordered source)
    "cast",  # dtypes differ: NumPy converts
    "overlap",  # source and destination share memory
    "broadcast",  # a scalar source
])
def test_what_is_not_plain_rows_goes_through_numpy_alike(case):
    rng = np.random.default_rng(2)
    n = 512
    base = rng.standard_normal((n, n + 8))
    if case == "small":
        src, dest = base[:8, :8], np.empty((8, 8))
    elif case == "columns":
        src, dest = np.asfortranarray(base[:, :n]), np.empty((n, n))
    elif case == "cast":
        src, dest = base[:, :n], np.empty((n, n), np.float32)
    elif case == "overlap":
        both = base[:, :n].copy()
        src, dest = both[:, :n - 8], both[:, 8:]
    else:
        src, dest = np.float64(3.5), np.empty((n, n))
    expect = np.empty(dest.shape, dest.dtype)
    expect[...] = np.array(src)  # a copy of the source as it was
    assert hostcopy._rows(dest, src) is None
    hostcopy.copy(dest, src)
    assert np.array_equal(dest, expect)


def test_numpy_is_used_when_asked(monkeypatch):
    monkeypatch.setenv(hostcopy.MODE_ENV, "numpy")
    assert hostcopy.kind() == "numpy"
    assert hostcopy.why_numpy() == f"{hostcopy.MODE_ENV}=numpy"
    dest, src = np.empty((600, 700)), np.arange(420000.0).reshape(600, 700)
    assert hostcopy._streamer() is None
    hostcopy.copy(dest, src)
    assert np.array_equal(dest, src)


@pytest.mark.skipif(not X86, reason="the library is built on x86-64 only")
def test_a_missing_compiler_leaves_numpy_copies(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("BIGMM_CACHE_DIR", str(tmp_path / "cache"))
    why = len(hostcopy._WHY)
    assert hostcopy._load() is None
    assert "could not compile hostcopy.c" in hostcopy._WHY[why]
    del hostcopy._WHY[why:]


@pytest.mark.skipif(not (X86 and CC), reason="streams on x86-64 with a C compiler")
def test_a_cache_directory_that_cannot_be_made_builds_in_a_temporary_one(monkeypatch,
                                                                        tmp_path):
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv("BIGMM_CACHE_DIR", str(tmp_path / "file" / "cache"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    tempfile.tempdir = None  # TMPDIR read again
    try:
        lib = hostcopy._load()
    finally:
        tempfile.tempdir = None
    assert lib is not None and lib.bigmm_streams() == 1
    assert not list((tmp_path / "tmp").iterdir())  # the process's own copy removed once loaded
    # a second process finds the library built by the first
    monkeypatch.setenv("BIGMM_CACHE_DIR", str(tmp_path / "cache"))
    assert hostcopy._load() is not None
    built = list((tmp_path / "cache").iterdir())
    assert hostcopy._load() is not None and list((tmp_path / "cache").iterdir()) == built
    assert [p.suffix for p in built] == [".so"]



@pytest.mark.skipif(not X86, reason="the library is built on x86-64 only")
def test_a_build_that_does_not_load_leaves_no_temporary_directory(monkeypatch, tmp_path):
    cc = tmp_path / "cc"  # a "compiler" whose output is not a shared library
    cc.write_text('#!/bin/sh\nwhile [ "$1" != -o ]; do shift; done\necho garbage > "$2"\n')
    cc.chmod(0o755)
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("BIGMM_CACHE_DIR", str(tmp_path / "file" / "cache"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    why = len(hostcopy._WHY)
    tempfile.tempdir = None  # TMPDIR read again
    try:
        assert hostcopy._load() is None
    finally:
        tempfile.tempdir = None
    assert "could not load" in hostcopy._WHY[why]
    del hostcopy._WHY[why:]
    assert not list((tmp_path / "tmp").iterdir())

def test_a_run_from_arrays_into_an_array_is_right_with_streamed_copies():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((700, 900))
    b = rng.standard_normal((900, 650))
    c = np.full((700, 650), np.nan)
    bigmm.matmul(a, b, c, backend="numpy", memory="8MiB")
    np.testing.assert_allclose(c, a @ b, rtol=1e-12, atol=1e-10)


@given(rows=st.integers(1, 9), cols=st.integers(1, 700), item=st.sampled_from([1, 2, 4, 8]),
       offsets=st.tuples(st.integers(0, 70), st.integers(0, 70)),
       pitches=st.tuples(st.integers(0, 90), st.integers(0, 90)))
@settings(max_examples=300, deadline=None)
def test_rows_of_any_length_and_alignment_copy_exactly(rows, cols, item, offsets, pitches):
    """Every row length and both starts off any alignment, with the streamed path taken
    for copies of any size (each row's head, whole lines and tail)."""
    dtype = np.dtype(f"u{item}")
    rng = np.random.default_rng(rows * 1000 + cols)
    views = []
    for off, pitch in zip(offsets, pitches):
        width = cols + pitch
        start = off * item + (off % 3)  # also starts off the element grid of the buffer
        flat = rng.integers(0, 255, start + rows * width * item, np.uint8)
        views.append(flat[start:start + rows * width * item].view(dtype).reshape(
            rows, width)[:, :cols])
    src, dest = views
    before_dest = dest.copy()
    assert not np.array_equal(before_dest, src) or cols * rows < 4
    saved = hostcopy.MIN_BYTES
    hostcopy.MIN_BYTES = 0
    try:
        plain = hostcopy._rows(dest, src) is not None
        hostcopy.copy(dest, src)
    finally:
        hostcopy.MIN_BYTES = saved
    assert plain or not (X86 and CC)
    assert np.array_equal(dest, src)


@pytest.mark.parametrize("step", [
    1,  # a contiguous vector: one row
    2,  # every other element: NumPy
])
def test_vectors(step):
    src = np.arange(300000, dtype=np.float64)[::step]
    dest = np.full(src.shape, np.nan)
    assert (hostcopy._rows(dest, src) is not None) == (step == 1 and hostcopy.kind() == "stream")
    hostcopy.copy(dest, src)
    assert np.array_equal(dest, src)
