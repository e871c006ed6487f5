"""The planner: shapes, dtype, transposes, budgets and chunk shapes -> a frozen, printable Plan.

Pure and shape-only: no h5py, no cupy, no I/O. The executor runs a Plan step by step; every step
names the C tile, the K panel, and the device slots its A and B panels live in, and whether each
panel must be loaded or is already resident. Slot assignment is decided here, so the executor
never decides what fits: the bytes resident are those the Plan printed.

Schedule (C is M x N, depth K, element size w, device budget S bytes):

* ``stream``: C tiles in row-major order; every tile streams its K panels of A and B through
  double-buffered slots. A is read ceil(N/bn) times, B ceil(M/bm) times.
* ``resident-a``: a whole row panel of A (bm x K) stays on the device while the tiles of that
  row sweep over B: A is read once, B ceil(M/bm) times.
* ``resident-b``: the mirror image, column-major tile order: B read once, A ceil(N/bn) times.

The planner enumerates tile sizes for each order, keeps those within both budgets, and picks the
fewest bytes moved, counting as moved the pipeline's fill (the first panels) and drain (the last
C tile), which no overlap hides, and a fixed cost per gemm; ties go to fewer tiles, then larger
K panels.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Iterator

from .errors import BudgetError, DtypeError, PlanError, ShapeError
from .units import format_bytes, format_seconds

ORDERS = ("stream", "resident-a", "resident-b")
DTYPES = {"float32": 4, "float64": 8}

#: Device C tiles: one accumulating while the previous one is copied out and written.
C_SLOTS = 2
#: Host staging slots per operand (double buffering between the readers and the copy engine).
HOST_PANEL_SLOTS = 2
#: Host C buffers: one being filled from the device while the previous one is written to disk.
HOST_C_SLOTS = 2
#: Fixed cost of one gemm step (launch, events, the executor's bookkeeping), counted as bytes
#: moved when comparing schedules: about 40 us at 25 GB/s. Stops the planner from trading a few
#: bytes for thousands of tiny panels.
STEP_COST_BYTES = 1 << 20
#: Writing a byte of C (device -> host copy, then disk) costs about twice reading one.
DRAIN_WEIGHT = 2


@dataclass(frozen=True)
class Rates:
    """Nominal speeds (per second) used only for the predicted time."""

    flops: float
    read_bytes: float
    write_bytes: float
    h2d_bytes: float | None = None  # None: host memory is the compute memory (no copies)


@dataclass(frozen=True)
class Tile:
    """One C tile: rows [r0, r1) and columns [c0, c1) of C, grid position (i, j)."""

    i: int
    j: int
    r0: int
    r1: int
    c0: int
    c1: int

    @property
    def index(self) -> tuple[int, int]:
        return (self.i, self.j)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.r1 - self.r0, self.c1 - self.c0)


@dataclass(frozen=True)
class Step:
    """One gemm of the schedule: C[tile] (+)= op(A)[rows, k0:k1] @ op(B)[k0:k1, cols].

    ``first``: the first K panel of the tile (apply beta, or zero-initialise when beta == 0).
    ``last``: the tile is complete after this step (copy it out and write it).
    ``load_a``/``load_b``: the panel is not resident and must be read into its slot.
    """

    tile: Tile
    kp: int
    k0: int
    k1: int
    first: bool
    last: bool
    a_slot: int
    load_a: bool
    b_slot: int
    load_b: bool
    c_slot: int


@dataclass(frozen=True)
class Plan:
    """A complete, checked schedule for C = alpha * op(A) @ op(B) + beta * C."""

    m: int
    n: int
    k: int
    dtype: str
    trans_a: bool
    trans_b: bool
    reads_c: bool
    bm: int
    bn: int
    bk: int
    order: str
    staging: bool
    device_budget: int
    host_budget: int
    a_chunks: tuple[int, int] | None = None
    b_chunks: tuple[int, int] | None = None
    rates: Rates | None = field(default=None, compare=False)

    # ----- grid ---------------------------------------------------------------------------
    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype]

    @property
    def ni(self) -> int:
        return -(-self.m // self.bm)

    @property
    def nj(self) -> int:
        return -(-self.n // self.bn)

    @property
    def nk(self) -> int:
        return -(-self.k // self.bk)

    @property
    def n_tiles(self) -> int:
        return self.ni * self.nj

    def tile(self, i: int, j: int) -> Tile:
        r0, c0 = i * self.bm, j * self.bn
        return Tile(i, j, r0, min(r0 + self.bm, self.m), c0, min(c0 + self.bn, self.n))

    def tiles(self) -> Iterator[Tile]:
        """C tiles in execution order."""
        if not self.row_major:
            for j in range(self.nj):
                for i in range(self.ni):
                    yield self.tile(i, j)
        else:
            for i in range(self.ni):
                for j in range(self.nj):
                    yield self.tile(i, j)

    def k_panels(self) -> list[tuple[int, int]]:
        return [(k0, min(k0 + self.bk, self.k)) for k0 in range(0, self.k, self.bk)]

    # ----- slots --------------------------------------------------------------------------
    @property
    def a_slots(self) -> int:
        return self.nk + 1 if self.order == "resident-a" else 2

    @property
    def b_slots(self) -> int:
        return self.nk + 1 if self.order == "resident-b" else 2

    @property
    def a_panel_shape(self) -> tuple[int, int]:
        """Shape of one A panel as stored (op(A) panel is bm x bk; stored transposed if trans_a)."""
        return (self.bk, self.bm) if self.trans_a else (self.bm, self.bk)

    @property
    def b_panel_shape(self) -> tuple[int, int]:
        """Shape of one B panel as stored (op(B) panel is bk x bn)."""
        return (self.bn, self.bk) if self.trans_b else (self.bk, self.bn)

    def steps(self, done: frozenset[tuple[int, int]] | set = frozenset()) -> Iterator[Step]:
        """Every gemm of the schedule, skipping the tiles in ``done`` (already written).

        Panels are placed in slots by least-recently-used replacement; a panel found in its
        slot is not loaded again. The slot a panel is loaded into was last used at least two
        steps earlier, so loading it can overlap the previous step's compute.
        """
        a_cache: OrderedDict = OrderedDict()  # key -> slot, in LRU order
        b_cache: OrderedDict = OrderedDict()
        panels = self.k_panels()
        c_slot = 0
        for t in self.tiles():
            if t.index in done:
                continue
            for kp, (k0, k1) in enumerate(panels):
                a_slot, load_a = _lru(a_cache, (t.i, kp), self.a_slots)
                b_slot, load_b = _lru(b_cache, (t.j, kp), self.b_slots)
                yield Step(t, kp, k0, k1, kp == 0, kp == len(panels) - 1,
                           a_slot, load_a, b_slot, load_b, c_slot)
            c_slot = (c_slot + 1) % C_SLOTS

    # ----- memory -------------------------------------------------------------------------
    @property
    def device_bytes(self) -> int:
        """Bytes the compute side holds: C tiles and the A and B panel slots."""
        w = self.itemsize
        return w * (C_SLOTS * self.bm * self.bn + self.a_slots * self.bm * self.bk
                    + self.b_slots * self.bk * self.bn)

    @property
    def host_bytes(self) -> int:
        """Host staging bytes (pinned). Without staging, the compute buffers are host memory."""
        if not self.staging:
            return self.device_bytes
        w = self.itemsize
        return w * (HOST_PANEL_SLOTS * (self.bm * self.bk + self.bk * self.bn)
                    + HOST_C_SLOTS * self.bm * self.bn)

    # ----- traffic ------------------------------------------------------------------------
    @property
    def row_major(self) -> bool:
        return self.order != "resident-b"

    @property
    def a_reads(self) -> int:
        """How many times all of A is read under the LRU slot schedule of ``steps``.

        Row-major tiles touch the row panel A(i, 0..nk-1) nj times in a row: it stays when its
        nk panels fit in the slots. Column-major tiles cycle through all ni*nk panels of A per
        tile column: A stays only when all of it fits.
        """
        cycle = self.nk if self.row_major else self.ni * self.nk
        return 1 if self.nj == 1 or self.a_slots >= cycle else self.nj

    @property
    def b_reads(self) -> int:
        """Mirror image of ``a_reads``."""
        cycle = self.nj * self.nk if self.row_major else self.nk
        return 1 if self.ni == 1 or self.b_slots >= cycle else self.ni

    @property
    def bytes_read(self) -> int:
        w = self.itemsize
        c = self.m * self.n if self.reads_c else 0
        return w * (self.a_reads * self.m * self.k + self.b_reads * self.k * self.n + c)

    @property
    def bytes_written(self) -> int:
        return self.itemsize * self.m * self.n

    @property
    def bytes_h2d(self) -> int:
        """Bytes copied host -> device (equal to bytes read: every panel read is copied in)."""
        return self.bytes_read

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def lower_bound_bytes(self) -> float:
        """Communication lower bound 2*M*N*K/sqrt(S) words (S = device budget in elements).

        Also at least the compulsory traffic: each input read once and C written once.
        """
        w = self.itemsize
        s = self.device_budget / w
        hk = 2 * self.m * self.n * self.k / math.sqrt(s)
        compulsory = self.m * self.k + self.k * self.n
        return w * max(hk, compulsory)

    @property
    def bound_ratio(self) -> float:
        """Input bytes moved over the lower bound (1.0 is optimal)."""
        w = self.itemsize
        moved = w * (self.a_reads * self.m * self.k + self.b_reads * self.k * self.n)
        return moved / self.lower_bound_bytes

    @property
    def predicted_seconds(self) -> float | None:
        """max of the stage times (they overlap) plus the first read and last write."""
        r = self.rates
        if r is None:
            return None
        stages = [self.flops / r.flops, self.bytes_read / r.read_bytes,
                  self.bytes_written / r.write_bytes]
        if self.staging and r.h2d_bytes:
            stages.append(self.bytes_h2d / r.h2d_bytes)
        w = self.itemsize
        fill = w * (self.bm * self.bk + self.bk * self.bn) / r.read_bytes
        drain = w * self.bm * self.bn / r.write_bytes
        return max(stages) + fill + drain

    def key(self) -> dict:
        """What identifies the schedule (recorded in the resume journal)."""
        return {f: getattr(self, f) for f in
                ("m", "n", "k", "dtype", "trans_a", "trans_b", "reads_c", "bm", "bn", "bk", "order")}

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(ni=self.ni, nj=self.nj, nk=self.nk, n_tiles=self.n_tiles,
                 device_bytes=self.device_bytes, host_bytes=self.host_bytes,
                 bytes_read=self.bytes_read, bytes_written=self.bytes_written,
                 bytes_h2d=self.bytes_h2d, flops=self.flops,
                 lower_bound_bytes=self.lower_bound_bytes, bound_ratio=self.bound_ratio,
                 predicted_seconds=self.predicted_seconds)
        return d

    def __str__(self) -> str:
        ta, tb = ("A^T" if self.trans_a else "A"), ("B^T" if self.trans_b else "B")
        rows = [
            ("product", f"C[{self.m} x {self.n}] = {ta} @ {tb}, depth {self.k}, {self.dtype}"),
            ("loop order", self.order),
            ("C tiles", f"{self.ni} x {self.nj} = {self.n_tiles} tiles of {self.bm} x {self.bn}"),
            ("K panels", f"{self.nk} per tile, depth {self.bk}"),
            ("device memory", f"{format_bytes(self.device_bytes)} of {format_bytes(self.device_budget)}"
                              f" (C {C_SLOTS}, A {self.a_slots}, B {self.b_slots} slots)"),
            ("host staging", f"{format_bytes(self.host_bytes)} of {format_bytes(self.host_budget)}"
                             + ("" if self.staging else " (shared with compute)")),
            ("read", f"{format_bytes(self.bytes_read)} (A x{self.a_reads}, B x{self.b_reads}"
                     + (", C x1)" if self.reads_c else ")")),
            ("written", format_bytes(self.bytes_written)),
            ("lower bound", f"{format_bytes(self.lower_bound_bytes)}; plan moves "
                            f"{self.bound_ratio:.2f}x the bound"),
            ("flops", f"{self.flops:.3e}"),
        ]
        if self.a_chunks or self.b_chunks:
            rows.append(("input chunks", f"A {self.a_chunks}, B {self.b_chunks}"))
        t = self.predicted_seconds
        if t is not None:
            rows.append(("predicted time", format_seconds(t)))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _lru(cache: OrderedDict, key, capacity: int) -> tuple[int, bool]:
    if key in cache:
        cache.move_to_end(key)
        return cache[key], False
    if len(cache) < capacity:
        slot = len(cache)
    else:
        _, slot = cache.popitem(last=False)
    cache[key] = slot
    return slot, True


# ----- planning ---------------------------------------------------------------------------

def _check_dims(m: int, n: int, k: int) -> None:
    for name, v in (("M", m), ("N", n), ("K", k)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ShapeError(f"Expected {name} to be a positive integer. Got {v!r}.")


def _units(dim: int, chunk: int | None, align: int) -> int:
    """Tile-size unit along one dimension: the chunk edge if chunked, else ``align``."""
    unit = chunk if chunk else align
    return max(1, min(unit, dim))


def _candidates(dim: int, unit: int, lo: int) -> list[int]:
    """Tile sizes for one dimension: even splits of ``dim`` rounded up to ``unit``, largest first.

    Includes the smallest allowed size, max(unit, min(dim, lo)) capped at dim, so the minimum
    budget stated for unaligned tiles (unit 1) works.
    """
    out = {min(dim, max(unit, lo))}
    nb = 1
    while True:
        t = min(dim, -(-(-(-dim // nb)) // unit) * unit)  # ceil(ceil(dim / nb) / unit) * unit
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


def make_plan(m: int, n: int, k: int, dtype: str = "float32", *, trans_a: bool = False,
              trans_b: bool = False, reads_c: bool = False, device_budget: int,
              host_budget: int | None = None, staging: bool = True,
              a_chunks: tuple[int, int] | None = None, b_chunks: tuple[int, int] | None = None,
              align: int = 256, max_bk: int = 4096, min_tile: int = 8,
              tile: tuple[int, int, int] | None = None, order: str | None = None,
              rates: Rates | None = None) -> Plan:
    """Choose the schedule moving the fewest bytes within both budgets.

    Tile edges are multiples of ``align`` (256: whole block tiles of the GPU kernels, whose
    largest is 128 x 256) unless the dimension is smaller or the budget forbids it.

    ``a_chunks``/``b_chunks`` are the stored datasets' chunk shapes (before transposition);
    tile edges are multiples of them where the budget allows. ``tile``=(bm, bn, bk) and
    ``order`` fix the schedule (used to resume a run exactly as it started); they are checked
    against the budgets like any other.
    """
    _check_dims(m, n, k)
    if dtype not in DTYPES:
        raise DtypeError(f"Expected dtype float32 or float64. Got {dtype!r}.")
    if order is not None and order not in ORDERS:
        raise PlanError(f"Expected order to be one of {', '.join(ORDERS)}. Got {order!r}.")
    for name, v in (("device budget", device_budget), ("host budget", host_budget)):
        if v is not None and (not isinstance(v, int) or v <= 0):
            raise BudgetError(f"Expected the {name} as a positive number of bytes. Got {v!r}.")
    host_budget = device_budget if host_budget is None else host_budget
    base = dict(m=m, n=n, k=k, dtype=dtype, trans_a=trans_a, trans_b=trans_b, reads_c=reads_c,
                staging=staging, device_budget=device_budget, host_budget=host_budget,
                a_chunks=tuple(a_chunks) if a_chunks else None,
                b_chunks=tuple(b_chunks) if b_chunks else None, rates=rates)

    if tile is not None:
        bm, bn, bk = tile
        for name, v, dim in (("bm", bm, m), ("bn", bn, n), ("bk", bk, k)):
            if not isinstance(v, int) or v < 1:
                raise PlanError(f"Expected tile size {name} to be a positive integer. Got {v!r}.")
        plan = Plan(bm=min(bm, m), bn=min(bn, n), bk=min(bk, k), order=order or "stream", **base)
        _check_fits(plan)
        return plan

    am, ak = _op_chunks(a_chunks, trans_a)
    bkc, bnc = _op_chunks(b_chunks, trans_b)
    k_chunk = max(c for c in (ak, bkc, 1) if c)
    best = None
    for aligned in (True, False):
        um = _units(m, am, align) if aligned else 1
        un = _units(n, bnc, align) if aligned else 1
        uk = _units(k, k_chunk if (ak or bkc) else align, align) if aligned else 1
        bks = [b for b in _candidates(k, uk, min_tile) if b <= max(max_bk, uk)] or [min(k, uk)]
        for o in ((order,) if order else ORDERS):
            for bm in _candidates(m, um, min_tile):
                for bn in _candidates(n, un, min_tile):
                    if not _fits(Plan(bm=bm, bn=bn, bk=bks[-1], order=o, **base)):
                        continue
                    for bk in bks:  # largest first: the first that fits is the best for (bm, bn)
                        p = Plan(bm=bm, bn=bn, bk=bk, order=o, **base)
                        if _fits(p):
                            steps = p.n_tiles * p.nk
                            score = (_cost(p), steps, -p.bk, ORDERS.index(o))
                            if best is None or score < best[0]:
                                best = (score, p)
                            break
        if best is not None:
            return best[1]
    raise _too_small(Plan(bm=min(m, min_tile), bn=min(n, min_tile), bk=min(k, min_tile),
                          order="stream", **base))


def _cost(p: Plan) -> int:
    """What the planner minimises, in bytes moved: the traffic, plus the pipeline's fill (the
    first panels, read before any compute) and drain (the last C tile, written after all
    compute), which no overlap hides, plus a fixed cost per gemm step."""
    w = p.itemsize
    fill = w * (p.bm * p.bk + p.bk * p.bn)
    drain = DRAIN_WEIGHT * w * p.bm * p.bn
    return p.bytes_read + fill + drain + STEP_COST_BYTES * p.n_tiles * p.nk


def _fits(plan: Plan) -> bool:
    return plan.device_bytes <= plan.device_budget and plan.host_bytes <= plan.host_budget


def _check_fits(plan: Plan) -> None:
    if not _fits(plan):
        raise BudgetError(
            f"Expected budgets of at least {format_bytes(plan.device_bytes)} (device) and "
            f"{format_bytes(plan.host_bytes)} (host) for tiles {plan.bm}x{plan.bn}x{plan.bk} "
            f"in order {plan.order}. Got {format_bytes(plan.device_budget)} and "
            f"{format_bytes(plan.host_budget)}.",
            minimum=max(plan.device_bytes, plan.host_bytes))


def _too_small(smallest: Plan) -> BudgetError:
    need_dev, need_host = smallest.device_bytes, smallest.host_bytes
    parts = []
    if smallest.device_budget < need_dev:
        parts.append(f"a device memory budget of at least {need_dev} bytes "
                     f"({format_bytes(need_dev)}). Got {smallest.device_budget} bytes")
    if smallest.host_budget < need_host:
        parts.append(f"a host memory budget of at least {need_host} bytes "
                     f"({format_bytes(need_host)}). Got {smallest.host_budget} bytes")
    return BudgetError(
        f"Expected {'; and '.join(parts)} (the smallest tiles, "
        f"{smallest.bm}x{smallest.bn}x{smallest.bk}, need that much).",
        minimum=max(need_dev, need_host))
