// scaled_dot_product_attention and its backward (Note [Op catalogue], minor 5).
//
// Note [Attention kernels]
//   Correct and stable for rows of any length rather than fast: no score matrix is stored, and
//   no float atomics are used, so the results are the same on every run. ACC is the
//   accumulation type (double for f64, float otherwise), SST the type of lse (float for f16 and
//   bf16, the dtype otherwise). LS work-items form a group that serves RQ = kRows query rows
//   (or key rows: every key row read from global memory serves RQ of them); local memory holds
//   the group's rows of q (or k and v), a chunk of RQ x LS weights and the accumulators of the
//   output rows. Below, "row" means each of the group's rows.
//   - Forward, bp_attn_fwd, one work-group per RQ query rows (b, h, i): each work-item runs an
//     online log-sum-exp over its keys j (a running maximum m and sum l, rescaled when m
//     grows), and the group combines them (max, then the sum of l exp(m - M)), so lse_i = M +
//     log(sum) is finite for any finite scores whatever the row's length. Then, in chunks of LS
//     keys, each work-item computes one p_ij z_ij = exp(s_ij - lse_i) z_ij into local memory and
//     each work-item owns output columns e, adding the chunk's p_ij z_ij v_j[e] in order of j.
//     With CAUSAL the keys are j <= i; a row without keys gives lse = -inf and out = 0.
//   - Backward: bp_attn_delta computes D_i = dout_i . out_i per row; bp_attn_dq, one group per
//     RQ query rows, recomputes p_ij from the saved lse and adds ds_ij k_j per chunk as the
//     forward adds p v; bp_attn_dkdv, one group per RQ key rows (b, h, j), recomputes p_ij and
//     ds_ij for the rows i in chunks and adds ds_ij q_i into dk_j and p_ij z_ij dout_i into dv_j.
//     Each output element is written by one work-item: no atomics.
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

/* Rows [r0, r0 + nr) of a [rows, n] tensor into local memory (RQ rows, zeros past nr). */
void bp_load_rows(__local ACC* dst, __global const T* src, long r0, int nr, long n) {
  int lid = (int)get_local_id(0), LS = (int)get_local_size(0);
  for (long t = lid; t < RQ * n; t += LS) {
    long r = t / n;
    dst[t] = r < nr ? (ACC)LD(src[r0 * n + t]) : (ACC)0;
  }
}

/* d[r] = a[r] . b for the RQ rows of a (local, [RQ, n]) and one row b (global). */
#define BP_DOTS(d, a, b, n)                                 \
  {                                                         \
    for (int r_ = 0; r_ < RQ; ++r_) d[r_] = (ACC)0;         \
    for (long e_ = 0; e_ < (n); ++e_) {                     \
      ACC bv_ = (ACC)LD((b)[e_]);                           \
      for (int r_ = 0; r_ < RQ; ++r_) d[r_] += (a)[r_ * (n) + e_] * bv_; \
    }                                                       \
  }

/* acc[r, e] += sum over t < cnt of w[r, t] src[t, e], for the e this work-item owns. */
void bp_accumulate(__local ACC* acc, __local const ACC* w, __global const T* src, long cnt,
                   long n) {
  int lid = (int)get_local_id(0), LS = (int)get_local_size(0);
  for (long e = lid; e < n; e += LS) {
    ACC a[RQ];
    for (int r = 0; r < RQ; ++r) a[r] = acc[r * n + e];
    for (long t = 0; t < cnt; ++t) {
      ACC sv = (ACC)LD(src[t * n + e]);
      for (int r = 0; r < RQ; ++r) a[r] += w[r * LS + t] * sv;
    }
    for (int r = 0; r < RQ; ++r) acc[r * n + e] = a[r];
  }
}

/* One work-group per RQ query rows i0 .. i0 + nr - 1 of one (b, h). */
__kernel void bp_attn_fwd(__global T* out, __global SST* lse, __global const T* q,
                          __global const T* k, __global const T* v, long L, long S, long E,
                          long Ev, long o_off, long l_off, long q_off, long k_off, long v_off,
                          ACC scale, int causal, ulong seed, ulong offset, uint threshold,
                          ACC zscale, __local ACC* qs, __local ACC* ps, __local ACC* acc,
                          __local ACC* scratch) {
  long per_bh = (L + RQ - 1) / RQ, g = get_group_id(0);
  long bh = g / per_bh, i0 = (g - bh * per_bh) * RQ;
  int nr = (int)min((long)RQ, L - i0);
  int lid = (int)get_local_id(0), LS = (int)get_local_size(0);
  long row0 = bh * L + i0;
  __global const T* kb = k + k_off + bh * S * E;
  __global const T* vb = v + v_off + bh * S * Ev;
  bp_load_rows(qs, q + q_off, row0, nr, E);
  for (long t = lid; t < RQ * Ev; t += LS) acc[t] = (ACC)0;
  barrier(CLK_LOCAL_MEM_FENCE);
  long jmax = causal ? min(S, i0 + nr) : S;
  ACC m[RQ], l[RQ], d[RQ], lse_r[RQ];
  for (int r = 0; r < RQ; ++r) {
    m[r] = (ACC)(-INFINITY);
    l[r] = (ACC)0;
  }
  for (long j = lid; j < jmax; j += LS) {
    BP_DOTS(d, qs, kb + j * E, E)
    for (int r = 0; r < RQ; ++r) {
      if (r >= nr || (causal && j > i0 + r)) continue;
      ACC s = scale * d[r];
      if (s > m[r]) {
        l[r] = l[r] * exp(m[r] - s) + (ACC)1;
        m[r] = s;
      } else {
        l[r] += exp(s - m[r]);
      }
    }
  }
  for (int r = 0; r < RQ; ++r) {
    ACC M = bp_group_combine(m[r], 1, scratch);
    ACC part = m[r] == (ACC)(-INFINITY) ? (ACC)0 : l[r] * exp(m[r] - M);
    ACC lsum = bp_group_combine(part, 0, scratch);
    long jend = causal ? min(S, i0 + r + 1) : S;
    lse_r[r] = r < nr && jend > 0 ? M + log(lsum) : (ACC)(-INFINITY);
  }
  for (long j0 = 0; j0 < jmax; j0 += LS) {
    long j = j0 + lid;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (j < jmax) {
      BP_DOTS(d, qs, kb + j * E, E)
      for (int r = 0; r < RQ; ++r) {
        ACC p = (ACC)0;
        if (r < nr && !(causal && j > i0 + r))
          p = exp(scale * d[r] - lse_r[r]) *
              bp_keep(seed, offset, (ulong)((row0 + r) * S + j), threshold, zscale);
        ps[r * LS + lid] = p;
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    bp_accumulate(acc, ps, vb + j0 * Ev, min((long)LS, jmax - j0), Ev);
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (long t = lid; t < nr * Ev; t += LS) out[o_off + row0 * Ev + t] = ST(acc[t]);
  for (int r = lid; r < nr; r += LS) lse[l_off + row0 + r] = (SST)lse_r[r];
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

/* One work-group per RQ query rows, as the forward. */
__kernel void bp_attn_dq(__global T* dq, __global const T* q, __global const T* k,
                         __global const T* v, __global const T* dout, __global const SST* lse,
                         __global const ACC* delta, long L, long S, long E, long Ev, long dq_off,
                         long q_off, long k_off, long v_off, long g_off, long l_off, ACC scale,
                         int causal, ulong seed, ulong offset, uint threshold, ACC zscale,
                         __local ACC* qs, __local ACC* gs, __local ACC* ps, __local ACC* acc) {
  long per_bh = (L + RQ - 1) / RQ, g = get_group_id(0);
  long bh = g / per_bh, i0 = (g - bh * per_bh) * RQ;
  int nr = (int)min((long)RQ, L - i0);
  int lid = (int)get_local_id(0), LS = (int)get_local_size(0);
  long row0 = bh * L + i0;
  __global const T* kb = k + k_off + bh * S * E;
  __global const T* vb = v + v_off + bh * S * Ev;
  bp_load_rows(qs, q + q_off, row0, nr, E);
  bp_load_rows(gs, dout + g_off, row0, nr, Ev);
  for (long t = lid; t < RQ * E; t += LS) acc[t] = (ACC)0;
  barrier(CLK_LOCAL_MEM_FENCE);
  ACC lse_r[RQ], D[RQ], d[RQ], dg[RQ];
  long jmax = 0;
  for (int r = 0; r < RQ; ++r) {
    lse_r[r] = r < nr ? (ACC)lse[l_off + row0 + r] : (ACC)(-INFINITY);
    D[r] = r < nr ? delta[row0 + r] : (ACC)0;
    if (lse_r[r] != (ACC)(-INFINITY)) jmax = causal ? min(S, i0 + r + 1) : S;
  }
  for (long j0 = 0; j0 < jmax; j0 += LS) {
    long j = j0 + lid;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (j < jmax) {
      BP_DOTS(d, qs, kb + j * E, E)
      BP_DOTS(dg, gs, vb + j * Ev, Ev)
      for (int r = 0; r < RQ; ++r) {
        ACC ds = (ACC)0;
        if (lse_r[r] != (ACC)(-INFINITY) && !(causal && j > i0 + r)) {
          ACC p = exp(scale * d[r] - lse_r[r]);
          ACC z = bp_keep(seed, offset, (ulong)((row0 + r) * S + j), threshold, zscale);
          ds = p * (z * dg[r] - D[r]);
        }
        ps[r * LS + lid] = ds;
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    bp_accumulate(acc, ps, kb + j0 * E, min((long)LS, jmax - j0), E);
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (long t = lid; t < nr * E; t += LS) dq[dq_off + row0 * E + t] = ST(scale * acc[t]);
}

/* One work-group per RQ key rows j0 .. j0 + nk - 1 of one (b, h). */
__kernel void bp_attn_dkdv(__global T* dk, __global T* dv, __global const T* q,
                           __global const T* k, __global const T* v, __global const T* dout,
                           __global const SST* lse, __global const ACC* delta, long L, long S,
                           long E, long Ev, long dk_off, long dv_off, long q_off, long k_off,
                           long v_off, long g_off, long l_off, ACC scale, int causal, ulong seed,
                           ulong offset, uint threshold, ACC zscale, __local ACC* ks,
                           __local ACC* vs, __local ACC* dss, __local ACC* pzs, __local ACC* acck,
                           __local ACC* accv) {
  long per_bh = (S + RQ - 1) / RQ, g = get_group_id(0);
  long bh = g / per_bh, j0 = (g - bh * per_bh) * RQ;
  int nk = (int)min((long)RQ, S - j0);
  int lid = (int)get_local_id(0), LS = (int)get_local_size(0);
  long col0 = bh * S + j0;
  __global const T* qb = q + q_off + bh * L * E;
  __global const T* gb = dout + g_off + bh * L * Ev;
  bp_load_rows(ks, k + k_off, col0, nk, E);
  bp_load_rows(vs, v + v_off, col0, nk, Ev);
  for (long t = lid; t < RQ * E; t += LS) acck[t] = (ACC)0;
  for (long t = lid; t < RQ * Ev; t += LS) accv[t] = (ACC)0;
  barrier(CLK_LOCAL_MEM_FENCE);
  ACC d[RQ], dg[RQ];
  long istart = causal ? min(j0, L) : 0;
  for (long i0 = istart; i0 < L; i0 += LS) {
    long i = i0 + lid;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (i < L) {
      ACC lse_i = (ACC)lse[l_off + bh * L + i];
      BP_DOTS(d, ks, qb + i * E, E)
      BP_DOTS(dg, vs, gb + i * Ev, Ev)
      ACC D = delta[bh * L + i];
      for (int r = 0; r < RQ; ++r) {
        ACC ds = (ACC)0, pz = (ACC)0;
        if (r < nk && lse_i != (ACC)(-INFINITY) && !(causal && j0 + r > i)) {
          ACC p = exp(scale * d[r] - lse_i);
          ACC z =
              bp_keep(seed, offset, (ulong)((bh * L + i) * S + j0 + r), threshold, zscale);
          pz = p * z;
          ds = p * (z * dg[r] - D);
        }
        dss[r * LS + lid] = ds;
        pzs[r * LS + lid] = pz;
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    long cnt = min((long)LS, L - i0);
    bp_accumulate(acck, dss, qb + i0 * E, cnt, E);
    bp_accumulate(accv, pzs, gb + i0 * Ev, cnt, Ev);
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (long t = lid; t < nk * E; t += LS) dk[dk_off + col0 * E + t] = ST(scale * acck[t]);
  for (long t = lid; t < nk * Ev; t += LS) dv[dv_off + col0 * Ev + t] = ST(accv[t]);
}
)CLC";

enum Slot : size_t { kFwd = 0, kDelta = 1, kDq = 2, kDkdv = 3 };

// Query (or key) rows per work-group: each key (query) row read from global memory serves this
// many rows (Note [Attention kernels]).
constexpr uint64_t kRows = 4;

// Work-groups per (b, h) over n rows.
int64_t row_groups(int64_t n) {
  return (n + static_cast<int64_t>(kRows) - 1) / static_cast<int64_t>(kRows);
}

// Bytes of kRows rows of n accumulators (at least one element).
size_t rows_bytes(int64_t n, size_t es) {
  return static_cast<size_t>(kRows) * static_cast<size_t>(std::max<int64_t>(n, 1)) * es;
}

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
  check_local(k, s, kRows * static_cast<uint64_t>(s.E + s.Ev + local) + local);
  size_t global = static_cast<size_t>(s.B * s.H * row_groups(s.L)) * local;
  std::lock_guard<std::mutex> lock(k.mutex);
  KernelArgs a(k.kernels[kFwd]);
  a.mem(out[0].buffer).mem(out[1].buffer).mem(in[0].buffer).mem(in[1].buffer).mem(in[2].buffer);
  for (int64_t v : {s.L, s.S, s.E, s.Ev, o_off, l_off, q_off, k_off, v_off})
    a.value(static_cast<cl_long>(v));
  common_args(k, a, at);
  const size_t es = acc_size(k);
  a.local(rows_bytes(s.E, es)).local(kRows * local * es);
  a.local(rows_bytes(s.Ev, es)).local(local * es);
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
  check_local(k, s, kRows * static_cast<uint64_t>(2 * s.E + s.Ev + lq));
  check_local(k, s, kRows * static_cast<uint64_t>(2 * s.E + 2 * s.Ev + 2 * lkv));
  TempBuffer delta(lc, static_cast<uint64_t>(rows) * es);
  std::lock_guard<std::mutex> lock(k.mutex);
  if (rows > 0) {
    size_t local = k.local_size[kDelta];
    size_t global = grid_size(static_cast<uint64_t>(rows), local);
    KernelArgs a(k.kernels[kDelta]);
    a.mem(delta.buf).mem(in[3].buffer).mem(in[4].buffer);
    for (int64_t v : {rows, s.Ev, o_off, g_off}) a.value(static_cast<cl_long>(v));
    enqueue_kernel(lc, k, kDelta, 1, &global, &local);

    global = static_cast<size_t>(s.B * s.H * row_groups(s.L)) * lq;
    KernelArgs d(k.kernels[kDq]);
    d.mem(out[0].buffer);
    for (int32_t j : {0, 1, 2, 4, 5}) d.mem(in[j].buffer);
    d.mem(delta.buf);
    for (int64_t v : {s.L, s.S, s.E, s.Ev, dq_off, q_off, k_off, v_off, g_off, l_off})
      d.value(static_cast<cl_long>(v));
    common_args(k, d, at);
    d.local(rows_bytes(s.E, es)).local(rows_bytes(s.Ev, es));
    d.local(kRows * lq * es).local(rows_bytes(s.E, es));
    enqueue_kernel(lc, k, kDq, 1, &global, &lq);
  }
  if (cols == 0) return;
  size_t global = static_cast<size_t>(s.B * s.H * row_groups(s.S)) * lkv;
  KernelArgs d(k.kernels[kDkdv]);
  d.mem(out[1].buffer).mem(out[2].buffer);
  for (int32_t j : {0, 1, 2, 4, 5}) d.mem(in[j].buffer);
  d.mem(delta.buf ? delta.buf : out[1].buffer);
  for (int64_t v : {s.L, s.S, s.E, s.Ev, dk_off, dv_off, q_off, k_off, v_off, g_off, l_off})
    d.value(static_cast<cl_long>(v));
  common_args(k, d, at);
  const size_t e1 = rows_bytes(s.E, es), v1 = rows_bytes(s.Ev, es);
  d.local(e1).local(v1).local(kRows * lkv * es).local(kRows * lkv * es).local(e1).local(v1);
  enqueue_kernel(lc, k, kDkdv, 1, &global, &lkv);
}

}  // namespace

std::string attention_source(int32_t dtype, bool fp64) {
  std::string s = kernel_prelude(dtype, fp64);
  s += dtype == BP_DTYPE_F64 ? "#define ACC double\n#define SST double\n"
                             : "#define ACC float\n#define SST float\n";
  s += sdk::format("#define RQ %d\n", static_cast<int>(kRows));
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
