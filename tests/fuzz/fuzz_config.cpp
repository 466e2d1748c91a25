// libFuzzer target: the config file, read through exactly the code path of BACKPLANE_CONFIG
// (bp::Config::load(): config_file_path() then the TOML reader). Each input becomes the
// contents of an in-memory file (memfd) that BACKPLANE_CONFIG names. Any input must either give
// a configuration or throw bp::IOError naming the file; no crash (AddressSanitizer), no other
// exception. An accepted file's settings are the ones the grammar allows.
#include <backplane/errors.hpp>
#include <backplane/runtime.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

int g_fd = -1;
std::string g_path;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  for (const char* v : {"BACKPLANE_DEVICE", "BACKPLANE_PLUGINS", "BACKPLANE_ALLOW_TF32",
                        "BACKPLANE_SYNC_DEBUG", "BACKPLANE_PLUGIN_PATH"})
    unsetenv(v);
  g_fd = memfd_create("bp-fuzz-config.toml", MFD_CLOEXEC);
  check(g_fd >= 0);
  g_path = "/proc/self/fd/" + std::to_string(g_fd);
  setenv("BACKPLANE_CONFIG", g_path.c_str(), 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  check(ftruncate(g_fd, 0) == 0);
  size_t done = 0;
  while (done < size) {
    ssize_t n = pwrite(g_fd, data + done, size - done, static_cast<off_t>(done));
    check(n > 0);
    done += static_cast<size_t>(n);
  }
  bp::Config c;
  try {
    c = bp::Config::load();
  } catch (const bp::IOError& e) {
    check(std::string(e.what()).find(g_path) != std::string::npos);
    return 0;
  }
  check(c.source == g_path);
  check(c.sync_debug.empty() || c.sync_debug == "warn" || c.sync_debug == "error");
  return 0;
}
