// softmax, log_softmax and their backward ops; max_dim and min_dim. All work along one axis of
// a dense tensor seen as [outer, len, inner] (Note [CUDA axis kernels]).
//
// Note [CUDA axis kernels]
//   inner == 1 (the axis is the last dim): one warp per row for rows up to kWarpRow elements,
//   else one block per row; lanes stride the row, reduce with shuffles (and shared memory
//   across warps), then write. inner > 1: one thread per (outer, inner) column walks the axis,
//   so neighbouring threads read neighbouring addresses. softmax subtracts the row maximum
//   before exp and accumulates in f32 (f64 for f64), so any finite input gives a finite
//   result; f16/bf16 round once on store. max_dim/min_dim keep the first position of the
//   extreme, and a NaN is the extreme (its first position), as torch.max(x, dim).
#include "cuda_common.hpp"
#include "cuda_elementwise.cuh"
#include "cuda_kernels.hpp"
#include "cuda_types.cuh"

#include <limits>

namespace bp::cuda {
namespace {

constexpr int64_t kWarpRow = 1024;
constexpr int kRowThreads = 512;

enum class Mode { kSoftmax, kLogSoftmax, kSoftmaxBackward, kLogSoftmaxBackward };

template <class A>
__device__ __forceinline__ A a_max(A a, A b) {
  return (a != a || a > b) ? a : b;  // a NaN on either side wins
}

// Sum (kMax: maximum) over `width` threads (a warp or a block).
template <bool kMax, class A>
__device__ __forceinline__ A group_reduce(A v, int width, A* sh) {
  for (int s = 16; s > 0; s >>= 1) {
    const A o = __shfl_xor_sync(0xffffffffu, v, s);
    v = kMax ? a_max(v, o) : v + o;
  }
  if (width <= 32) return v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  A t = sh[0];
  for (int w = 1; w < width / 32; ++w) t = kMax ? a_max(t, sh[w]) : t + sh[w];
  return t;
}

// One row of `len` elements handled by `width` threads starting at thread `t`.
// Forward: in0 = x. Backward: in0 = y, in1 = dy.
template <Mode M, class S>
__device__ __forceinline__ void row(const S* in0, const S* in1, S* out, int64_t len, int t,
                                    int width, compute_of_t<S>* sh) {
  using A = compute_of_t<S>;
  if constexpr (M == Mode::kSoftmax || M == Mode::kLogSoftmax) {
    A m = -std::numeric_limits<A>::infinity();
    for (int64_t i = t; i < len; i += width) m = a_max(m, load(in0[i]));
    m = group_reduce<true>(m, width, sh);
    A s = 0;
    for (int64_t i = t; i < len; i += width) s += m_exp(load(in0[i]) - m);
    s = group_reduce<false>(s, width, sh);
    if constexpr (M == Mode::kSoftmax) {
      const A inv = A(1) / s;
      for (int64_t i = t; i < len; i += width) out[i] = store<S>(m_exp(load(in0[i]) - m) * inv);
    } else {
      const A ls = m_log(s);
      for (int64_t i = t; i < len; i += width) out[i] = store<S>(load(in0[i]) - m - ls);
    }
  } else {
    A s = 0;
    for (int64_t i = t; i < len; i += width)
      s += M == Mode::kSoftmaxBackward ? load(in1[i]) * load(in0[i]) : load(in1[i]);
    s = group_reduce<false>(s, width, sh);
    for (int64_t i = t; i < len; i += width) {
      const A y = load(in0[i]), g = load(in1[i]);
      out[i] = store<S>(M == Mode::kSoftmaxBackward ? y * (g - s) : g - m_exp(y) * s);
    }
  }
}

template <Mode M, class S>
__global__ void __launch_bounds__(kThreads)
    warp_rows_kernel(const S* in0, const S* in1, S* out, int64_t rows, int64_t len) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (r >= rows) return;  // a whole warp leaves together
  const int64_t o = r * len;
  row<M, S>(in0 + o, in1 ? in1 + o : nullptr, out + o, len, threadIdx.x & 31, 32, nullptr);
}

template <Mode M, class S>
__global__ void __launch_bounds__(kRowThreads)
    block_rows_kernel(const S* in0, const S* in1, S* out, int64_t len) {
  __shared__ compute_of_t<S> sh[kRowThreads / 32];
  const int64_t o = static_cast<int64_t>(blockIdx.x) * len;
  row<M, S>(in0 + o, in1 ? in1 + o : nullptr, out + o, len, threadIdx.x, kRowThreads, sh);
}

// inner > 1: one thread per column (outer, inner).
template <Mode M, class S>
__global__ void __launch_bounds__(kThreads)
    column_kernel(const S* in0, const S* in1, S* out, int64_t outer, int64_t len, int64_t inner) {
  using A = compute_of_t<S>;
  const int64_t cols = outer * inner;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t o = (c / inner) * len * inner + c % inner;
    const S* x = in0 + o;
    const S* g = in1 ? in1 + o : nullptr;
    S* y = out + o;
    if constexpr (M == Mode::kSoftmax || M == Mode::kLogSoftmax) {
      A m = -std::numeric_limits<A>::infinity();
      for (int64_t i = 0; i < len; ++i) m = a_max(m, load(x[i * inner]));
      A s = 0;
      for (int64_t i = 0; i < len; ++i) s += m_exp(load(x[i * inner]) - m);
      if constexpr (M == Mode::kSoftmax) {
        const A inv = A(1) / s;
        for (int64_t i = 0; i < len; ++i)
          y[i * inner] = store<S>(m_exp(load(x[i * inner]) - m) * inv);
      } else {
        const A ls = m_log(s);
        for (int64_t i = 0; i < len; ++i) y[i * inner] = store<S>(load(x[i * inner]) - m - ls);
      }
    } else {
      A s = 0;
      for (int64_t i = 0; i < len; ++i)
        s += M == Mode::kSoftmaxBackward ? load(g[i * inner]) * load(x[i * inner])
                                         : load(g[i * inner]);
      for (int64_t i = 0; i < len; ++i) {
        const A yv = load(x[i * inner]), gv = load(g[i * inner]);
        y[i * inner] = store<S>(M == Mode::kSoftmaxBackward ? yv * (gv - s) : gv - m_exp(yv) * s);
      }
    }
  }
}

// [outer, len, inner] of a dense tensor along `axis` (checked in range).
struct AxisShape {
  int64_t outer = 1, len = 1, inner = 1;
};

AxisShape axis_shape(const bp_tensor_desc& t, int64_t axis) {
  if (axis < 0 || axis >= t.rank)
    invalid(bp::sdk::format("axis %lld is outside [0, %d) for shape %s",
                            static_cast<long long>(axis), t.rank,
                            shape_string(t.shape, t.rank).c_str()));
  AxisShape s;
  for (int32_t d = 0; d < t.rank; ++d) {
    if (d < axis) s.outer *= t.shape[d];
    if (d > axis) s.inner *= t.shape[d];
  }
  s.len = t.shape[axis];
  return s;
}

unsigned grid_cap(const LaunchArgs& a, int64_t blocks) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, a.sm_count * 32)));
}

template <Mode M, int D>
void launch_softmax(const LaunchArgs& a) {
  using S = storage_t<D>;
  constexpr bool kBackward = M == Mode::kSoftmaxBackward || M == Mode::kLogSoftmaxBackward;
  check_arity(a, kBackward ? 2 : 1, 1);
  check_desc(a.in[0], D, kBackward ? "input 0 (y)" : "input 0 (x)");
  if (kBackward) {
    check_desc(a.in[1], D, "input 1 (dy)");
    check_same_shape(a.in[1], a.in[0], "input 1 (dy)");
  }
  check_desc(a.out[0], D, "output");
  check_same_shape(a.out[0], a.in[0], "output");
  if (!a.attrs->has(BP_ATTR_ID_AXIS)) invalid("needs attribute axis");
  const AxisShape sh = axis_shape(a.in[0], a.attrs->i(BP_ATTR_ID_AXIS, 0));
  if (sh.outer * sh.len * sh.inner == 0) return;
  const S* in0 = data_ptr<const S>(a.in[0]);
  const S* in1 = kBackward ? data_ptr<const S>(a.in[1]) : nullptr;
  S* out = data_ptr<S>(a.out[0]);
  if (sh.inner == 1) {
    const int64_t rows = sh.outer;
    if (sh.len <= kWarpRow) {
      const int64_t per_block = kThreads / 32;
      warp_rows_kernel<M, S>
          <<<static_cast<unsigned>(ceil_div(rows, per_block)), kThreads, 0, a.stream>>>(
              in0, in1, out, rows, sh.len);
    } else {
      block_rows_kernel<M, S>
          <<<static_cast<unsigned>(rows), kRowThreads, 0, a.stream>>>(in0, in1, out, sh.len);
    }
  } else {
    column_kernel<M, S>
        <<<grid_cap(a, ceil_div(sh.outer * sh.inner, kThreads)), kThreads, 0, a.stream>>>(
            in0, in1, out, sh.outer, sh.len, sh.inner);
  }
  BP_CUDA_CHECK(cudaGetLastError());
}

// ---- max_dim / min_dim ----

template <bool kMax, class A>
__device__ __forceinline__ bool beats(A v, int64_t i, A best, int64_t bi) {
  if constexpr (std::is_floating_point_v<A>) {
    if (best != best) return v != v && i < bi;
    if (v != v) return true;
  }
  if (kMax ? v > best : v < best) return true;
  return v == best && i < bi;
}

template <bool kMax, class S>
__global__ void __launch_bounds__(kThreads)
    extreme_rows_kernel(const S* x, S* values, int64_t* indices, int64_t rows, int64_t len) {
  using A = compute_of_t<S>;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  const S* xr = x + r * len;
  A best = load(xr[0]);
  int64_t bi = 0;
  for (int64_t i = lane; i < len; i += 32) {
    const A v = load(xr[i]);
    if (beats<kMax>(v, i, best, bi)) {
      best = v;
      bi = i;
    }
  }
  for (int s = 16; s > 0; s >>= 1) {
    const A ov = __shfl_xor_sync(0xffffffffu, best, s);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, s);
    if (beats<kMax>(ov, oi, best, bi)) {
      best = ov;
      bi = oi;
    }
  }
  if (lane == 0) {
    values[r] = xr[bi];
    indices[r] = bi;
  }
}

template <bool kMax, class S>
__global__ void __launch_bounds__(kThreads)
    extreme_columns_kernel(const S* x, S* values, int64_t* indices, int64_t outer, int64_t len,
                           int64_t inner) {
  using A = compute_of_t<S>;
  const int64_t cols = outer * inner;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * kThreads) {
    const S* xc = x + (c / inner) * len * inner + c % inner;
    A best = load(xc[0]);
    int64_t bi = 0;
    for (int64_t i = 1; i < len; ++i) {
      const A v = load(xc[i * inner]);
      if (beats<kMax>(v, i, best, bi)) {
        best = v;
        bi = i;
      }
    }
    values[c] = xc[bi * inner];
    indices[c] = bi;
  }
}

template <bool kMax, int D>
void launch_extreme(const LaunchArgs& a) {
  using S = storage_t<D>;
  check_arity(a, 1, 2);
  const bp_tensor_desc& X = a.in[0];
  check_desc(X, D, "input 0 (x)");
  check_desc(a.out[0], D, "output 0 (values)");
  check_desc(a.out[1], BP_DTYPE_I64, "output 1 (indices)");
  if (!a.attrs->has(BP_ATTR_ID_AXIS)) invalid("needs attribute axis");
  const int64_t axis = a.attrs->i(BP_ATTR_ID_AXIS, 0);
  const AxisShape sh = axis_shape(X, axis);
  for (int k = 0; k < 2; ++k) {
    const bp_tensor_desc& o = a.out[k];
    bool ok = o.rank == X.rank;
    for (int32_t d = 0; ok && d < X.rank; ++d) ok = o.shape[d] == (d == axis ? 1 : X.shape[d]);
    if (!ok)
      invalid(
          bp::sdk::format("output %d has shape %s; x %s reduced along axis %lld needs size "
                          "1 there",
                          k, shape_string(o.shape, o.rank).c_str(),
                          shape_string(X.shape, X.rank).c_str(), static_cast<long long>(axis)));
  }
  if (sh.outer * sh.inner == 0) return;
  if (sh.len == 0) invalid("max_dim/min_dim need a non-empty axis");
  const S* x = data_ptr<const S>(X);
  S* values = data_ptr<S>(a.out[0]);
  int64_t* indices = data_ptr<int64_t>(a.out[1]);
  if (sh.inner == 1) {
    const int64_t per_block = kThreads / 32;
    extreme_rows_kernel<kMax, S>
        <<<static_cast<unsigned>(ceil_div(sh.outer, per_block)), kThreads, 0, a.stream>>>(
            x, values, indices, sh.outer, sh.len);
  } else {
    extreme_columns_kernel<kMax, S>
        <<<grid_cap(a, ceil_div(sh.outer * sh.inner, kThreads)), kThreads, 0, a.stream>>>(
            x, values, indices, sh.outer, sh.len, sh.inner);
  }
  BP_CUDA_CHECK(cudaGetLastError());
}

template <int D>
LaunchFn softmax_of(Op op) {
  switch (op) {
    case Op::kSoftmax:
      return &launch_softmax<Mode::kSoftmax, D>;
    case Op::kLogSoftmax:
      return &launch_softmax<Mode::kLogSoftmax, D>;
    case Op::kSoftmaxBackward:
      return &launch_softmax<Mode::kSoftmaxBackward, D>;
    case Op::kLogSoftmaxBackward:
      return &launch_softmax<Mode::kLogSoftmaxBackward, D>;
    case Op::kMaxDim:
      return &launch_extreme<true, D>;
    case Op::kMinDim:
      return &launch_extreme<false, D>;
    default:
      return nullptr;
  }
}

template <int D>
LaunchFn extreme_of(Op op) {
  return op == Op::kMaxDim   ? &launch_extreme<true, D>
         : op == Op::kMinDim ? &launch_extreme<false, D>
                             : nullptr;
}

}  // namespace

LaunchFn axis_fn(Op op, int32_t dtype) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return softmax_of<BP_DTYPE_F32>(op);
    case BP_DTYPE_F64:
      return softmax_of<BP_DTYPE_F64>(op);
    case BP_DTYPE_F16:
      return softmax_of<BP_DTYPE_F16>(op);
    case BP_DTYPE_BF16:
      return softmax_of<BP_DTYPE_BF16>(op);
    case BP_DTYPE_I32:
      return extreme_of<BP_DTYPE_I32>(op);
    case BP_DTYPE_I64:
      return extreme_of<BP_DTYPE_I64>(op);
    default:
      return nullptr;
  }
}

}  // namespace bp::cuda
