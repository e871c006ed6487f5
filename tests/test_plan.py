"""Planner properties: coverage, budgets, slot safety, traffic accounting, errors."""

from __future__ import annotations

import json
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bigmm.errors import BudgetError, DtypeError, PlanError, ShapeError
from bigmm.plan import (MAX_LOOKAHEAD, ORDERS, SIM_STEPS, STEP_SECONDS, Rates, make_plan,
                        predict_seconds, simulate, stage_times)

dims = st.integers(min_value=1, max_value=700)


@st.composite
def problems(draw):
    m, n, k = draw(dims), draw(dims), draw(dims)
    dtype = draw(st.sampled_from(["float32", "float64"]))
    w = 4 if dtype == "float32" else 8
    total = w * (m * k + k * n + 2 * m * n)
    budget = draw(st.integers(min_value=max(64, total // 200), max_value=max(128, 2 * total)))
    staging = draw(st.booleans())
    host = draw(st.sampled_from([None, budget, 3 * budget]))
    chunk = st.one_of(st.none(), st.tuples(st.integers(1, 300), st.integers(1, 300)))
    return dict(m=m, n=n, k=k, dtype=dtype, trans_a=draw(st.booleans()),
                trans_b=draw(st.booleans()), reads_c=draw(st.booleans()),
                device_budget=budget, host_budget=host, staging=staging,
                a_chunks=draw(chunk), b_chunks=draw(chunk), align=draw(st.sampled_from([1, 16, 128])))


def plan_or_none(kw):
    try:
        return make_plan(**kw)
    except BudgetError as e:
        assert e.minimum > min(kw["device_budget"], kw["host_budget"] or kw["device_budget"])
        return None


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


@settings(max_examples=120, deadline=None)
@given(problems(), st.data())
def test_steps_load_every_panel_into_a_free_slot(kw, data):
    """Simulate the slots: every gemm finds its panels in place; loads match the traffic."""
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
                for t in tiles if t.index not in done for kp in range(plan.nk)]
    assert seen == expected
    if not done:
        assert loads_a == plan.a_reads * plan.m * plan.k
        assert loads_b == plan.b_reads * plan.k * plan.n


@settings(max_examples=150, deadline=None)
@given(problems())
def test_budget_below_minimum_states_the_minimum_and_the_minimum_works(kw):
    kw = dict(kw, device_budget=8, host_budget=None)
    with pytest.raises(BudgetError) as exc:
        make_plan(**kw)
    minimum = exc.value.minimum
    assert str(minimum) in str(exc.value)
    plan = make_plan(**dict(kw, device_budget=minimum))
    assert plan.device_bytes <= minimum


@settings(max_examples=100, deadline=None)
@given(problems())
def test_explicit_tile_reproduces_the_plan(kw):
    plan = plan_or_none(kw)
    if plan is None:
        return
    again = make_plan(**dict(kw, tile=(plan.bm, plan.bn, plan.bk), order=plan.order))
    assert again == plan
    assert list(again.steps()) == list(plan.steps())


def test_resident_panel_is_read_once_when_it_fits():
    # 4096^2 operands, budget fits a whole row panel of A: A read once
    plan = make_plan(4096, 4096, 4096, device_budget=200 * 2**20, host_budget=2**30)
    assert plan.a_reads == 1 or plan.b_reads == 1
    assert plan.n_tiles > 1


def test_everything_fits_reads_each_input_once():
    plan = make_plan(300, 200, 500, device_budget=2**30)
    assert (plan.a_reads, plan.b_reads) == (1, 1)
    assert plan.bound_ratio == pytest.approx(1.0)


def test_large_c_tiles_are_split_to_shorten_the_drain():
    # n = 32768 with 8 GiB: each input is read once either way, so the last C tile (written
    # after all compute) should be small, not a third of C
    plan = make_plan(32768, 32768, 32768, device_budget=8 * 2**30, host_budget=32 * 2**30)
    assert (plan.a_reads, plan.b_reads) == (1, 1)
    assert plan.bm * plan.bn * plan.itemsize <= 256 * 2**20


def test_stream_order_moves_more_than_resident():
    resident = make_plan(2048, 2048, 2048, device_budget=48 * 2**20)
    stream = make_plan(2048, 2048, 2048, device_budget=48 * 2**20, order="stream")
    assert resident.bytes_read <= stream.bytes_read


@pytest.mark.parametrize("a_chunks, b_chunks, trans_a, unit_m, unit_k", [
    ((256, 512), (512, 384), False, 256, 512),   # row chunks of A set bm, A's column chunks set bk
    ((512, 256), (512, 384), True, 256, 512),    # transposed A: its column chunks set bm
    (None, (320, 384), False, 256, 320),          # unchunked A: bm aligns to 256, bk to B's chunks
])
def test_tiles_align_to_chunks(a_chunks, b_chunks, trans_a, unit_m, unit_k):
    plan = make_plan(5000, 4000, 6000, trans_a=trans_a, device_budget=64 * 2**20,
                     a_chunks=a_chunks, b_chunks=b_chunks)
    assert plan.bm % unit_m == 0 or plan.bm == plan.m
    assert plan.bk % unit_k == 0 or plan.bk == plan.k


def test_plan_prints_a_table_and_serialises():
    plan = make_plan(10007, 9001, 8191, device_budget=256 * 2**20)
    text = str(plan)
    for word in ("loop order", "C tiles", "K panels", "device memory", "lower bound"):
        assert word in text
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["n_tiles"] == plan.n_tiles and d["bound_ratio"] == pytest.approx(plan.bound_ratio)


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(m=0, n=3, k=3), ShapeError, ["M", "0"]),                       # empty dimension
    (dict(m=3, n=3, k=3, dtype="int32"), DtypeError, ["float32", "int32"]),  # wrong dtype
    (dict(m=3, n=3, k=3, order="diagonal"), PlanError, ["diagonal"]),     # unknown order
    (dict(m=3, n=3, k=3, tile=(0, 1, 1)), PlanError, ["bm", "0"]),        # zero tile
    (dict(m=300, n=300, k=300, tile=(300, 300, 300), device_budget=1000),
     BudgetError, ["at least"]),                                          # explicit tile too big
])
def test_bad_arguments_name_the_value(kwargs, error, words):
    kwargs.setdefault("device_budget", 2**20)
    with pytest.raises(error) as exc:
        make_plan(**kwargs)
    for w in words:
        assert w in str(exc.value)


@pytest.mark.parametrize("order", ORDERS)
def test_each_order_is_valid_when_forced(order):
    # small budget, odd shape: every forced order still covers C within budget
    plan = make_plan(301, 257, 129, device_budget=600_000, order=order, align=16)
    assert plan.order == order and plan.device_bytes <= 600_000
    assert sum(1 for _ in plan.tiles()) == plan.n_tiles


# ----- choosing by predicted time ----------------------------------------------------------

GiB = 2**30
#: The H100 host with NumPy inputs and output: its gemm, memcpy into pinned staging, pinned
#: copies to the device, and the single writer into the output array.
H100_ARRAYS = Rates(flops=47e12, read_bytes=15e9, write_bytes=5e9, h2d_bytes=50e9)
#: The same GPU reading HDF5 files from a cold disk and writing C to it.
H100_DISK = Rates(flops=47e12, read_bytes=1.2e9, write_bytes=1.0e9, h2d_bytes=50e9)
N32 = dict(m=32768, n=32768, k=32768, device_budget=8 * GiB, host_budget=32 * GiB)


@st.composite
def rates(draw):
    rate = st.floats(min_value=1e6, max_value=1e12)
    return Rates(flops=draw(st.floats(min_value=1e8, max_value=1e15)), read_bytes=draw(rate),
                 write_bytes=draw(rate), h2d_bytes=draw(st.one_of(st.none(), rate)),
                 memory_bytes=draw(st.one_of(st.none(), rate)),
                 wave_flops=draw(st.one_of(st.none(), st.floats(min_value=1e3, max_value=1e9))))


@settings(max_examples=120, deadline=None)
@given(problems(), rates())
def test_simulated_makespan_lies_between_the_stage_bounds(kw, r):
    """No stage finishes its work sooner than alone, and the stages one after the other
    bound the pipeline; the bounds the planner prunes with are true bounds."""
    plan = plan_or_none(kw)
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


@settings(max_examples=60, deadline=None)
@given(problems(), rates())
def test_the_rates_choose_among_the_same_plans(kw, r):
    """With rates the planner still returns a plan within the budgets; the schedule's
    invariants are those of every plan (checked above), its predicted time is the model's."""
    plan = plan_or_none(dict(kw, rates=r))
    if plan is None:
        return
    assert plan.device_bytes <= plan.device_budget and plan.host_bytes <= plan.host_budget
    assert plan.predicted_seconds == pytest.approx(predict_seconds(plan, r))
    assert plan.predicted_seconds >= stage_times(plan, r).lower_bound * (1 - 1e-9)


def test_host_arrays_no_longer_wait_for_all_of_a():
    # n = 32768 from NumPy arrays: the fewest bytes (32768 x 1024 tiles, all of A resident)
    # make the first tile wait ~0.3 s for all of A; by time the planner reads more but hides
    # the reads under the gemms
    by_bytes = make_plan(**N32)
    assert (by_bytes.order, by_bytes.bm, by_bytes.bn) == ("resident-a", 32768, 1024)
    plan = make_plan(**N32, rates=H100_ARRAYS)
    assert plan.bm < plan.m and plan.ni > 1
    compute = plan.flops / H100_ARRAYS.flops
    old = make_plan(**N32, rates=H100_ARRAYS, tile=(32768, 1024, 4096), order="resident-a")
    assert plan.predicted_seconds < 0.93 * old.predicted_seconds
    # what is left: the last 0.5 GiB tile written at 5 GB/s, and each row's first tile
    # reading its new A row panel with B faster than its gemms can use them
    assert plan.predicted_seconds < 1.12 * compute


def test_disk_bound_plans_stay_low_traffic():
    # HDF5 inputs chunked 4096 x 4096 on a disk read at 1.2 GB/s: reading dominates, so the
    # time objective keeps each input read once, as the byte objective does
    chunks = dict(a_chunks=(4096, 4096), b_chunks=(4096, 4096))
    by_bytes = make_plan(**N32, **chunks)
    plan = make_plan(**N32, **chunks, rates=H100_DISK)
    assert (plan.a_reads, plan.b_reads) == (1, 1)
    old = make_plan(**N32, **chunks, rates=H100_DISK, tile=(by_bytes.bm, by_bytes.bn,
                                                            by_bytes.bk), order=by_bytes.order)
    assert plan.predicted_seconds <= old.predicted_seconds


def test_without_rates_the_byte_objective_is_kept():
    plan = make_plan(**N32)
    assert plan.predicted_seconds is None
    assert make_plan(**N32, rates=H100_ARRAYS, tile=(plan.bm, plan.bn, plan.bk),
                     order=plan.order).key() == plan.key()  # resume: the recorded schedule


@pytest.mark.parametrize("m, n, k, budget", [
    (40000, 40000, 100000, 2 * GiB),   # resident rows of ~5000 steps: from whole tiles
    (65536, 65536, 65536, 2 * GiB),    # resident rows of 400 steps: from whole rows
    (20000, 20000, 300000, 8 * GiB),   # deep K: each row's first tile reads a long panel
])
def test_extrapolation_matches_the_whole_simulation(m, n, k, budget):
    long = 0
    for order in ORDERS:
        plan = make_plan(m, n, k, device_budget=budget, host_budget=32 * GiB,
                         rates=H100_ARRAYS, order=order)
        long += plan.n_tiles * plan.nk > SIM_STEPS
        whole = predict_seconds(plan, H100_ARRAYS, max_steps=10**9)
        assert predict_seconds(plan, H100_ARRAYS) == pytest.approx(whole, rel=0.02)
    assert long >= 2


@pytest.mark.parametrize("n", [2**15, 2**18, 2**20])
def test_planning_by_time_is_fast(n):
    t0 = time.perf_counter()
    plan = make_plan(n, n, n, device_budget=8 * GiB, host_budget=32 * GiB, rates=H100_ARRAYS)
    assert time.perf_counter() - t0 < 1.0
    assert plan.predicted_seconds >= plan.flops / H100_ARRAYS.flops


def test_the_model_uses_the_executors_window():
    from bigmm import executor

    assert MAX_LOOKAHEAD == executor.MAX_LOOKAHEAD


def test_plans_are_cached_by_their_arguments():
    args = dict(device_budget=64 << 20, host_budget=128 << 20, rates=H100_ARRAYS)
    first = make_plan(3001, 2003, 1009, a_chunks=[64, 64], **args)
    # the same arguments (chunks as a list or a tuple) give the very same frozen plan
    assert make_plan(3001, 2003, 1009, a_chunks=(64, 64), **args) is first
    # any argument changed plans again
    other = make_plan(3001, 2003, 1009, a_chunks=(64, 64), trans_a=True, **args)
    assert other is not first and other.trans_a
    # errors are raised every time, never cached
    for _ in range(2):
        with pytest.raises(BudgetError):
            make_plan(3001, 2003, 1009, device_budget=64, host_budget=64)


def test_checksum_costs_count_in_the_predicted_time():
    from dataclasses import replace

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
    from dataclasses import replace

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


def test_a_costlier_gemm_step_chooses_fewer_larger_gemms():
    from bigmm.plan import STEP_COST_BYTES, cpu_step_bytes

    # the CPU benchmark's job: 12288^3 float32 under 256 MiB, by bytes
    args = dict(device_budget=256 << 20, staging=False)
    two = make_plan(12288, 12288, 12288, step_bytes=cpu_step_bytes(2), **args)
    many = make_plan(12288, 12288, 12288, step_bytes=cpu_step_bytes(14), **args)
    # with 14 BLAS threads each call costs more: fewer gemms, each larger, more bytes read
    assert many.n_tiles * many.nk < two.n_tiles * two.nk
    assert many.bm * many.bn * many.bk > two.bm * two.bn * two.bk
    assert many.bytes_read >= two.bytes_read
    # one thread (or none reported) costs what the byte objective charges by default
    assert cpu_step_bytes(1) == cpu_step_bytes(0) == STEP_COST_BYTES


#: The H100 from pinned NumPy arrays copied in place (nothing read or written through staging),
#: with what a gemm step adds: C tiles re-read and written at the device memory's speed, and
#: half a wave of 264 blocks of 128 x 128 lost per gemm.
H100_PINNED = Rates(flops=52e12, read_bytes=float("inf"), write_bytes=float("inf"),
                    h2d_bytes=55e9, memory_bytes=2.9e12, wave_flops=2 * 128 * 128 * 264)


def test_gemm_steps_cost_their_c_traffic_and_their_last_wave():
    from dataclasses import replace

    bare = replace(H100_PINNED, memory_bytes=None, wave_flops=None)
    step = 2 * 4096 * 4096 * 1024
    base = bare.step_seconds(4096, 4096, 1024, 4, last=False, accumulates=True)
    assert base == pytest.approx(step / 52e12 + STEP_SECONDS)
    # adding into the tile reads and writes it once more; half a wave is lost per gemm
    assert H100_PINNED.step_seconds(4096, 4096, 1024, 4, last=False, accumulates=True) \
        == pytest.approx(base + 2 * 4 * 4096 * 4096 / 2.9e12 + 0.5 * 1024 * 128 * 128 * 528 / 52e12)
    assert H100_PINNED.step_seconds(4096, 4096, 1024, 4, last=False) == pytest.approx(
        base + 0.5 * 1024 * 128 * 128 * 528 / 52e12)  # a tile's first step only writes it


def test_deeper_k_panels_where_the_c_updates_cost():
    # n = 32768 from pinned arrays: deeper panels halve the updates of 11008 x 11008 tiles
    # (a cuBLAS run measured 1.387 s with 8192-deep panels against 1.420 s with 4096)
    plan = make_plan(**N32, rates=H100_PINNED)
    assert plan.bk > 4096
    shallow = make_plan(**N32, rates=H100_PINNED, tile=(plan.bm, plan.bn, 4096), order=plan.order)
    assert plan.predicted_seconds < shallow.predicted_seconds
    # the memory traffic not counted, the fill of deeper panels is all they change
    from dataclasses import replace

    assert make_plan(**N32, rates=replace(H100_PINNED, memory_bytes=None)).bk <= 4096


def test_the_last_waves_keep_tiles_large():
    # without the waves, 4864 x 4864 tiles look as fast as 11008 x 11008 ones (they ran 2% and
    # 20% slower with cuBLAS and bigmm's kernel); with them the planner keeps large tiles
    from dataclasses import replace

    plan = make_plan(**N32, rates=H100_PINNED)
    assert min(plan.bm, plan.bn) >= 8192
    small = make_plan(**N32, rates=H100_PINNED, tile=(4864, 4864, 8192), order="resident-a")
    assert small.predicted_seconds > 1.03 * plan.predicted_seconds
    no_waves = replace(H100_PINNED, wave_flops=None)
    assert replace(small, rates=no_waves).predicted_seconds < 1.01 * replace(
        plan, rates=no_waves).predicted_seconds


def test_calibrated_rates_snap_to_one_grid():
    """Rates a few tenths of a per cent apart (two processes timing one machine) snap to the
    same values, and so give the same plan; the grid's step is 2^(1/16), 4.4%."""
    from dataclasses import replace

    from bigmm.plan import RATE_STEPS, snap_rate

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

