// cuDNN, opened at run time (Note [cuDNN at run time]): the entry points the backend calls,
// the per-stream handle, and the checking macro.
//
// Note [cuDNN at run time]
//   The plugin does not link cuDNN: a machine without it still gets every other op. The first
//   launch of an op that needs it (convolution, batch normalisation) opens libcudnn.so.9, or
//   the file BACKPLANE_CUDNN_LIBRARY names (a pip nvidia-cudnn-cu13 install, for example),
//   once per process. cuDNN 9 splits into a shim (libcudnn.so.9) that opens its sub-libraries
//   (libcudnn_graph, libcudnn_ops, libcudnn_cnn, libcudnn_engines_*, libcudnn_heuristic) by
//   soname; the loader opens those from the shim's own folder first, so a copy outside the
//   linker's search path works without LD_LIBRARY_PATH. A missing library, a missing entry
//   point or a cuDNN older than 9 makes every such launch fail with BP_ERROR_UNAVAILABLE and
//   the reason ("cuDNN not found: ...; install cuDNN 9 or set BACKPLANE_CUDNN_LIBRARY"); the
//   library is never closed (closing a CUDA library is never safe).
//
// Note [cuDNN per stream]
//   cuDNN handles are not safe for concurrent use. Each CudaStream owns one handle, created on
//   its first cuDNN launch with the stream bound once (cudnnSetStream), and used under the
//   stream's cudnn_mutex (launches on one stream from several threads serialise there, as
//   their work does on the stream). The handle is destroyed with the stream.
//
// Internal to backends/cuda.
#ifndef BACKPLANE_CUDA_CUDNN_HPP_
#define BACKPLANE_CUDA_CUDNN_HPP_

#include <cudnn.h>

#include <string>

namespace bp::cuda {

struct CudaStream;

// The cuDNN entry points the backend uses (resolved with dlsym).
struct CudnnApi {
#define BP_CUDNN_FN(name) decltype(&::name) name = nullptr;
#define BP_CUDNN_FUNCTIONS(X)                       \
  X(cudnnGetVersion)                                \
  X(cudnnBackendCreateDescriptor)                   \
  X(cudnnBackendDestroyDescriptor)                  \
  X(cudnnBackendFinalize)                           \
  X(cudnnBackendSetAttribute)                       \
  X(cudnnBackendGetAttribute)                       \
  X(cudnnBackendExecute)                            \
  X(cudnnGetErrorString)                            \
  X(cudnnCreate)                                    \
  X(cudnnDestroy)                                   \
  X(cudnnSetStream)                                 \
  X(cudnnCreateTensorDescriptor)                    \
  X(cudnnSetTensor4dDescriptor)                     \
  X(cudnnDestroyTensorDescriptor)                   \
  X(cudnnCreateFilterDescriptor)                    \
  X(cudnnSetFilter4dDescriptor)                     \
  X(cudnnDestroyFilterDescriptor)                   \
  X(cudnnCreateConvolutionDescriptor)               \
  X(cudnnSetConvolution2dDescriptor)                \
  X(cudnnSetConvolutionGroupCount)                  \
  X(cudnnSetConvolutionMathType)                    \
  X(cudnnDestroyConvolutionDescriptor)              \
  X(cudnnGetConvolutionForwardAlgorithm_v7)         \
  X(cudnnGetConvolutionForwardWorkspaceSize)        \
  X(cudnnConvolutionForward)                        \
  X(cudnnFindConvolutionForwardAlgorithmEx)         \
  X(cudnnFindConvolutionBackwardDataAlgorithmEx)    \
  X(cudnnFindConvolutionBackwardFilterAlgorithmEx)  \
  X(cudnnGetConvolutionBackwardDataAlgorithm_v7)    \
  X(cudnnGetConvolutionBackwardDataWorkspaceSize)   \
  X(cudnnConvolutionBackwardData)                   \
  X(cudnnGetConvolutionBackwardFilterAlgorithm_v7)  \
  X(cudnnGetConvolutionBackwardFilterWorkspaceSize) \
  X(cudnnConvolutionBackwardFilter)                 \
  X(cudnnAddTensor)                                 \
  X(cudnnDeriveBNTensorDescriptor)                  \
  X(cudnnBatchNormalizationForwardTraining)         \
  X(cudnnBatchNormalizationForwardInference)        \
  X(cudnnBatchNormalizationBackward)
  BP_CUDNN_FUNCTIONS(BP_CUDNN_FN)
#undef BP_CUDNN_FN

  bool loaded = false;
  void* handle = nullptr;  // the shim's dlopen handle (cudnn_frontend resolves through it)
  std::string path;        // the shim actually opened
  std::string describe;    // "cuDNN 9.19.0 from /path/libcudnn.so.9" once loaded
  std::string reason;      // why not, when !loaded
};

// The process's cuDNN, opened on the first call (thread-safe); check `loaded`.
const CudnnApi& cudnn_api();

// Whether cuDNN has been opened successfully (does not open it).
bool cudnn_loaded();

// The loaded API, or BP_ERROR_UNAVAILABLE with the reason (Note [cuDNN at run time]).
const CudnnApi& cudnn();

// Throws bp::sdk::Failure for a failed cuDNN call (native_name "CUDNN_STATUS_...").
[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* expr, const char* file,
                                    int line);

// The checking macro for cuDNN calls.
#define BP_CUDNN_CHECK(expr)                                                  \
  do {                                                                        \
    const cudnnStatus_t bp_cudnn_st_ = (expr);                                \
    if (bp_cudnn_st_ != CUDNN_STATUS_SUCCESS) [[unlikely]]                    \
      ::bp::cuda::throw_cudnn_error(bp_cudnn_st_, #expr, __FILE__, __LINE__); \
  } while (0)

// The stream's handle (Note [cuDNN per stream]), created on first use; the caller holds
// s.cudnn_mutex.
cudnnHandle_t cudnn_handle(CudaStream& s);

// Destroys the stream's handle, if any (stream destruction).
void destroy_cudnn_handle(CudaStream& s) noexcept;

}  // namespace bp::cuda

#endif  // BACKPLANE_CUDA_CUDNN_HPP_
