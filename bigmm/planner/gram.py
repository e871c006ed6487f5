"""What a Gram (symmetric) plan moves and computes: C = alpha * A^T A + beta * C or
alpha * A A^T + beta * C with only the tiles on and above the diagonal scheduled (see
:mod:`.schedule`).

Pure counts over a :class:`~.schedule.Plan` whose ``symmetric`` is set: the elements of C in
the upper tiles, and how many times A's elements are read for the op(A) and op(B) panels (a
diagonal tile reads no op(B) panel: it is its op(A) panel). The passes are counted exactly from
the slot schedule (the one the executor runs and the pipeline model simulates) where it has at
most EXACT_STEPS steps, and estimated from the tile grid beyond.
"""

from __future__ import annotations

#: Schedules of at most this many steps are walked to count the panels they load.
EXACT_STEPS = 1 << 16


def upper_elements(p) -> int:
    """Elements of C in the tiles i <= j (those of ``p.tiles()``, a row or column at a
    time)."""
    bm, bn, m, n = p.bm, p.bn, p.m, p.n
    rows = [min(i * bm + bm, m) - i * bm for i in range(max(p.ni, p.nj))]
    cols = [min(j * bn + bn, n) - j * bn for j in range(p.nj)]
    total = 0
    if p.row_major:  # row i: tiles j = i .. nj - 1
        right = sum(cols)
        for i in range(p.ni):
            total += rows[i] * right
            right -= cols[i] if i < p.nj else 0
        return total
    above = 0
    for j in range(p.nj):  # column j: tiles i = 0 .. j
        above += rows[j]
        total += cols[j] * above
    return total


def passes(p) -> tuple[float, float]:
    """(elements of A read for op(A) panels, for op(B) panels), each over A's elements; cached
    on the plan."""
    cached = p.__dict__.get("_gram_passes")
    if cached is None:
        cached = _counted(p) if p.n_steps <= EXACT_STEPS else _estimated(p)
        object.__setattr__(p, "_gram_passes", cached)  # frozen: cached beside the fields
    return cached


def _counted(p) -> tuple[float, float]:
    depths = [k1 - k0 for k0, k1 in p.k_panels()]
    a = b = 0
    tile = None
    for t, kp, _, load_a, _, load_b, _, (ka, kb) in p._slot_schedule():
        if t is not tile:
            tile, (rows, cols) = t, t.shape
        if load_a:
            a += rows * (kb - ka)
        if load_b:
            b += cols * depths[kp]
    return a / (p.m * p.k), b / (p.k * p.n)


def _estimated(p) -> tuple[float, float]:
    """Row-major tiles keep a row panel of A where its K panels fit (else read it per tile);
    op(B) panels of the tiles off the diagonal are read once where all of them fit, else once
    per tile (column-major: the mirror image)."""
    tiles = list(p.tiles())
    off = [t for t in tiles if t.i != t.j]
    a_keep = p.a_slots >= (p.nk if p.row_major else p.ni * p.nk)
    b_keep = p.b_slots >= (max(p.nj - 1, 1) * p.nk if p.row_major else p.nk)
    a = p.m if a_keep else sum(t.shape[0] for t in tiles)
    columns = {t.j for t in off}
    b = (sum(p.tile(0, j).shape[1] for j in columns) if b_keep
         else sum(t.shape[1] for t in off))
    return a / p.m, b / p.n
