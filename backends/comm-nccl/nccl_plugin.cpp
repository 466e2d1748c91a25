// The NCCL communicator plugin: its backend class for the communicator SDK (backplane/sdk/
// comm_sdk.hpp), which fills the C table (backplane/abi/comm_abi.h) and turns exceptions into
// error objects. The work itself is nccl_comm.cpp's.
#include "nccl_comm.hpp"

#include <backplane/sdk/comm_sdk.hpp>

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

namespace bp::nccl_comm {
namespace {

// A queued NCCL call: done when its event has fired; test() also polls NCCL's asynchronous
// error (Note [NCCL without hangs]).
class NcclWork final : public sdk::CommWork {
 public:
  explicit NcclWork(Work* w) : w_(w) {}
  ~NcclWork() override {
    KeepCurrentDevice keep;  // Note [Current device] in nccl_comm.hpp
    if (w_->event) cudaEventDestroy(static_cast<cudaEvent_t>(w_->event));
  }
  bool test() override {
    KeepCurrentDevice keep;
    return w_->comm->test(*w_);
  }
  std::string describe() const override { return w_->what + " on " + w_->comm->where(); }

 private:
  std::unique_ptr<Work> w_;
};

class NcclCommunicator final : public sdk::Communicator {
 public:
  NcclCommunicator(const bp_comm_config& config, const bp_comm_host& host) : comm_(config, host) {}
  NcclCommunicator(Comm& parent, const std::vector<int32_t>& excluded, const bp_comm_config& config,
                   bool abort_pending)
      : comm_(parent, excluded, config, abort_pending) {}
  std::unique_ptr<sdk::Communicator> shrink(const std::vector<int32_t>& excluded,
                                            const bp_comm_config& config,
                                            bool abort_pending) override {
    return std::make_unique<NcclCommunicator>(comm_, excluded, config, abort_pending);
  }
  void abort() override {
    KeepCurrentDevice keep;  // Note [Current device] in nccl_comm.hpp
    comm_.abort();
  }
  std::unique_ptr<sdk::CommWork> all_reduce(const void* send, void* recv, uint64_t count,
                                            int32_t dtype, int32_t op, void* stream) override {
    return issue([&] { return comm_.all_reduce(send, recv, count, dtype, op, stream); });
  }
  std::unique_ptr<sdk::CommWork> broadcast(const void* send, void* recv, uint64_t count,
                                           int32_t dtype, int32_t root, void* stream) override {
    return issue([&] { return comm_.broadcast(send, recv, count, dtype, root, stream); });
  }
  std::unique_ptr<sdk::CommWork> all_gather(const void* send, void* recv, uint64_t count,
                                            int32_t dtype, void* stream) override {
    return issue([&] { return comm_.all_gather(send, recv, count, dtype, stream); });
  }
  std::unique_ptr<sdk::CommWork> reduce_scatter(const void* send, void* recv, uint64_t count,
                                                int32_t dtype, int32_t op, void* stream) override {
    return issue([&] { return comm_.reduce_scatter(send, recv, count, dtype, op, stream); });
  }
  std::unique_ptr<sdk::CommWork> send(const void* buf, uint64_t count, int32_t dtype, int32_t peer,
                                      void* stream) override {
    return issue([&] { return comm_.send(buf, count, dtype, peer, stream); });
  }
  std::unique_ptr<sdk::CommWork> recv(void* buf, uint64_t count, int32_t dtype, int32_t peer,
                                      void* stream) override {
    return issue([&] { return comm_.recv(buf, count, dtype, peer, stream); });
  }
  std::unique_ptr<sdk::CommWork> barrier(void* stream) override {
    return issue([&] { return comm_.barrier(stream); });
  }
  void group_start() override {
    KeepCurrentDevice keep;
    comm_.group_start();
  }
  void group_end() override {
    KeepCurrentDevice keep;
    comm_.group_end();
  }

 private:
  static std::unique_ptr<sdk::CommWork> work(Work* w) { return std::make_unique<NcclWork>(w); }
  // An error inside an open group ends it (Note [Errors inside a group] in nccl_comm.cpp).
  template <typename F>
  std::unique_ptr<sdk::CommWork> issue(F&& f) {
    KeepCurrentDevice keep;  // Note [Current device] in nccl_comm.hpp
    try {
      return work(f());
    } catch (...) {
      comm_.end_group_after_error();
      throw;
    }
  }
  Comm comm_;
};

}  // namespace

// NCCL is opened in init; a missing library is reported by available(), not an error.
class NcclBackend final : public sdk::CommBackend {
 public:
  static constexpr const char* kName = "nccl";
  static constexpr const char* kVersion = "1.0.0";
  static constexpr const char* const kDeviceTypes[] = {"cuda", nullptr};

  void init() override { nccl(); }
  bool available(const char** reason) override {
    const auto& lib = nccl();
    *reason = lib.loaded ? lib.describe.c_str() : lib.reason.c_str();
    return lib.loaded;
  }
  std::unique_ptr<sdk::Communicator> create(const bp_comm_config& config,
                                            const bp_comm_host& host) override {
    return std::make_unique<NcclCommunicator>(config, host);
  }
  bool has_groups() const override { return true; }
  // Shrink where the loaded NCCL has ncclCommShrink (>= 2.27.3); re-initialisation always.
  uint64_t capabilities(const char** reason) override {
    const std::string& why = shrink_unsupported_reason();
    *reason = why.c_str();
    return BP_COMM_CAP_ABORT_ANY_THREAD | BP_COMM_CAP_REINIT |
           (why.empty() ? BP_COMM_CAP_SHRINK : 0);
  }
};

}  // namespace bp::nccl_comm

BP_COMM_PLUGIN(bp::nccl_comm::NcclBackend)
