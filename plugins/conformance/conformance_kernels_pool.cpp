// Kernel cases of the pooling ops (Note [Op catalogue], minor 4): max_pool2d (values and I64
// indices h * W + w, the first maximum on ties, NaN as the maximum) and its backward (overlapping
// windows add in row-major order), avg_pool2d with ceil_mode and count_include_pad and its
// backward, adaptive_avg_pool2d with sizes that do not divide and its backward; against float64
// references on odd sizes.
#include "conformance_kernels.hpp"

#include <cmath>
#include <limits>

namespace bpc {

namespace {

struct PoolCase {
  const char* variant;
  int64_t n, c, h, w;
  int64_t kh, kw, sh, sw, ph = 0, pw = 0;  // adaptive: kh, kw are the output size P, Q
  bool ceil_mode = false, count_include_pad = true;
  enum Data { random, ties, nan } data = random;
};

// One window along a dimension: [start, end) clipped to the input, and the divisor's extent.
struct Span {
  int64_t start, end, padded;  // padded: the window clipped to the padded input
};

Span pool_span(int64_t o, int64_t in, int64_t k, int64_t stride, int64_t pad) {
  int64_t s = o * stride - pad, e = std::min(s + k, in + pad);
  Span sp{std::max<int64_t>(s, 0), std::min(e, in), e - s};
  return sp;
}

Span adaptive_span(int64_t o, int64_t in, int64_t out) {
  int64_t s = (o * in) / out, e = ((o + 1) * in + out - 1) / out;
  return {s, e, e - s};
}

bool is_adaptive(const std::string& op) {
  return op.rfind("adaptive", 0) == 0;
}

struct PoolGeometry {
  PoolCase c;
  int64_t p, q;
  bool adaptive;
  PoolGeometry(const PoolCase& cc, bool adaptive_) : c(cc), adaptive(adaptive_) {
    p = adaptive ? c.kh : window_out_size(c.h, c.kh, c.sh, c.ph, 1, c.ceil_mode);
    q = adaptive ? c.kw : window_out_size(c.w, c.kw, c.sw, c.pw, 1, c.ceil_mode);
  }
  Span rows(int64_t o) const {
    return adaptive ? adaptive_span(o, c.h, p) : pool_span(o, c.h, c.kh, c.sh, c.ph);
  }
  Span cols(int64_t o) const {
    return adaptive ? adaptive_span(o, c.w, q) : pool_span(o, c.w, c.kw, c.sw, c.pw);
  }
  std::vector<int64_t> x_shape() const { return {c.n, c.c, c.h, c.w}; }
  std::vector<int64_t> y_shape() const { return {c.n, c.c, p, q}; }
  std::vector<bp_attr> attrs(bool avg) const {
    if (adaptive) return {};
    std::vector<bp_attr> a = {attr_int("kernel_h", c.kh),
                              attr_int("kernel_w", c.kw),
                              attr_int("stride_h", c.sh),
                              attr_int("stride_w", c.sw),
                              attr_int("pad_h", c.ph),
                              attr_int("pad_w", c.pw),
                              attr_int("ceil_mode", c.ceil_mode ? 1 : 0)};
    if (avg) a.push_back(attr_int("count_include_pad", c.count_include_pad ? 1 : 0));
    return a;
  }
  std::string attr_text(bool avg) const {
    if (adaptive)
      return format("output %lldx%lld", static_cast<long long>(p), static_cast<long long>(q));
    return format(
        "kernel (%lld,%lld) stride (%lld,%lld) pad (%lld,%lld) ceil_mode %d%s",
        static_cast<long long>(c.kh), static_cast<long long>(c.kw), static_cast<long long>(c.sh),
        static_cast<long long>(c.sw), static_cast<long long>(c.ph), static_cast<long long>(c.pw),
        c.ceil_mode ? 1 : 0,
        avg ? (c.count_include_pad ? " count_include_pad 1" : " count_include_pad 0") : "");
  }
  // The divisor of an average window (Note [Op catalogue], avg_pool2d and adaptive).
  double divisor(const Span& r, const Span& s) const {
    if (adaptive || !c.count_include_pad)
      return static_cast<double>((r.end - r.start) * (s.end - s.start));
    return static_cast<double>(r.padded * s.padded);
  }
};

HostTensor pool_input(Rng& rng, int32_t dt, const PoolGeometry& g) {
  if (g.c.data == PoolCase::ties) {
    Range r;
    r.small_set = true;  // values in -3..3: most windows hold their maximum more than once
    return random_dense(rng, dt, g.x_shape(), r);
  }
  HostTensor x = random_dense(rng, dt, g.x_shape(), Range{-4.0, 4.0});
  if (g.c.data == PoolCase::nan) {
    // A NaN in about one element of 7, in some windows twice: the first NaN is the maximum.
    for (size_t i = 0; i < x.storage.size(); ++i)
      if (rng.integer(0, 6) == 0) x.storage[i] = std::numeric_limits<double>::quiet_NaN();
  }
  return x;
}

// Max pooling's reference: values and indices (first maximum; NaN wins, its first position).
void max_pool_ref(const PoolGeometry& g, const std::vector<double>& x, std::vector<double>& y,
                  std::vector<double>& idx) {
  const int64_t planes = g.c.n * g.c.c;
  y.assign(static_cast<size_t>(planes * g.p * g.q), 0.0);
  idx.assign(y.size(), 0.0);
  for (int64_t pl = 0; pl < planes; ++pl)
    for (int64_t p = 0; p < g.p; ++p)
      for (int64_t q = 0; q < g.q; ++q) {
        const Span r = g.rows(p), s = g.cols(q);
        double best = -std::numeric_limits<double>::infinity();
        int64_t at = -1;
        for (int64_t h = r.start; h < r.end; ++h)
          for (int64_t w = s.start; w < s.end; ++w) {
            const double v = x[static_cast<size_t>((pl * g.c.h + h) * g.c.w + w)];
            if (at >= 0 && std::isnan(best)) continue;
            if (at < 0 || std::isnan(v) || v > best) {
              best = v;
              at = h * g.c.w + w;
            }
          }
        const size_t o = static_cast<size_t>((pl * g.p + p) * g.q + q);
        y[o] = best;
        idx[o] = static_cast<double>(at);
      }
}

void run_pool(Context& ctx, const OpInfo& op, int32_t dt, const PoolCase& pc) {
  const std::string name = op.name;
  const bool adaptive = is_adaptive(name);
  const bool avg = name.find("avg") != std::string::npos;
  const bool backward = name.find("backward") != std::string::npos;
  const PoolGeometry g(pc, adaptive);
  const std::string what = case_label(ctx, op, dt, pc.variant);
  Rng rng(ctx.seed_for(name + "_" + pc.variant + "/" + bp_dtype_name(dt)));
  const std::vector<bp_attr> attrs = g.attrs(avg);
  const int64_t planes = pc.n * pc.c;
  const std::string extra = g.attr_text(avg);

  if (name == "max_pool2d") {
    HostTensor x = pool_input(rng, dt, g);
    std::vector<double> y, idx;
    max_pool_ref(g, x.logical(), y, idx);
    DeviceTensor dxd = upload(ctx, x);
    DeviceTensor dy = make_output(ctx, dt, g.y_shape());
    DeviceTensor di = make_output(ctx, BP_DTYPE_I64, g.y_shape());
    const std::string full =
        what + ": " + describe_launch(op.name, {&x}, g.y_shape(), dt, extra) + " and i64 indices";
    run_kernel_n(ctx, op.name, dt, {dxd.desc}, {dy.desc, di.desc}, attrs, full);
    expect_close(read_dense(dy, full), y, dt, 0, full + " (values: a copy of the maximum)");
    expect_close(read_dense(di, full), idx, BP_DTYPE_I64, 0,
                 full + " (indices h * W + w of the first maximum, NaN first)");
    return;
  }
  if (name == "max_pool2d_backward") {
    // Indices from a real forward pass over random data (ties decided by the first maximum).
    HostTensor x = pool_input(rng, dt, g);
    std::vector<double> yv, idx;
    max_pool_ref(g, x.logical(), yv, idx);
    HostTensor dy = random_dense(rng, dt, g.y_shape(), Range{-1.0, 1.0});
    HostTensor ind = dense_values(BP_DTYPE_I64, g.y_shape(), idx);
    std::vector<double> dyv = dy.logical();
    const int64_t plane_in = pc.h * pc.w;
    std::vector<double> ref(static_cast<size_t>(planes * plane_in), 0.0), mag(ref);
    for (int64_t pl = 0; pl < planes; ++pl)
      for (int64_t o = 0; o < g.p * g.q; ++o) {
        const size_t src = static_cast<size_t>(pl * g.p * g.q + o);
        const size_t dst = static_cast<size_t>(pl * plane_in + static_cast<int64_t>(idx[src]));
        ref[dst] += dyv[src];
        mag[dst] += std::fabs(dyv[src]);
      }
    for (double& v : ref) v = round_to(dt, v);
    DeviceTensor ddy = upload(ctx, dy), dind = upload(ctx, ind);
    DeviceTensor dx = make_output(ctx, dt, g.x_shape());
    const std::string full =
        what + ": " + describe_launch(op.name, {&dy, &ind}, g.x_shape(), dt, extra);
    run_kernel(ctx, op.name, dt, {ddy.desc, dind.desc}, dx.desc, attrs, full);
    expect_close_mag(read_dense(dx, full), ref, mag, dt, bp_test::OpClass::reduction, full);
    return;
  }
  if (!backward) {  // avg_pool2d, adaptive_avg_pool2d
    HostTensor x = pool_input(rng, dt, g);
    std::vector<double> xv = x.logical();
    std::vector<double> ref(static_cast<size_t>(planes * g.p * g.q)), mag(ref.size());
    for (int64_t pl = 0; pl < planes; ++pl)
      for (int64_t p = 0; p < g.p; ++p)
        for (int64_t q = 0; q < g.q; ++q) {
          const Span r = g.rows(p), s = g.cols(q);
          double acc = 0, abs_acc = 0;
          for (int64_t h = r.start; h < r.end; ++h)
            for (int64_t w = s.start; w < s.end; ++w) {
              const double v = xv[static_cast<size_t>((pl * pc.h + h) * pc.w + w)];
              acc += v;
              abs_acc += std::fabs(v);
            }
          const double d = g.divisor(r, s);
          const size_t o = static_cast<size_t>((pl * g.p + p) * g.q + q);
          ref[o] = round_to(dt, acc / d);
          mag[o] = abs_acc / d;
        }
    DeviceTensor dxd = upload(ctx, x);
    DeviceTensor y = make_output(ctx, dt, g.y_shape());
    const std::string full = what + ": " + describe_launch(op.name, {&x}, g.y_shape(), dt, extra);
    run_kernel(ctx, op.name, dt, {dxd.desc}, y.desc, attrs, full);
    expect_close_mag(read_dense(y, full), ref, mag, dt, bp_test::OpClass::reduction, full);
    return;
  }
  // avg_pool2d_backward, adaptive_avg_pool2d_backward: each window spreads dy / divisor.
  HostTensor dy = random_dense(rng, dt, g.y_shape(), Range{-1.0, 1.0});
  std::vector<double> dyv = dy.logical();
  std::vector<double> ref(static_cast<size_t>(planes * pc.h * pc.w), 0.0), mag(ref);
  for (int64_t pl = 0; pl < planes; ++pl)
    for (int64_t p = 0; p < g.p; ++p)
      for (int64_t q = 0; q < g.q; ++q) {
        const Span r = g.rows(p), s = g.cols(q);
        const double v = dyv[static_cast<size_t>((pl * g.p + p) * g.q + q)] / g.divisor(r, s);
        for (int64_t h = r.start; h < r.end; ++h)
          for (int64_t w = s.start; w < s.end; ++w) {
            ref[static_cast<size_t>((pl * pc.h + h) * pc.w + w)] += v;
            mag[static_cast<size_t>((pl * pc.h + h) * pc.w + w)] += std::fabs(v);
          }
      }
  for (double& v : ref) v = round_to(dt, v);
  DeviceTensor ddy = upload(ctx, dy);
  DeviceTensor dx = make_output(ctx, dt, g.x_shape());
  const std::string full = what + ": " + describe_launch(op.name, {&dy}, g.x_shape(), dt, extra);
  run_kernel(ctx, op.name, dt, {ddy.desc}, dx.desc, attrs, full);
  expect_close_mag(read_dense(dx, full), ref, mag, dt, bp_test::OpClass::reduction, full);
}

}  // namespace

void pool_cases(const OpInfo& op, int32_t dt, CaseList& out) {
  const std::string name = op.name;
  const bool adaptive = is_adaptive(name);
  const bool max = name.rfind("max", 0) == 0;
  // variant, N C H W, kernel, stride, pad, ceil_mode, count_include_pad, data
  static const std::vector<PoolCase> window_cases = {
      {"basic", 2, 3, 8, 10, 2, 2, 2, 2},
      {"odd", 2, 3, 9, 11, 3, 3, 2, 2},
      // Overlapping windows (stride < kernel): backward adds several dy into one element.
      {"overlap", 1, 4, 9, 8, 3, 3, 1, 1},
      {"padding", 2, 2, 7, 9, 3, 3, 2, 2, 1, 1},
      {"non_square", 1, 3, 11, 10, 3, 2, 2, 1, 1, 0},
      {"ceil_mode", 2, 3, 10, 11, 3, 3, 2, 2, 0, 0, true},
      // ceil_mode with padding: the last window would start in the right padding and is
      // dropped; the kept last window is clipped.
      {"ceil_mode_padding", 1, 2, 5, 9, 2, 3, 2, 2, 1, 1, true},
      {"exclude_pad", 2, 2, 7, 9, 3, 3, 2, 2, 1, 1, false, false},
      {"ceil_exclude_pad", 1, 3, 10, 11, 3, 3, 2, 2, 1, 1, true, false},
      // ResNet's stem pooling: 3x3, stride 2, padding 1.
      {"resnet_stem", 2, 4, 16, 16, 3, 3, 2, 2, 1, 1},
      {"global", 2, 3, 5, 7, 5, 7, 1, 1},
      {"ties", 2, 3, 9, 9, 3, 3, 2, 2, 1, 1, false, true, PoolCase::ties},
      {"empty_batch", 0, 3, 8, 8, 2, 2, 2, 2},
      {"large", 8, 64, 32, 32, 3, 3, 2, 2, 1, 1},
  };
  static const std::vector<PoolCase> nan_cases = {
      {"nan", 2, 3, 9, 9, 3, 3, 2, 2, 1, 1, false, true, PoolCase::nan},
  };
  // Adaptive: kh, kw hold the output size.
  static const std::vector<PoolCase> adaptive_cases = {
      {"divisible", 2, 3, 8, 12, 4, 3, 0, 0},  {"non_divisible", 2, 3, 10, 7, 3, 4, 0, 0},
      {"upsample", 1, 2, 3, 5, 7, 6, 0, 0},  // output larger than input: windows overlap
      {"global", 2, 5, 7, 9, 1, 1, 0, 0},      {"identity", 1, 3, 6, 5, 6, 5, 0, 0},
      {"empty_batch", 0, 3, 8, 8, 2, 2, 0, 0}, {"large", 8, 64, 17, 19, 5, 7, 0, 0},
  };
  const OpInfo* p = &op;
  auto push = [&](const std::vector<PoolCase>& list) {
    for (const PoolCase& c : list) {
      if (c.data == PoolCase::ties && !max) continue;
      if (!c.count_include_pad && (max || adaptive)) continue;
      const PoolCase* cp = &c;
      out.push_back({c.variant, [p, dt, cp](Context& ctx) { run_pool(ctx, *p, dt, *cp); }});
    }
  };
  if (adaptive) {
    push(adaptive_cases);
    return;
  }
  push(window_cases);
  if (max && name == "max_pool2d") push(nan_cases);
}

}  // namespace bpc
