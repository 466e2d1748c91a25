// Opening cuDNN at run time (Note [cuDNN at run time]) and the per-stream handles (Note [cuDNN
// per stream]).
#include "cuda_cudnn.hpp"

#include "cuda_common.hpp"
#include "cuda_device.hpp"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>

namespace bp::cuda {
namespace {

// The sub-libraries of cuDNN 9, in dependency order (graph first: the others need it).
constexpr const char* kSubLibraries[] = {"libcudnn_graph.so.9",
                                         "libcudnn_engines_precompiled.so.9",
                                         "libcudnn_engines_runtime_compiled.so.9",
                                         "libcudnn_heuristic.so.9",
                                         "libcudnn_ops.so.9",
                                         "libcudnn_cnn.so.9",
                                         "libcudnn_adv.so.9"};

std::string folder_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
}

// Opens the sub-libraries found in `folder` (missing ones are left to the shim, which reports
// them when an op needs one).
void preload_sub_libraries(const std::string& folder) {
  if (folder.empty()) return;
  for (const char* name : kSubLibraries) {
    const std::string p = folder + name;
    (void)dlopen(p.c_str(), RTLD_NOW | RTLD_GLOBAL);
    (void)dlerror();
  }
}

CudnnApi open_cudnn() {
  CudnnApi api;
  const char* env = std::getenv("BACKPLANE_CUDNN_LIBRARY");
  const bool from_env = env && *env;
  api.path = from_env ? env : "libcudnn.so.9";
  const char* hint = from_env ? "; BACKPLANE_CUDNN_LIBRARY must name libcudnn.so.9 of cuDNN 9"
                              : "; install cuDNN 9 (e.g. pip install nvidia-cudnn-cu13) or set "
                                "BACKPLANE_CUDNN_LIBRARY to the path of its libcudnn.so.9";
  // An explicit path: its folder's sub-libraries first, so the shim finds them by soname.
  if (from_env) preload_sub_libraries(folder_of(api.path));
  (void)dlerror();
  void* h = dlopen(api.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    api.reason = "cuDNN not found: " + api.path + " could not be opened (" +
                 (e ? e : "unknown error") + ")" + hint;
    return api;
  }
  api.handle = h;
  std::string missing;
  auto sym = [&](const char* name, auto& fn) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
    if (!fn) missing += (missing.empty() ? "" : ", ") + std::string(name);
  };
#define BP_CUDNN_SYM(name) sym(#name, api.name);
  BP_CUDNN_FUNCTIONS(BP_CUDNN_SYM)
#undef BP_CUDNN_SYM
  Dl_info info{};
  if (api.cudnnGetVersion && dladdr(reinterpret_cast<void*>(api.cudnnGetVersion), &info) &&
      info.dli_fname)
    api.path = info.dli_fname;
  if (!from_env) preload_sub_libraries(folder_of(api.path));
  const size_t v = api.cudnnGetVersion ? api.cudnnGetVersion() : 0;
  const std::string ver = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
                          std::to_string(v % 100);
  if (!missing.empty()) {
    api.reason = "cuDNN " + ver + " at " + api.path + " lacks " + missing + hint;
    return api;  // not closed (Note [cuDNN at run time])
  }
  if (v < 90000) {
    api.reason = api.path + " is cuDNN " + ver + "; the plugin needs cuDNN 9" + hint;
    return api;
  }
  api.describe = "cuDNN " + ver + " from " + api.path;
  api.loaded = true;
  return api;
}

}  // namespace

namespace {
std::atomic<bool> g_cudnn_loaded{false};
}  // namespace

const CudnnApi& cudnn_api() {
  static const CudnnApi* api = [] {
    auto* a = new CudnnApi(open_cudnn());  // lives as long as the process
    g_cudnn_loaded.store(a->loaded, std::memory_order_release);
    return a;
  }();
  return *api;
}

bool cudnn_loaded() {
  return g_cudnn_loaded.load(std::memory_order_acquire);
}

const CudnnApi& cudnn() {
  const CudnnApi& api = cudnn_api();
  if (!api.loaded) [[unlikely]]
    bp::sdk::fail(BP_ERROR_UNAVAILABLE, api.reason);
  return api;
}

void throw_cudnn_error(cudnnStatus_t status, const char* expr, const char* file, int line) {
  const CudnnApi& api = cudnn_api();
  const char* name = api.cudnnGetErrorString ? api.cudnnGetErrorString(status) : "cuDNN error";
  forget_current_device();
  const int category = static_cast<int>(status) / 1000;  // cuDNN 9: 1xxx init, 2xxx bad param
  bp_error_code code = BP_ERROR_DEVICE;
  if (status == CUDNN_STATUS_ALLOC_FAILED) {
    code = BP_ERROR_OUT_OF_MEMORY;
  } else if (category == 3 || status == CUDNN_STATUS_NOT_SUPPORTED) {
    code = BP_ERROR_UNSUPPORTED;
  } else if (category == 2 || status == CUDNN_STATUS_BAD_PARAM) {
    code = BP_ERROR_INVALID_ARGUMENT;
  }
  bp::sdk::fail(code,
                bp::sdk::format("%s failed: %s (status %d) at %s:%d", expr, name,
                                static_cast<int>(status), file, line),
                name);
}

cudnnHandle_t cudnn_handle(CudaStream& s) {
  if (!s.cudnn) {
    const CudnnApi& api = cudnn();
    use_device(s.index);
    cudnnHandle_t h = nullptr;
    BP_CUDNN_CHECK(api.cudnnCreate(&h));
    const cudnnStatus_t st = api.cudnnSetStream(h, s.stream);
    if (st != CUDNN_STATUS_SUCCESS) {
      (void)api.cudnnDestroy(h);
      BP_CUDNN_CHECK(st);
    }
    s.cudnn = h;
  }
  return static_cast<cudnnHandle_t>(s.cudnn);
}

void destroy_cudnn_handle(CudaStream& s) noexcept {
  if (!s.cudnn) return;
  const CudnnApi& api = cudnn_api();
  if (api.cudnnDestroy) (void)api.cudnnDestroy(static_cast<cudnnHandle_t>(s.cudnn));
  s.cudnn = nullptr;
}

}  // namespace bp::cuda
