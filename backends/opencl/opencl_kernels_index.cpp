// Indexing along an axis: max_dim / min_dim (values and I64 indices), gather and scatter_add.
//
// Note [Index kernels]
//   - max_dim / min_dim: x viewed as [outer, len, inner]; one work-item per (outer, inner) walks
//     the axis and keeps the first extreme (a NaN counts as the extreme, its first position).
//   - gather: one work-item per output element.
//   - scatter_add: the catalogue fixes the order of the contributions to one element (row-major
//     order of src) so that every device gives the same bits. Contributions to one out element
//     share every coordinate of src but the axis, so one work-item per line of src along the
//     axis adds its line in order; lines write disjoint elements, so there are no atomics and no
//     races. f16/bf16 add in a float copy of out (from the caching allocator) and round once;
//     integers wrap.
//   - Index errors: the catalogue requires an index outside [0, x.shape[axis]) to fail the
//     launch naming the index, its position and the size. The kernels raise a flag in a small
//     buffer (out-of-range elements are skipped); the launch reads it back, which waits for the
//     kernel, and only when it is raised reads the index tensor to name the first bad one.
#include "opencl_allocator.hpp"
#include "opencl_kernels.hpp"

#include <vector>

namespace bp::opencl {
namespace {

constexpr const char* kMinMaxTemplate = R"CLC(
__kernel void bp_$OP(__global T* vals, __global long* idx, __global const T* x, long outer,
                     long len, long inner, long x_off, long v_off, long i_off) {
  long o = get_global_id(0);
  if (o >= outer * inner) return;
  long a = o / inner, b = o - a * inner;
  __global const T* row = x + x_off + a * len * inner + b;
  T braw = row[0];
  C best = LD(braw);
  long bi = 0;
  for (long j = 1; j < len; ++j) {
    T raw = row[j * inner];
    C v = LD(raw);
    if (BP_BETTER(v, best)) {
      best = v;
      braw = raw;
      bi = j;
    }
  }
  vals[v_off + o] = braw;
  idx[i_off + o] = bi;
}
)CLC";

constexpr const char* kGatherSource = R"CLC(
typedef struct {
  long shape[8]; /* out's and index's shape */
  long xst[8];   /* x's strides, dense */
  long ost[8];   /* out's strides, dense */
  long rank, axis, xlen, n;
  long x_off, i_off, o_off;
} bp_gx;

__kernel void bp_gather(__global T* out, __global const T* x, __global const long* index,
                        __global int* bad, bp_gx g) {
  long i = get_global_id(0);
  if (i >= g.n) return;
  long ix = index[g.i_off + i];
  if (ix < 0 || ix >= g.xlen) {
    *bad = 1;
    out[g.o_off + i] = (T)0;
    return;
  }
  long off = g.x_off, r = i;
  for (int d = (int)g.rank - 1; d >= 0; --d) {
    long s = g.shape[d];
    long q = r / s, c = r - q * s;
    off += (d == g.axis ? ix : c) * g.xst[d];
    r = q;
  }
  out[g.o_off + i] = x[off];
}
)CLC";

constexpr const char* kScatterSource = R"CLC(
typedef struct {
  long shape[8]; /* src's and index's shape */
  long sst[8];   /* src's strides, dense */
  long ost[8];   /* out's strides, dense */
  long rank, axis, olen, nlines;
  long s_off, i_off, o_off;
} bp_sx;

/* One line of src along the axis, added in order (Note [Index kernels]). acc is out itself, or
   its float copy for f16/bf16 (then a_off is 0). */
__kernel void bp_scatter_add(__global A* acc, __global const T* src, __global const long* index,
                             __global int* bad, bp_sx g, long a_off) {
  long l = get_global_id(0);
  if (l >= g.nlines) return;
  long s_base = g.s_off, o_base = a_off, r = l;
  for (int d = (int)g.rank - 1; d >= 0; --d) {
    if (d == g.axis) continue;
    long s = g.shape[d];
    long q = r / s, c = r - q * s;
    s_base += c * g.sst[d];
    o_base += c * g.ost[d];
    r = q;
  }
  long len = g.shape[g.axis], ss = g.sst[g.axis], os = g.ost[g.axis];
  long i_base = s_base - g.s_off + g.i_off;
  for (long j = 0; j < len; ++j) {
    long ix = index[i_base + j * ss];
    if (ix < 0 || ix >= g.olen) {
      *bad = 1;
      continue;
    }
    long o = o_base + ix * os;
    acc[o] = BP_ADD(acc[o], LD(src[s_base + j * ss]));
  }
}

#if BP_NARROW
__kernel void bp_scatter_widen(__global float* acc, __global const T* base, long b_off, long n) {
  long i = get_global_id(0);
  if (i < n) acc[i] = LD(base[b_off + i]);
}
__kernel void bp_scatter_narrow(__global T* out, __global const float* acc, long o_off, long n) {
  long i = get_global_id(0);
  if (i < n) out[o_off + i] = ST(acc[i]);
}
#endif
)CLC";

bool has(Op op, int32_t dtype) {
  return (op_info(op).dtypes >> dtype) & 1u;
}

bool narrow(int32_t dtype) {
  return dtype == BP_DTYPE_F16 || dtype == BP_DTYPE_BF16;
}

// Host mirrors of bp_gx and bp_sx.
struct ClGather {
  int64_t shape[BP_MAX_RANK], xst[BP_MAX_RANK], ost[BP_MAX_RANK];
  int64_t rank, axis, xlen, n;
  int64_t x_off, i_off, o_off;
};
struct ClScatter {
  int64_t shape[BP_MAX_RANK], sst[BP_MAX_RANK], ost[BP_MAX_RANK];
  int64_t rank, axis, olen, nlines;
  int64_t s_off, i_off, o_off;
};

int64_t axis_attr(const bp_kernel& k, const sdk::Attrs& attrs, const bp_tensor_desc& t) {
  if (!attrs.has(BP_ATTR_ID_AXIS)) fail_launch(k, "attribute axis is required");
  int64_t axis = attrs.i(BP_ATTR_ID_AXIS);
  if (axis < 0 || axis >= t.rank)
    fail_launch(k, sdk::format("axis %lld is outside [0, %d) for %s", static_cast<long long>(axis),
                               t.rank, shape_string(t).c_str()));
  return axis;
}

// "[1, 0, 2]": the multi-index of row-major position i of shape.
std::string position(const bp_tensor_desc& t, int64_t i) {
  std::vector<int64_t> c(static_cast<size_t>(t.rank));
  for (int32_t d = t.rank - 1; d >= 0; --d) {
    c[static_cast<size_t>(d)] = i % t.shape[d];
    i /= t.shape[d];
  }
  std::string s = "[";
  for (size_t d = 0; d < c.size(); ++d)
    s += sdk::format("%s%lld", d ? ", " : "", static_cast<long long>(c[d]));
  return s + "]";
}

// Reads the flag the kernel raised; when raised, finds the first index outside [0, size) and
// fails naming it (Note [Index kernels]).
void check_flag(const bp_kernel& k, const LaunchContext& lc, const ErrorFlag& flag,
                const bp_tensor_desc& index, int64_t i_off, int64_t size) {
  if (!flag.raised(k)) return;
  const int64_t n = sdk::numel(index);
  const std::vector<int64_t> host = read_indices(k, lc, index, i_off, n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t v = host[static_cast<size_t>(i)];
    if (v < 0 || v >= size)
      fail_launch(k, sdk::format("index %lld at position %s of index %s is outside [0, %lld)",
                                 static_cast<long long>(v), position(index, i).c_str(),
                                 shape_string(index).c_str(), static_cast<long long>(size)));
  }
  fail_launch(k, "the kernel reported an index out of range but none was found on re-reading");
}

void launch_minmax(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in,
                   const bp_tensor_desc* out, const sdk::Attrs& attrs) {
  const bp_tensor_desc &x = in[0], &v = out[0], &ix = out[1];
  const int64_t x_off = dense_offset(k, x, k.dtype, -1, "input 0 (x)");
  const int64_t v_off = dense_offset(k, v, k.dtype, x.rank, "output 0 (values)");
  const int64_t i_off = dense_offset(k, ix, BP_DTYPE_I64, x.rank, "output 1 (indices)");
  const int64_t axis = axis_attr(k, attrs, x);
  check_same_shape(k, ix, v, "output 1 (indices)");
  int64_t outer = 1, inner = 1;
  for (int32_t d = 0; d < x.rank; ++d) {
    bool ok = d == axis ? v.shape[d] == 1 : v.shape[d] == x.shape[d];
    if (!ok)
      fail_launch(k, sdk::format("values %s must be x %s with extent 1 on axis %lld",
                                 shape_string(v).c_str(), shape_string(x).c_str(),
                                 static_cast<long long>(axis)));
    if (d < axis) outer *= x.shape[d];
    if (d > axis) inner *= x.shape[d];
  }
  const int64_t len = x.shape[axis];
  if (outer * inner == 0) return;
  if (len == 0)
    fail_launch(k, sdk::format("the axis %lld of x %s is empty", static_cast<long long>(axis),
                               shape_string(x).c_str()));
  size_t local = k.local_size[0];
  size_t global = grid_size(static_cast<uint64_t>(outer * inner), local);
  std::lock_guard<std::mutex> lock(k.mutex);
  KernelArgs a(k.kernels[0]);
  a.mem(v.buffer).mem(ix.buffer).mem(x.buffer);
  for (int64_t val : {outer, len, inner, x_off, v_off, i_off}) a.value(static_cast<cl_long>(val));
  enqueue_kernel(lc, k, 0, 1, &global, &local);
}

void set_dense_strides(int64_t* st, const bp_tensor_desc& t) {
  int64_t e = 1;
  for (int32_t d = t.rank - 1; d >= 0; --d) {
    st[d] = e;
    e *= t.shape[d];
  }
}

void launch_gather(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in,
                   const bp_tensor_desc* out, const sdk::Attrs& attrs) {
  const bp_tensor_desc &x = in[0], &index = in[1], &o = out[0];
  ClGather g{};
  g.x_off = dense_offset(k, x, k.dtype, -1, "input 0 (x)");
  g.i_off = dense_offset(k, index, BP_DTYPE_I64, x.rank, "input 1 (index)");
  g.o_off = dense_offset(k, o, k.dtype, x.rank, "output");
  check_same_shape(k, index, o, "input 1 (index)");
  g.axis = axis_attr(k, attrs, x);
  for (int32_t d = 0; d < x.rank; ++d)
    if (d != g.axis && index.shape[d] > x.shape[d])
      fail_launch(k, sdk::format("index %s is larger than x %s in dimension %d",
                                 shape_string(index).c_str(), shape_string(x).c_str(), d));
  g.rank = x.rank;
  for (int32_t d = 0; d < x.rank; ++d) g.shape[d] = index.shape[d];
  set_dense_strides(g.xst, x);
  set_dense_strides(g.ost, o);
  g.xlen = x.shape[g.axis];
  g.n = sdk::numel(o);
  if (g.n == 0) return;
  const ErrorFlag flag(k, lc);
  size_t local = k.local_size[0];
  size_t global = grid_size(static_cast<uint64_t>(g.n), local);
  {
    std::lock_guard<std::mutex> lock(k.mutex);
    KernelArgs(k.kernels[0]).mem(o.buffer).mem(x.buffer).mem(index.buffer).mem(flag.buf()).value(g);
    enqueue_kernel(lc, k, 0, 1, &global, &local);
  }
  check_flag(k, lc, flag, index, g.i_off, g.xlen);
}

void launch_scatter_add(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in,
                        const bp_tensor_desc* out, const sdk::Attrs& attrs) {
  const bp_tensor_desc &base = in[0], &index = in[1], &src = in[2], &o = out[0];
  ClScatter g{};
  const int64_t b_off = dense_offset(k, base, k.dtype, -1, "input 0 (base)");
  g.i_off = dense_offset(k, index, BP_DTYPE_I64, base.rank, "input 1 (index)");
  g.s_off = dense_offset(k, src, k.dtype, base.rank, "input 2 (src)");
  g.o_off = dense_offset(k, o, k.dtype, base.rank, "output");
  check_same_shape(k, base, o, "input 0 (base)");
  if (index.rank != src.rank) check_same_shape(k, index, src, "input 1 (index)");
  for (int32_t d = 0; d < src.rank; ++d)
    if (index.shape[d] != src.shape[d])
      fail_launch(k, sdk::format("index %s and src %s must have one shape",
                                 shape_string(index).c_str(), shape_string(src).c_str()));
  g.axis = axis_attr(k, attrs, base);
  for (int32_t d = 0; d < base.rank; ++d)
    if (d != g.axis && src.shape[d] > base.shape[d])
      fail_launch(k, sdk::format("src %s is larger than base %s in dimension %d",
                                 shape_string(src).c_str(), shape_string(base).c_str(), d));
  const bool inplace = attrs.i(BP_ATTR_ID_INPLACE, 0) != 0;
  g.rank = src.rank;
  for (int32_t d = 0; d < src.rank; ++d) g.shape[d] = src.shape[d];
  set_dense_strides(g.sst, src);
  set_dense_strides(g.ost, o);
  g.olen = o.shape[g.axis];
  const int64_t n_out = sdk::numel(o), n_src = sdk::numel(src);
  const int64_t len = src.shape[g.axis];
  g.nlines = len ? n_src / len : 0;
  if (n_out == 0) return;
  const size_t es = bp_dtype_size(k.dtype);
  const bool wide = narrow(k.dtype);
  TempBuffer acc(lc, wide && n_src ? static_cast<uint64_t>(n_out) * 4 : 0);
  const ErrorFlag flag(k, lc);
  {
    std::lock_guard<std::mutex> lock(k.mutex);
    if (wide && n_src) {
      size_t local = k.local_size[1];
      size_t global = grid_size(static_cast<uint64_t>(n_out), local);
      KernelArgs(k.kernels[1])
          .mem(acc.buf)
          .mem(base.buffer)
          .value(static_cast<cl_long>(b_off))
          .value(static_cast<cl_long>(n_out));
      enqueue_kernel(lc, k, 1, 1, &global, &local);
    } else if (!inplace && (base.buffer != o.buffer || b_off != g.o_off)) {
      BP_CL_CHECK(
          clEnqueueCopyBuffer(lc.queue, base.buffer->mem, o.buffer->mem,
                              static_cast<size_t>(b_off) * es, static_cast<size_t>(g.o_off) * es,
                              static_cast<size_t>(n_out) * es, 0, nullptr, nullptr),
          op_label(k) + ": copying base to out");
    }
    if (n_src == 0) return;
    size_t local = k.local_size[0];
    size_t global = grid_size(static_cast<uint64_t>(g.nlines), local);
    KernelArgs(k.kernels[0])
        .mem(wide ? acc.buf : o.buffer)
        .mem(src.buffer)
        .mem(index.buffer)
        .mem(flag.buf())
        .value(g)
        .value(static_cast<cl_long>(wide ? 0 : g.o_off));
    enqueue_kernel(lc, k, 0, 1, &global, &local);
    if (wide) {
      size_t local2 = k.local_size[2];
      size_t global2 = grid_size(static_cast<uint64_t>(n_out), local2);
      KernelArgs(k.kernels[2])
          .mem(o.buffer)
          .mem(acc.buf)
          .value(static_cast<cl_long>(g.o_off))
          .value(static_cast<cl_long>(n_out));
      enqueue_kernel(lc, k, 2, 1, &global2, &local2);
    }
  }
  check_flag(k, lc, flag, index, g.i_off, g.olen);
}

}  // namespace

std::string index_source(int32_t dtype, bool fp64) {
  std::string s = kernel_prelude(dtype, fp64);
  const bool fp = is_floating(dtype);
  s += sdk::format("#define BP_NARROW %d\n", narrow(dtype) ? 1 : 0);
  if (has(Op::kMaxDim, dtype)) {
    for (Op op : {Op::kMaxDim, Op::kMinDim}) {
      std::string t = kMinMaxTemplate;
      const char* cmp = op == Op::kMaxDim ? ">" : "<";
      std::string better = fp ? sdk::format("((v) %s (b) || (isnan(v) && !isnan(b)))", cmp)
                              : sdk::format("((v) %s (b))", cmp);
      replace_all(t, "BP_BETTER(v, best)",
                  "BP_BETTER_" + std::string(op_info(op).name) + "(v, best)");
      s += sdk::format("#define BP_BETTER_%s(v, b) %s\n", op_info(op).name, better.c_str());
      replace_all(t, "$OP", op_info(op).name);
      s += t;
    }
  }
  s += kGatherSource;
  if (has(Op::kScatterAdd, dtype)) {
    if (narrow(dtype)) {
      s += "#define A float\n#define BP_ADD(a, b) ((a) + (b))\n";
    } else if (fp) {
      s += "#define A T\n#define BP_ADD(a, b) ((a) + (b))\n";
    } else {
      s += "#define A T\n#define BP_ADD(a, b) ((T)((UC)(a) + (UC)(b)))\n";
    }
    s += kScatterSource;
  }
  return s;
}

void create_index_kernels(bp_kernel& k, cl_program program) {
  std::vector<const char*> names;
  switch (k.op) {
    case Op::kMaxDim:
      names = {"bp_max_dim"};
      break;
    case Op::kMinDim:
      names = {"bp_min_dim"};
      break;
    case Op::kGather:
      names = {"bp_gather"};
      break;
    default:
      names = {"bp_scatter_add"};
      if (narrow(k.dtype)) {
        names.push_back("bp_scatter_widen");
        names.push_back("bp_scatter_narrow");
      }
      break;
  }
  for (const char* name : names) {
    cl_kernel kernel = create_kernel(k, program, name);
    k.kernels.push_back(kernel);
    k.local_size.push_back(pick_local_size(kernel, *k.device, 256));
  }
}

void launch_index(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in, int32_t num_in,
                  const bp_tensor_desc* out, int32_t num_out, const sdk::Attrs& attrs) {
  switch (k.op) {
    case Op::kMaxDim:
    case Op::kMinDim:
      check_counts(k, num_in, num_out, 1, 1, 2, 2);
      return launch_minmax(k, lc, in, out, attrs);
    case Op::kGather:
      check_counts(k, num_in, num_out, 2, 2, 1, 1);
      return launch_gather(k, lc, in, out, attrs);
    default:
      check_counts(k, num_in, num_out, 3, 3, 1, 1);
      return launch_scatter_add(k, lc, in, out, attrs);
  }
}

}  // namespace bp::opencl
