// Device strings (parse_device_string in runtime.hpp): type[:index], the type being a plugin's
// device_type. Anything else is a DeviceError that says what was wrong and what the right form
// is; device() adds the list of devices that exist.
#include <backplane/errors.hpp>
#include <backplane/runtime.hpp>

#include <limits>
#include <string>

namespace bp {

namespace {
[[noreturn]] void bad(std::string_view spec, const std::string& why) {
  throw DeviceError("invalid device string '" + std::string(spec) + "': " + why +
                    "; expected 'type[:index]' such as 'cpu' or 'cpu:0' (type in "
                    "lower-case letters, digits and '_', index a non-negative integer without "
                    "sign or leading zeros)");
}
bool is_type_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}
}  // namespace

DeviceSpec parse_device_string(std::string_view spec) {
  if (spec.empty()) bad(spec, "it is empty");
  size_t colon = spec.find(':');
  std::string_view type = spec.substr(0, colon);
  if (type.empty()) bad(spec, "the device type before ':' is missing");
  for (char c : type) {
    if (c >= 'A' && c <= 'Z') bad(spec, "device types are lower-case");
    if (!is_type_char(c)) bad(spec, std::string("character '") + c + "' is not allowed in a type");
  }
  if (!(type[0] >= 'a' && type[0] <= 'z')) bad(spec, "the device type must start with a letter");
  DeviceSpec out{std::string(type), 0};
  if (colon == std::string_view::npos) return out;
  std::string_view idx = spec.substr(colon + 1);
  if (idx.empty()) bad(spec, "the index after ':' is missing");
  if (idx[0] == '-' || idx[0] == '+') bad(spec, "the index must not have a sign");
  for (char c : idx)
    if (c < '0' || c > '9') bad(spec, "the index '" + std::string(idx) + "' is not a number");
  if (idx.size() > 1 && idx[0] == '0') bad(spec, "the index must not have leading zeros");
  long long v = 0;
  for (char c : idx) {
    v = v * 10 + (c - '0');
    if (v > std::numeric_limits<int>::max()) bad(spec, "the index is out of range");
  }
  out.index = static_cast<int>(v);
  return out;
}

}  // namespace bp
