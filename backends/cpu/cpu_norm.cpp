// batch_norm (training and evaluation) and batch_norm_backward over x[N,C,L].
//
// Note [CPU batch norm]
//   Two passes. The per-channel pass reduces over N and L, one channel per work unit, in double
//   (every dtype): the mean, then the biased variance as the mean of squared deviations (two
//   passes over the channel, no cancellation), or for the backward the sums of dy and of
//   dy (x - mean). The elementwise pass then runs over the [N, C] rows of length L with
//   per-channel constants rounded once to the compute type: y = (x - mean) * (invstd weight) +
//   bias, dx = (dy - mean(dy) - (x - mean) * k) * (invstd weight) with k = invstd^2 mean(dy (x -
//   mean)). Subtracting the mean before scaling keeps y accurate when |mean| >> std. The
//   per-channel tensors are f32 for f16/bf16 inputs (Note [Op catalogue]); running statistics
//   are updated in place with the unbiased variance. These are our own loops: the op reads x
//   twice and writes y once, bound by memory, and oneDNN's batch normalisation has no f64.
#include "cpu_nn.hpp"

#include <cmath>
#include <vector>

namespace bp::cpu {
namespace {

// The per-channel storage type: f32 for f16/bf16, else the input's own.
template <class T>
using ParamT = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
constexpr bp_dtype param_dtype() {
  return std::is_same_v<T, double> ? BP_DTYPE_F64 : BP_DTYPE_F32;
}

struct NormShape {
  int64_t N, C, L;
};

NormShape norm_shape(const Launch& l, const bp_tensor_desc& x, int32_t dtype, const char* role) {
  check_dense(l, x, 3, dtype, role);
  return {x.shape[0], x.shape[1], x.shape[2]};
}

void check_channel(const Launch& l, const bp_tensor_desc& t, int64_t C, int32_t dtype,
                   const char* role) {
  check_dense(l, t, 1, dtype, role);
  check_shape(l, t, {C}, role);
}

// Per-channel pass: f(c) for every channel, spread over the workers by the work of a channel.
template <class F>
void for_channels(const NormShape& s, F&& f) {
  parallel_units(s.C, s.N * s.L, Cost::kReduction, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) f(c);
  });
}

template <class T>
double channel_mean(const T* x, const NormShape& s, int64_t c) {
  double sum = 0;
  for (int64_t n = 0; n < s.N; ++n) {
    const T* row = x + (n * s.C + c) * s.L;
    double part = 0;
    for (int64_t i = 0; i < s.L; ++i) part += static_cast<double>(DType<T>::load(row[i]));
    sum += part;
  }
  return sum / static_cast<double>(s.N * s.L);
}

template <class T>
double channel_var(const T* x, const NormShape& s, int64_t c, double mean) {
  double sum = 0;
  for (int64_t n = 0; n < s.N; ++n) {
    const T* row = x + (n * s.C + c) * s.L;
    double part = 0;
    for (int64_t i = 0; i < s.L; ++i) {
      const double d = static_cast<double>(DType<T>::load(row[i])) - mean;
      part += d * d;
    }
    sum += part;
  }
  return sum / static_cast<double>(s.N * s.L);
}

template <class T>
void batch_norm_kernel(const Launch& l) {
  using C = compute_t<T>;
  using PT = ParamT<T>;
  const bool training = l.attrs.i(BP_ATTR_ID_TRAINING, 0) != 0;
  const double eps = l.attrs.f(BP_ATTR_ID_EPS, 1e-5);
  const double momentum = l.attrs.f(BP_ATTR_ID_MOMENTUM, 0.1);
  if (l.num_inputs != 5 || (l.num_outputs != 3 && (training || l.num_outputs != 1)))
    launch_error(l, bp::sdk::format("expects 5 inputs (x, weight, bias, running_mean, "
                                    "running_var) and 3 outputs (y, save_mean, save_invstd; "
                                    "only y in evaluation), got %d and %d",
                                    l.num_inputs, l.num_outputs));
  const bp_tensor_desc& x = l.inputs[0];
  const bp_tensor_desc& y = l.outputs[0];
  const NormShape s = norm_shape(l, x, DType<T>::id, "input");
  norm_shape(l, y, DType<T>::id, "output");
  check_same_shape(l, x, y, "input");
  const char* roles[] = {"input", "weight", "bias", "running_mean", "running_var"};
  for (int i = 1; i < 5; ++i) check_channel(l, l.inputs[i], s.C, param_dtype<T>(), roles[i]);
  const bool save = l.num_outputs == 3;
  if (save) {
    check_channel(l, l.outputs[1], s.C, param_dtype<T>(), "save_mean");
    check_channel(l, l.outputs[2], s.C, param_dtype<T>(), "save_invstd");
  }
  const int64_t n = s.N * s.L;
  if (training && n < 2)
    launch_error(l, bp::sdk::format("training needs more than one value per channel (input %s)",
                                    describe(x).c_str()));
  if (s.C == 0) return;
  const T* px = data<T>(x);
  T* py = data<T>(y);
  const PT* w = data<PT>(l.inputs[1]);
  const PT* bias = data<PT>(l.inputs[2]);
  PT* rmean = data<PT>(l.inputs[3]);
  PT* rvar = data<PT>(l.inputs[4]);
  std::vector<C> mean(static_cast<size_t>(s.C)), scale(static_cast<size_t>(s.C)),
      shift(static_cast<size_t>(s.C));
  for_channels(s, [&](int64_t c) {
    double m, invstd;
    if (training) {
      m = channel_mean(px, s, c);
      const double var = channel_var(px, s, c, m);
      invstd = static_cast<double>(static_cast<PT>(1.0 / std::sqrt(var + eps)));
      if (save) {
        data<PT>(l.outputs[1])[c] = static_cast<PT>(m);
        data<PT>(l.outputs[2])[c] = static_cast<PT>(invstd);
      }
      const double unbiased = var * static_cast<double>(n) / static_cast<double>(n - 1);
      rmean[c] = static_cast<PT>((1.0 - momentum) * rmean[c] + momentum * m);
      rvar[c] = static_cast<PT>((1.0 - momentum) * rvar[c] + momentum * unbiased);
    } else {
      m = static_cast<double>(rmean[c]);
      invstd = 1.0 / std::sqrt(static_cast<double>(rvar[c]) + eps);
    }
    mean[static_cast<size_t>(c)] = static_cast<C>(m);
    scale[static_cast<size_t>(c)] = static_cast<C>(invstd * static_cast<double>(w[c]));
    shift[static_cast<size_t>(c)] = static_cast<C>(bias[c]);
  });
  if (s.L == 0) return;
  parallel_units(s.N * s.C, s.L, Cost::kCheap, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const size_t c = static_cast<size_t>(r % s.C);
      const C m = mean[c], a = scale[c], sh = shift[c];
      const T* xr = px + r * s.L;
      T* yr = py + r * s.L;
      for (int64_t i = 0; i < s.L; ++i)
        yr[i] = DType<T>::store((DType<T>::load(xr[i]) - m) * a + sh);
    }
  });
}

template <class T>
void batch_norm_backward_kernel(const Launch& l) {
  using C = compute_t<T>;
  using PT = ParamT<T>;
  check_arity(l, 5, 3);
  const bp_tensor_desc &dy = l.inputs[0], &x = l.inputs[1], &dx = l.outputs[0];
  const NormShape s = norm_shape(l, x, DType<T>::id, "x");
  norm_shape(l, dy, DType<T>::id, "dy");
  norm_shape(l, dx, DType<T>::id, "dx");
  check_same_shape(l, dy, x, "dy");
  check_same_shape(l, dx, x, "dx");
  const char* roles[] = {"dy", "x", "weight", "save_mean", "save_invstd"};
  for (int i = 2; i < 5; ++i) check_channel(l, l.inputs[i], s.C, param_dtype<T>(), roles[i]);
  check_channel(l, l.outputs[1], s.C, param_dtype<T>(), "dweight");
  check_channel(l, l.outputs[2], s.C, param_dtype<T>(), "dbias");
  if (s.C == 0) return;
  const T* pdy = data<T>(dy);
  const T* px = data<T>(x);
  T* pdx = data<T>(dx);
  const PT* w = data<PT>(l.inputs[2]);
  const PT* smean = data<PT>(l.inputs[3]);
  const PT* sinv = data<PT>(l.inputs[4]);
  PT* dw = data<PT>(l.outputs[1]);
  PT* db = data<PT>(l.outputs[2]);
  const double n = static_cast<double>(s.N * s.L);
  std::vector<C> mean(static_cast<size_t>(s.C)), mdy(static_cast<size_t>(s.C)),
      k(static_cast<size_t>(s.C)), scale(static_cast<size_t>(s.C));
  for_channels(s, [&](int64_t c) {
    const double m = static_cast<double>(smean[c]), inv = static_cast<double>(sinv[c]);
    double sdy = 0, sdyx = 0;
    for (int64_t b = 0; b < s.N; ++b) {
      const T* g = pdy + (b * s.C + c) * s.L;
      const T* xr = px + (b * s.C + c) * s.L;
      double p1 = 0, p2 = 0;
      for (int64_t i = 0; i < s.L; ++i) {
        const double d = static_cast<double>(DType<T>::load(g[i]));
        p1 += d;
        p2 += d * (static_cast<double>(DType<T>::load(xr[i])) - m);
      }
      sdy += p1;
      sdyx += p2;
    }
    db[c] = static_cast<PT>(sdy);
    dw[c] = static_cast<PT>(sdyx * inv);
    const size_t ci = static_cast<size_t>(c);
    mean[ci] = static_cast<C>(m);
    mdy[ci] = static_cast<C>(n > 0 ? sdy / n : 0.0);
    k[ci] = static_cast<C>(n > 0 ? inv * inv * sdyx / n : 0.0);
    scale[ci] = static_cast<C>(inv * static_cast<double>(w[c]));
  });
  if (s.L == 0) return;
  parallel_units(s.N * s.C, s.L, Cost::kCheap, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const size_t c = static_cast<size_t>(r % s.C);
      const C m = mean[c], md = mdy[c], kk = k[c], a = scale[c];
      const T* g = pdy + r * s.L;
      const T* xr = px + r * s.L;
      T* o = pdx + r * s.L;
      for (int64_t i = 0; i < s.L; ++i)
        o[i] = DType<T>::store((DType<T>::load(g[i]) - md - (DType<T>::load(xr[i]) - m) * kk) * a);
    }
  });
}

}  // namespace

KernelFn norm_family(Op op, bp_dtype dtype) {
  return visit_dtype(dtype, [&]<class T>() -> KernelFn {
    if constexpr (is_floating_v<T>) {
      if (op == Op::kBatchNorm) return &batch_norm_kernel<T>;
      if (op == Op::kBatchNormBackward) return &batch_norm_backward_kernel<T>;
    }
    return nullptr;
  });
}

}  // namespace bp::cpu
