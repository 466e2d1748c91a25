// Results of a bp-conformance run: the human-readable line per test, the summary line
// ("N passed, M failed, K skipped"), and the --json / --junit files.
#pragma once

#include "conformance_runner.hpp"

#include <cstdio>
#include <string>
#include <vector>

namespace bpc {

class Report {
 public:
  // With verify_xfail, an XPASS counts as a failure.
  explicit Report(bool verify_xfail) : verify_xfail_(verify_xfail) {}

  // Records a result and prints its line to `out` (when not NULL).
  void add(const Result& r, FILE* out);
  // The counts line, then exactly "N passed, M failed, K skipped".
  void print_summary(FILE* out) const;

  int passed() const;
  int failed() const;
  int skipped() const;  // skip + unsupported + xfail

  // Writes the files; false with *error on an I/O failure.
  bool write_json(const std::string& path, std::string* error) const;
  bool write_junit(const std::string& path, std::string* error) const;

  const std::vector<Result>& results() const { return results_; }

 private:
  int count(Status s) const;
  bool verify_xfail_;
  std::vector<Result> results_;
};

// The line printed for one result.
std::string result_line(const Result& r);

}  // namespace bpc
