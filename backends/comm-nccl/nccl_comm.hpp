// The NCCL communicator: libnccl.so.2 opened at run time (NcclLib), one NCCL communicator per
// bp_comm, work handles that are CUDA events recorded after each operation.
//
// Note [NCCL without hangs]
//   By default a communicator is blocking, as PyTorch's (Note [Comm hot path] in comm_abi.h):
//   every call enqueues inline on the caller's thread and returns, and a work completes when
//   its event has passed; while it waits, ncclCommGetAsyncError reports a peer's failure
//   (ncclRemoteError) instead of a hang. Before a blocking ncclCommInitRankConfig every rank
//   counts itself in through the host's store, bounded by the timeout and abort_requested, so
//   the init only starts once every rank has arrived. With BP_COMM_CONFIG_NONBLOCKING the
//   communicator is non-blocking (ncclConfig_t::blocking = 0): init and enqueues may return
//   ncclInProgress and the plugin polls ncclCommGetAsyncError until the call has settled
//   (NCCL launches each group from a thread of its own then: tens of microseconds a call).
//   When time is up the host calls comm_abort, which runs ncclCommAbort: NCCL's kernels exit
//   and the stream moves on. NCCL's API calls on one communicator are serialised by a mutex;
//   polling loops drop it between polls, and comm_abort waits at most a second for it before
//   aborting anyway (a blocking call stuck on a dead peer holds it; ncclCommAbort is what
//   releases such a call), so comm_abort never hangs.
#pragma once

#include "nccl_api.h"

#include <backplane/abi/comm_abi.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

namespace bp::nccl_comm {

// libnccl.so.2 and the entry points the plugin uses.
struct NcclLib {
  bool loaded = false;
  std::string path;      // what was opened, or tried
  std::string reason;    // why it cannot be used; "" when loaded
  std::string describe;  // "NCCL 2.28.9 from /usr/lib/x86_64-linux-gnu/libnccl.so.2"
  int version = 0;
  ncclResult_t (*GetVersion)(int*) = nullptr;
  ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int,
                                     bp_nccl_config*) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*CommFinalize)(ncclComm_t) = nullptr;
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            bp_nccl_stream_t) = nullptr;
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            bp_nccl_stream_t) = nullptr;
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                            bp_nccl_stream_t) = nullptr;
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                bp_nccl_stream_t) = nullptr;
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t,
                       bp_nccl_stream_t) = nullptr;
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, bp_nccl_stream_t) = nullptr;
  ncclResult_t (*GroupStart)() = nullptr;
  ncclResult_t (*GroupEnd)() = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
  const char* (*GetLastError)(ncclComm_t) = nullptr;  // NCCL >= 2.13; may stay NULL
  // NCCL >= 2.27.3; NULL before (comm_shrink is then unsupported, nccl_shrink.cpp).
  ncclResult_t (*CommShrink)(ncclComm_t, int*, int, ncclComm_t*, bp_nccl_config*, int) = nullptr;
};
// Opens the library once (BACKPLANE_NCCL_LIBRARY, else libnccl.so.2). Never throws.
const NcclLib& nccl();
// Why comm_shrink cannot run with the loaded library, "" when it can (nccl_shrink.cpp).
const std::string& shrink_unsupported_reason();

class Comm;

// Note [Current device]
//   The CUDA plugin caches the calling thread's current device (its Note [Current-device
//   cache]) and skips cudaSetDevice when the cache says the device is current; a plugin that
//   moved the thread to its communicator's device behind it would make the CUDA plugin's next
//   launch on another device go to the wrong one (comm_abi.h: plugins leave the calling
//   thread's current device as they found it). So every slot that may touch CUDA holds one of
//   these: it reads the current device first and puts it back on the way out.
class KeepCurrentDevice {
 public:
  KeepCurrentDevice();
  ~KeepCurrentDevice();
  KeepCurrentDevice(const KeepCurrentDevice&) = delete;
  KeepCurrentDevice& operator=(const KeepCurrentDevice&) = delete;

 private:
  int device_ = -1;
};

// One operation: a CUDA event recorded on its stream after the NCCL call (or, inside a
// group, at group_end).
struct Work {
  Comm* comm = nullptr;
  void* event = nullptr;  // cudaEvent_t
  void* stream = nullptr;
  bool recorded = false;
  std::string what;  // "all_reduce of 1000 f32 (sum)"
};

class Comm {
 public:
  Comm(const bp_comm_config& config, const bp_comm_host& host);  // throws sdk::Failure
  // comm_shrink (nccl_shrink.cpp): the communicator of parent's ranks not in `excluded`, by
  // ncclCommShrink; BP_ERROR_UNSUPPORTED when the loaded NCCL lacks it.
  Comm(Comm& parent, const std::vector<int32_t>& excluded, const bp_comm_config& config,
       bool abort_pending);
  ~Comm();

  // Each issues one NCCL call on `stream` and returns its work (owned by the caller).
  Work* all_reduce(const void* send, void* recv, uint64_t count, int32_t dtype, int32_t op,
                   void* stream);
  Work* broadcast(const void* send, void* recv, uint64_t count, int32_t dtype, int32_t root,
                  void* stream);
  Work* all_gather(const void* send, void* recv, uint64_t count, int32_t dtype, void* stream);
  Work* reduce_scatter(const void* send, void* recv, uint64_t count, int32_t dtype, int32_t op,
                       void* stream);
  Work* send(const void* buf, uint64_t count, int32_t dtype, int32_t peer, void* stream);
  Work* recv(void* buf, uint64_t count, int32_t dtype, int32_t peer, void* stream);
  Work* barrier(void* stream);
  void group_start();
  void group_end();
  // For an operation that failed inside an open group (Note [Errors inside a group]).
  void end_group_after_error() noexcept;
  void abort();

  // work_test: true when done; throws sdk::Failure when the operation failed.
  bool test(Work& w);
  std::string where() const;

 private:
  // Waits for a non-blocking call to settle (Note [NCCL without hangs]); throws on failure.
  void settle(ncclResult_t r, const std::string& what);
  [[noreturn]] void raise(ncclResult_t r, const std::string& what);
  Work* finish_issue(const std::string& what, void* stream);
  void record_group_events(const std::vector<Work*>& works) noexcept;
  void select_device() const;
  // Blocking mode: every rank counts itself in through the store before the init.
  void arrive(const bp_comm_host& host);

  const NcclLib& lib_;
  void check_peer(const char* op, int32_t peer) const;  // INVALID_ARGUMENT unless another rank
  int rank_, size_, device_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;  // serialises NCCL calls on comm_ (Note [NCCL without hangs])
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> aborted_{false};
  bool nonblocking_ = false;  // BP_COMM_CONFIG_NONBLOCKING
  bool in_group_ = false;
  std::vector<Work*> group_works_;
  void* scratch_ = nullptr;  // one int on the device for barrier
};

}  // namespace bp::nccl_comm
