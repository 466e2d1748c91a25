// linear's epilogue kernel, for the products whose bias and activation cuBLASLt cannot fuse
// (Note [CUDA linear] in cuda_matmul.cpp): out[i, j] = act(out[i, j] + bias[j]) in place, one
// pass over the output.
#include "cuda_common.hpp"
#include "cuda_kernels.hpp"
#include "cuda_types.cuh"

#include <algorithm>

namespace bp::cuda {
namespace {

constexpr int kThreads = 256;

template <class S>
__global__ void __launch_bounds__(kThreads)
    bias_act(S* out, int64_t rows, int64_t cols, int64_t ors, int64_t ocs, const S* bias,
             int64_t bs, int relu) {
  const int64_t n = rows * cols;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t i = k / cols, j = k - i * cols;
    S* p = out + i * ors + j * ocs;
    auto v = load(*p);
    if (bias) v += load(bias[j * bs]);
    if (relu && v < decltype(v)(0)) v = decltype(v)(0);  // NaN stays (not < 0)
    *p = store<S>(v);
  }
}

template <int D>
void run(const LaunchArgs& a, const bp_tensor_desc& out, const bp_tensor_desc* bias, bool relu) {
  using S = storage_t<D>;
  const int64_t rows = out.shape[0], cols = out.shape[1];
  if (rows == 0 || cols == 0) return;
  const int64_t blocks =
      std::min<int64_t>(ceil_div(rows * cols, kThreads), int64_t{std::max(a.sm_count, 1)} * 16);
  bias_act<S><<<static_cast<unsigned>(blocks), kThreads, 0, a.stream>>>(
      data_ptr<S>(out), rows, cols, out.strides[0], out.strides[1],
      bias ? data_ptr<const S>(*bias) : nullptr, bias ? bias->strides[0] : 0, relu ? 1 : 0);
  BP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void linear_epilogue(const LaunchArgs& a, const bp_tensor_desc& out, const bp_tensor_desc* bias,
                     bool relu) {
  switch (out.dtype) {
    case BP_DTYPE_F32:
      return run<BP_DTYPE_F32>(a, out, bias, relu);
    case BP_DTYPE_F64:
      return run<BP_DTYPE_F64>(a, out, bias, relu);
    case BP_DTYPE_F16:
      return run<BP_DTYPE_F16>(a, out, bias, relu);
    case BP_DTYPE_BF16:
      return run<BP_DTYPE_BF16>(a, out, bias, relu);
    default:
      invalid(bp::sdk::format("linear epilogue of dtype %s", bp_dtype_name(out.dtype)));
  }
}

}  // namespace bp::cuda
