// The transformer family through libbackplane on cpu:0: the fused ops against compositions of
// older ops (and host formulas) in values and gradients, in f64 so that the comparison is tight;
// the refusals of Note [Transformer checks] with their exact error types and messages; the
// layers' state_dict keys; a GPT that learns.
#include <gtest/gtest.h>
#include <backplane/backplane.hpp>
#include <backplane_test/seed.hpp>
#include <backplane_test/throws.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace F = bp::nn::functional;

namespace {

bp::Device& cpu() {
  return bp::device("cpu:0");
}

// Fresh random values in [-range, range] from the run's seed (printed; BP_TEST_SEED replays).
bp::Tensor random(const bp::Shape& s, double range = 2.0, bp::DType dt = bp::DType::f64) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  std::uniform_real_distribution<double> u(-range, range);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = u(bp_test::rng("bp_nn_tests"));
  return bp::from_vector(v, s, cpu()).to(dt);
}

double max_rel_diff(const bp::Tensor& a, const bp::Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  std::vector<double> x = a.to(bp::DType::f64).contiguous().to_vector<double>();
  std::vector<double> y = b.to(bp::DType::f64).contiguous().to_vector<double>();
  double worst = 0, scale = 1e-300;
  for (double v : y) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(x[i] - y[i]) / scale);
  return worst;
}

template <typename E>
void expect_refused(const std::function<void()>& f, const std::vector<std::string>& fragments) {
  const uint64_t before = cpu().memory_stats().allocated;
  try {
    f();
    ADD_FAILURE() << "no exception; expected one containing '" << fragments[0] << "'";
  } catch (const E& e) {
    for (const std::string& fragment : fragments)
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
          << "message: " << e.what() << "\nexpected fragment: " << fragment;
  }
  EXPECT_EQ(cpu().memory_stats().allocated, before) << "memory allocated by a refused call";
}

// The gradients of `inputs` (leaves) under loss = sum(f(inputs) * probe).
std::vector<bp::Tensor> grads(const std::function<bp::Tensor(std::vector<bp::Tensor>&)>& f,
                              const std::vector<bp::Tensor>& values, const bp::Tensor& probe) {
  std::vector<bp::Tensor> leaves;
  for (const bp::Tensor& v : values) leaves.push_back(v.detach().clone().requires_grad_(true));
  (f(leaves) * probe).sum().backward();
  std::vector<bp::Tensor> g;
  for (const bp::Tensor& l : leaves) g.push_back(l.grad());
  return g;
}

bp::Tensor composite_layer_norm(const bp::Tensor& x, const bp::Tensor& w, const bp::Tensor& b,
                                double eps) {
  bp::Tensor mean = x.mean(-1, true);
  bp::Tensor d = x - mean;
  bp::Tensor var = (d * d).mean(-1, true);
  return d / (var + eps).sqrt() * w + b;
}

bp::Tensor composite_attention(const bp::Tensor& q, const bp::Tensor& k, const bp::Tensor& v,
                               bool causal) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  bp::Tensor s = bp::matmul(q, k.transpose(-2, -1)) * scale;
  if (causal) {
    bp::Tensor keep = bp::tril(bp::ones({q.size(-2), k.size(-2)}, cpu(), bp::DType::boolean));
    s = bp::where(keep, s, bp::full({}, -INFINITY, cpu(), s.dtype()));
  }
  return bp::matmul(bp::softmax(s, -1), v);
}

}  // namespace

TEST(Transformer, LayerNormMatchesTheCompositeInValuesAndGradients) {
  bp::Tensor x = random({3, 5, 37}, 3.0) + 10.0, w = random({37}), b = random({37});
  bp::Tensor probe = random({3, 5, 37});
  auto fused = [](std::vector<bp::Tensor>& t) { return F::layer_norm(t[0], {37}, t[1], t[2]); };
  auto comp = [](std::vector<bp::Tensor>& t) {
    return composite_layer_norm(t[0], t[1], t[2], 1e-5);
  };
  std::vector<bp::Tensor> in = {x, w, b};
  EXPECT_LT(max_rel_diff(fused(in), comp(in)), 1e-12);
  auto gf = grads(fused, in, probe), gc = grads(comp, in, probe);
  for (size_t i = 0; i < 3; ++i) EXPECT_LT(max_rel_diff(gf[i], gc[i]), 1e-10) << "input " << i;
  // Without weight, and with a bias only (weight taken as ones).
  auto bias_only = [](std::vector<bp::Tensor>& t) {
    return F::layer_norm(t[0], {37}, bp::Tensor(), t[1]);
  };
  auto bias_comp = [&](std::vector<bp::Tensor>& t) {
    return composite_layer_norm(t[0], bp::ones({37}, cpu(), bp::DType::f64), t[1], 1e-5);
  };
  std::vector<bp::Tensor> in2 = {x, b};
  auto g1 = grads(bias_only, in2, probe), g2 = grads(bias_comp, in2, probe);
  for (size_t i = 0; i < 2; ++i) EXPECT_LT(max_rel_diff(g1[i], g2[i]), 1e-10) << "input " << i;
}

TEST(Transformer, GeluAndSiluFollowTheirFormulas) {
  bp::Tensor x = random({4, 33}, 5.0);
  std::vector<double> xv = x.to_vector<double>();
  for (const char* form : {"none", "tanh"}) {
    std::vector<double> y = F::gelu(x, form).to_vector<double>();
    for (size_t i = 0; i < xv.size(); ++i) {
      const double v = xv[i];
      const double ref =
          std::string(form) == "none"
              ? 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)))
              : 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      EXPECT_NEAR(y[i], ref, 1e-12 * (1 + std::fabs(ref))) << form << " at x = " << v;
    }
  }
  // Gradients against the composite x * sigmoid(x) and x Phi(x) written with tanh's identity.
  bp::Tensor probe = random({4, 33});
  auto silu = [](std::vector<bp::Tensor>& t) { return F::silu(t[0]); };
  auto silu_c = [](std::vector<bp::Tensor>& t) { return t[0] * t[0].sigmoid(); };
  EXPECT_LT(max_rel_diff(grads(silu, {x}, probe)[0], grads(silu_c, {x}, probe)[0]), 1e-12);
  auto gelu_t = [](std::vector<bp::Tensor>& t) { return F::gelu(t[0], "tanh"); };
  auto gelu_tc = [](std::vector<bp::Tensor>& t) {
    const bp::Tensor& v = t[0];
    return 0.5 * v * (1.0 + (std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)).tanh());
  };
  EXPECT_LT(max_rel_diff(grads(gelu_t, {x}, probe)[0], grads(gelu_tc, {x}, probe)[0]), 1e-12);
  EXPECT_THROW(F::gelu(x, "erf"), bp::Error);
}

TEST(Transformer, AttentionMatchesTheCompositeInValuesAndGradients) {
  for (bool causal : {false, true}) {
    bp::Tensor q = random({2, 3, 11, 8}), k = random({2, 3, 11, 8}), v = random({2, 3, 11, 5});
    bp::Tensor probe = random({2, 3, 11, 5});
    auto fused = [causal](std::vector<bp::Tensor>& t) {
      return F::scaled_dot_product_attention(t[0], t[1], t[2], bp::Tensor(), 0.0, causal);
    };
    auto comp = [causal](std::vector<bp::Tensor>& t) {
      return composite_attention(t[0], t[1], t[2], causal);
    };
    std::vector<bp::Tensor> in = {q, k, v};
    EXPECT_LT(max_rel_diff(fused(in), comp(in)), 1e-12) << "causal " << causal;
    auto gf = grads(fused, in, probe), gc = grads(comp, in, probe);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_LT(max_rel_diff(gf[i], gc[i]), 1e-10) << "input " << i << " causal " << causal;
  }
  // Scores near 1e4: the fused op stays finite and equals the (stable) composite.
  bp::Tensor q = random({1, 1, 4, 16}, 30.0), k = random({1, 1, 64, 16}, 30.0);
  bp::Tensor v = random({1, 1, 64, 4});
  std::vector<double> out = F::scaled_dot_product_attention(q, k, v).to_vector<double>();
  for (double o : out) EXPECT_TRUE(std::isfinite(o));
  EXPECT_LT(
      max_rel_diff(F::scaled_dot_product_attention(q, k, v), composite_attention(q, k, v, false)),
      1e-10);
}

TEST(Transformer, AttentionDropoutIsReproducibleAndScaled) {
  bp::Tensor q = random({1, 2, 16, 8}), k = random({1, 2, 16, 8});
  bp::Tensor v = bp::ones({1, 2, 16, 8}, cpu(), bp::DType::f64);
  bp::manual_seed(7);
  bp::Tensor a = F::scaled_dot_product_attention(q, k, v, bp::Tensor(), 0.5);
  bp::manual_seed(7);
  bp::Tensor b = F::scaled_dot_product_attention(q, k, v, bp::Tensor(), 0.5);
  EXPECT_EQ(max_rel_diff(a, b), 0.0) << "one seed, one mask";
  // With v = 1 each output is the sum of the kept weights times 2: its mean over many rows is
  // near 1 and no output exceeds 2.
  std::vector<double> av = a.to_vector<double>();
  double mean = 0;
  for (double x : av) {
    EXPECT_LE(x, 2.0 + 1e-12);
    mean += x / static_cast<double>(av.size());
  }
  EXPECT_NEAR(mean, 1.0, 0.25);
  EXPECT_THROW(F::scaled_dot_product_attention(q, k, v, bp::Tensor(), 1.0), bp::Error);
}

TEST(Transformer, AttentionRefusesMismatchedHeadsSequencesAndSizes) {
  auto q = [](const bp::Shape& s) { return bp::zeros(s, cpu()); };
  expect_refused<bp::ShapeError>(
      [&] {
        F::scaled_dot_product_attention(q({2, 4, 8, 16}), q({2, 3, 8, 16}), q({2, 3, 8, 16}));
      },
      {"query [2x4x8x16]", "key [2x3x8x16]", "value [2x3x8x16]", "dimension 1"});
  expect_refused<bp::ShapeError>(
      [&] {
        F::scaled_dot_product_attention(q({2, 4, 8, 16}), q({2, 4, 8, 12}), q({2, 4, 8, 16}));
      },
      {"query [2x4x8x16]", "key [2x4x8x12]", "value [2x4x8x16]", "head size 12"});
  expect_refused<bp::ShapeError>(
      [&] {
        F::scaled_dot_product_attention(q({2, 4, 8, 16}), q({2, 4, 9, 16}), q({2, 4, 7, 16}));
      },
      {"query [2x4x8x16]", "key [2x4x9x16]", "value [2x4x7x16]", "sequence length 7"});
  expect_refused<bp::ShapeError>(
      [&] {
        F::scaled_dot_product_attention(q({8, 16}), q({2, 8, 16}), q({2, 8, 16}));
      },
      {"query [8x16]", "same rank"});
}

TEST(Transformer, EmbeddingGathersRowsAndSumsRepeatedGradients) {
  bp::Tensor w = random({7, 5});
  std::vector<int64_t> ids = {3, 0, 3, 6, 3, 1};
  bp::Tensor idx = bp::from_vector(ids, {2, 3}, cpu());
  bp::Tensor wl = w.detach().clone().requires_grad_(true);
  bp::Tensor out = F::embedding(idx, wl);
  ASSERT_EQ(out.shape(), (bp::Shape{2, 3, 5}));
  std::vector<double> o = out.to_vector<double>(), wv = w.to_vector<double>();
  for (size_t m = 0; m < ids.size(); ++m)
    for (size_t j = 0; j < 5; ++j) EXPECT_EQ(o[m * 5 + j], wv[static_cast<size_t>(ids[m]) * 5 + j]);
  bp::Tensor probe = random({2, 3, 5});
  (out * probe).sum().backward();
  std::vector<double> g = wl.grad().to_vector<double>(), pv = probe.to_vector<double>();
  for (size_t row = 0; row < 7; ++row)
    for (size_t j = 0; j < 5; ++j) {
      double ref = 0;
      for (size_t m = 0; m < ids.size(); ++m)
        if (static_cast<size_t>(ids[m]) == row) ref += pv[m * 5 + j];
      EXPECT_NEAR(g[row * 5 + j], ref, 1e-15) << "row " << row;
    }
}

TEST(Transformer, EmbeddingRefusals) {
  bp::Tensor w = bp::zeros({13, 4}, cpu());
  expect_refused<bp::IndexError>(
      [&] {
        F::embedding(bp::from_vector(std::vector<int64_t>{1, 13, 2}, {3}, cpu()), w);
      },
      {"index 13", "13 rows"});
  expect_refused<bp::IndexError>(
      [&] { F::embedding(bp::from_vector(std::vector<int64_t>{-1}, {1}, cpu()), w); },
      {"index -1", "13 rows"});
  expect_refused<bp::DTypeError>([&] { F::embedding(bp::zeros({3}, cpu(), bp::DType::i32), w); },
                                 {"indices must be int64"});
  expect_refused<bp::ShapeError>(
      [&] { F::embedding(bp::zeros({3}, cpu(), bp::DType::i64), bp::zeros({13}, cpu())); },
      {"[num_embeddings, embedding_dim]"});
}

TEST(Transformer, TriangleCumsumMaskedFillAndTrig) {
  bp::Tensor x = random({2, 4, 6});
  std::vector<double> xv = x.to_vector<double>();
  std::vector<double> up = bp::triu(x, 1).to_vector<double>(),
                      lo = bp::tril(x, -1).to_vector<double>();
  std::vector<double> cs = bp::cumsum(x, 1).to_vector<double>();
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t c = 0; c < 6; ++c) {
        const size_t i = static_cast<size_t>((b * 4 + r) * 6 + c);
        EXPECT_EQ(up[i], c - r >= 1 ? xv[i] : 0.0);
        EXPECT_EQ(lo[i], c - r <= -1 ? xv[i] : 0.0);
        double s = 0;
        for (int64_t k = 0; k <= r; ++k) s += xv[static_cast<size_t>((b * 4 + k) * 6 + c)];
        EXPECT_NEAR(cs[i], s, 1e-14);
      }
  // cumsum's gradient is the suffix sum of the incoming gradient.
  bp::Tensor xl = x.detach().clone().requires_grad_(true);
  bp::cumsum(xl, 2).sum().backward();
  std::vector<double> g = xl.grad().to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], static_cast<double>(6 - i % 6), 1e-12);
  bp::Tensor mask = bp::gt(x, 0.0);
  std::vector<double> mf = bp::masked_fill(x, mask, -5.0).to_vector<double>();
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_EQ(mf[i], xv[i] > 0 ? -5.0 : xv[i]);
  EXPECT_THROW(bp::masked_fill(x, x, 1.0), bp::DTypeError);
  EXPECT_THROW(bp::triu(bp::zeros({4}, cpu())), bp::ShapeError);
  std::vector<double> s = bp::sin(x).to_vector<double>(), c = bp::cos(x).to_vector<double>();
  std::vector<double> r = bp::rsqrt(x.abs() + 0.5).to_vector<double>();
  for (size_t i = 0; i < xv.size(); ++i) {
    EXPECT_NEAR(s[i], std::sin(xv[i]), 1e-15);
    EXPECT_NEAR(c[i], std::cos(xv[i]), 1e-15);
    EXPECT_NEAR(r[i], 1 / std::sqrt(std::fabs(xv[i]) + 0.5), 1e-15);
  }
}

TEST(Transformer, LayersHaveTorchStateDictKeys) {
  bp::nn::MultiheadAttention mha(16, 4);
  std::vector<std::string> keys;
  for (const auto& [k, t] : mha.state_dict()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"in_proj_bias", "in_proj_weight", "out_proj.bias",
                                            "out_proj.weight"}));
  bp::nn::LayerNorm ln({8});
  EXPECT_EQ(ln.state_dict().count("weight"), 1u);
  EXPECT_EQ(ln.state_dict().count("bias"), 1u);
  bp::nn::Embedding emb(10, 3);
  EXPECT_EQ(emb.weight().shape(), (bp::Shape{10, 3}));
  // MultiheadAttention equals the functional composition of its own parameters.
  bp::Tensor x = bp::randn({5, 2, 16}, cpu());  // [L, N, E]
  bp::Tensor y = mha.forward(x);
  ASSERT_EQ(y.shape(), (bp::Shape{5, 2, 16}));
  bp::Tensor xb = x.transpose(0, 1);  // [N, L, E]
  bp::Tensor qkv = bp::linear(xb, mha.in_proj_weight(), mha.in_proj_bias());
  auto head = [&](int64_t p) {
    return qkv.slice(2, p * 16, (p + 1) * 16).reshape({2, 5, 4, 4}).transpose(1, 2);
  };
  bp::Tensor o = composite_attention(head(0), head(1), head(2), false);
  bp::Tensor ref = bp::linear(o.transpose(1, 2).reshape({2, 5, 16}), mha.out_proj().weight(),
                              mha.out_proj().bias())
                       .transpose(0, 1);
  EXPECT_LT(max_rel_diff(y, ref), 1e-5);
  EXPECT_THROW(bp::nn::MultiheadAttention(10, 3), bp::ShapeError);
}

TEST(Transformer, GptLearnsToCopyAPattern) {
  bp::nn::GPTConfig c;
  c.vocab_size = 11;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  bp::manual_seed(bp_test::test_seed("bp_nn_tests"));
  bp::nn::GPT gpt(c, cpu());
  std::vector<std::string> keys;
  for (const auto& [k, t] : gpt.state_dict()) keys.push_back(k);
  for (const char* k : {"transformer.wte.weight", "transformer.wpe.weight",
                        "transformer.h.0.ln_1.weight", "transformer.h.1.attn.c_attn.weight",
                        "transformer.h.1.attn.c_proj.bias", "transformer.h.0.mlp.c_fc.weight",
                        "transformer.h.0.mlp.c_proj.weight", "transformer.ln_f.bias"})
    EXPECT_NE(std::find(keys.begin(), keys.end(), k), keys.end()) << k;
  // A periodic sequence (period 5): after training the next token is predictable.
  std::vector<int64_t> xs, ys;
  for (int64_t b = 0; b < 8; ++b)
    for (int64_t t = 0; t < 16; ++t) {
      xs.push_back((b + t) % 5);
      ys.push_back((b + t + 1) % 5);
    }
  bp::Tensor x = bp::from_vector(xs, {8, 16}, cpu()), y = bp::from_vector(ys, {8, 16}, cpu());
  bp::optim::Adam opt(gpt.parameters(), {.lr = 3e-3});
  float first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    bp::Tensor loss = bp::nn::cross_entropy(gpt.forward(x).reshape({-1, 11}), y.reshape({-1}));
    if (step == 0) first = loss.item<float>();
    last = loss.item<float>();
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  EXPECT_GT(first, 1.5f) << "an untrained model is near uniform (log 11 = 2.4)";
  EXPECT_LT(last, 0.2f) << "first loss " << first;
  EXPECT_THROW(gpt.forward(bp::zeros({1, 17}, cpu(), bp::DType::i64)), bp::ShapeError);
}

// GPTConfig::gelu_approximate: "tanh" (GPT-2's MLP) runs the MLP through gelu(..., "tanh"), so the
// same weights give other logits than the exact form, by about the forms' difference; anything
// else is refused before a parameter is made.
TEST(Transformer, GptTakesTheTanhGeluOfGpt2) {
  bp::nn::GPTConfig c;
  c.vocab_size = 13;
  c.block_size = 8;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 16;
  const uint64_t seed = bp_test::test_seed("bp_nn_tests");
  bp::manual_seed(seed);
  bp::nn::GPT exact(c, cpu());
  c.gelu_approximate = "tanh";
  bp::manual_seed(seed);
  bp::nn::GPT gpt2(c, cpu());
  std::vector<int64_t> xs;
  for (int64_t i = 0; i < 16; ++i) xs.push_back((i * 7 + static_cast<int64_t>(seed % 13)) % 13);
  bp::Tensor x = bp::from_vector(xs, {2, 8}, cpu());
  bp::NoGradGuard no_grad;
  const std::vector<double> a = exact.forward(x).to_vector<double>();
  const std::vector<double> b = gpt2.forward(x).to_vector<double>();
  ASSERT_EQ(a.size(), 2u * 8u * 13u);
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  EXPECT_GT(worst, 0.0) << "the tanh form must change the logits";
  EXPECT_LT(worst, 1e-2) << "the two forms differ by < 1e-3 per GELU";
  c.gelu_approximate = "erf";
  const std::string msg = bp_test::expect_throw<bp::Error>([&] { bp::nn::GPT bad(c, cpu()); });
  EXPECT_NE(msg.find("gelu_approximate must be \"none\" or \"tanh\", got \"erf\""),
            std::string::npos)
      << msg;
}
