// Internal: switches of the atomic save for tests (Note [Atomic save] in serialize.hpp).
#pragma once

#include <backplane/export.hpp>

#include <string>
#include <string_view>

namespace bp::detail {

// true (the default): saves write an unnamed O_TMPFILE where the file system supports it.
// false: always a named "<path>.tmp.<host>.<pid>.<n>" file, the fallback's path, so tests can
// exercise it on any file system. Thread-safe; affects saves that start afterwards.
// Exported deliberately (a test switch, not public API: this header is not installed).
BP_API void set_anonymous_temporaries(bool on);

// Writes `bytes` to `path` as save() writes a safetensors file (Note [Atomic save], Note
// [Output targets]): the old file stays whole until the new one is complete. IOError naming
// the path.
void write_file_atomic(const std::string& path, std::string_view bytes);

}  // namespace bp::detail
