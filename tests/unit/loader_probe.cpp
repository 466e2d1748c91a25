// Child process for loader tests: resolves a device through the real registry (with whatever
// BACKPLANE_* environment the test set) and runs a tiny computation on it.
// Prints "device=<str> values=<v0> <v1> ..." or "error=<message>".
#include <backplane/backplane.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  try {
    bp::Device& d = argc > 1 ? bp::device(argv[1]) : bp::default_device();
    bp::Tensor a = bp::full({5}, 2.5, d);
    bp::Tensor b = bp::full({5}, 3.25, d);
    bp::Tensor c = a + b + 1.0;
    std::printf("device=%s values=", d.str().c_str());
    for (float v : c.to_vector<float>()) std::printf("%g ", v);
    std::printf("\n");
    return 0;
  } catch (const bp::Error& e) {
    std::printf("error=%s\n", e.what());
    return 1;
  }
}
