// Tests of libbackplane-cpu.so through its C table: the plugin is dlopen'ed from the build tree
// (found relative to this binary) and every catalogue op x supported dtype is checked against a
// float64 host reference on fresh random data (seed printed; BP_TEST_SEED reproduces a run), with
// broadcasts, transposed and strided views, the scalar form, in-place launches and empty
// tensors; plus memory, copies, events and errors. Test names carry op and dtype.
#include "cpu_test_support.hpp"

#include <backplane/philox.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <utility>

namespace bpt {
namespace {

constexpr double kPi = 3.14159265358979323846;

// ---- The support matrix the backend must declare ----------------------------------------------

const std::vector<bp_dtype> kFloats = {BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_F16, BP_DTYPE_BF16};
const std::vector<bp_dtype> kSigned = {BP_DTYPE_F32,  BP_DTYPE_F64, BP_DTYPE_F16,
                                       BP_DTYPE_BF16, BP_DTYPE_I32, BP_DTYPE_I64};
const std::vector<bp_dtype> kArith = {BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_F16, BP_DTYPE_BF16,
                                      BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_U8};

const std::map<std::string, std::vector<bp_dtype>>& support_matrix() {
  static const std::map<std::string, std::vector<bp_dtype>> m = {
      {"fill", all_dtypes()},  {"copy", all_dtypes()}, {"cast", all_dtypes()}, {"add", kArith},
      {"sub", kArith},         {"mul", kArith},        {"div", kFloats},       {"pow", kFloats},
      {"maximum", kArith},     {"minimum", kArith},    {"eq", all_dtypes()},   {"ne", all_dtypes()},
      {"lt", all_dtypes()},    {"le", all_dtypes()},   {"gt", all_dtypes()},   {"ge", all_dtypes()},
      {"where", all_dtypes()}, {"neg", kSigned},       {"exp", kFloats},       {"log", kFloats},
      {"sqrt", kFloats},       {"relu", kSigned},      {"sigmoid", kFloats},   {"tanh", kFloats},
      {"abs", kSigned},        {"sum", kSigned},       {"mean", kFloats},      {"max", kSigned},
      {"matmul", kFloats},     {"uniform", kFloats},   {"normal", kFloats},    {"sumsq", kFloats},
      {"norm", kFloats},       {"linear", kFloats}};
  return m;
}

struct OpCase {
  std::string op;
  bp_dtype dtype;
};
void PrintTo(const OpCase& c, std::ostream* os) {
  *os << c.op << "(" << bp_dtype_name(c.dtype) << ")";
}

std::vector<OpCase> cases(const std::vector<std::string>& ops) {
  std::vector<OpCase> v;
  for (const std::string& op : ops)
    for (bp_dtype d : support_matrix().at(op)) v.push_back({op, d});
  return v;
}

std::string case_name(const ::testing::TestParamInfo<OpCase>& info) {
  return info.param.op + "_" + bp_dtype_name(info.param.dtype);
}

class PluginTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NE(plugin().api, nullptr) << plugin().error; }
};

class OpTest : public ::testing::TestWithParam<OpCase> {
 protected:
  void SetUp() override { ASSERT_NE(plugin().api, nullptr) << plugin().error; }
  const std::string& op() const { return GetParam().op; }
  bp_dtype dtype() const { return GetParam().dtype; }
};

std::vector<bp_tensor_desc> descs(const std::vector<DeviceTensor>& ts) {
  std::vector<bp_tensor_desc> v;
  for (const DeviceTensor& t : ts) v.push_back(t.desc);
  return v;
}

// Launches `op` on the inputs into a fresh output of `shape` and compares with ref(values of
// the inputs at each output index).
void check_op(const std::string& op, bp_dtype kernel_dtype, bp_dtype out_dtype,
              const std::vector<HostTensor>& inputs, const std::vector<int64_t>& shape,
              const std::vector<bp_attr>& attrs,
              const std::function<double(const std::vector<double>&)>& ref) {
  std::vector<DeviceTensor> dev;
  for (const HostTensor& h : inputs) dev.push_back(upload(h));
  DeviceTensor out = make_output(out_dtype, shape);
  ASSERT_TRUE(ok(launch(op.c_str(), kernel_dtype, descs(dev), {out.desc}, attrs)));
  std::vector<double> expect;
  std::vector<double> args(inputs.size());
  for_each_index(shape, [&](const std::vector<int64_t>& idx) {
    for (size_t k = 0; k < inputs.size(); ++k) args[k] = inputs[k].at(idx);
    expect.push_back(ref(args));
  });
  EXPECT_TRUE(close(out_dtype, out.values(), expect));
  EXPECT_TRUE(out.guards_intact()) << "kernel wrote outside its output";
}

// ---- Plugin identity, device, support table ----------------------------------------------------

TEST_F(PluginTest, Identity) {
  EXPECT_EQ(api().abi_major, static_cast<uint32_t>(BP_ABI_MAJOR));
  EXPECT_EQ(api().abi_minor, static_cast<uint32_t>(BP_ABI_MINOR));
  EXPECT_EQ(api().struct_size, sizeof(bp_plugin_api));
  EXPECT_STREQ(api().name, "cpu");
  EXPECT_STREQ(api().device_type, "cpu");
  const char* reason = nullptr;
  EXPECT_EQ(api().device_count(&reason), 1);
  ASSERT_NE(reason, nullptr);
  EXPECT_STREQ(reason, "");
  // Every optional slot the CPU backend implements.
  EXPECT_NE(api().event_create, nullptr);
  EXPECT_NE(api().event_elapsed_ms, nullptr);
  EXPECT_NE(api().mem_host_pointer, nullptr);
  EXPECT_NE(api().list_ops, nullptr);
}

TEST_F(PluginTest, DeviceProperties) {
  bp_device_properties p{};
  p.struct_size = sizeof(p);
  ASSERT_TRUE(ok(api().device_properties(0, &p)));
  EXPECT_GT(std::strlen(p.name), 0u);
  EXPECT_NE(std::string(p.name).find("threads)"), std::string::npos) << p.name;
  EXPECT_GT(std::strlen(p.vendor), 0u);
  EXPECT_GE(p.cores, 1);
  EXPECT_GT(p.total_memory, 0u);
  EXPECT_GT(p.free_memory, 0u);
  EXPECT_LE(p.free_memory, p.total_memory);
  EXPECT_EQ(p.supports_f64, 1);
  EXPECT_EQ(p.unified_memory, 1);
  // A reader with an older, shorter struct gets only the fields it knows.
  struct {
    bp_device_properties p;
    char canary[8];
  } small{};
  small.p.struct_size = offsetof(bp_device_properties, total_memory);
  std::memset(small.canary, 0x5A, sizeof small.canary);
  small.p.total_memory = 7;
  ASSERT_TRUE(ok(api().device_properties(0, &small.p)));
  EXPECT_EQ(small.p.total_memory, 7u);
  EXPECT_GT(std::strlen(small.p.name), 0u);
  // Device 1 does not exist.
  bp_device_properties q{};
  q.struct_size = sizeof(q);
  const ErrorInfo e = take(api().device_properties(1, &q));
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(e.message.find("cpu:0"), std::string::npos) << e.message;
  EXPECT_EQ(e.plugin, "cpu");
}

TEST_F(PluginTest, SupportTableMatchesTheCatalogue) {
  const bp_op_support* list = nullptr;
  int32_t count = 0;
  ASSERT_TRUE(ok(api().list_ops(0, &list, &count)));
  ASSERT_EQ(count, static_cast<int32_t>(support_matrix().size() * BP_DTYPE_COUNT));
  std::set<std::pair<std::string, int>> seen;
  int yes = 0;
  for (int32_t i = 0; i < count; ++i) {
    const bp_op_support& s = list[i];
    EXPECT_EQ(s.struct_size, sizeof(bp_op_support));
    ASSERT_TRUE(support_matrix().count(s.op)) << "unknown op " << s.op;
    EXPECT_TRUE(seen.insert({s.op, s.dtype}).second) << "duplicate " << s.op;
    const auto& want = support_matrix().at(s.op);
    const bool expected = std::find(want.begin(), want.end(), s.dtype) != want.end();
    EXPECT_EQ(s.support, expected ? BP_SUPPORT_YES : BP_SUPPORT_NO)
        << s.op << " " << bp_dtype_name(s.dtype);
    bp_kernel* k = nullptr;
    const ErrorInfo e = take(api().find_kernel(0, s.op, s.dtype, &k));
    if (s.support == BP_SUPPORT_YES) {
      yes++;
      EXPECT_EQ(e.code, 0) << s.op << " " << bp_dtype_name(s.dtype) << ": " << e.message;
      EXPECT_NE(k, nullptr);
      EXPECT_STREQ(s.reason, "");
    } else {
      EXPECT_EQ(e.code, BP_ERROR_UNSUPPORTED) << s.op << " " << bp_dtype_name(s.dtype);
      EXPECT_GT(std::strlen(s.reason), 0u) << s.op << " " << bp_dtype_name(s.dtype);
      EXPECT_NE(e.message.find(s.reason), std::string::npos) << e.message;
    }
  }
  int want_yes = 0;
  for (const auto& [op, dts] : support_matrix()) want_yes += static_cast<int>(dts.size());
  EXPECT_EQ(yes, want_yes);
}

// A bad BACKPLANE_CPU_MATMUL_THREADS or BACKPLANE_CPU_SERIAL_THRESHOLD makes init fail with a
// message naming the variable and the values it takes (checked in a fresh process of this
// binary, since init runs once per process).
TEST_F(PluginTest, BadEnvironmentValuesFailInitWithTheVariableNamed) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  for (const auto& [env, expect] : std::vector<std::pair<std::string, std::string>>{
           {"BACKPLANE_CPU_MATMUL_THREADS=many",
            "BACKPLANE_CPU_MATMUL_THREADS='many' is not 'tbb' (the default) or 'openmp'"},
           {"BACKPLANE_CPU_SERIAL_THRESHOLD=-3",
            "BACKPLANE_CPU_SERIAL_THRESHOLD='-3' is not a positive integer"}}) {
    const std::string cmd =
        "env " + env + " '" + self + "' --gtest_filter=PluginTest.Identity --gtest_brief=1 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string output;
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) output += buf;
    const int status = ::pclose(p);
    EXPECT_NE(status, 0) << env << ": " << output;
    EXPECT_NE(output.find(expect), std::string::npos) << env << ": " << output;
  }
}

TEST_F(PluginTest, KernelHandlesAreStable) {
  bp_kernel *a = nullptr, *b = nullptr;
  ASSERT_TRUE(ok(api().find_kernel(0, "add", BP_DTYPE_F32, &a)));
  ASSERT_TRUE(ok(api().find_kernel(0, "add", BP_DTYPE_F32, &b)));
  EXPECT_EQ(a, b);
}

// ---- Errors ----------------------------------------------------------------------------------

TEST_F(PluginTest, UnknownOpAndBadDtype) {
  bp_kernel* k = nullptr;
  ErrorInfo e = take(api().find_kernel(0, "frobnicate", BP_DTYPE_F32, &k));
  EXPECT_EQ(e.code, BP_ERROR_UNSUPPORTED);
  EXPECT_NE(e.message.find("frobnicate"), std::string::npos) << e.message;
  e = take(api().find_kernel(0, "add", 42, &k));
  EXPECT_EQ(e.code, BP_ERROR_UNSUPPORTED);  // a dtype of a newer host, as for find_kernel_id
  e = take(api().find_kernel(0, "div", BP_DTYPE_I32, &k));
  EXPECT_EQ(e.code, BP_ERROR_UNSUPPORTED);
  EXPECT_NE(e.message.find("div"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("i32"), std::string::npos) << e.message;
}

TEST_F(PluginTest, LaunchErrorsNameOpDtypeAndShapes) {
  DeviceTensor a = upload(make_host(BP_DTYPE_F32, {3, 4}, Kind::kDense));
  DeviceTensor b = upload(make_host(BP_DTYPE_F32, {3, 5}, Kind::kDense));
  DeviceTensor out = make_output(BP_DTYPE_F32, {3, 4});
  ErrorInfo e = take(launch("add", BP_DTYPE_F32, {a.desc, b.desc}, {out.desc}));
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(e.message.find("add(f32)"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("[3,5]"), std::string::npos) << e.message;
  e = take(launch("add", BP_DTYPE_F32, {a.desc}, {out.desc}));  // neither b nor "scalar"
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(e.message.find("scalar"), std::string::npos) << e.message;
  e = take(launch("exp", BP_DTYPE_F32, {a.desc, a.desc}, {out.desc}));
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
  bp_tensor_desc wrong = a.desc;
  wrong.dtype = BP_DTYPE_F64;
  e = take(launch("neg", BP_DTYPE_F32, {wrong}, {out.desc}));
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(e.message.find("f64"), std::string::npos) << e.message;
  bp_tensor_desc null_buffer = a.desc;
  null_buffer.buffer = nullptr;
  e = take(launch("neg", BP_DTYPE_F32, {null_buffer}, {out.desc}));
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
  bp_tensor_desc bad_rank = a.desc;
  bad_rank.rank = BP_MAX_RANK + 1;
  e = take(launch("neg", BP_DTYPE_F32, {bad_rank}, {out.desc}));
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(out.guards_intact());
}

// ---- Memory ----------------------------------------------------------------------------------

bp_memory_stats stats() {
  bp_memory_stats s{};
  s.struct_size = sizeof(s);
  EXPECT_TRUE(ok(api().memory_stats(0, &s)));
  return s;
}

TEST_F(PluginTest, AllocationsAreAlignedCountedAndReturnToBaseline) {
  const bp_memory_stats base = stats();
  const std::vector<uint64_t> sizes = {1, 100, 4096, 1 << 20, 12345};
  std::vector<bp_buffer*> bufs;
  uint64_t total = 0;
  for (uint64_t s : sizes) {
    bp_buffer* b = nullptr;
    ASSERT_TRUE(ok(api().mem_alloc(0, stream(), s, &b)));
    ASSERT_NE(b, nullptr);
    void* host = api().mem_host_pointer(b);
    EXPECT_EQ(host, static_cast<void*>(b));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(host) % 64, 0u) << "size " << s;
    std::memset(host, 0x11, s);  // the host may use the memory directly
    bufs.push_back(b);
    total += s;
  }
  bp_memory_stats now = stats();
  EXPECT_EQ(now.allocated, base.allocated + total);
  EXPECT_EQ(now.reserved, now.allocated);
  EXPECT_EQ(now.num_allocs, base.num_allocs + sizes.size());
  EXPECT_GE(now.peak_allocated, now.allocated);
  for (size_t i = 0; i < bufs.size(); ++i)
    ASSERT_TRUE(ok(api().mem_free(0, stream(), bufs[i], sizes[i])));
  now = stats();
  EXPECT_EQ(now.allocated, base.allocated);
  EXPECT_EQ(now.num_allocs, base.num_allocs);
  EXPECT_GE(now.peak_allocated, base.allocated + total);
  ASSERT_TRUE(ok(api().memory_reset_peak(0)));
  EXPECT_EQ(stats().peak_allocated, base.allocated);
  ASSERT_NE(api().memory_empty_cache, nullptr);
  EXPECT_TRUE(ok(api().memory_empty_cache(0)));
}

TEST_F(PluginTest, ZeroByteAllocationAndNullFree) {
  const bp_memory_stats base = stats();
  bp_buffer *a = nullptr, *b = nullptr;
  ASSERT_TRUE(ok(api().mem_alloc(0, stream(), 0, &a)));
  ASSERT_TRUE(ok(api().mem_alloc(0, stream(), 0, &b)));
  if (a && b) {
    EXPECT_NE(a, b) << "non-NULL zero-byte handles must be unique";
  }
  EXPECT_EQ(stats().allocated, base.allocated);
  EXPECT_TRUE(ok(api().mem_free(0, stream(), a, 0)));
  EXPECT_TRUE(ok(api().mem_free(0, stream(), b, 0)));
  EXPECT_TRUE(ok(api().mem_free(0, stream(), nullptr, 0)));
  EXPECT_EQ(stats().allocated, base.allocated);
  EXPECT_EQ(stats().num_allocs, base.num_allocs);
}

TEST_F(PluginTest, HugeAllocationIsOutOfMemory) {
  const bp_memory_stats base = stats();
  for (uint64_t size : {uint64_t{1} << 62, ~uint64_t{0}, uint64_t{1} << 50}) {
    bp_buffer* b = nullptr;
    const ErrorInfo e = take(api().mem_alloc(0, stream(), size, &b));
    EXPECT_EQ(e.code, BP_ERROR_OUT_OF_MEMORY) << size;
    EXPECT_NE(e.message.find(std::to_string(size)), std::string::npos) << e.message;
    EXPECT_NE(e.message.find("free"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find("cpu:0"), std::string::npos) << e.message;
  }
  EXPECT_EQ(stats().allocated, base.allocated);
  EXPECT_EQ(stats().num_allocs, base.num_allocs);
}

TEST_F(PluginTest, CopiesAndMemset) {
  for (uint64_t n : {uint64_t{1000}, uint64_t{9} << 20}) {  // serial and parallel paths
    std::vector<uint8_t> src(n), back(n + 20, 0);
    for (auto& v : src) v = static_cast<uint8_t>(uniform_int(0, 255));
    bp_buffer *a = nullptr, *b = nullptr;
    ASSERT_TRUE(ok(api().mem_alloc(0, stream(), n + 16, &a)));
    ASSERT_TRUE(ok(api().mem_alloc(0, stream(), n + 16, &b)));
    ASSERT_TRUE(ok(api().memset(stream(), a, 0, 0x7E, n + 16)));
    ASSERT_TRUE(ok(api().copy_h2d(stream(), a, 8, src.data(), n)));
    ASSERT_TRUE(ok(api().copy_d2d(stream(), b, 3, a, 8, n)));
    ASSERT_TRUE(ok(api().stream_synchronize(stream())));
    ASSERT_TRUE(ok(api().copy_d2h(stream(), back.data() + 10, b, 3, n)));
    EXPECT_EQ(0, std::memcmp(back.data() + 10, src.data(), n));
    EXPECT_EQ(back[9], 0);
    EXPECT_EQ(back[n + 10], 0);
    ASSERT_TRUE(ok(api().copy_d2h(stream(), back.data(), a, 0, 8)));
    for (int i = 0; i < 8; ++i) EXPECT_EQ(back[i], 0x7E);
    ASSERT_TRUE(ok(api().memset(stream(), b, 5, 0x33, n / 2)));
    ASSERT_TRUE(ok(api().copy_d2h(stream(), back.data(), b, 0, n + 16)));
    EXPECT_EQ(back[4], src[1]);
    for (uint64_t i = 5; i < 5 + n / 2; ++i) ASSERT_EQ(back[i], 0x33) << i;
    EXPECT_EQ(back[5 + n / 2], src[2 + n / 2]);
    EXPECT_TRUE(ok(api().mem_free(0, stream(), a, n + 16)));
    EXPECT_TRUE(ok(api().mem_free(0, stream(), b, n + 16)));
  }
  EXPECT_TRUE(ok(api().copy_h2d(stream(), nullptr, 0, nullptr, 0)));  // empty copies succeed
}

TEST_F(PluginTest, StreamsAndEvents) {
  bp_stream* s = nullptr;
  ASSERT_TRUE(ok(api().stream_create(0, &s)));
  bp_event *start = nullptr, *end = nullptr;
  ASSERT_TRUE(ok(api().event_create(0, &start)));
  ASSERT_TRUE(ok(api().event_create(0, &end)));
  double ms = -1;
  const ErrorInfo never = take(api().event_elapsed_ms(start, end, &ms));
  EXPECT_EQ(never.code, BP_ERROR_INVALID_ARGUMENT);
  ASSERT_TRUE(ok(api().event_record(start, s)));
  DeviceTensor out = make_output(BP_DTYPE_F32, {1 << 20});
  ASSERT_TRUE(ok(launch("fill", BP_DTYPE_F32, {}, {out.desc}, {attr_f("value", 1.0)})));
  ASSERT_TRUE(ok(api().event_record(end, s)));
  ASSERT_TRUE(ok(api().stream_wait_event(stream(), end)));
  ASSERT_TRUE(ok(api().event_synchronize(end)));
  ASSERT_TRUE(ok(api().event_elapsed_ms(start, end, &ms)));
  EXPECT_GE(ms, 0.0);
  EXPECT_LT(ms, 60000.0);
  EXPECT_TRUE(ok(api().event_destroy(start)));
  EXPECT_TRUE(ok(api().event_destroy(end)));
  EXPECT_TRUE(ok(api().stream_synchronize(s)));
  EXPECT_TRUE(ok(api().stream_destroy(s)));
  bp_stream* bad = nullptr;
  EXPECT_EQ(take(api().stream_create(3, &bad)).code, BP_ERROR_INVALID_ARGUMENT);
}

// ---- fill, copy, cast --------------------------------------------------------------------------

class FillTest : public OpTest {};
TEST_P(FillTest, FloatAndIntValuesDenseAndStrided) {
  const double v = dtype() == BP_DTYPE_U8 ? 200.75 : -2.75;
  for (bool transposed : {false, true}) {
    DeviceTensor out = make_output(dtype(), {7, 13}, transposed);
    ASSERT_TRUE(ok(launch("fill", dtype(), {}, {out.desc}, {attr_f("value", v)})));
    EXPECT_TRUE(close(dtype(), out.values(), std::vector<double>(91, round_to(dtype(), v))));
    EXPECT_TRUE(out.guards_intact());
  }
  DeviceTensor out = make_output(dtype(), {5, 3});
  ASSERT_TRUE(ok(launch("fill", dtype(), {}, {out.desc}, {attr_i("value", 3)})));
  EXPECT_TRUE(close(dtype(), out.values(), std::vector<double>(15, round_to(dtype(), 3))));
  DeviceTensor big = make_output(dtype(), {100003});
  ASSERT_TRUE(ok(launch("fill", dtype(), {}, {big.desc}, {attr_f("value", 1.0)})));
  EXPECT_TRUE(close(dtype(), big.values(), std::vector<double>(100003, 1.0)));
  bp_tensor_desc empty = make_output(dtype(), {0, 4}).desc;
  EXPECT_TRUE(ok(launch("fill", dtype(), {}, {empty}, {attr_f("value", 1.0)})));
  EXPECT_EQ(take(launch("fill", dtype(), {}, {out.desc})).code, BP_ERROR_INVALID_ARGUMENT);
}
INSTANTIATE_TEST_SUITE_P(Ops, FillTest, ::testing::ValuesIn(cases({"fill"})), case_name);

TEST_F(PluginTest, FillInt64IsExact) {
  const int64_t v = (int64_t{1} << 53) + 1;  // not representable in double
  DeviceTensor out = make_output(BP_DTYPE_I64, {3});
  ASSERT_TRUE(ok(launch("fill", BP_DTYPE_I64, {}, {out.desc}, {attr_i("value", v)})));
  const std::vector<uint8_t> raw = out.raw();
  for (int i = 0; i < 3; ++i) {
    int64_t got;
    std::memcpy(&got, raw.data() + kGuard + 8 * i, 8);
    EXPECT_EQ(got, v);
  }
}

class CopyTest : public OpTest {};
TEST_P(CopyTest, AnyStridesToDense) {
  for (Kind k : {Kind::kDense, Kind::kTransposed, Kind::kStrided, Kind::kBroadcastFirst,
                 Kind::kBroadcastLast}) {
    SCOPED_TRACE(kind_name(k));
    for (std::vector<int64_t> shape :
         {std::vector<int64_t>{4, 6, 5}, {9, 7}, {}, {1, 7, 1}, {300, 171}}) {
      const HostTensor h = make_host(dtype(), shape, k);
      check_op("copy", dtype(), dtype(), {h}, shape, {},
               [](const std::vector<double>& a) { return a[0]; });
    }
  }
}
TEST_P(CopyTest, IntoStridedOutputAndEmpty) {
  const HostTensor h = make_host(dtype(), {6, 10}, Kind::kDense);
  DeviceTensor in = upload(h);
  DeviceTensor out = make_output(dtype(), {6, 10}, /*transposed=*/true);
  ASSERT_TRUE(ok(launch("copy", dtype(), {in.desc}, {out.desc})));
  EXPECT_TRUE(close(dtype(), out.values(), h.values(), 0));
  EXPECT_TRUE(out.guards_intact());
  bp_tensor_desc e = make_output(dtype(), {3, 0}).desc;
  EXPECT_TRUE(ok(launch("copy", dtype(), {e}, {e})));
}
INSTANTIATE_TEST_SUITE_P(Ops, CopyTest, ::testing::ValuesIn(cases({"copy"})), case_name);

// Data for a cast from `src` to `dst` that stays in the range where the cast is defined.
Dist cast_dist(bp_dtype src, bp_dtype dst) {
  if (!is_float(src)) return Dist::kSomeZeros;
  if (dst == BP_DTYPE_U8) return Dist::kUnsigned;
  if (dst == BP_DTYPE_BOOL) return Dist::kSomeZeros;
  return Dist::kCastable;
}

class CastTest : public OpTest {};
TEST_P(CastTest, ToEveryDtype) {
  for (bp_dtype to : all_dtypes()) {
    SCOPED_TRACE(std::string("to ") + bp_dtype_name(to));
    for (Kind k : {Kind::kDense, Kind::kTransposed}) {
      const HostTensor h = make_host(dtype(), {37, 23}, k, cast_dist(dtype(), to));
      check_op("cast", dtype(), to, {h}, {37, 23}, {},
               [to](const std::vector<double>& a) { return round_to(to, a[0]); });
    }
    const HostTensor big = make_host(dtype(), {70001}, Kind::kDense, cast_dist(dtype(), to));
    check_op("cast", dtype(), to, {big}, {70001}, {},
             [to](const std::vector<double>& a) { return round_to(to, a[0]); });
    bp_tensor_desc ein = make_output(dtype(), {0}).desc, eout = make_output(to, {0}).desc;
    EXPECT_TRUE(ok(launch("cast", dtype(), {ein}, {eout})));
  }
}
INSTANTIATE_TEST_SUITE_P(Ops, CastTest, ::testing::ValuesIn(cases({"cast"})), case_name);

// Casts h to `to` and returns the device result.
DeviceTensor cast_device(const DeviceTensor& in, bp_dtype from, bp_dtype to,
                         const std::vector<int64_t>& shape) {
  DeviceTensor out = make_output(to, shape);
  EXPECT_TRUE(ok(launch("cast", from, {in.desc}, {out.desc})));
  return out;
}

TEST_F(PluginTest, CastRoundTripsAreExact) {
  const std::vector<std::pair<bp_dtype, bp_dtype>> trips = {
      {BP_DTYPE_F32, BP_DTYPE_F64},  {BP_DTYPE_F16, BP_DTYPE_F32}, {BP_DTYPE_BF16, BP_DTYPE_F32},
      {BP_DTYPE_F16, BP_DTYPE_F64},  {BP_DTYPE_I32, BP_DTYPE_I64}, {BP_DTYPE_I32, BP_DTYPE_F64},
      {BP_DTYPE_U8, BP_DTYPE_I32},   {BP_DTYPE_U8, BP_DTYPE_F16},  {BP_DTYPE_BOOL, BP_DTYPE_U8},
      {BP_DTYPE_BOOL, BP_DTYPE_F32}, {BP_DTYPE_I64, BP_DTYPE_F64}};
  for (auto [a, b] : trips) {
    SCOPED_TRACE(std::string(bp_dtype_name(a)) + "->" + bp_dtype_name(b));
    const HostTensor h = make_host(a, {41, 3}, Kind::kDense);
    DeviceTensor in = upload(h);
    DeviceTensor mid = cast_device(in, a, b, {41, 3});
    DeviceTensor back = cast_device(mid, b, a, {41, 3});
    EXPECT_TRUE(close(a, back.values(), h.values(), 0));
  }
}

TEST_F(PluginTest, CastRulesOfTheCatalogue) {
  HostTensor h;
  h.dtype = BP_DTYPE_F32;
  h.shape = {7};
  h.strides = {1};
  h.storage = {-2.75, 2.75, -0.5, 0.0, 1e-3, -1.0, 255.5};
  DeviceTensor in7 = upload(h);
  // float -> int truncates toward zero.
  EXPECT_TRUE(close(BP_DTYPE_I32, cast_device(in7, BP_DTYPE_F32, BP_DTYPE_I32, {7}).values(),
                    {-2, 2, 0, 0, 0, -1, 255}));
  EXPECT_TRUE(close(BP_DTYPE_I64, cast_device(in7, BP_DTYPE_F32, BP_DTYPE_I64, {7}).values(),
                    {-2, 2, 0, 0, 0, -1, 255}));
  // x -> bool is x != 0; bool -> x is 0/1.
  DeviceTensor b = cast_device(in7, BP_DTYPE_F32, BP_DTYPE_BOOL, {7});
  EXPECT_TRUE(close(BP_DTYPE_BOOL, b.values(), {1, 1, 1, 0, 1, 1, 1}));
  EXPECT_TRUE(close(BP_DTYPE_F64, cast_device(b, BP_DTYPE_BOOL, BP_DTYPE_F64, {7}).values(),
                    {1, 1, 1, 0, 1, 1, 1}, 0));
  // f16 rounds to nearest even and overflows to infinity.
  HostTensor w;
  w.dtype = BP_DTYPE_F64;
  w.shape = {3};
  w.strides = {1};
  w.storage = {1.0 + 1.0 / 4096, 70000.0, -1e-9};
  DeviceTensor win = upload(w);
  const std::vector<double> f16 = cast_device(win, BP_DTYPE_F64, BP_DTYPE_F16, {3}).values();
  EXPECT_EQ(f16[0], 1.0);
  EXPECT_TRUE(std::isinf(f16[1]));
  EXPECT_EQ(f16[2], 0.0);
}

// ---- Binary arithmetic and comparisons --------------------------------------------------------

double binary_ref(const std::string& op, double a, double b) {
  if (op == "add") return a + b;
  if (op == "sub") return a - b;
  if (op == "mul") return a * b;
  if (op == "div") return a / b;
  if (op == "pow") return std::pow(a, b);
  if (op == "maximum") return std::max(a, b);
  if (op == "minimum") return std::min(a, b);
  if (op == "eq") return a == b;
  if (op == "ne") return a != b;
  if (op == "lt") return a < b;
  if (op == "le") return a <= b;
  if (op == "gt") return a > b;
  if (op == "ge") return a >= b;
  ADD_FAILURE() << "no reference for " << op;
  return 0;
}

bool is_compare(const std::string& op) {
  return op == "eq" || op == "ne" || op == "lt" || op == "le" || op == "gt" || op == "ge";
}

// Input distributions keeping each op in its domain: a is the left operand, b the right.
Dist left_dist(const std::string& op) {
  if (is_compare(op)) return Dist::kSmallInts;
  if (op == "pow") return Dist::kPositive;
  return Dist::kGeneral;
}
Dist right_dist(const std::string& op) {
  if (is_compare(op)) return Dist::kSmallInts;
  if (op == "div") return Dist::kNonZero;
  if (op == "pow") return Dist::kGeneral;
  return Dist::kGeneral;
}

class BinaryTest : public OpTest {
 protected:
  bp_dtype out_dtype() const { return is_compare(op()) ? BP_DTYPE_BOOL : dtype(); }
  // The reference result as stored in the output dtype (integers wrap).
  double ref(double a, double b) const {
    const double r = binary_ref(op(), a, b);
    return is_float(out_dtype()) ? r : round_to(out_dtype(), r);
  }
  void run(const std::vector<int64_t>& shape, Kind ka, Kind kb) {
    SCOPED_TRACE(std::string(kind_name(ka)) + " op " + kind_name(kb));
    const HostTensor a = make_host(dtype(), shape, ka, left_dist(op()));
    const HostTensor b = make_host(dtype(), shape, kb, right_dist(op()));
    check_op(op(), dtype(), out_dtype(), {a, b}, shape, {},
             [this](const std::vector<double>& v) { return ref(v[0], v[1]); });
  }
};

TEST_P(BinaryTest, DenseBroadcastTransposedStrided) {
  run({3, 5, 7}, Kind::kDense, Kind::kDense);
  run({6, 9}, Kind::kDense, Kind::kBroadcastFirst);
  run({6, 9}, Kind::kBroadcastLast, Kind::kTransposed);
  run({5, 8, 3}, Kind::kStrided, Kind::kTransposed);
  run({4, 1, 5}, Kind::kBroadcastFirst, Kind::kDense);
  run({}, Kind::kDense, Kind::kDense);
  run({1000, 201}, Kind::kDense, Kind::kDense);  // above the serial threshold
  run({1000, 201}, Kind::kTransposed, Kind::kBroadcastFirst);
}

TEST_P(BinaryTest, ScalarForm) {
  for (int reverse : {0, 1}) {
    SCOPED_TRACE(reverse ? "scalar op a" : "a op scalar");
    // The scalar stands for the operand on its side; keep it in that operand's domain.
    const double picks[] = {1.0, -1.0, 0.0, 1.5};
    double s = is_compare(op()) ? picks[uniform_int(0, 3)] : uniform(0.6, 2.4);
    if (op() == "pow" && !reverse) s = uniform(-2, 2);
    if (!is_float(dtype()) && !is_compare(op())) s = 3.7;  // converted to the dtype: 3
    const Dist da = reverse ? right_dist(op()) : left_dist(op());
    const double sv = round_to(dtype(), s);  // the scalar is converted to the dtype first
    for (auto shape : {std::vector<int64_t>{9, 11}, std::vector<int64_t>{400, 251}}) {
      const HostTensor a = make_host(dtype(), shape, Kind::kTransposed, da);
      check_op(
          op(), dtype(), out_dtype(), {a}, shape, {attr_f("scalar", s), attr_i("reverse", reverse)},
          [&](const std::vector<double>& v) { return reverse ? ref(sv, v[0]) : ref(v[0], sv); });
    }
  }
}

// Arithmetic only: comparisons write bool, so their output never aliases an input.
class BinaryInPlaceTest : public BinaryTest {};
TEST_P(BinaryInPlaceTest, OutputIsInputZero) {
  for (bool scalar : {false, true}) {
    const HostTensor a = make_host(dtype(), {13, 17}, Kind::kDense, left_dist(op()));
    const HostTensor b = make_host(dtype(), {13, 17}, Kind::kBroadcastFirst, right_dist(op()));
    const double s = round_to(dtype(), op() == "pow" ? 1.5 : 2.0);
    DeviceTensor da = upload(a), db = upload(b);
    std::vector<bp_tensor_desc> ins = {da.desc};
    std::vector<bp_attr> attrs = {attr_i("inplace", 1)};
    if (scalar) {
      attrs.push_back(attr_f("scalar", s));
    } else {
      ins.push_back(db.desc);
    }
    ASSERT_TRUE(ok(launch(op().c_str(), dtype(), ins, {da.desc}, attrs)));
    std::vector<double> expect;
    for_each_index({13, 17}, [&](const std::vector<int64_t>& i) {
      expect.push_back(ref(a.at(i), scalar ? s : b.at(i)));
    });
    EXPECT_TRUE(close(dtype(), da.values(), expect));
    EXPECT_TRUE(da.guards_intact());
  }
}

TEST_P(BinaryTest, EmptyTensors) {
  for (auto shape : {std::vector<int64_t>{0, 5}, std::vector<int64_t>{3, 0, 2}}) {
    DeviceTensor a = upload(make_host(dtype(), shape, Kind::kDense));
    DeviceTensor out = make_output(out_dtype(), shape);
    ASSERT_EQ(a.desc.buffer, nullptr);  // zero-element tensors may have NULL buffers
    EXPECT_TRUE(ok(launch(op().c_str(), dtype(), {a.desc, a.desc}, {out.desc})));
    EXPECT_TRUE(ok(launch(op().c_str(), dtype(), {a.desc}, {out.desc}, {attr_f("scalar", 1)})));
  }
}

INSTANTIATE_TEST_SUITE_P(Arithmetic, BinaryTest,
                         ::testing::ValuesIn(cases({"add", "sub", "mul", "div", "pow", "maximum",
                                                    "minimum"})),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Arithmetic, BinaryInPlaceTest,
                         ::testing::ValuesIn(cases({"add", "sub", "mul", "div", "pow", "maximum",
                                                    "minimum"})),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Compare, BinaryTest,
                         ::testing::ValuesIn(cases({"eq", "ne", "lt", "le", "gt", "ge"})),
                         case_name);

TEST_F(PluginTest, MaximumMinimumPropagateNaN) {
  HostTensor a, b;
  a.dtype = b.dtype = BP_DTYPE_F32;
  a.shape = b.shape = {3};
  a.strides = b.strides = {1};
  a.storage = {std::nan(""), 1.0, 2.0};
  b.storage = {1.0, std::nan(""), 3.0};
  check_op("maximum", BP_DTYPE_F32, BP_DTYPE_F32, {a, b}, {3}, {},
           [](const std::vector<double>& v) {
             return std::isnan(v[0]) || std::isnan(v[1]) ? NAN : std::max(v[0], v[1]);
           });
  check_op("minimum", BP_DTYPE_F32, BP_DTYPE_F32, {a, b}, {3}, {},
           [](const std::vector<double>& v) {
             return std::isnan(v[0]) || std::isnan(v[1]) ? NAN : std::min(v[0], v[1]);
           });
}

TEST_F(PluginTest, IntegerArithmeticWraps) {
  HostTensor a;
  a.dtype = BP_DTYPE_I32;
  a.shape = {2};
  a.strides = {1};
  a.storage = {2147483647.0, -2147483648.0};
  check_op("add", BP_DTYPE_I32, BP_DTYPE_I32, {a}, {2}, {attr_f("scalar", 1)},
           [](const std::vector<double>& v) { return round_to(BP_DTYPE_I32, v[0] + 1); });
  check_op("neg", BP_DTYPE_I32, BP_DTYPE_I32, {a}, {2}, {},
           [](const std::vector<double>& v) { return round_to(BP_DTYPE_I32, -v[0]); });
  a.dtype = BP_DTYPE_U8;
  a.storage = {250, 3};
  check_op("add", BP_DTYPE_U8, BP_DTYPE_U8, {a}, {2}, {attr_f("scalar", 10)},
           [](const std::vector<double>& v) { return round_to(BP_DTYPE_U8, v[0] + 10); });
}

// ---- where ------------------------------------------------------------------------------------

class WhereTest : public OpTest {};
TEST_P(WhereTest, Layouts) {
  const auto ref = [](const std::vector<double>& v) { return v[0] != 0 ? v[1] : v[2]; };
  const std::vector<std::array<Kind, 3>> layouts = {
      {Kind::kDense, Kind::kDense, Kind::kDense},
      {Kind::kBroadcastFirst, Kind::kTransposed, Kind::kStrided},
      {Kind::kTransposed, Kind::kBroadcastLast, Kind::kDense},
      {Kind::kDense, Kind::kDense, Kind::kBroadcastFirst}};
  for (const auto& k : layouts) {
    for (auto shape : {std::vector<int64_t>{7, 9}, std::vector<int64_t>{300, 150}}) {
      const HostTensor c = make_host(BP_DTYPE_BOOL, shape, k[0]);
      const HostTensor a = make_host(dtype(), shape, k[1]);
      const HostTensor b = make_host(dtype(), shape, k[2]);
      check_op("where", dtype(), dtype(), {c, a, b}, shape, {}, ref);
    }
  }
  bp_tensor_desc ec = make_output(BP_DTYPE_BOOL, {0, 3}).desc,
                 e = make_output(dtype(), {0, 3}).desc;
  EXPECT_TRUE(ok(launch("where", dtype(), {ec, e, e}, {e})));
}
INSTANTIATE_TEST_SUITE_P(Ops, WhereTest, ::testing::ValuesIn(cases({"where"})), case_name);

// ---- Unary ------------------------------------------------------------------------------------

double unary_ref(const std::string& op, double x) {
  if (op == "neg") return -x;
  if (op == "abs") return std::fabs(x);
  if (op == "relu") return x < 0 ? 0 : x;
  if (op == "exp") return std::exp(x);
  if (op == "log") return std::log(x);
  if (op == "sqrt") return std::sqrt(x);
  if (op == "sigmoid") return 1 / (1 + std::exp(-x));
  if (op == "tanh") return std::tanh(x);
  ADD_FAILURE() << "no reference for " << op;
  return 0;
}

class UnaryTest : public OpTest {
 protected:
  Dist dist() const { return op() == "log" || op() == "sqrt" ? Dist::kPositive : Dist::kGeneral; }
  double ref(double x) const {
    const double r = unary_ref(op(), x);
    return is_float(dtype()) ? r : round_to(dtype(), r);
  }
};

TEST_P(UnaryTest, Layouts) {
  for (Kind k : {Kind::kDense, Kind::kTransposed, Kind::kStrided, Kind::kBroadcastFirst,
                 Kind::kBroadcastLast}) {
    SCOPED_TRACE(kind_name(k));
    for (auto shape : {std::vector<int64_t>{5, 7, 3}, std::vector<int64_t>{}, {600, 170}}) {
      const HostTensor a = make_host(dtype(), shape, k, dist());
      check_op(op(), dtype(), dtype(), {a}, shape, {},
               [this](const std::vector<double>& v) { return ref(v[0]); });
    }
  }
}

TEST_P(UnaryTest, InPlaceAndEmpty) {
  const HostTensor a = make_host(dtype(), {31, 33}, Kind::kDense, dist());
  DeviceTensor da = upload(a);
  ASSERT_TRUE(ok(launch(op().c_str(), dtype(), {da.desc}, {da.desc}, {attr_i("inplace", 1)})));
  std::vector<double> expect;
  for (double x : a.values()) expect.push_back(ref(x));
  EXPECT_TRUE(close(dtype(), da.values(), expect));
  EXPECT_TRUE(da.guards_intact());
  bp_tensor_desc e = make_output(dtype(), {4, 0}).desc;
  EXPECT_TRUE(ok(launch(op().c_str(), dtype(), {e}, {e})));
}

INSTANTIATE_TEST_SUITE_P(Ops, UnaryTest,
                         ::testing::ValuesIn(cases({"neg", "abs", "relu", "exp", "log", "sqrt",
                                                    "sigmoid", "tanh"})),
                         case_name);

// ---- Reductions ------------------------------------------------------------------------------

class ReductionTest : public OpTest {
 protected:
  // Reduces h over the dims set in `mask` with the plugin and checks against a long double
  // reference.
  void run(const HostTensor& h, unsigned mask) {
    const int r = static_cast<int>(h.shape.size());
    std::vector<int64_t> out_shape = h.shape;
    for (int d = 0; d < r; ++d)
      if (mask & (1u << d)) out_shape[d] = 1;
    SCOPED_TRACE("mask " + std::to_string(mask) + " rank " + std::to_string(r));
    DeviceTensor in = upload(h);
    DeviceTensor out = make_output(dtype(), out_shape);
    ASSERT_TRUE(ok(launch(op().c_str(), dtype(), {in.desc}, {out.desc})));
    const int64_t n_out = product(out_shape);
    std::vector<long double> acc(static_cast<size_t>(n_out), op() == "max" ? -INFINITY : 0);
    std::vector<long double> sq(static_cast<size_t>(n_out), 0);  // sum of squares of the terms
    const std::vector<int64_t> ostr = dense_strides(out_shape);
    for_each_index(h.shape, [&](const std::vector<int64_t>& idx) {
      int64_t o = 0;
      for (int d = 0; d < r; ++d) o += (out_shape[d] == 1 ? 0 : idx[d]) * ostr[d];
      const long double v = h.at(idx);
      acc[o] = op() == "max" ? std::max(acc[o], v) : acc[o] + v;
      sq[o] += v * v;
    });
    const int64_t count = n_out ? h.numel() / n_out : 0;
    std::vector<double> expect, magnitude;
    for (size_t o = 0; o < acc.size(); ++o) {
      const long double div = op() == "mean" ? count : 1;
      double v = static_cast<double>(op() == "max" ? acc[o] : acc[o] / div);
      expect.push_back(is_float(dtype()) ? v : round_to(dtype(), v));
      magnitude.push_back(op() == "max" ? 0.0 : static_cast<double>(std::sqrt(sq[o]) / div));
    }
    EXPECT_TRUE(close(dtype(), out.values(), expect, -1, magnitude));
    EXPECT_TRUE(out.guards_intact());
  }
};

TEST_P(ReductionTest, EverySetOfDims) {
  for (Kind k : {Kind::kDense, Kind::kTransposed, Kind::kStrided}) {
    SCOPED_TRACE(kind_name(k));
    const HostTensor h3 = make_host(dtype(), {4, 5, 6}, k);
    for (unsigned mask = 0; mask < 8; ++mask) run(h3, mask);
    const HostTensor h4 = make_host(dtype(), {3, 1, 4, 5}, k);
    for (unsigned mask = 0; mask < 16; ++mask) run(h4, mask);
  }
  run(make_host(dtype(), {6, 7}, Kind::kBroadcastFirst), 1);
  run(make_host(dtype(), {6, 7}, Kind::kBroadcastLast), 3);
  run(make_host(dtype(), {}, Kind::kDense), 0);
}

TEST_P(ReductionTest, LargeInnerAndOuter) {
  run(make_host(dtype(), {1000003}, Kind::kDense), 1);        // whole tensor, one long row
  run(make_host(dtype(), {37, 30011}, Kind::kDense), 2);      // last axis
  run(make_host(dtype(), {30011, 37}, Kind::kDense), 1);      // first axis, few outputs
  run(make_host(dtype(), {2000, 700}, Kind::kDense), 1);      // first axis, many outputs
  run(make_host(dtype(), {300, 301}, Kind::kTransposed), 3);  // whole tensor, strided
  run(make_host(dtype(), {20, 3000, 9}, Kind::kDense), 5);    // outer dims around a kept one
  run(make_host(dtype(), {2, 200001}, Kind::kStrided), 2);    // long strided rows
}

TEST_P(ReductionTest, EmptyInput) {
  DeviceTensor in = upload(make_host(dtype(), {0, 4}, Kind::kDense));
  DeviceTensor out = make_output(dtype(), {1, 4});
  bp_error* e = launch(op().c_str(), dtype(), {in.desc}, {out.desc});
  if (op() == "max") {
    const ErrorInfo info = take(e);
    EXPECT_EQ(info.code, BP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(info.message.find("zero elements"), std::string::npos) << info.message;
    EXPECT_NE(info.message.find("max"), std::string::npos) << info.message;
  } else {
    ASSERT_TRUE(ok(e));
    const double v = op() == "mean" ? std::nan("") : 0.0;
    EXPECT_TRUE(close(dtype(), out.values(), std::vector<double>(4, v)));
  }
  // No outputs: nothing to compute, even for max.
  DeviceTensor in2 = upload(make_host(dtype(), {0, 4}, Kind::kDense));
  DeviceTensor out2 = make_output(dtype(), {0, 1});
  EXPECT_TRUE(ok(launch(op().c_str(), dtype(), {in2.desc}, {out2.desc})));
}

TEST_P(ReductionTest, BadOutputShape) {
  DeviceTensor in = upload(make_host(dtype(), {4, 6}, Kind::kDense));
  DeviceTensor out = make_output(dtype(), {2, 6});
  EXPECT_EQ(take(launch(op().c_str(), dtype(), {in.desc}, {out.desc})).code,
            BP_ERROR_INVALID_ARGUMENT);
}

INSTANTIATE_TEST_SUITE_P(Ops, ReductionTest, ::testing::ValuesIn(cases({"sum", "mean", "max"})),
                         case_name);

TEST_F(PluginTest, MaxPropagatesNaN) {
  HostTensor h;
  h.dtype = BP_DTYPE_F32;
  h.shape = {2, 3};
  h.strides = {3, 1};
  h.storage = {1, std::nan(""), 3, 4, 5, 6};
  DeviceTensor in = upload(h);
  DeviceTensor out = make_output(BP_DTYPE_F32, {2, 1});
  ASSERT_TRUE(ok(launch("max", BP_DTYPE_F32, {in.desc}, {out.desc})));
  const std::vector<double> v = out.values();
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_EQ(v[1], 6.0);
}

// ---- matmul -----------------------------------------------------------------------------------

class MatmulTest : public OpTest {
 protected:
  // a[B,M,K] (batch stride 0 when a_bcast) times b[B,K,N]; ta/tb store the matrices transposed.
  void run(int64_t B, int64_t M, int64_t K, int64_t N, Kind ka, Kind kb, bool a_bcast = false,
           bool b_bcast = false, bool out_transposed = false) {
    SCOPED_TRACE(::testing::Message()
                 << "B=" << B << " M=" << M << " K=" << K << " N=" << N << " a " << kind_name(ka)
                 << (a_bcast ? " bcast" : "") << " b " << kind_name(kb) << (b_bcast ? " bcast" : "")
                 << (out_transposed ? " out^T" : ""));
    HostTensor a = make_host(dtype(), {a_bcast ? 1 : B, M, K}, ka);
    HostTensor b = make_host(dtype(), {b_bcast ? 1 : B, K, N}, kb);
    if (a_bcast) a.shape[0] = B, a.strides[0] = 0;
    if (b_bcast) b.shape[0] = B, b.strides[0] = 0;
    DeviceTensor da = upload(a), db = upload(b);
    DeviceTensor out = make_output(dtype(), {B, M, N}, out_transposed);
    ASSERT_TRUE(
        ok(launch("matmul", dtype(), {da.desc, db.desc}, {out.desc}, {attr_i("allow_tf32", 0)})));
    std::vector<double> expect, magnitude;
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          long double s = 0, sq = 0;
          for (int64_t k = 0; k < K; ++k) {
            const long double t = static_cast<long double>(a.at({bi, i, k})) * b.at({bi, k, j});
            s += t;
            sq += t * t;
          }
          expect.push_back(static_cast<double>(s));
          magnitude.push_back(static_cast<double>(std::sqrt(sq)));
        }
    EXPECT_TRUE(close(dtype(), out.values(), expect, -1, magnitude));
    EXPECT_TRUE(out.guards_intact());
  }
};

TEST_P(MatmulTest, RowAndColumnMajorBatched) {
  for (Kind ka : {Kind::kDense, Kind::kTransposed})
    for (Kind kb : {Kind::kDense, Kind::kTransposed}) run(3, 5, 7, 4, ka, kb);
  run(2, 65, 129, 33, Kind::kTransposed, Kind::kDense);
  run(1, 1, 9, 6, Kind::kDense, Kind::kTransposed);  // vector times matrix
  run(2, 6, 9, 1, Kind::kTransposed, Kind::kDense);  // matrix times vector
  run(1, 1, 1, 1, Kind::kDense, Kind::kDense);
  run(40, 8, 8, 8, Kind::kDense, Kind::kTransposed);  // many small matrices
}

TEST_P(MatmulTest, BroadcastBatchStridedAndTransposedOutput) {
  run(4, 5, 6, 7, Kind::kDense, Kind::kDense, /*a_bcast=*/false, /*b_bcast=*/true);
  run(4, 5, 6, 7, Kind::kTransposed, Kind::kDense, /*a_bcast=*/true, /*b_bcast=*/false);
  run(3, 4, 5, 6, Kind::kStrided, Kind::kDense);  // not BLAS-describable: packed
  run(3, 4, 5, 6, Kind::kDense, Kind::kBroadcastLast);
  run(2, 5, 3, 4, Kind::kDense, Kind::kTransposed, false, false, /*out_transposed=*/true);
}

// Products large enough to be split into output tiles over the workers (Note [One thread pool]),
// odd sizes so tiles are ragged, a batch of them, a transposed output and operands; with
// BACKPLANE_CPU_MATMUL_THREADS=openmp (a CTest variant) the same go through OpenMP teams.
TEST_P(MatmulTest, LargeProductsSplitIntoTiles) {
  run(1, 300, 70, 270, Kind::kTransposed, Kind::kDense);
  run(3, 257, 20, 130, Kind::kDense, Kind::kTransposed, false, false, /*out_transposed=*/true);
  run(2, 260, 33, 259, Kind::kDense, Kind::kDense, /*a_bcast=*/false, /*b_bcast=*/true);
}
TEST_P(MatmulTest, EmptyAndZeroK) {
  run(2, 3, 0, 4, Kind::kDense, Kind::kDense);  // K == 0: zeros
  run(0, 3, 5, 4, Kind::kDense, Kind::kDense);
  run(2, 0, 5, 4, Kind::kDense, Kind::kDense);
  DeviceTensor a = upload(make_host(dtype(), {2, 3, 4}, Kind::kDense));
  DeviceTensor b = upload(make_host(dtype(), {2, 5, 4}, Kind::kDense));
  DeviceTensor out = make_output(dtype(), {2, 3, 4});
  EXPECT_EQ(take(launch("matmul", dtype(), {a.desc, b.desc}, {out.desc})).code,
            BP_ERROR_INVALID_ARGUMENT);
}

INSTANTIATE_TEST_SUITE_P(Ops, MatmulTest, ::testing::ValuesIn(cases({"matmul"})), case_name);

// ---- Random ------------------------------------------------------------------------------------

// Note [Philox stream] computed on the host, rounded to the dtype.
double uniform_ref(bp_dtype d, uint64_t seed, uint64_t g, double low, double high) {
  const float u = bp_philox_uniform01(seed, g);
  if (d == BP_DTYPE_F64) return low + (high - low) * static_cast<double>(u);
  const float lo = static_cast<float>(low), hi = static_cast<float>(high);
  return round_to(d, lo + (hi - lo) * u);
}
// mean + stddev * z; `magnitude` receives |mean| + |stddev * z|, the size of the two terms the
// kernel adds in float (a value that cancels to near zero is judged by them).
double normal_ref(uint64_t seed, uint64_t g, double mean, double stddev,
                  double* magnitude = nullptr) {
  float u1, u2;
  bp_philox_normal_uniforms(seed, g, &u1, &u2);
  const double r = std::sqrt(-2.0 * std::log(static_cast<double>(u1)));
  const double t = 2 * kPi * u2;
  const double term = stddev * r * ((g & 1) ? std::sin(t) : std::cos(t));
  if (magnitude) *magnitude = std::fabs(mean) + std::fabs(term);
  return mean + term;
}

class RandomTest : public OpTest {
 protected:
  std::vector<bp_attr> attrs(uint64_t seed, uint64_t offset, double p0, double p1) const {
    const bool u = op() == "uniform";
    return {attr_i("seed", static_cast<int64_t>(seed)),
            attr_i("offset", static_cast<int64_t>(offset)), attr_f(u ? "low" : "mean", p0),
            attr_f(u ? "high" : "std", p1)};
  }
};

TEST_P(RandomTest, MatchesThePhiloxStream) {
  const uint64_t seed = rng()();
  for (uint64_t offset : {uint64_t{0}, uint64_t{5}, (uint64_t{1} << 40) + 3}) {
    for (std::vector<int64_t> shape : {std::vector<int64_t>{1}, {7}, {3, 333}, {100003}, {0}, {}}) {
      SCOPED_TRACE(::testing::Message() << "offset " << offset << " n " << product(shape));
      const double p0 = op() == "uniform" ? -1.5 : 0.25, p1 = op() == "uniform" ? 2.5 : 1.75;
      DeviceTensor out = make_output(dtype(), shape);
      ASSERT_TRUE(ok(launch(op().c_str(), dtype(), {}, {out.desc}, attrs(seed, offset, p0, p1))));
      std::vector<double> expect, magnitude;
      for (int64_t i = 0; i < product(shape); ++i) {
        double m = 0;
        expect.push_back(op() == "uniform" ? uniform_ref(dtype(), seed, offset + i, p0, p1)
                                           : normal_ref(seed, offset + i, p0, p1, &m));
        magnitude.push_back(m);
      }
      if (op() == "uniform") {
        // Bit-identical to the reference mapping.
        EXPECT_TRUE(close(dtype(), out.values(), expect, 0));
        for (double v : out.values()) {
          EXPECT_GE(v, round_to(dtype(), p0));
          EXPECT_LE(v, round_to(dtype(), p1));
        }
      } else {
        EXPECT_TRUE(close(dtype(), out.values(), expect, -1, magnitude));
      }
      EXPECT_TRUE(out.guards_intact());
    }
  }
}

TEST_P(RandomTest, Statistics) {
  const int64_t n = 400000;
  const uint64_t seed = rng()();
  const double p0 = op() == "uniform" ? 2.0 : -1.0, p1 = op() == "uniform" ? 5.0 : 3.0;
  DeviceTensor out = make_output(dtype(), {n});
  ASSERT_TRUE(ok(launch(op().c_str(), dtype(), {}, {out.desc}, attrs(seed, 0, p0, p1))));
  const std::vector<double> v = out.values();
  long double s = 0, s2 = 0;
  for (double x : v) s += x, s2 += static_cast<long double>(x) * x;
  const double mean = static_cast<double>(s / n);
  const double sd = std::sqrt(static_cast<double>(s2 / n - (s / n) * (s / n)));
  const double want_mean = op() == "uniform" ? (p0 + p1) / 2 : p0;
  const double want_sd = op() == "uniform" ? (p1 - p0) / std::sqrt(12.0) : p1;
  // Five standard errors, plus the rounding of bf16/f16 values.
  const double slack = dtype() == BP_DTYPE_BF16 ? 0.02 : dtype() == BP_DTYPE_F16 ? 0.005 : 0;
  EXPECT_TRUE(bp_test::scalar_close(
      BP_DTYPE_F64, mean, want_mean,
      {.rtol = 0, .atol = 5 * want_sd / std::sqrt(static_cast<double>(n)) + slack}));
  EXPECT_TRUE(bp_test::scalar_close(BP_DTYPE_F64, sd, want_sd, {.rtol = 0.01, .atol = slack}));
  // A different seed gives a different stream.
  DeviceTensor other = make_output(dtype(), {n});
  ASSERT_TRUE(ok(launch(op().c_str(), dtype(), {}, {other.desc}, attrs(seed + 1, 0, p0, p1))));
  EXPECT_NE(other.values(), v);
}

INSTANTIATE_TEST_SUITE_P(Ops, RandomTest, ::testing::ValuesIn(cases({"uniform", "normal"})),
                         case_name);

}  // namespace
}  // namespace bpt
