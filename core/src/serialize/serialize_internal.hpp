// Internal: switches of the atomic save for tests (Note [Atomic save] in serialize.hpp).
#pragma once

#include <backplane/export.hpp>

namespace bp::detail {

// true (the default): saves write an unnamed O_TMPFILE where the file system supports it.
// false: always a named "<path>.tmp.<host>.<pid>.<n>" file, the fallback's path, so tests can
// exercise it on any file system. Thread-safe; affects saves that start afterwards.
// Exported deliberately (a test switch, not public API: this header is not installed).
BP_API void set_anonymous_temporaries(bool on);

}  // namespace bp::detail
