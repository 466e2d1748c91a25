// scaled_dot_product_attention through cuDNN's fused flash attention (Note [cuDNN attention] in
// cuda_attention_cudnn.cpp). Internal to backends/cuda.
#ifndef BACKPLANE_CUDA_ATTENTION_CUDNN_HPP_
#define BACKPLANE_CUDA_ATTENTION_CUDNN_HPP_

#include "cuda_kernels.hpp"

#include <cstdint>

namespace bp::cuda {

// One attention problem: q [B,H,L,E], k [B,H,S,E], v [B,H,S,Ev], every tensor contiguous.
struct AttnProblem {
  int64_t B, H, L, S, E, Ev;
  double scale;
  bool causal;
};

// Queues the forward (out [B,H,L,Ev] in a.dtype, lse [B,H,L] f32) through cuDNN and returns
// true; or queues nothing and returns false where cuDNN does not take the problem (a dtype
// other than f16/bf16, cuDNN missing or refusing the shape, BACKPLANE_CUDNN_ATTENTION=0), so
// the caller runs its own kernels. No dropout: the caller keeps those launches.
bool cudnn_attention_forward(const LaunchArgs& a, const AttnProblem& p, const void* q,
                             const void* k, const void* v, void* out, float* lse);

// The backward (dq, dk, dv from q, k, v, out, dout and the forward's lse), as above.
bool cudnn_attention_backward(const LaunchArgs& a, const AttnProblem& p, const void* q,
                              const void* k, const void* v, const void* out, const void* dout,
                              const float* lse, void* dq, void* dk, void* dv);

}  // namespace bp::cuda

#endif  // BACKPLANE_CUDA_ATTENTION_CUDNN_HPP_
