// Child process for loader tests: resolves a device through the real registry (with whatever
// BACKPLANE_* environment the test set) and runs a tiny computation on it.
// Prints "device=<str> values=<v0> <v1> ..." or "error=<message>". With a second argument
// "native", then one line per native-handle call (plugin ABI 1.2):
// "<call>: ok" or "<call>: <error class>: <message>".
#include <backplane/backplane.hpp>

#include <cstdio>
#include <cstring>
#include <functional>

namespace {

void report(const char* call, const std::function<void()>& f) {
  try {
    f();
    std::printf("%s: ok\n", call);
  } catch (const bp::UnsupportedError& e) {
    std::printf("%s: UnsupportedError: %s\n", call, e.what());
  } catch (const bp::Error& e) {
    std::printf("%s: Error: %s\n", call, e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    bp::Device& d = argc > 1 ? bp::device(argv[1]) : bp::default_device();
    bp::Tensor a = bp::full({5}, 2.5, d);
    bp::Tensor b = bp::full({5}, 3.25, d);
    bp::Tensor c = a + b + 1.0;
    std::printf("device=%s values=", d.str().c_str());
    for (float v : c.to_vector<float>()) std::printf("%g ", v);
    std::printf("\n");
    if (argc > 2 && std::strcmp(argv[2], "native") == 0) {
      report("buffer_native", [&] { (void)c.native(); });
      report("stream_native", [&] { (void)d.default_stream().native_handle(); });
      float host[4] = {1, 2, 3, 4};
      int released = 0;
      report("buffer_import",
             [&] { (void)d.import_buffer(host, sizeof host, [&] { ++released; }); });
      report("stream_import", [&] { (void)d.import_stream(nullptr); });
      std::printf("released=%d\n", released);
    }
    return 0;
  } catch (const bp::Error& e) {
    std::printf("error=%s\n", e.what());
    return 1;
  }
}
