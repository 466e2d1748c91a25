// Error-path checks shared by the test binaries: the exact exception type and its message.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

namespace bp_test {

// Runs f and returns the message of the E it throws; a test failure (and "") when it throws
// another type or nothing.
template <class E, class F>
std::string expect_throw(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no exception";
  return "";
}

}  // namespace bp_test

// EXPECT that `text` (a message) contains `fragment`.
#define EXPECT_HAS(text, fragment)                               \
  EXPECT_NE(std::string(text).find(fragment), std::string::npos) \
      << (text) << " lacks: " << (fragment)
