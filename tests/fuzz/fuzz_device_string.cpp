// libFuzzer target: bp::parse_device_string on arbitrary bytes (Note [Device strings] in
// core/src/runtime/device_string.cpp). Any input must either parse or throw bp::DeviceError whose
// message quotes the string and states the grammar; nothing else may happen. A string that
// parses follows the grammar and is its own canonical form ("type:index", or "type" for
// index 0), which parses back to the same device.
#include <backplane/errors.hpp>
#include <backplane/runtime.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

bool valid_type(const std::string& t) {
  if (t.empty() || !(t[0] >= 'a' && t[0] <= 'z')) return false;
  for (char c : t)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view spec(reinterpret_cast<const char*>(data), size);
  bp::DeviceSpec d;
  try {
    d = bp::parse_device_string(spec);
  } catch (const bp::DeviceError& e) {
    const std::string msg = e.what();
    check(msg.rfind("invalid device string '", 0) == 0);
    check(msg.find("expected 'type[:index]'") != std::string::npos);
    return 0;
  }
  check(valid_type(d.type));
  check(d.index >= 0);
  const std::string canonical = d.type + ":" + std::to_string(d.index);
  check(spec == canonical || (d.index == 0 && spec == d.type));
  const bp::DeviceSpec again = bp::parse_device_string(canonical);
  check(again.type == d.type && again.index == d.index);
  return 0;
}
