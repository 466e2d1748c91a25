// batch_norm and batch_norm_backward: cuDNN's spatial batch normalisation on x[N,C,L] seen as
// NCHW [N, C, L, 1] (Note [cuDNN batch norm]), with kernels of our own for dtypes a cuDNN build
// rejects.
//
// Note [cuDNN batch norm]
//   The catalogue's semantics are cuDNN's: save_invstd is 1 / sqrt(var + eps) of the biased
//   batch variance, and cudnnBatchNormalizationForwardTraining updates the running statistics
//   as r = (1 - factor) r + factor b with the unbiased variance, so factor = MOMENTUM. The
//   per-channel tensors are f32 for f16/bf16 inputs and of x's dtype otherwise, which is what
//   cudnnDeriveBNTensorDescriptor asks for. Evaluation (TRAINING 0) runs
//   cudnnBatchNormalizationForwardInference on the running statistics. When cuDNN answers
//   CUDNN_STATUS_NOT_SUPPORTED* for a dtype (older builds lack bf16), that dtype switches for
//   the rest of the process to the kernels below: one block per channel, two passes in double
//   for the statistics, then the normalisation; the backward likewise sums dy and dy (x - mean)
//   per channel in double.
#include "cuda_common.hpp"
#include "cuda_device.hpp"
#include "cuda_dnn.hpp"
#include "cuda_elementwise.cuh"
#include "cuda_kernels.hpp"
#include "cuda_types.cuh"

#include <atomic>
#include <mutex>

namespace bp::cuda {
namespace {

constexpr int kBnThreads = 512;

// Sum of v over the block (every thread gets it); `sh` holds kBnThreads / 32 doubles.
__device__ double block_sum(double v, double* sh) {
  for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // sh may still be read by a previous call
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  double t = 0;
  for (int w = 0; w < kBnThreads / 32; ++w) t += sh[w];
  return t;
}

// One block per channel c: statistics, running-stat update, save outputs and y.
template <class S, class P>
__global__ void __launch_bounds__(kBnThreads)
    bn_train_kernel(const S* x, const P* weight, const P* bias, P* running_mean, P* running_var,
                    S* y, P* save_mean, P* save_invstd, int64_t N, int64_t C, int64_t L, double eps,
                    double momentum) {
  __shared__ double sh[kBnThreads / 32];
  const int64_t c = blockIdx.x;
  const int64_t M = N * L;
  double s = 0;
  for (int64_t i = threadIdx.x; i < M; i += kBnThreads) {
    const int64_t n = i / L, l = i - n * L;
    s += static_cast<double>(load(x[(n * C + c) * L + l]));
  }
  const double mean = block_sum(s, sh) / static_cast<double>(M);
  double q = 0;
  for (int64_t i = threadIdx.x; i < M; i += kBnThreads) {
    const int64_t n = i / L, l = i - n * L;
    const double d = static_cast<double>(load(x[(n * C + c) * L + l])) - mean;
    q += d * d;
  }
  const double var = block_sum(q, sh) / static_cast<double>(M);
  const double invstd = 1.0 / sqrt(var + eps);
  if (threadIdx.x == 0) {
    save_mean[c] = static_cast<P>(mean);
    save_invstd[c] = static_cast<P>(invstd);
    const double unbiased = M > 1 ? var * static_cast<double>(M) / static_cast<double>(M - 1) : var;
    running_mean[c] =
        static_cast<P>((1.0 - momentum) * static_cast<double>(running_mean[c]) + momentum * mean);
    running_var[c] = static_cast<P>((1.0 - momentum) * static_cast<double>(running_var[c]) +
                                    momentum * unbiased);
  }
  using A = compute_of_t<S>;
  const A scale = static_cast<A>(static_cast<double>(weight[c]) * invstd);
  const A shift =
      static_cast<A>(static_cast<double>(bias[c]) - mean * invstd * static_cast<double>(weight[c]));
  for (int64_t i = threadIdx.x; i < M; i += kBnThreads) {
    const int64_t n = i / L, l = i - n * L;
    const int64_t o = (n * C + c) * L + l;
    y[o] = store<S>(load(x[o]) * scale + shift);
  }
}

// Evaluation: one thread per element.
template <class S, class P>
__global__ void __launch_bounds__(kThreads)
    bn_eval_kernel(const S* x, const P* weight, const P* bias, const P* running_mean,
                   const P* running_var, S* y, int64_t total, int64_t C, int64_t L, double eps) {
  using A = compute_of_t<S>;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t c = (i / L) % C;
    const double invstd = 1.0 / sqrt(static_cast<double>(running_var[c]) + eps);
    const A scale = static_cast<A>(static_cast<double>(weight[c]) * invstd);
    const A shift =
        static_cast<A>(static_cast<double>(bias[c]) - static_cast<double>(running_mean[c]) *
                                                          invstd * static_cast<double>(weight[c]));
    y[i] = store<S>(load(x[i]) * scale + shift);
  }
}

// One block per channel: dweight, dbias and dx of training-mode batch_norm.
template <class S, class P>
__global__ void __launch_bounds__(kBnThreads)
    bn_backward_kernel(const S* dy, const S* x, const P* weight, const P* save_mean,
                       const P* save_invstd, S* dx, P* dweight, P* dbias, int64_t N, int64_t C,
                       int64_t L) {
  __shared__ double sh[kBnThreads / 32];
  const int64_t c = blockIdx.x;
  const int64_t M = N * L;
  const double mean = static_cast<double>(save_mean[c]);
  const double invstd = static_cast<double>(save_invstd[c]);
  double sdy = 0, sdyx = 0;
  for (int64_t i = threadIdx.x; i < M; i += kBnThreads) {
    const int64_t n = i / L, l = i - n * L;
    const int64_t o = (n * C + c) * L + l;
    const double g = static_cast<double>(load(dy[o]));
    sdy += g;
    sdyx += g * (static_cast<double>(load(x[o])) - mean);
  }
  sdy = block_sum(sdy, sh);
  sdyx = block_sum(sdyx, sh);
  if (threadIdx.x == 0) {
    dweight[c] = static_cast<P>(sdyx * invstd);
    dbias[c] = static_cast<P>(sdy);
  }
  const double w = static_cast<double>(weight[c]);
  const double mdy = sdy / static_cast<double>(M);
  const double k = invstd * invstd * sdyx / static_cast<double>(M);
  for (int64_t i = threadIdx.x; i < M; i += kBnThreads) {
    const int64_t n = i / L, l = i - n * L;
    const int64_t o = (n * C + c) * L + l;
    const double xm = static_cast<double>(load(x[o])) - mean;
    const double g = static_cast<double>(load(dy[o]));
    dx[o] = store<S>(static_cast<compute_of_t<S>>(w * invstd * (g - mdy - xm * k)));
  }
}

// Per dtype: whether cuDNN rejected it (Note [cuDNN batch norm]).
std::atomic<bool> g_own_kernels[BP_DTYPE_COUNT];

// cuDNN's answer for a dtype it lacks: NOT_SUPPORTED*, or BAD_PARAM for bf16 in some builds.
bool not_supported(cudnnStatus_t st, int32_t dtype) {
  return static_cast<int>(st) / 1000 == 3 ||
         (st == CUDNN_STATUS_BAD_PARAM && dtype == BP_DTYPE_BF16);
}

// Runs `call(api, handle, one, zero, x descriptor, per-channel descriptor)`, a cuDNN batch-norm
// call on x as [N, C, L, 1], under the stream's cuDNN lock, unless cuDNN rejected dtype D before.
// True when cuDNN did the work; false when our own kernels are to run (from now on too, when
// cuDNN turned D down just now). Other cuDNN errors throw.
template <int D, class Call>
bool cudnn_batch_norm(const LaunchArgs& a, int64_t N, int64_t C, int64_t L, Call call) {
  if (g_own_kernels[D].load(std::memory_order_relaxed)) return false;
  const CudnnApi& api = cudnn();
  const TensorDesc xd(cudnn_dtype(D), N, C, L, 1);
  TensorDesc pdesc;
  BP_CUDNN_CHECK(api.cudnnCreateTensorDescriptor(&pdesc.d));
  BP_CUDNN_CHECK(api.cudnnDeriveBNTensorDescriptor(pdesc.d, xd.d, CUDNN_BATCHNORM_SPATIAL));
  const float f1 = 1.0f, f0 = 0.0f;
  const double d1 = 1.0, d0 = 0.0;
  const void* one = D == BP_DTYPE_F64 ? static_cast<const void*>(&d1) : &f1;
  const void* zero = D == BP_DTYPE_F64 ? static_cast<const void*>(&d0) : &f0;
  std::lock_guard<std::mutex> lock(a.s->cudnn_mutex);
  const cudnnStatus_t st = call(api, cudnn_handle(*a.s), one, zero, xd.d, pdesc.d);
  if (!not_supported(st, D)) {
    BP_CUDNN_CHECK(st);
    return true;
  }
  g_own_kernels[D].store(true, std::memory_order_relaxed);
  return false;
}

template <int D>
using param_t = std::conditional_t<D == BP_DTYPE_F64, double, float>;

int32_t param_dtype(int32_t dtype) {
  return dtype == BP_DTYPE_F64 ? BP_DTYPE_F64 : BP_DTYPE_F32;
}

void check_channel(const bp_tensor_desc& t, int32_t pdtype, int64_t C, const char* role) {
  check_desc(t, pdtype, role);
  if (t.rank != 1 || t.shape[0] != C)
    invalid(bp::sdk::format("%s has shape %s, expected [%lld]", role,
                            shape_string(t.shape, t.rank).c_str(), static_cast<long long>(C)));
}

unsigned grid_for_elems(const LaunchArgs& a, int64_t n) {
  const int64_t want = ceil_div(n, kThreads);
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(want, a.sm_count * 16)));
}

template <int D>
void launch_batch_norm(const LaunchArgs& a) {
  using S = storage_t<D>;
  using P = param_t<D>;
  if (a.nin != 5 || (a.nout != 1 && a.nout != 3))
    invalid(
        bp::sdk::format("batch_norm takes x, weight, bias, running_mean, running_var and "
                        "gives y (, save_mean, save_invstd); got %d inputs and %d outputs",
                        a.nin, a.nout));
  const bp_tensor_desc& X = a.in[0];
  const bp_tensor_desc& Y = a.out[0];
  check_desc(X, D, "input 0 (x)");
  check_desc(Y, D, "output 0 (y)");
  if (X.rank != 3) invalid(bp::sdk::format("x must be [N, C, L], got rank %d", X.rank));
  check_same_shape(Y, X, "output 0 (y)");
  const int64_t N = X.shape[0], C = X.shape[1], L = X.shape[2];
  const int32_t pd = param_dtype(D);
  const char* roles[] = {"input 1 (weight)", "input 2 (bias)", "input 3 (running_mean)",
                         "input 4 (running_var)"};
  for (int k = 1; k < 5; ++k) check_channel(a.in[k], pd, C, roles[k - 1]);
  const bool training = a.attrs->i(BP_ATTR_ID_TRAINING, 0) != 0;
  if (training && a.nout != 3)
    invalid("batch_norm in training writes save_mean and save_invstd: 3 outputs needed");
  if (a.nout == 3) {
    check_channel(a.out[1], pd, C, "output 1 (save_mean)");
    check_channel(a.out[2], pd, C, "output 2 (save_invstd)");
  }
  const double eps = a.attrs->f(BP_ATTR_ID_EPS, 1e-5);
  const double momentum = a.attrs->f(BP_ATTR_ID_MOMENTUM, 0.1);
  const int64_t total = N * C * L;
  if (C == 0) return;
  if (total == 0) {
    // No samples: nothing to normalise; the statistics are undefined (NaN), as mean is.
    if (training) {
      fill_tensor(a, a.out[1], std::numeric_limits<double>::quiet_NaN());
      fill_tensor(a, a.out[2], std::numeric_limits<double>::quiet_NaN());
    }
    return;
  }
  const S* x = data_ptr<const S>(X);
  const P* w = data_ptr<const P>(a.in[1]);
  const P* b = data_ptr<const P>(a.in[2]);
  P* rm = data_ptr<P>(a.in[3]);
  P* rv = data_ptr<P>(a.in[4]);
  S* y = data_ptr<S>(Y);
  if (cudnn_batch_norm<D>(
          a, N, C, L,
          [&](const CudnnApi& api, cudnnHandle_t h, const void* one, const void* zero,
              cudnnTensorDescriptor_t xd, cudnnTensorDescriptor_t pd) {
            return training
                       ? api.cudnnBatchNormalizationForwardTraining(
                             h, CUDNN_BATCHNORM_SPATIAL, one, zero, xd, x, xd, y, pd, w, b,
                             momentum, rm, rv, eps, data_ptr<P>(a.out[1]), data_ptr<P>(a.out[2]))
                       : api.cudnnBatchNormalizationForwardInference(h, CUDNN_BATCHNORM_SPATIAL,
                                                                     one, zero, xd, x, xd, y, pd, w,
                                                                     b, rm, rv, eps);
          }))
    return;
  if (training) {
    bn_train_kernel<S, P><<<static_cast<unsigned>(C), kBnThreads, 0, a.stream>>>(
        x, w, b, rm, rv, y, data_ptr<P>(a.out[1]), data_ptr<P>(a.out[2]), N, C, L, eps, momentum);
  } else {
    bn_eval_kernel<S, P>
        <<<grid_for_elems(a, total), kThreads, 0, a.stream>>>(x, w, b, rm, rv, y, total, C, L, eps);
  }
  BP_CUDA_CHECK(cudaGetLastError());
}

template <int D>
void launch_batch_norm_backward(const LaunchArgs& a) {
  using S = storage_t<D>;
  using P = param_t<D>;
  check_arity(a, 5, 3);
  const bp_tensor_desc& DY = a.in[0];
  const bp_tensor_desc& X = a.in[1];
  check_desc(DY, D, "input 0 (dy)");
  check_desc(X, D, "input 1 (x)");
  check_desc(a.out[0], D, "output 0 (dx)");
  if (X.rank != 3) invalid(bp::sdk::format("x must be [N, C, L], got rank %d", X.rank));
  check_same_shape(DY, X, "input 0 (dy)");
  check_same_shape(a.out[0], X, "output 0 (dx)");
  const int64_t N = X.shape[0], C = X.shape[1], L = X.shape[2];
  const int32_t pd = param_dtype(D);
  check_channel(a.in[2], pd, C, "input 2 (weight)");
  check_channel(a.in[3], pd, C, "input 3 (save_mean)");
  check_channel(a.in[4], pd, C, "input 4 (save_invstd)");
  check_channel(a.out[1], pd, C, "output 1 (dweight)");
  check_channel(a.out[2], pd, C, "output 2 (dbias)");
  const double eps = a.attrs->f(BP_ATTR_ID_EPS, 1e-5);
  if (C == 0) return;
  if (N * L == 0) {
    fill_tensor(a, a.out[1], 0.0);
    fill_tensor(a, a.out[2], 0.0);
    return;
  }
  const S* dy = data_ptr<const S>(DY);
  const S* x = data_ptr<const S>(X);
  const P* w = data_ptr<const P>(a.in[2]);
  const P* sm = data_ptr<const P>(a.in[3]);
  const P* si = data_ptr<const P>(a.in[4]);
  S* dx = data_ptr<S>(a.out[0]);
  P* dw = data_ptr<P>(a.out[1]);
  P* db = data_ptr<P>(a.out[2]);
  if (cudnn_batch_norm<D>(
          a, N, C, L,
          [&](const CudnnApi& api, cudnnHandle_t h, const void* one, const void* zero,
              cudnnTensorDescriptor_t xd, cudnnTensorDescriptor_t pd) {
            return api.cudnnBatchNormalizationBackward(h, CUDNN_BATCHNORM_SPATIAL, one, zero, one,
                                                       zero, xd, x, xd, dy, xd, dx, pd, w, dw, db,
                                                       eps, sm, si);
          }))
    return;
  bn_backward_kernel<S, P><<<static_cast<unsigned>(C), kBnThreads, 0, a.stream>>>(
      dy, x, w, sm, si, dx, dw, db, N, C, L);
  BP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

LaunchFn batchnorm_fn(Op op, int32_t dtype) {
  const bool fwd = op == Op::kBatchNorm;
  if (!fwd && op != Op::kBatchNormBackward) return nullptr;
  switch (dtype) {
    case BP_DTYPE_F32:
      return fwd ? &launch_batch_norm<BP_DTYPE_F32> : &launch_batch_norm_backward<BP_DTYPE_F32>;
    case BP_DTYPE_F64:
      return fwd ? &launch_batch_norm<BP_DTYPE_F64> : &launch_batch_norm_backward<BP_DTYPE_F64>;
    case BP_DTYPE_F16:
      return fwd ? &launch_batch_norm<BP_DTYPE_F16> : &launch_batch_norm_backward<BP_DTYPE_F16>;
    case BP_DTYPE_BF16:
      return fwd ? &launch_batch_norm<BP_DTYPE_BF16> : &launch_batch_norm_backward<BP_DTYPE_BF16>;
    default:
      return nullptr;
  }
}

}  // namespace bp::cuda
