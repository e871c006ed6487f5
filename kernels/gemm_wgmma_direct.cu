// bigmm's plain TF32 GEMM on Hopper's warpgroup tensor cores (sm_90a only) that reads one
// operand as it is stored: C = alpha * op(A) @ op(B) + beta * C in float32, row-major, any M,
// N, K, where one operand is contiguous along its side of C (R: NN's B along N, TT's A along M,
// stored R[k][r], 16-byte aligned rows) and the other along K (S: NN's A, TT's B, S[s][k]).
//
// wgmma takes TF32 operands from shared memory only K-major, but its first operand may come
// from registers in any layout.  So R is copied raw (16-byte cp.async) into a padded tile from
// which each thread loads its fragments and rounds them (tf32_rna), while S, rounded ahead by
// round_rows into a K-major copy (8 |S| bytes of traffic: the launcher takes this kernel where
// S is the small operand), is copied straight into the 128-byte-swizzled tile the descriptor
// reads: D[r][s] = sum_k R[k][r] S[s][k], which is C (TT) or C^T (NN).  Every product is of
// values rounded to nearest, as the kernels rounding both operands ahead (gemm_wgmma_split.cu).
//  * Block: two warpgroups (256 threads), D tile 128 (r) x 256 (s), k-tiles of 32, four stages
//    of 49 KB (S 256 x 32 swizzled, R 32 x 128 at row stride 136 floats); each k-step one
//    wgmma.m64n256k8 a warpgroup with its 64 rows of R from registers, accumulating in the
//    wgmma (as cuBLAS's TF32 mode).  Loads run two k-tiles ahead.
//  * Fragments: logical rows g and g + 8 of a warp's 16 are stored rows 2g and 2g + 1, so that
//    each k-step is two conflict-free float2 loads (row stride 136 = 8 mod 32).
//  * Two fragment sets, used by alternate k-tiles: a k-tile's wgmmas stay in flight over the
//    next k-tile's barrier, fragment loads and copies, and are waited for before their set is
//    loaded again (kernels/README.md has the variants measured).
//  * Epilogue: D through shared memory into C's layout, then 16-byte stores of whole rows.
#define BIGMM_WGMMA 1
#include "common.cuh"

namespace bigmm {

constexpr int DIRECT_STAGES = 4;
constexpr int DIRECT_S_BYTES = 256 * 128;            // S tile: 256 rows of 32 k
constexpr int DIRECT_RP = 136;                       // R tile row stride (floats)
constexpr int DIRECT_R_BYTES = 32 * DIRECT_RP * 4;   // R tile: 32 k of 128 r
constexpr int DIRECT_STAGE = DIRECT_S_BYTES + DIRECT_R_BYTES;
static_assert(DIRECT_STAGE % 1024 == 0, "every stage's S tile on a swizzle atom");

// The D tile at (r0, s0) = (128, 256) x block coordinates; C_T: C is D^T (NN).  S rows at
// stride lds, 16-byte aligned, TF32 bits.
template <bool C_T>
__device__ __forceinline__ void direct_tile(int M, int N, int K, float alpha,
                                            const float* __restrict__ R, long long ldr,
                                            const unsigned* __restrict__ S, long long lds,
                                            float beta, float* __restrict__ C, long long ldc,
                                            int c_vec) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = swizzle_aligned(smem_raw);
    const unsigned base = smem_addr(smem);
    const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int RN = C_T ? N : M, SN = C_T ? M : N;  // rows of R (D's rows) and of S
    int tile_s, tile_r;
    swizzle_tile<8>(blockIdx.x, (SN + 255) / 256, (RN + 127) / 128, tile_s, tile_r);
    const int s0 = tile_s * 256, r0 = tile_r * 128;
    const int KT = (K + 31) / 32, KF = K / 32;  // k-tiles; those wholly inside K

    // S: chunk cs of rows rs + 32 j (rows past SN read row SN - 1: their columns of D are not
    // stored); R: chunk cr of k rows kr + 8 j (columns past RN zero-filled).  Byte pointers:
    // S's rows are s_row + j s_step in whole S tiles; R's k rows r_row + j r_step (columns past
    // RN: R itself, never advanced).  k-tiles from KF on zero-fill k >= K.
    const int cs = tid % 8, rs = tid / 8, cr = tid % 32, kr = tid / 32;
    const bool s_whole = s0 + 256 <= SN;
    const int rcol = r0 + 4 * cr, rbytes = 4 * max(0, min(4, RN - rcol));
    const char* s_row = reinterpret_cast<const char*>(S + (long long)min(s0 + rs, SN - 1) * lds + 4 * cs);
    const long long s_step = 128 * lds;
    const char* r_row = reinterpret_cast<const char*>(rbytes ? R + rcol + (long long)kr * ldr : R);
    const long long r_step = rbytes ? 32 * ldr : 0, r_tile = 4 * r_step;
    const unsigned sdst = unsigned(rs * 128 + ((cs ^ (rs & 7)) << 4));  // + 4096 j: rows + 32 j
    const unsigned rdst = unsigned(DIRECT_S_BYTES + (kr * DIRECT_RP + 4 * cr) * 4);
    auto load = [&](int stage, int kt) {
        const int k0 = kt * 32;
        const unsigned st = base + unsigned(stage * DIRECT_STAGE);
        const char* sk = s_row + 4 * k0;
        const char* rk = r_row + kt * r_tile;
        if (kt < KF && s_whole) {
#pragma unroll
            for (int j = 0; j < 8; ++j) cp_async<16>(st + sdst + 4096 * j, sk + j * s_step, 16);
        } else {
            const int bytes = 4 * max(0, min(4, K - k0 - 4 * cs));
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const long long row = min(s0 + rs + 32 * j, SN - 1) - min(s0 + rs, SN - 1);
                cp_async<16>(st + sdst + 4096 * j, bytes ? sk + row * 4 * lds : s_row, bytes);
            }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int bytes = kt < KF || k0 + kr + 8 * j < K ? rbytes : 0;
            cp_async<16>(st + rdst + 8 * DIRECT_RP * 4 * j, bytes ? rk + j * r_step : r_row, bytes);
        }
    };

    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    const int frag = 64 * wg + 16 * ((tid / 32) % 4) + 2 * g;  // this thread's stored R rows
    unsigned f[2][4][4];  // fragment sets of even and odd k-tiles

    load(0, 0);
    cp_async_commit();
    if (KT > 1) load(1, 1);
    cp_async_commit();
    auto step = [&](int kt, unsigned (&fs)[4][4]) {
        const int st = kt % DIRECT_STAGES;
        cp_async_wait<1>();  // k-tile kt landed (this thread's copies) ...
        fence_proxy_async();
        __syncthreads();     // ... everyone's; every wgmma of kt - 2 retired
        const float* rt = reinterpret_cast<const float*>(smem + st * DIRECT_STAGE + DIRECT_S_BYTES);
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const float2 lo = *reinterpret_cast<const float2*>(rt + (8 * s + t) * DIRECT_RP + frag);
            const float2 hi = *reinterpret_cast<const float2*>(rt + (8 * s + t + 4) * DIRECT_RP + frag);
            fs[s][0] = tf32_rna(lo.x);
            fs[s][1] = tf32_rna(lo.y);
            fs[s][2] = tf32_rna(hi.x);
            fs[s][3] = tf32_rna(hi.y);
        }
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s)
            wgmma_tf32<256>(acc, fs[s], wgmma_desc_sw128(base + unsigned(st * DIRECT_STAGE + 32 * s)), 1);
        wgmma_commit();
        // into k-tile kt - 2's stage, whose wgmmas every warpgroup retired before the barrier
        if (kt + 2 < KT) load((kt + 2) % DIRECT_STAGES, kt + 2);
        cp_async_commit();
        wgmma_wait<1>();     // k-tile kt - 1's wgmmas done: its fragment set is free
    };
    int kt = 0;
    for (; kt + 1 < KT; kt += 2) {
        step(kt, f[0]);
        step(kt + 1, f[1]);
    }
    if (kt < KT) step(kt, f[0]);
    wgmma_wait<0>();
    cp_async_wait<0>();
    __syncthreads();  // every stage read: the window holds the C tile now

    // D -> shared memory in C's layout (C_T: 256 rows of 128 at stride 132; else 128 of 256 at
    // 260), float2 stores without bank conflicts; accumulator 4j + e is D row frag + (e >> 1),
    // column 8j + 2t + (e & 1).
    constexpr int ROWS = C_T ? 256 : 128, COLS = C_T ? 128 : 256, CP = COLS + 4;
    float* ct = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int j = 0; j < 32; ++j)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            if (C_T)
                *reinterpret_cast<float2*>(ct + (8 * j + 2 * t + u) * CP + frag) =
                    make_float2(acc[4 * j + u], acc[4 * j + 2 + u]);
            else
                *reinterpret_cast<float2*>(ct + (frag + u) * CP + 8 * j + 2 * t) =
                    make_float2(acc[4 * j + 2 * u], acc[4 * j + 2 * u + 1]);
        }
    __syncthreads();
    const int m0 = C_T ? s0 : r0, n0 = C_T ? r0 : s0;
    const bool read_c = !(beta == 0.f);
#pragma unroll 4
    for (int i = tid; i < ROWS * COLS / 4; i += 256) {
        const int row = i / (COLS / 4), q = i % (COLS / 4);
        const float4 v4 = *reinterpret_cast<const float4*>(ct + row * CP + 4 * q);
        const float v[4] = {v4.x, v4.y, v4.z, v4.w};
        store_vec<float, 4>(C, ldc, M, N, m0 + row, n0 + 4 * q, v, alpha, beta, read_c, c_vec);
    }
}

}  // namespace bigmm

// NN: A (M x K, rows along K) rounded ahead is S, B (K x N, rows along N) is R; C = D^T.
extern "C" __global__ void __launch_bounds__(256, 1)
gemm_direct_nn(int M, int N, int K, float alpha, const unsigned* __restrict__ A, long long lda,
               const float* __restrict__ B, long long ldb, float beta, float* __restrict__ C,
               long long ldc, int c_vec) {
    bigmm::direct_tile<true>(M, N, K, alpha, B, ldb, A, lda, beta, C, ldc, c_vec);
}

// TT: A stored K x M (rows along M) is R, B stored N x K (rows along K) rounded ahead is S;
// C = D.
extern "C" __global__ void __launch_bounds__(256, 1)
gemm_direct_tt(int M, int N, int K, float alpha, const float* __restrict__ A, long long lda,
               const unsigned* __restrict__ B, long long ldb, float beta, float* __restrict__ C,
               long long ldc, int c_vec) {
    bigmm::direct_tile<false>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, c_vec);
}

// S (rows x K, element (r, k) at X[r sr + k sk]) rounded to TF32 into Y (rows x ld, ld a
// multiple of 4 at least K, zero from K on): one thread per 4 consecutive k of a row.
extern "C" __global__ void __launch_bounds__(256)
round_rows(const float* __restrict__ X, long long sr, long long sk, int rows, int K,
           unsigned* __restrict__ Y, long long ld) {
    const long long quads = ld / 4;
    for (long long i = blockIdx.x * 256LL + threadIdx.x; i < rows * quads; i += gridDim.x * 256LL) {
        const long long r = i / quads;
        const int k = int(i % quads) * 4;
        unsigned v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = k + u < K ? bigmm::tf32_rna(X[r * sr + (k + u) * sk]) : 0u;
        *reinterpret_cast<uint4*>(Y + r * ld + k) = make_uint4(v[0], v[1], v[2], v[3]);
    }
}
