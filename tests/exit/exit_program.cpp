// Leaves the process with work queued on every device (Note [Exit] in registry.cpp): the first
// op of each (op, dtype) on a device may still be compiling on the plugin's own thread (PoCL) when
// the exit handlers and static destructors run. Usage: exit_program return|exit|thread-exit
//   return       returns from main with the tensors dropped and their work still queued
//   exit         calls std::exit(0) with the tensors alive
//   thread-exit  a second thread queues the work and calls std::exit(0)
// Prints "queued on N devices" before leaving; the caller checks the exit status and the line.
#include <backplane/backplane.hpp>
#include <backplane_test/seed.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

// rand -> exp -> sqrt -> matmul -> sum on each device, nothing read back.
std::vector<bp::Tensor> queue_everywhere() {
  bp::manual_seed(bp_test::test_seed("exit_program"));
  std::vector<bp::Tensor> keep;
  for (bp::Device* d : bp::devices()) {
    bp::Tensor x = bp::rand({96, 96}, *d);
    bp::Tensor y = x.exp().sqrt();
    keep.push_back(y.matmul(x).sum());
  }
  std::printf("queued on %zu devices\n", keep.size());
  std::fflush(stdout);
  return keep;
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  if (std::strcmp(mode, "return") == 0) {
    queue_everywhere();
    return 0;
  }
  if (std::strcmp(mode, "exit") == 0) {
    std::vector<bp::Tensor> keep = queue_everywhere();
    std::exit(0);
  }
  if (std::strcmp(mode, "thread-exit") == 0) {
    std::thread t([] {
      std::vector<bp::Tensor> keep = queue_everywhere();
      std::exit(0);
    });
    t.join();
    return 1;  // not reached
  }
  std::fprintf(stderr, "usage: exit_program return|exit|thread-exit\n");
  return 2;
}
