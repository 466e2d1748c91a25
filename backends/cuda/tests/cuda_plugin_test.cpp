// The CUDA plugin on a real GPU: every (op, dtype) of the support matrix against a float64 host
// reference on fresh random data (contiguous, broadcast, transposed, misaligned, scalar form,
// in-place, empty), reductions over every kind of dim set, batched/transposed matmul, Philox
// bit-identity, copies with guard bytes, peer copies, memory statistics, OOM, events, and a
// few printed timings. Every test skips cleanly when the plugin reports no device (CI).
#include "cuda_test_support.hpp"

#include <backplane/op_catalogue.h>
#include <backplane/philox.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <string>

namespace bp_cuda_test {
namespace {

const int kAllDtypes[] = {BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_F16, BP_DTYPE_BF16,
                          BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_U8,  BP_DTYPE_BOOL};

struct Case {
  std::string op;
  int dtype;
};
std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.op + "_" + bp_dtype_name(info.param.dtype);
}
std::vector<Case> cases(const std::vector<std::string>& ops, const std::vector<int>& dtypes) {
  std::vector<Case> c;
  for (const auto& op : ops)
    for (int dt : dtypes) c.push_back({op, dt});
  return c;
}

const std::vector<int> kFloat = {BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_F16, BP_DTYPE_BF16};
const std::vector<int> kArith = {BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_F16, BP_DTYPE_BF16,
                                 BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_U8};
const std::vector<int> kSigned = {BP_DTYPE_F32,  BP_DTYPE_F64, BP_DTYPE_F16,
                                  BP_DTYPE_BF16, BP_DTYPE_I32, BP_DTYPE_I64};
const std::vector<int> kAll(std::begin(kAllDtypes), std::end(kAllDtypes));

// ---- Plugin surface --------------------------------------------------------------------------

TEST(CudaPlugin, PropertiesAndListOps) {
  BP_REQUIRE_GPU();
  for (int32_t d = 0; d < plugin().count; ++d) {
    bp_device_properties p{};
    p.struct_size = sizeof p;
    check(api()->device_properties(d, &p), "device_properties");
    EXPECT_GT(std::strlen(p.name), 0u);
    EXPECT_STREQ(p.vendor, "NVIDIA");
    EXPECT_EQ(std::string(p.uuid).rfind("GPU-", 0), 0u) << p.uuid;
    EXPECT_EQ(std::strlen(p.uuid), 40u) << p.uuid;
    EXPECT_EQ(std::strlen(p.pci_bus_id), 12u) << p.pci_bus_id;
    EXPECT_GT(p.total_memory, 0u);
    EXPECT_GT(p.free_memory, 0u);
    EXPECT_LE(p.free_memory, p.total_memory);
    EXPECT_GE(p.compute_major, 7);
    EXPECT_GT(p.cores, 0);
    EXPECT_EQ(p.supports_f64, 1);
    EXPECT_EQ(p.unified_memory, 0);
    std::printf("cuda:%d %s %s %s cc %d.%d, %d SMs, %llu MiB\n", d, p.name, p.uuid, p.pci_bus_id,
                p.compute_major, p.compute_minor, p.cores,
                static_cast<unsigned long long>(p.total_memory >> 20));
  }
  const bp_op_support* list = nullptr;
  int32_t n = 0;
  check(api()->list_ops(0, &list, &n), "list_ops");
  ASSERT_EQ(n, static_cast<int32_t>(BP_OP_COUNT) * static_cast<int32_t>(BP_DTYPE_COUNT));
  std::map<std::string, int> yes;
  for (int32_t i = 0; i < n; ++i) {
    const bp_op_support& s = list[i];
    bp_kernel* k = nullptr;
    bp_error* e = api()->find_kernel(0, s.op, s.dtype, &k);
    if (s.support == BP_SUPPORT_YES) {
      EXPECT_EQ(e, nullptr) << s.op << " " << bp_dtype_name(s.dtype);
      ++yes[s.op];
    } else {
      EXPECT_EQ(s.support, BP_SUPPORT_NO);
      EXPECT_GT(std::strlen(s.reason), 0u);
      ASSERT_NE(e, nullptr) << s.op << " " << bp_dtype_name(s.dtype);
      EXPECT_EQ(e->code, BP_ERROR_UNSUPPORTED);
    }
    if (e) api()->error_free(e);
  }
  // The support matrix of the catalogue.
  const std::map<std::string, int> expected = {
      {"fill", 8},   {"copy", 8},  {"cast", 8},    {"add", 7},     {"sub", 7},     {"mul", 7},
      {"div", 4},    {"pow", 4},   {"maximum", 7}, {"minimum", 7}, {"eq", 8},      {"ne", 8},
      {"lt", 8},     {"le", 8},    {"gt", 8},      {"ge", 8},      {"where", 8},   {"neg", 6},
      {"exp", 4},    {"log", 4},   {"sqrt", 4},    {"relu", 6},    {"sigmoid", 4}, {"tanh", 4},
      {"abs", 6},    {"sum", 6},   {"mean", 4},    {"max", 6},     {"matmul", 4},  {"uniform", 4},
      {"normal", 4}, {"sumsq", 4}, {"norm", 4},    {"linear", 4}};
  EXPECT_EQ(yes, expected);
  bp_kernel* k = nullptr;
  const Err unknown = error_of(api()->find_kernel(0, "no_such_op", BP_DTYPE_F32, &k));
  EXPECT_EQ(unknown.code, BP_ERROR_UNSUPPORTED);
  const Err bad_device = error_of(api()->find_kernel(plugin().count, "add", BP_DTYPE_F32, &k));
  EXPECT_EQ(bad_device.code, BP_ERROR_INVALID_ARGUMENT);
}

// ---- Binary arithmetic -----------------------------------------------------------------------

double ref_binary(const std::string& op, int dt, double a, double b) {
  double r;
  if (op == "add")
    r = a + b;
  else if (op == "sub")
    r = a - b;
  else if (op == "mul")
    r = a * b;
  else if (op == "div")
    r = a / b;
  else if (op == "pow")
    r = std::pow(a, b);
  else if (op == "maximum")
    r = std::max(a, b);
  else
    r = std::min(a, b);
  return is_float(dt) ? r : wrap(dt, r);
}

// Operand generators that keep every op well conditioned.
Gen lhs_values(const std::string& op, int dt) {
  if (op == "pow") return range_values(0.5, 2.0);
  return any_values(dt);
}
Gen rhs_values(const std::string& op, int dt) {
  if (op == "div") return nonzero_values(dt);
  if (op == "pow") return range_values(-2.0, 2.0);
  return any_values(dt);
}

class Binary : public ::testing::TestWithParam<Case> {};

TEST_P(Binary, MatchesReference) {
  BP_REQUIRE_GPU();
  const std::string op = GetParam().op;
  const int dt = GetParam().dtype;
  const double tol = tolerance(dt);
  auto verify = [&](const Tensor& a, const Tensor& b, const char* what) {
    Tensor out = dense(dt, a.shape, any_values(dt));
    launch(op.c_str(), dt, {&a, &b}, {&out});
    const std::vector<double> va = a.values(), vb = b.values();
    std::vector<double> ref(va.size());
    for (size_t i = 0; i < ref.size(); ++i) ref[i] = round_to(dt, ref_binary(op, dt, va[i], vb[i]));
    EXPECT_TRUE(close(dt, out.download(), ref, tol)) << what;
  };
  const std::vector<int64_t> shape = {3, 37, 11};
  verify(dense(dt, shape, lhs_values(op, dt)), dense(dt, shape, rhs_values(op, dt)), "dense");
  verify(dense(dt, {100003}, lhs_values(op, dt)), dense(dt, {100003}, rhs_values(op, dt)),
         "dense long");
  verify(broadcast(dt, {4, 6, 9}, {4, 1, 9}, lhs_values(op, dt)),
         broadcast(dt, {4, 6, 9}, {1, 6, 9}, rhs_values(op, dt)), "broadcast");
  verify(transposed(dt, {2, 17, 23}, lhs_values(op, dt)),
         dense(dt, {2, 17, 23}, rhs_values(op, dt)), "transposed");
  verify(offset_view(dt, {1001}, 3, lhs_values(op, dt)), dense(dt, {1001}, rhs_values(op, dt)),
         "misaligned");
  verify(dense(dt, {}, lhs_values(op, dt)), dense(dt, {}, rhs_values(op, dt)), "rank 0");

  // Scalar form, both orders. Integer dtypes convert the scalar first (2.75 -> 2).
  for (int reverse = 0; reverse < 2; ++reverse) {
    const double scalar = op == "pow" && reverse ? 1.5 : 2.75;
    const double s = is_float(dt) ? scalar : std::trunc(scalar);
    Tensor a = dense(dt, {513}, reverse && op == "div" ? nonzero_values(dt) : lhs_values(op, dt));
    Tensor out = dense(dt, {513}, any_values(dt));
    launch(op.c_str(), dt, {&a}, {&out}, {attr_f("scalar", scalar), attr_i("reverse", reverse)});
    std::vector<double> ref;
    for (double v : a.values())
      ref.push_back(round_to(dt, reverse ? ref_binary(op, dt, s, v) : ref_binary(op, dt, v, s)));
    EXPECT_TRUE(close(dt, out.download(), ref, tol)) << "scalar, reverse " << reverse;
  }

  // In place: out is a.
  {
    Tensor a = dense(dt, {77, 5}, lhs_values(op, dt));
    Tensor b = dense(dt, {77, 5}, rhs_values(op, dt));
    std::vector<double> ref;
    const std::vector<double> va = a.values(), vb = b.values();
    for (size_t i = 0; i < va.size(); ++i)
      ref.push_back(round_to(dt, ref_binary(op, dt, va[i], vb[i])));
    launch(op.c_str(), dt, {&a, &b}, {&a}, {attr_i("inplace", 1)});
    EXPECT_TRUE(close(dt, a.download(), ref, tol)) << "in place";
  }

  // Empty tensors (NULL buffers) do nothing and succeed.
  {
    Tensor e;
    e.dtype = dt;
    e.shape = {0, 5};
    e.strides = {5, 1};
    launch(op.c_str(), dt, {&e, &e}, {&e});
    sync();
  }
}

INSTANTIATE_TEST_SUITE_P(CudaPlugin, Binary,
                         ::testing::ValuesIn(cases({"add", "sub", "mul", "maximum", "minimum"},
                                                   kArith)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(CudaPluginFloat, Binary,
                         ::testing::ValuesIn(cases({"div", "pow"}, kFloat)), case_name);

// ---- Comparisons and where -------------------------------------------------------------------

bool ref_compare(const std::string& op, double a, double b) {
  if (op == "eq") return a == b;
  if (op == "ne") return a != b;
  if (op == "lt") return a < b;
  if (op == "le") return a <= b;
  if (op == "gt") return a > b;
  return a >= b;
}

// Few distinct values so that equality is frequent.
Gen compare_values(int dt) {
  if (dt == BP_DTYPE_BOOL) return [] { return static_cast<double>(uniform_int(0, 1)); };
  if (dt == BP_DTYPE_U8) return [] { return static_cast<double>(uniform_int(0, 4)); };
  if (!is_float(dt)) return [] { return static_cast<double>(uniform_int(-3, 3)); };
  return [] { return 0.5 * static_cast<double>(uniform_int(-6, 6)); };
}

class Compare : public ::testing::TestWithParam<Case> {};

TEST_P(Compare, MatchesReference) {
  BP_REQUIRE_GPU();
  const std::string op = GetParam().op;
  const int dt = GetParam().dtype;
  auto verify = [&](const Tensor& a, const Tensor& b, const char* what) {
    Tensor out = dense(BP_DTYPE_BOOL, a.shape, any_values(BP_DTYPE_BOOL));
    launch(op.c_str(), dt, {&a, &b}, {&out});
    const std::vector<double> va = a.values(), vb = b.values();
    std::vector<double> ref;
    for (size_t i = 0; i < va.size(); ++i) ref.push_back(ref_compare(op, va[i], vb[i]) ? 1 : 0);
    EXPECT_TRUE(close(BP_DTYPE_BOOL, out.download(), ref, 0.0)) << what;
  };
  verify(dense(dt, {5, 211}, compare_values(dt)), dense(dt, {5, 211}, compare_values(dt)), "dense");
  verify(broadcast(dt, {7, 13}, {7, 1}, compare_values(dt)),
         transposed(dt, {7, 13}, compare_values(dt)), "broadcast x transposed");
  for (int reverse = 0; reverse < 2; ++reverse) {
    Tensor a = dense(dt, {300}, compare_values(dt));
    Tensor out = dense(BP_DTYPE_BOOL, {300}, any_values(BP_DTYPE_BOOL));
    launch(op.c_str(), dt, {&a}, {&out}, {attr_f("scalar", 1.0), attr_i("reverse", reverse)});
    std::vector<double> ref;
    for (double v : a.values())
      ref.push_back((reverse ? ref_compare(op, 1.0, v) : ref_compare(op, v, 1.0)) ? 1 : 0);
    EXPECT_TRUE(close(BP_DTYPE_BOOL, out.download(), ref, 0.0)) << "scalar, reverse " << reverse;
  }
}

INSTANTIATE_TEST_SUITE_P(CudaPlugin, Compare,
                         ::testing::ValuesIn(cases({"eq", "ne", "lt", "le", "gt", "ge"}, kAll)),
                         case_name);

class Where : public ::testing::TestWithParam<int> {};

TEST_P(Where, MatchesReference) {
  BP_REQUIRE_GPU();
  const int dt = GetParam();
  auto verify = [&](const Tensor& c, const Tensor& a, const Tensor& b, const char* what) {
    Tensor out = dense(dt, a.shape, any_values(dt));
    launch("where", dt, {&c, &a, &b}, {&out});
    const std::vector<double> vc = c.values(), va = a.values(), vb = b.values();
    std::vector<double> ref;
    for (size_t i = 0; i < va.size(); ++i) ref.push_back(vc[i] != 0 ? va[i] : vb[i]);
    EXPECT_TRUE(close(dt, out.download(), ref, 0.0)) << what;
  };
  verify(dense(BP_DTYPE_BOOL, {9, 123}, any_values(BP_DTYPE_BOOL)),
         dense(dt, {9, 123}, any_values(dt)), dense(dt, {9, 123}, any_values(dt)), "dense");
  verify(broadcast(BP_DTYPE_BOOL, {6, 10}, {1, 10}, any_values(BP_DTYPE_BOOL)),
         transposed(dt, {6, 10}, any_values(dt)), broadcast(dt, {6, 10}, {6, 1}, any_values(dt)),
         "broadcast");
}

INSTANTIATE_TEST_SUITE_P(CudaPlugin, Where, ::testing::ValuesIn(kAll),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(bp_dtype_name(i.param));
                         });

// ---- Unary -----------------------------------------------------------------------------------

double ref_unary(const std::string& op, int dt, double x) {
  double r;
  if (op == "neg")
    r = -x;
  else if (op == "abs")
    r = std::fabs(x);
  else if (op == "relu")
    r = x < 0 ? 0.0 : x;
  else if (op == "exp")
    r = std::exp(x);
  else if (op == "log")
    r = std::log(x);
  else if (op == "sqrt")
    r = std::sqrt(x);
  else if (op == "sigmoid")
    r = 1.0 / (1.0 + std::exp(-x));
  else
    r = std::tanh(x);
  return is_float(dt) ? r : wrap(dt, r);
}

class Unary : public ::testing::TestWithParam<Case> {};

TEST_P(Unary, MatchesReference) {
  BP_REQUIRE_GPU();
  const std::string op = GetParam().op;
  const int dt = GetParam().dtype;
  const Gen gen = op == "log" || op == "sqrt" ? positive_values(dt)
                  : op == "exp"               ? range_values(-3.0, 3.0)
                                              : any_values(dt);
  auto verify = [&](const Tensor& a, bool in_place, const char* what) {
    std::vector<double> ref;
    for (double v : a.values()) ref.push_back(round_to(dt, ref_unary(op, dt, v)));
    if (in_place) {
      launch(op.c_str(), dt, {&a}, {&a}, {attr_i("inplace", 1)});
      EXPECT_TRUE(close(dt, a.download(), ref, tolerance(dt))) << what;
    } else {
      Tensor out = dense(dt, a.shape, any_values(dt));
      launch(op.c_str(), dt, {&a}, {&out});
      EXPECT_TRUE(close(dt, out.download(), ref, tolerance(dt))) << what;
    }
  };
  verify(dense(dt, {65537}, gen), false, "dense");
  verify(transposed(dt, {3, 31, 17}, gen), false, "transposed");
  verify(offset_view(dt, {999}, 1, gen), false, "misaligned");
  verify(dense(dt, {4, 129}, gen), true, "in place");
}

INSTANTIATE_TEST_SUITE_P(CudaPlugin, Unary,
                         ::testing::ValuesIn(cases({"neg", "abs", "relu"}, kSigned)), case_name);
INSTANTIATE_TEST_SUITE_P(CudaPluginFloat, Unary,
                         ::testing::ValuesIn(cases({"exp", "log", "sqrt", "sigmoid", "tanh"},
                                                   kFloat)),
                         case_name);

// ---- fill, copy, cast ------------------------------------------------------------------------

class Layout : public ::testing::TestWithParam<int> {};

TEST_P(Layout, Fill) {
  BP_REQUIRE_GPU();
  const int dt = GetParam();
  for (double v : {2.75, -1.25, 0.0}) {
    Tensor out = dense(dt, {3, 1001}, any_values(dt));
    launch("fill", dt, {}, {&out}, {attr_f("value", v)});
    const double expect =
        dt == BP_DTYPE_U8 || !is_float(dt) ? round_to(dt, std::trunc(v)) : round_to(dt, v);
    EXPECT_TRUE(close(dt, out.download(), std::vector<double>(3003, expect), 0.0)) << v;
  }
  // INT value, exact for i64; a strided output leaves the elements between untouched.
  Tensor base = dense(dt, {40, 8}, any_values(dt));
  Tensor view = base;
  view.shape = {20, 3};
  view.strides = {16, 2};
  view.offset = 1;
  const int64_t big = (int64_t{1} << 53) + 1;
  launch("fill", dt, {}, {&view}, {attr_i("value", dt == BP_DTYPE_I64 ? big : 7)});
  std::vector<double> ref = base.storage;
  const double expect = dt == BP_DTYPE_I64 ? static_cast<double>(big) : round_to(dt, 7.0);
  for (int64_t p : view.positions()) ref[static_cast<size_t>(p)] = expect;
  if (dt == BP_DTYPE_I64) {
    // 2^53 + 1 is not a double: compare the raw int64 bits.
    std::vector<int64_t> raw(base.storage.size());
    sync();
    check(api()->copy_d2h(stream(), raw.data(), base.buf->get(), 0, raw.size() * 8), "copy_d2h");
    sync();
    for (int64_t p : view.positions()) EXPECT_EQ(raw[static_cast<size_t>(p)], big);
  } else {
    EXPECT_TRUE(close(dt, base.download_storage(), ref, 0.0)) << "strided fill";
  }
}

TEST_P(Layout, Copy) {
  BP_REQUIRE_GPU();
  const int dt = GetParam();
  // dense -> dense, transposed -> dense, misaligned -> dense, dense -> strided.
  for (int kind = 0; kind < 3; ++kind) {
    Tensor in = kind == 0   ? dense(dt, {7, 300}, any_values(dt))
                : kind == 1 ? transposed(dt, {7, 300}, any_values(dt))
                            : offset_view(dt, {7, 300}, 5, any_values(dt));
    Tensor out = dense(dt, {7, 300}, any_values(dt));
    launch("copy", dt, {&in}, {&out});
    EXPECT_TRUE(close(dt, out.download(), in.values(), 0.0)) << "kind " << kind;
  }
  Tensor in = dense(dt, {5, 6, 7}, any_values(dt));
  Tensor base = dense(dt, {7, 6, 13}, any_values(dt));
  Tensor view = base;  // out[i][j][k] = base[k][j][i * 2 + 1]
  view.shape = {5, 6, 7};
  view.strides = {2, 13, 78};
  view.offset = 1;
  launch("copy", dt, {&in}, {&view});
  std::vector<double> ref = base.storage;
  const std::vector<int64_t> pos = view.positions();
  const std::vector<double> vin = in.values();
  for (size_t i = 0; i < pos.size(); ++i) ref[static_cast<size_t>(pos[i])] = vin[i];
  EXPECT_TRUE(close(dt, base.download_storage(), ref, 0.0)) << "strided destination";
}

// Reference cast: float -> integer truncates through int64 and wraps; x -> bool is x != 0.
double ref_cast(int to, double v) {
  if (to == BP_DTYPE_BOOL) return v != 0 ? 1 : 0;
  if (is_float(to)) return round_to(to, v);
  return wrap(to, static_cast<double>(static_cast<int64_t>(std::trunc(v))));
}

TEST_P(Layout, CastToEveryDtype) {
  BP_REQUIRE_GPU();
  const int from = GetParam();
  const Gen gen = is_float(from) ? range_values(-300.0, 300.0) : any_values(from);
  for (int to : kAll) {
    for (int kind = 0; kind < 2; ++kind) {
      Tensor in = kind == 0 ? dense(from, {2049}, gen) : transposed(from, {33, 65}, gen);
      Tensor out = dense(to, in.shape, any_values(to));
      launch("cast", from, {&in}, {&out});
      std::vector<double> ref;
      for (double v : in.values()) ref.push_back(ref_cast(to, v));
      EXPECT_TRUE(close(to, out.download(), ref, 0.0))
          << bp_dtype_name(from) << " -> " << bp_dtype_name(to) << " kind " << kind;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CudaPlugin, Layout, ::testing::ValuesIn(kAll),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(bp_dtype_name(i.param));
                         });

// ---- Reductions ------------------------------------------------------------------------------

// Reference reduction of `in` over dims with out_shape[d] == 1 != in.shape[d].
// `magnitude`, when given, receives the L2 norm of the terms of each output (sum, mean).
std::vector<double> ref_reduce(const std::string& op, const Tensor& in,
                               const std::vector<int64_t>& out_shape,
                               std::vector<double>* magnitude = nullptr) {
  const std::vector<double> v = in.values();
  int64_t n_out = 1;
  for (int64_t s : out_shape) n_out *= s;
  std::vector<double> acc(static_cast<size_t>(n_out), op == "max" ? -INFINITY : 0.0);
  std::vector<double> sq(static_cast<size_t>(n_out), 0.0);
  std::vector<int64_t> count(static_cast<size_t>(n_out), 0);
  const std::vector<int64_t> ostr = dense_strides(out_shape);
  std::vector<int64_t> idx(in.shape.size(), 0);
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t o = 0;
    for (size_t d = 0; d < idx.size(); ++d) o += (out_shape[d] == 1 ? 0 : idx[d]) * ostr[d];
    double& a = acc[static_cast<size_t>(o)];
    a = op == "max" ? std::max(a, v[i]) : a + v[i];
    sq[static_cast<size_t>(o)] += v[i] * v[i];
    ++count[static_cast<size_t>(o)];
    for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {
      if (++idx[static_cast<size_t>(d)] < in.shape[static_cast<size_t>(d)]) break;
      idx[static_cast<size_t>(d)] = 0;
    }
  }
  if (magnitude) magnitude->assign(acc.size(), 0.0);
  for (size_t o = 0; o < acc.size(); ++o) {
    const double div = op == "mean" && count[o] ? static_cast<double>(count[o]) : 1.0;
    if (op == "mean") acc[o] = count[o] ? acc[o] / div : NAN;
    acc[o] = is_float(in.dtype) ? round_to(in.dtype, acc[o]) : wrap(in.dtype, acc[o]);
    if (magnitude && op != "max") (*magnitude)[o] = std::sqrt(sq[o]) / div;
  }
  return acc;
}

Gen reduce_values(int dt) {
  if (dt == BP_DTYPE_F16 || dt == BP_DTYPE_BF16) return range_values(-0.25, 0.75);
  if (is_float(dt)) return range_values(-1.0, 3.0);
  return [] { return static_cast<double>(uniform_int(-100, 100)); };
}

class Reduce : public ::testing::TestWithParam<Case> {};

TEST_P(Reduce, MatchesReference) {
  BP_REQUIRE_GPU();
  const std::string op = GetParam().op;
  const int dt = GetParam().dtype;
  const double tol = op == "max" ? 0.0 : tolerance(dt);
  auto verify = [&](const Tensor& in, std::vector<int64_t> out_shape, const std::string& what) {
    Tensor out = dense(dt, out_shape, any_values(dt));
    launch(op.c_str(), dt, {&in}, {&out});
    std::vector<double> magnitude;
    const std::vector<double> ref = ref_reduce(op, in, out_shape, &magnitude);
    EXPECT_TRUE(close(dt, out.download(), ref, tol, magnitude)) << what;
  };
  const Tensor t = dense(dt, {5, 37, 129}, reduce_values(dt));
  verify(t, {1, 37, 129}, "dim 0");
  verify(t, {5, 1, 129}, "dim 1");
  verify(t, {5, 37, 1}, "dim 2");
  verify(t, {1, 37, 1}, "dims 0, 2");
  verify(t, {1, 1, 1}, "all (CUB)");
  verify(t, {5, 37, 129}, "none");
  const Tensor tt = transposed(dt, {6, 70, 90}, reduce_values(dt));
  verify(tt, {6, 70, 1}, "transposed, last dim");
  verify(tt, {6, 1, 90}, "transposed, middle dim");
  verify(tt, {1, 1, 1}, "transposed, all");
  verify(broadcast(dt, {40, 50}, {40, 1}, reduce_values(dt)), {40, 1}, "broadcast input");
  verify(dense(dt, {3, 100003}, reduce_values(dt)), {3, 1}, "few long rows (split)");
  verify(dense(dt, {100003, 3}, reduce_values(dt)), {1, 3}, "few long columns (split)");
  verify(dense(dt, {1 << 20}, reduce_values(dt)), {1}, "2^20 elements (CUB)");
  verify(dense(dt, {}, reduce_values(dt)), {}, "rank 0");

  // Empty reduced range: sum 0, mean NaN, max is an error.
  Tensor empty;
  empty.dtype = dt;
  empty.shape = {3, 0};
  empty.strides = {0, 1};
  Tensor out = dense(dt, {3, 1}, any_values(dt));
  if (op == "max") {
    const Err e = error_of(try_launch("max", dt, {&empty}, {&out}));
    EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(e.message.find("max"), std::string::npos) << e.message;
  } else {
    launch(op.c_str(), dt, {&empty}, {&out});
    const double expect = op == "mean" ? NAN : 0.0;
    EXPECT_TRUE(close(dt, out.download(), std::vector<double>(3, expect), 0.0)) << "empty";
  }
}

INSTANTIATE_TEST_SUITE_P(CudaPlugin, Reduce, ::testing::ValuesIn(cases({"sum", "max"}, kSigned)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(CudaPluginFloat, Reduce, ::testing::ValuesIn(cases({"mean"}, kFloat)),
                         case_name);

TEST(CudaPlugin, SumF32Accuracy) {
  BP_REQUIRE_GPU();
  const Tensor t = dense(BP_DTYPE_F32, {1 << 24}, range_values(0.0, 1.0));
  Tensor out = dense(BP_DTYPE_F32, {1}, any_values(BP_DTYPE_F32));
  launch("sum", BP_DTYPE_F32, {&t}, {&out});
  double ref = 0;
  for (double v : t.storage) ref += v;
  const double got = out.download()[0];
  EXPECT_TRUE(close(BP_DTYPE_F32, {got}, {ref}, 1e-5));
}

// ---- Matmul ----------------------------------------------------------------------------------

// `magnitude` receives the L2 norm of the products summed into each output.
std::vector<double> ref_matmul(const Tensor& a, const Tensor& b, std::vector<double>& magnitude) {
  const int64_t B = a.shape[0], M = a.shape[1], K = a.shape[2], N = b.shape[2];
  const std::vector<double> va = a.values(), vb = b.values();
  std::vector<double> out(static_cast<size_t>(B * M * N), 0.0);
  magnitude.assign(out.size(), 0.0);
  for (int64_t z = 0; z < B; ++z)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0, sq = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double t = va[static_cast<size_t>((z * M + i) * K + k)] *
                           vb[static_cast<size_t>((z * K + k) * N + j)];
          s += t;
          sq += t * t;
        }
        out[static_cast<size_t>((z * M + i) * N + j)] = s;
        magnitude[static_cast<size_t>((z * M + i) * N + j)] = std::sqrt(sq);
      }
  return out;
}

class Matmul : public ::testing::TestWithParam<int> {};

TEST_P(Matmul, MatchesReference) {
  BP_REQUIRE_GPU();
  const int dt = GetParam();
  const double tol = dt == BP_DTYPE_F32 ? 1e-5 : dt == BP_DTYPE_F64 ? 1e-12 : 1e-2;
  const Gen gen = range_values(-1.0, 1.0);
  auto verify = [&](const Tensor& a, const Tensor& b, double t, const std::vector<bp_attr>& attrs,
                    const std::string& what) {
    Tensor out = dense(dt, {a.shape[0], a.shape[1], b.shape[2]}, any_values(dt));
    launch("matmul", dt, {&a, &b}, {&out}, attrs);
    std::vector<double> magnitude;
    std::vector<double> ref = ref_matmul(a, b, magnitude);
    for (double& r : ref) r = round_to(dt, r);
    EXPECT_TRUE(close(dt, out.download(), ref, t, magnitude)) << what;
  };
  const int64_t B = 3, M = 37, K = 53, N = 29;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const Tensor a = ta ? transposed(dt, {B, M, K}, gen) : dense(dt, {B, M, K}, gen);
      const Tensor b = tb ? transposed(dt, {B, K, N}, gen) : dense(dt, {B, K, N}, gen);
      verify(a, b, tol, {}, "transpose a " + std::to_string(ta) + " b " + std::to_string(tb));
    }
  }
  verify(dense(dt, {B, M, K}, gen), broadcast(dt, {B, K, N}, {1, K, N}, gen), tol, {},
         "batch-broadcast b");
  verify(broadcast(dt, {B, M, K}, {1, M, K}, gen), transposed(dt, {B, K, N}, gen), tol, {},
         "batch-broadcast a, transposed b");
  verify(dense(dt, {1, 1, K}, gen), dense(dt, {1, K, 1}, gen), tol, {}, "dot product");
  verify(dense(dt, {2, 64, 1}, gen), dense(dt, {2, 1, 48}, gen), tol, {}, "outer product");
  if (dt == BP_DTYPE_F32)
    verify(dense(dt, {2, 128, 256}, gen), dense(dt, {2, 256, 96}, gen), 3e-3,
           {attr_i("allow_tf32", 1)}, "tf32");
  // K == 0 gives zeros.
  Tensor a0, b0;
  a0.dtype = b0.dtype = dt;
  a0.shape = {2, 5, 0};
  a0.strides = {0, 0, 1};
  b0.shape = {2, 0, 4};
  b0.strides = {0, 4, 1};
  Tensor out = dense(dt, {2, 5, 4}, any_values(dt));
  launch("matmul", dt, {&a0, &b0}, {&out});
  EXPECT_TRUE(close(dt, out.download(), std::vector<double>(40, 0.0), 0.0)) << "K == 0";
}

INSTANTIATE_TEST_SUITE_P(CudaPlugin, Matmul, ::testing::ValuesIn(kFloat),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(bp_dtype_name(i.param));
                         });

// ---- Random ----------------------------------------------------------------------------------

// Host transcription of Note [Philox stream], in the output's compute precision.
double host_uniform(int dt, uint64_t seed, uint64_t g, double low, double high) {
  const float u = bp_philox_uniform01(seed, g);
  if (dt == BP_DTYPE_F64) return low + (high - low) * static_cast<double>(u);
  const float lo = static_cast<float>(low), hi = static_cast<float>(high);
  return round_to(dt, lo + (hi - lo) * u);
}
// `magnitude` receives |mean| + |stddev * z|, the size of the two terms the kernel adds (a
// value that cancels to near zero is judged by them).
double host_normal(int dt, uint64_t seed, uint64_t g, double mean, double stddev,
                   double* magnitude) {
  float u1, u2;
  bp_philox_normal_uniforms(seed, g, &u1, &u2);
  if (dt == BP_DTYPE_F64) {
    const double r = std::sqrt(-2.0 * std::log(static_cast<double>(u1)));
    const double th = 6.283185307179586 * static_cast<double>(u2);
    const double term = stddev * ((g & 1) ? r * std::sin(th) : r * std::cos(th));
    *magnitude = std::fabs(mean) + std::fabs(term);
    return mean + term;
  }
  const float r = std::sqrt(-2.0f * std::log(u1));
  const float th = 6.283185307179586f * u2;
  const float z = (g & 1) ? r * std::sin(th) : r * std::cos(th);
  *magnitude = std::fabs(mean) + std::fabs(stddev * z);
  return round_to(dt, static_cast<float>(mean) + static_cast<float>(stddev) * z);
}

class Random : public ::testing::TestWithParam<int> {};

TEST_P(Random, UniformIsBitIdentical) {
  BP_REQUIRE_GPU();
  const int dt = GetParam();
  const uint64_t seed = static_cast<uint64_t>(uniform_int(0, INT64_MAX));
  for (uint64_t offset : {uint64_t{0}, uint64_t{5}, uint64_t{1} << 33}) {
    Tensor out = dense(dt, {7, 143}, any_values(dt));
    launch(
        "uniform", dt, {}, {&out},
        {attr_i("seed", static_cast<int64_t>(seed)), attr_i("offset", static_cast<int64_t>(offset)),
         attr_f("low", -2.0), attr_f("high", 3.0)});
    std::vector<double> ref;
    for (uint64_t i = 0; i < 1001; ++i)
      ref.push_back(host_uniform(dt, seed, offset + i, -2.0, 3.0));
    EXPECT_TRUE(close(dt, out.download(), ref, 0.0)) << "offset " << offset;
  }
}

TEST_P(Random, NormalMatchesFormulaAndStatistics) {
  BP_REQUIRE_GPU();
  const int dt = GetParam();
  const uint64_t seed = static_cast<uint64_t>(uniform_int(0, INT64_MAX));
  const int64_t n = 1 << 20;
  Tensor out = dense(dt, {n}, any_values(dt));
  launch("normal", dt, {}, {&out},
         {attr_i("seed", static_cast<int64_t>(seed)), attr_i("offset", 3), attr_f("mean", 1.0),
          attr_f("std", 2.0)});
  const std::vector<double> v = out.download();
  double sum = 0, sq = 0;
  for (double x : v) sum += x;
  const double mean = sum / static_cast<double>(n);
  for (double x : v) sq += (x - mean) * (x - mean);
  const double sd = std::sqrt(sq / static_cast<double>(n));
  EXPECT_TRUE(bp_test::scalar_close(BP_DTYPE_F64, mean, 1.0, {.rtol = 0, .atol = 0.02}));
  EXPECT_TRUE(bp_test::scalar_close(BP_DTYPE_F64, sd, 2.0, {.rtol = 0, .atol = 0.02}));
  // Elementwise against the host formula, to the accuracy of each side's log/sin/cos.
  const double tol = dt == BP_DTYPE_F64 ? 1e-12 : dt == BP_DTYPE_F32 ? 1e-5 : 1e-2;
  std::vector<double> ref, got, magnitude;
  for (int64_t i = 0; i < 4096; ++i) {
    double m = 0;
    ref.push_back(host_normal(dt, seed, 3 + static_cast<uint64_t>(i), 1.0, 2.0, &m));
    magnitude.push_back(m);
    got.push_back(v[static_cast<size_t>(i)]);
  }
  EXPECT_TRUE(close(dt, got, ref, tol, magnitude));
}

INSTANTIATE_TEST_SUITE_P(CudaPlugin, Random, ::testing::ValuesIn(kFloat),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(bp_dtype_name(i.param));
                         });

// ---- Copies ----------------------------------------------------------------------------------

std::vector<unsigned char> random_bytes(size_t n) {
  std::vector<unsigned char> b(n);
  uint64_t x = rng()();
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    b[i] = static_cast<unsigned char>(x >> 56);
  }
  return b;
}

TEST(CudaPlugin, HostDeviceCopiesWithGuards) {
  BP_REQUIRE_GPU();
  constexpr size_t kGuard = 64;
  for (size_t size : {size_t{1}, size_t{3}, size_t{4097}, size_t{1} << 20, (size_t{1} << 20) + 13,
                      (size_t{20} << 20) + 7}) {
    for (int pinned = 0; pinned < 2; ++pinned) {
      SCOPED_TRACE("size " + std::to_string(size) + (pinned ? " pinned" : " pageable"));
      DevBuf dev(size + 2 * kGuard);
      check(api()->memset(stream(), dev.get(), 0, 0xAB, dev.size()), "memset");
      const std::vector<unsigned char> data = random_bytes(size);
      // Host source and destination at odd offsets, with guard bytes around the destination.
      unsigned char* host = nullptr;
      std::vector<unsigned char> pageable;
      const size_t host_bytes = size + 2 * kGuard + 3;
      if (pinned) {
        void* p = nullptr;
        check(api()->host_alloc(0, host_bytes, &p), "host_alloc");
        host = static_cast<unsigned char*>(p);
      } else {
        pageable.resize(host_bytes);
        host = pageable.data();
      }
      unsigned char* src = host + 3;
      std::memcpy(src, data.data(), size);
      check(api()->copy_h2d(stream(), dev.get(), kGuard - 3, src, size), "copy_h2d");
      if (!pinned) {
        // Pageable source: this plugin has copied it (into pinned chunks or the driver's
        // staging buffers) by the time copy_h2d returns, so it may be overwritten at once.
        std::memset(src, 0, size);
      } else {
        sync();
      }
      std::memset(host, 0xCD, host_bytes);
      unsigned char* dst = host + kGuard + 3;
      check(api()->copy_d2h(stream(), dst, dev.get(), kGuard - 3, size), "copy_d2h");
      if (pinned) sync();  // pageable: the data must be there when copy_d2h returns
      EXPECT_EQ(std::memcmp(dst, data.data(), size), 0);
      for (size_t i = 0; i < kGuard + 3; ++i) ASSERT_EQ(host[i], 0xCD) << "host guard " << i;
      for (size_t i = 0; i < kGuard; ++i) ASSERT_EQ(dst[size + i], 0xCD) << "host guard after";
      // Device guard bytes untouched.
      std::vector<unsigned char> all(dev.size());
      check(api()->copy_d2h(stream(), all.data(), dev.get(), 0, all.size()), "copy_d2h all");
      sync();
      for (size_t i = 0; i < kGuard - 3; ++i) ASSERT_EQ(all[i], 0xAB) << "device guard " << i;
      for (size_t i = kGuard - 3 + size; i < all.size(); ++i)
        ASSERT_EQ(all[i], 0xAB) << "device guard " << i;
      // Device to device at odd offsets.
      DevBuf other(size + 8);
      check(api()->copy_d2d(stream(), other.get(), 5, dev.get(), kGuard - 3, size), "copy_d2d");
      std::vector<unsigned char> back(size);
      check(api()->copy_d2h(stream(), back.data(), other.get(), 5, size), "copy_d2h");
      sync();
      EXPECT_EQ(back, data);
      if (pinned) check(api()->host_free(0, host), "host_free");
    }
  }
}

TEST(CudaPlugin, PeerCopy) {
  BP_REQUIRE_GPU();
  if (plugin().count < 2) GTEST_SKIP() << "needs two devices";
  bp_stream* s1 = nullptr;
  check(api()->stream_create(1, &s1), "stream_create(1)");
  {
    const size_t size = (size_t{3} << 20) + 5;
    const std::vector<unsigned char> data = random_bytes(size);
    DevBuf src(size);
    DevBuf dst(size + 16, 1, s1);
    check(api()->copy_h2d(stream(), src.get(), 0, data.data(), size), "copy_h2d");
    sync();
    check(api()->copy_peer(s1, 1, dst.get(), 16, 0, src.get(), 0, size), "copy_peer");
    std::vector<unsigned char> back(size);
    check(api()->copy_d2h(s1, back.data(), dst.get(), 16, size), "copy_d2h");
    check(api()->stream_synchronize(s1), "sync s1");
    EXPECT_EQ(back, data);
  }
  check(api()->stream_synchronize(s1), "sync s1");
  check(api()->stream_destroy(s1), "stream_destroy");
}

TEST(CudaPlugin, KernelsAlternateBetweenDevices) {
  BP_REQUIRE_GPU();
  if (plugin().count < 2) GTEST_SKIP() << "needs two devices";
  // Devices come in PCI bus order (as nvidia-smi lists them), with distinct UUIDs.
  std::vector<std::string> buses, uuids;
  for (int32_t d = 0; d < plugin().count; ++d) {
    bp_device_properties p{};
    p.struct_size = sizeof p;
    check(api()->device_properties(d, &p), "device_properties");
    buses.push_back(p.pci_bus_id);
    uuids.push_back(p.uuid);
  }
  EXPECT_TRUE(std::is_sorted(buses.begin(), buses.end()));
  EXPECT_EQ(std::set<std::string>(uuids.begin(), uuids.end()).size(), uuids.size());
  // The same thread launches on cuda:0 and cuda:1 in turn (Note [Current-device cache]).
  const int n = 4099;
  std::vector<float> host(n);
  for (int i = 0; i < n; ++i) host[static_cast<size_t>(i)] = static_cast<float>(uniform(-3, 3));
  bp_stream* s[2] = {stream(), nullptr};
  check(api()->stream_create(1, &s[1]), "stream_create(1)");
  {
    std::unique_ptr<DevBuf> in[2], out[2];
    bp_kernel* k[2] = {nullptr, nullptr};
    for (int d = 0; d < 2; ++d) {
      in[d] = std::make_unique<DevBuf>(n * 4, d, s[d]);
      out[d] = std::make_unique<DevBuf>(n * 4, d, s[d]);
      check(api()->copy_h2d(s[d], in[d]->get(), 0, host.data(), n * 4), "copy_h2d");
      check(api()->find_kernel(d, "neg", BP_DTYPE_F32, &k[d]), "find_kernel");
    }
    for (int round = 0; round < 3; ++round) {
      for (int d = 0; d < 2; ++d) {
        bp_tensor_desc ti{}, to{};
        ti.struct_size = to.struct_size = sizeof ti;
        ti.dtype = to.dtype = BP_DTYPE_F32;
        ti.rank = to.rank = 1;
        ti.shape[0] = to.shape[0] = n;
        ti.strides[0] = to.strides[0] = 1;
        // Round 1 runs in place on the input, so later rounds see the sign flipped.
        ti.buffer = in[d]->get();
        to.buffer = round == 1 ? in[d]->get() : out[d]->get();
        check(api()->launch(k[d], s[d], &ti, 1, &to, 1, nullptr, 0), "launch");
      }
    }
    for (int d = 0; d < 2; ++d) {
      std::vector<float> back(n);
      check(api()->copy_d2h(s[d], back.data(), out[d]->get(), 0, n * 4), "copy_d2h");
      check(api()->stream_synchronize(s[d]), "sync");
      // out = neg(neg(x)) = x after the in-place round.
      EXPECT_EQ(back, host) << "cuda:" << d;
    }
  }
  check(api()->stream_synchronize(s[1]), "sync");
  check(api()->stream_destroy(s[1]), "stream_destroy");
}

// ---- Memory ----------------------------------------------------------------------------------

bp_memory_stats stats() {
  bp_memory_stats s{};
  s.struct_size = sizeof s;
  check(api()->memory_stats(0, &s), "memory_stats");
  return s;
}

TEST(CudaPlugin, MemoryStatisticsReturnToBaseline) {
  BP_REQUIRE_GPU();
  sync();
  const bp_memory_stats base = stats();
  const uint64_t sizes[] = {1, 1000, 3u << 20, 5, 700000};
  uint64_t total = 0;
  {
    std::vector<std::unique_ptr<DevBuf>> bufs;
    for (uint64_t s : sizes) {
      bufs.push_back(std::make_unique<DevBuf>(s));
      total += s;
    }
    const bp_memory_stats mid = stats();
    EXPECT_EQ(mid.allocated, base.allocated + total);
    EXPECT_EQ(mid.num_allocs, base.num_allocs + 5);
    EXPECT_GE(mid.peak_allocated, mid.allocated);
    EXPECT_GE(mid.reserved, mid.allocated);
  }
  const bp_memory_stats after = stats();
  EXPECT_EQ(after.allocated, base.allocated);
  EXPECT_EQ(after.num_allocs, base.num_allocs);
  EXPECT_GE(after.peak_allocated, base.allocated + total);
  check(api()->memory_reset_peak(0), "memory_reset_peak");
  EXPECT_EQ(stats().peak_allocated, after.allocated);
  // Zero-byte allocations are valid and free.
  bp_buffer* z = reinterpret_cast<bp_buffer*>(1);
  check(api()->mem_alloc(0, stream(), 0, &z), "mem_alloc 0");
  check(api()->mem_free(0, stream(), z, 0), "mem_free 0");
  check(api()->memory_empty_cache(0), "memory_empty_cache");
  const bp_memory_stats trimmed = stats();
  EXPECT_EQ(trimmed.allocated, base.allocated);
  EXPECT_LE(trimmed.reserved, after.reserved);
  // NULL stream: synchronous allocation and free (Note [NULL streams]).
  bp_buffer* b = nullptr;
  check(api()->mem_alloc(0, nullptr, 4096, &b), "mem_alloc NULL stream");
  check(api()->mem_free(0, nullptr, b, 4096), "mem_free NULL stream");
  EXPECT_EQ(stats().allocated, base.allocated);
}

TEST(CudaPlugin, OutOfMemoryIsAnErrorNotACrash) {
  BP_REQUIRE_GPU();
  bp_buffer* b = nullptr;
  const Err e = error_of(api()->mem_alloc(0, stream(), uint64_t{1} << 50, &b));
  EXPECT_EQ(e.code, BP_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(e.native, "cudaErrorMemoryAllocation");
  EXPECT_NE(e.message.find(std::to_string(uint64_t{1} << 50)), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("cuda:0"), std::string::npos) << e.message;
  // The device still works afterwards.
  Tensor a = dense(BP_DTYPE_F32, {1000}, any_values(BP_DTYPE_F32));
  Tensor out = dense(BP_DTYPE_F32, {1000}, any_values(BP_DTYPE_F32));
  launch("neg", BP_DTYPE_F32, {&a}, {&out});
  std::vector<double> ref;
  for (double v : a.values()) ref.push_back(-v);
  EXPECT_TRUE(close(BP_DTYPE_F32, out.download(), ref, 0.0));
}

// ---- Streams and events ----------------------------------------------------------------------

TEST(CudaPlugin, EventsTimeAndOrderStreams) {
  BP_REQUIRE_GPU();
  bp_event* start = nullptr;
  bp_event* end = nullptr;
  check(api()->event_create(0, &start), "event_create");
  check(api()->event_create(0, &end), "event_create");
  Tensor big = dense(BP_DTYPE_F32, {1}, any_values(BP_DTYPE_F32));
  big.buf = std::make_shared<DevBuf>(uint64_t{256} << 20);
  big.shape = {int64_t{64} << 20};
  big.strides = {1};
  big.storage.assign(size_t{64} << 20, 0.0);
  check(api()->event_record(start, stream()), "event_record");
  launch("fill", BP_DTYPE_F32, {}, {&big}, {attr_f("value", 1.5)});
  check(api()->event_record(end, stream()), "event_record");
  // A second stream waits for the fill, then reads the last element.
  bp_stream* s2 = nullptr;
  check(api()->stream_create(0, &s2), "stream_create");
  check(api()->stream_wait_event(s2, end), "stream_wait_event");
  float last = 0;
  check(api()->copy_d2h(s2, &last, big.buf->get(), (uint64_t{256} << 20) - 4, 4), "copy_d2h");
  check(api()->stream_synchronize(s2), "sync s2");
  EXPECT_EQ(last, 1.5f);
  check(api()->event_synchronize(end), "event_synchronize");
  double ms = 0;
  check(api()->event_elapsed_ms(start, end, &ms), "event_elapsed_ms");
  EXPECT_GT(ms, 0.0);
  check(api()->stream_destroy(s2), "stream_destroy");
  check(api()->event_destroy(start), "event_destroy");
  check(api()->event_destroy(end), "event_destroy");
}

TEST(CudaPlugin, BadLaunchesAreInvalidArguments) {
  BP_REQUIRE_GPU();
  Tensor a = dense(BP_DTYPE_F32, {4, 5}, any_values(BP_DTYPE_F32));
  Tensor b = dense(BP_DTYPE_F32, {4, 6}, any_values(BP_DTYPE_F32));
  Tensor out = dense(BP_DTYPE_F32, {4, 5}, any_values(BP_DTYPE_F32));
  Err e = error_of(try_launch("add", BP_DTYPE_F32, {&a, &b}, {&out}));
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(e.message.find("add"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("[4, 6]"), std::string::npos) << e.message;
  e = error_of(try_launch("add", BP_DTYPE_F32, {&a}, {&out}));  // no "scalar"
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
  Tensor i32 = dense(BP_DTYPE_I32, {4, 5}, any_values(BP_DTYPE_I32));
  e = error_of(try_launch("add", BP_DTYPE_F32, {&a, &i32}, {&out}));
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
  e = error_of(try_launch("div", BP_DTYPE_I32, {&i32, &i32}, {&i32}));
  EXPECT_EQ(e.code, BP_ERROR_UNSUPPORTED);
  sync();
}

// ---- Timings (printed, not asserted) ---------------------------------------------------------

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(CudaPlugin, PrintTimings) {
  BP_REQUIRE_GPU();
  // One-element add queued 20,000 times: launch only, then with output allocation and free.
  Tensor a = dense(BP_DTYPE_F32, {1}, any_values(BP_DTYPE_F32));
  Tensor out = dense(BP_DTYPE_F32, {1}, any_values(BP_DTYPE_F32));
  bp_kernel* add = nullptr;
  check(api()->find_kernel(0, "add", BP_DTYPE_F32, &add), "find_kernel");
  const bp_tensor_desc in[2] = {a.desc(), a.desc()};
  bp_tensor_desc o = out.desc();
  const int iters = 20000;
  for (int pass = 0; pass < 2; ++pass) {
    sync();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      bp_buffer* buf = nullptr;
      if (pass == 1) {
        check(api()->mem_alloc(0, stream(), 4, &buf), "mem_alloc");
        o.buffer = buf;
        o.offset = 0;
      }
      check(api()->launch(add, stream(), in, 2, &o, 1, nullptr, 0), "launch");
      if (pass == 1) check(api()->mem_free(0, stream(), buf, 4), "mem_free");
    }
    sync();
    std::printf("1-element add x%d (%s): %.2f us/op\n", iters,
                pass ? "with alloc+free" : "launch only", seconds_since(t0) / iters * 1e6);
  }
  // The plugin's own cost per launch: the same loop on empty tensors queues no kernel.
  {
    bp_tensor_desc e = a.desc();
    e.buffer = nullptr;
    e.shape[0] = 0;
    const bp_tensor_desc ein[2] = {e, e};
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i)
      check(api()->launch(add, stream(), ein, 2, &e, 1, nullptr, 0), "launch");
    std::printf("empty add x%d (plugin overhead, no kernel): %.3f us/op\n", iters,
                seconds_since(t0) / iters * 1e6);
    const auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      bp_buffer* buf = nullptr;
      check(api()->mem_alloc(0, stream(), 4, &buf), "mem_alloc");
      check(api()->mem_free(0, stream(), buf, 4), "mem_free");
    }
    std::printf("4-byte mem_alloc + mem_free x%d: %.3f us/op\n", iters,
                seconds_since(t1) / iters * 1e6);
  }
  // Bandwidth of add and sum at 2^26 f32, timed with events.
  const int64_t n = int64_t{1} << 26;
  auto big = [&](int dt) {
    Tensor t;
    t.dtype = dt;
    t.shape = {n};
    t.strides = {1};
    t.buf = std::make_shared<DevBuf>(static_cast<uint64_t>(n) * dsize(dt));
    return t;
  };
  Tensor x = big(BP_DTYPE_F32), y = big(BP_DTYPE_F32), z = big(BP_DTYPE_F32);
  launch("uniform", BP_DTYPE_F32, {}, {&x}, {attr_i("seed", 1)});
  launch("uniform", BP_DTYPE_F32, {}, {&y}, {attr_i("seed", 2)});
  Tensor s = dense(BP_DTYPE_F32, {1}, any_values(BP_DTYPE_F32));
  bp_event* e0 = nullptr;
  bp_event* e1 = nullptr;
  check(api()->event_create(0, &e0), "event_create");
  check(api()->event_create(0, &e1), "event_create");
  auto time_ms = [&](const std::function<void()>& f, int reps) {
    f();
    check(api()->event_record(e0, stream()), "record");
    for (int i = 0; i < reps; ++i) f();
    check(api()->event_record(e1, stream()), "record");
    check(api()->event_synchronize(e1), "sync");
    double ms = 0;
    check(api()->event_elapsed_ms(e0, e1, &ms), "elapsed");
    return ms / reps;
  };
  const double bytes = static_cast<double>(n) * 4;
  double ms = time_ms([&] { launch("add", BP_DTYPE_F32, {&x, &y}, {&z}); }, 20);
  std::printf("add f32 2^26: %.0f GB/s (read+write)\n", 3 * bytes / ms / 1e6);
  ms = time_ms([&] { launch("exp", BP_DTYPE_F32, {&x}, {&z}); }, 20);
  std::printf("exp f32 2^26: %.0f GB/s (read+write)\n", 2 * bytes / ms / 1e6);
  ms = time_ms([&] { launch("sum", BP_DTYPE_F32, {&x}, {&s}); }, 20);
  std::printf("sum f32 2^26: %.0f GB/s (read)\n", bytes / ms / 1e6);
  Tensor rows = x;
  rows.shape = {8192, 8192};
  rows.strides = {8192, 1};
  Tensor row_out = dense(BP_DTYPE_F32, {8192, 1}, any_values(BP_DTYPE_F32));
  ms = time_ms([&] { launch("sum", BP_DTYPE_F32, {&rows}, {&row_out}); }, 10);
  std::printf("sum f32 [8192, 8192] over dim 1: %.0f GB/s (read)\n", bytes / ms / 1e6);
  Tensor col_out = dense(BP_DTYPE_F32, {1, 8192}, any_values(BP_DTYPE_F32));
  ms = time_ms([&] { launch("sum", BP_DTYPE_F32, {&rows}, {&col_out}); }, 10);
  std::printf("sum f32 [8192, 8192] over dim 0: %.0f GB/s (read)\n", bytes / ms / 1e6);
  ms = time_ms([&] { launch("uniform", BP_DTYPE_F32, {}, {&z}, {attr_i("seed", 3)}); }, 10);
  std::printf("uniform f32 2^26: %.0f GB/s (write)\n", bytes / ms / 1e6);
  ms = time_ms([&] { launch("normal", BP_DTYPE_F32, {}, {&z}, {attr_i("seed", 3)}); }, 10);
  std::printf("normal f32 2^26: %.0f GB/s (write)\n", bytes / ms / 1e6);
  Tensor tr = x;
  tr.shape = {8192, 8192};
  tr.strides = {1, 8192};
  Tensor zt = z;
  zt.shape = {8192, 8192};
  zt.strides = {8192, 1};
  ms = time_ms([&] { launch("copy", BP_DTYPE_F32, {&tr}, {&zt}); }, 10);
  std::printf("transpose-copy f32 8192^2: %.0f GB/s (read+write)\n", 2 * bytes / ms / 1e6);
  // Matmul.
  for (int tf32 = 0; tf32 < 2; ++tf32) {
    Tensor ma = x, mb = y, mc = z;
    ma.shape = mb.shape = mc.shape = {1, 4096, 4096};
    ma.strides = mb.strides = mc.strides = {0, 4096, 1};
    ms = time_ms(
        [&] {
          launch("matmul", BP_DTYPE_F32, {&ma, &mb}, {&mc}, {attr_i("allow_tf32", tf32)});
        },
        5);
    std::printf("matmul f32 4096^3 (tf32 %d): %.1f TFLOP/s\n", tf32,
                2.0 * 4096 * 4096 * 4096 / ms / 1e9);
  }
  check(api()->event_destroy(e0), "event_destroy");
  check(api()->event_destroy(e1), "event_destroy");
  // Host <-> device, 256 MiB.
  const size_t hb = size_t{256} << 20;
  DevBuf dev(hb);
  std::vector<unsigned char> pageable(hb, 1);
  void* pinned = nullptr;
  check(api()->host_alloc(0, hb, &pinned), "host_alloc");
  std::memset(pinned, 1, hb);
  for (int pin = 0; pin < 2; ++pin) {
    void* h = pin ? pinned : pageable.data();
    for (int dir = 0; dir < 2; ++dir) {
      // One untimed copy first: the first staged copy of a process allocates the pinned
      // chunks and starts the host workers.
      if (dir == 0)
        check(api()->copy_h2d(stream(), dev.get(), 0, h, hb), "h2d");
      else
        check(api()->copy_d2h(stream(), h, dev.get(), 0, hb), "d2h");
      sync();
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < 3; ++r) {
        if (dir == 0)
          check(api()->copy_h2d(stream(), dev.get(), 0, h, hb), "h2d");
        else
          check(api()->copy_d2h(stream(), h, dev.get(), 0, hb), "d2h");
      }
      sync();
      std::printf("%s 256 MiB %s: %.1f GB/s\n", dir ? "device->host" : "host->device",
                  pin ? "pinned" : "pageable",
                  3.0 * static_cast<double>(hb) / seconds_since(t0) / 1e9);
    }
  }
  check(api()->host_free(0, pinned), "host_free");
}

}  // namespace
}  // namespace bp_cuda_test
