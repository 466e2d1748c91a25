// Batch normalisation: batch_norm (training with batch statistics and running statistics
// updated in place, or evaluation with the running statistics) and batch_norm_backward, over
// x[N, C, L] (Note [Op catalogue]).
//
// Note [Batch norm kernels]
//   Per-channel tensors (weight, bias, running and saved statistics) have type S: float for
//   f16/bf16 inputs, the input's type otherwise; sums accumulate in ACC (float, double for f64)
//   with Kahan compensation per work-item, combined by a local-memory tree.
//   - bp_bn_stats: one work-group per channel; the mean in a first pass over its N*L elements,
//     the biased variance as the mean of squared deviations in a second (no cancellation);
//     writes save_mean and save_invstd = 1 / sqrt(var + eps) and, in training, updates the
//     running statistics with the unbiased variance.
//   - bp_bn_apply: one work-item per element, y = (x - mean) * invstd * weight + bias with the
//     saved statistics (training) or the running ones (evaluation).
//   - bp_bn_bwd_reduce: one work-group per channel: dbias = sum(dy), dweight = sum(dy * xhat)
//     with xhat = (x - mean) * invstd.
//   - bp_bn_bwd_apply: dx = weight * invstd * (dy - dbias / M - xhat * dweight / M), M = N*L.
//   Channels are walked by work-groups, not by launches: no per-channel host work.
#include "opencl_kernels.hpp"

namespace bp::opencl {
namespace {

constexpr const char* kNormSource = R"CLC(
#define BP_KAHAN(s, c, v)                              \
  {                                                    \
    ACC y_ = (v) - c;                                  \
    ACC t_ = s + y_;                                   \
    c = isfinite(t_) ? (t_ - s) - y_ : (ACC)0;         \
    s = t_;                                            \
  }

/* Sum of the work-group's values v (every work-item gets it). */
ACC bp_group_sum(ACC v, __local ACC* scratch) {
  int lid = (int)get_local_id(0), L = (int)get_local_size(0);
  barrier(CLK_LOCAL_MEM_FENCE);
  scratch[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int w = L >> 1; w > 0; w >>= 1) {
    if (lid < w) scratch[lid] += scratch[lid + w];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  return scratch[0];
}

__kernel void bp_bn_stats(__global const T* x, __global S* save_mean, __global S* save_invstd,
                          __global S* run_mean, __global S* run_var, long N_, long C_, long L_,
                          long x_off, long sm_off, long si_off, long rm_off, long rv_off,
                          ACC eps, ACC momentum, int update, __local ACC* scratch) {
  long c = get_group_id(0);
  int lid = (int)get_local_id(0), G = (int)get_local_size(0);
  long M = N_ * L_;
  ACC s = (ACC)0, k = (ACC)0;
  for (long j = lid; j < M; j += G) {
    long n = j / L_, l = j - n * L_;
    BP_KAHAN(s, k, (ACC)LD(x[x_off + (n * C_ + c) * L_ + l]));
  }
  ACC mean = bp_group_sum(s - k, scratch) / (ACC)M;
  s = (ACC)0;
  k = (ACC)0;
  for (long j = lid; j < M; j += G) {
    long n = j / L_, l = j - n * L_;
    ACC d = (ACC)LD(x[x_off + (n * C_ + c) * L_ + l]) - mean;
    BP_KAHAN(s, k, d * d);
  }
  ACC var = bp_group_sum(s - k, scratch) / (ACC)M;
  if (lid == 0) {
    save_mean[sm_off + c] = (S)mean;
    save_invstd[si_off + c] = (S)((ACC)1 / sqrt(var + eps));
    if (update) {
      ACC unbiased = var * (ACC)M / (ACC)(M - 1);
      run_mean[rm_off + c] = (S)(((ACC)1 - momentum) * (ACC)run_mean[rm_off + c] + momentum * mean);
      run_var[rv_off + c] =
          (S)(((ACC)1 - momentum) * (ACC)run_var[rv_off + c] + momentum * unbiased);
    }
  }
}

/* training: mean = save_mean, invstd = save_invstd; evaluation: mean = running_mean, and
   invstd = 1 / sqrt(running_var + eps). */
__kernel void bp_bn_apply(__global T* y, __global const T* x, __global const S* weight,
                          __global const S* bias, __global const S* mean,
                          __global const S* stat, long C_, long L_, long n, long y_off, long x_off,
                          long w_off, long b_off, long m_off, long s_off, int eval, ACC eps) {
  long i = get_global_id(0);
  if (i >= n) return;
  long c = (i / L_) % C_;
  ACC invstd = eval ? (ACC)1 / sqrt((ACC)stat[s_off + c] + eps) : (ACC)stat[s_off + c];
  ACC v = ((ACC)LD(x[x_off + i]) - (ACC)mean[m_off + c]) * invstd;
  y[y_off + i] = ST(v * (ACC)weight[w_off + c] + (ACC)bias[b_off + c]);
}

__kernel void bp_bn_bwd_reduce(__global const T* dy, __global const T* x,
                               __global const S* mean, __global const S* invstd,
                               __global S* dweight, __global S* dbias, long N_, long C_, long L_,
                               long dy_off, long x_off, long m_off, long i_off, long dw_off,
                               long db_off, __local ACC* scratch) {
  long c = get_group_id(0);
  int lid = (int)get_local_id(0), G = (int)get_local_size(0);
  long M = N_ * L_;
  ACC mu = (ACC)mean[m_off + c], is = (ACC)invstd[i_off + c];
  ACC s1 = (ACC)0, k1 = (ACC)0, s2 = (ACC)0, k2 = (ACC)0;
  for (long j = lid; j < M; j += G) {
    long n = j / L_, l = j - n * L_, e = (n * C_ + c) * L_ + l;
    ACC g = (ACC)LD(dy[dy_off + e]);
    ACC xh = ((ACC)LD(x[x_off + e]) - mu) * is;
    BP_KAHAN(s1, k1, g);
    BP_KAHAN(s2, k2, g * xh);
  }
  ACC sum_dy = bp_group_sum(s1 - k1, scratch);
  ACC sum_dy_xh = bp_group_sum(s2 - k2, scratch);
  if (lid == 0) {
    dbias[db_off + c] = (S)sum_dy;
    dweight[dw_off + c] = (S)sum_dy_xh;
  }
}

__kernel void bp_bn_bwd_apply(__global T* dx, __global const T* dy, __global const T* x,
                              __global const S* weight, __global const S* mean,
                              __global const S* invstd, __global const S* dweight,
                              __global const S* dbias, long C_, long L_, long n, long dx_off,
                              long dy_off, long x_off, long w_off, long m_off, long i_off,
                              long dw_off, long db_off, long M) {
  long i = get_global_id(0);
  if (i >= n) return;
  long c = (i / L_) % C_;
  ACC is = (ACC)invstd[i_off + c];
  ACC xh = ((ACC)LD(x[x_off + i]) - (ACC)mean[m_off + c]) * is;
  ACC g = (ACC)LD(dy[dy_off + i]);
  ACC v = (ACC)weight[w_off + c] * is *
          (g - (ACC)dbias[db_off + c] / (ACC)M - xh * (ACC)dweight[dw_off + c] / (ACC)M);
  dx[dx_off + i] = ST(v);
}
)CLC";

int32_t stat_dtype(int32_t dtype) {
  return dtype == BP_DTYPE_F16 || dtype == BP_DTYPE_BF16 ? BP_DTYPE_F32 : dtype;
}

// Checks a per-channel tensor [C] of the statistics dtype; returns its element offset.
int64_t channel_offset(const bp_kernel& k, const bp_tensor_desc& t, int64_t C, const char* role) {
  int64_t off = dense_offset(k, t, stat_dtype(k.dtype), 1, role);
  if (t.shape[0] != C)
    fail_launch(k, sdk::format("%s %s must have C = %lld elements", role, shape_string(t).c_str(),
                               static_cast<long long>(C)));
  return off;
}

}  // namespace

std::string norm_source(int32_t dtype, bool fp64) {
  std::string s = kernel_prelude(dtype, fp64);
  bool f64 = dtype == BP_DTYPE_F64;
  s += sdk::format("#define ACC %s\n#define S %s\n", f64 ? "double" : "float",
                   f64 ? "double" : "float");
  s += kNormSource;
  return s;
}

void create_norm_kernels(bp_kernel& k, cl_program program) {
  static const char* const kForward[] = {"bp_bn_stats", "bp_bn_apply"};
  static const char* const kBackward[] = {"bp_bn_bwd_reduce", "bp_bn_bwd_apply"};
  for (const char* name : k.op == Op::kBatchNorm ? kForward : kBackward) {
    cl_kernel kernel = create_kernel(k, program, name);
    k.kernels.push_back(kernel);
    k.local_size.push_back(pick_local_size(kernel, *k.device, 256));
  }
}

void launch_norm(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in, int32_t num_in,
                 const bp_tensor_desc* out, int32_t num_out, const sdk::Attrs& attrs) {
  const bool fwd = k.op == Op::kBatchNorm;
  const size_t acc = k.dtype == BP_DTYPE_F64 ? 8 : 4;
  const double eps = attrs.f(BP_ATTR_ID_EPS, 1e-5);
  if (fwd) {
    const bool training = attrs.i(BP_ATTR_ID_TRAINING, 0) != 0;
    check_counts(k, num_in, num_out, 5, 5, training ? 3 : 1, 3);
    const bp_tensor_desc &x = in[0], &y = out[0];
    const int64_t x_off = dense_offset(k, x, k.dtype, 3, "input 0 (x)");
    const int64_t y_off = dense_offset(k, y, k.dtype, 3, "output 0 (y)");
    check_same_shape(k, x, y, "input 0 (x)");
    const int64_t N = x.shape[0], C = x.shape[1], L = x.shape[2];
    const int64_t w_off = channel_offset(k, in[1], C, "input 1 (weight)");
    const int64_t b_off = channel_offset(k, in[2], C, "input 2 (bias)");
    const int64_t rm_off = channel_offset(k, in[3], C, "input 3 (running_mean)");
    const int64_t rv_off = channel_offset(k, in[4], C, "input 4 (running_var)");
    int64_t sm_off = 0, si_off = 0;
    if (training) {
      sm_off = channel_offset(k, out[1], C, "output 1 (save_mean)");
      si_off = channel_offset(k, out[2], C, "output 2 (save_invstd)");
      if (N * L < 2)
        fail_launch(k, sdk::format("training needs at least 2 values per channel, x is %s",
                                   shape_string(x).c_str()));
    }
    const int64_t n = N * C * L;
    if (n == 0) return;
    const double momentum = attrs.f(BP_ATTR_ID_MOMENTUM, 0.1);
    std::lock_guard<std::mutex> lock(k.mutex);
    auto real = [&](KernelArgs& a, double v) -> KernelArgs& {
      return k.dtype == BP_DTYPE_F64 ? a.value(v) : a.value(static_cast<float>(v));
    };
    if (training) {
      size_t local = k.local_size[0];
      size_t global = static_cast<size_t>(C) * local;
      KernelArgs a(k.kernels[0]);
      a.mem(x.buffer).mem(out[1].buffer).mem(out[2].buffer).mem(in[3].buffer).mem(in[4].buffer);
      for (int64_t v : {N, C, L, x_off, sm_off, si_off, rm_off, rv_off})
        a.value(static_cast<cl_long>(v));
      real(a, eps);
      real(a, momentum);
      a.value(static_cast<cl_int>(1)).local(local * acc);
      enqueue_kernel(lc, k, 0, 1, &global, &local);
    }
    size_t local = k.local_size[1];
    size_t global = grid_size(static_cast<uint64_t>(n), local);
    KernelArgs a(k.kernels[1]);
    a.mem(y.buffer).mem(x.buffer).mem(in[1].buffer).mem(in[2].buffer);
    a.mem(training ? out[1].buffer : in[3].buffer).mem(training ? out[2].buffer : in[4].buffer);
    for (int64_t v : {C, L, n, y_off, x_off, w_off, b_off, training ? sm_off : rm_off,
                      training ? si_off : rv_off})
      a.value(static_cast<cl_long>(v));
    a.value(static_cast<cl_int>(training ? 0 : 1));
    real(a, eps);
    enqueue_kernel(lc, k, 1, 1, &global, &local);
    return;
  }

  check_counts(k, num_in, num_out, 5, 5, 3, 3);
  const bp_tensor_desc &dy = in[0], &x = in[1], &dx = out[0];
  const int64_t dy_off = dense_offset(k, dy, k.dtype, 3, "input 0 (dy)");
  const int64_t x_off = dense_offset(k, x, k.dtype, 3, "input 1 (x)");
  const int64_t dx_off = dense_offset(k, dx, k.dtype, 3, "output 0 (dx)");
  check_same_shape(k, dy, dx, "input 0 (dy)");
  check_same_shape(k, x, dx, "input 1 (x)");
  const int64_t N = x.shape[0], C = x.shape[1], L = x.shape[2];
  const int64_t w_off = channel_offset(k, in[2], C, "input 2 (weight)");
  const int64_t m_off = channel_offset(k, in[3], C, "input 3 (save_mean)");
  const int64_t i_off = channel_offset(k, in[4], C, "input 4 (save_invstd)");
  const int64_t dw_off = channel_offset(k, out[1], C, "output 1 (dweight)");
  const int64_t db_off = channel_offset(k, out[2], C, "output 2 (dbias)");
  if (C == 0) return;
  const int64_t n = N * C * L, M = N * L;
  std::lock_guard<std::mutex> lock(k.mutex);
  {
    size_t local = k.local_size[0];
    size_t global = static_cast<size_t>(C) * local;
    KernelArgs a(k.kernels[0]);
    a.mem(dy.buffer)
        .mem(x.buffer)
        .mem(in[3].buffer)
        .mem(in[4].buffer)
        .mem(out[1].buffer)
        .mem(out[2].buffer);
    for (int64_t v : {N, C, L, dy_off, x_off, m_off, i_off, dw_off, db_off})
      a.value(static_cast<cl_long>(v));
    a.local(local * acc);
    enqueue_kernel(lc, k, 0, 1, &global, &local);
  }
  if (n == 0) return;
  size_t local = k.local_size[1];
  size_t global = grid_size(static_cast<uint64_t>(n), local);
  KernelArgs a(k.kernels[1]);
  a.mem(dx.buffer)
      .mem(dy.buffer)
      .mem(x.buffer)
      .mem(in[2].buffer)
      .mem(in[3].buffer)
      .mem(in[4].buffer);
  a.mem(out[1].buffer).mem(out[2].buffer);
  for (int64_t v : {C, L, n, dx_off, dy_off, x_off, w_off, m_off, i_off, dw_off, db_off, M})
    a.value(static_cast<cl_long>(v));
  enqueue_kernel(lc, k, 1, 1, &global, &local);
}

}  // namespace bp::opencl
