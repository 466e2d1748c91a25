// The kernel families of the CUDA backend and what a launch hands them.
//
// Each op family (elementwise binary/compare/unary/cast, reduction, matmul, random, convolution,
// batch norm, pooling, axis ops, indexing, the transformer family) exposes a
// resolver that maps (op, dtype) to a LaunchFn, or nullptr when the pair is not supported. The
// op table (cuda_ops.cpp) calls every resolver once per pair at init, so find_kernel and
// list_ops agree by construction, and a launch is one indirect call with no lookups.
//
// Note [Launch path]
//   launch -> CudaKernel::fn(args): the LaunchFn is already specialised for (op, dtype). It
//   validates the descriptors (counts, dtypes, shapes), builds a coalesced iteration plan on
//   the stack, picks the contiguous or strided kernel and queues it. No heap allocation, no
//   string compares (attributes are read by id), no device switch when the thread's device is
//   already current (Note [Current-device cache]), no synchronisation.
//
// Internal to backends/cuda. LaunchFns are stateless and may run concurrently on different
// streams.
#ifndef BACKPLANE_CUDA_KERNELS_HPP_
#define BACKPLANE_CUDA_KERNELS_HPP_

#include <backplane/abi/op_catalogue.h>
#include <backplane/abi/plugin_abi.h>
#include <backplane/sdk/ops.hpp>
#include <backplane/sdk/plugin_sdk.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>

namespace bp::cuda {

class Device;
struct CudaStream;

// The op catalogue (Note [Op catalogue]), generated once for every backend.
using sdk::Op;
using sdk::op_name;

// Everything a LaunchFn needs; lives on the stack of the launch slot.
struct LaunchArgs {
  cudaStream_t stream;
  CudaStream* s;  // for scratch memory and the cuBLAS workspace
  Device* device;
  int sm_count;
  Op op;
  int32_t dtype;  // the dtype the kernel was resolved for
  const bp_tensor_desc* in;
  int32_t nin;
  const bp_tensor_desc* out;
  int32_t nout;
  const bp::sdk::Attrs* attrs;
  uint64_t op_id = 0;  // the host's op id (Note [Asynchronous errors]); 0: not known
};

using LaunchFn = void (*)(const LaunchArgs&);

// Resolvers, one per family; nullptr = unsupported.
LaunchFn binary_fn(Op op, int32_t dtype);     // add sub mul div pow maximum minimum
LaunchFn compare_fn(Op op, int32_t dtype);    // eq ne lt le gt ge where
LaunchFn unary_fn(Op op, int32_t dtype);      // neg exp log sqrt relu sigmoid tanh abs
LaunchFn layout_fn(Op op, int32_t dtype);     // fill copy cast
LaunchFn reduction_fn(Op op, int32_t dtype);  // sum mean max sumsq norm
LaunchFn matmul_fn(Op op, int32_t dtype);     // matmul linear
LaunchFn random_fn(Op op, int32_t dtype);     // uniform normal
LaunchFn conv_fn(Op op, int32_t dtype);       // conv2d and its backward ops (cuDNN)
LaunchFn batchnorm_fn(Op op, int32_t dtype);  // batch_norm(_backward) (cuDNN)
LaunchFn pooling_fn(Op op, int32_t dtype);    // max/avg/adaptive-avg pooling and backward
LaunchFn axis_fn(Op op, int32_t dtype);       // softmax family, max_dim min_dim
LaunchFn index_fn(Op op, int32_t dtype);      // gather scatter_add dropout
// layer_norm(_backward) embedding(_backward) triu tril cumsum (cuda_transformer.cu)
LaunchFn transformer_fn(Op op, int32_t dtype);
// gelu silu and their backward, sin cos rsqrt (cuda_activation.cu)
LaunchFn activation_fn(Op op, int32_t dtype);
// scaled_dot_product_attention(_backward) (cuda_attention.cu)
LaunchFn attention_fn(Op op, int32_t dtype);
// adamw, the fused optimiser update of minor 7 (cuda_optim.cu)
LaunchFn optim_fn(Op op, int32_t dtype);
// cross_entropy(_backward), the fused classification loss of minor 8 (cuda_loss.cu)
LaunchFn loss_fn(Op op, int32_t dtype);

// Puts into s's fault record (BP_ERROR_INVALID_ARGUMENT) and clears the first out-of-range
// index that a gather, scatter_add, embedding or cross_entropy queued on `s` met, waiting for the
// stream when one may have, and gives the events watching those launches their verdict (Note
// [Deferred index errors], Note [Events and deferred index errors] in cuda_index.cu). Cheap when
// none was queued: one atomic load.
void check_index_errors(CudaStream& s);

// Fills every element of `out` (any strides) with `value` converted to out.dtype per the
// cast rules; used by reductions of empty ranges (mean -> NaN).
void fill_tensor(const LaunchArgs& a, const bp_tensor_desc& out, double value);

// linear's bias and ReLU on a finished product, in place: out[i, j] = act(out[i, j] + bias[j])
// (out [M,N] any strides; bias [N] or nullptr). cuda_linear.cu.
void linear_epilogue(const LaunchArgs& a, const bp_tensor_desc& out, const bp_tensor_desc* bias,
                     bool relu);

// ---- Validation helpers shared by the families (cuda_ops.cpp) ----

// Throws BP_ERROR_INVALID_ARGUMENT with `what` (the op and dtype are added by launch).
[[noreturn]] void invalid(const std::string& what);

// Checks num_inputs/num_outputs.
void check_arity(const LaunchArgs& a, int32_t nin, int32_t nout);
// Checks struct_size, rank, non-negative sizes/strides, dtype and (when numel > 0) buffer.
void check_desc(const bp_tensor_desc& t, int32_t dtype, const char* role);
// Checks that t has exactly the shape of `ref`.
void check_same_shape(const bp_tensor_desc& t, const bp_tensor_desc& ref, const char* role);

// Number of elements.
inline int64_t numel(const bp_tensor_desc& t) {
  int64_t n = 1;
  for (int32_t d = 0; d < t.rank; ++d) n *= t.shape[d];
  return n;
}

// Typed address of a descriptor's first element (the handle is the device pointer, or an
// imported record: Note [Tagged buffer handles] in plugin_sdk.hpp).
template <class T>
inline T* data_ptr(const bp_tensor_desc& t) {
  return reinterpret_cast<T*>(bp::sdk::buffer_address(t.buffer) + t.offset);
}

}  // namespace bp::cuda

#endif  // BACKPLANE_CUDA_KERNELS_HPP_
