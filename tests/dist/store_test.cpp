// The TCP store against hostile peers (Note [Store limits] in core/src/dist/dist_store.cpp):
// crafted and random bytes, connections without the secret, a client that stops reading, and a
// server whose replies break (the client must close its connection).
#include <backplane/dist_store.hpp>

#include <backplane_test/child.hpp>
#include <backplane_test/seed.hpp>

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <tuple>

namespace {

namespace d = bp::dist;
using std::chrono::milliseconds;

std::string u32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}
std::string str(const std::string& s) {
  return u32(static_cast<uint32_t>(s.size())) + s;
}
std::string hello(const std::string& secret) {
  return std::string("\x08", 1) + str(secret);
}

// A raw connection to 127.0.0.1:port.
struct Raw {
  int fd = -1;
  struct Adopt {};
  Raw(int accepted, Adopt) : fd(accepted) {}
  explicit Raw(int port) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) ADD_FAILURE() << "connect";
  }
  ~Raw() { ::close(fd); }
  void send(const std::string& b) const {
    size_t off = 0;
    while (off < b.size()) {
      ssize_t n = ::send(fd, b.data() + off, b.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;  // the server may already have dropped us
      off += static_cast<size_t>(n);
    }
  }
  // Reads until `n` bytes came or the peer closed; what came.
  std::string read(size_t n) const {
    std::string out;
    char buf[65536];
    while (out.size() < n) {
      ssize_t got = ::recv(fd, buf, std::min(sizeof buf, n - out.size()), 0);
      if (got <= 0) break;
      out.append(buf, static_cast<size_t>(got));
    }
    return out;
  }
  // True when the server closed this connection (reads to the end).
  bool closed_by_server() const {
    char buf[4096];
    for (;;) {
      ssize_t got = ::recv(fd, buf, sizeof buf, 0);
      if (got == 0) return true;
      if (got < 0) return errno == ECONNRESET;
    }
  }
};

// The server is alive and serves an authenticated client correctly.
void expect_serving(int port, const std::string& secret, const std::string& tag) {
  d::TcpStore ok("127.0.0.1", port, milliseconds(5000), secret);
  ok.set("alive/" + tag, tag);
  EXPECT_EQ(ok.get("alive/" + tag, milliseconds(5000)), tag);
  EXPECT_EQ(ok.add("alive/counter", 2) % 2, 0);
}

TEST(StoreHostile, CraftedCountsDropTheClientNeverTheServer) {
  std::string secret = d::generate_store_secret();
  d::TcpStoreServer server("127.0.0.1", 0, secret);
  // The review's nine bytes: GET with a count of 2^32-1, before and after authenticating.
  {
    Raw r(server.port());
    r.send(std::string("\x02", 1) + u32(1000) + u32(0xffffffffu));
    EXPECT_TRUE(r.closed_by_server());
  }
  EXPECT_EQ(server.counters().rejected, 1u);
  const std::string crafted[] = {
      std::string("\x02", 1) + u32(1000) + u32(0xffffffffu),  // GET, 2^32-1 keys
      std::string("\x05", 1) + u32(0x7fffffffu),              // ERASE, 2^31-1 keys
      std::string("\x01", 1) + u32(0xfffffff0u),              // SET, a 4 GiB key
      std::string("\x01", 1) + str("k") + u32(0x40000000u),   // SET, a 1 GiB value
      std::string("\x09", 1),                                 // no such request
  };
  uint64_t dropped = 0;
  for (const auto& bytes : crafted) {
    Raw r(server.port());
    r.send(hello(secret));
    ASSERT_EQ(r.read(1), std::string("\0", 1));
    r.send(bytes);
    EXPECT_TRUE(r.closed_by_server()) << "request byte " << int(bytes[0]);
    EXPECT_EQ(server.counters().dropped, ++dropped);
  }
  expect_serving(server.port(), secret, "crafted");
}

TEST(StoreHostile, RandomBytesWithAndWithoutTheSecret) {
  uint64_t seed = bp_test::test_seed("bp_dist_tests");
  std::mt19937_64 rng(seed);
  std::string secret = d::generate_store_secret();
  d::TcpStoreServer server("127.0.0.1", 0, secret);
  for (int i = 0; i < 40; ++i) {
    std::string bytes(std::uniform_int_distribution<size_t>(1, 4096)(rng), '\0');
    for (auto& b : bytes) b = static_cast<char>(rng());
    if (i % 4 == 0) bytes[0] = "\x02\x05\x01\x06"[i / 4 % 4];  // a request byte, random counts
    Raw r(server.port());
    if (i % 2) {
      r.send(hello(secret));
      ASSERT_EQ(r.read(1), std::string("\0", 1));
    }
    r.send(bytes);
  }
  expect_serving(server.port(), secret, "random");
  EXPECT_GE(server.counters().rejected, 1u) << "seed " << seed;
}

TEST(StoreHostile, ConnectionsWithoutTheSecretAreDroppedAndCounted) {
  std::string secret = d::generate_store_secret();
  d::TcpStoreServer server("127.0.0.1", 0, secret);
  {
    Raw r(server.port());  // a well-formed SET, but no HELLO first
    r.send(std::string("\x01", 1) + str("bp/g0/rdzv/claim/1") + str("1"));
    EXPECT_TRUE(r.closed_by_server());
  }
  try {
    d::TcpStore wrong("127.0.0.1", server.port(), milliseconds(5000), d::generate_store_secret());
    ADD_FAILURE() << "a wrong secret was accepted";
  } catch (const d::RendezvousError& e) {
    EXPECT_NE(std::string(e.what()).find("refused this process's secret"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(server.counters().rejected, 2u);
  d::TcpStore ok("127.0.0.1", server.port(), milliseconds(5000), secret);
  EXPECT_FALSE(ok.try_get("bp/g0/rdzv/claim/1").has_value());  // the SET was never applied
  try {
    d::TcpStoreServer weak("127.0.0.1", 0, "short");
    ADD_FAILURE() << "a 5-byte secret was accepted";
  } catch (const d::RendezvousError& e) {
    EXPECT_NE(std::string(e.what()).find("it needs 16 to 1024"), std::string::npos) << e.what();
  }
}

// A client that pipelines requests and stops reading their replies (64 MiB of them) must not
// hold up anyone else: the others are served while its replies wait, and it still gets every
// byte of them, in order, once it reads.
TEST(StoreHostile, ASlowReaderStallsOnlyItself) {
  uint64_t seed = bp_test::test_seed("bp_dist_tests");
  std::mt19937_64 rng(seed);
  std::string secret = d::generate_store_secret();
  d::TcpStoreServer server("127.0.0.1", 0, secret);
  std::string big(1 << 20, '\0');
  for (auto& c : big) c = static_cast<char>(rng());
  d::TcpStore writer("127.0.0.1", server.port(), milliseconds(5000), secret);
  writer.set("big", big);
  Raw slow(server.port());
  slow.send(hello(secret));
  ASSERT_EQ(slow.read(1), std::string("\0", 1));
  const int kRequests = 64;
  std::string requests;
  for (int i = 0; i < kRequests; ++i) requests += std::string("\x03", 1) + str("big");
  slow.send(requests);
  for (int i = 0; i < 20; ++i)
    expect_serving(server.port(), secret, "while-slow-" + std::to_string(i));
  EXPECT_EQ(server.counters().dropped, 0u);
  std::string expect_one = std::string("\x01", 1) + str(big);
  for (int i = 0; i < kRequests; ++i)
    ASSERT_EQ(slow.read(expect_one.size()), expect_one) << "reply " << i << ", seed " << seed;
}

// A fake store that accepts the handshake, then answers the first request with a reply whose
// value claims 2 GiB. The client must throw, close the connection (F7: a late or broken reply
// must never be read as a later request's), and fail every later call without sending.
TEST(StoreHostile, TheClientClosesItsConnectionAfterABrokenReply) {
  int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(lfd, 4), 0);
  socklen_t len = sizeof a;
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  std::string secret = d::generate_store_secret();
  bool closed_after_error = false;
  std::string second_request;
  std::thread fake([&] {
    Raw peer(::accept(lfd, nullptr, nullptr), Raw::Adopt{});
    peer.read(hello(secret).size());
    peer.send(std::string("\0", 1));
    peer.read(1 + 4 + 1);                                  // TRY_GET "k"
    peer.send(std::string("\x01", 1) + u32(0x80000000u));  // found, a 2 GiB value
    peer.send(std::string("\x01", 1) + str("stale"));      // what a desynchronised client reads
    closed_after_error = peer.closed_by_server();
  });
  d::TcpStore client("127.0.0.1", port, milliseconds(5000), secret);
  try {
    client.try_get("k");
    ADD_FAILURE() << "a 2 GiB value was accepted";
  } catch (const d::RendezvousError& e) {
    EXPECT_NE(std::string(e.what()).find("malformed reply: value of 2147483648 bytes"),
              std::string::npos)
        << e.what();
  }
  try {
    client.try_get("k");
    ADD_FAILURE() << "the broken connection was used again";
  } catch (const d::RendezvousError& e) {
    EXPECT_NE(std::string(e.what()).find("closed after an earlier failure"), std::string::npos)
        << e.what();
  }
  fake.join();
  ::close(lfd);
  EXPECT_TRUE(closed_after_error);
}

// A live two-rank group on loopback under store_attack.py: the store hosted by bp-run, then by
// rank 0 (--init tcp://...). The group must finish with every result right.
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::pair<int, std::string> shell(const std::string& cmd) {
  const bp_test::ChildResult c = bp_test::run_command(cmd);
  return {c.exit_code(), c.output};
}

class StoreAttack : public ::testing::TestWithParam<std::string> {};

TEST_P(StoreAttack, ALiveTwoRankGroupIsUnharmed) {
  std::string init;
  if (GetParam() == "rank0") init = "--init tcp://127.0.0.1:" + std::to_string(free_port()) + " ";
  auto [status, out] =
      shell(std::string("BACKPLANE_DIST_TIMEOUT=120 BP_TEST_SEED=") +
            std::to_string(bp_test::test_seed("bp_dist_tests")) + " " + BP_RUN + " -n 2 " + init +
            BP_DIST_RANK + " attacked --script " + BP_STORE_ATTACK);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("store_attack: every attack refused"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 0] rank 0: attacked:"), std::string::npos) << out;
  EXPECT_NE(out.find("0 failed"), std::string::npos) << out;
  EXPECT_EQ(out.find("FAIL "), std::string::npos) << out;
}

// bp-run's own arguments and output forwarding (issue 28 A7, A8, l).
TEST(BpRunHostile, GraceAndTimeoutAreValidatedWithTheAcceptedRange) {
  auto [status, out] = shell(std::string(BP_RUN) + " -n 1 --grace abc true");  // once 0 s
  EXPECT_EQ(status, 2) << out;
  EXPECT_NE(out.find("--grace needs a number of seconds >= 0 and <= 3600, got 'abc'"),
            std::string::npos)
      << out;
  std::tie(status, out) = shell(std::string(BP_RUN) + " -n 1 --timeout inf true");
  EXPECT_EQ(status, 2) << out;
  EXPECT_NE(out.find("--timeout needs a number of seconds > 0"), std::string::npos) << out;
  std::tie(status, out) = shell(std::string(BP_RUN) + " -n 1 --init bogus://x true");
  EXPECT_EQ(status, 2) << out;
  EXPECT_NE(out.find("--init needs tcp://host:port or file:///absolute/dir"), std::string::npos)
      << out;
}

// Once: one 300 KB line held whole (300 MB took 883 MB and 59 s), '\r' progress shown only at
// the next newline.
TEST(BpRunHostile, OutputIsForwardedInBoundedPiecesAndCarriageReturnsEndLines) {
  auto [status, out] =
      shell(std::string(BP_RUN) + " -n 1 sh -c \"head -c 300000 /dev/zero | tr '\\\\0' a\"");
  ASSERT_EQ(status, 0) << out.substr(0, 200);
  size_t pieces = 0, as = 0, start = 0;
  for (size_t nl; (nl = out.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string line = out.substr(start, nl - start);
    ASSERT_EQ(line.rfind("[rank 0] ", 0), 0u) << line.substr(0, 40);
    EXPECT_LE(line.size(), 9u + 65536u);
    as += std::count(line.begin() + 9, line.end(), 'a');  // after "[rank 0] "
    ++pieces;
  }
  EXPECT_EQ(as, 300000u);
  EXPECT_GE(pieces, 5u);
  std::tie(status, out) = shell(std::string(BP_RUN) + " -n 1 printf 'one\\rtwo\\r\\nthree\\n'");
  EXPECT_EQ(out, "[rank 0] one\r[rank 0] two\r\n[rank 0] three\n");
}

// Once: "bp-run: pipe: Too many open files" left the ranks already started running (15 of 30).
TEST(BpRunHostile, NoRankIsOrphanedWhenPipesRunOut) {
  const std::string tag = "31." + std::to_string(::getpid());  // a sleep nobody else runs
  auto [status, out] =
      shell("bash -c 'ulimit -n 40; " + std::string(BP_RUN) + " -n 30 sleep " + tag + "'");
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("stopping the"), std::string::npos) << out;
  auto [pg, left] = shell("pgrep -f 'slee[p] " + tag + "' | wc -l");  // [p]: not this shell
  EXPECT_EQ(std::stoi(left), 0) << "ranks left running after bp-run exited";
}

INSTANTIATE_TEST_SUITE_P(Hosts, StoreAttack, ::testing::Values("bprun", "rank0"),
                         [](const auto& info) { return info.param; });

}  // namespace
