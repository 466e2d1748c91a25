// The device-string grammar (Note [Device strings] in core/src/runtime/device_string.cpp).
#include <gtest/gtest.h>
#include <backplane/backplane.hpp>

#include <string>

namespace {

void expect_invalid(const std::string& spec, const std::string& fragment) {
  try {
    bp::parse_device_string(spec);
    FAIL() << "'" << spec << "' parsed but should not";
  } catch (const bp::DeviceError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(fragment), std::string::npos) << "message: " << msg;
    EXPECT_NE(msg.find("expected 'type[:index]'"), std::string::npos) << "message: " << msg;
  }
}

TEST(DeviceString, ValidForms) {
  auto s = bp::parse_device_string("cuda:1");
  EXPECT_EQ(s.type, "cuda");
  EXPECT_EQ(s.index, 1);
  s = bp::parse_device_string("cuda");
  EXPECT_EQ(s.type, "cuda");
  EXPECT_EQ(s.index, 0);
  s = bp::parse_device_string("my_accel2:12");
  EXPECT_EQ(s.type, "my_accel2");
  EXPECT_EQ(s.index, 12);
  s = bp::parse_device_string("cpu:0");
  EXPECT_EQ(s.index, 0);
}

TEST(DeviceString, InvalidForms) {
  expect_invalid("cuda:-1", "must not have a sign");
  expect_invalid("cuda:+1", "must not have a sign");
  expect_invalid("cuda:01", "leading zeros");
  expect_invalid("cuda:", "index after ':' is missing");
  expect_invalid("CUDA:0", "lower-case");
  expect_invalid("cuda:1x", "is not a number");
  expect_invalid("", "empty");
  expect_invalid(":0", "type before ':' is missing");
  expect_invalid("cu da", "not allowed");
  expect_invalid("0cuda", "must start with a letter");
  expect_invalid("cuda:99999999999", "out of range");
  // Bytes outside printable ASCII are shown escaped: a NUL does not cut the message short
  // (found by fuzz_device_string).
  expect_invalid(std::string("cu\0da:0", 7), "'cu\\x00da:0': character '\\x00' is not allowed");
  expect_invalid("cuda:1\n", "the index '1\\x0a' is not a number");
}

TEST(DeviceString, CudaEqualsCudaZeroAndCpuResolves) {
  EXPECT_EQ(&bp::device("cpu"), &bp::device("cpu:0"));
  EXPECT_EQ(bp::device("cpu").str(), "cpu:0");
}

TEST(DeviceString, OutOfRangeIndexListsDevices) {
  try {
    bp::device("cpu:3");
    FAIL();
  } catch (const bp::DeviceError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("index out of range"), std::string::npos) << msg;
    EXPECT_NE(msg.find("devices: cpu:0"), std::string::npos) << msg;
  }
}

TEST(DeviceString, UnknownTypeNamesKnownTypes) {
  try {
    bp::device("tpu:0");
    FAIL();
  } catch (const bp::DeviceError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("unknown device type 'tpu'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("known device types: cpu"), std::string::npos) << msg;
  }
}

TEST(DeviceString, TryDeviceFallsBackToCpu) {
  EXPECT_EQ(&bp::try_device("cuda:10"), &bp::device("cpu:0"));
  EXPECT_EQ(&bp::try_device("nosuchtype:3"), &bp::device("cpu:0"));
  auto all = bp::all_devices("nosuchtype");
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0]->str(), "cpu:0");
  EXPECT_EQ(bp::num_devices("nosuchtype"), 0);
  EXPECT_THROW(bp::try_device("CUDA:1"), bp::DeviceError);  // malformed is still an error
}

}  // namespace
