// The rendezvous stores (Note [Why core has its own stores] in backplane/dist_store.hpp).
//
// Note [TCP store protocol]
//   One request, then one reply, at a time per connection; integers little-endian; a string
//   is a u32 length and its bytes.
//     SET           key value                 -> u8 0
//     GET           u32 timeout_ms, u32 n, keys  -> u8 0, n values | u8 1, u32 m, m missing keys
//     TRY_GET       key                       -> u8 found [value]
//     ADD           key i64 delta             -> i64 new value (stored as decimal text)
//     ERASE         u32 n, keys               -> u8 0
//     ON_DISCONNECT key value                 -> u8 0   (set key=value, unless it exists,
//                                                        if this connection closes before
//                                                        LEAVE)
//     LEAVE                                   -> u8 0
//   The server answers a GET as soon as every key exists, or with the missing keys when its
//   timeout passes, so a client never waits on a reply that will not come; the client bounds
//   every read by a deadline of its own as well, in case the server's machine disappears.
#include <backplane/dist_store.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/file.h>
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

// ---- wire format ------------------------------------------------------------------------------

enum Op : uint8_t {
  kSet = 1,
  kGet = 2,
  kTryGet = 3,
  kAdd = 4,
  kErase = 5,
  kOnDisconnect = 6,
  kLeave = 7,
};
constexpr uint32_t kMaxString = 256u << 20;  // a key or value larger than this is a protocol error

struct Writer {
  std::string b;
  void u8(uint8_t v) { b.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void i64(int64_t v) {
    uint64_t u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    b += s;
  }
};

// Reads from a byte range; every getter returns false when the data is incomplete.
struct Reader {
  const std::string& b;
  size_t pos = 0;
  bool bad = false;  // a malformed length
  bool u8(uint8_t& v) {
    if (pos + 1 > b.size()) return false;
    v = static_cast<uint8_t>(b[pos++]);
    return true;
  }
  bool u32(uint32_t& v) {
    if (pos + 4 > b.size()) return false;
    v = 0;
    for (int i = 0; i < 4; ++i)
      v |= static_cast<uint32_t>(static_cast<uint8_t>(b[pos + i])) << (8 * i);
    pos += 4;
    return true;
  }
  bool i64(int64_t& v) {
    if (pos + 8 > b.size()) return false;
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i)
      u |= static_cast<uint64_t>(static_cast<uint8_t>(b[pos + i])) << (8 * i);
    v = static_cast<int64_t>(u);
    pos += 8;
    return true;
  }
  bool str(std::string& s) {
    uint32_t n;
    size_t save = pos;
    if (!u32(n)) return false;
    if (n > kMaxString) {
      bad = true;
      return false;
    }
    if (pos + n > b.size()) {
      pos = save;
      return false;
    }
    s.assign(b, pos, n);
    pos += n;
    return true;
  }
};

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

struct TcpStoreServer::Impl {
  struct Client {
    int fd = -1;
    std::string in;
    bool waiting = false;
    std::vector<std::string> wait_keys;
    Clock::time_point deadline;
    bool has_dc = false, left = false;
    std::string dc_key, dc_value;
  };

  int listen_fd = -1;
  int wake[2] = {-1, -1};
  int port = 0;
  std::thread thread;
  std::map<std::string, std::string> data;
  std::vector<Client> clients;

  void run() {
    for (;;) {
      std::vector<pollfd> fds;
      fds.push_back({listen_fd, POLLIN, 0});
      fds.push_back({wake[0], POLLIN, 0});
      for (auto& c : clients) fds.push_back({c.fd, static_cast<short>(c.waiting ? 0 : POLLIN), 0});
      int timeout = -1;
      auto now = Clock::now();
      for (auto& c : clients)
        if (c.waiting) {
          auto ms = std::chrono::duration_cast<milliseconds>(c.deadline - now).count();
          ms = std::max<int64_t>(ms, 0) + 1;
          timeout = timeout < 0 ? static_cast<int>(ms) : std::min(timeout, static_cast<int>(ms));
        }
      int n = ::poll(fds.data(), fds.size(), timeout);
      if (n < 0 && errno != EINTR) return;
      if (fds[1].revents) return;  // asked to stop
      if (fds[0].revents & POLLIN) accept_client();
      // Clients: read, then serve what is complete. Indices of fds are offset by 2.
      std::vector<size_t> dead;
      size_t count = fds.size() - 2;
      for (size_t i = 0; i < count && i < clients.size(); ++i) {
        short re = fds[i + 2].revents;
        if (!re) continue;
        if (!read_client(clients[i])) dead.push_back(i);
      }
      for (size_t i = 0; i < clients.size(); ++i)
        if (std::find(dead.begin(), dead.end(), i) == dead.end() && !serve(clients[i]))
          dead.push_back(i);
      expire_waiters(dead);
      std::sort(dead.begin(), dead.end());
      dead.erase(std::unique(dead.begin(), dead.end()), dead.end());
      for (auto it = dead.rbegin(); it != dead.rend(); ++it) drop(*it);
      if (!dead.empty()) wake_waiters();
    }
  }

  void accept_client() {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Client c;
    c.fd = fd;
    clients.push_back(std::move(c));
  }

  // False when the connection closed or broke.
  bool read_client(Client& c) {
    char buf[65536];
    for (;;) {
      ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
      if (n > 0) {
        c.in.append(buf, static_cast<size_t>(n));
        if (n < static_cast<ssize_t>(sizeof buf)) return true;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      return false;
    }
  }

  bool reply(Client& c, const Writer& w) {
    return write_all(c.fd, w.b, Clock::now() + std::chrono::seconds(10));
  }

  bool keys_present(const std::vector<std::string>& keys) const {
    for (const auto& k : keys)
      if (!data.count(k)) return false;
    return true;
  }

  bool answer_get(Client& c) {
    Writer w;
    w.u8(0);
    for (const auto& k : c.wait_keys) w.str(data[k]);
    c.waiting = false;
    return reply(c, w);
  }

  // Serves every complete request of a client; false when the client must be dropped.
  bool serve(Client& c) {
    while (!c.waiting) {
      Reader r{c.in};
      uint8_t op;
      if (!r.u8(op)) return true;
      Writer w;
      bool complete = false;
      switch (op) {
        case kSet: {
          std::string k, v;
          if (r.str(k) && r.str(v)) {
            data[k] = std::move(v);
            w.u8(0);
            complete = true;
          }
          break;
        }
        case kGet: {
          uint32_t t, n;
          if (!r.u32(t) || !r.u32(n)) break;
          std::vector<std::string> keys(n);
          bool ok = true;
          for (auto& k : keys) ok = ok && r.str(k);
          if (!ok) break;
          c.in.erase(0, r.pos);
          c.wait_keys = std::move(keys);
          c.waiting = true;
          c.deadline = Clock::now() + milliseconds(t);
          if (keys_present(c.wait_keys) && !answer_get(c)) return false;
          continue;
        }
        case kTryGet: {
          std::string k;
          if (r.str(k)) {
            auto it = data.find(k);
            w.u8(it != data.end());
            if (it != data.end()) w.str(it->second);
            complete = true;
          }
          break;
        }
        case kAdd: {
          std::string k;
          int64_t d;
          if (r.str(k) && r.i64(d)) {
            int64_t v = 0;
            auto it = data.find(k);
            if (it != data.end()) {
              char* end = nullptr;
              v = std::strtoll(it->second.c_str(), &end, 10);
            }
            v += d;
            data[k] = std::to_string(v);
            w.i64(v);
            complete = true;
          }
          break;
        }
        case kErase: {
          uint32_t n;
          if (!r.u32(n)) break;
          std::vector<std::string> keys(n);
          bool ok = true;
          for (auto& k : keys) ok = ok && r.str(k);
          if (!ok) break;
          for (const auto& k : keys) data.erase(k);
          w.u8(0);
          complete = true;
          break;
        }
        case kOnDisconnect: {
          std::string k, v;
          if (r.str(k) && r.str(v)) {
            c.has_dc = true;
            c.left = false;
            c.dc_key = std::move(k);
            c.dc_value = std::move(v);
            w.u8(0);
            complete = true;
          }
          break;
        }
        case kLeave:
          c.left = true;
          w.u8(0);
          complete = true;
          break;
        default:
          return false;  // not our protocol
      }
      if (r.bad) return false;
      if (!complete) return true;  // wait for more bytes
      c.in.erase(0, r.pos);
      if (!reply(c, w)) return false;
      if (op == kSet || op == kAdd) wake_waiters();
    }
    return true;
  }

  void wake_waiters() {
    for (auto& c : clients)
      if (c.waiting && keys_present(c.wait_keys)) {
        if (!answer_get(c)) c.waiting = false;  // a broken client is dropped on its next read
      }
  }

  void expire_waiters(std::vector<size_t>& dead) {
    auto now = Clock::now();
    for (size_t i = 0; i < clients.size(); ++i) {
      Client& c = clients[i];
      if (!c.waiting || c.deadline > now) continue;
      Writer w;
      w.u8(1);
      std::vector<std::string> missing;
      for (const auto& k : c.wait_keys)
        if (!data.count(k)) missing.push_back(k);
      w.u32(static_cast<uint32_t>(missing.size()));
      for (const auto& k : missing) w.str(k);
      c.waiting = false;
      if (!reply(c, w)) dead.push_back(i);
    }
  }

  void drop(size_t i) {
    Client& c = clients[i];
    if (c.has_dc && !c.left && !data.count(c.dc_key)) data[c.dc_key] = c.dc_value;
    ::close(c.fd);
    clients.erase(clients.begin() + static_cast<std::ptrdiff_t>(i));
  }
};

TcpStoreServer::TcpStoreServer(const std::string& host, int port) : impl_(new Impl) {
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
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
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
  for (auto& cl : impl_->clients) ::close(cl.fd);
  ::close(impl_->listen_fd);
  ::close(impl_->wake[0]);
  ::close(impl_->wake[1]);
}

int TcpStoreServer::port() const noexcept {
  return impl_->port;
}

// ---- TcpStore (client) ----------------------------------------------------------------------

struct TcpStore::Conn {
  int fd = -1;
  std::mutex mu;
  std::string where;  // "tcp://host:port"
  std::string local;  // this side's address

  ~Conn() {
    if (fd >= 0) ::close(fd);
  }

  [[noreturn]] void broken(const std::string& what) {
    throw RendezvousError("rendezvous store " + where + ": " + what +
                          " (the process hosting the store — rank 0 or bp-run — has probably "
                          "exited)");
  }

  void send_request(const Writer& w) {
    if (!write_all(fd, w.b, Clock::now() + std::chrono::seconds(30)))
      broken("sending a request failed: " + errno_text(errno));
  }

  // Reads exactly n bytes before `deadline`.
  std::string read_exact(size_t n, Clock::time_point deadline) {
    std::string out(n, '\0');
    size_t off = 0;
    while (off < n) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) broken("no reply in time");
      pollfd p{fd, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
      if (r < 0 && errno != EINTR) broken("poll failed: " + errno_text(errno));
      if (r <= 0) continue;
      ssize_t got = ::recv(fd, out.data() + off, n - off, 0);
      if (got == 0) broken("the connection was closed");
      if (got < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        broken("receiving failed: " + errno_text(errno));
      }
      off += static_cast<size_t>(got);
    }
    return out;
  }
  uint8_t read_u8(Clock::time_point d) { return static_cast<uint8_t>(read_exact(1, d)[0]); }
  uint32_t read_u32(Clock::time_point d) {
    std::string b = read_exact(4, d);
    Reader r{b};
    uint32_t v = 0;
    r.u32(v);
    return v;
  }
  int64_t read_i64(Clock::time_point d) {
    std::string b = read_exact(8, d);
    Reader r{b};
    int64_t v = 0;
    r.i64(v);
    return v;
  }
  std::string read_str(Clock::time_point d) {
    uint32_t n = read_u32(d);
    if (n > kMaxString) broken("malformed reply");
    return read_exact(n, d);
  }
};

namespace {
Clock::time_point reply_deadline() {
  return Clock::now() + std::chrono::seconds(60);
}
}  // namespace

TcpStore::TcpStore(std::string host, int port, milliseconds connect_timeout)
    : host_(std::move(host)),
      port_(port),
      connect_timeout_(connect_timeout),
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
  w.u8(kSet);
  w.str(key);
  w.str(value);
  std::lock_guard<std::mutex> l(conn_->mu);
  conn_->send_request(w);
  conn_->read_u8(reply_deadline());
}

void TcpStore::set_many(const std::vector<std::pair<std::string, std::string>>& items) {
  if (items.empty()) return;
  Writer w;
  for (const auto& [k, v] : items) {
    w.u8(kSet);
    w.str(k);
    w.str(v);
  }
  std::lock_guard<std::mutex> l(conn_->mu);
  conn_->send_request(w);  // the server answers the requests one by one, in order
  auto d = reply_deadline();
  for (size_t i = 0; i < items.size(); ++i) conn_->read_u8(d);
}

std::vector<int64_t> TcpStore::add_many(const std::vector<std::string>& keys, int64_t delta) {
  std::vector<int64_t> out;
  if (keys.empty()) return out;
  Writer w;
  for (const auto& k : keys) {
    w.u8(kAdd);
    w.str(k);
    w.i64(delta);
  }
  std::lock_guard<std::mutex> l(conn_->mu);
  conn_->send_request(w);
  auto d = reply_deadline();
  for (size_t i = 0; i < keys.size(); ++i) out.push_back(conn_->read_i64(d));
  return out;
}

std::vector<std::string> TcpStore::get(const std::vector<std::string>& keys, milliseconds timeout) {
  Writer w;
  w.u8(kGet);
  int64_t t = std::clamp<int64_t>(timeout.count(), 0, 0x7fffffff);
  w.u32(static_cast<uint32_t>(t));
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  std::lock_guard<std::mutex> l(conn_->mu);
  conn_->send_request(w);
  auto deadline = Clock::now() + milliseconds(t) + std::chrono::seconds(60);
  uint8_t status = conn_->read_u8(deadline);
  if (status == 0) {
    std::vector<std::string> out;
    for (size_t i = 0; i < keys.size(); ++i) out.push_back(conn_->read_str(deadline));
    return out;
  }
  uint32_t m = conn_->read_u32(deadline);
  std::vector<std::string> missing;
  for (uint32_t i = 0; i < m; ++i) missing.push_back(conn_->read_str(deadline));
  throw_missing(describe(), missing, timeout);
}

std::optional<std::string> TcpStore::try_get(const std::string& key) {
  Writer w;
  w.u8(kTryGet);
  w.str(key);
  std::lock_guard<std::mutex> l(conn_->mu);
  conn_->send_request(w);
  auto d = reply_deadline();
  if (!conn_->read_u8(d)) return std::nullopt;
  return conn_->read_str(d);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  Writer w;
  w.u8(kAdd);
  w.str(key);
  w.i64(delta);
  std::lock_guard<std::mutex> l(conn_->mu);
  conn_->send_request(w);
  return conn_->read_i64(reply_deadline());
}

void TcpStore::erase(const std::vector<std::string>& keys) {
  Writer w;
  w.u8(kErase);
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  std::lock_guard<std::mutex> l(conn_->mu);
  conn_->send_request(w);
  conn_->read_u8(reply_deadline());
}

void TcpStore::set_on_disconnect(const std::string& key, const std::string& value) {
  Writer w;
  w.u8(kOnDisconnect);
  w.str(key);
  w.str(value);
  std::lock_guard<std::mutex> l(conn_->mu);
  conn_->send_request(w);
  conn_->read_u8(reply_deadline());
}

void TcpStore::leave() {
  Writer w;
  w.u8(kLeave);
  std::lock_guard<std::mutex> l(conn_->mu);
  conn_->send_request(w);
  conn_->read_u8(reply_deadline());
}

std::unique_ptr<Store> TcpStore::clone() const {
  return std::make_unique<TcpStore>(host_, port_, connect_timeout_);
}

}  // namespace bp::dist
