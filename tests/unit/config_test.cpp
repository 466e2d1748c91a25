// The config file and its precedence (Note [Config precedence] in runtime.hpp), read with
// bp::Config::load().
#include <gtest/gtest.h>
#include <backplane/backplane.hpp>

#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

namespace fs = std::filesystem;

namespace {

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) unsetenv(v);
    path_ = fs::temp_directory_path() / ("bp-cfg-" + std::to_string(::getpid()) + ".toml");
  }
  void TearDown() override {
    for (const char* v : kVars) unsetenv(v);
    fs::remove(path_);
  }
  void write(const std::string& text) {
    std::ofstream(path_) << text;
    setenv("BACKPLANE_CONFIG", path_.c_str(), 1);
  }
  void expect_error(const std::string& text, const std::string& fragment) {
    write(text);
    try {
      bp::Config::load();
      FAIL() << "config accepted: " << text;
    } catch (const bp::IOError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(path_.string()), std::string::npos) << msg;
      EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    }
  }
  static constexpr const char* kVars[] = {"BACKPLANE_CONFIG",          "BACKPLANE_DEVICE",
                                          "BACKPLANE_PLUGINS",         "BACKPLANE_ALLOW_TF32",
                                          "BACKPLANE_SYNC_DEBUG",      "BACKPLANE_FALLBACK",
                                          "BACKPLANE_FALLBACK_REPORT", "BACKPLANE_LAUNCH_BLOCKING"};
  fs::path path_;
};

TEST_F(ConfigTest, ReadsEveryKey) {
  write(
      "device = \"cuda:1\"\n"
      "[plugins]\npaths = [\"/opt/a\", \"/opt/b\"]\nallow = [\"cpu\", \"cuda\"]\n"
      "deny = [\"opencl\"]\n[matmul]\nallow_tf32 = true\n[debug]\nsync = \"warn\"\n");
  bp::Config c = bp::Config::load();
  EXPECT_EQ(c.source, path_.string());
  EXPECT_EQ(c.default_device, "cuda:1");
  EXPECT_EQ(c.plugin_paths, (std::vector<std::string>{"/opt/a", "/opt/b"}));
  EXPECT_EQ(c.allow, (std::vector<std::string>{"cpu", "cuda"}));
  EXPECT_EQ(c.deny, (std::vector<std::string>{"opencl"}));
  EXPECT_TRUE(c.allow_tf32);
  EXPECT_EQ(c.sync_debug, "warn");
}

TEST_F(ConfigTest, EnvironmentBeatsFile) {
  write("device = \"cuda:1\"\n[plugins]\nallow = [\"cpu\"]\n[matmul]\nallow_tf32 = true\n");
  setenv("BACKPLANE_DEVICE", "cpu:0", 1);
  setenv("BACKPLANE_PLUGINS", "cuda,opencl", 1);
  setenv("BACKPLANE_ALLOW_TF32", "0", 1);
  setenv("BACKPLANE_SYNC_DEBUG", "error", 1);
  bp::Config c = bp::Config::load();
  EXPECT_EQ(c.default_device, "cpu:0");
  EXPECT_EQ(c.allow, (std::vector<std::string>{"cuda", "opencl"}));
  EXPECT_FALSE(c.allow_tf32);
  EXPECT_EQ(c.sync_debug, "error");
}

// Note [Fallback policy]: the policy, per-op overrides, the report and launch blocking.
TEST_F(ConfigTest, FallbackKeysAndTheirVariables) {
  write("[fallback]\npolicy = \"error\"\n[fallback.ops]\nconv2d = \"allow\"\nmatmul = \"warn\"\n");
  bp::Config c = bp::Config::load();
  EXPECT_EQ(c.fallback, "error");
  EXPECT_EQ(c.fallback_ops, (std::vector<std::pair<std::string, std::string>>{{"conv2d", "allow"},
                                                                              {"matmul", "warn"}}));
  EXPECT_FALSE(c.fallback_report);
  EXPECT_FALSE(c.launch_blocking);
  setenv("BACKPLANE_FALLBACK", "allow", 1);
  setenv("BACKPLANE_FALLBACK_REPORT", "1", 1);
  setenv("BACKPLANE_LAUNCH_BLOCKING", "1", 1);
  c = bp::Config::load();
  EXPECT_EQ(c.fallback, "allow");        // the variable beats fallback.policy
  EXPECT_EQ(c.fallback_ops.size(), 2u);  // and leaves the per-op settings
  EXPECT_TRUE(c.fallback_report);
  EXPECT_TRUE(c.launch_blocking);
}

TEST_F(ConfigTest, BadFallbackValuesNameTheAcceptedOnes) {
  expect_error("[fallback]\npolicy = \"sometimes\"\n",
               "line 2, key 'fallback.policy': fallback policy 'sometimes' is not one of error, "
               "warn, allow");
  expect_error("[fallback.ops]\nconv2d = \"quiet\"\n",
               "key 'fallback.ops.conv2d': fallback policy 'quiet' is not one of error, warn, "
               "allow");
  expect_error("[fallback.ops]\nconv3d = \"warn\"\n",
               "key 'fallback.ops.conv3d': 'conv3d' is not an op of the catalogue");
  expect_error("[fallback]\npolicy = 1\n", "key 'fallback.policy': expected \"error\"");
  expect_error("[fallback]\nmode = \"warn\"\n", "key 'fallback.mode': unknown key");
  unsetenv("BACKPLANE_CONFIG");
  auto env_error = [](const char* var, const char* value, const std::string& fragment) {
    setenv(var, value, 1);
    try {
      bp::Config::load();
      ADD_FAILURE() << var << "=" << value << " accepted";
    } catch (const bp::IOError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
    unsetenv(var);
  };
  env_error("BACKPLANE_FALLBACK", "fast",
            "BACKPLANE_FALLBACK: fallback policy 'fast' is not one of error, warn, allow");
  env_error("BACKPLANE_LAUNCH_BLOCKING", "yes", "BACKPLANE_LAUNCH_BLOCKING='yes' is not 0 or 1");
  env_error("BACKPLANE_FALLBACK_REPORT", "2", "BACKPLANE_FALLBACK_REPORT='2' is not 0 or 1");
}

TEST_F(ConfigTest, SyntaxErrorNamesFileAndLine) {
  expect_error("device = \n", "line 1");
}
TEST_F(ConfigTest, UnknownKeyNamesLineAndKey) {
  expect_error("device = \"cpu\"\ndevcie = \"cuda\"\n", "line 2, key 'devcie': unknown key");
}
TEST_F(ConfigTest, UnknownNestedKey) {
  expect_error("[plugins]\npath = [\"/x\"]\n", "line 2, key 'plugins.path': unknown key");
}
TEST_F(ConfigTest, WrongTypes) {
  expect_error("device = 3\n", "key 'device': expected a device string");
  expect_error("[plugins]\nallow = \"cpu\"\n", "key 'plugins.allow': expected an array");
  expect_error("[plugins]\nallow = [\"cpu\", 2]\n", "expected every element to be a string");
  expect_error("[matmul]\nallow_tf32 = \"yes\"\n", "key 'matmul.allow_tf32': expected true");
  expect_error("[debug]\nsync = \"loud\"\n", "'loud' is not one of off, warn, error");
  expect_error("plugins = 3\n", "key 'plugins': expected a table");
}
TEST_F(ConfigTest, MissingExplicitFile) {
  setenv("BACKPLANE_CONFIG", "/no/such/backplane.toml", 1);
  try {
    bp::Config::load();
    FAIL();
  } catch (const bp::IOError& e) {
    EXPECT_NE(std::string(e.what()).find("/no/such/backplane.toml (from BACKPLANE_CONFIG) does "
                                         "not exist"),
              std::string::npos)
        << e.what();
  }
}
// What Config::load() says in a child process running as a user that is not root (root searches
// every folder): nobody (uid 65534) when the test runs as root. The child's exit status: 0 when
// the load threw IOError containing `fragment`, else 1 (its message on stderr).
int load_error_as_unprivileged_user(const std::string& fragment) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::geteuid() == 0 && (::setresgid(65534, 65534, 65534) != 0 ||
                             ::setgroups(0, nullptr) != 0 || ::setresuid(65534, 65534, 65534) != 0))
      ::_exit(3);
    try {
      (void)bp::Config::load();
      std::fprintf(stderr, "no error\n");
    } catch (const bp::IOError& e) {
      std::fprintf(stderr, "%s\n", e.what());
      ::_exit(std::string(e.what()).find(fragment) != std::string::npos ? 0 : 1);
    } catch (...) {
      std::fprintf(stderr, "an exception other than IOError\n");
    }
    ::_exit(1);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// Once "does not exist" for a file that exists in a folder this user may not search (EACCES was
// taken for absence), and "line 0: File could not be opened" for an unreadable file.
TEST_F(ConfigTest, ExplicitFileThatCannotBeReachedSaysWhy) {
  const fs::path dir = fs::temp_directory_path() / ("bp-cfg-closed-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path file = dir / "config.toml";
  std::ofstream(file) << "device = \"cpu:0\"\n";
  // A folder without search permission for the user: its file cannot even be looked up.
  fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_write);
  setenv("BACKPLANE_CONFIG", file.c_str(), 1);
  EXPECT_EQ(load_error_as_unprivileged_user(
                "config file " + file.string() +
                " (from BACKPLANE_CONFIG) cannot be reached: permission denied: this user may not "
                "search the folder " +
                dir.string()),
            0);
  // A file this user may not read, in a folder everyone may search.
  fs::permissions(dir, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
  fs::permissions(file, fs::perms::none);
  EXPECT_EQ(load_error_as_unprivileged_user("config file " + file.string() +
                                            " cannot be opened for reading: Permission denied"),
            0);
  // A loop of symbolic links, for every user.
  const fs::path loop = dir / "loop.toml";
  fs::create_symlink(loop, loop);
  setenv("BACKPLANE_CONFIG", loop.c_str(), 1);
  try {
    (void)bp::Config::load();
    ADD_FAILURE() << "a symbolic link loop was accepted";
  } catch (const bp::IOError& e) {
    EXPECT_NE(std::string(e.what()).find("config file " + loop.string() +
                                         " (from BACKPLANE_CONFIG) cannot be reached: Too many "
                                         "levels of symbolic links"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

// A config path that exists but is not a regular file is an IOError saying what it is, never a
// silent empty configuration (issue 17) and never a blocked read (a FIFO).
TEST_F(ConfigTest, PathThatIsNotARegularFile) {
  const fs::path dir = fs::temp_directory_path() / ("bp-cfg-dir-" + std::to_string(::getpid()));
  const fs::path fifo = fs::temp_directory_path() / ("bp-cfg-fifo-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::pair<std::string, std::string> cases[] = {{dir.string(), "is a directory"},
                                                       {"/dev/zero", "is a character device"},
                                                       {fifo.string(), "is a named pipe (FIFO)"}};
  for (const auto& [path, kind] : cases) {
    setenv("BACKPLANE_CONFIG", path.c_str(), 1);
    try {
      (void)bp::Config::load();
      ADD_FAILURE() << path << " was accepted as a config file";
    } catch (const bp::IOError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("config file " + path + " (from BACKPLANE_CONFIG) " + kind +
                         ", not a regular file"),
                std::string::npos)
          << msg;
    }
  }
  // The same for ./backplane.toml.
  const fs::path cwd = fs::current_path();
  unsetenv("BACKPLANE_CONFIG");
  fs::create_directories(dir / "backplane.toml");
  fs::current_path(dir);
  try {
    (void)bp::Config::load();
    ADD_FAILURE() << "a folder named backplane.toml was accepted";
  } catch (const bp::IOError& e) {
    EXPECT_NE(std::string(e.what()).find("backplane.toml (in the working folder) is a directory"),
              std::string::npos)
        << e.what();
  }
  fs::current_path(cwd);
  fs::remove_all(dir);
  fs::remove(fifo);
}
TEST_F(ConfigTest, BadEnvironmentValues) {
  setenv("BACKPLANE_ALLOW_TF32", "maybe", 1);
  EXPECT_THROW(bp::Config::load(), bp::IOError);
  unsetenv("BACKPLANE_ALLOW_TF32");
  setenv("BACKPLANE_SYNC_DEBUG", "verbose", 1);
  try {
    bp::Config::load();
    FAIL();
  } catch (const bp::IOError& e) {
    EXPECT_NE(std::string(e.what()).find("BACKPLANE_SYNC_DEBUG"), std::string::npos);
  }
}
TEST_F(ConfigTest, NoFileMeansDefaults) {
  fs::path cwd = fs::current_path();
  fs::path empty = fs::temp_directory_path() / ("bp-empty-" + std::to_string(::getpid()));
  fs::create_directories(empty);
  fs::current_path(empty);
  setenv("XDG_CONFIG_HOME", empty.c_str(), 1);
  bp::Config c = bp::Config::load();
  fs::current_path(cwd);
  unsetenv("XDG_CONFIG_HOME");
  fs::remove_all(empty);
  EXPECT_EQ(c.source, "");
  EXPECT_EQ(c.default_device, "");
  EXPECT_FALSE(c.allow_tf32);
}

}  // namespace

// Keys and table headers of 50,000 dotted parts once overflowed toml++'s stack in every program
// (bp-smi included, also through ./backplane.toml); now they, huge lines and huge files are
// refused before parsing.
TEST_F(ConfigTest, DeepKeysLongLinesAndHugeFilesAreRefusedBeforeParsing) {
  std::string deep = "a";
  for (int i = 0; i < 50000; ++i) deep += ".a";
  expect_error(deep + " = 1\n", ": a key of more than 64 dotted parts");
  expect_error("[" + deep + "]\n", ": a key of more than 64 dotted parts");
  expect_error("device = \"" + std::string(70000, 'x') + "\"\n",
               "line 1 is longer than 65536 bytes");
  expect_error(std::string((1 << 20) + 10, '#'), "is larger than 1048576 bytes");
  // Dots inside strings and comments are not key parts.
  write("device = \"cpu:0\" # " + std::string(100, '.') + "\n[plugins]\npaths = [\"" +
        std::string(100, '.') + "\"]\n");
  EXPECT_EQ(bp::Config::load().plugin_paths, std::vector<std::string>{std::string(100, '.')});
}

TEST_F(ConfigTest, WrongTypesAndEmptyDeviceAreRefused) {
  expect_error("[matmul]\nallow_tf32 = 1\n", "key 'matmul.allow_tf32': expected true or false");
  expect_error("device = \"\"\n", "key 'device': expected a device string");
}

// A ./backplane.toml is found implicitly: it may not add plugin folders unless the user opts in.
TEST_F(ConfigTest, AnImplicitConfigCannotAddPluginPaths) {
  const fs::path cwd = fs::current_path();
  fs::path dir = fs::temp_directory_path() / ("bp-trust-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "backplane.toml") << "[plugins]\npaths = [\"plugins\"]\n";
  fs::current_path(dir);
  setenv("XDG_CONFIG_HOME", dir.c_str(), 1);
  try {
    (void)bp::Config::load();
    ADD_FAILURE() << "an implicit config added plugin paths";
  } catch (const bp::IOError& e) {
    EXPECT_NE(std::string(e.what()).find("key 'plugins.paths': a config file found implicitly in "
                                         "the working folder may not add plugin folders"),
              std::string::npos)
        << e.what();
  }
  setenv("BACKPLANE_TRUST_LOCAL_CONFIG", "1", 1);
  EXPECT_EQ(bp::Config::load().plugin_paths, std::vector<std::string>{"plugins"});
  unsetenv("BACKPLANE_TRUST_LOCAL_CONFIG");
  setenv("BACKPLANE_CONFIG", "backplane.toml", 1);  // named by the user: trusted
  EXPECT_EQ(bp::Config::load().plugin_paths, std::vector<std::string>{"plugins"});
  fs::current_path(cwd);
  unsetenv("XDG_CONFIG_HOME");
  fs::remove_all(dir);
}
