// Shared pieces of the kernels suite: the cases of each op family (one KernelCase per shape
// variant: contiguous, broadcast, strided, scalar, in-place, empty, large, ...) and the launch
// helpers they use. Every case draws fresh random data, runs the plugin's kernel through
// find_kernel/launch, and compares with a float64 host reference (conformance_data.hpp).
#pragma once

#include "conformance_catalogue.hpp"
#include "conformance_data.hpp"

#include <backplane_test/tolerance.hpp>

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
// The convolutional family (Note [Op catalogue], minor 4), one file each: conv2d and its two
// backward ops; max, average and adaptive average pooling and their backward; batch_norm, its
// backward and dropout; max_dim, min_dim, gather and scatter_add; softmax, log_softmax and
// their backward.
void conv_cases(const OpInfo& op, int32_t dt, CaseList& out);
void pool_cases(const OpInfo& op, int32_t dt, CaseList& out);
void norm_cases(const OpInfo& op, int32_t dt, CaseList& out);
void index_cases(const OpInfo& op, int32_t dt, CaseList& out);
void softmax_cases(const OpInfo& op, int32_t dt, CaseList& out);
// The transformer family (Note [Op catalogue], minor 5): layer_norm, gelu, silu, embedding and
// their backward ops, triu, tril and cumsum (conformance_kernels_transformer.cpp); attention
// forward and backward (conformance_kernels_attention.cpp).
void transformer_cases(const OpInfo& op, int32_t dt, CaseList& out);
void attention_cases(const OpInfo& op, int32_t dt, CaseList& out);
// The fused optimiser update (minor 7): adamw (conformance_kernels_optim.cpp).
void optim_cases(const OpInfo& op, int32_t dt, CaseList& out);
// The fused classification loss (minor 8): cross_entropy and its backward
// (conformance_kernels_loss.cpp).
void loss_cases(const OpInfo& op, int32_t dt, CaseList& out);
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
// run_kernel with several outputs (max_pool2d's values and indices, batch_norm's statistics).
void run_kernel_n(Context& ctx, const char* op, int32_t dt, const std::vector<bp_tensor_desc>& ins,
                  const std::vector<bp_tensor_desc>& outs, const std::vector<bp_attr>& attrs,
                  const std::string& what);
// Expects launch (or the synchronisation after it) to fail with `code`; throws Failure when it
// succeeds or fails differently. The _n form takes several outputs and returns the error's
// description, for checks on what the message names.
std::string run_kernel_n_expect_error(Context& ctx, const char* op, int32_t dt,
                                      const std::vector<bp_tensor_desc>& ins,
                                      const std::vector<bp_tensor_desc>& outs,
                                      const std::vector<bp_attr>& attrs, int32_t code,
                                      const std::string& what);
void run_kernel_expect_error(Context& ctx, const char* op, int32_t dt,
                             const std::vector<bp_tensor_desc>& ins, const bp_tensor_desc& out,
                             const std::vector<bp_attr>& attrs, int32_t code,
                             const std::string& what);

// The distribution of generic inputs of a dtype: floats in [-4, 4], signed integers in
// [-1000, 1000], u8 in [0, 255], bools 0/1.
Range default_range(int32_t dt);
// Compares out with a float64 reference through the one table's tolerance of `cls`, each
// element judged against max(|ref|, magnitude, smallest normal) (Note [Tolerance over the whole
// range] in compare.hpp): `magnitude` is the L2 norm (or a bound) of the terms accumulated into
// the element, so a result that cancels to near zero is judged against what produced it. An
// empty `magnitude` uses the reference's own. `scale` multiplies the table's rtol for results
// that chain several rounded steps (documented at each use).
void expect_close_mag(const std::vector<double>& out, const std::vector<double>& ref,
                      const std::vector<double>& magnitude, int32_t dt, bp_test::OpClass cls,
                      const std::string& what, double scale = 1);

// Output size of a convolution or pooling window along one dimension (Note [Op catalogue]):
// floor((in + 2 pad - dilation (k - 1) - 1) / stride) + 1, or with ceil_mode the ceiling, less
// one when the last window would start in the right padding.
int64_t window_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dilation,
                        bool ceil_mode);
// "seed 123, f32 (variant) on cpu:0"-style prefix of a case's messages; the seed is the run's.
std::string case_label(Context& ctx, const OpInfo& op, int32_t dt, const char* variant);
// A dense host tensor of `shape` holding `values` rounded to dt (NaN kept).
HostTensor dense_values(int32_t dt, const std::vector<int64_t>& shape,
                        const std::vector<double>& values);

// "add f32 [3,5,7] + [3,5,7]"-style description of a launch for messages.
std::string describe_launch(const char* op, const std::vector<const HostTensor*>& ins,
                            const std::vector<int64_t>& out_shape, int32_t out_dt,
                            const std::string& extra = "");

}  // namespace bpc
