// The transformer family but attention (Note [Op catalogue], minor 5): layer_norm and its
// backward, gelu and silu and their backward, embedding and its backward, triu, tril and cumsum.
//
// Note [CPU layer norm]
//   f32 goes through oneDNN's layer normalisation primitive (forward training, so the mean and
//   variance come out; rstd = 1 / sqrt(variance + eps) is then taken in double over the rows):
//   the rows are split into one chunk per oneTBB worker (at most two chunk heights, so at most
//   two cached primitives per shape), each chunk a one-threaded oneDNN call (Note [One thread
//   pool] in cpu_matmul.cpp). oneDNN 2.6 has no f64 layer normalisation and, below AVX-512, no
//   bf16 one, so f64, f16 and bf16 run our own loops: one row per work unit, the mean, then the
//   biased variance as the mean of squared deviations (two passes in double, so a row far from
//   zero keeps its variance), then y = (x - mean) rstd weight + bias in the compute type. The
//   backward (every dtype, our loops) computes dx row by row from the saved mean and rstd;
//   dweight and dbias are column sums over the rows, taken as partial sums over fixed chunks of
//   64 rows (in double) that are then added in chunk order, so the result does not depend on how
//   oneTBB split the work.
//
// Note [CPU embedding backward]
//   Determinism without atomics: the positions m are bucketed by their index in one serial
//   counting pass (in increasing m), then each row of dweight sums its bucket in that order, in
//   double, rows in parallel. A row no index names is written 0.
#include "cpu_dnnl_cache.hpp"
#include "cpu_nn.hpp"
#include "cpu_vmath.hpp"

#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace bp::cpu {
namespace {

constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

// ---- layer_norm ------------------------------------------------------------------------------

template <class T>
using StatT = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
constexpr bp_dtype stat_dtype() {
  return std::is_same_v<T, double> ? BP_DTYPE_F64 : BP_DTYPE_F32;
}

// The cached oneDNN layer normalisation of `rows` x N f32 rows (Note [CPU layer norm]): md[0]
// the data, md[1] weight and bias, md[2] mean and variance.
std::shared_ptr<const DnnlPrimitive> layer_norm_primitive(int64_t rows, int64_t N, bool w, bool b,
                                                          double eps) {
  const std::string key = bp::sdk::format("layer_norm f32 %lld x %lld scale %d shift %d eps %.17g",
                                          static_cast<long long>(rows), static_cast<long long>(N),
                                          w ? 1 : 0, b ? 1 : 0, eps);
  return dnnl_cached(key, 1, [&] {  // run one-threaded on oneTBB workers
    using dnnl::memory;
    using dnnl::normalization_flags;
    DnnlPrimitive out;
    out.md[0] = memory::desc({rows, N}, memory::data_type::f32, memory::format_tag::ab);
    out.md[1] = memory::desc({N}, memory::data_type::f32, memory::format_tag::a);
    normalization_flags flags = normalization_flags::none;
    if (w) flags |= normalization_flags::use_scale;
    if (b) flags |= normalization_flags::use_shift;
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const dnnl::layer_normalization_forward::desc d(dnnl::prop_kind::forward_training, out.md[0],
                                                    static_cast<float>(eps), flags);
    const dnnl::layer_normalization_forward::primitive_desc pd(d, attr, dnnl_engine());
    out.prim = dnnl::layer_normalization_forward(pd);
    out.md[2] = pd.mean_desc();
    out.scratchpad = pd.scratchpad_desc();
    return out;
  });
}

// layer_norm of f32 rows through oneDNN; mean and rstd (each M) always written.
void layer_norm_onednn(const Launch& l, const float* x, const float* w, const float* b, float* y,
                       float* mean, float* rstd, int64_t M, int64_t N, double eps) {
  const bool serial = M * N < parallelism(Cost::kReduction).serial_below;
  const int64_t workers = serial ? 1 : std::max(1, tbb::this_task_arena::max_concurrency());
  const int64_t chunk = (M + workers - 1) / workers, chunks = (M + chunk - 1) / chunk;
  auto run = [&](int64_t c) {
    const int64_t r0 = c * chunk, n = std::min(chunk, M - r0);
    auto p = layer_norm_primitive(n, N, w != nullptr, b != nullptr, eps);
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_SRC, dnnl_mem(p->md[0], x + r0 * N)},
        {DNNL_ARG_DST, dnnl_mem(p->md[0], y + r0 * N)},
        {DNNL_ARG_MEAN, dnnl_mem(p->md[2], mean + r0)},
        {DNNL_ARG_VARIANCE, dnnl_mem(p->md[2], rstd + r0)}};
    if (w) args.emplace(DNNL_ARG_SCALE, dnnl_mem(p->md[1], w));
    if (b) args.emplace(DNNL_ARG_SHIFT, dnnl_mem(p->md[1], b));
    try {
      dnnl_run(*p, args);  // built for one thread: it runs on a oneTBB worker
    } catch (const dnnl::error& e) {
      launch_error(l, bp::sdk::format("oneDNN layer normalisation failed: %s (status %d)", e.what(),
                                      static_cast<int>(e.status)));
    }
    for (int64_t r = r0; r < r0 + n; ++r)  // the variance becomes rstd in place
      rstd[r] = static_cast<float>(1.0 / std::sqrt(static_cast<double>(rstd[r]) + eps));
  };
  parallel_units(chunks, chunk * N * 3, Cost::kReduction, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) run(c);
  });
}

template <class T>
void layer_norm_kernel(const Launch& l) {
  using C = compute_t<T>;
  using ST = StatT<T>;
  if (l.num_inputs < 1 || l.num_inputs > 3 || (l.num_outputs != 1 && l.num_outputs != 3))
    launch_error(l, bp::sdk::format("expects 1 to 3 inputs (x, weight, bias) and 1 or 3 outputs "
                                    "(y, mean, rstd), got %d and %d",
                                    l.num_inputs, l.num_outputs));
  const bp_tensor_desc &x = l.inputs[0], &y = l.outputs[0];
  check_dense(l, x, 2, DType<T>::id, "x");
  check_dense(l, y, 2, DType<T>::id, "y");
  check_same_shape(l, x, y, "x");
  const int64_t M = x.shape[0], N = x.shape[1];
  const char* roles[] = {"x", "weight", "bias"};
  for (int i = 1; i < l.num_inputs; ++i) {
    check_dense(l, l.inputs[i], 1, DType<T>::id, roles[i]);
    check_shape(l, l.inputs[i], {N}, roles[i]);
  }
  const bool save = l.num_outputs == 3;
  if (save) {
    check_dense(l, l.outputs[1], 1, stat_dtype<T>(), "mean");
    check_shape(l, l.outputs[1], {M}, "mean");
    check_dense(l, l.outputs[2], 1, stat_dtype<T>(), "rstd");
    check_shape(l, l.outputs[2], {M}, "rstd");
  }
  const double eps = l.attrs.f(BP_ATTR_ID_EPS, 1e-5);
  if (M == 0) return;
  if (N == 0) launch_error(l, "rows of 0 elements have no mean (N must be >= 1)");
  const T* px = data<T>(x);
  T* py = data<T>(y);
  const T* pw = l.num_inputs > 1 ? data<T>(l.inputs[1]) : nullptr;
  const T* pb = l.num_inputs > 2 ? data<T>(l.inputs[2]) : nullptr;
  ST* pmean = save ? data<ST>(l.outputs[1]) : nullptr;
  ST* prstd = save ? data<ST>(l.outputs[2]) : nullptr;
  if constexpr (std::is_same_v<T, float>) {
    std::vector<float> scratch_stats(save ? 0 : static_cast<size_t>(2 * M));
    layer_norm_onednn(l, px, pw, pb, py, save ? pmean : scratch_stats.data(),
                      save ? prstd : scratch_stats.data() + M, M, N, eps);
    return;
  }
  std::vector<C> w(static_cast<size_t>(N), C(1)), b(static_cast<size_t>(N), C(0));
  for (int64_t j = 0; j < N; ++j) {
    if (pw) w[static_cast<size_t>(j)] = DType<T>::load(pw[j]);
    if (pb) b[static_cast<size_t>(j)] = DType<T>::load(pb[j]);
  }
  parallel_units(M, 3 * N, Cost::kReduction, [&](int64_t rb, int64_t re) {
    for (int64_t m = rb; m < re; ++m) {
      const T* xr = px + m * N;
      T* yr = py + m * N;
      double sum = 0, sq = 0;
      for (int64_t j = 0; j < N; ++j) sum += static_cast<double>(DType<T>::load(xr[j]));
      const double mean = sum / static_cast<double>(N);
      for (int64_t j = 0; j < N; ++j) {
        const double d = static_cast<double>(DType<T>::load(xr[j])) - mean;
        sq += d * d;
      }
      const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(N) + eps);
      if (save) {
        pmean[m] = static_cast<ST>(mean);
        prstd[m] = static_cast<ST>(rstd);
      }
      const C cm = static_cast<C>(mean), cr = static_cast<C>(rstd);
      for (int64_t j = 0; j < N; ++j)
        yr[j] = DType<T>::store((DType<T>::load(xr[j]) - cm) * cr * w[static_cast<size_t>(j)] +
                                b[static_cast<size_t>(j)]);
    }
  });
}

template <class T>
void layer_norm_backward_kernel(const Launch& l) {
  using ST = StatT<T>;
  const bool with_w = l.num_inputs == 5;
  if ((l.num_inputs != 4 && l.num_inputs != 5) || l.num_outputs != (with_w ? 3 : 1))
    launch_error(l, bp::sdk::format("expects dy, x, mean, rstd (, weight) and dx (, dweight, "
                                    "dbias): 4 inputs and 1 output or 5 and 3, got %d and %d",
                                    l.num_inputs, l.num_outputs));
  const bp_tensor_desc &dy = l.inputs[0], &x = l.inputs[1], &dx = l.outputs[0];
  check_dense(l, x, 2, DType<T>::id, "x");
  check_dense(l, dy, 2, DType<T>::id, "dy");
  check_dense(l, dx, 2, DType<T>::id, "dx");
  check_same_shape(l, dy, x, "dy");
  check_same_shape(l, dx, x, "dx");
  const int64_t M = x.shape[0], N = x.shape[1];
  check_dense(l, l.inputs[2], 1, stat_dtype<T>(), "mean");
  check_shape(l, l.inputs[2], {M}, "mean");
  check_dense(l, l.inputs[3], 1, stat_dtype<T>(), "rstd");
  check_shape(l, l.inputs[3], {M}, "rstd");
  if (with_w) {
    check_dense(l, l.inputs[4], 1, DType<T>::id, "weight");
    check_shape(l, l.inputs[4], {N}, "weight");
    for (int i = 1; i < 3; ++i) {
      check_dense(l, l.outputs[i], 1, DType<T>::id, i == 1 ? "dweight" : "dbias");
      check_shape(l, l.outputs[i], {N}, i == 1 ? "dweight" : "dbias");
    }
  }
  const T *pdy = data<T>(dy), *px = data<T>(x);
  const ST *pmean = data<ST>(l.inputs[2]), *prstd = data<ST>(l.inputs[3]);
  T* pdx = data<T>(dx);
  std::vector<double> w(static_cast<size_t>(N), 1.0);
  if (with_w)
    for (int64_t j = 0; j < N; ++j)
      w[static_cast<size_t>(j)] = static_cast<double>(DType<T>::load(data<T>(l.inputs[4])[j]));
  constexpr int64_t kChunk = 64;  // rows per partial sum of dweight and dbias
  const int64_t chunks = (M + kChunk - 1) / kChunk;
  std::vector<double> pdw(with_w ? static_cast<size_t>(chunks * N) : 0),
      pdb(with_w ? static_cast<size_t>(chunks * N) : 0);
  parallel_units(chunks, kChunk * 4 * N, Cost::kReduction, [&](int64_t cb, int64_t ce) {
    std::vector<double> xhat(static_cast<size_t>(N));
    for (int64_t c = cb; c < ce; ++c) {
      double* cw = with_w ? pdw.data() + c * N : nullptr;
      double* cbias = with_w ? pdb.data() + c * N : nullptr;
      for (int64_t m = c * kChunk; m < std::min(M, (c + 1) * kChunk); ++m) {
        const double mean = static_cast<double>(pmean[m]), rstd = static_cast<double>(prstd[m]);
        double sg = 0, sgx = 0;
        for (int64_t j = 0; j < N; ++j) {
          const size_t jj = static_cast<size_t>(j);
          const double d = static_cast<double>(DType<T>::load(pdy[m * N + j]));
          xhat[jj] = (static_cast<double>(DType<T>::load(px[m * N + j])) - mean) * rstd;
          const double g = d * w[jj];
          sg += g;
          sgx += g * xhat[jj];
          if (with_w) {
            cw[j] += d * xhat[jj];
            cbias[j] += d;
          }
        }
        const double a = sg / static_cast<double>(N), b = sgx / static_cast<double>(N);
        for (int64_t j = 0; j < N; ++j) {
          const size_t jj = static_cast<size_t>(j);
          const double g = static_cast<double>(DType<T>::load(pdy[m * N + j])) * w[jj];
          pdx[m * N + j] =
              DType<T>::store(static_cast<compute_t<T>>(rstd * (g - a - xhat[jj] * b)));
        }
      }
    }
  });
  if (!with_w) return;
  T* pgw = data<T>(l.outputs[1]);
  T* pgb = data<T>(l.outputs[2]);
  for (int64_t j = 0; j < N; ++j) {
    double sw = 0, sb = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      sw += pdw[static_cast<size_t>(c * N + j)];
      sb += pdb[static_cast<size_t>(c * N + j)];
    }
    pgw[j] = DType<T>::store(static_cast<compute_t<T>>(sw));
    pgb[j] = DType<T>::store(static_cast<compute_t<T>>(sb));
  }
}

// ---- gelu, silu ------------------------------------------------------------------------------

enum class Act { kGelu, kGeluTanh, kSilu };

// Note [CPU activations]
//   gelu (exact and tanh), silu and their backward run over chunks of kActChunk elements in the
//   compute type (f32; f64 for f64): the transcendental's argument for the whole chunk, one
//   call of the vector function (erf, exp, tanh or sigmoid of Note [CPU vector math]), then the
//   combination. Per element they called libm's erff / tanhf / expf, which took three eighths
//   of a character GPT's training step on cpu:0 (tanh GELU, 2-core VM). The formulas are the
//   usual ones: gelu x/2 (1 + erf(x/sqrt2)), its gradient (1 + erf(x/sqrt2))/2 + x phi(x); tanh
//   gelu x/2 (1 + t) with t = tanh(sqrt(2/pi) (x + 0.044715 x^3)), its gradient
//   (1 + t)/2 + x/2 (1 - t^2) sqrt(2/pi) (1 + 3 0.044715 x^2); silu x s with s = sigmoid(x),
//   its gradient s (1 + x (1 - s)).
constexpr int64_t kActChunk = 256;

template <class C>
void act_chunk(Act a, bool backward, const C* x, const C* dy, C* out, int64_t m) {
  C u[kActChunk], w[kActChunk];
  switch (a) {
    case Act::kGelu:
      for (int64_t j = 0; j < m; ++j) u[j] = x[j] * static_cast<C>(kInvSqrt2);
      vmath::unary(vmath::kErf, u, u, m);
      if (!backward) {
        for (int64_t j = 0; j < m; ++j) out[j] = C(0.5) * x[j] * (C(1) + u[j]);
        return;
      }
      for (int64_t j = 0; j < m; ++j) w[j] = C(-0.5) * x[j] * x[j];
      vmath::unary(vmath::kExp, w, w, m);
      for (int64_t j = 0; j < m; ++j)
        out[j] = dy[j] * (C(0.5) * (C(1) + u[j]) + x[j] * static_cast<C>(kInvSqrt2Pi) * w[j]);
      return;
    case Act::kGeluTanh:
      for (int64_t j = 0; j < m; ++j)
        u[j] = static_cast<C>(kSqrt2OverPi) * (x[j] + C(0.044715) * x[j] * x[j] * x[j]);
      vmath::unary(vmath::kTanh, u, u, m);
      if (!backward) {
        for (int64_t j = 0; j < m; ++j) out[j] = C(0.5) * x[j] * (C(1) + u[j]);
        return;
      }
      for (int64_t j = 0; j < m; ++j) {
        const C t = u[j], v = x[j];
        out[j] = dy[j] *
                 (C(0.5) * (C(1) + t) + C(0.5) * v * (C(1) - t * t) * static_cast<C>(kSqrt2OverPi) *
                                            (C(1) + C(3 * 0.044715) * v * v));
      }
      return;
    case Act::kSilu:
      vmath::unary(vmath::kSigmoid, x, u, m);
      if (!backward) {
        for (int64_t j = 0; j < m; ++j) out[j] = x[j] * u[j];
        return;
      }
      for (int64_t j = 0; j < m; ++j) out[j] = dy[j] * (u[j] * (C(1) + x[j] * (C(1) - u[j])));
      return;
  }
}

template <class T, bool kBackward>
void activation_kernel(const Launch& l) {
  using C = compute_t<T>;
  check_arity(l, kBackward ? 2 : 1, 1);
  const bp_tensor_desc &x = l.inputs[0], &out = l.outputs[0];
  check_dense(l, x, x.rank, DType<T>::id, "x");
  check_dense(l, out, x.rank, DType<T>::id, "output");
  check_same_shape(l, x, out, "x");
  if (kBackward) {
    check_dense(l, l.inputs[1], x.rank, DType<T>::id, "dy");
    check_same_shape(l, l.inputs[1], out, "dy");
  }
  Act a = Act::kSilu;
  const Op op = l.kernel.op;
  if (op == Op::kGelu || op == Op::kGeluBackward)
    a = l.attrs.i(BP_ATTR_ID_APPROXIMATE, BP_GELU_EXACT) == BP_GELU_TANH ? Act::kGeluTanh
                                                                         : Act::kGelu;
  const T* px = data<T>(x);
  const T* pd = kBackward ? data<T>(l.inputs[1]) : nullptr;
  T* po = data<T>(out);
  parallel_for_range(numel(out), Cost::kTranscendental, [&](int64_t b, int64_t e) {
    C xs[kActChunk], dys[kBackward ? kActChunk : 1], ys[kActChunk];
    for (int64_t i0 = b; i0 < e; i0 += kActChunk) {
      const int64_t m = std::min(kActChunk, e - i0);
      for (int64_t j = 0; j < m; ++j) xs[j] = DType<T>::load(px[i0 + j]);
      if constexpr (kBackward)
        for (int64_t j = 0; j < m; ++j) dys[j] = DType<T>::load(pd[i0 + j]);
      act_chunk<C>(a, kBackward, xs, kBackward ? dys : nullptr, ys, m);
      for (int64_t j = 0; j < m; ++j) po[i0 + j] = DType<T>::store(ys[j]);
    }
  });
}

// ---- embedding -------------------------------------------------------------------------------

// Throws naming the first index outside [0, V) (Note [Op catalogue]).
void check_indices(const Launch& l, const int64_t* idx, int64_t M, int64_t V) {
  for (int64_t m = 0; m < M; ++m)
    if (idx[m] < 0 || idx[m] >= V)
      launch_error(l, bp::sdk::format("index %lld at position %lld is out of range for a table "
                                      "of %lld rows (valid: 0 to %lld)",
                                      static_cast<long long>(idx[m]), static_cast<long long>(m),
                                      static_cast<long long>(V), static_cast<long long>(V - 1)));
}

template <class T>
void embedding_kernel(const Launch& l) {
  check_arity(l, 2, 1);
  const bp_tensor_desc &w = l.inputs[0], &idx = l.inputs[1], &out = l.outputs[0];
  check_dense(l, w, 2, DType<T>::id, "weight");
  check_dense(l, idx, 1, BP_DTYPE_I64, "indices");
  check_dense(l, out, 2, DType<T>::id, "output");
  const int64_t V = w.shape[0], D = w.shape[1], M = idx.shape[0];
  check_shape(l, out, {M, D}, "output");
  const int64_t* pi = M ? data<int64_t>(idx) : nullptr;
  check_indices(l, pi, M, V);
  if (M == 0 || D == 0) return;
  const T* pw = data<T>(w);
  T* po = data<T>(out);
  parallel_units(M, D, Cost::kCheap, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m)
      std::memcpy(po + m * D, pw + pi[m] * D, static_cast<size_t>(D) * sizeof(T));
  });
}

template <class T>
void embedding_backward_kernel(const Launch& l) {
  check_arity(l, 2, 1);
  const bp_tensor_desc &dy = l.inputs[0], &idx = l.inputs[1], &dw = l.outputs[0];
  check_dense(l, dy, 2, DType<T>::id, "dy");
  check_dense(l, idx, 1, BP_DTYPE_I64, "indices");
  check_dense(l, dw, 2, DType<T>::id, "dweight");
  const int64_t V = dw.shape[0], D = dw.shape[1], M = idx.shape[0];
  check_shape(l, dy, {M, D}, "dy");
  const int64_t* pi = M ? data<int64_t>(idx) : nullptr;
  check_indices(l, pi, M, V);
  if (V == 0 || D == 0) return;
  // Note [CPU embedding backward]: bucket the positions by row, in increasing m.
  std::vector<int64_t> start(static_cast<size_t>(V + 1), 0), order(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) ++start[static_cast<size_t>(pi[m] + 1)];
  for (int64_t v = 0; v < V; ++v)
    start[static_cast<size_t>(v + 1)] += start[static_cast<size_t>(v)];
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t m = 0; m < M; ++m)
      order[static_cast<size_t>(fill[static_cast<size_t>(pi[m])]++)] = m;
  }
  const T* pd = M ? data<T>(dy) : nullptr;
  T* po = data<T>(dw);
  parallel_units(V, D + M / V + 1, Cost::kCheap, [&](int64_t b, int64_t e) {
    std::vector<double> acc(static_cast<size_t>(D));
    for (int64_t v = b; v < e; ++v) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t k = start[static_cast<size_t>(v)]; k < start[static_cast<size_t>(v + 1)]; ++k) {
        const T* row = pd + order[static_cast<size_t>(k)] * D;
        for (int64_t j = 0; j < D; ++j)
          acc[static_cast<size_t>(j)] += static_cast<double>(DType<T>::load(row[j]));
      }
      for (int64_t j = 0; j < D; ++j)
        po[v * D + j] = DType<T>::store(static_cast<compute_t<T>>(acc[static_cast<size_t>(j)]));
    }
  });
}

// ---- triu, tril, cumsum ----------------------------------------------------------------------

template <class T, bool kUpper>
void triangle_kernel(const Launch& l) {
  check_arity(l, 1, 1);
  const bp_tensor_desc &x = l.inputs[0], &out = l.outputs[0];
  if (x.rank < 2)
    launch_error(l, bp::sdk::format("input %s must have rank >= 2", describe(x).c_str()));
  check_dense(l, x, x.rank, DType<T>::id, "input");
  check_dense(l, out, x.rank, DType<T>::id, "output");
  check_same_shape(l, x, out, "input");
  const int64_t diagonal = l.attrs.i(BP_ATTR_ID_DIAGONAL, 0);
  const int64_t R = x.shape[x.rank - 2], C = x.shape[x.rank - 1];
  const int64_t rows = numel(x) / std::max<int64_t>(C, 1);
  if (numel(x) == 0) return;
  const T* px = data<T>(x);
  T* po = data<T>(out);
  parallel_units(rows, C, Cost::kBytes, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t row = r % R;
      // Kept columns: c >= row + diagonal (triu) or c <= row + diagonal (tril).
      const int64_t edge = std::clamp<int64_t>(kUpper ? row + diagonal : row + diagonal + 1, 0, C);
      const T* xr = px + r * C;
      T* o = po + r * C;
      if (kUpper) {
        std::memset(static_cast<void*>(o), 0, static_cast<size_t>(edge) * sizeof(T));
        std::memcpy(o + edge, xr + edge, static_cast<size_t>(C - edge) * sizeof(T));
      } else {
        std::memcpy(o, xr, static_cast<size_t>(edge) * sizeof(T));
        std::memset(static_cast<void*>(o + edge), 0, static_cast<size_t>(C - edge) * sizeof(T));
      }
    }
  });
}

template <class T, bool kFloat>
struct CumsumAcc {
  using type = double;
};
template <class T>
struct CumsumAcc<T, false> {
  using type = std::make_unsigned_t<T>;
};

template <class T>
void cumsum_kernel(const Launch& l) {
  check_arity(l, 1, 1);
  const bp_tensor_desc &x = l.inputs[0], &out = l.outputs[0];
  check_dense(l, x, x.rank, DType<T>::id, "input");
  check_dense(l, out, x.rank, DType<T>::id, "output");
  check_same_shape(l, x, out, "input");
  const int axis = read_axis(l, x.rank);
  const AxisView v = x.rank ? axis_view(x, axis) : AxisView{};
  if (v.outer * v.length * v.inner == 0) return;
  const T* px = data<T>(x);
  T* po = data<T>(out);
  // Floats add in double; integers in their own width, unsigned so that they wrap.
  using Acc = typename CumsumAcc<T, is_floating_v<T>>::type;
  parallel_units(v.outer, v.length * v.inner, Cost::kReduction, [&](int64_t b, int64_t e) {
    std::vector<Acc> acc(static_cast<size_t>(v.inner));
    for (int64_t o = b; o < e; ++o) {
      std::fill(acc.begin(), acc.end(), Acc(0));
      for (int64_t k = 0; k < v.length; ++k) {
        const int64_t base = (o * v.length + k) * v.inner;
        for (int64_t i = 0; i < v.inner; ++i) {
          Acc& a = acc[static_cast<size_t>(i)];
          a += static_cast<Acc>(DType<T>::load(px[base + i]));
          po[base + i] = DType<T>::store(static_cast<compute_t<T>>(a));
        }
      }
    }
  });
}

}  // namespace

KernelFn transformer_family(Op op, bp_dtype dtype) {
  return visit_dtype(dtype, [&]<class T>() -> KernelFn {
    constexpr bool kFloat = is_floating_v<T>;
    constexpr bool kSigned = kFloat || std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>;
    switch (op) {
      case Op::kTriu:
        return &triangle_kernel<T, true>;
      case Op::kTril:
        return &triangle_kernel<T, false>;
      default:
        break;
    }
    if constexpr (kSigned)
      if (op == Op::kCumsum) return &cumsum_kernel<T>;
    if constexpr (kFloat) {
      switch (op) {
        case Op::kLayerNorm:
          return &layer_norm_kernel<T>;
        case Op::kLayerNormBackward:
          return &layer_norm_backward_kernel<T>;
        case Op::kGelu:
        case Op::kSilu:
          return &activation_kernel<T, false>;
        case Op::kGeluBackward:
        case Op::kSiluBackward:
          return &activation_kernel<T, true>;
        case Op::kEmbedding:
          return &embedding_kernel<T>;
        case Op::kEmbeddingBackward:
          return &embedding_backward_kernel<T>;
        default:
          break;
      }
    }
    return nullptr;
  });
}

}  // namespace bp::cpu
