// Native handles and external memory over the plugin ABI's minor-2 slots (Note [Native
// handles] in plugin_abi.h): Buffer::native, Stream::native_handle, Device::import_buffer and
// Device::import_stream.
#include "runtime/device_state.hpp"

#include <cstdio>
#include <exception>

namespace bp {

NativeBuffer Buffer::native(uint64_t offset) const {
  return detail::state(*device_).native_of(static_cast<bp_buffer*>(handle_), size_, offset);
}

namespace detail {

namespace {

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// The bp_release_fn core hands to buffer_import: runs the user's function (once, as the plugin
// promises) and frees it. An exception cannot cross the plugin's C frames, so it is reported.
void run_release(void* ctx) noexcept {
  std::unique_ptr<std::function<void()>> fn(static_cast<std::function<void()>*>(ctx));
  try {
    (*fn)();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "backplane: the release function of imported memory threw: %s\n",
                 e.what());
  } catch (...) {
    std::fprintf(stderr, "backplane: the release function of imported memory threw\n");
  }
}

}  // namespace

void DeviceState::no_native_slot(const char* slot, const char* what, bool in_table) const {
  const bp_plugin_api* a = api;
  std::string abi = std::to_string(a->abi_major) + "." + std::to_string(a->abi_minor);
  std::string why = in_table ? "leaves the optional slot " + std::string(slot) + " NULL"
                             : "implements plugin ABI " + abi + " (table of " +
                                   std::to_string(a->struct_size) + " bytes), which has no " +
                                   slot + " slot (added in ABI 1.2)";
  throw UnsupportedError(self->str() + ": " + what + " is not supported: plugin '" +
                         self->backend_name() + "' (" + plugin.path + ") " + why);
}

NativeBuffer DeviceState::native_of(bp_buffer* handle, uint64_t size, uint64_t offset) {
  auto fn = plugin.native.buffer_native;
  if (!fn)
    no_native_slot("buffer_native", "a native buffer address",
                   BP_API_HAS_SLOT(api, 2, buffer_native));
  if (offset > size)
    throw ShapeError(self->str() + ": native address of byte " + std::to_string(offset) +
                     " asked of a buffer of " + std::to_string(size) + " bytes (valid: 0 to " +
                     std::to_string(size) + ")");
  if (!handle) {
    // A 0-byte allocation may have a NULL handle: nothing to point at, but the consumer still
    // needs the device. Ask the plugin once about a small buffer of ours.
    std::call_once(native_identity_once, [&] {
      std::shared_ptr<Buffer> probe = allocate(64, {});
      NativeBuffer n = native_of(detail::handle(*probe), probe->size(), 0);
      native_identity = {nullptr, n.device_ordinal, n.dlpack_device_type};
    });
    return native_identity;
  }
  bp_native_buffer out{};
  out.struct_size = sizeof out;
  check(api, fn(handle, offset, &out), "buffer_native", self);
  return {out.address, out.device_ordinal, out.dlpack_device_type};
}

void* DeviceState::stream_native(bp_stream* s) {
  auto fn = plugin.native.stream_native;
  if (!fn)
    no_native_slot("stream_native", "a native stream handle",
                   BP_API_HAS_SLOT(api, 2, stream_native));
  void* out = nullptr;
  check(api, fn(s, &out), "stream_native", self);
  return out;
}

}  // namespace detail

using detail::Access;
using detail::DeviceState;

std::shared_ptr<Buffer> Device::import_buffer(void* address, uint64_t size,
                                              std::function<void()> release) {
  if (!release) return import_buffer(address, size, nullptr, nullptr);
  auto ctx = std::make_unique<std::function<void()>>(std::move(release));
  std::shared_ptr<Buffer> buf = import_buffer(address, size, &detail::run_release, ctx.get());
  (void)ctx.release();  // the plugin calls run_release, which frees it
  return buf;
}

std::shared_ptr<Buffer> Device::import_buffer(void* address, uint64_t size, ReleaseFn release,
                                              void* release_ctx) {
  DeviceState& st = *state_;
  auto fn = st.plugin.native.buffer_import;
  if (!fn)
    st.no_native_slot("buffer_import", "importing external memory",
                      BP_API_HAS_SLOT(st.api, 2, buffer_import));
  if (!address && size != 0)
    throw DeviceError(str() + ": import_buffer: the address is NULL for " + std::to_string(size) +
                      " bytes (only an empty buffer may have a NULL address)");
  // Allocated first: once the plugin holds the release, nothing here may throw (the contract
  // is that a throw leaves the memory, and the release, with the caller).
  std::shared_ptr<Buffer> buf = Access::unarmed_import(*this);
  bp_buffer* h = nullptr;
  bp_error* err = fn(index(), address, size, release, release ? release_ctx : nullptr, &h);
  if (err)
    detail::throw_plugin_error(
        st.api, err,
        str() + ": import_buffer of " + std::to_string(size) + " bytes at " + detail::hex(address),
        /*invalid_is_device_error=*/true);
  Access::arm_import(*buf, *this, h, size);
  return buf;
}

std::unique_ptr<Stream> Device::import_stream(void* native_stream) {
  DeviceState& st = *state_;
  auto fn = st.plugin.native.stream_import;
  if (!fn)
    st.no_native_slot("stream_import", "importing a native stream",
                      BP_API_HAS_SLOT(st.api, 2, stream_import));
  bp_stream* h = nullptr;
  bp_error* err = fn(index(), native_stream, &h);
  if (err)
    detail::throw_plugin_error(st.api, err,
                               str() + ": import_stream of " + detail::hex(native_stream),
                               /*invalid_is_device_error=*/true);
  try {
    return Access::make_stream(*this, h, /*imported=*/true);
  } catch (...) {
    if (bp_error* e = st.api->stream_destroy(h)) st.api->error_free(e);
    throw;
  }
}

void* Stream::native_handle() const {
  return detail::state(*device_).stream_native(state_->s);
}

}  // namespace bp
