// libbackplane counts memory itself and takes only `reserved` from a plugin (Note [Memory
// accounting] in memory_counters.hpp), shown on the reference backend with fault "leak"
// (ref_leak), whose own statistics never see a free: its `allocated` and `reserved` only grow,
// libbackplane's `allocated` returns to the baseline.
#include <gtest/gtest.h>
#include <backplane/backplane.hpp>
#include <backplane_test/plugin_test.hpp>
#include <backplane_test/seed.hpp>

#include <memory>
#include <random>
#include <vector>

namespace {

TEST(MemoryAccounting, LibbackplaneIgnoresAPluginsOwnCounts) {
  bp::RegistryOptions o;
  o.plugin_paths = {bp_test::beside_exe(BP_REF_LEAK_REL)};
  o.search_library_dir = false;
  bp::Registry reg(o);
  bp::Device& d = reg.device("ref_leak:0");
  const bp::MemoryStats base = d.memory_stats();
  std::uniform_int_distribution<uint64_t> any(1, 1 << 16);
  uint64_t total = 0;
  {
    std::vector<std::shared_ptr<bp::Buffer>> bufs;
    for (int i = 0; i < 10; ++i) {
      const uint64_t n = any(bp_test::rng("bp_unit_tests"));
      bufs.push_back(d.allocator().allocate(n));
      total += n;
    }
    const bp::MemoryStats mid = d.memory_stats();
    EXPECT_EQ(mid.allocated, base.allocated + total);
    EXPECT_EQ(mid.num_allocs, base.num_allocs + 10);
    EXPECT_EQ(mid.reserved, base.reserved + total)
        << "the template reports reserved = its allocated";
  }
  const bp::MemoryStats after = d.memory_stats();
  EXPECT_EQ(after.allocated, base.allocated) << "libbackplane's count, not the plugin's";
  EXPECT_EQ(after.num_allocs, base.num_allocs);
  EXPECT_EQ(after.total_allocs, base.total_allocs + 10);
  EXPECT_EQ(after.peak_allocated, base.allocated + total);
  EXPECT_EQ(after.reserved, base.reserved + total) << "the plugin's figure, leak included";
  d.allocator().reset_peak();
  EXPECT_EQ(d.memory_stats().peak_allocated, base.allocated);
}

}  // namespace
