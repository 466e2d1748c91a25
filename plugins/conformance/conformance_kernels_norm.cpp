// Kernel cases of batch_norm (training: batch statistics, save_mean / save_invstd, the running
// statistics updated in place with the unbiased variance; evaluation: the running statistics
// normalise), batch_norm_backward, and dropout (the mask of Note [Philox stream] bit for bit,
// p = 0, p near 1, the 1 / (1 - p) scale, the backward as the same op). Per-channel tensors are
// f32 for f16 and bf16 inputs (Note [Op catalogue], minor 4).
#include "conformance_kernels.hpp"

#include <backplane/abi/philox.h>

#include <cmath>

namespace bpc {

namespace {

// The dtype of batch_norm's per-channel tensors for input dtype dt.
int32_t stat_dtype(int32_t dt) {
  return dt == BP_DTYPE_F16 || dt == BP_DTYPE_BF16 ? BP_DTYPE_F32 : dt;
}

struct NormCase {
  const char* variant;
  int64_t n, c, l;
  bool training = true;
  double momentum = 0.1, eps = 1e-5;
  double shift = 0;  // added to every input: a mean far from zero against a unit spread
  double spread = 2;
};

struct Stats {
  std::vector<double> mean, var, invstd;  // biased variance
};

Stats batch_stats(const NormCase& c, const std::vector<double>& x, double eps) {
  Stats s;
  const double m = static_cast<double>(c.n * c.l);
  for (int64_t ch = 0; ch < c.c; ++ch) {
    double sum = 0, sq = 0;
    for (int64_t n = 0; n < c.n; ++n)
      for (int64_t i = 0; i < c.l; ++i) sum += x[static_cast<size_t>((n * c.c + ch) * c.l + i)];
    const double mean = sum / m;
    for (int64_t n = 0; n < c.n; ++n)
      for (int64_t i = 0; i < c.l; ++i) {
        const double d = x[static_cast<size_t>((n * c.c + ch) * c.l + i)] - mean;
        sq += d * d;
      }
    s.mean.push_back(mean);
    s.var.push_back(sq / m);
    s.invstd.push_back(1.0 / std::sqrt(sq / m + eps));
  }
  return s;
}

void run_batch_norm(Context& ctx, const OpInfo& op, int32_t dt, const NormCase& nc) {
  const std::string what = case_label(ctx, op, dt, nc.variant);
  Rng rng(ctx.seed_for(std::string(op.name) + "_" + nc.variant + "/" + bp_dtype_name(dt)));
  const int32_t sdt = stat_dtype(dt);
  const std::vector<int64_t> xs = {nc.n, nc.c, nc.l}, cs = {nc.c};
  HostTensor x = random_dense(rng, dt, xs, Range{nc.shift - nc.spread, nc.shift + nc.spread});
  HostTensor weight = random_dense(rng, sdt, cs, Range{0.5, 2.0});
  HostTensor bias = random_dense(rng, sdt, cs, Range{-1.0, 1.0});
  HostTensor rmean = random_dense(rng, sdt, cs, Range{-1.0, 1.0});
  HostTensor rvar = random_dense(rng, sdt, cs, Range{0.5, 2.0});
  std::vector<double> xv = x.logical(), wv = weight.logical(), bv = bias.logical();
  std::vector<double> rmv = rmean.logical(), rvv = rvar.logical();
  std::vector<bp_attr> attrs = {attr_float("eps", nc.eps), attr_int("training", nc.training),
                                attr_float("momentum", nc.momentum)};
  const std::string extra =
      format("training %d momentum %g eps %g", nc.training ? 1 : 0, nc.momentum, nc.eps);

  // Reference: normalise with the batch's statistics (training) or the running ones.
  Stats st = batch_stats(nc, xv, nc.eps);
  std::vector<double> mean = st.mean, invstd = st.invstd;
  if (!nc.training)
    for (int64_t ch = 0; ch < nc.c; ++ch) {
      mean[static_cast<size_t>(ch)] = rmv[static_cast<size_t>(ch)];
      invstd[static_cast<size_t>(ch)] = 1.0 / std::sqrt(rvv[static_cast<size_t>(ch)] + nc.eps);
    }
  std::vector<double> y(xv.size()), ymag(xv.size());
  for (int64_t n = 0; n < nc.n; ++n)
    for (int64_t ch = 0; ch < nc.c; ++ch)
      for (int64_t i = 0; i < nc.l; ++i) {
        const size_t k = static_cast<size_t>((n * nc.c + ch) * nc.l + i);
        const size_t c = static_cast<size_t>(ch);
        const double xhat = (xv[k] - mean[c]) * invstd[c];
        y[k] = round_to(dt, xhat * wv[c] + bv[c]);
        // The normalised value carries the rounding of x and of the mean relative to x's size.
        ymag[k] = (std::fabs(xv[k]) * invstd[c] + 1) * wv[c] + std::fabs(bv[c]);
      }

  DeviceTensor dx = upload(ctx, x), dw = upload(ctx, weight), db = upload(ctx, bias);
  DeviceTensor drm = upload(ctx, rmean), drv = upload(ctx, rvar);
  DeviceTensor dy = make_output(ctx, dt, xs);
  DeviceTensor dsm = make_output(ctx, sdt, cs), dsi = make_output(ctx, sdt, cs);
  const std::string full =
      what + ": " + describe_launch(op.name, {&x, &weight, &bias, &rmean, &rvar}, xs, dt, extra);
  std::vector<bp_tensor_desc> outs = {dy.desc};
  if (nc.training) {
    outs.push_back(dsm.desc);
    outs.push_back(dsi.desc);
  }
  run_kernel_n(ctx, op.name, dt, {dx.desc, dw.desc, db.desc, drm.desc, drv.desc}, outs, attrs,
               full);
  expect_close_mag(read_dense(dy, full), y, ymag, dt, bp_test::OpClass::reduction, full + " (y)");
  std::vector<double> rm_ref = rmv, rv_ref = rvv;
  if (nc.training) {
    const double m = static_cast<double>(nc.n * nc.l);
    std::vector<double> sm(st.mean.size()), si(st.invstd.size());
    for (size_t c = 0; c < sm.size(); ++c) {
      sm[c] = round_to(sdt, st.mean[c]);
      si[c] = round_to(sdt, st.invstd[c]);
      rm_ref[c] = round_to(sdt, (1 - nc.momentum) * rmv[c] + nc.momentum * st.mean[c]);
      rv_ref[c] = round_to(sdt, (1 - nc.momentum) * rvv[c] + nc.momentum * st.var[c] * m / (m - 1));
    }
    // The mean is judged against the size of the inputs it averages (a shifted batch).
    std::vector<double> mean_mag(sm.size(), std::fabs(nc.shift) + nc.spread);
    expect_close_mag(read_dense(dsm, full), sm, mean_mag, sdt, bp_test::OpClass::reduction,
                     full + " (save_mean)");
    expect_close_mag(read_dense(dsi, full), si, {}, sdt, bp_test::OpClass::reduction,
                     full + " (save_invstd)");
    std::vector<double> rm_mag(sm.size());
    for (size_t c = 0; c < sm.size(); ++c)
      rm_mag[c] = std::fabs(rmv[c]) + nc.momentum * mean_mag[c];
    expect_close_mag(read_dense(drm, full), rm_ref, rm_mag, sdt, bp_test::OpClass::reduction,
                     full + " (running_mean, updated in place)");
    expect_close_mag(read_dense(drv, full), rv_ref, {}, sdt, bp_test::OpClass::reduction,
                     full + " (running_var, updated in place with the unbiased variance)");
  } else {
    // Evaluation leaves the running statistics as they were, bit for bit.
    expect_close(read_dense(drm, full), rm_ref, sdt, 0, full + " (running_mean, unchanged)");
    expect_close(read_dense(drv, full), rv_ref, sdt, 0, full + " (running_var, unchanged)");
  }
}

void run_batch_norm_backward(Context& ctx, const OpInfo& op, int32_t dt, const NormCase& nc) {
  const std::string what = case_label(ctx, op, dt, nc.variant);
  Rng rng(ctx.seed_for(std::string(op.name) + "_" + nc.variant + "/" + bp_dtype_name(dt)));
  const int32_t sdt = stat_dtype(dt);
  const std::vector<int64_t> xs = {nc.n, nc.c, nc.l}, cs = {nc.c};
  HostTensor x = random_dense(rng, dt, xs, Range{nc.shift - nc.spread, nc.shift + nc.spread});
  HostTensor dy = random_dense(rng, dt, xs, Range{-1.0, 1.0});
  HostTensor weight = random_dense(rng, sdt, cs, Range{0.5, 2.0});
  std::vector<double> xv = x.logical(), dyv = dy.logical(), wv = weight.logical();
  // save_mean and save_invstd as a training forward would give them (rounded to their dtype).
  Stats st = batch_stats(nc, xv, nc.eps);
  HostTensor smean = dense_values(sdt, cs, st.mean), sinv = dense_values(sdt, cs, st.invstd);
  std::vector<double> mean = smean.logical(), invstd = sinv.logical();
  const double m = static_cast<double>(nc.n * nc.l);
  std::vector<double> dxr(xv.size()), dxmag(xv.size()), dwr(cs[0]), dbr(cs[0]), dwmag(cs[0]),
      dbmag(cs[0]);
  for (int64_t ch = 0; ch < nc.c; ++ch) {
    const size_t c = static_cast<size_t>(ch);
    double sdy = 0, sdyx = 0, adys = 0, adyx = 0;
    for (int64_t n = 0; n < nc.n; ++n)
      for (int64_t i = 0; i < nc.l; ++i) {
        const size_t k = static_cast<size_t>((n * nc.c + ch) * nc.l + i);
        const double xhat = (xv[k] - mean[c]) * invstd[c];
        sdy += dyv[k];
        sdyx += dyv[k] * xhat;
        adys += std::fabs(dyv[k]);
        // The f32 statistics carry x's rounding relative to x's size, not xhat's.
        adyx += std::fabs(dyv[k]) * (std::fabs(xhat) + std::fabs(xv[k]) * invstd[c]);
      }
    dbr[c] = round_to(sdt, sdy);
    dwr[c] = round_to(sdt, sdyx);
    dbmag[c] = adys;
    dwmag[c] = adyx;
    for (int64_t n = 0; n < nc.n; ++n)
      for (int64_t i = 0; i < nc.l; ++i) {
        const size_t k = static_cast<size_t>((n * nc.c + ch) * nc.l + i);
        const double xhat = (xv[k] - mean[c]) * invstd[c];
        dxr[k] = round_to(dt, wv[c] * invstd[c] * (dyv[k] - sdy / m - xhat * sdyx / m));
        dxmag[k] = wv[c] * invstd[c] *
                   (std::fabs(dyv[k]) + adys / m +
                    (std::fabs(xhat) + std::fabs(xv[k]) * invstd[c]) * adyx / m);
      }
  }
  DeviceTensor ddy = upload(ctx, dy), dxin = upload(ctx, x), dw = upload(ctx, weight);
  DeviceTensor dsm = upload(ctx, smean), dsi = upload(ctx, sinv);
  DeviceTensor gx = make_output(ctx, dt, xs), gw = make_output(ctx, sdt, cs),
               gb = make_output(ctx, sdt, cs);
  const std::string full =
      what + ": " +
      describe_launch(op.name, {&dy, &x, &weight, &smean, &sinv}, xs, dt,
                      format("eps %g; dweight, dbias %s[%lld]", nc.eps, bp_dtype_name(sdt),
                             static_cast<long long>(nc.c)));
  run_kernel_n(ctx, op.name, dt, {ddy.desc, dxin.desc, dw.desc, dsm.desc, dsi.desc},
               {gx.desc, gw.desc, gb.desc}, {attr_float("eps", nc.eps)}, full);
  expect_close_mag(read_dense(gx, full), dxr, dxmag, dt, bp_test::OpClass::reduction,
                   full + " (dx)");
  expect_close_mag(read_dense(gw, full), dwr, dwmag, sdt, bp_test::OpClass::reduction,
                   full + " (dweight)");
  expect_close_mag(read_dense(gb, full), dbr, dbmag, sdt, bp_test::OpClass::reduction,
                   full + " (dbias)");
}

struct DropoutCase {
  const char* variant;
  std::vector<int64_t> shape;
  double p;
  uint64_t seed, offset;
  bool backward = false;  // run on x, then on dy with the same seed and offset
};

void run_dropout(Context& ctx, const OpInfo& op, int32_t dt, const DropoutCase& c) {
  const std::string what = case_label(ctx, op, dt, c.variant);
  Rng rng(ctx.seed_for(std::string(op.name) + "_" + c.variant + "/" + bp_dtype_name(dt)));
  Range r{-4.0, 4.0};
  r.avoid_zero = true;  // a kept element is never 0, so the mask reads off the output
  std::vector<bp_attr> attrs = {attr_float("p", c.p),
                                attr_int("seed", static_cast<int64_t>(c.seed)),
                                attr_int("offset", static_cast<int64_t>(c.offset))};
  const std::string extra =
      format("p %g seed %llu offset %llu", c.p, static_cast<unsigned long long>(c.seed),
             static_cast<unsigned long long>(c.offset));
  const double scale = 1.0 / (1.0 - c.p);
  std::vector<double> first_mask;
  for (int pass = 0; pass < (c.backward ? 2 : 1); ++pass) {
    HostTensor x = random_dense(rng, dt, c.shape, r);
    std::vector<double> xv = x.logical(), ref(xv.size()), mask(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) {
      const float u = bp_philox_uniform01(c.seed, c.offset + i);
      mask[i] = static_cast<double>(u) >= c.p ? 1.0 : 0.0;
      ref[i] = mask[i] != 0 ? round_to(dt, xv[i] * scale) : 0.0;
    }
    DeviceTensor dx = upload(ctx, x);
    DeviceTensor y = make_output(ctx, dt, c.shape);
    const std::string full = what + ": " + describe_launch(op.name, {&x}, c.shape, dt, extra) +
                             (pass ? " (backward: the same op on dy)" : "");
    run_kernel(ctx, op.name, dt, {dx.desc}, y.desc, attrs, full);
    std::vector<double> got = read_dense(y, full);
    size_t kept = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if ((got[i] != 0) != (mask[i] != 0))
        throw Failure(
            full + format(": element %zu is %s, expected %s: the Philox draw for "
                          "(seed, offset + %zu) is %.9g against p %g",
                          i, got[i] != 0 ? "kept" : "dropped", mask[i] != 0 ? "kept" : "dropped", i,
                          static_cast<double>(bp_philox_uniform01(c.seed, c.offset + i)), c.p));
      kept += mask[i] != 0;
    }
    expect_close(got, ref, dt, tolerance(dt), full + " (kept elements scaled by 1 / (1 - p))");
    if (pass == 0) first_mask = mask;
    if (pass == 1 && mask != first_mask) throw Failure(full + ": the masks differ");
    ctx.note(format("%zu of %zu kept", kept, got.size()));
  }
}

}  // namespace

void norm_cases(const OpInfo& op, int32_t dt, CaseList& out) {
  const std::string name = op.name;
  const OpInfo* p = &op;
  if (name == "dropout") {
    static const std::vector<DropoutCase> cases = {
        {"basic", {7, 13, 11}, 0.5, 42, 0},
        {"p_zero", {5, 33}, 0.0, 7, 3},
        {"p_small", {1001}, 0.1, 99, 0},
        {"p_near_one", {64, 65}, 0.95, 123, 8},
        {"p_extreme", {4099}, 0.999, 5, 1},
        // An odd offset and a counter past 2^32 (the high word of the Philox counter).
        {"offset", {3, 17, 5}, 0.3, 0xDEADBEEF12345678ull, (uint64_t{1} << 34) + 5},
        {"backward", {9, 31}, 0.4, 2024, 12, true},
        {"rank0", {}, 0.5, 11, 2},
        {"empty", {0, 6}, 0.5, 1, 0},
        {"large", {(int64_t{1} << 20) + 3}, 0.2, 77, 4},
    };
    for (const DropoutCase& c : cases) {
      const DropoutCase* cp = &c;
      out.push_back({c.variant, [p, dt, cp](Context& ctx) { run_dropout(ctx, *p, dt, *cp); }});
    }
    return;
  }
  // variant, N C L, training, momentum, eps, shift, spread
  static const std::vector<NormCase> cases = {
      {"train", 4, 3, 25},
      {"train_odd", 3, 5, 7, 1, 0.3, 1e-3},
      // The smallest batch with an unbiased variance: N L = 2.
      {"train_two", 2, 4, 1, true, 0.5},
      // A mean of 20 against a spread of 1: the variance from E[x^2] - E[x]^2 in f32 loses
      // about 3 digits; two passes (or Welford) do not.
      {"train_shifted", 8, 3, 49, true, 0.1, 1e-5, 20, 1},
      {"train_momentum_one", 2, 3, 10, true, 1.0},
      {"eval", 4, 3, 25, false},
      {"eval_odd", 3, 7, 9, false, 0.1, 1e-2},
      {"eval_empty", 0, 3, 5, false},
      {"train_large", 16, 64, 1024, true},
      // Many short rows and a few long ones: a backend that splits a channel over blocks walks
      // (n, l) across row ends at every step.
      {"train_many_rows", 300, 5, 3, true},
      {"train_long_rows", 2, 3, 5000, true},
      {"eval_large", 16, 64, 1024, false},
  };
  const bool backward = name == "batch_norm_backward";
  for (const NormCase& c : cases) {
    if (backward && !c.training) continue;
    const NormCase* cp = &c;
    // The backward takes the training cases: "train_odd" is its "odd", "train" its "basic".
    std::string variant = c.variant;
    if (backward) variant = variant == "train" ? "basic" : variant.substr(6);
    out.push_back({variant, [p, dt, cp, backward](Context& ctx) {
                     if (backward)
                       run_batch_norm_backward(ctx, *p, dt, *cp);
                     else
                       run_batch_norm(ctx, *p, dt, *cp);
                   }});
  }
}

}  // namespace bpc
