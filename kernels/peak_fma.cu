// FMA-rate probes: the ceilings the GEMM kernels are measured against.  Each thread runs
// CHAINS independent FMA chains, `iters` steps each; the result is written so that nothing
// is optimised away.  flops = 2 * CHAINS * iters * threads.
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
