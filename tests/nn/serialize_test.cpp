// safetensors save/load: round trips between every pair of devices, every dtype, the exact
// byte layout, hostile files (each with its error type and message), model mismatches, the
// atomic-save guarantee, and the PyTorch-written fixture.
#include "nn_test_support.hpp"

#include <backplane/serialize.hpp>
#include <backplane_test/plugin_test.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <random>
#include <thread>

#ifndef BP_TORCH_FIXTURE_REL
#error \
    "BP_TORCH_FIXTURE_REL must name the build tree's copy of tests/fixtures/torch/mlp.safetensors"
#endif

namespace {

// The build tree's copy of the fixture, relative to this test binary; BP_NN_FIXTURE overrides.
std::string torch_fixture() {
  return bp_test::beside_exe(BP_TORCH_FIXTURE_REL, "BP_NN_FIXTURE");
}

using bp::Shape;
using bp::Tensor;
using namespace bp::nn;

std::unique_ptr<Sequential> make_mlp(bp::Device& d) {
  auto net = std::make_unique<Sequential>();
  net->add<Linear>(3, 4, true, d);
  net->add<ReLU>();
  net->add<Linear>(4, 1, true, d);
  return net;
}

// ---- round trips across devices -------------------------------------------------------------

class SaveLoadPairTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  bp::Device& src() { return bp::device(std::get<0>(GetParam())); }
  bp::Device& dst() { return bp::device(std::get<1>(GetParam())); }
  nntest::ScratchDir dir_;
};

TEST_P(SaveLoadPairTest, ModelRoundTripGivesIdenticalOutputs) {
  bp::manual_seed(1);
  auto net = make_mlp(src());
  Tensor x = nntest::make(nntest::random_values(8 * 3), {8, 3}, src());
  Tensor y = net->forward(x);
  std::string path = dir_.file("net.safetensors");
  bp::save(*net, path);

  bp::manual_seed(2);  // different initial values
  auto fresh = make_mlp(bp::device("cpu:0"));
  auto r = bp::load(*fresh, path, dst());
  EXPECT_TRUE(r.missing_keys.empty());
  EXPECT_TRUE(r.unexpected_keys.empty());
  auto a = net->state_dict(), b = fresh->state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (auto& [k, t] : b) {
    EXPECT_EQ(&t.device(), &dst()) << k;
    EXPECT_TRUE(t.requires_grad()) << k;
    EXPECT_EQ(t.to_vector<float>(), a.at(k).to_vector<float>()) << k;
  }
  Tensor y2 = fresh->forward(x.to(dst()));
  EXPECT_EQ(&y2.device(), &dst());
  EXPECT_TRUE(nntest::allclose(y2.cpu(), y.detach().cpu(), 1e-5, 1e-6));
}

TEST_P(SaveLoadPairTest, LoadIntoLazyLinearThatHasNotRun) {
  bp::manual_seed(3);
  Sequential net;
  net.add<LazyLinear>(2);
  net.add<Tanh>();
  Tensor x = nntest::make(nntest::random_values(5 * 7), {5, 7}, src());
  Tensor y = net(x);
  std::string path = dir_.file("lazy.safetensors");
  bp::save(net, path);

  Sequential fresh;
  fresh.add<LazyLinear>(2);
  fresh.add<Tanh>();
  bp::load(fresh, path, dst());
  auto& lazy = fresh.get<LazyLinear>(0);
  EXPECT_EQ(lazy.in_features(), 7);
  EXPECT_EQ(&lazy.weight().device(), &dst());
  EXPECT_TRUE(nntest::allclose(fresh(x.to(dst())).cpu(), y.detach().cpu(), 1e-5, 1e-6));
}

TEST_P(SaveLoadPairTest, EveryDTypeAndLayoutRoundTrips) {
  std::map<std::string, Tensor> in;
  std::vector<double> v = nntest::random_values(24, -50, 50);
  for (double& x : v) x = std::round(x);  // exact in every dtype
  for (bp::DType dt : {bp::DType::f32, bp::DType::f64, bp::DType::f16, bp::DType::bf16,
                       bp::DType::i32, bp::DType::i64}) {
    if (dt == bp::DType::f64 && !src().properties().supports_f64) continue;
    in[std::string(bp::dtype_name(dt))] = bp::from_vector(v, {2, 3, 4}, src()).to(dt);
  }
  std::vector<double> small(v.size());
  for (size_t i = 0; i < v.size(); ++i) small[i] = std::fabs(v[i]);
  in["u8"] = bp::from_vector(small, {24}, src()).to(bp::DType::u8);
  in["bool"] = bp::gt(bp::from_vector(v, {4, 6}, src()), 0.0);
  in["transposed"] = bp::from_vector(v, {4, 6}, src()).to(bp::DType::f32).t();  // not contiguous
  in["scalar"] = bp::from_vector(std::vector<float>{3.5f}, {}, src());
  in["empty"] = bp::zeros({0, 3}, src());
  std::string path = dir_.file("all.safetensors");
  bp::save(in, path, {{"format", "pt"}, {"by", "backplane"}});

  auto out = bp::load_file(path, dst());
  ASSERT_EQ(out.size(), in.size());
  for (auto& [k, t] : in) {
    const Tensor& o = out.at(k);
    EXPECT_EQ(&o.device(), &dst()) << k;
    EXPECT_EQ(o.dtype(), t.dtype()) << k;
    EXPECT_EQ(o.shape(), t.shape()) << k;
    EXPECT_EQ(o.to_vector<double>(), t.to_vector<double>()) << k;
  }
  auto meta = bp::load_metadata(path);
  EXPECT_EQ(meta.at("format"), "pt");
  EXPECT_EQ(meta.at("by"), "backplane");
}

INSTANTIATE_TEST_SUITE_P(DevicePairs, SaveLoadPairTest, ::testing::ValuesIn(nntest::device_pairs()),
                         nntest::pair_name);

// ---- format ---------------------------------------------------------------------------------

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int k = 0; k < 8; ++k) s[k] = static_cast<char>((n >> (8 * k)) & 0xff);
  return s;
}

std::string file_of(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

TEST(SafetensorsFormat, WritesTheDocumentedLayout) {
  nntest::ScratchDir dir;
  std::string path = dir.file("t.safetensors");
  Tensor a = bp::tensor({1, 2, 3}, bp::device("cpu:0"));
  Tensor b = bp::from_vector(std::vector<int64_t>{7, -1}, {2, 1}, bp::device("cpu:0"));
  bp::save({{"b", b}, {"a", a}}, path);
  std::string bytes = nntest::read_all(path);
  std::string header = R"({"a":{"data_offsets":[0,12],"dtype":"F32","shape":[3]},)"
                       R"("b":{"data_offsets":[12,28],"dtype":"I64","shape":[2,1]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  float af[3] = {1, 2, 3};
  int64_t bi[2] = {7, -1};
  std::string data(reinterpret_cast<const char*>(af), 12);
  data.append(reinterpret_cast<const char*>(bi), 16);
  EXPECT_EQ(bytes, file_of(header, data));
  EXPECT_EQ((8 + header.size()) % 8, 0u);  // the data section is 8-byte aligned
}

TEST(SafetensorsFormat, ParsesFromMemory) {
  std::string header = R"({"x":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
                       R"("__metadata__":{"k":"v"}})";
  std::string bytes = file_of(header, std::string("\x80\x3f\x00\x40", 4));  // 1.0, 2.0
  auto span = std::as_bytes(std::span<const char>(bytes.data(), bytes.size()));
  auto h = bp::safetensors::parse(span, "mem");
  ASSERT_EQ(h.tensors.size(), 1u);
  EXPECT_EQ(h.tensors[0].dtype, bp::DType::bf16);
  EXPECT_EQ(h.metadata.at("k"), "v");
  auto t = bp::safetensors::read(span, bp::device("cpu:0"), "mem");
  EXPECT_EQ(t.at("x").to_vector<float>(), (std::vector<float>{1.0f, 2.0f}));
  // build_header gives back an equivalent header.
  std::string rebuilt = bp::safetensors::build_header(h.tensors, h.metadata);
  auto h2 = bp::safetensors::parse_header(rebuilt, 4, "rebuilt");
  EXPECT_EQ(h2.tensors[0].shape, h.tensors[0].shape);
}

// 100,000 entries: once 0.77 s for 10k and 126 s for 80k (quadratic, Note [Hostile files]);
// linear now, so this runs in well under a second. Every entry is checked.
TEST(SafetensorsFormat, AHeaderOfAHundredThousandEntriesParses) {
  const int n = 100000;
  std::string header = "{";
  for (int i = 0; i < n; ++i) {
    if (i) header += ',';
    header += "\"t" + std::to_string(i) + "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" +
              std::to_string(4 * i) + "," + std::to_string(4 * i + 4) + "]}";
  }
  header += "}";
  auto h = bp::safetensors::parse_header(header, 4 * static_cast<uint64_t>(n), "100k");
  ASSERT_EQ(h.tensors.size(), static_cast<size_t>(n));
  std::vector<bool> seen(n);
  for (const auto& t : h.tensors) {
    const int i = std::stoi(t.name.substr(1));
    EXPECT_EQ(t.shape, (bp::Shape{1}));
    EXPECT_EQ(t.begin, 4u * static_cast<uint64_t>(i));
    seen[static_cast<size_t>(i)] = true;
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), true), n);
}

// ---- hostile files --------------------------------------------------------------------------

struct Hostile {
  const char* name;
  std::string bytes;
  std::vector<std::string> fragments;  // each must appear in the message
};

std::string entry(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return R"({"dtype":)" + dtype + R"(,"shape":)" + shape + R"(,"data_offsets":)" + offsets + "}";
}

std::vector<Hostile> hostile_files() {
  std::string four(4, '\0'), eight(8, '\0'), twelve(12, '\0');
  std::string deep = std::string(200000, '[') + std::string(200000, ']');
  return {
      {"empty_file", "", {"truncated", "0 bytes"}},
      {"shorter_than_length", "abcde", {"truncated", "5 bytes"}},
      {"length_past_end", le64(100) + "{}", {"header length 100", "runs past the end"}},
      {"length_absurd", le64(1ull << 62) + "{}", {"exceeds the limit"}},
      {"length_over_100MB", le64(200ull << 20) + std::string(64, ' '), {"exceeds the limit"}},
      {"length_too_short", le64(1) + "{", {"too short"}},
      {"invalid_json", file_of("{not json", ""), {"not valid JSON"}},
      {"invalid_utf8", file_of("{\"\xff\xfe\":1}", ""), {"not valid JSON"}},
      {"not_an_object", file_of("[1,2]", ""), {"must be a JSON object", "array"}},
      {"nested_too_deep", file_of(deep, ""), {"nests deeper"}},
      {"entry_not_object", file_of(R"({"w":3})", ""), {"tensor 'w'", "expected an object"}},
      {"unknown_dtype",
       file_of(R"({"w":)" + entry(R"("F8_E4M3")", "[4]", "[0,4]") + "}", four),
       {"tensor 'w'", "unsupported dtype 'F8_E4M3'"}},
      {"garbage_dtype",
       file_of(R"({"w":)" + entry(R"("XYZ")", "[1]", "[0,4]") + "}", four),
       {"tensor 'w'", "dtype 'XYZ'"}},
      {"dtype_not_string",
       file_of(R"({"w":)" + entry("7", "[1]", "[0,4]") + "}", four),
       {"tensor 'w'", "dtype must be a string"}},
      {"shape_not_array",
       file_of(R"({"w":)" + entry(R"("F32")", "4", "[0,4]") + "}", four),
       {"tensor 'w'", "shape must be an array"}},
      {"negative_dim",
       file_of(R"({"w":)" + entry(R"("F32")", "[-1]", "[0,4]") + "}", four),
       {"tensor 'w'", "-1 is negative"}},
      {"fractional_dim",
       file_of(R"({"w":)" + entry(R"("F32")", "[2.5]", "[0,4]") + "}", four),
       {"tensor 'w'", "not an integer"}},
      {"string_dim",
       file_of(R"({"w":)" + entry(R"("F32")", R"(["1"])", "[0,4]") + "}", four),
       {"tensor 'w'", "not an integer"}},
      {"rank_too_high",
       file_of(R"({"w":)" + entry(R"("F32")", "[1,1,1,1,1,1,1,1,1]", "[0,4]") + "}", four),
       {"tensor 'w'", "9 dimensions"}},
      {"begin_after_end",
       file_of(R"({"w":)" + entry(R"("F32")", "[1]", "[4,0]") + "}", four),
       {"tensor 'w'", "begin after they end"}},
      {"offsets_out_of_range",
       file_of(R"({"w":)" + entry(R"("F32")", "[2]", "[0,8]") + "}", four),
       {"tensor 'w'", "run past the data section"}},
      {"offsets_wrong_arity",
       file_of(R"({"w":)" + entry(R"("F32")", "[1]", "[0,4,8]") + "}", four),
       {"tensor 'w'", "two integers"}},
      {"negative_offset",
       file_of(R"({"w":)" + entry(R"("F32")", "[1]", "[-4,0]") + "}", four),
       {"tensor 'w'", "negative"}},
      {"size_disagrees",
       file_of(R"({"w":)" + entry(R"("F32")", "[2,2]", "[0,12]") + "}", twelve),
       {"tensor 'w'", "needs 16 bytes", "hold 12"}},
      {"size_overflows",
       file_of(R"({"w":)" + entry(R"("F32")", "[4611686018427387904,4]", "[0,4]") + "}", four),
       {"tensor 'w'", "more than 2^64"}},
      {"overlap",
       file_of(R"({"a":)" + entry(R"("F32")", "[2]", "[0,8]") + R"(,"b":)" +
                   entry(R"("F32")", "[2]", "[4,12]") + "}",
               twelve),
       {"tensor 'b'", "overlap tensor 'a'"}},
      {"gap",
       file_of(R"({"a":)" + entry(R"("F32")", "[1]", "[0,4]") + R"(,"b":)" +
                   entry(R"("F32")", "[1]", "[8,12]") + "}",
               twelve),
       {"tensor 'b'", "unused"}},
      {"trailing_bytes",
       file_of(R"({"a":)" + entry(R"("F32")", "[1]", "[0,4]") + "}", eight),
       {"cover 4 bytes", "has 8", "trailing"}},
      {"missing_field",
       file_of(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", four),
       {"tensor 'w'", "missing field 'shape'"}},
      {"unexpected_field",
       file_of(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}})", four),
       {"tensor 'w'", "unexpected field 'extra'"}},
      {"duplicate_name",
       file_of(R"({"w":)" + entry(R"("F32")", "[1]", "[0,4]") + R"(,"w":)" +
                   entry(R"("F32")", "[1]", "[0,4]") + "}",
               four),
       {"tensor 'w'", "appears twice"}},
      {"duplicate_field",
       file_of(R"({"w":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", four),
       {"'dtype' appears twice"}},
      {"metadata_not_object", file_of(R"({"__metadata__":[1]})", ""), {"__metadata__", "object"}},
      {"metadata_value_not_string",
       file_of(R"({"__metadata__":{"k":1}})", ""),
       {"__metadata__ value of 'k'", "string"}},
      {"bool_byte_not_0_or_1",
       file_of(R"({"m":)" + entry(R"("BOOL")", "[4]", "[0,4]") + "}", std::string("\0\1\2\1", 4)),
       {"tensor 'm'", "has byte value 2"}},
  };
}

class HostileFileTest : public ::testing::TestWithParam<Hostile> {};

TEST_P(HostileFileTest, FromDiskGivesIOErrorNamingFileAndKey) {
  nntest::ScratchDir dir;
  std::string path = dir.file(std::string(GetParam().name) + ".safetensors");
  nntest::write_all(path, GetParam().bytes);
  try {
    bp::load_file(path, bp::device("cpu:0"));
    FAIL() << "expected IOError";
  } catch (const bp::IOError& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path, 0), 0u) << msg;
    for (const std::string& f : GetParam().fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
    EXPECT_LT(msg.size(), 1000u) << "messages stay readable";
  }
  // A model load fails the same way and leaves the model alone.
  auto net = make_mlp(bp::device("cpu:0"));
  Tensor w = net->get<Linear>(0).weight();
  // (IOError, or ShapeError where the header is valid but names other keys than the model's.)
  EXPECT_THROW(bp::load(*net, path, bp::device("cpu:0")), bp::Error);
  EXPECT_TRUE(net->get<Linear>(0).weight().is_same(w));
}

TEST_P(HostileFileTest, FromMemoryGivesIOError) {
  const std::string& bytes = GetParam().bytes;
  auto span = std::as_bytes(std::span<const char>(bytes.data(), bytes.size()));
  try {
    bp::safetensors::parse(span, "<memory>");
    FAIL() << "expected IOError";
  } catch (const bp::IOError& e) {
    for (const std::string& f : GetParam().fragments)
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, HostileFileTest, ::testing::ValuesIn(hostile_files()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(SafetensorsFiles, MissingFileAndFolderAreIOErrors) {
  nntest::ScratchDir dir;
  try {
    bp::load_file(dir.file("nope.safetensors"), bp::device("cpu:0"));
    FAIL();
  } catch (const bp::IOError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos) << e.what();
  }
  try {
    bp::load_file(dir.path().string(), bp::device("cpu:0"));
    FAIL();
  } catch (const bp::IOError& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
}

// ---- model mismatches -----------------------------------------------------------------------

class ModelMismatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bp::manual_seed(5);
    auto net = make_mlp(cpu());
    path_ = dir_.file("mlp.safetensors");
    bp::save(*net, path_);
  }
  bp::Device& cpu() { return bp::device("cpu:0"); }
  template <typename E>
  std::string error_of(Module& m, const LoadOptions& o = {}) {
    try {
      bp::load(m, path_, cpu(), o);
    } catch (const E& e) {
      return e.what();
    }
    return "(no error)";
  }
  nntest::ScratchDir dir_;
  std::string path_;
};

TEST_F(ModelMismatchTest, MissingKeys) {
  Sequential bigger;
  bigger.add<Linear>(3, 4, true, cpu());
  bigger.add<ReLU>();
  bigger.add<Linear>(4, 1, true, cpu());
  bigger.add<Linear>(1, 1, true, cpu());
  std::string msg = error_of<bp::ShapeError>(bigger);
  EXPECT_EQ(msg.rfind(path_, 0), 0u) << msg;
  EXPECT_NE(msg.find("missing in the file: '3.weight', '3.bias'"), std::string::npos) << msg;
}

TEST_F(ModelMismatchTest, UnexpectedKeys) {
  Sequential smaller;
  smaller.add<Linear>(3, 4, true, cpu());
  std::string msg = error_of<bp::ShapeError>(smaller);
  EXPECT_NE(msg.find("not in the model: '2.bias', '2.weight'"), std::string::npos) << msg;
  // Non-strict loads the common keys and reports the rest.
  auto r = bp::load(smaller, path_, cpu(), LoadOptions{.strict = false});
  EXPECT_EQ(r.unexpected_keys, (std::vector<std::string>{"2.bias", "2.weight"}));
  EXPECT_TRUE(r.missing_keys.empty());
}

TEST_F(ModelMismatchTest, ShapeThatDoesNotFit) {
  Sequential wider;
  wider.add<Linear>(5, 4, true, cpu());
  wider.add<ReLU>();
  wider.add<Linear>(4, 1, true, cpu());
  Tensor w = wider.get<Linear>(0).weight();
  std::string msg = error_of<bp::ShapeError>(wider);
  EXPECT_NE(msg.find("'0.weight' has shape [4, 3] in the file but the model expects [4, 5]"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(wider.get<Linear>(0).weight().is_same(w));
  // A lazy layer checks the dimensions it knows.
  Sequential lazy;
  lazy.add<LazyLinear>(7);
  lazy.add<ReLU>();
  lazy.add<LazyLinear>(1);
  msg = error_of<bp::ShapeError>(lazy);
  EXPECT_NE(msg.find("'0.weight' has shape [4, 3] in the file but the model expects [7, ?]"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(lazy.has_uninitialized_parameters());
}

TEST_F(ModelMismatchTest, SavingAnUninitialisedLazyModelIsAnError) {
  Sequential lazy;
  lazy.add<LazyLinear>(1);
  std::string before = nntest::read_all(path_);
  EXPECT_THROW(bp::save(lazy, path_), bp::ShapeError);
  EXPECT_EQ(nntest::read_all(path_), before);
}

// ---- atomic save ----------------------------------------------------------------------------

std::vector<std::string> leftovers(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos)
      out.push_back(e.path().filename().string());
  return out;
}

TEST(AtomicSave, WriteFailureMidwayKeepsThePreviousFile) {
  nntest::ScratchDir dir;
  std::string path = dir.file("model.safetensors");
  bp::Device& cpu = bp::device("cpu:0");
  auto small = make_mlp(cpu);
  bp::save(*small, path);
  std::string before = nntest::read_all(path);
  ASSERT_LT(before.size(), 4096u);

  // A model of ~1 MB and a file-size limit of 64 KiB: write() fails with EFBIG partway
  // through the data section, deterministically, the way a full disk would.
  Sequential big;
  big.add<Linear>(512, 512, true, cpu);
  struct rlimit old {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 64 << 10;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
  std::string msg;
  try {
    bp::save(big, path);
  } catch (const bp::IOError& e) {
    msg = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(msg.find("failed after"), std::string::npos) << msg;
  EXPECT_EQ(msg.rfind(path, 0), 0u) << msg;
  EXPECT_EQ(nntest::read_all(path), before) << "the previous file must be intact";
  EXPECT_TRUE(leftovers(dir.path()).empty());
  // And the previous file still loads.
  auto again = make_mlp(cpu);
  bp::load(*again, path, cpu);
  EXPECT_EQ(again->get<Linear>(0).weight().to_vector<float>(),
            small->get<Linear>(0).weight().to_vector<float>());
}

TEST(AtomicSave, UnwritableTargetFolderIsAnIOError) {
  nntest::ScratchDir dir;
  try {
    bp::save(std::map<std::string, Tensor>{{"a", bp::zeros({2})}}, dir.file("no/such/dir/x.st"));
    FAIL();
  } catch (const bp::IOError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot create the temporary file"), std::string::npos)
        << e.what();
  }
}

TEST(AtomicSave, ReplacesAnExistingFileAndLeavesNoTemporaries) {
  nntest::ScratchDir dir;
  std::string path = dir.file("m.safetensors");
  bp::save(std::map<std::string, Tensor>{{"a", bp::zeros({2})}}, path);
  bp::save(std::map<std::string, Tensor>{{"b", bp::ones({3})}}, path);
  auto t = bp::load_file(path, bp::device("cpu:0"));
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t.at("b").to_vector<float>(), (std::vector<float>{1, 1, 1}));
  EXPECT_TRUE(leftovers(dir.path()).empty());
  EXPECT_THROW(bp::save(std::map<std::string, Tensor>{{"__metadata__", bp::zeros({1})}}, path),
               bp::IOError);
  EXPECT_THROW(bp::save(std::map<std::string, Tensor>{{"u", Tensor()}}, path), bp::Error);
}

// Temporaries that saves of `path` by dead processes left behind are removed by the next save;
// a live process's, another host's and other files' are kept (Note [Atomic save]).
TEST(AtomicSave, NextSaveRemovesTemporariesOfDeadProcesses) {
  nntest::ScratchDir dir;
  const std::string path = dir.file("m.safetensors");
  char host_buf[256] = {};
  ASSERT_EQ(::gethostname(host_buf, sizeof host_buf - 1), 0);
  const std::string host = host_buf;
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  const std::string d = std::to_string(dead), me = std::to_string(::getpid());
  const std::vector<std::string> stale = {"m.safetensors.tmp." + host + "." + d + ".0",
                                          "m.safetensors.tmp." + d + ".7"};  // older name
  const std::vector<std::string> kept = {
      "m.safetensors.tmp." + host + "." + me + ".99",        // a live process (this one)
      "m.safetensors.tmp.otherhost." + d + ".0",             // another host's
      "other.safetensors.tmp." + host + "." + d + ".0",      // another target's
      "m.safetensors.tmp.notes", "m.safetensors.tmp." + d};  // not temporaries of a save
  for (const auto& f : stale) nntest::write_all(dir.file(f), "partial");
  for (const auto& f : kept) nntest::write_all(dir.file(f), "keep");
  bp::save(std::map<std::string, Tensor>{{"a", bp::ones({3})}}, path);
  for (const auto& f : stale) EXPECT_FALSE(std::filesystem::exists(dir.file(f))) << f;
  for (const auto& f : kept) EXPECT_TRUE(std::filesystem::exists(dir.file(f))) << f;
  EXPECT_EQ(bp::load_file(path, bp::device("cpu:0")).at("a").to_vector<float>(),
            (std::vector<float>{1, 1, 1}));
}

// SIGKILL at random points of a save, with O_TMPFILE and with the named fallback: the file at
// the path is always a complete file (the previous one or the new one) and no temporary remains
// after the next save (issue 17: twelve kills left 1.1 GB of temporaries).
class KilledMidSave : public ::testing::TestWithParam<std::string> {};

TEST_P(KilledMidSave, OldFileLoadsAndNextSaveLeavesNoTemporaries) {
  nntest::ScratchDir dir;
  const std::string path = dir.file("model.safetensors"), ref = dir.file("reference.bin");
  bp::Device& cpu = bp::device("cpu:0");
  const uint64_t seed = bp_test::test_seed("bp_nn_tests") % 1000000;
  bp::manual_seed(seed);
  Linear reference(1024, 1024, true, cpu);
  bp::save(reference, ref);
  const std::string new_bytes = nntest::read_all(ref);
  std::filesystem::remove(ref);
  auto small = make_mlp(cpu);
  std::mt19937_64 rng(bp_test::test_seed("bp_nn_tests"));
  const std::string child = bp_test::beside_exe(BP_SAVE_CHILD_REL);
  int saw_leftover = 0;
  for (int trial = 0; trial < 6; ++trial) {
    bp::save(*small, path);
    const std::string old_bytes = nntest::read_all(path);
    int out[2];
    ASSERT_EQ(::pipe(out), 0);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(out[1], 1);
      ::close(out[0]);
      ::execl(child.c_str(), child.c_str(), path.c_str(), GetParam().c_str(),
              std::to_string(seed).c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ASSERT_GT(pid, 0);
    ::close(out[1]);
    // Wait for one completed save, time the next, then kill at a random point of a later one.
    char c;
    ASSERT_EQ(::read(out[0], &c, 1), 1) << "the child did not save (" << child << ")";
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(::read(out[0], &c, 1), 1);
    const auto period = std::chrono::steady_clock::now() - t0;
    std::uniform_int_distribution<int64_t> when(
        0, 2 * std::chrono::duration_cast<std::chrono::microseconds>(period).count());
    std::this_thread::sleep_for(std::chrono::microseconds(when(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ::close(out[0]);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    const std::string now = nntest::read_all(path);
    EXPECT_TRUE(now == new_bytes || now == old_bytes)
        << "trial " << trial << ": the file is neither the old nor the new one (" << now.size()
        << " bytes)";
    EXPECT_FALSE(bp::load_file(path, cpu).empty());
    saw_leftover += !leftovers(dir.path()).empty();
    bp::save(*small, path);  // the next save
    EXPECT_TRUE(leftovers(dir.path()).empty()) << "trial " << trial;
  }
  std::printf("%s: %d of 6 kills left a temporary that the next save removed\n", GetParam().c_str(),
              saw_leftover);
}

INSTANTIATE_TEST_SUITE_P(AtomicSave, KilledMidSave, ::testing::Values("anonymous", "named"));

// ---- the PyTorch-side fixture -----------------------------------------------------------------

class TorchFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TorchFixtureTest, ForwardMatchesTheStoredOutput) {
  bp::Device& d = bp::device(GetParam());
  auto net = make_mlp(bp::device("cpu:0"));
  const std::string fixture = torch_fixture();
  auto r = bp::load(*net, fixture, d, LoadOptions{.strict = false});
  EXPECT_TRUE(r.missing_keys.empty());
  EXPECT_EQ(r.unexpected_keys, (std::vector<std::string>{"expected_output", "input"}));
  EXPECT_THROW(bp::load(*net, fixture, d), bp::ShapeError);  // strict by default
  auto all = bp::load_file(fixture, d);
  Tensor y = net->forward(all.at("input"));
  EXPECT_EQ(&y.device(), &d);
  const Tensor& want = all.at("expected_output");
  ASSERT_EQ(y.shape(), want.shape());
  EXPECT_TRUE(nntest::close(y.to_vector<double>(), want.to_vector<double>(), 1e-5));
  // Same model built with LazyLinear layers that take their shapes from the file.
  Sequential lazy;
  lazy.add<LazyLinear>(4);
  lazy.add<ReLU>();
  lazy.add<LazyLinear>(1);
  bp::load(lazy, fixture, d, LoadOptions{.strict = false});
  EXPECT_TRUE(
      nntest::close(lazy(all.at("input")).to_vector<double>(), want.to_vector<double>(), 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Devices, TorchFixtureTest, ::testing::ValuesIn(nntest::device_strings()),
                         nntest::param_name);

}  // namespace
