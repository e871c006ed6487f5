// Rate probes: the ceilings the GEMM kernels are measured against.  Each thread runs
// CHAINS independent FMA chains, `iters` steps each; the result is written so that nothing
// is optimised away.  flops = 2 * CHAINS * iters * threads.  peak_dmma_f64 does the same
// with independent 16x8x4 float64 tensor-core products (DMMA) per warp.
#include "common.cuh"

#define PEAK_CHAINS 8

template <typename T>
__device__ __forceinline__ void peak_fma(T* out, int iters, T a, T b) {
    T x[PEAK_CHAINS];
#pragma unroll
    for (int i = 0; i < PEAK_CHAINS; ++i) x[i] = T(threadIdx.x) * T(1e-3) + T(i);
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int u = 0; u < 8; ++u)
#pragma unroll
            for (int i = 0; i < PEAK_CHAINS; ++i) x[i] = x[i] * a + b;
    }
    T s = T(0);
#pragma unroll
    for (int i = 0; i < PEAK_CHAINS; ++i) s += x[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// iters counts groups of 8 steps: flops = 2 * 8 * PEAK_CHAINS * iters * threads.
extern "C" __global__ void __launch_bounds__(256) peak_fma_f32(float* out, int iters, float a, float b) {
    peak_fma<float>(out, iters, a, b);
}

extern "C" __global__ void __launch_bounds__(256) peak_fma_f64(double* out, int iters, double a, double b) {
    peak_fma<double>(out, iters, a, b);
}

// iters counts groups of 8 steps: flops = 2 * 16*8*4 * 8 * PEAK_CHAINS * iters * (threads / 32).
extern "C" __global__ void __launch_bounds__(256) peak_dmma_f64(double* out, int iters, double a, double b) {
    double d[PEAK_CHAINS][4];
    double fa[2] = {a, b}, fb = a + b;
#pragma unroll
    for (int i = 0; i < PEAK_CHAINS; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) d[i][e] = double(threadIdx.x) * 1e-3 + double(i + e);
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int u = 0; u < 8; ++u)
#pragma unroll
            for (int i = 0; i < PEAK_CHAINS; ++i) bigmm::dmma_16x8x4(d[i], fa, fb);
    }
    double s = 0.0;
#pragma unroll
    for (int i = 0; i < PEAK_CHAINS; ++i) s += d[i][0] + d[i][1] + d[i][2] + d[i][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
