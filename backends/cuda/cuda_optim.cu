// The fused optimiser update (Note [Op catalogue], minor 7; Note [Fused Adam] in plugin_abi.h):
// adamw over N parameters in a few launches (Note [CUDA multi-tensor adamw]).
//
// Note [CUDA multi-tensor adamw]
//   As PyTorch's multi_tensor_apply: the addresses and sizes of up to kMaxTensors parameters
//   (param, grad, exp_avg, exp_avg_sq each) travel by value in the kernel's parameters (a
//   TensorList of about 2 KiB, under the 4 KiB every architecture takes), so one launch updates
//   them all and a launch captured in a CUDA graph keeps its list. Every block walks the list
//   and takes a grid-stride share of each tensor: a large tensor spreads over the whole grid and
//   a small one costs a few idle iterations. Each element is read once (p, g, m, v), updated in
//   the compute type (f32 for f16/bf16) and written once (p, m, v). The bias corrections are
//   taken on the host in double from the launch's STEP.
#include "cuda_common.hpp"
#include "cuda_kernels.hpp"
#include "cuda_types.cuh"

#include <algorithm>
#include <cmath>

namespace bp::cuda {
namespace {

constexpr int kMaxTensors = 48;
constexpr int kOptimThreads = 256;

template <class S>
struct TensorList {
  S* p[kMaxTensors];
  const S* g[kMaxTensors];
  S* m[kMaxTensors];
  S* v[kMaxTensors];
  int64_t n[kMaxTensors];
  int count;
};
static_assert(sizeof(TensorList<double>) < 4000, "TensorList must fit the kernel parameters");

// The update's scalars in the compute type C.
template <class C>
struct AdamScalars {
  C b1, b2, eps, wd, decay, step_size, sqrt_c2;
  bool decoupled;
};

template <class S, class C>
__global__ void __launch_bounds__(kOptimThreads)
    adamw_kernel(TensorList<S> list, AdamScalars<C> k) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kOptimThreads;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kOptimThreads + threadIdx.x;
  for (int t = 0; t < list.count; ++t) {
    S* __restrict__ pp = list.p[t];
    const S* __restrict__ pg = list.g[t];
    S* __restrict__ pm = list.m[t];
    S* __restrict__ pv = list.v[t];
    const int64_t n = list.n[t];
    for (int64_t i = first; i < n; i += stride) {
      C p = load(pp[i]), g = load(pg[i]);
      if (k.decoupled)
        p *= k.decay;
      else
        g += k.wd * p;
      const C m = k.b1 * load(pm[i]) + (C(1) - k.b1) * g;
      const C v = k.b2 * load(pv[i]) + (C(1) - k.b2) * g * g;
      p -= k.step_size * m / (m_sqrt(v) / k.sqrt_c2 + k.eps);
      pp[i] = store<S>(p);
      pm[i] = store<S>(m);
      pv[i] = store<S>(v);
    }
  }
}

void check_dense(const bp_tensor_desc& t, int32_t dtype, const bp_tensor_desc& ref,
                 const char* role) {
  check_desc(t, dtype, role);
  check_same_shape(t, ref, role);
  int64_t s = 1;
  for (int32_t d = t.rank - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != s) [[unlikely]]
      invalid(bp::sdk::format("%s must be dense (row-major contiguous)", role));
    s *= t.shape[d];
  }
}

template <int D>
void adamw_launch(const LaunchArgs& a) {
  using S = storage_t<D>;
  using C = compute_t<D>;
  const int32_t n = a.nin / 4;
  if (a.nin < 4 || a.nin % 4 != 0 || a.nout != 3 * n) [[unlikely]]
    invalid(
        bp::sdk::format("takes 4 N inputs (param, grad, exp_avg, exp_avg_sq) and 3 N "
                        "outputs, got %d and %d",
                        a.nin, a.nout));
  const int64_t step = a.attrs->i(BP_ATTR_ID_STEP, 0);
  if (step < 1) [[unlikely]]
    invalid(bp::sdk::format("step must be >= 1, got %lld", static_cast<long long>(step)));
  static const char* const in_roles[] = {"param", "grad", "exp_avg", "exp_avg_sq"};
  static const char* const out_roles[] = {"param (output)", "exp_avg (output)",
                                          "exp_avg_sq (output)"};
  for (int32_t k = 0; k < n; ++k) {
    for (int j = 0; j < 4; ++j) check_dense(a.in[4 * k + j], D, a.in[4 * k], in_roles[j]);
    for (int j = 0; j < 3; ++j) check_dense(a.out[3 * k + j], D, a.in[4 * k], out_roles[j]);
  }
  const double lr = a.attrs->f(BP_ATTR_ID_LR, 1e-3), b1 = a.attrs->f(BP_ATTR_ID_BETA1, 0.9);
  const double b2 = a.attrs->f(BP_ATTR_ID_BETA2, 0.999), eps = a.attrs->f(BP_ATTR_ID_EPS, 1e-8);
  const double wd = a.attrs->f(BP_ATTR_ID_WEIGHT_DECAY, 0.0);
  AdamScalars<C> k;
  k.b1 = static_cast<C>(b1);
  k.b2 = static_cast<C>(b2);
  k.eps = static_cast<C>(eps);
  k.wd = static_cast<C>(wd);
  k.decay = static_cast<C>(1.0 - lr * wd);
  k.step_size = static_cast<C>(lr / (1.0 - std::pow(b1, static_cast<double>(step))));
  k.sqrt_c2 = static_cast<C>(std::sqrt(1.0 - std::pow(b2, static_cast<double>(step))));
  k.decoupled = a.attrs->i(BP_ATTR_ID_DECOUPLED, 1) != 0;
  TensorList<S> list{};
  int64_t largest = 0;
  auto flush = [&] {
    if (list.count == 0) return;
    const int64_t blocks = std::min<int64_t>((largest + kOptimThreads - 1) / kOptimThreads,
                                             static_cast<int64_t>(a.sm_count) * 8);
    adamw_kernel<S, C>
        <<<static_cast<unsigned>(std::max<int64_t>(blocks, 1)), kOptimThreads, 0, a.stream>>>(list,
                                                                                              k);
    BP_CUDA_CHECK(cudaGetLastError());
    list.count = 0;
    largest = 0;
  };
  for (int32_t t = 0; t < n; ++t) {
    const int64_t elems = numel(a.in[4 * t]);
    if (elems == 0) continue;
    const int c = list.count++;
    list.p[c] = data_ptr<S>(a.out[3 * t]);
    list.g[c] = data_ptr<const S>(a.in[4 * t + 1]);
    list.m[c] = data_ptr<S>(a.out[3 * t + 1]);
    list.v[c] = data_ptr<S>(a.out[3 * t + 2]);
    list.n[c] = elems;
    largest = std::max(largest, elems);
    if (list.count == kMaxTensors) flush();
  }
  flush();
}

}  // namespace

LaunchFn optim_fn(Op op, int32_t dtype) {
  if (op != Op::kAdamw) return nullptr;
  switch (dtype) {
    case BP_DTYPE_F32:
      return &adamw_launch<BP_DTYPE_F32>;
    case BP_DTYPE_F64:
      return &adamw_launch<BP_DTYPE_F64>;
    case BP_DTYPE_F16:
      return &adamw_launch<BP_DTYPE_F16>;
    case BP_DTYPE_BF16:
      return &adamw_launch<BP_DTYPE_BF16>;
    default:
      return nullptr;
  }
}

}  // namespace bp::cuda
