// The profiler and memory snapshots on every device (profiler.hpp): a known sequence of ops gives
// a valid Chrome trace with the expected events, the table agrees with the trace, snapshots add
// up to the allocator's statistics, and out-of-memory errors carry the allocator summary.
#include "device_params.hpp"

#include <backplane/graph.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <map>
#include <thread>

using bptest::DeviceTest;
using json = nlohmann::json;

namespace {

class ProfilerTest : public DeviceTest {
 protected:
  void TearDown() override {
    if (bp::profiler::is_running()) bp::profiler::stop();
    bp::record_memory_history(false);
  }
  // Every event of the trace with this category, name and pid (-1: any pid).
  static std::vector<json> events(const json& trace, const std::string& cat,
                                  const std::string& name, int pid = -1) {
    std::vector<json> out;
    for (const json& e : trace["traceEvents"])
      if (e.value("cat", "") == cat && e["name"] == name && (pid < 0 || e["pid"] == pid))
        out.push_back(e);
    return out;
  }
  // The pid whose process_name names `dev`.
  static int pid_of(const json& trace, const std::string& dev) {
    for (const json& e : trace["traceEvents"])
      if (e["ph"] == "M" && e["name"] == "process_name" &&
          e["args"]["name"].get<std::string>().rfind(dev + " (", 0) == 0)
        return e["pid"].get<int>();
    return -1;
  }
};

// A host tensor of n random floats (created before the profiler starts).
bp::Tensor host_values(int64_t rows, int64_t cols) {
  std::vector<double> v = bptest::random_values(static_cast<size_t>(rows * cols), 0.5, 1.5);
  std::vector<float> f(v.begin(), v.end());
  return bp::from_vector(f, {rows, cols}, bp::device("cpu:0"));
}

TEST_P(ProfilerTest, KnownSequenceGivesTheExpectedTrace) {
  const int64_t rows = 17, cols = 63;  // odd sizes
  const uint64_t bytes = rows * cols * 4;
  bp::Tensor h = host_values(rows, cols);
  dev().synchronize();
  auto wall0 = std::chrono::steady_clock::now();
  bp::profiler::start();
  bp::Tensor x = h.copy_to(dev());
  bp::Tensor y = x;
  for (int i = 0; i < 3; ++i) y = y + x;
  bp::Tensor z = (y * x).exp();
  std::vector<float> back = z.to_vector<float>();
  bp::profiler::stop();
  double wall_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - wall0).count();
  ASSERT_EQ(back.size(), static_cast<size_t>(rows * cols));

  const bool same_plugin_as_host = dev().backend_name() == bp::device("cpu:0").backend_name();
  std::string path =
      ::testing::TempDir() + "bp_trace_" + bptest::param_name({GetParam(), 0}) + ".json";
  bp::profiler::save(path);
  std::ifstream f(path);
  json trace = json::parse(f);  // throws (fails the test) on invalid JSON
  ASSERT_TRUE(trace["traceEvents"].is_array());
  for (const json& e : trace["traceEvents"]) {  // trace-event format
    ASSERT_TRUE(e.contains("ph") && e.contains("name") && e.contains("pid")) << e.dump();
    std::string ph = e["ph"];
    ASSERT_TRUE(ph == "X" || ph == "i" || ph == "C" || ph == "M") << e.dump();
    if (ph != "M") {
      ASSERT_TRUE(e["ts"].is_number()) << e.dump();
    }
    if (ph == "X") {
      ASSERT_TRUE(e.contains("tid") && e["dur"].is_number()) << e.dump();
      EXPECT_GE(e["dur"].get<double>(), 0.0) << e.dump();
    }
  }
  double trace_wall = trace["otherData"]["wall_us"];
  EXPECT_GT(trace_wall, 0);
  EXPECT_LE(trace_wall, wall_us);
  int pid = pid_of(trace, dev().str());
  ASSERT_GT(pid, 0) << "no process track named " << dev().str();

  // Ops: on the host track with shapes, and on the device's default stream with device time.
  std::map<std::string, size_t> expect = {{"add", 3}, {"mul", 1}, {"exp", 1}};
  for (const auto& [name, n] : expect) {
    auto host = events(trace, "op", name, 0);
    ASSERT_EQ(host.size(), n) << name;
    EXPECT_EQ(host[0]["args"]["device"], dev().str());
    EXPECT_EQ(host[0]["args"]["dtype"], "f32");
    EXPECT_EQ(host[0]["args"]["inputs"].get<std::string>(),
              name == "exp" ? "f32[17,63]" : "f32[17,63], f32[17,63]");
    auto kernels = events(trace, "kernel", name, pid);
    ASSERT_EQ(kernels.size(), n) << name;
    for (const json& k : kernels) {
      EXPECT_EQ(k["tid"], 0) << "default stream";
      double dur = k["dur"], ts = k["ts"];
      EXPECT_GT(dur, 0.0) << name;
      EXPECT_LE(dur, trace_wall) << name;
      EXPECT_GE(ts, 0.0) << name;
      EXPECT_LE(ts + dur, trace_wall + 1.0) << name;
    }
  }
  // Copies: into the device (host->device, or device->device on the host's own plugin) and out
  // of it for to_vector (the CPU reads its memory directly: no copy).
  std::string in_name = same_plugin_as_host ? "copy_d2d" : "copy_h2d";
  auto copies_in = events(trace, "copy", in_name, 0);
  ASSERT_EQ(copies_in.size(), 1u) << in_name;
  EXPECT_EQ(copies_in[0]["args"]["bytes"], bytes);
  auto dev_copies = events(trace, "memcpy", in_name, pid);
  ASSERT_EQ(dev_copies.size(), 1u);
  EXPECT_GT(dev_copies[0]["dur"].get<double>(), 0.0);
  EXPECT_GT(dev_copies[0]["args"]["GB/s"].get<double>(), 0.0);
  auto copies_out = events(trace, "copy", "copy_d2h", 0);
  if (dev().properties().unified_memory) {
    EXPECT_EQ(copies_out.size(), 0u);
  } else {
    ASSERT_EQ(copies_out.size(), 1u);
    EXPECT_EQ(copies_out[0]["args"]["bytes"], bytes);
  }
  // The read is an implicit synchronisation.
  auto syncs = events(trace, "sync", "implicit synchronize", 0);
  ASSERT_GE(syncs.size(), 1u);
  EXPECT_EQ(syncs[0]["args"]["what"], "to_vector()");
  EXPECT_EQ(syncs[0]["args"]["device"], dev().str());
  // Allocations: x, three sums, the product and exp: six blocks of `bytes` on the device, each
  // attributed to the op that wrote it, with a memory counter beside each.
  std::map<std::string, int> allocs_by_op;
  for (const json& a : events(trace, "memory", "alloc", 0))
    if (a["args"]["device"] == dev().str() && a["args"]["bytes"] == bytes)
      ++allocs_by_op[a["args"]["op"].get<std::string>()];
  EXPECT_EQ(allocs_by_op[in_name], 1);
  EXPECT_EQ(allocs_by_op["add"], 3);
  EXPECT_EQ(allocs_by_op["mul"], 1);
  EXPECT_EQ(allocs_by_op["exp"], 1);
  size_t counters = 0;
  for (const json& e : trace["traceEvents"])
    if (e["ph"] == "C" && e["pid"] == pid) {
      ++counters;
      EXPECT_GE(e["args"]["reserved"].get<uint64_t>(), e["args"]["allocated"].get<uint64_t>());
    }
  EXPECT_GE(counters, 6u);

  // The table agrees with the trace: calls and device totals per name.
  std::vector<bp::profiler::OpSummary> summary = bp::profiler::key_averages();
  for (size_t i = 1; i < summary.size(); ++i)
    EXPECT_GE(summary[i - 1].device_us, summary[i].device_us);
  for (const auto& r : summary) {
    double sum = 0;
    size_t calls = 0;
    for (const std::string cat : {"kernel", "memcpy"})
      for (const json& k : events(trace, cat, r.name)) {
        sum += k["dur"].get<double>();
        ++calls;
      }
    EXPECT_EQ(static_cast<size_t>(r.calls), calls) << r.name;
    EXPECT_NEAR(r.device_us, sum, 1e-6 * std::max(1.0, sum)) << r.name;
  }
  std::string table = bp::profiler::table();
  EXPECT_NE(table.find("Device total"), std::string::npos) << table;
  EXPECT_NE(table.find("\nadd "), std::string::npos) << table;
  EXPECT_NE(table.find("\nTotal "), std::string::npos) << table;
  std::remove(path.c_str());
}

TEST_P(ProfilerTest, OffRecordsNothingAndStartTwiceIsAnError) {
  bp::profiler::start();
  EXPECT_TRUE(bp::profiler::is_running());
  try {
    bp::profiler::start();
    FAIL() << "second start did not throw";
  } catch (const bp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("already running"), std::string::npos) << e.what();
  }
  bp::profiler::stop();
  EXPECT_FALSE(bp::profiler::is_running());
  auto x = bp::ones({5}, dev()) + 1;  // after stop: not recorded
  (void)x.to_vector<float>();
  size_t adds = 0;
  const json trace = json::parse(bp::profiler::trace_json());
  for (const json& e : trace["traceEvents"])
    if (e["name"] == "add") ++adds;
  EXPECT_EQ(adds, 0u);
  EXPECT_THROW(bp::profiler::stop(), bp::Error);
}

// A replay is one range on the host track; its launches are not recorded one by one (they skip
// dispatch, the profiler's hook included), and nothing of the capture is recorded as run.
TEST_P(ProfilerTest, AGraphReplayIsOneRange) {
  auto x = bp::ones({16}, dev());
  bp::Graph g = bp::capture(dev(), [&] {
    for (int i = 0; i < 5; ++i) x.add_(x);
  });
  bp::profiler::start();
  g.replay();
  g.replay();
  dev().synchronize();
  bp::profiler::stop();
  const json trace = json::parse(bp::profiler::trace_json());
  const std::string name = g.native() ? "graph replay (native)" : "graph replay (recorded)";
  EXPECT_EQ(events(trace, "range", name, 0).size(), 2u) << name;
  EXPECT_EQ(events(trace, "op", "add", 0).size(), 0u);
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(16, 1024.0f));  // 2^10: ten doublings
}

TEST_P(ProfilerTest, ScopeObjectWritesTheTraceAndRangesNameBlocks) {
  std::string path =
      ::testing::TempDir() + "bp_scope_" + bptest::param_name({GetParam(), 0}) + ".json";
  {
    bp::profiler::Profile p(path);
    bp::profiler::Range r("my_block");
    auto t = bp::ones({8}, dev());  // allocated inside the range, written by fill
    t = t * 2;
  }
  std::ifstream f(path);
  json trace = json::parse(f);
  auto ranges = events(trace, "range", "my_block", 0);
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_GT(ranges[0]["dur"].get<double>(), 0.0);
  EXPECT_EQ(events(trace, "op", "mul", 0).size(), 1u);
  bool named = false;
  for (const json& a : events(trace, "memory", "alloc", 0))
    if (a["args"]["device"] == dev().str() && a["args"]["op"] == "my_block") named = true;
  EXPECT_TRUE(named) << "an allocation inside the Range is attributed to it";
  std::remove(path.c_str());
}

TEST_P(ProfilerTest, ThreadsGetTheirOwnHostTracks) {
  const int per_thread = 40 + static_cast<int>(bptest::random_values(1, 0, 20)[0]);
  auto x = bp::ones({7}, dev());
  dev().synchronize();
  bp::profiler::start();
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < per_thread; ++i) auto y = x + x;
    });
  for (auto& t : threads) t.join();
  dev().synchronize();
  bp::profiler::stop();
  json trace = json::parse(bp::profiler::trace_json());
  auto adds = events(trace, "op", "add", 0);
  ASSERT_EQ(adds.size(), static_cast<size_t>(3 * per_thread));
  std::map<int, int> per_tid;
  for (const json& e : adds) ++per_tid[e["tid"].get<int>()];
  ASSERT_EQ(per_tid.size(), 3u);
  for (const auto& [tid, n] : per_tid) EXPECT_EQ(n, per_thread) << "host thread " << tid;
  int pid = pid_of(trace, dev().str());
  auto kernels = events(trace, "kernel", "add", pid);
  EXPECT_EQ(kernels.size(), adds.size());
  for (const json& k : kernels) EXPECT_GT(k["dur"].get<double>(), 0.0);
}

TEST_P(ProfilerTest, SnapshotAccountsForTheAllocatorStats) {
  dev().synchronize();
  bp::record_memory_history(true);
  std::vector<bp::Tensor> keep;
  std::vector<double> v = bptest::random_values(3);
  int64_t n1 = 100 + static_cast<int64_t>(v[0] * 10 + 20), n2 = 333;
  keep.push_back(bp::ones({n1}, dev()));
  keep.push_back(keep[0] + keep[0]);
  keep.push_back(bp::zeros({n2}, dev(), bp::DType::i64));
  keep.push_back(keep[1].exp());
  bp::MemorySnapshot s = bp::memory_snapshot(dev());
  bp::MemoryStats st = dev().allocator().stats();
  EXPECT_EQ(s.device, dev().str());
  EXPECT_EQ(s.allocated, st.allocated);
  EXPECT_EQ(s.reserved, st.reserved);
  uint64_t sum = 0;
  for (const auto& b : s.blocks) sum += b.size;
  EXPECT_EQ(sum + s.untracked_bytes, s.allocated);
  EXPECT_EQ(s.blocks.size() + s.untracked_blocks, s.num_allocs);
  // The blocks of this test, attributed to the ops that wrote them.
  std::map<std::string, uint64_t> ours;
  for (const auto& b : s.blocks) {
    EXPECT_EQ(b.stream, 0);
    ours[b.op] += b.size;
  }
  EXPECT_GE(ours["fill"], static_cast<uint64_t>(n1 * 4 + n2 * 8));
  EXPECT_GE(ours["add"], static_cast<uint64_t>(n1 * 4));
  EXPECT_GE(ours["exp"], static_cast<uint64_t>(n1 * 4));
  for (size_t i = 1; i < s.blocks.size(); ++i) EXPECT_GE(s.blocks[i - 1].size, s.blocks[i].size);
  // Freed blocks leave the snapshot.
  uint64_t before = sum;
  keep.pop_back();
  bp::MemorySnapshot s2 = bp::memory_snapshot(dev());
  uint64_t sum2 = 0;
  for (const auto& b : s2.blocks) sum2 += b.size;
  EXPECT_EQ(before - sum2, static_cast<uint64_t>(n1 * 4));
  EXPECT_EQ(sum2 + s2.untracked_bytes, s2.allocated);
  json j = json::parse(s2.json());
  EXPECT_EQ(j["kind"], "backplane.memory_snapshot");
  EXPECT_EQ(j["allocated"], s2.allocated);
  EXPECT_EQ(j["segments"]["reserved"], s2.reserved);
  EXPECT_EQ(j["blocks"].size(), s2.blocks.size());
  EXPECT_EQ(j["untracked"]["bytes"], s2.untracked_bytes);
}

TEST_P(ProfilerTest, OutOfMemoryCarriesTheAllocatorSummary) {
  bp::record_memory_history(true);
  auto keep = bp::ones({1000}, dev());
  const int64_t absurd = int64_t(1) << 60;  // 4 EiB of f32
  try {
    auto t = bp::empty({absurd}, dev());
    FAIL() << "allocating 4 EiB on " << dev().str() << " succeeded";
  } catch (const bp::OutOfMemory& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("allocator summary for " + dev().str() + ": "), std::string::npos) << m;
    EXPECT_NE(m.find(" allocated in "), std::string::npos) << m;
    EXPECT_NE(m.find(" reserved ("), std::string::npos) << m;
    EXPECT_NE(m.find("largest free block"), std::string::npos) << m;
    EXPECT_NE(m.find("top users: fill "), std::string::npos) << m;
  }
  bp::record_memory_history(false);
  try {
    auto t = bp::empty({absurd}, dev());
    FAIL() << "allocating 4 EiB on " << dev().str() << " succeeded";
  } catch (const bp::OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("top users: not recorded (bp::record_memory_history"),
              std::string::npos)
        << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, ProfilerTest, ::testing::ValuesIn(bptest::device_strings()),
                         bptest::param_name);

}  // namespace
