// comm_shrink on NCCL (comm ABI 1.2, Note [Comm fault recovery] in comm_abi.h): ncclCommShrink,
// resolved with dlsym because only NCCL 2.27.3 and newer have it; with an older library the
// capability bit is off, the reason says so, and the host re-initialises instead.
#include "nccl_comm.hpp"

#include <backplane/sdk/comm_sdk.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <thread>

namespace bp::nccl_comm {

using sdk::fail;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

const std::string& shrink_unsupported_reason() {
  static const std::string reason = [] {
    const NcclLib& lib = nccl();
    if (!lib.loaded) return lib.reason;
    if (lib.CommShrink) return std::string();
    return "ncclCommShrink needs NCCL 2.27.3 or newer; " + lib.describe +
           " lacks it (the host re-initialises the communicator instead)";
  }();
  return reason;
}

Comm::Comm(Comm& parent, const std::vector<int32_t>& excluded, const bp_comm_config& cfg,
           bool abort_pending)
    : lib_(parent.lib_),
      rank_(cfg.rank),
      size_(cfg.world_size),
      device_(parent.device_),
      timeout_(milliseconds(cfg.timeout_ms)),
      nonblocking_(parent.nonblocking_) {
  KeepCurrentDevice keep;  // Note [Current device] in nccl_comm.hpp
  if (!shrink_unsupported_reason().empty()) fail(BP_ERROR_UNSUPPORTED, shrink_unsupported_reason());
  int below = 0;
  for (int32_t r : excluded) {
    if (r < 0 || r >= parent.size_ || r == parent.rank_)
      fail(BP_ERROR_INVALID_ARGUMENT, "nccl comm_shrink on " + parent.where() + ": excluded rank " +
                                          std::to_string(r) +
                                          " is not another rank of the communicator");
    if (r < parent.rank_) ++below;
  }
  const int want_size = parent.size_ - static_cast<int>(excluded.size());
  if (size_ != want_size || rank_ != parent.rank_ - below)
    fail(BP_ERROR_INVALID_ARGUMENT,
         "nccl comm_shrink on " + parent.where() + ": the new communicator is rank " +
             std::to_string(rank_) + " of " + std::to_string(size_) + ", excluding " +
             std::to_string(excluded.size()) + " rank(s) makes it rank " +
             std::to_string(parent.rank_ - below) + " of " + std::to_string(want_size));
  select_device();
  std::vector<int> ex(excluded.begin(), excluded.end());
  bp_nccl_config config = BP_NCCL_CONFIG_INITIALIZER;
  config.blocking = nonblocking_ ? 0 : 1;  // the parent's mode (Note [NCCL without hangs])
  ncclResult_t r;
  {
    std::lock_guard<std::mutex> l(parent.mu_);
    if (parent.aborted_.load() || !parent.comm_)
      fail(static_cast<bp_error_code>(BP_COMM_ERROR_ABORTED),
           "nccl comm_shrink on " + parent.where() +
               ": the communicator was aborted; re-initialise it instead");
    r = lib_.CommShrink(parent.comm_, ex.data(), static_cast<int>(ex.size()), &comm_, &config,
                        abort_pending ? BP_NCCL_SHRINK_ABORT : BP_NCCL_SHRINK_DEFAULT);
  }
  const auto deadline = Clock::now() + timeout_;
  while (r == ncclInProgress ||
         (r == ncclSuccess && comm_ && lib_.CommGetAsyncError(comm_, &r) == ncclSuccess &&
          r == ncclInProgress)) {
    if (Clock::now() > deadline) {
      if (comm_) lib_.CommAbort(comm_);
      comm_ = nullptr;
      fail(static_cast<bp_error_code>(BP_COMM_ERROR_TIMEOUT),
           "nccl comm_shrink to " + std::to_string(size_) + " ranks on " + where() +
               " did not complete within " + std::to_string(timeout_.count()) +
               " ms (a remaining rank did not call it)");
    }
    std::this_thread::sleep_for(milliseconds(1));
    if (comm_ && lib_.CommGetAsyncError(comm_, &r) != ncclSuccess) r = ncclInternalError;
  }
  if (r != ncclSuccess) {
    ncclComm_t failed = comm_;
    comm_ = nullptr;
    if (failed) lib_.CommAbort(failed);
    raise(r, "comm_shrink (ncclCommShrink)");
  }
  cudaError_t e = cudaMalloc(&scratch_, sizeof(int));
  if (e != cudaSuccess) {
    lib_.CommAbort(comm_);
    comm_ = nullptr;
    fail(BP_ERROR_DEVICE,
         std::string("cudaMalloc of the barrier's scratch failed: ") + cudaGetErrorString(e));
  }
}

}  // namespace bp::nccl_comm
