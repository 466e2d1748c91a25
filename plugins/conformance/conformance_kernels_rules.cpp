// Kernel cases of the catalogue's rules (Note [Op catalogue] in plugin_abi.h: casts, overflow,
// NaN), on fixed values where the rule decides the result, for every backend: maximum, minimum
// and the max reduction propagate NaN from either side; integer add and neg wrap modulo 2^bits;
// a float -> integer cast truncates toward zero, x -> bool is x != 0, and a cast to f16 rounds
// to nearest even and overflows to infinity. These were the CPU backend's own tests; here every
// plugin answers to them.
#include "conformance_kernels.hpp"

#include <cmath>
#include <cstdint>
#include <limits>

namespace bpc {

namespace {

HostTensor dense(int32_t dt, const std::vector<int64_t>& shape, const std::vector<double>& v) {
  HostTensor t;
  t.dtype = dt;
  t.shape = shape;
  t.strides = contiguous_strides(shape);
  for (double x : v) t.storage.push_back(std::isnan(x) ? x : round_to(dt, x));
  return t;
}

// Launches `op` (kernel dtype `kdt`) on `ins` into a dense `out_dt` output of `shape` and
// requires `want` exactly (NaN in place of NaN).
void expect_exact(Context& ctx, const char* op, int32_t kdt, const std::vector<HostTensor>& ins,
                  int32_t out_dt, const std::vector<int64_t>& shape,
                  const std::vector<bp_attr>& attrs, const std::vector<double>& want,
                  const std::string& rule) {
  std::vector<DeviceTensor> dev;
  std::vector<bp_tensor_desc> descs;
  std::vector<const HostTensor*> hs;
  for (const HostTensor& h : ins) {
    dev.push_back(upload(ctx, h));
    hs.push_back(&h);
  }
  for (const DeviceTensor& d : dev) descs.push_back(d.desc);
  DeviceTensor out = make_output(ctx, out_dt, shape);
  const std::string what =
      describe_launch(op, hs, shape, out_dt, rule) + " on " + ctx.device_label();
  run_kernel(ctx, op, kdt, descs, out.desc, attrs, what);
  expect_close(read_dense(out, what), want, out_dt, 0, what + " (" + rule + ")");
}

}  // namespace

void rules_cases(const OpInfo& op, int32_t dt, CaseList& out) {
  const std::string name = op.name;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if ((name == "maximum" || name == "minimum") && is_float_dtype(dt)) {
    out.push_back({"nan", [name, dt, nan](Context& c) {
                     const bool mx = name == "maximum";
                     expect_exact(
                         c, name.c_str(), dt,
                         {dense(dt, {4}, {nan, 1, 2, -0.5}), dense(dt, {4}, {1, nan, 3, -4})}, dt,
                         {4}, {}, {nan, nan, mx ? 3.0 : 2.0, mx ? -0.5 : -4.0},
                         "a NaN on either side propagates");
                   }});
  }
  if (name == "max" && is_float_dtype(dt)) {
    out.push_back({"nan", [dt, nan](Context& c) {
                     expect_exact(c, "max", dt, {dense(dt, {2, 3}, {1, nan, 3, 4, 5, 6})}, dt,
                                  {2, 1}, {}, {nan, 6}, "a NaN in the reduced range propagates");
                   }});
  }
  if (name == "add" && (dt == BP_DTYPE_I32 || dt == BP_DTYPE_U8)) {
    out.push_back(
        {"wraps", [dt](Context& c) {
           const bool i32 = dt == BP_DTYPE_I32;
           const double s = i32 ? 1 : 10;
           const std::vector<double> a = i32 ? std::vector<double>{2147483647.0, -2147483648.0, 5}
                                             : std::vector<double>{250, 3, 255};
           const std::vector<double> want =
               i32 ? std::vector<double>{-2147483648.0, -2147483647.0, 6}
                   : std::vector<double>{4, 13, 9};
           expect_exact(c, "add", dt, {dense(dt, {3}, a)}, dt, {3}, {attr_float("scalar", s)}, want,
                        "integer addition wraps modulo 2^bits");
         }});
  }
  if (name == "neg" && dt == BP_DTYPE_I32) {
    out.push_back({"wraps", [](Context& c) {
                     expect_exact(c, "neg", BP_DTYPE_I32,
                                  {dense(BP_DTYPE_I32, {3}, {2147483647.0, -2147483648.0, -7})},
                                  BP_DTYPE_I32, {3}, {}, {-2147483647.0, -2147483648.0, 7},
                                  "neg of the minimum value gives it back");
                   }});
  }
  if (name == "cast" && dt == BP_DTYPE_F32) {
    out.push_back({"rules", [](Context& c) {
                     const HostTensor in =
                         dense(BP_DTYPE_F32, {7}, {-2.75, 2.75, -0.5, 0.0, 1e-3, -1.0, 255.5});
                     const std::vector<double> trunc = {-2, 2, 0, 0, 0, -1, 255};
                     expect_exact(c, "cast", BP_DTYPE_F32, {in}, BP_DTYPE_I32, {7}, {}, trunc,
                                  "float -> integer truncates toward zero");
                     expect_exact(c, "cast", BP_DTYPE_F32, {in}, BP_DTYPE_I64, {7}, {}, trunc,
                                  "float -> integer truncates toward zero");
                     expect_exact(c, "cast", BP_DTYPE_F32, {in}, BP_DTYPE_BOOL, {7}, {},
                                  {1, 1, 1, 0, 1, 1, 1}, "x -> bool is x != 0");
                   }});
  }
  if (name == "cast" && dt == BP_DTYPE_F64) {
    out.push_back({"f16_rules", [](Context& c) {
                     const double inf = std::numeric_limits<double>::infinity();
                     expect_exact(c, "cast", BP_DTYPE_F64,
                                  {dense(BP_DTYPE_F64, {3}, {1.0 + 1.0 / 4096, 70000.0, -1e-9})},
                                  BP_DTYPE_F16, {3}, {}, {1.0, inf, 0.0},
                                  "to f16 rounds to nearest even and overflows to infinity");
                   }});
  }
}

}  // namespace bpc
