// The op catalogue as the host sees it (Note [Op catalogue] in plugin_abi.h). Op ids index
// the per-device kernel cache, so adding an op appends to this enum and to kOpNames.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace bp {

enum class Op : int32_t {
  fill,
  copy,
  cast,
  add,
  sub,
  mul,
  div,
  pow,
  maximum,
  minimum,
  eq,
  ne,
  lt,
  le,
  gt,
  ge,
  where,
  neg,
  exp,
  log,
  sqrt,
  relu,
  sigmoid,
  tanh,
  abs,
  sum,
  mean,
  max,
  matmul,
  uniform,
  normal,
  count_
};
inline constexpr int kNumOps = static_cast<int>(Op::count_);

inline constexpr std::array<std::string_view, kNumOps> kOpNames = {
    "fill",    "copy",    "cast", "add", "sub",    "mul",     "div",     "pow",
    "maximum", "minimum", "eq",   "ne",  "lt",     "le",      "gt",      "ge",
    "where",   "neg",     "exp",  "log", "sqrt",   "relu",    "sigmoid", "tanh",
    "abs",     "sum",     "mean", "max", "matmul", "uniform", "normal"};

inline constexpr std::string_view op_name(Op op) {
  return kOpNames[static_cast<int>(op)];
}
inline std::optional<Op> op_from_name(std::string_view name) {
  for (int i = 0; i < kNumOps; ++i)
    if (kOpNames[i] == name) return static_cast<Op>(i);
  return std::nullopt;
}

}  // namespace bp
