"""bigmm's own CUDA GEMM kernels: loading, compiling, choosing a tile shape and launching.

The sources live in the top-level ``kernels/`` folder (shipped in the wheel as
``bigmm/kernels``).  Each (dtype, tile shape) is one ``cupy.RawModule`` compiled by NVRTC with
the tile parameters as ``-D`` macros; it holds nine ``extern "C"`` entry points, one per pair of
operand load modes, so no C++ template names cross into Python.  Modules are compiled once per
process and device; cupy keeps the compiled binaries in its disk cache (``CUPY_CACHE_DIR``,
default ``~/.cupy/kernel_cache``), keyed by the full source text and options.

The tile shape for a product comes from ``kernel_table.json`` beside this module, written by
``scripts/autotune_kernels.py`` on a GPU.

float32 products have three precisions (``precision=`` of :func:`gemm`): "float32" (IEEE float32
FMAs on the CUDA cores, ``gemm_regblock.cu``), "tf32x3" (the TF32 tensor cores, three passes
over a big + small split of every operand: float32's accuracy, ``gemm_tf32.cu``) and "tf32"
(one TF32 pass: about 1e-4 relative error). Each has its own rules in the table. On Hopper
(compute capability 9.0) the TF32 precisions run on the warpgroup tensor cores
(``gemm_wgmma.cu``, compiled for sm_90a) where the table has rules for "<precision>@sm_90a";
elsewhere, and for configs without ``wgmma``, on ``mma.sync`` (``gemm_tf32.cu``).

cupy is imported inside functions only: importing this module needs no GPU.
"""

from __future__ import annotations

import functools
import json
import threading
from dataclasses import dataclass
from pathlib import Path

from ..errors import DtypeError, KernelError, ShapeError
from ..units import DTYPES, WIDE_DTYPES

_TABLE_PATH = Path(__file__).with_name("kernel_table.json")
_FAMILY_SOURCE = "gemm_regblock.cu"
_TF32_SOURCE = "gemm_tf32.cu"
_WGMMA_SOURCE = "gemm_wgmma.cu"
_HEADER = "common.cuh"
_COMPILE_OPTIONS = ("-std=c++17",)
_DTYPES = {name: DTYPES[name] for name in WIDE_DTYPES}  # the kernels' dtypes
_INT32_MAX = 2**31 - 1
#: "tf32x3" products with K below this run on the CUDA cores in float32: a sum of fewer terms has
#: too little float32 rounding for the 3xTF32 split's own error (up to 2^-23 per operand, the
#: dropped small*small) to stay within 2x of it (tests/backends/test_tf32_split.py).
TF32X3_MIN_K = 16
#: "tf32x3" products with K below this run on mma.sync (gemm_tf32.cu) on Hopper too: the wgmma
#: kernel's k-tile sums of 32 products (truncated once more than mma.sync's k-steps of 8) measured
#: 2.6x SGEMM's error at K = 16 on the contract's "wide" operands; short sums are memory-bound.
TF32X3_WGMMA_MIN_K = 64
#: Precisions of :func:`gemm` per dtype (None = the dtype's own: "float32" or "float64").
PRECISIONS = {"float32": ("float32", "tf32x3", "tf32"), "float64": ("float64",)}

# (A mode, B mode) -> entry point.  Modes: k = A/B contiguous along K (transposed on load),
# v = contiguous along M/N and 16-byte aligned, s = contiguous along M/N, unaligned; w = A
# contiguous along K, 16-byte aligned rows and K % 4 == 0, kept K-major (wgmma configs only).
_ENTRIES = ("kv", "ks", "kk", "vv", "vs", "sv", "ss", "vk", "sk")
_W_ENTRIES = ("wv", "ws", "wk")
_LOADERS = {"k": "LOAD_K", "v": "LOAD_V", "s": "LOAD_S", "w": "LOAD_W"}


@dataclass(frozen=True)
class TileConfig:
    """One instantiation of the register-blocked family (see kernels/gemm_regblock.cu)."""

    name: str
    dtype: str
    bm: int
    bn: int
    bk: int
    wm: int
    wn: int
    tm: int
    tn: int
    stages: int
    min_blocks: int = 1
    pad_bytes: int = 16
    dmma: bool = False  # float64 on the FP64 tensor cores (tm, tn unused)
    tf32: int = 0  # TF32 tensor-core passes (gemm_tf32.cu; tm, tn unused): 3 = 3xTF32, 1 = TF32
    tf32_fadd: bool = True  # 3xTF32: each k-step's products onto zero, added with FADD
    wgmma: bool = False  # TF32 on Hopper's warpgroup tensor cores (gemm_wgmma.cu, sm_90a only)
    acc_tiles: int = 2  # wgmma 3xTF32: register tiles per warpgroup (2: acc, tmp; 3: + cor)

    @property
    def source(self) -> str:
        if self.wgmma:
            return _WGMMA_SOURCE
        return _TF32_SOURCE if self.tf32 else _FAMILY_SOURCE

    @property
    def arch(self) -> str | None:
        """The GPU target the config needs ("sm_90a": compute capability 9.0), None for any."""
        return "sm_90a" if self.wgmma else None

    @property
    def entries(self) -> tuple[str, ...]:
        """The entry points (A and B load modes) the config compiles.  wgmma 3xTF32 with three
        register tiles leaves wk out (it spills: its NT products use kk)."""
        if not self.wgmma:
            return _ENTRIES
        return _ENTRIES + tuple(e for e in _W_ENTRIES if not (self.acc_tiles == 3 and self.tf32 == 3
                                                             and e == "wk"))

    def compile_options(self) -> tuple[str, ...]:
        """NVRTC options beyond the tile macros: the target of an arch-specific config."""
        return (f"-arch={self.arch}",) if self.arch else ()

    @property
    def precision(self) -> str:
        """The precision this config computes: its dtype's own, "tf32x3" or "tf32"."""
        return {0: self.dtype, 1: "tf32", 3: "tf32x3"}.get(self.tf32, f"tf32 x{self.tf32}")

    @property
    def itemsize(self) -> int:
        return _DTYPES[self.dtype]

    @property
    def threads(self) -> int:
        if self.wgmma:  # one warpgroup (128 threads) per wm x wn tile
            return (self.bm // self.wm) * (self.bn // self.wn) * 128
        return (self.bm // self.wm) * (self.bn // self.wn) * 32

    @property
    def smem_bytes(self) -> int:
        pad = self.pad_bytes // self.itemsize
        raw = self.stages * self.bk * (self.bm + self.bn + 2 * pad) * self.itemsize
        if self.wgmma:  # raw A tiles of either layout (S[k][m] or S[m][k], rows of bk + 4), plus
            # two split B tiles (tf32 and, for 3xTF32, small parts) at a 1 KB boundary
            raw = self.stages * (self.bm * (self.bk + 4) + self.bk * (self.bn + pad)) * 4
            return raw + 2 * (2 if self.tf32 == 3 else 1) * self.bn * self.bk * 4 + 1024
        return raw

    def defines(self) -> tuple[str, ...]:
        ctype = "float" if self.dtype == "float32" else "double"
        values = {
            "DTYPE": ctype, "BM": self.bm, "BN": self.bn, "BK": self.bk, "WM": self.wm,
            "WN": self.wn, "TM": self.tm, "TN": self.tn, "STAGES": self.stages,
            "PAD_BYTES": self.pad_bytes, "MIN_BLOCKS": self.min_blocks, "DMMA": int(self.dmma),
        }
        if self.tf32:
            values["TF32_PASSES"] = self.tf32
            values["TF32_ACC"] = int(self.tf32_fadd)
        if self.wgmma:  # the warpgroup tile is fixed by the kernel: no warp or thread tiles
            for key in ("WM", "WN", "TM", "TN", "DMMA"):
                values.pop(key, None)
            values["TF32_ACC"] = self.acc_tiles
        return tuple(f"-DBIGMM_{k}={v}" for k, v in values.items())

    def check(self) -> None:
        """Raise KernelError when the parameters break the family's static rules."""
        if self.dtype not in _DTYPES:
            raise KernelError(f"Expected dtype float32 or float64 in tile config {self.name}. Got {self.dtype}.")
        vw = 16 // self.itemsize
        nt = self.threads
        rules = [
            (self.bm % self.wm == 0 and self.bn % self.wn == 0, "warp tile divides block tile"),
            (self.stages >= 2 and self.bk % 8 == 0, "stages >= 2 and bk % 8 == 0"),
            (all(r % (nt // 8) == 0 for r in (self.bm, self.bn)), "rows divisible by threads/8"),
            (all(nt % (r // vw) == 0 and self.bk % (nt // (r // vw)) == 0
                 for r in (self.bm, self.bn)), "16-byte copies tile the block"),
            (self.pad_bytes % 16 == 0, "pad keeps rows 16-byte aligned"),
        ]
        pad = self.pad_bytes // self.itemsize
        if self.wgmma:
            rules += [
                (self.dtype == "float32" and self.tf32 in (1, 3) and not self.dmma,
                 "wgmma is TF32 or 3xTF32 on float32"),
                ((self.bm, self.bn, self.bk, self.wm, self.wn) == (128, 128, 32, 64, 128),
                 "wgmma tile 128x128x32 of two 64x128 warpgroup tiles"),
                (self.stages >= 3, "stages >= 3"),
                (self.acc_tiles in (2, 3), "2 or 3 register tiles per warpgroup"),
                (self.pad_bytes % 16 == 0 and (self.bm + pad) % 16 == 8, "A row stride 8 mod 16"),
            ]
        elif self.tf32:
            rules += [
                (self.dtype == "float32" and not self.dmma, "TF32 is float32"),
                (self.tf32 in (1, 3), "1 (TF32) or 3 (3xTF32) passes"),
                (self.wm % 16 == 0 and self.wn % 16 == 0, "warp tile of whole 16x16 mma pairs"),
                (self.bk % 16 == 0, "bk of whole pairs of 8-deep k-steps"),
                (all((r + pad) % 16 == 8 for r in (self.bm, self.bn)), "TF32 row stride 8 mod 16"),
            ]
        elif self.dmma:
            rules += [
                (self.dtype == "float64", "DMMA is float64"),
                (self.wm % 16 == 0 and self.wn % 8 == 0, "warp tile of whole 16x8 DMMA tiles"),
                (all((r + pad) % 16 == 4 for r in (self.bm, self.bn)), "DMMA row stride 4 mod 16"),
            ]
        else:
            rules += [
                ((self.wm // self.tm) * (self.wn // self.tn) == 32, "32 threads per warp tile"),
                (self.tm % vw == 0 and self.tn % vw == 0, "thread tile in 16-byte vectors"),
            ]
        for ok, rule in rules:
            if not ok:
                raise KernelError(f"Expected tile config {self.name} to satisfy '{rule}'. Got {self}.")

    @classmethod
    def from_dict(cls, name: str, d: dict) -> "TileConfig":
        return cls(name=name, **{k: d[k] for k in d if k in cls.__dataclass_fields__ and k != "name"})

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "name"}


def kernel_dir() -> Path:
    """The folder holding the CUDA sources: inside the installed package, else the source tree's."""
    import bigmm

    pkg = Path(bigmm.__file__).resolve().parent
    for candidate in (pkg / "kernels", pkg.parent / "kernels"):
        if (candidate / _FAMILY_SOURCE).is_file():
            return candidate
    raise KernelError(f"Expected the CUDA sources in {pkg / 'kernels'} or {pkg.parent / 'kernels'}. Got neither.")


def kernel_source(filename: str) -> str:
    """A kernel file's text with ``#include "common.cuh"`` inlined, so that cupy's disk cache
    (keyed by the source text) sees every change to the header."""
    folder = kernel_dir()
    try:
        text = (folder / filename).read_text()
        header = (folder / _HEADER).read_text()
    except OSError as exc:
        raise KernelError(f"Expected a readable kernel source {folder / filename}. Got {exc}.") from exc
    return text.replace(f'#include "{_HEADER}"', header)


# ---- the tile table ---------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def load_table(path: str | None = None) -> dict:
    """The parsed kernel table (``kernel_table.json`` unless ``path`` names another)."""
    p = Path(path) if path else _TABLE_PATH
    try:
        table = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise KernelError(f"Expected a readable JSON kernel table at {p}. Got {exc}.") from exc
    configs = {n: TileConfig.from_dict(n, d) for n, d in table["configs"].items()}
    for cfg in configs.values():
        cfg.check()
    table = dict(table)
    table["configs"] = configs
    return table


def tile_configs(dtype: str | None = None, table: str | None = None, *,
                 precision: str | None = None) -> dict[str, TileConfig]:
    """Every tile config in the table (optionally of one dtype, or of the configs that compute
    one precision: "float32", "tf32x3", "tf32", "float64"), by name."""
    configs = load_table(table)["configs"]
    return {n: c for n, c in configs.items() if (dtype is None or c.dtype == dtype)
            and (precision is None or c.precision == precision)}


def parse_precision(dtype: str, precision: str | None) -> str:
    """The precision a product of ``dtype`` runs in: ``precision``, or the dtype's own."""
    allowed = PRECISIONS.get(dtype)
    if allowed is None:
        raise DtypeError(f"Expected a dtype with kernels (float32, float64). Got {dtype}.")
    if precision is None:
        return dtype
    if precision not in allowed:
        raise KernelError(f"Expected precision None or one of {allowed} for {dtype}. Got {precision!r}.")
    return precision


def device_arch(device: int | None = None) -> str | None:
    """The architecture-specific target of the current (or given) GPU that kernels may need:
    "sm_90a" on compute capability 9.0 (Hopper: wgmma), None elsewhere or without a GPU."""
    try:
        return _device_arch(_device_id() if device is None else device)
    except Exception:  # no cupy, no driver, no device
        return None


@functools.lru_cache(maxsize=None)
def _device_arch(device: int) -> str | None:
    import cupy

    cc = cupy.cuda.Device(device).compute_capability
    return "sm_90a" if cc == "90" else None


def select_config(dtype: str, m: int, n: int, k: int, table: str | None = None, *,
                  precision: str | None = None, arch: str | None = "auto") -> TileConfig:
    """The table's tile config for a product of this dtype, precision and shape: the first rule
    whose ``max_mn`` bounds m * n (a rule without one matches everything).  ``table``: another
    table file (the autotuner's output) instead of the packaged one.  ``arch``: the GPU target
    ("sm_90a", None; "auto" = the current device's, :func:`device_arch`): its rules
    ("<precision>@<arch>") come first where the table has them."""
    precision = parse_precision(dtype, precision)
    table = load_table(table)
    if arch == "auto":
        arch = device_arch()
    rules = (table["select"].get(f"{precision}@{arch}") if arch else None) or \
        table["select"].get(precision)
    if not rules:
        raise KernelError(f"Expected rules for precision {precision} in the kernel table. Got none.")
    for rule in rules:
        if rule.get("max_mn") is None or m * n <= rule["max_mn"]:
            return table["configs"][rule["config"]]
    return table["configs"][rules[-1]["config"]]


# ---- compiling ----------------------------------------------------------------------------

_lock = threading.Lock()
_kernels: dict[tuple, object] = {}
_modules: dict[tuple, object] = {}
_smem_granted: dict[tuple, int] = {}


def _device_id() -> int:
    import cupy

    return cupy.cuda.runtime.getDevice()


def _module(filename: str, options: tuple[str, ...]):
    key = (filename, options, _device_id())
    module = _modules.get(key)
    if module is None:
        import cupy

        if any(o.startswith("-arch=") for o in options):
            module = _arch_module(kernel_source(filename), _COMPILE_OPTIONS + options)
        else:
            module = cupy.RawModule(code=kernel_source(filename), options=_COMPILE_OPTIONS + options)
        _modules[key] = module
    return module


def _arch_module(source: str, options: tuple[str, ...]):
    """A module for an explicit target (``-arch=sm_90a`` in ``options``).  cupy appends its own
    ``-arch=sm_XY`` after the caller's options; NVRTC honours the arch-specific one when both
    are given.  Should that compile fail, NVRTC is called directly with only ours, the binary
    cached beside cupy's (keyed by source, options and NVRTC version)."""
    import cupy

    module = cupy.RawModule(code=source, options=options)
    try:
        module.compile()
        return module
    except Exception as first:  # noqa: BLE001 - retried below, reported if that fails too
        first_error = first
    import hashlib
    import os

    from cupy.cuda import nvrtc

    opts = tuple(options) + ("-ftz=true",)
    key = hashlib.sha256("\0".join((source, *opts, str(nvrtc.getVersion()))).encode()).hexdigest()
    cache = Path(os.environ.get("CUPY_CACHE_DIR") or Path.home() / ".cupy" / "kernel_cache")
    path = cache / f"bigmm_{key[:40]}.cubin"
    if not path.is_file():
        prog = nvrtc.createProgram(source, "bigmm_kernel.cu", (), ())
        try:
            try:
                nvrtc.compileProgram(prog, list(opts))
            except Exception as exc:
                raise KernelError(f"Expected NVRTC to compile with {opts}. Got {exc}: "
                                  f"{nvrtc.getProgramLog(prog)} (through cupy: {first_error})") from exc
            cubin = nvrtc.getCUBIN(prog)
        finally:
            nvrtc.destroyProgram(prog)
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(cubin)
        os.replace(tmp, path)
    return cupy.RawModule(path=str(path))


def raw_kernel(filename: str, entry: str, options: tuple[str, ...] = ()):
    """A compiled ``cupy.RawKernel`` for ``entry`` of ``kernels/filename`` on the current device
    (compiled once per process and device; binaries cached on disk by cupy)."""
    key = (filename, entry, options, _device_id())
    kern = _kernels.get(key)
    if kern is not None:
        return kern
    with _lock:
        kern = _kernels.get(key)
        if kern is None:
            try:
                kern = _module(filename, options).get_function(entry)
                kern.kernel  # compile (or load from the disk cache) now, not at first launch
            except Exception as exc:  # cupy raises CompileException / CUDADriverError
                raise KernelError(f"Expected {filename}:{entry} with {options} to compile. Got {exc}.") from exc
            _kernels[key] = kern
    return kern


def _gemm_kernel(config: TileConfig, entry: str, checks: bool = False):
    options = config.defines() + config.compile_options() + (
        "-DBIGMM_ONLY=1", f"-DBIGMM_ONLY_NAME=gemm_{entry}",
        f"-DBIGMM_ONLY_A={_LOADERS[entry[0]]}", f"-DBIGMM_ONLY_B={_LOADERS[entry[1]]}")
    if checks:
        options += ("-DBIGMM_CHECKS=1",)
    kern = raw_kernel(config.source, "gemm_" + entry, options)
    key = (options, _device_id())
    if _smem_granted.get(key) != config.smem_bytes:
        try:
            kern.max_dynamic_shared_size_bytes = config.smem_bytes
        except Exception as exc:
            raise KernelError(
                f"Expected the device to grant {config.smem_bytes} bytes of shared memory to "
                f"tile config {config.name}. Got {exc}."
            ) from exc
        _smem_granted[key] = config.smem_bytes
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


def _span(ptr: int, rows: int, cols: int, ld: int, item: int) -> tuple[int, int]:
    return ptr, ptr + ((rows - 1) * ld + cols) * item


def gemm(a, b, c, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, stream=None, *, config=None,
         split_k=None, checks=None, precision=None, split_edges=None):
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
    """
    import cupy

    launch = prepare_gemm(a, b, c, alpha, beta, trans_a, trans_b, config=config,
                          split_k=split_k, checks=checks, precision=precision,
                          split_edges=split_edges)
    launch(stream if stream is not None else cupy.cuda.get_current_stream())
    return c


def prepare_gemm(a, b, c, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, *, config=None,
                 split_k=None, checks=None, precision=None, split_edges=None):
    """:func:`gemm` checked and set up once: ``launch(stream)`` issues it. The launch holds
    the views, so a caller issuing the same product over the same buffers again and again
    (the steps of a run reusing their slots) pays the checks, the kernel choice and the
    argument packing once."""
    import cupy
    import numpy as np

    rows_a, cols_a, lda, pa = _operand(a, "a")
    rows_b, cols_b, ldb, pb = _operand(b, "b")
    rows_c, cols_c, ldc, pc = _operand(c, "c")
    dtypes = {str(x.dtype) for x in (a, b, c)}
    if len(dtypes) != 1 or next(iter(dtypes)) not in _DTYPES:
        raise DtypeError(
            f"Expected a, b and c all float32 or all float64. Got {a.dtype}, {b.dtype}, {c.dtype}."
        )
    dtype = str(c.dtype)
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
    cfg.check()
    if cfg.arch is not None and cfg.arch != device_arch():
        raise KernelError(f"Expected a device of target {cfg.arch} for tile config {cfg.name}. Got "
                          f"{device_arch() or 'another target'}.")
    if split_edges is None:
        split_edges = split_k is None
    cut = edge_cut(cfg, m, n) if split_edges and checks is None else None
    if cut is not None:
        return _prepare_edges(a, b, c, alpha, beta, trans_a, trans_b, cfg, precision, *cut)

    vw = 16 // item

    def vec(ptr, ld):
        return ptr % 16 == 0 and ld % vw == 0

    np_t = np.dtype(dtype).type
    tiles = (-(-m // cfg.bm)) * (-(-n // cfg.bn))
    splits = _plan_split(cfg, tiles, k) if split_k is None else max(1, min(int(split_k), max(k, 1)))
    if checks is not None:
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
    kern = _gemm_kernel(cfg, mode_a + mode_b, checks is not None)
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
    blocks = min(-(-(m * n) // 256), 8 * _sm_count())

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
    resident = _sm_count() * max(1, config.min_blocks)

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


@functools.lru_cache(maxsize=None)
def sm_count_of(device: int) -> int:
    """The number of SMs of ``device``."""
    import cupy

    return cupy.cuda.Device(device).attributes["MultiProcessorCount"]


def _sm_count() -> int:
    return sm_count_of(_device_id())


def split_count(config: TileConfig, m: int, n: int, k: int) -> int:
    """How many K splits gemm() uses for this shape and config (1: none)."""
    return _plan_split(config, (-(-m // config.bm)) * (-(-n // config.bn)), k)


def _plan_split(cfg: TileConfig, tiles: int, k: int) -> int:
    """Split K when the C tiles fill at most half of the GPU's resident blocks: as many splits
    as keep every block in one wave, each split at least 256 deep.  Shorter sums per split
    also keep the rounding error of long, narrow products (large K, small M and N) near
    cuBLAS's."""
    resident = _sm_count() * max(1, cfg.min_blocks)
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



# ---- checksums (ABFT) ---------------------------------------------------------------------

_CHECKSUM_SOURCE = "abft_checksum.cu"
_SUMS_TILE = 32  # columns per block and rows per shared-memory tile (kernels/abft_checksum.cu)
_SUMS_ROWS = 8  # thread rows per block (generic, strided), warps per block (contig)
_SUMS_OUTS = 4  # columns per warp (contig)
_SUMS_UNROLL = 4  # row loads in flight per thread (strided)
_SUMS_BLOCKS_PER_SM = 4  # the fast kernels' __launch_bounds__ minimum
#: Kernels of weighted_sums: "contig" (summed axis contiguous, 16-byte vectors along it),
#: "strided" (columns contiguous, 16-byte vectors across them), "generic" (any strides).
SUMS_PATHS = ("contig", "strided", "generic")


def sums_path(rows: int, cols: int, sr: int, sc: int, itemsize: int, ptr: int) -> str:
    """The kernel weighted_sums uses for a rows x cols view with element strides (sr, sc) at
    address ``ptr``: a fast path when the 16-byte vectors it reads are aligned, else
    "generic"."""
    def aligned(stride: int, count: int) -> bool:  # every line of the view starts aligned
        return count <= 1 or (stride * itemsize) % 16 == 0

    if ptr % 16:
        return "generic"
    if sr == 1 and (sc != 1 or cols == 1) and aligned(sc, cols):
        return "contig"
    if sc == 1 and aligned(sr, rows):
        return "strided"
    return "generic"


def _sums_launch(path: str, rows: int, cols: int, itemsize: int) -> tuple[tuple, tuple, int]:
    """(grid, block, rows_per_block) of one weighted_sums kernel. The fast paths fill the
    GPU in one wave (their __launch_bounds__ blocks per SM): blocks over the columns first,
    then over the rows while there are SMs left."""
    target = _SUMS_BLOCKS_PER_SM * _sm_count()
    vec = 16 // itemsize
    if path == "contig":  # rows_per_block a multiple of the vector: every chunk aligned
        gx = min(-(-cols // (_SUMS_ROWS * _SUMS_OUTS)), target)  # warps stride over columns
        line = 32 * vec  # one vector per lane
        gy = max(1, min(target // gx, -(-rows // line)))
        per_block = -(-rows // (gy * line)) * line
        return (gx, -(-rows // per_block), 1), (32 * _SUMS_ROWS, 1, 1), per_block
    if path == "strided":
        gx = -(-cols // (_SUMS_TILE * vec))
        gy = max(1, min(target // gx, -(-rows // (_SUMS_ROWS * _SUMS_UNROLL))))
        per_block = -(-rows // gy)
        return (gx, -(-rows // per_block), 1), (_SUMS_TILE, _SUMS_ROWS, 1), per_block
    gx = -(-cols // _SUMS_TILE)
    tiles_i = -(-rows // _SUMS_TILE)
    gy = max(1, min(tiles_i, (8 * _sm_count()) // gx))  # about 8 blocks per SM in all
    per_block = -(-tiles_i // gy) * _SUMS_TILE
    return (gx, -(-rows // per_block), 1), (_SUMS_TILE, _SUMS_ROWS, 1), per_block


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


def weighted_sums(x, out, out_abs=None, *, weights=None, abs_weights=None, scale=1.0,
                  accumulate=False, stream=None, path: str | None = None) -> str:
    """Sums along axis 0 of the 2-D cupy view ``x`` (float32 or float64, any strides: pass
    ``x.T`` for row sums), accumulated in float64 on ``stream``:
    ``out[j] (+)= scale * sum_i w[i] x[i, j]`` and ``out_abs[j] (+)= |scale| * sum_i wa[i]
    |x[i, j]|``. ``weights`` (w) default to ones, ``abs_weights`` (wa) to ``|w|``; without
    ``accumulate`` the outputs are overwritten. Not synchronised. ``path`` forces a kernel
    (:data:`SUMS_PATHS`; a fast one only where :func:`sums_path` allows it, "generic"
    always); returns the one used."""
    import cupy

    launch, chosen = prepare_sums(x, out, out_abs, weights=weights, abs_weights=abs_weights,
                                  scale=scale, accumulate=accumulate, path=path)
    launch(stream if stream is not None else cupy.cuda.get_current_stream())
    return chosen


def prepare_sums(x, out, out_abs=None, *, weights=None, abs_weights=None, scale=1.0,
                 accumulate=False, path: str | None = None):
    """(launch, path): :func:`weighted_sums` checked and set up once, ``launch(stream)``
    issuing it. The launch holds the views, so a caller issuing the same sums over the same
    buffers again and again (the checks of every step of a run) pays the checks and the
    kernel choice once."""
    import cupy
    import numpy as np

    if not isinstance(x, cupy.ndarray) or x.ndim != 2 or str(x.dtype) not in _DTYPES:
        raise KernelError(f"Expected x as a 2-D float32 or float64 cupy array. Got "
                          f"{type(x).__name__} {getattr(x, 'dtype', '')} {getattr(x, 'shape', '')}.")
    rows, cols = x.shape
    if any(s % x.itemsize for s in x.strides):
        raise ShapeError(f"Expected x's strides in whole elements. Got {x.strides}.")
    sr, sc = (s // x.itemsize for s in x.strides)
    chosen = sums_path(rows, cols, sr, sc, x.itemsize, x.data.ptr)
    if path is not None:
        if path not in SUMS_PATHS or path not in (chosen, "generic"):
            raise KernelError(f"Expected path to be None, 'generic' or {chosen!r} for this view "
                              f"(strides {x.strides}). Got {path!r}.")
        chosen = path
    args = [_vector(out, cols, "out"), _vector(out_abs, cols, "out_abs"),
            _vector(weights, rows, "weights"), _vector(abs_weights, rows, "abs_weights")]
    zero = [(v.data.ptr, v.nbytes) for v in (out, out_abs)
            if not accumulate and v is not None and v.size]
    memset = cupy.cuda.runtime.memsetAsync
    kern = None
    if rows and cols:
        suffix = "f32" if x.itemsize == 4 else "f64"
        name = "abft_sums_" + (suffix if chosen == "generic" else f"{chosen}_{suffix}")
        grid, block, per_block = _sums_launch(chosen, rows, cols, x.itemsize)
        kern = raw_kernel(_CHECKSUM_SOURCE, name)
        kargs = (np.int32(rows), np.int32(cols), x, np.int64(sr), np.int64(sc), args[2],
                 args[3], np.float64(scale), np.int32(per_block), args[0], args[1])

    def launch(stream) -> None:
        with stream:
            for ptr, nbytes in zero:
                memset(ptr, 0, nbytes, stream.ptr)
            if kern is not None:
                kern(grid, block, kargs)

    return launch, chosen


def compare_sums(expected, magnitude, actual, rel_tol: float, floor: float, result,
                 stream=None) -> None:
    """``result[0] = max_j |expected_j - actual_j| / (rel_tol * magnitude_j + floor)`` and
    ``result[1]`` = that j, on ``stream`` (float64 cupy vectors; ``result`` holds 2)."""
    import cupy

    prepare_compare(expected, magnitude, actual, rel_tol, floor, result)(
        stream if stream is not None else cupy.cuda.get_current_stream())


def prepare_compare(expected, magnitude, actual, rel_tol: float, floor: float, result,
                    limit: float = float("inf")):
    """:func:`compare_sums` checked and set up once: ``launch(stream)`` issues it."""
    import numpy as np

    n = expected.size
    args = [_vector(v, n, what) for v, what in ((expected, "expected"), (magnitude, "magnitude"),
                                                (actual, "actual"))]
    res = _vector(result, 2, "result")
    kern = raw_kernel(_CHECKSUM_SOURCE, "abft_compare")
    kargs = (np.int32(n), *args, np.float64(rel_tol), np.float64(floor), np.float64(limit),
             res)

    def launch(stream) -> None:
        with stream:
            kern((1,), (256,), kargs)

    return launch
