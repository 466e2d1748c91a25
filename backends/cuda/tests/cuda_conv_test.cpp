// The CUDA plugin's own cases for the convolutional family on a real GPU: cuDNN's convolution
// wiring (NCHW, groups, stride, padding, dilation, f32 without TF32) and batch normalisation
// (running statistics, save outputs) against float64 loops; the dropout mask bit for bit
// against the host's Philox; softmax's warp, block and column paths; out-of-range indices
// reported at the next synchronisation (Note [Deferred index errors]); and a missing cuDNN as
// BP_ERROR_UNAVAILABLE naming BACKPLANE_CUDNN_LIBRARY. Every (op, dtype) against the float64
// references is the conformance kit's (conformance.cuda). Skips without a GPU (CI).
#include "cuda_test_support.hpp"

#include <backplane/abi/philox.h>

#include <cmath>
#include <string>
#include <vector>

namespace bp_cuda_test {
namespace {

bp_attr attr_f(const char* name, double v) {
  bp_attr a{};
  a.struct_size = sizeof a;
  a.name = name;
  a.kind = BP_ATTR_FLOAT;
  a.f = v;
  return a;
}

struct Geom {
  int64_t n, c, h, w, k, r, s, stride, pad, dil, groups;
  int64_t p() const { return (h + 2 * pad - dil * (r - 1) - 1) / stride + 1; }
  int64_t q() const { return (w + 2 * pad - dil * (s - 1) - 1) / stride + 1; }
  std::vector<bp_attr> attrs() const {
    return {attr_i("stride_h", stride), attr_i("stride_w", stride), attr_i("pad_h", pad),
            attr_i("pad_w", pad),       attr_i("dilation_h", dil),  attr_i("dilation_w", dil),
            attr_i("groups", groups)};
  }
};

// The float64 products of conv2d: y (fwd), dx and dw, and the magnitudes |terms| of each.
struct ConvRef {
  std::vector<double> y, ym, dx, dxm, dw, dwm;
};

ConvRef conv_reference(const Geom& g, const std::vector<double>& x, const std::vector<double>& w,
                       const std::vector<double>& dy) {
  const int64_t P = g.p(), Q = g.q(), cg = g.c / g.groups, kg = g.k / g.groups;
  ConvRef r;
  r.y.assign(static_cast<size_t>(g.n * g.k * P * Q), 0.0);
  r.ym = r.y;
  r.dx.assign(static_cast<size_t>(g.n * g.c * g.h * g.w), 0.0);
  r.dxm = r.dx;
  r.dw.assign(static_cast<size_t>(g.k * cg * g.r * g.s), 0.0);
  r.dwm = r.dw;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t k = 0; k < g.k; ++k)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q) {
          const size_t yi = static_cast<size_t>(((n * g.k + k) * P + p) * Q + q);
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t i = 0; i < g.r; ++i)
              for (int64_t j = 0; j < g.s; ++j) {
                const int64_t hh = p * g.stride - g.pad + i * g.dil;
                const int64_t ww = q * g.stride - g.pad + j * g.dil;
                if (hh < 0 || hh >= g.h || ww < 0 || ww >= g.w) continue;
                const int64_t ci = (k / kg) * cg + c;
                const size_t xi = static_cast<size_t>(((n * g.c + ci) * g.h + hh) * g.w + ww);
                const size_t wi = static_cast<size_t>(((k * cg + c) * g.r + i) * g.s + j);
                r.y[yi] += x[xi] * w[wi];
                r.ym[yi] += std::fabs(x[xi] * w[wi]);
                r.dx[xi] += dy[yi] * w[wi];
                r.dxm[xi] += std::fabs(dy[yi] * w[wi]);
                r.dw[wi] += dy[yi] * x[xi];
                r.dwm[wi] += std::fabs(dy[yi] * x[xi]);
              }
        }
  return r;
}

TEST(CudaConv, Conv2dAndBackwardMatchFloat64) {
  BP_REQUIRE_GPU();
  const Geom shapes[] = {{2, 6, 9, 7, 4, 3, 3, 2, 1, 1, 2},
                         {3, 5, 8, 8, 7, 3, 2, 1, 2, 2, 1},
                         {2, 16, 6, 6, 16, 3, 3, 1, 1, 1, 16}};
  for (int dt : {BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_F16, BP_DTYPE_BF16}) {
    for (const Geom& g : shapes) {
      SCOPED_TRACE(std::string(bp_dtype_name(dt)) + " groups " + std::to_string(g.groups));
      Tensor x = dense(dt, {g.n, g.c, g.h, g.w}, range_values(-1, 1));
      Tensor w = dense(dt, {g.k, g.c / g.groups, g.r, g.s}, range_values(-1, 1));
      Tensor dy = dense(dt, {g.n, g.k, g.p(), g.q()}, range_values(-1, 1));
      Tensor y = dense(dt, {g.n, g.k, g.p(), g.q()}, any_values(dt));
      Tensor dx = dense(dt, {g.n, g.c, g.h, g.w}, any_values(dt));
      Tensor dw = dense(dt, {g.k, g.c / g.groups, g.r, g.s}, any_values(dt));
      std::vector<bp_attr> at = g.attrs();
      at.push_back(attr_i("allow_tf32", 0));
      launch("conv2d", dt, {&x, &w}, {&y}, at);
      launch("conv2d_backward_input", dt, {&dy, &w}, {&dx}, at);
      launch("conv2d_backward_weight", dt, {&x, &dy}, {&dw}, at);
      const ConvRef r = conv_reference(g, x.values(), w.values(), dy.values());
      const double tol = bp_test::rtol(dt, bp_test::OpClass::matmul);
      EXPECT_TRUE(close(dt, y.download(), r.y, tol, r.ym));
      EXPECT_TRUE(close(dt, dx.download(), r.dx, tol, r.dxm));
      EXPECT_TRUE(close(dt, dw.download(), r.dw, tol, r.dwm));
    }
  }
}

TEST(CudaConv, BatchNormTrainingUpdatesRunningStatistics) {
  BP_REQUIRE_GPU();
  const int64_t N = 4, C = 3, L = 37;
  for (int dt : {BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_F16, BP_DTYPE_BF16}) {
    SCOPED_TRACE(bp_dtype_name(dt));
    const int pd = dt == BP_DTYPE_F64 ? BP_DTYPE_F64 : BP_DTYPE_F32;
    Tensor x = dense(dt, {N, C, L}, range_values(-3, 5));
    Tensor w = dense(pd, {C}, range_values(0.5, 2));
    Tensor b = dense(pd, {C}, range_values(-1, 1));
    Tensor rm = dense(pd, {C}, range_values(-1, 1));
    Tensor rv = dense(pd, {C}, range_values(0.5, 2));
    Tensor y = dense(dt, {N, C, L}, any_values(dt));
    Tensor sm = dense(pd, {C}, any_values(pd));
    Tensor si = dense(pd, {C}, any_values(pd));
    const double eps = 1e-3, momentum = 0.2;
    launch("batch_norm", dt, {&x, &w, &b, &rm, &rv}, {&y, &sm, &si},
           {attr_i("training", 1), attr_f("eps", eps), attr_f("momentum", momentum)});
    const std::vector<double> xv = x.values();
    std::vector<double> mean(C), invstd(C), yref(xv.size()), rmref(C), rvref(C);
    for (int64_t c = 0; c < C; ++c) {
      double s = 0, q = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t l = 0; l < L; ++l) s += xv[static_cast<size_t>((n * C + c) * L + l)];
      mean[c] = s / (N * L);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t l = 0; l < L; ++l) {
          const double d = xv[static_cast<size_t>((n * C + c) * L + l)] - mean[c];
          q += d * d;
        }
      const double var = q / (N * L);
      invstd[c] = 1 / std::sqrt(var + eps);
      rmref[c] = (1 - momentum) * rm.values()[c] + momentum * mean[c];
      rvref[c] = (1 - momentum) * rv.values()[c] + momentum * var * (N * L) / (N * L - 1.0);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t l = 0; l < L; ++l) {
          const size_t i = static_cast<size_t>((n * C + c) * L + l);
          yref[i] = (xv[i] - mean[c]) * invstd[c] * w.values()[c] + b.values()[c];
        }
    }
    const double tol = bp_test::rtol(dt, bp_test::OpClass::reduction);
    const double ptol = bp_test::rtol(pd, bp_test::OpClass::reduction) * 10;
    EXPECT_TRUE(close(dt, y.download(), yref, tol * 4));
    EXPECT_TRUE(close(pd, sm.download(), mean, ptol, std::vector<double>(C, 5.0)));
    EXPECT_TRUE(close(pd, si.download(), invstd, ptol));
    EXPECT_TRUE(close(pd, rm.download(), rmref, ptol, std::vector<double>(C, 5.0)));
    EXPECT_TRUE(close(pd, rv.download(), rvref, ptol));
  }
}

TEST(CudaConv, DropoutMaskIsTheHostPhilox) {
  BP_REQUIRE_GPU();
  const int64_t n = 100003;
  const uint64_t seed = static_cast<uint64_t>(uniform_int(1, 1 << 30)), offset = 6;
  const double p = 0.3;
  Tensor x = dense(BP_DTYPE_F32, {n}, range_values(0.5, 2));
  Tensor y = dense(BP_DTYPE_F32, {n}, any_values(BP_DTYPE_F32));
  launch("dropout", BP_DTYPE_F32, {&x}, {&y},
         {attr_f("p", p), attr_i("seed", static_cast<int64_t>(seed)),
          attr_i("offset", static_cast<int64_t>(offset))});
  const std::vector<double> xv = x.values(), yv = y.download();
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = bp_philox_uniform01(seed, offset + static_cast<uint64_t>(i)) >= p;
    ASSERT_EQ(yv[static_cast<size_t>(i)] != 0.0, keep) << "element " << i;
    if (keep) {
      ++kept;
      EXPECT_FLOAT_EQ(yv[static_cast<size_t>(i)], xv[static_cast<size_t>(i)] / (1 - p));
    }
  }
  EXPECT_NEAR(static_cast<double>(kept) / n, 1 - p, 0.01);
}

TEST(CudaConv, SoftmaxRowsBlocksAndColumns) {
  BP_REQUIRE_GPU();
  // [rows, len] along the last axis (warp and block paths), and along axis 0 (columns).
  const std::vector<std::vector<int64_t>> shapes = {{33, 70}, {3, 5000}, {40, 9}};
  const int axes[] = {1, 1, 0};
  for (size_t k = 0; k < shapes.size(); ++k) {
    const std::vector<int64_t>& sh = shapes[k];
    const int axis = axes[k];
    Tensor x = dense(BP_DTYPE_F32, sh, range_values(-30, 30));
    Tensor y = dense(BP_DTYPE_F32, sh, any_values(BP_DTYPE_F32));
    Tensor ly = dense(BP_DTYPE_F32, sh, any_values(BP_DTYPE_F32));
    launch("softmax", BP_DTYPE_F32, {&x}, {&y}, {attr_i("axis", axis)});
    launch("log_softmax", BP_DTYPE_F32, {&x}, {&ly}, {attr_i("axis", axis)});
    const std::vector<double> xv = x.values();
    std::vector<double> ref(xv.size()), lref(xv.size());
    const int64_t outer = axis == 1 ? sh[0] : 1, len = sh[static_cast<size_t>(axis)],
                  inner = axis == 1 ? 1 : sh[1];
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        auto at = [&](int64_t i) { return static_cast<size_t>((o * len + i) * inner + in); };
        double m = -INFINITY, s = 0;
        for (int64_t i = 0; i < len; ++i) m = std::max(m, xv[at(i)]);
        for (int64_t i = 0; i < len; ++i) s += std::exp(xv[at(i)] - m);
        for (int64_t i = 0; i < len; ++i) {
          ref[at(i)] = std::exp(xv[at(i)] - m) / s;
          lref[at(i)] = xv[at(i)] - m - std::log(s);
        }
      }
    const double tol = bp_test::rtol(BP_DTYPE_F32, bp_test::OpClass::reduction) * 4;
    EXPECT_TRUE(close(BP_DTYPE_F32, y.download(), ref, tol)) << "shape " << k;
    EXPECT_TRUE(close(BP_DTYPE_F32, ly.download(), lref, tol, std::vector<double>(xv.size(), 60)))
        << "shape " << k;
  }
}

TEST(CudaConv, OutOfRangeIndexIsReportedAtSynchronize) {
  BP_REQUIRE_GPU();
  Tensor x = dense(BP_DTYPE_F32, {4, 5}, any_values(BP_DTYPE_F32));
  Tensor index = dense(BP_DTYPE_I64, {4, 2}, [] { return static_cast<double>(uniform_int(0, 4)); });
  index.storage[5] = 7;  // position 5 of the index tensor
  std::vector<unsigned char> bytes(8);
  bp_test::encode(BP_DTYPE_I64, 7.0, bytes.data());
  check(api()->copy_h2d(stream(), index.buf->get(), 5 * 8, bytes.data(), 8), "copy_h2d");
  Tensor out = dense(BP_DTYPE_F32, {4, 2}, any_values(BP_DTYPE_F32));
  check(try_launch("gather", BP_DTYPE_F32, {&x, &index}, {&out}, {attr_i("axis", 1)}),
        "gather queues");
  const Err e = sync_error();
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(e.message.find("gather"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("index 7 at position 5"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("[0, 5)"), std::string::npos) << e.message;
  sync();  // reported once
  // scatter_add: a negative index.
  Tensor base = dense(BP_DTYPE_F32, {4, 5}, any_values(BP_DTYPE_F32));
  Tensor src = dense(BP_DTYPE_F32, {4, 2}, any_values(BP_DTYPE_F32));
  bp_test::encode(BP_DTYPE_I64, -2.0, bytes.data());
  check(api()->copy_h2d(stream(), index.buf->get(), 3 * 8, bytes.data(), 8), "copy_h2d");
  bp_test::encode(BP_DTYPE_I64, 1.0, bytes.data());
  check(api()->copy_h2d(stream(), index.buf->get(), 5 * 8, bytes.data(), 8), "copy_h2d");
  Tensor out2 = dense(BP_DTYPE_F32, {4, 5}, any_values(BP_DTYPE_F32));
  check(
      try_launch("scatter_add", BP_DTYPE_F32, {&base, &index, &src}, {&out2}, {attr_i("axis", 1)}),
      "scatter_add queues");
  const Err e2 = sync_error();
  EXPECT_EQ(e2.code, BP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(e2.message.find("scatter_add"), std::string::npos) << e2.message;
  EXPECT_NE(e2.message.find("index -2 at position 3"), std::string::npos) << e2.message;
  sync();
}

// The child of MissingCudnnIsUnavailable: conv2d with BACKPLANE_CUDNN_LIBRARY naming no file.
[[noreturn]] void missing_cudnn_child() {
  setenv("BACKPLANE_CUDNN_LIBRARY", "/nonexistent/libcudnn.so.9", 1);
  const Geom g{1, 2, 5, 5, 2, 3, 3, 1, 1, 1, 1};
  Tensor x = dense(BP_DTYPE_F32, {1, 2, 5, 5}, range_values(-1, 1));
  Tensor w = dense(BP_DTYPE_F32, {2, 2, 3, 3}, range_values(-1, 1));
  Tensor y = dense(BP_DTYPE_F32, {1, 2, 5, 5}, any_values(BP_DTYPE_F32));
  const Err e = error_of(try_launch("conv2d", BP_DTYPE_F32, {&x, &w}, {&y}, g.attrs()));
  const bool good = e.code == BP_ERROR_UNAVAILABLE &&
                    e.message.find("cuDNN not found") != std::string::npos &&
                    e.message.find("BACKPLANE_CUDNN_LIBRARY") != std::string::npos;
  std::fprintf(stderr, "%s\n", e.message.c_str());
  std::exit(good ? 0 : 1);
}

// Runs in a child process: the library is opened once per process.
TEST(CudaConvDeathTest, MissingCudnnIsUnavailable) {
  BP_REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(missing_cudnn_child(), ::testing::ExitedWithCode(0), "cuDNN not found");
}

}  // namespace
}  // namespace bp_cuda_test
