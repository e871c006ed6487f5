"""The gemm's passes over a step's panels ahead of the product, by tile shape: which plain
TF32 gemms need none (both panels read as stored, rounded on the way in), which tiles have both
panels split (3xTF32) or rounded (TF32) ahead, which have only the smaller one rounded (plain
TF32 reading the other as stored), and the device bytes each holds. Pure: the CUDA launcher
follows these rules and the plan counts their memory."""

from __future__ import annotations

#: A gemm that can split its panels ahead does so where 1/M + 1/N < 1/PRESPLIT_HARMONIC: the
#: split moves 12 (M + N) K bytes, the product it speeds up does 2 M N K flops.
PRESPLIT_HARMONIC = 1024


def splits_ahead(rows_a: int, rows_b: int) -> bool:
    """Whether a gemm that can split its panels ahead does so for a C tile rows_a x rows_b."""
    return PRESPLIT_HARMONIC * (rows_a + rows_b) < rows_a * rows_b


def split_workspace_bytes(rows_a: int, rows_b: int, depth: int, parts: int = 2) -> int:
    """Device bytes a gemm that splits its panels ahead (kernels/gemm_wgmma_split.cu) holds for
    op(A) rows_a x depth and op(B) depth x rows_b: ``parts`` 4-byte parts of each element (2:
    3xTF32's big and small, 1: TF32's rounded value), A's rows padded to 128, B's to 256,
    32 (ceil(depth / 32) + 1) deep."""
    return (4 * parts * (-(-rows_a // 128) * 128 + -(-rows_b // 256) * 256)
            * 32 * (-(-depth // 32) + 1))


#: The most operand bytes, 4 (M + N) K, a plain TF32 gemm reads as stored: on an H100 the
#: product through tensor maps ran 0.95-1.2x cuBLAS TF32 up to 2.8 GB of operands (3072 x
#: 81920 x 8192), but 0.90-0.92x at 24576^3 and 32768^3, where both operands rounded ahead
#: into tile order ran 0.92-1.03x (kernels/README.md).
STORED_BYTES = 3 << 30


def stored_fits(rows_a: int, rows_b: int, depth: int) -> bool:
    """Whether a plain TF32 product of op(A) rows_a x depth and op(B) depth x rows_b is small
    enough to read as stored (:data:`STORED_BYTES`)."""
    return 4 * (rows_a + rows_b) * depth <= STORED_BYTES


def reads_as_stored(m: int, n: int, k: int, bm: int, bn: int, bk: int, trans_a: bool,
                    trans_b: bool) -> bool:
    """Whether a plain TF32 gemm reads every step's panels as stored, through tensor maps that
    round them to TF32 on the way into shared memory (kernels/gemm_wgmma_direct.cu), with no
    pass ahead and no workspace: NN or TT products whose panels all have 16-byte aligned rows
    (the depths of op(A)'s panels (NN) or op(B)'s (TT) and the widths of the other's, whole
    and at the edges, multiples of 4 elements) and whose steps fit :func:`stored_fits`."""
    if trans_a != trans_b or not stored_fits(bm, bn, bk):
        return False
    side, width = (m, bm) if trans_a else (n, bn)
    return k % 4 == 0 and bk % 4 == 0 and side % 4 == 0 and width % 4 == 0


#: The most rows of the smaller operand that a plain TF32 gemm whose panels are not all
#: 16-byte aligned rounds ahead alone, reading the other as stored (kernels/gemm_wgmma_direct.cu):
#: on an H100 strips of up to 4608 x 32768 x 4096 and 4096^3 ran faster this way than with both
#: operands rounded ahead, 6144 rows slower (kernels/README.md).
DIRECT_ROWS = 4608


def rounds_one_ahead(rows_a: int, rows_b: int, trans_a: bool, trans_b: bool) -> bool:
    """Whether a plain TF32 gemm for a C tile rows_a x rows_b that cannot read both operands
    as stored (:func:`reads_as_stored`) rounds only one ahead and reads the other as stored:
    NN with op(A) the smaller, TT with op(B) the smaller, at most :data:`DIRECT_ROWS` rows (NT
    and TN: the operands are not one along K and the other along its side of C, as this
    needs)."""
    if trans_a != trans_b:
        return False
    rows, other = (rows_b, rows_a) if trans_a else (rows_a, rows_b)
    return 0 < rows <= min(other, DIRECT_ROWS)


def direct_workspace_bytes(rows_a: int, rows_b: int, depth: int) -> int:
    """Device bytes a plain TF32 gemm that rounds only the smaller operand ahead
    (kernels/gemm_wgmma_direct.cu) holds: that operand's TF32 copy in tiles of 256 rows and 32
    deep (rows and depth padded to them)."""
    return 4 * (-(-min(rows_a, rows_b) // 256) * 256) * (-(-depth // 32) * 32)
