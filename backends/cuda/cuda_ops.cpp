// The op table: names, support reasons, kernel handles, and the descriptor checks every
// family shares.
#include "cuda_ops.hpp"

#include "cuda_common.hpp"

#include <array>
#include <cstring>
#include <mutex>
#include <string>

namespace bp::cuda {
namespace {

constexpr int kNumOps = static_cast<int>(Op::kCount);

constexpr std::array<const char*, kNumOps> kOpNames = {
#define BP_OP_X_NAME(name, ...) #name,
    BP_OP_CATALOGUE(BP_OP_X_NAME)
#undef BP_OP_X_NAME
};
static_assert(kOpNames[kNumOps - 1] != nullptr, "kOpNames must name every Op");

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
      fn = reduction_fn(op, dtype);
      break;
    case Op::kMatmul:
      fn = matmul_fn(op, dtype);
      break;
    case Op::kUniform:
    case Op::kNormal:
      fn = random_fn(op, dtype);
      break;
    case Op::kCount:
      break;
  }
  return fn;
}

// Why (op, dtype) is not supported; static strings.
const char* unsupported_reason(Op op, int32_t dtype) {
  const bool is_bool = dtype == BP_DTYPE_BOOL;
  const bool is_int = dtype == BP_DTYPE_I32 || dtype == BP_DTYPE_I64 || dtype == BP_DTYPE_U8;
  switch (op) {
    case Op::kAdd:
    case Op::kSub:
    case Op::kMul:
    case Op::kMaximum:
    case Op::kMinimum:
      return "arithmetic is not defined on bool";
    case Op::kDiv:
    case Op::kPow:
      return is_bool ? "arithmetic is not defined on bool"
                     : "div and pow are defined for floating-point dtypes only";
    case Op::kNeg:
    case Op::kAbs:
    case Op::kRelu:
      return "neg, abs and relu are defined for floating-point and signed dtypes";
    case Op::kExp:
    case Op::kLog:
    case Op::kSqrt:
    case Op::kSigmoid:
    case Op::kTanh:
      return "transcendental functions are defined for floating-point dtypes only";
    case Op::kSum:
    case Op::kMax:
      return "sum and max are not defined on u8 and bool";
    case Op::kMean:
      return is_int || is_bool ? "mean is defined for floating-point dtypes only"
                               : "mean is not implemented for this dtype";
    case Op::kMatmul:
      return "matmul (cuBLAS) is defined for f32, f64, f16 and bf16 only";
    case Op::kUniform:
    case Op::kNormal:
      return "random ops produce floating-point dtypes only";
    default:
      return "not implemented for this dtype";
  }
}

struct Table {
  CudaKernel kernels[kNumOps][BP_DTYPE_COUNT];
  bp_op_support support[kNumOps * BP_DTYPE_COUNT];
};

const Table& table() {
  static const Table* t = [] {
    auto* tb = new Table();
    for (int o = 0; o < kNumOps; ++o) {
      for (int32_t d = 0; d < BP_DTYPE_COUNT; ++d) {
        const Op op = static_cast<Op>(o);
        const LaunchFn fn = resolve(op, d);
        tb->kernels[o][d] = CudaKernel{op, d, fn};
        bp_op_support& s = tb->support[o * BP_DTYPE_COUNT + d];
        s.struct_size = sizeof(bp_op_support);
        s.op = kOpNames[static_cast<size_t>(o)];
        s.dtype = d;
        s.support = fn ? BP_SUPPORT_YES : BP_SUPPORT_NO;
        s.reason = fn ? "" : unsupported_reason(op, d);
      }
    }
    return tb;
  }();
  return *t;
}

}  // namespace

const char* op_name(Op op) {
  const int o = static_cast<int>(op);
  return o >= 0 && o < kNumOps ? kOpNames[static_cast<size_t>(o)] : "?";
}

const CudaKernel* find_kernel(int32_t op, int32_t dtype) {
  if (op < 0 || op >= kNumOps)
    bp::sdk::fail(
        BP_ERROR_UNSUPPORTED,
        bp::sdk::format("cuda: op number %d is not in the catalogue (0..%d)", op, kNumOps - 1));
  const char* name = kOpNames[static_cast<size_t>(op)];
  if (dtype < 0 || dtype >= BP_DTYPE_COUNT)
    bp::sdk::fail(BP_ERROR_UNSUPPORTED,
                  bp::sdk::format("cuda: op '%s' asked for unknown dtype %d", name, dtype));
  const CudaKernel& k = table().kernels[op][dtype];
  if (!k.fn)
    bp::sdk::fail(
        BP_ERROR_UNSUPPORTED,
        bp::sdk::format("cuda: op '%s' is not supported for %s: %s", name, bp_dtype_name(dtype),
                        table().support[op * BP_DTYPE_COUNT + dtype].reason));
  return &k;
}

void list_ops(const bp_op_support** out_list, int32_t* out_count) {
  *out_list = table().support;
  *out_count = kNumOps * BP_DTYPE_COUNT;
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
