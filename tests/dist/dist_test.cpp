// Distributed tests: the stores, configuration errors, the communicator load report, a group of
// one, the sampler and gradient hooks in process; then multi-rank scenarios through bp-run with
// the rank program (bp_dist_rank), and the communicator conformance suite.
#include <backplane/abi/comm_abi.h>
#include <backplane/backplane.hpp>
#include <backplane/dist.hpp>
#include <backplane/nn.hpp>
#include <backplane/parallel.hpp>
#include <backplane/train.hpp>
#include <backplane_test/child.hpp>
#include <backplane_test/gtest_compare.hpp>
#include <backplane_test/seed.hpp>
#include <backplane_test/throws.hpp>

#include <backplane_test/throws.hpp>

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>

namespace {

namespace d = bp::dist;
namespace fs = std::filesystem;
using std::chrono::milliseconds;

// ---- helpers ------------------------------------------------------------------------------------

struct Output {
  int status = -1;
  std::string out;
};

// Runs a shell command line, output and errors together.
Output run(const std::string& cmd) {
  const bp_test::ChildResult c = bp_test::run_command(cmd);
  return {c.exit_code(), c.output};
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

std::string temp_dir(const std::string& tag) {
  std::string t = fs::temp_directory_path() / ("bp_dist_" + tag + "_XXXXXX");
  if (!::mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed");
  return t;
}

// A port nothing listens on: bound, read back and closed (connections to it are refused).
int closed_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

const std::string kRank = BP_DIST_RANK;
const std::string kBpRun = BP_RUN;
const std::string kConformance = BP_CONFORMANCE;
const std::string kCommFixtures = BP_COMM_FIXTURE_DIR;
const std::string kDeviceFixtures = BP_DEVICE_FIXTURE_DIR;
const std::string kSmi = BP_SMI;
const std::string kSecret = d::generate_store_secret();

bool has_opencl() {
  return bp::num_devices("opencl") > 0;
}

// ---- stores -------------------------------------------------------------------------------------

class StoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "file") {
      dir_ = temp_dir("store");
      store_ = std::make_unique<d::FileStore>(dir_);
    } else if (GetParam() == "tcp") {
      server_ = std::make_unique<d::TcpStoreServer>("127.0.0.1", 0, kSecret);
      store_ =
          std::make_unique<d::TcpStore>("127.0.0.1", server_->port(), milliseconds(5000), kSecret);
    } else {
      store_ = std::make_unique<d::MemoryStore>();
    }
  }
  void TearDown() override {
    store_.reset();
    server_.reset();
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string dir_;
  std::unique_ptr<d::TcpStoreServer> server_;
  std::unique_ptr<d::Store> store_;
};

TEST_P(StoreTest, SetGetBinaryAndSeveralKeys) {
  std::string bin("a\0b\xff\n", 5);
  store_->set("x/y", bin);
  store_->set("k2", "two");
  EXPECT_EQ(store_->get("x/y", milliseconds(1000)), bin);
  auto v = store_->get(std::vector<std::string>{"k2", "x/y"}, milliseconds(1000));
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0], "two");
  EXPECT_EQ(v[1], bin);
  EXPECT_FALSE(store_->try_get("missing").has_value());
  EXPECT_EQ(store_->try_get("x/y"), std::optional<std::string>(bin));
  store_->set("k2", "");  // overwrite with empty
  EXPECT_EQ(store_->get("k2", milliseconds(1000)), "");
}

TEST_P(StoreTest, MissingKeysTimeOutNamingThem) {
  store_->set("present", "1");
  try {
    store_->get(std::vector<std::string>{"present", "absent/1", "absent/2"}, milliseconds(100));
    FAIL() << "no StoreTimeout";
  } catch (const d::StoreTimeout& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("absent/1, absent/2"), std::string::npos) << m;
    EXPECT_EQ(m.find("present,"), std::string::npos) << m;
    EXPECT_NE(m.find("did not appear within 0.1 s"), std::string::npos) << m;
  }
}

TEST_P(StoreTest, AddIsAtomicAcrossHandlesAndThreads) {
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      auto mine = store_->clone();
      for (int i = 0; i < 50; ++i) mine->add("counter", 2);
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(store_->add("counter", 0), 400);
  EXPECT_EQ(store_->get("counter", milliseconds(100)), "400");
  store_->erase({"counter", "never-set"});
  EXPECT_FALSE(store_->try_get("counter"));
  EXPECT_EQ(store_->add("counter", -3), -3);
}

TEST_P(StoreTest, BlockingGetWakesOnSetFromAnotherHandle) {
  auto writer = store_->clone();
  std::thread t([&] {
    std::this_thread::sleep_for(milliseconds(50));
    writer->set("late", "here");
  });
  EXPECT_EQ(store_->get("late", milliseconds(20000)), "here");
  t.join();
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreTest, ::testing::Values("file", "tcp", "memory"),
                         [](const auto& info) { return info.param; });

TEST(TcpStore, OnDisconnectSetsTheKeyUnlessLeftOrAlreadySet) {
  d::TcpStoreServer server("127.0.0.1", 0, kSecret);
  d::TcpStore observer("127.0.0.1", server.port(), milliseconds(5000), kSecret);
  {
    d::TcpStore a("127.0.0.1", server.port(), milliseconds(5000), kSecret);
    a.set_on_disconnect("gone/a", "a died");
  }
  EXPECT_EQ(observer.get("gone/a", milliseconds(5000)), "a died");
  {
    d::TcpStore b("127.0.0.1", server.port(), milliseconds(5000), kSecret);
    b.set_on_disconnect("gone/b", "b died");
    b.leave();
  }
  observer.set("gone/c", "first reason");
  {
    d::TcpStore c("127.0.0.1", server.port(), milliseconds(5000), kSecret);
    c.set_on_disconnect("gone/c", "c died");
  }
  observer.set("sync", "1");  // the server handled the closes before this reply
  observer.get("sync", milliseconds(1000));
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_FALSE(observer.try_get("gone/b").has_value());
  EXPECT_EQ(observer.get("gone/c", milliseconds(100)), "first reason");
}

TEST(TcpStore, ServerOnAPortInUseAndClientOfNothingAreTypedErrors) {
  d::TcpStoreServer first("127.0.0.1", 0, kSecret);
  try {
    d::TcpStoreServer second("127.0.0.1", first.port(), kSecret);
    FAIL() << "bound the same port twice";
  } catch (const d::RendezvousError& e) {
    EXPECT_NE(std::string(e.what()).find("Address already in use"), std::string::npos) << e.what();
  }
  int port = closed_port();
  try {
    d::TcpStore client("127.0.0.1", port, milliseconds(300), kSecret);
    FAIL() << "connected to a closed port";
  } catch (const d::RendezvousError& e) {
    std::string m = e.what();
    EXPECT_NE(
        m.find("could not reach the rendezvous store at tcp://127.0.0.1:" + std::to_string(port)),
        std::string::npos)
        << m;
    EXPECT_NE(m.find("Connection refused"), std::string::npos) << m;
  }
}

// ---- configuration errors and a group of one ----------------------------------------------------

struct EnvGuard {
  std::vector<std::string> names;
  void set(const char* n, const char* v) {
    names.push_back(n);
    ::setenv(n, v, 1);
  }
  ~EnvGuard() {
    for (auto& n : names) ::unsetenv(n.c_str());
  }
};

TEST(InitErrors, MalformedRendezvousAndRankVariables) {
  auto expect = [](const d::InitOptions& o, const std::string& fragment) {
    try {
      d::init_process_group(o);
      d::destroy_process_group();
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const d::RendezvousError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect({.rank = 0, .world_size = 2, .init_method = "udp://host:1"},
         "is not a rendezvous address; expected file:///absolute/dir or tcp://host:port");
  expect({.rank = 0, .world_size = 2, .init_method = "tcp://host"}, "has no port");
  expect({.rank = 0, .world_size = 2, .init_method = "tcp://host:70000"},
         "has no port between 1 and 65535");
  expect({.rank = 0, .world_size = 2, .init_method = "file://relative/dir"},
         "does not name an absolute path");
  expect({.rank = 3, .world_size = 2}, "rank 3 (from InitOptions) is not below the world size 2");
  expect({.rank = 1, .world_size = 2}, "has no rendezvous: set BACKPLANE_INIT");
  {
    EnvGuard env;
    env.set("BACKPLANE_RANK", "1");
    expect({}, "BACKPLANE_RANK is set but BACKPLANE_WORLD_SIZE is not");
    env.set("BACKPLANE_WORLD_SIZE", "two");
    expect({}, "BACKPLANE_WORLD_SIZE='two' is not an integer from 1 to 65536");
    env.set("BACKPLANE_WORLD_SIZE", "20000000");  // once 6.65 GB of keys, then a wrong diagnosis
    expect({}, "BACKPLANE_WORLD_SIZE='20000000' is not an integer from 1 to 65536");
  }
  {
    EnvGuard env;
    env.set("SLURM_PROCID", "0");
    env.set("SLURM_NTASKS", "1");
    env.set("BACKPLANE_DIST_TIMEOUT", "-4");
    expect({}, "BACKPLANE_DIST_TIMEOUT='-4' is not a number of seconds from 0.001 to 31536000");
    for (const char* v : {"inf", "1e300", "1e-9", "nan"}) {  // once accepted, failing later
      env.set("BACKPLANE_DIST_TIMEOUT", v);
      expect({}, std::string("BACKPLANE_DIST_TIMEOUT='") + v +
                     "' is not a number of seconds from 0.001 to 31536000");
    }
    env.set("BACKPLANE_DIST_TIMEOUT", "30");
    for (const char* v : {"yes", "true", "00", " 1", "2", "Full"}) {  // "yes" once meant on
      env.set("BACKPLANE_DIST_CHECK", v);
      expect({}, std::string("BACKPLANE_DIST_CHECK='") + v +
                     "' is not 0 (no descriptor checks), 1 (each signature's first call, the "
                     "default) or full (every call)");
    }
    env.set("BACKPLANE_DIST_CHECK", "1");
    for (const char* v : {"yes", "2", "true"}) {
      env.set("BACKPLANE_DIST_NONBLOCKING", v);
      expect({}, std::string("BACKPLANE_DIST_NONBLOCKING='") + v +
                     "' is not 0 (blocking communicators, the default) or 1");
    }
    ::unsetenv("BACKPLANE_DIST_NONBLOCKING");
  }
  try {  // once silently Gloo
    d::init_process_group({.rank = 0,
                           .world_size = 2,
                           .init_method = "file:///nonexistent/never-used",
                           .backend = "garbage"});
    ADD_FAILURE() << "an unknown backend was accepted";
  } catch (const d::BackendUnavailable& e) {
    EXPECT_NE(std::string(e.what()).find("InitOptions::backend='garbage': no communicator plugin "
                                         "'garbage' was found (found: "),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(d::group(), d::DistError);
  EXPECT_FALSE(d::is_initialized());
}

TEST(GroupOfOne, CollectivesAreTheIdentityAndTwoInitsAreAnError) {
  EnvGuard env;
  env.set("OMPI_COMM_WORLD_RANK", "0");  // mpirun's variables are read too
  env.set("OMPI_COMM_WORLD_SIZE", "1");
  d::init_process_group();
  EXPECT_EQ(d::get_rank(), 0);
  EXPECT_EQ(d::get_world_size(), 1);
  try {
    d::init_process_group();
    ADD_FAILURE() << "second init accepted";
  } catch (const d::DistError& e) {
    EXPECT_NE(std::string(e.what()).find("already initialised (rank 0 of 1)"), std::string::npos);
  }
  std::mt19937 rng(std::random_device{}());
  std::vector<float> v(37);
  for (auto& x : v) x = std::uniform_real_distribution<float>(-5, 5)(rng);
  bp::Tensor t = bp::from_vector(v, {37});
  d::all_reduce(t, d::ReduceOp::avg).wait();
  EXPECT_EQ(t.to_vector<float>(), v);
  bp::Tensor out = bp::zeros({1, 37});
  d::all_gather(out, t).wait();
  EXPECT_EQ(out.reshape({37}).to_vector<float>(), v);
  if (has_opencl()) {
    bp::Tensor g = t.to(bp::device("opencl:0"));
    d::Work w = d::all_reduce(g, d::ReduceOp::max);
    w.wait();
    EXPECT_TRUE(w.staged());
    EXPECT_NE(w.description().find("staged through host memory"), std::string::npos)
        << w.description();
    EXPECT_EQ(g.to_vector<float>(), v);
  }
  d::barrier();
  d::destroy_process_group();
  EXPECT_FALSE(d::is_initialized());
}

TEST(GroupOfOne, TheProfilerRecordsCollectivesWithBytesAndDevice) {
  EnvGuard env;
  env.set("OMPI_COMM_WORLD_RANK", "0");
  env.set("OMPI_COMM_WORLD_SIZE", "1");
  d::init_process_group();
  std::mt19937 rng(std::random_device{}());
  const int64_t n = std::uniform_int_distribution<int64_t>(10, 500)(rng);
  bp::Tensor t = bp::rand({n});
  bp::Tensor out = bp::zeros({1, n});
  bp::profiler::start();
  d::all_reduce(t, d::ReduceOp::sum).wait();
  d::all_gather(out, t).wait();
  d::barrier();
  bp::profiler::stop();
  d::destroy_process_group();
  auto trace = nlohmann::json::parse(bp::profiler::trace_json());
  std::map<std::string, std::vector<nlohmann::json>> got;
  for (const auto& e : trace["traceEvents"])
    if (e.value("cat", "") == "collective") got[e["name"].get<std::string>()].push_back(e);
  ASSERT_EQ(got["all_reduce"].size(), 1u) << "n = " << n;
  ASSERT_EQ(got["all_gather"].size(), 1u);
  ASSERT_EQ(got["barrier"].size(), 1u);
  const auto& ar = got["all_reduce"][0];
  EXPECT_EQ(ar["args"]["bytes"], static_cast<uint64_t>(n * 4));
  EXPECT_EQ(ar["args"]["device"], "cpu:0");
  EXPECT_NE(ar["args"]["what"].get<std::string>().find("all_reduce"), std::string::npos);
  EXPECT_GE(ar["dur"].get<double>(), 0.0);
  EXPECT_EQ(got["all_gather"][0]["args"]["bytes"], static_cast<uint64_t>(2 * n * 4));
}

TEST(GroupOfOne, DistributedDataParallelKeepsGradientsAndNoticesReplacedParameters) {
  d::init_process_group({.rank = 0, .world_size = 1});
  bp::manual_seed(5);
  auto lin = std::make_shared<bp::nn::Linear>(6, 3);
  bp::nn::Linear plain(6, 3);
  plain.load_state_dict({{"weight", lin->weight().clone()}, {"bias", lin->bias().clone()}});
  bp::nn::DistributedDataParallel ddp(lin, {.bucket_cap_mb = 0.00005});  // one bucket each
  EXPECT_EQ(ddp.bucket_layout().size(), 2u);
  EXPECT_EQ(ddp.named_parameters()[0].first, "module.weight");
  bp::Tensor x = bp::rand({4, 6});
  (ddp(x) * 3.0).sum().backward();
  (plain(x) * 3.0).sum().backward();
  EXPECT_TRUE(bp::allclose(lin->weight().grad(), plain.weight().grad()));
  EXPECT_TRUE(bp::allclose(lin->bias().grad(), plain.bias().grad()));
  lin->to(bp::DType::f64);
  try {
    ddp(x.to(bp::DType::f64));
    ADD_FAILURE() << "forward after the parameters were replaced did not throw";
  } catch (const bp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("parameters were replaced or changed after it was wrapped "
                                         "(weight is now f64 on "),
              std::string::npos)
        << e.what();
  }
  d::destroy_process_group();
}

// Review F20: an exception inside backward (here from a gradient hook that runs before DDP's,
// as an out-of-memory error would) must not leave DDP throwing on every later forward: the
// next forward throws once, naming the parameter, then training goes on with correct
// gradients.
TEST(GroupOfOne, DistributedDataParallelRecoversFromAnExceptionInsideBackward) {
  d::init_process_group({.rank = 0, .world_size = 1});
  bp::manual_seed(bp_test::test_seed("bp_dist_tests"));
  auto lin = std::make_shared<bp::nn::Linear>(6, 3);
  bp::nn::Linear plain(6, 3);
  plain.load_state_dict({{"weight", lin->weight().clone()}, {"bias", lin->bias().clone()}});
  bool inject = true;
  lin->weight().register_post_accumulate_grad_hook([&](const bp::Tensor&) {
    if (inject) throw bp::OutOfMemory("injected: out of memory inside backward");
  });
  bp::nn::DistributedDataParallel ddp(lin, {.bucket_cap_mb = 0.00005});  // one bucket each
  bp::Tensor x = bp::rand({4, 6});
  EXPECT_HAS(bp_test::expect_throw<bp::OutOfMemory>([&] { (ddp(x) * 3.0).sum().backward(); }),
             "injected: out of memory");
  inject = false;
  std::string once = bp_test::expect_throw<bp::Error>([&] { ddp(x); });
  EXPECT_HAS(once, "1 parameter(s) got no gradient");
  EXPECT_HAS(once, "(weight)");
  ddp.zero_grad();
  (ddp(x) * 3.0).sum().backward();  // the iteration was dropped: this one is whole
  (plain(x) * 3.0).sum().backward();
  const int32_t f32 = static_cast<int32_t>(bp::DType::f32);
  EXPECT_TRUE(bp_test::all_close(f32, lin->weight().grad().to_vector<double>(),
                                 plain.weight().grad().to_vector<double>()));
  EXPECT_TRUE(bp_test::all_close(f32, lin->bias().grad().to_vector<double>(),
                                 plain.bias().grad().to_vector<double>()));
  EXPECT_NO_THROW(ddp(x));
  d::destroy_process_group();
}

// The calling thread's current CUDA device, read through the driver (the current context is
// the driver's per-thread state, shared by every CUDA runtime in the process: the plugins link
// their own); -1 where it cannot be read.
int current_cuda_device() {
  static void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return -1;
  using GetCurrent = int (*)(void**);
  using GetDevice = int (*)(int*);
  static auto get_current = reinterpret_cast<GetCurrent>(dlsym(lib, "cuCtxGetCurrent"));
  static auto get_device = reinterpret_cast<GetDevice>(dlsym(lib, "cuCtxGetDevice"));
  void* ctx = nullptr;
  int dev = -1;
  if (!get_current || !get_device || get_current(&ctx) != 0 || !ctx || get_device(&dev) != 0)
    return -1;
  return dev;
}

// Review F19 (needs two CUDA GPUs and the NCCL plugin; skipped elsewhere): the comm ABI says a
// plugin leaves the calling thread's current device as it found it. The thread issues
// collectives on a communicator of cuda:0 (the CUDA plugin may make cuda:0 current for the
// stream work around them, keeping its current-device cache in step), computes on cuda:1 (cuda:1
// current, and so in the CUDA plugin's cache), then host-waits, which polls the NCCL work from
// this thread: the current device must still be cuda:1 (the plugin before the fix set cuda:0
// there behind the CUDA plugin's cache, whose next cuda:1 launch then went to the wrong device).
TEST(GroupOfOne, NcclLeavesTheCallingThreadsCurrentDevice) {
  if (bp::num_devices("cuda") < 2) GTEST_SKIP() << "needs two CUDA devices";
  bool nccl = false;
  for (const auto& r : d::comm_load_report()) nccl = nccl || (r.name == "nccl" && r.available);
  if (!nccl) GTEST_SKIP() << "the nccl communicator plugin cannot run here";
  d::init_process_group({.rank = 0, .world_size = 1, .backend = "cuda:nccl"});
  bp::Device& gpu0 = bp::device("cuda:0");
  bp::Device& gpu1 = bp::device("cuda:1");
  bp::manual_seed(bp_test::test_seed("bp_dist_tests"));
  bp::Tensor r = bp::rand({4096}, gpu0);
  std::vector<double> r_before = r.to_vector<double>();
  bp::Tensor a = bp::rand({1000}, gpu1);
  std::vector<double> a_host = a.to_vector<double>();
  const int32_t f32 = static_cast<int32_t>(bp::DType::f32);
  for (int round = 0; round < 2; ++round) {
    d::Work w = round == 0 ? d::all_reduce(r) : d::broadcast(r, 0);  // NCCL on cuda:0
    bp::Tensor b = a * 2.0;  // the CUDA plugin makes cuda:1 current
    ASSERT_EQ(current_cuda_device(), 1) << "a launch on cuda:1 left another current device";
    w.wait(std::chrono::seconds(60));  // a host wait: the NCCL plugin polls from this thread
    EXPECT_EQ(current_cuda_device(), 1)
        << "round " << round << ": Work::wait(timeout) changed the current device";
    bp::Tensor c = b + 1.0;  // a launch on cuda:1 right after
    std::vector<double> want;
    for (double v : a_host) want.push_back(v * 2.0 + 1.0);
    EXPECT_TRUE(bp_test::all_close(f32, c.to_vector<double>(), want));
  }
  EXPECT_TRUE(bp_test::all_close(f32, r.to_vector<double>(), r_before));  // a world of one
  d::destroy_process_group();
}

TEST(GroupOfOne, CollectivesAreRefusedDuringAGraphCapture) {
  d::init_process_group({.rank = 0, .world_size = 1});
  bp::Device& cpu = bp::device("cpu:0");
  bp::Tensor t = bp::rand({8}, cpu);
  bp::Graph g;
  g.begin_capture(cpu);
  try {
    (void)d::all_reduce(t);
    ADD_FAILURE() << "all_reduce was captured";
  } catch (const bp::CaptureError& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce cannot be captured"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(g.capturing());
  g.abort_capture();
  d::all_reduce(t).wait();  // eager again: runs
  d::destroy_process_group();
}

// ---- communicator plugins in the load report
// -------------------------------------------------------

nlohmann::json smi_json(const std::string& env) {
  Output r = run(env + " " + kSmi + " --json");
  EXPECT_EQ(r.status, 0) << r.out;
  return nlohmann::json::parse(r.out);
}

TEST(CommReport, FirstPartyPluginsServeTheirDeviceTypes) {
  auto j = smi_json("");
  bool gloo = false;
  for (const auto& p : j["comm_plugins"]) {
    if (p["name"] == "gloo") {
      gloo = true;
      EXPECT_EQ(p["status"], "loaded");
      EXPECT_EQ(p["device_types"], nlohmann::json::array({"cpu"}));
      EXPECT_TRUE(p["available"].get<bool>());
      // Gloo re-initialises after a failure; it cannot shrink (comm ABI 1.2).
      EXPECT_EQ(p["capabilities"], "abort-any-thread,reinit");
      EXPECT_HAS(p["capability_note"].get<std::string>(), "Gloo cannot shrink a context");
    }
    if (p["name"] == "nccl") {
      EXPECT_EQ(p["device_types"], nlohmann::json::array({"cuda"}));
      EXPECT_HAS(p["capabilities"].get<std::string>(), "abort-any-thread");
      EXPECT_HAS(p["capabilities"].get<std::string>(), "reinit");
      if (p["capabilities"].get<std::string>().find("shrink") == std::string::npos) {
        EXPECT_FALSE(p["capability_note"].get<std::string>().empty());
      }
    }
  }
  EXPECT_TRUE(gloo) << j.dump(1);
  for (const auto& p : j["plugins"])  // device plugins never list comm-* files
    EXPECT_EQ(p["path"].get<std::string>().find("libbackplane-comm-"), std::string::npos);
}

TEST(CommReport, EveryBrokenFixtureHasItsReason) {
  auto j = smi_json("BACKPLANE_PLUGIN_PATH=" + kCommFixtures);
  std::map<std::string, std::string> reason, decision;
  for (const auto& p : j["comm_plugins"]) {
    std::string file = fs::path(p["path"].get<std::string>()).filename();
    reason[file] = p["reason"];
    decision[file] = p["decision"];
  }
  auto has = [&](const std::string& f, const std::string& frag) {
    EXPECT_NE(reason[f].find(frag), std::string::npos) << f << ": " << reason[f];
  };
  has("libbackplane-comm-fxmajor2.so", "comm ABI 2." + std::to_string(BP_COMM_ABI_MINOR) +
                                           " vs host 1." + std::to_string(BP_COMM_ABI_MINOR) +
                                           ": major versions differ");
  has("libbackplane-comm-fxnoentry.so", "missing entry symbol bp_comm_get_api");
  has("libbackplane-comm-fxnoslot.so", "required slot 'all_reduce' is NULL");
  has("libbackplane-comm-fxinitfail.so", "init failed: the fixture's init fails on purpose");
  has("libbackplane-comm-fxunavailable.so", "unavailable: libfxvendor.so.3 not found");
  has("libbackplane-comm-fxmissingdep.so", "dependency libbpfixturedep.so not found");
  has("libbackplane-comm-fxnotelf.so", "not an ELF shared object");
  EXPECT_EQ(decision["libbackplane-comm-fxok.so"], "loaded");
  for (const auto& p : j["comm_plugins"])  // NULL capability slots: the 1.0 contract's
    if (fs::path(p["path"].get<std::string>()).filename() == "libbackplane-comm-fxok.so") {
      EXPECT_EQ(p["capabilities"], "abort-any-thread,reinit") << p.dump();
    }
  EXPECT_EQ(decision["libbackplane-comm-fxunavailable.so"], "loaded");  // loads, cannot run
  // fxzdup's table is named "fxok" too: the first in the search order wins.
  has("libbackplane-comm-fxzdup.so", "a communicator plugin named 'fxok' is already loaded");
}

TEST(CommReport, AllowListSkipsCommPluginsByFileName) {
  auto j = smi_json("BACKPLANE_PLUGINS=cpu");
  for (const auto& p : j["comm_plugins"]) {
    EXPECT_EQ(p["decision"], "skipped");
    EXPECT_NE(p["reason"].get<std::string>().find("not in the allow list"), std::string::npos);
  }
  auto k = smi_json("BACKPLANE_PLUGINS=cpu,comm-gloo");
  bool gloo = false;
  for (const auto& p : k["comm_plugins"])
    if (p["name"] == "gloo") {
      gloo = p["decision"] == "loaded";
    }
  EXPECT_TRUE(gloo) << k.dump(1);
}

// ---- sampler and gradient hooks -----------------------------------------------------------------

TEST(DistributedSampler, DisjointShardsCoverTheEpochWithPyTorchPadding) {
  for (bool drop : {false, true}) {
    const int64_t n = 103;
    const int R = 4;
    std::multiset<int64_t> all;
    std::vector<std::vector<int64_t>> shards;
    for (int r = 0; r < R; ++r) {
      bp::DistributedSampler s({.num_replicas = R, .rank = r, .seed = 9, .drop_last = drop});
      auto idx = s.next_epoch(n);
      EXPECT_EQ(static_cast<int64_t>(idx.size()), s.num_samples(n));
      EXPECT_EQ(s.num_samples(n), drop ? 25 : 26);
      all.insert(idx.begin(), idx.end());
      shards.push_back(idx);
    }
    std::set<int64_t> distinct(all.begin(), all.end());
    if (drop) {
      EXPECT_EQ(all.size(), 100u);
      EXPECT_EQ(distinct.size(), 100u);  // disjoint
    } else {
      EXPECT_EQ(all.size(), 104u);
      EXPECT_EQ(distinct.size(), 103u);  // every example, one repeated as padding
    }
    for (int64_t i : distinct) EXPECT_TRUE(i >= 0 && i < n);
  }
}

TEST(DistributedSampler, ReshufflesEachEpochAndAgreesAcrossInstances) {
  bp::DistributedSampler a({.num_replicas = 2, .rank = 1, .seed = 5});
  bp::DistributedSampler b({.num_replicas = 2, .rank = 1, .seed = 5});
  auto e0 = a.next_epoch(50), e1 = a.next_epoch(50);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(a.epoch(), 2);
  EXPECT_EQ(b.next_epoch(50), e0);
  b.set_epoch(7);
  EXPECT_EQ(b.next_epoch(50), a.indices(50, 7));
  bp::DistributedSampler plain({.num_replicas = 2, .rank = 0, .shuffle = false});
  auto p = plain.next_epoch(5);
  EXPECT_EQ(p, (std::vector<int64_t>{0, 2, 4}));
  EXPECT_THROW(bp::DistributedSampler({.num_replicas = 2, .rank = 2}), bp::Error);
}

TEST(DistributedSampler, DrivesTheDataLoader) {
  bp::Tensor X = bp::arange(20).reshape({10, 2});
  bp::Tensor Y = bp::arange(10);
  auto s = std::make_shared<bp::DistributedSampler>(
      bp::DistributedSamplerOptions{.num_replicas = 3, .rank = 2, .seed = 1});
  bp::DataLoader data(X, Y, {.batch_size = 3, .sampler = s});
  EXPECT_EQ(data.epoch_size(), 4);
  EXPECT_EQ(data.num_batches(), 2);
  auto expect = s->indices(10, 0);
  std::vector<int64_t> seen;
  for (bp::Batch b : data)
    for (float v : b.y.to_vector<float>()) seen.push_back(static_cast<int64_t>(v));
  EXPECT_EQ(seen, expect);
  EXPECT_THROW(bp::DataLoader(X, Y, {.shuffle = true, .sampler = s}), bp::Error);
}

TEST(GradHooks, CalledOnceWithTheFinalGradientInBackwardOrder) {
  bp::manual_seed(3);
  bp::nn::Linear a(4, 3), b(3, 1);
  std::vector<std::string> order;
  std::vector<std::vector<float>> seen;
  int64_t ha = a.weight().register_post_accumulate_grad_hook([&](const bp::Tensor& p) {
    order.push_back("a");
    seen.push_back(p.grad().to_vector<float>());
  });
  b.weight().register_post_accumulate_grad_hook([&](const bp::Tensor&) { order.push_back("b"); });
  bp::Tensor x = bp::rand({5, 4});
  bp::Tensor h = a(x);
  (b(h) + b(h)).sum().backward();  // b.weight gets two contributions, summed before its hook
  EXPECT_EQ(order, (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(seen[0], a.weight().grad().to_vector<float>());
  a.weight().remove_post_accumulate_grad_hook(ha);
  a.zero_grad();
  b.zero_grad();
  b(a(x)).sum().backward();
  EXPECT_EQ(order.size(), 3u);
  EXPECT_THROW(h.register_post_accumulate_grad_hook([](const bp::Tensor&) {}), bp::Error);
  EXPECT_THROW(x.register_post_accumulate_grad_hook([](const bp::Tensor&) {}), bp::Error);
}

// ---- multi-rank scenarios through bp-run --------------------------------------------------------

std::string rank_cmd(int n, const std::string& args, const std::string& env = "",
                     bool keep_going = false) {
  return env + " " + kBpRun + (keep_going ? " --keep-going" : "") + " -n " + std::to_string(n) +
         " " + kRank + " " + args;
}

void expect_all_pass(const Output& r, int ranks, const std::string& scenario) {
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(count(r.out, scenario + ": "), static_cast<size_t>(ranks)) << r.out;
  EXPECT_EQ(count(r.out, " 0 failed"), static_cast<size_t>(ranks)) << r.out;
  EXPECT_EQ(count(r.out, "FAIL "), 0u) << r.out;
}

TEST(Ranks, GlooCollectivesEveryDtypeAndReduction2) {
  expect_all_pass(run(rank_cmd(2, "collectives")), 2, "collectives");
}

TEST(Ranks, RepeatedSignaturesAreComparedOnceUnlessChecksAreFull) {
  expect_all_pass(run(rank_cmd(2, "collectives --only checks")), 2, "collectives");
  expect_all_pass(run(rank_cmd(2, "collectives --only checks", "BACKPLANE_DIST_CHECK=full")), 2,
                  "collectives");
}

TEST(Ranks, GlooCollectivesEveryDtypeAndReduction4) {
  expect_all_pass(run(rank_cmd(4, "collectives")), 4, "collectives");
}

TEST(Ranks, HostStagingForADeviceTypeNoCommunicatorServes) {
  if (!has_opencl()) GTEST_SKIP() << "no opencl device (PoCL) to stage from";
  expect_all_pass(run(rank_cmd(2, "collectives --device opencl:0 --only all_reduce")), 2,
                  "collectives");
  expect_all_pass(run(rank_cmd(2, "collectives --device opencl:0 --only noncontiguous")), 2,
                  "collectives");
}

// Review F3: eight receives from one peer in flight at once, 200 times; each must get the
// payload of the send it matches (before the fix 769-904 of the 1,600 held another's).
TEST(Ranks, GlooManyReceivesFromOnePeerGetTheirOwnPayloads) {
  expect_all_pass(run(rank_cmd(2, "collectives --only p2p_burst --rounds 200")), 2, "collectives");
}

TEST(Ranks, DataParallelMatchesOneProcessOnTheCombinedBatch2) {
  expect_all_pass(run(rank_cmd(2, "ddp")), 2, "ddp");
}

// A device with streams of its own whose reductions are staged through host memory: the
// gradients must be the averaged ones at the optimiser step (before the fix they were this
// rank's own until the next forward copied the reduced values back).
TEST(Ranks, DataParallelOnAStagedDeviceMatchesOneProcess) {
  if (!has_opencl()) GTEST_SKIP() << "no opencl device (PoCL) to stage from";
  expect_all_pass(run(rank_cmd(2, "ddp --device opencl:0")), 2, "ddp");
}

TEST(Ranks, DataParallelMatchesOneProcessOnTheCombinedBatch4) {
  expect_all_pass(run(rank_cmd(4, "ddp")), 4, "ddp");
}

// Every rank prints "EXPECTED <class>" (the scenario checks class and message itself).
void expect_fault(const std::string& name, const std::string& extra_args, const std::string& env,
                  int expected_lines, int expected_status = 0) {
  Output r = run(
      rank_cmd(2, "fault " + name + " " + extra_args, "BACKPLANE_DIST_TIMEOUT=20 " + env, true));
  EXPECT_EQ(r.status, expected_status) << r.out;
  EXPECT_EQ(count(r.out, "UNEXPECTED"), 0u) << r.out;
  EXPECT_EQ(count(r.out, ": EXPECTED "), static_cast<size_t>(expected_lines)) << r.out;
}

TEST(Faults, MismatchedWorldSizes) {
  expect_fault("world_size_mismatch", "", "", 2);
}
TEST(Faults, TwoProcessesWithOneRank) {
  expect_fault("duplicate_rank", "", "", 2);
}
TEST(Faults, RankOutOfRange) {
  expect_fault("rank_out_of_range", "", "BACKPLANE_DIST_TIMEOUT=4", 2);
}
TEST(Faults, UnreachableRendezvous) {
  expect_fault("unreachable", "--port " + std::to_string(closed_port()), "BACKPLANE_DIST_TIMEOUT=3",
               2);
}
TEST(Faults, RankExitsBetweenCollectives) {
  expect_fault("rank_exit", "", "", 1, 3);  // rank 1 exits with 3; rank 0 gets PeerError
}
TEST(Faults, RankExitsMidCollective) {
  expect_fault("exit_mid_collective", "", "", 1, 3);
}
TEST(Faults, MismatchedCollectives) {
  expect_fault("mismatch_op", "", "", 2);
}
TEST(Faults, MismatchedShapes) {
  expect_fault("mismatch_shape", "", "", 2);
}
TEST(Faults, MismatchInABurstOfCollectivesWithEveryCallChecked) {
  // Rank 1's fifteenth call repeats no earlier signature of rank 0's: only every_call checks
  // compare it (Note [Collective checks]).
  expect_fault("mismatch_in_burst", "", "BACKPLANE_DIST_CHECK=full", 2);
}
TEST(Faults, MismatchedDtypes) {
  expect_fault("mismatch_dtype", "", "", 2);
}
TEST(Faults, MismatchedDeviceTypes) {
  if (!has_opencl()) GTEST_SKIP() << "no opencl device for a second device type";
  expect_fault("mismatch_device", "", "", 2);
}
TEST(Faults, LocalArgumentErrorsLeaveTheGroupUsable) {
  expect_fault("local_argument_errors", "", "", has_opencl() ? 8 : 6);
}
TEST(Faults, TimeoutNamesTheMissingRankInBothRanks) {
  std::string marker = temp_dir("marker") + "/done";
  expect_fault("timeout", "--marker " + marker, "BACKPLANE_DIST_TIMEOUT=3", 2);
  fs::remove_all(fs::path(marker).parent_path());
}
// Review F18: a local error after the call was numbered fails the group at once (before the fix
// rank 0 waited out the timeout and got a TimeoutError).
TEST(Faults, LocalErrorAfterNumberingReachesThePeerAtOnce) {
  std::string marker = temp_dir("marker") + "/done";
  expect_fault("local_error_after_numbering", "--marker " + marker,
               "BACKPLANE_PLUGIN_PATH=" + kDeviceFixtures + " BP_REFERENCE_FAULT=", 2);
  fs::remove_all(fs::path(marker).parent_path());
}
// Review F6: an error inside batch_isend_irecv's group still ends the plugin's group, so a new
// process group can be made on the same thread (before the fix its comm_create failed).
TEST(Faults, ErrorInsideAGroupLeavesTheThreadUsable) {
  expect_fault("error_inside_group", "",
               "BACKPLANE_PLUGIN_PATH=" + kCommFixtures + " BACKPLANE_DIST_BACKEND=fxgroup", 4);
}
// Review F20 across ranks: rank 1's backward is interrupted; its next forward throws once and
// aborts the group (rank 0 learns at once), and the forward after that runs. Before the fix rank
// 1 threw the same error on every forward and rank 0 waited out its timeout.
TEST(Faults, DataParallelBackwardInterruptedOnOneRank) {
  std::string marker = temp_dir("marker") + "/done";
  expect_fault("ddp_backward_error", "--marker " + marker, "", 5);
  fs::remove_all(fs::path(marker).parent_path());
}
// Review F11: the last reduction of an iteration fails; the error must reach the rank before
// its optimiser step (backward or synchronize_gradients), on the CPU and on a device with its
// own streams whose reductions are staged through host memory (opencl).
TEST(Faults, DataParallelFailedLastReductionSurfacesBeforeTheStep) {
  std::string dir = temp_dir("marker");
  expect_fault("ddp_last_reduction_fails", "--marker " + dir + "/cpu", "", 2);
  if (has_opencl())
    expect_fault("ddp_last_reduction_fails", "--device opencl:0 --marker " + dir + "/opencl", "",
                 2);
  fs::remove_all(dir);
  if (!has_opencl()) GTEST_SKIP() << "no opencl device (PoCL) for a device with streams";
}
// Review F5: a dropped Work whose peer never joins is failed by the watchdog, naming it (before
// the fix it ran unwatched and its error was dropped), and destroy_process_group returns.
TEST(Faults, ADroppedWorkIsWatchedAndTimesOut) {
  std::string marker = temp_dir("marker") + "/done";
  expect_fault("dropped_work_timeout", "--marker " + marker,
               "BACKPLANE_DIST_CHECK=0 BACKPLANE_DIST_TIMEOUT=3", 4);
  fs::remove_all(fs::path(marker).parent_path());
}
TEST(Faults, CommPluginMissingItsLibrary) {
  if (!fs::exists(fs::path(BP_PLUGIN_DIR) / "libbackplane-comm-nccl.so"))
    GTEST_SKIP() << "the nccl plugin is not built here (no CUDA toolkit)";
  expect_fault("missing_library", "",
               "BACKPLANE_DIST_BACKEND=cpu:nccl "
               "BACKPLANE_NCCL_LIBRARY=/nonexistent/libnccl.so.2",
               2);
}

// ---- fault recovery: a rank dies, the survivors shrink and train on -----------------------------

// Four ranks under bp-run (which hosts the store, so any rank may die); the victim SIGKILLs
// itself mid-training; the three survivors check every reduced gradient before and after.
void expect_shrink(const std::string& args) {
  Output r = run(rank_cmd(4, "shrink " + args, "BACKPLANE_DIST_TIMEOUT=60", true));
  EXPECT_EQ(r.status, 128 + SIGKILL) << r.out;  // bp-run returns the victim's status
  EXPECT_EQ(count(r.out, "killing itself"), 1u) << r.out;
  EXPECT_EQ(count(r.out, ": shrink: "), 3u) << r.out;
  EXPECT_EQ(count(r.out, " 0 failed"), 3u) << r.out;
  EXPECT_EQ(count(r.out, "FAIL "), 0u) << r.out;
  EXPECT_EQ(count(r.out, "UNCAUGHT"), 0u) << r.out;
}

TEST(Shrink, ArgumentErrorsAndAGroupOfOne) {
  d::init_process_group({.rank = 0, .world_size = 1});
  EXPECT_TRUE(d::shrink_group().empty());  // nobody to drop: the same group
  EXPECT_EQ(d::get_world_size(), 1);
  EXPECT_HAS(bp_test::expect_throw<d::RendezvousError>([] { d::shrink_group({0}); }),
             "shrink: rank 0 is in excluded_ranks but called shrink; the excluded ranks do not "
             "call it");
  EXPECT_HAS(bp_test::expect_throw<d::RendezvousError>([] { d::shrink_group({3}); }),
             "shrink: excluded rank 3 is not a rank of the group (0 to 0)");
  bp::Tensor t = bp::full({5}, 2.5f, bp::device("cpu:0"));  // still usable after refusals
  d::all_reduce(t).wait();
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(5, 2.5f));
  d::destroy_process_group();
}

TEST(Shrink, SurvivorsAgreeOnWhoIsAliveAndTrainOnAsThree) {
  expect_shrink("--victim 2 --kill-step 5");
}
TEST(Shrink, SurvivorsExcludeTheNamedRankAndTrainOnAsThree) {
  expect_shrink("--victim 0 --kill-step 3 --explicit");
}
TEST(Shrink, TwoRanksDieAtOnceAndTwoTrainOn) {
  Output r =
      run(rank_cmd(4, "shrink --victim 1,3 --kill-step 4", "BACKPLANE_DIST_TIMEOUT=60", true));
  EXPECT_EQ(r.status, 128 + SIGKILL) << r.out;
  EXPECT_EQ(count(r.out, "killing itself"), 2u) << r.out;
  EXPECT_EQ(count(r.out, ": shrink: "), 2u) << r.out;
  EXPECT_EQ(count(r.out, " 0 failed"), 2u) << r.out;
  EXPECT_EQ(count(r.out, "FAIL "), 0u) << r.out;
}
TEST(Shrink, AfterAMismatchEveryRankReinitialisesFromANewEpoch) {
  // Rank 0's mismatching call repeats nobody's signature only under every-call checks (Note
  // [Collective checks]); by default Gloo refuses it with its own error, not a MismatchError.
  Output r = run(rank_cmd(4, "shrink --mismatch --kill-step 3",
                          "BACKPLANE_DIST_TIMEOUT=60 BACKPLANE_DIST_CHECK=full", true));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(count(r.out, ": shrink: "), 4u) << r.out;
  EXPECT_EQ(count(r.out, " 0 failed"), 4u) << r.out;
  EXPECT_EQ(count(r.out, "FAIL "), 0u) << r.out;
  EXPECT_EQ(count(r.out, "UNCAUGHT"), 0u) << r.out;
}
TEST(Shrink, AHealthyGroupShrinksWhenARankLeaves) {
  for (const char* how : {"", " --explicit"}) {
    Output r = run(rank_cmd(4, std::string("shrink --victim 2 --kill-step 6 --retire") + how,
                            "BACKPLANE_DIST_TIMEOUT=60", true));
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(count(r.out, "leaving at step 6"), 1u) << r.out;
    EXPECT_EQ(count(r.out, ": shrink: "), 3u) << r.out;
    EXPECT_EQ(count(r.out, " 0 failed"), 3u) << r.out;
    EXPECT_EQ(count(r.out, "FAIL "), 0u) << r.out;
    EXPECT_EQ(count(r.out, "UNCAUGHT"), 0u) << r.out;
  }
}

// ---- bp-run itself ------------------------------------------------------------------------------

TEST(BpRun, SetsTheRankVariablesAndPrefixesOutput) {
  Output r = run(kBpRun +
                 " -n 3 sh -c 'echo \"r=$BACKPLANE_RANK w=$BACKPLANE_WORLD_SIZE "
                 "l=$BACKPLANE_LOCAL_RANK lw=$BACKPLANE_LOCAL_WORLD_SIZE "
                 "h=$BACKPLANE_STORE_HOSTED i=${BACKPLANE_INIT%:*}\"'");
  EXPECT_EQ(r.status, 0) << r.out;
  for (int k = 0; k < 3; ++k) {
    std::string line = "[rank " + std::to_string(k) + "] r=" + std::to_string(k) +
                       " w=3 l=" + std::to_string(k) + " lw=3 h=1 i=tcp://127.0.0.1";
    EXPECT_NE(r.out.find(line), std::string::npos) << r.out;
  }
  Output m = run(kBpRun +
                 " -n 2 --nnodes 2 --node-rank 1 --init file:///tmp/x --no-prefix sh -c "
                 "'echo r=$BACKPLANE_RANK l=$BACKPLANE_LOCAL_RANK w=$BACKPLANE_WORLD_SIZE'");
  EXPECT_NE(m.out.find("r=3 l=1 w=4"), std::string::npos) << m.out;
  EXPECT_EQ(m.out.find("[rank"), std::string::npos) << m.out;
}

TEST(BpRun, AFailingRankStopsTheOthersAndItsStatusIsReturned) {
  Output r =
      run(kBpRun + " -n 3 --grace 1 sh -c '[ $BACKPLANE_RANK = 1 ] && exit 7; exec sleep 60'");
  EXPECT_EQ(r.status, 7) << r.out;
  EXPECT_NE(r.out.find("bp-run: rank 1 (pid "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("exited with status 7; stopping the other ranks"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("bp-run: failed: rank 1 exited with status 7"), std::string::npos) << r.out;
  Output u = run(kBpRun + " sh -c true");
  EXPECT_EQ(u.status, 2);
  EXPECT_NE(u.out.find("-n N is required"), std::string::npos) << u.out;
  Output x = run(kBpRun + " -n 1 /nonexistent/program");
  EXPECT_EQ(x.status, 127) << x.out;
  EXPECT_NE(x.out.find("cannot run '/nonexistent/program'"), std::string::npos) << x.out;
}

// ---- the communicator conformance suite
// ----------------------------------------------------------

TEST(CommConformance, GlooPassesWithTwoAndThreeRanks) {
  for (int n : {2, 3}) {
    Output r = run(kConformance + " --comm gloo --world-size " + std::to_string(n));
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find(" 0 failed"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("PASS        comm.timeout_and_abort[gloo]"), std::string::npos) << r.out;
  }
}

TEST(CommConformance, CatchesAWrongPluginAndPassesACorrectOne) {
  Output ok =
      run(kConformance + " --comm " + kCommFixtures + "/libbackplane-comm-fxok.so --world-size 1");
  EXPECT_EQ(ok.status, 0) << ok.out;
  Output bad = run(kConformance + " --comm " + kCommFixtures +
                   "/libbackplane-comm-fxwrong.so --world-size 1");
  EXPECT_EQ(bad.status, 1) << bad.out;
  EXPECT_NE(bad.out.find("FAIL        comm.all_reduce[fxwrong,f32,sum,n=1001]"), std::string::npos)
      << bad.out;
  EXPECT_NE(bad.out.find("relative error"), std::string::npos) << bad.out;
  EXPECT_EQ(bad.out.find("FAIL        comm.all_reduce[fxwrong,f64"), std::string::npos) << bad.out;
}

}  // namespace
