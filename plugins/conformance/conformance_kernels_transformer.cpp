// Kernel cases of the transformer family (Note [Op catalogue], minor 5) but attention:
// layer_norm with and without weight and bias, with and without saved statistics, rows shifted
// far from zero (a one-pass variance loses them), a one-element row; its backward with and
// without weight; gelu (exact and tanh) and silu with their backward; embedding and its
// deterministic backward (repeated indices, unused rows exactly zero, the same bits twice) and
// their index errors; triu and tril on every dtype at several diagonals; cumsum along each axis.
// Every case compares with a float64 reference.
#include "conformance_kernels.hpp"

#include <cmath>

namespace bpc {

namespace {

// The dtype of layer_norm's mean and rstd for input dtype dt.
int32_t stat_dtype(int32_t dt) {
  return dt == BP_DTYPE_F16 || dt == BP_DTYPE_BF16 ? BP_DTYPE_F32 : dt;
}

Rng rng_of(Context& ctx, const OpInfo& op, int32_t dt, const char* variant) {
  return Rng(ctx.seed_for(std::string(op.name) + "_" + variant + "/" + bp_dtype_name(dt)));
}

// ---- layer_norm -------------------------------------------------------------------------------

struct LayerNormCase {
  const char* variant;
  int64_t m, n;
  int affine = 2;  // 0: no weight or bias, 1: weight only, 2: weight and bias
  bool stats = true;
  double shift = 0, spread = 2;
  double eps = 1e-5;
};

struct RowStats {
  std::vector<double> mean, rstd;
};

RowStats row_stats(int64_t M, int64_t N, const std::vector<double>& x, double eps) {
  RowStats s;
  for (int64_t m = 0; m < M; ++m) {
    double sum = 0, sq = 0;
    for (int64_t j = 0; j < N; ++j) sum += x[static_cast<size_t>(m * N + j)];
    const double mean = sum / static_cast<double>(N);
    for (int64_t j = 0; j < N; ++j) {
      const double d = x[static_cast<size_t>(m * N + j)] - mean;
      sq += d * d;
    }
    s.mean.push_back(mean);
    s.rstd.push_back(1.0 / std::sqrt(sq / static_cast<double>(N) + eps));
  }
  return s;
}

void run_layer_norm(Context& ctx, const OpInfo& op, int32_t dt, const LayerNormCase& c) {
  const std::string what = case_label(ctx, op, dt, c.variant);
  Rng rng = rng_of(ctx, op, dt, c.variant);
  const int32_t sdt = stat_dtype(dt);
  const std::vector<int64_t> xs = {c.m, c.n}, ns = {c.n}, ms = {c.m};
  HostTensor x = random_dense(rng, dt, xs, Range{c.shift - c.spread, c.shift + c.spread});
  HostTensor w = random_dense(rng, dt, ns, Range{0.5, 2.0});
  HostTensor b = random_dense(rng, dt, ns, Range{-1.0, 1.0});
  const std::vector<double> xv = x.logical(), wv = w.logical(), bv = b.logical();
  const RowStats st = row_stats(c.m, c.n, xv, c.eps);
  std::vector<double> y(xv.size()), ymag(xv.size());
  for (int64_t m = 0; m < c.m; ++m)
    for (int64_t j = 0; j < c.n; ++j) {
      const size_t k = static_cast<size_t>(m * c.n + j), jj = static_cast<size_t>(j);
      const size_t mm = static_cast<size_t>(m);
      const double wj = c.affine >= 1 ? wv[jj] : 1.0, bj = c.affine >= 2 ? bv[jj] : 0.0;
      y[k] = round_to(dt, (xv[k] - st.mean[mm]) * st.rstd[mm] * wj + bj);
      // xhat carries the rounding of x and of the mean relative to x's size.
      ymag[k] = (std::fabs(xv[k]) * st.rstd[mm] + 1) * wj + std::fabs(bj);
    }
  DeviceTensor dx = upload(ctx, x), dw = upload(ctx, w), db = upload(ctx, b);
  DeviceTensor dy = make_output(ctx, dt, xs);
  DeviceTensor dmean = make_output(ctx, sdt, ms), drstd = make_output(ctx, sdt, ms);
  std::vector<bp_tensor_desc> ins = {dx.desc};
  std::vector<const HostTensor*> hins = {&x};
  if (c.affine >= 1) ins.push_back(dw.desc), hins.push_back(&w);
  if (c.affine >= 2) ins.push_back(db.desc), hins.push_back(&b);
  std::vector<bp_tensor_desc> outs = {dy.desc};
  if (c.stats) outs.push_back(dmean.desc), outs.push_back(drstd.desc);
  const std::string full =
      what + ": " +
      describe_launch(op.name, hins, xs, dt,
                      format("eps %g%s", c.eps, c.stats ? "; mean, rstd saved" : "; y only"));
  run_kernel_n(ctx, op.name, dt, ins, outs, {attr_float("eps", c.eps)}, full);
  expect_close_mag(read_dense(dy, full), y, ymag, dt, bp_test::OpClass::reduction, full + " (y)");
  if (!c.stats) return;
  std::vector<double> mean_ref(ms[0]), rstd_ref(ms[0]);
  for (size_t m = 0; m < mean_ref.size(); ++m) {
    mean_ref[m] = round_to(sdt, st.mean[m]);
    rstd_ref[m] = round_to(sdt, st.rstd[m]);
  }
  // The mean is judged against the size of what it averages (a shifted row); rstd against the
  // spread, which a shifted row's rounding perturbs by |shift| / spread times more.
  std::vector<double> mean_mag(mean_ref.size(), std::fabs(c.shift) + c.spread);
  std::vector<double> rstd_mag(rstd_ref.size());
  for (size_t m = 0; m < rstd_mag.size(); ++m)
    rstd_mag[m] = st.rstd[m] * (1 + (std::fabs(c.shift) + c.spread) * st.rstd[m]);
  expect_close_mag(read_dense(dmean, full), mean_ref, mean_mag, sdt, bp_test::OpClass::reduction,
                   full + " (mean)");
  expect_close_mag(read_dense(drstd, full), rstd_ref, rstd_mag, sdt, bp_test::OpClass::reduction,
                   full + " (rstd)");
}

void run_layer_norm_backward(Context& ctx, const OpInfo& op, int32_t dt, const LayerNormCase& c) {
  const std::string what = case_label(ctx, op, dt, c.variant);
  Rng rng = rng_of(ctx, op, dt, c.variant);
  const int32_t sdt = stat_dtype(dt);
  const bool with_w = c.affine >= 1;
  const std::vector<int64_t> xs = {c.m, c.n}, ns = {c.n}, ms = {c.m};
  HostTensor x = random_dense(rng, dt, xs, Range{c.shift - c.spread, c.shift + c.spread});
  HostTensor dy = random_dense(rng, dt, xs, Range{-1.0, 1.0});
  HostTensor w = random_dense(rng, dt, ns, Range{0.5, 2.0});
  const std::vector<double> xv = x.logical(), dyv = dy.logical(), wv = w.logical();
  const RowStats st = row_stats(c.m, c.n, xv, c.eps);
  HostTensor smean = dense_values(sdt, ms, st.mean), srstd = dense_values(sdt, ms, st.rstd);
  const std::vector<double> mean = smean.logical(), rstd = srstd.logical();
  const double N = static_cast<double>(c.n);
  std::vector<double> dxr(xv.size()), dxmag(xv.size());
  std::vector<double> dwr(static_cast<size_t>(c.n)), dbr(dwr.size()), dwmag(dwr.size()),
      dbmag(dwr.size());
  for (int64_t m = 0; m < c.m; ++m) {
    const size_t mm = static_cast<size_t>(m);
    double sg = 0, sgx = 0, ag = 0, agx = 0;
    for (int64_t j = 0; j < c.n; ++j) {
      const size_t k = static_cast<size_t>(m * c.n + j), jj = static_cast<size_t>(j);
      const double xhat = (xv[k] - mean[mm]) * rstd[mm];
      const double xmag = std::fabs(xhat) + std::fabs(xv[k]) * rstd[mm];
      const double g = dyv[k] * (with_w ? wv[jj] : 1.0);
      sg += g;
      sgx += g * xhat;
      ag += std::fabs(g);
      agx += std::fabs(g) * xmag;
      dwr[jj] += dyv[k] * xhat;
      dwmag[jj] += std::fabs(dyv[k]) * xmag;
      dbr[jj] += dyv[k];
      dbmag[jj] += std::fabs(dyv[k]);
    }
    for (int64_t j = 0; j < c.n; ++j) {
      const size_t k = static_cast<size_t>(m * c.n + j), jj = static_cast<size_t>(j);
      const double xhat = (xv[k] - mean[mm]) * rstd[mm];
      const double xmag = std::fabs(xhat) + std::fabs(xv[k]) * rstd[mm];
      const double g = dyv[k] * (with_w ? wv[jj] : 1.0);
      dxr[k] = round_to(dt, rstd[mm] * (g - sg / N - xhat * sgx / N));
      dxmag[k] = rstd[mm] * (std::fabs(g) + ag / N + xmag * agx / N);
    }
  }
  for (size_t j = 0; j < dwr.size(); ++j) {
    dwr[j] = round_to(dt, dwr[j]);
    dbr[j] = round_to(dt, dbr[j]);
  }
  DeviceTensor ddy = upload(ctx, dy), dxin = upload(ctx, x), dm = upload(ctx, smean),
               dr = upload(ctx, srstd), dw = upload(ctx, w);
  DeviceTensor gx = make_output(ctx, dt, xs), gw = make_output(ctx, dt, ns),
               gb = make_output(ctx, dt, ns);
  std::vector<bp_tensor_desc> ins = {ddy.desc, dxin.desc, dm.desc, dr.desc};
  std::vector<bp_tensor_desc> outs = {gx.desc};
  std::vector<const HostTensor*> hins = {&dy, &x, &smean, &srstd};
  if (with_w) {
    ins.push_back(dw.desc);
    hins.push_back(&w);
    outs.push_back(gw.desc);
    outs.push_back(gb.desc);
  }
  const std::string full = what + ": " + describe_launch(op.name, hins, xs, dt);
  run_kernel_n(ctx, op.name, dt, ins, outs, {}, full);
  expect_close_mag(read_dense(gx, full), dxr, dxmag, dt, bp_test::OpClass::reduction,
                   full + " (dx)");
  if (!with_w) return;
  expect_close_mag(read_dense(gw, full), dwr, dwmag, dt, bp_test::OpClass::reduction,
                   full + " (dweight)");
  expect_close_mag(read_dense(gb, full), dbr, dbmag, dt, bp_test::OpClass::reduction,
                   full + " (dbias)");
}

// ---- gelu, silu -------------------------------------------------------------------------------

constexpr double kSqrt2OverPi = 0.79788456080286535588;

double gelu_ref(double x, bool tanh_form) {
  if (tanh_form) return 0.5 * x * (1 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}
double gelu_grad_ref(double x, bool tanh_form) {
  if (tanh_form) {
    const double t = std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kSqrt2OverPi * (1 + 3 * 0.044715 * x * x);
  }
  return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) +
         x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}
double sigmoid_ref(double x) {
  return 1 / (1 + std::exp(-x));
}

struct ActivationCase {
  const char* variant;
  std::vector<int64_t> shape;
  bool tanh_form = false;
  double range = 6;
};

void run_activation(Context& ctx, const OpInfo& op, int32_t dt, const ActivationCase& c) {
  const std::string name = op.name;
  const bool backward = name.find("backward") != std::string::npos;
  const bool is_gelu = name.rfind("gelu", 0) == 0;
  const std::string what = case_label(ctx, op, dt, c.variant);
  Rng rng = rng_of(ctx, op, dt, c.variant);
  HostTensor x = random_dense(rng, dt, c.shape, Range{-c.range, c.range});
  HostTensor dy = random_dense(rng, dt, c.shape, Range{-1.0, 1.0});
  const std::vector<double> xv = x.logical(), dyv = dy.logical();
  std::vector<double> ref(xv.size()), mag(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    const double v = xv[i];
    if (!backward) {
      ref[i] = is_gelu ? gelu_ref(v, c.tanh_form) : v * sigmoid_ref(v);
      mag[i] = std::fabs(v);
    } else {
      const double s = sigmoid_ref(v);
      ref[i] = dyv[i] * (is_gelu ? gelu_grad_ref(v, c.tanh_form) : s * (1 + v * (1 - s)));
      mag[i] = std::fabs(dyv[i]) * (1 + std::fabs(v));
    }
    ref[i] = round_to(dt, ref[i]);
  }
  std::vector<bp_attr> attrs;
  if (is_gelu) attrs.push_back(attr_int("approximate", c.tanh_form ? BP_GELU_TANH : BP_GELU_EXACT));
  DeviceTensor dxt = upload(ctx, x), ddy = upload(ctx, dy);
  DeviceTensor out = make_output(ctx, dt, c.shape);
  std::vector<bp_tensor_desc> ins = {dxt.desc};
  std::vector<const HostTensor*> hins = {&x};
  if (backward) ins.push_back(ddy.desc), hins.push_back(&dy);
  const std::string full =
      what + ": " +
      describe_launch(op.name, hins, c.shape, dt,
                      is_gelu ? (c.tanh_form ? "approximate tanh" : "approximate none") : "");
  run_kernel(ctx, op.name, dt, ins, out.desc, attrs, full);
  expect_close_mag(read_dense(out, full), ref, mag, dt, bp_test::OpClass::elementwise, full);
}

// ---- embedding --------------------------------------------------------------------------------

struct EmbeddingCase {
  const char* variant;
  int64_t v, d, m;
  int64_t bad_index = -2;  // > -2: put this index at position m / 2 and expect an error
  bool few_rows = false;   // indices drawn from the first 3 rows only (many repeats, unused rows)
};

HostTensor embedding_indices(Rng& rng, const EmbeddingCase& c) {
  const double hi = static_cast<double>((c.few_rows ? std::min<int64_t>(c.v, 3) : c.v) - 1);
  HostTensor idx = random_dense(rng, BP_DTYPE_I64, {c.m}, Range{0, hi, true});
  if (c.bad_index > -2)
    idx.storage[static_cast<size_t>(c.m / 2)] = static_cast<double>(c.bad_index);
  return idx;
}

void expect_index_error(Context& ctx, const OpInfo& op, int32_t dt,
                        const std::vector<bp_tensor_desc>& ins, const bp_tensor_desc& out,
                        const EmbeddingCase& c, const std::string& full) {
  const std::string msg = run_kernel_n_expect_error(
      ctx, op.name, dt, ins, {out}, {}, BP_ERROR_INVALID_ARGUMENT,
      full + format(" (index %lld outside [0, %lld))", static_cast<long long>(c.bad_index),
                    static_cast<long long>(c.v)));
  for (const std::string& part : {std::to_string(c.bad_index), std::to_string(c.v)})
    if (msg.find(part) == std::string::npos)
      throw Failure(full + ": the error does not name the index " + std::to_string(c.bad_index) +
                    " and the table size " + std::to_string(c.v) + ": " + msg);
}

void run_embedding(Context& ctx, const OpInfo& op, int32_t dt, const EmbeddingCase& c) {
  const std::string what = case_label(ctx, op, dt, c.variant);
  Rng rng = rng_of(ctx, op, dt, c.variant);
  HostTensor w = random_dense(rng, dt, {c.v, c.d}, default_range(dt));
  HostTensor idx = embedding_indices(rng, c);
  const std::vector<double> wv = w.logical(), iv = idx.logical();
  DeviceTensor dw = upload(ctx, w), di = upload(ctx, idx);
  DeviceTensor out = make_output(ctx, dt, {c.m, c.d});
  const std::string full = what + ": " + describe_launch(op.name, {&w, &idx}, {c.m, c.d}, dt);
  if (c.bad_index > -2)
    return expect_index_error(ctx, op, dt, {dw.desc, di.desc}, out.desc, c, full);
  std::vector<double> ref(static_cast<size_t>(c.m * c.d));
  for (int64_t m = 0; m < c.m; ++m)
    for (int64_t j = 0; j < c.d; ++j)
      ref[static_cast<size_t>(m * c.d + j)] =
          wv[static_cast<size_t>(static_cast<int64_t>(iv[static_cast<size_t>(m)]) * c.d + j)];
  run_kernel(ctx, op.name, dt, {dw.desc, di.desc}, out.desc, {}, full);
  expect_close(read_dense(out, full), ref, dt, 0.0, full + " (rows copied exactly)");
}

void run_embedding_backward(Context& ctx, const OpInfo& op, int32_t dt, const EmbeddingCase& c) {
  const std::string what = case_label(ctx, op, dt, c.variant);
  Rng rng = rng_of(ctx, op, dt, c.variant);
  HostTensor dy = random_dense(rng, dt, {c.m, c.d}, Range{-1.0, 1.0});
  HostTensor idx = embedding_indices(rng, c);
  const std::vector<double> dyv = dy.logical(), iv = idx.logical();
  DeviceTensor ddy = upload(ctx, dy), di = upload(ctx, idx);
  DeviceTensor out = make_output(ctx, dt, {c.v, c.d});
  const std::string full =
      what + ": " +
      describe_launch(
          op.name, {&dy, &idx}, {c.v, c.d}, dt,
          format("dweight [%lld,%lld]", static_cast<long long>(c.v), static_cast<long long>(c.d)));
  if (c.bad_index > -2)
    return expect_index_error(ctx, op, dt, {ddy.desc, di.desc}, out.desc, c, full);
  std::vector<double> ref(static_cast<size_t>(c.v * c.d)), mag(ref.size());
  for (int64_t m = 0; m < c.m; ++m) {
    const int64_t row = static_cast<int64_t>(iv[static_cast<size_t>(m)]);
    for (int64_t j = 0; j < c.d; ++j) {
      ref[static_cast<size_t>(row * c.d + j)] += dyv[static_cast<size_t>(m * c.d + j)];
      mag[static_cast<size_t>(row * c.d + j)] += std::fabs(dyv[static_cast<size_t>(m * c.d + j)]);
    }
  }
  for (double& r : ref) r = round_to(dt, r);
  run_kernel(ctx, op.name, dt, {ddy.desc, di.desc}, out.desc, {}, full);
  const std::vector<double> got = read_dense(out, full);
  expect_close_mag(got, ref, mag, dt, bp_test::OpClass::reduction, full);
  for (size_t k = 0; k < got.size(); ++k)
    if (mag[k] == 0 && got[k] != 0)
      throw Failure(full + format(": row %zu is no index's but holds %g at column %zu (must be 0)",
                                  k / static_cast<size_t>(c.d), got[k],
                                  k % static_cast<size_t>(c.d)));
  // Deterministic: a second launch gives the same bits.
  DeviceTensor again = make_output(ctx, dt, {c.v, c.d});
  run_kernel(ctx, op.name, dt, {ddy.desc, di.desc}, again.desc, {}, full + " (second launch)");
  expect_close(read_dense(again, full), got, dt, 0.0,
               full + " (a second launch must give the same bits: the order of the sum is fixed)");
}

// ---- triu, tril, cumsum -----------------------------------------------------------------------

struct TriangleCase {
  const char* variant;
  std::vector<int64_t> shape;
  int64_t diagonal;
};

void run_triangle(Context& ctx, const OpInfo& op, int32_t dt, const TriangleCase& c) {
  const bool upper = std::string(op.name) == "triu";
  const std::string what = case_label(ctx, op, dt, c.variant);
  Rng rng = rng_of(ctx, op, dt, c.variant);
  HostTensor x = random_dense(rng, dt, c.shape, default_range(dt));
  const std::vector<double> xv = x.logical();
  const int64_t R = c.shape[c.shape.size() - 2], C = c.shape[c.shape.size() - 1];
  std::vector<double> ref(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    const int64_t col = static_cast<int64_t>(i) % C, row = (static_cast<int64_t>(i) / C) % R;
    const bool keep = upper ? col - row >= c.diagonal : col - row <= c.diagonal;
    ref[i] = keep ? xv[i] : 0.0;
  }
  DeviceTensor dx = upload(ctx, x);
  DeviceTensor out = make_output(ctx, dt, c.shape);
  const std::string full =
      what + ": " +
      describe_launch(op.name, {&x}, c.shape, dt,
                      format("diagonal %lld", static_cast<long long>(c.diagonal)));
  run_kernel(ctx, op.name, dt, {dx.desc}, out.desc, {attr_int("diagonal", c.diagonal)}, full);
  expect_close(read_dense(out, full), ref, dt, 0.0, full);
}

struct CumsumCase {
  const char* variant;
  std::vector<int64_t> shape;
  int64_t axis;
};

void run_cumsum(Context& ctx, const OpInfo& op, int32_t dt, const CumsumCase& c) {
  const std::string what = case_label(ctx, op, dt, c.variant);
  Rng rng = rng_of(ctx, op, dt, c.variant);
  HostTensor x = random_dense(rng, dt, c.shape, default_range(dt));
  const std::vector<double> xv = x.logical();
  int64_t outer = 1, len = c.shape[static_cast<size_t>(c.axis)], inner = 1;
  for (size_t d = 0; d < c.shape.size(); ++d) {
    if (static_cast<int64_t>(d) < c.axis) outer *= c.shape[d];
    if (static_cast<int64_t>(d) > c.axis) inner *= c.shape[d];
  }
  std::vector<double> ref(xv.size()), mag(xv.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      double acc = 0, am = 0;
      for (int64_t j = 0; j < len; ++j) {
        const size_t k = static_cast<size_t>((o * len + j) * inner + i);
        acc += xv[k];
        am += std::fabs(xv[k]);
        ref[k] = round_to(dt, acc);
        mag[k] = am;
      }
    }
  DeviceTensor dx = upload(ctx, x);
  DeviceTensor out = make_output(ctx, dt, c.shape);
  const std::string full = what + ": " +
                           describe_launch(op.name, {&x}, c.shape, dt,
                                           format("axis %lld", static_cast<long long>(c.axis)));
  run_kernel(ctx, op.name, dt, {dx.desc}, out.desc, {attr_int("axis", c.axis)}, full);
  expect_close_mag(read_dense(out, full), ref, mag, dt, bp_test::OpClass::reduction, full);
}

template <class Case, class Run>
void add_cases(const std::vector<Case>& cases, const OpInfo& op, int32_t dt, Run run,
               CaseList& out) {
  const OpInfo* p = &op;
  for (const Case& c : cases) {
    const Case* cp = &c;
    out.push_back({c.variant, [p, dt, cp, run](Context& ctx) { run(ctx, *p, dt, *cp); }});
  }
}

}  // namespace

void transformer_cases(const OpInfo& op, int32_t dt, CaseList& out) {
  const std::string name = op.name;
  if (name == "layer_norm" || name == "layer_norm_backward") {
    static const std::vector<LayerNormCase> cases = {
        {"affine", 33, 257},
        {"weight_only", 17, 65, 1},
        {"no_affine", 9, 100, 0},
        {"y_only", 12, 48, 2, false},
        // A mean 1000 times the spread: E[x^2] - E[x]^2 in f32 loses the variance entirely.
        {"shifted", 16, 512, 2, true, 1000.0, 1.0},
        {"one_column", 7, 1, 2},
        {"long_rows", 3, 8193, 2},
        {"empty", 0, 16, 2},
        {"large", kLargeRows, kLargeCols, 2},
        {"eps", 11, 40, 2, true, 0.0, 1e-3, 1e-2},
    };
    if (name == "layer_norm") return add_cases(cases, op, dt, run_layer_norm, out);
    static const std::vector<LayerNormCase> bcases = {
        {"weight", 33, 257, 1},
        {"no_weight", 9, 100, 0},
        {"shifted", 16, 512, 1, true, 1000.0, 1.0},
        {"one_column", 7, 1, 1},
        {"long_rows", 3, 8193, 1},
        {"empty", 0, 16, 1},
        {"large", kLargeRows, kLargeCols, 1},
    };
    return add_cases(bcases, op, dt, run_layer_norm_backward, out);
  }
  if (name.rfind("gelu", 0) == 0 || name.rfind("silu", 0) == 0) {
    static const std::vector<ActivationCase> cases = {
        {"exact", {7, 131}},
        {"tanh", {7, 131}, true},
        {"wide_range", {1001}, false, 30},
        {"empty", {0, 3}},
        {"large", {kLargeRows, kLargeCols}},
    };
    static const std::vector<ActivationCase> silu_cases = {
        {"contiguous", {7, 131}},
        {"wide_range", {1001}, false, 30},
        {"empty", {0, 3}},
        {"large", {kLargeRows, kLargeCols}},
    };
    return add_cases(name[0] == 'g' ? cases : silu_cases, op, dt, run_activation, out);
  }
  if (name == "embedding" || name == "embedding_backward") {
    static const std::vector<EmbeddingCase> cases = {
        {"rows", 50, 33, 97},
        {"repeated", 40, 17, 300, -2, true},
        {"one_row", 1, 8, 5},
        {"empty", 10, 4, 0},
        {"large", 1025, 1029, 1031},
        {"index_too_large", 13, 5, 20, 13},
        {"index_negative", 13, 5, 20, -1},
    };
    return add_cases(cases, op, dt, name == "embedding" ? run_embedding : run_embedding_backward,
                     out);
  }
  if (name == "triu" || name == "tril") {
    static const std::vector<TriangleCase> cases = {
        {"square", {9, 9}, 0},   {"wide", {5, 12}, 2},
        {"tall", {12, 5}, -3},   {"batched", {3, 2, 7, 6}, 1},
        {"beyond", {4, 6}, 10},  {"below_all", {4, 6}, -10},
        {"empty", {2, 0, 3}, 0}, {"large", {1, kLargeRows, kLargeCols}, 0},
    };
    return add_cases(cases, op, dt, run_triangle, out);
  }
  if (name == "cumsum") {
    static const std::vector<CumsumCase> cases = {
        {"last", {6, 37}, 1},
        {"first", {37, 5}, 0},
        {"middle", {4, 33, 6}, 1},
        {"rank1", {1001}, 0},
        {"size1", {4, 1, 3}, 1},
        {"empty", {3, 0}, 1},
        {"large", {kLargeRows, kLargeCols}, 1},
    };
    return add_cases(cases, op, dt, run_cumsum, out);
  }
}

}  // namespace bpc
