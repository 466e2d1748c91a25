// Graphs (backplane/graph.hpp): backplane.Graph, backplane.capture and backplane.is_capturing.
// The context manager backplane.graph(...) is in python/backplane/_graph.py.
#include "bp_python.hpp"

#include <backplane/graph.hpp>

#include <nanobind/stl/string.h>

#include <string>

namespace bp::python {

namespace {

GraphMode as_mode(const std::string& mode) {
  if (mode == "automatic") return GraphMode::automatic;
  if (mode == "recorded") return GraphMode::recorded;
  throw Error("graph mode '" + mode +
              "' is not one of 'automatic' (the backend's native graphs "
              "where it has them) and 'recorded' (the launch list on every backend)");
}

}  // namespace

void register_graph(nb::module_& m) {
  nb::class_<Graph>(m, "Graph",
                    "Work queued on a device, captured once and replayed with one submission "
                    "(README: Graphs). Tensors created during the capture come from the graph's "
                    "pool and hold the latest replay's results; update inputs in place.")
      .def(nb::init<>())
      .def(
          "begin_capture",
          [](Graph& g, nb::handle device, const std::string& mode) {
            g.begin_capture(as_device(device), as_mode(mode));
          },
          nb::arg("device").none() = nb::none(), nb::arg("mode") = "automatic",
          "Starts capturing the device's default stream (None: the default device).")
      .def("end_capture", &Graph::end_capture, "Ends the capture; the graph can then replay.")
      .def("abort_capture", &Graph::abort_capture,
           "Drops an open capture; the device runs eagerly again.")
      .def("replay", &Graph::replay, "Queues the captured work once.")
      .def_prop_ro("empty", &Graph::empty)
      .def_prop_ro("capturing", &Graph::capturing)
      .def_prop_ro("native", &Graph::native,
                   "True for the backend's own graph (a CUDA graph), False for a recorded list.")
      .def_prop_ro("num_ops", &Graph::num_ops)
      .def_prop_ro("pool_bytes", &Graph::pool_bytes)
      .def_prop_ro(
          "device", [](const Graph& g) -> Device& { return g.device(); }, nb::rv_policy::reference)
      .def("__repr__", [](const Graph& g) {
        if (g.empty()) return std::string("Graph(empty)");
        return "Graph(device='" + g.device().str() + "', " + (g.native() ? "native" : "recorded") +
               ", ops=" + std::to_string(g.num_ops()) +
               ", pool_bytes=" + std::to_string(g.pool_bytes()) +
               (g.capturing() ? ", capturing" : "") + ")";
      });
  m.def(
      "capture",
      [](nb::callable fn, nb::handle device, const std::string& mode) {
        return capture(
            as_device(device), [&] { fn(); }, as_mode(mode));
      },
      nb::arg("fn"), nb::arg("device").none() = nb::none(), nb::arg("mode") = "automatic",
      "Captures what fn() queues on the device into a new Graph; when fn raises, the capture "
      "is dropped and the exception propagates.");
  m.def(
      "is_capturing", [](nb::handle device) { return is_capturing(as_device(device)); },
      nb::arg("device").none() = nb::none());
}

}  // namespace bp::python
