// Seeing what the devices do: a profiler that records every op, copy, allocation,
// synchronisation and collective and writes a Chrome trace-event JSON (Perfetto and
// chrome://tracing open it), a per-op summary table, and memory snapshots of each device's
// allocator.
//
// Note [Profiler cost when off]
//   A launch, a buffer allocation and a buffer free each test one relaxed atomic flag, marked
//   [[unlikely]] (copies and synchronisations too); nothing else happens and nothing is
//   allocated while neither the profiler nor the memory history is on. On the CPU the 1-element
//   add costs 14 instructions more than without the hooks (2,547 against 2,533, callgrind);
//   bench/profiler measures it off against on (docs/profiling.md).
//
// Note [Device time]
//   While the profiler runs, every launch and copy is bracketed by a pair of the plugin's events
//   recorded on the same stream; stop() waits for them and reads their elapsed time. The start of
//   each interval on the device's track is placed by a reference event recorded on that stream
//   (after a synchronisation) when the session first used it. A plugin without events or without
//   event timing gets a stream synchronisation and a host clock stamp on each side instead, so
//   profiling it serialises the stream. Devices and streams used in a session must stay alive
//   until stop().
//
// Thread-safety: every function here may be called from any thread; ops of several threads are
// recorded with their thread's id. start()/stop() of two threads at once is an error for one of
// them (Error: "already running" / "not running").
#pragma once

#include <backplane/export.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace bp {

class Device;

namespace profiler {

struct Options {
  bool device_time = true;    // bracket launches and copies with plugin events (Note [Device time])
  bool record_shapes = true;  // input shapes and dtypes of every op
};

// Starts a session; the records of the previous session are dropped. Error when one is running.
BP_API void start(const Options& options = {});
// Ends the session: waits for the events of the session and resolves device times. The records
// stay for table(), key_averages(), trace_json() and save() until the next start(). Error when
// no session is running.
BP_API void stop();
// True while a session runs.
BP_API bool is_running() noexcept;

// The last session (or the running one, without device times yet) as Chrome trace-event JSON:
// {"traceEvents":[...]} with one process per device (a thread per stream) and one "host" process
// (a thread per host thread). Timestamps are microseconds from start().
BP_API std::string trace_json();
// Writes trace_json() to `path` (atomically: a temporary file renamed). IOError on failure.
BP_API void save(const std::string& path);

// One row of the per-op summary: launches and copies of one name over every device.
struct OpSummary {
  std::string name;  // op name ("add", "matmul") or copy kind ("copy_h2d")
  int64_t calls = 0;
  double device_us = 0;  // total device time
  double host_us = 0;    // total host dispatch time (the call into the plugin and around it)
  uint64_t bytes = 0;    // copies: bytes moved
  double mean_device_us() const { return calls ? device_us / static_cast<double>(calls) : 0; }
};
// Rows sorted by total device time (largest first), like torch.profiler's key_averages().
BP_API std::vector<OpSummary> key_averages();
// key_averages() as a text table: name, calls, device total, mean and share, host total and mean;
// `row_limit` > 0 keeps that many rows (the total line always covers all of them). When any op
// fell back (Note [Fallback policy] in runtime.hpp), bp::fallback_table() follows.
BP_API std::string table(size_t row_limit = 0);

// RAII session: start() at construction, stop() at destruction, then save(trace_path) when a
// path is given. A failure in the destructor is reported on stderr (destructors do not throw).
class BP_API Profile {
 public:
  explicit Profile(std::string trace_path = {}, const Options& options = {});
  ~Profile();
  Profile(const Profile&) = delete;
  Profile& operator=(const Profile&) = delete;

 private:
  std::string path_;
};

// A named interval on the host track while a session runs (like torch's record_function);
// allocations made inside it are attributed to `name` in memory snapshots. Costs one flag
// load when nothing records. `name` must outlive the range (a string literal).
class BP_API Range {
 public:
  explicit Range(const char* name) noexcept;
  ~Range();
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  const char* name_;
  const char* outer_;
  int64_t t0_ns_;
};

}  // namespace profiler

// ---- Memory snapshots ------------------------------------------------------------------------

// Starts (true) or stops recording, for every allocation, its size, stream and the op that
// allocated it (the op whose launch first writes the buffer, or the enclosing profiler::Range).
// Recording costs a lock and a map insertion per allocation; off, one flag load. The profiler
// records the same while it runs. Turning it off forgets what was recorded.
BP_API void record_memory_history(bool on);
BP_API bool memory_history_enabled() noexcept;

struct MemoryBlock {
  uint64_t size = 0;
  int stream = 0;         // 0: the device's default stream; others numbered as first seen
  std::string op;         // "add", "copy_h2d", a Range name; "(not yet written)" before any op
  uint64_t sequence = 0;  // order of allocation since history started
};

struct BP_API MemorySnapshot {
  std::string device;
  // The device's memory statistics at the time of the snapshot (MemoryStats: counted by
  // libbackplane, reserved from the plugin).
  uint64_t allocated = 0, reserved = 0, peak_allocated = 0, num_allocs = 0;
  uint64_t total_memory = 0, free_memory = 0;
  // Live blocks recorded by the history, largest first.
  std::vector<MemoryBlock> blocks;
  // What libbackplane counts that the history did not see (allocated before it started):
  // allocated - sum(blocks) and num_allocs - blocks.size().
  uint64_t untracked_bytes = 0, untracked_blocks = 0;
  // reserved - allocated: held by the allocator's cache, free for reuse.
  uint64_t cached() const { return reserved > allocated ? reserved - allocated : 0; }
  // {"device":..., "allocated":..., "segments":{"reserved":..., "cached":...}, "blocks":[...]}
  std::string json() const;
};

// The allocator of `device` now: its statistics and the blocks the history recorded.
BP_API MemorySnapshot memory_snapshot(Device& device);

// Where a program run with BACKPLANE_PUBLISH_STATS=1 publishes its allocator statistics for
// bp-smi --watch (Note [Published allocator statistics] in stats_publisher.cpp):
// BACKPLANE_STATS_DIR, else $XDG_RUNTIME_DIR/backplane-stats, else /tmp/backplane-stats-<uid>.
BP_API std::string stats_publish_dir();

}  // namespace bp
