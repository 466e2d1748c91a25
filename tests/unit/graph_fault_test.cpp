// Graph capture against a backend that fails (review F13), on the reference backend with fault
// "side_sync_fails" (device ref_syncfail:0): synchronising any stream but the default one fails,
// so Graph::end_capture's wait for the graph pool's stream fails after the work was recorded.
#include <backplane/backplane.hpp>
#include <backplane/graph.hpp>

#include <backplane_test/gtest_compare.hpp>
#include <backplane_test/plugin_test.hpp>
#include <backplane_test/seed.hpp>

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace {

constexpr int32_t kF32 = static_cast<int32_t>(bp::DType::f32);

std::vector<float> random_values(size_t n) {
  std::uniform_real_distribution<float> any(-4.0f, 4.0f);
  std::vector<float> v(n);
  for (float& x : v) x = any(bp_test::rng("bp_unit_tests"));
  return v;
}

std::vector<double> expected(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<double> r(a.size());
  for (size_t i = 0; i < a.size(); ++i) r[i] = (double(a[i]) + double(b[i])) * double(b[i]);
  return r;
}

// Once (F13): the failed wait threw outside the failure path, so the graph kept its recorded
// launches while its pool was freed (a later replay wrote into freed blocks) and a native graph
// leaked. Now the graph is left empty, its pool and the buffers it kept are freed, the device is
// eager again and takes a new capture.
TEST(GraphFaults, EndCaptureFailureLeavesTheGraphEmptyAndFreesItsPool) {
  bp::RegistryOptions o;
  o.plugin_paths = {bp_test::beside_exe(BP_REF_SYNCFAIL_REL)};
  o.search_library_dir = false;
  bp::Registry reg(o);
  bp::Device& d = reg.device("ref_syncfail:0");
  const size_t n = 1000;
  const std::vector<float> av = random_values(n), bv = random_values(n);
  const bp::Tensor a = bp::from_vector(av, {static_cast<int64_t>(n)}, d);
  const bp::Tensor b = bp::from_vector(bv, {static_cast<int64_t>(n)}, d);
  EXPECT_TRUE(bp_test::all_close(kF32, ((a + b) * b).to_vector<double>(), expected(av, bv)));
  const bp::MemoryStats before = d.memory_stats();

  bp::Graph g;
  {
    g.begin_capture(d);
    bp::Tensor out = (a + b) * b;  // two launches, two pool blocks
    EXPECT_EQ(g.num_ops(), 2u);
    EXPECT_GT(g.pool_bytes(), 0u);
    try {
      g.end_capture();
      ADD_FAILURE() << "end_capture succeeded although the pool stream failed to synchronise";
    } catch (const bp::PluginError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("ref_syncfail:0: graph pool"), std::string::npos) << msg;
      EXPECT_NE(msg.find("simulated device error on a stream other than the default one"),
                std::string::npos)
          << msg;
    }
  }
  EXPECT_TRUE(g.empty());
  EXPECT_FALSE(g.capturing());
  EXPECT_EQ(g.num_ops(), 0u);
  EXPECT_EQ(g.pool_bytes(), 0u);
  EXPECT_FALSE(bp::is_capturing(d));
  try {
    g.replay();
    ADD_FAILURE() << "a graph whose capture failed replayed";
  } catch (const bp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Graph::replay on an empty graph"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(d.memory_stats().allocated, before.allocated)
      << "the pool's blocks and the kept buffers are freed once the failed graph lets go";

  // Eager again: the same work runs at once and gives the right values.
  EXPECT_TRUE(bp_test::all_close(kF32, ((a + b) * b).to_vector<double>(), expected(av, bv)));
  // A new capture can begin on the device; dropping it leaves the device eager.
  bp::Graph next;
  next.begin_capture(d);
  EXPECT_TRUE(bp::is_capturing(d));
  next.abort_capture();
  EXPECT_FALSE(bp::is_capturing(d));
  EXPECT_EQ(d.memory_stats().allocated, before.allocated);
}

}  // namespace
