// cuBLAS and cuBLASLt, opened at their first use (Note [cuBLAS at first use]).
//
// Internal to backends/cuda.
#ifndef BACKPLANE_CUDA_BLAS_HPP_
#define BACKPLANE_CUDA_BLAS_HPP_

#include <cublasLt.h>
#include <cublas_v2.h>

namespace bp::cuda {

// Note [cuBLAS at first use]
//   The plugin does not link cuBLAS or cuBLASLt: libcublasLt alone is over 500 MB with static
//   constructors and destructors of its own, and a process that loads the plugin on a machine
//   without a driver (every CPU-only run of the library) would map it, run its constructors and,
//   at exit, its destructors while other plugins' threads may still run. blas() opens both
//   libraries by soname (then from the toolkit's library folder the plugin was built against)
//   at the first matmul or linear, which only a device that exists can reach, and keeps them
//   open for the life of the process: a cuBLAS handle may be used until exit.
struct Blas {
  decltype(&::cublasCreate_v2) create;
  decltype(&::cublasDestroy_v2) destroy;
  decltype(&::cublasSetStream_v2) set_stream;
  decltype(&::cublasSetWorkspace_v2) set_workspace;
  // The C entry point (cuBLAS adds a C++ overload taking a cudaDataType compute type).
  cublasStatus_t (*gemm_strided_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                         int, int, const void*, const void*, cudaDataType, int,
                                         long long, const void*, cudaDataType, int, long long,
                                         const void*, void*, cudaDataType, int, long long, int,
                                         cublasComputeType_t, cublasGemmAlgo_t);
  decltype(&::cublasGemmStridedBatchedEx_64) gemm_strided_batched_64;
  decltype(&::cublasGetStatusName) status_name;
  decltype(&::cublasGetStatusString) status_string;
  decltype(&::cublasLtMatmul) lt_matmul;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) lt_heuristic;
  decltype(&::cublasLtMatmulDescCreate) lt_desc_create;
  decltype(&::cublasLtMatmulDescDestroy) lt_desc_destroy;
  decltype(&::cublasLtMatmulDescSetAttribute) lt_desc_set;
  decltype(&::cublasLtMatmulPreferenceCreate) lt_pref_create;
  decltype(&::cublasLtMatmulPreferenceDestroy) lt_pref_destroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) lt_pref_set;
  decltype(&::cublasLtMatrixLayoutCreate) lt_layout_create;
  decltype(&::cublasLtMatrixLayoutDestroy) lt_layout_destroy;
};

struct LaunchArgs;

// Sets the launch's stream and that stream's workspace on its device's cuBLAS handle (Note
// [cuBLAS per stream] in cuda_matmul.cpp) and returns the handle; the caller holds
// a.device->cublas_mutex() until its last call with the handle.
cublasHandle_t bind_cublas_stream(const LaunchArgs& a);

// The entry points, opened on the first call (thread-safe). Throws bp::sdk::Failure
// (BP_ERROR_UNAVAILABLE) naming the library and the loader's reason when one cannot be opened
// or lacks a symbol; a later call tries again.
const Blas& blas();

// True once blas() has opened the libraries (for tests: a process without a device never does).
bool blas_loaded() noexcept;

}  // namespace bp::cuda

#endif  // BACKPLANE_CUDA_BLAS_HPP_
