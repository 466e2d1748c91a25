// bp::nn: modules with named parameters that live on a device (Linear, LazyLinear, activations,
// Sequential), in the manner of torch.nn.
//
// Note [Module state]
//   A module owns an ordered list of named parameters and buffers and an ordered list of named
//   child modules. Keys follow PyTorch's state_dict: a child's entries are prefixed with its
//   name and a dot ("0.weight", "block.0.bias"), so files written by Backplane load into the
//   PyTorch model of the same structure and the other way round.
//   - Parameters are floating tensors that require gradients; buffers are tensors that do not
//     (running statistics, constants).
//   - A parameter may be registered uninitialised with a shape pattern (-1 = not yet known):
//     LazyLinear's weight before the first call. Uninitialised parameters are left out of
//     parameters(), named_parameters() and state_dict(); state_spec() lists them.
//   - to(device) / to(dtype) move every parameter and buffer in place (Tensor::set_data, as
//     PyTorch's Module.to does), with its gradient: tensor handles taken before the move, and
//     optimisers built from them, see the moved tensors. to() is a no-op for tensors already
//     there.
//   - A module is not copyable: its tensors are handles, and a copy would alias them.
//
// Thread-safety: a module may run forward() from several threads at once once all its
// parameters are initialised; to(), train(), load_state_dict() and the first call of a lazy
// module must not race with anything else on the same module.
#pragma once

#include <backplane/device.hpp>
#include <backplane/dtype.hpp>
#include <backplane/errors.hpp>
#include <backplane/export.hpp>
#include <backplane/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

namespace bp::nn {

// One entry a module expects in its state: what load() checks a file against.
struct StateSpec {
  std::string key;           // "0.weight"
  Shape shape;               // the current shape, or the pattern (-1 = unknown) when uninitialised
  DType dtype = DType::f32;  // meaningful only when initialized
  bool is_parameter = true;  // false for buffers
  bool initialized = true;
};

// How load_state_dict (and bp::load) treat keys that do not match.
struct LoadOptions {
  // true: keys the module expects but the state lacks, and keys the state has that the module
  // does not expect, are a ShapeError naming them. false: both are reported in LoadResult and
  // otherwise ignored (like PyTorch's strict=False); parameters not in the state stay as they
  // are, on their current device.
  bool strict = true;
};

struct LoadResult {
  std::vector<std::string> missing_keys;     // expected by the module, absent in the state
  std::vector<std::string> unexpected_keys;  // present in the state, unknown to the module
};

class BP_API Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The module's computation. Inputs and parameters must be on one device (DeviceMismatch
  // otherwise, naming the op and both devices).
  virtual Tensor forward(const Tensor& input) = 0;
  Tensor operator()(const Tensor& input) { return forward(input); }

  // One line describing this module alone: "Linear(in_features=3, out_features=4, bias=true)".
  virtual std::string name() const = 0;

  // ---- state (Note [Module state]) ----
  // Initialised parameters of this module and its children, depth first in registration order.
  std::vector<Tensor> parameters() const;
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  // Parameters and buffers by key (the tensors themselves, not copies).
  std::map<std::string, Tensor> state_dict() const;
  // Every entry the module expects, initialised or not, in registration order.
  std::vector<StateSpec> state_spec() const;
  bool has_uninitialized_parameters() const;
  // The direct children in registration order.
  std::vector<std::pair<std::string, Module*>> named_children() const;

  // Replaces parameters and buffers with the tensors in `state` (taken as they are, no copy:
  // the module aliases the given tensors; pass clones to keep yours apart). A tensor whose
  // dtype differs from an initialised entry's is cast to the entry's dtype; an uninitialised
  // parameter takes the shape and dtype of its tensor. Checks everything before changing
  // anything: ShapeError naming the key for a shape that does not match (or does not fit an
  // uninitialised parameter's pattern), for missing or unexpected keys under strict; DTypeError
  // for a non-floating tensor given for a parameter.
  LoadResult load_state_dict(const std::map<std::string, Tensor>& state,
                             const LoadOptions& options = {});

  // ---- placement and mode ----
  // Moves every parameter and buffer to `device` (Note [Module state]). Returns *this.
  Module& to(Device& device);
  // Casts floating parameters and buffers to the floating dtype `dtype` (DTypeError for a
  // non-floating one). Returns *this.
  Module& to(DType dtype);
  Module& train(bool on = true);
  Module& eval() { return train(false); }
  bool is_training() const noexcept { return training_; }
  // Drops the gradient of every parameter.
  void zero_grad();

 protected:
  // Registration. Names are non-empty, contain no '.', and are unique within the module among
  // parameters, buffers and children (bp::Error otherwise). Each returns a slot index that
  // the module uses to reach the tensor without a string lookup.
  size_t register_parameter(const std::string& name, Tensor value);
  size_t register_uninitialized_parameter(const std::string& name, Shape pattern);
  size_t register_buffer(const std::string& name, Tensor value);
  template <typename M>
  M& register_module(const std::string& name, std::shared_ptr<M> module) {
    M& ref = *module;
    add_child(name, std::move(module));
    return ref;
  }

  // The tensor in a slot (undefined for an uninitialised parameter).
  const Tensor& slot(size_t index) const { return slots_[index].value; }
  // Materialises or replaces a parameter slot (requires_grad is switched on) or a buffer slot.
  void set_slot(size_t index, Tensor value);

  // Called after load_state_dict changed this module's slots; lets a module update what it
  // derives from its tensors. The default does nothing.
  virtual void on_state_loaded() {}

 private:
  struct Slot {
    std::string name;
    Tensor value;   // undefined while uninitialised
    Shape pattern;  // for uninitialised parameters
    bool is_parameter = true;
  };
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void check_new_name(const std::string& name) const;
  template <typename F>
  void visit(const std::string& prefix, F&& f) const;
  template <typename F>
  void visit_mut(const std::string& prefix, F&& f);

  std::vector<Slot> slots_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// Prints the module tree like PyTorch:
//   Sequential(
//     (0): Linear(in_features=3, out_features=4, bias=true)
//     (1): ReLU()
//   )
BP_API std::ostream& operator<<(std::ostream& os, const Module& module);

// y = x @ weight^T + bias with weight [out, in] and bias [out]; x is [..., in].
// Initialised like torch.nn.Linear: weight and bias uniform in [-1/sqrt(in), 1/sqrt(in)),
// drawn with bp::uniform from the default Philox generator, so one bp::manual_seed gives the
// same values on every device. Throws ShapeError for in < 0 or out < 0, and from forward()
// for an input whose last dimension is not in_features.
class BP_API Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Linear(int64_t in_features, int64_t out_features, bool bias, Device& device,
         DType dtype = DType::f32);

  // [out, in]; undefined for a LazyLinear that has neither run nor been loaded.
  const Tensor& weight() const { return slot(weight_slot_); }
  // [out]; undefined when built without bias (or while a LazyLinear is uninitialised).
  const Tensor& bias() const;
  bool has_bias() const noexcept { return has_bias_; }
  // -1 while a LazyLinear has not learnt it yet.
  int64_t in_features() const;
  int64_t out_features() const noexcept { return out_features_; }

  Tensor forward(const Tensor& input) override;
  // forward followed by `activation`, as one fused op where the device has it (bp::linear);
  // Sequential uses it for a Linear directly followed by a ReLU.
  Tensor forward(const Tensor& input, Activation activation);
  std::string name() const override;

 protected:
  struct Lazy {};
  Linear(Lazy, int64_t out_features, bool bias);
  // Creates weight [out, in] and bias [out] on `device` with the default initialisation.
  void materialize(int64_t in_features, Device& device, DType dtype);

 private:
  int64_t out_features_;
  bool has_bias_;
  size_t weight_slot_ = 0, bias_slot_ = 0;
};

// A Linear whose in_features is taken from the first input (like torch.nn.LazyLinear and
// MXNet's Dense(units)). The first forward() creates the parameters on the input's device with
// the input's (floating) dtype; bp::load into a LazyLinear that has not run takes the shapes
// from the file. Until then parameters() does not list its tensors: run one forward pass (or
// load) before building an optimiser.
class BP_API LazyLinear : public Linear {
 public:
  explicit LazyLinear(int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& input) override;
  std::string name() const override;
};

class BP_API ReLU : public Module {
 public:
  Tensor forward(const Tensor& input) override { return input.relu(); }
  std::string name() const override { return "ReLU()"; }
};

class BP_API Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& input) override { return input.sigmoid(); }
  std::string name() const override { return "Sigmoid()"; }
};

class BP_API Tanh : public Module {
 public:
  Tensor forward(const Tensor& input) override { return input.tanh(); }
  std::string name() const override { return "Tanh()"; }
};

// Children named "0", "1", ... run in order, each on the previous one's output. A Linear (or
// an initialised LazyLinear) directly followed by a ReLU runs as one fused linear+ReLU op
// (bp::linear); the values and gradients are those of the two layers.
class BP_API Sequential : public Module {
 public:
  Sequential() = default;

  // Constructs a T from `args`, appends it and returns it.
  template <typename T, typename... Args>
  T& add(Args&&... args) {
    auto m = std::make_shared<T>(std::forward<Args>(args)...);
    T& ref = *m;
    append(std::move(m));
    return ref;
  }
  // Appends an existing module (shared, not copied).
  Module& add(std::shared_ptr<Module> module);

  size_t size() const noexcept { return layers_.size(); }
  // The i-th layer; bp::Error naming the index and the size when out of range.
  Module& operator[](size_t index) const;
  // The i-th layer as a T (net.get<Linear>(0).weight()); bp::Error naming the layer's actual
  // type when it is not a T.
  template <typename T>
  T& get(size_t index) const {
    Module& m = (*this)[index];
    if (T* p = dynamic_cast<T*>(&m)) return *p;
    throw_wrong_type(index, typeid(T).name());
  }

  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "Sequential"; }

 private:
  void append(std::shared_ptr<Module> module);
  [[noreturn]] void throw_wrong_type(size_t index, const char* requested) const;
  std::vector<Module*> layers_;  // owned through Module's children
};

}  // namespace bp::nn
