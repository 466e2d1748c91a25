// Batch normalisation: batch_norm (training with batch statistics and running statistics
// updated in place, or evaluation with the running statistics) and batch_norm_backward, over
// x[N, C, L] (Note [Op catalogue]).
//
// Note [Batch norm kernels]
//   Per-channel tensors (weight, bias, running and saved statistics) have type S: float for
//   f16/bf16 inputs, the input's type otherwise; sums accumulate in ACC (float, double for f64)
//   with Kahan compensation per work-item, combined by a local-memory tree.
//   - bp_bn_stats: one work-group per chunk of a channel's N*L values (one chunk per channel
//     unless the channels are too few to fill the device); the chunk's mean in a first pass,
//     the sum of squared deviations from it in a second (no cancellation). A channel of one
//     chunk is finished there; otherwise bp_bn_combine merges the chunks in order with Chan et
//     al.'s pairwise update (mean and M2). Finishing writes save_mean and save_invstd =
//     1 / sqrt(var + eps) of the biased variance and updates the running statistics with the
//     unbiased one.
//   - bp_bn_apply: one work-item per element, y = (x - mean) * invstd * weight + bias with the
//     saved statistics (training) or the running ones (evaluation).
//   - bp_bn_bwd_reduce: likewise per chunk: dbias = sum(dy), dweight = sum(dy * xhat) with
//     xhat = (x - mean) * invstd; bp_bn_bwd_combine adds the chunks in order.
//   - bp_bn_bwd_apply: dx = weight * invstd * (dy - dbias / M - xhat * dweight / M), M = N*L.
//   Channels are walked by work-groups, not by launches: no per-channel host work.
#include "opencl_allocator.hpp"
#include "opencl_kernels.hpp"

#include <algorithm>

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

/* Writes channel c's statistics from its mean and biased variance over M values. */
void bp_bn_finish(long c, ACC mean, ACC var, long M, __global S* save_mean,
                  __global S* save_invstd, __global S* run_mean, __global S* run_var, long sm_off,
                  long si_off, long rm_off, long rv_off, ACC eps, ACC momentum) {
  save_mean[sm_off + c] = (S)mean;
  save_invstd[si_off + c] = (S)((ACC)1 / sqrt(var + eps));
  ACC unbiased = var * (ACC)M / (ACC)(M - 1);
  run_mean[rm_off + c] = (S)(((ACC)1 - momentum) * (ACC)run_mean[rm_off + c] + momentum * mean);
  run_var[rv_off + c] = (S)(((ACC)1 - momentum) * (ACC)run_var[rv_off + c] + momentum * unbiased);
}

/* Work-group (c, ch): the mean and the sum of squared deviations of chunk ch of channel c;
   finishes the channel when it has one chunk, else writes (mean, M2) to partial. */
__kernel void bp_bn_stats(__global const T* x, __global S* save_mean, __global S* save_invstd,
                          __global S* run_mean, __global S* run_var, __global ACC* partial,
                          long N_, long C_, long L_, long x_off, long sm_off, long si_off,
                          long rm_off, long rv_off, ACC eps, ACC momentum, long nchunks,
                          long chunk, __local ACC* scratch) {
  long g = get_group_id(0), c = g / nchunks, ch = g - c * nchunks;
  int lid = (int)get_local_id(0), G = (int)get_local_size(0);
  long M = N_ * L_, j0 = ch * chunk, j1 = min(M, j0 + chunk);
  ACC s = (ACC)0, k = (ACC)0;
  for (long j = j0 + lid; j < j1; j += G) {
    long n = j / L_, l = j - n * L_;
    BP_KAHAN(s, k, (ACC)LD(x[x_off + (n * C_ + c) * L_ + l]));
  }
  ACC mean = bp_group_sum(s - k, scratch) / (ACC)(j1 - j0);
  s = (ACC)0;
  k = (ACC)0;
  for (long j = j0 + lid; j < j1; j += G) {
    long n = j / L_, l = j - n * L_;
    ACC d = (ACC)LD(x[x_off + (n * C_ + c) * L_ + l]) - mean;
    BP_KAHAN(s, k, d * d);
  }
  ACC m2 = bp_group_sum(s - k, scratch);
  if (lid != 0) return;
  if (nchunks == 1) {
    bp_bn_finish(c, mean, m2 / (ACC)M, M, save_mean, save_invstd, run_mean, run_var, sm_off,
                 si_off, rm_off, rv_off, eps, momentum);
  } else {
    partial[2 * g] = mean;
    partial[2 * g + 1] = m2;
  }
}

/* One work-item per channel merges its chunks in order (Chan et al.'s pairwise update). */
__kernel void bp_bn_combine(__global const ACC* partial, __global S* save_mean,
                            __global S* save_invstd, __global S* run_mean, __global S* run_var,
                            long C_, long M, long nchunks, long chunk, long sm_off, long si_off,
                            long rm_off, long rv_off, ACC eps, ACC momentum) {
  long c = get_global_id(0);
  if (c >= C_) return;
  ACC na = (ACC)0, mean = (ACC)0, m2 = (ACC)0;
  for (long ch = 0; ch < nchunks; ++ch) {
    long j0 = ch * chunk, j1 = min(M, j0 + chunk);
    if (j1 <= j0) break;
    ACC nb = (ACC)(j1 - j0), mb = partial[2 * (c * nchunks + ch)];
    ACC m2b = partial[2 * (c * nchunks + ch) + 1];
    ACC n = na + nb, delta = mb - mean;
    mean += delta * (nb / n);
    m2 += m2b + delta * delta * (na * nb / n);
    na = n;
  }
  bp_bn_finish(c, mean, m2 / (ACC)M, M, save_mean, save_invstd, run_mean, run_var, sm_off, si_off,
               rm_off, rv_off, eps, momentum);
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

/* Work-group (c, ch): sum(dy) and sum(dy * xhat) over chunk ch of channel c, to dbias and
   dweight when the channel has one chunk, else to partial. */
__kernel void bp_bn_bwd_reduce(__global const T* dy, __global const T* x,
                               __global const S* mean, __global const S* invstd,
                               __global S* dweight, __global S* dbias, __global ACC* partial,
                               long N_, long C_, long L_, long dy_off, long x_off, long m_off,
                               long i_off, long dw_off, long db_off, long nchunks, long chunk,
                               __local ACC* scratch) {
  long g = get_group_id(0), c = g / nchunks, ch = g - c * nchunks;
  int lid = (int)get_local_id(0), G = (int)get_local_size(0);
  long M = N_ * L_, j0 = ch * chunk, j1 = min(M, j0 + chunk);
  ACC mu = (ACC)mean[m_off + c], is = (ACC)invstd[i_off + c];
  ACC s1 = (ACC)0, k1 = (ACC)0, s2 = (ACC)0, k2 = (ACC)0;
  for (long j = j0 + lid; j < j1; j += G) {
    long n = j / L_, l = j - n * L_, e = (n * C_ + c) * L_ + l;
    ACC gv = (ACC)LD(dy[dy_off + e]);
    ACC xh = ((ACC)LD(x[x_off + e]) - mu) * is;
    BP_KAHAN(s1, k1, gv);
    BP_KAHAN(s2, k2, gv * xh);
  }
  ACC sum_dy = bp_group_sum(s1 - k1, scratch);
  ACC sum_dy_xh = bp_group_sum(s2 - k2, scratch);
  if (lid != 0) return;
  if (nchunks == 1) {
    dbias[db_off + c] = (S)sum_dy;
    dweight[dw_off + c] = (S)sum_dy_xh;
  } else {
    partial[2 * g] = sum_dy;
    partial[2 * g + 1] = sum_dy_xh;
  }
}

/* One work-item per channel adds its chunks' sums in order. */
__kernel void bp_bn_bwd_combine(__global const ACC* partial, __global S* dweight,
                                __global S* dbias, long C_, long nchunks, long dw_off,
                                long db_off) {
  long c = get_global_id(0);
  if (c >= C_) return;
  ACC s1 = (ACC)0, k1 = (ACC)0, s2 = (ACC)0, k2 = (ACC)0;
  for (long ch = 0; ch < nchunks; ++ch) {
    BP_KAHAN(s1, k1, partial[2 * (c * nchunks + ch)]);
    BP_KAHAN(s2, k2, partial[2 * (c * nchunks + ch) + 1]);
  }
  dbias[db_off + c] = (S)(s1 - k1);
  dweight[dw_off + c] = (S)(s2 - k2);
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

// How one channel's N*L values are split among work-groups: about 8 work-groups per compute unit
// in all, each with at least 8 values per work-item (Note [Batch norm kernels]).
struct Chunks {
  int64_t count, length;
};
Chunks chunks_for(const LaunchContext& lc, size_t local, int64_t C, int64_t M) {
  const int64_t cu = std::max<int64_t>(lc.device.info().compute_units, 1);
  const int64_t most = std::max<int64_t>(M / (static_cast<int64_t>(local) * 8), 1);
  const int64_t want = (cu * 8 + C - 1) / std::max<int64_t>(C, 1);
  const int64_t count = std::clamp<int64_t>(want, 1, std::min<int64_t>(most, 1024));
  const int64_t length = std::max<int64_t>((M + count - 1) / count, 1);
  return {std::max<int64_t>((M + length - 1) / length, 1), length};
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
  static const char* const kForward[] = {"bp_bn_stats", "bp_bn_apply", "bp_bn_combine"};
  static const char* const kBackward[] = {"bp_bn_bwd_reduce", "bp_bn_bwd_apply",
                                          "bp_bn_bwd_combine"};
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
      const Chunks ch = chunks_for(lc, k.local_size[0], C, N * L);
      TempBuffer partial(lc, ch.count > 1 ? static_cast<uint64_t>(C * ch.count) * 2 * acc : 0);
      cl_mem pm = partial.buf ? partial.buf->mem : out[1].buffer->mem;
      size_t local = k.local_size[0];
      size_t global = static_cast<size_t>(C * ch.count) * local;
      KernelArgs a(k.kernels[0]);
      a.mem(x.buffer).mem(out[1].buffer).mem(out[2].buffer).mem(in[3].buffer).mem(in[4].buffer);
      a.mem(pm);
      for (int64_t v : {N, C, L, x_off, sm_off, si_off, rm_off, rv_off})
        a.value(static_cast<cl_long>(v));
      real(a, eps);
      real(a, momentum);
      a.value(static_cast<cl_long>(ch.count)).value(static_cast<cl_long>(ch.length));
      a.local(local * acc);
      enqueue_kernel(lc, k, 0, 1, &global, &local);
      if (ch.count > 1) {
        size_t local2 = k.local_size[2];
        size_t global2 = grid_size(static_cast<uint64_t>(C), local2);
        KernelArgs b(k.kernels[2]);
        b.mem(pm).mem(out[1].buffer).mem(out[2].buffer).mem(in[3].buffer).mem(in[4].buffer);
        for (int64_t v : {C, N * L, ch.count, ch.length, sm_off, si_off, rm_off, rv_off})
          b.value(static_cast<cl_long>(v));
        real(b, eps);
        real(b, momentum);
        enqueue_kernel(lc, k, 2, 1, &global2, &local2);
      }
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
    const Chunks ch = chunks_for(lc, k.local_size[0], C, M);
    TempBuffer partial(lc, ch.count > 1 ? static_cast<uint64_t>(C * ch.count) * 2 * acc : 0);
    cl_mem pm = partial.buf ? partial.buf->mem : out[1].buffer->mem;
    size_t local = k.local_size[0];
    size_t global = static_cast<size_t>(C * ch.count) * local;
    KernelArgs a(k.kernels[0]);
    a.mem(dy.buffer).mem(x.buffer).mem(in[3].buffer).mem(in[4].buffer).mem(out[1].buffer);
    a.mem(out[2].buffer).mem(pm);
    for (int64_t v : {N, C, L, dy_off, x_off, m_off, i_off, dw_off, db_off, ch.count, ch.length})
      a.value(static_cast<cl_long>(v));
    a.local(local * acc);
    enqueue_kernel(lc, k, 0, 1, &global, &local);
    if (ch.count > 1) {
      size_t local2 = k.local_size[2];
      size_t global2 = grid_size(static_cast<uint64_t>(C), local2);
      KernelArgs b(k.kernels[2]);
      b.mem(pm).mem(out[1].buffer).mem(out[2].buffer);
      for (int64_t v : {C, ch.count, dw_off, db_off}) b.value(static_cast<cl_long>(v));
      enqueue_kernel(lc, k, 2, 1, &global2, &local2);
    }
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
