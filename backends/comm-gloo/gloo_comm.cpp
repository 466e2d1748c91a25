// The Gloo communicator (Note [Gloo threads] in gloo_comm.hpp).
#include "gloo_comm.hpp"

#include <backplane/abi/half.h>
#include <backplane/sdk/plugin_sdk.hpp>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <netdb.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

// Note [Aborting Gloo]
//   Gloo wakes every operation blocked on a context when one of its waits times out:
//   gloo::transport::tcp::Context::signalException ("Set exception on every pair in this
//   context ... All pairs should be signaled and closed"). comm_abort needs exactly that, but the
//   function is protected, reachable by the context's friends; one of them, ContextMutator, is
//   named as a friend by Gloo and defined nowhere in Gloo, so the plugin defines it here with the
//   one function it needs. The transport context itself is a protected member of gloo::Context,
//   reached through a subclass (GlooContext in gloo_comm.hpp).
namespace gloo::transport::tcp {
class ContextMutator {
 public:
  static void signal(Context& c, const std::string& msg) { c.signalException(msg); }
};
}  // namespace gloo::transport::tcp

namespace bp::gloo_comm {

namespace {

using sdk::fail;
using std::chrono::milliseconds;

// ---- Op and Worker ------------------------------------------------------------------------------

}  // namespace

void Op::finish(int32_t c, std::string msg, std::string nat) {
  {
    std::lock_guard<std::mutex> l(mu);
    if (done) return;
    done = true;
    code = c;
    message = std::move(msg);
    native = std::move(nat);
  }
  cv.notify_all();
}

bool Op::wait_for(milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu);
  return cv.wait_for(l, timeout, [&] { return done; });
}

Worker::Worker() : thread_([this] { loop(); }) {}

Worker::~Worker() {
  stop();
}

void Worker::stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Worker::push(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> l(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_all();
}

void Worker::loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

namespace {

// ---- the host's store, as Gloo's ---------------------------------------------------------------

// Thrown by HostStore; comm_create turns it into an error of the same code.
struct StoreFailure {
  int32_t code;
  std::string message;
};

class HostStore final : public gloo::rendezvous::Store {
 public:
  HostStore(const bp_comm_host& host, milliseconds timeout) : h_(host), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    check(h_.store_set(h_.ctx, key.c_str(), data.data(), data.size()));
  }
  std::vector<char> get(const std::string& key) override { return get_within(key, timeout_); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    for (const auto& k : keys) get_within(k, timeout);
  }

 private:
  std::vector<char> get_within(const std::string& key, milliseconds timeout) {
    void* v = nullptr;
    uint64_t n = 0;
    check(h_.store_get(h_.ctx, key.c_str(), timeout.count(), &v, &n));
    std::vector<char> out(static_cast<const char*>(v), static_cast<const char*>(v) + n);
    h_.store_free(h_.ctx, v);
    return out;
  }
  void check(bp_error* e) {
    if (!e) return;
    StoreFailure f{e->code, e->message ? e->message : "store error"};
    h_.error_free(h_.ctx, e);
    throw f;
  }
  bp_comm_host h_;
  milliseconds timeout_;
};

// ---- reductions ---------------------------------------------------------------------------------

using Reduce = std::function<void(void*, const void*, const void*, size_t)>;

template <typename T, typename F>
Reduce elementwise(F f) {
  return [f](void* c, const void* a, const void* b, size_t n) {
    T* out = static_cast<T*>(c);
    const T* x = static_cast<const T*>(a);
    const T* y = static_cast<const T*>(b);
    for (size_t i = 0; i < n; ++i) out[i] = f(x[i], y[i]);
  };
}

template <typename T>
Reduce arithmetic(int32_t op) {
  switch (op) {
    case BP_REDUCE_MIN:
      return elementwise<T>([](T a, T b) { return b < a ? b : a; });
    case BP_REDUCE_MAX:
      return elementwise<T>([](T a, T b) { return a < b ? b : a; });
    default:  // sum, and avg (divided afterwards)
      return elementwise<T>([](T a, T b) { return static_cast<T>(a + b); });
  }
}

// f16 / bf16: each pair combined in float and rounded to the dtype.
template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
Reduce half_reduce(int32_t op) {
  switch (op) {
    case BP_REDUCE_MIN:
      return elementwise<uint16_t>([](uint16_t a, uint16_t b) { return ToF(b) < ToF(a) ? b : a; });
    case BP_REDUCE_MAX:
      return elementwise<uint16_t>([](uint16_t a, uint16_t b) { return ToF(a) < ToF(b) ? b : a; });
    default:
      return elementwise<uint16_t>([](uint16_t a, uint16_t b) { return FromF(ToF(a) + ToF(b)); });
  }
}

float f16_to(uint16_t h) {
  return bp_f16_to_float(h);
}
uint16_t to_f16(float f) {
  return bp_float_to_f16(f);
}
float bf16_to(uint16_t h) {
  return bp_bf16_to_float(h);
}
uint16_t to_bf16(float f) {
  return bp_float_to_bf16(f);
}

Reduce reduction(int32_t dtype, int32_t op) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return arithmetic<float>(op);
    case BP_DTYPE_F64:
      return arithmetic<double>(op);
    case BP_DTYPE_I32:
      return arithmetic<int32_t>(op);
    case BP_DTYPE_I64:
      return arithmetic<int64_t>(op);
    case BP_DTYPE_U8:
      return arithmetic<uint8_t>(op);
    case BP_DTYPE_F16:
      return half_reduce<f16_to, to_f16>(op);
    case BP_DTYPE_BF16:
      return half_reduce<bf16_to, to_bf16>(op);
    case BP_DTYPE_BOOL:  // comm_abi.h: sum and max are or, min is and
      if (op == BP_REDUCE_MIN)
        return elementwise<uint8_t>([](uint8_t a, uint8_t b) -> uint8_t { return a && b; });
      return elementwise<uint8_t>([](uint8_t a, uint8_t b) -> uint8_t { return a || b; });
  }
  fail(BP_ERROR_INVALID_ARGUMENT, "unknown dtype " + std::to_string(dtype));
}

// Divides `count` elements by the world size in place (avg).
void divide(void* p, uint64_t count, int32_t dtype, int size) {
  auto each = [&](auto* x, auto conv_in, auto conv_out) {
    for (uint64_t i = 0; i < count; ++i) x[i] = conv_out(conv_in(x[i]) / size);
  };
  auto id = [](auto v) { return v; };
  switch (dtype) {
    case BP_DTYPE_F32:
      each(static_cast<float*>(p), id, id);
      break;
    case BP_DTYPE_F64:
      each(static_cast<double*>(p), id, id);
      break;
    case BP_DTYPE_F16:
      each(static_cast<uint16_t*>(p), f16_to, to_f16);
      break;
    case BP_DTYPE_BF16:
      each(static_cast<uint16_t*>(p), bf16_to, to_bf16);
      break;
    default:
      break;
  }
}

void check_args(int32_t dtype, int32_t op, bool reduce, const char* what) {
  if (bp_dtype_size(dtype) == 0)
    fail(BP_ERROR_INVALID_ARGUMENT, std::string(what) + ": unknown dtype " + std::to_string(dtype));
  if (!reduce) return;
  if (op < 0 || op >= BP_REDUCE_COUNT)
    fail(BP_ERROR_INVALID_ARGUMENT,
         std::string(what) + ": unknown reduction " + std::to_string(op));
  bool floating = dtype == BP_DTYPE_F32 || dtype == BP_DTYPE_F64 || dtype == BP_DTYPE_F16 ||
                  dtype == BP_DTYPE_BF16;
  if (op == BP_REDUCE_AVG && !floating)
    fail(BP_ERROR_INVALID_ARGUMENT,
         std::string(what) + ": avg needs a floating dtype, got " + bp_dtype_name(dtype));
}

std::string describe(const char* op, uint64_t count, int32_t dtype, const std::string& extra = "") {
  return std::string(op) + " of " + std::to_string(count) + " " + bp_dtype_name(dtype) +
         (extra.empty() ? "" : " (" + extra + ")");
}

// Note [P2P slots]
//   Point-to-point transfers use prefixes 0x7e (payload) and 0x7d (header); Gloo's collectives
//   use 0x01-0x08. Each transfer gets a slot of its own: the n-th send to a peer and the n-th
//   receive from it (they match in call order per pair, comm_abi.h) both use tag n. Gloo keeps
//   the receives posted on one slot in a FIFO served in arrival order, while a receive posts its
//   payload only after its header arrived, on a thread of its own (Note [Call guard]): on one
//   shared slot, two receives from one peer could post in the other order and take each other's
//   payloads. The tag wraps at 2^32 on both sides alike.
uint64_t p2p_slot(uint8_t prefix, uint32_t transfer) {
  return gloo::Slot::build(prefix, transfer);
}

// Note [Call guard]
//   Gloo ends the process (gloo::EnforceNotMet thrown on its I/O thread, so std::terminate) when
//   a peer sends more bytes than the receiving operation posted, which is exactly what ranks
//   that called different collectives or sizes do. So before a collective's payload moves, the
//   ranks all_gather a fixed-size CallHeader (kind, dtype, count, reduction or root) and compare
//   them; a difference fails the operation with BP_ERROR_INVALID_ARGUMENT naming every rank's
//   call, on every rank, and no payload byte is sent (core's own check then reports the cause as
//   a MismatchError). Point to point: the sender sends its 24-byte header first, and the receiver
//   posts the payload buffer only once the header matches its call. Cost: one all_gather of
//   24 bytes per rank per collective, tens of microseconds on a local link.
struct WireHeader {
  int32_t kind, dtype;
  uint64_t count;
  int64_t extra;
};
static_assert(sizeof(WireHeader) == 24);

WireHeader wire(const CallHeader& h) {
  return WireHeader{h.kind, h.dtype, h.count, h.extra};
}
CallHeader unwire(const WireHeader& w) {
  CallHeader h;
  h.kind = w.kind;
  h.dtype = w.dtype;
  h.count = w.count;
  h.extra = w.extra;
  return h;
}
bool same(const WireHeader& a, const WireHeader& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.count == b.count && a.extra == b.extra;
}

// The address Gloo listens on (Note [Gloo interface] in README.md).
gloo::transport::tcp::attr listen_attr(const bp_comm_config& cfg) {
  gloo::transport::tcp::attr a;
  if (const char* ifname = std::getenv("BACKPLANE_GLOO_IFNAME"); ifname && *ifname) {
    a.iface = ifname;
  } else if (const char* host = std::getenv("BACKPLANE_GLOO_HOSTNAME"); host && *host) {
    a.hostname = host;
  } else if (cfg.local_address && *cfg.local_address) {
    a.hostname = cfg.local_address;  // the interface that reached the rendezvous store
  } else {
    char name[256] = {};
    ::gethostname(name, sizeof name - 1);
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    bool resolves = ::getaddrinfo(name, nullptr, &hints, &res) == 0;
    if (res) ::freeaddrinfo(res);
    a.hostname = resolves ? name : "127.0.0.1";
  }
  return a;
}

}  // namespace

// ---- Comm
// -----------------------------------------------------------------------------------------

Comm::Comm(const bp_comm_config& cfg, const bp_comm_host& host)
    : rank_(cfg.rank), size_(cfg.world_size), timeout_(milliseconds(cfg.timeout_ms)) {
  sent_.assign(static_cast<size_t>(std::max(size_, 1)), 0);
  received_.assign(static_cast<size_t>(std::max(size_, 1)), 0);
  if (cfg.dlpack_device_type != 1)
    fail(BP_ERROR_INVALID_ARGUMENT, "gloo reduces host memory only (DLPack device type 1), got " +
                                        std::to_string(cfg.dlpack_device_type) + " for " +
                                        (cfg.device_type ? cfg.device_type : "?"));
  gloo::transport::tcp::attr attr = listen_attr(cfg);
  std::string listen = attr.iface.empty() ? attr.hostname : "interface " + attr.iface;
  try {
    device_ = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    fail(BP_ERROR_UNAVAILABLE,
         "gloo cannot listen on " + listen + ": " + e.what() +
             " (set BACKPLANE_GLOO_IFNAME or BACKPLANE_GLOO_HOSTNAME)",
         "gloo::Exception");
  }
  if (host.log)
    host.log(host.ctx,
             ("gloo: rank " + std::to_string(rank_) + " listens on " + device_->str()).c_str());
  context_ = std::make_shared<GlooContext>(rank_, size_);
  context_->setTimeout(timeout_);
  HostStore store(host, timeout_);
  try {
    context_->connectFullMesh(store, device_);
  } catch (const StoreFailure& f) {
    fail(static_cast<bp_error_code>(f.code), "gloo rendezvous of rank " + std::to_string(rank_) +
                                                 " of " + std::to_string(size_) + ": " + f.message);
  } catch (const gloo::IoException& e) {
    fail(static_cast<bp_error_code>(BP_COMM_ERROR_REMOTE),
         "gloo could not connect rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
             " to its peers: " + e.what(),
         "gloo::IoException");
  } catch (const std::exception& e) {
    fail(BP_ERROR_INTERNAL,
         "gloo rendezvous failed on rank " + std::to_string(rank_) + ": " + e.what());
  }
}

Comm::~Comm() {
  collectives_.stop();
  p2p_waits_.stop();
  std::vector<Receiver> rs;
  {
    std::lock_guard<std::mutex> l(receivers_mu_);
    rs.swap(receivers_);
  }
  for (Receiver& r : rs) r.thread.join();
}

void Comm::start_receiver(std::function<void()> job) {
  std::lock_guard<std::mutex> l(receivers_mu_);
  // Join the receivers that have finished, so a long run keeps only the pending ones.
  auto finished = [](Receiver& r) {
    if (!r.done->load()) return false;
    r.thread.join();
    return true;
  };
  receivers_.erase(std::remove_if(receivers_.begin(), receivers_.end(), finished),
                   receivers_.end());
  auto done = std::make_shared<std::atomic<bool>>(false);
  receivers_.push_back(Receiver{std::thread([job = std::move(job), done] {
                                  job();
                                  done->store(true);
                                }),
                                done});
}

std::string Comm::where() const {
  return "rank " + std::to_string(rank_) + " of " + std::to_string(size_);
}

void Comm::record(Op& op, std::exception_ptr e) {
  std::string msg, native;
  int32_t code = BP_ERROR_INTERNAL;
  try {
    std::rethrow_exception(e);
  } catch (const gloo::IoException& x) {
    msg = x.what();
    native = "gloo::IoException";
    code =
        msg.find("Timed out") != std::string::npos ? BP_COMM_ERROR_TIMEOUT : BP_COMM_ERROR_REMOTE;
  } catch (const gloo::Exception& x) {
    msg = x.what();
    native = "gloo::Exception";
  } catch (const sdk::Failure& x) {
    msg = x.what();
    code = x.code();
  } catch (const std::exception& x) {
    msg = x.what();
  }
  if (aborted_.load()) code = BP_COMM_ERROR_ABORTED;
  std::string text = "gloo " + op.what + " on " + where() + " failed: " + msg;
  {
    std::lock_guard<std::mutex> l(failed_mu_);
    if (failed_.empty()) failed_ = text;
  }
  op.finish(code, text, native);
}

std::string CallHeader::str() const {
  static const char* kinds[] = {
      "?", "all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier", "send/recv"};
  const char* k = kind >= 1 && kind <= 6 ? kinds[kind] : kinds[0];
  if (kind == 5) return k;
  std::string out = std::string(k) + " of " + std::to_string(count) + " " +
                    (dtype >= 0 && dtype < BP_DTYPE_COUNT ? bp_dtype_name(dtype) : "?");
  if (kind == 1 || kind == 4)
    out += std::string(" (") +
           (extra >= 0 && extra < 4 ? bp_reduce_op_name(static_cast<int32_t>(extra)) : "?") + ")";
  if (kind == 2) out += " (root " + std::to_string(extra) + ")";
  return out;
}

void Comm::guard(const CallHeader& call, const std::string& what) {
  std::vector<WireHeader> all(static_cast<size_t>(size_));
  all[static_cast<size_t>(rank_)] = wire(call);
  gloo::AllgatherOptions o(context_);
  o.setOutput<uint8_t>(reinterpret_cast<uint8_t*>(all.data()), all.size() * sizeof(WireHeader));
  o.setTimeout(timeout_);
  gloo::allgather(o);
  bool differ = false;
  for (const WireHeader& h : all) differ = differ || !same(h, all[0]);
  if (!differ) return;
  std::string calls;
  for (int r = 0; r < size_; ++r)
    calls += (r ? "; rank " : "rank ") + std::to_string(r) + " called " +
             unwire(all[static_cast<size_t>(r)]).str();
  fail(BP_ERROR_INVALID_ARGUMENT,
       what + ": the ranks called different collectives (" + calls + "); nothing was sent");
}

std::shared_ptr<Op> Comm::run(std::string what, const CallHeader& call,
                              std::function<void()> body) {
  auto op = std::make_shared<Op>();
  op->what = std::move(what);
  collectives_.push([this, op, call, body = std::move(body)] {
    {
      std::lock_guard<std::mutex> l(failed_mu_);
      if (aborted_.load() || !failed_.empty()) {
        op->finish(aborted_.load() ? BP_COMM_ERROR_ABORTED : BP_COMM_ERROR_REMOTE,
                   "gloo " + op->what + " on " + where() + " was not run: " +
                       (aborted_.load() ? "the communicator was aborted"
                                        : "the communicator failed earlier: " + failed_));
        return;
      }
    }
    try {
      guard(call, op->what);
      body();
      op->finish();
    } catch (...) {
      record(*op, std::current_exception());
    }
  });
  return op;
}

std::shared_ptr<Op> Comm::all_reduce(const void* send, void* recv, uint64_t count, int32_t dtype,
                                     int32_t op) {
  check_args(dtype, op, true, "all_reduce");
  Reduce fn = reduction(dtype, op);
  size_t es = bp_dtype_size(dtype);
  return run(describe("all_reduce", count, dtype, bp_reduce_op_name(op)),
             CallHeader{1, dtype, count, op}, [=, this] {
               if (count == 0) return;
               if (send != recv) std::memcpy(recv, send, count * es);
               gloo::AllreduceOptions o(context_);
               // Gloo counts elements of sizeof(T): describe them by their real size.
               switch (es) {
                 case 1:
                   o.setOutput<uint8_t>(static_cast<uint8_t*>(recv), count);
                   break;
                 case 2:
                   o.setOutput<uint16_t>(static_cast<uint16_t*>(recv), count);
                   break;
                 case 4:
                   o.setOutput<uint32_t>(static_cast<uint32_t*>(recv), count);
                   break;
                 default:
                   o.setOutput<uint64_t>(static_cast<uint64_t*>(recv), count);
                   break;
               }
               o.setReduceFunction(fn);
               o.setTimeout(timeout_);
               gloo::allreduce(o);
               if (op == BP_REDUCE_AVG) divide(recv, count, dtype, size_);
             });
}

std::shared_ptr<Op> Comm::broadcast(const void* send, void* recv, uint64_t count, int32_t dtype,
                                    int32_t root) {
  check_args(dtype, 0, false, "broadcast");
  if (root < 0 || root >= size_)
    fail(BP_ERROR_INVALID_ARGUMENT,
         "broadcast: root " + std::to_string(root) + " is not a rank of " + std::to_string(size_));
  size_t es = bp_dtype_size(dtype);
  return run(describe("broadcast", count, dtype, "root " + std::to_string(root)),
             CallHeader{2, dtype, count, root}, [=, this] {
               if (count == 0) return;
               if (rank_ == root && send && send != recv) std::memcpy(recv, send, count * es);
               gloo::BroadcastOptions o(context_);
               o.setOutput<uint8_t>(static_cast<uint8_t*>(recv), count * es);
               o.setRoot(root);
               o.setTimeout(timeout_);
               gloo::broadcast(o);
             });
}

std::shared_ptr<Op> Comm::all_gather(const void* send, void* recv, uint64_t count, int32_t dtype) {
  check_args(dtype, 0, false, "all_gather");
  size_t bytes = count * bp_dtype_size(dtype);
  return run(describe("all_gather", count, dtype), CallHeader{3, dtype, count, 0}, [=, this] {
    if (count == 0) return;
    char* mine = static_cast<char*>(recv) + static_cast<size_t>(rank_) * bytes;
    if (send != mine) std::memcpy(mine, send, bytes);
    gloo::AllgatherOptions o(context_);
    o.setOutput<uint8_t>(static_cast<uint8_t*>(recv), bytes * static_cast<size_t>(size_));
    o.setTimeout(timeout_);
    gloo::allgather(o);
  });
}

// Gloo 0.5 has no reduce_scatter in its new-style API (only the typed halving-doubling class):
// an all_reduce of the whole input into a scratch buffer, then this rank's chunk is copied out.
// The traffic is that of an all_reduce (about twice a ring reduce_scatter).
std::shared_ptr<Op> Comm::reduce_scatter(const void* send, void* recv, uint64_t count,
                                         int32_t dtype, int32_t op) {
  check_args(dtype, op, true, "reduce_scatter");
  Reduce fn = reduction(dtype, op);
  size_t es = bp_dtype_size(dtype);
  return run(describe("reduce_scatter", count, dtype, bp_reduce_op_name(op)),
             CallHeader{4, dtype, count, op}, [=, this] {
               if (count == 0) return;
               size_t total = count * static_cast<size_t>(size_);
               std::vector<uint64_t> scratch((total * es + 7) / 8);
               std::memcpy(scratch.data(), send, total * es);
               gloo::AllreduceOptions o(context_);
               switch (es) {
                 case 1:
                   o.setOutput<uint8_t>(reinterpret_cast<uint8_t*>(scratch.data()), total);
                   break;
                 case 2:
                   o.setOutput<uint16_t>(reinterpret_cast<uint16_t*>(scratch.data()), total);
                   break;
                 case 4:
                   o.setOutput<uint32_t>(reinterpret_cast<uint32_t*>(scratch.data()), total);
                   break;
                 default:
                   o.setOutput<uint64_t>(scratch.data(), total);
                   break;
               }
               o.setReduceFunction(fn);
               o.setTimeout(timeout_);
               gloo::allreduce(o);
               const char* chunk = reinterpret_cast<const char*>(scratch.data()) +
                                   static_cast<size_t>(rank_) * count * es;
               std::memcpy(recv, chunk, count * es);
               if (op == BP_REDUCE_AVG) divide(recv, count, dtype, size_);
             });
}

std::shared_ptr<Op> Comm::barrier() {
  return run("barrier", CallHeader{5, 0, 0, 0}, [this] {
    gloo::BarrierOptions o(context_);
    o.setTimeout(timeout_);
    gloo::barrier(o);
  });
}

std::shared_ptr<Op> Comm::p2p(bool is_send, void* buf, uint64_t count, int32_t dtype,
                              int32_t peer) {
  const char* name = is_send ? "send" : "recv";
  check_args(dtype, 0, false, name);
  if (peer < 0 || peer >= size_ || peer == rank_)
    fail(BP_ERROR_INVALID_ARGUMENT, std::string(name) + ": peer " + std::to_string(peer) +
                                        " is not another rank of " + std::to_string(size_));
  auto op = std::make_shared<Op>();
  op->what = describe(name, count, dtype,
                      std::string(is_send ? "to" : "from") + " rank " + std::to_string(peer));
  if (aborted_.load()) {
    op->finish(BP_COMM_ERROR_ABORTED, "gloo " + op->what + ": the communicator was aborted");
    return op;
  }
  if (count == 0) {
    op->finish();
    return op;
  }
  size_t bytes = count * bp_dtype_size(dtype);
  // Numbered on the issuing thread, in call order (Note [P2P slots]).
  uint32_t n = (is_send ? sent_ : received_)[static_cast<size_t>(peer)]++;
  const uint64_t slot = p2p_slot(0x7e, n), header_slot = p2p_slot(0x7d, n);
  // The header goes first; the receiver posts the payload once it matches (Note [Call guard]).
  auto header = std::make_shared<WireHeader>(wire(CallHeader{6, dtype, count, 0}));
  auto theirs = std::make_shared<WireHeader>();
  std::shared_ptr<gloo::transport::UnboundBuffer> hb, ub;
  try {
    if (is_send) {
      hb = context_->createUnboundBuffer(header.get(), sizeof(WireHeader));
      hb->send(peer, header_slot);
      ub = context_->createUnboundBuffer(buf, bytes);
      ub->send(peer, slot);
    } else {
      hb = context_->createUnboundBuffer(theirs.get(), sizeof(WireHeader));
      hb->recv(peer, header_slot);
    }
  } catch (...) {
    record(*op, std::current_exception());
    return op;
  }
  // A send is posted whole at once, so its waits queue on one worker; a receive posts its
  // payload only after the header, so each waits on a thread of its own (receives complete in
  // whatever order their peers send, as with NCCL and MPI).
  auto job = [this, op, hb, ub, header, theirs, is_send, buf, bytes, peer, slot]() mutable {
    try {
      bool ok = is_send ? hb->waitSend(timeout_) : hb->waitRecv(timeout_);
      if (ok && !is_send) {
        if (!same(*header, *theirs))
          fail(BP_ERROR_INVALID_ARGUMENT, "rank " + std::to_string(peer) + " sent " +
                                              unwire(*theirs).str() + ", rank " +
                                              std::to_string(rank_) + " posted a receive of " +
                                              unwire(*header).str() + "; nothing was received");
        ub = context_->createUnboundBuffer(buf, bytes);
        ub->recv(peer, slot);
      }
      if (ok) ok = is_send ? ub->waitSend(timeout_) : ub->waitRecv(timeout_);
      if (!ok) {
        op->finish(BP_COMM_ERROR_ABORTED, "gloo " + op->what + " on " + where() + " was aborted");
        return;
      }
      op->finish();
    } catch (...) {
      record(*op, std::current_exception());
    }
  };
  if (is_send)
    p2p_waits_.push(std::move(job));
  else
    start_receiver(std::move(job));
  return op;
}

std::shared_ptr<Op> Comm::send(const void* buf, uint64_t count, int32_t dtype, int32_t peer) {
  return p2p(true, const_cast<void*>(buf), count, dtype, peer);
}

std::shared_ptr<Op> Comm::recv(void* buf, uint64_t count, int32_t dtype, int32_t peer) {
  return p2p(false, buf, count, dtype, peer);
}

void Comm::abort() {
  if (aborted_.exchange(true)) return;
  // Operations blocked inside Gloo return at once (Note [Aborting Gloo]); closing the pairs
  // makes the peers' operations fail too.
  if (auto* tcp = dynamic_cast<gloo::transport::tcp::Context*>(context_->transport()))
    gloo::transport::tcp::ContextMutator::signal(
        *tcp, "the communicator was aborted on rank " + std::to_string(rank_));
  for (int i = 0; i < size_; ++i)
    if (i != rank_)
      if (auto& pair = context_->getPair(i)) pair->close();
}

}  // namespace bp::gloo_comm
