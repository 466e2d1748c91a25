// The kernel objects (one per (op, dtype) the families implement; the op table of
// cuda_plugin.cpp declares them to the host) and the descriptor checks every family shares.
#include "cuda_ops.hpp"

#include "cuda_common.hpp"

#include <string>

namespace bp::cuda {
namespace {

constexpr int kNumOps = static_cast<int>(Op::kCount);

LaunchFn resolve(Op op, int32_t dtype) {
  LaunchFn fn = nullptr;
  switch (op) {
    case Op::kFill:
    case Op::kCopy:
    case Op::kCast:
      fn = layout_fn(op, dtype);
      break;
    case Op::kAdd:
    case Op::kSub:
    case Op::kMul:
    case Op::kDiv:
    case Op::kPow:
    case Op::kMaximum:
    case Op::kMinimum:
      fn = binary_fn(op, dtype);
      break;
    case Op::kEq:
    case Op::kNe:
    case Op::kLt:
    case Op::kLe:
    case Op::kGt:
    case Op::kGe:
    case Op::kWhere:
      fn = compare_fn(op, dtype);
      break;
    case Op::kNeg:
    case Op::kExp:
    case Op::kLog:
    case Op::kSqrt:
    case Op::kRelu:
    case Op::kSigmoid:
    case Op::kTanh:
    case Op::kAbs:
      fn = unary_fn(op, dtype);
      break;
    case Op::kSum:
    case Op::kMean:
    case Op::kMax:
    case Op::kSumsq:
    case Op::kNorm:
      fn = reduction_fn(op, dtype);
      break;
    case Op::kMatmul:
    case Op::kLinear:
      fn = matmul_fn(op, dtype);
      break;
    case Op::kUniform:
    case Op::kNormal:
      fn = random_fn(op, dtype);
      break;
    case Op::kConv2d:
    case Op::kConv2dBackwardInput:
    case Op::kConv2dBackwardWeight:
      fn = conv_fn(op, dtype);
      break;
    case Op::kBatchNorm:
    case Op::kBatchNormBackward:
      fn = batchnorm_fn(op, dtype);
      break;
    case Op::kMaxPool2d:
    case Op::kMaxPool2dBackward:
    case Op::kAvgPool2d:
    case Op::kAvgPool2dBackward:
    case Op::kAdaptiveAvgPool2d:
    case Op::kAdaptiveAvgPool2dBackward:
      fn = pooling_fn(op, dtype);
      break;
    case Op::kSoftmax:
    case Op::kLogSoftmax:
    case Op::kSoftmaxBackward:
    case Op::kLogSoftmaxBackward:
    case Op::kMaxDim:
    case Op::kMinDim:
      fn = axis_fn(op, dtype);
      break;
    case Op::kGather:
    case Op::kScatterAdd:
    case Op::kDropout:
      fn = index_fn(op, dtype);
      break;
    case Op::kLayerNorm:
    case Op::kLayerNormBackward:
    case Op::kEmbedding:
    case Op::kEmbeddingBackward:
    case Op::kTriu:
    case Op::kTril:
    case Op::kCumsum:
      fn = transformer_fn(op, dtype);
      break;
    case Op::kGelu:
    case Op::kGeluBackward:
    case Op::kSilu:
    case Op::kSiluBackward:
    case Op::kSin:
    case Op::kCos:
    case Op::kRsqrt:
      fn = activation_fn(op, dtype);
      break;
    case Op::kScaledDotProductAttention:
    case Op::kScaledDotProductAttentionBackward:
      fn = attention_fn(op, dtype);
      break;
    case Op::kAdamw:
      fn = optim_fn(op, dtype);
      break;
    case Op::kCrossEntropy:
    case Op::kCrossEntropyBackward:
      fn = loss_fn(op, dtype);
      break;
    case Op::kCount:
      break;
  }
  return fn;
}

// Every (op, dtype) kernel object; fn is nullptr for the pairs the families lack.
struct Kernels {
  CudaKernel k[kNumOps][BP_DTYPE_COUNT];
  Kernels() {
    for (int o = 0; o < kNumOps; ++o)
      for (int32_t d = 0; d < BP_DTYPE_COUNT; ++d)
        k[o][d] = CudaKernel{static_cast<Op>(o), d, resolve(static_cast<Op>(o), d)};
  }
};

}  // namespace

const CudaKernel* kernel_for(int32_t op, int32_t dtype) {
  static const Kernels* kernels = new Kernels();  // lives as long as the plugin
  if (op < 0 || op >= kNumOps || dtype < 0 || dtype >= BP_DTYPE_COUNT) return nullptr;
  const CudaKernel& k = kernels->k[op][dtype];
  return k.fn ? &k : nullptr;
}

// ---- Shared checks (cuda_kernels.hpp) ----

void invalid(const std::string& what) {
  bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT, what);
}

std::string shape_string(const int64_t* shape, int32_t rank) {
  std::string s = "[";
  for (int32_t d = 0; d < rank; ++d) {
    if (d) s += ", ";
    s += std::to_string(shape[d]);
  }
  return s + "]";
}

void check_arity(const LaunchArgs& a, int32_t nin, int32_t nout) {
  if (a.nin != nin || a.nout != nout) [[unlikely]]
    invalid(bp::sdk::format("expects %d input(s) and %d output(s), got %d and %d", nin, nout, a.nin,
                            a.nout));
}

void check_desc(const bp_tensor_desc& t, int32_t dtype, const char* role) {
  if (t.struct_size < sizeof(bp_tensor_desc)) [[unlikely]]
    invalid(bp::sdk::format("%s: descriptor struct_size %zu is smaller than %zu", role,
                            t.struct_size, sizeof(bp_tensor_desc)));
  if (t.rank < 0 || t.rank > BP_MAX_RANK) [[unlikely]]
    invalid(bp::sdk::format("%s: rank %d outside [0, %d]", role, t.rank, BP_MAX_RANK));
  if (t.dtype != dtype) [[unlikely]]
    invalid(bp::sdk::format("%s has dtype %s, expected %s", role, bp_dtype_name(t.dtype),
                            bp_dtype_name(dtype)));
  bool empty = false;
  for (int32_t d = 0; d < t.rank; ++d) {
    if (t.shape[d] < 0 || t.strides[d] < 0) [[unlikely]]
      invalid(bp::sdk::format("%s: negative size or stride (shape %s, strides %s)", role,
                              shape_string(t.shape, t.rank).c_str(),
                              shape_string(t.strides, t.rank).c_str()));
    empty = empty || t.shape[d] == 0;
  }
  if (!empty && !t.buffer) [[unlikely]]
    invalid(bp::sdk::format("%s of shape %s has a NULL buffer", role,
                            shape_string(t.shape, t.rank).c_str()));
}

void check_same_shape(const bp_tensor_desc& t, const bp_tensor_desc& ref, const char* role) {
  bool same = t.rank == ref.rank;
  for (int32_t d = 0; same && d < t.rank; ++d) same = t.shape[d] == ref.shape[d];
  if (!same) [[unlikely]]
    invalid(bp::sdk::format("%s has shape %s, expected the output's %s", role,
                            shape_string(t.shape, t.rank).c_str(),
                            shape_string(ref.shape, ref.rank).c_str()));
}

}  // namespace bp::cuda
