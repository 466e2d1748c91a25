// The test harness of bp-conformance, as the suites see it: test cases, the per-group context
// over one plugin's bp_plugin_api table, error checking, RAII device buffers with guard bytes.
//
// Everything here talks to the plugin through its C table only (never through core's Device
// classes), so a result proves the plugin itself. One group (suite x device) runs in one
// child process (Note [Child processes] in conformance_runner.cpp); nothing here is shared
// between threads except where a function says so.
#pragma once

#include <backplane/abi/plugin_abi.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace bpc {

// The outcome of one test. Order is the report order of the summary.
enum class Status { pass, fail, skip, unsupported, xfail, xpass };
const char* status_name(Status s);       // "PASS", "FAIL", ...
const char* status_json_name(Status s);  // "pass", "fail", ...
bool parse_status(const std::string& s, Status* out);

// Thrown by a test body: the test failed with this message.
class Failure : public std::runtime_error {
 public:
  explicit Failure(const std::string& what) : std::runtime_error(what) {}
};

// Thrown by a test body: the test does not apply here (the message says why).
class Skipped : public std::runtime_error {
 public:
  explicit Skipped(const std::string& what) : std::runtime_error(what) {}
};

// printf-style formatting into a std::string.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// "BP_ERROR_OUT_OF_MEMORY", or "code 42" for an unknown value.
std::string error_code_name(int32_t code);

// Describes an error object ("BP_ERROR_UNSUPPORTED: <message> [plugin cpu, native X]") and
// frees it with api->error_free. NULL gives "".
std::string take_error(const bp_plugin_api* api, bp_error* err);

// True when the table is large enough for, and declares, the minor-1 slot list_ops (Note
// [ABI versioning] in plugin_abi.h: a slot past struct_size or newer than abi_minor is never
// read).
bool has_list_ops(const bp_plugin_api* api);
// True when the table is of minor >= 2 and covers the minor-2 slots: launch takes bp_attr
// arrays with ids (Note [Attribute ids]), find_kernel_id may be read.
bool has_minor2(const bp_plugin_api* api);
// True when has_minor2 and find_kernel_id is set.
bool has_find_kernel_id(const bp_plugin_api* api);

class Context;

// One test. `body` throws Failure or Skipped; returning normally is a pass, with
// Context::note() as its message. Tests with support == BP_SUPPORT_NO have no body and are
// reported as unsupported with `reason`.
struct TestCase {
  std::string suite;   // "kernels"
  std::string test;    // "add_broadcast"
  std::string device;  // "cpu:0", or the device type for plugin-level tests
  std::string dtype;   // "f32" or ""
  int32_t support = BP_SUPPORT_YES;
  std::string reason;  // declared reason for BP_SUPPORT_NO / BP_SUPPORT_EXPECTED_FAIL
  std::function<void(Context&)> body;

  // "kernels.add_broadcast[cpu:0,f32]"
  std::string name() const;
};

// The state a group's tests share: the plugin table, the device under test, a default stream.
class Context {
 public:
  Context(const bp_plugin_api* api, std::string plugin_path, int32_t device,
          std::string device_label, uint64_t seed);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const bp_plugin_api* api() const { return api_; }
  const bp_plugin_api& t() const { return *api_; }
  const std::string& plugin_path() const { return plugin_path_; }
  // Device index under test, or -1 for plugin-level groups.
  int32_t device() const { return device_; }
  const std::string& device_label() const { return device_label_; }
  // Base seed of this run (printed in failure messages so a run can be repeated).
  uint64_t seed() const { return seed_; }
  // A seed for one test, derived from the base seed and the test's name.
  uint64_t seed_for(const std::string& test_name) const;

  // The group's stream, created on first use and destroyed with the context.
  bp_stream* stream();
  // Synchronises and destroys the group's stream now and refuses to create another: used
  // before calling the plugin's shutdown slot, after which nothing may call the plugin.
  void close_for_shutdown();
  // A message to attach to the current test's PASS line (appended, "; "-separated).
  void note(const std::string& text);
  std::string take_note();

  // Throws Failure("<what>: <error>") when err is not NULL (and frees it).
  void check(bp_error* err, const std::string& what) const;
  // The launch slot with `attrs` laid out as the plugin's minor expects (Note [Attribute ids]
  // in plugin_abi.h: bp_attr_minor1 arrays for minor 0 and 1), as a host does.
  bp_error* launch(bp_kernel* k, bp_stream* s, const bp_tensor_desc* ins, int32_t nin,
                   const bp_tensor_desc* outs, int32_t nout, const std::vector<bp_attr>& attrs);
  void sync(bp_stream* s) const;  // stream_synchronize, checked

 private:
  const bp_plugin_api* api_;
  std::string plugin_path_;
  int32_t device_;
  std::string device_label_;
  uint64_t seed_;
  bp_stream* stream_ = nullptr;
  bool closed_ = false;
  std::string note_;
};

// An owning device allocation, freed (stream-ordered) on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Context& ctx, uint64_t size, bp_stream* stream = nullptr);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  bp_buffer* get() const { return buf_; }
  uint64_t size() const { return size_; }
  // Frees now; errors are a test failure.
  void release();

 private:
  Context* ctx_ = nullptr;
  bp_stream* stream_ = nullptr;
  bp_buffer* buf_ = nullptr;
  uint64_t size_ = 0;
};

// Position-dependent guard pattern; byte i of every guard region is guard_byte(i).
uint8_t guard_byte(uint64_t i);

// A device allocation of `payload` bytes with kGuard guard bytes on either side. The whole
// buffer is written with the guard pattern on construction; offset() is where the payload
// starts. check() reads the whole buffer back and fails naming `what` if a guard byte changed.
class GuardedBuffer {
 public:
  static constexpr uint64_t kGuard = 64;
  GuardedBuffer() = default;
  GuardedBuffer(Context& ctx, uint64_t payload, bp_stream* stream = nullptr);

  bp_buffer* get() const { return buf_.get(); }
  uint64_t offset() const { return kGuard; }
  uint64_t payload() const { return payload_; }
  // Reads the buffer (synchronising the stream), checks both guards, returns the payload.
  std::vector<uint8_t> read_checked(const std::string& what);

 private:
  Context* ctx_ = nullptr;
  bp_stream* stream_ = nullptr;
  DeviceBuffer buf_;
  uint64_t payload_ = 0;
};

// Host memory with guard bytes around it, for d2h destinations.
class GuardedHost {
 public:
  static constexpr size_t kGuard = 64;
  explicit GuardedHost(size_t payload);
  uint8_t* data() { return bytes_.data() + kGuard; }
  size_t size() const { return payload_; }
  // Fails naming `what` when a guard byte changed.
  void check(const std::string& what) const;

 private:
  std::vector<uint8_t> bytes_;
  size_t payload_;
};

// A test case builder for one suite and device label.
class SuiteBuilder {
 public:
  SuiteBuilder(std::vector<TestCase>& out, std::string suite, std::string device)
      : out_(out), suite_(std::move(suite)), device_(std::move(device)) {}
  TestCase& add(const std::string& test, std::function<void(Context&)> body,
                const std::string& dtype = "");
  TestCase& unsupported(const std::string& test, const std::string& dtype,
                        const std::string& reason);

 private:
  std::vector<TestCase>& out_;
  std::string suite_, device_;
};

}  // namespace bpc
