// The exception hierarchy of the public C++ API. Every message names what was wrong (the op,
// the devices, the shapes, the file and key) and, where one exists, what would be right.
#pragma once

#include <backplane/export.hpp>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace bp {

// Base of every error Backplane throws.
class BP_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A device string that does not parse, or names a device that does not exist; a backend that
// is not available (the message quotes the reason from the load report).
class BP_API DeviceError : public Error {
 public:
  using Error::Error;
};

// Operands of one op live on different devices. Never resolved by a silent copy.
class BP_API DeviceMismatch : public Error {
 public:
  using Error::Error;
};

// A device allocation failed after the backend trimmed its caches and retried once.
class BP_API OutOfMemory : public Error {
 public:
  using Error::Error;
};

// A plugin failed to load or initialise, or returned an error from a call. native_name()
// carries the vendor's error name when there is one ("cudaErrorInvalidValue").
class BP_API PluginError : public Error {
 public:
  PluginError(const std::string& what, std::string native_name = "")
      : Error(what), native_name_(std::move(native_name)) {}
  const std::string& native_name() const noexcept { return native_name_; }

 private:
  std::string native_name_;
};

// Work that failed on the device after the call that queued it returned (a kernel fault, an
// index found out of range on the device), thrown by the next synchronisation or host read of
// its stream, or by the op itself under BACKPLANE_LAUNCH_BLOCKING=1 (Note [Asynchronous
// errors] in plugin_abi.h). The message names the op that failed, its dtype, device and
// shapes, what the backend reported and where it was found; op() is "" when the backend could
// not say which op failed and more than one was queued since the stream's last
// synchronisation (the message then lists them).
class BP_API AsyncError : public PluginError {
 public:
  // How far the failure reaches: one op's outputs, every later op of its stream until the
  // error was reported, or the whole device (DeviceLost).
  enum class Severity { op_failed, stream_poisoned, device_lost };
  AsyncError(const std::string& what, std::string native_name, Severity severity,
             std::string device, std::string op, uint64_t op_id)
      : PluginError(what, std::move(native_name)),
        severity_(severity),
        device_(std::move(device)),
        op_(std::move(op)),
        op_id_(op_id) {}
  Severity severity() const noexcept { return severity_; }
  const std::string& device() const noexcept { return device_; }  // "cuda:0"
  const std::string& op() const noexcept { return op_; }          // "gather", or ""
  uint64_t op_id() const noexcept { return op_id_; }              // per device; 0: not known

 private:
  Severity severity_;
  std::string device_;
  std::string op_;
  uint64_t op_id_;
};

// The device can run nothing more in this process (a sticky CUDA error such as
// cudaErrorIllegalAddress). Thrown where the loss was found and then, fast, by every later call
// on that device; bp::on_device_lost (runtime.hpp) lets a server exit cleanly.
class BP_API DeviceLost : public AsyncError {
 public:
  using AsyncError::AsyncError;
};

// An op that the device's backend does not implement for that dtype; the message names the
// devices that do.
class BP_API UnsupportedError : public Error {
 public:
  using Error::Error;
};

// Shapes that do not fit the op (broadcast, matmul, reshape, a model's parameter).
class BP_API ShapeError : public Error {
 public:
  using Error::Error;
};

// An index outside the range it addresses (an embedding index past the table), naming the
// index and the size.
class BP_API IndexError : public Error {
 public:
  using Error::Error;
};

// Dtypes that do not fit the op, or an unknown dtype name.
class BP_API DTypeError : public Error {
 public:
  using Error::Error;
};

// A file that cannot be read or written, or whose contents are malformed; a bad config file.
class BP_API IOError : public Error {
 public:
  using Error::Error;
};

// Work that cannot be captured in a graph (a host read, a synchronisation, an allocation
// outside the graph's pool, a copy from pageable memory, ...) queued while a capture is open
// on the device, or a second capture begun on it (graph.hpp). The message names the op and the
// device; the op did nothing and the capture stays open.
class BP_API CaptureError : public Error {
 public:
  using Error::Error;
};

// An implicit device-to-host synchronisation while BACKPLANE_SYNC_DEBUG=error.
class BP_API SyncError : public Error {
 public:
  using Error::Error;
};

}  // namespace bp
