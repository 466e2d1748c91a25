// Elementwise kernels: fill, copy, cast, binary arithmetic (add sub mul div pow maximum
// minimum), comparisons (eq ne lt le gt ge), where and unary math (neg exp log sqrt relu sigmoid
// tanh abs sin cos rsqrt). One program per dtype holds all of them; every kernel is a grid-stride
// loop over the output's elements with strided (broadcast) indexing through bp_ix.
//
// Note [Elementwise semantics]
//   f16/bf16 compute in float and round once on store. Integer add/sub/mul/neg wrap (computed
//   in the unsigned type). add and sub with ALPHA compute a OP alpha*b in one pass, alpha
//   converted like the scalar. maximum/minimum propagate NaN from either side; relu keeps NaN.
//   The SCALAR and ALPHA attributes are converted to the tensor's dtype first, and casts and
//   fill values convert, as Note [Conversions] in plugin_abi.h says: float -> integer truncates
//   toward zero, NaN gives 0, out-of-range values saturate to the int64 range and narrower
//   integers then wrap; x -> bool is x != 0. Each work-item reads its input elements before writing
//   its output element, so an output that is exactly input 0 (attr "inplace") is safe.
#include "opencl_allocator.hpp"
#include "opencl_kernels.hpp"

#include <backplane/abi/half.h>

#include <cstring>

namespace bp::opencl {
namespace {

constexpr const char* kElementwiseMacros = R"CLC(
__kernel void bp_fill(__global T* out, T v, bp_ix ix, long n) {
  BP_ITEM(i, n)
  out[bp_offsets(&ix, i).x] = v;
}

__kernel void bp_copy(__global T* out, __global const T* a, bp_ix ix, long n) {
  BP_ITEM(i, n)
  long4 o = bp_offsets(&ix, i);
  out[o.x] = a[o.y];
}

__kernel void bp_where(__global T* out, __global const uchar* c, __global const T* a,
                       __global const T* b, bp_ix ix, long n) {
  BP_ITEM(i, n)
  long4 o = bp_offsets(&ix, i);
  out[o.x] = c[o.y] ? a[o.z] : b[o.w];
}

#define BP_CAST(NAME, OT, EXPR)                                                \
  __kernel void NAME(__global OT* out, __global const T* a, bp_ix ix, long n) { \
    BP_ITEM(i, n)                                                              \
    long4 o = bp_offsets(&ix, i);                                              \
    T v = a[o.y];                                                              \
    C x = LD(v);                                                               \
    out[o.x] = (EXPR);                                                         \
  }

#define BP_UNARY(NAME, RESULT)                                                \
  __kernel void NAME(__global T* out, __global const T* a, bp_ix ix, long n) { \
    BP_ITEM(i, n)                                                             \
    long4 o = bp_offsets(&ix, i);                                             \
    C x = LD(a[o.y]);                                                         \
    out[o.x] = ST(RESULT);                                                    \
  }

/* mode 0: a OP b; mode 1: a OP s; mode 2: s OP a; mode 3: a OP s*b (ALPHA). In modes 1 and 2,
 * b is a (read, unused). */
#define BP_BINARY(NAME, OT, RESULT)                                                   \
  __kernel void NAME(__global OT* out, __global const T* a, __global const T* b, C s, \
                     int mode, bp_ix ix, long n) {                                    \
    BP_ITEM(i, n)                                                                     \
    long4 o = bp_offsets(&ix, i);                                                     \
    C x = LD(a[o.y]);                                                                 \
    C y = LD(b[o.z]);                                                                 \
    if (mode == 1) {                                                                  \
      y = s;                                                                          \
    } else if (mode == 2) {                                                           \
      y = x;                                                                          \
      x = s;                                                                          \
    } else if (mode == 3) {                                                           \
      y = BP_MULW(s, y);                                                              \
    }                                                                                 \
    out[o.x] = (RESULT);                                                              \
  }
)CLC";

// The OpenCL C expression of op `op` on compute values x (and y) for `dtype`; nullptr when the
// op is not defined for it.
const char* op_expression(Op op, int32_t dtype) {
  bool fp = is_floating(dtype);
  switch (op) {
    case Op::kAdd:
      return fp ? "ST(x + y)" : "ST((UC)x + (UC)y)";
    case Op::kSub:
      return fp ? "ST(x - y)" : "ST((UC)x - (UC)y)";
    case Op::kMul:
      return fp ? "ST(x * y)" : "ST((UC)x * (UC)y)";
    case Op::kDiv:
      return "ST(x / y)";
    case Op::kPow:
      return "ST(pow(x, y))";
    case Op::kMaximum:
      return fp ? "ST((isnan(x) || isnan(y)) ? x + y : fmax(x, y))" : "ST(max(x, y))";
    case Op::kMinimum:
      return fp ? "ST((isnan(x) || isnan(y)) ? x + y : fmin(x, y))" : "ST(min(x, y))";
    case Op::kEq:
      return "(uchar)(x == y)";
    case Op::kNe:
      return "(uchar)(x != y)";
    case Op::kLt:
      return "(uchar)(x < y)";
    case Op::kLe:
      return "(uchar)(x <= y)";
    case Op::kGt:
      return "(uchar)(x > y)";
    case Op::kGe:
      return "(uchar)(x >= y)";
    case Op::kNeg:
      return fp ? "-x" : "(UC)0 - (UC)x";
    case Op::kExp:
      return "exp(x)";
    case Op::kLog:
      return "log(x)";
    case Op::kSqrt:
      return "sqrt(x)";
    case Op::kRelu:
      return "(x < (C)0 ? (C)0 : x)";
    case Op::kSigmoid:
      return "(C)1 / ((C)1 + exp(-x))";
    case Op::kTanh:
      return "tanh(x)";
    case Op::kAbs:
      return fp ? "fabs(x)" : "(C)abs(x)";
    case Op::kSin:
      return "sin(x)";
    case Op::kCos:
      return "cos(x)";
    case Op::kRsqrt:
      return "rsqrt(x)";
    default:
      return nullptr;
  }
}

// The cast of compute value x (raw storage v) of dtype `from` to storage of dtype `to`.
std::string cast_expression(int32_t from, int32_t to) {
  if (from == to) return "v";
  bool fp = is_floating(from);
  switch (to) {
    case BP_DTYPE_F32:
      return "(float)x";
    case BP_DTYPE_F64:
      return "(double)x";
    case BP_DTYPE_F16:
      return "bp_float_to_f16((float)x)";
    case BP_DTYPE_BF16:
      return "bp_float_to_bf16((float)x)";
    case BP_DTYPE_I32:
      return fp ? "(int)convert_long_sat_rtz(x)" : "(int)x";
    case BP_DTYPE_I64:
      return fp ? "convert_long_sat_rtz(x)" : "(long)x";
    case BP_DTYPE_U8:
      return fp ? "(uchar)convert_long_sat_rtz(x)" : "(uchar)x";
    default:
      return "(uchar)(x != (C)0)";
  }
}

bool supports(Op op, int32_t dtype) {
  return (op_info(op).dtypes >> dtype) & 1u;
}

std::string kernel_name_of(Op op) {
  return std::string("bp_") + op_info(op).name;
}

// A value of dtype `dtype` as the bytes of its storage type (for fill patterns and arguments).
struct Scalar {
  unsigned char bytes[8];
  size_t size;
};

// Converts an attribute (INT kept exact for integer dtypes) to storage of `dtype`.
Scalar to_storage(const bp_attr& a, int32_t dtype) {
  Scalar s{};
  s.size = bp_dtype_size(dtype);
  double f = a.kind == BP_ATTR_INT ? static_cast<double>(a.i) : a.f;
  int64_t i = a.kind == BP_ATTR_INT ? a.i : saturate_to_i64(a.f);
  auto put = [&](auto v) { std::memcpy(s.bytes, &v, sizeof v); };
  switch (dtype) {
    case BP_DTYPE_F32:
      put(static_cast<float>(f));
      break;
    case BP_DTYPE_F64:
      put(f);
      break;
    case BP_DTYPE_F16:
      put(bp_float_to_f16(static_cast<float>(f)));
      break;
    case BP_DTYPE_BF16:
      put(bp_float_to_bf16(static_cast<float>(f)));
      break;
    case BP_DTYPE_I32:
      put(static_cast<int32_t>(static_cast<uint32_t>(i)));
      break;
    case BP_DTYPE_I64:
      put(i);
      break;
    case BP_DTYPE_U8:
      put(static_cast<uint8_t>(i));
      break;
    default:
      put(static_cast<uint8_t>(a.kind == BP_ATTR_INT ? a.i != 0 : a.f != 0.0));
      break;
  }
  return s;
}

// The scalar operand as the kernel's compute type C (float for f16/bf16, uchar for u8/bool).
Scalar to_compute(const bp_attr& a, int32_t dtype) {
  Scalar s = to_storage(a, dtype);
  uint16_t h;
  std::memcpy(&h, s.bytes, sizeof h);
  float f;
  if (dtype == BP_DTYPE_F16) {
    f = bp_f16_to_float(h);
  } else if (dtype == BP_DTYPE_BF16) {
    f = bp_bf16_to_float(h);
  } else {
    return s;
  }
  std::memcpy(s.bytes, &f, sizeof f);
  s.size = sizeof f;
  return s;
}

[[noreturn]] void bad_launch(const bp_kernel& k, const std::string& why) {
  sdk::fail(BP_ERROR_INVALID_ARGUMENT,
            sdk::format("opencl: %s: %s", op_label(k).c_str(), why.c_str()));
}

// Enqueues kernel slot `slot` of k over `count` tensors (slot 0 the output) and the arguments
// set by `extra` between the buffers and the index.
template <typename Extra>
void run_pointwise(bp_kernel& k, const LaunchContext& lc, size_t slot,
                   const bp_tensor_desc* const* t, const int64_t* offsets, int32_t count,
                   Extra&& extra) {
  int64_t n = sdk::numel(*t[0]);
  ClIndex ix = make_index(t, offsets, count);
  cl_kernel kernel = k.kernels[slot];
  size_t local = k.local_size[slot];
  size_t global = grid_size(static_cast<uint64_t>(n), local);
  std::lock_guard<std::mutex> lock(k.mutex);
  KernelArgs args(kernel);
  for (int32_t j = 0; j < count; ++j) args.mem(t[j]->buffer);
  extra(args);
  args.value(ix).value(static_cast<cl_long>(n));
  enqueue_kernel(lc, k, slot, 1, &global, &local);
}

// True when a descriptor covers a dense row-major range (size-1 dimensions ignored).
bool dense(const bp_tensor_desc& t) {
  return sdk::is_contiguous(t);
}

void launch_fill(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc& out,
                 const sdk::Attrs& attrs) {
  const bp_attr* value = attrs.find(BP_ATTR_ID_VALUE);
  if (!value) bad_launch(k, "attribute 'value' is missing");
  int64_t off = checked_element_offset(k, out, k.dtype, "output");
  int64_t n = sdk::numel(out);
  if (n == 0) return;
  Scalar v = to_storage(*value, k.dtype);
  if (dense(out)) {
    BP_CL_CHECK(clEnqueueFillBuffer(lc.queue, out.buffer->mem, v.bytes, v.size,
                                    static_cast<size_t>(off) * v.size,
                                    static_cast<size_t>(n) * v.size, 0, nullptr, nullptr),
                op_label(k) + " output " + shape_string(out));
    return;
  }
  const bp_tensor_desc* t[] = {&out};
  run_pointwise(k, lc, 0, t, &off, 1, [&](KernelArgs& a) { a.bytes(v.bytes, v.size); });
}

}  // namespace

std::string elementwise_source(int32_t dtype, bool fp64) {
  std::string s = kernel_prelude(dtype, fp64);
  s += kElementwiseMacros;
  for (int32_t to = 0; to < BP_DTYPE_COUNT; ++to) {
    if (to == BP_DTYPE_F64 && !fp64) continue;
    s += sdk::format("BP_CAST(bp_cast_%s, %s, %s)\n", bp_dtype_name(to), cl_storage_type(to),
                     cast_expression(dtype, to).c_str());
  }
  for (int32_t i = 0; i < kOpCount; ++i) {
    Op op = static_cast<Op>(i);
    if (!supports(op, dtype)) continue;
    const char* e = op_expression(op, dtype);
    if (!e) continue;
    std::string name = kernel_name_of(op);
    if (is_binary(op)) {
      s += sdk::format("BP_BINARY(%s, %s, %s)\n", name.c_str(), is_comparison(op) ? "uchar" : "T",
                       e);
    } else if (is_unary(op)) {
      s += sdk::format("BP_UNARY(%s, %s)\n", name.c_str(), e);
    }
  }
  return s;
}

void create_elementwise_kernels(bp_kernel& k, cl_program program) {
  if (k.op == Op::kCast) {
    k.kernels.assign(BP_DTYPE_COUNT, nullptr);
    k.local_size.assign(BP_DTYPE_COUNT, 1);
    for (int32_t to = 0; to < BP_DTYPE_COUNT; ++to) {
      if (to == BP_DTYPE_F64 && !k.device->info().fp64) continue;
      std::string name = std::string("bp_cast_") + bp_dtype_name(to);
      k.kernels[to] = create_kernel(k, program, name.c_str());
      k.local_size[to] = pick_local_size(k.kernels[to], *k.device, 256);
    }
    return;
  }
  std::string name = kernel_name_of(k.op);
  k.kernels = {create_kernel(k, program, name.c_str())};
  k.local_size = {pick_local_size(k.kernels[0], *k.device, 256)};
}

void launch_elementwise(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in,
                        int32_t num_in, const bp_tensor_desc* out, int32_t num_out,
                        const sdk::Attrs& attrs) {
  if (num_out != 1) bad_launch(k, sdk::format("expects 1 output, got %d", num_out));
  const bp_tensor_desc& o = out[0];
  Op op = k.op;

  if (op == Op::kFill) {
    if (num_in != 0) bad_launch(k, sdk::format("expects no inputs, got %d", num_in));
    launch_fill(k, lc, o, attrs);
    return;
  }

  int32_t out_dtype = is_comparison(op) ? BP_DTYPE_BOOL : k.dtype;
  if (op == Op::kCast) {
    if (!valid_dtype(o.dtype))
      bad_launch(k, sdk::format("output dtype %d is not a dtype", o.dtype));
    out_dtype = o.dtype;
  }
  int64_t off[4];
  off[0] = checked_element_offset(k, o, out_dtype, "output");
  int64_t n = sdk::numel(o);

  if (op == Op::kWhere) {
    if (num_in != 3) bad_launch(k, sdk::format("expects 3 inputs (cond, a, b), got %d", num_in));
    static const char* roles[] = {"input 0 (cond)", "input 1 (a)", "input 2 (b)"};
    for (int32_t j = 0; j < 3; ++j) {
      off[j + 1] = checked_element_offset(k, in[j], j == 0 ? BP_DTYPE_BOOL : k.dtype, roles[j]);
      check_same_shape(k, in[j], o, roles[j]);
    }
    if (n == 0) return;
    const bp_tensor_desc* t[] = {&o, &in[0], &in[1], &in[2]};
    run_pointwise(k, lc, 0, t, off, 4, [](KernelArgs&) {});
    return;
  }

  if (is_binary(op)) {
    const bp_attr* scalar = attrs.find(BP_ATTR_ID_SCALAR);
    if (num_in == 2) {
      for (int32_t j = 0; j < 2; ++j) {
        const char* role = j == 0 ? "input 0" : "input 1";
        off[j + 1] = checked_element_offset(k, in[j], k.dtype, role);
        check_same_shape(k, in[j], o, role);
      }
    } else if (num_in == 1 && scalar) {
      off[1] = checked_element_offset(k, in[0], k.dtype, "input 0");
      check_same_shape(k, in[0], o, "input 0");
    } else {
      bad_launch(k, sdk::format("expects 2 inputs, or 1 input and attribute 'scalar'; got %d "
                                "input(s)%s",
                                num_in, scalar ? " and 'scalar'" : ""));
    }
    if (n == 0) return;
    cl_int mode = 0;
    Scalar s{};
    s.size = bp_dtype_size(k.dtype);
    bp_tensor_desc dummy;
    if (num_in == 1) {
      mode = attrs.i(BP_ATTR_ID_REVERSE, 0) ? 2 : 1;
      s = to_compute(*scalar, k.dtype);
      // b is a itself: valid memory with a's layout (keeps the dense path), never used.
      dummy = in[0];
      off[2] = off[1];
    } else if (const bp_attr* alpha =
                   (op == Op::kAdd || op == Op::kSub) ? attrs.find(BP_ATTR_ID_ALPHA) : nullptr) {
      mode = 3;  // a OP alpha*b (Note [Elementwise semantics])
      s = to_compute(*alpha, k.dtype);
    } else {
      std::memset(s.bytes, 0, sizeof s.bytes);
      s.size = is_floating(k.dtype) && k.dtype != BP_DTYPE_F64 ? 4 : bp_dtype_size(k.dtype);
    }
    const bp_tensor_desc* t[] = {&o, &in[0], num_in == 2 ? &in[1] : &dummy};
    run_pointwise(k, lc, 0, t, off, 3, [&](KernelArgs& a) {
      a.bytes(s.bytes, s.size);
      a.value(mode);
    });
    return;
  }

  // copy, cast, unary: one input of the op's dtype.
  if (num_in != 1) bad_launch(k, sdk::format("expects 1 input, got %d", num_in));
  off[1] = checked_element_offset(k, in[0], k.dtype, "input 0");
  check_same_shape(k, in[0], o, "input 0");
  if (n == 0) return;
  size_t slot = 0;
  if (op == Op::kCast) {
    if (!k.kernels[out_dtype])
      sdk::fail(BP_ERROR_UNSUPPORTED, sdk::format("opencl: %s: cannot cast to f64: %s",
                                                  op_label(k).c_str(), kNoFp64Reason));
    slot = static_cast<size_t>(out_dtype);
  }
  bool same_dtype = op == Op::kCopy || (op == Op::kCast && out_dtype == k.dtype);
  if (same_dtype && dense(o) && dense(in[0])) {
    size_t esize = bp_dtype_size(k.dtype);
    cl_mem src = in[0].buffer->mem, dst = o.buffer->mem;
    size_t so = static_cast<size_t>(off[1]) * esize, doff = static_cast<size_t>(off[0]) * esize;
    size_t bytes = static_cast<size_t>(n) * esize;
    if (src != dst || so + bytes <= doff || doff + bytes <= so) {
      if (src != dst || so != doff)
        BP_CL_CHECK(clEnqueueCopyBuffer(lc.queue, src, dst, so, doff, bytes, 0, nullptr, nullptr),
                    op_label(k) + " " + shape_string(o));
      return;
    }
  }
  const bp_tensor_desc* t[] = {&o, &in[0]};
  run_pointwise(k, lc, slot, t, off, 2, [](KernelArgs&) {});
}

}  // namespace bp::opencl
