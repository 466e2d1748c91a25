// The row and table ops of the transformer family (ABI 1.5): layer_norm and its backward,
// embedding and its backward, triu, tril and cumsum. The pointwise ops (gelu, silu, sin, cos,
// rsqrt) are in cuda_activation.cu, attention in cuda_attention.cu.
//
// Note [CUDA layer norm]
//   Forward: one warp per row for rows up to kWarpRow elements, else one block of kRowThreads
//   per row. Lanes stride the row; the mean is reduced first and the biased variance second as
//   sum((x - mean)^2) (two passes over the row, which stays in L1/L2, so a row far from zero
//   loses nothing to cancellation), both in the compute type (f32 for f16/bf16, f64 for f64);
//   then y is written in a third pass, rounded once. mean and rstd are stored in the stats
//   type (the compute type). Backward: the same row split reduces sum(g) and sum(g xhat) and
//   writes dx; dweight and dbias are column sums over M done without atomics in two stages:
//   blocks of 32 columns x kColRows rows sum a chunk of rows each (partials in the compute
//   type, rows added in a fixed order), then blocks of 32 columns x kColRows add the chunks in a
//   fixed order. So every run gives the same bits.
//
// Note [CUDA embedding backward]
//   Deterministic scatter of rows, no floating atomics: the (index, position) pairs are sorted
//   by index with cub::DeviceRadixSort (stable, so equal indices keep increasing positions),
//   then one warp per run of equal indices adds its dy rows in that order, lanes striding the
//   columns, in the compute type, and stores each element of the row once. Rows no index names
//   stay 0 (a memset first). Bad indices are reported through Note [Deferred index errors] and
//   sorted past the table (key V), where no warp reads them.
#include "cuda_common.hpp"
#include "cuda_device.hpp"
#include "cuda_elementwise.cuh"
#include "cuda_index.cuh"
#include "cuda_kernels.hpp"
#include "cuda_types.cuh"

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>

namespace bp::cuda {
namespace {

constexpr int64_t kWarpRow = 1024;
constexpr int kRowThreads = 512;
constexpr int kColRows = 8;  // threadIdx.y of the column-sum blocks

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
  return v;
}

// Sum over `width` threads (32: one warp; else the block, sh holding width / 32 values).
// Every thread gets the total.
template <class A>
__device__ __forceinline__ A group_sum(A v, int width, A* sh) {
  v = warp_sum(v);
  if (width <= 32) return v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // sh may still be read from the previous reduction
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  A t = sh[0];
  for (int w = 1; w < width / 32; ++w) t += sh[w];
  return t;
}

__device__ __forceinline__ float a_rsqrt_of(float v) {
  return 1.0f / sqrtf(v);
}
__device__ __forceinline__ double a_rsqrt_of(double v) {
  return 1.0 / sqrt(v);
}

// ---- layer_norm -----------------------------------------------------------------------------

// One row: lanes t, t + width, ... of `width` threads.
template <class S>
__device__ __forceinline__ void ln_row(const S* x, const S* w, const S* b, S* y,
                                       compute_of_t<S>* mean_out, compute_of_t<S>* rstd_out,
                                       int64_t n, compute_of_t<S> eps, int t, int width,
                                       compute_of_t<S>* sh) {
  using A = compute_of_t<S>;
  A s = 0;
  for (int64_t j = t; j < n; j += width) s += load(x[j]);
  const A mean = group_sum(s, width, sh) / static_cast<A>(n);
  A sq = 0;
  for (int64_t j = t; j < n; j += width) {
    const A d = load(x[j]) - mean;
    sq += d * d;
  }
  const A rstd = a_rsqrt_of(group_sum(sq, width, sh) / static_cast<A>(n) + eps);
  for (int64_t j = t; j < n; j += width) {
    A v = (load(x[j]) - mean) * rstd;
    if (w) v *= load(w[j]);
    if (b) v += load(b[j]);
    y[j] = store<S>(v);
  }
  if (t == 0 && mean_out) {
    *mean_out = mean;
    *rstd_out = rstd;
  }
}

template <class S>
__global__ void __launch_bounds__(kThreads)
    ln_warp_kernel(const S* x, const S* w, const S* b, S* y, compute_of_t<S>* mean,
                   compute_of_t<S>* rstd, int64_t rows, int64_t n, compute_of_t<S> eps) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (r >= rows) return;  // a whole warp leaves together
  ln_row<S>(x + r * n, w, b, y + r * n, mean ? mean + r : nullptr, rstd ? rstd + r : nullptr, n,
            eps, threadIdx.x & 31, 32, nullptr);
}

template <class S>
__global__ void __launch_bounds__(kRowThreads)
    ln_block_kernel(const S* x, const S* w, const S* b, S* y, compute_of_t<S>* mean,
                    compute_of_t<S>* rstd, int64_t n, compute_of_t<S> eps) {
  __shared__ compute_of_t<S> sh[kRowThreads / 32];
  const int64_t r = blockIdx.x;
  ln_row<S>(x + r * n, w, b, y + r * n, mean ? mean + r : nullptr, rstd ? rstd + r : nullptr, n,
            eps, threadIdx.x, kRowThreads, sh);
}

// dx of one row (Note [CUDA layer norm]).
template <class S>
__device__ __forceinline__ void ln_back_row(const S* dy, const S* x, compute_of_t<S> mean,
                                            compute_of_t<S> rstd, const S* w, S* dx, int64_t n,
                                            int t, int width, compute_of_t<S>* sh) {
  using A = compute_of_t<S>;
  A sg = 0, sgx = 0;
  for (int64_t j = t; j < n; j += width) {
    const A g = w ? load(dy[j]) * load(w[j]) : load(dy[j]);
    sg += g;
    sgx += g * ((load(x[j]) - mean) * rstd);
  }
  sg = group_sum(sg, width, sh);
  sgx = group_sum(sgx, width, sh);
  const A inv_n = A(1) / static_cast<A>(n);
  const A mg = sg * inv_n, mgx = sgx * inv_n;
  for (int64_t j = t; j < n; j += width) {
    const A g = w ? load(dy[j]) * load(w[j]) : load(dy[j]);
    const A xhat = (load(x[j]) - mean) * rstd;
    dx[j] = store<S>(rstd * (g - mg - xhat * mgx));
  }
}

template <class S>
__global__ void __launch_bounds__(kThreads)
    ln_back_warp_kernel(const S* dy, const S* x, const compute_of_t<S>* mean,
                        const compute_of_t<S>* rstd, const S* w, S* dx, int64_t rows, int64_t n) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (r >= rows) return;
  ln_back_row<S>(dy + r * n, x + r * n, mean[r], rstd[r], w, dx + r * n, n, threadIdx.x & 31, 32,
                 nullptr);
}

template <class S>
__global__ void __launch_bounds__(kRowThreads)
    ln_back_block_kernel(const S* dy, const S* x, const compute_of_t<S>* mean,
                         const compute_of_t<S>* rstd, const S* w, S* dx, int64_t n) {
  __shared__ compute_of_t<S> sh[kRowThreads / 32];
  const int64_t r = blockIdx.x;
  ln_back_row<S>(dy + r * n, x + r * n, mean[r], rstd[r], w, dx + r * n, n, threadIdx.x,
                 kRowThreads, sh);
}

// Stage 1 of dweight/dbias: block (x = 32 columns, y = kColRows) sums rows [c * rows_per,
// (c + 1) * rows_per) of chunk c = blockIdx.y into part_w/part_b[c][j].
template <class S>
__global__ void __launch_bounds__(32 * kColRows)
    ln_col_partial_kernel(const S* dy, const S* x, const compute_of_t<S>* mean,
                          const compute_of_t<S>* rstd, compute_of_t<S>* part_w,
                          compute_of_t<S>* part_b, int64_t m, int64_t n, int64_t rows_per) {
  using A = compute_of_t<S>;
  __shared__ A sw[kColRows][32];
  __shared__ A sb[kColRows][32];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per;
  const int64_t r1 = m < r0 + rows_per ? m : r0 + rows_per;
  A aw = 0, ab = 0;
  if (j < n) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColRows) {
      const A g = load(dy[r * n + j]);
      aw += g * ((load(x[r * n + j]) - mean[r]) * rstd[r]);
      ab += g;
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && j < n) {
    for (int k = 1; k < kColRows; ++k) {
      aw += sw[k][threadIdx.x];
      ab += sb[k][threadIdx.x];
    }
    part_w[blockIdx.y * n + j] = aw;
    part_b[blockIdx.y * n + j] = ab;
  }
}

// Stage 2: block (x = 32 columns, y = kColRows) adds the chunks of its columns, thread y taking
// chunks y, y + kColRows, ..., then thread 0 of each column adds the kColRows sums in order and
// rounds once. (One thread per column walking all the chunks left GPT-2's 768 columns with 768
// threads on 3 SMs; this form takes 8 us for its [256, 768] partials on an H200.)
template <class S>
__global__ void __launch_bounds__(32 * kColRows)
    ln_col_final_kernel(const compute_of_t<S>* part_w, const compute_of_t<S>* part_b, S* dw, S* db,
                        int64_t chunks, int64_t n) {
  using A = compute_of_t<S>;
  __shared__ A sw[kColRows][32];
  __shared__ A sb[kColRows][32];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  A aw = 0, ab = 0;
  if (j < n) {
    for (int64_t c = threadIdx.y; c < chunks; c += kColRows) {
      aw += part_w[c * n + j];
      ab += part_b[c * n + j];
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y != 0 || j >= n) return;
  for (int k = 1; k < kColRows; ++k) {
    aw += sw[k][threadIdx.x];
    ab += sb[k][threadIdx.x];
  }
  dw[j] = store<S>(aw);
  db[j] = store<S>(ab);
}

void check_rank(const bp_tensor_desc& t, int32_t rank, const int64_t* shape, const char* role) {
  bool ok = t.rank == rank;
  for (int32_t d = 0; ok && d < rank; ++d) ok = t.shape[d] == shape[d];
  if (!ok)
    invalid(bp::sdk::format("%s has shape %s, expected %s", role,
                            shape_string(t.shape, t.rank).c_str(),
                            shape_string(shape, rank).c_str()));
}

template <int D>
void launch_layer_norm(const LaunchArgs& a) {
  using S = storage_t<D>;
  using A = compute_of_t<S>;
  constexpr int32_t kStat = D == BP_DTYPE_F64 ? BP_DTYPE_F64 : BP_DTYPE_F32;
  if (a.nin < 1 || a.nin > 3 || (a.nout != 1 && a.nout != 3))
    invalid(
        bp::sdk::format("layer_norm expects 1 to 3 inputs (x, weight, bias) and 1 or 3 "
                        "outputs (y, mean, rstd), got %d and %d",
                        a.nin, a.nout));
  const bp_tensor_desc& X = a.in[0];
  check_desc(X, D, "input 0 (x)");
  if (X.rank != 2)
    invalid(bp::sdk::format("layer_norm: x must be [M, N], got %s",
                            shape_string(X.shape, X.rank).c_str()));
  const int64_t M = X.shape[0], N = X.shape[1];
  const int64_t vec[1] = {N}, rows[1] = {M};
  if (a.nin > 1) {
    check_desc(a.in[1], D, "input 1 (weight)");
    check_rank(a.in[1], 1, vec, "input 1 (weight)");
  }
  if (a.nin > 2) {
    check_desc(a.in[2], D, "input 2 (bias)");
    check_rank(a.in[2], 1, vec, "input 2 (bias)");
  }
  check_desc(a.out[0], D, "output 0 (y)");
  check_same_shape(a.out[0], X, "output 0 (y)");
  if (a.nout == 3) {
    check_desc(a.out[1], kStat, "output 1 (mean)");
    check_rank(a.out[1], 1, rows, "output 1 (mean)");
    check_desc(a.out[2], kStat, "output 2 (rstd)");
    check_rank(a.out[2], 1, rows, "output 2 (rstd)");
  }
  if (M == 0) return;
  if (N == 0) invalid("layer_norm: rows of 0 elements have no mean (N must be >= 1)");
  const A eps = static_cast<A>(a.attrs->f(BP_ATTR_ID_EPS, 1e-5));
  const S* x = data_ptr<const S>(X);
  const S* w = a.nin > 1 ? data_ptr<const S>(a.in[1]) : nullptr;
  const S* b = a.nin > 2 ? data_ptr<const S>(a.in[2]) : nullptr;
  S* y = data_ptr<S>(a.out[0]);
  A* mean = a.nout == 3 ? data_ptr<A>(a.out[1]) : nullptr;
  A* rstd = a.nout == 3 ? data_ptr<A>(a.out[2]) : nullptr;
  if (N <= kWarpRow) {
    ln_warp_kernel<S><<<static_cast<unsigned>(ceil_div(M, kThreads / 32)), kThreads, 0, a.stream>>>(
        x, w, b, y, mean, rstd, M, N, eps);
  } else {
    ln_block_kernel<S>
        <<<static_cast<unsigned>(M), kRowThreads, 0, a.stream>>>(x, w, b, y, mean, rstd, N, eps);
  }
  BP_CUDA_CHECK(cudaGetLastError());
}

template <int D>
void launch_layer_norm_backward(const LaunchArgs& a) {
  using S = storage_t<D>;
  using A = compute_of_t<S>;
  constexpr int32_t kStat = D == BP_DTYPE_F64 ? BP_DTYPE_F64 : BP_DTYPE_F32;
  if (!((a.nin == 4 && a.nout == 1) || (a.nin == 5 && a.nout == 3)))
    invalid(
        bp::sdk::format("layer_norm_backward expects dy, x, mean, rstd (, weight) -> dx "
                        "(, dweight, dbias): 4 inputs and 1 output, or 5 and 3; got %d and "
                        "%d",
                        a.nin, a.nout));
  const bp_tensor_desc& X = a.in[1];
  check_desc(a.in[0], D, "input 0 (dy)");
  check_desc(X, D, "input 1 (x)");
  if (X.rank != 2)
    invalid(bp::sdk::format("layer_norm_backward: x must be [M, N], got %s",
                            shape_string(X.shape, X.rank).c_str()));
  check_same_shape(a.in[0], X, "input 0 (dy)");
  const int64_t M = X.shape[0], N = X.shape[1];
  const int64_t vec[1] = {N}, rows[1] = {M};
  check_desc(a.in[2], kStat, "input 2 (mean)");
  check_rank(a.in[2], 1, rows, "input 2 (mean)");
  check_desc(a.in[3], kStat, "input 3 (rstd)");
  check_rank(a.in[3], 1, rows, "input 3 (rstd)");
  check_desc(a.out[0], D, "output 0 (dx)");
  check_same_shape(a.out[0], X, "output 0 (dx)");
  const bool affine = a.nin == 5;
  if (affine) {
    check_desc(a.in[4], D, "input 4 (weight)");
    check_rank(a.in[4], 1, vec, "input 4 (weight)");
    check_desc(a.out[1], D, "output 1 (dweight)");
    check_rank(a.out[1], 1, vec, "output 1 (dweight)");
    check_desc(a.out[2], D, "output 2 (dbias)");
    check_rank(a.out[2], 1, vec, "output 2 (dbias)");
  }
  if (N == 0) return;
  if (M == 0) {
    if (affine) {  // sums of no rows
      BP_CUDA_CHECK(cudaMemsetAsync(data_ptr<S>(a.out[1]), 0, N * sizeof(S), a.stream));
      BP_CUDA_CHECK(cudaMemsetAsync(data_ptr<S>(a.out[2]), 0, N * sizeof(S), a.stream));
    }
    return;
  }
  const S* dy = data_ptr<const S>(a.in[0]);
  const S* x = data_ptr<const S>(X);
  const A* mean = data_ptr<const A>(a.in[2]);
  const A* rstd = data_ptr<const A>(a.in[3]);
  const S* w = affine ? data_ptr<const S>(a.in[4]) : nullptr;
  S* dx = data_ptr<S>(a.out[0]);
  if (N <= kWarpRow) {
    ln_back_warp_kernel<S>
        <<<static_cast<unsigned>(ceil_div(M, kThreads / 32)), kThreads, 0, a.stream>>>(
            dy, x, mean, rstd, w, dx, M, N);
  } else {
    ln_back_block_kernel<S>
        <<<static_cast<unsigned>(M), kRowThreads, 0, a.stream>>>(dy, x, mean, rstd, w, dx, N);
  }
  BP_CUDA_CHECK(cudaGetLastError());
  if (!affine) return;
  // At most 256 chunks of at least 32 rows (Note [CUDA layer norm]).
  const int64_t rows_per = std::max<int64_t>(32, ceil_div(M, 256));
  const int64_t chunks = ceil_div(M, rows_per);
  const uint64_t bytes = static_cast<uint64_t>(2 * chunks * N) * sizeof(A);
  CudaStream& s = *a.s;
  A* part = static_cast<A*>(a.device->allocate_scratch(s, bytes));
  ln_col_partial_kernel<S>
      <<<dim3(static_cast<unsigned>(ceil_div(N, 32)), static_cast<unsigned>(chunks)),
         dim3(32, kColRows), 0, a.stream>>>(dy, x, mean, rstd, part, part + chunks * N, M, N,
                                            rows_per);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) {
    ln_col_final_kernel<S>
        <<<static_cast<unsigned>(ceil_div(N, 32)), dim3(32, kColRows), 0, a.stream>>>(
            part, part + chunks * N, data_ptr<S>(a.out[1]), data_ptr<S>(a.out[2]), chunks, N);
    e = cudaGetLastError();
  }
  a.device->free_scratch(s, part, bytes);
  BP_CUDA_CHECK(e);
}

// ---- embedding ------------------------------------------------------------------------------

template <class S>
__global__ void __launch_bounds__(kThreads)
    embedding_kernel(const S* w, const int64_t* idx, S* out, int64_t V, int64_t D, int64_t total,
                     IndexError* rec) {
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; o < total;
       o += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t m = o / D, j = o - m * D;
    const int64_t t = idx[m];
    if (t < 0 || t >= V) {
      if (j == 0) report_index(rec, kIndexEmbedding, 0, t, m, V);
      out[o] = store<S>(compute_of_t<S>(0));
    } else {
      out[o] = w[t * D + j];
    }
  }
}

// Keys (the index, V for a bad one) and positions for the sort; reports bad indices.
__global__ void __launch_bounds__(kThreads)
    embedding_keys_kernel(const int64_t* idx, int64_t* keys, int64_t* pos, int64_t V, int64_t M,
                          IndexError* rec) {
  for (int64_t m = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; m < M;
       m += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t t = idx[m];
    const bool bad = t < 0 || t >= V;
    if (bad) report_index(rec, kIndexEmbeddingBackward, 0, t, m, V);
    keys[m] = bad ? V : t;
    pos[m] = m;
  }
}

// One warp per sorted position p that starts a run of equal keys (Note [CUDA embedding
// backward]).
template <class S>
__global__ void __launch_bounds__(kThreads)
    embedding_rows_kernel(const S* dy, const int64_t* keys, const int64_t* pos, S* dw, int64_t V,
                          int64_t D, int64_t M) {
  using A = compute_of_t<S>;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (p >= M) return;
  const int64_t t = keys[p];
  if (t >= V || (p > 0 && keys[p - 1] == t)) return;
  int64_t end = p + 1;
  while (end < M && keys[end] == t) ++end;
  for (int64_t j = threadIdx.x & 31; j < D; j += 32) {
    A acc = 0;
    for (int64_t q = p; q < end; ++q) acc += load(dy[pos[q] * D + j]);
    dw[t * D + j] = store<S>(acc);
  }
}

unsigned grid_of(const LaunchArgs& a, int64_t n) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>(ceil_div(n, kThreads), a.sm_count * 32)));
}

void check_indices(const LaunchArgs& a, const bp_tensor_desc& I, int64_t V, int64_t M) {
  check_desc(I, BP_DTYPE_I64, "input 1 (indices)");
  if (I.rank != 1)
    invalid(bp::sdk::format("%s: indices must be [M] (the host flattens them), got %s",
                            op_name(a.op), shape_string(I.shape, I.rank).c_str()));
  if (V == 0 && M > 0)
    invalid(bp::sdk::format("%s: %lld indices into a table of 0 rows are all out of range",
                            op_name(a.op), static_cast<long long>(M)));
}

template <int D>
void launch_embedding(const LaunchArgs& a) {
  using S = storage_t<D>;
  check_arity(a, 2, 1);
  const bp_tensor_desc& W = a.in[0];
  const bp_tensor_desc& I = a.in[1];
  check_desc(W, D, "input 0 (weight)");
  if (W.rank != 2)
    invalid(bp::sdk::format("embedding: weight must be [V, D], got %s",
                            shape_string(W.shape, W.rank).c_str()));
  const int64_t V = W.shape[0], Dm = W.shape[1];
  const int64_t M = I.rank == 1 ? I.shape[0] : 0;
  check_indices(a, I, V, M);
  const int64_t os[2] = {M, Dm};
  check_desc(a.out[0], D, "output");
  check_rank(a.out[0], 2, os, "output");
  const int64_t n = M * Dm;
  if (n == 0) return;
  const IndexLaunch slot(a);
  embedding_kernel<S>
      <<<grid_of(a, n), kThreads, 0, a.stream>>>(data_ptr<const S>(W), data_ptr<const int64_t>(I),
                                                 data_ptr<S>(a.out[0]), V, Dm, n, slot.record());
  BP_CUDA_CHECK(cudaGetLastError());
}

int end_bit_for(int64_t v) {  // bits of the largest key, V
  int bits = 1;
  while (bits < 63 && (v >> bits) != 0) ++bits;
  return bits;
}

template <int D>
void launch_embedding_backward(const LaunchArgs& a) {
  using S = storage_t<D>;
  check_arity(a, 2, 1);
  const bp_tensor_desc& DY = a.in[0];
  const bp_tensor_desc& I = a.in[1];
  const bp_tensor_desc& DW = a.out[0];
  check_desc(DY, D, "input 0 (dy)");
  check_desc(DW, D, "output (dweight)");
  if (DW.rank != 2 || DY.rank != 2)
    invalid(bp::sdk::format(
        "embedding_backward: dy must be [M, D] and dweight [V, D], got %s "
        "and %s",
        shape_string(DY.shape, DY.rank).c_str(), shape_string(DW.shape, DW.rank).c_str()));
  const int64_t V = DW.shape[0], Dm = DW.shape[1], M = DY.shape[0];
  check_indices(a, I, V, M);
  const int64_t ds[2] = {I.shape[0], Dm};
  check_rank(DY, 2, ds, "input 0 (dy)");
  if (V * Dm == 0) return;
  S* dw = data_ptr<S>(DW);
  BP_CUDA_CHECK(cudaMemsetAsync(dw, 0, static_cast<size_t>(V * Dm) * sizeof(S), a.stream));
  if (M == 0) return;
  if (M > INT32_MAX)
    invalid(bp::sdk::format("embedding_backward: %lld indices exceed the sort's limit of 2^31",
                            static_cast<long long>(M)));
  const IndexLaunch slot(a);  // held until the kernel that reports is queued
  IndexError* rec = slot.record();
  // Scratch: keys and positions, in and out of the sort, then CUB's temporary storage.
  const int m = static_cast<int>(M);
  const int end_bit = end_bit_for(V);
  size_t temp_bytes = 0;
  BP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, temp_bytes, static_cast<int64_t*>(nullptr), static_cast<int64_t*>(nullptr),
      static_cast<int64_t*>(nullptr), static_cast<int64_t*>(nullptr), m, 0, end_bit, a.stream));
  const uint64_t arrays = static_cast<uint64_t>(4 * M) * sizeof(int64_t);
  const uint64_t bytes = arrays + temp_bytes;
  CudaStream& s = *a.s;
  char* scratch = static_cast<char*>(a.device->allocate_scratch(s, bytes));
  int64_t* keys_in = reinterpret_cast<int64_t*>(scratch);
  int64_t* pos_in = keys_in + M;
  int64_t* keys = pos_in + M;
  int64_t* pos = keys + M;
  embedding_keys_kernel<<<grid_of(a, M), kThreads, 0, a.stream>>>(data_ptr<const int64_t>(I),
                                                                  keys_in, pos_in, V, M, rec);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess)
    e = cub::DeviceRadixSort::SortPairs(scratch + arrays, temp_bytes, keys_in, keys, pos_in, pos, m,
                                        0, end_bit, a.stream);
  if (e == cudaSuccess) {
    embedding_rows_kernel<S>
        <<<static_cast<unsigned>(ceil_div(M, kThreads / 32)), kThreads, 0, a.stream>>>(
            data_ptr<const S>(DY), keys, pos, dw, V, Dm, M);
    e = cudaGetLastError();
  }
  a.device->free_scratch(s, scratch, bytes);
  BP_CUDA_CHECK(e);
}

// ---- triu, tril, cumsum ---------------------------------------------------------------------

// Element bits copied or zeroed (every dtype, NaN payloads kept).
template <class U, bool kUpper>
__global__ void __launch_bounds__(kThreads)
    triangle_kernel(const U* x, U* y, int64_t R, int64_t C, int64_t diagonal, int64_t total) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t c = i % C, r = (i / C) % R;
    const bool keep = kUpper ? c - r >= diagonal : c - r <= diagonal;
    y[i] = keep ? x[i] : U(0);
  }
}

template <int D, bool kUpper>
void launch_triangle(const LaunchArgs& a) {
  using U = sized_uint_t<sizeof(storage_t<D>)>;
  check_arity(a, 1, 1);
  const bp_tensor_desc& X = a.in[0];
  check_desc(X, D, "input 0 (x)");
  check_desc(a.out[0], D, "output");
  check_same_shape(a.out[0], X, "output");
  if (X.rank < 2)
    invalid(bp::sdk::format("%s: the input must have rank >= 2, got %s", op_name(a.op),
                            shape_string(X.shape, X.rank).c_str()));
  const int64_t n = numel(X);
  if (n == 0) return;
  triangle_kernel<U, kUpper><<<grid_of(a, n), kThreads, 0, a.stream>>>(
      data_ptr<const U>(X), data_ptr<U>(a.out[0]), X.shape[X.rank - 2], X.shape[X.rank - 1],
      a.attrs->i(BP_ATTR_ID_DIAGONAL, 0), n);
  BP_CUDA_CHECK(cudaGetLastError());
}

// One thread per (outer, inner) column walks the axis in order (the catalogue's summation
// order), accumulating in the compute type; integers wrap.
template <class S>
__global__ void __launch_bounds__(kThreads)
    cumsum_kernel(const S* x, S* y, int64_t outer, int64_t len, int64_t inner) {
  using A = compute_of_t<S>;
  const int64_t cols = outer * inner;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t o = (c / inner) * len * inner + c % inner;
    A acc = 0;
    for (int64_t i = 0; i < len; ++i) {
      acc = wrap_add(acc, load(x[o + i * inner]));
      y[o + i * inner] = store<S>(acc);
    }
  }
}

template <int D>
void launch_cumsum(const LaunchArgs& a) {
  using S = storage_t<D>;
  check_arity(a, 1, 1);
  const bp_tensor_desc& X = a.in[0];
  check_desc(X, D, "input 0 (x)");
  check_desc(a.out[0], D, "output");
  check_same_shape(a.out[0], X, "output");
  if (!a.attrs->has(BP_ATTR_ID_AXIS)) invalid("cumsum needs attribute axis");
  const int64_t axis = a.attrs->i(BP_ATTR_ID_AXIS, 0);
  if (axis < 0 || axis >= std::max<int32_t>(X.rank, 1))
    invalid(bp::sdk::format("cumsum: attribute axis %lld is not a dimension of %s",
                            static_cast<long long>(axis), shape_string(X.shape, X.rank).c_str()));
  int64_t outer = 1, inner = 1;
  for (int32_t d = 0; d < X.rank; ++d) {
    if (d < axis) outer *= X.shape[d];
    if (d > axis) inner *= X.shape[d];
  }
  const int64_t len = X.rank ? X.shape[axis] : 1;
  if (outer * len * inner == 0) return;
  cumsum_kernel<S><<<grid_of(a, outer * inner), kThreads, 0, a.stream>>>(
      data_ptr<const S>(X), data_ptr<S>(a.out[0]), outer, len, inner);
  BP_CUDA_CHECK(cudaGetLastError());
}

template <int D>
LaunchFn transformer_of(Op op) {
  constexpr bool kFloat =
      D == BP_DTYPE_F32 || D == BP_DTYPE_F64 || D == BP_DTYPE_F16 || D == BP_DTYPE_BF16;
  constexpr bool kSigned = kFloat || D == BP_DTYPE_I32 || D == BP_DTYPE_I64;
  switch (op) {
    case Op::kTriu:
      return &launch_triangle<D, true>;
    case Op::kTril:
      return &launch_triangle<D, false>;
    case Op::kCumsum:
      if constexpr (kSigned) return &launch_cumsum<D>;
      return nullptr;
    default:
      break;
  }
  if constexpr (kFloat) {
    switch (op) {
      case Op::kLayerNorm:
        return &launch_layer_norm<D>;
      case Op::kLayerNormBackward:
        return &launch_layer_norm_backward<D>;
      case Op::kEmbedding:
        return &launch_embedding<D>;
      case Op::kEmbeddingBackward:
        return &launch_embedding_backward<D>;
      default:
        break;
    }
  }
  return nullptr;
}

}  // namespace

LaunchFn transformer_fn(Op op, int32_t dtype) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return transformer_of<BP_DTYPE_F32>(op);
    case BP_DTYPE_F64:
      return transformer_of<BP_DTYPE_F64>(op);
    case BP_DTYPE_F16:
      return transformer_of<BP_DTYPE_F16>(op);
    case BP_DTYPE_BF16:
      return transformer_of<BP_DTYPE_BF16>(op);
    case BP_DTYPE_I32:
      return transformer_of<BP_DTYPE_I32>(op);
    case BP_DTYPE_I64:
      return transformer_of<BP_DTYPE_I64>(op);
    case BP_DTYPE_U8:
      return transformer_of<BP_DTYPE_U8>(op);
    case BP_DTYPE_BOOL:
      return transformer_of<BP_DTYPE_BOOL>(op);
    default:
      return nullptr;
  }
}

}  // namespace bp::cuda
