// Saving tensors and modules atomically (Note [Atomic save] in serialize.hpp) and loading
// files into modules.
#include <backplane/runtime.hpp>
#include <backplane/serialize.hpp>

#include "runtime/files.hpp"
#include "serialize/serialize_internal.hpp"
#include "tensor/tensor_internal.hpp"
#include "tensor/tensor_sizes.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace bp {

using detail::impl;
using detail::impl_ptr;
using detail::TensorImpl;

namespace {

std::string errno_text(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_name(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  std::string h(buf);
  for (char& c : h)
    if (c == '/' || c == '\0') c = '_';
  return h.empty() ? "localhost" : h;
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

std::atomic<bool> g_anonymous_temporaries{true};

// Removes the temporaries that earlier saves of `path` by dead processes of this host left
// behind (Note [Atomic save]): "<base>.tmp.<host>.<pid>.<n>", and the older
// "<base>.tmp.<pid>.<n>". A live process's temporary, another host's and other files are kept.
// Best effort: a file that cannot be removed is left alone.
void remove_stale_temporaries(const std::string& path, const std::string& host) {
  const std::string dir = parent_dir(path), prefix = base_name(path) + ".tmp.";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    std::string rest = name.substr(prefix.size());  // [<host>.]<pid>.<n>
    size_t dot_n = rest.rfind('.');
    if (dot_n == std::string::npos || !all_digits(rest.substr(dot_n + 1))) continue;
    rest.resize(dot_n);
    size_t dot_pid = rest.rfind('.');
    std::string pid_text = dot_pid == std::string::npos ? rest : rest.substr(dot_pid + 1);
    std::string owner = dot_pid == std::string::npos ? "" : rest.substr(0, dot_pid);
    if (!all_digits(pid_text) || pid_text.size() > 9 || (!owner.empty() && owner != host)) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(pid_text));
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    ::unlinkat(::dirfd(d), name.c_str(), 0);
  }
  ::closedir(d);
}

// A file written beside `path` that replaces `path` on commit() and leaves nothing otherwise
// (Note [Atomic save]). Where the file system supports it the file has no name until commit()
// (O_TMPFILE, named with linkat just before the rename), so a crash or SIGKILL cannot leave a
// named temporary; elsewhere it is "<path>.tmp.<host>.<pid>.<n>", and every save first removes
// such files of dead processes.
class AtomicFile {
 public:
  // `path` is checked first (Note [Output targets]): a link is followed to the file it names.
  explicit AtomicFile(const std::string& path)
      : path_(detail::output_target(path, "bp::save")), host_(host_name()) {
    remove_stale_temporaries(path_, host_);
#ifdef O_TMPFILE
    if (g_anonymous_temporaries.load(std::memory_order_relaxed)) {
      fd_ = ::open(parent_dir(path_).c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
      if (fd_ >= 0) {
        tmp_ = "an unnamed temporary file in " + parent_dir(path_);
        return;
      }
      // Not supported by this kernel or file system: fall back to a named file.
      if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)
        throw IOError(path + ": cannot create the temporary file in " + parent_dir(path_) + ": " +
                      errno_text(errno));
    }
#endif
    for (int attempt = 0; attempt < 100; ++attempt) {
      tmp_ = next_name();
      fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ >= 0 || errno != EEXIST) break;
    }
    if (fd_ < 0)
      throw IOError(path + ": cannot create the temporary file " + tmp_ + ": " + errno_text(errno));
    named_ = true;
  }
  ~AtomicFile() {
    if (committed_) return;
    if (fd_ >= 0) ::close(fd_);
    if (named_) ::unlink(tmp_.c_str());
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t put = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
      if (put < 0) {
        if (errno == EINTR) continue;
        fail("write to " + tmp_ + " failed after " + std::to_string(written_) + " bytes");
      }
      p += put;
      n -= static_cast<size_t>(put);
      written_ += static_cast<uint64_t>(put);
    }
  }

  void commit() {
    if (::fsync(fd_) != 0) fail("fsync of " + tmp_ + " failed");
    if (!named_) link_name();
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("closing " + tmp_ + " failed");
    if (::rename(tmp_.c_str(), path_.c_str()) != 0)
      fail("renaming " + tmp_ + " over the target failed");
    committed_ = true;
    // Make the rename itself durable. Some file systems cannot fsync a folder (EINVAL).
    std::string dir = parent_dir(path_);
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) fail("saved, but the folder " + dir + " could not be opened to sync it");
    int rc = ::fsync(dfd);
    int err = errno;
    ::close(dfd);
    if (rc != 0 && err != EINVAL && err != EROFS) {
      errno = err;
      fail("saved, but syncing the folder " + dir + " failed");
    }
  }

 private:
  std::string next_name() {
    static std::atomic<uint64_t> counter{0};
    return path_ + ".tmp." + host_ + "." + std::to_string(::getpid()) + "." +
           std::to_string(counter++);
  }

  // Gives the unnamed file a temporary name (linkat cannot replace an existing file; the rename
  // that follows does). Through /proc/self/fd, which needs no privilege; AT_EMPTY_PATH where
  // /proc is not mounted.
  void link_name() {
    const std::string proc = "/proc/self/fd/" + std::to_string(fd_);
    for (int attempt = 0; attempt < 100; ++attempt) {
      tmp_ = next_name();
      int rc = ::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, tmp_.c_str(), AT_SYMLINK_FOLLOW);
      if (rc != 0 && errno == ENOENT) rc = ::linkat(fd_, "", AT_FDCWD, tmp_.c_str(), AT_EMPTY_PATH);
      if (rc == 0) {
        named_ = true;
        return;
      }
      if (errno != EEXIST) fail("naming the written file " + tmp_ + " failed");
    }
    fail("naming the written file " + tmp_ + " failed");
  }

  [[noreturn]] void fail(const std::string& what) {
    throw IOError(path_ + ": " + what + ": " + errno_text(errno));
  }

  std::string path_, host_, tmp_;
  int fd_ = -1;
  uint64_t written_ = 0;
  bool named_ = false;  // tmp_ names a file that must be renamed or removed
  bool committed_ = false;
};

bool fits_pattern(const Shape& shape, const Shape& pattern) {
  if (shape.size() != pattern.size()) return false;
  for (size_t k = 0; k < shape.size(); ++k)
    if (pattern[k] >= 0 && pattern[k] != shape[k]) return false;
  return true;
}

std::string key_list(const std::vector<std::string>& keys) {
  std::string out;
  size_t shown = std::min<size_t>(keys.size(), 12);
  for (size_t k = 0; k < shown; ++k) out += (k ? ", " : "") + ("'" + keys[k] + "'");
  if (keys.size() > shown) out += " and " + std::to_string(keys.size() - shown) + " more";
  return out;
}

}  // namespace

namespace detail {
void set_anonymous_temporaries(bool on) {
  g_anonymous_temporaries.store(on, std::memory_order_relaxed);
}
void write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicFile file(path);
  file.write(bytes.data(), bytes.size());
  file.commit();
}
}  // namespace detail

void save(const std::map<std::string, Tensor>& tensors, const std::string& path,
          const Metadata& metadata) {
  std::vector<safetensors::TensorInfo> infos;
  uint64_t at = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__")
      throw IOError(path + ": '__metadata__' is reserved and cannot name a tensor");
    if (!t.defined()) throw Error(path + ": cannot save '" + name + "': the tensor is undefined");
    safetensors::TensorInfo info;
    info.name = name;
    info.dtype = t.dtype();
    info.shape = t.shape();
    info.begin = at;
    at += static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype());
    info.end = at;
    infos.push_back(std::move(info));
  }
  std::string header;
  try {
    header = safetensors::build_header(infos, metadata);
  } catch (const IOError& e) {
    throw IOError(path + ": " + e.what());
  }
  AtomicFile file(path);
  uint64_t n = header.size();
  unsigned char prefix[8];
  for (int k = 0; k < 8; ++k) prefix[k] = static_cast<unsigned char>(n >> (8 * k));
  file.write(prefix, 8);
  file.write(header.data(), header.size());
  for (const auto& [name, t] : tensors) {
    // An explicit move to the host (not an implicit sync in the sense of BACKPLANE_SYNC_DEBUG).
    std::vector<char> bytes = detail::read_bytes(t.detach().cpu(), "save()");
    file.write(bytes.data(), bytes.size());
  }
  file.commit();
}

void save(const nn::Module& module, const std::string& path, const Metadata& metadata) {
  for (const nn::StateSpec& s : module.state_spec())
    if (!s.initialized)
      throw ShapeError(path + ": cannot save '" + s.key +
                       "': the parameter is not initialised yet (a lazy layer that has not run); "
                       "run one forward pass or load it first");
  save(module.state_dict(), path, metadata);
}

nn::LoadResult load(nn::Module& module, const std::string& path, Device& device,
                    const nn::LoadOptions& options) {
  safetensors::Reader reader(path);
  nn::LoadResult result;
  std::vector<std::pair<std::string, const safetensors::TensorInfo*>> matched;
  std::vector<nn::StateSpec> spec = module.state_spec();
  for (const nn::StateSpec& s : spec) {
    const safetensors::TensorInfo* info = reader.find(s.key);
    if (!info) {
      result.missing_keys.push_back(s.key);
      continue;
    }
    if (!fits_pattern(info->shape, s.shape))
      throw ShapeError(path + ": '" + s.key + "' has shape " +
                       detail::shape_list(info->shape, true) +
                       " in the file but the model expects " + detail::shape_list(s.shape, true));
    if (s.is_parameter && !is_floating(info->dtype))
      throw DTypeError(path + ": '" + s.key + "' is " +
                       std::string(safetensors::dtype_to_safetensors(info->dtype)) +
                       " in the file but parameters must be floating");
    matched.emplace_back(s.key, info);
  }
  for (const safetensors::TensorInfo& t : reader.header().tensors) {
    bool known = false;
    for (const nn::StateSpec& s : spec) known |= s.key == t.name;
    if (!known) result.unexpected_keys.push_back(t.name);
  }
  if (options.strict && (!result.missing_keys.empty() || !result.unexpected_keys.empty())) {
    std::string msg = path + ": the file does not match the model";
    if (!result.missing_keys.empty())
      msg += "; missing in the file: " + key_list(result.missing_keys);
    if (!result.unexpected_keys.empty())
      msg += "; not in the model: " + key_list(result.unexpected_keys);
    throw ShapeError(msg + " (pass LoadOptions{.strict = false} to load the common keys)");
  }
  std::map<std::string, Tensor> state;
  for (const auto& [key, info] : matched) state.emplace(key, reader.read(*info, device));
  try {
    module.load_state_dict(state, nn::LoadOptions{.strict = false});
  } catch (const ShapeError& e) {
    throw ShapeError(path + ": " + e.what());
  } catch (const DTypeError& e) {
    throw DTypeError(path + ": " + e.what());
  }
  return result;
}

nn::LoadResult load(nn::Module& module, const std::string& path, const nn::LoadOptions& options) {
  return load(module, path, default_device(), options);
}

}  // namespace bp
