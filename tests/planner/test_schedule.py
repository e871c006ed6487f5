"""The schedule: every C element written once, K covered once, panels loaded into free slots,
the plan printed and serialised, its predicted time taken from the rates it holds."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_cases import plan_or_none, problems, resident_c, whole

from bigmm.planner import make_plan
from bigmm.errors import PlanError


@settings(max_examples=150, deadline=None)
@given(problems())
def test_every_c_element_is_written_by_exactly_one_tile(kw):
    plan = plan_or_none(kw)
    if plan is None:
        return
    rows = [0] * plan.m
    cover = {}
    for t in plan.tiles():
        assert 0 <= t.r0 < t.r1 <= plan.m and 0 <= t.c0 < t.c1 <= plan.n
        cover[t.index] = cover.get(t.index, 0) + 1
        if t.j == 0:
            for r in range(t.r0, t.r1):
                rows[r] += 1
    assert all(v == 1 for v in cover.values()) and len(cover) == plan.n_tiles
    assert rows == [1] * plan.m
    cols = sorted((t.c0, t.c1) for t in plan.tiles() if t.i == 0)
    assert cols[0][0] == 0 and cols[-1][1] == plan.n
    assert all(a[1] == b[0] for a, b in zip(cols, cols[1:]))


@settings(max_examples=150, deadline=None)
@given(problems())
def test_k_panels_cover_k_once_and_budgets_hold(kw):
    plan = plan_or_none(kw)
    if plan is None:
        return
    panels = plan.k_panels()
    assert panels[0][0] == 0 and panels[-1][1] == plan.k
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(panels, panels[1:]))
    assert plan.device_bytes <= plan.device_budget
    assert plan.host_bytes <= plan.host_budget


@settings(max_examples=100, deadline=None)
@given(st.one_of(problems(), resident_c(), whole()), st.sampled_from([None, "", "A", "BC", "ABC"]))
def test_host_slots_list_each_staged_buffer_once_the_first_steps_first(kw, ops):
    plan = plan_or_none(dict(kw, in_place=ops))
    if plan is None:
        return
    slots = plan.host_slots()
    firsts = [f for *_, f in slots]
    assert firsts == sorted(firsts, reverse=True)  # the first step's buffers lead
    assert sum(b for *_, b, _ in slots) == (plan.host_bytes if plan.staging else 0)
    assert len({(op, i) for op, i, *_ in slots}) == len(slots)
    assert {op for op, *_ in slots} <= {op for op in "ABC" if plan.staged(op)}
    assert {(op, i) for op, i, _, f in slots if f} == {
        (op, 0) for op in "ABC" if plan.staged(op) and (op != "C" or plan.reads_c)
        and (op != "B" or plan.b_slots)}
    assert plan.host_slots("C") == [x for x in plan.host_slots("ABC") if x[0] == "C"]
    for op, panel in (("A", plan.bm * plan.bk), ("B", plan.bk * plan.bn)):
        n = plan.host_panel_slots(op)  # two, or up to four small panels read at once
        if op == "B" and not plan.b_slots:
            assert n == 0
            continue
        assert 2 <= n <= 4 and (n == 2 or (n - 1) * panel * plan.itemsize < 64 << 20)
        assert n == 4 or n * panel * plan.itemsize >= 64 << 20


@settings(max_examples=160, deadline=None)
@given(st.one_of(problems(), resident_c(), whole()), st.data())
def test_steps_load_every_panel_into_a_free_slot(kw, data):
    """Simulate the slots: every gemm finds its panels in place; loads match the traffic;
    every tile's K panels come in order (resident-c: its first ones in rounds over the
    tiles, its last ``tail`` tile by tile)."""
    plan = plan_or_none(kw)
    if plan is None or plan.n_tiles * plan.nk > 4000:
        return
    tiles = list(plan.tiles())
    done = set(data.draw(st.sets(st.sampled_from([t.index for t in tiles]), max_size=3)))
    a_slot, b_slot = {}, {}
    last_use_a, last_use_b = {}, {}
    loads_a = loads_b = 0
    seen = []
    for s, step in enumerate(plan.steps(done=done)):
        assert step.tile.index not in done
        a_key, b_key = (step.tile.i, step.kp), (step.tile.j, step.kp)
        assert 0 <= step.a_slot < plan.a_slots and 0 <= step.b_slot < plan.b_slots
        if step.load_a:
            loads_a += (step.tile.r1 - step.tile.r0) * (step.k1 - step.k0)
            # the slot being refilled is not the one the previous gemm reads
            assert last_use_a.get(step.a_slot, -2) <= s - 2 or s == 0 or plan.a_slots == 1
            a_slot[step.a_slot] = a_key
        if step.load_b:
            loads_b += (step.tile.c1 - step.tile.c0) * (step.k1 - step.k0)
            assert last_use_b.get(step.b_slot, -2) <= s - 2 or s == 0
            b_slot[step.b_slot] = b_key
        assert a_slot[step.a_slot] == a_key and b_slot[step.b_slot] == b_key
        last_use_a[step.a_slot] = last_use_b[step.b_slot] = s
        seen.append((step.tile.index, step.kp, step.first, step.last))
    expected = [(t.index, kp, kp == 0, kp == plan.nk - 1)
                for t, kp in plan.order_steps(done)]
    assert seen == expected
    assert sorted(x[:2] for x in seen) == sorted(
        (t.index, kp) for t in tiles if t.index not in done for kp in range(plan.nk))
    if plan.order == "resident-c":
        head = plan.nk - plan.tail
        live = [t.index for t in tiles if t.index not in done]
        assert [x[:2] for x in seen[:head * len(live)]] == [
            (i, kp) for kp in range(head) for i in live]
        assert len({s.c_slot for s in plan.steps(done=done)}) == len(live)  # all resident
    if not done:
        assert loads_a == plan.a_reads * plan.m * plan.k
        assert loads_b == plan.b_reads * plan.k * plan.n


def test_plan_prints_a_table_and_serialises():
    plan = make_plan(10007, 9001, 8191, device_budget=256 * 2**20)
    text = str(plan)
    for word in ("loop order", "C tiles", "K panels", "device memory", "lower bound"):
        assert word in text
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["n_tiles"] == plan.n_tiles and d["bound_ratio"] == pytest.approx(plan.bound_ratio)


@pytest.mark.parametrize("order", [
    "stream",      # every tile streams its panels
    "resident-a",  # a row panel of A stays for its row of tiles
    "resident-b",  # a column panel of B stays for its column of tiles
    "resident-c",  # every C strip stays, K panels streamed once
    "whole-a",     # all of A stays, tiles column by column
    "whole-b",     # all of B stays, tiles row by row
])
def test_each_order_is_valid_when_forced(order):
    # small budget, odd shape: every forced order still covers C within budget
    plan = make_plan(301, 257, 129, device_budget=600_000, order=order, align=16)
    assert plan.order == order and plan.device_bytes <= 600_000
    assert sum(1 for _ in plan.tiles()) == plan.n_tiles


class _Clock:
    """A model of time that counts the plans it times (any object with ``makespan``)."""

    def __init__(self, seconds):
        self.seconds, self.timed = seconds, 0

    def makespan(self, plan):
        self.timed += 1
        return self.seconds


def test_the_predicted_time_comes_from_the_rates_the_plan_holds():
    plan = make_plan(300, 200, 500, device_budget=2**20)
    assert plan.rates is None and plan.predicted_seconds is None
    clock = _Clock(1.5)
    timed = replace(plan, rates=clock)
    # asked once, kept beside the frozen fields
    assert timed.predicted_seconds == timed.predicted_seconds == 1.5 and clock.timed == 1
    # a plan given other rates is timed by them; rates do not make another schedule
    assert replace(timed, rates=_Clock(2.0)).predicted_seconds == 2.0
    assert timed == plan and timed.key() == plan.key()
    assert "predicted time" in str(timed) and "predicted time" not in str(plan)


@settings(max_examples=100, deadline=None)
@given(resident_c())
def test_resident_c_reads_each_input_once_and_holds_all_of_c(kw):
    plan = plan_or_none(kw)
    if plan is None:
        return
    assert (plan.a_reads, plan.b_reads) == (1, 1) and plan.bn == plan.n
    assert plan.c_slots == plan.ni and plan.b_slots == plan.tail + 1
    assert plan.device_bytes >= plan.itemsize * plan.m * plan.n
    again = make_plan(**dict(kw, tile=(plan.bm, plan.bn, plan.bk), tail=plan.tail))
    assert again == plan and again.key()["tail"] == plan.tail


@settings(max_examples=100, deadline=None)
@given(whole())
def test_whole_orders_read_each_input_once_and_start_on_one_row_and_column(kw):
    plan = plan_or_none(kw)
    if plan is None:
        return
    assert (plan.a_reads, plan.b_reads) == (1, 1)
    assert plan.bytes_read == (plan.itemsize * (plan.m * plan.k + plan.k * plan.n)
                               + plan.reads_c * plan.c_itemsize * plan.m * plan.n)
    kept = plan.itemsize * (plan.m * plan.k if plan.order == "whole-a" else plan.k * plan.n)
    assert plan.device_bytes >= kept
    tiles = [t.index for t in plan.tiles()]
    if plan.order == "whole-a":  # column by column
        assert tiles == [(i, j) for j in range(plan.nj) for i in range(plan.ni)]
    else:
        assert tiles == [(i, j) for i in range(plan.ni) for j in range(plan.nj)]
    # the first tile's steps load its own row and column panels, nothing else
    first = [s for s in plan.steps() if s.tile.index == (0, 0)]
    assert all(s.load_a and s.load_b for s in first) and len(first) == plan.nk
    # the counts of loads agree with the traffic: every panel of both inputs loaded once
    loads = [(s.tile.i, s.kp) for s in plan.steps() if s.load_a]
    assert sorted(loads) == sorted(set(loads)) and len(loads) == plan.ni * plan.nk
    loads = [(s.tile.j, s.kp) for s in plan.steps() if s.load_b]
    assert sorted(loads) == sorted(set(loads)) and len(loads) == plan.nj * plan.nk
    assert make_plan(**kw) == plan


@pytest.mark.parametrize("kwargs, words", [
    (dict(tile=(8, 8, 8), order="whole-a", symmetric=True, trans_a=True),
     ["Gram plan", "whole-a"]),  # a Gram plan keeps neither operand whole
    (dict(tile=(8, 10, 8), order="resident-c"), ["as wide as C", "bn=10"]),  # strips of C
    (dict(tile=(8, 30, 8), order="resident-c", tail=5), ["tail", "between 1 and 4"]),  # tail
    (dict(in_place="AD"), ["in_place", "AD"]),  # an operand that is not one
])
def test_bad_order_and_in_place_arguments_name_the_value(kwargs, words):
    with pytest.raises(Exception) as exc:
        make_plan(30, 30, 30, device_budget=1 << 20, **kwargs)
    for w in words:
        assert w in str(exc.value)


@settings(max_examples=100, deadline=None)
@given(resident_c(), st.integers(1, 4))
def test_wide_a_loads_cover_each_strip_once_within_rounds_and_tail(kw, span):
    kw = dict(kw, device_budget=kw["device_budget"] * span, staging=True, a_span=span)
    plan = plan_or_none(kw)
    if plan is None:
        return
    head = plan.nk - plan.tail
    loaded: dict[int, list[tuple[int, int]]] = {}
    for t, kp, _, load_a, _, _, _, (k0, k1) in plan._slot_schedule():
        assert (k0, k1) == plan.a_k_range(kp, t.i)
        assert k0 <= kp * plan.bk and min((kp + 1) * plan.bk, plan.k) <= k1
        assert k1 - k0 <= span * plan.bk
        assert (k0 < head * plan.bk) == (k1 <= head * plan.bk)  # rounds or tail, not both
        if load_a:
            loaded.setdefault(t.i, []).append((k0, k1))
    for i, ranges in loaded.items():
        assert sum(k1 - k0 for k0, k1 in ranges) == plan.k  # each element once
        # strip i's first load in the rounds is span - i % span panels (strips load in
        # turns), the tail's loads start anew
        lead = min(head, span - i % span) if i % span else 0
        assert len(ranges) == (lead > 0) + -(-(head - lead) // span) + -(-plan.tail // span)
    assert plan.a_loads == sum(len(r) for r in loaded.values())
    assert plan.device_bytes >= plan.itemsize * plan.a_slots * plan.bm * plan.bk * span


def test_wide_a_loads_only_for_resident_c_with_staging():
    base = dict(m=64, n=64, k=64, device_budget=1 << 20, tile=(16, 64, 16))
    with pytest.raises(PlanError, match="a_span"):
        make_plan(**base, order="stream", a_span=2)
    with pytest.raises(PlanError, match="a_span"):
        make_plan(**base, order="resident-c", staging=False, a_span=2)
    with pytest.raises(PlanError, match="a_span"):
        make_plan(**base, order="resident-c", a_span=0)
