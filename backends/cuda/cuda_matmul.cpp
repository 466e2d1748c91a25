// matmul through cuBLAS: a[B,M,K] x b[B,K,N] -> out[B,M,N] for f32, f64, f16 and bf16; linear
// (x w^T + bias, ReLU) through cuBLASLt with its epilogue (Note [CUDA linear]).
//
// Note [Row-major GEMM]
//   cuBLAS is column-major. A row-major matrix X[R][C] with leading dimension L is, read
//   column-major, the matrix X^T (C x R) with the same L. So out = a b is computed as
//   out^T = b^T a^T: cuBLAS's A operand is b, its B operand is a, m = N, n = M, k = K, and the
//   result lands row-major in out. An operand stored column-major (unit stride in its
//   second-to-last dim, i.e. a transposed view) is its own column-major matrix, so it gets
//   CUBLAS_OP_T instead of CUBLAS_OP_N. Batch strides go to the strided-batched call as they
//   are, 0 included (a broadcast operand).
//
// Note [cuBLAS per stream]
//   One cuBLAS handle per device, used under the device's cublas_mutex: each launch sets the
//   stream and that stream's own workspace (cublasSetStream resets the workspace to the
//   handle's default, which would otherwise be shared by concurrent GEMMs on different
//   streams). The workspace is allocated from the pool on the first matmul of a stream, under
//   the same lock: several threads may make their first matmul on one stream at once (Note
//   [Stream threading] in plugin_abi.h), and a check-then-set outside the lock let each of
//   them allocate a workspace and all but one leak. It is freed when the stream is destroyed.
//
// f32 uses CUBLAS_COMPUTE_32F (full fp32) unless attr "allow_tf32" is 1
// (CUBLAS_COMPUTE_32F_FAST_TF32); f16/bf16 accumulate in fp32 (CUBLAS_COMPUTE_32F); f64 in
// fp64. K == 0 writes zeros.
#include "cuda_blas.hpp"
#include "cuda_common.hpp"
#include "cuda_device.hpp"
#include "cuda_kernels.hpp"

#include <algorithm>
#include <climits>

namespace bp::cuda {

void throw_cublas_error(int status, const char* expr, const char* file, int line) {
  const auto st = static_cast<cublasStatus_t>(status);
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    device = -1;
  }
  forget_current_device();
  const bp_error_code code = st == CUBLAS_STATUS_ALLOC_FAILED      ? BP_ERROR_OUT_OF_MEMORY
                             : st == CUBLAS_STATUS_NOT_SUPPORTED   ? BP_ERROR_UNSUPPORTED
                             : st == CUBLAS_STATUS_INVALID_VALUE   ? BP_ERROR_INVALID_ARGUMENT
                             : st == CUBLAS_STATUS_NOT_INITIALIZED ? BP_ERROR_UNAVAILABLE
                                                                   : BP_ERROR_DEVICE;
  bp::sdk::fail(code,
                bp::sdk::format("cuda:%d: %s failed: %s (%s) at %s:%d", device, expr,
                                blas().status_name(st), blas().status_string(st), file, line),
                blas().status_name(st));
}

void* Device::cublas_handle() {
  std::call_once(cublas_once_, [&] {
    use_device(index());
    cublasHandle_t h = nullptr;
    BP_CUBLAS_CHECK(blas().create(&h));
    cublas_ = h;
  });
  return cublas_;
}

void Device::destroy_cublas() {
  if (cublas_) (void)blas().destroy(static_cast<cublasHandle_t>(cublas_));
  cublas_ = nullptr;
}

namespace {

// How one operand (math shape R x C, strides sr, sc) is passed to cuBLAS (Note [Row-major
// GEMM]): op N with ld = row stride for row-major storage, op T with ld = column stride for
// column-major storage. ok == false when neither applies.
struct Operand {
  bool ok = false;
  cublasOperation_t op = CUBLAS_OP_N;
  int64_t ld = 1;
};

Operand operand(int64_t R, int64_t C, int64_t sr, int64_t sc) {
  Operand o;
  if ((C == 1 || sc == 1) && (R == 1 || sr >= std::max<int64_t>(C, 1))) {
    o.ok = true;
    o.op = CUBLAS_OP_N;
    o.ld = R == 1 ? std::max<int64_t>(C, 1) : sr;
  } else if ((R == 1 || sr == 1) && (C == 1 || sc >= std::max<int64_t>(R, 1))) {
    o.ok = true;
    o.op = CUBLAS_OP_T;
    o.ld = C == 1 ? std::max<int64_t>(R, 1) : sc;
  }
  return o;
}

template <int D>
struct GemmTypes;
template <>
struct GemmTypes<BP_DTYPE_F32> {
  using Scale = float;
  static constexpr cudaDataType_t kType = CUDA_R_32F;
};
template <>
struct GemmTypes<BP_DTYPE_F64> {
  using Scale = double;
  static constexpr cudaDataType_t kType = CUDA_R_64F;
};
template <>
struct GemmTypes<BP_DTYPE_F16> {
  using Scale = float;
  static constexpr cudaDataType_t kType = CUDA_R_16F;
};
template <>
struct GemmTypes<BP_DTYPE_BF16> {
  using Scale = float;
  static constexpr cudaDataType_t kType = CUDA_R_16BF;
};

// Bytes of the per-stream workspace: what cuBLAS recommends for Hopper, else 4 MiB.
size_t workspace_bytes(const Device& d) {
  return d.info().compute_major >= 9 ? (size_t{32} << 20) : (size_t{4} << 20);
}

// The compute type of a product of dtype D (attribute ALLOW_TF32 for f32).
template <int D>
cublasComputeType_t compute_type(const LaunchArgs& a) {
  if constexpr (D == BP_DTYPE_F64) {
    return CUBLAS_COMPUTE_64F;
  } else if constexpr (D == BP_DTYPE_F32) {
    if (a.attrs->i(BP_ATTR_ID_ALLOW_TF32, 0) != 0) return CUBLAS_COMPUTE_32F_FAST_TF32;
  }
  return CUBLAS_COMPUTE_32F;
}

}  // namespace

void Device::prepare_capture(CudaStream& s) {
  cublas_handle();
  std::lock_guard<std::mutex> lock(cublas_mutex_);
  if (!s.cublas_workspace) {  // Note [cuBLAS per stream]
    const size_t bytes = workspace_bytes(*this);
    s.cublas_workspace = allocate_scratch(s, bytes);
    s.cublas_workspace_bytes = bytes;
  }
}

cublasHandle_t bind_cublas_stream(const LaunchArgs& a) {
  Device& dev = *a.device;
  cublasHandle_t h = static_cast<cublasHandle_t>(dev.cublas_handle());
  CudaStream& s = *a.s;
  if (!s.cublas_workspace) {  // Note [cuBLAS per stream]: set up under the lock
    const size_t bytes = workspace_bytes(dev);
    s.cublas_workspace = dev.allocate_scratch(s, bytes);
    s.cublas_workspace_bytes = bytes;
  }
  BP_CUBLAS_CHECK(blas().set_stream(h, a.stream));
  BP_CUBLAS_CHECK(blas().set_workspace(h, s.cublas_workspace, s.cublas_workspace_bytes));
  return h;
}

namespace {

// One row-major product per batch element (Note [Row-major GEMM]): out = a b with a [M,K] (oa),
// b [K,N] (ob), out [M,N] (oc, row-major); sa, sb, so batch strides.
template <int D>
void gemm(const LaunchArgs& a, const Operand& oa, const Operand& ob, const Operand& oc, int64_t M,
          int64_t N, int64_t K, int64_t batch, long long sa, long long sb, long long so,
          const void* pa, const void* pb, void* po) {
  using Scale = typename GemmTypes<D>::Scale;
  const cublasComputeType_t compute = compute_type<D>(a);
  const Scale alpha = 1, beta = 0;
  constexpr cudaDataType_t type = GemmTypes<D>::kType;
  std::lock_guard<std::mutex> lock(a.device->cublas_mutex());
  cublasHandle_t h = bind_cublas_stream(a);
  const bool fits = std::max({M, N, K, ob.ld, oa.ld, oc.ld, batch}) <= INT_MAX;
  if (fits) {
    BP_CUBLAS_CHECK(blas().gemm_strided_batched(
        h, ob.op, oa.op, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, pb,
        type, static_cast<int>(ob.ld), sb, pa, type, static_cast<int>(oa.ld), sa, &beta, po, type,
        static_cast<int>(oc.ld), so, static_cast<int>(batch), compute, CUBLAS_GEMM_DEFAULT));
  } else {
    BP_CUBLAS_CHECK(blas().gemm_strided_batched_64(h, ob.op, oa.op, N, M, K, &alpha, pb, type,
                                                   ob.ld, sb, pa, type, oa.ld, sa, &beta, po, type,
                                                   oc.ld, so, batch, compute, CUBLAS_GEMM_DEFAULT));
  }
}

template <int D>
void launch_matmul(const LaunchArgs& a) {
  check_arity(a, 2, 1);
  const bp_tensor_desc& A = a.in[0];
  const bp_tensor_desc& B = a.in[1];
  const bp_tensor_desc& O = a.out[0];
  check_desc(A, D, "input 0");
  check_desc(B, D, "input 1");
  check_desc(O, D, "output");
  if (A.rank != 3 || B.rank != 3 || O.rank != 3)
    invalid(bp::sdk::format("matmul needs rank-3 tensors, got ranks %d, %d -> %d", A.rank, B.rank,
                            O.rank));
  const int64_t batch = O.shape[0], M = O.shape[1], N = O.shape[2], K = A.shape[2];
  if (A.shape[0] != batch || B.shape[0] != batch || A.shape[1] != M || B.shape[1] != K ||
      B.shape[2] != N)
    invalid(bp::sdk::format("matmul shapes %s x %s -> %s do not match",
                            shape_string(A.shape, 3).c_str(), shape_string(B.shape, 3).c_str(),
                            shape_string(O.shape, 3).c_str()));
  if (batch == 0 || M == 0 || N == 0) return;
  if (K == 0) {
    fill_tensor(a, O, 0.0);
    return;
  }
  // cuBLAS's A is b (K x N), its B is a (M x K); see Note [Row-major GEMM].
  const Operand ob = operand(K, N, B.strides[1], B.strides[2]);
  const Operand oa = operand(M, K, A.strides[1], A.strides[2]);
  const Operand oc = operand(M, N, O.strides[1], O.strides[2]);
  if (!ob.ok || !oa.ok || !oc.ok || oc.op != CUBLAS_OP_N || (batch > 1 && O.strides[0] == 0))
    invalid(bp::sdk::format(
        "matmul operands need unit stride in one of their last two dims and a row-major output; "
        "strides a %s, b %s, out %s",
        shape_string(A.strides, 3).c_str(), shape_string(B.strides, 3).c_str(),
        shape_string(O.strides, 3).c_str()));
  const long long sa = batch == 1 ? 0 : A.strides[0];
  const long long sb = batch == 1 ? 0 : B.strides[0];
  const long long so = batch == 1 ? 0 : O.strides[0];
  gemm<D>(a, oa, ob, oc, M, N, K, batch, sa, sb, so, data_ptr<const char>(A),
          data_ptr<const char>(B), data_ptr<char>(O));
}

// Note [CUDA linear]
//   linear = x w^T (+ bias) (then ReLU) as one cuBLASLt matmul whose epilogue adds the bias and
//   applies the ReLU while the tile is in registers (what PyTorch's addmm does for a dense
//   bias): out^T = w x^T column-major, so the bias runs along the rows of cuBLASLt's D, which
//   is what its BIAS epilogues broadcast. When cuBLASLt has no algorithm for the case (a
//   strided bias, an epilogue it lacks for the dtype), or the sizes exceed 32 bits, the product
//   goes through cublasGemmEx as matmul does and linear_epilogue (cuda_linear.cu) adds the bias
//   and the ReLU in one pass over the output.
template <int D>
bool try_lt(const LaunchArgs& a, const Operand& oa, const Operand& ob, const Operand& oc, int64_t M,
            int64_t N, int64_t K, const void* px, const void* pw, void* po,
            const bp_tensor_desc* bias, bool relu) {
  using Scale = typename GemmTypes<D>::Scale;
  constexpr cudaDataType_t type = GemmTypes<D>::kType;
  if (std::max({M, N, K, ob.ld, oa.ld, oc.ld}) > INT_MAX) return false;
  if (bias && ((bias->shape[0] > 1 && bias->strides[0] != 1) ||
               reinterpret_cast<uintptr_t>(data_ptr<const char>(*bias)) % 16 != 0))
    return false;
  const cudaDataType_t scale_type = D == BP_DTYPE_F64 ? CUDA_R_64F : CUDA_R_32F;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  struct Cleanup {
    cublasLtMatmulDesc_t& op;
    cublasLtMatrixLayout_t &la, &lb, &lc;
    cublasLtMatmulPreference_t& pref;
    ~Cleanup() {
      if (pref) blas().lt_pref_destroy(pref);
      if (lc) blas().lt_layout_destroy(lc);
      if (lb) blas().lt_layout_destroy(lb);
      if (la) blas().lt_layout_destroy(la);
      if (op) blas().lt_desc_destroy(op);
    }
  } cleanup{op, la, lb, lc, pref};
  BP_CUBLAS_CHECK(blas().lt_desc_create(&op, compute_type<D>(a), scale_type));
  // cuBLAS's A is w^T read as b [K, N] (ob), its B is x (oa), D is out^T [N, M].
  BP_CUBLAS_CHECK(blas().lt_desc_set(op, CUBLASLT_MATMUL_DESC_TRANSA, &ob.op, sizeof(ob.op)));
  BP_CUBLAS_CHECK(blas().lt_desc_set(op, CUBLASLT_MATMUL_DESC_TRANSB, &oa.op, sizeof(oa.op)));
  const cublasLtEpilogue_t epi = bias
                                     ? (relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                     : (relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
  BP_CUBLAS_CHECK(blas().lt_desc_set(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  if (bias) {
    const void* pbias = data_ptr<const char>(*bias);
    BP_CUBLAS_CHECK(
        blas().lt_desc_set(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &pbias, sizeof(pbias)));
  }
  // Stored shapes (rows x cols, column-major) before each operand's op.
  const bool a_n = ob.op == CUBLAS_OP_N, b_n = oa.op == CUBLAS_OP_N;
  BP_CUBLAS_CHECK(blas().lt_layout_create(&la, type, a_n ? N : K, a_n ? K : N, ob.ld));
  BP_CUBLAS_CHECK(blas().lt_layout_create(&lb, type, b_n ? K : M, b_n ? M : K, oa.ld));
  BP_CUBLAS_CHECK(blas().lt_layout_create(&lc, type, N, M, oc.ld));
  std::lock_guard<std::mutex> lock(a.device->cublas_mutex());
  cublasHandle_t h = bind_cublas_stream(a);  // also sets up this stream's workspace
  const size_t ws = a.s->cublas_workspace_bytes;
  BP_CUBLAS_CHECK(blas().lt_pref_create(&pref));
  BP_CUBLAS_CHECK(
      blas().lt_pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // A cublasHandle_t is also a valid cublasLtHandle_t (cuBLAS documentation).
  cublasLtHandle_t lt = reinterpret_cast<cublasLtHandle_t>(h);
  cublasLtMatmulHeuristicResult_t heur = {};
  int found = 0;
  const cublasStatus_t st = blas().lt_heuristic(lt, op, la, lb, lc, lc, pref, 1, &heur, &found);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0))
    return false;
  BP_CUBLAS_CHECK(st);
  const Scale alpha = 1, beta = 0;
  BP_CUBLAS_CHECK(blas().lt_matmul(lt, op, &alpha, pw, la, px, lb, &beta, po, lc, po, lc,
                                   &heur.algo, a.s->cublas_workspace, ws, a.stream));
  return true;
}

template <int D>
void launch_linear(const LaunchArgs& a) {
  if (a.nin != 2 && a.nin != 3)
    invalid(bp::sdk::format("linear takes x, w and an optional bias; got %d inputs", a.nin));
  check_arity(a, a.nin, 1);
  const bp_tensor_desc& X = a.in[0];
  const bp_tensor_desc& W = a.in[1];
  const bp_tensor_desc& O = a.out[0];
  const bp_tensor_desc* bias = a.nin == 3 ? &a.in[2] : nullptr;
  check_desc(X, D, "input 0");
  check_desc(W, D, "input 1");
  if (bias) check_desc(*bias, D, "input 2 (bias)");
  check_desc(O, D, "output");
  if (X.rank != 2 || W.rank != 2 || O.rank != 2 || (bias && bias->rank != 1))
    invalid(
        bp::sdk::format("linear needs x[M,K], w[N,K], bias[N], out[M,N]; got ranks %d, %d%s "
                        "-> %d",
                        X.rank, W.rank, bias ? ", 1-d bias" : "", O.rank));
  const int64_t M = O.shape[0], N = O.shape[1], K = X.shape[1];
  if (X.shape[0] != M || W.shape[0] != N || W.shape[1] != K || (bias && bias->shape[0] != N))
    invalid(bp::sdk::format("linear shapes x %s, w %s -> %s do not match%s",
                            shape_string(X.shape, 2).c_str(), shape_string(W.shape, 2).c_str(),
                            shape_string(O.shape, 2).c_str(),
                            bias && bias->shape[0] != N ? " (bias length differs from N)" : ""));
  const int64_t act = a.attrs->i(BP_ATTR_ID_ACTIVATION, BP_ACTIVATION_NONE);
  if (act != BP_ACTIVATION_NONE && act != BP_ACTIVATION_RELU)
    invalid(bp::sdk::format("linear activation %lld is not 0 (none) or 1 (relu)",
                            static_cast<long long>(act)));
  const bool relu = act == BP_ACTIVATION_RELU;
  if (M == 0 || N == 0) return;
  if (K == 0) {
    fill_tensor(a, O, 0.0);
    if (bias || relu) linear_epilogue(a, O, bias, relu);
    return;
  }
  // b [K, N] is w^T: b[k, n] = w[n, k].
  const Operand ob = operand(K, N, W.strides[1], W.strides[0]);
  const Operand oa = operand(M, K, X.strides[0], X.strides[1]);
  const Operand oc = operand(M, N, O.strides[0], O.strides[1]);
  if (!ob.ok || !oa.ok || !oc.ok || oc.op != CUBLAS_OP_N)
    invalid(bp::sdk::format(
        "linear operands need unit stride in one of their two dims and a row-major output; "
        "strides x %s, w %s, out %s",
        shape_string(X.strides, 2).c_str(), shape_string(W.strides, 2).c_str(),
        shape_string(O.strides, 2).c_str()));
  const void* px = data_ptr<const char>(X);
  const void* pw = data_ptr<const char>(W);
  void* po = data_ptr<char>(O);
  if ((bias || relu) && try_lt<D>(a, oa, ob, oc, M, N, K, px, pw, po, bias, relu)) return;
  gemm<D>(a, oa, ob, oc, M, N, K, 1, 0, 0, 0, px, pw, po);
  if (bias || relu) linear_epilogue(a, O, bias, relu);
}

}  // namespace

LaunchFn matmul_fn(Op op, int32_t dtype) {
  const bool lin = op == Op::kLinear;
  if (op != Op::kMatmul && !lin) return nullptr;
  switch (dtype) {
    case BP_DTYPE_F32:
      return lin ? &launch_linear<BP_DTYPE_F32> : &launch_matmul<BP_DTYPE_F32>;
    case BP_DTYPE_F64:
      return lin ? &launch_linear<BP_DTYPE_F64> : &launch_matmul<BP_DTYPE_F64>;
    case BP_DTYPE_F16:
      return lin ? &launch_linear<BP_DTYPE_F16> : &launch_matmul<BP_DTYPE_F16>;
    case BP_DTYPE_BF16:
      return lin ? &launch_linear<BP_DTYPE_BF16> : &launch_matmul<BP_DTYPE_BF16>;
    default:
      return nullptr;
  }
}

}  // namespace bp::cuda
