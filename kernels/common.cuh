// Shared helpers for bigmm's GEMM kernels: asynchronous copies, 16-byte shared-memory
// vectors, the block-index swizzle, the tensor-core products (float64 DMMA, TF32 and the
// 3xTF32 split), and the GEMM family's machinery that every compute policy shares: the tile
// loaders with their k/v/s load modes, the cp.async multi-stage pipeline (gemm_body), the
// alpha/beta epilogue, the fused checksum updates and the extern "C" entry points.  Included by
// every kernel family; compiled by NVRTC (through cupy.RawModule) and by nvcc (the CI resource
// check), so it uses no standard headers.
#pragma once

namespace bigmm {

// 32-bit shared-memory address of a generic pointer into shared memory (for cp.async).
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Asynchronous global->shared copy of BYTES bytes, of which only src_bytes are read and
// the rest zero-filled (src_bytes == 0 reads nothing: the predicated edge load).
// 16-byte copies bypass L1 (.cg); 4- and 8-byte copies must go through it (.ca).
template <int BYTES>
__device__ __forceinline__ void cp_async(unsigned dst, const void* src, int src_bytes);

template <>
__device__ __forceinline__ void cp_async<16>(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

template <>
__device__ __forceinline__ void cp_async<8>(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

template <>
__device__ __forceinline__ void cp_async<4>(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// 16-byte vector of T (float4 or double2) and its shared-memory load/store.
template <typename T>
struct Vec16;
template <>
struct Vec16<float> {
    typedef float4 type;
};
template <>
struct Vec16<double> {
    typedef double2 type;
};

// Copy 16 bytes (16 / sizeof(T) elements) from aligned src to the register array dst.
template <typename T>
__device__ __forceinline__ void load16(T* dst, const T* src) {
    typedef typename Vec16<T>::type V;
    const V v = *reinterpret_cast<const V*>(src);
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int i = 0; i < int(16 / sizeof(T)); ++i) dst[i] = e[i];
}

template <typename T>
__device__ __forceinline__ void store16(T* dst, const T* src) {
    typedef typename Vec16<T>::type V;
    V v;
    T* e = reinterpret_cast<T*>(&v);
#pragma unroll
    for (int i = 0; i < int(16 / sizeof(T)); ++i) e[i] = src[i];
    *reinterpret_cast<V*>(dst) = v;
}

// Block index -> (tile row, tile column), grouping GROUP tile rows together so that the
// blocks resident at one time share panels of A and B in L2.
template <int GROUP>
__device__ __forceinline__ void swizzle_tile(int bid, int tiles_m, int tiles_n, int& tm, int& tn) {
    const int per_group = GROUP * tiles_n;
    const int first_m = (bid / per_group) * GROUP;
    const int rows = min(tiles_m - first_m, GROUP);
    const int in_group = bid % per_group;
    tm = first_m + in_group % rows;
    tn = in_group / rows;
}

// Gram products' upper triangle (-DBIGMM_UPPER=1): a block whose tile of C lies wholly below
// the diagonal (each of its rows past each of its columns) returns at once, leaving that tile
// of C as it was.  Tiles the diagonal crosses are computed whole.
#ifndef BIGMM_UPPER
#define BIGMM_UPPER 0
#endif
__device__ __forceinline__ bool below_diagonal(int m0, int n0, int bn) {
    return BIGMM_UPPER && m0 >= n0 + bn;
}

// D(16x8) += A(16x4) B(4x8) in float64 on the tensor cores.  Fragments (g = lane / 4,
// t = lane % 4): a = {A[g][t], A[g+8][t]}, b = B[t][g], d = {D[g][2t], D[g][2t+1],
// D[g+8][2t], D[g+8][2t+1]}.  sm_90 has the m16n8k4 shape; sm_80 runs it as two m8n8k4,
// whose fragments are the two row halves of the same layout.
__device__ __forceinline__ void dmma_16x8x4(double* d, const double* a, double b) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};\n"
        : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
        : "d"(a[0]), "d"(a[1]), "d"(b));
#else
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};\n"
                 : "+d"(d[0]), "+d"(d[1])
                 : "d"(a[0]), "d"(b));
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};\n"
                 : "+d"(d[2]), "+d"(d[3])
                 : "d"(a[1]), "d"(b));
#endif
}


// ---- TF32 tensor cores ----------------------------------------------------------------------
// TF32 is float32's sign, 8 exponent bits and top 10 mantissa bits: the mma reads the top 19
// bits of each 32-bit operand.

// x rounded to TF32, to nearest with ties away from zero (what cvt.rna.tf32.f32 does, in the
// same three instructions), except magnitudes that this would round up to infinity
// (|x| >= 0x1.ffep127): those are truncated, so that a finite x stays finite.  Inf stays Inf;
// NaN stays NaN or becomes Inf (non-finite either way).  Returns the bits the mma takes.
__device__ __forceinline__ unsigned tf32_rna(float x) {
    unsigned u = __float_as_uint(x);
    if (fabsf(x) < __uint_as_float(0x7f7ff000u)) u += 0x1000u;
    return u & 0xffffe000u;
}

// x rounded to TF32 for plain TF32 products: to nearest with ties to even, as the TMA unit
// rounds float32 read through a TFLOAT32 tensor map (and cuBLAS's TF32 mode), so that every
// plain TF32 kernel multiplies the same values: magnitudes from 0x1.ffep127 up round to
// infinity, NaN stays NaN.  Returns the bits the mma takes.
__device__ __forceinline__ unsigned tf32_rne(float x) {
    const unsigned u = __float_as_uint(x);
    return x != x ? 0x7fffe000u : (u + 0xfffu + ((u >> 13) & 1u)) & 0xffffe000u;
}

// The 3xTF32 split: x = big + small * 2^-10 + r with big = tf32(x), small = tf32(2^10 (x - big))
// (x - big is exact), |small| <= |x| and |r| <= 2^-23 |x|.  The scale keeps the small part of a
// tiny x (x - big below 2^-126) out of TF32's subnormals, whose 10-bit mantissa would lose it;
// it cannot overflow: |x - big| <= 2^-11 |x|, or < 2^-10 |x| where tf32_rna truncates.  small is
// rounded without the overflow guard; a non-finite x gives a non-finite big.
constexpr float TF32_SMALL_SCALE = 1024.f;

// x - y and x * y rounded to nearest with subnormals kept, whatever -ftz the module is compiled
// with (bigmm compiles with -ftz=false; under -ftz=true, cupy's default, the x - big of a tiny x
// would flush to zero and lose its small part).
__device__ __forceinline__ float sub_keep_subnormal(float x, float y) {
    float r;
    asm("sub.rn.f32 %0, %1, %2;\n" : "=f"(r) : "f"(x), "f"(y));
    return r;
}

__device__ __forceinline__ float mul_keep_subnormal(float x, float y) {
    float r;
    asm("mul.rn.f32 %0, %1, %2;\n" : "=f"(r) : "f"(x), "f"(y));
    return r;
}

__device__ __forceinline__ void tf32_split(float x, unsigned& big, unsigned& small,
                                           bool scaled = true) {
    big = tf32_rna(x);
    float rest = sub_keep_subnormal(x, __uint_as_float(big));
    if (scaled) rest = mul_keep_subnormal(rest, TF32_SMALL_SCALE);
    small = (__float_as_uint(rest) + 0x1000u) & 0xffffe000u;
}

// D(16x8) = A(16x8) B(8x8) + C on the TF32 tensor cores (sm_80 and later), float32
// accumulators.  Fragments (g = lane / 4, t = lane % 4): a = {A[g][t], A[g+8][t], A[g][t+4],
// A[g+8][t+4]}, b = {B[t][g], B[t+4][g]}, c and d = {D[g][2t], D[g][2t+1], D[g+8][2t],
// D[g+8][2t+1]}.  a and b hold TF32 bits.
__device__ __forceinline__ void mma_tf32_16x8x8(float& d0, float& d1, float& d2, float& d3,
                                                const unsigned* a, unsigned b0, unsigned b1,
                                                float c0, float c1, float c2, float c3) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c0), "f"(c1),
          "f"(c2), "f"(c3));
}

// ==== the GEMM family (gemm_regblock.cu: float32/float64 FMA and FP64 DMMA; gemm_tf32.cu: TF32
// and 3xTF32 tensor cores): C = alpha * op(A) @ op(B) + beta * C, row-major, any M, N, K and
// leading dimensions.  A family file supplies a compute policy (below) and instantiates the
// entry points with BIGMM_DEFINE_ENTRIES.

enum LoadMode {
    LOAD_K = 0,  // global contiguous along k: element copies, transposed into S[k][r]
    LOAD_V = 1,  // global contiguous along r, 16-byte aligned: 16-byte copies
    LOAD_S = 2,  // global contiguous along r, unaligned: element copies
    LOAD_W = 3,  // global contiguous along k, 16-byte aligned, K a whole number of vectors:
                 // 16-byte copies into a K-major tile S[r][k] (families that read that layout)
};

template <typename T_, int BM_, int BN_, int BK_, int WM_, int WN_, int TM_, int TN_, int STAGES_,
          int PAD_BYTES_>
struct Tile {
    typedef T_ T;
    static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, TM = TM_, TN = TN_;
    static constexpr int STAGES = STAGES_;
    static constexpr int VW = 16 / int(sizeof(T));  // elements per 16-byte vector
    static constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN;
    static constexpr int NT = WARPS_M * WARPS_N * 32;
    static constexpr int PAD = PAD_BYTES_ / int(sizeof(T));
    static constexpr int SA = BM + PAD, SB = BN + PAD;  // shared row strides (elements)
    static constexpr int STAGE = BK * (SA + SB);        // elements per pipeline stage
    static constexpr int SMEM_BYTES = STAGES * STAGE * int(sizeof(T));
    static_assert(BM % WM == 0 && BN % WN == 0, "warp tile must divide block tile");
    static_assert(STAGES >= 2, "the pipeline needs at least two stages");
    static_assert(PAD_BYTES_ % 16 == 0, "rows must stay 16-byte aligned");
};

// Copies BK x R operand tiles (R = BM for A, BN for B) from global memory into k-major shared
// tiles with row stride STRIDE elements, one tile per call, walking along k.  The first tile
// starts at kstart = K - KT * BK <= 0, so that only it is partial: its k < 0 elements are
// zero-filled and every later tile is copied without predicates.  Rows past the operand's
// extent (`rows`) are clamped to its last row: they only feed rows or columns of the C tile
// that are never stored.
template <typename T, int R, int BK, int NT, int STRIDE, int MODE>
struct TileLoader;

template <typename T, int R, int BK, int NT, int STRIDE>
struct TileLoader<T, R, BK, NT, STRIDE, LOAD_K> {
    // Element (r, k) at src[r * ld + k].  A warp covers 8 consecutive k of 4 rows: 32-byte
    // global segments, and (with a 16-byte row pad) 32 distinct shared banks.
    static constexpr int RPP = NT / 8;  // rows per pass
    static constexpr int PR = R / RPP, PK = BK / 8;
    static_assert(NT % 8 == 0 && R % RPP == 0 && BK % 8 == 0, "LOAD_K tile shape");
    const T* base;
    const T* g[PR];
    unsigned s;
    int k_t;

    __device__ __forceinline__ void init(const T* src, long long ld, int r0, int rows, int kstart,
                                         int tid, unsigned sbase) {
        k_t = tid % 8;
        const int r_t = tid / 8;
        base = src;
#pragma unroll
        for (int p = 0; p < PR; ++p) {
            const int r = min(r0 + r_t + p * RPP, rows - 1);
            g[p] = src + (long long)r * ld + (kstart + k_t);
        }
        s = sbase + unsigned(k_t * STRIDE + r_t) * sizeof(T);
    }

    template <bool FIRST>
    __device__ __forceinline__ void load(unsigned stage, int kstart) {
#pragma unroll
        for (int pk = 0; pk < PK; ++pk) {
            const bool ok = !FIRST || kstart + pk * 8 + k_t >= 0;
#pragma unroll
            for (int pr = 0; pr < PR; ++pr) {
                cp_async<int(sizeof(T))>(
                    s + stage + unsigned(pk * 8 * STRIDE + pr * RPP) * sizeof(T),
                    ok ? g[pr] + pk * 8 : base, ok ? int(sizeof(T)) : 0);
            }
        }
#pragma unroll
        for (int pr = 0; pr < PR; ++pr) g[pr] += BK;
    }
};

template <typename T, int R, int BK, int NT, int STRIDE>
struct TileLoader<T, R, BK, NT, STRIDE, LOAD_V> {
    // Element (r, k) at src[k * ld + r], 16-byte chunks along r; src and ld aligned.
    static constexpr int VW = 16 / int(sizeof(T));
    static constexpr int CPR = R / VW;    // chunks per k row
    static constexpr int KPP = NT / CPR;  // k rows per pass
    static constexpr int PK = BK / KPP;
    static_assert(R % VW == 0 && NT % CPR == 0 && BK % KPP == 0, "LOAD_V tile shape");
    const T* base;
    const T* g;
    long long ld;
    unsigned s;
    int nbytes, k_t;

    __device__ __forceinline__ void init(const T* src, long long ld_, int r0, int rows, int kstart,
                                         int tid, unsigned sbase) {
        const int r_t = (tid % CPR) * VW;
        k_t = tid / CPR;
        base = src;
        ld = ld_;
        int r = r0 + r_t;
        if (r >= rows) r = ((rows - 1) / VW) * VW;  // last chunk: a valid, aligned address
        nbytes = min(VW, rows - r) * int(sizeof(T));
        g = src + (long long)(kstart + k_t) * ld_ + r;
        s = sbase + unsigned(k_t * STRIDE + r_t) * sizeof(T);
    }

    template <bool FIRST>
    __device__ __forceinline__ void load(unsigned stage, int kstart) {
#pragma unroll
        for (int pk = 0; pk < PK; ++pk) {
            const bool ok = !FIRST || kstart + pk * KPP + k_t >= 0;
            cp_async<16>(s + stage + unsigned(pk * KPP * STRIDE) * sizeof(T),
                         ok ? g + pk * KPP * ld : base, ok ? nbytes : 0);
        }
        g += BK * ld;
    }
};

template <typename T, int R, int BK, int NT, int STRIDE>
struct TileLoader<T, R, BK, NT, STRIDE, LOAD_S> {
    // Element (r, k) at src[k * ld + r], any alignment: one copy per element.
    static constexpr int RPP = R < NT ? R : NT;  // rows per pass
    static constexpr int KPP = NT / RPP;         // k rows per pass
    static constexpr int PR = R / RPP, PK = BK / KPP;
    static_assert(R % RPP == 0 && NT % RPP == 0 && BK % KPP == 0, "LOAD_S tile shape");
    const T* base;
    const T* g[PR];
    long long ld;
    unsigned s;
    int k_t;

    __device__ __forceinline__ void init(const T* src, long long ld_, int r0, int rows, int kstart,
                                         int tid, unsigned sbase) {
        const int r_t = tid % RPP;
        k_t = tid / RPP;
        base = src;
        ld = ld_;
#pragma unroll
        for (int p = 0; p < PR; ++p) {
            const int r = min(r0 + r_t + p * RPP, rows - 1);
            g[p] = src + (long long)(kstart + k_t) * ld_ + r;
        }
        s = sbase + unsigned(k_t * STRIDE + r_t) * sizeof(T);
    }

    template <bool FIRST>
    __device__ __forceinline__ void load(unsigned stage, int kstart) {
#pragma unroll
        for (int pk = 0; pk < PK; ++pk) {
            const bool ok = !FIRST || kstart + pk * KPP + k_t >= 0;
#pragma unroll
            for (int pr = 0; pr < PR; ++pr) {
                cp_async<int(sizeof(T))>(
                    s + stage + unsigned(pk * KPP * STRIDE + pr * RPP) * sizeof(T),
                    ok ? g[pr] + pk * KPP * ld : base, ok ? int(sizeof(T)) : 0);
            }
        }
#pragma unroll
        for (int pr = 0; pr < PR; ++pr) g[pr] += BK * ld;
    }
};

template <typename T, int R, int BK, int NT, int STRIDE>
struct TileLoader<T, R, BK, NT, STRIDE, LOAD_W> {
    // Element (r, k) at src[r * ld + k]; rows and ld 16-byte aligned and K % VW == 0, so that
    // every 16-byte chunk of a row lies wholly before or after k = 0 in the first tile.  Stored
    // K-major: S[r][k] with row stride STRIDE.  A quarter warp copies one row's 128 bytes.
    static constexpr int VW = 16 / int(sizeof(T));
    static constexpr int CPR = BK / VW;   // chunks per row
    static constexpr int RPP = NT / CPR;  // rows per pass
    static constexpr int PR = R / RPP;
    static_assert(BK % VW == 0 && NT % CPR == 0 && R % RPP == 0 && STRIDE % VW == 0,
                  "LOAD_W tile shape");
    const T* base;
    const T* g[PR];
    unsigned s;
    int k_t;

    __device__ __forceinline__ void init(const T* src, long long ld, int r0, int rows, int kstart,
                                         int tid, unsigned sbase) {
        k_t = (tid % CPR) * VW;
        const int r_t = tid / CPR;
        base = src;
#pragma unroll
        for (int p = 0; p < PR; ++p) {
            const int r = min(r0 + r_t + p * RPP, rows - 1);
            g[p] = src + (long long)r * ld + (kstart + k_t);
        }
        s = sbase + unsigned(r_t * STRIDE + k_t) * sizeof(T);
    }

    template <bool FIRST>
    __device__ __forceinline__ void load(unsigned stage, int kstart) {
        const bool ok = !FIRST || kstart + k_t >= 0;
#pragma unroll
        for (int p = 0; p < PR; ++p)
            cp_async<16>(s + stage + unsigned(p * RPP * STRIDE) * sizeof(T), ok ? g[p] : base,
                         ok ? 16 : 0);
#pragma unroll
        for (int p = 0; p < PR; ++p) g[p] += BK;
    }
};

__device__ __forceinline__ float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double fma_rn(double a, double b, double c) { return __fma_rn(a, b, c); }

// ---- compute policies: what a thread holds and how one k-step multiplies it ---------------
// A policy has KSTEP (k per step), acc (the thread's accumulators), init(warp, lane),
// a_off / b_off (the thread's element offsets within a stage's A and B tiles), load(buf, As,
// Bs, step) (the fragments of k-step `step` into register buffer buf), mma(buf), and
// each_vec(f) (calls f(row, col, vals) per run of VW consecutive C elements it holds).

// C[row][col, col + VW) = alpha * vals + beta * C, guarded by M and N; C is never read when
// beta == 0; one 16-byte access when C is aligned (c_vec) and the run is whole. In two halves,
// so that a loop can issue many loads of old C before its stores (the compiler keeps a load of
// C behind every earlier store to C, which may alias it): load_c reads the old values (zeros
// outside C or where !read_c), store_c writes; store_vec is the two at once.
template <typename T, int VW>
__device__ __forceinline__ void load_c(const T* __restrict__ C, long long ldc, int M, int N,
                                       int row, int col, bool read_c, int c_vec, T* old) {
#pragma unroll
    for (int u = 0; u < VW; ++u) old[u] = T(0);
    if (!read_c || row >= M) return;
    const T* crow = C + (long long)row * ldc;
    if (c_vec && col + VW <= N) {
        load16(old, crow + col);
    } else {
#pragma unroll
        for (int u = 0; u < VW; ++u)
            if (col + u < N) old[u] = crow[col + u];
    }
}

template <typename T, int VW>
__device__ __forceinline__ void store_c(T* __restrict__ C, long long ldc, int M, int N, int row,
                                        int col, const T* vals, T alpha, T beta, bool read_c,
                                        int c_vec, const T* old) {
    if (row >= M) return;
    T* crow = C + (long long)row * ldc;
    T out[VW];
#pragma unroll
    for (int u = 0; u < VW; ++u) out[u] = read_c ? fma_rn(beta, old[u], alpha * vals[u])
                                                 : alpha * vals[u];
    if (c_vec && col + VW <= N) {
        store16(crow + col, out);
    } else {
#pragma unroll
        for (int u = 0; u < VW; ++u)
            if (col + u < N) crow[col + u] = out[u];
    }
}

template <typename T, int VW>
__device__ __forceinline__ void store_vec(T* __restrict__ C, long long ldc, int M, int N, int row,
                                          int col, const T* vals, T alpha, T beta, bool read_c,
                                          int c_vec) {
    T old[VW];
    load_c<T, VW>(C, ldc, M, N, row, col, read_c, c_vec, old);
    store_c<T, VW>(C, ldc, M, N, row, col, vals, alpha, beta, read_c, c_vec, old);
}

// One batch of a thread's epilogue: runs j0 .. j0 + BATCH - 1 of 4 floats, the old C of all of
// them loaded before the first store (see load_c). place(j, row, col) gives run j's place in C,
// value(j, v) its 4 products.
template <int BATCH, class Place, class Value>
__device__ __forceinline__ void store_batch(float* __restrict__ C, long long ldc, int M, int N,
                                            int j0, float alpha, float beta, bool read_c,
                                            int c_vec, Place place, Value value) {
    float old[BATCH][4];
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
        int row, col;
        place(j0 + b, row, col);
        load_c<float, 4>(C, ldc, M, N, row, col, read_c, c_vec, old[b]);
    }
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
        int row, col;
        place(j0 + b, row, col);
        float v[4];
        value(j0 + b, v);
        store_c<float, 4>(C, ldc, M, N, row, col, v, alpha, beta, read_c, c_vec, old[b]);
    }
}

// Checksum updates fused into the product (see the header): out[r] (+)= scale * sum_k w[k] X[k][r]
// and out_abs[r] (+)= |scale| * sum_k wa[k] |X[k][r]| for X = op(B) (columns, r < N) and X =
// op(A)^T (rows, r < M).  The weights are float64 vectors of length K.
struct Checks {
    const double* __restrict__ col_w;
    const double* __restrict__ col_wa;
    double* col;
    double* col_abs;
    const double* __restrict__ row_w;
    const double* __restrict__ row_wa;
    double* row;
    double* row_abs;
    double scale;
    int accumulate;
};

// One k-tile's share of the checksum updates of a block: the weights of the tile staged in
// shared memory (in T, by the first threads, one tile ahead: see gemm_body), each thread
// summing whole columns of the stage's k-major operand tile S[k][r] (stride STRIDE), a tile's
// k in T, then added in float64 to its own entries of s and sa (shared memory: registers are
// the product's).  k < 0 of the first tile are zero in S and in the weights.
template <typename T, int R, int BK, int NT, int STRIDE>
struct CheckSums {
    static constexpr int PER = (R + NT - 1) / NT;
    double* s;
    double* sa;

    __device__ __forceinline__ void init(double* s_, double* sa_, int first) {
        s = s_;
        sa = sa_;
#pragma unroll
        for (int p = 0; p < PER; ++p) {
            const int r = first + p * NT;
            if (r >= 0 && r < R) s[r] = sa[r] = 0.0;
        }
    }

    __device__ __forceinline__ void add(const T* S, const T* w, const T* wa, int first) {
#pragma unroll
        for (int p = 0; p < PER; ++p) {
            const int r = first + p * NT;
            if (r >= 0 && r < R) {
                T ps = T(0), pa = T(0);
#pragma unroll
                for (int k = 0; k < BK; ++k) {
                    const T x = S[k * STRIDE + r];
                    ps = fma_rn(w[k], x, ps);
                    pa = fma_rn(wa[k], x < T(0) ? -x : x, pa);
                }
                s[r] += double(ps);
                sa[r] += double(pa);
            }
        }
    }

    __device__ __forceinline__ void store(double* out, double* out_abs, int r0, int extent,
                                          int first, double scale, int accumulate) const {
#pragma unroll
        for (int p = 0; p < PER; ++p) {
            const int r = first + p * NT;
            if (r >= 0 && r < R && r0 + r < extent) {
                const double v = scale * s[r], va = fabs(scale) * sa[r];
                out[r0 + r] = accumulate ? out[r0 + r] + v : v;
                out_abs[r0 + r] = accumulate ? out_abs[r0 + r] + va : va;
            }
        }
    }
};

template <class TL, class CP, int LA, int LB, bool CHECKS>
__device__ __forceinline__ void gemm_body(int M, int N, int K, typename TL::T alpha,
                                          const typename TL::T* __restrict__ A, long long lda,
                                          const typename TL::T* __restrict__ B, long long ldb,
                                          typename TL::T beta, typename TL::T* __restrict__ C,
                                          long long ldc, int c_vec, int k_chunk,
                                          long long c_zstride, const Checks& ck) {
    typedef typename TL::T T;
    constexpr int BM = TL::BM, BN = TL::BN, BK = TL::BK;
    constexpr int VW = TL::VW, NT = TL::NT, STAGES = TL::STAGES;
    constexpr int SA = TL::SA, SB = TL::SB, STAGE = TL::STAGE;
    constexpr int STEPS = BK / CP::KSTEP;  // k-steps per k-tile
    constexpr unsigned STAGE_BYTES = unsigned(STAGE) * sizeof(T);
    static_assert(BK % CP::KSTEP == 0 && STEPS % 2 == 0,
                  "fragment double-buffering runs on across tiles: an even number of k-steps");

    // Split K: block z multiplies the k range [z * k_chunk, (z + 1) * k_chunk) into its own
    // slice of C, c_zstride elements further on (gridDim.z == 1 without a split).
    {
        const int kz = blockIdx.z * k_chunk;
        K = min(k_chunk, K - kz);
        A += (LA == LOAD_K) ? (long long)kz : (long long)kz * lda;
        B += (LB == LOAD_K) ? (long long)kz : (long long)kz * ldb;
        C += blockIdx.z * c_zstride;
    }

    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* smem = reinterpret_cast<T*>(smem_raw);
    const int tid = threadIdx.x;

    int tile_m, tile_n;
    swizzle_tile<8>(blockIdx.x, (M + BM - 1) / BM, (N + BN - 1) / BN, tile_m, tile_n);
    const int m0 = tile_m * BM, n0 = tile_n * BN;
    if (below_diagonal(m0, n0, BN)) return;

    const unsigned sbase = smem_addr(smem);
    TileLoader<T, BM, BK, NT, SA, LA> load_a;
    TileLoader<T, BN, BK, NT, SB, LB> load_b;
    const int KT = (K + BK - 1) / BK;
    const int kstart = K - KT * BK;  // first tile is [kstart, kstart + BK), kstart in (-BK, 0]
    load_a.init(A, lda, m0, M, kstart, tid, sbase);
    load_b.init(B, ldb, n0, N, kstart, tid, sbase + unsigned(BK * SA) * sizeof(T));

    CP cp;
    cp.init(tid / 32, tid % 32);

    // Checksums: columns in the blocks of the first tile row (thread t sums column t), rows in
    // those of the first tile column (thread NT - 1 - t sums row t, so that a block doing both
    // spreads them over its threads).  Weights of k-tile kt go to wsm[kt & 1] one tile ahead.
    static_assert(!CHECKS || NT >= 4 * BK, "one thread per staged weight");
    const bool do_col = CHECKS && tile_m == 0, do_row = CHECKS && tile_n == 0;
    __shared__ T wsm[CHECKS ? 2 : 1][4][CHECKS ? BK : 1];
    __shared__ double sums[CHECKS ? 4 : 1][CHECKS ? (BM > BN ? BM : BN) : 1];
    CheckSums<T, BN, BK, NT, SB> col_sums;
    CheckSums<T, BM, BK, NT, SA> row_sums;
    auto stage_weights = [&](int kt) {
        if (tid < 4 * BK) {
            const int which = tid / BK, k = tid % BK, kg = kstart + kt * BK + k;
            const double* src = which == 0 ? ck.col_w : which == 1 ? ck.col_wa
                              : which == 2 ? ck.row_w : ck.row_wa;
            wsm[kt & 1][which][k] = kg >= 0 ? T(src[kg]) : T(0);
        }
    };
    if (CHECKS) {
        col_sums.init(sums[0], sums[CHECKS ? 1 : 0], tid);
        row_sums.init(sums[CHECKS ? 2 : 0], sums[CHECKS ? 3 : 0], NT - 1 - tid);
        if ((do_col || do_row) && KT > 0) stage_weights(0);
    }

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

    // Fragments of k-step kk sit in buffer kk & 1 (STEPS is even, so the parity runs on across
    // tiles).  The barrier for tile kt + 1 comes before the last k-step of tile kt, whose
    // fragments are already in registers: the first fragments of the next tile then load
    // while the last multiplies of this one run, and no warp waits on shared memory after a
    // barrier.
    int read_stage = 0, write_stage = STAGES - 1;
    const T* As = smem + cp.a_off;
    const T* Bs = smem + BK * SA + cp.b_off;
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // tile 0 is visible
    cp.load(0, As, Bs, 0);

    for (int kt = 0; kt < KT; ++kt) {
        if (CHECKS && (do_col || do_row)) {  // tile kt and its weights are visible
            const T* stage = smem + read_stage * STAGE;
            if (do_col) col_sums.add(stage + BK * SA, wsm[kt & 1][0], wsm[kt & 1][1], tid);
            if (do_row) row_sums.add(stage, wsm[kt & 1][2], wsm[kt & 1][3], NT - 1 - tid);
            if (kt + 1 < KT) stage_weights(kt + 1);  // read after the barrier below
        }
        // Stage write_stage held tile kt - 1, which every thread finished reading before the
        // barrier at the end of that tile.
        if (kt + STAGES - 1 < KT) {
            load_a.template load<false>(write_stage * STAGE_BYTES, 0);
            load_b.template load<false>(write_stage * STAGE_BYTES, 0);
        }
        cp_async_commit();
        write_stage = (write_stage + 1 == STAGES) ? 0 : write_stage + 1;

#pragma unroll
        for (int kk = 0; kk < STEPS; ++kk) {
            const int cur = kk & 1, nxt = cur ^ 1;
            if (kk + 1 < STEPS) {
                cp.load(nxt, As, Bs, kk + 1);
            } else {
                cp_async_wait<STAGES - 2>();
                __syncthreads();  // tile kt + 1 is visible; tile kt's stage is no longer read
                read_stage = (read_stage + 1 == STAGES) ? 0 : read_stage + 1;
                As = smem + read_stage * STAGE + cp.a_off;
                Bs = smem + read_stage * STAGE + BK * SA + cp.b_off;
                if (kt + 1 < KT) cp.load(nxt, As, Bs, 0);
            }
            cp.mma(cur);
        }
    }
    cp_async_wait<0>();
    if (do_col) col_sums.store(ck.col, ck.col_abs, n0, N, tid, ck.scale, ck.accumulate);
    if (do_row) row_sums.store(ck.row, ck.row_abs, m0, M, NT - 1 - tid, ck.scale, ck.accumulate);

    // Epilogue: C = alpha * acc + beta * C, C never read when beta == 0.
    const bool read_c = !(beta == T(0));
    cp.each_vec([&](int r, int c, const T* vals) {
        store_vec<T, VW>(C, ldc, M, N, m0 + r, n0 + c, vals, alpha, beta, read_c, c_vec);
    });
}

// ---- wgmma (sm_90a; families that define BIGMM_WGMMA) -------------------------------------
#ifdef BIGMM_WGMMA

// Output operands of a wgmma's 64 accumulators a thread holds: read and written (D), or only
// written (W: a fresh sum).

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

// The first 1024-byte boundary (a 128-byte swizzle atom) at or after ``p`` in shared memory:
// where a block's swizzled tiles start (the dynamic window is allocated 1 KB larger).
__device__ __forceinline__ unsigned char* swizzle_aligned(unsigned char* p) {
    return p + ((1024u - (smem_addr(p) & 1023u)) & 1023u);
}

// Shared-memory matrix descriptor of a K-major operand tile with the 128-byte swizzle: start
// address >> 4 (bits 0-13), leading byte offset unused with this swizzle (1, bits 16-29),
// stride byte offset 1024 (8 rows of 128 bytes; >> 4 in bits 32-45), swizzle mode 1 (bits 62-63).
__device__ __forceinline__ unsigned long long wgmma_desc_sw128(unsigned addr) {
    const unsigned lo = ((addr & 0x3ffffu) >> 4) | (1u << 16);
    const unsigned hi = (1024u >> 4) | (1u << 30);
    return (static_cast<unsigned long long>(hi) << 32) | lo;
}

// The accumulators' places in a wgmma's text: {%0, ..., %63} or {%0, ..., %127}.
#define BIGMM_WG_LIST64                                                                        \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                  \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "         \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "         \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define BIGMM_WG_LIST128                                                                       \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                  \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "         \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "         \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "         \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "         \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "         \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, "  \
    "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, "    \
    "%125, %126, %127}"

#define BIGMM_WG_D4(i) "+f"(d[i]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3])
#define BIGMM_WG_D16(i) BIGMM_WG_D4(i), BIGMM_WG_D4((i) + 4), BIGMM_WG_D4((i) + 8), BIGMM_WG_D4((i) + 12)
#define BIGMM_WG_D64(i) BIGMM_WG_D16(i), BIGMM_WG_D16((i) + 16), BIGMM_WG_D16((i) + 32), BIGMM_WG_D16((i) + 48)
#define BIGMM_WG_W4(i) "=f"(d[i]), "=f"(d[(i) + 1]), "=f"(d[(i) + 2]), "=f"(d[(i) + 3])
#define BIGMM_WG_W16(i) BIGMM_WG_W4(i), BIGMM_WG_W4((i) + 4), BIGMM_WG_W4((i) + 8), BIGMM_WG_W4((i) + 12)
#define BIGMM_WG_W64(i) BIGMM_WG_W16(i), BIGMM_WG_W16((i) + 16), BIGMM_WG_W16((i) + 32), BIGMM_WG_W16((i) + 48)

// D(64 x N) = A(64 x 8) B(8 x N) (+ D when scale_d) on the TF32 tensor cores, float32
// accumulators, N = 128 or 256.  A from registers: a = {A[g][t], A[g+8][t], A[g][t+4],
// A[g+8][t+4]} of the warp's 16 rows (g = lane / 4, t = lane % 4); B from the descriptor (K-major,
// 128-byte swizzle).  d[4j + e]: row g + 8 (e >> 1), column 8j + 2t + (e & 1) of the warp's 16 rows.
template <int N>
__device__ __forceinline__ void wgmma_tf32(float* d, const unsigned* a, unsigned long long desc,
                                           int scale_d);

template <>
__device__ __forceinline__ void wgmma_tf32<128>(float* d, const unsigned* a,
                                                unsigned long long desc, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        BIGMM_WG_LIST64 ", "
        "{%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
        : BIGMM_WG_D64(0)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}

// D(64 x 128) = A(64 x 8) B(8 x 128): a fresh sum, D only written (its old values are not read).
template <int N>
__device__ __forceinline__ void wgmma_tf32_zero(float* d, const unsigned* a, unsigned long long desc);

template <>
__device__ __forceinline__ void wgmma_tf32_zero<128>(float* d, const unsigned* a,
                                                     unsigned long long desc) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        BIGMM_WG_LIST64 ", "
        "{%64, %65, %66, %67}, %68, 0, 1, 1;\n"
        : BIGMM_WG_W64(0)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}

template <>
__device__ __forceinline__ void wgmma_tf32<256>(float* d, const unsigned* a,
                                                unsigned long long desc, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 "
        BIGMM_WG_LIST128 ", "
        "{%128, %129, %130, %131}, %132, p, 1, 1;\n}\n"
        : BIGMM_WG_D64(0), BIGMM_WG_D64(64)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}

#endif  // BIGMM_WGMMA

}  // namespace bigmm

// ---- entry points ---------------------------------------------------------------------------
// A family file defines BIGMM_DTYPE, BIGMM_MIN_BLOCKS, BIGMM_CHECKS, the typedefs BigmmTile and
// BigmmCompute, then expands BIGMM_DEFINE_ENTRIES.  One launch signature for every entry point
// (with -DBIGMM_CHECKS=1, the fields of bigmm::Checks follow).  Name: gemm_<A mode><B mode>,
// k/v/s/w = LOAD_K, LOAD_V, LOAD_S, LOAD_W.  NN uses k{v,s} (w{v,s} in families that read
// K-major tiles), NT kk (wk), TN {v,s}{v,s}, TT {v,s}k.  With
// -DBIGMM_ONLY only the entry -DBIGMM_ONLY_NAME with loaders -DBIGMM_ONLY_A, -DBIGMM_ONLY_B is
// compiled (the launcher compiles what it uses, one module per entry).
#if BIGMM_CHECKS
#define BIGMM_CHECK_PARAMS                                                                     \
    , const double *__restrict__ col_w, const double *__restrict__ col_wa, double *col,         \
        double *col_abs, const double *__restrict__ row_w, const double *__restrict__ row_wa,   \
        double *row, double *row_abs, double scale, int accumulate
#define BIGMM_CHECK_ARGS {col_w, col_wa, col, col_abs, row_w, row_wa, row, row_abs, scale, accumulate}
#else
#define BIGMM_CHECK_PARAMS
#define BIGMM_CHECK_ARGS {}
#endif

// The body every entry runs: the family's cp.async pipeline (gemm_body) unless a family file
// defines BIGMM_BODY to its own, with the same template parameters, before including this file.
#ifndef BIGMM_BODY
#define BIGMM_BODY bigmm::gemm_body
#endif

#define BIGMM_ENTRY(NAME, LA, LB)                                                              \
    extern "C" __global__ void __launch_bounds__(BigmmTile::NT, BIGMM_MIN_BLOCKS)              \
        NAME(int M, int N, int K, BIGMM_DTYPE alpha, const BIGMM_DTYPE* __restrict__ A,          \
             long long lda, const BIGMM_DTYPE* __restrict__ B, long long ldb, BIGMM_DTYPE beta,   \
             BIGMM_DTYPE* __restrict__ C, long long ldc, int c_vec, int k_chunk,                 \
             long long c_zstride BIGMM_CHECK_PARAMS) {                                           \
        const bigmm::Checks ck = BIGMM_CHECK_ARGS;                                              \
        BIGMM_BODY<BigmmTile, BigmmCompute, bigmm::LA, bigmm::LB, bool(BIGMM_CHECKS)>(         \
            M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, c_vec, k_chunk, c_zstride, ck);      \
    }

#if defined(BIGMM_ONLY)
#define BIGMM_DEFINE_ENTRIES BIGMM_ENTRY(BIGMM_ONLY_NAME, BIGMM_ONLY_A, BIGMM_ONLY_B)
#else
#define BIGMM_DEFINE_ENTRIES                                                                   \
    BIGMM_ENTRY(gemm_kv, LOAD_K, LOAD_V)                                                       \
    BIGMM_ENTRY(gemm_ks, LOAD_K, LOAD_S)                                                       \
    BIGMM_ENTRY(gemm_kk, LOAD_K, LOAD_K)                                                       \
    BIGMM_ENTRY(gemm_vv, LOAD_V, LOAD_V)                                                       \
    BIGMM_ENTRY(gemm_vs, LOAD_V, LOAD_S)                                                       \
    BIGMM_ENTRY(gemm_sv, LOAD_S, LOAD_V)                                                       \
    BIGMM_ENTRY(gemm_ss, LOAD_S, LOAD_S)                                                       \
    BIGMM_ENTRY(gemm_vk, LOAD_V, LOAD_K)                                                       \
    BIGMM_ENTRY(gemm_sk, LOAD_S, LOAD_K)                                                       \
    BIGMM_EXTRA_ENTRIES
#endif

// Entries of load modes that only some families read (LOAD_W: gemm_wgmma.cu), added to the full
// list by that family's file.
#ifndef BIGMM_EXTRA_ENTRIES
#define BIGMM_EXTRA_ENTRIES
#endif
