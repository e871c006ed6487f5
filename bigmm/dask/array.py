"""bigmm.dask.matmul: dask arrays in, dask array out, one chain of accumulate tasks per block."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..job import parse_scalar
from ..backends import BACKENDS
from ..executor.writer import converted
from ..errors import BackendUnavailable, DtypeError, ShapeError, SpecError
from ..io.spec import Spec
from ..planner import make_plan
from ..precision import DEFAULT, check_dtype, parse_precision
from ..units import (DTYPES, accumulate_dtype, common_dtype, dtype_name, numpy_dtype,
                     parse_out_dtype, parse_size)
from ._common import backend as _backend
from ._common import dask_array as _dask_array


@dataclass(frozen=True)
class _Step:
    """One accumulate task: C_ij (+)= alpha * op(A block)[:, k] @ op(B block)[k, :].

    ``a_k``/``b_k``: the K range within the A and B blocks (None: the whole block).
    ``acc``: the dtype the partial blocks accumulate in; ``out``: the dtype the last step's
    block is returned in (the output's; None: ``acc``).
    """

    a_k: tuple[int, int] | None
    b_k: tuple[int, int] | None
    alpha: float
    trans_a: bool
    trans_b: bool
    backend: str
    acc: str = "float64"
    out: str | None = None
    precision: str | None = None


def matmul(a, b, *, alpha: float = 1.0, trans_a: bool = False, trans_b: bool = False,
           memory=None, backend: str = "auto", out_dtype=None, precision: str | None = None):
    """alpha * op(a) @ op(b) for 2-D dask arrays, as a dask array of bigmm accumulate tasks.

    Output block (i, j) has op(a)'s i-th row chunk and op(b)'s j-th column chunk. It is the end
    of a chain of tasks along K, one per piece of the K axis where the K chunks of op(a) and
    op(b) overlap (unequal K chunkings are refined, never concatenated). Each task takes the
    previous partial block (never modified: it is copied), one A block and one B block, and
    accumulates with the backend's gemm (beta = 0 on the first piece, 1 after): no
    concatenation of K blocks, no tree of full-size partial products.

    Memory per task, w = itemsize, bm x bk the largest block of op(a) and bk x bn of op(b):
    at most ``w * (2*bm*bn + 2*bm*bk + 2*bk*bn)`` bytes (partial C in and out, the two blocks,
    and a contiguous copy of a block only where it must be sliced or is strided). With
    ``memory`` ("512MiB", bytes) the inputs are first rechunked to the tiles bigmm's planner
    chooses for that budget, so that bound is at most ``memory``; without it the arrays' own
    chunks set the bound. How many tasks a worker runs at once is the scheduler's business.

    ``backend``: "auto" (from the chunk type: CuPy chunks -> "cupy", else "numpy"), "numpy"
    or "cupy". The chunk type is preserved (the result's ``meta`` is that of ``a``).
    ``precision``: the arithmetic of float32 products, as in :func:`bigmm.matmul` (CuPy
    chunks; NumPy chunks are multiplied in IEEE float32 whatever it says).

    Dtypes as in :func:`bigmm.matmul`: float16, bfloat16, float32 and float64; mixed inputs
    are multiplied in NumPy's ``result_type`` (float32 @ float64 in float64, the other
    converted block by block). float16 and bfloat16 accumulate in float32 and the result is
    float32, or the operands' dtype with ``out_dtype`` (the last task of each block converts
    it). The bound above counts the partial blocks in the dtype they accumulate in.
    """
    da = _dask_array()
    from dask.array.utils import meta_from_array
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    for name, x in (("a", a), ("b", b)):  # (a string would be a 0-D array of text)
        if isinstance(x, (str, bytes, os.PathLike, Spec)):
            raise SpecError(f"Expected a dask array for {name} (files: "
                            f"bigmm.dask.matmul_files). Got {type(x).__name__} {x!r}.")
    a, b = da.asanyarray(a), da.asanyarray(b)
    for name, x in (("a", a), ("b", b)):
        if x.ndim != 2:
            raise ShapeError(f"Expected a 2-D dask array for {name}. Got shape {x.shape} "
                             f"({x.ndim}-D).")
        if any(np.isnan(c) for cs in x.chunks for c in cs):
            raise ShapeError(f"Expected known chunk sizes for {name}. Got unknown ones "
                             f"(call {name}.compute_chunk_sizes() first).")
        _check_chunk_type(x._meta, name)
    dtype = _common_float(a.dtype, b.dtype)
    precision = parse_precision(precision)
    check_dtype(precision or DEFAULT, dtype.name)
    out_name = parse_out_dtype(out_dtype, dtype.name)
    acc = accumulate_dtype(dtype.name)
    a, b = (x if x.dtype == dtype else x.astype(dtype) for x in (a, b))
    alpha = parse_scalar(alpha, "alpha")
    m, k = a.shape[::-1] if trans_a else a.shape
    kb, n = b.shape[::-1] if trans_b else b.shape
    if k != kb:
        opa, opb = ("a.T" if trans_a else "a"), ("b.T" if trans_b else "b")
        raise ShapeError(f"Expected the inner dimensions to match: columns of {opa} == rows of "
                         f"{opb}. Got {opa} {m}x{k} and {opb} {kb}x{n}: {k} != {kb}.")
    meta = meta_from_array(a, ndim=2, dtype=numpy_dtype(out_name))
    be_name = _array_backend(backend, meta)
    if memory is not None and not (m and n and k):  # an empty product: its chunks stand
        parse_size(memory, name="memory")
    elif memory is not None:
        a, b = _rechunk_to_budget(a, b, m, n, k, dtype, trans_a, trans_b, memory)

    rows = a.chunks[1] if trans_a else a.chunks[0]
    cols = b.chunks[0] if trans_b else b.chunks[1]
    ka = a.chunks[0] if trans_a else a.chunks[1]
    kb_ = b.chunks[1] if trans_b else b.chunks[0]
    token = tokenize(a, b, alpha, trans_a, trans_b, be_name, out_name, precision)
    out, acc_key = f"bigmm-matmul-{token}", f"bigmm-accumulate-{token}"
    pieces = _k_pieces(ka, kb_)
    dsk: dict = {}
    for i, mi in enumerate(rows):
        for j, nj in enumerate(cols):
            if not pieces:  # K == 0: the product is zero
                dsk[(out, i, j)] = (_zeros, meta, (mi, nj))
                continue
            prev = None
            for s, (ia, a_k, ib, b_k) in enumerate(pieces):
                akey = (a.name, ia, i) if trans_a else (a.name, i, ia)
                bkey = (b.name, j, ib) if trans_b else (b.name, ib, j)
                last = s == len(pieces) - 1
                key = (out, i, j) if last else (acc_key, i, j, s)
                step = _Step(a_k, b_k, alpha, bool(trans_a), bool(trans_b), be_name, acc,
                             out_name if last and out_name != acc else None, precision)
                dsk[key] = (_accumulate, prev, akey, bkey, step)
                prev = key
    graph = HighLevelGraph.from_collections(out, dsk, dependencies=[a, b])
    return da.Array(graph, out, chunks=(rows, cols), meta=meta)


def _common_float(x, y) -> np.dtype:
    """The dtype two arrays of dtypes ``x`` and ``y`` are multiplied in
    (:func:`bigmm.units.common_dtype`)."""
    names = dtype_name(x), dtype_name(y)
    if None in names:
        raise DtypeError(f"Expected dask arrays of {', '.join(DTYPES)}. Got {np.dtype(x)} and "
                         f"{np.dtype(y)}.")
    return numpy_dtype(common_dtype(*names))


def _from_cupy(meta) -> bool:
    """Whether ``meta``'s type comes from CuPy (told by its module: CuPy is not imported)."""
    return type(meta).__module__.split(".")[0] == "cupy"


def _check_chunk_type(meta, name: str) -> None:
    """DtypeError for chunks other than plain NumPy or CuPy arrays: the gemm reads their raw
    values, so a masked array's masked elements would count as data."""
    kind = type(meta)
    if kind is np.ndarray or (_from_cupy(meta) and kind.__name__ == "ndarray"):
        return
    raise DtypeError(f"Expected {name} with NumPy or CuPy chunks. Got {kind.__module__}."
                     f"{kind.__name__} chunks (bigmm would ignore what they add to the values, "
                     f"such as a mask).")


def _array_backend(backend: str, meta) -> str:
    """The backend name for chunks like ``meta``: "auto" follows the chunk type."""
    gpu = _from_cupy(meta)
    if not isinstance(backend, str) or backend.lower() not in BACKENDS:
        raise BackendUnavailable(f"Expected backend to be one of {', '.join(BACKENDS)}. "
                                 f"Got {backend!r}.")
    name = backend.lower()
    if name == "auto":
        return "cupy" if gpu else "numpy"
    if (name == "cupy") != gpu:
        raise BackendUnavailable(f"Expected {'CuPy' if name == 'cupy' else 'NumPy'} chunks for "
                                 f"backend {name!r}. Got {type(meta).__module__} chunks.")
    return name


def _k_pieces(ka, kb) -> list[tuple[int, tuple | None, int, tuple | None]]:
    """The common refinement of two chunkings of K: (A block, range in it or None for the whole
    block, B block, range in it or None), in order; empty pieces are dropped."""
    ea, eb = np.cumsum((0,) + tuple(ka)), np.cumsum((0,) + tuple(kb))
    edges = sorted(set(ea.tolist()) | set(eb.tolist()))
    out = []
    for k0, k1 in zip(edges, edges[1:]):
        if k1 == k0:
            continue
        ia = int(np.searchsorted(ea, k0, side="right")) - 1
        ib = int(np.searchsorted(eb, k0, side="right")) - 1
        ra = (k0 - int(ea[ia]), k1 - int(ea[ia]))
        rb = (k0 - int(eb[ib]), k1 - int(eb[ib]))
        out.append((ia, None if ra == (0, ka[ia]) else ra,
                    ib, None if rb == (0, kb[ib]) else rb))
    return out


def _rechunk_to_budget(a, b, m, n, k, dtype, trans_a, trans_b, memory):
    """Rechunk a and b to the tiles of bigmm's stream plan for ``memory`` bytes per task."""
    budget = parse_size(memory, name="memory")
    big = lambda cs: max(cs) if cs else 1  # noqa: E731
    p = make_plan(m, n, k, dtype.name, trans_a=trans_a, trans_b=trans_b, device_budget=budget,
                  host_budget=budget, staging=False, order="stream",
                  a_chunks=(big(a.chunks[0]), big(a.chunks[1])),
                  b_chunks=(big(b.chunks[0]), big(b.chunks[1])))
    a = a.rechunk((p.bk, p.bm) if trans_a else (p.bm, p.bk))
    b = b.rechunk((p.bn, p.bk) if trans_b else (p.bk, p.bn))
    return a, b


def _operand(x, k: tuple | None, axis: int, trans: bool):
    """(C-contiguous 2-D array, transposed flag) for the K range ``k`` of block ``x``.

    A Fortran-ordered block is used as the transpose of its C-ordered transpose (no copy);
    a sliced or strided one is copied.
    """
    if k is not None:
        x = x[k[0]:k[1], :] if axis == 0 else x[:, k[0]:k[1]]
    if x.flags.c_contiguous:
        return x, trans
    if x.flags.f_contiguous:
        return x.T, not trans
    return x.copy(order="C"), trans


def _accumulate(prev, a_blk, b_blk, step: _Step):
    """A new block: alpha * op(a)[., k] @ op(b)[k, .] + prev (prev is None on the first piece).

    The block is allocated by the chunks' own array library (``empty_like`` dispatches to
    CuPy for CuPy chunks), not by the backend, whose buffers live only as long as a run.
    """
    be = _backend(step.backend, step.precision)
    a, ta = _operand(a_blk, step.a_k, 0 if step.trans_a else 1, step.trans_a)
    b, tb = _operand(b_blk, step.b_k, 1 if step.trans_b else 0, step.trans_b)
    m = a.shape[1] if ta else a.shape[0]
    n = b.shape[0] if tb else b.shape[1]
    c = np.empty_like(a, shape=(m, n), dtype=numpy_dtype(step.acc), order="C")
    beta = 0.0
    if prev is not None:
        c[...] = prev
        beta = 1.0
    if m and n and step.alpha != 0:
        be.gemm(a, b, c, step.alpha, beta, ta, tb, None)  # stream None: the current stream
    elif prev is None:  # alpha == 0: A and B not read (BLAS's convention)
        c[...] = 0
    if step.out is None:
        return c
    return converted(c, numpy_dtype(step.out), f"a {m} x {n} block of bigmm.dask.matmul")


def _zeros(meta, shape):
    return np.zeros_like(meta, shape=shape, order="C")
