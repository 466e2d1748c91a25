// Parameterisation of tests over every device the registry finds. BP_TEST_DEVICES
// ("cuda:0,cpu:0") restricts the set.
#pragma once

#include <gtest/gtest.h>
#include <backplane/backplane.hpp>
#include <backplane_test/gtest_compare.hpp>
#include <backplane_test/seed.hpp>

#include <cmath>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace bptest {

inline std::vector<std::string> device_strings() {
  std::vector<std::string> out;
  const char* only = std::getenv("BP_TEST_DEVICES");
  for (bp::Device* d : bp::devices()) {
    if (only && *only) {
      std::string list = std::string(",") + only + ",";
      if (list.find("," + d->str() + ",") == std::string::npos) continue;
    }
    out.push_back(d->str());
  }
  return out;
}

inline std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& c : s)
    if (c == ':') c = '_';
  return s;
}

// Fresh random values in [lo, hi), never all zeros, from the run's printed seed (BP_TEST_SEED
// replays a run).
inline std::vector<double> random_values(size_t n, double lo = -2.0, double hi = 2.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = u(bp_test::rng("bp_device_tests"));
  return v;
}

// Values as the dtype stores them (what a kernel actually sees).
inline std::vector<double> rounded(const std::vector<double>& v, bp::DType dt) {
  std::vector<char> bytes(v.size() * bp::dtype_size(dt));
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    bp::store_from_double(bytes.data(), dt, i, v[i]);
    out[i] = bp::load_as_double(bytes.data(), dt, i);
  }
  return out;
}

// out against the float64 reference as results of dtype dt, with the shared dtype-aware tolerance
// (Note [Tolerance over the whole range] in backplane_test/compare.hpp).
inline ::testing::AssertionResult close(bp::DType dt, const std::vector<double>& out,
                                        const std::vector<double>& ref,
                                        const bp_test::Tolerance& tol = {}) {
  return bp_test::all_close(static_cast<int32_t>(dt), out, ref, tol);
}

class DeviceTest : public ::testing::TestWithParam<std::string> {
 protected:
  bp::Device& dev() { return bp::device(GetParam()); }
  bool has_f64() { return dev().properties().supports_f64; }
  // A tensor on the device holding `v` (rounded to dtype).
  bp::Tensor make(const std::vector<double>& v, const bp::Shape& shape,
                  bp::DType dt = bp::DType::f32) {
    std::vector<char> bytes(v.size() * bp::dtype_size(dt));
    for (size_t i = 0; i < v.size(); ++i) bp::store_from_double(bytes.data(), dt, i, v[i]);
    return bp::from_bytes(bytes.data(), bytes.size(), shape, dt, dev());
  }
};

// DeviceTest plus the floating dtypes the device has and a comparison against a float64
// reference that names the device and dtype (the math and fused-op suites).
class FloatDeviceTest : public DeviceTest {
 protected:
  std::vector<bp::DType> float_types() {
    std::vector<bp::DType> t = {bp::DType::f32, bp::DType::f16, bp::DType::bf16};
    if (has_f64()) t.push_back(bp::DType::f64);
    return t;
  }
  // `scale` multiplies the dtype's default tolerance; `magnitude` is the per-element L2 norm of
  // what was accumulated (reductions, matmul).
  void expect_close(const bp::Tensor& out, const std::vector<double>& ref, bp::DType dt,
                    const std::string& what, double scale = 1.0,
                    const std::vector<double>& magnitude = {}) {
    EXPECT_TRUE(close(dt, out.to_vector<double>(), ref, {.scale = scale, .magnitude = magnitude}))
        << what << " on " << dev().str() << " dtype " << bp::dtype_name(dt);
  }
};

}  // namespace bptest
