// matmul through cuBLAS: a[B,M,K] x b[B,K,N] -> out[B,M,N] for f32, f64, f16 and bf16.
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
#include "cuda_common.hpp"
#include "cuda_device.hpp"
#include "cuda_kernels.hpp"

#include <cublas_v2.h>

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
                                cublasGetStatusName(st), cublasGetStatusString(st), file, line),
                cublasGetStatusName(st));
}

void* Device::cublas_handle() {
  std::call_once(cublas_once_, [&] {
    use_device(index());
    cublasHandle_t h = nullptr;
    BP_CUBLAS_CHECK(cublasCreate(&h));
    cublas_ = h;
  });
  return cublas_;
}

void Device::destroy_cublas() {
  if (cublas_) (void)cublasDestroy(static_cast<cublasHandle_t>(cublas_));
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

template <int D>
void launch_matmul(const LaunchArgs& a) {
  using Scale = typename GemmTypes<D>::Scale;
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

  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  if constexpr (D == BP_DTYPE_F64) {
    compute = CUBLAS_COMPUTE_64F;
  } else if constexpr (D == BP_DTYPE_F32) {
    if (a.attrs->i(BP_ATTR_ID_ALLOW_TF32, 0) != 0) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  }
  const Scale alpha = 1, beta = 0;
  constexpr cudaDataType_t type = GemmTypes<D>::kType;
  const void* pa = data_ptr<const char>(A);
  const void* pb = data_ptr<const char>(B);
  void* po = data_ptr<char>(O);

  Device& dev = *a.device;
  cublasHandle_t h = static_cast<cublasHandle_t>(dev.cublas_handle());
  CudaStream& s = *a.s;
  std::lock_guard<std::mutex> lock(dev.cublas_mutex());
  if (!s.cublas_workspace) {  // Note [cuBLAS per stream]: set up under the lock
    const size_t bytes = workspace_bytes(dev);
    s.cublas_workspace = dev.allocate_scratch(s, bytes);
    s.cublas_workspace_bytes = bytes;
  }
  BP_CUBLAS_CHECK(cublasSetStream(h, a.stream));
  BP_CUBLAS_CHECK(cublasSetWorkspace(h, s.cublas_workspace, s.cublas_workspace_bytes));
  const bool fits = std::max({M, N, K, ob.ld, oa.ld, oc.ld, batch}) <= INT_MAX;
  if (fits) {
    BP_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        h, ob.op, oa.op, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, pb,
        type, static_cast<int>(ob.ld), sb, pa, type, static_cast<int>(oa.ld), sa, &beta, po, type,
        static_cast<int>(oc.ld), so, static_cast<int>(batch), compute, CUBLAS_GEMM_DEFAULT));
  } else {
    BP_CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(h, ob.op, oa.op, N, M, K, &alpha, pb, type, ob.ld,
                                                  sb, pa, type, oa.ld, sa, &beta, po, type, oc.ld,
                                                  so, batch, compute, CUBLAS_GEMM_DEFAULT));
  }
}

}  // namespace

LaunchFn matmul_fn(Op op, int32_t dtype) {
  if (op != Op::kMatmul) return nullptr;
  switch (dtype) {
    case BP_DTYPE_F32:
      return &launch_matmul<BP_DTYPE_F32>;
    case BP_DTYPE_F64:
      return &launch_matmul<BP_DTYPE_F64>;
    case BP_DTYPE_F16:
      return &launch_matmul<BP_DTYPE_F16>;
    case BP_DTYPE_BF16:
      return &launch_matmul<BP_DTYPE_BF16>;
    default:
      return nullptr;
  }
}

}  // namespace bp::cuda
