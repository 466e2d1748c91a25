// Batched matmul: out[B,M,N] = a[B,M,K] @ b[B,K,N]; linear: out[M,N] = x[M,K] @ w[N,K]^T (+ bias)
// (then ReLU), the same kernel with w read transposed and the bias and ReLU applied to each
// accumulator before its one store (no extra pass over the output).
//
// Note [Matmul tiling]
//   One work-group computes a TS x TS tile of the output with (TS/WPT)^2 work-items, each
//   accumulating WPT x WPT outputs in registers. K advances in steps of TK: the group stages
//   a TS x TK slice of a and a TK x TS slice of b in local memory (converted to the
//   accumulation type: float for f32/f16/bf16, double for f64), then every work-item runs the
//   inner product out of local memory. Both operands are addressed through their strides, so
//   row-major, column-major (transposed) and batch-broadcast (stride 0) operands take the same
//   path; the staging loop walks the operand's unit-stride dimension with consecutive
//   work-items. Edges are padded with zeros; K == 0 gives zeros. TS and WPT are chosen per
//   device from its maximum work-group size and local memory (64/4 on GPUs and PoCL).
//   Contraction to FMA is allowed in this program only (it changes rounding, not accuracy).
//   The host splits launches so no grid dimension exceeds 65535 groups.
#include "opencl_kernels.hpp"

#include <algorithm>

namespace bp::opencl {
namespace {

constexpr const char* kMatmulTemplate = R"CLC(
#pragma OPENCL FP_CONTRACT ON
#define RTS (TS / WPT)

typedef struct {
  long M, N, K;
  long a_off, a_b, a_m, a_k;
  long b_off, b_b, b_k, b_n;
  long o_off, o_b, o_m, o_n;
  long batch0, mtile0;
  long bias_off, bias_s, has_bias, relu;
} bp_mm;

__kernel __attribute__((reqd_work_group_size(RTS, RTS, 1)))
void bp_matmul(__global T* out, __global const T* a, __global const T* b,
               __global const T* bias, bp_mm p) {
  __local ACC As[TK][TS];
  __local ACC Bs[TK][TS];
  const int tx = (int)get_local_id(0), ty = (int)get_local_id(1);
  const int tid = ty * RTS + tx;
  const long n0 = (long)get_group_id(0) * TS;
  const long m0 = ((long)get_group_id(1) + p.mtile0) * TS;
  const long bz = (long)get_group_id(2) + p.batch0;
  const long abase = p.a_off + bz * p.a_b, bbase = p.b_off + bz * p.b_b;
  const bool a_kmajor = p.a_k == 1;  /* row-major a: k is the unit-stride dimension */
  const bool b_nmajor = p.b_n == 1 || p.b_k != 1;

  ACC acc[WPT][WPT];
  for (int i = 0; i < WPT; ++i)
    for (int j = 0; j < WPT; ++j) acc[i][j] = (ACC)0;

  for (long k0 = 0; k0 < p.K; k0 += TK) {
    for (int l = tid; l < TK * TS; l += RTS * RTS) {
      int mm, kk;
      if (a_kmajor) {
        kk = l % TK;
        mm = l / TK;
      } else {
        mm = l % TS;
        kk = l / TS;
      }
      long gm = m0 + mm, gk = k0 + kk;
      ACC v = (ACC)0;
      if (gm < p.M && gk < p.K) v = (ACC)LD(a[abase + gm * p.a_m + gk * p.a_k]);
      As[kk][mm] = v;
    }
    for (int l = tid; l < TK * TS; l += RTS * RTS) {
      int nn, kk;
      if (b_nmajor) {
        nn = l % TS;
        kk = l / TS;
      } else {
        kk = l % TK;
        nn = l / TK;
      }
      long gn = n0 + nn, gk = k0 + kk;
      ACC v = (ACC)0;
      if (gn < p.N && gk < p.K) v = (ACC)LD(b[bbase + gk * p.b_k + gn * p.b_n]);
      Bs[kk][nn] = v;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kk = 0; kk < TK; ++kk) {
      ACC br[WPT];
      for (int j = 0; j < WPT; ++j) br[j] = Bs[kk][tx + j * RTS];
      for (int i = 0; i < WPT; ++i) {
        ACC av = As[kk][ty + i * RTS];
        for (int j = 0; j < WPT; ++j) acc[i][j] += av * br[j];
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }

  const long obase = p.o_off + bz * p.o_b;
  for (int i = 0; i < WPT; ++i) {
    long m = m0 + ty + i * RTS;
    if (m >= p.M) continue;
    for (int j = 0; j < WPT; ++j) {
      long n = n0 + tx + j * RTS;
      if (n >= p.N) continue;
      ACC v = acc[i][j];
      if (p.has_bias) v += (ACC)LD(bias[p.bias_off + n * p.bias_s]);
      if (p.relu && v < (ACC)0) v = (ACC)0; /* NaN stays */
      out[obase + m * p.o_m + n * p.o_n] = ST(v);
    }
  }
}
)CLC";

// Host mirror of bp_mm.
struct ClMatmul {
  int64_t M, N, K;
  int64_t a_off, a_b, a_m, a_k;
  int64_t b_off, b_b, b_k, b_n;
  int64_t o_off, o_b, o_m, o_n;
  int64_t batch0, mtile0;
  int64_t bias_off, bias_s, has_bias, relu;
};

constexpr int kTK = kGemmTK;

[[noreturn]] void bad_launch(const bp_kernel& k, const std::string& why) {
  sdk::fail(BP_ERROR_INVALID_ARGUMENT,
            sdk::format("opencl: %s: %s", op_label(k).c_str(), why.c_str()));
}

}  // namespace

// Note [Matmul tiling]: the largest tile the device's work-group size and local memory allow.
Tiling gemm_tiling(int32_t dtype, const DeviceInfo& info) {
  size_t acc = dtype == BP_DTYPE_F64 ? 8 : 4;
  for (Tiling t : {Tiling{64, 4}, Tiling{32, 4}, Tiling{16, 4}, Tiling{8, 4}}) {
    size_t threads = static_cast<size_t>(t.ts / t.wpt) * static_cast<size_t>(t.ts / t.wpt);
    size_t local = 2 * kTK * static_cast<size_t>(t.ts) * acc;
    if (threads <= info.max_work_group && local <= info.local_memory) return t;
  }
  return Tiling{4, 4};
}

std::string matmul_source(int32_t dtype, const DeviceInfo& info) {
  Tiling t = gemm_tiling(dtype, info);
  std::string s = kernel_prelude(dtype, info.fp64);
  s += sdk::format("#define TS %d\n#define WPT %d\n#define TK %d\n#define ACC %s\n", t.ts, t.wpt,
                   kTK, dtype == BP_DTYPE_F64 ? "double" : "float");
  s += kMatmulTemplate;
  return s;
}

void create_matmul_kernels(bp_kernel& k, cl_program program) {
  cl_kernel kernel = create_kernel(k, program, "bp_matmul");
  Tiling t = gemm_tiling(k.dtype, k.device->info());
  size_t rts = static_cast<size_t>(t.ts / t.wpt);
  size_t wg = 0;
  clGetKernelWorkGroupInfo(kernel, k.device->id(), CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg,
                           nullptr);
  if (wg != 0 && wg < rts * rts) {
    clReleaseKernel(kernel);
    sdk::fail(BP_ERROR_DEVICE,
              sdk::format("opencl: %s: the matmul kernel needs work-groups of %zu work-items "
                          "but the device allows %zu for it",
                          op_label(k).c_str(), rts * rts, wg));
  }
  k.kernels = {kernel};
  k.local_size = {rts};
}

namespace {

// Runs bp_matmul over p (operand strides, offsets and sizes filled in) in grid pieces of at
// most 65535 groups a dimension.
void run_tiles(bp_kernel& k, const LaunchContext& lc, ClMatmul& p, int64_t B, bp_buffer* o,
               bp_buffer* a, bp_buffer* b, bp_buffer* bias) {
  const int64_t M = p.M, N = p.N;
  Tiling t = gemm_tiling(k.dtype, lc.device.info());
  size_t rts = k.local_size[0];
  int64_t n_tiles = (N + t.ts - 1) / t.ts, m_tiles = (M + t.ts - 1) / t.ts;
  constexpr int64_t kMaxGroups = 65535;
  if (n_tiles > kMaxGroups)
    bad_launch(k, sdk::format("N = %lld needs %lld column tiles; at most %lld are supported",
                              static_cast<long long>(N), static_cast<long long>(n_tiles),
                              static_cast<long long>(kMaxGroups)));
  std::lock_guard<std::mutex> lock(k.mutex);
  for (int64_t b0 = 0; b0 < B; b0 += kMaxGroups) {
    for (int64_t mt0 = 0; mt0 < m_tiles; mt0 += kMaxGroups) {
      p.batch0 = b0;
      p.mtile0 = mt0;
      size_t local[3] = {rts, rts, 1};
      size_t global[3] = {static_cast<size_t>(n_tiles) * rts,
                          static_cast<size_t>(std::min(m_tiles - mt0, kMaxGroups)) * rts,
                          static_cast<size_t>(std::min(B - b0, kMaxGroups))};
      KernelArgs(k.kernels[0]).mem(o).mem(a).mem(b).mem(bias).value(p);
      enqueue_kernel(lc, k, 0, 3, global, local);
    }
  }
}

void launch_linear(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in, int32_t num_in,
                   const bp_tensor_desc* out, int32_t num_out, const sdk::Attrs& attrs) {
  if ((num_in != 2 && num_in != 3) || num_out != 1)
    bad_launch(k, sdk::format("expects inputs x, w, an optional bias and 1 output, got %d and %d",
                              num_in, num_out));
  const bp_tensor_desc &x = in[0], &w = in[1], &o = out[0];
  const bp_tensor_desc* bias = num_in == 3 ? &in[2] : nullptr;
  if (x.rank != 2 || w.rank != 2 || o.rank != 2 || (bias && bias->rank != 1))
    bad_launch(
        k, sdk::format("expects x[M,K], w[N,K], bias[N], out[M,N]; got x %s, w %s, out "
                       "%s%s%s",
                       shape_string(x).c_str(), shape_string(w).c_str(), shape_string(o).c_str(),
                       bias ? ", bias " : "", bias ? shape_string(*bias).c_str() : ""));
  const int64_t M = o.shape[0], N = o.shape[1], K = x.shape[1];
  if (x.shape[0] != M || w.shape[0] != N || w.shape[1] != K || (bias && bias->shape[0] != N))
    bad_launch(
        k, sdk::format("shapes do not match x[M,K] w[N,K] -> out[M,N]: x %s, w %s, out "
                       "%s%s%s",
                       shape_string(x).c_str(), shape_string(w).c_str(), shape_string(o).c_str(),
                       bias ? ", bias " : "", bias ? shape_string(*bias).c_str() : ""));
  const int64_t act = attrs.i(BP_ATTR_ID_ACTIVATION, BP_ACTIVATION_NONE);
  if (act != BP_ACTIVATION_NONE && act != BP_ACTIVATION_RELU)
    bad_launch(
        k, sdk::format("activation %lld is not 0 (none) or 1 (relu)", static_cast<long long>(act)));
  ClMatmul p{};
  p.a_off = checked_element_offset(k, x, k.dtype, "input 0 (x)");
  p.b_off = checked_element_offset(k, w, k.dtype, "input 1 (w)");
  p.o_off = checked_element_offset(k, o, k.dtype, "output");
  if (bias) {
    p.bias_off = checked_element_offset(k, *bias, k.dtype, "input 2 (bias)");
    p.bias_s = bias->strides[0];
    p.has_bias = 1;
  }
  p.relu = act == BP_ACTIVATION_RELU ? 1 : 0;
  if (M == 0 || N == 0) return;
  p.M = M;
  p.N = N;
  p.K = K;
  p.a_m = x.strides[0];
  p.a_k = x.strides[1];
  p.b_k = w.strides[1];  // b[k, n] = w[n, k]
  p.b_n = w.strides[0];
  p.o_m = o.strides[0];
  p.o_n = o.strides[1];
  run_tiles(k, lc, p, 1, o.buffer, x.buffer, w.buffer, bias ? bias->buffer : o.buffer);
}

}  // namespace

void launch_matmul(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in, int32_t num_in,
                   const bp_tensor_desc* out, int32_t num_out, const sdk::Attrs& attrs) {
  if (k.op == Op::kLinear) return launch_linear(k, lc, in, num_in, out, num_out, attrs);
  if (num_in != 2 || num_out != 1)
    bad_launch(k, sdk::format("expects 2 inputs and 1 output, got %d and %d", num_in, num_out));
  const bp_tensor_desc &a = in[0], &b = in[1], &o = out[0];
  if (a.rank != 3 || b.rank != 3 || o.rank != 3)
    bad_launch(
        k, sdk::format("expects rank-3 operands, got a %s, b %s, out %s", shape_string(a).c_str(),
                       shape_string(b).c_str(), shape_string(o).c_str()));
  int64_t B = o.shape[0], M = o.shape[1], N = o.shape[2], K = a.shape[2];
  if (a.shape[0] != B || b.shape[0] != B || a.shape[1] != M || b.shape[1] != K || b.shape[2] != N)
    bad_launch(
        k, sdk::format("shapes do not match [B,M,K] @ [B,K,N] -> [B,M,N]: a %s, b %s, "
                       "out %s",
                       shape_string(a).c_str(), shape_string(b).c_str(), shape_string(o).c_str()));
  ClMatmul p{};
  p.a_off = checked_element_offset(k, a, k.dtype, "input 0 (a)");
  p.b_off = checked_element_offset(k, b, k.dtype, "input 1 (b)");
  p.o_off = checked_element_offset(k, o, k.dtype, "output");
  if (B == 0 || M == 0 || N == 0) return;
  p.M = M;
  p.N = N;
  p.K = K;
  p.a_b = a.strides[0];
  p.a_m = a.strides[1];
  p.a_k = a.strides[2];
  p.b_b = b.strides[0];
  p.b_k = b.strides[1];
  p.b_n = b.strides[2];
  p.o_b = o.strides[0];
  p.o_m = o.strides[1];
  p.o_n = o.strides[2];
  run_tiles(k, lc, p, B, o.buffer, a.buffer, b.buffer, o.buffer);
}

}  // namespace bp::opencl
