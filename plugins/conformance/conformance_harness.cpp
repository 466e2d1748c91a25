#include "conformance_harness.hpp"

#include <backplane/abi/error.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <utility>

namespace bpc {

const char* status_name(Status s) {
  switch (s) {
    case Status::pass:
      return "PASS";
    case Status::fail:
      return "FAIL";
    case Status::skip:
      return "SKIP";
    case Status::unsupported:
      return "UNSUPPORTED";
    case Status::xfail:
      return "XFAIL";
    case Status::xpass:
      return "XPASS";
  }
  return "?";
}

const char* status_json_name(Status s) {
  switch (s) {
    case Status::pass:
      return "pass";
    case Status::fail:
      return "fail";
    case Status::skip:
      return "skip";
    case Status::unsupported:
      return "unsupported";
    case Status::xfail:
      return "xfail";
    case Status::xpass:
      return "xpass";
  }
  return "?";
}

bool parse_status(const std::string& s, Status* out) {
  for (Status st : {Status::pass, Status::fail, Status::skip, Status::unsupported, Status::xfail,
                    Status::xpass}) {
    if (s == status_name(st)) {
      *out = st;
      return true;
    }
  }
  return false;
}

std::string format(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string s(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(s.data(), s.size() + 1, fmt, ap2);
  va_end(ap2);
  return s;
}

std::string error_code_name(int32_t code) {
  const char* name = bp_error_code_name(code);
  return name ? name : format("code %d", static_cast<int>(code));
}

std::string take_error(const bp_plugin_api* api, bp_error* err) {
  if (!err) return "";
  std::string s =
      error_code_name(err->code) + ": " + (err->message ? err->message : "(NULL message)");
  std::string extra;
  if (err->plugin && *err->plugin) extra += std::string("plugin ") + err->plugin;
  if (err->native_name && *err->native_name)
    extra += (extra.empty() ? "" : ", ") + std::string("native ") + err->native_name;
  if (!extra.empty()) s += " [" + extra + "]";
  if (api && api->error_free) api->error_free(err);
  return s;
}

bool has_list_ops(const bp_plugin_api* api) {
  return api->abi_minor >= 1 && api->struct_size >= BP_API_MINOR1_OFFSET + sizeof(api->list_ops) &&
         api->list_ops != nullptr;
}

bool has_minor2(const bp_plugin_api* api) {
  return api->abi_minor >= 2 &&
         api->struct_size >= BP_API_MINOR2_OFFSET + sizeof(api->find_kernel_id);
}

bool has_find_kernel_id(const bp_plugin_api* api) {
  return has_minor2(api) && api->find_kernel_id != nullptr;
}

bp_error* Context::launch(bp_kernel* k, bp_stream* s, const bp_tensor_desc* ins, int32_t nin,
                          const bp_tensor_desc* outs, int32_t nout,
                          const std::vector<bp_attr>& attrs) {
  const bp_attr* pass = attrs.empty() ? nullptr : attrs.data();
  std::vector<bp_attr_minor1> legacy;
  if (!has_minor2(api_) && !attrs.empty()) {
    for (const bp_attr& a : attrs)
      legacy.push_back({sizeof(bp_attr_minor1), a.name, a.kind, a.i, a.f});
    pass = reinterpret_cast<const bp_attr*>(legacy.data());
  }
  return api_->launch(k, s, ins, nin, outs, nout, pass, static_cast<int32_t>(attrs.size()));
}

std::string TestCase::name() const {
  std::string n = suite + "." + test + "[" + device;
  if (!dtype.empty()) n += "," + dtype;
  return n + "]";
}

Context::Context(const bp_plugin_api* api, std::string plugin_path, int32_t device,
                 std::string device_label, uint64_t seed)
    : api_(api),
      plugin_path_(std::move(plugin_path)),
      device_(device),
      device_label_(std::move(device_label)),
      seed_(seed) {}

Context::~Context() {
  if (stream_) {
    take_error(api_, api_->stream_synchronize(stream_));
    take_error(api_, api_->stream_destroy(stream_));
  }
}

uint64_t Context::seed_for(const std::string& test_name) const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : test_name) h = (h ^ c) * 1099511628211ull;
  return h ^ seed_;
}

void Context::close_for_shutdown() {
  if (stream_) {
    bp_stream* s = std::exchange(stream_, nullptr);
    check(api_->stream_synchronize(s), "stream_synchronize");
    check(api_->stream_destroy(s), "stream_destroy");
  }
  closed_ = true;
}

bp_stream* Context::stream() {
  if (closed_) throw Failure("internal: the plugin was shut down; no stream may be created");
  if (!stream_) {
    if (device_ < 0) throw Failure("internal: plugin-level test asked for a stream");
    check(api_->stream_create(device_, &stream_), format("stream_create(%d)", device_));
    if (!stream_) throw Failure(format("stream_create(%d) succeeded but returned NULL", device_));
  }
  return stream_;
}

void Context::note(const std::string& text) {
  if (!note_.empty()) note_ += "; ";
  note_ += text;
}

std::string Context::take_note() {
  return std::exchange(note_, std::string());
}

void Context::check(bp_error* err, const std::string& what) const {
  if (err) throw Failure(what + " failed: " + take_error(api_, err));
}

void Context::sync(bp_stream* s) const {
  check(api_->stream_synchronize(s), "stream_synchronize");
}

DeviceBuffer::DeviceBuffer(Context& ctx, uint64_t size, bp_stream* stream)
    : ctx_(&ctx), stream_(stream ? stream : ctx.stream()), size_(size) {
  ctx.check(ctx.t().mem_alloc(ctx.device(), stream_, size, &buf_),
            format("mem_alloc(%llu bytes)", static_cast<unsigned long long>(size)));
  if (!buf_ && size > 0)
    throw Failure(format("mem_alloc(%llu bytes) succeeded but returned a NULL buffer",
                         static_cast<unsigned long long>(size)));
}

DeviceBuffer::~DeviceBuffer() {
  if (ctx_ && buf_)
    take_error(ctx_->api(), ctx_->t().mem_free(ctx_->device(), stream_, buf_, size_));
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ctx_(o.ctx_), stream_(o.stream_), buf_(o.buf_), size_(o.size_) {
  o.buf_ = nullptr;
  o.ctx_ = nullptr;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ctx_ && buf_)
      take_error(ctx_->api(), ctx_->t().mem_free(ctx_->device(), stream_, buf_, size_));
    ctx_ = o.ctx_;
    stream_ = o.stream_;
    buf_ = o.buf_;
    size_ = o.size_;
    o.buf_ = nullptr;
    o.ctx_ = nullptr;
  }
  return *this;
}

void DeviceBuffer::release() {
  if (ctx_ && buf_) {
    bp_buffer* b = std::exchange(buf_, nullptr);
    ctx_->check(ctx_->t().mem_free(ctx_->device(), stream_, b, size_),
                format("mem_free(%llu bytes)", static_cast<unsigned long long>(size_)));
  }
}

uint8_t guard_byte(uint64_t i) {
  return static_cast<uint8_t>(0xA7u + 61u * (i % 251u));
}

GuardedBuffer::GuardedBuffer(Context& ctx, uint64_t payload, bp_stream* stream)
    : ctx_(&ctx),
      stream_(stream ? stream : ctx.stream()),
      buf_(ctx, payload + 2 * kGuard, stream_),
      payload_(payload) {
  std::vector<uint8_t> pattern(payload + 2 * kGuard);
  for (uint64_t i = 0; i < pattern.size(); ++i) pattern[i] = guard_byte(i);
  ctx.check(ctx.t().copy_h2d(stream_, buf_.get(), 0, pattern.data(), pattern.size()),
            "copy_h2d (guard pattern)");
  ctx.sync(stream_);
}

std::vector<uint8_t> GuardedBuffer::read_checked(const std::string& what) {
  std::vector<uint8_t> all(payload_ + 2 * kGuard);
  ctx_->check(ctx_->t().copy_d2h(stream_, all.data(), buf_.get(), 0, all.size()),
              "copy_d2h (read back " + what + ")");
  ctx_->sync(stream_);
  for (uint64_t i = 0; i < kGuard; ++i) {
    if (all[i] != guard_byte(i))
      throw Failure(
          format("%s: guard byte %llu before the region was overwritten (0x%02x, "
                 "expected 0x%02x)",
                 what.c_str(), static_cast<unsigned long long>(kGuard - i), all[i], guard_byte(i)));
    uint64_t j = kGuard + payload_ + i;
    if (all[j] != guard_byte(j))
      throw Failure(
          format("%s: wrote past the end: guard byte %llu after the %llu-byte region "
                 "was overwritten (0x%02x, expected 0x%02x)",
                 what.c_str(), static_cast<unsigned long long>(i),
                 static_cast<unsigned long long>(payload_), all[j], guard_byte(j)));
  }
  return std::vector<uint8_t>(all.begin() + kGuard, all.begin() + kGuard + payload_);
}

GuardedHost::GuardedHost(size_t payload) : bytes_(payload + 2 * kGuard), payload_(payload) {
  for (size_t i = 0; i < bytes_.size(); ++i) bytes_[i] = guard_byte(i);
}

void GuardedHost::check(const std::string& what) const {
  for (size_t i = 0; i < kGuard; ++i) {
    if (bytes_[i] != guard_byte(i))
      throw Failure(format("%s: host guard byte %zu before the destination was overwritten",
                           what.c_str(), kGuard - i));
    size_t j = kGuard + payload_ + i;
    if (bytes_[j] != guard_byte(j))
      throw Failure(
          format("%s: wrote past the end of the %zu-byte host destination (guard "
                 "byte %zu after it changed from 0x%02x to 0x%02x)",
                 what.c_str(), payload_, i, guard_byte(j), bytes_[j]));
  }
}

TestCase& SuiteBuilder::add(const std::string& test, std::function<void(Context&)> body,
                            const std::string& dtype) {
  TestCase tc;
  tc.suite = suite_;
  tc.test = test;
  tc.device = device_;
  tc.dtype = dtype;
  tc.body = std::move(body);
  out_.push_back(std::move(tc));
  return out_.back();
}

TestCase& SuiteBuilder::unsupported(const std::string& test, const std::string& dtype,
                                    const std::string& reason) {
  TestCase tc;
  tc.suite = suite_;
  tc.test = test;
  tc.device = device_;
  tc.dtype = dtype;
  tc.support = BP_SUPPORT_NO;
  tc.reason = reason;
  out_.push_back(std::move(tc));
  return out_.back();
}

}  // namespace bpc
