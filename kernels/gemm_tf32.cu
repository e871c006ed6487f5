// bigmm's TF32 tensor-core GEMM family: C = alpha * op(A) @ op(B) + beta * C in float32, row-major,
// any M, N, K and leading dimensions, on mma.sync.m16n8k8 TF32 (sm_80, sm_90).  Two policies
// from the same code (-DBIGMM_TF32_PASSES):
//  * 3 (3xTF32): each operand element x = big + small * 2^-10, big = tf32(x), small =
//    tf32(2^10 (x - big)) (tf32_split in common.cuh), split per register fragment right after
//    its shared-memory load; a product is big*big + big*small + small*big (small*small
//    dropped): float32's accuracy at three tensor-core passes.
//  * 1 (TF32): one pass on tf32(x): about 2^-11 relative error per operand.
// The tensor cores truncate (round toward zero) when they add into their accumulator, which over
// a long K biases a sum that lives there.  So 3xTF32 (-DBIGMM_TF32_ACC=1) keeps the large terms
// out of it: each k-step's big*big is an mma onto zero (8 exact products, one truncation
// relative to their own sum), added to the float32 accumulator with an ordinary rounded FADD;
// the two correction terms (2^10 times 2^-11 of the result) accumulate in the tensor cores,
// where their truncation is 2^-11 smaller, and join the result in the epilogue.  With
// -DBIGMM_TF32_ACC=0 all three products accumulate in the tensor cores (fewer registers and
// instructions, the truncation bias of a long sum; small unscaled).
//
// Everything but the compute policy is the family's shared machinery in common.cuh (the k/v/s
// tile loaders, the cp.async multi-stage pipeline, the alpha/beta epilogue that never reads C
// when beta == 0, split K through gridDim.z, the entry points): see gemm_regblock.cu.
//
// Fragments come from the same k-major shared tiles S[k][r] as the CUDA-core kernels.  Rows and
// columns of a 16x8 mma tile are permuted so that every fragment load is one 8-byte LDS: logical
// row g of an m16 tile is stored row 2g and row g+8 row 2g+1, so a lane's a = {A[g][t], A[g+8][t]}
// and {A[g][t+4], A[g+8][t+4]} are two float2 at S[t][2g] and S[t+4][2g]; two n8 tiles 2p and
// 2p+1 interleave their columns (column g of tile 2p+h is stored 2g+h), so the b fragments of
// both are two float2.  With a row stride of 8 (mod 16) floats (a 32-byte pad on 128- or
// 256-wide tiles) each half-warp's 8-byte loads hit 32 distinct banks.  The permutations bring a
// lane's accumulators back as runs of 4 consecutive columns of C (16-byte stores).
#include "common.cuh"

namespace bigmm {

template <class TL, int PASSES, int ACC>
struct Tf32Compute {
    typedef float T;
    static constexpr int KSTEP = 8, VW = 4;
    static constexpr int MI = TL::WM / 16, NP = TL::WN / 16;  // m16 tiles, pairs of n8 tiles
    static_assert(TL::WM % 16 == 0 && TL::WN % 16 == 0, "TF32 warp tile of whole 16x16 pairs");
    static_assert(PASSES == 1 || PASSES == 3, "TF32 (1 pass) or 3xTF32 (3 passes)");
    static_assert(TL::SA % 16 == 8 && TL::SB % 16 == 8,
                  "conflict-free 8-byte fragment loads need a row stride of 8 (mod 16) floats");
    static constexpr bool FADD = PASSES == 3 && ACC == 1;
    static constexpr int CI = FADD ? MI : 1, CP = FADD ? NP : 1;

    // acc[i][p][h][c]: row 2g + h of m16 tile i, column 4t + c of n16 pair p (column c >> 1 of
    // n8 tile 2p + (c & 1), in mma terms).  cor: 2^10 times the 3xTF32 correction terms (FADD).
    float acc[MI][NP][2][4];
    float cor[CI][CP][2][4];
    float fa[2][MI][4];  // {A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4]} per m16 tile
    float fb[2][NP][4];  // {B[t][g] of tiles 2p, 2p+1, B[t+4][g] of tiles 2p, 2p+1} per pair
    int a_off, b_off, row0, col0;

    __device__ __forceinline__ void init(int warp, int lane) {
        const int g = lane / 4, t = lane % 4;
        const int wm = (warp % TL::WARPS_M) * TL::WM, wn = (warp / TL::WARPS_M) * TL::WN;
        row0 = wm + 2 * g;
        col0 = wn + 4 * t;
        a_off = t * TL::SA + wm + 2 * g;
        b_off = t * TL::SB + wn + 2 * g;
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int p = 0; p < NP; ++p)
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int c = 0; c < 4; ++c) acc[i][p][h][c] = 0.f;
#pragma unroll
        for (int i = 0; i < CI; ++i)
#pragma unroll
            for (int p = 0; p < CP; ++p)
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int c = 0; c < 4; ++c) cor[i][p][h][c] = 0.f;
    }

    __device__ __forceinline__ void load(int buf, const T* As, const T* Bs, int step) {
        const T* a = As + step * KSTEP * TL::SA;
        const T* b = Bs + step * KSTEP * TL::SB;
#pragma unroll
        for (int i = 0; i < MI; ++i) {
            const float2 k0 = *reinterpret_cast<const float2*>(a + i * 16);
            const float2 k4 = *reinterpret_cast<const float2*>(a + 4 * TL::SA + i * 16);
            fa[buf][i][0] = k0.x;
            fa[buf][i][1] = k0.y;
            fa[buf][i][2] = k4.x;
            fa[buf][i][3] = k4.y;
        }
#pragma unroll
        for (int p = 0; p < NP; ++p) {
            const float2 k0 = *reinterpret_cast<const float2*>(b + p * 16);
            const float2 k4 = *reinterpret_cast<const float2*>(b + 4 * TL::SB + p * 16);
            fb[buf][p][0] = k0.x;
            fb[buf][p][1] = k0.y;
            fb[buf][p][2] = k4.x;
            fb[buf][p][3] = k4.y;
        }
    }

    __device__ __forceinline__ void mma(int buf) {
        constexpr int SI = PASSES == 3 ? MI : 1, SP = PASSES == 3 ? NP : 1;
        unsigned ab[MI][4], bb[NP][4], as[SI][4], bs[SP][4];  // big (or only) and small parts
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (PASSES == 3) tf32_split(fa[buf][i][e], ab[i][e], as[i % SI][e], FADD);
                else ab[i][e] = tf32_rne(fa[buf][i][e]);
            }
#pragma unroll
        for (int p = 0; p < NP; ++p)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (PASSES == 3) tf32_split(fb[buf][p][e], bb[p][e], bs[p % SP][e], FADD);
                else bb[p][e] = tf32_rne(fb[buf][p][e]);
            }
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int p = 0; p < NP; ++p)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float& c0 = acc[i][p][0][h];
                    float& c1 = acc[i][p][0][2 + h];
                    float& c2 = acc[i][p][1][h];
                    float& c3 = acc[i][p][1][2 + h];
                    const unsigned b0 = bb[p][h], b1 = bb[p][2 + h];
                    if (PASSES == 1) {
                        mma_tf32_16x8x8(c0, c1, c2, c3, ab[i], b0, b1, c0, c1, c2, c3);
                    } else if (FADD) {
                        // big*big onto zero, added with FADD; small*big + big*small into cor
                        float* e0 = cor[i % CI][p % CP][0];
                        float* e1 = cor[i % CI][p % CP][1];
                        mma_tf32_16x8x8(e0[h], e0[2 + h], e1[h], e1[2 + h], as[i % SI], b0, b1,
                                        e0[h], e0[2 + h], e1[h], e1[2 + h]);
                        mma_tf32_16x8x8(e0[h], e0[2 + h], e1[h], e1[2 + h], ab[i], bs[p % SP][h],
                                        bs[p % SP][2 + h], e0[h], e0[2 + h], e1[h], e1[2 + h]);
                        float d0, d1, d2, d3;
                        mma_tf32_16x8x8(d0, d1, d2, d3, ab[i], b0, b1, 0.f, 0.f, 0.f, 0.f);
                        c0 += d0, c1 += d1, c2 += d2, c3 += d3;
                    } else {  // all three in the mma, small parts first (unscaled)
                        mma_tf32_16x8x8(c0, c1, c2, c3, as[i % SI], b0, b1, c0, c1, c2, c3);
                        mma_tf32_16x8x8(c0, c1, c2, c3, ab[i], bs[p % SP][h], bs[p % SP][2 + h],
                                        c0, c1, c2, c3);
                        mma_tf32_16x8x8(c0, c1, c2, c3, ab[i], b0, b1, c0, c1, c2, c3);
                    }
                }
    }

    template <class F>
    __device__ __forceinline__ void each_vec(F&& f) const {
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int p = 0; p < NP; ++p) {
                    float v[4];
#pragma unroll
                    for (int c = 0; c < 4; ++c)
                        v[c] = FADD ? __fmaf_rn(cor[i % CI][p % CP][h][c], 1.f / TF32_SMALL_SCALE,
                                                acc[i][p][h][c])
                                    : acc[i][p][h][c];
                    f(row0 + i * 16 + h, col0 + p * 16, v);
                }
    }
};

}  // namespace bigmm

// ---- one instantiation per compiled module; defaults are the 3xTF32 128x128 tile -------------
#ifndef BIGMM_DTYPE
#define BIGMM_DTYPE float
#endif
#ifndef BIGMM_BM
#define BIGMM_BM 128
#endif
#ifndef BIGMM_BN
#define BIGMM_BN 128
#endif
#ifndef BIGMM_BK
#define BIGMM_BK 32
#endif
#ifndef BIGMM_WM
#define BIGMM_WM 64
#endif
#ifndef BIGMM_WN
#define BIGMM_WN 32
#endif
#ifndef BIGMM_STAGES
#define BIGMM_STAGES 3
#endif
#ifndef BIGMM_PAD_BYTES
#define BIGMM_PAD_BYTES 32
#endif
#ifndef BIGMM_MIN_BLOCKS
#define BIGMM_MIN_BLOCKS 1
#endif
#ifndef BIGMM_TF32_PASSES
#define BIGMM_TF32_PASSES 3  // 3: 3xTF32 (float32 accuracy), 1: plain TF32
#endif
#ifndef BIGMM_TF32_ACC
#define BIGMM_TF32_ACC 1  // 3xTF32: 1 = big*big per k-step onto zero, then FADD; 0 = in the mma
#endif
#ifndef BIGMM_CHECKS
#define BIGMM_CHECKS 0  // 1: the entries take the checksum arguments (bigmm::Checks)
#endif

typedef bigmm::Tile<float, BIGMM_BM, BIGMM_BN, BIGMM_BK, BIGMM_WM, BIGMM_WN, 0, 0, BIGMM_STAGES,
                    BIGMM_PAD_BYTES>
    BigmmTile;
typedef bigmm::Tf32Compute<BigmmTile, BIGMM_TF32_PASSES, BIGMM_TF32_ACC> BigmmCompute;

BIGMM_DEFINE_ENTRIES
