"""Checksum verification of every C tile (algorithm-based fault tolerance, Huang & Abraham 1984).

For one C tile, C = alpha * sum_k op(A)_k op(B)_k + beta * C0 over its K panels. As soon as a
panel lands in the buffer the gemm uses, two vectors are taken from it in float64:

* from an A panel: ``a_k = e^T op(A)_k`` and ``|a|_k = e^T |op(A)_k|`` (length bk);
* from a B panel: ``b_k = op(B)_k e`` and ``|b|_k = |op(B)_k| e``.

Each step then adds ``alpha * a_k^T op(B)_k`` to the expected column sums of C and
``alpha * op(A)_k b_k`` to the expected row sums (``beta * e^T C0`` and ``beta * C0 e`` from
the first step), with the same sums of absolute values beside them. After the last step the
actual ``e^T C`` and ``C e`` (float64) are compared with the expected ones. ``a_k`` comes from
the A panel as it landed while the column update reads the B buffer, so a bit flipped in A
after landing breaks the column check, one flipped in B the row check, and a changed C value
both. The work runs on the backend (the reductions of kernels/abft_checksum.cu on the GPU,
memory-bound, NumPy on the CPU); only four numbers per tile come back to the host. Where the
backend's gemm can do a step's two updates itself (``fuses_checks``: bigmm's GPU kernel sums
the tiles it loads anyway), they cost no pass over the panels of their own; the panels'
vectors and the finished tile's sums are still separate reductions.

Tolerance. Each element of C is a sum of n = K + P + 2 rounded terms (K products, one
accumulation per K panel P, alpha and beta), so with u = eps/2 the rounding error of C[i, j]
is at most gamma_n * s_ij with ``s_ij = |alpha| sum_k |A_ik| |B_kj| + |beta| |C0_ij|`` and
gamma_n = n*u / (1 - n*u) <= n*eps while n*u <= 1/2 (Higham, Accuracy and Stability, 3.5),
whatever the order of the sums (blocked, split K, FMA). A column sum of C is off by at most
n*eps * sum_i s_ij, and that sum is exactly the expected sum of absolute values. The float64
checksums add their own rounding, at most (K + P + bm + 4) * eps64 times the same magnitude
(bm the rows summed; bn for the row sums), and a fused update sums each k-tile of its terms
in the dtype first (at most FUSED_ROUNDINGS more roundings of eps). Together they are below
``SAFETY * eps * (K + P + bm + 4 + FUSED_ROUNDINGS) * magnitude`` with SAFETY = 2 (eps >=
eps64); an absolute floor of the same count of smallest subnormals covers products that
underflow. The bound is
rigorous: no data (mixed sign, all positive, long K) can fail it without a fault.

Tensor-core float32 products (``precision=``, :mod:`bigmm.precision`) round their inputs
before the multiply, which an FMA does not: each product then carries a relative error of its
own, at most ``product`` (TF32: (1 + 2^-10)^2 - 1; 3xTF32: 2^-18), whatever K, and 3xTF32 adds
three terms per product (``terms``). The backend states its gemm's :class:`Rounding`; the
bound becomes ``SAFETY * (eps * n + product) * magnitude`` with n counting ``terms * K``
additions. So TF32 checks allow about 4e-3 of the magnitude, not K times 2^-10. The price is
that it scales with K and bm, so a fault is seen when it moves a column or row sum by more
than that: a flipped high exponent bit, an Inf or NaN, a lost panel; an error in the last
mantissa bits stays within rounding and is not.
"""

from __future__ import annotations

import numpy as np

from .backends.base import Checksums, GemmChecks
from .errors import OptionError
from .planner import Plan, Step, Tile
from .precision import Rounding
from .runstats import Mismatch

#: Values ``verify=`` takes (None: no checks).
VERIFY_MODES = (None, "checksum")
#: Factor over n*eps covering the product's rounding and the float64 checksums' own.
SAFETY = 2.0
#: Roundings of eps a fused update adds: a k-tile (at most 16 deep) summed in the dtype, and
#: the weights rounded to it (see GemmChecks).
FUSED_ROUNDINGS = 32
_F64 = np.dtype(np.float64)


def parse_verify(verify) -> str | None:
    """``verify`` as None or "checksum"; OptionError otherwise."""
    if verify is None or verify is False:
        return None
    if isinstance(verify, str) and verify.lower() in VERIFY_MODES[1:]:
        return verify.lower()
    raise OptionError(f"Expected verify to be None or 'checksum'. Got {verify!r}.")


def bounds(eps: float, dtype, k: int, panels: int, summed: int, *, terms: int = 1,
           product: float = 0.0) -> tuple[float, float]:
    """(relative, absolute) tolerance of one checksum: |expected - actual| may reach
    ``relative * magnitude + absolute`` without a fault, for a gemm whose additions round
    with ``eps``, each product adding ``terms`` terms with a relative error of ``product``
    from its inputs' rounding (a :class:`bigmm.precision.Rounding`; see the module
    docstring)."""
    n = terms * k + panels + summed + 4 + FUSED_ROUNDINGS
    tiny = float(np.finfo(dtype).smallest_subnormal)
    return SAFETY * (eps * n + product), SAFETY * n * max(summed, 1) * tiny


def rounding_bounds(r: Rounding, dtype, k: int, panels: int, summed: int
                    ) -> tuple[float, float]:
    """:func:`bounds` for a gemm of rounding ``r``."""
    return bounds(r.eps, dtype, k, panels, summed, terms=r.terms, product=r.product)


class TileChecksums:
    """The checksum vectors of one run on backend ``be``, allocated once: two per A and B panel
    slot, the expected sums per C slot, one actual-sums buffer and four result numbers per C
    slot (copied to pinned host memory where the backend stages). Every call is issued on the
    given stream in the executor's order; see the module docstring."""

    def __init__(self, be: Checksums, plan: Plan, alpha: float, beta: float):
        self.be, self.plan, self.alpha, self.beta = be, plan, float(alpha), float(beta)
        bm, bn, bk = plan.bm, plan.bn, plan.bk
        self.a = [be.device_buffer(2 * bk, _F64) for _ in range(plan.a_slots)]
        self.b = [be.device_buffer(2 * bk, _F64) for _ in range(plan.b_slots)]
        self.expected = [be.device_buffer(2 * (bm + bn), _F64) for _ in range(plan.c_slots)]
        self.actual = be.device_buffer(bm + bn, _F64)
        self.result = [be.device_buffer(4, _F64) for _ in range(plan.c_slots)]
        self.host = ([be.host_buffer(4, _F64) for _ in range(plan.c_slots)] if be.staging
                     else self.result)
        self.rounding = be.rounding(np.dtype(plan.dtype))
        self.panels = len(plan.k_panels())
        self._launches: dict[tuple, list] = {}
        #: Whether the backend's gemm does each step's updates (``step`` then hands them over).
        self.fuse = bool(be.fuses_checks)
        self._fused: dict[tuple, GemmChecks] = {}

    def _pair(self, buf, k: int):
        """(values, absolute values) halves of a panel slot's vector buffer, k long."""
        bk = self.plan.bk
        return buf[:k], buf[bk:bk + k]

    def _expected(self, c_slot: int, shape: tuple[int, int]):
        """(column sums, their magnitudes, row sums, their magnitudes) of a C slot."""
        bm, bn = self.plan.bm, self.plan.bn
        e, (rows, cols) = self.expected[c_slot], shape
        return e[:cols], e[bn:bn + cols], e[2 * bn:2 * bn + rows], e[2 * bn + bm:2 * bn + bm + rows]

    def _issue(self, key: tuple, make, stream) -> None:
        """Issue the launches ``make()`` gives for ``key`` on ``stream``, set up on first use
        (a run repeats few distinct shapes on the same slot buffers: the checks and kernel
        choices are done once, not at every step)."""
        launches = self._launches.get(key)
        if launches is None:
            launches = self._launches[key] = make()
        for launch in launches:
            launch(stream)

    def landed(self, op: str, slot: int, panel, stream) -> None:
        """Take the vectors of a stored panel of A or B that just landed in ``slot`` (the
        views the executor passes for one slot always start at its buffer)."""
        def make():
            p = self.plan
            if op == "A":  # e^T op(A): sums over the rows of op(A)
                x, buf = (panel.T if p.trans_a else panel), self.a[slot]
            else:  # op(B) e: sums over the rows of op(B)^T
                x, buf = (panel if p.trans_b else panel.T), self.b[slot]
            return [self.be.sums_launcher(x, *self._pair(buf, x.shape[1]))]

        self._issue(("landed", op, slot, panel.shape), make, stream)

    def step(self, st: Step, a, b, c, stream) -> GemmChecks | None:
        """Add one step's terms to its tile's expected sums (before its gemm: on the first
        step ``c`` still holds C0, read when beta != 0). Where the backend's gemm does the
        updates itself, what to pass it as ``checks`` (None: they were issued here)."""
        key = (st.c_slot, st.a_slot, st.b_slot, a.shape, b.shape, st.first)

        def make():
            p, launcher = self.plan, self.be.sums_launcher
            col, col_abs, row, row_abs = self._expected(st.c_slot, st.tile.shape)
            more = not st.first
            out = []
            if st.first and p.reads_c:
                out += [launcher(c, col, col_abs, scale=self.beta),
                        launcher(c.T, row, row_abs, scale=self.beta)]
                more = True
            k = st.k1 - st.k0
            av, av_abs = self._pair(self.a[st.a_slot], k)
            bv, bv_abs = self._pair(self.b[st.b_slot], k)
            if self.fuse:
                self._fused[key] = GemmChecks(av, av_abs, col, col_abs, bv, bv_abs, row,
                                              row_abs, scale=self.alpha, accumulate=more)
                return out
            op_a = a.T if p.trans_a else a
            op_b = b.T if p.trans_b else b
            return out + [launcher(op_b, col, col_abs, weights=av, abs_weights=av_abs,
                                   scale=self.alpha, accumulate=more),
                          launcher(op_a.T, row, row_abs, weights=bv, abs_weights=bv_abs,
                                   scale=self.alpha, accumulate=more)]

        self._issue(("step",) + key, make, stream)
        return self._fused.get(key) if self.fuse else None

    def finish(self, st: Step, c, stream) -> None:
        """Compare the finished tile's column and row sums with the expected ones; the four
        result numbers stay on the device until :meth:`fetch`."""
        def make():
            rows, cols = st.tile.shape
            bn, be = self.plan.bn, self.be
            col, col_abs, row, row_abs = self._expected(st.c_slot, st.tile.shape)
            act_col, act_row = self.actual[:cols], self.actual[bn:bn + rows]
            res = self.result[st.c_slot]
            k, dt = self.plan.k, np.dtype(self.plan.dtype)
            return [be.sums_launcher(c, act_col), be.sums_launcher(c.T, act_row),
                    be.compare_launcher(col, col_abs, act_col,
                                        *rounding_bounds(self.rounding, dt, k, self.panels, rows), res[0:2],
                                        limit=float(np.finfo(dt).max)),
                    be.compare_launcher(row, row_abs, act_row,
                                        *rounding_bounds(self.rounding, dt, k, self.panels, cols), res[2:4],
                                        limit=float(np.finfo(dt).max))]

        self._issue(("finish", st.c_slot, st.tile.shape), make, stream)

    def fetch(self, c_slot: int, stream) -> None:
        """Copy a C slot's result numbers to the host (staging backends) on ``stream``."""
        if self.be.staging:
            self.be.copy_out(self.be.view(self.result[c_slot], (1, 4)),
                             self.be.view(self.host[c_slot], (1, 4)), stream)

    def verdict(self, c_slot: int, tile: Tile) -> Mismatch | None:
        """The fetched result of ``tile`` (its copy complete): None when both checks pass."""
        r = [float(x) for x in self.host[c_slot][:4]]
        if r[0] <= 1.0 and r[2] <= 1.0:
            return None
        return Mismatch(tile.index, (tile.r0, tile.r1), (tile.c0, tile.c1), r[0], int(r[1]),
                        r[2], int(r[3]))
