// Kernel cases of the fused classification loss (Note [Op catalogue], minor 8; Note [Fused cross
// entropy]): cross_entropy and cross_entropy_backward over logits [N, C] of one to 50257
// classes, rows ignored by the default IGNORE_INDEX (-100) and by a custom one that is also a
// valid class, LABEL_SMOOTHING 0.1 and 1, -inf logits (an attention-style mask, never at the
// target: the loss stays finite without smoothing and is +inf with it, as torch's), logits near
// +-1e4 (finite results: the row's maximum is subtracted first), an empty batch, and a target
// of C or -1 refused with BP_ERROR_INVALID_ARGUMENT naming the target, its row and C (at the
// launch or at the next synchronisation). Loss and lse are compared in the stats dtype (f32 for
// f16 and bf16 logits), dx in the logits' dtype, against float64 references.
#include "conformance_kernels.hpp"

#include <cmath>

namespace bpc {

namespace {

struct LossCase {
  const char* variant;
  int64_t n, c;
  enum Data { random, masked, large_magnitude } data = random;
  double smoothing = -1;     // >= 0: send LABEL_SMOOTHING
  int64_t ignore_index = 0;  // != 0: send IGNORE_INDEX with this value
  int64_t ignored_rows = 0;  // rows (of every third) whose target is the ignore index
  int64_t bad_target = 0;    // != 0: the target of row n / 2 is this value; expect an error
};

// f32 for f16 and bf16 logits, the logits' dtype otherwise (Note [Op catalogue], minor 8).
int32_t stats_dtype(int32_t dt) {
  return dt == BP_DTYPE_F16 || dt == BP_DTYPE_BF16 ? BP_DTYPE_F32 : dt;
}

int64_t ignore_of(const LossCase& c) {
  return c.ignore_index ? c.ignore_index : -100;
}

HostTensor loss_logits(Rng& rng, int32_t dt, const LossCase& c, const std::vector<double>& target) {
  HostTensor x = random_dense(rng, dt, {c.n, c.c}, Range{-4.0, 4.0});
  if (c.data == LossCase::large_magnitude) {
    for (double& v : x.storage) v = round_to(dt, v + (rng.coin() ? 1e4 : -1e4));
  } else if (c.data == LossCase::masked) {
    // -inf in about a third of each row, never at its target (nor at column 0 of an ignored
    // row, so that no row is all -inf).
    for (int64_t r = 0; r < c.n; ++r) {
      const auto t = static_cast<int64_t>(target[static_cast<size_t>(r)]);
      for (int64_t j = 0; j < c.c; ++j)
        if (j != t && (t >= 0 || j > 0) && rng.uniform(0.0, 1.0) < 1.0 / 3.0)
          x.storage[static_cast<size_t>(r * c.c + j)] = -INFINITY;
    }
  }
  return x;
}

// Targets in [0, C); every third row from row 1 (ignored_rows of them) takes the ignore index;
// with a custom ignore index that is a class, the other rows may also draw it.
HostTensor loss_targets(Rng& rng, const LossCase& c) {
  HostTensor t =
      random_dense(rng, BP_DTYPE_I64, {c.n}, Range{0, static_cast<double>(c.c - 1), true});
  int64_t left = c.ignored_rows;
  for (int64_t r = 1; r < c.n && left > 0; r += 3, --left)
    t.storage[static_cast<size_t>(r)] = static_cast<double>(ignore_of(c));
  if (c.bad_target) t.storage[static_cast<size_t>(c.n / 2)] = static_cast<double>(c.bad_target);
  return t;
}

std::vector<bp_attr> loss_attrs(const LossCase& c) {
  std::vector<bp_attr> a;
  if (c.ignore_index) a.push_back(attr_int("ignore_index", c.ignore_index));
  if (c.smoothing >= 0) a.push_back(attr_float("label_smoothing", c.smoothing));
  return a;
}

std::string loss_extra(const LossCase& c) {
  std::string s = format("ignore_index %lld", static_cast<long long>(ignore_of(c)));
  if (c.smoothing >= 0) s += format(", label_smoothing %g", c.smoothing);
  if (c.ignored_rows) s += format(", %lld rows ignored", static_cast<long long>(c.ignored_rows));
  return s;
}

// The float64 forward of every row: lse (and its magnitude |m| + log(s) + 1: the absolute error
// of a log of a sum of exps is about the sum's relative error), loss (0 for an ignored row) and
// its magnitude (lse's plus the terms subtracted from it).
struct LossRef {
  std::vector<double> lse, lse_mag, loss, loss_mag;
};

LossRef loss_ref(const LossCase& c, const std::vector<double>& x, const std::vector<double>& t) {
  const double e = c.smoothing >= 0 ? c.smoothing : 0.0;
  LossRef r;
  for (int64_t n = 0; n < c.n; ++n) {
    const double* row = x.data() + n * c.c;
    double m = -INFINITY, s = 0, sum_x = 0, sum_abs = 0;
    for (int64_t j = 0; j < c.c; ++j) m = std::max(m, row[j]);
    for (int64_t j = 0; j < c.c; ++j) {
      s += std::exp(row[j] - m);
      sum_x += row[j];
      sum_abs += std::fabs(row[j]);
    }
    const double lse = m + std::log(s), lse_mag = std::fabs(m) + std::log(s) + 1;
    const auto tn = static_cast<int64_t>(t[static_cast<size_t>(n)]);
    r.lse.push_back(lse);
    r.lse_mag.push_back(lse_mag);
    if (tn == ignore_of(c)) {
      r.loss.push_back(0);
      r.loss_mag.push_back(0);
      continue;
    }
    const double xt = row[tn];
    // Without smoothing the sum of the row is no term of the loss (a -inf logit stays finite).
    r.loss.push_back(lse - (1 - e) * xt - (e > 0 ? e / static_cast<double>(c.c) * sum_x : 0));
    r.loss_mag.push_back(lse_mag + (1 - e) * std::fabs(xt) +
                         (e > 0 ? e / static_cast<double>(c.c) * sum_abs : 0));
  }
  return r;
}

void expect_target_error(Context& ctx, const OpInfo& op, int32_t dt,
                         const std::vector<bp_tensor_desc>& ins,
                         const std::vector<bp_tensor_desc>& outs, const std::vector<bp_attr>& attrs,
                         const LossCase& c, const std::string& full) {
  const std::string msg = run_kernel_n_expect_error(
      ctx, op.name, dt, ins, outs, attrs, BP_ERROR_INVALID_ARGUMENT,
      full + format(" (target %lld of row %lld outside [0, %lld))",
                    static_cast<long long>(c.bad_target), static_cast<long long>(c.n / 2),
                    static_cast<long long>(c.c)));
  for (const std::string& part :
       {std::to_string(c.bad_target), std::to_string(c.n / 2), std::to_string(c.c)})
    if (msg.find(part) == std::string::npos)
      throw Failure(full + ": the error does not name the target " + std::to_string(c.bad_target) +
                    ", its row " + std::to_string(c.n / 2) + " and the number of classes " +
                    std::to_string(c.c) + ": " + msg);
}

void run_cross_entropy(Context& ctx, const OpInfo& op, int32_t dt, const LossCase& c) {
  const std::string what = case_label(ctx, op, dt, c.variant);
  Rng rng(ctx.seed_for(std::string(op.name) + "_" + c.variant + "/" + bp_dtype_name(dt)));
  const int32_t sdt = stats_dtype(dt);
  HostTensor t = loss_targets(rng, c);
  HostTensor x = loss_logits(rng, dt, c, t.logical());
  const std::vector<bp_attr> attrs = loss_attrs(c);
  DeviceTensor dx = upload(ctx, x), dtg = upload(ctx, t);
  DeviceTensor loss = make_output(ctx, sdt, {c.n}), lse = make_output(ctx, sdt, {c.n});
  const std::string full =
      what + ": " +
      describe_launch(op.name, {&x, &t}, {c.n}, sdt, loss_extra(c) + "; and lse of the same");
  if (c.bad_target)
    return expect_target_error(ctx, op, dt, {dx.desc, dtg.desc}, {loss.desc, lse.desc}, attrs, c,
                               full);
  run_kernel_n(ctx, op.name, dt, {dx.desc, dtg.desc}, {loss.desc, lse.desc}, attrs, full);
  LossRef r = loss_ref(c, x.logical(), t.logical());
  for (double& v : r.lse) v = round_to(sdt, v);
  for (double& v : r.loss) v = round_to(sdt, v);
  const std::vector<double> got_lse = read_dense(lse, full), got_loss = read_dense(loss, full);
  for (int64_t n = 0; n < c.n; ++n) {
    const auto k = static_cast<size_t>(n);
    if (std::isfinite(r.lse[k]) && !std::isfinite(got_lse[k]))
      throw Failure(full + format(": lse of row %lld is %g: it is finite for any row with a finite "
                                  "logit (subtract the row's maximum first)",
                                  static_cast<long long>(n), got_lse[k]));
    if (std::isfinite(r.loss[k]) && !std::isfinite(got_loss[k]))
      throw Failure(full + format(": loss of row %lld is %g, expected %g (without label smoothing "
                                  "a -inf logit other than the target's is no term of the loss)",
                                  static_cast<long long>(n), got_loss[k], r.loss[k]));
  }
  expect_close_mag(got_lse, r.lse, r.lse_mag, sdt, bp_test::OpClass::reduction, full + " (lse)");
  expect_close_mag(got_loss, r.loss, r.loss_mag, sdt, bp_test::OpClass::reduction,
                   full + " (loss; 0 for an ignored row)");
}

void run_cross_entropy_backward(Context& ctx, const OpInfo& op, int32_t dt, const LossCase& c) {
  const std::string what = case_label(ctx, op, dt, c.variant);
  Rng rng(ctx.seed_for(std::string(op.name) + "_" + c.variant + "/" + bp_dtype_name(dt)));
  const int32_t sdt = stats_dtype(dt);
  const double e = c.smoothing >= 0 ? c.smoothing : 0.0;
  HostTensor t = loss_targets(rng, c);
  HostTensor x = loss_logits(rng, dt, c, t.logical());
  const std::vector<double> xv = x.logical(), tv = t.logical();
  // The forward's lse (rounded to the stats dtype, as the host passes it) and a random dloss,
  // nonzero on ignored rows too: their gradient is 0 whatever dloss holds.
  HostTensor lse = dense_values(sdt, {c.n}, loss_ref(c, xv, tv).lse);
  HostTensor dloss = random_dense(rng, sdt, {c.n}, Range{-1.0, 1.0});
  const std::vector<double> lv = lse.logical(), gv = dloss.logical();
  const std::vector<bp_attr> attrs = loss_attrs(c);
  DeviceTensor dx = upload(ctx, x), dtg = upload(ctx, t), dl = upload(ctx, lse),
               dg = upload(ctx, dloss);
  DeviceTensor out = make_output(ctx, dt, {c.n, c.c});
  const std::string full =
      what + ": " + describe_launch(op.name, {&x, &t, &lse, &dloss}, {c.n, c.c}, dt, loss_extra(c));
  if (c.bad_target)
    return expect_target_error(ctx, op, dt, {dx.desc, dtg.desc, dl.desc, dg.desc}, {out.desc},
                               attrs, c, full);
  run_kernel_n(ctx, op.name, dt, {dx.desc, dtg.desc, dl.desc, dg.desc}, {out.desc}, attrs, full);
  std::vector<double> ref(xv.size()), mag(xv.size());
  for (int64_t n = 0; n < c.n; ++n) {
    const auto tn = static_cast<int64_t>(tv[static_cast<size_t>(n)]);
    if (tn == ignore_of(c)) continue;
    const double g = gv[static_cast<size_t>(n)], l = lv[static_cast<size_t>(n)];
    for (int64_t j = 0; j < c.c; ++j) {
      const auto k = static_cast<size_t>(n * c.c + j);
      // exp(x - lse) carries the rounding of its argument times (1 + |x - lse|); a -inf
      // logit's is exactly 0.
      const double p = std::exp(xv[k] - l), hot = j == tn ? 1 - e : 0;
      ref[k] = round_to(dt, g * (p - hot - e / static_cast<double>(c.c)));
      const double exp_mag = p > 0 ? p * (1 + std::fabs(xv[k] - l)) : 0;
      mag[k] = std::fabs(g) * (exp_mag + hot + e / static_cast<double>(c.c));
    }
  }
  const std::vector<double> got = read_dense(out, full);
  for (size_t k = 0; k < got.size(); ++k) {
    const size_t n = k / static_cast<size_t>(c.c);
    if (static_cast<int64_t>(tv[n]) == ignore_of(c) && got[k] != 0)
      throw Failure(full + format(": row %zu is ignored (target %lld) but dx holds %g at column "
                                  "%zu (must be 0)",
                                  n, static_cast<long long>(tv[n]), got[k],
                                  k % static_cast<size_t>(c.c)));
  }
  // An exp, a subtraction and a product before the one rounding.
  expect_close_mag(got, ref, mag, dt, bp_test::OpClass::elementwise, full, 2);
}

}  // namespace

void loss_cases(const OpInfo& op, int32_t dt, CaseList& out) {
  // variant, N, C, data, label_smoothing, ignore_index, ignored rows, bad target
  static const std::vector<LossCase> cases = {
      {"one_class", 1, 1},
      {"single_column", 6, 1, LossCase::random, 0.1},
      {"rows", 3, 7},
      {"wide", 5, 1000},
      {"long", 8, 4099},
      {"vocabulary", 4, 50257},
      {"empty", 0, 7},
      {"ignore_default", 10, 13, LossCase::random, -1, 0, 3},
      // A custom ignore index that is also a class: rows drawing class 3 are ignored too.
      {"ignore_class", 12, 5, LossCase::random, -1, 3, 4},
      {"smoothing", 6, 37, LossCase::random, 0.1},
      {"smoothing_full", 6, 37, LossCase::random, 1.0},
      {"smoothing_ignore", 10, 37, LossCase::random, 0.1, 0, 3},
      {"masked", 7, 37, LossCase::masked},
      {"masked_long", 3, 3001, LossCase::masked},
      {"masked_smoothing", 7, 37, LossCase::masked, 0.1, 0, 2},
      {"large_magnitude", 7, 33, LossCase::large_magnitude},
      {"large_magnitude_smoothing", 7, 33, LossCase::large_magnitude, 0.1},
      {"target_past_end", 5, 9, LossCase::random, -1, 0, 0, 9},
      {"target_negative", 5, 9, LossCase::random, -1, 0, 0, -1},
      // -100 is no ignore index when IGNORE_INDEX says 3.
      {"target_default_ignore", 5, 9, LossCase::random, -1, 3, 0, -100},
  };
  const bool backward = std::string(op.name) == "cross_entropy_backward";
  const OpInfo* p = &op;
  for (const LossCase& c : cases) {
    const LossCase* cp = &c;
    out.push_back({c.variant, [p, dt, cp, backward](Context& ctx) {
                     if (backward)
                       run_cross_entropy_backward(ctx, *p, dt, *cp);
                     else
                       run_cross_entropy(ctx, *p, dt, *cp);
                   }});
  }
}

}  // namespace bpc
