// OpenCL C programs of the backend: one program per (dtype, op family), generated as source
// (opencl_kernels.hpp), compiled with clBuildProgram the first time a kernel of it is looked up
// on a device, and kept for the life of the device.
#pragma once

#include "opencl_common.hpp"

#include <cstdint>
#include <mutex>
#include <string>

namespace bp::opencl {

class Device;

// The op families; each has its own source generator and launch code (opencl_kernels_*.cpp).
// A test that needs one op compiles only its family's program (PoCL compiles with LLVM).
enum class Family : int32_t {
  kElementwise = 0,
  kReduction = 1,
  kMatmul = 2,
  kRandom = 3,  // uniform, normal, dropout
  kConv = 4,
  kPool = 5,
  kNorm = 6,         // batch_norm and its backward
  kIndex = 7,        // max_dim, min_dim, gather, scatter_add
  kSoftmax = 8,      // softmax, log_softmax and their backward
  kTransformer = 9,  // layer_norm, gelu, silu, embedding (and backward ops), triu, tril, cumsum
  kAttention = 10,   // scaled_dot_product_attention and its backward
  kOptim = 11,       // adamw
  kLoss = 12,        // cross_entropy and its backward
};
inline constexpr int32_t kFamilyCount = 13;
const char* family_name(Family f);

// Compiles `source` for device `dev` of context `ctx`. `what` names the program in messages
// ("elementwise f32 for opencl:0 (...)"). Throws BP_ERROR_DEVICE (native name
// CL_BUILD_PROGRAM_FAILURE, ...) whose message includes the compiler's build log. Caller
// releases the returned program.
cl_program build_program(cl_context ctx, cl_device_id dev, const std::string& source,
                         const std::string& options, const std::string& what);

// The programs of one device. Thread-safety: get() may be called from any thread; a program is
// built once (a failed build is remembered and its error repeated, without rebuilding).
class ProgramCache {
 public:
  explicit ProgramCache(Device& device);
  ~ProgramCache();
  ProgramCache(const ProgramCache&) = delete;
  ProgramCache& operator=(const ProgramCache&) = delete;

  // The built program holding the kernels of `family` for `dtype`. The program lives as long
  // as the cache.
  cl_program get(int32_t dtype, Family family);

 private:
  struct Entry {
    cl_program program = nullptr;
    bool failed = false;
    int32_t code = 0;
    std::string message, native;
  };
  Device& device_;
  std::mutex mutex_;
  Entry entries_[BP_DTYPE_COUNT][kFamilyCount];
};

}  // namespace bp::opencl
