// The device record of out-of-range indices that gather, scatter_add, embedding,
// embedding_backward and cross_entropy(_backward) share (Note [Deferred index errors] in
// cuda_index.cu).
//
// Internal to backends/cuda; include from .cu files only.
#ifndef BACKPLANE_CUDA_INDEX_CUH_
#define BACKPLANE_CUDA_INDEX_CUH_

#include "cuda_kernels.hpp"

#include <cstdint>
#include <mutex>

namespace bp::cuda {

// Which op met the bad index (IndexError::flag).
enum IndexErrorKind : int32_t {
  kIndexOk = 0,
  kIndexGather = 1,
  kIndexScatterAdd = 2,
  kIndexEmbedding = 3,
  kIndexEmbeddingBackward = 4,
  kIndexCrossEntropy = 5,  // a target outside [0, C) that is not IGNORE_INDEX (cuda_loss.cu)
  kIndexCrossEntropyBackward = 6,
};

struct IndexError {
  int32_t flag;  // IndexErrorKind; 0 none
  int32_t axis;
  int64_t value;
  int64_t position;  // row-major position in the index tensor
  int64_t size;      // the valid range is [0, size)
};

// Keeps the first bad index of a stream; rec may be null (inside a graph capture).
__device__ __forceinline__ void report_index(IndexError* rec, int32_t kind, int32_t axis,
                                             int64_t value, int64_t position, int64_t size) {
  if (!rec) return;
  if (atomicCAS(&rec->flag, 0, kind) == 0) {
    rec->axis = axis;
    rec->value = value;
    rec->position = position;
    rec->size = size;
  }
}

// Records per stream, one per index-checking launch in turn (Note [Deferred index errors]).
constexpr int kIndexSlots = 64;

// One index-checking launch's record (Note [Deferred index errors]): numbered, a.op_id noted
// for it, armed for the stream's next check; the records are allocated on first use. Holds the
// stream's ledger lock until destroyed, so launches reach the stream in the order of their
// numbers and a concurrent check or event record falls wholly before or after the launch (Note
// [Events and deferred index errors]): construct it just before queuing the kernel. record()
// is null, and nothing is locked or armed, while the stream captures a graph or when `wanted`
// is false.
class IndexLaunch {
 public:
  explicit IndexLaunch(const LaunchArgs& a, bool wanted = true);
  IndexLaunch(const IndexLaunch&) = delete;
  IndexLaunch& operator=(const IndexLaunch&) = delete;
  IndexError* record() const { return rec_; }

 private:
  std::unique_lock<std::mutex> lock_;
  IndexError* rec_ = nullptr;
};

}  // namespace bp::cuda

#endif  // BACKPLANE_CUDA_INDEX_CUH_
