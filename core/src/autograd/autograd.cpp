// Reverse-mode differentiation (Note [Autograd] in tensor.hpp).
#include "autograd/autograd_internal.hpp"
#include "tensor/autocast_internal.hpp"
#include "tensor/tensor_internal.hpp"

#include <backplane/runtime.hpp>

#include <algorithm>
#include <atomic>
#include <unordered_map>

namespace bp {

using detail::impl;
using detail::impl_ptr;
using detail::TensorImpl;

namespace detail {
Tensor scalar_raw(Op op, const Tensor& a, double s, bool reverse, DType out_dtype);
Tensor reduce_raw(Op op, const Tensor& a, uint32_t axes, bool keepdim);
void copy_into(const Tensor& dst, const Tensor& src);
}  // namespace detail

namespace autograd {

namespace {

// Sums `g` over the dimensions that broadcasting added to reach `shape`.
Tensor reduce_to(Tensor g, const Shape& shape) {
  int lead = g.rank() - static_cast<int>(shape.size());
  for (int k = 0; k < lead; ++k) g = g.sum(0);
  for (int k = 0; k < static_cast<int>(shape.size()); ++k)
    if (shape[k] == 1 && g.size(k) != 1) g = g.sum(k, true);
  return g;
}

class OpNode final : public Node {
 public:
  GradKind kind;
  std::vector<Tensor> saved;  // detached
  std::vector<Shape> in_shapes;
  std::vector<DType> in_dtypes;
  std::vector<Device*> in_devices;
  double scalar = 0.0;
  int64_t param = 0;
  Shape extra;

  const char* name() const override { return grad_kind_name(kind); }

  bool slice_region(SliceRegion& r) const override {
    if (kind != GradKind::slice) return false;
    r = {static_cast<int>(extra[0]), extra[1], extra[2], extra[3]};
    return true;
  }

  std::vector<Tensor> apply(const Tensor& g) override {
    const Shape& s0 = in_shapes[0];
    auto two = [&](Tensor ga, Tensor gb) {
      return std::vector<Tensor>{reduce_to(std::move(ga), s0),
                                 reduce_to(std::move(gb), in_shapes[1])};
    };
    auto as_float = [&](const Tensor& mask) { return mask.to(g.dtype()); };
    switch (kind) {
      case GradKind::add:
        return two(g, g);
      case GradKind::sub:
        return two(g, -g);
      case GradKind::mul:
        return two(g * saved[1], g * saved[0]);
      case GradKind::div: {
        const Tensor &a = saved[0], &b = saved[1];
        return two(g / b, -(g * a) / (b * b));
      }
      case GradKind::pow: {
        const Tensor &a = saved[0], &b = saved[1];
        Tensor out = bp::pow(a, b);
        return two(g * b * bp::pow(a, b - 1.0), g * out * a.log());
      }
      case GradKind::maximum:
      case GradKind::minimum: {
        Tensor mask = kind == GradKind::maximum ? ge(saved[0], saved[1]) : le(saved[0], saved[1]);
        Tensor z = zeros_like(g);
        return two(where(mask, g, z), where(mask, z, g));
      }
      case GradKind::where: {
        Tensor z = zeros_like(g);
        return two(where(saved[0], g, z), where(saved[0], z, g));
      }
      case GradKind::matmul: {
        Tensor a = saved[0], b = saved[1], g1 = g;
        bool av = a.rank() == 1, bv = b.rank() == 1;
        // b's axis first: for vector @ vector, g is 0-d and gains [1] and then [1, 1].
        if (bv) {
          b = b.unsqueeze(1);
          g1 = g1.unsqueeze(-1);
        }
        if (av) {
          a = a.unsqueeze(0);
          g1 = g1.unsqueeze(-2);
        }
        // Only the gradients some input needs (a first layer's input usually needs none).
        Tensor ga, gb;
        if (next[0]) ga = reduce_to(bp::matmul(g1, b.transpose(-2, -1)), a.shape()).reshape(s0);
        if (next[1])
          gb = reduce_to(bp::matmul(a.transpose(-2, -1), g1), b.shape()).reshape(in_shapes[1]);
        return {ga, gb};
      }
      case GradKind::add_scalar:
        return {g};
      case GradKind::rsub_scalar:
        return {-g};
      case GradKind::mul_scalar:
        return {g * scalar};
      case GradKind::div_scalar:
        return {g / scalar};
      case GradKind::rdiv_scalar:
        return {-(g * scalar) / (saved[0] * saved[0])};
      case GradKind::pow_scalar:
        return {g * scalar * bp::pow(saved[0], scalar - 1.0)};
      case GradKind::clamp_scalar: {
        // param 0: maximum(a, s) passes where a >= s; 1: minimum(a, s) where a <= s.
        Op cmp = param == 0 ? Op::ge : Op::le;
        Tensor mask = detail::scalar_raw(cmp, saved[0], scalar, false, DType::boolean);
        return {g * as_float(mask)};
      }
      case GradKind::neg:
        return {-g};
      case GradKind::exp:
        return {g * saved[1]};
      case GradKind::log:
        return {g / saved[0]};
      case GradKind::sqrt:
        return {g * 0.5 / saved[1]};
      case GradKind::relu:
        return {g * as_float(gt(saved[0], 0.0))};
      case GradKind::sigmoid:
        return {g * saved[1] * (1.0 - saved[1])};
      case GradKind::tanh:
        return {g * (1.0 - saved[1] * saved[1])};
      case GradKind::sin:
        return {g * bp::cos(saved[0])};
      case GradKind::cos:
        return {-(g * bp::sin(saved[0]))};
      case GradKind::rsqrt:  // d/da a^(-1/2) = -a^(-3/2) / 2 = -out^3 / 2
        return {g * (saved[1] * saved[1] * saved[1]) * -0.5};
      case GradKind::abs:
        return {g * (as_float(gt(saved[0], 0.0)) - as_float(lt(saved[0], 0.0)))};
      case GradKind::sum:
      case GradKind::mean:
      case GradKind::max:
      case GradKind::sumsq:
      case GradKind::norm: {
        uint32_t axes = static_cast<uint32_t>(param & 0xffffffff);
        bool keepdim = (param >> 40) & 1;
        Shape keep = s0;
        int64_t count = 1;
        for (size_t k = 0; k < keep.size(); ++k)
          if (axes & (1u << k)) {
            count *= keep[k];
            keep[k] = 1;
          }
        Tensor gk = keepdim ? g : g.reshape(keep);
        if (kind == GradKind::sum) return {gk.expand(s0)};
        if (kind == GradKind::mean) return {gk.expand(s0) / static_cast<double>(count)};
        if (kind == GradKind::sumsq) return {gk.expand(s0) * saved[0] * 2.0};
        if (kind == GradKind::norm) {
          // d|x|/dx = x / |x|; at |x| == 0 every x is 0 and the gradient 0 (as PyTorch).
          Tensor n = keepdim ? saved[1] : saved[1].reshape(keep);
          Tensor safe = where(gt(n, 0.0), n, ones_like(n));
          return {gk.expand(s0) * saved[0] / safe.expand(s0)};
        }
        Tensor out = keepdim ? saved[1] : saved[1].reshape(keep);
        Tensor mask = as_float(eq(saved[0], out.expand(s0)));
        Tensor ties = detail::reduce_raw(Op::sum, mask, axes, true);
        return {gk.expand(s0) * mask / ties};
      }
      case GradKind::linear: {
        // saved: x [M,K], w [N,K] and, with a ReLU (param bit 0), the output; inputs x, w and
        // the bias when there is one (param bit 1).
        const Tensor &x = saved[0], &w = saved[1];
        Tensor g2 = (param & 1) ? g * as_float(gt(saved[2], 0.0)) : g;
        Tensor gx, gw, gb;
        if (next[0]) gx = bp::matmul(g2, w);
        if (next[1]) gw = bp::matmul(g2.t(), x);
        if ((param & 2) && next[2]) gb = g2.sum(0);
        if (param & 2) return {gx, gw, gb};
        return {gx, gw};
      }
      case GradKind::conv2d:
      case GradKind::max_pool2d:
      case GradKind::avg_pool2d:
      case GradKind::adaptive_avg_pool2d:
      case GradKind::batch_norm:
      case GradKind::batch_norm_eval:
      case GradKind::dropout:
      case GradKind::index_reduce:
      case GradKind::gather:
      case GradKind::scatter_add:
      case GradKind::softmax:
      case GradKind::log_softmax:
      case GradKind::cat:
      case GradKind::layer_norm:
      case GradKind::gelu:
      case GradKind::silu:
      case GradKind::embedding:
      case GradKind::attention:
      case GradKind::triu:
      case GradKind::tril:
      case GradKind::cumsum:
      case GradKind::cross_entropy: {
        std::vector<bool> needs(next.size());
        for (size_t k = 0; k < next.size(); ++k) needs[k] = next[k] != nullptr;
        return nn_backward(kind, g, saved, in_shapes, scalar, param, extra, needs);
      }
      case GradKind::cast:
        return {g.to(in_dtypes[0])};
      case GradKind::identity:
        return {g};
      case GradKind::reshape:
        return {g.reshape(s0)};
      case GradKind::permute: {
        Shape inverse(extra.size());
        for (size_t k = 0; k < extra.size(); ++k)
          inverse[static_cast<size_t>(extra[k])] = static_cast<int64_t>(k);
        return {g.permute(inverse)};
      }
      case GradKind::slice: {
        Tensor z = zeros(s0, g.device(), g.dtype());
        detail::copy_into(
            z.slice(static_cast<int>(extra[0]), extra[1], extra[2], extra[3]),
            g.reshape(z.slice(static_cast<int>(extra[0]), extra[1], extra[2], extra[3]).shape()));
        return {z};
      }
      case GradKind::expand:
        return {reduce_to(g, s0)};
      case GradKind::to_device:
        return {g.to(*in_devices[0])};
    }
    return {};
  }
};

class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  const char* name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(const Tensor& g) override {
    Meta& m = *leaf_->autograd;
    Tensor gg = impl(g).shape == leaf_->shape ? g : g.reshape(leaf_->shape.vec());
    if (m.grad.defined())
      m.grad = m.grad + gg;
    else
      m.grad =
          gg.is_contiguous() && !gg.shares_storage(detail::make_tensor(leaf_)) ? gg : gg.clone();
    if (!m.post_accumulate_hooks.empty()) {
      Tensor leaf = detail::make_tensor(leaf_);
      auto hooks = m.post_accumulate_hooks;  // a hook may remove itself
      for (auto& [id, hook] : hooks) hook(leaf);
    }
    return {};
  }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

Meta& meta_of(const Tensor& t) {
  TensorImpl& i = impl(t);
  if (!i.autograd) i.autograd = std::make_shared<Meta>();
  return *i.autograd;
}

std::shared_ptr<Node> edge_for(const Tensor& t) {
  const auto& m = impl(t).autograd;
  if (!m || !m->requires_grad) return nullptr;
  if (m->grad_fn) return m->grad_fn;
  if (auto acc = m->accumulator.lock()) return acc;
  auto acc = std::make_shared<AccumulateGrad>(impl_ptr(t));
  m->accumulator = acc;
  return acc;
}

}  // namespace

namespace {

// The recorder of Note [Autograd hook], registered below.
void record_node(GradKind kind, const Tensor& out, std::vector<Tensor> inputs,
                 std::vector<Tensor> saved, double scalar, int64_t param, Shape extra) {
  auto node = std::make_shared<OpNode>();
  node->kind = kind;
  node->scalar = scalar;
  node->param = param;
  node->extra = std::move(extra);
  for (const Tensor& t : inputs) {
    node->next.push_back(edge_for(t));
    node->in_shapes.push_back(t.shape());
    node->in_dtypes.push_back(t.dtype());
    node->in_devices.push_back(&t.device());
  }
  for (const Tensor& t : saved) node->saved.push_back(t.detach());
  Meta& m = meta_of(out);
  m.requires_grad = true;
  m.grad_fn = std::move(node);
}

[[maybe_unused]] const bool g_registered = (set_recorder(&record_node), true);

}  // namespace

}  // namespace autograd

// ---- Tensor's autograd surface ----------------------------------------------------------------

bool Tensor::requires_grad() const {
  const auto& m = impl_->autograd;
  return m && m->requires_grad;
}

Tensor& Tensor::requires_grad_(bool on) {
  if (on && !is_floating(dtype()))
    throw DTypeError("requires_grad_: only floating tensors can require gradients, got " +
                     std::string(dtype_name(dtype())));
  autograd::meta_of(*this).requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const {
  const auto& m = impl_->autograd;
  return m ? m->grad : Tensor();
}

void Tensor::set_grad(const Tensor& g) {
  autograd::meta_of(*this).grad = g;
}

void Tensor::zero_grad() {
  if (impl_->autograd) impl_->autograd->grad = Tensor();
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> none;
  const auto& m = impl_->autograd;
  return m ? m->grad_fn : none;
}

int64_t Tensor::register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const {
  if (!requires_grad())
    throw Error(
        "register_post_accumulate_grad_hook: the tensor does not require grad (call "
        "requires_grad_() first)");
  if (grad_fn())
    throw Error(
        "register_post_accumulate_grad_hook: the tensor is not a leaf (it was computed "
        "by " +
        std::string(grad_fn()->name()) + "); hooks go on leaves such as parameters");
  static std::atomic<int64_t> next{1};
  int64_t id = next.fetch_add(1);
  autograd::meta_of(*this).post_accumulate_hooks.emplace_back(id, std::move(hook));
  return id;
}

void Tensor::remove_post_accumulate_grad_hook(int64_t id) const {
  if (!impl_->autograd) return;
  auto& hooks = impl_->autograd->post_accumulate_hooks;
  hooks.erase(
      std::remove_if(hooks.begin(), hooks.end(), [id](const auto& h) { return h.first == id; }),
      hooks.end());
}

Tensor Tensor::detach() const {
  const TensorImpl& i = *impl_;
  return detail::make_view(*this, i.shape, i.strides, i.offset);
}

namespace {

// Note [Slice gradients]
//   A slice's gradient is zero outside its region, so materialised on its own it is a zero
//   tensor of the input's shape with the gradient copied into the region; when several slices
//   of one tensor all need a gradient (q, k and v cut from one fused projection), their
//   zero-padded gradients were then added: one fill, one copy and one full-size add per slice.
//   The backward pass instead keeps, for a pending gradient that slices alone have produced so
//   far, the regions already written into its zero buffer (the pass made that buffer and nothing
//   else refers to it), and copies a further slice's gradient straight into its region when it
//   is disjoint from them (the same axis, unit steps, intervals that do not meet). Anything
//   else (an overlap, another kind of gradient for the same tensor) takes the general path:
//   materialise and add.
struct SliceAccumulator {
  std::vector<autograd::Node::SliceRegion> written;

  bool disjoint(const autograd::Node::SliceRegion& r) const {
    if (r.step != 1) return false;
    for (const autograd::Node::SliceRegion& w : written)
      if (w.axis != r.axis || w.step != 1 || !(r.end <= w.start || w.end <= r.start)) return false;
    return true;
  }
};

// Note [Autograd]'s backward pass from `root` seeded with `seed`. With `capture` (Node -> slot),
// the gradient reaching a captured node is stored in its slot, and no AccumulateGrad runs (no
// leaf's grad() changes): autograd::grad.
void run_backward(const std::shared_ptr<autograd::Node>& root, const Tensor& seed,
                  std::unordered_map<autograd::Node*, Tensor>* capture) {
  NoGradGuard no_grad;
  detail::AutocastOff autocast_off;  // Note [Autocast op lists]: backward follows the forward
  // Reverse topological order by iterative DFS.
  std::vector<autograd::Node*> order;
  std::unordered_map<autograd::Node*, int> state;
  std::vector<std::pair<autograd::Node*, size_t>> stack{{root.get(), 0}};
  state[root.get()] = 1;
  while (!stack.empty()) {
    auto& [n, i] = stack.back();
    if (i < n->next.size()) {
      autograd::Node* c = n->next[i++].get();
      if (c && !state[c]) {
        state[c] = 1;
        stack.push_back({c, 0});
      }
    } else {
      order.push_back(n);
      stack.pop_back();
    }
  }
  std::unordered_map<autograd::Node*, Tensor> grads;
  std::unordered_map<autograd::Node*, SliceAccumulator> slices;
  grads[root.get()] = seed;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    autograd::Node* n = *it;
    auto g = grads.find(n);
    if (g == grads.end()) continue;
    Tensor grad = g->second;
    grads.erase(g);
    if (capture) {
      auto c = capture->find(n);
      if (c != capture->end()) c->second = grad;
      if (dynamic_cast<autograd::AccumulateGrad*>(n)) continue;
    }
    autograd::Node::SliceRegion region;
    const bool slice = n->slice_region(region) && !n->next.empty() && n->next[0];
    if (slice) {  // Note [Slice gradients]: into the pending buffer when disjoint
      autograd::Node* c = n->next[0].get();
      auto slot = grads.find(c);
      auto acc = slices.find(c);
      if (slot != grads.end() && acc != slices.end() && acc->second.disjoint(region) &&
          slot->second.dtype() == grad.dtype() && &slot->second.device() == &grad.device()) {
        Tensor view = slot->second.slice(region.axis, region.start, region.end, region.step);
        detail::copy_into(view, grad.reshape(view.shape()));
        acc->second.written.push_back(region);
        continue;
      }
    }
    std::vector<Tensor> in_grads = n->apply(grad);
    for (size_t k = 0; k < n->next.size() && k < in_grads.size(); ++k) {
      autograd::Node* c = n->next[k].get();
      if (!c || !in_grads[k].defined()) continue;
      auto [slot, fresh] = grads.try_emplace(c, in_grads[k]);
      if (!fresh) slot->second = slot->second + in_grads[k];
      if (fresh && slice)
        slices[c].written = {region};  // apply's zero buffer with this region written
      else
        slices.erase(c);  // no longer a zero buffer that only slices wrote into
    }
  }
}

Tensor seed_for(const Tensor& out, const Tensor& seed0, const char* what) {
  if (!out.requires_grad())
    throw Error(std::string(what) +
                ": the tensor does not require grad (no input of the computation had "
                "requires_grad_() set, or it ran under NoGradGuard)");
  if (!seed0.defined()) {
    if (out.numel() != 1)
      throw ShapeError(std::string(what) +
                       ": implicit gradient needs a one-element tensor, got shape " +
                       out.dims().str() + "; pass a seed gradient");
    return ones(out.shape(), out.device(), out.dtype());
  }
  if (!(seed0.dims() == out.dims()))
    throw ShapeError(std::string(what) + ": seed shape " + seed0.dims().str() + " differs from " +
                     out.dims().str());
  return seed0;
}

}  // namespace

void Tensor::backward(const Tensor& seed0) const {
  Tensor seed = seed_for(*this, seed0, "backward");
  run_backward(autograd::edge_for(*this), seed, nullptr);
}

std::vector<Tensor> autograd::grad(const Tensor& output, const std::vector<Tensor>& inputs,
                                   const Tensor& seed0, bool allow_unused) {
  Tensor seed = seed_for(output, seed0, "autograd::grad");
  std::vector<std::shared_ptr<Node>> nodes;
  std::unordered_map<Node*, Tensor> capture;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!inputs[k].defined() || !inputs[k].requires_grad())
      throw Error("autograd::grad: input " + std::to_string(k) +
                  " does not require grad; differentiate with respect to tensors that do");
    nodes.push_back(edge_for(inputs[k]));
    capture.try_emplace(nodes.back().get());
  }
  run_backward(edge_for(output), seed, &capture);
  std::vector<Tensor> out;
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor g = capture[nodes[k].get()];
    if (!g.defined() && !allow_unused)
      throw Error("autograd::grad: input " + std::to_string(k) +
                  " was not used to compute the output (pass allow_unused to get None)");
    if (g.defined() && !(g.dims() == inputs[k].dims())) g = g.reshape(inputs[k].shape());
    out.push_back(g);
  }
  return out;
}

}  // namespace bp
