// The plugin loader: every broken-plugin fixture gets its own precise report line and never
// stops the others; search order, plugin paths, allow lists, the default device and the config
// file; plugins of ABI 1.0 and 1.1 load and compute through the host.
//
// Everything runs in this process on bp::Registry objects built from explicit options (Note
// [Registries] in runtime.hpp): a library is opened and initialised once per process whichever
// registry loads it, so the fixtures can all be loaded here. One test starts a process:
// ProcessDefault.FollowsTheEnvironment, because the process default registry is built once, on
// first use, from the environment, and this process's was built long before the test could set
// any variable.
#include <gtest/gtest.h>
#include <backplane/backplane.hpp>
#include <backplane_test/child.hpp>
#include <backplane_test/plugin_test.hpp>
#include <plugin_host.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

// Build-tree files found relative to this test binary, so a copied build tree (a bundle run on
// another machine) tests itself and nothing of the original.
const std::string kFixtures = bp_test::beside_exe(BP_FIXTURE_DIR_REL);
const std::string kSmi = bp_test::beside_exe(BP_SMI_REL);
const std::string kPluginDir = bp_test::beside_exe(BP_PLUGIN_DIR_REL);

std::string fixture(const std::string& name) {
  return kFixtures + "/libbackplane-" + name + ".so";
}

// A registry over `paths`, then the plugin folder of this libbackplane (the cpu plugin).
bp::RegistryOptions paths(std::vector<std::string> p) {
  bp::RegistryOptions o;
  o.plugin_paths = std::move(p);
  return o;
}

const bp::PluginReport* line(const bp::Registry& reg, const std::string& path_end) {
  for (const auto& r : reg.report())
    if (r.path.size() >= path_end.size() &&
        r.path.compare(r.path.size() - path_end.size(), path_end.size(), path_end) == 0)
      return &r;
  return nullptr;
}

bool has_device(const bp::Registry& reg, const std::string& dev) {
  for (bp::Device* d : reg.devices())
    if (d->str() == dev) return true;
  return false;
}

// Sets environment variables for one scope and restores them.
class EnvGuard {
 public:
  void set(const char* name, const std::string& value) {
    save(name);
    setenv(name, value.c_str(), 1);
  }
  void unset(const char* name) {
    save(name);
    unsetenv(name);
  }
  ~EnvGuard() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second)
        setenv(it->first.c_str(), it->second->c_str(), 1);
      else
        unsetenv(it->first.c_str());
    }
  }

 private:
  void save(const char* name) {
    const char* v = std::getenv(name);
    saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// The environment of the process default, cleared.
void clear_backplane_env(EnvGuard& env) {
  for (const char* v : {"BACKPLANE_PLUGIN_PATH", "BACKPLANE_PLUGINS", "BACKPLANE_DEVICE",
                        "BACKPLANE_CONFIG", "BACKPLANE_ALLOW_TF32", "BACKPLANE_SYNC_DEBUG"})
    env.unset(v);
}

std::string values(const bp::Tensor& t) {
  std::string out;
  for (float v : t.to_vector<float>()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g ", v);
    out += buf;
  }
  return out;
}

// A tiny computation: 2.5 + 3.25 + 1 on five elements.
std::string compute(bp::Device& d) {
  return values(bp::full({5}, 2.5, d) + bp::full({5}, 3.25, d) + 1.0);
}

void expect_failed(const std::string& name, const std::string& fragment) {
  bp::PluginReport r = bp::inspect_plugin(fixture(name));
  EXPECT_EQ(r.status, bp::PluginReport::Status::failed) << name;
  EXPECT_NE(r.reason.find(fragment), std::string::npos) << name << ": " << r.reason;
  EXPECT_EQ(bp::host::load_plugin(fixture(name)).api, nullptr) << name;
}

TEST(Loader, NotAnElf) {
  expect_failed("notelf", "not an ELF shared object");
}
TEST(Loader, MissingEntrySymbol) {
  expect_failed("noentry", "missing entry symbol bp_plugin_get_api");
}
TEST(Loader, OtherMajorNamesBothVersions) {
  const bp::PluginAbiVersion host = bp::plugin_abi_version();
  expect_failed("major2", "ABI 2." + std::to_string(host.minor) + " vs host " +
                              std::to_string(host.major) + "." + std::to_string(host.minor));
}
TEST(Loader, InitFailureQuotesPluginMessage) {
  expect_failed("initfail", "init failed: initfail init failure: simulated driver error 42");
}
TEST(Loader, MissingDependencyIsNamed) {
  expect_failed("missingdep", "dependency libbpfixturedep.so not found");
}
TEST(Loader, OlderMinorLoads) {
  bp::host::LoadedPlugin p = bp::host::load_plugin(fixture("oldminor"));
  EXPECT_EQ(p.report.status, bp::PluginReport::Status::loaded) << p.report.reason;
  EXPECT_EQ(p.report.abi_major, 1u);
  EXPECT_EQ(p.report.abi_minor, 0u);
  EXPECT_EQ(p.report.device_count, 1);
  ASSERT_NE(p.api, nullptr);
  EXPECT_EQ(p.api->struct_size, BP_API_MINOR1_OFFSET);
}
TEST(Loader, MissingFile) {
  bp::PluginReport r = bp::inspect_plugin(kFixtures + "/does-not-exist.so");
  EXPECT_EQ(r.status, bp::PluginReport::Status::failed);
  EXPECT_NE(r.reason.find("cannot be opened"), std::string::npos) << r.reason;
}
// Both ABI 1.1 fixtures: built from the 1.1 header, and from the current one with traps past
// struct_size.
TEST(Loader, Minor1Loads) {
  for (const char* name : {"minor1", "minor1traps"}) {
    bp::host::LoadedPlugin p = bp::host::load_plugin(fixture(name));
    EXPECT_EQ(p.report.status, bp::PluginReport::Status::loaded) << name << ": " << p.report.reason;
    EXPECT_EQ(p.report.abi_major, 1u) << name;
    EXPECT_EQ(p.report.abi_minor, 1u) << name;
    ASSERT_NE(p.api, nullptr) << name;
    EXPECT_EQ(p.api->struct_size, BP_API_MINOR2_OFFSET) << name;
  }
}

// A library is opened and initialised once per process: the fixture's init fails when called
// a second time, and two registries (and inspect_plugin) share its one table.
TEST(Loader, OneInitPerProcess) {
  bp::Registry a(paths({fixture("fixture")}));
  bp::Registry b(paths({fixture("fixture")}));
  for (bp::Registry* reg : {&a, &b}) {
    const bp::PluginReport* r = line(*reg, "libbackplane-fixture.so");
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->status, bp::PluginReport::Status::loaded) << r->reason;
    EXPECT_EQ(compute(reg->device("fixture:0")), "6.75 6.75 6.75 6.75 6.75 ");
  }
  EXPECT_NE(&a.device("fixture:0"), &b.device("fixture:0"));  // each registry's own devices
  EXPECT_EQ(bp::host::load_plugin(fixture("fixture")).api,
            bp::host::load_plugin(fixture("fixture")).api);
}

TEST(Registry, BrokenPluginsNeverStopTheOthers) {
  bp::Registry reg(paths({kFixtures}));
  struct Expect {
    const char* file;
    bp::PluginReport::Status status;
    std::string fragment;
  } expects[] = {
      {"libbackplane-notelf.so", bp::PluginReport::Status::failed, "not an ELF"},
      {"libbackplane-noentry.so", bp::PluginReport::Status::failed, "missing entry symbol"},
      {"libbackplane-major2.so", bp::PluginReport::Status::failed, "major versions differ"},
      {"libbackplane-initfail.so", bp::PluginReport::Status::failed, "simulated driver error 42"},
      {"libbackplane-missingdep.so", bp::PluginReport::Status::failed,
       "dependency libbpfixturedep.so not found"},
      {"libbackplane-oldminor.so", bp::PluginReport::Status::loaded, ""},
      {"libbackplane-minor1.so", bp::PluginReport::Status::loaded, ""},
      {"libbackplane-fixture.so", bp::PluginReport::Status::loaded, ""},
      {"libbackplane-cpu.so", bp::PluginReport::Status::loaded, ""},
  };
  for (const auto& e : expects) {
    const bp::PluginReport* p = line(reg, e.file);
    ASSERT_NE(p, nullptr) << e.file << " missing from the load report";
    EXPECT_EQ(p->status, e.status) << e.file << ": " << p->reason;
    EXPECT_NE(p->reason.find(e.fragment), std::string::npos) << e.file << ": " << p->reason;
  }
  for (const char* dev : {"cpu:0", "oldminor:0", "minor1:0", "fixture:0"})
    EXPECT_TRUE(has_device(reg, dev)) << dev;
}

TEST(Registry, SearchOrderPutsPathsFirstAndShadowsLaterCopies) {
  fs::path tmp = fs::temp_directory_path() / ("bp-shadow-" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  fs::copy_file(kPluginDir + "/libbackplane-cpu.so", tmp / "libbackplane-cpu.so",
                fs::copy_options::overwrite_existing);
  {
    bp::Registry reg(paths({tmp.string()}));
    const auto& report = reg.report();
    ASSERT_GE(report.size(), 2u);
    EXPECT_EQ(report[0].path, (tmp / "libbackplane-cpu.so").string());
    EXPECT_EQ(report[0].status, bp::PluginReport::Status::loaded) << report[0].reason;
    const bp::PluginReport* builtin = line(reg, "/lib/backplane/plugins/libbackplane-cpu.so");
    ASSERT_NE(builtin, nullptr);
    EXPECT_EQ(builtin->status, bp::PluginReport::Status::skipped);
    EXPECT_NE(builtin->reason.find("shadowed by " + tmp.string()), std::string::npos)
        << builtin->reason;
  }
  fs::remove_all(tmp);
}

TEST(Registry, PluginPathAcceptsFilesAndReportsMissingEntries) {
  bp::Registry reg(paths({fixture("oldminor"), "/no/such/dir"}));
  EXPECT_TRUE(has_device(reg, "oldminor:0"));
  EXPECT_FALSE(has_device(reg, "fixture:0"));
  const bp::PluginReport* missing = line(reg, "/no/such/dir");
  ASSERT_NE(missing, nullptr);
  EXPECT_EQ(missing->status, bp::PluginReport::Status::skipped);
  EXPECT_EQ(missing->reason, "no such file or directory");
}

TEST(Registry, WithoutTheLibraryFolderOnlyThePathsAreSearched) {
  bp::RegistryOptions o = paths({fixture("oldminor")});
  o.search_library_dir = false;
  bp::Registry reg(o);
  ASSERT_EQ(reg.devices().size(), 1u);
  EXPECT_EQ(reg.devices()[0]->str(), "oldminor:0");
  EXPECT_EQ(reg.report().size(), 1u);
  try {
    reg.default_device();  // cpu:0 is the default, and there is no cpu plugin here
    FAIL() << "no cpu:0 in this registry";
  } catch (const bp::DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown device type 'cpu'"), std::string::npos)
        << e.what();
  }
}

TEST(Registry, AllowListRestrictsPlugins) {
  bp::RegistryOptions o = paths({kFixtures});
  o.allow = {"cpu", "oldminor"};
  bp::Registry reg(o);
  EXPECT_TRUE(has_device(reg, "cpu:0"));
  EXPECT_TRUE(has_device(reg, "oldminor:0"));
  EXPECT_FALSE(has_device(reg, "fixture:0"));
  const bp::PluginReport* p = line(reg, "libbackplane-fixture.so");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->status, bp::PluginReport::Status::skipped);
  EXPECT_NE(p->reason.find("allow list"), std::string::npos) << p->reason;
  // Skipped files are never opened: the broken ones show as skipped, not failed.
  const bp::PluginReport* broken = line(reg, "libbackplane-initfail.so");
  ASSERT_NE(broken, nullptr);
  EXPECT_EQ(broken->status, bp::PluginReport::Status::skipped);
}

TEST(Registry, DenyListDropsPlugins) {
  bp::RegistryOptions o = paths({kFixtures});
  o.deny = {"fixture"};
  bp::Registry reg(o);
  EXPECT_FALSE(has_device(reg, "fixture:0"));
  EXPECT_TRUE(has_device(reg, "oldminor:0"));
  const bp::PluginReport* p = line(reg, "libbackplane-fixture.so");
  ASSERT_NE(p, nullptr);
  EXPECT_NE(p->reason.find("deny list"), std::string::npos) << p->reason;
}

TEST(Registry, DefaultDeviceFromEnvironment) {
  EnvGuard env;
  clear_backplane_env(env);
  env.set("BACKPLANE_PLUGIN_PATH", kFixtures);
  env.set("BACKPLANE_DEVICE", "oldminor:0");
  {
    bp::Registry reg(bp::RegistryOptions::from_environment());
    EXPECT_EQ(reg.default_device().str(), "oldminor:0");
  }
  env.set("BACKPLANE_DEVICE", "cpu:7");
  bp::Registry reg(bp::RegistryOptions::from_environment());
  try {
    reg.default_device();
    FAIL() << "cpu:7 does not exist";
  } catch (const bp::DeviceError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("default device from BACKPLANE_DEVICE"), std::string::npos) << msg;
    EXPECT_NE(msg.find("index out of range"), std::string::npos) << msg;
  }
}

TEST(Registry, ConfigFileAddsPluginPathsAndEnvironmentWins) {
  EnvGuard env;
  clear_backplane_env(env);
  fs::path cfg = fs::temp_directory_path() / ("bp-config-" + std::to_string(::getpid()) + ".toml");
  {
    std::ofstream f(cfg);
    f << "device = \"fixture:0\"\n[plugins]\npaths = [\"" << kFixtures << "\"]\n";
  }
  env.set("BACKPLANE_CONFIG", cfg.string());
  {
    bp::Registry reg(bp::RegistryOptions::from_environment());
    EXPECT_TRUE(has_device(reg, "fixture:0"));
    EXPECT_EQ(reg.default_device().str(), "fixture:0");
  }
  env.set("BACKPLANE_DEVICE", "oldminor:0");
  {
    bp::Registry reg(bp::RegistryOptions::from_environment());
    EXPECT_EQ(reg.default_device().str(), "oldminor:0");
  }
  fs::remove(cfg);
}

// add_ with alpha and a launch with two attributes (SCALAR and REVERSE), which plugins of
// minor < 2 must get in their own layout.
std::string alpha_and_reverse(bp::Device& d) {
  bp::Tensor t = bp::full({3}, 1.0, d);
  t.add_(bp::full({3}, 2.0, d), -1.5);
  bp::Tensor r = 0.5 + t;
  return "alpha=" + values(t) + "reverse=" + values(r);
}

TEST(Registry, OlderMinorPluginComputesThroughTheHost) {
  // ABI 1.0, no events, no list_ops: the host's documented defaults apply. Both older minors
  // are built from the 1.1 header: names only (find_kernel), attributes of the old layout, and
  // add_ with alpha as mul then add.
  for (std::string name : {"oldminor", "minor1"}) {
    bp::Registry reg(paths({fixture(name)}));
    bp::Device& d = reg.device(name + ":0");
    EXPECT_EQ(compute(d), "6.75 6.75 6.75 6.75 6.75 ") << name;
    EXPECT_EQ(alpha_and_reverse(d), "alpha=-2 -2 -2 reverse=-1.5 -1.5 -1.5 ") << name;
  }
}

// The current-ABI fixture gets add_ with alpha as one kernel with attribute ALPHA.
TEST(Registry, AlphaReachesAPluginOfMinor2) {
  bp::Registry reg(paths({fixture("fixture")}));
  EXPECT_EQ(alpha_and_reverse(reg.device("fixture:0")), "alpha=-2 -2 -2 reverse=-1.5 -1.5 -1.5 ");
}

// A buffer is freed on the stream it was allocated on, which outlives its Stream object until
// then (plugin_abi.h, mem_free). The fixture fails a free on another or a destroyed stream, and
// core reports a failed free on stderr.
TEST(Registry, BufferIsFreedOnItsOwnStream) {
  bp::Registry reg(paths({fixture("fixture")}));
  bp::Device& d = reg.device("fixture:0");
  const std::vector<float> in = {1.5f, -2.0f, 4.25f, 8.0f};
  const uint64_t bytes = in.size() * sizeof(float);
  std::vector<float> out(in.size());
  testing::internal::CaptureStderr();
  {
    std::unique_ptr<bp::Stream> s = d.create_stream();
    std::shared_ptr<bp::Buffer> buf = d.allocator().allocate(bytes, *s);
    d.copy_from_host(*s, *buf, 0, in.data(), bytes);
    s->synchronize();
    s.reset();  // the Stream object goes; the plugin stream lives on for `buf`
    d.copy_to_host(d.default_stream(), out.data(), *buf, 0, bytes);
    d.default_stream().synchronize();
  }  // buf: freed on its own stream, which is then destroyed
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(out, in);
  EXPECT_EQ(err, "");
}

// One line per native-handle call: "<call>: ok" or "<call>: <error class>: <message>".
std::string native_calls(bp::Device& d, int& released) {
  std::string out;
  auto report = [&](const char* call, const std::function<void()>& f) {
    try {
      f();
      out += std::string(call) + ": ok\n";
    } catch (const bp::UnsupportedError& e) {
      out += std::string(call) + ": UnsupportedError: " + e.what() + "\n";
    } catch (const bp::Error& e) {
      out += std::string(call) + ": Error: " + e.what() + "\n";
    }
  };
  bp::Tensor c = bp::full({5}, 1.0, d);
  report("buffer_native", [&] { (void)c.native(); });
  report("stream_native", [&] { (void)d.default_stream().native_handle(); });
  static float host[4] = {1, 2, 3, 4};
  report("buffer_import", [&] { (void)d.import_buffer(host, sizeof host, [&] { ++released; }); });
  report("stream_import", [&] { (void)d.import_stream(nullptr); });
  return out;
}

// An ABI 1.1 plugin computes through the host, and every native-handle call is the host's
// default, UnsupportedError naming the device, the plugin and its ABI; the traps the fixture
// keeps past its struct_size are never called, and release never runs for a failed import.
TEST(Registry, Minor1PluginComputesAndNativeCallsAreUnsupported) {
  for (std::string name : {"minor1", "minor1traps"}) {
    bp::Registry reg(paths({fixture(name)}));
    bp::Device& d = reg.device(name + ":0");
    EXPECT_EQ(compute(d), "6.75 6.75 6.75 6.75 6.75 ") << name;
    int released = 0;
    std::string out = native_calls(d, released);
    for (const char* slot : {"buffer_native", "stream_native", "buffer_import", "stream_import"}) {
      std::string l = std::string(slot) + ": UnsupportedError: " + name + ":0: ";
      EXPECT_NE(out.find(l), std::string::npos) << slot << "\n" << out;
    }
    EXPECT_NE(out.find("plugin '" + name + "'"), std::string::npos) << out;
    EXPECT_NE(out.find("implements plugin ABI 1.1"), std::string::npos) << out;
    EXPECT_NE(out.find("which has no buffer_import slot (added in ABI 1.2)"), std::string::npos)
        << out;
    EXPECT_EQ(out.find("called a minor-2 slot"), std::string::npos) << out;
    EXPECT_EQ(released, 0);
  }
}

// A current-ABI plugin that leaves the native slots NULL gets the same default, naming the slot.
TEST(Registry, NullNativeSlotsAreUnsupportedWithTheSlotNamed) {
  bp::Registry reg(paths({fixture("fixture")}));
  int released = 0;
  std::string out = native_calls(reg.device("fixture:0"), released);
  EXPECT_NE(out.find("buffer_native: UnsupportedError: fixture:0: a native buffer address is not "
                     "supported: plugin 'fixture'"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("leaves the optional slot buffer_native NULL"), std::string::npos) << out;
  EXPECT_NE(out.find("leaves the optional slot stream_import NULL"), std::string::npos) << out;
  EXPECT_EQ(released, 0);
}

// A pair outside the op's dtype domain is a DTypeError before any plugin is asked (Note [Dtype
// domains] in plugin_abi.h); a pair inside it that a backend lacks is an UnsupportedError
// naming the devices of the same registry that have it.
TEST(Registry, UnsupportedOpIsNamed) {
  bp::Device& cpu = bp::device("cpu:0");
  EXPECT_TRUE(cpu.supports(bp::Op::exp, bp::DType::f32));
  EXPECT_FALSE(cpu.supports(bp::Op::exp, bp::DType::boolean));
  try {
    cpu.kernel(bp::Op::exp, bp::DType::boolean);
    FAIL();
  } catch (const bp::DTypeError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("exp: dtype bool is outside the op's dtype domain; exp is defined for f32 "
                       "f64 f16 bf16 only"),
              std::string::npos)
        << msg;
  }
  bp::Registry reg(paths({fixture("fixture")}));
  // Note [Fallback policy]: under error the op is refused, naming what a fallback would do.
  bp::set_fallback_policy(bp::FallbackPolicy::error);
  try {
    bp::full({2}, 1.0, reg.device("fixture:0"), bp::DType::f64);  // in fill's domain only
    ADD_FAILURE() << "the fixture has no f64 fill";
  } catch (const bp::UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("op 'fill' (f64) is not implemented on fixture:0 "
                                         "(backend fixture); its fallback (a run on cpu:0, its "
                                         "operands copied there and back) is refused"),
              std::string::npos)
        << e.what();
  }
  // Under allow it runs on cpu:0 and the values come back to fixture:0.
  bp::set_fallback_policy(bp::FallbackPolicy::allow);
  bp::Tensor t = bp::full({2}, 1.5, reg.device("fixture:0"), bp::DType::f64);
  bp::set_fallback_policy(bp::FallbackPolicy::warn);
  EXPECT_EQ(t.device().str(), "fixture:0");
  EXPECT_EQ(t.to_vector<double>(), (std::vector<double>{1.5, 1.5}));
}

// Note [Loading on demand]: a registry opens a plugin when a device of its type is asked for,
// and all of them when something lists everything.
TEST(Registry, PluginsLoadWhenTheirTypeIsAskedFor) {
  bp::Registry reg(paths({fixture("fixture"), fixture("oldminor")}));
  EXPECT_TRUE(reg.loaded_devices().empty());
  EXPECT_EQ(reg.device("fixture:0").str(), "fixture:0");
  ASSERT_EQ(reg.loaded_devices().size(), 1u);
  EXPECT_EQ(reg.loaded_devices()[0]->str(), "fixture:0");
  EXPECT_EQ(reg.num_devices("cpu"), 1);
  EXPECT_EQ(reg.loaded_devices().size(), 2u);  // oldminor is not opened yet
  EXPECT_TRUE(has_device(reg, "oldminor:0"));  // devices() lists (and opens) every plugin
  EXPECT_EQ(reg.loaded_devices().size(), reg.devices().size());
}

TEST(Registry, AManifestNamesTheTypeOfAFileNamedOtherwise) {
  fs::path tmp = fs::temp_directory_path() / ("bp-manifest-" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  fs::copy_file(fixture("fixture"), tmp / "libbackplane-acme.so",
                fs::copy_options::overwrite_existing);
  const fs::path manifest = tmp / "libbackplane-acme.so.manifest";
  std::ofstream(manifest) << "# what this plugin serves\ndevice_type = \"fixture\"\n";
  {
    bp::Registry reg(paths({tmp.string()}));
    EXPECT_EQ(reg.num_devices("fixture"), 1);
    ASSERT_EQ(reg.loaded_devices().size(), 1u);  // the cpu plugin was not opened
    EXPECT_EQ(reg.loaded_devices()[0]->str(), "fixture:0");
  }
  std::ofstream(manifest) << "device_type = fixture\n";  // not a string
  {
    bp::Registry reg(paths({tmp.string()}));
    EXPECT_EQ(reg.num_devices("fixture"), 1);  // found on the slower path
    const bp::PluginReport* r = line(reg, "libbackplane-acme.so");
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->status, bp::PluginReport::Status::loaded) << r->reason;
    EXPECT_NE(r->reason.find(manifest.string() + " line 1: expected device_type = \"<type>\""),
              std::string::npos)
        << r->reason;
  }
  fs::remove_all(tmp);
}

// The Trainer and any code choosing "the first GPU" go by the device kind the plugin declares.
TEST(Registry, DeviceKindsComeFromThePlugins) {
  bp::Registry reg(paths({kFixtures}));
  EXPECT_EQ(reg.device("cpu:0").properties().kind, bp::DeviceKind::cpu);
  // The 1.0 fixture predates kinds: host memory makes it a cpu.
  EXPECT_EQ(reg.device("oldminor:0").properties().kind, bp::DeviceKind::cpu);
  for (bp::Device* d : reg.devices(bp::DeviceKind::gpu))
    EXPECT_EQ(d->properties().kind, bp::DeviceKind::gpu);
  EXPECT_STREQ(bp::device_kind_name(bp::DeviceKind::accelerator), "accelerator");
}

// On a machine without an NVIDIA driver (CI), the CUDA plugin loads, reports 0 devices with
// the reason, and asking for cuda:0 quotes that reason.
TEST(Registry, CudaWithoutDriverReportsReason) {
  if (!fs::exists(kPluginDir + "/libbackplane-cuda.so"))
    GTEST_SKIP() << "the CUDA plugin is not built";
  bp::Registry reg(paths({}));
  if (reg.num_devices("cuda") > 0) GTEST_SKIP() << "this machine has a CUDA device";
  bp::Availability a = reg.is_available("cuda");
  EXPECT_FALSE(a.available);
  EXPECT_NE(a.reason.find("0 devices because"), std::string::npos) << a.reason;
  try {
    reg.device("cuda:0");
    FAIL();
  } catch (const bp::DeviceError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("cuda:0 is not available"), std::string::npos) << msg;
    EXPECT_NE(msg.find(a.reason), std::string::npos) << msg;
  }
  const bp::PluginReport* p = line(reg, "libbackplane-cuda.so");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->status, bp::PluginReport::Status::loaded);
  EXPECT_EQ(p->device_count, 0);
}

// Runs a shell command line and returns its standard output.
std::string run(const std::string& cmd) {
  return bp_test::run_command(cmd, /*merge_stderr=*/false).output;
}

// The process default registry is built from the environment on first use (the one case that
// needs a fresh process), as bp-smi --json shows it.
TEST(ProcessDefault, FollowsTheEnvironment) {
  std::string out =
      run("env -u BACKPLANE_PLUGINS -u BACKPLANE_CONFIG BACKPLANE_PLUGIN_PATH=" + kFixtures +
          " BACKPLANE_DEVICE=oldminor:0 " + kSmi + " --json");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(out);
  } catch (const std::exception& e) {
    FAIL() << "bp-smi output is not JSON (" << e.what() << "): " << out;
  }
  EXPECT_EQ(j["default_device"], "oldminor:0");
  bool fixture = false;
  for (const auto& d : j["devices"]) fixture = fixture || d["device"] == "fixture:0";
  EXPECT_TRUE(fixture) << j.dump();
}

}  // namespace
