// The rank program of the distributed tests (bp_dist_rank): one process of a group started by
// bp-run (or by the netns script), running a scenario and checking its own results.
#pragma once

#include <backplane/backplane.hpp>
#include <backplane/dist.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace bpt {

// Counts checks; each prints one line so a failure names the case, the rank and the seed.
struct Checker {
  int rank = 0;
  uint64_t seed = 0;
  int passed = 0, failed = 0;
  void pass(const std::string& name) {
    ++passed;
    if (std::getenv("BP_DIST_VERBOSE")) std::printf("PASS %s\n", name.c_str());
  }
  void fail(const std::string& name, const std::string& why) {
    ++failed;
    std::printf("FAIL %s (rank %d, seed %llu): %s\n", name.c_str(), rank,
                static_cast<unsigned long long>(seed), why.c_str());
    std::fflush(stdout);
  }
  int finish(const char* scenario) {
    std::printf("rank %d: %s: %d checks passed, %d failed (seed %llu)\n", rank, scenario, passed,
                failed, static_cast<unsigned long long>(seed));
    std::fflush(stdout);
    return failed ? 1 : 0;
  }
};

// --seed N, else BP_TEST_SEED, else a fresh seed drawn by rank 0 and broadcast (printed by the
// scenarios so that a failure can be repeated). Needs an initialised group.
uint64_t shared_seed(const std::vector<std::string>& args);

// Scenarios (dist_rank_*.cpp). Each returns the process's exit status.
int run_collectives(const std::vector<std::string>& args);
int run_fault(const std::string& name, const std::vector<std::string>& args);
int run_ddp(const std::vector<std::string>& args);
int run_attacked(const std::vector<std::string>& args);
int run_shrink(const std::vector<std::string>& args);

}  // namespace bpt
