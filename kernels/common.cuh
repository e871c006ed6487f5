// Shared helpers for bigmm's GEMM kernels: asynchronous copies, 16-byte shared-memory
// vectors, the block-index swizzle and the float64 tensor-core product. Included by every kernel family; compiled by
// NVRTC (through cupy.RawModule) and by nvcc (the CI resource check), so it uses no
// standard headers.
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

}  // namespace bigmm
