// Kernel cases of the indexing ops (Note [Op catalogue], minor 4): max_dim and min_dim (values
// and I64 indices along AXIS, the first extreme on ties, NaN as the extreme), gather and
// scatter_add along AXIS with repeated indices (scatter_add's contributions in row-major order of
// src, the same result on every run), in place, empty, and an index outside [0, size) refused
// with BP_ERROR_INVALID_ARGUMENT naming the index and the size.
#include "conformance_kernels.hpp"

#include <cmath>
#include <cstring>
#include <limits>

namespace bpc {

namespace {

// Row-major positions of a tensor of `shape` decomposed around `axis`: outer x axis x inner.
struct AxisView {
  int64_t outer = 1, len = 1, inner = 1;
  AxisView(const std::vector<int64_t>& shape, int64_t axis) {
    for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
      const int64_t s = shape[static_cast<size_t>(d)];
      if (d < axis) outer *= s;
      if (d == axis) len = s;
      if (d > axis) inner *= s;
    }
  }
};

std::vector<int64_t> with_dim(std::vector<int64_t> shape, int64_t axis, int64_t v) {
  shape[static_cast<size_t>(axis)] = v;
  return shape;
}

struct ReduceDimCase {
  const char* variant;
  std::vector<int64_t> shape;
  int64_t axis;
  enum Data { random, ties, nan } data = random;
};

void run_max_dim(Context& ctx, const OpInfo& op, int32_t dt, const ReduceDimCase& c) {
  const bool is_max = std::string(op.name) == "max_dim";
  const std::string what = case_label(ctx, op, dt, c.variant);
  Rng rng(ctx.seed_for(std::string(op.name) + "_" + c.variant + "/" + bp_dtype_name(dt)));
  Range r = default_range(dt);
  if (c.data == ReduceDimCase::ties) r.small_set = true;
  HostTensor x = random_dense(rng, dt, c.shape, r);
  if (c.data == ReduceDimCase::nan)
    for (double& v : x.storage)
      if (rng.integer(0, 4) == 0) v = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> xv = x.logical();
  const AxisView a(c.shape, c.axis);
  const std::vector<int64_t> out_shape = with_dim(c.shape, c.axis, 1);
  std::vector<double> val(static_cast<size_t>(a.outer * a.inner)), idx(val.size());
  for (int64_t o = 0; o < a.outer; ++o)
    for (int64_t i = 0; i < a.inner; ++i) {
      double best = 0;
      int64_t at = -1;
      for (int64_t j = 0; j < a.len; ++j) {
        const double v = xv[static_cast<size_t>((o * a.len + j) * a.inner + i)];
        if (at >= 0 && std::isnan(best)) break;
        if (at < 0 || std::isnan(v) || (is_max ? v > best : v < best)) {
          best = v;
          at = j;
        }
      }
      val[static_cast<size_t>(o * a.inner + i)] = best;
      idx[static_cast<size_t>(o * a.inner + i)] = static_cast<double>(at);
    }
  DeviceTensor dx = upload(ctx, x);
  DeviceTensor dv = make_output(ctx, dt, out_shape), di = make_output(ctx, BP_DTYPE_I64, out_shape);
  const std::string full =
      what + ": " +
      describe_launch(op.name, {&x}, out_shape, dt,
                      format("axis %lld; and i64 indices", static_cast<long long>(c.axis)));
  run_kernel_n(ctx, op.name, dt, {dx.desc}, {dv.desc, di.desc}, {attr_int("axis", c.axis)}, full);
  expect_close(read_dense(dv, full), val, dt, 0, full + " (values: a copy of the extreme)");
  expect_close(read_dense(di, full), idx, BP_DTYPE_I64, 0,
               full + " (indices: the first extreme, a NaN first)");
}

struct GatherCase {
  const char* variant;
  std::vector<int64_t> x_shape, index_shape;  // scatter_add: base and index/src shapes
  int64_t axis;
  int64_t bad_index = 0;  // != 0: one index is this value (past the end or negative)
  bool inplace = false;
};

// An index tensor of `shape` with values in [0, size) along `axis`; with `bad`, one element
// (in the middle) is set to `bad`. Returns the position of the bad element in `bad_at`.
HostTensor make_index(Rng& rng, const std::vector<int64_t>& shape, int64_t size, int64_t bad,
                      int64_t* bad_at) {
  HostTensor t =
      random_dense(rng, BP_DTYPE_I64, shape, Range{0, static_cast<double>(size - 1), true});
  if (bad && !t.storage.empty()) {
    *bad_at = static_cast<int64_t>(t.storage.size() / 2);
    t.storage[static_cast<size_t>(*bad_at)] = static_cast<double>(bad);
  }
  return t;
}

// The position in x (row-major) of element `i` of an index-shaped tensor with i_axis replaced.
int64_t target_of(const std::vector<int64_t>& x_shape, const std::vector<int64_t>& ishape,
                  int64_t axis, int64_t i, int64_t index_value) {
  int64_t off = 0, stride = 1;
  for (int64_t d = static_cast<int64_t>(ishape.size()) - 1; d >= 0; --d) {
    const int64_t pos = i % ishape[static_cast<size_t>(d)];
    i /= ishape[static_cast<size_t>(d)];
    off += (d == axis ? index_value : pos) * stride;
    stride *= x_shape[static_cast<size_t>(d)];
  }
  return off;
}

void expect_index_error(Context& ctx, const OpInfo& op, int32_t dt,
                        const std::vector<bp_tensor_desc>& ins, const bp_tensor_desc& out,
                        const std::vector<bp_attr>& attrs, const GatherCase& c, int64_t size,
                        const std::string& full) {
  const std::string msg = run_kernel_n_expect_error(
      ctx, op.name, dt, ins, {out}, attrs, BP_ERROR_INVALID_ARGUMENT,
      full + format(" (index %lld outside [0, %lld))", static_cast<long long>(c.bad_index),
                    static_cast<long long>(size)));
  for (const std::string& part : {std::to_string(c.bad_index), std::to_string(size)})
    if (msg.find(part) == std::string::npos)
      throw Failure(full + ": the error does not name the index " + std::to_string(c.bad_index) +
                    " and the size " + std::to_string(size) + ": " + msg);
}

void run_gather(Context& ctx, const OpInfo& op, int32_t dt, const GatherCase& c) {
  const std::string what = case_label(ctx, op, dt, c.variant);
  Rng rng(ctx.seed_for(std::string(op.name) + "_" + c.variant + "/" + bp_dtype_name(dt)));
  const int64_t size = c.x_shape[static_cast<size_t>(c.axis)];
  HostTensor x = random_dense(rng, dt, c.x_shape, default_range(dt));
  int64_t bad_at = -1;
  HostTensor index = make_index(rng, c.index_shape, size, c.bad_index, &bad_at);
  const std::vector<double> xv = x.logical(), iv = index.logical();
  std::vector<double> ref(iv.size());
  for (size_t i = 0; i < iv.size(); ++i)
    if (static_cast<int64_t>(i) != bad_at)
      ref[i] = xv[static_cast<size_t>(target_of(
          c.x_shape, c.index_shape, c.axis, static_cast<int64_t>(i), static_cast<int64_t>(iv[i])))];
  DeviceTensor dx = upload(ctx, x), di = upload(ctx, index);
  DeviceTensor out = make_output(ctx, dt, c.index_shape);
  const std::vector<bp_attr> attrs = {attr_int("axis", c.axis)};
  const std::string full = what + ": " +
                           describe_launch(op.name, {&x, &index}, c.index_shape, dt,
                                           format("axis %lld", static_cast<long long>(c.axis)));
  if (c.bad_index) {
    expect_index_error(ctx, op, dt, {dx.desc, di.desc}, out.desc, attrs, c, size, full);
    return;
  }
  run_kernel(ctx, op.name, dt, {dx.desc, di.desc}, out.desc, attrs, full);
  expect_close(read_dense(out, full), ref, dt, 0, full + " (a copy of the indexed elements)");
}

// The reference of scatter_add: base, then each src element added in row-major order, in
// float64 (floats; compared with the reduction tolerance against the sum of magnitudes) or in
// exact integers wrapped to the dtype.
double wrap_to(int32_t dt, double v) {
  if (dt == BP_DTYPE_U8) return static_cast<double>(static_cast<uint8_t>(static_cast<int64_t>(v)));
  if (dt == BP_DTYPE_I32)
    return static_cast<double>(
        static_cast<int32_t>(static_cast<uint32_t>(static_cast<int64_t>(v))));
  return v;
}

void run_scatter_add(Context& ctx, const OpInfo& op, int32_t dt, const GatherCase& c) {
  const std::string what = case_label(ctx, op, dt, c.variant);
  Rng rng(ctx.seed_for(std::string(op.name) + "_" + c.variant + "/" + bp_dtype_name(dt)));
  const int64_t size = c.x_shape[static_cast<size_t>(c.axis)];
  HostTensor base = random_dense(rng, dt, c.x_shape, default_range(dt));
  int64_t bad_at = -1;
  HostTensor index = make_index(rng, c.index_shape, size, c.bad_index, &bad_at);
  HostTensor src = random_dense(rng, dt, c.index_shape, default_range(dt));
  const std::vector<double> iv = index.logical(), sv = src.logical();
  std::vector<double> ref = base.logical(), mag(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) mag[i] = std::fabs(ref[i]);
  for (size_t i = 0; i < sv.size(); ++i) {
    if (static_cast<int64_t>(i) == bad_at) continue;
    const auto t = static_cast<size_t>(target_of(
        c.x_shape, c.index_shape, c.axis, static_cast<int64_t>(i), static_cast<int64_t>(iv[i])));
    ref[t] += sv[i];
    mag[t] += std::fabs(sv[i]);
  }
  for (double& v : ref) v = is_float_dtype(dt) ? round_to(dt, v) : wrap_to(dt, v);
  DeviceTensor db = upload(ctx, base), di = upload(ctx, index), ds = upload(ctx, src);
  DeviceTensor out = make_output(ctx, dt, c.x_shape);
  std::vector<bp_attr> attrs = {attr_int("axis", c.axis)};
  if (c.inplace) attrs.push_back(attr_int("inplace", 1));
  const bp_tensor_desc& od = c.inplace ? db.desc : out.desc;
  const std::string full = what + ": " +
                           describe_launch(op.name, {&base, &index, &src}, c.x_shape, dt,
                                           format("axis %lld%s", static_cast<long long>(c.axis),
                                                  c.inplace ? ", inplace (out is base)" : ""));
  if (c.bad_index) {
    expect_index_error(ctx, op, dt, {db.desc, di.desc, ds.desc}, od, attrs, c, size, full);
    return;
  }
  run_kernel(ctx, op.name, dt, {db.desc, di.desc, ds.desc}, od, attrs, full);
  std::vector<double> got = read_dense(c.inplace ? db : out, full);
  if (is_float_dtype(dt))
    expect_close_mag(got, ref, mag, dt, bp_test::OpClass::reduction, full);
  else
    expect_close(got, ref, dt, 0, full + " (integers add exactly and wrap)");
  if (c.inplace) return;
  // The order of the contributions is fixed (row-major in src): a second run gives the same
  // bits.
  run_kernel(ctx, op.name, dt, {db.desc, di.desc, ds.desc}, out.desc, attrs, full + " (again)");
  std::vector<double> again = read_dense(out, full);
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &again[i], sizeof(double)) != 0)
      throw Failure(full + format(": element %zu is %.17g in one run and %.17g in the next: the "
                                  "contributions must add in row-major order of src",
                                  i, got[i], again[i]));
}

}  // namespace

void index_cases(const OpInfo& op, int32_t dt, CaseList& out) {
  const std::string name = op.name;
  const OpInfo* p = &op;
  if (name == "max_dim" || name == "min_dim") {
    static const std::vector<ReduceDimCase> cases = {
        {"axis0", {6, 5, 7}, 0},
        {"axis1", {6, 5, 7}, 1},
        {"axis2", {6, 5, 7}, 2},
        {"rank1", {37}, 0},
        {"size1", {4, 1, 5}, 1},
        {"ties", {8, 9, 3}, 1, ReduceDimCase::ties},
        {"ties_last", {5, 40}, 1, ReduceDimCase::ties},
        {"nan", {6, 7, 2}, 1, ReduceDimCase::nan},
        {"empty", {0, 5}, 1},
        {"empty_inner", {3, 4, 0}, 1},
        {"large", {kLargeRows, kLargeCols}, 1},
        {"large_axis0", {kLargeRows, kLargeCols}, 0},
    };
    for (const ReduceDimCase& c : cases) {
      if (c.data == ReduceDimCase::nan && !is_float_dtype(dt)) continue;
      const ReduceDimCase* cp = &c;
      out.push_back({c.variant, [p, dt, cp](Context& ctx) { run_max_dim(ctx, *p, dt, *cp); }});
    }
    return;
  }
  const bool scatter = name == "scatter_add";
  // variant, x (base) shape, index (src) shape, axis, bad index, inplace
  static const std::vector<GatherCase> cases = {
      {"axis0", {5, 6, 7}, {8, 6, 7}, 0},
      {"axis1", {5, 6, 7}, {5, 3, 7}, 1},
      {"axis2", {5, 6, 7}, {5, 6, 11}, 2},
      // The index smaller than x in the other dimensions too.
      {"smaller", {5, 6, 7}, {3, 4, 9}, 2},
      {"rank1", {29}, {41}, 0},
      // Many indices into few positions: every element is hit about 12 times.
      {"repeated", {4, 3}, {50, 3}, 0},
      {"empty", {5, 6}, {0, 6}, 0},
      {"inplace", {6, 9}, {6, 20}, 1, 0, true},
      {"large", {kLargeRows, kLargeCols}, {kLargeRows, 300}, 1},
      {"index_past_end", {4, 7}, {4, 5}, 1, 10},
      {"index_negative", {4, 7}, {4, 5}, 1, -2},
      // One index along AXIS (a class per row, as cross_entropy's gather): each output element
      // takes at most one contribution, a path of its own on some devices.
      {"one_per_row", {64, 1000}, {64, 1}, 1},
      {"one_axis0", {7, 9, 5}, {1, 9, 5}, 0},
      {"one_smaller", {5, 6, 7}, {3, 4, 1}, 2},
      {"one_inplace", {6, 9}, {6, 1}, 1, 0, true},
      {"one_index_past_end", {4, 7}, {4, 1}, 1, 10},
      {"one_index_negative", {5, 3}, {1, 3}, 0, -1},
  };
  for (const GatherCase& c : cases) {
    if (c.inplace && !scatter) continue;
    const GatherCase* cp = &c;
    out.push_back({c.variant, [p, dt, cp, scatter](Context& ctx) {
                     if (scatter)
                       run_scatter_add(ctx, *p, dt, *cp);
                     else
                       run_gather(ctx, *p, dt, *cp);
                   }});
  }
}

}  // namespace bpc
