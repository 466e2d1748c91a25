// Internal: helpers shared by the tensor implementation files.
#pragma once

#include "runtime/device_state.hpp"

#include <backplane/tensor.hpp>

#include <initializer_list>
#include <string>

namespace bp::detail {

static_assert(kMaxRank == BP_MAX_RANK, "bp::kMaxRank and the plugin ABI's BP_MAX_RANK differ");

// Storage and geometry of a tensor.
struct TensorImpl {
  std::shared_ptr<Buffer> storage;  // may be null for zero-element tensors
  Device* device = nullptr;
  DType dtype = DType::f32;
  Dims shape, strides;
  int64_t offset = 0;  // elements
  std::shared_ptr<autograd::Meta> autograd;
};

// The tensor layer's access to Tensor's private parts (its one friend).
struct TensorAccess {
  static TensorImpl& impl(const Tensor& t) { return *t.impl_; }
  static const std::shared_ptr<TensorImpl>& impl_ptr(const Tensor& t) { return t.impl_; }
  static Tensor tensor(std::shared_ptr<TensorImpl> impl) { return Tensor(std::move(impl)); }
};

inline TensorImpl& impl(const Tensor& t) {
  return TensorAccess::impl(t);
}
inline const std::shared_ptr<TensorImpl>& impl_ptr(const Tensor& t) {
  return TensorAccess::impl_ptr(t);
}
inline Tensor make_tensor(std::shared_ptr<TensorImpl> impl) {
  return TensorAccess::tensor(std::move(impl));
}

// Row-major contiguous strides of a shape.
Dims contiguous_strides(const Dims& shape);
// A new contiguous tensor with uninitialised contents on `dev`'s default stream.
Tensor make_empty(Device& dev, const Dims& shape, DType dtype);
// A tensor over existing storage (a view).
Tensor make_view(const Tensor& base, const Dims& shape, const Dims& strides, int64_t offset);

// Descriptor of a tensor as it is.
bp_tensor_desc desc(const Tensor& t);
// Descriptor of `t` broadcast to `out` (left-padded, stride 0 where broadcast). Assumes the
// shapes are broadcast-compatible.
bp_tensor_desc desc_broadcast(const Tensor& t, const Dims& out);
// NumPy broadcast of two shapes; ShapeError naming the op otherwise.
Dims broadcast_shapes(const Dims& a, const Dims& b, const char* op);

// Throws DeviceMismatch unless every tensor lives on the first one's device.
void check_same_device(const char* op, std::initializer_list<const Tensor*> ts);
// Throws DTypeError unless both have one dtype.
void check_same_dtype(const char* op, const Tensor& a, const Tensor& b);
// Normalises a possibly negative axis; ShapeError naming the op otherwise.
int normalize_axis(int axis, int rank, const char* op);

// Launch attributes, named by id and by name (Note [Attribute ids] in plugin_abi.h).
inline bp_attr attr_f(bp_attr_id id, double v) {
  return bp_attr{sizeof(bp_attr), bp_attr_name(id), BP_ATTR_FLOAT, 0, v, id};
}
inline bp_attr attr_i(bp_attr_id id, int64_t v) {
  return bp_attr{sizeof(bp_attr), bp_attr_name(id), BP_ATTR_INT, v, 0.0, id};
}

// Host copy of a tensor's values in row-major order as raw bytes of its dtype.
std::vector<char> read_bytes(const Tensor& t, const char* what);

}  // namespace bp::detail
