// The op table of the CUDA backend: kernel handles (what bp_kernel* points to), find_kernel
// and the list_ops declaration, both derived from the family resolvers of cuda_kernels.hpp.
//
// Internal to backends/cuda. All functions are thread-safe; the table is built once.
#ifndef BACKPLANE_CUDA_OPS_HPP_
#define BACKPLANE_CUDA_OPS_HPP_

#include "cuda_kernels.hpp"

#include <backplane/plugin_abi.h>

namespace bp::cuda {

// What a bp_kernel* points to. Device-independent (the stream names the device); lives as
// long as the plugin.
struct CudaKernel {
  Op op;
  int32_t dtype;
  LaunchFn fn;  // never null for a handle returned by find_kernel
};

// The handle of (catalogue op number, dtype); throws BP_ERROR_UNSUPPORTED naming the op, the
// dtype and the reason when the pair is not implemented or a number is unknown.
const CudaKernel* find_kernel(int32_t op, int32_t dtype);

// Every (op, dtype) pair of the catalogue with its support status and reason.
void list_ops(const bp_op_support** out_list, int32_t* out_count);

}  // namespace bp::cuda

#endif  // BACKPLANE_CUDA_OPS_HPP_
