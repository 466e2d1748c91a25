// Test support for cuda_plugin_test: keeps one stream on cuda:0 and mirrors device tensors on
// the host as float64 values so every check compares against a float64 reference (docs/design.md,
// "Tests": fresh random inputs, guard bytes). Loading the plugin, the seed, the dtype encoders and
// the comparison are the shared ones of tests/support/backplane_test.
//
// Not thread-safe; tests run on one thread.
#ifndef BACKPLANE_CUDA_TEST_SUPPORT_HPP_
#define BACKPLANE_CUDA_TEST_SUPPORT_HPP_

#include <backplane/abi/plugin_abi.h>
#include <backplane_test/gtest_compare.hpp>
#include <backplane_test/plugin_test.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace bp_cuda_test {

// ---- The plugin ------------------------------------------------------------------------------

struct Plugin {
  void* handle = nullptr;
  const bp_plugin_api* api = nullptr;
  int32_t count = 0;
  std::string reason;
  bp_stream* stream = nullptr;  // on cuda:0, created when count > 0
};

// Throws std::runtime_error (gtest reports it) when e is an error; frees it.
inline void ok(bp_error* e, const std::string& what, const bp_plugin_api* api) {
  if (!e) return;
  const std::string msg = what + ": " + e->message + " [" + e->native_name + "]";
  api->error_free(e);
  throw std::runtime_error(msg);
}

// The plugin file: $BP_CUDA_PLUGIN when set, else the one built beside this test (found relative
// to the test binary, so a copied build tree works).
inline std::string plugin_path() {
  return bp_test::beside_exe(BP_CUDA_PLUGIN_REL, "BP_CUDA_PLUGIN");
}

inline Plugin& plugin() {
  static Plugin p = [] {
    Plugin q;
    bp_test::LoadedPlugin l = bp_test::load_plugin(plugin_path());
    if (!l.api) throw std::runtime_error(l.error);
    q.api = l.api;
    const char* reason = "";
    q.count = q.api->device_count(&reason);
    q.reason = reason;
    if (q.count > 0) ok(q.api->stream_create(0, &q.stream), "stream_create", q.api);
    return q;
  }();
  return p;
}

inline const bp_plugin_api* api() {
  return plugin().api;
}
inline bp_stream* stream() {
  return plugin().stream;
}
inline void check(bp_error* e, const std::string& what) {
  ok(e, what, api());
}
inline void sync() {
  check(api()->stream_synchronize(stream()), "stream_synchronize");
}

// The error of a call that must fail: code, message and native name (the error is freed).
struct Err {
  int32_t code = 0;
  std::string message, native;
};
inline Err error_of(bp_error* e) {
  if (!e) throw std::runtime_error("expected an error, the call succeeded");
  Err r{e->code, e->message, e->native_name};
  api()->error_free(e);
  return r;
}

// The error of a stream synchronisation that must fail (an asynchronous failure), after which
// the stream's sticky record (ABI 1.6, Note [Asynchronous errors]) is cleared as the host does,
// so the stream works again.
inline Err sync_error() {
  Err e = error_of(api()->stream_synchronize(stream()));
  if (BP_API_HAS_SLOT(api(), 6, stream_fault) && api()->stream_fault) {
    bp_stream_fault f{};
    f.struct_size = sizeof f;
    check(api()->stream_fault(stream(), 1, &f), "stream_fault (clear)");
  }
  return e;
}

// The random source of the run (the shared seed, printed); BP_TEST_SEED reproduces a run.
inline std::mt19937_64& rng() {
  return bp_test::rng("cuda_plugin_test");
}
inline double uniform(double lo, double hi) {
  return std::uniform_real_distribution<double>(lo, hi)(rng());
}
inline int64_t uniform_int(int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng());
}

// ---- Values of each dtype --------------------------------------------------------------------

inline bool is_float(int dt) {
  return dt == BP_DTYPE_F32 || dt == BP_DTYPE_F64 || dt == BP_DTYPE_F16 || dt == BP_DTYPE_BF16;
}
inline size_t dsize(int dt) {
  return bp_dtype_size(dt);
}

// Host encoding of one element, and v rounded to what dtype dt can hold (float -> integer
// truncates through int64; x -> bool is x != 0): the shared definitions.
using bp_test::decode;
using bp_test::encode;
inline double round_to(int dt, double v) {
  return bp_test::quantize(dt, v);
}

// Integer results wrap to the dtype's width.
inline double wrap(int dt, double v) {
  if (dt != BP_DTYPE_I32 && dt != BP_DTYPE_U8) return v;
  return static_cast<double>(bp_test::wrap_int(dt, static_cast<int64_t>(v)));
}

// The default relative tolerance of a dtype; 0 = exact.
inline double tolerance(int dt) {
  return bp_test::default_rtol(dt);
}

// out against the float64 reference as results of dtype dt, with the shared dtype-aware
// tolerance (Note [Tolerance over the whole range] in backplane_test/compare.hpp): `tol` is the
// relative tolerance (0: exact), `magnitude` the per-element size of what was accumulated.
inline ::testing::AssertionResult close(int dt, const std::vector<double>& out,
                                        const std::vector<double>& ref, double tol,
                                        const std::vector<double>& magnitude = {}) {
  return bp_test::all_close(dt, out, ref, {.rtol = tol, .magnitude = magnitude});
}

// ---- Device buffers and tensors --------------------------------------------------------------

class DevBuf {
 public:
  explicit DevBuf(uint64_t size, int device = 0, bp_stream* s = nullptr)
      : size_(size), device_(device), stream_(s ? s : stream()) {
    check(api()->mem_alloc(device_, stream_, size_, &buf_), "mem_alloc");
  }
  ~DevBuf() {
    if (buf_) {
      bp_error* e = api()->mem_free(device_, stream_, buf_, size_);
      if (e) api()->error_free(e);
    }
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  bp_buffer* get() const { return buf_; }
  uint64_t size() const { return size_; }

 private:
  uint64_t size_;
  int device_;
  bp_stream* stream_;
  bp_buffer* buf_ = nullptr;
};

// A strided view over device storage, with the storage's values mirrored on the host.
struct Tensor {
  int dtype = BP_DTYPE_F32;
  std::vector<int64_t> shape, strides;
  int64_t offset = 0;           // in elements
  std::vector<double> storage;  // host mirror of every storage element
  std::shared_ptr<DevBuf> buf;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
  bp_tensor_desc desc() const {
    bp_tensor_desc d{};
    d.struct_size = sizeof d;
    d.buffer = buf ? buf->get() : nullptr;
    d.offset = static_cast<uint64_t>(offset) * dsize(dtype);
    d.dtype = dtype;
    d.rank = static_cast<int32_t>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) {
      d.shape[i] = shape[i];
      d.strides[i] = strides[i];
    }
    return d;
  }
  // Storage index of each logical (row-major) element.
  std::vector<int64_t> positions() const {
    std::vector<int64_t> pos;
    const int64_t n = numel();
    pos.reserve(static_cast<size_t>(n));
    std::vector<int64_t> idx(shape.size(), 0);
    for (int64_t i = 0; i < n; ++i) {
      int64_t p = offset;
      for (size_t d = 0; d < shape.size(); ++d) p += idx[d] * strides[d];
      pos.push_back(p);
      for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
        if (++idx[static_cast<size_t>(d)] < shape[static_cast<size_t>(d)]) break;
        idx[static_cast<size_t>(d)] = 0;
      }
    }
    return pos;
  }
  // The logical values from the host mirror.
  std::vector<double> values() const {
    std::vector<double> v;
    for (int64_t p : positions()) v.push_back(storage[static_cast<size_t>(p)]);
    return v;
  }
  // Every storage element as it is on the device now (synchronises).
  std::vector<double> download_storage() const {
    std::vector<unsigned char> bytes(storage.size() * dsize(dtype));
    if (!bytes.empty()) {
      sync();
      check(api()->copy_d2h(stream(), bytes.data(), buf->get(), 0, bytes.size()), "copy_d2h");
      sync();
    }
    std::vector<double> v(storage.size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = decode(dtype, bytes.data() + i * dsize(dtype));
    return v;
  }
  // The logical values as they are on the device now.
  std::vector<double> download() const {
    const std::vector<double> s = download_storage();
    std::vector<double> v;
    for (int64_t p : positions()) v.push_back(s[static_cast<size_t>(p)]);
    return v;
  }
};

using Gen = std::function<double()>;

inline std::vector<int64_t> dense_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d)
    s[static_cast<size_t>(d)] = s[static_cast<size_t>(d) + 1] * shape[static_cast<size_t>(d) + 1];
  return s;
}

// Device storage of n elements filled from gen (rounded to the dtype).
inline Tensor storage_tensor(int dt, int64_t n, const Gen& gen) {
  Tensor t;
  t.dtype = dt;
  t.storage.resize(static_cast<size_t>(n));
  std::vector<unsigned char> bytes(static_cast<size_t>(n) * dsize(dt));
  for (size_t i = 0; i < t.storage.size(); ++i) {
    t.storage[i] = round_to(dt, gen());
    encode(dt, t.storage[i], bytes.data() + i * dsize(dt));
  }
  t.buf = std::make_shared<DevBuf>(std::max<uint64_t>(bytes.size(), 1));
  if (!bytes.empty())
    check(api()->copy_h2d(stream(), t.buf->get(), 0, bytes.data(), bytes.size()), "copy_h2d");
  sync();
  return t;
}

inline Tensor dense(int dt, const std::vector<int64_t>& shape, const Gen& gen) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  Tensor t = storage_tensor(dt, n, gen);
  t.shape = shape;
  t.strides = dense_strides(shape);
  return t;
}

// Same logical shape, stored with the last two dims swapped (a transposed view).
inline Tensor transposed(int dt, const std::vector<int64_t>& shape, const Gen& gen) {
  std::vector<int64_t> stored = shape;
  const size_t r = shape.size();
  std::swap(stored[r - 1], stored[r - 2]);
  Tensor t = dense(dt, stored, gen);
  t.shape = shape;
  std::swap(t.strides[r - 1], t.strides[r - 2]);
  return t;
}

// Generators of fresh random values for a dtype.
inline Gen any_values(int dt) {
  switch (dt) {
    case BP_DTYPE_I32:
    case BP_DTYPE_I64:
      return [] { return static_cast<double>(uniform_int(-1000, 1000)); };
    case BP_DTYPE_U8:
      return [] { return static_cast<double>(uniform_int(0, 255)); };
    case BP_DTYPE_BOOL:
      return [] { return static_cast<double>(uniform_int(0, 1)); };
    default:
      return [] { return uniform(-4.0, 4.0); };
  }
}
inline Gen range_values(double lo, double hi) {
  return [lo, hi] { return uniform(lo, hi); };
}

// ---- Launches --------------------------------------------------------------------------------

inline bp_attr attr_i(const char* name, int64_t v) {
  bp_attr a{};
  a.struct_size = sizeof a;
  a.name = name;
  a.kind = BP_ATTR_INT;
  a.i = v;
  return a;
}

// Launches op (resolved for dtype) on the test stream; returns the error, or nullptr.
inline bp_error* try_launch(const char* op, int dtype, const std::vector<const Tensor*>& ins,
                            const std::vector<const Tensor*>& outs,
                            const std::vector<bp_attr>& attrs = {}) {
  bp_kernel* k = nullptr;
  if (bp_error* e = api()->find_kernel(0, op, dtype, &k)) return e;
  std::vector<bp_tensor_desc> in, out;
  for (const Tensor* t : ins) in.push_back(t->desc());
  for (const Tensor* t : outs) out.push_back(t->desc());
  return api()->launch(k, stream(), in.data(), static_cast<int32_t>(in.size()), out.data(),
                       static_cast<int32_t>(out.size()), attrs.data(),
                       static_cast<int32_t>(attrs.size()));
}

inline void launch(const char* op, int dtype, const std::vector<const Tensor*>& ins,
                   const std::vector<const Tensor*>& outs, const std::vector<bp_attr>& attrs = {}) {
  check(try_launch(op, dtype, ins, outs, attrs),
        std::string("launch ") + op + " " + bp_dtype_name(dtype));
}

// Skips the test when the plugin found no GPU (CI).
#define BP_REQUIRE_GPU()                                                     \
  do {                                                                       \
    if (::bp_cuda_test::plugin().count == 0)                                 \
      GTEST_SKIP() << "no CUDA device: " << ::bp_cuda_test::plugin().reason; \
  } while (0)

}  // namespace bp_cuda_test

#endif  // BACKPLANE_CUDA_TEST_SUPPORT_HPP_
