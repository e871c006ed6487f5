"""Reading a region into a buffer of another dtype: one stored narrower is read into the
buffer's own bytes and widened there, through no copy of the region; one stored wider goes
through a copy as stored."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from bigmm.executor.loads import WIDEN_TAIL, read_into
from bigmm.io.source import ArraySource
from bigmm.testing import random_matrix
from bigmm.units import numpy_dtype

WIDENED = [
    # (stored dtype, buffer dtype)
    ("float16", "float32"),   # float16 A of a float32 product
    ("bfloat16", "float32"),  # either operand of bfloat16 @ float16
    ("float32", "float64"),   # float32 A of a float64 product
    ("float16", "float64"),   # four times as wide
]


@pytest.mark.parametrize("stored, dtype", WIDENED)
def test_a_narrower_region_is_widened_within_its_buffer(stored, dtype):
    x = random_matrix((1200, 1300), numpy_dtype(stored), 3)
    target = np.empty((1024, 1100), numpy_dtype(dtype))
    tracemalloc.start()
    try:
        read_into(ArraySource(x, "A"), 100, 1124, 150, 1250, target)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert np.array_equal(target, x[100:1124, 150:1250].astype(dtype))
    assert peak <= WIDEN_TAIL * x.itemsize + (64 << 10)  # the last elements' copy at most


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (257, 255)])  # one element, a few, odd
def test_small_regions_widen_too(shape):
    x = random_matrix(shape, np.float16, 4)
    target = np.full(shape, np.nan, np.float32)
    read_into(ArraySource(x, "A"), 0, shape[0], 0, shape[1], target)
    assert np.array_equal(target, x.astype(np.float32))


def test_a_wider_region_is_rounded_through_a_copy():
    x = random_matrix((300, 200), np.float64, 5)
    target = np.empty((300, 200), np.float32)
    read_into(ArraySource(x, "C"), 0, 300, 0, 200, target)
    assert np.array_equal(target, x.astype(np.float32))
