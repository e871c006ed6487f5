"""bigmm's own CUDA GEMM kernels: choosing and launching (the tile configs and their table:
:mod:`.kernel_configs`; compiling and loading: :mod:`.cuda_build`; large TF32 products from
operands split ahead: :mod:`.cuda_presplit`; the checksum kernels: :mod:`.cuda_checksums`).

The sources live in the top-level ``kernels/`` folder (shipped in the wheel as
``bigmm/kernels``).  Each (dtype, tile shape) is one ``cupy.RawModule`` compiled by NVRTC with
the tile parameters as ``-D`` macros; it holds nine ``extern "C"`` entry points, one per pair of
operand load modes, so no C++ template names cross into Python.  Modules are compiled once per
process and device, by NVRTC with ``-ftz=false`` (float32 subnormals kept, as IEEE float32 and
cuBLAS keep them); the binaries are kept in cupy's disk cache folder (``CUPY_CACHE_DIR``,
default ``~/.cupy/kernel_cache``), keyed by the full source text and options.

The tile shape for a product comes from ``kernel_table.json`` beside this module, written by
``scripts/autotune_kernels.py`` on a GPU.

float32 products have three precisions (``precision=`` of :func:`gemm`): "float32" (IEEE float32
FMAs on the CUDA cores, ``gemm_regblock.cu``), "tf32x3" (the TF32 tensor cores, three passes
over a big + small split of every operand: float32's accuracy, ``gemm_tf32.cu``) and "tf32"
(one TF32 pass: about 1e-4 relative error). Each has its own rules in the table. On Hopper
(compute capability 9.0) the TF32 precisions run on the warpgroup tensor cores
(``gemm_wgmma.cu``, compiled for sm_90a; large products from operands split ahead:
:mod:`.cuda_presplit`; plain TF32 reading its operands as stored: :mod:`.cuda_direct`) where the
table has rules for "<precision>@sm_90a";
elsewhere, and for configs without ``wgmma``, on ``mma.sync`` (``gemm_tf32.cu``).

cupy is imported inside functions only: importing this module needs no GPU.
"""

from __future__ import annotations

from ..errors import DtypeError, KernelError, ShapeError
from .cuda_build import (device_id, grant_smem, kernel_dir, kernel_source,  # noqa: F401
                         raw_kernel, sm_count, sm_count_of)
from .cuda_direct import direct_layout, direct_pays, prepare_direct
from .cuda_presplit import (PARTS, can_presplit, prepare_presplit, presplit_pays,  # noqa: F401
                            split_parts)
from .cuda_tma import tma_aligned
from .kernel_configs import (_DTYPES, _LOADERS, TF32X3_MIN_K,
                             TF32X3_WGMMA_MIN_K, TileConfig, device_arch, load_table,
                             parse_precision, select_config, tile_configs)

_INT32_MAX = 2**31 - 1


#: Kernels by (config, entry, checks, upper, device), and the configs checked: a launch's
#: host time is mostly these lookups once a kernel is compiled.
_gemm_kernels: dict[tuple, object] = {}
_checked: set[TileConfig] = set()


def _gemm_kernel(config: TileConfig, entry: str, checks: bool = False, upper: bool = False):
    key = (config, entry, checks, upper, device_id())
    kern = _gemm_kernels.get(key)
    if kern is None:
        kern = _gemm_kernels[key] = _compiled_gemm(config, entry, checks, upper)
    return kern


def _compiled_gemm(config: TileConfig, entry: str, checks: bool, upper: bool):
    options = config.defines(checks) + config.compile_options() + (
        "-DBIGMM_ONLY=1", f"-DBIGMM_ONLY_NAME=gemm_{entry}",
        f"-DBIGMM_ONLY_A={_LOADERS[entry[0]]}", f"-DBIGMM_ONLY_B={_LOADERS[entry[1]]}")
    if upper:
        options += ("-DBIGMM_UPPER=1",)
    kern = raw_kernel(config.source, "gemm_" + entry, options)
    grant_smem(kern, options, config.smem_bytes, f"tile config {config.name}")
    return kern


def _runnable(configs) -> list[TileConfig]:
    """The configs whose target the current device has (all but other arch-specific ones)."""
    arch = device_arch()
    return [c for c in configs if c.arch is None or c.arch == arch]


def compile_all(dtype: str | None = None) -> list[str]:
    """Compile every entry of every table config (of one dtype, or all) that the current
    device can run; returns the names."""
    done = []
    for cfg in _runnable(tile_configs(dtype).values()):
        for entry in cfg.entries:
            _gemm_kernel(cfg, entry)
            done.append(f"{cfg.name}:gemm_{entry}")
    return done


def resource_usage(dtype: str | None = None) -> dict[str, dict]:
    """Per kernel: registers, local memory, shared memory and resident blocks per SM."""
    import cupy

    out = {}
    for cfg in _runnable(tile_configs(dtype).values()):
        for entry in cfg.entries:
            kern = _gemm_kernel(cfg, entry)
            attrs = kern.attributes
            try:
                blocks = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                    kern.kernel.ptr, cfg.threads, cfg.smem_bytes
                )
            except Exception:
                blocks = None
            out[f"{cfg.name}:gemm_{entry}"] = {
                "num_regs": attrs["num_regs"],
                "local_size_bytes": attrs["local_size_bytes"],
                "dynamic_smem_bytes": cfg.smem_bytes,
                "threads": cfg.threads,
                "blocks_per_sm": blocks,
            }
    return out


# ---- launching ----------------------------------------------------------------------------


def _operand(x, what: str):
    """(rows, cols, ld, ptr) of a 2-D cupy array whose rows are contiguous."""
    import cupy

    if not isinstance(x, cupy.ndarray):
        raise KernelError(f"Expected {what} to be a cupy.ndarray on the GPU. Got {type(x).__module__}.{type(x).__name__}.")
    if x.ndim != 2:
        raise ShapeError(f"Expected {what} to be 2-D. Got shape {x.shape}.")
    rows, cols = x.shape
    item = x.itemsize
    s0, s1 = x.strides
    if rows == 0 or cols == 0:
        return rows, cols, max(cols, 1), x.data.ptr
    if cols > 1 and s1 != item:
        raise KernelError(
            f"Expected {what}'s elements contiguous within a row (strides[1] == {item}). Got strides {x.strides}."
        )
    if rows > 1:
        if s0 <= 0 or s0 % item or s0 // item < cols:
            raise KernelError(
                f"Expected {what}'s row stride to be a positive multiple of {item} bytes covering its "
                f"{cols} columns. Got strides {x.strides}."
            )
        ld = s0 // item
    else:
        ld = max(cols, 1)
    return rows, cols, ld, x.data.ptr


def _vector(x, n: int, what: str):
    """``x`` as a pointer argument: a contiguous float64 cupy vector of ``n`` elements, or the
    null pointer for None."""
    import cupy
    import numpy as np

    if x is None:
        return np.uint64(0)
    if not isinstance(x, cupy.ndarray) or x.dtype != np.float64 or x.ndim != 1:
        raise KernelError(f"Expected {what} as a 1-D float64 cupy array. Got "
                          f"{type(x).__name__} {getattr(x, 'dtype', '')} {getattr(x, 'shape', '')}.")
    if x.size != n or (n > 1 and x.strides[0] != 8):
        raise ShapeError(f"Expected {what} of {n} contiguous elements. Got shape {x.shape}, "
                         f"strides {x.strides}.")
    return x


def _span(ptr: int, rows: int, cols: int, ld: int, item: int) -> tuple[int, int]:
    return ptr, ptr + ((rows - 1) * ld + cols) * item


def gemm(a, b, c, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, stream=None, *, config=None,
         split_k=None, checks=None, precision=None, split_edges=None, upper=False, presplit=None,
         workspace=None):
    """``c = alpha * op(a) @ op(b) + beta * c`` on the GPU with bigmm's kernels; returns ``c``.

    ``op(x)`` is ``x.T`` when ``trans_x`` (``a`` is then stored (K, M)).  a, b and c are 2-D
    cupy arrays of one dtype (float32 or float64) whose rows are contiguous; they may be views
    into larger buffers (any leading dimension, any alignment).  With ``beta == 0`` c is never
    read (NaN in c does not leak).  c must not overlap a or b.  The launch goes on ``stream``
    (a ``cupy.cuda.Stream``; the current stream when None) and is not synchronised.
    ``config`` (a table name or a TileConfig) overrides the table's choice of tile shape;
    ``split_k`` (1 = off) overrides the number of K splits chosen for products with few C tiles
    (the splits go to a workspace from cupy's memory pool, then one reduction kernel).
    ``checks`` (a :class:`bigmm.backends.base.GemmChecks`): the blocks also do these checksum
    updates on the tiles they load (kernels compiled with -DBIGMM_CHECKS; never split; the
    dtype's own precision only).
    ``precision`` (float32 operands only; None = "float32"): "float32" multiplies with IEEE
    float32 FMAs on the CUDA cores; "tf32x3" on the TF32 tensor cores in three passes over a
    big + small split of each operand, with float32's accuracy (its measured error against a
    float64 reference is bounded by tests/backends/test_tf32_kernels.py); "tf32" in one TF32
    pass (operands rounded to 11 significant bits: about 1e-4 relative error).  ``config`` must
    then be a config of that precision (``tile_configs(precision=...)``).  "tf32x3" with K below
    :data:`TF32X3_MIN_K` (and no config given) runs in float32.  On a compute capability 9.0
    GPU both TF32 precisions run on the warpgroup tensor cores (``gemm_wgmma.cu``, sm_90a), except
    "tf32x3" with K below :data:`TF32X3_WGMMA_MIN_K`, which stays on mma.sync.
    ``split_edges`` (None = when it pays, see :func:`edge_cut`): thin strips of C past the last
    whole tile row or column go to launches of their own (split along K), so that they do not
    cost a wave of full tiles.
    ``upper``: only the kernel's tiles of c on or above its diagonal are computed (the upper
    triangle of a Gram product; compiled with -DBIGMM_UPPER); the tiles wholly below it are
    left as they were. Never split along K or at the edges.
    ``presplit`` ("tf32x3" and "tf32" on sm_90a, None = when it pays: :func:`presplit_pays`):
    op(a) and op(b) are split into big and small parts (TF32: rounded) once, into a workspace of
    :func:`split_workspace_bytes` (``gemm_wgmma_split.cu``), before the product; ``workspace``
    (``workspace(nbytes)`` returns a device array of at least ``nbytes``, None = cupy's pool)
    gives that workspace. "tf32" NN and TT products (``presplit`` None) whose operand contiguous
    along its side of C (NN's b, TT's a) has 16-byte aligned rows read both operands as stored,
    through tensor maps that round them on the way in, or, where the other's rows are not
    aligned and it is the smaller with at most :data:`bigmm.planner.DIRECT_ROWS` rows, round
    that one ahead into the workspace (:mod:`.cuda_direct`, ``gemm_wgmma_direct.cu``).
    """
    import cupy

    launch = prepare_gemm(a, b, c, alpha, beta, trans_a, trans_b, config=config,
                          split_k=split_k, checks=checks, precision=precision,
                          split_edges=split_edges, upper=upper, presplit=presplit,
                          workspace=workspace)
    launch(stream if stream is not None else cupy.cuda.get_current_stream())
    return c


def prepare_gemm(a, b, c, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, *, config=None,
                 split_k=None, checks=None, precision=None, split_edges=None, upper=False,
                 presplit=None, workspace=None):
    """:func:`gemm` checked and set up once: ``launch(stream)`` issues it. The launch holds
    the views, so a caller issuing the same product over the same buffers again and again
    (the steps of a run reusing their slots) pays the checks, the kernel choice and the
    argument packing once."""
    import cupy
    import numpy as np

    rows_a, cols_a, lda, pa = _operand(a, "a")
    rows_b, cols_b, ldb, pb = _operand(b, "b")
    rows_c, cols_c, ldc, pc = _operand(c, "c")
    dtype = c.dtype.name
    if dtype not in _DTYPES or a.dtype != c.dtype or b.dtype != c.dtype:
        raise DtypeError(
            f"Expected a, b and c all float32 or all float64. Got {a.dtype}, {b.dtype}, {c.dtype}."
        )
    precision = parse_precision(dtype, precision)
    if checks is not None and precision != dtype:
        raise KernelError(f"Expected checks only with precision {dtype} (the checksum bounds are "
                          f"{dtype}'s). Got precision {precision!r}.")
    m, ka = (cols_a, rows_a) if trans_a else (rows_a, cols_a)
    kb, n = (cols_b, rows_b) if trans_b else (rows_b, cols_b)
    if ka != kb or (rows_c, cols_c) != (m, n):
        raise ShapeError(
            f"Expected op(a) (M, K) @ op(b) (K, N) -> c (M, N). Got op(a) {(m, ka)}, op(b) {(kb, n)}, "
            f"c {(rows_c, cols_c)} (trans_a={trans_a}, trans_b={trans_b})."
        )
    k = ka
    if max(m, n, k) > _INT32_MAX:
        raise ShapeError(f"Expected M, N, K below 2**31. Got {(m, n, k)}.")
    devices = {x.device.id for x in (a, b, c)}
    if len(devices) != 1:
        raise KernelError(f"Expected a, b and c on one device. Got devices {sorted(devices)}.")
    if checks is not None:
        check_args = (*(_vector(getattr(checks, f), size, f) for f, size in (
            ("col_w", k), ("col_wa", k), ("col", n), ("col_abs", n), ("row_w", k),
            ("row_wa", k), ("row", m), ("row_abs", m))),
            np.float64(checks.scale), np.int32(1 if checks.accumulate else 0))
    if m == 0 or n == 0:
        return lambda stream: None
    item = c.itemsize
    c_lo, c_hi = _span(pc, m, n, ldc, item)
    for name, (p, r, cl, ld) in (("a", (pa, rows_a, cols_a, lda)), ("b", (pb, rows_b, cols_b, ldb))):
        if r and cl:
            lo, hi = _span(p, r, cl, ld, item)
            if lo < c_hi and c_lo < hi:
                raise KernelError(f"Expected c not to overlap {name}. Got overlapping device memory.")

    if config is None:
        if precision == "tf32x3" and k < TF32X3_MIN_K:
            precision = dtype  # memory-bound anyway; the split's own error would show (see below)
        whole = precision in PARTS and checks is None and not upper and split_k in (None, 1)
        layout = (direct_layout(trans_a, trans_b, *((pa, lda) if trans_a else (pb, ldb)))
                  if whole and precision == "tf32" and presplit is None else None)
        s_aligned = layout is not None and tma_aligned(*((pb, ldb) if trans_a else (pa, lda)))
        if direct_pays(m, n, k, layout, s_aligned):
            return prepare_direct(a, b, c, alpha, beta, layout, m, n, k, (lda, ldb, ldc),
                                  workspace, s_aligned)
        if whole and (presplit if presplit is not None else presplit_pays(m, n, k)) and can_presplit(m, n, k):
            return prepare_presplit(a, b, c, alpha, beta, trans_a, trans_b, m, n, k,
                                    (lda, ldb, ldc), workspace, PARTS[precision])
        short = precision == "tf32x3" and k < TF32X3_WGMMA_MIN_K
        cfg = select_config(dtype, m, n, k, precision=precision, arch=None if short else "auto")
    elif isinstance(config, TileConfig):
        cfg = config
    else:
        try:
            cfg = load_table()["configs"][config]
        except KeyError:
            raise KernelError(f"Expected a tile config named in the kernel table. Got {config!r}.") from None
    if cfg.dtype != dtype:
        raise DtypeError(f"Expected tile config {cfg.name} to be {dtype}. Got {cfg.dtype}.")
    if cfg.precision != precision:
        raise KernelError(f"Expected a tile config of precision {precision}. Got {cfg.name}, "
                          f"which computes {cfg.precision}.")
    if cfg not in _checked:
        cfg.check()
        _checked.add(cfg)
    if cfg.arch is not None and cfg.arch != device_arch():
        raise KernelError(f"Expected a device of target {cfg.arch} for tile config {cfg.name}. Got "
                          f"{device_arch() or 'another target'}.")
    if split_edges is None:
        split_edges = split_k is None
    cut = edge_cut(cfg, m, n) if split_edges and checks is None and not upper else None
    if cut is not None:
        return _prepare_edges(a, b, c, alpha, beta, trans_a, trans_b, cfg, precision, *cut)

    vw = 16 // item

    def vec(ptr, ld):
        return ptr % 16 == 0 and ld % vw == 0

    np_t = np.dtype(dtype).type
    tiles = (-(-m // cfg.bm)) * (-(-n // cfg.bn))
    splits = _plan_split(cfg, tiles, k) if split_k is None else max(1, min(int(split_k), max(k, 1)))
    if checks is not None or upper:  # a split's workspace would be summed into every tile
        splits = 1
    k_chunk = -(-k // splits) if splits > 1 else k
    if splits > 1:
        k_chunk = -(-k_chunk // cfg.bk) * cfg.bk
        splits = -(-k // k_chunk)

    mode_a = "k" if not trans_a else ("v" if vec(pa, lda) else "s")
    mode_b = "k" if trans_b else ("v" if vec(pb, ldb) else "s")
    # K-major 16-byte copies of A (wgmma configs), for products in one piece along K: the split-K
    # launches (small, latency-bound C) keep the element copies measured with them on the GPU.
    if (mode_a == "k" and splits == 1 and vec(pa, lda) and k % vw == 0
            and "w" + mode_b in cfg.entries):
        mode_a = "w"
    kern = _gemm_kernel(cfg, mode_a + mode_b, checks is not None, bool(upper))
    if splits == 1:
        args = (
            np.int32(m), np.int32(n), np.int32(k), np_t(alpha), a, np.int64(lda), b, np.int64(ldb),
            np_t(beta), c, np.int64(ldc), np.int32(1 if vec(pc, ldc) else 0), np.int32(k), np.int64(0),
        ) + (check_args if checks is not None else ())

        def launch(stream) -> None:
            with stream:
                kern((tiles, 1, 1), (cfg.threads,), args, shared_mem=cfg.smem_bytes)

        return launch
    reduce = raw_kernel("splitk_reduce.cu", "splitk_reduce_f32" if item == 4 else "splitk_reduce_f64")
    blocks = min(-(-(m * n) // 256), 8 * sm_count())

    def launch_split(stream) -> None:
        # Split K: partial products into a workspace (alpha 1, beta 0), then one reduction.
        with stream:
            work = cupy.empty((splits, m, n), dtype=dtype)
            args = (
                np.int32(m), np.int32(n), np.int32(k), np_t(1), a, np.int64(lda), b, np.int64(ldb),
                np_t(0), work, np.int64(n), np.int32(1 if n % vw == 0 else 0), np.int32(k_chunk),
                np.int64(m * n),
            )
            kern((tiles, 1, splits), (cfg.threads,), args, shared_mem=cfg.smem_bytes)
            reduce((blocks,), (256,), (np.int32(m), np.int32(n), np.int32(splits), np_t(alpha),
                                       work, np.int64(m * n), np_t(beta), c, np.int64(ldc)))

    return launch_split


def edge_cut(config: TileConfig, m: int, n: int) -> tuple[int, int] | None:
    """(mm, nn): the product's C goes as [0, mm) x [0, nn) in whole tiles, plus the strips past
    them, when a strip is thin (at most a quarter of a tile: 4097 = 32 * 128 + 1) and cutting it
    off saves a wave of resident blocks; None when one launch does better."""
    bm, bn = config.bm, config.bn
    mm = m - m % bm if m > bm and 0 < m % bm <= bm // 4 else m
    nn = n - n % bn if n > bn and 0 < n % bn <= bn // 4 else n
    if (mm, nn) == (m, n):
        return None
    resident = sm_count() * max(1, config.min_blocks)

    def waves(rows: int, cols: int) -> int:
        return -(-((-(-rows // bm)) * (-(-cols // bn))) // resident)

    return (mm, nn) if waves(mm, nn) < waves(m, n) else None


def _prepare_edges(a, b, c, alpha, beta, trans_a, trans_b, cfg, precision, mm, nn):
    """The launches of :func:`edge_cut`'s split: whole tiles with ``cfg``, then the right and
    bottom strips, each with its own config and K splits."""
    m, n = c.shape

    def rows(x, trans, r0, r1):  # op(x)[r0:r1, :]
        return x[:, r0:r1] if trans else x[r0:r1]

    def cols(x, trans, c0, c1):  # op(x)[:, c0:c1]
        return x[c0:c1] if trans else x[:, c0:c1]

    parts = [prepare_gemm(rows(a, trans_a, 0, mm), cols(b, trans_b, 0, nn), c[:mm, :nn], alpha,
                          beta, trans_a, trans_b, config=cfg, precision=precision,
                          split_edges=False)]
    if nn < n:
        parts.append(prepare_gemm(a, cols(b, trans_b, nn, n), c[:, nn:], alpha, beta, trans_a,
                                  trans_b, precision=precision, split_edges=False))
    if mm < m:
        parts.append(prepare_gemm(rows(a, trans_a, mm, m), cols(b, trans_b, 0, nn), c[mm:, :nn],
                                  alpha, beta, trans_a, trans_b, precision=precision,
                                  split_edges=False))

    def launch(stream) -> None:
        for part in parts:
            part(stream)

    return launch


def split_count(config: TileConfig, m: int, n: int, k: int) -> int:
    """How many K splits gemm() uses for this shape and config (1: none)."""
    return _plan_split(config, (-(-m // config.bm)) * (-(-n // config.bn)), k)


def _plan_split(cfg: TileConfig, tiles: int, k: int) -> int:
    """Split K when the C tiles fill at most half of the GPU's resident blocks: as many splits
    as keep every block in one wave, each split at least 256 deep.  Shorter sums per split
    also keep the rounding error of long, narrow products (large K, small M and N) near
    cuBLAS's."""
    resident = sm_count() * max(1, cfg.min_blocks)
    if 2 * tiles > resident or k <= 256:
        return 1
    return max(1, min(resident // tiles, -(-k // 256)))


def baseline_gemm(a, b, c, alpha=1.0, beta=0.0, stream=None):
    """Kernel 01 (the textbook 16x16 tiled SGEMM), float32 NN only: the progression's baseline."""
    import cupy
    import numpy as np

    rows_a, k, lda, pa = _operand(a, "a")
    kb, n, ldb, pb = _operand(b, "b")
    m, nc, ldc, pc = _operand(c, "c")
    if any(x.dtype != np.float32 for x in (a, b, c)):
        raise DtypeError(f"Expected float32 operands for kernel 01. Got {a.dtype}, {b.dtype}, {c.dtype}.")
    if k != kb or (m, nc) != (rows_a, n):
        raise ShapeError(f"Expected (M, K) @ (K, N) -> (M, N). Got {a.shape} @ {b.shape} -> {c.shape}.")
    kern = raw_kernel("sgemm_01_naive_tiled.cu", "sgemm_01_naive_tiled")
    args = (np.int32(m), np.int32(n), np.int32(k), np.float32(alpha), a, np.int64(lda),
            b, np.int64(ldb), np.float32(beta), c, np.int64(ldc))
    with (stream if stream is not None else cupy.cuda.get_current_stream()):
        kern(((n + 15) // 16, (m + 15) // 16), (16, 16), args)
    return c
