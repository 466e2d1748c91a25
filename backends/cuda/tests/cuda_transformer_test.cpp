// The CUDA plugin's own cases for the transformer family (ABI 1.5) on a real GPU, where the
// conformance kit's cases do not reach: embedding_backward's sums taken in increasing position
// (bit for bit against a float loop, and the same bits twice), embedding's out-of-range indices
// reported at the next synchronisation, and attention on rows long enough that the launch
// splits its scratch into chunks of query rows, and under the causal mask in blocks of rows that
// see a prefix of the keys (Note [CUDA attention]: dk and dv added over the chunks, through f32
// buffers for f16/bf16), and cuDNN's fused attention for f16/bf16 (Note [cuDNN attention]:
// GPT-2's head size, its deterministic backward, a bad BACKPLANE_CUDNN_ATTENTION). The f16/bf16
// cases run three times in the GPU job (tools/gpu/transformer.sh): as they are (cuDNN), with
// BACKPLANE_CUDNN_ATTENTION=deterministic and with =0 (Backplane's kernels). Every (op, dtype)
// against the float64 references is the conformance kit's. Skips without a GPU (CI).
#include "cuda_test_support.hpp"

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

namespace bp_cuda_test {
namespace {

TEST(CudaTransformer, EmbeddingBackwardSumsInIndexOrder) {
  BP_REQUIRE_GPU();
  const int64_t V = 50, D = 37, M = 3000;
  // Indices from the first 5 rows only: long runs of repeats, and rows nobody names.
  Tensor idx = dense(BP_DTYPE_I64, {M}, [] { return static_cast<double>(uniform_int(0, 4)); });
  Tensor dy = dense(BP_DTYPE_F32, {M, D}, range_values(-1, 1));
  Tensor dw = dense(BP_DTYPE_F32, {V, D}, any_values(BP_DTYPE_F32));
  Tensor dw2 = dense(BP_DTYPE_F32, {V, D}, any_values(BP_DTYPE_F32));
  launch("embedding_backward", BP_DTYPE_F32, {&dy, &idx}, {&dw});
  launch("embedding_backward", BP_DTYPE_F32, {&dy, &idx}, {&dw2});
  const std::vector<double> iv = idx.values(), gv = dy.values();
  std::vector<float> ref(static_cast<size_t>(V * D), 0.0f);
  for (int64_t m = 0; m < M; ++m) {
    const int64_t t = static_cast<int64_t>(iv[static_cast<size_t>(m)]);
    for (int64_t j = 0; j < D; ++j)
      ref[static_cast<size_t>(t * D + j)] += static_cast<float>(gv[static_cast<size_t>(m * D + j)]);
  }
  const std::vector<double> got = dw.download(), got2 = dw2.download();
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(got[i], static_cast<double>(ref[i])) << "element " << i << " (row " << i / D << ")";
    ASSERT_EQ(got2[i], got[i]) << "element " << i << " differs between two runs";
  }
}

TEST(CudaTransformer, EmbeddingOutOfRangeIsReportedAtSynchronize) {
  BP_REQUIRE_GPU();
  const int64_t V = 5, D = 3, M = 6;
  Tensor w = dense(BP_DTYPE_F32, {V, D}, any_values(BP_DTYPE_F32));
  Tensor idx = dense(BP_DTYPE_I64, {M}, [] { return static_cast<double>(uniform_int(0, 4)); });
  std::vector<unsigned char> bytes(8);
  bp_test::encode(BP_DTYPE_I64, 9.0, bytes.data());
  check(api()->copy_h2d(stream(), idx.buf->get(), 2 * 8, bytes.data(), 8), "copy_h2d");
  Tensor out = dense(BP_DTYPE_F32, {M, D}, any_values(BP_DTYPE_F32));
  check(try_launch("embedding", BP_DTYPE_F32, {&w, &idx}, {&out}), "embedding queues");
  const Err e = sync_error();
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(e.message.find("embedding"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("index 9 at position 2"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("table of 5 rows"), std::string::npos) << e.message;
  sync();  // reported once
  bp_test::encode(BP_DTYPE_I64, 1.0, bytes.data());
  check(api()->copy_h2d(stream(), idx.buf->get(), 2 * 8, bytes.data(), 8), "copy_h2d");
  bp_test::encode(BP_DTYPE_I64, -1.0, bytes.data());
  check(api()->copy_h2d(stream(), idx.buf->get(), 4 * 8, bytes.data(), 8), "copy_h2d");
  Tensor dy = dense(BP_DTYPE_F32, {M, D}, any_values(BP_DTYPE_F32));
  Tensor dw = dense(BP_DTYPE_F32, {V, D}, any_values(BP_DTYPE_F32));
  check(try_launch("embedding_backward", BP_DTYPE_F32, {&dy, &idx}, {&dw}),
        "embedding_backward queues");
  const Err e2 = sync_error();
  EXPECT_EQ(e2.code, BP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(e2.message.find("embedding_backward"), std::string::npos) << e2.message;
  EXPECT_NE(e2.message.find("index -1 at position 4"), std::string::npos) << e2.message;
  sync();
}

// One (batch, head) pair of attention, q k v [n, e], causal or not, in float64: the forward's out
// and lse, then the backward's dq dk dv for dout from `out_r` (out as the device holds it) with the
// magnitudes of their terms.
struct AttnRef {
  std::vector<double> out, lse, dq, dk, dv, dqm, dkm, dvm;
};

AttnRef attention_reference(int64_t n, int64_t e, const std::vector<double>& q,
                            const std::vector<double>& k, const std::vector<double>& v,
                            const std::vector<double>& dout, int out_dtype, bool causal) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(e));
  AttnRef r;
  r.out.assign(static_cast<size_t>(n * e), 0.0);
  r.lse.assign(static_cast<size_t>(n), 0.0);
  r.dq = r.dqm = r.out;
  r.dk = r.dkm = r.dv = r.dvm = r.out;
  std::vector<double> s(static_cast<size_t>(n));
  auto at = [e](int64_t i, int64_t c) { return static_cast<size_t>(i * e + c); };
  for (int64_t i = 0; i < n; ++i) {
    double m = -INFINITY, sum = 0;
    for (int64_t j = 0; j < (causal ? i + 1 : n); ++j) {
      double dot = 0;
      for (int64_t c = 0; c < e; ++c) dot += q[at(i, c)] * k[at(j, c)];
      s[static_cast<size_t>(j)] = scale * dot;
      m = std::max(m, s[static_cast<size_t>(j)]);
    }
    for (int64_t j = 0; j < (causal ? i + 1 : n); ++j)
      sum += std::exp(s[static_cast<size_t>(j)] - m);
    const double l = m + std::log(sum);
    r.lse[static_cast<size_t>(i)] = l;
    for (int64_t j = 0; j < (causal ? i + 1 : n); ++j)
      for (int64_t c = 0; c < e; ++c)
        r.out[at(i, c)] += std::exp(s[static_cast<size_t>(j)] - l) * v[at(j, c)];
    double D = 0, Dm = 0;
    for (int64_t c = 0; c < e; ++c) {
      const double o = round_to(out_dtype, r.out[at(i, c)]);
      D += dout[at(i, c)] * o;
      Dm += std::fabs(dout[at(i, c)] * o);
    }
    for (int64_t j = 0; j < (causal ? i + 1 : n); ++j) {
      const double p = std::exp(s[static_cast<size_t>(j)] - l);
      double g = 0, gm = 0;
      for (int64_t c = 0; c < e; ++c) {
        g += dout[at(i, c)] * v[at(j, c)];
        gm += std::fabs(dout[at(i, c)] * v[at(j, c)]);
        r.dv[at(j, c)] += p * dout[at(i, c)];
        r.dvm[at(j, c)] += std::fabs(p * dout[at(i, c)]);
      }
      const double ds = p * (g - D), dsm = p * (gm + Dm);
      for (int64_t c = 0; c < e; ++c) {
        r.dq[at(i, c)] += scale * ds * k[at(j, c)];
        r.dqm[at(i, c)] += scale * dsm * std::fabs(k[at(j, c)]);
        r.dk[at(j, c)] += scale * ds * q[at(i, c)];
        r.dkm[at(j, c)] += scale * dsm * std::fabs(q[at(i, c)]);
      }
    }
  }
  return r;
}

// Forward and backward of one pair of n queries and keys against float64, the backward from
// the reference forward rounded to the device's dtypes.
void check_attention(int dt, int64_t n, bool causal, int64_t e = 8) {
  const int st = dt == BP_DTYPE_F64 ? BP_DTYPE_F64 : BP_DTYPE_F32;
  Tensor q = dense(dt, {1, 1, n, e}, range_values(-1, 1));
  Tensor k = dense(dt, {1, 1, n, e}, range_values(-1, 1));
  Tensor v = dense(dt, {1, 1, n, e}, range_values(-1, 1));
  Tensor dout = dense(dt, {1, 1, n, e}, range_values(-1, 1));
  const AttnRef r =
      attention_reference(n, e, q.values(), k.values(), v.values(), dout.values(), dt, causal);
  Tensor out = dense(dt, {1, 1, n, e}, any_values(dt));
  Tensor lse = dense(st, {1, 1, n}, any_values(st));
  const std::vector<bp_attr> attrs = {attr_i("causal", causal ? 1 : 0)};
  launch("scaled_dot_product_attention", dt, {&q, &k, &v}, {&out, &lse}, attrs);
  const double tol = bp_test::rtol(dt, bp_test::OpClass::matmul) * 4;
  std::vector<double> om(r.out.size(), 1.0), lm(r.lse.size());
  for (size_t i = 0; i < lm.size(); ++i) lm[i] = std::fabs(r.lse[i]) + 3;
  EXPECT_TRUE(close(dt, out.download(), r.out, tol, om)) << "out";
  EXPECT_TRUE(close(st, lse.download(), r.lse, tol, lm)) << "lse";
  // The backward from the reference forward, rounded to the device's dtypes.
  Tensor out_r = dense(dt, {1, 1, n, e}, any_values(dt));
  Tensor lse_r = dense(st, {1, 1, n}, any_values(st));
  {
    std::vector<unsigned char> bytes(r.out.size() * dsize(dt));
    for (size_t i = 0; i < r.out.size(); ++i) bp_test::encode(dt, r.out[i], &bytes[i * dsize(dt)]);
    check(api()->copy_h2d(stream(), out_r.buf->get(), 0, bytes.data(), bytes.size()), "copy_h2d");
    std::vector<unsigned char> lb(r.lse.size() * dsize(st));
    for (size_t i = 0; i < r.lse.size(); ++i) bp_test::encode(st, r.lse[i], &lb[i * dsize(st)]);
    check(api()->copy_h2d(stream(), lse_r.buf->get(), 0, lb.data(), lb.size()), "copy_h2d");
    sync();
  }
  Tensor dq = dense(dt, {1, 1, n, e}, any_values(dt));
  Tensor dk = dense(dt, {1, 1, n, e}, any_values(dt));
  Tensor dv = dense(dt, {1, 1, n, e}, any_values(dt));
  launch("scaled_dot_product_attention_backward", dt, {&q, &k, &v, &out_r, &dout, &lse_r},
         {&dq, &dk, &dv}, attrs);
  EXPECT_TRUE(close(dt, dq.download(), r.dq, tol, r.dqm)) << "dq";
  EXPECT_TRUE(close(dt, dk.download(), r.dk, tol, r.dkm)) << "dk";
  EXPECT_TRUE(close(dt, dv.download(), r.dv, tol, r.dvm)) << "dv";
}

// f16: 12 bytes of scratch per score (f32 scores and dP, f16 p z and ds): 4800^2 of them pass
// the 256 MiB bound, so the rows come in two chunks and dk, dv add up in f32 buffers.
TEST(CudaTransformer, AttentionBackwardRowChunksF16) {
  BP_REQUIRE_GPU();
  check_attention(BP_DTYPE_F16, 4800, false);
}

// f32: 8 bytes per score; dk and dv add up in place over the two chunks.
TEST(CudaTransformer, AttentionBackwardRowChunksF32) {
  BP_REQUIRE_GPU();
  check_attention(BP_DTYPE_F32, 5800, false);
}

// Causal: blocks of n / 8 query rows, each computing only the keys it sees; dk and dv start
// from zeros (through f32 buffers for bf16).
TEST(CudaTransformer, AttentionCausalRowBlocks) {
  BP_REQUIRE_GPU();
  check_attention(BP_DTYPE_BF16, 1000, true);
  check_attention(BP_DTYPE_F32, 1000, true);
  check_attention(BP_DTYPE_F64, 300, true);
}

// GPT-2's head size (E = 64): the shapes cuDNN's fused attention takes, causal or not, and a
// length that is not a multiple of its tiles.
TEST(CudaTransformer, AttentionGpt2Heads) {
  BP_REQUIRE_GPU();
  check_attention(BP_DTYPE_BF16, 1024, true, 64);
  check_attention(BP_DTYPE_F16, 777, false, 64);
  check_attention(BP_DTYPE_BF16, 333, false, 64);
}

// The backward gives the same bits twice: under BACKPLANE_CUDNN_ATTENTION=deterministic (cuDNN's
// deterministic algorithm) and =0 (our own kernels, deterministic by construction), as CI's GPU
// job runs it. The default (cuDNN's atomics) passed it too on an H100: it is no proof of
// nondeterminism, only a regression check of the two deterministic paths.
TEST(CudaTransformer, AttentionBackwardIsDeterministic) {
  BP_REQUIRE_GPU();
  const int dt = BP_DTYPE_BF16;
  const int64_t b = 2, h = 4, n = 1000, e = 64;
  Tensor q = dense(dt, {b, h, n, e}, range_values(-2, 2));
  Tensor k = dense(dt, {b, h, n, e}, range_values(-2, 2));
  Tensor v = dense(dt, {b, h, n, e}, range_values(-1, 1));
  Tensor dout = dense(dt, {b, h, n, e}, range_values(-1, 1));
  Tensor out = dense(dt, {b, h, n, e}, any_values(dt));
  Tensor lse = dense(BP_DTYPE_F32, {b, h, n}, any_values(BP_DTYPE_F32));
  const std::vector<bp_attr> attrs = {attr_i("causal", 1)};
  launch("scaled_dot_product_attention", dt, {&q, &k, &v}, {&out, &lse}, attrs);
  std::vector<std::vector<double>> first;
  for (int run = 0; run < 2; ++run) {
    Tensor dq = dense(dt, {b, h, n, e}, any_values(dt));
    Tensor dk = dense(dt, {b, h, n, e}, any_values(dt));
    Tensor dv = dense(dt, {b, h, n, e}, any_values(dt));
    launch("scaled_dot_product_attention_backward", dt, {&q, &k, &v, &out, &dout, &lse},
           {&dq, &dk, &dv}, attrs);
    std::vector<std::vector<double>> got = {dq.download(), dk.download(), dv.download()};
    double mag = 0;
    for (double x : got[0]) mag = std::max(mag, std::fabs(x));
    EXPECT_GT(mag, 0.0) << "dq is all zeros";
    if (run == 0)
      first = std::move(got);
    else
      for (size_t t = 0; t < got.size(); ++t)
        EXPECT_TRUE(got[t] == first[t]) << "gradient " << t << " differs between two runs";
  }
}

// Registered with BACKPLANE_CUDNN_ATTENTION=bogus (CMakeLists.txt): the launch is refused with
// the variable, its value and the accepted values; skipped where the variable is not so.
TEST(CudaTransformer, AttentionRefusesABadCudnnSetting) {
  BP_REQUIRE_GPU();
  const char* v = std::getenv("BACKPLANE_CUDNN_ATTENTION");
  if (!v || std::string(v) != "bogus") GTEST_SKIP() << "needs BACKPLANE_CUDNN_ATTENTION=bogus";
  const int dt = BP_DTYPE_BF16;
  Tensor q = dense(dt, {1, 1, 16, 64}, range_values(-1, 1));
  Tensor out = dense(dt, {1, 1, 16, 64}, any_values(dt));
  Tensor lse = dense(BP_DTYPE_F32, {1, 1, 16}, any_values(BP_DTYPE_F32));
  const Err err =
      error_of(try_launch("scaled_dot_product_attention", dt, {&q, &q, &q}, {&out, &lse}, {}));
  EXPECT_EQ(err.code, BP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(err.message.find("BACKPLANE_CUDNN_ATTENTION='bogus' is not 0, 1 or deterministic"),
            std::string::npos)
      << err.message;
}

}  // namespace
}  // namespace bp_cuda_test
