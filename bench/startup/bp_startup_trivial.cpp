// The trivial program of bp-bench-startup: one op and one read back, on the default device or
// on the device named by the first argument (e.g. cuda:0). With --all-plugins it first lists
// every device, which opens every installed plugin as Backplane did before plugins were loaded
// on demand (Note [Loading on demand] in core/src/runtime/registry.cpp).
#include <backplane/backplane.hpp>

#include <string>

int main(int argc, char** argv) {
  std::string name;
  bool all_plugins = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--all-plugins")
      all_plugins = true;
    else
      name = a;
  }
  if (all_plugins) (void)bp::devices();
  bp::Tensor t = name.empty() ? bp::ones({4}) + 1.0 : bp::ones({4}, bp::device(name)) + 1.0;
  return t.to_vector<float>()[3] == 2.0f ? 0 : 1;
}
