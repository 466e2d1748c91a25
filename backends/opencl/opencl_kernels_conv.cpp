// 2-D convolution: conv2d, conv2d_backward_input, conv2d_backward_weight (NCHW, groups,
// stride, padding, dilation, optional bias) as implicit GEMMs on the matmul kernel's tiling.
//
// Note [Implicit GEMM convolution]
//   Each op is a batch of GEMMs whose operands are never materialised: the tiled kernel of
//   Note [Matmul tiling] stages its tiles through load functions that compute the address of
//   each element of the im2col matrix (zero outside the image), so no im2col buffer is
//   allocated. With Kg = K/G output and Cg = C/G input channels per group and RS = R*S:
//     conv2d                  batch (n, g): y[Kg, P*Q]   = w[Kg, Cg*RS]      @ col(x)[Cg*RS, P*Q]
//     conv2d_backward_input   batch (n, g): dx[Cg, H*W]  = w^T[Cg, Kg*RS]    @ col(dy)[Kg*RS, H*W]
//     conv2d_backward_weight  batch (s, g): dw[Kg, Cg*RS] = dy[Kg, N*P*Q]    @ col(x)^T[N*P*Q,
//     Cg*RS]
//   where col(dy)[(k,r,s), (h,w)] is dy[k, p, q] for h = p*stride_h - pad_h + r*dilation_h (and
//   w likewise) when such a whole p (q) exists in [0, P) ([0, Q)), else 0. The bias is added to
//   the accumulator before its one store. Accumulation is in float for f32/f16/bf16 and in double
//   for f64 (Note [Conversions]), FMA contraction allowed as in matmul.
//   The weight gradient sums over N*P*Q, which can be long while its output is small: it is
//   split into S slices of the sum (S chosen so the device gets about 8 work-groups per compute
//   unit), each slice's tile goes to a temporary buffer in the accumulation type, and
//   bp_conv_wgrad_sum adds the slices in slice order, so the result does not depend on timing.
//   Grid dimensions 1 and 2 stay within 65535 groups by splitting the launch. Index arithmetic
//   inside the GEMM (the decomposition of a row or column into channel, tap and pixel) is in
//   32 bits, which GPUs divide far faster than 64; the host refuses GEMM sizes of 2^31 or more
//   (a single image plane of 2^31 pixels), and addresses are formed in 64 bits.
#include "opencl_kernels.hpp"

#include <algorithm>

namespace bp::opencl {
namespace {

constexpr const char* kConvPrelude = R"CLC(
#pragma OPENCL FP_CONTRACT ON
#define RTS (TS / WPT)

typedef struct {
  long N_, C_, H_, W_, K_, R_, S_, P_, Q_, G_;
  long sh, sw, ph, pw, dh, dw;
  long x_off, w_off, y_off, b_off, has_bias;
  long M, NN, KD; /* GEMM sizes: out[M, NN] = A[M, KD] @ B[KD, NN] */
  long batch0, mtile0, nbatch, kchunk;
} bp_cv;

/* x[n, c, h, w] of the zero-padded image, c counted from channel c0. */
ACC bp_cv_x(__global const T* x, const bp_cv* p, long n, long c, long h, long w) {
  if (h < 0 || h >= p->H_ || w < 0 || w >= p->W_) return (ACC)0;
  return (ACC)LD(x[p->x_off + ((n * p->C_ + c) * p->H_ + h) * p->W_ + w]);
}
)CLC";

// One GEMM kernel: $NAME, the loads $LOADA (of a at gm, gk) and $LOADB (of b at gk, gn), the
// store $STORE (of acc[i][j] at m, n) and the range [$KBEG, $KEND) of the sum, for batch entry
// bz = bn * G + bg.
constexpr const char* kConvGemmTemplate = R"CLC(
__kernel __attribute__((reqd_work_group_size(RTS, RTS, 1)))
void $NAME(__global T* out, __global const T* a, __global const T* b, __global const T* bias,
           __global ACC* partial, bp_cv p) {
  __local ACC As[TK][TS];
  __local ACC Bs[TK][TS];
  const int tx = (int)get_local_id(0), ty = (int)get_local_id(1);
  const int tid = ty * RTS + tx;
  const int n0 = (int)get_group_id(0) * TS;
  const int m0 = (int)(get_group_id(1) + p.mtile0) * TS;
  const int bz = (int)(get_group_id(2) + p.batch0);
  const int bn = bz / (int)p.G_, bg = bz - bn * (int)p.G_;
  const int kbeg = $KBEG, kend = $KEND;

  ACC acc[WPT][WPT];
  for (int i = 0; i < WPT; ++i)
    for (int j = 0; j < WPT; ++j) acc[i][j] = (ACC)0;

  for (int k0 = kbeg; k0 < kend; k0 += TK) {
    for (int l = tid; l < TK * TS; l += RTS * RTS) {
      int kk = l % TK, mm = l / TK;
      int gm = m0 + mm, gk = k0 + kk;
      As[kk][mm] = (gm < p.M && gk < kend) ? $LOADA : (ACC)0;
    }
    for (int l = tid; l < TK * TS; l += RTS * RTS) {
      int nn = l % TS, kk = l / TS;
      int gn = n0 + nn, gk = k0 + kk;
      Bs[kk][nn] = (gn < p.NN && gk < kend) ? $LOADB : (ACC)0;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kk = 0; kk < TK; ++kk) {
      ACC br[WPT];
      for (int j = 0; j < WPT; ++j) br[j] = Bs[kk][tx + j * RTS];
      for (int i = 0; i < WPT; ++i) {
        ACC av = As[kk][ty + i * RTS];
        for (int j = 0; j < WPT; ++j) acc[i][j] += av * br[j];
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }

  for (int i = 0; i < WPT; ++i) {
    int m = m0 + ty + i * RTS;
    if (m >= p.M) continue;
    for (int j = 0; j < WPT; ++j) {
      int n = n0 + tx + j * RTS;
      if (n >= p.NN) continue;
      $STORE;
    }
  }
}
)CLC";

// Loads and stores of the three ops (Note [Implicit GEMM convolution]). (bn, bg) is (image,
// group) for the data ops and (slice, group) for the weight gradient.
constexpr const char* kConvOps = R"CLC(
/* conv2d: a = w, b = x, out = y. */
ACC bp_fwd_a(__global const T* w, const bp_cv* p, int bn, int bg, int m, int k) {
  return (ACC)LD(w[p->w_off + ((long)bg * p->M + m) * p->KD + k]);
}
ACC bp_fwd_b(__global const T* x, const bp_cv* p, int bn, int bg, int k, int j) {
  const int S = (int)p->S_, RS = (int)(p->R_ * p->S_), Q = (int)p->Q_;
  int c = k / RS, rs = k - c * RS, r = rs / S, s = rs - r * S;
  int pp = j / Q, q = j - pp * Q;
  return bp_cv_x(x, p, bn, (long)bg * (p->C_ / p->G_) + c, pp * p->sh - p->ph + r * p->dh,
                 q * p->sw - p->pw + s * p->dw);
}
void bp_fwd_store(__global T* y, __global const T* bias, const bp_cv* p, int bn, int bg, int m,
                  int j, ACC v) {
  long k = (long)bg * p->M + m;
  if (p->has_bias) v += (ACC)LD(bias[p->b_off + k]);
  y[p->y_off + ((long)bn * p->K_ + k) * p->NN + j] = ST(v);
}

/* conv2d_backward_input: a = w (transposed per group), b = dy, out = dx. */
ACC bp_bwi_a(__global const T* w, const bp_cv* p, int bn, int bg, int c, int k) {
  const int RS = (int)(p->R_ * p->S_);
  int kk = k / RS, rs = k - kk * RS;
  return (ACC)LD(w[p->w_off + (((long)bg * (p->K_ / p->G_) + kk) * p->M + c) * RS + rs]);
}
ACC bp_bwi_b(__global const T* dy, const bp_cv* p, int bn, int bg, int k, int j) {
  const int S = (int)p->S_, RS = (int)(p->R_ * p->S_), W = (int)p->W_;
  const int sh = (int)p->sh, sw = (int)p->sw;
  int kk = k / RS, rs = k - kk * RS, r = rs / S, s = rs - r * S;
  int h = j / W, w = j - h * W;
  int hp = h + (int)p->ph - r * (int)p->dh, wp = w + (int)p->pw - s * (int)p->dw;
  if (hp < 0 || wp < 0) return (ACC)0;
  int pp = hp / sh, q = wp / sw;
  if (pp * sh != hp || q * sw != wp || pp >= p->P_ || q >= p->Q_) return (ACC)0;
  long ch = (long)bg * (p->K_ / p->G_) + kk;
  return (ACC)LD(dy[p->y_off + (((long)bn * p->K_ + ch) * p->P_ + pp) * p->Q_ + q]);
}
void bp_bwi_store(__global T* dx, const bp_cv* p, int bn, int bg, int c, int j, ACC v) {
  dx[p->x_off + ((long)bn * p->C_ + (long)bg * p->M + c) * p->NN + j] = ST(v);
}

/* conv2d_backward_weight: a = dy, b = x (im2col transposed), out = dw or the slice's partial.
   bn is the slice here. */
ACC bp_bww_a(__global const T* dy, const bp_cv* p, int bn, int bg, int k, int i) {
  const int PQ = (int)(p->P_ * p->Q_);
  int n = i / PQ, pq = i - n * PQ;
  return (ACC)LD(dy[p->y_off + ((long)n * p->K_ + (long)bg * p->M + k) * PQ + pq]);
}
ACC bp_bww_b(__global const T* x, const bp_cv* p, int bn, int bg, int i, int j) {
  const int PQ = (int)(p->P_ * p->Q_), Q = (int)p->Q_, S = (int)p->S_;
  const int RS = (int)(p->R_ * p->S_);
  int n = i / PQ, pq = i - n * PQ, pp = pq / Q, q = pq - pp * Q;
  int c = j / RS, rs = j - c * RS, r = rs / S, s = rs - r * S;
  return bp_cv_x(x, p, n, (long)bg * (p->C_ / p->G_) + c, pp * p->sh - p->ph + r * p->dh,
                 q * p->sw - p->pw + s * p->dw);
}
void bp_bww_store(__global T* dw, __global ACC* partial, const bp_cv* p, int bn, int bg, int k,
                  int j, ACC v) {
  if (p->nbatch == p->G_) {
    dw[p->w_off + ((long)bg * p->M + k) * p->NN + j] = ST(v);
  } else {
    partial[(((long)bn * p->G_ + bg) * p->M + k) * p->NN + j] = v;
  }
}

/* Adds the weight gradient's slices in slice order: dw[i] = sum_s partial[s][i]. */
__kernel void bp_conv_wgrad_sum(__global T* dw, __global const ACC* partial, long w_off,
                                long n, long slices) {
  long i = get_global_id(0);
  if (i >= n) return;
  ACC v = (ACC)0;
  for (long s = 0; s < slices; ++s) v += partial[s * n + i];
  dw[w_off + i] = ST(v);
}
)CLC";

std::string gemm_kernel(const char* name, const char* loada, const char* loadb, const char* store,
                        const char* kbeg, const char* kend) {
  std::string s = kConvGemmTemplate;
  replace_all(s, "$NAME", name);
  replace_all(s, "$LOADA", loada);
  replace_all(s, "$LOADB", loadb);
  replace_all(s, "$STORE", store);
  replace_all(s, "$KBEG", kbeg);
  replace_all(s, "$KEND", kend);
  return s;
}

const char* kernel_name(Op op) {
  switch (op) {
    case Op::kConv2d:
      return "bp_conv2d";
    case Op::kConv2dBackwardInput:
      return "bp_conv2d_backward_input";
    default:
      return "bp_conv2d_backward_weight";
  }
}

// Host mirror of bp_cv.
struct ClConv {
  int64_t N, C, H, W, K, R, S, P, Q, G;
  int64_t sh, sw, ph, pw, dh, dw;
  int64_t x_off, w_off, y_off, b_off, has_bias;
  int64_t M, NN, KD;
  int64_t batch0, mtile0, nbatch, kchunk;
};

}  // namespace

std::string conv_source(int32_t dtype, const DeviceInfo& info) {
  Tiling t = gemm_tiling(dtype, info);
  std::string s = kernel_prelude(dtype, info.fp64);
  s += sdk::format("#define TS %d\n#define WPT %d\n#define TK %d\n#define ACC %s\n", t.ts, t.wpt,
                   kGemmTK, dtype == BP_DTYPE_F64 ? "double" : "float");
  s += kConvPrelude;
  s += kConvOps;
  s +=
      gemm_kernel("bp_conv2d", "bp_fwd_a(a, &p, bn, bg, gm, gk)", "bp_fwd_b(b, &p, bn, bg, gk, gn)",
                  "bp_fwd_store(out, bias, &p, bn, bg, m, n, acc[i][j])", "0", "p.KD");
  s += gemm_kernel("bp_conv2d_backward_input", "bp_bwi_a(a, &p, bn, bg, gm, gk)",
                   "bp_bwi_b(b, &p, bn, bg, gk, gn)",
                   "bp_bwi_store(out, &p, bn, bg, m, n, acc[i][j])", "0", "p.KD");
  s += gemm_kernel("bp_conv2d_backward_weight", "bp_bww_a(a, &p, bn, bg, gm, gk)",
                   "bp_bww_b(b, &p, bn, bg, gk, gn)",
                   "bp_bww_store(out, partial, &p, bn, bg, m, n, acc[i][j])", "bn * (int)p.kchunk",
                   "(int)min(p.KD, (long)(bn + 1) * p.kchunk)");
  return s;
}

void create_conv_kernels(bp_kernel& k, cl_program program) {
  cl_kernel kernel = create_kernel(k, program, kernel_name(k.op));
  Tiling t = gemm_tiling(k.dtype, k.device->info());
  size_t rts = static_cast<size_t>(t.ts / t.wpt);
  size_t wg = 0;
  clGetKernelWorkGroupInfo(kernel, k.device->id(), CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg,
                           nullptr);
  if (wg != 0 && wg < rts * rts) {
    clReleaseKernel(kernel);
    sdk::fail(BP_ERROR_DEVICE,
              sdk::format("opencl: %s: the convolution kernel needs work-groups of %zu "
                          "work-items but the device allows %zu for it",
                          op_label(k).c_str(), rts * rts, wg));
  }
  k.kernels = {kernel};
  k.local_size = {rts};
  if (k.op == Op::kConv2dBackwardWeight) {
    cl_kernel sum = create_kernel(k, program, "bp_conv_wgrad_sum");
    k.kernels.push_back(sum);
    k.local_size.push_back(pick_local_size(sum, *k.device, 256));
  }
}

void launch_conv(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in, int32_t num_in,
                 const bp_tensor_desc* out, int32_t num_out, const sdk::Attrs& attrs) {
  const bool fwd = k.op == Op::kConv2d, bwi = k.op == Op::kConv2dBackwardInput;
  check_counts(k, num_in, num_out, 2, fwd ? 3 : 2, 1, 1);
  // The roles of the descriptors: x[N,C,H,W], w[K,C/G,R,S], y (or dy)[N,K,P,Q].
  const bp_tensor_desc& x = fwd ? in[0] : bwi ? out[0] : in[0];
  const bp_tensor_desc& w = fwd ? in[1] : bwi ? in[1] : out[0];
  const bp_tensor_desc& y = fwd ? out[0] : bwi ? in[0] : in[1];
  const char* xr = fwd ? "input 0 (x)" : bwi ? "output (dx)" : "input 0 (x)";
  const char* wr = fwd ? "input 1 (w)" : bwi ? "input 1 (w)" : "output (dw)";
  const char* yr = fwd ? "output (y)" : bwi ? "input 0 (dy)" : "input 1 (dy)";
  ClConv p{};
  p.x_off = dense_offset(k, x, k.dtype, 4, xr);
  p.w_off = dense_offset(k, w, k.dtype, 4, wr);
  p.y_off = dense_offset(k, y, k.dtype, 4, yr);
  p.G = int_attr(k, attrs, BP_ATTR_ID_GROUPS, 1, 1);
  p.sh = int_attr(k, attrs, BP_ATTR_ID_STRIDE_H, 1, 1);
  p.sw = int_attr(k, attrs, BP_ATTR_ID_STRIDE_W, 1, 1);
  p.ph = int_attr(k, attrs, BP_ATTR_ID_PAD_H, 0, 0);
  p.pw = int_attr(k, attrs, BP_ATTR_ID_PAD_W, 0, 0);
  p.dh = int_attr(k, attrs, BP_ATTR_ID_DILATION_H, 1, 1);
  p.dw = int_attr(k, attrs, BP_ATTR_ID_DILATION_W, 1, 1);
  p.N = x.shape[0];
  p.C = x.shape[1];
  p.H = x.shape[2];
  p.W = x.shape[3];
  p.K = w.shape[0];
  p.R = w.shape[2];
  p.S = w.shape[3];
  p.P = y.shape[2];
  p.Q = y.shape[3];
  const int64_t eff_r = p.dh * (p.R - 1) + 1, eff_s = p.dw * (p.S - 1) + 1;
  const bool shapes_fit = p.C % p.G == 0 && p.K % p.G == 0 && w.shape[1] == p.C / p.G &&
                          y.shape[0] == p.N && y.shape[1] == p.K && p.R >= 1 && p.S >= 1 &&
                          p.H + 2 * p.ph >= eff_r && p.W + 2 * p.pw >= eff_s &&
                          p.P == (p.H + 2 * p.ph - eff_r) / p.sh + 1 &&
                          p.Q == (p.W + 2 * p.pw - eff_s) / p.sw + 1;
  if (!shapes_fit)
    fail_launch(k, sdk::format("shapes do not fit x[N,C,H,W] w[K,C/G,R,S] y[N,K,P,Q] with G = "
                               "%lld, stride %lldx%lld, padding %lldx%lld, dilation %lldx%lld: "
                               "x %s, w %s, y %s",
                               static_cast<long long>(p.G), static_cast<long long>(p.sh),
                               static_cast<long long>(p.sw), static_cast<long long>(p.ph),
                               static_cast<long long>(p.pw), static_cast<long long>(p.dh),
                               static_cast<long long>(p.dw), shape_string(x).c_str(),
                               shape_string(w).c_str(), shape_string(y).c_str()));
  const bp_tensor_desc* bias = fwd && num_in == 3 ? &in[2] : nullptr;
  if (bias) {
    p.b_off = dense_offset(k, *bias, k.dtype, 1, "input 2 (bias)");
    if (bias->shape[0] != p.K)
      fail_launch(
          k, sdk::format("bias %s must have K = %lld elements (w %s)", shape_string(*bias).c_str(),
                         static_cast<long long>(p.K), shape_string(w).c_str()));
    p.has_bias = 1;
  }
  const int64_t Kg = p.K / p.G, Cg = p.C / p.G;
  if (fwd) {
    p.M = Kg, p.NN = p.P * p.Q, p.KD = Cg * p.R * p.S, p.nbatch = p.N * p.G;
  } else if (bwi) {
    p.M = Cg, p.NN = p.H * p.W, p.KD = Kg * p.R * p.S, p.nbatch = p.N * p.G;
  } else {
    p.M = Kg, p.NN = Cg * p.R * p.S, p.KD = p.N * p.P * p.Q, p.nbatch = p.G;
  }
  if (sdk::numel(fwd ? y : bwi ? x : w) == 0) return;
  if (p.M > INT32_MAX || p.NN > INT32_MAX || p.KD > INT32_MAX - 2 * kGemmTK || p.nbatch > INT32_MAX)
    fail_launch(k, sdk::format("the GEMM of this convolution (%lld x %lld, sum of %lld, batch "
                               "%lld) exceeds the kernel's 32-bit index range: x %s, w %s",
                               static_cast<long long>(p.M), static_cast<long long>(p.NN),
                               static_cast<long long>(p.KD), static_cast<long long>(p.nbatch),
                               shape_string(x).c_str(), shape_string(w).c_str()));

  const Tiling t = gemm_tiling(k.dtype, lc.device.info());
  const int64_t n_tiles = (p.NN + t.ts - 1) / t.ts, m_tiles = (p.M + t.ts - 1) / t.ts;
  const size_t acc = k.dtype == BP_DTYPE_F64 ? 8 : 4;
  int64_t slices = 1;
  if (!fwd && !bwi) {
    // Note [Implicit GEMM convolution]: slices of the N*P*Q sum, at least 8 tile rows each.
    const int64_t cu = std::max<int64_t>(lc.device.info().compute_units, 1);
    const int64_t tiles = n_tiles * m_tiles * p.G;
    const int64_t want = (cu * 8 + tiles - 1) / tiles;
    const int64_t most = std::max<int64_t>(p.KD / (kGemmTK * 8), 1);
    slices = std::clamp<int64_t>(want, 1, std::min<int64_t>(most, 256));
    if (p.KD == 0) {  // an empty batch: one slice whose sum over nothing writes dw = 0
      slices = 1;
      p.kchunk = 0;
    } else {
      p.kchunk = (p.KD + slices - 1) / slices;
      p.kchunk = (p.kchunk + kGemmTK - 1) / kGemmTK * kGemmTK;
      slices = std::max<int64_t>((p.KD + p.kchunk - 1) / p.kchunk, 1);
    }
    p.nbatch = slices * p.G;
  }
  const int64_t wgrad_n = p.G * p.M * p.NN;
  TempBuffer partial(lc, slices > 1 ? static_cast<uint64_t>(slices * wgrad_n) * acc : 0);
  bp_buffer* o = fwd ? y.buffer : bwi ? x.buffer : w.buffer;
  bp_buffer* a = fwd ? w.buffer : bwi ? w.buffer : y.buffer;
  bp_buffer* b = fwd ? x.buffer : bwi ? y.buffer : x.buffer;

  constexpr int64_t kMaxGroups = 65535;
  if (n_tiles > INT32_MAX)
    fail_launch(k, sdk::format("%lld column tiles are too many", static_cast<long long>(n_tiles)));
  const size_t rts = k.local_size[0];
  std::lock_guard<std::mutex> lock(k.mutex);
  for (int64_t b0 = 0; b0 < p.nbatch; b0 += kMaxGroups) {
    for (int64_t mt0 = 0; mt0 < m_tiles; mt0 += kMaxGroups) {
      p.batch0 = b0;
      p.mtile0 = mt0;
      size_t local[3] = {rts, rts, 1};
      size_t global[3] = {static_cast<size_t>(n_tiles) * rts,
                          static_cast<size_t>(std::min(m_tiles - mt0, kMaxGroups)) * rts,
                          static_cast<size_t>(std::min(p.nbatch - b0, kMaxGroups))};
      KernelArgs(k.kernels[0])
          .mem(o)
          .mem(a)
          .mem(b)
          .mem(bias ? bias->buffer : o)
          .mem(partial.buf ? partial.buf : o)
          .value(p);
      enqueue_kernel(lc, k, 0, 3, global, local);
    }
  }
  if (slices > 1) {
    size_t local = k.local_size[1];
    size_t global = grid_size(static_cast<uint64_t>(wgrad_n), local);
    KernelArgs(k.kernels[1])
        .mem(o)
        .mem(partial.buf)
        .value(static_cast<cl_long>(p.w_off))
        .value(static_cast<cl_long>(wgrad_n))
        .value(static_cast<cl_long>(slices));
    enqueue_kernel(lc, k, 1, 1, &global, &local);
  }
}

}  // namespace bp::opencl
