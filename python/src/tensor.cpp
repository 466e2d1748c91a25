// backplane.Tensor: the C++ bp::Tensor bound directly (Note [Lean per-op path]), its operators,
// math, views, autograd, host reads, and the functional ops of the module.
#include "bp_python.hpp"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace bp::python {

namespace {

// A Python number used with a tensor takes the tensor's dtype (as in the C++ API); a fraction
// with an integer tensor would be truncated silently, so it is a DTypeError instead.
double scalar_for(const Tensor& t, double v, const char* op) {
  if (!is_floating(t.dtype()) && std::isfinite(v) && v != std::trunc(v))
    throw DTypeError(std::string(op) + ": the number " + std::to_string(v) +
                     " is not a whole number and the tensor's dtype is " +
                     std::string(dtype_name(t.dtype())) +
                     "; cast the tensor first, e.g. t.to(backplane.float32)");
  return v;
}

// A 0-d tensor of `v` with the device and dtype of `like` (broadcasts against it).
Tensor scalar_like(const Tensor& like, double v, const char* op) {
  return full({}, scalar_for(like, v, op), like.device(), like.dtype());
}

// In-place updates are not recorded by autograd, so they are refused on tensors that require
// gradients while recording is on (PyTorch refuses them on leaves likewise).
Tensor& inplace_target(nb::handle self, const char* op) {
  Tensor& t = nb::cast<Tensor&>(self);
  if (grad_enabled() && t.requires_grad())
    throw Error(std::string(op) +
                ": a tensor that requires grad cannot be changed in place while gradients are "
                "recorded (its gradient would be wrong); update it under backplane.no_grad() "
                "or use the out-of-place operator");
  return t;
}

nb::tuple int_tuple(const Dims& d) {
  PyObject* t = PyTuple_New(d.rank);
  if (!t) throw nb::python_error();
  for (int i = 0; i < d.rank; ++i) PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(d.d[i]));
  return nb::steal<nb::tuple>(t);
}

// Axes for a reduction: None (all), an int, or a sequence of ints.
std::vector<int> reduction_axes(const Tensor& t, nb::handle dim, const char* op) {
  std::vector<int> axes;
  int rank = t.rank();
  auto norm = [&](int64_t a) {
    if (a < -rank || a >= std::max(rank, 1))
      throw ShapeError(std::string(op) + ": dim " + std::to_string(a) +
                       " is out of range for a tensor of rank " + std::to_string(rank));
    return static_cast<int>(a < 0 ? a + rank : a);
  };
  if (PyIndex_Check(dim.ptr())) {
    axes.push_back(norm(nb::cast<int64_t>(dim)));
  } else {
    for (nb::handle h : dim) axes.push_back(norm(nb::cast<int64_t>(h)));
    std::sort(axes.begin(), axes.end());
    if (std::adjacent_find(axes.begin(), axes.end()) != axes.end())
      throw ShapeError(std::string(op) + ": dims repeat in " + nb::repr(dim).c_str());
  }
  return axes;
}

// `dim`, or NumPy's `axis` keyword (MXNet's and d2l's spelling); not both.
nb::handle pick_dim(nb::handle dim, nb::handle axis, const char* op) {
  if (axis.is_none()) return dim;
  if (!dim.is_none())
    throw nb::type_error((std::string(op) + "(): give dim or axis, not both").c_str());
  return axis;
}

template <typename F>
Tensor reduce(const Tensor& t, nb::handle dim, bool keepdim, const char* op, F&& one_axis,
              Tensor (Tensor::*all)() const) {
  if (dim.is_none()) {
    Tensor r = (t.*all)();
    if (!keepdim) return r;
    Shape ones(static_cast<size_t>(t.rank()), 1);
    return r.reshape(ones);
  }
  std::vector<int> axes = reduction_axes(t, dim, op);
  if (t.rank() == 0) return t.clone();
  Tensor r = t;
  // Highest axis first, so the lower axes keep their numbers when keepdim is false.
  for (auto it = axes.rbegin(); it != axes.rend(); ++it) r = one_axis(r, *it, keepdim);
  return r;
}

nb::object item_of(const Tensor& t) {
  DType d = t.dtype();
  if (is_floating(d)) {
    double v;
    {
      nb::gil_scoped_release nogil;
      v = t.item<double>();
    }
    return nb::float_(v);
  }
  if (d == DType::boolean) {
    bool v;
    {
      nb::gil_scoped_release nogil;
      v = t.item<bool>();
    }
    return nb::bool_(v);
  }
  int64_t v;
  {
    nb::gil_scoped_release nogil;
    v = t.item<int64_t>();
  }
  return nb::int_(v);
}

nb::dlpack::dtype dl_dtype(DType t) {
  using nb::dlpack::dtype_code;
  auto make = [](dtype_code c, int bits) {
    return nb::dlpack::dtype{static_cast<uint8_t>(c), static_cast<uint8_t>(bits), 1};
  };
  switch (t) {
    case DType::f32:
      return make(dtype_code::Float, 32);
    case DType::f64:
      return make(dtype_code::Float, 64);
    case DType::f16:
      return make(dtype_code::Float, 16);
    case DType::bf16:
      return make(dtype_code::Bfloat, 16);
    case DType::i32:
      return make(dtype_code::Int, 32);
    case DType::i64:
      return make(dtype_code::Int, 64);
    case DType::u8:
      return make(dtype_code::UInt, 8);
    case DType::boolean:
      return make(dtype_code::Bool, 8);
  }
  return make(dtype_code::Float, 32);
}

// The values as nested Python lists of Python numbers, as torch's tolist() (a 0-d tensor gives
// the number itself): read once on the host, no NumPy involved (Note [Lazy NumPy] in _np.py).
template <class T, class Make>
nb::object nest(const std::vector<T>& v, const Shape& shape, size_t dim, size_t& at,
                const Make& make) {
  if (dim == shape.size()) return make(v[at++]);
  nb::list l;
  for (int64_t i = 0; i < shape[dim]; ++i) l.append(nest(v, shape, dim + 1, at, make));
  return l;
}

nb::object to_list(const Tensor& t) {
  const Shape shape = t.shape();
  size_t at = 0;
  if (is_floating(t.dtype())) {
    std::vector<double> v;
    {
      nb::gil_scoped_release nogil;
      v = t.to_vector<double>();
    }
    return nest(v, shape, 0, at, [](double x) { return nb::object(nb::float_(x)); });
  }
  std::vector<int64_t> v;
  {
    nb::gil_scoped_release nogil;
    v = t.to_vector<int64_t>();
  }
  if (t.dtype() == DType::boolean)
    return nest(v, shape, 0, at, [](int64_t x) { return nb::object(nb::bool_(x != 0)); });
  return nest(v, shape, 0, at, [](int64_t x) { return nb::object(nb::int_(x)); });
}

// A NumPy array over the tensor's host memory: shared with the tensor on host-memory devices
// (like torch's Tensor.numpy()), over a fresh host copy otherwise.
nb::object to_numpy(const Tensor& t0) {
  if (t0.dtype() == DType::bf16)
    throw DTypeError("numpy(): NumPy has no bfloat16; convert first, e.g. t.to(backplane.float32)");
  Tensor t = t0;
  if (t.numel() != 0 && !t.storage()->host_pointer()) t = t.cpu();
  std::vector<size_t> shape;
  std::vector<int64_t> strides;
  for (int64_t s : t.shape()) shape.push_back(static_cast<size_t>(s));
  for (int64_t s : t.strides()) strides.push_back(s);
  static char empty_data alignas(64)[64];
  void* data = empty_data;
  if (t.numel() != 0) {
    {
      nb::gil_scoped_release nogil;
      t.device().default_stream().synchronize();
    }
    data = static_cast<char*>(t.storage()->host_pointer()) +
           t.offset() * static_cast<int64_t>(dtype_size(t.dtype()));
  }
  nb::capsule owner(new Tensor(t), [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  nb::ndarray<nb::numpy> arr(data, shape.size(), shape.data(), owner, strides.data(),
                             dl_dtype(t.dtype()), nb::device::cpu::value, 0);
  return nb::cast(arr, nb::rv_policy::reference);
}

// The tensor `t` from a C-contiguous host array holding `dtype` values.
Tensor from_host_array(nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu> a, DType dtype,
                       Device& dev) {
  if (a.dtype() != dl_dtype(dtype))
    throw DTypeError("internal: host array dtype does not match " + std::string(dtype_name(dtype)));
  Shape shape;
  for (size_t i = 0; i < a.ndim(); ++i) shape.push_back(static_cast<int64_t>(a.shape(i)));
  return from_bytes(a.data(), a.nbytes(), shape, dtype, dev);
}

Shape expand_sizes(const Tensor& t, const Shape& sizes) {
  Shape out = sizes;
  Shape cur = t.shape();
  int off = static_cast<int>(sizes.size()) - static_cast<int>(cur.size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] != -1) continue;
    int j = static_cast<int>(i) - off;
    if (j < 0)
      throw ShapeError("expand: -1 is not allowed for a new leading dimension (position " +
                       std::to_string(i) + ")");
    out[i] = cur[static_cast<size_t>(j)];
  }
  return out;
}

Tensor flatten_range(const Tensor& t, int64_t start, int64_t end) {
  int rank = t.rank();
  if (rank == 0) return t.reshape({1});
  auto norm = [&](int64_t a) {
    if (a < -rank || a >= rank)
      throw ShapeError("flatten: dim " + std::to_string(a) + " is out of range for rank " +
                       std::to_string(rank));
    return a < 0 ? a + rank : a;
  };
  start = norm(start);
  end = norm(end);
  if (start > end) throw ShapeError("flatten: start_dim must not come after end_dim");
  Shape s = t.shape(), out;
  for (int64_t i = 0; i < start; ++i) out.push_back(s[static_cast<size_t>(i)]);
  int64_t n = 1;
  for (int64_t i = start; i <= end; ++i) n *= s[static_cast<size_t>(i)];
  out.push_back(n);
  for (int64_t i = end + 1; i < rank; ++i) out.push_back(s[static_cast<size_t>(i)]);
  return t.reshape(out);
}

Tensor squeeze_all(const Tensor& t) {
  Tensor r = t;
  for (int i = t.rank() - 1; i >= 0; --i)
    if (r.size(i) == 1) r = r.squeeze(i);
  return r;
}

Tensor stack(const std::vector<Tensor>& ts, int dim) {
  if (ts.empty()) throw ShapeError("stack: expected a non-empty sequence of tensors");
  int rank = ts[0].rank() + 1;
  int d = dim < 0 ? dim + rank : dim;
  if (d < 0 || d >= rank)
    throw ShapeError("stack: dim " + std::to_string(dim) + " is out of range for rank " +
                     std::to_string(rank));
  std::vector<Tensor> parts;
  parts.reserve(ts.size());
  for (const Tensor& t : ts) parts.push_back(t.unsqueeze(d));
  return cat(parts, d);
}

const Tensor& cast_tensor(nb::handle self) {
  return nb::cast<const Tensor&>(self);
}

// `self` itself when `result` is the very same tensor (so `t.to(dev) is t` holds, walkthrough
// item 7), else a new Python object.
nb::object self_or(nb::handle self, Tensor result) {
  if (result.is_same(cast_tensor(self))) return nb::borrow(self);
  return nb::cast(std::move(result));
}

// Note [Python operands]
//   The other operand of an operator may be a Tensor, a Python or NumPy number, or an array
//   (a NumPy array, or anything with __array__ or __dlpack__). Numbers follow PyTorch: an int
//   or bool takes the tensor's dtype (a bool tensor computes in int64), a float takes the
//   tensor's dtype when it is floating and the default float32 otherwise. Arrays become tensors
//   on the tensor's device keeping their dtype (backplane.as_tensor) and promote as tensors do
//   (Note [Type promotion] in tensor.hpp), so `tensor + ndarray` and `ndarray + tensor` (NumPy
//   defers: Tensor.__array_ufunc__ is None) are Backplane tensors. Anything else gives
//   NotImplemented, so Python raises its TypeError.
enum class Kind { tensor, integer, floating, other };
struct Operand {
  Kind kind = Kind::other;
  Tensor t;
  double v = 0;
};

PyObject* numpy_generic() {
  static PyObject* type = [] {
    PyObject* np = PyImport_ImportModule("numpy");
    PyObject* g = np ? PyObject_GetAttrString(np, "generic") : nullptr;
    Py_XDECREF(np);
    PyErr_Clear();
    return g;  // kept for the life of the process
  }();
  return type;
}

Operand classify(const Tensor& like, nb::handle h) {
  Operand o;
  PyObject* p = h.ptr();
  if (PyFloat_Check(p)) {
    o.kind = Kind::floating;
    o.v = PyFloat_AS_DOUBLE(p);
    return o;
  }
  if (PyLong_Check(p)) {  // bool too
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(p, &overflow);
    o.v = overflow ? PyLong_AsDouble(p) : static_cast<double>(v);
    if (PyErr_Occurred()) throw nb::python_error();
    o.kind = Kind::integer;
    return o;
  }
  if (nb::try_cast<Tensor>(h, o.t, false)) {
    o.kind = Kind::tensor;
    return o;
  }
  PyObject* generic = numpy_generic();
  if (generic && PyObject_IsInstance(p, generic) == 1) {
    std::string kind = nb::cast<std::string>(h.attr("dtype").attr("kind"));
    if (kind == "b" || kind == "i" || kind == "u") {
      o.kind = Kind::integer;
      o.v = nb::cast<double>(nb::float_(h));
      return o;
    }
    if (kind == "f") {
      o.kind = Kind::floating;
      o.v = nb::cast<double>(nb::float_(h));
      return o;
    }
    return o;
  }
  if (nb::hasattr(h, "__array__") || nb::hasattr(h, "__dlpack__") ||
      nb::hasattr(h, "__array_interface__")) {
    // Looked up on each use: a reference kept for the life of the process would keep the
    // module, and through it the Tensor type, alive past nanobind's leak check at exit.
    nb::object make = nb::module_::import_("backplane._tensor").attr("_operand");
    nb::object dev = nb::cast(&like.device(), nb::rv_policy::reference);
    o.t = nb::cast<Tensor>(make(h, dev));
    o.kind = Kind::tensor;
  }
  return o;
}

// The tensor a number combines with: a bool tensor as int64 for an int, an integer or bool
// tensor as float32 for a float (Note [Python operands]).
Tensor number_base(const Tensor& a, Kind k) {
  if (k == Kind::floating) return is_floating(a.dtype()) ? a : a.to(DType::f32);
  return a.dtype() == DType::boolean ? a.to(DType::i64) : a;
}

using TensorFn = Tensor (*)(const Tensor&, const Tensor&);
using NumberFn = Tensor (*)(const Tensor&, double);

nb::object arith(const Tensor& a, nb::handle h, TensorFn tt, NumberFn tn) {
  Operand o = classify(a, h);
  switch (o.kind) {
    case Kind::tensor:
      return nb::cast(tt(a, o.t));
    case Kind::integer:
    case Kind::floating:
      if (tn) return nb::cast(tn(number_base(a, o.kind), o.v));
      break;
    case Kind::other:
      break;
  }
  return nb::borrow(Py_NotImplemented);
}

using CompareFn = Tensor (*)(const Tensor&, const Tensor&);

template <CompareFn F>
nb::object compare_any(const Tensor& a, nb::handle h) {
  Operand o = classify(a, h);
  if (o.kind == Kind::tensor) return nb::cast(F(a, o.t));
  if (o.kind == Kind::other) return nb::borrow(Py_NotImplemented);
  Tensor base = number_base(a, o.kind);
  return nb::cast(F(base, full({}, o.v, base.device(), base.dtype())));
}

// `b` as the in-place target's dtype; DTypeError when the promoted result would not fit it
// (PyTorch: an int tensor += a float tensor is refused).
Tensor inplace_operand(const Tensor& t, const Tensor& b, const char* op) {
  if (b.dtype() == t.dtype()) return b;
  DType r = result_type(t, b);
  if (r != t.dtype())
    throw DTypeError(std::string(op) + ": the result type " + std::string(dtype_name(r)) +
                     " cannot be stored in place in a " + std::string(dtype_name(t.dtype())) +
                     " tensor; use the out-of-place operator, e.g. t = t + x");
  return b.to(t.dtype());
}

template <typename F>
nb::object inplace(nb::handle self, nb::handle h, const char* op, F fn) {
  Tensor& t = inplace_target(self, op);
  Operand o = classify(t, h);
  Tensor other;
  switch (o.kind) {
    case Kind::tensor:
      other = inplace_operand(t, o.t, op);
      break;
    case Kind::floating:
      if (!is_floating(t.dtype()))
        throw DTypeError(std::string(op) + ": a float cannot be stored in place in a " +
                         std::string(dtype_name(t.dtype())) +
                         " tensor; use the out-of-place operator, e.g. t = t + x");
      [[fallthrough]];
    case Kind::integer:
      other = full({}, o.v, t.device(), t.dtype());
      break;
    case Kind::other:
      return nb::borrow(Py_NotImplemented);
  }
  fn(t, other);
  return nb::borrow(self);
}

}  // namespace

void register_tensor(nb::module_& m) {
  nb::class_<Tensor> cls(
      m, "Tensor",
      "A strided view of device memory with a dtype, on one device. Ops run asynchronously on "
      "the operands' device and leave the result there; operands on different devices raise "
      "DeviceMismatch. Reading values (item, numpy, tolist, printing) waits for the device.");
  auto op = nb::is_operator();

  // ---- geometry and identity ----
  cls.def(nb::init<const Tensor&>(), nb::arg("other"),
          "Another handle of the same tensor (used by nn.Parameter).");
  cls.def_prop_ro("shape", [](const Tensor& t) { return int_tuple(t.dims()); })
      .def_prop_ro("dtype", &Tensor::dtype)
      .def_prop_ro("device", &Tensor::device, nb::rv_policy::reference)
      .def_prop_ro("ndim", &Tensor::rank)
      .def("dim", &Tensor::rank)
      .def("numel", &Tensor::numel)
      .def(
          "size",
          [](const Tensor& t, nb::handle dim) -> nb::object {
            if (dim.is_none()) return int_tuple(t.dims());
            return nb::int_(t.size(nb::cast<int>(dim)));
          },
          nb::arg("dim").none() = nb::none())
      .def(
          "stride",
          [](const Tensor& t, nb::handle dim) -> nb::object {
            if (dim.is_none()) return int_tuple(t.stride_dims());
            int r = t.rank();
            int d = nb::cast<int>(dim);
            if (d < -r || d >= r)
              throw ShapeError("stride: dim " + std::to_string(d) + " is out of range for rank " +
                               std::to_string(r));
            return nb::int_(t.stride_dims().d[d < 0 ? d + r : d]);
          },
          nb::arg("dim").none() = nb::none())
      .def("storage_offset", &Tensor::offset)
      .def("element_size", [](const Tensor& t) { return dtype_size(t.dtype()); })
      .def_prop_ro("itemsize", [](const Tensor& t) { return dtype_size(t.dtype()); })
      .def_prop_ro(
          "nbytes",
          [](const Tensor& t) { return t.numel() * static_cast<int64_t>(dtype_size(t.dtype())); })
      .def("is_contiguous", &Tensor::is_contiguous)
      .def("is_floating_point", [](const Tensor& t) { return is_floating(t.dtype()); })
      .def("shares_storage", &Tensor::shares_storage, nb::arg("other"),
           "True when both tensors view the same device memory.")
      .def("__hash__", [](nb::handle self) { return reinterpret_cast<intptr_t>(self.ptr()); })
      .def("__len__", [](const Tensor& t) {
        if (t.rank() == 0) throw nb::type_error("len() of a 0-d tensor");
        return t.size(0);
      });

  // ---- arithmetic (Note [Lean per-op path]: Tensor-Tensor overloads first; Note [Python
  // operands] for numbers and arrays) ----
  cls.def(
         "__add__", [](const Tensor& a, const Tensor& b) { return a + b; }, op)
      .def(
          "__add__",
          [](const Tensor& a, nb::handle b) {
            return arith(
                a, b, [](const Tensor& x, const Tensor& y) { return x + y; },
                [](const Tensor& x, double v) { return x + v; });
          },
          op)
      .def(
          "__radd__",
          [](const Tensor& a, nb::handle b) {
            return arith(
                a, b, [](const Tensor& x, const Tensor& y) { return y + x; },
                [](const Tensor& x, double v) { return v + x; });
          },
          op)
      .def(
          "__sub__", [](const Tensor& a, const Tensor& b) { return a - b; }, op)
      .def(
          "__sub__",
          [](const Tensor& a, nb::handle b) {
            return arith(
                a, b, [](const Tensor& x, const Tensor& y) { return x - y; },
                [](const Tensor& x, double v) { return x - v; });
          },
          op)
      .def(
          "__rsub__",
          [](const Tensor& a, nb::handle b) {
            return arith(
                a, b, [](const Tensor& x, const Tensor& y) { return y - x; },
                [](const Tensor& x, double v) { return v - x; });
          },
          op)
      .def(
          "__mul__", [](const Tensor& a, const Tensor& b) { return a * b; }, op)
      .def(
          "__mul__",
          [](const Tensor& a, nb::handle b) {
            return arith(
                a, b, [](const Tensor& x, const Tensor& y) { return x * y; },
                [](const Tensor& x, double v) { return x * v; });
          },
          op)
      .def(
          "__rmul__",
          [](const Tensor& a, nb::handle b) {
            return arith(
                a, b, [](const Tensor& x, const Tensor& y) { return y * x; },
                [](const Tensor& x, double v) { return v * x; });
          },
          op)
      .def(
          "__truediv__", [](const Tensor& a, const Tensor& b) { return a / b; }, op)
      .def(
          "__truediv__",
          [](const Tensor& a, nb::handle b) {
            return arith(
                a, b, [](const Tensor& x, const Tensor& y) { return x / y; },
                [](const Tensor& x, double v) { return x / v; });
          },
          op)
      .def(
          "__rtruediv__",
          [](const Tensor& a, nb::handle b) {
            return arith(
                a, b, [](const Tensor& x, const Tensor& y) { return y / x; },
                [](const Tensor& x, double v) { return v / x; });
          },
          op)
      .def(
          "__matmul__", [](const Tensor& a, const Tensor& b) { return matmul(a, b); }, op)
      .def(
          "__matmul__",
          [](const Tensor& a, nb::handle b) {
            return arith(
                a, b, [](const Tensor& x, const Tensor& y) { return matmul(x, y); }, nullptr);
          },
          op)
      .def(
          "__rmatmul__",
          [](const Tensor& a, nb::handle b) {
            return arith(
                a, b, [](const Tensor& x, const Tensor& y) { return matmul(y, x); }, nullptr);
          },
          op)
      .def(
          "__pow__", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, op)
      .def(
          "__pow__",
          [](const Tensor& a, nb::handle b) {
            return arith(
                a, b, [](const Tensor& x, const Tensor& y) { return pow(x, y); },
                [](const Tensor& x, double v) { return x.pow(v); });
          },
          op)
      .def(
          "__rpow__",
          [](const Tensor& a, nb::handle b) {
            return arith(
                a, b, [](const Tensor& x, const Tensor& y) { return pow(y, x); },
                [](const Tensor& x, double v) {
                  return pow(full({}, v, x.device(), x.dtype()), x);
                });
          },
          op)
      .def("__neg__", [](const Tensor& a) { return -a; })
      .def("__pos__", [](nb::handle self) { return nb::borrow(self); })
      .def("__abs__", &Tensor::abs);

  // In-place operators change the tensor's memory (views of it see the change); the result
  // must keep the tensor's dtype (PyTorch's rule: int += float tensor is a DTypeError).
  cls.def(
         "__iadd__",
         [](nb::handle self, const Tensor& b) {
           Tensor& t = inplace_target(self, "+=");
           t.add_(inplace_operand(t, b, "+="));
           return nb::borrow(self);
         },
         op)
      .def(
          "__iadd__",
          [](nb::handle self, nb::handle b) {
            return inplace(self, b, "+=", [](Tensor& t, const Tensor& o) { t.add_(o); });
          },
          op)
      .def(
          "__isub__",
          [](nb::handle self, const Tensor& b) {
            Tensor& t = inplace_target(self, "-=");
            t.add_(inplace_operand(t, b, "-="), -1.0);
            return nb::borrow(self);
          },
          op)
      .def(
          "__isub__",
          [](nb::handle self, nb::handle b) {
            return inplace(self, b, "-=", [](Tensor& t, const Tensor& o) { t.add_(o, -1.0); });
          },
          op)
      .def(
          "__imul__",
          [](nb::handle self, nb::handle b) {
            return inplace(self, b, "*=", [](Tensor& t, const Tensor& o) { t.copy_(t * o); });
          },
          op)
      .def(
          "__itruediv__",
          [](nb::handle self, nb::handle b) {
            Tensor& t = nb::cast<Tensor&>(self);
            if (!is_floating(t.dtype()))
              throw DTypeError(
                  "/=: true division of a " + std::string(dtype_name(t.dtype())) +
                  " tensor gives floating values, which it cannot hold in place; use t = t / x");
            return inplace(self, b, "/=", [](Tensor& t, const Tensor& o) { t.copy_(t / o); });
          },
          op);

  // ---- comparisons give bool tensors (numbers and arrays promote like arithmetic) ----
  cls.def(
         "__eq__", [](const Tensor& a, const Tensor& b) { return eq(a, b); }, op)
      .def(
          "__eq__", [](const Tensor& a, nb::handle b) { return compare_any<eq>(a, b); }, op)
      .def(
          "__ne__", [](const Tensor& a, const Tensor& b) { return ne(a, b); }, op)
      .def(
          "__ne__", [](const Tensor& a, nb::handle b) { return compare_any<ne>(a, b); }, op)
      .def(
          "__lt__", [](const Tensor& a, const Tensor& b) { return lt(a, b); }, op)
      .def(
          "__lt__", [](const Tensor& a, nb::handle b) { return compare_any<lt>(a, b); }, op)
      .def(
          "__le__", [](const Tensor& a, const Tensor& b) { return le(a, b); }, op)
      .def(
          "__le__", [](const Tensor& a, nb::handle b) { return compare_any<le>(a, b); }, op)
      .def(
          "__gt__", [](const Tensor& a, const Tensor& b) { return gt(a, b); }, op)
      .def(
          "__gt__", [](const Tensor& a, nb::handle b) { return compare_any<gt>(a, b); }, op)
      .def(
          "__ge__", [](const Tensor& a, const Tensor& b) { return ge(a, b); }, op)
      .def(
          "__ge__", [](const Tensor& a, nb::handle b) { return compare_any<ge>(a, b); }, op);

  // ---- math ----
  cls.def("exp", &Tensor::exp)
      .def("log", &Tensor::log)
      .def("sqrt", &Tensor::sqrt)
      .def("abs", &Tensor::abs)
      .def("relu", &Tensor::relu)
      .def("sigmoid", &Tensor::sigmoid)
      .def("tanh", &Tensor::tanh)
      .def(
          "pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, nb::arg("exponent"))
      .def(
          "pow", [](const Tensor& a, double b) { return a.pow(b); }, nb::arg("exponent"))
      .def(
          "matmul", [](const Tensor& a, const Tensor& b) { return matmul(a, b); }, nb::arg("other"))
      .def("maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); })
      .def("minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); })
      .def(
          "sum",
          [](const Tensor& t, nb::handle dim, bool keepdim, nb::handle axis, bool keepdims) {
            return reduce(
                t, pick_dim(dim, axis, "sum"), keepdim || keepdims, "sum",
                [](const Tensor& x, int a, bool k) { return x.sum(a, k); }, &Tensor::sum);
          },
          nb::arg("dim").none() = nb::none(), nb::arg("keepdim") = false,
          nb::arg("axis").none() = nb::none(), nb::arg("keepdims") = false,
          "The sum over everything or over `dim` (NumPy's `axis` and `keepdims` too); int64 for "
          "integer and bool tensors.")
      .def(
          "mean",
          [](const Tensor& t, nb::handle dim, bool keepdim, nb::handle axis, bool keepdims) {
            return reduce(
                t, pick_dim(dim, axis, "mean"), keepdim || keepdims, "mean",
                [](const Tensor& x, int a, bool k) { return x.mean(a, k); }, &Tensor::mean);
          },
          nb::arg("dim").none() = nb::none(), nb::arg("keepdim") = false,
          nb::arg("axis").none() = nb::none(), nb::arg("keepdims") = false)
      .def(
          "max",
          [](const Tensor& t, nb::handle dim, bool keepdim) {
            return reduce(
                t, dim, keepdim, "max", [](const Tensor& x, int a, bool k) { return x.max(a, k); },
                &Tensor::max);
          },
          nb::arg("dim").none() = nb::none(), nb::arg("keepdim") = false,
          "The largest values (over `dim` when given); unlike torch, only the values.")
      .def(
          "min",
          [](const Tensor& t, nb::handle dim, bool keepdim) {
            Tensor n = -t;
            return -reduce(
                n, dim, keepdim, "min", [](const Tensor& x, int a, bool k) { return x.max(a, k); },
                &Tensor::max);
          },
          nb::arg("dim").none() = nb::none(), nb::arg("keepdim") = false)
      .def(
          "norm",
          [](const Tensor& t, nb::handle dim, bool keepdim) {
            if (dim.is_none())
              return reduce(
                  t, dim, keepdim, "norm",
                  [](const Tensor& x, int a, bool k) { return x.norm(a, k); }, &Tensor::norm);
            if (t.rank() == 0) return t.abs();
            // Several dims: the squares summed over the first, plain sums over the rest.
            bool first = true;
            Tensor s = reduce(
                t, dim, keepdim, "norm",
                [&first](const Tensor& x, int a, bool k) {
                  Tensor r = first ? x.sumsq(a, k) : x.sum(a, k);
                  first = false;
                  return r;
                },
                &Tensor::sumsq);
            return s.sqrt();
          },
          nb::arg("dim").none() = nb::none(), nb::arg("keepdim") = false,
          "The 2-norm (Frobenius over everything, or over `dim`), one pass over the data.");

  // ---- views and copies ----
  cls.def("reshape",
          [](const Tensor& t, nb::args s) { return t.reshape(shape_from_args(s, "reshape")); })
      .def("view", [](const Tensor& t, nb::args s) { return t.view(shape_from_args(s, "view")); })
      .def("transpose", &Tensor::transpose, nb::arg("dim0"), nb::arg("dim1"))
      .def("t", &Tensor::t)
      .def_prop_ro("T",
                   [](const Tensor& t) {
                     Shape order;
                     for (int i = t.rank() - 1; i >= 0; --i) order.push_back(i);
                     return t.permute(order);
                   })
      .def_prop_ro("mT", [](const Tensor& t) { return t.transpose(-2, -1); })
      .def("permute",
           [](const Tensor& t, nb::args s) { return t.permute(shape_from_args(s, "permute")); })
      .def(
          "squeeze",
          [](const Tensor& t, nb::handle dim) {
            return dim.is_none() ? squeeze_all(t) : t.squeeze(nb::cast<int>(dim));
          },
          nb::arg("dim").none() = nb::none())
      .def("unsqueeze", &Tensor::unsqueeze, nb::arg("dim"))
      .def(
          "narrow",
          [](const Tensor& t, int dim, int64_t start, int64_t length) {
            int r = std::max(t.rank(), 1);
            if (dim < -r || dim >= r)
              throw ShapeError("narrow: dim " + std::to_string(dim) + " is out of range for rank " +
                               std::to_string(t.rank()));
            int64_t n = t.size(dim);
            if (start < 0) start += n;
            if (start < 0 || length < 0 || start + length > n)
              throw ShapeError("narrow: start " + std::to_string(start) + " and length " +
                               std::to_string(length) + " do not fit a dimension of size " +
                               std::to_string(n));
            return t.slice(dim, start, start + length);
          },
          nb::arg("dim"), nb::arg("start"), nb::arg("length"),
          "A view of `length` entries of `dim` from `start` (torch.narrow).")
      .def("expand",
           [](const Tensor& t, nb::args s) {
             return t.expand(expand_sizes(t, shape_from_args(s, "expand")));
           })
      .def("expand_as", [](const Tensor& t, const Tensor& o) { return t.expand(o.shape()); })
      .def("flatten", &flatten_range, nb::arg("start_dim") = 0, nb::arg("end_dim") = -1)
      .def("contiguous",
           [](nb::handle self) { return self_or(self, cast_tensor(self).contiguous()); })
      .def("clone", &Tensor::clone)
      .def("detach", &Tensor::detach)
      .def(
          "copy_to", [](const Tensor& t, nb::handle d) { return t.copy_to(as_device(d)); },
          nb::arg("device"), "A new tensor on `device`, always a copy (even on the same device).")
      .def(
          "cpu",
          [](nb::handle self) {
            SyncDebugCall call("cpu()");
            return self_or(self, cast_tensor(self).cpu());
          },
          "This tensor on cpu:0: itself when already there, else a copy.")
      .def("_to_device",
           [](nb::handle self, Device& d) {
             SyncDebugCall call("to()");
             return self_or(self, cast_tensor(self).to(d));
           })
      .def(
          "_set_data",
          [](nb::handle self, const Tensor& src) {
            nb::cast<Tensor&>(self).set_data(src);
            return nb::borrow(self);
          },
          nb::arg("src"),
          "Replaces the storage, device, dtype and shape in place, keeping this object and its "
          "autograd identity (torch's `t.data = src`).")
      .def("_to_dtype",
           [](nb::handle self, DType d) { return self_or(self, cast_tensor(self).to(d)); })
      .def("is_same", &Tensor::is_same, nb::arg("other"));

  // ---- in-place (refused on tensors that require grad while recording) ----
  cls.def(
         "add_",
         [](nb::handle self, const Tensor& o, double alpha) {
           inplace_target(self, "add_").add_(o, alpha);
           return nb::borrow(self);
         },
         nb::arg("other"), nb::arg("alpha") = 1.0)
      .def(
          "mul_",
          [](nb::handle self, double f) {
            Tensor& t = inplace_target(self, "mul_");
            t.mul_(scalar_for(t, f, "mul_"));
            return nb::borrow(self);
          },
          nb::arg("factor"))
      .def(
          "fill_",
          [](nb::handle self, double v) {
            Tensor& t = inplace_target(self, "fill_");
            t.fill_(scalar_for(t, v, "fill_"));
            return nb::borrow(self);
          },
          nb::arg("value"))
      .def("zero_",
           [](nb::handle self) {
             inplace_target(self, "zero_").zero_();
             return nb::borrow(self);
           })
      .def(
          "copy_",
          [](nb::handle self, const Tensor& src) {
            inplace_target(self, "copy_").copy_(src);
            return nb::borrow(self);
          },
          nb::arg("src"));

  // ---- autograd ----
  cls.def_prop_rw(
         "requires_grad", [](const Tensor& t) { return t.requires_grad(); },
         [](Tensor& t, bool on) { t.requires_grad_(on); })
      .def(
          "requires_grad_",
          [](nb::handle self, bool on) {
            nb::cast<Tensor&>(self).requires_grad_(on);
            return nb::borrow(self);
          },
          nb::arg("requires_grad") = true)
      .def_prop_rw(
          "grad",
          [](const Tensor& t) -> nb::object {
            Tensor g = t.grad();
            if (!g.defined()) return nb::none();
            return nb::cast(std::move(g));
          },
          [](Tensor& t, nb::handle g) {
            if (g.is_none())
              t.zero_grad();
            else
              t.set_grad(nb::cast<const Tensor&>(g));
          },
          nb::for_setter(nb::arg("value").none()),
          "The gradient after backward(), or None; assigning None drops it.")
      .def_prop_ro("is_leaf", [](const Tensor& t) { return t.grad_fn() == nullptr; })
      .def(
          "backward",
          [](const Tensor& t, nb::handle gradient) {
            if (gradient.is_none())
              t.backward();
            else
              t.backward(nb::cast<const Tensor&>(gradient));
          },
          nb::arg("gradient").none() = nb::none());

  // ---- host reads (each names the user's call in sync-debug reports: SyncDebugCall) ----
  cls.def(
         "item",
         [](const Tensor& t) {
           SyncDebugCall call("item()");
           return item_of(t);
         },
         "The single value as a Python number (waits for the device).")
      .def(
          "numpy",
          [](const Tensor& t) {
            SyncDebugCall call("numpy()");
            return to_numpy(t);
          },
          "A NumPy array of the values: sharing memory on cpu, a host copy otherwise.")
      .def("__bool__",
           [](const Tensor& t) {
             if (t.numel() != 1)
               throw ShapeError("the truth value of a tensor with " + std::to_string(t.numel()) +
                                " elements is ambiguous; use .any() style reductions or .item()");
             SyncDebugCall call("bool()");
             nb::gil_scoped_release nogil;
             return t.item<double>() != 0.0;
           })
      .def("__float__",
           [](const Tensor& t) {
             SyncDebugCall call("float()");
             nb::gil_scoped_release nogil;
             return t.item<double>();
           })
      .def("__int__", [](const Tensor& t) {
        SyncDebugCall call("int()");
        nb::gil_scoped_release nogil;
        return t.item<int64_t>();
      });
  // Host reads made by the Python layer (tolist, repr, __array__, iteration helpers) under the
  // name of the user's call.
  m.def("_numpy_as", [](const Tensor& t, const std::string& call) {
    SyncDebugCall name(call.c_str());
    return to_numpy(t);
  });
  m.def("_tolist", [](const Tensor& t, const std::string& call) {
    SyncDebugCall name(call.c_str());
    return to_list(t);
  });
  m.def("_to_string", [](const Tensor& t) {
    SyncDebugCall call("str()");
    return to_string(t);
  });

  register_indexing(cls);
  register_dlpack(cls, m);

  // ---- creation ----
  m.def("_from_host", &from_host_array, nb::arg("array"), nb::arg("dtype"), nb::arg("device"));
  m.def("_empty", [](const Shape& s, Device& d, DType t) { return empty(s, d, t); });
  m.def("_full", [](const Shape& s, double v, Device& d, DType t) { return full(s, v, d, t); });
  m.def("_arange", [](int64_t n, Device& d, DType t) { return arange(n, d, t); });
  m.def("_rand", [](const Shape& s, Device& d, DType t) { return rand(s, d, t); });
  m.def("_randn", [](const Shape& s, Device& d, DType t) { return randn(s, d, t); });
  m.def("_uniform", [](const Shape& s, double lo, double hi, Device& d, DType t) {
    return uniform(s, lo, hi, d, t);
  });

  // ---- functional ops ----
  m.def("exp", [](const Tensor& a) { return a.exp(); });
  m.def("log", [](const Tensor& a) { return a.log(); });
  m.def("sqrt", [](const Tensor& a) { return a.sqrt(); });
  m.def("abs", [](const Tensor& a) { return a.abs(); });
  m.def("relu", [](const Tensor& a) { return a.relu(); });
  m.def("sigmoid", [](const Tensor& a) { return a.sigmoid(); });
  m.def("tanh", [](const Tensor& a) { return a.tanh(); });
  m.def("sin", [](const Tensor& a) { return bp::sin(a); });
  m.def("cos", [](const Tensor& a) { return bp::cos(a); });
  m.def("rsqrt", [](const Tensor& a) { return bp::rsqrt(a); });
  m.def("matmul", [](const Tensor& a, const Tensor& b) { return matmul(a, b); });
  m.def("pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); });
  m.def("pow", [](const Tensor& a, double b) { return a.pow(b); });
  m.def("maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); });
  m.def("maximum",
        [](const Tensor& a, double b) { return maximum(a, scalar_for(a, b, "maximum")); });
  m.def("minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); });
  m.def("minimum",
        [](const Tensor& a, double b) { return minimum(a, scalar_for(a, b, "minimum")); });
  m.def("where", [](const Tensor& c, const Tensor& a, const Tensor& b) { return where(c, a, b); });
  m.def("where", [](const Tensor& c, const Tensor& a, double b) {
    return where(c, a, scalar_like(a, b, "where"));
  });
  m.def("where", [](const Tensor& c, double a, const Tensor& b) {
    return where(c, scalar_like(b, a, "where"), b);
  });
  m.def(
      "cat", [](const std::vector<Tensor>& ts, int dim) { return cat(ts, dim); },
      nb::arg("tensors"), nb::arg("dim") = 0);
  m.def("stack", &stack, nb::arg("tensors"), nb::arg("dim") = 0);
  m.def(
      "allclose",
      [](const Tensor& a, const Tensor& b, double rtol, double atol) {
        nb::gil_scoped_release nogil;
        return allclose(a, b, rtol, atol);
      },
      nb::arg("a"), nb::arg("b"), nb::arg("rtol") = 1e-5, nb::arg("atol") = 1e-8);
  m.def("eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); });

  // ---- autograd mode ----
  m.def("is_grad_enabled", &grad_enabled);
  struct NoGrad {
    NoGrad() = default;
    NoGrad(const NoGrad&) = delete;
    NoGrad& operator=(const NoGrad&) = delete;
    std::vector<std::unique_ptr<NoGradGuard>> guards;
  };
  nb::class_<NoGrad>(m, "_NoGradState")
      .def(nb::init<>())
      .def("enter", [](NoGrad& s) { s.guards.push_back(std::make_unique<NoGradGuard>()); })
      .def("exit", [](NoGrad& s) {
        if (!s.guards.empty()) s.guards.pop_back();
      });
  struct GradMode {
    GradMode() = default;
    GradMode(const GradMode&) = delete;
    GradMode& operator=(const GradMode&) = delete;
    std::vector<std::unique_ptr<GradModeGuard>> guards;
  };
  nb::class_<GradMode>(m, "_GradModeState")
      .def(nb::init<>())
      .def("enter",
           [](GradMode& s, bool on) { s.guards.push_back(std::make_unique<GradModeGuard>(on)); })
      .def("exit", [](GradMode& s) {
        if (!s.guards.empty()) s.guards.pop_back();
      });
  m.def(
      "_autograd_grad",
      [](const Tensor& output, const std::vector<Tensor>& inputs, nb::handle seed,
         bool allow_unused) {
        Tensor sd;
        if (!seed.is_none()) sd = nb::cast<Tensor>(seed);
        std::vector<Tensor> g = autograd::grad(output, inputs, sd, allow_unused);
        nb::list out;
        for (Tensor& t : g) {
          if (t.defined())
            out.append(nb::cast(std::move(t)));
          else
            out.append(nb::none());
        }
        return out;
      },
      nb::arg("output"), nb::arg("inputs"), nb::arg("seed").none(), nb::arg("allow_unused"));
}

}  // namespace bp::python
