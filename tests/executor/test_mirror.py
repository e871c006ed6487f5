"""The host mirror of Gram plans: lower triangles filled from the upper (or zeroed) and tiles
transposed, in blocks and on threads, equal to NumPy's triu/transpose bit for bit."""

from __future__ import annotations

import concurrent.futures as cf

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bigmm.executor.mirror import BLOCK, fill_lower, transposed


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3 * BLOCK + 7), zeros=st.booleans(), threads=st.sampled_from([0, 3]),
       split=st.floats(0, 1))
def test_fill_lower_matches_triu(n, zeros, threads, split):
    rng = np.random.default_rng(n)
    src = rng.standard_normal((n, n)).astype(np.float32)
    want = np.triu(src) + (0 if zeros else np.triu(src, 1).T)
    cut = int(split * n)  # two row ranges, in order, as the writer's pieces come
    with cf.ThreadPoolExecutor(threads or 1) as pool:
        fill_lower(src, 0, cut, zeros, pool if threads else None)
        fill_lower(src, cut, n, zeros, pool if threads else None)
    assert np.array_equal(src, want)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 2 * BLOCK + 3), cols=st.integers(1, 2 * BLOCK + 5),
       threads=st.sampled_from([0, 2]))
def test_transposed_matches_numpy(rows, cols, threads):
    src = np.random.default_rng(rows * cols).standard_normal((rows, cols))
    with cf.ThreadPoolExecutor(threads or 1) as pool:
        out = transposed(src, pool if threads else None)
    assert out.flags.c_contiguous and np.array_equal(out, src.T)
