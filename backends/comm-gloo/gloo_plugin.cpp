// The Gloo communicator plugin's C table (plugins/include/backplane/abi/comm_abi.h): the only
// file that touches the ABI. Every slot converts exceptions into error objects.
#include "gloo_comm.hpp"

#include <backplane/abi/comm_abi.h>
#include <backplane/sdk/plugin_sdk.hpp>

#include <gloo/config.h>

#include <memory>
#include <string>

struct bp_comm {
  std::unique_ptr<bp::gloo_comm::Comm> impl;
};
struct bp_comm_work {
  std::shared_ptr<bp::gloo_comm::Op> op;
};

namespace {

constexpr const char* kName = "gloo";

template <typename F>
bp_error* guarded(F&& f) noexcept {
  return bp::sdk::guarded(kName, std::forward<F>(f));
}

bp_error* op_error(const bp::gloo_comm::Op& op) {
  return bp::sdk::make_error(kName, op.code, op.message, op.native);
}

// Wraps an operation in a work handle.
template <typename F>
bp_error* start(bp_comm* comm, bp_comm_work** out_work, F&& f) noexcept {
  return guarded([&] {
    if (!comm || !out_work)
      bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT, "NULL communicator or out_work");
    auto w = std::make_unique<bp_comm_work>();
    w->op = f(*comm->impl);
    *out_work = w.release();
  });
}

const char* const kTypes[] = {"cpu", nullptr};

const char* library_text() {
  static const std::string s = "Gloo " + std::to_string(GLOO_VERSION_MAJOR) + "." +
                               std::to_string(GLOO_VERSION_MINOR) + "." +
                               std::to_string(GLOO_VERSION_PATCH) + " (TCP transport)";
  return s.c_str();
}

const bp_comm_api kApi = {
    sizeof(bp_comm_api),
    BP_COMM_ABI_MAJOR,
    BP_COMM_ABI_MINOR,
    kName,
    "1.0.0",
    kTypes,
    // error_free
    [](bp_error* e) { bp::sdk::free_error(e); },
    // init: libgloo is linked; nothing to load.
    []() -> bp_error* { return nullptr; },
    // shutdown
    nullptr,
    // available
    [](const char** out_reason) -> int32_t {
      if (out_reason) *out_reason = library_text();
      return 1;
    },
    // comm_create
    [](const bp_comm_config* cfg, const bp_comm_host* host, bp_comm** out) -> bp_error* {
      return guarded([&] {
        if (!cfg || !host || !out) bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT, "NULL argument");
        if (cfg->struct_size < sizeof(bp_comm_config) || host->struct_size < sizeof(bp_comm_host))
          bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT, "bp_comm_config or bp_comm_host too small");
        if (cfg->world_size < 1 || cfg->rank < 0 || cfg->rank >= cfg->world_size)
          bp::sdk::fail(
              BP_ERROR_INVALID_ARGUMENT,
              bp::sdk::format("rank %d is not in a world of %d", cfg->rank, cfg->world_size));
        if (cfg->timeout_ms <= 0)
          bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT, "timeout_ms must be positive");
        auto c = std::make_unique<bp_comm>();
        c->impl = std::make_unique<bp::gloo_comm::Comm>(*cfg, *host);
        *out = c.release();
      });
    },
    // comm_destroy
    [](bp_comm* comm) -> bp_error* { return guarded([&] { delete comm; }); },
    // comm_abort
    [](bp_comm* comm) -> bp_error* {
      return guarded([&] {
        if (comm) comm->impl->abort();
      });
    },
    // all_reduce
    [](bp_comm* comm, const void* send, void* recv, uint64_t count, int32_t dtype, int32_t op,
       void*, bp_comm_work** out) -> bp_error* {
      return start(comm, out, [&](auto& c) { return c.all_reduce(send, recv, count, dtype, op); });
    },
    // broadcast
    [](bp_comm* comm, const void* send, void* recv, uint64_t count, int32_t dtype, int32_t root,
       void*, bp_comm_work** out) -> bp_error* {
      return start(comm, out, [&](auto& c) { return c.broadcast(send, recv, count, dtype, root); });
    },
    // all_gather
    [](bp_comm* comm, const void* send, void* recv, uint64_t count, int32_t dtype, void*,
       bp_comm_work** out) -> bp_error* {
      return start(comm, out, [&](auto& c) { return c.all_gather(send, recv, count, dtype); });
    },
    // reduce_scatter
    [](bp_comm* comm, const void* send, void* recv, uint64_t count, int32_t dtype, int32_t op,
       void*, bp_comm_work** out) -> bp_error* {
      return start(comm, out,
                   [&](auto& c) { return c.reduce_scatter(send, recv, count, dtype, op); });
    },
    // send
    [](bp_comm* comm, const void* buf, uint64_t count, int32_t dtype, int32_t peer, void*,
       bp_comm_work** out) -> bp_error* {
      return start(comm, out, [&](auto& c) { return c.send(buf, count, dtype, peer); });
    },
    // recv
    [](bp_comm* comm, void* buf, uint64_t count, int32_t dtype, int32_t peer, void*,
       bp_comm_work** out) -> bp_error* {
      return start(comm, out, [&](auto& c) { return c.recv(buf, count, dtype, peer); });
    },
    // barrier
    [](bp_comm* comm, void*, bp_comm_work** out) -> bp_error* {
      return start(comm, out, [&](auto& c) { return c.barrier(); });
    },
    // group_start, group_end: sends and receives are posted at once (Note [Gloo threads])
    nullptr,
    nullptr,
    // work_test
    [](bp_comm_work* w, int32_t* out_done) -> bp_error* {
      if (!w || !out_done)
        return bp::sdk::make_error(kName, BP_ERROR_INVALID_ARGUMENT, "NULL work or out_done", "");
      std::lock_guard<std::mutex> l(w->op->mu);
      *out_done = w->op->done ? 1 : 0;
      return w->op->done && w->op->code ? op_error(*w->op) : nullptr;
    },
    // work_wait
    [](bp_comm_work* w, int64_t timeout_ms) -> bp_error* {
      if (!w) return bp::sdk::make_error(kName, BP_ERROR_INVALID_ARGUMENT, "NULL work", "");
      if (!w->op->wait_for(std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms)))
        return bp::sdk::make_error(
            kName, BP_COMM_ERROR_TIMEOUT,
            "gloo " + w->op->what + " still running after " + std::to_string(timeout_ms) + " ms",
            "");
      std::lock_guard<std::mutex> l(w->op->mu);
      return w->op->code ? op_error(*w->op) : nullptr;
    },
    // work_free
    [](bp_comm_work* w) { delete w; },
};

}  // namespace

extern "C" BP_PLUGIN_EXPORT const bp_comm_api* bp_comm_get_api(uint32_t host_major, uint32_t) {
  return host_major == BP_COMM_ABI_MAJOR ? &kApi : nullptr;
}
