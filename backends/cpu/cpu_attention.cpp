// scaled_dot_product_attention and its backward (Note [Op catalogue], minor 5).
//
// Note [CPU attention]
//   Blocked matrix products around a stable softmax. The work of one (batch, head) is split into
//   blocks of query rows; a block's scores S = scale Q K^T come from one gemm (oneDNN's sgemm for
//   f32, OpenBLAS's dgemm for f64; f16/bf16 are converted to f32 first, per (batch, head)), over
//   only the keys a causal mask leaves (j < block end). Each row subtracts its maximum before
//   exp (SLEEF's vector exp, Note [CPU vector math]) and sums in double (f32 rows: the vector
//   sums of Note [CPU f32 sums], whose lanes end in double), so any finite input
//   gives finite results whatever the row length; lse = max + log(sum) is saved. The weights,
//   times the dropout factor z of the Philox draw, multiply V in a second gemm. The block height
//   keeps the score tile near 256K values, so memory grows with the key length but never with
//   L x S. The backward recomputes the block's probabilities from the saved lse, then
//   dV += (P z)^T dO, dS = P (z dO V^T - D) with D = rowsum(dO o), dQ = scale dS K and
//   dK += scale dS^T Q; its (batch, head) pairs run in parallel and the query blocks of one pair
//   in order, since they all add into the pair's dK and dV. The gemms run one-threaded inside
//   oneTBB tasks (Note [One thread pool] in cpu_matmul.cpp).
#include "cpu_dnnl_cache.hpp"
#include "cpu_nn.hpp"
#include "cpu_vmath.hpp"

#include <backplane/abi/philox.h>

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include <cmath>
#include <limits>
#include <vector>

namespace bp::cpu {
namespace {

// Row-major C = alpha op(A) op(B) + beta C, one-threaded.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  OmpThreads threads(1);
  const dnnl_status_t st =
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, std::max<int64_t>(lda, 1), b,
                 std::max<int64_t>(ldb, 1), beta, c, std::max<int64_t>(ldc, 1));
  if (st != dnnl_success)
    bp::sdk::fail(BP_ERROR_INTERNAL,
                  bp::sdk::format("cpu:0: scaled_dot_product_attention: dnnl_sgemm(%lld x %lld x "
                                  "%lld) failed with oneDNN status %d",
                                  static_cast<long long>(m), static_cast<long long>(n),
                                  static_cast<long long>(k), static_cast<int>(st)));
}
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(std::max<int64_t>(lda, 1)), b,
              static_cast<int>(std::max<int64_t>(ldb, 1)), beta, c,
              static_cast<int>(std::max<int64_t>(ldc, 1)));
}

struct Geometry {
  int64_t B, H, L, S, E, Ev;
};

struct AttnAttrs {
  double scale, p;
  bool causal;
  uint64_t seed, offset;
};

AttnAttrs read_attrs(const Launch& l, int64_t E) {
  AttnAttrs a;
  a.scale = l.attrs.f(BP_ATTR_ID_SCALE, E > 0 ? 1.0 / std::sqrt(static_cast<double>(E)) : 1.0);
  a.p = l.attrs.f(BP_ATTR_ID_P, 0.0);
  a.causal = l.attrs.i(BP_ATTR_ID_CAUSAL, 0) != 0;
  a.seed = static_cast<uint64_t>(l.attrs.i(BP_ATTR_ID_SEED, 0));
  a.offset = static_cast<uint64_t>(l.attrs.i(BP_ATTR_ID_OFFSET, 0));
  if (!(a.p >= 0.0 && a.p < 1.0)) launch_error(l, bp::sdk::format("p = %g is outside [0, 1)", a.p));
  return a;
}

template <class T>
Geometry check_qkv(const Launch& l) {
  const bp_tensor_desc &q = l.inputs[0], &k = l.inputs[1], &v = l.inputs[2];
  check_dense(l, q, 4, DType<T>::id, "q");
  check_dense(l, k, 4, DType<T>::id, "k");
  check_dense(l, v, 4, DType<T>::id, "v");
  const Geometry g{q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3]};
  check_shape(l, k, {g.B, g.H, g.S, g.E}, "k");
  check_shape(l, v, {g.B, g.H, g.S, g.Ev}, "v");
  return g;
}

// The dropout factor z_ij of element `element` (Note [Op catalogue]).
template <class C>
C keep_factor(const AttnAttrs& a, uint64_t element) {
  if (a.p <= 0) return C(1);
  const float u = bp_philox_uniform01(a.seed, a.offset + element);
  return static_cast<double>(u) < a.p ? C(0) : static_cast<C>(1.0 / (1.0 - a.p));
}

// The values of one (batch, head) slice of a dense tensor in the compute type: the memory itself
// for f32/f64, else a converted copy.
template <class T>
class Slice {
 public:
  using C = compute_t<T>;
  Slice(const T* p, int64_t n) {
    if constexpr (std::is_same_v<T, C>) {
      ptr_ = p;
    } else {
      copy_.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) copy_[static_cast<size_t>(i)] = DType<T>::load(p[i]);
      ptr_ = copy_.data();
    }
  }
  const C* data() const { return ptr_; }

 private:
  const C* ptr_ = nullptr;
  std::vector<C> copy_;
};

// Query rows per block: the score tile near 256K values, at least 1 row.
int64_t block_rows(const Geometry& g) {
  return std::max<int64_t>(1, std::min<int64_t>(std::max<int64_t>(g.L, 1),
                                                (int64_t{1} << 18) / std::max<int64_t>(g.S, 1)));
}

// Scores of query rows [i0, i0 + n) (their values at qblk) against keys [0, s):
// s_ij = scale q_i . k_j, the masked ones -inf, into sc (n x s, row-major).
template <class C>
void scores(const C* qblk, const C* k, int64_t i0, int64_t n, int64_t s, int64_t E,
            const AttnAttrs& a, C* sc) {
  if (E == 0) {
    std::fill(sc, sc + n * s, C(0));
  } else {
    gemm(false, true, n, s, E, static_cast<C>(a.scale), qblk, E, k, E, C(0), sc, s);
  }
  if (a.causal)
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = i0 + r + 1; j < s; ++j) sc[r * s + j] = -std::numeric_limits<C>::infinity();
}

template <class T>
void attention_kernel(const Launch& l) {
  using C = compute_t<T>;
  using ST = std::conditional_t<std::is_same_v<T, double>, double, float>;  // lse's type
  check_arity(l, 3, 2);
  const Geometry g = check_qkv<T>(l);
  const bp_tensor_desc &out = l.outputs[0], &lse = l.outputs[1];
  check_dense(l, out, 4, DType<T>::id, "out");
  check_shape(l, out, {g.B, g.H, g.L, g.Ev}, "out");
  check_dense(l, lse, 3, std::is_same_v<T, double> ? BP_DTYPE_F64 : BP_DTYPE_F32, "lse");
  check_shape(l, lse, {g.B, g.H, g.L}, "lse");
  const AttnAttrs a = read_attrs(l, g.E);
  const T* pq = data<T>(l.inputs[0]);
  const T* pk = data<T>(l.inputs[1]);
  const T* pv = data<T>(l.inputs[2]);
  T* po = data<T>(out);
  ST* pl = data<ST>(lse);
  const int64_t rows = block_rows(g);
  const int64_t blocks = (g.L + rows - 1) / rows;
  parallel_units(g.B * g.H * blocks, rows * (g.S * (g.E + g.Ev) + 1), Cost::kReduction,
                 [&](int64_t ub, int64_t ue) {
                   std::vector<C> sc, acc;
                   for (int64_t u = ub; u < ue; ++u) {
                     const int64_t bh = u / blocks, i0 = (u % blocks) * rows;
                     const int64_t n = std::min(rows, g.L - i0);
                     const int64_t s =
                         a.causal ? std::min(g.S, i0 + n) : g.S;  // keys any row of the block sees
                     const Slice<T> q(pq + (bh * g.L + i0) * g.E, n * g.E);
                     const Slice<T> k(pk + bh * g.S * g.E, s * g.E);
                     const Slice<T> v(pv + bh * g.S * g.Ev, s * g.Ev);
                     sc.resize(static_cast<size_t>(n * s));
                     acc.assign(static_cast<size_t>(n * g.Ev), C(0));
                     scores(q.data(), k.data(), i0, n, s, g.E, a, sc.data());
                     for (int64_t r = 0; r < n; ++r) {
                       C* row = sc.data() + r * s;
                       C m = -std::numeric_limits<C>::infinity();
                       for (int64_t j = 0; j < s; ++j) m = std::max(m, row[j]);
                       const int64_t i = i0 + r;
                       if (m == -std::numeric_limits<C>::infinity()) {  // no key: out 0, lse -inf
                         std::fill(row, row + s, C(0));
                         pl[bh * g.L + i] = -std::numeric_limits<ST>::infinity();
                         continue;
                       }
                       for (int64_t j = 0; j < s; ++j) row[j] -= m;
                       vmath::unary(vmath::kExp, row, row, s);
                       const double sum = sum_of(row, s);
                       pl[bh * g.L + i] = static_cast<ST>(static_cast<double>(m) + std::log(sum));
                       const C inv = static_cast<C>(1.0 / sum);
                       const uint64_t first = static_cast<uint64_t>((bh * g.L + i) * g.S);
                       if (a.p <= 0) {  // no dropout: one vectorised scaling
                         for (int64_t j = 0; j < s; ++j) row[j] *= inv;
                       } else {
                         for (int64_t j = 0; j < s; ++j)
                           row[j] *= inv * keep_factor<C>(a, first + static_cast<uint64_t>(j));
                       }
                     }
                     if (s > 0)
                       gemm(false, false, n, g.Ev, s, C(1), sc.data(), s, v.data(), g.Ev, C(0),
                            acc.data(), g.Ev);
                     T* o = po + (bh * g.L + i0) * g.Ev;
                     for (int64_t e = 0; e < n * g.Ev; ++e)
                       o[e] = DType<T>::store(acc[static_cast<size_t>(e)]);
                   }
                 });
}

template <class T>
void attention_backward_kernel(const Launch& l) {
  using C = compute_t<T>;
  using ST = std::conditional_t<std::is_same_v<T, double>, double, float>;
  check_arity(l, 6, 3);
  const Geometry g = check_qkv<T>(l);
  const bp_tensor_desc &o = l.inputs[3], &dout = l.inputs[4], &lse = l.inputs[5];
  check_dense(l, o, 4, DType<T>::id, "out");
  check_shape(l, o, {g.B, g.H, g.L, g.Ev}, "out");
  check_dense(l, dout, 4, DType<T>::id, "dout");
  check_shape(l, dout, {g.B, g.H, g.L, g.Ev}, "dout");
  check_dense(l, lse, 3, std::is_same_v<T, double> ? BP_DTYPE_F64 : BP_DTYPE_F32, "lse");
  check_shape(l, lse, {g.B, g.H, g.L}, "lse");
  const char* roles[] = {"dq", "dk", "dv"};
  for (int t = 0; t < 3; ++t) {
    check_dense(l, l.outputs[t], 4, DType<T>::id, roles[t]);
    check_same_shape(l, l.outputs[t], l.inputs[t], roles[t]);
  }
  const AttnAttrs a = read_attrs(l, g.E);
  const T *pq = data<T>(l.inputs[0]), *pk = data<T>(l.inputs[1]), *pv = data<T>(l.inputs[2]);
  const T *po = data<T>(o), *pg = data<T>(dout);
  const ST* pl = data<ST>(lse);
  T *pdq = data<T>(l.outputs[0]), *pdk = data<T>(l.outputs[1]), *pdv = data<T>(l.outputs[2]);
  const int64_t rows = block_rows(g);
  parallel_units(
      g.B * g.H, g.L * (g.S * (2 * g.E + 2 * g.Ev) + 1), Cost::kReduction,
      [&](int64_t ub, int64_t ue) {
        std::vector<C> p, dp, dq, dk, dv;
        for (int64_t bh = ub; bh < ue; ++bh) {
          const Slice<T> q(pq + bh * g.L * g.E, g.L * g.E), k(pk + bh * g.S * g.E, g.S * g.E);
          const Slice<T> v(pv + bh * g.S * g.Ev, g.S * g.Ev), go(pg + bh * g.L * g.Ev, g.L * g.Ev);
          dq.assign(static_cast<size_t>(g.L * g.E), C(0));
          dk.assign(static_cast<size_t>(g.S * g.E), C(0));
          dv.assign(static_cast<size_t>(g.S * g.Ev), C(0));
          for (int64_t i0 = 0; i0 < g.L; i0 += rows) {
            const int64_t n = std::min(rows, g.L - i0);
            const int64_t s = a.causal ? std::min(g.S, i0 + n) : g.S;
            if (s == 0) continue;
            p.resize(static_cast<size_t>(n * s));
            dp.resize(static_cast<size_t>(n * s));
            scores(q.data() + i0 * g.E, k.data(), i0, n, s, g.E, a, p.data());
            const C* gblk = go.data() + i0 * g.Ev;
            // dP = dO V^T over the block's keys.
            gemm(false, true, n, s, g.Ev, C(1), gblk, g.Ev, v.data(), g.Ev, C(0), dp.data(), s);
            for (int64_t r = 0; r < n; ++r) {
              const int64_t i = i0 + r;
              const double lr = static_cast<double>(pl[bh * g.L + i]);
              C* pr = p.data() + r * s;
              C* dpr = dp.data() + r * s;
              double d = 0;
              for (int64_t e = 0; e < g.Ev; ++e)
                d += static_cast<double>(DType<T>::load(po[(bh * g.L + i) * g.Ev + e])) *
                     static_cast<double>(gblk[r * g.Ev + e]);
              if (std::isinf(lr)) {  // no key: nothing flows back
                std::fill(pr, pr + s, C(0));
                std::fill(dpr, dpr + s, C(0));
                continue;
              }
              for (int64_t j = 0; j < s; ++j) pr[j] -= static_cast<C>(lr);
              vmath::unary(vmath::kExp, pr, pr, s);
              const uint64_t first = static_cast<uint64_t>((bh * g.L + i) * g.S);
              const C dd = static_cast<C>(d);
              if (a.p <= 0) {  // no dropout: z = 1, and P z is P
                for (int64_t j = 0; j < s; ++j) dpr[j] = pr[j] * (dpr[j] - dd);
              } else {
                for (int64_t j = 0; j < s; ++j) {
                  const C z = keep_factor<C>(a, first + static_cast<uint64_t>(j));
                  const C pij = pr[j];
                  dpr[j] = pij * (z * dpr[j] - dd);  // dS
                  pr[j] = pij * z;                   // P z, for dV
                }
              }
            }
            // dV += (P z)^T dO; dQ = scale dS K; dK += scale dS^T Q.
            gemm(true, false, s, g.Ev, n, C(1), p.data(), s, gblk, g.Ev, C(1), dv.data(), g.Ev);
            if (g.E > 0) {
              gemm(false, false, n, g.E, s, static_cast<C>(a.scale), dp.data(), s, k.data(), g.E,
                   C(0), dq.data() + i0 * g.E, g.E);
              gemm(true, false, s, g.E, n, static_cast<C>(a.scale), dp.data(), s,
                   q.data() + i0 * g.E, g.E, C(1), dk.data(), g.E);
            }
          }
          for (int64_t e = 0; e < g.L * g.E; ++e)
            pdq[bh * g.L * g.E + e] = DType<T>::store(dq[static_cast<size_t>(e)]);
          for (int64_t e = 0; e < g.S * g.E; ++e)
            pdk[bh * g.S * g.E + e] = DType<T>::store(dk[static_cast<size_t>(e)]);
          for (int64_t e = 0; e < g.S * g.Ev; ++e)
            pdv[bh * g.S * g.Ev + e] = DType<T>::store(dv[static_cast<size_t>(e)]);
        }
      });
}

}  // namespace

KernelFn attention_family(Op op, bp_dtype dtype) {
  return visit_dtype(dtype, [&]<class T>() -> KernelFn {
    if constexpr (is_floating_v<T>) {
      if (op == Op::kScaledDotProductAttention) return &attention_kernel<T>;
      if (op == Op::kScaledDotProductAttentionBackward) return &attention_backward_kernel<T>;
    }
    return nullptr;
  });
}

}  // namespace bp::cpu
