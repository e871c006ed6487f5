"""The host's side of the pipeline model: the rates it reads each operand's loads at
(:func:`read_rates`), and the memory it page-locks for a run: the staging buffers it pins
before the run and beside it (:func:`pins`, :func:`pinned_at`), and the operands it locks in
place (:func:`lock_seconds`). :func:`~.model.setup_seconds` adds them up."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from . import decode
from .schedule import Plan

if TYPE_CHECKING:
    from .model import Rates


def pins(p: Plan, r: Rates) -> list[tuple[str, int, int, bool, bool]]:
    """``p.host_slots()`` (operand, slot, bytes, first) in the order a run takes them, each
    with whether it is pinned anew (not a block of ``r.kept_pinned``)."""
    if not r.kept_pinned:
        return [(op, i, nbytes, first, True) for op, i, nbytes, first in p.host_slots()]
    kept = Counter(r.kept_pinned)
    out = []
    for op, i, nbytes, first in p.host_slots():
        new = kept[nbytes] <= 0
        kept[nbytes] -= not new
        out.append((op, i, nbytes, first, new))
    return out


def lock_seconds(ops: str, m: int, n: int, k: int, itemsize: int, c_itemsize: int,
                 r: Rates) -> float:
    """Seconds of page-locking the operands ``ops`` ("A", "B", "C") of an m x n x k product
    for a run and releasing them (``r.register_bytes``; 0 where it is not known)."""
    if not ops or not r.register_bytes:
        return 0.0
    sizes = {"A": itemsize * m * k, "B": itemsize * k * n, "C": c_itemsize * m * n}
    return sum(sizes[op] for op in ops) / r.register_bytes


def pinned_at(p: Plan, r: Rates, start: float) -> dict[tuple[str, int], float]:
    """When each host staging buffer (operand, slot) is ready: those of the first step and
    those kept from an earlier run at ``start`` (the end of the setup), the others one after
    another on the pinning thread from then on (``r.pin_bytes``)."""
    t, ready = start, {}
    for op, i, nbytes, first, new in pins(p, r):
        if new and not first and r.pin_bytes:
            t += nbytes / r.pin_bytes
        ready[op, i] = start if first or not new else t
    return ready


def read_rates(p: Plan, r: Rates) -> tuple[float, float, float]:
    """Bytes of the panels' (tiles') dtype the host reads per second of A, B and C: each a
    whole load's :meth:`~.model.Rates.load_rate` as stored (narrower stored operands land faster),
    and for a compressed input no more than its decoding readers decode (one per chunk a
    panel meets, up to the plan's, each chunk decoded :func:`.decode.decoded_passes` times)."""
    w, wc, bm, bn, bk = p.itemsize, p.c_itemsize, p.bm, p.bn, p.bk
    sa, sb, sc = p.stored_itemsize("A"), p.stored_itemsize("B"), p.stored_itemsize("C")
    # stored bytes a second
    if r.thread_bytes:
        ra, rb, rc = (r.load_rate(sa * bm * bk), r.load_rate(sb * bk * bn),
                      r.load_rate(sc * bm * bn))
    else:  # (every load's rate)
        ra = rb = rc = r.read_bytes
    if p.decoding is not None:
        ra, rb = decode.decoding_rates(p, [ra, rb], r.decode_bytes)
    return ra * w / sa, rb * w / sb, rc * wc / sc
