// What the cuDNN-backed families (cuda_conv.cpp, cuda_batchnorm.cpp) share: dtype mapping and
// an owning 4-d tensor descriptor.
//
// Internal to backends/cuda.
#ifndef BACKPLANE_CUDA_DNN_HPP_
#define BACKPLANE_CUDA_DNN_HPP_

#include "cuda_cudnn.hpp"
#include "cuda_device.hpp"
#include "cuda_kernels.hpp"

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

// Scratch memory of one call, freed in stream order when the launch ends.
class Workspace {
 public:
  Workspace(const LaunchArgs& a, size_t bytes) : a_(a), bytes_(bytes) {
    if (bytes_) p_ = a_.device->allocate_scratch(*a_.s, bytes_);
  }
  ~Workspace() {
    if (p_) {
      try {
        a_.device->free_scratch(*a_.s, p_, bytes_);
      } catch (...) {  // a failed stream-ordered free leaves the block to the pool
      }
    }
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* get() const { return p_; }
  size_t size() const { return bytes_; }

 private:
  const LaunchArgs& a_;
  size_t bytes_;
  void* p_ = nullptr;
};

}  // namespace bp::cuda

#endif  // BACKPLANE_CUDA_DNN_HPP_
