// Internal: the process group's state shared by dist_init.cpp (rendezvous, lifetime),
// dist_group.cpp (issuing operations, Work) and dist_monitor.cpp (checks, aborts, watchdog).
#pragma once

#include "dist/comm_registry.hpp"

#include <backplane/dist.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

namespace bp::dist::internal {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

enum class FailKind { generic, timeout, mismatch, peer, unavailable, rendezvous };

struct Failure {
  FailKind kind = FailKind::generic;
  std::string message;
};

// Throws the bp::dist error class of `kind`.
[[noreturn]] void raise(FailKind kind, const std::string& message);
// The kind of a caught bp::dist error (generic for anything else).
FailKind kind_of(const std::exception& e);

struct Group;

// What the bp_comm_host callbacks of one communicator see.
struct HostCtx {
  Group* g = nullptr;
  std::string prefix;  // the communicator's key namespace
};

// One communicator of a plugin, for the memory of one device.
struct Communicator {
  // Kept as long as the communicator: comm_create may only use the store during the call, but
  // a plugin that kept the pointer must not crash the host.
  std::unique_ptr<HostCtx> host_ctx;
  const bp_comm_api* api = nullptr;
  bp_comm* comm = nullptr;
  std::string plugin;        // "gloo"
  Device* device = nullptr;  // whose memory it gets (cpu:0 when it serves staged tensors)
};

// How tensors of one device type reach a communicator.
struct Route {
  Communicator* comm = nullptr;
  bool staged = false;  // through pinned host memory (Note [Host staging])
};

struct Group;

// Note [Flight recorder]: what became of one operation, kept beyond its Work.
struct FlightMark {
  // 0 issued, 1 finished, 2 dropped before it finished, 3 waited on by the stream
  std::atomic<int> state{0};
};

// One operation in the flight recorder.
struct FlightEntry {
  uint64_t id = 0;
  int64_t seq = -1;
  std::string op, description;
  const char* check = "";  // "compared", "repeat", "off", "p2p"
  Clock::time_point issued{};
  std::shared_ptr<FlightMark> mark;
};

// The last `capacity` operations of one rank (BACKPLANE_DIST_FLIGHT_RECORDER, default 2000).
class FlightRecorder {
 public:
  void set_capacity(size_t n);
  void add(FlightEntry e);
  std::vector<FlightEntry> entries() const;  // oldest first

 private:
  mutable std::mutex mu_;
  size_t capacity_ = 2000;
  uint64_t next_ = 0;
  std::vector<FlightEntry> ring_;
};

}  // namespace bp::dist::internal

namespace bp::dist {

struct Work::State {
  std::shared_ptr<internal::Group> g;
  std::mutex mu;  // guards everything below but the atomics
  internal::Communicator* comm = nullptr;
  bp_comm_work* handle = nullptr;  // freed once complete, or at destroy_process_group
  std::string description;  // "all_reduce #3 (f32 [1000], sum) on cpu:0 via gloo, rank 0 of 2"
  std::string op;           // "all_reduce"
  int64_t seq = -1;         // collective number; -1 for point to point
  bool staged = false;
  // Note [Work waits]: wait() is a stream wait when the operation is queued on `stream` (a
  // device stream) and has no host copy-back; `event` marks its end when `stream` is not the
  // device's default stream.
  bool stream_wait = false;
  Stream* stream = nullptr;
  std::unique_ptr<Event> event;
  internal::Clock::time_point start;
  std::atomic<bool> plugin_done{false};     // the plugin reported completion
  std::atomic<bool> check_ok{true};         // its descriptor check passed (or none is needed)
  bool complete = false;                    // plugin done, check passed, finish() has run
  bool detached = false;                    // the group was destroyed first
  std::function<void()> finish;             // copy-backs that must follow completion
  std::vector<std::shared_ptr<void>> keep;  // memory the plugin may touch until completion
  std::vector<Tensor> tensors;
  std::shared_ptr<internal::FlightMark> flight;  // Note [Flight recorder]
  ~State();
};

}  // namespace bp::dist

namespace bp::dist::internal {

// One item for the monitor thread (Note [Collective checks] in dist_monitor.cpp).
struct Check {
  enum class Kind { collective, p2p_post, p2p_verify, leave } kind = Kind::collective;
  int64_t seq = -1;
  std::string key;         // p2p: the key posted or verified
  std::string descriptor;  // "all_reduce f32 [1000] sum on cpu"
  std::weak_ptr<Work::State> work;
  Clock::time_point posted{};
  bool is_posted = false;
};

// Outstanding operations whose Work was dropped before completion: kept until the plugin is
// done with their memory, watched like live ones (Note [Dropped works] in dist_monitor.cpp).
struct Orphan {
  const bp_comm_api* api = nullptr;
  bp_comm_work* handle = nullptr;
  std::vector<std::shared_ptr<void>> keep;
  std::vector<Tensor> tensors;
  std::string description;
  Clock::time_point start{};
  std::function<void()> finish;        // copy-backs, run once the operation has completed
  std::shared_ptr<FlightMark> flight;  // Note [Flight recorder]
};

struct Group : std::enable_shared_from_this<Group> {
  int rank = 0, size = 1, local_rank = 0;
  milliseconds timeout{300000};
  bool check = true;  // check_mode != off
  CollectiveChecks check_mode = CollectiveChecks::first_call;
  bool nonblocking = false;    // BP_COMM_CONFIG_NONBLOCKING for every communicator
  std::string prefix = "bp/";  // every key of this group starts with it
  std::string backend_spec;    // as given ("", "gloo", "cpu:gloo,cuda:nccl")
  std::map<std::string, std::string> backend_for_type;
  std::string backend_all;

  std::unique_ptr<TcpStoreServer> server;  // when this rank hosts the store
  std::unique_ptr<Store> store;            // the issuing thread's connection
  std::unique_ptr<Store> monitor_store;    // the monitor thread's connection
  // A connection whose closing marks this rank dead under gone_key() (Note [Shrinking]).
  std::unique_ptr<Store> liveness_store;

  // Issuing: numbering, communicators, point-to-point counters.
  std::recursive_mutex issue_mu;
  int64_t seq = 0;
  std::map<std::string, std::unique_ptr<Communicator>> comms;  // by the memory's device type
  Device* last_device = nullptr;
  std::map<int, int64_t> sent, received;  // per peer
  // Collective signatures this rank has issued (CollectiveChecks::first_call).
  std::unordered_set<std::string> signatures;

  // Failure, checks, live work (guarded by mu).
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> failed{false};
  Failure failure;
  bool failure_published = false;  // our own failure written to the abort key
  std::mutex publish_mu;           // held while it is written (publish_failure)
  bool failure_local = false;      // found here rather than read from the abort key
  std::vector<Communicator*> abortable;
  std::deque<Check> checks;
  std::string check_note;  // what the head check waits for ("rank 1 has not reached ...")
  std::vector<std::weak_ptr<Work::State>> live;
  std::vector<Orphan> orphans;
  std::mutex reap_mu;  // one thread reaps orphans at a time (taken before mu)
  bool stopping = false;
  std::thread monitor;
  FlightRecorder flight;  // Note [Flight recorder]

  // dist_flight.cpp: the flight record as JSON, and its dump when the group fails.
  std::string flight_json();
  void dump_flight(const std::string& why);

  std::string abort_key() const { return prefix + "abort"; }
  std::string gone_key(int r) const { return prefix + "gone/" + std::to_string(r); }
  // Collective #seq's keys (Note [Collective checks]): <base><rank> holds each rank's
  // descriptor, <base>n counts the ranks done with it.
  std::string check_base(int64_t seq) const { return prefix + "c/" + std::to_string(seq) + "/"; }
  std::string where() const {
    return "rank " + std::to_string(rank) + " of " + std::to_string(size);
  }

  // Records the group's first failure, aborts every communicator so blocked operations
  // return, and (when `local`) has the monitor tell the other ranks. Thread-safe.
  void fail(FailKind kind, const std::string& message, bool local = true);
  // Writes this rank's own failure under the abort key, once.
  void publish_failure();
  // fail() for an error a plugin returned; for a broken peer connection it first looks for
  // the reason another rank published (Note [Failure propagation]).
  void fail_from_plugin(int32_t code, const std::string& message, Store& st);
  // Throws the group's failure, prefixed with `context`, when it has failed.
  void throw_if_failed(const std::string& context);
  Failure current_failure();

  // dist_group.cpp
  Route route_for(Device& dev, const char* op);
  Communicator& communicator(const std::string& memory_type, Device& memory_device,
                             const bp::detail::CommPlugin& plugin);
  void enqueue(Check c);

  // dist_monitor.cpp
  void start_monitor();
  void stop_monitor();
  void monitor_loop();
  // Compares every rank's descriptors of the first `count` collective checks (`descs`: size
  // per check, in rank order), fails the group on a mismatch, releases the Works, and counts
  // the numbers done (the last rank erases their keys).
  void settle_collectives(const std::deque<Check>& checks, size_t count,
                          const std::vector<std::string>& descs);
  // At most this many collective checks are verified in one multi-key get.
  static constexpr size_t kCheckBatch = 64;
  void track(const std::shared_ptr<Work::State>& w);
  // Completes the orphans that are done (their copy-backs run), fails the group for one that
  // failed or outlived the timeout, and keeps the others. `st` is the calling thread's store.
  void reap_orphans(Store& st);
};

// dist_init.cpp: opens the liveness connection and the monitor's disconnect notice of a group
// of several ranks.
void watch_liveness(Group& g);
// dist_init.cpp: ends the group's operations by `deadline` (aborting the communicators when it
// failed or work is still running), then frees them and destroys the communicators.
void release_operations(Group& g, Clock::time_point deadline);
// dist_shrink.cpp: the group of the survivors (Note [Shrinking]); `old` is released.
std::shared_ptr<Group> shrink(const std::shared_ptr<Group>& old, const std::vector<int>& excluded,
                              std::vector<int>& dropped);

// The bp_comm_host callbacks over a group's store (dist_monitor.cpp).
bp_comm_host make_host(HostCtx& ctx);
// The abort key's value: the failure's kind and text, so every rank throws the same class.
std::string encode_failure(FailKind kind, const std::string& text);
Failure decode_failure(const std::string& value);
// The failure kind of a communicator error code.
FailKind kind_of_code(int32_t code);

// Debug log (BACKPLANE_DIST_DEBUG=1): one line to stderr with the rank.
bool debug_enabled();
void debug_log(const Group* g, const std::string& line);

std::string shape_text(const Tensor& t);  // "[2, 3]"
std::string seconds(milliseconds t);      // "2.5 s"

}  // namespace bp::dist::internal

namespace bp::dist {

struct ProcessGroup::Impl {
  std::shared_ptr<internal::Group> g;
};

}  // namespace bp::dist
