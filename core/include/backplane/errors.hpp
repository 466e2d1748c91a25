// The exception hierarchy of the public C++ API. Every message names what was wrong (the op,
// the devices, the shapes, the file and key) and, where one exists, what would be right.
#pragma once

#include <backplane/export.hpp>
#include <stdexcept>
#include <string>

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
