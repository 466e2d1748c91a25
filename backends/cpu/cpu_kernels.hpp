// Kernels of the CPU backend: the op catalogue as an enum, the kernel object a bp_kernel*
// points at, the launch context, and the entry points of each op family.
//
// A kernel is resolved once (the op table of cpu_plugin.cpp, by catalogue number) and then
// launched through a function pointer: launch does no string lookups (attributes are read by
// id). Kernels run eagerly on the calling thread, parallelised with oneTBB above the serial
// thresholds of Note [CPU serial thresholds]. All functions here are safe to call from several
// threads at once; kernels touch no shared state but the tensors they are given.
#ifndef BACKPLANE_CPU_KERNELS_HPP_
#define BACKPLANE_CPU_KERNELS_HPP_

#include <backplane/abi/op_catalogue.h>
#include <backplane/abi/plugin_abi.h>
#include <backplane/sdk/ops.hpp>
#include <backplane/sdk/plugin_sdk.hpp>

#include <cstdint>
#include <string>

namespace bp::cpu {

// The op catalogue (Note [Op catalogue]), generated once for every backend.
using sdk::Op;
using sdk::op_name;
inline constexpr int kNumOps = sdk::kNumOps;

struct CpuKernel;

// Everything a kernel sees of one launch. Valid for the duration of the call only.
struct Launch {
  const CpuKernel& kernel;
  const bp_tensor_desc* inputs;
  int32_t num_inputs;
  const bp_tensor_desc* outputs;
  int32_t num_outputs;
  const bp::sdk::Attrs& attrs;
};

using KernelFn = void (*)(const Launch&);

// A resolved (op, dtype) implementation. bp_kernel* handles point at these; they are static
// and live as long as the plugin.
struct CpuKernel {
  Op op;
  bp_dtype dtype;
  KernelFn fn;
};

// ---- Kernels (cpu_kernels.cpp) ------------------------------------------------------------

// The kernel of (catalogue op number, dtype), or nullptr when no family implements the pair
// (or a number is out of range). The objects are static and live as long as the plugin.
const CpuKernel* kernel_for(int32_t op, int32_t dtype);

// Runs a kernel after checking the descriptors every kernel relies on (rank, non-negative
// shapes and strides, non-NULL buffers of non-empty tensors). Throws bp::sdk::Failure.
void run_kernel(const CpuKernel& kernel, const bp_tensor_desc* inputs, int32_t num_inputs,
                const bp_tensor_desc* outputs, int32_t num_outputs, const bp::sdk::Attrs& attrs);

// ---- Op families: each returns the kernel function for (op, dtype) or nullptr when the
// support matrix excludes the pair. ----------------------------------------------------------
KernelFn copy_family(Op op, bp_dtype dtype);         // fill copy cast (cpu_copy.cpp)
KernelFn elementwise_family(Op op, bp_dtype dtype);  // binary, compare, where, unary
KernelFn reduction_family(Op op, bp_dtype dtype);    // sum mean max sumsq norm
KernelFn matmul_family(Op op, bp_dtype dtype);       // matmul linear
// Makes OpenBLAS single-threaded and reads BACKPLANE_CPU_MATMUL_THREADS (Note [One thread pool]
// in cpu_matmul.cpp); throws BP_ERROR_INVALID_ARGUMENT naming the variable for a bad value.
void configure_matmul();
// A two-way switch in the environment: false when `var` is unset, empty or `usual`, true when it
// is `other`; INVALID_ARGUMENT "cpu: VAR='v' is not 'usual' (the default) or 'other'" otherwise.
bool env_switch(const char* var, const char* usual, const char* other);
KernelFn random_family(Op op, bp_dtype dtype);  // uniform normal

// ---- Byte copies (cpu_copy.cpp): memcpy/memset split across threads when large. ----------
void parallel_memcpy(void* dst, const void* src, uint64_t size);
void parallel_memset(void* dst, int value, uint64_t size);

// ---- Checks shared by the families (cpu_kernels.cpp) ---------------------------------------

// Throws BP_ERROR_INVALID_ARGUMENT with "cpu:0: <op>(<dtype>): " and `what`.
[[noreturn]] void launch_error(const Launch& l, const std::string& what);
// Requires exactly (num_inputs, num_outputs) tensors.
void check_arity(const Launch& l, int32_t num_inputs, int32_t num_outputs);
// Requires t.dtype == dtype; `role` names the tensor in the message ("input 1").
void check_dtype(const Launch& l, const bp_tensor_desc& t, int32_t dtype, const char* role);
// Requires t to have out's rank and shape.
void check_same_shape(const Launch& l, const bp_tensor_desc& t, const bp_tensor_desc& out,
                      const char* role);
// "[2,3] strides [3,1] f32", for messages.
std::string describe(const bp_tensor_desc& t);

// Number of elements of a descriptor.
inline int64_t numel(const bp_tensor_desc& t) {
  return bp::sdk::numel(t);
}

// Typed address of element 0 of a descriptor (the buffer handle is the host pointer, or an
// imported record: Note [Tagged buffer handles] in plugin_sdk.hpp).
template <class T>
inline T* data(const bp_tensor_desc& t) {
  return reinterpret_cast<T*>(bp::sdk::buffer_address(t.buffer) + t.offset);
}

// ---- Note [CPU serial thresholds] ----------------------------------------------------------
// Each kernel belongs to a cost class. Below the class's serial threshold (elements; bytes for
// kBytes) a launch runs on the calling thread; at or above it, it is split into oneTBB tasks of
// at least `grain` elements (auto_partitioner). The defaults were measured with
// tests/cpu_threshold_bench.cpp (README.md, "Serial thresholds"). BACKPLANE_CPU_SERIAL_THRESHOLD
// =<n>, read once at init, sets the cheap threshold to n, scales the others by their default
// ratios and sets every grain to half its threshold; the tests use a tiny n to drive even small
// tensors through the parallel paths.
enum class Cost : int32_t {
  kCheap,           // elementwise arithmetic, compare, where, cast, fill, strided copy
  kTranscendental,  // exp log sigmoid tanh pow, random numbers
  kReduction,       // sum mean max, counted in input elements
  kBytes,           // memcpy / memset, counted in bytes
  kCount
};
struct Parallelism {
  int64_t serial_below;  // run serially when the work is smaller than this
  int64_t grain;         // minimum work per oneTBB task
};
const Parallelism& parallelism(Cost cost);
// Replaces one class's policy; call before any launch (not synchronised with running kernels).
void set_parallelism(Cost cost, Parallelism p);
// The BACKPLANE_CPU_SERIAL_THRESHOLD rule above; call before any launch.
void set_serial_threshold(int64_t cheap_elements);
// Applies BACKPLANE_CPU_SERIAL_THRESHOLD when set to a positive integer; throws
// BP_ERROR_INVALID_ARGUMENT naming the variable when it is set to anything else. Called by init.
void configure_thresholds_from_environment();
// Reads BACKPLANE_CPU_LOOPS (Note [OpenMP loops] in cpu_kernels.cpp); throws
// BP_ERROR_INVALID_ARGUMENT naming the variable for a bad value. Called by init.
void configure_loops();
// Records that an OpenMP team of the whole machine just ran (a convolution): for a while after,
// its threads spin, and parallel loops run on it (Note [OpenMP loops]).
void note_team_use();

}  // namespace bp::cpu

#endif  // BACKPLANE_CPU_KERNELS_HPP_
