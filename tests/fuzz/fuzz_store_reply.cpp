// libFuzzer target: the TCP store client's reply parser (bp::dist::wire::parse_reply, Note [TCP
// store protocol] in core/src/dist/dist_store.cpp), as a client reads what a broken or hostile
// server sends.
//
// Input: one byte choosing the reply kind (ack, counter, maybe, values, hello), one byte giving
// the keys a GET asked for (0-255), then the bytes the "server" sent.
// Oracle: a complete reply writes back to exactly the bytes consumed and carries what its kind
// promises (a GET's values: as many as asked; its missing keys: 1 to as many as asked); an
// incomplete one asks for more bytes than it had; a malformed one says why. Nothing is
// allocated from a length before it is checked (-malloc_limit_mb in run_fuzz.sh).
#include "dist/store_wire.hpp"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

namespace w = bp::dist::wire;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

std::string write_back(w::ReplyKind kind, const w::Reply& r) {
  w::Writer out;
  switch (kind) {
    case w::ReplyKind::ack:
    case w::ReplyKind::hello:
      out.u8(r.status);
      break;
    case w::ReplyKind::counter:
      out.i64(r.counter);
      break;
    case w::ReplyKind::maybe:
      out.u8(r.status);
      if (r.status) out.str(r.values.at(0));
      break;
    case w::ReplyKind::values:
      out.u8(r.status);
      if (r.status) out.u32(static_cast<uint32_t>(r.values.size()));
      for (const auto& v : r.values) out.str(v);
      break;
  }
  return out.b;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  auto kind = static_cast<w::ReplyKind>(data[0] % 5);
  size_t count = data[1];
  std::string_view in(reinterpret_cast<const char*>(data) + 2, size - 2);
  w::Reply rep;
  w::Result r = w::parse_reply(in, kind, count, rep);
  if (r.status == w::Status::incomplete) {
    check(r.need > in.size());
    return 0;
  }
  if (r.status == w::Status::malformed) {
    check(!r.why.empty());
    return 0;
  }
  check(r.consumed > 0 && r.consumed <= in.size());
  check(write_back(kind, rep) == in.substr(0, r.consumed));
  if (kind == w::ReplyKind::values)
    check(rep.status == 0 ? rep.values.size() == count
                          : !rep.values.empty() && rep.values.size() <= count);
  if (kind == w::ReplyKind::ack) check(rep.status == 0);
  if (kind == w::ReplyKind::hello) check(rep.status <= 1);
  return 0;
}
