"""The pipeline model: the simulated makespan within the stage bounds, extrapolation, the
costs a gemm step and the checks add, and the rates' grid."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_cases import (GiB, H100_ARRAYS, H100_PINNED, N32, in_place, plan_or_none, problems,
                        rates, resident_c)

from bigmm.planner import ORDERS, Rates, make_plan
from bigmm.planner.model import (LOCK_SHARE, RATE_STEPS, SIM_STEPS, STEP_SECONDS, pinned_at,
                                 predict_seconds, simulate, snap_rate, stage_times)


@settings(max_examples=150, deadline=None)
@given(st.one_of(problems(), resident_c()), rates(), in_place())
def test_simulated_makespan_lies_between_the_stage_bounds(kw, r, ops):
    """No stage finishes its work sooner than alone, and the stages one after the other
    bound the pipeline; the bounds the planner prunes with are true bounds (every order,
    operands copied in place or locked, fixed costs of steps, reads and rows)."""
    plan = plan_or_none(dict(kw, in_place=ops[0], registered=ops[1]))
    if plan is None or plan.n_tiles * plan.nk > 3000:
        return
    st_ = stage_times(plan, r)
    end = simulate(plan, r).end
    slack = 1e-9 * st_.upper_bound
    assert max(st_.read, st_.copy_in, st_.compute, st_.copy_out, st_.write) <= end + slack
    assert st_.lower_bound <= end + slack
    assert end <= st_.upper_bound + slack
    if plan.n_tiles * plan.nk <= SIM_STEPS:
        assert predict_seconds(plan, r) == pytest.approx(end)


@pytest.mark.parametrize("m, n, k, budget", [
    (40000, 40000, 100000, 2 * GiB),   # resident rows of ~5000 steps: from whole tiles
    (65536, 65536, 65536, 2 * GiB),    # resident rows of 400 steps: from whole rows
    (20000, 20000, 300000, 8 * GiB),   # deep K: each row's first tile reads a long panel
    (8192, 200000, 8192, 2 * GiB),     # A whole on the device, its first column read once
    (200000, 8192, 8192, 2 * GiB),     # B whole, the mirror image
])
def test_extrapolation_matches_the_whole_simulation(m, n, k, budget):
    long = 0
    for order in ORDERS:
        if order == "resident-c" and m * n * 4 > budget:  # all of C on the device
            continue
        kept = {"whole-a": m * k, "whole-b": k * n}.get(order, 0)
        if 4 * kept > budget:  # the operand kept whole does not fit
            continue
        plan = make_plan(m, n, k, device_budget=budget, host_budget=32 * GiB,
                         rates=H100_ARRAYS, order=order)
        long += plan.n_tiles * plan.nk > SIM_STEPS
        whole = predict_seconds(plan, H100_ARRAYS, max_steps=10**9)
        assert predict_seconds(plan, H100_ARRAYS) == pytest.approx(whole, rel=0.02)
    assert long >= 2


def test_checksum_costs_count_in_the_predicted_time():
    # a fast disk, slow checks: the sums over every panel matter against the gemms
    fast_io = replace(H100_ARRAYS, read_bytes=1e12, write_bytes=1e12, h2d_bytes=1e12)
    checked = replace(fast_io, check_bytes=2e11, check_step=40e-6)
    assert checked.step_seconds(256, 512, 1024, 4, last=False) == pytest.approx(
        fast_io.step_seconds(256, 512, 1024, 4, last=False)
        + 4 * (256 + 512) * 1024 / 2e11 + 40e-6)
    # the tile's own sums after its last step
    assert (checked.step_seconds(256, 512, 1024, 4, last=True)
            - checked.step_seconds(256, 512, 1024, 4, last=False)) == pytest.approx(
        4 * 2 * 256 * 512 / 2e11)
    args = dict(device_budget=512 << 20, host_budget=GiB)
    plain = make_plan(8192, 8192, 8192, rates=fast_io, **args)
    with_checks = make_plan(8192, 8192, 8192, rates=checked, **args)
    # the checks cost time in the model, and the chosen plan is no slower under them than
    # the plan chosen without them
    assert replace(plain, rates=checked).predicted_seconds > plain.predicted_seconds
    assert with_checks.predicted_seconds <= replace(plain, rates=checked).predicted_seconds


def test_fused_checks_cost_only_the_panels_as_they_land():
    fast_io = replace(H100_ARRAYS, read_bytes=1e12, write_bytes=1e12, h2d_bytes=1e12)
    checked = replace(fast_io, check_bytes=2e11, check_step=40e-6)
    fused = replace(checked, check_fused=True)
    plain = fast_io.step_seconds(256, 512, 1024, 4, last=False)
    # the gemm does the step's updates: only the A panel this step loads is summed
    assert fused.step_seconds(256, 512, 1024, 4, last=False, landed=256 * 1024) == \
        pytest.approx(plain + 4 * 256 * 1024 / 2e11 + 40e-6)
    # separate updates read both panels at every step, whatever it loads
    assert checked.step_seconds(256, 512, 1024, 4, last=False, landed=0) == \
        pytest.approx(plain + 4 * (256 + 512) * 1024 / 2e11 + 40e-6)
    args = dict(device_budget=512 << 20, host_budget=GiB)
    plan = make_plan(8192, 8192, 8192, rates=fast_io, **args)
    t = {r: replace(plan, rates=r) for r in (fast_io, checked, fused)}
    assert t[fast_io].predicted_seconds < t[fused].predicted_seconds \
        < t[checked].predicted_seconds
    for q in t.values():  # the model's bounds hold with the checks too
        bounds = stage_times(q, q.rates)
        assert bounds.lower_bound * (1 - 1e-9) <= simulate(q, q.rates).end \
            <= bounds.upper_bound * (1 + 1e-9)


def test_gemm_steps_cost_their_c_traffic_and_their_last_wave():
    bare = replace(H100_PINNED, memory_bytes=None, wave_flops=None)
    step = 2 * 4096 * 4096 * 1024
    base = bare.step_seconds(4096, 4096, 1024, 4, last=False, accumulates=True)
    assert base == pytest.approx(step / 52e12 + STEP_SECONDS)
    # adding into the tile reads and writes it once more; half a wave is lost per gemm
    assert H100_PINNED.step_seconds(4096, 4096, 1024, 4, last=False, accumulates=True) \
        == pytest.approx(base + 2 * 4 * 4096 * 4096 / 2.9e12 + 0.5 * 1024 * 128 * 128 * 528 / 52e12)
    assert H100_PINNED.step_seconds(4096, 4096, 1024, 4, last=False) == pytest.approx(
        base + 0.5 * 1024 * 128 * 128 * 528 / 52e12)  # a tile's first step only writes it


def test_a_plan_whose_steps_were_timed_at_their_shape_is_predicted_at_that_rate():
    """A step timed at its own shape (C traffic and last wave included) costs the model that
    time; plans of other shapes keep the calibrated rate; the timed rates snap too."""
    plan = make_plan(**N32, rates=H100_PINNED, tile=(4096, 4096, 1024), order="stream")
    other = make_plan(**N32, rates=H100_PINNED, tile=(2048, 4096, 1024), order="stream")
    timed = H100_PINNED.with_shapes({(4096, 4096, 1024): 40e12})
    assert timed.shape_flops(4096, 4096, 1024) == 40e12
    assert timed.shape_flops(2048, 4096, 1024) is None
    r = timed.for_plan(plan)
    step = r.step_seconds(4096, 4096, 1024, 4, last=False, accumulates=True)
    assert step == pytest.approx(2 * 4096 * 4096 * 1024 / 40e12 + STEP_SECONDS)
    assert timed.for_plan(other) == H100_PINNED.with_shapes({(4096, 4096, 1024): 40e12})
    assert predict_seconds(plan, timed) > predict_seconds(plan, H100_PINNED)
    assert predict_seconds(other, timed) == predict_seconds(other, H100_PINNED)
    assert "its steps timed at their shape: 40.0 TFLOP/s" in str(replace(plan, rates=timed))
    assert "timed at their shape" not in str(replace(other, rates=timed))
    snapped = replace(timed, shapes=((4096, 4096, 1024, 40e12 * 1.003),)).snapped()
    assert snapped.shapes == ((4096, 4096, 1024, snap_rate(40e12)),)


def test_calibrated_rates_snap_to_one_grid():
    """Rates a few tenths of a per cent apart (two processes timing one machine) snap to the
    same values, and so give the same plan; the grid's step is 2^(1/16), 4.4%."""
    step = 2 ** (1 / RATE_STEPS)
    centre = 2 ** (round(math.log2(52e12) * RATE_STEPS) / RATE_STEPS)
    assert snap_rate(centre) == pytest.approx(centre, rel=1e-12)
    for f in (0.995, 1.0, 1.004):  # within a fifth of a step of a grid point
        assert snap_rate(centre * f) == snap_rate(centre)
    assert snap_rate(centre * step) == pytest.approx(centre * step)  # the next point
    assert snap_rate(None) is None and snap_rate(math.inf) == math.inf and snap_rate(0.0) == 0.0
    r = replace(H100_PINNED, flops=centre * 1.003, h2d_bytes=55e9 * 0.998,
                memory_bytes=2.9e12 * 1.002)
    a, b = r.snapped(), replace(r, flops=centre * 0.997, h2d_bytes=55e9 * 1.001).snapped()
    assert a == b and a.read_bytes == r.read_bytes and a.wave_flops == r.wave_flops
    assert make_plan(**N32, rates=a).key() == make_plan(**N32, rates=b).key()


TF32_PINNED = replace(H100_PINNED, flops=370e12, wave_flops=2 * 128 * 256 * 132,
                      per_row=2e-7, register_bytes=20e9)


@pytest.mark.parametrize("m, n, k, budget, tile, tail", [
    (32768, 32768, 32768, 8 * GiB, (1024, 32768, 512), 8),  # the 8 GiB job: 32 strips, 64
    # panels
    (81920, 81920, 81920, 40 * GiB, (2048, 81920, 2048), 10),  # larger than the GPU: rounds
    # of 40 strips
])
def test_resident_c_extrapolation_matches_the_whole_simulation(m, n, k, budget, tile, tail):
    plan = make_plan(m, n, k, device_budget=budget, host_budget=32 * GiB, rates=TF32_PINNED,
                     tile=tile, order="resident-c", tail=tail, in_place="ABC")
    assert plan.n_steps > SIM_STEPS
    whole = predict_seconds(plan, TF32_PINNED, max_steps=10**9)
    assert predict_seconds(plan, TF32_PINNED) == pytest.approx(whole, rel=0.02)


def test_locking_delays_the_whole_run_by_its_time():
    # the same schedule with the arrays locked first: every stage starts after the locking
    args = dict(device_budget=8 * GiB, host_budget=32 * GiB, rates=TF32_PINNED,
                tile=(4096, 8192, 4096), order="resident-a", in_place="ABC")
    free = make_plan(16384, 16384, 16384, **args)
    locked = make_plan(16384, 16384, 16384, **args, registered="ABC")
    setup = 3 * 4 * 16384**2 / TF32_PINNED.register_bytes
    assert locked.predicted_seconds == pytest.approx(free.predicted_seconds + setup)
    assert make_plan(16384, 16384, 16384, **args, registered="A").predicted_seconds == \
        pytest.approx(free.predicted_seconds + setup / 3)


@pytest.mark.parametrize("reads_c", [
    False,  # A's and B's first buffers before the start, C's two in the background
    True,  # C's first buffer before the start too: the first step reads old C
])
def test_staging_past_the_first_step_is_pinned_while_the_run_goes(reads_c):
    args = dict(device_budget=8 * GiB, host_budget=32 * GiB, tile=(4096, 8192, 4096),
                order="stream", in_place="", reads_c=reads_c)
    free = make_plan(16384, 16384, 16384, **args, rates=TF32_PINNED)
    pin = replace(TF32_PINNED, pin_bytes=2e9)
    pinned = make_plan(16384, 16384, 16384, **args, rates=pin)
    slots = pinned.host_slots()
    first = sum(b for *_, b, f in slots if f)
    rest = sum(b for *_, b, f in slots if not f)
    assert first == 4 * 4096 * (4096 + 8192 + (8192 if reads_c else 0))
    st_ = stage_times(pinned, pin)
    # the first step's buffers before the start, and the locking of the others, which
    # holds the run up while they are pinned beside it
    assert st_.setup == pytest.approx((first + LOCK_SHARE * rest) / 2e9)
    assert st_.pinning == pytest.approx(rest / 2e9)
    # the first step waits for its own buffers; later steps wait for theirs as needed
    assert free.predicted_seconds + st_.setup <= pinned.predicted_seconds
    assert pinned.predicted_seconds <= free.predicted_seconds + st_.setup + st_.pinning + 1e-9
    slow = replace(TF32_PINNED, pin_bytes=1e8)  # pinning the rest outlasts the whole run
    late = make_plan(16384, 16384, 16384, **args, rates=slow)
    assert late.predicted_seconds >= sum(b for *_, b, _ in slots) / 1e8


@pytest.mark.parametrize("kept", [
    "all",  # a second run of the same plan: nothing to pin
    "first",  # blocks of the first step's sizes only: the rest pinned while the run goes
    "twice",  # one block of a size the run takes twice: the second pinned anew
])
def test_blocks_kept_by_an_earlier_run_are_not_pinned_again(kept):
    args = dict(device_budget=8 * GiB, host_budget=32 * GiB, tile=(4096, 8192, 4096),
                order="stream", in_place="")
    pin = replace(TF32_PINNED, pin_bytes=2e9)
    fresh = make_plan(16384, 16384, 16384, **args, rates=pin)
    slots = fresh.host_slots()
    sizes = {"all": [b for *_, b, _ in slots], "first": [b for *_, b, f in slots if f],
             "twice": [slots[0][2]]}[kept]
    r = replace(pin, kept_pinned=tuple(sizes))
    again = make_plan(16384, 16384, 16384, **args, rates=r)
    st_, before = stage_times(again, r), stage_times(fresh, pin)
    ready = pinned_at(again, r, 0.0)
    if kept == "twice":  # A's two buffers are alike: the first taken, the second pinned
        assert slots[0][:2] == ("A", 0) and slots[0][2] in [b for o, i, b, _ in slots if i]
        assert st_.setup == pytest.approx(before.setup - slots[0][2] / 2e9)
        assert st_.pinning == pytest.approx(before.pinning)
    else:
        first = sum(b for *_, b, f in slots if f)  # kept either way: no longer pinned first
        rest = sum(b for *_, b, f in slots if not f) if kept == "all" else 0  # nor locked
        assert st_.setup == pytest.approx(before.setup - (first + LOCK_SHARE * rest) / 2e9)
        assert st_.pinning == pytest.approx(0.0 if kept == "all" else before.pinning)
        assert (max(ready.values()) == 0.0) == (kept == "all")
    assert again.predicted_seconds < fresh.predicted_seconds


def test_small_panels_are_read_by_few_threads():
    # TF32 at n = 32768 in 8 GiB on an H100: 512-row strips' A panels (3.5 MiB) are read by
    # one thread each, about one at a time; measured, they ran 1.08-1.38 s against 0.55-0.63
    # for 1792-row strips, which the model without it put 5% behind them
    r = Rates(flops=415.7e12, read_bytes=30.2e9, write_bytes=30.2e9, h2d_bytes=55.3e9,
              memory_bytes=2.85e12, wave_flops=8650752.0, per_step=3.96e-5,
              per_host_row=5.2e-8, pin_bytes=9.37e9)
    one = replace(r, thread_bytes=6e9)
    assert one.load_rate(512 * 1792 * 4) == 6e9  # one piece: one thread
    assert one.load_rate(64 << 20) == r.read_bytes == r.load_rate(512 * 1792 * 4)
    args = dict(device_budget=8 * GiB, host_budget=12 * GiB, in_place="")
    narrow = dict(tile=(512, 32768, 1792), order="resident-c", tail=10)
    assert (make_plan(32768, 32768, 32768, **args, rates=one, **narrow).predicted_seconds
            > make_plan(32768, 32768, 32768, **args, rates=r, **narrow).predicted_seconds)
    assert make_plan(32768, 32768, 32768, **args, rates=r).bm == 512
    assert make_plan(32768, 32768, 32768, **args, rates=one).bm >= 1024
    # rates timed on an H100 host after small panels got four host slots: one thread 10.7
    # GB/s, all of them 25.4; counting the four slots as four threads, the plan took 512-row
    # strips (1.10-1.38 s measured, against 0.58-0.63 for 1792-row strips)
    timed = Rates(flops=415.7e12, read_bytes=25.37e9, write_bytes=25.37e9, h2d_bytes=55.34e9,
                  memory_bytes=2.85e12, wave_flops=8650752.0, per_step=3.96e-5,
                  per_host_row=9.66e-9, per_row=6.04e-10, register_bytes=25.37e9,
                  pin_bytes=4.68e9, thread_bytes=10.67e9)
    p = make_plan(32768, 32768, 32768, device_budget=8 * GiB, host_budget=29930553344,
                  in_place="", rates=timed)
    assert p.order == "resident-c" and p.bm >= 1024


def test_pitched_copies_in_place_cost_their_rows():
    # A's panels narrower than its rows are 2-D copies of bm rows each; B's panels span whole
    # rows (one tile column), C's tiles too: only A pays
    args = dict(device_budget=8 * GiB, host_budget=32 * GiB, tile=(4096, 8192, 2048),
                order="stream", in_place="ABC")
    flat = make_plan(8192, 8192, 8192, **args, rates=replace(TF32_PINNED, per_row=0.0))
    rowed = make_plan(8192, 8192, 8192, **args, rates=TF32_PINNED)
    bare, costed = stage_times(flat, flat.rates), stage_times(rowed, rowed.rates)
    assert costed.copy_in - bare.copy_in == pytest.approx(
        TF32_PINNED.per_row * rowed.a_reads * 8192 * rowed.nk)
    assert costed.copy_out == bare.copy_out
    staged = make_plan(8192, 8192, 8192, **dict(args, in_place=""), rates=TF32_PINNED)
    assert stage_times(staged, staged.rates).copy_in == pytest.approx(
        staged.bytes_h2d / TF32_PINNED.h2d_bytes)  # staged panels are contiguous


@pytest.mark.parametrize("tile, overlap", [
    ((4096, 4096, 2048), True),    # 16 tiles: each goes out while the next ones' panels come in
    ((8192, 8192, 2048), False),   # one tile: it goes out after the last panel came in
])
def test_copies_both_ways_at_once_keep_the_duplex_share_of_the_rate(tile, overlap):
    args = dict(device_budget=8 * GiB, host_budget=32 * GiB, tile=tile, order="stream",
                in_place="ABC")
    full = make_plan(8192, 8192, 8192, **args, rates=TF32_PINNED)
    shared = make_plan(8192, 8192, 8192, **args, rates=replace(TF32_PINNED, duplex=0.8))
    t_full, t_shared = simulate(full, full.rates).end, simulate(shared, shared.rates).end
    link = stage_times(full, full.rates)
    if overlap:  # slower, by at most the copies' seconds at the shared rate
        assert t_full < t_shared <= t_full + 0.25 * (link.copy_in + link.copy_out)
    else:
        assert t_shared == t_full


def test_fixed_costs_of_steps_and_reads_count_per_step_and_per_read():
    base = replace(H100_ARRAYS, per_step=0.0, per_load=0.0)
    args = dict(device_budget=GiB, host_budget=GiB, tile=(512, 512, 512), order="stream",
                staging=False)
    p = make_plan(4096, 4096, 4096, **args, rates=base)
    costly = replace(base, per_step=1e-3, per_load=2e-3)
    bare, costed = stage_times(p, base), stage_times(p, costly)
    assert costed.compute - bare.compute == pytest.approx(1e-3 * p.n_steps)
    loads = p.a_reads * p.ni * p.nk + p.b_reads * p.nj * p.nk
    assert costed.read - bare.read == pytest.approx(2e-3 * loads)
    assert costed.write - bare.write == pytest.approx(2e-3 * p.n_tiles)
    assert predict_seconds(p, costly) > predict_seconds(p, base) + 1e-3 * p.n_steps * 0.99


@pytest.mark.parametrize("in_place_ops, tile, bound", [
    ("", (256, 256, 256), True),  # staged tiny steps: a step and two hand-offs each, serial
    ("ABC", (256, 256, 256), True),  # in place: a step each, no hand-offs
    ("", (4096, 4096, 4096), False),  # steps of 0.3 s of gemm hide the issuing thread
])
def test_the_issuing_thread_bounds_steps_too_small_to_hide_its_work(in_place_ops, tile, bound):
    base = replace(H100_ARRAYS, per_issue=0.0, per_handoff=0.0)
    costly = replace(base, per_issue=2e-4, per_handoff=3e-4)
    p = make_plan(8192, 8192, 8192, device_budget=4 * GiB, host_budget=4 * GiB, tile=tile,
                  order="stream", in_place=in_place_ops, registered="")
    handoffs = 0 if in_place_ops else p.a_reads * p.ni * p.nk + p.b_reads * p.nj * p.nk
    work = 2e-4 * p.n_steps + 3e-4 * handoffs
    assert stage_times(p, costly).issue == pytest.approx(work)
    assert stage_times(p, base).issue == 0.0
    before, after = predict_seconds(p, base), predict_seconds(p, costly)
    assert after >= work
    if bound:  # the run is the issuing thread's: it takes at least its work, beyond the rest
        assert after > before and after >= 0.99 * max(before, work)
    else:  # hidden but for the first step's
        assert after - before <= 2e-4 + 2 * 3e-4 + 1e-9


@pytest.mark.parametrize("staging", [
    True,  # a GPU run's start and end: before its first copy and after its last
    False,  # the CPU's: counted in its steps' timed cost
])
def test_a_runs_own_start_and_end_add_to_its_time_once(staging):
    r = replace(H100_ARRAYS, per_run=0.0)
    p = make_plan(8192, 8192, 8192, device_budget=GiB, host_budget=GiB, tile=(2048,) * 3,
                  order="stream", staging=staging)
    added = predict_seconds(p, replace(r, per_run=0.02)) - predict_seconds(p, r)
    assert added == pytest.approx(0.02 if staging else 0.0, abs=1e-9)


def test_the_issuing_thread_costs_nothing_where_the_gemm_runs_on_it():
    # without staging the gemm runs on the issuing thread: its cost is per_step's alone
    r = replace(H100_ARRAYS, per_issue=1e-3, per_handoff=1e-3)
    p = make_plan(2048, 2048, 2048, device_budget=GiB, host_budget=GiB, tile=(256,) * 3,
                  order="stream", staging=False)
    assert stage_times(p, r).issue == 0.0
    assert predict_seconds(p, r) == pytest.approx(
        predict_seconds(p, replace(r, per_issue=0.0, per_handoff=0.0)))


@pytest.mark.parametrize("k, presplit, tile, flops", [
    (4096, 1, (2304, 32768, 4096), "flops"),  # plain TF32 read as stored: measured at flops
    (4097, 1, (2304, 32768, 4097), "unsplit"),  # op(A) rounded ahead alone: the narrow rate
    (4096, 2, (256, 16384, 4096), "unsplit"),  # 3xTF32 tiles too small to split ahead
    (4096, 2, (4096, 4096, 4096), "flops"),  # 3xTF32 split ahead
    (4096, 0, (256, 16384, 4096), "flops"),  # a gemm that never splits
])
def test_products_run_at_the_rate_of_the_way_the_gemm_takes_them(k, presplit, tile, flops):
    r = Rates(flops=400e12, read_bytes=10e9, write_bytes=10e9, h2d_bytes=50e9,
              unsplit_flops=250e12)
    p = make_plan(tile[0], tile[1], k, device_budget=64 * GiB, presplit=presplit, tile=tile,
                  order="stream")
    assert r.for_plan(p).flops == (400e12 if flops == "flops" else 250e12)


def test_wide_a_loads_cost_fewer_rows_and_are_chosen_where_rows_cost():
    # the 8 GiB TF32 job from page-locked arrays: A's resident-c panels are 2-D copies of
    # 16 KiB rows; loaded two K panels at a time they are about half as many rows of twice the
    # bytes
    args = dict(device_budget=8 * GiB, host_budget=32 * GiB, in_place="ABC")
    one = make_plan(32768, 32768, 32768, **args, rates=TF32_PINNED, tile=(2304, 32768, 4096),
                    order="resident-c", tail=4)
    two = make_plan(32768, 32768, 32768, **args, rates=TF32_PINNED, tile=(2304, 32768, 4096),
                    order="resident-c", tail=4, a_span=2)
    s1, s2 = stage_times(one, one.rates), stage_times(two, two.rates)
    assert two.a_loads < one.a_loads == one.ni * one.nk
    assert s1.copy_in - s2.copy_in == pytest.approx(
        TF32_PINNED.per_row * 32768 * (one.a_loads - two.a_loads) / one.ni)
    assert two.bytes_read == one.bytes_read and two.device_bytes > one.device_bytes
    assert two.predicted_seconds < one.predicted_seconds
    chosen = make_plan(32768, 32768, 32768, **args, rates=TF32_PINNED)
    assert chosen.order == "resident-c" and chosen.a_span == 2
    assert chosen.predicted_seconds <= two.predicted_seconds
    assert "A loaded 2 at a time" in str(chosen)
    # A staged (contiguous panels), or the loads fixed with the tile: one panel at a time
    staged = make_plan(32768, 32768, 32768, **dict(args, in_place="BC"), rates=TF32_PINNED)
    assert staged.a_span == 1 and one.a_span == 1


@pytest.mark.parametrize("tile, decoders", [
    ((2000, 256, 2000), 1),  # A's panel one chunk: one reader decodes it
    ((4000, 256, 4000), 4),  # four chunks: four readers, the plan's all
    ((8000, 256, 4000), 4),  # eight chunks: still the plan's four
])
def test_compressed_panels_come_in_no_faster_than_their_readers_decode(tile, decoders):
    from bigmm.planner.decode import offered
    from bigmm.planner.model import read_rates

    # an 8000 x 4000 float32 A in zstd chunks of 2000 x 2000, decoded by up to 4 readers
    files = replace(H100_PINNED, read_bytes=10e9, write_bytes=10e9)
    p = make_plan(8000, 256, 4000, "float32", device_budget=2 * GiB, host_budget=2 * GiB,
                  staging=True, a_chunks=(2000, 2000), tile=tile, order="stream",
                  decoding=offered((30_500_000, 0), (4, 0)), rates=files)
    slow = replace(files, decode_bytes=(1e8, 0.0))
    fast = replace(files, decode_bytes=(1e18, 0.0))
    assert read_rates(p, fast) == read_rates(p, files)  # the reads bound them, as before
    assert read_rates(p, slow) == (decoders * 1e8,) + read_rates(p, files)[1:]
    # every byte of A decoded once (panels aligned to the chunks), by that many readers
    decoding = 8000 * 4000 * 4 / (decoders * 1e8)
    assert replace(p, rates=slow).predicted_seconds >= decoding
    assert replace(p, rates=slow).predicted_seconds <= decoding + p.predicted_seconds + 0.01
