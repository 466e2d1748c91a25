// Native handles and external memory (plugin ABI 1.2) on every device: Tensor::native and
// data_ptr, bp::from_blob (zero copy both ways, strides, release exactly once after the last
// view), Device::import_buffer / import_stream, Stream::native_handle, and the typed errors.
#include <backplane_test/throws.hpp>
#include "device_params.hpp"

#include <backplane/abi/plugin_abi.h>  // BP_DLPACK_* values

#include <climits>
#include <cstdio>
#include <cstring>
#include <optional>

namespace {

class NativeTest : public bptest::DeviceTest {
 protected:
  // The device's native memory kind, or nullopt when its buffers have no address (OpenCL).
  std::optional<bp::NativeBuffer> kind() {
    try {
      return bp::empty({4}, dev()).native();
    } catch (const bp::UnsupportedError&) {
      return std::nullopt;
    }
  }
  bool host_memory() {
    auto k = kind();
    return k && k->dlpack_device_type == BP_DLPACK_CPU;
  }
  // Fresh random f32 values with their seed printed, so a failure can be repeated.
  std::vector<float> random_floats(size_t n) {
    uint64_t seed = std::random_device{}();
    std::printf("[ seed ] %llu\n", static_cast<unsigned long long>(seed));
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-4.0f, 4.0f);
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
  }
};

using bp_test::expect_throw;

TEST_P(NativeTest, AddressesOfViews) {
  bp::Tensor t = make(bptest::random_values(12), {3, 4});
  auto k = kind();
  if (!k) {
    std::string msg = expect_throw<bp::UnsupportedError>([&] { (void)t.native(); });
    EXPECT_HAS(msg, dev().str());
    EXPECT_HAS(msg, "buffer_native");
    expect_throw<bp::UnsupportedError>([&] { (void)t.data_ptr(); });
    return;
  }
  bp::NativeBuffer n = t.native();
  ASSERT_NE(n.address, nullptr);
  EXPECT_EQ(n.device_ordinal, k->device_ordinal);
  EXPECT_EQ(n.dlpack_device_type, k->dlpack_device_type);
  EXPECT_EQ(n.dlpack_device_type == BP_DLPACK_CPU, dev().properties().unified_memory);
  EXPECT_EQ(t.data_ptr(), n.address);
  char* base = static_cast<char*>(n.address);
  EXPECT_EQ(t.slice(1, 1, 3).data_ptr(), base + 1 * 4);
  EXPECT_EQ(t.select(0, 2).data_ptr(), base + 8 * 4);
  EXPECT_EQ(t.t().data_ptr(), base);
  EXPECT_EQ(t.storage()->native(48).address, base + 48);  // one past the end is valid
  std::string msg = expect_throw<bp::ShapeError>([&] { (void)t.storage()->native(49); });
  EXPECT_HAS(msg, "byte 49");
  EXPECT_HAS(msg, "48 bytes");
  // A zero-element tensor still names its device (a 0-byte allocation may have no handle).
  bp::NativeBuffer e = bp::empty({0, 3}, dev()).native();
  EXPECT_EQ(e.device_ordinal, n.device_ordinal);
  EXPECT_EQ(e.dlpack_device_type, n.dlpack_device_type);
  if (n.dlpack_device_type == BP_DLPACK_CPU) {
    dev().synchronize();
    std::vector<float> values = t.to_vector<float>();
    EXPECT_EQ(std::memcmp(n.address, values.data(), 48), 0);
  }
}

TEST_P(NativeTest, FromBlobOnHostMemoryIsZeroCopyBothWaysAndReleasesOnce) {
  if (!host_memory()) GTEST_SKIP() << dev().str() << " does not use host memory";
  std::vector<float> mem = random_floats(12);
  const std::vector<float> original = mem;
  int released = 0;
  bp::Tensor view;
  {
    bp::Tensor t =
        bp::from_blob(dev(), mem.data(), {3, 4}, {}, bp::DType::f32, [&] { ++released; });
    EXPECT_EQ(t.data_ptr(), mem.data());
    EXPECT_EQ(t.strides(), (bp::Shape{4, 1}));
    EXPECT_TRUE(t.storage()->imported());
    EXPECT_EQ(t.to_vector<float>(), original);
    mem[5] = 42.5f;  // host -> tensor
    EXPECT_EQ(t.to_vector<float>()[5], 42.5f);
    t.mul_(2.0);  // tensor -> host
    dev().synchronize();
    EXPECT_EQ(mem[5], 85.0f);
    EXPECT_EQ(mem[0], original[0] * 2.0f);
    view = t.slice(1, 1, 3);
    EXPECT_EQ(view.data_ptr(), mem.data() + 1);
  }
  EXPECT_EQ(released, 0) << "released while a view was alive";
  EXPECT_EQ(view.to_vector<float>()[0], original[1] * 2.0f);
  view = bp::Tensor();
  EXPECT_EQ(released, 1);
}

// The C release-function form (what DLPack's import uses: no allocation for the release):
// `release(ctx)` runs exactly once, with the context given, after the last view is gone.
struct ReleaseCount {
  int calls = 0;
  void* last_ctx = nullptr;
};
void count_release(void* ctx) {
  auto* c = static_cast<ReleaseCount*>(ctx);
  ++c->calls;
  c->last_ctx = ctx;
}

TEST_P(NativeTest, FromBlobWithACReleaseFunctionReleasesOnceWithItsContext) {
  if (!kind()) GTEST_SKIP() << dev().str() << " has no native buffer addresses";
  std::vector<float> values = random_floats(24);
  bp::Tensor owner = bp::from_vector(values, {24}, dev());
  ReleaseCount count;
  bp::Tensor view;
  {
    bp::Tensor t =
        bp::from_blob(dev(), owner.data_ptr(), {4, 6}, {}, bp::DType::f32, &count_release, &count);
    EXPECT_EQ(t.data_ptr(), owner.data_ptr());
    EXPECT_TRUE(t.storage()->imported());
    EXPECT_EQ(t.storage()->size(), 24u * 4);
    EXPECT_EQ(t.to_vector<float>(), values);
    view = t.select(0, 3);
  }
  dev().synchronize();
  EXPECT_EQ(count.calls, 0) << "released while a view was alive";
  std::vector<float> row = view.to_vector<float>();
  EXPECT_EQ(row, std::vector<float>(values.begin() + 18, values.end()));
  view = bp::Tensor();
  dev().synchronize();  // a backend may release once the stream's work is done
  EXPECT_EQ(count.calls, 1);
  EXPECT_EQ(count.last_ctx, &count);
  // Device::import_buffer's C form the same; a NULL function runs nothing.
  {
    auto buf = dev().import_buffer(owner.data_ptr(), 96, &count_release, &count);
    EXPECT_TRUE(buf->imported());
    EXPECT_EQ(buf->size(), 96u);
  }
  dev().synchronize();
  EXPECT_EQ(count.calls, 2);
  { auto buf = dev().import_buffer(owner.data_ptr(), 96, nullptr, &count); }
  {
    bp::Tensor t =
        bp::from_blob(dev(), owner.data_ptr(), {24}, {}, bp::DType::f32, nullptr, nullptr);
  }
  dev().synchronize();
  EXPECT_EQ(count.calls, 2);
}

TEST_P(NativeTest, FromBlobStridesAndBroadcast) {
  if (!host_memory()) GTEST_SKIP() << dev().str() << " does not use host memory";
  std::vector<float> mem = random_floats(12);  // a 4x3 row-major matrix
  bp::Tensor tt = bp::from_blob(dev(), mem.data(), {3, 4}, {1, 3}, bp::DType::f32);
  std::vector<float> got = tt.to_vector<float>();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(got[i * 4 + j], mem[j * 3 + i]);
  EXPECT_FALSE(tt.is_contiguous());
  bp::Tensor row = bp::from_blob(dev(), mem.data(), {5, 3}, {0, 1}, bp::DType::f32);
  std::vector<float> rows = row.to_vector<float>();
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(rows[i * 3 + j], mem[j]);
  bp::Tensor sum = (tt + 1.0).sum();
  double want = 0;
  for (float v : mem) want += v + 1.0;
  EXPECT_NEAR(sum.item<float>(), want, 1e-4 * (1 + std::abs(want)));
  // Every element the strides reach, and no more, is imported.
  bp::Tensor odd = bp::from_blob(dev(), mem.data() + 1, {2, 2}, {5, 2}, bp::DType::f32);
  EXPECT_EQ(odd.storage()->size(), (1 + 5 + 2) * 4u);
  bp::Tensor empty = bp::from_blob(dev(), nullptr, {0, 3}, {}, bp::DType::f32);
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.storage()->size(), 0u);
}

TEST_P(NativeTest, FromBlobAliasOfDeviceMemory) {
  // What a DLPack round trip does: wrap memory another library owns (here a tensor of ours,
  // kept alive by the release function), on any device with addressable memory.
  if (!kind()) GTEST_SKIP() << dev().str() << " has no native buffer addresses";
  std::vector<float> values = random_floats(1000);
  int released = 0;
  bp::Tensor alias;
  {
    bp::Tensor owner = bp::from_vector(values, {1000}, dev());
    void* address = owner.data_ptr();
    alias = bp::from_blob(dev(), address, {10, 100}, {}, bp::DType::f32,
                          [owner, &released] { ++released; });
    EXPECT_EQ(alias.data_ptr(), address);
    EXPECT_EQ(alias.native().device_ordinal, owner.native().device_ordinal);
    EXPECT_EQ(alias.to_vector<float>(), values);
    alias.fill_(3.0);
    EXPECT_EQ(owner.to_vector<float>(), std::vector<float>(1000, 3.0f));
    owner.add_(owner);
    EXPECT_EQ(alias.sum().item<float>(), 6000.0f);
  }
  alias = bp::Tensor();
  dev().synchronize();  // a backend may release once the stream's work is done
  EXPECT_EQ(released, 1);
}

TEST_P(NativeTest, ImportedMemoryIsNotCounted) {
  if (!kind()) GTEST_SKIP() << dev().str() << " has no native buffer addresses";
  bp::Tensor owner = bp::zeros({4096}, dev());
  dev().synchronize();
  bp::MemoryStats before = dev().memory_stats();
  {
    auto buf = dev().import_buffer(owner.data_ptr(), 4096 * 4, [owner] {});
    EXPECT_TRUE(buf->imported());
    EXPECT_EQ(buf->size(), 4096u * 4);
    bp::MemoryStats during = dev().memory_stats();
    EXPECT_EQ(during.allocated, before.allocated);
    EXPECT_EQ(during.num_allocs, before.num_allocs);
    EXPECT_EQ(during.total_allocs, before.total_allocs);
  }
  dev().synchronize();
  EXPECT_EQ(dev().memory_stats().allocated, before.allocated);
  EXPECT_EQ(dev().memory_stats().total_allocs, before.total_allocs);
}

TEST_P(NativeTest, FromBlobBadArgumentsAreTypedAndNeverRelease) {
  alignas(64) float mem[16] = {};
  int released = 0;
  auto rel = [&] { ++released; };
  std::string msg = expect_throw<bp::ShapeError>([&] {
    bp::from_blob(dev(), mem, {2, 2}, {2, -1}, bp::DType::f32, rel);
  });
  EXPECT_HAS(msg, "stride -1 of dimension 1 is negative");
  msg = expect_throw<bp::ShapeError>([&] {
    bp::from_blob(dev(), mem, {2, 2}, {2}, bp::DType::f32, rel);
  });
  EXPECT_HAS(msg, "1 strides [2] for a shape of rank 2");
  msg = expect_throw<bp::ShapeError>([&] {
    bp::from_blob(dev(), mem, {2, -3}, {}, bp::DType::f32, rel);
  });
  EXPECT_HAS(msg, "negative dimension -3");
  msg = expect_throw<bp::ShapeError>([&] {
    const int64_t k = int64_t{1} << 31;  // 2^62 elements, but the strides reach past 2^63
    bp::from_blob(dev(), mem, {k, k}, {2 * k, k}, bp::DType::f32, rel);
  });
  EXPECT_HAS(msg, "more than 2^63 bytes");
  msg = expect_throw<bp::ShapeError>([&] {
    bp::from_blob(dev(), mem, {INT64_MAX / 2, 4}, {0, 0}, bp::DType::f32, rel);
  });
  EXPECT_HAS(msg, "more than 2^63 elements");
  msg = expect_throw<bp::ShapeError>(
      [&] { bp::from_blob(dev(), mem, bp::Shape(bp::kMaxRank + 1, 1), {}, bp::DType::f32, rel); });
  EXPECT_HAS(msg, "exceeds the maximum");
  msg = expect_throw<bp::DTypeError>(
      [&] { bp::from_blob(dev(), mem, {4}, {}, static_cast<bp::DType>(42), rel); });
  EXPECT_HAS(msg, "dtype value 42 is not a Backplane dtype");
  msg = expect_throw<bp::DTypeError>([&] {
    bp::from_blob(dev(), reinterpret_cast<char*>(mem) + 2, {4}, {}, bp::DType::f32, rel);
  });
  EXPECT_HAS(msg, "not aligned to the 4-byte size of f32");
  msg = expect_throw<bp::DeviceError>(
      [&] { bp::from_blob(dev(), nullptr, {4}, {}, bp::DType::f32, rel); });
  EXPECT_HAS(msg, "NULL");
  EXPECT_HAS(msg, dev().str());
  msg = expect_throw<bp::DeviceError>([&] { dev().import_buffer(nullptr, 16, rel); });
  EXPECT_HAS(msg, "NULL for 16 bytes");
  EXPECT_EQ(released, 0);
  // The C release-function form checks the same and never releases on a throw either.
  ReleaseCount count;
  msg = expect_throw<bp::ShapeError>([&] {
    bp::from_blob(dev(), mem, {2, 2}, {2, -1}, bp::DType::f32, &count_release, &count);
  });
  EXPECT_HAS(msg, "stride -1 of dimension 1 is negative");
  msg = expect_throw<bp::DTypeError>([&] {
    bp::from_blob(dev(), reinterpret_cast<char*>(mem) + 2, {4}, {}, bp::DType::f32, &count_release,
                  &count);
  });
  EXPECT_HAS(msg, "not aligned to the 4-byte size of f32");
  msg = expect_throw<bp::DeviceError>(
      [&] { dev().import_buffer(nullptr, 16, &count_release, &count); });
  EXPECT_HAS(msg, "NULL for 16 bytes");
  EXPECT_EQ(count.calls, 0);
}

TEST_P(NativeTest, ImportWithoutAddressableMemoryIsUnsupported) {
  if (kind()) GTEST_SKIP() << dev().str() << " has native buffer addresses";
  alignas(64) float mem[16] = {};
  int released = 0;
  std::string msg = expect_throw<bp::UnsupportedError>(
      [&] { dev().import_buffer(mem, sizeof mem, [&] { ++released; }); });
  EXPECT_HAS(msg, dev().str() + ": import_buffer of 64 bytes");
  EXPECT_HAS(msg, "buffer_import");
  EXPECT_HAS(msg, "(plugin " + dev().backend_name() + ")");
  if (dev().type() == "opencl") {
    EXPECT_HAS(msg, "cl_mem");
  }
  msg = expect_throw<bp::UnsupportedError>(
      [&] { bp::from_blob(dev(), mem, {16}, {}, bp::DType::f32, [&] { ++released; }); });
  EXPECT_HAS(msg, dev().str());
  EXPECT_EQ(released, 0);
  ReleaseCount count;
  msg = expect_throw<bp::UnsupportedError>(
      [&] { bp::from_blob(dev(), mem, {16}, {}, bp::DType::f32, &count_release, &count); });
  EXPECT_HAS(msg, "buffer_import");
  EXPECT_EQ(count.calls, 0);
}

TEST_P(NativeTest, StreamNativeHandlesAndImport) {
  std::unique_ptr<bp::Stream> s = dev().create_stream(), s2 = dev().create_stream();
  void* h = s->native_handle();
  EXPECT_EQ(s->native_handle(), h);
  void* h2 = s2->native_handle();
  if (h) {
    EXPECT_NE(h, h2);
  } else {
    EXPECT_EQ(h2, nullptr) << "one stream without a native object, another with one";
  }
  EXPECT_EQ(dev().default_stream().native_handle(), dev().default_stream().native_handle());
  {
    std::unique_ptr<bp::Stream> wrapped = dev().import_stream(h);
    EXPECT_EQ(wrapped->native_handle(), h);
    EXPECT_EQ(&wrapped->device(), &dev());
    auto buf = dev().allocator().allocate(4096, *wrapped);
    std::vector<uint8_t> bytes(4096), back(4096);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 1);
    dev().copy_from_host(*wrapped, *buf, 0, bytes.data(), bytes.size());
    dev().copy_to_host(*s, back.data(), *buf, 0, back.size());  // same native queue: in order
    s->synchronize();
    EXPECT_EQ(back, bytes);
    wrapped->synchronize();
  }
  // Destroying the wrapper left the native stream alive.
  auto buf = dev().allocator().allocate(64, *s);
  dev().memset(*s, *buf, 0, 9, 64);
  s->synchronize();
}

INSTANTIATE_TEST_SUITE_P(AllDevices, NativeTest, ::testing::ValuesIn(bptest::device_strings()),
                         bptest::param_name);

}  // namespace
