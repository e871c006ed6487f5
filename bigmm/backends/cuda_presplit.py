"""Large tensor-core float32 products from operands split ahead (sm_90a only;
``kernels/gemm_wgmma_split.cu``): op(A) and op(B)^T are split (3xTF32: big and small parts;
TF32: rounded) into K-major workspaces, then multiplied from them, in turn on one stream.

cupy is imported inside functions only: importing this module needs no GPU.
"""

from __future__ import annotations

from ..planner.workspace import split_workspace_bytes, splits_ahead
from .cuda_build import grant_smem, raw_kernel
from .kernel_configs import TF32X3_WGMMA_MIN_K, device_arch

#: Parts an element the operands are split into ahead, by precision: 3xTF32's big and small
#: parts (``gemm_split``), TF32's rounded value (``gemm_round``).
PARTS = {"tf32x3": 2, "tf32": 1}
#: (product kernel, split kernels for sources contiguous along K and along the rows, the
#: product's shared memory: three stages of four 16 KB tiles, or four of 48 KB, aligned,
#: C tile columns) by parts.
KERNELS = {2: ("gemm_split", "split_k", "split_r", 3 * 65536 + 1024, 128),
           1: ("gemm_round", "round_k", "round_r", 4 * 49152 + 1024, 256)}
_FILE = "gemm_wgmma_split.cu"


def split_parts(precision: str) -> int:
    """The parts an element a large product of ``precision`` splits its operands into ahead on
    this device (2: "tf32x3", 1: "tf32", on sm_90a; else 0)."""
    return PARTS.get(precision, 0) if device_arch() == "sm_90a" else 0


def presplit_pays(m: int, n: int, k: int) -> bool:
    """Whether "tf32x3" and "tf32" split (round) their operands ahead on this device: sm_90a,
    K long enough for the wgmma kernels, M and N large enough
    (:func:`bigmm.planner.splits_ahead`)."""
    return (k >= TF32X3_WGMMA_MIN_K and m * n > 0 and splits_ahead(m, n)
            and device_arch() == "sm_90a")


def can_presplit(m: int, n: int, k: int) -> bool:
    """Whether the split kernels can take the shape (their grid: k-tiles along x, 32-row
    blocks along y, at most 65535) on this device."""
    return k >= 1 and max(m, n) <= 32 * 65535 and device_arch() == "sm_90a"


def workspace_words(workspace, words: int):
    """``words`` 32-bit words of device memory for a product's operands split or rounded
    ahead: from ``workspace(nbytes)`` (a device array of at least ``nbytes``), or from cupy's
    pool for None."""
    import cupy

    if workspace is None:
        return cupy.empty(words, dtype=cupy.uint32)
    return workspace(4 * words).view(cupy.uint32)[:words]


def prepare_presplit(a, b, c, alpha, beta, trans_a, trans_b, m, n, k, lds, workspace, parts):
    """The launch of a product from operands split ahead (``parts`` 2: 3xTF32, 1: TF32): op(a)
    and op(b)^T split into the workspace (by which way each source is contiguous), then the
    product (gemm_wgmma_split.cu)."""
    import numpy as np

    lda, ldb, ldc = lds
    opts = ("-arch=sm_90a",)
    product, along_k, along_rows, smem, bn = KERNELS[parts]
    kern = raw_kernel(_FILE, product, opts)
    grant_smem(kern, (_FILE, product), smem, product)
    kt = -(-k // 32)
    ld = 32 * (kt + 1)
    words = split_workspace_bytes(m, n, k, parts) // 4
    # (source, rows, rows padded, rows' stride, k's stride, permuted): op(a) by rows m, op(b)^T
    # by rows n
    sides = ((a, m, -(-m // 128) * 128, 1 if trans_a else lda, lda if trans_a else 1, 0),
             (b, n, -(-n // 256) * 256, ldb if trans_b else 1, 1 if trans_b else ldb, 1))
    splits = [raw_kernel(_FILE, along_k if sk == 1 else along_rows, opts)
              for _, _, _, _, sk, _ in sides]
    c_vec = np.int32(1 if c.data.ptr % 16 == 0 and ldc % 4 == 0 else 0)
    tiles = (-(-m // 128)) * (-(-n // bn))

    def launch(stream) -> None:
        with stream:
            work = workspace_words(workspace, words)
            ops, at = [], 0
            for (x, rows, rp, sr, sk, perm), split in zip(sides, splits):
                big = work[at:at + rp * ld]
                small = work[at + rp * ld:at + 2 * rp * ld] if parts == 2 else big
                at += parts * rp * ld
                split((kt + 1, rp // 32), (256,), (x, np.int64(sr), np.int64(sk), np.int32(rows),
                                                   np.int32(k), np.int32(32 * kt - k), big, small,
                                                   np.int64(ld), np.int32(perm)))
                ops += [big, small] if parts == 2 else [big]
            kern((tiles,), (256,), (np.int32(m), np.int32(n), np.int32(kt), np.int64(ld),
                                    np.float32(alpha), *ops, np.float32(beta), c,
                                    np.int64(ldc), c_vec), shared_mem=smem)

    return launch
