// Picks the vector-math table (Note [CPU vector math] in cpu_vmath.hpp).
#include "cpu_vmath.hpp"

#include <cstdlib>
#include <cstring>

namespace bp::cpu::vmath {
namespace {

const Table& choose() {
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f");
  const char* cap = std::getenv("BACKPLANE_CPU_ISA");
  const bool allow512 = !cap || !*cap || std::strcmp(cap, "avx512") == 0;
  const bool allow2 = allow512 || std::strcmp(cap, "avx2") == 0;
  if (avx512 && allow512) return kAvx512Table;
  if (avx2 && allow2) return kAvx2Table;
  return kSse2Table;
}

}  // namespace

const Table& table() {
  static const Table& t = choose();
  return t;
}

}  // namespace bp::cpu::vmath
