// Note [Device strings]
//   grammar:  type[:index]
//   type:     one or more of [a-z0-9_], starting with a letter (the plugin's device_type)
//   index:    a non-negative decimal without sign or leading zeros ("0", "7", "12")
//   "gpu" means "gpu:0". Anything else is a DeviceError that says what was wrong and what
//   the right form is (bytes outside printable ASCII shown as \xHH); device() adds the list of
//   devices that exist.
#include <backplane/errors.hpp>
#include <backplane/runtime.hpp>

#include <limits>
#include <string>

namespace bp {

namespace {
// The string as it can be printed: bytes outside printable ASCII as \xHH, so that a NUL or a
// control character neither truncates the message nor garbles a terminal; past 64 bytes, the
// start and the length (a 1 MB string must not make a 2 MB message).
std::string printable(std::string_view s) {
  static const char kHex[] = "0123456789abcdef";
  constexpr size_t kShown = 64;
  std::string out;
  for (char c : s.substr(0, kShown)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && c != '\\') {
      out += c;
    } else {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    }
  }
  if (s.size() > kShown) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}
[[noreturn]] void bad(std::string_view spec, const std::string& why) {
  throw DeviceError("invalid device string '" + printable(spec) + "': " + why +
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
    if (!is_type_char(c))
      bad(spec, "character '" + printable(std::string_view(&c, 1)) + "' is not allowed in a type");
  }
  if (!(type[0] >= 'a' && type[0] <= 'z')) bad(spec, "the device type must start with a letter");
  DeviceSpec out{std::string(type), 0};
  if (colon == std::string_view::npos) return out;
  std::string_view idx = spec.substr(colon + 1);
  if (idx.empty()) bad(spec, "the index after ':' is missing");
  if (idx[0] == '-' || idx[0] == '+') bad(spec, "the index must not have a sign");
  for (char c : idx)
    if (c < '0' || c > '9') bad(spec, "the index '" + printable(idx) + "' is not a number");
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
