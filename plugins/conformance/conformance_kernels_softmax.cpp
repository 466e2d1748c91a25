// Kernel cases of softmax, log_softmax and their backward ops along AXIS (Note [Op catalogue],
// minor 4): first, middle and last axes, a length-1 axis, rows of equal values, rows whose
// magnitudes reach 1e4 on both sides (finite results: the maximum is subtracted first), empty
// tensors and large ones, against float64 references.
#include "conformance_kernels.hpp"

#include <cmath>

namespace bpc {

namespace {

struct SoftmaxCase {
  const char* variant;
  std::vector<int64_t> shape;
  int64_t axis;
  enum Data { random, large_magnitude, equal_rows, masked, nonfinite } data = random;
};

// The rows of a tensor along `axis`: row (o, i) holds the elements (o * len + j) * inner + i.
struct Rows {
  int64_t outer = 1, len = 1, inner = 1;
  Rows(const std::vector<int64_t>& shape, int64_t axis) {
    for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
      const int64_t s = shape[static_cast<size_t>(d)];
      if (d < axis) outer *= s;
      if (d == axis) len = s;
      if (d > axis) inner *= s;
    }
  }
  size_t at(int64_t o, int64_t j, int64_t i) const {
    return static_cast<size_t>((o * len + j) * inner + i);
  }
  template <typename F>
  void each(F&& f) const {
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) f(o, i);
  }
};

HostTensor softmax_input(Rng& rng, int32_t dt, const SoftmaxCase& c) {
  HostTensor x = random_dense(rng, dt, c.shape, Range{-4.0, 4.0});
  if (c.data == SoftmaxCase::large_magnitude) {
    // Each element near +1e4 or -1e4: exp of the raw values overflows to inf or underflows to 0.
    for (double& v : x.storage) v = round_to(dt, v + (rng.coin() ? 1e4 : -1e4));
  } else if (c.data == SoftmaxCase::masked) {
    // An attention mask's -inf in about a third of each row (never its first element).
    const Rows r(c.shape, c.axis);
    r.each([&](int64_t o, int64_t i) {
      for (int64_t j = 1; j < r.len; ++j)
        if (rng.uniform(0.0, 1.0) < 1.0 / 3.0) x.storage[r.at(o, j, i)] = -INFINITY;
    });
  } else if (c.data == SoftmaxCase::nonfinite) {
    // Row 0 holds a NaN, row 1 a +inf, row 2 only -inf (each row's result is then NaN
    // throughout, as the float64 reference computes it); the other rows are finite.
    const Rows r(c.shape, c.axis);
    r.each([&](int64_t o, int64_t i) {
      const int64_t row = o * r.inner + i;
      const int64_t at =
          static_cast<int64_t>(rng.uniform(0.0, 1.0) * static_cast<double>(r.len)) % r.len;
      if (row == 0) x.storage[r.at(o, at, i)] = NAN;
      if (row == 1) x.storage[r.at(o, at, i)] = INFINITY;
      if (row == 2)
        for (int64_t j = 0; j < r.len; ++j) x.storage[r.at(o, j, i)] = -INFINITY;
    });
  } else if (c.data == SoftmaxCase::equal_rows) {
    const Rows r(c.shape, c.axis);
    r.each([&](int64_t o, int64_t i) {
      const double v = x.storage[r.at(o, 0, i)];
      for (int64_t j = 0; j < r.len; ++j) x.storage[r.at(o, j, i)] = v;
    });
  }
  return x;
}

// softmax (log = false) or log_softmax of x along the rows, in float64, and each element's
// magnitude: y itself for softmax, |x - m| + log(sum) for log_softmax.
void softmax_ref(const Rows& r, const std::vector<double>& x, bool log, std::vector<double>& y,
                 std::vector<double>& mag) {
  y.assign(x.size(), 0.0);
  mag.assign(x.size(), 0.0);
  r.each([&](int64_t o, int64_t i) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < r.len; ++j) m = std::max(m, x[r.at(o, j, i)]);
    for (int64_t j = 0; j < r.len; ++j) s += std::exp(x[r.at(o, j, i)] - m);
    for (int64_t j = 0; j < r.len; ++j) {
      const size_t k = r.at(o, j, i);
      y[k] = log ? x[k] - m - std::log(s) : std::exp(x[k] - m) / s;
      mag[k] = log ? std::fabs(x[k] - m) + std::log(s) : y[k];
    }
  });
}

void run_softmax(Context& ctx, const OpInfo& op, int32_t dt, const SoftmaxCase& c) {
  const std::string name = op.name;
  const bool log = name.rfind("log_", 0) == 0;
  const bool backward = name.find("backward") != std::string::npos;
  const std::string what = case_label(ctx, op, dt, c.variant);
  Rng rng(ctx.seed_for(name + "_" + c.variant + "/" + bp_dtype_name(dt)));
  const Rows r(c.shape, c.axis);
  const std::vector<bp_attr> attrs = {attr_int("axis", c.axis)};
  const std::string extra = format("axis %lld", static_cast<long long>(c.axis));
  HostTensor x = softmax_input(rng, dt, c);
  std::vector<double> y, mag;
  softmax_ref(r, x.logical(), log, y, mag);

  if (!backward) {
    std::vector<double> ref(y.size());
    for (size_t k = 0; k < y.size(); ++k) ref[k] = round_to(dt, y[k]);
    DeviceTensor dx = upload(ctx, x);
    DeviceTensor out = make_output(ctx, dt, c.shape);
    const std::string full = what + ": " + describe_launch(op.name, {&x}, c.shape, dt, extra);
    run_kernel(ctx, op.name, dt, {dx.desc}, out.desc, attrs, full);
    std::vector<double> got = read_dense(out, full);
    for (size_t k = 0; k < got.size(); ++k)
      if (std::isfinite(ref[k]) && !std::isfinite(got[k]))
        throw Failure(full + format(": element %zu is %g: the result is finite for any finite "
                                    "input (subtract the maximum first)",
                                    k, got[k]));
    expect_close_mag(got, ref, mag, dt, bp_test::OpClass::reduction, full);
    return;
  }
  // The backward ops take the forward's output (rounded to the dtype) and dy.
  HostTensor yt = dense_values(dt, c.shape, y);
  HostTensor dy = random_dense(rng, dt, c.shape, Range{-1.0, 1.0});
  const std::vector<double> yv = yt.logical(), dyv = dy.logical();
  std::vector<double> ref(yv.size()), rmag(yv.size());
  r.each([&](int64_t o, int64_t i) {
    double s = 0, as = 0;
    for (int64_t j = 0; j < r.len; ++j) {
      const size_t k = r.at(o, j, i);
      s += log ? dyv[k] : dyv[k] * yv[k];
      as += log ? std::fabs(dyv[k]) : std::fabs(dyv[k] * yv[k]);
    }
    for (int64_t j = 0; j < r.len; ++j) {
      const size_t k = r.at(o, j, i);
      if (log) {
        ref[k] = round_to(dt, dyv[k] - std::exp(yv[k]) * s);
        rmag[k] = std::fabs(dyv[k]) + std::exp(yv[k]) * as;
      } else {
        ref[k] = round_to(dt, yv[k] * (dyv[k] - s));
        rmag[k] = std::fabs(yv[k]) * (std::fabs(dyv[k]) + as);
      }
    }
  });
  DeviceTensor dyt = upload(ctx, yt), ddy = upload(ctx, dy);
  DeviceTensor out = make_output(ctx, dt, c.shape);
  const std::string full = what + ": " + describe_launch(op.name, {&yt, &dy}, c.shape, dt, extra);
  run_kernel(ctx, op.name, dt, {dyt.desc, ddy.desc}, out.desc, attrs, full);
  expect_close_mag(read_dense(out, full), ref, rmag, dt, bp_test::OpClass::reduction, full);
}

}  // namespace

void softmax_cases(const OpInfo& op, int32_t dt, CaseList& out) {
  static const std::vector<SoftmaxCase> cases = {
      {"last", {6, 5, 37}, 2},
      {"middle", {6, 37, 5}, 1},
      {"first", {37, 5, 6}, 0},
      {"rank1", {1001}, 0},
      {"size1", {4, 1, 3}, 1},
      {"equal", {5, 9}, 1, SoftmaxCase::equal_rows},
      {"large_magnitude", {7, 33}, 1, SoftmaxCase::large_magnitude},
      {"large_magnitude_axis0", {33, 7}, 0, SoftmaxCase::large_magnitude},
      {"masked", {6, 37}, 1, SoftmaxCase::masked},
      {"masked_long", {3, 3001}, 1, SoftmaxCase::masked},
      {"masked_axis0", {37, 6}, 0, SoftmaxCase::masked},
      {"nonfinite", {5, 37}, 1, SoftmaxCase::nonfinite},
      {"nonfinite_long", {4, 2049}, 1, SoftmaxCase::nonfinite},
      {"nonfinite_axis0", {37, 5}, 0, SoftmaxCase::nonfinite},
      {"empty", {0, 5}, 1},
      {"empty_axis", {3, 0, 4}, 1},
      {"large", {kLargeRows, kLargeCols}, 1},
      // Long columns: 1025-element rows 257 apart in memory.
      {"large_axis0", {kLargeRows, 257}, 0},
  };
  const OpInfo* p = &op;
  for (const SoftmaxCase& c : cases) {
    const SoftmaxCase* cp = &c;
    out.push_back({c.variant, [p, dt, cp](Context& ctx) { run_softmax(ctx, *p, dt, *cp); }});
  }
}

}  // namespace bpc
