#include "conformance_catalogue.hpp"

#include <set>

namespace bpc {

namespace {

constexpr uint32_t bit(int32_t d) {
  return 1u << d;
}

// The family of each catalogue op, which decides the shape variants its cases run.
OpKind kind_of(int32_t op) {
  switch (op) {
    case BP_OP_FILL:
      return OpKind::fill;
    case BP_OP_COPY:
      return OpKind::copy;
    case BP_OP_CAST:
      return OpKind::cast;
    case BP_OP_EQ:
    case BP_OP_NE:
    case BP_OP_LT:
    case BP_OP_LE:
    case BP_OP_GT:
    case BP_OP_GE:
      return OpKind::compare;
    case BP_OP_WHERE:
      return OpKind::where;
    case BP_OP_NEG:
    case BP_OP_EXP:
    case BP_OP_LOG:
    case BP_OP_SQRT:
    case BP_OP_RELU:
    case BP_OP_SIGMOID:
    case BP_OP_TANH:
    case BP_OP_ABS:
    case BP_OP_SIN:
    case BP_OP_COS:
    case BP_OP_RSQRT:
      return OpKind::unary;
    case BP_OP_SUM:
    case BP_OP_MEAN:
    case BP_OP_MAX:
    case BP_OP_SUMSQ:
    case BP_OP_NORM:
      return OpKind::reduce;
    case BP_OP_MATMUL:
    case BP_OP_LINEAR:
      return OpKind::matmul;
    case BP_OP_UNIFORM:
    case BP_OP_NORMAL:
      return OpKind::random;
    case BP_OP_CONV2D:
    case BP_OP_CONV2D_BACKWARD_INPUT:
    case BP_OP_CONV2D_BACKWARD_WEIGHT:
      return OpKind::conv;
    case BP_OP_MAX_POOL2D:
    case BP_OP_MAX_POOL2D_BACKWARD:
    case BP_OP_AVG_POOL2D:
    case BP_OP_AVG_POOL2D_BACKWARD:
    case BP_OP_ADAPTIVE_AVG_POOL2D:
    case BP_OP_ADAPTIVE_AVG_POOL2D_BACKWARD:
      return OpKind::pool;
    case BP_OP_BATCH_NORM:
    case BP_OP_BATCH_NORM_BACKWARD:
    case BP_OP_DROPOUT:
      return OpKind::norm;
    case BP_OP_MAX_DIM:
    case BP_OP_MIN_DIM:
    case BP_OP_GATHER:
    case BP_OP_SCATTER_ADD:
      return OpKind::index;
    case BP_OP_SOFTMAX:
    case BP_OP_LOG_SOFTMAX:
    case BP_OP_SOFTMAX_BACKWARD:
    case BP_OP_LOG_SOFTMAX_BACKWARD:
      return OpKind::softmax;
    case BP_OP_LAYER_NORM:
    case BP_OP_LAYER_NORM_BACKWARD:
    case BP_OP_GELU:
    case BP_OP_GELU_BACKWARD:
    case BP_OP_SILU:
    case BP_OP_SILU_BACKWARD:
    case BP_OP_EMBEDDING:
    case BP_OP_EMBEDDING_BACKWARD:
    case BP_OP_TRIU:
    case BP_OP_TRIL:
    case BP_OP_CUMSUM:
      return OpKind::transformer;
    case BP_OP_SCALED_DOT_PRODUCT_ATTENTION:
    case BP_OP_SCALED_DOT_PRODUCT_ATTENTION_BACKWARD:
      return OpKind::attention;
    case BP_OP_ADAMW:
      return OpKind::optim;
    case BP_OP_CROSS_ENTROPY:
    case BP_OP_CROSS_ENTROPY_BACKWARD:
      return OpKind::loss;
    default:
      return OpKind::binary;
  }
}

}  // namespace

const std::vector<OpInfo>& catalogue() {
  // Names and dtype domains come from the header (op_catalogue.h, Note [Dtype domains]).
  static const std::vector<OpInfo> ops = [] {
    std::vector<OpInfo> v;
    for (int32_t op = 0; op < BP_OP_COUNT; ++op)
      v.push_back({bp_op_name(op), kind_of(op), bp_op_domain(op)});
    return v;
  }();
  return ops;
}

const OpInfo* find_op(const std::string& name) {
  for (const OpInfo& op : catalogue())
    if (name == op.name) return &op;
  return nullptr;
}

bool defines(const OpInfo& op, int32_t dtype) {
  return dtype >= 0 && dtype < BP_DTYPE_COUNT && (op.dtypes & bit(dtype)) != 0;
}

SupportTable SupportTable::build(Context& ctx) {
  SupportTable st;
  const bp_plugin_api& t = ctx.t();
  std::set<std::pair<std::string, int32_t>> seen;
  if (has_list_ops(ctx.api())) {
    st.source_ = "list_ops";
    const bp_op_support* list = nullptr;
    int32_t n = 0;
    bp_error* e = t.list_ops(ctx.device(), &list, &n);
    if (e) {
      st.problems_.push_back("list_ops failed: " + take_error(ctx.api(), e));
      n = 0;
    } else if (n < 0 || (n > 0 && !list)) {
      st.problems_.push_back(
          format("list_ops returned count %d with list %p", n, static_cast<const void*>(list)));
      n = 0;
    }
    for (int32_t i = 0; i < n; ++i) {
      const bp_op_support& s = list[i];
      if (s.struct_size < offsetof(bp_op_support, reason) + sizeof(s.reason)) {
        st.problems_.push_back(
            format("entry %d: struct_size %zu is smaller than the minor-1 "
                   "bp_op_support (%zu)",
                   i, s.struct_size, sizeof(bp_op_support)));
        continue;
      }
      if (!s.op) {
        st.problems_.push_back(format("entry %d: op is NULL", i));
        continue;
      }
      std::string op = s.op;
      if (s.dtype < 0 || s.dtype >= BP_DTYPE_COUNT) {
        st.problems_.push_back(
            format("entry %d (%s): dtype %d is not a bp_dtype", i, op.c_str(), s.dtype));
        continue;
      }
      if (s.support < BP_SUPPORT_YES || s.support > BP_SUPPORT_EXPECTED_FAIL) {
        st.problems_.push_back(format("entry %d (%s, %s): support %d is not a bp_support", i,
                                      op.c_str(), bp_dtype_name(s.dtype), s.support));
        continue;
      }
      if (!seen.insert({op, s.dtype}).second) {
        st.problems_.push_back(
            format("(%s, %s) is declared twice", op.c_str(), bp_dtype_name(s.dtype)));
        continue;
      }
      std::string reason = s.reason ? s.reason : "";
      if (!s.reason)
        st.problems_.push_back(
            format("(%s, %s): reason is NULL", op.c_str(), bp_dtype_name(s.dtype)));
      if (s.support != BP_SUPPORT_YES && reason.empty())
        st.problems_.push_back(
            format("(%s, %s) is declared %s without a reason", op.c_str(), bp_dtype_name(s.dtype),
                   s.support == BP_SUPPORT_NO ? "unsupported" : "expected to fail"));
      if (!find_op(op)) {
        st.unknown_.push_back({op, s.dtype});
        continue;
      }
      st.entries_[{op, s.dtype}] = Support{s.support, reason, true};
    }
  } else {
    st.source_ = api_minor_note(ctx.api());
  }
  // Pairs the declaration leaves out (all of them when probing) are resolved with find_kernel,
  // which is what the host does for a minor-0 plugin.
  for (const OpInfo& op : catalogue()) {
    for (int32_t d = 0; d < BP_DTYPE_COUNT; ++d) {
      if (st.entries_.count({op.name, d})) continue;
      bp_kernel* k = nullptr;
      bp_error* e = t.find_kernel(ctx.device(), op.name, d, &k);
      std::string prefix = has_list_ops(ctx.api()) ? "not declared by list_ops; " : "";
      if (e) {
        st.entries_[{op.name, d}] =
            Support{BP_SUPPORT_NO, prefix + "find_kernel: " + take_error(ctx.api(), e), false};
      } else if (!k) {
        st.entries_[{op.name, d}] = Support{
            BP_SUPPORT_NO, prefix + "find_kernel returned success with a NULL kernel", false};
        st.problems_.push_back(format("find_kernel(%s, %s) returned success with a NULL kernel",
                                      op.name, bp_dtype_name(d)));
      } else {
        st.entries_[{op.name, d}] = Support{BP_SUPPORT_YES, "", false};
      }
    }
  }
  return st;
}

std::string api_minor_note(const bp_plugin_api* api) {
  if (api->abi_minor < 1) return "find_kernel probing (minor-0 table has no list_ops)";
  if (api->struct_size < BP_API_MINOR1_OFFSET + sizeof(api->list_ops))
    return format("find_kernel probing (struct_size %zu covers only minor-0 slots)",
                  api->struct_size);
  return "find_kernel probing (list_ops is NULL)";
}

Support SupportTable::get(const std::string& op, int32_t dtype) const {
  auto it = entries_.find({op, dtype});
  if (it == entries_.end()) return Support{BP_SUPPORT_NO, "not in the catalogue", false};
  return it->second;
}

bp_kernel* find_kernel_checked(Context& ctx, const std::string& op, int32_t dtype) {
  bp_kernel* k = nullptr;
  ctx.check(ctx.t().find_kernel(ctx.device(), op.c_str(), dtype, &k),
            format("find_kernel(%s, %s)", op.c_str(), bp_dtype_name(dtype)));
  if (!k)
    throw Failure(format("find_kernel(%s, %s) succeeded but returned a NULL kernel", op.c_str(),
                         bp_dtype_name(dtype)));
  return k;
}

}  // namespace bpc
