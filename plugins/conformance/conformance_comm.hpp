// bp-conformance's communicator suite: proves a communicator plugin (comm_abi.h) through its
// C table alone, with N rank processes started by the tool (README.md, "Communicator suite").
//
// Note [Communicator suite processes]
//   The parent hosts a TCP store on 127.0.0.1 (port 0) and re-executes itself N times with
//   --comm-child; each child is one rank: it loads the plugin with the loader's checks, joins a
//   communicator through the store, runs the same test list in the same order as every other
//   rank (so the collectives match), and writes one tab-separated result line per test to its
//   stdout. The parent merges them: a test passes when it passed on every rank, fails naming the
//   first rank that failed, and a rank that crashes or makes no progress for --timeout seconds
//   fails the test it was in (the others are stopped).
#pragma once

#include <string>
#include <vector>

namespace bpc {

// True when argv asks for the communicator suite (--comm or --comm-child).
bool is_comm_invocation(int argc, char** argv);
// The whole communicator mode (parent or child). Returns the exit status.
int comm_main(int argc, char** argv);

// One rank (conformance_comm_tests.cpp).
struct CommChildOptions {
  std::string plugin;  // name or path
  std::string device;  // "cpu:0"; "" = the plugin's first device type, index 0
  int rank = 0, world = 1, store_port = 0;
  uint64_t seed = 0;
  double timeout_s = 120;
  std::vector<std::string> filters;
  bool list = false;  // print the test names, run nothing
};
int comm_child_main(const CommChildOptions& o);

}  // namespace bpc
