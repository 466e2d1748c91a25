// The Gloo communicator plugin: its backend class for the communicator SDK (backplane/sdk/
// comm_sdk.hpp), which fills the C table (backplane/abi/comm_abi.h) and turns exceptions into
// error objects. The work itself is gloo_comm.cpp's.
#include "gloo_comm.hpp"

#include <backplane/sdk/comm_sdk.hpp>

#include <gloo/config.h>

#include <memory>
#include <mutex>
#include <string>

namespace bp::gloo_comm {
namespace {

// A queued Gloo operation (Note [Gloo threads] in gloo_comm.cpp: it runs on the comm's thread).
class GlooWork final : public sdk::CommWork {
 public:
  explicit GlooWork(std::shared_ptr<Op> op) : op_(std::move(op)) {}
  bool test() override {
    std::lock_guard<std::mutex> l(op_->mu);
    return op_->done && finished();
  }
  bool wait(std::chrono::milliseconds timeout) override {
    if (!op_->wait_for(timeout)) return false;
    std::lock_guard<std::mutex> l(op_->mu);
    return finished();
  }
  std::string describe() const override { return op_->what; }

 private:
  // Called with the lock held on a finished operation: its error, if any, as a Failure.
  bool finished() const {
    if (op_->code) sdk::fail(static_cast<bp_error_code>(op_->code), op_->message, op_->native);
    return true;
  }
  std::shared_ptr<Op> op_;
};

class GlooCommunicator final : public sdk::Communicator {
 public:
  GlooCommunicator(const bp_comm_config& config, const bp_comm_host& host) : comm_(config, host) {}
  void abort() override { comm_.abort(); }
  std::unique_ptr<sdk::CommWork> all_reduce(const void* send, void* recv, uint64_t count,
                                            int32_t dtype, int32_t op, void*) override {
    return work(comm_.all_reduce(send, recv, count, dtype, op));
  }
  std::unique_ptr<sdk::CommWork> broadcast(const void* send, void* recv, uint64_t count,
                                           int32_t dtype, int32_t root, void*) override {
    return work(comm_.broadcast(send, recv, count, dtype, root));
  }
  std::unique_ptr<sdk::CommWork> all_gather(const void* send, void* recv, uint64_t count,
                                            int32_t dtype, void*) override {
    return work(comm_.all_gather(send, recv, count, dtype));
  }
  std::unique_ptr<sdk::CommWork> reduce_scatter(const void* send, void* recv, uint64_t count,
                                                int32_t dtype, int32_t op, void*) override {
    return work(comm_.reduce_scatter(send, recv, count, dtype, op));
  }
  std::unique_ptr<sdk::CommWork> send(const void* buf, uint64_t count, int32_t dtype, int32_t peer,
                                      void*) override {
    return work(comm_.send(buf, count, dtype, peer));
  }
  std::unique_ptr<sdk::CommWork> recv(void* buf, uint64_t count, int32_t dtype, int32_t peer,
                                      void*) override {
    return work(comm_.recv(buf, count, dtype, peer));
  }
  std::unique_ptr<sdk::CommWork> barrier(void*) override { return work(comm_.barrier()); }

 private:
  static std::unique_ptr<sdk::CommWork> work(std::shared_ptr<Op> op) {
    return std::make_unique<GlooWork>(std::move(op));
  }
  Comm comm_;
};

}  // namespace

// libgloo is linked: nothing to load. Sends and receives are posted at once (Note [Gloo
// threads]), so the plugin needs no groups.
class GlooBackend final : public sdk::CommBackend {
 public:
  static constexpr const char* kName = "gloo";
  static constexpr const char* kVersion = "1.0.0";
  static constexpr const char* const kDeviceTypes[] = {"cpu", nullptr};

  bool available(const char** reason) override {
    static const std::string s = "Gloo " + std::to_string(GLOO_VERSION_MAJOR) + "." +
                                 std::to_string(GLOO_VERSION_MINOR) + "." +
                                 std::to_string(GLOO_VERSION_PATCH) + " (TCP transport)";
    *reason = s.c_str();
    return true;
  }
  std::unique_ptr<sdk::Communicator> create(const bp_comm_config& config,
                                            const bp_comm_host& host) override {
    return std::make_unique<GlooCommunicator>(config, host);
  }
  // Gloo has no shrink: after a failure the host creates a new context among the survivors
  // under a new key prefix (Note [Comm fault recovery] in comm_abi.h).
  uint64_t capabilities(const char** reason) override {
    *reason = "Gloo cannot shrink a context; the survivors build a new one (re-initialisation)";
    return BP_COMM_CAP_ABORT_ANY_THREAD | BP_COMM_CAP_REINIT;
  }
};

}  // namespace bp::gloo_comm

BP_COMM_PLUGIN(bp::gloo_comm::GlooBackend)
