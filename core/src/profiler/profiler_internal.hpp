// Internal: the hooks through which ops, copies, allocations, synchronisations and collectives
// reach the profiler and the memory history (profiler.hpp), and the state they record into.
// Note [Profiler cost when off] in profiler.hpp: every hook starts with observing().
#pragma once

#include "runtime/observer.hpp"

#include <backplane/profiler.hpp>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace bp::detail {

// A device interval on a stream: a pair of events recorded there, or (a plugin without event
// timing) a synchronisation and a host stamp on each side. Both ends are taken with the
// observer's lock held, so stop() never destroys an event between them (the session's
// generation must match at the end).
struct Interval {
  uint64_t generation = 0;  // the session it belongs to
  int stream = 0;           // stream number
  bp_event *ref = nullptr, *e0 = nullptr, *e1 = nullptr;
  int64_t ref_ns = 0, dev0 = -1, dev1 = -1;
};

// One copy or memset being recorded (Observer::copy_begin's record).
struct CopyRecord {
  CopyKind kind{};
  Device* dev = nullptr;
  bp_stream* stream = nullptr;
  uint64_t bytes = 0;
  int64_t host0 = 0;
  int tid = 0;
  Interval interval;
};

// The profiler's Observer (Note [Observers]) forwards to these.
void launch_observed(const Kernel& k, bp_stream* stream, std::span<const bp_tensor_desc> in,
                     std::span<const bp_tensor_desc> out, std::span<const bp_attr> attrs);
const char* copy_name(CopyKind k) noexcept;
void oom_top_users(Device& dev, std::string& out);
// Allocation hooks (DeviceState::allocate/release), called only when observing().
void on_alloc(Device& dev, const bp_buffer* b, uint64_t size, const StreamState* stream);
void on_free(Device& dev, const bp_buffer* b, uint64_t size);
// A stream synchronisation that began at host time `t0` (clock_ns()) just finished.
void on_sync(Device& dev, bp_stream* stream, int64_t t0);
// The next synchronisation on this thread is an implicit one of `what` (note_implicit_sync).
void on_implicit_sync(const Device& dev, const char* what);
// A collective or point-to-point operation issued from host time `t0` to now.
void on_collective(const char* op, Device& dev, uint64_t bytes, int64_t t0,
                   const std::string& what);

// ---- Recorded state (profiler.cpp writes it; profiler_output.cpp reads it) -------------------

enum class RecKind : uint8_t { op, copy, sync, alloc, free, collective, range };

struct Rec {
  RecKind kind = RecKind::op;
  std::string name;
  Device* dev = nullptr;         // null for ranges
  int stream = 0;                // stream number on dev
  int tid = 0;                   // host thread number
  int64_t host0 = 0, host1 = 0;  // ns from the session start
  // Device interval: events (resolved at stop) or host stamps of a synchronised stream.
  bp_event *e0 = nullptr, *e1 = nullptr, *ref = nullptr;
  int64_t ref_ns = 0;
  int64_t dev0 = -1;      // ns from the session start; -1: not measured
  double device_us = -1;  // -1: not measured
  uint64_t bytes = 0;     // copies, allocations, collectives
  uint64_t allocated_after = 0, reserved_after = 0;
  uintptr_t buffer = 0;   // allocations and frees
  bool implicit = false;  // syncs
  std::string detail;     // op: input shapes; sync: what; collective: description
  std::string dtype;      // op dtype
};

struct StreamTrack {
  bp_stream* handle = nullptr;
  int number = 0;
  bp_event* ref = nullptr;
  int64_t ref_ns = 0;  // host time just before `ref` was queued on the idle stream
};

struct DeviceTrack {
  Device* dev = nullptr;
  int pid = 0;
  bool timing = false;  // the plugin has events with elapsed time
  std::vector<StreamTrack> streams;
  std::vector<bp_event*> events;  // every event the session created, destroyed after stop
};

struct LiveBlock {
  uint64_t size = 0;
  int stream = 0;
  std::string op;
  uint64_t sequence = 0;
  int64_t rec = -1;  // its alloc record in the running session
};

struct ObserverState {
  std::mutex mu;
  // Session
  bool running = false;
  bool has_session = false;
  uint64_t generation = 0;  // of the session: start() counts up
  profiler::Options options;
  int64_t t0 = 0, t1 = 0;  // absolute clock_ns of start and stop
  std::vector<Rec> recs;
  std::vector<std::unique_ptr<DeviceTrack>> devices;
  // Memory history (Note [Memory history])
  uint64_t sequence = 0;
  std::map<std::pair<const Device*, const bp_buffer*>, LiveBlock> live;
  std::map<const Device*, std::vector<bp_stream*>> stream_numbers;
};
ObserverState& observer();  // never destroyed (a trace is written at exit)

// Stream number of `s` on `dev`: 0 for the default stream, then 1, 2, ... as first seen.
// Caller holds observer().mu.
int stream_number(ObserverState& o, Device& dev, bp_stream* s);

}  // namespace bp::detail
