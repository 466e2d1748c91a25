// The CUDA plugin's native-handle slots (plugin ABI 1.2) against memory and streams made with
// the CUDA runtime directly, as PyTorch or CuPy would hand them over: cudaMalloc'd memory
// imported and computed on, its release checked to run only after the freeing stream's work
// (the callback queries that stream itself), host and pinned memory refused with the reason,
// managed memory reported as kDLCUDAManaged, foreign cudaStream_t wrapped without being
// destroyed. Every test skips when the plugin reports no device (CI).
#include "cuda_test_support.hpp"

#include <cuda_runtime_api.h>

#include <atomic>

namespace bp_cuda_test {
namespace {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

bool have_gpu() {
  return plugin().count > 0;
}
#define NEED_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << plugin().reason

template <class Slot>
Slot need_slot(Slot s, const char* name) {
  if (!s) throw std::runtime_error(std::string("the CUDA plugin leaves ") + name + " NULL");
  return s;
}

// What the release callback saw.
struct Release {
  std::atomic<int> calls{0};
  cudaStream_t watch = nullptr;              // the freeing stream
  std::atomic<int> stream_idle_at_call{-1};  // 1 when cudaStreamQuery(watch) was cudaSuccess
  static void fn(void* ctx) {
    auto* r = static_cast<Release*>(ctx);
    if (r->watch) r->stream_idle_at_call = cudaStreamQuery(r->watch) == cudaSuccess ? 1 : 0;
    r->calls.fetch_add(1);
  }
};

cudaStream_t native_stream(bp_stream* s) {
  void* h = nullptr;
  check(need_slot(api()->stream_native, "stream_native")(s, &h), "stream_native");
  return static_cast<cudaStream_t>(h);
}

bp_native_buffer native_of(bp_buffer* b, uint64_t off) {
  bp_native_buffer n{};
  n.struct_size = sizeof n;
  check(need_slot(api()->buffer_native, "buffer_native")(b, off, &n), "buffer_native");
  return n;
}

bp_tensor_desc vec(bp_buffer* b, int64_t n) {
  bp_tensor_desc d{};
  d.struct_size = sizeof d;
  d.buffer = b;
  d.dtype = BP_DTYPE_F32;
  d.rank = 1;
  d.shape[0] = n;
  d.strides[0] = 1;
  return d;
}

void add(bp_stream* s, bp_buffer* a, bp_buffer* b, bp_buffer* out, int64_t n) {
  bp_kernel* k = nullptr;
  check(api()->find_kernel(0, "add", BP_DTYPE_F32, &k), "find_kernel add f32");
  bp_tensor_desc ins[2] = {vec(a, n), vec(b, n)};
  bp_tensor_desc o = vec(out, n);
  check(api()->launch(k, s, ins, 2, &o, 1, nullptr, 0), "launch add");
}

std::vector<float> random_floats(size_t n) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(uniform(-4, 4));
  return v;
}

TEST(CudaNative, OwnBuffersHaveDevicePointers) {
  NEED_GPU();
  DevBuf b(4096 + 7);
  bp_native_buffer n0 = native_of(b.get(), 0), n7 = native_of(b.get(), 4096 + 7);
  EXPECT_EQ(n0.dlpack_device_type, BP_DLPACK_CUDA);
  EXPECT_EQ(n7.address, static_cast<char*>(n0.address) + 4096 + 7);
  cudaPointerAttributes a{};
  CUDA_OK(cudaPointerGetAttributes(&a, n0.address));
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  EXPECT_EQ(a.device, n0.device_ordinal);
  // The bytes at the address are the buffer's.
  std::vector<unsigned char> data(4096), back(4096);
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<unsigned char>(uniform_int(1, 255));
  check(api()->copy_h2d(stream(), b.get(), 0, data.data(), data.size()), "copy_h2d");
  sync();
  CUDA_OK(cudaMemcpy(back.data(), n0.address, back.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, data);
}

TEST(CudaNative, ImportedMemoryComputesAndIsReleasedAfterTheStreamsWork) {
  NEED_GPU();
  auto import = need_slot(api()->buffer_import, "buffer_import");
  const int64_t n = int64_t{1} << 24;  // 64 MiB: the queued work outlasts the free call
  const uint64_t bytes = static_cast<uint64_t>(n) * 4;
  CUDA_OK(cudaSetDevice(0));
  void* mem = nullptr;
  CUDA_OK(cudaMalloc(&mem, bytes));
  std::vector<float> x = random_floats(static_cast<size_t>(n));
  CUDA_OK(cudaMemcpy(mem, x.data(), bytes, cudaMemcpyHostToDevice));
  bp_memory_stats before{};
  before.struct_size = sizeof before;
  check(api()->memory_stats(0, &before), "memory_stats");
  Release rel;
  rel.watch = native_stream(stream());
  bp_buffer* h = nullptr;
  check(import(0, mem, bytes, &Release::fn, &rel, &h), "buffer_import");
  bp_memory_stats during{};
  during.struct_size = sizeof during;
  check(api()->memory_stats(0, &during), "memory_stats");
  EXPECT_EQ(during.allocated, before.allocated);
  EXPECT_EQ(during.num_allocs, before.num_allocs);
  EXPECT_EQ(native_of(h, 12).address, static_cast<char*>(mem) + 12);
  {
    DevBuf o(bytes);
    // mem <- mem + mem, ten times over, all queued; then the free, with the work in flight.
    for (int i = 0; i < 10; ++i) {
      add(stream(), h, h, o.get(), n);
      check(api()->copy_d2d(stream(), h, 0, o.get(), 0, bytes), "copy_d2d into the import");
    }
    check(api()->mem_free(0, stream(), h, bytes), "mem_free of the import");
    sync();
  }
  EXPECT_EQ(rel.calls.load(), 1);
  EXPECT_EQ(rel.stream_idle_at_call.load(), 1)
      << "release ran while work queued before the free was still running";
  std::vector<float> got(static_cast<size_t>(n));
  CUDA_OK(cudaMemcpy(got.data(), mem, bytes, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < got.size(); i += 4099) ASSERT_EQ(got[i], x[i] * 1024.0f) << i;
  DevBuf more(64);  // later calls never release again
  sync();
  EXPECT_EQ(rel.calls.load(), 1);
  CUDA_OK(cudaFree(mem));
}

TEST(CudaNative, ImportFreedWithNullStreamSynchronisesTheDevice) {
  NEED_GPU();
  void* mem = nullptr;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaMalloc(&mem, 1 << 20));
  Release rel;
  bp_buffer* h = nullptr;
  check(api()->buffer_import(0, mem, 1 << 20, &Release::fn, &rel, &h), "buffer_import");
  check(api()->memset(stream(), h, 0, 0x11, 1 << 20), "memset");
  check(api()->mem_free(0, nullptr, h, 1 << 20), "mem_free (NULL stream)");
  EXPECT_EQ(rel.calls.load(), 1);
  unsigned char last = 0;
  CUDA_OK(cudaMemcpy(&last, static_cast<char*>(mem) + (1 << 20) - 1, 1, cudaMemcpyDeviceToHost));
  EXPECT_EQ(last, 0x11);
  CUDA_OK(cudaFree(mem));
}

TEST(CudaNative, HostAndForeignMemoryAreRefusedWithTheReason) {
  NEED_GPU();
  Release rel;
  bp_buffer* h = nullptr;
  std::vector<float> host(1024);
  Err e = error_of(api()->buffer_import(0, host.data(), 4096, &Release::fn, &rel, &h));
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(e.message.find("is ordinary host memory, not device memory of cuda:0"),
            std::string::npos)
      << e.message;
  EXPECT_NE(e.message.find("imported on cpu:0"), std::string::npos) << e.message;
  void* pinned = nullptr;
  CUDA_OK(cudaMallocHost(&pinned, 4096));
  e = error_of(api()->buffer_import(0, pinned, 4096, &Release::fn, &rel, &h));
  EXPECT_NE(e.message.find("page-locked host memory"), std::string::npos) << e.message;
  CUDA_OK(cudaFreeHost(pinned));
  // The last byte is checked too: a range running past a small allocation.
  void* small = nullptr;
  CUDA_OK(cudaMalloc(&small, 256));
  e = error_of(api()->buffer_import(0, small, uint64_t{1} << 40, &Release::fn, &rel, &h));
  EXPECT_NE(e.message.find("last byte"), std::string::npos) << e.message;
  CUDA_OK(cudaFree(small));
  if (plugin().count >= 2) {
    void* other = nullptr;
    CUDA_OK(cudaSetDevice(1));
    CUDA_OK(cudaMalloc(&other, 4096));
    e = error_of(api()->buffer_import(0, other, 4096, &Release::fn, &rel, &h));
    EXPECT_NE(e.message.find("device memory of cuda:1, not device memory of cuda:0"),
              std::string::npos)
        << e.message;
    CUDA_OK(cudaFree(other));
    CUDA_OK(cudaSetDevice(0));
  }
  EXPECT_EQ(rel.calls.load(), 0);
}

TEST(CudaNative, ManagedMemoryIsReportedAsManaged) {
  NEED_GPU();
  void* raw = nullptr;
  CUDA_OK(cudaMallocManaged(&raw, 1024 * sizeof(float)));
  auto* m = static_cast<float*>(raw);
  for (int i = 0; i < 1024; ++i) m[i] = static_cast<float>(i);
  Release rel;
  bp_buffer* h = nullptr;
  check(api()->buffer_import(0, m, 4096, &Release::fn, &rel, &h), "buffer_import (managed)");
  EXPECT_EQ(native_of(h, 0).dlpack_device_type, BP_DLPACK_CUDA_MANAGED);
  add(stream(), h, h, h, 1024);
  check(api()->mem_free(0, stream(), h, 4096), "mem_free");
  sync();
  EXPECT_EQ(rel.calls.load(), 1);
  for (int i = 0; i < 1024; i += 97) EXPECT_EQ(m[i], 2.0f * i);
  CUDA_OK(cudaFree(m));
}

TEST(CudaNative, ForeignStreamsAreWrappedNotOwned) {
  NEED_GPU();
  auto import = need_slot(api()->stream_import, "stream_import");
  CUDA_OK(cudaSetDevice(0));
  cudaStream_t foreign = nullptr;
  CUDA_OK(cudaStreamCreate(&foreign));
  bp_stream* s = nullptr;
  check(import(0, foreign, &s), "stream_import");
  EXPECT_EQ(native_stream(s), foreign);
  const int64_t n = (int64_t{1} << 20) + 3;
  std::vector<float> x = random_floats(static_cast<size_t>(n)), got(static_cast<size_t>(n));
  {
    DevBuf a(static_cast<uint64_t>(n) * 4, 0, s), o(static_cast<uint64_t>(n) * 4, 0, s);
    check(api()->copy_h2d(s, a.get(), 0, x.data(), x.size() * 4), "copy_h2d");
    add(s, a.get(), a.get(), o.get(), n);
    // The work is on the foreign stream: synchronising it (not the wrapper) completes it.
    void* out = native_of(o.get(), 0).address;
    CUDA_OK(cudaMemcpyAsync(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost, foreign));
    CUDA_OK(cudaStreamSynchronize(foreign));
  }
  for (size_t i = 0; i < got.size(); i += 1021) ASSERT_EQ(got[i], 2.0f * x[i]) << i;
  check(api()->stream_synchronize(s), "stream_synchronize");
  check(api()->stream_destroy(s), "stream_destroy of the wrapper");
  EXPECT_EQ(cudaStreamQuery(foreign), cudaSuccess) << "the foreign stream was destroyed";
  CUDA_OK(cudaStreamDestroy(foreign));
  // The legacy default stream (0) wraps as well.
  bp_stream* legacy = nullptr;
  check(import(0, nullptr, &legacy), "stream_import(0)");
  EXPECT_EQ(native_stream(legacy), nullptr);
  {
    DevBuf t(4096, 0, legacy);
    check(api()->memset(legacy, t.get(), 0, 5, 4096), "memset on the legacy stream");
  }
  check(api()->stream_synchronize(legacy), "stream_synchronize (legacy)");
  check(api()->stream_destroy(legacy), "stream_destroy (legacy)");
  if (plugin().count >= 2) {
    CUDA_OK(cudaSetDevice(1));
    cudaStream_t other = nullptr;
    CUDA_OK(cudaStreamCreate(&other));
    Err e = error_of(import(0, other, &s));
    EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(e.message.find("belongs to cuda:1"), std::string::npos) << e.message;
    CUDA_OK(cudaStreamDestroy(other));
    CUDA_OK(cudaSetDevice(0));
  }
}

}  // namespace
}  // namespace bp_cuda_test
