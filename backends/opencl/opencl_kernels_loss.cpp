// The fused classification loss (Note [Op catalogue], minor 8; Note [Fused cross entropy] in
// plugin_abi.h): cross_entropy and cross_entropy_backward over logits x[N, C].
//
// Note [Loss kernels]
//   One work-group per row, as bp_softmax_tree (Note [Softmax kernels]). The forward takes the
//   row's maximum and then the sum of exp(x - max) (and, with label smoothing, the sum of x) by
//   a strided loop plus a local-memory tree, in C (float for f16, bf16 and f32, double for f64:
//   the stats dtype); work-item 0 writes lse = max + log(sum) and the loss. The backward needs
//   no reduction: each work-item writes its strided share of the row's gradient from lse and
//   dloss. A target outside [0, C) that is not the ignore index raises a flag (its row gets a
//   NaN loss or a zero gradient), which the launch reads back, as embedding does (Note
//   [Transformer kernels]), and fails naming the first such target, its row and C.
#include "opencl_allocator.hpp"
#include "opencl_kernels.hpp"

#include <bit>
#include <mutex>
#include <vector>

namespace bp::opencl {
namespace {

constexpr const char* kLossSource = R"CLC(
__kernel void bp_cross_entropy(__global C* loss, __global C* lse, __global const T* x,
                               __global const long* tg, __global int* flag, long ncls,
                               long loss_off, long lse_off, long x_off, long t_off, long ignore,
                               C keep, C spread, int smooth, __local C* scratch) {
  long r = get_group_id(0);
  int lid = (int)get_local_id(0), L = (int)get_local_size(0);
  __global const T* row = x + x_off + r * ncls;
  C m = (C)(-INFINITY);
  for (long j = lid; j < ncls; j += L) m = BP_MAX(LD(row[j]), m);
  m = bp_group_reduce(m, 1, scratch);
  C shift = isinf(m) ? (C)0 : m; /* an infinite maximum: -inf or +inf as torch's logsumexp */
  C s = (C)0, sx = (C)0;
  for (long j = lid; j < ncls; j += L) {
    C v = LD(row[j]);
    s += exp(v - shift);
    if (smooth) sx += v;
  }
  s = bp_group_reduce(s, 0, scratch);
  /* Without smoothing the row's sum is no term of the loss (a -inf logit leaves it finite). */
  if (smooth) sx = bp_group_reduce(sx, 0, scratch);
  if (lid == 0) {
    C l = shift + log(s);
    long t = tg[t_off + r];
    lse[lse_off + r] = l;
    if (t == ignore) {
      loss[loss_off + r] = (C)0;
    } else if (t < 0 || t >= ncls) {
      flag[0] = 1;
      loss[loss_off + r] = (C)NAN;
    } else {
      loss[loss_off + r] = l - keep * LD(row[t]) - (smooth ? spread * sx : (C)0);
    }
  }
}

__kernel void bp_cross_entropy_bwd(__global T* dx, __global const T* x, __global const long* tg,
                                   __global const C* lse, __global const C* dloss,
                                   __global int* flag, long ncls, long dx_off, long x_off,
                                   long t_off, long lse_off, long g_off, long ignore, C keep,
                                   C spread) {
  long r = get_group_id(0);
  int lid = (int)get_local_id(0), L = (int)get_local_size(0);
  __global const T* row = x + x_off + r * ncls;
  __global T* out = dx + dx_off + r * ncls;
  long t = tg[t_off + r];
  if (t == ignore || t < 0 || t >= ncls) {
    if (t != ignore && lid == 0) flag[0] = 1;
    for (long j = lid; j < ncls; j += L) out[j] = ST((C)0);
    return;
  }
  C l = lse[lse_off + r], g = dloss[g_off + r];
  for (long j = lid; j < ncls; j += L)
    out[j] = ST(g * (exp(LD(row[j]) - l) - (j == t ? keep : (C)0) - spread));
}
)CLC";

int32_t stats_dtype(int32_t dtype) {
  return dtype == BP_DTYPE_F16 || dtype == BP_DTYPE_BF16 ? BP_DTYPE_F32 : dtype;
}

void check_rows(const bp_kernel& k, const bp_tensor_desc& t, int64_t n, const char* role) {
  if (t.rank != 1 || t.shape[0] != n)
    fail_launch(k, sdk::format("%s has shape %s, expected [%lld]", role, shape_string(t).c_str(),
                               static_cast<long long>(n)));
}

// Work-items per row: the kernel's cap, or the next power of two >= C when the row is shorter.
size_t row_local(const bp_kernel& k, int64_t ncls) {
  const size_t cap = k.local_size[0];
  if (ncls >= static_cast<int64_t>(cap)) return cap;
  return std::max<size_t>(1, std::bit_ceil(static_cast<size_t>(std::max<int64_t>(ncls, 1))));
}

// Scalars of the launch in the compute type CT (float, or double for f64).
template <class CT>
void launch_loss_as(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in,
                    const bp_tensor_desc* out, const sdk::Attrs& attrs) {
  const bool backward = k.op == Op::kCrossEntropyBackward;
  const int32_t sdt = stats_dtype(k.dtype);
  const bp_tensor_desc &x = in[0], &tg = in[1];
  const int64_t x_off = dense_offset(k, x, k.dtype, 2, "input 0 (logits)");
  const int64_t N = x.shape[0], K = x.shape[1];
  if (K < 1) fail_launch(k, sdk::format("logits %s have no class", shape_string(x).c_str()));
  const int64_t t_off = dense_offset(k, tg, BP_DTYPE_I64, 1, "input 1 (target)");
  check_rows(k, tg, N, "input 1 (target)");
  const int64_t ignore = attrs.i(BP_ATTR_ID_IGNORE_INDEX, -100);
  const double e = attrs.f(BP_ATTR_ID_LABEL_SMOOTHING, 0.0);
  if (!(e >= 0 && e <= 1)) fail_launch(k, sdk::format("label_smoothing %g is outside [0, 1]", e));
  const CT keep = static_cast<CT>(1 - e), spread = static_cast<CT>(e / static_cast<double>(K));
  int64_t offs[3] = {0, 0, 0};  // forward: loss, lse; backward: dx, lse, dloss
  if (backward) {
    offs[1] = dense_offset(k, in[2], sdt, 1, "input 2 (lse)");
    check_rows(k, in[2], N, "input 2 (lse)");
    offs[2] = dense_offset(k, in[3], sdt, 1, "input 3 (dloss)");
    check_rows(k, in[3], N, "input 3 (dloss)");
    offs[0] = dense_offset(k, out[0], k.dtype, 2, "output (dx)");
    check_same_shape(k, out[0], x, "output (dx)");
  } else {
    offs[0] = dense_offset(k, out[0], sdt, 1, "output 0 (loss)");
    check_rows(k, out[0], N, "output 0 (loss)");
    offs[1] = dense_offset(k, out[1], sdt, 1, "output 1 (lse)");
    check_rows(k, out[1], N, "output 1 (lse)");
  }
  if (N == 0) return;
  const ErrorFlag flag(k, lc);
  std::lock_guard<std::mutex> lock(k.mutex);
  size_t local = row_local(k, K);
  size_t global = static_cast<size_t>(N) * local;
  KernelArgs a(k.kernels[0]);
  if (backward) {
    a.mem(out[0].buffer).mem(x.buffer).mem(tg.buffer).mem(in[2].buffer).mem(in[3].buffer);
    a.mem(flag.buf());
    for (int64_t v : {K, offs[0], x_off, t_off, offs[1], offs[2], ignore})
      a.value(static_cast<cl_long>(v));
    a.value(keep).value(spread);
  } else {
    a.mem(out[0].buffer).mem(out[1].buffer).mem(x.buffer).mem(tg.buffer).mem(flag.buf());
    for (int64_t v : {K, offs[0], offs[1], x_off, t_off, ignore}) a.value(static_cast<cl_long>(v));
    a.value(keep).value(spread).value(static_cast<cl_int>(e > 0 ? 1 : 0));
    a.local(local * sizeof(CT));
  }
  enqueue_kernel(lc, k, 0, 1, &global, &local);
  if (!flag.raised(k)) return;
  const std::vector<int64_t> host = read_indices(k, lc, tg, t_off, N);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t = host[static_cast<size_t>(n)];
    if (t != ignore && (t < 0 || t >= K))
      fail_launch(k, sdk::format("target %lld of row %lld is outside [0, %lld) (the number of "
                                 "classes) and is not the ignore index %lld",
                                 static_cast<long long>(t), static_cast<long long>(n),
                                 static_cast<long long>(K), static_cast<long long>(ignore)));
  }
  fail_launch(k, "the kernel reported a target out of range but none was found on re-reading");
}

}  // namespace

std::string loss_source(int32_t dtype, bool fp64) {
  return kernel_prelude(dtype, fp64) + "#define ACC C\n" + group_reduce_source() + kLossSource;
}

void create_loss_kernels(bp_kernel& k, cl_program program) {
  cl_kernel main = create_kernel(
      k, program, k.op == Op::kCrossEntropyBackward ? "bp_cross_entropy_bwd" : "bp_cross_entropy");
  k.kernels = {main};
  k.local_size = {pick_local_size(main, *k.device, 256)};
}

void launch_loss(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in, int32_t num_in,
                 const bp_tensor_desc* out, int32_t num_out, const sdk::Attrs& attrs) {
  const bool backward = k.op == Op::kCrossEntropyBackward;
  check_counts(k, num_in, num_out, backward ? 4 : 2, backward ? 4 : 2, backward ? 1 : 2,
               backward ? 1 : 2);
  if (k.dtype == BP_DTYPE_F64)
    launch_loss_as<double>(k, lc, in, out, attrs);
  else
    launch_loss_as<float>(k, lc, in, out, attrs);
}

}  // namespace bp::opencl
