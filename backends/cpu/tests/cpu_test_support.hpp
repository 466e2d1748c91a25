// Helpers of cpu_plugin_test.cpp: host tensors with explicit views (strides, offsets,
// broadcasts) over float64 values, device tensors with guard bytes and launches. Loading the
// plugin, the seed, the dtype encoders and the comparison with the float64 reference are the
// shared ones of tests/support/backplane_test.
//
// Everything here runs on the test's thread; the plugin is loaded once per process and never
// unloaded.
#ifndef BACKPLANE_CPU_TEST_SUPPORT_HPP_
#define BACKPLANE_CPU_TEST_SUPPORT_HPP_

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
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace bpt {

// ---- The plugin ------------------------------------------------------------------------------

struct Plugin {
  void* handle = nullptr;
  const bp_plugin_api* api = nullptr;
  bp_stream* stream = nullptr;
  std::string error;  // why loading failed, when api is NULL
};

// The plugin built beside this test ($<PATH:RELATIVE_PATH> from the test binary, so a copied
// build tree works); BP_CPU_PLUGIN overrides it.
inline Plugin load_plugin() {
  Plugin p;
  bp_test::LoadedPlugin l =
      bp_test::load_plugin(bp_test::beside_exe(BP_CPU_PLUGIN_REL, "BP_CPU_PLUGIN"));
  if (!l.api) {
    p.error = l.error;
    return p;
  }
  if (bp_error* e = l.api->stream_create(0, &p.stream)) {
    p.error = std::string("stream_create failed: ") + e->message;
    l.api->error_free(e);
    return p;
  }
  p.api = l.api;
  return p;
}

inline Plugin& plugin() {
  static Plugin p = load_plugin();
  return p;
}
inline const bp_plugin_api& api() {
  return *plugin().api;
}
inline bp_stream* stream() {
  return plugin().stream;
}

// ---- Errors ----------------------------------------------------------------------------------

// Success for NULL; otherwise a failure carrying the plugin's message. Frees the error.
inline ::testing::AssertionResult ok(bp_error* e) {
  if (!e) return ::testing::AssertionSuccess();
  ::testing::AssertionResult r = ::testing::AssertionFailure()
                                 << "plugin error " << e->code << " [" << e->native_name
                                 << "]: " << e->message;
  api().error_free(e);
  return r;
}

struct ErrorInfo {
  int code = 0;  // 0: no error
  std::string message, plugin, native;
};
inline ErrorInfo take(bp_error* e) {
  ErrorInfo info;
  if (!e) return info;
  info.code = e->code;
  info.message = e->message ? e->message : "";
  info.plugin = e->plugin ? e->plugin : "";
  info.native = e->native_name ? e->native_name : "";
  api().error_free(e);
  return info;
}

// ---- Random numbers: one generator per process (the shared seed, printed) ---------------------

inline std::mt19937_64& rng() {
  return bp_test::rng("cpu_plugin_test");
}
inline double uniform(double lo, double hi) {
  return std::uniform_real_distribution<double>(lo, hi)(rng());
}
inline int64_t uniform_int(int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng());
}

// ---- dtypes ----------------------------------------------------------------------------------

inline const std::vector<bp_dtype>& all_dtypes() {
  static const std::vector<bp_dtype> v = {BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_F16, BP_DTYPE_BF16,
                                          BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_U8,  BP_DTYPE_BOOL};
  return v;
}
inline bool is_float(bp_dtype d) {
  return d == BP_DTYPE_F32 || d == BP_DTYPE_F64 || d == BP_DTYPE_F16 || d == BP_DTYPE_BF16;
}
// The value v becomes when stored in dtype d: rounded for floats; truncated toward zero and
// wrapped for integers; v != 0 for bool.
inline double round_to(bp_dtype d, double v) {
  return bp_test::quantize(d, v);
}
using bp_test::decode;
using bp_test::encode;

// Value distributions for test data. Floats are drawn in double and rounded to the dtype, so
// the reference sees exactly what the kernel sees.
enum class Dist {
  kGeneral,    // floats in [-3, 3]; i32/i64 in [-50, 50]; u8 in [0, 255]; bool 0/1
  kPositive,   // floats in [0.1, 3]; integers in [1, 50]
  kNonZero,    // floats with |x| in [0.5, 3]
  kSmallInts,  // integer values in [-2, 2] ([0, 4] for u8): many ties for comparisons
  kSomeZeros,  // kGeneral with about one value in five set to 0
  kCastable,   // fractional floats that fit every integer dtype: [-100, 100]
  kUnsigned,   // fractional floats in [0, 250)
};

inline double random_value(bp_dtype d, Dist dist) {
  const bool f = is_float(d);
  double v = 0;
  switch (dist) {
    case Dist::kGeneral:
    case Dist::kSomeZeros:
      if (f) {
        v = uniform(-3, 3);
      } else if (d == BP_DTYPE_U8) {
        v = static_cast<double>(uniform_int(0, 255));
      } else if (d == BP_DTYPE_BOOL) {
        v = static_cast<double>(uniform_int(0, 1));
      } else {
        v = static_cast<double>(uniform_int(-50, 50));
      }
      if (dist == Dist::kSomeZeros && uniform_int(0, 4) == 0) v = 0;
      break;
    case Dist::kPositive:
      v = f ? uniform(0.1, 3) : static_cast<double>(uniform_int(1, d == BP_DTYPE_BOOL ? 1 : 50));
      break;
    case Dist::kNonZero:
      v = (uniform_int(0, 1) ? 1 : -1) * uniform(0.5, 3);
      break;
    case Dist::kSmallInts:
      v = d == BP_DTYPE_BOOL ? static_cast<double>(uniform_int(0, 1))
          : d == BP_DTYPE_U8 ? static_cast<double>(uniform_int(0, 4))
                             : static_cast<double>(uniform_int(-2, 2));
      break;
    case Dist::kCastable:
      v = uniform(-100, 100);
      break;
    case Dist::kUnsigned:
      v = uniform(0, 250);
      break;
  }
  return round_to(d, v);
}

// ---- Host tensors ------------------------------------------------------------------------------

inline int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}
inline std::vector<int64_t> dense_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * shape[d + 1];
  return s;
}

// Calls f(index) for every multi-index of shape in row-major order.
inline void for_each_index(const std::vector<int64_t>& shape,
                           const std::function<void(const std::vector<int64_t>&)>& f) {
  const int64_t n = product(shape);
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    f(idx);
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

// How a test lays an input out in memory.
enum class Kind {
  kDense,
  kTransposed,      // last two dimensions stored swapped (column-major matrices)
  kStrided,         // every other element of the last dimension, at element offset 1
  kBroadcastFirst,  // stride 0 in dimension 0
  kBroadcastLast,   // stride 0 in the last dimension
};
inline const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kDense:
      return "dense";
    case Kind::kTransposed:
      return "transposed";
    case Kind::kStrided:
      return "strided";
    case Kind::kBroadcastFirst:
      return "broadcast-first";
    default:
      return "broadcast-last";
  }
}

// A view (shape, element strides, element offset) over storage values of one dtype.
struct HostTensor {
  bp_dtype dtype = BP_DTYPE_F32;
  std::vector<int64_t> shape, strides;
  int64_t offset = 0;
  std::vector<double> storage;

  int64_t numel() const { return product(shape); }
  double at(const std::vector<int64_t>& idx) const {
    int64_t p = offset;
    for (size_t d = 0; d < idx.size(); ++d) p += idx[d] * strides[d];
    return storage[static_cast<size_t>(p)];
  }
  std::vector<double> values() const {
    std::vector<double> v;
    v.reserve(static_cast<size_t>(numel()));
    for_each_index(shape, [&](const std::vector<int64_t>& i) { v.push_back(at(i)); });
    return v;
  }
};

// A view of `shape` laid out as `kind`, its storage filled from `dist`.
inline HostTensor make_host(bp_dtype d, const std::vector<int64_t>& shape, Kind kind,
                            Dist dist = Dist::kGeneral) {
  HostTensor t;
  t.dtype = d;
  t.shape = shape;
  const int r = static_cast<int>(shape.size());
  int64_t storage = product(shape);
  t.strides = dense_strides(shape);
  if (kind == Kind::kTransposed && r >= 2) {
    std::vector<int64_t> ps = shape;
    std::swap(ps[r - 1], ps[r - 2]);
    t.strides = dense_strides(ps);
    std::swap(t.strides[r - 1], t.strides[r - 2]);
  } else if (kind == Kind::kStrided && r >= 1) {
    std::vector<int64_t> ps = shape;
    ps[r - 1] *= 2;
    t.strides = dense_strides(ps);
    t.strides[r - 1] = 2;
    t.offset = 1;
    storage = product(shape) == 0 ? 0 : product(ps) + 1;
  } else if ((kind == Kind::kBroadcastFirst || kind == Kind::kBroadcastLast) && r >= 1) {
    const int bd = kind == Kind::kBroadcastFirst ? 0 : r - 1;
    std::vector<int64_t> ps = shape;
    ps[bd] = 1;
    t.strides = dense_strides(ps);
    t.strides[bd] = 0;
    storage = product(shape) == 0 ? 0 : product(ps);
  }
  t.storage.resize(static_cast<size_t>(storage));
  for (double& v : t.storage) v = random_value(d, dist);
  return t;
}

// ---- Device tensors
// ------------------------------------------------------------------------------

constexpr uint64_t kGuard = 64;
constexpr uint8_t kGuardByte = 0xA5;

// A device allocation holding one view, with kGuard guard bytes on both sides. Tensors with no
// storage get a NULL buffer (allowed for zero-element tensors).
class DeviceTensor {
 public:
  DeviceTensor() = default;
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  DeviceTensor(DeviceTensor&& o) noexcept { *this = std::move(o); }
  DeviceTensor& operator=(DeviceTensor&& o) noexcept {
    std::swap(buf_, o.buf_);
    std::swap(bytes_, o.bytes_);
    std::swap(desc, o.desc);
    return *this;
  }
  ~DeviceTensor() {
    if (buf_) {
      EXPECT_TRUE(ok(api().mem_free(0, stream(), buf_, bytes_)));
    }
  }

  // Storage of `elements` elements of `dtype`, all bytes kGuardByte, and a view over it.
  static DeviceTensor create(bp_dtype dtype, int64_t elements, const std::vector<int64_t>& shape,
                             const std::vector<int64_t>& strides, int64_t offset) {
    DeviceTensor t;
    t.desc.struct_size = sizeof(bp_tensor_desc);
    t.desc.dtype = dtype;
    t.desc.rank = static_cast<int32_t>(shape.size());
    for (size_t d = 0; d < shape.size(); ++d) {
      t.desc.shape[d] = shape[d];
      t.desc.strides[d] = strides[d];
    }
    if (elements > 0) {
      t.bytes_ = static_cast<uint64_t>(elements) * bp_dtype_size(dtype) + 2 * kGuard;
      EXPECT_TRUE(ok(api().mem_alloc(0, stream(), t.bytes_, &t.buf_)));
      EXPECT_TRUE(ok(api().memset(stream(), t.buf_, 0, kGuardByte, t.bytes_)));
      t.desc.buffer = t.buf_;
      t.desc.offset = kGuard + static_cast<uint64_t>(offset) * bp_dtype_size(dtype);
    }
    return t;
  }

  // All allocated bytes, guards included.
  std::vector<uint8_t> raw() const {
    std::vector<uint8_t> r(bytes_);
    if (bytes_) {
      EXPECT_TRUE(ok(api().copy_d2h(stream(), r.data(), buf_, 0, bytes_)));
    }
    return r;
  }
  // The view's values in row-major order.
  std::vector<double> values() const {
    const std::vector<uint8_t> r = raw();
    std::vector<int64_t> shape(desc.shape, desc.shape + desc.rank);
    std::vector<double> v;
    const size_t es = bp_dtype_size(desc.dtype);
    for_each_index(shape, [&](const std::vector<int64_t>& idx) {
      uint64_t off = desc.offset;
      for (int d = 0; d < desc.rank; ++d) off += idx[d] * desc.strides[d] * es;
      v.push_back(decode(static_cast<bp_dtype>(desc.dtype), r.data() + off));
    });
    return v;
  }
  // True when the guard bytes on both sides are untouched.
  bool guards_intact() const {
    if (!bytes_) return true;
    const std::vector<uint8_t> r = raw();
    for (uint64_t i = 0; i < kGuard; ++i)
      if (r[i] != kGuardByte || r[bytes_ - 1 - i] != kGuardByte) return false;
    return true;
  }
  bp_buffer* buffer() const { return buf_; }

  bp_tensor_desc desc{};

 private:
  bp_buffer* buf_ = nullptr;
  uint64_t bytes_ = 0;
};

inline DeviceTensor upload(const HostTensor& h) {
  const int64_t n = static_cast<int64_t>(h.storage.size());
  DeviceTensor t = DeviceTensor::create(h.dtype, n, h.shape, h.strides, h.offset);
  if (n > 0) {
    const size_t es = bp_dtype_size(h.dtype);
    std::vector<uint8_t> bytes(static_cast<size_t>(n) * es);
    for (int64_t i = 0; i < n; ++i) encode(h.dtype, h.storage[i], bytes.data() + i * es);
    EXPECT_TRUE(ok(api().copy_h2d(stream(), t.buffer(), kGuard, bytes.data(), bytes.size())));
  }
  return t;
}

// A dense output of `shape` (optionally transposed in its last two dimensions), its bytes all
// kGuardByte so unwritten elements show.
inline DeviceTensor make_output(bp_dtype d, const std::vector<int64_t>& shape,
                                bool transposed = false) {
  std::vector<int64_t> strides = dense_strides(shape);
  const int r = static_cast<int>(shape.size());
  if (transposed && r >= 2) {
    std::vector<int64_t> ps = shape;
    std::swap(ps[r - 1], ps[r - 2]);
    strides = dense_strides(ps);
    std::swap(strides[r - 1], strides[r - 2]);
  }
  return DeviceTensor::create(d, product(shape), shape, strides, 0);
}

// ---- Launches --------------------------------------------------------------------------------

inline bp_attr attr_i(const char* name, int64_t v) {
  bp_attr a{};
  a.struct_size = sizeof(a);
  a.name = name;
  a.kind = BP_ATTR_INT;
  a.i = v;
  return a;
}

// Resolves (op, dtype) and launches it; returns the first error.
inline bp_error* launch(const char* op, bp_dtype dtype, const std::vector<bp_tensor_desc>& ins,
                        const std::vector<bp_tensor_desc>& outs,
                        const std::vector<bp_attr>& attrs = {}) {
  bp_kernel* k = nullptr;
  if (bp_error* e = api().find_kernel(0, op, dtype, &k)) return e;
  return api().launch(k, stream(), ins.data(), static_cast<int32_t>(ins.size()), outs.data(),
                      static_cast<int32_t>(outs.size()), attrs.data(),
                      static_cast<int32_t>(attrs.size()));
}

// ---- Comparison ------------------------------------------------------------------------------

// got against the float64 reference as results of dtype d with the shared dtype-aware
// tolerance (Note [Tolerance over the whole range] in backplane_test/compare.hpp); `tol` >= 0
// replaces the default relative tolerance (0: exact), `magnitude` is the per-element size of
// what was accumulated (reductions, matmul).
inline ::testing::AssertionResult close(bp_dtype d, const std::vector<double>& got,
                                        const std::vector<double>& ref, double tol = -1,
                                        const std::vector<double>& magnitude = {}) {
  return bp_test::all_close(d, got, ref, {.rtol = tol, .magnitude = magnitude});
}

}  // namespace bpt

#endif  // BACKPLANE_CPU_TEST_SUPPORT_HPP_
