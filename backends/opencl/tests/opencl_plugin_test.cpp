// The OpenCL backend's own cases through its C ABI (the plugin loaded by libbackplane's loader),
// on every OpenCL device the ICD loader finds: its properties and the support matrix it must
// declare (f64 only where the device has fp64), cached buffers reused across streams, one kernel
// on many streams at once (the PoCL dlhandle-cache workaround), its launch error messages, the
// allocator's size classes, program build logs, and the ICD and fp64 paths: NoIcd.* and
// NoFp64.* run as separate CTest entries with their environment, and SharedCases.* runs the
// conformance kit's f32 cases through bp_conformance_lib with fp64 disabled. Every op x dtype
// against the float64 reference, memory, copies, streams and events are the kit's shared cases:
// conformance.opencl. Tests skip when there is no device.
#include "opencl_test_support.hpp"

#include "opencl_allocator.hpp"
#include "opencl_device.hpp"
#include "opencl_program.hpp"

#include <backplane/sdk/plugin_sdk.hpp>
#include <conformance_gtest.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace bpt;

namespace {

constexpr int32_t kAllDtypes[] = {BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_F16, BP_DTYPE_BF16,
                                  BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_U8,  BP_DTYPE_BOOL};

// The support matrix every backend implements (common brief), for dtypes f32 f64 f16 bf16
// i32 i64 u8 bool in that order.
const std::map<std::string, std::string>& expected_matrix() {
  static const std::map<std::string, std::string> m = {
      {"fill", "11111111"},
      {"copy", "11111111"},
      {"cast", "11111111"},
      {"add", "11111110"},
      {"sub", "11111110"},
      {"mul", "11111110"},
      {"maximum", "11111110"},
      {"minimum", "11111110"},
      {"div", "11110000"},
      {"pow", "11110000"},
      {"eq", "11111111"},
      {"ne", "11111111"},
      {"lt", "11111111"},
      {"le", "11111111"},
      {"gt", "11111111"},
      {"ge", "11111111"},
      {"where", "11111111"},
      {"neg", "11111100"},
      {"abs", "11111100"},
      {"relu", "11111100"},
      {"exp", "11110000"},
      {"log", "11110000"},
      {"sqrt", "11110000"},
      {"sigmoid", "11110000"},
      {"tanh", "11110000"},
      {"sum", "11111100"},
      {"max", "11111100"},
      {"mean", "11110000"},
      {"matmul", "11110000"},
      {"uniform", "11110000"},
      {"normal", "11110000"},
      {"sumsq", "11110000"},
      {"norm", "11110000"},
      {"linear", "11110000"},
      {"conv2d", "11110000"},
      {"conv2d_backward_input", "11110000"},
      {"conv2d_backward_weight", "11110000"},
      {"max_pool2d", "11110000"},
      {"max_pool2d_backward", "11110000"},
      {"avg_pool2d", "11110000"},
      {"avg_pool2d_backward", "11110000"},
      {"adaptive_avg_pool2d", "11110000"},
      {"adaptive_avg_pool2d_backward", "11110000"},
      {"batch_norm", "11110000"},
      {"batch_norm_backward", "11110000"},
      {"dropout", "11110000"},
      {"max_dim", "11111100"},
      {"min_dim", "11111100"},
      {"gather", "11111111"},
      {"scatter_add", "11111110"},
      {"softmax", "11110000"},
      {"log_softmax", "11110000"},
      {"softmax_backward", "11110000"},
      {"log_softmax_backward", "11110000"},
      // Minor 5, the transformer family.
      {"layer_norm", "11110000"},
      {"layer_norm_backward", "11110000"},
      {"gelu", "11110000"},
      {"gelu_backward", "11110000"},
      {"silu", "11110000"},
      {"silu_backward", "11110000"},
      {"embedding", "11110000"},
      {"embedding_backward", "11110000"},
      {"scaled_dot_product_attention", "11110000"},
      {"scaled_dot_product_attention_backward", "11110000"},
      {"triu", "11111111"},
      {"tril", "11111111"},
      {"cumsum", "11111100"},
      {"sin", "11110000"},
      {"cos", "11110000"},
      {"rsqrt", "11110000"},
      {"adamw", "11110000"},
      {"cross_entropy", "11110000"},
      {"cross_entropy_backward", "11110000"}};
  return m;
}

class OpenclPlugin : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(plugin().api, nullptr) << plugin().error;
    if (plugin().devices == 0) GTEST_SKIP() << "no OpenCL device: " << plugin().reason;
  }

  static int32_t devices() { return plugin().devices; }

  // The device's declared support of (op, dtype), from list_ops.
  static bool supported(int32_t d, const std::string& op, int32_t dt) {
    const bp_op_support* list = nullptr;
    int32_t n = 0;
    EXPECT_TRUE(ok(api().list_ops(d, &list, &n)));
    for (int32_t i = 0; i < n; ++i)
      if (op == list[i].op && list[i].dtype == dt) return list[i].support == BP_SUPPORT_YES;
    return false;
  }
};

std::string label(int32_t d, const std::string& op, int32_t dt) {
  return "opencl:" + std::to_string(d) + " " + op + " " + bp_dtype_name(dt);
}

}  // namespace

// ---- Discovery and the op table ---------------------------------------------------------------

TEST_F(OpenclPlugin, DeviceProperties) {
  for (int32_t d = 0; d < devices(); ++d) {
    bp_device_properties p{};
    p.struct_size = sizeof p;
    ASSERT_TRUE(ok(api().device_properties(d, &p)));
    EXPECT_GT(std::strlen(p.name), 0u);
    EXPECT_GT(std::strlen(p.vendor), 0u);
    EXPECT_NE(std::string(p.name).find("OpenCL"), std::string::npos) << p.name;
    EXPECT_GT(p.total_memory, 0u);
    EXPECT_LE(p.free_memory, p.total_memory);
    EXPECT_GT(p.cores, 0);
    EXPECT_EQ(p.unified_memory, 0);
    std::printf("[opencl test] opencl:%d: %s (%s), %llu bytes, %d compute units, fp64 %d\n", d,
                p.name, p.vendor, static_cast<unsigned long long>(p.total_memory), p.cores,
                p.supports_f64);
  }
  bp_device_properties p{};
  p.struct_size = sizeof p;
  ErrorInfo e = take(api().device_properties(devices(), &p));
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT) << e.message;
}

TEST_F(OpenclPlugin, OpTableMatchesMatrixAndFindKernel) {
  for (int32_t d = 0; d < devices(); ++d) {
    bp_device_properties p{};
    p.struct_size = sizeof p;
    ASSERT_TRUE(ok(api().device_properties(d, &p)));
    const bp_op_support* list = nullptr;
    int32_t n = 0;
    ASSERT_TRUE(ok(api().list_ops(d, &list, &n)));
    EXPECT_EQ(n, static_cast<int32_t>(expected_matrix().size() * BP_DTYPE_COUNT));
    std::set<std::pair<std::string, int32_t>> seen;
    for (int32_t i = 0; i < n; ++i) {
      const bp_op_support& s = list[i];
      SCOPED_TRACE(label(d, s.op, s.dtype));
      EXPECT_EQ(s.struct_size, sizeof(bp_op_support));
      EXPECT_TRUE(seen.insert({s.op, s.dtype}).second) << "listed twice";
      auto it = expected_matrix().find(s.op);
      ASSERT_NE(it, expected_matrix().end()) << "op not in the catalogue";
      bool want = it->second[static_cast<size_t>(s.dtype)] == '1' &&
                  (s.dtype != BP_DTYPE_F64 || p.supports_f64);
      EXPECT_EQ(s.support, want ? BP_SUPPORT_YES : BP_SUPPORT_NO);
      bp_kernel* k = nullptr;
      ErrorInfo e = take(api().find_kernel(d, s.op, s.dtype, &k));
      if (s.support == BP_SUPPORT_YES) {
        EXPECT_EQ(e.code, 0) << e.message;
        EXPECT_NE(k, nullptr);
        bp_kernel* again = nullptr;
        EXPECT_TRUE(ok(api().find_kernel(d, s.op, s.dtype, &again)));
        EXPECT_EQ(k, again) << "kernel handles are cached";
      } else {
        EXPECT_GT(std::strlen(s.reason), 0u) << "unsupported without a reason";
        EXPECT_EQ(e.code, BP_ERROR_UNSUPPORTED) << e.message;
        EXPECT_NE(e.message.find(s.reason), std::string::npos) << e.message;
      }
    }
    bp_kernel* k = nullptr;
    ErrorInfo e = take(api().find_kernel(d, "no_such_op", BP_DTYPE_F32, &k));
    EXPECT_EQ(e.code, BP_ERROR_UNSUPPORTED) << e.message;
  }
}

// ---- Streams ---------------------------------------------------------------------------------

TEST_F(OpenclPlugin, CachedBufferReusedAcrossStreams) {
  // A buffer freed on s1 while s1 still writes it, reused at once on s2: s2 must see it only
  // after s1's work (Note [Cross-stream reuse]).
  for (int32_t d = 0; d < devices(); ++d) {
    bp_stream *s1 = nullptr, *s2 = nullptr;
    ASSERT_TRUE(ok(api().stream_create(d, &s1)));
    ASSERT_TRUE(ok(api().stream_create(d, &s2)));
    ASSERT_TRUE(ok(api().memory_empty_cache(d)));
    const int64_t n = 1 << 18;
    bp_buffer* a = nullptr;
    ASSERT_TRUE(ok(api().mem_alloc(d, s1, n * 4, &a)));
    bp_tensor_desc t = make_desc(a, BP_DTYPE_F32, {n}, {1}, 0);
    bp_attr v = float_attr("value", 1.0);
    bp_kernel* fill = nullptr;
    ASSERT_TRUE(ok(api().find_kernel(d, "fill", BP_DTYPE_F32, &fill)));
    for (int i = 0; i < 8; ++i) ASSERT_TRUE(ok(api().launch(fill, s1, nullptr, 0, &t, 1, &v, 1)));
    ASSERT_TRUE(ok(api().mem_free(d, s1, a, n * 4)));
    bp_buffer* b = nullptr;
    ASSERT_TRUE(ok(api().mem_alloc(d, s2, n * 4, &b)));
    EXPECT_EQ(a, b) << "expected the cached buffer back";
    std::vector<float> ones(n, 7.0f), host(n);
    ASSERT_TRUE(ok(api().copy_h2d(s2, b, 0, ones.data(), n * 4)));
    ASSERT_TRUE(ok(api().copy_d2h(s2, host.data(), b, 0, n * 4)));
    ASSERT_TRUE(ok(api().stream_synchronize(s2)));
    ASSERT_TRUE(ok(api().stream_synchronize(s1)));
    ASSERT_TRUE(ok(api().copy_d2h(s2, host.data(), b, 0, n * 4)));
    ASSERT_TRUE(ok(api().stream_synchronize(s2)));
    EXPECT_EQ(std::count(host.begin(), host.end(), 7.0f), n) << "s1's fills ran after s2's write";
    ASSERT_TRUE(ok(api().mem_free(d, s2, b, n * 4)));
    ASSERT_TRUE(ok(api().stream_destroy(s1)));
    ASSERT_TRUE(ok(api().stream_destroy(s2)));
  }
}

// One kernel on eight streams at once, every launch wider than the ones before it: the pattern
// that made PoCL before 7.0 abort in pocl_release_dlhandle_cache (Note [PoCL dlhandle cache];
// BP_OPENCL_ORDER_KERNELS=0 turns the plugin's ordering off to see it). Values must be exact.
TEST_F(OpenclPlugin, OneKernelOnManyStreamsAtOnce) {
  for (int32_t d = 0; d < devices(); ++d) {
    bp_kernel* add = nullptr;
    ASSERT_TRUE(ok(api().find_kernel(d, "add", BP_DTYPE_F32, &add)));
    constexpr int kThreads = 8, kLaunches = 30;
    std::vector<std::string> failures(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        std::mt19937_64 g(bp_test::test_seed("opencl_plugin_test") + static_cast<uint64_t>(t));
        std::uniform_real_distribution<float> u(-4, 4);
        bp_stream* s = nullptr;
        if (bp_error* e = api().stream_create(d, &s)) {
          failures[t] = take(e).message;
          return;
        }
        for (int i = 0; i < kLaunches && failures[t].empty(); ++i) {
          const int64_t n = 1000 + (i * kThreads + t) * 613;
          std::vector<float> x(static_cast<size_t>(n)), y(x.size());
          for (float& v : x) v = u(g);
          bp_buffer *a = nullptr, *o = nullptr;
          bp_tensor_desc da{}, dout{};
          auto fail = [&](bp_error* e) {
            if (e && failures[t].empty())
              failures[t] = "launch " + std::to_string(i) + ": " + take(e).message;
            return e != nullptr;
          };
          if (fail(api().mem_alloc(d, s, n * 4, &a)) || fail(api().mem_alloc(d, s, n * 4, &o)))
            break;
          da = make_desc(a, BP_DTYPE_F32, {n}, {1}, 0);
          dout = make_desc(o, BP_DTYPE_F32, {n}, {1}, 0);
          const bp_tensor_desc ins[2] = {da, da};
          if (!fail(api().copy_h2d(s, a, 0, x.data(), n * 4)) &&
              !fail(api().launch(add, s, ins, 2, &dout, 1, nullptr, 0)) &&
              !fail(api().copy_d2h(s, y.data(), o, 0, n * 4)) &&
              !fail(api().stream_synchronize(s))) {
            for (int64_t k = 0; k < n; ++k)
              if (y[k] != x[k] + x[k]) {
                failures[t] = "launch " + std::to_string(i) + ": element " + std::to_string(k) +
                              " is " + std::to_string(y[k]);
                break;
              }
          }
          fail(api().mem_free(d, s, a, n * 4));
          fail(api().mem_free(d, s, o, n * 4));
        }
        if (bp_error* e = api().stream_destroy(s)) take(e);
      });
    for (auto& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
  }
}

TEST(OpenclPocl, VersionsWithTheDlhandleCacheBug) {
  using bp::opencl::pocl_dlhandle_cache_bug;
  EXPECT_TRUE(pocl_dlhandle_cache_bug(
      "OpenCL 3.0 PoCL 3.1+debian  Linux, None+Asserts, RELOC, SPIR, LLVM 15.0.6, SLEEF"));
  EXPECT_TRUE(pocl_dlhandle_cache_bug("OpenCL 3.0 PoCL 6.0  Linux, Release, RELOC, LLVM 18.1.8"));
  EXPECT_TRUE(pocl_dlhandle_cache_bug("OpenCL 1.2 pocl 1.8  Linux, None+Asserts, LLVM 11"));
  EXPECT_FALSE(pocl_dlhandle_cache_bug("OpenCL 3.0 PoCL 7.0  Linux, Release, RELOC, LLVM 19"));
  EXPECT_FALSE(pocl_dlhandle_cache_bug("OpenCL 3.0 PoCL 7.1-pre main-abc123  Linux"));
  EXPECT_FALSE(pocl_dlhandle_cache_bug("OpenCL 3.0 CUDA 13.0.48"));
  EXPECT_FALSE(pocl_dlhandle_cache_bug(""));
}

// ---- Errors ----------------------------------------------------------------------------------

TEST_F(OpenclPlugin, BadLaunchesAreErrors) {
  for (int32_t d = 0; d < devices(); ++d) {
    HostTensor a = random_tensor(BP_DTYPE_F32, {4, 5});
    HostTensor b = random_tensor(BP_DTYPE_F32, {4, 6});
    DeviceTensor da = upload(d, a), db = upload(d, b);
    DeviceTensor out = make_output(d, BP_DTYPE_F32, {4, 5});
    ErrorInfo e = take(launch(d, "add", BP_DTYPE_F32, {da.desc, db.desc}, {out.desc}));
    EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(e.message.find("[4, 6]"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find("add f32"), std::string::npos) << e.message;

    bp_tensor_desc past = da.desc;  // a view reaching past its buffer
    past.shape[0] = 5;
    bp_tensor_desc out_past = out.desc;
    out_past.shape[0] = 5;
    e = take(launch(d, "exp", BP_DTYPE_F32, {past}, {out_past}));
    EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT) << e.message;

    bp_tensor_desc odd = da.desc;  // misaligned offset
    odd.offset = 2;
    odd.shape[0] = 3;
    bp_tensor_desc out3 = out.desc;
    out3.shape[0] = 3;
    e = take(launch(d, "neg", BP_DTYPE_F32, {odd}, {out3}));
    EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT) << e.message;

    e = take(launch(d, "add", BP_DTYPE_F32, {da.desc}, {out.desc}));  // no scalar
    EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT) << e.message;

    e = take(launch(d, "sum", BP_DTYPE_F32, {da.desc}, {db.desc}));  // bad output shape
    EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT) << e.message;

    e = take(launch(d, "add", BP_DTYPE_BOOL, {da.desc, da.desc}, {out.desc}));
    EXPECT_EQ(e.code, BP_ERROR_UNSUPPORTED) << e.message;
    EXPECT_NE(e.message.find("bool"), std::string::npos) << e.message;
  }
}

// ---- Internals -------------------------------------------------------------------------------

TEST(OpenclProgram, BuildErrorCarriesTheBuildLog) {
  cl_platform_id platform = nullptr;
  cl_uint np = 0;
  if (clGetPlatformIDs(1, &platform, &np) != CL_SUCCESS || np == 0)
    GTEST_SKIP() << "no OpenCL platform";
  cl_device_id dev = nullptr;
  if (clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &dev, nullptr) != CL_SUCCESS)
    GTEST_SKIP() << "no OpenCL device";
  cl_int st = CL_SUCCESS;
  cl_context ctx = clCreateContext(nullptr, 1, &dev, nullptr, nullptr, &st);
  ASSERT_EQ(st, CL_SUCCESS);
  const std::string broken =
      "__kernel void bp_broken(__global float* out) { out[0] = undefined_identifier_xyz; }";
  try {
    cl_program p = bp::opencl::build_program(ctx, dev, broken, "", "'broken test program'");
    clReleaseProgram(p);
    ADD_FAILURE() << "a broken kernel compiled";
  } catch (const bp::sdk::Failure& f) {
    std::string m = f.what();
    EXPECT_EQ(f.code(), BP_ERROR_DEVICE);
    EXPECT_EQ(f.native_name(), "CL_BUILD_PROGRAM_FAILURE");
    EXPECT_NE(m.find("broken test program"), std::string::npos) << m;
    EXPECT_NE(m.find("build log"), std::string::npos) << m;
    EXPECT_NE(m.find("undefined_identifier_xyz"), std::string::npos) << m;
  }
  clReleaseContext(ctx);
}

// ---- Environments set up by CTest ------------------------------------------------------------

TEST(NoIcd, ReportsZeroDevicesWithTheReason) {
  if (!std::getenv("BP_OPENCL_TEST_EXPECT_NO_ICD"))
    GTEST_SKIP() << "run by CTest as opencl_plugin.NoIcd (OCL_ICD_VENDORS at an empty folder)";
  ASSERT_NE(plugin().api, nullptr) << "the plugin must load without a driver: " << plugin().error;
  EXPECT_EQ(plugin().devices, 0);
  const std::string& why = plugin().reason;
  std::printf("[opencl test] 0 devices: %s\n", why.c_str());
  EXPECT_NE(why.find("CL_PLATFORM_NOT_FOUND_KHR"), std::string::npos) << why;
  EXPECT_NE(why.find("-1001"), std::string::npos) << why;
  EXPECT_NE(why.find(std::getenv("OCL_ICD_VENDORS")), std::string::npos) << why;
  bp_device_properties p{};
  p.struct_size = sizeof p;
  ErrorInfo e = take(api().device_properties(0, &p));
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT) << e.message;
  bp_kernel* k = nullptr;
  e = take(api().find_kernel(0, "add", BP_DTYPE_F32, &k));
  EXPECT_NE(e.code, 0);
  bp_buffer* b = nullptr;
  e = take(api().mem_alloc(0, nullptr, 16, &b));
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT) << e.message;
}

TEST(NoFp64, F64IsDeclaredUnsupportedWithAReason) {
  if (!std::getenv("BP_OPENCL_DISABLE_FP64"))
    GTEST_SKIP() << "run by CTest as opencl_plugin.NoFp64 (BP_OPENCL_DISABLE_FP64=1)";
  ASSERT_NE(plugin().api, nullptr) << plugin().error;
  if (plugin().devices == 0) GTEST_SKIP() << "no OpenCL device: " << plugin().reason;
  for (int32_t d = 0; d < plugin().devices; ++d) {
    bp_device_properties p{};
    p.struct_size = sizeof p;
    ASSERT_TRUE(ok(api().device_properties(d, &p)));
    EXPECT_EQ(p.supports_f64, 0);
    const bp_op_support* list = nullptr;
    int32_t n = 0;
    ASSERT_TRUE(ok(api().list_ops(d, &list, &n)));
    for (int32_t i = 0; i < n; ++i) {
      if (list[i].dtype != BP_DTYPE_F64) continue;
      EXPECT_EQ(list[i].support, BP_SUPPORT_NO) << list[i].op;
      EXPECT_GT(std::strlen(list[i].reason), 0u) << list[i].op;
      bp_kernel* k = nullptr;
      ErrorInfo e = take(api().find_kernel(d, list[i].op, BP_DTYPE_F64, &k));
      EXPECT_EQ(e.code, BP_ERROR_UNSUPPORTED) << list[i].op;
    }
    // f32 still works; a cast to f64 is refused at launch.
    HostTensor a = random_tensor(BP_DTYPE_F32, {17});
    DeviceTensor da = upload(d, a);
    DeviceTensor out = make_output(d, BP_DTYPE_F32, {17});
    ASSERT_TRUE(ok(launch(d, "exp", BP_DTYPE_F32, {da.desc}, {out.desc})));
    std::vector<double> ref = a.values();
    for (double& v : ref) v = std::exp(v);
    expect_close(read_output(out), ref, BP_DTYPE_F32, "exp");
    DeviceTensor out64 = make_output(d, BP_DTYPE_F64, {17});
    ErrorInfo e = take(launch(d, "cast", BP_DTYPE_F32, {da.desc}, {out64.desc}));
    EXPECT_EQ(e.code, BP_ERROR_UNSUPPORTED) << e.message;
  }
}

// The conformance kit's shared cases with fp64 hidden (through bp_conformance_lib, in this
// process): the f32 transcendental and reduction cases pass, and every f64 case is reported
// unsupported with the device's reason, none run.
TEST(NoFp64, SharedCasesRunWithoutDoubles) {
  if (!std::getenv("BP_OPENCL_DISABLE_FP64"))
    GTEST_SKIP() << "run by CTest as opencl_plugin.NoFp64 (BP_OPENCL_DISABLE_FP64=1)";
  ASSERT_NE(plugin().api, nullptr) << plugin().error;
  if (plugin().devices == 0) GTEST_SKIP() << "no OpenCL device: " << plugin().reason;
  const std::string path = bp_test::beside_exe(BP_OPENCL_PLUGIN_REL, "BP_OPENCL_PLUGIN");
  bpc::expect_shared_cases_pass(
      path, "kernels", 0, {"kernels.exp_*,f32]", "kernels.tanh_*,f32]", "kernels.sum_*,f32]"}, 10);
  const bpc::SuiteRun f64 = bpc::run_suite_in_process(
      path, "kernels", 0, bp_test::test_seed("opencl_plugin_test"), {"*,f64]"});
  ASSERT_EQ(f64.error, "");
  EXPECT_GE(f64.count(bpc::Status::unsupported), 30);
  EXPECT_EQ(f64.count(bpc::Status::pass) + f64.count(bpc::Status::fail), 0) << f64.failures();
  for (const auto& [name, r] : f64.results) {
    if (r.status != bpc::Status::unsupported) continue;
    EXPECT_NE(r.message, "") << name;
  }
}
