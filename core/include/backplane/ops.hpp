// The op catalogue as the host sees it (Note [Op catalogue] in plugin_abi.h), generated from
// the X-macro of backplane/op_list.h; an op's value is its catalogue number. Op ids index the
// per-device kernel cache.
#pragma once

#include <backplane/abi/op_list.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace bp {

enum class Op : int32_t {
#define BP_OP_X_ENUM(name, Name, ...) name,
  BP_OP_CATALOGUE(BP_OP_X_ENUM)
#undef BP_OP_X_ENUM
      count_
};
inline constexpr int kNumOps = static_cast<int>(Op::count_);

inline constexpr std::array<std::string_view, kNumOps> kOpNames = {
#define BP_OP_X_NAME(name, ...) #name,
    BP_OP_CATALOGUE(BP_OP_X_NAME)
#undef BP_OP_X_NAME
};

inline constexpr std::string_view op_name(Op op) {
  return kOpNames[static_cast<size_t>(op)];
}
inline std::optional<Op> op_from_name(std::string_view name) {
  for (size_t i = 0; i < kOpNames.size(); ++i)
    if (kOpNames[i] == name) return static_cast<Op>(i);
  return std::nullopt;
}

}  // namespace bp
