// The fallback policy, its warnings and counters (Note [Fallback policy] in runtime.hpp) and the
// launch of an op on another device (Note [Fallback by copy]).
#include "runtime/fallback.hpp"

#include "runtime/async_errors.hpp"
#include "runtime/config_internal.hpp"
#include "runtime/interceptor.hpp"
#include "runtime/registry.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

namespace bp {

namespace detail {

namespace {

constexpr int kUnset = -1;
std::atomic<int> g_policy{kUnset};  // set_fallback_policy, else from the configuration

FallbackPolicy parse_policy(const std::string& v) {
  return v == "error"   ? FallbackPolicy::error
         : v == "allow" ? FallbackPolicy::allow
                        : FallbackPolicy::warn;
}

// The per-op overrides of the config file ([fallback.ops]), -1 where none.
const std::array<int, kNumOps>& op_overrides() {
  static const std::array<int, kNumOps> table = [] {
    std::array<int, kNumOps> t;
    t.fill(kUnset);
    for (const auto& [name, policy] : settings().fallback_ops)
      for (size_t i = 0; i < kNumOps; ++i)
        if (op_name(static_cast<Op>(i)) == name) t[i] = static_cast<int>(parse_policy(policy));
    return t;
  }();
  return table;
}

// Where the policy that applies to `op` came from, for messages.
std::string policy_origin(Op op) {
  if (op_overrides()[static_cast<size_t>(op)] != kUnset)
    return "fallback.ops." + std::string(op_name(op)) + " in config file " + settings().source;
  if (g_policy.load(std::memory_order_relaxed) != kUnset) return "bp::set_fallback_policy";
  if (std::getenv("BACKPLANE_FALLBACK")) return "BACKPLANE_FALLBACK";
  if (!settings().fallback.empty()) return "fallback.policy in config file " + settings().source;
  return "the default";
}

using Key = std::tuple<std::string, Op, DType, std::string>;  // device, op, dtype, action
struct Counters {
  uint64_t count = 0, bytes = 0;
  double seconds = 0;
};
std::mutex g_mu;  // guards the two maps below
std::map<Key, Counters>& counters() {
  static auto* m = new std::map<Key, Counters>();  // never destroyed: read by the exit report
  return *m;
}
std::set<Key>& warned() {
  static auto* s = new std::set<Key>();
  return *s;
}

std::string format_bytes(uint64_t n) {
  char buf[32];
  if (n >= (1ull << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(n) / double(1ull << 20));
  else if (n >= (1ull << 10))
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(n) / double(1ull << 10));
  else
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  return buf;
}

void print_report_at_exit() {
  std::string t = fallback_table();
  std::fprintf(stderr, "%s", t.c_str());
}

}  // namespace

FallbackPolicy policy_for(Op op) {
  int o = op_overrides()[static_cast<size_t>(op)];
  if (o != kUnset) return static_cast<FallbackPolicy>(o);
  int g = g_policy.load(std::memory_order_relaxed);
  if (g != kUnset) return static_cast<FallbackPolicy>(g);
  return parse_policy(settings().fallback);
}

void arm_fallback_report() {
  if (settings().fallback_report) std::atexit(print_report_at_exit);
}

FallbackScope::FallbackScope(Device& dev, Op op, DType dtype, std::string action)
    : dev_(dev), op_(op), dtype_(dtype), action_(std::move(action)) {
  const std::string what = "op '" + std::string(op_name(op)) + "' (" +
                           std::string(dtype_name(dtype)) + ") is not implemented on " + dev.str() +
                           " (backend " + dev.backend_name() + ")";
  // Note [Fallback policy]: never inside a graph capture, whatever the policy says.
  DeviceState& ds = state(dev);
  intercepted_host_op(
      ds, ds.stream_handle(), op_name(op).data(),
      ("it is not implemented on this device, and its fallback (" + action_ + ") is never captured")
          .c_str());
  const FallbackPolicy policy = policy_for(op);
  if (policy == FallbackPolicy::error)
    throw UnsupportedError(what + "; its fallback (" + action_ +
                           ") is refused: the fallback policy is error (from " + policy_origin(op) +
                           "); BACKPLANE_FALLBACK=warn or allow, or fallback.ops." +
                           std::string(op_name(op)) + " in the config file, permits it");
  if (policy == FallbackPolicy::warn) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (warned().insert({dev.str(), op, dtype, action_}).second)
      std::fprintf(stderr,
                   "backplane: warning: %s; fallback: %s (fallback policy warn: shown once per "
                   "op, dtype, device and fallback; counted in bp::fallback_stats())\n",
                   what.c_str(), action_.c_str());
  }
  start_ = std::chrono::steady_clock::now();
}

FallbackScope::~FallbackScope() {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::lock_guard<std::mutex> lock(g_mu);
  Counters& c = counters()[{dev_.str(), op_, dtype_, action_}];
  c.count += 1;
  c.bytes += bytes_;
  c.seconds += s;
}

// Note [Fallback by copy]
//   An op whose plugin lacks it and that has no decomposition in core runs on a device of
//   another plugin that has it: the cpu device first, else the first in search order (every
//   plugin is loaded to find one when those loaded have none). Each operand's bytes, from its
//   offset to its last element (gaps of a strided view included), go to the host and on to a
//   new buffer there; the op runs there with the same shapes, strides and attributes; the
//   outputs' bytes come back the same way (outputs are copied there first too, so the gaps of a
//   strided output and what an in-place op reads keep their values). Both devices are
//   synchronised: the op is finished when this returns. Slow by design, and counted.
namespace {

uint64_t span_bytes(const bp_tensor_desc& d) {
  int64_t last = 0;
  for (int i = 0; i < d.rank; ++i) {
    if (d.shape[i] == 0) return 0;
    last += (d.shape[i] - 1) * d.strides[i];
  }
  return static_cast<uint64_t>(last + 1) * dtype_size(static_cast<DType>(d.dtype));
}

Device* device_with(RegistryState& reg, const Plugin& except, Op op, DType dtype) {
  Device* first = nullptr;
  for (Device* d : reg.devices()) {
    if (&state(*d).plugin == &except || !d->supports(op, dtype)) continue;
    if (d->properties().kind == DeviceKind::cpu) return d;
    if (!first) first = d;
  }
  return first;
}

}  // namespace

void launch_elsewhere(Device& dev, Op op, DType dtype, std::span<const bp_tensor_desc> in,
                      std::span<const bp_tensor_desc> out, std::span<const bp_attr> attrs) {
  DeviceState& ds = state(dev);
  RegistryState& reg = *ds.plugin.registry;
  Device* target = device_with(reg, ds.plugin, op, dtype);
  if (!target) {
    reg.load_all();
    target = device_with(reg, ds.plugin, op, dtype);
  }
  if (!target) {
    (void)ds.resolve_kernel(op, dtype);  // throws UnsupportedError: no device has it
    throw UnsupportedError(dev.str() + ": no device has op '" + std::string(op_name(op)) + "'");
  }
  DeviceState& ts = state(*target);
  FallbackScope scope(dev, op, dtype,
                      "a run on " + target->str() + ", its operands copied there and back");

  const bp_plugin_api* sa = ds.api;
  const bp_plugin_api* ta = ts.api;
  bp_stream* ss = ds.stream_handle();
  bp_stream* tstream = ts.stream_handle();
  const std::string ctx =
      dev.str() + ": fallback of " + std::string(op_name(op)) + " to " + target->str();
  const std::string found = "stream synchronize (" + ctx + ")";
  std::vector<std::shared_ptr<Buffer>> keep;
  std::vector<char> host;
  // One operand to the target: a desc over a new buffer there holding the same bytes.
  auto to_target = [&](const bp_tensor_desc& d) {
    bp_tensor_desc t = d;
    const uint64_t n = span_bytes(d);
    if (n == 0) return t;
    host.resize(n);
    synchronize_handle(ds, ss, found.c_str());  // a failure of earlier work, named as such
    check(sa, sa->copy_d2h(ss, host.data(), d.buffer, d.offset, n), ctx.c_str(), &dev);
    synchronize_handle(ds, ss, found.c_str());
    keep.push_back(ts.allocate(n, nullptr));
    t.buffer = Access::handle(*keep.back());
    t.offset = 0;
    check(ta, ta->copy_h2d(tstream, t.buffer, 0, host.data(), n), ctx.c_str(), target);
    synchronize_handle(ts, tstream, found.c_str());
    scope.add_bytes(n);
    return t;
  };
  std::vector<bp_tensor_desc> tin, tout;
  for (const bp_tensor_desc& d : in) tin.push_back(to_target(d));
  for (const bp_tensor_desc& d : out) tout.push_back(to_target(d));
  launch(ts.kernel(op, dtype), tstream, tin, tout, attrs);
  synchronize_handle(ts, tstream, found.c_str());
  for (size_t i = 0; i < out.size(); ++i) {
    const uint64_t n = span_bytes(out[i]);
    if (n == 0) continue;
    host.resize(n);
    check(ta, ta->copy_d2h(tstream, host.data(), tout[i].buffer, 0, n), ctx.c_str(), target);
    synchronize_handle(ts, tstream, found.c_str());
    check(sa, sa->copy_h2d(ss, out[i].buffer, out[i].offset, host.data(), n), ctx.c_str(), &dev);
    synchronize_handle(ds, ss, found.c_str());
    scope.add_bytes(n);
  }
}

bool launch_blocking() noexcept {
  static const bool on = [] {
    try {
      return settings().launch_blocking;
    } catch (const Error&) {  // a bad configuration is reported by whoever reads it first
      return false;
    }
  }();
  return on;
}

}  // namespace detail

void set_fallback_policy(FallbackPolicy policy) {
  detail::g_policy.store(static_cast<int>(policy), std::memory_order_relaxed);
}

FallbackPolicy fallback_policy(Op op) {
  return detail::policy_for(op);
}

std::vector<FallbackStats> fallback_stats() {
  std::lock_guard<std::mutex> lock(detail::g_mu);
  std::vector<FallbackStats> out;
  for (const auto& [k, c] : detail::counters())
    out.push_back({std::get<0>(k), std::string(op_name(std::get<1>(k))),
                   std::string(dtype_name(std::get<2>(k))), std::get<3>(k), c.count, c.bytes,
                   c.seconds});
  return out;
}

void reset_fallback_stats() {
  std::lock_guard<std::mutex> lock(detail::g_mu);
  detail::counters().clear();
}

std::string fallback_table() {
  std::vector<FallbackStats> s = fallback_stats();
  std::string out = "Fallbacks (Note [Fallback policy]): ";
  if (s.empty()) return out + "none\n";
  out += std::to_string(s.size()) + "\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-14s %-24s %-5s %8s %12s %12s  %s\n", "device", "op", "dtype",
                "count", "copied", "time", "what was done");
  out += line;
  for (const auto& f : s) {
    std::snprintf(line, sizeof line, "%-14s %-24s %-5s %8llu %12s %9.3f ms  %s\n", f.device.c_str(),
                  f.op.c_str(), f.dtype.c_str(), static_cast<unsigned long long>(f.count),
                  detail::format_bytes(f.bytes_copied).c_str(), f.seconds * 1e3, f.action.c_str());
    out += line;
  }
  return out;
}

}  // namespace bp
