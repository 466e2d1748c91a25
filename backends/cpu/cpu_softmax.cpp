// softmax, log_softmax and their backward ops along one axis of a dense tensor.
//
// Note [CPU softmax tiles]
//   The tensor is [outer, length, inner] around the axis. A work unit is one outer row and a
//   block of `nj` inner columns (nj = inner when the axis is last, i.e. inner = 1: whole rows),
//   loaded into a scratch tile of length x nj values of the compute type, so the exponentials
//   run as one SLEEF vector call over contiguous memory (Note [CPU vector math]) whatever the
//   axis. The maximum is subtracted before exp (stable: finite for any finite input); sums of
//   exponentials and of dy * y accumulate in double. A NaN anywhere on a line makes its maximum
//   NaN and so the whole line NaN, as in PyTorch.
#include "cpu_nn.hpp"
#include "cpu_vmath.hpp"

#include <cmath>
#include <vector>

namespace bp::cpu {
namespace {

enum class Kind { kSoftmax, kLogSoftmax, kSoftmaxBackward, kLogSoftmaxBackward };

// Tile width: as many inner columns as keep the tile near 16K values (at least one).
int64_t tile_width(const AxisView& v) {
  return std::max<int64_t>(1, std::min<int64_t>(v.inner, 16384 / std::max<int64_t>(v.length, 1)));
}

template <class C>
void vexp(C* p, int64_t n) {
  vmath::unary(vmath::kExp, p, p, n);
}

template <class T, Kind kKind>
void softmax_kernel(const Launch& l) {
  using C = compute_t<T>;
  constexpr bool kBackward = kKind == Kind::kSoftmaxBackward || kKind == Kind::kLogSoftmaxBackward;
  check_arity(l, kBackward ? 2 : 1, 1);
  const bp_tensor_desc& x = l.inputs[0];
  const bp_tensor_desc& out = l.outputs[0];
  const int rank = x.rank;
  const int axis = read_axis(l, rank);
  check_dense(l, x, rank, DType<T>::id, kBackward ? "y" : "input");
  check_dense(l, out, rank, DType<T>::id, "output");
  check_same_shape(l, x, out, kBackward ? "y" : "input");
  if (kBackward) {
    check_dense(l, l.inputs[1], rank, DType<T>::id, "dy");
    check_same_shape(l, l.inputs[1], out, "dy");
  }
  const AxisView v = rank ? axis_view(x, axis) : AxisView{};
  if (v.outer * v.length * v.inner == 0) return;
  const T* px = data<T>(x);
  const T* pd = kBackward ? data<T>(l.inputs[1]) : nullptr;
  T* po = data<T>(out);
  const int64_t nj = tile_width(v);
  const int64_t blocks = (v.inner + nj - 1) / nj;
  parallel_units(v.outer * blocks, v.length * nj, Cost::kTranscendental, [&](int64_t b, int64_t e) {
    std::vector<C> tile(static_cast<size_t>(v.length * nj));
    std::vector<C> tile2(kBackward || kKind == Kind::kLogSoftmax ? tile.size() : 0);
    std::vector<double> acc(static_cast<size_t>(nj));
    std::vector<C> m(static_cast<size_t>(nj));
    for (int64_t u = b; u < e; ++u) {
      const int64_t o = u / blocks, j0 = (u % blocks) * nj;
      const int64_t w = std::min(nj, v.inner - j0);
      const int64_t base = o * v.length * v.inner + j0;
      C* t = tile.data();
      for (int64_t k = 0; k < v.length; ++k)
        for (int64_t j = 0; j < w; ++j) t[k * w + j] = DType<T>::load(px[base + k * v.inner + j]);
      std::fill(acc.begin(), acc.begin() + w, 0.0);
      if constexpr (!kBackward) {
        for (int64_t j = 0; j < w; ++j) m[j] = t[j];
        for (int64_t k = 1; k < v.length; ++k)
          for (int64_t j = 0; j < w; ++j) {
            const C c = t[k * w + j];
            if (c > m[j] || std::isnan(c)) m[j] = std::isnan(m[j]) ? m[j] : c;
          }
        if constexpr (kKind == Kind::kLogSoftmax) {
          C* ex = tile2.data();  // x - m stays in t for the result; exp goes to ex
          for (int64_t k = 0; k < v.length; ++k)
            for (int64_t j = 0; j < w; ++j) {
              t[k * w + j] -= m[j];
              ex[k * w + j] = t[k * w + j];
            }
          vexp(ex, v.length * w);
          for (int64_t k = 0; k < v.length; ++k)
            for (int64_t j = 0; j < w; ++j) acc[j] += ex[k * w + j];
          for (int64_t j = 0; j < w; ++j) acc[j] = std::log(acc[j]);
          for (int64_t k = 0; k < v.length; ++k)
            for (int64_t j = 0; j < w; ++j)
              po[base + k * v.inner + j] = DType<T>::store(t[k * w + j] - static_cast<C>(acc[j]));
        } else {
          for (int64_t k = 0; k < v.length; ++k)
            for (int64_t j = 0; j < w; ++j) t[k * w + j] -= m[j];
          vexp(t, v.length * w);
          for (int64_t k = 0; k < v.length; ++k)
            for (int64_t j = 0; j < w; ++j) acc[j] += t[k * w + j];
          for (int64_t k = 0; k < v.length; ++k)
            for (int64_t j = 0; j < w; ++j)
              po[base + k * v.inner + j] = DType<T>::store(t[k * w + j] / static_cast<C>(acc[j]));
        }
      } else {
        C* dy = tile2.data();
        for (int64_t k = 0; k < v.length; ++k)
          for (int64_t j = 0; j < w; ++j)
            dy[k * w + j] = DType<T>::load(pd[base + k * v.inner + j]);
        if constexpr (kKind == Kind::kSoftmaxBackward) {  // dx = y (dy - sum(dy y))
          for (int64_t k = 0; k < v.length; ++k)
            for (int64_t j = 0; j < w; ++j)
              acc[j] += static_cast<double>(dy[k * w + j]) * static_cast<double>(t[k * w + j]);
          for (int64_t k = 0; k < v.length; ++k)
            for (int64_t j = 0; j < w; ++j)
              po[base + k * v.inner + j] =
                  DType<T>::store(t[k * w + j] * (dy[k * w + j] - static_cast<C>(acc[j])));
        } else {  // dx = dy - exp(y) sum(dy)
          for (int64_t k = 0; k < v.length; ++k)
            for (int64_t j = 0; j < w; ++j) acc[j] += dy[k * w + j];
          vexp(t, v.length * w);
          for (int64_t k = 0; k < v.length; ++k)
            for (int64_t j = 0; j < w; ++j)
              po[base + k * v.inner + j] =
                  DType<T>::store(dy[k * w + j] - t[k * w + j] * static_cast<C>(acc[j]));
        }
      }
    }
  });
}

}  // namespace

KernelFn softmax_family(Op op, bp_dtype dtype) {
  return visit_dtype(dtype, [&]<class T>() -> KernelFn {
    if constexpr (is_floating_v<T>) {
      switch (op) {
        case Op::kSoftmax:
          return &softmax_kernel<T, Kind::kSoftmax>;
        case Op::kLogSoftmax:
          return &softmax_kernel<T, Kind::kLogSoftmax>;
        case Op::kSoftmaxBackward:
          return &softmax_kernel<T, Kind::kSoftmaxBackward>;
        case Op::kLogSoftmaxBackward:
          return &softmax_kernel<T, Kind::kLogSoftmaxBackward>;
        default:
          break;
      }
    }
    return nullptr;
  });
}

}  // namespace bp::cpu
