// bp::nn::Module: registration, state traversal, load_state_dict, placement; Sequential.
#include <backplane/nn.hpp>

#include <algorithm>
#include <ostream>
#include <set>
#include <typeinfo>

namespace bp::nn {

namespace {

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

std::string shape_str(const Shape& s) {
  if (s.empty()) return "scalar";
  std::string out;
  for (size_t k = 0; k < s.size(); ++k) {
    if (k) out += 'x';
    out += s[k] < 0 ? std::string("?") : std::to_string(s[k]);
  }
  return out;
}

bool fits_pattern(const Shape& shape, const Shape& pattern) {
  if (shape.size() != pattern.size()) return false;
  for (size_t k = 0; k < shape.size(); ++k)
    if (pattern[k] >= 0 && pattern[k] != shape[k]) return false;
  return true;
}

// A parameter's new value: a leaf on the value's device that requires gradients.
Tensor as_parameter(const Tensor& value) {
  Tensor p = value.detach();
  p.requires_grad_(true);
  return p;
}

std::string join_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t k = 0; k < keys.size(); ++k) {
    if (k) out += ", ";
    out += keys[k];
  }
  return out;
}

}  // namespace

// ---- registration ---------------------------------------------------------------------------

void Module::check_new_name(const std::string& name) const {
  if (name.empty() || name.find('.') != std::string::npos)
    throw Error(this->name() + ": invalid state name '" + name +
                "' (names are non-empty and contain no '.')");
  for (const Slot& s : slots_)
    if (s.name == name) throw Error(this->name() + ": '" + name + "' is already registered");
  for (const auto& [n, c] : children_)
    if (n == name) throw Error(this->name() + ": '" + name + "' is already a child module");
}

size_t Module::register_parameter(const std::string& name, Tensor value) {
  check_new_name(name);
  if (!value.defined())
    throw Error(this->name() + ": parameter '" + name +
                "' is undefined; use register_uninitialized_parameter for lazy parameters");
  slots_.push_back(Slot{name, as_parameter(value), value.shape(), true});
  return slots_.size() - 1;
}

size_t Module::register_uninitialized_parameter(const std::string& name, Shape pattern) {
  check_new_name(name);
  slots_.push_back(Slot{name, Tensor(), std::move(pattern), true});
  return slots_.size() - 1;
}

size_t Module::register_buffer(const std::string& name, Tensor value) {
  check_new_name(name);
  if (!value.defined()) throw Error(this->name() + ": buffer '" + name + "' is undefined");
  Shape shape = value.shape();
  slots_.push_back(Slot{name, value.detach(), std::move(shape), false});
  return slots_.size() - 1;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name);
  if (!module) throw Error(this->name() + ": child module '" + name + "' is null");
  if (module.get() == this) throw Error(this->name() + ": a module cannot be its own child");
  children_.emplace_back(name, std::move(module));
}

void Module::set_slot(size_t index, Tensor value) {
  Slot& s = slots_.at(index);
  if (!value.defined())
    throw Error(name() + ": cannot set '" + s.name + "' to an undefined tensor");
  s.value = s.is_parameter ? as_parameter(value) : value.detach();
  s.pattern = s.value.shape();
}

// ---- traversal ------------------------------------------------------------------------------

template <typename F>
void Module::visit(const std::string& prefix, F&& f) const {
  for (const Slot& s : slots_) f(join(prefix, s.name), s);
  for (const auto& [n, c] : children_) c->visit(join(prefix, n), f);
}

template <typename F>
void Module::visit_mut(const std::string& prefix, F&& f) {
  bool changed = false;
  for (Slot& s : slots_) changed |= f(join(prefix, s.name), s);
  for (auto& [n, c] : children_) c->visit_mut(join(prefix, n), f);
  if (changed) on_state_loaded();
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  visit("", [&](const std::string&, const Slot& s) {
    if (s.is_parameter && s.value.defined()) out.push_back(s.value);
  });
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  visit("", [&](const std::string& key, const Slot& s) {
    if (s.is_parameter && s.value.defined()) out.emplace_back(key, s.value);
  });
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  visit("", [&](const std::string& key, const Slot& s) {
    if (!s.is_parameter) out.emplace_back(key, s.value);
  });
  return out;
}

std::map<std::string, Tensor> Module::state_dict() const {
  std::map<std::string, Tensor> out;
  visit("", [&](const std::string& key, const Slot& s) {
    if (s.value.defined()) out.emplace(key, s.value);
  });
  return out;
}

std::vector<StateSpec> Module::state_spec() const {
  std::vector<StateSpec> out;
  visit("", [&](const std::string& key, const Slot& s) {
    StateSpec spec;
    spec.key = key;
    spec.is_parameter = s.is_parameter;
    spec.initialized = s.value.defined();
    spec.shape = spec.initialized ? s.value.shape() : s.pattern;
    if (spec.initialized) spec.dtype = s.value.dtype();
    out.push_back(std::move(spec));
  });
  return out;
}

bool Module::has_uninitialized_parameters() const {
  bool any = false;
  visit("", [&](const std::string&, const Slot& s) { any |= !s.value.defined(); });
  return any;
}

std::vector<std::pair<std::string, Module*>> Module::named_children() const {
  std::vector<std::pair<std::string, Module*>> out;
  for (const auto& [n, c] : children_) out.emplace_back(n, c.get());
  return out;
}

// ---- load_state_dict ------------------------------------------------------------------------

LoadResult Module::load_state_dict(const std::map<std::string, Tensor>& state,
                                   const LoadOptions& options) {
  LoadResult result;
  std::set<std::string> expected;
  // Check everything first, so that a mismatch leaves the module untouched.
  visit("", [&](const std::string& key, const Slot& s) {
    expected.insert(key);
    auto it = state.find(key);
    if (it == state.end()) {
      result.missing_keys.push_back(key);
      return;
    }
    const Tensor& t = it->second;
    if (!t.defined())
      throw ShapeError("load_state_dict: the tensor for '" + key + "' is undefined");
    Shape want = s.value.defined() ? s.value.shape() : s.pattern;
    if (!fits_pattern(t.shape(), want))
      throw ShapeError("load_state_dict: '" + key + "' has shape " + shape_str(t.shape()) +
                       " but the model expects " + shape_str(want) + " (" + name() + ")");
    if (s.is_parameter && !is_floating(t.dtype()))
      throw DTypeError("load_state_dict: parameter '" + key + "' must be floating, got " +
                       std::string(dtype_name(t.dtype())));
  });
  for (const auto& [key, t] : state)
    if (!expected.count(key)) result.unexpected_keys.push_back(key);
  if (options.strict && (!result.missing_keys.empty() || !result.unexpected_keys.empty())) {
    std::string msg = "load_state_dict: the state does not match the model";
    if (!result.missing_keys.empty()) msg += "; missing keys: " + join_keys(result.missing_keys);
    if (!result.unexpected_keys.empty())
      msg += "; unexpected keys: " + join_keys(result.unexpected_keys);
    throw ShapeError(msg);
  }
  NoGradGuard no_grad;
  visit_mut("", [&](const std::string& key, Slot& s) {
    auto it = state.find(key);
    if (it == state.end()) return false;
    Tensor t = it->second;
    if (s.value.defined() && t.dtype() != s.value.dtype()) t = t.to(s.value.dtype());
    if (s.value.defined())
      s.value.set_data(t.detach());  // in place, like placement (Note [Module state])
    else
      s.value = s.is_parameter ? as_parameter(t) : t.detach();
    s.pattern = s.value.shape();
    return true;
  });
  return result;
}

// ---- placement and mode ---------------------------------------------------------------------

Module& Module::to(Device& device) {
  NoGradGuard no_grad;
  visit_mut("", [&](const std::string&, Slot& s) {
    if (!s.value.defined() || &s.value.device() == &device) return false;
    // In place (Note [Module state]): optimisers hold these very tensors.
    Tensor grad = s.value.grad();
    s.value.set_data(s.value.to(device).detach());
    if (grad.defined()) s.value.set_grad(grad.to(device));
    return false;  // placement changes no shape; on_state_loaded is not needed
  });
  return *this;
}

Module& Module::to(DType dtype) {
  if (!is_floating(dtype))
    throw DTypeError("Module::to: parameters need a floating dtype, got " +
                     std::string(dtype_name(dtype)));
  NoGradGuard no_grad;
  visit_mut("", [&](const std::string&, Slot& s) {
    if (!s.value.defined() || !is_floating(s.value.dtype()) || s.value.dtype() == dtype)
      return false;
    Tensor grad = s.value.grad();
    s.value.set_data(s.value.to(dtype).detach());
    if (grad.defined()) s.value.set_grad(grad.to(dtype));
    return false;
  });
  return *this;
}

Module& Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
  return *this;
}

void Module::zero_grad() {
  visit_mut("", [](const std::string&, Slot& s) {
    if (s.is_parameter && s.value.defined()) s.value.zero_grad();
    return false;
  });
}

// ---- printing -------------------------------------------------------------------------------

namespace {
void print_tree(std::ostream& os, const Module& m, int indent) {
  auto children = m.named_children();
  os << m.name();
  if (children.empty()) {
    if (m.name().back() != ')') os << "()";
    return;
  }
  os << "(\n";
  for (const auto& [n, c] : children) {
    os << std::string(static_cast<size_t>(indent + 2), ' ') << "(" << n << "): ";
    print_tree(os, *c, indent + 2);
    os << "\n";
  }
  os << std::string(static_cast<size_t>(indent), ' ') << ")";
}
}  // namespace

std::ostream& operator<<(std::ostream& os, const Module& module) {
  print_tree(os, module, 0);
  return os;
}

// ---- Sequential -----------------------------------------------------------------------------

Module& Sequential::add(std::shared_ptr<Module> module) {
  Module& ref = *module;
  append(std::move(module));
  return ref;
}

void Sequential::append(std::shared_ptr<Module> module) {
  Module* raw = module.get();
  register_module(std::to_string(layers_.size()), std::move(module));
  layers_.push_back(raw);
}

Module& Sequential::operator[](size_t index) const {
  if (index >= layers_.size())
    throw Error("Sequential: index " + std::to_string(index) + " is out of range (" +
                std::to_string(layers_.size()) + " layers)");
  return *layers_[index];
}

void Sequential::throw_wrong_type(size_t index, const char* requested) const {
  throw Error("Sequential::get: layer " + std::to_string(index) + " is " + layers_[index]->name() +
              ", not the requested type (" + requested + ")");
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (size_t i = 0; i < layers_.size(); ++i) {
    Module* m = layers_[i];
    // Exactly Linear/LazyLinear then exactly ReLU (a subclass may override forward).
    if (i + 1 < layers_.size() && typeid(*layers_[i + 1]) == typeid(ReLU) &&
        (typeid(*m) == typeid(Linear) || typeid(*m) == typeid(LazyLinear))) {
      auto* lin = static_cast<Linear*>(m);
      if (lin->weight().defined()) {
        x = lin->forward(x, Activation::relu);
        ++i;
        continue;
      }
    }
    x = m->forward(x);
  }
  return x;
}

}  // namespace bp::nn
