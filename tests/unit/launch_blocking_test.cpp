// BACKPLANE_LAUNCH_BLOCKING (Note [Launch blocking] in core/src/runtime/plugin_device.cpp) with
// the reference backend's fault async_fail (device ref_async:0): mul succeeds but leaves an
// error on its stream that the next synchronisation reports, as a GPU reports a kernel fault.
#include <gtest/gtest.h>
#include <backplane/backplane.hpp>
#include <backplane_test/plugin_test.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
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

bool blocking() {
  const char* v = std::getenv("BACKPLANE_LAUNCH_BLOCKING");
  return v && std::string(v) == "1";
}

// Without the variable the fault surfaces at the next synchronisation, after later ops.
TEST(LaunchBlocking, WithoutItAFaultSurfacesAtTheNextSynchronisation) {
  if (blocking()) GTEST_SKIP() << "runs without BACKPLANE_LAUNCH_BLOCKING";
  bp::Tensor a = bp::full({4}, 2.0, ref_async());
  bp::Tensor b = a * a;  // queued; "fails on the device"
  bp::Tensor c = b + a;
  try {
    (void)c.to_vector<float>();
    FAIL() << "the fault was not reported";
  } catch (const bp::PluginError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("simulated asynchronous fault"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("op mul"), std::string::npos) << msg;
  }
}

// With BACKPLANE_LAUNCH_BLOCKING=1 the op that failed throws, naming itself, its dtype, its
// operands' shapes and its device. The variable is read once per process, so the test runs
// itself again in a child process with the variable set.
TEST(LaunchBlocking, TheFaultIsReportedByItsOwnOp) {
  if (!blocking()) {
    std::error_code ec;
    const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    ASSERT_FALSE(ec) << ec.message();
    const std::string cmd = "BACKPLANE_LAUNCH_BLOCKING=1 '" + self +
                            "' --gtest_filter=LaunchBlocking.TheFaultIsReportedByItsOwnOp 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
    const int status = pclose(p);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
    EXPECT_NE(out.find("[  PASSED  ] 1 test"), std::string::npos) << out;
    return;
  }
  bp::Tensor a = bp::full({4}, 2.0, ref_async());
  try {
    bp::Tensor b = a * a;
    FAIL() << "mul returned although its stream reports a fault";
  } catch (const bp::PluginError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("ref_async:0: op mul (f32, inputs [4], [4], outputs [4]) failed while "
                       "running (BACKPLANE_LAUNCH_BLOCKING=1): ref_async:0: simulated "
                       "asynchronous fault"),
              std::string::npos)
        << msg;
  }
  // The fault was reported once: the device goes on.
  EXPECT_EQ((a + a).to_vector<float>(), (std::vector<float>{4, 4, 4, 4}));
}

}  // namespace
