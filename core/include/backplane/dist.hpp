// bp::dist: process groups and collectives across processes and hosts, on the communicator
// plugins (libbackplane-comm-<name>.so, plugins/include/backplane/abi/comm_abi.h) that the field
// trusts: NCCL for CUDA memory, Gloo for host memory over TCP.
//
//   bp::dist::init_process_group();                 // rank, world size, rendezvous from the env
//   auto& gpu = bp::dist::local_device("cuda");     // cuda:<local rank>, or cpu:0
//   bp::Tensor g = bp::ones({1024}, gpu);
//   bp::dist::all_reduce(g, bp::dist::ReduceOp::avg).wait();
//   bp::dist::destroy_process_group();
//
// Note [Process group semantics]
//   - Every rank calls the same collectives in the same order with the same dtype, element
//     count, shape, root, reduction and device type. Each call gets a sequence number; a
//     descriptor of it (op, dtype, shape, root, reduction, device type) is checked against
//     every other rank's through the store the first time a rank issues that signature (every
//     time with CollectiveChecks::every_call), so a mismatch is a MismatchError in every rank
//     naming both calls, not a hang or garbage.
//   - Calls are asynchronous and return a Work. On devices with ordered streams (cuda) the
//     operation is queued on the tensor's stream (or the stream given) and later work on that
//     stream sees the result without waiting. On the CPU, whose stream runs eagerly, the
//     operation runs on the communicator's thread: do not touch the tensor until wait()
//     returns.
//
// Note [Work waits]
//   Work::wait() on an operation queued on a device stream makes the device's default stream
//   wait for it (an event, no host synchronisation) and returns, as PyTorch's does; the
//   process group's watchdog keeps testing the operation, so a failure or a hang found later
//   (a peer died inside NCCL) fails the group and the next call on it throws, and a timeout
//   aborts the communicators so the device never waits forever; the output of an aborted
//   operation is undefined. Work::wait(timeout) blocks the host and throws such a failure
//   before it returns: use it before a result leaves the device or enters a checkpoint. A Work
//   dropped without wait() is still watched until it finishes.
//   - Timeouts: nothing waits forever. A Work that has not completed within the group's
//     timeout (InitOptions::timeout, BACKPLANE_DIST_TIMEOUT seconds) fails with a TimeoutError
//     naming the op, its sequence number, this rank, the sizes, and the ranks that never
//     reached the call. A rank that fails (timeout, mismatch, a peer that died) aborts its
//     communicators and tells the others through the store, so every rank throws within the
//     timeout. After a failure the group is unusable: every call throws the first error;
//     destroy_process_group() and init again to recover, or shrink() among the survivors.
//   - Device types: a collective runs on the communicator plugin that serves the tensor's
//     device type (cuda -> nccl, cpu -> gloo), created on first use (a collective step of its
//     own). A device type that no loaded plugin declares (opencl) goes through host staging:
//     copied to pinned host memory, reduced by the communicator serving cpu, copied back. Staging
//     is never silent: Work::staged() says so and BACKPLANE_DIST_DEBUG=1 logs it. A plugin that
//     declares the type but cannot run (its library is missing) is a BackendUnavailable error
//     quoting the reason, not a fallback.
//   - Non-contiguous tensors are copied to contiguous memory and back around the operation.
//
// Thread-safety: calls on one group may come from several threads; they are numbered in the
// order they take the group's lock, so concurrent collectives from several threads must be
// ordered by the caller exactly as on the other ranks.
#pragma once

#include <backplane/device.hpp>
#include <backplane/dist_launch.hpp>
#include <backplane/dist_store.hpp>
#include <backplane/export.hpp>
#include <backplane/runtime.hpp>
#include <backplane/tensor.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace bp::dist {

// ---- errors (DistError and RendezvousError are in dist_store.hpp) -----------------------------

// A collective did not complete within the timeout.
class BP_API TimeoutError : public DistError {
 public:
  using DistError::DistError;
};

// Ranks called different collectives, or the same one with different dtypes, shapes, roots,
// reductions or device types.
class BP_API MismatchError : public DistError {
 public:
  using DistError::DistError;
};

// Another rank failed (it exited, its connection closed, or it reported an error of its own);
// the message quotes what that rank said.
class BP_API PeerError : public DistError {
 public:
  using DistError::DistError;
};

// No communicator can serve the tensors: the plugin for the device type is missing its
// library (the reason from the load report is quoted), or no plugin serves the type or the
// host for staging.
class BP_API BackendUnavailable : public DistError {
 public:
  using DistError::DistError;
};

// ---- the communicator plugins' load report ----------------------------------------------------

struct CommPluginReport {
  std::string path;
  PluginReport::Status status = PluginReport::Status::failed;
  std::string decision;  // "loaded", "failed", "skipped"
  std::string reason;    // why it failed or was skipped; for loaded ones, availability
  std::string name, version;
  uint32_t abi_major = 0, abi_minor = 0;
  std::vector<std::string> device_types;  // what it declares to serve
  bool available = false;                 // loaded and its vendor library usable
  std::string library;                    // the library found ("NCCL 2.28.9 from ...") or ""
  // bp_comm_capability bits (comm_abi.h: 1 abort from any thread, 2 shrink, 4
  // re-initialisation) of a loaded plugin, and why one is missing ("" when none is).
  uint64_t capabilities = 0;
  std::string capability_note;
};
// "abort-any-thread,shrink,reinit": the names of capability bits.
BP_API std::string comm_capability_names(uint64_t capabilities);
// Every libbackplane-comm-*.so candidate of the plugin search order (Note [Plugin search
// order] in runtime.hpp), loaded once on first use with the device loader's checks.
BP_API std::vector<CommPluginReport> comm_load_report();
// Loads one communicator plugin file with the same checks, without registering it (used by
// bp-conformance --comm PATH). The library stays loaded for the process.
BP_API CommPluginReport inspect_comm_plugin(const std::string& path);

// ---- process groups ---------------------------------------------------------------------------

enum class ReduceOp { sum, avg, min, max };
BP_API const char* reduce_op_name(ReduceOp op);

// Which collectives have their descriptors compared across ranks (InitOptions::checks).
enum class CollectiveChecks { off, first_call, every_call };

struct InitOptions {
  // Rank and world size; -1 reads the launcher's variables (Note [Launchers] in
  // dist_launch.hpp: bp-run, torchrun, Open MPI, PMIx, MPICH, Slurm). With none of them set
  // the process is a group of one.
  int rank = -1;
  int world_size = -1;
  // "file:///shared/dir", "tcp://host:port"; "" reads BACKPLANE_INIT, else
  // tcp://MASTER_ADDR:MASTER_PORT (under Slurm, the first host of SLURM_JOB_NODELIST and port
  // 29500 by default), else (a group of one only) an in-process store.
  // With tcp://, rank 0 hosts the store on that address and port (tcp://0.0.0.0:port for every
  // interface) unless BACKPLANE_STORE_HOSTED=1 says the launcher does (bp-run); every rank
  // presents BACKPLANE_STORE_SECRET (16 to 1024 characters, the same on every rank; bp-run
  // generates one). The world size may be 1 to 65536.
  std::string init_method{};
  // Bound on the rendezvous and on every collective; 0 reads BACKPLANE_DIST_TIMEOUT
  // (seconds), else 300 s.
  std::chrono::milliseconds timeout{0};
  // Which communicator plugin serves which device type: "" chooses per type (reads
  // BACKPLANE_DIST_BACKEND first); "gloo" uses that plugin for every type it serves; or pairs
  // "cpu:gloo,cuda:nccl". Naming a plugin for a type it does not declare (e.g. "cuda:gloo")
  // stages that type through host memory on purpose.
  std::string backend{};
  // Descriptor checks (Note [Collective checks]): first_call checks each new signature (op,
  // dtype, shape, reduction, root, device type) once, the first time this rank issues it;
  // every_call checks every call (for debugging: names the first call that differs, at a
  // store round trip per burst); off checks nothing. BACKPLANE_DIST_CHECK=0, 1 or full
  // overrides it (off, first_call, every_call); every rank must use the same mode.
  CollectiveChecks checks = CollectiveChecks::first_call;
  // false is CollectiveChecks::off (kept for older callers).
  bool check_collectives = true;
  // Ask communicator plugins for calls that never block the issuing thread (NCCL's
  // non-blocking communicator, BP_COMM_CONFIG_NONBLOCKING): slower per call. Also
  // BACKPLANE_DIST_NONBLOCKING=1.
  bool nonblocking = false;
};

class ProcessGroup;

// A handle on one queued operation. Cheap to copy (shared).
class BP_API Work {
 public:
  Work() = default;
  // Waits for the operation as PyTorch's Work.wait() does (Note [Work waits]): on a device
  // with ordered streams (cuda) the device's default stream waits for it and the host returns
  // at once; on the CPU, for staged tensors and for copies back, the host blocks until it has
  // finished, at most the group's timeout. Throws TimeoutError, MismatchError, PeerError or
  // DistError (naming op, rank and sizes) for a failure known by then.
  void wait();
  // Blocks the host until the operation has finished on this rank, at most `timeout`.
  void wait(std::chrono::milliseconds timeout);
  // True once finished (also finishes a staged copy-back); throws as wait() on failure.
  bool is_completed();
  // True when the tensor went through host memory (Note [Host staging]).
  bool staged() const;
  // "all_reduce #3 (f32 [1000], sum) on cpu:0 via gloo, rank 0 of 2".
  std::string description() const;

  struct State;
  explicit Work(std::shared_ptr<State> s) : s_(std::move(s)) {}

 private:
  std::shared_ptr<State> s_;
};

class BP_API ProcessGroup {
 public:
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const noexcept;
  int size() const noexcept;
  int local_rank() const noexcept;  // rank among the processes of this host (launcher's view)
  std::chrono::milliseconds timeout() const noexcept;
  Store& store();

  // Collectives (Note [Process group semantics]). `stream`, when given, must belong to the
  // tensor's device; otherwise the device's default stream orders the operation.
  // t = op over ranks of t. avg needs a floating dtype (DTypeError); on bool, sum and max are
  // a logical or, min a logical and.
  Work all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum, Stream* stream = nullptr);
  // t = root's t.
  Work broadcast(const Tensor& t, int root = 0, Stream* stream = nullptr);
  // out = the ranks' `in` concatenated along a new first dimension of size world (out has
  // shape [world, *in.shape] or any shape with world * in.numel() elements).
  Work all_gather(const Tensor& out, const Tensor& in, Stream* stream = nullptr);
  // out = op over ranks of the rank-th chunk of `in`: in has world * out.numel() elements.
  Work reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::sum,
                      Stream* stream = nullptr);
  // Point to point, matched in call order per pair of ranks; both sides agree on shape and
  // dtype (checked by the receiver; a MismatchError on both sides otherwise).
  Work send(const Tensor& t, int dst, Stream* stream = nullptr);
  Work recv(const Tensor& t, int src, Stream* stream = nullptr);
  // Several sends and receives issued as one group (NCCL's ncclGroupStart/End): a rank that
  // sends to and receives from a peer that does the same (a ring exchange) must group them on
  // NCCL, where a lone send waits for its peer's recv; on Gloo grouping changes nothing. All
  // tensors on one device. One Work per operation, in order.
  struct P2POp {
    enum class Kind { send, recv } kind = Kind::send;
    Tensor tensor;
    int peer = -1;
  };
  std::vector<Work> batch_isend_irecv(const std::vector<P2POp>& ops, Stream* stream = nullptr);
  // Completes once every rank has reached it; waits (with the timeout) before returning.
  // Runs on the communicator of `device` (default: the device used last, else cpu:0).
  void barrier(Device* device = nullptr);

  // Aborts the group from this rank: pending operations fail, the other ranks are told.
  void abort(const std::string& reason);

  // The flight recorder (Note [Flight recorder]): this rank's last operations, oldest first,
  // as JSON: {"rank", "world_size", "failed", "failure", "entries": [{"id", "seq", "op",
  // "description", "check", "state", "age_ms"}]}. Also written to
  // <BACKPLANE_DIST_FLIGHT_DUMP><rank>.json when the group fails.
  std::string flight_record();

  // Fault recovery (Note [Shrinking] in dist_shrink.cpp), as PyTorch's shrink_group: called
  // together by the surviving ranks, typically after a PeerError said that a rank died. This
  // group becomes the group of the survivors, ranks renumbered in their old order (0 ..
  // size()-1), sequence numbers from 0, with new communicators: shrunk where the plugin can
  // (bp_comm_capability SHRINK, NCCL >= 2.27 on a communicator that was not aborted), else
  // created afresh among the survivors under a new key prefix (REINIT: Gloo).
  // `excluded_ranks` names the ranks (old numbers) to drop; every survivor passes the same
  // list. Empty: the survivors agree through the store on who is alive (a rank whose store
  // connection closed, or that called destroy_process_group, is gone; a file store, which
  // cannot tell, waits out the timeout for ranks that do not call shrink); with nobody gone
  // the same ranks continue from a new epoch (re-initialisation after a MismatchError or a
  // TimeoutError). A group that has not failed may shrink too (every remaining rank calls it;
  // the excluded ones do not). Returns the ranks dropped (old numbers, ascending). No other
  // thread may use the group meanwhile; Works of the old group keep their errors.
  // RendezvousError when this rank is excluded, when survivors pass different lists, when the
  // store is gone (its host died: bp-run hosts it outside the ranks) or no survivor is left
  // within the timeout; BackendUnavailable when a communicator's plugin can neither shrink
  // nor re-initialise.
  std::vector<int> shrink(const std::vector<int>& excluded_ranks = {});

  struct Impl;
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Joins the default process group (RendezvousError when the rendezvous fails: the store is
// unreachable, ranks disagree on the world size, a rank is claimed twice or out of range).
// Error when a group is already initialised.
BP_API void init_process_group(const InitOptions& options = {});
BP_API bool is_initialized();
// The default group; Error when none is initialised.
BP_API ProcessGroup& group();
// Leaves the group (a barrier-free goodbye through the store) and releases communicators.
BP_API void destroy_process_group();
// group().shrink(excluded_ranks): the default group continues with the survivors.
BP_API std::vector<int> shrink_group(const std::vector<int>& excluded_ranks = {});

// Shorthands on the default group.
BP_API int get_rank();
BP_API int get_world_size();
BP_API int get_local_rank();
// "cuda:<local rank modulo the number of cuda devices>", or cpu:0 when there is no device of
// that type (like d2l's try_gpu(local_rank)).
BP_API Device& local_device(std::string_view type = "cuda");
BP_API Work all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum);
BP_API Work broadcast(const Tensor& t, int root = 0);
BP_API Work all_gather(const Tensor& out, const Tensor& in);
BP_API Work reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::sum);
BP_API Work send(const Tensor& t, int dst);
BP_API Work recv(const Tensor& t, int src);
BP_API std::vector<Work> batch_isend_irecv(const std::vector<ProcessGroup::P2POp>& ops);
BP_API void barrier();
// The default group's flight recorder (ProcessGroup::flight_record).
BP_API std::string flight_record();

}  // namespace bp::dist
