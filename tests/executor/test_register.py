"""Page-locking the user's arrays for a run (``Plan.registered``), through the asynchronous
test backend with the Registers ability (``executor_cases.RegisteringAsyncBackend``): the
copies use the arrays in place, the locks cover whole pages and are released once the device
is done, a refused lock falls back to staging and says so."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest
from executor_cases import AsyncBackend, RegisteringAsyncBackend, array_run

from bigmm import io
from bigmm.errors import Interrupted
from bigmm.executor import execute
from bigmm.executor.register import PAGE, held, page_extent
from bigmm.planner import make_plan
from bigmm.testing import own_pages, random_matrix, reference_gemm, relative_error, tolerance


def _plan(m, n, k, *, beta=0.0, in_place="ABC", registered="ABC", order="stream",
          tile=(16, 16, 24), dtype="float64", **kw):
    return make_plan(m, n, k, dtype, reads_c=beta != 0, device_budget=64 << 20,
                     host_budget=64 << 20, staging=True, align=8, tile=tile, order=order,
                     in_place=in_place, registered=registered, **kw)


def _operands(m, n, k, beta, seed=0):
    a = random_matrix((m, k), np.float64, seed)
    b = random_matrix((k, n), np.float64, seed + 1)
    c = random_matrix((m, n), np.float64, seed + 2) if beta else np.full((m, n), np.nan)
    return a, b, c


CASES = [
    # (m, n, k, beta, in_place, registered, order)
    (37, 41, 97, 0.0, "ABC", "ABC", "stream"),  # all three locked, C poisoned
    (37, 41, 97, 0.5, "ABC", "ABC", "stream"),  # old C read from the locked C
    (53, 29, 61, 0.0, "AB", "AB", "resident-a"),  # inputs locked, C staged
    (29, 53, 61, 1.0, "BC", "C", "resident-b"),  # B page-locked by the user, C locked
    (70, 33, 97, 0.0, "ABC", "ABC", "resident-c"),  # every strip resident
]


@pytest.mark.parametrize("m,n,k,beta,in_place,registered,order", CASES)
def test_locked_arrays_are_copied_in_place_bit_identically(m, n, k, beta, in_place,
                                                          registered, order):
    tile = (16, n, 24) if order == "resident-c" else (16, 16, 24)
    plan = _plan(m, n, k, beta=beta, in_place=in_place, registered=registered, order=order,
                 tile=tile)
    a, b, c = (own_pages(x) for x in _operands(m, n, k, beta))  # no page shared with B
    c0 = c.copy()
    staged_c = c.copy()
    staged = array_run(AsyncBackend(seed=1), a.copy(), b.copy(), staged_c,
                       _plan(m, n, k, beta=beta, in_place="", registered="", order=order,
                             tile=tile), 0.5, beta)
    be = RegisteringAsyncBackend(seed=2)
    if "B" in in_place and "B" not in registered:
        be.pin(b)  # the user's own page-locked array: nothing to lock
    stats = array_run(be, a, b, c, plan, 0.5, beta)
    assert np.array_equal(c, staged_c)  # same plan, same gemms
    ref = reference_gemm(a, b, alpha=0.5, beta=beta, c=c0 if beta else None)
    assert relative_error(c, ref) <= 10 * tolerance(np.float64, k)
    through = {"A": 8 * plan.a_reads * m * k, "B": 8 * plan.b_reads * k * n,
                     "C": plan.bytes_written + (8 * m * n if beta else 0)}
    assert stats.bytes_staged == sum(v for op, v in through.items() if op not in in_place)
    assert staged.bytes_staged == sum(through.values())
    locks = [x for x in be.calls if x[0] == "register"]
    arrays = {"A": a, "B": b, "C": c}
    spans = sorted((lo, lo + nbytes) for _, lo, nbytes, _ in locks)
    for op in registered:  # each array in one lock (arrays sharing a page share a lock)
        lo, hi = page_extent(arrays[op])
        assert sum(a <= lo and hi <= b for a, b in spans) == 1
    assert all(x[1] <= y[0] for x, y in zip(spans, spans[1:]))  # no page locked twice
    assert all(lo % PAGE == 0 and nbytes % PAGE == 0 for _, lo, nbytes, _ in locks)
    assert stats.bytes_locked == sum(nbytes for _, _, nbytes, _ in locks) > 0
    assert stats.lock_seconds > 0 and stats.notes == ()
    assert be.locked == {} and be.violations == []  # released, and no copy after release
    assert be.calls[-len(locks):] == [("unregister", lo) for _, lo, _, _ in locks]


def test_views_of_one_buffer_are_locked_once():
    # A and B share a buffer (B is rows of the same array): their pages are locked together
    m, n, k = 40, 30, 50
    # on pages of its own: A ends 16000 bytes in, mid-page
    buf = own_pages(random_matrix((m + k, k), np.float64, 3))
    a, b = buf[:m], buf[m:, :n]
    plan = _plan(m, n, k, registered="AB", in_place="AB")
    be = RegisteringAsyncBackend(seed=3)
    c = np.full((m, n), np.nan)
    stats = array_run(be, a, b, c, plan, 1.0, 0.0)
    assert [x[0] for x in be.calls] == ["register", "unregister"]
    # the pages A and B touch, as one range (B ends short of the buffer's last row, and so
    # of its last page where that row crosses a page boundary)
    (a_lo, a_hi), (b_lo, b_hi) = page_extent(a), page_extent(b)
    lo, hi = min(a_lo, b_lo), max(a_hi, b_hi)
    assert a_hi > b_lo  # the two ranges share a page: one lock
    assert be.calls[0][1:3] == (lo, hi - lo)
    assert stats.bytes_staged == plan.bytes_written  # C staged, A and B in place
    assert relative_error(c, reference_gemm(a, b)) <= tolerance(np.float64, k)


def test_read_only_inputs_are_locked_read_only():
    m, n, k = 40, 30, 50
    a, b, c = (own_pages(x) for x in _operands(m, n, k, 0.0, seed=4))
    a.flags.writeable = False
    be = RegisteringAsyncBackend(seed=4)
    array_run(be, a, b, c, _plan(m, n, k), 1.0, 0.0)
    flags = {lo: read_only for kind, lo, _, read_only in
             (x for x in be.calls if x[0] == "register")}
    assert flags == {page_extent(a)[0]: True, page_extent(b)[0]: False,
                     page_extent(c)[0]: False}
    assert relative_error(c, reference_gemm(a, b)) <= tolerance(np.float64, k)


REFUSED = [
    # (backend, what the run says)
    (lambda: RegisteringAsyncBackend(5, refuse=lambda ptr, n, ro: ro), "refused"),  # read-only
    # memory refused: A staged, B and C locked
    (lambda: AsyncBackend(seed=5), "cannot page-lock"),  # no Registers ability: all staged
]


@pytest.mark.parametrize("make,why", REFUSED)
def test_refused_locks_fall_back_to_staging_and_say_so(make, why):
    m, n, k = 45, 38, 71
    a, b, c = (own_pages(x) for x in _operands(m, n, k, 0.0, seed=5))
    a.flags.writeable = False
    be = make()
    stats = array_run(be, a, b, c, _plan(m, n, k), 2.0, 0.0)
    assert relative_error(c, reference_gemm(a, b, alpha=2.0)) <= tolerance(np.float64, k)
    staged = [note.split()[0] for note in stats.notes]
    assert all(why in note for note in stats.notes)
    plan = _plan(m, n, k)
    if isinstance(be, RegisteringAsyncBackend):
        assert staged == ["A"] and stats.bytes_staged == 8 * plan.a_reads * m * k
        assert be.locked == {} and be.violations == []
    else:
        assert staged == ["A", "B", "C"] and stats.bytes_locked == 0
        assert stats.bytes_staged == plan.bytes_read + plan.bytes_written


def test_an_interrupted_run_releases_its_locks():
    m, n, k = 64, 64, 96
    a, b, c = _operands(m, n, k, 0.0, seed=6)
    plan = _plan(m, n, k)
    be = RegisteringAsyncBackend(seed=6)
    A, B = io.open_input(a, name="A"), io.open_input(b, name="B")
    sink = io.open_output(c, shape=(m, n), dtype=np.float64, inputs=[A, B], job={})
    stop = threading.Event()

    def on_tile(p):
        if p.tiles_done == 2:
            stop.set()

    try:
        with pytest.raises(Interrupted):
            execute(plan, A, B, sink, be, progress=on_tile, stop=stop)
    finally:
        be.close()
    assert any(x[0] == "register" for x in be.calls)
    assert be.locked == {} and be.violations == []


def test_plans_name_operands_in_place_and_locked():
    plan = _plan(300, 200, 500, tile=(128, 128, 128))
    staged = _plan(300, 200, 500, tile=(128, 128, 128), in_place="", registered="")
    assert plan.host_bytes == 0 < staged.host_bytes  # no staging slots for arrays in place
    assert "A, B, C copied in place; A, B, C page-locked for the run" in str(plan)
    assert _plan(300, 200, 500, in_place="CA", registered="A").in_place == "AC"
    with pytest.raises(Exception, match="registered"):
        _plan(300, 200, 500, in_place="A", registered="B")


@pytest.mark.parametrize("a_span,tail", [
    (2, 1),  # pairs of A panels in one pitched copy from the locked array, a one-panel tail
    (3, 2),  # three at a time in the rounds, the tail's two in one
])
def test_wide_a_loads_copied_in_place_bit_identically(a_span, tail):
    m, n, k = 70, 33, 97
    kw = dict(order="resident-c", tile=(16, n, 24), tail=tail, a_span=a_span)
    a, b, c = (own_pages(x) for x in _operands(m, n, k, 0.0))
    staged_c = c.copy()
    array_run(AsyncBackend(seed=1), a.copy(), b.copy(), staged_c,
              _plan(m, n, k, in_place="", registered="", **kw), 0.5, 0.0)
    plan = _plan(m, n, k, **kw)
    stats = array_run(RegisteringAsyncBackend(seed=2), a, b, c, plan, 0.5, 0.0)
    assert plan.a_span == a_span and np.array_equal(c, staged_c)
    assert relative_error(c, reference_gemm(a, b, alpha=0.5)) <= 10 * tolerance(np.float64, k)
    assert stats.bytes_staged == 0 and stats.bytes_read == 8 * (m * k + k * n)


def test_arrays_held_locked_serve_runs_in_place_and_are_released_after():
    m, n, k = 37, 41, 97
    a, b, c = (own_pages(x) for x in _operands(m, n, k, 0.0, seed=6))
    staged_c = c.copy()
    array_run(AsyncBackend(seed=1), a.copy(), b.copy(), staged_c,
              _plan(m, n, k, in_place="", registered=""), 1.0, 0.0)
    be = RegisteringAsyncBackend(seed=6)
    with held(be, [a, b, c]) as locked:
        assert sorted(x[1] for x in be.calls) == sorted(page_extent(x)[0] for x in (a, b, c))
        assert locked.nbytes == sum(hi - lo for lo, hi in map(page_extent, (a, b, c)))
        for _ in range(2):  # runs copy them in place, locking nothing more
            stats = array_run(be, a, b, c, _plan(m, n, k, registered=""), 1.0, 0.0,
                              close=False)
            assert stats.bytes_staged == 0 and stats.bytes_locked == 0
        assert len(be.calls) == 3 and np.array_equal(c, staged_c)
    assert be.locked == {} and be.violations == []
    assert [x[0] for x in be.calls] == ["register"] * 3 + ["unregister"] * 3
    be.close()


@pytest.mark.parametrize("case", [
    "error",       # the block raises: the locks are released all the same
    "pinned",      # an array page-locked already is left as it is
    "negative",    # a view with negative strides is left unlocked, and said so
    "no-ability",  # a backend that cannot lock: nothing locked, each array named
])
def test_held_arrays_edge_cases(case):
    a, b, _ = (own_pages(x) for x in _operands(20, 30, 40, 0.0, seed=7))
    be = AsyncBackend(seed=7) if case == "no-ability" else RegisteringAsyncBackend(seed=7)
    if case == "pinned":
        be.pin(a)
    arrays = [a[::-1] if case == "negative" else a, b]
    with pytest.raises(RuntimeError, match="boom") if case == "error" else \
            contextlib.nullcontext():
        with held(be, arrays) as locked:
            if case == "error":
                raise RuntimeError("boom")
    locks = [x for x in getattr(be, "calls", []) if x[0] == "register"]
    if case == "no-ability":
        assert set(locked.staged) == {"array 0", "array 1"} and locked.nbytes == 0
    else:
        expected = (a, b) if case == "error" else (b,)
        assert sorted(x[1] for x in locks) == sorted(page_extent(x)[0] for x in expected)
        assert be.locked == {}
    if case == "negative":
        assert "negative strides" in locked.staged["array 0"]
    be.close()
