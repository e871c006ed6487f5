"""What a Plan moves: the bytes it reads and writes, the flops it does, and the communication
lower bound it is measured against (a mixin of :class:`~.schedule.Plan`).

Reads count each operand as it is stored (``Plan.a_dtype``, ``Plan.b_dtype``; old C in the
output's dtype), which need not be the dtype its panels are multiplied in: the host converts
a panel as it loads it, so the copies to the device move the compute dtype's bytes
(:attr:`Traffic.bytes_h2d`).
"""

from __future__ import annotations

import math

from ..units import DTYPES
from . import gram
from .derived import derived


class Traffic:
    """The traffic of a Plan, from its shapes, slots and dtypes."""

    def stored_itemsize(self, op: str) -> int:
        """Bytes per element of operand "A", "B" or "C" as stored: A and B in their stored
        dtypes (``dtype`` where not given), C in the output's (``written_dtype``)."""
        return self._stored_sizes[op]

    @derived
    def _stored_sizes(self) -> dict[str, int]:
        dtype = self.dtype
        return {"A": DTYPES[self.a_dtype or dtype], "B": DTYPES[self.b_dtype or dtype],
                "C": DTYPES[self.written_dtype or dtype]}

    @property
    def a_reads(self) -> int:
        """How many times all of A is read under the LRU slot schedule of ``steps``.

        Row-major tiles touch the row panel A(i, 0..nk-1) nj times in a row: it stays when its
        nk panels fit in the slots. Column-major tiles cycle through all ni*nk panels of A per
        tile column: A stays only when all of it fits. Resident-c strips span C's width: each
        A panel is used once.
        """
        cycle = self.nk if self.row_major else self.ni * self.nk
        return 1 if self.nj == 1 or self.a_slots >= cycle else self.nj

    @property
    def b_reads(self) -> int:
        """Mirror image of ``a_reads``; resident-c uses each B panel for every strip in a row
        (its first panels) or keeps it in one of tail + 1 slots (its last)."""
        if self.order == "resident-c":
            return 1
        cycle = self.nj * self.nk if self.row_major else self.nk
        return 1 if self.ni == 1 or self.b_slots >= cycle else self.ni

    @derived
    def a_passes(self) -> float:
        """Elements of A read over the elements of A (``a_reads``, or a Gram plan's count:
        :func:`.gram.passes`)."""
        return gram.passes(self)[0] if self.symmetric else self.a_reads

    @derived
    def b_passes(self) -> float:
        """Elements of B read over the elements of B (a Gram plan's B is A: its diagonal
        tiles read none)."""
        return gram.passes(self)[1] if self.symmetric else self.b_reads

    @property
    def c_elements(self) -> int:
        """Elements of C in the tiles computed (and read, where C is read)."""
        return gram.upper_elements(self) if self.symmetric else self.m * self.n

    def _input_bytes(self, a_width: int, b_width: int) -> float:
        """Bytes of A's and B's panels read, at these bytes per element."""
        return a_width * self.a_passes * self.m * self.k + b_width * self.b_passes * self.k * self.n

    @property
    def bytes_read(self) -> int:
        """Bytes read from the operands as they are stored (old C too, where it is read)."""
        c = self.stored_itemsize("C") * self.c_elements if self.reads_c else 0
        return round(self._input_bytes(self.stored_itemsize("A"), self.stored_itemsize("B"))) + c

    @property
    def bytes_written(self) -> int:
        """C's bytes written: all of C (a Gram plan writes the tiles below the diagonal from
        those above, or as zeros with ``upper``)."""
        return DTYPES[self.written_dtype] * self.m * self.n

    @property
    def bytes_h2d(self) -> int:
        """Bytes copied host -> device: every panel read, in the dtype it is multiplied in
        (old C in the tiles'); the bytes read where the operands are stored so."""
        c = self.c_itemsize * self.c_elements if self.reads_c else 0
        return round(self._input_bytes(self.itemsize, self.itemsize)) + c

    @property
    def flops(self) -> int:
        """Flops done: 2mnk, or a Gram plan's n(n+1)k (the upper triangle's elements)."""
        if self.symmetric:
            return self.n * (self.n + 1) * self.k
        return 2 * self.m * self.n * self.k

    @property
    def lower_bound_bytes(self) -> float:
        """Communication lower bound on the inputs' reads: 2*M*N*K/sqrt(S) elements (S =
        device budget in elements of the panels; half that for a Gram plan) less C's own
        traffic, which the bound counts too.

        Also at least the compulsory traffic: each input read once (a Gram plan's A once).
        In bytes as stored: each input once at its width, the elements beyond at the
        narrower one's.
        """
        w, wa, wb = self.itemsize, self.stored_itemsize("A"), self.stored_itemsize("B")
        s = self.device_budget / w
        hk = (1 if self.symmetric else 2) * self.m * self.n * self.k / math.sqrt(s)
        # the bound is on all the traffic: C's own (written once, read once for beta != 0)
        # counts towards it, so the inputs must make up only the rest
        c_traffic = self.m * self.n * (2 if self.reads_c else 1) * self.c_itemsize / w
        once = ((self.k * self.n, 0) if self.symmetric
                else (self.m * self.k, self.k * self.n))
        beyond = max(0.0, hk - c_traffic - sum(once))
        return wa * once[0] + wb * once[1] + min(wa, wb) * beyond

    @property
    def bound_ratio(self) -> float:
        """Input bytes read over the lower bound (1.0 is optimal)."""
        moved = self._input_bytes(self.stored_itemsize("A"), self.stored_itemsize("B"))
        return moved / self.lower_bound_bytes
