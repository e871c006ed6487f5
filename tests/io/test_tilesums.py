"""Samples of written tiles: spans inside their tile, a mirror's spans read where the mirror
was written, and their count bounded for runs of many tiles."""

from __future__ import annotations

import numpy as np
import pytest

from bigmm.io import tilesums
from bigmm.testing import random_matrix


# tiles of 1 x 1, a single row, ragged, wider than a span
@pytest.mark.parametrize("region", [(5, 6, 7, 8), (0, 1, 0, 200), (3, 40, 11, 20),
                                    (100, 357, 64, 1000)])
def test_spans_lie_inside_their_tile(region):
    r0, r1, c0, c1 = region
    found = tilesums.spans(r0, r1, c0, c1, tilesums.SPANS)
    assert 1 <= len(found) <= tilesums.SPANS
    for r, c, n in found:
        assert r0 <= r < r1 and c0 <= c and c + n <= c1 and 0 < n <= tilesums.SPAN
    assert len({tuple(s) for s in found}) == len(found)
    assert tilesums.spans(r0, r0, c0, c1, 4) == []


def read_from(c):
    return lambda found: [c[r, col:col + n] for r, col, n in found]


@pytest.mark.parametrize("mirror", [None, "mirror", "upper"])
def test_a_sample_reads_back_from_the_matrix_it_was_written_into(mirror):
    rng = np.random.default_rng(5)
    c = np.full((90, 90), np.nan)
    r0, r1, c0, c1 = 10, 40, 45, 88
    tile = rng.standard_normal((r1 - r0, c1 - c0))
    c[r0:r1, c0:c1] = tile
    if mirror is not None:  # written at (c0:c1, r0:r1) too
        c[c0:c1, r0:r1] = tile.T if mirror == "mirror" else 0.0
    found, h = tilesums.take((r0, r1, c0, c1), tile, np.float32, 3, mirror)
    assert len(found) == (6 if mirror else 3)
    c32 = c.astype(np.float32)
    assert tilesums.changed({(0, 1): [found, h]}, read_from(c32)) == []
    r, col, n = found[-1]
    c32[r, col + n - 1] += 1.0  # one element of the last span
    assert tilesums.changed({(0, 1): [found, h]}, read_from(c32)) == [(0, 1)]


def test_runs_of_many_tiles_take_fewer_spans_per_tile():
    assert tilesums.per_tile(1) == tilesums.SPANS
    assert tilesums.per_tile(66381) == 1
    for total in (1, 10, 5000, 10**6):
        assert total * tilesums.per_tile(total) <= max(tilesums.READ_SPANS, total)


def test_the_hash_sees_the_bytes_not_the_values():
    x = random_matrix((1, 64), np.float32, seed=2)[0]
    y = x.copy()
    y[3] = np.float32(-0.0) if x[3] == 0 else -x[3]
    assert tilesums.digest([x]) != tilesums.digest([y])
    assert tilesums.digest([x]) == tilesums.digest([x.copy()])


def _parts(rows: int, cols: int, rng) -> list[tuple[int, int, int, int]]:
    """The region cut into sub-rectangles at random row and column edges."""
    re = np.unique(np.r_[0, rng.integers(1, rows, 3), rows]) if rows > 1 else np.r_[0, rows]
    ce = np.unique(np.r_[0, rng.integers(1, cols, 3), cols]) if cols > 1 else np.r_[0, cols]
    return [(a, b, c, d) for a, b in zip(re, re[1:]) for c, d in zip(ce, ce[1:])]


# a ragged tile cut into random parts, a single row, a 1 x 1 tile, a tile wider than a span
@pytest.mark.parametrize("region", [(100, 357, 64, 1000), (7, 8, 0, 300), (5, 6, 7, 8),
                                    (0, 40, 0, 130)])
def test_a_region_sampled_part_by_part_is_sampled_as_a_whole(region):
    rng = np.random.default_rng(sum(region))
    r0, r1, c0, c1 = region
    tile = random_matrix((r1 - r0, c1 - c0), np.float32, seed=3)
    sampler = tilesums.Sampler(region, np.float32, tilesums.SPANS)
    parts = _parts(r1 - r0, c1 - c0, rng)
    rng.shuffle(parts)
    assert sampler.sample() is None
    for a, b, c, d in parts:
        sampler.add(a, b, c, d, tile[a:b, c:d].copy())
    assert sampler.sample() == tilesums.take(region, tile, np.float32, tilesums.SPANS)


def test_a_region_sampled_before_every_part_is_written_has_no_sample():
    region = (0, 64, 0, 256)
    tile = random_matrix((64, 256), np.float64, seed=4)
    sampler = tilesums.Sampler(region, np.float64, 2)
    sampler.add(0, 64, 0, 128, tile[:, :128])
    assert sampler.sample() is None
    sampler.add(0, 64, 128, 256, tile[:, 128:])
    assert sampler.sample() == tilesums.take(region, tile, np.float64, 2)
