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

  TensorImpl() = default;
  // Every field at once: shape and strides are copied, not zeroed first and then assigned (a
  // default TensorImpl clears its 144 bytes of Dims, which costs a tensor's creation more than
  // the rest of it: Note [DLPack import cost] in tensor_native.cpp).
  TensorImpl(std::shared_ptr<Buffer> storage_, Device* device_, DType dtype_, const Dims& shape_,
             const Dims& strides_, int64_t offset_ = 0)
      : storage(std::move(storage_)),
        device(device_),
        dtype(dtype_),
        shape(shape_),
        strides(strides_),
        offset(offset_) {}
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

// The dtype of the "stats" tensors of the normalisation, attention and loss ops (layer_norm's
// mean and rstd, batch_norm's per-channel tensors, attention's and cross_entropy's lse): f32 for
// f16/bf16 inputs, the input's dtype otherwise (Note [Op catalogue]).
inline DType stat_dtype(DType t) {
  return t == DType::f16 || t == DType::bf16 ? DType::f32 : t;
}

// launch() of an op whose one argument the host cannot check is an index (embedding's indices,
// cross_entropy's targets: Note [Op catalogue]): every shape, dtype and attribute was checked by
// the caller, so a plugin's refusal (PluginError) is that index, an IndexError with what()
// appended to the plugin's message. An AsyncError (an earlier op's failure, or this one's found
// on the device) passes unchanged.
template <class What>
void launch_indexed(Device& dev, Op op, DType dtype, std::span<const bp_tensor_desc> in,
                    std::span<const bp_tensor_desc> out, std::span<const bp_attr> attrs,
                    const What& what) {
  try {
    launch(dev, op, dtype, in, out, attrs);
  } catch (const AsyncError&) {
    throw;
  } catch (const PluginError& e) {
    throw IndexError(std::string(e.what()) + what());
  }
}

// Launch attributes, named by id and by name (Note [Attribute ids] in plugin_abi.h).
inline bp_attr attr_f(bp_attr_id id, double v) {
  return bp_attr{sizeof(bp_attr), bp_attr_name(id), BP_ATTR_FLOAT, 0, v, id};
}
inline bp_attr attr_i(bp_attr_id id, int64_t v) {
  return bp_attr{sizeof(bp_attr), bp_attr_name(id), BP_ATTR_INT, v, 0.0, id};
}

// Reserves n values of `gen`'s Philox stream (the default generator when null), thread-safely
// with rand/randn: the seed and the offset of the first. CaptureError naming `what` while `dev`
// is capturing a graph (a replay would repeat the numbers).
void draw_philox(Device& dev, const char* what, Generator* gen, uint64_t n, uint64_t& seed,
                 uint64_t& offset);

// Host copy of a tensor's values in row-major order as raw bytes of its dtype.
std::vector<char> read_bytes(const Tensor& t, const char* what);

}  // namespace bp::detail
