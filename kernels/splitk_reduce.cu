// Split-K reduction: C = alpha * sum_z W[z] + beta * C, C never read when beta == 0.
// W holds S partial products of M x N, each contiguous (leading dimension N), zstride
// elements apart; the sum over z runs in order.  Grid-stride loop over the elements of C.
#include "common.cuh"

template <typename T>
__device__ __forceinline__ void splitk_reduce(int M, int N, int S, T alpha,
                                              const T* __restrict__ W, long long zstride, T beta,
                                              T* __restrict__ C, long long ldc) {
    const long long total = (long long)M * N;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        T s = T(0);
        for (int z = 0; z < S; ++z) s += W[z * zstride + i];
        const long long m = i / N, n = i % N;
        T* c = C + m * ldc + n;
        *c = (beta == T(0)) ? alpha * s : alpha * s + beta * *c;
    }
}

extern "C" __global__ void __launch_bounds__(256)
    splitk_reduce_f32(int M, int N, int S, float alpha, const float* __restrict__ W,
                      long long zstride, float beta, float* __restrict__ C, long long ldc) {
    splitk_reduce<float>(M, N, S, alpha, W, zstride, beta, C, ldc);
}

extern "C" __global__ void __launch_bounds__(256)
    splitk_reduce_f64(int M, int N, int S, double alpha, const double* __restrict__ W,
                      long long zstride, double beta, double* __restrict__ C, long long ldc) {
    splitk_reduce<double>(M, N, S, alpha, W, zstride, beta, C, ldc);
}
