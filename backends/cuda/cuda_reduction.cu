// Reductions sum, mean, max, sumsq, norm over any set of dimensions (plugin_abi.h: every dim where
// out.shape[d] == 1 != in.shape[d] is reduced).
//
// Note [CUDA reduction plan]
//   The input's dimensions split into kept ones (out.shape[d] == in.shape[d]) and reduced ones;
//   each group is coalesced separately (innermost first), giving n_out outputs of n_red
//   elements each. Then:
//   - whole-tensor reduction of a dense input (n_out == 1, one unit-stride reduced dim): CUB's
//     DeviceReduce (tree reduction, vectorised loads), temp storage from the device's pool;
//   - inner reduction (the reduced group has the smaller innermost stride): reduce_rows, one
//     warp per output, lanes walk the row (16-byte vector loads when it has unit stride,
//     coalesced scalar loads otherwise), several loads in flight, shuffle reduction;
//   - outer reduction (a kept dim has the smallest stride, e.g. sum over dim 0 of a row-major
//     matrix): reduce_cols, 32 consecutive outputs per block in x (coalesced), 8 rows of the
//     reduced range in y, combined through shared memory. When the input is a dense matrix
//     summed over its rows, whose rows and base are 16-byte aligned (bias gradients),
//     reduce_cols_wide instead: each thread takes 16 bytes of adjacent columns a row, a warp
//     512 contiguous bytes (32 elements make short, scattered DRAM reads), its partials then
//     combined by reduce_cols.
//   When there are too few outputs to fill the GPU, the reduced range of each output is split
//   into G chunks: pass 1 writes partial accumulators to scratch memory, pass 2 (the same
//   kernels over the partials) combines them and writes the output. Results are deterministic.
//   Accumulators: f32 sums in double on the generic paths and float in CUB's tree (both well
//   inside 1e-5 relative), f16/bf16 in float, f64 in double, integers in int64 (wrapping to the
//   output width). max compares in the compute type and propagates NaN. Empty reduced ranges:
//   sum 0, mean NaN, max is an error.
//   sumsq and norm (Note [One-pass norms] in the CPU backend) are sums whose first pass squares
//   each element as it becomes an accumulator (kSq loads; pass 2 combines partials as they
//   are); norm takes the square root when the output is stored. One read of the input.
#include "cuda_common.hpp"
#include "cuda_device.hpp"
#include "cuda_kernels.hpp"
#include "cuda_plan.hpp"
#include "cuda_types.cuh"

#include <cub/device/device_reduce.cuh>

#include <algorithm>
#include <cmath>
#include <limits>

namespace bp::cuda {
namespace {

constexpr int kRedThreads = 256;
constexpr int kRedWarps = kRedThreads / 32;

enum class Kind { kSum, kMean, kMax, kSumsq, kNorm };

// What finalize does to a finished accumulator.
enum Post : int { kPostNone = 0, kPostMean = 1, kPostSqrt = 2 };

template <Kind K>
constexpr int post_of() {
  return K == Kind::kMean ? kPostMean : K == Kind::kNorm ? kPostSqrt : kPostNone;
}
template <Kind K>
constexpr bool squares() {
  return K == Kind::kSumsq || K == Kind::kNorm;
}

// Accumulator of the generic kernels.
template <int D, Kind K>
struct AccOf {
  using type = std::conditional_t<
      K == Kind::kMax, compute_t<D>,
      std::conditional_t<
          std::is_integral_v<compute_t<D>>, int64_t,
          std::conditional_t<D == BP_DTYPE_F16 || D == BP_DTYPE_BF16, float, double>>>;
};

template <class A>
struct SumR {
  __host__ __device__ static A identity() { return A(0); }
  __host__ __device__ A operator()(A a, A b) const {
    if constexpr (std::is_integral_v<A>) {
      using U = std::make_unsigned_t<A>;
      return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  }
};

template <class A>
struct MaxR {
  __host__ __device__ static A identity() {
    if constexpr (std::is_floating_point_v<A>) {
      return -std::numeric_limits<A>::infinity();
    } else {
      return std::numeric_limits<A>::lowest();
    }
  }
  __host__ __device__ A operator()(A a, A b) const { return (a > b || a != a) ? a : b; }
};

template <class A, Kind K>
using ReducerOf = std::conditional_t<K == Kind::kMax, MaxR<A>, SumR<A>>;

// Storage (or an accumulator, in pass 2) -> accumulator; kSq squares it (first pass of sumsq
// and norm only).
template <class A, bool kSq = false, class X>
__device__ __forceinline__ A to_acc(X x) {
  A v;
  if constexpr (std::is_same_v<X, A>) {
    v = x;
  } else {
    v = static_cast<A>(load(x));
  }
  if constexpr (kSq) v = v * v;
  return v;
}

template <class A, class S, bool kSq>
struct ToAcc {
  __device__ A operator()(S x) const { return to_acc<A, kSq>(x); }
};

// Accumulator -> output storage: divided by `count` for mean, its square root for norm.
template <class S, class A>
__device__ __forceinline__ S finalize(A acc, double count, int post) {
  if constexpr (std::is_floating_point_v<A>) {
    if (post == kPostMean) acc = acc / static_cast<A>(count);
    if (post == kPostSqrt) acc = sqrt(acc);
  }
  return store<S>(static_cast<compute_of_t<S>>(acc));
}

// The coalesced plan of Note [CUDA reduction plan]; dim 0 innermost.
struct RedPlan {
  int krank = 0, rrank = 0;
  int64_t ksize[kMaxDims] = {}, kin[kMaxDims] = {}, kout[kMaxDims] = {};
  int64_t rsize[kMaxDims] = {}, rin[kMaxDims] = {};
  int64_t n_out = 1, n_red = 1;

  __device__ __forceinline__ void kept(int64_t o, int64_t& in_off, int64_t& out_off) const {
    in_off = 0;
    out_off = 0;
    for (int d = 0; d < krank; ++d) {
      int64_t c = o;
      if (d != krank - 1) {
        c = o % ksize[d];
        o /= ksize[d];
      }
      in_off += c * kin[d];
      out_off += c * kout[d];
    }
  }
  __device__ __forceinline__ int64_t reduced(int64_t r) const {
    int64_t off = 0;
    for (int d = 0; d < rrank; ++d) {
      int64_t c = r;
      if (d != rrank - 1) {
        c = r % rsize[d];
        r /= rsize[d];
      }
      off += c * rin[d];
    }
    return off;
  }
};

template <class A, class R>
__device__ __forceinline__ A warp_reduce(A v, const R& op) {
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, s));
  return v;
}

// Lane `lane`'s share of row[r0, r1) (unit stride): scalars up to the first 16-byte boundary,
// then 16-byte vectors, two in flight per lane, then the scalar tail.
template <class A, bool kSq, class X, class R>
__device__ __forceinline__ A reduce_unit_row(const X* row, int64_t r0, int64_t r1, int lane,
                                             const R& op) {
  constexpr int V = 16 / sizeof(X);
  using XV = Vec<X, V>;
  A acc = R::identity(), acc1 = R::identity();
  const uintptr_t addr = reinterpret_cast<uintptr_t>(row + r0);
  const int64_t head =
      addr % sizeof(X) != 0 ? r1 - r0 : static_cast<int64_t>((16 - addr % 16) % 16 / sizeof(X));
  const int64_t ra = min(r0 + head, r1);
  for (int64_t r = r0 + lane; r < ra; r += 32) acc = op(acc, to_acc<A, kSq>(row[r]));
  const int64_t nv = (r1 - ra) / V;
  const XV* vrow = reinterpret_cast<const XV*>(row + ra);
  int64_t v = lane;
  for (; v + 32 < nv; v += 64) {
    const XV x0 = vrow[v], x1 = vrow[v + 32];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      acc = op(acc, to_acc<A, kSq>(x0.v[k]));
      acc1 = op(acc1, to_acc<A, kSq>(x1.v[k]));
    }
  }
  if (v < nv) {
    const XV x0 = vrow[v];
#pragma unroll
    for (int k = 0; k < V; ++k) acc = op(acc, to_acc<A, kSq>(x0.v[k]));
  }
  for (int64_t r = ra + nv * V + lane; r < r1; r += 32) acc = op(acc, to_acc<A, kSq>(row[r]));
  return op(acc, acc1);
}

// One warp per (output, chunk); see Note [CUDA reduction plan].
template <class X, class A, class R, class O, bool kFinal, bool kSq>
__global__ void __launch_bounds__(kRedThreads)
    reduce_rows(const X* in, O* out, RedPlan p, int64_t G, int64_t chunk, double count, int post) {
  const R op;
  const int lane = threadIdx.x & 31;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * kRedWarps;
  const int64_t total = p.n_out * G;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * kRedWarps + (threadIdx.x >> 5); w < total;
       w += nwarps) {
    const int64_t o = w / G, g = w - o * G;
    int64_t in_base, out_off;
    p.kept(o, in_base, out_off);
    const int64_t r0 = g * chunk, r1 = min(r0 + chunk, p.n_red);
    A acc = R::identity();
    if (p.rrank == 1 && p.rin[0] == 1) {
      acc = reduce_unit_row<A, kSq>(in + in_base, r0, r1, lane, op);
    } else if (p.rrank == 1) {
      const int64_t s = p.rin[0];
      const X* base = in + in_base;
      A acc1 = R::identity(), acc2 = R::identity(), acc3 = R::identity();
      int64_t r = r0 + lane;
      for (; r + 96 < r1; r += 128) {
        const X x0 = base[r * s], x1 = base[(r + 32) * s], x2 = base[(r + 64) * s],
                x3 = base[(r + 96) * s];
        acc = op(acc, to_acc<A, kSq>(x0));
        acc1 = op(acc1, to_acc<A, kSq>(x1));
        acc2 = op(acc2, to_acc<A, kSq>(x2));
        acc3 = op(acc3, to_acc<A, kSq>(x3));
      }
      for (; r < r1; r += 32) acc = op(acc, to_acc<A, kSq>(base[r * s]));
      acc = op(op(acc, acc1), op(acc2, acc3));
    } else {
      for (int64_t r = r0 + lane; r < r1; r += 32)
        acc = op(acc, to_acc<A, kSq>(in[in_base + p.reduced(r)]));
    }
    acc = warp_reduce(acc, op);
    if (lane == 0) {
      if constexpr (kFinal) {
        out[out_off] = finalize<O>(acc, count, post);
      } else {
        out[w] = acc;
      }
    }
  }
}

// 32 outputs x 8 reduced rows per block; blockIdx.y is the chunk.
template <class X, class A, class R, class O, bool kFinal, bool kSq>
__global__ void __launch_bounds__(kRedThreads)
    reduce_cols(const X* in, O* out, RedPlan p, int64_t chunk, double count, int post) {
  __shared__ A partial[kRedWarps][33];
  const R op;
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * 32 + tx;
  const int64_t g = blockIdx.y;
  A acc = R::identity();
  int64_t in_base = 0, out_off = 0;
  if (o < p.n_out) {
    p.kept(o, in_base, out_off);
    const int64_t r0 = g * chunk, r1 = min(r0 + chunk, p.n_red);
    if (p.rrank == 1) {
      const int64_t s = p.rin[0];
      for (int64_t r = r0 + ty; r < r1; r += kRedWarps)
        acc = op(acc, to_acc<A, kSq>(in[in_base + r * s]));
    } else {
      for (int64_t r = r0 + ty; r < r1; r += kRedWarps)
        acc = op(acc, to_acc<A, kSq>(in[in_base + p.reduced(r)]));
    }
  }
  partial[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && o < p.n_out) {
#pragma unroll
    for (int k = 1; k < kRedWarps; ++k) acc = op(acc, partial[k][tx]);
    if constexpr (kFinal) {
      out[out_off] = finalize<O>(acc, count, post);
    } else {
      out[g * p.n_out + o] = acc;
    }
  }
}

// Outer reduction of a dense [n_red][n_out] view (kept dim contiguous, rows `row_stride`
// elements apart, 16-byte aligned): each thread reduces V adjacent columns with 16-byte loads,
// so a warp reads 512 contiguous bytes of a row where reduce_cols reads 32 elements; the 8 warps
// of a block split the rows, blockIdx.y is the chunk. Writes partial accumulators [G][n_out],
// combined by reduce_cols (Note [CUDA reduction plan]).
template <class X, class A, class R, bool kSq>
__global__ void __launch_bounds__(kRedThreads)
    reduce_cols_wide(const X* in, A* part, int64_t n_out, int64_t row_stride, int64_t n_red,
                     int64_t chunk) {
  constexpr int V = 16 / sizeof(X);
  using XV = Vec<X, V>;
  __shared__ A partial[kRedWarps][32 * V];
  const R op;
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * 32 + tx) * V;
  const int64_t g = blockIdx.y;
  A acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = R::identity();
  if (c0 < n_out) {
    const int64_t r1 = min((g + 1) * chunk, n_red);
    const X* col = in + c0;
    int64_t r = g * chunk + ty;
    for (; r + kRedWarps < r1; r += 2 * kRedWarps) {
      const XV x0 = *reinterpret_cast<const XV*>(col + r * row_stride);
      const XV x1 = *reinterpret_cast<const XV*>(col + (r + kRedWarps) * row_stride);
#pragma unroll
      for (int k = 0; k < V; ++k)
        acc[k] = op(op(acc[k], to_acc<A, kSq>(x0.v[k])), to_acc<A, kSq>(x1.v[k]));
    }
    if (r < r1) {
      const XV x0 = *reinterpret_cast<const XV*>(col + r * row_stride);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] = op(acc[k], to_acc<A, kSq>(x0.v[k]));
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) partial[ty][tx * V + k] = acc[k];
  __syncthreads();
  if (ty == 0 && c0 < n_out) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      for (int w = 1; w < kRedWarps; ++w) acc[k] = op(acc[k], partial[w][tx * V + k]);
      part[g * n_out + c0 + k] = acc[k];
    }
  }
}

template <class A, class S>
__global__ void finalize_one(const A* acc, S* out, double count, int post) {
  *out = finalize<S>(*acc, count, post);
}

// Builds the plan; throws when out is not a reduction of in.
RedPlan make_red_plan(const bp_tensor_desc& in, const bp_tensor_desc& out) {
  RedPlan p;
  for (int d = in.rank - 1; d >= 0; --d) {
    const int64_t n = in.shape[d], m = out.shape[d];
    if (m == n) {
      p.n_out *= n;
      if (n == 1) continue;
      if (p.krank > 0 && in.strides[d] == p.kin[p.krank - 1] * p.ksize[p.krank - 1] &&
          out.strides[d] == p.kout[p.krank - 1] * p.ksize[p.krank - 1]) {
        p.ksize[p.krank - 1] *= n;
        continue;
      }
      p.ksize[p.krank] = n;
      p.kin[p.krank] = in.strides[d];
      p.kout[p.krank] = out.strides[d];
      ++p.krank;
    } else if (m == 1) {
      p.n_red *= n;
      if (p.rrank > 0 && in.strides[d] == p.rin[p.rrank - 1] * p.rsize[p.rrank - 1]) {
        p.rsize[p.rrank - 1] *= n;
        continue;
      }
      p.rsize[p.rrank] = n;
      p.rin[p.rrank] = in.strides[d];
      ++p.rrank;
    } else {
      invalid(bp::sdk::format("output shape %s is not a reduction of input shape %s",
                              shape_string(out.shape, out.rank).c_str(),
                              shape_string(in.shape, in.rank).c_str()));
    }
  }
  return p;
}

// Rebases a plan onto partial accumulators laid out densely: [n_out][G] (rows) or [G][n_out]
// (cols).
RedPlan partial_plan(const RedPlan& p, int64_t G, bool rows) {
  RedPlan q = p;
  int64_t stride = rows ? G : 1;
  for (int d = 0; d < p.krank; ++d) {
    q.kin[d] = stride;
    stride *= p.ksize[d];
  }
  q.rrank = 1;
  q.rsize[0] = G;
  q.rin[0] = rows ? 1 : p.n_out;
  q.n_red = G;
  return q;
}

template <int D, Kind K>
void cub_reduce(const LaunchArgs& a, const storage_t<D>* in, storage_t<D>* out, int64_t n) {
  using S = storage_t<D>;
  // CUB's tree keeps f32 sums accurate in float; everything else as the generic kernels.
  using A =
      std::conditional_t<D == BP_DTYPE_F32 && K != Kind::kMax, float, typename AccOf<D, K>::type>;
  using R = ReducerOf<A, K>;
  constexpr int kPost = post_of<K>();
  constexpr bool kSq = squares<K>();
  constexpr bool kDirect = std::is_same_v<A, S> && kPost == kPostNone && !kSq;

  auto run = [&](void* temp, size_t& bytes, A* dst) {
    if constexpr (std::is_same_v<A, S> && !kSq) {
      return cub::DeviceReduce::Reduce(temp, bytes, in, dst, n, R{}, R::identity(), a.stream);
    } else {
      return cub::DeviceReduce::TransformReduce(temp, bytes, in, dst, n, R{}, ToAcc<A, S, kSq>{},
                                                R::identity(), a.stream);
    }
  };
  size_t bytes = 0;
  BP_CUDA_CHECK(run(nullptr, bytes, nullptr));
  const uint64_t acc_off = (bytes + 255) / 256 * 256;
  const uint64_t total = acc_off + (kDirect ? 0 : sizeof(A));
  char* scratch = static_cast<char*>(a.device->allocate_scratch(*a.s, total));
  try {
    A* dst = kDirect ? reinterpret_cast<A*>(out) : reinterpret_cast<A*>(scratch + acc_off);
    BP_CUDA_CHECK(run(scratch, bytes, dst));
    if constexpr (!kDirect) {
      finalize_one<A, S><<<1, 1, 0, a.stream>>>(dst, out, static_cast<double>(n), kPost);
      BP_CUDA_CHECK(cudaGetLastError());
    }
  } catch (...) {
    a.device->free_scratch(*a.s, scratch, total);
    throw;
  }
  a.device->free_scratch(*a.s, scratch, total);
}

template <int D, Kind K>
void launch_reduce(const LaunchArgs& a) {
  using S = storage_t<D>;
  using A = typename AccOf<D, K>::type;
  using R = ReducerOf<A, K>;
  check_arity(a, 1, 1);
  const bp_tensor_desc& in = a.in[0];
  const bp_tensor_desc& out = a.out[0];
  check_desc(in, D, "input");
  check_desc(out, D, "output");
  if (out.rank != in.rank)
    invalid(bp::sdk::format("output rank %d differs from input rank %d", out.rank, in.rank));
  const RedPlan p = make_red_plan(in, out);
  if (p.n_out == 0) return;
  if (p.n_red == 0) {
    if constexpr (K == Kind::kMax) {
      invalid(bp::sdk::format("max of an empty range (input shape %s)",
                              shape_string(in.shape, in.rank).c_str()));
    } else {
      fill_tensor(a, out, K == Kind::kMean ? std::nan("") : 0.0);
      return;
    }
  }
  const S* pin = data_ptr<const S>(in);
  S* pout = data_ptr<S>(out);
  const double count = static_cast<double>(p.n_red);
  const int post = post_of<K>();
  constexpr bool kSq = squares<K>();

  if (p.krank == 0 && p.rrank == 1 && p.rin[0] == 1) {
    cub_reduce<D, K>(a, pin, pout, p.n_red);
    return;
  }

  const int64_t sms = std::max(a.sm_count, 1);
  const bool rows = p.rrank > 0 && (p.krank == 0 || p.rin[0] < p.kin[0]);
  if (rows) {
    const int64_t target_warps = sms * 64;
    int64_t G = 1;
    if (p.n_out < target_warps / 2)
      G = std::max<int64_t>(1, std::min(ceil_div(target_warps, p.n_out), ceil_div(p.n_red, 1024)));
    const int64_t chunk = ceil_div(p.n_red, G);
    G = ceil_div(p.n_red, chunk);
    auto grid = [&](int64_t warps) {
      return static_cast<unsigned>(std::min(ceil_div(warps, kRedWarps), sms * 8));
    };
    if (G == 1) {
      reduce_rows<S, A, R, S, true, kSq>
          <<<grid(p.n_out), kRedThreads, 0, a.stream>>>(pin, pout, p, 1, chunk, count, post);
      BP_CUDA_CHECK(cudaGetLastError());
      return;
    }
    const uint64_t bytes = static_cast<uint64_t>(p.n_out * G) * sizeof(A);
    A* part = static_cast<A*>(a.device->allocate_scratch(*a.s, bytes));
    reduce_rows<S, A, R, A, false, kSq>
        <<<grid(p.n_out * G), kRedThreads, 0, a.stream>>>(pin, part, p, G, chunk, count, post);
    const RedPlan q = partial_plan(p, G, true);
    reduce_rows<A, A, R, S, true, false>
        <<<grid(p.n_out), kRedThreads, 0, a.stream>>>(part, pout, q, 1, G, count, post);
    const cudaError_t err = cudaGetLastError();
    a.device->free_scratch(*a.s, part, bytes);
    BP_CUDA_CHECK(err);
    return;
  }

  const int64_t blocks_x = ceil_div(p.n_out, 32);
  if (blocks_x > std::numeric_limits<int32_t>::max())
    invalid("reduction output too large for one launch");
  // Pass 2 of a chunked outer reduction: reduce_cols over the partials [G][n_out] in `part`
  // (scratch of `bytes`, handed back after).
  auto combine_cols = [&](A* part, uint64_t bytes, int64_t G) {
    const RedPlan q = partial_plan(p, G, false);
    reduce_cols<A, A, R, S, true, false>
        <<<dim3(static_cast<unsigned>(blocks_x), 1), kRedThreads, 0, a.stream>>>(part, pout, q, G,
                                                                                 count, post);
    const cudaError_t err = cudaGetLastError();
    a.device->free_scratch(*a.s, part, bytes);
    BP_CUDA_CHECK(err);
  };

  // A dense matrix summed over its rows (bias gradients: [tokens, features] over tokens):
  // reduce_cols_wide's 16-byte loads, then combine_cols.
  constexpr int64_t V = 16 / sizeof(S);
  if constexpr (sizeof(S) >= 2) {
    if (p.krank == 1 && p.kin[0] == 1 && p.rrank == 1 && p.n_out % V == 0 && p.rin[0] % V == 0 &&
        reinterpret_cast<uintptr_t>(pin) % 16 == 0) {
      const int64_t wide_x = ceil_div(p.n_out, 32 * V);
      int64_t G = std::max<int64_t>(
          1, std::min({ceil_div(sms * 8, wide_x), ceil_div(p.n_red, 64), int64_t{65535}}));
      const int64_t chunk = ceil_div(p.n_red, G);
      G = ceil_div(p.n_red, chunk);
      const uint64_t bytes = static_cast<uint64_t>(p.n_out * G) * sizeof(A);
      A* part = static_cast<A*>(a.device->allocate_scratch(*a.s, bytes));
      reduce_cols_wide<S, A, R, kSq>
          <<<dim3(static_cast<unsigned>(wide_x), static_cast<unsigned>(G)), kRedThreads, 0,
             a.stream>>>(pin, part, p.n_out, p.rin[0], p.n_red, chunk);
      combine_cols(part, bytes, G);
      return;
    }
  }

  const int64_t target_blocks = sms * 8;
  int64_t G = 1;
  if (blocks_x < target_blocks / 2)
    G = std::max<int64_t>(
        1, std::min({ceil_div(target_blocks, blocks_x), ceil_div(p.n_red, 256), int64_t{65535}}));
  const int64_t chunk = ceil_div(p.n_red, G);
  G = ceil_div(p.n_red, chunk);
  if (G == 1) {
    reduce_cols<S, A, R, S, true, kSq>
        <<<dim3(static_cast<unsigned>(blocks_x), 1), kRedThreads, 0, a.stream>>>(
            pin, pout, p, chunk, count, post);
    BP_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const uint64_t bytes = static_cast<uint64_t>(p.n_out * G) * sizeof(A);
  A* part = static_cast<A*>(a.device->allocate_scratch(*a.s, bytes));
  reduce_cols<S, A, R, A, false, kSq>
      <<<dim3(static_cast<unsigned>(blocks_x), static_cast<unsigned>(G)), kRedThreads, 0,
         a.stream>>>(pin, part, p, chunk, count, post);
  combine_cols(part, bytes, G);
}

template <Kind K>
LaunchFn reduce_for(int32_t dtype) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return &launch_reduce<BP_DTYPE_F32, K>;
    case BP_DTYPE_F64:
      return &launch_reduce<BP_DTYPE_F64, K>;
    case BP_DTYPE_F16:
      return &launch_reduce<BP_DTYPE_F16, K>;
    case BP_DTYPE_BF16:
      return &launch_reduce<BP_DTYPE_BF16, K>;
    default:
      break;
  }
  if constexpr (K == Kind::kSum || K == Kind::kMax) {
    switch (dtype) {
      case BP_DTYPE_I32:
        return &launch_reduce<BP_DTYPE_I32, K>;
      case BP_DTYPE_I64:
        return &launch_reduce<BP_DTYPE_I64, K>;
      default:
        break;
    }
  }
  return nullptr;
}

}  // namespace

LaunchFn reduction_fn(Op op, int32_t dtype) {
  switch (op) {
    case Op::kSum:
      return reduce_for<Kind::kSum>(dtype);
    case Op::kMean:
      return reduce_for<Kind::kMean>(dtype);
    case Op::kMax:
      return reduce_for<Kind::kMax>(dtype);
    case Op::kSumsq:
      return reduce_for<Kind::kSumsq>(dtype);
    case Op::kNorm:
      return reduce_for<Kind::kNorm>(dtype);
    default:
      return nullptr;
  }
}

}  // namespace bp::cuda
