// bp::nn layers of transformers: LayerNorm, Embedding, GELU and MultiheadAttention with
// torch.nn's names, argument order, initialisation and state_dict keys (Note [Module state] in
// nn.hpp), and a GPT model (token and position embeddings, pre-norm blocks, an output head tied
// to the token embedding) whose keys are those of nanoGPT's model.py, so its PyTorch checkpoints
// load as they are.
//
// Constructors check their arguments (ShapeError naming the layer and the rule); forward()
// checks its input as bp::nn::functional does (Note [Transformer checks] in nn_functional.hpp).
#pragma once

#include <backplane/nn.hpp>
#include <backplane/nn_conv.hpp>
#include <backplane/nn_functional.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace bp::nn {

// torch.nn.LayerNorm: normalises over the trailing normalized_shape with weight (ones) and bias
// (zeros) when elementwise_affine (bias only when `bias`).
class BP_API LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true,
                     bool bias = true);
  LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine, bool bias, Device& device,
            DType dtype = DType::f32);

  const Tensor& weight() const;  // undefined without elementwise_affine
  const Tensor& bias() const;    // undefined without elementwise_affine or bias
  Tensor forward(const Tensor& input) override;
  std::string name() const override;

 private:
  Shape shape_;
  double eps_;
  bool affine_, has_bias_;
  size_t weight_slot_ = 0, bias_slot_ = 0;
};

// torch.nn.Embedding: weight [num_embeddings, embedding_dim] drawn from N(0, 1) (the default
// Philox generator); forward maps int64 indices of any shape to [*shape, embedding_dim].
class BP_API Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  Embedding(int64_t num_embeddings, int64_t embedding_dim, Device& device,
            DType dtype = DType::f32);

  const Tensor& weight() const { return slot(weight_slot_); }
  int64_t num_embeddings() const noexcept { return num_; }
  int64_t embedding_dim() const noexcept { return dim_; }
  Tensor forward(const Tensor& input) override;
  std::string name() const override;

 private:
  int64_t num_, dim_;
  size_t weight_slot_ = 0;
};

// torch.nn.GELU(approximate="none" | "tanh").
class BP_API GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none");
  Tensor forward(const Tensor& input) override;
  std::string name() const override;

 private:
  std::string approximate_;
};

// torch.nn.MultiheadAttention(embed_dim, num_heads, dropout, bias, ..., batch_first): one
// packed input projection in_proj_weight [3 E, E] (Xavier-uniform) and in_proj_bias [3 E]
// (zeros), and the child out_proj (a Linear E -> E, bias zero): PyTorch's state_dict keys.
// Inputs are [L, N, E] ([N, L, E] with batch_first) or unbatched [L, E]. The attention runs
// through scaled_dot_product_attention (dropout only in training). Key and value dimensions
// other than embed_dim, add_bias_kv and add_zero_attn are not supported.
class BP_API MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0.0, bool bias = true,
                     bool batch_first = false);
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout, bool bias,
                     bool batch_first, Device& device, DType dtype = DType::f32);

  // Attention of query over key and value (need_weights=False in PyTorch's terms: only the
  // output). attn_mask as scaled_dot_product_attention's ([L, S] or [N * num_heads, L, S]; bool
  // true keeps), is_causal masks later keys.
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value,
                 const Tensor& attn_mask = Tensor(), bool is_causal = false);
  // Self-attention: forward(x, x, x).
  Tensor forward(const Tensor& input) override { return forward(input, input, input); }
  std::string name() const override;

  const Tensor& in_proj_weight() const { return slot(in_w_slot_); }
  const Tensor& in_proj_bias() const;
  Linear& out_proj() const { return *out_proj_; }

 private:
  int64_t embed_dim_, num_heads_;
  double dropout_;
  bool has_bias_, batch_first_;
  size_t in_w_slot_ = 0, in_b_slot_ = 0;
  Linear* out_proj_ = nullptr;
};

// The GPT of nanoGPT (Karpathy's model.py): GPT-2's architecture with an optional bias.
// nanoGPT's MLP uses the exact GELU; GPT-2 itself (OpenAI's and Hugging Face's "gelu_new") the
// tanh form: gelu_approximate = "tanh" with vocab_size 50257 is GPT-2 exactly.
struct GPTConfig {
  int64_t block_size = 1024;  // the longest sequence (position embeddings)
  int64_t vocab_size = 50304;
  int64_t n_layer = 12, n_head = 12, n_embd = 768;
  double dropout = 0.0;
  bool bias = true;                       // biases in the Linears and LayerNorms
  std::string gelu_approximate = "none";  // the MLP's GELU: "none" (exact) or "tanh"
};

// A decoder-only transformer: logits [B, T, vocab_size] for int64 tokens [B, T] (T <=
// block_size). state_dict keys: transformer.wte.weight, transformer.wpe.weight,
// transformer.h.<i>.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}.{weight, bias},
// transformer.ln_f.{weight, bias}; the output head is tied to transformer.wte.weight (nanoGPT's
// lm_head.weight is the same tensor, so a checkpoint's copy of it is redundant: load with
// strict=false or drop the key). Initialisation as nanoGPT: N(0, 0.02) for the Linears and
// embeddings, 0.02 / sqrt(2 n_layer) for the residual projections, zero biases.
class BP_API GPT : public Module {
 public:
  explicit GPT(const GPTConfig& config);
  GPT(const GPTConfig& config, Device& device, DType dtype = DType::f32);

  Tensor forward(const Tensor& tokens) override;
  std::string name() const override;
  const GPTConfig& config() const noexcept { return config_; }
  // Parameters without the position embedding (nanoGPT's get_num_params()).
  int64_t num_params() const;

 private:
  GPTConfig config_;
  Module* transformer_ = nullptr;
};

}  // namespace bp::nn
