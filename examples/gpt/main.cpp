// A character-level GPT (nanoGPT's model, bp::nn::GPT) trained on the GNU licence texts every
// Debian machine has under /usr/share/common-licenses:
//
//   example-gpt [--data DIR] [--device cpu:0] [--layers 6] [--heads 6] [--width 384]
//               [--context 256] [--batch 64] [--steps 5000] [--lr 1e-3] [--dropout 0.2]
//               [--seed 0] [--eval-every 250] [--max-loss X] [--sample 0] [--autocast bf16]
//
// The files of DIR (regular files, in name order) are read as bytes; the vocabulary is the set
// of bytes that occur. 90% of the text trains, 10% validates. Each step draws `batch` windows of
// `context` + 1 bytes (a std::mt19937_64 seeded with --seed, so a run is repeatable and the same
// on every device) and takes one Adam step on the mean cross-entropy of the next byte. Every
// --eval-every steps it prints the training loss (mean of the steps since the last report) and
// the validation loss (the mean over 8 fixed batches, in evaluation mode) as JSON lines; at the
// end it prints --sample bytes sampled from a newline (temperature 0.8, seeded by --seed). Exits 1
// when the last validation loss is above --max-loss (the CI test runs a small configuration so).
// --autocast bf16 (or f16) runs the forward pass and the loss under bp::autocast on the device's
// type (matmuls and attention in that dtype, the loss in f32); f16 adds a bp::amp::GradScaler.
#include <backplane/backplane.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

std::string read_corpus(const std::string& dir) {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (text.size() < 1024)
    throw bp::IOError("example-gpt: " + dir + " holds " + std::to_string(text.size()) +
                      " bytes of text; at least 1024 are needed");
  return text;
}

struct Data {
  std::vector<int64_t> train, val;
  std::vector<unsigned char> itos;  // token -> byte
};

Data encode(const std::string& text) {
  int64_t stoi[256];
  std::fill(std::begin(stoi), std::end(stoi), -1);
  Data d;
  for (unsigned char c : text) stoi[c] = 0;
  for (int c = 0; c < 256; ++c)
    if (stoi[c] == 0) {
      stoi[c] = static_cast<int64_t>(d.itos.size());
      d.itos.push_back(static_cast<unsigned char>(c));
    }
  const size_t cut = text.size() * 9 / 10;
  for (size_t i = 0; i < text.size(); ++i)
    (i < cut ? d.train : d.val).push_back(stoi[static_cast<unsigned char>(text[i])]);
  return d;
}

// `batch` windows at random offsets: inputs [B, T] and targets [B, T] (shifted by one).
std::pair<bp::Tensor, bp::Tensor> draw(const std::vector<int64_t>& tokens, int64_t B, int64_t T,
                                       std::mt19937_64& rng, bp::Device& dev) {
  std::uniform_int_distribution<size_t> at(0, tokens.size() - static_cast<size_t>(T) - 2);
  std::vector<int64_t> x, y;
  for (int64_t b = 0; b < B; ++b) {
    const size_t o = at(rng);
    x.insert(x.end(), tokens.begin() + static_cast<ptrdiff_t>(o),
             tokens.begin() + static_cast<ptrdiff_t>(o) + T);
    y.insert(y.end(), tokens.begin() + static_cast<ptrdiff_t>(o) + 1,
             tokens.begin() + static_cast<ptrdiff_t>(o) + 1 + T);
  }
  return {bp::from_vector(x, {B, T}, dev), bp::from_vector(y, {B, T}, dev)};
}

bp::Tensor loss_of(bp::nn::GPT& model, const bp::Tensor& x, const bp::Tensor& y,
                   std::optional<bp::DType> amp) {
  std::optional<bp::autocast> scope;
  if (amp) scope.emplace(x.device().type(), *amp);
  bp::Tensor logits = model.forward(x);
  const int64_t V = logits.size(2);
  return bp::nn::cross_entropy(logits.reshape({-1, V}), y.reshape({-1}));
}

}  // namespace

int main(int argc, char** argv) try {
  std::string data = "/usr/share/common-licenses", device = "cpu:0";
  bp::nn::GPTConfig cfg;
  cfg.n_layer = 6;
  cfg.n_head = 6;
  cfg.n_embd = 384;
  cfg.block_size = 256;
  cfg.dropout = 0.2;
  int64_t batch = 64, steps = 5000, eval_every = 250, sample = 0;
  double lr = 1e-3, max_loss = 1e30;
  uint64_t seed = 0;
  std::optional<bp::DType> amp;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw bp::Error("example-gpt: " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--data")
      data = value();
    else if (a == "--device")
      device = value();
    else if (a == "--layers")
      cfg.n_layer = std::stoll(value());
    else if (a == "--heads")
      cfg.n_head = std::stoll(value());
    else if (a == "--width")
      cfg.n_embd = std::stoll(value());
    else if (a == "--context")
      cfg.block_size = std::stoll(value());
    else if (a == "--batch")
      batch = std::stoll(value());
    else if (a == "--steps")
      steps = std::stoll(value());
    else if (a == "--lr")
      lr = std::stod(value());
    else if (a == "--dropout")
      cfg.dropout = std::stod(value());
    else if (a == "--seed")
      seed = std::stoull(value());
    else if (a == "--eval-every")
      eval_every = std::stoll(value());
    else if (a == "--max-loss")
      max_loss = std::stod(value());
    else if (a == "--sample")
      sample = std::stoll(value());
    else if (a == "--autocast")
      amp = bp::dtype_from_name(value());
    else
      throw bp::Error("example-gpt: unknown argument " + a);
  }
  const Data d = encode(read_corpus(data));
  cfg.vocab_size = static_cast<int64_t>(d.itos.size());
  bp::Device& dev = bp::device(device);
  bp::manual_seed(seed);
  bp::nn::GPT model(cfg, dev);
  std::printf(
      "{\"model\": \"%s\", \"params\": %lld, \"train_tokens\": %zu, \"val_tokens\": %zu, "
      "\"device\": \"%s\"}\n",
      model.name().c_str(), static_cast<long long>(model.num_params()), d.train.size(),
      d.val.size(), device.c_str());
  bp::optim::Adam opt(model.parameters(), {.lr = lr});
  bp::amp::GradScaler scaler({.enabled = amp == bp::DType::f16});
  std::mt19937_64 rng(seed);
  double since = 0, val = 0;
  int64_t n_since = 0;
  for (int64_t step = 1; step <= steps; ++step) {
    auto [x, y] = draw(d.train, batch, cfg.block_size, rng, dev);
    bp::Tensor loss = loss_of(model, x, y, amp);
    opt.zero_grad();
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    since += loss.item<float>();
    ++n_since;
    if (step % eval_every == 0 || step == steps) {
      bp::NoGradGuard no_grad;
      model.eval();
      std::mt19937_64 vrng(seed + 1);  // the same validation batches at every report
      val = 0;
      for (int k = 0; k < 8; ++k) {
        auto [vx, vy] = draw(d.val, batch, cfg.block_size, vrng, dev);
        val += loss_of(model, vx, vy, amp).item<float>() / 8;
      }
      model.train();
      std::printf("{\"step\": %lld, \"train_loss\": %.4f, \"val_loss\": %.4f}\n",
                  static_cast<long long>(step), since / static_cast<double>(n_since), val);
      std::fflush(stdout);
      since = 0;
      n_since = 0;
    }
  }
  if (sample > 0) {
    bp::NoGradGuard no_grad;
    model.eval();
    std::vector<int64_t> ctx = {0};
    std::mt19937_64 sample_rng(seed + 2);
    for (size_t t = 0; t < d.itos.size(); ++t)
      if (d.itos[t] == '\n') ctx[0] = static_cast<int64_t>(t);
    std::string out;
    for (int64_t s = 0; s < sample; ++s) {
      const int64_t T = std::min<int64_t>(static_cast<int64_t>(ctx.size()), cfg.block_size);
      std::vector<int64_t> window(ctx.end() - T, ctx.end());
      bp::Tensor logits = model.forward(bp::from_vector(window, {1, T}, dev));
      // nanoGPT's sampling: softmax of the last position's logits at temperature 0.8, one draw
      // (greedy decoding of a licence text repeats its indentation forever).
      std::vector<double> p = logits.select(1, T - 1).reshape({-1}).to_vector<double>();
      const double top = *std::max_element(p.begin(), p.end());
      for (double& v : p) v = std::exp((v - top) / 0.8);
      std::discrete_distribution<int64_t> pick(p.begin(), p.end());
      const int64_t next = pick(sample_rng);
      ctx.push_back(next);
      out.push_back(static_cast<char>(d.itos[static_cast<size_t>(next)]));
    }
    std::printf("--- sample ---\n%s\n", out.c_str());
  }
  if (!(val <= max_loss)) {
    std::fprintf(stderr, "example-gpt: validation loss %.4f is above --max-loss %.4f\n", val,
                 max_loss);
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 2;
}
