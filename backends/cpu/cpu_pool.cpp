// Pooling of NCHW images: max_pool2d (values and I64 indices), avg_pool2d, adaptive_avg_pool2d
// and their backward ops, every floating dtype, one (n, c) plane per work unit.
//
// Note [CPU pooling kernels]
//   These are our own loops, not oneDNN's pooling primitives. Max pooling must report h * W + w
//   of the first maximum in row-major window order with NaN winning (Note [Op catalogue]);
//   oneDNN's workspace holds a position inside the window in its own format and its tie and
//   NaN rules are not specified, so the indices would have to be recomputed anyway, and the
//   window scan is the whole cost of the op. Average pooling with CEIL_MODE divides by the
//   window clipped to the padded input, which oneDNN's include-padding mode does not express
//   once the ceiling adds right padding. Pooling reads each input a few times and is bound by
//   memory; the planes are spread over oneTBB's workers.
//   The backward ops add into a zeroed plane in row-major (p, q) order, in the compute type
//   (f32 for f16/bf16, rounded once on store), so results do not depend on the thread count.
#include "cpu_nn.hpp"

#include <cmath>
#include <cstring>
#include <vector>

namespace bp::cpu {
namespace {

struct PoolShape {
  int64_t planes, H, W, P, Q;
};

// Checks x[N,C,H,W] -> y[N,C,P,Q] (the names given) against the attributes' output size.
PoolShape pool_shape(const Launch& l, const bp_tensor_desc& big, const bp_tensor_desc& small,
                     int32_t dtype, const char* big_role, const char* small_role,
                     const Spatial* s) {
  check_dense(l, big, 4, dtype, big_role);
  check_dense(l, small, 4, dtype, small_role);
  PoolShape ps{big.shape[0] * big.shape[1], big.shape[2], big.shape[3], small.shape[2],
               small.shape[3]};
  if (s) {
    const int64_t P = out_size(ps.H, s->kernel_h, s->stride_h, s->pad_h, s->dil_h, s->ceil_mode);
    const int64_t Q = out_size(ps.W, s->kernel_w, s->stride_w, s->pad_w, s->dil_w, s->ceil_mode);
    check_shape(l, small, {big.shape[0], big.shape[1], P, Q}, small_role);
  } else {
    check_shape(l, small, {big.shape[0], big.shape[1], small.shape[2], small.shape[3]}, small_role);
  }
  return ps;
}

template <class C>
bool nan_or_greater(C v, C best) {
  if (std::isnan(best)) return false;
  return v > best || std::isnan(v);
}

template <class T>
void max_pool_kernel(const Launch& l) {
  using C = compute_t<T>;
  check_arity(l, 1, 2);
  const Spatial s = pool_attrs(l);
  const bp_tensor_desc &x = l.inputs[0], &y = l.outputs[0], &ind = l.outputs[1];
  const PoolShape ps = pool_shape(l, x, y, DType<T>::id, "input", "output", &s);
  check_dense(l, ind, 4, BP_DTYPE_I64, "indices");
  check_same_shape(l, ind, y, "indices");
  const T* px = data<T>(x);
  T* py = data<T>(y);
  int64_t* pi = data<int64_t>(ind);
  if (ps.P * ps.Q == 0) return;
  parallel_units(ps.planes, ps.P * ps.Q * s.kernel_h * s.kernel_w, Cost::kCheap,
                 [&](int64_t b, int64_t e) {
                   for (int64_t pl = b; pl < e; ++pl) {
                     const T* xp = px + pl * ps.H * ps.W;
                     T* yp = py + pl * ps.P * ps.Q;
                     int64_t* ip = pi + pl * ps.P * ps.Q;
                     for (int64_t p = 0; p < ps.P; ++p) {
                       const int64_t hs = p * s.stride_h - s.pad_h;
                       for (int64_t q = 0; q < ps.Q; ++q) {
                         const int64_t ws = q * s.stride_w - s.pad_w;
                         C best = C(0);
                         int64_t at = -1;
                         for (int64_t kh = 0; kh < s.kernel_h; ++kh) {
                           const int64_t h = hs + kh * s.dil_h;
                           if (h < 0 || h >= ps.H) continue;
                           for (int64_t kw = 0; kw < s.kernel_w; ++kw) {
                             const int64_t w = ws + kw * s.dil_w;
                             if (w < 0 || w >= ps.W) continue;
                             const C v = DType<T>::load(xp[h * ps.W + w]);
                             if (at < 0 || nan_or_greater(v, best)) {
                               best = v;
                               at = h * ps.W + w;
                             }
                           }
                         }
                         // A window always holds an input element (PAD <= KERNEL / 2).
                         yp[p * ps.Q + q] = DType<T>::store(at < 0 ? C(-INFINITY) : best);
                         ip[p * ps.Q + q] = at;
                       }
                     }
                   }
                 });
}

// The backward ops' frame: each plane of dx is summed in `acc` (the compute type, zeroed) by
// add(acc, plane, the plane's dy values), then stored once (Note [CPU pooling kernels]).
// `unit_cost` is the work of one plane.
template <class T, class Add>
void backward_planes(const PoolShape& ps, const T* pdy, T* pdx, int64_t unit_cost, Add add) {
  using C = compute_t<T>;
  const int64_t hw = ps.H * ps.W, pq = ps.P * ps.Q;
  parallel_units(ps.planes, unit_cost, Cost::kCheap, [&](int64_t b, int64_t e) {
    std::vector<C> acc(static_cast<size_t>(hw));
    for (int64_t pl = b; pl < e; ++pl) {
      std::fill(acc.begin(), acc.end(), C(0));
      add(acc, pl, pdy + pl * pq);
      T* out = pdx + pl * hw;
      for (int64_t i = 0; i < hw; ++i) out[i] = DType<T>::store(acc[static_cast<size_t>(i)]);
    }
  });
}

template <class T>
void max_pool_backward_kernel(const Launch& l) {
  using C = compute_t<T>;
  check_arity(l, 2, 1);
  const bp_tensor_desc &dy = l.inputs[0], &ind = l.inputs[1], &dx = l.outputs[0];
  const PoolShape ps = pool_shape(l, dx, dy, DType<T>::id, "dx", "dy", nullptr);
  check_dense(l, ind, 4, BP_DTYPE_I64, "indices");
  check_same_shape(l, ind, dy, "indices");
  const int64_t* pi = data<int64_t>(ind);
  const int64_t hw = ps.H * ps.W, pq = ps.P * ps.Q;
  if (hw == 0) return;
  // An index outside the plane would write out of bounds: refuse it before writing anything.
  for (int64_t i = 0, n = ps.planes * pq; i < n; ++i)
    if (pi[i] < 0 || pi[i] >= hw)
      launch_error(l, bp::sdk::format("index %lld at element %lld of indices %s is outside [0, "
                                      "%lld) (H * W of dx %s)",
                                      static_cast<long long>(pi[i]), static_cast<long long>(i),
                                      describe(ind).c_str(), static_cast<long long>(hw),
                                      describe(dx).c_str()));
  backward_planes(ps, data<T>(dy), data<T>(dx), hw + pq,
                  [&](std::vector<C>& acc, int64_t pl, const T* g) {
                    const int64_t* ip = pi + pl * pq;
                    for (int64_t i = 0; i < pq; ++i)
                      acc[static_cast<size_t>(ip[i])] += DType<T>::load(g[i]);
                  });
}

// The window of output (p, q) of an average pooling, clipped to the input, and its divisor.
struct AvgWindow {
  int64_t h0, h1, w0, w1;
  double divisor;
};

// avg_pool2d's window, as torch.nn.functional.avg_pool2d.
AvgWindow avg_window(const Spatial& s, const PoolShape& ps, int64_t p, int64_t q) {
  int64_t h0 = p * s.stride_h - s.pad_h, w0 = q * s.stride_w - s.pad_w;
  int64_t h1 = std::min(h0 + s.kernel_h, ps.H + s.pad_h);
  int64_t w1 = std::min(w0 + s.kernel_w, ps.W + s.pad_w);
  const int64_t padded = (h1 - h0) * (w1 - w0);
  h0 = std::max<int64_t>(h0, 0);
  w0 = std::max<int64_t>(w0, 0);
  h1 = std::min(h1, ps.H);
  w1 = std::min(w1, ps.W);
  const int64_t inside = std::max<int64_t>(h1 - h0, 0) * std::max<int64_t>(w1 - w0, 0);
  return {h0, h1, w0, w1, static_cast<double>(s.count_include_pad ? padded : inside)};
}

// Rows floor(p H / P) .. ceil((p + 1) H / P) - 1 of adaptive pooling.
inline int64_t adaptive_begin(int64_t p, int64_t in, int64_t out) {
  return (p * in) / out;
}
inline int64_t adaptive_end(int64_t p, int64_t in, int64_t out) {
  return ((p + 1) * in + out - 1) / out;
}

// adaptive_avg_pool2d's window, divided by its size.
AvgWindow adaptive_window(const PoolShape& ps, int64_t p, int64_t q) {
  const int64_t h0 = adaptive_begin(p, ps.H, ps.P), h1 = adaptive_end(p, ps.H, ps.P);
  const int64_t w0 = adaptive_begin(q, ps.W, ps.Q), w1 = adaptive_end(q, ps.W, ps.Q);
  return {h0, h1, w0, w1, static_cast<double>((h1 - h0) * (w1 - w0))};
}

// Average pooling over the windows window(p, q) gives, forward: each output the sum of its
// window divided by the divisor.
template <class T, class WindowOf>
void average_forward(const T* px, T* py, const PoolShape& ps, int64_t unit_cost, WindowOf window) {
  using C = compute_t<T>;
  parallel_units(ps.planes, unit_cost, Cost::kCheap, [&](int64_t b, int64_t e) {
    for (int64_t pl = b; pl < e; ++pl) {
      const T* xp = px + pl * ps.H * ps.W;
      T* yp = py + pl * ps.P * ps.Q;
      for (int64_t p = 0; p < ps.P; ++p)
        for (int64_t q = 0; q < ps.Q; ++q) {
          const AvgWindow w = window(p, q);
          C sum = C(0);
          for (int64_t h = w.h0; h < w.h1; ++h)
            for (int64_t c = w.w0; c < w.w1; ++c) sum += DType<T>::load(xp[h * ps.W + c]);
          yp[p * ps.Q + q] = DType<T>::store(sum / static_cast<C>(w.divisor));
        }
    }
  });
}

// ... and backward: each dy value divided by the divisor is added to every element of its
// window, in row-major (p, q) order.
template <class T, class WindowOf>
void average_backward(const T* pdy, T* pdx, const PoolShape& ps, int64_t unit_cost,
                      WindowOf window) {
  using C = compute_t<T>;
  backward_planes(ps, pdy, pdx, unit_cost, [&](std::vector<C>& acc, int64_t, const T* g) {
    for (int64_t p = 0; p < ps.P; ++p)
      for (int64_t q = 0; q < ps.Q; ++q) {
        const AvgWindow w = window(p, q);
        const C v = DType<T>::load(g[p * ps.Q + q]) / static_cast<C>(w.divisor);
        for (int64_t h = w.h0; h < w.h1; ++h)
          for (int64_t c = w.w0; c < w.w1; ++c) acc[static_cast<size_t>(h * ps.W + c)] += v;
      }
  });
}

template <class T>
void avg_pool_kernel(const Launch& l) {
  check_arity(l, 1, 1);
  const Spatial s = pool_attrs(l);
  const bp_tensor_desc &x = l.inputs[0], &y = l.outputs[0];
  const PoolShape ps = pool_shape(l, x, y, DType<T>::id, "input", "output", &s);
  if (ps.P * ps.Q == 0) return;
  average_forward(data<T>(x), data<T>(y), ps, ps.P * ps.Q * s.kernel_h * s.kernel_w,
                  [&](int64_t p, int64_t q) { return avg_window(s, ps, p, q); });
}

template <class T>
void avg_pool_backward_kernel(const Launch& l) {
  check_arity(l, 1, 1);
  const Spatial s = pool_attrs(l);
  const bp_tensor_desc &dy = l.inputs[0], &dx = l.outputs[0];
  const PoolShape ps = pool_shape(l, dx, dy, DType<T>::id, "dx", "dy", &s);
  if (ps.H * ps.W == 0) return;
  average_backward(data<T>(dy), data<T>(dx), ps,
                   ps.H * ps.W + ps.P * ps.Q * s.kernel_h * s.kernel_w,
                   [&](int64_t p, int64_t q) { return avg_window(s, ps, p, q); });
}

template <class T>
void adaptive_avg_pool_kernel(const Launch& l) {
  check_arity(l, 1, 1);
  const bp_tensor_desc &x = l.inputs[0], &y = l.outputs[0];
  const PoolShape ps = pool_shape(l, x, y, DType<T>::id, "input", "output", nullptr);
  if (ps.planes * ps.P * ps.Q == 0) return;
  if (ps.H * ps.W == 0)
    launch_error(l, bp::sdk::format("adaptive pooling of an empty image %s into %s",
                                    describe(x).c_str(), describe(y).c_str()));
  average_forward(data<T>(x), data<T>(y), ps, ps.H * ps.W + ps.P * ps.Q,
                  [&](int64_t p, int64_t q) { return adaptive_window(ps, p, q); });
}

template <class T>
void adaptive_avg_pool_backward_kernel(const Launch& l) {
  check_arity(l, 1, 1);
  const bp_tensor_desc &dy = l.inputs[0], &dx = l.outputs[0];
  const PoolShape ps = pool_shape(l, dx, dy, DType<T>::id, "dx", "dy", nullptr);
  if (ps.planes * ps.H * ps.W == 0) return;
  average_backward(data<T>(dy), data<T>(dx), ps, ps.H * ps.W + ps.P * ps.Q,
                   [&](int64_t p, int64_t q) { return adaptive_window(ps, p, q); });
}

}  // namespace

KernelFn pool_family(Op op, bp_dtype dtype) {
  return visit_dtype(dtype, [&]<class T>() -> KernelFn {
    if constexpr (is_floating_v<T>) {
      switch (op) {
        case Op::kMaxPool2d:
          return &max_pool_kernel<T>;
        case Op::kMaxPool2dBackward:
          return &max_pool_backward_kernel<T>;
        case Op::kAvgPool2d:
          return &avg_pool_kernel<T>;
        case Op::kAvgPool2dBackward:
          return &avg_pool_backward_kernel<T>;
        case Op::kAdaptiveAvgPool2d:
          return &adaptive_avg_pool_kernel<T>;
        case Op::kAdaptiveAvgPool2dBackward:
          return &adaptive_avg_pool_backward_kernel<T>;
        default:
          break;
      }
    }
    return nullptr;
  });
}

}  // namespace bp::cpu
