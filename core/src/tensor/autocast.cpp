// Autocast scopes and the casts of the listed ops (Note [Autocast op lists] in autocast.hpp).
#include <backplane/autocast.hpp>
#include <backplane/errors.hpp>
#include <backplane/runtime.hpp>

#include "tensor/autocast_internal.hpp"
#include "tensor/grad_record.hpp"
#include "tensor/tensor_internal.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <utility>

namespace bp {

namespace {

struct Entry {
  std::string type;
  bool enabled;
  DType dtype;
};

struct CacheKey {
  const detail::TensorImpl* source;
  DType dtype;
  bool operator<(const CacheKey& o) const {
    return source != o.source ? source < o.source : dtype < o.dtype;
  }
};
struct CacheValue {
  std::shared_ptr<detail::TensorImpl> source;  // held so that the address is not reused
  Tensor cast;
};

struct State {
  std::vector<Entry> entries;
  int depth = 0;      // open AutocastGuards
  int off_depth = 0;  // open AutocastOffs
  std::map<CacheKey, CacheValue> cache;

  Entry* find(std::string_view type) {
    for (Entry& e : entries)
      if (e.type == type) return &e;
    return nullptr;
  }
  void recount() {
    int n = 0;
    if (off_depth == 0)
      for (const Entry& e : entries) n += e.enabled ? 1 : 0;
    detail::autocast_enabled_types = n;
  }
};

thread_local State autocast_state;

DType default_dtype(std::string_view type) {
  return type == "cuda" ? DType::f16 : DType::bf16;
}

// The ops of the lower-precision list: a device runs autocast in a dtype when it has each of
// them natively in that dtype.
constexpr Op kLowerOps[] = {Op::matmul, Op::linear, Op::conv2d, Op::scaled_dot_product_attention};

bool runs_lower(Device& d, DType t) {
  for (Op op : kLowerOps)
    if (!d.supports(op, t)) return false;
  return true;
}

std::string dtype_list(const std::vector<DType>& ts) {
  if (ts.empty()) return "none";
  std::string s;
  for (DType t : ts) {
    if (!s.empty()) s += ", ";
    s += dtype_name(t);
  }
  return s;
}

std::vector<Device*> devices_of(std::string_view type) {
  std::vector<Device*> out;
  const int n = num_devices(type);
  for (int i = 0; i < n; ++i) out.push_back(&device(std::string(type) + ":" + std::to_string(i)));
  return out;
}

std::vector<Device*> checked_devices_of(std::string_view type) {
  if (type.find(':') != std::string_view::npos)
    throw DeviceError("autocast: '" + std::string(type) +
                      "' is a device; autocast takes a device type such as '" +
                      std::string(type.substr(0, type.find(':'))) + "'");
  return devices_of(type);
}

void check_type(std::string_view type, const std::vector<Device*>& devs) {
  if (!devs.empty()) return;
  std::vector<std::string> types;
  for (Device* d : bp::devices())
    if (std::find(types.begin(), types.end(), d->type()) == types.end()) types.push_back(d->type());
  std::string known;
  for (const std::string& t : types) known += (known.empty() ? "" : ", ") + t;
  throw DeviceError("autocast: no device of type '" + std::string(type) +
                    "'; device types with devices: " + known);
}

}  // namespace

std::vector<DType> autocast_supported_dtypes(std::string_view device_type) {
  std::vector<Device*> devs = checked_devices_of(device_type);
  std::vector<DType> out;
  if (devs.empty()) return out;
  for (DType t : {DType::bf16, DType::f16}) {
    bool all = true;
    for (Device* d : devs) all = all && runs_lower(*d, t);
    if (all) out.push_back(t);
  }
  return out;
}

AutocastGuard::AutocastGuard(std::string_view device_type, std::optional<DType> dtype0,
                             bool enabled)
    : type_(device_type) {
  std::vector<Device*> devs = checked_devices_of(device_type);
  check_type(device_type, devs);
  const DType dtype = dtype0.value_or(default_dtype(device_type));
  if (enabled) {
    if (dtype != DType::f16 && dtype != DType::bf16)
      throw DTypeError("autocast: dtype " + std::string(dtype_name(dtype)) + " on '" + type_ +
                       "' is not a lower-precision dtype; autocast runs in " +
                       dtype_list(autocast_supported_dtypes(device_type)) + " there");
    for (Device* d : devs)
      for (Op op : kLowerOps)
        if (!d->supports(op, dtype))
          throw DTypeError("autocast: " + d->str() + " (backend " + d->backend_name() +
                           ") cannot run " + std::string(op_name(op)) + " in " +
                           std::string(dtype_name(dtype)) + "; autocast on '" + type_ +
                           "' supports: " + dtype_list(autocast_supported_dtypes(device_type)));
  }
  Entry* e = autocast_state.find(type_);
  had_entry_ = e != nullptr;
  prev_enabled_ = e ? e->enabled : false;
  prev_dtype_ = e ? e->dtype : default_dtype(type_);
  if (e) {
    e->enabled = enabled;
    if (enabled) e->dtype = dtype;
  } else {
    autocast_state.entries.push_back({type_, enabled, enabled ? dtype : default_dtype(type_)});
  }
  ++autocast_state.depth;
  autocast_state.recount();
}

AutocastGuard::~AutocastGuard() {
  Entry* e = autocast_state.find(type_);
  if (e) {
    if (had_entry_) {
      e->enabled = prev_enabled_;
      e->dtype = prev_dtype_;
    } else {
      autocast_state.entries.erase(autocast_state.entries.begin() +
                                   (e - autocast_state.entries.data()));
    }
  }
  if (--autocast_state.depth == 0) autocast_state.cache.clear();
  autocast_state.recount();
}

bool is_autocast_enabled(std::string_view device_type) {
  const Entry* e = autocast_state.find(device_type);
  return e && e->enabled && autocast_state.off_depth == 0;
}

DType get_autocast_dtype(std::string_view device_type) {
  const Entry* e = autocast_state.find(device_type);
  return e ? e->dtype : default_dtype(device_type);
}

void clear_autocast_cache() {
  autocast_state.cache.clear();
}

namespace detail {

bool autocast_target(AutocastPolicy policy, const Device& dev, DType& out) {
  if (autocast_enabled_types == 0) return false;
  const Entry* e = autocast_state.find(dev.type());
  if (!e || !e->enabled) return false;
  out = policy == AutocastPolicy::lower ? e->dtype : DType::f32;
  return true;
}

Tensor autocast_cast(const Tensor& t, DType dtype) {
  const DType from = t.dtype();
  if (from == dtype || (from != DType::f32 && from != DType::f16 && from != DType::bf16)) return t;
  const TensorImpl& i = impl(t);
  const bool cacheable = from == DType::f32 && dtype != DType::f32 && grad_enabled() &&
                         i.autograd && i.autograd->requires_grad && !i.autograd->grad_fn;
  if (!cacheable) return t.to(dtype);
  CacheKey key{&i, dtype};
  auto it = autocast_state.cache.find(key);
  if (it != autocast_state.cache.end()) return it->second.cast;
  Tensor c = t.to(dtype);
  autocast_state.cache.emplace(key, CacheValue{impl_ptr(t), c});
  return c;
}

AutocastOff::AutocastOff() noexcept : saved_(autocast_state.off_depth) {
  ++autocast_state.off_depth;
  autocast_state.recount();
}

AutocastOff::~AutocastOff() {
  autocast_state.off_depth = saved_;
  autocast_state.recount();
}

}  // namespace detail

}  // namespace bp
