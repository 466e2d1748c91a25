// libFuzzer target: bp::safetensors::parse on arbitrary bytes (Note [Hostile files] in
// serialize.hpp). Any input must either parse or throw bp::IOError: no crash, no read outside
// the buffer (AddressSanitizer), no other exception, no huge allocation (libFuzzer's
// -rss_limit_mb and -malloc_limit_mb). A file that parses must survive a round trip through
// build_header with the same entries.
#include <backplane/serialize.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = std::as_bytes(std::span<const uint8_t>(data, size));
  bp::safetensors::Header h;
  try {
    h = bp::safetensors::parse(file, "fuzz");
  } catch (const bp::IOError&) {
    return 0;
  }
  check(h.data_start() + h.data_bytes == size);
  uint64_t covered = 0;
  for (const auto& t : h.tensors) {
    check(t.begin <= t.end && t.end <= h.data_bytes);
    covered += t.end - t.begin;
  }
  check(covered == h.data_bytes);
  std::string rebuilt = bp::safetensors::build_header(h.tensors, h.metadata);
  check(rebuilt.size() % 8 == 0);
  bp::safetensors::Header again = bp::safetensors::parse_header(rebuilt, h.data_bytes, "rebuilt");
  check(again.tensors.size() == h.tensors.size() && again.metadata == h.metadata);
  for (size_t k = 0; k < h.tensors.size(); ++k) {
    const auto &a = h.tensors[k], &b = again.tensors[k];
    check(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.begin == b.begin &&
          a.end == b.end);
  }
  return 0;
}
