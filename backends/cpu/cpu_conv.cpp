// conv2d, conv2d_backward_input and conv2d_backward_weight on NCHW images.
//
// Note [CPU convolution]
//   f32 and bf16 go to oneDNN's convolution primitives (forward, backward data, backward
//   weights; algorithm direct; the tensors stay NCHW / KCRS, Note [CPU convolution layouts]),
//   created once per shape and attributes (Note [CPU primitive cache]). f16, and bf16 on a
//   CPU where oneDNN has no implementation, are converted to f32, run as f32 and rounded back
//   once: the primitive build reports unimplemented and the cached entry remembers it. f64,
//   which oneDNN lacks, is im2col (one image and group at a time, on a oneTBB worker) and
//   OpenBLAS's one-threaded cblas_dgemm (col2im for the input gradient; the weight gradient sums
//   per-worker chunks of the batch in chunk order).
//   bf16 accumulates in f32 inside oneDNN, and its bias and weight gradient are f32 there.
//   Threads: each convolution is one oneDNN call with an OpenMP team of as many threads as
//   oneTBB has workers, and small problems (below kSerialMacs multiply-adds) run on the calling
//   thread. BACKPLANE_CPU_CONV_THREADS=tbb (read once) instead cuts a batch of at least that
//   many images into one chunk per oneTBB worker, each a one-threaded oneDNN call on a
//   primitive for the chunk's batch size (Note [One thread pool] in cpu_matmul.cpp), the weight
//   gradient summing the chunks' f32 partial gradients in chunk order; either way a run gives
//   the same bits every time on one machine. The chunks were the default until they were
//   measured on many cores: every chunk reorders the weights into the primitive's layout and
//   the weight gradient out of it, so that work grows with the worker count, and ResNet-18's
//   f32 training step on the GPU machine's 16-core host ran at 68 img/s in chunks against 178
//   with OpenMP teams (with OpenMP's threads sleeping between regions; the loops that follow
//   a convolution now run on its team instead, Note [OpenMP loops] in cpu_kernels.cpp); on 2
//   cores the teams were as fast or faster.
//
// Note [CPU convolution layouts]
//   The tensors are NCHW (weights KCRS) as the host gives them. By default each primitive is
//   created with format_tag::any and picks its own (blocked, nChw8c-like) layouts; the launch
//   reorders the inputs into them and the output back (reorders of oneDNN, cached by oneDNN
//   itself), per batch chunk on the chunk's thread. With plain layouts oneDNN 2.6 falls back to
//   im2col + gemm ("gemm:jit"); the blocked "jit:avx2" kernels were faster including the
//   reorders, at every ResNet-18 shape measured with tests/cpu_conv_bench.cpp (2-core AVX2 VM,
//   batch 32, f32, ms plain -> blocked: 64x32x32 s1 forward 87 -> 58, backward input 101 ->
//   57, backward weight 95 -> 75; 128x16x16 s1 64 -> 69, 82 -> 56, 89 -> 72; 128x16x16 -> 256
//   s2 47 -> 34, 43 -> 39, 43 -> 42; README.md has the table). BACKPLANE_CPU_CONV_LAYOUT=plain
//   (read once) keeps the plain layouts, for comparison.
#include "cpu_dnnl_cache.hpp"
#include "cpu_nn.hpp"

#include <cblas.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace bp::cpu {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// Below this many multiply-adds a convolution runs on the calling thread (about the cost of
// waking the workers; not measured per shape).
constexpr int64_t kSerialMacs = int64_t{1} << 19;

struct ConvGeom {
  int64_t N, C, H, W, K, R, S, P, Q, G;
  Spatial s;
  int64_t macs() const { return N * K * P * Q * (C / G) * R * S; }
};

// Checks x[N,C,H,W], w[K,C/G,R,S], y[N,K,P,Q] (under the names given) against the attributes.
ConvGeom conv_geom(const Launch& l, const bp_tensor_desc& x, const bp_tensor_desc& w,
                   const bp_tensor_desc& y, const char* xr, const char* wr, const char* yr) {
  const int32_t d = l.kernel.dtype;
  check_dense(l, x, 4, d, xr);
  check_dense(l, w, 4, d, wr);
  check_dense(l, y, 4, d, yr);
  ConvGeom g{};
  g.s = conv_attrs(l);
  g.N = x.shape[0];
  g.C = x.shape[1];
  g.H = x.shape[2];
  g.W = x.shape[3];
  g.K = w.shape[0];
  g.R = w.shape[2];
  g.S = w.shape[3];
  g.G = g.s.groups;
  if (g.C % g.G != 0 || g.K % g.G != 0 || w.shape[1] * g.G != g.C || g.R < 1 || g.S < 1)
    launch_error(l, bp::sdk::format("%s %s and %s %s do not fit %lld group(s): channels %lld and "
                                    "%lld must be multiples of groups and %s's dimension 1 "
                                    "channels / groups",
                                    xr, describe(x).c_str(), wr, describe(w).c_str(),
                                    static_cast<long long>(g.G), static_cast<long long>(g.C),
                                    static_cast<long long>(g.K), wr));
  g.P = out_size(g.H, g.R, g.s.stride_h, g.s.pad_h, g.s.dil_h, false);
  g.Q = out_size(g.W, g.S, g.s.stride_w, g.s.pad_w, g.s.dil_w, false);
  check_shape(l, y, {g.N, g.K, g.P, g.Q}, yr);
  return g;
}

// ---- f64: im2col + OpenBLAS (Note [CPU convolution]) -------------------------------------

// Rows (c, r, s) x columns (p, q) of one image's group of Cg channels; 0 in the padding.
void im2col(const ConvGeom& g, const double* x, int64_t Cg, double* col) {
  const int64_t PQ = g.P * g.Q;
  for (int64_t c = 0; c < Cg; ++c)
    for (int64_t r = 0; r < g.R; ++r)
      for (int64_t s = 0; s < g.S; ++s) {
        double* row = col + ((c * g.R + r) * g.S + s) * PQ;
        const double* xp = x + c * g.H * g.W;
        for (int64_t p = 0; p < g.P; ++p) {
          const int64_t h = p * g.s.stride_h - g.s.pad_h + r * g.s.dil_h;
          double* out = row + p * g.Q;
          if (h < 0 || h >= g.H) {
            std::fill(out, out + g.Q, 0.0);
            continue;
          }
          for (int64_t q = 0; q < g.Q; ++q) {
            const int64_t w = q * g.s.stride_w - g.s.pad_w + s * g.s.dil_w;
            out[q] = w >= 0 && w < g.W ? xp[h * g.W + w] : 0.0;
          }
        }
      }
}

// The adjoint of im2col: adds the columns back into the image's Cg channels (zeroed first).
void col2im(const ConvGeom& g, const double* col, int64_t Cg, double* dx) {
  const int64_t PQ = g.P * g.Q;
  std::fill(dx, dx + Cg * g.H * g.W, 0.0);
  for (int64_t c = 0; c < Cg; ++c)
    for (int64_t r = 0; r < g.R; ++r)
      for (int64_t s = 0; s < g.S; ++s) {
        const double* row = col + ((c * g.R + r) * g.S + s) * PQ;
        double* dp = dx + c * g.H * g.W;
        for (int64_t p = 0; p < g.P; ++p) {
          const int64_t h = p * g.s.stride_h - g.s.pad_h + r * g.s.dil_h;
          if (h < 0 || h >= g.H) continue;
          for (int64_t q = 0; q < g.Q; ++q) {
            const int64_t w = q * g.s.stride_w - g.s.pad_w + s * g.s.dil_w;
            if (w >= 0 && w < g.W) dp[h * g.W + w] += row[p * g.Q + q];
          }
        }
      }
}

void dgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, const double* b,
           double beta, double* c) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0, a,
              static_cast<int>(ta ? m : k), b, static_cast<int>(tb ? k : n), beta, c,
              static_cast<int>(n));
}

// Refuses shapes whose matrices BLAS's 32-bit int cannot describe.
void check_blas_dims(const Launch& l, const ConvGeom& g) {
  const int64_t rows = (g.C / g.G) * g.R * g.S, cols = g.P * g.Q;
  if (rows > INT_MAX || cols > INT_MAX || g.K > INT_MAX || rows * cols > INT_MAX)
    launch_error(l, "the f64 convolution's im2col matrix does not fit BLAS's 32-bit int");
}

void f64_forward(const ConvGeom& g, const double* x, const double* w, const double* bias,
                 double* y) {
  const int64_t Cg = g.C / g.G, Kg = g.K / g.G, PQ = g.P * g.Q, CRS = Cg * g.R * g.S;
  parallel_units(g.N * g.G, Kg * PQ * CRS, Cost::kReduction, [&](int64_t b, int64_t e) {
    std::vector<double> col(static_cast<size_t>(CRS * PQ));
    for (int64_t u = b; u < e; ++u) {
      const int64_t n = u / g.G, grp = u % g.G;
      im2col(g, x + (n * g.C + grp * Cg) * g.H * g.W, Cg, col.data());
      double* yp = y + (n * g.K + grp * Kg) * PQ;
      for (int64_t k = 0; k < Kg; ++k)
        std::fill(yp + k * PQ, yp + (k + 1) * PQ, bias ? bias[grp * Kg + k] : 0.0);
      dgemm(false, false, Kg, PQ, CRS, w + grp * Kg * CRS, col.data(), 1.0, yp);
    }
  });
}

void f64_backward_input(const ConvGeom& g, const double* dy, const double* w, double* dx) {
  const int64_t Cg = g.C / g.G, Kg = g.K / g.G, PQ = g.P * g.Q, CRS = Cg * g.R * g.S;
  parallel_units(g.N * g.G, Kg * PQ * CRS, Cost::kReduction, [&](int64_t b, int64_t e) {
    std::vector<double> col(static_cast<size_t>(CRS * PQ));
    for (int64_t u = b; u < e; ++u) {
      const int64_t n = u / g.G, grp = u % g.G;
      // col = w_g^T dy_g: [CRS, Kg] x [Kg, PQ]
      dgemm(true, false, CRS, PQ, Kg, w + grp * Kg * CRS, dy + (n * g.K + grp * Kg) * PQ, 0.0,
            col.data());
      col2im(g, col.data(), Cg, dx + (n * g.C + grp * Cg) * g.H * g.W);
    }
  });
}

// dw_g = sum over n of dy_g [Kg, PQ] x col^T [PQ, CRS]: the batch in one chunk per worker, the
// chunks' partial sums added in chunk order (the same bits every run on one machine).
void f64_backward_weight(const ConvGeom& g, const double* x, const double* dy, double* dw) {
  const int64_t Cg = g.C / g.G, Kg = g.K / g.G, PQ = g.P * g.Q, CRS = Cg * g.R * g.S;
  const int64_t wn = g.K * CRS;
  const bool serial = g.macs() < kSerialMacs;
  const int64_t workers = serial ? 1 : std::max(1, tbb::this_task_arena::max_concurrency());
  const int64_t nb = (g.N + workers - 1) / workers, chunks = (g.N + nb - 1) / nb;
  std::vector<double> partial(static_cast<size_t>((chunks - 1) * wn));
  auto unit = [&](int64_t u) {
    const int64_t chunk = u / g.G, grp = u % g.G;
    double* out = (chunk == 0 ? dw : partial.data() + (chunk - 1) * wn) + grp * Kg * CRS;
    std::vector<double> col(static_cast<size_t>(CRS * PQ));
    const int64_t n1 = std::min(g.N, (chunk + 1) * nb);
    for (int64_t n = chunk * nb; n < n1; ++n) {
      im2col(g, x + (n * g.C + grp * Cg) * g.H * g.W, Cg, col.data());
      dgemm(false, true, Kg, CRS, PQ, dy + (n * g.K + grp * Kg) * PQ, col.data(),
            n == chunk * nb ? 0.0 : 1.0, out);
    }
  };
  if (serial || chunks * g.G == 1) {
    for (int64_t u = 0; u < chunks * g.G; ++u) unit(u);
  } else {
    tbb::parallel_for(int64_t{0}, chunks * g.G, unit);
  }
  for (int64_t c = 1; c < chunks; ++c) {
    const double* p = partial.data() + (c - 1) * wn;
    for (int64_t i = 0; i < wn; ++i) dw[i] += p[i];
  }
}

// ---- oneDNN -----------------------------------------------------------------------------

enum class Pass { kForward, kBackwardData, kBackwardWeights };

const char* dt_name(dt d) {
  return d == dt::f32 ? "f32" : d == dt::bf16 ? "bf16" : "f16";
}

// Note [CPU convolution layouts]: BACKPLANE_CPU_CONV_LAYOUT=blocked|plain (read once).
bool blocked_layout() {
  static const bool blocked = !env_switch("BACKPLANE_CPU_CONV_LAYOUT", "blocked", "plain");
  return blocked;
}

// Note [CPU convolution]: BACKPLANE_CPU_CONV_THREADS=openmp|tbb (read once; openmp, one oneDNN
// call with an OpenMP team per convolution, is the default; tbb cuts large batches into chunks
// on oneTBB's workers).
bool chunked_conv() {
  static const bool chunked = env_switch("BACKPLANE_CPU_CONV_THREADS", "openmp", "tbb");
  return chunked;
}

// BACKPLANE_CPU_CONV_BF16_WGRAD=f32|native (read once): the route of bf16 weight gradients.
bool native_bf16_wgrad() {
  static const bool native = env_switch("BACKPLANE_CPU_CONV_BF16_WGRAD", "f32", "native");
  return native;
}

// Every variable of Note [CPU convolution] at the first launch of any dtype, so a bad value
// fails that launch whichever route it takes.
void read_conv_settings() {
  (void)blocked_layout();
  (void)chunked_conv();
  (void)native_bf16_wgrad();
}

std::string conv_key(Pass pass, const ConvGeom& g, int64_t nb, dt d, bool bias) {
  const ConvGeom& q = g;
  return bp::sdk::format(
      "conv%d%s %s n%lld c%lld h%lld w%lld k%lld r%lld s%lld g%lld st%lld,%lld "
      "pd%lld,%lld dl%lld,%lld b%d",
      static_cast<int>(pass), blocked_layout() ? "b" : "", dt_name(d), static_cast<long long>(nb),
      static_cast<long long>(q.C), static_cast<long long>(q.H), static_cast<long long>(q.W),
      static_cast<long long>(q.K), static_cast<long long>(q.R), static_cast<long long>(q.S),
      static_cast<long long>(q.G), static_cast<long long>(q.s.stride_h),
      static_cast<long long>(q.s.stride_w), static_cast<long long>(q.s.pad_h),
      static_cast<long long>(q.s.pad_w), static_cast<long long>(q.s.dil_h),
      static_cast<long long>(q.s.dil_w), bias ? 1 : 0);
}

// Builds the primitive of one pass for a batch of nb in dtype d (md: src, weights, dst, bias /
// diff_src, weights, diff_dst / src, diff_weights (f32), diff_dst). Unimplemented pairs give
// native = false (Note [CPU convolution]).
DnnlPrimitive make_conv(Pass pass, const ConvGeom& g, int64_t nb, dt d, bool bias) {
  using namespace dnnl;
  const memory::desc src({nb, g.C, g.H, g.W}, d, tag::nchw);
  const memory::desc dst({nb, g.K, g.P, g.Q}, d, tag::nchw);
  const dt wdt = pass == Pass::kBackwardWeights ? dt::f32 : d;
  const memory::desc wei =
      g.G > 1 ? memory::desc({g.G, g.K / g.G, g.C / g.G, g.R, g.S}, wdt, tag::goihw)
              : memory::desc({g.K, g.C, g.R, g.S}, wdt, tag::oihw);
  const memory::desc fwd_wei =
      g.G > 1 ? memory::desc({g.G, g.K / g.G, g.C / g.G, g.R, g.S}, d, tag::goihw)
              : memory::desc({g.K, g.C, g.R, g.S}, d, tag::oihw);
  const memory::desc bmd({g.K}, dt::f32, tag::x);
  const memory::dims strides = {g.s.stride_h, g.s.stride_w};
  const memory::dims dil = {g.s.dil_h - 1, g.s.dil_w - 1};
  const memory::dims pad = {g.s.pad_h, g.s.pad_w};
  // oneDNN wants the right padding that makes its output size ours exactly.
  const memory::dims pad_r = {
      (g.P - 1) * g.s.stride_h + (g.R - 1) * g.s.dil_h + 1 - g.H - g.s.pad_h,
      (g.Q - 1) * g.s.stride_w + (g.S - 1) * g.s.dil_w + 1 - g.W - g.s.pad_w};
  primitive_attr attr;
  attr.set_scratchpad_mode(scratchpad_mode::user);
  DnnlPrimitive out;
  // Note [CPU convolution layouts]: the primitive's own choice of layouts, or the plain ones.
  const bool blocked = blocked_layout();
  auto any = [&](const memory::desc& md) {
    return blocked ? memory::desc(md.dims(), md.data_type(), tag::any) : md;
  };
  const memory::desc asrc = any(src), adst = any(dst), awei = any(wei), afwd_wei = any(fwd_wei);
  auto bind = [&](int k, int arg, bool is_output, const memory::desc& chosen) {
    out.arg[k] = arg;
    out.output[k] = is_output;
    out.impl[k] = chosen;
  };
  try {
    const auto fd =
        bias ? convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct,
                                         asrc, afwd_wei, bmd, adst, strides, dil, pad, pad_r)
             : convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct,
                                         asrc, afwd_wei, adst, strides, dil, pad, pad_r);
    const convolution_forward::primitive_desc fpd(fd, attr, dnnl_engine());
    // Note [oneDNN reference kernels]: for a bf16 or f16 convolution that it has no optimised
    // kernel for, oneDNN may answer with its reference implementation ("ref:any"), orders of
    // magnitude slower than converting to f32 (ResNet-18's bf16 training ran at 0.02x PyTorch
    // on a 16-core Xeon); such a primitive counts as unimplemented, so the f32 route runs.
    auto reject_reference = [&](const auto& pd) {
      if (d != dt::f32 && is_reference(pd.impl_info_str()))
        throw dnnl::error(dnnl_unimplemented, "only oneDNN's reference implementation");
    };
    if (pass == Pass::kForward) {
      reject_reference(fpd);
      out.prim = convolution_forward(fpd);
      out.md[0] = src;
      out.md[1] = fwd_wei;
      out.md[2] = dst;
      out.md[3] = bmd;
      out.scratchpad = fpd.scratchpad_desc();
      bind(0, DNNL_ARG_SRC, false, fpd.src_desc());
      bind(1, DNNL_ARG_WEIGHTS, false, fpd.weights_desc());
      bind(2, DNNL_ARG_DST, true, fpd.dst_desc());
    } else if (pass == Pass::kBackwardData) {
      const convolution_backward_data::desc bd(algorithm::convolution_direct, asrc, awei, adst,
                                               strides, dil, pad, pad_r);
      const convolution_backward_data::primitive_desc pd(bd, attr, dnnl_engine(), fpd);
      reject_reference(pd);
      out.prim = convolution_backward_data(pd);
      out.md[0] = src;
      out.md[1] = wei;
      out.md[2] = dst;
      out.scratchpad = pd.scratchpad_desc();
      bind(0, DNNL_ARG_DIFF_SRC, true, pd.diff_src_desc());
      bind(1, DNNL_ARG_WEIGHTS, false, pd.weights_desc());
      bind(2, DNNL_ARG_DIFF_DST, false, pd.diff_dst_desc());
    } else {
      const convolution_backward_weights::desc wd(algorithm::convolution_direct, asrc, awei, adst,
                                                  strides, dil, pad, pad_r);
      // Measured on a 16-core Xeon with AMX: oneDNN's bf16 weight gradient took 210 ms a call
      // on ResNet-18's layers (batch 32 in chunks of two images), 50x its f32 one; so f16 and
      // bf16 weight gradients take the f32 route (converted, run in f32, rounded once) unless
      // BACKPLANE_CPU_CONV_BF16_WGRAD=native (read once) asks for oneDNN's own.
      if (d != dt::f32 && !(d == dt::bf16 && native_bf16_wgrad()))
        throw dnnl::error(dnnl_unimplemented, "low-precision weight gradients run in f32");
      const convolution_backward_weights::primitive_desc pd(wd, attr, dnnl_engine(), fpd);
      reject_reference(pd);
      out.prim = convolution_backward_weights(pd);
      out.md[0] = src;
      out.md[1] = wei;
      out.md[2] = dst;
      out.scratchpad = pd.scratchpad_desc();
      bind(0, DNNL_ARG_SRC, false, pd.src_desc());
      bind(1, DNNL_ARG_DIFF_WEIGHTS, true, pd.diff_weights_desc());
      bind(2, DNNL_ARG_DIFF_DST, false, pd.diff_dst_desc());
    }
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented || d == dt::f32)
      bp::sdk::fail(BP_ERROR_INTERNAL,
                    bp::sdk::format("cpu:0: oneDNN could not create the convolution primitive "
                                    "[%s]: %s (status %d)",
                                    conv_key(pass, g, nb, d, bias).c_str(), e.what(),
                                    static_cast<int>(e.status)));
    out.native = false;
    return out;
  }
  // The layout changes of every call, created once with the primitive (creating a reorder is a
  // descriptor build and a lookup in oneDNN's own cache each time, a cost per call that
  // inference at batch 1 felt).
  for (int k = 0; k < 3; ++k) {
    if (!out.arg[k] || out.impl[k] == out.md[k]) continue;
    dnnl::primitive_attr rattr;
    rattr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const memory::desc& from = out.output[k] ? out.impl[k] : out.md[k];
    const memory::desc& to = out.output[k] ? out.md[k] : out.impl[k];
    const dnnl::reorder::primitive_desc rpd(dnnl_engine(), from, dnnl_engine(), to, rattr);
    out.reorder[k] = dnnl::reorder(rpd);
    out.reorder_scratch[k] = rpd.scratchpad_desc();
  }
  return out;
}

// Runs p on plain memories, reordering through the primitive's chosen layouts where they
// differ (Note [CPU convolution layouts]).
void execute(const DnnlPrimitive& p, std::unordered_map<int, dnnl::memory>& args) {
  OmpThreads threads(p.threads);  // the count it was created for (Note [CPU primitive cache])
  AlignedBuffer scratch(p.scratchpad.get_size());
  args.emplace(DNNL_ARG_SCRATCHPAD, dnnl_mem(p.scratchpad, scratch.get()));
  try {
    AlignedBuffer staged[3];
    dnnl::memory plain[3];
    // A reorder's own scratchpad (rarely any): the largest of the three.
    size_t rs = 0;
    for (int k = 0; k < 3; ++k) rs = std::max(rs, p.reorder_scratch[k].get_size());
    AlignedBuffer rscratch(rs);
    auto run_reorder = [&](int k, const dnnl::memory& from, const dnnl::memory& to) {
      std::unordered_map<int, dnnl::memory> rargs = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
      if (p.reorder_scratch[k].get_size())
        rargs.emplace(DNNL_ARG_SCRATCHPAD,
                      dnnl::memory(p.reorder_scratch[k], dnnl_engine(), rscratch.get()));
      p.reorder[k].execute(dnnl_stream(), rargs);
    };
    for (int k = 0; k < 3; ++k) {
      if (!p.arg[k] || p.impl[k] == p.md[k]) continue;
      plain[k] = args.at(p.arg[k]);
      staged[k].reset(p.impl[k].get_size());
      dnnl::memory m(p.impl[k], dnnl_engine(), staged[k].get());
      if (!p.output[k]) run_reorder(k, plain[k], m);
      args[p.arg[k]] = m;
    }
    p.prim.execute(dnnl_stream(), args);
    for (int k = 0; k < 3; ++k)
      if (plain[k] && p.output[k]) run_reorder(k, args[p.arg[k]], plain[k]);
    dnnl_stream().wait();
    if (p.threads > 1) note_team_use();  // Note [OpenMP loops] in cpu_kernels.cpp
  } catch (const dnnl::error& e) {
    bp::sdk::fail(BP_ERROR_INTERNAL,
                  bp::sdk::format("cpu:0: oneDNN convolution failed: %s (status %d)", e.what(),
                                  static_cast<int>(e.status)));
  }
}

// How the batch is split (Note [CPU convolution]): chunks of nb images, each a one-threaded
// oneDNN call on a oneTBB worker, or one call (chunks = 1) with `omp` OpenMP threads.
struct BatchPlan {
  int64_t nb, chunks;
  int omp;
  // The OpenMP threads each call runs with (its primitive is created for that many).
  int threads() const { return chunks == 1 ? omp : 1; }
};
BatchPlan batch_plan(const ConvGeom& g) {
  const int64_t workers = tbb::this_task_arena::max_concurrency();
  if (g.macs() < kSerialMacs || workers <= 1 || g.N < workers || !chunked_conv())
    return {g.N, 1, g.macs() < kSerialMacs ? 1 : static_cast<int>(workers)};
  const int64_t nb = (g.N + workers - 1) / workers;
  return {nb, (g.N + nb - 1) / nb, 1};
}

// Calls f(chunk, n0, nb) for each chunk of the plan (the chunks on oneTBB workers); f's
// primitive, made for plan.threads() OpenMP threads, runs with that many (execute).
template <class F>
void over_batch(const ConvGeom& g, const BatchPlan& plan, F&& f) {
  if (plan.chunks == 1) {
    f(int64_t{0}, int64_t{0}, g.N);
    return;
  }
  tbb::parallel_for(int64_t{0}, plan.chunks,
                    [&](int64_t c) { f(c, c * plan.nb, std::min(plan.nb, g.N - c * plan.nb)); });
}

// Elementwise conversions between a dtype and f32 scratch (parallel when large).
template <class T>
void to_f32(const T* in, float* out, int64_t n) {
  parallel_for_range(n, Cost::kCheap, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = DType<T>::load(in[i]);
  });
}
template <class T>
void from_f32(const float* in, T* out, int64_t n) {
  parallel_for_range(n, Cost::kCheap, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = DType<T>::store(in[i]);
  });
}

constexpr dt dnnl_dt(bp_dtype d) {
  return d == BP_DTYPE_BF16 ? dt::bf16 : d == BP_DTYPE_F16 ? dt::f16 : dt::f32;
}

// The cached primitive of (pass, nb) in dtype d for calls with `omp` OpenMP threads (Note [CPU
// primitive cache]); its `native` is false when oneDNN does not implement d (the caller
// converts to f32).
std::shared_ptr<const DnnlPrimitive> conv_entry(Pass pass, const ConvGeom& g, int64_t nb, int omp,
                                                dt d, bool bias) {
  return dnnl_cached(conv_key(pass, g, nb, d, bias), omp,
                     [&] { return make_conv(pass, g, nb, d, bias); });
}
std::shared_ptr<const DnnlPrimitive> conv_prim(Pass pass, const ConvGeom& g, int64_t nb, int omp,
                                               dt d, bool bias) {
  auto p = conv_entry(pass, g, nb, omp, d, bias);
  if (!p->native)
    bp::sdk::fail(BP_ERROR_INTERNAL,
                  bp::sdk::format("cpu:0: oneDNN implements [%s] for one batch size but not "
                                  "another",
                                  conv_key(pass, g, nb, d, bias).c_str()));
  return p;
}

// Whether oneDNN implements dtype d for this pass and shape (probes the first chunk's key).
bool dnnl_native(Pass pass, const ConvGeom& g, dt d, bool bias) {
  const BatchPlan plan = batch_plan(g);
  return d == dt::f32 || conv_entry(pass, g, plan.nb, plan.threads(), d, bias)->native;
}

// Forward in dtype d on raw pointers (x, w, y of d; bias f32 or NULL).
void dnnl_forward(const ConvGeom& g, dt d, const void* x, const void* w, const float* bias,
                  void* y) {
  const size_t es = d == dt::f32 ? 4 : 2;
  const BatchPlan plan = batch_plan(g);
  over_batch(g, plan, [&](int64_t, int64_t n0, int64_t nb) {
    const auto p = conv_prim(Pass::kForward, g, nb, plan.threads(), d, bias != nullptr);
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_SRC, dnnl_mem(p->md[0], static_cast<const char*>(x) + n0 * g.C * g.H * g.W * es)},
        {DNNL_ARG_WEIGHTS, dnnl_mem(p->md[1], w)},
        {DNNL_ARG_DST,
         dnnl_mem(p->md[2], static_cast<const char*>(y) + n0 * g.K * g.P * g.Q * es)}};
    if (bias) args.emplace(DNNL_ARG_BIAS, dnnl_mem(p->md[3], bias));
    execute(*p, args);
  });
}

void dnnl_backward_data(const ConvGeom& g, dt d, const void* dy, const void* w, void* dx) {
  const size_t es = d == dt::f32 ? 4 : 2;
  const BatchPlan plan = batch_plan(g);
  over_batch(g, plan, [&](int64_t, int64_t n0, int64_t nb) {
    const auto p = conv_prim(Pass::kBackwardData, g, nb, plan.threads(), d, false);
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_DIFF_SRC, dnnl_mem(p->md[0], static_cast<char*>(dx) + n0 * g.C * g.H * g.W * es)},
        {DNNL_ARG_WEIGHTS, dnnl_mem(p->md[1], w)},
        {DNNL_ARG_DIFF_DST,
         dnnl_mem(p->md[2], static_cast<const char*>(dy) + n0 * g.K * g.P * g.Q * es)}};
    execute(*p, args);
  });
}

// The weight gradient in f32 (dw32, K*C/G*R*S floats): chunks' partial sums added in order.
void dnnl_backward_weights(const ConvGeom& g, dt d, const void* x, const void* dy, float* dw32) {
  const size_t es = d == dt::f32 ? 4 : 2;
  const int64_t wn = g.K * (g.C / g.G) * g.R * g.S;
  const BatchPlan plan = batch_plan(g);
  const int64_t chunks = plan.chunks;
  AlignedBuffer partial(static_cast<size_t>((chunks - 1) * wn) * sizeof(float));
  over_batch(g, plan, [&](int64_t c, int64_t n0, int64_t nb) {
    const auto p = conv_prim(Pass::kBackwardWeights, g, nb, plan.threads(), d, false);
    float* out = c == 0 ? dw32 : partial.get<float>() + (c - 1) * wn;
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_SRC, dnnl_mem(p->md[0], static_cast<const char*>(x) + n0 * g.C * g.H * g.W * es)},
        {DNNL_ARG_DIFF_WEIGHTS, dnnl_mem(p->md[1], out)},
        {DNNL_ARG_DIFF_DST,
         dnnl_mem(p->md[2], static_cast<const char*>(dy) + n0 * g.K * g.P * g.Q * es)}};
    execute(*p, args);
  });
  if (chunks > 1)
    parallel_for_range(wn, Cost::kCheap, [&](int64_t b, int64_t e) {
      for (int64_t c = 1; c < chunks; ++c) {
        const float* src = partial.get<float>() + (c - 1) * wn;
        for (int64_t i = b; i < e; ++i) dw32[i] += src[i];
      }
    });
}

// ---- Kernels ----------------------------------------------------------------------------

template <class T>
void conv2d_kernel(const Launch& l) {
  read_conv_settings();
  if ((l.num_inputs != 2 && l.num_inputs != 3) || l.num_outputs != 1)
    launch_error(l, bp::sdk::format("expects 2 or 3 inputs (input, weight, optional bias) and 1 "
                                    "output, got %d and %d",
                                    l.num_inputs, l.num_outputs));
  const bp_tensor_desc &x = l.inputs[0], &w = l.inputs[1], &y = l.outputs[0];
  const ConvGeom g = conv_geom(l, x, w, y, "input", "weight", "output");
  const bool has_bias = l.num_inputs == 3;
  if (has_bias) {
    check_dense(l, l.inputs[2], 1, DType<T>::id, "bias");
    check_shape(l, l.inputs[2], {g.K}, "bias");
  }
  if (numel(y) == 0) return;
  const T* bias = has_bias ? data<T>(l.inputs[2]) : nullptr;
  if constexpr (std::is_same_v<T, double>) {
    check_blas_dims(l, g);
    f64_forward(g, data<T>(x), data<T>(w), bias, data<T>(y));
  } else {
    constexpr dt d = dnnl_dt(DType<T>::id);
    std::vector<float> b32;
    if (bias) {
      b32.resize(static_cast<size_t>(g.K));
      to_f32(bias, b32.data(), g.K);
    }
    const float* bp = bias ? b32.data() : nullptr;
    if (numel(x) == 0 || g.C == 0) {  // no input channels: the output is the bias
      for (int64_t nk = 0; nk < g.N * g.K; ++nk)
        for (int64_t i = 0; i < g.P * g.Q; ++i)
          data<T>(y)[nk * g.P * g.Q + i] = DType<T>::store(bp ? bp[nk % g.K] : 0.0f);
      return;
    }
    if (dnnl_native(Pass::kForward, g, d, bias != nullptr)) {
      dnnl_forward(g, d, data<T>(x), data<T>(w), bp, data<T>(y));
      return;
    }
    AlignedBuffer x32(numel(x) * 4), w32(numel(w) * 4), y32(numel(y) * 4);
    to_f32(data<T>(x), x32.get<float>(), numel(x));
    to_f32(data<T>(w), w32.get<float>(), numel(w));
    dnnl_forward(g, dt::f32, x32.get(), w32.get(), bp, y32.get());
    from_f32(y32.get<float>(), data<T>(y), numel(y));
  }
}

template <class T>
void conv2d_backward_input_kernel(const Launch& l) {
  read_conv_settings();
  check_arity(l, 2, 1);
  const bp_tensor_desc &dy = l.inputs[0], &w = l.inputs[1], &dx = l.outputs[0];
  const ConvGeom g = conv_geom(l, dx, w, dy, "dx", "weight", "dy");
  if (numel(dx) == 0) return;
  if (numel(dy) == 0) {  // no output positions or channels: nothing flows back
    parallel_memset(data<T>(dx), 0, static_cast<uint64_t>(numel(dx)) * sizeof(T));
    return;
  }
  if constexpr (std::is_same_v<T, double>) {
    check_blas_dims(l, g);
    f64_backward_input(g, data<T>(dy), data<T>(w), data<T>(dx));
  } else {
    constexpr dt d = dnnl_dt(DType<T>::id);
    if (dnnl_native(Pass::kBackwardData, g, d, false)) {
      dnnl_backward_data(g, d, data<T>(dy), data<T>(w), data<T>(dx));
      return;
    }
    AlignedBuffer dy32(numel(dy) * 4), w32(numel(w) * 4), dx32(numel(dx) * 4);
    to_f32(data<T>(dy), dy32.get<float>(), numel(dy));
    to_f32(data<T>(w), w32.get<float>(), numel(w));
    dnnl_backward_data(g, dt::f32, dy32.get(), w32.get(), dx32.get());
    from_f32(dx32.get<float>(), data<T>(dx), numel(dx));
  }
}

template <class T>
void conv2d_backward_weight_kernel(const Launch& l) {
  read_conv_settings();
  check_arity(l, 2, 1);
  const bp_tensor_desc &x = l.inputs[0], &dy = l.inputs[1], &dw = l.outputs[0];
  const ConvGeom g = conv_geom(l, x, dw, dy, "input", "dw", "dy");
  if (numel(dw) == 0) return;
  if (numel(dy) == 0 || numel(x) == 0) {  // an empty batch or output: the gradient is 0
    parallel_memset(data<T>(dw), 0, static_cast<uint64_t>(numel(dw)) * sizeof(T));
    return;
  }
  if constexpr (std::is_same_v<T, double>) {
    check_blas_dims(l, g);
    f64_backward_weight(g, data<T>(x), data<T>(dy), data<T>(dw));
  } else {
    constexpr dt d = dnnl_dt(DType<T>::id);
    const bool f32 = std::is_same_v<T, float>;
    AlignedBuffer dw32(f32 ? 0 : numel(dw) * 4);
    float* out = f32 ? reinterpret_cast<float*>(data<T>(dw)) : dw32.get<float>();
    if (dnnl_native(Pass::kBackwardWeights, g, d, false)) {
      dnnl_backward_weights(g, d, data<T>(x), data<T>(dy), out);
    } else {
      AlignedBuffer x32(numel(x) * 4), dy32(numel(dy) * 4);
      to_f32(data<T>(x), x32.get<float>(), numel(x));
      to_f32(data<T>(dy), dy32.get<float>(), numel(dy));
      dnnl_backward_weights(g, dt::f32, x32.get(), dy32.get(), out);
    }
    if (!f32) from_f32(out, data<T>(dw), numel(dw));
  }
}

}  // namespace

KernelFn conv_family(Op op, bp_dtype dtype) {
  return visit_dtype(dtype, [&]<class T>() -> KernelFn {
    if constexpr (is_floating_v<T>) {
      switch (op) {
        case Op::kConv2d:
          return &conv2d_kernel<T>;
        case Op::kConv2dBackwardInput:
          return &conv2d_backward_input_kernel<T>;
        case Op::kConv2dBackwardWeight:
          return &conv2d_backward_weight_kernel<T>;
        default:
          break;
      }
    }
    return nullptr;
  });
}

}  // namespace bp::cpu
