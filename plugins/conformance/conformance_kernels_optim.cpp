// Kernel cases of the fused optimiser update (Note [Op catalogue], minor 7; Note [Fused Adam]):
// adamw with decoupled weight decay (AdamW) and with L2 decay (Adam), several parameters of odd
// shapes in one launch, a parameter of more than 2^20 elements beside a one-element one, 61
// parameters in one launch (more than one chunk of a multi-tensor kernel), and a first step
// (bias corrections of step 1). Every update is in place (the outputs are the inputs' memory)
// and every result (parameter, exp_avg, exp_avg_sq) is compared with a float64 reference.
#include "conformance_kernels.hpp"

#include <cmath>

namespace bpc {

namespace {

struct AdamCase {
  const char* variant;
  std::vector<std::vector<int64_t>> shapes;
  int64_t step = 3;
  bool decoupled = true;
  double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
};

void run_adamw(Context& ctx, const OpInfo& op, int32_t dt, const AdamCase& c) {
  const std::string what = case_label(ctx, op, dt, c.variant);
  Rng rng(ctx.seed_for(std::string(op.name) + "_" + c.variant + "/" + bp_dtype_name(dt)));
  const size_t n = c.shapes.size();
  std::vector<HostTensor> p(n), g(n), m(n), v(n);
  std::vector<DeviceTensor> dp(n), dg(n), dm(n), dv(n);
  std::vector<bp_tensor_desc> ins, outs;
  for (size_t k = 0; k < n; ++k) {
    p[k] = random_dense(rng, dt, c.shapes[k], Range{-2.0, 2.0});
    g[k] = random_dense(rng, dt, c.shapes[k], Range{-1.0, 1.0});
    m[k] = random_dense(rng, dt, c.shapes[k], Range{-0.5, 0.5});
    v[k] = random_dense(rng, dt, c.shapes[k], Range{0.0, 1.0});
    dp[k] = upload(ctx, p[k]);
    dg[k] = upload(ctx, g[k]);
    dm[k] = upload(ctx, m[k]);
    dv[k] = upload(ctx, v[k]);
    for (const DeviceTensor* t : {&dp[k], &dg[k], &dm[k], &dv[k]}) ins.push_back(t->desc);
    for (const DeviceTensor* t : {&dp[k], &dm[k], &dv[k]}) outs.push_back(t->desc);
  }
  const std::vector<bp_attr> attrs = {attr_float("lr", c.lr),
                                      attr_float("beta1", c.b1),
                                      attr_float("beta2", c.b2),
                                      attr_float("eps", c.eps),
                                      attr_float("weight_decay", c.wd),
                                      attr_int("step", c.step),
                                      attr_int("decoupled", c.decoupled ? 1 : 0)};
  const std::string full =
      what + ": " +
      describe_launch(
          op.name, {&p[0], &g[0], &m[0], &v[0]}, c.shapes[0], dt,
          format("%zu parameters, step %lld, %s, lr %g, weight_decay %g", n,
                 static_cast<long long>(c.step), c.decoupled ? "AdamW" : "Adam", c.lr, c.wd));
  run_kernel_n(ctx, op.name, dt, ins, outs, attrs, full);
  const double c1 = 1 - std::pow(c.b1, static_cast<double>(c.step));
  const double c2 = 1 - std::pow(c.b2, static_cast<double>(c.step));
  for (size_t k = 0; k < n; ++k) {
    const std::vector<double> pv = p[k].logical(), gv = g[k].logical(), mv = m[k].logical(),
                              vv = v[k].logical();
    std::vector<double> pr(pv.size()), mr(pv.size()), vr(pv.size());
    std::vector<double> pmag(pv.size()), mmag(pv.size()), vmag(pv.size());
    for (size_t i = 0; i < pv.size(); ++i) {
      double pi = pv[i], gi = gv[i];
      if (c.decoupled)
        pi *= 1 - c.lr * c.wd;
      else
        gi += c.wd * pi;
      const double mi = c.b1 * mv[i] + (1 - c.b1) * gi;
      const double vi = c.b2 * vv[i] + (1 - c.b2) * gi * gi;
      const double upd = c.lr / c1 * mi / (std::sqrt(vi) / std::sqrt(c2) + c.eps);
      pr[i] = round_to(dt, pi - upd);
      mr[i] = round_to(dt, mi);
      vr[i] = round_to(dt, vi);
      pmag[i] = std::fabs(pi) + std::fabs(upd);
      mmag[i] = std::fabs(c.b1 * mv[i]) + std::fabs((1 - c.b1) * gi);
      vmag[i] = std::fabs(c.b2 * vv[i]) + (1 - c.b2) * gi * gi;
    }
    const std::string at = full + format(" (parameter %zu, %s)", k, shape_str(c.shapes[k]).c_str());
    // p chains the decay, the moments, a square root and a quotient in the compute type before
    // its one rounding: four elementwise steps' worth of rounding.
    expect_close_mag(read_dense(dp[k], at), pr, pmag, dt, bp_test::OpClass::elementwise,
                     at + " param", 4);
    expect_close_mag(read_dense(dm[k], at), mr, mmag, dt, bp_test::OpClass::elementwise,
                     at + " exp_avg", 2);
    expect_close_mag(read_dense(dv[k], at), vr, vmag, dt, bp_test::OpClass::elementwise,
                     at + " exp_avg_sq", 2);
  }
}

}  // namespace

void optim_cases(const OpInfo& op, int32_t dt, CaseList& out) {
  auto add = [&](AdamCase c) {
    out.push_back({c.variant, [op, dt, c](Context& ctx) { run_adamw(ctx, op, dt, c); }});
  };
  add({"adamw", {{37}, {5, 7}, {1}, {3, 1, 4}}});
  AdamCase adam{"adam_l2", {{19, 3}, {8}}};
  adam.decoupled = false;
  add(adam);
  AdamCase first{"first_step", {{33}, {2, 9}}};
  first.step = 1;
  first.wd = 0;
  add(first);
  add({"large", {{kLargeRows, kLargeCols}, {1}}});
  AdamCase many{"many", {}};
  for (int64_t k = 0; k < 61; ++k) many.shapes.push_back({1 + (k * 37) % 300});
  add(many);
}

}  // namespace bpc
