// BACKPLANE_LAUNCH_BLOCKING (Note [Launch blocking] in core/src/runtime/plugin_device.cpp) with
// the reference backend's fault async_fail (device ref_async:0): mul succeeds but leaves an
// error in its stream's record that the next synchronisation reports, as a GPU reports a kernel
// fault; and async_index (ref_asyncidx:0), where gather's bad index is found "on the device".
#include <gtest/gtest.h>
#include <backplane/backplane.hpp>
#include <backplane_test/child.hpp>
#include <backplane_test/plugin_test.hpp>
#include <backplane_test/seed.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

const std::string kRefAsync = bp_test::beside_exe(BP_REF_ASYNC_REL);

bp::Device& ref_async() {
  static bp::Registry* reg = [] {
    bp::RegistryOptions o;
    o.plugin_paths = {kRefAsync};
    return new bp::Registry(o);
  }();
  return reg->device("ref_async:0");
}

bp::Device& ref_asyncidx() {
  static bp::Registry* reg = [] {
    bp::RegistryOptions o;
    o.plugin_paths = {bp_test::beside_exe(BP_REF_ASYNCIDX_REL)};
    return new bp::Registry(o);
  }();
  return reg->device("ref_asyncidx:0");
}

bool blocking() {
  const char* v = std::getenv("BACKPLANE_LAUNCH_BLOCKING");
  return v && std::string(v) == "1";
}

// Without the variable the fault surfaces at the next synchronisation, after later ops, still
// naming the op that failed (Note [Asynchronous errors] in plugin_abi.h: the plugin reports its
// op id), and found by the read, not by the add.
TEST(LaunchBlocking, WithoutItAFaultSurfacesAtTheNextSynchronisation) {
  if (blocking()) GTEST_SKIP() << "runs without BACKPLANE_LAUNCH_BLOCKING";
  bp::Tensor a = bp::full({4}, 2.0, ref_async());
  bp::Tensor b = a * a;  // queued; "fails on the device"
  bp::Tensor c = b + a;
  try {
    (void)c.to_vector<float>();
    FAIL() << "the fault was not reported";
  } catch (const bp::AsyncError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("simulated asynchronous fault"), std::string::npos) << msg;
    EXPECT_NE(msg.find("op mul (f32, inputs [4], [4], outputs [4]) (op #"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("found by a later stream synchronize"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("op add"), std::string::npos) << msg;
  }
}

// With BACKPLANE_LAUNCH_BLOCKING=1 the op that failed throws, naming itself, its dtype, its
// operands' shapes and its device. The variable is read once per process, so the test runs
// itself again in a child process with the variable set.
TEST(LaunchBlocking, TheFaultIsReportedByItsOwnOp) {
  if (!blocking()) {
    const bp_test::ChildResult r = bp_test::rerun_self(
        "BACKPLANE_LAUNCH_BLOCKING=1", "LaunchBlocking.TheFaultIsReportedByItsOwnOp");
    EXPECT_TRUE(r.exited_zero()) << r.output;
    EXPECT_NE(r.output.find("[  PASSED  ] 1 test"), std::string::npos) << r.output;
    return;
  }
  bp::Tensor a = bp::full({4}, 2.0, ref_async());
  try {
    bp::Tensor b = a * a;
    FAIL() << "mul returned although its stream reports a fault";
  } catch (const bp::AsyncError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("ref_async:0: op mul (f32, inputs [4], [4], outputs [4]) failed while "
                       "running (BACKPLANE_LAUNCH_BLOCKING=1): ref_async:0: simulated "
                       "asynchronous fault"),
              std::string::npos)
        << msg;
  }
  // The fault was reported once: the device goes on.
  EXPECT_EQ((a + a).to_vector<float>(), (std::vector<float>{4, 4, 4, 4}));

  // An index found out of range on the device: the gather itself throws, naming the value.
  std::mt19937_64& rng = bp_test::rng("bp_unit_tests");
  const int64_t bad = 5 + std::uniform_int_distribution<int64_t>(0, 999)(rng);
  bp::Tensor x = bp::full({5, 3}, 1.5, ref_asyncidx());
  bp::Tensor index =
      bp::from_vector(std::vector<int64_t>{0, 1, 2, bad, 4, 3}, {2, 3}, ref_asyncidx());
  try {
    bp::Tensor y = bp::gather(x, 0, index);
    FAIL() << "gather returned although its index was out of range";
  } catch (const bp::AsyncError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("ref_asyncidx:0: op gather (f32, inputs [5,3], [2,3], outputs [2,3]) "
                       "failed while running (BACKPLANE_LAUNCH_BLOCKING=1): "),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
    EXPECT_EQ(e.op(), "gather");
  }
}

}  // namespace
