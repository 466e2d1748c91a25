// The rendezvous stores (Note [Why core has its own stores] in backplane/dist_store.hpp).
//
// Note [TCP store protocol]
//   One request, then one reply, at a time per connection (requests may be pipelined; replies
//   come in order); integers little-endian; a string is a u32 length and its bytes.
//     HELLO         secret                    -> u8 0 | u8 1 and the connection closes
//     SET           key value                 -> u8 0
//     GET           u32 timeout_ms, u32 n, keys  -> u8 0, n values | u8 1, u32 m, m missing keys
//     TRY_GET       key                       -> u8 found [value]
//     ADD           key i64 delta             -> i64 new value (stored as decimal text)
//     ERASE         u32 n, keys               -> u8 0
//     ON_DISCONNECT key value                 -> u8 0   (set key=value, unless it exists,
//                                                        if this connection closes before
//                                                        LEAVE)
//     LEAVE                                   -> u8 0
//   The first request of a connection is HELLO with the store's shared secret (Note [Store
//   limits]). The server answers a GET as soon as every key exists, or with the missing keys
//   when its timeout passes, so a client never waits on a reply that will not come; the client
//   bounds every read by a deadline of its own as well, in case the server's machine
//   disappears, and closes the connection after any reply that broke or did not come in time,
//   so a late reply is never read as the answer to a later request. The parsers are
//   store_wire.cpp's.
//
// Note [Store limits]
//   Anything that can reach the port may connect, so the server trusts nothing it reads:
//   - every length and count is bounded before it is used (store_wire.hpp: a key 64 KiB, a
//     value 256 MiB, 2^20 keys, a request 257 MiB), so a connection holds at most one request;
//   - a connection must send HELLO with the secret (compared in constant time) as its first
//     request, within 10 s; anything else, or a wrong secret, drops it and counts it
//     (counters().rejected). At most 64 connections wait for their HELLO; the oldest goes.
//   - replies are queued and written as the socket takes them, so a client that stops reading
//     stalls only itself: the server stops reading its requests while 16 MiB of replies wait,
//     and drops it when none of them leaves for 60 s;
//   - malformed bytes, an exception while serving a client (std::bad_alloc) or a timeout drop
//     that client (counters().dropped), never the server.
//   The secret keeps other local users and other hosts out of the rendezvous; it is not
//   encryption: on an untrusted network, run the group inside a private one.
#include <backplane/dist_store.hpp>

#include "dist/store_wire.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

namespace bp::dist {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using wire::Writer;

std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size(); ++i) s += (i ? ", " : "") + keys[i];
  return s;
}

std::string seconds_text(milliseconds t) {
  std::ostringstream os;
  os << static_cast<double>(t.count()) / 1000.0 << " s";
  return os.str();
}

[[noreturn]] void throw_missing(const std::string& store, const std::vector<std::string>& missing,
                                milliseconds timeout) {
  throw StoreTimeout("rendezvous store " + store + ": key(s) " + join_keys(missing) +
                     " did not appear within " + seconds_text(timeout));
}

int64_t parse_counter(const std::string& v, const std::string& key) {
  if (v.empty()) return 0;
  char* end = nullptr;
  long long n = std::strtoll(v.c_str(), &end, 10);
  if (*end)
    throw RendezvousError("rendezvous store: key '" + key + "' holds '" + v +
                          "', which is not a counter");
  return n;
}

// Writes everything or fails after `deadline`. MSG_NOSIGNAL: a closed peer is an error, not
// SIGPIPE.
bool write_all(int fd, const std::string& data, Clock::time_point deadline) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
      continue;
    }
    return false;
  }
  return true;
}

std::string errno_text(int e) {
  return std::strerror(e);
}

std::string address_text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  else if (sa->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  return buf;
}

}  // namespace

// ---- FileStore ------------------------------------------------------------------------------

FileStore::FileStore(std::string directory) : dir_(std::move(directory)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (!fs::is_directory(dir_, ec))
    throw RendezvousError("rendezvous store file://" + dir_ + ": cannot create the directory (" +
                          ec.message() + ")");
}

std::string FileStore::path_of(const std::string& key) const {
  static const char* hex = "0123456789abcdef";
  std::string name = "k_";
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.') {
      name.push_back(static_cast<char>(c));
    } else {
      name.push_back('%');
      name.push_back(hex[c >> 4]);
      name.push_back(hex[c & 15]);
    }
  }
  return dir_ + "/" + name;
}

void FileStore::set(const std::string& key, const std::string& value) {
  static std::atomic<uint64_t> counter{0};
  std::string final_path = path_of(key);
  std::string tmp =
      dir_ + "/t_" + std::to_string(::getpid()) + "_" + std::to_string(counter.fetch_add(1));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    if (!out) throw RendezvousError("rendezvous store " + describe() + ": cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), final_path.c_str()) != 0) {
    int e = errno;
    std::remove(tmp.c_str());
    throw RendezvousError("rendezvous store " + describe() + ": cannot rename to " + final_path +
                          " (" + errno_text(e) + ")");
  }
}

std::optional<std::string> FileStore::try_get(const std::string& key) {
  std::ifstream in(path_of(key), std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::vector<std::string> FileStore::get(const std::vector<std::string>& keys,
                                        milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  auto pause = milliseconds(1);
  std::vector<std::optional<std::string>> got(keys.size());
  for (;;) {
    std::vector<std::string> missing;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!got[i]) got[i] = try_get(keys[i]);
      if (!got[i]) missing.push_back(keys[i]);
    }
    if (missing.empty()) break;
    if (Clock::now() >= deadline) throw_missing(describe(), missing, timeout);
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, milliseconds(20));
  }
  std::vector<std::string> out;
  for (auto& g : got) out.push_back(std::move(*g));
  return out;
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  std::string lock_path = dir_ + "/l_" + path_of(key).substr(dir_.size() + 3);
  int fd = ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0)
    throw RendezvousError("rendezvous store " + describe() + ": cannot open " + lock_path + " (" +
                          errno_text(errno) + ")");
  while (::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
  }
  int64_t v = 0;
  try {
    v = parse_counter(try_get(key).value_or(""), key) + delta;
    set(key, std::to_string(v));
  } catch (...) {
    ::flock(fd, LOCK_UN);
    ::close(fd);
    throw;
  }
  ::flock(fd, LOCK_UN);
  ::close(fd);
  return v;
}

void FileStore::erase(const std::vector<std::string>& keys) {
  for (const auto& k : keys) std::remove(path_of(k).c_str());
}

std::unique_ptr<Store> FileStore::clone() const {
  return std::make_unique<FileStore>(dir_);
}

void FileStore::clear() {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    std::string n = e.path().filename().string();
    if (n.rfind("k_", 0) == 0 || n.rfind("l_", 0) == 0 || n.rfind("t_", 0) == 0)
      fs::remove(e.path(), ec);
  }
}

// ---- MemoryStore ----------------------------------------------------------------------------

struct MemoryStore::Shared {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::string> data;
};

MemoryStore::MemoryStore() : s_(std::make_shared<Shared>()) {}

void MemoryStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> l(s_->mu);
    s_->data[key] = value;
  }
  s_->cv.notify_all();
}

std::vector<std::string> MemoryStore::get(const std::vector<std::string>& keys,
                                          milliseconds timeout) {
  std::unique_lock<std::mutex> l(s_->mu);
  auto all = [&] {
    return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return s_->data.count(k); });
  };
  if (!s_->cv.wait_for(l, timeout, all)) {
    std::vector<std::string> missing;
    for (const auto& k : keys)
      if (!s_->data.count(k)) missing.push_back(k);
    throw_missing(describe(), missing, timeout);
  }
  std::vector<std::string> out;
  for (const auto& k : keys) out.push_back(s_->data[k]);
  return out;
}

std::optional<std::string> MemoryStore::try_get(const std::string& key) {
  std::lock_guard<std::mutex> l(s_->mu);
  auto it = s_->data.find(key);
  if (it == s_->data.end()) return std::nullopt;
  return it->second;
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t v;
  {
    std::lock_guard<std::mutex> l(s_->mu);
    v = parse_counter(s_->data[key], key) + delta;
    s_->data[key] = std::to_string(v);
  }
  s_->cv.notify_all();
  return v;
}

void MemoryStore::erase(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> l(s_->mu);
  for (const auto& k : keys) s_->data.erase(k);
}

std::unique_ptr<Store> MemoryStore::clone() const {
  return std::unique_ptr<Store>(new MemoryStore(s_));
}

// ---- TcpStoreServer -------------------------------------------------------------------------

namespace {
constexpr auto kHelloWithin = std::chrono::seconds(10);
constexpr auto kStalledReplies = std::chrono::seconds(60);
constexpr size_t kMaxQueuedReplies = 16u << 20;
constexpr size_t kMaxPendingHellos = 64;

// Equal without an early exit, so the time taken says nothing about where two secrets differ.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

std::string check_secret(std::string secret, const std::string& who) {
  if (secret.size() < wire::kMinSecret || secret.size() > wire::kMaxSecret)
    throw RendezvousError(who + ": the shared secret has " + std::to_string(secret.size()) +
                          " bytes; it needs " + std::to_string(wire::kMinSecret) + " to " +
                          std::to_string(wire::kMaxSecret) +
                          " (BACKPLANE_STORE_SECRET; bp-run generates one)");
  return secret;
}
}  // namespace

struct TcpStoreServer::Impl {
  struct Client {
    int fd = -1;
    bool authenticated = false;
    bool dead = false;
    Clock::time_point accepted;
    std::string in, out;
    size_t out_sent = 0;  // bytes at the front of `out` already written
    size_t need = 0;      // the unparsed bytes must reach this size before another parse
    size_t queued() const { return out.size() - out_sent; }
    Clock::time_point stalled_since;  // the first unwritten byte of `out` waits since then
    bool waiting = false;
    std::vector<std::string> wait_keys;
    Clock::time_point deadline;
    bool has_dc = false, left = false;
    std::string dc_key, dc_value;
  };

  std::string secret;
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  int port = 0;
  std::thread thread;
  std::map<std::string, std::string> data;
  std::vector<std::unique_ptr<Client>> clients;
  std::atomic<uint64_t> accepted{0}, rejected{0}, dropped{0};

  void run() {
    for (;;) {
      try {
        if (!step()) return;
      } catch (...) {
        // Only the loop's own bookkeeping can get here (a client's failure drops the client):
        // keep serving after a pause rather than spin.
        std::this_thread::sleep_for(milliseconds(10));
      }
    }
  }

  // One poll and what it found; false when asked to stop.
  bool step() {
    std::vector<pollfd> fds;
    fds.push_back({listen_fd, POLLIN, 0});
    fds.push_back({wake[0], POLLIN, 0});
    auto now = Clock::now();
    auto next = now + std::chrono::seconds(1);
    for (auto& c : clients) {
      short ev = 0;
      if (!c->waiting && c->queued() < kMaxQueuedReplies) ev |= POLLIN;
      if (c->queued() > 0) {
        ev |= POLLOUT;
        next = std::min(next, c->stalled_since + kStalledReplies);
      }
      if (c->waiting) next = std::min(next, c->deadline);
      if (!c->authenticated) next = std::min(next, c->accepted + kHelloWithin);
      fds.push_back({c->fd, ev, 0});
    }
    auto ms = std::chrono::duration_cast<milliseconds>(next - now).count();
    int n = ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<int64_t>(ms + 1, 0, 1000)));
    if (n < 0 && errno != EINTR) {
      std::this_thread::sleep_for(milliseconds(10));
      return true;
    }
    if (fds[1].revents) return false;
    if (fds[0].revents & POLLIN) accept_clients();
    size_t polled = fds.size() - 2;
    for (size_t i = 0; i < polled && i < clients.size(); ++i) {
      Client& c = *clients[i];
      short re = fds[i + 2].revents;
      if (!re) continue;
      guarded(c, [&] {
        if (re & POLLOUT) flush(c);
        if (!c.dead && (re & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) && !read_client(c))
          c.dead = true;
      });
    }
    for (auto& c : clients) guarded(*c, [&] { serve(*c); });
    expire(Clock::now());
    sweep();
    return true;
  }

  // Runs `f` for one client; whatever it throws drops that client only.
  template <class F>
  void guarded(Client& c, F&& f) {
    if (c.dead) return;
    try {
      f();
    } catch (...) {
      c.dead = true;
      ++dropped;
    }
  }

  void accept_clients() {
    for (int k = 0; k < 64; ++k) {
      int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        // Out of descriptors: make room by dropping the oldest connection that has not
        // authenticated; else wait (the listening socket stays readable).
        if ((errno == EMFILE || errno == ENFILE) && !drop_oldest_pending())
          std::this_thread::sleep_for(milliseconds(10));
        return;
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto c = std::make_unique<Client>();
      c->fd = fd;
      c->accepted = Clock::now();
      clients.push_back(std::move(c));
      ++accepted;
      size_t pending = 0;
      for (auto& x : clients) pending += !x->authenticated && !x->dead;
      if (pending > kMaxPendingHellos) drop_oldest_pending();
    }
  }

  bool drop_oldest_pending() {
    for (auto& c : clients)
      if (!c->authenticated && !c->dead) {
        c->dead = true;
        ++rejected;
        return true;
      }
    return false;
  }

  // False when the connection closed or broke. Reads what is there, a bounded amount per pass.
  bool read_client(Client& c) {
    char buf[65536];
    for (size_t total = 0; total < (4u << 20);) {
      ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
      if (n > 0) {
        c.in.append(buf, static_cast<size_t>(n));
        total += static_cast<size_t>(n);
        if (n < static_cast<ssize_t>(sizeof buf)) return true;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
    return true;
  }

  // Writes what the socket takes now; the written front of `out` is dropped when it is all
  // written or larger than what is left (linear in the bytes, however slowly they leave).
  void flush(Client& c) {
    size_t before = c.out_sent;
    while (c.out_sent < c.out.size()) {
      ssize_t n = ::send(c.fd, c.out.data() + c.out_sent, c.out.size() - c.out_sent,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.out_sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      c.dead = true;
      break;
    }
    if (c.out_sent == before) return;
    c.stalled_since = Clock::now();
    if (c.out_sent == c.out.size()) {
      c.out.clear();
      c.out_sent = 0;
    } else if (c.out_sent > c.out.size() / 2) {
      c.out.erase(0, c.out_sent);
      c.out_sent = 0;
    }
  }

  void reply(Client& c, const Writer& w) {
    if (c.queued() == 0) c.stalled_since = Clock::now();
    c.out += w.b;
    flush(c);
  }

  bool keys_present(const std::vector<std::string>& keys) const {
    for (const auto& k : keys)
      if (!data.count(k)) return false;
    return true;
  }

  void answer_get(Client& c) {
    Writer w;
    w.u8(0);
    for (const auto& k : c.wait_keys) w.str(data[k]);
    c.waiting = false;
    c.wait_keys.clear();
    reply(c, w);
  }

  // Serves every complete request of a client.
  void serve(Client& c) {
    size_t pos = 0;
    while (!c.waiting && !c.dead && c.queued() < kMaxQueuedReplies) {
      std::string_view in(c.in);
      in.remove_prefix(pos);
      if (in.empty() || in.size() < c.need) break;
      if (!c.authenticated && static_cast<uint8_t>(in[0]) != wire::kHello) {
        c.dead = true;
        ++rejected;
        break;
      }
      wire::Request q;
      wire::Result r = wire::parse_request(in, q);
      if (r.status == wire::Status::incomplete) {
        c.need = r.need;
        if (!c.authenticated && r.need > 5 + wire::kMaxSecret)
          r.status = wire::Status::malformed;
        else
          break;
      }
      if (r.status == wire::Status::malformed) {
        c.dead = true;
        ++(c.authenticated ? dropped : rejected);
        break;
      }
      c.need = 0;
      pos += r.consumed;
      handle(c, q);
    }
    c.in.erase(0, pos);  // `need` counts from where the unparsed bytes start: still right
  }

  void handle(Client& c, wire::Request& q) {
    Writer w;
    if (!c.authenticated || q.op == wire::kHello) {
      bool ok = q.op == wire::kHello && same_secret(q.value, secret);
      if (!ok) ++rejected;  // counted before the refusal is sent: a client that reads it sees it
      w.u8(ok ? 0 : 1);
      reply(c, w);
      if (!ok) c.dead = true;
      c.authenticated = ok;
      return;
    }
    switch (q.op) {
      case wire::kSet:
        data[q.key] = std::move(q.value);
        w.u8(0);
        break;
      case wire::kGet:
        c.wait_keys = std::move(q.keys);
        c.waiting = true;
        c.deadline = Clock::now() + milliseconds(q.timeout_ms);
        if (keys_present(c.wait_keys)) answer_get(c);
        return;
      case wire::kTryGet: {
        auto it = data.find(q.key);
        w.u8(it != data.end());
        if (it != data.end()) w.str(it->second);
        break;
      }
      case wire::kAdd: {
        int64_t v = 0;
        auto it = data.find(q.key);
        if (it != data.end()) v = std::strtoll(it->second.c_str(), nullptr, 10);
        // Wraps like the two's-complement counter it is; never undefined behaviour.
        v = static_cast<int64_t>(static_cast<uint64_t>(v) + static_cast<uint64_t>(q.delta));
        data[q.key] = std::to_string(v);
        w.i64(v);
        break;
      }
      case wire::kErase:
        for (const auto& k : q.keys) data.erase(k);
        w.u8(0);
        break;
      case wire::kOnDisconnect:
        c.has_dc = true;
        c.left = false;
        c.dc_key = std::move(q.key);
        c.dc_value = std::move(q.value);
        w.u8(0);
        break;
      case wire::kLeave:
        c.left = true;
        w.u8(0);
        break;
      default:
        c.dead = true;
        ++dropped;
        return;
    }
    reply(c, w);
    if (q.op == wire::kSet || q.op == wire::kAdd) wake_waiters();
  }

  void wake_waiters() {
    for (auto& c : clients)
      if (!c->dead && c->waiting && keys_present(c->wait_keys))
        guarded(*c, [&] { answer_get(*c); });
  }

  // Answers GETs whose time is up; drops clients that never authenticated or stopped reading.
  void expire(Clock::time_point now) {
    for (auto& cp : clients) {
      Client& c = *cp;
      if (c.dead) continue;
      if (!c.authenticated && now - c.accepted >= kHelloWithin) {
        c.dead = true;
        ++rejected;
        continue;
      }
      if (c.queued() > 0 && now - c.stalled_since >= kStalledReplies) {
        c.dead = true;
        ++dropped;
        continue;
      }
      if (!c.waiting || c.deadline > now) continue;
      guarded(c, [&] {
        Writer w;
        w.u8(1);
        std::vector<std::string> missing;
        for (const auto& k : c.wait_keys)
          if (!data.count(k)) missing.push_back(k);
        w.u32(static_cast<uint32_t>(missing.size()));
        for (const auto& k : missing) w.str(k);
        c.waiting = false;
        c.wait_keys.clear();
        reply(c, w);
      });
    }
  }

  // Closes dead clients (setting their on-disconnect keys) and wakes whoever waits on those.
  void sweep() {
    bool any = false;
    for (size_t i = clients.size(); i-- > 0;) {
      Client& c = *clients[i];
      if (!c.dead) continue;
      if (c.has_dc && !c.left && !data.count(c.dc_key)) data[c.dc_key] = c.dc_value;
      ::close(c.fd);
      clients.erase(clients.begin() + static_cast<std::ptrdiff_t>(i));
      any = true;
    }
    if (any) wake_waiters();
  }
};

TcpStoreServer::TcpStoreServer(const std::string& host, int port, std::string secret)
    : impl_(new Impl) {
  impl_->secret = check_secret(std::move(secret), "TCP store");
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  hints.ai_family = AF_UNSPEC;
  bool any = host.empty() || host == "0.0.0.0" || host == "*";
  if (any) hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  std::string port_s = std::to_string(port);
  int rc = ::getaddrinfo(any ? nullptr : host.c_str(), port_s.c_str(), &hints, &res);
  if (rc != 0)
    throw RendezvousError("TCP store: cannot resolve '" + host + "': " + gai_strerror(rc));
  std::string last = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      last = errno_text(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      impl_->listen_fd = fd;
      break;
    }
    last = errno_text(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (impl_->listen_fd < 0)
    throw RendezvousError("TCP store: cannot listen on " + (any ? std::string("*") : host) + ":" +
                          port_s + ": " + last);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(impl_->listen_fd, reinterpret_cast<sockaddr*>(&ss), &len);
  impl_->port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (::pipe2(impl_->wake, O_CLOEXEC) != 0) {
    ::close(impl_->listen_fd);
    throw RendezvousError("TCP store: pipe2 failed: " + errno_text(errno));
  }
  impl_->thread = std::thread([p = impl_.get()] { p->run(); });
}

TcpStoreServer::~TcpStoreServer() {
  char c = 1;
  [[maybe_unused]] ssize_t n = ::write(impl_->wake[1], &c, 1);
  if (impl_->thread.joinable()) impl_->thread.join();
  for (auto& cl : impl_->clients) ::close(cl->fd);
  ::close(impl_->listen_fd);
  ::close(impl_->wake[0]);
  ::close(impl_->wake[1]);
}

int TcpStoreServer::port() const noexcept {
  return impl_->port;
}

TcpStoreServer::Counters TcpStoreServer::counters() const noexcept {
  return {impl_->accepted.load(), impl_->rejected.load(), impl_->dropped.load()};
}

std::string generate_store_secret() {
  unsigned char raw[16];
  size_t got = 0;
  while (got < sizeof raw) {
    ssize_t n = ::getrandom(raw + got, sizeof raw - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw RendezvousError("cannot generate a store secret: getrandom failed: " +
                            errno_text(errno));
    got += static_cast<size_t>(n);
  }
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char b : raw) {
    s.push_back(hex[b >> 4]);
    s.push_back(hex[b & 15]);
  }
  return s;
}

// ---- TcpStore (client) ----------------------------------------------------------------------

struct TcpStore::Conn {
  int fd = -1;
  std::mutex mu;
  std::string where;   // "tcp://host:port"
  std::string local;   // this side's address
  std::string in;      // bytes received and not yet parsed
  std::string failed;  // why the connection was closed

  ~Conn() {
    if (fd >= 0) ::close(fd);
  }

  // Closes the connection (F7: a late reply must never be read as a later request's) and
  // throws; every later call fails at once.
  [[noreturn]] void broken(const std::string& what) {
    if (fd >= 0) ::close(fd);
    fd = -1;
    in.clear();
    failed = what;
    throw RendezvousError("rendezvous store " + where + ": " + what);
  }

  void check_open() {
    if (fd < 0)
      throw RendezvousError("rendezvous store " + where +
                            ": this connection was closed after an earlier failure (" + failed +
                            ")");
  }

  void send_request(const Writer& w) {
    check_open();
    if (!write_all(fd, w.b, Clock::now() + std::chrono::seconds(30)))
      broken("sending a request failed: " + errno_text(errno));
  }

  // Reads one reply of `kind` before `deadline`.
  wire::Reply read_reply(wire::ReplyKind kind, size_t count, Clock::time_point deadline) {
    for (;;) {
      wire::Reply rep;
      wire::Result r = wire::parse_reply(in, kind, count, rep);
      if (r.status == wire::Status::complete) {
        in.erase(0, r.consumed);
        return rep;
      }
      if (r.status == wire::Status::malformed) broken("malformed reply: " + r.why);
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) broken("no reply in time");
      pollfd p{fd, POLLIN, 0};
      int pr = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
      if (pr < 0 && errno != EINTR) broken("poll failed: " + errno_text(errno));
      if (pr <= 0) continue;
      char buf[65536];
      size_t want = std::clamp<size_t>(r.need > in.size() ? r.need - in.size() : 1, 1, sizeof buf);
      ssize_t got = ::recv(fd, buf, want, 0);
      if (got == 0)
        broken(
            "the connection was closed (the process hosting the store — rank 0 or bp-run — has "
            "probably exited)");
      if (got < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        broken("receiving failed: " + errno_text(errno));
      }
      in.append(buf, static_cast<size_t>(got));
    }
  }
  void ack(Clock::time_point d) { read_reply(wire::ReplyKind::ack, 0, d); }
};

namespace {
Clock::time_point reply_deadline() {
  return Clock::now() + std::chrono::seconds(60);
}
}  // namespace

TcpStore::TcpStore(std::string host, int port, milliseconds connect_timeout, std::string secret)
    : host_(std::move(host)),
      port_(port),
      connect_timeout_(connect_timeout),
      secret_(check_secret(std::move(secret), "TCP store client")),
      conn_(std::make_unique<Conn>()) {
  conn_->where = describe();
  auto deadline = Clock::now() + connect_timeout;
  auto pause = milliseconds(10);
  std::string last = "no attempt";
  for (;;) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_family = AF_UNSPEC;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    std::string port_s = std::to_string(port_);
    int rc = ::getaddrinfo(host_.c_str(), port_s.c_str(), &hints, &res);
    if (rc != 0) {
      last = std::string("cannot resolve host: ") + gai_strerror(rc);
    } else {
      for (addrinfo* a = res; a && conn_->fd < 0; a = a->ai_next) {
        int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
          last = errno_text(errno);
          continue;
        }
        // Non-blocking connect bounded by the deadline: an unroutable address must not
        // block for the kernel's SYN timeout.
        ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
        int rc2 = ::connect(fd, a->ai_addr, a->ai_addrlen);
        if (rc2 != 0 && errno == EINPROGRESS) {
          auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
          pollfd p{fd, POLLOUT, 0};
          int pr = ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left, 1, 2000)));
          int soerr = 0;
          socklen_t sl = sizeof soerr;
          if (pr > 0 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0)
            rc2 = 0;
          else
            errno = pr == 0 ? ETIMEDOUT : (soerr ? soerr : errno);
        }
        if (rc2 == 0) {
          ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
          conn_->fd = fd;
        } else {
          last = errno_text(errno);
          ::close(fd);
        }
      }
      ::freeaddrinfo(res);
    }
    if (conn_->fd >= 0) break;
    if (Clock::now() + pause >= deadline)
      throw RendezvousError("could not reach the rendezvous store at " + describe() + " within " +
                            seconds_text(connect_timeout) + " (last error: " + last +
                            "); is rank 0 (or bp-run) running, and is BACKPLANE_INIT the same "
                            "on every rank?");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, milliseconds(200));
  }
  int one = 1;
  ::setsockopt(conn_->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(conn_->fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(conn_->fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0)
    conn_->local = address_text(reinterpret_cast<sockaddr*>(&ss));
  Writer w;
  w.u8(wire::kHello);
  w.str(secret_);
  conn_->send_request(w);
  wire::Reply rep;
  try {
    rep = conn_->read_reply(wire::ReplyKind::hello, 0, reply_deadline());
  } catch (const RendezvousError&) {
    if (conn_->failed.rfind("the connection was closed", 0) != 0) throw;
    conn_->broken("the store closed the connection at the handshake (is it a Backplane store?)");
  }
  if (rep.status != 0)
    conn_->broken(
        "the store refused this process's secret: BACKPLANE_STORE_SECRET must be the same for "
        "every rank and for whoever hosts the store");
}

TcpStore::~TcpStore() = default;

std::string TcpStore::describe() const {
  bool v6 = host_.find(':') != std::string::npos;
  return "tcp://" + (v6 ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_);
}

std::string TcpStore::local_address() const {
  return conn_->local;
}

void TcpStore::set(const std::string& key, const std::string& value) {
  Writer w;
  w.u8(wire::kSet);
  w.str(key);
  w.str(value);
  std::lock_guard<std::mutex> l(conn_->mu);
  conn_->send_request(w);
  conn_->ack(reply_deadline());
}

void TcpStore::set_many(const std::vector<std::pair<std::string, std::string>>& items) {
  if (items.empty()) return;
  Writer w;
  for (const auto& [k, v] : items) {
    w.u8(wire::kSet);
    w.str(k);
    w.str(v);
  }
  std::lock_guard<std::mutex> l(conn_->mu);
  conn_->send_request(w);  // the server answers the requests one by one, in order
  auto d = reply_deadline();
  for (size_t i = 0; i < items.size(); ++i) conn_->ack(d);
}

std::vector<int64_t> TcpStore::add_many(const std::vector<std::string>& keys, int64_t delta) {
  std::vector<int64_t> out;
  if (keys.empty()) return out;
  Writer w;
  for (const auto& k : keys) {
    w.u8(wire::kAdd);
    w.str(k);
    w.i64(delta);
  }
  std::lock_guard<std::mutex> l(conn_->mu);
  conn_->send_request(w);
  auto d = reply_deadline();
  for (size_t i = 0; i < keys.size(); ++i)
    out.push_back(conn_->read_reply(wire::ReplyKind::counter, 0, d).counter);
  return out;
}

std::vector<std::string> TcpStore::get(const std::vector<std::string>& keys, milliseconds timeout) {
  Writer w;
  w.u8(wire::kGet);
  int64_t t = std::clamp<int64_t>(timeout.count(), 0, 0x7fffffff);
  w.u32(static_cast<uint32_t>(t));
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  std::lock_guard<std::mutex> l(conn_->mu);
  conn_->send_request(w);
  auto deadline = Clock::now() + milliseconds(t) + std::chrono::seconds(60);
  wire::Reply rep = conn_->read_reply(wire::ReplyKind::values, keys.size(), deadline);
  if (rep.status == 0) return std::move(rep.values);
  throw_missing(describe(), rep.values, timeout);
}

std::optional<std::string> TcpStore::try_get(const std::string& key) {
  Writer w;
  w.u8(wire::kTryGet);
  w.str(key);
  std::lock_guard<std::mutex> l(conn_->mu);
  conn_->send_request(w);
  wire::Reply rep = conn_->read_reply(wire::ReplyKind::maybe, 0, reply_deadline());
  if (!rep.status) return std::nullopt;
  return std::move(rep.values[0]);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  Writer w;
  w.u8(wire::kAdd);
  w.str(key);
  w.i64(delta);
  std::lock_guard<std::mutex> l(conn_->mu);
  conn_->send_request(w);
  return conn_->read_reply(wire::ReplyKind::counter, 0, reply_deadline()).counter;
}

void TcpStore::erase(const std::vector<std::string>& keys) {
  Writer w;
  w.u8(wire::kErase);
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  std::lock_guard<std::mutex> l(conn_->mu);
  conn_->send_request(w);
  conn_->ack(reply_deadline());
}

void TcpStore::set_on_disconnect(const std::string& key, const std::string& value) {
  Writer w;
  w.u8(wire::kOnDisconnect);
  w.str(key);
  w.str(value);
  std::lock_guard<std::mutex> l(conn_->mu);
  conn_->send_request(w);
  conn_->ack(reply_deadline());
}

void TcpStore::leave() {
  Writer w;
  w.u8(wire::kLeave);
  std::lock_guard<std::mutex> l(conn_->mu);
  conn_->send_request(w);
  conn_->ack(reply_deadline());
}

std::unique_ptr<Store> TcpStore::clone() const {
  return std::make_unique<TcpStore>(host_, port_, connect_timeout_, secret_);
}

}  // namespace bp::dist
