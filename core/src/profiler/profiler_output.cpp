// The profiler's outputs: Chrome trace-event JSON, the per-op table, memory snapshots and the
// allocator summary of out-of-memory errors.
#include "profiler/profiler_internal.hpp"
#include "runtime/files.hpp"

#include <backplane/runtime.hpp>

#include <nlohmann/json.hpp>

#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <fstream>

namespace bp {

namespace detail {

// The "top users" part of Note [Out-of-memory summary] (the runtime writes the rest).
void oom_top_users(Device& dev, std::string& out) {
  ObserverState& o = observer();
  std::lock_guard<std::mutex> lock(o.mu);
  if (!observing()) {
    out += "; top users: not recorded (bp::record_memory_history(true) records them)";
    return;
  }
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_op;  // op -> bytes, blocks
  for (const auto& [key, blk] : o.live) {
    if (key.first != &dev) continue;
    auto& slot = by_op[blk.op.empty() ? "(not yet written)" : blk.op];
    slot.first += blk.size;
    slot.second += 1;
  }
  std::vector<std::pair<std::string, std::pair<uint64_t, uint64_t>>> users(by_op.begin(),
                                                                           by_op.end());
  std::sort(users.begin(), users.end(),
            [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  out += "; top users:";
  if (users.empty()) out += " none recorded";
  for (size_t i = 0; i < users.size() && i < 5; ++i)
    out += std::string(i ? "," : "") + " " + users[i].first + " " +
           format_size(users[i].second.first) + " (" + std::to_string(users[i].second.second) +
           (users[i].second.second == 1 ? " block)" : " blocks)");
}

}  // namespace detail

using detail::observer;
using detail::ObserverState;
using detail::Rec;
using detail::RecKind;
using json = nlohmann::json;

namespace {

double us(int64_t ns) {
  return static_cast<double>(ns) / 1e3;
}

const char* category(RecKind k) {
  switch (k) {
    case RecKind::op:
      return "op";
    case RecKind::copy:
      return "copy";
    case RecKind::sync:
      return "sync";
    case RecKind::alloc:
    case RecKind::free:
      return "memory";
    case RecKind::collective:
      return "collective";
    case RecKind::range:
      return "range";
  }
  return "?";
}

json meta(const char* what, int pid, int tid, const std::string& name) {
  json m = {{"ph", "M"}, {"name", what}, {"pid", pid}, {"args", {{"name", name}}}};
  if (tid >= 0) m["tid"] = tid;
  return m;
}

// Caller holds o.mu.
json build_trace(ObserverState& o) {
  json events = json::array();
  // Devices seen only through allocations or syncs have no track yet: give them one.
  std::vector<const Device*> devs;
  for (const auto& t : o.devices) devs.push_back(t->dev);
  for (const Rec& r : o.recs)
    if (r.dev && std::find(devs.begin(), devs.end(), r.dev) == devs.end()) devs.push_back(r.dev);
  auto pid = [&](const Device* d) {
    return static_cast<int>(std::find(devs.begin(), devs.end(), d) - devs.begin()) + 1;
  };
  events.push_back(meta("process_name", 0, -1, "host"));
  events.push_back(
      {{"ph", "M"}, {"name", "process_sort_index"}, {"pid", 0}, {"args", {{"sort_index", 0}}}});
  for (const Device* d : devs) {
    int p = pid(d);
    events.push_back(meta("process_name", p, -1, d->str() + " (" + d->properties().name + ")"));
    events.push_back(
        {{"ph", "M"}, {"name", "process_sort_index"}, {"pid", p}, {"args", {{"sort_index", p}}}});
  }
  std::vector<std::pair<int, int>> threads;  // (pid, tid) named so far
  auto name_thread = [&](int p, int tid) {
    if (std::find(threads.begin(), threads.end(), std::make_pair(p, tid)) != threads.end()) return;
    threads.emplace_back(p, tid);
    std::string n = p == 0 ? "host thread " + std::to_string(tid)
                           : "stream " + std::to_string(tid) + (tid == 0 ? " (default)" : "");
    events.push_back(meta("thread_name", p, tid, n));
  };
  for (const Rec& r : o.recs) {
    name_thread(0, r.tid);
    json args = json::object();
    if (r.dev) {
      args["device"] = r.dev->str();
      args["stream"] = r.stream;
    }
    switch (r.kind) {
      case RecKind::op:
        args["dtype"] = r.dtype;
        args["inputs"] = r.detail;
        break;
      case RecKind::copy:
        args["bytes"] = r.bytes;
        if (r.device_us > 0) args["GB/s"] = static_cast<double>(r.bytes) / (r.device_us * 1e3);
        break;
      case RecKind::sync:
        args["implicit"] = r.implicit;
        if (!r.detail.empty()) args["what"] = r.detail;
        break;
      case RecKind::alloc:
      case RecKind::free: {
        args["bytes"] = r.bytes;
        args["allocated_after"] = r.allocated_after;
        args["reserved_after"] = r.reserved_after;
        char id[32];
        std::snprintf(id, sizeof id, "0x%llx", static_cast<unsigned long long>(r.buffer));
        args["block"] = id;
        args["op"] = r.detail.empty() ? "(not yet written)" : r.detail;
        break;
      }
      case RecKind::collective:
        args["bytes"] = r.bytes;
        args["what"] = r.detail;
        break;
      case RecKind::range:
        break;
    }
    if (r.device_us >= 0) args["device_us"] = r.device_us;
    json h = {{"name", r.name}, {"cat", category(r.kind)}, {"pid", 0},
              {"tid", r.tid},   {"ts", us(r.host0)},       {"args", args}};
    if (r.kind == RecKind::alloc || r.kind == RecKind::free) {
      h["ph"] = "i";
      h["s"] = "t";
      events.push_back(h);
      events.push_back(
          {{"ph", "C"},
           {"name", "memory"},
           {"pid", pid(r.dev)},
           {"ts", us(r.host0)},
           {"args", {{"allocated", r.allocated_after}, {"reserved", r.reserved_after}}}});
      continue;
    }
    h["ph"] = "X";
    h["dur"] = us(r.host1 - r.host0);
    events.push_back(std::move(h));
    if ((r.kind == RecKind::op || r.kind == RecKind::copy) && r.dev0 >= 0 && r.device_us >= 0) {
      int p = pid(r.dev);
      name_thread(p, r.stream);
      events.push_back({{"name", r.name},
                        {"cat", r.kind == RecKind::op ? "kernel" : "memcpy"},
                        {"ph", "X"},
                        {"pid", p},
                        {"tid", r.stream},
                        {"ts", us(r.dev0)},
                        {"dur", r.device_us},
                        {"args", args}});
    }
  }
  int64_t end = o.running ? detail::clock_ns() : o.t1;
  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ms"},
          {"otherData",
           {{"producer", "backplane"}, {"wall_us", us(end - o.t0)}, {"complete", !o.running}}}};
}

std::string format_us(double v) {
  char buf[32];
  if (v >= 1e6)
    std::snprintf(buf, sizeof buf, "%.3f s", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(buf, sizeof buf, "%.3f ms", v / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.3f us", v);
  return buf;
}

}  // namespace

namespace profiler {

std::string trace_json() {
  ObserverState& o = observer();
  std::lock_guard<std::mutex> lock(o.mu);
  if (!o.has_session) throw Error("bp::profiler::trace_json: no session was recorded; start() one");
  return build_trace(o).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void save(const std::string& given) {
  std::string text = trace_json();
  const std::string path = detail::output_target(given, "bp::profiler::save");
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw IOError("bp::profiler::save: cannot open " + tmp + " for writing");
    f << text;
    f.close();
    if (!f) {
      std::remove(tmp.c_str());
      throw IOError("bp::profiler::save: writing " + tmp + " failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw IOError("bp::profiler::save: cannot rename " + tmp + " to " + path);
  }
}

std::vector<OpSummary> key_averages() {
  ObserverState& o = observer();
  std::lock_guard<std::mutex> lock(o.mu);
  std::vector<OpSummary> rows;
  for (const Rec& r : o.recs) {
    if (r.kind != RecKind::op && r.kind != RecKind::copy) continue;
    auto it = std::find_if(rows.begin(), rows.end(),
                           [&](const OpSummary& s) { return s.name == r.name; });
    if (it == rows.end()) {
      rows.push_back({});
      it = rows.end() - 1;
      it->name = r.name;
    }
    it->calls += 1;
    if (r.device_us > 0) it->device_us += r.device_us;
    it->host_us += us(r.host1 - r.host0);
    it->bytes += r.bytes;
  }
  std::stable_sort(rows.begin(), rows.end(), [](const OpSummary& a, const OpSummary& b) {
    return a.device_us != b.device_us ? a.device_us > b.device_us : a.host_us > b.host_us;
  });
  return rows;
}

std::string table(size_t row_limit) {
  std::vector<OpSummary> rows = key_averages();
  double total_dev = 0, total_host = 0;
  int64_t total_calls = 0;
  for (const auto& r : rows) {
    total_dev += r.device_us;
    total_host += r.host_us;
    total_calls += r.calls;
  }
  size_t width = 5;
  for (const auto& r : rows) width = std::max(width, r.name.size());
  char line[256];
  std::string out;
  auto row = [&](const std::string& name, const std::string& calls, const std::string& dt,
                 const std::string& dm, const std::string& share, const std::string& ht,
                 const std::string& hm) {
    std::snprintf(line, sizeof line, "%-*s %7s %14s %13s %7s %14s %13s\n", static_cast<int>(width),
                  name.c_str(), calls.c_str(), dt.c_str(), dm.c_str(), share.c_str(), ht.c_str(),
                  hm.c_str());
    out += line;
  };
  row("Name", "Calls", "Device total", "Device mean", "Share", "Host total", "Host mean");
  out += std::string(width + 74, '-') + "\n";
  size_t shown = 0;
  for (const auto& r : rows) {
    if (row_limit && shown++ >= row_limit) break;
    char share[16];
    std::snprintf(share, sizeof share, "%.1f%%",
                  total_dev > 0 ? 100.0 * r.device_us / total_dev : 0.0);
    row(r.name, std::to_string(r.calls), format_us(r.device_us), format_us(r.mean_device_us()),
        share, format_us(r.host_us),
        format_us(r.calls ? r.host_us / static_cast<double>(r.calls) : 0));
  }
  out += std::string(width + 74, '-') + "\n";
  row("Total", std::to_string(total_calls), format_us(total_dev), "", "100.0%",
      format_us(total_host), "");
  // Note [Fallback policy]: the ops that ran as a decomposition or on another device.
  if (!fallback_stats().empty()) {
    out += '\n';
    out += fallback_table();
  }
  return out;
}

}  // namespace profiler

// ---- Memory snapshots ------------------------------------------------------------------------

MemorySnapshot memory_snapshot(Device& dev) {
  MemorySnapshot snap;
  snap.device = dev.str();
  detail::DeviceState& s = detail::state(dev);
  ObserverState& o = observer();
  // The lock keeps allocations of other threads out between the statistics and the table.
  std::lock_guard<std::mutex> lock(o.mu);
  const MemoryStats m = s.memory_stats();
  snap.allocated = m.allocated;
  snap.reserved = m.reserved;
  snap.peak_allocated = m.peak_allocated;
  snap.num_allocs = m.num_allocs;
  snap.total_memory = dev.properties().total_memory;
  snap.free_memory = dev.free_memory();
  uint64_t tracked = 0;
  for (const auto& [key, blk] : o.live) {
    if (key.first != &dev) continue;
    snap.blocks.push_back(
        {blk.size, blk.stream, blk.op.empty() ? "(not yet written)" : blk.op, blk.sequence});
    tracked += blk.size;
  }
  std::sort(snap.blocks.begin(), snap.blocks.end(), [](const MemoryBlock& a, const MemoryBlock& b) {
    return a.size != b.size ? a.size > b.size : a.sequence < b.sequence;
  });
  snap.untracked_bytes = snap.allocated > tracked ? snap.allocated - tracked : 0;
  snap.untracked_blocks =
      snap.num_allocs > snap.blocks.size() ? snap.num_allocs - snap.blocks.size() : 0;
  return snap;
}

std::string MemorySnapshot::json() const {
  nlohmann::json blocks = nlohmann::json::array();
  for (const MemoryBlock& b : this->blocks)
    blocks.push_back(
        {{"size", b.size}, {"stream", b.stream}, {"op", b.op}, {"sequence", b.sequence}});
  nlohmann::json j = {{"kind", "backplane.memory_snapshot"},
                      {"device", device},
                      {"allocated", allocated},
                      {"reserved", reserved},
                      {"peak_allocated", peak_allocated},
                      {"num_allocs", num_allocs},
                      {"total_memory", total_memory},
                      {"free_memory", free_memory},
                      {"segments",
                       {{"reserved", reserved},
                        {"cached", cached()},
                        {"note", "the plugin ABI reports reserved bytes as one total"}}},
                      {"untracked", {{"bytes", untracked_bytes}, {"blocks", untracked_blocks}}},
                      {"blocks", std::move(blocks)}};
  return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace bp
