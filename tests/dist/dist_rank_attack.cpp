// Scenario "attacked --script PATH [--seed N]": both ranks run checked all-reduces while rank 0
// runs the store attack script (store_attack.py) against the group's own store; the group must
// be unharmed: every result right, no rank failing, and the script reporting every attack
// refused. The store is the one BACKPLANE_INIT names (bp-run's, or rank 0's with --init).
#include "dist_rank.hpp"

#include <backplane_test/seed.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>

namespace bpt {

namespace {
namespace d = bp::dist;

std::string arg_of(const std::vector<std::string>& args, const char* name) {
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == name) return args[i + 1];
  return "";
}
}  // namespace

int run_attacked(const std::vector<std::string>& args) {
  d::init_process_group();
  Checker ck;
  ck.rank = d::get_rank();
  // Rank 0's seed for every rank (each process draws its own unless BP_TEST_SEED is set).
  bp::Tensor shared = bp::full(
      {1}, ck.rank == 0 ? static_cast<double>(bp_test::test_seed("bp_dist_rank") >> 12) : 0.0,
      bp::device("cpu:0"), bp::DType::f64);
  d::broadcast(shared, 0).wait();
  ck.seed = static_cast<uint64_t>(shared.to_vector<double>()[0]);
  const int world = d::get_world_size();
  pid_t attacker = -1;
  if (ck.rank == 0) {
    std::string init = std::getenv("BACKPLANE_INIT");  // tcp://127.0.0.1:PORT
    std::string port = init.substr(init.rfind(':') + 1);
    std::string script = arg_of(args, "--script"), seed = std::to_string(ck.seed & 0xffffffffu);
    attacker = ::fork();
    if (attacker == 0) {
      ::execlp("python3", "python3", script.c_str(), "127.0.0.1", port.c_str(), seed.c_str(),
               static_cast<char*>(nullptr));
      std::_Exit(127);
    }
  }
  // One generator per rank, drawn in step: each rank knows every rank's values.
  std::vector<bp::Generator> gens;
  for (int r = 0; r < world; ++r) gens.emplace_back(ck.seed + static_cast<uint64_t>(r));
  int attack_status = -1;
  int64_t rounds = 0;
  for (;; ++rounds) {
    const int64_t n = 1 + rounds % 97;
    bp::Tensor mine;
    std::vector<double> want(static_cast<size_t>(n), 0.0);
    for (int r = 0; r < world; ++r) {
      bp::Tensor v = bp::uniform({n}, -1.0, 1.0, bp::device("cpu:0"), bp::DType::f64,
                                 &gens[static_cast<size_t>(r)]);
      if (r == ck.rank) mine = v.clone();
      auto vv = v.to_vector<double>();
      for (size_t i = 0; i < vv.size(); ++i) want[i] += vv[i];
    }
    d::all_reduce(mine).wait();
    auto got = mine.to_vector<double>();
    bool same = true;
    for (size_t i = 0; i < got.size(); ++i) same = same && std::abs(got[i] - want[i]) <= 1e-12;
    if (same)
      ck.pass("all_reduce round " + std::to_string(rounds));
    else
      ck.fail("all_reduce round " + std::to_string(rounds), "wrong sum during the attack");
    // Stop together once the attack is over (rank 0 knows).
    double done = 0;
    if (ck.rank == 0 && attacker > 0) {
      int st = 0;
      if (::waitpid(attacker, &st, WNOHANG) == attacker) {
        attack_status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        attacker = -1;
      }
      done = attacker < 0 ? 1 : 0;
    }
    bp::Tensor flag = bp::full({1}, done, bp::device("cpu:0"), bp::DType::f64);
    d::all_reduce(flag, d::ReduceOp::max).wait();
    if (flag.to_vector<double>()[0] > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (ck.rank == 0) {
    if (attack_status == 0)
      ck.pass("store_attack.py");
    else
      ck.fail("store_attack.py", "exit status " + std::to_string(attack_status));
  }
  d::barrier();
  d::destroy_process_group();
  std::printf("rank %d: unharmed after %lld all-reduce rounds under attack\n", ck.rank,
              static_cast<long long>(rounds + 1));
  return ck.finish("attacked");
}

}  // namespace bpt
