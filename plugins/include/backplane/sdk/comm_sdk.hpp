// The C++ SDK of communicator plugins (backplane/abi/comm_abi.h), header-only: a plugin is a
// CommBackend subclass plus BP_COMM_PLUGIN(ThatClass). The SDK fills the bp_comm_api table,
// checks the arguments every slot gets, and turns exceptions into error objects (sdk::Failure
// keeps its code; std::bad_alloc is BP_ERROR_OUT_OF_MEMORY; anything else BP_ERROR_INTERNAL),
// so no exception crosses the ABI.
//
//   class MyBackend final : public bp::sdk::CommBackend {
//    public:
//     static constexpr const char* kName = "mine";       // libbackplane-comm-mine.so
//     static constexpr const char* kVersion = "1.0.0";
//     static constexpr const char* const kDeviceTypes[] = {"cpu", nullptr};
//     bool available(const char** reason) override;
//     std::unique_ptr<bp::sdk::Communicator> create(const bp_comm_config&,
//                                                   const bp_comm_host&) override;
//   };
//   BP_COMM_PLUGIN(MyBackend)
#ifndef BACKPLANE_SDK_COMM_SDK_HPP_
#define BACKPLANE_SDK_COMM_SDK_HPP_

#include <backplane/abi/comm_abi.h>
#include <backplane/sdk/plugin_sdk.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace bp::sdk {

// bp_comm_config::flags when the host filled them (1.1), else 0 (a 1.0 host).
inline uint32_t config_flags(const bp_comm_config& c) {
  return c.struct_size >= offsetof(bp_comm_config, flags) + sizeof(c.flags) ? c.flags : 0u;
}

// One queued operation (a bp_comm_work).
class CommWork {
 public:
  virtual ~CommWork() = default;
  // True once the operation has finished; throws Failure with its error once it has failed.
  virtual bool test() = 0;
  // Waits up to `timeout` for the operation: false while it still runs; throws as test() does.
  // The default polls test(), yielding for the first 200 us and then sleeping 50 us at a time.
  virtual bool wait(std::chrono::milliseconds timeout) {
    const auto start = std::chrono::steady_clock::now();
    while (!test()) {
      const auto waited = std::chrono::steady_clock::now() - start;
      if (waited >= timeout) return false;
      if (waited < std::chrono::microseconds(200))
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return true;
  }
  // What the operation is, for messages: "all_reduce of 1000 f32 (sum) on cuda:0".
  virtual std::string describe() const = 0;
};

// One rank's endpoint of a communicator (a bp_comm). Each collective queues one operation with
// the comm ABI's semantics (Note [Comm memory]) and returns its work; `stream` is the device
// stream for stream-ordered backends (NULL otherwise). Throw Failure for errors.
class Communicator {
 public:
  virtual ~Communicator() = default;
  // comm_abort: thread-safe, also while another thread issues or waits on an operation.
  virtual void abort() = 0;
  virtual std::unique_ptr<CommWork> all_reduce(const void* send, void* recv, uint64_t count,
                                               int32_t dtype, int32_t op, void* stream) = 0;
  virtual std::unique_ptr<CommWork> broadcast(const void* send, void* recv, uint64_t count,
                                              int32_t dtype, int32_t root, void* stream) = 0;
  virtual std::unique_ptr<CommWork> all_gather(const void* send, void* recv, uint64_t send_count,
                                               int32_t dtype, void* stream) = 0;
  virtual std::unique_ptr<CommWork> reduce_scatter(const void* send, void* recv,
                                                   uint64_t recv_count, int32_t dtype, int32_t op,
                                                   void* stream) = 0;
  virtual std::unique_ptr<CommWork> send(const void* buf, uint64_t count, int32_t dtype,
                                         int32_t peer, void* stream) = 0;
  virtual std::unique_ptr<CommWork> recv(void* buf, uint64_t count, int32_t dtype, int32_t peer,
                                         void* stream) = 0;
  virtual std::unique_ptr<CommWork> barrier(void* stream) = 0;
  // group_start / group_end, called only when the backend's has_groups() is true.
  virtual void group_start() {}
  virtual void group_end() {}
  // comm_shrink (comm ABI 1.2): the communicator of the ranks not in `excluded` (checked:
  // distinct, in range, not this rank; config's world size and rank match), after aborting the
  // pending operations when `abort_pending`. The default refuses with BP_ERROR_UNSUPPORTED.
  virtual std::unique_ptr<Communicator> shrink(const std::vector<int32_t>& excluded,
                                               const bp_comm_config& config, bool abort_pending) {
    (void)excluded;
    (void)config;
    (void)abort_pending;
    fail(BP_ERROR_UNSUPPORTED, "this communicator cannot shrink; re-initialise it instead");
  }
};

// A communicator plugin: one object per process, made on first use of the table.
class CommBackend {
 public:
  virtual ~CommBackend() = default;
  // init: loads what the backend needs. A missing vendor library is not an error here:
  // available() reports it.
  virtual void init() {}
  // available: never throws; *reason (static, or valid while the plugin is loaded) names the
  // library found or why none can be used.
  virtual bool available(const char** reason) = 0;
  // comm_create, with the config and host already checked (sizes, rank in the world, timeout).
  virtual std::unique_ptr<Communicator> create(const bp_comm_config& config,
                                               const bp_comm_host& host) = 0;
  // True to expose group_start / group_end (stream backends whose send and recv must be
  // issued together); false leaves both slots NULL, the ABI's default.
  virtual bool has_groups() const { return false; }
  // capabilities (comm ABI 1.2): bp_comm_capability bits; *reason says why one is missing.
  // The default: abort from any thread and re-initialisation, no shrink.
  virtual uint64_t capabilities(const char** reason) {
    *reason = "the plugin cannot shrink a communicator; the host re-initialises one instead";
    return BP_COMM_CAP_ABORT_ANY_THREAD | BP_COMM_CAP_REINIT;
  }
};

}  // namespace bp::sdk

struct bp_comm {
  std::unique_ptr<bp::sdk::Communicator> impl;
};
struct bp_comm_work {
  std::unique_ptr<bp::sdk::CommWork> impl;
};

namespace bp::sdk::comm_detail {

// The table of backend B (Note: B provides kName, kVersion, kDeviceTypes).
template <typename B>
struct Table {
  static B& backend() {
    static B* b = new B();  // lives as long as the process: slots may run during exit
    return *b;
  }
  template <typename F>
  static bp_error* guard(F&& f) noexcept {
    return bp::sdk::guarded(B::kName, std::forward<F>(f));
  }
  template <typename F>
  static bp_error* start(bp_comm* comm, bp_comm_work** out_work, F&& f) noexcept {
    return guard([&] {
      if (!comm || !out_work) fail(BP_ERROR_INVALID_ARGUMENT, "NULL communicator or out_work");
      auto w = std::make_unique<bp_comm_work>();
      w->impl = f(*comm->impl);
      if (!w->impl) fail(BP_ERROR_INTERNAL, "the backend returned no work");
      *out_work = w.release();
    });
  }

  static void error_free(bp_error* e) { free_error(e); }
  static bp_error* init() {
    return guard([] { backend().init(); });
  }
  static int32_t available(const char** out_reason) {
    const char* reason = "";
    bool ok = false;
    try {
      ok = backend().available(&reason);
    } catch (...) {
      ok = false;
      reason = "the backend's availability check failed";
    }
    if (out_reason) *out_reason = reason;
    return ok ? 1 : 0;
  }
  static bp_error* comm_create(const bp_comm_config* cfg, const bp_comm_host* host, bp_comm** out) {
    return guard([&] {
      if (!cfg || !host || !out) fail(BP_ERROR_INVALID_ARGUMENT, "NULL argument");
      // A 1.0 host's config ends at local_address (Note [Comm ABI versioning]).
      if (cfg->struct_size < offsetof(bp_comm_config, flags) ||
          host->struct_size < sizeof(bp_comm_host))
        fail(BP_ERROR_INVALID_ARGUMENT, "bp_comm_config or bp_comm_host too small");
      if (cfg->world_size < 1 || cfg->rank < 0 || cfg->rank >= cfg->world_size)
        fail(BP_ERROR_INVALID_ARGUMENT,
             format("rank %d is not in a world of %d", cfg->rank, cfg->world_size));
      if (cfg->timeout_ms <= 0) fail(BP_ERROR_INVALID_ARGUMENT, "timeout_ms must be positive");
      auto c = std::make_unique<bp_comm>();
      c->impl = backend().create(*cfg, *host);
      *out = c.release();
    });
  }
  static bp_error* comm_destroy(bp_comm* comm) {
    return guard([&] { delete comm; });
  }
  static bp_error* comm_abort(bp_comm* comm) {
    return guard([&] {
      if (comm) comm->impl->abort();
    });
  }
  static bp_error* all_reduce(bp_comm* comm, const void* send, void* recv, uint64_t count,
                              int32_t dtype, int32_t op, void* stream, bp_comm_work** out) {
    return start(comm, out, [&](Communicator& c) {
      return c.all_reduce(send, recv, count, dtype, op, stream);
    });
  }
  static bp_error* broadcast(bp_comm* comm, const void* send, void* recv, uint64_t count,
                             int32_t dtype, int32_t root, void* stream, bp_comm_work** out) {
    return start(comm, out, [&](Communicator& c) {
      return c.broadcast(send, recv, count, dtype, root, stream);
    });
  }
  static bp_error* all_gather(bp_comm* comm, const void* send, void* recv, uint64_t count,
                              int32_t dtype, void* stream, bp_comm_work** out) {
    return start(comm, out,
                 [&](Communicator& c) { return c.all_gather(send, recv, count, dtype, stream); });
  }
  static bp_error* reduce_scatter(bp_comm* comm, const void* send, void* recv, uint64_t count,
                                  int32_t dtype, int32_t op, void* stream, bp_comm_work** out) {
    return start(comm, out, [&](Communicator& c) {
      return c.reduce_scatter(send, recv, count, dtype, op, stream);
    });
  }
  static bp_error* send(bp_comm* comm, const void* buf, uint64_t count, int32_t dtype, int32_t peer,
                        void* stream, bp_comm_work** out) {
    return start(comm, out,
                 [&](Communicator& c) { return c.send(buf, count, dtype, peer, stream); });
  }
  static bp_error* recv(bp_comm* comm, void* buf, uint64_t count, int32_t dtype, int32_t peer,
                        void* stream, bp_comm_work** out) {
    return start(comm, out,
                 [&](Communicator& c) { return c.recv(buf, count, dtype, peer, stream); });
  }
  static bp_error* barrier(bp_comm* comm, void* stream, bp_comm_work** out) {
    return start(comm, out, [&](Communicator& c) { return c.barrier(stream); });
  }
  static bp_error* group_start(bp_comm* comm) {
    return guard([&] {
      if (!comm) fail(BP_ERROR_INVALID_ARGUMENT, "NULL communicator");
      comm->impl->group_start();
    });
  }
  static bp_error* group_end(bp_comm* comm) {
    return guard([&] {
      if (!comm) fail(BP_ERROR_INVALID_ARGUMENT, "NULL communicator");
      comm->impl->group_end();
    });
  }
  static bp_error* work_test(bp_comm_work* w, int32_t* out_done) {
    return guard([&] {
      if (!w || !out_done) fail(BP_ERROR_INVALID_ARGUMENT, "NULL work or out_done");
      *out_done = 0;
      try {
        *out_done = w->impl->test() ? 1 : 0;
      } catch (...) {
        *out_done = 1;  // failed: finished, with its error
        throw;
      }
    });
  }
  static bp_error* work_wait(bp_comm_work* w, int64_t timeout_ms) {
    return guard([&] {
      if (!w) fail(BP_ERROR_INVALID_ARGUMENT, "NULL work");
      if (!w->impl->wait(std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms)))
        fail(static_cast<bp_error_code>(BP_COMM_ERROR_TIMEOUT),
             std::string(B::kName) + " " + w->impl->describe() + " still running after " +
                 std::to_string(timeout_ms) + " ms");
    });
  }
  static void work_free(bp_comm_work* w) { delete w; }
  static uint64_t capabilities(const char** out_reason) {
    const char* reason = "";
    uint64_t bits = 0;
    try {
      bits = backend().capabilities(&reason);
    } catch (...) {
      bits = BP_COMM_CAP_ABORT_ANY_THREAD;
      reason = "the backend's capability check failed";
    }
    if (out_reason) *out_reason = reason;
    return bits;
  }
  static bp_error* comm_shrink(bp_comm* comm, const int32_t* excluded, int32_t excluded_count,
                               const bp_comm_config* cfg, int32_t abort_pending, bp_comm** out) {
    return guard([&] {
      if (!comm || !cfg || !out || (excluded_count > 0 && !excluded) || excluded_count < 0)
        fail(BP_ERROR_INVALID_ARGUMENT, "NULL argument or negative excluded_count");
      if (cfg->struct_size < sizeof(bp_comm_config))
        fail(BP_ERROR_INVALID_ARGUMENT, "bp_comm_config too small");
      if (cfg->world_size < 1 || cfg->rank < 0 || cfg->rank >= cfg->world_size)
        fail(BP_ERROR_INVALID_ARGUMENT,
             format("rank %d is not in a world of %d", cfg->rank, cfg->world_size));
      if (cfg->timeout_ms <= 0) fail(BP_ERROR_INVALID_ARGUMENT, "timeout_ms must be positive");
      std::vector<int32_t> ex(excluded, excluded + excluded_count);
      for (size_t i = 0; i < ex.size(); ++i)
        for (size_t j = 0; j < i; ++j)
          if (ex[i] == ex[j])
            fail(BP_ERROR_INVALID_ARGUMENT, format("rank %d excluded twice", ex[i]));
      auto c = std::make_unique<bp_comm>();
      c->impl = comm->impl->shrink(ex, *cfg, abort_pending != 0);
      if (!c->impl) fail(BP_ERROR_INTERNAL, "the backend returned no communicator");
      *out = c.release();
    });
  }

  static const bp_comm_api* api() {
    static const bp_comm_api table = [] {
      bp_comm_api t{};
      t.struct_size = sizeof(bp_comm_api);
      t.abi_major = BP_COMM_ABI_MAJOR;
      t.abi_minor = BP_COMM_ABI_MINOR;
      t.name = B::kName;
      t.version = B::kVersion;
      t.device_types = B::kDeviceTypes;
      t.error_free = &error_free;
      t.init = &init;
      t.shutdown = nullptr;
      t.available = &available;
      t.comm_create = &comm_create;
      t.comm_destroy = &comm_destroy;
      t.comm_abort = &comm_abort;
      t.all_reduce = &all_reduce;
      t.broadcast = &broadcast;
      t.all_gather = &all_gather;
      t.reduce_scatter = &reduce_scatter;
      t.send = &send;
      t.recv = &recv;
      t.barrier = &barrier;
      t.group_start = backend().has_groups() ? &group_start : nullptr;
      t.group_end = backend().has_groups() ? &group_end : nullptr;
      t.work_test = &work_test;
      t.work_wait = &work_wait;
      t.work_free = &work_free;
      t.capabilities = &capabilities;
      t.comm_shrink = &comm_shrink;
      return t;
    }();
    return &table;
  }
};

}  // namespace bp::sdk::comm_detail

// Defines the plugin's one exported symbol for backend class `Backend` (a CommBackend subclass
// with static kName, kVersion and kDeviceTypes). The table is made on first call.
#define BP_COMM_PLUGIN(Backend)                                                             \
  extern "C" BP_PLUGIN_EXPORT const bp_comm_api* bp_comm_get_api(uint32_t host_major,       \
                                                                 uint32_t /*host_minor*/) { \
    return host_major == BP_COMM_ABI_MAJOR ? bp::sdk::comm_detail::Table<Backend>::api()    \
                                           : nullptr;                                       \
  }

#endif  // BACKPLANE_SDK_COMM_SDK_HPP_
