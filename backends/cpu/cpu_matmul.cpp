// Batched matmul through OpenBLAS: cblas_sgemm for f32 (and f16/bf16, converted to f32 and
// back), cblas_dgemm for f64.
//
// Note [CPU matmul layouts]
//   cblas is called in row-major mode. A matrix whose last dimension has unit stride is passed
//   as is (lda = its row stride); one whose second-to-last dimension has unit stride is the
//   transpose of a row-major matrix and is passed with CblasTrans. Dimensions of size 1 make
//   either reading valid, and BLAS needs a leading dimension of at least the row length, so
//   the layout is chosen per operand and anything BLAS cannot describe (a broadcast row, an
//   overlapping view) is first packed into a dense scratch matrix. A column-major output is
//   produced as the row-major product out^T = b^T a^T. Batches run one gemm per matrix.
//
// Note [One thread pool]
//   OpenBLAS's own pthreads busy-wait between calls; next to oneTBB's workers (and any other
//   load) they oversubscribe the cores, which made a 100x100 product take milliseconds. So
//   OpenBLAS runs single-threaded (set once in init) and all parallelism comes from oneTBB:
//   many small matrices are spread over the batch, and one large product is split into 2-D
//   tiles of the output, each a single-threaded gemm over the full K.
#include "cpu_kernels.hpp"
#include "cpu_types.hpp"

#include <cblas.h>
#include <tbb/blocked_range.h>
#include <tbb/blocked_range2d.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <type_traits>

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

void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, const float* a,
          int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
              1.0f, a, static_cast<int>(lda), b, static_cast<int>(ldb), 0.0f, c,
              static_cast<int>(ldc));
}
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, const double* a,
          int64_t lda, const double* b, int64_t ldb, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
              1.0, a, static_cast<int>(lda), b, static_cast<int>(ldb), 0.0, c,
              static_cast<int>(ldc));
}

// Computes out = a * b for one batch element. C is the BLAS type (float or double); T the
// storage type. When T != C the operands are converted into scratch and the result back.
template <class T>
void matmul_one(const Mat<T>& a, const Mat<T>& b, T* out, int64_t ors, int64_t ocs) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const int64_t M = a.rows, K = a.cols, N = b.cols;
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
  if (direct && (ocs == 1 || N == 1) && (M == 1 || ors >= std::max<int64_t>(N, 1))) {
    gemm(va.trans, vb.trans, M, N, K, pa, va.ld, pb, vb.ld, reinterpret_cast<C*>(out),
         M == 1 ? std::max<int64_t>(N, 1) : ors);
    return;
  }
  if (direct && (ors == 1 || M == 1) && (N == 1 || ocs >= std::max<int64_t>(M, 1))) {
    // out^T (N x M, row-major with ld ocs) = b^T a^T.
    const CBLAS_TRANSPOSE tb = vb.trans == CblasNoTrans ? CblasTrans : CblasNoTrans;
    const CBLAS_TRANSPOSE ta = va.trans == CblasNoTrans ? CblasTrans : CblasNoTrans;
    gemm(tb, ta, N, M, K, pb, vb.ld, pa, va.ld, reinterpret_cast<C*>(out),
         N == 1 ? std::max<int64_t>(M, 1) : ocs);
    return;
  }
  C* c = sc.get(M * N);
  gemm(va.trans, vb.trans, M, N, K, pa, va.ld, pb, vb.ld, c, std::max<int64_t>(N, 1));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) out[i * ors + j * ocs] = DType<T>::store(c[i * N + j]);
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
  if (B == 0 || M == 0 || N == 0) return;
  T* po = data<T>(out);
  if (K == 0) {  // an empty sum: zeros
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j)
          po[bi * out.strides[0] + i * out.strides[1] + j * out.strides[2]] = DType<T>::store(0);
    return;
  }
  const int64_t limit = INT_MAX;
  const int64_t biggest = std::max({M, N, K, a.strides[1], a.strides[2], b.strides[1], b.strides[2],
                                    out.strides[1], out.strides[2]});
  if (biggest > limit)
    bp::sdk::fail(
        BP_ERROR_UNSUPPORTED,
        bp::sdk::format("cpu:0: matmul(%s): a dimension or stride exceeds the 32-bit "
                        "BLAS interface: a %s, b %s",
                        bp_dtype_name(l.kernel.dtype), describe(a).c_str(), describe(b).c_str()));
  const T* pa = data<const T>(a);
  const T* pb = data<const T>(b);
  const int64_t ors = out.strides[1], ocs = out.strides[2];
  auto one = [&](int64_t bi) {
    const Mat<T> ma{pa + bi * a.strides[0], M, K, a.strides[1], a.strides[2]};
    const Mat<T> mb{pb + bi * b.strides[0], K, N, b.strides[1], b.strides[2]};
    T* o = po + bi * out.strides[0];
    // Note [One thread pool]: split a large product into 2-D tiles of the output, each a
    // single-threaded gemm over the full K. Tiles stay at least 128 on a side so that the
    // operand packing each gemm does is small next to its arithmetic.
    constexpr int64_t kSerialFlops = 64 * 64 * 64, kMinTile = 128;
    const int64_t workers = std::max(1, tbb::this_task_arena::max_concurrency());
    int64_t tm = M, tn = N;
    auto tiles = [&] { return ((M + tm - 1) / tm) * ((N + tn - 1) / tn); };
    while (tiles() < workers && std::max(tm, tn) >= 2 * kMinTile) {
      if (tm >= tn)
        tm = (tm + 1) / 2;
      else
        tn = (tn + 1) / 2;
    }
    if (M * N * K <= kSerialFlops || tiles() == 1) {
      matmul_one(ma, mb, o, ors, ocs);
      return;
    }
    tbb::parallel_for(tbb::blocked_range2d<int64_t>(0, M, tm, 0, N, tn), [&](const tbb::
                                                                                 blocked_range2d<
                                                                                     int64_t>& r) {
      const int64_t i0 = r.rows().begin(), j0 = r.cols().begin();
      const Mat<T> rows{ma.p + i0 * ma.rs, static_cast<int64_t>(r.rows().size()), K, ma.rs, ma.cs};
      const Mat<T> cols{mb.p + j0 * mb.cs, K, static_cast<int64_t>(r.cols().size()), mb.rs, mb.cs};
      matmul_one(rows, cols, o + i0 * ors + j0 * ocs, ors, ocs);
    });
  };
  if (B > 1 && M * N * K <= 64 * 64 * 64) {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, B), [&](const tbb::blocked_range<int64_t>& r) {
      for (int64_t bi = r.begin(); bi < r.end(); ++bi) one(bi);
    });
  } else {
    for (int64_t bi = 0; bi < B; ++bi) one(bi);
  }
}

}  // namespace

void configure_blas_threads() {
  openblas_set_num_threads(1);
}

KernelFn matmul_family(Op op, bp_dtype dtype) {
  if (op != Op::kMatmul) return nullptr;
  return visit_dtype(dtype, [&]<class T>() -> KernelFn {
    if constexpr (is_floating_v<T>) {
      return &matmul_kernel<T>;
    } else {
      return nullptr;
    }
  });
}

}  // namespace bp::cpu
