// bigmm's plain TF32 GEMM on Hopper's warpgroup tensor cores (sm_90a only) that reads one
// operand as it is stored: C = alpha * op(A) @ op(B) + beta * C in float32, row-major, any M,
// N, K, where one operand is contiguous along its side of C (R: NN's B along N, TT's A along M,
// stored R[k][r], 16-byte aligned rows) and the other along K (S: NN's A, TT's B, S[s][k]).
//
// wgmma takes TF32 operands from shared memory only K-major, but its first operand may come
// from registers in any layout.  So R is copied raw (16-byte cp.async) into a padded tile from
// which each thread loads its fragments and rounds them (tf32_rna), while S is rounded ahead by
// round_tiles into 256 x 32 tiles already in the 128-byte swizzle the descriptor reads, one
// after another (8 |S| bytes of traffic: the launcher takes this kernel where S is the small
// operand), each stage's S tile one bulk copy: D[r][s] = sum_k R[k][r] S[s][k], which is C (TT)
// or C^T (NN).  Every product is of values rounded to nearest, as the kernels rounding both
// operands ahead (gemm_wgmma_split.cu).
//  * Block: three warpgroups.  The third is the producer: per k-tile one thread issues the S
//    tile's bulk copy and its 128 threads the R tile's 16-byte copies, completing the stage's
//    "full" mbarrier; the two others (setmaxnreg: 232 registers against the producer's 40)
//    compute a D tile of 128 (r) x 256 (s), each k-step one wgmma.m64n256k8 a warpgroup with
//    its 64 rows of R from registers, accumulating in the wgmma (as cuBLAS's TF32 mode).  Four
//    stages of 49 KB (S 256 x 32, R 32 x 128 at row stride 136 floats).
//  * Fragments: logical rows g and g + 8 of a warp's 16 are stored rows 2g and 2g + 1, so that
//    each k-step is two conflict-free float2 loads (row stride 136 = 8 mod 32).
//  * Two fragment sets, used by alternate k-tiles: a k-tile's wgmmas stay in flight over the
//    next k-tile's wait, fragment loads and rounding, and are waited for before their set is
//    loaded again; then each consumer warp arrives on that stage's "empty" mbarrier, which the
//    producer waits for before refilling it (kernels/README.md has the variants measured).
//  * Epilogue: D through shared memory into C's layout (the consumers' named barrier), then
//    16-byte stores of whole rows.
#define BIGMM_WGMMA 1
#include "common.cuh"

namespace bigmm {

constexpr int DIRECT_STAGES = 4;
constexpr int DIRECT_S_BYTES = 256 * 128;            // S tile: 256 rows of 32 k
constexpr int DIRECT_RP = 136;                       // R tile row stride (floats)
constexpr int DIRECT_R_BYTES = 32 * DIRECT_RP * 4;   // R tile: 32 k of 128 r
constexpr int DIRECT_STAGE = DIRECT_S_BYTES + DIRECT_R_BYTES;
static_assert(DIRECT_STAGE % 1024 == 0, "every stage's S tile on a swizzle atom");

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// One arrival that also expects `bytes` of bulk copies to complete the phase.
__device__ __forceinline__ void mbar_arrive_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}

// An arrival once this thread's cp.async copies so far have landed (counted in the init).
__device__ __forceinline__ void mbar_arrive_copies(unsigned bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred p;\nWAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAIT_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}

__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes,
                                          unsigned bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
        ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, 256;" ::: "memory");
}

// The D tile at (r0, s0) = (128, 256) x block coordinates; C_T: C is D^T (NN).  S: the rounded
// tiles of round_tiles, (s tile, k-tile) at ((s tile) KT + k-tile) 32 KB.
template <bool C_T>
__device__ __forceinline__ void direct_tile(int M, int N, int K, float alpha,
                                            const float* __restrict__ R, long long ldr,
                                            const unsigned char* __restrict__ S, float beta,
                                            float* __restrict__ C, long long ldc, int c_vec) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = swizzle_aligned(smem_raw);
    const unsigned base = smem_addr(smem);
    const unsigned full = base + DIRECT_STAGES * DIRECT_STAGE, empty = full + 8 * DIRECT_STAGES;
    const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int RN = C_T ? N : M, SN = C_T ? M : N;  // rows of R (D's rows) and of S
    int tile_s, tile_r;
    swizzle_tile<8>(blockIdx.x, (SN + 255) / 256, (RN + 127) / 128, tile_s, tile_r);
    const int s0 = tile_s * 256, r0 = tile_r * 128;
    const int KT = (K + 31) / 32, KF = K / 32;  // k-tiles; those wholly inside K
    if (tid == 0) {
        for (int i = 0; i < DIRECT_STAGES; ++i) {
            mbar_init(full + 8 * i, 129);  // the bulk copy's arrival and 128 threads' copies
            mbar_init(empty + 8 * i, 8);   // the consumer warps
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (wg == 2) {  // the producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
        // R: chunk cr of k rows kr + 4 j (columns past RN zero-filled, k rows from K on too)
        const int p = tid - 256, cr = p % 32, kr = p / 32;
        const int rcol = r0 + 4 * cr, rbytes = 4 * max(0, min(4, RN - rcol));
        const float* r_row = rbytes ? R + rcol + (long long)kr * ldr : R;
        const unsigned char* s_tiles = S + (long long)tile_s * KT * DIRECT_S_BYTES;
        const unsigned rdst = unsigned(DIRECT_S_BYTES + (kr * DIRECT_RP + 4 * cr) * 4);
        for (int kt = 0; kt < KT; ++kt) {
            const int st = kt % DIRECT_STAGES;
            if (kt >= DIRECT_STAGES) mbar_wait(empty + 8 * st, (kt / DIRECT_STAGES - 1) & 1);
            const unsigned dst = base + unsigned(st * DIRECT_STAGE);
            if (p == 0) {
                mbar_arrive_expect(full + 8 * st, DIRECT_S_BYTES);
                bulk_copy(dst, s_tiles + (long long)kt * DIRECT_S_BYTES, DIRECT_S_BYTES, full + 8 * st);
            }
            const float* rk = r_row + (rbytes ? (long long)kt * 32 * ldr : 0);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int bytes = kt < KF || kt * 32 + kr + 4 * j < K ? rbytes : 0;
                cp_async<16>(dst + rdst + 4 * DIRECT_RP * 4 * j, bytes ? rk + j * 4 * ldr : R, bytes);
            }
            mbar_arrive_copies(full + 8 * st);
        }
        cp_async_wait<0>();
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    const int frag = 64 * wg + 16 * ((tid / 32) % 4) + 2 * g;  // this thread's stored R rows
    unsigned f[2][4][4];  // fragment sets of even and odd k-tiles
    auto step = [&](int kt, unsigned (&fs)[4][4]) {
        const int st = kt % DIRECT_STAGES;
        mbar_wait(full + 8 * st, (kt / DIRECT_STAGES) & 1);  // k-tile kt landed
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
        wgmma_wait<1>();  // k-tile kt - 1's wgmmas done: its fragment set and stage are free
        __syncwarp();
        if (kt > 0 && lane == 0) mbar_arrive(empty + 8 * ((kt - 1) % DIRECT_STAGES));
    };
    int kt = 0;
    for (; kt + 1 < KT; kt += 2) {
        step(kt, f[0]);
        step(kt + 1, f[1]);
    }
    if (kt < KT) step(kt, f[0]);
    wgmma_wait<0>();
    consumers_sync();  // every stage read (the producer's copies all landed): the window holds C

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
    consumers_sync();
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
extern "C" __global__ void __launch_bounds__(384, 1)
gemm_direct_nn(int M, int N, int K, float alpha, const unsigned char* __restrict__ A,
               const float* __restrict__ B, long long ldb, float beta, float* __restrict__ C,
               long long ldc, int c_vec) {
    bigmm::direct_tile<true>(M, N, K, alpha, B, ldb, A, beta, C, ldc, c_vec);
}

// TT: A stored K x M (rows along M) is R, B stored N x K (rows along K) rounded ahead is S;
// C = D.
extern "C" __global__ void __launch_bounds__(384, 1)
gemm_direct_tt(int M, int N, int K, float alpha, const float* __restrict__ A, long long lda,
               const unsigned char* __restrict__ B, float beta, float* __restrict__ C,
               long long ldc, int c_vec) {
    bigmm::direct_tile<false>(M, N, K, alpha, A, lda, B, beta, C, ldc, c_vec);
}

// S (rows x K, element (r, k) at X[r sr + k sk]) rounded to TF32 into Y: 256 x 32 tiles, tile
// (s tile, k-tile) at ((s tile) ceil(K / 32) + k-tile) 32 KB, each in the 128-byte swizzle
// (16-byte chunk c of row r at r 128 + 16 (c ^ (r mod 8))), zero past the rows and K: one thread
// per chunk.
extern "C" __global__ void __launch_bounds__(256)
round_tiles(const float* __restrict__ X, long long sr, long long sk, int rows, int K,
            unsigned char* __restrict__ Y) {
    const int KT = (K + 31) / 32;
    const long long chunks = (long long)((rows + 255) / 256) * KT * 2048;
    for (long long i = blockIdx.x * 256LL + threadIdx.x; i < chunks; i += gridDim.x * 256LL) {
        const long long tile = i / 2048;
        const int w = int(i % 2048), r = w / 8, c = w % 8;
        const long long row = (tile / KT) * 256 + r;
        const int k = int(tile % KT) * 32 + 4 * c;
        unsigned v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u)
            v[u] = row < rows && k + u < K ? bigmm::tf32_rna(X[row * sr + (k + u) * sk]) : 0u;
        *reinterpret_cast<uint4*>(Y + tile * 32768 + r * 128 + ((c ^ (r & 7)) << 4)) =
            make_uint4(v[0], v[1], v[2], v[3]);
    }
}
