"""A rank-k update of a square tile's upper triangle by gemms of its upper sub-blocks: what a
backend without a syrk of its own (or of the operands' dtype) does for the diagonal tiles of
Gram plans. With ``parts`` blocks a side, ``parts * (parts + 1) / 2`` of the ``parts^2`` block
gemms are done ((parts + 1) / (2 parts) of the whole tile's flops: 0.625 with 4); the diagonal
blocks are multiplied whole."""

from __future__ import annotations

from typing import Any, Callable

from ..planner.search import even_edge

#: Blocks a side of the tile.
PARTS = 4


def upper_blocks(n: int, parts: int = PARTS) -> list[tuple[int, int, int, int]]:
    """(r0, r1, c0, c1) of the blocks on and above the diagonal of an n x n tile split into
    at most ``parts`` blocks a side (edges multiples of 8 where n allows)."""
    edge = max(1, even_edge(n, max(1, parts), 8 if n >= 8 * parts else 1))
    cuts = [(x, min(x + edge, n)) for x in range(0, n, edge)]
    return [(r0, r1, c0, c1) for bi, (r0, r1) in enumerate(cuts)
            for (c0, c1) in cuts[bi:]]


def syrk_by_blocks(gemm: Callable, a: Any, c: Any, alpha: float, beta: float, trans: bool,
                   stream: Any = None, parts: int = PARTS, diagonal: Callable | None = None
                   ) -> None:
    """The upper triangle of c = alpha * op(a) op(a)^T + beta * c through
    ``gemm(a, b, c, alpha, beta, trans_a, trans_b, stream)`` (a backend's) on views: for
    ``trans`` (a is k x n) the blocks a[:, rows]^T a[:, cols], else a[rows] a[cols]^T;
    ``diagonal(a, c, alpha, beta, trans, stream)``, where given, updates the diagonal blocks
    (a syrk of their own) instead."""
    n = c.shape[0]
    for r0, r1, c0, c1 in upper_blocks(n, parts):
        if diagonal is not None and r0 == c0:
            diagonal(a[:, r0:r1] if trans else a[r0:r1], c[r0:r1, c0:c1], alpha, beta, trans,
                     stream)
        elif trans:
            gemm(a[:, r0:r1], a[:, c0:c1], c[r0:r1, c0:c1], alpha, beta, True, False, stream)
        else:
            gemm(a[r0:r1], a[c0:c1], c[r0:r1, c0:c1], alpha, beta, False, True, stream)
