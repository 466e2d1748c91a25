// compare.hpp as gtest assertions: EXPECT_TRUE(bp_test::all_close(dtype, got, ref)) prints the
// verdict's message on failure.
#ifndef BACKPLANE_TEST_GTEST_COMPARE_HPP_
#define BACKPLANE_TEST_GTEST_COMPARE_HPP_

#include <backplane_test/compare.hpp>

#include <gtest/gtest.h>

#include <span>
#include <vector>

namespace bp_test {

inline ::testing::AssertionResult as_assertion(const Verdict& v) {
  if (v.ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << v.message;
}

inline ::testing::AssertionResult all_close(int32_t dtype, std::span<const double> got,
                                            std::span<const double> ref,
                                            const Tolerance& tol = {}) {
  return as_assertion(compare(dtype, got, ref, tol));
}

inline ::testing::AssertionResult all_close(int32_t dtype, const std::vector<double>& got,
                                            const std::vector<double>& ref,
                                            const Tolerance& tol = {}) {
  return as_assertion(compare(dtype, got, ref, tol));
}

inline ::testing::AssertionResult scalar_close(int32_t dtype, double got, double ref,
                                               const Tolerance& tol = {}) {
  return as_assertion(compare_scalar(dtype, got, ref, tol));
}

}  // namespace bp_test

#endif  // BACKPLANE_TEST_GTEST_COMPARE_HPP_
