// Helpers of opencl_plugin_test.cpp: host tensors (float64 values over an explicit view: shape,
// strides, offset) with their upload to device buffers, outputs surrounded by guard elements and
// launches. Loading the plugin, the seed, the dtype encoders and the comparison with the float64
// reference are the shared ones of tests/support/backplane_test.
//
// Everything runs on the test's thread. The plugin is loaded once per process, never unloaded.
#pragma once

#include <backplane/abi/plugin_abi.h>
#include <backplane_test/gtest_compare.hpp>
#include <backplane_test/plugin_test.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace bpt {

// ---- The plugin ------------------------------------------------------------------------------

struct Plugin {
  void* handle = nullptr;
  const bp_plugin_api* api = nullptr;
  std::string error;  // why loading failed, when api is NULL
  int32_t devices = 0;
  std::string reason;               // device_count's reason
  std::vector<bp_stream*> streams;  // one per device
};

// The plugin built beside this test (found relative to the test binary, so a copied build tree
// works); BP_OPENCL_PLUGIN overrides it.
inline Plugin load_plugin() {
  Plugin p;
  bp_test::LoadedPlugin l =
      bp_test::load_plugin(bp_test::beside_exe(BP_OPENCL_PLUGIN_REL, "BP_OPENCL_PLUGIN"));
  if (!l.api) {
    p.error = l.error;
    return p;
  }
  const bp_plugin_api* api = l.api;
  const char* reason = nullptr;
  p.devices = api->device_count(&reason);
  p.reason = reason ? reason : "(NULL)";
  for (int32_t d = 0; d < p.devices; ++d) {
    bp_stream* s = nullptr;
    if (bp_error* e = api->stream_create(d, &s)) {
      p.error = std::string("stream_create failed: ") + e->message;
      api->error_free(e);
      return p;
    }
    p.streams.push_back(s);
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
inline bp_stream* stream(int32_t d) {
  return plugin().streams[static_cast<size_t>(d)];
}

// ---- Errors ----------------------------------------------------------------------------------

// Success for NULL; otherwise a failure carrying the plugin's message. Frees the error.
inline ::testing::AssertionResult ok(bp_error* e) {
  if (!e) return ::testing::AssertionSuccess();
  auto r = ::testing::AssertionFailure()
           << "code " << e->code << " (" << e->native_name << "): " << e->message;
  api().error_free(e);
  return r;
}

// The error's code and message (and frees it); code 0 for success.
struct ErrorInfo {
  int32_t code = 0;
  std::string message, native;
};
inline ErrorInfo take(bp_error* e) {
  ErrorInfo i;
  if (!e) return i;
  i.code = e->code;
  i.message = e->message;
  i.native = e->native_name;
  api().error_free(e);
  return i;
}

// ---- Values ----------------------------------------------------------------------------------

inline bool is_float(int32_t dt) {
  return dt == BP_DTYPE_F32 || dt == BP_DTYPE_F64 || dt == BP_DTYPE_F16 || dt == BP_DTYPE_BF16;
}

// Wraps an integer to a dtype's range (two's complement), as the kernels do.
inline int64_t wrap(int32_t dt, int64_t v) {
  return bp_test::wrap_int(dt, v);
}
// Float -> integer as the catalogue defines it (truncation, NaN 0, saturation to int64), the value
// a dtype stores for x, and the host encoding of one element: the shared definitions.
using bp_test::decode;
using bp_test::encode;
using bp_test::quantize;
using bp_test::trunc_i64;

// Fresh random numbers: the shared seed of the run, printed so a failure can be replayed with
// BP_TEST_SEED.
inline std::mt19937_64& rng() {
  return bp_test::rng("opencl_plugin_test");
}

enum class Range { kAny, kPositive, kSmall };

// A random value of dtype dt, never zero (except for bool), already quantized.
inline double random_value(int32_t dt, Range range = Range::kAny) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double x = u(rng());
  switch (dt) {
    case BP_DTYPE_BOOL:
      return x < 0.5 ? 0.0 : 1.0;
    case BP_DTYPE_U8:
      return 1 + std::floor(x * (range == Range::kSmall ? 15 : 250));
    case BP_DTYPE_I32:
    case BP_DTYPE_I64: {
      double m = range == Range::kSmall ? 15 : 1000;
      double v = 1 + std::floor(x * m);
      if (range != Range::kPositive && u(rng()) < 0.5) v = -v;
      return v;
    }
    default: {
      double v = range == Range::kPositive ? 0.25 + 2.75 * x : 0.125 + 1.875 * x;
      if (range == Range::kAny && u(rng()) < 0.5) v = -v;
      return quantize(dt, v);
    }
  }
}

// ---- Host and device tensors -----------------------------------------------------------------

// Float64 values of a whole storage plus a view of it. Offset and strides are in elements.
struct HostTensor {
  int32_t dtype = BP_DTYPE_F32;
  std::vector<int64_t> shape, strides;
  int64_t offset = 0;
  std::vector<double> storage;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
  // Value at row-major logical index i of the view.
  double at(int64_t i) const {
    int64_t off = offset;
    for (size_t d = shape.size(); d-- > 0;) {
      off += (i % shape[d]) * strides[d];
      i /= shape[d];
    }
    return storage[static_cast<size_t>(off)];
  }
  std::vector<double> values() const {
    std::vector<double> v(static_cast<size_t>(numel()));
    for (int64_t i = 0; i < numel(); ++i) v[static_cast<size_t>(i)] = at(i);
    return v;
  }
};

inline std::vector<int64_t> dense_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size());
  int64_t e = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    s[d] = e;
    e *= shape[d];
  }
  return s;
}

// A dense random tensor.
inline HostTensor random_tensor(int32_t dt, std::vector<int64_t> shape, Range r = Range::kAny) {
  HostTensor t;
  t.dtype = dt;
  t.shape = shape;
  t.strides = dense_strides(shape);
  t.storage.resize(static_cast<size_t>(t.numel()));
  for (double& v : t.storage) v = random_value(dt, r);
  return t;
}

struct DeviceTensor {
  int32_t device = 0;
  bp_buffer* buffer = nullptr;
  uint64_t bytes = 0;
  bp_tensor_desc desc{};
  int64_t guard = 0;  // guard elements on each side of a dense output

  DeviceTensor() = default;
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  DeviceTensor(DeviceTensor&& o) noexcept { *this = std::move(o); }
  DeviceTensor& operator=(DeviceTensor&& o) noexcept {
    std::swap(device, o.device);
    std::swap(buffer, o.buffer);
    std::swap(bytes, o.bytes);
    std::swap(desc, o.desc);
    std::swap(guard, o.guard);
    return *this;
  }
  ~DeviceTensor() {
    if (buffer) {
      EXPECT_TRUE(ok(api().mem_free(device, stream(device), buffer, bytes)));
    }
  }
};

inline bp_tensor_desc make_desc(bp_buffer* buf, int32_t dtype, const std::vector<int64_t>& shape,
                                const std::vector<int64_t>& strides, int64_t offset_elems) {
  bp_tensor_desc d{};
  d.struct_size = sizeof d;
  d.buffer = buf;
  d.dtype = dtype;
  d.rank = static_cast<int32_t>(shape.size());
  d.offset = static_cast<uint64_t>(offset_elems) * bp_dtype_size(dtype);
  for (size_t i = 0; i < shape.size(); ++i) {
    d.shape[i] = shape[i];
    d.strides[i] = strides[i];
  }
  return d;
}

// Uploads a host tensor's whole storage and describes its view. Empty storage: NULL buffer.
inline DeviceTensor upload(int32_t dev, const HostTensor& h) {
  DeviceTensor t;
  t.device = dev;
  size_t es = bp_dtype_size(h.dtype);
  t.bytes = h.storage.size() * es;
  EXPECT_TRUE(ok(api().mem_alloc(dev, stream(dev), t.bytes, &t.buffer)));
  std::vector<unsigned char> bytes(t.bytes);
  for (size_t i = 0; i < h.storage.size(); ++i) encode(h.dtype, h.storage[i], &bytes[i * es]);
  if (t.bytes) {
    EXPECT_TRUE(ok(api().copy_h2d(stream(dev), t.buffer, 0, bytes.data(), t.bytes)));
  }
  t.desc = make_desc(h.storage.empty() ? nullptr : t.buffer, h.dtype, h.shape, h.strides, h.offset);
  return t;
}

constexpr unsigned char kGuardByte = 0xA5;

// A dense output of `shape` between `guard` guard elements on each side, all bytes kGuardByte.
inline DeviceTensor make_output(int32_t dev, int32_t dtype, const std::vector<int64_t>& shape,
                                int64_t guard = 5) {
  DeviceTensor t;
  t.device = dev;
  t.guard = guard;
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  t.bytes = static_cast<uint64_t>(n + 2 * guard) * bp_dtype_size(dtype);
  EXPECT_TRUE(ok(api().mem_alloc(dev, stream(dev), t.bytes, &t.buffer)));
  if (t.bytes) {
    EXPECT_TRUE(ok(api().memset(stream(dev), t.buffer, 0, kGuardByte, t.bytes)));
  }
  t.desc = make_desc(t.buffer, dtype, shape, dense_strides(shape), guard);
  return t;
}

inline std::vector<unsigned char> read_bytes(const DeviceTensor& t) {
  std::vector<unsigned char> bytes(t.bytes);
  if (t.bytes) {
    EXPECT_TRUE(ok(api().copy_d2h(stream(t.device), bytes.data(), t.buffer, 0, t.bytes)));
  }
  EXPECT_TRUE(ok(api().stream_synchronize(stream(t.device))));
  return bytes;
}

// The values of a dense output (row-major), checking its guard elements are untouched.
inline std::vector<double> read_output(const DeviceTensor& t) {
  std::vector<unsigned char> bytes = read_bytes(t);
  size_t es = bp_dtype_size(t.desc.dtype);
  size_t g = static_cast<size_t>(t.guard) * es;
  size_t n = (t.bytes - 2 * g) / es;
  for (size_t i = 0; i < g; ++i) {
    EXPECT_EQ(bytes[i], kGuardByte) << "guard byte " << i << " before the output was written";
    EXPECT_EQ(bytes[t.bytes - 1 - i], kGuardByte) << "guard byte after the output was written";
  }
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = decode(t.desc.dtype, &bytes[g + i * es]);
  return v;
}

// ---- Launches --------------------------------------------------------------------------------

inline bp_attr float_attr(const char* name, double v) {
  bp_attr a{};
  a.struct_size = sizeof a;
  a.name = name;
  a.kind = BP_ATTR_FLOAT;
  a.f = v;
  return a;
}

inline bp_error* launch(int32_t dev, const char* op, int32_t dtype,
                        const std::vector<bp_tensor_desc>& in,
                        const std::vector<bp_tensor_desc>& out,
                        const std::vector<bp_attr>& attrs = {}) {
  bp_kernel* k = nullptr;
  if (bp_error* e = api().find_kernel(dev, op, dtype, &k)) return e;
  return api().launch(k, stream(dev), in.data(), static_cast<int32_t>(in.size()), out.data(),
                      static_cast<int32_t>(out.size()), attrs.data(),
                      static_cast<int32_t>(attrs.size()));
}

// ---- Comparison ------------------------------------------------------------------------------

// Compares device output with the float64 reference through the shared dtype-aware tolerance
// (Note [Tolerance over the whole range] in backplane_test/compare.hpp): exactly for integer and
// bool dtypes (and when tol_scale is 0), by relative norm with the subnormal floor for floating
// ones. NaN must match NaN.
inline void expect_close(const std::vector<double>& out, const std::vector<double>& ref, int32_t dt,
                         const std::string& what, double tol_scale = 1.0) {
  bp_test::Tolerance tol;
  if (tol_scale == 0) tol.rtol = 0;
  tol.scale = tol_scale;
  EXPECT_TRUE(bp_test::all_close(dt, out, ref, tol)) << what;
}

}  // namespace bpt
