// The fused optimiser update (Note [Op catalogue], minor 7; Note [Fused Adam] in plugin_abi.h):
// adamw, one work-item per element and one enqueue per parameter (the device's queue orders
// them; there is no multi-tensor argument list in OpenCL C). Each element is read once, updated
// in the compute type (f32 for f16/bf16) and written once; the bias corrections are taken on the
// host in double from the launch's STEP.
#include "opencl_kernels.hpp"

#include <cmath>
#include <mutex>
#include <vector>

namespace bp::opencl {
namespace {

constexpr const char* kOptimSource = R"CLC(
__kernel void bp_adamw(__global T* p, __global const T* g, __global T* m, __global T* v,
                       long p_off, long g_off, long m_off, long v_off, C b1, C b2, C eps, C wd,
                       C decay, C step_size, C sqrt_c2, int decoupled, long n) {
  long i = get_global_id(0);
  if (i >= n) return;
  C pi = LD(p[p_off + i]), gi = LD(g[g_off + i]);
  if (decoupled)
    pi *= decay;
  else
    gi += wd * pi;
  C mi = b1 * LD(m[m_off + i]) + ((C)1 - b1) * gi;
  C vi = b2 * LD(v[v_off + i]) + ((C)1 - b2) * gi * gi;
  pi -= step_size * mi / (sqrt(vi) / sqrt_c2 + eps);
  p[p_off + i] = ST(pi);
  m[m_off + i] = ST(mi);
  v[v_off + i] = ST(vi);
}
)CLC";

// Launches the kernel with the scalars in the compute type CT (float, or double for f64).
template <class CT>
void launch_adamw(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in,
                  const bp_tensor_desc* out, int32_t n, const sdk::Attrs& attrs) {
  static const char* const in_roles[] = {"param", "grad", "exp_avg", "exp_avg_sq"};
  static const char* const out_roles[] = {"param (output)", "exp_avg (output)",
                                          "exp_avg_sq (output)"};
  const int64_t step = int_attr(k, attrs, BP_ATTR_ID_STEP, 0, 1);
  const double lr = attrs.f(BP_ATTR_ID_LR, 1e-3), b1 = attrs.f(BP_ATTR_ID_BETA1, 0.9);
  const double b2 = attrs.f(BP_ATTR_ID_BETA2, 0.999), eps = attrs.f(BP_ATTR_ID_EPS, 1e-8);
  const double wd = attrs.f(BP_ATTR_ID_WEIGHT_DECAY, 0.0);
  const cl_int decoupled = attrs.i(BP_ATTR_ID_DECOUPLED, 1) != 0 ? 1 : 0;
  const CT s[] = {static_cast<CT>(b1),
                  static_cast<CT>(b2),
                  static_cast<CT>(eps),
                  static_cast<CT>(wd),
                  static_cast<CT>(1.0 - lr * wd),
                  static_cast<CT>(lr / (1.0 - std::pow(b1, static_cast<double>(step)))),
                  static_cast<CT>(std::sqrt(1.0 - std::pow(b2, static_cast<double>(step))))};
  // Everything is checked before anything is enqueued.
  std::vector<int64_t> off(static_cast<size_t>(4 * n));
  for (int32_t t = 0; t < n; ++t) {
    const bp_tensor_desc& p = in[4 * t];
    for (int j = 0; j < 4; ++j) {
      off[static_cast<size_t>(4 * t + j)] =
          dense_offset(k, in[4 * t + j], k.dtype, p.rank, in_roles[j]);
      check_same_shape(k, in[4 * t + j], p, in_roles[j]);
    }
    for (int j = 0; j < 3; ++j) {
      const int64_t o = dense_offset(k, out[3 * t + j], k.dtype, p.rank, out_roles[j]);
      check_same_shape(k, out[3 * t + j], p, out_roles[j]);
      const bp_tensor_desc& same = in[4 * t + (j == 0 ? 0 : j + 1)];
      if (out[3 * t + j].buffer != same.buffer ||
          o != off[static_cast<size_t>(4 * t + j + (j > 0))])
        fail_launch(k, sdk::format("output %d is not the memory of its input (adamw updates in "
                                   "place)",
                                   static_cast<int>(3 * t + j)));
    }
  }
  std::lock_guard<std::mutex> lock(k.mutex);
  const size_t local = k.local_size[0];
  for (int32_t t = 0; t < n; ++t) {
    const int64_t elems = sdk::numel(in[4 * t]);
    if (elems == 0) continue;
    const size_t global = grid_size(static_cast<uint64_t>(elems), local);
    KernelArgs a(k.kernels[0]);
    a.mem(in[4 * t].buffer).mem(in[4 * t + 1].buffer).mem(in[4 * t + 2].buffer);
    a.mem(in[4 * t + 3].buffer);
    for (int j = 0; j < 4; ++j) a.value(static_cast<cl_long>(off[static_cast<size_t>(4 * t + j)]));
    for (CT v : s) a.value(v);
    a.value(decoupled).value(static_cast<cl_long>(elems));
    enqueue_kernel(lc, k, 0, 1, &global, &local);
  }
}

}  // namespace

std::string optim_source(int32_t dtype, bool fp64) {
  return kernel_prelude(dtype, fp64) + kOptimSource;
}

void create_optim_kernels(bp_kernel& k, cl_program program) {
  cl_kernel main = create_kernel(k, program, "bp_adamw");
  k.kernels = {main};
  k.local_size = {pick_local_size(main, *k.device, 256)};
}

void launch_optim(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in, int32_t num_in,
                  const bp_tensor_desc* out, int32_t num_out, const sdk::Attrs& attrs) {
  const int32_t n = num_in / 4;
  if (num_in < 4 || num_in % 4 != 0 || num_out != 3 * n)
    fail_launch(k, sdk::format("takes 4 N inputs (param, grad, exp_avg, exp_avg_sq) and 3 N "
                               "outputs, got %d and %d",
                               num_in, num_out));
  if (k.dtype == BP_DTYPE_F64)
    launch_adamw<double>(k, lc, in, out, n, attrs);
  else
    launch_adamw<float>(k, lc, in, out, n, attrs);
}

}  // namespace bp::opencl
