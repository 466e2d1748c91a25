// Mixed precision: torch.autocast's scope. Inside an enabled scope for a device type, the ops of
// the lower-precision list run in the scope's dtype (bf16 or f16) and those of the f32 list in
// f32, on tensors of a device of that type (Note [Autocast op lists]). Thread-local, as in
// PyTorch: a scope affects only the thread that opened it.
//
// Note [Autocast op lists]
//   Modelled on PyTorch's CUDA autocast lists (aten/src/ATen/autocast_mode.cpp), restricted to the
//   ops Backplane has:
//     lower precision (floating operands of f32, f16 and bf16 cast to the scope's dtype):
//       matmul (and Tensor::matmul, hence bmm-like batched products), linear, conv2d (forward;
//       its backward follows the forward's dtype), scaled_dot_product_attention, and through
//       them nn::Linear, nn::Conv2d, nn::MultiheadAttention and the GPT blocks;
//     f32 (f16 and bf16 operands cast to f32): exp, log, rsqrt, pow, sum, cumsum, norm, sumsq,
//       softmax, log_softmax, layer_norm, mse_loss, cross_entropy (where the device has the
//       fused op, f16/bf16 logits are read as they are and the loss is f32: the same result
//       without the cast);
//     promote (run in the widest floating dtype of the operands, as outside autocast): the
//       binary elementwise ops, where, cat and stack.
//   Every other op runs in its input's dtype; batch_norm among them, as in PyTorch (its
//   statistics, weight and bias are f32 for f16/bf16 inputs anyway, so a bf16 activation is
//   normalised without a cast and stays bf16). f64 operands are never cast. A cast is an ordinary
//   differentiable op, so gradients flow back through it and arrive in each leaf's own dtype
//   (an f32 parameter gets an f32 gradient). Backward passes run with autocast off: their ops
//   follow the dtypes the forward pass recorded.
//
// Note [Autocast weight cache]
//   As PyTorch's, the f32 -> lower-precision cast of a leaf that requires grad (a parameter) is
//   made once per outermost enabled scope and reused by every op of that scope (a weight used by
//   several layers, or by a tied output head, is cast once), when gradient recording is on. The
//   cache is dropped when the outermost scope closes. So a parameter changed inside a scope (an
//   optimiser step) is not seen by later ops of that same scope: close the scope after the
//   forward pass and the loss, as PyTorch recommends.
#pragma once

#include <backplane/dtype.hpp>
#include <backplane/export.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace bp {

// The autocast dtypes a device type accepts: those in which every device of the type runs the
// lower-precision list natively (bf16 and f16 on cpu, cuda and opencl). Empty when the type has
// no device; DeviceError for a device string ("cuda:0"). Loads the type's plugin.
BP_API std::vector<DType> autocast_supported_dtypes(std::string_view device_type);

// An autocast scope for one device type ("cpu", "cuda", "opencl"), as torch.autocast: RAII,
// nestable; a nested scope with enabled = false turns autocast off inside an enabled region,
// one with another dtype changes it, and the previous state comes back when it closes. The
// dtype defaults to f16 on cuda and bf16 elsewhere (PyTorch's defaults). Not copyable; must be
// destroyed on the thread that made it, in reverse order of creation.
//
// Throws DeviceError when `device_type` is a device ("cuda:0") rather than a type, or when no
// device of the type exists (naming the types that do), and,
// when enabled, DTypeError when `dtype` is not f16 or bf16, or when a device of the type cannot
// run the lower-precision list in it (naming the device and the dtypes it supports): never a
// silent f32 run.
class BP_API AutocastGuard {
 public:
  explicit AutocastGuard(std::string_view device_type, std::optional<DType> dtype = std::nullopt,
                         bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  std::string type_;
  bool had_entry_;
  bool prev_enabled_;
  DType prev_dtype_;
};

// bp::autocast scope("cuda", DType::bf16); reads as torch.autocast.
using autocast = AutocastGuard;

// Whether autocast is on for `device_type` on this thread.
BP_API bool is_autocast_enabled(std::string_view device_type);
// The dtype autocast uses for `device_type` on this thread (the default when no scope set one).
BP_API DType get_autocast_dtype(std::string_view device_type);
// Drops this thread's cached parameter casts (Note [Autocast weight cache]); closing the
// outermost scope does this.
BP_API void clear_autocast_cache();

}  // namespace bp
