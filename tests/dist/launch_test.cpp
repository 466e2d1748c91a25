// Launcher variables (Note [Launchers] in dist_launch.hpp): each launcher's set, their
// precedence, the errors for malformed or inconsistent values, and Slurm's host lists.
#include <backplane/dist.hpp>

#include <backplane_test/seed.hpp>
#include <backplane_test/throws.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace {

namespace d = bp::dist;
using Env = std::map<std::string, std::string>;

d::LaunchEnv launch(const Env& env) {
  return d::launch_env([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

std::string launch_error(const Env& env) {
  return bp_test::expect_throw<d::RendezvousError>([&] { launch(env); });
}

void expect_launch(const Env& env, const char* launcher, int rank, int size, int local,
                   const std::string& init, const std::string& from) {
  d::LaunchEnv le = launch(env);
  EXPECT_EQ(le.launcher, launcher);
  EXPECT_EQ(le.rank, rank);
  EXPECT_EQ(le.world_size, size);
  EXPECT_EQ(le.local_rank, local);
  EXPECT_EQ(le.init_method, init);
  EXPECT_EQ(le.init_from, from);
}

TEST(Launchers, BpRunVariables) {
  expect_launch({{"BACKPLANE_RANK", "2"},
                 {"BACKPLANE_WORLD_SIZE", "4"},
                 {"BACKPLANE_LOCAL_RANK", "0"},
                 {"BACKPLANE_INIT", "tcp://127.0.0.1:4100"}},
                "bp-run", 2, 4, 0, "tcp://127.0.0.1:4100", "BACKPLANE_INIT");
}

TEST(Launchers, TorchrunVariables) {
  Env env{{"RANK", "5"},
          {"WORLD_SIZE", "8"},
          {"LOCAL_RANK", "1"},
          {"MASTER_ADDR", "node7"},
          {"MASTER_PORT", "29400"}};
  expect_launch(env, "torchrun", 5, 8, 1, "tcp://node7:29400", "MASTER_ADDR/MASTER_PORT");
  // The agent's store holds MASTER_PORT: Backplane's takes the next one.
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  expect_launch(env, "torchrun", 5, 8, 1, "tcp://node7:29401",
                "MASTER_ADDR/MASTER_PORT + 1 (torchrun's agent store holds MASTER_PORT)");
  env["MASTER_ADDR"] = "fe80::1";
  EXPECT_EQ(launch(env).init_method, "tcp://[fe80::1]:29401");
  env.erase("MASTER_PORT");
  EXPECT_HAS(launch_error(env),
             "rank 5 of 8 (from RANK/WORLD_SIZE/LOCAL_RANK, torchrun) has "
             "no rendezvous address: MASTER_PORT is not set: set both");
}

TEST(Launchers, SlurmVariablesAndTheFirstHostOfTheNodeList) {
  Env env{{"SLURM_PROCID", "3"},
          {"SLURM_NTASKS", "8"},
          {"SLURM_LOCALID", "3"},
          {"SLURM_JOB_NODELIST", "gpu-[01-04,07],cpu1"}};
  expect_launch(env, "slurm", 3, 8, 3, "tcp://gpu-01:29500",
                "the first host of SLURM_JOB_NODELIST and the default port 29500");
  env["MASTER_PORT"] = "31337";
  expect_launch(env, "slurm", 3, 8, 3, "tcp://gpu-01:31337",
                "the first host of SLURM_JOB_NODELIST/MASTER_PORT");
  env["MASTER_ADDR"] = "10.0.0.9";  // an explicit address wins over the node list
  expect_launch(env, "slurm", 3, 8, 3, "tcp://10.0.0.9:31337", "MASTER_ADDR/MASTER_PORT");
  env.erase("MASTER_ADDR");
  env["SLURM_JOB_NODELIST"] = "gpu-[01-04";
  EXPECT_HAS(launch_error(env), "Slurm host list 'gpu-[01-04': an unclosed '[' at character 5");
  env.erase("SLURM_JOB_NODELIST");
  EXPECT_HAS(launch_error(env), "neither SLURM_JOB_NODELIST nor MASTER_ADDR names the host");
}

TEST(Launchers, OpenMpiVariablesNeedAnAddress) {
  Env env{{"OMPI_COMM_WORLD_RANK", "1"},
          {"OMPI_COMM_WORLD_SIZE", "2"},
          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}};
  EXPECT_HAS(launch_error(env),
             "rank 1 of 2 (from "
             "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE/OMPI_COMM_WORLD_LOCAL_RANK, openmpi) has "
             "no rendezvous address: MASTER_ADDR and MASTER_PORT are not set: MPI launchers give "
             "each rank its rank and size but no rendezvous address");
  env["MASTER_ADDR"] = "head";
  env["MASTER_PORT"] = "1234";
  expect_launch(env, "openmpi", 1, 2, 1, "tcp://head:1234", "MASTER_ADDR/MASTER_PORT");
  // A group of one needs no address.
  expect_launch({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}}, "openmpi", 0, 1, 0,
                "", "");
}

TEST(Launchers, PmixRankWithTheLaunchersSize) {
  Env env{{"PMIX_RANK", "6"},
          {"SLURM_NTASKS", "7"},
          {"SLURM_LOCALID", "2"},
          {"MASTER_ADDR", "h"},
          {"MASTER_PORT", "9"}};
  expect_launch(env, "pmix", 6, 7, 2, "tcp://h:9", "MASTER_ADDR/MASTER_PORT");
  env.erase("SLURM_NTASKS");
  EXPECT_HAS(launch_error(env),
             "PMIX_RANK is set but OMPI_COMM_WORLD_SIZE or SLURM_NTASKS or PMI_SIZE is not");
  env.erase("MASTER_ADDR");
  env["PMI_SIZE"] = "12";
  EXPECT_HAS(launch_error(env),
             "(from PMIX_RANK/PMI_SIZE/SLURM_LOCALID, pmix) has no rendezvous "
             "address: MASTER_ADDR is not set: MPI launchers");
}

TEST(Launchers, MpichVariables) {
  expect_launch({{"PMI_RANK", "0"},
                 {"PMI_SIZE", "3"},
                 {"MPI_LOCALRANKID", "0"},
                 {"BACKPLANE_INIT", "file:///tmp/x"}},
                "mpich", 0, 3, 0, "file:///tmp/x", "BACKPLANE_INIT");
}

TEST(Launchers, PrecedenceBackplaneTorchrunMpiSlurm) {
  Env env{{"SLURM_PROCID", "0"},
          {"SLURM_NTASKS", "4"},
          {"SLURM_JOB_NODELIST", "n[1-2]"},
          {"PMIX_RANK", "3"},
          {"PMI_SIZE", "4"},
          {"OMPI_COMM_WORLD_RANK", "2"},
          {"OMPI_COMM_WORLD_SIZE", "4"},
          {"MASTER_ADDR", "m"},
          {"MASTER_PORT", "7"}};
  // mpirun inside a Slurm allocation: every rank of a node inherits its daemon's SLURM_PROCID.
  EXPECT_EQ(launch(env).launcher, "openmpi");
  EXPECT_EQ(launch(env).rank, 2);
  env["RANK"] = "1";
  env["WORLD_SIZE"] = "4";
  EXPECT_EQ(launch(env).launcher, "torchrun");
  EXPECT_EQ(launch(env).rank, 1);
  env["BACKPLANE_RANK"] = "0";
  env["BACKPLANE_WORLD_SIZE"] = "4";
  EXPECT_EQ(launch(env).launcher, "bp-run");
  EXPECT_EQ(launch(env).rank, 0);
  for (const char* v : {"BACKPLANE_RANK", "BACKPLANE_WORLD_SIZE", "RANK", "WORLD_SIZE",
                        "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"})
    env.erase(v);
  EXPECT_EQ(launch(env).launcher, "pmix");
  env.erase("PMIX_RANK");
  EXPECT_EQ(launch(env).launcher, "slurm");
  EXPECT_EQ(launch(env).init_method, "tcp://m:7");
  EXPECT_EQ(launch({}).launcher, "");
  EXPECT_EQ(launch({}).world_size, 1);
}

TEST(Launchers, MalformedAndInconsistentValuesNameTheVariable) {
  EXPECT_HAS(launch_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}}),
             "RANK='4' is not below WORLD_SIZE='4': ranks run from 0 to 3");
  EXPECT_HAS(launch_error({{"SLURM_PROCID", "x1"}, {"SLURM_NTASKS", "2"}}),
             "SLURM_PROCID='x1' is not an integer from 0 to");
  EXPECT_HAS(launch_error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "0"}}),
             "OMPI_COMM_WORLD_SIZE='0' is not an integer from 1 to 65536");
  EXPECT_HAS(launch_error({{"RANK", "0"}}), "RANK is set but WORLD_SIZE is not");
  EXPECT_HAS(launch_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}}),
             "LOCAL_RANK='2' is not an integer from 0 to 1 (a local rank is below "
             "WORLD_SIZE='2')");
  EXPECT_HAS(
      launch_error(
          {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "http"}}),
      "MASTER_PORT='http' is not an integer from 1 to 65535 (a TCP port)");
  EXPECT_HAS(launch_error({{"BACKPLANE_WORLD_SIZE", "2"}}),
             "BACKPLANE_WORLD_SIZE is set but BACKPLANE_RANK is not");
  EXPECT_HAS(launch_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}),
             "rank 0 of 2 (from SLURM_PROCID/SLURM_NTASKS, slurm) has no rendezvous address");
}

TEST(SlurmHostlist, ExpandsRangesListsPaddingAndProducts) {
  using V = std::vector<std::string>;
  EXPECT_EQ(d::expand_slurm_hostlist("gpu-[01-04,07],cpu1"),
            (V{"gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-07", "cpu1"}));
  EXPECT_EQ(d::expand_slurm_hostlist("node1"), (V{"node1"}));
  EXPECT_EQ(d::expand_slurm_hostlist("n[8-11]"), (V{"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(d::expand_slurm_hostlist("n[098-101]"), (V{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(d::expand_slurm_hostlist("r[1-2]n[1,3]-ib"),
            (V{"r1n1-ib", "r1n3-ib", "r2n1-ib", "r2n3-ib"}));
  EXPECT_EQ(d::expand_slurm_hostlist("a,[3-4]x,b[5]"), (V{"a", "3x", "4x", "b5"}));
  EXPECT_EQ(d::first_slurm_host("gpu-[01-04,07],cpu1"), "gpu-01");
  EXPECT_EQ(d::first_slurm_host("rack[7-9]-n[002-010]"), "rack7-n002");
  EXPECT_EQ(d::first_slurm_host("login"), "login");
}

TEST(SlurmHostlist, MalformedListsAreRendezvousErrors) {
  auto err = [](const char* list) {
    return bp_test::expect_throw<d::RendezvousError>([&] { d::expand_slurm_hostlist(list); });
  };
  EXPECT_HAS(err("gpu-[01-04"), "an unclosed '[' at character 5");
  EXPECT_HAS(err("gpu-01]"), "a ']' without its '[' at character 7");
  EXPECT_HAS(err("a[1-[2]]"), "a '[' inside brackets at character 5");
  EXPECT_HAS(err("a,,b"), "an empty host name at character 3");
  EXPECT_HAS(err(""), "an empty host name at character 1");
  EXPECT_HAS(err("n[5-3]"), "the range '5-3' runs backwards");
  EXPECT_HAS(err("n[a-3]"), "'a-3' is not a number or a range of numbers (a-b)");
  EXPECT_HAS(err("n[1,]"), "'' is not a number");
  EXPECT_HAS(err("n 1"), "white space at character 2");
  EXPECT_HAS(bp_test::expect_throw<d::RendezvousError>(
                 [] { d::expand_slurm_hostlist("n[0-999999]m[0-999999]"); }),
             "names more than 1048576 hosts");
  EXPECT_HAS(bp_test::expect_throw<d::RendezvousError>([] { d::first_slurm_host("x,[1-"); }),
             "an unclosed '['");
}

// Random lists, compressed the way Slurm prints them, expand to the hosts they came from.
TEST(SlurmHostlist, RandomCompressedListsRoundTrip) {
  auto& g = bp_test::rng("bp_dist_tests");
  for (int trial = 0; trial < 200; ++trial) {
    std::string list;
    std::vector<std::string> expected;
    int names = 1 + static_cast<int>(g() % 4);
    for (int n = 0; n < names; ++n) {
      std::string prefix = std::string(1, static_cast<char>('a' + g() % 26)) + "-";
      if (n) list += ",";
      if (g() % 3 == 0) {  // a plain name
        std::string h = prefix + std::to_string(g() % 1000);
        list += h;
        expected.push_back(h);
        continue;
      }
      size_t width = 1 + g() % 4;
      list += prefix + "[";
      uint64_t next = g() % 20;
      int pieces = 1 + static_cast<int>(g() % 3);
      for (int p = 0; p < pieces; ++p) {
        uint64_t lo = next, hi = lo + g() % 5;
        next = hi + 2 + g() % 5;
        auto pad = [&](uint64_t v) {
          std::string s = std::to_string(v);
          return std::string(s.size() < width ? width - s.size() : 0, '0') + s;
        };
        if (p) list += ',';
        list += pad(lo);
        if (hi > lo) list += '-' + pad(hi);
        for (uint64_t v = lo; v <= hi; ++v) expected.push_back(prefix + pad(v));
      }
      list += "]";
    }
    EXPECT_EQ(d::expand_slurm_hostlist(list), expected) << list;
    EXPECT_EQ(d::first_slurm_host(list), expected.front()) << list;
  }
}

// The process environment reaches init_process_group: torchrun's variables for a group of one.
TEST(Launchers, InitProcessGroupReadsTorchrunVariables) {
  for (const char* v : {"BACKPLANE_RANK", "BACKPLANE_WORLD_SIZE", "BACKPLANE_INIT"})
    ASSERT_EQ(std::getenv(v), nullptr) << v << " is set in the test's environment";
  struct Unset {  // the variables leave with the test, also when it fails
    ~Unset() {
      for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK"}) ::unsetenv(v);
    }
  } unset;
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "1", 1);
  ::setenv("LOCAL_RANK", "0", 1);
  d::init_process_group();
  EXPECT_EQ(d::get_rank(), 0);
  EXPECT_EQ(d::get_world_size(), 1);
  d::destroy_process_group();
  ::setenv("RANK", "1", 1);
  EXPECT_HAS(bp_test::expect_throw<d::RendezvousError>([] { d::init_process_group(); }),
             "RANK='1' is not below WORLD_SIZE='1'");
  EXPECT_FALSE(d::is_initialized());
}

}  // namespace
