"""Check a product C against alpha * op(A) @ op(B) + beta * C0 in float64, in bounded memory.

Two methods, chosen by size (``exact_limit`` bounds M*N*K):

* ``exact``: every element of C is recomputed in float64 from blocks of A and B read from disk.
* ``sampled``: two checks in one pass over each operand, costing O(MK + KN + MN) flops instead of
  O(MNK), so it stays cheap for matrices that took hours to multiply:

  - Freivalds' check with ``probes`` random vectors x: C @ x against
    alpha * op(A) @ (op(B) @ x) + beta * C0 @ x. It sees every element of C: a wrong tile, a
    missed K panel, a NaN or a garbage row changes C @ x far beyond the rounding noise (a
    single element is caught once its error exceeds about sqrt(N) times the per-element bound).
  - ``samples`` random whole rows of C recomputed element by element (their rows of op(A) are
    held in memory while op(B) streams past), which catches small errors confined to a row.

Tolerance. Element (i, j) may differ from the float64 reference by about
``eps * sqrt(K + 2) * s_ij`` with ``s_ij = |alpha| |a_i| |b_j| + |beta| |c0_ij|`` (``a_i`` a row of
op(A), ``b_j`` a column of op(B), ``eps`` the machine epsilon of the dtype the products
accumulate in: float32 for float16 and bfloat16 operands, else NumPy's ``result_type`` of A
and B): the probabilistic rounding error bound of a K-term dot product (Higham & Mary 2019),
with ``|a_i . b_j| <= |a_i| |b_j|`` standing in for the magnitudes, plus the final rounding of
C to its own dtype (``eps_C``, which exceeds the first for a bfloat16 or float16 C). The
reference is computed from the operands as stored (already rounded to their dtypes).
``max_rel_error`` is the largest ``|c_ij - ref_ij| / s_ij`` (for a Freivalds probe, the error
of (C @ x)_i over ``sqrt(sum_j s_ij^2 x_j^2)``, the same bound carried through the sum); the
check passes when it is at most ``tolerance = SAFETY * eps * sqrt(K + 2) + eps_C``, each
``s_ij`` padded by the absolute error of underflow over the tolerance (:func:`underflow`:
products too small for the dtype, flushed to zero by some hardware, are right to within it). A
product computed on TF32 tensor cores (``precision``: :mod:`bigmm.precision`) rounds its
inputs first, each product off by up to ``p`` of itself (TF32: about 2^-9; 3xTF32: 2^-18),
which adds at most ``p * |a_i| |b_j|`` (Cauchy-Schwarz): the tolerance gains ``SAFETY * p``.

Non-finite values. Where the float64 reference is Inf or NaN (Inf or NaN in the operands), C
must hold the same value (NaN, or the same signed infinity; for a Freivalds probe, a
non-finite value), and the position counts in no relative error; where the reference is
finite, Inf or NaN in C fails. As in BLAS, alpha == 0 reads neither A nor B (the reference is
beta * C0, NaN in A or B ignored) and beta == 0 does not read C0.

Upper triangle. A Gram product written with ``upper`` (``bigmm.gram(..., upper=True)``) holds
the upper triangle of C, zeros below: its record (``bigmm_job``) says so, and ``upper`` (None: as
the record says) checks such a C as it is: every element strictly below the diagonal must be
exactly zero (each one read), and the upper triangle is checked as above against the upper
triangle of the product (the sampled check's Freivalds probes against triu(alpha * op(A) @
op(B) + beta * C0) @ x, op(A) and op(B) read once, in matching row and column blocks).

This checks a finished product after the fact; ``bigmm.matmul(..., verify="checksum")``
checks each C tile while it is computed (:mod:`bigmm.checksum`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .errors import IncompleteOutputError, OptionError, ShapeError
from .io import Source, open_input
from .job import parse_scalar
from .precision import DEFAULT, ROUNDING, check_dtype, parse_precision
from .units import (accumulate_dtype, common_dtype, dtype_name, format_bytes, numpy_dtype,
                    parse_seed)

#: Default M*N*K up to which every element is checked (about 2 GFLOP in float64).
EXACT_LIMIT = 1_000_000_000
#: Default number of whole rows recomputed in the sampled check.
SAMPLES = 16
#: Random vectors in Freivalds' check.
PROBES = 4
#: Factor over the probabilistic rounding bound.
SAFETY = 8.0
#: Float64 elements per block read (bounds the memory used, about 32 MiB per block).
BLOCK_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of :func:`verify`. ``worst`` locates the largest error: (row, col) for an
    element, (row, None) for a Freivalds probe of that row; None when nothing was off."""

    passed: bool
    max_rel_error: float
    method: str
    checked: int
    tolerance: float
    worst: tuple | None = None
    #: Where C failed and its record names other options than those checked: which.
    hint: str = ""

    def __str__(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        where = f" at {self.worst}" if self.worst and not self.passed else ""
        hint = f"; {self.hint}" if self.hint and not self.passed else ""
        return (f"{verdict}: max relative error {self.max_rel_error:.3g}{where} "
                f"(tolerance {self.tolerance:.3g}, {self.method}, {self.checked} elements "
                f"checked one by one){hint}")

    def to_dict(self) -> dict:
        return {"passed": self.passed, "max_rel_error": self.max_rel_error,
                "method": self.method, "checked": self.checked, "tolerance": self.tolerance,
                "worst": list(self.worst) if self.worst else None,
                "hint": self.hint if not self.passed else ""}


@dataclass(frozen=True)
class _Op:
    """op(X) of a source: rows and columns after the optional transpose, read in float64."""

    src: object
    trans: bool

    @property
    def shape(self) -> tuple[int, int]:
        r, c = self.src.shape
        return (c, r) if self.trans else (r, c)

    def read(self, r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
        if self.trans:
            r0, r1, c0, c1 = c0, c1, r0, r1
        buf = np.empty((r1 - r0, c1 - c0), dtype=self.src.dtype)
        self.src.read(r0, r1, c0, c1, buf)
        out = buf.astype(np.float64)
        return out.T if self.trans else out

    def row_blocks(self, elements: int):
        """(r0, r1, block) over all rows, each block at most ``elements`` (at least one row)."""
        m, n = self.shape
        step = max(1, elements // max(n, 1))
        for r0 in range(0, m, step):
            r1 = min(m, r0 + step)
            yield r0, r1, self.read(r0, r1, 0, n)


def _open(x, name: str) -> Source:
    """``open_input(x)``; a dataset left incomplete by an interrupted ``generate`` says to
    generate it again (there is no run to resume)."""
    try:
        return open_input(x, name=name)
    except IncompleteOutputError:
        from .io.generate import incomplete_message

        message = incomplete_message(x, name)
        if message is None:
            raise
        raise IncompleteOutputError(message) from None


def verify(a, b, c, *, alpha: float = 1.0, beta: float = 0.0, c0=None, trans_a: bool = False,
           trans_b: bool = False, samples: int = SAMPLES, probes: int = PROBES, seed: int = 0,
           exact_limit: int = EXACT_LIMIT, block_elements: int = BLOCK_ELEMENTS,
           precision: str | None = None, upper: bool | None = None) -> VerifyResult:
    """Check C = alpha * op(A) @ op(B) + beta * C0 (``c0``: the C before the run, when beta != 0).
    ``precision``: the arithmetic the float32 product was computed in (default "float32").
    ``upper``: C holds the upper triangle of a square product and zeros below (a Gram product
    written with ``upper=True``); None: as C's record says (False where it records nothing).

    Operands are specs ("file.h5:/path"), h5py datasets or arrays; an output left incomplete by
    an interrupted run raises IncompleteOutputError. See the module docstring for the methods.
    """
    _check_counts(samples, probes, exact_limit)
    parse_seed(seed)
    alpha, beta = parse_scalar(alpha, "alpha"), parse_scalar(beta, "beta")
    if beta != 0 and c0 is None:
        raise OptionError(f"Expected c0 (the C before the run) when beta != 0. Got beta={beta}.")
    sources, owned = [], []
    try:
        for x, name in ((a, "A"), (b, "B"), (c, "C")) + (((c0, "C0"),) if beta != 0 else ()):
            sources.append(_open(x, name))
            if not isinstance(x, Source):  # the caller closes the sources it passed
                owned.append(sources[-1])
        opa, opb = _Op(sources[0], trans_a), _Op(sources[1], trans_b)
        opc = _Op(sources[2], False)
        opc0 = _Op(sources[3], False) if beta != 0 else None
        m, k, n = _check_shapes(opa, opb, opc, opc0)
        recorded = (sources[2].record() or {}).get("job") or {}  # C's job, where bigmm wrote C
        upper = _upper(upper, recorded, m, n)
        hint = _record_hint(recorded, dict(alpha=alpha, beta=beta, trans_a=bool(trans_a),
                                           trans_b=bool(trans_b)))
        tol = tolerance(sources[0].dtype, sources[1].dtype, sources[2].dtype, k, precision)
        floor = underflow(sources[0].dtype, sources[1].dtype, sources[2].dtype, k)
        job = _Job(opa, opb, opc, opc0, alpha, beta, block_elements, floor / tol, upper)
        note = "upper triangle, zeros below" if upper else ""
        if m * n * k <= exact_limit:
            with np.errstate(invalid="ignore", over="ignore"):  # Inf or NaN in the operands
                err, worst = job.exact()
            return _result(err, worst, tol, f"exact ({note})" if upper else "exact", m * n,
                           hint)
        _check_sampled_memory(m, k, n, min(samples, m), probes)
        rng = np.random.default_rng(seed)
        rows = np.sort(rng.choice(m, size=min(samples, m), replace=False))
        x = rng.standard_normal((n, probes))
        with np.errstate(invalid="ignore", over="ignore"):
            err, worst = job.sampled(rows, x)
        return _result(err, worst, tol, f"sampled ({len(rows)} rows, {probes} Freivalds probes"
                       f"{'; ' + note if upper else ''})", len(rows) * n, hint)
    finally:
        for s in owned:
            s.close()


def tolerance(a_dtype, b_dtype, c_dtype, k: int, precision: str | None = None) -> float:
    """The check's tolerance for A, B and C of these dtypes and depth ``k`` (module
    docstring): SAFETY * eps * sqrt(k + 2) of the dtype the products accumulate in, plus the
    epsilon of C's dtype, plus SAFETY times the relative error of one product of float32
    operands in ``precision``."""
    operands = common_dtype(dtype_name(a_dtype), dtype_name(b_dtype))
    precision = check_dtype(parse_precision(precision) or DEFAULT, operands)
    product = ROUNDING[precision].product
    return (SAFETY * (_eps(accumulate_dtype(operands)) * math.sqrt(k + 2) + product)
            + _eps(dtype_name(c_dtype)))


def underflow(a_dtype, b_dtype, c_dtype, k: int) -> float:
    """The absolute error an element may carry beyond ``tolerance`` times its scale: products
    and sums that underflow (flushed to zero on some hardware: the smallest normal number of
    the accumulating dtype each, for the k products and two more sums) and C's own rounding
    near zero (to its subnormals, kept as C is converted: the smallest one)."""
    operands = common_dtype(dtype_name(a_dtype), dtype_name(b_dtype))
    return ((k + 2) * _tiny(accumulate_dtype(operands))
            + float(ml_dtypes.finfo(numpy_dtype(dtype_name(c_dtype))).smallest_subnormal))


def _tiny(name: str) -> float:
    """The smallest normal number of a DTYPES name (bfloat16: float32's exponent range)."""
    return float(np.finfo("float32" if name == "bfloat16" else name).tiny)


def _eps(name: str) -> float:
    """Machine epsilon of a DTYPES name (bfloat16: 2**-7, 8 bits of precision)."""
    return 2.0 ** -7 if name == "bfloat16" else float(np.finfo(name).eps)


def _result(err: float, worst, tol: float, method: str, checked: int,
            hint: str = "") -> VerifyResult:
    passed = bool(err <= tol)
    return VerifyResult(passed, float(err), method, int(checked), tol,
                        worst if err > 0 else None, hint)


def _record_hint(job: dict, given: dict) -> str:
    """Where C's recorded ``job`` (a finished bigmm output's) names other values of ``given``
    (alpha, beta, trans_a, trans_b) than the check uses: those, in words; else ""."""
    off = [key for key in given if key in job and job[key] != given[key]]
    if not off:
        return ""
    return (f"C's record says {', '.join(f'{key} {job[key]!r}' for key in off)} (checked with "
            f"{', '.join(f'{key} {given[key]!r}' for key in off)})")


def _check_counts(samples, probes, exact_limit) -> None:
    for name, v, lo in (("samples", samples, 0), ("probes", probes, 1),
                        ("exact_limit", exact_limit, 0)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo:
            raise OptionError(f"Expected {name} to be an integer >= {lo}. Got {v!r}.")


def _check_sampled_memory(m: int, k: int, n: int, rows: int, probes: int) -> None:
    """OptionError where the sampled check's float64 buffers (a few of (M, probes), the
    probes and op(B) @ x, and a few of the sampled rows) would not fit in the memory
    available: the operands' blocks are bounded, these are not."""
    from .backends.numpy import memory_available

    need = 8 * (probes * (6 * m + n + k) + rows * (k + 4 * n))
    free = memory_available()
    if need > free:
        raise OptionError(f"Expected samples and probes whose buffers fit in memory. Got "
                          f"samples={rows}, probes={probes}: {format_bytes(need)} of float64 "
                          f"for C of {m} x {n}, depth {k}, with {format_bytes(free)} "
                          f"available.")


def _upper(upper, job: dict, m: int, n: int) -> bool:
    """Whether C holds only the upper triangle: as asked, else as C's recorded ``job`` says (a
    Gram product written with ``upper``); ShapeError where the product is not square."""
    if upper is None:
        upper = bool(job.get("upper"))
    elif not isinstance(upper, (bool, np.bool_)):
        raise OptionError(f"Expected upper to be True, False or None. Got {upper!r}.")
    if upper and m != n:
        raise ShapeError(f"Expected a square product for upper (C's upper triangle, zeros "
                         f"below). Got op(A) @ op(B) of {m} x {n}.")
    return bool(upper)


def _check_shapes(opa: _Op, opb: _Op, opc: _Op, opc0: _Op | None) -> tuple[int, int, int]:
    (m, k), (k2, n) = opa.shape, opb.shape
    if k != k2:
        raise ShapeError(f"Expected op(A) columns to equal op(B) rows. Got op(A) {opa.shape} "
                         f"and op(B) {opb.shape}.")
    for name, op in (("C", opc), ("C0", opc0)):
        if op is not None and op.shape != (m, n):
            raise ShapeError(f"Expected {name} of shape {(m, n)}. Got {op.shape}.")
    return m, k, n


@dataclass(frozen=True)
class _Job:
    opa: _Op
    opb: _Op
    opc: _Op
    opc0: _Op | None
    alpha: float
    beta: float
    block: int
    #: Added to every element's scale: the underflow allowance over the tolerance.
    pad: float = 0.0
    #: C holds the upper triangle, zeros strictly below the diagonal.
    upper: bool = False

    def exact(self) -> tuple[float, tuple | None]:
        """Every element: op(B) in column blocks, op(A) and C in matching row blocks."""
        (m, k), n = self.opa.shape, self.opc.shape[1]
        cols = max(1, min(n, self.block // max(k, 1)))
        rows = max(1, min(m, self.block // max(k, 1)))
        worst = (0.0, None)
        for j0 in range(0, n, cols):
            j1 = min(n, j0 + cols)
            if self.alpha != 0:  # alpha == 0: A and B are not read (BLAS)
                bblk = self.opb.read(0, k, j0, j1)
                bnorm = np.linalg.norm(bblk, axis=0)
            for i0 in range(0, m, rows):
                i1 = min(m, i0 + rows)
                if self.upper and j1 <= i0:  # strictly below the diagonal: zeros
                    below = self.opc.read(i0, i1, j0, j1)
                    worst = _worse(worst, np.where(below == 0, 0.0, np.inf), i0, j0)
                    continue
                ref, scale = np.zeros((i1 - i0, j1 - j0)), np.zeros((i1 - i0, j1 - j0))
                if self.alpha != 0:
                    ablk = self.opa.read(i0, i1, 0, k)
                    ref = self.alpha * (ablk @ bblk)
                    scale = abs(self.alpha) * np.outer(np.linalg.norm(ablk, axis=1), bnorm)
                if self.opc0 is not None:
                    old = self.opc0.read(i0, i1, j0, j1)
                    ref += self.beta * old
                    scale += abs(self.beta) * np.abs(old)
                c = self.opc.read(i0, i1, j0, j1)
                err = _rel(c, ref, scale + self.pad)
                if self.upper:
                    low = _lower(i0, i1, j0, j1)
                    err[low] = np.where(c[low] == 0, 0.0, np.inf)
                worst = _worse(worst, err, i0, j0)
        return worst

    def sampled(self, rows: np.ndarray, x: np.ndarray) -> tuple[float, tuple | None]:
        """Freivalds' probes over all of C and whole ``rows`` of C, one pass per operand."""
        m, n = self.opa.shape[0], self.opc.shape[1]
        if self.alpha == 0:  # A and B are not read (BLAS): C is beta * C0
            ref, spread = np.zeros((m, x.shape[1])), np.zeros((m, x.shape[1]))
            ref_rows, scale_rows = np.zeros((len(rows), n)), np.zeros((len(rows), n))
        elif self.upper:
            ref, spread, ref_rows, scale_rows = self._product_upper(rows, x)
        else:
            ref, spread, ref_rows, scale_rows = self._product(rows, x)
        if self.opc0 is not None:
            c0x, c0spread, c0rows, _ = self._stream_c(self.opc0, rows, x)
            ref += self.beta * c0x
            spread += abs(self.beta) * c0spread
            ref_rows += self.beta * c0rows
            scale_rows += abs(self.beta) * np.abs(c0rows)
        cx, _, crows, below = self._stream_c(self.opc, rows, x)
        spread += self.pad * np.linalg.norm(x, axis=0)
        worst = _worse(below, _rel(cx, ref, spread, probe=True), 0, None)
        return _worse(worst, _rel(crows, ref_rows, scale_rows + self.pad), 0, 0, rows)

    def _product(self, rows: np.ndarray, x: np.ndarray):
        """alpha * op(A) @ (op(B) @ x) and alpha * op(A)[rows] @ op(B), with their scales, in
        one pass over each operand."""
        (m, k), n = self.opa.shape, self.opc.shape[1]
        arows = np.stack([self.opa.read(int(i), int(i) + 1, 0, k)[0] for i in rows]) \
            if len(rows) else np.zeros((0, k))
        z = np.empty((k, x.shape[1]))
        prod_rows = np.zeros((len(rows), n))
        bnorm2 = np.zeros(n)
        for k0, k1, bblk in self.opb.row_blocks(self.block):  # op(B) streams once
            z[k0:k1] = bblk @ x
            prod_rows += arows[:, k0:k1] @ bblk
            bnorm2 += np.einsum("ij,ij->j", bblk, bblk)
        az = np.empty((m, x.shape[1]))
        anorm = np.empty(m)
        for i0, i1, ablk in self.opa.row_blocks(self.block):  # op(A) streams once
            az[i0:i1] = ablk @ z
            anorm[i0:i1] = np.linalg.norm(ablk, axis=1)
        ref = self.alpha * az
        # sqrt(sum_j s_ij^2 x_j^2), splitting s_ij into its alpha and beta parts (triangle rule)
        spread = abs(self.alpha) * np.outer(anorm, np.sqrt(bnorm2 @ (x * x)))
        ref_rows = self.alpha * prod_rows
        scale_rows = abs(self.alpha) * np.outer(anorm[rows], np.sqrt(bnorm2))
        return ref, spread, ref_rows, scale_rows

    def _product_upper(self, rows: np.ndarray, x: np.ndarray):
        """``_product`` of the product's upper triangle (square): row i of triu(op(A) @ op(B))
        @ x is a_i . t_i, t_i the sum over j >= i of b_j x_j. Row blocks of op(A) meet the
        column blocks of op(B) of the same indices, bottom up, t carried between them; the
        blocks' t_i are held at once (``probes`` times a block)."""
        (m, k), n = self.opa.shape, self.opc.shape[1]
        p = x.shape[1]
        arows = np.stack([self.opa.read(int(i), int(i) + 1, 0, k)[0] for i in rows]) \
            if len(rows) else np.zeros((0, k))
        ref, spread = np.empty((m, p)), np.empty((m, p))
        prod_rows, anorm, bnorm2 = np.zeros((len(rows), n)), np.empty(m), np.empty(n)
        tail, tail2 = np.zeros((k, p)), np.zeros(p)  # sums over the columns below the block
        step = max(1, self.block // (max(k, 1) * (p + 1)))
        for i1 in range(m, 0, -step):
            i0 = max(0, i1 - step)
            ablk, bblk = self.opa.read(i0, i1, 0, k), self.opb.read(0, k, i0, i1)
            xb = x[i0:i1]
            t = np.cumsum((bblk.T[:, :, None] * xb[:, None, :])[::-1], axis=0)[::-1] + tail
            ref[i0:i1] = np.einsum("ik,ikp->ip", ablk, t)
            bn2 = np.einsum("ij,ij->j", bblk, bblk)
            w = np.cumsum((bn2[:, None] * xb * xb)[::-1], axis=0)[::-1] + tail2
            anorm[i0:i1] = np.linalg.norm(ablk, axis=1)
            spread[i0:i1] = anorm[i0:i1, None] * np.sqrt(w)
            tail, tail2 = t[0], w[0]
            prod_rows[:, i0:i1] = arows @ bblk
            bnorm2[i0:i1] = bn2
        low = np.arange(n)[None, :] < rows[:, None]
        ref_rows = np.where(low, 0.0, self.alpha * prod_rows)
        scale_rows = np.where(low, 0.0, abs(self.alpha) * np.outer(anorm[rows],
                                                                     np.sqrt(bnorm2)))
        return self.alpha * ref, abs(self.alpha) * spread, ref_rows, scale_rows

    def _stream_c(self, op: _Op, rows: np.ndarray, x: np.ndarray):
        """(C @ x, sqrt(C^2 @ x^2), C[rows], worst) in one pass over C; where C holds the upper
        triangle, of that triangle, and ``worst`` the first element below the diagonal that
        is not exactly zero ((inf, (row, col)); (0.0, None) where none)."""
        m, n = op.shape
        cx = np.empty((m, x.shape[1]))
        spread = np.empty((m, x.shape[1]))
        picked = np.empty((len(rows), n))
        below = (0.0, None)
        for i0, i1, blk in op.row_blocks(self.block):
            if self.upper:
                low = _lower(i0, i1, 0, n)
                below = _worse(below, np.where(low & (blk != 0), np.inf, 0.0), i0, 0)
                blk = np.where(low, 0.0, blk)
            cx[i0:i1] = blk @ x
            spread[i0:i1] = np.sqrt((blk * blk) @ (x * x))
            sel = (rows >= i0) & (rows < i1)
            picked[sel] = blk[rows[sel] - i0]
        return cx, spread, picked, below


def _lower(i0: int, i1: int, j0: int, j1: int) -> np.ndarray:
    """Where the block [i0:i1, j0:j1] lies strictly below the diagonal."""
    return np.arange(j0, j1)[None, :] < np.arange(i0, i1)[:, None]


def _rel(c: np.ndarray, ref: np.ndarray, scale: np.ndarray, probe: bool = False) -> np.ndarray:
    """|c - ref| / scale where the reference is finite, a C that is not counting as infinitely
    wrong. Where the reference is not (Inf or NaN in the operands), C must hold the same value
    (NaN for NaN, the same signed infinity), or for a Freivalds ``probe`` be non-finite too."""
    with np.errstate(divide="ignore", invalid="ignore"):
        diff = c - ref
        err = np.abs(diff) / scale
    err[np.isnan(err) & (diff == 0)] = 0.0  # 0/0: an exact zero where the scale is zero
    err[~np.isfinite(err)] = np.inf
    off = ~np.isfinite(ref)
    if off.any():
        if probe:
            same = ~np.isfinite(c[off])
        else:
            same = (c[off] == ref[off]) | (np.isnan(c[off]) & np.isnan(ref[off]))
        err[off] = np.where(same, 0.0, np.inf)
    return err


def _worse(best: tuple, err: np.ndarray, i0: int, j0: int | None, rows=None) -> tuple:
    if err.size == 0:
        return best
    flat = int(np.argmax(err))
    i, j = np.unravel_index(flat, err.shape)
    value = float(err[i, j])
    if value <= best[0]:
        return best
    row = int(rows[i]) if rows is not None else i0 + int(i)
    return value, (row, None if j0 is None else j0 + int(j))
