// Helper of AtomicSave.KilledMidSave* (serialize_test.cpp): saves one deterministic model to
// PATH again and again until it is killed, writing one byte to stdout after each completed
// save. The model is Linear(1024, 1024) initialised from manual_seed(SEED) on cpu:0, so the
// parent can build the same file to compare with.
//
//   bp_save_child PATH anonymous|named SEED
//
// "named" turns off O_TMPFILE (the fallback path of Note [Atomic save]).
#include <backplane/backplane.hpp>
#include <backplane/nn.hpp>
#include <backplane/serialize.hpp>

#include "serialize/serialize_internal.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  if (argc != 4 || (std::string(argv[2]) != "anonymous" && std::string(argv[2]) != "named")) {
    std::fprintf(stderr, "usage: bp_save_child PATH anonymous|named SEED\n");
    return 2;
  }
  if (std::string(argv[2]) == "named") bp::detail::set_anonymous_temporaries(false);
  bp::manual_seed(std::strtoull(argv[3], nullptr, 10));
  bp::nn::Linear net(1024, 1024, true, bp::device("cpu:0"));
  for (;;) {
    bp::save(net, argv[1]);
    if (::write(1, "s", 1) != 1) return 1;
  }
}
