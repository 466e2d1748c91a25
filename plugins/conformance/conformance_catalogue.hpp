// The op catalogue as conformance tests it (Note [Op catalogue] and Note [Dtype domains] in
// plugin_abi.h, names and domains from op_catalogue.h), and the support a plugin declares for
// one device: from list_ops (minor >= 1) or, for a minor-0 table or a NULL list_ops, by probing
// find_kernel over the catalogue.
#pragma once

#include "conformance_harness.hpp"

#include <backplane/abi/op_catalogue.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace bpc {

enum class OpKind {
  fill,
  copy,
  cast,
  binary,
  compare,
  where,
  unary,
  reduce,
  matmul,
  random,
  conv,     // conv2d and its backward ops
  pool,     // max, average and adaptive average pooling and their backward
  norm,     // batch_norm, batch_norm_backward, dropout
  index,    // max_dim, min_dim, gather, scatter_add
  softmax,  // softmax, log_softmax and their backward
  // The transformer family (minor 5): layer_norm, gelu, silu (and backward), embedding (and
  // backward), triu, tril, cumsum; sin, cos and rsqrt are unary.
  transformer,
  attention,  // scaled_dot_product_attention and its backward
  optim,      // adamw (minor 7)
  loss,       // cross_entropy and its backward (minor 8)
};

struct OpInfo {
  const char* name;
  OpKind kind;
  uint32_t dtypes;  // the op's dtype domain: bit d set for each dtype d it is defined for
};

// Every op of the catalogue, in the order of plugin_abi.h.
const std::vector<OpInfo>& catalogue();
const OpInfo* find_op(const std::string& name);
bool defines(const OpInfo& op, int32_t dtype);

struct Support {
  int32_t support = BP_SUPPORT_NO;
  std::string reason;
  bool declared = false;  // listed by list_ops (always false when probing)
};

// The (op, dtype) support of one device. Built once per group.
class SupportTable {
 public:
  // Reads list_ops when the table has it, else probes find_kernel for every catalogue pair.
  // Never throws for a plugin's misbehaviour: problems() collects what was wrong.
  static SupportTable build(Context& ctx);

  Support get(const std::string& op, int32_t dtype) const;
  bool supported(const std::string& op, int32_t dtype) const {
    return get(op, dtype).support != BP_SUPPORT_NO;
  }
  // "list_ops" or "find_kernel probing (...)".
  const std::string& source() const { return source_; }
  // Inconsistencies in the declaration (unknown op names, bad dtypes, duplicates, missing
  // reasons, entries with a bad struct_size).
  const std::vector<std::string>& problems() const { return problems_; }
  // Entries declared for ops outside the catalogue (name, dtype).
  const std::vector<std::pair<std::string, int32_t>>& unknown() const { return unknown_; }

 private:
  std::map<std::pair<std::string, int32_t>, Support> entries_;
  std::string source_;
  std::vector<std::string> problems_;
  std::vector<std::pair<std::string, int32_t>> unknown_;
};

// Why support is probed rather than read from list_ops for this table.
std::string api_minor_note(const bp_plugin_api* api);

// Resolves a kernel; throws Failure naming op and dtype when find_kernel fails.
bp_kernel* find_kernel_checked(Context& ctx, const std::string& op, int32_t dtype);

}  // namespace bpc
