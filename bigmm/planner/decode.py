"""Decode buffers: the host memory a run decodes compressed chunks into, outside its staging.

A compressed chunk (an HDF5 filter, a Zarr codec) is read and decoded whole: a reader
decoding one holds the decoded chunk and its stored bytes beside the panel it fills (the io
layer keeps such buffers for the run and hands them to the readers in turn:
:mod:`bigmm.io.decode`). The job states, per input, the bytes one decoding reader holds and
how many readers could decode at once (:class:`Decoding`); the planner holds the staging and
the decode buffers within the host budget. It chooses the tiles beside one decoder for each
compressed input (the fewest bytes moved first: a plan reading an input twice decodes it
twice), then gives the plan as many decoders as the rest of the budget holds, up to those
that could decode (:func:`widened`). Where one decoded chunk of each compressed input and
the smallest tiles do not fit, the plan is refused (:func:`too_small`: BudgetError naming
the chunks).

A panel that cuts a chunk decodes all of it, so panels not aligned to the chunks (where the
budget holds no aligned ones) decode a chunk once for each panel it meets, unless the
chunk is still held in a decode buffer: :func:`decoded_passes` says how often at most.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import BudgetError
from ..units import format_bytes

#: Panels along one dimension counted exactly by :func:`_cut`; beyond, the first these many.
CUT_PANELS = 4096


@dataclass(frozen=True)
class Decoding:
    """The decode buffers of inputs A and B, each pair (A, B): ``per``, the bytes one
    decoding reader holds (a decoded chunk and its stored bytes; 0 where the input is not
    decoded); ``most``, the readers that could decode it at once; ``threads``, those that
    may (the plan's; at least one for an input decoded)."""

    per: tuple[int, int] = (0, 0)
    most: tuple[int, int] = (0, 0)
    threads: tuple[int, int] = (0, 0)

    @property
    def bytes(self) -> int:
        """Bytes the decode buffers hold in all."""
        return sum(b * t for b, t in zip(self.per, self.threads))

    @property
    def least(self) -> Decoding:
        """One decoding reader for each input decoded."""
        return replace(self, threads=tuple(int(b > 0) for b in self.per))

    def within(self, room: float) -> Decoding:
        """As many decoding readers as ``room`` bytes hold, up to ``most``, added one at a
        time to the input with fewer (at least :attr:`least`)."""
        threads = list(self.least.threads)
        while True:
            can = [i for i in (0, 1) if self.per[i] and threads[i] < self.most[i]
                   and self.bytes_with(threads, i) <= room]
            if not can:
                return replace(self, threads=tuple(threads))
            threads[min(can, key=lambda i: threads[i])] += 1

    def bytes_with(self, threads: list[int], add: int) -> int:
        """Bytes with ``threads`` and one more reader of input ``add``."""
        return sum(b * (t + (i == add)) for i, (b, t) in enumerate(zip(self.per, threads)))


def offered(per: tuple[int, int], most: tuple[int, int]) -> Decoding | None:
    """The decoding a job offers the planner (``threads`` left to it), None where neither
    input is decoded."""
    per = tuple(max(0, int(b)) for b in per)
    if not any(per):
        return None
    return Decoding(per, tuple(max(1, int(t)) if b else 0 for b, t in zip(per, most)))


def held(p) -> int:
    """Bytes plan ``p``'s decode buffers hold (0 where no input is decoded)."""
    return p.decoding.bytes if p.decoding is not None else 0


def host_total(p) -> int:
    """The host bytes plan ``p`` holds against its host budget: staging and decode buffers."""
    return p.host_bytes + held(p)


def widened(p):
    """Plan ``p`` with as many decoders as its host budget holds beside its staging."""
    if p.decoding is None:
        return p
    return replace(p, decoding=p.decoding.within(p.host_budget - p.host_bytes))


def least(p):
    """Plan ``p`` with one decoder for each input decoded."""
    return p if p.decoding is None else replace(p, decoding=p.decoding.least)


def too_small(smallest) -> BudgetError | None:
    """The error for a host budget below one decoded chunk of each compressed input and the
    smallest tiles' staging (``smallest``: the plan of the smallest tiles), None where that
    fits (the budgets fail otherwise)."""
    d = smallest.decoding
    need = None if d is None else host_total(least(smallest))
    if need is None or need <= smallest.host_budget:
        return None
    chunks = "; ".join(f"{op}'s {c[0]} x {c[1]}: {format_bytes(b)} decoded and stored"
                       for op, c, b in (("A", smallest.a_chunks, d.per[0]),
                                        ("B", smallest.b_chunks, d.per[1])) if b and c)
    inputs = " and ".join(op for op, b in zip("AB", d.per) if b)
    return BudgetError(
        f"Expected a host memory budget of at least {need} bytes ({format_bytes(need)}) for "
        f"one decoded chunk of each compressed input beside the smallest tiles ({chunks}). "
        f"Got {smallest.host_budget} bytes ({format_bytes(smallest.host_budget)}): give a "
        f"budget of at least {format_bytes(need)}, or store {inputs} in smaller chunks.",
        minimum=need)


def decoded_passes(p) -> tuple[float, float]:
    """At most how many times the chunks of A and of B are decoded over one pass of its panels
    (1.0 where the panels are aligned to its chunks, or it is not decoded): a panel decodes
    every chunk it meets whole, except that a tile's K panels follow one another, so that
    panels cutting a chunk along K find it still held (not in order resident-c, whose rounds
    take every strip's panel between)."""
    d = p.decoding
    out = []
    for i, (chunks, m_axis, m_edge, k_edge) in enumerate((
            (p.a_chunks, 1 if p.trans_a else 0, p.bm, p.bk * p.a_span),
            (p.b_chunks, 0 if p.trans_b else 1, p.bn, p.bk))):
        dims = ((p.k, p.m) if p.trans_a else (p.m, p.k)) if i == 0 else (
            (p.n, p.k) if p.trans_b else (p.k, p.n))
        if d is None or not (d.per[i] or p.symmetric) or not chunks:
            out.append(1.0)
            continue
        passes = _cut(dims[m_axis], m_edge, chunks[m_axis])
        if p.order == "resident-c":
            passes *= _cut(dims[1 - m_axis], k_edge, chunks[1 - m_axis])
        out.append(passes)
    return out[0], out[1]


def decoding_rates(p, rates: list[float], per_reader: tuple[float, float]) -> list[float]:
    """``rates``, the stored bytes a second A's and B's loads come in at, no faster than
    plan ``p``'s decoding readers decode them: one reader per chunk a panel meets, up to the
    plan's, each decoding ``per_reader`` bytes a second (0.0: not known), each chunk decoded
    :func:`decoded_passes` times (a Gram plan's B is A)."""
    d, out = p.decoding, list(rates)
    if d is None:
        return out
    passes = decoded_passes(p)
    for i, (chunks, trans, size) in enumerate(((p.a_chunks, p.trans_a, (p.bm, p.bk)),
                                               (p.b_chunks, p.trans_b, (p.bk, p.bn)))):
        j = 0 if p.symmetric else i
        if not (d.per[j] and per_reader[j]):
            continue
        rows, cols = size[::-1] if trans else size
        met = -(-rows // chunks[0]) * -(-cols // chunks[1]) if chunks else 1
        out[i] = min(out[i], min(d.threads[j], met) * per_reader[j] / passes[i])
    return out


def decoded_bytes(p) -> int:
    """Bytes decoded at most over the run (each pass over a compressed input's panels
    decodes its chunks :func:`decoded_passes` times; a Gram plan's B is A); 0 where no
    input is decoded."""
    if p.decoding is None:
        return 0
    pa, pb = decoded_passes(p)
    ba, bb = p.decoding.per
    return round(p.itemsize * ((pa * p.a_passes * p.m * p.k if ba else 0)
                               + (pb * p.b_passes * p.k * p.n if bb or p.symmetric else 0)))


def _cut(dim: int, panel: int, chunk: int) -> float:
    """Elements decoded along one dimension over its elements: panels ``panel`` long from 0,
    each decoding the chunks it meets whole (counted over the first CUT_PANELS panels)."""
    if panel % chunk == 0 or panel >= dim:
        return 1.0
    total = covered = 0
    for p0 in range(0, min(dim, CUT_PANELS * panel), panel):
        p1 = min(dim, p0 + panel)
        total += min(dim, -(-p1 // chunk) * chunk) - p0 // chunk * chunk
        covered += p1 - p0
    return total / covered
