// Internal: where outputs may be written (Note [Output targets]) and private folders in shared
// temporary places (Note [Private folders]).
#pragma once

#include <sys/types.h>

#include <string>

namespace bp::detail {

// Note [Output targets]
//   Outputs (bp::save, profiler::save, BACKPLANE_TRACE) are written beside their target and
//   renamed over it, and a rename replaces whatever the name is: /dev/null, a FIFO, a folder's
//   symbolic link. So the target is checked first. A path that does not exist or is a regular
//   file is written. A symbolic link is followed (at most 40 links) to its final target, which
//   must be a regular file or not exist: the file there is replaced and the link keeps pointing
//   at it. Anything else — a directory, a character or block device, a FIFO, a socket — is an
//   IOError saying what it is, before anything is written.

// The path to write and rename over for an output named `path`; IOError "<what>: <path> is a
// character device, not a regular file; ..." otherwise.
std::string output_target(const std::string& path, const std::string& what);

// "a directory", "a character device", "a named pipe (FIFO)", ... for a file mode.
const char* file_kind(mode_t mode);

// Note [Private folders]
//   A folder in a place every user can write (/tmp) may have been made, or replaced by a
//   symbolic link, by someone else, who could then plant links inside it to make us overwrite
//   their targets. So such a folder is created with mode 0700, and opened only when it is a
//   directory (O_NOFOLLOW: not a link) owned by this user; its mode is then tightened to 0700.
//   Files inside are opened relative to that descriptor with O_NOFOLLOW (openat), so a link
//   planted before the check is never followed.

// Creates (0700) or opens `dir` as this user's private folder; returns its descriptor
// (O_DIRECTORY | O_CLOEXEC), or -1 with `why` saying what is wrong with it.
int open_private_dir(const std::string& dir, std::string& why);

}  // namespace bp::detail
