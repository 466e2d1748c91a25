// Key-value stores for the rendezvous of a process group (backplane/dist.hpp): a directory of
// files shared by every rank (file://), a small TCP server (tcp://host:port) hosted by rank 0
// or by the launcher (bp-run), and an in-process store for a group of one.
//
// Note [Why core has its own stores]
//   Gloo ships FileStore, HashStore and RedisStore, but inside libgloo, which is the gloo
//   communicator plugin's dependency: core must not link it (a CUDA machine with NCCL only has
//   no Gloo, and core knows no backend by name), and Debian's Gloo (2022) has no TCP store at
//   all. So core implements the thin part — a file store with Gloo's FileStore protocol (one
//   file per key, written to a temporary name and renamed, so readers never see half a value)
//   and a TCP store in the manner of PyTorch's TCPStore — and hands it to every communicator
//   plugin through bp_comm_host; the gloo plugin feeds it to Gloo's own rendezvous
//   (gloo::rendezvous::Context::connectFullMesh) through an adapter.
//
// Thread-safety: every member function may be called from several threads; a TcpStore keeps
// one connection, so a blocking get holds it until it returns: give each thread that waits its
// own clone().
#pragma once

#include <backplane/errors.hpp>
#include <backplane/export.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace bp::dist {

// Base of every error of the distributed layer (backplane/dist.hpp has the rest).
class BP_API DistError : public Error {
 public:
  using Error::Error;
};

// The rendezvous failed: the store cannot be reached, ranks disagree on the world size, a rank
// is claimed twice or out of range, BACKPLANE_INIT is malformed, a store key did not appear in
// time.
class BP_API RendezvousError : public DistError {
 public:
  using DistError::DistError;
};

// Keys that did not appear in a store within the time given to get().
class BP_API StoreTimeout : public RendezvousError {
 public:
  using RendezvousError::RendezvousError;
};

class BP_API Store {
 public:
  virtual ~Store() = default;
  // Stores `value` (any bytes) under `key`, overwriting.
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits up to `timeout` for every key, then returns their values in order. StoreTimeout
  // naming the keys still missing when the time is up; RendezvousError when the store is gone.
  virtual std::vector<std::string> get(const std::vector<std::string>& keys,
                                       std::chrono::milliseconds timeout) = 0;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) {
    return get(std::vector<std::string>{key}, timeout)[0];
  }
  // The value when the key exists now, without waiting.
  virtual std::optional<std::string> try_get(const std::string& key) = 0;
  // Adds `delta` to the counter under `key` (created as 0; stored as decimal text) and
  // returns the new value. Atomic across ranks.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Removes keys; missing ones are ignored.
  virtual void erase(const std::vector<std::string>& keys) = 0;
  // set() of each (key, value) in order; one round trip to a TCP store (the requests are
  // pipelined), so the group's monitor posts a burst of collective descriptors at once.
  virtual void set_many(const std::vector<std::pair<std::string, std::string>>& items) {
    for (const auto& [k, v] : items) set(k, v);
  }
  // add(key, delta) of each key in order, returning the new values; one round trip to a TCP
  // store.
  virtual std::vector<int64_t> add_many(const std::vector<std::string>& keys, int64_t delta) {
    std::vector<int64_t> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(add(k, delta));
    return out;
  }
  // Another handle on the same store, with a connection of its own (TCP).
  virtual std::unique_ptr<Store> clone() const = 0;
  // "tcp://10.0.0.1:29500", "file:///tmp/rdzv", "memory".
  virtual std::string describe() const = 0;
  // The address of this host's interface that reaches the store ("10.0.0.2"); "" for a file
  // or memory store.
  virtual std::string local_address() const { return ""; }
  // Asks the store to set `key` to `value` (unless the key exists by then) should this
  // handle's connection close before leave() is called (a process that exits or crashes). Only a
  // TCP store can; others ignore it. Used so that the ranks of a group learn at once that one of
  // them has died.
  virtual void set_on_disconnect(const std::string& key, const std::string& value) {
    (void)key;
    (void)value;
  }
  // Cancels set_on_disconnect (a clean exit).
  virtual void leave() {}
};

// One file per key in a directory shared by every rank (a local or network file system).
// The directory is created when missing.
class BP_API FileStore final : public Store {
 public:
  explicit FileStore(std::string directory);
  void set(const std::string& key, const std::string& value) override;
  using Store::get;
  std::vector<std::string> get(const std::vector<std::string>& keys,
                               std::chrono::milliseconds timeout) override;
  std::optional<std::string> try_get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void erase(const std::vector<std::string>& keys) override;
  std::unique_ptr<Store> clone() const override;
  std::string describe() const override { return "file://" + dir_; }
  // Removes every key file (the directory itself stays).
  void clear();

 private:
  std::string path_of(const std::string& key) const;
  std::string dir_;
};

// In-process store (a group of one, tests). Clones share the data.
class BP_API MemoryStore final : public Store {
 public:
  MemoryStore();
  void set(const std::string& key, const std::string& value) override;
  using Store::get;
  std::vector<std::string> get(const std::vector<std::string>& keys,
                               std::chrono::milliseconds timeout) override;
  std::optional<std::string> try_get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void erase(const std::vector<std::string>& keys) override;
  std::unique_ptr<Store> clone() const override;
  std::string describe() const override { return "memory"; }

 private:
  struct Shared;
  explicit MemoryStore(std::shared_ptr<Shared> s) : s_(std::move(s)) {}
  std::shared_ptr<Shared> s_;
};

// The server side of TcpStore: a thread serving every client over one listening socket.
// Binds `host` (an address of this machine, "127.0.0.1" for local ranks only, or "" /
// "0.0.0.0" for every interface) and `port` (0: a free port, read back with port()). Every
// connection must first present `secret` (16 to 1024 bytes; generate_store_secret() makes
// one); one that does not, or breaks the protocol, is dropped and counted, and never stops the
// others (Note [Store limits] in dist_store.cpp). Throws RendezvousError when it cannot bind
// (naming the address and the system's reason, e.g. "Address already in use") or the secret's
// size is wrong.
class BP_API TcpStoreServer {
 public:
  TcpStoreServer(const std::string& host, int port, std::string secret);
  ~TcpStoreServer();  // stops the thread and closes every connection
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const noexcept;

  struct Counters {
    uint64_t accepted = 0;  // connections accepted
    uint64_t rejected = 0;  // dropped for a missing or wrong secret (or none in time)
    uint64_t dropped = 0;   // authenticated, then dropped: malformed bytes, a reply stalled
  };
  // Counts since the server started; safe from any thread.
  Counters counters() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// 32 hex digits from the system's random source, for TcpStoreServer and TcpStore (bp-run
// passes one to its ranks as BACKPLANE_STORE_SECRET). RendezvousError when none is available.
BP_API std::string generate_store_secret();

// A client of TcpStoreServer. Connecting retries until `connect_timeout` (the server may
// start later than the client), then presents `secret`; RendezvousError naming the address
// and the last error when it never answers, or saying the secret was refused. An operation
// whose reply breaks, is malformed or does not come in time throws RendezvousError and closes
// the connection: every later operation on this handle throws at once (clone() connects anew).
class BP_API TcpStore final : public Store {
 public:
  TcpStore(std::string host, int port, std::chrono::milliseconds connect_timeout,
           std::string secret);
  ~TcpStore() override;
  void set(const std::string& key, const std::string& value) override;
  using Store::get;
  std::vector<std::string> get(const std::vector<std::string>& keys,
                               std::chrono::milliseconds timeout) override;
  std::optional<std::string> try_get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void set_many(const std::vector<std::pair<std::string, std::string>>& items) override;
  std::vector<int64_t> add_many(const std::vector<std::string>& keys, int64_t delta) override;
  void erase(const std::vector<std::string>& keys) override;
  std::unique_ptr<Store> clone() const override;
  std::string describe() const override;
  std::string local_address() const override;
  void set_on_disconnect(const std::string& key, const std::string& value) override;
  void leave() override;

 private:
  struct Conn;
  std::string host_;
  int port_;
  std::chrono::milliseconds connect_timeout_;
  std::string secret_;
  std::unique_ptr<Conn> conn_;
};

}  // namespace bp::dist
