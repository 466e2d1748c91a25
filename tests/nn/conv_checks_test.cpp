// The convolutional family's refusals (Note [Convolution checks] in nn_functional.hpp): each bad
// call throws the exact error type with a message naming the op and the rule, before anything
// is allocated or launched. Checks run before kernel lookup, so cpu:0 serves every device.
#include <gtest/gtest.h>
#include <backplane/backplane.hpp>

#include <filesystem>
#include <functional>
#include <string>

#include <unistd.h>

namespace F = bp::nn::functional;

namespace {

bp::Device& cpu() {
  return bp::device("cpu:0");
}

// Runs `f`, which must throw E with `fragment` in its message, and checks that the device's
// allocated bytes did not change.
template <typename E>
void expect_refused(const std::function<void()>& f, const std::string& fragment) {
  const uint64_t before = cpu().memory_stats().allocated;
  try {
    f();
    ADD_FAILURE() << "no exception; expected one containing '" << fragment << "'";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message: " << e.what() << "\nexpected fragment: " << fragment;
  }
  EXPECT_EQ(cpu().memory_stats().allocated, before) << "memory allocated by a refused call";
}

bp::Tensor t(const bp::Shape& s, bp::DType dt = bp::DType::f32) {
  return bp::zeros(s, cpu(), dt);
}

}  // namespace

TEST(ConvChecks, Conv2dChannelsAndGroups) {
  auto x = t({2, 3, 8, 8});
  expect_refused<bp::ShapeError>(
      [&] {
        F::conv2d(x, t({4, 2, 3, 3}));
      },
      "conv2d: input [2x3x8x8] has 3 channels but weight [4x2x3x3]");
  expect_refused<bp::ShapeError>(
      [&] {
        F::conv2d(x, t({4, 2, 3, 3}));
      },
      "input channels = weight.size(1) * groups");
  expect_refused<bp::ShapeError>(
      [&] {
        F::conv2d(t({2, 4, 8, 8}), t({6, 2, 3, 3}), {}, 1, 0, 1, 4);
      },
      "6 output channels, which is not a multiple of groups=4");
  expect_refused<bp::ShapeError>(
      [&] {
        F::conv2d(x, t({4, 3, 3, 3}), {}, 1, 0, 1, 0);
      },
      "groups must be >= 1, got 0");
  expect_refused<bp::ShapeError>(
      [&] {
        F::conv2d(x, t({4, 3, 3, 3}), t({5}));
      },
      "conv2d: bias must be [4]");
  expect_refused<bp::ShapeError>(
      [&] {
        F::conv2d(t({3, 8}), t({4, 3, 3, 3}));
      },
      "conv2d: input must be [N, C, H, W]");
  expect_refused<bp::ShapeError>(
      [&] {
        F::conv2d(x, t({4, 3, 3}));
      },
      "conv2d: weight must be [out_channels, in_channels / groups");
}

TEST(ConvChecks, Conv2dWindow) {
  auto x = t({1, 3, 5, 5});
  auto w = t({2, 3, 3, 3});
  expect_refused<bp::ShapeError>([&] { F::conv2d(x, w, {}, 0); },
                                 "conv2d: stride must be >= 1, got (0, 0)");
  expect_refused<bp::ShapeError>([&] { F::conv2d(x, w, {}, {1, 0}); }, "stride must be >= 1");
  expect_refused<bp::ShapeError>([&] { F::conv2d(x, w, {}, 1, 0, 0); }, "dilation must be >= 1");
  expect_refused<bp::ShapeError>([&] { F::conv2d(x, w, {}, 1, -1); },
                                 "padding must be >= 0, got (-1, -1)");
  // 5x5 input against a 3x3 kernel dilated by 3 (7x7): no window fits.
  expect_refused<bp::ShapeError>([&] { F::conv2d(x, w, {}, 1, 0, 3); },
                                 "the output would be -1x-1");
  expect_refused<bp::ShapeError>(
      [&] {
        F::conv2d(t({1, 3, 2, 9}), w);
      },
      "each output size must be >= 1");
}

TEST(ConvChecks, Conv2dDtypesAndDevices) {
  expect_refused<bp::DTypeError>(
      [&] {
        F::conv2d(t({1, 3, 5, 5}, bp::DType::i32), t({2, 3, 3, 3}, bp::DType::i32));
      },
      "conv2d: dtype i32 is outside the op's dtype domain");
  expect_refused<bp::DTypeError>(
      [&] {
        F::conv2d(t({1, 3, 5, 5}), t({2, 3, 3, 3}, bp::DType::f64));
      },
      "conv2d");
}

TEST(ConvChecks, Pooling) {
  auto x = t({2, 3, 6, 6});
  expect_refused<bp::ShapeError>([&] { F::max_pool2d(x, 0); },
                                 "max_pool2d: kernel_size must be >= 1");
  expect_refused<bp::ShapeError>([&] { F::max_pool2d(x, 2, bp::nn::Pair2(0)); },
                                 "max_pool2d: stride must be >= 1");
  expect_refused<bp::ShapeError>(
      [&] { F::max_pool2d(x, 2, {}, 2); },
      "max_pool2d: padding (2, 2) must be at most half the kernel size (2, 2)");
  expect_refused<bp::ShapeError>([&] { F::max_pool2d(x, 3, {}, -1); }, "padding must be >= 0");
  expect_refused<bp::ShapeError>([&] { F::max_pool2d(x, 7); }, "max_pool2d: input [2x3x6x6]");
  expect_refused<bp::ShapeError>([&] { F::avg_pool2d(x, {2, 7}); }, "the output would be 3x0");
  expect_refused<bp::ShapeError>(
      [&] {
        F::avg_pool2d(t({6, 6}), 2);
      },
      "avg_pool2d: input must be [N, C, H, W]");
  expect_refused<bp::ShapeError>(
      [&] {
        F::adaptive_avg_pool2d(x, {0, 2});
      },
      "adaptive_avg_pool2d: output_size must be >= 1");
  expect_refused<bp::ShapeError>(
      [&] {
        F::adaptive_avg_pool2d(t({1, 2, 0, 4}), 1);
      },
      "empty spatial dimension");
  expect_refused<bp::DTypeError>(
      [&] {
        F::max_pool2d(t({1, 1, 4, 4}, bp::DType::i64), 2);
      },
      "max_pool2d: dtype i64 is outside the op's dtype domain");
}

TEST(ConvChecks, BatchNorm) {
  auto x = t({4, 3, 5, 5});
  auto c3 = t({3}), c4 = t({4});
  expect_refused<bp::ShapeError>(
      [&] { F::batch_norm(x, c4, c4); },
      "batch_norm: running_mean must be [3] (the channels of input [4x3x5x5]), got [4]");
  expect_refused<bp::ShapeError>([&] { F::batch_norm(x, c3, c3, c4); }, "weight must be [3]");
  expect_refused<bp::ShapeError>([&] { F::batch_norm(x, {}, {}, {}, {}, false); },
                                 "evaluation mode normalises with running_mean and running_var");
  expect_refused<bp::ShapeError>(
      [&] {
        F::batch_norm(t({1, 3}), c3, c3, {}, {}, true);
      },
      "training needs more than one value per channel");
  expect_refused<bp::ShapeError>([&] { F::batch_norm(t({3}), c3, c3); }, "rank >= 2");
  expect_refused<bp::DTypeError>([&] { F::batch_norm(x, t({3}, bp::DType::i64), c3); },
                                 "running_mean must be floating");
}

TEST(ConvChecks, DropoutAndIndexing) {
  auto x = t({2, 5});
  expect_refused<bp::Error>([&] { F::dropout(x, 1.5); },
                            "dropout: probability p must be in [0, 1], got 1.5");
  expect_refused<bp::ShapeError>(
      [&] {
        bp::max(t({2, 0}), 1);
      },
      "max: dim 1 of input [2x0] is empty");
  expect_refused<bp::ShapeError>([&] { bp::min(x, 2); }, "min: axis 2 is out of range");
  expect_refused<bp::DTypeError>(
      [&] {
        bp::gather(x, 1, t({2, 2}, bp::DType::i32));
      },
      "gather: index must be int64, got i32");
  expect_refused<bp::ShapeError>(
      [&] {
        bp::gather(x, 1, t({3, 2}, bp::DType::i64));
      },
      "gather: index [3x2] is larger than input [2x5] in dim 0");
  expect_refused<bp::ShapeError>([&] { bp::gather(x, 1, t({2}, bp::DType::i64)); },
                                 "must have the rank of input");
  expect_refused<bp::ShapeError>(
      [&] {
        bp::scatter_add(x, 0, t({2, 6}, bp::DType::i64), t({2, 6}));
      },
      "scatter_add: index [2x6] is larger than input [2x5] in dim 1");
  expect_refused<bp::ShapeError>(
      [&] {
        bp::scatter_add(x, 0, t({2, 3}, bp::DType::i64), t({2, 2}));
      },
      "index [2x3] is larger than src [2x2] in dim 1");
  expect_refused<bp::ShapeError>(
      [&] {
        bp::stack({x, t({2, 4})});
      },
      "stack: every tensor must have one shape; tensor 1 is [2x4]");
  expect_refused<bp::ShapeError>(
      [&] {
        bp::cat({x, t({3, 4})}, 1);
      },
      "cat: shape 3x4 does not match 2x5");
  expect_refused<bp::Error>([&] { bp::clamp(x, std::nullopt, std::nullopt); },
                            "clamp: at least one of min and max must be given");
  expect_refused<bp::DTypeError>([&] { bp::var(t({3}, bp::DType::i32)); },
                                 "var: needs a floating dtype");
  expect_refused<bp::DTypeError>([&] { bp::softmax(t({3}, bp::DType::i32), 0); },
                                 "softmax: dtype i32 is outside the op's dtype domain");
}

TEST(ConvChecks, Layers) {
  using namespace bp::nn;
  EXPECT_THROW(Conv2d(3, 4, 3, 1, 0, 1, 2), bp::ShapeError);  // 3 % 2
  expect_refused<bp::ShapeError>(
      [&] { Conv2d(4, 6, 3, 1, 0, 1, 4); },
      "Conv2d: in_channels (4) and out_channels (6) must be multiples of groups (4)");
  expect_refused<bp::ShapeError>([&] { MaxPool2d(2, Pair2(0)); }, "MaxPool2d: stride must be >= 1");
  expect_refused<bp::Error>([&] { Dropout(-0.1); }, "Dropout: probability p must be in [0, 1]");
  BatchNorm2d bn(3, 1e-5, 0.1, true, true, cpu());
  expect_refused<bp::ShapeError>([&] { bn(t({2, 3, 4})); }, "BatchNorm2d: expected a 4-d input");
  expect_refused<bp::ShapeError>([&] { bn(t({2, 4, 2, 2})); }, "has 4 channels, the layer 3");
  Conv2d conv(3, 4, 3, 1, 0, 1, 1, true, cpu());
  expect_refused<bp::ShapeError>(
      [&] {
        conv(t({1, 2, 5, 5}));
      },
      "has 2 channels but weight [4x3x3x3]");
  ModuleList list;
  list.add<ReLU>();
  EXPECT_EQ(list.size(), 1u);
  expect_refused<bp::Error>([&] { list(t({1})); }, "ModuleList is not callable");
  expect_refused<bp::Error>([&] { list[1]; }, "ModuleList: index 1 is out of range (1 modules)");
  expect_refused<bp::ShapeError>(
      [&] {
        Flatten(2, 1)(t({2, 3, 4}));
      },
      "start_dim (2) comes after end_dim (1)");
}

TEST(ConvChecks, LayerStateAndShapes) {
  using namespace bp::nn;
  bp::manual_seed(7);
  Conv2d conv(6, 8, {3, 5}, 2, 1, 1, 2, true, cpu());
  EXPECT_EQ(conv.weight().shape(), (bp::Shape{8, 3, 3, 5}));
  EXPECT_EQ(conv.bias().shape(), (bp::Shape{8}));
  // kaiming_uniform_(a=sqrt(5)): bound 1/sqrt(fan_in), fan_in = 3 * 3 * 5.
  const double bound = 1.0 / std::sqrt(45.0);
  for (double v : conv.weight().to_vector<double>()) EXPECT_LE(std::fabs(v), bound);
  EXPECT_EQ(conv.name(),
            "Conv2d(6, 8, kernel_size=(3, 5), stride=(2, 2), padding=(1, 1), groups=2)");
  BatchNorm2d bn(5, 1e-5, 0.1, true, true, cpu());
  auto sd = bn.state_dict();
  ASSERT_EQ(sd.size(), 5u);
  EXPECT_EQ(sd.at("num_batches_tracked").dtype(), bp::DType::i64);
  EXPECT_EQ(sd.at("num_batches_tracked").rank(), 0);
  EXPECT_EQ(sd.at("running_var").to_vector<double>(), std::vector<double>(5, 1.0));
  EXPECT_EQ(bn.weight().to_vector<double>(), std::vector<double>(5, 1.0));
  EXPECT_EQ(bn.bias().to_vector<double>(), std::vector<double>(5, 0.0));
  std::vector<std::string> keys;
  for (const auto& s : bn.state_spec()) keys.push_back(s.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"weight", "bias", "running_mean", "running_var",
                                            "num_batches_tracked"}));
  Flatten flat;
  EXPECT_EQ(flat(t({2, 3, 4, 5})).shape(), (bp::Shape{2, 60}));
  EXPECT_EQ(Flatten(0, 1)(t({2, 3, 4})).shape(), (bp::Shape{6, 4}));
  Sequential net;
  net.add<Conv2d>(1, 2, 3, 1, 1, 1, 1, true, cpu());
  net.add<BatchNorm2d>(2, 1e-5, 0.1, true, true, cpu());
  net.eval();
  EXPECT_FALSE(net[1].is_training());
  net.train();
  EXPECT_TRUE(net[1].is_training());
}

// A trained Conv2d + BatchNorm2d through safetensors: every key (PyTorch's names, the int64 0-d
// num_batches_tracked included) comes back bit for bit, and the loaded BatchNorm2d continues
// the cumulative average from the loaded count.
TEST(ConvChecks, SaveLoadRoundTrip) {
  using namespace bp::nn;
  if (!cpu().supports(bp::Op::batch_norm, bp::DType::f32)) GTEST_SKIP() << "no batch_norm on cpu:0";
  auto make = [] {
    auto net = std::make_shared<Sequential>();
    net->add<Conv2d>(2, 3, 3, 1, 1, 1, 1, true, cpu());
    net->add<BatchNorm2d>(3, 1e-5, std::nullopt, true, true, cpu());
    return net;
  };
  bp::manual_seed(11);
  auto a = make();
  bp::Tensor x = bp::randn({4, 2, 5, 5}, cpu());
  (*a)(x);
  (*a)(x * 3.0);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("bp_conv_roundtrip_" + std::to_string(::getpid()) + ".safetensors"))
                               .string();
  bp::save(*a, path);
  bp::manual_seed(12);
  auto b = make();
  bp::load(*b, path, cpu());
  std::filesystem::remove(path);
  auto sa = a->state_dict(), sb = b->state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (const auto& [k, t] : sa) {
    ASSERT_TRUE(sb.count(k)) << k;
    EXPECT_EQ(sb.at(k).dtype(), t.dtype()) << k;
    EXPECT_EQ(sb.at(k).to_vector<double>(), t.to_vector<double>()) << k;
  }
  EXPECT_EQ(sb.at("1.num_batches_tracked").item<int64_t>(), 2);
  // A third batch: factor 1/3 in both, so the running statistics stay equal.
  (*a)(x * 0.5);
  (*b)(x * 0.5);
  EXPECT_EQ(a->state_dict().at("1.running_var").to_vector<double>(),
            b->state_dict().at("1.running_var").to_vector<double>());
  EXPECT_EQ(b->state_dict().at("1.num_batches_tracked").item<int64_t>(), 3);
}
