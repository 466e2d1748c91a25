// The NCCL communicator: libnccl.so.2 opened at run time (NcclLib), one non-blocking NCCL
// communicator per bp_comm, work handles that are CUDA events recorded after each operation.
//
// Note [NCCL without hangs]
//   Communicators are created non-blocking (ncclConfig_t::blocking = 0): ncclCommInitRankConfig
//   and every enqueue return at once, possibly with ncclInProgress, and the plugin polls
//   ncclCommGetAsyncError until the call has settled — bounded by the communicator's timeout
//   and by the host's abort_requested. A work completes when its event has passed; while it
//   waits, ncclCommGetAsyncError reports a peer's failure (ncclRemoteError) instead of a hang.
//   When time is up the host calls comm_abort, which runs ncclCommAbort: NCCL's kernels exit
//   and the stream moves on. NCCL's API calls on one communicator are serialised by a mutex;
//   polling loops drop it between polls so that comm_abort never waits for them.
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
  void abort();

  // work_test: true when done; throws sdk::Failure when the operation failed.
  bool test(Work& w);
  std::string where() const;

 private:
  // Waits for a non-blocking call to settle (Note [NCCL without hangs]); throws on failure.
  void settle(ncclResult_t r, const std::string& what);
  [[noreturn]] void raise(ncclResult_t r, const std::string& what);
  Work* finish_issue(const std::string& what, void* stream);
  void select_device() const;

  const NcclLib& lib_;
  void check_peer(const char* op, int32_t peer) const;  // INVALID_ARGUMENT unless another rank
  int rank_, size_, device_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;  // serialises NCCL calls on comm_ (Note [NCCL without hangs])
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> aborted_{false};
  bool in_group_ = false;
  std::vector<Work*> group_works_;
  void* scratch_ = nullptr;  // one int on the device for barrier
};

}  // namespace bp::nccl_comm
