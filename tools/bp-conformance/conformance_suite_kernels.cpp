// The kernels suite: every op of the catalogue x every dtype the plugin declares (list_ops, or
// find_kernel probing for minor-0 tables), in every shape variant of its family, plus the
// consistency of the declaration itself and a leak check over the whole group.
#include "conformance_kernels.hpp"
#include "conformance_suites.hpp"

#include <memory>

namespace bpc {

bp_attr attr_int(const char* name, int64_t v) {
  bp_attr a{};
  a.struct_size = sizeof(bp_attr);
  a.name = name;
  a.kind = BP_ATTR_INT;
  a.i = v;
  a.f = static_cast<double>(v);
  return a;
}

bp_attr attr_float(const char* name, double v) {
  bp_attr a{};
  a.struct_size = sizeof(bp_attr);
  a.name = name;
  a.kind = BP_ATTR_FLOAT;
  a.f = v;
  a.i = static_cast<int64_t>(v);
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

namespace {

bp_error* launch_raw(Context& ctx, const char* op, int32_t dt,
                     const std::vector<bp_tensor_desc>& ins, const bp_tensor_desc& out,
                     const std::vector<bp_attr>& attrs) {
  bp_kernel* k = find_kernel_checked(ctx, op, dt);
  return ctx.t().launch(k, ctx.stream(), ins.empty() ? nullptr : ins.data(),
                        static_cast<int32_t>(ins.size()), &out, 1,
                        attrs.empty() ? nullptr : attrs.data(), static_cast<int32_t>(attrs.size()));
}

}  // namespace

void run_kernel(Context& ctx, const char* op, int32_t dt, const std::vector<bp_tensor_desc>& ins,
                const bp_tensor_desc& out, const std::vector<bp_attr>& attrs,
                const std::string& what) {
  ctx.check(launch_raw(ctx, op, dt, ins, out, attrs), "launch " + what);
  ctx.check(ctx.t().stream_synchronize(ctx.stream()), "stream_synchronize after " + what);
}

void run_kernel_expect_error(Context& ctx, const char* op, int32_t dt,
                             const std::vector<bp_tensor_desc>& ins, const bp_tensor_desc& out,
                             const std::vector<bp_attr>& attrs, int32_t code,
                             const std::string& what) {
  bp_error* e = launch_raw(ctx, op, dt, ins, out, attrs);
  if (!e) e = ctx.t().stream_synchronize(ctx.stream());
  if (!e) throw Failure(what + ": succeeded, expected " + error_code_name(code));
  int32_t got = e->code;
  std::string desc = take_error(ctx.api(), e);
  if (got != code) throw Failure(what + ": expected " + error_code_name(code) + ", got " + desc);
  ctx.note("error as expected: " + desc);
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
        // Undeclared pairs outside the agreed matrix are simply absent.
        if (s.declared || defines(op, dt)) b.unsupported(op.name, dname, s.reason);
        continue;
      }
      if (!defines(op, dt)) {
        std::string why = format("conformance defines no semantics for %s on %s", op.name, dname);
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
        default:
          elementwise_cases(op, dt, cases);
          break;
      }
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
