// The NCCL communicator (Note [NCCL without hangs] in nccl_comm.hpp).
#include "nccl_comm.hpp"

#include <backplane/sdk/comm_sdk.hpp>
#include <backplane/sdk/plugin_sdk.hpp>

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <thread>

namespace bp::nccl_comm {

namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using sdk::fail;

const char* result_name(ncclResult_t r) {
  static const char* const names[] = {
      "ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
      "ncclInvalidArgument", "ncclInvalidUsage",       "ncclRemoteError", "ncclInProgress"};
  return r >= 0 && r < ncclNumResults ? names[r] : "ncclUnknownResult";
}

int32_t code_of(ncclResult_t r) {
  switch (r) {
    case ncclRemoteError:
      return BP_COMM_ERROR_REMOTE;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return BP_ERROR_INVALID_ARGUMENT;
    case ncclUnhandledCudaError:
      return BP_ERROR_DEVICE;
    default:
      return BP_ERROR_INTERNAL;
  }
}

// One checking macro for the CUDA runtime (docs/design.md, "Errors").
#define BP_CUDA_CHECK(expr)                                                                 \
  do {                                                                                      \
    cudaError_t bp_err_ = (expr);                                                           \
    if (bp_err_ != cudaSuccess)                                                             \
      fail(BP_ERROR_DEVICE, std::string(#expr) + " failed: " + cudaGetErrorString(bp_err_), \
           cudaGetErrorName(bp_err_));                                                      \
  } while (0)

template <typename F>
void load_symbol(void* h, const char* name, F& out, std::string& missing) {
  out = reinterpret_cast<F>(dlsym(h, name));
  if (!out) missing += (missing.empty() ? "" : ", ") + std::string(name);
}

NcclLib open_nccl() {
  NcclLib lib;
  const char* env = std::getenv("BACKPLANE_NCCL_LIBRARY");
  lib.path = env && *env ? env : "libnccl.so.2";
  dlerror();
  void* h = dlopen(lib.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    lib.reason = lib.path + " could not be opened (" + (e ? e : "unknown error") +
                 "); install NCCL or set BACKPLANE_NCCL_LIBRARY to libnccl.so.2's path";
    return lib;
  }
  std::string missing;
  load_symbol(h, "ncclGetVersion", lib.GetVersion, missing);
  load_symbol(h, "ncclGetUniqueId", lib.GetUniqueId, missing);
  load_symbol(h, "ncclCommInitRankConfig", lib.CommInitRankConfig, missing);
  load_symbol(h, "ncclCommGetAsyncError", lib.CommGetAsyncError, missing);
  load_symbol(h, "ncclCommAbort", lib.CommAbort, missing);
  load_symbol(h, "ncclCommDestroy", lib.CommDestroy, missing);
  load_symbol(h, "ncclCommFinalize", lib.CommFinalize, missing);
  load_symbol(h, "ncclAllReduce", lib.AllReduce, missing);
  load_symbol(h, "ncclBroadcast", lib.Broadcast, missing);
  load_symbol(h, "ncclAllGather", lib.AllGather, missing);
  load_symbol(h, "ncclReduceScatter", lib.ReduceScatter, missing);
  load_symbol(h, "ncclSend", lib.Send, missing);
  load_symbol(h, "ncclRecv", lib.Recv, missing);
  load_symbol(h, "ncclGroupStart", lib.GroupStart, missing);
  load_symbol(h, "ncclGroupEnd", lib.GroupEnd, missing);
  load_symbol(h, "ncclGetErrorString", lib.GetErrorString, missing);
  lib.GetLastError = reinterpret_cast<const char* (*)(ncclComm_t)>(dlsym(h, "ncclGetLastError"));
  lib.CommShrink = reinterpret_cast<decltype(lib.CommShrink)>(dlsym(h, "ncclCommShrink"));
  Dl_info info{};
  if (lib.GetVersion && dladdr(reinterpret_cast<void*>(lib.GetVersion), &info) && info.dli_fname)
    lib.path = info.dli_fname;
  if (lib.GetVersion) lib.GetVersion(&lib.version);
  std::string ver = std::to_string(lib.version / 10000) + "." +
                    std::to_string(lib.version / 100 % 100) + "." +
                    std::to_string(lib.version % 100);
  if (!missing.empty()) {
    lib.reason = lib.path + " (NCCL " + ver + ") lacks " + missing +
                 "; the plugin needs NCCL 2.14 or newer (non-blocking communicators)";
    return lib;  // not closed: dlclose of a CUDA library is never safe
  }
  if (lib.version < BP_NCCL_VERSION(2, 14, 0)) {
    lib.reason = lib.path + " is NCCL " + ver + "; the plugin needs NCCL 2.14 or newer";
    return lib;
  }
  lib.describe = "NCCL " + ver + " from " + lib.path;
  lib.loaded = true;
  return lib;
}

ncclDataType_t nccl_type(int32_t dtype) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return ncclFloat32;
    case BP_DTYPE_F64:
      return ncclFloat64;
    case BP_DTYPE_F16:
      return ncclFloat16;
    case BP_DTYPE_BF16:
      return ncclBfloat16;
    case BP_DTYPE_I32:
      return ncclInt32;
    case BP_DTYPE_I64:
      return ncclInt64;
    case BP_DTYPE_U8:
    case BP_DTYPE_BOOL:  // one byte 0/1: or is max, and is min (comm_abi.h)
      return ncclUint8;
  }
  fail(BP_ERROR_INVALID_ARGUMENT, "unknown dtype " + std::to_string(dtype));
}

bool floating(int32_t dtype) {
  return dtype == BP_DTYPE_F32 || dtype == BP_DTYPE_F64 || dtype == BP_DTYPE_F16 ||
         dtype == BP_DTYPE_BF16;
}

ncclRedOp_t nccl_op(int32_t op, int32_t dtype) {
  if (op == BP_REDUCE_AVG && !floating(dtype))
    fail(BP_ERROR_INVALID_ARGUMENT,
         std::string("avg needs a floating dtype, got ") + bp_dtype_name(dtype));
  if (dtype == BP_DTYPE_BOOL) return op == BP_REDUCE_MIN ? ncclMin : ncclMax;
  switch (op) {
    case BP_REDUCE_SUM:
      return ncclSum;
    case BP_REDUCE_AVG:
      return ncclAvg;
    case BP_REDUCE_MIN:
      return ncclMin;
    case BP_REDUCE_MAX:
      return ncclMax;
  }
  fail(BP_ERROR_INVALID_ARGUMENT, "unknown reduction " + std::to_string(op));
}

std::string describe(const char* op, uint64_t count, int32_t dtype, const std::string& extra = "") {
  return std::string(op) + " of " + std::to_string(count) + " " + bp_dtype_name(dtype) +
         (extra.empty() ? "" : " (" + extra + ")");
}

// Host-store helpers for comm_create.
void host_check(const bp_comm_host& h, bp_error* e, const std::string& what) {
  if (!e) return;
  int32_t code = e->code;
  std::string msg = e->message ? e->message : "store error";
  h.error_free(h.ctx, e);
  fail(static_cast<bp_error_code>(code), what + ": " + msg);
}

}  // namespace

const NcclLib& nccl() {
  static const NcclLib lib = open_nccl();
  return lib;
}

// ---- Comm
// ----------------------------------------------------------------------------------------

KeepCurrentDevice::KeepCurrentDevice() {
  if (cudaGetDevice(&device_) != cudaSuccess) device_ = -1;
}

KeepCurrentDevice::~KeepCurrentDevice() {
  int now = -1;
  if (device_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != device_) cudaSetDevice(device_);
}

void Comm::select_device() const {
  BP_CUDA_CHECK(cudaSetDevice(device_));
}

std::string Comm::where() const {
  return "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " on CUDA device " +
         std::to_string(device_);
}

void Comm::raise(ncclResult_t r, const std::string& what) {
  std::string detail = lib_.GetErrorString ? lib_.GetErrorString(r) : "";
  if (lib_.GetLastError && comm_ && !aborted_.load()) {
    const char* last = lib_.GetLastError(comm_);
    if (last && *last) detail += std::string(": ") + last;
  }
  fail(static_cast<bp_error_code>(aborted_.load() ? BP_COMM_ERROR_ABORTED : code_of(r)),
       "nccl " + what + " on " + where() + " failed: " + detail, result_name(r));
}

void Comm::settle(ncclResult_t r, const std::string& what) {
  // An enqueue settles within microseconds, on NCCL's own thread: poll with yields for the first
  // millisecond (a 20 us sleep costs 60-100 us with the kernel's timer slack, which held every
  // small collective on 4 H200s to ~140 us), then sleep between polls.
  const auto start = Clock::now();
  const auto spin_until = start + std::chrono::milliseconds(1), deadline = start + timeout_;
  while (r == ncclInProgress) {
    const auto now = Clock::now();
    if (now < spin_until)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    std::lock_guard<std::mutex> l(mu_);
    if (aborted_.load() || !comm_)
      fail(static_cast<bp_error_code>(BP_COMM_ERROR_ABORTED),
           "nccl " + what + " on " + where() + ": the communicator was aborted");
    if (lib_.CommGetAsyncError(comm_, &r) != ncclSuccess) r = ncclInternalError;
    if (r == ncclInProgress && now > deadline)
      fail(static_cast<bp_error_code>(BP_COMM_ERROR_TIMEOUT),
           "nccl " + what + " on " + where() + " did not settle within " +
               std::to_string(timeout_.count()) + " ms");
  }
  if (r != ncclSuccess) raise(r, what);
}

Comm::Comm(const bp_comm_config& cfg, const bp_comm_host& host)
    : lib_(nccl()),
      rank_(cfg.rank),
      size_(cfg.world_size),
      device_(cfg.device_ordinal),
      timeout_(milliseconds(cfg.timeout_ms)),
      nonblocking_((sdk::config_flags(cfg) & BP_COMM_CONFIG_NONBLOCKING) != 0) {
  KeepCurrentDevice keep;
  if (!lib_.loaded) fail(BP_ERROR_UNAVAILABLE, lib_.reason);
  if (cfg.dlpack_device_type != 2)
    fail(BP_ERROR_INVALID_ARGUMENT, "nccl reduces CUDA memory only (DLPack device type 2), got " +
                                        std::to_string(cfg.dlpack_device_type) + " for " +
                                        (cfg.device_type ? cfg.device_type : "?"));
  select_device();
  ncclUniqueId id{};
  if (rank_ == 0) {
    ncclResult_t r = lib_.GetUniqueId(&id);
    if (r != ncclSuccess) raise(r, "ncclGetUniqueId");
    host_check(host, host.store_set(host.ctx, "unique_id", &id, sizeof id),
               "publishing NCCL's unique id");
  } else {
    void* v = nullptr;
    uint64_t n = 0;
    host_check(host, host.store_get(host.ctx, "unique_id", cfg.timeout_ms, &v, &n),
               "rank " + std::to_string(rank_) + " waiting for NCCL's unique id from rank 0");
    if (n != sizeof id) {
      host.store_free(host.ctx, v);
      fail(BP_ERROR_INTERNAL, "NCCL's unique id in the store has " + std::to_string(n) +
                                  " bytes, expected " + std::to_string(sizeof id));
    }
    std::memcpy(&id, v, sizeof id);
    host.store_free(host.ctx, v);
  }
  if (host.log)
    host.log(host.ctx,
             (lib_.describe + ": rank " + std::to_string(rank_) + " joins on CUDA device " +
              std::to_string(device_) +
              (nonblocking_ ? " (non-blocking communicator)" : " (blocking communicator)"))
                 .c_str());
  if (!nonblocking_) arrive(host);
  bp_nccl_config config = BP_NCCL_CONFIG_INITIALIZER;
  config.blocking = nonblocking_ ? 0 : 1;  // Note [NCCL without hangs]
  ncclResult_t r = lib_.CommInitRankConfig(&comm_, size_, id, rank_, &config);
  auto deadline = Clock::now() + timeout_;
  while (r == ncclInProgress ||
         (r == ncclSuccess && comm_ && lib_.CommGetAsyncError(comm_, &r) == ncclSuccess &&
          r == ncclInProgress)) {
    bool give_up = host.abort_requested && host.abort_requested(host.ctx);
    if (give_up || Clock::now() > deadline) {
      if (comm_) lib_.CommAbort(comm_);
      comm_ = nullptr;
      fail(static_cast<bp_error_code>(give_up ? BP_COMM_ERROR_ABORTED : BP_COMM_ERROR_TIMEOUT),
           "nccl communicator of " + std::to_string(size_) + " ranks on " + where() +
               (give_up ? ": the host gave up (another rank failed)"
                        : " did not form within " + std::to_string(timeout_.count()) +
                              " ms (another rank did not join)"));
    }
    std::this_thread::sleep_for(milliseconds(1));
    if (comm_ && lib_.CommGetAsyncError(comm_, &r) != ncclSuccess) r = ncclInternalError;
  }
  if (r != ncclSuccess) {
    std::string text = lib_.GetErrorString ? lib_.GetErrorString(r) : "";
    if (comm_) lib_.CommAbort(comm_);
    comm_ = nullptr;
    fail(static_cast<bp_error_code>(code_of(r)),
         "creating the nccl communicator on " + where() + " failed: " + text, result_name(r));
  }
  BP_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(int)));
}

void Comm::arrive(const bp_comm_host& host) {
  int64_t n = 0;
  host_check(host, host.store_add(host.ctx, "arrived", 1, &n), "counting in for the NCCL init");
  const auto start = Clock::now(), deadline = start + timeout_;
  while (n < size_) {
    if (host.abort_requested && host.abort_requested(host.ctx))
      fail(static_cast<bp_error_code>(BP_COMM_ERROR_ABORTED),
           "nccl communicator of " + std::to_string(size_) + " ranks on " + where() +
               ": the host gave up (another rank failed) while " + std::to_string(size_ - n) +
               " rank(s) had not arrived");
    if (Clock::now() > deadline)
      fail(static_cast<bp_error_code>(BP_COMM_ERROR_TIMEOUT),
           "nccl communicator of " + std::to_string(size_) + " ranks on " + where() + ": " +
               std::to_string(size_ - n) + " rank(s) did not arrive within " +
               std::to_string(timeout_.count()) + " ms (another rank did not create it)");
    std::this_thread::sleep_for(Clock::now() - start < milliseconds(100) ? milliseconds(1)
                                                                         : milliseconds(10));
    host_check(host, host.store_add(host.ctx, "arrived", 0, &n), "counting in for the NCCL init");
  }
}

Comm::~Comm() {
  KeepCurrentDevice keep;
  std::unique_lock<std::mutex> l(mu_);
  if (comm_ && !aborted_.load()) {
    // A clean destroy needs every operation finished; comm_destroy's caller freed its works.
    ncclResult_t r = lib_.CommFinalize(comm_);
    auto deadline = Clock::now() + timeout_;
    while (r == ncclSuccess && lib_.CommGetAsyncError(comm_, &r) == ncclSuccess &&
           r == ncclInProgress && Clock::now() < deadline)
      std::this_thread::sleep_for(milliseconds(1));
    if (r == ncclSuccess)
      lib_.CommDestroy(comm_);
    else
      lib_.CommAbort(comm_);
  }
  comm_ = nullptr;
  l.unlock();
  // Only now: cudaFree synchronises the device, which waits for ever on a hung NCCL kernel
  // until the communicator is finalised or aborted.
  if (scratch_) {
    cudaSetDevice(device_);
    cudaFree(scratch_);
  }
}

Work* Comm::finish_issue(const std::string& what, void* stream) {
  auto w = std::make_unique<Work>();
  w->comm = this;
  w->what = what;
  w->stream = stream;
  cudaEvent_t ev = nullptr;
  BP_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  w->event = ev;
  if (in_group_) {
    group_works_.push_back(w.get());
  } else {
    BP_CUDA_CHECK(cudaEventRecord(ev, static_cast<cudaStream_t>(stream)));
    w->recorded = true;
  }
  return w.release();
}

#define BP_NCCL_ISSUE(what, call)                                                     \
  do {                                                                                \
    if (aborted_.load())                                                              \
      fail(static_cast<bp_error_code>(BP_COMM_ERROR_ABORTED),                         \
           "nccl " + (what) + " on " + where() + ": the communicator was aborted");   \
    select_device();                                                                  \
    ncclResult_t r_;                                                                  \
    {                                                                                 \
      std::lock_guard<std::mutex> l_(mu_);                                            \
      if (!comm_ || aborted_.load())                                                  \
        fail(static_cast<bp_error_code>(BP_COMM_ERROR_ABORTED),                       \
             "nccl " + (what) + " on " + where() + ": the communicator was aborted"); \
      r_ = (call);                                                                    \
    }                                                                                 \
    settle(r_, what);                                                                 \
  } while (0)

Work* Comm::all_reduce(const void* send, void* recv, uint64_t count, int32_t dtype, int32_t op,
                       void* stream) {
  ncclDataType_t t = nccl_type(dtype);
  ncclRedOp_t o = nccl_op(op, dtype);
  std::string what = describe("all_reduce", count, dtype, bp_reduce_op_name(op));
  BP_NCCL_ISSUE(
      what, lib_.AllReduce(send, recv, count, t, o, comm_, static_cast<bp_nccl_stream_t>(stream)));
  return finish_issue(what, stream);
}

Work* Comm::broadcast(const void* send, void* recv, uint64_t count, int32_t dtype, int32_t root,
                      void* stream) {
  ncclDataType_t t = nccl_type(dtype);
  if (root < 0 || root >= size_)
    fail(BP_ERROR_INVALID_ARGUMENT,
         "broadcast: root " + std::to_string(root) + " is not a rank of " + std::to_string(size_));
  std::string what = describe("broadcast", count, dtype, "root " + std::to_string(root));
  const void* src = rank_ == root ? send : recv;
  BP_NCCL_ISSUE(what, lib_.Broadcast(src, recv, count, t, root, comm_,
                                     static_cast<bp_nccl_stream_t>(stream)));
  return finish_issue(what, stream);
}

Work* Comm::all_gather(const void* send, void* recv, uint64_t count, int32_t dtype, void* stream) {
  ncclDataType_t t = nccl_type(dtype);
  std::string what = describe("all_gather", count, dtype);
  BP_NCCL_ISSUE(what,
                lib_.AllGather(send, recv, count, t, comm_, static_cast<bp_nccl_stream_t>(stream)));
  return finish_issue(what, stream);
}

Work* Comm::reduce_scatter(const void* send, void* recv, uint64_t count, int32_t dtype, int32_t op,
                           void* stream) {
  ncclDataType_t t = nccl_type(dtype);
  ncclRedOp_t o = nccl_op(op, dtype);
  std::string what = describe("reduce_scatter", count, dtype, bp_reduce_op_name(op));
  BP_NCCL_ISSUE(what, lib_.ReduceScatter(send, recv, count, t, o, comm_,
                                         static_cast<bp_nccl_stream_t>(stream)));
  return finish_issue(what, stream);
}

// NCCL accepts a send to the own rank only paired with a recv in one group, and reports a lone
// one at the next group end (so the error would surface in the NEXT collective): refuse it here.
void Comm::check_peer(const char* op, int32_t peer) const {
  if (peer < 0 || peer >= size_ || peer == rank_)
    fail(BP_ERROR_INVALID_ARGUMENT, std::string(op) + ": peer " + std::to_string(peer) +
                                        " is not another rank of this communicator (rank " +
                                        std::to_string(rank_) + " of " + std::to_string(size_) +
                                        "; a peer is in [0, " + std::to_string(size_) +
                                        ") and not the own rank)");
}

Work* Comm::send(const void* buf, uint64_t count, int32_t dtype, int32_t peer, void* stream) {
  check_peer("send", peer);
  ncclDataType_t t = nccl_type(dtype);
  std::string what = describe("send", count, dtype, "to rank " + std::to_string(peer));
  BP_NCCL_ISSUE(what, lib_.Send(buf, count, t, peer, comm_, static_cast<bp_nccl_stream_t>(stream)));
  return finish_issue(what, stream);
}

Work* Comm::recv(void* buf, uint64_t count, int32_t dtype, int32_t peer, void* stream) {
  check_peer("recv", peer);
  ncclDataType_t t = nccl_type(dtype);
  std::string what = describe("recv", count, dtype, "from rank " + std::to_string(peer));
  BP_NCCL_ISSUE(what, lib_.Recv(buf, count, t, peer, comm_, static_cast<bp_nccl_stream_t>(stream)));
  return finish_issue(what, stream);
}

Work* Comm::barrier(void* stream) {
  std::string what = "barrier";
  BP_NCCL_ISSUE(what, lib_.AllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_,
                                     static_cast<bp_nccl_stream_t>(stream)));
  return finish_issue(what, stream);
}

void Comm::group_start() {
  if (in_group_) fail(BP_ERROR_INVALID_ARGUMENT, "group_start: a group is already open");
  ncclResult_t r = lib_.GroupStart();
  if (r != ncclSuccess) raise(r, "group_start");
  in_group_ = true;
}

void Comm::group_end() {
  if (!in_group_) fail(BP_ERROR_INVALID_ARGUMENT, "group_end: no group is open");
  in_group_ = false;
  std::vector<Work*> works;
  works.swap(group_works_);
  ncclResult_t r;
  {
    std::lock_guard<std::mutex> l(mu_);
    r = lib_.GroupEnd();
  }
  try {
    settle(r, "group of " + std::to_string(works.size()) + " operations");
  } catch (...) {
    // The works still get their events, which fire once the aborted operations are gone.
    record_group_events(works);
    throw;
  }
  for (Work* w : works) {
    BP_CUDA_CHECK(
        cudaEventRecord(static_cast<cudaEvent_t>(w->event), static_cast<cudaStream_t>(w->stream)));
    w->recorded = true;
  }
}

void Comm::record_group_events(const std::vector<Work*>& works) noexcept {
  for (Work* w : works) {
    cudaEventRecord(static_cast<cudaEvent_t>(w->event), static_cast<cudaStream_t>(w->stream));
    w->recorded = true;
  }
}

// Note [Errors inside a group]
//   NCCL's group depth is per thread: a group left open defers every later NCCL call of the
//   thread, creating a new communicator included, which then never starts. So an operation that
//   fails between group_start and group_end ends the group here: the communicator is aborted
//   first (the operations already grouped must not run half a group on the wire), then
//   ncclGroupEnd closes NCCL's group, and the grouped works get their events (they complete,
//   as aborted, once the streams pass them). The host's own group_end then finds no group open.
void Comm::end_group_after_error() noexcept {
  if (!in_group_) return;
  in_group_ = false;
  abort();
  lib_.GroupEnd();
  std::vector<Work*> works;
  works.swap(group_works_);
  record_group_events(works);
}

void Comm::abort() {
  if (aborted_.exchange(true)) return;
  // Note [NCCL without hangs]: a blocking call stuck on a dead peer holds mu_; every path
  // checks aborted_ before it touches comm_ again, so aborting without the lock is safe.
  std::unique_lock<std::mutex> l(mu_, std::defer_lock);
  const auto until = Clock::now() + milliseconds(1000);
  while (!l.try_lock() && Clock::now() < until) std::this_thread::sleep_for(milliseconds(1));
  ncclComm_t c = comm_;
  if (l.owns_lock()) comm_ = nullptr;
  if (c) lib_.CommAbort(c);  // NCCL's kernels exit; streams move on
}

bool Comm::test(Work& w) {
  if (!w.recorded) return false;  // inside an open group
  cudaSetDevice(device_);
  cudaError_t q = cudaEventQuery(static_cast<cudaEvent_t>(w.event));
  if (q == cudaSuccess) {
    if (aborted_.load())
      fail(static_cast<bp_error_code>(BP_COMM_ERROR_ABORTED),
           "nccl " + w.what + " on " + where() + " was aborted");
    return true;
  }
  if (q != cudaErrorNotReady)
    fail(BP_ERROR_DEVICE,
         "nccl " + w.what + " on " + where() + ": cudaEventQuery failed: " + cudaGetErrorString(q),
         cudaGetErrorName(q));
  std::lock_guard<std::mutex> l(mu_);
  if (aborted_.load() || !comm_)
    fail(static_cast<bp_error_code>(BP_COMM_ERROR_ABORTED),
         "nccl " + w.what + " on " + where() + " was aborted");
  ncclResult_t st = ncclSuccess;
  if (lib_.CommGetAsyncError(comm_, &st) != ncclSuccess) st = ncclInternalError;
  if (st != ncclSuccess && st != ncclInProgress) raise(st, w.what);
  return false;
}

}  // namespace bp::nccl_comm
