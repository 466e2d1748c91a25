#include "opencl_program.hpp"

#include "opencl_device.hpp"
#include "opencl_kernels.hpp"

#include <vector>

namespace bp::opencl {

const char* family_name(Family f) {
  switch (f) {
    case Family::kElementwise:
      return "elementwise";
    case Family::kReduction:
      return "reduction";
    case Family::kMatmul:
      return "matmul";
    case Family::kRandom:
      return "random";
    case Family::kConv:
      return "conv";
    case Family::kPool:
      return "pool";
    case Family::kNorm:
      return "norm";
    case Family::kIndex:
      return "index";
    case Family::kSoftmax:
      return "softmax";
    case Family::kTransformer:
      return "transformer";
    case Family::kAttention:
      return "attention";
    case Family::kOptim:
      return "optim";
    case Family::kLoss:
      return "loss";
  }
  return "?";
}

cl_program build_program(cl_context ctx, cl_device_id dev, const std::string& source,
                         const std::string& options, const std::string& what) {
  const char* text = source.c_str();
  size_t length = source.size();
  cl_int status = CL_SUCCESS;
  cl_program program = clCreateProgramWithSource(ctx, 1, &text, &length, &status);
  if (status != CL_SUCCESS) fail_cl(status, "clCreateProgramWithSource", "program " + what);
  status = clBuildProgram(program, 1, &dev, options.c_str(), nullptr, nullptr);
  if (status == CL_SUCCESS) return program;

  std::string log;
  size_t n = 0;
  if (clGetProgramBuildInfo(program, dev, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n) == CL_SUCCESS &&
      n > 1) {
    log.resize(n);
    clGetProgramBuildInfo(program, dev, CL_PROGRAM_BUILD_LOG, n, log.data(), nullptr);
    while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  }
  clReleaseProgram(program);
  constexpr size_t kMaxLog = 16000;
  if (log.size() > kMaxLog) log = log.substr(0, kMaxLog) + "\n[build log truncated]";
  std::string name = cl_error_name(status);
  sdk::fail(BP_ERROR_DEVICE,
            sdk::format("opencl: building OpenCL program %s failed with %s (%d); build log:\n%s",
                        what.c_str(), name.c_str(), static_cast<int>(status),
                        log.empty() ? "(empty)" : log.c_str()),
            name);
}

ProgramCache::ProgramCache(Device& device) : device_(device) {}

ProgramCache::~ProgramCache() {
  for (auto& row : entries_)
    for (Entry& e : row)
      if (e.program) clReleaseProgram(e.program);
}

cl_program ProgramCache::get(int32_t dtype, Family family) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry& e = entries_[dtype][static_cast<int32_t>(family)];
  if (e.program) return e.program;
  if (e.failed) sdk::fail(static_cast<bp_error_code>(e.code), e.message, e.native);
  std::string what = sdk::format("'%s %s' for %s", family_name(family), bp_dtype_name(dtype),
                                 device_.label().c_str());
  try {
    std::string source = program_source(dtype, family, device_.info());
    e.program = build_program(device_.context(), device_.id(), source, "", what);
  } catch (const sdk::Failure& f) {
    e.failed = true;
    e.code = f.code();
    e.message = f.what();
    e.native = f.native_name();
    throw;
  }
  return e.program;
}

}  // namespace bp::opencl
