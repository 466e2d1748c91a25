// Helpers shared by the nn, serialisation and training tests: parameterisation over every
// device the registry finds (BP_TEST_DEVICES="cuda:0,cpu:0" restricts it), fresh random data,
// a float64 host reference for dense layers, and scratch folders.
#pragma once

#include <gtest/gtest.h>
#include <backplane/backplane.hpp>
#include <backplane/nn.hpp>

#include "../device/device_params.hpp"

#include <unistd.h>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace nntest {

// Device parameterisation and random data shared with the device tests.
using bptest::device_strings;
using bptest::random_values;

// Every ordered pair (source, destination) of devices, the same device included.
inline std::vector<std::tuple<std::string, std::string>> device_pairs() {
  std::vector<std::tuple<std::string, std::string>> out;
  for (const std::string& a : device_strings())
    for (const std::string& b : device_strings()) out.emplace_back(a, b);
  return out;
}

inline std::string sanitize(std::string s) {
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

inline std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  return sanitize(info.param);
}

inline std::string pair_name(
    const ::testing::TestParamInfo<std::tuple<std::string, std::string>>& info) {
  return sanitize(std::get<0>(info.param)) + "_to_" + sanitize(std::get<1>(info.param));
}

// Values as f32 stores them.
inline std::vector<double> as_f32(const std::vector<double>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(v[i]);
  return out;
}

inline bp::Tensor make(const std::vector<double>& v, const bp::Shape& shape, bp::Device& dev,
                       bp::DType dt = bp::DType::f32) {
  return bp::from_vector(v, shape, dev).to(dt);
}

// out against a float64 reference as f32 results (the modules compute in f32) with relative
// tolerance `rtol`, through the shared dtype-aware comparison (Note [Tolerance over the whole
// range] in backplane_test/compare.hpp).
inline ::testing::AssertionResult close(const std::vector<double>& out,
                                        const std::vector<double>& ref, double rtol) {
  return bp_test::all_close(BP_DTYPE_F32, out, ref, {.rtol = rtol});
}

// Element by element |a - b| <= atol + rtol * |b| (bp::allclose's rule) for two tensors of a
// floating dtype, through the shared comparison.
inline ::testing::AssertionResult allclose(const bp::Tensor& a, const bp::Tensor& b, double rtol,
                                           double atol) {
  return bp_test::all_close(static_cast<int32_t>(b.dtype()), a.to_vector<double>(),
                            b.to_vector<double>(),
                            {.rtol = rtol, .atol = atol, .mode = bp_test::Mode::kElementwise});
}

// |got - want| <= allowance, for values that are not a dtype's rounding of each other
// (statistics, finite differences, losses of whole runs): an explicit absolute allowance.
inline ::testing::AssertionResult near(double got, double want, double allowance) {
  return bp_test::scalar_close(BP_DTYPE_F64, got, want, {.rtol = 0, .atol = allowance});
}

// y[b, o] = sum_i x[b, i] w[o, i] + bias[o] in float64 (x is [batch, in]).
inline std::vector<double> linear_ref(const std::vector<double>& x, const std::vector<double>& w,
                                      const std::vector<double>& bias, int64_t batch, int64_t in,
                                      int64_t out) {
  std::vector<double> y(static_cast<size_t>(batch * out));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t o = 0; o < out; ++o) {
      double acc = bias.empty() ? 0.0 : bias[o];
      for (int64_t i = 0; i < in; ++i) acc += x[b * in + i] * w[o * in + i];
      y[b * out + o] = acc;
    }
  return y;
}

// A fresh, empty folder under the test temp dir, removed by the destructor.
class ScratchDir {
 public:
  ScratchDir() {
    static int counter = 0;
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string leaf = "bp_nn_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
    if (info) leaf += "_" + sanitize(std::string(info->name()));
    path_ = std::filesystem::path(::testing::TempDir()) / leaf;
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace nntest
