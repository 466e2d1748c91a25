// Tensor indexing with NumPy's basic rules, giving views that share memory: integers (select
// an entry, removing the axis; negative counts from the end), slices with positive steps,
// None (a new axis of size 1) and one Ellipsis. Keys with an advanced part (integer or bool
// tensors, lists or arrays, negative-step slices) go to the Python layer
// (backplane/_indexing.py), which gives copies as NumPy and PyTorch do.
#include "bp_python.hpp"

#include <string>
#include <vector>

namespace bp::python {

namespace {

bool is_ellipsis(nb::handle h) {
  return h.ptr() == Py_Ellipsis;
}

[[noreturn]] void unsupported_index(nb::handle item) {
  if (nb::isinstance<Tensor>(item))
    throw UnsupportedError(
        "indexing with a tensor (advanced indexing) is not supported; index with integers, "
        "slices, None and ..., or select values with backplane.where");
  throw nb::type_error(("only integers, slices (with positive steps), None and ... are valid "
                        "indices; got " +
                        std::string(nb::repr(item).c_str()))
                           .c_str());
}

// True for an index item that basic indexing cannot express as a view.
bool is_advanced(nb::handle h) {
  PyObject* p = h.ptr();
  if (PyBool_Check(p) || PyList_Check(p) || nb::isinstance<Tensor>(h)) return true;
  if (PyLong_Check(p) || h.is_none() || p == Py_Ellipsis) return false;
  if (PySlice_Check(p)) {
    Py_ssize_t start, stop, step;
    if (PySlice_Unpack(p, &start, &stop, &step) < 0) throw nb::python_error();
    return step < 0;
  }
  if (nb::hasattr(h, "__array__") || nb::hasattr(h, "__dlpack__")) {
    // NumPy integer scalars (and 0-d integer arrays) are plain integer indices.
    bool zero_d = nb::hasattr(h, "ndim") && nb::cast<int>(h.attr("ndim")) == 0;
    return !(zero_d && PyIndex_Check(p));
  }
  return false;
}

bool has_advanced(nb::handle key) {
  if (PyTuple_Check(key.ptr())) {
    for (nb::handle h : nb::borrow<nb::tuple>(key))
      if (is_advanced(h)) return true;
    return false;
  }
  return is_advanced(key);
}

nb::object python_indexing(const char* fn) {
  return nb::module_::import_("backplane._indexing").attr(fn);
}

Tensor index(const Tensor& t, nb::handle key) {
  std::vector<nb::handle> items;
  if (PyTuple_Check(key.ptr())) {
    for (nb::handle h : nb::borrow<nb::tuple>(key)) items.push_back(h);
  } else {
    items.push_back(key);
  }
  int consuming = 0, ellipses = 0;
  for (nb::handle h : items) {
    if (PyBool_Check(h.ptr())) unsupported_index(h);
    if (is_ellipsis(h))
      ++ellipses;
    else if (!h.is_none()) {
      if (!PyIndex_Check(h.ptr()) && !PySlice_Check(h.ptr())) unsupported_index(h);
      ++consuming;
    }
  }
  int rank = t.rank();
  if (ellipses > 1) throw nb::index_error("an index can only have a single ellipsis ('...')");
  if (consuming > rank)
    throw nb::index_error(("too many indices for a tensor of dimension " + std::to_string(rank) +
                           ": " + std::to_string(consuming) + " given")
                              .c_str());
  Tensor r = t;
  int d = 0;  // the axis of `r` the next item applies to
  for (nb::handle h : items) {
    if (h.is_none()) {
      r = r.unsqueeze(d);
      ++d;
    } else if (is_ellipsis(h)) {
      d += rank - consuming;
    } else if (PySlice_Check(h.ptr())) {
      Py_ssize_t start, stop, step;
      if (PySlice_Unpack(h.ptr(), &start, &stop, &step) < 0) throw nb::python_error();
      if (step <= 0)
        throw ShapeError("slice step must be positive, got " + std::to_string(step) +
                         " (negative strides are not supported; copy in reverse order instead)");
      Py_ssize_t n = static_cast<Py_ssize_t>(r.size(d));
      PySlice_AdjustIndices(n, &start, &stop, step);
      if (!(start == 0 && stop == n && step == 1)) r = r.slice(d, start, stop, step);
      ++d;
    } else {
      int64_t i = PyLong_AsLongLong(nb::int_(h).ptr());
      if (PyErr_Occurred()) throw nb::python_error();
      int64_t n = r.size(d);
      if (i < -n || i >= n)
        throw nb::index_error(("index " + std::to_string(i) + " is out of range for dimension " +
                               std::to_string(d) + " of size " + std::to_string(n))
                                  .c_str());
      r = r.select(d, i);
    }
  }
  return r;
}

}  // namespace

void register_indexing(nb::class_<Tensor>& cls) {
  cls.def(
      "__getitem__",
      [](nb::handle self, nb::handle key) -> nb::object {
        if (has_advanced(key)) return python_indexing("getitem")(self, key);
        return nb::cast(index(nb::cast<const Tensor&>(self), key));
      },
      nb::arg("key"),
      "A view selected with integers, slices, None and ... (shares memory); a copy with integer "
      "or bool tensors, lists, arrays or negative-step slices.");
  cls.def(
      "__setitem__",
      [](nb::handle self, nb::handle key, nb::handle value) {
        if (has_advanced(key)) {
          python_indexing("setitem")(self, key, value);
          return;
        }
        Tensor& t = nb::cast<Tensor&>(self);
        Tensor v = index(t, key);
        if (grad_enabled() && v.requires_grad())
          throw Error(
              "__setitem__: a tensor that requires grad cannot be changed in place while "
              "gradients are recorded; assign under backplane.no_grad()");
        Tensor src;
        if (nb::try_cast<Tensor>(value, src, false)) {
          v.copy_(src);
          return;
        }
        if (!PyFloat_Check(value.ptr()) && !PyLong_Check(value.ptr())) {
          if (PySequence_Check(value.ptr()) || nb::hasattr(value, "__array__") ||
              nb::hasattr(value, "__dlpack__")) {
            // Lists, NumPy arrays, other libraries' tensors: through backplane.tensor().
            nb::object make = nb::module_::import_("backplane").attr("tensor");
            nb::object dev = nb::cast(&v.device(), nb::rv_policy::reference);
            v.copy_(nb::cast<Tensor>(make(value, v.dtype(), dev)));
            return;
          }
          if (!nb::hasattr(value, "__float__"))
            throw nb::type_error(("can assign a tensor, a number or array-like data to "
                                  "tensor[...], not " +
                                  std::string(nb::type_name(value.type()).c_str()))
                                     .c_str());
        }
        double x = nb::cast<double>(value);
        if (!is_floating(v.dtype()) && x != static_cast<double>(static_cast<int64_t>(x)))
          throw DTypeError("__setitem__: the number " + std::to_string(x) +
                           " is not a whole number and the tensor's dtype is " +
                           std::string(dtype_name(v.dtype())));
        v.fill_(x);
      },
      nb::arg("key"), nb::arg("value"));
}

}  // namespace bp::python
