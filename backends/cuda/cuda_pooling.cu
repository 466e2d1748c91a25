// Pooling: max_pool2d (values and I64 indices), avg_pool2d, adaptive_avg_pool2d and their
// backward ops, with kernels of our own (Note [CUDA pooling]).
//
// Note [CUDA pooling]
//   cuDNN's pooling has no ceil mode and gives no indices, so these are our kernels, as
//   PyTorch's are. Forward: one thread per output element walks its window in row-major order
//   (max: the first maximum wins, a NaN beats everything and the first NaN stays). Backward:
//   one thread per input element visits the output windows that can cover it in row-major
//   (p, q) order and adds their contributions into one accumulator (f32 for f16/bf16) before a
//   single store: no atomics, and the order the catalogue prescribes, so the result does not
//   depend on the schedule. Index math is 32-bit when every offset fits; max pooling does its
//   window arithmetic in int32_t then too (window_fits_32: each 64-bit multiply or division is
//   several instructions, and a 3x3 window does little else), and 2x2 and 3x3 windows have
//   unrolled instances.
#include "cuda_common.hpp"
#include "cuda_elementwise.cuh"
#include "cuda_kernels.hpp"
#include "cuda_types.cuh"

#include <climits>
#include <type_traits>

namespace bp::cuda {
namespace {

// The window geometry of a pooling launch.
struct Pool {
  int64_t nc, h, w, p, q;  // nc = N * C planes
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  int count_include_pad;
};

template <class T>
__device__ __forceinline__ bool is_nan(T v) {
  return v != v;
}

// The window geometry in the type the max-pool kernels do their window arithmetic in: int32_t
// when every offset fits (window_fits_32), else int64_t. 64-bit multiplies and divisions are
// several instructions each on the GPU, and the 3x3 forward does little else.
template <class I>
struct Win {
  I h, w, p, q, kh, kw, sh, sw, ph, pw, dh, dw;
};
template <class I>
Win<I> win_of(const Pool& g) {
  auto c = [](int64_t v) { return static_cast<I>(v); };
  return Win<I>{c(g.h),  c(g.w),  c(g.p),  c(g.q),  c(g.kh), c(g.kw),
                c(g.sh), c(g.sw), c(g.ph), c(g.pw), c(g.dh), c(g.dw)};
}

// K > 0: a K x K window known at compile time (the loops unroll); K = 0: g.kh x g.kw.
template <class S, class I, int K>
__global__ void __launch_bounds__(kThreads)
    max_pool_kernel(const S* __restrict__ x, S* __restrict__ y, int64_t* __restrict__ ind, Win<I> g,
                    std::make_unsigned_t<I> total) {
  using C = compute_of_t<S>;
  using U = std::make_unsigned_t<I>;
  const I kh = K > 0 ? K : g.kh, kw = K > 0 ? K : g.kw;
  for (U o = static_cast<U>(blockIdx.x) * kThreads + threadIdx.x; o < total;
       o += static_cast<U>(gridDim.x) * kThreads) {
    const U row = o / static_cast<U>(g.q);
    const I q = static_cast<I>(o - row * static_cast<U>(g.q));
    const U plane = row / static_cast<U>(g.p);
    const I p = static_cast<I>(row - plane * static_cast<U>(g.p));
    const S* __restrict__ xp = x + static_cast<I>(plane) * g.h * g.w;
    const I h0 = p * g.sh - g.ph, w0 = q * g.sw - g.pw;
    C best = 0;
    I best_i = -1;
#pragma unroll
    for (I i = 0; i < kh; ++i) {
      const I hh = h0 + i * g.dh;
      if (hh < 0 || hh >= g.h) continue;
#pragma unroll
      for (I j = 0; j < kw; ++j) {
        const I ww = w0 + j * g.dw;
        if (ww < 0 || ww >= g.w) continue;
        const I off = hh * g.w + ww;
        const C v = load(xp[off]);
        if (best_i < 0 || (!is_nan(best) && (v > best || is_nan(v)))) {
          best = v;
          best_i = off;
        }
      }
    }
    if (best_i < 0) best = -std::numeric_limits<C>::infinity();  // the host rules it out
    y[o] = store<S>(best);
    ind[o] = best_i < 0 ? 0 : static_cast<int64_t>(best_i);
  }
}

// The output rows [lo, hi] whose windows (start p * s - pad, extent (k - 1) * d + 1) can
// contain input row h.
template <class I>
__device__ __forceinline__ void covering(I h, I k, I s, I pad, I d, I n_out, I& lo, I& hi) {
  const I ext = (k - 1) * d + 1;
  const I num = h + pad - ext + 1;  // p * s >= num
  lo = num <= 0 ? 0 : (num + s - 1) / s;
  hi = (h + pad) / s;  // p * s <= h + pad
  if (hi > n_out - 1) hi = n_out - 1;
}

template <class S, class I>
__global__ void __launch_bounds__(kThreads)
    max_pool_backward_kernel(const S* __restrict__ dy, const int64_t* __restrict__ ind,
                             S* __restrict__ dx, Win<I> g, std::make_unsigned_t<I> total) {
  using C = compute_of_t<S>;
  using U = std::make_unsigned_t<I>;
  for (U o = static_cast<U>(blockIdx.x) * kThreads + threadIdx.x; o < total;
       o += static_cast<U>(gridDim.x) * kThreads) {
    const U row = o / static_cast<U>(g.w);
    const I ww = static_cast<I>(o - row * static_cast<U>(g.w));
    const U plane = row / static_cast<U>(g.h);
    const I hh = static_cast<I>(row - plane * static_cast<U>(g.h));
    const int64_t self = static_cast<int64_t>(hh * g.w + ww);
    I p0, p1, q0, q1;
    covering(hh, g.kh, g.sh, g.ph, g.dh, g.p, p0, p1);
    covering(ww, g.kw, g.sw, g.pw, g.dw, g.q, q0, q1);
    const I base = static_cast<I>(plane) * g.p * g.q;
    C acc = 0;
    for (I p = p0; p <= p1; ++p)
      for (I q = q0; q <= q1; ++q) {
        const I k = base + p * g.q + q;
        if (ind[k] == self) acc += load(dy[k]);
      }
    dx[o] = store<S>(acc);
  }
}

// The window of output (p, q) of avg_pool2d clipped to the input, and its divisor.
struct AvgWindow {
  int64_t h0, h1, w0, w1, div;
};
__device__ __forceinline__ AvgWindow avg_window(const Pool& g, int64_t p, int64_t q) {
  AvgWindow a;
  a.h0 = p * g.sh - g.ph;
  a.w0 = q * g.sw - g.pw;
  a.h1 = min(a.h0 + g.kh, g.h + g.ph);
  a.w1 = min(a.w0 + g.kw, g.w + g.pw);
  const int64_t padded = (a.h1 - a.h0) * (a.w1 - a.w0);
  a.h0 = a.h0 < 0 ? 0 : a.h0;
  a.w0 = a.w0 < 0 ? 0 : a.w0;
  a.h1 = min(a.h1, g.h);
  a.w1 = min(a.w1, g.w);
  a.div = g.count_include_pad ? padded : (a.h1 - a.h0) * (a.w1 - a.w0);
  return a;
}

template <class S, class Idx>
__global__ void __launch_bounds__(kThreads) avg_pool_kernel(const S* x, S* y, Pool g, Idx total) {
  using C = compute_of_t<S>;
  const Idx P = static_cast<Idx>(g.p), Q = static_cast<Idx>(g.q);
  for (Idx o = static_cast<Idx>(blockIdx.x) * kThreads + threadIdx.x; o < total;
       o += static_cast<Idx>(gridDim.x) * kThreads) {
    const Idx q = o % Q, p = (o / Q) % P, plane = o / (P * Q);
    const S* xp = x + static_cast<int64_t>(plane) * g.h * g.w;
    const AvgWindow a = avg_window(g, p, q);
    C acc = 0;
    for (int64_t hh = a.h0; hh < a.h1; ++hh)
      for (int64_t ww = a.w0; ww < a.w1; ++ww) acc += load(xp[hh * g.w + ww]);
    y[o] = store<S>(a.div > 0 ? acc / static_cast<C>(a.div) : acc);
  }
}

template <class S, class Idx>
__global__ void __launch_bounds__(kThreads)
    avg_pool_backward_kernel(const S* dy, S* dx, Pool g, Idx total) {
  using C = compute_of_t<S>;
  const Idx H = static_cast<Idx>(g.h), W = static_cast<Idx>(g.w);
  for (Idx o = static_cast<Idx>(blockIdx.x) * kThreads + threadIdx.x; o < total;
       o += static_cast<Idx>(gridDim.x) * kThreads) {
    const Idx ww = o % W, hh = (o / W) % H, plane = o / (H * W);
    int64_t p0, p1, q0, q1;
    covering<int64_t>(hh, g.kh, g.sh, g.ph, 1, g.p, p0, p1);
    covering<int64_t>(ww, g.kw, g.sw, g.pw, 1, g.q, q0, q1);
    const S* dyp = dy + static_cast<int64_t>(plane) * g.p * g.q;
    C acc = 0;
    for (int64_t p = p0; p <= p1; ++p)
      for (int64_t q = q0; q <= q1; ++q) {
        const AvgWindow a = avg_window(g, p, q);
        if (hh >= a.h0 && hh < a.h1 && ww >= a.w0 && ww < a.w1 && a.div > 0)
          acc += load(dyp[p * g.q + q]) / static_cast<C>(a.div);
      }
    dx[o] = store<S>(acc);
  }
}

__device__ __forceinline__ int64_t adaptive_start(int64_t i, int64_t in, int64_t out) {
  return (i * in) / out;
}
__device__ __forceinline__ int64_t adaptive_end(int64_t i, int64_t in, int64_t out) {
  return ((i + 1) * in + out - 1) / out;
}

template <class S, class Idx>
__global__ void __launch_bounds__(kThreads)
    adaptive_avg_kernel(const S* x, S* y, Pool g, Idx total) {
  using C = compute_of_t<S>;
  const Idx P = static_cast<Idx>(g.p), Q = static_cast<Idx>(g.q);
  for (Idx o = static_cast<Idx>(blockIdx.x) * kThreads + threadIdx.x; o < total;
       o += static_cast<Idx>(gridDim.x) * kThreads) {
    const Idx q = o % Q, p = (o / Q) % P, plane = o / (P * Q);
    const S* xp = x + static_cast<int64_t>(plane) * g.h * g.w;
    const int64_t h0 = adaptive_start(p, g.h, g.p), h1 = adaptive_end(p, g.h, g.p);
    const int64_t w0 = adaptive_start(q, g.w, g.q), w1 = adaptive_end(q, g.w, g.q);
    C acc = 0;
    for (int64_t hh = h0; hh < h1; ++hh)
      for (int64_t ww = w0; ww < w1; ++ww) acc += load(xp[hh * g.w + ww]);
    y[o] = store<S>(acc / static_cast<C>((h1 - h0) * (w1 - w0)));
  }
}

template <class S, class Idx>
__global__ void __launch_bounds__(kThreads)
    adaptive_avg_backward_kernel(const S* dy, S* dx, Pool g, Idx total) {
  using C = compute_of_t<S>;
  const Idx H = static_cast<Idx>(g.h), W = static_cast<Idx>(g.w);
  for (Idx o = static_cast<Idx>(blockIdx.x) * kThreads + threadIdx.x; o < total;
       o += static_cast<Idx>(gridDim.x) * kThreads) {
    const Idx ww = o % W, hh = (o / W) % H, plane = o / (H * W);
    // Output rows whose ranges contain hh: start(p) <= hh < end(p); both are monotone in p.
    const int64_t p0 = (static_cast<int64_t>(hh) * g.p) / g.h;
    const int64_t q0 = (static_cast<int64_t>(ww) * g.q) / g.w;
    const S* dyp = dy + static_cast<int64_t>(plane) * g.p * g.q;
    C acc = 0;
    for (int64_t p = p0; p < g.p && adaptive_start(p, g.h, g.p) <= hh; ++p) {
      const int64_t h0 = adaptive_start(p, g.h, g.p), h1 = adaptive_end(p, g.h, g.p);
      if (hh < h0 || hh >= h1) continue;
      for (int64_t q = q0; q < g.q && adaptive_start(q, g.w, g.q) <= ww; ++q) {
        const int64_t w0 = adaptive_start(q, g.w, g.q), w1 = adaptive_end(q, g.w, g.q);
        if (ww < w0 || ww >= w1) continue;
        acc += load(dyp[p * g.q + q]) / static_cast<C>((h1 - h0) * (w1 - w0));
      }
    }
    dx[o] = store<S>(acc);
  }
}

// ---- Host side ----

unsigned grid(const LaunchArgs& a, int64_t n) {
  const int64_t want = ceil_div(n, kThreads);
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(want, a.sm_count * 32)));
}

void check_image(const bp_tensor_desc& t, int32_t dtype, const char* role) {
  check_desc(t, dtype, role);
  if (t.rank != 4)
    invalid(bp::sdk::format("%s must be [N, C, H, W], got shape %s", role,
                            shape_string(t.shape, t.rank).c_str()));
}

// x [N,C,H,W] (the big side) and y [N,C,P,Q] (the pooled side) with their attributes.
Pool make_pool(const LaunchArgs& a, const bp_tensor_desc& big, const bp_tensor_desc& pooled,
               bool windowed) {
  if (big.shape[0] != pooled.shape[0] || big.shape[1] != pooled.shape[1])
    invalid(bp::sdk::format("[N, C] of %s and %s differ", shape_string(big.shape, 4).c_str(),
                            shape_string(pooled.shape, 4).c_str()));
  Pool g{};
  g.nc = big.shape[0] * big.shape[1];
  g.h = big.shape[2];
  g.w = big.shape[3];
  g.p = pooled.shape[2];
  g.q = pooled.shape[3];
  g.kh = g.kw = g.sh = g.sw = g.dh = g.dw = 1;
  if (windowed) {
    const bp::sdk::Attrs& at = *a.attrs;
    if (!at.has(BP_ATTR_ID_KERNEL_H) || !at.has(BP_ATTR_ID_KERNEL_W))
      invalid("pooling needs attributes kernel_h and kernel_w");
    g.kh = at.i(BP_ATTR_ID_KERNEL_H, 1);
    g.kw = at.i(BP_ATTR_ID_KERNEL_W, 1);
    g.sh = at.i(BP_ATTR_ID_STRIDE_H, g.kh);
    g.sw = at.i(BP_ATTR_ID_STRIDE_W, g.kw);
    g.ph = at.i(BP_ATTR_ID_PAD_H, 0);
    g.pw = at.i(BP_ATTR_ID_PAD_W, 0);
    g.dh = at.i(BP_ATTR_ID_DILATION_H, 1);
    g.dw = at.i(BP_ATTR_ID_DILATION_W, 1);
    g.count_include_pad = at.i(BP_ATTR_ID_COUNT_INCLUDE_PAD, 1) != 0;
    if (g.kh < 1 || g.kw < 1 || g.sh < 1 || g.sw < 1 || g.dh < 1 || g.dw < 1 || g.ph < 0 ||
        g.pw < 0)
      invalid(bp::sdk::format(
          "pooling attributes kernel %lldx%lld, stride %lldx%lld, padding "
          "%lldx%lld, dilation %lldx%lld are out of range",
          static_cast<long long>(g.kh), static_cast<long long>(g.kw), static_cast<long long>(g.sh),
          static_cast<long long>(g.sw), static_cast<long long>(g.ph), static_cast<long long>(g.pw),
          static_cast<long long>(g.dh), static_cast<long long>(g.dw)));
  } else if (g.p < 1 || g.q < 1) {
    if (g.nc * g.p * g.q != 0 || g.h * g.w == 0) return g;
    invalid("adaptive_avg_pool2d needs an output of at least 1x1");
  }
  return g;
}

// Calls launch(I{}) with I = uint32_t when both element counts fit 32-bit index arithmetic,
// else with I = uint64_t: the kernels index in I.
template <class F>
void with_index_type(int64_t a, int64_t b, F launch) {
  if (a < INT_MAX && b < INT_MAX)
    launch(uint32_t{});
  else
    launch(uint64_t{});
}

// Whether the max-pool kernels may do their window arithmetic in int32_t: both tensors have
// fewer than INT_MAX elements and, along each axis, the padded extent plus one window and one
// stride stays below INT_MAX (the largest offset a thread forms).
bool window_fits_32(const Pool& g, int64_t big_numel, int64_t pooled_numel) {
  constexpr int64_t kPart = int64_t{1} << 28;  // each term below this: the sums cannot overflow
  auto axis = [&](int64_t n, int64_t out, int64_t k, int64_t s, int64_t pad, int64_t d) {
    if (n >= kPart || out >= kPart || k >= kPart || s >= kPart || pad >= kPart || d >= kPart)
      return false;
    return n + 2 * pad + (k - 1) * d + s < INT_MAX && out * s < INT_MAX;
  };
  return big_numel < INT_MAX && pooled_numel < INT_MAX && axis(g.h, g.p, g.kh, g.sh, g.ph, g.dh) &&
         axis(g.w, g.q, g.kw, g.sw, g.pw, g.dw);
}

// Calls launch(I{}) with I = int32_t when window_fits_32, else int64_t.
template <class F>
void with_window_type(const Pool& g, int64_t big_numel, int64_t pooled_numel, F launch) {
  if (window_fits_32(g, big_numel, pooled_numel))
    launch(int32_t{});
  else
    launch(int64_t{});
}

template <int D>
void launch_max_pool(const LaunchArgs& a) {
  using S = storage_t<D>;
  check_arity(a, 1, 2);
  check_image(a.in[0], D, "input 0 (x)");
  check_image(a.out[0], D, "output 0 (y)");
  check_image(a.out[1], BP_DTYPE_I64, "output 1 (indices)");
  check_same_shape(a.out[1], a.out[0], "output 1 (indices)");
  const Pool g = make_pool(a, a.in[0], a.out[0], true);
  const int64_t n = numel(a.out[0]);
  if (n == 0) return;
  const S* x = data_ptr<const S>(a.in[0]);
  S* y = data_ptr<S>(a.out[0]);
  int64_t* ind = data_ptr<int64_t>(a.out[1]);
  const int k = g.kh == g.kw && (g.kh == 2 || g.kh == 3) ? static_cast<int>(g.kh) : 0;
  with_window_type(g, numel(a.in[0]), n, [&](auto i) {
    using I = decltype(i);
    using U = std::make_unsigned_t<I>;
    const Win<I> wg = win_of<I>(g);
    auto run = [&](auto kernel) {
      kernel<<<grid(a, n), kThreads, 0, a.stream>>>(x, y, ind, wg, static_cast<U>(n));
    };
    if (k == 3)
      run(max_pool_kernel<S, I, 3>);
    else if (k == 2)
      run(max_pool_kernel<S, I, 2>);
    else
      run(max_pool_kernel<S, I, 0>);
  });
  BP_CUDA_CHECK(cudaGetLastError());
}

template <int D>
void launch_max_pool_backward(const LaunchArgs& a) {
  using S = storage_t<D>;
  check_arity(a, 2, 1);
  check_image(a.in[0], D, "input 0 (dy)");
  check_image(a.in[1], BP_DTYPE_I64, "input 1 (indices)");
  check_same_shape(a.in[1], a.in[0], "input 1 (indices)");
  check_image(a.out[0], D, "output (dx)");
  const Pool g = make_pool(a, a.out[0], a.in[0], true);
  const int64_t n = numel(a.out[0]);
  if (n == 0) return;
  if (numel(a.in[0]) == 0) {
    fill_tensor(a, a.out[0], 0.0);
    return;
  }
  const S* dy = data_ptr<const S>(a.in[0]);
  const int64_t* ind = data_ptr<const int64_t>(a.in[1]);
  S* dx = data_ptr<S>(a.out[0]);
  with_window_type(g, n, numel(a.in[0]), [&](auto i) {
    using I = decltype(i);
    max_pool_backward_kernel<S, I><<<grid(a, n), kThreads, 0, a.stream>>>(
        dy, ind, dx, win_of<I>(g), static_cast<std::make_unsigned_t<I>>(n));
  });
  BP_CUDA_CHECK(cudaGetLastError());
}

// avg_pool2d (adaptive: adaptive_avg_pool2d) forward.
template <int D, bool kAdaptive>
void launch_avg_pool(const LaunchArgs& a) {
  using S = storage_t<D>;
  check_arity(a, 1, 1);
  check_image(a.in[0], D, "input 0 (x)");
  check_image(a.out[0], D, "output (y)");
  const Pool g = make_pool(a, a.in[0], a.out[0], !kAdaptive);
  const int64_t n = numel(a.out[0]);
  if (n == 0) return;
  const S* x = data_ptr<const S>(a.in[0]);
  S* y = data_ptr<S>(a.out[0]);
  with_index_type(n, numel(a.in[0]), [&](auto i) {
    using I = decltype(i);
    if constexpr (kAdaptive)
      adaptive_avg_kernel<S, I><<<grid(a, n), kThreads, 0, a.stream>>>(x, y, g, static_cast<I>(n));
    else
      avg_pool_kernel<S, I><<<grid(a, n), kThreads, 0, a.stream>>>(x, y, g, static_cast<I>(n));
  });
  BP_CUDA_CHECK(cudaGetLastError());
}

template <int D, bool kAdaptive>
void launch_avg_pool_backward(const LaunchArgs& a) {
  using S = storage_t<D>;
  check_arity(a, 1, 1);
  check_image(a.in[0], D, "input 0 (dy)");
  check_image(a.out[0], D, "output (dx)");
  const Pool g = make_pool(a, a.out[0], a.in[0], !kAdaptive);
  const int64_t n = numel(a.out[0]);
  if (n == 0) return;
  if (numel(a.in[0]) == 0) {
    fill_tensor(a, a.out[0], 0.0);
    return;
  }
  const S* dy = data_ptr<const S>(a.in[0]);
  S* dx = data_ptr<S>(a.out[0]);
  with_index_type(n, numel(a.in[0]), [&](auto i) {
    using I = decltype(i);
    if constexpr (kAdaptive)
      adaptive_avg_backward_kernel<S, I>
          <<<grid(a, n), kThreads, 0, a.stream>>>(dy, dx, g, static_cast<I>(n));
    else
      avg_pool_backward_kernel<S, I>
          <<<grid(a, n), kThreads, 0, a.stream>>>(dy, dx, g, static_cast<I>(n));
  });
  BP_CUDA_CHECK(cudaGetLastError());
}

template <int D>
LaunchFn pool_of(Op op) {
  switch (op) {
    case Op::kMaxPool2d:
      return &launch_max_pool<D>;
    case Op::kMaxPool2dBackward:
      return &launch_max_pool_backward<D>;
    case Op::kAvgPool2d:
      return &launch_avg_pool<D, false>;
    case Op::kAvgPool2dBackward:
      return &launch_avg_pool_backward<D, false>;
    case Op::kAdaptiveAvgPool2d:
      return &launch_avg_pool<D, true>;
    case Op::kAdaptiveAvgPool2dBackward:
      return &launch_avg_pool_backward<D, true>;
    default:
      return nullptr;
  }
}

}  // namespace

LaunchFn pooling_fn(Op op, int32_t dtype) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return pool_of<BP_DTYPE_F32>(op);
    case BP_DTYPE_F64:
      return pool_of<BP_DTYPE_F64>(op);
    case BP_DTYPE_F16:
      return pool_of<BP_DTYPE_F16>(op);
    case BP_DTYPE_BF16:
      return pool_of<BP_DTYPE_BF16>(op);
    default:
      return nullptr;
  }
}

}  // namespace bp::cuda
