// Pooling over NCHW planes: max_pool2d (values and I64 indices), avg_pool2d, adaptive_avg_pool2d
// and their backward ops.
//
// Note [Pooling kernels]
//   Forward ops give each work-item one output and walk its window (max: the first maximum in
//   row-major window order, a NaN counting as the maximum; avg: the sum in the accumulation
//   type over the window clipped to the input, divided as torch.nn.functional.avg_pool2d does).
//   The backward ops never add to one element from two work-items, so they need no atomics and
//   give the same bits on every run:
//   - avg and adaptive avg: one work-item per dx element gathers dy / divisor from the outputs
//     whose windows hold it, in row-major (p, q) order.
//   - max: the catalogue defines dx by the indices alone (dx[indices[p, q]] += dy[p, q] in
//     row-major (p, q) order), and indices may lie anywhere in the plane, so one work-item per
//     (n, c) plane zeroes the plane and adds its dy in that order. f16/bf16 add in a float
//     scratch plane from the caching allocator and round once at the end. An index outside the
//     plane (never made by max_pool2d) is skipped.
#include "opencl_kernels.hpp"

#include <algorithm>

namespace bp::opencl {
namespace {

constexpr const char* kPoolSource = R"CLC(
typedef struct {
  long N_, C_, H_, W_, P_, Q_;
  long kh, kw, sh, sw, ph, pw, dh, dw;
  long count_include_pad;
  long x_off, y_off, i_off;
} bp_pl;

__kernel void bp_max_pool2d(__global T* y, __global long* ind, __global const T* x, bp_pl p) {
  long o = get_global_id(0);
  if (o >= p.N_ * p.C_ * p.P_ * p.Q_) return;
  long q = o % p.Q_, t = o / p.Q_, pp = t % p.P_, nc = t / p.P_;
  long h0 = pp * p.sh - p.ph, w0 = q * p.sw - p.pw;
  __global const T* plane = x + p.x_off + nc * p.H_ * p.W_;
  ACC best = (ACC)(-INFINITY);
  long bi = -1;
  for (long r = 0; r < p.kh; ++r) {
    long h = h0 + r * p.dh;
    if (h < 0 || h >= p.H_) continue;
    for (long s = 0; s < p.kw; ++s) {
      long w = w0 + s * p.dw;
      if (w < 0 || w >= p.W_) continue;
      ACC v = (ACC)LD(plane[h * p.W_ + w]);
      if (bi < 0 || v > best || (isnan(v) && !isnan(best))) {
        best = v;
        bi = h * p.W_ + w;
      }
    }
  }
  y[p.y_off + o] = ST(best);
  ind[p.i_off + o] = bi;
}

__kernel void bp_max_pool2d_backward(__global T* dx, __global ACC* scratch, __global const T* dy,
                                     __global const long* ind, bp_pl p) {
  long nc = get_global_id(0);
  if (nc >= p.N_ * p.C_) return;
  long HW = p.H_ * p.W_, PQ = p.P_ * p.Q_;
#if BP_NARROW
  __global ACC* acc = scratch + nc * HW;
#else
  __global ACC* acc = dx + p.x_off + nc * HW;
#endif
  for (long i = 0; i < HW; ++i) acc[i] = (ACC)0;
  for (long j = 0; j < PQ; ++j) {
    long ix = ind[p.i_off + nc * PQ + j];
    if (ix < 0 || ix >= HW) continue;
    acc[ix] += (ACC)LD(dy[p.y_off + nc * PQ + j]);
  }
#if BP_NARROW
  for (long i = 0; i < HW; ++i) dx[p.x_off + nc * HW + i] = ST(acc[i]);
#endif
}

/* The window of output (pp, q) clipped as avg_pool2d: rows [*h0, *h1), columns [*w0, *w1);
   returns the divisor. */
long bp_avg_window(const bp_pl* p, long pp, long q, long* h0, long* h1, long* w0, long* w1) {
  long hs = pp * p->sh - p->ph, ws = q * p->sw - p->pw;
  long he = min(hs + p->kh, p->H_ + p->ph), we = min(ws + p->kw, p->W_ + p->pw);
  long pool = (he - hs) * (we - ws);
  hs = max(hs, 0L);
  ws = max(ws, 0L);
  he = min(he, p->H_);
  we = min(we, p->W_);
  *h0 = hs;
  *h1 = he;
  *w0 = ws;
  *w1 = we;
  return p->count_include_pad ? pool : (he - hs) * (we - ws);
}

__kernel void bp_avg_pool2d(__global T* y, __global const T* x, bp_pl p) {
  long o = get_global_id(0);
  if (o >= p.N_ * p.C_ * p.P_ * p.Q_) return;
  long q = o % p.Q_, t = o / p.Q_, pp = t % p.P_, nc = t / p.P_;
  long h0, h1, w0, w1;
  long div = bp_avg_window(&p, pp, q, &h0, &h1, &w0, &w1);
  __global const T* plane = x + p.x_off + nc * p.H_ * p.W_;
  ACC s = (ACC)0;
  for (long h = h0; h < h1; ++h)
    for (long w = w0; w < w1; ++w) s += (ACC)LD(plane[h * p.W_ + w]);
  y[p.y_off + o] = ST(s / (ACC)div);
}

__kernel void bp_avg_pool2d_backward(__global T* dx, __global const T* dy, bp_pl p) {
  long i = get_global_id(0);
  if (i >= p.N_ * p.C_ * p.H_ * p.W_) return;
  long w = i % p.W_, t = i / p.W_, h = t % p.H_, nc = t / p.H_;
  /* Outputs whose window (before clipping) holds row h: pp*sh - ph <= h < pp*sh - ph + kh. */
  long hp = h + p.ph, wp = w + p.pw;
  long p0 = hp >= p.kh ? (hp - p.kh) / p.sh + 1 : 0, p1 = min(hp / p.sh + 1, p.P_);
  long q0 = wp >= p.kw ? (wp - p.kw) / p.sw + 1 : 0, q1 = min(wp / p.sw + 1, p.Q_);
  __global const T* g = dy + p.y_off + nc * p.P_ * p.Q_;
  ACC s = (ACC)0;
  for (long pp = p0; pp < p1; ++pp)
    for (long q = q0; q < q1; ++q) {
      long h0, h1, w0, w1;
      long div = bp_avg_window(&p, pp, q, &h0, &h1, &w0, &w1);
      if (h < h0 || h >= h1 || w < w0 || w >= w1) continue;
      s += (ACC)LD(g[pp * p.Q_ + q]) / (ACC)div;
    }
  dx[p.x_off + i] = ST(s);
}

/* Adaptive windows: rows floor(pp H / P) .. ceil((pp + 1) H / P) - 1. */
long bp_start(long i, long n_out, long n_in) { return (i * n_in) / n_out; }
long bp_end(long i, long n_out, long n_in) { return ((i + 1) * n_in + n_out - 1) / n_out; }

__kernel void bp_adaptive_avg_pool2d(__global T* y, __global const T* x, bp_pl p) {
  long o = get_global_id(0);
  if (o >= p.N_ * p.C_ * p.P_ * p.Q_) return;
  long q = o % p.Q_, t = o / p.Q_, pp = t % p.P_, nc = t / p.P_;
  long h0 = bp_start(pp, p.P_, p.H_), h1 = bp_end(pp, p.P_, p.H_);
  long w0 = bp_start(q, p.Q_, p.W_), w1 = bp_end(q, p.Q_, p.W_);
  __global const T* plane = x + p.x_off + nc * p.H_ * p.W_;
  ACC s = (ACC)0;
  for (long h = h0; h < h1; ++h)
    for (long w = w0; w < w1; ++w) s += (ACC)LD(plane[h * p.W_ + w]);
  y[p.y_off + o] = ST(s / (ACC)((h1 - h0) * (w1 - w0)));
}

__kernel void bp_adaptive_avg_pool2d_backward(__global T* dx, __global const T* dy, bp_pl p) {
  long i = get_global_id(0);
  if (i >= p.N_ * p.C_ * p.H_ * p.W_) return;
  long w = i % p.W_, t = i / p.W_, h = t % p.H_, nc = t / p.H_;
  /* Candidate outputs around the proportional position; membership checked exactly. */
  long p0 = max((h * p.P_) / p.H_ - 1, 0L), p1 = min(((h + 1) * p.P_ + p.H_ - 1) / p.H_ + 1, p.P_);
  long q0 = max((w * p.Q_) / p.W_ - 1, 0L), q1 = min(((w + 1) * p.Q_ + p.W_ - 1) / p.W_ + 1, p.Q_);
  __global const T* g = dy + p.y_off + nc * p.P_ * p.Q_;
  ACC s = (ACC)0;
  for (long pp = p0; pp < p1; ++pp) {
    long h0 = bp_start(pp, p.P_, p.H_), h1 = bp_end(pp, p.P_, p.H_);
    if (h < h0 || h >= h1) continue;
    for (long q = q0; q < q1; ++q) {
      long w0 = bp_start(q, p.Q_, p.W_), w1 = bp_end(q, p.Q_, p.W_);
      if (w < w0 || w >= w1) continue;
      s += (ACC)LD(g[pp * p.Q_ + q]) / (ACC)((h1 - h0) * (w1 - w0));
    }
  }
  dx[p.x_off + i] = ST(s);
}
)CLC";

// Host mirror of bp_pl.
struct ClPool {
  int64_t N, C, H, W, P, Q;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  int64_t count_include_pad;
  int64_t x_off, y_off, i_off;
};

const char* kernel_name(Op op) {
  switch (op) {
    case Op::kMaxPool2d:
      return "bp_max_pool2d";
    case Op::kMaxPool2dBackward:
      return "bp_max_pool2d_backward";
    case Op::kAvgPool2d:
      return "bp_avg_pool2d";
    case Op::kAvgPool2dBackward:
      return "bp_avg_pool2d_backward";
    case Op::kAdaptiveAvgPool2d:
      return "bp_adaptive_avg_pool2d";
    default:
      return "bp_adaptive_avg_pool2d_backward";
  }
}

// Output extent of a pooling window (Note [Op catalogue]: with CEIL_MODE the ceiling, less one
// when the last window would start in the right padding).
int64_t pooled_size(int64_t in, int64_t k, int64_t s, int64_t pad, int64_t dil, bool ceil) {
  int64_t span = in + 2 * pad - dil * (k - 1) - 1;
  if (span < 0) return 0;
  int64_t out = (ceil ? span + s - 1 : span) / s + 1;
  if (ceil && (out - 1) * s >= in + pad) --out;
  return out;
}

}  // namespace

std::string pool_source(int32_t dtype, bool fp64) {
  std::string s = kernel_prelude(dtype, fp64);
  s += sdk::format("#define ACC %s\n#define BP_NARROW %d\n",
                   dtype == BP_DTYPE_F64 ? "double" : "float",
                   dtype == BP_DTYPE_F16 || dtype == BP_DTYPE_BF16 ? 1 : 0);
  s += kPoolSource;
  return s;
}

void create_pool_kernels(bp_kernel& k, cl_program program) {
  cl_kernel kernel = create_kernel(k, program, kernel_name(k.op));
  k.kernels = {kernel};
  k.local_size = {pick_local_size(kernel, *k.device, 256)};
}

void launch_pool(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in, int32_t num_in,
                 const bp_tensor_desc* out, int32_t num_out, const sdk::Attrs& attrs) {
  const Op op = k.op;
  const bool max_fwd = op == Op::kMaxPool2d, max_bwd = op == Op::kMaxPool2dBackward;
  const bool backward =
      max_bwd || op == Op::kAvgPool2dBackward || op == Op::kAdaptiveAvgPool2dBackward;
  check_counts(k, num_in, num_out, max_bwd ? 2 : 1, max_bwd ? 2 : 1, max_fwd ? 2 : 1,
               max_fwd ? 2 : 1);
  const bp_tensor_desc& x = backward ? out[0] : in[0];  // x or dx: [N,C,H,W]
  const bp_tensor_desc& y = backward ? in[0] : out[0];  // y or dy: [N,C,P,Q]
  ClPool p{};
  p.x_off = dense_offset(k, x, k.dtype, 4, backward ? "output (dx)" : "input 0 (x)");
  p.y_off = dense_offset(k, y, k.dtype, 4, backward ? "input 0 (dy)" : "output 0 (y)");
  const bp_tensor_desc* ind = max_fwd ? &out[1] : max_bwd ? &in[1] : nullptr;
  if (ind) {
    p.i_off = dense_offset(k, *ind, BP_DTYPE_I64, 4,
                           max_fwd ? "output 1 (indices)" : "input 1 (indices)");
    check_same_shape(k, *ind, y, max_fwd ? "output 1 (indices)" : "input 1 (indices)");
  }
  p.N = x.shape[0], p.C = x.shape[1], p.H = x.shape[2], p.W = x.shape[3];
  p.P = y.shape[2], p.Q = y.shape[3];
  bool fits = y.shape[0] == p.N && y.shape[1] == p.C;
  const bool adaptive = op == Op::kAdaptiveAvgPool2d || op == Op::kAdaptiveAvgPool2dBackward;
  if (!adaptive && !max_bwd) {
    p.kh = int_attr(k, attrs, BP_ATTR_ID_KERNEL_H, 0, 1);
    p.kw = int_attr(k, attrs, BP_ATTR_ID_KERNEL_W, 0, 1);
    p.sh = int_attr(k, attrs, BP_ATTR_ID_STRIDE_H, p.kh, 1);
    p.sw = int_attr(k, attrs, BP_ATTR_ID_STRIDE_W, p.kw, 1);
    p.ph = int_attr(k, attrs, BP_ATTR_ID_PAD_H, 0, 0);
    p.pw = int_attr(k, attrs, BP_ATTR_ID_PAD_W, 0, 0);
    p.dh = max_fwd ? int_attr(k, attrs, BP_ATTR_ID_DILATION_H, 1, 1) : 1;
    p.dw = max_fwd ? int_attr(k, attrs, BP_ATTR_ID_DILATION_W, 1, 1) : 1;
    p.count_include_pad = attrs.i(BP_ATTR_ID_COUNT_INCLUDE_PAD, 1) != 0 ? 1 : 0;
    const bool ceil = attrs.i(BP_ATTR_ID_CEIL_MODE, 0) != 0;
    if (2 * p.ph > p.kh || 2 * p.pw > p.kw)
      fail_launch(k, sdk::format("padding %lldx%lld is more than half the kernel %lldx%lld",
                                 static_cast<long long>(p.ph), static_cast<long long>(p.pw),
                                 static_cast<long long>(p.kh), static_cast<long long>(p.kw)));
    fits = fits && p.P == pooled_size(p.H, p.kh, p.sh, p.ph, p.dh, ceil) &&
           p.Q == pooled_size(p.W, p.kw, p.sw, p.pw, p.dw, ceil);
  } else if (adaptive) {
    fits = fits && (p.P > 0 || sdk::numel(y) == 0) && (p.Q > 0 || sdk::numel(y) == 0);
  }
  if (!fits)
    fail_launch(k, sdk::format("shapes do not fit x[N,C,H,W] -> y[N,C,P,Q] with kernel %lldx%lld, "
                               "stride %lldx%lld, padding %lldx%lld: %s %s, %s %s",
                               static_cast<long long>(p.kh), static_cast<long long>(p.kw),
                               static_cast<long long>(p.sh), static_cast<long long>(p.sw),
                               static_cast<long long>(p.ph), static_cast<long long>(p.pw),
                               backward ? "dx" : "x", shape_string(x).c_str(),
                               backward ? "dy" : "y", shape_string(y).c_str()));
  const int64_t planes = p.N * p.C;
  const int64_t items = max_bwd ? planes : backward ? sdk::numel(x) : sdk::numel(y);
  if (items == 0 || sdk::numel(x) == 0) return;
  const bool narrow = k.dtype == BP_DTYPE_F16 || k.dtype == BP_DTYPE_BF16;
  TempBuffer scratch(lc, max_bwd && narrow ? static_cast<uint64_t>(sdk::numel(x)) * 4 : 0);
  size_t local = k.local_size[0];
  size_t global = grid_size(static_cast<uint64_t>(items), local);
  std::lock_guard<std::mutex> lock(k.mutex);
  KernelArgs args(k.kernels[0]);
  if (max_fwd) {
    args.mem(y.buffer).mem(ind->buffer).mem(x.buffer);
  } else if (max_bwd) {
    args.mem(x.buffer).mem(scratch.buf ? scratch.buf : x.buffer).mem(y.buffer).mem(ind->buffer);
  } else if (backward) {
    args.mem(x.buffer).mem(y.buffer);
  } else {
    args.mem(y.buffer).mem(x.buffer);
  }
  args.value(p);
  enqueue_kernel(lc, k, 0, 1, &global, &local);
}

}  // namespace bp::opencl
