// libFuzzer target: the TCP store server's request parser (bp::dist::wire::parse_request, Note
// [Store limits] in core/src/dist/dist_store.cpp) on arbitrary bytes, request after request as
// the server reads them from one connection.
//
// Oracle: a complete request consumed some bytes, and writing it back gives exactly those bytes
// (so no length or count was misread), while every shorter prefix of them is incomplete; an
// incomplete parse asks for more bytes than it had and never more than a request may hold; a
// malformed one says why. Allocation stays within the limits (run_fuzz.sh sets
// -malloc_limit_mb: a count or length used before it is checked shows as a huge malloc).
#include "dist/store_wire.hpp"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

namespace w = bp::dist::wire;

namespace {

std::string write_back(const w::Request& q) {
  w::Writer out;
  out.u8(q.op);
  switch (q.op) {
    case w::kSet:
    case w::kOnDisconnect:
      out.str(q.key);
      out.str(q.value);
      break;
    case w::kGet:
      out.u32(q.timeout_ms);
      [[fallthrough]];
    case w::kErase:
      out.u32(static_cast<uint32_t>(q.keys.size()));
      for (const auto& k : q.keys) out.str(k);
      break;
    case w::kTryGet:
      out.str(q.key);
      break;
    case w::kAdd:
      out.str(q.key);
      out.i64(q.delta);
      break;
    case w::kHello:
      out.str(q.value);
      break;
    default:
      break;
  }
  return out.b;
}

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  while (!in.empty()) {
    w::Request q;
    w::Result r = w::parse_request(in, q);
    if (r.status == w::Status::incomplete) {
      check(r.need > in.size() && r.need <= w::kMaxRequest);
      break;
    }
    if (r.status == w::Status::malformed) {
      check(!r.why.empty());
      break;
    }
    check(r.consumed > 0 && r.consumed <= in.size());
    check(write_back(q) == in.substr(0, r.consumed));
    check(q.key.size() <= w::kMaxKey && q.keys.size() <= w::kMaxKeys);
    w::Request p;
    check(w::parse_request(in.substr(0, r.consumed - 1), p).status == w::Status::incomplete);
    in.remove_prefix(r.consumed);
  }
  return 0;
}
