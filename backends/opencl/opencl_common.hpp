// Shared definitions of the OpenCL backend: the OpenCL headers (pinned to the 1.2 API so the
// plugin runs on every ICD, NVIDIA's included), the error-checking macro, and small helpers
// for dtypes and tensor descriptors.
//
// Thread-safety: everything here is stateless.
#pragma once

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>
#include <CL/cl_ext.h>

#include <backplane/abi/plugin_abi.h>
#include <backplane/sdk/plugin_sdk.hpp>

#include <cstdint>
#include <string>

namespace bp::opencl {

// The plugin's name in error objects and messages.
inline constexpr const char* kPluginName = "opencl";

// Symbolic name of an OpenCL status code ("CL_OUT_OF_RESOURCES"), or "CL_ERROR(<n>)".
std::string cl_error_name(cl_int status);

// The bp_error_code an OpenCL status maps to: allocation failures -> BP_ERROR_OUT_OF_MEMORY,
// missing platform/device -> BP_ERROR_UNAVAILABLE, everything else -> BP_ERROR_DEVICE.
bp_error_code cl_error_code(cl_int status);

// Throws bp::sdk::Failure for a failed OpenCL call: the message names the call (the expression
// text), the status and `context` (device, op, sizes); native_name is the status name.
[[noreturn]] void fail_cl(cl_int status, const char* expr, const std::string& context);

// The one checking macro for OpenCL calls returning cl_int. `context` is a std::string (or
// anything convertible) evaluated only on failure.
#define BP_CL_CHECK(expr, context)                            \
  do {                                                        \
    cl_int bp_cl_status_ = (expr);                            \
    if (bp_cl_status_ != CL_SUCCESS) {                        \
      ::bp::opencl::fail_cl(bp_cl_status_, #expr, (context)); \
    }                                                         \
  } while (0)

// "[2, 3, 4]" for a descriptor's shape; "[]" for rank 0.
std::string shape_string(const bp_tensor_desc& t);

// True for f32, f64, f16, bf16.
inline bool is_floating(int32_t dtype) {
  return dtype == BP_DTYPE_F32 || dtype == BP_DTYPE_F64 || dtype == BP_DTYPE_F16 ||
         dtype == BP_DTYPE_BF16;
}

// True when `dtype` is one of the eight ABI dtypes.
inline bool valid_dtype(int32_t dtype) {
  return dtype >= 0 && dtype < BP_DTYPE_COUNT;
}

}  // namespace bp::opencl
