// Shared pieces of the convolutional family's kernels (cpu_conv.cpp, cpu_pool.cpp,
// cpu_norm.cpp, cpu_index.cpp, cpu_softmax.cpp): the spatial attributes of Note [Op catalogue]
// in plugin_abi.h, the [outer, length, inner] view of a dense tensor along an axis, and the
// parallel loop over work units of known cost.
//
// Every tensor of these ops is dense (row-major contiguous) and the host has checked shapes and
// attributes before the launch; the kernels still check what a wrong launch would turn into an
// out-of-bounds access (arity, dtypes, the shapes the geometry implies) and report it as
// BP_ERROR_INVALID_ARGUMENT through launch_error.
//
// Internal to backends/cpu; header-only.
#ifndef BACKPLANE_CPU_NN_HPP_
#define BACKPLANE_CPU_NN_HPP_

#include "cpu_kernels.hpp"
#include "cpu_strided.hpp"
#include "cpu_types.hpp"
#include "cpu_vmath.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

namespace bp::cpu {

// The attributes of conv2d and the pooling ops, read once per launch.
struct Spatial {
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  int64_t kernel_h = 0, kernel_w = 0, groups = 1;
  bool ceil_mode = false, count_include_pad = true;
};

// conv2d's attributes (KERNEL comes from the weight's shape).
inline Spatial conv_attrs(const Launch& l) {
  Spatial s;
  s.stride_h = l.attrs.i(BP_ATTR_ID_STRIDE_H, 1);
  s.stride_w = l.attrs.i(BP_ATTR_ID_STRIDE_W, 1);
  s.pad_h = l.attrs.i(BP_ATTR_ID_PAD_H, 0);
  s.pad_w = l.attrs.i(BP_ATTR_ID_PAD_W, 0);
  s.dil_h = l.attrs.i(BP_ATTR_ID_DILATION_H, 1);
  s.dil_w = l.attrs.i(BP_ATTR_ID_DILATION_W, 1);
  s.groups = l.attrs.i(BP_ATTR_ID_GROUPS, 1);
  if (s.stride_h < 1 || s.stride_w < 1 || s.pad_h < 0 || s.pad_w < 0 || s.dil_h < 1 ||
      s.dil_w < 1 || s.groups < 1)
    launch_error(
        l, bp::sdk::format("stride (%lld, %lld) and dilation (%lld, %lld) must be >= 1, "
                           "padding (%lld, %lld) >= 0 and groups (%lld) >= 1",
                           static_cast<long long>(s.stride_h), static_cast<long long>(s.stride_w),
                           static_cast<long long>(s.dil_h), static_cast<long long>(s.dil_w),
                           static_cast<long long>(s.pad_h), static_cast<long long>(s.pad_w),
                           static_cast<long long>(s.groups)));
  return s;
}

// The pooling ops' attributes: KERNEL required, STRIDE defaulting to it.
inline Spatial pool_attrs(const Launch& l) {
  Spatial s;
  if (!l.attrs.has(BP_ATTR_ID_KERNEL_H) || !l.attrs.has(BP_ATTR_ID_KERNEL_W))
    launch_error(l, "attributes kernel_h and kernel_w are required");
  s.kernel_h = l.attrs.i(BP_ATTR_ID_KERNEL_H, 0);
  s.kernel_w = l.attrs.i(BP_ATTR_ID_KERNEL_W, 0);
  s.stride_h = l.attrs.i(BP_ATTR_ID_STRIDE_H, s.kernel_h);
  s.stride_w = l.attrs.i(BP_ATTR_ID_STRIDE_W, s.kernel_w);
  s.pad_h = l.attrs.i(BP_ATTR_ID_PAD_H, 0);
  s.pad_w = l.attrs.i(BP_ATTR_ID_PAD_W, 0);
  s.dil_h = l.attrs.i(BP_ATTR_ID_DILATION_H, 1);
  s.dil_w = l.attrs.i(BP_ATTR_ID_DILATION_W, 1);
  s.ceil_mode = l.attrs.i(BP_ATTR_ID_CEIL_MODE, 0) != 0;
  s.count_include_pad = l.attrs.i(BP_ATTR_ID_COUNT_INCLUDE_PAD, 1) != 0;
  if (s.kernel_h < 1 || s.kernel_w < 1 || s.stride_h < 1 || s.stride_w < 1 || s.dil_h < 1 ||
      s.dil_w < 1 || s.pad_h < 0 || s.pad_w < 0 || 2 * s.pad_h > s.kernel_h ||
      2 * s.pad_w > s.kernel_w)
    launch_error(
        l, bp::sdk::format("kernel (%lld, %lld), stride and dilation must be >= 1 and "
                           "padding (%lld, %lld) within [0, kernel / 2]",
                           static_cast<long long>(s.kernel_h), static_cast<long long>(s.kernel_w),
                           static_cast<long long>(s.pad_h), static_cast<long long>(s.pad_w)));
  return s;
}

// The output size of Note [Op catalogue]: floor((in + 2 pad - dil (k - 1) - 1) / stride) + 1, or
// with ceil_mode the ceiling, less one when the last window would start in the right padding.
inline int64_t out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dil,
                        bool ceil_mode) {
  const int64_t span = in + 2 * pad - dil * (k - 1) - 1;
  if (span < 0) return 0;
  int64_t p = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
  if (ceil_mode && (p - 1) * stride >= in + pad) --p;
  return p;
}

// Requires t to be a dense rank-`rank` tensor of `dtype`; `role` names it in the message.
inline void check_dense(const Launch& l, const bp_tensor_desc& t, int rank, int32_t dtype,
                        const char* role) {
  check_dtype(l, t, dtype, role);
  if (t.rank != rank)
    launch_error(l, bp::sdk::format("%s %s must have rank %d", role, describe(t).c_str(), rank));
  int64_t s = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != s)
      launch_error(l, bp::sdk::format("%s %s must be dense (row-major contiguous)", role,
                                      describe(t).c_str()));
    s *= t.shape[d];
  }
}

// Requires t.shape == shape (rank given by shape's size).
inline void check_shape(const Launch& l, const bp_tensor_desc& t,
                        std::initializer_list<int64_t> shape, const char* role) {
  bool same = t.rank == static_cast<int32_t>(shape.size());
  int d = 0;
  for (int64_t s : shape) same = same && t.shape[d++] == s;
  if (!same) {
    std::string want = "[";
    d = 0;
    for (int64_t s : shape) (want += d++ ? "," : "") += std::to_string(s);
    launch_error(
        l, bp::sdk::format("%s %s should have shape %s]", role, describe(t).c_str(), want.c_str()));
  }
}

// A dense tensor seen as [outer, length, inner] around `axis`.
struct AxisView {
  int64_t outer = 1, length = 1, inner = 1;
};
inline AxisView axis_view(const bp_tensor_desc& t, int axis) {
  AxisView v;
  for (int d = 0; d < axis; ++d) v.outer *= t.shape[d];
  v.length = t.shape[axis];
  for (int d = axis + 1; d < t.rank; ++d) v.inner *= t.shape[d];
  return v;
}

// The AXIS attribute (required; negative counts from the end) checked against rank.
inline int read_axis(const Launch& l, int rank) {
  if (!l.attrs.has(BP_ATTR_ID_AXIS)) launch_error(l, "attribute axis is required");
  int64_t a = l.attrs.i(BP_ATTR_ID_AXIS, 0);
  const int64_t r = std::max(rank, 1);
  if (a < -r || a >= r)
    launch_error(l, bp::sdk::format("axis %lld is outside [%lld, %lld) for a rank-%d tensor",
                                    static_cast<long long>(a), static_cast<long long>(-r),
                                    static_cast<long long>(r), rank));
  if (a < 0) a += r;
  return static_cast<int>(a);
}

// Runs body(begin, end) over `units` work units of about `unit_cost` elements each: serially
// when the whole is below the cost class's threshold, else in oneTBB tasks of at least the
// class's grain of elements (and at least one unit).
template <class Body>
void parallel_units(int64_t units, int64_t unit_cost, Cost cost, Body&& body) {
  if (units <= 0) return;
  const Parallelism& p = parallelism(cost);
  const int64_t c = std::max<int64_t>(unit_cost, 1);
  const int64_t serial_units = p.serial_below / c;
  const int64_t grain_units = std::max<int64_t>(p.grain / c, 1);
  parallel_for_range(units, serial_units, grain_units, body);
}

// ---- Op families of the convolutional family (one file each) ----------------------------------
KernelFn conv_family(Op op, bp_dtype dtype);     // conv2d and its backward ops (cpu_conv.cpp)
KernelFn pool_family(Op op, bp_dtype dtype);     // max/avg/adaptive pooling (cpu_pool.cpp)
KernelFn norm_family(Op op, bp_dtype dtype);     // batch_norm (cpu_norm.cpp)
KernelFn index_family(Op op, bp_dtype dtype);    // max_dim min_dim gather scatter_add dropout
KernelFn softmax_family(Op op, bp_dtype dtype);  // softmax log_softmax and backward
// The transformer family (minor 5): layer_norm gelu silu embedding (and backward) triu tril
// cumsum (cpu_transformer.cpp); attention and its backward (cpu_attention.cpp). sin, cos and
// rsqrt are elementwise (cpu_elementwise.cpp).
KernelFn transformer_family(Op op, bp_dtype dtype);
KernelFn attention_family(Op op, bp_dtype dtype);
// The fused optimiser update (minor 7): adamw (cpu_optim.cpp).
KernelFn optim_family(Op op, bp_dtype dtype);
// The fused classification loss (minor 8): cross_entropy and its backward (cpu_loss.cpp).
KernelFn loss_family(Op op, bp_dtype dtype);

// The sum of n values of a compute type in double: f32 through the vector sums of Note [CPU f32
// sums] (below 20 float roundings of the sum of magnitudes), f64 in order.
template <class C>
double sum_of(const C* p, int64_t n) {
  if constexpr (std::is_same_v<C, float>) {
    return vmath::sum(p, n);
  } else {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(p[i]);
    return s;
  }
}

}  // namespace bp::cpu

#endif  // BACKPLANE_CPU_NN_HPP_
