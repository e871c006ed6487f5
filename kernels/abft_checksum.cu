// Checksums for algorithm-based fault tolerance (Huang & Abraham 1984): weighted sums along
// one axis of a strided matrix view, accumulated in double, and the comparison of expected
// against actual sums under a rounding bound.
//
// abft_sums_*_<t>: for the R x C view X (element (i, j) at X[i * sr + j * sc])
//     out[j]     += scale   * sum_i w[i]  * X[i, j]
//     out_abs[j] += |scale| * sum_i wa[i] * |X[i, j]|
// w == 0: weights of one; wa == 0: |w[i]| (or one); out_abs == 0: no absolute sums. Each
// block adds its partial sums to out with atomicAdd (the caller zeroes out first when it does
// not accumulate); block row blockIdx.y covers rows [blockIdx.y * rows_per_block, +
// rows_per_block). Three kernels, one signature, chosen by the launcher from the layout:
//
// abft_sums_contig_<t> (sr == 1; X and sc * sizeof(t) 16-byte aligned; rows_per_block a
//   multiple of 16 / sizeof(t)): the summed axis is contiguous. Each warp sums OUTS columns
//   j at once, its lanes reading consecutive 16-byte vectors along i (so one weight load
//   serves OUTS columns and OUTS loads are in flight per lane), then a shuffle reduction and
//   one atomicAdd per column. Warps stride over the column groups (grid sized to residency).
// abft_sums_strided_<t> (sc == 1; X and sr * sizeof(t) 16-byte aligned): columns are
//   contiguous. Each thread owns one 16-byte vector of consecutive j and walks rows i with a
//   stride of ROWS, UNROLL loads in flight (coalesced across the warp); a shared-memory tree
//   reduction over the ROWS thread rows, one atomicAdd per column and block.
// abft_sums_<t> (any strides: the fallback): a block of 32 x 8 threads sums 32 columns;
//   32 x 32 tiles pass through shared memory so that the global loads are coalesced along
//   whichever axis is contiguous (threadIdx.x runs along i when sr == 1, along j otherwise);
//   each thread keeps partial sums of one column, a shared-memory tree reduction over the 8
//   thread rows combines them.
//
// abft_compare: one block; result[0] = max_j |expected_j - actual_j| / (rel_tol *
// magnitude_j + floor), result[1] = its j (-1 when n == 0). A non-finite expected or
// magnitude (Inf or NaN in the inputs) cannot be checked and counts 0; a non-finite actual
// against a finite expected counts +Inf, unless magnitude_j * (1 + rel_tol) reaches limit
// (the dtype's largest finite value): an element of C may then truly have overflowed.
#include "common.cuh"

namespace {

constexpr int TILE = 32;   // columns per block, and rows per shared-memory tile
constexpr int ROWS = 8;    // thread rows per block (fallback and strided), warps (contig)
constexpr int OUTS = 4;    // columns per warp (contig)
constexpr int UNROLL = 4;  // row loads in flight per thread (strided)
constexpr int MIN_BLOCKS = 4;  // fast paths: blocks of 256 threads resident per SM (<= 64 regs)
constexpr double MAX_FINITE = 1.7976931348623157e308;

// The weights of row i: (w[i], wa[i]) with the defaults of the header comment.
__device__ __forceinline__ void weights_of(const double* __restrict__ w,
                                           const double* __restrict__ wa, int i, double& wi,
                                           double& wai) {
    wi = w ? w[i] : 1.0;
    wai = wa ? wa[i] : fabs(wi);
}

// out[j] += scale * s and out_abs[j] += |scale| * sa.
__device__ __forceinline__ void add_out(double* __restrict__ out, double* __restrict__ out_abs,
                                        int j, double scale, double s, double sa) {
    atomicAdd(out + j, scale * s);
    if (out_abs) atomicAdd(out_abs + j, fabs(scale) * sa);
}

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
    if (ty == 0 && j0 + tx < C) add_out(out, out_abs, j0 + tx, scale, red[0][0][tx], red[1][0][tx]);
}

// Fast path, summed axis contiguous (sr == 1): see the header comment.
template <typename T>
__device__ __forceinline__ void abft_sums_contig(int R, int C, const T* __restrict__ X,
                                                 long long sc, const double* __restrict__ w,
                                                 const double* __restrict__ wa, double scale,
                                                 int rows_per_block, double* __restrict__ out,
                                                 double* __restrict__ out_abs) {
    constexpr int V = 16 / sizeof(T);
    const int lane = threadIdx.x % 32;
    const int i_begin = blockIdx.y * rows_per_block;
    const int i_end = min(R, i_begin + rows_per_block);
    const int i_vec_end = i_end - (i_end - i_begin) % V;  // [i_vec_end, i_end): scalar tail
    for (int j0 = (blockIdx.x * ROWS + threadIdx.x / 32) * OUTS; j0 < C;
         j0 += gridDim.x * ROWS * OUTS) {
        const int outs = min(OUTS, C - j0);
        double s[OUTS], sa[OUTS];
#pragma unroll
        for (int o = 0; o < OUTS; ++o) s[o] = sa[o] = 0.0;
        for (int i = i_begin + lane * V; i < i_vec_end; i += 32 * V) {
            T x[OUTS][V];
#pragma unroll
            for (int o = 0; o < OUTS; ++o) {
                if (o < outs) {
                    bigmm::load16(x[o], X + (long long)(j0 + o) * sc + i);
                } else {
#pragma unroll
                    for (int e = 0; e < V; ++e) x[o][e] = T(0);
                }
            }
#pragma unroll
            for (int e = 0; e < V; ++e) {
                double wi, wai;
                weights_of(w, wa, i + e, wi, wai);
#pragma unroll
                for (int o = 0; o < OUTS; ++o) {
                    const double v = double(x[o][e]);
                    s[o] = fma(wi, v, s[o]);
                    sa[o] = fma(wai, fabs(v), sa[o]);
                }
            }
        }
        const int i = i_vec_end + lane;
        if (i < i_end) {
            double wi, wai;
            weights_of(w, wa, i, wi, wai);
#pragma unroll
            for (int o = 0; o < OUTS; ++o) {
                if (o < outs) {
                    const double v = double(X[(long long)(j0 + o) * sc + i]);
                    s[o] = fma(wi, v, s[o]);
                    sa[o] = fma(wai, fabs(v), sa[o]);
                }
            }
        }
#pragma unroll
        for (int o = 0; o < OUTS; ++o) {
#pragma unroll
            for (int h = 16; h > 0; h >>= 1) {
                s[o] += __shfl_xor_sync(0xffffffffu, s[o], h);
                sa[o] += __shfl_xor_sync(0xffffffffu, sa[o], h);
            }
        }
        if (lane < outs) {  // lane o adds column j0 + o
            double so = s[0], sao = sa[0];
#pragma unroll
            for (int o = 1; o < OUTS; ++o) {
                if (lane == o) {
                    so = s[o];
                    sao = sa[o];
                }
            }
            add_out(out, out_abs, j0 + lane, scale, so, sao);
        }
    }
}

// Fast path, columns contiguous (sc == 1): see the header comment. Block ROWS x 32 threads.
template <typename T>
__device__ __forceinline__ void abft_sums_strided(int R, int C, const T* __restrict__ X,
                                                  long long sr, const double* __restrict__ w,
                                                  const double* __restrict__ wa, double scale,
                                                  int rows_per_block, double* __restrict__ out,
                                                  double* __restrict__ out_abs) {
    constexpr int V = 16 / sizeof(T);
    __shared__ double red[2][ROWS][V][TILE];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int j = (blockIdx.x * TILE + tx) * V;
    const int valid = min(V, C - j);  // columns of this thread's vector inside the view
    const int i_begin = blockIdx.y * rows_per_block;
    const int i_end = min(R, i_begin + rows_per_block);
    double s[V], sa[V];
#pragma unroll
    for (int e = 0; e < V; ++e) s[e] = sa[e] = 0.0;
    if (valid > 0) {
        for (int i0 = i_begin + ty; i0 < i_end; i0 += ROWS * UNROLL) {
            T x[UNROLL][V];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int i = i0 + u * ROWS;
                const T* row = X + (long long)i * sr + j;
                if (i < i_end && valid == V) {
                    bigmm::load16(x[u], row);
                } else {
#pragma unroll
                    for (int e = 0; e < V; ++e) x[u][e] = (i < i_end && e < valid) ? row[e] : T(0);
                }
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int i = i0 + u * ROWS;
                if (i < i_end) {
                    double wi, wai;
                    weights_of(w, wa, i, wi, wai);
#pragma unroll
                    for (int e = 0; e < V; ++e) {
                        const double v = double(x[u][e]);
                        s[e] = fma(wi, v, s[e]);
                        sa[e] = fma(wai, fabs(v), sa[e]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int e = 0; e < V; ++e) {
        red[0][ty][e][tx] = s[e];
        red[1][ty][e][tx] = sa[e];
    }
    __syncthreads();
#pragma unroll
    for (int h = ROWS / 2; h > 0; h >>= 1) {
        if (ty < h) {
#pragma unroll
            for (int e = 0; e < V; ++e) {
                red[0][ty][e][tx] += red[0][ty + h][e][tx];
                red[1][ty][e][tx] += red[1][ty + h][e][tx];
            }
        }
        __syncthreads();
    }
    if (ty == 0) {
#pragma unroll
        for (int e = 0; e < V; ++e) {
            if (e < valid) add_out(out, out_abs, j + e, scale, red[0][0][e][tx], red[1][0][e][tx]);
        }
    }
}

}  // namespace

#define ABFT_SUMS_ARGS(T)                                                                   \
    int R, int C, const T* __restrict__ X, long long sr, long long sc,                      \
        const double* __restrict__ w, const double* __restrict__ wa, double scale,          \
        int rows_per_block, double* __restrict__ out, double* __restrict__ out_abs

extern "C" __global__ void __launch_bounds__(TILE * ROWS) abft_sums_f32(ABFT_SUMS_ARGS(float)) {
    abft_sums<float>(R, C, X, sr, sc, w, wa, scale, rows_per_block, out, out_abs);
}

extern "C" __global__ void __launch_bounds__(TILE * ROWS) abft_sums_f64(ABFT_SUMS_ARGS(double)) {
    abft_sums<double>(R, C, X, sr, sc, w, wa, scale, rows_per_block, out, out_abs);
}

extern "C" __global__ void __launch_bounds__(ROWS * 32, MIN_BLOCKS)
    abft_sums_contig_f32(ABFT_SUMS_ARGS(float)) {
    abft_sums_contig<float>(R, C, X, sc, w, wa, scale, rows_per_block, out, out_abs);
}

extern "C" __global__ void __launch_bounds__(ROWS * 32, MIN_BLOCKS)
    abft_sums_contig_f64(ABFT_SUMS_ARGS(double)) {
    abft_sums_contig<double>(R, C, X, sc, w, wa, scale, rows_per_block, out, out_abs);
}

extern "C" __global__ void __launch_bounds__(TILE * ROWS, MIN_BLOCKS)
    abft_sums_strided_f32(ABFT_SUMS_ARGS(float)) {
    abft_sums_strided<float>(R, C, X, sr, w, wa, scale, rows_per_block, out, out_abs);
}

extern "C" __global__ void __launch_bounds__(TILE * ROWS, MIN_BLOCKS)
    abft_sums_strided_f64(ABFT_SUMS_ARGS(double)) {
    abft_sums_strided<double>(R, C, X, sr, w, wa, scale, rows_per_block, out, out_abs);
}

extern "C" __global__ void __launch_bounds__(256)
    abft_compare(int n, const double* __restrict__ expected,
                 const double* __restrict__ magnitude, const double* __restrict__ actual,
                 double rel_tol, double floor, double limit, double* __restrict__ result) {
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
            ratio = m * (1.0 + rel_tol) >= limit ? 0.0  // a true overflow may be in it
                                                 : __longlong_as_double(0x7ff0000000000000LL);
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
