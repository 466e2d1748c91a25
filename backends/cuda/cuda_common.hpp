// Shared host-side helpers of the CUDA backend: the checking macros that turn CUDA and cuBLAS
// status codes into bp::sdk::Failure, and the per-thread current-device cache.
//
// Internal to backends/cuda. Everything here is safe to call from any thread.
#ifndef BACKPLANE_CUDA_COMMON_HPP_
#define BACKPLANE_CUDA_COMMON_HPP_

#include <backplane/sdk/plugin_sdk.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace bp::cuda {

// Throws bp::sdk::Failure for a failed CUDA runtime call. The message names the current
// device, the expression and the source location; native_name is cudaGetErrorName(err). The
// thread's last-error state is cleared (for errors that are not sticky). The code is
// BP_ERROR_OUT_OF_MEMORY for cudaErrorMemoryAllocation, BP_ERROR_UNAVAILABLE for a missing
// driver or device, BP_ERROR_INVALID_ARGUMENT for invalid values, else BP_ERROR_DEVICE.
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);

// Throws bp::sdk::Failure for a failed cuBLAS call (native_name is cublasGetStatusName).
// `status` is a cublasStatus_t passed as int so this header does not need cuBLAS.
[[noreturn]] void throw_cublas_error(int status, const char* expr, const char* file, int line);

// The one checking macro for CUDA runtime calls (docs/design.md, "Errors": one macro per vendor
// API).
#define BP_CUDA_CHECK(expr)                                                  \
  do {                                                                       \
    const cudaError_t bp_cuda_err_ = (expr);                                 \
    if (bp_cuda_err_ != cudaSuccess) [[unlikely]]                            \
      ::bp::cuda::throw_cuda_error(bp_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// The checking macro for cuBLAS calls.
#define BP_CUBLAS_CHECK(expr)                                                       \
  do {                                                                              \
    const int bp_cublas_status_ = static_cast<int>(expr);                           \
    if (bp_cublas_status_ != 0) [[unlikely]]                                        \
      ::bp::cuda::throw_cublas_error(bp_cublas_status_, #expr, __FILE__, __LINE__); \
  } while (0)

// Note [Current-device cache]
//   Every CUDA call that acts on "the current device" is preceded by use_device(d). The CUDA
//   runtime keeps the current device per thread; we mirror it in a thread_local so the hot
//   path (launch, mem_alloc) skips cudaSetDevice when the thread already uses `d`. The cache
//   is only written by use_device, so it can go stale if code outside this plugin calls
//   cudaSetDevice/cuCtxSetCurrent on the same thread (another CUDA runtime in the process);
//   a stale cache shows up as a CUDA error (invalid resource handle) on the next launch, never
//   as silent misbehaviour. forget_current_device() drops the cache after such an error.
namespace detail {
inline thread_local int tl_current_device = -1;
}  // namespace detail

// Makes `device` current on the calling thread (cheap when it already is).
inline void use_device(int device) {
  if (detail::tl_current_device != device) [[unlikely]] {
    BP_CUDA_CHECK(cudaSetDevice(device));
    detail::tl_current_device = device;
  }
}

// Forgets the cached current device of the calling thread (Note [Current-device cache]).
inline void forget_current_device() {
  detail::tl_current_device = -1;
}

// "[2, 3, 4]" for error messages.
std::string shape_string(const int64_t* shape, int32_t rank);

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace bp::cuda

#endif  // BACKPLANE_CUDA_COMMON_HPP_
