// Kernels of the OpenCL backend: the op table (which (op, dtype) pairs exist and why the others
// do not), the kernel handle bp_kernel, the OpenCL C source generators per op family, and the
// launch code per family (opencl_kernels_{elementwise,reduction,matmul,random,conv,pool,norm,
// index,softmax,transformer,attention}.cpp) with the helpers they share
// (opencl_kernels_common.cpp).
#pragma once

#include "opencl_common.hpp"
#include "opencl_device.hpp"
#include "opencl_program.hpp"

#include <backplane/abi/op_catalogue.h>
#include <backplane/sdk/ops.hpp>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace bp::opencl {

// The op catalogue (Note [Op catalogue]), generated once for every backend.
using sdk::Op;
inline constexpr int32_t kOpCount = sdk::kNumOps;

// Static facts of an op: its catalogue name, family and the dtypes it is implemented for (bit
// d set for bp_dtype d): its dtype domain (op_catalogue.h), all of which this backend has but f64
// on devices without doubles.
struct OpInfo {
  const char* name;
  Family family;
  uint32_t dtypes;
};
const OpInfo& op_info(Op op);
// Reason given for every f64 op on a device without doubles (Note [fp64] in opencl_device.cpp).
extern const char* const kNoFp64Reason;

// True when the op's result is BOOL (comparisons).
inline bool is_comparison(Op op) {
  return op >= Op::kEq && op <= Op::kGe;
}
inline bool is_binary(Op op) {
  return op >= Op::kAdd && op <= Op::kGe;
}
inline bool is_unary(Op op) {
  return (op >= Op::kNeg && op <= Op::kAbs) || op == Op::kSin || op == Op::kCos || op == Op::kRsqrt;
}

// The whole source of program (dtype, family) for a device with `info`.
std::string program_source(int32_t dtype, Family family, const DeviceInfo& info);

// Common OpenCL C: pragmas, f16/bf16 conversions (half.h transcribed), the strided index
// struct bp_ix and its offset function, and the per-dtype macros T (storage), C (compute type),
// LD (storage -> C) and ST (C -> storage).
std::string kernel_prelude(int32_t dtype, bool fp64);
// OpenCL C of BP_MAX (NaN wins) and bp_group_reduce(ACC v, int is_max, __local ACC* scratch), the
// work-group tree sum or maximum (every work-item gets it); ACC must be defined before it.
std::string group_reduce_source();
// OpenCL C type storing a dtype ("float", "ushort" for f16/bf16, "uchar" for u8/bool).
const char* cl_storage_type(int32_t dtype);

// Family source generators: the kernels of one dtype.
std::string elementwise_source(int32_t dtype, bool fp64);
std::string reduction_source(int32_t dtype, bool fp64);
std::string matmul_source(int32_t dtype, const DeviceInfo& info);
std::string random_source(int32_t dtype);
std::string conv_source(int32_t dtype, const DeviceInfo& info);
std::string pool_source(int32_t dtype, bool fp64);
std::string norm_source(int32_t dtype, bool fp64);
std::string index_source(int32_t dtype, bool fp64);
std::string softmax_source(int32_t dtype, bool fp64);
std::string transformer_source(int32_t dtype, bool fp64);
std::string attention_source(int32_t dtype, bool fp64);
std::string optim_source(int32_t dtype, bool fp64);
std::string loss_source(int32_t dtype, bool fp64);
// OpenCL C of bp_philox4x32_10(counter, seed) (Note [Philox stream]), shared by the random and
// attention programs.
const char* philox_source();

// Note [Matmul tiling]: the output tile (TS x TS, WPT x WPT per work-item) the device's
// work-group size and local memory allow for dtype; shared by matmul and the convolutions.
struct Tiling {
  int ts, wpt;
};
inline constexpr int kGemmTK = 16;
Tiling gemm_tiling(int32_t dtype, const DeviceInfo& info);

}  // namespace bp::opencl

// A resolved (op, dtype) on one device. Created by find_kernel, lives as long as the plugin.
// Thread-safety: clSetKernelArg and the enqueue that follows are not thread-safe on one
// cl_kernel, so launches hold `mutex` around them.
struct bp_kernel {
  bp::opencl::Device* device;
  bp::opencl::Op op;
  int32_t dtype;
  std::mutex mutex;
  std::vector<cl_kernel> kernels;  // family-specific slots; nullptr where absent
  std::vector<size_t> local_size;  // work-group size chosen per slot
  // Per slot, the event of its latest launch where launches of a kernel are ordered across
  // queues (Note [PoCL dlhandle cache]); guarded by `mutex`.
  std::vector<cl_event> last_launch;

  bp_kernel(bp::opencl::Device* d, bp::opencl::Op o, int32_t t) : device(d), op(o), dtype(t) {}
  ~bp_kernel() {
    for (cl_kernel k : kernels)
      if (k) clReleaseKernel(k);
    for (cl_event e : last_launch)
      if (e) clReleaseEvent(e);
  }
  bp_kernel(const bp_kernel&) = delete;
  bp_kernel& operator=(const bp_kernel&) = delete;
};

namespace bp::opencl {

// Creates the cl_kernels of `k` from its family's program (opencl_kernels_*.cpp).
void create_elementwise_kernels(bp_kernel& k, cl_program program);
void create_reduction_kernels(bp_kernel& k, cl_program program);
void create_matmul_kernels(bp_kernel& k, cl_program program);
void create_random_kernels(bp_kernel& k, cl_program program);
void create_conv_kernels(bp_kernel& k, cl_program program);
void create_pool_kernels(bp_kernel& k, cl_program program);
void create_norm_kernels(bp_kernel& k, cl_program program);
void create_index_kernels(bp_kernel& k, cl_program program);
void create_softmax_kernels(bp_kernel& k, cl_program program);
void create_transformer_kernels(bp_kernel& k, cl_program program);
void create_attention_kernels(bp_kernel& k, cl_program program);
void create_optim_kernels(bp_kernel& k, cl_program program);
void create_loss_kernels(bp_kernel& k, cl_program program);

// Where a launch goes: the device, the host's stream (may be NULL) and the queue to use.
struct LaunchContext {
  Device& device;
  bp_stream* stream;
  cl_command_queue queue;
};

// Launches of each family. Validate the descriptors (counts, dtypes, shapes, offsets, extents)
// and throw BP_ERROR_INVALID_ARGUMENT naming the op, dtype and shapes when they are wrong.
void launch_elementwise(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in,
                        int32_t num_in, const bp_tensor_desc* out, int32_t num_out,
                        const sdk::Attrs& attrs);
void launch_reduction(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in,
                      int32_t num_in, const bp_tensor_desc* out, int32_t num_out);
void launch_matmul(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in, int32_t num_in,
                   const bp_tensor_desc* out, int32_t num_out, const sdk::Attrs& attrs);
void launch_random(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in, int32_t num_in,
                   const bp_tensor_desc* out, int32_t num_out, const sdk::Attrs& attrs);
// The convolutional family (Note [Op catalogue], minor 4): dense NCHW tensors whose shapes and
// attributes the host has checked; the launches check them again (counts, dtypes, shapes,
// extents) and throw BP_ERROR_INVALID_ARGUMENT naming the op and shapes.
void launch_conv(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in, int32_t num_in,
                 const bp_tensor_desc* out, int32_t num_out, const sdk::Attrs& attrs);
void launch_pool(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in, int32_t num_in,
                 const bp_tensor_desc* out, int32_t num_out, const sdk::Attrs& attrs);
void launch_norm(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in, int32_t num_in,
                 const bp_tensor_desc* out, int32_t num_out, const sdk::Attrs& attrs);
void launch_index(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in, int32_t num_in,
                  const bp_tensor_desc* out, int32_t num_out, const sdk::Attrs& attrs);
void launch_softmax(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in, int32_t num_in,
                    const bp_tensor_desc* out, int32_t num_out, const sdk::Attrs& attrs);
// The transformer family (Note [Op catalogue], minor 5): dense tensors the host has checked;
// the launches check counts, dtypes, shapes and extents again.
void launch_transformer(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in,
                        int32_t num_in, const bp_tensor_desc* out, int32_t num_out,
                        const sdk::Attrs& attrs);
void launch_attention(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in,
                      int32_t num_in, const bp_tensor_desc* out, int32_t num_out,
                      const sdk::Attrs& attrs);
// adamw (Note [Op catalogue], minor 7): 4 N dense inputs, 3 N outputs that are 3 of them.
void launch_optim(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in, int32_t num_in,
                  const bp_tensor_desc* out, int32_t num_out, const sdk::Attrs& attrs);
// cross_entropy and its backward (Note [Op catalogue], minor 8; Note [Loss kernels]).
void launch_loss(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in, int32_t num_in,
                 const bp_tensor_desc* out, int32_t num_out, const sdk::Attrs& attrs);

// ---- Helpers shared by the launch code (opencl_kernels_common.cpp) ----

// Host mirror of the OpenCL C struct bp_ix: up to 4 strided tensors over one shape
// (slot 0 the output), offsets and strides in elements.
struct ClIndex {
  int64_t shape[BP_MAX_RANK];
  int64_t st[4][BP_MAX_RANK];
  int64_t off[4];
  int32_t rank;
  int32_t small;   // 1 when the element count fits in 31 bits (32-bit index arithmetic)
  int32_t contig;  // 1 when every tensor is dense (rank <= 1, unit strides after merging)
  int32_t pad;
};

// "add f32 on opencl:0 (...)" for messages.
std::string op_label(const bp_kernel& k);

// Validates one descriptor for use by kernel `k` as `role` ("input 0", "output") with dtype
// `dtype`: rank, shape, strides, offset alignment, buffer present and large enough. Returns
// the offset in elements.
int64_t checked_element_offset(const bp_kernel& k, const bp_tensor_desc& t, int32_t dtype,
                               const char* role);
// Throws unless `t` has the same rank and shape as `ref`.
void check_same_shape(const bp_kernel& k, const bp_tensor_desc& t, const bp_tensor_desc& ref,
                      const char* role);

// Builds a ClIndex for `count` tensors (slot 0 the output) over `t[0]`'s shape, merging
// dimensions that are contiguous in every tensor and dropping size-1 ones. `offsets` are in
// elements.
ClIndex make_index(const bp_tensor_desc* const* t, const int64_t* offsets, int32_t count);

// Sets kernel arguments in order; throws naming the kernel and argument on failure.
class KernelArgs {
 public:
  explicit KernelArgs(cl_kernel k) : k_(k) {}
  KernelArgs& mem(const bp_buffer* b);
  KernelArgs& mem(cl_mem m);
  template <typename T>
  KernelArgs& value(const T& v) {
    set(sizeof(T), &v);
    return *this;
  }
  KernelArgs& bytes(const void* v, size_t size) {
    set(size, v);
    return *this;
  }
  KernelArgs& local(size_t bytes) {
    set(bytes, nullptr);
    return *this;
  }

 private:
  void set(size_t size, const void* value);
  cl_kernel k_;
  cl_uint index_ = 0;
};

// Enqueues slot `slot` of k as an ND-range; call with k.mutex held. Throws naming the kernel
// and the device on failure.
void enqueue_kernel(const LaunchContext& lc, bp_kernel& k, size_t slot, cl_uint dims,
                    const size_t* global, const size_t* local);
// Global size of a 1-D launch of one work-item per item (n rounded up to whole groups).
size_t grid_size(uint64_t n, size_t local);
// The largest power of two <= min(cap, CL_KERNEL_WORK_GROUP_SIZE of k on the device).
size_t pick_local_size(cl_kernel k, const Device& d, size_t cap);
// Creates kernel `name` of `program`; throws naming the kernel.
cl_kernel create_kernel(const bp_kernel& k, cl_program program, const char* name);

// Throws BP_ERROR_INVALID_ARGUMENT "opencl: <op label>: <why>".
[[noreturn]] void fail_launch(const bp_kernel& k, const std::string& why);
// Throws unless the counts of inputs and outputs are among the allowed ones.
void check_counts(const bp_kernel& k, int32_t num_in, int32_t num_out, int32_t min_in,
                  int32_t max_in, int32_t min_out, int32_t max_out);
// Replaces every occurrence of `from` in `s` (source templates' $PLACEHOLDERS).
void replace_all(std::string& s, const std::string& from, const std::string& to);
// INT attribute `id`, `dflt` when absent; throws naming it when it is below `least`, or when it
// is absent and `dflt` < `least` (a required attribute).
int64_t int_attr(const bp_kernel& k, const sdk::Attrs& attrs, bp_attr_id id, int64_t dflt,
                 int64_t least);
// checked_element_offset for a tensor that must be dense (row-major contiguous) with `rank`
// dimensions (-1: any rank).
int64_t dense_offset(const bp_kernel& k, const bp_tensor_desc& t, int32_t dtype, int32_t rank,
                     const char* role);

// A buffer from the device's caching allocator for one launch, released stream-ordered when it
// goes out of scope (after the launch's kernels are enqueued).
struct TempBuffer {
  const LaunchContext& lc;
  bp_buffer* buf = nullptr;
  TempBuffer(const LaunchContext& c, uint64_t bytes);
  ~TempBuffer();
  TempBuffer(const TempBuffer&) = delete;
  TempBuffer& operator=(const TempBuffer&) = delete;
};

// A one-int device flag that kernels raise when they meet a bad index or target (gather,
// scatter_add, embedding, cross_entropy), cleared on lc's queue when made. raised() reads it
// back: a blocking read, so it waits for the kernels queued before it.
struct ErrorFlag {
  TempBuffer flag;
  ErrorFlag(const bp_kernel& k, const LaunchContext& lc);
  bp_buffer* buf() const { return flag.buf; }
  bool raised(const bp_kernel& k) const;
};

// The n int64 values of `t` from element offset `off`, read back (a blocking read).
std::vector<int64_t> read_indices(const bp_kernel& k, const LaunchContext& lc,
                                  const bp_tensor_desc& t, int64_t off, int64_t n);

// Saturating double -> int64 (NaN -> 0), for scalars and fill values of integer dtypes.
int64_t saturate_to_i64(double v);

}  // namespace bp::opencl
