// Shared helpers for bigmm's GEMM kernels: asynchronous copies, 16-byte shared-memory
// vectors and the block-index swizzle. Included by every kernel family; compiled by
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

}  // namespace bigmm
