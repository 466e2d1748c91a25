// backplane.profiler (the C++ bp::profiler session, ranges, summary and trace) and the helpers
// of backplane.utils.data and the Trainer: page-locked host copies and the training device.
#include "bp_python.hpp"

#include <nanobind/stl/string.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace bp::python {

namespace {

// A profiler::Range over a name the object owns (Range needs the name to outlive it).
class NamedRange {
 public:
  explicit NamedRange(std::string name) : name_(std::move(name)) {}
  NamedRange(const NamedRange&) = delete;
  NamedRange& operator=(const NamedRange&) = delete;
  void enter() { ranges_.push_back(std::make_unique<profiler::Range>(name_.c_str())); }
  void exit() {
    if (!ranges_.empty()) ranges_.pop_back();
  }

 private:
  std::string name_;
  std::vector<std::unique_ptr<profiler::Range>> ranges_;
};

// A cpu tensor holding t's values in page-locked host memory of `device` (Device::host_alloc),
// freed when the last view of it is gone: copies from it to `device` can be asynchronous.
Tensor pin_memory(const Tensor& t0, Device& device) {
  Tensor t = t0.cpu().contiguous();
  size_t n = static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
  Device& cpu = Tensor::cpu_device();
  void* p = device.host_alloc(std::max<size_t>(n, 1));
  if (n != 0) {
    cpu.default_stream().synchronize();
    std::memcpy(p,
                static_cast<const char*>(t.storage()->host_pointer()) +
                    t.offset() * static_cast<int64_t>(dtype_size(t.dtype())),
                n);
  }
  Device* owner = &device;
  try {
    return from_blob(cpu, p, t.shape(), {}, t.dtype(), [owner, p] { owner->host_free(p); });
  } catch (...) {
    device.host_free(p);
    throw;
  }
}

}  // namespace

void register_profiler(nb::module_& m) {
  m.def(
      "_profiler_start",
      [](bool device_time, bool record_shapes) {
        profiler::start(profiler::Options{device_time, record_shapes});
      },
      nb::arg("device_time"), nb::arg("record_shapes"));
  m.def("_profiler_stop", []() {
    nb::gil_scoped_release nogil;
    profiler::stop();
  });
  m.def("_profiler_running", []() { return profiler::is_running(); });
  m.def("_profiler_trace_json", []() { return profiler::trace_json(); });
  m.def(
      "_profiler_save", [](const std::string& path) { profiler::save(path); }, nb::arg("path"));
  m.def(
      "_profiler_table", [](size_t row_limit) { return profiler::table(row_limit); },
      nb::arg("row_limit") = 0);
  m.def("_profiler_key_averages", []() {
    nb::list out;
    for (const profiler::OpSummary& s : profiler::key_averages()) {
      nb::dict d;
      d["key"] = s.name;
      d["count"] = s.calls;
      d["device_time_total"] = s.device_us;
      d["cpu_time_total"] = s.host_us;
      d["bytes"] = s.bytes;
      out.append(d);
    }
    return out;
  });
  nb::class_<NamedRange>(m, "_Range")
      .def(nb::init<std::string>(), nb::arg("name"))
      .def("enter", &NamedRange::enter)
      .def("exit", &NamedRange::exit);

  m.def("_pin_memory", &pin_memory, nb::arg("tensor"), nb::arg("device"));
  m.def(
      "_trainer_device",
      [](int num_gpus, const std::string& device) -> Device& {
        TrainerOptions o;
        o.num_gpus = num_gpus;
        o.device = device;
        return Trainer(o).device();
      },
      nb::arg("num_gpus"), nb::arg("device"), nb::rv_policy::reference);
}

}  // namespace bp::python
