// The convolutional family (ABI minor 4) on the CPU backend, each op against a float64
// reference computed here on the same (dtype-rounded) random data: convolution forward and
// both backward ops over strides, padding, dilation, groups, bias and the batch splits of Note
// [CPU convolution] (also from several threads at once, through the primitive cache); max,
// average and adaptive pooling with ties, NaN, ceil mode and both divisors; batch norm in
// training (running statistics) and evaluation and its backward; max_dim/min_dim, gather,
// scatter_add (its order and refusals), dropout bit for bit against philox.h, and softmax /
// log_softmax and their backward along every axis. Fresh random data, seed printed;
// BP_TEST_SEED reproduces a run.
#include "cpu_test_support.hpp"

#include <backplane/abi/philox.h>
#include <backplane_test/child.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace bpt {
namespace {

using bp_test::OpClass;
using bp_test::Tolerance;

const std::vector<bp_dtype> kNnFloats = {BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_F16, BP_DTYPE_BF16};

bp_attr attr_f(const char* name, double v) {
  bp_attr a{};
  a.struct_size = sizeof(a);
  a.name = name;
  a.kind = BP_ATTR_FLOAT;
  a.f = v;
  return a;
}

// The dtype of batch_norm's per-channel tensors.
bp_dtype param_dtype(bp_dtype d) {
  return d == BP_DTYPE_F64 ? BP_DTYPE_F64 : BP_DTYPE_F32;
}

std::string dtype_param_name(const ::testing::TestParamInfo<bp_dtype>& info) {
  return bp_dtype_name(info.param);
}

class NnTest : public ::testing::TestWithParam<bp_dtype> {
 protected:
  void SetUp() override { ASSERT_NE(plugin().api, nullptr) << plugin().error; }
  bp_dtype dt() const { return GetParam(); }
};

// ---- Convolution -----------------------------------------------------------------------------

struct ConvCase {
  int64_t N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw, G;
  bool bias;
};

int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

std::vector<bp_attr> conv_attrs(const ConvCase& c) {
  return {attr_i("stride_h", c.sh), attr_i("stride_w", c.sw),   attr_i("pad_h", c.ph),
          attr_i("pad_w", c.pw),    attr_i("dilation_h", c.dh), attr_i("dilation_w", c.dw),
          attr_i("groups", c.G)};
}

// y, dx, dw of one case in float64 with the L2 norms of their terms, in one walk.
struct ConvRef {
  std::vector<double> y, ym, dx, dxm, dw, dwm;
};
ConvRef conv_reference(const ConvCase& c, int64_t P, int64_t Q, const std::vector<double>& x,
                       const std::vector<double>& w, const std::vector<double>& b,
                       const std::vector<double>& dy) {
  ConvRef r;
  const int64_t Cg = c.C / c.G, Kg = c.K / c.G;
  r.y.assign(static_cast<size_t>(c.N * c.K * P * Q), 0.0);
  r.ym = r.y;
  r.dx.assign(x.size(), 0.0);
  r.dxm = r.dx;
  r.dw.assign(w.size(), 0.0);
  r.dwm = r.dw;
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t k = 0; k < c.K; ++k)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q) {
          const size_t yi = static_cast<size_t>(((n * c.K + k) * P + p) * Q + q);
          if (c.bias) {
            r.y[yi] = b[static_cast<size_t>(k)];
            r.ym[yi] = b[static_cast<size_t>(k)] * b[static_cast<size_t>(k)];
          }
          for (int64_t cg = 0; cg < Cg; ++cg)
            for (int64_t rr = 0; rr < c.R; ++rr)
              for (int64_t s = 0; s < c.S; ++s) {
                const int64_t h = p * c.sh - c.ph + rr * c.dh, ww = q * c.sw - c.pw + s * c.dw;
                if (h < 0 || h >= c.H || ww < 0 || ww >= c.W) continue;
                const int64_t ch = (k / Kg) * Cg + cg;
                const size_t xi = static_cast<size_t>(((n * c.C + ch) * c.H + h) * c.W + ww);
                const size_t wi = static_cast<size_t>(((k * Cg + cg) * c.R + rr) * c.S + s);
                const double t = x[xi] * w[wi], u = dy[yi] * w[wi], v = dy[yi] * x[xi];
                r.y[yi] += t;
                r.ym[yi] += t * t;
                r.dx[xi] += u;
                r.dxm[xi] += u * u;
                r.dw[wi] += v;
                r.dwm[wi] += v * v;
              }
        }
  for (auto* m : {&r.ym, &r.dxm, &r.dwm})
    for (double& v : *m) v = std::sqrt(v);
  return r;
}

// A case's random operands and their reference (drawn on the test's thread: the generator is
// not shared across threads).
struct ConvData {
  ConvCase c;
  int64_t P, Q;
  HostTensor x, w, b, dy;
  ConvRef ref;
};
ConvData prepare_conv(bp_dtype d, const ConvCase& c) {
  ConvData k;
  k.c = c;
  k.P = conv_out(c.H, c.R, c.sh, c.ph, c.dh);
  k.Q = conv_out(c.W, c.S, c.sw, c.pw, c.dw);
  k.x = make_host(d, {c.N, c.C, c.H, c.W}, Kind::kDense);
  k.w = make_host(d, {c.K, c.C / c.G, c.R, c.S}, Kind::kDense);
  k.b = make_host(d, {c.K}, Kind::kDense);
  k.dy = make_host(d, {c.N, c.K, k.P, k.Q}, Kind::kDense);
  k.ref = conv_reference(c, k.P, k.Q, k.x.values(), k.w.values(), k.b.values(), k.dy.values());
  return k;
}

void run_conv(bp_dtype d, const ConvData& k) {
  const ConvCase& c = k.c;
  SCOPED_TRACE(::testing::Message()
               << "conv N" << c.N << " C" << c.C << " " << c.H << "x" << c.W << " K" << c.K << " "
               << c.R << "x" << c.S << " stride " << c.sh << "," << c.sw << " pad " << c.ph << ","
               << c.pw << " dil " << c.dh << "," << c.dw << " groups " << c.G
               << (c.bias ? " bias" : ""));
  const int64_t P = k.P, Q = k.Q;
  const HostTensor &x = k.x, &w = k.w, &b = k.b, &dy = k.dy;
  const ConvRef& ref = k.ref;
  DeviceTensor dx_ = upload(x), dw_ = upload(w), db_ = upload(b), ddy = upload(dy);
  DeviceTensor y = make_output(d, {c.N, c.K, P, Q});
  std::vector<bp_tensor_desc> ins = {dx_.desc, dw_.desc};
  if (c.bias) ins.push_back(db_.desc);
  ASSERT_TRUE(ok(launch("conv2d", d, ins, {y.desc}, conv_attrs(c))));
  EXPECT_TRUE(bp_test::all_close(d, y.values(), ref.y,
                                 Tolerance{.op_class = OpClass::matmul, .magnitude = ref.ym}))
      << "conv2d";
  EXPECT_TRUE(y.guards_intact());
  DeviceTensor gx = make_output(d, {c.N, c.C, c.H, c.W});
  ASSERT_TRUE(
      ok(launch("conv2d_backward_input", d, {ddy.desc, dw_.desc}, {gx.desc}, conv_attrs(c))));
  EXPECT_TRUE(bp_test::all_close(d, gx.values(), ref.dx,
                                 Tolerance{.op_class = OpClass::matmul, .magnitude = ref.dxm}))
      << "conv2d_backward_input";
  EXPECT_TRUE(gx.guards_intact());
  DeviceTensor gw = make_output(d, {c.K, c.C / c.G, c.R, c.S});
  ASSERT_TRUE(
      ok(launch("conv2d_backward_weight", d, {dx_.desc, ddy.desc}, {gw.desc}, conv_attrs(c))));
  EXPECT_TRUE(bp_test::all_close(d, gw.values(), ref.dw,
                                 Tolerance{.op_class = OpClass::matmul, .magnitude = ref.dwm}))
      << "conv2d_backward_weight";
  EXPECT_TRUE(gw.guards_intact());
}

// N C H W K R S sh sw ph pw dh dw G bias
const std::vector<ConvCase> kConvCases = {
    {2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},      // 3x3 same padding
    {2, 4, 9, 8, 6, 3, 2, 2, 1, 1, 0, 2, 1, 2, true},      // strides, dilation, groups
    {3, 6, 5, 5, 6, 3, 3, 1, 1, 1, 1, 1, 1, 6, false},     // depthwise
    {1, 2, 4, 4, 3, 1, 1, 1, 1, 0, 0, 1, 1, 1, false},     // 1x1
    {2, 3, 5, 5, 2, 5, 5, 1, 1, 0, 0, 1, 1, 1, true},      // kernel = image: 1x1 output
    {2, 2, 6, 7, 4, 3, 3, 3, 2, 2, 1, 1, 2, 1, true},      // stride 3 with padding > 0
    {8, 16, 12, 12, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},   // batch split over the workers
    {1, 16, 16, 16, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},  // one image: an OpenMP team
    {5, 8, 10, 10, 16, 3, 3, 2, 2, 1, 1, 1, 1, 2, false},  // uneven chunks, groups
};

TEST_P(NnTest, Conv2dForwardAndBackwardMatchTheReference) {
  for (const ConvCase& c : kConvCases) run_conv(dt(), prepare_conv(dt(), c));
}

// The convolution's variables are read at its first launch: a bad value fails that launch
// with the variable and the values it takes named (in a fresh process of this binary).
TEST(NnEnvironment, BadConvolutionVariablesFailTheLaunchWithTheVariableNamed) {
  for (const auto& [env, expect] : std::vector<std::pair<std::string, std::string>>{
           {"BACKPLANE_CPU_CONV_THREADS=many",
            "BACKPLANE_CPU_CONV_THREADS='many' is not 'openmp' (the default) or 'tbb'"},
           {"BACKPLANE_CPU_CONV_BF16_WGRAD=fast",
            "BACKPLANE_CPU_CONV_BF16_WGRAD='fast' is not 'f32' (the default) or 'native'"},
           {"BACKPLANE_CPU_CONV_LAYOUT=nhwc",
            "BACKPLANE_CPU_CONV_LAYOUT='nhwc' is not 'blocked' (the default) or 'plain'"}}) {
    const bp_test::ChildResult r = bp_test::rerun_self(
        env, "Float/NnTest.Conv2dForwardAndBackwardMatchTheReference/f32", "--gtest_brief=1");
    EXPECT_FALSE(r.exited_zero()) << env << ": " << r.output;
    EXPECT_NE(r.output.find(expect), std::string::npos) << env << ": " << r.output;
  }
}

// Several host threads convolve different shapes at once: one primitive per key, built once,
// executed concurrently with scratchpads of their own (Note [CPU primitive cache]).
TEST_P(NnTest, Conv2dFromSeveralThreadsAtOnce) {
  const bp_dtype d = dt();
  std::vector<ConvData> data;
  for (size_t t = 0; t < 4; ++t) data.push_back(prepare_conv(d, kConvCases[t % 3 + 6]));
  std::vector<std::thread> threads;
  for (size_t t = 0; t < 4; ++t)
    threads.emplace_back([d, &data, t] {
      for (int rep = 0; rep < 3; ++rep) run_conv(d, data[t]);
    });
  for (std::thread& t : threads) t.join();
}

TEST_P(NnTest, Conv2dRefusesAMismatchedOutput) {
  const bp_dtype d = dt();
  DeviceTensor x = upload(make_host(d, {1, 2, 5, 5}, Kind::kDense));
  DeviceTensor w = upload(make_host(d, {3, 2, 3, 3}, Kind::kDense));
  DeviceTensor y = make_output(d, {1, 3, 5, 5});  // valid padding gives 3x3
  const ErrorInfo e = take(launch("conv2d", d, {x.desc, w.desc}, {y.desc}));
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(e.message.find("should have shape [1,3,3,3]"), std::string::npos) << e.message;
}

// ---- Pooling ---------------------------------------------------------------------------------

struct PoolCase {
  int64_t N, C, H, W, kh, kw, sh, sw, ph, pw;
  bool ceil, include_pad;
};

int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t p, bool ceil_mode) {
  const int64_t span = in + 2 * p - k;
  int64_t o = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
  if (ceil_mode && (o - 1) * s >= in + p) --o;
  return o;
}

std::vector<bp_attr> pool_attrs(const PoolCase& c) {
  return {attr_i("kernel_h", c.kh),    attr_i("kernel_w", c.kw),
          attr_i("stride_h", c.sh),    attr_i("stride_w", c.sw),
          attr_i("pad_h", c.ph),       attr_i("pad_w", c.pw),
          attr_i("ceil_mode", c.ceil), attr_i("count_include_pad", c.include_pad)};
}

const std::vector<PoolCase> kPoolCases = {
    {2, 3, 8, 8, 2, 2, 2, 2, 0, 0, false, true},     // the classic 2x2
    {2, 2, 7, 9, 3, 3, 2, 2, 1, 1, false, true},     // ResNet's stem pool
    {1, 3, 7, 9, 3, 3, 2, 2, 1, 1, false, false},    // divisor inside the image
    {2, 2, 7, 8, 3, 2, 2, 3, 1, 1, true, true},      // ceil mode
    {2, 2, 6, 5, 3, 3, 2, 2, 1, 0, true, false},     // ceil mode, exclusive divisor
    {1, 4, 5, 5, 5, 5, 1, 1, 2, 2, false, true},     // padding = kernel / 2, stride 1
    {4, 16, 20, 20, 3, 3, 1, 1, 1, 1, false, true},  // planes over the workers
};

void check_pool(bp_dtype d, const PoolCase& c, Dist dist, bool with_nan) {
  SCOPED_TRACE(::testing::Message()
               << "pool " << c.N << "x" << c.C << "x" << c.H << "x" << c.W << " k" << c.kh << "x"
               << c.kw << " s" << c.sh << "x" << c.sw << " p" << c.ph << "x" << c.pw << " ceil "
               << c.ceil << " include_pad " << c.include_pad);
  const int64_t P = pool_out(c.H, c.kh, c.sh, c.ph, c.ceil);
  const int64_t Q = pool_out(c.W, c.kw, c.sw, c.pw, c.ceil);
  HostTensor x = make_host(d, {c.N, c.C, c.H, c.W}, Kind::kDense, dist);
  if (with_nan)
    for (size_t i = 3; i < x.storage.size(); i += 17) x.storage[i] = std::nan("");
  const std::vector<double> xv = x.values();
  const HostTensor dy = make_host(d, {c.N, c.C, P, Q}, Kind::kDense);
  const std::vector<double> g = dy.values();
  const int64_t planes = c.N * c.C, HW = c.H * c.W, PQ = P * Q;
  std::vector<double> ymax(static_cast<size_t>(planes * PQ)), imax(ymax.size()), yavg(ymax.size()),
      yavgm(ymax.size());
  std::vector<double> dxmax(static_cast<size_t>(planes * HW), 0.0), dxmaxm(dxmax.size(), 0.0),
      dxavg(dxmax.size(), 0.0), dxavgm(dxmax.size(), 0.0);
  for (int64_t pl = 0; pl < planes; ++pl)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t q = 0; q < Q; ++q) {
        const size_t o = static_cast<size_t>(pl * PQ + p * Q + q);
        double best = 0, sum = 0, sumsq = 0;
        int64_t at = -1;
        int64_t h0 = p * c.sh - c.ph, w0 = q * c.sw - c.pw;
        int64_t h1 = std::min(h0 + c.kh, c.H + c.ph), w1 = std::min(w0 + c.kw, c.W + c.pw);
        const int64_t padded = (h1 - h0) * (w1 - w0);
        h0 = std::max<int64_t>(h0, 0);
        w0 = std::max<int64_t>(w0, 0);
        h1 = std::min(h1, c.H);
        w1 = std::min(w1, c.W);
        for (int64_t h = h0; h < h1; ++h)
          for (int64_t w = w0; w < w1; ++w) {
            const double v = xv[static_cast<size_t>(pl * HW + h * c.W + w)];
            if (at < 0 || (!std::isnan(best) && (v > best || std::isnan(v)))) {
              best = v;
              at = h * c.W + w;
            }
            sum += v;
            sumsq += v * v;
          }
        const double div = c.include_pad ? padded : (h1 - h0) * (w1 - w0);
        ymax[o] = best;
        imax[o] = static_cast<double>(at);
        yavg[o] = sum / div;
        yavgm[o] = std::sqrt(sumsq) / div;
        const size_t xi = static_cast<size_t>(pl * HW + at);
        dxmax[xi] += g[o];
        dxmaxm[xi] += g[o] * g[o];
        for (int64_t h = h0; h < h1; ++h)
          for (int64_t w = w0; w < w1; ++w) {
            const size_t i = static_cast<size_t>(pl * HW + h * c.W + w);
            dxavg[i] += g[o] / div;
            dxavgm[i] += (g[o] / div) * (g[o] / div);
          }
      }
  for (auto* m : {&dxmaxm, &dxavgm})
    for (double& v : *m) v = std::sqrt(v);
  const std::vector<bp_attr> attrs = pool_attrs(c);
  DeviceTensor dx = upload(x), ddy = upload(dy);
  DeviceTensor y = make_output(d, {c.N, c.C, P, Q}),
               ind = make_output(BP_DTYPE_I64, {c.N, c.C, P, Q});
  ASSERT_TRUE(ok(launch("max_pool2d", d, {dx.desc}, {y.desc, ind.desc}, attrs)));
  EXPECT_TRUE(close(d, y.values(), ymax, 0)) << "max_pool2d values";
  EXPECT_TRUE(close(BP_DTYPE_I64, ind.values(), imax)) << "max_pool2d indices";
  DeviceTensor gx = make_output(d, {c.N, c.C, c.H, c.W});
  ASSERT_TRUE(ok(launch("max_pool2d_backward", d, {ddy.desc, ind.desc}, {gx.desc}, attrs)));
  EXPECT_TRUE(bp_test::all_close(d, gx.values(), dxmax,
                                 Tolerance{.op_class = OpClass::reduction, .magnitude = dxmaxm}))
      << "max_pool2d_backward";
  if (with_nan) return;  // the averages of NaN are NaN; nothing more to learn
  DeviceTensor ya = make_output(d, {c.N, c.C, P, Q});
  ASSERT_TRUE(ok(launch("avg_pool2d", d, {dx.desc}, {ya.desc}, attrs)));
  EXPECT_TRUE(bp_test::all_close(d, ya.values(), yavg,
                                 Tolerance{.op_class = OpClass::reduction, .magnitude = yavgm}))
      << "avg_pool2d";
  DeviceTensor ga = make_output(d, {c.N, c.C, c.H, c.W});
  ASSERT_TRUE(ok(launch("avg_pool2d_backward", d, {ddy.desc}, {ga.desc}, attrs)));
  EXPECT_TRUE(bp_test::all_close(d, ga.values(), dxavg,
                                 Tolerance{.op_class = OpClass::reduction, .magnitude = dxavgm}))
      << "avg_pool2d_backward";
  EXPECT_TRUE(y.guards_intact() && ind.guards_intact() && gx.guards_intact() &&
              ya.guards_intact() && ga.guards_intact());
}

TEST_P(NnTest, PoolingMatchesTheReference) {
  for (const PoolCase& c : kPoolCases) check_pool(dt(), c, Dist::kGeneral, false);
}

// Many equal values: the first maximum in row-major window order wins; a NaN wins over any
// number, its first position.
TEST_P(NnTest, MaxPoolTiesAndNaN) {
  for (const PoolCase& c : kPoolCases) {
    check_pool(dt(), c, Dist::kSmallInts, false);
    check_pool(dt(), c, Dist::kSmallInts, true);
  }
}

TEST_P(NnTest, AdaptiveAvgPoolMatchesTheReference) {
  const bp_dtype d = dt();
  struct Case {
    int64_t H, W, P, Q;
  };
  for (const Case& c :
       std::vector<Case>{{7, 5, 3, 2}, {4, 4, 4, 4}, {5, 7, 1, 1}, {3, 2, 5, 4}, {16, 16, 7, 7}}) {
    SCOPED_TRACE(::testing::Message() << c.H << "x" << c.W << " -> " << c.P << "x" << c.Q);
    const int64_t N = 2, C = 3;
    const HostTensor x = make_host(d, {N, C, c.H, c.W}, Kind::kDense);
    const HostTensor dy = make_host(d, {N, C, c.P, c.Q}, Kind::kDense);
    const std::vector<double> xv = x.values(), g = dy.values();
    std::vector<double> y(static_cast<size_t>(N * C * c.P * c.Q)), ym(y.size());
    std::vector<double> dx(static_cast<size_t>(N * C * c.H * c.W), 0.0), dxm(dx.size(), 0.0);
    for (int64_t pl = 0; pl < N * C; ++pl)
      for (int64_t p = 0; p < c.P; ++p)
        for (int64_t q = 0; q < c.Q; ++q) {
          const int64_t h0 = p * c.H / c.P, h1 = ((p + 1) * c.H + c.P - 1) / c.P;
          const int64_t w0 = q * c.W / c.Q, w1 = ((q + 1) * c.W + c.Q - 1) / c.Q;
          const double n = static_cast<double>((h1 - h0) * (w1 - w0));
          const size_t o = static_cast<size_t>((pl * c.P + p) * c.Q + q);
          double s = 0, ss = 0;
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) {
              const size_t i = static_cast<size_t>((pl * c.H + h) * c.W + w);
              s += xv[i];
              ss += xv[i] * xv[i];
              dx[i] += g[o] / n;
              dxm[i] += (g[o] / n) * (g[o] / n);
            }
          y[o] = s / n;
          ym[o] = std::sqrt(ss) / n;
        }
    for (double& v : dxm) v = std::sqrt(v);
    DeviceTensor dxt = upload(x), ddy = upload(dy);
    DeviceTensor yt = make_output(d, {N, C, c.P, c.Q}), gx = make_output(d, {N, C, c.H, c.W});
    ASSERT_TRUE(ok(launch("adaptive_avg_pool2d", d, {dxt.desc}, {yt.desc})));
    EXPECT_TRUE(bp_test::all_close(d, yt.values(), y,
                                   Tolerance{.op_class = OpClass::reduction, .magnitude = ym}));
    ASSERT_TRUE(ok(launch("adaptive_avg_pool2d_backward", d, {ddy.desc}, {gx.desc})));
    EXPECT_TRUE(bp_test::all_close(d, gx.values(), dx,
                                   Tolerance{.op_class = OpClass::reduction, .magnitude = dxm}));
    EXPECT_TRUE(yt.guards_intact() && gx.guards_intact());
  }
}

// ---- Batch normalisation ---------------------------------------------------------------------

TEST_P(NnTest, BatchNormTrainingEvaluationAndBackward) {
  const bp_dtype d = dt(), pd = param_dtype(d);
  struct Case {
    int64_t N, C, L;
  };
  for (const Case& c :
       std::vector<Case>{{4, 3, 25}, {2, 5, 1}, {16, 8, 64}, {1, 2, 7}, {1, 3, 1}}) {
    SCOPED_TRACE(::testing::Message() << "[" << c.N << "," << c.C << "," << c.L << "]");
    HostTensor x = make_host(d, {c.N, c.C, c.L}, Kind::kDense);
    // Channel 0 far from zero: the mean must be subtracted before scaling.
    for (int64_t n = 0; n < c.N; ++n)
      for (int64_t i = 0; i < c.L; ++i) {
        double& v = x.storage[static_cast<size_t>(n * c.C * c.L + i)];
        v = round_to(d, v + 40.0);
      }
    const HostTensor w = make_host(pd, {c.C}, Kind::kDense), b = make_host(pd, {c.C}, Kind::kDense);
    const HostTensor rm = make_host(pd, {c.C}, Kind::kDense);
    const HostTensor rv = make_host(pd, {c.C}, Kind::kDense, Dist::kPositive);
    const HostTensor dy = make_host(d, {c.N, c.C, c.L}, Kind::kDense);
    const double eps = 1e-3, momentum = 0.25;
    const std::vector<double> xv = x.values(), wv = w.values(), bv = b.values(), rmv = rm.values(),
                              rvv = rv.values(), g = dy.values();
    const double n = static_cast<double>(c.N * c.L);
    std::vector<double> mean(c.C), var(c.C), inv(c.C), y(xv.size()), ym(xv.size()), ye(xv.size()),
        yem(xv.size()), nrm(c.C), nrv(c.C);
    auto at = [&](int64_t b_, int64_t ch, int64_t i) {
      return static_cast<size_t>((b_ * c.C + ch) * c.L + i);
    };
    for (int64_t ch = 0; ch < c.C; ++ch) {
      double s = 0, ss = 0;
      for (int64_t b_ = 0; b_ < c.N; ++b_)
        for (int64_t i = 0; i < c.L; ++i) s += xv[at(b_, ch, i)];
      mean[ch] = s / n;
      for (int64_t b_ = 0; b_ < c.N; ++b_)
        for (int64_t i = 0; i < c.L; ++i) ss += std::pow(xv[at(b_, ch, i)] - mean[ch], 2);
      var[ch] = ss / n;
      inv[ch] = 1 / std::sqrt(var[ch] + eps);
      nrm[ch] = (1 - momentum) * rmv[ch] + momentum * mean[ch];
      nrv[ch] = (1 - momentum) * rvv[ch] + momentum * var[ch] * n / (n - 1);
      const double einv = 1 / std::sqrt(rvv[ch] + eps);
      for (int64_t b_ = 0; b_ < c.N; ++b_)
        for (int64_t i = 0; i < c.L; ++i) {
          const size_t k = at(b_, ch, i);
          y[k] = (xv[k] - mean[ch]) * inv[ch] * wv[ch] + bv[ch];
          // The terms' magnitudes: x - mean is computed from values as large as |x| and |mean|
          // (channel 0 sits near 40), so its rounding scales with them, not with the difference.
          ym[k] = (std::abs(xv[k]) + std::abs(mean[ch])) * inv[ch] * std::abs(wv[ch]) +
                  std::abs(bv[ch]);
          ye[k] = (xv[k] - rmv[ch]) * einv * wv[ch] + bv[ch];
          yem[k] =
              (std::abs(xv[k]) + std::abs(rmv[ch])) * einv * std::abs(wv[ch]) + std::abs(bv[ch]);
        }
    }
    const std::vector<bp_attr> train = {attr_i("training", 1), attr_f("eps", eps),
                                        attr_f("momentum", momentum)};
    DeviceTensor tx = upload(x), tw = upload(w), tb = upload(b), trm = upload(rm), trv = upload(rv);
    DeviceTensor ty = make_output(d, {c.N, c.C, c.L}), sm = make_output(pd, {c.C}),
                 si = make_output(pd, {c.C});
    if (n < 2) {  // training needs two values a channel
      const ErrorInfo e =
          take(launch("batch_norm", d, {tx.desc, tw.desc, tb.desc, trm.desc, trv.desc},
                      {ty.desc, sm.desc, si.desc}, train));
      EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
      EXPECT_NE(e.message.find("more than one value per channel"), std::string::npos) << e.message;
      EXPECT_EQ(trm.values(), rmv);  // nothing updated on refusal
      continue;
    }
    ASSERT_TRUE(ok(launch("batch_norm", d, {tx.desc, tw.desc, tb.desc, trm.desc, trv.desc},
                          {ty.desc, sm.desc, si.desc}, train)));
    const Tolerance red{.op_class = OpClass::reduction};
    EXPECT_TRUE(bp_test::all_close(d, ty.values(), y,
                                   Tolerance{.op_class = OpClass::reduction, .magnitude = ym}))
        << "training y";
    EXPECT_TRUE(bp_test::all_close(pd, sm.values(), mean, red)) << "save_mean";
    EXPECT_TRUE(bp_test::all_close(pd, si.values(), inv, red)) << "save_invstd";
    EXPECT_TRUE(bp_test::all_close(pd, trm.values(), nrm, red)) << "running_mean";
    EXPECT_TRUE(bp_test::all_close(pd, trv.values(), nrv, red)) << "running_var (unbiased)";
    // Evaluation with the original running statistics: only y is written.
    DeviceTensor erm = upload(rm), erv = upload(rv), ey = make_output(d, {c.N, c.C, c.L});
    ASSERT_TRUE(ok(launch("batch_norm", d, {tx.desc, tw.desc, tb.desc, erm.desc, erv.desc},
                          {ey.desc}, {attr_f("eps", eps)})));
    EXPECT_TRUE(bp_test::all_close(d, ey.values(), ye,
                                   Tolerance{.op_class = OpClass::reduction, .magnitude = yem}))
        << "evaluation y";
    EXPECT_EQ(erm.values(), rmv);
    EXPECT_EQ(erv.values(), rvv);
    // Backward from the saved statistics as the kernel stored them.
    const std::vector<double> smv = sm.values(), siv = si.values();
    std::vector<double> dx(xv.size()), dxm(xv.size()), dwr(c.C), dbr(c.C), dwm(c.C), dbm(c.C);
    for (int64_t ch = 0; ch < c.C; ++ch) {
      double sdy = 0, sdyx = 0, a1 = 0, a2 = 0;
      for (int64_t b_ = 0; b_ < c.N; ++b_)
        for (int64_t i = 0; i < c.L; ++i) {
          const size_t k = at(b_, ch, i);
          sdy += g[k];
          sdyx += g[k] * (xv[k] - smv[ch]);
          a1 += g[k] * g[k];
          a2 += std::pow(g[k] * (xv[k] - smv[ch]) * siv[ch], 2);
        }
      dbr[ch] = sdy;
      dwr[ch] = sdyx * siv[ch];
      dbm[ch] = std::sqrt(a1);
      dwm[ch] = std::sqrt(a2);
      for (int64_t b_ = 0; b_ < c.N; ++b_)
        for (int64_t i = 0; i < c.L; ++i) {
          const size_t k = at(b_, ch, i);
          const double t = (xv[k] - smv[ch]) * siv[ch] * siv[ch] * sdyx / n;
          dx[k] = wv[ch] * siv[ch] * (g[k] - sdy / n - t);
          dxm[k] = std::abs(wv[ch] * siv[ch]) * (std::abs(g[k]) + std::abs(sdy / n) + std::abs(t));
        }
    }
    DeviceTensor tdy = upload(dy), tdx = make_output(d, {c.N, c.C, c.L}),
                 tdw = make_output(pd, {c.C}), tdb = make_output(pd, {c.C});
    ASSERT_TRUE(ok(launch("batch_norm_backward", d, {tdy.desc, tx.desc, tw.desc, sm.desc, si.desc},
                          {tdx.desc, tdw.desc, tdb.desc}, {attr_f("eps", eps)})));
    EXPECT_TRUE(bp_test::all_close(d, tdx.values(), dx,
                                   Tolerance{.op_class = OpClass::reduction, .magnitude = dxm}))
        << "dx";
    EXPECT_TRUE(bp_test::all_close(pd, tdw.values(), dwr,
                                   Tolerance{.op_class = OpClass::reduction, .magnitude = dwm}))
        << "dweight";
    EXPECT_TRUE(bp_test::all_close(pd, tdb.values(), dbr,
                                   Tolerance{.op_class = OpClass::reduction, .magnitude = dbm}))
        << "dbias";
    EXPECT_TRUE(ty.guards_intact() && tdx.guards_intact() && tdw.guards_intact());
  }
}

// ---- Softmax -----------------------------------------------------------------------------

TEST_P(NnTest, SoftmaxAndLogSoftmaxAlongEveryAxis) {
  const bp_dtype d = dt();
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{3, 5, 7}, {2, 1000}, {64, 3, 130}, {6}}) {
    for (int axis = 0; axis < static_cast<int>(shape.size()); ++axis) {
      SCOPED_TRACE(::testing::Message() << "rank " << shape.size() << " axis " << axis);
      HostTensor x = make_host(d, shape, Kind::kDense);
      for (double& v : x.storage) v = round_to(d, v * 4 + 100);  // large: stability matters
      const HostTensor dy = make_host(d, shape, Kind::kDense);
      const std::vector<double> xv = x.values(), g = dy.values();
      int64_t outer = 1, len = shape[static_cast<size_t>(axis)], inner = 1;
      for (int k = 0; k < axis; ++k) outer *= shape[static_cast<size_t>(k)];
      for (size_t k = static_cast<size_t>(axis) + 1; k < shape.size(); ++k) inner *= shape[k];
      std::vector<double> sm(xv.size()), ls(xv.size()), lsm(xv.size());
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t j = 0; j < inner; ++j) {
          auto idx = [&](int64_t k) { return static_cast<size_t>((o * len + k) * inner + j); };
          double m = -INFINITY, s = 0;
          for (int64_t k = 0; k < len; ++k) m = std::max(m, xv[idx(k)]);
          for (int64_t k = 0; k < len; ++k) s += std::exp(xv[idx(k)] - m);
          for (int64_t k = 0; k < len; ++k) {
            sm[idx(k)] = std::exp(xv[idx(k)] - m) / s;
            ls[idx(k)] = xv[idx(k)] - m - std::log(s);
            lsm[idx(k)] = std::abs(xv[idx(k)] - m) + std::log(s);
          }
        }
      const std::vector<bp_attr> attrs = {attr_i("axis", axis)};
      DeviceTensor tx = upload(x), tdy = upload(dy);
      DeviceTensor ts = make_output(d, shape), tl = make_output(d, shape);
      ASSERT_TRUE(ok(launch("softmax", d, {tx.desc}, {ts.desc}, attrs)));
      ASSERT_TRUE(ok(launch("log_softmax", d, {tx.desc}, {tl.desc}, attrs)));
      EXPECT_TRUE(bp_test::all_close(d, ts.values(), sm)) << "softmax";
      EXPECT_TRUE(bp_test::all_close(d, tl.values(), ls, Tolerance{.magnitude = lsm}))
          << "log_softmax";
      // Backward from the device's y (as autograd does), against the formulas in float64.
      const std::vector<double> yv = ts.values(), lv = tl.values();
      std::vector<double> dsx(xv.size()), dsm(xv.size()), dlx(xv.size()), dlm(xv.size());
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t j = 0; j < inner; ++j) {
          auto idx = [&](int64_t k) { return static_cast<size_t>((o * len + k) * inner + j); };
          double s = 0, sa = 0, sg = 0, sga = 0;
          for (int64_t k = 0; k < len; ++k) {
            s += g[idx(k)] * yv[idx(k)];
            sa += std::abs(g[idx(k)] * yv[idx(k)]);
            sg += g[idx(k)];
            sga += std::abs(g[idx(k)]);
          }
          for (int64_t k = 0; k < len; ++k) {
            const size_t i = idx(k);
            dsx[i] = yv[i] * (g[i] - s);
            dsm[i] = std::abs(yv[i]) * (std::abs(g[i]) + sa);
            dlx[i] = g[i] - std::exp(lv[i]) * sg;
            dlm[i] = std::abs(g[i]) + std::exp(lv[i]) * sga;
          }
        }
      DeviceTensor tsg = make_output(d, shape), tlg = make_output(d, shape);
      ASSERT_TRUE(ok(launch("softmax_backward", d, {ts.desc, tdy.desc}, {tsg.desc}, attrs)));
      ASSERT_TRUE(ok(launch("log_softmax_backward", d, {tl.desc, tdy.desc}, {tlg.desc}, attrs)));
      EXPECT_TRUE(bp_test::all_close(d, tsg.values(), dsx, Tolerance{.magnitude = dsm}))
          << "softmax_backward";
      EXPECT_TRUE(bp_test::all_close(d, tlg.values(), dlx, Tolerance{.magnitude = dlm}))
          << "log_softmax_backward";
      EXPECT_TRUE(ts.guards_intact() && tl.guards_intact() && tsg.guards_intact() &&
                  tlg.guards_intact());
    }
  }
}

// ---- Dropout -----------------------------------------------------------------------------

TEST_P(NnTest, DropoutIsThePhiloxMaskBitForBit) {
  const bp_dtype d = dt();
  for (double p : {0.0, 0.1, 0.5, 0.9}) {
    const uint64_t seed = static_cast<uint64_t>(uniform_int(0, 1LL << 62));
    const uint64_t offset = static_cast<uint64_t>(uniform_int(0, 1000)) * 4;
    const HostTensor x = make_host(d, {37, 129}, Kind::kDense);
    const std::vector<double> xv = x.values();
    std::vector<double> ref(xv.size());
    int64_t kept = 0;
    const double scale64 = 1.0 / (1.0 - p);
    for (size_t i = 0; i < xv.size(); ++i) {
      const float u = bp_philox_uniform01(seed, offset + i);
      const bool keep = static_cast<double>(u) >= p;
      kept += keep;
      // The product in the compute type (float for f32/f16/bf16), rounded once.
      const double prod =
          d == BP_DTYPE_F64
              ? xv[i] * scale64
              : static_cast<double>(static_cast<float>(xv[i]) * static_cast<float>(scale64));
      ref[i] = keep ? round_to(d, prod) : 0.0;
    }
    DeviceTensor tx = upload(x), ty = make_output(d, {37, 129});
    ASSERT_TRUE(ok(launch("dropout", d, {tx.desc}, {ty.desc},
                          {attr_f("p", p), attr_i("seed", static_cast<int64_t>(seed)),
                           attr_i("offset", static_cast<int64_t>(offset))})));
    EXPECT_TRUE(close(d, ty.values(), ref, 0)) << "p " << p;
    const double frac = static_cast<double>(kept) / static_cast<double>(xv.size());
    EXPECT_NEAR(frac, 1 - p, 0.03) << "kept fraction, p " << p;
    EXPECT_TRUE(ty.guards_intact());
  }
}

INSTANTIATE_TEST_SUITE_P(Float, NnTest, ::testing::ValuesIn(kNnFloats), dtype_param_name);

// ---- max_dim / min_dim, gather, scatter_add (their own dtype domains) ------------------------

class NnIndexTest : public NnTest {};

TEST_P(NnIndexTest, MaxDimAndMinDimWithTiesAndNaN) {
  const bp_dtype d = dt();
  if (d == BP_DTYPE_U8 || d == BP_DTYPE_BOOL) GTEST_SKIP() << "outside max_dim's domain";
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{4, 6, 5}, {300, 3}, {2, 700}, {9}}) {
    for (int axis = 0; axis < static_cast<int>(shape.size()); ++axis) {
      for (bool with_nan : {false, true}) {
        if (with_nan && !is_float(d)) continue;
        SCOPED_TRACE(::testing::Message() << "rank " << shape.size() << " axis " << axis
                                          << (with_nan ? " with NaN" : ""));
        HostTensor x = make_host(d, shape, Kind::kDense, Dist::kSmallInts);
        if (with_nan)
          for (size_t i = 1; i < x.storage.size(); i += 7) x.storage[i] = std::nan("");
        const std::vector<double> xv = x.values();
        int64_t outer = 1, len = shape[static_cast<size_t>(axis)], inner = 1;
        for (int k = 0; k < axis; ++k) outer *= shape[static_cast<size_t>(k)];
        for (size_t k = static_cast<size_t>(axis) + 1; k < shape.size(); ++k) inner *= shape[k];
        std::vector<int64_t> rshape = shape;
        rshape[static_cast<size_t>(axis)] = 1;
        for (bool is_max : {true, false}) {
          std::vector<double> vals, idx;
          for (int64_t o = 0; o < outer; ++o)
            for (int64_t j = 0; j < inner; ++j) {
              double best = xv[static_cast<size_t>(o * len * inner + j)];
              int64_t at = 0;
              for (int64_t k = 1; k < len; ++k) {
                const double v = xv[static_cast<size_t>((o * len + k) * inner + j)];
                if (std::isnan(best)) break;
                if (std::isnan(v) || (is_max ? v > best : v < best)) {
                  best = v;
                  at = k;
                }
              }
              vals.push_back(best);
              idx.push_back(static_cast<double>(at));
            }
          DeviceTensor tx = upload(x), tv = make_output(d, rshape),
                       ti = make_output(BP_DTYPE_I64, rshape);
          ASSERT_TRUE(ok(launch(is_max ? "max_dim" : "min_dim", d, {tx.desc}, {tv.desc, ti.desc},
                                {attr_i("axis", axis)})));
          EXPECT_TRUE(close(d, tv.values(), vals, 0)) << (is_max ? "max" : "min") << " values";
          EXPECT_TRUE(close(BP_DTYPE_I64, ti.values(), idx))
              << (is_max ? "max" : "min") << " indices";
          EXPECT_TRUE(tv.guards_intact() && ti.guards_intact());
        }
      }
    }
  }
}

TEST_P(NnIndexTest, GatherAlongEveryAxis) {
  const bp_dtype d = dt();
  const std::vector<int64_t> xs = {5, 6, 7};
  for (int axis = 0; axis < 3; ++axis) {
    SCOPED_TRACE(::testing::Message() << "axis " << axis);
    std::vector<int64_t> is = {4, 5, 6};  // smaller than x off the axis
    is[static_cast<size_t>(axis)] = 9;    // any length along it
    const HostTensor x = make_host(d, xs, Kind::kDense);
    HostTensor index = make_host(BP_DTYPE_I64, is, Kind::kDense);
    for (double& v : index.storage)
      v = static_cast<double>(uniform_int(0, xs[static_cast<size_t>(axis)] - 1));
    std::vector<double> ref;
    for_each_index(is, [&](const std::vector<int64_t>& i) {
      std::vector<int64_t> j = i;
      j[static_cast<size_t>(axis)] = static_cast<int64_t>(index.at(i));
      ref.push_back(x.at(j));
    });
    DeviceTensor tx = upload(x), ti = upload(index), to = make_output(d, is);
    ASSERT_TRUE(ok(launch("gather", d, {tx.desc, ti.desc}, {to.desc}, {attr_i("axis", axis)})));
    EXPECT_TRUE(close(d, to.values(), ref, 0));
    EXPECT_TRUE(to.guards_intact());
  }
  // An index outside the axis names itself, its position and the size.
  const HostTensor x = make_host(d, {3, 4}, Kind::kDense);
  HostTensor index = make_host(BP_DTYPE_I64, {2, 4}, Kind::kDense);
  for (double& v : index.storage) v = 1;
  index.storage[6] = 4;
  DeviceTensor tx = upload(x), ti = upload(index), to = make_output(d, {2, 4});
  const ErrorInfo e = take(launch("gather", d, {tx.desc, ti.desc}, {to.desc}, {attr_i("axis", 1)}));
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(e.message.find("index 4 at position [1,2]"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("outside [0, 4)"), std::string::npos) << e.message;
}

TEST_P(NnIndexTest, ScatterAddInSourceOrder) {
  const bp_dtype d = dt();
  if (d == BP_DTYPE_BOOL) GTEST_SKIP() << "outside scatter_add's domain";
  const std::vector<int64_t> os = {5, 6, 7};
  for (int axis = 0; axis < 3; ++axis) {
    for (bool inplace : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "axis " << axis << (inplace ? " in place" : ""));
      std::vector<int64_t> is = {4, 5, 6};
      is[static_cast<size_t>(axis)] = 11;  // more sources than targets: repeated indices
      // Small integers: every sum is exact in every dtype, so the comparison is exact.
      const HostTensor base = make_host(d, os, Kind::kDense, Dist::kSmallInts);
      const HostTensor src = make_host(d, is, Kind::kDense, Dist::kSmallInts);
      HostTensor index = make_host(BP_DTYPE_I64, is, Kind::kDense);
      for (double& v : index.storage)
        v = static_cast<double>(uniform_int(0, os[static_cast<size_t>(axis)] - 1));
      HostTensor out = base;
      const std::vector<int64_t> ds = dense_strides(os);
      for_each_index(is, [&](const std::vector<int64_t>& i) {
        std::vector<int64_t> j = i;
        j[static_cast<size_t>(axis)] = static_cast<int64_t>(index.at(i));
        int64_t off = 0;
        for (size_t k = 0; k < 3; ++k) off += j[k] * ds[k];
        double& o = out.storage[static_cast<size_t>(off)];
        o = round_to(d, o + src.at(i));
      });
      DeviceTensor tb = upload(base), ti = upload(index), ts = upload(src);
      DeviceTensor to = inplace ? DeviceTensor() : make_output(d, os);
      const bp_tensor_desc od = inplace ? tb.desc : to.desc;
      std::vector<bp_attr> attrs = {attr_i("axis", axis)};
      if (inplace) attrs.push_back(attr_i("inplace", 1));
      ASSERT_TRUE(ok(launch("scatter_add", d, {tb.desc, ti.desc, ts.desc}, {od}, attrs)));
      EXPECT_TRUE(close(d, (inplace ? tb : to).values(), out.values(), 0));
      EXPECT_TRUE(tb.guards_intact());
    }
  }
  // A bad index is refused before anything is written, in place too.
  const HostTensor base = make_host(d, {3, 4}, Kind::kDense);
  const HostTensor src = make_host(d, {3, 4}, Kind::kDense);
  HostTensor index = make_host(BP_DTYPE_I64, {3, 4}, Kind::kDense);
  for (double& v : index.storage) v = 0;
  index.storage[9] = -1;
  DeviceTensor tb = upload(base), ti = upload(index), ts = upload(src);
  const ErrorInfo e = take(launch("scatter_add", d, {tb.desc, ti.desc, ts.desc}, {tb.desc},
                                  {attr_i("axis", 0), attr_i("inplace", 1)}));
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(e.message.find("index -1 at position [2,1]"), std::string::npos) << e.message;
  EXPECT_EQ(tb.values(), base.values());
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, NnIndexTest, ::testing::ValuesIn(all_dtypes()),
                         dtype_param_name);

}  // namespace
}  // namespace bpt
