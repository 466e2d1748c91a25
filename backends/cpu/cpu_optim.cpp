// The fused optimiser update (Note [Op catalogue], minor 7; Note [Fused Adam] in plugin_abi.h):
// adamw over N parameters in one launch. The parameters' elements are numbered end to end and
// the whole range is split across oneTBB workers, so many small tensors cost one parallel loop
// rather than one each.
#include "cpu_nn.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace bp::cpu {
namespace {

template <class T>
void adamw_kernel(const Launch& l) {
  using C = compute_t<T>;
  const int32_t n = l.num_inputs / 4;
  if (l.num_inputs < 4 || l.num_inputs % 4 != 0 || l.num_outputs != 3 * n)
    launch_error(l, bp::sdk::format("takes 4 N inputs (param, grad, exp_avg, exp_avg_sq) and 3 N "
                                    "outputs, got %d and %d",
                                    l.num_inputs, l.num_outputs));
  const int64_t step = l.attrs.i(BP_ATTR_ID_STEP, 0);
  if (step < 1)
    launch_error(l, bp::sdk::format("step must be >= 1, got %lld", static_cast<long long>(step)));
  const double lr = l.attrs.f(BP_ATTR_ID_LR, 1e-3), b1 = l.attrs.f(BP_ATTR_ID_BETA1, 0.9);
  const double b2 = l.attrs.f(BP_ATTR_ID_BETA2, 0.999), eps = l.attrs.f(BP_ATTR_ID_EPS, 1e-8);
  const double wd = l.attrs.f(BP_ATTR_ID_WEIGHT_DECAY, 0.0);
  const bool decoupled = l.attrs.i(BP_ATTR_ID_DECOUPLED, 1) != 0;
  static const char* const in_roles[] = {"param", "grad", "exp_avg", "exp_avg_sq"};
  static const char* const out_roles[] = {"param (output)", "exp_avg (output)",
                                          "exp_avg_sq (output)"};
  std::vector<int64_t> end(static_cast<size_t>(n));  // end[k]: elements of parameters 0..k
  int64_t total = 0;
  for (int32_t k = 0; k < n; ++k) {
    const bp_tensor_desc& p = l.inputs[4 * k];
    for (int j = 0; j < 4; ++j) {
      check_dense(l, l.inputs[4 * k + j], p.rank, DType<T>::id, in_roles[j]);
      check_same_shape(l, l.inputs[4 * k + j], p, in_roles[j]);
    }
    for (int j = 0; j < 3; ++j) {
      check_dense(l, l.outputs[3 * k + j], p.rank, DType<T>::id, out_roles[j]);
      check_same_shape(l, l.outputs[3 * k + j], p, out_roles[j]);
    }
    end[static_cast<size_t>(k)] = total += numel(p);
  }
  const C c_b1 = static_cast<C>(b1), c_b2 = static_cast<C>(b2);
  const C c_eps = static_cast<C>(eps), c_wd = static_cast<C>(wd);
  const C decay = static_cast<C>(1.0 - lr * wd);
  const C step_size = static_cast<C>(lr / (1.0 - std::pow(b1, static_cast<double>(step))));
  const C sqrt_c2 = static_cast<C>(std::sqrt(1.0 - std::pow(b2, static_cast<double>(step))));
  parallel_for_range(total, Cost::kTranscendental, [&](int64_t b, int64_t e) {
    auto k = static_cast<size_t>(std::upper_bound(end.begin(), end.end(), b) - end.begin());
    while (b < e) {
      const int64_t first = k ? end[k - 1] : 0, stop = std::min(e, end[k]);
      const bp_tensor_desc* in = l.inputs + 4 * k;
      const bp_tensor_desc* out = l.outputs + 3 * k;
      const T *pp = data<T>(in[0]), *pg = data<T>(in[1]);
      const T *pm = data<T>(in[2]), *pv = data<T>(in[3]);
      T *op = data<T>(out[0]), *om = data<T>(out[1]), *ov = data<T>(out[2]);
      for (int64_t i = b - first; i < stop - first; ++i) {
        C p = DType<T>::load(pp[i]), g = DType<T>::load(pg[i]);
        if (decoupled)
          p *= decay;
        else
          g += c_wd * p;
        const C m = c_b1 * DType<T>::load(pm[i]) + (C(1) - c_b1) * g;
        const C v = c_b2 * DType<T>::load(pv[i]) + (C(1) - c_b2) * g * g;
        p -= step_size * m / (std::sqrt(v) / sqrt_c2 + c_eps);
        op[i] = DType<T>::store(p);
        om[i] = DType<T>::store(m);
        ov[i] = DType<T>::store(v);
      }
      b = stop;
      ++k;
    }
  });
}

}  // namespace

KernelFn optim_family(Op op, bp_dtype dtype) {
  return visit_dtype(dtype, [&]<class T>() -> KernelFn {
    if constexpr (is_floating_v<T>)
      if (op == Op::kAdamw) return &adamw_kernel<T>;
    return nullptr;
  });
}

}  // namespace bp::cpu
