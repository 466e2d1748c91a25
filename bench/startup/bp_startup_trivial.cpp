// The trivial CPU program of bp-bench-startup: one op on the default device and one read back.
#include <backplane/backplane.hpp>

int main() {
  bp::Tensor t = bp::ones({4}) + 1.0;
  return t.to_vector<float>()[3] == 2.0f ? 0 : 1;
}
