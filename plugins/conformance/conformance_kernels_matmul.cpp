// Kernel cases of matmul: a[B,M,K] x b[B,K,N] -> out[B,M,N], row- or column-major operands,
// broadcast batches, K == 0 (zeros) and empty outputs; and of linear: x[M,K] w[N,K] (+ bias[N])
// (+ ReLU) -> out[M,N] with the same layouts, a strided bias, K == 0 (the bias alone) and a
// bad activation value.
#include "conformance_kernels.hpp"

namespace bpc {

namespace {

struct MatmulCase {
  const char* variant;
  int64_t batch, m, k, n;
  bool a_col_major = false, b_col_major = false;
  bool b_batch_broadcast = false;
};

// A [B,R,C] operand: row-major, column-major (unit stride in dim 1) and/or one batch shared by
// all (batch stride 0).
HostTensor matrix(Rng& rng, int32_t dt, int64_t batch, int64_t rows, int64_t cols, bool col_major,
                  bool batch_broadcast) {
  Range r{-1.0, 1.0};
  std::vector<int64_t> shape = {batch, rows, cols};
  HostTensor t;
  if (col_major)
    t = random_permuted(rng, dt, shape, {0, 2, 1}, r);
  else
    t = random_dense(rng, dt, shape, r);
  if (batch_broadcast) {
    t.storage.resize(static_cast<size_t>(rows * cols));
    t.strides[0] = 0;
  }
  return t;
}

void run_matmul(Context& ctx, const OpInfo& op, int32_t dt, const MatmulCase& c) {
  const std::string what =
      format("%s %s (%s) on %s, seed %llu", op.name, bp_dtype_name(dt), c.variant,
             ctx.device_label().c_str(), static_cast<unsigned long long>(ctx.seed()));
  Rng rng(ctx.seed_for(std::string(op.name) + "_" + c.variant + "/" + bp_dtype_name(dt)));
  HostTensor a = matrix(rng, dt, c.batch, c.m, c.k, c.a_col_major, false);
  HostTensor b = matrix(rng, dt, c.batch, c.k, c.n, c.b_col_major, c.b_batch_broadcast);
  std::vector<double> av = a.logical(), bv = b.logical();
  std::vector<double> ref(static_cast<size_t>(c.batch * c.m * c.n), 0.0);
  for (int64_t p = 0; p < c.batch; ++p)
    for (int64_t i = 0; i < c.m; ++i) {
      double* row = &ref[static_cast<size_t>((p * c.m + i) * c.n)];
      for (int64_t q = 0; q < c.k; ++q) {
        double x = av[static_cast<size_t>((p * c.m + i) * c.k + q)];
        const double* brow = &bv[static_cast<size_t>((p * c.k + q) * c.n)];
        for (int64_t j = 0; j < c.n; ++j) row[j] += x * brow[j];
      }
    }
  DeviceTensor da = upload(ctx, a), db = upload(ctx, b);
  std::vector<int64_t> out_shape = {c.batch, c.m, c.n};
  DeviceTensor out = make_output(ctx, dt, out_shape);
  std::string full =
      what + ": " + describe_launch(op.name, {&a, &b}, out_shape, dt, "allow_tf32 0");
  run_kernel(ctx, op.name, dt, {da.desc, db.desc}, out.desc, {attr_int("allow_tf32", 0)}, full);
  expect_close(read_dense(out, full), ref, dt, tolerance(dt, true), full);
}

struct LinearCase {
  const char* variant;
  int64_t m, k, n;
  bool bias = true, relu = false;
  bool x_col_major = false, w_col_major = false;
  int64_t bias_stride = 1;
  int64_t activation = -1;  // >= 0: pass this (invalid) value and expect INVALID_ARGUMENT
};

void run_linear(Context& ctx, const OpInfo& op, int32_t dt, const LinearCase& c) {
  const std::string what =
      format("%s %s (%s) on %s, seed %llu", op.name, bp_dtype_name(dt), c.variant,
             ctx.device_label().c_str(), static_cast<unsigned long long>(ctx.seed()));
  Rng rng(ctx.seed_for(std::string(op.name) + "_" + c.variant + "/" + bp_dtype_name(dt)));
  Range r{-1.0, 1.0};
  HostTensor x = c.x_col_major ? random_permuted(rng, dt, {c.m, c.k}, {1, 0}, r)
                               : random_dense(rng, dt, {c.m, c.k}, r);
  HostTensor w = c.w_col_major ? random_permuted(rng, dt, {c.n, c.k}, {1, 0}, r)
                               : random_dense(rng, dt, {c.n, c.k}, r);
  // The bias: a view with stride bias_stride into a longer storage.
  HostTensor b = random_dense(rng, dt, {c.n * c.bias_stride}, r);
  b.shape = {c.n};
  b.strides = {c.bias_stride};
  std::vector<double> xv = x.logical(), wv = w.logical(), bv = b.logical();
  std::vector<double> ref(static_cast<size_t>(c.m * c.n), 0.0);
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      double acc = 0;
      for (int64_t q = 0; q < c.k; ++q)
        acc += xv[static_cast<size_t>(i * c.k + q)] * wv[static_cast<size_t>(j * c.k + q)];
      if (c.bias) acc += bv[static_cast<size_t>(j)];
      if (c.relu && acc < 0) acc = 0;
      ref[static_cast<size_t>(i * c.n + j)] = round_to(dt, acc);
    }
  DeviceTensor dx = upload(ctx, x), dw = upload(ctx, w), db = upload(ctx, b);
  std::vector<int64_t> out_shape = {c.m, c.n};
  DeviceTensor out = make_output(ctx, dt, out_shape);
  std::vector<bp_tensor_desc> ins = {dx.desc, dw.desc};
  std::vector<const HostTensor*> hosts = {&x, &w};
  if (c.bias) {
    ins.push_back(db.desc);
    hosts.push_back(&b);
  }
  const int64_t act = c.activation >= 0 ? c.activation : (c.relu ? BP_ACTIVATION_RELU : 0);
  std::vector<bp_attr> attrs = {attr_int("activation", act), attr_int("allow_tf32", 0)};
  std::string full = what + ": " +
                     describe_launch(op.name, hosts, out_shape, dt,
                                     format("activation %lld", static_cast<long long>(act)));
  if (c.activation >= 0) {
    run_kernel_expect_error(ctx, op.name, dt, ins, out.desc, attrs, BP_ERROR_INVALID_ARGUMENT,
                            full + " (activation out of range)");
    return;
  }
  run_kernel(ctx, op.name, dt, ins, out.desc, attrs, full);
  expect_close(read_dense(out, full), ref, dt, tolerance(dt, true), full);
}

}  // namespace

void matmul_cases(const OpInfo& op, int32_t dt, CaseList& out) {
  if (std::string(op.name) == "linear") {
    static const std::vector<LinearCase> lcases = {
        {"basic", 4, 5, 3},
        {"no_bias", 17, 33, 9, false},
        {"relu", 17, 33, 9, true, true},
        {"relu_no_bias", 8, 12, 5, false, true},
        {"transposed_x", 16, 24, 10, true, true, true},
        {"transposed_w", 16, 24, 10, true, true, false, true},
        {"strided_bias", 7, 13, 11, true, true, false, false, 3},
        {"vector", 1, 64, 1, true, true},
        {"k_zero", 3, 0, 4, true, true},
        {"empty", 0, 5, 4},
        {"large", 512, 256, 384, true, true},
        {"bad_activation", 4, 5, 3, true, false, false, false, 1, 7},
    };
    const OpInfo* p = &op;
    for (const LinearCase& c : lcases) {
      const LinearCase* cp = &c;
      out.push_back({c.variant, [p, dt, cp](Context& ctx) { run_linear(ctx, *p, dt, *cp); }});
    }
    return;
  }
  static const std::vector<MatmulCase> cases = {
      {"basic", 1, 4, 5, 3},
      {"odd", 2, 17, 33, 9},
      {"vector", 1, 1, 64, 1},
      {"transposed_a", 2, 16, 24, 10, true, false},
      {"transposed_b", 2, 16, 24, 10, false, true},
      {"transposed_ab", 3, 7, 13, 11, true, true},
      {"batched", 5, 9, 8, 7},
      {"batch_broadcast", 3, 8, 12, 5, false, false, true},
      {"k_zero", 2, 3, 0, 4},
      {"empty", 2, 0, 5, 4},
      {"large", 1, 1024, 64, 1024},
  };
  const OpInfo* p = &op;
  for (const MatmulCase& c : cases) {
    const MatmulCase* cp = &c;
    out.push_back({c.variant, [p, dt, cp](Context& ctx) { run_matmul(ctx, *p, dt, *cp); }});
  }
}

}  // namespace bpc
