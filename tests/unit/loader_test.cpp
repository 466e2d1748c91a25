// The plugin loader: every broken-plugin fixture gets its own precise report line and never
// stops the others; search order, BACKPLANE_PLUGIN_PATH, BACKPLANE_PLUGINS and
// BACKPLANE_DEVICE; an ABI 1.0 plugin loads and works. Registry-wide behaviour is checked in
// child processes (bp-smi --json, bp_loader_probe) because the registry loads once per process.
#include <gtest/gtest.h>
#include <backplane/backplane.hpp>
#include <backplane_test/plugin_test.hpp>

#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;

namespace {

// Build-tree files found relative to this test binary, so a copied build tree (a bundle run on
// another machine) tests itself and nothing of the original.
const std::string kFixtures = bp_test::beside_exe(BP_FIXTURE_DIR_REL);
const std::string kSmi = bp_test::beside_exe(BP_SMI_REL);
const std::string kProbe = bp_test::beside_exe(BP_PROBE_REL);
const std::string kPluginDir = bp_test::beside_exe(BP_PLUGIN_DIR_REL);

std::string fixture(const std::string& name) {
  return kFixtures + "/libbackplane-" + name + ".so";
}

// Runs a shell command line and returns its standard output.
std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  pclose(p);
  return out;
}

// bp-smi --json in a clean environment plus `env` assignments.
nlohmann::json smi(const std::string& env) {
  std::string cmd =
      "env -u BACKPLANE_PLUGIN_PATH -u BACKPLANE_PLUGINS -u BACKPLANE_DEVICE "
      "-u BACKPLANE_CONFIG " +
      env + " " + kSmi + " --json";
  std::string out = run(cmd);
  try {
    return nlohmann::json::parse(out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "bp-smi output is not JSON (" << e.what() << "): " << out;
    return {};
  }
}

const nlohmann::json* plugin_line(const nlohmann::json& j, const std::string& path_end) {
  for (const auto& p : j["plugins"]) {
    std::string path = p["path"];
    if (path.size() >= path_end.size() &&
        path.compare(path.size() - path_end.size(), path_end.size(), path_end) == 0)
      return &p;
  }
  return nullptr;
}

bool has_device(const nlohmann::json& j, const std::string& dev) {
  for (const auto& d : j["devices"])
    if (d["device"] == dev) return true;
  return false;
}

void expect_failed(const std::string& name, const std::string& fragment) {
  bp::PluginReport r = bp::inspect_plugin(fixture(name));
  EXPECT_EQ(r.status, bp::PluginReport::Status::failed) << name;
  EXPECT_NE(r.reason.find(fragment), std::string::npos) << name << ": " << r.reason;
  EXPECT_EQ(r.api, nullptr);
}

TEST(Loader, NotAnElf) {
  expect_failed("notelf", "not an ELF shared object");
}
TEST(Loader, MissingEntrySymbol) {
  expect_failed("noentry", "missing entry symbol bp_plugin_get_api");
}
TEST(Loader, OtherMajorNamesBothVersions) {
  expect_failed("major2", "ABI 2.1 vs host " + std::to_string(BP_ABI_MAJOR) + "." +
                              std::to_string(BP_ABI_MINOR));
}
TEST(Loader, InitFailureQuotesPluginMessage) {
  expect_failed("initfail", "init failed: fixture init failure: simulated driver error 42");
}
TEST(Loader, MissingDependencyIsNamed) {
  expect_failed("missingdep", "dependency libbpfixturedep.so not found");
}
TEST(Loader, OlderMinorLoads) {
  bp::PluginReport r = bp::inspect_plugin(fixture("oldminor"));
  EXPECT_EQ(r.status, bp::PluginReport::Status::loaded) << r.reason;
  EXPECT_EQ(r.abi_major, 1u);
  EXPECT_EQ(r.abi_minor, 0u);
  EXPECT_EQ(r.device_count, 1);
  ASSERT_NE(r.api, nullptr);
  EXPECT_EQ(r.api->struct_size, BP_API_MINOR1_OFFSET);
}
TEST(Loader, MissingFile) {
  bp::PluginReport r = bp::inspect_plugin(kFixtures + "/does-not-exist.so");
  EXPECT_EQ(r.status, bp::PluginReport::Status::failed);
  EXPECT_NE(r.reason.find("cannot be opened"), std::string::npos) << r.reason;
}

TEST(Registry, BrokenPluginsNeverStopTheOthers) {
  nlohmann::json j = smi("BACKPLANE_PLUGIN_PATH=" + kFixtures);
  struct Expect {
    const char* file;
    const char* status;
    const char* fragment;
  } expects[] = {
      {"libbackplane-notelf.so", "failed", "not an ELF"},
      {"libbackplane-noentry.so", "failed", "missing entry symbol"},
      {"libbackplane-major2.so", "failed", "ABI 2.1 vs host"},
      {"libbackplane-initfail.so", "failed", "simulated driver error 42"},
      {"libbackplane-missingdep.so", "failed", "dependency libbpfixturedep.so not found"},
      {"libbackplane-oldminor.so", "loaded", ""},
      {"libbackplane-fixture.so", "loaded", ""},
      {"libbackplane-cpu.so", "loaded", ""},
  };
  for (const auto& e : expects) {
    const nlohmann::json* p = plugin_line(j, e.file);
    ASSERT_NE(p, nullptr) << e.file << " missing from the load report: " << j.dump();
    EXPECT_EQ((*p)["status"], e.status) << e.file;
    EXPECT_NE((*p)["reason"].get<std::string>().find(e.fragment), std::string::npos)
        << e.file << ": " << (*p)["reason"];
  }
  EXPECT_TRUE(has_device(j, "cpu:0"));
  EXPECT_TRUE(has_device(j, "oldminor:0"));
  EXPECT_TRUE(has_device(j, "fixture:0"));
}

TEST(Registry, SearchOrderPutsEnvironmentFirstAndShadowsLaterCopies) {
  fs::path tmp = fs::temp_directory_path() / ("bp-shadow-" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  fs::copy_file(kPluginDir + "/libbackplane-cpu.so", tmp / "libbackplane-cpu.so",
                fs::copy_options::overwrite_existing);
  nlohmann::json j = smi("BACKPLANE_PLUGIN_PATH=" + tmp.string());
  const auto& plugins = j["plugins"];
  ASSERT_GE(plugins.size(), 2u) << j.dump();
  EXPECT_EQ(plugins[0]["path"], (tmp / "libbackplane-cpu.so").string());
  EXPECT_EQ(plugins[0]["status"], "loaded");
  const nlohmann::json* builtin = plugin_line(j, "/lib/backplane/plugins/libbackplane-cpu.so");
  ASSERT_NE(builtin, nullptr);
  EXPECT_EQ((*builtin)["status"], "skipped");
  EXPECT_NE((*builtin)["reason"].get<std::string>().find("shadowed by " + tmp.string()),
            std::string::npos)
      << (*builtin)["reason"];
  fs::remove_all(tmp);
}

TEST(Registry, PluginPathAcceptsFilesAndReportsMissingEntries) {
  nlohmann::json j = smi("BACKPLANE_PLUGIN_PATH=" + fixture("oldminor") + ":/no/such/dir");
  EXPECT_TRUE(has_device(j, "oldminor:0"));
  EXPECT_FALSE(has_device(j, "fixture:0"));
  const nlohmann::json* missing = plugin_line(j, "/no/such/dir");
  ASSERT_NE(missing, nullptr);
  EXPECT_EQ((*missing)["status"], "skipped");
  EXPECT_EQ((*missing)["reason"], "no such file or directory");
}

TEST(Registry, AllowListRestrictsPlugins) {
  nlohmann::json j = smi("BACKPLANE_PLUGIN_PATH=" + kFixtures + " BACKPLANE_PLUGINS=cpu,oldminor");
  EXPECT_TRUE(has_device(j, "cpu:0"));
  EXPECT_TRUE(has_device(j, "oldminor:0"));
  EXPECT_FALSE(has_device(j, "fixture:0"));
  const nlohmann::json* p = plugin_line(j, "libbackplane-fixture.so");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ((*p)["status"], "skipped");
  EXPECT_NE((*p)["reason"].get<std::string>().find("allow list"), std::string::npos);
  // Skipped files are never opened: the broken ones show as skipped, not failed.
  const nlohmann::json* broken = plugin_line(j, "libbackplane-initfail.so");
  ASSERT_NE(broken, nullptr);
  EXPECT_EQ((*broken)["status"], "skipped");
}

TEST(Registry, DefaultDeviceFromEnvironment) {
  nlohmann::json j = smi("BACKPLANE_PLUGIN_PATH=" + kFixtures + " BACKPLANE_DEVICE=oldminor:0");
  EXPECT_EQ(j["default_device"], "oldminor:0");
  j = smi("BACKPLANE_DEVICE=cpu:7");
  EXPECT_NE(j["default_device"].get<std::string>().find("BACKPLANE_DEVICE"), std::string::npos)
      << j["default_device"];
  EXPECT_NE(j["default_device"].get<std::string>().find("index out of range"), std::string::npos);
}

TEST(Registry, ConfigFileAddsPluginPathsAndEnvironmentWins) {
  fs::path cfg = fs::temp_directory_path() / ("bp-config-" + std::to_string(::getpid()) + ".toml");
  {
    std::ofstream f(cfg);
    f << "device = \"fixture:0\"\n[plugins]\npaths = [\"" << kFixtures << "\"]\n";
  }
  nlohmann::json j = smi("BACKPLANE_CONFIG=" + cfg.string());
  EXPECT_TRUE(has_device(j, "fixture:0"));
  EXPECT_EQ(j["default_device"], "fixture:0");
  j = smi("BACKPLANE_CONFIG=" + cfg.string() + " BACKPLANE_DEVICE=oldminor:0");
  EXPECT_EQ(j["default_device"], "oldminor:0");
  fs::remove(cfg);
}

TEST(Registry, OlderMinorPluginComputesThroughTheHost) {
  // ABI 1.0, no events, no list_ops: the host's documented defaults apply.
  std::string out =
      run("env BACKPLANE_PLUGIN_PATH=" + fixture("oldminor") + " " + kProbe + " oldminor:0");
  EXPECT_EQ(out, "device=oldminor:0 values=6.75 6.75 6.75 6.75 6.75 \n");
}

TEST(Registry, UnsupportedOpIsNamed) {
  bp::Device& cpu = bp::device("cpu:0");
  EXPECT_TRUE(cpu.supports(bp::Op::exp, bp::DType::f32));
  EXPECT_FALSE(cpu.supports(bp::Op::exp, bp::DType::boolean));
  try {
    cpu.kernel(bp::Op::exp, bp::DType::boolean);
    FAIL();
  } catch (const bp::UnsupportedError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("op 'exp' with dtype bool is not implemented on cpu:0"), std::string::npos)
        << msg;
  }
}

// On a machine without an NVIDIA driver (CI), the CUDA plugin loads, reports 0 devices with
// the reason, and asking for cuda:0 quotes that reason.
TEST(Registry, CudaWithoutDriverReportsReason) {
  if (!fs::exists(kPluginDir + "/libbackplane-cuda.so"))
    GTEST_SKIP() << "the CUDA plugin is not built";
  if (bp::num_devices("cuda") > 0) GTEST_SKIP() << "this machine has a CUDA device";
  bp::Availability a = bp::is_available("cuda");
  EXPECT_FALSE(a.available);
  EXPECT_NE(a.reason.find("0 devices because"), std::string::npos) << a.reason;
  try {
    bp::device("cuda:0");
    FAIL();
  } catch (const bp::DeviceError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("cuda:0 is not available"), std::string::npos) << msg;
    EXPECT_NE(msg.find(a.reason), std::string::npos) << msg;
  }
  nlohmann::json j = smi("");
  const nlohmann::json* p = plugin_line(j, "libbackplane-cuda.so");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ((*p)["status"], "loaded");
  EXPECT_EQ((*p)["devices"], 0);
}

}  // namespace
