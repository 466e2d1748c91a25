// bp::sdk::Op: the op catalogue (Note [Op catalogue] in backplane/abi/plugin_abi.h) as a C++ enum
// for backends, generated from the one list, BP_OP_CATALOGUE of backplane/abi/op_list.h, like the
// C numbers (bp_op) and libbackplane's bp::Op. Header-only.
#ifndef BACKPLANE_SDK_OPS_HPP_
#define BACKPLANE_SDK_OPS_HPP_

#include <backplane/abi/op_catalogue.h>

#include <cstdint>

namespace bp::sdk {

// Op::kAdd == BP_OP_ADD, ... in catalogue order.
enum class Op : int32_t {
#define BP_OP_X_ENUM(name, Name, ...) k##Name,
  BP_OP_CATALOGUE(BP_OP_X_ENUM)
#undef BP_OP_X_ENUM
      kCount
};
inline constexpr int32_t kNumOps = static_cast<int32_t>(Op::kCount);
static_assert(kNumOps == BP_OP_COUNT, "bp::sdk::Op and bp_op disagree");

// Catalogue name of an op ("add").
inline const char* op_name(Op op) {
  return bp_op_name(static_cast<int32_t>(op));
}

}  // namespace bp::sdk

#endif  // BACKPLANE_SDK_OPS_HPP_
