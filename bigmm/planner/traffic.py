"""What a Plan moves: the bytes it reads and writes, the flops it does, and the communication
lower bound it is measured against (a mixin of :class:`~.schedule.Plan`)."""

from __future__ import annotations

import math

from ..units import DTYPES
from . import gram


class Traffic:
    """The traffic of a Plan, from its shapes, slots and dtypes."""

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

    @property
    def a_passes(self) -> float:
        """Elements of A read over the elements of A (``a_reads``, or a Gram plan's count:
        :func:`.gram.passes`)."""
        return gram.passes(self)[0] if self.symmetric else self.a_reads

    @property
    def b_passes(self) -> float:
        """Elements of B read over the elements of B (a Gram plan's B is A: its diagonal
        tiles read none)."""
        return gram.passes(self)[1] if self.symmetric else self.b_reads

    @property
    def c_elements(self) -> int:
        """Elements of C in the tiles computed (and read, where C is read)."""
        return gram.upper_elements(self) if self.symmetric else self.m * self.n

    @property
    def bytes_read(self) -> int:
        c = self.c_itemsize * self.c_elements if self.reads_c else 0
        return round(self.itemsize * (self.a_passes * self.m * self.k
                                      + self.b_passes * self.k * self.n)) + c

    @property
    def bytes_written(self) -> int:
        """C's bytes written: all of C (a Gram plan writes the tiles below the diagonal from
        those above, or as zeros with ``upper``)."""
        return DTYPES[self.written_dtype] * self.m * self.n

    @property
    def bytes_h2d(self) -> int:
        """Bytes copied host -> device (equal to bytes read: every panel read is copied in)."""
        return self.bytes_read

    @property
    def flops(self) -> int:
        """Flops done: 2mnk, or a Gram plan's n(n+1)k (the upper triangle's elements)."""
        if self.symmetric:
            return self.n * (self.n + 1) * self.k
        return 2 * self.m * self.n * self.k

    @property
    def lower_bound_bytes(self) -> float:
        """Communication lower bound on the inputs' reads: 2*M*N*K/sqrt(S) words (S = device
        budget in elements; half that for a Gram plan) less C's own traffic, which the bound
        counts too.

        Also at least the compulsory traffic: each input read once (a Gram plan's A once).
        """
        w = self.itemsize
        s = self.device_budget / w
        hk = (1 if self.symmetric else 2) * self.m * self.n * self.k / math.sqrt(s)
        compulsory = self.k * self.n if self.symmetric else self.m * self.k + self.k * self.n
        # the bound is on all the traffic: C's own (written once, read once for beta != 0)
        # counts towards it, so the inputs must make up only the rest
        c_traffic = self.m * self.n * (2 if self.reads_c else 1) * self.c_itemsize / w
        return w * max(hk - c_traffic, compulsory)

    @property
    def bound_ratio(self) -> float:
        """Input bytes moved over the lower bound (1.0 is optimal)."""
        w = self.itemsize
        moved = w * (self.a_passes * self.m * self.k + self.b_passes * self.k * self.n)
        return moved / self.lower_bound_bytes
