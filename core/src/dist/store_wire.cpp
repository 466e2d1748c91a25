// The TCP store's wire format (store_wire.hpp).
#include "dist/store_wire.hpp"

namespace bp::dist::wire {

namespace {

// Reads fields from the start of a range; the first field that does not fit or is out of bounds
// sets the result and stops every later read.
struct Reader {
  explicit Reader(std::string_view in) : b(in) {}
  std::string_view b;
  size_t pos = 0;
  Result r;
  bool ok = true;

  bool short_of(size_t n) {
    if (b.size() - pos >= n) return false;
    r.status = Status::incomplete;
    r.need = pos + n;
    ok = false;
    return true;
  }
  bool fail(std::string why) {
    r.status = Status::malformed;
    r.why = std::move(why);
    ok = false;
    return false;
  }
  bool u8(uint8_t& v) {
    if (!ok || short_of(1)) return false;
    v = static_cast<uint8_t>(b[pos++]);
    return true;
  }
  bool u32(uint32_t& v) {
    if (!ok || short_of(4)) return false;
    v = 0;
    for (int i = 0; i < 4; ++i)
      v |= static_cast<uint32_t>(static_cast<uint8_t>(b[pos + i])) << (8 * i);
    pos += 4;
    return true;
  }
  bool i64(int64_t& v) {
    if (!ok || short_of(8)) return false;
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i)
      u |= static_cast<uint64_t>(static_cast<uint8_t>(b[pos + i])) << (8 * i);
    v = static_cast<int64_t>(u);
    pos += 8;
    return true;
  }
  // A u32 length, checked against `max` before anything is allocated, then the bytes.
  bool str(std::string& s, uint32_t max, const char* what) {
    uint32_t n = 0;
    if (!u32(n)) return false;
    if (n > max)
      return fail(std::string(what) + " of " + std::to_string(n) + " bytes (at most " +
                  std::to_string(max) + ")");
    if (short_of(n)) return false;
    s.assign(b.substr(pos, n));
    pos += n;
    return true;
  }
  // A u32 count of strings of at most `max` bytes each, `limit` strings at most. Each string
  // takes at least 4 bytes, so a count the request size cannot hold is refused before the
  // strings are looked for; the vector grows only with strings that arrived.
  bool strs(std::vector<std::string>& v, uint32_t max, uint32_t limit, size_t max_bytes,
            const char* what) {
    uint32_t n = 0;
    if (!u32(n)) return false;
    if (n > limit || static_cast<uint64_t>(n) * 4 > max_bytes)
      return fail(std::to_string(n) + " " + what + " (at most " + std::to_string(limit) + ")");
    v.clear();
    for (uint32_t i = 0; i < n; ++i) {
      std::string s;
      if (!str(s, max, what)) return false;
      v.push_back(std::move(s));
    }
    return true;
  }
  Result done() {
    if (ok) {
      r.status = Status::complete;
      r.consumed = pos;
    }
    return r;
  }
};

}  // namespace

Result parse_request(std::string_view in, Request& out) {
  Reader r(in);
  uint8_t op = 0;
  if (!r.u8(op)) return r.done();
  out.op = static_cast<Op>(op);
  switch (op) {
    case kSet:
    case kOnDisconnect:
      r.str(out.key, kMaxKey, "key") && r.str(out.value, kMaxValue, "value");
      break;
    case kGet:
      r.u32(out.timeout_ms) && r.strs(out.keys, kMaxKey, kMaxKeys, kMaxRequest, "keys");
      break;
    case kTryGet:
      r.str(out.key, kMaxKey, "key");
      break;
    case kAdd:
      r.str(out.key, kMaxKey, "key") && r.i64(out.delta);
      break;
    case kErase:
      r.strs(out.keys, kMaxKey, kMaxKeys, kMaxRequest, "keys");
      break;
    case kLeave:
      break;
    case kHello:
      r.str(out.value, kMaxSecret, "secret");
      break;
    default:
      r.fail("unknown request " + std::to_string(op));
  }
  if (r.ok && r.pos > kMaxRequest) r.fail("a request of " + std::to_string(r.pos) + " bytes");
  if (r.r.status == Status::incomplete && r.r.need > kMaxRequest)
    r.fail("a request of more than " + std::to_string(kMaxRequest) + " bytes");
  return r.done();
}

Result parse_reply(std::string_view in, ReplyKind kind, size_t count, Reply& out) {
  Reader r(in);
  out.values.clear();
  switch (kind) {
    case ReplyKind::ack:
      if (r.u8(out.status) && out.status != 0)
        r.fail("status " + std::to_string(out.status) + " where 0 was expected");
      break;
    case ReplyKind::counter:
      r.i64(out.counter);
      break;
    case ReplyKind::hello:
      if (r.u8(out.status) && out.status > 1)
        r.fail("status " + std::to_string(out.status) + " where 0 or 1 was expected");
      break;
    case ReplyKind::maybe:
      if (!r.u8(out.status)) break;
      if (out.status > 1) {
        r.fail("status " + std::to_string(out.status) + " where 0 or 1 was expected");
      } else if (out.status == 1) {
        std::string v;
        if (r.str(v, kMaxValue, "value")) out.values.push_back(std::move(v));
      }
      break;
    case ReplyKind::values:
      if (!r.u8(out.status)) break;
      if (out.status == 0) {
        for (size_t i = 0; i < count && r.ok; ++i) {
          std::string v;
          if (r.str(v, kMaxValue, "value")) out.values.push_back(std::move(v));
        }
      } else if (out.status == 1) {
        uint32_t m = 0;
        if (!r.u32(m)) break;
        if (m == 0 || m > count) {
          r.fail(std::to_string(m) + " missing keys of the " + std::to_string(count) + " asked");
          break;
        }
        for (uint32_t i = 0; i < m && r.ok; ++i) {
          std::string k;
          if (r.str(k, kMaxKey, "key")) out.values.push_back(std::move(k));
        }
      } else {
        r.fail("status " + std::to_string(out.status) + " where 0 or 1 was expected");
      }
      break;
  }
  return r.done();
}

}  // namespace bp::dist::wire
