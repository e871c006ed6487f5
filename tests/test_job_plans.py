"""Planning a job (bigmm.job): by time on staging backends, the host paths of the user's
arrays (staged, in place, locked for the run), resumed schedules, default budgets, reader
threads, and the notes on budgets that slow a plan down."""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bigmm
from bigmm import advice, api, errors, filerates, job, planstore
from bigmm.backends.numpy import NumpyBackend
from bigmm.executor import calibrate
from bigmm.planner import Rates, make_plan
from bigmm.planner import search
from bigmm.planner.model import snap_rate
from bigmm.testing import random_matrix, reference_gemm, relative_error, tolerance, zarr_array


def _h5(path, name, array, **kw) -> str:
    with h5py.File(path, "a") as f:
        f.create_dataset(name, data=array, **kw)
    return f"{path}:/{name}"


class _StagingBackend:
    """Just enough of a GPU backend for planning: staging, memory, calibrated rates, and which
    host arrays it takes as pinned (``pinned``: their ids)."""

    name, staging = "fake-gpu", True

    def __init__(self, pinned=()):
        self.pinned = {id(x) for x in pinned}

    def host_pinned(self, x):
        return id(x) in self.pinned or id(getattr(x, "base", None)) in self.pinned

    def memory_available(self):
        return 64 * 2**30

    def rates(self, dtype, limit):
        return _GPU_RATES

    def close(self):
        pass


_GPU_RATES = Rates(flops=47e12, read_bytes=2e9, write_bytes=1e9, h2d_bytes=50e9)


def _copy_rates(host=4 * 2**20):
    """The read and write speeds of arrays staged in and out: the host's timed copy rate
    (on the rates' grid), and its cost per row."""
    threads, size = job.parse_io_threads(None), max(16 << 20, host // 4)
    copy = snap_rate(job.COPY_SHARE * calibrate.copy_rate(threads, size))
    return (copy, copy, snap_rate(calibrate.copy_row_seconds(threads, size)),
            snap_rate(calibrate.piece_rate(size, threads)))


@pytest.mark.parametrize("kind", [
    "numpy",  # memcpy into staging and out of it, at the host's copy rate
    "file",   # disk in, disk out; panels still copied row by row out of the page cache
])
def test_staging_backends_plan_by_time_with_the_inputs_rates(tmp_path, kind):
    read, write, row, one = (_copy_rates() if kind == "numpy"
                             else (job.READ_RATE, job.WRITE_RATE, _copy_rates()[2], None))
    a, b = random_matrix((600, 500), np.float32), random_matrix((500, 400), np.float32, 1)
    out = None
    if kind == "file":
        a, b = _h5(tmp_path / "a.h5", "A", a), _h5(tmp_path / "b.h5", "B", b)
        out = f"{tmp_path / 'c.h5'}:/C"
    closing = []
    A, B = job.open_inputs(a, b, closing)
    try:
        p, _ = job.plan_job(A, B, out, _StagingBackend(), alpha=1.0, beta=0.0, trans_a=False,
                             trans_b=False, memory="2MiB", host_memory="4MiB", resume=False,
                             calibrate=True)
        files = filerates.look(A, B, out)
    finally:
        for x in closing:
            x.close()
    # files: chosen at the nominal rates, the time predicted at what the cache holds now
    predicted = (min(files.read_rate("A"), files.read_rate("B")), files.write_rate())
    assert (p.rates.read_bytes, p.rates.write_bytes, p.rates.per_host_row,
            p.rates.thread_bytes) == ((read, write) if kind == "numpy" else predicted) + (
                row, one)  # one thread's copies: arrays
    if kind == "file":
        assert predicted[0] > read  # just written: cached
    # the calibrated speeds on the grid that keeps plans from changing between processes
    snapped = _GPU_RATES.snapped()
    assert p.rates.flops == snapped.flops and p.rates.h2d_bytes == snapped.h2d_bytes
    best = make_plan(600, 400, 500, device_budget=2 * 2**20, host_budget=4 * 2**20,
                     rates=replace(p.rates, read_bytes=read, write_bytes=write),
                     a_chunks=A.chunks, b_chunks=B.chunks, whole=kind == "file")
    assert p.key() == best.key()
    assert p.predicted_seconds == replace(best, rates=p.rates).predicted_seconds


class _ShapeTimingBackend(_StagingBackend):
    """A staging backend that times its gemm at a step's shape: the ``slow`` shapes at a
    hundredth of its rate, the others at ``rate`` times it (None for all with ``untimed``)."""

    def __init__(self, slow=(), untimed=False, rate=1.0):
        super().__init__()
        self.slow, self.untimed, self.rate, self.asked = set(slow), untimed, rate, []

    def shape_flops(self, rows, cols, depth, dtype):
        self.asked.append((rows, cols, depth))
        if self.untimed:
            return None
        return _GPU_RATES.flops * (0.01 if (rows, cols, depth) in self.slow else self.rate)


def _plan_with(be, n=2048, memory="8MiB"):
    a, b = random_matrix((n, n), np.float32), random_matrix((n, n), np.float32, 1)
    closing = []
    A, B = job.open_inputs(a, b, closing)
    try:
        return job.plan_job(A, B, None, be, alpha=1.0, beta=0.0, trans_a=False,
                            trans_b=False, memory=memory, host_memory="64MiB", resume=False,
                            calibrate=True)[0]
    finally:
        for x in closing:
            x.close()


def test_a_chosen_plan_whose_step_shape_runs_slow_is_chosen_again():
    """The chosen plan's steps are timed at their shape; where that shape runs slow, the
    plan is chosen again under the timed rate (and that plan's shape timed in turn)."""
    first = _plan_with(_StagingBackend())
    shape = (first.bm, first.bn, first.bk)
    be = _ShapeTimingBackend(slow=[shape])
    p = _plan_with(be)
    assert be.asked[0] == shape and (p.bm, p.bn, p.bk) != shape
    assert len(be.asked) <= job.SHAPE_ROUNDS and be.asked[-1] == (p.bm, p.bn, p.bk)
    assert p.rates.shape_flops(*shape) == snap_rate(0.01 * _GPU_RATES.flops)
    slowed = replace(first, rates=p.rates)
    assert p.predicted_seconds < slowed.predicted_seconds  # the plan it left, at that rate


@pytest.mark.parametrize("be, n, asked", [
    (_ShapeTimingBackend(), 2048, 1),                # its rate: the same plan, timed once
    (_ShapeTimingBackend(rate=0.93), 2048, 1),       # within the tolerance: as modelled
    (_ShapeTimingBackend(untimed=True), 2048, 1),    # cannot be timed now: as it was
    (_ShapeTimingBackend(), 256, 0),                 # a few steps: not worth timing
])
def test_a_plan_whose_shape_runs_at_the_rate_stays(be, n, asked):
    first = _plan_with(_StagingBackend(), n=n)
    p = _plan_with(be, n=n)
    assert p.key() == first.key() and len(be.asked) == asked
    assert p.rates.shapes == ()  # nothing the model needs to be told


@pytest.mark.parametrize("out, whole", [
    ("c.h5:/C", True),  # C written to a file: its writes should start early
    (None, False),      # C a new array: not tried (nor faster here: C is copied out fast)
])
def test_c_written_to_storage_plans_with_one_operand_whole(tmp_path, out, whole):
    # n = 32768 chunked HDF5 inputs (never written: planning reads no data), 8 GiB
    specs = []
    for name in "AB":
        with h5py.File(tmp_path / f"{name}.h5", "w") as f:
            f.create_dataset(name, shape=(32768, 32768), dtype=np.float32, chunks=(4096, 4096))
        specs.append(f"{tmp_path / f'{name}.h5'}:/{name}")
    closing = []
    A, B = job.open_inputs(*specs, closing)
    try:
        p, _ = job.plan_job(A, B, out and f"{tmp_path / out}", _StagingBackend(), alpha=1.0,
                            beta=0.0, trans_a=False, trans_b=False, memory="8GiB",
                            host_memory="16GiB", resume=False, calibrate=True)
    finally:
        for x in closing:
            x.close()
    assert (p.order in search.WHOLE_ORDERS) == whole
    assert (p.a_reads, p.b_reads) == (1, 1)


@pytest.mark.parametrize("pinned, verify, in_place, read, write", [
    # A, B and C pinned: the copies take them in place, nothing is read or written on the host
    ("ABC", None, "ABC", None, None),
    # under checks C goes through staging (a tile that fails must not reach it)
    ("ABC", "checksum", "AB", None, "copy"),
    # one pageable input: it is read into staging at the host's copy rate
    ("BC", None, "BC", "copy", None),
])
def test_pinned_arrays_are_planned_without_host_reads_or_writes(pinned, verify, in_place, read,
                                                                write):
    ops = {"A": random_matrix((600, 500), np.float32), "B": random_matrix((500, 400), np.float32, 1),
           "C": np.empty((600, 400), np.float32)}
    be = _StagingBackend(pinned=[ops[x] for x in pinned])
    closing = []
    A, B = job.open_inputs(ops["A"], ops["B"], closing)
    try:
        p, _ = job.plan_job(A, B, ops["C"], be, alpha=1.0, beta=0.0, trans_a=False,
                             trans_b=False, memory="2MiB", host_memory="4MiB", resume=False,
                             calibrate=True, verify=verify)
    finally:
        for x in closing:
            x.close()
    assert p.in_place == in_place and p.registered == ""
    assert p.host_bytes == sum(size for op, size in (
        ("A", p.host_panel_slots("A") * p.bm * p.bk),
        ("B", p.host_panel_slots("B") * p.bk * p.bn), ("C", 2 * p.bm * p.bn))
        if op not in in_place) * 4  # staging slots only for the staged operands
    copy = _copy_rates()[0]
    if read is not None:
        assert p.rates.read_bytes == copy
    if write is not None:
        assert p.rates.write_bytes == copy


class _LockingStagingBackend(_StagingBackend):
    """A staging backend that can page-lock arrays in place, at ``rate`` bytes a second."""

    def __init__(self, rate):
        super().__init__()
        self.rate = rate

    def rates(self, dtype, limit):
        return replace(_GPU_RATES, register_bytes=self.rate)

    def register(self, ptr, nbytes, read_only=False):
        pass

    def unregister(self, ptr):
        pass


@pytest.mark.parametrize("threads", [
    None,  # the default: one per core, 2 to 16
    3,     # as given
])
def test_plan_is_made_with_the_io_threads_matmul_runs_with(monkeypatch, threads):
    # the host's copy rates, and so a GPU run's plan, depend on the threads: plan and matmul
    # must plan with the same number
    seen = []
    real = api.plan_job
    monkeypatch.setattr(api, "plan_job", lambda *a, **kw: seen.append(kw["io_threads"])
                        or real(*a, **kw))
    a, b = random_matrix((60, 50), np.float32), random_matrix((50, 40), np.float32, 1)
    p = bigmm.plan(a, b, memory="16KiB", backend="numpy", io_threads=threads)
    bigmm.matmul(a, b, memory="16KiB", backend="numpy", io_threads=threads)
    assert seen == [job.parse_io_threads(threads)] * 2 and p.n_tiles > 1
    with pytest.raises(errors.OptionError, match="io_threads"):
        bigmm.plan(a, b, backend="numpy", io_threads=0)


@pytest.mark.parametrize("rate, searched", [
    (1e6, False),  # locking alone takes longer than the staged plan: not searched
    (1e12, True),  # locking is quick: the plan copying all three in place is searched too
])
def test_locking_for_the_run_is_searched_only_where_it_could_win(monkeypatch, rate, searched):
    ops = [random_matrix((600, 500), np.float32), random_matrix((500, 400), np.float32, 1),
           np.empty((600, 400), np.float32)]
    calls = []
    real = planstore.make_plan  # a plan searched by time goes through the plan store
    monkeypatch.setattr(planstore, "make_plan",
                        lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    closing = []
    A, B = job.open_inputs(ops[0], ops[1], closing)
    try:
        p, _ = job.plan_job(A, B, ops[2], _LockingStagingBackend(rate), alpha=1.0, beta=0.0,
                             trans_a=False, trans_b=False, memory="2MiB", host_memory="4MiB",
                             resume=False, calibrate=True)
    finally:
        for x in closing:
            x.close()
    assert [kw["registered"] for kw in calls] == ["", "ABC"][:1 + searched]
    assert p.registered == ("ABC" if searched and p.in_place else "")


@pytest.mark.parametrize("a_kind, locked", [
    ("array", "AB"),  # both arrays locked for the run
    ("zstd", "B"),    # A compressed in a Zarr store: its decode buffers offered (checked early)
])
def test_a_resumed_schedule_is_planned_on_the_host_path_it_fits(tmp_path, a_kind, locked):
    # a run that locked the user's arrays for the run staged them not in host memory: its
    # schedule's staging would not fit the host budget, and the resume must not be refused
    # for that path (it plans the schedule on the paths it fits, here the locked one)
    a, b = random_matrix((600, 500), np.float32), random_matrix((500, 400), np.float32, 1)
    spec_c, budgets = f"{tmp_path / 'c.h5'}:/C", dict(memory="2MiB", host_memory="1MiB")
    if a_kind == "zstd":
        pytest.importorskip("zarr")
        zarr_array(tmp_path / "a.zarr", a, chunks=(100, 100), codec="zstd")
        a_op = str(tmp_path / "a.zarr")
    else:
        a_op = a

    first = _locking_plan((a_op, b), spec_c, 1e12, False, **budgets)
    assert first.registered == locked
    with pytest.raises(errors.BudgetError):  # all staged, the schedule needs more host memory
        make_plan(600, 400, 500, "float32", device_budget=first.device_budget,
                  host_budget=first.host_budget, staging=True, tile=(first.bm, first.bn, first.bk),
                  order=first.order, tail=first.tail if first.order == "resident-c" else None,
                  decoding=first.decoding)
    assert _stopped_at_first_tile(first, (a_op, b), spec_c)
    resumed = _locking_plan((a_op, b), spec_c, 1e12, True, **budgets)
    assert resumed.key() == first.key() and resumed.registered == locked
    _, stats = bigmm.matmul(a_op, b, spec_c, backend="numpy", resume=True, stats=True,
                            memory="16MiB")  # the NumPy backend holds its panels in host memory
    assert stats.tiles_skipped >= 1
    with h5py.File(tmp_path / "c.h5", "r") as f:
        got = f["C"][...]
    assert relative_error(got, reference_gemm(a, b)) <= tolerance(np.float32, 500)


def _locking_plan(ops, spec_c: str, rate: float, resume: bool, **budgets):
    """The plan of ops[0] @ ops[1] into ``spec_c`` on a staging backend that page-locks
    arrays at ``rate`` bytes a second, planned by time."""
    closing: list = []
    A, B = job.open_inputs(ops[0], ops[1], closing)
    try:
        return job.plan_job(A, B, spec_c, _LockingStagingBackend(rate), alpha=1.0, beta=0.0,
                            trans_a=False, trans_b=False, resume=resume, calibrate=True,
                            **budgets)[0]
    finally:
        for x in closing:
            x.close()


def _stopped_at_first_tile(first, ops, spec_c: str) -> bool:
    """Run ``first``'s schedule on the NumPy backend into ``spec_c``, its journal recording
    ``first``, stopped at its first report of a tile: True, or False where every tile was
    done before that report (nothing to resume)."""
    from bigmm import io
    from bigmm.executor import execute

    def stop(p):
        raise KeyboardInterrupt

    A, B = io.open_input(ops[0], name="A"), io.open_input(ops[1], name="B")
    sink = io.open_output(spec_c, shape=(first.m, first.n), dtype=np.float32, inputs=[A, B],
                          job=job.job_record(first, 1.0, 0.0))
    cpu = make_plan(first.m, first.n, first.k, "float32", device_budget=1 << 26,
                    staging=False, tile=(first.bm, first.bn, first.bk), order=first.order,
                    tail=first.tail if first.order == "resident-c" else None)
    try:
        execute(cpu, A, B, sink, NumpyBackend(), progress=stop)
        return False
    except errors.Interrupted:
        return True
    finally:
        sink.close(), A.close(), B.close()


def test_a_job_planned_by_time_takes_the_schedule_an_earlier_process_kept(tmp_path,
                                                                         monkeypatch):
    from bigmm import calibration

    monkeypatch.setenv(calibration.MODE_ENV, "")
    monkeypatch.setenv(calibration.DIR_ENV, str(tmp_path / "cache"))
    a, b = random_matrix((3000, 2500), np.float32), random_matrix((2500, 2000), np.float32, 1)
    closing = []
    A, B = job.open_inputs(a, b, closing)

    def plan():
        make_plan.cache_clear()  # as in a later process
        return job.plan_job(A, B, None, _StagingBackend(), alpha=1.0, beta=0.0,
                            trans_a=False, trans_b=False, memory="16MiB",
                            host_memory="64MiB", resume=False, calibrate=True)[0]

    try:
        first = plan()
        kept = {name: entry for name, entry in calibration.kept().items()
                if name.startswith(planstore.KIND + ":")}
        assert [v for _, v in kept.values()] == [planstore.choice(first)]
        # another schedule kept under the job's arguments: the next plan is that one
        other = {"tile": [512, 1024, 512], "order": "stream", "tail": 0, "a_span": 1}
        (name,) = kept
        calibration.keep(planstore.KIND, json.loads(name.split(":", 1)[1]), other)
        later = plan()
    finally:
        for x in closing:
            x.close()
    assert (later.bm, later.bn, later.bk, later.order) == (512, 1024, 512, "stream")
    assert later.rates == first.rates and later.in_place == first.in_place


@pytest.mark.parametrize("fuses", [
    True,   # the gemm does the checks' updates: the tiles of the unchecked run
    False,  # separate passes over the panels: the tiles are chosen with them counted
])
def test_checked_runs_plan_with_the_checks_costs(fuses):
    class Checking(_StagingBackend, NumpyBackend):  # NumPy's checksums, GPU-like planning
        checksum_rate, checksum_step, fuses_checks = 1e10, 1e-4, fuses

        def __init__(self):
            NumpyBackend.__init__(self)
            _StagingBackend.__init__(self)

    a, b = random_matrix((3000, 2500), np.float32), random_matrix((2500, 2000), np.float32, 1)
    closing = []
    A, B = job.open_inputs(a, b, closing)
    try:
        plans = {v: job.plan_job(A, B, None, Checking(), alpha=1.0, beta=0.0, trans_a=False,
                                  trans_b=False, memory="16MiB", host_memory="64MiB",
                                  resume=False, calibrate=True, verify=v)[0]
                 for v in (None, "checksum")}
    finally:
        for x in closing:
            x.close()
    checked = plans["checksum"]
    assert checked.rates.check_bytes == 1e10 and checked.rates.check_fused == fuses
    # the predicted time counts the checks either way
    assert checked.predicted_seconds > replace(checked, rates=plans[None].rates).predicted_seconds
    if fuses:
        assert checked.key() == plans[None].key()
    else:  # chosen with the checks counted: no slower under them than the unchecked tiles
        assert checked.predicted_seconds <= replace(plans[None],
                                                    rates=checked.rates).predicted_seconds


def test_cpu_matmul_plans_by_bytes_as_plan_does(tmp_path):
    # on the CPU plan() calibrates for its predicted time only: the tiles are matmul's
    a, b = random_matrix((300, 200), np.float32), random_matrix((200, 250), np.float32, 1)
    from bigmm.backends.numpy import NumpyBackend
    from bigmm.planner import cpu_step_bytes

    p = bigmm.plan(a, b, memory="200KiB", backend="numpy")
    fresh = make_plan(300, 250, 200, device_budget=200 * 1024, host_budget=200 * 1024,
                      staging=False, step_bytes=cpu_step_bytes(NumpyBackend().gemm_threads()))
    assert p.key() == fresh.key() and p.predicted_seconds is not None


def test_default_budgets_are_whole_grains():
    from bigmm.job import BUDGET_GRAIN, resolve_budgets
    from bigmm.backends.numpy import NumpyBackend

    device, host = resolve_budgets(NumpyBackend(), None, None)
    # a share of what is free, rounded down so that small changes keep the cached plan
    assert device % BUDGET_GRAIN == 0 or device < 4 * BUDGET_GRAIN
    assert host == device  # no staging on the CPU
    # budgets the user gives are kept to the byte
    assert resolve_budgets(NumpyBackend(), 123456789, None) == (123456789, 123456789)


@pytest.mark.parametrize("staging", [False, True])  # the CPU's budget; a staging backend's two
def test_default_budgets_keep_the_last_while_what_is_free_moves_a_little(monkeypatch, staging):
    from bigmm import job
    from bigmm.backends.numpy import NumpyBackend

    class Moving(NumpyBackend):  # a backend whose free memory the test sets
        free = 40 << 30

        def memory_available(self) -> int:
            return self.free

    Moving.staging = staging
    ram = {"now": 100 << 30}
    monkeypatch.setattr(job, "host_memory_available", lambda: ram["now"])
    monkeypatch.setattr(job, "_LAST_BUDGETS", {})
    be = Moving()
    first = job.resolve_budgets(be, None, None)
    be.free, ram["now"] = (41 << 30), (97 << 30)  # a little more device, a little less RAM
    assert job.resolve_budgets(be, None, None) == first  # the same budgets: the cached plan
    be.free = 39 << 30  # less device memory than before: never more than its share of it
    device, _ = job.resolve_budgets(be, None, None)
    assert device < first[0] and device <= 39 << 30
    be.free, ram["now"] = (80 << 30), (50 << 30)  # much more free, much less RAM: new budgets
    device, host = job.resolve_budgets(be, None, None)
    assert device > first[0]
    if staging:
        assert host < first[1] and host <= (50 << 30) * job.HOST_SHARE


def test_inputs_are_read_with_the_backends_reader_threads_and_map_step(tmp_path):
    from bigmm.backends.numpy import NumpyBackend
    from bigmm.io import mapped, source

    a = _h5(tmp_path / "a.h5", "A", random_matrix((40, 30), np.float32))
    b = _h5(tmp_path / "b.h5", "B", random_matrix((30, 20), np.float32, 1))
    with api._opened(a, b, "numpy", None) as (be, A, B, _):
        # on the CPU the readers share the cores with the BLAS: the backend names fewer
        assert A._threads == B._threads == NumpyBackend.reader_threads == 2
        assert A._map.step == B._map.step == mapped.STEP_BYTES  # and no block size
    # without a backend's say, the source's own defaults
    closing = []
    A, B = job.open_inputs(a, b, closing)
    try:
        assert A._threads == B._threads == source.DEFAULT_THREADS
        assert A._map.step == B._map.step == mapped.STEP_BYTES
    finally:
        for x in closing:
            x.close()

    class Wide:  # a backend that names wider blocks for copies out of the maps (as the GPU's)
        reader_threads, map_step = None, mapped.WIDE_STEP_BYTES

        def gemm_threads(self):
            return None

    closing = []
    A, B = job.open_inputs(a, b, closing, Wide())
    try:
        assert A._map.step == B._map.step == mapped.WIDE_STEP_BYTES
        assert A._threads == source.DEFAULT_THREADS
    finally:
        for x in closing:
            x.close()
    # Zarr inputs copy their raw chunks in the backend's blocks too
    z = tmp_path / "a.zarr"
    zarr_array(z, random_matrix((40, 30), np.float32, 2), chunks=(8, 30))
    closing = []
    A, B = job.open_inputs(str(z), b, closing, Wide())
    try:
        assert A.layout == "zarr-raw" and A._map_step == mapped.WIDE_STEP_BYTES
    finally:
        for x in closing:
            x.close()


def _small_steps(tmp_path):
    """A and B in HDF5 files (chunked 128 x 128) whose product under a 128 KiB budget takes
    about 3000 small steps."""
    a, b = random_matrix((1000, 1200), np.float32, 1), random_matrix((1200, 900), np.float32, 2)
    with h5py.File(tmp_path / "ab.h5", "w") as f:
        f.create_dataset("A", data=a, chunks=(128, 128))
        f.create_dataset("B", data=b, chunks=(128, 128))
    return f"{tmp_path / 'ab.h5'}:/A", f"{tmp_path / 'ab.h5'}:/B", a, b


def test_tiny_budgets_predict_the_time_of_their_many_small_steps(tmp_path):
    """Under a budget of a few hundred KiB a job runs thousands of small steps, whose fixed
    costs (the executor's, the reads', a BLAS call's start, timed on this machine) the model
    counts: the predicted time is the measured one within a factor of 3 (the machine running
    the tests is loaded; the model without those costs was 77x off)."""
    spec_a, spec_b, a, b = _small_steps(tmp_path)
    p = bigmm.plan(spec_a, spec_b, memory="128KiB", backend="numpy")
    assert p.n_steps >= 2000 and p.rates.per_step > 0
    t0 = time.perf_counter()
    out = bigmm.matmul(spec_a, spec_b, memory="128KiB", backend="numpy")
    seconds = time.perf_counter() - t0
    assert relative_error(out, reference_gemm(a, b)) <= tolerance(np.float32, 1200)
    assert p.predicted_seconds / 3 <= seconds <= 3 * p.predicted_seconds, (
        seconds, p.predicted_seconds)


def test_a_budget_that_slows_the_plan_down_is_noted_with_one_that_helps(tmp_path,
                                                                       monkeypatch):
    monkeypatch.setattr(advice, "NOTE_SECONDS", 0.1)  # a small job: a tenth of a second matters
    spec_a, spec_b, _, _ = _small_steps(tmp_path)
    kw = dict(backend="numpy")
    p = bigmm.plan(spec_a, spec_b, memory="128KiB", **kw)
    note = api.budget_note(spec_a, spec_b, memory="128KiB", plan=p, **kw)
    assert note is not None and "\n" not in note and note.startswith("note: memory=128KiB")
    helps = re.search(r"; memory=(\d+[KMG]iB) is predicted", note).group(1)
    default = bigmm.plan(spec_a, spec_b, **kw)
    better = bigmm.plan(spec_a, spec_b, memory=helps, **kw)
    assert p.predicted_seconds >= advice.NOTE_SLOWER * default.predicted_seconds
    # each call times the host's costs afresh (the gemm's rate moves between calls on a busy
    # machine): the budget named is within NOTE_NEAR of the default as the note predicted
    # both (to the note's rounding)
    unit = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
    (t, tu), (best, bu), (q, qu) = re.findall(r"([\d.]+) (us|ms|s)\b(?: predicted|\);|$)",
                                              note)
    assert float(q) * unit[qu] <= advice.NOTE_NEAR * float(best) * unit[bu] * 1.01, note
    assert float(t) * unit[tu] >= advice.NOTE_SLOWER * float(best) * unit[bu] * 0.99, note
    assert better.device_budget < default.device_budget  # the smallest that helps, not all
    # no budget given, or one that costs nothing: no note
    assert api.budget_note(spec_a, spec_b, **kw) is None
    assert api.budget_note(spec_a, spec_b, memory=helps, **kw) is None



class _NoisyStagingBackend(_StagingBackend):
    """Rates that come out 40% apart from one timing to the next, as a loaded machine's."""

    def __init__(self):
        super().__init__()
        self.timings = 0

    def rates(self, dtype, limit):
        self.timings += 1
        return replace(_GPU_RATES, flops=_GPU_RATES.flops * (1.4 if self.timings % 2 else 1.0))


def test_a_host_budget_alone_is_noted_under_one_timing(monkeypatch):
    """A note for ``host_memory`` alone names a host budget that helps, and compares its plans
    under the rates of one timing: with rates that move between timings it still ends."""
    monkeypatch.setattr(advice, "NOTE_SECONDS", 0.0)
    a, b = random_matrix((2000, 1500), np.float32), random_matrix((1500, 1800), np.float32, 1)
    closing, be = [], _NoisyStagingBackend()
    A, B = job.open_inputs(a, b, closing)
    try:
        kw = dict(alpha=1.0, beta=0.0, trans_a=False, trans_b=False, resume=False,
                  calibrate=True)
        p, _ = job.plan_job(A, B, None, be, memory=None, host_memory="256KiB", **kw)
        before = be.timings
        note = advice.budget_note(A, B, None, be, p, memory=None, host_memory="256KiB", **kw)
    finally:
        for x in closing:
            x.close()
    assert note is not None and note.startswith("note: host_memory=256KiB")
    assert re.search(r"; host_memory=\d+[KMG]iB is predicted", note), note
    assert be.timings - before == 1  # the note's plans, timed once


@st.composite
def _interrupted(draw):
    side = st.integers(40, 700)
    return dict(m=draw(side), n=draw(side), k=draw(side),
                kinds=(draw(st.sampled_from(["array", "zstd"])),
                       draw(st.sampled_from(["array", "zstd"]))),
                memory=draw(st.sampled_from(["1MiB", "2MiB", "8MiB"])),
                host_memory=draw(st.sampled_from(["512KiB", "1MiB", "4MiB"])),
                rate=draw(st.sampled_from([1e6, 1e12])))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_interrupted())
def test_any_interrupted_staging_job_resumes_with_its_schedule(tmp_path_factory, case):
    # whatever host path and schedule the first run planned (arrays staged or locked for the
    # run, compressed inputs' decode buffers), its resume plans the same schedule, and the
    # resumed C is the product
    pytest.importorskip("zarr")
    m, n, k = case["m"], case["n"], case["k"]
    folder = tmp_path_factory.mktemp("resume")
    a, b = random_matrix((m, k), np.float32), random_matrix((k, n), np.float32, 1)
    ops = []
    for name, x, kind in (("a", a, case["kinds"][0]), ("b", b, case["kinds"][1])):
        if kind == "zstd":
            chunks = tuple(max(1, d // 3) for d in x.shape)
            zarr_array(folder / f"{name}.zarr", x, chunks=chunks, codec="zstd")
            ops.append(str(folder / f"{name}.zarr"))
        else:
            ops.append(x)
    spec_c = f"{folder / 'c.h5'}:/C"
    budgets = dict(memory=case["memory"], host_memory=case["host_memory"])
    try:
        first = _locking_plan(ops, spec_c, case["rate"], False, **budgets)
    except errors.BudgetError:  # budgets below a decoded chunk or the least tile: refused
        return
    if first.n_tiles < 2 or not _stopped_at_first_tile(first, ops, spec_c):
        return
    assert _locking_plan(ops, spec_c, case["rate"], True, **budgets).key() == first.key(), case
    _, stats = bigmm.matmul(ops[0], ops[1], spec_c, backend="numpy", resume=True, stats=True,
                            memory="64MiB")
    assert stats.tiles_skipped >= 1
    with h5py.File(folder / "c.h5", "r") as f:
        got = f["C"][...]
    assert relative_error(got, reference_gemm(a, b)) <= tolerance(np.float32, k), case
