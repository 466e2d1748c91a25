// Printing tensors the way the walkthrough shows them:
//   [21.085537 56.59815 151.41316]
//   <Tensor 3 f32 @cuda:0>
// Floats print in their shortest round-trip form for their dtype ("1." for whole numbers,
// like NumPy); past 1000 elements each dimension shows its first and last 3 entries.
#include <backplane/tensor.hpp>

#include "tensor/tensor_internal.hpp"

#include <charconv>
#include <cmath>
#include <ostream>
#include <sstream>

namespace bp {

using detail::impl;
using detail::impl_ptr;
using detail::TensorImpl;

namespace {

constexpr int64_t kSummariseAbove = 1000;
constexpr int64_t kEdge = 3;

std::string format_value(const std::vector<char>& bytes, DType t, size_t i) {
  double v = load_as_double(bytes.data(), t, i);
  if (t == DType::boolean) return v != 0 ? "True" : "False";
  if (!is_floating(t)) {
    return std::to_string(static_cast<long long>(v));
  }
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::to_chars_result r;
  if (t == DType::f64)
    r = std::to_chars(buf, buf + sizeof buf, v);
  else
    r = std::to_chars(buf, buf + sizeof buf, static_cast<float>(v));
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".";
  return s;
}

void print_dim(std::ostream& os, const std::vector<char>& bytes, DType t, const Shape& shape,
               const Shape& strides, int dim, size_t base, bool summarise, int indent) {
  os << '[';
  int64_t n = shape[dim];
  bool cut = summarise && n > 2 * kEdge;
  for (int64_t k = 0; k < n; ++k) {
    if (cut && k == kEdge) {
      if (dim + 1 == static_cast<int>(shape.size()))
        os << " ...";
      else
        os << '\n' << std::string(static_cast<size_t>(indent + 1), ' ') << "...";
      k = n - kEdge - 1;
      continue;
    }
    size_t at = base + static_cast<size_t>(k * strides[dim]);
    if (dim + 1 == static_cast<int>(shape.size())) {
      if (k) os << ' ';
      os << format_value(bytes, t, at);
    } else {
      if (k) os << '\n' << std::string(static_cast<size_t>(indent + 1), ' ');
      print_dim(os, bytes, t, shape, strides, dim + 1, at, summarise, indent + 1);
    }
  }
  os << ']';
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "<Tensor undefined>";
  std::vector<char> bytes = detail::read_bytes(t, "printing a tensor");
  Shape shape = t.shape();
  DType dt = t.dtype();
  if (shape.empty()) {
    os << format_value(bytes, dt, 0);
  } else {
    Shape strides(shape.size());
    int64_t acc = 1;
    for (int k = static_cast<int>(shape.size()) - 1; k >= 0; --k) {
      strides[k] = acc;
      acc *= shape[k];
    }
    print_dim(os, bytes, dt, shape, strides, 0, 0, t.numel() > kSummariseAbove, 0);
  }
  return os << "\n<Tensor " << impl(t).shape.str() << ' ' << dtype_name(dt) << " @"
            << t.device().str() << '>';
}

std::string to_string(const Tensor& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

}  // namespace bp
