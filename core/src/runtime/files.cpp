// Output targets and private folders (files.hpp).
#include "runtime/files.hpp"

#include <backplane/errors.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace bp::detail {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a named pipe (FIFO)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISREG(mode)) return "a regular file";
  return "not a regular file";
}

std::string output_target(const std::string& path, const std::string& what) {
  std::string p = path;
  for (int links = 0;; ++links) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) {
      if (errno == ENOENT) return p;  // a new file
      throw IOError(what + ": cannot inspect " + p + ": " + std::strerror(errno));
    }
    if (S_ISREG(st.st_mode)) return p;
    if (!S_ISLNK(st.st_mode))
      throw IOError(what + ": " + p + (p == path ? "" : " (where " + path + " leads)") + " is " +
                    file_kind(st.st_mode) +
                    ", not a regular file; outputs are written only to regular files or new paths");
    if (links >= 40) throw IOError(what + ": " + path + ": more than 40 symbolic links to follow");
    std::string target(static_cast<size_t>(st.st_size > 0 ? st.st_size : 4096) + 1, '\0');
    ssize_t n = ::readlink(p.c_str(), target.data(), target.size());
    if (n < 0) throw IOError(what + ": cannot read the link " + p + ": " + std::strerror(errno));
    target.resize(static_cast<size_t>(n));
    if (target.empty() || target[0] != '/') {
      size_t slash = p.rfind('/');
      target = (slash == std::string::npos ? std::string() : p.substr(0, slash + 1)) + target;
    }
    p = target;
  }
}

int open_private_dir(const std::string& dir, std::string& why) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    why = "cannot create " + dir + ": " + std::strerror(errno);
    return -1;
  }
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    struct stat st {};
    if (::lstat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
      why = dir + " is " + std::string(file_kind(st.st_mode)) + ", not a private directory";
    else
      why = "cannot open " + dir + ": " + std::strerror(e);
    return -1;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_uid != ::geteuid()) {
    why = dir + " belongs to uid " + std::to_string(st.st_uid) + ", not to this user (uid " +
          std::to_string(::geteuid()) + "); remove it or set BACKPLANE_STATS_DIR";
    ::close(fd);
    return -1;
  }
  if ((st.st_mode & 077) != 0 && ::fchmod(fd, 0700) != 0) {
    why = "cannot make " + dir + " private (mode 0700): " + std::strerror(errno);
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace bp::detail
