// backplane.distributed: the default process group of bp::dist (collectives returning Work),
// the TCP store server that `python -m backplane.run` hosts, and the post-accumulate gradient
// hook that DistributedDataParallel uses.
#include "bp_python.hpp"

#include <backplane/dist_launch.hpp>

#include <nanobind/stl/chrono.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <memory>
#include <string>

namespace bp::python {

namespace {

// Waits with the GIL released: other Python threads (a DataLoader's workers) keep running.
void wait_work(dist::Work& w, double timeout_s) {
  nb::gil_scoped_release nogil;
  if (timeout_s > 0)
    w.wait(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  else
    w.wait();
}

}  // namespace

void register_dist(nb::module_& m) {
  nb::enum_<dist::ReduceOp>(m, "ReduceOp", "Reductions of the collectives.")
      .value("SUM", dist::ReduceOp::sum)
      .value("AVG", dist::ReduceOp::avg)
      .value("MIN", dist::ReduceOp::min)
      .value("MAX", dist::ReduceOp::max);

  nb::class_<dist::Work>(m, "Work",
                         "A queued collective (torch.distributed.Work): wait() blocks until it "
                         "has finished on this rank.")
      .def("wait", &wait_work, nb::arg("timeout").none() = 0.0,
           "As torch's Work.wait(): on a GPU the device's default stream waits for the "
           "operation and the call returns at once; on the CPU (or with a timeout in seconds) "
           "the host blocks until it has finished on this rank. TimeoutError, MismatchError, "
           "PeerError or DistError for a failure known by then.")
      .def("is_completed",
           [](dist::Work& w) {
             nb::gil_scoped_release nogil;
             return w.is_completed();
           })
      .def("staged", &dist::Work::staged,
           "True when the tensor went through host memory (a device type without a "
           "communicator).")
      .def("__repr__", [](const dist::Work& w) { return "<Work " + w.description() + ">"; });

  m.def(
      "_dist_init",
      [](int rank, int world_size, const std::string& init_method, double timeout_s,
         const std::string& backend, const std::string& checks, bool nonblocking) {
        dist::InitOptions o;
        o.rank = rank;
        o.world_size = world_size;
        o.init_method = init_method;
        o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
        o.backend = backend;
        if (checks == "first_call")
          o.checks = dist::CollectiveChecks::first_call;
        else if (checks == "every_call")
          o.checks = dist::CollectiveChecks::every_call;
        else if (checks == "off")
          o.checks = dist::CollectiveChecks::off;
        else
          throw nb::value_error(("init_process_group: checks='" + checks.substr(0, 64) +
                                 "' is not 'first_call' (the default), 'every_call' or 'off'")
                                    .c_str());
        o.nonblocking = nonblocking;
        nb::gil_scoped_release nogil;
        dist::init_process_group(o);
      },
      nb::arg("rank"), nb::arg("world_size"), nb::arg("init_method"), nb::arg("timeout"),
      nb::arg("backend"), nb::arg("checks") = "first_call", nb::arg("nonblocking") = false);
  m.def("_dist_flight_record", []() { return dist::flight_record(); });
  m.def(
      "_dist_shrink",
      [](const std::vector<int>& excluded) {
        nb::gil_scoped_release nogil;
        return dist::shrink_group(excluded);
      },
      nb::arg("excluded"));
  m.def("_dist_launch_env", []() {
    dist::LaunchEnv e = dist::launch_env();
    nb::dict d;
    d["rank"] = e.rank;
    d["world_size"] = e.world_size;
    d["local_rank"] = e.local_rank;
    d["launcher"] = e.launcher;
    d["variables"] = e.variables;
    d["init_method"] = e.init_method;
    d["init_from"] = e.init_from;
    return d;
  });
  m.def("_dist_is_initialized", &dist::is_initialized);
  m.def("_dist_destroy", []() {
    nb::gil_scoped_release nogil;
    dist::destroy_process_group();
  });
  m.def("_dist_rank", &dist::get_rank);
  m.def("_dist_world_size", &dist::get_world_size);
  m.def("_dist_local_rank", &dist::get_local_rank);
  m.def(
      "_dist_local_device",
      [](const std::string& type) -> Device& { return dist::local_device(type); }, nb::arg("type"),
      nb::rv_policy::reference);
  m.def(
      "_dist_all_reduce",
      [](const Tensor& t, dist::ReduceOp op) {
        nb::gil_scoped_release nogil;
        return dist::all_reduce(t, op);
      },
      nb::arg("tensor"), nb::arg("op"));
  m.def(
      "_dist_broadcast",
      [](const Tensor& t, int root) {
        nb::gil_scoped_release nogil;
        return dist::broadcast(t, root);
      },
      nb::arg("tensor"), nb::arg("src"));
  m.def(
      "_dist_all_gather",
      [](const Tensor& out, const Tensor& in) {
        nb::gil_scoped_release nogil;
        return dist::all_gather(out, in);
      },
      nb::arg("output"), nb::arg("input"));
  m.def(
      "_dist_reduce_scatter",
      [](const Tensor& out, const Tensor& in, dist::ReduceOp op) {
        nb::gil_scoped_release nogil;
        return dist::reduce_scatter(out, in, op);
      },
      nb::arg("output"), nb::arg("input"), nb::arg("op"));
  m.def(
      "_dist_send",
      [](const Tensor& t, int dst) {
        nb::gil_scoped_release nogil;
        return dist::send(t, dst);
      },
      nb::arg("tensor"), nb::arg("dst"));
  m.def(
      "_dist_recv",
      [](const Tensor& t, int src) {
        nb::gil_scoped_release nogil;
        return dist::recv(t, src);
      },
      nb::arg("tensor"), nb::arg("src"));
  m.def(
      "_dist_abort",
      [](const std::string& reason) {
        nb::gil_scoped_release nogil;
        dist::group().abort(reason);
      },
      nb::arg("reason"),
      "Aborts the default group from this rank: its pending operations fail and the other "
      "ranks are told, with `reason` in their error.");
  m.def("_dist_barrier", []() {
    nb::gil_scoped_release nogil;
    dist::barrier();
  });

  nb::class_<dist::TcpStoreServer>(m, "_TcpStoreServer")
      .def(nb::init<const std::string&, int, std::string>(), nb::arg("host"), nb::arg("port"),
           nb::arg("secret"))
      .def_prop_ro("port", &dist::TcpStoreServer::port);
  m.def("_generate_store_secret", &dist::generate_store_secret);

  // Hooks for DistributedDataParallel (Tensor.register_post_accumulate_grad_hook).
  m.def(
      "_register_post_accumulate_grad_hook",
      [](const Tensor& t, std::function<void(const Tensor&)> hook) {
        return t.register_post_accumulate_grad_hook(std::move(hook));
      },
      nb::arg("tensor"), nb::arg("hook"));
  m.def(
      "_remove_post_accumulate_grad_hook",
      [](const Tensor& t, int64_t id) { t.remove_post_accumulate_grad_hook(id); },
      nb::arg("tensor"), nb::arg("id"));
}

}  // namespace bp::python
