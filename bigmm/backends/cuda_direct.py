"""Plain TF32 products on sm_90a that read their operands as they are stored
(``kernels/gemm_wgmma_direct.cu``): both through TFLOAT32 tensor maps (:mod:`.cuda_tma`), which
round to TF32 on the way in; the operand contiguous along its side of C (NN's B along N, TT's A
along M) goes to the tensor cores from registers, the other, contiguous along K, from shared
memory. Where that other operand's rows are not 16-byte aligned it is rounded ahead into
K-major tiles (``round_tiles``) instead, which pays where it is the smaller operand and has few
rows (:data:`bigmm.planner.DIRECT_ROWS`).

cupy is imported inside functions only: importing this module needs no GPU.
"""

from __future__ import annotations

from ..planner.workspace import direct_workspace_bytes, rounds_one_ahead, stored_fits
from .cuda_build import grant_smem, raw_kernel, sm_count
from .cuda_presplit import workspace_words
from .cuda_tma import SWIZZLE_128B, tensor_map, tma_aligned
from .kernel_configs import device_arch

_FILE = "gemm_wgmma_direct.cu"
#: Four stages of the S tile (256 x 32) and the R tile (32 x 128), eight mbarriers, aligned.
SMEM_BYTES = 4 * (256 * 128 + 32 * 128 * 4) + 64 + 1024
#: D tile: rows of R, rows of S.
_TILE_R, _TILE_S = 128, 256


def direct_layout(trans_a: bool, trans_b: bool, r_ptr: int, r_ld: int) -> str | None:
    """"nn" or "tt" where the product can run this way on this device: NN or TT, the operand
    read as stored (NN: b, TT: a; ``r_ptr``, ``r_ld`` elements) with 16-byte aligned rows;
    None otherwise."""
    if device_arch() != "sm_90a" or trans_a != trans_b or not tma_aligned(r_ptr, r_ld):
        return None
    return "tt" if trans_a else "nn"


def direct_pays(m: int, n: int, k: int, layout: str | None, s_aligned: bool) -> bool:
    """Whether a plain TF32 product reads its operands as stored (before any split ahead):
    ``layout`` not None, K below 2^29 (longer sums, never tested this way, go to the other
    paths), operands small enough (:func:`bigmm.planner.stored_fits`), and the other operand
    (NN's a, TT's b) read through its tensor map (``s_aligned``: 16-byte aligned rows) or,
    where it cannot be, rounded ahead under the planner's rule
    (:func:`bigmm.planner.rounds_one_ahead`: the smaller operand, at most
    :data:`bigmm.planner.DIRECT_ROWS` rows)."""
    return layout is not None and k < 2**29 and stored_fits(m, n, k) and (
        s_aligned or rounds_one_ahead(m, n, layout == "tt", layout == "tt"))


def prepare_direct(a, b, c, alpha, beta, layout, m, n, k, lds, workspace, s_aligned):
    """The launch: the product through tensor maps of both operands, or with op(a) (NN) or
    op(b)^T (TT) rounded ahead into the workspace where its rows are not 16-byte aligned
    (``s_aligned`` False)."""
    import numpy as np

    lda, ldb, ldc = lds
    opts = ("-arch=sm_90a",)
    entry = "gemm_direct_" + layout
    product = raw_kernel(_FILE, entry, opts)
    grant_smem(product, (_FILE, entry), SMEM_BYTES, entry)
    # (array, rows, cols, ld) of R (rows along K) and S (rows along the other side of C)
    r_side, s_side = ((b, k, n, ldb), (a, m, k, lda)) if layout == "nn" else (
        (a, k, m, lda), (b, n, k, ldb))
    r_map = tensor_map(*r_side, 32, 32, SWIZZLE_128B)
    rows_r, s_rows = r_side[2], s_side[1]
    ahead = not s_aligned
    s_map = r_map if ahead else tensor_map(*s_side, 32, 256, SWIZZLE_128B)
    tiles = (-(-s_rows // _TILE_S)) * (-(-rows_r // _TILE_R))
    c_vec = np.int32(1 if c.data.ptr % 16 == 0 and ldc % 4 == 0 else 0)
    words = direct_workspace_bytes(m, n, k) // 4 if ahead else 0
    rounding = raw_kernel(_FILE, "round_tiles", opts) if ahead else None
    round_blocks = max(1, min(-(-words // 1024), 16 * sm_count()))  # a thread per 4 words

    def launch(stream) -> None:
        with stream:
            s = None
            if ahead:
                s = workspace_words(workspace, words)
                rounding((round_blocks,), (256,), (s_side[0], np.int64(s_side[3]), np.int64(1),
                                                   np.int32(s_rows), np.int32(k), s))
            maps = (s_map, s, r_map) if layout == "nn" else (r_map, s_map, s)
            product((tiles,), (384,), (np.int32(m), np.int32(n), np.int32(k), np.float32(alpha))
                    + maps + (np.float32(beta), c, np.int64(ldc), c_vec), shared_mem=SMEM_BYTES)

    return launch
