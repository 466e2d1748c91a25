// Internal: the TCP store's wire format (Note [TCP store protocol] in dist_store.cpp) as pure
// functions over bytes, shared by the server, the client and the fuzz targets (tests/fuzz).
//
// Every parser reads from a byte range that may hold a partial message, bounds every length
// and count before it allocates, and answers complete (with the bytes consumed), incomplete
// (with the total the range must reach before another try is worthwhile) or malformed (with
// the reason). Nothing throws but std::bad_alloc.
#pragma once

#include <backplane/export.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bp::dist::wire {

enum Op : uint8_t {
  kSet = 1,
  kGet = 2,
  kTryGet = 3,
  kAdd = 4,
  kErase = 5,
  kOnDisconnect = 6,
  kLeave = 7,
  kHello = 8,
};

// Limits (Note [Store limits] in dist_store.cpp).
inline constexpr uint32_t kMaxKey = 64u << 10;                    // bytes of one key
inline constexpr uint32_t kMaxValue = 256u << 20;                 // bytes of one value
inline constexpr uint32_t kMaxKeys = 1u << 20;                    // keys of one GET or ERASE
inline constexpr size_t kMaxRequest = (256u << 20) + (1u << 20);  // bytes of one request
inline constexpr uint32_t kMaxSecret = 1024;                      // bytes of the HELLO secret
inline constexpr size_t kMinSecret = 16;  // characters of an acceptable secret

enum class Status { complete, incomplete, malformed };

struct Result {
  Status status = Status::incomplete;
  size_t consumed = 0;  // complete: bytes of the message
  size_t need = 0;      // incomplete: the range must hold at least this many bytes
  std::string why;      // malformed: what was wrong
};

struct Request {
  Op op = kLeave;
  std::string key, value;         // SET, TRY_GET, ADD, ON_DISCONNECT, HELLO (value = secret)
  std::vector<std::string> keys;  // GET, ERASE
  uint32_t timeout_ms = 0;        // GET
  int64_t delta = 0;              // ADD
};

// One request from the start of `in`.
BP_API Result parse_request(std::string_view in, Request& out);

// What the client expects back for the request it sent.
enum class ReplyKind {
  ack,      // u8 0 (SET, ERASE, ON_DISCONNECT, LEAVE, HELLO)
  counter,  // i64 (ADD)
  maybe,    // u8 found, [value] (TRY_GET)
  values,   // u8 0 + `count` values | u8 1 + m <= count missing keys (GET)
  hello,    // u8 0 (accepted) | u8 1 (refused) (HELLO)
};

struct Reply {
  uint8_t status = 0;               // ack, maybe (found), values (0 found, 1 missing)
  int64_t counter = 0;              // counter
  std::vector<std::string> values;  // maybe (one, when found), values (values or missing keys)
};

// One reply from the start of `in` to a request expecting `kind` (`count`: keys asked by GET).
BP_API Result parse_reply(std::string_view in, ReplyKind kind, size_t count, Reply& out);

// Writers of the same format.
struct Writer {
  std::string b;
  void u8(uint8_t v) { b.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void i64(int64_t v) {
    auto u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  }
  void str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    b.append(s);
  }
};

}  // namespace bp::dist::wire
