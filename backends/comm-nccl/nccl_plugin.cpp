// The NCCL communicator plugin's C table (plugins/include/backplane/abi/comm_abi.h): the only file
// that touches the ABI. Every slot converts exceptions into error objects.
#include "nccl_comm.hpp"

#include <backplane/abi/comm_abi.h>
#include <backplane/sdk/plugin_sdk.hpp>

#include <cuda_runtime_api.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

struct bp_comm {
  std::unique_ptr<bp::nccl_comm::Comm> impl;
};
struct bp_comm_work {
  std::unique_ptr<bp::nccl_comm::Work> w;
};

namespace {

constexpr const char* kName = "nccl";

template <typename F>
bp_error* guarded(F&& f) noexcept {
  return bp::sdk::guarded(kName, std::forward<F>(f));
}

template <typename F>
bp_error* start(bp_comm* comm, bp_comm_work** out_work, F&& f) noexcept {
  return guarded([&] {
    if (!comm || !out_work)
      bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT, "NULL communicator or out_work");
    auto w = std::make_unique<bp_comm_work>();
    w->w.reset(f(*comm->impl));
    *out_work = w.release();
  });
}

const char* const kTypes[] = {"cuda", nullptr};

const bp_comm_api kApi = {
    sizeof(bp_comm_api),
    BP_COMM_ABI_MAJOR,
    BP_COMM_ABI_MINOR,
    kName,
    "1.0.0",
    kTypes,
    // error_free
    [](bp_error* e) { bp::sdk::free_error(e); },
    // init: NCCL is opened here; a missing library is reported by `available`, not an error.
    []() -> bp_error* {
      bp::nccl_comm::nccl();
      return nullptr;
    },
    // shutdown
    nullptr,
    // available
    [](const char** out_reason) -> int32_t {
      const auto& lib = bp::nccl_comm::nccl();
      if (out_reason) *out_reason = lib.loaded ? lib.describe.c_str() : lib.reason.c_str();
      return lib.loaded ? 1 : 0;
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
        c->impl = std::make_unique<bp::nccl_comm::Comm>(*cfg, *host);
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
       void* stream, bp_comm_work** out) -> bp_error* {
      return start(comm, out,
                   [&](auto& c) { return c.all_reduce(send, recv, count, dtype, op, stream); });
    },
    // broadcast
    [](bp_comm* comm, const void* send, void* recv, uint64_t count, int32_t dtype, int32_t root,
       void* stream, bp_comm_work** out) -> bp_error* {
      return start(comm, out,
                   [&](auto& c) { return c.broadcast(send, recv, count, dtype, root, stream); });
    },
    // all_gather
    [](bp_comm* comm, const void* send, void* recv, uint64_t count, int32_t dtype, void* stream,
       bp_comm_work** out) -> bp_error* {
      return start(comm, out,
                   [&](auto& c) { return c.all_gather(send, recv, count, dtype, stream); });
    },
    // reduce_scatter
    [](bp_comm* comm, const void* send, void* recv, uint64_t count, int32_t dtype, int32_t op,
       void* stream, bp_comm_work** out) -> bp_error* {
      return start(comm, out,
                   [&](auto& c) { return c.reduce_scatter(send, recv, count, dtype, op, stream); });
    },
    // send
    [](bp_comm* comm, const void* buf, uint64_t count, int32_t dtype, int32_t peer, void* stream,
       bp_comm_work** out) -> bp_error* {
      return start(comm, out, [&](auto& c) { return c.send(buf, count, dtype, peer, stream); });
    },
    // recv
    [](bp_comm* comm, void* buf, uint64_t count, int32_t dtype, int32_t peer, void* stream,
       bp_comm_work** out) -> bp_error* {
      return start(comm, out, [&](auto& c) { return c.recv(buf, count, dtype, peer, stream); });
    },
    // barrier
    [](bp_comm* comm, void* stream, bp_comm_work** out) -> bp_error* {
      return start(comm, out, [&](auto& c) { return c.barrier(stream); });
    },
    // group_start
    [](bp_comm* comm) -> bp_error* { return guarded([&] { comm->impl->group_start(); }); },
    // group_end
    [](bp_comm* comm) -> bp_error* { return guarded([&] { comm->impl->group_end(); }); },
    // work_test
    [](bp_comm_work* w, int32_t* out_done) -> bp_error* {
      return guarded([&] {
        if (!w || !out_done) bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT, "NULL work or out_done");
        *out_done = 0;
        bool done = false;
        try {
          done = w->w->comm->test(*w->w);
        } catch (...) {
          *out_done = 1;  // failed: finished, with its error
          throw;
        }
        *out_done = done ? 1 : 0;
      });
    },
    // work_wait: polls the event and NCCL's asynchronous error (Note [NCCL without hangs]).
    [](bp_comm_work* w, int64_t timeout_ms) -> bp_error* {
      return guarded([&] {
        if (!w) bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT, "NULL work");
        auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
        auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
        while (!w->w->comm->test(*w->w)) {
          auto now = std::chrono::steady_clock::now();
          if (now >= deadline)
            bp::sdk::fail(static_cast<bp_error_code>(BP_COMM_ERROR_TIMEOUT),
                          "nccl " + w->w->what + " on " + w->w->comm->where() +
                              " still running after " + std::to_string(timeout_ms) + " ms");
          if (now < spin_until)
            std::this_thread::yield();
          else
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
      });
    },
    // work_free
    [](bp_comm_work* w) {
      if (!w) return;
      if (w->w && w->w->event) cudaEventDestroy(static_cast<cudaEvent_t>(w->w->event));
      delete w;
    },
};

}  // namespace

extern "C" BP_PLUGIN_EXPORT const bp_comm_api* bp_comm_get_api(uint32_t host_major, uint32_t) {
  return host_major == BP_COMM_ABI_MAJOR ? &kApi : nullptr;
}
