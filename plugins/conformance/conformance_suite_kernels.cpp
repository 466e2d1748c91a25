// The kernels suite: every op of the catalogue x every dtype the plugin declares (list_ops, or
// find_kernel probing for minor-0 tables), in every shape variant of its family, plus the
// consistency of the declaration itself and a leak check over the whole group.
#include "conformance_kernels.hpp"
#include "conformance_suites.hpp"

#include <backplane/abi/op_catalogue.h>
#include <backplane_test/compare.hpp>

#include <cmath>
#include <memory>

namespace bpc {

bp_attr attr_int(const char* name, int64_t v) {
  bp_attr a{};
  a.struct_size = sizeof(bp_attr);
  a.name = name;
  a.kind = BP_ATTR_INT;
  a.i = v;
  a.f = static_cast<double>(v);
  a.id = bp_attr_id_from_name(name);
  return a;
}

bp_attr attr_float(const char* name, double v) {
  bp_attr a{};
  a.struct_size = sizeof(bp_attr);
  a.name = name;
  a.kind = BP_ATTR_FLOAT;
  a.f = v;
  a.i = static_cast<int64_t>(v);
  a.id = bp_attr_id_from_name(name);
  return a;
}

Range default_range(int32_t dt) {
  switch (dt) {
    case BP_DTYPE_I32:
    case BP_DTYPE_I64:
      return {-1000, 1000, true};
    case BP_DTYPE_U8:
      return {0, 255, true};
    default:
      return {-4.0, 4.0};
  }
}

std::string describe_launch(const char* op, const std::vector<const HostTensor*>& ins,
                            const std::vector<int64_t>& out_shape, int32_t out_dt,
                            const std::string& extra) {
  std::string s = std::string(op) + "(";
  for (size_t i = 0; i < ins.size(); ++i) s += (i ? ", " : "") + ins[i]->describe();
  s += ") -> " + std::string(bp_dtype_name(out_dt)) + shape_str(out_shape);
  if (!extra.empty()) s += ", " + extra;
  return s;
}

void expect_close_mag(const std::vector<double>& out, const std::vector<double>& ref,
                      const std::vector<double>& magnitude, int32_t dt, bp_test::OpClass cls,
                      const std::string& what, double scale) {
  bp_test::Tolerance tol;
  tol.op_class = cls;
  tol.scale = scale;
  tol.magnitude = magnitude;
  bp_test::Verdict v = bp_test::compare(dt, out, ref, tol);
  if (!v.ok) throw Failure(what + ": " + v.message);
}

int64_t window_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dilation,
                        bool ceil_mode) {
  const int64_t span = in + 2 * pad - dilation * (k - 1) - 1;
  int64_t out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

std::string case_label(Context& ctx, const OpInfo& op, int32_t dt, const char* variant) {
  return format("%s %s (%s) on %s, seed %llu", op.name, bp_dtype_name(dt), variant,
                ctx.device_label().c_str(), static_cast<unsigned long long>(ctx.seed()));
}

HostTensor dense_values(int32_t dt, const std::vector<int64_t>& shape,
                        const std::vector<double>& values) {
  HostTensor t;
  t.dtype = dt;
  t.shape = shape;
  t.strides = contiguous_strides(shape);
  for (double v : values) t.storage.push_back(std::isnan(v) ? v : round_to(dt, v));
  return t;
}

namespace {

bp_error* launch_raw(Context& ctx, const char* op, int32_t dt,
                     const std::vector<bp_tensor_desc>& ins,
                     const std::vector<bp_tensor_desc>& outs, const std::vector<bp_attr>& attrs) {
  bp_kernel* k = find_kernel_checked(ctx, op, dt);
  return ctx.launch(k, ctx.stream(), ins.empty() ? nullptr : ins.data(),
                    static_cast<int32_t>(ins.size()), outs.data(),
                    static_cast<int32_t>(outs.size()), attrs);
}

}  // namespace

void run_kernel_n(Context& ctx, const char* op, int32_t dt, const std::vector<bp_tensor_desc>& ins,
                  const std::vector<bp_tensor_desc>& outs, const std::vector<bp_attr>& attrs,
                  const std::string& what) {
  ctx.check(launch_raw(ctx, op, dt, ins, outs, attrs), "launch " + what);
  ctx.check(ctx.t().stream_synchronize(ctx.stream()), "stream_synchronize after " + what);
}

std::string run_kernel_n_expect_error(Context& ctx, const char* op, int32_t dt,
                                      const std::vector<bp_tensor_desc>& ins,
                                      const std::vector<bp_tensor_desc>& outs,
                                      const std::vector<bp_attr>& attrs, int32_t code,
                                      const std::string& what) {
  bp_error* e = launch_raw(ctx, op, dt, ins, outs, attrs);
  const bool async = e == nullptr;
  if (!e) e = ctx.t().stream_synchronize(ctx.stream());
  if (!e) throw Failure(what + ": succeeded, expected " + error_code_name(code));
  int32_t got = e->code;
  std::string desc = take_error(ctx.api(), e);
  // Note [Asynchronous errors]: a failure found on the device stays in the stream's record
  // until the host clears it, as libbackplane does after reporting it.
  if (async && BP_API_HAS_SLOT(ctx.api(), 6, stream_fault) && ctx.t().stream_fault) {
    bp_stream_fault rec{};
    rec.struct_size = sizeof rec;
    ctx.check(ctx.t().stream_fault(ctx.stream(), 1, &rec), "stream_fault (clearing)");
  }
  if (got != code) throw Failure(what + ": expected " + error_code_name(code) + ", got " + desc);
  ctx.note("error as expected: " + desc);
  return desc;
}

void run_kernel(Context& ctx, const char* op, int32_t dt, const std::vector<bp_tensor_desc>& ins,
                const bp_tensor_desc& out, const std::vector<bp_attr>& attrs,
                const std::string& what) {
  run_kernel_n(ctx, op, dt, ins, {out}, attrs, what);
}

void run_kernel_expect_error(Context& ctx, const char* op, int32_t dt,
                             const std::vector<bp_tensor_desc>& ins, const bp_tensor_desc& out,
                             const std::vector<bp_attr>& attrs, int32_t code,
                             const std::string& what) {
  run_kernel_n_expect_error(ctx, op, dt, ins, {out}, attrs, code, what);
}

void build_kernels_suite(Context& ctx, std::vector<TestCase>& out) {
  auto table = std::make_shared<SupportTable>(SupportTable::build(ctx));
  SuiteBuilder b(out, "kernels", ctx.device_label());

  b.add("declared", [table](Context& c) {
    c.note("support from " + table->source());
    if (!table->unknown().empty()) {
      std::string names;
      for (const auto& [op, dt] : table->unknown())
        names += (names.empty() ? "" : ", ") + op + "/" + bp_dtype_name(dt);
      c.note("ops outside the catalogue (not tested): " + names);
    }
    std::string problems;
    for (const std::string& p : table->problems()) problems += (problems.empty() ? "" : "; ") + p;
    // A pair declared unsupported must not resolve: the host would otherwise run it.
    for (const OpInfo& op : catalogue()) {
      for (int32_t d = 0; d < BP_DTYPE_COUNT; ++d) {
        Support s = table->get(op.name, d);
        if (!s.declared || s.support != BP_SUPPORT_NO) continue;
        bp_kernel* k = nullptr;
        bp_error* e = c.t().find_kernel(c.device(), op.name, d, &k);
        if (!e)
          problems += std::string(problems.empty() ? "" : "; ") + op.name + "/" + bp_dtype_name(d) +
                      " is declared unsupported but find_kernel resolves it";
        else
          take_error(c.api(), e);
      }
    }
    if (!problems.empty()) throw Failure("declaration problems: " + problems);
  });

  // Minor 2: find_kernel_id answers exactly as find_kernel does for the op's name, for every
  // pair of the catalogue; numbers past the catalogue or bp_dtype (a newer host's) are
  // BP_ERROR_UNSUPPORTED.
  b.add("find_kernel_id", [](Context& c) {
    if (!has_find_kernel_id(c.api()))
      throw Skipped(
          has_minor2(c.api())
              ? "find_kernel_id is NULL (optional): the host resolves kernels by name"
              : format("minor-%u table: the host resolves kernels by name", c.t().abi_minor));
    std::string problems;
    auto problem = [&problems](const std::string& p) {
      problems += (problems.empty() ? "" : "; ") + p;
    };
    int resolved = 0;
    for (int32_t op = 0; op < BP_OP_COUNT; ++op) {
      for (int32_t d = 0; d < BP_DTYPE_COUNT; ++d) {
        bp_kernel *by_name = nullptr, *by_id = nullptr;
        bp_error* en = c.t().find_kernel(c.device(), bp_op_name(op), d, &by_name);
        bp_error* ei = c.t().find_kernel_id(c.device(), op, d, &by_id);
        const std::string pair = format("%s/%s", bp_op_name(op), bp_dtype_name(d));
        if (!en && !ei && by_name != by_id)
          problem(pair + ": find_kernel_id returned another handle than find_kernel");
        if (!en != !ei)
          problem(pair +
                  (en ? ": only find_kernel_id resolves it (" + take_error(c.api(), en)
                      : ": only find_kernel resolves it (" + take_error(c.api(), ei)) +
                  ")");
        if (en && ei && en->code != ei->code)
          problem(pair + ": find_kernel gives " + error_code_name(en->code) + ", find_kernel_id " +
                  error_code_name(ei->code));
        if (!en && !ei) ++resolved;
        take_error(c.api(), en);
        take_error(c.api(), ei);
      }
    }
    for (auto [op, d] : {std::pair<int32_t, int32_t>{BP_OP_COUNT, BP_DTYPE_F32},
                         {-1, BP_DTYPE_F32},
                         {BP_OP_ADD, BP_DTYPE_COUNT}}) {
      bp_kernel* k = nullptr;
      bp_error* e = c.t().find_kernel_id(c.device(), op, d, &k);
      const std::string what = format("find_kernel_id(op %d, dtype %d)", op, d);
      if (!e) {
        problem(what + " returned a kernel");
      } else {
        const int32_t code = e->code;
        const std::string desc = take_error(c.api(), e);
        if (code != BP_ERROR_UNSUPPORTED)
          problem(what + ": expected BP_ERROR_UNSUPPORTED, got " + desc);
      }
    }
    if (!problems.empty()) throw Failure(problems);
    c.note(format("%d pairs resolve by number and by name to the same handles", resolved));
  });

  // A plugin of minor 2 loaded by a host of minor 1 gets attribute arrays of the old layout,
  // without ids (Note [Attribute ids]): it must step through them by their struct_size.
  b.add("attrs_minor1_layout", [table](Context& c) {
    if (!has_minor2(c.api()))
      throw Skipped(
          format("minor-%u plugin: it only ever gets this layout, which every kernel "
                 "test uses",
                 c.t().abi_minor));
    // sub shows a lost REVERSE; add (commutative) still shows a lost SCALAR.
    const bool sub = table->supported("sub", BP_DTYPE_F32);
    if (!sub && !table->supported("add", BP_DTYPE_F32))
      throw Skipped("the plugin has neither sub nor add f32 to launch with two attributes");
    const char* op = sub ? "sub" : "add";
    const int64_t n = 37;
    std::vector<float> a(n), out(n);
    Rng rng(c.seed_for("attrs_minor1_layout"));
    for (float& x : a) x = static_cast<float>(rng.uniform(-4, 4));
    DeviceBuffer da(c, n * 4), dout(c, n * 4);
    c.check(c.t().copy_h2d(c.stream(), da.get(), 0, a.data(), n * 4), "copy_h2d");
    bp_tensor_desc in = make_desc(da.get(), 0, BP_DTYPE_F32, {n}, {1});
    bp_tensor_desc o = make_desc(dout.get(), 0, BP_DTYPE_F32, {n}, {1});
    // scalar OP a: read with the wrong stride, SCALAR or REVERSE is lost or garbage.
    const double s = 2.5;
    bp_attr_minor1 old[2] = {{sizeof(bp_attr_minor1), "scalar", BP_ATTR_FLOAT, 0, s},
                             {sizeof(bp_attr_minor1), "reverse", BP_ATTR_INT, 1, 1.0}};
    bp_kernel* k = find_kernel_checked(c, op, BP_DTYPE_F32);
    c.check(c.t().launch(k, c.stream(), &in, 1, &o, 1, reinterpret_cast<const bp_attr*>(old), 2),
            format("launch %s f32 with minor-1 attributes (scalar, reverse)", op));
    c.check(c.t().copy_d2h(c.stream(), out.data(), dout.get(), 0, n * 4), "copy_d2h");
    c.sync(c.stream());
    for (int64_t i = 0; i < n; ++i) {
      const float x = a[static_cast<size_t>(i)];
      const float want = sub ? static_cast<float>(s) - x : static_cast<float>(s) + x;
      if (out[static_cast<size_t>(i)] != want)
        throw Failure(
            format("%s: element %lld: got %g, expected %g (2.5 %s a): the attributes "
                   "were not read with their struct_size of %zu bytes",
                   op, static_cast<long long>(i), static_cast<double>(out[static_cast<size_t>(i)]),
                   static_cast<double>(want), sub ? "-" : "+", sizeof(bp_attr_minor1)));
    }
    c.note(format("%s f32 read SCALAR and REVERSE from a %zu-byte-stride array without ids", op,
                  sizeof(bp_attr_minor1)));
  });

  // Baseline statistics for the leak check at the end of the group; read lazily by the first
  // test that runs (a restarted child measures from its own start).
  auto baseline = std::make_shared<bp_memory_stats>();
  auto have_baseline = std::make_shared<bool>(false);
  auto read_baseline = [baseline, have_baseline](Context& c) {
    if (*have_baseline) return;
    c.sync(c.stream());
    baseline->struct_size = sizeof(bp_memory_stats);
    c.check(c.t().memory_stats(c.device(), baseline.get()), "memory_stats");
    *have_baseline = true;
  };

  for (const OpInfo& op : catalogue()) {
    for (int32_t dt = 0; dt < BP_DTYPE_COUNT; ++dt) {
      Support s = table->get(op.name, dt);
      const char* dname = bp_dtype_name(dt);
      if (s.support == BP_SUPPORT_NO) {
        // Undeclared pairs outside the op's dtype domain are simply absent.
        if (s.declared || defines(op, dt)) b.unsupported(op.name, dname, s.reason);
        continue;
      }
      if (!defines(op, dt)) {
        std::string why = format(
            "%s is outside %s's dtype domain (op_catalogue.h): no host asks "
            "for it, so it has no semantics to test",
            dname, op.name);
        b.add(
            op.name, [why](Context&) { throw Skipped(why); }, dname);
        continue;
      }
      CaseList cases;
      switch (op.kind) {
        case OpKind::reduce:
          reduction_cases(op, dt, cases);
          break;
        case OpKind::matmul:
          matmul_cases(op, dt, cases);
          break;
        case OpKind::random:
          random_cases(op, dt, cases);
          break;
        case OpKind::conv:
          conv_cases(op, dt, cases);
          break;
        case OpKind::pool:
          pool_cases(op, dt, cases);
          break;
        case OpKind::norm:
          norm_cases(op, dt, cases);
          break;
        case OpKind::index:
          index_cases(op, dt, cases);
          break;
        case OpKind::softmax:
          softmax_cases(op, dt, cases);
          break;
        case OpKind::transformer:
          transformer_cases(op, dt, cases);
          break;
        case OpKind::attention:
          attention_cases(op, dt, cases);
          break;
        case OpKind::optim:
          optim_cases(op, dt, cases);
          break;
        case OpKind::loss:
          loss_cases(op, dt, cases);
          break;
        default:
          elementwise_cases(op, dt, cases);
          break;
      }
      rules_cases(op, dt, cases);
      for (KernelCase& kc : cases) {
        auto body = std::move(kc.body);
        TestCase& tc = b.add(
            std::string(op.name) + "_" + kc.variant,
            [body, read_baseline](Context& c) {
              read_baseline(c);
              body(c);
            },
            dname);
        tc.support = s.support;
        tc.reason = s.reason;
      }
    }
  }

  b.add("no_leaks", [baseline, have_baseline](Context& c) {
    if (!*have_baseline) throw Skipped("no kernel test ran in this process");
    c.sync(c.stream());
    bp_memory_stats now{};
    now.struct_size = sizeof(now);
    c.check(c.t().memory_stats(c.device(), &now), "memory_stats");
    if (now.allocated != baseline->allocated || now.num_allocs != baseline->num_allocs)
      throw Failure(
          format("after the kernel tests freed everything: allocated %llu bytes in %llu "
                 "allocations, expected %llu in %llu",
                 static_cast<unsigned long long>(now.allocated),
                 static_cast<unsigned long long>(now.num_allocs),
                 static_cast<unsigned long long>(baseline->allocated),
                 static_cast<unsigned long long>(baseline->num_allocs)));
    c.note(format("allocated back to %llu bytes", static_cast<unsigned long long>(now.allocated)));
  });
}

}  // namespace bpc
