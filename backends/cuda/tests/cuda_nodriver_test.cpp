// Loads libbackplane-cuda.so the way the host does (dlopen, RTLD_LOCAL, the one entry symbol)
// and checks the behaviour that CI can see without a GPU: the plugin loads, init succeeds and
// device_count is 0 with a reason naming the driver. On a machine with a GPU the same test
// checks the opposite: at least one device and an empty reason.
#include <backplane/abi/plugin_abi.h>
#include <backplane_test/plugin_test.hpp>

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

struct Loaded {
  void* handle = nullptr;
  const bp_plugin_api* api = nullptr;
};

// $BP_CUDA_PLUGIN when set, else the plugin built beside this test (found relative to the test
// binary, so a copied build tree works). Loaded by hand, not with bp_test::load_plugin: init is
// part of what this test checks.
std::string plugin_path() {
  return bp_test::beside_exe(BP_CUDA_PLUGIN_REL, "BP_CUDA_PLUGIN");
}

Loaded load_plugin() {
  Loaded l;
  l.handle = dlopen(plugin_path().c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!l.handle) {
    ADD_FAILURE() << "dlopen(" << plugin_path() << "): " << dlerror();
    return l;
  }
  auto get = reinterpret_cast<bp_plugin_get_api_fn>(dlsym(l.handle, BP_PLUGIN_ENTRY_SYMBOL));
  if (!get) {
    ADD_FAILURE() << "no symbol " << BP_PLUGIN_ENTRY_SYMBOL;
    return l;
  }
  l.api = get(BP_ABI_MAJOR, BP_ABI_MINOR);
  return l;
}

std::string take_message(const bp_plugin_api* api, bp_error* e) {
  if (!e) return "";
  std::string m = e->message ? e->message : "";
  api->error_free(e);
  return m;
}

TEST(NoDriver, LoadsInitsAndCountsDevices) {
  const Loaded l = load_plugin();
  ASSERT_NE(l.api, nullptr);
  const bp_plugin_api* api = l.api;
  EXPECT_EQ(api->abi_major, static_cast<uint32_t>(BP_ABI_MAJOR));
  EXPECT_GE(api->struct_size, sizeof(bp_plugin_api));
  EXPECT_STREQ(api->name, "cuda");
  EXPECT_STREQ(api->device_type, "cuda");
  ASSERT_NE(api->list_ops, nullptr);

  bp_error* e = api->init();
  ASSERT_EQ(e, nullptr) << take_message(api, e);

  const char* reason = nullptr;
  const int32_t n = api->device_count(&reason);
  ASSERT_NE(reason, nullptr);
  if (n == 0) {
    const std::string why = reason;
    EXPECT_FALSE(why.empty());
    EXPECT_NE(why.find("driver"), std::string::npos) << "reason: " << why;
    std::printf("cuda plugin: 0 devices: %s\n", reason);

    // Device slots fail cleanly with the reason instead of crashing.
    bp_device_properties props{};
    props.struct_size = sizeof props;
    e = api->device_properties(0, &props);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->code, BP_ERROR_UNAVAILABLE);
    EXPECT_NE(std::string(e->message).find("driver"), std::string::npos) << e->message;
    api->error_free(e);

    bp_stream* s = nullptr;
    e = api->stream_create(0, &s);
    ASSERT_NE(e, nullptr);
    api->error_free(e);

    bp_kernel* k = nullptr;
    e = api->find_kernel(0, "add", BP_DTYPE_F32, &k);
    ASSERT_NE(e, nullptr);
    api->error_free(e);
  } else {
    EXPECT_GT(n, 0);
    EXPECT_STREQ(reason, "");
  }

  // Note [cuBLAS at first use]: loading, init and device_count never map cuBLAS or cuBLASLt
  // (their static destructors would otherwise run at every exit of a CPU-only process).
  EXPECT_EQ(dlopen(BP_CUBLAS_SONAME, RTLD_NOW | RTLD_NOLOAD), nullptr) << BP_CUBLAS_SONAME;
  EXPECT_EQ(dlopen(BP_CUBLASLT_SONAME, RTLD_NOW | RTLD_NOLOAD), nullptr) << BP_CUBLASLT_SONAME;

  // Only the entry symbol is exported: the static CUDA runtime stays hidden.
  EXPECT_EQ(dlsym(l.handle, "cudaMalloc"), nullptr);
  EXPECT_EQ(dlsym(l.handle, "cudaGetDeviceCount"), nullptr);

  if (api->shutdown) api->shutdown();
}

}  // namespace
