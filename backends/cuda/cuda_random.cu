// uniform and normal, exactly as Note [Philox stream] in backplane/philox.h prescribes: one
// thread per Philox counter (four uniform or two normal outputs), the arithmetic from the
// shared header compiled for the device.
//
// Note [Bit-identical uniforms]
//   u = (w >> 8) * 2^-24 is exact in float. value = low + (high - low) * u must round exactly
//   as the host's two float operations do, so the device code uses __fsub_rn/__fmul_rn/
//   __fadd_rn (__dsub_rn/... for f64): nvcc would otherwise contract the multiply-add into
//   one FMA, which rounds once and can differ in the last bit. normal uses the accurate (not
//   fast-math) logf/sqrtf/sinf/cosf and agrees with other devices to their accuracy.
#define BP_PHILOX_FN __host__ __device__ static inline
#include <backplane/abi/philox.h>

#include "cuda_common.hpp"
#include "cuda_elementwise.cuh"
#include "cuda_kernels.hpp"
#include "cuda_types.cuh"

namespace bp::cuda {
namespace {

__device__ __forceinline__ float scale_uniform(float u, float lo, float hi) {
  return __fadd_rn(lo, __fmul_rn(__fsub_rn(hi, lo), u));
}
__device__ __forceinline__ double scale_uniform(float u, double lo, double hi) {
  return __dadd_rn(lo, __dmul_rn(__dsub_rn(hi, lo), static_cast<double>(u)));
}

// One thread per counter c (elements with g = 4c .. 4c+3). `vec` says whether the four
// outputs of a full counter are one aligned vector (same for every counter).
template <class S>
__global__ void __launch_bounds__(kThreads)
    uniform_kernel(S* out, uint64_t n, uint64_t seed, uint64_t offset, compute_of_t<S> lo,
                   compute_of_t<S> hi, int vec) {
  const uint64_t c0 = offset >> 2, c1 = (offset + n - 1) >> 2;
  const uint64_t step = static_cast<uint64_t>(gridDim.x) * kThreads;
  for (uint64_t c = c0 + static_cast<uint64_t>(blockIdx.x) * kThreads + threadIdx.x; c <= c1;
       c += step) {
    const bp_philox_words w = bp_philox4x32_10(c, seed);
    Vec<S, 4> v;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float u = static_cast<float>(w.w[j] >> 8) * (1.0f / 16777216.0f);
      v.v[j] = store<S>(scale_uniform(u, lo, hi));
    }
    const uint64_t g0 = c * 4;
    if (vec && g0 >= offset && g0 - offset + 4 <= n) {
      *reinterpret_cast<Vec<S, 4>*>(out + (g0 - offset)) = v;
      continue;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint64_t g = g0 + static_cast<uint64_t>(j);
      if (g >= offset && g - offset < n) out[g - offset] = v.v[j];
    }
  }
}

template <class C>
__device__ __forceinline__ void box_muller(float u1, float u2, C& z0, C& z1) {
  if constexpr (std::is_same_v<C, float>) {
    const float r = sqrtf(__fmul_rn(-2.0f, logf(u1)));
    const float theta = __fmul_rn(6.283185307179586f, u2);
    float s, c;
    sincosf(theta, &s, &c);
    z0 = __fmul_rn(r, c);
    z1 = __fmul_rn(r, s);
  } else {
    const double r = sqrt(-2.0 * log(static_cast<double>(u1)));
    const double theta = 6.283185307179586 * static_cast<double>(u2);
    double s, c;
    sincos(theta, &s, &c);
    z0 = r * c;
    z1 = r * s;
  }
}

// One thread per counter c (elements g = 2c, 2c+1); `vec` as for uniform_kernel.
template <class S>
__global__ void __launch_bounds__(kThreads)
    normal_kernel(S* out, uint64_t n, uint64_t seed, uint64_t offset, compute_of_t<S> mean,
                  compute_of_t<S> stddev, int vec) {
  using C = compute_of_t<S>;
  const uint64_t c0 = offset >> 1, c1 = (offset + n - 1) >> 1;
  const uint64_t step = static_cast<uint64_t>(gridDim.x) * kThreads;
  for (uint64_t c = c0 + static_cast<uint64_t>(blockIdx.x) * kThreads + threadIdx.x; c <= c1;
       c += step) {
    float u1, u2;
    bp_philox_normal_uniforms(seed, c * 2, &u1, &u2);
    C z[2];
    box_muller(u1, u2, z[0], z[1]);
    Vec<S, 2> v;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      C x;
      if constexpr (std::is_same_v<C, float>) {
        x = __fadd_rn(mean, __fmul_rn(stddev, z[j]));
      } else {
        x = __dadd_rn(mean, __dmul_rn(stddev, z[j]));
      }
      v.v[j] = store<S>(x);
    }
    const uint64_t g0 = c * 2;
    if (vec && g0 >= offset && g0 - offset + 2 <= n) {
      *reinterpret_cast<Vec<S, 2>*>(out + (g0 - offset)) = v;
      continue;
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint64_t g = g0 + static_cast<uint64_t>(j);
      if (g >= offset && g - offset < n) out[g - offset] = v.v[j];
    }
  }
}

// Checks the dense output, reads seed/offset and returns the element count (0: nothing to do).
uint64_t random_setup(const LaunchArgs& a, int32_t dtype, uint64_t& seed, uint64_t& offset) {
  check_arity(a, 0, 1);
  const bp_tensor_desc& out = a.out[0];
  check_desc(out, dtype, "output");
  const int64_t n = numel(out);
  if (n > 0) {
    int64_t expected = 1;
    for (int32_t d = out.rank - 1; d >= 0; --d) {
      if (out.shape[d] != 1 && out.strides[d] != expected)
        invalid(bp::sdk::format("random ops need a dense output; strides %s for shape %s",
                                shape_string(out.strides, out.rank).c_str(),
                                shape_string(out.shape, out.rank).c_str()));
      expected *= out.shape[d];
    }
  }
  seed = static_cast<uint64_t>(a.attrs->i(BP_ATTR_ID_SEED, 0));
  offset = static_cast<uint64_t>(a.attrs->i(BP_ATTR_ID_OFFSET, 0));
  return static_cast<uint64_t>(n);
}

// About one wave of blocks, each thread looping over counters: measured faster than one
// counter per thread (2660 vs 2190 GB/s for uniform f32 at 2^26 on the H100).
unsigned random_grid(const LaunchArgs& a, uint64_t counters) {
  const uint64_t want = (counters + kThreads - 1) / kThreads;
  const uint64_t cap = static_cast<uint64_t>(std::max(a.sm_count, 1)) * 8;
  return static_cast<unsigned>(std::max<uint64_t>(1, std::min(want, cap)));
}

// Whether out + (g - offset) is aligned to `per` elements for every g multiple of `per`.
template <class S>
int vector_ok(const S* out, uint64_t offset, uint64_t per) {
  const auto addr = reinterpret_cast<uintptr_t>(out);
  if (addr % sizeof(S) != 0) return 0;
  return ((addr / sizeof(S) - offset) % per) == 0 ? 1 : 0;
}

template <int D>
void launch_uniform(const LaunchArgs& a) {
  using S = storage_t<D>;
  using C = compute_t<D>;
  uint64_t seed, offset;
  const uint64_t n = random_setup(a, D, seed, offset);
  if (n == 0) return;
  const C lo = static_cast<C>(a.attrs->f(BP_ATTR_ID_LOW, 0.0));
  const C hi = static_cast<C>(a.attrs->f(BP_ATTR_ID_HIGH, 1.0));
  const uint64_t counters = ((offset + n - 1) >> 2) - (offset >> 2) + 1;
  S* out = data_ptr<S>(a.out[0]);
  uniform_kernel<S><<<random_grid(a, counters), kThreads, 0, a.stream>>>(
      out, n, seed, offset, lo, hi, vector_ok(out, offset, 4));
  BP_CUDA_CHECK(cudaGetLastError());
}

template <int D>
void launch_normal(const LaunchArgs& a) {
  using S = storage_t<D>;
  using C = compute_t<D>;
  uint64_t seed, offset;
  const uint64_t n = random_setup(a, D, seed, offset);
  if (n == 0) return;
  const C mean = static_cast<C>(a.attrs->f(BP_ATTR_ID_MEAN, 0.0));
  const C stddev = static_cast<C>(a.attrs->f(BP_ATTR_ID_STD, 1.0));
  const uint64_t counters = ((offset + n - 1) >> 1) - (offset >> 1) + 1;
  S* out = data_ptr<S>(a.out[0]);
  normal_kernel<S><<<random_grid(a, counters), kThreads, 0, a.stream>>>(
      out, n, seed, offset, mean, stddev, vector_ok(out, offset, 2));
  BP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

LaunchFn random_fn(Op op, int32_t dtype) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return op == Op::kUniform  ? &launch_uniform<BP_DTYPE_F32>
             : op == Op::kNormal ? &launch_normal<BP_DTYPE_F32>
                                 : nullptr;
    case BP_DTYPE_F64:
      return op == Op::kUniform  ? &launch_uniform<BP_DTYPE_F64>
             : op == Op::kNormal ? &launch_normal<BP_DTYPE_F64>
                                 : nullptr;
    case BP_DTYPE_F16:
      return op == Op::kUniform  ? &launch_uniform<BP_DTYPE_F16>
             : op == Op::kNormal ? &launch_normal<BP_DTYPE_F16>
                                 : nullptr;
    case BP_DTYPE_BF16:
      return op == Op::kUniform  ? &launch_uniform<BP_DTYPE_BF16>
             : op == Op::kNormal ? &launch_normal<BP_DTYPE_BF16>
                                 : nullptr;
    default:
      return nullptr;
  }
}

}  // namespace bp::cuda
