// bigmm's 3xTF32 and TF32 GEMMs on Hopper's warpgroup tensor cores (sm_90a only) from operands
// split (TF32: rounded) ahead of the product: C = alpha * op(A) @ op(B) + beta * C in float32,
// row-major, any M, N, K and leading dimensions; the same split, rounding and accumulation as
// gemm_wgmma.cu's, so the same sums in the same order.
//
// Two kernels, launched in turn on one stream (bigmm/backends/cuda_kernels.py):
//  * split_k / split_r: op(A) (rows m) and op(B)^T (rows n) are split once, x = big + 2^-10
//    small (tf32_split), into K-major workspaces (round_k / round_r: tf32(x) only): big and
//    small each R x ld with R a multiple of 128 (A) or 256 (B) and ld = 32 (KT + 1), K
//    contiguous, zero past M and N; k is stored at column
//    k + 32 KT - K (the first k-tile partial, as gemm_wgmma.cu's k-tiles fall: the same
//    sums) and one whole zero k-tile ends each row.  split_k reads sources contiguous along K, split_r sources contiguous along the
//    rows, both through a 32 x 32 shared-memory tile so that reads and writes are coalesced.
//    With `perm` the rows are stored in the order the main kernel's epilogue wants (row
//    16p + 8h + 2t + e holds source row 16p + 4t + 2h + e: a thread's accumulators come back as
//    runs of four consecutive columns of C).
//  * gemm_split: block = two warpgroups (256 threads), C tile 128 x 128, k-tiles of 32.  Per
//    k-tile all threads copy the four 128 x 32 tiles (A big, A small, B big, B small: 64 KB) with
//    16-byte cp.async straight into the 128-byte-swizzled K-major layout the wgmma descriptors
//    read (3 stages, 193 KB).  Each k-step of 8 is three wgmma.m64n128k8 with both operands from
//    shared memory: cor += small_A big_B + big_A small_B (over all of K), tmp (+)= big_A big_B (a
//    fresh sum per k-tile, added to acc with FADD).  The loop is rotated so that the tensor
//    cores stay busy while acc += tmp runs: the next k-tile's first corrections are issued
//    first (after the last k-tile they multiply the zero k-tile).  Two barriers a k-tile: one
//    before the next k-tile's corrections (its stage landed), one after acc += tmp (every
//    warpgroup's wgmmas of this k-tile done, so its stage may be refilled).
//
//  * gemm_round (TF32): C tile 128 x 256, four stages of 48 KB, one wgmma.m64n256k8 a k-step
//    and warpgroup, accumulating in the wgmma; loads two k-tiles ahead.
//
// The in-loop split of gemm_wgmma.cu costs more instructions than the wgmmas; splitting once
// ahead costs 12 (M + N) K bytes of memory traffic (rounding: 8), which pays where 1/M + 1/N is
// small (the launcher's rule, kernels/README.md).
#define BIGMM_WGMMA 1
#include "common.cuh"

namespace bigmm {

// D(64 x 128) (+ D when scale_d) = A(64 x 8) B(8 x 128), both from K-major 128-byte-swizzled
// descriptors; d[4j + e]: row g + 8 (e >> 1), column 8j + 2t + (e & 1) of the warp's 16 rows.
__device__ __forceinline__ void wgmma_ss(float* d, unsigned long long da, unsigned long long db,
                                         int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        BIGMM_WG_LIST64 ", "
        "%64, %65, p, 1, 1;\n}\n"
        : BIGMM_WG_D64(0)
        : "l"(da), "l"(db), "r"(scale_d));
}

// As wgmma_ss, a fresh sum: D only written.
__device__ __forceinline__ void wgmma_ss_zero(float* d, unsigned long long da,
                                              unsigned long long db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        BIGMM_WG_LIST64 ", "
        "%64, %65, 0, 1, 1;\n"
        : BIGMM_WG_W64(0)
        : "l"(da), "l"(db));
}

// D(64 x 256) += A(64 x 8) B(8 x 256), both from descriptors (plain TF32's 128 x 256 tile).
__device__ __forceinline__ void wgmma_ss256(float* d, unsigned long long da, unsigned long long db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 "
        BIGMM_WG_LIST128 ", "
        "%128, %129, 1, 1, 1;\n"
        : BIGMM_WG_D64(0), BIGMM_WG_D64(64)
        : "l"(da), "l"(db));
}

// Rows [32 by, 32 by + 32) and columns [32 bx, 32 bx + 32) of the split: column j holds
// k = j - off of the source, element (r, k) at X[r sr + k sk] (zero past R and outside
// [0, K)).  R_CONTIG: the source is contiguous along r.
template <bool R_CONTIG, int PARTS>
__device__ __forceinline__ void split_tile(const float* __restrict__ X, long long sr, long long sk,
                                           int R, int K, int off, unsigned* __restrict__ big,
                                           unsigned* __restrict__ small, long long ld, int perm) {
    __shared__ float tile[32][33];  // [r][k]
    const int k0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
#pragma unroll
    for (int i = ty; i < 32; i += 8) {
        const int r = r0 + (R_CONTIG ? tx : i), k = k0 + (R_CONTIG ? i : tx) - off;
        const float v = (r < R && k >= 0 && k < K) ? X[r * sr + k * sk] : 0.f;
        if (R_CONTIG) tile[tx][i] = v;
        else tile[i][tx] = v;
    }
    __syncthreads();
#pragma unroll
    for (int row = ty; row < 32; row += 8) {
        const int src = perm ? ((row & ~15) | (((row >> 1) & 3) << 2) | (((row >> 3) & 1) << 1) |
                                (row & 1))
                             : row;
        const long long o = (long long)(r0 + row) * ld + k0 + tx;
        if (PARTS == 2) {
            unsigned b, s;
            tf32_split(tile[src][tx], b, s);
            big[o] = b;
            small[o] = s;
        } else {
            big[o] = tf32_rne(tile[src][tx]);
        }
    }
}

// The epilogue of a two-warpgroup C tile BN wide at (m0, n0): this thread's rows 64 wg + 16 w
// + g + 8 h and columns 16 p + 4 t .. + 3 (accumulators 8 p + 4 c' + 2 h + e hold column
// 16 p + 4 t + 2 c' + e, B's rows permuted as the split stores them); value(i) is accumulator
// i's result.
template <int BN, class Value>
__device__ __forceinline__ void store_tile(float* __restrict__ C, long long ldc, int M, int N,
                                           int m0, int n0, float alpha, float beta, int c_vec,
                                           Value value) {
    const int tid = threadIdx.x, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int row0 = m0 + 64 * (tid / 128) + 16 * ((tid / 32) % 4) + g;
    const bool read_c = !(beta == 0.f);
    constexpr int RUNS = 2 * (BN / 16), BATCH = 4;  // run j: h = j / (BN / 16), p = j % (BN / 16)
    auto place = [&](int j, int& row, int& col) {
        row = row0 + 8 * (j / (BN / 16));
        col = n0 + 16 * (j % (BN / 16)) + 4 * t;
    };
    auto values = [&](int j, float* v) {
        const int h = j / (BN / 16), p = j % (BN / 16);
#pragma unroll
        for (int q = 0; q < 4; ++q) v[q] = value(8 * p + 4 * (q >> 1) + 2 * h + (q & 1));
    };
#pragma unroll
    for (int j0 = 0; j0 < RUNS; j0 += BATCH)
        store_batch<BATCH>(C, ldc, M, N, j0, alpha, beta, read_c, c_vec, place, values);
}

}  // namespace bigmm

// The split entries: split_k / split_r (3xTF32's two parts) and round_k / round_r (TF32's
// rounded value; `small` unused), for sources contiguous along K and along the rows.
#define BIGMM_SPLIT_ENTRY(name, r_contig, parts)                                               \
    extern "C" __global__ void __launch_bounds__(256)                                          \
        name(const float* __restrict__ X, long long sr, long long sk, int R, int K, int off,   \
             unsigned* __restrict__ big, unsigned* __restrict__ small, long long ld, int perm) { \
        bigmm::split_tile<r_contig, parts>(X, sr, sk, R, K, off, big, small, ld, perm);        \
    }
BIGMM_SPLIT_ENTRY(split_k, false, 2)
BIGMM_SPLIT_ENTRY(split_r, true, 2)
BIGMM_SPLIT_ENTRY(round_k, false, 1)
BIGMM_SPLIT_ENTRY(round_r, true, 1)

// C (M x N) = alpha (Ab Bb^T + 2^-10 (As Bb^T + Ab Bs^T)) + beta C over KT k-tiles: Ab, As
// (rows of M, padded to 128) and Bb, Bs (rows of N, permuted by split's perm) at row stride
// ld = 32 (KT + 1), k-tile KT zero.
extern "C" __global__ void __launch_bounds__(256, 1)
gemm_split(int M, int N, int KT, long long ld, float alpha, const unsigned* __restrict__ Ab,
           const unsigned* __restrict__ As, const unsigned* __restrict__ Bb,
           const unsigned* __restrict__ Bs, float beta, float* __restrict__ C, long long ldc,
           int c_vec) {
    using namespace bigmm;
    constexpr int STAGES = 3, TILE = 128 * 128, STAGE = 4 * TILE;  // bytes
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = swizzle_aligned(smem_raw);
    const unsigned base = smem_addr(smem);
    const int tid = threadIdx.x, wg = tid / 128;
    int tile_m, tile_n;
    swizzle_tile<8>(blockIdx.x, (M + 127) / 128, (N + 127) / 128, tile_m, tile_n);
    const int m0 = tile_m * 128, n0 = tile_n * 128;

    // Copies: this thread's chunk c (16 bytes) of rows r_lo + 32 j of each of the four tiles.
    const unsigned* srcs[4] = {Ab + m0 * ld, As + m0 * ld, Bb + n0 * ld, Bs + n0 * ld};
    const int c = tid % 8, r_lo = tid / 8;
    auto load = [&](int stage, int kt) {
#pragma unroll
        for (int t = 0; t < 4; ++t)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int row = r_lo + 32 * j;
                cp_async<16>(base + unsigned(stage * STAGE + t * TILE + row * 128 +
                                             ((c ^ (row & 7)) << 4)),
                             srcs[t] + row * ld + kt * 32 + c * 4, 16);
            }
    };
    // Tile t (0 A big, 1 A small, 2 B big, 3 B small) of `stage` at k-step s; A from this
    // warpgroup's 64 rows.
    auto desc = [&](int stage, int t, int s) {
        return wgmma_desc_sw128(base + unsigned(stage * STAGE + t * TILE + (t < 2 ? wg * 8192 : 0) +
                                                32 * s));
    };

    float acc[64], tmp[64], cor[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;

    // Prologue: k-tiles 0 .. STAGES-2 in flight; k-tile 0's first corrections start cor.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s <= KT) load(s, s);
        cp_async_commit();
    }
    cp_async_wait<STAGES - 2>();
    fence_proxy_async();
    __syncthreads();
    wgmma_fence();
    wgmma_ss(cor, desc(0, 1, 0), desc(0, 2, 0), 0);
    wgmma_ss(cor, desc(0, 0, 0), desc(0, 3, 0), 1);
    wgmma_commit();

    for (int kt = 0; kt < KT; ++kt) {
        const int st = kt % STAGES, nx = (kt + 1) % STAGES;
        // the stage of k-tile kt - 1: every warpgroup's wgmmas on it ended before the barrier
        // that closed the last period
        if (kt + STAGES - 1 <= KT) load((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
        cp_async_commit();
        wgmma_fence();
        wgmma_ss_zero(tmp, desc(st, 0, 0), desc(st, 2, 0));
#pragma unroll
        for (int s = 1; s < 4; ++s) {
            wgmma_ss(cor, desc(st, 1, s), desc(st, 2, s), 1);
            wgmma_ss(cor, desc(st, 0, s), desc(st, 3, s), 1);
            wgmma_ss(tmp, desc(st, 0, s), desc(st, 2, s), 1);
        }
        wgmma_commit();
        cp_async_wait<STAGES - 2>();  // k-tile kt + 1 landed (this thread's copies) ...
        fence_proxy_async();
        __syncthreads();              // ... everyone's, and visible to the wgmmas
        wgmma_fence();
        wgmma_ss(cor, desc(nx, 1, 0), desc(nx, 2, 0), 1);
        wgmma_ss(cor, desc(nx, 0, 0), desc(nx, 3, 0), 1);
        wgmma_commit();
        wgmma_wait<1>();  // this k-tile's big*big sum is complete
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] += tmp[i];
        __syncthreads();  // every warpgroup's wgmmas of k-tile kt done: its stage is free
    }
    wgmma_wait<0>();
    cp_async_wait<0>();

    store_tile<128>(C, ldc, M, N, m0, n0, alpha, beta, c_vec, [&](int i) {
        return __fmaf_rn(cor[i], 1.f / TF32_SMALL_SCALE, acc[i]);
    });
}

// Plain TF32: C (M x N) = alpha Ab Bb^T + beta C over KT k-tiles of operands rounded ahead
// (round_k / round_r; B's rows permuted, padded to 256).  Block: two warpgroups, C tile 128 x
// 256, four stages of 48 KB (A 128 x 32, B 256 x 32); each k-step one wgmma.m64n256k8 a
// warpgroup, accumulating in the wgmma (as cuBLAS's TF32 mode).  Loads run two k-tiles ahead,
// into the stage of k-tile kt - 2, whose wgmmas every warpgroup retired before the barrier.
extern "C" __global__ void __launch_bounds__(256, 1)
gemm_round(int M, int N, int KT, long long ld, float alpha, const unsigned* __restrict__ Ab,
           const unsigned* __restrict__ Bb, float beta, float* __restrict__ C, long long ldc,
           int c_vec) {
    using namespace bigmm;
    constexpr int STAGES = 4, TA = 128 * 128, TB = 256 * 128, STAGE = TA + TB;  // bytes
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = swizzle_aligned(smem_raw);
    const unsigned base = smem_addr(smem);
    const int tid = threadIdx.x, wg = tid / 128;
    int tile_m, tile_n;
    swizzle_tile<8>(blockIdx.x, (M + 127) / 128, (N + 255) / 256, tile_m, tile_n);
    const int m0 = tile_m * 128, n0 = tile_n * 256;
    const unsigned* sa = Ab + m0 * ld;
    const unsigned* sb = Bb + n0 * ld;
    const int c = tid % 8, r_lo = tid / 8;
    auto load = [&](int stage, int kt) {
#pragma unroll
        for (int j = 0; j < 12; ++j) {  // rows of A (j < 4), then of B
            const int row = r_lo + 32 * j, r = j < 4 ? row : row - 128;
            const unsigned* g = (j < 4 ? sa : sb) + r * ld + kt * 32 + c * 4;
            cp_async<16>(base + unsigned(stage * STAGE + row * 128 + ((c ^ (row & 7)) << 4)), g, 16);
        }
    };
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    load(0, 0);
    cp_async_commit();
    if (KT > 1) load(1, 1);
    cp_async_commit();
    for (int kt = 0; kt < KT; ++kt) {
        const int st = kt % STAGES;
        cp_async_wait<1>();  // k-tile kt landed (this thread's copies) ...
        fence_proxy_async();
        __syncthreads();     // ... everyone's; every warpgroup's wgmmas of kt - 2 retired
        if (kt + 2 < KT) load((kt + 2) % STAGES, kt + 2);
        cp_async_commit();
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s)
            wgmma_ss256(acc, wgmma_desc_sw128(base + unsigned(st * STAGE + wg * 8192 + 32 * s)),
                        wgmma_desc_sw128(base + unsigned(st * STAGE + TA + 32 * s)));
        wgmma_commit();
        wgmma_wait<1>();  // k-tile kt - 1's wgmmas done
    }
    wgmma_wait<0>();
    cp_async_wait<0>();
    store_tile<256>(C, ldc, M, N, m0, n0, alpha, beta, c_vec, [&](int i) { return acc[i]; });
}
