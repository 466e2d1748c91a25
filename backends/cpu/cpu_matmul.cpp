// Batched matmul: f32 through oneDNN's dnnl_sgemm, bf16 through oneDNN's matmul primitive (Note
// [CPU bf16 products]; f16 converted to f32 and back), f64 through OpenBLAS's cblas_dgemm.
// README.md, "Choosing the matrix-product library", has the measurement that chose oneDNN.
//
// Note [CPU matmul layouts]
//   Both libraries are called in row-major mode. A matrix whose last dimension has unit stride
//   is passed as is (lda = its row stride); one whose second-to-last dimension has unit stride
//   is the transpose of a row-major matrix and is passed transposed ('T'), so x @ w^T of
//   nn::Linear and every transposed view are read where they lie. Dimensions of size 1 make
//   either reading valid, and the libraries need a leading dimension of at least the row
//   length, so the layout is chosen per operand and anything they cannot describe (a broadcast
//   row, an overlapping view) is first packed into a dense scratch matrix. A column-major output
//   is produced as the row-major product out^T = b^T a^T.
//
// Note [One thread pool]
//   Debian's oneDNN threads with OpenMP and OpenBLAS with its own pthreads; either pool
//   busy-waits after a call, and next to oneTBB's workers (or a second thread issuing products)
//   they oversubscribe the cores: a 100x100 product then took milliseconds. So by default the
//   libraries run one-threaded (OpenMP's thread count is set to 1 around each call on the
//   calling thread and restored after) and all parallelism comes from oneTBB: the products of
//   a batch and 2-D tiles of each output (about four per worker, at least 128 a side, each a
//   one-threaded gemm over the full K) are spread over oneTBB's workers in one parallel loop,
//   and two host threads issuing products at once share those workers.
//   BACKPLANE_CPU_MATMUL_THREADS=openmp (read at init) instead runs each large f32 product as
//   one oneDNN call with an OpenMP team; concurrent callers share the hardware threads through
//   a counter, so together they never ask for more. tools/gpu/cpu_speed.sh measures both.
#include "cpu_dnnl_cache.hpp"
#include "cpu_kernels.hpp"
#include "cpu_types.hpp"

#include <cblas.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>

namespace bp::cpu {
namespace {

// A strided matrix view: element (i, j) at p[i * rs + j * cs].
template <class T>
struct Mat {
  const T* p;
  int64_t rows, cols, rs, cs;
};

// The matrix as cblas sees it: trans flag and leading dimension, or !ok when it must be packed.
struct BlasView {
  bool ok = false;
  CBLAS_TRANSPOSE trans = CblasNoTrans;
  int64_t ld = 0;
};

template <class T>
BlasView blas_view(const Mat<T>& m) {
  BlasView v;
  const int64_t need_rows = std::max<int64_t>(m.cols, 1);  // ld for a row-major reading
  const int64_t need_cols = std::max<int64_t>(m.rows, 1);  // ld for a transposed reading
  if (m.cs == 1 || m.cols == 1) {
    const int64_t ld = m.rows == 1 ? need_rows : m.rs;
    if (ld >= need_rows) return {true, CblasNoTrans, ld};
  }
  if (m.rs == 1 || m.rows == 1) {
    const int64_t ld = m.cols == 1 ? need_cols : m.cs;
    if (ld >= need_cols) return {true, CblasTrans, ld};
  }
  return v;
}

// Scratch storage of a packed or converted f32/f64 matrix; freed on scope exit.
template <class C>
struct Scratch {
  std::unique_ptr<C[]> data;
  C* get(int64_t n) {
    if (!data) data.reset(new C[static_cast<size_t>(std::max<int64_t>(n, 1))]);
    return data.get();
  }
};

// Writes m (any strides, any storage type) as a dense row-major C matrix into dst.
template <class C, class T>
void pack(const Mat<T>& m, C* dst) {
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t j = 0; j < m.cols; ++j)
      dst[i * m.cols + j] = static_cast<C>(DType<T>::load(m.p[i * m.rs + j * m.cs]));
}

// Note [One thread pool]: how many OpenMP threads oneDNN may use for the current call.
thread_local int t_omp_threads = 1;
bool g_openmp_mode = false;
// Output tiles per oneTBB worker a large product is cut into (Note [One thread pool]): on the
// 16-core host, 4 gave 1.18x / 1.21x PyTorch's f32 1024^3 / 2048^3 against 0.98x / 0.79x with
// 1 (one tile per worker leaves every worker waiting for the slowest; medians of 5,
// backends/cpu/README.md). BACKPLANE_CPU_MATMUL_TILES (1..16, read at init) overrides it.
int g_tiles_per_worker = 4;
// Hardware threads not lent to a running oneDNN call (openmp mode only).
std::atomic<int> g_free_threads{1};

void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, const float* a,
          int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc) {
  OmpThreads threads(t_omp_threads);
  const dnnl_status_t st = dnnl_sgemm(ta == CblasTrans ? 'T' : 'N', tb == CblasTrans ? 'T' : 'N', m,
                                      n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
  if (st != dnnl_success)
    bp::sdk::fail(BP_ERROR_INTERNAL,
                  bp::sdk::format("cpu:0: matmul(f32): dnnl_sgemm(%lld x %lld x %lld) failed with "
                                  "oneDNN status %d",
                                  static_cast<long long>(m), static_cast<long long>(n),
                                  static_cast<long long>(k), static_cast<int>(st)));
}
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, const double* a,
          int64_t lda, const double* b, int64_t ldb, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
              1.0, a, static_cast<int>(lda), b, static_cast<int>(ldb), 0.0, c,
              static_cast<int>(ldc));
}

// The epilogue of a product: nothing for matmul; bias and activation for linear (Note [CPU
// linear]). apply(j, v) gets output column j (of the whole product) and the value in C.
struct NoEpilogue {
  static constexpr bool kActive = false;
  template <class C>
  C apply(int64_t, C v) const {
    return v;
  }
};

template <class T>
struct LinearEpilogue {
  static constexpr bool kActive = true;
  const T* bias;  // nullptr: none
  int64_t bias_stride;
  bool relu;
  template <class C>
  C apply(int64_t j, C v) const {
    if (bias) v += static_cast<C>(DType<T>::load(bias[j * bias_stride]));
    if (relu) v = v > C(0) ? v : (v != v ? v : C(0));  // relu keeps NaN (Note [Conversions])
    return v;
  }
};

// Note [CPU bf16 products]
//   A bf16 product (matmul, linear, their backward) is one oneDNN matmul primitive over the
//   operands where they lie: bf16 inputs with their strides, f32 accumulation, the bias added
//   in f32 and the result rounded once to bf16, with ReLU as a post-op. On a CPU with AVX512-BF16
//   or AMX its kernels multiply bf16 directly (vdpbf16ps, tiles); before, both operands were
//   converted to f32 scratch and multiplied by sgemm, so bf16 ran slower than f32 while
//   PyTorch's autocast ran faster. Primitives are cached per tile shape, strides and epilogue
//   (Note [CPU primitive cache]) and built for one OpenMP thread (the tiles already run on
//   oneTBB's workers, Note [One thread pool]). Where oneDNN has only its reference kernel for
//   bf16 (a CPU without AVX-512 BF16) the primitive counts as missing and the f32 route runs;
//   BACKPLANE_CPU_BF16_MATMUL=f32 (read at init) always takes that route.
bool g_bf16_primitive = true;

// out = ep(a b) for one tile through the cached bf16 matmul primitive; false when there is none
// for it (the caller then takes the f32 route). A failed or reference-only build is cached as not
// native, so it is tried once per key.
template <class Ep>
bool bf16_product(const Mat<bf16>& a, const Mat<bf16>& b, bf16* out, int64_t ors, int64_t ocs,
                  const Ep& ep, int64_t j0) {
  using dnnl::memory;
  const int64_t M = a.rows, K = a.cols, N = b.cols;
  const bf16* bias = nullptr;
  bool relu = false;
  if constexpr (Ep::kActive) {
    // oneDNN 2.6's matmul gave wrong sums for a bias with a stride (conformance's
    // linear_strided_bias): the f32 route takes those.
    if (ep.bias && ep.bias_stride != 1 && N > 1) return false;
    bias = ep.bias ? ep.bias + j0 * ep.bias_stride : nullptr;
    relu = ep.relu;
  }
  // Strides of size-1 dimensions do not matter: 1 for oneDNN (0 is a broadcast to it).
  auto st = [](int64_t size, int64_t stride) { return size == 1 ? int64_t{1} : stride; };
  const memory::dims sa{st(M, a.rs), st(K, a.cs)}, sb{st(K, b.rs), st(N, b.cs)},
      so{st(M, ors), st(N, ocs)};
  auto ll = [](int64_t v) { return static_cast<long long>(v); };
  const std::string key =
      bp::sdk::format("matmul bf16 %lldx%lldx%lld a%lld,%lld b%lld,%lld o%lld,%lld bias%d relu%d",
                      ll(M), ll(N), ll(K), ll(sa[0]), ll(sa[1]), ll(sb[0]), ll(sb[1]), ll(so[0]),
                      ll(so[1]), bias ? 1 : 0, relu ? 1 : 0);
  auto p = dnnl_cached(key, 1, [&] {
    DnnlPrimitive out_p;
    const memory::desc src({M, K}, memory::data_type::bf16, sa),
        wei({K, N}, memory::data_type::bf16, sb), dst({M, N}, memory::data_type::bf16, so),
        bmd({1, N}, memory::data_type::bf16, memory::format_tag::ab);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (relu) {
      dnnl::post_ops po;
      po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
      attr.set_post_ops(po);
    }
    try {
      const dnnl::matmul::desc d =
          bias ? dnnl::matmul::desc(src, wei, bmd, dst) : dnnl::matmul::desc(src, wei, dst);
      const dnnl::matmul::primitive_desc pd(d, attr, dnnl_engine());
      if (is_reference(pd.impl_info_str())) {
        out_p.native = false;
        return out_p;
      }
      out_p.prim = dnnl::matmul(pd);
      out_p.md[0] = src;
      out_p.md[1] = wei;
      out_p.md[2] = dst;
      out_p.md[3] = bmd;
      out_p.scratchpad = pd.scratchpad_desc();
    } catch (const dnnl::error&) {
      out_p.native = false;
    }
    return out_p;
  });
  if (!p->native) return false;
  std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, dnnl_mem(p->md[0], a.p)},
                                          {DNNL_ARG_WEIGHTS, dnnl_mem(p->md[1], b.p)},
                                          {DNNL_ARG_DST, dnnl_mem(p->md[2], out)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, dnnl_mem(p->md[3], bias));
  try {
    dnnl_run(*p, args);
  } catch (const dnnl::error& e) {
    bp::sdk::fail(BP_ERROR_INTERNAL,
                  bp::sdk::format("cpu:0: matmul(bf16): oneDNN's matmul (%lld x %lld x %lld) "
                                  "failed: %s",
                                  static_cast<long long>(M), static_cast<long long>(N),
                                  static_cast<long long>(K), e.what()));
  }
  return true;
}

// Computes out = ep(a * b) for one batch element (a tile of it: output columns start at j0 of
// the whole product). C is the BLAS type (float or double); T the storage type. When T != C
// the operands are converted into scratch and the result back, the epilogue applied in C
// before the one rounding.
template <class T, class Ep = NoEpilogue>
void matmul_one(const Mat<T>& a, const Mat<T>& b, T* out, int64_t ors, int64_t ocs,
                const Ep& ep = {}, int64_t j0 = 0) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const int64_t M = a.rows, K = a.cols, N = b.cols;
  if constexpr (std::is_same_v<T, bf16>) {
    if (g_bf16_primitive && bf16_product(a, b, out, ors, ocs, ep, j0)) return;
  }
  Scratch<C> sa, sb, sc;
  const C* pa;
  const C* pb;
  BlasView va = std::is_same_v<T, C> ? blas_view(a) : BlasView{};
  BlasView vb = std::is_same_v<T, C> ? blas_view(b) : BlasView{};
  if (va.ok) {
    pa = reinterpret_cast<const C*>(a.p);
  } else {
    C* d = sa.get(M * K);
    pack<C>(a, d);
    pa = d;
    va = {true, CblasNoTrans, std::max<int64_t>(K, 1)};
  }
  if (vb.ok) {
    pb = reinterpret_cast<const C*>(b.p);
  } else {
    C* d = sb.get(K * N);
    pack<C>(b, d);
    pb = d;
    vb = {true, CblasNoTrans, std::max<int64_t>(N, 1)};
  }
  // The output: row-major (ocs == 1), column-major (ors == 1, computed transposed), or dense
  // scratch copied out afterwards.
  const bool direct = std::is_same_v<T, C>;
  // The epilogue on a tile the gemm just wrote in place (still in cache).
  auto finish_in_place = [&] {
    if constexpr (Ep::kActive && std::is_same_v<T, C>) {
      for (int64_t i = 0; i < M; ++i) {
        T* row = out + i * ors;
        for (int64_t j = 0; j < N; ++j) row[j * ocs] = ep.apply(j0 + j, row[j * ocs]);
      }
    }
  };
  if (direct && (ocs == 1 || N == 1) && (M == 1 || ors >= std::max<int64_t>(N, 1))) {
    gemm(va.trans, vb.trans, M, N, K, pa, va.ld, pb, vb.ld, reinterpret_cast<C*>(out),
         M == 1 ? std::max<int64_t>(N, 1) : ors);
    finish_in_place();
    return;
  }
  if (direct && (ors == 1 || M == 1) && (N == 1 || ocs >= std::max<int64_t>(M, 1))) {
    // out^T (N x M, row-major with ld ocs) = b^T a^T.
    const CBLAS_TRANSPOSE tb = vb.trans == CblasNoTrans ? CblasTrans : CblasNoTrans;
    const CBLAS_TRANSPOSE ta = va.trans == CblasNoTrans ? CblasTrans : CblasNoTrans;
    gemm(tb, ta, N, M, K, pb, vb.ld, pa, va.ld, reinterpret_cast<C*>(out),
         N == 1 ? std::max<int64_t>(M, 1) : ocs);
    finish_in_place();
    return;
  }
  C* c = sc.get(M * N);
  gemm(va.trans, vb.trans, M, N, K, pa, va.ld, pb, vb.ld, c, std::max<int64_t>(N, 1));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      out[i * ors + j * ocs] = DType<T>::store(ep.apply(j0 + j, c[i * N + j]));
}

// A batch of operands as products() reads them: element (batch, i, j) at
// p[batch * s[0] + i * s[1] + j * s[2]].
template <class T>
struct Operand {
  T* p;
  int64_t s[3];
};

// out[bi] = ep(a[bi] b[bi]) for bi < B, with a [B,M,K], b [B,K,N], out [B,M,N]: the tiling and
// threading of Note [One thread pool], shared by matmul and linear.
template <class T, class Ep>
void products(const Launch& l, Operand<const T> a, Operand<const T> b, Operand<T> out, int64_t B,
              int64_t M, int64_t N, int64_t K, const Ep& ep) {
  if (B == 0 || M == 0 || N == 0) return;
  T* po = out.p;
  if (K == 0) {  // an empty sum: zeros (then the epilogue)
    using C = compute_t<T>;
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j)
          po[bi * out.s[0] + i * out.s[1] + j * out.s[2]] = DType<T>::store(ep.apply(j, C(0)));
    return;
  }
  const int64_t limit = INT_MAX;
  const int64_t biggest = std::max({M, N, K, a.s[1], a.s[2], b.s[1], b.s[2], out.s[1], out.s[2]});
  if (biggest > limit)
    bp::sdk::fail(BP_ERROR_UNSUPPORTED,
                  bp::sdk::format("cpu:0: %s(%s): a dimension or stride exceeds the 32-bit "
                                  "BLAS interface (M %lld, N %lld, K %lld)",
                                  op_name(l.kernel.op), bp_dtype_name(l.kernel.dtype),
                                  static_cast<long long>(M), static_cast<long long>(N),
                                  static_cast<long long>(K)));
  const T* pa = a.p;
  const T* pb = b.p;
  const int64_t ors = out.s[1], ocs = out.s[2];
  auto product = [&](int64_t bi, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    const Mat<T> ma{pa + bi * a.s[0] + i0 * a.s[1], i1 - i0, K, a.s[1], a.s[2]};
    const Mat<T> mb{pb + bi * b.s[0] + j0 * b.s[2], K, j1 - j0, b.s[1], b.s[2]};
    matmul_one(ma, mb, po + bi * out.s[0] + i0 * ors + j0 * ocs, ors, ocs, ep, j0);
  };
  // Note [One thread pool].
  constexpr int64_t kSerialFlops = 64 * 64 * 64, kMinTile = 128;
  const int workers = std::max(1, tbb::this_task_arena::max_concurrency());
  if (g_openmp_mode && std::is_same_v<T, float> && M * N * K > kSerialFlops && workers > 1) {
    // One oneDNN call per product with an OpenMP team of the threads no other call holds,
    // given back (and the thread count reset) however the calls end.
    struct Lease {
      int got = g_free_threads.load();
      Lease() {
        while (got > 0 && !g_free_threads.compare_exchange_weak(got, 0)) {
        }
        t_omp_threads = std::max(got, 1);
      }
      ~Lease() {
        t_omp_threads = 1;
        g_free_threads.fetch_add(std::max(got, 0));
      }
    } lease;
    for (int64_t bi = 0; bi < B; ++bi) product(bi, 0, M, 0, N);
    return;
  }
  int64_t tm = M, tn = N;
  auto tiles = [&] { return B * ((M + tm - 1) / tm) * ((N + tn - 1) / tn); };
  while (tiles() < int64_t{workers} * g_tiles_per_worker && std::max(tm, tn) >= 2 * kMinTile) {
    if (tm >= tn)
      tm = (tm + 1) / 2;
    else
      tn = (tn + 1) / 2;
  }
  const int64_t mt = (M + tm - 1) / tm, nt = (N + tn - 1) / tn;
  auto task = [&](int64_t t) {
    const int64_t bi = t / (mt * nt), i = t / nt % mt, j = t % nt;
    product(bi, i * tm, std::min(M, (i + 1) * tm), j * tn, std::min(N, (j + 1) * tn));
  };
  if (B * M * N * K <= kSerialFlops || tiles() == 1) {
    for (int64_t t = 0; t < tiles(); ++t) task(t);
    return;
  }
  // Small products of a batch: several per task.
  const size_t grain = static_cast<size_t>(std::max<int64_t>(1, kSerialFlops / (tm * tn * K)));
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, tiles(), grain),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      for (int64_t t = r.begin(); t < r.end(); ++t) task(t);
                    });
}

template <class T>
void matmul_kernel(const Launch& l) {
  check_arity(l, 2, 1);
  const bp_tensor_desc &a = l.inputs[0], &b = l.inputs[1], &out = l.outputs[0];
  check_dtype(l, a, DType<T>::id, "input 0");
  check_dtype(l, b, DType<T>::id, "input 1");
  check_dtype(l, out, DType<T>::id, "output");
  if (a.rank != 3 || b.rank != 3 || out.rank != 3)
    launch_error(l,
                 bp::sdk::format("expects rank-3 operands a[B,M,K] b[B,K,N] out[B,M,N]; got "
                                 "a %s, b %s, out %s",
                                 describe(a).c_str(), describe(b).c_str(), describe(out).c_str()));
  const int64_t B = out.shape[0], M = out.shape[1], N = out.shape[2], K = a.shape[2];
  if (a.shape[0] != B || b.shape[0] != B || a.shape[1] != M || b.shape[1] != K || b.shape[2] != N)
    launch_error(l,
                 bp::sdk::format("shapes do not multiply: a %s, b %s, out %s", describe(a).c_str(),
                                 describe(b).c_str(), describe(out).c_str()));
  products<T>(l, {data<const T>(a), {a.strides[0], a.strides[1], a.strides[2]}},
              {data<const T>(b), {b.strides[0], b.strides[1], b.strides[2]}},
              {data<T>(out), {out.strides[0], out.strides[1], out.strides[2]}}, B, M, N, K,
              NoEpilogue{});
}

// Note [CPU linear]
//   linear is the product x w^T read where the operands lie (w [N,K] is passed to the gemm
//   transposed, Note [CPU matmul layouts]) with the bias and ReLU applied to each output tile
//   right after its gemm, while the tile is still in cache: one pass over the output instead
//   of the three of matmul, add and relu. f16/bf16 apply them in f32 before the one rounding.
template <class T>
void linear_kernel(const Launch& l) {
  if (l.num_inputs != 2 && l.num_inputs != 3)
    launch_error(l, bp::sdk::format("expects inputs x, w and an optional bias; got %d inputs",
                                    static_cast<int>(l.num_inputs)));
  check_arity(l, l.num_inputs, 1);
  const bp_tensor_desc &x = l.inputs[0], &w = l.inputs[1], &out = l.outputs[0];
  const bp_tensor_desc* bias = l.num_inputs == 3 ? &l.inputs[2] : nullptr;
  check_dtype(l, x, DType<T>::id, "input 0");
  check_dtype(l, w, DType<T>::id, "input 1");
  if (bias) check_dtype(l, *bias, DType<T>::id, "input 2 (bias)");
  check_dtype(l, out, DType<T>::id, "output");
  if (x.rank != 2 || w.rank != 2 || out.rank != 2 || (bias && bias->rank != 1))
    launch_error(l, bp::sdk::format("expects x[M,K], w[N,K], bias[N], out[M,N]; got x %s, w %s, "
                                    "out %s%s%s",
                                    describe(x).c_str(), describe(w).c_str(), describe(out).c_str(),
                                    bias ? ", bias " : "", bias ? describe(*bias).c_str() : ""));
  const int64_t M = out.shape[0], N = out.shape[1], K = x.shape[1];
  if (x.shape[0] != M || w.shape[0] != N || w.shape[1] != K || (bias && bias->shape[0] != N))
    launch_error(l, bp::sdk::format("shapes do not match: x %s, w %s, out %s%s%s",
                                    describe(x).c_str(), describe(w).c_str(), describe(out).c_str(),
                                    bias ? ", bias " : "", bias ? describe(*bias).c_str() : ""));
  const int64_t act = l.attrs.i(BP_ATTR_ID_ACTIVATION, BP_ACTIVATION_NONE);
  if (act != BP_ACTIVATION_NONE && act != BP_ACTIVATION_RELU)
    launch_error(l, bp::sdk::format("activation %lld is not 0 (none) or 1 (relu)",
                                    static_cast<long long>(act)));
  const LinearEpilogue<T> ep{bias ? data<const T>(*bias) : nullptr, bias ? bias->strides[0] : 0,
                             act == BP_ACTIVATION_RELU};
  // b[k, n] = w[n, k]
  products<T>(l, {data<const T>(x), {0, x.strides[0], x.strides[1]}},
              {data<const T>(w), {0, w.strides[1], w.strides[0]}},
              {data<T>(out), {0, out.strides[0], out.strides[1]}}, 1, M, N, K, ep);
}

}  // namespace

void configure_matmul() {
  openblas_set_num_threads(1);
  g_openmp_mode = env_switch("BACKPLANE_CPU_MATMUL_THREADS", "tbb", "openmp");
  g_bf16_primitive = !env_switch("BACKPLANE_CPU_BF16_MATMUL", "onednn", "f32");
  if (const char* t = std::getenv("BACKPLANE_CPU_MATMUL_TILES"); t && *t) {
    char* end = nullptr;
    const long v = std::strtol(t, &end, 10);
    if (*end != '\0' || v < 1 || v > 16)
      bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                    bp::sdk::format("cpu: BACKPLANE_CPU_MATMUL_TILES='%s' is not a whole number "
                                    "of output tiles per worker in 1..16",
                                    t));
    g_tiles_per_worker = static_cast<int>(v);
  }
  g_free_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

KernelFn matmul_family(Op op, bp_dtype dtype) {
  if (op != Op::kMatmul && op != Op::kLinear) return nullptr;
  return visit_dtype(dtype, [&]<class T>() -> KernelFn {
    if constexpr (is_floating_v<T>) {
      return op == Op::kLinear ? &linear_kernel<T> : &matmul_kernel<T>;
    } else {
      return nullptr;
    }
  });
}

}  // namespace bp::cpu
