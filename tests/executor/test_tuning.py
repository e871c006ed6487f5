"""The pipeline's tuning: ranges cut into pieces in proportion to weights, on aligned edges."""

from __future__ import annotations

import pytest

from bigmm.executor.tuning import DRAIN, PIECE_ALIGN, RAMP, io_pieces, split_range

PIECES = [
    # (r0, r1, cols, threads, chunks, expected pieces)
    (0, 10, 4, 4, None, [(0, 10)]),  # small: one piece
    (0, 100, 1 << 20, 4, None, [(0, 25), (25, 50), (50, 75), (75, 100)]),  # even split
    (5, 1000, 1 << 20, 4, (64, 64), [(5, 256), (256, 512), (512, 768), (768, 1000)]),  # chunks
    (0, 3, 1 << 20, 8, None, [(0, 1), (1, 2), (2, 3)]),  # at most one piece per row
]


@pytest.mark.parametrize("r0,r1,cols,threads,chunks,expected", PIECES)
def test_panel_reads_split_on_chunk_rows(r0, r1, cols, threads, chunks, expected):
    assert io_pieces(r0, r1, cols, 4, threads, chunks) == expected


SPLITS = [
    # (n, weights, align, offset, expected pieces)
    (4096, RAMP, PIECE_ALIGN, 0, [(0, 512), (512, 1024), (1024, 2048), (2048, 4096)]),  # the
    # fill: an eighth, an eighth, a quarter, a half
    (4096, DRAIN, PIECE_ALIGN, 0, [(0, 2048), (2048, 3072), (3072, 3584), (3584, 4096)]),  # the
    # drain: the mirror image
    (1100, DRAIN, PIECE_ALIGN, 0, [(0, 512), (512, 768), (768, 1024), (1024, 1100)]),  # edges
    # on whole kernel tiles, the last piece what is left
    (200, RAMP, PIECE_ALIGN, 0, [(0, 200)]),  # shorter than one align: whole
    (10, (1, 1, 1, 1), 1, 0, [(0, 2), (2, 5), (5, 8), (8, 10)]),  # even weights, nearest edges
    (995, (1, 1, 1, 1), 64, 5, [(0, 251), (251, 507), (507, 763), (763, 995)]),  # offset 5:
    # edges where 5 + e is a multiple of 64
    (0, RAMP, PIECE_ALIGN, 0, []),  # nothing to cut
]


@pytest.mark.parametrize("n, weights, align, offset, expected", SPLITS)
def test_split_range_cuts_in_proportion_on_aligned_edges(n, weights, align, offset, expected):
    pieces = split_range(n, weights, align, offset)
    assert pieces == expected
    assert all(a < b for a, b in pieces) and all(x[1] == y[0] for x, y in zip(pieces, pieces[1:]))
