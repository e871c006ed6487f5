// Kernel 01, the baseline: the textbook 16x16 shared-memory tiled SGEMM.  One thread per
// element of C, one 16x16 tile of A and of B staged through shared memory per step of k.
// float32, row-major, NN only; C = alpha * A @ B + beta * C, C not read when beta == 0.
// Kept to measure the progression against (kernels/README.md); bigmm never launches it.
#include "common.cuh"

#define NAIVE_TILE 16

extern "C" __global__ void __launch_bounds__(NAIVE_TILE * NAIVE_TILE)
    sgemm_01_naive_tiled(int M, int N, int K, float alpha, const float* __restrict__ A,
                         long long lda, const float* __restrict__ B, long long ldb, float beta,
                         float* __restrict__ C, long long ldc) {
    __shared__ float As[NAIVE_TILE][NAIVE_TILE];
    __shared__ float Bs[NAIVE_TILE][NAIVE_TILE];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * NAIVE_TILE + ty, col = blockIdx.x * NAIVE_TILE + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += NAIVE_TILE) {
        As[ty][tx] = (row < M && k0 + tx < K) ? A[(long long)row * lda + k0 + tx] : 0.0f;
        Bs[ty][tx] = (k0 + ty < K && col < N) ? B[(long long)(k0 + ty) * ldb + col] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < NAIVE_TILE; ++k) acc += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    if (row < M && col < N) {
        float* c = C + (long long)row * ldc + col;
        *c = (beta == 0.0f) ? alpha * acc : alpha * acc + beta * *c;
    }
}
