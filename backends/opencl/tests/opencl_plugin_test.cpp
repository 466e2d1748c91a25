// Tests of libbackplane-opencl.so through its C ABI, on every OpenCL device the ICD loader
// finds: each (op, dtype) the device declares is checked against a float64 host reference on
// fresh random data (never zeros) with broadcasts, strided and transposed views, the scalar
// form, in-place outputs and empty tensors; random numbers against philox.h; copies with odd
// sizes, offsets and guard bytes; memory statistics; errors. Tests skip when there is no
// device. NoIcd.* and NoFp64.* run as separate CTest entries with their environment.
#include "opencl_test_support.hpp"

#include "opencl_allocator.hpp"
#include "opencl_device.hpp"
#include "opencl_program.hpp"

#include <backplane/philox.h>
#include <backplane/plugin_sdk.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace bpt;

namespace {

constexpr int32_t kAllDtypes[] = {BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_F16, BP_DTYPE_BF16,
                                  BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_U8,  BP_DTYPE_BOOL};

// The support matrix every backend implements (common brief), for dtypes f32 f64 f16 bf16
// i32 i64 u8 bool in that order.
const std::map<std::string, std::string>& expected_matrix() {
  static const std::map<std::string, std::string> m = {
      {"fill", "11111111"},    {"copy", "11111111"},    {"cast", "11111111"},
      {"add", "11111110"},     {"sub", "11111110"},     {"mul", "11111110"},
      {"maximum", "11111110"}, {"minimum", "11111110"}, {"div", "11110000"},
      {"pow", "11110000"},     {"eq", "11111111"},      {"ne", "11111111"},
      {"lt", "11111111"},      {"le", "11111111"},      {"gt", "11111111"},
      {"ge", "11111111"},      {"where", "11111111"},   {"neg", "11111100"},
      {"abs", "11111100"},     {"relu", "11111100"},    {"exp", "11110000"},
      {"log", "11110000"},     {"sqrt", "11110000"},    {"sigmoid", "11110000"},
      {"tanh", "11110000"},    {"sum", "11111100"},     {"max", "11111100"},
      {"mean", "11110000"},    {"matmul", "11110000"},  {"uniform", "11110000"},
      {"normal", "11110000"},  {"sumsq", "11110000"},   {"norm", "11110000"},
      {"linear", "11110000"}};
  return m;
}

class OpenclPlugin : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(plugin().api, nullptr) << plugin().error;
    if (plugin().devices == 0) GTEST_SKIP() << "no OpenCL device: " << plugin().reason;
  }

  static int32_t devices() { return plugin().devices; }

  // The device's declared support of (op, dtype), from list_ops.
  static bool supported(int32_t d, const std::string& op, int32_t dt) {
    const bp_op_support* list = nullptr;
    int32_t n = 0;
    EXPECT_TRUE(ok(api().list_ops(d, &list, &n)));
    for (int32_t i = 0; i < n; ++i)
      if (op == list[i].op && list[i].dtype == dt) return list[i].support == BP_SUPPORT_YES;
    return false;
  }
};

std::string label(int32_t d, const std::string& op, int32_t dt) {
  return "opencl:" + std::to_string(d) + " " + op + " " + bp_dtype_name(dt);
}

// ---- Reference arithmetic ---------------------------------------------------------------------

double ref_binary(const std::string& op, int32_t dt, double x, double y) {
  if (op == "eq") return x == y;
  if (op == "ne") return x != y;
  if (op == "lt") return x < y;
  if (op == "le") return x <= y;
  if (op == "gt") return x > y;
  if (op == "ge") return x >= y;
  if (op == "maximum") return std::isnan(x) || std::isnan(y) ? NAN : std::max(x, y);
  if (op == "minimum") return std::isnan(x) || std::isnan(y) ? NAN : std::min(x, y);
  if (is_float(dt)) {
    if (op == "add") return x + y;
    if (op == "sub") return x - y;
    if (op == "mul") return x * y;
    if (op == "div") return x / y;
    if (op == "pow") return std::pow(x, y);
  } else {
    int64_t a = static_cast<int64_t>(x), b = static_cast<int64_t>(y);
    uint64_t ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
    if (op == "add") return static_cast<double>(wrap(dt, static_cast<int64_t>(ua + ub)));
    if (op == "sub") return static_cast<double>(wrap(dt, static_cast<int64_t>(ua - ub)));
    if (op == "mul") return static_cast<double>(wrap(dt, static_cast<int64_t>(ua * ub)));
  }
  ADD_FAILURE() << "no reference for " << op;
  return 0;
}

double ref_unary(const std::string& op, int32_t dt, double x) {
  if (op == "neg")
    return is_float(dt) ? -x : static_cast<double>(wrap(dt, -static_cast<int64_t>(x)));
  if (op == "abs") return std::fabs(x);
  if (op == "relu") return x < 0 ? 0 : x;
  if (op == "exp") return std::exp(x);
  if (op == "log") return std::log(x);
  if (op == "sqrt") return std::sqrt(x);
  if (op == "sigmoid") return 1.0 / (1.0 + std::exp(-x));
  if (op == "tanh") return std::tanh(x);
  ADD_FAILURE() << "no reference for " << op;
  return 0;
}

const std::vector<std::string> kBinaryOps = {
    "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge"};
const std::vector<std::string> kUnaryOps = {"neg",  "exp",     "log",  "sqrt",
                                            "relu", "sigmoid", "tanh", "abs"};

bool is_comparison(const std::string& op) {
  return op == "eq" || op == "ne" || op == "lt" || op == "le" || op == "gt" || op == "ge";
}

// Applies a binary reference to (a, b) views, element by element.
std::vector<double> binary_reference(const std::string& op, int32_t dt,
                                     const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r(a.size());
  int32_t out_dt = is_comparison(op) ? BP_DTYPE_BOOL : dt;
  for (size_t i = 0; i < a.size(); ++i) {
    double v = ref_binary(op, dt, a[i], b[i]);
    r[i] = is_float(out_dt) ? v : quantize(out_dt, v);
  }
  return r;
}

}  // namespace

// ---- Discovery and the op table ---------------------------------------------------------------

TEST_F(OpenclPlugin, DeviceProperties) {
  for (int32_t d = 0; d < devices(); ++d) {
    bp_device_properties p{};
    p.struct_size = sizeof p;
    ASSERT_TRUE(ok(api().device_properties(d, &p)));
    EXPECT_GT(std::strlen(p.name), 0u);
    EXPECT_GT(std::strlen(p.vendor), 0u);
    EXPECT_NE(std::string(p.name).find("OpenCL"), std::string::npos) << p.name;
    EXPECT_GT(p.total_memory, 0u);
    EXPECT_LE(p.free_memory, p.total_memory);
    EXPECT_GT(p.cores, 0);
    EXPECT_EQ(p.unified_memory, 0);
    std::printf("[opencl test] opencl:%d: %s (%s), %llu bytes, %d compute units, fp64 %d\n", d,
                p.name, p.vendor, static_cast<unsigned long long>(p.total_memory), p.cores,
                p.supports_f64);
  }
  bp_device_properties p{};
  p.struct_size = sizeof p;
  ErrorInfo e = take(api().device_properties(devices(), &p));
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT) << e.message;
}

TEST_F(OpenclPlugin, OpTableMatchesMatrixAndFindKernel) {
  for (int32_t d = 0; d < devices(); ++d) {
    bp_device_properties p{};
    p.struct_size = sizeof p;
    ASSERT_TRUE(ok(api().device_properties(d, &p)));
    const bp_op_support* list = nullptr;
    int32_t n = 0;
    ASSERT_TRUE(ok(api().list_ops(d, &list, &n)));
    EXPECT_EQ(n, static_cast<int32_t>(expected_matrix().size() * BP_DTYPE_COUNT));
    std::set<std::pair<std::string, int32_t>> seen;
    for (int32_t i = 0; i < n; ++i) {
      const bp_op_support& s = list[i];
      SCOPED_TRACE(label(d, s.op, s.dtype));
      EXPECT_EQ(s.struct_size, sizeof(bp_op_support));
      EXPECT_TRUE(seen.insert({s.op, s.dtype}).second) << "listed twice";
      auto it = expected_matrix().find(s.op);
      ASSERT_NE(it, expected_matrix().end()) << "op not in the catalogue";
      bool want = it->second[static_cast<size_t>(s.dtype)] == '1' &&
                  (s.dtype != BP_DTYPE_F64 || p.supports_f64);
      EXPECT_EQ(s.support, want ? BP_SUPPORT_YES : BP_SUPPORT_NO);
      bp_kernel* k = nullptr;
      ErrorInfo e = take(api().find_kernel(d, s.op, s.dtype, &k));
      if (s.support == BP_SUPPORT_YES) {
        EXPECT_EQ(e.code, 0) << e.message;
        EXPECT_NE(k, nullptr);
        bp_kernel* again = nullptr;
        EXPECT_TRUE(ok(api().find_kernel(d, s.op, s.dtype, &again)));
        EXPECT_EQ(k, again) << "kernel handles are cached";
      } else {
        EXPECT_GT(std::strlen(s.reason), 0u) << "unsupported without a reason";
        EXPECT_EQ(e.code, BP_ERROR_UNSUPPORTED) << e.message;
        EXPECT_NE(e.message.find(s.reason), std::string::npos) << e.message;
      }
    }
    bp_kernel* k = nullptr;
    ErrorInfo e = take(api().find_kernel(d, "softmax", BP_DTYPE_F32, &k));
    EXPECT_EQ(e.code, BP_ERROR_UNSUPPORTED) << e.message;
  }
}

// ---- Elementwise --------------------------------------------------------------------------------

TEST_F(OpenclPlugin, Fill) {
  for (int32_t d = 0; d < devices(); ++d) {
    for (int32_t dt : kAllDtypes) {
      if (!supported(d, "fill", dt)) continue;
      SCOPED_TRACE(label(d, "fill", dt));
      double v = random_value(dt);
      {  // dense: clEnqueueFillBuffer
        DeviceTensor out = make_output(d, dt, {3, 7, 5});
        ASSERT_TRUE(ok(launch(d, "fill", dt, {}, {out.desc}, {float_attr("value", v)})));
        expect_close(read_output(out), std::vector<double>(105, v), dt, "dense fill");
      }
      {  // strided (transposed) output: the kernel path; untouched elements keep their bytes
        DeviceTensor out = make_output(d, dt, {6, 4});
        bp_tensor_desc view = out.desc;
        view.shape[0] = 4;
        view.shape[1] = 3;
        view.strides[0] = 1;
        view.strides[1] = 8;  // every other column of the transposed [6, 4] storage
        ASSERT_TRUE(ok(launch(d, "fill", dt, {}, {view}, {float_attr("value", v)})));
        std::vector<unsigned char> bytes = read_bytes(out);
        size_t es = bp_dtype_size(dt);
        for (int64_t r = 0; r < 6; ++r)
          for (int64_t c = 0; c < 4; ++c) {
            int64_t idx = out.guard + r * 4 + c;
            bool written = r % 2 == 0;
            if (written) {
              EXPECT_EQ(decode(dt, &bytes[static_cast<size_t>(idx) * es]), v) << r << "," << c;
            } else {
              EXPECT_EQ(bytes[static_cast<size_t>(idx) * es], kGuardByte) << r << "," << c;
            }
          }
      }
    }
    if (supported(d, "fill", BP_DTYPE_I64)) {  // INT values are exact beyond 2^53
      DeviceTensor out = make_output(d, BP_DTYPE_I64, {9});
      int64_t big = (int64_t{1} << 53) + 1;
      ASSERT_TRUE(ok(launch(d, "fill", BP_DTYPE_I64, {}, {out.desc}, {int_attr("value", big)})));
      std::vector<unsigned char> bytes = read_bytes(out);
      int64_t got;
      std::memcpy(&got, &bytes[static_cast<size_t>(out.guard) * 8], 8);
      EXPECT_EQ(got, big);
    }
  }
}

TEST_F(OpenclPlugin, CopyStridedViews) {
  for (int32_t d = 0; d < devices(); ++d) {
    for (int32_t dt : kAllDtypes) {
      if (!supported(d, "copy", dt)) continue;
      SCOPED_TRACE(label(d, "copy", dt));
      // transposed input -> dense output
      HostTensor a = permuted_tensor(dt, {5, 6, 7}, {2, 0, 1}, 3);
      DeviceTensor da = upload(d, a);
      DeviceTensor out = make_output(d, dt, {5, 6, 7});
      ASSERT_TRUE(ok(launch(d, "copy", dt, {da.desc}, {out.desc})));
      expect_close(read_output(out), a.values(), dt, "transposed copy", 0);
      // dense -> dense (a buffer copy)
      HostTensor b = random_tensor(dt, {11, 13});
      DeviceTensor db = upload(d, b);
      DeviceTensor out2 = make_output(d, dt, {11, 13});
      ASSERT_TRUE(ok(launch(d, "copy", dt, {db.desc}, {out2.desc})));
      expect_close(read_output(out2), b.values(), dt, "dense copy", 0);
      // dense -> a slice of a bigger output (rows 1..3, columns 2..5 of a [5, 8] storage)
      HostTensor c = random_tensor(dt, {3, 4});
      DeviceTensor dc = upload(d, c);
      DeviceTensor big = make_output(d, dt, {5, 8});
      bp_tensor_desc slice = big.desc;
      slice.shape[0] = 3;
      slice.shape[1] = 4;
      slice.offset += (1 * 8 + 2) * bp_dtype_size(dt);
      ASSERT_TRUE(ok(launch(d, "copy", dt, {dc.desc}, {slice})));
      std::vector<unsigned char> bytes = read_bytes(big);
      size_t es = bp_dtype_size(dt);
      for (int64_t r = 0; r < 5; ++r)
        for (int64_t col = 0; col < 8; ++col) {
          size_t at = static_cast<size_t>(big.guard + r * 8 + col) * es;
          if (r >= 1 && r <= 3 && col >= 2 && col <= 5) {
            EXPECT_EQ(decode(dt, &bytes[at]),
                      c.storage[static_cast<size_t>((r - 1) * 4 + col - 2)]);
          } else {
            EXPECT_EQ(bytes[at], kGuardByte) << "outside the slice at " << r << "," << col;
          }
        }
    }
  }
}

TEST_F(OpenclPlugin, CastAllPairs) {
  for (int32_t d = 0; d < devices(); ++d) {
    for (int32_t from : kAllDtypes) {
      if (!supported(d, "cast", from)) continue;
      // Values that exercise truncation, negative -> u8 wrap and rounding to f16/bf16.
      HostTensor a = permuted_tensor(from, {7, 9}, {1, 0}, 2);
      std::uniform_real_distribution<double> u(-120.0, 120.0);
      for (double& v : a.storage) {
        v = quantize(from, u(rng()));
        if (v == 0.0 && from != BP_DTYPE_BOOL) v = quantize(from, 3.75);
      }
      DeviceTensor da = upload(d, a);
      for (int32_t to : kAllDtypes) {
        if (to == BP_DTYPE_F64 && !supported(d, "fill", BP_DTYPE_F64)) continue;
        SCOPED_TRACE(label(d, "cast", from) + " -> " + bp_dtype_name(to));
        DeviceTensor out = make_output(d, to, {7, 9});
        ASSERT_TRUE(ok(launch(d, "cast", from, {da.desc}, {out.desc})));
        std::vector<double> ref = a.values();
        for (double& v : ref) v = quantize(to, v);
        std::vector<double> got = read_output(out);
        for (size_t i = 0; i < ref.size(); ++i)
          ASSERT_EQ(got[i], ref[i]) << "element " << i << " from " << a.values()[i];
      }
    }
  }
}

TEST_F(OpenclPlugin, BinaryOps) {
  const std::vector<int64_t> shape = {3, 5, 7};
  for (int32_t d = 0; d < devices(); ++d) {
    for (const std::string& op : kBinaryOps) {
      for (int32_t dt : kAllDtypes) {
        if (!supported(d, op, dt)) continue;
        SCOPED_TRACE(label(d, op, dt));
        int32_t out_dt = is_comparison(op) ? BP_DTYPE_BOOL : dt;
        Range ra = op == "pow" ? Range::kPositive : Range::kAny;
        Range rb = op == "pow" ? Range::kAny : (op == "mul" ? Range::kSmall : Range::kAny);
        if (op == "pow" && !is_float(dt)) continue;
        {  // broadcast both ways
          HostTensor a = broadcast_tensor(dt, shape, {3, 1, 7}, ra);
          HostTensor b = broadcast_tensor(dt, shape, {1, 5, 7}, rb);
          if (is_comparison(op))  // make some elements equal
            for (size_t i = 0; i < std::min(a.storage.size(), b.storage.size()); i += 3)
              b.storage[i] = a.storage[i];
          DeviceTensor da = upload(d, a), db = upload(d, b);
          DeviceTensor out = make_output(d, out_dt, shape);
          ASSERT_TRUE(ok(launch(d, op.c_str(), dt, {da.desc, db.desc}, {out.desc})));
          expect_close(read_output(out), binary_reference(op, dt, a.values(), b.values()), out_dt,
                       "broadcast");
        }
        {  // transposed a, dense b
          HostTensor a = permuted_tensor(dt, shape, {2, 0, 1}, 4, ra);
          HostTensor b = random_tensor(dt, shape, rb);
          DeviceTensor da = upload(d, a), db = upload(d, b);
          DeviceTensor out = make_output(d, out_dt, shape);
          ASSERT_TRUE(ok(launch(d, op.c_str(), dt, {da.desc, db.desc}, {out.desc})));
          expect_close(read_output(out), binary_reference(op, dt, a.values(), b.values()), out_dt,
                       "strided");
        }
        for (int reverse = 0; reverse < 2; ++reverse) {  // scalar form
          Range rs = reverse ? ra : rb;
          HostTensor a = permuted_tensor(dt, shape, {1, 2, 0}, 1, reverse ? rb : ra);
          double s = random_value(dt, rs);
          DeviceTensor da = upload(d, a);
          DeviceTensor out = make_output(d, out_dt, shape);
          ASSERT_TRUE(ok(launch(d, op.c_str(), dt, {da.desc}, {out.desc},
                                {float_attr("scalar", s), int_attr("reverse", reverse)})));
          std::vector<double> av = a.values(), sv(av.size(), s);
          expect_close(
              read_output(out),
              reverse ? binary_reference(op, dt, sv, av) : binary_reference(op, dt, av, sv), out_dt,
              reverse ? "reverse scalar" : "scalar");
        }
        if (!is_comparison(op)) {  // in place: out is a
          HostTensor a = random_tensor(dt, shape, ra);
          HostTensor b = broadcast_tensor(dt, shape, {1, 5, 1}, rb);
          DeviceTensor da = upload(d, a), db = upload(d, b);
          ASSERT_TRUE(ok(
              launch(d, op.c_str(), dt, {da.desc, db.desc}, {da.desc}, {int_attr("inplace", 1)})));
          std::vector<unsigned char> bytes = read_bytes(da);
          std::vector<double> got(bytes.size() / bp_dtype_size(dt));
          for (size_t i = 0; i < got.size(); ++i)
            got[i] = decode(dt, &bytes[i * bp_dtype_size(dt)]);
          expect_close(got, binary_reference(op, dt, a.values(), b.values()), dt, "in place");
        }
        {  // empty
          bp_tensor_desc e = make_desc(nullptr, dt, {0, 5}, {5, 1}, 0);
          bp_tensor_desc eo = make_desc(nullptr, out_dt, {0, 5}, {5, 1}, 0);
          EXPECT_TRUE(ok(launch(d, op.c_str(), dt, {e, e}, {eo})));
        }
      }
    }
  }
}

TEST_F(OpenclPlugin, UnaryOps) {
  const std::vector<int64_t> shape = {4, 9, 6};
  for (int32_t d = 0; d < devices(); ++d) {
    for (const std::string& op : kUnaryOps) {
      for (int32_t dt : kAllDtypes) {
        if (!supported(d, op, dt)) continue;
        SCOPED_TRACE(label(d, op, dt));
        Range r = (op == "log" || op == "sqrt") ? Range::kPositive : Range::kAny;
        HostTensor a = permuted_tensor(dt, shape, {1, 2, 0}, 7, r);
        DeviceTensor da = upload(d, a);
        DeviceTensor out = make_output(d, dt, shape);
        ASSERT_TRUE(ok(launch(d, op.c_str(), dt, {da.desc}, {out.desc})));
        std::vector<double> ref = a.values();
        for (double& v : ref) v = ref_unary(op, dt, v);
        expect_close(read_output(out), ref, dt, "strided");

        HostTensor b = random_tensor(dt, {31}, r);  // in place
        DeviceTensor db = upload(d, b);
        ASSERT_TRUE(ok(launch(d, op.c_str(), dt, {db.desc}, {db.desc}, {int_attr("inplace", 1)})));
        std::vector<unsigned char> bytes = read_bytes(db);
        std::vector<double> got(31), ref2 = b.values();
        for (size_t i = 0; i < 31; ++i) got[i] = decode(dt, &bytes[i * bp_dtype_size(dt)]);
        for (double& v : ref2) v = ref_unary(op, dt, v);
        expect_close(got, ref2, dt, "in place");

        bp_tensor_desc e = make_desc(nullptr, dt, {2, 0}, {0, 1}, 0);
        EXPECT_TRUE(ok(launch(d, op.c_str(), dt, {e}, {e})));
      }
    }
  }
}

TEST_F(OpenclPlugin, NanPropagation) {
  for (int32_t d = 0; d < devices(); ++d) {
    for (int32_t dt : {BP_DTYPE_F32, BP_DTYPE_F16, BP_DTYPE_BF16, BP_DTYPE_F64}) {
      if (!supported(d, "maximum", dt)) continue;
      SCOPED_TRACE(label(d, "maximum/minimum/relu/max", dt));
      HostTensor a = random_tensor(dt, {8});
      HostTensor b = random_tensor(dt, {8});
      a.storage[1] = NAN;
      b.storage[5] = NAN;
      DeviceTensor da = upload(d, a), db = upload(d, b);
      for (const char* op : {"maximum", "minimum"}) {
        DeviceTensor out = make_output(d, dt, {8});
        ASSERT_TRUE(ok(launch(d, op, dt, {da.desc, db.desc}, {out.desc})));
        expect_close(read_output(out), binary_reference(op, dt, a.values(), b.values()), dt, op);
      }
      DeviceTensor r = make_output(d, dt, {8});
      ASSERT_TRUE(ok(launch(d, "relu", dt, {da.desc}, {r.desc})));
      EXPECT_TRUE(std::isnan(read_output(r)[1]));
      DeviceTensor m = make_output(d, dt, {1});
      ASSERT_TRUE(ok(launch(d, "max", dt, {da.desc}, {m.desc})));
      EXPECT_TRUE(std::isnan(read_output(m)[0]));
    }
  }
}

TEST_F(OpenclPlugin, Where) {
  const std::vector<int64_t> shape = {3, 5, 7};
  for (int32_t d = 0; d < devices(); ++d) {
    for (int32_t dt : kAllDtypes) {
      if (!supported(d, "where", dt)) continue;
      SCOPED_TRACE(label(d, "where", dt));
      HostTensor c = broadcast_tensor(BP_DTYPE_BOOL, shape, {3, 1, 7});
      HostTensor a = permuted_tensor(dt, shape, {2, 1, 0}, 2);
      HostTensor b = broadcast_tensor(dt, shape, {1, 5, 1});
      DeviceTensor dc = upload(d, c), da = upload(d, a), db = upload(d, b);
      DeviceTensor out = make_output(d, dt, shape);
      ASSERT_TRUE(ok(launch(d, "where", dt, {dc.desc, da.desc, db.desc}, {out.desc})));
      std::vector<double> cv = c.values(), av = a.values(), bv = b.values(), ref(cv.size());
      for (size_t i = 0; i < ref.size(); ++i) ref[i] = cv[i] != 0 ? av[i] : bv[i];
      expect_close(read_output(out), ref, dt, "where", 0);
    }
  }
}

// ---- Reductions ------------------------------------------------------------------------------

namespace {

// Reduces `a` over the dimensions in `dims` on device d and checks against float64: sums and
// means element by element within the dtype's tolerance of the sum of |x| (the summation error
// bound, as the magnitude of the shared comparison), max exactly.
void check_reduction(int32_t d, const std::string& op, int32_t dt, const HostTensor& a,
                     const std::vector<int>& dims) {
  std::vector<int64_t> oshape = a.shape;
  for (int dim : dims) oshape[static_cast<size_t>(dim)] = 1;
  DeviceTensor da = upload(d, a);
  DeviceTensor out = make_output(d, dt, oshape);
  std::string what = "dims";
  for (int dim : dims) {
    what += ' ';
    what += std::to_string(dim);
  }
  ASSERT_TRUE(ok(launch(d, op.c_str(), dt, {da.desc}, {out.desc}))) << what;
  std::vector<double> got = read_output(out);

  int64_t nout = 1;
  for (int64_t s : oshape) nout *= s;
  std::vector<double> sum(static_cast<size_t>(nout), 0.0), mag(sum.size(), 0.0);
  std::vector<double> mx(sum.size(), -INFINITY);
  std::vector<int64_t> isum(sum.size(), 0);
  std::vector<double> av = a.values();
  size_t rank = a.shape.size();
  for (size_t i = 0; i < av.size(); ++i) {
    int64_t rem = static_cast<int64_t>(i), o = 0, stride = 1;
    std::vector<int64_t> idx(rank);
    for (size_t dd = rank; dd-- > 0;) {
      idx[dd] = rem % a.shape[dd];
      rem /= a.shape[dd];
    }
    for (size_t dd = rank; dd-- > 0;) {
      o += (oshape[dd] == 1 ? 0 : idx[dd]) * stride;
      stride *= oshape[dd];
    }
    size_t oo = static_cast<size_t>(o);
    sum[oo] += av[i];
    mag[oo] += std::fabs(av[i]);
    mx[oo] = std::max(mx[oo], av[i]);
    isum[oo] += static_cast<int64_t>(av[i]);
  }
  int64_t nred = static_cast<int64_t>(av.size()) / std::max<int64_t>(nout, 1);
  std::vector<double> ref_f, mag_f;  // float sums and means, and the sum of |x| of each
  for (size_t o = 0; o < got.size(); ++o) {
    if (op == "max") {
      ASSERT_EQ(got[o], mx[o]) << what << " output " << o;
    } else if (!is_float(dt)) {
      ASSERT_EQ(got[o], static_cast<double>(wrap(dt, isum[o]))) << what << " output " << o;
    } else {
      const double div = op == "mean" ? static_cast<double>(nred) : 1.0;
      ref_f.push_back(sum[o] / div);
      mag_f.push_back(mag[o] / div);
    }
  }
  if (is_float(dt) && op != "max") {
    EXPECT_TRUE(bp_test::all_close(dt, got, ref_f,
                                   {.mode = bp_test::Mode::kElementwise, .magnitude = mag_f}))
        << what;
  }
}

}  // namespace

TEST_F(OpenclPlugin, Reductions) {
  for (int32_t d = 0; d < devices(); ++d) {
    for (const char* op : {"sum", "mean", "max"}) {
      for (int32_t dt : kAllDtypes) {
        if (!supported(d, op, dt)) continue;
        SCOPED_TRACE(label(d, op, dt));
        Range r = is_float(dt) ? Range::kAny : Range::kSmall;
        HostTensor a = permuted_tensor(dt, {5, 37, 129}, {1, 2, 0}, 3, r);
        for (const std::vector<int>& dims :
             std::vector<std::vector<int>>{{0}, {1}, {2}, {0, 2}, {1, 2}, {0, 1, 2}})
          check_reduction(d, op, dt, a, dims);
        // Many elements into one: the chunked tree and its second pass.
        HostTensor big = random_tensor(dt, {(1 << 18) + 3}, r);
        check_reduction(d, op, dt, big, {0});
        // Many outputs of few elements: one work-item per output.
        HostTensor wide = random_tensor(dt, {70000, 3}, r);
        check_reduction(d, op, dt, wide, {1});
        // Empty: sum 0, mean NaN, max an error.
        bp_tensor_desc e = make_desc(nullptr, dt, {0, 4}, {4, 1}, 0);
        DeviceTensor out = make_output(d, dt, {1, 4});
        ErrorInfo err = take(launch(d, op, dt, {e}, {out.desc}));
        if (std::string(op) == "max") {
          EXPECT_EQ(err.code, BP_ERROR_INVALID_ARGUMENT) << err.message;
          EXPECT_NE(err.message.find("zero elements"), std::string::npos) << err.message;
        } else {
          ASSERT_EQ(err.code, 0) << err.message;
          for (double v : read_output(out)) {
            if (std::string(op) == "sum") {
              EXPECT_EQ(v, 0.0);
            } else {
              EXPECT_TRUE(std::isnan(v));
            }
          }
        }
      }
    }
  }
}

TEST_F(OpenclPlugin, SumAccuracyF32) {
  // A million positive values: float accumulation with compensation and trees stays within
  // 1e-5 (in practice ~1e-7) of the float64 sum.
  for (int32_t d = 0; d < devices(); ++d) {
    HostTensor a = random_tensor(BP_DTYPE_F32, {1000003}, Range::kPositive);
    DeviceTensor da = upload(d, a);
    DeviceTensor out = make_output(d, BP_DTYPE_F32, {1});
    ASSERT_TRUE(ok(launch(d, "sum", BP_DTYPE_F32, {da.desc}, {out.desc})));
    double ref = 0;
    for (double v : a.storage) ref += v;
    double got = read_output(out)[0];
    EXPECT_TRUE(bp_test::scalar_close(BP_DTYPE_F32, got, ref, {.rtol = 1e-6}));
  }
}

// ---- Matmul ----------------------------------------------------------------------------------

namespace {

// a[B,M,K] (row- or column-major per matrix), b[B,K,N] likewise, b's batch stride 0 when
// `broadcast_b`.
void check_matmul(int32_t d, int32_t dt, int64_t B, int64_t M, int64_t K, int64_t N, bool a_col,
                  bool b_col, bool broadcast_b) {
  std::string what = "B" + std::to_string(B) + " M" + std::to_string(M) + " K" + std::to_string(K) +
                     " N" + std::to_string(N) + (a_col ? " a^T" : "") + (b_col ? " b^T" : "") +
                     (broadcast_b ? " b broadcast" : "");
  SCOPED_TRACE(what);
  HostTensor a = a_col ? permuted_tensor(dt, {B, M, K}, {0, 2, 1}, 1)
                       : permuted_tensor(dt, {B, M, K}, {0, 1, 2}, 0);
  HostTensor b = b_col ? permuted_tensor(dt, {broadcast_b ? 1 : B, K, N}, {0, 2, 1}, 2)
                       : permuted_tensor(dt, {broadcast_b ? 1 : B, K, N}, {0, 1, 2}, 0);
  if (broadcast_b) {
    b.shape[0] = B;
    b.strides[0] = 0;
  }
  DeviceTensor da = upload(d, a), db = upload(d, b);
  DeviceTensor out = make_output(d, dt, {B, M, N});
  ASSERT_TRUE(
      ok(launch(d, "matmul", dt, {da.desc, db.desc}, {out.desc}, {int_attr("allow_tf32", 0)})));
  std::vector<double> ref(static_cast<size_t>(B * M * N), 0.0), mag(ref.size(), 0.0);
  for (int64_t z = 0; z < B; ++z)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0, sq = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double t = a.at((z * M + i) * K + k) * b.at((z * K + k) * N + j);
          s += t;
          sq += t * t;
        }
        ref[static_cast<size_t>((z * M + i) * N + j)] = s;
        mag[static_cast<size_t>((z * M + i) * N + j)] = std::sqrt(sq);
      }
  EXPECT_TRUE(bp_test::all_close(dt, read_output(out), ref,
                                 {.scale = K > 100 ? 4.0 : 1.0, .magnitude = mag}));
}

}  // namespace

TEST_F(OpenclPlugin, Matmul) {
  for (int32_t d = 0; d < devices(); ++d) {
    for (int32_t dt : kAllDtypes) {
      if (!supported(d, "matmul", dt)) continue;
      SCOPED_TRACE(label(d, "matmul", dt));
      for (int layout = 0; layout < 4; ++layout)
        check_matmul(d, dt, 3, 37, 53, 29, layout & 1, layout & 2, false);
      check_matmul(d, dt, 2, 130, 150, 70, false, true, true);
      check_matmul(d, dt, 2, 1, 17, 65, true, false, false);
      // K == 0 gives zeros; a and b hold no elements.
      bp_tensor_desc a = make_desc(nullptr, dt, {2, 3, 0}, {0, 0, 1}, 0);
      bp_tensor_desc b = make_desc(nullptr, dt, {2, 0, 4}, {0, 4, 1}, 0);
      DeviceTensor out = make_output(d, dt, {2, 3, 4});
      ASSERT_TRUE(ok(launch(d, "matmul", dt, {a, b}, {out.desc})));
      for (double v : read_output(out)) EXPECT_EQ(v, 0.0);
    }
  }
}

// ---- Random ----------------------------------------------------------------------------------

TEST_F(OpenclPlugin, UniformBitIdenticalToPhilox) {
  const uint64_t seed = 0x1234567890abcdefull ^ rng()();
  const uint64_t offset = 6;  // not a multiple of 4
  const int64_t n = 1001;
  const double low = -2.0, high = 3.0;
  for (int32_t d = 0; d < devices(); ++d) {
    for (int32_t dt : kAllDtypes) {
      if (!supported(d, "uniform", dt)) continue;
      SCOPED_TRACE(label(d, "uniform", dt));
      DeviceTensor out = make_output(d, dt, {7, 143});
      ASSERT_TRUE(ok(launch(d, "uniform", dt, {}, {out.desc},
                            {int_attr("seed", static_cast<int64_t>(seed)),
                             int_attr("offset", static_cast<int64_t>(offset)),
                             float_attr("low", low), float_attr("high", high)})));
      std::vector<unsigned char> bytes = read_bytes(out);
      size_t es = bp_dtype_size(dt);
      for (int64_t i = 0; i < n; ++i) {
        float u = bp_philox_uniform01(seed, offset + static_cast<uint64_t>(i));
        unsigned char want[8];
        if (dt == BP_DTYPE_F64) {
          double v = low + (high - low) * static_cast<double>(u);
          std::memcpy(want, &v, 8);
        } else {
          float lo = static_cast<float>(low), hi = static_cast<float>(high);
          float v = lo + (hi - lo) * u;
          encode(dt, v, want);
        }
        ASSERT_EQ(std::memcmp(&bytes[static_cast<size_t>(out.guard + i) * es], want, es), 0)
            << "element " << i;
      }
    }
  }
}

TEST_F(OpenclPlugin, NormalMatchesReferenceAndStatistics) {
  const uint64_t seed = rng()();
  for (int32_t d = 0; d < devices(); ++d) {
    for (int32_t dt : kAllDtypes) {
      if (!supported(d, "normal", dt)) continue;
      SCOPED_TRACE(label(d, "normal", dt));
      const int64_t n = 100001;
      const uint64_t offset = 3;
      DeviceTensor out = make_output(d, dt, {n});
      ASSERT_TRUE(ok(launch(d, "normal", dt, {}, {out.desc},
                            {int_attr("seed", static_cast<int64_t>(seed)),
                             int_attr("offset", static_cast<int64_t>(offset)),
                             float_attr("mean", 1.5), float_attr("std", 2.0)})));
      std::vector<double> got = read_output(out), ref(got.size());
      for (int64_t i = 0; i < n; ++i) {
        uint64_t g = offset + static_cast<uint64_t>(i);
        float u1, u2;
        bp_philox_normal_uniforms(seed, g, &u1, &u2);
        double r = std::sqrt(-2.0 * std::log(static_cast<double>(u1)));
        double th = 6.283185307179586 * static_cast<double>(u2);
        ref[static_cast<size_t>(i)] =
            quantize(dt, 1.5 + 2.0 * (g & 1 ? r * std::sin(th) : r * std::cos(th)));
      }
      // Device log/sin/cos in float: a few ulps, amplified near u1 = 1 (r small).
      expect_close(got, ref, dt, "vs reference", dt == BP_DTYPE_F64 ? 1e4 : 10);
      double mean = 0, var = 0;
      for (double v : got) mean += v;
      mean /= static_cast<double>(n);
      for (double v : got) var += (v - mean) * (v - mean);
      double sd = std::sqrt(var / static_cast<double>(n - 1));
      EXPECT_TRUE(bp_test::scalar_close(BP_DTYPE_F64, mean, 1.5, {.rtol = 0, .atol = 0.03}));
      EXPECT_TRUE(bp_test::scalar_close(BP_DTYPE_F64, sd, 2.0, {.rtol = 0, .atol = 0.03}));
    }
  }
}

// ---- Memory and copies -----------------------------------------------------------------------

TEST_F(OpenclPlugin, CopiesWithOffsetsAndGuardBytes) {
  for (int32_t d = 0; d < devices(); ++d) {
    bp_stream* s = stream(d);
    const uint64_t size = 1031;
    bp_buffer *x = nullptr, *y = nullptr;
    ASSERT_TRUE(ok(api().mem_alloc(d, s, size, &x)));
    ASSERT_TRUE(ok(api().mem_alloc(d, s, size, &y)));
    std::vector<unsigned char> mx(size, 0x11), my(size, 0x22), src(size);
    for (auto& c : src) c = static_cast<unsigned char>(rng()());
    ASSERT_TRUE(ok(api().memset(s, x, 0, 0x11, size)));
    ASSERT_TRUE(ok(api().memset(s, y, 0, 0x22, size)));
    // h2d of 37 bytes at an odd offset
    ASSERT_TRUE(ok(api().copy_h2d(s, x, 13, src.data() + 5, 37)));
    std::memcpy(&mx[13], &src[5], 37);
    // d2d across buffers, odd offsets and size
    ASSERT_TRUE(ok(api().copy_d2d(s, y, 999, x, 13, 31)));
    std::memcpy(&my[999], &mx[13], 31);
    // d2d within one buffer, overlapping ranges (both directions)
    ASSERT_TRUE(ok(api().copy_d2d(s, x, 20, x, 13, 37)));
    std::memmove(&mx[20], &mx[13], 37);
    ASSERT_TRUE(ok(api().copy_d2d(s, x, 15, x, 20, 37)));
    std::memmove(&mx[15], &mx[20], 37);
    // d2d within one buffer, disjoint
    ASSERT_TRUE(ok(api().copy_d2d(s, x, 501, x, 13, 101)));
    std::memmove(&mx[501], &mx[13], 101);
    // memset of an odd range
    ASSERT_TRUE(ok(api().memset(s, y, 700, 0x7F, 33)));
    std::memset(&my[700], 0x7F, 33);
    // zero-byte operations are no-ops
    ASSERT_TRUE(ok(api().copy_h2d(s, x, size, src.data(), 0)));
    ASSERT_TRUE(ok(api().copy_d2d(s, y, 0, x, 0, 0)));
    ASSERT_TRUE(ok(api().memset(s, y, 0, 0, 0)));
    // d2h of a middle range leaves the host bytes around it alone
    std::vector<unsigned char> back(size + 16, 0xEE);
    ASSERT_TRUE(ok(api().copy_d2h(s, back.data() + 8, x, 0, size)));
    ASSERT_TRUE(ok(api().stream_synchronize(s)));
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(back[static_cast<size_t>(i)], 0xEE);
      EXPECT_EQ(back[size + 8 + static_cast<size_t>(i)], 0xEE);
    }
    EXPECT_EQ(std::memcmp(back.data() + 8, mx.data(), size), 0);
    std::vector<unsigned char> yb(size);
    ASSERT_TRUE(ok(api().copy_d2h(s, yb.data(), y, 0, size)));
    EXPECT_EQ(std::memcmp(yb.data(), my.data(), size), 0);
    std::vector<unsigned char> part(7);
    ASSERT_TRUE(ok(api().copy_d2h(s, part.data(), y, 1000, 7)));
    EXPECT_EQ(std::memcmp(part.data(), &my[1000], 7), 0);
    // out of range: an error, no crash
    ErrorInfo e = take(api().copy_h2d(s, x, size - 3, src.data(), 4));
    EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT) << e.message;
    e = take(api().copy_d2d(s, x, 0, y, 1030, 2));
    EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT) << e.message;
    ASSERT_TRUE(ok(api().mem_free(d, s, x, size)));
    ASSERT_TRUE(ok(api().mem_free(d, s, y, size)));
  }
}

TEST_F(OpenclPlugin, MemoryStatsReturnToBaseline) {
  for (int32_t d = 0; d < devices(); ++d) {
    bp_stream* s = stream(d);
    ASSERT_TRUE(ok(api().stream_synchronize(s)));
    ASSERT_TRUE(ok(api().memory_empty_cache(d)));
    bp_memory_stats base{};
    base.struct_size = sizeof base;
    ASSERT_TRUE(ok(api().memory_stats(d, &base)));
    ASSERT_TRUE(ok(api().memory_reset_peak(d)));

    const std::vector<uint64_t> sizes = {1, 513, 4096, (1u << 20) + 5, 0, 3000000};
    std::vector<bp_buffer*> bufs;
    uint64_t total = 0;
    for (uint64_t n : sizes) {
      bp_buffer* b = nullptr;
      ASSERT_TRUE(ok(api().mem_alloc(d, s, n, &b)));
      ASSERT_NE(b, nullptr);
      if (n) {
        ASSERT_TRUE(ok(api().memset(s, b, 0, 1, n)));
      }
      bufs.push_back(b);
      total += n;
    }
    bp_memory_stats st{};
    st.struct_size = sizeof st;
    ASSERT_TRUE(ok(api().memory_stats(d, &st)));
    EXPECT_EQ(st.allocated, base.allocated + total);
    EXPECT_EQ(st.num_allocs, base.num_allocs + sizes.size());
    EXPECT_GE(st.peak_allocated, st.allocated);
    EXPECT_GE(st.reserved, base.reserved + total);
    bp_device_properties p{};
    p.struct_size = sizeof p;
    ASSERT_TRUE(ok(api().device_properties(d, &p)));
    EXPECT_EQ(p.free_memory, p.total_memory - st.reserved);

    for (size_t i = 0; i < bufs.size(); ++i)
      ASSERT_TRUE(ok(api().mem_free(d, s, bufs[i], sizes[i])));
    bp_memory_stats after{};
    after.struct_size = sizeof after;
    ASSERT_TRUE(ok(api().memory_stats(d, &after)));
    EXPECT_EQ(after.allocated, base.allocated);
    EXPECT_EQ(after.num_allocs, base.num_allocs);
    EXPECT_EQ(after.reserved, st.reserved) << "freed buffers stay cached";
    EXPECT_EQ(after.peak_allocated, st.peak_allocated);

    // A request of the same size class reuses a cached buffer.
    bp_buffer* again = nullptr;
    ASSERT_TRUE(ok(api().mem_alloc(d, s, 4000, &again)));
    bp_memory_stats reuse{};
    reuse.struct_size = sizeof reuse;
    ASSERT_TRUE(ok(api().memory_stats(d, &reuse)));
    EXPECT_EQ(reuse.reserved, st.reserved);
    ASSERT_TRUE(ok(api().mem_free(d, s, again, 4000)));

    ASSERT_TRUE(ok(api().memory_reset_peak(d)));
    ASSERT_TRUE(ok(api().memory_stats(d, &after)));
    EXPECT_EQ(after.peak_allocated, after.allocated);
    ASSERT_TRUE(ok(api().stream_synchronize(s)));
    ASSERT_TRUE(ok(api().memory_empty_cache(d)));
    ASSERT_TRUE(ok(api().memory_stats(d, &after)));
    EXPECT_EQ(after.reserved, base.reserved);
    EXPECT_EQ(after.allocated, base.allocated);
  }
}

TEST_F(OpenclPlugin, HugeAllocationIsAnError) {
  for (int32_t d = 0; d < devices(); ++d) {
    bp_memory_stats before{};
    before.struct_size = sizeof before;
    ASSERT_TRUE(ok(api().memory_stats(d, &before)));
    bp_device_properties p{};
    p.struct_size = sizeof p;
    ASSERT_TRUE(ok(api().device_properties(d, &p)));
    for (uint64_t n : {uint64_t{1} << 62, p.total_memory + 1, ~uint64_t{0}}) {
      bp_buffer* b = nullptr;
      ErrorInfo e = take(api().mem_alloc(d, stream(d), n, &b));
      EXPECT_EQ(e.code, BP_ERROR_OUT_OF_MEMORY) << e.message;
      EXPECT_NE(e.message.find(std::to_string(n)), std::string::npos) << e.message;
      EXPECT_NE(e.message.find("opencl:" + std::to_string(d)), std::string::npos) << e.message;
    }
    bp_memory_stats after{};
    after.struct_size = sizeof after;
    ASSERT_TRUE(ok(api().memory_stats(d, &after)));
    EXPECT_EQ(after.allocated, before.allocated);
    EXPECT_EQ(after.num_allocs, before.num_allocs);
  }
}

TEST_F(OpenclPlugin, ZeroByteAllocation) {
  for (int32_t d = 0; d < devices(); ++d) {
    bp_buffer* b = nullptr;
    ASSERT_TRUE(ok(api().mem_alloc(d, stream(d), 0, &b)));
    ASSERT_TRUE(ok(api().memset(stream(d), b, 0, 0, 0)));
    ASSERT_TRUE(ok(api().copy_d2h(stream(d), nullptr, b, 0, 0)));
    ASSERT_TRUE(ok(api().mem_free(d, stream(d), b, 0)));
    ASSERT_TRUE(ok(api().mem_free(d, stream(d), nullptr, 0)));
  }
}

// ---- Streams and events ----------------------------------------------------------------------

TEST_F(OpenclPlugin, EventsOrderStreamsAndTime) {
  for (int32_t d = 0; d < devices(); ++d) {
    bp_stream *s1 = nullptr, *s2 = nullptr;
    ASSERT_TRUE(ok(api().stream_create(d, &s1)));
    ASSERT_TRUE(ok(api().stream_create(d, &s2)));
    bp_event *e0 = nullptr, *e1 = nullptr;
    ASSERT_TRUE(ok(api().event_create(d, &e0)));
    ASSERT_TRUE(ok(api().event_create(d, &e1)));
    ASSERT_TRUE(ok(api().stream_wait_event(s2, e0))) << "an unrecorded event is a no-op";

    const int64_t n = 1 << 20;
    bp_buffer* buf = nullptr;
    ASSERT_TRUE(ok(api().mem_alloc(d, s1, n * 4, &buf)));
    bp_tensor_desc t = make_desc(buf, BP_DTYPE_F32, {n}, {1}, 0);
    bp_attr v = float_attr("value", 2.5);
    bp_kernel* fill = nullptr;
    ASSERT_TRUE(ok(api().find_kernel(d, "fill", BP_DTYPE_F32, &fill)));
    ASSERT_TRUE(ok(api().event_record(e0, s1)));
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(ok(api().launch(fill, s1, nullptr, 0, &t, 1, &v, 1)));
    ASSERT_TRUE(ok(api().event_record(e1, s1)));
    // s2 reads what s1 wrote, ordered by the event only.
    ASSERT_TRUE(ok(api().stream_wait_event(s2, e1)));
    std::vector<float> host(n);
    ASSERT_TRUE(ok(api().copy_d2h(s2, host.data(), buf, 0, n * 4)));
    ASSERT_TRUE(ok(api().stream_synchronize(s2)));
    EXPECT_EQ(host.front(), 2.5f);
    EXPECT_EQ(host.back(), 2.5f);
    ASSERT_TRUE(ok(api().event_synchronize(e1)));
    double ms = -1;
    ASSERT_TRUE(ok(api().event_elapsed_ms(e0, e1, &ms)));
    EXPECT_GE(ms, 0.0);
    EXPECT_LT(ms, 60000.0);

    ASSERT_TRUE(ok(api().mem_free(d, s1, buf, n * 4)));
    ASSERT_TRUE(ok(api().event_destroy(e0)));
    ASSERT_TRUE(ok(api().event_destroy(e1)));
    ASSERT_TRUE(ok(api().stream_destroy(s1)));
    ASSERT_TRUE(ok(api().stream_destroy(s2)));
  }
}

TEST_F(OpenclPlugin, CachedBufferReusedAcrossStreams) {
  // A buffer freed on s1 while s1 still writes it, reused at once on s2: s2 must see it only
  // after s1's work (Note [Cross-stream reuse]).
  for (int32_t d = 0; d < devices(); ++d) {
    bp_stream *s1 = nullptr, *s2 = nullptr;
    ASSERT_TRUE(ok(api().stream_create(d, &s1)));
    ASSERT_TRUE(ok(api().stream_create(d, &s2)));
    ASSERT_TRUE(ok(api().memory_empty_cache(d)));
    const int64_t n = 1 << 18;
    bp_buffer* a = nullptr;
    ASSERT_TRUE(ok(api().mem_alloc(d, s1, n * 4, &a)));
    bp_tensor_desc t = make_desc(a, BP_DTYPE_F32, {n}, {1}, 0);
    bp_attr v = float_attr("value", 1.0);
    bp_kernel* fill = nullptr;
    ASSERT_TRUE(ok(api().find_kernel(d, "fill", BP_DTYPE_F32, &fill)));
    for (int i = 0; i < 8; ++i) ASSERT_TRUE(ok(api().launch(fill, s1, nullptr, 0, &t, 1, &v, 1)));
    ASSERT_TRUE(ok(api().mem_free(d, s1, a, n * 4)));
    bp_buffer* b = nullptr;
    ASSERT_TRUE(ok(api().mem_alloc(d, s2, n * 4, &b)));
    EXPECT_EQ(a, b) << "expected the cached buffer back";
    std::vector<float> ones(n, 7.0f), host(n);
    ASSERT_TRUE(ok(api().copy_h2d(s2, b, 0, ones.data(), n * 4)));
    ASSERT_TRUE(ok(api().copy_d2h(s2, host.data(), b, 0, n * 4)));
    ASSERT_TRUE(ok(api().stream_synchronize(s2)));
    ASSERT_TRUE(ok(api().stream_synchronize(s1)));
    ASSERT_TRUE(ok(api().copy_d2h(s2, host.data(), b, 0, n * 4)));
    ASSERT_TRUE(ok(api().stream_synchronize(s2)));
    EXPECT_EQ(std::count(host.begin(), host.end(), 7.0f), n) << "s1's fills ran after s2's write";
    ASSERT_TRUE(ok(api().mem_free(d, s2, b, n * 4)));
    ASSERT_TRUE(ok(api().stream_destroy(s1)));
    ASSERT_TRUE(ok(api().stream_destroy(s2)));
  }
}

// One kernel on eight streams at once, every launch wider than the ones before it: the pattern
// that made PoCL before 7.0 abort in pocl_release_dlhandle_cache (Note [PoCL dlhandle cache];
// BP_OPENCL_ORDER_KERNELS=0 turns the plugin's ordering off to see it). Values must be exact.
TEST_F(OpenclPlugin, OneKernelOnManyStreamsAtOnce) {
  for (int32_t d = 0; d < devices(); ++d) {
    bp_kernel* add = nullptr;
    ASSERT_TRUE(ok(api().find_kernel(d, "add", BP_DTYPE_F32, &add)));
    constexpr int kThreads = 8, kLaunches = 30;
    std::vector<std::string> failures(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        std::mt19937_64 g(bp_test::test_seed("opencl_plugin_test") + static_cast<uint64_t>(t));
        std::uniform_real_distribution<float> u(-4, 4);
        bp_stream* s = nullptr;
        if (bp_error* e = api().stream_create(d, &s)) {
          failures[t] = take(e).message;
          return;
        }
        for (int i = 0; i < kLaunches && failures[t].empty(); ++i) {
          const int64_t n = 1000 + (i * kThreads + t) * 613;
          std::vector<float> x(static_cast<size_t>(n)), y(x.size());
          for (float& v : x) v = u(g);
          bp_buffer *a = nullptr, *o = nullptr;
          bp_tensor_desc da{}, dout{};
          auto fail = [&](bp_error* e) {
            if (e && failures[t].empty())
              failures[t] = "launch " + std::to_string(i) + ": " + take(e).message;
            return e != nullptr;
          };
          if (fail(api().mem_alloc(d, s, n * 4, &a)) || fail(api().mem_alloc(d, s, n * 4, &o)))
            break;
          da = make_desc(a, BP_DTYPE_F32, {n}, {1}, 0);
          dout = make_desc(o, BP_DTYPE_F32, {n}, {1}, 0);
          const bp_tensor_desc ins[2] = {da, da};
          if (!fail(api().copy_h2d(s, a, 0, x.data(), n * 4)) &&
              !fail(api().launch(add, s, ins, 2, &dout, 1, nullptr, 0)) &&
              !fail(api().copy_d2h(s, y.data(), o, 0, n * 4)) &&
              !fail(api().stream_synchronize(s))) {
            for (int64_t k = 0; k < n; ++k)
              if (y[k] != x[k] + x[k]) {
                failures[t] = "launch " + std::to_string(i) + ": element " + std::to_string(k) +
                              " is " + std::to_string(y[k]);
                break;
              }
          }
          fail(api().mem_free(d, s, a, n * 4));
          fail(api().mem_free(d, s, o, n * 4));
        }
        if (bp_error* e = api().stream_destroy(s)) take(e);
      });
    for (auto& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
  }
}

TEST(OpenclPocl, VersionsWithTheDlhandleCacheBug) {
  using bp::opencl::pocl_dlhandle_cache_bug;
  EXPECT_TRUE(pocl_dlhandle_cache_bug(
      "OpenCL 3.0 PoCL 3.1+debian  Linux, None+Asserts, RELOC, SPIR, LLVM 15.0.6, SLEEF"));
  EXPECT_TRUE(pocl_dlhandle_cache_bug("OpenCL 3.0 PoCL 6.0  Linux, Release, RELOC, LLVM 18.1.8"));
  EXPECT_TRUE(pocl_dlhandle_cache_bug("OpenCL 1.2 pocl 1.8  Linux, None+Asserts, LLVM 11"));
  EXPECT_FALSE(pocl_dlhandle_cache_bug("OpenCL 3.0 PoCL 7.0  Linux, Release, RELOC, LLVM 19"));
  EXPECT_FALSE(pocl_dlhandle_cache_bug("OpenCL 3.0 PoCL 7.1-pre main-abc123  Linux"));
  EXPECT_FALSE(pocl_dlhandle_cache_bug("OpenCL 3.0 CUDA 13.0.48"));
  EXPECT_FALSE(pocl_dlhandle_cache_bug(""));
}

// ---- Errors ----------------------------------------------------------------------------------

TEST_F(OpenclPlugin, BadLaunchesAreErrors) {
  for (int32_t d = 0; d < devices(); ++d) {
    HostTensor a = random_tensor(BP_DTYPE_F32, {4, 5});
    HostTensor b = random_tensor(BP_DTYPE_F32, {4, 6});
    DeviceTensor da = upload(d, a), db = upload(d, b);
    DeviceTensor out = make_output(d, BP_DTYPE_F32, {4, 5});
    ErrorInfo e = take(launch(d, "add", BP_DTYPE_F32, {da.desc, db.desc}, {out.desc}));
    EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(e.message.find("[4, 6]"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find("add f32"), std::string::npos) << e.message;

    bp_tensor_desc past = da.desc;  // a view reaching past its buffer
    past.shape[0] = 5;
    bp_tensor_desc out_past = out.desc;
    out_past.shape[0] = 5;
    e = take(launch(d, "exp", BP_DTYPE_F32, {past}, {out_past}));
    EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT) << e.message;

    bp_tensor_desc odd = da.desc;  // misaligned offset
    odd.offset = 2;
    odd.shape[0] = 3;
    bp_tensor_desc out3 = out.desc;
    out3.shape[0] = 3;
    e = take(launch(d, "neg", BP_DTYPE_F32, {odd}, {out3}));
    EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT) << e.message;

    e = take(launch(d, "add", BP_DTYPE_F32, {da.desc}, {out.desc}));  // no scalar
    EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT) << e.message;

    e = take(launch(d, "sum", BP_DTYPE_F32, {da.desc}, {db.desc}));  // bad output shape
    EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT) << e.message;

    e = take(launch(d, "add", BP_DTYPE_BOOL, {da.desc, da.desc}, {out.desc}));
    EXPECT_EQ(e.code, BP_ERROR_UNSUPPORTED) << e.message;
    EXPECT_NE(e.message.find("bool"), std::string::npos) << e.message;
  }
}

// ---- Internals -------------------------------------------------------------------------------

TEST(OpenclAllocator, SizeClasses) {
  using bp::opencl::Allocator;
  EXPECT_EQ(Allocator::size_class(1), 512u);
  EXPECT_EQ(Allocator::size_class(512), 512u);
  EXPECT_EQ(Allocator::size_class(513), 1024u);
  EXPECT_EQ(Allocator::size_class(1 << 20), 1u << 20);
  EXPECT_EQ(Allocator::size_class((1 << 20) + 1), (1u << 20) + (1u << 18));
  EXPECT_EQ(Allocator::size_class(5u << 20), 5u << 20);
  EXPECT_EQ(Allocator::size_class((5u << 20) + 1), 6u << 20);
  for (uint64_t n = 1; n < (uint64_t{1} << 40); n = n * 3 + 7) {
    uint64_t c = Allocator::size_class(n);
    EXPECT_GE(c, n);
    // Powers of two up to 1 MiB, then at most a quarter of slack.
    EXPECT_LE(c, n <= (1u << 20) ? std::max<uint64_t>(512, 2 * n - 1) : n + n / 4) << n;
  }
}

TEST(OpenclProgram, BuildErrorCarriesTheBuildLog) {
  cl_platform_id platform = nullptr;
  cl_uint np = 0;
  if (clGetPlatformIDs(1, &platform, &np) != CL_SUCCESS || np == 0)
    GTEST_SKIP() << "no OpenCL platform";
  cl_device_id dev = nullptr;
  if (clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &dev, nullptr) != CL_SUCCESS)
    GTEST_SKIP() << "no OpenCL device";
  cl_int st = CL_SUCCESS;
  cl_context ctx = clCreateContext(nullptr, 1, &dev, nullptr, nullptr, &st);
  ASSERT_EQ(st, CL_SUCCESS);
  const std::string broken =
      "__kernel void bp_broken(__global float* out) { out[0] = undefined_identifier_xyz; }";
  try {
    cl_program p = bp::opencl::build_program(ctx, dev, broken, "", "'broken test program'");
    clReleaseProgram(p);
    ADD_FAILURE() << "a broken kernel compiled";
  } catch (const bp::sdk::Failure& f) {
    std::string m = f.what();
    EXPECT_EQ(f.code(), BP_ERROR_DEVICE);
    EXPECT_EQ(f.native_name(), "CL_BUILD_PROGRAM_FAILURE");
    EXPECT_NE(m.find("broken test program"), std::string::npos) << m;
    EXPECT_NE(m.find("build log"), std::string::npos) << m;
    EXPECT_NE(m.find("undefined_identifier_xyz"), std::string::npos) << m;
  }
  clReleaseContext(ctx);
}

// ---- Environments set up by CTest ------------------------------------------------------------

TEST(NoIcd, ReportsZeroDevicesWithTheReason) {
  if (!std::getenv("BP_OPENCL_TEST_EXPECT_NO_ICD"))
    GTEST_SKIP() << "run by CTest as opencl_plugin.NoIcd (OCL_ICD_VENDORS at an empty folder)";
  ASSERT_NE(plugin().api, nullptr) << "the plugin must load without a driver: " << plugin().error;
  EXPECT_EQ(plugin().devices, 0);
  const std::string& why = plugin().reason;
  std::printf("[opencl test] 0 devices: %s\n", why.c_str());
  EXPECT_NE(why.find("CL_PLATFORM_NOT_FOUND_KHR"), std::string::npos) << why;
  EXPECT_NE(why.find("-1001"), std::string::npos) << why;
  EXPECT_NE(why.find(std::getenv("OCL_ICD_VENDORS")), std::string::npos) << why;
  bp_device_properties p{};
  p.struct_size = sizeof p;
  ErrorInfo e = take(api().device_properties(0, &p));
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT) << e.message;
  bp_kernel* k = nullptr;
  e = take(api().find_kernel(0, "add", BP_DTYPE_F32, &k));
  EXPECT_NE(e.code, 0);
  bp_buffer* b = nullptr;
  e = take(api().mem_alloc(0, nullptr, 16, &b));
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT) << e.message;
}

TEST(NoFp64, F64IsDeclaredUnsupportedWithAReason) {
  if (!std::getenv("BP_OPENCL_DISABLE_FP64"))
    GTEST_SKIP() << "run by CTest as opencl_plugin.NoFp64 (BP_OPENCL_DISABLE_FP64=1)";
  ASSERT_NE(plugin().api, nullptr) << plugin().error;
  if (plugin().devices == 0) GTEST_SKIP() << "no OpenCL device: " << plugin().reason;
  for (int32_t d = 0; d < plugin().devices; ++d) {
    bp_device_properties p{};
    p.struct_size = sizeof p;
    ASSERT_TRUE(ok(api().device_properties(d, &p)));
    EXPECT_EQ(p.supports_f64, 0);
    const bp_op_support* list = nullptr;
    int32_t n = 0;
    ASSERT_TRUE(ok(api().list_ops(d, &list, &n)));
    for (int32_t i = 0; i < n; ++i) {
      if (list[i].dtype != BP_DTYPE_F64) continue;
      EXPECT_EQ(list[i].support, BP_SUPPORT_NO) << list[i].op;
      EXPECT_GT(std::strlen(list[i].reason), 0u) << list[i].op;
      bp_kernel* k = nullptr;
      ErrorInfo e = take(api().find_kernel(d, list[i].op, BP_DTYPE_F64, &k));
      EXPECT_EQ(e.code, BP_ERROR_UNSUPPORTED) << list[i].op;
    }
    // f32 still works; a cast to f64 is refused at launch.
    HostTensor a = random_tensor(BP_DTYPE_F32, {17});
    DeviceTensor da = upload(d, a);
    DeviceTensor out = make_output(d, BP_DTYPE_F32, {17});
    ASSERT_TRUE(ok(launch(d, "exp", BP_DTYPE_F32, {da.desc}, {out.desc})));
    std::vector<double> ref = a.values();
    for (double& v : ref) v = std::exp(v);
    expect_close(read_output(out), ref, BP_DTYPE_F32, "exp");
    DeviceTensor out64 = make_output(d, BP_DTYPE_F64, {17});
    ErrorInfo e = take(launch(d, "cast", BP_DTYPE_F32, {da.desc}, {out64.desc}));
    EXPECT_EQ(e.code, BP_ERROR_UNSUPPORTED) << e.message;
  }
}
