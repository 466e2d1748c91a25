// bp_dist_rank SCENARIO [args]: one rank of a distributed test (dist_rank.hpp).
//   collectives [--device D] [--seed N] [--only GROUP]
//   fault NAME [--port P] [--marker FILE]
//   ddp [--steps N]
//   attacked --script store_attack.py
//   shrink [--victim R[,R...]] [--kill-step S] [--steps N] [--explicit] [--retire] [--device T]
#include "dist_rank.hpp"

#include <cstdio>

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fprintf(stderr, "usage: bp_dist_rank collectives|fault NAME|ddp [args]\n");
    return 2;
  }
  try {
    if (args[0] == "collectives") return bpt::run_collectives(args);
    if (args[0] == "fault" && args.size() > 1) return bpt::run_fault(args[1], args);
    if (args[0] == "ddp") return bpt::run_ddp(args);
    if (args[0] == "attacked") return bpt::run_attacked(args);
    if (args[0] == "shrink") return bpt::run_shrink(args);
  } catch (const std::exception& e) {
    std::printf("UNCAUGHT %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "bp_dist_rank: unknown scenario '%s'\n", args[0].c_str());
  return 2;
}
