// bigmm's TF32 GEMM family on Hopper's warpgroup tensor cores (wgmma.mma_async, sm_90a only):
// C = alpha * op(A) @ op(B) + beta * C in float32, row-major, any M, N, K and leading
// dimensions.  3xTF32 (-DBIGMM_TF32_PASSES=3, float32 accuracy) or plain TF32 (1), the same
// split and accuracy design as gemm_tf32.cu (mma.sync), which stays the family for sm_80 and
// wherever sm_90a is not available.
//
// Block: two warpgroups (256 threads), C tile BM = 128 rows x BN = 128 columns, k-tiles of
// BK = 32.  Warpgroup w owns rows [64 w, 64 w + 64) of the tile; each k-step of 8 is one
// wgmma.m64n128k8 per pass with A from registers and B from shared memory:
//  * Global -> shared: the family's loaders and load modes (common.cuh) into STAGES raw tiles
//    (cp.async, zero-filled k < 0, clamped rows), the same edges, views and split K as every
//    other family.  Raw tiles are S[k][r], except an A contiguous along K with 16-byte aligned
//    rows and K % 4 == 0 (LOAD_W: 16-byte copies into S[m][k], row stride BK + 4 floats; NN,
//    and NT with two register tiles), which element copies transposing on the way in slowed
//    down (measured: 61 -> 89 TFLOP/s at 8192^3).  The launcher uses it for launches that are
//    not split along K.
//  * B's split: once per k-tile, all threads read the raw B tile and write tf32(x) (and for
//    3xTF32 tf32(2^10 (x - tf32(x)))) into K-major tiles with the 128-byte swizzle that the
//    wgmma descriptor reads (8 rows x 128 bytes per 1024-byte atom, 16-byte chunk c of row r
//    stored at chunk c ^ (r % 8)).  Two such buffers alternate: the split of k-tile kt + 1
//    runs while the wgmmas of kt read the other.
//  * A's split: in registers, per fragment, right after its shared-memory load (float2 loads
//    at S[k][2g] as in gemm_tf32.cu: logical rows g and g + 8 of a warp's 16 are stored rows 2g
//    and 2g + 1).  From S[m][k] (LOAD_W) the k of each 8-step are permuted as well (logical t
//    and t + 4 are stored 2t and 2t + 1) so that {a0, a2} and {a1, a3} are float2 loads; B's
//    split then reads its k in the same order.
//  * B's columns are permuted in the swizzled tile so that a thread's accumulators come back as
//    runs of four consecutive columns of C (16-byte epilogue stores): logical wgmma column
//    16p + 8h + 2t + e holds C column 16p + 4t + 2h + e.
//
// Accumulation (3xTF32).  The tensor cores truncate when they add into their accumulator, so a
// long sum must not live there (kernels/README.md).  -DBIGMM_TF32_ACC selects the register tiles
// per warpgroup:
//  * 3 (the table's configs; measured 1.2-1.3x faster than 2): acc (the float32 result), bb and
//    cor.  Per k-step, cor += small*big and big*small (small parts scaled by 2^10: their
//    truncation is 2^-11 of the result's, so cor lives over all of K) and bb (+)= big*big, a
//    fresh sum per k-tile added to acc with FADD at its end: one rounding to nearest per 32 of K
//    (SGEMM rounds 32 times).  Result acc + 2^-10 cor.  The A fragments alternate between two
//    register sets; k-step s waits for the wgmmas of k-step s - 2.  250-254 registers.
//  * 2: acc and tmp.  Per k-tile three fresh sums in tmp, each added to acc (FFMA x 1 or
//    x 2^-10): big*big, small*big, big*small; the warpgroups take them in rotated orders so
//    that one's wait and addition overlap the other's wgmmas.  230-237 registers.
// Plain TF32 accumulates in the wgmma (like cuBLAS's TF32 mode).
// wgmma sits in no divergent path (ptxas would serialize it): operands are selected, not branched
// on, and the split after the last k-tile runs on a stale stage instead of behind a branch.
#define BIGMM_BODY bigmm::wgmma_body
#define BIGMM_EXTRA_ENTRIES                                                                    \
    BIGMM_ENTRY(gemm_wv, LOAD_W, LOAD_V)                                                       \
    BIGMM_ENTRY(gemm_ws, LOAD_W, LOAD_S)                                                       \
    BIGMM_ENTRY(gemm_wk, LOAD_W, LOAD_K)
#include "common.cuh"

namespace bigmm {

// ---- wgmma (sm_90a) -------------------------------------------------------------------------

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Ordinary shared-memory stores of this thread become visible to the async proxy (the wgmma
// operand reads) once a barrier follows.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Shared-memory matrix descriptor of a K-major operand tile with the 128-byte swizzle: start
// address >> 4 (bits 0-13), leading byte offset unused with this swizzle (1, bits 16-29),
// stride byte offset 1024 (8 rows of 128 bytes; >> 4 in bits 32-45), swizzle mode 1 (bits 62-63).
__device__ __forceinline__ unsigned long long wgmma_desc_sw128(unsigned addr) {
    const unsigned lo = ((addr & 0x3ffffu) >> 4) | (1u << 16);
    const unsigned hi = (1024u >> 4) | (1u << 30);
    return (static_cast<unsigned long long>(hi) << 32) | lo;
}

// D(64 x 128) = A(64 x 8) B(8 x 128) (+ D when scale_d) on the TF32 tensor cores, float32
// accumulators.  A from registers: a = {A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4]} of the
// warp's 16 rows (g = lane / 4, t = lane % 4); B from the descriptor (K-major, 128-byte
// swizzle).  d[4j + e]: row g + 8 (e >> 1), column 8j + 2t + (e & 1) of the warp's 16 rows.
__device__ __forceinline__ void wgmma_m64n128k8_tf32(float* d, const unsigned* a,
                                                     unsigned long long desc, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
          "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]),
          "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
          "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
          "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]),
          "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}

// ---- the block ----------------------------------------------------------------------------

template <class TL, int PASSES>
struct WgmmaShape {
    static constexpr int BM = TL::BM, BN = TL::BN, BK = TL::BK, NT = TL::NT;
    static constexpr int KSTEPS = BK / 8;                  // wgmma k-steps per k-tile
    static constexpr int ROW_BYTES = BK * 4;               // one K-major row of a split tile
    static constexpr int PART_BYTES = BN * ROW_BYTES;      // tf32(x) or the small parts
    static constexpr int PARTS = PASSES == 3 ? 2 : 1;
    static constexpr int SPLIT_BYTES = PARTS * PART_BYTES;  // one of the two split buffers
    static constexpr int QUADS = BK / 4;                   // 16-byte chunks per split row
    static constexpr int QUADS_PER_THREAD = BN * QUADS / NT;
    static constexpr int SKA = BK + 4;                     // row stride of a LOAD_W A tile
    static constexpr int A_FLOATS = BM * SKA;              // raw A tile, either layout
    static constexpr int STAGE = A_FLOATS + BK * TL::SB;   // floats per raw stage
    static_assert(BK * TL::SA <= A_FLOATS, "the S[k][m] A tile fits the stage's A part");
    static_assert(SKA % 32 == 4, "conflict-free float2 fragment loads from S[m][k]");
    static_assert(BM == 128 && BN == 128 && NT == 256, "two warpgroups of 64 x 128");
    static_assert(BK == 32, "a k-tile is one 128-byte swizzle row");
    static_assert(QUADS_PER_THREAD == KSTEPS, "one split chunk per k-step");
    static_assert(TL::SA % 16 == 8, "conflict-free float2 fragment loads: A row stride 8 mod 16");
    static_assert(TL::STAGES >= 3, "the split of k-tile kt + 1 needs its raw tile a period early");
};

// One thread's share of splitting raw B tile S[k][n] (row stride SB) into the K-major swizzled
// tile(s) at byte address `dst` of the shared window: chunk i of the thread's 16-byte chunks
// (4 consecutive logical k of one row; with PERM_K, logical k 8s + j is stored k 8s + 2j for
// j < 4 and 8s + 2(j - 4) + 1 after, the order of A's LOAD_W fragments).  Lanes take
// consecutive logical rows, so both the element loads (32 distinct columns) and the 16-byte
// stores (8 rows, 8 distinct swizzled chunks per quarter warp) are conflict-free.
template <class TL, int PASSES, bool PERM_K>
__device__ __forceinline__ void split_chunk(const float* raw_b, unsigned char* dst, int i, int tid) {
    typedef WgmmaShape<TL, PASSES> S;
    const int row = tid % TL::BN;                    // logical wgmma column (K-major row)
    const int kq = tid / TL::BN + i * (TL::NT / TL::BN);  // 16-byte chunk: k = 4 kq .. 4 kq + 3
    // C column held by logical column 16p + 8h + 2t + e: 16p + 4t + 2h + e.
    const int col = (row & ~15) | (((row >> 1) & 3) << 2) | (((row >> 3) & 1) << 1) | (row & 1);
    float x[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const int k = PERM_K ? 8 * (kq >> 1) + 2 * q + (kq & 1) : 4 * kq + q;
        x[q] = raw_b[k * TL::SB + col];
    }
    const int off = row * S::ROW_BYTES + ((kq ^ (row & 7)) << 4);
    if (PASSES == 3) {
        uint4 big, small;
        tf32_split(x[0], big.x, small.x);
        tf32_split(x[1], big.y, small.y);
        tf32_split(x[2], big.z, small.z);
        tf32_split(x[3], big.w, small.w);
        *reinterpret_cast<uint4*>(dst + off) = big;
        *reinterpret_cast<uint4*>(dst + S::PART_BYTES + off) = small;
    } else {
        *reinterpret_cast<uint4*>(dst + off) =
            make_uint4(tf32_rna(x[0]), tf32_rna(x[1]), tf32_rna(x[2]), tf32_rna(x[3]));
    }
}

template <class TL, class COMPUTE, int LA, int LB, bool CHECKS>
__device__ __forceinline__ void wgmma_body(int M, int N, int K, float alpha,
                                           const float* __restrict__ A, long long lda,
                                           const float* __restrict__ B, long long ldb, float beta,
                                           float* __restrict__ C, long long ldc, int c_vec,
                                           int k_chunk, long long c_zstride, const Checks&) {
    constexpr int PASSES = COMPUTE::PASSES, ACC = PASSES == 3 ? COMPUTE::ACC : 1;
    typedef WgmmaShape<TL, PASSES> S;
    constexpr int BM = TL::BM, BN = TL::BN, BK = TL::BK, NT = TL::NT, STAGES = TL::STAGES;
    constexpr int SA = TL::SA, STAGE = S::STAGE, KSTEPS = S::KSTEPS;
    constexpr bool W = LA == LOAD_W;  // A K-major in its raw tile: k permuted within 8-steps
    constexpr unsigned STAGE_BYTES = unsigned(STAGE) * 4u;
    static_assert(!CHECKS, "checksum updates are the float32 kernels' (cuda_kernels refuses them)");
    static_assert(PASSES == 1 || PASSES == 3, "TF32 (1 pass) or 3xTF32 (3 passes)");
    static_assert(ACC == 1 || ACC == 2 || ACC == 3, "register tiles per warpgroup");

    // Split K: block z multiplies [z * k_chunk, (z + 1) * k_chunk) into its own slice of C.
    {
        const int kz = blockIdx.z * k_chunk;
        K = min(k_chunk, K - kz);
        A += (LA == LOAD_K || LA == LOAD_W) ? (long long)kz : (long long)kz * lda;
        B += (LB == LOAD_K) ? (long long)kz : (long long)kz * ldb;
        C += blockIdx.z * c_zstride;
    }

    // Shared memory: the two split buffers first, at a 1024-byte boundary (the swizzle atoms),
    // then the STAGES raw tiles.
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
    float* raw = reinterpret_cast<float*>(smem + 2 * S::SPLIT_BYTES);
    const unsigned split_addr = smem_addr(smem), raw_addr = smem_addr(raw);

    const int tid = threadIdx.x;
    int tile_m, tile_n;
    swizzle_tile<8>(blockIdx.x, (M + BM - 1) / BM, (N + BN - 1) / BN, tile_m, tile_n);
    const int m0 = tile_m * BM, n0 = tile_n * BN;

    TileLoader<float, BM, BK, NT, W ? S::SKA : SA, LA> load_a;
    TileLoader<float, BN, BK, NT, TL::SB, LB> load_b;
    const int KT = (K + BK - 1) / BK;
    const int kstart = K - KT * BK;  // first tile is [kstart, kstart + BK), kstart in (-BK, 0]
    load_a.init(A, lda, m0, M, kstart, tid, raw_addr);
    load_b.init(B, ldb, n0, N, kstart, tid, raw_addr + unsigned(S::A_FLOATS) * 4u);

    // Warpgroup wg, warp w in it, lane (g, t): fragment rows 64 wg + 16 w + {2g, 2g + 1}, k t
    // and t + 4 of each 8-step (stored 2t and 2t + 1 in a LOAD_W tile).
    const int wg = tid / 128, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int frag_row = 64 * wg + 16 * ((tid / 32) % 4) + 2 * g;
    const int frag_off = W ? frag_row * S::SKA + 2 * t : t * SA + frag_row;

    // acc: the float32 result; tmp: a fresh wgmma sum (3xTF32); cor (ACC 3): 2^10 times the
    // correction terms, accumulated in the wgmma over all of K.
    float acc[64], tmp[64], cor[ACC == 3 ? 64 : 1];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 64; ++i) tmp[i] = 0.f;
#pragma unroll
    for (int i = 0; i < (ACC == 3 ? 64 : 1); ++i) cor[i] = 0.f;

    // Prologue: raw tiles 0 .. STAGES-2 in flight; tiles 0 and 1 landed; tile 0 split.
    if (KT > 0) {
        load_a.template load<true>(0, kstart);
        load_b.template load<true>(0, kstart);
    }
    cp_async_commit();
#pragma unroll
    for (int s = 1; s < STAGES - 1; ++s) {
        if (s < KT) {
            load_a.template load<false>(s * STAGE_BYTES, 0);
            load_b.template load<false>(s * STAGE_BYTES, 0);
        }
        cp_async_commit();
    }
    cp_async_wait<STAGES - 3>();
    __syncthreads();
    if (KT > 0) {
#pragma unroll
        for (int i = 0; i < KSTEPS; ++i) split_chunk<TL, PASSES, W>(raw + S::A_FLOATS, smem, i, tid);
    }
    fence_proxy_async();
    __syncthreads();

    int write_stage = STAGES - 1;
    for (int kt = 0; kt < KT; ++kt) {
        // Raw stage write_stage held k-tile kt - 1: its fragments were read in period kt - 1 and
        // its split in period kt - 2, both before the barrier that ended period kt - 1.
        if (kt + STAGES - 1 < KT) {
            load_a.template load<false>(write_stage * STAGE_BYTES, 0);
            load_b.template load<false>(write_stage * STAGE_BYTES, 0);
        }
        cp_async_commit();
        write_stage = (write_stage + 1 == STAGES) ? 0 : write_stage + 1;

        const int cur = kt % STAGES, nxt = (kt + 1) % STAGES;
        const float* frag_src = raw + cur * STAGE + frag_off;
        const float* next_b = raw + nxt * STAGE + S::A_FLOATS;
        unsigned char* next_split = smem + ((kt + 1) & 1) * S::SPLIT_BYTES;
        const unsigned split_cur = split_addr + unsigned((kt & 1) * S::SPLIT_BYTES);

        // A fragments of k-step s, split in registers: fb = tf32(x), fs = the small parts.
        auto load_frag = [&](int s, unsigned* fb, unsigned* fs) {
            float x[4];  // {A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4]} of the warp's 16 rows
            if (W) {
                const float2 r0 = *reinterpret_cast<const float2*>(frag_src + 8 * s);
                const float2 r1 = *reinterpret_cast<const float2*>(frag_src + S::SKA + 8 * s);
                x[0] = r0.x, x[1] = r1.x, x[2] = r0.y, x[3] = r1.y;
            } else {
                const float2 lo = *reinterpret_cast<const float2*>(frag_src + 8 * s * SA);
                const float2 hi = *reinterpret_cast<const float2*>(frag_src + (8 * s + 4) * SA);
                x[0] = lo.x, x[1] = lo.y, x[2] = hi.x, x[3] = hi.y;
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (PASSES == 3) tf32_split(x[e], fb[e], fs[e]);
                else fb[e] = tf32_rna(x[e]);
            }
        };
        unsigned fb[KSTEPS][4], fs[KSTEPS][4];
        if (PASSES == 1 || ACC == 2) {
#pragma unroll
            for (int s = 0; s < KSTEPS; ++s) load_frag(s, fb[s], fs[s]);
        }

        // The split of k-tile kt + 1 runs while this k-tile's wgmmas do (after the last k-tile it
        // splits a stale raw stage into the idle buffer: harmless, and no branch around wgmma).
        if (PASSES == 1) {
            wgmma_fence();
#pragma unroll
            for (int s = 0; s < KSTEPS; ++s)
                wgmma_m64n128k8_tf32(acc, fb[s], wgmma_desc_sw128(split_cur + 32u * s), 1);
            wgmma_commit();
#pragma unroll
            for (int i = 0; i < KSTEPS; ++i) split_chunk<TL, PASSES, W>(next_b, next_split, i, tid);
            wgmma_wait<0>();
        } else if (ACC == 3) {
            // Per k-step: the corrections into cor (over all of K), big*big into bb (a fresh sum
            // per k-tile, added to acc at its end).  Fragments alternate between two register
            // sets: k-step s waits for the wgmmas of k-step s - 2 before it overwrites theirs.
#pragma unroll
            for (int s = 0; s < KSTEPS; ++s) {
                if (s >= 2) wgmma_wait<1>();
                load_frag(s, fb[s & 1], fs[s & 1]);
                wgmma_fence();
                wgmma_m64n128k8_tf32(cor, fs[s & 1], wgmma_desc_sw128(split_cur + 32u * s), 1);
                wgmma_m64n128k8_tf32(
                    cor, fb[s & 1], wgmma_desc_sw128(split_cur + S::PART_BYTES + 32u * s), 1);
                wgmma_m64n128k8_tf32(tmp, fb[s & 1], wgmma_desc_sw128(split_cur + 32u * s), s > 0);
                wgmma_commit();
                split_chunk<TL, PASSES, W>(next_b, next_split, s, tid);
            }
            wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < 64; ++i) acc[i] += tmp[i];
        } else {
            // Three groups of KSTEPS wgmmas, each a fresh sum in tmp added to acc: big*big (x 1),
            // small*big and big*small (x 2^-10).  Warpgroup 1 starts at the second: while one
            // warpgroup waits on its group and adds it, the other's group keeps the tensor cores
            // busy.  Operands are selected, not branched on: no wgmma sits in a divergent path.
#pragma unroll
            for (int phase = 0; phase < 3; ++phase) {
                int group = phase + wg;
                group = group >= 3 ? group - 3 : group;
                const unsigned b_part = group == 2 ? unsigned(S::PART_BYTES) : 0u;
                unsigned a[KSTEPS][4];
#pragma unroll
                for (int s = 0; s < KSTEPS; ++s)
#pragma unroll
                    for (int e = 0; e < 4; ++e) a[s][e] = group == 1 ? fs[s][e] : fb[s][e];
                wgmma_fence();
#pragma unroll
                for (int s = 0; s < KSTEPS; ++s)
                    wgmma_m64n128k8_tf32(tmp, a[s], wgmma_desc_sw128(split_cur + b_part + 32u * s),
                                         s > 0);
                wgmma_commit();
                // the split chunks of k-tile kt + 1: 2, 1, 1 over the three phases
#pragma unroll
                for (int i = (phase == 0 ? 0 : phase + 1); i < (phase == 0 ? 2 : phase + 2); ++i)
                    split_chunk<TL, PASSES, W>(next_b, next_split, i, tid);
                wgmma_wait<0>();
                const float scale = group == 0 ? 1.f : 1.f / TF32_SMALL_SCALE;
#pragma unroll
                for (int i = 0; i < 64; ++i) acc[i] = __fmaf_rn(tmp[i], scale, acc[i]);
            }
        }
        fence_proxy_async();  // the split of k-tile kt + 1, for the wgmmas of the next period
        cp_async_wait<STAGES - 3>();  // raw k-tile kt + 2, split in the next period
        __syncthreads();
    }
    cp_async_wait<0>();

    // Epilogue: thread holds rows 64 wg + 16 w + 2g + h (h = 0, 1) and, per p < 8, the four
    // columns 16p + 4t .. 16p + 4t + 3 (accumulators 8p + 4c' + 2h + e for column 4t + 2c' + e).
    const bool read_c = !(beta == 0.f);
    const int row0 = 64 * wg + 16 * ((tid / 32) % 4) + 2 * g;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int p = 0; p < BN / 16; ++p) {
            float v[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int i = 8 * p + 4 * (c >> 1) + 2 * h + (c & 1);
                v[c] = ACC == 3 ? __fmaf_rn(cor[i % (ACC == 3 ? 64 : 1)], 1.f / TF32_SMALL_SCALE, acc[i])
                                : acc[i];
            }
            store_vec<float, 4>(C, ldc, M, N, m0 + row0 + h, n0 + 16 * p + 4 * t, v, alpha, beta,
                                read_c, c_vec);
        }
}

// The compute policy: PASSES (3: 3xTF32, 1: TF32) and, for 3xTF32, ACC: the register tiles
// per warpgroup (2: acc and tmp, three fresh sums per k-tile; 3: acc, tmp and cor, see above).
template <int PASSES_, int ACC_>
struct WgmmaCompute {
    static constexpr int PASSES = PASSES_, ACC = ACC_;
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
#ifndef BIGMM_STAGES
#define BIGMM_STAGES 4
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
#define BIGMM_TF32_ACC 2  // 3xTF32 register tiles: 2 (acc, tmp) or 3 (acc, tmp, cor)
#endif
#ifndef BIGMM_CHECKS
#define BIGMM_CHECKS 0
#endif

// The family's Tile counts threads per 16-row warp slice: BM / 16 warps of 32 (two warpgroups).
typedef bigmm::Tile<float, BIGMM_BM, BIGMM_BN, BIGMM_BK, 16, BIGMM_BN, 0, 0, BIGMM_STAGES,
                    BIGMM_PAD_BYTES>
    BigmmTile;
typedef bigmm::WgmmaCompute<BIGMM_TF32_PASSES, BIGMM_TF32_ACC> BigmmCompute;

BIGMM_DEFINE_ENTRIES
