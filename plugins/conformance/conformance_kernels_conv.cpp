// Kernel cases of conv2d and its two backward ops (Note [Op catalogue], minor 4): NCHW,
// cross-correlation as torch.nn.functional.conv2d, against a float64 reference over odd sizes,
// stride, padding, dilation, groups (depthwise too), 1x1 and non-square kernels, with and
// without bias, an empty batch and a ResNet-sized layer. Every element is judged against the L2
// norm of the products summed into it (the matmul class of the one table; TF32 off).
#include "conformance_kernels.hpp"

#include <cmath>

namespace bpc {

namespace {

struct ConvCase {
  const char* variant;
  int64_t n, c, h, w, k, r, s;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1, groups = 1;
  bool bias = true;
};

// The geometry of one case, with the output size of Note [Op catalogue].
struct Geometry {
  ConvCase c;
  int64_t p, q, cg, kg;  // output height and width, channels per group in and out

  explicit Geometry(const ConvCase& cc) : c(cc) {
    p = window_out_size(c.h, c.r, c.stride_h, c.pad_h, c.dil_h, false);
    q = window_out_size(c.w, c.s, c.stride_w, c.pad_w, c.dil_w, false);
    cg = c.c / c.groups;
    kg = c.k / c.groups;
  }
  std::vector<int64_t> x_shape() const { return {c.n, c.c, c.h, c.w}; }
  std::vector<int64_t> w_shape() const { return {c.k, cg, c.r, c.s}; }
  std::vector<int64_t> y_shape() const { return {c.n, c.k, p, q}; }
  size_t xi(int64_t n, int64_t ch, int64_t h, int64_t w) const {
    return static_cast<size_t>(((n * c.c + ch) * c.h + h) * c.w + w);
  }
  size_t wi(int64_t k, int64_t ch, int64_t r, int64_t s) const {
    return static_cast<size_t>(((k * cg + ch) * c.r + r) * c.s + s);
  }
  size_t yi(int64_t n, int64_t k, int64_t p_, int64_t q_) const {
    return static_cast<size_t>(((n * c.k + k) * p + p_) * q + q_);
  }
  std::vector<bp_attr> attrs() const {
    return {attr_int("stride_h", c.stride_h), attr_int("stride_w", c.stride_w),
            attr_int("pad_h", c.pad_h),       attr_int("pad_w", c.pad_w),
            attr_int("dilation_h", c.dil_h),  attr_int("dilation_w", c.dil_w),
            attr_int("groups", c.groups),     attr_int("allow_tf32", 0)};
  }
  std::string attr_text() const {
    return format("stride (%lld,%lld) pad (%lld,%lld) dilation (%lld,%lld) groups %lld",
                  static_cast<long long>(c.stride_h), static_cast<long long>(c.stride_w),
                  static_cast<long long>(c.pad_h), static_cast<long long>(c.pad_w),
                  static_cast<long long>(c.dil_h), static_cast<long long>(c.dil_w),
                  static_cast<long long>(c.groups));
  }

  // Calls f(n, k, p, q, input channel, kernel channel, h, w, r, s) for every product of the
  // convolution whose input position lies inside the image (padding contributes zeros).
  template <typename F>
  void for_each_term(F&& f) const {
    for (int64_t n = 0; n < c.n; ++n)
      for (int64_t k = 0; k < c.k; ++k) {
        const int64_t g = k / kg;
        for (int64_t p_ = 0; p_ < p; ++p_)
          for (int64_t q_ = 0; q_ < q; ++q_)
            for (int64_t ci = 0; ci < cg; ++ci)
              for (int64_t r = 0; r < c.r; ++r) {
                const int64_t h = p_ * c.stride_h - c.pad_h + r * c.dil_h;
                if (h < 0 || h >= c.h) continue;
                for (int64_t s = 0; s < c.s; ++s) {
                  const int64_t w = q_ * c.stride_w - c.pad_w + s * c.dil_w;
                  if (w < 0 || w >= c.w) continue;
                  f(n, k, p_, q_, g * cg + ci, ci, h, w, r, s);
                }
              }
      }
  }
};

// Accumulates `term` into acc[i] and its square into mag[i]; mag becomes the L2 norm.
struct Accumulator {
  std::vector<double> acc, mag;
  explicit Accumulator(int64_t n) : acc(static_cast<size_t>(n), 0.0), mag(acc) {}
  void add(size_t i, double term) {
    acc[i] += term;
    mag[i] += term * term;
  }
  void finish(int32_t dt) {
    for (double& m : mag) m = std::sqrt(m);
    for (double& v : acc) v = round_to(dt, v);
  }
};

void run_conv(Context& ctx, const OpInfo& op, int32_t dt, const ConvCase& cc) {
  const std::string name = op.name;
  const Geometry g(cc);
  const std::string what = case_label(ctx, op, dt, cc.variant);
  Rng rng(ctx.seed_for(name + "_" + cc.variant + "/" + bp_dtype_name(dt)));
  const Range r{-1.0, 1.0};
  std::vector<bp_attr> attrs = g.attrs();

  if (name == "conv2d") {
    HostTensor x = random_dense(rng, dt, g.x_shape(), r);
    HostTensor w = random_dense(rng, dt, g.w_shape(), r);
    HostTensor b = random_dense(rng, dt, {cc.k}, r);
    std::vector<double> xv = x.logical(), wv = w.logical(), bv = b.logical();
    Accumulator ref(count(g.y_shape()));
    g.for_each_term([&](int64_t n, int64_t k, int64_t p, int64_t q, int64_t ch, int64_t ci,
                        int64_t h, int64_t ww, int64_t rr, int64_t s) {
      ref.add(g.yi(n, k, p, q), xv[g.xi(n, ch, h, ww)] * wv[g.wi(k, ci, rr, s)]);
    });
    if (cc.bias)
      for (int64_t n = 0; n < cc.n; ++n)
        for (int64_t k = 0; k < cc.k; ++k)
          for (int64_t p = 0; p < g.p; ++p)
            for (int64_t q = 0; q < g.q; ++q) ref.add(g.yi(n, k, p, q), bv[static_cast<size_t>(k)]);
    ref.finish(dt);
    DeviceTensor dx = upload(ctx, x), dw = upload(ctx, w), db = upload(ctx, b);
    DeviceTensor y = make_output(ctx, dt, g.y_shape());
    std::vector<bp_tensor_desc> ins = {dx.desc, dw.desc};
    std::vector<const HostTensor*> hosts = {&x, &w};
    if (cc.bias) {
      ins.push_back(db.desc);
      hosts.push_back(&b);
    }
    const std::string full =
        what + ": " + describe_launch(op.name, hosts, g.y_shape(), dt, g.attr_text());
    run_kernel(ctx, op.name, dt, ins, y.desc, attrs, full);
    expect_close_mag(read_dense(y, full), ref.acc, ref.mag, dt, bp_test::OpClass::matmul, full);
    return;
  }
  if (name == "conv2d_backward_input") {
    HostTensor dy = random_dense(rng, dt, g.y_shape(), r);
    HostTensor w = random_dense(rng, dt, g.w_shape(), r);
    std::vector<double> dyv = dy.logical(), wv = w.logical();
    Accumulator ref(count(g.x_shape()));
    g.for_each_term([&](int64_t n, int64_t k, int64_t p, int64_t q, int64_t ch, int64_t ci,
                        int64_t h, int64_t ww, int64_t rr, int64_t s) {
      ref.add(g.xi(n, ch, h, ww), dyv[g.yi(n, k, p, q)] * wv[g.wi(k, ci, rr, s)]);
    });
    ref.finish(dt);
    DeviceTensor ddy = upload(ctx, dy), dw = upload(ctx, w);
    DeviceTensor dx = make_output(ctx, dt, g.x_shape());
    const std::string full =
        what + ": " + describe_launch(op.name, {&dy, &w}, g.x_shape(), dt, g.attr_text());
    run_kernel(ctx, op.name, dt, {ddy.desc, dw.desc}, dx.desc, attrs, full);
    expect_close_mag(read_dense(dx, full), ref.acc, ref.mag, dt, bp_test::OpClass::matmul, full);
    return;
  }
  // conv2d_backward_weight
  HostTensor x = random_dense(rng, dt, g.x_shape(), r);
  HostTensor dy = random_dense(rng, dt, g.y_shape(), r);
  std::vector<double> xv = x.logical(), dyv = dy.logical();
  Accumulator ref(count(g.w_shape()));
  g.for_each_term([&](int64_t n, int64_t k, int64_t p, int64_t q, int64_t ch, int64_t ci, int64_t h,
                      int64_t ww, int64_t rr, int64_t s) {
    ref.add(g.wi(k, ci, rr, s), xv[g.xi(n, ch, h, ww)] * dyv[g.yi(n, k, p, q)]);
  });
  ref.finish(dt);
  DeviceTensor dx = upload(ctx, x), ddy = upload(ctx, dy);
  DeviceTensor dw = make_output(ctx, dt, g.w_shape());
  const std::string full =
      what + ": " + describe_launch(op.name, {&x, &dy}, g.w_shape(), dt, g.attr_text());
  run_kernel(ctx, op.name, dt, {dx.desc, ddy.desc}, dw.desc, attrs, full);
  expect_close_mag(read_dense(dw, full), ref.acc, ref.mag, dt, bp_test::OpClass::matmul, full);
}

}  // namespace

void conv_cases(const OpInfo& op, int32_t dt, CaseList& out) {
  // variant, N C H W, K R S, stride, pad, dilation, groups, bias
  static const std::vector<ConvCase> cases = {
      {"basic", 2, 3, 7, 9, 4, 3, 3},
      {"padding", 2, 3, 8, 7, 5, 3, 3, 1, 1, 1, 1},
      {"stride", 1, 4, 11, 13, 6, 3, 3, 2, 2, 1, 1},
      // Non-square kernel, unequal strides and paddings, no bias.
      {"non_square", 2, 3, 10, 9, 4, 3, 5, 2, 3, 2, 1, 1, 1, 1, false},
      {"dilation", 1, 2, 13, 12, 3, 3, 3, 1, 1, 2, 3, 2, 3},
      {"groups", 2, 6, 9, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1, 2},
      {"depthwise", 2, 8, 10, 11, 8, 3, 3, 1, 1, 1, 1, 1, 1, 8},
      // Depthwise with a channel multiplier of 2, strided (MobileNet's downsampling layers).
      {"depthwise_multiplier", 1, 4, 9, 9, 8, 3, 3, 2, 2, 1, 1, 1, 1, 4, false},
      {"pointwise", 3, 16, 5, 7, 12, 1, 1},
      // ResNet's downsampling shortcut: 1x1, stride 2, no bias.
      {"pointwise_stride", 2, 8, 9, 9, 16, 1, 1, 2, 2, 0, 0, 1, 1, 1, false},
      {"no_bias", 2, 5, 6, 6, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, false},
      // The kernel covers the whole padded input: one output position.
      {"full_window", 2, 3, 5, 4, 2, 5, 4},
      // A stride larger than the kernel skips input rows and columns.
      {"stride_gaps", 1, 2, 12, 11, 3, 2, 2, 3, 4},
      // The ResNet stem: 7x7, stride 2, padding 3.
      {"stem", 1, 3, 21, 19, 8, 7, 7, 2, 2, 3, 3, 1, 1, 1, false},
      {"one_pixel", 4, 5, 1, 1, 6, 1, 1},
      {"empty_batch", 0, 3, 7, 9, 4, 3, 3, 1, 1, 1, 1},
      // A ResNet-18 layer-2 sized convolution.
      {"large", 2, 32, 28, 28, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, false},
  };
  const OpInfo* p = &op;
  for (const ConvCase& c : cases) {
    const ConvCase* cp = &c;
    out.push_back({c.variant, [p, dt, cp](Context& ctx) { run_conv(ctx, *p, dt, *cp); }});
  }
}

}  // namespace bpc
