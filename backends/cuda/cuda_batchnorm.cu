// batch_norm and batch_norm_backward: kernels of our own over x[N,C,L] (Note [CUDA batch norm]),
// or cuDNN's spatial batch normalisation on x seen as NCHW [N, C, L, 1] (Note [cuDNN batch norm])
// when BACKPLANE_CUDNN_BATCH_NORM=1 asks for it.
//
// Note [CUDA batch norm]
//   A channel's N L elements are N rows of L, one row every C L elements. Each of three launches
//   covers channel c with G blocks (grid (C, G), G chosen so that about four blocks per SM run
//   and each thread has at least 8 elements): thread t of block g takes the channel's elements
//   g T + t, g T + t + G T, ... in (n, l) order, stepping (n, l) without a division per element
//   (bn_for_channel). Training forward: (1) each block sums d = x - x0 and d^2 in double, x0
//   being the channel's first element (a shift from the data, so a mean far from zero costs no
//   digits: the catalogue's train_shifted case), into partials [C, G]; (2) one thread per channel
//   adds its G partials in order, derives mean, the biased variance, invstd, updates the
//   running statistics (unbiased variance, MOMENTUM) and writes y's per-channel scale and shift
//   in the compute type; (3) y = x scale + shift. Evaluation runs (2') scale and shift from the
//   running statistics and (3). Backward: (1) sums of dy and dy (x - mean) in double, (2)
//   dweight, dbias and dx's coefficients, (3) dx = a dy + b x + d. The partial order is fixed
//   for a given shape and GPU, so every run gives the same bits. cuDNN's legacy NCHW kernels
//   took 212 us forward and 383 us backward for ResNet-18's [256, 64, 32, 32] bf16 on an H200
//   (one block of work per channel, 64 channels).
//
// Note [cuDNN batch norm]
//   The catalogue's semantics are cuDNN's: save_invstd is 1 / sqrt(var + eps) of the biased
//   batch variance, and cudnnBatchNormalizationForwardTraining updates the running statistics
//   as r = (1 - factor) r + factor b with the unbiased variance, so factor = MOMENTUM. The
//   per-channel tensors are f32 for f16/bf16 inputs and of x's dtype otherwise, which is what
//   cudnnDeriveBNTensorDescriptor asks for. Evaluation (TRAINING 0) runs
//   cudnnBatchNormalizationForwardInference on the running statistics. When cuDNN answers
//   CUDNN_STATUS_NOT_SUPPORTED* for a dtype (older builds lack bf16), that dtype switches for
//   the rest of the process to the kernels of Note [CUDA batch norm].
#include "cuda_common.hpp"
#include "cuda_device.hpp"
#include "cuda_dnn.hpp"
#include "cuda_elementwise.cuh"
#include "cuda_kernels.hpp"
#include "cuda_types.cuh"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace bp::cuda {
namespace {

constexpr int kBnThreads = 256;

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

// Calls f(offset) for each element of channel blockIdx.x that this thread owns (Note [CUDA batch
// norm]): the channel's element i = n L + l lies at (n C + c) L + l.
template <class F>
__device__ __forceinline__ void bn_for_channel(int64_t N, int64_t C, int64_t L, F&& f) {
  const int64_t c = blockIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.y) * kBnThreads;
  const int64_t i0 = static_cast<int64_t>(blockIdx.y) * kBnThreads + threadIdx.x;
  int64_t n = i0 / L, l = i0 - n * L;
  const int64_t dn = step / L, dl = step - dn * L;
  while (n < N) {
    f((n * C + c) * L + l);
    n += dn;
    l += dl;
    if (l >= L) {
      l -= L;
      ++n;
    }
  }
}

// Stage 1 of the forward: part[c][g] = {sum d, sum d^2}, d = x - x[channel c's first element].
template <class S>
__global__ void __launch_bounds__(kBnThreads)
    bn_stats_partial_kernel(const S* x, double* part, int64_t N, int64_t C, int64_t L) {
  __shared__ double sh[kBnThreads / 32];
  const int64_t c = blockIdx.x;
  const double x0 = static_cast<double>(load(x[c * L]));
  double s1 = 0, s2 = 0;
  bn_for_channel(N, C, L, [&](int64_t o) {
    const double d = static_cast<double>(load(x[o])) - x0;
    s1 += d;
    s2 += d * d;
  });
  s1 = block_sum(s1, sh);
  s2 = block_sum(s2, sh);
  if (threadIdx.x == 0) {
    const int64_t k = 2 * (c * gridDim.y + blockIdx.y);
    part[k] = s1;
    part[k + 1] = s2;
  }
}

// Stage 2 of the forward in training, one thread per channel: the statistics, the running
// statistics, and y's scale and shift (coef[2c], coef[2c + 1]).
template <class S, class P>
__global__ void __launch_bounds__(kThreads)
    bn_stats_final_kernel(const S* x, const double* part, int64_t G, const P* weight, const P* bias,
                          P* running_mean, P* running_var, P* save_mean, P* save_invstd,
                          compute_of_t<S>* coef, int64_t C, int64_t L, int64_t M, double eps,
                          double momentum) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= C) return;
  double s1 = 0, s2 = 0;
  for (int64_t g = 0; g < G; ++g) {
    s1 += part[2 * (c * G + g)];
    s2 += part[2 * (c * G + g) + 1];
  }
  const double m = static_cast<double>(M);
  const double dm = s1 / m;
  const double var = std::max(0.0, s2 / m - dm * dm);
  const double mean = static_cast<double>(load(x[c * L])) + dm;
  const double invstd = 1.0 / sqrt(var + eps);
  save_mean[c] = static_cast<P>(mean);
  save_invstd[c] = static_cast<P>(invstd);
  const double unbiased = M > 1 ? var * m / (m - 1) : var;
  running_mean[c] =
      static_cast<P>((1.0 - momentum) * static_cast<double>(running_mean[c]) + momentum * mean);
  running_var[c] =
      static_cast<P>((1.0 - momentum) * static_cast<double>(running_var[c]) + momentum * unbiased);
  const double scale = static_cast<double>(weight[c]) * invstd;
  coef[2 * c] = static_cast<compute_of_t<S>>(scale);
  coef[2 * c + 1] = static_cast<compute_of_t<S>>(static_cast<double>(bias[c]) - mean * scale);
}

// Stage 2 in evaluation: y's scale and shift from the running statistics.
template <class S, class P>
__global__ void __launch_bounds__(kThreads)
    bn_eval_coef_kernel(const P* weight, const P* bias, const P* running_mean, const P* running_var,
                        compute_of_t<S>* coef, int64_t C, double eps) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= C) return;
  const double scale =
      static_cast<double>(weight[c]) / sqrt(static_cast<double>(running_var[c]) + eps);
  coef[2 * c] = static_cast<compute_of_t<S>>(scale);
  coef[2 * c + 1] = static_cast<compute_of_t<S>>(static_cast<double>(bias[c]) -
                                                 static_cast<double>(running_mean[c]) * scale);
}

// Stage 3 of the forward: y = x scale + shift.
template <class S>
__global__ void __launch_bounds__(kBnThreads)
    bn_apply_kernel(const S* x, S* y, const compute_of_t<S>* coef, int64_t N, int64_t C,
                    int64_t L) {
  using A = compute_of_t<S>;
  const A scale = coef[2 * blockIdx.x], shift = coef[2 * blockIdx.x + 1];
  bn_for_channel(N, C, L, [&](int64_t o) { y[o] = store<S>(load(x[o]) * scale + shift); });
}

// Stage 1 of the backward: part[c][g] = {sum dy, sum dy (x - mean)}.
template <class S, class P>
__global__ void __launch_bounds__(kBnThreads)
    bn_grad_partial_kernel(const S* dy, const S* x, const P* save_mean, double* part, int64_t N,
                           int64_t C, int64_t L) {
  __shared__ double sh[kBnThreads / 32];
  const int64_t c = blockIdx.x;
  const double mean = static_cast<double>(save_mean[c]);
  double sdy = 0, sdyx = 0;
  bn_for_channel(N, C, L, [&](int64_t o) {
    const double g = static_cast<double>(load(dy[o]));
    sdy += g;
    sdyx += g * (static_cast<double>(load(x[o])) - mean);
  });
  sdy = block_sum(sdy, sh);
  sdyx = block_sum(sdyx, sh);
  if (threadIdx.x == 0) {
    const int64_t k = 2 * (c * gridDim.y + blockIdx.y);
    part[k] = sdy;
    part[k + 1] = sdyx;
  }
}

// Stage 2 of the backward, one thread per channel: dweight, dbias and dx = a dy + b x + d
// (coef[3c..3c+2]), from dx = w invstd (dy - mean(dy) - (x - mean) invstd^2 mean(dy (x - mean))).
template <class S, class P>
__global__ void __launch_bounds__(kThreads)
    bn_grad_final_kernel(const double* part, int64_t G, const P* weight, const P* save_mean,
                         const P* save_invstd, P* dweight, P* dbias, compute_of_t<S>* coef,
                         int64_t C, int64_t M) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= C) return;
  double sdy = 0, sdyx = 0;
  for (int64_t g = 0; g < G; ++g) {
    sdy += part[2 * (c * G + g)];
    sdyx += part[2 * (c * G + g) + 1];
  }
  const double invstd = static_cast<double>(save_invstd[c]);
  const double mean = static_cast<double>(save_mean[c]);
  dweight[c] = static_cast<P>(sdyx * invstd);
  dbias[c] = static_cast<P>(sdy);
  const double m = static_cast<double>(M);
  const double wi = static_cast<double>(weight[c]) * invstd;
  const double k = invstd * invstd * sdyx / m;
  coef[3 * c] = static_cast<compute_of_t<S>>(wi);
  coef[3 * c + 1] = static_cast<compute_of_t<S>>(-wi * k);
  coef[3 * c + 2] = static_cast<compute_of_t<S>>(wi * (mean * k - sdy / m));
}

// Stage 3 of the backward.
template <class S>
__global__ void __launch_bounds__(kBnThreads)
    bn_grad_apply_kernel(const S* dy, const S* x, S* dx, const compute_of_t<S>* coef, int64_t N,
                         int64_t C, int64_t L) {
  using A = compute_of_t<S>;
  const A ca = coef[3 * blockIdx.x], cb = coef[3 * blockIdx.x + 1], cd = coef[3 * blockIdx.x + 2];
  bn_for_channel(N, C, L,
                 [&](int64_t o) { dx[o] = store<S>(ca * load(dy[o]) + cb * load(x[o]) + cd); });
}

// Blocks per channel (Note [CUDA batch norm]).
int64_t bn_groups(const LaunchArgs& a, int64_t C, int64_t M) {
  const int64_t want = ceil_div(int64_t{std::max(a.sm_count, 1)} * 4, C);
  const int64_t most = std::max<int64_t>(1, ceil_div(M, int64_t{kBnThreads} * 8));
  return std::clamp<int64_t>(want, 1, std::min<int64_t>(most, 65535));
}

// Scratch of the three launches: `partials` doubles, then `coefs` coefficients of type A.
template <class A>
struct BnScratch {
  const LaunchArgs& a;
  uint64_t bytes;
  void* p;
  double* part;
  A* coef;
  BnScratch(const LaunchArgs& args, int64_t partials, int64_t coefs)
      : a(args),
        bytes(static_cast<uint64_t>(partials) * sizeof(double) +
              static_cast<uint64_t>(coefs) * sizeof(A)),
        p(args.device->allocate_scratch(*args.s, bytes)),
        part(static_cast<double*>(p)),
        coef(reinterpret_cast<A*>(part + partials)) {}
  ~BnScratch() { a.device->free_scratch(*a.s, p, bytes); }
  BnScratch(const BnScratch&) = delete;
  BnScratch& operator=(const BnScratch&) = delete;
};

// BACKPLANE_CUDNN_BATCH_NORM, read once: unset or 0, our kernels; 1, cuDNN first.
bool use_cudnn() {
  static const bool on = [] {
    const char* v = std::getenv("BACKPLANE_CUDNN_BATCH_NORM");
    return v && std::strcmp(v, "1") == 0;
  }();
  return on;
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
  if (!use_cudnn() || g_own_kernels[D].load(std::memory_order_relaxed)) return false;
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
  using A = compute_of_t<S>;
  const int64_t M = N * L, G = bn_groups(a, C, M);
  const dim3 grid(static_cast<unsigned>(C), static_cast<unsigned>(G));
  const unsigned per_channel = static_cast<unsigned>(ceil_div(C, int64_t{kThreads}));
  const BnScratch<A> scratch(a, training ? 2 * C * G : 0, 2 * C);
  if (training) {
    bn_stats_partial_kernel<S><<<grid, kBnThreads, 0, a.stream>>>(x, scratch.part, N, C, L);
    bn_stats_final_kernel<S, P><<<per_channel, kThreads, 0, a.stream>>>(
        x, scratch.part, G, w, b, rm, rv, data_ptr<P>(a.out[1]), data_ptr<P>(a.out[2]),
        scratch.coef, C, L, M, eps, momentum);
  } else {
    bn_eval_coef_kernel<S, P>
        <<<per_channel, kThreads, 0, a.stream>>>(w, b, rm, rv, scratch.coef, C, eps);
  }
  bn_apply_kernel<S><<<grid, kBnThreads, 0, a.stream>>>(x, y, scratch.coef, N, C, L);
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
  using A = compute_of_t<S>;
  const int64_t M = N * L, G = bn_groups(a, C, M);
  const dim3 grid(static_cast<unsigned>(C), static_cast<unsigned>(G));
  const BnScratch<A> scratch(a, 2 * C * G, 3 * C);
  bn_grad_partial_kernel<S, P><<<grid, kBnThreads, 0, a.stream>>>(dy, x, sm, scratch.part, N, C, L);
  bn_grad_final_kernel<S, P>
      <<<static_cast<unsigned>(ceil_div(C, int64_t{kThreads})), kThreads, 0, a.stream>>>(
          scratch.part, G, w, sm, si, dw, db, scratch.coef, C, M);
  bn_grad_apply_kernel<S><<<grid, kBnThreads, 0, a.stream>>>(dy, x, dx, scratch.coef, N, C, L);
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
