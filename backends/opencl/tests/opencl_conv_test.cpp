// The convolutional family (catalogue minor 4) on every OpenCL device, one test per op family,
// each against a float64 reference computed here on the same quantized random inputs: conv2d and
// its two backward ops (groups, stride, padding, dilation, bias, the weight gradient's split
// sum), the three poolings and their backward ops (indices, ties, NaN, ceil mode, padding
// divisors), batch_norm in training and evaluation with its backward, dropout's mask against
// the host's Philox bit for bit, max_dim/min_dim, gather and scatter_add (index errors named),
// and softmax/log_softmax with their backward ops (short and long rows, large inputs).
#include "opencl_test_support.hpp"

#include <backplane/abi/philox.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

using namespace bpt;

namespace {

constexpr int32_t kFloat[] = {BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_F16, BP_DTYPE_BF16};

bp_attr int_attr(const char* name, int64_t v) {
  bp_attr a{};
  a.struct_size = sizeof a;
  a.name = name;
  a.kind = BP_ATTR_INT;
  a.i = v;
  return a;
}

struct OutSpec {
  int32_t dtype;
  std::vector<int64_t> shape;
};

// Uploads the inputs, launches op and reads every output (guards checked). The error, if any,
// goes to *err (the test fails on an unexpected one when err is NULL).
std::vector<std::vector<double>> run(int32_t d, const char* op, int32_t dt,
                                     const std::vector<const HostTensor*>& ins,
                                     const std::vector<OutSpec>& outs,
                                     const std::vector<bp_attr>& attrs, ErrorInfo* err = nullptr) {
  std::vector<DeviceTensor> din, dout;
  std::vector<bp_tensor_desc> ind, outd;
  for (const HostTensor* h : ins) {
    din.push_back(upload(d, *h));
    ind.push_back(din.back().desc);
  }
  for (const OutSpec& o : outs) {
    dout.push_back(make_output(d, o.dtype, o.shape));
    outd.push_back(dout.back().desc);
  }
  ErrorInfo e = take(launch(d, op, dt, ind, outd, attrs));
  if (err) {
    *err = e;
  } else {
    EXPECT_EQ(e.code, 0) << op << " " << bp_dtype_name(dt) << ": " << e.message;
  }
  std::vector<std::vector<double>> r;
  for (const DeviceTensor& t : dout) r.push_back(e.code ? std::vector<double>{} : read_output(t));
  return r;
}

bool supported(int32_t d, int32_t dt) {
  bp_device_properties p{};
  p.struct_size = sizeof p;
  EXPECT_TRUE(ok(api().device_properties(d, &p)));
  return dt != BP_DTYPE_F64 || p.supports_f64;
}

// Result vs reference with magnitudes (the L2 norm of each element's terms).
void expect_acc_close(const std::vector<double>& got, const std::vector<double>& ref,
                      const std::vector<double>& mag, int32_t dt, bp_test::OpClass c,
                      const std::string& what) {
  bp_test::Tolerance tol;
  tol.op_class = c;
  tol.magnitude = mag;
  EXPECT_TRUE(bp_test::all_close(dt, got, ref, tol)) << what;
}

class OpenclConv : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(plugin().api, nullptr) << plugin().error;
    if (plugin().devices == 0) GTEST_SKIP() << "no OpenCL device: " << plugin().reason;
  }
};

// ---- Convolution -----------------------------------------------------------------------------

struct ConvCase {
  int64_t N, C, H, W, K, R, S, G, sh, sw, ph, pw, dh, dw;
  bool bias;
  int64_t P() const { return (H + 2 * ph - dh * (R - 1) - 1) / sh + 1; }
  int64_t Q() const { return (W + 2 * pw - dw * (S - 1) - 1) / sw + 1; }
  std::vector<bp_attr> attrs() const {
    return {int_attr("stride_h", sh), int_attr("stride_w", sw),   int_attr("pad_h", ph),
            int_attr("pad_w", pw),    int_attr("dilation_h", dh), int_attr("dilation_w", dw),
            int_attr("groups", G)};
  }
  std::string str() const {
    return "x[" + std::to_string(N) + "," + std::to_string(C) + "," + std::to_string(H) + "," +
           std::to_string(W) + "] w[" + std::to_string(K) + "," + std::to_string(C / G) + "," +
           std::to_string(R) + "," + std::to_string(S) + "] G " + std::to_string(G) + " stride " +
           std::to_string(sh) + "x" + std::to_string(sw) + " pad " + std::to_string(ph) + "x" +
           std::to_string(pw) + " dil " + std::to_string(dh) + "x" + std::to_string(dw);
  }
};

// Calls f(n, k, p, q, c (absolute), r, s, h, w) for every term of the convolution whose input
// position lies inside the image.
template <class F>
void for_each_term(const ConvCase& c, F&& f) {
  const int64_t Kg = c.K / c.G, Cg = c.C / c.G;
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t k = 0; k < c.K; ++k)
      for (int64_t p = 0; p < c.P(); ++p)
        for (int64_t q = 0; q < c.Q(); ++q)
          for (int64_t ci = 0; ci < Cg; ++ci)
            for (int64_t r = 0; r < c.R; ++r)
              for (int64_t s = 0; s < c.S; ++s) {
                int64_t h = p * c.sh - c.ph + r * c.dh, w = q * c.sw - c.pw + s * c.dw;
                if (h < 0 || h >= c.H || w < 0 || w >= c.W) continue;
                f(n, k, p, q, (k / Kg) * Cg + ci, ci, r, s, h, w);
              }
}

void check_conv(int32_t d, int32_t dt, const ConvCase& c) {
  SCOPED_TRACE(std::string(bp_dtype_name(dt)) + " " + c.str());
  const int64_t P = c.P(), Q = c.Q(), Cg = c.C / c.G;
  HostTensor x = random_tensor(dt, {c.N, c.C, c.H, c.W});
  HostTensor w = random_tensor(dt, {c.K, Cg, c.R, c.S});
  HostTensor b = random_tensor(dt, {c.K});
  HostTensor dy = random_tensor(dt, {c.N, c.K, P, Q});
  auto xi = [&](int64_t n, int64_t ch, int64_t h, int64_t ww) {
    return ((n * c.C + ch) * c.H + h) * c.W + ww;
  };
  auto wi = [&](int64_t k, int64_t ci, int64_t r, int64_t s) {
    return ((k * Cg + ci) * c.R + r) * c.S + s;
  };
  auto yi = [&](int64_t n, int64_t k, int64_t p, int64_t q) {
    return ((n * c.K + k) * P + p) * Q + q;
  };
  std::vector<double> y(static_cast<size_t>(c.N * c.K * P * Q)), ym(y.size());
  std::vector<double> dx(x.storage.size()), dxm(dx.size());
  std::vector<double> dw(w.storage.size()), dwm(dw.size());
  if (c.bias)
    for (int64_t n = 0; n < c.N; ++n)
      for (int64_t k = 0; k < c.K; ++k)
        for (int64_t pq = 0; pq < P * Q; ++pq) {
          y[yi(n, k, 0, 0) + pq] = b.storage[k];
          ym[yi(n, k, 0, 0) + pq] = b.storage[k] * b.storage[k];
        }
  for_each_term(c, [&](int64_t n, int64_t k, int64_t p, int64_t q, int64_t ch, int64_t ci,
                       int64_t r, int64_t s, int64_t h, int64_t ww) {
    double xv = x.storage[xi(n, ch, h, ww)], wv = w.storage[wi(k, ci, r, s)];
    double gv = dy.storage[yi(n, k, p, q)];
    y[yi(n, k, p, q)] += xv * wv;
    ym[yi(n, k, p, q)] += xv * wv * xv * wv;
    dx[xi(n, ch, h, ww)] += gv * wv;
    dxm[xi(n, ch, h, ww)] += gv * wv * gv * wv;
    dw[wi(k, ci, r, s)] += gv * xv;
    dwm[wi(k, ci, r, s)] += gv * xv * gv * xv;
  });
  for (auto* m : {&ym, &dxm, &dwm})
    for (double& v : *m) v = std::sqrt(v);

  std::vector<const HostTensor*> fwd_in = {&x, &w};
  if (c.bias) fwd_in.push_back(&b);
  auto got = run(d, "conv2d", dt, fwd_in, {{dt, {c.N, c.K, P, Q}}}, c.attrs());
  if (!got.empty() && !got[0].empty())
    expect_acc_close(got[0], y, ym, dt, bp_test::OpClass::matmul, "conv2d");
  got = run(d, "conv2d_backward_input", dt, {&dy, &w}, {{dt, x.shape}}, c.attrs());
  if (!got[0].empty())
    expect_acc_close(got[0], dx, dxm, dt, bp_test::OpClass::matmul, "conv2d_backward_input");
  got = run(d, "conv2d_backward_weight", dt, {&x, &dy}, {{dt, w.shape}}, c.attrs());
  if (!got[0].empty())
    expect_acc_close(got[0], dw, dwm, dt, bp_test::OpClass::matmul, "conv2d_backward_weight");
}

TEST_F(OpenclConv, Conv2dAndBackwardAgainstFloat64) {
  const ConvCase cases[] = {
      // N  C  H   W  K  R  S  G sh sw ph pw dh dw bias
      {2, 3, 8, 8, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},     // same padding
      {2, 4, 9, 7, 6, 3, 2, 2, 2, 1, 1, 0, 1, 2, true},     // groups, stride, dilation
      {1, 6, 10, 11, 6, 3, 3, 6, 2, 2, 1, 1, 2, 1, false},  // depthwise
      {3, 1, 12, 12, 6, 5, 5, 1, 1, 1, 0, 0, 1, 1, true},   // LeNet's first layer
      {8, 4, 16, 16, 3, 1, 1, 1, 1, 1, 0, 0, 1, 1, false},  // 1x1, long weight-gradient sum
      {2, 70, 5, 5, 67, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},   // more than one tile of M and K
  };
  for (int32_t d = 0; d < plugin().devices; ++d)
    for (int32_t dt : kFloat)
      if (supported(d, dt))
        for (const ConvCase& c : cases) check_conv(d, dt, c);
}

TEST_F(OpenclConv, Conv2dBadShapesAreErrors) {
  for (int32_t d = 0; d < plugin().devices; ++d) {
    HostTensor x = random_tensor(BP_DTYPE_F32, {1, 4, 6, 6});
    HostTensor w = random_tensor(BP_DTYPE_F32, {3, 4, 3, 3});  // K = 3 not a multiple of G = 2
    ErrorInfo e;
    run(d, "conv2d", BP_DTYPE_F32, {&x, &w}, {{BP_DTYPE_F32, {1, 3, 4, 4}}},
        {int_attr("groups", 2)}, &e);
    EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT) << e.message;
    EXPECT_NE(e.message.find("conv2d f32"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find("[3, 4, 3, 3]"), std::string::npos) << e.message;
    run(d, "conv2d", BP_DTYPE_F32, {&x, &w}, {{BP_DTYPE_F32, {1, 3, 4, 4}}},
        {int_attr("stride_h", 0)}, &e);
    EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT) << e.message;
    EXPECT_NE(e.message.find("stride_h"), std::string::npos) << e.message;
  }
}

// ---- Pooling ---------------------------------------------------------------------------------

struct PoolCase {
  int64_t N, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw;
  bool ceil, include_pad;
  static int64_t out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t dl, bool ceil) {
    int64_t span = in + 2 * p - dl * (k - 1) - 1;
    int64_t o = (ceil ? span + s - 1 : span) / s + 1;
    if (ceil && (o - 1) * s >= in + p) --o;
    return o;
  }
  int64_t P() const { return out(H, kh, sh, ph, dh, ceil); }
  int64_t Q() const { return out(W, kw, sw, pw, dw, ceil); }
  std::vector<bp_attr> attrs(bool max) const {
    std::vector<bp_attr> a = {
        int_attr("kernel_h", kh),           int_attr("kernel_w", kw), int_attr("stride_h", sh),
        int_attr("stride_w", sw),           int_attr("pad_h", ph),    int_attr("pad_w", pw),
        int_attr("ceil_mode", ceil ? 1 : 0)};
    if (max) {
      a.push_back(int_attr("dilation_h", dh));
      a.push_back(int_attr("dilation_w", dw));
    } else {
      a.push_back(int_attr("count_include_pad", include_pad ? 1 : 0));
    }
    return a;
  }
};

void check_max_pool(int32_t d, int32_t dt, const PoolCase& c) {
  SCOPED_TRACE(std::string(bp_dtype_name(dt)) + " max_pool2d " + std::to_string(c.H) + "x" +
               std::to_string(c.W) + " k" + std::to_string(c.kh) + "x" + std::to_string(c.kw));
  const int64_t P = c.P(), Q = c.Q(), HW = c.H * c.W;
  HostTensor x = random_tensor(dt, {c.N, c.C, c.H, c.W});
  // Ties: values from a small set; one NaN in the first plane (not for every dtype's sake only:
  // it must win its windows).
  std::uniform_int_distribution<int> pick(-3, 3);
  for (double& v : x.storage) v = pick(rng()) * 0.5;
  x.storage[static_cast<size_t>(HW / 2)] = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> y, ind;
  for (int64_t nc = 0; nc < c.N * c.C; ++nc)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t q = 0; q < Q; ++q) {
        double best = -INFINITY;
        int64_t bi = -1;
        for (int64_t r = 0; r < c.kh; ++r)
          for (int64_t s = 0; s < c.kw; ++s) {
            int64_t h = p * c.sh - c.ph + r * c.dh, w = q * c.sw - c.pw + s * c.dw;
            if (h < 0 || h >= c.H || w < 0 || w >= c.W) continue;
            double v = x.storage[static_cast<size_t>(nc * HW + h * c.W + w)];
            if (bi < 0 || v > best || (std::isnan(v) && !std::isnan(best))) {
              best = v;
              bi = h * c.W + w;
            }
          }
        y.push_back(best);
        ind.push_back(static_cast<double>(bi));
      }
  auto got = run(d, "max_pool2d", dt, {&x},
                 {{dt, {c.N, c.C, P, Q}}, {BP_DTYPE_I64, {c.N, c.C, P, Q}}}, c.attrs(true));
  ASSERT_EQ(got.size(), 2u);
  expect_close(got[0], y, dt, "max_pool2d values", 0);
  expect_close(got[1], ind, BP_DTYPE_I64, "max_pool2d indices");

  HostTensor dy = random_tensor(dt, {c.N, c.C, P, Q});
  HostTensor indices;
  indices.dtype = BP_DTYPE_I64;
  indices.shape = {c.N, c.C, P, Q};
  indices.strides = dense_strides(indices.shape);
  indices.storage = ind;
  std::vector<double> dx(static_cast<size_t>(c.N * c.C * HW), 0.0);
  for (int64_t nc = 0; nc < c.N * c.C; ++nc)
    for (int64_t j = 0; j < P * Q; ++j)
      dx[static_cast<size_t>(nc * HW + static_cast<int64_t>(ind[nc * P * Q + j]))] +=
          dy.storage[nc * P * Q + j];
  got = run(d, "max_pool2d_backward", dt, {&dy, &indices}, {{dt, x.shape}}, {});
  expect_close(got[0], dx, dt, "max_pool2d_backward");
}

void check_avg_pool(int32_t d, int32_t dt, const PoolCase& c) {
  SCOPED_TRACE(std::string(bp_dtype_name(dt)) + " avg_pool2d " + std::to_string(c.H) + "x" +
               std::to_string(c.W) + " k" + std::to_string(c.kh) + " ceil " +
               std::to_string(c.ceil) + " include_pad " + std::to_string(c.include_pad));
  const int64_t P = c.P(), Q = c.Q(), HW = c.H * c.W;
  HostTensor x = random_tensor(dt, {c.N, c.C, c.H, c.W});
  HostTensor dy = random_tensor(dt, {c.N, c.C, P, Q});
  std::vector<double> y, dx(static_cast<size_t>(c.N * c.C * HW), 0.0);
  for (int64_t nc = 0; nc < c.N * c.C; ++nc)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t q = 0; q < Q; ++q) {
        int64_t hs = p * c.sh - c.ph, ws = q * c.sw - c.pw;
        int64_t he = std::min(hs + c.kh, c.H + c.ph), we = std::min(ws + c.kw, c.W + c.pw);
        int64_t pool = (he - hs) * (we - ws);
        hs = std::max<int64_t>(hs, 0), ws = std::max<int64_t>(ws, 0);
        he = std::min(he, c.H), we = std::min(we, c.W);
        double div = static_cast<double>(c.include_pad ? pool : (he - hs) * (we - ws));
        double s = 0;
        for (int64_t h = hs; h < he; ++h)
          for (int64_t w = ws; w < we; ++w) {
            s += x.storage[static_cast<size_t>(nc * HW + h * c.W + w)];
            dx[static_cast<size_t>(nc * HW + h * c.W + w)] +=
                dy.storage[(nc * P + p) * Q + q] / div;
          }
        y.push_back(s / div);
      }
  auto got = run(d, "avg_pool2d", dt, {&x}, {{dt, {c.N, c.C, P, Q}}}, c.attrs(false));
  expect_close(got[0], y, dt, "avg_pool2d", 2);
  got = run(d, "avg_pool2d_backward", dt, {&dy}, {{dt, x.shape}}, c.attrs(false));
  expect_close(got[0], dx, dt, "avg_pool2d_backward", 2);
}

void check_adaptive(int32_t d, int32_t dt, int64_t H, int64_t W, int64_t P, int64_t Q) {
  SCOPED_TRACE(std::string(bp_dtype_name(dt)) + " adaptive " + std::to_string(H) + "x" +
               std::to_string(W) + " -> " + std::to_string(P) + "x" + std::to_string(Q));
  const int64_t N = 2, C = 3;
  HostTensor x = random_tensor(dt, {N, C, H, W});
  HostTensor dy = random_tensor(dt, {N, C, P, Q});
  std::vector<double> y, dx(static_cast<size_t>(N * C * H * W), 0.0);
  for (int64_t nc = 0; nc < N * C; ++nc)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t q = 0; q < Q; ++q) {
        int64_t h0 = p * H / P, h1 = ((p + 1) * H + P - 1) / P;
        int64_t w0 = q * W / Q, w1 = ((q + 1) * W + Q - 1) / Q;
        double div = static_cast<double>((h1 - h0) * (w1 - w0)), s = 0;
        for (int64_t h = h0; h < h1; ++h)
          for (int64_t w = w0; w < w1; ++w) {
            s += x.storage[static_cast<size_t>((nc * H + h) * W + w)];
            dx[static_cast<size_t>((nc * H + h) * W + w)] += dy.storage[(nc * P + p) * Q + q] / div;
          }
        y.push_back(s / div);
      }
  auto got = run(d, "adaptive_avg_pool2d", dt, {&x}, {{dt, {N, C, P, Q}}}, {});
  expect_close(got[0], y, dt, "adaptive_avg_pool2d", 2);
  got = run(d, "adaptive_avg_pool2d_backward", dt, {&dy}, {{dt, x.shape}}, {});
  expect_close(got[0], dx, dt, "adaptive_avg_pool2d_backward", 2);
}

TEST_F(OpenclConv, PoolingAndBackwardAgainstFloat64) {
  const PoolCase cases[] = {
      // N C  H  W kh kw sh sw ph pw dh dw ceil  include_pad
      {2, 3, 8, 8, 2, 2, 2, 2, 0, 0, 1, 1, false, true},
      {1, 2, 9, 7, 3, 3, 2, 2, 1, 1, 1, 1, false, true},    // ResNet's stem pooling, odd sizes
      {2, 2, 7, 9, 3, 2, 2, 3, 1, 1, 1, 1, true, false},    // ceil mode, padding excluded
      {1, 3, 10, 10, 3, 3, 1, 1, 1, 0, 2, 1, false, true},  // stride 1: overlapping windows
  };
  for (int32_t d = 0; d < plugin().devices; ++d)
    for (int32_t dt : kFloat) {
      if (!supported(d, dt)) continue;
      for (const PoolCase& c : cases) {
        check_max_pool(d, dt, c);
        PoolCase a = c;
        a.dh = a.dw = 1;
        check_avg_pool(d, dt, a);
      }
      check_adaptive(d, dt, 7, 5, 3, 2);
      check_adaptive(d, dt, 8, 8, 1, 1);
      check_adaptive(d, dt, 5, 6, 7, 4);  // output larger than the input: windows overlap
    }
}

// ---- Batch normalisation ---------------------------------------------------------------------

TEST_F(OpenclConv, BatchNormTrainEvalBackwardAgainstFloat64) {
  struct Shape {
    int64_t N, C, L;
  };
  // N*L = 655: several values per work-item; one channel of 12,000 values: split into chunks
  // merged by the combine kernels (Note [Batch norm kernels]).
  const Shape shapes[] = {{5, 3, 131}, {3, 1, 4000}};
  const double eps = 1e-5, momentum = 0.1;
  for (int32_t d = 0; d < plugin().devices; ++d)
    for (int32_t dt : kFloat)
      for (const Shape& sh : shapes) {
        if (!supported(d, dt)) continue;
        const int64_t N = sh.N, C = sh.C, L = sh.L;
        SCOPED_TRACE(std::string(bp_dtype_name(dt)) + " N " + std::to_string(N) + " C " +
                     std::to_string(C) + " L " + std::to_string(L));
        const int32_t st = dt == BP_DTYPE_F16 || dt == BP_DTYPE_BF16 ? BP_DTYPE_F32 : dt;
        HostTensor x = random_tensor(dt, {N, C, L});
        for (double& v : x.storage) v = bpt::quantize(dt, v + 3.0);  // a mean far from 0
        HostTensor w = random_tensor(st, {C}), b = random_tensor(st, {C});
        HostTensor rm = random_tensor(st, {C}), rv = random_tensor(st, {C}, Range::kPositive);
        HostTensor dy = random_tensor(dt, {N, C, L});
        std::vector<double> mean(C), var(C), y(x.storage.size()), rm2(C), rv2(C), inv(C);
        const int64_t M = N * L;
        for (int64_t c = 0; c < C; ++c) {
          double s = 0, s2 = 0;
          for (int64_t n = 0; n < N; ++n)
            for (int64_t l = 0; l < L; ++l) s += x.storage[(n * C + c) * L + l];
          mean[c] = s / M;
          for (int64_t n = 0; n < N; ++n)
            for (int64_t l = 0; l < L; ++l) {
              double e = x.storage[(n * C + c) * L + l] - mean[c];
              s2 += e * e;
            }
          var[c] = s2 / M;
          inv[c] = 1 / std::sqrt(var[c] + eps);
          rm2[c] = (1 - momentum) * rm.storage[c] + momentum * mean[c];
          rv2[c] = (1 - momentum) * rv.storage[c] + momentum * var[c] * M / (M - 1);
        }
        for (int64_t i = 0; i < N * C * L; ++i) {
          int64_t c = (i / L) % C;
          y[i] = (x.storage[i] - mean[c]) * inv[c] * w.storage[c] + b.storage[c];
        }
        // Training: y, save_mean, save_invstd; the running statistics are updated in place.
        std::vector<DeviceTensor> din;
        for (const HostTensor* h : {&x, &w, &b, &rm, &rv}) din.push_back(upload(d, *h));
        DeviceTensor yo = make_output(d, dt, {N, C, L}), sm = make_output(d, st, {C}),
                     si = make_output(d, st, {C});
        std::vector<bp_attr> attrs = {int_attr("training", 1), float_attr("eps", eps),
                                      float_attr("momentum", momentum)};
        ASSERT_TRUE(ok(launch(d, "batch_norm", dt,
                              {din[0].desc, din[1].desc, din[2].desc, din[3].desc, din[4].desc},
                              {yo.desc, sm.desc, si.desc}, attrs)));
        expect_close(read_output(yo), y, dt, "batch_norm y (training)", 2);
        expect_close(read_output(sm), mean, st, "save_mean");
        expect_close(read_output(si), inv, st, "save_invstd", 2);
        std::vector<unsigned char> bytes = read_bytes(din[3]);
        std::vector<double> got(C);
        for (int64_t c = 0; c < C; ++c) got[c] = bpt::decode(st, &bytes[c * bp_dtype_size(st)]);
        expect_close(got, rm2, st, "running_mean updated");
        bytes = read_bytes(din[4]);
        for (int64_t c = 0; c < C; ++c) got[c] = bpt::decode(st, &bytes[c * bp_dtype_size(st)]);
        expect_close(got, rv2, st, "running_var updated", 2);

        // Evaluation: the running statistics (the original ones) normalise; only y is written.
        std::vector<double> ye(y.size());
        for (int64_t i = 0; i < N * C * L; ++i) {
          int64_t c = (i / L) % C;
          ye[i] = (x.storage[i] - rm.storage[c]) / std::sqrt(rv.storage[c] + eps) * w.storage[c] +
                  b.storage[c];
        }
        auto e = run(d, "batch_norm", dt, {&x, &w, &b, &rm, &rv}, {{dt, {N, C, L}}},
                     {int_attr("training", 0), float_attr("eps", eps)});
        expect_close(e[0], ye, dt, "batch_norm y (evaluation)", 2);

        // Backward with the saved statistics of the reference.
        HostTensor hm = rm, hi = rm;
        hm.storage = mean;
        hi.storage = inv;
        for (double& v : hm.storage) v = bpt::quantize(st, v);
        for (double& v : hi.storage) v = bpt::quantize(st, v);
        std::vector<double> dx(y.size()), dwt(C, 0.0), db(C, 0.0);
        for (int64_t i = 0; i < N * C * L; ++i) {
          int64_t c = (i / L) % C;
          double xh = (x.storage[i] - hm.storage[c]) * hi.storage[c];
          db[c] += dy.storage[i];
          dwt[c] += dy.storage[i] * xh;
        }
        for (int64_t i = 0; i < N * C * L; ++i) {
          int64_t c = (i / L) % C;
          double xh = (x.storage[i] - hm.storage[c]) * hi.storage[c];
          dx[i] = w.storage[c] * hi.storage[c] * (dy.storage[i] - db[c] / M - xh * dwt[c] / M);
        }
        auto g = run(d, "batch_norm_backward", dt, {&dy, &x, &w, &hm, &hi},
                     {{dt, {N, C, L}}, {st, {C}}, {st, {C}}}, {float_attr("eps", eps)});
        ASSERT_EQ(g.size(), 3u);
        expect_close(g[0], dx, dt, "batch_norm_backward dx", 4);
        expect_close(g[1], dwt, st, "batch_norm_backward dweight", 4);
        expect_close(g[2], db, st, "batch_norm_backward dbias", 4);
      }
}

// ---- Dropout ---------------------------------------------------------------------------------

TEST_F(OpenclConv, DropoutMaskIsThePhiloxStreamBitForBit) {
  const uint64_t seed = bp_test::test_seed("opencl_conv_dropout");
  for (int32_t d = 0; d < plugin().devices; ++d)
    for (int32_t dt : kFloat) {
      if (!supported(d, dt)) continue;
      for (double p : {0.0, 0.1, 0.5, 0.9}) {
        for (int64_t offset : {0, 5}) {
          SCOPED_TRACE(std::string(bp_dtype_name(dt)) + " p " + std::to_string(p) + " offset " +
                       std::to_string(offset));
          HostTensor x = random_tensor(dt, {3, 333});
          std::vector<double> ref(x.storage.size());
          for (size_t i = 0; i < ref.size(); ++i) {
            float u = bp_philox_uniform01(seed, static_cast<uint64_t>(offset) + i);
            ref[i] = u >= p ? x.storage[i] / (1 - p) : 0.0;
          }
          auto got = run(d, "dropout", dt, {&x}, {{dt, x.shape}},
                         {float_attr("p", p), int_attr("seed", static_cast<int64_t>(seed)),
                          int_attr("offset", offset)});
          ASSERT_EQ(got[0].size(), ref.size());
          size_t kept = 0;
          for (size_t i = 0; i < ref.size(); ++i) {
            ASSERT_EQ(got[0][i] == 0.0, ref[i] == 0.0) << "mask differs at element " << i;
            kept += ref[i] != 0.0;
          }
          expect_close(got[0], ref, dt, "dropout values");
          if (p == 0.0) {
            EXPECT_EQ(kept, ref.size());
          }
        }
      }
    }
}

// ---- max_dim / min_dim, gather, scatter_add --------------------------------------------------

TEST_F(OpenclConv, MaxMinDimFirstExtremeAndNan) {
  const int32_t dtypes[] = {BP_DTYPE_F32,  BP_DTYPE_F64, BP_DTYPE_F16,
                            BP_DTYPE_BF16, BP_DTYPE_I32, BP_DTYPE_I64};
  for (int32_t d = 0; d < plugin().devices; ++d)
    for (int32_t dt : dtypes) {
      if (!supported(d, dt)) continue;
      for (int64_t axis : {0, 1, 2}) {
        SCOPED_TRACE(std::string(bp_dtype_name(dt)) + " axis " + std::to_string(axis));
        std::vector<int64_t> shape = {4, 7, 5};
        HostTensor x = random_tensor(dt, shape, Range::kSmall);
        std::uniform_int_distribution<int> pick(-2, 2);  // ties
        for (double& v : x.storage) v = pick(rng());
        if (is_float(dt)) x.storage[17] = std::numeric_limits<double>::quiet_NaN();
        std::vector<int64_t> oshape = shape;
        oshape[axis] = 1;
        int64_t outer = 1, inner = 1, len = shape[axis];
        for (int64_t a = 0; a < axis; ++a) outer *= shape[a];
        for (int64_t a = axis + 1; a < 3; ++a) inner *= shape[a];
        for (bool is_max : {true, false}) {
          std::vector<double> vals, idx;
          for (int64_t o = 0; o < outer; ++o)
            for (int64_t i = 0; i < inner; ++i) {
              double best = x.storage[o * len * inner + i];
              int64_t bi = 0;
              for (int64_t j = 1; j < len; ++j) {
                double v = x.storage[(o * len + j) * inner + i];
                bool better = is_max ? v > best : v < best;
                if (better || (std::isnan(v) && !std::isnan(best))) best = v, bi = j;
              }
              vals.push_back(best);
              idx.push_back(static_cast<double>(bi));
            }
          auto got = run(d, is_max ? "max_dim" : "min_dim", dt, {&x},
                         {{dt, oshape}, {BP_DTYPE_I64, oshape}}, {int_attr("axis", axis)});
          expect_close(got[0], vals, dt, "values", 0);
          expect_close(got[1], idx, BP_DTYPE_I64, "indices");
        }
      }
    }
}

TEST_F(OpenclConv, GatherAndScatterAddAllDtypes) {
  const int32_t all[] = {BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_F16, BP_DTYPE_BF16,
                         BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_U8,  BP_DTYPE_BOOL};
  for (int32_t d = 0; d < plugin().devices; ++d)
    for (int32_t dt : all) {
      if (!supported(d, dt)) continue;
      for (int64_t axis : {0, 1}) {
        SCOPED_TRACE(std::string(bp_dtype_name(dt)) + " axis " + std::to_string(axis));
        const std::vector<int64_t> xs = {5, 6}, is = axis == 0 ? std::vector<int64_t>{9, 4}
                                                               : std::vector<int64_t>{3, 11};
        HostTensor x = random_tensor(dt, xs, Range::kSmall);
        HostTensor index;
        index.dtype = BP_DTYPE_I64;
        index.shape = is;
        index.strides = dense_strides(is);
        std::uniform_int_distribution<int64_t> pick(0, xs[axis] - 1);
        for (int64_t i = 0; i < is[0] * is[1]; ++i) index.storage.push_back(pick(rng()));
        std::vector<double> g;
        for (int64_t i = 0; i < is[0]; ++i)
          for (int64_t j = 0; j < is[1]; ++j) {
            int64_t ix = static_cast<int64_t>(index.storage[i * is[1] + j]);
            g.push_back(x.storage[axis == 0 ? ix * xs[1] + j : i * xs[1] + ix]);
          }
        auto got = run(d, "gather", dt, {&x, &index}, {{dt, is}}, {int_attr("axis", axis)});
        expect_close(got[0], g, dt, "gather", 0);

        if (dt == BP_DTYPE_BOOL) continue;  // scatter_add: ARITH
        HostTensor src = random_tensor(dt, is, Range::kSmall);
        std::vector<double> ref = x.storage;
        for (int64_t i = 0; i < is[0]; ++i)
          for (int64_t j = 0; j < is[1]; ++j) {
            int64_t ix = static_cast<int64_t>(index.storage[i * is[1] + j]);
            double& o = ref[axis == 0 ? ix * xs[1] + j : i * xs[1] + ix];
            o = is_float(dt) ? o + src.storage[i * is[1] + j]
                             : static_cast<double>(bpt::wrap(
                                   dt, static_cast<int64_t>(o) +
                                           static_cast<int64_t>(src.storage[i * is[1] + j])));
          }
        if (is_float(dt))
          for (double& v : ref) v = bpt::quantize(dt, v);
        got = run(d, "scatter_add", dt, {&x, &index, &src}, {{dt, xs}}, {int_attr("axis", axis)});
        expect_close(got[0], ref, dt, "scatter_add", 2);
      }
    }
}

TEST_F(OpenclConv, ScatterAddInplaceAndIndexErrorsNameTheIndex) {
  for (int32_t d = 0; d < plugin().devices; ++d) {
    HostTensor x = random_tensor(BP_DTYPE_F32, {4, 3});
    HostTensor index;
    index.dtype = BP_DTYPE_I64;
    index.shape = {2, 3};
    index.strides = dense_strides(index.shape);
    index.storage = {0, 3, 1, 2, 4, 0};  // 4 at position [1, 1] is outside [0, 4)
    ErrorInfo e;
    run(d, "gather", BP_DTYPE_F32, {&x, &index}, {{BP_DTYPE_F32, {2, 3}}}, {int_attr("axis", 0)},
        &e);
    EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT) << e.message;
    EXPECT_NE(e.message.find("index 4 at position [1, 1]"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find("[0, 4)"), std::string::npos) << e.message;
    HostTensor src = random_tensor(BP_DTYPE_F32, {2, 3});
    run(d, "scatter_add", BP_DTYPE_F32, {&x, &index, &src}, {{BP_DTYPE_F32, {4, 3}}},
        {int_attr("axis", 0)}, &e);
    EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT) << e.message;
    EXPECT_NE(e.message.find("index 4 at position [1, 1]"), std::string::npos) << e.message;

    // INPLACE: out is base's memory.
    index.storage = {0, 3, 1, 0, 3, 3};
    DeviceTensor base = upload(d, x), di = upload(d, index), ds = upload(d, src);
    ASSERT_TRUE(ok(launch(d, "scatter_add", BP_DTYPE_F32, {base.desc, di.desc, ds.desc},
                          {base.desc}, {int_attr("axis", 0), int_attr("inplace", 1)})));
    std::vector<double> ref = x.storage;
    for (int64_t i = 0; i < 6; ++i)
      ref[static_cast<size_t>(index.storage[i]) * 3 + i % 3] += src.storage[i];
    std::vector<unsigned char> bytes = read_bytes(base);
    std::vector<double> got(12);
    for (size_t i = 0; i < 12; ++i) got[i] = bpt::decode(BP_DTYPE_F32, &bytes[i * 4]);
    expect_close(got, ref, BP_DTYPE_F32, "scatter_add inplace");
  }
}

// ---- Softmax ---------------------------------------------------------------------------------

TEST_F(OpenclConv, SoftmaxLogSoftmaxAndBackwardStable) {
  struct Case {
    std::vector<int64_t> shape;
    int64_t axis;
  };
  const Case cases[] = {{{4, 10}, 1}, {{3, 7, 5}, 1}, {{2, 1000}, 1}, {{300, 3}, 0}};
  for (int32_t d = 0; d < plugin().devices; ++d)
    for (int32_t dt : kFloat) {
      if (!supported(d, dt)) continue;
      for (const Case& c : cases) {
        SCOPED_TRACE(std::string(bp_dtype_name(dt)) + " axis " + std::to_string(c.axis) + " len " +
                     std::to_string(c.shape[c.axis]));
        HostTensor x = random_tensor(dt, c.shape);
        // Large logits: exp would overflow without the maximum subtracted.
        for (double& v : x.storage) v = bpt::quantize(dt, v * (dt == BP_DTYPE_F16 ? 20 : 400));
        HostTensor dy = random_tensor(dt, c.shape);
        int64_t outer = 1, inner = 1, len = c.shape[c.axis];
        for (int64_t a = 0; a < c.axis; ++a) outer *= c.shape[a];
        for (size_t a = c.axis + 1; a < c.shape.size(); ++a) inner *= c.shape[a];
        std::vector<double> sm(x.storage.size()), lsm(sm.size()), dsm(sm.size()), dlsm(sm.size()),
            dsm_mag(sm.size()), dlsm_mag(sm.size());
        HostTensor y = x, ly = x;
        for (int64_t o = 0; o < outer; ++o)
          for (int64_t i = 0; i < inner; ++i) {
            auto at = [&](int64_t j) { return static_cast<size_t>((o * len + j) * inner + i); };
            double m = -INFINITY, s = 0;
            for (int64_t j = 0; j < len; ++j) m = std::max(m, x.storage[at(j)]);
            for (int64_t j = 0; j < len; ++j) s += std::exp(x.storage[at(j)] - m);
            for (int64_t j = 0; j < len; ++j) {
              sm[at(j)] = std::exp(x.storage[at(j)] - m) / s;
              lsm[at(j)] = x.storage[at(j)] - m - std::log(s);
              y.storage[at(j)] = bpt::quantize(dt, sm[at(j)]);
              ly.storage[at(j)] = bpt::quantize(dt, lsm[at(j)]);
            }
            // The backward ops cancel (dy - sum(dy * y) with y near 1): each element is judged
            // against the size of its terms.
            double sdy = 0, sdyy = 0, adyy = 0, ady = 0;
            for (int64_t j = 0; j < len; ++j) {
              sdy += dy.storage[at(j)];
              ady += std::fabs(dy.storage[at(j)]);
              sdyy += dy.storage[at(j)] * y.storage[at(j)];
              adyy += std::fabs(dy.storage[at(j)] * y.storage[at(j)]);
            }
            for (int64_t j = 0; j < len; ++j) {
              const double yv = y.storage[at(j)], g = dy.storage[at(j)];
              const double ey = std::exp(ly.storage[at(j)]);
              dsm[at(j)] = yv * (g - sdyy);
              dsm_mag[at(j)] = std::fabs(yv) * (std::fabs(g) + adyy);
              dlsm[at(j)] = g - ey * sdy;
              dlsm_mag[at(j)] = std::fabs(g) + ey * ady;
            }
          }
        std::vector<bp_attr> attrs = {int_attr("axis", c.axis)};
        auto got = run(d, "softmax", dt, {&x}, {{dt, c.shape}}, attrs);
        expect_close(got[0], sm, dt, "softmax", 4);
        for (double v : got[0]) ASSERT_TRUE(std::isfinite(v)) << "softmax of finite logits";
        got = run(d, "log_softmax", dt, {&x}, {{dt, c.shape}}, attrs);
        expect_close(got[0], lsm, dt, "log_softmax", 4);
        got = run(d, "softmax_backward", dt, {&y, &dy}, {{dt, c.shape}}, attrs);
        expect_acc_close(got[0], dsm, dsm_mag, dt, bp_test::OpClass::reduction, "softmax_backward");
        got = run(d, "log_softmax_backward", dt, {&ly, &dy}, {{dt, c.shape}}, attrs);
        expect_acc_close(got[0], dlsm, dlsm_mag, dt, bp_test::OpClass::reduction,
                         "log_softmax_backward");
      }
    }
}

}  // namespace
