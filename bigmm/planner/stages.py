"""What the pipeline model says of a plan before simulating it: each stage's busy time, bounds
on the makespan and a quick guess of it (:class:`StageTimes`), and which operands are copied
in place and by how many rows each copy (:func:`direct_operands`, :func:`pitched_rows`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .derived import derived
from .schedule import Plan


@dataclass(frozen=True)
class StageTimes:
    """Seconds each stage of a plan is busy under some rates (``copy_out`` at the host-to-
    device rate: the copies are symmetric), the fill before the first gemm (the first step's
    reads and copies) and the drain after the last (the last tile's copy-out and write)."""

    read: float
    copy_in: float
    compute: float
    copy_out: float
    write: float
    fill: float
    drain: float
    #: Reading the first tile, or the first row (column) of tiles, then the gemms left after
    #: it and the drain: the longer of the two.
    head: float = 0.0
    #: The first tile's gemms (no write starts before they end).
    first: float = 0.0
    #: How long each later row's (column's) first tile waits for its new row panel beyond its
    #: own gemms, times the number of later rows: a guess (the slots let reads run only a
    #: step or two ahead), not a bound.
    bursts: float = 0.0
    #: Locking the user's arrays before the run and releasing them after (in ``fill`` too).
    setup: float = 0.0
    #: Pinning the staging buffers the first step does not use, in the background.
    pinning: float = 0.0
    #: The issuing thread's own work (staging: ``Rates.per_issue`` a step and
    #: ``Rates.per_handoff`` a staged load).
    issue: float = 0.0

    @derived
    def guess(self) -> float:
        """A quick estimate of the makespan, to order the candidates simulated."""
        return max(self.lower_bound,
                   max(self.fill + self.compute + self.drain, self.head) + self.bursts)

    @property
    def lower_bound(self) -> float:
        """No schedule ends sooner: each stage is one server, the gemms run between the fill
        and the drain, and a prefix's gemms wait for the prefix's reads; nothing starts
        before the locking."""
        return max(self.setup + self.read + self.drain, self.setup + self.copy_in,
                   self.setup + self.copy_out, self.setup + self.issue,
                   self.fill + self.first + self.write, self.fill + self.compute + self.drain,
                   self.head)

    @property
    def upper_bound(self) -> float:
        """The locking and all the pinning, then the stages one after the other (list
        scheduling never leaves all of them idle but while a buffer is pinned)."""
        return (self.setup + self.pinning + self.read + self.copy_in + self.compute
                + self.copy_out + self.write + self.issue)


def direct_operands(p: Plan) -> tuple[bool, bool, bool]:
    """Per operand A, B, C: copied in place from the user's array (no host read or write, no
    staging slot; see ``Plan.in_place``)."""
    some = p.staging and p.in_place is not None
    return some and "A" in p.in_place, some and "B" in p.in_place, some and "C" in p.in_place


def pitched_rows(p: Plan) -> tuple[Callable, Callable, Callable]:
    """Per operand A, B, C: the rows of one 2-D copy of a region (rows, cols, depth) of op(A)
    x op(B) -> C that is narrower than the stored array's rows (0 where the region spans
    whole rows, one contiguous copy). Only copies in place are pitched (staged panels are
    contiguous)."""
    a_pitched, b_pitched, c_pitched = pitched(p)
    return ((lambda rows, cols, depth: (depth if p.trans_a else rows) if a_pitched else 0),
            (lambda rows, cols, depth: (cols if p.trans_b else depth) if b_pitched else 0),
            (lambda rows, cols, depth: rows if c_pitched else 0))


def pitched(p: Plan, direct: tuple | None = None) -> tuple[bool, bool, bool]:
    """Per operand A, B, C: whether its copies are pitched (:func:`pitched_rows`; ``direct``:
    p's :func:`direct_operands`, where known)."""
    da, db, dc = direct or direct_operands(p)
    return (da and (p.ni > 1 if p.trans_a else p.nk > 1),
            db and (p.nk > 1 if p.trans_b else p.nj > 1), dc and p.nj > 1)
