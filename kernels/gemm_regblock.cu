// bigmm's register-blocked GEMM family: C = alpha * op(A) @ op(B) + beta * C, row-major,
// float32 or float64, any M, N, K and any leading dimensions.
//
// Design (one block computes a BM x BN tile of C):
//  * NT = (BM/WM) * (BN/WN) * 32 threads; each warp owns a WM x WN warp tile, each thread a
//    TM x TN register tile, split into 16-byte column groups spaced across the warp tile so
//    that every fragment load is one 16-byte LDS and conflict-free.
//  * Both operands are stored k-major in shared memory (S[k][r], r along M for A and along N
//    for B), so the inner loop reads both fragments with 16-byte loads.
//  * Global -> shared runs through a STAGES-deep cp.async pipeline.  An operand whose memory
//    is contiguous along M or N goes in 16-byte copies when aligned (LOAD_V) and element
//    copies otherwise (LOAD_S); one contiguous along K is transposed on the way in by element
//    copies (LOAD_K), laid out so that a warp's copies hit 32 distinct banks thanks to a
//    16-byte row pad.  Out-of-range elements are zero-filled (cp.async src-size 0).
//  * Register fragments are double-buffered: fragment k+1 loads while k is multiplied.
//  * The epilogue never reads C when beta == 0; stores are guarded, 16 bytes wide when C is
//    aligned.
//  * Optional split K over gridDim.z (each split writes its own partial product; the launcher
//    sums them with kernels/splitk_reduce.cu) for products with too few C tiles to fill the GPU.
//  * Optional checksum updates (-DBIGMM_CHECKS=1, no split K): the blocks of the first tile row
//    also sum the B tiles they load, weighted along k, into the expected column sums of C, and
//    those of the first tile column the A tiles into the expected row sums (Huang-Abraham,
//    see bigmm/checksum.py), so that the checks need no pass of their own over the panels.
//
// The loaders, the pipeline (gemm_body), the epilogue, the checksum updates and the entry points
// are common.cuh's, shared with the TF32 family (gemm_tf32.cu); this file holds the compute
// policies.  Tile parameters arrive as macros (one compiled module per dtype and tile shape);
// the nine extern "C" entry points at the end are named after the A and B load modes.
#include "common.cuh"

namespace bigmm {

// CUDA-core FMAs: a TM x TN register tile per thread, in 16-byte column groups spread over
// the warp tile so that every fragment load is one conflict-free 16-byte LDS.
template <class TL>
struct FmaCompute {
    typedef typename TL::T T;
    static constexpr int TM = TL::TM, TN = TL::TN, VW = TL::VW, KSTEP = 1;
    static constexpr int TH_M = TL::WM / TM, TH_N = TL::WN / TN;  // a warp's threads along M, N
    T acc[TM][TN];
    T fa[2][TM], fb[2][TN];
    int a_off, b_off;

    __device__ __forceinline__ void init(int warp, int lane) {
        a_off = (warp % TL::WARPS_M) * TL::WM + (lane / TH_N) * VW;
        b_off = (warp / TL::WARPS_M) * TL::WN + (lane % TH_N) * VW;
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = T(0);
    }

    __device__ __forceinline__ void load(int buf, const T* As, const T* Bs, int step) {
#pragma unroll
        for (int i = 0; i < TM / VW; ++i) load16(&fa[buf][i * VW], As + step * TL::SA + i * TH_M * VW);
#pragma unroll
        for (int j = 0; j < TN / VW; ++j) load16(&fb[buf][j * VW], Bs + step * TL::SB + j * TH_N * VW);
    }

    // Rows of the register tile in turn, odd rows backwards: each FMA shares an operand with
    // the one before, so that the operand reuse caches serve it (fewer register-file reads);
    // every sum is the same as in row order.
    __device__ __forceinline__ void mma(int buf) {
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                const int jj = (i & 1) ? TN - 1 - j : j;
                acc[i][jj] = fma_rn(fa[buf][i], fb[buf][jj], acc[i][jj]);
            }
    }

    template <class F>
    __device__ __forceinline__ void each_vec(F&& f) const {
#pragma unroll
        for (int i = 0; i < TM / VW; ++i)
#pragma unroll
            for (int v = 0; v < VW; ++v)
#pragma unroll
                for (int j = 0; j < TN / VW; ++j) {
                    T out[VW];
#pragma unroll
                    for (int u = 0; u < VW; ++u) out[u] = acc[i * VW + v][j * VW + u];
                    f(a_off + i * TH_M * VW + v, b_off + j * TH_N * VW, out);
                }
    }
};

// FP64 tensor cores (DMMA): a warp's WM x WN tile is (WM/16) x (WN/8) mma tiles of 16x8, each
// thread holding four accumulators of each.  A k-step is 4 deep.  Both operands stay k-major
// in shared memory; a fragment load is one 8-byte LDS per lane at S[k = t][r = g], which is
// conflict-free per half-warp when the row stride is 4 (mod 16) doubles (a 32-byte pad).
template <class TL>
struct DmmaCompute {
    typedef double T;
    static constexpr int MI = TL::WM / 16, NJ = TL::WN / 8, KSTEP = 4;
    static_assert(TL::WM % 16 == 0 && TL::WN % 8 == 0, "DMMA warp tile is whole 16x8 tiles");
    static_assert(TL::SA % 16 == 4 && TL::SB % 16 == 4, "DMMA rows need a 32-byte pad");
    T acc[MI][NJ][4];
    T fa[2][MI][2], fb[2][NJ];
    int a_off, b_off, row0, col0;

    __device__ __forceinline__ void init(int warp, int lane) {
        const int g = lane / 4, t = lane % 4;
        row0 = (warp % TL::WARPS_M) * TL::WM + g;
        col0 = (warp / TL::WARPS_M) * TL::WN + 2 * t;
        a_off = t * TL::SA + row0;
        b_off = t * TL::SB + (warp / TL::WARPS_M) * TL::WN + g;
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NJ; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0;
    }

    __device__ __forceinline__ void load(int buf, const T* As, const T* Bs, int step) {
#pragma unroll
        for (int i = 0; i < MI; ++i) {
            fa[buf][i][0] = As[step * KSTEP * TL::SA + i * 16];
            fa[buf][i][1] = As[step * KSTEP * TL::SA + i * 16 + 8];
        }
#pragma unroll
        for (int j = 0; j < NJ; ++j) fb[buf][j] = Bs[step * KSTEP * TL::SB + j * 8];
    }

    __device__ __forceinline__ void mma(int buf) {
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NJ; ++j) dmma_16x8x4(acc[i][j], fa[buf][i], fb[buf][j]);
    }

    template <class F>
    __device__ __forceinline__ void each_vec(F&& f) const {
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int j = 0; j < NJ; ++j) f(row0 + i * 16 + 8 * h, col0 + j * 8, &acc[i][j][2 * h]);
    }
};

}  // namespace bigmm

// ---- one instantiation per compiled module; defaults are the float32 128x128 tile ----------
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
#define BIGMM_BK 16
#endif
#ifndef BIGMM_WM
#define BIGMM_WM 32
#endif
#ifndef BIGMM_WN
#define BIGMM_WN 64
#endif
#ifndef BIGMM_TM
#define BIGMM_TM 8
#endif
#ifndef BIGMM_TN
#define BIGMM_TN 8
#endif
#ifndef BIGMM_STAGES
#define BIGMM_STAGES 3
#endif
#ifndef BIGMM_PAD_BYTES
#define BIGMM_PAD_BYTES 16
#endif
#ifndef BIGMM_MIN_BLOCKS
#define BIGMM_MIN_BLOCKS 2
#endif
#ifndef BIGMM_DMMA
#define BIGMM_DMMA 0  // 1: float64 on the FP64 tensor cores (DmmaCompute); TM, TN unused
#endif
#ifndef BIGMM_CHECKS
#define BIGMM_CHECKS 0  // 1: the entries take the checksum arguments (bigmm::Checks)
#endif

typedef bigmm::Tile<BIGMM_DTYPE, BIGMM_BM, BIGMM_BN, BIGMM_BK, BIGMM_WM, BIGMM_WN, BIGMM_TM,
                    BIGMM_TN, BIGMM_STAGES, BIGMM_PAD_BYTES>
    BigmmTile;
#if BIGMM_DMMA
typedef bigmm::DmmaCompute<BigmmTile> BigmmCompute;
#else
typedef bigmm::FmaCompute<BigmmTile> BigmmCompute;
#endif

BIGMM_DEFINE_ENTRIES
