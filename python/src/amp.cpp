// Mixed precision: the autocast scope (driven by backplane.autocast, python/backplane/amp.py) and
// torch.amp.GradScaler (backplane.amp.GradScaler).
#include "bp_python.hpp"

#include <backplane/autocast.hpp>
#include <backplane/grad_scaler.hpp>

#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>

namespace bp::python {

namespace {

// One entered bp::autocast scope; exit() closes it (Python's __exit__), on the thread that
// entered it.
struct AutocastState {
  std::optional<AutocastGuard> guard;
  void enter(const std::string& device_type, nb::handle dtype, bool enabled) {
    std::optional<DType> t;
    if (!dtype.is_none()) t = as_dtype(dtype);
    guard.emplace(device_type, t, enabled);
  }
  void exit() { guard.reset(); }
};

}  // namespace

void register_amp(nb::module_& m) {
  nb::class_<AutocastState>(m, "_AutocastState")
      .def(nb::init<>())
      .def("enter", &AutocastState::enter, nb::arg("device_type"), nb::arg("dtype").none(),
           nb::arg("enabled"))
      .def("exit", &AutocastState::exit);
  m.def("is_autocast_enabled", &is_autocast_enabled, nb::arg("device_type"),
        "Whether autocast is on for the device type (\"cpu\", \"cuda\", ...) on this thread.");
  m.def("get_autocast_dtype", &get_autocast_dtype, nb::arg("device_type"),
        "The dtype autocast uses for the device type on this thread.");
  m.def("autocast_supported_dtypes", &autocast_supported_dtypes, nb::arg("device_type"),
        "The dtypes in which every device of the type runs autocast's lower-precision ops.");
  m.def("clear_autocast_cache", &clear_autocast_cache,
        "Drops this thread's cached parameter casts.");

  nb::class_<amp::GradScaler>(m, "_GradScaler")
      .def(
          "__init__",
          [](amp::GradScaler* self, double init_scale, double growth_factor, double backoff_factor,
             int64_t growth_interval, bool enabled) {
            new (self) amp::GradScaler(amp::GradScalerOptions{
                init_scale, growth_factor, backoff_factor, growth_interval, enabled});
          },
          nb::arg("init_scale"), nb::arg("growth_factor"), nb::arg("backoff_factor"),
          nb::arg("growth_interval"), nb::arg("enabled"))
      .def("scale", &amp::GradScaler::scale, nb::arg("outputs"))
      .def("unscale_", &amp::GradScaler::unscale_, nb::arg("optimizer"))
      .def("step", &amp::GradScaler::step, nb::arg("optimizer"))
      .def("update", &amp::GradScaler::update, nb::arg("new_scale").none())
      .def("get_scale", &amp::GradScaler::get_scale)
      .def("get_growth_factor", &amp::GradScaler::get_growth_factor)
      .def("get_backoff_factor", &amp::GradScaler::get_backoff_factor)
      .def("get_growth_interval", &amp::GradScaler::get_growth_interval)
      .def("_get_growth_tracker", &amp::GradScaler::growth_tracker)
      .def("is_enabled", &amp::GradScaler::is_enabled)
      .def("state_dict", &amp::GradScaler::state_dict)
      .def("load_state_dict", &amp::GradScaler::load_state_dict, nb::arg("state_dict"));
}

}  // namespace bp::python
