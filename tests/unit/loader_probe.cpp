// Child process for loader tests: resolves a device through the real registry (with whatever
// BACKPLANE_* environment the test set) and runs a tiny computation on it.
// Prints "device=<str> values=<v0> <v1> ..." or "error=<message>".
//
// With a second argument "alpha" it also prints add_ with alpha: "alpha=-2 -2 -2" (one kernel
// with attribute ALPHA on plugins of minor 2, mul then add on older ones), and 0.5 + that, a
// launch with two attributes (which plugins of minor < 2 must get in their own layout).
//
// With a second argument "unsupported" it makes an f64 tensor, which the fixture plugins lack,
// and prints "unsupported=<the UnsupportedError>".
//
// With a second argument "streams" it also allocates a buffer on a stream of its own, drops
// the Stream object while the buffer lives, reads the buffer through the default stream and
// drops it: the buffer must be freed on its own stream, which must still exist then (the
// fixture plugin's mem_free checks both; core reports a failed free on stderr).
//
// With a second argument "native", then one line per native-handle call (plugin ABI 1.2):
// "<call>: ok" or "<call>: <error class>: <message>".
#include <backplane/backplane.hpp>

#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

namespace {

void streams(bp::Device& d) {
  const std::vector<float> in = {1.5f, -2.0f, 4.25f, 8.0f};
  const uint64_t bytes = in.size() * sizeof(float);
  std::unique_ptr<bp::Stream> s = d.create_stream();
  std::shared_ptr<bp::Buffer> buf = d.allocator().allocate(bytes, *s);
  d.copy_from_host(*s, *buf, 0, in.data(), bytes);
  s->synchronize();
  s.reset();  // the Stream object goes; the plugin stream lives on for `buf`
  std::vector<float> out(in.size());
  d.copy_to_host(d.default_stream(), out.data(), *buf, 0, bytes);
  d.default_stream().synchronize();
  buf.reset();  // freed on its own stream, which is then destroyed
  std::printf("streams=");
  for (float v : out) std::printf("%g ", v);
  std::printf("\n");
}

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
    if (argc > 2 && std::strcmp(argv[2], "streams") == 0) streams(d);
    if (argc > 2 && std::strcmp(argv[2], "unsupported") == 0) {
      try {
        bp::full({2}, 1.0, d, bp::DType::f64);  // in fill's domain, not in the fixture
        std::printf("unsupported=none\n");
      } catch (const bp::UnsupportedError& e) {
        std::printf("unsupported=%s\n", e.what());
      }
    }
    if (argc > 2 && std::strcmp(argv[2], "alpha") == 0) {
      bp::Tensor t = bp::full({3}, 1.0, d);
      t.add_(bp::full({3}, 2.0, d), -1.5);
      std::printf("alpha=");
      for (float v : t.to_vector<float>()) std::printf("%g ", v);
      std::printf("\n");
      bp::Tensor r = 0.5 + t;  // two attributes: SCALAR and REVERSE
      std::printf("reverse=");
      for (float v : r.to_vector<float>()) std::printf("%g ", v);
      std::printf("\n");
    }
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
