// bigmm's plain TF32 GEMM on Hopper's warpgroup tensor cores (sm_90a only) that reads both
// operands as they are stored: C = alpha * op(A) @ op(B) + beta * C in float32, row-major, any
// M, N, K, where one operand is contiguous along its side of C (R: NN's B along N, TT's A along
// M, stored R[k][r]) and the other along K (S: NN's A, TT's B, S[s][k]).
//
// The tiles come through the TMA unit from TFLOAT32 tensor maps, which round float32 to TF32
// (to nearest, ties to even) on the way into shared memory: no rounding pass, no rounding
// instructions, zeros past the edges.  wgmma takes TF32 operands from shared memory only
// K-major, but its first operand may come from registers in any layout.  So S (K-major) lands
// in the 128-byte swizzle the descriptor reads, a 256 x 32 box a stage, and R in four 32 x 32
// boxes (the same swizzle) from which each thread loads its fragments with two conflict-free
// float2 loads a k-step: D[r][s] = sum_k R[k][r] S[s][k], which is C (TT) or C^T
// (NN).  Where S's rows are not 16-byte aligned (no tensor map), round_tiles rounds it ahead
// into the same tiles, one bulk copy a stage.
//  * Block: three warpgroups.  One thread of the third issues a stage's copies and the bytes
//    complete its "full" mbarrier; the two others (setmaxnreg: 232 registers against the
//    producer's 40) compute a D tile of 128 (r) x 256 (s), each k-step one wgmma.m64n256k8 a
//    warpgroup with its 64 rows of R from registers, accumulating in the wgmma (as cuBLAS's
//    TF32 mode).  Four stages of 48 KB (S 256 x 32, R 32 x 128).
//  * Fragments: logical rows g and g + 8 of a warp are two adjacent rows of R, the warp's 16
//    rows spread over a box's chunks so that no two threads of a half-warp share banks.
//  * Two fragment sets, used by alternate k-tiles: a k-tile's wgmmas stay in flight over the
//    next k-tile's wait and fragment loads, and are waited for before their set is loaded
//    again; then each consumer warp arrives on that stage's "empty" mbarrier, which the
//    producer waits for before refilling it (kernels/README.md has the variants measured).
//  * Epilogue: D through shared memory into C's layout (the consumers' named barrier), then
//    16-byte stores of whole rows, old C (beta != 0) loaded 8 runs at a time and its tile
//    prefetched into L2 by the producer once its last copies are issued.
#define BIGMM_WGMMA 1
#include "common.cuh"

namespace bigmm {

constexpr int DIRECT_STAGES = 4;
constexpr int DIRECT_S_BYTES = 256 * 128;            // S tile: 256 rows of 32 k
constexpr int DIRECT_BOX_BYTES = 32 * 128;           // R box: 32 k of 32 r
constexpr int DIRECT_R_BYTES = 4 * DIRECT_BOX_BYTES; // R tile: 32 k of 128 r
constexpr int DIRECT_STAGE = DIRECT_S_BYTES + DIRECT_R_BYTES;
static_assert(DIRECT_STAGE % 1024 == 0, "every stage's S tile on a swizzle atom");

// A CUtensorMap (the driver's encoding of a 2-D tensor map), passed by value.
struct alignas(64) TmaMap {
    unsigned long long words[16];
};

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

// The box at (x, y) (x along the contiguous dimension) of a tensor map into shared memory.
__device__ __forceinline__ void tma_load(unsigned dst, const TmaMap* map, int x, int y,
                                         unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];"
        ::"r"(dst), "l"(map), "r"(x), "r"(y), "r"(bar) : "memory");
}

__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, 256;" ::: "memory");
}

// The D tile at (r0, s0) = (128, 256) x block coordinates; C_T: C is D^T (NN).  S from its
// tensor map, or (s_tiles not null) the rounded tiles of round_tiles, (s tile, k-tile) at
// ((s tile) KT + k-tile) 32 KB.
template <bool C_T>
__device__ __forceinline__ void direct_tile(int M, int N, int K, float alpha, const TmaMap* r_map,
                                            const TmaMap* s_map,
                                            const unsigned char* __restrict__ s_tiles, float beta,
                                            float* __restrict__ C, long long ldc, int c_vec) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = swizzle_aligned(smem_raw);
    const unsigned base = smem_addr(smem);
    const unsigned full = base + DIRECT_STAGES * DIRECT_STAGE, empty = full + 8 * DIRECT_STAGES;
    const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int RN = C_T ? N : M, SN = C_T ? M : N;  // rows of R (D's rows) and of S
    int tile_s, tile_r;
    // groups of 8 R tiles (8 S tiles ran large products at 0.52-0.77x: kernels/README.md)
    swizzle_tile<8>(blockIdx.x, (RN + 127) / 128, (SN + 255) / 256, tile_r, tile_s);
    const int s0 = tile_s * 256, r0 = tile_r * 128;
    const int KT = (K + 31) / 32;
    if (tid == 0) {
        for (int i = 0; i < DIRECT_STAGES; ++i) {
            mbar_init(full + 8 * i, 1);   // the producer's arrival; the bytes complete it
            mbar_init(empty + 8 * i, 8);  // the consumer warps
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (wg == 2) {  // the producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
        if (tid != 256) return;
        asm volatile("prefetch.tensormap [%0];" ::"l"(r_map) : "memory");
        if (!s_tiles) asm volatile("prefetch.tensormap [%0];" ::"l"(s_map) : "memory");
        const unsigned char* s_src = s_tiles + (long long)tile_s * KT * DIRECT_S_BYTES;
        for (int kt = 0; kt < KT; ++kt) {
            const int st = kt % DIRECT_STAGES;
            if (kt >= DIRECT_STAGES) mbar_wait(empty + 8 * st, (kt / DIRECT_STAGES - 1) & 1);
            const unsigned dst = base + unsigned(st * DIRECT_STAGE), bar = full + 8 * st;
            mbar_arrive_expect(bar, DIRECT_STAGE);
            if (s_tiles)
                bulk_copy(dst, s_src + (long long)kt * DIRECT_S_BYTES, DIRECT_S_BYTES, bar);
            else
                tma_load(dst, s_map, 32 * kt, s0, bar);
#pragma unroll
            for (int j = 0; j < 4; ++j)
                tma_load(dst + DIRECT_S_BYTES + j * DIRECT_BOX_BYTES, r_map, r0 + 32 * j, 32 * kt,
                         bar);
        }
        if (!(beta == 0.f) && c_vec) {  // the epilogue reads C: its tile into L2 meanwhile
            const int m0 = C_T ? s0 : r0, n0 = C_T ? r0 : s0, rows = C_T ? 256 : 128;
            const int cols = min(C_T ? 128 : 256, N - n0);
            for (int i = 0; i < rows && m0 + i < M && cols >= 4; ++i)
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;"
                             ::"l"(C + (long long)(m0 + i) * ldc + n0), "r"(4 * (cols & ~3))
                             : "memory");
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    // This thread's R rows, frag and frag + 1 (its fragments' rows g and g + 8), in box `box`
    // at 16-byte chunk `chunk` (before the swizzle): each half-warp's float2 loads of a k-step
    // then fall on 8 different chunks of 4 rows, conflict-free.
    const int wi = (tid / 32) % 4, box = 2 * wg + wi / 2;
    const int chunk = 4 * ((g >> 1) & 1) + (g >> 2) + 2 * (wi & 1);
    const int frag = 32 * box + 4 * chunk + 2 * (g & 1);
    const int at = box * (DIRECT_BOX_BYTES / 4) + 2 * (g & 1);
    unsigned f[2][4][4];  // fragment sets of even and odd k-tiles
    auto step = [&](int kt, unsigned (&fs)[4][4]) {
        const int st = kt % DIRECT_STAGES;
        mbar_wait(full + 8 * st, (kt / DIRECT_STAGES) & 1);  // k-tile kt landed
        const float* rt =
            reinterpret_cast<const float*>(smem + st * DIRECT_STAGE + DIRECT_S_BYTES) + at;
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const uint2 lo = *reinterpret_cast<const uint2*>(rt + (8 * s + t) * 32 + 4 * (chunk ^ t));
            const uint2 hi =
                *reinterpret_cast<const uint2*>(rt + (8 * s + t + 4) * 32 + 4 * (chunk ^ (t + 4)));
            fs[s][0] = lo.x;
            fs[s][1] = lo.y;
            fs[s][2] = hi.x;
            fs[s][3] = hi.y;
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
    constexpr int RUNS = ROWS * COLS / 4 / 256, BATCH = 8;  // a thread's 4-float runs
    auto place = [&](int j, int& row, int& col) {
        const int i = tid + 256 * j;
        row = m0 + i / (COLS / 4);
        col = n0 + 4 * (i % (COLS / 4));
    };
    auto value = [&](int j, float* v) {
        const int i = tid + 256 * j;
        const float4 v4 = *reinterpret_cast<const float4*>(ct + (i / (COLS / 4)) * CP
                                                           + 4 * (i % (COLS / 4)));
        v[0] = v4.x, v[1] = v4.y, v[2] = v4.z, v[3] = v4.w;
    };
#pragma unroll 1
    for (int i0 = 0; i0 < RUNS; i0 += BATCH)
        store_batch<BATCH>(C, ldc, M, N, i0, alpha, beta, read_c, c_vec, place, value);
}

}  // namespace bigmm

// NN: A (M x K, rows along K) is S, B (K x N, rows along N) is R; C = D^T.  a_tiles: A rounded
// ahead (null: through a_map).
extern "C" __global__ void __launch_bounds__(384, 1)
gemm_direct_nn(int M, int N, int K, float alpha, const __grid_constant__ bigmm::TmaMap a_map,
               const unsigned char* __restrict__ a_tiles,
               const __grid_constant__ bigmm::TmaMap b_map, float beta, float* __restrict__ C,
               long long ldc, int c_vec) {
    bigmm::direct_tile<true>(M, N, K, alpha, &b_map, &a_map, a_tiles, beta, C, ldc, c_vec);
}

// TT: A stored K x M (rows along M) is R, B stored N x K (rows along K) is S; C = D.  b_tiles:
// B rounded ahead (null: through b_map).
extern "C" __global__ void __launch_bounds__(384, 1)
gemm_direct_tt(int M, int N, int K, float alpha, const __grid_constant__ bigmm::TmaMap a_map,
               const __grid_constant__ bigmm::TmaMap b_map,
               const unsigned char* __restrict__ b_tiles, float beta, float* __restrict__ C,
               long long ldc, int c_vec) {
    bigmm::direct_tile<false>(M, N, K, alpha, &a_map, &b_map, b_tiles, beta, C, ldc, c_vec);
}

// S (rows x K, element (r, k) at X[r sr + k sk]) rounded to TF32 (tf32_rne, as the tensor maps
// round) into Y: 256 x 32 tiles, tile
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
            v[u] = row < rows && k + u < K ? bigmm::tf32_rne(X[row * sr + (k + u) * sk]) : 0u;
        *reinterpret_cast<uint4*>(Y + tile * 32768 + r * 128 + ((c ^ (r & 7)) << 4)) =
            make_uint4(v[0], v[1], v[2], v[3]);
    }
}
