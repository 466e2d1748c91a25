// docs/names.md, walkthrough item 15: 1000 products of 100x100 matrices, recording the Frobenius
// norm of each result, once copying each norm to the host every step (a hidden synchronisation per
// step) and once keeping the log on the device and copying it at the end. The sync-debug mode makes
// the hidden synchronisations of the first version visible.
#include <backplane/backplane.hpp>

#include <chrono>
#include <cstdio>
#include <vector>

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main() try {
  bp::Device& dev = bp::try_device("cuda:0");
  const int steps = 1000;
  auto a = bp::rand({100, 100}, dev), b = bp::rand({100, 100}, dev);
  (void)bp::matmul(a, b).norm().item<float>();  // warm-up

  // 1. Read each norm on the host: every item() waits for the device.
  std::vector<float> host_log;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) host_log.push_back(bp::matmul(a, b).norm().item<float>());
  double per_step_sync = seconds_since(t0);

  // 2. Keep the log on the device; one copy at the end.
  std::vector<bp::Tensor> device_log;
  device_log.reserve(steps);
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) device_log.push_back(bp::matmul(a, b).norm().reshape({1}));
  std::vector<float> at_end = bp::cat(device_log, 0).to_vector<float>();
  double one_sync = seconds_since(t0);

  std::printf("device %s: %d steps\n", dev.str().c_str(), steps);
  std::printf("  norm copied to the host every step: %8.2f ms\n", per_step_sync * 1e3);
  std::printf("  log kept on the device, one copy:   %8.2f ms (%.1fx faster)\n", one_sync * 1e3,
              per_step_sync / one_sync);
  std::printf("  same values: %s\n", host_log == at_end ? "yes" : "no");

  // The sync-debug mode reports the implicit synchronisation of version 1.
  bp::set_sync_debug(bp::SyncDebug::error);
  try {
    (void)bp::matmul(a, b).norm().item<float>();
    std::printf("  sync-debug: no report (%s keeps its data in host memory)\n", dev.str().c_str());
  } catch (const bp::SyncError& e) {
    std::printf("  sync-debug=error reports: %s\n", e.what());
  }
  return 0;
} catch (const bp::Error& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
