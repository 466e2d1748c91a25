// Kernel cases of the element-wise families: fill, copy, cast, binary arithmetic, comparisons,
// where and the unary maths ops.
#include "conformance_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace bpc {

namespace {

const std::vector<int64_t> kShape = {3, 5, 7};       // odd sizes, rank 3
const std::vector<int64_t> kBcastShape = {4, 6, 5};  // broadcast / permuted views
const std::vector<int64_t> kEmptyShape = {3, 0, 4};
const std::vector<int64_t> kHeadsShape = {2, 3, 5, 16};  // [B, H, T, D] of copy's heads cases
const std::vector<int64_t> kLargeShape = {kLargeRows, kLargeCols};

enum class Variant {
  contiguous,
  broadcast,
  strided,
  scalar,
  scalar_reverse,
  inplace,
  empty,
  large,
  rank0,
  alpha,         // add, sub: a OP alpha*b (minor 2), b broadcast along one dimension
  alpha_inplace  // the same into a
};

const char* variant_name(Variant v) {
  switch (v) {
    case Variant::contiguous:
      return "contiguous";
    case Variant::broadcast:
      return "broadcast";
    case Variant::strided:
      return "strided";
    case Variant::scalar:
      return "scalar";
    case Variant::scalar_reverse:
      return "scalar_reverse";
    case Variant::inplace:
      return "inplace";
    case Variant::empty:
      return "empty";
    case Variant::large:
      return "large";
    case Variant::rank0:
      return "rank0";
    case Variant::alpha:
      return "alpha";
    case Variant::alpha_inplace:
      return "alpha_inplace";
  }
  return "?";
}

Rng rng_for(Context& ctx, const OpInfo& op, int32_t dt, const std::string& variant) {
  return Rng(ctx.seed_for(std::string(op.name) + "_" + variant + "/" + bp_dtype_name(dt)));
}

std::string what_of(Context& ctx, const OpInfo& op, int32_t dt, const std::string& variant) {
  return format("%s %s (%s) on %s, seed %llu", op.name, bp_dtype_name(dt), variant.c_str(),
                ctx.device_label().c_str(), static_cast<unsigned long long>(ctx.seed()));
}

// Checks that a kernel left an input's storage (and its guards) untouched.
void expect_input_intact(DeviceTensor& d, const HostTensor& h, const std::string& what) {
  if (h.numel() == 0) return;
  std::vector<double> now = read_dense(d, what + ": input " + h.describe());
  expect_close(now, h.storage, h.dtype, 0.0, what + ": input " + h.describe() + " modified");
}

// Views of `shape` per variant: the first input gets the "interesting" layout.
HostTensor input_for(Rng& rng, int32_t dt, Variant v, int which, const Range& r) {
  switch (v) {
    case Variant::broadcast: {
      std::vector<bool> keep = which == 0   ? std::vector<bool>{true, false, true}
                               : which == 1 ? std::vector<bool>{false, true, false}
                                            : std::vector<bool>{true, true, false};
      return random_broadcast(rng, dt, kBcastShape, keep, r);
    }
    case Variant::strided:
      if (which == 1) return random_padded(rng, dt, kShape, 3, 5, r);
      return random_permuted(rng, dt, kShape,
                             which == 0 ? std::vector<int>{2, 0, 1} : std::vector<int>{1, 2, 0}, r);
    case Variant::empty:
      return random_dense(rng, dt, kEmptyShape, r);
    case Variant::large:
      return random_dense(rng, dt, kLargeShape, r);
    case Variant::rank0:
      return random_dense(rng, dt, {}, r);
    default:
      return random_dense(rng, dt, kShape, r);
  }
}

// ---- binary arithmetic and comparisons ----------------------------------------------------

double binary_op(const std::string& op, double a, double b) {
  if (op == "add") return a + b;
  if (op == "sub") return a - b;
  if (op == "mul") return a * b;
  if (op == "div") return a / b;
  if (op == "pow") return std::pow(a, b);
  if (op == "maximum") return std::max(a, b);
  if (op == "minimum") return std::min(a, b);
  if (op == "eq") return a == b;
  if (op == "ne") return a != b;
  if (op == "lt") return a < b;
  if (op == "le") return a <= b;
  if (op == "gt") return a > b;
  if (op == "ge") return a >= b;
  return NAN;
}

struct BinaryRanges {
  Range a, b;
  double scalar = 1.75, scalar_reverse = 1.75;
};

// Input distributions that keep every result representable (no integer overflow, no u8
// underflow, no division by zero, positive bases for pow).
BinaryRanges binary_ranges(const OpInfo& op, int32_t dt) {
  BinaryRanges r;
  std::string name = op.name;
  if (op.kind == OpKind::compare) {
    r.a.small_set = r.b.small_set = true;
    r.scalar = r.scalar_reverse = 1;
    return r;
  }
  r.a = r.b = default_range(dt);
  if (is_float_dtype(dt)) {
    if (name == "div") {
      r.a.avoid_zero = r.b.avoid_zero = true;
      r.scalar = r.scalar_reverse = 2.5;
    } else if (name == "pow") {
      r.a = {0.5, 2.0};
      r.b = {-2.0, 2.0};
      r.scalar = r.scalar_reverse = 1.5;
    } else if (name == "maximum" || name == "minimum") {
      r.scalar = r.scalar_reverse = 0.25;
    }
    return r;
  }
  r.scalar = r.scalar_reverse = 7;
  if (dt == BP_DTYPE_U8) {
    if (name == "add") {
      r.a = r.b = {0, 120, true};
    } else if (name == "sub") {
      r.a = {130, 255, true};
      r.b = {0, 120, true};
      r.scalar_reverse = 255;
    } else if (name == "mul") {
      r.a = r.b = {0, 15, true};
      r.scalar = r.scalar_reverse = 3;
    } else {
      r.scalar = r.scalar_reverse = 100;
    }
  }
  return r;
}

// add and sub with attribute ALPHA: out = a OP alpha*b in one launch (Note [Op catalogue]).
// Integer alphas and ranges keep every result representable (u8 included).
void run_alpha(Context& ctx, const OpInfo& op, int32_t dt, Variant v) {
  if (!has_minor2(ctx.api()))
    throw Skipped(
        format("attribute alpha is minor 2; this plugin is minor %u, and a host gives "
               "it mul then %s",
               ctx.t().abi_minor, op.name));
  const bool sub = std::string(op.name) == "sub";
  const std::string what = what_of(ctx, op, dt, variant_name(v));
  Rng rng = rng_for(ctx, op, dt, variant_name(v));
  Range ra = default_range(dt), rb = default_range(dt);
  double alpha = -1.75;
  if (!is_float_dtype(dt)) alpha = dt == BP_DTYPE_U8 ? 2 : -3;
  if (dt == BP_DTYPE_U8) {
    ra = sub ? Range{130, 255, true} : Range{0, 80, true};
    rb = sub ? Range{0, 60, true} : Range{0, 80, true};
  }
  HostTensor a = random_dense(rng, dt, kShape, ra);
  HostTensor b = random_broadcast(rng, dt, kShape, {true, false, true}, rb);
  std::vector<double> av = a.logical(), bv = b.logical(), ref(av.size());
  for (size_t i = 0; i < av.size(); ++i)
    ref[i] = sub ? av[i] - alpha * bv[i] : av[i] + alpha * bv[i];
  std::vector<bp_attr> attrs = {is_float_dtype(dt)
                                    ? attr_float("alpha", alpha)
                                    : attr_int("alpha", static_cast<int64_t>(alpha))};
  if (v == Variant::alpha_inplace) attrs.push_back(attr_int("inplace", 1));
  DeviceTensor da = upload(ctx, a), db = upload(ctx, b);
  std::string full =
      what + ": " + describe_launch(op.name, {&a, &b}, a.shape, dt, format("alpha %g", alpha));
  if (v == Variant::alpha_inplace) {
    run_kernel(ctx, op.name, dt, {da.desc, db.desc}, da.desc, attrs, full);
    expect_close(read_dense(da, full), ref, dt, tolerance(dt), full);
    expect_input_intact(db, b, full);
    return;
  }
  DeviceTensor out = make_output(ctx, dt, a.shape);
  run_kernel(ctx, op.name, dt, {da.desc, db.desc}, out.desc, attrs, full);
  expect_close(read_dense(out, full), ref, dt, tolerance(dt), full);
  expect_input_intact(da, a, full);
  expect_input_intact(db, b, full);
}

void run_binary(Context& ctx, const OpInfo& op, int32_t dt, Variant v) {
  if (v == Variant::alpha || v == Variant::alpha_inplace) return run_alpha(ctx, op, dt, v);
  const bool cmp = op.kind == OpKind::compare;
  const int32_t odt = cmp ? BP_DTYPE_BOOL : dt;
  const BinaryRanges r = binary_ranges(op, dt);
  const std::string what = what_of(ctx, op, dt, variant_name(v));
  Rng rng = rng_for(ctx, op, dt, variant_name(v));
  const bool scalar = v == Variant::scalar || v == Variant::scalar_reverse;
  const bool reverse = v == Variant::scalar_reverse;
  const double s = reverse ? r.scalar_reverse : r.scalar;

  HostTensor a = input_for(rng, dt, v, 0, r.a);
  HostTensor b;
  if (!scalar) b = input_for(rng, dt, v, 1, r.b);
  std::vector<double> av = a.logical(), bv = scalar ? std::vector<double>() : b.logical();
  std::vector<double> ref(av.size());
  for (size_t i = 0; i < av.size(); ++i)
    ref[i] = scalar ? (reverse ? binary_op(op.name, s, av[i]) : binary_op(op.name, av[i], s))
                    : binary_op(op.name, av[i], bv[i]);

  std::vector<bp_attr> attrs;
  if (scalar) attrs.push_back(attr_float("scalar", s));
  if (reverse) attrs.push_back(attr_int("reverse", 1));
  if (v == Variant::inplace) attrs.push_back(attr_int("inplace", 1));

  DeviceTensor da = upload(ctx, a), db;
  std::vector<bp_tensor_desc> ins = {da.desc};
  if (!scalar) {
    db = upload(ctx, b);
    ins.push_back(db.desc);
  }
  std::vector<const HostTensor*> hin = {&a};
  if (!scalar) hin.push_back(&b);
  std::string full =
      what + ": " +
      describe_launch(op.name, hin, a.shape, odt,
                      scalar ? format("scalar %g%s", s, reverse ? " reversed" : "") : "");
  if (v == Variant::inplace) {
    run_kernel(ctx, op.name, dt, ins, da.desc, attrs, full);
    expect_close(read_dense(da, full), ref, odt, tolerance(odt), full);
    if (!scalar) expect_input_intact(db, b, full);
    return;
  }
  DeviceTensor out = make_output(ctx, odt, a.shape);
  run_kernel(ctx, op.name, dt, ins, out.desc, attrs, full);
  expect_close(read_dense(out, full), ref, odt, tolerance(odt), full);
  if (v != Variant::large) {
    expect_input_intact(da, a, full);
    if (!scalar) expect_input_intact(db, b, full);
  }
}

// ---- where --------------------------------------------------------------------------------

void run_where(Context& ctx, const OpInfo& op, int32_t dt, Variant v) {
  const std::string what = what_of(ctx, op, dt, variant_name(v));
  Rng rng = rng_for(ctx, op, dt, variant_name(v));
  Range any;
  HostTensor cond = input_for(rng, BP_DTYPE_BOOL, v, 2, any);
  HostTensor a = input_for(rng, dt, v, 0, default_range(dt));
  HostTensor b = input_for(rng, dt, v, 1, default_range(dt));
  std::vector<double> cv = cond.logical(), av = a.logical(), bv = b.logical();
  std::vector<double> ref(av.size());
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = cv[i] != 0 ? av[i] : bv[i];
  DeviceTensor dc = upload(ctx, cond), da = upload(ctx, a), db = upload(ctx, b);
  DeviceTensor out = make_output(ctx, dt, a.shape);
  std::string full = what + ": " + describe_launch(op.name, {&cond, &a, &b}, a.shape, dt);
  run_kernel(ctx, op.name, dt, {dc.desc, da.desc, db.desc}, out.desc, {}, full);
  expect_close(read_dense(out, full), ref, dt, 0.0, full);
}

// ---- unary --------------------------------------------------------------------------------

double unary_op(const std::string& op, double x) {
  if (op == "neg") return -x;
  if (op == "exp") return std::exp(x);
  if (op == "log") return std::log(x);
  if (op == "sqrt") return std::sqrt(x);
  if (op == "relu") return x > 0 ? x : 0.0;
  if (op == "sigmoid") return 1.0 / (1.0 + std::exp(-x));
  if (op == "tanh") return std::tanh(x);
  if (op == "abs") return std::fabs(x);
  if (op == "sin") return std::sin(x);
  if (op == "cos") return std::cos(x);
  if (op == "rsqrt") return 1.0 / std::sqrt(x);
  return NAN;
}

Range unary_range(const OpInfo& op, int32_t dt) {
  std::string name = op.name;
  if (name == "log" || name == "sqrt" || name == "rsqrt") return {0.1, 10.0};
  return default_range(dt);
}

void run_unary(Context& ctx, const OpInfo& op, int32_t dt, Variant v) {
  const std::string what = what_of(ctx, op, dt, variant_name(v));
  Rng rng = rng_for(ctx, op, dt, variant_name(v));
  HostTensor a = input_for(rng, dt, v, 0, unary_range(op, dt));
  std::vector<double> av = a.logical(), ref(av.size());
  for (size_t i = 0; i < av.size(); ++i) ref[i] = unary_op(op.name, av[i]);
  std::vector<bp_attr> attrs;
  if (v == Variant::inplace) attrs.push_back(attr_int("inplace", 1));
  DeviceTensor da = upload(ctx, a);
  std::string full = what + ": " + describe_launch(op.name, {&a}, a.shape, dt);
  if (v == Variant::inplace) {
    run_kernel(ctx, op.name, dt, {da.desc}, da.desc, attrs, full);
    expect_close(read_dense(da, full), ref, dt, tolerance(dt), full);
    return;
  }
  DeviceTensor out = make_output(ctx, dt, a.shape);
  run_kernel(ctx, op.name, dt, {da.desc}, out.desc, attrs, full);
  expect_close(read_dense(out, full), ref, dt, tolerance(dt), full);
  if (v != Variant::large) expect_input_intact(da, a, full);
}

// ---- fill ---------------------------------------------------------------------------------

void run_fill(Context& ctx, const OpInfo& op, int32_t dt, const std::vector<int64_t>& shape,
              bool int_attr, const std::string& variant) {
  const std::string what = what_of(ctx, op, dt, variant);
  double value = 0;
  int64_t ivalue = 0;
  switch (dt) {
    case BP_DTYPE_I32:
      value = -7, ivalue = -123456;
      break;
    case BP_DTYPE_I64:
      value = -7, ivalue = (int64_t{1} << 40) + 3;
      break;
    case BP_DTYPE_U8:
      value = 200, ivalue = 201;
      break;
    case BP_DTYPE_BOOL:
      value = 1, ivalue = 1;
      break;
    default:
      value = 2.5, ivalue = 3;
      break;
  }
  bp_attr attr = int_attr ? attr_int("value", ivalue) : attr_float("value", value);
  // i64 values are compared as doubles: 2^40 + 3 is exact there.
  double expect = round_to(dt, int_attr ? static_cast<double>(ivalue) : value);
  DeviceTensor out = make_output(ctx, dt, shape);
  std::string full =
      what + format(": fill %s%s with %s", bp_dtype_name(dt), shape_str(shape).c_str(),
                    int_attr ? format("INT %lld", static_cast<long long>(ivalue)).c_str()
                             : format("FLOAT %g", value).c_str());
  run_kernel(ctx, op.name, dt, {}, out.desc, {attr}, full);
  expect_close(read_dense(out, full),
               std::vector<double>(static_cast<size_t>(count(shape)), expect), dt, 0.0, full);
}

// ---- copy ---------------------------------------------------------------------------------

// A strided output view of `shape` for copy (Note [Op catalogue]: copy may write into any
// non-overlapping strided view): "strided_output" is a slice of padded rows starting 3 elements
// into its storage, "transposed_output" a permuted view, "heads_output" [B, H, T, D] written
// into [B, T, H, D] storage (attention's output, last dimension dense). Storage outside the view
// must keep its guard pattern.
DeviceTensor strided_output(Context& ctx, int32_t dt, const std::vector<int64_t>& shape,
                            const std::string& variant, std::vector<int64_t>* offsets) {
  HostTensor layout;
  Rng unused(0);
  if (variant == "transposed_output")
    layout = random_permuted(unused, dt, shape, {2, 0, 1}, Range{});
  else if (variant == "heads_output")
    layout = random_permuted(unused, dt, shape, {0, 2, 1, 3}, Range{});
  else
    layout = random_padded(unused, dt, shape, 4, 3, Range{});
  *offsets = view_offsets(layout);
  DeviceTensor d;
  d.dtype = dt;
  d.shape = shape;
  d.storage_elems = static_cast<int64_t>(layout.storage.size());
  d.view_offset = layout.offset;
  size_t es = bp_dtype_size(dt);
  d.buffer = GuardedBuffer(ctx, layout.storage.size() * es);
  d.desc = make_desc(d.buffer.get(), d.buffer.offset() + static_cast<uint64_t>(layout.offset) * es,
                     dt, shape, layout.strides);
  return d;
}

void run_copy(Context& ctx, const OpInfo& op, int32_t dt, const std::string& variant) {
  const std::string what = what_of(ctx, op, dt, variant);
  Rng rng = rng_for(ctx, op, dt, variant);
  Range r = default_range(dt);
  HostTensor in;
  if (variant == "contiguous" || variant == "strided_output" || variant == "transposed_output")
    in = random_dense(rng, dt, kShape, r);
  else if (variant == "heads_output")
    in = random_dense(rng, dt, kHeadsShape, r);
  else if (variant == "strided")
    in = random_permuted(rng, dt, kBcastShape, {2, 0, 1}, r);
  else if (variant == "broadcast")
    in = random_broadcast(rng, dt, kBcastShape, {false, true, false}, r);
  else if (variant == "offset")
    in = random_padded(rng, dt, kShape, 2, 3, r);
  else if (variant == "heads" || variant == "heads_offset") {
    // Attention's [B, T, H, D] storage read as [B, H, T, D]: the last dimension dense, so a
    // backend may move several elements as one word (Note [Wide strided copies] in the CUDA
    // plugin); offset by one element, no word wider than an element is aligned.
    in = random_permuted(rng, dt, kHeadsShape, {0, 2, 1, 3}, r);
    if (variant == "heads_offset") {
      in.storage.insert(in.storage.begin(), random_dense(rng, dt, {1}, r).storage[0]);
      in.offset = 1;
    }
  } else if (variant == "rank0")
    in = random_dense(rng, dt, {}, r);
  else if (variant == "empty")
    in = random_dense(rng, dt, kEmptyShape, r);
  else
    in = random_permuted(rng, dt, kLargeShape, {1, 0}, r);
  DeviceTensor din = upload(ctx, in);
  const bool strided_out =
      variant == "strided_output" || variant == "transposed_output" || variant == "heads_output";
  std::vector<int64_t> offsets;
  DeviceTensor out = strided_out ? strided_output(ctx, dt, in.shape, variant, &offsets)
                                 : make_output(ctx, dt, in.shape);
  std::string full =
      what + ": " +
      describe_launch(
          op.name, {&in}, in.shape, dt,
          strided_out ? "output strides " + shape_str(std::vector<int64_t>(
                                                out.desc.strides, out.desc.strides + out.desc.rank))
                      : "");
  run_kernel(ctx, op.name, dt, {din.desc}, out.desc, {}, full);
  if (!strided_out) {
    expect_close(read_dense(out, full), in.logical(), dt, 0.0, full);
    return;
  }
  std::vector<uint8_t> bytes = out.buffer.read_checked(full);
  const size_t es = bp_dtype_size(dt);
  std::vector<bool> in_view(static_cast<size_t>(out.storage_elems), false);
  std::vector<double> got(offsets.size());
  for (size_t i = 0; i < offsets.size(); ++i) {
    in_view[static_cast<size_t>(offsets[i])] = true;
    got[i] = load_value(bytes.data(), dt, static_cast<size_t>(offsets[i]));
  }
  expect_close(got, in.logical(), dt, 0.0, full);
  for (size_t e = 0; e < in_view.size(); ++e) {
    if (in_view[e]) continue;
    for (size_t b = e * es; b < (e + 1) * es; ++b)
      if (bytes[b] != guard_byte(GuardedBuffer::kGuard + b))
        throw Failure(full + format(": wrote storage element %zu, which is outside the output "
                                    "view",
                                    e));
  }
}

// ---- cast ---------------------------------------------------------------------------------

// Inputs for a cast from `from` to `to` that the target can hold; zeros included when the
// target is bool (x != 0 must be seen both ways).
Range cast_range(int32_t from, int32_t to) {
  Range r = default_range(from);
  if (to == BP_DTYPE_BOOL) {
    r.small_set = true;
    return r;
  }
  if (from == BP_DTYPE_BOOL || from == BP_DTYPE_U8) return r;
  bool from_float = is_float_dtype(from);
  switch (to) {
    case BP_DTYPE_U8:
      return from_float ? Range{0.0, 200.9} : Range{0, 255, true};
    case BP_DTYPE_I32:
    case BP_DTYPE_I64:
      if (from_float) return Range{-100.9, 100.9};
      if (from == BP_DTYPE_I64 && to == BP_DTYPE_I32) return Range{-1e9, 1e9, true};
      return r;
    default:
      return r;
  }
}

double cast_value(double v, int32_t from, int32_t to) {
  if (to == BP_DTYPE_BOOL) return v != 0 ? 1.0 : 0.0;
  if (is_float_dtype(from) && !is_float_dtype(to)) return std::trunc(v);
  return v;
}

void run_cast(Context& ctx, const OpInfo& op, int32_t dt, int32_t to,
              const std::vector<int64_t>& shape, const std::string& variant) {
  const std::string what = what_of(ctx, op, dt, variant);
  Rng rng = rng_for(ctx, op, dt, variant);
  HostTensor in = shape.size() == 3 ? random_permuted(rng, dt, shape, {1, 2, 0}, cast_range(dt, to))
                                    : random_dense(rng, dt, shape, cast_range(dt, to));
  std::vector<double> iv = in.logical(), ref(iv.size());
  for (size_t i = 0; i < iv.size(); ++i) ref[i] = cast_value(iv[i], dt, to);
  DeviceTensor din = upload(ctx, in);
  DeviceTensor out = make_output(ctx, to, in.shape);
  std::string full = what + ": " + describe_launch(op.name, {&in}, in.shape, to);
  run_kernel(ctx, op.name, dt, {din.desc}, out.desc, {}, full);
  expect_close(read_dense(out, full), ref, to, tolerance(to), full);
}

void add_variants(const OpInfo& op, int32_t dt, std::initializer_list<Variant> variants,
                  void (*run)(Context&, const OpInfo&, int32_t, Variant), CaseList& out) {
  for (Variant v : variants) {
    const OpInfo* p = &op;
    out.push_back({variant_name(v), [p, dt, v, run](Context& ctx) { run(ctx, *p, dt, v); }});
  }
}

}  // namespace

void elementwise_cases(const OpInfo& op, int32_t dt, CaseList& out) {
  const OpInfo* p = &op;
  using V = Variant;
  switch (op.kind) {
    case OpKind::binary:
      add_variants(op, dt,
                   {V::contiguous, V::broadcast, V::strided, V::scalar, V::scalar_reverse,
                    V::inplace, V::empty, V::large, V::rank0},
                   run_binary, out);
      if (std::string(op.name) == "add" || std::string(op.name) == "sub")
        add_variants(op, dt, {V::alpha, V::alpha_inplace}, run_binary, out);
      break;
    case OpKind::compare:
      add_variants(op, dt,
                   {V::contiguous, V::broadcast, V::strided, V::scalar, V::scalar_reverse, V::empty,
                    V::large, V::rank0},
                   run_binary, out);
      break;
    case OpKind::where:
      add_variants(op, dt, {V::contiguous, V::broadcast, V::strided, V::empty, V::large, V::rank0},
                   run_where, out);
      break;
    case OpKind::unary:
      add_variants(
          op, dt,
          {V::contiguous, V::broadcast, V::strided, V::inplace, V::empty, V::large, V::rank0},
          run_unary, out);
      break;
    case OpKind::fill:
      out.push_back({"contiguous",
                     [p, dt](Context& c) { run_fill(c, *p, dt, kShape, false, "contiguous"); }});
      out.push_back(
          {"int_value", [p, dt](Context& c) { run_fill(c, *p, dt, kShape, true, "int_value"); }});
      out.push_back({"rank0", [p, dt](Context& c) { run_fill(c, *p, dt, {}, false, "rank0"); }});
      out.push_back(
          {"empty", [p, dt](Context& c) { run_fill(c, *p, dt, kEmptyShape, false, "empty"); }});
      out.push_back(
          {"large", [p, dt](Context& c) { run_fill(c, *p, dt, kLargeShape, false, "large"); }});
      break;
    case OpKind::copy:
      for (const char* v :
           {"contiguous", "strided", "broadcast", "offset", "strided_output", "transposed_output",
            "heads", "heads_offset", "heads_output", "rank0", "empty", "large"})
        out.push_back({v, [p, dt, v](Context& c) { run_copy(c, *p, dt, v); }});
      break;
    case OpKind::cast: {
      for (int32_t to = 0; to < BP_DTYPE_COUNT; ++to) {
        std::string v = std::string("to_") + bp_dtype_name(to);
        out.push_back({v, [p, dt, to, v](Context& c) { run_cast(c, *p, dt, to, kBcastShape, v); }});
      }
      int32_t to = dt == BP_DTYPE_F32 ? BP_DTYPE_F64 : BP_DTYPE_F32;
      out.push_back(
          {"empty", [p, dt, to](Context& c) { run_cast(c, *p, dt, to, kEmptyShape, "empty"); }});
      out.push_back(
          {"large", [p, dt, to](Context& c) { run_cast(c, *p, dt, to, kLargeShape, "large"); }});
      break;
    }
    default:
      break;
  }
}

}  // namespace bpc
