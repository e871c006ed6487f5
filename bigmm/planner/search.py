"""The search: job shapes, dtype, transposes, budgets and chunk shapes -> the Plan to run.

The planner enumerates tile sizes for each loop order and keeps those within both budgets.
Without rates it picks the fewest bytes moved, counting as moved the pipeline's fill (the
first panels) and drain (the last C tile), which no overlap hides, and a fixed cost per gemm;
ties go to fewer tiles, then larger K panels.

With :class:`~bigmm.planner.model.Rates` it picks the shortest predicted time (ties: the byte
order above), the makespan of the pipeline model. Candidates are simulated in order of a
quick estimate, at most SIM_PLANS of them, skipping any whose lower bound
(:class:`~bigmm.planner.stages.StageTimes`) exceeds the best time found. The byte objective cannot
see that a plan reading all of A before its first tile can compute waits for it; the time
does. The plan chosen holds its rates, and its predicted time was computed while choosing.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

from ..errors import BudgetError, DtypeError, PlanError, ShapeError
from ..units import DTYPES, accumulate_dtype, format_bytes
from . import decode
from .model import SIM_STEPS, Rates, stage_times
from .schedule import OPERANDS, ORDERS, WHOLE_ORDERS, Plan
from .stages import StageTimes

#: Fixed cost of one gemm step (launch, events, the executor's bookkeeping), counted as bytes
#: moved when comparing schedules: about 40 us at 25 GB/s. Stops the planner from trading a few
#: bytes for thousands of tiny panels.
STEP_COST_BYTES = 1 << 20
#: Writing a byte of C (device -> host copy, then disk) costs about twice reading one.
DRAIN_WEIGHT = 2
#: Most candidate plans simulated when choosing by time (those with the lowest bounds).
SIM_PLANS = 32
#: Of orders whole-a and whole-b, the candidates with the lowest guesses simulated beside
#: the others (the guess ranks their plans poorly: a whole-a plan's first column waits for all
#: of A).
SIM_PER_ORDER = 4
#: Candidates with the fewest gemm steps simulated beside them, and how many of the fastest
#: are also tried with deeper K panels.
SIM_LARGE = 8
DEEPEN = 4
#: Resident-c candidates simulated per K panel depth (those with the lowest bounds: a strip
#: height's tails, whose bounds are equal).
SIM_RESIDENT_C = 5
#: Predicted times within this share of the fastest are taken as equal (the model is not
#: that exact). Of those, where the host's reads or writes outweigh the gemms, the plan
#: reading the fewest bytes is chosen (copies the model counts apart, the host's reads and
#: writes, share its memory bandwidth), and of resident-c plans as near reading as little the
#: one with the deepest K panels; where the gemms outweigh them, the plan of any order with
#: the deepest K panels (deeper gemms run faster than the model knows: cuBLAS TF32 ran
#: 4096-deep steps of 3072 x 81920 strips at 271 TFLOP/s and 8192-deep ones at 342 on an
#: H100; its SGEMM 8192 x 8192 x 4096 at 50.8 TFLOP/s, x 16384 at 52.8).
NEAR = 0.03
#: Where C goes to storage (``make_plan(..., whole=True)``), of the near plans reading the
#: fewest bytes in the best plan's order, the one the model puts fastest with the inputs read
#: at this rate (bytes per second; at least the rates' own), as from the page cache: at the
#: nominal file rates the model loads the reads as much as the writes and cannot tell which
#: heights of the tiles keep the gemms and the writer busy while the operand kept whole is
#: read (see BENCHMARKS.md, the HDF5 and Zarr jobs).
CACHED_READ_RATE = 8e9


def _check_dims(m: int, n: int, k: int) -> None:
    for name, v in (("M", m), ("N", n), ("K", k)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ShapeError(f"Expected {name} to be a positive integer. Got {v!r}.")


def _deeper(k: int, unit: int, shallow: int) -> list[int]:
    """K panel depths beyond ``shallow``, up to twice it, deepest first: every even split of
    ``k`` (in multiples of ``unit``) in that range, as a depth that divides K leaves no
    short last panel (a step of its own)."""
    parts = range(max(1, -(-k // (2 * shallow))), -(-k // shallow) + 1)
    return sorted({d for d in (even_edge(k, nb, unit) for nb in parts)
                   if shallow < d <= 2 * shallow}, reverse=True)


def _units(dim: int, chunk: int | None, align: int) -> int:
    """Tile-size unit along one dimension: the chunk edge if chunked, else ``align``."""
    unit = chunk if chunk else align
    return max(1, min(unit, dim))


def even_edge(dim: int, parts: int, unit: int) -> int:
    """The tile edge that splits ``dim`` into ``parts`` even pieces, rounded up to a multiple
    of ``unit``: ceil(ceil(dim / parts) / unit) * unit, at most ``dim``."""
    return min(dim, -(-(-(-dim // parts)) // unit) * unit)


def _candidates(dim: int, unit: int, lo: int) -> list[int]:
    """Tile sizes for one dimension: even splits of ``dim`` rounded up to ``unit``, largest first.

    Includes the smallest allowed size, max(unit, min(dim, lo)) capped at dim, so the minimum
    budget stated for unaligned tiles (unit 1) works.
    """
    out = {min(dim, max(unit, lo))}
    nb = 1
    while True:
        t = even_edge(dim, nb, unit)
        if t < min(lo, dim):
            break
        out.add(t)
        if t <= unit:
            break
        nb = nb + 1 if nb < 8 else max(nb + 1, int(nb * 1.4))
    return sorted(out, reverse=True)


def _op_chunks(chunks: tuple[int, int] | None, trans: bool) -> tuple[int | None, int | None]:
    """Chunk edges of op(X) as (rows, cols) of op(X)."""
    if not chunks:
        return None, None
    return (chunks[1], chunks[0]) if trans else (chunks[0], chunks[1])


#: Plans kept by make_plan.
PLAN_CACHE = 256


def _cached_plans(plan_fn):
    """``plan_fn`` keeping its last PLAN_CACHE results by argument: plans are frozen and depend
    on the arguments alone, so a process running jobs of one shape plans once (choosing by
    time simulates up to SIM_PLANS schedules, tens of milliseconds). Lists (chunk shapes,
    tiles) count as the tuples they equal; errors are raised again every time."""
    cached = functools.lru_cache(maxsize=PLAN_CACHE)(plan_fn)

    @functools.wraps(plan_fn)
    def plan(*args, **kwargs):
        return cached(*args, **{k: tuple(v) if isinstance(v, list) else v
                                for k, v in kwargs.items()})

    plan.cache_clear = cached.cache_clear
    return plan


@_cached_plans
def make_plan(m: int, n: int, k: int, dtype: str = "float32", *, trans_a: bool = False,
              trans_b: bool = False, reads_c: bool = False, device_budget: int,
              host_budget: int | None = None, staging: bool = True,
              a_chunks: tuple[int, int] | None = None, b_chunks: tuple[int, int] | None = None,
              align: int = 256, max_bk: int = 4096, min_tile: int = 8,
              tile: tuple[int, int, int] | None = None, order: str | None = None,
              rates: Rates | None = None, step_bytes: int = STEP_COST_BYTES,
              tail: int | None = None, in_place: str | None = None,
              registered: str = "", symmetric: bool = False, upper: bool = False,
              presplit: int = 0, whole: bool = False, a_span: int | None = None,
              a_dtype: str | None = None, b_dtype: str | None = None,
              out_dtype: str | None = None, decoding: decode.Decoding | None = None) -> Plan:
    """Choose the schedule moving the fewest bytes within both budgets (cached: see
    :func:`_cached_plans`).

    ``step_bytes``: the fixed cost of one gemm step in bytes moved, for the byte objective
    (STEP_COST_BYTES; more where each gemm call costs more, as on a CPU with many BLAS
    threads: see :func:`cpu_step_bytes`).

    Tile edges are multiples of ``align`` (256: whole block tiles of the GPU kernels, whose
    largest is 128 x 256) unless the dimension is smaller or the budget forbids it.

    ``max_bk`` caps the K panels' depth; when choosing by time, the fastest few plans are
    also tried with deeper panels, up to twice as deep (:func:`_fastest`).

    ``a_chunks``/``b_chunks`` are the chunk shapes (before transposition) of inputs whose
    chunks are read whole (``Source.panel_chunks``); tile edges are multiples of them where
    the budget allows. ``tile``=(bm, bn, bk) and
    ``order`` fix the schedule (used to resume a run exactly as it started), with ``tail``
    for resident-c (default 1); they are checked against the budgets like any other.

    Order resident-c (every C strip on the device: :mod:`.schedule`) is a candidate when
    choosing by time with staging, where the copies may bound the run.

    ``in_place``: the operands ("A", "B", "C") copied in place from the user's arrays (no
    host staging slots for them; the model counts no host reads or writes), None where the
    executor decides; ``registered``: those of them page-locked for the run (its cost counts
    in the predicted time: ``Rates.register_bytes``).

    ``symmetric``: a Gram plan (B is A, m == n, ``trans_b == not trans_a``: see
    :mod:`.schedule`): square tiles only, and resident-c only as one tile; ``upper``: its
    lower triangle is not written. ``presplit``: the parts an element the gemm splits its
    panels into ahead, in a workspace that the device budget holds (``Plan.presplit``).

    ``a_span``: resident-c's A loads, in K panels (``Plan.a_span``); None: 1, or 2 where A
    is copied in place in narrow rows and the model puts that faster (:func:`_spanned`);
    with ``tile`` fixed, 1 unless given.

    ``a_dtype``, ``b_dtype``: A's and B's dtypes as stored, where not ``dtype`` (reads
    count at their widths); ``out_dtype``: C's as the output stores it, where not the
    tiles' (its bytes written and read, and the buffers converting it: ``Plan.convert_bytes``).

    ``decoding``: the decode buffers of compressed inputs, as the job offers them
    (:func:`.decode.offered`): the staging and those buffers fit the host budget, the plan
    with as many decoding readers as fit (:mod:`.decode`).

    ``whole``: orders whole-a and whole-b are candidates too (when choosing by time with
    staging, and not for a Gram plan): for C written to storage, whose writes they start
    early (:mod:`.schedule`); from host arrays they ran slower than the model predicts. Near
    ties in those orders are then broken with the inputs cached (CACHED_READ_RATE).
    """
    _check_dims(m, n, k)
    _check_symmetric(m, n, trans_a, trans_b, symmetric, upper)
    for name, v in (("dtype", dtype), ("a_dtype", a_dtype), ("b_dtype", b_dtype),
                    ("out_dtype", out_dtype)):
        if v not in DTYPES and (name == "dtype" or v is not None):
            raise DtypeError(f"Expected {name} {', '.join(DTYPES)}. Got {v!r}.")
    if order is not None and order not in ORDERS:
        raise PlanError(f"Expected order to be one of {', '.join(ORDERS)}. Got {order!r}.")
    for name, v in (("device budget", device_budget), ("host budget", host_budget)):
        if v is not None and (not isinstance(v, int) or v <= 0):
            raise BudgetError(f"Expected the {name} as a positive number of bytes. Got {v!r}.")
    host_budget = device_budget if host_budget is None else host_budget
    in_place, registered = _check_in_place(in_place, registered)
    base = dict(m=m, n=n, k=k, dtype=dtype, trans_a=trans_a, trans_b=trans_b, reads_c=reads_c,
                staging=staging, device_budget=device_budget, host_budget=host_budget,
                a_chunks=tuple(a_chunks) if a_chunks else None,
                b_chunks=tuple(b_chunks) if b_chunks else None, rates=rates,
                in_place=in_place, registered=registered, symmetric=bool(symmetric),
                upper=bool(upper), presplit=int(presplit),
                a_dtype=None if a_dtype == dtype else a_dtype,
                b_dtype=None if b_dtype == dtype else b_dtype,
                out_dtype=None if out_dtype == accumulate_dtype(dtype) else out_dtype,
                decoding=decoding and decoding.least)

    if a_span is not None and (not isinstance(a_span, int) or isinstance(a_span, bool)
                               or a_span < 1 or (a_span > 1 and (
                                   order not in (None, "resident-c") or not staging))):
        raise PlanError(f"Expected a_span as a positive integer (above 1 only for order "
                        f"resident-c with staging). Got {a_span!r} with order {order!r}"
                        f"{'' if staging else ', no staging'}.")
    if tile is not None:
        plan = _fixed(tile, order or "stream", tail, base)
        if (a_span or 1) > 1:
            if plan.order != "resident-c":
                raise PlanError(f"Expected order resident-c for a_span {a_span}. "
                                f"Got {plan.order}.")
            plan = replace(plan, a_span=a_span)
            _check_fits(plan)
        return decode.widened(plan)

    am, ak = _op_chunks(a_chunks, trans_a)
    bkc, bnc = _op_chunks(b_chunks, trans_b)
    k_chunk = max(c for c in (ak, bkc, 1) if c)
    # tiles aligned to the chunks; where none fits and chunks are decoded, M and N aligned
    # with K panels cutting them (a tile's K panels in a chunk follow one another: it is
    # decoded once for all of them, :mod:`.decode`); else any tiles
    passes = [(True, True)] + ([(True, False)] if decoding else []) + [(False, False)]
    for aligned, k_aligned in passes:
        um = _units(m, am, align) if aligned else 1
        un = _units(n, bnc, align) if aligned else 1
        uk = _units(k, k_chunk if (ak or bkc) else align, align) if k_aligned else 1
        depths = _candidates(k, uk, min_tile)
        shallow = max(max_bk, uk)
        bks = [b for b in depths if b <= shallow] or [min(k, uk)]
        found = []
        orders = (order,) if order else ORDERS
        if "resident-c" in orders:
            if order or (rates is not None and staging):
                # by time, panels up to twice as deep too (as the others are tried deeper)
                found += _resident_c([m] if symmetric else _candidates(m, um, min_tile), bks,
                                     base, step_bytes, _deeper(k, uk, shallow) if rates else [])
            orders = tuple(o for o in orders if o != "resident-c")
        if not order and (not whole or symmetric or rates is None or not staging):
            orders = tuple(o for o in orders if o not in WHOLE_ORDERS)
        blank = Plan(bm=1, bn=1, bk=1, order="stream", **base)  # what the candidates share
        for o in orders:
            for bm in _candidates(m, um, min_tile):
                for bn in ([bm] if symmetric else _candidates(n, un, min_tile)):
                    if not order and _whole_left_out(o, bm, bn, m, n):
                        continue
                    if not _fits(blank._replaced(bm=bm, bn=bn, bk=bks[-1], order=o)):
                        continue
                    for bk in bks:  # largest first: the first that fits is the best for (bm, bn)
                        p = blank._replaced(bm=bm, bn=bn, bk=bk, order=o)
                        if _fits(p) and not _first_line_too_long(p):
                            found.append(((_cost(p, step_bytes), p.n_steps, -p.bk,
                                           ORDERS.index(o)), p))
                            break
        if found:
            if rates is None:
                return decode.widened(min(found, key=lambda x: x[0])[1])
            return decode.widened(_fastest(found, rates, _deeper(k, uk, shallow),
                                           _cached(rates) if whole and staging else None,
                                           2 if a_span is None else a_span))
    smallest = min(m, min_tile), min(n, min_tile), min(k, min_tile)
    if order == "resident-c":  # strips C's width, and every one of them on the device
        smallest = (smallest[0], n, smallest[2])
    raise _too_small(Plan(bm=smallest[0], bn=smallest[1], bk=smallest[2],
                          order=order or "stream", tail=1 if order == "resident-c" else 0,
                          **base))


def _whole_left_out(order: str, bm: int, bn: int, m: int, n: int) -> bool:
    """Whether a whole-a (whole-b) candidate is left out: one row (column) of tiles is
    resident-a's (resident-b's) schedule with more B (A) slots than it uses; and tiles
    narrower than half of C were written markedly slower than wider ones, which the model
    does not count (docs/planner.md)."""
    if order not in WHOLE_ORDERS:
        return False
    return (order == "whole-a" and bm >= m) or (order == "whole-b" and bn >= n) or 2 * bn < n


def _first_line_too_long(p: Plan) -> bool:
    """Whether a whole-a (whole-b) plan's first column (row) of tiles, which reads all of the
    operand kept whole, is too long for the pipeline model to simulate twice over
    (:func:`~bigmm.planner.model.predict_seconds` extrapolates from whole columns); such tiles
    are small for an order meant for runs bound by the copies, and are not candidates."""
    if p.order not in WHOLE_ORDERS:
        return False
    return 2 * (p.ni if p.order == "whole-a" else p.nj) * p.nk > SIM_STEPS


def _cached(rates: Rates) -> Rates:
    """``rates`` with the inputs read at least at CACHED_READ_RATE."""
    return replace(rates, read_bytes=max(rates.read_bytes, CACHED_READ_RATE))


def _fastest(found: list[tuple[tuple, Plan]], rates: Rates, depths: list[int] = (),
             cached: Rates | None = None, limit: int = 1) -> Plan:
    """The candidate with the shortest predicted makespan, or one within NEAR of it (see
    there: the fewest bytes read where the copies bound the run, the deepest resident-c
    strips of those, else the deepest K panels of any order; with ``cached`` rates, those
    of the inputs cached, the fastest at them of the best whole-a or whole-b order: see
    CACHED_READ_RATE). Of the candidates in the orders other than resident-c, the first
    SIM_PLANS in order of ``StageTimes.guess``, the first SIM_PER_ORDER of whole-a and of
    whole-b and the SIM_LARGE with the fewest steps are simulated (those of the other orders
    also ranked among themselves, as without the whole orders), and the DEEPEN fastest (and
    the DEEPEN fastest of the other orders) are tried again with the deepest K panel of
    ``depths`` (deepest first) that fits (fewer C-tile updates and steps against a longer
    fill); of the resident-c candidates, the first SIM_RESIDENT_C by guess of each K panel
    depth. A candidate whose lower bound exceeds the best makespan found is not simulated.
    Those are also tried with A loads of ``limit`` K panels (:func:`_spanned`), the fastest
    of them with its best tail."""
    timed: list[tuple[float, tuple, Plan]] = []
    best = math.inf
    seen: set[int] = set()

    def simulate_unless_bounded(st: StageTimes, score: tuple, p: Plan) -> None:
        nonlocal best
        if id(p) in seen:
            return
        seen.add(id(p))
        if st.lower_bound <= best:
            timed.append((p.predicted_seconds, score, p))
            best = min(best, timed[-1][0])

    def ranked(resident_c: bool) -> list:
        return sorted(((stage_times(p, rates), score, p) for score, p in found
                       if (p.order == "resident-c") == resident_c),
                      key=lambda x: (x[0].guess, x[1]))

    tiles = ranked(False)
    # the other orders are simulated as where whole-a and whole-b are not candidates, so that
    # adding those never loses a plan found without them
    plain = [c for c in tiles if c[2].order not in WHOLE_ORDERS]
    for candidate in plain[:SIM_PLANS]:
        simulate_unless_bounded(*candidate)
    for candidate in tiles[:SIM_PLANS]:
        if candidate[2].order in WHOLE_ORDERS:
            simulate_unless_bounded(*candidate)
    rest = tiles[SIM_PLANS:]
    for order in WHOLE_ORDERS:  # their best guesses too
        for candidate in [c for c in rest if c[2].order == order][:SIM_PER_ORDER]:
            simulate_unless_bounded(*candidate)
    for among in (rest, plain[SIM_PLANS:]):
        for candidate in sorted(among, key=lambda x: (x[2].n_steps, x[0].guess, x[1]))[:SIM_LARGE]:
            simulate_unless_bounded(*candidate)
    timed.sort(key=lambda x: x[:2])
    fastest = timed[:DEEPEN] + [x for x in timed if x[2].order not in WHOLE_ORDERS][:DEEPEN]
    for _, score, p in dict((id(x[2]), x) for x in fastest).values():
        deeper = next((q for q in (p._replaced(bk=bk) for bk in depths) if _fits(q)), None)
        if deeper is not None:
            timed.append((deeper.predicted_seconds, score, deeper))
    strips = ranked(True)
    for bk in dict.fromkeys(p.bk for _, _, p in strips):
        for _, score, p in [c for c in strips if c[2].bk == bk][:SIM_RESIDENT_C]:
            # each also with wide A loads, where those may pay
            for q in (p, _spanned(p, limit)):
                if q is not None:
                    simulate_unless_bounded(stage_times(q, rates), score, q)
    tailed: set[int] = set()  # plans _best_tail returned: at their best tail already
    for wide in (False, True):  # the fastest strips, and of those with wide A loads, with
        # their tail chosen again (the candidates' tails are a strip height's first guesses)
        strips_timed = [x for x in timed if x[2].order == "resident-c"
                        and (x[2].a_span > 1) == wide]
        if strips_timed:
            _, score, q = min(strips_timed, key=lambda x: x[:2])
            q = _best_tail(q)
            tailed.add(id(q))
            timed.append((q.predicted_seconds, score, q))
    best = min(timed, key=lambda x: x[:2])
    near = [x for x in timed if x[0] <= best[0] * (1 + NEAR)]
    st = stage_times(best[2], rates)
    pool = near  # the gemms bound the run: of the plans as near, the deepest K panels
    if max(st.read, st.write) > st.compute:  # the copies bound the run: the fewest bytes
        best = min(near, key=lambda x: (x[2].bytes_read, x[:2]))
        if cached is not None and best[2].order in WHOLE_ORDERS:
            line = [x for x in near if x[2].order == best[2].order
                    and x[2].bytes_read == best[2].bytes_read]
            best = min(line, key=lambda x: (replace(x[2], rates=cached).predicted_seconds,
                                            x[:2]))
        # and of resident-c strips as near and reading as little, the deepest
        pool = [x for x in near if x[2].order == best[2].order == "resident-c"
                and x[2].bytes_read <= best[2].bytes_read] or [best]
    best = min(pool, key=lambda x: (x[2].nk, x[:2]))
    if best[2].order == "resident-c" and id(best[2]) not in tailed:
        return _best_tail(best[2])
    return best[2]


def _fixed(tile: tuple[int, int, int], order: str, tail: int | None, base: dict) -> Plan:
    """The plan of an explicit tile and order (resident-c: strips C's width, ``tail`` K
    panels finished strip by strip, default 1), checked against the budgets."""
    bm, bn, bk = tile
    for name, v in (("bm", bm), ("bn", bn), ("bk", bk)):
        if not isinstance(v, int) or v < 1:
            raise PlanError(f"Expected tile size {name} to be a positive integer. Got {v!r}.")
    m, n, k = base["m"], base["n"], base["k"]
    plan = Plan(bm=min(bm, m), bn=min(bn, n), bk=min(bk, k), order=order, **base)
    if plan.symmetric and plan.bm != plan.bn:
        raise PlanError(f"Expected square tiles (bm == bn) for a Gram plan. Got bm={bm}, "
                        f"bn={bn}.")
    if plan.symmetric and order in WHOLE_ORDERS:
        raise PlanError(f"Expected a Gram plan in order stream, resident-a, resident-b or "
                        f"resident-c. Got {order}.")
    if order == "resident-c":
        if plan.bn != n:
            raise PlanError(f"Expected tiles as wide as C ({n}) for order resident-c. "
                            f"Got bn={bn}.")
        tail = 1 if tail is None else tail
        if not isinstance(tail, int) or not 1 <= tail <= plan.nk:
            raise PlanError(f"Expected tail between 1 and {plan.nk} (the K panels) for order "
                            f"resident-c. Got {tail!r}.")
        plan = replace(plan, tail=tail)
    _check_fits(plan)
    return plan


#: Resident-c's tails: the K panels finished strip by strip, as shares of all of them.
TAIL_SHARES = (0.0, 0.125, 0.25, 0.5, 1.0)


def _resident_c(bms: list[int], bks: list[int], base: dict, step_bytes: int,
                deeper: list[int] = ()) -> list:
    """Resident-c candidates (score, plan): strips of each height in ``bms`` with the
    deepest K panels of ``bks`` that fit, the shallower half of that depth, and the deepest
    of ``deeper`` that fits (panels beyond ``bks``, tried by time: each panel adds into the
    strips once), each with the tails of TAIL_SHARES that fit (at least one panel; at most
    SIM_STEPS strip steps in the tail, which the model simulates whole)."""
    m, n, k = base["m"], base["n"], base["k"]
    found, blank = [], Plan(bm=1, bn=n, bk=1, order="resident-c", tail=1, **base)
    for bm in bms:
        ni = -(-m // bm)
        if ni > SIM_STEPS // 4:
            continue
        def fits(bk: int) -> bool:
            return _fits(blank._replaced(bm=bm, bk=bk))

        fitting = [bk for bk in bks if fits(bk)]
        deepest = next((bk for bk in deeper if fits(bk)), None)
        for bk in ([deepest] if deepest else []) + fitting[:1] + [
                b for b in fitting[1:] if 2 * b <= fitting[0]][:1]:
            nk = -(-k // bk)
            strips = blank._replaced(bm=bm, bk=bk)
            for tail in sorted({max(1, math.ceil(share * nk)) for share in TAIL_SHARES}):
                p = _with_tail(strips, tail)
                if p is not None:
                    found.append(((_cost(p, step_bytes), p.n_steps, -p.bk,
                                   ORDERS.index(p.order)), p))
    return found


def _best_tail(p: Plan) -> Plan:
    """Resident-c plan ``p`` with the longest of the tails the model puts within NEAR of the
    fastest it reaches from p's, one K panel longer or shorter at a time while each is
    faster. TAIL_SHARES are coarse where K has few panels (of ten, tails 5 and 10 and none
    between); the best tail is where the rounds' reads before it take as long as their gemms,
    and its strips' gemms as long as C's writes, which share the host's memory bandwidth with
    the tail's reads where the model counts them apart: of near tails the longer ran faster
    (see BENCHMARKS.md, jobs larger than the GPU). The strips' height and depth stay."""
    best, seconds = p, p.predicted_seconds
    for way in (1, -1):
        q = _with_tail(best, best.tail + way)
        while q is not None and q.predicted_seconds < seconds:
            best, seconds = q, q.predicted_seconds
            q = _with_tail(q, q.tail + way)
    q = _with_tail(best, best.tail + 1)
    while q is not None and q.predicted_seconds <= (1 + NEAR) * seconds:
        best, q = q, _with_tail(q, q.tail + 1)
    return best


def _spanned(p: Plan, limit: int) -> Plan | None:
    """Resident-c plan ``p`` loading its strips' A ``limit`` K panels at a time, where that
    fits and may pay: only where A is copied in place in rows narrower than A's (each load is
    then one copy of a strip's rows, in rows ``limit`` times as long; staged panels are
    contiguous either way); else None."""
    if (limit < 2 or p.order != "resident-c" or p.a_span == limit or p.symmetric
            or p.trans_a or p.nk < 2 or not p.staging or p.in_place is None
            or "A" not in p.in_place):
        return None
    q = p._replaced(a_span=limit)
    return q if _fits(q) else None


def _with_tail(p: Plan, tail: int) -> Plan | None:
    """Resident-c plan ``p`` with ``tail``, or None where that is not between 1 and its K
    panels, makes more strip steps than the model simulates whole (SIM_STEPS), or does not
    fit the budgets."""
    if not 1 <= tail <= p.nk or p.ni * tail > SIM_STEPS:
        return None
    q = p._replaced(tail=tail)
    return q if _fits(q) else None


def _check_symmetric(m: int, n: int, trans_a: bool, trans_b: bool, symmetric: bool,
                     upper: bool) -> None:
    """PlanError unless a Gram plan's C is square and its transposes opposite (C = A^T A or
    A A^T), and ``upper`` comes only with one."""
    if upper and not symmetric:
        raise PlanError("Expected upper=True only for a Gram plan (symmetric=True). "
                        "Got symmetric=False.")
    if symmetric and (m != n or bool(trans_a) == bool(trans_b)):
        raise PlanError(f"Expected a square C and opposite transposes for a Gram plan. Got C "
                        f"{m} x {n}, trans_a={trans_a}, trans_b={trans_b}.")


def _check_in_place(in_place: str | None, registered: str) -> tuple[str | None, str]:
    """``in_place`` and ``registered`` as canonical operand strings ("AB", ...); PlanError
    unless they name operands A, B and C, ``registered`` only among ``in_place``."""
    for name, v in (("in_place", in_place), ("registered", registered)):
        if v is not None and (not isinstance(v, str) or set(v) - set(OPERANDS)):
            raise PlanError(f"Expected {name} as operand letters among 'ABC'. Got {v!r}.")
    registered = "".join(op for op in OPERANDS if op in (registered or ""))
    if registered and (in_place is None or set(registered) - set(in_place)):
        raise PlanError(f"Expected registered operands among those in place. Got "
                        f"registered={registered!r} with in_place={in_place!r}.")
    if in_place is not None:
        in_place = "".join(op for op in OPERANDS if op in in_place)
    return in_place, registered


def _cost(p: Plan, step_bytes: int = STEP_COST_BYTES) -> int:
    """What the planner minimises, in bytes moved: the traffic, plus the pipeline's fill (the
    first panels, read before any compute) and drain (the last C tile, written after all
    compute), which no overlap hides, plus a fixed cost per gemm step."""
    fill = p.stored_itemsize("A") * p.bm * p.bk + p.stored_itemsize("B") * p.bk * p.bn
    drain = DRAIN_WEIGHT * p.c_itemsize * p.bm * p.bn
    return p.bytes_read + fill + drain + step_bytes * p.n_steps


def cpu_step_bytes(threads: int) -> int:
    """The fixed cost of one gemm step on a CPU whose BLAS runs ``threads`` threads: every
    call starts and synchronises all of them and packs its panels anew, so the cost grows
    with the threads (measured on 16 cores, 12288^3 float32 under a 256 MiB budget: 48 tiles
    of 4096 x 768 in 384 gemms ran at 0.78 of in-core numpy.matmul, 9 tiles of 4096 x 4096 in
    54 gemms at 0.845, reading 3.4 GiB instead of 2.3)."""
    return STEP_COST_BYTES * max(1, int(threads))


def _fits(plan: Plan) -> bool:
    return plan.device_bytes <= plan.device_budget and decode.host_total(plan) <= plan.host_budget


def _check_fits(plan: Plan) -> None:
    if not _fits(plan):
        host, held = decode.host_total(plan), plan.host_bytes
        raise BudgetError(
            f"Expected budgets of at least {format_bytes(plan.device_bytes)} (device) and "
            f"{format_bytes(host)} (host"
            + (f": {format_bytes(host - held)} of it decode buffers" if host > held else "")
            + f") for tiles {plan.bm}x{plan.bn}x{plan.bk} "
            f"in order {plan.order}. Got {format_bytes(plan.device_budget)} and "
            f"{format_bytes(plan.host_budget)}.",
            minimum=max(plan.device_bytes, host))


def _too_small(smallest: Plan) -> BudgetError:
    """The BudgetError of budgets below the ``smallest`` plan's: one sentence naming the
    budgets that are short (one budget where, without staging, one set of buffers counts
    against both and they are the same)."""
    smallest = decode.least(smallest)
    error = decode.too_small(smallest)
    if error is not None:
        return error
    need_dev, need_host = smallest.device_bytes, decode.host_total(smallest)
    why = f"the smallest tiles, {smallest.bm}x{smallest.bn}x{smallest.bk}, need that much"
    if not smallest.staging and smallest.device_budget == smallest.host_budget:
        need = max(need_dev, need_host)
        return BudgetError(f"Expected a memory budget of at least {need} bytes "
                           f"({format_bytes(need)}: {why}). Got {smallest.device_budget} "
                           f"bytes.", minimum=need)
    short = [(what, need, have) for what, need, have in
             (("device", need_dev, smallest.device_budget),
              ("host", need_host, smallest.host_budget)) if have < need]
    expected = " and ".join(f"a {what} memory budget of at least {need} bytes "
                            f"({format_bytes(need)})" for what, need, _ in short)
    got = " and ".join(f"{have} bytes" for _, _, have in short)
    return BudgetError(f"Expected {expected} ({why}). Got {got}.",
                       minimum=max(need_dev, need_host))
