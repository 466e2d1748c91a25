// docs/names.md, walkthrough items 5-10 on the best device found (the first GPU, else the CPU).
#include <backplane/backplane.hpp>

#include <iostream>

int main() try {
  bp::Device& gpu = bp::try_device("cuda:0");
  std::cout << "Using " << gpu.str() << " (" << gpu.properties().name << ")\n\n";

  // 5. A tensor made without a device lives on the default device (the CPU).
  auto x = bp::tensor({1, 2, 3});
  std::cout << "x =\n" << x << "\nx.device() = " << x.device().str() << "\n\n";

  // 6. Created directly on a device.
  auto X = bp::ones({2, 3}, gpu);
  std::cout << "ones(2,3) on " << gpu.str() << ":\n" << X << "\n";
  bp::manual_seed(0);
  auto Y = bp::rand({2, 3}, gpu);
  std::cout << "rand(2,3) on " << gpu.str() << ":\n" << Y << "\n\n";

  // 7. copy_to always copies; to() returns the very same tensor when already there.
  auto y = x.copy_to(gpu);
  auto z = x.to(gpu);
  std::cout << "y = x.copy_to(gpu): y.is_same(y.copy_to(gpu)) = " << std::boolalpha
            << y.is_same(y.copy_to(gpu)) << "\n";
  std::cout << "z.to(gpu).is_same(z) = " << z.to(gpu).is_same(z) << "\n\n";

  // 8. Computing on device-resident tensors keeps the result there.
  std::cout << "(z + 2).exp() + y =\n" << (z + 2).exp() + y << "\n";
  std::cout << "(z + 2).exp() * y =\n" << (z + 2).exp() * y << "\n";
  std::cout << "y ** 2 =\n" << y.pow(2) << "\n\n";

  // 9. Operands on different devices are an error naming both, never a silent copy.
  if (&gpu != &x.device()) {
    try {
      auto bad = x + y;
      std::cout << bad;
    } catch (const bp::DeviceMismatch& e) {
      std::cout << "x + y throws DeviceMismatch: " << e.what() << "\n\n";
    }
  } else {
    std::cout << "(no GPU: x + y on one device is fine)\n\n";
  }

  // 10. Moving back to the host is explicit and copies; reading synchronises.
  auto w = (z + 2).exp() * y;
  auto host = w.cpu();
  std::cout << "w.cpu() =\n" << host << "\nw stays on " << w.device().str() << "\n";
  std::cout << "w.to_vector<float>() = [";
  for (float v : w.to_vector<float>()) std::cout << ' ' << v;
  std::cout << " ]\nw.sum().item<float>() = " << w.sum().item<float>() << "\n";
  return 0;
} catch (const bp::Error& e) {
  std::cerr << "error: " << e.what() << "\n";
  return 1;
}
