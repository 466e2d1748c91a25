// Iteration plans of the CUDA backend: the shape and strides of up to four tensors of one
// shape, with size-1 dimensions dropped and dimensions merged where every tensor is
// contiguous across them (Note [Coalesced plans]). Host code builds a Plan from descriptors;
// kernels receive it as a DevPlan with 32- or 64-bit index types.
//
// Note [Coalesced plans]
//   Dimension 0 of a plan is the innermost. A dimension d (outer) merges into the plan's
//   current innermost-so-far dimension (size S, strides s_k) when t_k.strides[d] == s_k * S for
//   every tensor k: the pair then walks memory like one dimension of size S * n. A contiguous
//   launch (every tensor dense and row-major) collapses to rank <= 1 with unit strides, which
//   the vectorised kernels handle; broadcasts (stride 0) and transposes stay as strided dims.
//
// Internal to backends/cuda; header-only, usable from host and device code.
#ifndef BACKPLANE_CUDA_PLAN_HPP_
#define BACKPLANE_CUDA_PLAN_HPP_

#include <backplane/abi/plugin_abi.h>

#include <cstdint>

#if defined(__CUDACC__)
#define BP_HD __host__ __device__
#else
#define BP_HD
#endif
// Loop unrolling in device code only (host compilers warn about the pragma).
#if defined(__CUDA_ARCH__)
#define BP_UNROLL _Pragma("unroll")
#else
#define BP_UNROLL
#endif

namespace bp::cuda {

constexpr int kMaxDims = BP_MAX_RANK;

// A coalesced iteration space over NT tensors (index 0 is the output by convention).
template <int NT>
struct Plan {
  int rank = 0;
  int64_t size[kMaxDims] = {};
  int64_t stride[NT][kMaxDims] = {};

  // True when every tensor is dense in the same row-major order (Note [Coalesced plans]).
  bool contiguous() const {
    if (rank == 0) return true;
    if (rank > 1) return false;
    for (int k = 0; k < NT; ++k)
      if (stride[k][0] != 1) return false;
    return true;
  }

  // True when every index and element offset fits in 31 bits (32-bit kernels apply).
  bool fits_32bit(int64_t n) const {
    constexpr int64_t kLimit = (int64_t{1} << 31) - 1;
    if (n > kLimit) return false;
    for (int k = 0; k < NT; ++k) {
      int64_t span = 0;
      for (int d = 0; d < rank; ++d) span += (size[d] - 1) * stride[k][d];
      if (span > kLimit) return false;
    }
    return true;
  }
};

// Builds the plan of tensors t[0..NT), which all have t[0]'s shape (checked by the caller).
template <int NT>
Plan<NT> make_plan(const bp_tensor_desc* const* t) {
  Plan<NT> p;
  for (int d = t[0]->rank - 1; d >= 0; --d) {
    const int64_t n = t[0]->shape[d];
    if (n == 1) continue;
    if (p.rank > 0) {
      bool merge = true;
      for (int k = 0; k < NT; ++k)
        merge = merge && t[k]->strides[d] == p.stride[k][p.rank - 1] * p.size[p.rank - 1];
      if (merge) {
        p.size[p.rank - 1] *= n;
        continue;
      }
    }
    p.size[p.rank] = n;
    for (int k = 0; k < NT; ++k) p.stride[k][p.rank] = t[k]->strides[d];
    ++p.rank;
  }
  return p;
}

// The kernel-side copy of a Plan with index type Idx (uint32_t or uint64_t).
template <int NT, class Idx>
struct DevPlan {
  int rank;
  Idx size[kMaxDims];
  Idx stride[NT][kMaxDims];

  static DevPlan from(const Plan<NT>& p) {
    DevPlan d{};
    d.rank = p.rank;
    for (int i = 0; i < kMaxDims; ++i) {
      d.size[i] = static_cast<Idx>(p.size[i]);
      for (int k = 0; k < NT; ++k) d.stride[k][i] = static_cast<Idx>(p.stride[k][i]);
    }
    return d;
  }

  // Element offsets of linear (row-major) index i in every tensor.
  BP_HD void offsets(Idx i, Idx (&off)[NT]) const {
    BP_UNROLL
    for (int k = 0; k < NT; ++k) off[k] = 0;
    BP_UNROLL
    for (int d = 0; d < kMaxDims; ++d) {
      if (d >= rank) break;
      Idx c;
      if (d == rank - 1) {
        c = i;
      } else {
        c = i % size[d];
        i /= size[d];
      }
      BP_UNROLL
      for (int k = 0; k < NT; ++k) off[k] += c * stride[k][d];
    }
  }
};

}  // namespace bp::cuda

#endif  // BACKPLANE_CUDA_PLAN_HPP_
