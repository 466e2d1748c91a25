// Note [cuBLAS at first use] (cuda_blas.hpp).
#include "cuda_blas.hpp"

#include <backplane/sdk/plugin_sdk.hpp>

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>

namespace bp::cuda {

namespace {

std::mutex g_mutex;
std::atomic<const Blas*> g_blas{nullptr};

// Opens `soname` (the loader's search path, then the toolkit folder the plugin was built with).
void* open(const char* soname, const char* fallback_dir) {
  if (void* h = dlopen(soname, RTLD_NOW | RTLD_LOCAL)) return h;
  const char* e = dlerror();
  const std::string first = e ? e : "";
  const std::string path = std::string(fallback_dir) + "/" + soname;
  if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  const char* second = dlerror();
  bp::sdk::fail(BP_ERROR_UNAVAILABLE,
                bp::sdk::format("cuda: matmul and linear need %s, which could not be opened "
                                "(%s; also tried %s: %s); add the CUDA toolkit's library folder "
                                "to LD_LIBRARY_PATH",
                                soname, first.c_str(), path.c_str(), second ? second : "?"));
}

template <class F>
void bind(void* lib, const char* soname, const char* name, F& out) {
  void* sym = dlsym(lib, name);
  if (!sym)
    bp::sdk::fail(BP_ERROR_UNAVAILABLE,
                  bp::sdk::format("cuda: %s has no symbol %s (the plugin was built against CUDA "
                                  "%s; install a matching cuBLAS)",
                                  soname, name, BP_CUDA_TOOLKIT_VERSION));
  out = reinterpret_cast<F>(sym);
}

}  // namespace

const Blas& blas() {
  if (const Blas* b = g_blas.load(std::memory_order_acquire)) [[likely]]
    return *b;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (const Blas* b = g_blas.load(std::memory_order_acquire)) return *b;
  // Never closed (Note [cuBLAS at first use]); a failure leaves nothing opened that the next
  // attempt would not reuse (dlopen counts references).
  void* lt = open(BP_CUBLASLT_SONAME, BP_CUDA_LIBRARY_DIR);
  void* cb = open(BP_CUBLAS_SONAME, BP_CUDA_LIBRARY_DIR);
  static Blas b{};
  bind(cb, BP_CUBLAS_SONAME, "cublasCreate_v2", b.create);
  bind(cb, BP_CUBLAS_SONAME, "cublasDestroy_v2", b.destroy);
  bind(cb, BP_CUBLAS_SONAME, "cublasSetStream_v2", b.set_stream);
  bind(cb, BP_CUBLAS_SONAME, "cublasSetWorkspace_v2", b.set_workspace);
  bind(cb, BP_CUBLAS_SONAME, "cublasGemmStridedBatchedEx", b.gemm_strided_batched);
  bind(cb, BP_CUBLAS_SONAME, "cublasGemmStridedBatchedEx_64", b.gemm_strided_batched_64);
  bind(cb, BP_CUBLAS_SONAME, "cublasGetStatusName", b.status_name);
  bind(cb, BP_CUBLAS_SONAME, "cublasGetStatusString", b.status_string);
  bind(lt, BP_CUBLASLT_SONAME, "cublasLtMatmul", b.lt_matmul);
  bind(lt, BP_CUBLASLT_SONAME, "cublasLtMatmulAlgoGetHeuristic", b.lt_heuristic);
  bind(lt, BP_CUBLASLT_SONAME, "cublasLtMatmulDescCreate", b.lt_desc_create);
  bind(lt, BP_CUBLASLT_SONAME, "cublasLtMatmulDescDestroy", b.lt_desc_destroy);
  bind(lt, BP_CUBLASLT_SONAME, "cublasLtMatmulDescSetAttribute", b.lt_desc_set);
  bind(lt, BP_CUBLASLT_SONAME, "cublasLtMatmulPreferenceCreate", b.lt_pref_create);
  bind(lt, BP_CUBLASLT_SONAME, "cublasLtMatmulPreferenceDestroy", b.lt_pref_destroy);
  bind(lt, BP_CUBLASLT_SONAME, "cublasLtMatmulPreferenceSetAttribute", b.lt_pref_set);
  bind(lt, BP_CUBLASLT_SONAME, "cublasLtMatrixLayoutCreate", b.lt_layout_create);
  bind(lt, BP_CUBLASLT_SONAME, "cublasLtMatrixLayoutDestroy", b.lt_layout_destroy);
  g_blas.store(&b, std::memory_order_release);
  return b;
}

bool blas_loaded() noexcept {
  return g_blas.load(std::memory_order_acquire) != nullptr;
}

}  // namespace bp::cuda
