// Internal: the one checked arithmetic of shapes, strides and bytes (Note [Checked sizes]).
#pragma once

#include <backplane/dtype.hpp>
#include <backplane/tensor.hpp>

#include <cstdint>
#include <string>

namespace bp::detail {

// Note [Checked sizes]
//   Every shape a caller, a file or a plugin gives is checked once, where a tensor or a view is
//   made, with overflow-checked arithmetic: each dimension non-negative and the element count
//   below 2^63 (ShapeError naming the shape), the bytes of a new buffer below 2^63 (OutOfMemory
//   naming the shape, dtype and element count), and a strided view's reach, 1 + sum((size - 1)
//   * stride) elements, below 2^63 bytes. Nothing is allocated or launched before. Since every
//   live tensor passed these checks, Dims::numel() and numel * dtype size of a live tensor
//   cannot overflow, and the per-op path multiplies plainly.

// The elements of `shape`; ShapeError "<op>: negative dimension ..." or "<op>: shape AxB has
// more than 2^63 elements".
int64_t checked_numel(const Dims& shape, const char* op);
// The bytes of a dense tensor of `shape` and `dtype`: checked_numel, then OutOfMemory "<op>:
// shape N of f32 needs more than 2^63 bytes (N elements of 4 bytes)" when the product overflows.
uint64_t checked_bytes(const Dims& shape, DType dtype, const char* op);
// The bytes a view of `shape` with non-negative element `strides` reaches from its first
// element (0 when it has no element); ShapeError naming shape and strides past 2^63 bytes.
uint64_t checked_reach(const Dims& shape, const Dims& strides, DType dtype, const char* op);
// An int64 axis of a tensor of `rank` as an index 0..rank-1 (negative counts from the end), never
// narrowed before the check: ShapeError "<op>: axis 4294967297 is out of range ...".
int normalize_axis64(int64_t axis, int rank, const char* op);

// A shape in messages as a list: "[2, 3]", "[]" for a scalar ("[] (scalar)" with note_scalar),
// "?" for a negative dimension (as a file or a caller may give one). Dims::str() is the compact
// "2x3" form.
std::string shape_list(const Shape& s, bool note_scalar = false);

}  // namespace bp::detail
