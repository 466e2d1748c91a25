// Saving tensors and modules atomically (Note [Atomic save] in serialize.hpp) and loading
// files into modules.
#include <backplane/runtime.hpp>
#include <backplane/serialize.hpp>

#include "tensor_internal.hpp"

#include <fcntl.h>
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

// A temporary file beside `path` that replaces `path` on commit() and is removed otherwise.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path) : path_(path) {
    static std::atomic<uint64_t> counter{0};
    for (int attempt = 0; attempt < 100; ++attempt) {
      tmp_ = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
      fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ >= 0 || errno != EEXIST) break;
    }
    if (fd_ < 0)
      throw IOError(path + ": cannot create the temporary file " + tmp_ + ": " + errno_text(errno));
  }
  ~AtomicFile() {
    if (committed_) return;
    if (fd_ >= 0) ::close(fd_);
    ::unlink(tmp_.c_str());
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
  [[noreturn]] void fail(const std::string& what) {
    throw IOError(path_ + ": " + what + ": " + errno_text(errno));
  }

  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t written_ = 0;
  bool committed_ = false;
};

std::string shape_str(const Shape& s) {
  if (s.empty()) return "[] (scalar)";
  std::string out = "[";
  for (size_t k = 0; k < s.size(); ++k)
    out += (k ? ", " : "") + (s[k] < 0 ? std::string("?") : std::to_string(s[k]));
  return out + "]";
}

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
      throw ShapeError(path + ": '" + s.key + "' has shape " + shape_str(info->shape) +
                       " in the file but the model expects " + shape_str(s.shape));
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
