// libFuzzer target: the loader's checks of a plugin table (bp::detail::check_plugin_table, Note
// [Plugin table checks] in core/src/runtime/registry.cpp) on arbitrary tables in memory.
//
// Input: 2 bytes of declared struct_size (little-endian), then the table's bytes, then up to
// three NUL-separated strings. The table lives in a heap block of exactly
// min(declared, sizeof(bp_plugin_api)) bytes (at least the size field), so AddressSanitizer
// reports any read past what the plugin declared. Function slots keep their raw bytes (the
// checks only test them for NULL and must call nothing); the name, device_type and version
// pointers, when their bytes are not all zero, point at the input's strings.
//
// Oracle: the table is accepted exactly when it is large enough for ABI 1.0, has the host's
// major version, a size that fits its minor, every required slot set, the event slots all set or
// all NULL, and a device type that bp::parse_device_string accepts as a bare type; the report then
// carries the table's identity.
#include <backplane/abi/plugin_abi.h>
#include <backplane/errors.hpp>
#include <backplane/runtime.hpp>

#include "runtime/registry.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

bool slot_set(const unsigned char* table, size_t offset) {
  void* p;
  std::memcpy(&p, table + offset, sizeof p);
  return p != nullptr;
}

#define BP_OFF(slot) offsetof(bp_plugin_api, slot)
// The minor-0 slots the loader requires (plugin_abi.h: every slot not marked optional).
const size_t kRequired[] = {BP_OFF(error_free),
                            BP_OFF(init),
                            BP_OFF(device_count),
                            BP_OFF(device_properties),
                            BP_OFF(stream_create),
                            BP_OFF(stream_destroy),
                            BP_OFF(stream_synchronize),
                            BP_OFF(mem_alloc),
                            BP_OFF(mem_free),
                            BP_OFF(memory_stats),
                            BP_OFF(memory_reset_peak),
                            BP_OFF(memset),
                            BP_OFF(copy_h2d),
                            BP_OFF(copy_d2h),
                            BP_OFF(copy_d2d),
                            BP_OFF(find_kernel),
                            BP_OFF(launch)};
const size_t kEvents[] = {BP_OFF(event_create), BP_OFF(event_destroy), BP_OFF(event_record),
                          BP_OFF(stream_wait_event), BP_OFF(event_synchronize)};

bool valid_type(const char* t) {
  if (!t) return false;
  const std::string s(t);
  if (s.find(':') != std::string::npos) return false;
  try {
    bp::DeviceSpec d = bp::parse_device_string(s);
    return d.type == s;
  } catch (const bp::DeviceError&) {
    return false;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t declared = static_cast<size_t>(data[0]) | static_cast<size_t>(data[1]) << 8;
  data += 2;
  size -= 2;
  const size_t alloc = std::max(sizeof(size_t), std::min(declared, sizeof(bp_plugin_api)));
  auto* table = static_cast<unsigned char*>(std::malloc(alloc));
  check(table != nullptr);
  std::memset(table, 0, alloc);
  const size_t take = std::min(size, alloc);
  std::memcpy(table, data, take);
  const size_t struct_size = declared;
  std::memcpy(table, &struct_size, sizeof struct_size);

  // The strings after the table bytes, and the identity pointers aimed at them.
  std::string strings[3];
  size_t at = take, k = 0;
  while (at < size && k < 3) {
    const auto* end = static_cast<const uint8_t*>(std::memchr(data + at, 0, size - at));
    const size_t n = end ? static_cast<size_t>(end - (data + at)) : size - at;
    strings[k++].assign(reinterpret_cast<const char*>(data + at), n);
    at += n + 1;
  }
  const size_t ids[] = {BP_OFF(name), BP_OFF(device_type), BP_OFF(version)};
  const char* id_value[3] = {nullptr, nullptr, nullptr};
  for (int i = 0; i < 3; ++i) {
    if (ids[i] + sizeof(char*) > alloc) continue;
    if (slot_set(table, ids[i])) id_value[i] = strings[i].c_str();
    std::memcpy(table + ids[i], &id_value[i], sizeof(char*));
  }

  const auto* api = reinterpret_cast<const bp_plugin_api*>(table);
  bp::PluginReport r;
  const std::string reason = bp::detail::check_plugin_table(api, r);

  const bool identity = declared >= BP_OFF(version) + sizeof(char*);
  const bool minor0 = declared >= BP_API_MINOR1_OFFSET;
  bool expect_ok = identity && minor0;
  if (expect_ok) {
    uint32_t major;
    std::memcpy(&major, table + BP_OFF(abi_major), sizeof major);
    expect_ok = major == BP_ABI_MAJOR;
  }
  if (expect_ok) {
    // The size fits the declared minor (Note [Plugin table checks]).
    uint32_t minor;
    std::memcpy(&minor, table + BP_OFF(abi_minor), sizeof minor);
    // Minors 4, 5, 7 and 8 appended ops and attributes, no slot. Written out here rather than
    // taken from the registry so that the fuzzer checks the registry's table, not itself.
    const size_t ends[] = {BP_API_MINOR1_OFFSET,  BP_API_MINOR2_OFFSET,  BP_API_MINOR3_OFFSET,
                           BP_API_MINOR6_OFFSET,  BP_API_MINOR6_OFFSET,  BP_API_MINOR6_OFFSET,
                           sizeof(bp_plugin_api), sizeof(bp_plugin_api), sizeof(bp_plugin_api)};
    static_assert(sizeof(ends) / sizeof(ends[0]) == BP_ABI_MINOR + 1);
    const size_t least = ends[std::min<uint32_t>(minor, BP_ABI_MINOR)];
    const size_t most = minor <= BP_ABI_MINOR ? sizeof(bp_plugin_api) : size_t{64} << 10;
    expect_ok = declared >= least && declared <= most;
  }
  if (expect_ok)
    for (size_t off : kRequired) expect_ok = expect_ok && slot_set(table, off);
  if (expect_ok) {
    int events = 0;
    for (size_t off : kEvents) events += slot_set(table, off);
    expect_ok = events == 0 || events == 5;
  }
  if (expect_ok) expect_ok = valid_type(id_value[1]);
  check(reason.empty() == expect_ok);
  if (identity) {
    check(r.name == (id_value[0] ? id_value[0] : ""));
    check(r.device_type == (id_value[1] ? id_value[1] : ""));
    check(r.version == (id_value[2] ? id_value[2] : ""));
  } else {
    check(!reason.empty() && r.name.empty() && r.device_type.empty());
  }
  std::free(table);
  return 0;
}
