// bp::Tensor: a strided view of device memory with a dtype, and the ops on it.
//
// Semantics (Note [Tensor semantics]):
//   - A tensor lives on exactly one device. Ops run on the device of their operands and leave
//     the result there; operands on different devices throw DeviceMismatch naming the op and
//     both devices. Data moves only when the user asks: copy_to (always a new buffer), to
//     (the same tensor when already there), cpu(), to_vector(), item().
//   - Ops are asynchronous: they queue work on the device's default stream and return.
//     Reading values on the host (to_vector, item, printing) waits for that work. With
//     BACKPLANE_SYNC_DEBUG=warn|error such implicit waits on a non-host device are reported.
//   - Tensors share storage: views (reshape of contiguous data, transpose, permute, slice,
//     expand, squeeze, unsqueeze) alias their base; copies never do.
//   - Binary ops broadcast with NumPy rules and promote dtypes as PyTorch does (Note [Type
//     promotion]); a C++ number operand takes the tensor's dtype.
//   - Tensor is a cheap handle (one shared_ptr): copying a Tensor aliases, like PyTorch.
//
// Note [Autograd]
//   Reverse-mode differentiation over the tensor ops. An op whose operands require gradients
//   (and that runs while grad_enabled()) records a Node holding what its derivative needs;
//   the output's grad_fn points at it. Leaves (tensors made by the user with
//   requires_grad_()) collect gradients through an AccumulateGrad node. backward() walks the
//   graph from the root in reverse topological order, summing gradients that meet, reducing
//   broadcast dimensions back to each input's shape, and runs with recording off (no
//   higher-order gradients). Gradients are computed with the same device ops, so they live
//   on the device of the tensors they belong to; to_device nodes move them back.
//
// Note [Type promotion]
//   Operands of different dtypes (+ - * / pow maximum minimum, comparisons, where) are cast to
//   result_type(a, b) first, PyTorch's rule: categories bool < integer < floating; within a
//   category the wider dtype (u8 with i32 gives i32; f16 with bf16 gives f32); a 0-d tensor
//   decides only when its category is above the other operand's (so f16 x + a 0-d f32 tensor
//   stays f16, i64 x + a 0-d f64 tensor is f64). True division of integer or bool tensors, and
//   exp log sqrt sigmoid tanh of them, give the default floating dtype, f32; so does pow with
//   a fractional exponent, while a whole non-negative one keeps the integer dtype. Sums of bool
//   and integer tensors are int64. matmul and the in-place updates do not promote (DTypeError).
//
// Thread-safety: a Tensor handle may be used from several threads for reading; ops on
// tensors of one device may run from several threads at once and are queued on its default
// stream in call order (device.hpp): an op that returned before another began runs first.
#pragma once

#include <backplane/device.hpp>
#include <backplane/dtype.hpp>
#include <backplane/errors.hpp>
#include <backplane/export.hpp>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace bp {

using Shape = std::vector<int64_t>;

namespace autograd {
struct Node;
struct Meta;
}  // namespace autograd
namespace detail {
struct TensorImpl;  // storage and geometry; libbackplane's own
struct TensorAccess;
}  // namespace detail

// The most dimensions a tensor has (the plugin ABI's BP_MAX_RANK).
inline constexpr int kMaxRank = 8;

// Fixed-capacity dims stored inline (no heap allocation on the per-op path).
struct BP_API Dims {
  int32_t rank = 0;
  int64_t d[kMaxRank] = {};
  Dims() = default;
  Dims(std::initializer_list<int64_t> l);
  explicit Dims(std::span<const int64_t> s);
  int64_t operator[](int i) const { return d[i]; }
  int64_t& operator[](int i) { return d[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= d[i];
    return n;
  }
  Shape vec() const { return Shape(d, d + rank); }
  bool operator==(const Dims& o) const;
  std::string str() const;  // "2x3", "scalar"
};

class Tensor;

// PyTorch's promotion of two dtypes: the higher category (bool < integer < floating), within
// one the wider; f16 with bf16 gives f32. Note [Type promotion].
BP_API DType promote_types(DType a, DType b);
// The dtype an elementwise op of `a` and `b` computes in (Note [Type promotion]).
BP_API DType result_type(const Tensor& a, const Tensor& b);

class BP_API Tensor {
 public:
  Tensor() = default;  // an undefined tensor; defined() is false

  bool defined() const noexcept { return impl_ != nullptr; }
  Device& device() const;
  DType dtype() const;
  int rank() const;
  Shape shape() const;
  int64_t size(int axis) const;  // negative axis counts from the end
  Shape strides() const;         // in elements
  // shape() and strides() without a heap allocation (valid while the tensor lives).
  const Dims& dims() const;
  const Dims& stride_dims() const;
  int64_t numel() const;
  int64_t offset() const;  // in elements into the storage
  bool is_contiguous() const;
  // True when both handles are the very same tensor (Python's `is`).
  bool is_same(const Tensor& other) const noexcept { return impl_ == other.impl_; }
  // True when both share storage.
  bool shares_storage(const Tensor& other) const;
  // The buffer the tensor views (null for some zero-element tensors); offset() and the
  // strides say where in it the elements are.
  const std::shared_ptr<Buffer>& storage() const;

  // ---- native handles (plugin ABI 1.2) ----
  // Where the view's first element lives: its native address (host address on cpu, device
  // pointer on cuda), the vendor's device ordinal and the DLPack device type. The tensor's
  // strides (in elements) and dtype describe the rest. No synchronisation: work queued on the
  // device's default stream may still be writing there. Throws UnsupportedError naming the
  // device and the reason on a backend without addressable memory (opencl).
  NativeBuffer native() const;
  // native().address.
  void* data_ptr() const;

  // ---- moving between devices and dtypes ----
  Tensor copy_to(Device& d) const;  // always a new tensor, even on the same device
  Tensor to(Device& d) const;       // *this when already on d
  Tensor to(DType t) const;         // *this when already t
  Tensor cpu() const { return to(cpu_device()); }
  Tensor clone() const { return copy_to(device()); }
  // Host copy of the values in row-major order, converted to T. Synchronises.
  template <typename T>
  std::vector<T> to_vector() const;
  // The single value of a one-element tensor. Synchronises.
  template <typename T>
  T item() const;

  // Replaces this tensor's storage, device, dtype and geometry with `src`'s, in place (PyTorch's
  // `t.data = src`): every handle of this tensor (an optimiser's, a module's) sees the new data;
  // requires_grad, hooks and the autograd identity stay. The gradient is dropped when the
  // device or dtype changes (move it with set_grad). Not recorded by autograd; must not race
  // with other uses of this tensor. Error for an undefined `src`.
  Tensor& set_data(const Tensor& src);

  // ---- views ----
  Tensor reshape(const Shape& shape) const;  // view when possible, else a copy; -1 infers
  Tensor view(const Shape& shape) const;     // ShapeError unless a view is possible
  Tensor transpose(int a, int b) const;
  Tensor t() const { return transpose(-2, -1); }
  Tensor permute(const Shape& order) const;
  Tensor slice(int axis, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int axis, int64_t index) const;  // removes the axis
  Tensor squeeze(int axis) const;
  Tensor unsqueeze(int axis) const;
  Tensor expand(const Shape& shape) const;  // broadcast view, stride 0
  Tensor flatten() const { return reshape({-1}); }
  Tensor contiguous() const;  // *this when already contiguous

  // ---- math (results on this tensor's device) ----
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor abs() const;
  Tensor relu() const;
  Tensor sigmoid() const;
  Tensor tanh() const;
  Tensor pow(double exponent) const;
  Tensor pow(const Tensor& exponent) const;
  Tensor sum() const;
  Tensor sum(int axis, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(int axis, bool keepdim = false) const;
  Tensor max() const;
  Tensor max(int axis, bool keepdim = false) const;
  // The 2-norm (Frobenius norm) and the sum of squares, over everything (0-d result) or one
  // axis; one pass over the data where the device has the fused op (Note [One-pass norms]).
  Tensor norm() const;
  Tensor norm(int axis, bool keepdim = false) const;
  Tensor sumsq() const;
  Tensor sumsq(int axis, bool keepdim = false) const;
  Tensor matmul(const Tensor& other) const;

  // In-place updates (used by optimisers): this = this op other, on this tensor's memory.
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& mul_(double factor);
  Tensor& copy_(const Tensor& src);  // same shape (or broadcastable), any device
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }

  // ---- autograd (Note [Autograd]) ----
  bool requires_grad() const;
  Tensor& requires_grad_(bool on = true);
  Tensor grad() const;  // undefined until backward() reaches this leaf
  void set_grad(const Tensor& g);
  void zero_grad();  // drops the gradient
  // Back-propagates from this scalar (or with an explicit seed gradient of this shape).
  void backward(const Tensor& seed = Tensor()) const;
  Tensor detach() const;  // same storage, no history
  // Calls hook(leaf) each time backward() has finished accumulating the gradient of this leaf
  // (like PyTorch's register_post_accumulate_grad_hook): the gradient is final for that
  // backward pass and hooks may read it or replace it with set_grad. Hooks run on the thread
  // running backward(), with gradient recording off, in registration order. Returns an id for
  // remove_post_accumulate_grad_hook. Error for a tensor that does not require grad or is not a
  // leaf (it has a grad_fn).
  int64_t register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const;
  void remove_post_accumulate_grad_hook(int64_t id) const;
  const std::shared_ptr<autograd::Node>& grad_fn() const;

  static Device& cpu_device();

 private:
  friend struct detail::TensorAccess;
  explicit Tensor(std::shared_ptr<detail::TensorImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<detail::TensorImpl> impl_;
};

// ---- creation ------------------------------------------------------------------------------
// Without a device argument, tensors go to default_device().
BP_API Tensor tensor(std::initializer_list<float> values);
BP_API Tensor tensor(std::initializer_list<float> values, Device& device);
BP_API Tensor tensor(std::initializer_list<std::initializer_list<float>> rows);
BP_API Tensor tensor(std::initializer_list<std::initializer_list<float>> rows, Device& device);
// Copies host data of dtype_of<T> with the given shape (numel must match).
template <typename T>
BP_API Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device& device);
template <typename T>
BP_API Tensor from_vector(const std::vector<T>& values, const Shape& shape);
// From raw host bytes of `dtype` (size must be numel * dtype_size).
BP_API Tensor from_bytes(const void* data, size_t nbytes, const Shape& shape, DType dtype,
                         Device& device);
// A tensor over memory someone else owns, without copying (Device::import_buffer): `address`
// is the first element (a host address for cpu, a device pointer for cuda), `strides` are in
// elements, non-negative, one per dimension (empty: row-major contiguous). The tensor and
// every view of it alias that memory; `release` runs once, after the last of them is gone
// and the device's queued work is done with it. The memory must hold every element the shape
// and strides reach and be aligned to the dtype's size. Throws ShapeError (rank, negative
// sizes or strides, an extent that overflows), DTypeError (an invalid dtype, a misaligned
// address), DeviceError (a NULL address for a non-empty tensor, memory of another device) and
// UnsupportedError (a backend that cannot import memory, with the reason); when it throws,
// release is not called.
// The shape and strides are read, not kept (no allocation of its own for them: a caller that
// imports often may pass reused vectors).
BP_API Tensor from_blob(Device& dev, void* address, const Shape& shape, const Shape& strides,
                        DType dtype, std::function<void()> release = {});
// The same with a C release function (Device::import_buffer's ReleaseFn form): `release`
// (may be NULL) runs once as `release(release_ctx)` and must not throw; nothing is allocated
// for it. The form for importers that wrap memory often (DLPack).
BP_API Tensor from_blob(Device& dev, void* address, const Shape& shape, const Shape& strides,
                        DType dtype, Device::ReleaseFn release, void* release_ctx);

BP_API Tensor empty(const Shape& shape, Device& device, DType dtype = DType::f32);
BP_API Tensor empty(const Shape& shape, DType dtype = DType::f32);
BP_API Tensor zeros(const Shape& shape, Device& device, DType dtype = DType::f32);
BP_API Tensor zeros(const Shape& shape, DType dtype = DType::f32);
BP_API Tensor ones(const Shape& shape, Device& device, DType dtype = DType::f32);
BP_API Tensor ones(const Shape& shape, DType dtype = DType::f32);
BP_API Tensor full(const Shape& shape, double value, Device& device, DType dtype = DType::f32);
BP_API Tensor full(const Shape& shape, double value, DType dtype = DType::f32);
BP_API Tensor zeros_like(const Tensor& t);
BP_API Tensor ones_like(const Tensor& t);
// 0, 1, ..., n-1 (as floats for floating dtypes).
BP_API Tensor arange(int64_t n, Device& device, DType dtype = DType::f32);
BP_API Tensor arange(int64_t n, DType dtype = DType::f32);

// Random numbers from the counter-based Philox generator (Note [Philox stream]): one
// (seed, offset) gives the same values on every device. The global generator starts at seed
// 0x5eed; manual_seed resets it. Each draw advances its offset.
BP_API void manual_seed(uint64_t seed);
class BP_API Generator {
 public:
  explicit Generator(uint64_t seed = 0x5eed, uint64_t offset = 0) : seed_(seed), offset_(offset) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  // Reserves n values and returns the offset of the first.
  uint64_t advance(uint64_t n);

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};
BP_API Generator& default_generator();
// The global generator's seed and offset (torch.get_rng_state / set_rng_state): a checkpoint
// saves them so a resumed run draws the numbers the uninterrupted run would have drawn.
struct RngState {
  uint64_t seed = 0, offset = 0;
};
BP_API RngState get_rng_state();
BP_API void set_rng_state(const RngState& state);
BP_API Tensor rand(const Shape& shape, Device& device, DType dtype = DType::f32,
                   Generator* gen = nullptr);  // uniform [0, 1)
BP_API Tensor rand(const Shape& shape, DType dtype = DType::f32);
BP_API Tensor randn(const Shape& shape, Device& device, DType dtype = DType::f32,
                    Generator* gen = nullptr);  // standard normal
BP_API Tensor randn(const Shape& shape, DType dtype = DType::f32);
BP_API Tensor uniform(const Shape& shape, double low, double high, Device& device,
                      DType dtype = DType::f32, Generator* gen = nullptr);

// ---- ops -------------------------------------------------------------------------------------
BP_API Tensor operator+(const Tensor& a, const Tensor& b);
BP_API Tensor operator-(const Tensor& a, const Tensor& b);
BP_API Tensor operator*(const Tensor& a, const Tensor& b);
BP_API Tensor operator/(const Tensor& a, const Tensor& b);
BP_API Tensor operator+(const Tensor& a, double b);
BP_API Tensor operator-(const Tensor& a, double b);
BP_API Tensor operator*(const Tensor& a, double b);
BP_API Tensor operator/(const Tensor& a, double b);
BP_API Tensor operator+(double a, const Tensor& b);
BP_API Tensor operator-(double a, const Tensor& b);
BP_API Tensor operator*(double a, const Tensor& b);
BP_API Tensor operator/(double a, const Tensor& b);
BP_API Tensor operator-(const Tensor& a);
BP_API Tensor pow(const Tensor& a, double b);
BP_API Tensor pow(const Tensor& a, const Tensor& b);
BP_API Tensor maximum(const Tensor& a, const Tensor& b);
BP_API Tensor minimum(const Tensor& a, const Tensor& b);
BP_API Tensor maximum(const Tensor& a, double b);
BP_API Tensor minimum(const Tensor& a, double b);
// Comparisons give bool tensors.
BP_API Tensor eq(const Tensor& a, const Tensor& b);
BP_API Tensor ne(const Tensor& a, const Tensor& b);
BP_API Tensor lt(const Tensor& a, const Tensor& b);
BP_API Tensor le(const Tensor& a, const Tensor& b);
BP_API Tensor gt(const Tensor& a, const Tensor& b);
BP_API Tensor ge(const Tensor& a, const Tensor& b);
BP_API Tensor gt(const Tensor& a, double b);
BP_API Tensor lt(const Tensor& a, double b);
BP_API Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
BP_API Tensor matmul(const Tensor& a, const Tensor& b);
// What linear applies to its output after the bias.
enum class Activation { none, relu };
// x [..., K] times weight [N, K] transposed, plus bias [N] when it is defined, then the
// activation: out [..., N] = act(x w^T + b), as torch.nn.functional.linear (+ relu) but one op
// on devices with the fused kernel (catalogue op "linear"; others compute matmul, add, relu).
BP_API Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                     Activation activation = Activation::none);
BP_API Tensor exp(const Tensor& a);
BP_API Tensor log(const Tensor& a);
BP_API Tensor sqrt(const Tensor& a);
BP_API Tensor relu(const Tensor& a);
BP_API Tensor sigmoid(const Tensor& a);
BP_API Tensor tanh(const Tensor& a);
BP_API Tensor abs(const Tensor& a);
// torch.sin, torch.cos, torch.rsqrt (1 / sqrt(a)): floating dtypes, with autograd.
BP_API Tensor sin(const Tensor& a);
BP_API Tensor cos(const Tensor& a);
BP_API Tensor rsqrt(const Tensor& a);
// Concatenates along an axis (all on one device, one dtype).
BP_API Tensor cat(const std::vector<Tensor>& tensors, int axis);
// True when shapes match and |a-b| <= atol + rtol*|b| everywhere (synchronises).
BP_API bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);

// Prints values (summarised with "..." past 1000 elements), then "<Tensor 3 f32 @cpu:0>".
BP_API std::ostream& operator<<(std::ostream& os, const Tensor& t);
BP_API std::string to_string(const Tensor& t);

// Runs `f` with gradient recording switched off on this thread (like torch.no_grad()).
class BP_API NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};
BP_API bool grad_enabled();
namespace autograd {
// torch.autograd.grad: the gradients of `output` (seeded with `seed`, or 1 for a one-element
// output) with respect to each of `inputs` (leaves or intermediate results that require grad),
// without accumulating into any tensor's grad(). An input that `output` does not depend on
// gets an undefined tensor (allow_unused), or Error naming its position when !allow_unused.
BP_API std::vector<Tensor> grad(const Tensor& output, const std::vector<Tensor>& inputs,
                                const Tensor& seed = Tensor(), bool allow_unused = false);
}  // namespace autograd

// Sets gradient recording on this thread to `enabled` while it lives (torch.set_grad_enabled;
// GradModeGuard(true) is torch.enable_grad inside a no_grad region).
class BP_API GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled);
  ~GradModeGuard();
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace bp
