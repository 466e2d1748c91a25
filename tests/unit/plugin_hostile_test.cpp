// Hostile plugins (issue 28), as fault switches of the reference backend (plugins/reference):
// bp-smi survives an init that crashes, aborts or hangs (Note [Plugin probes]); tables whose
// size does not fit their minor, non-regular files and NULL allocations reported as success are
// refused with a reason; a non-UTF-8 device name does not break bp-smi --json.
#include <backplane/backplane.hpp>

#include <backplane_test/child.hpp>
#include <backplane_test/plugin_test.hpp>

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <string>

namespace fs = std::filesystem;

namespace {

const std::string kSmi = bp_test::beside_exe(BP_SMI_REL);
const std::string kReference = bp_test::beside_exe(BP_REFERENCE_REL);
const std::string kNullAlloc = bp_test::beside_exe(BP_REF_NULLALLOC_REL);

struct Out {
  int status = -1;
  std::string text;
};
Out run(const std::string& cmd) {
  const bp_test::ChildResult c = bp_test::run_command(cmd);
  return {c.exit_code(), c.output};
}

// bp-smi --json with the reference backend's `fault` on; the reference plugin's report line.
nlohmann::json smi_reference(const std::string& fault, const std::string& extra = "") {
  Out r = run("env -u BACKPLANE_PLUGINS -u BACKPLANE_CONFIG BP_REFERENCE_FAULT=" + fault +
              " BACKPLANE_PLUGIN_PATH=" + kReference + " " + extra + " " + kSmi + " --json");
  EXPECT_EQ(r.status, 0) << r.text;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(r.text.substr(r.text.find('{')));
  } catch (const std::exception& e) {
    ADD_FAILURE() << "bp-smi --json gave no JSON (" << e.what() << "): " << r.text;
    return {};
  }
  for (const auto& p : j["plugins"])
    if (p["path"] == kReference) return p;
  ADD_FAILURE() << "no report line for " << kReference << ": " << j.dump(1);
  return {};
}

// Once: bp-smi died with the plugin (exit 139 / 134) or hung.
TEST(HostilePlugins, BpSmiSurvivesAnInitThatCrashesAbortsOrHangs) {
  auto segv = smi_reference("init_segv");
  EXPECT_EQ(segv["status"], "failed");
  EXPECT_NE(segv["reason"].get<std::string>().find("init crashed with SIGSEGV"), std::string::npos)
      << segv;
  auto abrt = smi_reference("init_abort");
  EXPECT_NE(abrt["reason"].get<std::string>().find("init crashed with SIGABRT"), std::string::npos)
      << abrt;
  // exit() in init (or a sanitizer's report there) once ended bp-smi with the plugin's status.
  auto ex = smi_reference("init_exit");
  EXPECT_EQ(ex["status"], "failed");
  EXPECT_NE(ex["reason"].get<std::string>().find("init ended the process with exit status 3"),
            std::string::npos)
      << ex;
  auto hang = smi_reference("init_hang", "BACKPLANE_PROBE_PLUGINS=0.5");
  EXPECT_NE(hang["reason"].get<std::string>().find("init did not return within 0.5 s"),
            std::string::npos)
      << hang;
}

// Once: a table declaring 1 GiB was accepted and read past (SIGSEGV in register_plugin).
TEST(HostilePlugins, ATableWhoseSizeDoesNotFitItsMinorIsRefused) {
  auto big = smi_reference("big_struct");
  EXPECT_EQ(big["status"], "failed");
  EXPECT_NE(big["reason"].get<std::string>().find("plugin table of 1073741824 bytes does not fit "
                                                  "ABI 1."),
            std::string::npos)
      << big;
}

// Once: bp-smi --json aborted (nlohmann type_error 316) and printed nothing.
TEST(HostilePlugins, ANonUtf8DeviceNameKeepsBpSmiJsonWorking) {
  Out r =
      run("env -u BACKPLANE_PLUGINS -u BACKPLANE_CONFIG BP_REFERENCE_FAULT=bad_name "
          "BACKPLANE_PLUGIN_PATH=" +
          kReference + " " + kSmi + " --json");
  ASSERT_EQ(r.status, 0) << r.text;
  auto j = nlohmann::json::parse(r.text);
  bool seen = false;
  for (const auto& d : j["devices"])
    if (d["device"] == "reference:0") {
      seen = true;
      EXPECT_EQ(d["name"].get<std::string>().rfind("Bad \xEF\xBF\xBD\xEF\xBF\xBD name", 0), 0u)
          << d;  // each invalid byte replaced by U+FFFD
    }
  EXPECT_TRUE(seen) << r.text;
}

// Once: a FIFO named like a plugin hung every program in open(2).
TEST(HostilePlugins, AFifoInAPluginFolderIsReportedNotOpened) {
  std::string t = (fs::temp_directory_path() / "bp-pfifo-XXXXXX").string();
  fs::path dir = ::mkdtemp(t.data());
  const std::string fifo = (dir / "libbackplane-fifo.so").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  bp::RegistryOptions o;
  o.plugin_paths = {dir.string()};
  o.search_library_dir = false;
  bp::Registry reg(o);
  ASSERT_EQ(reg.report().size(), 1u);
  EXPECT_EQ(reg.report()[0].status, bp::PluginReport::Status::failed);
  EXPECT_EQ(reg.report()[0].reason, "not a regular file (a named pipe (FIFO))");
  fs::remove_all(dir);
}

// Once: accepted, and 4096 bytes counted as allocated.
TEST(HostilePlugins, ANullAllocationReportedAsSuccessIsAPluginError) {
  bp::RegistryOptions o;
  o.plugin_paths = {kNullAlloc};
  o.search_library_dir = false;
  bp::Registry reg(o);
  bp::Device& d = reg.device("ref_nullalloc:0");
  const uint64_t before = d.memory_stats().allocated;
  try {
    (void)bp::empty({1024}, d);
    ADD_FAILURE() << "a NULL buffer was accepted";
  } catch (const bp::PluginError& e) {
    EXPECT_NE(std::string(e.what()).find("ref_nullalloc:0: mem_alloc returned no buffer for 4096 "
                                         "bytes and no error"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(d.memory_stats().allocated, before);
}

}  // namespace
