// A stream's sticky error record for C++ backends (Note [Asynchronous errors] in
// plugin_abi.h): the first asynchronous failure of a stream, kept until the host clears it.
#ifndef BACKPLANE_SDK_FAULT_RECORD_HPP_
#define BACKPLANE_SDK_FAULT_RECORD_HPP_

#include <backplane/abi/plugin_abi.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace bp::sdk {

// One stream's record. Thread-safe; set() and read() take a small lock, failed() is one
// relaxed load for the hot paths that must refuse work on a poisoned stream.
class FaultRecord {
 public:
  // Keeps the first failure; a later one only raises the severity (and fills an unknown op
  // id). Returns true when this call set the record (it was empty).
  bool set(bp_fault_severity severity, bp_error_code code, uint64_t op_id,
           const std::string& message, const std::string& native = "") {
    std::lock_guard<std::mutex> lock(mu_);
    const bool first = rec_.severity == BP_FAULT_NONE;
    if (first) {
      rec_.code = code;
      rec_.op_id = op_id;
      std::snprintf(rec_.message, sizeof rec_.message, "%s", message.c_str());
      std::snprintf(rec_.native_name, sizeof rec_.native_name, "%s", native.c_str());
    } else if (!rec_.op_id) {
      rec_.op_id = op_id;
    }
    if (severity > rec_.severity) rec_.severity = severity;
    severity_.store(rec_.severity, std::memory_order_release);
    return first;
  }
  // Copies another record (a poisoned event's) into this one, at least at `floor` severity.
  void merge(const bp_stream_fault& other, bp_fault_severity floor) {
    if (other.severity == BP_FAULT_NONE) return;
    const auto sev = static_cast<bp_fault_severity>(
        other.severity > static_cast<int32_t>(floor) ? other.severity : floor);
    set(sev, static_cast<bp_error_code>(other.code), other.op_id, other.message, other.native_name);
  }
  // The newest op known to have finished before the failure (0: not known).
  void set_last_completed(uint64_t op_id) {
    std::lock_guard<std::mutex> lock(mu_);
    if (rec_.severity == BP_FAULT_NONE) rec_.last_completed_op_id = op_id;
  }
  bp_fault_severity severity() const noexcept {
    return static_cast<bp_fault_severity>(severity_.load(std::memory_order_acquire));
  }
  bool failed() const noexcept { return severity_.load(std::memory_order_relaxed) != 0; }
  // The whole record (struct_size = sizeof); with `clear`, resets it unless the device is lost.
  bp_stream_fault read(bool clear) {
    std::lock_guard<std::mutex> lock(mu_);
    bp_stream_fault out = rec_;
    out.struct_size = sizeof out;
    if (clear && rec_.severity != BP_FAULT_DEVICE_LOST) {
      rec_ = bp_stream_fault{};
      severity_.store(BP_FAULT_NONE, std::memory_order_release);
    }
    return out;
  }

 private:
  mutable std::mutex mu_;
  bp_stream_fault rec_{};
  std::atomic<int32_t> severity_{BP_FAULT_NONE};
};

}  // namespace bp::sdk

#endif  // BACKPLANE_SDK_FAULT_RECORD_HPP_
