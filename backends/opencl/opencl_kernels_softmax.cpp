// softmax, log_softmax and their backward ops along an axis.
//
// Note [Softmax kernels]
//   The tensors are viewed as [outer, len, inner] with the axis in the middle; a row is one
//   (outer, inner) pair, its elements `inner` apart. One kernel serves the four ops (MODE, uniform
//   across the launch):
//     0 softmax               y = exp(x - m) / sum(exp(x - m)), m = max(x)
//     1 log_softmax           y = x - m - log(sum(exp(x - m)))
//     2 softmax_backward      dx = y * (dy - sum(dy * y))
//     3 log_softmax_backward  dx = dy - exp(y) * sum(dy)
//   Short rows, or very many rows: bp_softmax_rows, one work-item per row, serial passes.
//   Otherwise bp_softmax_tree: one work-group per row, each pass a strided loop plus a
//   local-memory tree. Sums in float (double for f64); subtracting the maximum keeps every
//   exponent <= 0, so the result is finite for any finite input.
#include "opencl_kernels.hpp"

namespace bp::opencl {
namespace {

constexpr const char* kSoftmaxSource = R"CLC(
__kernel void bp_softmax_rows(__global T* out, __global const T* a, __global const T* b,
                              long outer, long len, long inner, long o_off, long a_off,
                              long b_off, int mode) {
  long r = get_global_id(0);
  if (r >= outer * inner) return;
  long u = r / inner, v = r - u * inner;
  long base = u * len * inner + v;
  __global const T* x = a + a_off + base;
  __global const T* g = b + b_off + base;
  __global T* y = out + o_off + base;
  if (mode < 2) {
    ACC m = (ACC)(-INFINITY);
    for (long j = 0; j < len; ++j) m = BP_MAX((ACC)LD(x[j * inner]), m);
    ACC s = (ACC)0;
    for (long j = 0; j < len; ++j) s += exp((ACC)LD(x[j * inner]) - m);
    if (mode == 0) {
      ACC inv = (ACC)1 / s;
      for (long j = 0; j < len; ++j) y[j * inner] = ST(exp((ACC)LD(x[j * inner]) - m) * inv);
    } else {
      ACC ls = log(s);
      for (long j = 0; j < len; ++j) y[j * inner] = ST((ACC)LD(x[j * inner]) - m - ls);
    }
  } else {
    ACC s = (ACC)0;
    if (mode == 2) {
      for (long j = 0; j < len; ++j) s += (ACC)LD(g[j * inner]) * (ACC)LD(x[j * inner]);
      for (long j = 0; j < len; ++j) {
        ACC yv = (ACC)LD(x[j * inner]);
        y[j * inner] = ST(yv * ((ACC)LD(g[j * inner]) - s));
      }
    } else {
      for (long j = 0; j < len; ++j) s += (ACC)LD(g[j * inner]);
      for (long j = 0; j < len; ++j)
        y[j * inner] = ST((ACC)LD(g[j * inner]) - exp((ACC)LD(x[j * inner])) * s);
    }
  }
}

__kernel void bp_softmax_tree(__global T* out, __global const T* a, __global const T* b,
                              long outer, long len, long inner, long o_off, long a_off,
                              long b_off, int mode, __local ACC* scratch) {
  long r = get_group_id(0);
  int lid = (int)get_local_id(0), L = (int)get_local_size(0);
  long u = r / inner, v = r - u * inner;
  long base = u * len * inner + v;
  __global const T* x = a + a_off + base;
  __global const T* g = b + b_off + base;
  __global T* y = out + o_off + base;
  if (mode < 2) {
    ACC m = (ACC)(-INFINITY);
    for (long j = lid; j < len; j += L) m = BP_MAX((ACC)LD(x[j * inner]), m);
    m = bp_group_reduce(m, 1, scratch);
    ACC s = (ACC)0;
    for (long j = lid; j < len; j += L) s += exp((ACC)LD(x[j * inner]) - m);
    s = bp_group_reduce(s, 0, scratch);
    if (mode == 0) {
      ACC inv = (ACC)1 / s;
      for (long j = lid; j < len; j += L) y[j * inner] = ST(exp((ACC)LD(x[j * inner]) - m) * inv);
    } else {
      ACC ls = log(s);
      for (long j = lid; j < len; j += L) y[j * inner] = ST((ACC)LD(x[j * inner]) - m - ls);
    }
  } else {
    ACC s = (ACC)0;
    for (long j = lid; j < len; j += L)
      s += mode == 2 ? (ACC)LD(g[j * inner]) * (ACC)LD(x[j * inner]) : (ACC)LD(g[j * inner]);
    s = bp_group_reduce(s, 0, scratch);
    for (long j = lid; j < len; j += L) {
      ACC yv = (ACC)LD(x[j * inner]), gv = (ACC)LD(g[j * inner]);
      y[j * inner] = ST(mode == 2 ? yv * (gv - s) : gv - exp(yv) * s);
    }
  }
}
)CLC";

int mode_of(Op op) {
  switch (op) {
    case Op::kSoftmax:
      return 0;
    case Op::kLogSoftmax:
      return 1;
    case Op::kSoftmaxBackward:
      return 2;
    default:
      return 3;
  }
}

}  // namespace

std::string softmax_source(int32_t dtype, bool fp64) {
  std::string s = kernel_prelude(dtype, fp64);
  s += sdk::format("#define ACC %s\n", dtype == BP_DTYPE_F64 ? "double" : "float");
  s += group_reduce_source();
  s += kSoftmaxSource;
  return s;
}

void create_softmax_kernels(bp_kernel& k, cl_program program) {
  for (const char* name : {"bp_softmax_rows", "bp_softmax_tree"}) {
    cl_kernel kernel = create_kernel(k, program, name);
    k.kernels.push_back(kernel);
    k.local_size.push_back(pick_local_size(kernel, *k.device, 256));
  }
}

void launch_softmax(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in, int32_t num_in,
                    const bp_tensor_desc* out, int32_t num_out, const sdk::Attrs& attrs) {
  const int mode = mode_of(k.op);
  const bool backward = mode >= 2;
  check_counts(k, num_in, num_out, backward ? 2 : 1, backward ? 2 : 1, 1, 1);
  const bp_tensor_desc &a = in[0], &o = out[0];
  const int64_t a_off = dense_offset(k, a, k.dtype, -1, backward ? "input 0 (y)" : "input 0 (x)");
  const int64_t o_off = dense_offset(k, o, k.dtype, a.rank, "output");
  check_same_shape(k, a, o, backward ? "input 0 (y)" : "input 0 (x)");
  int64_t b_off = a_off;
  if (backward) {
    b_off = dense_offset(k, in[1], k.dtype, a.rank, "input 1 (dy)");
    check_same_shape(k, in[1], o, "input 1 (dy)");
  }
  if (!attrs.has(BP_ATTR_ID_AXIS)) fail_launch(k, "attribute axis is required");
  const int64_t axis = attrs.i(BP_ATTR_ID_AXIS);
  if (axis < 0 || axis >= std::max<int32_t>(a.rank, 1))
    fail_launch(k, sdk::format("axis %lld is outside [0, %d) for %s", static_cast<long long>(axis),
                               a.rank, shape_string(a).c_str()));
  int64_t outer = 1, inner = 1, len = a.rank ? a.shape[axis] : 1;
  for (int32_t d = 0; d < a.rank; ++d) {
    if (d < axis) outer *= a.shape[d];
    if (d > axis) inner *= a.shape[d];
  }
  const int64_t rows = outer * inner;
  if (rows == 0 || len == 0) return;
  const bp_buffer* b = backward ? in[1].buffer : a.buffer;
  const bool tree = len > 64 && rows < 65536;
  const int slot = tree ? 1 : 0;
  size_t local = k.local_size[static_cast<size_t>(slot)];
  size_t global =
      tree ? static_cast<size_t>(rows) * local : grid_size(static_cast<uint64_t>(rows), local);
  std::lock_guard<std::mutex> lock(k.mutex);
  KernelArgs args(k.kernels[static_cast<size_t>(slot)]);
  args.mem(o.buffer).mem(a.buffer).mem(b);
  for (int64_t v : {outer, len, inner, o_off, a_off, b_off}) args.value(static_cast<cl_long>(v));
  args.value(static_cast<cl_int>(mode));
  if (tree) args.local(local * (k.dtype == BP_DTYPE_F64 ? 8 : 4));
  enqueue_kernel(lc, k, static_cast<size_t>(slot), 1, &global, &local);
}

}  // namespace bp::opencl
