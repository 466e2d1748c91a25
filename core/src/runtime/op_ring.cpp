// The host's record of queued work (Note [Op ring] in op_ring.hpp).
#include "runtime/op_ring.hpp"

#include <algorithm>

namespace bp::detail {

namespace {
constexpr auto kRelaxed = std::memory_order_relaxed;
constexpr uint64_t kCut = 15;  // a tensor whose shape did not fit

std::string shape_text(const std::atomic<uint64_t>* dims, unsigned rank) {
  std::string s = "[";
  for (unsigned i = 0; i < rank; ++i) {
    if (i) s += ',';
    s += std::to_string(static_cast<int64_t>(dims[i].load(kRelaxed)));
  }
  return s + ']';
}
}  // namespace

std::string OpRecord::name() const {
  switch (kind) {
    case OpKind::launch:
      return std::string(op_name(op));
    case OpKind::memset:
      return "memset";
    case OpKind::h2d:
      return "copy host->device";
    case OpKind::d2h:
      return "copy device->host";
    case OpKind::d2d:
      return "copy device->device";
    case OpKind::peer:
      return "peer copy";
    case OpKind::graph:
      return "graph replay";
  }
  return "?";
}

std::string OpRecord::describe() const {
  if (kind == OpKind::launch)
    return name() + " (" + std::string(dtype_name(dtype)) + ", inputs " + inputs + ", outputs " +
           outputs + ")";
  if (kind == OpKind::graph) return name();
  return name() + " of " + std::to_string(bytes) + " bytes";
}

void OpRing::put_launch(uint64_t id, const void* stream, Op op, DType dtype,
                        std::span<const bp_tensor_desc> in,
                        std::span<const bp_tensor_desc> out) noexcept {
  Slot& s = slots_[id % kSlots];
  s.id.store(0, kRelaxed);
  std::atomic_thread_fence(std::memory_order_release);
  s.stream.store(reinterpret_cast<uint64_t>(stream), kRelaxed);
  const uint64_t nin = std::min<size_t>(in.size(), 255), nout = std::min<size_t>(out.size(), 255);
  s.head.store(static_cast<uint64_t>(OpKind::launch) | static_cast<uint64_t>(op) << 8 |
                   static_cast<uint64_t>(dtype) << 24 | nin << 32 | nout << 40,
               kRelaxed);
  uint64_t ranks = 0;
  size_t w = 0, t = 0;
  auto keep = [&](const bp_tensor_desc& d) {
    if (t >= 16) return;
    const auto rank = static_cast<size_t>(std::clamp(d.rank, 0, BP_MAX_RANK));
    if (w + rank > kDimWords) {
      ranks |= kCut << (4 * t++);
      return;
    }
    for (size_t i = 0; i < rank; ++i)
      s.dims[w++].store(static_cast<uint64_t>(d.shape[i]), kRelaxed);
    ranks |= static_cast<uint64_t>(rank) << (4 * t++);
  };
  for (const bp_tensor_desc& d : in) keep(d);
  for (const bp_tensor_desc& d : out) keep(d);
  s.ranks.store(ranks, kRelaxed);
  s.id.store(id, std::memory_order_release);
}

void OpRing::put_transfer(uint64_t id, const void* stream, OpKind kind, uint64_t bytes) noexcept {
  Slot& s = slots_[id % kSlots];
  s.id.store(0, kRelaxed);
  std::atomic_thread_fence(std::memory_order_release);
  s.stream.store(reinterpret_cast<uint64_t>(stream), kRelaxed);
  s.head.store(static_cast<uint64_t>(kind), kRelaxed);
  s.ranks.store(bytes, kRelaxed);
  s.id.store(id, std::memory_order_release);
}

bool OpRing::read(const Slot& s, uint64_t id, OpRecord& out) const {
  if (id == 0 || s.id.load(std::memory_order_acquire) != id) return false;
  OpRecord r;
  r.id = id;
  r.stream = reinterpret_cast<const void*>(s.stream.load(kRelaxed));
  const uint64_t head = s.head.load(kRelaxed), ranks = s.ranks.load(kRelaxed);
  r.kind = static_cast<OpKind>(head & 0xff);
  if (r.kind == OpKind::launch) {
    r.op = static_cast<Op>((head >> 8) & 0xffff);
    r.dtype = static_cast<DType>((head >> 24) & 0xff);
    const unsigned nin = (head >> 32) & 0xff, nout = (head >> 40) & 0xff;
    size_t w = 0;
    for (unsigned t = 0; t < nin + nout; ++t) {
      std::string& list = t < nin ? r.inputs : r.outputs;
      if (!list.empty()) list += ", ";
      const uint64_t rank = t < 16 ? (ranks >> (4 * t)) & 0xf : kCut;
      if (rank == kCut) {
        list += "[...]";
        continue;
      }
      list += shape_text(&s.dims[w], static_cast<unsigned>(rank));
      w += rank;
    }
    if (r.inputs.empty()) r.inputs = "none";
    if (r.outputs.empty()) r.outputs = "none";
  } else {
    r.bytes = ranks;
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  if (s.id.load(kRelaxed) != id) return false;  // rewritten while read
  out = std::move(r);
  return true;
}

bool OpRing::get(uint64_t id, OpRecord& out) const {
  return read(slots_[id % kSlots], id, out);
}

std::vector<OpRecord> OpRing::on_stream(const void* stream, uint64_t after, uint64_t upto) const {
  std::vector<OpRecord> found;
  const uint64_t first = std::max(after + 1, upto >= kSlots ? upto - kSlots + 1 : 1);
  for (uint64_t id = first; id <= upto; ++id) {
    OpRecord r;
    if (read(slots_[id % kSlots], id, r) && r.stream == stream) found.push_back(std::move(r));
  }
  return found;
}

}  // namespace bp::detail
