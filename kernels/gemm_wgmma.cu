// bigmm's TF32 GEMM family on Hopper's warpgroup tensor cores (wgmma.mma_async, sm_90a only):
// C = alpha * op(A) @ op(B) + beta * C in float32, row-major, any M, N, K and leading
// dimensions.  3xTF32 (-DBIGMM_TF32_PASSES=3, float32 accuracy) or plain TF32 (1), the same
// split and accuracy design as gemm_tf32.cu (mma.sync), which stays the family for sm_80 and
// wherever sm_90a is not available.
//
// Block: two warpgroups (256 threads), C tile BM = 128 rows x BN = 128 columns (plain TF32 also
// 128 x 256), k-tiles of BK = 32.  Warpgroup w owns rows [64 w, 64 w + 64) of the tile; each
// k-step of 8 is one wgmma.m64nBNk8 per pass with A from registers and B from shared memory:
//  * Global -> shared: the family's loaders and load modes (common.cuh) into STAGES raw tiles
//    (cp.async, zero-filled k < 0, clamped rows), the same edges, views and split K as every
//    other family.  Raw tiles are S[k][r], except an A contiguous along K with 16-byte aligned
//    rows and K % 4 == 0 (LOAD_W: 16-byte copies into S[m][k], row stride BK + 4 floats; NN
//    and NT), which element copies transposing on the way in slowed down (measured: 61 -> 89
//    TFLOP/s at 8192^3).  The launcher uses it for launches that are not split along K.
//  * B's split: once per k-tile, all threads read the raw B tile and write tf32(x) (and for
//    3xTF32 tf32(2^10 (x - tf32(x)))) into K-major tiles with the 128-byte swizzle that the
//    wgmma descriptor reads (8 rows x 128 bytes per 1024-byte atom, 16-byte chunk c of row r
//    stored at chunk c ^ (r % 8)).  SPLITS (2 or 3) such buffers rotate: the split of k-tile
//    kt + 1 runs while the wgmmas of kt read another.
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
// long sum must not live there (kernels/README.md).  Three 64 x 128 register tiles per
// warpgroup: acc (the float32 result), tmp and cor.  Per k-step, cor += small*big and big*small
// (small parts scaled by 2^10: their truncation is 2^-11 of the result's, so cor lives over all
// of K) and tmp (+)= big*big, a fresh sum per k-tile added to acc with FADD: one rounding to
// nearest per 32 of K (SGEMM rounds 32 times).  Result acc + 2^-10 cor.  Plain TF32
// accumulates in the wgmma (like cuBLAS's TF32 mode).
//
// Schedules.  -DBIGMM_WG_PIPE=0: every k-tile ends with all its wgmmas drained and a block
// barrier (measured ~15% of the time).  -DBIGMM_WG_PIPE=1: wgmma groups stay in flight across
// k-tiles and the barrier; with three split buffers the split of kt + 1 writes the buffer of
// kt - 2, done before the barrier that ended period kt - 1, so one barrier a k-tile suffices
// (two buffers: a second barrier, before the split, once the previous k-tile's wgmmas are done).
// 3xTF32 must add tmp to acc while other wgmmas run, and ptxas serializes a loop's wgmmas when
// it reads an accumulator while a group of the previous iteration is pending (even one that
// does not own it), so the loop is rotated: the next k-tile's first corrections are issued at the end of a period, then the
// wait that leaves only them pending, then the FADD; the next period starts tmp afresh with a
// wgmma that only writes it.  Every wait, fence and accumulator access then sits where ptxas can
// see it within one iteration (no "wgmma serialized" warnings; scripts/check_kernels.py).
// Measured on the H100 (kernels/README.md): pipelined 3xTF32 0.95-1.0x the draining schedule
// (the drain was not the bound), pipelined 128 x 256 TF32 1.2x the draining 128 x 128 one.
// wgmma sits in no divergent path (ptxas would serialize it): operands are selected, not branched
// on, and the split after the last k-tile runs on a stale stage instead of behind a branch.
#define BIGMM_BODY bigmm::wgmma_body
#define BIGMM_EXTRA_ENTRIES                                                                    \
    BIGMM_ENTRY(gemm_wv, LOAD_W, LOAD_V)                                                       \
    BIGMM_ENTRY(gemm_ws, LOAD_W, LOAD_S)                                                       \
    BIGMM_ENTRY(gemm_wk, LOAD_W, LOAD_K)
#define BIGMM_WGMMA 1
#include "common.cuh"

namespace bigmm {

// ---- wgmma (sm_90a): fences, waits, descriptors and the wgmmas are common.cuh's -------

// x where keep, else 0, as one select that the compiler cannot turn into a branch.
__device__ __forceinline__ unsigned select_or_zero(unsigned x, bool keep) {
    unsigned r;
    asm("{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\nselp.b32 %0, %1, 0, q;\n}\n"
        : "=r"(r) : "r"(x), "r"(int(keep)));
    return r;
}

// ---- the block ----------------------------------------------------------------------------

template <class TL, int PASSES, int SPLITS>
struct WgmmaShape {
    static constexpr int BM = TL::BM, BN = TL::BN, BK = TL::BK, NT = TL::NT;
    static constexpr int KSTEPS = BK / 8;                  // wgmma k-steps per k-tile
    static constexpr int ROW_BYTES = BK * 4;               // one K-major row of a split tile
    static constexpr int PART_BYTES = BN * ROW_BYTES;      // tf32(x) or the small parts
    static constexpr int PARTS = PASSES == 3 ? 2 : 1;
    static constexpr int SPLIT_BYTES = PARTS * PART_BYTES;  // one of the SPLITS split buffers
    static constexpr int QUADS = BK / 4;                   // 16-byte chunks per split row
    static constexpr int QUADS_PER_THREAD = BN * QUADS / NT;
    static constexpr int CHUNKS_PER_STEP = QUADS_PER_THREAD / KSTEPS;
    static constexpr int ACC_N = BN / 2;                   // accumulators per thread and tile
    static constexpr int SKA = BK + 4;                     // row stride of a LOAD_W A tile
    static constexpr int A_FLOATS = BM * SKA;              // raw A tile, either layout
    static constexpr int STAGE = A_FLOATS + BK * TL::SB;   // floats per raw stage
    static_assert(BK * TL::SA <= A_FLOATS, "the S[k][m] A tile fits the stage's A part");
    static_assert(SKA % 32 == 4, "conflict-free float2 fragment loads from S[m][k]");
    static_assert(BM == 128 && NT == 256, "two warpgroups of 64 rows");
    static_assert(BN == 128 || (BN == 256 && PASSES == 1), "64 x 128 (3xTF32) or 64 x 256 per warpgroup");
    static_assert(BK == 32, "a k-tile is one 128-byte swizzle row");
    static_assert(CHUNKS_PER_STEP * KSTEPS == QUADS_PER_THREAD, "whole split chunks per k-step");
    static_assert(TL::SA % 16 == 8, "conflict-free float2 fragment loads: A row stride 8 mod 16");
    static_assert(TL::STAGES >= 3, "the split of k-tile kt + 1 needs its raw tile a period early");
    static_assert(SPLITS == 2 || SPLITS == 3, "two or three split buffers");
};

// One thread's share of splitting raw B tile S[k][n] (row stride SB) into the K-major swizzled
// tile(s) at byte address `dst` of the shared window: chunk i of the thread's 16-byte chunks
// (4 consecutive logical k of one row; with PERM_K, logical k 8s + j is stored k 8s + 2j for
// j < 4 and 8s + 2(j - 4) + 1 after, the order of A's LOAD_W fragments).  Lanes take
// consecutive logical rows, so both the element loads (32 distinct columns) and the 16-byte
// stores (8 rows, 8 distinct swizzled chunks per quarter warp) are conflict-free.
template <class TL, int PASSES, int SPLITS, bool PERM_K>
__device__ __forceinline__ void split_chunk(const float* raw_b, unsigned char* dst, int i, int tid) {
    typedef WgmmaShape<TL, PASSES, SPLITS> S;
    constexpr int RB = TL::NT / TL::BN;              // chunks a k row gets per pass: 1 or 2
    const int row = tid % TL::BN;                    // logical wgmma column (K-major row)
    const int kq0 = tid / TL::BN;                    // chunk kq = kq0 + i RB: k = 4 kq .. 4 kq + 3
    // C column held by logical column 16p + 8h + 2t + e: 16p + 4t + 2h + e.
    const int col = (row & ~15) | (((row >> 1) & 3) << 2) | (((row >> 3) & 1) << 1) | (row & 1);
    // Element q's stored k: kq0's part (a register, the same for all chunks) plus a constant.
    const float* src = raw_b + (PERM_K ? kq0 : 4 * kq0) * TL::SB + col;
    float x[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const int kd = PERM_K ? 8 * ((i * RB) >> 1) + 2 * q + ((i * RB) & 1) : 4 * i * RB + q;
        x[q] = src[kd * TL::SB];
    }
    // Swizzled byte offset: 16-byte chunk kq ^ (row % 8) of the row.  kq0 < RB, so chunk i's
    // offset is chunk 0's with (i RB) << 4 xor-ed in, here and not hoisted out of the main loop
    // (a register per chunk would not fit beside the accumulators).
    int off = row * S::ROW_BYTES + ((kq0 ^ (row & 7)) << 4);
    if (i > 0) asm volatile("xor.b32 %0, %0, %1;\n" : "+r"(off) : "r"((i * RB) << 4));
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
            make_uint4(tf32_rne(x[0]), tf32_rne(x[1]), tf32_rne(x[2]), tf32_rne(x[3]));
    }
}

template <class TL, class COMPUTE, int LA, int LB, bool CHECKS>
__device__ __forceinline__ void wgmma_body(int M, int N, int K, float alpha,
                                           const float* __restrict__ A, long long lda,
                                           const float* __restrict__ B, long long ldb, float beta,
                                           float* __restrict__ C, long long ldc, int c_vec,
                                           int k_chunk, long long c_zstride, const Checks&) {
    constexpr int PASSES = COMPUTE::PASSES, SPLITS = COMPUTE::SPLITS;
    constexpr bool PIPE = COMPUTE::PIPE;
    typedef WgmmaShape<TL, PASSES, SPLITS> S;
    constexpr int BM = TL::BM, BN = TL::BN, BK = TL::BK, NT = TL::NT, STAGES = TL::STAGES;
    constexpr int SA = TL::SA, STAGE = S::STAGE, KSTEPS = S::KSTEPS, CPS = S::CHUNKS_PER_STEP;
    constexpr int ACC_N = S::ACC_N, COR_N = PASSES == 3 ? ACC_N : 1;
    constexpr bool W = LA == LOAD_W;  // A K-major in its raw tile: k permuted within 8-steps
    constexpr unsigned STAGE_BYTES = unsigned(STAGE) * 4u;
    static_assert(!CHECKS, "checksum updates are the float32 kernels' (cuda_kernels refuses them)");
    static_assert(PASSES == 1 || PASSES == 3, "TF32 (1 pass) or 3xTF32 (3 passes)");
    static_assert(PIPE || SPLITS == 2, "the draining schedule alternates two split buffers");

    // Split K: block z multiplies [z * k_chunk, (z + 1) * k_chunk) into its own slice of C.
    {
        const int kz = blockIdx.z * k_chunk;
        K = min(k_chunk, K - kz);
        A += (LA == LOAD_K || LA == LOAD_W) ? (long long)kz : (long long)kz * lda;
        B += (LB == LOAD_K) ? (long long)kz : (long long)kz * ldb;
    }

    // Shared memory: the SPLITS split buffers first, at a 1024-byte boundary (the swizzle
    // atoms), then the STAGES raw tiles.
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = swizzle_aligned(smem_raw);
    float* raw = reinterpret_cast<float*>(smem + SPLITS * S::SPLIT_BYTES);
    const unsigned split_addr = smem_addr(smem), raw_addr = smem_addr(raw);

    const int tid = threadIdx.x;
    int tile_m, tile_n;
    swizzle_tile<8>(blockIdx.x, (M + BM - 1) / BM, (N + BN - 1) / BN, tile_m, tile_n);
    const int m0 = tile_m * BM, n0 = tile_n * BN;
    if (below_diagonal(m0, n0, BN)) return;

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

    // acc: the result (3xTF32: float32 sums of the k-tile sums of big*big); tmp (3xTF32): a
    // fresh wgmma sum of big*big per k-tile; cor (3xTF32): 2^10 times the correction terms,
    // accumulated in the wgmma over all of K.  The pipelined 3xTF32 schedule starts both tiles
    // with wgmmas that do not add (so nothing defines their registers outside the wgmmas).
    float acc[ACC_N], tmp[COR_N], cor[COR_N];
#pragma unroll
    for (int i = 0; i < ACC_N; ++i) acc[i] = 0.f;
    if (!(PIPE && PASSES == 3)) {
#pragma unroll
        for (int i = 0; i < COR_N; ++i) tmp[i] = 0.f;
#pragma unroll
        for (int i = 0; i < COR_N; ++i) cor[i] = 0.f;
    }

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
        for (int i = 0; i < S::QUADS_PER_THREAD; ++i)
            split_chunk<TL, PASSES, SPLITS, W>(raw + S::A_FLOATS, smem, i, tid);
    }
    fence_proxy_async();
    __syncthreads();

    // A fragments of k-step s of the raw stage at `stage`, split in registers: b = tf32(x),
    // sm = the small parts.
    auto load_frag = [&](const float* stage, int s, unsigned* b, unsigned* sm) {
        const float* src = stage + frag_off;
        float x[4];  // {A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4]} of the warp's 16 rows
        if (W) {
            const float2 r0 = *reinterpret_cast<const float2*>(src + 8 * s);
            const float2 r1 = *reinterpret_cast<const float2*>(src + S::SKA + 8 * s);
            x[0] = r0.x, x[1] = r1.x, x[2] = r0.y, x[3] = r1.y;
        } else {
            const float2 lo = *reinterpret_cast<const float2*>(src + 8 * s * SA);
            const float2 hi = *reinterpret_cast<const float2*>(src + (8 * s + 4) * SA);
            x[0] = lo.x, x[1] = lo.y, x[2] = hi.x, x[3] = hi.y;
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            if (PASSES == 3) tf32_split(x[e], b[e], sm[e]);
            else b[e] = tf32_rne(x[e]);
        }
    };
    auto desc_at = [&](int buf, int part, int s) {  // B operand of k-step s in split buffer buf
        return wgmma_desc_sw128(split_addr + unsigned(buf * S::SPLIT_BYTES + part * S::PART_BYTES) +
                                32u * s);
    };

    // Fragments stay in registers while their wgmmas run: 3xTF32 alternates two sets over the
    // k-steps, pipelined TF32 keeps one set per k-step.
    unsigned fb[KSTEPS][4], fs[KSTEPS][4];
    if constexpr (PIPE && PASSES == 3) {
        if (KT > 0) {
            // The first k-tile's first corrections, as every k-tile's come at the end of the one
            // before (below); they start cor.
            load_frag(raw, 0, fb[0], fs[0]);
            wgmma_fence();
            wgmma_tf32<BN>(cor, fs[0], desc_at(0, 0, 0), 0);
            wgmma_tf32<BN>(cor, fb[0], desc_at(0, 1, 0), 1);
            wgmma_commit();
        }
    }
    for (int kt = 0; kt < KT; ++kt) {
        // Raw stage (kt - 1) % STAGES held k-tile kt - 1: its fragments were read in period
        // kt - 1 and its split in period kt - 2, both before the barrier that ended period kt - 1.
        const int cur = kt % STAGES, nxt = (kt + 1) % STAGES;
        const int write_stage = (kt + STAGES - 1) % STAGES;
        if (kt + STAGES - 1 < KT) {
            load_a.template load<false>(write_stage * STAGE_BYTES, 0);
            load_b.template load<false>(write_stage * STAGE_BYTES, 0);
        }
        cp_async_commit();
        const int this_buf = kt % SPLITS, next_buf = (kt + 1) % SPLITS;
        const float* frag_stage = raw + cur * STAGE;
        const float* next_b = raw + nxt * STAGE + S::A_FLOATS;
        unsigned char* next_split = smem + next_buf * S::SPLIT_BYTES;
        auto desc = [&](int part, int s) { return desc_at(this_buf, part, s); };
        auto split = [&](int s) {  // the split chunks of k-tile kt + 1 that go with k-step s
#pragma unroll
            for (int c = 0; c < CPS; ++c)
                split_chunk<TL, PASSES, SPLITS, W>(next_b, next_split, s * CPS + c, tid);
        };

        // The split of k-tile kt + 1 runs while this k-tile's wgmmas do (after the last k-tile it
        // splits a stale raw stage into an idle buffer: harmless, and no branch around wgmma).
        if constexpr (PASSES == 1 && !PIPE) {
#pragma unroll
            for (int s = 0; s < KSTEPS; ++s) load_frag(frag_stage, s, fb[s], fs[s]);
            wgmma_fence();
#pragma unroll
            for (int s = 0; s < KSTEPS; ++s) wgmma_tf32<BN>(acc, fb[s], desc(0, s), 1);
            wgmma_commit();
#pragma unroll
            for (int s = 0; s < KSTEPS; ++s) split(s);
            wgmma_wait<0>();
        } else if constexpr (PASSES == 1) {
            // One group per k-step; up to three more stay in flight (fragment set s is free
            // once k-step s of the previous k-tile is done), across the barrier that ends the
            // period.  The split buffer the split of k-tile kt + 1 writes was read by the
            // wgmmas of k-tile kt + 1 - SPLITS: with three buffers those finished before that
            // barrier; with two, the barrier below waits for the previous k-tile's.
#pragma unroll
            for (int s = 0; s < KSTEPS; ++s) {
                wgmma_wait<KSTEPS - 1>();
                load_frag(frag_stage, s, fb[s], fs[s]);
                wgmma_fence();
                wgmma_tf32<BN>(acc, fb[s], desc(0, s), 1);
                wgmma_commit();
                if (SPLITS == 3) split(s);
            }
            if (SPLITS == 2) {
                cp_async_wait<STAGES - 2>();  // raw k-tile kt + 1
                __syncthreads();  // ... landed, and every warpgroup's wgmmas of k-tile kt - 1 done
#pragma unroll
                for (int s = 0; s < KSTEPS; ++s) split(s);
            }
        } else if constexpr (!PIPE) {
            // Per k-step: the corrections into cor (over all of K), big*big into tmp (a fresh
            // sum per k-tile, added to acc at its end).  Fragments alternate between two
            // register sets: k-step s waits for the wgmmas of k-step s - 2 before it overwrites
            // theirs.
#pragma unroll
            for (int s = 0; s < KSTEPS; ++s) {
                if (s >= 2) wgmma_wait<1>();
                load_frag(frag_stage, s, fb[s & 1], fs[s & 1]);
                wgmma_fence();
                wgmma_tf32<BN>(cor, fs[s & 1], desc(0, s), 1);
                wgmma_tf32<BN>(cor, fb[s & 1], desc(1, s), 1);
                wgmma_tf32<BN>(tmp, fb[s & 1], desc(0, s), s > 0);
                wgmma_commit();
                split(s);
            }
            wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < ACC_N; ++i) acc[i] += tmp[i];
        } else {
            // As above, but nothing drains at the end of a k-tile.  Groups (one per k-step, at
            // most one pending after each wait): k-step 0's corrections were issued at the end
            // of the previous period (C0); here k-step 0 adds only big*big, a fresh sum (B0);
            // k-steps 1-3 issue all three (G1-G3).  Fragment set 0 holds k-steps 0 and 2, set 1
            // k-steps 1 and 3: k-step 2 waits for C0 and B0, k-step 3 for G1; set 1 was freed at
            // the end of the previous period.
#pragma unroll
            for (int s = 0; s < KSTEPS; ++s) {
                if (s >= 2) wgmma_wait<1>();
                if (s > 0) load_frag(frag_stage, s, fb[s & 1], fs[s & 1]);
                wgmma_fence();
                if (s > 0) {
                    wgmma_tf32<BN>(cor, fs[s & 1], desc(0, s), 1);
                    wgmma_tf32<BN>(cor, fb[s & 1], desc(1, s), 1);
                    wgmma_tf32<BN>(tmp, fb[s & 1], desc(0, s), 1);
                } else {
                    wgmma_tf32_zero<BN>(tmp, fb[0], desc(0, 0));
                }
                wgmma_commit();
                if (s == 0 && SPLITS == 2) {
                    cp_async_wait<STAGES - 2>();  // raw k-tile kt + 1
                    __syncthreads();  // ... landed, and every warpgroup's wgmmas of kt - 1 done
                }
                split(s);
            }
        }
        fence_proxy_async();  // the split of k-tile kt + 1, for the wgmmas of the next period
        // Raw k-tile kt + 2, split in the next period (where the split follows a barrier of its
        // own, it waits for its raw tile there: kt + 1, a period later).
        if (!(PIPE && SPLITS == 2)) cp_async_wait<STAGES - 3>();
        __syncthreads();
        if constexpr (PIPE && PASSES == 3) {
            // The next k-tile's first corrections (C0) keep the tensor cores busy while this
            // k-tile's big*big sum completes and joins acc: set 0 is free once G2 is done, the
            // sum once G3 is.  After the last k-tile they multiply zeros by this k-tile's split
            // B (no branch around wgmma; its finite values give zeros, and a non-finite one
            // leaves C's column non-finite, as the product already has).
            const bool more = kt + 1 < KT;
            wgmma_wait<1>();
            load_frag(raw + nxt * STAGE, 0, fb[0], fs[0]);
#pragma unroll
            for (int e = 0; e < 4; ++e) {  // selects, not a branch: one definition per register
                fb[0][e] = select_or_zero(fb[0][e], more);
                fs[0][e] = select_or_zero(fs[0][e], more);
            }
            const int buf = more ? next_buf : this_buf;
            wgmma_fence();
            wgmma_tf32<BN>(cor, fs[0], desc_at(buf, 0, 0), 1);
            wgmma_tf32<BN>(cor, fb[0], desc_at(buf, 1, 0), 1);
            wgmma_commit();
            wgmma_wait<1>();  // G3: this k-tile's big*big is complete
#pragma unroll
            for (int i = 0; i < ACC_N; ++i) acc[i] += tmp[i];
        }
    }
    cp_async_wait<0>();
    if (PIPE) wgmma_wait<0>();

    // Epilogue: thread holds rows 64 wg + 16 w + 2g + h (h = 0, 1) and, per p < BN / 16, the
    // four columns 16p + 4t .. 16p + 4t + 3 (accumulators 8p + 4c' + 2h + e for column
    // 4t + 2c' + e).
    // The tile's place and C's split-K slice are worked out again here rather than held in
    // registers through the main loop (volatile reads: the compiler cannot reuse the first).
    unsigned bid, bz, etid;
    asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(bid));
    asm volatile("mov.u32 %0, %%ctaid.z;\n" : "=r"(bz));
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(etid));
    C += bz * c_zstride;
    swizzle_tile<8>(int(bid), (M + BM - 1) / BM, (N + BN - 1) / BN, tile_m, tile_n);
    const int em0 = tile_m * BM, en0 = tile_n * BN, et = etid % 4;
    const bool read_c = !(beta == 0.f);
    const int row0 = 16 * int(etid / 32) + 2 * int((etid % 32) / 4);  // 64 wg + 16 w + 2 g
    constexpr int RUNS = 2 * (BN / 16), BATCH = 4;  // run j: h = j / (BN / 16), p = j % (BN / 16)
    auto place = [&](int j, int& row, int& col) {
        row = em0 + row0 + j / (BN / 16);
        col = en0 + 16 * (j % (BN / 16)) + 4 * et;
    };
    auto value = [&](int j, float* v) {
        const int h = j / (BN / 16), p = j % (BN / 16);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int i = 8 * p + 4 * (c >> 1) + 2 * h + (c & 1);
            // (KT == 0: the pipelined schedule never started cor)
            v[c] = PASSES == 3 && KT > 0 ? __fmaf_rn(cor[i % COR_N], 1.f / TF32_SMALL_SCALE, acc[i])
                                         : acc[i];
        }
    };
#pragma unroll
    for (int j0 = 0; j0 < RUNS; j0 += BATCH)
        store_batch<BATCH>(C, ldc, M, N, j0, alpha, beta, read_c, c_vec, place, value);
}

// The compute policy: PASSES (3: 3xTF32, 1: TF32), PIPE (wgmma groups stay in flight across
// k-tiles) and SPLITS (split buffers: 2, or 3 so that a PIPE k-tile needs one barrier).
template <int PASSES_, int PIPE_, int SPLITS_>
struct WgmmaCompute {
    static constexpr int PASSES = PASSES_, SPLITS = SPLITS_;
    static constexpr bool PIPE = PIPE_ != 0;
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
#ifndef BIGMM_WG_PIPE
#define BIGMM_WG_PIPE 1  // wgmma groups in flight across k-tiles (0: drained at each k-tile's end)
#endif
#ifndef BIGMM_WG_SPLITS
#define BIGMM_WG_SPLITS 3  // split buffers (2 or 3)
#endif
#ifndef BIGMM_CHECKS
#define BIGMM_CHECKS 0
#endif

// The family's Tile counts threads per 16-row warp slice: BM / 16 warps of 32 (two warpgroups).
typedef bigmm::Tile<float, BIGMM_BM, BIGMM_BN, BIGMM_BK, 16, BIGMM_BN, 0, 0, BIGMM_STAGES,
                    BIGMM_PAD_BYTES>
    BigmmTile;
typedef bigmm::WgmmaCompute<BIGMM_TF32_PASSES, BIGMM_WG_PIPE, BIGMM_WG_SPLITS> BigmmCompute;

BIGMM_DEFINE_ENTRIES
