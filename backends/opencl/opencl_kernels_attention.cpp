// scaled_dot_product_attention and its backward (Note [Op catalogue], minor 5).
//
// Note [Attention kernels]
//   Correct and stable for rows of any length rather than fast: no score matrix is stored, and
//   no float atomics are used, so the results are the same on every run. ACC is the
//   accumulation type (double for f64, float otherwise), SST the type of lse (float for f16 and
//   bf16, the dtype otherwise). LS work-items form a group; local memory holds the group's row
//   of q (or k and v), a chunk of LS weights and the accumulators of the output row.
//   - Forward, bp_attn_fwd, one work-group per query row (b, h, i): each work-item runs an
//     online log-sum-exp over its keys j (a running maximum m and sum l, rescaled when m
//     grows), and the group combines them (max, then the sum of l exp(m - M)), so lse_i = M +
//     log(sum) is finite for any finite scores whatever the row's length. Then, in chunks of LS
//     keys, each work-item computes one p_ij z_ij = exp(s_ij - lse_i) z_ij into local memory and
//     each work-item owns output columns e, adding the chunk's p_ij z_ij v_j[e] in order of j.
//     With CAUSAL the keys are j <= i; a row without keys gives lse = -inf and out = 0.
//   - Backward: bp_attn_delta computes D_i = dout_i . out_i per row; bp_attn_dq, one group per
//     query row, recomputes p_ij from the saved lse and adds ds_ij k_j per chunk as the forward
//     adds p v; bp_attn_dkdv, one group per key row (b, h, j), recomputes p_ij and ds_ij for the
//     rows i in chunks and adds ds_ij q_i into dk_j and p_ij z_ij dout_i into dv_j. Each output
//     element is written by one work-item: no atomics.
//   - Dropout: z_ij of Note [Op catalogue] from Philox word g = offset + ((b H + h) L + i) S + j
//     (counter g / 4, word g % 4), kept when (w >> 8) >= ceil(p 2^24): the integer form of u >= p
//     that the dropout op uses (Note [Dropout mask]), so every device drops the same weights.
#include "opencl_allocator.hpp"
#include "opencl_kernels.hpp"

#include <cmath>

namespace bp::opencl {
namespace {

constexpr const char* kAttentionSource = R"CLC(
/* Tree combine over the work-group (max when is_max, else sum); every work-item gets it. */
ACC bp_group_combine(ACC v, int is_max, __local ACC* scratch) {
  int lid = (int)get_local_id(0), L = (int)get_local_size(0);
  barrier(CLK_LOCAL_MEM_FENCE);
  scratch[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int w = L >> 1; w > 0; w >>= 1) {
    if (lid < w) {
      ACC o = scratch[lid + w];
      scratch[lid] = is_max ? fmax(scratch[lid], o) : scratch[lid] + o;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  return scratch[0];
}

/* z_ij: 0 for a dropped weight, zscale = 1 / (1 - p) for a kept one (1 without dropout). */
ACC bp_keep(ulong seed, ulong offset, ulong element, uint threshold, ACC zscale) {
  if (threshold == 0u) return zscale;
  ulong g = offset + element;
  uint4 w4 = bp_philox4x32_10(g >> 2, seed);
  uint q = (uint)(g & 3ul);
  uint w = q == 0u ? w4.x : q == 1u ? w4.y : q == 2u ? w4.z : w4.w;
  return (w >> 8) < threshold ? (ACC)0 : zscale;
}

ACC bp_dot_local(__local const ACC* a, __global const T* b, long n) {
  ACC s = (ACC)0;
  for (long e = 0; e < n; ++e) s += a[e] * (ACC)LD(b[e]);
  return s;
}

__kernel void bp_attn_fwd(__global T* out, __global SST* lse, __global const T* q,
                          __global const T* k, __global const T* v, long L, long S, long E,
                          long Ev, long o_off, long l_off, long q_off, long k_off, long v_off,
                          ACC scale, int causal, ulong seed, ulong offset, uint threshold,
                          ACC zscale, __local ACC* qs, __local ACC* ps, __local ACC* acc,
                          __local ACC* scratch) {
  long row = get_group_id(0);
  long bh = row / L, i = row - bh * L;
  int lid = (int)get_local_id(0), LS = (int)get_local_size(0);
  __global const T* kb = k + k_off + bh * S * E;
  __global const T* vb = v + v_off + bh * S * Ev;
  for (long e = lid; e < E; e += LS) qs[e] = (ACC)LD(q[q_off + row * E + e]);
  for (long e = lid; e < Ev; e += LS) acc[e] = (ACC)0;
  barrier(CLK_LOCAL_MEM_FENCE);
  long jend = causal ? min(S, i + 1) : S;
  ACC m = (ACC)(-INFINITY), l = (ACC)0;
  for (long j = lid; j < jend; j += LS) {
    ACC s = scale * bp_dot_local(qs, kb + j * E, E);
    if (s > m) {
      l = l * exp(m - s) + (ACC)1;
      m = s;
    } else {
      l += exp(s - m);
    }
  }
  ACC M = bp_group_combine(m, 1, scratch);
  ACC part = m == (ACC)(-INFINITY) ? (ACC)0 : l * exp(m - M);
  ACC lsum = bp_group_combine(part, 0, scratch);
  ACC lse_i = jend > 0 ? M + log(lsum) : (ACC)(-INFINITY);
  for (long j0 = 0; j0 < jend; j0 += LS) {
    long j = j0 + lid;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (j < jend) {
      ACC s = scale * bp_dot_local(qs, kb + j * E, E);
      ps[lid] = exp(s - lse_i) * bp_keep(seed, offset, (ulong)(row * S + j), threshold, zscale);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    long cnt = min((long)LS, jend - j0);
    for (long e = lid; e < Ev; e += LS) {
      ACC a = acc[e];
      for (long t = 0; t < cnt; ++t) a += ps[t] * (ACC)LD(vb[(j0 + t) * Ev + e]);
      acc[e] = a;
    }
  }
  for (long e = lid; e < Ev; e += LS) out[o_off + row * Ev + e] = ST(acc[e]);
  if (lid == 0) lse[l_off + row] = (SST)lse_i;
}

__kernel void bp_attn_delta(__global ACC* delta, __global const T* out, __global const T* dout,
                            long rows, long Ev, long o_off, long g_off) {
  long r = get_global_id(0);
  if (r >= rows) return;
  ACC s = (ACC)0;
  for (long e = 0; e < Ev; ++e)
    s += (ACC)LD(dout[g_off + r * Ev + e]) * (ACC)LD(out[o_off + r * Ev + e]);
  delta[r] = s;
}

__kernel void bp_attn_dq(__global T* dq, __global const T* q, __global const T* k,
                         __global const T* v, __global const T* dout, __global const SST* lse,
                         __global const ACC* delta, long L, long S, long E, long Ev, long dq_off,
                         long q_off, long k_off, long v_off, long g_off, long l_off, ACC scale,
                         int causal, ulong seed, ulong offset, uint threshold, ACC zscale,
                         __local ACC* qs, __local ACC* gs, __local ACC* ps, __local ACC* acc) {
  long row = get_group_id(0);
  long bh = row / L, i = row - bh * L;
  int lid = (int)get_local_id(0), LS = (int)get_local_size(0);
  __global const T* kb = k + k_off + bh * S * E;
  __global const T* vb = v + v_off + bh * S * Ev;
  for (long e = lid; e < E; e += LS) {
    qs[e] = (ACC)LD(q[q_off + row * E + e]);
    acc[e] = (ACC)0;
  }
  for (long e = lid; e < Ev; e += LS) gs[e] = (ACC)LD(dout[g_off + row * Ev + e]);
  barrier(CLK_LOCAL_MEM_FENCE);
  ACC lse_i = (ACC)lse[l_off + row], D = delta[row];
  long jend = lse_i == (ACC)(-INFINITY) ? 0 : causal ? min(S, i + 1) : S;
  for (long j0 = 0; j0 < jend; j0 += LS) {
    long j = j0 + lid;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (j < jend) {
      ACC p = exp(scale * bp_dot_local(qs, kb + j * E, E) - lse_i);
      ACC z = bp_keep(seed, offset, (ulong)(row * S + j), threshold, zscale);
      ps[lid] = p * (z * bp_dot_local(gs, vb + j * Ev, Ev) - D);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    long cnt = min((long)LS, jend - j0);
    for (long e = lid; e < E; e += LS) {
      ACC a = acc[e];
      for (long t = 0; t < cnt; ++t) a += ps[t] * (ACC)LD(kb[(j0 + t) * E + e]);
      acc[e] = a;
    }
  }
  for (long e = lid; e < E; e += LS) dq[dq_off + row * E + e] = ST(scale * acc[e]);
}

__kernel void bp_attn_dkdv(__global T* dk, __global T* dv, __global const T* q,
                           __global const T* k, __global const T* v, __global const T* dout,
                           __global const SST* lse, __global const ACC* delta, long L, long S,
                           long E, long Ev, long dk_off, long dv_off, long q_off, long k_off,
                           long v_off, long g_off, long l_off, ACC scale, int causal, ulong seed,
                           ulong offset, uint threshold, ACC zscale, __local ACC* ks,
                           __local ACC* vs, __local ACC* dss, __local ACC* pzs, __local ACC* acck,
                           __local ACC* accv) {
  long col = get_group_id(0);
  long bh = col / S, j = col - bh * S;
  int lid = (int)get_local_id(0), LS = (int)get_local_size(0);
  __global const T* qb = q + q_off + bh * L * E;
  __global const T* gb = dout + g_off + bh * L * Ev;
  for (long e = lid; e < E; e += LS) {
    ks[e] = (ACC)LD(k[k_off + col * E + e]);
    acck[e] = (ACC)0;
  }
  for (long e = lid; e < Ev; e += LS) {
    vs[e] = (ACC)LD(v[v_off + col * Ev + e]);
    accv[e] = (ACC)0;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  long istart = causal ? min(j, L) : 0;
  for (long i0 = istart; i0 < L; i0 += LS) {
    long i = i0 + lid;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (i < L) {
      ACC lse_i = (ACC)lse[l_off + bh * L + i];
      ACC ds = (ACC)0, pz = (ACC)0;
      if (lse_i != (ACC)(-INFINITY)) {
        ACC p = exp(scale * bp_dot_local(ks, qb + i * E, E) - lse_i);
        ACC z = bp_keep(seed, offset, (ulong)((bh * L + i) * S + j), threshold, zscale);
        pz = p * z;
        ds = p * (z * bp_dot_local(vs, gb + i * Ev, Ev) - delta[bh * L + i]);
      }
      dss[lid] = ds;
      pzs[lid] = pz;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    long cnt = min((long)LS, L - i0);
    for (long e = lid; e < E; e += LS) {
      ACC a = acck[e];
      for (long t = 0; t < cnt; ++t) a += dss[t] * (ACC)LD(qb[(i0 + t) * E + e]);
      acck[e] = a;
    }
    for (long e = lid; e < Ev; e += LS) {
      ACC a = accv[e];
      for (long t = 0; t < cnt; ++t) a += pzs[t] * (ACC)LD(gb[(i0 + t) * Ev + e]);
      accv[e] = a;
    }
  }
  for (long e = lid; e < E; e += LS) dk[dk_off + col * E + e] = ST(scale * acck[e]);
  for (long e = lid; e < Ev; e += LS) dv[dv_off + col * Ev + e] = ST(accv[e]);
}
)CLC";

enum Slot : size_t { kFwd = 0, kDelta = 1, kDq = 2, kDkdv = 3 };

int32_t stat_dtype(int32_t dtype) {
  return dtype == BP_DTYPE_F16 || dtype == BP_DTYPE_BF16 ? BP_DTYPE_F32 : dtype;
}

// The attributes of both ops, read and checked once per launch.
struct AttentionAttrs {
  double scale, p;
  cl_int causal;
  cl_ulong seed, offset;
  cl_uint threshold;  // Note [Dropout mask]: ceil(p 2^24); 0 without dropout
  double zscale;
};

AttentionAttrs read_attrs(const bp_kernel& k, const sdk::Attrs& attrs, int64_t E) {
  AttentionAttrs a{};
  a.scale = attrs.f(BP_ATTR_ID_SCALE, E > 0 ? 1.0 / std::sqrt(static_cast<double>(E)) : 1.0);
  a.p = attrs.f(BP_ATTR_ID_P, 0.0);
  if (!(a.p >= 0.0 && a.p < 1.0))
    fail_launch(k, sdk::format("dropout p = %g is outside [0, 1)", a.p));
  a.causal = attrs.i(BP_ATTR_ID_CAUSAL, 0) != 0 ? 1 : 0;
  a.seed = static_cast<cl_ulong>(attrs.i(BP_ATTR_ID_SEED, 0));
  a.offset = static_cast<cl_ulong>(attrs.i(BP_ATTR_ID_OFFSET, 0));
  a.threshold = static_cast<cl_uint>(std::ceil(a.p * 16777216.0));
  a.zscale = a.p > 0 ? 1.0 / (1.0 - a.p) : 1.0;
  return a;
}

// q [B,H,L,E], k [B,H,S,E], v [B,H,S,Ev]: checked together, naming every shape.
struct Shapes {
  int64_t B, H, L, S, E, Ev;
};

Shapes check_qkv(const bp_kernel& k, const bp_tensor_desc* in) {
  const bp_tensor_desc &q = in[0], &kk = in[1], &v = in[2];
  const bool ok = q.rank == 4 && kk.rank == 4 && v.rank == 4 && kk.shape[0] == q.shape[0] &&
                  v.shape[0] == q.shape[0] && kk.shape[1] == q.shape[1] &&
                  v.shape[1] == q.shape[1] && kk.shape[3] == q.shape[3] &&
                  v.shape[2] == kk.shape[2];
  if (!ok)
    fail_launch(
        k, sdk::format("q %s, k %s and v %s do not agree (expected q [B,H,L,E], "
                       "k [B,H,S,E], v [B,H,S,Ev])",
                       shape_string(q).c_str(), shape_string(kk).c_str(), shape_string(v).c_str()));
  return {q.shape[0], q.shape[1], q.shape[2], kk.shape[2], q.shape[3], v.shape[3]};
}

void check_dims(const bp_kernel& k, const bp_tensor_desc& t, std::initializer_list<int64_t> want,
                const char* role) {
  bool same = t.rank == static_cast<int32_t>(want.size());
  int32_t d = 0;
  std::string s = "[";
  for (int64_t w : want) {
    same = same && t.shape[d] == w;
    s += sdk::format("%s%lld", d++ ? ", " : "", static_cast<long long>(w));
  }
  if (!same)
    fail_launch(
        k, sdk::format("%s has shape %s, expected %s]", role, shape_string(t).c_str(), s.c_str()));
}

size_t acc_size(const bp_kernel& k) {
  return k.dtype == BP_DTYPE_F64 ? 8 : 4;
}

// Local memory of `values` accumulators, checked against the device's; throws UNSUPPORTED
// naming the head sizes when the rows do not fit.
void check_local(const bp_kernel& k, const Shapes& s, uint64_t values) {
  const uint64_t bytes = values * acc_size(k);
  if (bytes > k.device->info().local_memory)
    sdk::fail(BP_ERROR_UNSUPPORTED,
              sdk::format("opencl: %s: head sizes E = %lld and Ev = %lld need %llu bytes of local "
                          "memory; the device has %llu",
                          op_label(k).c_str(), static_cast<long long>(s.E),
                          static_cast<long long>(s.Ev), static_cast<unsigned long long>(bytes),
                          static_cast<unsigned long long>(k.device->info().local_memory)));
}

void common_args(const bp_kernel& k, KernelArgs& a, const AttentionAttrs& at) {
  if (k.dtype == BP_DTYPE_F64) {
    a.value(at.scale);
  } else {
    a.value(static_cast<float>(at.scale));
  }
  a.value(at.causal).value(at.seed).value(at.offset).value(at.threshold);
  if (k.dtype == BP_DTYPE_F64) {
    a.value(at.zscale);
  } else {
    a.value(static_cast<float>(at.zscale));
  }
}

void launch_forward(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in,
                    const bp_tensor_desc* out, const sdk::Attrs& attrs) {
  const Shapes s = check_qkv(k, in);
  const int64_t q_off = dense_offset(k, in[0], k.dtype, 4, "input 0 (q)");
  const int64_t k_off = dense_offset(k, in[1], k.dtype, 4, "input 1 (k)");
  const int64_t v_off = dense_offset(k, in[2], k.dtype, 4, "input 2 (v)");
  const int64_t o_off = dense_offset(k, out[0], k.dtype, 4, "output 0 (out)");
  check_dims(k, out[0], {s.B, s.H, s.L, s.Ev}, "output 0 (out)");
  const int64_t l_off = dense_offset(k, out[1], stat_dtype(k.dtype), 3, "output 1 (lse)");
  check_dims(k, out[1], {s.B, s.H, s.L}, "output 1 (lse)");
  const AttentionAttrs at = read_attrs(k, attrs, s.E);
  const int64_t rows = s.B * s.H * s.L;
  if (rows == 0) return;
  size_t local = k.local_size[kFwd];
  check_local(k, s, static_cast<uint64_t>(s.E + s.Ev) + 2 * local);
  size_t global = static_cast<size_t>(rows) * local;
  std::lock_guard<std::mutex> lock(k.mutex);
  KernelArgs a(k.kernels[kFwd]);
  a.mem(out[0].buffer).mem(out[1].buffer).mem(in[0].buffer).mem(in[1].buffer).mem(in[2].buffer);
  for (int64_t v : {s.L, s.S, s.E, s.Ev, o_off, l_off, q_off, k_off, v_off})
    a.value(static_cast<cl_long>(v));
  common_args(k, a, at);
  const size_t es = acc_size(k);
  a.local(std::max<int64_t>(s.E, 1) * es).local(local * es);
  a.local(std::max<int64_t>(s.Ev, 1) * es).local(local * es);
  enqueue_kernel(lc, k, kFwd, 1, &global, &local);
}

void launch_backward(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in,
                     const bp_tensor_desc* out, const sdk::Attrs& attrs) {
  const Shapes s = check_qkv(k, in);
  const int32_t sdt = stat_dtype(k.dtype);
  const int64_t q_off = dense_offset(k, in[0], k.dtype, 4, "input 0 (q)");
  const int64_t k_off = dense_offset(k, in[1], k.dtype, 4, "input 1 (k)");
  const int64_t v_off = dense_offset(k, in[2], k.dtype, 4, "input 2 (v)");
  const int64_t o_off = dense_offset(k, in[3], k.dtype, 4, "input 3 (out)");
  check_dims(k, in[3], {s.B, s.H, s.L, s.Ev}, "input 3 (out)");
  const int64_t g_off = dense_offset(k, in[4], k.dtype, 4, "input 4 (dout)");
  check_dims(k, in[4], {s.B, s.H, s.L, s.Ev}, "input 4 (dout)");
  const int64_t l_off = dense_offset(k, in[5], sdt, 3, "input 5 (lse)");
  check_dims(k, in[5], {s.B, s.H, s.L}, "input 5 (lse)");
  const int64_t dq_off = dense_offset(k, out[0], k.dtype, 4, "output 0 (dq)");
  check_dims(k, out[0], {s.B, s.H, s.L, s.E}, "output 0 (dq)");
  const int64_t dk_off = dense_offset(k, out[1], k.dtype, 4, "output 1 (dk)");
  check_dims(k, out[1], {s.B, s.H, s.S, s.E}, "output 1 (dk)");
  const int64_t dv_off = dense_offset(k, out[2], k.dtype, 4, "output 2 (dv)");
  check_dims(k, out[2], {s.B, s.H, s.S, s.Ev}, "output 2 (dv)");
  const AttentionAttrs at = read_attrs(k, attrs, s.E);
  const int64_t rows = s.B * s.H * s.L, cols = s.B * s.H * s.S;
  const size_t es = acc_size(k);
  const size_t lq = k.local_size[kDq], lkv = k.local_size[kDkdv];
  check_local(k, s, static_cast<uint64_t>(2 * s.E + s.Ev) + lq);
  check_local(k, s, static_cast<uint64_t>(2 * s.E + 2 * s.Ev) + 2 * lkv);
  TempBuffer delta(lc, static_cast<uint64_t>(rows) * es);
  std::lock_guard<std::mutex> lock(k.mutex);
  if (rows > 0) {
    size_t local = k.local_size[kDelta];
    size_t global = grid_size(static_cast<uint64_t>(rows), local);
    KernelArgs a(k.kernels[kDelta]);
    a.mem(delta.buf).mem(in[3].buffer).mem(in[4].buffer);
    for (int64_t v : {rows, s.Ev, o_off, g_off}) a.value(static_cast<cl_long>(v));
    enqueue_kernel(lc, k, kDelta, 1, &global, &local);

    global = static_cast<size_t>(rows) * lq;
    KernelArgs d(k.kernels[kDq]);
    d.mem(out[0].buffer);
    for (int32_t j : {0, 1, 2, 4, 5}) d.mem(in[j].buffer);
    d.mem(delta.buf);
    for (int64_t v : {s.L, s.S, s.E, s.Ev, dq_off, q_off, k_off, v_off, g_off, l_off})
      d.value(static_cast<cl_long>(v));
    common_args(k, d, at);
    d.local(std::max<int64_t>(s.E, 1) * es).local(std::max<int64_t>(s.Ev, 1) * es);
    d.local(lq * es).local(std::max<int64_t>(s.E, 1) * es);
    enqueue_kernel(lc, k, kDq, 1, &global, &lq);
  }
  if (cols == 0) return;
  size_t global = static_cast<size_t>(cols) * lkv;
  KernelArgs d(k.kernels[kDkdv]);
  d.mem(out[1].buffer).mem(out[2].buffer);
  for (int32_t j : {0, 1, 2, 4, 5}) d.mem(in[j].buffer);
  d.mem(delta.buf ? delta.buf : out[1].buffer);
  for (int64_t v : {s.L, s.S, s.E, s.Ev, dk_off, dv_off, q_off, k_off, v_off, g_off, l_off})
    d.value(static_cast<cl_long>(v));
  common_args(k, d, at);
  const size_t e1 = static_cast<size_t>(std::max<int64_t>(s.E, 1)) * es;
  const size_t v1 = static_cast<size_t>(std::max<int64_t>(s.Ev, 1)) * es;
  d.local(e1).local(v1).local(lkv * es).local(lkv * es).local(e1).local(v1);
  enqueue_kernel(lc, k, kDkdv, 1, &global, &lkv);
}

}  // namespace

std::string attention_source(int32_t dtype, bool fp64) {
  std::string s = kernel_prelude(dtype, fp64);
  s += dtype == BP_DTYPE_F64 ? "#define ACC double\n#define SST double\n"
                             : "#define ACC float\n#define SST float\n";
  s += philox_source();
  s += kAttentionSource;
  return s;
}

void create_attention_kernels(bp_kernel& k, cl_program program) {
  const bool backward = k.op == Op::kScaledDotProductAttentionBackward;
  k.kernels.assign(4, nullptr);
  k.local_size.assign(4, 1);
  auto make = [&](Slot slot, const char* name) {
    k.kernels[slot] = create_kernel(k, program, name);
    k.local_size[slot] = pick_local_size(k.kernels[slot], *k.device, 128);
  };
  if (!backward) return make(kFwd, "bp_attn_fwd");
  make(kDelta, "bp_attn_delta");
  make(kDq, "bp_attn_dq");
  make(kDkdv, "bp_attn_dkdv");
}

void launch_attention(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in,
                      int32_t num_in, const bp_tensor_desc* out, int32_t num_out,
                      const sdk::Attrs& attrs) {
  if (k.op == Op::kScaledDotProductAttention) {
    check_counts(k, num_in, num_out, 3, 3, 2, 2);
    return launch_forward(k, lc, in, out, attrs);
  }
  check_counts(k, num_in, num_out, 6, 6, 3, 3);
  launch_backward(k, lc, in, out, attrs);
}

}  // namespace bp::opencl
