"""The tile configs of bigmm's CUDA GEMM families and the table that chooses one per product.

A :class:`TileConfig` names one instantiation of a family (dtype, precision, block and warp
tiles, pipeline depth, target); ``kernel_table.json`` beside this module (written by
``scripts/autotune_kernels.py`` on a GPU) holds the configs and, per precision (and per GPU
target, "<precision>@sm_90a"), the rules that pick one by the product's M*N. cupy is imported
inside functions only (the device's target).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import DtypeError, KernelError
from ..units import DTYPES, WIDE_DTYPES

_TABLE_PATH = Path(__file__).with_name("kernel_table.json")
_FAMILY_SOURCE = "gemm_regblock.cu"
_TF32_SOURCE = "gemm_tf32.cu"
_WGMMA_SOURCE = "gemm_wgmma.cu"
_DTYPES = {name: DTYPES[name] for name in WIDE_DTYPES}  # the kernels' dtypes
#: "tf32x3" products with K below this run on the CUDA cores in float32: a sum of fewer terms has
#: too little float32 rounding for the 3xTF32 split's own error (up to 2^-23 per operand, the
#: dropped small*small) to stay within 2x of it on every draw (tests/backends/test_tf32_split.py:
#: at K = 16 some draws of the "wide" operands reach 2.7x emulated, 3.5x on an H100).
TF32X3_MIN_K = 64
#: "tf32x3" products with K below this run on mma.sync (gemm_tf32.cu) on Hopper too: the wgmma
#: kernel's k-tile sums of 32 products (truncated once more than mma.sync's k-steps of 8) measured
#: 2.6x SGEMM's error at K = 16 on the contract's "wide" operands; short sums are memory-bound.
TF32X3_WGMMA_MIN_K = 64
#: Precisions of :func:`gemm` per dtype (None = the dtype's own: "float32" or "float64").
PRECISIONS = {"float32": ("float32", "tf32x3", "tf32"), "float64": ("float64",)}
#: Blocks an SM that a kernel with the fused checksum updates (-DBIGMM_CHECKS) is built for at
#: most: the updates need more than the 128 registers a thread of four 128-thread blocks.
CHECKS_MAX_BLOCKS = 3

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
    pipe: bool = False  # wgmma: groups stay in flight across k-tiles (False: drained at each end)
    split_bufs: int = 2  # wgmma: shared-memory buffers of split B tiles (3: one barrier a k-tile)

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
        """The entry points (A and B load modes) the config compiles."""
        return _ENTRIES + _W_ENTRIES if self.wgmma else _ENTRIES

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
            # split_bufs split B tiles (tf32 and, for 3xTF32, small parts) at a 1 KB boundary
            raw = self.stages * (self.bm * (self.bk + 4) + self.bk * (self.bn + pad)) * 4
            parts = 2 if self.tf32 == 3 else 1
            return raw + self.split_bufs * parts * self.bn * self.bk * 4 + 1024
        return raw

    def defines(self, checks: bool = False) -> tuple[str, ...]:
        """The tile macros; ``checks``: of the variant with the fused checksum updates."""
        ctype = "float" if self.dtype == "float32" else "double"
        values = {
            "DTYPE": ctype, "BM": self.bm, "BN": self.bn, "BK": self.bk, "WM": self.wm,
            "WN": self.wn, "TM": self.tm, "TN": self.tn, "STAGES": self.stages,
            "PAD_BYTES": self.pad_bytes, "MIN_BLOCKS": self.checks_blocks if checks else
            self.min_blocks, "DMMA": int(self.dmma),
        }
        if self.tf32:
            values["TF32_PASSES"] = self.tf32
            values["TF32_ACC"] = int(self.tf32_fadd)
        if self.wgmma:  # the warpgroup tile is fixed by the kernel: no warp or thread tiles
            for key in ("WM", "WN", "TM", "TN", "DMMA", "TF32_ACC"):
                values.pop(key, None)
            values["WG_PIPE"] = int(self.pipe)
            values["WG_SPLITS"] = self.split_bufs
        if checks:
            values["CHECKS"] = 1
        return tuple(f"-DBIGMM_{k}={v}" for k, v in values.items())

    @property
    def checks_blocks(self) -> int:
        """The blocks an SM the variant with the fused checksum updates is built for."""
        return min(self.min_blocks, CHECKS_MAX_BLOCKS)

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
                ((self.bm, self.bk, self.wm, self.wn) == (128, 32, 64, self.bn)
                 and self.bn in ((128,) if self.tf32 == 3 else (128, 256)),
                 "wgmma tile 128x128x32 (TF32 also 128x256x32) of two 64-row warpgroup tiles"),
                (self.stages >= 3, "stages >= 3"),
                (self.split_bufs in ((2, 3) if self.pipe else (2,)),
                 "2 split buffers, or 3 with pipe"),
                (self.smem_bytes <= 232448, "shared memory within a block's 227 KB"),
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
        if device is None:
            import cupy

            device = cupy.cuda.runtime.getDevice()
        return _device_arch(device)
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
