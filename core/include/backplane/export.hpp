// BP_API marks what libbackplane exports. The library is built with hidden visibility: a class
// or function of the public headers without BP_API is not reachable from outside it (classes
// whose objects cross the boundary, exceptions included, carry it on the class so that their
// type information is shared and `catch (const bp::Error&)` works in the user's program).
#pragma once

#if defined(_WIN32)
#if defined(BP_BUILDING_LIBRARY)
#define BP_API __declspec(dllexport)
#else
#define BP_API __declspec(dllimport)
#endif
#else
#define BP_API __attribute__((visibility("default")))
#endif
