// scaled_dot_product_attention and its backward (ABI 1.5) through cuBLAS strided-batched GEMMs
// and fused row kernels of our own (Note [CUDA attention]).
//
// Note [CUDA attention]
//   The scores of a chunk of (batch, head) pairs and query rows are materialised in scratch
//   memory, in the compute type (f32 for f16/bf16, f64 for f64), by one strided-batched GEMM
//   with SCALE as alpha (Note [Row-major GEMM] in cuda_matmul.cpp for the operand mapping).
//   Forward: a row kernel (one block per query row) takes the row's maximum over the unmasked
//   keys, lse = max + log(sum exp(s - max)) (finite for any finite scores, however long the
//   row), and writes p z = exp(s - lse) z in the dtype (masked and dropped weights 0, z from
//   Note [Philox stream] at element ((b H + h) L + i) S + j exactly as the catalogue says), and
//   a second GEMM gives out = (p z) v. Backward recomputes the scores, gets dP = dout v^T by a
//   GEMM, and one elementwise pass per row makes p = exp(s - lse) from the saved lse, p z and
//   ds = p (z dP - D) with D = dout . out (a warp-per-row kernel first); then dv = (p z)^T dout,
//   dq = SCALE ds k and dk = SCALE ds^T q are three more GEMMs. GEMMs accumulate in f32 (f64 for
//   f64; f32 never uses TF32) and read p z and ds rounded to the dtype, as PyTorch's fused
//   kernels do for f16/bf16. The scratch of a launch is bounded (kScratchBytes): chunks of
//   (batch, head) pairs while their rows fit, else chunks of query rows of one pair, dk and dv
//   then accumulating over the row chunks (through compute-type buffers for f16/bf16, so they
//   are rounded once). Under the causal mask the rows come in blocks of about L / 8, and the
//   block of rows [r0, r0 + nr) multiplies only the keys [0, r0 + nr) it can see (about 56% of
//   the full products); dk and dv then start from zeros and every block adds to its prefix. This is
//   the path for f32, f64, dropout and every problem cuDNN refuses; f16 and bf16 without dropout
//   go to cuDNN's fused flash attention first (Note [cuDNN attention]).
#define BP_PHILOX_FN __host__ __device__ static inline
#include <backplane/abi/philox.h>

#include "cuda_attention_cudnn.hpp"
#include "cuda_blas.hpp"
#include "cuda_common.hpp"
#include "cuda_device.hpp"
#include "cuda_elementwise.cuh"
#include "cuda_kernels.hpp"
#include "cuda_types.cuh"

#include <algorithm>
#include <climits>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <mutex>
#include <vector>

namespace bp::cuda {
namespace {

constexpr uint64_t kScratchBytes = uint64_t{256} << 20;
constexpr int kRowBlock = 256;

template <int D>
struct AttnTypes {
  using A = float;  // scores, lse, accumulators
  static constexpr cudaDataType_t kType = D == BP_DTYPE_F32   ? CUDA_R_32F
                                          : D == BP_DTYPE_F16 ? CUDA_R_16F
                                                              : CUDA_R_16BF;
  static constexpr cudaDataType_t kAccType = CUDA_R_32F;
  static constexpr cublasComputeType_t kCompute = CUBLAS_COMPUTE_32F;
};
template <>
struct AttnTypes<BP_DTYPE_F64> {
  using A = double;
  static constexpr cudaDataType_t kType = CUDA_R_64F;
  static constexpr cudaDataType_t kAccType = CUDA_R_64F;
  static constexpr cublasComputeType_t kCompute = CUBLAS_COMPUTE_64F;
};

// One row-major operand of a GEMM: pointer, element type, leading dimension, batch stride and
// whether the stored matrix is the transpose of the math operand.
struct Mat {
  const void* p;
  cudaDataType_t type;
  int64_t ld;
  int64_t stride;
  bool trans;
};

// Scratch sections start on 256-byte boundaries (cuBLAS's fast paths want aligned operands).
struct Carve {
  uint64_t size = 0;
  uint64_t take(uint64_t bytes) {
    const uint64_t at = size;
    size += (bytes + 255) & ~uint64_t{255};
    return at;
  }
};

size_t type_size(cudaDataType_t t) {
  return t == CUDA_R_64F ? 8 : t == CUDA_R_32F ? 4 : 2;
}

// C[M,N] (row-major, ldc = N) = alpha op(A)[M,K] op(B)[K,N] + beta C, `batch` times (Note
// [Row-major GEMM] in cuda_matmul.cpp: cuBLAS computes C^T = op(B)^T op(A)^T). K == 0 writes
// beta C, i.e. zeros for beta 0.
template <class Scale>
void gemm(const LaunchArgs& a, cublasComputeType_t compute, int64_t M, int64_t N, int64_t K,
          Scale alpha, const Mat& A, const Mat& B, Scale beta, void* C, cudaDataType_t ctype,
          int64_t cstride, int64_t batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  if (K == 0) {
    if (beta == Scale(0))
      BP_CUDA_CHECK(cudaMemset2DAsync(C, static_cast<size_t>(cstride) * type_size(ctype), 0,
                                      static_cast<size_t>(M * N) * type_size(ctype),
                                      static_cast<size_t>(batch), a.stream));
    return;
  }
  if (std::max({M, N, K, A.ld, B.ld, batch}) > INT_MAX)
    invalid(
        bp::sdk::format("scaled_dot_product_attention: a product of %lld x %lld x %lld "
                        "(batch %lld) exceeds cuBLAS's 32-bit sizes",
                        static_cast<long long>(M), static_cast<long long>(N),
                        static_cast<long long>(K), static_cast<long long>(batch)));
  std::lock_guard<std::mutex> lock(a.device->cublas_mutex());
  cublasHandle_t h = bind_cublas_stream(a);
  BP_CUBLAS_CHECK(blas().gemm_strided_batched(
      h, B.trans ? CUBLAS_OP_T : CUBLAS_OP_N, A.trans ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, B.p, B.type,
      static_cast<int>(B.ld), B.stride, A.p, A.type, static_cast<int>(A.ld), A.stride, &beta, C,
      ctype, static_cast<int>(N), cstride, static_cast<int>(batch), compute, CUBLAS_GEMM_DEFAULT));
}

template <class A>
__device__ __forceinline__ A a_max(A x, A y) {
  return x > y ? x : y;
}

// Sum or maximum over the block (kRowBlock threads); every thread gets the result.
template <bool kMax, class A>
__device__ __forceinline__ A block_reduce(A v, A* sh) {
  for (int s = 16; s > 0; s >>= 1) {
    const A o = __shfl_xor_sync(0xffffffffu, v, s);
    v = kMax ? a_max(v, o) : v + o;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  A t = sh[0];
  for (int w = 1; w < kRowBlock / 32; ++w) t = kMax ? a_max(t, sh[w]) : t + sh[w];
  return t;
}

// Where a chunk lies: pairs [bh0, bh0 + nb), query rows [r0, r0 + nr).
struct Chunk {
  int64_t bh0, nb, r0, nr;
};

struct Dropout {
  double p;      // 0: no dropout
  double scale;  // 1 / (1 - p)
  uint64_t seed, offset;
};

// z_ij of the catalogue for element e = ((b H + h) L + i) S + j.
__device__ __forceinline__ double keep_scale(const Dropout& d, uint64_t e) {
  if (d.p <= 0) return 1.0;
  return static_cast<double>(bp_philox_uniform01(d.seed, d.offset + e)) < d.p ? 0.0 : d.scale;
}

// Forward row kernel (Note [CUDA attention]): block = row rr of the chunk.
template <class S, class A>
__global__ void __launch_bounds__(kRowBlock)
    softmax_rows_kernel(const A* scores, S* pz, A* lse, Chunk c, int64_t L, int64_t Sk,
                        int64_t Sfull, int causal, Dropout drop) {
  __shared__ A sh[kRowBlock / 32];
  const int64_t rr = blockIdx.x;
  const int64_t b = rr / c.nr, i = c.r0 + rr % c.nr;
  const A* s = scores + rr * Sk;
  S* out = pz + rr * Sk;
  const int64_t valid = causal ? (i + 1 < Sk ? i + 1 : Sk) : Sk;  // >= 1: Sk > 0, i >= 0
  A m = -std::numeric_limits<A>::infinity();
  for (int64_t j = threadIdx.x; j < valid; j += kRowBlock) m = a_max(m, s[j]);
  m = block_reduce<true>(m, sh);
  A sum = 0;
  for (int64_t j = threadIdx.x; j < valid; j += kRowBlock) sum += m_exp(s[j] - m);
  sum = block_reduce<false>(sum, sh);
  const A l = m + m_log(sum);
  const int64_t row = (c.bh0 + b) * L + i;
  if (threadIdx.x == 0) lse[row] = l;
  const uint64_t e0 = static_cast<uint64_t>(row) * static_cast<uint64_t>(Sfull);
  for (int64_t j = threadIdx.x; j < Sk; j += kRowBlock) {
    A w = 0;
    if (j < valid) {
      w = m_exp(s[j] - l);
      if (drop.p > 0) w *= static_cast<A>(keep_scale(drop, e0 + static_cast<uint64_t>(j)));
    }
    out[j] = store<S>(w);
  }
}

// D_i = dout_i . out_i, one warp per row of all B H L rows.
template <class S, class A>
__global__ void __launch_bounds__(kThreads)
    row_dot_kernel(const S* dout, const S* out, A* d, int64_t rows, int64_t ev) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (r >= rows) return;
  A acc = 0;
  for (int64_t e = threadIdx.x & 31; e < ev; e += 32)
    acc += static_cast<A>(load(dout[r * ev + e])) * static_cast<A>(load(out[r * ev + e]));
  for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
  if ((threadIdx.x & 31) == 0) d[r] = acc;
}

// Backward row pass: p = exp(s - lse), p z -> pz, p (z dP - D) -> ds (both in the dtype).
template <class S, class A>
__global__ void __launch_bounds__(kRowBlock)
    backward_rows_kernel(const A* scores, const A* dp, const A* lse, const A* dvec, S* pz, S* ds,
                         Chunk c, int64_t L, int64_t Sk, int64_t Sfull, int causal, Dropout drop) {
  const int64_t rr = blockIdx.x;
  const int64_t b = rr / c.nr, i = c.r0 + rr % c.nr;
  const int64_t row = (c.bh0 + b) * L + i;
  const int64_t valid = causal ? (i + 1 < Sk ? i + 1 : Sk) : Sk;
  const A l = lse[row], dd = dvec[row];
  const uint64_t e0 = static_cast<uint64_t>(row) * static_cast<uint64_t>(Sfull);
  const A* s = scores + rr * Sk;
  const A* g = dp + rr * Sk;
  for (int64_t j = threadIdx.x; j < Sk; j += kRowBlock) {
    A p = 0, z = 1;
    if (j < valid) {
      p = m_exp(s[j] - l);
      if (drop.p > 0) z = static_cast<A>(keep_scale(drop, e0 + static_cast<uint64_t>(j)));
    }
    pz[rr * Sk + j] = store<S>(p * z);
    ds[rr * Sk + j] = store<S>(p * (z * g[j] - dd));
  }
}

template <class S, class A>
__global__ void __launch_bounds__(kThreads) round_kernel(const A* in, S* out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    out[i] = store<S>(static_cast<compute_of_t<S>>(in[i]));
}

template <class A>
__global__ void __launch_bounds__(kThreads) fill_kernel(A* out, int64_t n, A v) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    out[i] = v;
}

unsigned grid_of(const LaunchArgs& a, int64_t n) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>(ceil_div(n, kThreads), a.sm_count * 32)));
}

struct Dims {
  int64_t B, H, L, S, E, Ev;
};

// Checks q, k, v (and the outputs' shapes) and returns the sizes.
Dims check_qkv(const LaunchArgs& a, int32_t dt) {
  const bp_tensor_desc& Q = a.in[0];
  const bp_tensor_desc& K = a.in[1];
  const bp_tensor_desc& V = a.in[2];
  check_desc(Q, dt, "input 0 (q)");
  check_desc(K, dt, "input 1 (k)");
  check_desc(V, dt, "input 2 (v)");
  if (Q.rank != 4 || K.rank != 4 || V.rank != 4 || K.shape[0] != Q.shape[0] ||
      V.shape[0] != Q.shape[0] || K.shape[1] != Q.shape[1] || V.shape[1] != Q.shape[1] ||
      K.shape[3] != Q.shape[3] || V.shape[2] != K.shape[2])
    invalid(bp::sdk::format("%s: q [B,H,L,E] %s, k [B,H,S,E] %s and v [B,H,S,Ev] %s do not agree",
                            op_name(a.op), shape_string(Q.shape, Q.rank).c_str(),
                            shape_string(K.shape, K.rank).c_str(),
                            shape_string(V.shape, V.rank).c_str()));
  return Dims{Q.shape[0], Q.shape[1], Q.shape[2], K.shape[2], Q.shape[3], V.shape[3]};
}

void check_shape(const bp_tensor_desc& t, int32_t dt, std::initializer_list<int64_t> shape,
                 const char* role) {
  check_desc(t, dt, role);
  bool ok = t.rank == static_cast<int32_t>(shape.size());
  int32_t d = 0;
  for (int64_t s : shape) ok = ok && t.shape[d++] == s;
  if (!ok) {
    std::vector<int64_t> want(shape);
    invalid(bp::sdk::format("%s has shape %s, expected %s", role,
                            shape_string(t.shape, t.rank).c_str(),
                            shape_string(want.data(), static_cast<int32_t>(want.size())).c_str()));
  }
}

struct Attrs {
  double scale;
  bool causal;
  Dropout drop;
};

Attrs read_attrs(const LaunchArgs& a, int64_t E) {
  Attrs r{};
  r.scale = a.attrs->f(BP_ATTR_ID_SCALE, E ? 1.0 / std::sqrt(static_cast<double>(E)) : 1.0);
  r.causal = a.attrs->i(BP_ATTR_ID_CAUSAL, 0) != 0;
  r.drop.p = a.attrs->f(BP_ATTR_ID_P, 0.0);
  if (!(r.drop.p >= 0.0 && r.drop.p < 1.0))
    invalid(bp::sdk::format("dropout probability p = %g is outside [0, 1)", r.drop.p));
  r.drop.scale = 1.0 / (1.0 - r.drop.p);
  r.drop.seed = static_cast<uint64_t>(a.attrs->i(BP_ATTR_ID_SEED, 0));
  r.drop.offset = static_cast<uint64_t>(a.attrs->i(BP_ATTR_ID_OFFSET, 0));
  return r;
}

AttnProblem problem(const Dims& d, const Attrs& at) {
  return AttnProblem{d.B, d.H, d.L, d.S, d.E, d.Ev, at.scale, at.causal};
}

// Pairs per chunk and rows per chunk (at most max_rows) for `per_elem` scratch bytes per score.
Chunk chunk_size(const Dims& d, uint64_t per_elem, int64_t max_rows) {
  const int64_t rows = std::min(d.L, max_rows);
  const uint64_t block = static_cast<uint64_t>(rows) * static_cast<uint64_t>(d.S) * per_elem;
  const int64_t BH = d.B * d.H;
  if (block <= kScratchBytes)
    return Chunk{0, std::min<int64_t>(BH, static_cast<int64_t>(kScratchBytes / block)), 0, rows};
  const uint64_t row = static_cast<uint64_t>(d.S) * per_elem;
  return Chunk{0, 1, 0, std::max<int64_t>(1, static_cast<int64_t>(kScratchBytes / row))};
}

// Rows per chunk: all of them, or under the causal mask blocks of about L / 8 (at least 16),
// so that the chunk of rows [r0, r0 + nr) computes only the keys [0, r0 + nr) it can see.
int64_t max_rows_of(const Dims& d, bool causal) {
  return causal ? std::max<int64_t>(16, ceil_div(d.L, 8)) : d.L;
}

template <int D>
void launch_forward(const LaunchArgs& a) {
  using S = storage_t<D>;
  using T = AttnTypes<D>;
  using A = typename T::A;
  constexpr bool kNarrow = D == BP_DTYPE_F16 || D == BP_DTYPE_BF16;
  constexpr int32_t kStat = D == BP_DTYPE_F64 ? BP_DTYPE_F64 : BP_DTYPE_F32;
  check_arity(a, 3, 2);
  const Dims d = check_qkv(a, D);
  check_shape(a.out[0], D, {d.B, d.H, d.L, d.Ev}, "output 0 (out)");
  check_shape(a.out[1], kStat, {d.B, d.H, d.L}, "output 1 (lse)");
  const Attrs at = read_attrs(a, d.E);
  const int64_t BH = d.B * d.H;
  if (BH * d.L == 0) return;
  S* out = data_ptr<S>(a.out[0]);
  A* lse = data_ptr<A>(a.out[1]);
  if (d.S == 0) {  // no keys: out = 0, lse = -inf
    if (d.Ev != 0)
      BP_CUDA_CHECK(
          cudaMemsetAsync(out, 0, static_cast<size_t>(BH * d.L * d.Ev) * sizeof(S), a.stream));
    fill_kernel<A><<<grid_of(a, BH * d.L), kThreads, 0, a.stream>>>(
        lse, BH * d.L, -std::numeric_limits<A>::infinity());
    BP_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const S* q = data_ptr<const S>(a.in[0]);
  const S* k = data_ptr<const S>(a.in[1]);
  const S* v = data_ptr<const S>(a.in[2]);
  if constexpr (kNarrow)  // Note [cuDNN attention]
    if (at.drop.p == 0 && cudnn_attention_forward(a, problem(d, at), q, k, v, out, lse)) return;
  const uint64_t per_elem = sizeof(A) + (kNarrow ? sizeof(S) : 0);
  const Chunk cs = chunk_size(d, per_elem, max_rows_of(d, at.causal));
  const uint64_t elems = static_cast<uint64_t>(cs.nb * cs.nr * d.S);
  Carve cv;
  const uint64_t at_scores = cv.take(elems * sizeof(A));
  const uint64_t at_pz = kNarrow ? cv.take(elems * sizeof(S)) : at_scores;
  const uint64_t bytes = cv.size;
  CudaStream& st = *a.s;
  char* base = static_cast<char*>(a.device->allocate_scratch(st, bytes));
  A* scores = reinterpret_cast<A*>(base + at_scores);
  S* pz = reinterpret_cast<S*>(base + at_pz);
  try {
    for (int64_t bh0 = 0; bh0 < BH; bh0 += cs.nb)
      for (int64_t r0 = 0; r0 < d.L; r0 += cs.nr) {
        const Chunk c{bh0, std::min(cs.nb, BH - bh0), r0, std::min(cs.nr, d.L - r0)};
        const int64_t sk = at.causal ? std::min(d.S, r0 + c.nr) : d.S;  // keys seen
        // scores = SCALE q k^T
        gemm<A>(a, T::kCompute, c.nr, sk, d.E, static_cast<A>(at.scale),
                Mat{q + (bh0 * d.L + r0) * d.E, T::kType, d.E, d.L * d.E, false},
                Mat{k + bh0 * d.S * d.E, T::kType, d.E, d.S * d.E, true}, A(0), scores, T::kAccType,
                c.nr * sk, c.nb);
        softmax_rows_kernel<S, A><<<static_cast<unsigned>(c.nb * c.nr), kRowBlock, 0, a.stream>>>(
            scores, pz, lse, c, d.L, sk, d.S, at.causal ? 1 : 0, at.drop);
        BP_CUDA_CHECK(cudaGetLastError());
        // out = (p z) v
        gemm<A>(a, T::kCompute, c.nr, d.Ev, sk, A(1), Mat{pz, T::kType, sk, c.nr * sk, false},
                Mat{v + bh0 * d.S * d.Ev, T::kType, d.Ev, d.S * d.Ev, false}, A(0),
                out + (bh0 * d.L + r0) * d.Ev, T::kType, d.L * d.Ev, c.nb);
      }
  } catch (...) {
    a.device->free_scratch(st, base, bytes);
    throw;
  }
  a.device->free_scratch(st, base, bytes);
}

template <int D>
void launch_backward(const LaunchArgs& a) {
  using S = storage_t<D>;
  using T = AttnTypes<D>;
  using A = typename T::A;
  constexpr bool kNarrow = D == BP_DTYPE_F16 || D == BP_DTYPE_BF16;
  constexpr int32_t kStat = D == BP_DTYPE_F64 ? BP_DTYPE_F64 : BP_DTYPE_F32;
  check_arity(a, 6, 3);
  const Dims d = check_qkv(a, D);
  check_shape(a.in[3], D, {d.B, d.H, d.L, d.Ev}, "input 3 (out)");
  check_shape(a.in[4], D, {d.B, d.H, d.L, d.Ev}, "input 4 (dout)");
  check_shape(a.in[5], kStat, {d.B, d.H, d.L}, "input 5 (lse)");
  check_shape(a.out[0], D, {d.B, d.H, d.L, d.E}, "output 0 (dq)");
  check_shape(a.out[1], D, {d.B, d.H, d.S, d.E}, "output 1 (dk)");
  check_shape(a.out[2], D, {d.B, d.H, d.S, d.Ev}, "output 2 (dv)");
  const Attrs at = read_attrs(a, d.E);
  const int64_t BH = d.B * d.H;
  S* dq = data_ptr<S>(a.out[0]);
  S* dk = data_ptr<S>(a.out[1]);
  S* dv = data_ptr<S>(a.out[2]);
  if (BH == 0) return;
  if (d.L == 0 || d.S == 0) {  // no pairs (i, j): every gradient is 0
    if (d.L * d.E != 0)
      BP_CUDA_CHECK(
          cudaMemsetAsync(dq, 0, static_cast<size_t>(BH * d.L * d.E) * sizeof(S), a.stream));
    if (d.S * d.E != 0)
      BP_CUDA_CHECK(
          cudaMemsetAsync(dk, 0, static_cast<size_t>(BH * d.S * d.E) * sizeof(S), a.stream));
    if (d.S * d.Ev != 0)
      BP_CUDA_CHECK(
          cudaMemsetAsync(dv, 0, static_cast<size_t>(BH * d.S * d.Ev) * sizeof(S), a.stream));
    return;
  }
  const S* q = data_ptr<const S>(a.in[0]);
  const S* k = data_ptr<const S>(a.in[1]);
  const S* v = data_ptr<const S>(a.in[2]);
  const S* o = data_ptr<const S>(a.in[3]);
  const S* dout = data_ptr<const S>(a.in[4]);
  const A* lse = data_ptr<const A>(a.in[5]);
  if constexpr (kNarrow)  // Note [cuDNN attention]
    if (at.drop.p == 0 &&
        cudnn_attention_backward(a, problem(d, at), q, k, v, o, dout, lse, dq, dk, dv))
      return;
  const uint64_t per_elem = 2 * sizeof(A) + (kNarrow ? 2 * sizeof(S) : 0);
  Chunk cs = chunk_size(d, per_elem, max_rows_of(d, at.causal));
  if (kNarrow && cs.nr < d.L)  // the f32 buffers below stay within the bound too
    cs.nb = std::max<int64_t>(
        1, std::min<int64_t>(
               cs.nb,
               static_cast<int64_t>(kScratchBytes /
                                    (static_cast<uint64_t>(d.S * (d.E + d.Ev)) * sizeof(A) + 1))));
  // dk and dv add up over row chunks: through compute-type buffers for f16/bf16. Under the
  // causal mask a chunk may see only a prefix of the keys: then dk and dv start from zeros and
  // every chunk adds.
  const bool accumulate = kNarrow && cs.nr < d.L;
  const bool prefix = at.causal && std::min(cs.nr, d.L) < d.S;
  const int64_t acc_pairs = accumulate ? cs.nb : 0;
  const uint64_t elems = static_cast<uint64_t>(cs.nb * cs.nr * d.S);
  Carve cv;
  const uint64_t at_scores = cv.take(elems * sizeof(A));
  const uint64_t at_dp = cv.take(elems * sizeof(A));
  const uint64_t at_dvec = cv.take(static_cast<uint64_t>(BH * d.L) * sizeof(A));
  const uint64_t at_acc_k = cv.take(static_cast<uint64_t>(acc_pairs * d.S * d.E) * sizeof(A));
  const uint64_t at_acc_v = cv.take(static_cast<uint64_t>(acc_pairs * d.S * d.Ev) * sizeof(A));
  const uint64_t at_pz = kNarrow ? cv.take(elems * sizeof(S)) : at_scores;
  const uint64_t at_ds = kNarrow ? cv.take(elems * sizeof(S)) : at_dp;
  const uint64_t bytes = cv.size;
  CudaStream& st = *a.s;
  char* base = static_cast<char*>(a.device->allocate_scratch(st, bytes));
  A* scores = reinterpret_cast<A*>(base + at_scores);
  A* dp = reinterpret_cast<A*>(base + at_dp);
  A* dvec = reinterpret_cast<A*>(base + at_dvec);
  A* acc_k = reinterpret_cast<A*>(base + at_acc_k);
  A* acc_v = reinterpret_cast<A*>(base + at_acc_v);
  S* pz = reinterpret_cast<S*>(base + at_pz);
  S* ds = reinterpret_cast<S*>(base + at_ds);
  try {
    row_dot_kernel<S, A>
        <<<static_cast<unsigned>(ceil_div(BH * d.L, kThreads / 32)), kThreads, 0, a.stream>>>(
            dout, o, dvec, BH * d.L, d.Ev);
    BP_CUDA_CHECK(cudaGetLastError());
    for (int64_t bh0 = 0; bh0 < BH; bh0 += cs.nb) {
      const int64_t nb = std::min(cs.nb, BH - bh0);
      S* dk_at = dk + bh0 * d.S * d.E;
      S* dv_at = dv + bh0 * d.S * d.Ev;
      if (prefix) {  // the keys no chunk sees keep gradient 0
        const size_t es = accumulate ? sizeof(A) : sizeof(S);
        BP_CUDA_CHECK(cudaMemsetAsync(accumulate ? static_cast<void*>(acc_k) : dk_at, 0,
                                      static_cast<size_t>(nb * d.S * d.E) * es, a.stream));
        BP_CUDA_CHECK(cudaMemsetAsync(accumulate ? static_cast<void*>(acc_v) : dv_at, 0,
                                      static_cast<size_t>(nb * d.S * d.Ev) * es, a.stream));
      }
      for (int64_t r0 = 0; r0 < d.L; r0 += cs.nr) {
        const Chunk c{bh0, nb, r0, std::min(cs.nr, d.L - r0)};
        const int64_t sk = at.causal ? std::min(d.S, r0 + c.nr) : d.S;  // keys seen
        const A beta = prefix || r0 > 0 ? A(1) : A(0);
        const Mat qm{q + (bh0 * d.L + r0) * d.E, T::kType, d.E, d.L * d.E, false};
        const Mat gm{dout + (bh0 * d.L + r0) * d.Ev, T::kType, d.Ev, d.L * d.Ev, false};
        // scores = SCALE q k^T; dP = dout v^T
        gemm<A>(a, T::kCompute, c.nr, sk, d.E, static_cast<A>(at.scale), qm,
                Mat{k + bh0 * d.S * d.E, T::kType, d.E, d.S * d.E, true}, A(0), scores, T::kAccType,
                c.nr * sk, c.nb);
        gemm<A>(a, T::kCompute, c.nr, sk, d.Ev, A(1), gm,
                Mat{v + bh0 * d.S * d.Ev, T::kType, d.Ev, d.S * d.Ev, true}, A(0), dp, T::kAccType,
                c.nr * sk, c.nb);
        backward_rows_kernel<S, A><<<static_cast<unsigned>(c.nb * c.nr), kRowBlock, 0, a.stream>>>(
            scores, dp, lse, dvec, pz, ds, c, d.L, sk, d.S, at.causal ? 1 : 0, at.drop);
        BP_CUDA_CHECK(cudaGetLastError());
        const Mat pzt{pz, T::kType, sk, c.nr * sk, true};
        const Mat dst{ds, T::kType, sk, c.nr * sk, true};
        const Mat dsm{ds, T::kType, sk, c.nr * sk, false};
        // dq = SCALE ds k (every key this chunk sees: written, not accumulated)
        gemm<A>(a, T::kCompute, c.nr, d.E, sk, static_cast<A>(at.scale), dsm,
                Mat{k + bh0 * d.S * d.E, T::kType, d.E, d.S * d.E, false}, A(0),
                dq + (bh0 * d.L + r0) * d.E, T::kType, d.L * d.E, c.nb);
        // dv[:sk] (+)= (p z)^T dout; dk[:sk] (+)= SCALE ds^T q
        if (accumulate) {
          gemm<A>(a, T::kCompute, sk, d.Ev, c.nr, A(1), pzt, gm, beta, acc_v, T::kAccType,
                  d.S * d.Ev, c.nb);
          gemm<A>(a, T::kCompute, sk, d.E, c.nr, static_cast<A>(at.scale), dst, qm, beta, acc_k,
                  T::kAccType, d.S * d.E, c.nb);
        } else {
          gemm<A>(a, T::kCompute, sk, d.Ev, c.nr, A(1), pzt, gm, beta, dv_at, T::kType, d.S * d.Ev,
                  c.nb);
          gemm<A>(a, T::kCompute, sk, d.E, c.nr, static_cast<A>(at.scale), dst, qm, beta, dk_at,
                  T::kType, d.S * d.E, c.nb);
        }
      }
      if (accumulate) {  // pairs [bh0, bh0 + nb) are contiguous in dk, dv and the buffers
        round_kernel<S, A>
            <<<grid_of(a, nb * d.S * d.E), kThreads, 0, a.stream>>>(acc_k, dk_at, nb * d.S * d.E);
        BP_CUDA_CHECK(cudaGetLastError());
        round_kernel<S, A>
            <<<grid_of(a, nb * d.S * d.Ev), kThreads, 0, a.stream>>>(acc_v, dv_at, nb * d.S * d.Ev);
        BP_CUDA_CHECK(cudaGetLastError());
      }
    }
  } catch (...) {
    a.device->free_scratch(st, base, bytes);
    throw;
  }
  a.device->free_scratch(st, base, bytes);
}

template <int D>
LaunchFn attention_of(Op op) {
  switch (op) {
    case Op::kScaledDotProductAttention:
      return &launch_forward<D>;
    case Op::kScaledDotProductAttentionBackward:
      return &launch_backward<D>;
    default:
      return nullptr;
  }
}

}  // namespace

LaunchFn attention_fn(Op op, int32_t dtype) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return attention_of<BP_DTYPE_F32>(op);
    case BP_DTYPE_F64:
      return attention_of<BP_DTYPE_F64>(op);
    case BP_DTYPE_F16:
      return attention_of<BP_DTYPE_F16>(op);
    case BP_DTYPE_BF16:
      return attention_of<BP_DTYPE_BF16>(op);
    default:
      return nullptr;
  }
}

}  // namespace bp::cuda
