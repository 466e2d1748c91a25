// The one checked arithmetic of shapes, strides and bytes (Note [Checked sizes]).
#include "tensor/tensor_sizes.hpp"

#include <backplane/errors.hpp>

#include <string>

namespace bp::detail {

namespace {
std::string prefix(const char* op) {
  return op && *op ? std::string(op) + ": " : std::string();
}
}  // namespace

int64_t checked_numel(const Dims& shape, const char* op) {
  for (int i = 0; i < shape.rank; ++i)
    if (shape.d[i] < 0)
      throw ShapeError(prefix(op) + "negative dimension " + std::to_string(shape.d[i]) +
                       " in shape " + shape.str());
  int64_t n = 1;
  for (int i = 0; i < shape.rank; ++i)
    if (shape.d[i] == 0) return 0;  // an empty tensor, whatever the other dimensions
  for (int i = 0; i < shape.rank; ++i)
    if (__builtin_mul_overflow(n, shape.d[i], &n))
      throw ShapeError(prefix(op) + "shape " + shape.str() + " has more than 2^63 elements");
  return n;
}

uint64_t checked_bytes(const Dims& shape, DType dtype, const char* op) {
  int64_t n = checked_numel(shape, op);
  int64_t bytes = 0;
  if (__builtin_mul_overflow(n, static_cast<int64_t>(dtype_size(dtype)), &bytes))
    throw OutOfMemory(prefix(op) + "shape " + shape.str() + " of " +
                      std::string(dtype_name(dtype)) + " needs more than 2^63 bytes (" +
                      std::to_string(n) + " elements of " + std::to_string(dtype_size(dtype)) +
                      " bytes)");
  return static_cast<uint64_t>(bytes);
}

uint64_t checked_reach(const Dims& shape, const Dims& strides, DType dtype, const char* op) {
  if (checked_numel(shape, op) == 0) return 0;
  int64_t last = 0;
  bool overflow = false;
  for (int k = 0; k < shape.rank; ++k) {
    int64_t step = 0;
    overflow = overflow || __builtin_mul_overflow(shape.d[k] - 1, strides.d[k], &step) ||
               __builtin_add_overflow(last, step, &last);
  }
  int64_t elements = 0, total = 0;
  overflow = overflow || __builtin_add_overflow(last, int64_t{1}, &elements) ||
             __builtin_mul_overflow(elements, static_cast<int64_t>(dtype_size(dtype)), &total);
  if (overflow)
    throw ShapeError(prefix(op) + "shape " + shape.str() + " with strides " + strides.str() +
                     " reaches more than 2^63 bytes");
  return static_cast<uint64_t>(total);
}

int normalize_axis64(int64_t axis, int rank, const char* op) {
  int64_t r = rank > 1 ? rank : 1;
  if (axis < -r || axis >= r)
    throw ShapeError(prefix(op) + "axis " + std::to_string(axis) +
                     " is out of range for a tensor of rank " + std::to_string(rank) +
                     " (valid: " + std::to_string(-r) + " to " + std::to_string(r - 1) + ")");
  return static_cast<int>(axis < 0 ? axis + r : axis);
}

std::string shape_list(const Shape& s, bool note_scalar) {
  if (s.empty()) return note_scalar ? "[] (scalar)" : "[]";
  std::string out = "[";
  for (size_t k = 0; k < s.size(); ++k)
    out += (k ? ", " : "") + (s[k] < 0 ? std::string("?") : std::to_string(s[k]));
  return out + "]";
}

}  // namespace bp::detail
