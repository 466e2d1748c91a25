// The kernel handles of the CUDA backend (what bp_kernel* points to), derived from the family
// resolvers of cuda_kernels.hpp; cuda_plugin.cpp builds the op table (bp::sdk::OpTable) that
// answers find_kernel, find_kernel_id and list_ops from them.
//
// Internal to backends/cuda. All functions are thread-safe; the table is built once.
#ifndef BACKPLANE_CUDA_OPS_HPP_
#define BACKPLANE_CUDA_OPS_HPP_

#include "cuda_kernels.hpp"

#include <backplane/abi/plugin_abi.h>

namespace bp::cuda {

// What a bp_kernel* points to. Device-independent (the stream names the device); lives as
// long as the plugin.
struct CudaKernel {
  Op op;
  int32_t dtype;
  LaunchFn fn;  // never null for a handle returned by find_kernel
};

// The kernel of (catalogue op number, dtype), or nullptr when no family implements the pair
// (or a number is out of range).
const CudaKernel* kernel_for(int32_t op, int32_t dtype);

}  // namespace bp::cuda

#endif  // BACKPLANE_CUDA_OPS_HPP_
