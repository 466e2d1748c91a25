// One rank of the communicator suite (Note [Communicator suite processes] in
// conformance_comm.hpp): every test, in the same order on every rank, through the plugin's C
// table. Inputs are fresh random values from (seed, test, rank), so every rank computes the
// whole float64 reference; every output sits between guard bytes.
#include "conformance_child.hpp"
#include "conformance_comm.hpp"
#include "conformance_harness.hpp"

#include <backplane/abi/comm_abi.h>
#include <backplane/abi/error.h>
#include <backplane/abi/half.h>
#include <backplane_test/dtype_io.h>
#include <backplane/dist.hpp>
#include <backplane/runtime.hpp>
#include <backplane/sdk/plugin_sdk.hpp>
#include <backplane_test/compare.hpp>
#include <comm_host.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>

namespace bpc {

namespace {

using Clock = std::chrono::steady_clock;

class Fail : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class Skip : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string code_name(int32_t c) {
  const char* name = bp_error_code_name(c);
  return name ? name : "code " + std::to_string(c);
}

// ---- memory the plugin reduces ----------------------------------------------------------------

// Host memory for plugins that serve cpu; device memory goes through core's Device (native
// addresses and streams, plugin ABI 1.2).
class Memory {
 public:
  virtual ~Memory() = default;
  virtual void* alloc(size_t bytes) = 0;  // freed with the Memory
  virtual void write(void* dst, const void* src, size_t n) = 0;
  virtual void read(void* dst, const void* src, size_t n) = 0;
  virtual void* stream() = 0;  // native stream, NULL for host memory
  virtual void sync() = 0;     // wait for the stream
  virtual int ordinal() const = 0;
  virtual int dlpack() const = 0;
};

class HostMemory final : public Memory {
 public:
  void* alloc(size_t bytes) override {
    blocks_.emplace_back(new uint64_t[(bytes + 64) / 8 + 1]);
    return blocks_.back().get();
  }
  void write(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void read(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void* stream() override { return nullptr; }
  void sync() override {}
  int ordinal() const override { return 0; }
  int dlpack() const override { return 1; }

 private:
  std::vector<std::unique_ptr<uint64_t[]>> blocks_;
};

// Memory of a Backplane device (cuda), reached through core: buffers from its allocator,
// addressed by Buffer::native, copied with the device's stream-ordered copies, the native
// stream of its default stream (plugin ABI 1.2).
class DeviceMemory final : public Memory {
 public:
  explicit DeviceMemory(bp::Device& dev) : dev_(dev), where_(probe(dev)) {}
  void* alloc(size_t bytes) override {
    blocks_.push_back(dev_.allocator().allocate(bytes + 64));
    return blocks_.back()->native(0).address;
  }
  void write(void* dst, const void* src, size_t n) override {
    auto [buf, off] = find(dst);
    dev_.copy_from_host(dev_.default_stream(), *buf, off, src, n);
    dev_.default_stream().synchronize();
  }
  void read(void* dst, const void* src, size_t n) override {
    auto [buf, off] = find(src);
    dev_.copy_to_host(dev_.default_stream(), dst, *buf, off, n);
    dev_.default_stream().synchronize();
  }
  void* stream() override { return dev_.default_stream().native_handle(); }
  void sync() override { dev_.default_stream().synchronize(); }
  int ordinal() const override { return where_.device_ordinal; }
  int dlpack() const override { return where_.dlpack_device_type; }

 private:
  static bp::NativeBuffer probe(bp::Device& dev) { return dev.allocator().allocate(1)->native(0); }
  std::pair<bp::Buffer*, uint64_t> find(const void* p) {
    const char* c = static_cast<const char*>(p);
    for (auto& b : blocks_) {
      const char* base = static_cast<const char*>(b->native(0).address);
      if (c >= base && c < base + b->size()) return {b.get(), static_cast<uint64_t>(c - base)};
    }
    throw Fail("bp-conformance: an address outside the suite's device buffers");
  }
  bp::Device& dev_;
  bp::NativeBuffer where_;
  std::vector<std::shared_ptr<bp::Buffer>> blocks_;
};

constexpr size_t kGuard = 64;
constexpr unsigned char kPattern = 0xA5;

// A buffer with guard bytes on both sides.
struct Region {
  char* base = nullptr;
  char* data = nullptr;
  size_t bytes = 0;
};

// ---- values -----------------------------------------------------------------------------------

bool floating(int32_t dt) {
  return dt == BP_DTYPE_F32 || dt == BP_DTYPE_F64 || dt == BP_DTYPE_F16 || dt == BP_DTYPE_BF16;
}

void store(int32_t dt, void* p, size_t i, double v) {
  switch (dt) {
    case BP_DTYPE_F32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case BP_DTYPE_F64:
      static_cast<double*>(p)[i] = v;
      break;
    case BP_DTYPE_F16:
      static_cast<uint16_t*>(p)[i] = bp_float_to_f16(static_cast<float>(v));
      break;
    case BP_DTYPE_BF16:
      static_cast<uint16_t*>(p)[i] = bp_float_to_bf16(static_cast<float>(v));
      break;
    case BP_DTYPE_I32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case BP_DTYPE_I64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    default:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      break;
  }
}

// Fresh values of one rank for one test, as stored in the dtype (so the reference uses exactly
// what the plugin sees).
std::vector<char> make_input(uint64_t seed, int test, int rank, int world, int32_t dt, size_t n,
                             std::vector<double>* values) {
  std::mt19937_64 rng(seed ^ (static_cast<uint64_t>(test) << 20) ^ static_cast<uint64_t>(rank));
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<char> bytes(std::max<size_t>(n * bp_dtype_size(dt), 1));
  for (size_t i = 0; i < n; ++i) {
    double v;
    if (floating(dt))
      v = u(rng);
    else if (dt == BP_DTYPE_BOOL)
      v = u(rng) > 0 ? 1 : 0;
    else if (dt == BP_DTYPE_U8)
      v = std::floor((u(rng) + 1) / 2 * (255 / world));
    else
      v = std::floor(u(rng) * 1000);
    store(dt, bytes.data(), i, v);
  }
  if (values) {
    values->resize(n);
    for (size_t i = 0; i < n; ++i) (*values)[i] = bp_load_element(bytes.data(), dt, i);
  }
  return bytes;
}

double combine(double a, double b, int32_t op, int32_t dt) {
  if (dt == BP_DTYPE_BOOL) return op == BP_REDUCE_MIN ? (a && b) : (a || b);
  if (op == BP_REDUCE_MIN) return std::min(a, b);
  if (op == BP_REDUCE_MAX) return std::max(a, b);
  return a + b;
}

// A collective's output against the float64 reference, through the tests' one comparison
// (tests/support's compare.hpp): integers exactly; floating point with the table's reduction
// tolerance, times the world size for f16/bf16 (whose partial sums each round), each element
// measured against `mag`, the sum of the magnitudes reduced into it when given (a sum or an
// average of values of both signs can cancel to almost nothing: three bf16 values averaging to
// -0.002 carry roundings of their own size, ~1).
std::string compare(const std::vector<double>& out, const std::vector<double>& ref, int32_t dt,
                    int world, const std::vector<double>* mag = nullptr) {
  bp_test::Tolerance tol;
  if (floating(dt)) {
    const bool half = dt == BP_DTYPE_F16 || dt == BP_DTYPE_BF16;
    tol.rtol = bp_test::rtol(dt, bp_test::OpClass::reduction) * (half ? world : 1);
  }
  if (mag) tol.magnitude = *mag;
  bp_test::Verdict v = bp_test::compare(dt, out, ref, tol);
  return v ? "" : v.message;
}

// ---- the host's store, as bp_comm_host ---------------------------------------------------------

struct StoreCtx {
  bp::dist::Store* store;
  std::string prefix;
};

bp_error* host_err(int32_t code, const std::string& m) {
  return bp::sdk::make_error("bp-conformance", code, m, "");
}

bp_comm_host make_host(StoreCtx& ctx) {
  bp_comm_host h{};
  h.struct_size = sizeof h;
  h.ctx = &ctx;
  h.store_set = [](void* c, const char* key, const void* v, uint64_t n) -> bp_error* {
    auto* s = static_cast<StoreCtx*>(c);
    try {
      s->store->set(s->prefix + key, std::string(static_cast<const char*>(v), n));
      return nullptr;
    } catch (const std::exception& e) {
      return host_err(BP_COMM_ERROR_REMOTE, e.what());
    }
  };
  h.store_get = [](void* c, const char* key, int64_t timeout_ms, void** out,
                   uint64_t* n) -> bp_error* {
    auto* s = static_cast<StoreCtx*>(c);
    try {
      std::string v = s->store->get(s->prefix + key, std::chrono::milliseconds(timeout_ms));
      *out = std::malloc(v.size() + 1);
      std::memcpy(*out, v.data(), v.size());
      *n = v.size();
      return nullptr;
    } catch (const bp::dist::StoreTimeout& e) {
      return host_err(BP_COMM_ERROR_TIMEOUT, e.what());
    } catch (const std::exception& e) {
      return host_err(BP_COMM_ERROR_REMOTE, e.what());
    }
  };
  h.store_free = [](void*, void* v) { std::free(v); };
  h.store_add = [](void* c, const char* key, int64_t d, int64_t* out) -> bp_error* {
    auto* s = static_cast<StoreCtx*>(c);
    try {
      *out = s->store->add(s->prefix + key, d);
      return nullptr;
    } catch (const std::exception& e) {
      return host_err(BP_COMM_ERROR_REMOTE, e.what());
    }
  };
  h.error_free = [](void*, bp_error* e) { bp::sdk::free_error(e); };
  h.abort_requested = [](void*) -> int32_t { return 0; };
  h.log = [](void*, const char*) {};
  return h;
}

// ---- the suite --------------------------------------------------------------------------------

// Every dtype of the ABI, for the collectives that take them all.
constexpr int32_t dtypes[] = {BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_F16, BP_DTYPE_BF16,
                              BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_U8,  BP_DTYPE_BOOL};

class Suite {
 public:
  Suite(const CommChildOptions& o, const bp_comm_api* api, std::string label,
        std::unique_ptr<Memory> mem, std::string device, bp::dist::Store& store)
      : o_(o),
        api_(api),
        label_(std::move(label)),
        mem_(std::move(mem)),
        type_(device.substr(0, device.find(':'))),
        device_(std::move(device)),
        store_(store) {}

  void run();

 private:
  // Runs one test if the filters select it, and prints its result line.
  void test(const std::string& name, const std::function<void()>& body);
  void check(bp_error* e, const std::string& what) {
    if (!e) return;
    std::string m =
        code_name(e->code) + ": " + (e->message ? e->message : "") +
        (e->native_name && *e->native_name ? std::string(" [") + e->native_name + "]" : "");
    api_->error_free(e);
    throw Fail(what + " failed: " + m);
  }
  void wait(bp_comm_work* w, const std::string& what) {
    bp_error* e = api_->work_wait(w, static_cast<int64_t>(o_.timeout_s * 1000));
    if (e) {
      api_->work_free(w);
      check(e, what + ": work_wait");
    }
    api_->work_free(w);
  }
  Region region(size_t bytes) {
    Region r;
    r.bytes = bytes;
    r.base = static_cast<char*>(mem_->alloc(bytes + 2 * kGuard));
    std::vector<unsigned char> fill(bytes + 2 * kGuard, kPattern);
    mem_->write(r.base, fill.data(), fill.size());
    r.data = r.base + kGuard;
    return r;
  }
  std::vector<char> read(const Region& r) {
    std::vector<char> out(r.bytes + 2 * kGuard);
    mem_->sync();
    mem_->read(out.data(), r.base, out.size());
    for (size_t i = 0; i < kGuard; ++i)
      if (static_cast<unsigned char>(out[i]) != kPattern ||
          static_cast<unsigned char>(out[kGuard + r.bytes + i]) != kPattern)
        throw Fail(format(
            "the guard bytes around the output were overwritten (%s byte %zu)",
            i < kGuard && static_cast<unsigned char>(out[i]) != kPattern ? "leading" : "trailing",
            i));
    return std::vector<char>(out.begin() + kGuard, out.begin() + kGuard + r.bytes);
  }
  std::vector<double> values(const std::vector<char>& bytes, int32_t dt, size_t n) {
    std::vector<double> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = bp_load_element(bytes.data(), dt, i);
    return v;
  }
  // Every rank's input of test `t`.
  std::vector<std::vector<double>> inputs(int t, int32_t dt, size_t n) {
    std::vector<std::vector<double>> all(static_cast<size_t>(o_.world));
    for (int r = 0; r < o_.world; ++r) make_input(o_.seed, t, r, o_.world, dt, n, &all[r]);
    return all;
  }
  std::vector<double> reduce_ref(const std::vector<std::vector<double>>& all, int32_t op,
                                 int32_t dt) {
    std::vector<double> ref = all[0];
    for (size_t k = 1; k < all.size(); ++k)
      for (size_t i = 0; i < ref.size(); ++i) ref[i] = combine(ref[i], all[k][i], op, dt);
    if (op == BP_REDUCE_AVG)
      for (double& v : ref) v /= o_.world;
    if (dt == BP_DTYPE_U8 && op == BP_REDUCE_SUM)
      for (double& v : ref) v = std::fmod(v, 256.0);
    return ref;
  }
  // Per element, the sum of |x| over the ranks (divided by the world size for avg): the scale of
  // a sum's or average's rounding error. Empty for min and max (exact).
  std::vector<double> reduce_mag(const std::vector<std::vector<double>>& all, int32_t op) {
    if (op != BP_REDUCE_SUM && op != BP_REDUCE_AVG) return {};
    std::vector<double> mag(all[0].size(), 0.0);
    for (const auto& v : all)
      for (size_t i = 0; i < mag.size(); ++i) mag[i] += std::fabs(v[i]);
    if (op == BP_REDUCE_AVG)
      for (double& m : mag) m /= o_.world;
    return mag;
  }
  void expect_same(const std::vector<double>& out, const std::vector<double>& ref, int32_t dt,
                   const std::vector<double>& mag = {}) {
    std::string why = compare(out, ref, dt, o_.world, mag.empty() ? nullptr : &mag);
    if (!why.empty()) throw Fail(why);
  }

  void all_reduce_case(int32_t dt, int32_t op, size_t n, size_t offset, bool in_place);
  // The suites of run(), in order (each test of a suite is filtered and reported on its own).
  void all_reduce_tests();
  void broadcast_tests();
  void all_gather_tests();
  void reduce_scatter_tests();
  void point_to_point_and_handle_tests();
  void recovery_tests();
  void abort_and_destroy_tests();
  void core_tests();

  const CommChildOptions& o_;
  const bp_comm_api* api_;
  std::string label_;
  std::unique_ptr<Memory> mem_;
  std::string type_, device_;  // "cuda", "cuda:1"
  bp::dist::Store& store_;
  bp_comm* comm_ = nullptr;
  int test_id_ = 0;
};

void Suite::test(const std::string& name, const std::function<void()>& body) {
  ++test_id_;
  std::string full = "comm." + name;
  if (!o_.filters.empty() && !matches_filters(o_.filters, full)) return;
  if (o_.list) {
    std::printf("R\t%s\tSKIP\t0\tlisted\n", full.c_str());
    return;
  }
  auto t0 = Clock::now();
  std::string status = "PASS", message;
  try {
    body();
  } catch (const Skip& e) {
    status = "SKIP";
    message = e.what();
  } catch (const std::exception& e) {
    status = "FAIL";
    message = e.what();
  }
  double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  for (char& c : message)
    if (c == '\n' || c == '\t') c = ' ';
  std::printf("R\t%s\t%s\t%.3f\t%s\n", full.c_str(), status.c_str(), sec, message.c_str());
  std::fflush(stdout);
}

void Suite::all_reduce_case(int32_t dt, int32_t op, size_t n, size_t offset, bool in_place) {
  int t = test_id_;
  size_t es = bp_dtype_size(dt);
  std::vector<char> in = make_input(o_.seed, t, o_.rank, o_.world, dt, n, nullptr);
  Region send = region((n + offset) * es), recv = region((n + offset) * es);
  if (n) mem_->write(send.data + offset * es, in.data(), n * es);
  char* sp = send.data + offset * es;
  char* rp = in_place ? sp : recv.data + offset * es;
  bp_comm_work* w = nullptr;
  bp_error* e = api_->all_reduce(comm_, sp, rp, n, dt, op, mem_->stream(), &w);
  if (op == BP_REDUCE_AVG && !floating(dt)) {
    if (!e) {
      wait(w, "all_reduce");
      throw Fail("avg on " + std::string(bp_dtype_name(dt)) +
                 " was accepted; comm_abi.h requires BP_ERROR_INVALID_ARGUMENT");
    }
    int32_t code = e->code;
    api_->error_free(e);
    if (code != BP_ERROR_INVALID_ARGUMENT)
      throw Fail("avg on an integer dtype gave " + code_name(code) +
                 ", expected BP_ERROR_INVALID_ARGUMENT");
    return;
  }
  check(e, "all_reduce");
  wait(w, "all_reduce");
  std::vector<char> got = read(in_place ? send : recv);
  std::vector<double> out = values(std::vector<char>(got.begin() + offset * es, got.end()), dt, n);
  auto all = inputs(t, dt, n);
  expect_same(out, reduce_ref(all, op, dt), dt, reduce_mag(all, op));
}

void Suite::run() {
  const std::string& L = label_;

  test("abi.table[" + L + "]", [&] {
    // Comm ABI 1.0 and 1.1 tables end before the 1.2 slots.
    if (api_->struct_size < offsetof(bp_comm_api, capabilities))
      throw Fail(
          format("struct_size %zu < %zu", api_->struct_size, offsetof(bp_comm_api, capabilities)));
    if (api_->abi_major != BP_COMM_ABI_MAJOR) throw Fail("other major");
    if (!api_->device_types || !api_->device_types[0]) throw Fail("no device types declared");
    if (!!api_->group_start != !!api_->group_end)
      throw Fail("group_start and group_end must be both set or both NULL");
    api_->error_free(nullptr);  // accepts NULL
    const char* reason = nullptr;
    if (!api_->available(&reason))
      throw Fail(std::string("not available: ") + (reason ? reason : ""));
    if (!reason || !*reason) throw Fail("available() gave no description of the library");
  });

  StoreCtx ctx{&store_, "comm/"};
  bp_comm_host host = make_host(ctx);
  test("create[" + L + "," + type_ + "," + std::to_string(o_.world) + " ranks]", [&] {
    bp_comm_config cfg{};
    cfg.struct_size = sizeof cfg;
    cfg.rank = o_.rank;
    cfg.world_size = o_.world;
    cfg.device_type = type_.c_str();
    cfg.device_ordinal = mem_->ordinal();
    cfg.dlpack_device_type = mem_->dlpack();
    cfg.timeout_ms = static_cast<int64_t>(o_.timeout_s * 1000);
    cfg.local_address = "127.0.0.1";
    check(api_->comm_create(&cfg, &host, &comm_), "comm_create");
  });
  if (!comm_ && !o_.list) {  // filtered out, or failed: only the core tests can run
    core_tests();
    return;
  }

  all_reduce_tests();
  broadcast_tests();
  all_gather_tests();
  reduce_scatter_tests();
  point_to_point_and_handle_tests();
  recovery_tests();
  abort_and_destroy_tests();
  core_tests();
}

// Every dtype and reduction at three sizes, in place, at odd offsets.
void Suite::all_reduce_tests() {
  const std::string& L = label_;
  for (int32_t dt : dtypes)
    for (int32_t op = 0; op < BP_REDUCE_COUNT; ++op)
      for (size_t n : {size_t{1}, size_t{1001}, size_t{65539}})
        test(format("all_reduce[%s,%s,%s,n=%zu]", L.c_str(), bp_dtype_name(dt),
                    bp_reduce_op_name(op), n),
             [&] { all_reduce_case(dt, op, n, 0, false); });
  for (int32_t dt : {BP_DTYPE_F32, BP_DTYPE_I64, BP_DTYPE_BF16})
    test(format("all_reduce_in_place[%s,%s,n=4099]", L.c_str(), bp_dtype_name(dt)),
         [&] { all_reduce_case(dt, BP_REDUCE_SUM, 4099, 0, true); });
  for (size_t off : {size_t{1}, size_t{3}})
    test(format("all_reduce_odd_offset[%s,f64,n=333,offset %zu elements]", L.c_str(), off),
         [&] { all_reduce_case(BP_DTYPE_F64, BP_REDUCE_MAX, 333, off, false); });
}

// From every root.
void Suite::broadcast_tests() {
  const std::string& L = label_;
  for (int32_t dt : {BP_DTYPE_F32, BP_DTYPE_F16, BP_DTYPE_I32, BP_DTYPE_BOOL})
    for (int root = 0; root < o_.world; ++root)
      test(format("broadcast[%s,%s,n=1001,root %d]", L.c_str(), bp_dtype_name(dt), root), [&] {
        int t = test_id_;
        size_t n = 1001, es = bp_dtype_size(dt);
        std::vector<char> in = make_input(o_.seed, t, o_.rank, o_.world, dt, n, nullptr);
        Region buf = region(n * es);
        mem_->write(buf.data, in.data(), n * es);
        bp_comm_work* w = nullptr;
        check(api_->broadcast(comm_, buf.data, buf.data, n, dt, root, mem_->stream(), &w),
              "broadcast");
        wait(w, "broadcast");
        expect_same(values(read(buf), dt, n), inputs(t, dt, n)[static_cast<size_t>(root)], dt);
      });
}

// Every dtype, out of place and in place.
void Suite::all_gather_tests() {
  const std::string& L = label_;
  for (int32_t dt : dtypes)
    for (bool in_place : {false, true})
      test(format("all_gather[%s,%s,n=517%s]", L.c_str(), bp_dtype_name(dt),
                  in_place ? ",in place" : ""),
           [&] {
             int t = test_id_;
             size_t n = 517, es = bp_dtype_size(dt);
             std::vector<char> in = make_input(o_.seed, t, o_.rank, o_.world, dt, n, nullptr);
             Region send = region(n * es), recv = region(n * es * o_.world);
             char* sp = send.data;
             if (in_place) sp = recv.data + static_cast<size_t>(o_.rank) * n * es;
             mem_->write(sp, in.data(), n * es);
             bp_comm_work* w = nullptr;
             check(api_->all_gather(comm_, sp, recv.data, n, dt, mem_->stream(), &w), "all_gather");
             wait(w, "all_gather");
             std::vector<double> ref;
             for (auto& v : inputs(t, dt, n)) ref.insert(ref.end(), v.begin(), v.end());
             expect_same(values(read(recv), dt, n * o_.world), ref, dt);
           });
}

// Every dtype and reduction.
void Suite::reduce_scatter_tests() {
  const std::string& L = label_;
  for (int32_t dt : dtypes)
    for (int32_t op = 0; op < BP_REDUCE_COUNT; ++op) {
      if (op == BP_REDUCE_AVG && !floating(dt)) continue;
      test(format("reduce_scatter[%s,%s,%s,n=259]", L.c_str(), bp_dtype_name(dt),
                  bp_reduce_op_name(op)),
           [&] {
             int t = test_id_;
             size_t n = 259, es = bp_dtype_size(dt), total = n * o_.world;
             std::vector<char> in = make_input(o_.seed, t, o_.rank, o_.world, dt, total, nullptr);
             Region send = region(total * es), recv = region(n * es);
             mem_->write(send.data, in.data(), total * es);
             bp_comm_work* w = nullptr;
             check(api_->reduce_scatter(comm_, send.data, recv.data, n, dt, op, mem_->stream(), &w),
                   "reduce_scatter");
             wait(w, "reduce_scatter");
             auto all = inputs(t, dt, total);
             auto full = reduce_ref(all, op, dt), full_mag = reduce_mag(all, op);
             const long first = o_.rank * static_cast<long>(n), last = first + static_cast<long>(n);
             std::vector<double> ref(full.begin() + first, full.begin() + last), mag;
             if (!full_mag.empty()) mag.assign(full_mag.begin() + first, full_mag.begin() + last);
             expect_same(values(read(recv), dt, n), ref, dt, mag);
           });
    }
}

// Empty collectives, a ring of send/recv, barrier, work handles, errors.
void Suite::point_to_point_and_handle_tests() {
  const std::string& L = label_;
  test("empty[" + L + ",all_reduce,broadcast,all_gather,reduce_scatter,n=0]", [&] {
    Region r = region(0);
    bp_comm_work* w = nullptr;
    check(
        api_->all_reduce(comm_, r.data, r.data, 0, BP_DTYPE_F32, BP_REDUCE_SUM, mem_->stream(), &w),
        "all_reduce of 0");
    wait(w, "all_reduce of 0");
    check(api_->broadcast(comm_, r.data, r.data, 0, BP_DTYPE_F32, 0, mem_->stream(), &w),
          "broadcast of 0");
    wait(w, "broadcast of 0");
    check(api_->all_gather(comm_, r.data, r.data, 0, BP_DTYPE_F32, mem_->stream(), &w),
          "all_gather of 0");
    wait(w, "all_gather of 0");
    check(api_->reduce_scatter(comm_, r.data, r.data, 0, BP_DTYPE_F32, BP_REDUCE_SUM,
                               mem_->stream(), &w),
          "reduce_scatter of 0");
    wait(w, "reduce_scatter of 0");
    read(r);  // guards intact
  });

  test("send_recv[" + L + ",ring,f32,n=70001]", [&] {
    if (o_.world < 2) throw Skip("needs 2 ranks");
    int t = test_id_;
    size_t n = 70001, es = 4;
    int to = (o_.rank + 1) % o_.world, from = (o_.rank + o_.world - 1) % o_.world;
    std::vector<char> in = make_input(o_.seed, t, o_.rank, o_.world, BP_DTYPE_F32, n, nullptr);
    Region send = region(n * es), recv = region(n * es);
    mem_->write(send.data, in.data(), n * es);
    bp_comm_work *ws = nullptr, *wr = nullptr;
    bool grouped = api_->group_start != nullptr;
    if (grouped) check(api_->group_start(comm_), "group_start");
    check(api_->send(comm_, send.data, n, BP_DTYPE_F32, to, mem_->stream(), &ws), "send");
    check(api_->recv(comm_, recv.data, n, BP_DTYPE_F32, from, mem_->stream(), &wr), "recv");
    if (grouped) check(api_->group_end(comm_), "group_end");
    wait(ws, "send");
    wait(wr, "recv");
    expect_same(values(read(recv), BP_DTYPE_F32, n),
                inputs(t, BP_DTYPE_F32, n)[static_cast<size_t>(from)], BP_DTYPE_F32);
  });

  test("barrier[" + L + "]", [&] {
    if (!api_->barrier) throw Skip("barrier is NULL (optional): the host all_reduces one i32");
    for (int i = 0; i < 3; ++i) {
      bp_comm_work* w = nullptr;
      check(api_->barrier(comm_, mem_->stream(), &w), "barrier");
      wait(w, "barrier");
    }
  });

  test("work_handles[" + L + "]", [&] {
    Region r = region(4096 * 4);
    bp_comm_work* w = nullptr;
    check(api_->all_reduce(comm_, r.data, r.data, 4096, BP_DTYPE_F32, BP_REDUCE_MAX, mem_->stream(),
                           &w),
          "all_reduce");
    int32_t done = -1;
    check(api_->work_test(w, &done), "work_test");
    if (done != 0 && done != 1) throw Fail(format("work_test set done = %d", done));
    check(api_->work_wait(w, static_cast<int64_t>(o_.timeout_s * 1000)), "work_wait");
    check(api_->work_test(w, &done), "work_test after completion");
    if (done != 1) throw Fail("work_test says not done after work_wait succeeded");
    check(api_->work_wait(w, 0), "work_wait(0) after completion");
    api_->work_free(w);
  });

  test("errors[" + L + "]", [&] {
    Region r = region(64);
    auto expect_invalid = [&](bp_error* e, const std::string& what) {
      if (!e) throw Fail(what + " was accepted; expected BP_ERROR_INVALID_ARGUMENT");
      int32_t code = e->code;
      std::string msg = e->message ? e->message : "";
      std::string plugin = e->plugin ? e->plugin : "";
      api_->error_free(e);
      if (code != BP_ERROR_INVALID_ARGUMENT)
        throw Fail(what + " gave " + code_name(code) + ", expected BP_ERROR_INVALID_ARGUMENT");
      if (msg.empty() || plugin.empty())
        throw Fail(what + ": the error object has no message or plugin name");
    };
    bp_comm_work* w = nullptr;
    expect_invalid(
        api_->all_reduce(comm_, r.data, r.data, 4, 99, BP_REDUCE_SUM, mem_->stream(), &w),
        "all_reduce with dtype 99");
    expect_invalid(api_->all_reduce(comm_, r.data, r.data, 4, BP_DTYPE_F32, 42, mem_->stream(), &w),
                   "all_reduce with reduction 42");
    expect_invalid(
        api_->broadcast(comm_, r.data, r.data, 4, BP_DTYPE_F32, o_.world, mem_->stream(), &w),
        "broadcast from root " + std::to_string(o_.world));
    expect_invalid(api_->send(comm_, r.data, 4, BP_DTYPE_F32, o_.rank, mem_->stream(), &w),
                   "send to itself");
  });
}

// Last: a timeout, comm_abort and comm_destroy.
// Comm ABI 1.2 (Note [Comm fault recovery]): the capability bits, and comm_shrink either
// refused at once with BP_ERROR_UNSUPPORTED or, for a plugin that can shrink, building the
// communicator of every rank but the last one, whose all_reduce is checked.
void Suite::recovery_tests() {
  const std::string& L = label_;
  test("capabilities_and_shrink[" + L + "]", [&] {
    if (api_->abi_minor < 2 ||
        api_->struct_size < offsetof(bp_comm_api, comm_shrink) + sizeof(api_->comm_shrink))
      throw Skip(
          format("a comm ABI 1.%u plugin: no capabilities or comm_shrink slots", api_->abi_minor));
    if (!api_->capabilities) throw Skip("capabilities is NULL (the 1.0 contract's bits)");
    const char* why = nullptr;
    uint64_t caps = api_->capabilities(&why);
    std::string reason = why ? why : "";
    if (!(caps & BP_COMM_CAP_ABORT_ANY_THREAD))
      throw Fail(
          "BP_COMM_CAP_ABORT_ANY_THREAD is missing (comm_abort from any thread is "
          "required since 1.0)");
    if (o_.world < 2) throw Skip("needs 2 ranks: one to exclude");
    const int last = o_.world - 1;
    int32_t excluded = last;
    bp_comm_config cfg{};
    cfg.struct_size = sizeof cfg;
    cfg.rank = o_.rank == last ? 0 : o_.rank;
    cfg.world_size = o_.world - 1;
    cfg.device_type = type_.c_str();
    cfg.device_ordinal = mem_->ordinal();
    cfg.dlpack_device_type = mem_->dlpack();
    cfg.timeout_ms = static_cast<int64_t>(o_.timeout_s * 1000);
    cfg.local_address = "127.0.0.1";
    if (!(caps & BP_COMM_CAP_SHRINK)) {
      if (reason.empty()) throw Fail("no BP_COMM_CAP_SHRINK and no reason given");
      if (!api_->comm_shrink || o_.rank == last) return;
      bp_comm* small = nullptr;
      bp_error* e = api_->comm_shrink(comm_, &excluded, 1, &cfg, 0, &small);
      int32_t code = e ? e->code : 0;
      if (e) api_->error_free(e);
      if (small) api_->comm_destroy(small);
      if (code != BP_ERROR_UNSUPPORTED)
        throw Fail("comm_shrink without BP_COMM_CAP_SHRINK gave " +
                   (code ? code_name(code) : std::string("success")) +
                   ", expected BP_ERROR_UNSUPPORTED");
      return;
    }
    if (!api_->comm_shrink) throw Fail("BP_COMM_CAP_SHRINK is set but comm_shrink is NULL");
    if (o_.rank == last) {  // excluded: waits until the others are done
      store_.get("cc/shrunk", std::chrono::milliseconds(static_cast<int64_t>(o_.timeout_s * 1000)));
      return;
    }
    bp_comm* small = nullptr;
    check(api_->comm_shrink(comm_, &excluded, 1, &cfg, 0, &small), "comm_shrink");
    const int t = test_id_;
    const size_t n = 1001;
    std::vector<char> in = make_input(o_.seed, t, o_.rank, o_.world, BP_DTYPE_F32, n, nullptr);
    Region buf = region(n * 4);
    mem_->write(buf.data, in.data(), n * 4);
    bp_comm_work* w = nullptr;
    check(api_->all_reduce(small, buf.data, buf.data, n, BP_DTYPE_F32, BP_REDUCE_SUM,
                           mem_->stream(), &w),
          "all_reduce on the shrunk communicator");
    wait(w, "all_reduce on the shrunk communicator");
    std::vector<double> out = values(read(buf), BP_DTYPE_F32, n);
    auto all = inputs(t, BP_DTYPE_F32, n);
    all.pop_back();  // the excluded rank's
    expect_same(out, reduce_ref(all, BP_REDUCE_SUM, BP_DTYPE_F32), BP_DTYPE_F32,
                reduce_mag(all, BP_REDUCE_SUM));
    check(api_->comm_destroy(small), "comm_destroy of the shrunk communicator");
    if (o_.rank == 0) store_.set("cc/shrunk", "1");
  });
}

void Suite::abort_and_destroy_tests() {
  const std::string& L = label_;
  // Last: leaves the communicator aborted.
  test("timeout_and_abort[" + L + "]", [&] {
    if (o_.world < 2) throw Skip("needs 2 ranks: one waits for the others, who stay away");
    Region r = region(16 * 4);
    bp_comm_work* w = nullptr;
    if (o_.rank == 0) {
      check(api_->all_reduce(comm_, r.data, r.data, 16, BP_DTYPE_F32, BP_REDUCE_SUM, mem_->stream(),
                             &w),
            "all_reduce");
      auto t0 = Clock::now();
      bp_error* e = api_->work_wait(w, 300);
      double waited = std::chrono::duration<double>(Clock::now() - t0).count();
      std::string got = e ? code_name(e->code) : "success";
      if (e) api_->error_free(e);
      store_.set("cc/timeout_checked", "1");
      if (got != "BP_COMM_ERROR_TIMEOUT")
        throw Fail("work_wait(300 ms) on an all_reduce the other ranks never join gave " + got +
                   ", expected BP_COMM_ERROR_TIMEOUT");
      if (waited > 30) throw Fail(format("work_wait(300 ms) took %.1f s", waited));
    } else {
      store_.get("cc/timeout_checked",
                 std::chrono::milliseconds(static_cast<int64_t>(o_.timeout_s * 1000)));
    }
    check(api_->comm_abort(comm_), "comm_abort");
    if (w) {
      auto t0 = Clock::now();
      bp_error* e = api_->work_wait(w, static_cast<int64_t>(o_.timeout_s * 1000));
      double waited = std::chrono::duration<double>(Clock::now() - t0).count();
      std::string got = e ? code_name(e->code) : "success";
      if (e) api_->error_free(e);
      api_->work_free(w);
      if (got == "success" || got == "BP_COMM_ERROR_TIMEOUT")
        throw Fail("the aborted all_reduce's work_wait gave " + got +
                   ", expected an error (BP_COMM_ERROR_ABORTED or _REMOTE)");
      if (waited > 30) throw Fail(format("an aborted operation took %.1f s to complete", waited));
    }
  });

  test("destroy[" + L + "]", [&] {
    check(api_->comm_destroy(comm_), "comm_destroy");
    comm_ = nullptr;
  });
}

// Through core's bp::dist, with this plugin as the backend: non-contiguous tensors, whose
// packing and unpacking around the plugin's contiguous buffers is the host's part.
void Suite::core_tests() {
  const std::string& L = label_;
  bool joined = false;
  test("core.init[" + L + "]", [&] {
    bp::dist::InitOptions io;
    io.rank = o_.rank;
    io.world_size = o_.world;
    io.init_method = "tcp://127.0.0.1:" + std::to_string(o_.store_port);
    io.backend = type_ + ":" + label_;
    io.timeout = std::chrono::milliseconds(static_cast<int64_t>(o_.timeout_s * 1000));
    bp::dist::init_process_group(io);
    joined = true;
  });
  if (!joined && !o_.list) return;
  bp::Device* dev = nullptr;
  auto device = [&]() -> bp::Device& {
    if (!dev) dev = &bp::device(device_);
    return *dev;
  };
  // Rank r's values for test t as an f64 host vector and a tensor of `dt` on the device.
  auto tensor_of = [&](int t, int r, int32_t dt, int64_t n) {
    std::vector<double> v;
    std::vector<char> bytes = make_input(o_.seed, t, r, o_.world, dt, static_cast<size_t>(n), &v);
    return bp::from_bytes(bytes.data(), static_cast<size_t>(n) * bp_dtype_size(dt), {n},
                          static_cast<bp::DType>(dt), bp::device("cpu:0"))
        .to(device());
  };
  for (int32_t dt : {BP_DTYPE_F32, BP_DTYPE_I64, BP_DTYPE_BF16})
    test(format("core.all_reduce_transposed[%s,%s,7x9 view]", L.c_str(), bp_dtype_name(dt)), [&] {
      int t = test_id_;
      bp::Tensor base = tensor_of(t, o_.rank, dt, 63).reshape({9, 7});
      bp::dist::all_reduce(base.t(), bp::dist::ReduceOp::max).wait();
      expect_same(base.to_vector<double>(), reduce_ref(inputs(t, dt, 63), BP_REDUCE_MAX, dt), dt);
    });
  test(format("core.all_gather_strided[%s,f32,strided in, transposed out]", L.c_str()), [&] {
    int t = test_id_;
    bp::Tensor in = tensor_of(t, o_.rank, BP_DTYPE_F32, 12).slice(0, 1, 12, 3);  // 4 elements
    bp::Tensor out = bp::zeros({4, o_.world}, device()).t();
    bp::dist::all_gather(out, in).wait();
    std::vector<double> ref;
    for (auto& v : inputs(t, BP_DTYPE_F32, 12))
      for (size_t i = 1; i < 12; i += 3) ref.push_back(v[i]);
    expect_same(out.to_vector<double>(), ref, BP_DTYPE_F32);
  });
  test(format("core.reduce_scatter_strided[%s,f64,sum]", L.c_str()), [&] {
    int t = test_id_;
    int64_t n = 5;
    bp::Tensor in =
        tensor_of(t, o_.rank, BP_DTYPE_F64, 2 * n * o_.world).slice(0, 0, 2 * n * o_.world, 2);
    bp::Tensor out = bp::zeros({2 * n}, device(), bp::DType::f64).slice(0, 0, 2 * n, 2);
    bp::dist::reduce_scatter(out, in).wait();
    std::vector<std::vector<double>> all;
    for (auto& v : inputs(t, BP_DTYPE_F64, 2 * n * o_.world)) {
      std::vector<double> even;
      for (size_t i = 0; i < v.size(); i += 2) even.push_back(v[i]);
      all.push_back(even);
    }
    auto full = reduce_ref(all, BP_REDUCE_SUM, BP_DTYPE_F64);
    auto full_mag = reduce_mag(all, BP_REDUCE_SUM);
    std::vector<double> ref(full.begin() + o_.rank * n, full.begin() + (o_.rank + 1) * n);
    std::vector<double> mag(full_mag.begin() + o_.rank * n, full_mag.begin() + (o_.rank + 1) * n);
    expect_same(out.to_vector<double>(), ref, BP_DTYPE_F64, mag);
  });
  test(format("core.broadcast_column[%s,i32,root %d]", L.c_str(), o_.world - 1), [&] {
    int t = test_id_;
    bp::Tensor m = tensor_of(t, o_.rank, BP_DTYPE_I32, 24).reshape({6, 4});
    bp::Tensor col = m.select(1, 2);  // stride 4
    bp::dist::broadcast(col, o_.world - 1).wait();
    auto root = inputs(t, BP_DTYPE_I32, 24)[static_cast<size_t>(o_.world - 1)];
    auto mine = inputs(t, BP_DTYPE_I32, 24)[static_cast<size_t>(o_.rank)];
    for (int r = 0; r < 6; ++r)
      mine[static_cast<size_t>(r * 4 + 2)] = root[static_cast<size_t>(r * 4 + 2)];
    expect_same(m.to_vector<double>(), mine, BP_DTYPE_I32);
  });
  test("core.destroy[" + L + "]", [&] {
    if (bp::dist::is_initialized()) bp::dist::destroy_process_group();
  });
}

}  // namespace

int comm_child_main(const CommChildOptions& o) {
  const bp_comm_api* api = nullptr;
  std::string label = o.plugin, load_error;
  try {
    bp::host::LoadedCommPlugin lp = bp::host::load_comm_plugin(o.plugin);
    api = lp.api;
    if (!api && !lp.report.path.empty())
      load_error = lp.report.path + ": " + lp.report.decision + ": " + lp.report.reason;
    if (!lp.report.name.empty()) label = lp.report.name;
    if (!api && load_error.empty())
      load_error = "no communicator plugin named '" + o.plugin +
                   "' in the plugin search path (bp-smi lists them)";
  } catch (const std::exception& e) {
    load_error = e.what();
  }
  if (!api) {
    std::printf("R\tcomm.load[%s]\tFAIL\t0\t%s\n", label.c_str(), load_error.c_str());
    return 1;
  }
  const char* reason = nullptr;
  if (!api->available(&reason)) {
    std::printf("R\tcomm.available[%s]\tFAIL\t0\tthe plugin cannot run here: %s\n", label.c_str(),
                reason ? reason : "(no reason given)");
    return 1;
  }
  std::string type = o.device;
  if (type.empty()) type = api->device_types[0];
  std::string dev_type = type.substr(0, type.find(':'));
  std::unique_ptr<Memory> mem;
  try {
    if (dev_type == "cpu") {
      mem = std::make_unique<HostMemory>();
    } else {
      // "cuda" without an index: rank r on cuda:<r mod the number of devices>.
      if (type.find(':') == std::string::npos) {
        int count = bp::num_devices(dev_type);
        if (count == 0) throw std::runtime_error(bp::is_available(dev_type).reason);
        type = dev_type + ":" + std::to_string(o.rank % count);
      }
      mem = std::make_unique<DeviceMemory>(bp::device(type));
    }
  } catch (const std::exception& e) {
    std::printf("R\tcomm.memory[%s,%s]\tFAIL\t0\tno memory of %s for the suite: %s\n",
                label.c_str(), type.c_str(), type.c_str(), e.what());
    return 1;
  }
  try {
    bp::dist::TcpStore store(
        "127.0.0.1", o.store_port,
        std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000)),
        std::getenv("BACKPLANE_STORE_SECRET") ? std::getenv("BACKPLANE_STORE_SECRET") : "");
    Suite suite(o, api, label, std::move(mem), type, store);
    suite.run();
  } catch (const std::exception& e) {
    std::printf("R\tcomm.rank[%s,rank %d]\tFAIL\t0\t%s\n", label.c_str(), o.rank, e.what());
    return 1;
  }
  return 0;
}

}  // namespace bpc
