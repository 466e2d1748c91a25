// Issuing collectives: routes from device types to communicators, tensor arguments (contiguous
// copies, host staging, native addresses), the plugin calls, and Work.
//
// Note [Host staging]
//   A tensor on a device type that no loaded communicator plugin declares (opencl, a third
//   party's accelerator) is copied to page-locked host memory (Device::host_alloc) on the
//   device's default stream, reduced there by the communicator that serves cpu (gloo), and
//   copied back when the Work completes (in wait() or is_completed(): the copy-back needs the
//   caller's thread). It costs two copies and a synchronisation per call, so it is never
//   silent: Work::staged() is true, the Work's description says "staged through host
//   memory", and BACKPLANE_DIST_DEBUG=1 logs every staged call. A plugin that declares the
//   type but cannot run (NCCL missing) is an error, not a reason to stage; naming a host
//   communicator for a type on purpose ("cuda:gloo") stages that type by choice.
//
// Note [Native addresses]
//   Plugins get native addresses (the CUDA device pointer, the host pointer of cpu memory)
//   and native streams (cudaStream_t) through the ABI 1.2 slots buffer_native / stream_native
//   (Tensor::native(), Stream::native_handle()). A device type without addressable memory
//   (OpenCL answers UNSUPPORTED) can only be staged.
#include "dist/dist_internal.hpp"
#include "profiler/profiler_internal.hpp"

#include <backplane/graph.hpp>
#include <backplane/runtime.hpp>

#include <algorithm>
#include <cstring>

namespace bp::dist::internal {

namespace {

struct Native {
  void* address = nullptr;
  int ordinal = 0;
  int dlpack = 1;
};

// The native address of a dense tensor's first element (Note [Native addresses]).
Native native_of(const Tensor& dense) {
  if (dense.numel() == 0 || !dense.storage()) return Native{nullptr, 0, 1};
  NativeBuffer nb = dense.native();
  return Native{nb.address, nb.device_ordinal, nb.dlpack_device_type};
}

// cudaStream_t on cuda; nullptr for host streams, which run eagerly (Note [Native addresses]).
void* native_stream_of(Stream& s) {
  return s.native_handle();
}

// The vendor ordinal and DLPack type of a device's memory, read from a one-byte buffer.
NativeBuffer native_location(Device& dev) {
  std::shared_ptr<Buffer> b = dev.allocator().allocate(1);
  return b->native(0);
}

uint64_t nbytes(const Tensor& t) {
  return static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype());
}

// Makes `waiter` wait for the work queued so far on `producer` (one device).
void order_after(Stream& waiter, Stream& producer) {
  if (&waiter == &producer) return;
  std::unique_ptr<Event> e = producer.device().create_event();
  e->record(producer);
  waiter.wait(*e);
}

const char* plugin_list_reason(const bp::detail::CommRegistry& reg) {
  static thread_local std::string s;
  s.clear();
  for (const auto& r : reg.report())
    s += (s.empty() ? "" : "; ") + std::string("comm-") + (r.name.empty() ? "?" : r.name) + " " +
         r.decision + (r.reason.empty() ? "" : " (" + r.reason + ")");
  if (s.empty()) s = "no libbackplane-comm-*.so was found in the plugin search path";
  return s.c_str();
}

}  // namespace

// ---- routes and communicators -----------------------------------------------------------------

Route Group::route_for(Device& dev, const char* op) {
  const auto& reg = bp::detail::CommRegistry::get();
  const std::string& type = dev.type();
  auto require = [&](const bp::detail::CommPlugin* p, const std::string& name,
                     const std::string& why) -> const bp::detail::CommPlugin& {
    if (!p)
      throw BackendUnavailable(std::string(op) + " on " + dev.str() + ": communicator plugin '" +
                               name + "' (" + why + ") is not loaded: " + plugin_list_reason(reg));
    if (!p->report.available)
      throw BackendUnavailable(std::string(op) + " on " + dev.str() + ": communicator plugin '" +
                               name + "' cannot run: " + p->report.reason);
    return *p;
  };
  auto host_plugin = [&]() -> const bp::detail::CommPlugin& {
    auto it = backend_for_type.find("cpu");
    std::string name = it != backend_for_type.end() ? it->second : backend_all;
    if (!name.empty()) return require(reg.find(name), name, "chosen for cpu");
    for (const auto& p : reg.plugins())
      if (p.serves("cpu")) return require(&p, p.report.name, "the first that serves cpu");
    throw BackendUnavailable(std::string(op) + " on " + dev.str() +
                             ": no communicator plugin serves cpu memory (needed for " +
                             (type == "cpu" ? "it" : "host staging of " + type) +
                             "): " + plugin_list_reason(reg));
  };
  Device& cpu = bp::device("cpu:0");
  auto staged = [&](const bp::detail::CommPlugin& p) {
    debug_log(this, std::string(op) + " on " + dev.str() + " is staged through host memory via " +
                        p.report.name + " (Note [Host staging])");
    return Route{&communicator("cpu", cpu, p), true};
  };
  // A name given for every type must exist (a typo such as "ncl" never silently means Gloo).
  if (!backend_all.empty() && !reg.find(backend_all))
    require(nullptr, backend_all, "named by the backend option or BACKPLANE_DIST_BACKEND");
  std::string chosen;
  if (auto it = backend_for_type.find(type); it != backend_for_type.end())
    chosen = it->second;
  else if (!backend_all.empty() && reg.find(backend_all) && reg.find(backend_all)->serves(type))
    chosen = backend_all;
  if (!chosen.empty()) {
    const auto& p = require(reg.find(chosen), chosen, "chosen for " + type);
    if (p.serves(type)) return Route{&communicator(type, dev, p), false};
    if (p.serves("cpu")) return staged(p);
    throw BackendUnavailable(std::string(op) + " on " + dev.str() + ": communicator plugin '" +
                             chosen + "' serves neither " + type + " nor cpu (for staging)");
  }
  for (const auto& p : reg.plugins())
    if (p.serves(type)) {
      require(&p, p.report.name, "the first that serves " + type);
      return Route{&communicator(type, dev, p), false};
    }
  if (type == "cpu") return Route{&communicator("cpu", cpu, host_plugin()), false};
  return staged(host_plugin());
}

Communicator& Group::communicator(const std::string& memory_type, Device& memory_device,
                                  const bp::detail::CommPlugin& plugin) {
  auto it = comms.find(memory_type);
  if (it != comms.end()) {
    if (it->second->device != &memory_device)
      throw DeviceMismatch("dist: this rank's " + memory_type + " communicator is bound to " +
                           it->second->device->str() +
                           " (the device of its first collective), found a tensor on " +
                           memory_device.str() + "; use one device per rank and type");
    return *it->second;
  }
  auto c = std::make_unique<Communicator>();
  c->api = plugin.api;
  c->plugin = plugin.report.name;
  c->device = &memory_device;
  c->host_ctx = std::make_unique<HostCtx>(
      HostCtx{this, prefix + "comm/" + plugin.report.name + "/" + memory_type + "/"});
  bp_comm_host host = make_host(*c->host_ctx);
  std::string local = store->local_address();
  bp_comm_config cfg{};
  cfg.struct_size = sizeof cfg;
  cfg.rank = rank;
  cfg.world_size = size;
  cfg.device_type = memory_type.c_str();
  NativeBuffer loc = native_location(memory_device);
  cfg.device_ordinal = loc.device_ordinal;
  cfg.dlpack_device_type = loc.dlpack_device_type;
  cfg.timeout_ms = timeout.count();
  cfg.local_address = local.c_str();
  cfg.flags = nonblocking ? BP_COMM_CONFIG_NONBLOCKING : 0u;
  debug_log(this, "creating the " + plugin.report.name + " communicator for " +
                      memory_device.str() + " (" + std::to_string(size) + " ranks)");
  if (bp_error* e = plugin.api->comm_create(&cfg, &host, &c->comm)) {
    int32_t code = 0;
    std::string text = bp::detail::take_comm_error(plugin.api, e, &code);
    std::string msg = "creating the " + plugin.report.name + " communicator for " +
                      memory_device.str() + " on " + where() + " failed: " + text;
    if (!failed.load()) fail(kind_of_code(code), msg);
    throw_if_failed("creating the " + plugin.report.name + " communicator");
    raise(kind_of_code(code), msg);
  }
  bool abort_now;
  {
    std::lock_guard<std::mutex> l(mu);
    abortable.push_back(c.get());
    abort_now = failed.load();
  }
  if (abort_now)
    if (bp_error* e = c->api->comm_abort(c->comm)) bp::detail::take_comm_error(c->api, e);
  Communicator& ref = *c;
  comms[memory_type] = std::move(c);
  return ref;
}

// ---- issuing ----------------------------------------------------------------------------------

namespace {

// One operation being issued: holds the group's issue lock, numbers the call, prepares the
// tensor arguments and builds the Work.
class Issue {
 public:
  // kind: collective (numbered, checked by every rank), p2p_post (a send, `peer` the
  // destination) or p2p_verify (a recv, `peer` the source). The check is queued before the
  // communicator is created, so that ranks disagreeing on the device type meet a
  // MismatchError rather than a communicator that never forms.
  Issue(Group& g, const char* op, Device& dev, Stream* stream, Check::Kind kind,
        const std::string& descriptor, int peer = -1)
      : g_(g), lock_(g.issue_mu), dev_(dev), op_(op) {
    // Refused before the call is numbered: the group is untouched and the capture stays open.
    if (is_capturing(dev))
      throw CaptureError(dev.str() + ": " + op +
                         " cannot be captured in a graph: collectives synchronise with other "
                         "ranks and are not part of graphs; run them between replays");
    g.throw_if_failed(op);
    if (stream && &stream->device() != &dev)
      throw DeviceMismatch(std::string(op) + ": the stream given belongs to " +
                           stream->device().str() + ", the tensors to " + dev.str());
    s_ = std::make_shared<Work::State>();
    s_->g = g.shared_from_this();
    s_->op = op;
    Check chk;
    chk.kind = kind;
    chk.descriptor = descriptor;
    if (kind == Check::Kind::collective) {
      s_->seq = chk.seq = ++g.seq;
    } else if (kind == Check::Kind::p2p_post) {
      transfer_ = g.sent[peer]++;
      chk.key = g.prefix + "p/" + std::to_string(g.rank) + "-" + std::to_string(peer) + "/" +
                std::to_string(transfer_);
    } else {
      transfer_ = g.received[peer]++;
      chk.key = g.prefix + "p/" + std::to_string(peer) + "-" + std::to_string(g.rank) + "/" +
                std::to_string(transfer_);
    }
    // CollectiveChecks::first_call: a signature this rank issued before is not checked again
    // (every rank makes the same choice when they agree; Note [Collective checks]).
    const bool repeat = kind == Check::Kind::collective &&
                        g.check_mode == CollectiveChecks::first_call &&
                        !g.signatures.insert(descriptor).second;
    check_label_ = !g.check || g.size == 1           ? "off"
                   : kind != Check::Kind::collective ? "p2p"
                   : repeat                          ? "repeat"
                                                     : "compared";
    if (g.check && g.size > 1 && !repeat) {
      s_->check_ok = kind == Check::Kind::p2p_post;
      chk.work = s_;
      g.enqueue(std::move(chk));
    }
    // From here on the call is numbered: a local error must fail the group (Note [Local
    // errors after numbering]).
    numbered_ = true;
    unwinding_ = std::uncaught_exceptions();
    try {
      route_ = g.route_for(dev, op);
      s_->comm = route_.comm;
      s_->staged = route_.staged;
      Stream& def = dev.default_stream();
      stream_ = stream ? stream : &def;
      native_stream_ = route_.staged ? nullptr : native_stream_of(*stream_);
      if (native_stream_) order_after(*stream_, def);
    } catch (const std::exception& e) {
      // This rank cannot take part: tell the others rather than let them wait.
      if (!g.failed.load())
        g.fail(kind_of(e), std::string(op) + " on " + g.where() + ": " + e.what());
      throw;
    }
    g.last_device = &dev;
  }

  // Note [Local errors after numbering]
  //   Once a call is numbered, its descriptor is on its way to the other ranks, which call into
  //   the communicator and wait for this rank. An error that then stops this rank before the
  //   plugin call (an argument's contiguous copy or host staging out of memory, a failed
  //   synchronisation, a route that cannot be made) leaves the ranks out of step for good, so it
  //   fails the group with the local error before it is rethrown: the others get a PeerError
  //   quoting it at once instead of waiting out the timeout. arg() and the constructor report
  //   the error itself; any other exception between numbering and launch is caught by the
  //   destructor with a generic message. A group of one has nobody to tell and stays usable.
  ~Issue() {
    if (numbered_ && !launched_ && std::uncaught_exceptions() > unwinding_ && g_.size > 1 &&
        !g_.failed.load()) {
      if (before_fail_) before_fail_();
      g_.fail(FailKind::generic, std::string(op_) + " on " + dev_.str() + ", " + g_.where() +
                                     ": this rank failed before starting it");
    }
  }

  int64_t transfer() const { return transfer_; }
  // Inside a group the plugin starts the operation at group_end: stream-ordered copy-backs
  // must be queued after that.
  void defer_post() { defer_post_ = true; }
  void run_post() {
    for (auto& p : post_) p();
    post_.clear();
  }
  Group& group() { return g_; }
  const Route& route() const { return route_; }
  void* native_stream() const { return native_stream_; }
  const std::shared_ptr<Work::State>& state() const { return s_; }

  // A tensor argument: read (in), written (out) or both.
  void* arg(const Tensor& t, bool in, bool out) try {
    Tensor dense = t;
    bool copy_back = false;
    if (!t.is_contiguous()) {
      dense = in ? t.contiguous() : empty(t.shape(), dev_, t.dtype());
      copy_back = out;
    }
    s_->tensors.push_back(t);
    s_->tensors.push_back(dense);
    uint64_t n = nbytes(dense);
    bytes_ += n;
    if (n == 0) return nullptr;
    if (route_.staged) {
      Device& dev = dev_;
      void* host = dev.host_alloc(n);
      s_->keep.push_back(std::shared_ptr<void>(host, [&dev](void* p) { dev.host_free(p); }));
      Stream& def = dev.default_stream();
      const Buffer& buf = *dense.storage();
      uint64_t off = static_cast<uint64_t>(dense.offset()) * dtype_size(dense.dtype());
      if (in) {
        dev.copy_to_host(def, host, buf, off, n);
        def.synchronize();
      }
      if (out)
        finish_.push_back([&dev, host, dense, off, n, t, copy_back] {
          Stream& d = dev.default_stream();
          dev.copy_from_host(d, *dense.storage(), off, host, n);
          d.synchronize();  // the host buffer is freed with the Work
          if (copy_back) Tensor(t).copy_(dense);
        });
      return host;
    }
    void* address = native_of(dense).address;
    if (copy_back) {
      if (native_stream_) {
        // Stream-ordered: queue the copy-back now, after the operation.
        post_.push_back([this, t, dense] {
          order_after(dev_.default_stream(), *stream_);
          Tensor(t).copy_(dense);
        });
      } else {
        finish_.push_back([t, dense] { Tensor(t).copy_(dense); });
      }
    }
    return address;
  } catch (const std::exception& e) {
    fail_here(e);  // Note [Local errors after numbering]
    throw;
  }

  // Inside a group: runs before the group is failed, to close the plugin's group first
  // (comm_abi.h allows only work and destroy calls after an abort).
  void before_fail(std::function<void()> f) { before_fail_ = std::move(f); }

  // Calls the plugin and returns the Work; `what` describes the arguments for messages.
  Work launch(const std::string& what,
              const std::function<bp_error*(Communicator&, bp_comm_work**)>& call) {
    Communicator& c = *route_.comm;
    s_->description = std::string(op_) +
                      (s_->seq >= 0 ? " #" + std::to_string(s_->seq) : std::string()) + " (" +
                      what + ") on " + dev_.str() + " via " + c.plugin +
                      (route_.staged ? " staged through host memory" : "") + ", " + g_.where();
    s_->start = Clock::now();
    const int64_t t0 = bp::detail::observing() ? bp::detail::clock_ns() : 0;
    if (route_.staged) debug_log(&g_, s_->description);
    bp_comm_work* w = nullptr;
    if (bp_error* e = call(c, &w)) {
      int32_t code = 0;
      std::string text = bp::detail::take_comm_error(c.api, e, &code);
      std::string msg = s_->description + ": " + text;
      if (before_fail_) before_fail_();
      g_.fail(kind_of_code(code), msg);
      raise(kind_of_code(code), msg);
    }
    s_->handle = w;
    launched_ = true;
    if (native_stream_ && !defer_post_ && finish_.empty()) {
      // Note [Work waits]: wait() becomes a stream wait.
      s_->stream_wait = true;
      s_->stream = stream_;
      if (stream_ != &dev_.default_stream()) {
        s_->event = dev_.create_event();
        s_->event->record(*stream_);
      }
    }
    if (t0 != 0) [[unlikely]]
      bp::detail::on_collective(op_, dev_, bytes_, t0, s_->description);
    s_->flight = std::make_shared<FlightMark>();
    g_.flight.add(
        FlightEntry{0, s_->seq, op_, s_->description, check_label_, s_->start, s_->flight});
    if (!defer_post_) run_post();
    if (!finish_.empty()) {
      auto steps = std::move(finish_);
      s_->finish = [steps] {
        for (const auto& f : steps) f();
      };
    }
    g_.track(s_);
    return Work(s_);
  }

 private:
  Group& g_;
  std::lock_guard<std::recursive_mutex> lock_;
  Device& dev_;
  const char* op_;
  std::shared_ptr<Work::State> s_;
  Route route_;
  int64_t transfer_ = -1;
  const char* check_label_ = "off";  // Note [Flight recorder]
  uint64_t bytes_ = 0;               // of every tensor argument, for the profiler
  bool defer_post_ = false;
  Stream* stream_ = nullptr;
  void* native_stream_ = nullptr;
  std::vector<std::function<void()>> finish_, post_;
  bool numbered_ = false, launched_ = false;
  int unwinding_ = 0;  // std::uncaught_exceptions() when numbered
  std::function<void()> before_fail_;

  // A group of one has nobody waiting: its local errors leave it usable.
  void fail_here(const std::exception& e) {
    if (g_.size == 1 || g_.failed.load()) return;
    if (before_fail_) before_fail_();
    g_.fail(kind_of(e),
            std::string(op_) + " on " + dev_.str() + ", " + g_.where() + ": " + e.what());
  }
};

void check_defined(const Tensor& t, const char* op, const char* what) {
  if (!t.defined()) throw DistError(std::string(op) + ": the " + what + " tensor is undefined");
}

void check_reduce(const Tensor& t, ReduceOp op, const char* name) {
  if (op == ReduceOp::avg && !is_floating(t.dtype()))
    throw DTypeError(std::string(name) + ": avg needs a floating dtype, got " +
                     std::string(dtype_name(t.dtype())) + " (use sum and divide)");
}

void check_pair(const Tensor& out, const Tensor& in, const char* op) {
  if (&out.device() != &in.device())
    throw DeviceMismatch(std::string(op) + ": expected all tensors on one device, found " +
                         out.device().str() + " and " + in.device().str());
  if (out.dtype() != in.dtype())
    throw DTypeError(std::string(op) + ": output dtype " + std::string(dtype_name(out.dtype())) +
                     " differs from input dtype " + std::string(dtype_name(in.dtype())));
}

std::string dtype_shape(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + " " + shape_text(t);
}

}  // namespace

}  // namespace bp::dist::internal

namespace bp::dist {

using internal::Check;
using internal::Clock;
using internal::Communicator;
using internal::Issue;

const char* reduce_op_name(ReduceOp op) {
  return bp_reduce_op_name(static_cast<int32_t>(op));
}

// ---- Work ---------------------------------------------------------------------------------------

void Work::wait() {
  if (!s_) throw DistError("wait: this Work is empty (default-constructed)");
  State& s = *s_;
  if (s.stream_wait) {
    // Note [Work waits]: once its check has passed, a stream-ordered operation is waited on by
    // the default stream; the watchdog keeps testing it.
    std::lock_guard<std::mutex> l(s.mu);
    if (s.complete) return;
    if (s.detached)
      throw DistError(s.description +
                      ": the process group was destroyed before this operation was waited on");
    s.g->throw_if_failed(s.description);
    if (s.check_ok.load()) {
      if (s.flight) {
        int issued = 0;
        s.flight->state.compare_exchange_strong(issued, 3);
      }
      if (s.event) {
        s.stream->device().default_stream().wait(*s.event);
        s.event.reset();
      }
      return;
    }
  }
  wait(s.g->timeout);
}

void Work::wait(std::chrono::milliseconds timeout) {
  if (!s_) throw DistError("wait: this Work is empty (default-constructed)");
  State& s = *s_;
  internal::Group& g = *s.g;
  auto deadline = Clock::now() + timeout;
  for (;;) {
    {
      std::unique_lock<std::mutex> l(s.mu);
      if (s.complete) return;
      if (s.detached)
        throw DistError(s.description +
                        ": the process group was destroyed before this operation was waited on");
      g.throw_if_failed(s.description);
      if (!s.plugin_done.load()) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        int64_t slice = std::clamp<int64_t>(left.count(), 0, 20);
        if (bp_error* e = s.comm->api->work_wait(s.handle, slice)) {
          int32_t code = 0;
          std::string text = bp::detail::take_comm_error(s.comm->api, e, &code);
          bool running = false;
          if (code == BP_COMM_ERROR_TIMEOUT) {
            // Still running, or failed by a timeout of its own: work_test tells them apart.
            int32_t done = 0;
            if (bp_error* e2 = s.comm->api->work_test(s.handle, &done)) {
              text = bp::detail::take_comm_error(s.comm->api, e2, &code);
            } else if (done) {
              s.plugin_done = true;
              code = 0;
            } else {
              running = true;
            }
          }
          if (!running && code != 0) {
            l.unlock();
            // A mismatch makes plugins fail too; its check names the cause better: give a
            // pending check a moment to decide (Note [Collective checks]).
            if (!s.check_ok.load()) {
              std::unique_lock<std::mutex> gl(g.mu);
              g.cv.wait_until(gl, std::min(deadline, Clock::now() + std::chrono::seconds(5)),
                              [&] { return s.check_ok.load() || g.failed.load(); });
            }
            g.reap_orphans(*g.store);  // an earlier dropped Work's failure is the cause
            g.fail_from_plugin(code, s.description + ": " + text, *g.store);
            g.throw_if_failed(s.description);
          }
        } else {
          s.plugin_done = true;
        }
      }
      if (s.plugin_done.load() && s.check_ok.load()) {
        if (s.finish) {
          auto f = std::move(s.finish);
          s.finish = nullptr;
          f();
        }
        s.complete = true;
        if (s.flight) s.flight->state = 1;
        s.comm->api->work_free(s.handle);
        s.handle = nullptr;
        s.keep.clear();
        s.tensors.clear();
        g.reap_orphans(*g.store);  // earlier dropped Works' copy-backs (Note [Dropped works])
        return;
      }
    }
    if (s.plugin_done.load()) {
      std::unique_lock<std::mutex> l(g.mu);
      g.cv.wait_for(l, std::chrono::milliseconds(20),
                    [&] { return s.check_ok.load() || g.failed.load(); });
    }
    if (Clock::now() >= deadline) {
      std::string note;
      {
        std::lock_guard<std::mutex> l(g.mu);
        note = g.check_note;
      }
      std::string msg = s.description + " did not complete within " + internal::seconds(timeout);
      if (!s.check_ok.load() && !note.empty())
        msg += ": " + note;
      else if (s.plugin_done.load())
        msg += ": its descriptor check did not finish";
      else
        msg += "; a rank died or hangs inside it, or its device stalled";
      g.reap_orphans(*g.store);  // an earlier dropped Work that timed out is the cause
      g.fail(internal::FailKind::timeout, msg);
      g.throw_if_failed(s.description);
    }
  }
}

bool Work::is_completed() {
  if (!s_) throw DistError("is_completed: this Work is empty (default-constructed)");
  {
    std::lock_guard<std::mutex> l(s_->mu);
    if (s_->complete) return true;
  }
  if (s_->g->failed.load()) s_->g->throw_if_failed(s_->description);
  {
    std::unique_lock<std::mutex> l(s_->mu);
    if (!s_->plugin_done.load() && s_->handle) {
      int32_t done = 0;
      if (bp_error* e = s_->comm->api->work_test(s_->handle, &done)) {
        int32_t code = 0;
        std::string text = bp::detail::take_comm_error(s_->comm->api, e, &code);
        l.unlock();
        s_->g->fail_from_plugin(code, s_->description + ": " + text, *s_->g->store);
        s_->g->throw_if_failed(s_->description);
      }
      if (done) s_->plugin_done = true;
    }
    if (!s_->plugin_done.load() || !s_->check_ok.load()) return false;
  }
  wait(std::chrono::milliseconds(0));
  return true;
}

bool Work::staged() const {
  return s_ && s_->staged;
}

std::string Work::description() const {
  return s_ ? s_->description : std::string("(empty Work)");
}

// ---- collectives --------------------------------------------------------------------------------

using Kind = internal::Check::Kind;

Work ProcessGroup::all_reduce(const Tensor& t, ReduceOp op, Stream* stream) {
  internal::check_defined(t, "all_reduce", "");
  internal::check_reduce(t, op, "all_reduce");
  std::string ds = internal::dtype_shape(t);
  Issue is(*impl().g, "all_reduce", t.device(), stream, Kind::collective,
           "all_reduce " + ds + " " + reduce_op_name(op) + " on " + t.device().type());
  void* p = is.arg(t, true, true);
  void* ns = is.native_stream();
  uint64_t count = static_cast<uint64_t>(t.numel());
  int32_t dt = static_cast<int32_t>(t.dtype());
  return is.launch(ds + ", " + reduce_op_name(op), [&](Communicator& c, bp_comm_work** w) {
    return c.api->all_reduce(c.comm, p, p, count, dt, static_cast<int32_t>(op), ns, w);
  });
}

Work ProcessGroup::broadcast(const Tensor& t, int root, Stream* stream) {
  internal::check_defined(t, "broadcast", "");
  if (root < 0 || root >= size())
    throw DistError("broadcast: root " + std::to_string(root) + " is not a rank of this group of " +
                    std::to_string(size()) + " (0.." + std::to_string(size() - 1) + ")");
  std::string ds = internal::dtype_shape(t);
  std::string r = "root " + std::to_string(root);
  Issue is(*impl().g, "broadcast", t.device(), stream, Kind::collective,
           "broadcast " + ds + " " + r + " on " + t.device().type());
  void* p = is.arg(t, rank() == root, true);
  void* ns = is.native_stream();
  uint64_t count = static_cast<uint64_t>(t.numel());
  int32_t dt = static_cast<int32_t>(t.dtype());
  return is.launch(ds + ", " + r, [&](Communicator& c, bp_comm_work** w) {
    return c.api->broadcast(c.comm, p, p, count, dt, root, ns, w);
  });
}

Work ProcessGroup::all_gather(const Tensor& out, const Tensor& in, Stream* stream) {
  internal::check_defined(out, "all_gather", "output");
  internal::check_defined(in, "all_gather", "input");
  internal::check_pair(out, in, "all_gather");
  if (out.numel() != in.numel() * size())
    throw ShapeError("all_gather: the output " + internal::shape_text(out) + " needs " +
                     std::to_string(in.numel() * size()) + " elements (world size " +
                     std::to_string(size()) + " x input " + internal::shape_text(in) + ")");
  std::string ds = internal::dtype_shape(in);
  Issue is(*impl().g, "all_gather", in.device(), stream, Kind::collective,
           "all_gather " + ds + " on " + in.device().type());
  Tensor src = in.shares_storage(out) ? in.clone() : in;
  void* pin = is.arg(src, true, false);
  void* pout = is.arg(out, false, true);
  void* ns = is.native_stream();
  uint64_t count = static_cast<uint64_t>(in.numel());
  int32_t dt = static_cast<int32_t>(in.dtype());
  return is.launch(ds + " per rank", [&](Communicator& c, bp_comm_work** w) {
    return c.api->all_gather(c.comm, pin, pout, count, dt, ns, w);
  });
}

Work ProcessGroup::reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op,
                                  Stream* stream) {
  internal::check_defined(out, "reduce_scatter", "output");
  internal::check_defined(in, "reduce_scatter", "input");
  internal::check_pair(out, in, "reduce_scatter");
  internal::check_reduce(in, op, "reduce_scatter");
  if (in.numel() != out.numel() * size())
    throw ShapeError("reduce_scatter: the input " + internal::shape_text(in) + " needs " +
                     std::to_string(out.numel() * size()) + " elements (world size " +
                     std::to_string(size()) + " x output " + internal::shape_text(out) + ")");
  std::string ds = internal::dtype_shape(in);
  Issue is(*impl().g, "reduce_scatter", in.device(), stream, Kind::collective,
           "reduce_scatter " + ds + " " + reduce_op_name(op) + " on " + in.device().type());
  Tensor src = in.shares_storage(out) ? in.clone() : in;
  void* pin = is.arg(src, true, false);
  void* pout = is.arg(out, false, true);
  void* ns = is.native_stream();
  uint64_t count = static_cast<uint64_t>(out.numel());
  int32_t dt = static_cast<int32_t>(in.dtype());
  return is.launch(ds + ", " + reduce_op_name(op), [&](Communicator& c, bp_comm_work** w) {
    return c.api->reduce_scatter(c.comm, pin, pout, count, dt, static_cast<int32_t>(op), ns, w);
  });
}

namespace {
void check_peer(int peer, int self, int size, const char* op, const char* what) {
  if (peer < 0 || peer >= size || peer == self)
    throw DistError(std::string(op) + ": " + what + " " + std::to_string(peer) +
                    " is not another rank of this group of " + std::to_string(size) +
                    " (this is rank " + std::to_string(self) + ")");
}
}  // namespace

Work ProcessGroup::send(const Tensor& t, int dst, Stream* stream) {
  internal::check_defined(t, "send", "");
  check_peer(dst, rank(), size(), "send", "destination");
  std::string ds = internal::dtype_shape(t);
  Issue is(*impl().g, "send", t.device(), stream, Kind::p2p_post, ds + " on " + t.device().type(),
           dst);
  void* p = is.arg(t, true, false);
  void* ns = is.native_stream();
  uint64_t count = static_cast<uint64_t>(t.numel());
  int32_t dt = static_cast<int32_t>(t.dtype());
  return is.launch(
      ds + ", to rank " + std::to_string(dst) + ", transfer #" + std::to_string(is.transfer()),
      [&](Communicator& c, bp_comm_work** w) {
        return c.api->send(c.comm, p, count, dt, dst, ns, w);
      });
}

Work ProcessGroup::recv(const Tensor& t, int src, Stream* stream) {
  internal::check_defined(t, "recv", "");
  check_peer(src, rank(), size(), "recv", "source");
  std::string ds = internal::dtype_shape(t);
  Issue is(*impl().g, "recv", t.device(), stream, Kind::p2p_verify, ds + " on " + t.device().type(),
           src);
  void* p = is.arg(t, false, true);
  void* ns = is.native_stream();
  uint64_t count = static_cast<uint64_t>(t.numel());
  int32_t dt = static_cast<int32_t>(t.dtype());
  return is.launch(
      ds + ", from rank " + std::to_string(src) + ", transfer #" + std::to_string(is.transfer()),
      [&](Communicator& c, bp_comm_work** w) {
        return c.api->recv(c.comm, p, count, dt, src, ns, w);
      });
}

std::vector<Work> ProcessGroup::batch_isend_irecv(const std::vector<P2POp>& ops, Stream* stream) {
  std::vector<Work> works;
  if (ops.empty()) return works;
  internal::Group& g = *impl().g;
  std::lock_guard<std::recursive_mutex> lock(g.issue_mu);
  Device& dev = ops[0].tensor.defined() ? ops[0].tensor.device() : bp::device("cpu:0");
  struct Item {
    std::unique_ptr<Issue> is;
    void* p;
    uint64_t count;
    int32_t dtype;
    bool send;
    int peer;
    std::string what;
  };
  std::vector<Item> items;
  for (const auto& op : ops) {
    bool is_send = op.kind == P2POp::Kind::send;
    const char* name = is_send ? "send" : "recv";
    internal::check_defined(op.tensor, "batch_isend_irecv", name);
    if (&op.tensor.device() != &dev)
      throw DeviceMismatch("batch_isend_irecv: expected all tensors on one device, found " +
                           dev.str() + " and " + op.tensor.device().str());
    check_peer(op.peer, rank(), size(), name, is_send ? "destination" : "source");
    std::string ds = internal::dtype_shape(op.tensor);
    Item it;
    it.is =
        std::make_unique<Issue>(g, name, dev, stream, is_send ? Kind::p2p_post : Kind::p2p_verify,
                                ds + " on " + dev.type(), op.peer);
    it.p = it.is->arg(op.tensor, is_send, !is_send);
    it.is->defer_post();
    it.count = static_cast<uint64_t>(op.tensor.numel());
    it.dtype = static_cast<int32_t>(op.tensor.dtype());
    it.send = is_send;
    it.peer = op.peer;
    it.what = ds + (is_send ? ", to rank " : ", from rank ") + std::to_string(op.peer) +
              ", transfer #" + std::to_string(it.is->transfer()) + ", grouped";
    items.push_back(std::move(it));
  }
  Communicator& c = *items[0].is->route().comm;
  bool grouped = c.api->group_start != nullptr;
  auto check = [&](bp_error* e, const char* what) {
    if (!e) return;
    int32_t code = 0;
    std::string text = bp::detail::take_comm_error(c.api, e, &code);
    std::string msg = std::string("batch_isend_irecv on ") + g.where() + ": " + what + ": " + text;
    g.fail(internal::kind_of_code(code), msg);
    internal::raise(internal::kind_of_code(code), msg);
  };
  if (grouped) check(c.api->group_start(c.comm), "group_start");
  // Whatever fails between group_start and group_end, the plugin's group is ended before the
  // group fails (a group left open defers every later call of this thread, NCCL's included).
  bool open = grouped;
  auto end_group = [&] {
    if (!open) return;
    open = false;
    if (bp_error* e = c.api->group_end(c.comm)) bp::detail::take_comm_error(c.api, e);
  };
  try {
    for (auto& it : items) {
      it.is->before_fail(end_group);
      void* ns = it.is->native_stream();
      works.push_back(it.is->launch(it.what, [&](Communicator& cc, bp_comm_work** w) {
        return it.send ? cc.api->send(cc.comm, it.p, it.count, it.dtype, it.peer, ns, w)
                       : cc.api->recv(cc.comm, it.p, it.count, it.dtype, it.peer, ns, w);
      }));
    }
  } catch (const std::exception& e) {
    end_group();
    if (!g.failed.load())
      g.fail(internal::kind_of(e),
             std::string("batch_isend_irecv on ") + g.where() + ": " + e.what());
    throw;
  }
  if (grouped) {
    open = false;
    check(c.api->group_end(c.comm), "group_end");
  }
  for (auto& it : items) it.is->run_post();
  return works;
}

void ProcessGroup::barrier(Device* device) {
  internal::Group& g = *impl().g;
  Work w;
  {
    std::lock_guard<std::recursive_mutex> l(g.issue_mu);
    Device& dev = device ? *device : g.last_device ? *g.last_device : bp::device("cpu:0");
    Issue is(g, "barrier", dev, nullptr, Kind::collective, "barrier on " + dev.type());
    Communicator& c = *is.route().comm;
    Tensor one;
    void* p = nullptr;
    if (!c.api->barrier) {
      // The host default of the optional slot (comm_abi.h): a one-element all_reduce.
      one = zeros({1}, *c.device, DType::i32);
      p = internal::native_of(one).address;
      is.state()->tensors.push_back(one);
    }
    void* ns = is.native_stream();
    w = is.launch("one element", [&](Communicator& cc, bp_comm_work** out) {
      if (cc.api->barrier) return cc.api->barrier(cc.comm, ns, out);
      return cc.api->all_reduce(cc.comm, p, p, 1, BP_DTYPE_I32, BP_REDUCE_SUM, ns, out);
    });
  }
  w.wait();
}

}  // namespace bp::dist
