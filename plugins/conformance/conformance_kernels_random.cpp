// Kernel cases of the random ops against Note [Philox stream] (backplane/philox.h): uniform f32
// must be bit-identical; other dtypes and normal agree within the dtype's tolerance.
#include "conformance_kernels.hpp"

#include <backplane/abi/philox.h>

#include <cmath>

namespace bpc {

namespace {

struct RandomCase {
  const char* variant;
  std::vector<int64_t> shape;
  uint64_t seed, offset;
};

// The reference value of element g, computed exactly as the note prescribes.
double uniform_ref(int32_t dt, uint64_t seed, uint64_t g, double low, double high) {
  float u = bp_philox_uniform01(seed, g);
  if (dt == BP_DTYPE_F64) return low + (high - low) * static_cast<double>(u);
  float lo = static_cast<float>(low), hi = static_cast<float>(high);
  float span = hi - lo;
  float scaled = span * u;
  float v = lo + scaled;
  return round_to(dt, v);
}

double normal_ref(uint64_t seed, uint64_t g, double mean, double stddev) {
  float u1, u2;
  bp_philox_normal_uniforms(seed, g, &u1, &u2);
  const double two_pi = 6.283185307179586476925286766559;
  double r = std::sqrt(-2.0 * std::log(static_cast<double>(u1)));
  double z = (g % 2 == 0) ? r * std::cos(two_pi * u2) : r * std::sin(two_pi * u2);
  return mean + stddev * z;
}

void run_random(Context& ctx, const OpInfo& op, int32_t dt, const RandomCase& c) {
  const bool uniform = std::string(op.name) == "uniform";
  const std::string what =
      format("%s %s (%s) on %s", op.name, bp_dtype_name(dt), c.variant, ctx.device_label().c_str());
  const double p0 = uniform ? -2.0 : 0.5, p1 = uniform ? 3.0 : 2.0;
  std::vector<bp_attr> attrs = {attr_int("seed", static_cast<int64_t>(c.seed)),
                                attr_int("offset", static_cast<int64_t>(c.offset)),
                                attr_float(uniform ? "low" : "mean", p0),
                                attr_float(uniform ? "high" : "std", p1)};
  DeviceTensor out = make_output(ctx, dt, c.shape);
  std::string full =
      what + format(": %s%s seed %llu offset %llu %s %g %s %g", bp_dtype_name(dt),
                    shape_str(c.shape).c_str(), static_cast<unsigned long long>(c.seed),
                    static_cast<unsigned long long>(c.offset), uniform ? "low" : "mean", p0,
                    uniform ? "high" : "std", p1);
  run_kernel(ctx, op.name, dt, {}, out.desc, attrs, full);
  std::vector<double> got = read_dense(out, full);
  std::vector<double> ref(got.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    uint64_t g = c.offset + i;
    ref[i] = uniform ? uniform_ref(dt, c.seed, g, p0, p1) : normal_ref(c.seed, g, p0, p1);
  }
  if (uniform) {
    for (size_t i = 0; i < got.size(); ++i)
      if (!(got[i] >= p0 && got[i] <= p1))
        throw Failure(full + format(": element %zu = %.9g is outside [%g, %g]", i, got[i], p0, p1));
    if (dt == BP_DTYPE_F32) {
      expect_bits(got, ref, dt, full);
      return;
    }
  }
  expect_close(got, ref, dt, tolerance(dt), full);
}

}  // namespace

void random_cases(const OpInfo& op, int32_t dt, CaseList& out) {
  static const std::vector<RandomCase> cases = {
      {"basic", {3, 1001}, 42, 0},
      // Odd offset, and a counter whose high word is non-zero: g / 4 >= 2^32.
      {"offset", {7, 13}, 0xDEADBEEF12345678ull, (uint64_t{1} << 34) + 6},
      {"rank0", {}, 5, 3},
      {"empty", {0, 4}, 1, 0},
      {"large", {(int64_t{1} << 20) + 3}, 1234567, 4},
  };
  const OpInfo* p = &op;
  for (const RandomCase& c : cases) {
    const RandomCase* cp = &c;
    out.push_back({c.variant, [p, dt, cp](Context& ctx) { run_random(ctx, *p, dt, *cp); }});
  }
}

}  // namespace bpc
