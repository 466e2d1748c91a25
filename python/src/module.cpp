// The `backplane._core` extension module. The public package is the pure-Python layer in
// python/backplane, which re-exports what is bound here.
#include "bp_python.hpp"

NB_MODULE(_core, m) {
  m.doc() = "Backplane's C++ core bound with nanobind (use the `backplane` package).";
  bp::python::register_errors(m);
  bp::python::register_runtime(m);
  bp::python::register_tensor(m);
  bp::python::register_train(m);
  bp::python::register_amp(m);
  bp::python::register_nn_functional(m);
  bp::python::register_graph(m);
  bp::python::register_profiler(m);
  bp::python::register_dist(m);
  // Note [Leak reports under pytest with PyTorch] in backplane/__init__.py.
  m.def("_set_leak_warnings", &nanobind::set_leak_warnings, nanobind::arg("enabled"),
        "Whether nanobind reports Backplane objects still alive when the interpreter ends.");
}
