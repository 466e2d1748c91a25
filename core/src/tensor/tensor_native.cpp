// Tensors over native memory: Tensor::native, Tensor::data_ptr and bp::from_blob (plugin ABI
// 1.2, Note [Native handles] in plugin_abi.h).
#include <backplane/tensor.hpp>

#include "tensor/tensor_internal.hpp"
#include "tensor/tensor_sizes.hpp"

#include <cstdio>

namespace bp {

NativeBuffer Tensor::native() const {
  if (!defined()) throw Error("native(): undefined tensor (default-constructed bp::Tensor)");
  const detail::TensorImpl& i = *impl_;
  uint64_t off = static_cast<uint64_t>(i.offset) * dtype_size(i.dtype);
  if (!i.storage) return detail::state(*i.device).native_of(nullptr, off, off);
  return i.storage->native(off);
}

void* Tensor::data_ptr() const {
  return native().address;
}

namespace {

std::string dims_text(const Shape& s) {
  std::string out = "[";
  for (size_t k = 0; k < s.size(); ++k) out += (k ? ", " : "") + std::to_string(s[k]);
  return out + "]";
}

// Note [DLPack import cost]
//   from_blob is the whole of Backplane's part of a DLPack import (Python's from_dlpack and the
//   C exchange API call it once per tensor), so it is written for its cost: measured with
//   `_dlpack_c_exchange_ns(t, None, n, "import")` less its "managed" mode (2-core VM, pinned,
//   minimum of 61 runs), our part was 131 ns. Two things cost a quarter of that: a
//   default-constructed TensorImpl cleared its two Dims (144 bytes, `rep stos`) before they were
//   assigned, and Dims built by scalar stores and then copied by 16-byte loads stalled on store
//   forwarding. TensorImpl's field-wise constructor copies them once, and the strides are built
//   where they stay: 104 ns (tensors made by ops take the same constructor). The Buffer then
//   derived from enable_shared_from_this (for graph capture), which costs four atomic
//   read-modify-writes of its counts per buffer, 7 ns each on the H200 host's CPU; graphs now
//   hold the memory instead (Note [Buffers a graph keeps] in graph.cpp), and a Buffer's counts
//   are plain stores and one load. What is left is three allocations (the tensor, the Buffer,
//   the plugin's import record).
// from_blob's checks, then `import(bytes)`, the Device::import_buffer call of one of its two
// forms. The tensor's record is allocated before it, so that nothing throws once the plugin
// holds the release (a throw leaves the memory, and the release, with the caller).
template <typename Import>
Tensor blob_tensor(Device& dev, void* address, const Shape& shape, const Shape& strides,
                   DType dtype, Import&& import) {
  const int code = static_cast<int>(dtype);
  if (code < 0 || code >= kNumDTypes)
    throw DTypeError("from_blob: dtype value " + std::to_string(code) +
                     " is not a Backplane dtype (f32, f64, f16, bf16, i32, i64, u8, bool)");
  Dims s{std::span<const int64_t>(shape)};  // ShapeError past kMaxRank
  for (int k = 0; k < s.rank; ++k)
    if (s.d[k] < 0)
      throw ShapeError("from_blob: negative dimension " + std::to_string(s.d[k]) + " in shape " +
                       dims_text(shape));
  if (!strides.empty() && strides.size() != shape.size())
    throw ShapeError("from_blob: " + std::to_string(strides.size()) + " strides " +
                     dims_text(strides) + " for a shape of rank " + std::to_string(shape.size()) +
                     " " + dims_text(shape) +
                     " (give one stride per dimension, or none for row-major)");
  // Built where it stays, not assigned (Note [DLPack import cost]).
  const Dims st =
      strides.empty() ? detail::contiguous_strides(s) : Dims{std::span<const int64_t>(strides)};
  for (int k = 0; k < st.rank; ++k)
    if (st.d[k] < 0)
      throw ShapeError("from_blob: stride " + std::to_string(st.d[k]) + " of dimension " +
                       std::to_string(k) + " is negative (strides " + dims_text(strides) +
                       "); pass the address of the lowest element and non-negative strides");
  detail::checked_numel(s, "from_blob");  // Note [Checked sizes]
  // The memory the view reaches: 1 + sum((size - 1) * stride) elements, none when empty.
  const uint64_t esize = dtype_size(dtype);
  uint64_t bytes = 0;
  bool empty = false;  // (not s.numel(): the product may overflow before the check below)
  for (int k = 0; k < s.rank; ++k) empty = empty || s.d[k] == 0;
  if (!empty) {
    int64_t count = 1;
    for (int k = 0; k < s.rank; ++k)
      if (__builtin_mul_overflow(count, s.d[k], &count))
        throw ShapeError("from_blob: shape " + dims_text(shape) + " has more than 2^63 elements");
    int64_t last = 0;
    bool overflow = false;
    for (int k = 0; k < s.rank; ++k) {
      int64_t step = 0;
      overflow = overflow || __builtin_mul_overflow(s.d[k] - 1, st.d[k], &step) ||
                 __builtin_add_overflow(last, step, &last);
    }
    int64_t elements = 0, total = 0;
    overflow = overflow || __builtin_add_overflow(last, int64_t{1}, &elements) ||
               __builtin_mul_overflow(elements, static_cast<int64_t>(esize), &total);
    if (overflow)
      throw ShapeError("from_blob: shape " + dims_text(shape) + " with strides " +
                       dims_text(st.vec()) + " reaches more than 2^63 bytes");
    bytes = static_cast<uint64_t>(total);
  }
  if (!address && bytes != 0)
    throw DeviceError("from_blob: the address is NULL for a tensor of shape " + s.str() + " on " +
                      dev.str());
  if (reinterpret_cast<uintptr_t>(address) % esize != 0) {
    char where[32];
    std::snprintf(where, sizeof where, "%p", address);
    throw DTypeError("from_blob: address " + std::string(where) + " is not aligned to the " +
                     std::to_string(esize) + "-byte size of " + std::string(dtype_name(dtype)) +
                     " elements");
  }
  auto ti = std::make_shared<detail::TensorImpl>(nullptr, &dev, dtype, s, st);
  ti->storage = import(bytes);
  return detail::make_tensor(std::move(ti));
}

}  // namespace

Tensor from_blob(Device& dev, void* address, const Shape& shape, const Shape& strides, DType dtype,
                 std::function<void()> release) {
  return blob_tensor(dev, address, shape, strides, dtype, [&](uint64_t bytes) {
    return dev.import_buffer(address, bytes, std::move(release));
  });
}

Tensor from_blob(Device& dev, void* address, const Shape& shape, const Shape& strides, DType dtype,
                 Device::ReleaseFn release, void* release_ctx) {
  return blob_tensor(dev, address, shape, strides, dtype, [&](uint64_t bytes) {
    return dev.import_buffer(address, bytes, release, release_ctx);
  });
}

}  // namespace bp
