// Internal: the host's record of the work it queued on a device, by op id (Note [Op ring]).
#pragma once

#include <backplane/abi/plugin_abi.h>
#include <backplane/dtype.hpp>
#include <backplane/ops.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace bp::detail {

// Note [Op ring]
//   Every launch, memset, copy and graph replay queued on a device gets an op id (unique per
//   device, increasing, never 0), handed to the plugin with op_begin (Note [Asynchronous
//   errors] in plugin_abi.h) and written with what it was (the stream, the op, its dtype and
//   its operands' shapes, or the copy's kind and size) into a ring of the device's last kSlots
//   ops. When work fails on the device the error then names the op that failed from the id the
//   plugin reports, or, for a plugin that reports none (ABI <= 1.5), lists the ops queued on the
//   stream since its last successful synchronisation. Writers claim ids with one atomic add and
//   write their slot as a sequence lock of relaxed atomic words, so the per-op cost is a few
//   stores and no lock; a reader (only on an error) checks the slot's id before and after
//   reading it and skips a slot rewritten meanwhile (an op more than kSlots ops old).
enum class OpKind : uint8_t { launch, memset, h2d, d2h, d2d, peer, graph };

// One op as read back from the ring.
struct OpRecord {
  uint64_t id = 0;
  const void* stream = nullptr;
  OpKind kind = OpKind::launch;
  Op op = Op::fill;
  DType dtype = DType::f32;
  uint64_t bytes = 0;           // copies and memsets
  std::string inputs, outputs;  // launches: "[4], [4]"; "none" when there are none
  // "mul", "copy device->host", "graph replay"
  std::string name() const;
  // "mul (f32, inputs [4], [4], outputs [4])", "copy device->host of 64 bytes"
  std::string describe() const;
};

class OpRing {
 public:
  static constexpr size_t kSlots = 256;
  static constexpr size_t kDimWords = 24;  // shape words kept per op; more are cut ("...")

  // The next op id of the device.
  uint64_t next_id() noexcept { return counter_.fetch_add(1, std::memory_order_relaxed) + 1; }
  // The newest id handed out so far (0: none).
  uint64_t last_id() const noexcept { return counter_.load(std::memory_order_relaxed); }

  void put_launch(uint64_t id, const void* stream, Op op, DType dtype,
                  std::span<const bp_tensor_desc> in, std::span<const bp_tensor_desc> out) noexcept;
  void put_transfer(uint64_t id, const void* stream, OpKind kind, uint64_t bytes) noexcept;

  // The op with this id, when it is still in the ring.
  bool get(uint64_t id, OpRecord& out) const;
  // The ops of `stream` with ids in (after, upto] still in the ring, oldest first.
  std::vector<OpRecord> on_stream(const void* stream, uint64_t after, uint64_t upto) const;

 private:
  struct Slot {
    std::atomic<uint64_t> id{0};  // 0 while being written
    std::atomic<uint64_t> stream{0};
    std::atomic<uint64_t> head{0};   // kind | op << 8 | dtype << 24 | nin << 32 | nout << 40
    std::atomic<uint64_t> ranks{0};  // 4 bits per kept tensor (15: cut); copies: bytes
    std::array<std::atomic<uint64_t>, kDimWords> dims{};
  };
  bool read(const Slot& s, uint64_t id, OpRecord& out) const;
  std::atomic<uint64_t> counter_{0};
  std::array<Slot, kSlots> slots_{};
};

}  // namespace bp::detail
