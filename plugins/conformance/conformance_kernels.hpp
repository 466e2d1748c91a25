// Shared pieces of the kernels suite: the cases of each op family (one KernelCase per shape
// variant: contiguous, broadcast, strided, scalar, in-place, empty, large, ...) and the launch
// helpers they use. Every case draws fresh random data, runs the plugin's kernel through
// find_kernel/launch, and compares with a float64 host reference (conformance_data.hpp).
#pragma once

#include "conformance_catalogue.hpp"
#include "conformance_data.hpp"

#include <functional>
#include <string>
#include <vector>

namespace bpc {

struct KernelCase {
  std::string variant;  // "broadcast": the test is named <op>_<variant>
  std::function<void(Context&)> body;
};
using CaseList = std::vector<KernelCase>;

// The cases of one (op, dtype) pair of each family; `op` is known to be in the family.
void elementwise_cases(const OpInfo& op, int32_t dt, CaseList& out);  // fill copy cast
                                                                      // binary compare where unary
void reduction_cases(const OpInfo& op, int32_t dt, CaseList& out);
void matmul_cases(const OpInfo& op, int32_t dt, CaseList& out);
void random_cases(const OpInfo& op, int32_t dt, CaseList& out);
// The catalogue's rules on fixed values (NaN propagation, integer wrap, cast rules): appended to
// the pairs they concern (conformance_kernels_rules.cpp).
void rules_cases(const OpInfo& op, int32_t dt, CaseList& out);

// Number of elements of the "large" shapes (>= 1 << 20).
inline constexpr int64_t kLargeRows = 1025, kLargeCols = 1029;

bp_attr attr_int(const char* name, int64_t v);
bp_attr attr_float(const char* name, double v);

// Resolves (op, dt), launches it on ctx's stream and synchronises; throws Failure naming the
// op, dtype and shapes when find_kernel, launch or the synchronisation fails.
void run_kernel(Context& ctx, const char* op, int32_t dt, const std::vector<bp_tensor_desc>& ins,
                const bp_tensor_desc& out, const std::vector<bp_attr>& attrs,
                const std::string& what);
// Expects launch (or the synchronisation after it) to fail with `code`; throws Failure when it
// succeeds or fails differently.
void run_kernel_expect_error(Context& ctx, const char* op, int32_t dt,
                             const std::vector<bp_tensor_desc>& ins, const bp_tensor_desc& out,
                             const std::vector<bp_attr>& attrs, int32_t code,
                             const std::string& what);

// The distribution of generic inputs of a dtype: floats in [-4, 4], signed integers in
// [-1000, 1000], u8 in [0, 255], bools 0/1.
Range default_range(int32_t dt);
// "add f32 [3,5,7] + [3,5,7]"-style description of a launch for messages.
std::string describe_launch(const char* op, const std::vector<const HostTensor*>& ins,
                            const std::vector<int64_t>& out_shape, int32_t out_dt,
                            const std::string& extra = "");

}  // namespace bpc
