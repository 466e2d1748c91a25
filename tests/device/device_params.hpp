// Parameterisation of tests over every device the registry finds. BP_TEST_DEVICES
// ("cuda:0,cpu:0") restricts the set.
#pragma once

#include <gtest/gtest.h>
#include <backplane/backplane.hpp>

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

// Fresh random values in [lo, hi), never all zeros.
inline std::vector<double> random_values(size_t n, double lo = -2.0, double hi = 2.0) {
  static std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = u(rng);
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

// ||out - ref|| / ||ref||.
inline double rel_error(const std::vector<double>& out, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(out[i]) != std::isnan(ref[i])) return INFINITY;
    if (std::isnan(ref[i])) continue;
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  if (out.size() != ref.size()) return INFINITY;
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

inline double tolerance(bp::DType t) {
  switch (t) {
    case bp::DType::f64:
      return 1e-12;
    case bp::DType::f32:
      return 2e-6;
    case bp::DType::f16:
      return 2e-3;
    case bp::DType::bf16:
      return 1e-2;
    default:
      return 0.0;
  }
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

}  // namespace bptest
