// The fused classification loss (Note [Op catalogue], minor 8; Note [Fused cross entropy] in
// plugin_abi.h): cross_entropy and cross_entropy_backward over logits x[N, C].
//
// Rows run in parallel as softmax's (Note [CPU softmax tiles] with whole rows): a work unit is
// one row, loaded into a scratch line of the compute type (float for f16, bf16 and f32, double
// for f64) so the exponentials run as one SLEEF vector call (Note [CPU vector math]). The
// forward subtracts the row's maximum before exp and sums the exponentials in double (finite
// for any finite row); the stats (loss, lse, dloss) are of the compute type. Every target is
// checked before anything is written.
#include "cpu_nn.hpp"
#include "cpu_vmath.hpp"

#include <cmath>
#include <vector>

namespace bp::cpu {
namespace {

struct LossAttrs {
  int64_t ignore;
  double smoothing;
};

// Checks the tensors (x[N, C], target[N] I64, then `stats` tensors [N] and `rows` tensors
// [N, C] among the outputs) and every target; returns the attributes.
template <class T>
LossAttrs check_loss(const Launch& l, bool backward) {
  using C = compute_t<T>;
  check_arity(l, backward ? 4 : 2, backward ? 1 : 2);
  const bp_tensor_desc &x = l.inputs[0], &target = l.inputs[1];
  check_dense(l, x, 2, DType<T>::id, "logits");
  check_dense(l, target, 1, BP_DTYPE_I64, "target");
  const int64_t N = x.shape[0], K = x.shape[1];
  check_shape(l, target, {N}, "target");
  if (K < 1) launch_error(l, bp::sdk::format("logits %s have no class", describe(x).c_str()));
  const bp_dtype stats = DType<C>::id;
  if (backward) {
    check_dense(l, l.inputs[2], 1, stats, "lse");
    check_shape(l, l.inputs[2], {N}, "lse");
    check_dense(l, l.inputs[3], 1, stats, "dloss");
    check_shape(l, l.inputs[3], {N}, "dloss");
    check_dense(l, l.outputs[0], 2, DType<T>::id, "dx");
    check_shape(l, l.outputs[0], {N, K}, "dx");
  } else {
    check_dense(l, l.outputs[0], 1, stats, "loss");
    check_shape(l, l.outputs[0], {N}, "loss");
    check_dense(l, l.outputs[1], 1, stats, "lse");
    check_shape(l, l.outputs[1], {N}, "lse");
  }
  const LossAttrs a{l.attrs.i(BP_ATTR_ID_IGNORE_INDEX, -100),
                    l.attrs.f(BP_ATTR_ID_LABEL_SMOOTHING, 0.0)};
  if (!(a.smoothing >= 0 && a.smoothing <= 1))
    launch_error(l, bp::sdk::format("label_smoothing %g is outside [0, 1]", a.smoothing));
  const int64_t* pt = N ? data<int64_t>(target) : nullptr;
  for (int64_t n = 0; n < N; ++n)
    if (pt[n] != a.ignore && (pt[n] < 0 || pt[n] >= K))
      launch_error(l, bp::sdk::format("target %lld of row %lld is outside [0, %lld) (the number "
                                      "of classes) and is not the ignore index %lld",
                                      static_cast<long long>(pt[n]), static_cast<long long>(n),
                                      static_cast<long long>(K), static_cast<long long>(a.ignore)));
  return a;
}

template <class T>
void cross_entropy_kernel(const Launch& l) {
  using C = compute_t<T>;
  const LossAttrs a = check_loss<T>(l, false);
  const bp_tensor_desc& x = l.inputs[0];
  const int64_t N = x.shape[0], K = x.shape[1];
  if (N == 0) return;
  const T* px = data<T>(x);
  const int64_t* pt = data<int64_t>(l.inputs[1]);
  C* loss = data<C>(l.outputs[0]);
  C* lse = data<C>(l.outputs[1]);
  const double e = a.smoothing;
  parallel_units(N, K, Cost::kTranscendental, [&](int64_t b, int64_t end) {
    std::vector<C> line(static_cast<size_t>(K));
    for (int64_t n = b; n < end; ++n) {
      const T* row = px + n * K;
      C* t = line.data();
      for (int64_t j = 0; j < K; ++j) t[j] = DType<T>::load(row[j]);
      C m = t[0];
      for (int64_t j = 1; j < K; ++j)
        if (t[j] > m || std::isnan(t[j])) m = std::isnan(m) ? m : t[j];
      // Without smoothing the row's sum is no term of the loss (a -inf logit leaves it finite).
      const double sum_x = e > 0 ? sum_of(t, K) : 0.0;
      const C shift = std::isinf(m) ? C(0) : m;  // an infinite maximum: torch's logsumexp
      for (int64_t j = 0; j < K; ++j) t[j] -= shift;
      vmath::unary(vmath::kExp, t, t, K);
      const double r = static_cast<double>(shift) + std::log(sum_of(t, K));
      lse[n] = static_cast<C>(r);
      if (pt[n] == a.ignore) {
        loss[n] = C(0);
        continue;
      }
      const double xt = static_cast<double>(DType<T>::load(row[pt[n]]));
      loss[n] = static_cast<C>(r - (1 - e) * xt - (e > 0 ? e / static_cast<double>(K) * sum_x : 0));
    }
  });
}

template <class T>
void cross_entropy_backward_kernel(const Launch& l) {
  using C = compute_t<T>;
  const LossAttrs a = check_loss<T>(l, true);
  const bp_tensor_desc& x = l.inputs[0];
  const int64_t N = x.shape[0], K = x.shape[1];
  if (N == 0) return;
  const T* px = data<T>(x);
  const int64_t* pt = data<int64_t>(l.inputs[1]);
  const C* lse = data<C>(l.inputs[2]);
  const C* dloss = data<C>(l.inputs[3]);
  T* pdx = data<T>(l.outputs[0]);
  const C hot = static_cast<C>(1 - a.smoothing);
  const C uniform = static_cast<C>(a.smoothing / static_cast<double>(K));
  parallel_units(N, K, Cost::kTranscendental, [&](int64_t b, int64_t end) {
    std::vector<C> line(static_cast<size_t>(K));
    for (int64_t n = b; n < end; ++n) {
      const T* row = px + n * K;
      T* out = pdx + n * K;
      if (pt[n] == a.ignore) {
        for (int64_t j = 0; j < K; ++j) out[j] = DType<T>::store(C(0));
        continue;
      }
      C* t = line.data();
      const C r = lse[n], g = dloss[n];
      for (int64_t j = 0; j < K; ++j) t[j] = DType<T>::load(row[j]) - r;
      vmath::unary(vmath::kExp, t, t, K);
      for (int64_t j = 0; j < K; ++j) out[j] = DType<T>::store(g * (t[j] - uniform));
      out[pt[n]] = DType<T>::store(g * (t[pt[n]] - hot - uniform));
    }
  });
}

}  // namespace

KernelFn loss_family(Op op, bp_dtype dtype) {
  return visit_dtype(dtype, [&]<class T>() -> KernelFn {
    if constexpr (is_floating_v<T>) {
      if (op == Op::kCrossEntropy) return &cross_entropy_kernel<T>;
      if (op == Op::kCrossEntropyBackward) return &cross_entropy_backward_kernel<T>;
    }
    return nullptr;
  });
}

}  // namespace bp::cpu
