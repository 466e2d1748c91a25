// docs/names.md, walkthrough items 11-12 on the best device found (the first GPU, else the CPU): a
// Sequential with LazyLinear(1) on that device, its output and weight device, saved to
// net.safetensors in the working folder and loaded into a fresh model directly onto the device.
#include <backplane/backplane.hpp>
#include <backplane/nn.hpp>
#include <backplane/serialize.hpp>

#include <iostream>

int main() try {
  bp::Device& gpu = bp::try_device("cuda:0");
  std::cout << "Using " << gpu.str() << " (" << gpu.properties().name << ")\n\n";

  // 11. A dense layer whose input size is inferred on first use, in a sequential container,
  //     moved to the device; GPU input gives GPU output and the weight reports the device.
  bp::manual_seed(0);
  bp::nn::Sequential net;
  net.add<bp::nn::LazyLinear>(1);
  net.to(gpu);
  std::cout << "before the first call:\n" << net << "\n\n";

  auto X = bp::rand({2, 20}, gpu);
  auto Y = net(X);
  std::cout << "net(X) =\n" << Y << "\n";
  std::cout << "after the first call:\n" << net << "\n";
  std::cout << "net[0].weight().device() = " << net.get<bp::nn::Linear>(0).weight().device().str()
            << "\n\n";

  // 12. Save the parameters, load them into a fresh model directly onto the device, and check
  //     that the outputs are the same.
  bp::save(net, "net.safetensors");
  std::cout << "saved net.safetensors:";
  for (const auto& [key, t] : net.state_dict())
    std::cout << "  " << key << " " << bp::dtype_name(t.dtype());
  std::cout << "\n";

  bp::nn::Sequential clone;
  clone.add<bp::nn::LazyLinear>(1);  // shapes come from the file
  bp::load(clone, "net.safetensors", gpu);
  auto Y_clone = clone(X);
  std::cout << "clone(X) =\n" << Y_clone << "\n";
  std::cout << "clone[0].weight().device() = "
            << clone.get<bp::nn::Linear>(0).weight().device().str() << "\n";
  bool same = bp::allclose(Y_clone, Y, 0.0, 0.0);
  std::cout << "Y_clone == Y: " << std::boolalpha << same << "\n";
  return same ? 0 : 1;
} catch (const bp::Error& e) {
  std::cerr << "error: " << e.what() << "\n";
  return 1;
}
