// Helpers of cpu_plugin_test.cpp: loading the plugin through dlopen and its one exported
// symbol, host tensors with explicit views (strides, offsets, broadcasts) over float64 values,
// device tensors with guard bytes, launches, and the per-dtype comparison against a float64
// reference.
//
// Everything here runs on the test's thread; the plugin is loaded once per process and never
// unloaded.
#ifndef BACKPLANE_CPU_TEST_SUPPORT_HPP_
#define BACKPLANE_CPU_TEST_SUPPORT_HPP_

#include <backplane/dtype_io.h>
#include <backplane/half.h>
#include <backplane/plugin_abi.h>

#include <dlfcn.h>
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

inline Plugin load_plugin() {
  Plugin p;
  p.handle = dlopen(BP_CPU_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
  if (!p.handle) {
    p.error = std::string("dlopen failed: ") + dlerror();
    return p;
  }
  auto get = reinterpret_cast<bp_plugin_get_api_fn>(dlsym(p.handle, BP_PLUGIN_ENTRY_SYMBOL));
  if (!get) {
    p.error = "missing symbol " BP_PLUGIN_ENTRY_SYMBOL;
    return p;
  }
  const bp_plugin_api* api = get(BP_ABI_MAJOR, BP_ABI_MINOR);
  if (!api) {
    p.error = "bp_plugin_get_api returned NULL";
    return p;
  }
  if (bp_error* e = api->init()) {
    p.error = std::string("init failed: ") + e->message;
    api->error_free(e);
    return p;
  }
  if (bp_error* e = api->stream_create(0, &p.stream)) {
    p.error = std::string("stream_create failed: ") + e->message;
    api->error_free(e);
    return p;
  }
  p.api = api;
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

// ---- Random numbers: one generator per process, seeded from std::random_device ----------------

inline uint64_t test_seed() {
  static const uint64_t seed = [] {
    if (const char* s = std::getenv("BP_TEST_SEED"))
      return static_cast<uint64_t>(std::strtoull(s, nullptr, 10));
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  return seed;
}
inline std::mt19937_64& rng() {
  static std::mt19937_64 g = [] {
    std::fprintf(stderr, "cpu_plugin_test: random seed %llu (rerun with BP_TEST_SEED=%llu)\n",
                 static_cast<unsigned long long>(test_seed()),
                 static_cast<unsigned long long>(test_seed()));
    return std::mt19937_64(test_seed());
  }();
  return g;
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
// Relative-error tolerance of a floating dtype (0: exact).
inline double tolerance(bp_dtype d) {
  switch (d) {
    case BP_DTYPE_F32:
      return 1e-5;
    case BP_DTYPE_F64:
      return 1e-12;
    case BP_DTYPE_F16:
      return 2e-3;
    case BP_DTYPE_BF16:
      return 1e-2;
    default:
      return 0.0;
  }
}

// The value v becomes when stored in dtype d: rounded for floats; truncated toward zero and
// wrapped for integers (v must be within int64); v != 0 for bool.
inline double round_to(bp_dtype d, double v) {
  switch (d) {
    case BP_DTYPE_F32:
      return static_cast<float>(v);
    case BP_DTYPE_F64:
      return v;
    case BP_DTYPE_F16:
      return bp_f16_to_float(bp_float_to_f16(static_cast<float>(v)));
    case BP_DTYPE_BF16:
      return bp_bf16_to_float(bp_float_to_bf16(static_cast<float>(v)));
    case BP_DTYPE_I32:
      return static_cast<int32_t>(static_cast<int64_t>(v));
    case BP_DTYPE_I64:
      return static_cast<double>(static_cast<int64_t>(v));
    case BP_DTYPE_U8:
      return static_cast<uint8_t>(static_cast<int64_t>(v));
    default:
      return v != 0 ? 1.0 : 0.0;
  }
}

inline void encode(bp_dtype d, double v, void* dst) {
  v = round_to(d, v);
  switch (d) {
    case BP_DTYPE_F32: {
      const float f = static_cast<float>(v);
      std::memcpy(dst, &f, 4);
      break;
    }
    case BP_DTYPE_F64:
      std::memcpy(dst, &v, 8);
      break;
    case BP_DTYPE_F16: {
      const uint16_t h = bp_float_to_f16(static_cast<float>(v));
      std::memcpy(dst, &h, 2);
      break;
    }
    case BP_DTYPE_BF16: {
      const uint16_t h = bp_float_to_bf16(static_cast<float>(v));
      std::memcpy(dst, &h, 2);
      break;
    }
    case BP_DTYPE_I32: {
      const int32_t i = static_cast<int32_t>(v);
      std::memcpy(dst, &i, 4);
      break;
    }
    case BP_DTYPE_I64: {
      const int64_t i = static_cast<int64_t>(v);
      std::memcpy(dst, &i, 8);
      break;
    }
    default:
      *static_cast<uint8_t*>(dst) = static_cast<uint8_t>(v);
      break;
  }
}

inline double decode(bp_dtype d, const void* src) {
  return bp_load_element(src, d, 0);
}

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

inline bp_attr attr_f(const char* name, double v) {
  bp_attr a{};
  a.struct_size = sizeof(a);
  a.name = name;
  a.kind = BP_ATTR_FLOAT;
  a.f = v;
  return a;
}
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

// Floating dtypes: ||got - ref|| / ||ref|| <= tolerance(d) (or `tol` when >= 0), NaN where the
// reference is NaN and equal infinities. Other dtypes: exact equality.
inline ::testing::AssertionResult close(bp_dtype d, const std::vector<double>& got,
                                        const std::vector<double>& ref, double tol = -1) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure()
           << "size " << got.size() << " != reference size " << ref.size();
  if (tol < 0) tol = tolerance(d);
  if (!is_float(d) || tol == 0) {
    for (size_t i = 0; i < got.size(); ++i) {
      const bool both_nan = std::isnan(got[i]) && std::isnan(ref[i]);
      if (got[i] != ref[i] && !both_nan)
        return ::testing::AssertionFailure() << bp_dtype_name(d) << " element " << i << ": got "
                                             << got[i] << ", expected " << ref[i];
    }
    return ::testing::AssertionSuccess();
  }
  long double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(ref[i]) || std::isinf(ref[i])) {
      if (!(std::isnan(ref[i]) ? std::isnan(got[i]) : got[i] == ref[i]))
        return ::testing::AssertionFailure()
               << "element " << i << ": got " << got[i] << ", expected " << ref[i];
      continue;
    }
    if (!std::isfinite(got[i]))
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", expected " << ref[i];
    const long double diff = static_cast<long double>(got[i]) - ref[i];
    num += diff * diff;
    den += static_cast<long double>(ref[i]) * ref[i];
  }
  const double err =
      den > 0 ? std::sqrt(static_cast<double>(num / den)) : std::sqrt(static_cast<double>(num));
  if (err <= tol) return ::testing::AssertionSuccess();
  size_t worst = 0;
  for (size_t i = 1; i < got.size(); ++i)
    if (std::fabs(got[i] - ref[i]) > std::fabs(got[worst] - ref[worst])) worst = i;
  return ::testing::AssertionFailure()
         << bp_dtype_name(d) << " relative error " << err << " > " << tol << " (worst element "
         << worst << ": got " << got[worst] << ", expected " << ref[worst] << ")";
}

}  // namespace bpt

#endif  // BACKPLANE_CPU_TEST_SUPPORT_HPP_
