// bp::nn layers of transformers (nn_transformer.hpp): LayerNorm, Embedding, GELU,
// MultiheadAttention and the GPT model.
#include <backplane/functions.hpp>
#include <backplane/nn_transformer.hpp>
#include <backplane/runtime.hpp>

#include <cmath>
#include <cstdio>

namespace bp::nn {

namespace F = functional;

namespace {

std::string shape_text(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) (r += i ? ", " : "") += std::to_string(s[i]);
  return r + "]";
}

void check_floating(const char* layer, DType dtype) {
  if (!is_floating(dtype))
    throw DTypeError(std::string(layer) + ": parameters need a floating dtype, got " +
                     std::string(dtype_name(dtype)));
}

Tensor normal(const Shape& shape, double std, Device& device, DType dtype) {
  NoGradGuard no_grad;
  return (randn(shape, device, DType::f32) * std).to(dtype);
}

}  // namespace

// ---- LayerNorm --------------------------------------------------------------------------------

LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine, bool bias)
    : LayerNorm(std::move(normalized_shape), eps, elementwise_affine, bias, default_device()) {}

LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine, bool bias,
                     Device& device, DType dtype)
    : shape_(std::move(normalized_shape)),
      eps_(eps),
      affine_(elementwise_affine),
      has_bias_(elementwise_affine && bias) {
  check_floating("LayerNorm", dtype);
  if (shape_.empty()) throw ShapeError("LayerNorm: normalized_shape needs one dimension or more");
  for (int64_t d : shape_)
    if (d < 1)
      throw ShapeError("LayerNorm: normalized_shape " + shape_text(shape_) +
                       " must have sizes >= 1");
  if (!(eps > 0)) throw ShapeError("LayerNorm: eps must be > 0, got " + std::to_string(eps));
  if (affine_) weight_slot_ = register_parameter("weight", ones(shape_, device, dtype));
  if (has_bias_) bias_slot_ = register_parameter("bias", zeros(shape_, device, dtype));
}

const Tensor& LayerNorm::weight() const {
  static const Tensor none;
  return affine_ ? slot(weight_slot_) : none;
}
const Tensor& LayerNorm::bias() const {
  static const Tensor none;
  return has_bias_ ? slot(bias_slot_) : none;
}

Tensor LayerNorm::forward(const Tensor& x) {
  return F::layer_norm(x, shape_, weight(), bias(), eps_);
}

std::string LayerNorm::name() const {
  char buf[64];
  std::snprintf(buf, sizeof buf, ", eps=%g, elementwise_affine=%s)", eps_,
                affine_ ? "True" : "False");
  std::string s = "LayerNorm(";
  s += shape_.size() == 1 ? "(" + std::to_string(shape_[0]) + ",)" : shape_text(shape_);
  return s + buf;
}

// ---- Embedding --------------------------------------------------------------------------------

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim)
    : Embedding(num_embeddings, embedding_dim, default_device()) {}

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, Device& device, DType dtype)
    : num_(num_embeddings), dim_(embedding_dim) {
  check_floating("Embedding", dtype);
  if (num_embeddings < 0 || embedding_dim < 0)
    throw ShapeError("Embedding: sizes must be non-negative, got num_embeddings=" +
                     std::to_string(num_embeddings) +
                     ", embedding_dim=" + std::to_string(embedding_dim));
  weight_slot_ = register_parameter("weight", normal({num_, dim_}, 1.0, device, dtype));
}

Tensor Embedding::forward(const Tensor& x) {
  return F::embedding(x, weight());
}

std::string Embedding::name() const {
  return "Embedding(" + std::to_string(num_) + ", " + std::to_string(dim_) + ")";
}

// ---- GELU -------------------------------------------------------------------------------------

GELU::GELU(std::string approximate) : approximate_(std::move(approximate)) {
  if (approximate_ != "none" && approximate_ != "tanh")
    throw Error("GELU: approximate must be \"none\" or \"tanh\", got \"" + approximate_ + "\"");
}

Tensor GELU::forward(const Tensor& x) {
  return F::gelu(x, approximate_);
}

std::string GELU::name() const {
  return approximate_ == "none" ? "GELU(approximate='none')" : "GELU(approximate='tanh')";
}

// ---- MultiheadAttention -----------------------------------------------------------------------

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout,
                                       bool bias, bool batch_first)
    : MultiheadAttention(embed_dim, num_heads, dropout, bias, batch_first, default_device()) {}

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout,
                                       bool bias, bool batch_first, Device& device, DType dtype)
    : embed_dim_(embed_dim),
      num_heads_(num_heads),
      dropout_(dropout),
      has_bias_(bias),
      batch_first_(batch_first) {
  check_floating("MultiheadAttention", dtype);
  if (embed_dim < 1 || num_heads < 1 || embed_dim % num_heads != 0)
    throw ShapeError("MultiheadAttention: embed_dim (" + std::to_string(embed_dim) +
                     ") must be a positive multiple of num_heads (" + std::to_string(num_heads) +
                     ")");
  if (!(dropout >= 0.0 && dropout < 1.0))
    throw Error("MultiheadAttention: dropout must be in [0, 1), got " + std::to_string(dropout));
  // xavier_uniform_ over [3 E, E]: bound sqrt(6 / (fan_in + fan_out)) = sqrt(6 / (4 E)).
  const double bound = std::sqrt(6.0 / static_cast<double>(4 * embed_dim));
  in_w_slot_ = register_parameter(
      "in_proj_weight", uniform({3 * embed_dim, embed_dim}, -bound, bound, device, dtype));
  if (bias) in_b_slot_ = register_parameter("in_proj_bias", zeros({3 * embed_dim}, device, dtype));
  out_proj_ = &register_module("out_proj",
                               std::make_shared<Linear>(embed_dim, embed_dim, bias, device, dtype));
  if (bias) {
    NoGradGuard no_grad;
    Tensor b = out_proj_->bias();
    b.copy_(zeros({embed_dim}, device, dtype));
  }
}

const Tensor& MultiheadAttention::in_proj_bias() const {
  static const Tensor none;
  return has_bias_ ? slot(in_b_slot_) : none;
}

Tensor MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const Tensor& attn_mask, bool is_causal) {
  const int r = query.rank();
  if ((r != 2 && r != 3) || key.rank() != r || value.rank() != r)
    throw ShapeError(
        "MultiheadAttention: query " + shape_text(query.shape()) + ", key " +
        shape_text(key.shape()) + " and value " + shape_text(value.shape()) +
        " must all be [L, N, E] (" +
        (batch_first_ ? "[N, L, E] with batch_first" : "or [N, L, E] with batch_first") +
        ") or unbatched [L, E]");
  const bool unbatched = r == 2;
  auto to_nle = [&](const Tensor& t) {
    if (unbatched) return t.unsqueeze(0);
    return batch_first_ ? t : t.transpose(0, 1);
  };
  Tensor q = to_nle(query), k = to_nle(key), v = to_nle(value);
  for (const Tensor* t : {&q, &k, &v})
    if (t->size(-1) != embed_dim_)
      throw ShapeError("MultiheadAttention: query " + shape_text(query.shape()) + ", key " +
                       shape_text(key.shape()) + " and value " + shape_text(value.shape()) +
                       " must end in embed_dim " + std::to_string(embed_dim_));
  const int64_t N = q.size(0), L = q.size(1), S = k.size(1), E = embed_dim_, H = num_heads_;
  const Tensor& w = in_proj_weight();
  const Tensor& b = in_proj_bias();
  auto proj = [&](const Tensor& x, int64_t part) {
    Tensor wp = w.slice(0, part * E, (part + 1) * E);
    Tensor bp = b.defined() ? b.slice(0, part * E, (part + 1) * E) : Tensor();
    return linear(x, wp, bp);
  };
  auto heads = [&](const Tensor& x, int64_t len) {
    return x.reshape({N, len, H, E / H}).transpose(1, 2);  // [N, H, len, E/H]
  };
  Tensor qh = heads(proj(q, 0), L), kh = heads(proj(k, 1), S), vh = heads(proj(v, 2), S);
  Tensor mask = attn_mask;
  if (mask.defined() && mask.rank() == 3) mask = mask.reshape({N, H, L, S});
  Tensor o =
      F::scaled_dot_product_attention(qh, kh, vh, mask, is_training() ? dropout_ : 0.0, is_causal);
  Tensor y = out_proj_->forward(o.transpose(1, 2).reshape({N, L, E}));
  if (unbatched) return y.squeeze(0);
  return batch_first_ ? y : y.transpose(0, 1);
}

std::string MultiheadAttention::name() const {
  return "MultiheadAttention(embed_dim=" + std::to_string(embed_dim_) +
         ", num_heads=" + std::to_string(num_heads_) + ")";
}

// ---- GPT --------------------------------------------------------------------------------------

namespace {

// A module that only holds children (nn.ModuleDict's role in nanoGPT).
class Holder : public Module {
 public:
  explicit Holder(std::string name) : name_(std::move(name)) {}
  template <typename M>
  M& add(const std::string& name, std::shared_ptr<M> m) {
    return register_module(name, std::move(m));
  }
  Tensor forward(const Tensor&) override {
    throw Error(name_ + " is not callable: its owner runs its children");
  }
  std::string name() const override { return name_; }

 private:
  std::string name_;
};

// Linear [in -> out] with nanoGPT's initialisation.
std::shared_ptr<Linear> gpt_linear(int64_t in, int64_t out, bool bias, double std, Device& device,
                                   DType dtype) {
  auto l = std::make_shared<Linear>(in, out, bias, device, dtype);
  NoGradGuard no_grad;
  Tensor w = l->weight();
  w.copy_(normal({out, in}, std, device, dtype));
  if (bias) {
    Tensor b = l->bias();
    b.copy_(zeros({out}, device, dtype));
  }
  return l;
}

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(const GPTConfig& c, Device& device, DType dtype) : c_(c) {
    c_attn_ =
        &register_module("c_attn", gpt_linear(c.n_embd, 3 * c.n_embd, c.bias, 0.02, device, dtype));
    c_proj_ = &register_module(
        "c_proj",
        gpt_linear(c.n_embd, c.n_embd, c.bias,
                   0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer)), device, dtype));
  }
  Tensor forward(const Tensor& x) override {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), H = c_.n_head;
    Tensor qkv = c_attn_->forward(x);  // [B, T, 3C]
    auto head = [&](int64_t part) {
      return qkv.slice(2, part * C, (part + 1) * C).reshape({B, T, H, C / H}).transpose(1, 2);
    };
    Tensor y = F::scaled_dot_product_attention(head(0), head(1), head(2), Tensor(),
                                               is_training() ? c_.dropout : 0.0, true);
    y = c_proj_->forward(y.transpose(1, 2).reshape({B, T, C}));
    return F::dropout(y, c_.dropout, is_training());
  }
  std::string name() const override { return "CausalSelfAttention"; }

 private:
  GPTConfig c_;
  Linear *c_attn_, *c_proj_;
};

class MLP : public Module {
 public:
  MLP(const GPTConfig& c, Device& device, DType dtype) : c_(c) {
    c_fc_ =
        &register_module("c_fc", gpt_linear(c.n_embd, 4 * c.n_embd, c.bias, 0.02, device, dtype));
    c_proj_ = &register_module(
        "c_proj",
        gpt_linear(4 * c.n_embd, c.n_embd, c.bias,
                   0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer)), device, dtype));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = F::gelu(c_fc_->forward(x), c_.gelu_approximate);
    return F::dropout(c_proj_->forward(h), c_.dropout, is_training());
  }
  std::string name() const override { return "MLP"; }

 private:
  GPTConfig c_;
  Linear *c_fc_, *c_proj_;
};

class Block : public Module {
 public:
  Block(const GPTConfig& c, Device& device, DType dtype) {
    ln_1_ = &register_module(
        "ln_1", std::make_shared<LayerNorm>(Shape{c.n_embd}, 1e-5, true, c.bias, device, dtype));
    attn_ = &register_module("attn", std::make_shared<CausalSelfAttention>(c, device, dtype));
    ln_2_ = &register_module(
        "ln_2", std::make_shared<LayerNorm>(Shape{c.n_embd}, 1e-5, true, c.bias, device, dtype));
    mlp_ = &register_module("mlp", std::make_shared<MLP>(c, device, dtype));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x + attn_->forward(ln_1_->forward(x));
    return h + mlp_->forward(ln_2_->forward(h));
  }
  std::string name() const override { return "Block"; }

 private:
  LayerNorm *ln_1_, *ln_2_;
  CausalSelfAttention* attn_;
  MLP* mlp_;
};

}  // namespace

GPT::GPT(const GPTConfig& config) : GPT(config, default_device()) {}

GPT::GPT(const GPTConfig& c, Device& device, DType dtype) : config_(c) {
  check_floating("GPT", dtype);
  if (c.vocab_size < 1 || c.block_size < 1 || c.n_layer < 0 || c.n_head < 1 || c.n_embd < 1 ||
      c.n_embd % c.n_head != 0)
    throw ShapeError(
        "GPT: vocab_size, block_size, n_head and n_embd must be >= 1, n_layer >= 0 "
        "and n_embd (" +
        std::to_string(c.n_embd) + ") a multiple of n_head (" + std::to_string(c.n_head) + ")");
  if (!(c.dropout >= 0.0 && c.dropout < 1.0))
    throw Error("GPT: dropout must be in [0, 1), got " + std::to_string(c.dropout));
  if (c.gelu_approximate != "none" && c.gelu_approximate != "tanh")
    throw Error("GPT: gelu_approximate must be \"none\" or \"tanh\", got \"" + c.gelu_approximate +
                "\"");
  auto body = std::make_shared<Holder>("transformer");
  auto wte = std::make_shared<Embedding>(c.vocab_size, c.n_embd, device, dtype);
  auto wpe = std::make_shared<Embedding>(c.block_size, c.n_embd, device, dtype);
  {
    NoGradGuard no_grad;
    Tensor a = wte->weight(), b = wpe->weight();
    a.copy_(normal({c.vocab_size, c.n_embd}, 0.02, device, dtype));
    b.copy_(normal({c.block_size, c.n_embd}, 0.02, device, dtype));
  }
  body->add("wte", wte);
  body->add("wpe", wpe);
  auto h = std::make_shared<ModuleList>();
  for (int64_t i = 0; i < c.n_layer; ++i) h->append(std::make_shared<Block>(c, device, dtype));
  body->add("h", h);
  body->add("ln_f",
            std::make_shared<LayerNorm>(Shape{c.n_embd}, 1e-5, true, c.bias, device, dtype));
  transformer_ = &register_module("transformer", body);
}

Tensor GPT::forward(const Tensor& tokens) {
  if (tokens.rank() != 2)
    throw ShapeError("GPT: tokens must be [B, T] int64, got [" + tokens.dims().str() + "]");
  const int64_t T = tokens.size(1);
  if (T > config_.block_size)
    throw ShapeError("GPT: sequence length " + std::to_string(T) + " exceeds block_size " +
                     std::to_string(config_.block_size));
  auto children = transformer_->named_children();  // wte, wpe, h, ln_f
  auto& wte = static_cast<Embedding&>(*children[0].second);
  auto& wpe = static_cast<Embedding&>(*children[1].second);
  auto& h = static_cast<ModuleList&>(*children[2].second);
  auto& ln_f = static_cast<LayerNorm&>(*children[3].second);
  Tensor pos = arange(T, tokens.device(), DType::i64);
  Tensor x = wte.forward(tokens) + wpe.forward(pos);
  x = F::dropout(x, config_.dropout, is_training());
  for (Module* block : h) x = block->forward(x);
  x = ln_f.forward(x);
  return linear(x, wte.weight());  // the head tied to the token embedding
}

std::string GPT::name() const {
  return "GPT(n_layer=" + std::to_string(config_.n_layer) +
         ", n_head=" + std::to_string(config_.n_head) +
         ", n_embd=" + std::to_string(config_.n_embd) +
         ", vocab_size=" + std::to_string(config_.vocab_size) +
         ", block_size=" + std::to_string(config_.block_size) + ")";
}

int64_t GPT::num_params() const {
  int64_t n = 0;
  for (const auto& [key, t] : named_parameters())
    if (key != "transformer.wpe.weight") n += t.numel();
  return n;
}

}  // namespace bp::nn
