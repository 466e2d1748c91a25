// Hostile sizes and paths (issue 28): the one checked shape arithmetic (Note [Checked sizes] in
// core/src/tensor/tensor_sizes.hpp), outputs only over regular files (Note [Output targets]),
// the private statistics folder (Note [Private folders]), FIFOs never opened for reading, and
// device strings truncated in messages.
#include <backplane/backplane.hpp>
#include <backplane/train.hpp>

#include <backplane_test/plugin_test.hpp>
#include <backplane_test/seed.hpp>
#include <backplane_test/throws.hpp>

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string>

namespace fs = std::filesystem;

namespace {

using bp_test::expect_throw;

constexpr int64_t k40 = int64_t{1} << 40;

TEST(CheckedSizes, OverflowingShapesAreShapeErrorsBeforeAnythingIsAllocated) {
  bp::Device& cpu = bp::device("cpu:0");
  const uint64_t before = cpu.memory_stats().allocated;
  // Once: 2^80 wrapped to 0 elements, and printing crashed.
  EXPECT_HAS(expect_throw<bp::ShapeError>([] {
               bp::empty({k40, k40});
             }),
             "shape 1099511627776x1099511627776 has more than 2^63 elements");
  // Once: a negative numel().
  EXPECT_HAS(expect_throw<bp::ShapeError>([] {
               bp::empty({3037000500, 3037000500});
             }),
             "shape 3037000500x3037000500 has more than 2^63 elements");
  // Once: 0 bytes allocated and 2^62 elements filled (SIGSEGV).
  EXPECT_HAS(expect_throw<bp::OutOfMemory>([] { bp::zeros({int64_t{1} << 62}); }),
             "shape 4611686018427387904 of f32 needs more than 2^63 bytes (4611686018427387904 "
             "elements of 4 bytes)");
  // Once: accepted with numel 0, and sum() gave 0.
  EXPECT_HAS(expect_throw<bp::ShapeError>([] {
               bp::zeros({1, 1}).expand({k40, k40});
             }),
             "expand: shape 1099511627776x1099511627776 has more than 2^63 elements");
  EXPECT_HAS(expect_throw<bp::ShapeError>([] {
               bp::zeros({4}).reshape({k40, k40, -1});
             }),
             "reshape: shape 1099511627776x1099511627776x-1 has more than 2^63 elements");
  EXPECT_HAS(expect_throw<bp::ShapeError>([] {
               bp::zeros({4}).view({-1, k40, k40});
             }),
             "more than 2^63 elements");
  EXPECT_EQ(cpu.memory_stats().allocated, before);
}

TEST(CheckedSizes, FromBlobWithZeroStridesCannotMakeAHugeCopy) {
  float host = 1.5f;
  const int64_t k = int64_t{1} << 31;  // 2^62 elements of one float, valid as a view
  bp::Tensor t = bp::from_blob(bp::device("cpu:0"), &host, {k, k}, {0, 0}, bp::DType::f32);
  EXPECT_EQ(t.numel(), int64_t{1} << 62);
  // Once: a 0-byte copy (2^62 * 4 wrapped) and SIGSEGV.
  EXPECT_HAS(expect_throw<bp::OutOfMemory>([&] { (void)t.contiguous(); }),
             "needs more than 2^63 bytes");
}

TEST(CheckedSizes, ArangeTooLargeIsOutOfMemoryNotBadAlloc) {
  // Once std::bad_alloc, which catch (const bp::Error&) misses.
  EXPECT_HAS(expect_throw<bp::OutOfMemory>([] { bp::arange(int64_t{1} << 62, bp::DType::f64); }),
             "needs more than 2^63 bytes");
  std::string m = expect_throw<bp::OutOfMemory>([] { bp::arange(int64_t{1} << 50); });
  EXPECT_HAS(m, "arange(1125899906842624)");
}

TEST(CheckedSizes, PermuteNeverNarrowsAnAxis) {
  auto& rng = bp_test::rng("bp_unit_tests");
  const int64_t r = std::uniform_int_distribution<int64_t>(2, 6)(rng);
  bp::Tensor x = bp::rand({4, r});
  // Once: 4294967297 narrowed to 1, and the transpose came back.
  EXPECT_HAS(expect_throw<bp::ShapeError>([&] {
               x.permute({4294967297LL, 0});
             }),
             "permute: axis 4294967297 is out of range for a tensor of rank 2");
  EXPECT_HAS(expect_throw<bp::ShapeError>([&] {
               x.permute({0, INT64_MAX});
             }),
             "axis 9223372036854775807 is out of range");
  bp::Tensor t = x.permute({1, -2});
  EXPECT_EQ(t.shape(), (bp::Shape{r, 4}));
  EXPECT_EQ(t.contiguous().to_vector<float>(), x.transpose(0, 1).contiguous().to_vector<float>());
}

TEST(CheckedSizes, ADataLoaderWithTheLargestBatchSizeYieldsOneFullBatch) {
  const int64_t n = std::uniform_int_distribution<int64_t>(3, 40)(bp_test::rng("bp_unit_tests"));
  bp::Tensor x = bp::rand({n, 3}), y = bp::rand({n, 1});
  for (int64_t bs :
       {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max() - 5, n + 1, n}) {
    bp::DataLoader dl(x, y, {.batch_size = bs});
    EXPECT_EQ(dl.num_batches(), 1) << "batch_size " << bs;  // once 0 and -1
    int64_t rows = 0, batches = 0;
    for (auto b : dl) {
      rows += b.x.shape()[0];
      ++batches;
    }
    EXPECT_EQ(batches, 1);
    EXPECT_EQ(rows, n);
  }
  bp::DataLoader dl(x, y, {.batch_size = 2});
  EXPECT_EQ(dl.num_batches(), (n + 1) / 2);
}

// ---- files ------------------------------------------------------------------------------------

struct TempDir {
  fs::path p;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "bp-hostile-XXXXXX").string();
    p = ::mkdtemp(t.data());
  }
  ~TempDir() { fs::remove_all(p); }
};

TEST(OutputTargets, SavingOverADeviceFifoOrFolderIsAnIOErrorAndLeavesItAlone) {
  TempDir d;
  const std::string fifo = (d.p / "trace.fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::map<std::string, bp::Tensor> tensors{{"w", bp::rand({4})}};
  // Once: /dev/null, a FIFO, a folder's name replaced by a regular file.
  for (const auto& [path, kind] : std::vector<std::pair<std::string, std::string>>{
           {"/dev/null", "is a character device, not a regular file"},
           {fifo, "is a named pipe (FIFO), not a regular file"},
           {d.p.string(), "is a directory, not a regular file"}}) {
    EXPECT_HAS(expect_throw<bp::IOError>([&] { bp::save(tensors, path); }), path + " " + kind);
  }
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  bp::profiler::start();
  (void)(bp::zeros({3}) + 1.0);
  bp::profiler::stop();
  EXPECT_HAS(expect_throw<bp::IOError>([&] { bp::profiler::save(fifo); }),
             "bp::profiler::save: " + fifo + " is a named pipe (FIFO)");
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

TEST(OutputTargets, ASymlinkIsFollowedAndKept) {
  TempDir d;
  const fs::path real = d.p / "v3.safetensors", link = d.p / "model.safetensors";
  std::ofstream(real) << "old";
  fs::create_symlink("v3.safetensors", link);
  bp::Tensor w = bp::rand({5});
  bp::save({{"w", w}}, link.string());
  EXPECT_TRUE(fs::is_symlink(link));  // once replaced by a regular file, v3 left stale
  auto back = bp::load_file(real.string());
  EXPECT_EQ(back.at("w").to_vector<float>(), w.to_vector<float>());
  fs::create_symlink("/dev/null", d.p / "to-null");
  EXPECT_HAS(expect_throw<bp::IOError>([&] {
               bp::save({{"w", w}}, (d.p / "to-null").string());
             }),
             "/dev/null (where " + (d.p / "to-null").string() + " leads) is a character device");
}

TEST(Files, LoadingAFifoIsRefusedWithoutWaitingForAWriter) {
  TempDir d;
  const std::string fifo = (d.p / "st.fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Once: blocked forever in open(2).
  EXPECT_HAS(expect_throw<bp::IOError>([&] { bp::load_file(fifo); }),
             "not a regular file (a named pipe (FIFO))");
}

TEST(Messages, AHugeDeviceStringIsTruncated) {
  std::string huge(1 << 20, 'x');
  std::string m = expect_throw<bp::DeviceError>([&] { bp::device(huge + ":0:0"); });
  EXPECT_LT(m.size(), 4096u);  // once 2 MB
  EXPECT_HAS(m, "... (1048580 bytes)");
}

}  // namespace

namespace {

// Once: true for a cpu:0 and an opencl:0 tensor (values compared through the host).
TEST(Misleading, AllcloseAcrossDevicesIsADeviceMismatch) {
  if (bp::num_devices("opencl") == 0) GTEST_SKIP() << "no opencl device here";
  bp::Tensor a = bp::rand({7});
  std::string m = expect_throw<bp::DeviceMismatch>(
      [&] { (void)bp::allclose(a, a.to(bp::device("opencl:0"))); });
  EXPECT_HAS(m, "allclose");
}

// Once: false ("no plugin provides device type 'cpu:0'") and 0.
TEST(Misleading, AvailabilityAcceptsADeviceString) {
  EXPECT_TRUE(bp::is_available("cpu:0").available);
  EXPECT_EQ(bp::num_devices("cpu:0"), bp::num_devices("cpu"));
  bp::Availability a = bp::is_available("cpu:99");
  EXPECT_FALSE(a.available);
  EXPECT_HAS(a.reason, "cpu:99 does not exist");
  EXPECT_THROW(bp::is_available("cpu:01"), bp::DeviceError);
}

// Once: with XDG_RUNTIME_DIR unset, a /tmp/backplane-stats-<uid> made by someone else (here a
// symbolic link to a folder holding a planted link) was used, and a file outside overwritten.
TEST(PrivateFolders, AStatsFolderThatIsALinkIsNotUsed) {
  const std::string dir = "/tmp/backplane-stats-" + std::to_string(::getuid());
  if (fs::exists(fs::symlink_status(dir)))
    GTEST_SKIP() << dir << " exists (another Backplane program's); not touched";
  TempDir d;
  const fs::path victim = d.p / "victim.txt", planted = d.p / "planted";
  fs::create_directory(planted);
  std::ofstream(victim) << "ORIGINAL";
  for (int k = 0; k < 64; ++k)  // links for the pids the child may get
    fs::create_symlink(victim, planted / (std::to_string(::getpid() + k) + ".json.tmp"));
  fs::create_directory_symlink(planted, dir);
  FILE* p = ::popen(("env -u XDG_RUNTIME_DIR -u BACKPLANE_STATS_DIR BACKPLANE_PUBLISH_STATS=1 " +
                     bp_test::beside_exe(BP_SMI_REL) + " 2>&1")
                        .c_str(),
                    "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  fs::remove(dir);
  EXPECT_HAS(out,
             "BACKPLANE_PUBLISH_STATS: " + dir + " is a symbolic link, not a private directory");
  std::ifstream in(victim);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "ORIGINAL");
}

}  // namespace
