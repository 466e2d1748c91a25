// Kernel cases of scaled_dot_product_attention and its backward (Note [Op catalogue], minor 5):
// self- and cross-attention shapes, a value width other than the key width, the causal mask,
// an explicit scale, long rows whose scores reach 1e4 (finite results: the row's maximum is
// subtracted first), dropout with the Philox mask of Note [Philox stream], and empty tensors,
// against float64 references. The log-sum-exp output is checked too; the backward takes it from
// the reference forward.
#include "conformance_kernels.hpp"

#include <backplane/abi/philox.h>

#include <cmath>

namespace bpc {

namespace {

struct AttentionCase {
  const char* variant;
  int64_t b, h, l, s, e, ev;
  bool causal = false;
  double p = 0;           // dropout probability
  double scale = 0;       // 0: the default 1 / sqrt(E)
  double qk_range = 1.0;  // inputs of q and k drawn from [-qk_range, qk_range]
};

int32_t stat_dtype(int32_t dt) {
  return dt == BP_DTYPE_F16 || dt == BP_DTYPE_BF16 ? BP_DTYPE_F32 : dt;
}

struct Reference {
  std::vector<double> out, out_mag, lse;
};

constexpr uint64_t kSeed = 0x5eed1234abcdULL, kOffset = 4096;

double scale_of(const AttentionCase& c) {
  return c.scale != 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.e));
}

// z_ij of Note [Op catalogue] for element ((bh L + i) S + j).
double keep(const AttentionCase& c, int64_t element) {
  if (c.p <= 0) return 1.0;
  const float u = bp_philox_uniform01(kSeed, kOffset + static_cast<uint64_t>(element));
  return static_cast<double>(u) < c.p ? 0.0 : 1.0 / (1.0 - c.p);
}

// Probabilities p_ij of row (bh, i), masked ones 0; returns the log-sum-exp.
double row_probs(const AttentionCase& c, const std::vector<double>& q, const std::vector<double>& k,
                 int64_t bh, int64_t i, std::vector<double>& p) {
  const double scale = scale_of(c);
  p.assign(static_cast<size_t>(c.s), 0.0);
  double m = -INFINITY;
  std::vector<double> s(static_cast<size_t>(c.s), -INFINITY);
  for (int64_t j = 0; j < c.s; ++j) {
    if (c.causal && j > i) continue;
    double dot = 0;
    for (int64_t e = 0; e < c.e; ++e)
      dot += q[static_cast<size_t>((bh * c.l + i) * c.e + e)] *
             k[static_cast<size_t>((bh * c.s + j) * c.e + e)];
    s[static_cast<size_t>(j)] = scale * dot;
    m = std::max(m, scale * dot);
  }
  if (m == -INFINITY) return -INFINITY;
  double sum = 0;
  for (int64_t j = 0; j < c.s; ++j) sum += std::exp(s[static_cast<size_t>(j)] - m);
  const double lse = m + std::log(sum);
  for (int64_t j = 0; j < c.s; ++j)
    p[static_cast<size_t>(j)] = std::exp(s[static_cast<size_t>(j)] - lse);
  return lse;
}

Reference forward_ref(const AttentionCase& c, const std::vector<double>& q,
                      const std::vector<double>& k, const std::vector<double>& v) {
  Reference r;
  r.out.assign(static_cast<size_t>(c.b * c.h * c.l * c.ev), 0.0);
  r.out_mag = r.out;
  r.lse.assign(static_cast<size_t>(c.b * c.h * c.l), -INFINITY);
  std::vector<double> p;
  for (int64_t bh = 0; bh < c.b * c.h; ++bh)
    for (int64_t i = 0; i < c.l; ++i) {
      r.lse[static_cast<size_t>(bh * c.l + i)] = row_probs(c, q, k, bh, i, p);
      for (int64_t j = 0; j < c.s; ++j) {
        const double w = p[static_cast<size_t>(j)] * keep(c, (bh * c.l + i) * c.s + j);
        for (int64_t e = 0; e < c.ev; ++e) {
          const double t = w * v[static_cast<size_t>((bh * c.s + j) * c.ev + e)];
          r.out[static_cast<size_t>((bh * c.l + i) * c.ev + e)] += t;
          r.out_mag[static_cast<size_t>((bh * c.l + i) * c.ev + e)] += std::fabs(t);
        }
      }
    }
  return r;
}

std::string attrs_text(const AttentionCase& c) {
  return format("scale %g causal %d dropout %g", scale_of(c), c.causal ? 1 : 0, c.p);
}

std::vector<bp_attr> attrs_of(const AttentionCase& c) {
  std::vector<bp_attr> a = {attr_int("causal", c.causal ? 1 : 0)};
  if (c.scale != 0) a.push_back(attr_float("scale", c.scale));
  if (c.p > 0) {
    a.push_back(attr_float("p", c.p));
    a.push_back(attr_int("seed", static_cast<int64_t>(kSeed)));
    a.push_back(attr_int("offset", static_cast<int64_t>(kOffset)));
  }
  return a;
}

void run_attention(Context& ctx, const OpInfo& op, int32_t dt, const AttentionCase& c) {
  const bool backward = std::string(op.name).find("backward") != std::string::npos;
  const std::string what = case_label(ctx, op, dt, c.variant);
  Rng rng(ctx.seed_for(std::string(op.name) + "_" + c.variant + "/" + bp_dtype_name(dt)));
  const int32_t sdt = stat_dtype(dt);
  const std::vector<int64_t> qs = {c.b, c.h, c.l, c.e}, ks = {c.b, c.h, c.s, c.e},
                             vs = {c.b, c.h, c.s, c.ev}, os = {c.b, c.h, c.l, c.ev},
                             ls = {c.b, c.h, c.l};
  HostTensor q = random_dense(rng, dt, qs, Range{-c.qk_range, c.qk_range});
  HostTensor k = random_dense(rng, dt, ks, Range{-c.qk_range, c.qk_range});
  HostTensor v = random_dense(rng, dt, vs, Range{-1.0, 1.0});
  const std::vector<double> qv = q.logical(), kv = k.logical(), vv = v.logical();
  const Reference r = forward_ref(c, qv, kv, vv);
  // The scores carry the rounding of q . k relative to the dot product's terms: with scores of
  // size |s|, a relative error e in s is an error e |s| in p's exponent. Every output is judged
  // against its terms' size times (1 + the largest score), and the scale multiplies the table's
  // rtol by the number of rounded steps (scores, exponent, weighted sum).
  const double smax = scale_of(c) * c.qk_range * c.qk_range * static_cast<double>(c.e);
  const double steps = 1 + std::min(smax, 1e4);
  DeviceTensor dq = upload(ctx, q), dk = upload(ctx, k), dv = upload(ctx, v);
  const std::vector<bp_attr> attrs = attrs_of(c);
  if (!backward) {
    DeviceTensor out = make_output(ctx, dt, os), lse = make_output(ctx, sdt, ls);
    const std::string full =
        what + ": " + describe_launch(op.name, {&q, &k, &v}, os, dt, attrs_text(c));
    run_kernel_n(ctx, op.name, dt, {dq.desc, dk.desc, dv.desc}, {out.desc, lse.desc}, attrs, full);
    std::vector<double> oref(r.out.size()), omag(r.out.size());
    for (size_t i = 0; i < oref.size(); ++i) {
      oref[i] = round_to(dt, r.out[i]);
      omag[i] = r.out_mag[i] * (c.p > 0 ? 1.0 / (1.0 - c.p) : 1.0);
    }
    const std::vector<double> got = read_dense(out, full);
    for (size_t i = 0; i < got.size(); ++i)
      if (!std::isfinite(got[i]))
        throw Failure(full + format(": out element %zu is %g: attention of finite inputs is "
                                    "finite (subtract each row's maximum score first)",
                                    i, got[i]));
    expect_close_mag(got, oref, omag, dt, bp_test::OpClass::matmul, full + " (out)",
                     std::min(steps, 64.0));
    std::vector<double> lref(r.lse.size()), lmag(r.lse.size());
    for (size_t i = 0; i < lref.size(); ++i) {
      lref[i] = std::isinf(r.lse[i]) ? r.lse[i] : round_to(sdt, r.lse[i]);
      lmag[i] = std::isinf(r.lse[i]) ? 0 : std::fabs(r.lse[i]) + smax;
    }
    expect_close_mag(read_dense(lse, full), lref, lmag, sdt, bp_test::OpClass::matmul,
                     full + " (lse)", std::min(steps, 64.0));
    return;
  }
  // Backward: out and lse from the reference forward (rounded to their dtypes), dout random.
  HostTensor out = dense_values(dt, os, r.out), lse = dense_values(sdt, ls, r.lse);
  HostTensor dout = random_dense(rng, dt, os, Range{-1.0, 1.0});
  const std::vector<double> ov = out.logical(), gv = dout.logical();
  const double scale = scale_of(c);
  std::vector<double> dqr(qv.size()), dkr(kv.size()), dvr(vv.size());
  std::vector<double> dqm(qv.size()), dkm(kv.size()), dvm(vv.size());
  std::vector<double> p;
  for (int64_t bh = 0; bh < c.b * c.h; ++bh)
    for (int64_t i = 0; i < c.l; ++i) {
      if (std::isinf(row_probs(c, qv, kv, bh, i, p))) continue;
      double D = 0, Dm = 0;
      for (int64_t e = 0; e < c.ev; ++e) {
        D += gv[static_cast<size_t>((bh * c.l + i) * c.ev + e)] *
             ov[static_cast<size_t>((bh * c.l + i) * c.ev + e)];
        Dm += std::fabs(gv[static_cast<size_t>((bh * c.l + i) * c.ev + e)]) *
              std::fabs(ov[static_cast<size_t>((bh * c.l + i) * c.ev + e)]);
      }
      for (int64_t j = 0; j < c.s; ++j) {
        const double pij = p[static_cast<size_t>(j)];
        const double z = keep(c, (bh * c.l + i) * c.s + j);
        double g = 0, gm = 0;
        for (int64_t e = 0; e < c.ev; ++e) {
          const double ge = gv[static_cast<size_t>((bh * c.l + i) * c.ev + e)];
          const double ve = vv[static_cast<size_t>((bh * c.s + j) * c.ev + e)];
          g += ge * ve;
          gm += std::fabs(ge * ve);
          dvr[static_cast<size_t>((bh * c.s + j) * c.ev + e)] += pij * z * ge;
          dvm[static_cast<size_t>((bh * c.s + j) * c.ev + e)] += std::fabs(pij * z * ge);
        }
        const double ds = pij * (z * g - D), dsm = pij * (z * gm + Dm);
        for (int64_t e = 0; e < c.e; ++e) {
          const double ke = kv[static_cast<size_t>((bh * c.s + j) * c.e + e)];
          const double qe = qv[static_cast<size_t>((bh * c.l + i) * c.e + e)];
          dqr[static_cast<size_t>((bh * c.l + i) * c.e + e)] += scale * ds * ke;
          dqm[static_cast<size_t>((bh * c.l + i) * c.e + e)] += scale * dsm * std::fabs(ke);
          dkr[static_cast<size_t>((bh * c.s + j) * c.e + e)] += scale * ds * qe;
          dkm[static_cast<size_t>((bh * c.s + j) * c.e + e)] += scale * dsm * std::fabs(qe);
        }
      }
    }
  for (double& x : dqr) x = round_to(dt, x);
  for (double& x : dkr) x = round_to(dt, x);
  for (double& x : dvr) x = round_to(dt, x);
  DeviceTensor dot = upload(ctx, out), dlse = upload(ctx, lse), ddout = upload(ctx, dout);
  DeviceTensor gq = make_output(ctx, dt, qs), gk = make_output(ctx, dt, ks),
               gvv = make_output(ctx, dt, vs);
  const std::string full =
      what + ": " +
      describe_launch(op.name, {&q, &k, &v, &out, &dout, &lse}, qs, dt, attrs_text(c));
  run_kernel_n(ctx, op.name, dt, {dq.desc, dk.desc, dv.desc, dot.desc, ddout.desc, dlse.desc},
               {gq.desc, gk.desc, gvv.desc}, attrs, full);
  const double sc = std::min(steps, 64.0) * (c.p > 0 ? 1.0 / (1.0 - c.p) : 1.0);
  expect_close_mag(read_dense(gq, full), dqr, dqm, dt, bp_test::OpClass::matmul, full + " (dq)",
                   sc);
  expect_close_mag(read_dense(gk, full), dkr, dkm, dt, bp_test::OpClass::matmul, full + " (dk)",
                   sc);
  expect_close_mag(read_dense(gvv, full), dvr, dvm, dt, bp_test::OpClass::matmul, full + " (dv)",
                   sc);
}

}  // namespace

void attention_cases(const OpInfo& op, int32_t dt, CaseList& out) {
  static const std::vector<AttentionCase> cases = {
      {"self", 2, 3, 17, 17, 16, 16},
      {"cross", 1, 2, 9, 33, 8, 8},
      {"value_width", 1, 2, 12, 20, 16, 24},
      {"causal", 2, 2, 31, 31, 16, 16, true},
      {"causal_cross", 1, 2, 6, 19, 8, 8, true},
      {"scale", 1, 1, 8, 8, 4, 4, false, 0, 0.3},
      {"dropout", 1, 2, 16, 24, 8, 8, false, 0.25},
      {"dropout_causal", 1, 1, 20, 20, 8, 8, true, 0.5},
      // Scores up to about 1e4: exp of the raw scores overflows; the row maximum keeps it finite.
      {"large_scores", 1, 1, 8, 16, 16, 16, false, 0, 0, 50.0},
      {"long_rows", 1, 1, 4, 4099, 8, 8},
      {"one_key", 1, 2, 5, 1, 4, 4},
      {"empty_queries", 1, 2, 0, 8, 4, 4},
      {"no_keys", 1, 2, 3, 0, 4, 4},
  };
  const OpInfo* p = &op;
  for (const AttentionCase& c : cases) {
    const AttentionCase* cp = &c;
    out.push_back({c.variant, [p, dt, cp](Context& ctx) { run_attention(ctx, *p, dt, *cp); }});
  }
}

}  // namespace bpc
