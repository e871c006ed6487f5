"""Plain TF32 products on sm_90a that read one operand as it is stored
(``kernels/gemm_wgmma_direct.cu``): the operand contiguous along its side of C (NN's B along N,
TT's A along M) goes to the tensor cores from registers, rounded as it is loaded; the other,
contiguous along K, is rounded ahead into K-major tiles (``round_tiles``), then one product
kernel. Where the smaller operand has few rows (:data:`bigmm.planner.DIRECT_ROWS`) this
replaces rounding both ahead (:mod:`.cuda_presplit`), whose pass over the large one costs more
than reading it as stored.

cupy is imported inside functions only: importing this module needs no GPU.
"""

from __future__ import annotations

from ..planner.workspace import direct_workspace_bytes, rounds_one_ahead
from .cuda_build import grant_smem, raw_kernel, sm_count
from .cuda_presplit import workspace_words
from .kernel_configs import device_arch

_FILE = "gemm_wgmma_direct.cu"
#: Four stages of the S tile (256 x 32) and the R tile (32 x 136), eight mbarriers, aligned.
SMEM_BYTES = 4 * (256 * 128 + 32 * 136 * 4) + 64 + 1024
#: D tile: rows of R, rows of S.
_TILE_R, _TILE_S = 128, 256


def direct_layout(trans_a: bool, trans_b: bool, r_ptr: int, r_ld: int) -> str | None:
    """"nn" or "tt" where the product can run this way on this device: NN or TT, the operand
    read as stored (NN: b, TT: a; ``r_ptr``, ``r_ld`` elements) with 16-byte aligned rows;
    None otherwise."""
    if device_arch() != "sm_90a" or trans_a != trans_b or r_ptr % 16 or r_ld % 4:
        return None
    return "tt" if trans_a else "nn"


def direct_pays(m: int, n: int, k: int, layout: str | None) -> bool:
    """Whether a plain TF32 product reads one operand as stored (before any split ahead):
    the planner's rule (:func:`bigmm.planner.rounds_one_ahead`: the operand rounded ahead the
    smaller, at most :data:`bigmm.planner.DIRECT_ROWS` rows), and K below 2^29 (longer sums,
    never tested this way, go to the other paths)."""
    return layout is not None and rounds_one_ahead(m, n, layout == "tt", layout == "tt") and (
        k < 2**29)


def prepare_direct(a, b, c, alpha, beta, layout, m, n, k, lds, workspace):
    """The launch: op(a) (NN) or op(b)^T (TT) rounded into the workspace, then the product."""
    import numpy as np

    lda, ldb, ldc = lds
    opts = ("-arch=sm_90a",)
    product = raw_kernel(_FILE, "gemm_direct_" + layout, opts)
    grant_smem(product, (_FILE, "gemm_direct_" + layout), SMEM_BYTES, "gemm_direct_" + layout)
    rounding = raw_kernel(_FILE, "round_tiles", opts)
    s_src, s_rows, s_ld = (a, m, lda) if layout == "nn" else (b, n, ldb)
    words = direct_workspace_bytes(m, n, k) // 4
    rows_r = n if layout == "nn" else m
    tiles = (-(-s_rows // _TILE_S)) * (-(-rows_r // _TILE_R))
    round_blocks = max(1, min(-(-words // 1024), 16 * sm_count()))  # a thread per 4 words
    c_vec = np.int32(1 if c.data.ptr % 16 == 0 and ldc % 4 == 0 else 0)

    def launch(stream) -> None:
        with stream:
            s = workspace_words(workspace, words)
            rounding((round_blocks,), (256,), (s_src, np.int64(s_ld), np.int64(1),
                                               np.int32(s_rows), np.int32(k), s))
            args = (np.int32(m), np.int32(n), np.int32(k), np.float32(alpha))
            if layout == "nn":
                args += (s, b, np.int64(ldb))
            else:
                args += (a, np.int64(lda), s)
            product((tiles,), (384,), args + (np.float32(beta), c, np.int64(ldc), c_vec),
                    shared_mem=SMEM_BYTES)

    return launch
