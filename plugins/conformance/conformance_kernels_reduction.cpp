// Kernel cases of the reductions (sum, mean, max, sumsq, norm): every dimension where the output
// has size 1
// and the input does not is reduced (Note [Op catalogue] in plugin_abi.h).
#include "conformance_kernels.hpp"

#include <cmath>
#include <limits>

namespace bpc {

namespace {

struct ReduceCase {
  const char* variant;
  std::vector<int64_t> in_shape, out_shape;
  enum Layout { dense, permuted, broadcast } layout = dense;
};

// Reference: reduce `in` (row-major logical values of in_shape) to out_shape.
std::vector<double> reduce_ref(const std::string& op, const std::vector<double>& in,
                               const std::vector<int64_t>& in_shape,
                               const std::vector<int64_t>& out_shape) {
  const size_t rank = in_shape.size();
  const int64_t n_out = count(out_shape);
  std::vector<double> acc(static_cast<size_t>(n_out),
                          op == "max" ? -std::numeric_limits<double>::infinity() : 0.0);
  std::vector<int64_t> cnt(static_cast<size_t>(n_out), 0);
  std::vector<int64_t> out_strides = contiguous_strides(out_shape);
  std::vector<int64_t> idx(rank, 0);
  for (size_t i = 0; i < in.size(); ++i) {
    int64_t o = 0;
    for (size_t d = 0; d < rank; ++d)
      if (out_shape[d] != 1) o += idx[d] * out_strides[d];
    auto oi = static_cast<size_t>(o);
    const bool squares = op == "sumsq" || op == "norm";
    acc[oi] = op == "max" ? std::max(acc[oi], in[i]) : acc[oi] + (squares ? in[i] * in[i] : in[i]);
    ++cnt[oi];
    for (size_t d = rank; d-- > 0;) {
      if (++idx[d] < in_shape[d]) break;
      idx[d] = 0;
    }
  }
  if (op == "norm")
    for (double& v : acc) v = std::sqrt(v);
  if (op == "mean")
    for (size_t i = 0; i < acc.size(); ++i)
      acc[i] = cnt[i] ? acc[i] / static_cast<double>(cnt[i]) : std::nan("");
  return acc;
}

Range reduce_range(const std::string& op, int32_t dt, bool large) {
  if (!is_float_dtype(dt)) return op == "sum" ? Range{-100, 100, true} : default_range(dt);
  if (op == "max") return default_range(dt);
  // Squares are never negative: signed inputs test the squaring, and f16 squares of a million
  // elements stay far below 65504.
  if (op == "sumsq" || op == "norm")
    return dt == BP_DTYPE_F16 && large ? Range{-1.0 / 256, 1.0 / 256} : Range{-2.0, 2.0};
  // Positive values: no cancellation, so the relative error measures accumulation only. f16
  // sums of a million elements are kept well below 65504.
  if (dt == BP_DTYPE_F16 && large) return {1.0 / 1024, 1.0 / 256};
  return {0.5, 2.0};
}

void run_reduce(Context& ctx, const OpInfo& op, int32_t dt, const ReduceCase& c) {
  const std::string what =
      format("%s %s (%s) on %s, seed %llu", op.name, bp_dtype_name(dt), c.variant,
             ctx.device_label().c_str(), static_cast<unsigned long long>(ctx.seed()));
  Rng rng(ctx.seed_for(std::string(op.name) + "_" + c.variant + "/" + bp_dtype_name(dt)));
  bool large = count(c.in_shape) >= (int64_t{1} << 20);
  Range r = reduce_range(op.name, dt, large);
  HostTensor in;
  switch (c.layout) {
    case ReduceCase::permuted:
      in = random_permuted(rng, dt, c.in_shape, {2, 0, 1}, r);
      break;
    case ReduceCase::broadcast:
      in = random_broadcast(rng, dt, c.in_shape, {false, true, true}, r);
      break;
    default:
      in = random_dense(rng, dt, c.in_shape, r);
      break;
  }
  DeviceTensor din = upload(ctx, in);
  DeviceTensor out = make_output(ctx, dt, c.out_shape);
  std::string full = what + ": " + describe_launch(op.name, {&in}, c.out_shape, dt);
  bool empty_reduction = count(c.in_shape) == 0 && count(c.out_shape) > 0;
  if (empty_reduction && std::string(op.name) == "max") {
    run_kernel_expect_error(ctx, op.name, dt, {din.desc}, out.desc, {}, BP_ERROR_INVALID_ARGUMENT,
                            full + " (max of zero elements)");
    return;
  }
  std::vector<double> ref = reduce_ref(op.name, in.logical(), c.in_shape, c.out_shape);
  for (double& v : ref) v = round_to(dt, v);
  run_kernel(ctx, op.name, dt, {din.desc}, out.desc, {}, full);
  expect_close(read_dense(out, full), ref, dt, tolerance(dt), full);
}

}  // namespace

void reduction_cases(const OpInfo& op, int32_t dt, CaseList& out) {
  static const std::vector<ReduceCase> cases = {
      {"all", {6, 5, 7}, {1, 1, 1}},
      {"dim", {6, 5, 7}, {6, 1, 7}},
      {"inner", {6, 5, 7}, {6, 5, 1}},
      {"dims", {6, 5, 7}, {1, 5, 1}},
      {"keep", {6, 5, 7}, {6, 5, 7}},
      {"size1", {6, 1, 7}, {1, 1, 7}},
      {"strided", {6, 5, 7}, {1, 5, 1}, ReduceCase::permuted},
      {"broadcast", {6, 5, 7}, {1, 1, 1}, ReduceCase::broadcast},
      {"rank0", {}, {}},
      {"empty", {4, 0}, {4, 1}},
      {"empty_output", {0, 5}, {0, 1}},
      {"large", {kLargeRows, kLargeCols}, {kLargeRows, 1}},
      {"large_all", {(int64_t{1} << 20) + 5}, {1}},
      {"large_columns", {kLargeRows, kLargeCols}, {1, kLargeCols}},
      // Column sums of a matrix whose rows are a multiple of 16 bytes (bias gradients; a
      // vectorised path on some devices), a row count that leaves a remainder in every chunk.
      {"columns_wide", {kLargeRows, 264}, {1, 264}},
      {"columns_wide_few_rows", {3, 520}, {1, 520}},
  };
  const OpInfo* p = &op;
  for (const ReduceCase& c : cases) {
    const ReduceCase* cp = &c;
    out.push_back({c.variant, [p, dt, cp](Context& ctx) { run_reduce(ctx, *p, dt, *cp); }});
  }
}

}  // namespace bpc
