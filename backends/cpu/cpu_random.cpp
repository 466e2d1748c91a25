// uniform and normal: Philox-4x32-10 streams mapped to values exactly as Note [Philox stream]
// in backplane/philox.h prescribes, so every device produces the same tensor for one seed.
// One Philox call yields four uniform words (or one Box-Muller pair), so the loops walk the
// output in groups of four (or two) global indices and compute each counter once.
#include "cpu_kernels.hpp"
#include "cpu_strided.hpp"
#include "cpu_types.hpp"

#include <backplane/abi/philox.h>

#include <cmath>
#include <type_traits>

namespace bp::cpu {
namespace {

constexpr float kTwoPi = 6.283185307179586f;

// Writes value(i) for output elements [b, e) of a (possibly strided) output, in row-major order.
template <class T, class Value>
void write_range(const Layout<1>& lay, T* out, int64_t b, int64_t e, const Value& value) {
  const int64_t s = lay.inner(0);
  int64_t i = b;
  for_each_row(lay, b, e, [&](const int64_t* off, int64_t n) {
    T* o = out + off[0];
    for (int64_t j = 0; j < n; ++j, ++i) o[j * s] = value(i);
  });
}

// Uniform in [low, high) from u in [0, 1): in float for f32/f16/bf16, in double for f64.
template <class T>
compute_t<T> scale_uniform(float u, double low, double high) {
  using C = compute_t<T>;
  const C lo = static_cast<C>(low), hi = static_cast<C>(high);
  return lo + (hi - lo) * static_cast<C>(u);
}

template <class T>
void uniform_kernel(const Launch& l) {
  check_arity(l, 0, 1);
  const bp_tensor_desc& out = l.outputs[0];
  check_dtype(l, out, DType<T>::id, "output");
  const uint64_t seed = static_cast<uint64_t>(l.attrs.i(BP_ATTR_ID_SEED, 0));
  const uint64_t offset = static_cast<uint64_t>(l.attrs.i(BP_ATTR_ID_OFFSET, 0));
  const double low = l.attrs.f(BP_ATTR_ID_LOW, 0.0), high = l.attrs.f(BP_ATTR_ID_HIGH, 1.0);
  const int64_t n = numel(out);
  if (n == 0) return;
  T* po = data<T>(out);
  const bp_tensor_desc* ts[1] = {&out};
  const Layout<1> lay = make_layout<1>(ts);
  parallel_for_range(n, Cost::kTranscendental, [&](int64_t b, int64_t e) {
    // Cache the four words of the current counter g / 4.
    uint64_t cached = ~uint64_t{0};
    bp_philox_words w{};
    auto value = [&](int64_t i) {
      const uint64_t g = offset + static_cast<uint64_t>(i);
      if ((g >> 2) != cached) {  // g >> 2 < 2^62: never the initial ~0
        cached = g >> 2;
        w = bp_philox4x32_10(cached, seed);
      }
      const float u = static_cast<float>(w.w[g & 3u] >> 8) * (1.0f / 16777216.0f);
      return DType<T>::store(scale_uniform<T>(u, low, high));
    };
    if (lay.rank == 1 && lay.inner(0) == 1) {
      T* o = po;
      for (int64_t i = b; i < e; ++i) o[i] = value(i);
    } else {
      write_range(lay, po, b, e, value);
    }
  });
}

template <class T>
void normal_kernel(const Launch& l) {
  using C = compute_t<T>;
  check_arity(l, 0, 1);
  const bp_tensor_desc& out = l.outputs[0];
  check_dtype(l, out, DType<T>::id, "output");
  const uint64_t seed = static_cast<uint64_t>(l.attrs.i(BP_ATTR_ID_SEED, 0));
  const uint64_t offset = static_cast<uint64_t>(l.attrs.i(BP_ATTR_ID_OFFSET, 0));
  const C mean = static_cast<C>(l.attrs.f(BP_ATTR_ID_MEAN, 0.0));
  const C stddev = static_cast<C>(l.attrs.f(BP_ATTR_ID_STD, 1.0));
  const int64_t n = numel(out);
  if (n == 0) return;
  T* po = data<T>(out);
  const bp_tensor_desc* ts[1] = {&out};
  const Layout<1> lay = make_layout<1>(ts);
  parallel_for_range(n, Cost::kTranscendental, [&](int64_t b, int64_t e) {
    // Cache the Box-Muller pair (r cos, r sin) of the current counter g / 2.
    uint64_t cached = ~uint64_t{0};
    C z[2] = {C(0), C(0)};
    auto value = [&](int64_t i) {
      const uint64_t g = offset + static_cast<uint64_t>(i);
      if ((g >> 1) != cached) {  // g >> 1 < 2^63: never the initial ~0
        cached = g >> 1;
        float u1, u2;
        bp_philox_normal_uniforms(seed, g, &u1, &u2);
        const C r = std::sqrt(C(-2) * std::log(static_cast<C>(u1)));
        const C theta = std::is_same_v<C, float> ? static_cast<C>(kTwoPi * u2)
                                                 : C(6.283185307179586) * static_cast<C>(u2);
        z[0] = r * std::cos(theta);
        z[1] = r * std::sin(theta);
      }
      return DType<T>::store(mean + stddev * z[g & 1u]);
    };
    if (lay.rank == 1 && lay.inner(0) == 1) {
      for (int64_t i = b; i < e; ++i) po[i] = value(i);
    } else {
      write_range(lay, po, b, e, value);
    }
  });
}

}  // namespace

KernelFn random_family(Op op, bp_dtype dtype) {
  return visit_dtype(dtype, [&]<class T>() -> KernelFn {
    if constexpr (is_floating_v<T>) {
      if (op == Op::kUniform) return &uniform_kernel<T>;
      if (op == Op::kNormal) return &normal_kernel<T>;
    }
    return nullptr;
  });
}

}  // namespace bp::cpu
