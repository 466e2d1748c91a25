// What the cuDNN-backed families (cuda_conv.cpp, cuda_batchnorm.cpp) share: dtype mapping and
// an owning 4-d tensor descriptor.
//
// Internal to backends/cuda.
#ifndef BACKPLANE_CUDA_DNN_HPP_
#define BACKPLANE_CUDA_DNN_HPP_

#include "cuda_cudnn.hpp"

#include <cstdint>

namespace bp::cuda {

// cuDNN's type of a floating dtype; BP_ERROR_INVALID_ARGUMENT for any other.
cudnnDataType_t cudnn_dtype(int32_t dtype);

// v as int, or BP_ERROR_UNSUPPORTED naming `what` when cuDNN's 32-bit sizes cannot hold it.
int to_int(int64_t v, const char* what);

// A dense NCHW tensor descriptor, destroyed with the object. Requires cuDNN (cudnn()).
struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc(cudnnDataType_t type, int64_t n, int64_t c, int64_t h, int64_t w);
  TensorDesc() = default;
  ~TensorDesc();
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
};

}  // namespace bp::cuda

#endif  // BACKPLANE_CUDA_DNN_HPP_
