"""Gram (symmetric) plans: only tiles on and above the diagonal, square tiles, diagonal tiles
loading no B panel, counts of flops and bytes equal to what the schedule does, and the model
counting the same."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bigmm.errors import PlanError
from bigmm.planner import Rates, make_plan, simulate
from bigmm.planner.gram import _counted, _estimated

RATES = Rates(flops=48e12, read_bytes=30e9, write_bytes=5e9, h2d_bytes=50e9,
              memory_bytes=2.9e12, per_step=2e-5)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 700), k=st.integers(1, 900), trans=st.booleans(),
       budget=st.integers(20_000, 3_000_000), order=st.sampled_from([None, "stream",
                                                                     "resident-a", "resident-b"]))
def test_symmetric_schedule_invariants(n, k, trans, budget, order):
    try:
        p = make_plan(n, n, k, "float64", trans_a=trans, trans_b=not trans,
                      device_budget=budget, symmetric=True, order=order)
    except Exception as e:  # a budget too small for any plan
        assert type(e).__name__ == "BudgetError"
        return
    assert p.bm == p.bn
    tiles = list(p.tiles())
    assert all(t.i <= t.j for t in tiles) and len(tiles) == p.n_tiles == p.ni * (p.ni + 1) // 2
    # every element on or above the diagonal is in exactly one tile
    assert sum(sum(1 for r in range(t.r0, t.r1) for c in range(t.c0, t.c1) if c >= r)
               for t in tiles) == n * (n + 1) // 2
    steps = list(p.steps())
    assert len(steps) == p.n_steps
    a = b = flops = 0
    for s in steps:
        rows, cols = s.tile.shape
        depth = s.k1 - s.k0
        if s.tile.i == s.tile.j:
            assert not s.load_b  # op(B)'s panel is op(A)'s
            flops += rows * (rows + 1) * depth
        else:
            flops += 2 * rows * cols * depth
        a += s.load_a * rows * depth
        b += s.load_b * cols * depth
    assert flops == p.flops == n * (n + 1) * k
    assert p.bytes_read == round(8 * (a + b))
    assert p.bytes_written == 8 * n * n


@pytest.mark.parametrize("n,k,budget", [
    (600, 400, 400_000),  # several tiles, A re-read per tile
    (300, 5000, 100_000_000),  # one tile: A once, no B slots
])
def test_estimate_bounds_the_count(n, k, budget):
    p = make_plan(n, n, k, "float32", trans_a=True, device_budget=budget, symmetric=True)
    a, b = _counted(p)
    ea, eb = _estimated(p)
    assert ea >= a - 1e-9 and eb >= b - 1e-9 and ea + eb <= 2 * (a + b) + 1


def test_tall_skinny_streams_a_once():
    p = make_plan(4096, 4096, 2_000_000, "float32", trans_a=True, device_budget=60 << 30,
                  host_budget=16 << 30, rates=RATES, symmetric=True, in_place="AB")
    g = make_plan(4096, 4096, 2_000_000, "float32", trans_a=True, device_budget=60 << 30,
                  host_budget=16 << 30, rates=RATES, in_place="AB")
    assert p.n_tiles == 1 and p.b_slots == 0 and p.bytes_read == 4 * 4096 * 2_000_000
    assert g.bytes_read == 2 * p.bytes_read and 2 * p.flops == g.flops + 2 * 4096 * 2_000_000
    # the model counts no B panel and the diagonal's half flops: about half the time
    assert p.predicted_seconds < 0.6 * g.predicted_seconds
    sim = simulate(p, RATES)
    assert sim.end <= p.predicted_seconds * 1.01
    assert "Gram (symmetric)" in str(p) and "the upper triangle" in str(p)


def test_symmetric_needs_square_c_and_opposite_transposes():
    with pytest.raises(PlanError, match="opposite transposes"):
        make_plan(100, 100, 50, trans_a=True, trans_b=True, device_budget=1 << 20,
                  symmetric=True)
    with pytest.raises(PlanError, match="square C"):
        make_plan(100, 90, 50, trans_a=True, device_budget=1 << 20, symmetric=True)
    with pytest.raises(PlanError, match="upper=True only"):
        make_plan(100, 100, 50, trans_a=True, device_budget=1 << 20, upper=True)
