// cross_entropy and cross_entropy_backward (Note [Op catalogue], minor 8; Note [Fused cross
// entropy] in plugin_abi.h).
//
// Note [CUDA cross entropy]
//   One row of logits per warp (C <= kWarpRow) or per block of kRowThreads (larger C, a language
//   model's vocabulary). Forward: each thread keeps a running maximum m and the sum s of
//   exp(x - m) over its elements (s rescaled by exp(m_old - m_new) when a larger element comes,
//   so each element costs one exp), and the plain sum of x when LABEL_SMOOTHING is set; the
//   threads' pairs merge with shuffles (and shared memory across warps). So the logits are read
//   once and two numbers a row are written: loss and lse in the compute type (f32 for
//   f16/bf16). -inf elements add nothing; a NaN makes the row's lse NaN, as torch's. Backward:
//   the same rows, each element read once and its gradient written once in the logits' dtype,
//   exp(x - lse) from the saved lse. Both read (and the backward writes) 16-byte vectors from
//   the row's first 16-byte boundary on (for_row): rows of 50,257 bf16 start at any offset, and
//   element-wide loads held the bf16 forward at 1.2 TB/s. A target outside [0, C) that is not
//   IGNORE_INDEX is reported through the stream's index record (Note [Deferred index errors] in
//   cuda_index.cu): its loss is NaN and its gradient row 0 until the next synchronisation reports
//   it.
#include "cuda_common.hpp"
#include "cuda_elementwise.cuh"
#include "cuda_index.cuh"
#include "cuda_kernels.hpp"
#include "cuda_types.cuh"

#include <limits>

namespace bp::cuda {
namespace {

constexpr int64_t kWarpRow = 1024;
constexpr int kRowThreads = 512;

// A running maximum and sum of exp(x - m); m == -inf means nothing was added yet (s == 0).
template <class A>
struct MaxSum {
  A m, s;
};

template <class A>
__device__ __forceinline__ void add_element(MaxSum<A>& r, A x) {
  if (x > r.m) {  // false for NaN and -inf
    r.s = r.s * m_exp(r.m - x) + A(1);
    r.m = x;
  } else if (x != x) {
    r.m = x;  // a NaN row stays NaN: m - anything is NaN
    r.s = x;
  } else if (x != -std::numeric_limits<A>::infinity()) {
    r.s += m_exp(x - r.m);
  }
}

template <class A>
__device__ __forceinline__ MaxSum<A> merge(MaxSum<A> a, MaxSum<A> b) {
  if (a.m != a.m || b.m != b.m) return {a.m != a.m ? a.m : b.m, a.m != a.m ? a.s : b.s};
  if (b.m == -std::numeric_limits<A>::infinity()) return a;
  if (a.m == -std::numeric_limits<A>::infinity()) return b;
  if (a.m >= b.m) return {a.m, a.s + b.s * m_exp(b.m - a.m)};
  return {b.m, b.s + a.s * m_exp(a.m - b.m)};
}

// Merges r (and the sum `sx`) over `width` threads (a warp, or a block with shared memory).
template <class A>
__device__ __forceinline__ void group_merge(MaxSum<A>& r, A& sx, int width, A* sh) {
  for (int k = 16; k > 0; k >>= 1) {
    MaxSum<A> o{__shfl_xor_sync(0xffffffffu, r.m, k), __shfl_xor_sync(0xffffffffu, r.s, k)};
    r = merge(r, o);
    sx += __shfl_xor_sync(0xffffffffu, sx, k);
  }
  if (width <= 32) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = width / 32;
  if (lane == 0) {
    sh[warp] = r.m;
    sh[warps + warp] = r.s;
    sh[2 * warps + warp] = sx;
  }
  __syncthreads();
  r = {sh[0], sh[warps]};
  sx = sh[2 * warps];
  for (int w = 1; w < warps; ++w) {
    r = merge(r, MaxSum<A>{sh[w], sh[warps + w]});
    sx += sh[2 * warps + w];
  }
}

struct LossArgs {
  int64_t rows, classes, ignore_index;
  double smoothing;
};

// A row of c elements of S at p split at its first 16-byte boundary: `head` elements before it,
// then `nv` 16-byte vectors, then the elements from tail() on. A row of a wide vocabulary starts
// at any element offset (rows of 50,257 bf16), so the vectors begin at the boundary, not at the
// row.
template <class S>
struct RowSplit {
  static constexpr int kVec = 16 / sizeof(S);
  using V = Vec<S, kVec>;
  int64_t head, nv;
  __device__ __forceinline__ RowSplit(const S* p, int64_t c) {
    const uintptr_t mis = reinterpret_cast<uintptr_t>(p) % 16;
    head = mis == 0 ? 0 : static_cast<int64_t>((16 - mis) / sizeof(S));
    if (head > c) head = c;
    nv = (c - head) / kVec;
  }
  __device__ __forceinline__ int64_t tail() const { return head + nv * kVec; }
};

// Visits the elements of row `xr` (c elements) that thread t of `width` owns, as f(index, value
// in the compute type): RowSplit's head one by one, its vectors strided over the threads (two in
// flight a thread), then the tail.
template <class S, class F>
__device__ __forceinline__ void for_row(const S* xr, int64_t c, int t, int width, F&& f) {
  using R = RowSplit<S>;
  const R r(xr, c);
  for (int64_t i = t; i < r.head; i += width) f(i, load(xr[i]));
  const typename R::V* xv = reinterpret_cast<const typename R::V*>(xr + r.head);
  int64_t i = t;
  for (; i + width < r.nv; i += 2 * width) {
    const typename R::V a = xv[i], b = xv[i + width];
#pragma unroll
    for (int k = 0; k < R::kVec; ++k) f(r.head + i * R::kVec + k, load(a.v[k]));
#pragma unroll
    for (int k = 0; k < R::kVec; ++k) f(r.head + (i + width) * R::kVec + k, load(b.v[k]));
  }
  for (; i < r.nv; i += width) {
    const typename R::V a = xv[i];
#pragma unroll
    for (int k = 0; k < R::kVec; ++k) f(r.head + i * R::kVec + k, load(a.v[k]));
  }
  for (int64_t j = r.tail() + t; j < c; j += width) f(j, load(xr[j]));
}

// One row handled by `width` threads starting at thread `t`.
template <class S>
__device__ __forceinline__ void forward_row(const S* x, const int64_t* target,
                                            compute_of_t<S>* loss, compute_of_t<S>* lse,
                                            const LossArgs& p, int64_t n, int t, int width,
                                            compute_of_t<S>* sh, IndexError* rec) {
  using A = compute_of_t<S>;
  const S* xr = x + n * p.classes;
  const bool smooth = p.smoothing != 0;
  MaxSum<A> r{-std::numeric_limits<A>::infinity(), A(0)};
  A sx = 0;
  for_row(xr, p.classes, t, width, [&](int64_t, A v) {
    add_element(r, v);
    if (smooth) sx += v;
  });
  group_merge(r, sx, width, sh);
  if (t != 0) return;
  const A l = r.m + m_log(r.s);
  lse[n] = l;
  const int64_t tg = target[n];
  if (tg == p.ignore_index) {
    loss[n] = A(0);
  } else if (tg < 0 || tg >= p.classes) {
    report_index(rec, kIndexCrossEntropy, 1, tg, n, p.classes);
    loss[n] = std::numeric_limits<A>::quiet_NaN();
  } else {
    const A e = static_cast<A>(p.smoothing);
    loss[n] = l - (A(1) - e) * load(xr[tg]) - (smooth ? e / static_cast<A>(p.classes) * sx : A(0));
  }
}

template <class S>
__global__ void __launch_bounds__(kThreads)
    forward_warp_kernel(const S* x, const int64_t* target, compute_of_t<S>* loss,
                        compute_of_t<S>* lse, LossArgs p, IndexError* rec) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (n >= p.rows) return;  // a whole warp leaves together
  forward_row(x, target, loss, lse, p, n, threadIdx.x & 31, 32, nullptr, rec);
}

template <class S>
__global__ void __launch_bounds__(kRowThreads)
    forward_block_kernel(const S* x, const int64_t* target, compute_of_t<S>* loss,
                         compute_of_t<S>* lse, LossArgs p, IndexError* rec) {
  __shared__ compute_of_t<S> sh[3 * kRowThreads / 32];
  forward_row(x, target, loss, lse, p, blockIdx.x, threadIdx.x, kRowThreads, sh, rec);
}

template <class S>
__device__ __forceinline__ void backward_row(const S* x, const int64_t* target,
                                             const compute_of_t<S>* lse,
                                             const compute_of_t<S>* dloss, S* dx, const LossArgs& p,
                                             int64_t n, int t, int width, IndexError* rec) {
  using A = compute_of_t<S>;
  const S* xr = x + n * p.classes;
  S* dr = dx + n * p.classes;
  const int64_t tg = target[n];
  if (tg == p.ignore_index || tg < 0 || tg >= p.classes) {
    if (tg != p.ignore_index && t == 0)
      report_index(rec, kIndexCrossEntropyBackward, 1, tg, n, p.classes);
    for (int64_t c = t; c < p.classes; c += width) dr[c] = store<S>(A(0));
    return;
  }
  const A l = lse[n], g = dloss[n];
  const A e = static_cast<A>(p.smoothing);
  const A off = e / static_cast<A>(p.classes), hit = A(1) - e;
  auto grad = [&](int64_t c, A v) {
    return store<S>(g * (m_exp(v - l) - off - (c == tg ? hit : A(0))));
  };
  if (reinterpret_cast<uintptr_t>(xr) % 16 != reinterpret_cast<uintptr_t>(dr) % 16) {
    for (int64_t c = t; c < p.classes; c += width) dr[c] = grad(c, load(xr[c]));  // no common phase
    return;
  }
  // x and dx share their 16-byte phase: one RowSplit, vectors read and vectors written.
  using R = RowSplit<S>;
  const R r(xr, p.classes);
  for (int64_t c = t; c < r.head; c += width) dr[c] = grad(c, load(xr[c]));
  const typename R::V* xv = reinterpret_cast<const typename R::V*>(xr + r.head);
  typename R::V* dv = reinterpret_cast<typename R::V*>(dr + r.head);
  for (int64_t i = t; i < r.nv; i += width) {
    const typename R::V a = xv[i];
    typename R::V o;
#pragma unroll
    for (int k = 0; k < R::kVec; ++k) o.v[k] = grad(r.head + i * R::kVec + k, load(a.v[k]));
    dv[i] = o;
  }
  for (int64_t c = r.tail() + t; c < p.classes; c += width) dr[c] = grad(c, load(xr[c]));
}

template <class S>
__global__ void __launch_bounds__(kThreads)
    backward_warp_kernel(const S* x, const int64_t* target, const compute_of_t<S>* lse,
                         const compute_of_t<S>* dloss, S* dx, LossArgs p, IndexError* rec) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (n >= p.rows) return;
  backward_row(x, target, lse, dloss, dx, p, n, threadIdx.x & 31, 32, rec);
}

template <class S>
__global__ void __launch_bounds__(kRowThreads)
    backward_block_kernel(const S* x, const int64_t* target, const compute_of_t<S>* lse,
                          const compute_of_t<S>* dloss, S* dx, LossArgs p, IndexError* rec) {
  backward_row(x, target, lse, dloss, dx, p, blockIdx.x, threadIdx.x, kRowThreads, rec);
}

void check_vector(const bp_tensor_desc& t, int32_t dtype, int64_t n, const char* role) {
  check_desc(t, dtype, role);
  if (t.rank != 1 || t.shape[0] != n)
    invalid(bp::sdk::format("%s must be [%lld], got %s", role, static_cast<long long>(n),
                            shape_string(t.shape, t.rank).c_str()));
}

// Checks what both directions share and reads the attributes.
template <int D>
LossArgs loss_args(const LaunchArgs& a, bool backward) {
  constexpr int32_t kStat = D == BP_DTYPE_F64 ? BP_DTYPE_F64 : BP_DTYPE_F32;
  check_arity(a, backward ? 4 : 2, backward ? 1 : 2);
  const bp_tensor_desc& X = a.in[0];
  check_desc(X, D, "input 0 (x)");
  if (X.rank != 2)
    invalid(bp::sdk::format("%s: x must be [N, C], got %s", op_name(a.op),
                            shape_string(X.shape, X.rank).c_str()));
  LossArgs p{X.shape[0], X.shape[1], a.attrs->i(BP_ATTR_ID_IGNORE_INDEX, -100),
             a.attrs->f(BP_ATTR_ID_LABEL_SMOOTHING, 0.0)};
  if (p.rows > 0 && p.classes == 0)
    invalid(bp::sdk::format("%s: rows of 0 classes have no log-sum-exp (C must be >= 1)",
                            op_name(a.op)));
  if (!(p.smoothing >= 0 && p.smoothing <= 1))
    invalid(
        bp::sdk::format("%s: label_smoothing %g is outside [0, 1]", op_name(a.op), p.smoothing));
  if (p.rows > std::numeric_limits<int32_t>::max())
    invalid(bp::sdk::format("%s: %lld rows exceed the grid's 2^31 - 1", op_name(a.op),
                            static_cast<long long>(p.rows)));
  check_vector(a.in[1], BP_DTYPE_I64, p.rows, "input 1 (target)");
  if (backward) {
    check_vector(a.in[2], kStat, p.rows, "input 2 (lse)");
    check_vector(a.in[3], kStat, p.rows, "input 3 (dloss)");
    check_desc(a.out[0], D, "output (dx)");
    check_same_shape(a.out[0], X, "output (dx)");
  } else {
    check_vector(a.out[0], kStat, p.rows, "output 0 (loss)");
    check_vector(a.out[1], kStat, p.rows, "output 1 (lse)");
  }
  return p;
}

unsigned warp_blocks(int64_t rows) {
  return static_cast<unsigned>(ceil_div(rows, int64_t{kThreads / 32}));
}

template <int D>
void launch_cross_entropy(const LaunchArgs& a) {
  using S = storage_t<D>;
  using A = compute_of_t<S>;
  const LossArgs p = loss_args<D>(a, false);
  if (p.rows == 0) return;
  const S* x = data_ptr<const S>(a.in[0]);
  const int64_t* target = data_ptr<const int64_t>(a.in[1]);
  A* loss = data_ptr<A>(a.out[0]);
  A* lse = data_ptr<A>(a.out[1]);
  const IndexLaunch slot(a);
  if (p.classes <= kWarpRow)
    forward_warp_kernel<S>
        <<<warp_blocks(p.rows), kThreads, 0, a.stream>>>(x, target, loss, lse, p, slot.record());
  else
    forward_block_kernel<S><<<static_cast<unsigned>(p.rows), kRowThreads, 0, a.stream>>>(
        x, target, loss, lse, p, slot.record());
  BP_CUDA_CHECK(cudaGetLastError());
}

template <int D>
void launch_cross_entropy_backward(const LaunchArgs& a) {
  using S = storage_t<D>;
  using A = compute_of_t<S>;
  const LossArgs p = loss_args<D>(a, true);
  if (p.rows == 0) return;
  const S* x = data_ptr<const S>(a.in[0]);
  const int64_t* target = data_ptr<const int64_t>(a.in[1]);
  const A* lse = data_ptr<const A>(a.in[2]);
  const A* dloss = data_ptr<const A>(a.in[3]);
  S* dx = data_ptr<S>(a.out[0]);
  const IndexLaunch slot(a);
  if (p.classes <= kWarpRow)
    backward_warp_kernel<S><<<warp_blocks(p.rows), kThreads, 0, a.stream>>>(x, target, lse, dloss,
                                                                            dx, p, slot.record());
  else
    backward_block_kernel<S><<<static_cast<unsigned>(p.rows), kRowThreads, 0, a.stream>>>(
        x, target, lse, dloss, dx, p, slot.record());
  BP_CUDA_CHECK(cudaGetLastError());
}

template <int D>
LaunchFn loss_of(Op op) {
  switch (op) {
    case Op::kCrossEntropy:
      return &launch_cross_entropy<D>;
    case Op::kCrossEntropyBackward:
      return &launch_cross_entropy_backward<D>;
    default:
      return nullptr;
  }
}

}  // namespace

LaunchFn loss_fn(Op op, int32_t dtype) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return loss_of<BP_DTYPE_F32>(op);
    case BP_DTYPE_F64:
      return loss_of<BP_DTYPE_F64>(op);
    case BP_DTYPE_F16:
      return loss_of<BP_DTYPE_F16>(op);
    case BP_DTYPE_BF16:
      return loss_of<BP_DTYPE_BF16>(op);
    default:
      return nullptr;
  }
}

}  // namespace bp::cuda
