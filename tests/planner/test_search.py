"""The search: plans within the budgets, errors that state the minimum, resumed schedules,
traffic and chunk alignment, and the choice by predicted time."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from hypothesis import given, settings
from plan_cases import (GiB, H100_ARRAYS, H100_DISK, H100_PINNED, H200_BF16, N32, plan_or_none,
                        problems, rates, write_bound)

from bigmm.errors import BudgetError, DtypeError, PlanError, ShapeError
from bigmm.planner import DIRECT_ROWS, STORED_BYTES, Rates, make_plan
from bigmm.planner.model import SIM_STEPS, predict_seconds, stage_times
from bigmm.planner import search
from bigmm.planner.search import STEP_COST_BYTES, cpu_step_bytes, even_edge


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


@settings(max_examples=300, deadline=None)
@given(problems())
def test_no_plan_reads_less_than_the_lower_bound(kw):
    # the bound is on all the traffic (C's too): the inputs' share of it is what a plan reads
    p = plan_or_none(kw)
    if p is not None:
        assert p.bound_ratio >= 1.0 - 1e-9, (kw, p.bm, p.bn, p.bk, p.order)


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


@pytest.mark.parametrize("budgets, staging, expected", [
    ((100, 100), False, ["a memory budget of at least 1536 bytes"]),  # CPU: one budget
    ((100, 100), True, ["a device memory budget", "and a host memory budget"]),  # both short
    ((2**20, 100), True, ["a host memory budget of at least"]),  # the host's alone
    ((2**20, 100), False, ["a host memory budget of at least"]),  # CPU, host_memory given
])
def test_a_budget_too_small_is_one_sentence(budgets, staging, expected):
    with pytest.raises(BudgetError) as exc:
        make_plan(64, 64, 64, device_budget=budgets[0], host_budget=budgets[1],
                  staging=staging)
    msg = str(exc.value)
    assert msg.count("Expected") == 1 and msg.count("Got") == 1, msg
    assert all(w in msg for w in expected) and str(exc.value.minimum) in msg, msg
    if budgets[0] == 2**20:
        assert "device" not in msg  # only the budget that is short


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
    if plan.order == "resident-c":  # no tail one panel away faster by more than NEAR
        for tail in (plan.tail - 1, plan.tail + 1):
            if 1 <= tail <= plan.nk and plan.ni * tail <= SIM_STEPS:
                other = plan_or_none(dict(kw, rates=r, tile=(plan.bm, plan.bn, plan.bk),
                                          order="resident-c", tail=tail))
                assert other is None or (
                    (1 + search.NEAR) * other.predicted_seconds >= plan.predicted_seconds)


@settings(max_examples=80, deadline=None)
@given(write_bound())
def test_whole_orders_chosen_keep_tiles_at_least_half_as_wide_as_c(kw):
    plan = plan_or_none(kw)
    if plan is None or plan.order not in search.WHOLE_ORDERS:
        return
    assert plan.staging and 2 * plan.bn >= plan.n  # narrower tiles were written slower
    assert plan.ni > 1 if plan.order == "whole-a" else plan.nj > 1  # else resident-a/-b's
    assert (plan.a_reads, plan.b_reads) == (1, 1)
    assert plan.predicted_seconds == pytest.approx(predict_seconds(plan, kw["rates"]))
    # no slower than without them (but for near ties, where fewer bytes read win)
    assert plan.predicted_seconds <= (1 + search.NEAR) * make_plan(
        **dict(kw, whole=False)).predicted_seconds


def test_whole_orders_never_lose_a_plan_found_without_them():
    # found by the property above: the whole orders' candidates crowded a stream plan 3.1%
    # faster out of the simulated ones
    r = Rates(flops=1e12, read_bytes=2e9, write_bytes=5e8, h2d_bytes=2e10)
    kw = dict(m=2676, n=2676, k=2082, device_budget=51250752, host_budget=205003008, rates=r,
              align=1)
    alone = make_plan(**kw)
    assert make_plan(**kw, whole=True).predicted_seconds <= (
        (1 + search.NEAR) * alone.predicted_seconds)


def _nominal_plan(kw):
    """The plan of ``kw`` with near ties broken at the nominal rates alone (the planner
    before CACHED_READ_RATE)."""
    rate = search.CACHED_READ_RATE
    try:
        search.CACHED_READ_RATE = 0.0
        make_plan.cache_clear()
        return plan_or_none(kw)
    finally:
        search.CACHED_READ_RATE = rate
        make_plan.cache_clear()


@settings(max_examples=60, deadline=None)
@given(write_bound())
def test_near_ties_for_storage_go_to_the_plan_fastest_with_cached_inputs(kw):
    plan, nominal = plan_or_none(kw), _nominal_plan(kw)
    if plan is None or nominal.order not in search.WHOLE_ORDERS:
        assert plan == nominal  # only near ties in the whole orders are broken otherwise
        return
    assert plan.order == nominal.order and plan.bytes_read == nominal.bytes_read
    assert plan.predicted_seconds <= (1 + search.NEAR) * nominal.predicted_seconds
    cached = replace(kw["rates"], read_bytes=max(kw["rates"].read_bytes,
                                                 search.CACHED_READ_RATE))
    assert predict_seconds(plan, cached) <= predict_seconds(nominal, cached) * (1 + 1e-9)


#: Rates as a CUDA-core GPU's job from files gets them: the nominal disk, a read's fixed cost.
H100_FILES = Rates(flops=48e12, read_bytes=2e9, write_bytes=1e9, h2d_bytes=20e9,
                   memory_bytes=3e12, per_step=20e-6, per_load=1e-4, per_host_row=2e-7,
                   thread_bytes=2e9)


def test_taller_tiles_of_the_whole_order_for_storage():
    # n = 16384 from 1024^2-chunked files into a file, 2 GiB: at the nominal rates whole-b
    # 1024 x 8192 and 2048 x 8192 are within 0.2%; with the inputs cached the taller tiles
    # keep the gemms and the writer busy while B is read (measured into Zarr: 0.725 s against
    # 0.817 s; BENCHMARKS.md)
    kw = dict(m=16384, n=16384, k=16384, device_budget=2 * GiB, a_chunks=(1024, 1024),
              b_chunks=(1024, 1024), rates=H100_FILES, whole=True)
    plan, nominal = make_plan(**kw), _nominal_plan(kw)
    assert (nominal.order, nominal.bm, nominal.bn) == ("whole-b", 1024, 8192)
    assert (plan.order, plan.bm, plan.bn) == ("whole-b", 2048, 8192)
    assert make_plan(**dict(kw, whole=False)).order not in search.WHOLE_ORDERS  # arrays: as before


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


@pytest.mark.parametrize("n", [
    2**15,  # 32768: the benchmarks' size
    2**18,  # a quarter million: thousands of candidate tiles, schedules extrapolated
    2**20,  # a million: the largest square job planned
])
def test_planning_by_time_is_fast(n):
    t0 = time.perf_counter()
    plan = make_plan(n, n, n, device_budget=8 * GiB, host_budget=32 * GiB, rates=H100_ARRAYS)
    assert time.perf_counter() - t0 < 1.0
    assert plan.predicted_seconds >= plan.flops / H100_ARRAYS.flops


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


def test_a_costlier_gemm_step_chooses_fewer_larger_gemms():
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


def test_deeper_k_panels_where_the_c_updates_cost():
    # n = 32768 from pinned arrays: deeper panels halve the updates of 11008 x 11008 tiles
    # (a cuBLAS run measured 1.387 s with 8192-deep panels against 1.420 s with 4096)
    plan = make_plan(**N32, rates=H100_PINNED)
    assert plan.bk > 4096
    shallow = make_plan(**N32, rates=H100_PINNED, tile=(plan.bm, plan.bn, 4096), order=plan.order)
    assert plan.predicted_seconds < shallow.predicted_seconds
    # the memory traffic not counted, the fill of deeper panels is all they change: taken
    # only as a near tie (deeper gemms run faster than the model knows)
    flat = replace(H100_PINNED, memory_bytes=None)
    tie = make_plan(**N32, rates=flat)
    same = make_plan(**N32, rates=flat, tile=(tie.bm, tie.bn, 4096), order=tie.order)
    assert (same.predicted_seconds <= tie.predicted_seconds
            <= (1 + search.NEAR) * same.predicted_seconds)


def test_the_last_waves_keep_tiles_large():
    # without the waves, 4864 x 4864 tiles look as fast as 11008 x 11008 ones (they ran 2% and
    # 20% slower with cuBLAS and bigmm's kernel); with them the planner keeps large tiles
    plan = make_plan(**N32, rates=H100_PINNED)
    assert min(plan.bm, plan.bn) >= 8192
    small = make_plan(**N32, rates=H100_PINNED, tile=(4864, 4864, 8192), order="resident-a")
    assert small.predicted_seconds > 1.03 * plan.predicted_seconds
    no_waves = replace(H100_PINNED, wave_flops=None)
    assert replace(small, rates=no_waves).predicted_seconds < 1.01 * replace(
        plan, rates=no_waves).predicted_seconds


@pytest.mark.parametrize("dim, parts, unit, edge", [
    (1000, 4, 1, 250),      # even pieces
    (1000, 3, 1, 334),      # rounded up: three pieces still cover dim
    (1000, 3, 256, 512),    # then to whole units: two pieces cover dim
    (100, 1, 256, 100),     # never more than dim
    (5, 8, 1, 1),           # more parts than elements: one each
])
def test_even_edges_cover_the_dimension_in_whole_units(dim, parts, unit, edge):
    assert even_edge(dim, parts, unit) == edge
    assert -(-dim // edge) <= parts and (edge % unit == 0 or edge == dim)


#: TF32 tensor cores on an H100 with the arrays copied in place: the copies bound the run
#: wherever inputs are read more than about twice.
TF32_IN_PLACE = Rates(flops=367e12, read_bytes=15e9, write_bytes=5e9, h2d_bytes=54e9,
                      memory_bytes=2.9e12, wave_flops=2.0 * 128 * 256 * 132, per_row=1e-7)
#: The H100's CUDA cores (the own kernel, cuBLAS SGEMM) from arrays staged at the host's copy
#: rate.
CUDA_STAGED = Rates(flops=47e12, read_bytes=20e9, write_bytes=10e9, h2d_bytes=54e9,
                    memory_bytes=2.9e12, wave_flops=2.0 * 128 * 128 * 264)


@pytest.mark.parametrize("n, budget", [
    (32768, 8 * GiB),    # the 8 GiB job: C (4 GiB) fits, each input read once
    (16384, 2 * GiB),    # the same at a quarter of the size
    (24576, 9 * GiB // 2),  # C takes half the budget
])
def test_copy_bound_plans_move_close_to_the_bound_and_use_the_budget(n, budget):
    p = make_plan(n, n, n, device_budget=budget, host_budget=32 * GiB, rates=TF32_IN_PLACE,
                  in_place="ABC")
    assert p.bound_ratio <= 1.25 and p.device_bytes >= 0.5 * budget
    # within 1.5x of the arithmetic alone or the copies alone (the model also counts C's
    # traffic as the steps add into it, the last waves, the first panels and the last strip)
    compute = p.flops / TF32_IN_PLACE.flops
    link = p.bytes_h2d / TF32_IN_PLACE.h2d_bytes
    assert p.predicted_seconds <= 1.5 * max(compute, link)
    # against the old choice, which read B twice through a small C tile
    old = make_plan(n, n, n, device_budget=budget, host_budget=32 * GiB, rates=TF32_IN_PLACE,
                    in_place="ABC", order="resident-a", tile=(n // 2, 4096, 4096))
    assert p.predicted_seconds < old.predicted_seconds


def test_cost_per_flop_is_flat_from_32768_to_81920_on_cuda_cores():
    # default budgets of an H100: 85% of 78 GiB on the device, a quarter of the RAM left
    # once A, B and C are in it
    per_flop = []
    for n in (32768, 49152, 65536, 81920):
        host = int(0.25 * (125 * GiB - 3 * 4 * n * n))
        p = make_plan(n, n, n, device_budget=int(0.85 * 78 * GiB) >> 26 << 26,
                      host_budget=max(host, GiB) >> 26 << 26, rates=CUDA_STAGED, in_place="")
        per_flop.append(p.predicted_seconds / p.flops)
    assert max(per_flop) <= 1.1 * min(per_flop)


#: The H100 host's warm page cache: HDF5 inputs read at 20 GB/s, C written at 2 GB/s.
H100_WARM = Rates(flops=47e12, read_bytes=20e9, write_bytes=2e9, h2d_bytes=20e9)


@pytest.mark.parametrize("r, faster", [
    (replace(H100_WARM, read_bytes=2e9, write_bytes=1e9), 0.97),  # the job's nominal disk
    (H100_DISK, 1.0),  # a cold disk: reading bounds the run, writes start early all the same
])
def test_writes_to_storage_start_early_with_one_operand_whole(r, faster):
    # n = 32768 from chunked HDF5 files into a file, 8 GiB: without the whole orders the plan
    # reading each input once keeps a row panel of all of A's rows, and its first tile waits
    # for all of A; whole-a or -b starts C's writes after one row and one column panel
    chunks = dict(a_chunks=(4096, 4096), b_chunks=(4096, 4096))
    before = make_plan(**N32, **chunks, rates=r)
    plan = make_plan(**N32, **chunks, rates=r, whole=True)
    assert before.order not in search.WHOLE_ORDERS and before.bm == before.m
    assert plan.order in search.WHOLE_ORDERS and (plan.a_reads, plan.b_reads) == (1, 1)
    assert plan.predicted_seconds < faster * before.predicted_seconds
    assert (plan.bm + plan.bn) * plan.k < 0.75 * before.m * before.k  # the first tile's input


def test_whole_orders_are_candidates_only_when_asked_and_timed_with_staging():
    chunks = dict(a_chunks=(4096, 4096), b_chunks=(4096, 4096))
    for kw in (dict(), dict(rates=H100_WARM, staging=False),
               dict(rates=H100_WARM, symmetric=True, trans_a=True)):
        assert make_plan(**N32, **chunks, whole=True, **kw).order not in search.WHOLE_ORDERS
    # forced (a resumed run): any order that fits, checked against the budget
    assert make_plan(**N32, order="whole-b", whole=False).order == "whole-b"
    with pytest.raises(BudgetError):
        make_plan(**dict(N32, device_budget=2 * GiB), order="whole-a")  # A is 4 GiB


def test_resident_c_is_a_candidate_only_when_timed_with_staging():
    # by bytes (no rates) or on the CPU the orders are those of before
    for kw in (dict(), dict(rates=TF32_IN_PLACE, staging=False)):
        p = make_plan(4096, 4096, 4096, device_budget=GiB, **kw)
        assert p.order != "resident-c"
    assert make_plan(4096, 4096, 4096, device_budget=GiB,
                     rates=TF32_IN_PLACE).order in ("resident-c", "resident-a", "resident-b",
                                                    "stream")


def test_of_near_times_the_plan_reading_fewer_bytes_is_chosen(monkeypatch):
    # bfloat16 at n = 81920 on an H200: resident-b reading A twice was predicted a hair
    # faster than resident-c reading each input once; measured, resident-c was 10-20% faster
    base = dict(m=81920, n=81920, k=81920, dtype="bfloat16", device_budget=118 * GiB,
                host_budget=18 * GiB, rates=H200_BF16, in_place="")
    twice = make_plan(**base, tile=(4096, 40960, 7680), order="resident-b")
    once = make_plan(**base, tile=(3072, 81920, 4096), order="resident-c", tail=10)
    assert twice.predicted_seconds < once.predicted_seconds <= (
        (1 + search.NEAR) * twice.predicted_seconds)
    assert once.bytes_read < twice.bytes_read
    found = [((search._cost(p, STEP_COST_BYTES), p.n_steps, -p.bk, 0), p) for p in (twice, once)]
    monkeypatch.setattr(search, "_best_tail", lambda p: p)  # these tails only
    assert search._fastest(found, H200_BF16) == once
    monkeypatch.setattr(search, "NEAR", 0.0)
    assert search._fastest(found, H200_BF16) == twice
    # where the gemms outweigh the reads and the writes, the fastest whatever it reads
    slow = replace(H200_BF16, flops=H200_BF16.flops / 20)
    found = [((0,), make_plan(**dict(base, rates=slow), tile=(p.bm, p.bn, p.bk), order=p.order,
                              tail=p.tail or None)) for p in (twice, once)]
    monkeypatch.setattr(search, "NEAR", 0.5)
    fastest = min((p for _, p in found), key=lambda p: p.predicted_seconds)
    assert search._fastest(found, slow) == fastest


def test_resident_c_tries_k_panels_deeper_than_max_bk_by_time():
    # TF32 at n = 81920 from host arrays, as calibrated on an H100: each K panel adds into
    # the strips once, so panels twice as deep (8192, dividing K) halve that traffic; measured,
    # cuBLAS TF32 ran the 4096-deep steps at 271 TFLOP/s and the 8192-deep at 342
    tf32 = Rates(flops=398e12, read_bytes=30.2e9, write_bytes=30.2e9, h2d_bytes=55.3e9,
                 memory_bytes=2.85e12, wave_flops=8650752.0, per_step=3.96e-5,
                 per_host_row=4.2e-8, per_row=1.5e-9, register_bytes=25.4e9, pin_bytes=8.97e9)
    args = dict(m=81920, n=81920, k=81920, dtype="float32", device_budget=66 * GiB,
                host_budget=17 * GiB, rates=tf32, in_place="")
    plan = make_plan(**args)
    assert (plan.order, plan.bk) == ("resident-c", 8192)
    shallow = make_plan(**args, max_bk=2048)  # deeper panels up to 4096 only
    assert shallow.bk <= 4096 and plan.predicted_seconds < shallow.predicted_seconds
    assert make_plan(**dict(args, rates=None), order="resident-c").bk <= 4096  # by bytes


@pytest.mark.parametrize("dtype, rates, tail", [
    # bfloat16 at n = 81920 on an H100 host (the gemm calibrated deep): the model takes tail 8,
    # between the shares' 5 and 10 (measured on two hosts: tail 7 1.84 and 2.06 s against
    # 2.00 and 2.11 for tail 5)
    ("bfloat16", Rates(flops=831e12, read_bytes=26.5e9, write_bytes=26.5e9, h2d_bytes=55.3e9,
                       memory_bytes=2.85e12, per_step=3.96e-5, per_host_row=3.1e-8,
                       per_row=8.1e-8, register_bytes=20.4e9, pin_bytes=8.23e9,
                       thread_bytes=9.78e9), 8),
    # TF32 on another: tails 3 and 4 within 1% of each other in the model; measured 3.40 s
    # with tail 4 against 3.62-3.96 with 3 (C's writes bound the shorter tail)
    ("float32", Rates(flops=415.7e12, read_bytes=28.9e9, write_bytes=28.9e9, h2d_bytes=55.3e9,
                      memory_bytes=2.85e12, wave_flops=8650752.0, per_step=3.96e-5,
                      per_host_row=8.8e-8, per_row=2.1e-8, register_bytes=26.5e9,
                      pin_bytes=8.59e9, thread_bytes=10.2e9), 4),
])
def test_resident_c_takes_the_longest_tail_the_model_puts_near_the_fastest(dtype, rates, tail):
    # ten K panels, whose shares give tails 1, 2, 3, 5 and 10
    args = dict(m=81920, n=81920, k=81920, dtype=dtype, device_budget=66 * GiB,
                host_budget=16 * GiB, rates=rates, in_place="")
    plan = make_plan(**args)
    assert (plan.order, plan.nk, plan.tail) == ("resident-c", 10, tail)

    def tailed(t):
        return make_plan(**args, tile=(plan.bm, plan.bn, plan.bk), order="resident-c",
                         tail=t).predicted_seconds

    fastest = min(tailed(t) for t in range(1, 11))
    assert plan.predicted_seconds <= (1 + search.NEAR) * fastest
    assert tailed(tail + 1) > (1 + search.NEAR) * fastest


def test_of_near_resident_c_plans_the_deepest_panels_are_chosen(monkeypatch):
    # another H100 host's calibration: the model puts 4096-deep panels 2% ahead of 8192-deep
    # ones, which measured 25% faster (it does not know cuBLAS TF32's shallow steps are slow);
    # its staging pinned 1.25x as fast as it was timed then (64 MiB blocks; 256 MiB now)
    tf32 = Rates(flops=415.7e12, read_bytes=25.4e9, write_bytes=25.4e9, h2d_bytes=55.3e9,
                 memory_bytes=2.98e12, wave_flops=8650752.0, per_step=3.96e-5,
                 per_host_row=1.93e-8, register_bytes=24.3e9, pin_bytes=1.25 * 6.62e9)
    args = dict(m=81920, n=81920, k=81920, dtype="float32", device_budget=65 * GiB,
                host_budget=12 * GiB, rates=tf32, in_place="")
    tailed = search.make_plan.__wrapped__(**args)
    monkeypatch.setattr(search, "_best_tail", lambda p: p)  # the tails of TAIL_SHARES only
    plan, near = search.make_plan.__wrapped__(**args), search.NEAR
    monkeypatch.setattr(search, "NEAR", 0.0)
    fastest = search.make_plan.__wrapped__(**args)
    assert plan.order == fastest.order == "resident-c" and plan.bytes_read == fastest.bytes_read
    assert plan.nk < fastest.nk and plan.bk == 8192
    assert fastest.predicted_seconds < plan.predicted_seconds <= (
        (1 + near) * fastest.predicted_seconds)
    # the tail is then searched for the strips chosen: their height and depth kept
    assert (tailed.bm, tailed.bk) == (plan.bm, plan.bk) and tailed.tail != plan.tail
    assert tailed.predicted_seconds <= (1 + near) * plan.predicted_seconds


@settings(max_examples=60, deadline=None)
@given(problems())
def test_presplit_plans_hold_the_split_workspace_within_the_budget(kw):
    from bigmm.planner import direct_workspace_bytes, split_workspace_bytes

    parts = 1 + kw["m"] % 2  # TF32's one part or 3xTF32's two
    plan = plan_or_none(dict(kw, presplit=parts))
    if plan is None:
        return
    assert plan.presplit and plan.device_bytes <= plan.device_budget
    held = plan.device_bytes - replace(plan, presplit=0).device_bytes
    assert held == plan.workspace_bytes
    large = 1024 * (plan.bm + plan.bn) < plan.bm * plan.bn
    # plain TF32 NN and TT read both panels as stored where every panel's rows are 16-byte
    # aligned (the depths, K and its panels', and the widths of op(B)'s panels (NN) or op(A)'s
    # (TT) multiples of 4) and a step's panels hold at most STORED_BYTES
    side, width = (plan.m, plan.bm) if plan.trans_a else (plan.n, plan.bn)
    stored = (parts == 1 and plan.trans_a == plan.trans_b
              and plan.k % 4 == 0 and plan.bk % 4 == 0 and side % 4 == 0 and width % 4 == 0
              and 4 * (plan.bm + plan.bn) * plan.bk <= STORED_BYTES)
    assert plan.reads_as_stored == stored
    # otherwise plain TF32 rounds only op(A) (NN) or op(B) (TT) ahead where it is the smaller
    # and has at most DIRECT_ROWS rows, and panels large enough are split ahead
    small = plan.bn if plan.trans_a else plan.bm
    one = (parts == 1 and plan.trans_a == plan.trans_b and not stored
           and small <= min(plan.bm, plan.bn, DIRECT_ROWS))
    assert plan.rounds_one_ahead == one
    assert plan.splits_ahead == (large and not one and not stored)
    # the workspace holds either pass: a gemm rounding one panel ahead falls back to splitting
    # both where a panel is not 16-byte aligned; none where both are read as stored
    assert held == (0 if stored else max(
        split_workspace_bytes(plan.bm, plan.bn, plan.bk, parts) if large else 0,
        direct_workspace_bytes(plan.bm, plan.bn, plan.bk) if one else 0))
    assert ("split panels" in str(plan)) == plan.splits_ahead
    assert ("rounded" in str(plan)) == plan.rounds_one_ahead
    # a resumed run states the same flag and gets the same schedule back
    assert make_plan(**dict(kw, presplit=parts, tile=(plan.bm, plan.bn, plan.bk),
                            order=plan.order)) == plan


def test_split_workspace_pads_rows_and_depth_plus_one_k_tile():
    from bigmm.planner import direct_workspace_bytes, split_workspace_bytes, splits_ahead

    assert splits_ahead(4096, 4096) and splits_ahead(2304, 32768)
    assert not splits_ahead(2048, 2048) and not splits_ahead(256, 1 << 20)
    p = make_plan(8192, 8192, 8192, device_budget=2 * GiB, presplit=2,
                  tile=(4096, 4096, 4096), order="stream")
    assert p.splits_ahead and p.device_bytes == (
        replace(p, presplit=0).device_bytes + split_workspace_bytes(4096, 4096, 4096))

    # A's rows to 128, B's to 256 (TF32's C tiles are 256 wide); two parts or one
    assert split_workspace_bytes(128, 128, 32) == 8 * (128 + 256) * 64
    assert split_workspace_bytes(129, 257, 33, 1) == 4 * (256 + 512) * 96
    # rounding only the smaller panel: tiles of 256 rows, 32 deep
    assert direct_workspace_bytes(256, 16384, 4097) == 4 * 256 * 4128
    assert direct_workspace_bytes(3000, 2304, 4096) == 4 * 2304 * 4096
    assert direct_workspace_bytes(257, 16384, 32) == 4 * 512 * 32


@pytest.mark.parametrize("rows_a, rows_b, trans_a, trans_b, one", [
    (256, 16384, False, False, True),  # NN, op(A) the smaller: the planner's TF32 tile
    (2304, 32768, False, False, True),  # the 8 GiB job's strips
    (4608, 32768, False, False, True),  # the most rows rounded ahead alone
    (4609, 32768, False, False, False),  # one more: both split ahead instead
    (16384, 256, False, False, False),  # NN with op(A) the larger
    (16384, 256, True, True, True),  # TT rounds op(B) ahead
    (256, 16384, False, True, False),  # NT: neither operand along the rows of C
    (256, 16384, True, False, False),  # TN
])
def test_plain_tf32_rounds_one_panel_ahead_where_it_is_small(rows_a, rows_b, trans_a, trans_b,
                                                             one):
    from bigmm.planner import rounds_one_ahead

    assert rounds_one_ahead(rows_a, rows_b, trans_a, trans_b) == one
    # K = 4097: op(A)'s rows (NN) are not 16-byte aligned, so no tensor map reads them
    p = make_plan(rows_a, rows_b, 4097, device_budget=4 * GiB, presplit=1, trans_a=trans_a,
                  trans_b=trans_b, tile=(rows_a, rows_b, 4097), order="stream")
    assert not p.reads_as_stored and p.rounds_one_ahead == one
    assert ("rounded " + ("B" if trans_a else "A")) in str(p) if one else "rounded" not in str(p)
    # 3xTF32 splits both whatever the shape
    assert not replace(p, presplit=2).rounds_one_ahead


@pytest.mark.parametrize("m, n, k, bk, trans_a, trans_b, stored", [
    (2304, 32768, 4096, 4096, False, False, True),  # the 8 GiB job's strips
    (32768, 32768, 32768, 8192, False, False, True),  # square tiles too: no workspace
    (24576, 24576, 24576, 24576, False, False, False),  # 4.5 GiB of panels: rounded ahead
    (256, 16384, 4096, 4096, True, True, True),  # TT: op(A) (stored K x M) 16-byte aligned
    (2304, 32768, 4097, 4097, False, False, False),  # op(A)'s rows of 4097 elements
    (2304, 32768, 8192, 4098, False, False, False),  # panels 4098 deep
    (2304, 32766, 4096, 4096, False, False, False),  # op(B)'s rows of 32766
    (2302, 32768, 4096, 4096, True, True, False),  # TT: op(A) stored with rows of 2302
    (2304, 32768, 4096, 4096, False, True, False),  # NT: op(B) is not along C's rows
])
def test_plain_tf32_reads_aligned_nn_and_tt_panels_as_stored(m, n, k, bk, trans_a, trans_b,
                                                             stored):
    p = make_plan(m, n, k, device_budget=64 * GiB, presplit=1, trans_a=trans_a,
                  trans_b=trans_b, tile=(m, n, bk), order="stream")
    assert p.reads_as_stored == stored
    if stored:
        assert p.workspace_bytes == 0 and not p.splits_ahead and not p.rounds_one_ahead
        assert p.device_bytes == replace(p, presplit=0).device_bytes
        assert "rounded" not in str(p) and "split panels" not in str(p)
    # 3xTF32 has no such way: it splits its panels whatever their alignment
    assert not replace(p, presplit=2).reads_as_stored


def test_near_ties_of_gemm_bound_plans_take_the_deepest_panels():
    # float32 cuBLAS at 8 GiB from pageable arrays, an H100 host's copy rates: the model puts
    # 1792-deep resident-c strips within NEAR of 4096-deep plans of other orders, and the
    # strips ran 4-6% slower (cuBLAS's shallow gemms run slower than the model knows)
    r = Rates(flops=50.8e12, wave_flops=2 * 128 * 128 * 132, read_bytes=32.9e9,
              write_bytes=32.9e9, h2d_bytes=55.3e9, memory_bytes=2.85e12, per_step=3.96e-5,
              per_issue=2.34e-4, per_handoff=1.8e-4, per_run=1.64e-3, per_host_row=5.23e-8,
              per_row=2.38e-7, pin_bytes=8.97e9, thread_bytes=3.4e9)
    plan = make_plan(**N32, rates=r, in_place="")
    st = stage_times(plan, r)
    assert max(st.read, st.write) < st.compute  # the gemms bound the run
    strips = make_plan(**N32, rates=r, in_place="", tile=(4864, 32768, 1792),
                       order="resident-c", tail=15)
    assert plan.predicted_seconds <= (1 + search.NEAR) * strips.predicted_seconds
    assert plan.bk >= 4096 and plan.nk < strips.nk
    # where the copies bound the run, the fewest bytes still come first: each input once
    slow = replace(r, read_bytes=2e9, write_bytes=2e9)
    assert make_plan(**N32, rates=slow, in_place="").bytes_read == 4 * 2 * 32768**2
    assert plan.bytes_read > 4 * 2 * 32768**2  # B more than once: hidden behind the gemms
