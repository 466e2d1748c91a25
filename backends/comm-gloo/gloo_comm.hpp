// The Gloo communicator: one gloo::rendezvous::Context per bp_comm, connected through the
// host's store (an adapter to gloo::rendezvous::Store), collectives run in order on the
// communicator's worker thread, point-to-point transfers posted at once as Gloo unbound
// buffers and waited for on a second thread.
//
// Note [Gloo threads]
//   Gloo's collectives block the calling thread, so each bp_comm owns a worker thread that
//   runs them one after another in call order (every rank issues them in the same order, so
//   the order on the wire agrees). A send and a recv are posted immediately on the caller's
//   thread (Gloo's unbound buffers are asynchronous), so two ranks that both send before they
//   receive do not deadlock; a second thread waits for their completion in call order.
//   comm_abort signals an exception into every pair of the context (Note [Aborting Gloo] in
//   gloo_comm.cpp), so operations blocked inside Gloo return at once, and closes the
//   connections, so the peers' operations fail too.
#pragma once

#include <backplane/abi/comm_abi.h>

#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace bp::gloo_comm {

// The state of one operation, shared by its work handle and the thread running it.
struct Op {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int32_t code = 0;  // 0, or the bp error code of its failure
  std::string message, native;
  std::string what;  // "all_reduce of 1000 f32 (sum)" for messages

  void finish(int32_t c = 0, std::string msg = "", std::string nat = "");
  // True when done before the timeout.
  bool wait_for(std::chrono::milliseconds timeout);
};

// gloo::rendezvous::Context with its transport context reachable (Note [Aborting Gloo]).
class GlooContext : public gloo::rendezvous::Context {
 public:
  using gloo::rendezvous::Context::Context;
  gloo::transport::Context* transport() { return transportContext_.get(); }
};

// A thread running jobs in order.
class Worker {
 public:
  Worker();
  ~Worker();  // finishes queued jobs, then joins
  void push(std::function<void()> job);
  void stop();

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

// What a rank called, exchanged before the payload moves (Note [Call guard]).
struct CallHeader {
  int32_t kind = 0;  // 1 all_reduce, 2 broadcast, 3 all_gather, 4 reduce_scatter, 5 barrier, 6 p2p
  int32_t dtype = 0;
  uint64_t count = 0;
  int64_t extra = 0;  // reduction or root
  std::string str() const;
};

class Comm {
 public:
  Comm(const bp_comm_config& config, const bp_comm_host& host);  // throws sdk::Failure
  ~Comm();

  std::shared_ptr<Op> all_reduce(const void* send, void* recv, uint64_t count, int32_t dtype,
                                 int32_t op);
  std::shared_ptr<Op> broadcast(const void* send, void* recv, uint64_t count, int32_t dtype,
                                int32_t root);
  std::shared_ptr<Op> all_gather(const void* send, void* recv, uint64_t count, int32_t dtype);
  std::shared_ptr<Op> reduce_scatter(const void* send, void* recv, uint64_t count, int32_t dtype,
                                     int32_t op);
  std::shared_ptr<Op> send(const void* buf, uint64_t count, int32_t dtype, int32_t peer);
  std::shared_ptr<Op> recv(void* buf, uint64_t count, int32_t dtype, int32_t peer);
  std::shared_ptr<Op> barrier();
  void abort();
  bool aborted() const { return aborted_.load(); }
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  // Queues `body` on the worker after the call guard (Note [Call guard]); exceptions become the
  // op's error (Note [Gloo threads]).
  std::shared_ptr<Op> run(std::string what, const CallHeader& call, std::function<void()> body);
  void guard(const CallHeader& call, const std::string& what);
  std::shared_ptr<Op> p2p(bool is_send, void* buf, uint64_t count, int32_t dtype, int32_t peer);
  void record(Op& op, std::exception_ptr e);
  std::string where() const;

  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<GlooContext> context_;
  std::atomic<bool> aborted_{false};
  std::mutex failed_mu_;
  std::string failed_;  // the first failure: later operations fail at once with it
  Worker collectives_, p2p_waits_;
  // Transfers issued per peer, by the issuing thread (Note [P2P slots] in gloo_comm.cpp).
  std::vector<uint32_t> sent_, received_;
  // Receives waiting for their header, then their payload (Note [Call guard]).
  struct Receiver {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  void start_receiver(std::function<void()> job);
  std::mutex receivers_mu_;
  std::vector<Receiver> receivers_;
};

}  // namespace bp::gloo_comm
