// The CPU backend's own cases, through its C table (the plugin loaded by libbackplane's loader
// from the build tree, found relative to this binary): its identity and properties, the support
// matrix it must declare, its environment variables (BACKPLANE_CPU_MATMUL_THREADS,
// BACKPLANE_CPU_SERIAL_THRESHOLD, BACKPLANE_CPU_ISA), its error messages and matmul tiles split
// over the workers. Every op x dtype against the float64 reference, memory, copies and streams
// are the conformance kit's shared cases (conformance.cpu runs them with the default thresholds);
// SharedCases.* runs them here in process through bp_conformance_lib under the CTest variants'
// thresholds and ISA levels (backends/cpu/CMakeLists.txt). Fresh random data, seed printed;
// BP_TEST_SEED reproduces a run.
#include "cpu_test_support.hpp"

#include <backplane_test/child.hpp>
#include <conformance_gtest.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <utility>

namespace bpt {
namespace {

// ---- The support matrix the backend must declare ----------------------------------------------

const std::vector<bp_dtype> kFloats = {BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_F16, BP_DTYPE_BF16};
const std::vector<bp_dtype> kSigned = {BP_DTYPE_F32,  BP_DTYPE_F64, BP_DTYPE_F16,
                                       BP_DTYPE_BF16, BP_DTYPE_I32, BP_DTYPE_I64};
const std::vector<bp_dtype> kArith = {BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_F16, BP_DTYPE_BF16,
                                      BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_U8};

const std::map<std::string, std::vector<bp_dtype>>& support_matrix() {
  static const std::map<std::string, std::vector<bp_dtype>> m = {
      {"fill", all_dtypes()},
      {"copy", all_dtypes()},
      {"cast", all_dtypes()},
      {"add", kArith},
      {"sub", kArith},
      {"mul", kArith},
      {"div", kFloats},
      {"pow", kFloats},
      {"maximum", kArith},
      {"minimum", kArith},
      {"eq", all_dtypes()},
      {"ne", all_dtypes()},
      {"lt", all_dtypes()},
      {"le", all_dtypes()},
      {"gt", all_dtypes()},
      {"ge", all_dtypes()},
      {"where", all_dtypes()},
      {"neg", kSigned},
      {"exp", kFloats},
      {"log", kFloats},
      {"sqrt", kFloats},
      {"relu", kSigned},
      {"sigmoid", kFloats},
      {"tanh", kFloats},
      {"abs", kSigned},
      {"sum", kSigned},
      {"mean", kFloats},
      {"max", kSigned},
      {"matmul", kFloats},
      {"uniform", kFloats},
      {"normal", kFloats},
      {"sumsq", kFloats},
      {"norm", kFloats},
      {"linear", kFloats},
      // Minor 4: the convolutional family.
      {"conv2d", kFloats},
      {"conv2d_backward_input", kFloats},
      {"conv2d_backward_weight", kFloats},
      {"max_pool2d", kFloats},
      {"max_pool2d_backward", kFloats},
      {"avg_pool2d", kFloats},
      {"avg_pool2d_backward", kFloats},
      {"adaptive_avg_pool2d", kFloats},
      {"adaptive_avg_pool2d_backward", kFloats},
      {"batch_norm", kFloats},
      {"batch_norm_backward", kFloats},
      {"dropout", kFloats},
      {"max_dim", kSigned},
      {"min_dim", kSigned},
      {"gather", all_dtypes()},
      {"scatter_add", kArith},
      {"softmax", kFloats},
      {"log_softmax", kFloats},
      {"softmax_backward", kFloats},
      {"log_softmax_backward", kFloats},
      // Minor 5: the transformer family.
      {"layer_norm", kFloats},
      {"layer_norm_backward", kFloats},
      {"gelu", kFloats},
      {"gelu_backward", kFloats},
      {"silu", kFloats},
      {"silu_backward", kFloats},
      {"embedding", kFloats},
      {"embedding_backward", kFloats},
      {"scaled_dot_product_attention", kFloats},
      {"scaled_dot_product_attention_backward", kFloats},
      {"triu", all_dtypes()},
      {"tril", all_dtypes()},
      {"cumsum", kSigned},
      {"sin", kFloats},
      {"cos", kFloats},
      {"rsqrt", kFloats},
      {"adamw", kFloats},
      {"cross_entropy", kFloats},
      {"cross_entropy_backward", kFloats}};
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

// A bad BACKPLANE_CPU_MATMUL_THREADS, BACKPLANE_CPU_SERIAL_THRESHOLD, BACKPLANE_CPU_LOOPS or
// BACKPLANE_CPU_BF16_MATMUL makes init fail with a
// message naming the variable and the values it takes (checked in a fresh process of this
// binary, since init runs once per process).
TEST_F(PluginTest, BadEnvironmentValuesFailInitWithTheVariableNamed) {
  for (const auto& [env, expect] : std::vector<std::pair<std::string, std::string>>{
           {"BACKPLANE_CPU_MATMUL_THREADS=many",
            "BACKPLANE_CPU_MATMUL_THREADS='many' is not 'tbb' (the default) or 'openmp'"},
           {"BACKPLANE_CPU_SERIAL_THRESHOLD=-3",
            "BACKPLANE_CPU_SERIAL_THRESHOLD='-3' is not a positive integer"},
           {"BACKPLANE_CPU_LOOPS=sometimes",
            "BACKPLANE_CPU_LOOPS='sometimes' is not 'auto' (the default), 'tbb' or 'openmp'"},
           {"BACKPLANE_CPU_BF16_MATMUL=half",
            "BACKPLANE_CPU_BF16_MATMUL='half' is not 'onednn' (the default) or 'f32'"}}) {
    const bp_test::ChildResult r =
        bp_test::rerun_self(env, "PluginTest.Identity", "--gtest_brief=1");
    EXPECT_FALSE(r.exited_zero()) << env << ": " << r.output;
    EXPECT_NE(r.output.find(expect), std::string::npos) << env << ": " << r.output;
  }
}

// ---- Errors ----------------------------------------------------------------------------------

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

// Products large enough to be split into output tiles over the workers (Note [One thread pool]),
// odd sizes so tiles are ragged, a batch of them, a transposed output and operands; with
// BACKPLANE_CPU_MATMUL_THREADS=openmp (a CTest variant) the same go through OpenMP teams.
TEST_P(MatmulTest, LargeProductsSplitIntoTiles) {
  run(1, 300, 70, 270, Kind::kTransposed, Kind::kDense);
  run(3, 257, 20, 130, Kind::kDense, Kind::kTransposed, false, false, /*out_transposed=*/true);
  run(2, 260, 33, 259, Kind::kDense, Kind::kDense, /*a_bcast=*/false, /*b_bcast=*/true);
}
INSTANTIATE_TEST_SUITE_P(Ops, MatmulTest, ::testing::ValuesIn(cases({"matmul"})), case_name);

// ---- The conformance kit's shared cases, in process -------------------------------------------

// The plugin file this binary tests (BP_CPU_PLUGIN overrides it).
std::string plugin_path() {
  return bp_test::beside_exe(BP_CPU_PLUGIN_REL, "BP_CPU_PLUGIN");
}

// Every op x dtype of the kit: run by the cpu_plugin.parallel variant, whose tiny
// BACKPLANE_CPU_SERIAL_THRESHOLD sends even small tensors through the oneTBB paths.
TEST(SharedCases, AllKernels) {
  bpc::expect_shared_cases_pass(plugin_path(), "kernels", 0, {}, 100);
}
// The matmul and linear cases: run by the cpu_plugin.openmp variant (oneDNN's OpenMP teams,
// Note [One thread pool]).
TEST(SharedCases, MatmulKernels) {
  bpc::expect_shared_cases_pass(plugin_path(), "kernels", 0,
                                {"kernels.matmul_*", "kernels.linear_*"}, 10);
}
// The transcendental cases (and the activations built on them, Note [CPU activations]): run by
// the cpu_plugin.<isa> variants, each narrower vector-math table (Note [CPU vector math]).
TEST(SharedCases, VectorMathKernels) {
  bpc::expect_shared_cases_pass(
      plugin_path(), "kernels", 0,
      {"kernels.exp_*", "kernels.log_*", "kernels.tanh_*", "kernels.sigmoid_*", "kernels.pow_*",
       "kernels.gelu*", "kernels.silu*"},
      10);
}

}  // namespace
}  // namespace bpt
