// The transformer family but attention (Note [Op catalogue], minor 5): layer_norm and its
// backward, gelu, silu and their backward, embedding and its backward, triu, tril and cumsum.
// (sin, cos and rsqrt are elementwise ops; attention is opencl_kernels_attention.cpp.)
//
// Note [Transformer kernels]
//   Every tensor is dense; ACC is the accumulation type (double for f64, float otherwise) and
//   SST the stats type (layer_norm's mean and rstd: float for f16/bf16, the dtype otherwise).
//   - layer_norm: one work-group per row, two passes (the mean, then the sum of squared
//     deviations from it: a row shifted far from zero keeps its variance, which E[x^2] - E[x]^2
//     would lose), each a strided loop plus a local-memory tree.
//   - layer_norm_backward: dx by one work-group per row (the sums of g and g xhat); dweight and
//     dbias in two passes without atomics: one work-item per (block of kRowBlock rows, column)
//     sums its block into a temporary [blocks, N] in ACC, then one work-item per column adds the
//     blocks in order and rounds once. The order is fixed, so the bits are the same on every
//     run and device.
//   - gelu, silu and their backward: one work-item per element (mode 0 exact gelu, 1 tanh gelu,
//     2 silu).
//   - embedding: one work-item per output element; an index outside [0, V) raises a flag (the
//     element is written 0), which the launch reads back, as gather does (Note [Index kernels]).
//   - embedding_backward: deterministic without float atomics. The launch reads the indices
//     (which waits for the work that made them), checks them, and sorts the positions m by row
//     with a stable counting sort on the host (rows[V + 1] and order[M]); one work-item per
//     element of dweight then adds its row's contributions in increasing m, in the compute type,
//     and rounds once. Rows no index names get exact zeros.
//   - triu, tril: one work-item per element, storage copied or zeroed (every dtype, NaN
//     payloads kept).
//   - cumsum: one work-item per line along the axis, added in order in the compute type
//     (integers in the unsigned type: they wrap).
#include "opencl_allocator.hpp"
#include "opencl_kernels.hpp"

#include <bit>
#include <cmath>
#include <vector>

namespace bp::opencl {
namespace {

constexpr const char* kTransformerSource = R"CLC(
/* Tree sum of the work-group's values; every work-item gets the result. */
ACC bp_group_sum(ACC v, __local ACC* scratch) {
  int lid = (int)get_local_id(0), L = (int)get_local_size(0);
  barrier(CLK_LOCAL_MEM_FENCE);
  scratch[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int w = L >> 1; w > 0; w >>= 1) {
    if (lid < w) scratch[lid] += scratch[lid + w];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  return scratch[0];
}

/* flags: 1 weight, 2 bias, 4 mean and rstd written. */
__kernel void bp_layer_norm(__global T* y, __global const T* x, __global const T* w,
                            __global const T* b, __global SST* mean_out, __global SST* rstd_out,
                            long N, long y_off, long x_off, long w_off, long b_off, long m_off,
                            long r_off, int flags, ACC eps, __local ACC* scratch) {
  long row = get_group_id(0);
  int lid = (int)get_local_id(0), L = (int)get_local_size(0);
  __global const T* xr = x + x_off + row * N;
  __global T* yr = y + y_off + row * N;
  ACC s = (ACC)0;
  for (long j = lid; j < N; j += L) s += (ACC)LD(xr[j]);
  ACC mean = bp_group_sum(s, scratch) / (ACC)N;
  ACC sq = (ACC)0;
  for (long j = lid; j < N; j += L) {
    ACC d = (ACC)LD(xr[j]) - mean;
    sq += d * d;
  }
  ACC rstd = (ACC)1 / sqrt(bp_group_sum(sq, scratch) / (ACC)N + eps);
  for (long j = lid; j < N; j += L) {
    ACC v = ((ACC)LD(xr[j]) - mean) * rstd;
    if (flags & 1) v *= (ACC)LD(w[w_off + j]);
    if (flags & 2) v += (ACC)LD(b[b_off + j]);
    yr[j] = ST(v);
  }
  if ((flags & 4) && lid == 0) {
    mean_out[m_off + row] = (SST)mean;
    rstd_out[r_off + row] = (SST)rstd;
  }
}

__kernel void bp_layer_norm_bwd_dx(__global T* dx, __global const T* dy, __global const T* x,
                                   __global const SST* mean, __global const SST* rstd,
                                   __global const T* w, long N, long dx_off, long dy_off,
                                   long x_off, long m_off, long r_off, long w_off, int has_w,
                                   __local ACC* scratch) {
  long row = get_group_id(0);
  int lid = (int)get_local_id(0), L = (int)get_local_size(0);
  __global const T* xr = x + x_off + row * N;
  __global const T* gr = dy + dy_off + row * N;
  ACC mu = (ACC)mean[m_off + row], rs = (ACC)rstd[r_off + row];
  ACC sg = (ACC)0, sgx = (ACC)0;
  for (long j = lid; j < N; j += L) {
    ACC g = (ACC)LD(gr[j]);
    if (has_w) g *= (ACC)LD(w[w_off + j]);
    sg += g;
    sgx += g * (((ACC)LD(xr[j]) - mu) * rs);
  }
  sg = bp_group_sum(sg, scratch) / (ACC)N;
  sgx = bp_group_sum(sgx, scratch) / (ACC)N;
  for (long j = lid; j < N; j += L) {
    ACC g = (ACC)LD(gr[j]);
    if (has_w) g *= (ACC)LD(w[w_off + j]);
    ACC xhat = ((ACC)LD(xr[j]) - mu) * rs;
    dx[dx_off + row * N + j] = ST(rs * (g - sg - xhat * sgx));
  }
}

/* dweight and dbias, pass 1: the sums over rows [blk rb, (blk + 1) rb) of column j, for every
 * (blk, j), into pw and pb [nb, N]. */
__kernel void bp_layer_norm_bwd_dw(__global ACC* pw, __global ACC* pb, __global const T* dy,
                                   __global const T* x, __global const SST* mean,
                                   __global const SST* rstd, long M, long N, long rb, long nb,
                                   long dy_off, long x_off, long m_off, long r_off) {
  long e = get_global_id(0);
  if (e >= nb * N) return;
  long blk = e / N, j = e - blk * N;
  long m1 = min(M, (blk + 1) * rb);
  ACC sw = (ACC)0, sb = (ACC)0;
  for (long m = blk * rb; m < m1; ++m) {
    ACC g = (ACC)LD(dy[dy_off + m * N + j]);
    ACC xhat = ((ACC)LD(x[x_off + m * N + j]) - (ACC)mean[m_off + m]) * (ACC)rstd[r_off + m];
    sw += g * xhat;
    sb += g;
  }
  pw[e] = sw;
  pb[e] = sb;
}

/* Pass 2: the nb partial sums of column j, added in block order, rounded once. */
__kernel void bp_layer_norm_bwd_dw_sum(__global T* dw, __global T* db, __global const ACC* pw,
                                       __global const ACC* pb, long nb, long N, long dw_off,
                                       long db_off) {
  long j = get_global_id(0);
  if (j >= N) return;
  ACC sw = (ACC)0, sb = (ACC)0;
  for (long b = 0; b < nb; ++b) {
    sw += pw[b * N + j];
    sb += pb[b * N + j];
  }
  dw[dw_off + j] = ST(sw);
  db[db_off + j] = ST(sb);
}

/* mode 0 gelu (exact), 1 gelu (tanh), 2 silu; backward: dy * f'(x). */
__kernel void bp_activation(__global T* out, __global const T* x, __global const T* dy,
                            long o_off, long x_off, long g_off, int mode, int backward, long n) {
  long i = get_global_id(0);
  if (i >= n) return;
  ACC v = (ACC)LD(x[x_off + i]), r;
  if (mode == 0) {
    ACC cdf = K(0.5) * ((ACC)1 + erf(v * K(0.70710678118654752440)));
    r = backward ? cdf + v * K(0.39894228040143267794) * exp(K(-0.5) * v * v) : v * cdf;
  } else if (mode == 1) {
    ACC t = tanh(K(0.79788456080286535588) * (v + K(0.044715) * v * v * v));
    if (backward) {
      ACC du = K(0.79788456080286535588) * ((ACC)1 + K(3.0) * K(0.044715) * v * v);
      r = K(0.5) * ((ACC)1 + t) + K(0.5) * v * ((ACC)1 - t * t) * du;
    } else {
      r = K(0.5) * v * ((ACC)1 + t);
    }
  } else {
    ACC s = (ACC)1 / ((ACC)1 + exp(-v));
    r = backward ? s * ((ACC)1 + v * ((ACC)1 - s)) : v * s;
  }
  if (backward) r *= (ACC)LD(dy[g_off + i]);
  out[o_off + i] = ST(r);
}

__kernel void bp_embedding(__global T* out, __global const T* w, __global const long* idx,
                           __global int* flag, long M, long D, long V, long o_off, long w_off,
                           long i_off) {
  long e = get_global_id(0);
  if (e >= M * D) return;
  long m = e / D, j = e - m * D;
  long t = idx[i_off + m];
  if (t < 0 || t >= V) {
    flag[0] = 1;
    out[o_off + e] = (T)0;
    return;
  }
  out[o_off + e] = w[w_off + t * D + j];
}

__kernel void bp_embedding_bwd(__global T* dw, __global const T* dy, __global const long* rows,
                               __global const long* order, long V, long D, long dw_off,
                               long dy_off) {
  long e = get_global_id(0);
  if (e >= V * D) return;
  long v = e / D, j = e - v * D;
  ACC acc = (ACC)0;
  for (long q = rows[v]; q < rows[v + 1]; ++q) acc += (ACC)LD(dy[dy_off + order[q] * D + j]);
  dw[dw_off + e] = ST(acc);
}

__kernel void bp_triangle(__global T* out, __global const T* x, long R, long Cn, long o_off,
                          long x_off, long diagonal, int upper, long n) {
  long i = get_global_id(0);
  if (i >= n) return;
  long c = i % Cn, r = (i / Cn) % R;
  int keep = upper ? c - r >= diagonal : c - r <= diagonal;
  out[o_off + i] = keep ? x[x_off + i] : (T)0;
}

__kernel void bp_cumsum(__global T* out, __global const T* x, long outer, long len, long inner,
                        long o_off, long x_off) {
  long r = get_global_id(0);
  if (r >= outer * inner) return;
  long u = r / inner, v = r - u * inner;
  long base = u * len * inner + v;
#ifdef BP_INT
  UC acc = (UC)0;
  for (long j = 0; j < len; ++j) {
    acc += (UC)LD(x[x_off + base + j * inner]);
    out[o_off + base + j * inner] = ST((C)acc);
  }
#else
  C acc = (C)0;
  for (long j = 0; j < len; ++j) {
    acc += LD(x[x_off + base + j * inner]);
    out[o_off + base + j * inner] = ST(acc);
  }
#endif
}
)CLC";

// Kernel slots of each op.
enum Slot : size_t {
  kMain = 0,    // the op's kernel (layer_norm_backward: dx)
  kSecond = 1,  // layer_norm_backward: dweight and dbias, partial sums per row block
  kThird = 2,   // layer_norm_backward: dweight and dbias, the blocks added in order
};

// Rows per block of layer_norm_backward's dweight and dbias sums: fixed, so the order of the
// additions (and the bits) is the same on every device and run.
constexpr int64_t kRowBlock = 64;

const char* kernel_of(Op op) {
  switch (op) {
    case Op::kLayerNorm:
      return "bp_layer_norm";
    case Op::kLayerNormBackward:
      return "bp_layer_norm_bwd_dx";
    case Op::kEmbedding:
      return "bp_embedding";
    case Op::kEmbeddingBackward:
      return "bp_embedding_bwd";
    case Op::kTriu:
    case Op::kTril:
      return "bp_triangle";
    case Op::kCumsum:
      return "bp_cumsum";
    default:
      return "bp_activation";
  }
}

int32_t stat_dtype(int32_t dtype) {
  return dtype == BP_DTYPE_F16 || dtype == BP_DTYPE_BF16 ? BP_DTYPE_F32 : dtype;
}

// The ACC value `v` as a kernel argument of the dtype's accumulation type.
void acc_arg(const bp_kernel& k, KernelArgs& a, double v) {
  if (k.dtype == BP_DTYPE_F64) {
    a.value(v);
  } else {
    a.value(static_cast<float>(v));
  }
}

size_t acc_size(const bp_kernel& k) {
  return k.dtype == BP_DTYPE_F64 ? 8 : 4;
}

// Work-group size of a one-group-per-row kernel over rows of n: a power of two, no larger than
// the row needs.
size_t row_local(const bp_kernel& k, size_t slot, int64_t n) {
  const size_t cap = k.local_size[slot];
  if (n >= static_cast<int64_t>(cap)) return cap;
  return std::max<size_t>(1, std::bit_ceil(static_cast<size_t>(std::max<int64_t>(n, 1))));
}

void check_shape(const bp_kernel& k, const bp_tensor_desc& t, std::initializer_list<int64_t> want,
                 const char* role, const std::string& expected) {
  bool same = t.rank == static_cast<int32_t>(want.size());
  int32_t d = 0;
  for (int64_t w : want) same = same && t.shape[d++] == w;
  if (!same)
    fail_launch(k, sdk::format("%s has shape %s, expected %s", role, shape_string(t).c_str(),
                               expected.c_str()));
}

std::string dims(std::initializer_list<int64_t> v) {
  std::string s = "[";
  for (int64_t x : v)
    s += sdk::format("%s%lld", s.size() > 1 ? ", " : "", static_cast<long long>(x));
  return s + "]";
}

void launch_layer_norm(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in,
                       int32_t num_in, const bp_tensor_desc* out, int32_t num_out,
                       const sdk::Attrs& attrs) {
  check_counts(k, num_in, num_out, 1, 3, 1, 3);
  if (num_out == 2) fail_launch(k, "mean and rstd go together (1 or 3 outputs, got 2)");
  const bp_tensor_desc& x = in[0];
  const int64_t x_off = dense_offset(k, x, k.dtype, 2, "input 0 (x)");
  const int64_t M = x.shape[0], N = x.shape[1];
  const int32_t sdt = stat_dtype(k.dtype);
  const int64_t y_off = dense_offset(k, out[0], k.dtype, 2, "output 0 (y)");
  check_shape(k, out[0], {M, N}, "output 0 (y)", dims({M, N}));
  int64_t w_off = x_off, b_off = x_off, m_off = 0, r_off = 0;
  if (num_in > 1) {
    w_off = dense_offset(k, in[1], k.dtype, 1, "input 1 (weight)");
    check_shape(k, in[1], {N}, "input 1 (weight)", dims({N}));
  }
  if (num_in > 2) {
    b_off = dense_offset(k, in[2], k.dtype, 1, "input 2 (bias)");
    check_shape(k, in[2], {N}, "input 2 (bias)", dims({N}));
  }
  if (num_out == 3) {
    m_off = dense_offset(k, out[1], sdt, 1, "output 1 (mean)");
    r_off = dense_offset(k, out[2], sdt, 1, "output 2 (rstd)");
    check_shape(k, out[1], {M}, "output 1 (mean)", dims({M}));
    check_shape(k, out[2], {M}, "output 2 (rstd)", dims({M}));
  }
  if (M == 0) return;
  if (N == 0) fail_launch(k, "rows of 0 elements have no mean (N >= 1)");
  const double eps = attrs.f(BP_ATTR_ID_EPS, 1e-5);
  const cl_int flags = (num_in > 1 ? 1 : 0) | (num_in > 2 ? 2 : 0) | (num_out == 3 ? 4 : 0);
  size_t local = row_local(k, kMain, N);
  size_t global = static_cast<size_t>(M) * local;
  std::lock_guard<std::mutex> lock(k.mutex);
  KernelArgs a(k.kernels[kMain]);
  a.mem(out[0].buffer).mem(x.buffer).mem(num_in > 1 ? in[1].buffer : x.buffer);
  a.mem(num_in > 2 ? in[2].buffer : x.buffer);
  a.mem(num_out == 3 ? out[1].buffer : out[0].buffer);
  a.mem(num_out == 3 ? out[2].buffer : out[0].buffer);
  for (int64_t v : {N, y_off, x_off, w_off, b_off, m_off, r_off}) a.value(static_cast<cl_long>(v));
  a.value(flags);
  acc_arg(k, a, eps);
  a.local(local * acc_size(k));
  enqueue_kernel(lc, k, kMain, 1, &global, &local);
}

void launch_layer_norm_backward(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in,
                                int32_t num_in, const bp_tensor_desc* out, int32_t num_out) {
  check_counts(k, num_in, num_out, 4, 5, 1, 3);
  if ((num_in == 5) != (num_out == 3))
    fail_launch(k, sdk::format("dweight and dbias come with weight (%d inputs, %d outputs; "
                               "expected 4 and 1, or 5 and 3)",
                               num_in, num_out));
  const bp_tensor_desc& x = in[1];
  const int64_t x_off = dense_offset(k, x, k.dtype, 2, "input 1 (x)");
  const int64_t M = x.shape[0], N = x.shape[1];
  const int32_t sdt = stat_dtype(k.dtype);
  const std::string mn = dims({M, N}), m1 = dims({M}), n1 = dims({N});
  const int64_t dy_off = dense_offset(k, in[0], k.dtype, 2, "input 0 (dy)");
  check_shape(k, in[0], {M, N}, "input 0 (dy)", mn);
  const int64_t m_off = dense_offset(k, in[2], sdt, 1, "input 2 (mean)");
  check_shape(k, in[2], {M}, "input 2 (mean)", m1);
  const int64_t r_off = dense_offset(k, in[3], sdt, 1, "input 3 (rstd)");
  check_shape(k, in[3], {M}, "input 3 (rstd)", m1);
  const bool has_w = num_in == 5;
  int64_t w_off = x_off, dw_off = 0, db_off = 0;
  if (has_w) {
    w_off = dense_offset(k, in[4], k.dtype, 1, "input 4 (weight)");
    check_shape(k, in[4], {N}, "input 4 (weight)", n1);
    dw_off = dense_offset(k, out[1], k.dtype, 1, "output 1 (dweight)");
    check_shape(k, out[1], {N}, "output 1 (dweight)", n1);
    db_off = dense_offset(k, out[2], k.dtype, 1, "output 2 (dbias)");
    check_shape(k, out[2], {N}, "output 2 (dbias)", n1);
  }
  const int64_t dx_off = dense_offset(k, out[0], k.dtype, 2, "output 0 (dx)");
  check_shape(k, out[0], {M, N}, "output 0 (dx)", mn);
  std::lock_guard<std::mutex> lock(k.mutex);
  if (M > 0 && N > 0) {
    size_t local = row_local(k, kMain, N);
    size_t global = static_cast<size_t>(M) * local;
    KernelArgs a(k.kernels[kMain]);
    a.mem(out[0].buffer).mem(in[0].buffer).mem(x.buffer).mem(in[2].buffer).mem(in[3].buffer);
    a.mem(has_w ? in[4].buffer : x.buffer);
    for (int64_t v : {N, dx_off, dy_off, x_off, m_off, r_off, w_off})
      a.value(static_cast<cl_long>(v));
    a.value(static_cast<cl_int>(has_w ? 1 : 0)).local(local * acc_size(k));
    enqueue_kernel(lc, k, kMain, 1, &global, &local);
  }
  if (!has_w || N == 0) return;
  // Note [Transformer kernels]: row blocks of kRowBlock, then the blocks in order.
  const int64_t nb = std::max<int64_t>((M + kRowBlock - 1) / kRowBlock, 1);
  TempBuffer pw(lc, static_cast<uint64_t>(nb * N) * acc_size(k));
  TempBuffer pb(lc, static_cast<uint64_t>(nb * N) * acc_size(k));
  size_t local = k.local_size[kSecond];
  size_t global = grid_size(static_cast<uint64_t>(nb * N), local);
  KernelArgs a(k.kernels[kSecond]);
  a.mem(pw.buf).mem(pb.buf).mem(in[0].buffer).mem(x.buffer).mem(in[2].buffer).mem(in[3].buffer);
  for (int64_t v : {M, N, kRowBlock, nb, dy_off, x_off, m_off, r_off})
    a.value(static_cast<cl_long>(v));
  enqueue_kernel(lc, k, kSecond, 1, &global, &local);
  local = k.local_size[kThird];
  global = grid_size(static_cast<uint64_t>(N), local);
  KernelArgs f(k.kernels[kThird]);
  f.mem(out[1].buffer).mem(out[2].buffer).mem(pw.buf).mem(pb.buf);
  for (int64_t v : {nb, N, dw_off, db_off}) f.value(static_cast<cl_long>(v));
  enqueue_kernel(lc, k, kThird, 1, &global, &local);
}

void launch_activation(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in,
                       int32_t num_in, const bp_tensor_desc* out, int32_t num_out,
                       const sdk::Attrs& attrs) {
  const bool backward = k.op == Op::kGeluBackward || k.op == Op::kSiluBackward;
  check_counts(k, num_in, num_out, backward ? 2 : 1, backward ? 2 : 1, 1, 1);
  const bp_tensor_desc& x = in[0];
  const int64_t x_off = dense_offset(k, x, k.dtype, -1, "input 0 (x)");
  const int64_t o_off = dense_offset(k, out[0], k.dtype, x.rank, "output");
  check_same_shape(k, x, out[0], "input 0 (x)");
  int64_t g_off = x_off;
  if (backward) {
    g_off = dense_offset(k, in[1], k.dtype, x.rank, "input 1 (dy)");
    check_same_shape(k, in[1], out[0], "input 1 (dy)");
  }
  cl_int mode = 2;
  if (k.op == Op::kGelu || k.op == Op::kGeluBackward) {
    const int64_t approx = attrs.i(BP_ATTR_ID_APPROXIMATE, BP_GELU_EXACT);
    if (approx != BP_GELU_EXACT && approx != BP_GELU_TANH)
      fail_launch(k, sdk::format("attribute approximate is %lld; expected %d (exact) or %d (tanh)",
                                 static_cast<long long>(approx), BP_GELU_EXACT, BP_GELU_TANH));
    mode = approx == BP_GELU_TANH ? 1 : 0;
  }
  const int64_t n = sdk::numel(x);
  if (n == 0) return;
  size_t local = k.local_size[kMain];
  size_t global = grid_size(static_cast<uint64_t>(n), local);
  std::lock_guard<std::mutex> lock(k.mutex);
  KernelArgs a(k.kernels[kMain]);
  a.mem(out[0].buffer).mem(x.buffer).mem(backward ? in[1].buffer : x.buffer);
  for (int64_t v : {o_off, x_off, g_off}) a.value(static_cast<cl_long>(v));
  a.value(mode).value(static_cast<cl_int>(backward ? 1 : 0)).value(static_cast<cl_long>(n));
  enqueue_kernel(lc, k, kMain, 1, &global, &local);
}

[[noreturn]] void fail_index(const bp_kernel& k, int64_t t, int64_t m, int64_t V) {
  fail_launch(k, sdk::format("index %lld at position %lld is out of range for a table of %lld "
                             "rows (valid: 0 to %lld)",
                             static_cast<long long>(t), static_cast<long long>(m),
                             static_cast<long long>(V), static_cast<long long>(V - 1)));
}

void launch_embedding(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in,
                      int32_t num_in, const bp_tensor_desc* out, int32_t num_out) {
  check_counts(k, num_in, num_out, 2, 2, 1, 1);
  const bool backward = k.op == Op::kEmbeddingBackward;
  const bp_tensor_desc& idx = in[1];
  const int64_t i_off = dense_offset(k, idx, BP_DTYPE_I64, 1, "input 1 (indices)");
  const int64_t M = idx.shape[0];
  // forward: weight [V, D] -> out [M, D]; backward: dy [M, D] -> dweight [V, D].
  const bp_tensor_desc& table = backward ? out[0] : in[0];
  const bp_tensor_desc& rows = backward ? in[0] : out[0];
  const char* table_role = backward ? "output (dweight)" : "input 0 (weight)";
  const char* rows_role = backward ? "input 0 (dy)" : "output";
  const int64_t t_off = dense_offset(k, table, k.dtype, 2, table_role);
  const int64_t V = table.shape[0], D = table.shape[1];
  const int64_t r_off = dense_offset(k, rows, k.dtype, 2, rows_role);
  check_shape(k, rows, {M, D}, rows_role, dims({M, D}));
  if (!backward) {
    if (M == 0 || D == 0) return;
    const ErrorFlag flag(k, lc);
    std::lock_guard<std::mutex> lock(k.mutex);
    size_t local = k.local_size[kMain];
    size_t global = grid_size(static_cast<uint64_t>(M * D), local);
    KernelArgs a(k.kernels[kMain]);
    a.mem(out[0].buffer).mem(in[0].buffer).mem(idx.buffer).mem(flag.buf());
    for (int64_t v : {M, D, V, r_off, t_off, i_off}) a.value(static_cast<cl_long>(v));
    enqueue_kernel(lc, k, kMain, 1, &global, &local);
    if (!flag.raised(k)) return;
    const std::vector<int64_t> host = read_indices(k, lc, idx, i_off, M);
    for (int64_t m = 0; m < M; ++m)
      if (host[static_cast<size_t>(m)] < 0 || host[static_cast<size_t>(m)] >= V)
        fail_index(k, host[static_cast<size_t>(m)], m, V);
    fail_launch(k, "the kernel reported an index out of range but none was found on re-reading");
  }
  if (V == 0 || D == 0) return;
  // Note [Transformer kernels]: a stable counting sort of the positions by row.
  const std::vector<int64_t> host = read_indices(k, lc, idx, i_off, M);
  std::vector<cl_long> start(static_cast<size_t>(V) + 1, 0), order(std::max<int64_t>(M, 1));
  for (int64_t m = 0; m < M; ++m) {
    const int64_t t = host[static_cast<size_t>(m)];
    if (t < 0 || t >= V) fail_index(k, t, m, V);
    ++start[static_cast<size_t>(t) + 1];
  }
  for (int64_t v = 0; v < V; ++v)
    start[static_cast<size_t>(v) + 1] += start[static_cast<size_t>(v)];
  std::vector<cl_long> next(start.begin(), start.end() - 1);
  for (int64_t m = 0; m < M; ++m)
    order[static_cast<size_t>(next[static_cast<size_t>(host[static_cast<size_t>(m)])]++)] = m;
  TempBuffer dstart(lc, start.size() * sizeof(cl_long)), dorder(lc, order.size() * sizeof(cl_long));
  BP_CL_CHECK(
      clEnqueueWriteBuffer(lc.queue, dstart.buf->mem, CL_TRUE, 0, start.size() * sizeof(cl_long),
                           start.data(), 0, nullptr, nullptr),
      op_label(k) + ": writing the row starts");
  BP_CL_CHECK(
      clEnqueueWriteBuffer(lc.queue, dorder.buf->mem, CL_TRUE, 0, order.size() * sizeof(cl_long),
                           order.data(), 0, nullptr, nullptr),
      op_label(k) + ": writing the row order");
  std::lock_guard<std::mutex> lock(k.mutex);
  size_t local = k.local_size[kMain];
  size_t global = grid_size(static_cast<uint64_t>(V * D), local);
  KernelArgs a(k.kernels[kMain]);
  a.mem(out[0].buffer).mem(in[0].buffer).mem(dstart.buf).mem(dorder.buf);
  for (int64_t v : {V, D, t_off, r_off}) a.value(static_cast<cl_long>(v));
  enqueue_kernel(lc, k, kMain, 1, &global, &local);
}

void launch_triangle(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in,
                     int32_t num_in, const bp_tensor_desc* out, int32_t num_out,
                     const sdk::Attrs& attrs) {
  check_counts(k, num_in, num_out, 1, 1, 1, 1);
  const bp_tensor_desc& x = in[0];
  const int64_t x_off = dense_offset(k, x, k.dtype, -1, "input 0 (x)");
  if (x.rank < 2)
    fail_launch(k, sdk::format("the input %s must have rank >= 2", shape_string(x).c_str()));
  const int64_t o_off = dense_offset(k, out[0], k.dtype, x.rank, "output");
  check_same_shape(k, x, out[0], "input 0 (x)");
  const int64_t n = sdk::numel(x);
  if (n == 0) return;
  const int64_t R = x.shape[x.rank - 2], Cn = x.shape[x.rank - 1];
  const cl_long diagonal = attrs.i(BP_ATTR_ID_DIAGONAL, 0);
  size_t local = k.local_size[kMain];
  size_t global = grid_size(static_cast<uint64_t>(n), local);
  std::lock_guard<std::mutex> lock(k.mutex);
  KernelArgs a(k.kernels[kMain]);
  a.mem(out[0].buffer).mem(x.buffer);
  for (int64_t v : {R, Cn, o_off, x_off}) a.value(static_cast<cl_long>(v));
  a.value(diagonal).value(static_cast<cl_int>(k.op == Op::kTriu ? 1 : 0));
  a.value(static_cast<cl_long>(n));
  enqueue_kernel(lc, k, kMain, 1, &global, &local);
}

void launch_cumsum(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in, int32_t num_in,
                   const bp_tensor_desc* out, int32_t num_out, const sdk::Attrs& attrs) {
  check_counts(k, num_in, num_out, 1, 1, 1, 1);
  const bp_tensor_desc& x = in[0];
  const int64_t x_off = dense_offset(k, x, k.dtype, -1, "input 0 (x)");
  const int64_t o_off = dense_offset(k, out[0], k.dtype, x.rank, "output");
  check_same_shape(k, x, out[0], "input 0 (x)");
  if (!attrs.has(BP_ATTR_ID_AXIS)) fail_launch(k, "attribute axis is required");
  const int64_t axis = attrs.i(BP_ATTR_ID_AXIS);
  if (axis < 0 || axis >= std::max<int32_t>(x.rank, 1))
    fail_launch(k, sdk::format("axis %lld is not a dimension of %s", static_cast<long long>(axis),
                               shape_string(x).c_str()));
  int64_t outer = 1, inner = 1, len = x.rank ? x.shape[axis] : 1;
  for (int32_t d = 0; d < x.rank; ++d) {
    if (d < axis) outer *= x.shape[d];
    if (d > axis) inner *= x.shape[d];
  }
  if (outer * inner == 0 || len == 0) return;
  size_t local = k.local_size[kMain];
  size_t global = grid_size(static_cast<uint64_t>(outer * inner), local);
  std::lock_guard<std::mutex> lock(k.mutex);
  KernelArgs a(k.kernels[kMain]);
  a.mem(out[0].buffer).mem(x.buffer);
  for (int64_t v : {outer, len, inner, o_off, x_off}) a.value(static_cast<cl_long>(v));
  enqueue_kernel(lc, k, kMain, 1, &global, &local);
}

}  // namespace

std::string transformer_source(int32_t dtype, bool fp64) {
  std::string s = kernel_prelude(dtype, fp64);
  if (dtype == BP_DTYPE_F64) {
    s += "#define ACC double\n#define SST double\n#define K(v) v\n";
  } else {
    s += "#define ACC float\n#define SST float\n#define K(v) v##f\n";
  }
  if (!is_floating(dtype)) s += "#define BP_INT 1\n";
  if (is_floating(dtype)) {
    s += kTransformerSource;
    return s;
  }
  // Integer and bool dtypes: triu, tril (every dtype) and cumsum (i32, i64) only; the float
  // kernels would not compile for them.
  std::string src = kTransformerSource;
  const size_t from = src.find("__kernel void bp_triangle");
  s += src.substr(from);
  return s;
}

void create_transformer_kernels(bp_kernel& k, cl_program program) {
  cl_kernel main = create_kernel(k, program, kernel_of(k.op));
  k.kernels = {main};
  k.local_size = {pick_local_size(main, *k.device, 256)};
  if (k.op == Op::kLayerNormBackward) {
    for (const char* name : {"bp_layer_norm_bwd_dw", "bp_layer_norm_bwd_dw_sum"}) {
      cl_kernel kernel = create_kernel(k, program, name);
      k.kernels.push_back(kernel);
      k.local_size.push_back(pick_local_size(kernel, *k.device, 256));
    }
  }
}

void launch_transformer(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in,
                        int32_t num_in, const bp_tensor_desc* out, int32_t num_out,
                        const sdk::Attrs& attrs) {
  switch (k.op) {
    case Op::kLayerNorm:
      return launch_layer_norm(k, lc, in, num_in, out, num_out, attrs);
    case Op::kLayerNormBackward:
      return launch_layer_norm_backward(k, lc, in, num_in, out, num_out);
    case Op::kEmbedding:
    case Op::kEmbeddingBackward:
      return launch_embedding(k, lc, in, num_in, out, num_out);
    case Op::kTriu:
    case Op::kTril:
      return launch_triangle(k, lc, in, num_in, out, num_out, attrs);
    case Op::kCumsum:
      return launch_cumsum(k, lc, in, num_in, out, num_out, attrs);
    default:
      return launch_activation(k, lc, in, num_in, out, num_out, attrs);
  }
}

}  // namespace bp::opencl
