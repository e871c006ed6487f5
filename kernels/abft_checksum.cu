// Checksums for algorithm-based fault tolerance (Huang & Abraham 1984): weighted sums along
// one axis of a strided matrix view, accumulated in double, and the comparison of expected
// against actual sums under a rounding bound.
//
// abft_sums_<t>: for the R x C view X (element (i, j) at X[i * sr + j * sc], any strides, so
// a transposed panel or a view inside a larger buffer is the same call with other strides)
//     out[j]     += scale   * sum_i w[i]  * X[i, j]
//     out_abs[j] += |scale| * sum_i wa[i] * |X[i, j]|
// w == 0: weights of one; wa == 0: |w[i]| (or one); out_abs == 0: no absolute sums.
// A block of 32 x 8 threads sums 32 columns over rows [blockIdx.y * rows_per_block, +
// rows_per_block): 32 x 32 tiles pass through shared memory so that the global loads are
// coalesced along whichever axis is contiguous (threadIdx.x runs along i when sr == 1, along
// j otherwise); each thread keeps partial sums of one column, a shared-memory tree reduction
// over the 8 thread rows combines them, and one atomicAdd per column and block adds the
// block's sum to out (the caller zeroes out first when it does not accumulate).
//
// abft_compare: one block; result[0] = max_j |expected_j - actual_j| / (rel_tol *
// magnitude_j + floor), result[1] = its j (-1 when n == 0). A non-finite expected or
// magnitude (Inf or NaN in the inputs) cannot be checked and counts 0; a non-finite actual
// against a finite expected counts +Inf.
#include "common.cuh"

namespace {

constexpr int TILE = 32;   // columns per block, and rows per shared-memory tile
constexpr int ROWS = 8;    // thread rows per block
constexpr double MAX_FINITE = 1.7976931348623157e308;

template <typename T>
__device__ __forceinline__ void abft_sums(int R, int C, const T* __restrict__ X, long long sr,
                                          long long sc, const double* __restrict__ w,
                                          const double* __restrict__ wa, double scale,
                                          int rows_per_block, double* __restrict__ out,
                                          double* __restrict__ out_abs) {
    __shared__ double tile[TILE][TILE + 1];
    __shared__ double red[2][ROWS][TILE];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int j0 = blockIdx.x * TILE;
    const int i_begin = blockIdx.y * rows_per_block;
    const int i_end = min(R, i_begin + rows_per_block);
    const bool along_i = (sr == 1 && sc != 1);
    double s = 0.0, sa = 0.0;
    for (int i0 = i_begin; i0 < i_end; i0 += TILE) {
        for (int r = ty; r < TILE; r += ROWS) {
            const int ii = along_i ? tx : r;
            const int jj = along_i ? r : tx;
            const int i = i0 + ii, j = j0 + jj;
            tile[ii][jj] = (i < i_end && j < C) ? double(X[i * sr + j * sc]) : 0.0;
        }
        __syncthreads();
        for (int ii = ty; ii < TILE && i0 + ii < i_end; ii += ROWS) {
            const int i = i0 + ii;
            const double v = tile[ii][tx];
            const double wi = w ? w[i] : 1.0;
            const double wai = wa ? wa[i] : fabs(wi);
            s += wi * v;
            sa += wai * fabs(v);
        }
        __syncthreads();
    }
    red[0][ty][tx] = s;
    red[1][ty][tx] = sa;
    __syncthreads();
#pragma unroll
    for (int h = ROWS / 2; h > 0; h >>= 1) {
        if (ty < h) {
            red[0][ty][tx] += red[0][ty + h][tx];
            red[1][ty][tx] += red[1][ty + h][tx];
        }
        __syncthreads();
    }
    if (ty == 0 && j0 + tx < C) {
        atomicAdd(out + j0 + tx, scale * red[0][0][tx]);
        if (out_abs) atomicAdd(out_abs + j0 + tx, fabs(scale) * red[1][0][tx]);
    }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(TILE * ROWS)
    abft_sums_f32(int R, int C, const float* __restrict__ X, long long sr, long long sc,
                  const double* __restrict__ w, const double* __restrict__ wa, double scale,
                  int rows_per_block, double* __restrict__ out, double* __restrict__ out_abs) {
    abft_sums<float>(R, C, X, sr, sc, w, wa, scale, rows_per_block, out, out_abs);
}

extern "C" __global__ void __launch_bounds__(TILE * ROWS)
    abft_sums_f64(int R, int C, const double* __restrict__ X, long long sr, long long sc,
                  const double* __restrict__ w, const double* __restrict__ wa, double scale,
                  int rows_per_block, double* __restrict__ out, double* __restrict__ out_abs) {
    abft_sums<double>(R, C, X, sr, sc, w, wa, scale, rows_per_block, out, out_abs);
}

extern "C" __global__ void __launch_bounds__(256)
    abft_compare(int n, const double* __restrict__ expected,
                 const double* __restrict__ magnitude, const double* __restrict__ actual,
                 double rel_tol, double floor, double* __restrict__ result) {
    __shared__ double worst[256];
    __shared__ int where[256];
    double best = -1.0;
    int at = -1;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const double e = expected[j], m = magnitude[j], a = actual[j];
        double ratio;
        if (!(fabs(e) <= MAX_FINITE && fabs(m) <= MAX_FINITE)) {
            ratio = 0.0;  // Inf or NaN in the inputs: nothing to check against
        } else if (!(fabs(a) <= MAX_FINITE)) {
            ratio = __longlong_as_double(0x7ff0000000000000LL);  // +Inf
        } else {
            ratio = fabs(e - a) / (rel_tol * m + floor);
        }
        if (ratio > best) {
            best = ratio;
            at = j;
        }
    }
    worst[threadIdx.x] = best;
    where[threadIdx.x] = at;
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h && worst[threadIdx.x + h] > worst[threadIdx.x]) {
            worst[threadIdx.x] = worst[threadIdx.x + h];
            where[threadIdx.x] = where[threadIdx.x + h];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        result[0] = worst[0] < 0.0 ? 0.0 : worst[0];
        result[1] = double(where[0]);
    }
}
