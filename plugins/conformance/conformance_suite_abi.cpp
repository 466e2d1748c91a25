// The abi suite (plugin level: the entry symbol, the table, error objects) and the devices suite
// (device count and properties, including struct_size handling with guard bytes).
#include "conformance_catalogue.hpp"
#include "conformance_suites.hpp"

#include <dlfcn.h>

#include <cstring>
#include <random>

namespace bpc {

const std::vector<std::string>& plugin_suites() {
  static const std::vector<std::string> s = {"abi"};
  return s;
}

const std::vector<std::string>& device_suites() {
  static const std::vector<std::string> s = {"devices",  "memory", "copies",  "streams",
                                             "optional", "native", "kernels", "concurrency",
                                             "graphs",   "errors"};
  return s;
}

bool is_plugin_suite(const std::string& suite) {
  for (const auto& s : plugin_suites())
    if (s == suite) return true;
  return false;
}

bool build_suite(const std::string& suite, Context& ctx, std::vector<TestCase>& out) {
  if (suite == "abi")
    build_abi_suite(ctx, out);
  else if (suite == "devices")
    build_devices_suite(ctx, out);
  else if (suite == "memory")
    build_memory_suite(ctx, out);
  else if (suite == "copies")
    build_copies_suite(ctx, out);
  else if (suite == "streams")
    build_streams_suite(ctx, out);
  else if (suite == "optional")
    build_optional_suite(ctx, out);
  else if (suite == "native")
    build_native_suite(ctx, out);
  else if (suite == "kernels")
    build_kernels_suite(ctx, out);
  else if (suite == "concurrency")
    build_concurrency_suite(ctx, out);
  else if (suite == "graphs")
    build_graphs_suite(ctx, out);
  else if (suite == "errors")
    build_errors_suite(ctx, out);
  else
    return false;
  return true;
}

bp_device_properties read_properties(Context& ctx) {
  bp_device_properties p{};
  p.struct_size = sizeof(p);
  ctx.check(ctx.t().device_properties(ctx.device(), &p),
            format("device_properties(%d)", ctx.device()));
  return p;
}

bp_memory_stats read_stats(Context& ctx) {
  bp_memory_stats s{};
  s.struct_size = sizeof(s);
  ctx.check(ctx.t().memory_stats(ctx.device(), &s), format("memory_stats(%d)", ctx.device()));
  return s;
}

std::vector<uint8_t> random_bytes(uint64_t seed, size_t n) {
  std::mt19937_64 g(seed);
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(1 + g() % 255);  // never 0
  return v;
}

namespace {

bool valid_device_type(const char* t) {
  if (!t || !(*t >= 'a' && *t <= 'z')) return false;
  for (const char* c = t; *c; ++c)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_')) return false;
  return true;
}

int32_t count_devices(Context& c, const char** reason = nullptr) {
  const char* r = nullptr;
  int32_t n = c.t().device_count(&r);
  if (reason) *reason = r;
  return n;
}

// Checks an error object's fields; returns a description. Frees it.
std::string check_error_object(Context& c, bp_error* e, int32_t want_code, const char* must_name,
                               const std::string& what) {
  if (!e)
    throw Failure(what + ": returned success, expected " +
                  (want_code ? error_code_name(want_code) : std::string("an error")));
  std::string problems;
  if (e->struct_size < sizeof(bp_error))
    problems += format("struct_size %zu < %zu; ", e->struct_size, sizeof(bp_error));
  if (!e->message || !*e->message) problems += "message is NULL or empty; ";
  if (!e->plugin || !*e->plugin) problems += "plugin is NULL or empty; ";
  if (!e->native_name) problems += "native_name is NULL (use \"\"); ";
  if (want_code && e->code != want_code)
    problems +=
        "code is " + error_code_name(e->code) + ", expected " + error_code_name(want_code) + "; ";
  if (must_name && e->message && !std::strstr(e->message, must_name))
    problems += format("message does not name '%s'; ", must_name);
  if (e->plugin && c.t().name && std::strcmp(e->plugin, c.t().name) != 0)
    c.note(format("error names plugin '%s', table name is '%s'", e->plugin, c.t().name));
  std::string desc = take_error(c.api(), e);
  if (!problems.empty()) throw Failure(what + ": " + problems + "error was: " + desc);
  return desc;
}

}  // namespace

void build_abi_suite(Context& ctx, std::vector<TestCase>& out) {
  SuiteBuilder b(out, "abi", ctx.device_label());

  b.add("entry_symbol", [](Context& c) {
    void* h = dlopen(c.plugin_path().c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!h) h = dlopen(c.plugin_path().c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) throw Failure("dlopen(" + c.plugin_path() + ") failed: " + dlerror());
    auto get = reinterpret_cast<bp_plugin_get_api_fn>(dlsym(h, BP_PLUGIN_ENTRY_SYMBOL));
    if (!get) throw Failure(std::string("symbol ") + BP_PLUGIN_ENTRY_SYMBOL + " is not exported");
    const bp_plugin_api* again = get(BP_ABI_MAJOR, BP_ABI_MINOR);
    if (!again) throw Failure("a second call of the entry symbol returned NULL");
    if (again->struct_size != c.t().struct_size || again->abi_major != c.t().abi_major ||
        again->abi_minor != c.t().abi_minor)
      throw Failure("a second call of the entry symbol returned a different table header");
    c.note(again == c.api() ? "same table on every call" : "a new table on each call");
  });

  b.add("table_header", [](Context& c) {
    const bp_plugin_api& t = c.t();
    if (t.abi_major != BP_ABI_MAJOR)
      throw Failure(format("abi_major %u, host %u", t.abi_major, BP_ABI_MAJOR));
    if (t.struct_size < BP_API_MINOR1_OFFSET)
      throw Failure(format("struct_size %zu is smaller than a minor-0 table (%zu)", t.struct_size,
                           static_cast<size_t>(BP_API_MINOR1_OFFSET)));
    if (t.struct_size % sizeof(void*) != 0 || t.struct_size > 65536)
      throw Failure(format("struct_size %zu is not a plausible table size", t.struct_size));
    if (!t.name || !*t.name) throw Failure("name is NULL or empty");
    if (!valid_device_type(t.device_type))
      throw Failure(format("device_type '%s' is not lower-case [a-z][a-z0-9_]*",
                           t.device_type ? t.device_type : "(NULL)"));
    if (!t.version || !*t.version) throw Failure("version is NULL or empty");
    c.note(format("%s %s, device type %s, ABI %u.%u, table %zu bytes", t.name, t.version,
                  t.device_type, t.abi_major, t.abi_minor, t.struct_size));
    if (t.abi_minor > BP_ABI_MINOR)
      c.note(format("minor %u is newer than this tool's %u: slots past minor %u are not tested",
                    t.abi_minor, BP_ABI_MINOR, BP_ABI_MINOR));
  });

  b.add("minor_slots", [](Context& c) {
    const bp_plugin_api& t = c.t();
    bool covers = t.struct_size >= BP_API_MINOR1_OFFSET + sizeof(t.list_ops);
    if (t.abi_minor >= 1 && !covers)
      c.note(
          format("claims minor %u but struct_size %zu covers only minor-0 slots: list_ops is "
                 "never read",
                 t.abi_minor, t.struct_size));
    else if (t.abi_minor == 0 && covers)
      c.note("minor 0 with a larger table: slots past minor 0 are never read");
    else if (t.abi_minor >= 1)
      c.note(std::string("minor-1 slot list_ops is ") + (t.list_ops ? "set" : "NULL"));
    else
      c.note("minor-0 table: support is probed with find_kernel");
    if (t.abi_minor >= 2)
      c.note(has_minor2(c.api()) ? std::string("minor-2 slot find_kernel_id is ") +
                                       (t.find_kernel_id ? "set" : "NULL")
                                 : format("claims minor %u but struct_size %zu does not cover "
                                          "the minor-2 slots: find_kernel_id is never read and "
                                          "attributes come in the minor-1 layout",
                                          t.abi_minor, t.struct_size));
    c.note("support source: " +
           (has_list_ops(c.api()) ? std::string("list_ops") : api_minor_note(c.api())));
    // Minor 2 (native handles): which slots the table has and sets.
    std::string minor2;
    auto slot2 = [&](const char* name, bool in_table, bool set) {
      minor2 += format("%s%s %s", minor2.empty() ? "" : ", ", name,
                       !in_table ? "absent"
                       : set     ? "set"
                                 : "NULL");
    };
#define BPC_SLOT2(slot) \
  slot2(#slot, BP_API_HAS_SLOT(&t, 2, slot), BP_API_HAS_SLOT(&t, 2, slot) && t.slot != nullptr)
    BPC_SLOT2(buffer_native);
    BPC_SLOT2(stream_native);
    BPC_SLOT2(buffer_import);
    BPC_SLOT2(stream_import);
#undef BPC_SLOT2
    c.note("minor-2 slots: " + minor2);
  });

  b.add("required_slots", [](Context& c) {
    const bp_plugin_api& t = c.t();
    std::string missing;
#define BPC_REQUIRE(slot) \
  if (!t.slot) missing += std::string(missing.empty() ? "" : ", ") + #slot;
    BP_PLUGIN_REQUIRED_SLOTS(BPC_REQUIRE)
#undef BPC_REQUIRE
    if (!missing.empty()) throw Failure("required slots are NULL: " + missing);
    int events = !!t.event_create + !!t.event_destroy + !!t.event_record + !!t.stream_wait_event +
                 !!t.event_synchronize;
    if (events != 0 && events != 5)
      throw Failure(format("event slots must be all set or all NULL; %d of 5 are set", events));
    if (t.event_elapsed_ms && events == 0)
      throw Failure("event_elapsed_ms is set but the event group is NULL");
    if (!!t.host_alloc != !!t.host_free)
      throw Failure("host_alloc and host_free must be both set or both NULL");
  });

  b.add("device_count", [](Context& c) {
    const char* r1 = nullptr;
    const char* r2 = nullptr;
    int32_t n1 = count_devices(c, &r1), n2 = count_devices(c, &r2);
    if (n1 < 0) throw Failure(format("device_count returned %d", n1));
    if (n1 != n2) throw Failure(format("device_count changed between calls: %d then %d", n1, n2));
    if (!r1) throw Failure("device_count left *out_reason NULL");
    if (n1 == 0 && !*r1) throw Failure("device_count returned 0 without a reason");
    c.note(n1 ? format("%d device(s)", n1) : std::string("0 devices: ") + r1);
  });

  b.add("error_object", [](Context& c) {
    if (count_devices(c) <= 0) throw Skipped("no devices: find_kernel cannot be called");
    const char* bogus = "bp_conformance_no_such_op";
    bp_kernel* k = nullptr;
    bp_error* e = c.t().find_kernel(0, bogus, BP_DTYPE_F32, &k);
    c.note(check_error_object(c, e, BP_ERROR_UNSUPPORTED, bogus,
                              std::string("find_kernel(0, \"") + bogus + "\", f32)"));
  });

  b.add("error_free_null", [](Context& c) {
    c.t().error_free(nullptr);
    c.note("error_free(NULL) returned");
  });

  b.add("find_kernel_bad_dtype", [](Context& c) {
    if (count_devices(c) <= 0) throw Skipped("no devices: find_kernel cannot be called");
    bp_kernel* k = nullptr;
    bp_error* e = c.t().find_kernel(0, "add", 99, &k);
    if (!e) throw Failure("find_kernel(0, \"add\", dtype 99) returned a kernel");
    int32_t code = e->code;
    std::string desc = check_error_object(c, e, 0, nullptr, "find_kernel(0, \"add\", dtype 99)");
    if (code != BP_ERROR_UNSUPPORTED && code != BP_ERROR_INVALID_ARGUMENT)
      throw Failure("expected BP_ERROR_UNSUPPORTED or BP_ERROR_INVALID_ARGUMENT, got " + desc);
    c.note(desc);
  });

  b.add("bad_device_index", [](Context& c) {
    int32_t n = count_devices(c);
    if (n < 0) throw Skipped("device_count is negative (see abi.device_count)");
    for (int32_t bad : {n, -1}) {
      bp_device_properties p{};
      p.struct_size = sizeof(p);
      check_error_object(c, c.t().device_properties(bad, &p), 0, nullptr,
                         format("device_properties(%d) with %d device(s)", bad, n));
      bp_stream* s = nullptr;
      check_error_object(c, c.t().stream_create(bad, &s), 0, nullptr,
                         format("stream_create(%d) with %d device(s)", bad, n));
      bp_kernel* k = nullptr;
      check_error_object(c, c.t().find_kernel(bad, "add", BP_DTYPE_F32, &k), 0, nullptr,
                         format("find_kernel(%d, add, f32) with %d device(s)", bad, n));
    }
    c.note("device_properties, stream_create and find_kernel reject indices -1 and count");
  });
}

namespace {

// Calls device_properties with a struct of `declared` bytes inside a larger guarded buffer;
// fails if the plugin wrote at or past byte `declared`.
void properties_with_size(Context& c, size_t declared) {
  const size_t total = sizeof(bp_device_properties) + 256;
  std::vector<uint8_t> mem(total);
  for (size_t i = 0; i < total; ++i) mem[i] = guard_byte(i);
  std::memset(mem.data(), 0, std::min(declared, sizeof(bp_device_properties)));
  std::memcpy(mem.data(), &declared, sizeof(size_t));
  auto* p = reinterpret_cast<bp_device_properties*>(mem.data());
  c.check(c.t().device_properties(c.device(), p),
          format("device_properties with struct_size %zu", declared));
  size_t sz;
  std::memcpy(&sz, mem.data(), sizeof sz);
  if (sz != declared)
    throw Failure(format("device_properties changed struct_size from %zu to %zu", declared, sz));
  // Past a larger host struct's size the plugin (built against at most this header's minor)
  // knows no fields: everything from its own size on must be left alone.
  size_t first = declared <= sizeof(bp_device_properties) ? std::max(declared, sizeof(size_t))
                                                          : sizeof(bp_device_properties);
  if (c.t().abi_minor > BP_ABI_MINOR) first = std::max(declared, sizeof(size_t));
  for (size_t i = first; i < total; ++i)
    if (mem[i] != guard_byte(i))
      throw Failure(
          format("device_properties with struct_size %zu wrote byte %zu (past the "
                 "struct it was given)",
                 declared, i));
}

bool terminated(const char* s, size_t n) {
  return std::memchr(s, 0, n) != nullptr;
}

}  // namespace

void build_devices_suite(Context& ctx, std::vector<TestCase>& out) {
  SuiteBuilder b(out, "devices", ctx.device_label());

  b.add("properties", [](Context& c) {
    bp_device_properties p = read_properties(c);
    if (p.struct_size != sizeof(p)) throw Failure("device_properties changed struct_size");
    if (!terminated(p.name, sizeof p.name) || !terminated(p.vendor, sizeof p.vendor) ||
        !terminated(p.uuid, sizeof p.uuid) || !terminated(p.pci_bus_id, sizeof p.pci_bus_id))
      throw Failure("a string field is not NUL-terminated within its array");
    if (!*p.name) throw Failure("name is empty");
    if (p.total_memory == 0) throw Failure("total_memory is 0");
    if (p.free_memory > p.total_memory)
      throw Failure(format("free_memory %llu > total_memory %llu",
                           static_cast<unsigned long long>(p.free_memory),
                           static_cast<unsigned long long>(p.total_memory)));
    if (p.cores < 0 || p.compute_major < 0 || p.compute_minor < 0)
      throw Failure(format("negative cores (%d) or compute capability (%d.%d)", p.cores,
                           p.compute_major, p.compute_minor));
    static const char* const kKinds[] = {"kind not said", "cpu", "gpu", "accelerator"};
    if (p.kind < BP_DEVICE_KIND_UNKNOWN || p.kind > BP_DEVICE_KIND_ACCELERATOR)
      throw Failure(format("kind %d is not a bp_device_kind (0 to 3)", p.kind));
    c.note(format("'%s' (%s), %s, %.1f GiB, %d cores%s", p.name, p.vendor, kKinds[p.kind],
                  static_cast<double>(p.total_memory) / (1024.0 * 1024 * 1024), p.cores,
                  p.unified_memory ? ", unified memory" : ""));
  });

  b.add("properties_stable", [](Context& c) {
    bp_device_properties a = read_properties(c), d = read_properties(c);
    std::string diff;
    if (std::strcmp(a.name, d.name)) diff += "name ";
    if (std::strcmp(a.vendor, d.vendor)) diff += "vendor ";
    if (std::strcmp(a.uuid, d.uuid)) diff += "uuid ";
    if (std::strcmp(a.pci_bus_id, d.pci_bus_id)) diff += "pci_bus_id ";
    if (a.total_memory != d.total_memory) diff += "total_memory ";
    if (a.compute_major != d.compute_major || a.compute_minor != d.compute_minor)
      diff += "compute capability ";
    if (a.cores != d.cores) diff += "cores ";
    if (a.supports_f64 != d.supports_f64) diff += "supports_f64 ";
    if (a.unified_memory != d.unified_memory) diff += "unified_memory ";
    if (a.kind != d.kind) diff += "kind ";
    if (!diff.empty()) throw Failure("static properties changed between two calls: " + diff);
  });

  b.add("properties_small_struct", [](Context& c) {
    // Sizes an older or smaller host could pass: header only, up to name, up to the strings,
    // up to cores, up to kind (a host of minor 1). Field boundaries and one mid-field size (SDK
    // plugins copy bytes).
    for (size_t sz :
         {sizeof(size_t), offsetof(bp_device_properties, vendor),
          offsetof(bp_device_properties, total_memory), offsetof(bp_device_properties, cores),
          offsetof(bp_device_properties, kind), offsetof(bp_device_properties, name) + 5})
      properties_with_size(c, sz);
    c.note("no byte written past struct_size for 6 smaller sizes");
  });

  b.add("properties_large_struct", [](Context& c) {
    // A newer host passes a larger struct: the plugin fills what it knows and leaves the rest.
    properties_with_size(c, sizeof(bp_device_properties) + 128);
  });
}

}  // namespace bpc
