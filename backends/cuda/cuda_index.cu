// gather, scatter_add (deterministic) and dropout (Philox), and the deferred reporting of
// out-of-range indices (Note [Deferred index errors]).
//
// Note [Deferred index errors]
//   Whether an index is in range is known only on the device, and a launch must not wait for
//   its kernel. So gather, scatter_add, embedding and embedding_backward (cuda_transformer.cu),
//   cross_entropy and its backward (cuda_loss.cu) never read or write out of range (a bad gather
//   element or embedding row becomes 0, a bad scatter contribution or embedding gradient row is
//   dropped), and the first bad index of a stream is written to a small record in device memory
//   (IndexError) that the stream owns. Each launch that checks indices gets one of the stream's
//   kIndexSlots records in turn, and the stream notes the launch's op id (Note [Asynchronous
//   errors] in plugin_abi.h) and queue order for that slot (IndexLaunch). The launch marks the
//   stream `index_armed`; the next stream_synchronize, or copy to the host, on that stream reads
//   the records, clears them, and puts the first bad index in queue order into the stream's fault
//   record (op failed, BP_ERROR_INVALID_ARGUMENT, the launch's op id, a message naming the op, the
//   index value, its position in the index tensor and the valid range), which that call and every
//   later one report until the host clears it (check_index_errors). Work queued after the bad
//   launch has run by then. A slot armed twice between checks (more than kIndexSlots
//   index-checking launches) keeps its first failure with op id 0. Inside a graph
//   capture no record is used (a graph may be replayed on any stream, after its capture stream
//   is gone): bad indices still read and write nothing out of range but are not reported.
//   Events recorded after such a launch: Note [Events and deferred index errors].
//
// Note [Events and deferred index errors]
//   Note [Asynchronous errors] (plugin_abi.h) wants an event recorded after a failure to carry
//   it, but a bad index is known only at the stream's next check, possibly after the event was
//   recorded (and waited on). So each stream keeps an IndexLedger: its records, a number for
//   each index-checking launch (1, 2, ...; a launch holds the ledger's mutex from taking its
//   number until its kernel is queued, so numbers follow the stream's order) and the number up
//   to which launches have been checked. event_record, under the same mutex, notes the
//   stream's record as before and, when launches numbered (checked, latest] are unchecked, a
//   watch on that range. Every check resolves every open watch once: failed (a copy of the
//   check's record: op failed, the op id, the message) when the first bad launch's number lies
//   in the watch's range, clean otherwise; so an index error of a launch queued after the event
//   never poisons it. A check reads the first failure of the stream's queue order and each
//   watch's range starts where the previous check ended, so that first failure is the first in
//   the range too. A slot armed twice between checks counts as failing at its first launch.
//   - event_synchronize: once the event completed, a watch still open runs its stream's check
//     (from any thread: the check runs under the ledger's mutex, which also orders it with
//     launches and destruction). It waits for all the work queued on that stream, also what
//     was queued after the event; only events that watch unchecked launches pay that. The
//     verdict goes into the event's record, so later synchronisations and waits agree. The
//     check also puts the failure into the source stream's own record, as its next
//     synchronisation would have. While a check waits, index launches and event records on
//     that stream from other threads wait for the mutex (other launches do not).
//   - stream_wait_event: the waiter cannot know yet. It keeps the watch (PendingWait), and its
//     next stream_synchronize or host read resolves it as above and merges a failure as
//     BP_FAULT_STREAM_POISONED; stream_fault, which never blocks, merges only verdicts already
//     known. A verdict known at the wait is merged at once, as an event's record always was.
//   - Lifetime: the ledger is a shared_ptr held by its stream, the events watching it and the
//     streams waiting on those; the watches hold no stream pointer. destroy_stream runs the
//     stream's last check when a watch on it is still open (so it waits for the stream's work
//     only then), detaches the ledger and frees the records; a watch on a destroyed stream is
//     therefore resolved (clean, if that last check itself failed: the destroy reported it).
//   - Graph capture: launches inside a capture use no record and take no number, and an event
//     recorded or waited on inside a capture keeps the old behaviour (the stream's record at
//     that time, nothing watched). graph_begin_capture first resolves the open watches on the
//     stream (waiting for it, only when there are some), since no check can run while it
//     captures; a watch opened concurrently with the begin stays open until the capture ends.
//
// Note [Deterministic scatter_add]
//   One thread per output element o: it starts from base[o] and adds, in increasing position
//   along AXIS (row-major order of src among the positions that can reach o), every src[i]
//   whose index[i] equals o's coordinate on AXIS, in the compute type (f32 for f16/bf16,
//   wrapping int32 for u8), and stores once. No atomics, so the sum's order, and the result,
//   is the catalogue's on every device. Cost: index.shape[AXIS] reads per output element.
#define BP_PHILOX_FN __host__ __device__ static inline
#include <backplane/abi/philox.h>

#include "cuda_common.hpp"
#include "cuda_device.hpp"
#include "cuda_elementwise.cuh"
#include "cuda_index.cuh"
#include "cuda_kernels.hpp"
#include "cuda_types.cuh"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace bp::cuda {
namespace {

// Shapes and row-major strides of up to kMaxDims dims, passed by value.
struct Dims {
  int rank;
  int64_t shape[kMaxDims];
};

Dims dims_of(const bp_tensor_desc& t) {
  Dims d{};
  d.rank = t.rank;
  for (int32_t i = 0; i < t.rank; ++i) d.shape[i] = t.shape[i];
  return d;
}

// The row-major offset in a tensor of shape `xd` of position `i` of an index-shaped tensor
// (shape `id`) with its coordinate along `axis` replaced by `j`.
__device__ __forceinline__ int64_t offset_at(int64_t i, const Dims& id, const Dims& xd, int axis,
                                             int64_t j) {
  int64_t off = 0, stride = 1;
  for (int d = id.rank - 1; d >= 0; --d) {
    const int64_t c = i % id.shape[d];
    i /= id.shape[d];
    off += (d == axis ? j : c) * stride;
    stride *= xd.shape[d];
  }
  return off;
}

// out[i] = x[i with i_axis = index[i]]; out and index have index's shape (`id`).
template <class S>
__global__ void __launch_bounds__(kThreads)
    gather_kernel(const S* x, const int64_t* index, S* out, Dims xd, Dims id, int axis,
                  int64_t total, IndexError* rec) {
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; o < total;
       o += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t j = index[o];
    const int64_t size = xd.shape[axis];
    if (j < 0 || j >= size) {
      report_index(rec, kIndexGather, axis, j, o, size);
      out[o] = store<S>(compute_of_t<S>(0));
      continue;
    }
    out[o] = x[offset_at(o, id, xd, axis, j)];
  }
}

// Note [Deterministic scatter_add]. out and base have shape `od`; index and src `id`.
template <class S>
__global__ void __launch_bounds__(kThreads)
    scatter_add_kernel(const S* base, const int64_t* index, const S* src, S* out, Dims od, Dims id,
                       int axis, int64_t total, IndexError* rec) {
  using C = compute_of_t<S>;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; o < total;
       o += static_cast<int64_t>(gridDim.x) * kThreads) {
    // o's coordinates; the row-major offset in index/src of (coords with axis = 0).
    int64_t rem = o, ioff = 0, istride = 1, iaxis_stride = 1, j = 0;
    bool reachable = true;
    for (int d = od.rank - 1; d >= 0; --d) {
      const int64_t c = rem % od.shape[d];
      rem /= od.shape[d];
      if (d == axis) {
        j = c;
        iaxis_stride = istride;
      } else {
        reachable = reachable && c < id.shape[d];
        ioff += c * istride;
      }
      istride *= id.shape[d];
    }
    C acc = load(base[o]);
    if (reachable) {
      const int64_t K = id.shape[axis];
      for (int64_t k = 0; k < K; ++k) {
        const int64_t p = ioff + k * iaxis_stride;
        const int64_t t = index[p];
        if (t == j) {
          if constexpr (std::is_integral_v<C>)
            acc = wrap_add(acc, load(src[p]));
          else
            acc += load(src[p]);
        } else if (j == 0 && (t < 0 || t >= od.shape[axis])) {
          report_index(rec, kIndexScatterAdd, axis, t, p,
                       od.shape[axis]);  // checked once, by the j == 0 thread
        }
      }
    }
    out[o] = store<S>(acc);
  }
}

// Note [Deterministic scatter_add], when index.shape[AXIS] == 1: each output element receives
// at most one src element, so out = base (copied before) and one thread per src element adds
// it where its index points: the same single addition in the compute type as the general
// kernel, without its per-output index walk. nll-style gradients (cross_entropy's gather of one
// class per row, scattered back into [rows, classes]) take this path.
template <class S>
__global__ void __launch_bounds__(kThreads)
    scatter_add_one_kernel(const S* base, const int64_t* index, const S* src, S* out, Dims od,
                           Dims id, int axis, int64_t total, IndexError* rec) {
  using C = compute_of_t<S>;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; p < total;
       p += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t t = index[p];
    if (t < 0 || t >= od.shape[axis]) {
      report_index(rec, kIndexScatterAdd, axis, t, p, od.shape[axis]);
      continue;
    }
    const int64_t off = offset_at(p, id, od, axis, t);
    C acc = load(base[off]);
    if constexpr (std::is_integral_v<C>)
      acc = wrap_add(acc, load(src[p]));
    else
      acc += load(src[p]);
    out[off] = store<S>(acc);
  }
}

// Thread per Philox counter c (elements g = 4c .. 4c+3 of the stream, i = g - offset).
template <class S>
__global__ void __launch_bounds__(kThreads)
    dropout_kernel(const S* x, S* y, uint64_t n, uint64_t seed, uint64_t offset, double p,
                   compute_of_t<S> scale) {
  const uint64_t c0 = offset >> 2, c1 = (offset + n - 1) >> 2;
  const uint64_t step = static_cast<uint64_t>(gridDim.x) * kThreads;
  for (uint64_t c = c0 + static_cast<uint64_t>(blockIdx.x) * kThreads + threadIdx.x; c <= c1;
       c += step) {
    const bp_philox_words w = bp_philox4x32_10(c, seed);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint64_t g = c * 4 + static_cast<uint64_t>(k);
      if (g < offset || g - offset >= n) continue;
      const uint64_t i = g - offset;
      const float u = static_cast<float>(w.w[k] >> 8) * (1.0f / 16777216.0f);
      y[i] =
          static_cast<double>(u) >= p ? store<S>(load(x[i]) * scale) : store<S>(compute_of_t<S>(0));
    }
  }
}

unsigned grid_for(const LaunchArgs& a, int64_t n) {
  const int64_t want = ceil_div(n, kThreads);
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(want, a.sm_count * 32)));
}

int64_t axis_attr(const LaunchArgs& a, int32_t rank) {
  if (!a.attrs->has(BP_ATTR_ID_AXIS)) invalid("needs attribute axis");
  const int64_t axis = a.attrs->i(BP_ATTR_ID_AXIS, 0);
  if (axis < 0 || axis >= rank)
    invalid(bp::sdk::format("axis %lld is outside [0, %d)", static_cast<long long>(axis), rank));
  return axis;
}

// index (and src) against x (or base): same rank, index.shape[d] <= x.shape[d] for d != axis.
void check_index_shape(const bp_tensor_desc& x, const bp_tensor_desc& index, int64_t axis,
                       const char* what) {
  bool ok = index.rank == x.rank;
  for (int32_t d = 0; ok && d < x.rank; ++d) ok = d == axis || index.shape[d] <= x.shape[d];
  if (!ok)
    invalid(
        bp::sdk::format("%s: index %s does not fit %s along axis %lld (same rank, no "
                        "larger outside the axis)",
                        what, shape_string(index.shape, index.rank).c_str(),
                        shape_string(x.shape, x.rank).c_str(), static_cast<long long>(axis)));
}

template <int D>
void launch_gather(const LaunchArgs& a) {
  using S = storage_t<D>;
  check_arity(a, 2, 1);
  const bp_tensor_desc& X = a.in[0];
  const bp_tensor_desc& I = a.in[1];
  check_desc(X, D, "input 0 (x)");
  check_desc(I, BP_DTYPE_I64, "input 1 (index)");
  check_desc(a.out[0], D, "output");
  check_same_shape(a.out[0], I, "output");
  const int64_t axis = axis_attr(a, X.rank);
  check_index_shape(X, I, axis, "gather");
  const int64_t n = numel(I);
  if (n == 0) return;
  const IndexLaunch slot(a);
  gather_kernel<S><<<grid_for(a, n), kThreads, 0, a.stream>>>(
      data_ptr<const S>(X), data_ptr<const int64_t>(I), data_ptr<S>(a.out[0]), dims_of(X),
      dims_of(I), static_cast<int>(axis), n, slot.record());
  BP_CUDA_CHECK(cudaGetLastError());
}

template <int D>
void launch_scatter_add(const LaunchArgs& a) {
  using S = storage_t<D>;
  check_arity(a, 3, 1);
  const bp_tensor_desc& B = a.in[0];
  const bp_tensor_desc& I = a.in[1];
  const bp_tensor_desc& Src = a.in[2];
  check_desc(B, D, "input 0 (base)");
  check_desc(I, BP_DTYPE_I64, "input 1 (index)");
  check_desc(Src, D, "input 2 (src)");
  check_desc(a.out[0], D, "output");
  check_same_shape(a.out[0], B, "output");
  check_same_shape(Src, I, "input 2 (src)");
  const int64_t axis = axis_attr(a, B.rank);
  check_index_shape(B, I, axis, "scatter_add");
  const int64_t n = numel(B);
  if (n == 0) {
    if (numel(I) != 0)
      invalid(bp::sdk::format("scatter_add: index %s into an empty base %s is out of range",
                              shape_string(I.shape, I.rank).c_str(),
                              shape_string(B.shape, B.rank).c_str()));
    return;
  }
  const IndexLaunch slot(a, numel(I) != 0);
  if (I.shape[axis] == 1) {
    if (data_ptr<const S>(B) != data_ptr<S>(a.out[0]))  // not INPLACE
      BP_CUDA_CHECK(cudaMemcpyAsync(data_ptr<S>(a.out[0]), data_ptr<const S>(B),
                                    static_cast<size_t>(n) * sizeof(S), cudaMemcpyDeviceToDevice,
                                    a.stream));
    const int64_t m = numel(I);
    if (m == 0) return;
    scatter_add_one_kernel<S><<<grid_for(a, m), kThreads, 0, a.stream>>>(
        data_ptr<const S>(B), data_ptr<const int64_t>(I), data_ptr<const S>(Src),
        data_ptr<S>(a.out[0]), dims_of(B), dims_of(I), static_cast<int>(axis), m, slot.record());
    BP_CUDA_CHECK(cudaGetLastError());
    return;
  }
  scatter_add_kernel<S><<<grid_for(a, n), kThreads, 0, a.stream>>>(
      data_ptr<const S>(B), data_ptr<const int64_t>(I), data_ptr<const S>(Src),
      data_ptr<S>(a.out[0]), dims_of(B), dims_of(I), static_cast<int>(axis), n, slot.record());
  BP_CUDA_CHECK(cudaGetLastError());
}

template <int D>
void launch_dropout(const LaunchArgs& a) {
  using S = storage_t<D>;
  using C = compute_of_t<S>;
  check_arity(a, 1, 1);
  check_desc(a.in[0], D, "input 0 (x)");
  check_desc(a.out[0], D, "output");
  check_same_shape(a.out[0], a.in[0], "output");
  const double p = a.attrs->f(BP_ATTR_ID_P, 0.5);
  if (!(p >= 0.0 && p < 1.0))
    invalid(bp::sdk::format("dropout probability p = %g is outside [0, 1)", p));
  const uint64_t n = static_cast<uint64_t>(numel(a.in[0]));
  if (n == 0) return;
  const uint64_t seed = static_cast<uint64_t>(a.attrs->i(BP_ATTR_ID_SEED, 0));
  const uint64_t offset = static_cast<uint64_t>(a.attrs->i(BP_ATTR_ID_OFFSET, 0));
  const uint64_t counters = ((offset + n - 1) >> 2) - (offset >> 2) + 1;
  const C scale = static_cast<C>(1.0 / (1.0 - p));
  dropout_kernel<S><<<grid_for(a, static_cast<int64_t>(counters)), kThreads, 0, a.stream>>>(
      data_ptr<const S>(a.in[0]), data_ptr<S>(a.out[0]), n, seed, offset, p, scale);
  BP_CUDA_CHECK(cudaGetLastError());
}

template <int D>
LaunchFn index_of(Op op) {
  constexpr bool kFloat =
      D == BP_DTYPE_F32 || D == BP_DTYPE_F64 || D == BP_DTYPE_F16 || D == BP_DTYPE_BF16;
  constexpr bool kArith = D != BP_DTYPE_BOOL;
  switch (op) {
    case Op::kGather:
      return &launch_gather<D>;
    case Op::kScatterAdd:
      if constexpr (kArith) return &launch_scatter_add<D>;
      return nullptr;
    case Op::kDropout:
      if constexpr (kFloat) return &launch_dropout<D>;
      return nullptr;
    default:
      return nullptr;
  }
}

}  // namespace

LaunchFn index_fn(Op op, int32_t dtype) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return index_of<BP_DTYPE_F32>(op);
    case BP_DTYPE_F64:
      return index_of<BP_DTYPE_F64>(op);
    case BP_DTYPE_F16:
      return index_of<BP_DTYPE_F16>(op);
    case BP_DTYPE_BF16:
      return index_of<BP_DTYPE_BF16>(op);
    case BP_DTYPE_I32:
      return index_of<BP_DTYPE_I32>(op);
    case BP_DTYPE_I64:
      return index_of<BP_DTYPE_I64>(op);
    case BP_DTYPE_U8:
      return index_of<BP_DTYPE_U8>(op);
    case BP_DTYPE_BOOL:
      return index_of<BP_DTYPE_BOOL>(op);
    default:
      return nullptr;
  }
}

IndexLaunch::IndexLaunch(const LaunchArgs& a, bool wanted) {
  CudaStream& s = *a.s;
  if (!wanted || s.capture.load(std::memory_order_acquire)) return;
  IndexLedger& L = *s.index_ledger;
  lock_ = std::unique_lock<std::mutex>(L.mu);
  if (!L.records) {
    constexpr uint64_t bytes = sizeof(IndexError) * kIndexSlots;
    void* p = a.device->allocate_scratch(s, bytes);
    const cudaError_t e = cudaMemsetAsync(p, 0, bytes, a.stream);
    if (e != cudaSuccess) {
      a.device->free_scratch(s, p, bytes);
      BP_CUDA_CHECK(e);
    }
    L.records = p;
    L.ops.assign(kIndexSlots, {});
  }
  const uint64_t seq = ++L.seq;
  const size_t slot = static_cast<size_t>(seq % kIndexSlots);
  IndexLedger::SlotOp& op = L.ops[slot];
  // A slot armed again before a check keeps its first failure but no longer knows its op.
  op.op_id = op.seq != 0 ? 0 : a.op_id;
  if (op.seq == 0) op.seq = seq;
  s.index_armed.store(true, std::memory_order_release);
  rec_ = static_cast<IndexError*>(L.records) + slot;
}

namespace {

std::string index_message(const IndexError& rec, int device) {
  if (rec.flag == kIndexCrossEntropy || rec.flag == kIndexCrossEntropyBackward)
    return bp::sdk::format(
        "cuda:%d: op '%s': target %lld of row %lld is outside [0, %lld) and is not the "
        "ignore_index",
        device, rec.flag == kIndexCrossEntropy ? "cross_entropy" : "cross_entropy_backward",
        static_cast<long long>(rec.value), static_cast<long long>(rec.position),
        static_cast<long long>(rec.size));
  if (rec.flag == kIndexEmbedding || rec.flag == kIndexEmbeddingBackward)
    return bp::sdk::format(
        "cuda:%d: op '%s': index %lld at position %lld is out of range for a table of %lld rows "
        "(valid: 0 to %lld)",
        device, rec.flag == kIndexEmbedding ? "embedding" : "embedding_backward",
        static_cast<long long>(rec.value), static_cast<long long>(rec.position),
        static_cast<long long>(rec.size), static_cast<long long>(rec.size) - 1);
  return bp::sdk::format(
      "cuda:%d: op '%s': index %lld at position %lld of the index tensor is outside [0, %lld) "
      "along axis %d",
      device, rec.flag == kIndexGather ? "gather" : "scatter_add",
      static_cast<long long>(rec.value), static_cast<long long>(rec.position),
      static_cast<long long>(rec.size), rec.axis);
}

// Under L.mu (L is s's ledger). Reads the stream's records after its work is done; the first
// bad index in queue order goes into the stream's fault record (Note [Asynchronous errors] in
// plugin_abi.h), and every open watch gets its verdict (Note [Events and deferred index
// errors]). Does nothing while the stream captures a graph: the check would be captured.
void check_locked(CudaStream& s, IndexLedger& L) {
  if (!s.index_armed.load(std::memory_order_relaxed)) return;
  if (s.capture.load(std::memory_order_acquire)) return;
  use_device(s.index);
  IndexError recs[kIndexSlots];
  BP_CUDA_CHECK(cudaMemcpyAsync(recs, L.records, sizeof(recs), cudaMemcpyDeviceToHost, s.stream));
  BP_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  int first = -1;
  uint64_t first_seq = 0, first_op = 0;
  for (int i = 0; i < kIndexSlots; ++i) {
    const IndexLedger::SlotOp& op = L.ops[static_cast<size_t>(i)];
    if (recs[i].flag != 0 && (first < 0 || op.seq < first_seq)) {
      first = i;
      first_seq = op.seq;
      first_op = op.op_id;
    }
  }
  std::shared_ptr<bp_stream_fault> fault;
  if (first >= 0) {
    BP_CUDA_CHECK(cudaMemsetAsync(L.records, 0, sizeof(recs), s.stream));
    const std::string msg = index_message(recs[first], s.index);
    s.fault.set(BP_FAULT_OP_FAILED, BP_ERROR_INVALID_ARGUMENT, first_op, msg);
    fault = std::make_shared<bp_stream_fault>();
    fault->struct_size = sizeof(bp_stream_fault);
    fault->severity = BP_FAULT_OP_FAILED;
    fault->code = BP_ERROR_INVALID_ARGUMENT;
    fault->op_id = first_op;
    std::snprintf(fault->message, sizeof fault->message, "%s", msg.c_str());
  }
  for (const std::weak_ptr<IndexWatch>& weak : L.watches) {
    const std::shared_ptr<IndexWatch> w = weak.lock();
    if (!w || w->resolved.load(std::memory_order_relaxed)) continue;
    // first_seq 0: a slot whose launch is not known any more; it fails every open watch.
    if (fault && (first_seq == 0 || (first_seq > w->from && first_seq <= w->to))) w->fault = fault;
    w->resolved.store(true, std::memory_order_release);
  }
  L.watches.clear();
  L.ops.assign(kIndexSlots, {});
  L.checked = L.seq;
  s.index_armed.store(false, std::memory_order_release);
}

// Whether a watch on L may still be waiting for its verdict (under L.mu).
bool has_open_watch(const IndexLedger& L) {
  for (const std::weak_ptr<IndexWatch>& weak : L.watches) {
    const std::shared_ptr<IndexWatch> w = weak.lock();
    if (w && !w->resolved.load(std::memory_order_relaxed)) return true;
  }
  return false;
}

// Appends `more` to s's pending waits.
void requeue_waits(CudaStream& s, std::vector<PendingWait>& more) {
  if (more.empty()) return;
  std::lock_guard<std::mutex> lock(s.waits_mutex);
  for (PendingWait& p : more) s.waits.push_back(std::move(p));
  s.has_waits.store(true, std::memory_order_release);
}

}  // namespace

void check_index_errors(CudaStream& s) {
  if (!s.index_armed.load(std::memory_order_acquire)) return;
  IndexLedger& L = *s.index_ledger;
  std::lock_guard<std::mutex> lock(L.mu);
  check_locked(s, L);
}

std::shared_ptr<IndexWatch> record_event(CudaStream& s, cudaEvent_t event, bp_stream_fault& rec) {
  // Nothing to watch without the lock: in a capture, or when no index launch is armed (armed
  // is set under the ledger's lock before a launch's kernel is queued and cleared at the end of
  // a check, so clear means every queued index launch is checked; one still being queued
  // concurrently comes after this event on the stream).
  if (s.capture.load(std::memory_order_acquire) || !s.index_armed.load(std::memory_order_acquire)) {
    BP_CUDA_CHECK(cudaEventRecord(event, s.stream));
    rec = s.fault.read(false);
    return nullptr;
  }
  IndexLedger& L = *s.index_ledger;
  std::lock_guard<std::mutex> lock(L.mu);
  BP_CUDA_CHECK(cudaEventRecord(event, s.stream));
  rec = s.fault.read(false);
  if (L.seq == L.checked || rec.severity != BP_FAULT_NONE) return nullptr;
  auto w = std::make_shared<IndexWatch>();
  w->from = L.checked;
  w->to = L.seq;
  if (L.watches.size() >= L.prune_at) {  // events destroyed or re-recorded before a check
    std::erase_if(L.watches, [](const std::weak_ptr<IndexWatch>& p) { return p.expired(); });
    L.prune_at = std::max<size_t>(64, 2 * L.watches.size());
  }
  L.watches.push_back(w);
  return w;
}

std::shared_ptr<const bp_stream_fault> resolve_watch(IndexLedger& L, IndexWatch& w) {
  if (!w.resolved.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(L.mu);
    if (L.stream)
      check_locked(*L.stream, L);
    else if (!w.resolved.load(std::memory_order_relaxed))  // its stream's last check failed
      w.resolved.store(true, std::memory_order_release);
  }
  if (!w.resolved.load(std::memory_order_acquire)) return nullptr;
  return w.fault;
}

void add_pending_wait(CudaStream& s, std::shared_ptr<IndexLedger> ledger,
                      std::shared_ptr<IndexWatch> watch) {
  std::lock_guard<std::mutex> lock(s.waits_mutex);
  // Verdicts already known are merged now, so the list holds only open watches.
  std::erase_if(s.waits, [&](const PendingWait& p) {
    if (!p.watch->resolved.load(std::memory_order_acquire)) return false;
    if (p.watch->fault) s.fault.merge(*p.watch->fault, BP_FAULT_STREAM_POISONED);
    return true;
  });
  bool known = false;
  for (const PendingWait& p : s.waits) known = known || p.watch == watch;
  if (!known) s.waits.push_back({std::move(ledger), std::move(watch)});
  s.has_waits.store(!s.waits.empty(), std::memory_order_release);
}

void resolve_waits(CudaStream& s, bool block) {
  if (!s.has_waits.load(std::memory_order_acquire)) return;
  std::vector<PendingWait> mine, keep;
  {
    std::lock_guard<std::mutex> lock(s.waits_mutex);
    mine.swap(s.waits);
    s.has_waits.store(false, std::memory_order_release);
  }
  size_t i = 0;
  try {
    for (; i < mine.size(); ++i) {
      PendingWait& p = mine[i];
      std::shared_ptr<const bp_stream_fault> f;
      if (p.watch->resolved.load(std::memory_order_acquire)) {
        f = p.watch->fault;
      } else if (block) {
        f = resolve_watch(*p.ledger, *p.watch);
        if (!p.watch->resolved.load(std::memory_order_acquire)) {  // its stream is capturing
          keep.push_back(std::move(p));
          continue;
        }
      } else {
        keep.push_back(std::move(p));
        continue;
      }
      if (f) s.fault.merge(*f, BP_FAULT_STREAM_POISONED);
    }
  } catch (...) {
    for (; i < mine.size(); ++i) keep.push_back(std::move(mine[i]));
    requeue_waits(s, keep);
    throw;
  }
  requeue_waits(s, keep);
}

void settle_index_watches(CudaStream& s) {
  IndexLedger& L = *s.index_ledger;
  std::lock_guard<std::mutex> lock(L.mu);
  if (has_open_watch(L)) check_locked(s, L);
}

void* close_index_ledger(CudaStream& s, std::exception_ptr& failed) {
  IndexLedger& L = *s.index_ledger;
  std::lock_guard<std::mutex> lock(L.mu);
  try {
    if (has_open_watch(L)) check_locked(s, L);
  } catch (...) {
    failed = std::current_exception();
  }
  L.stream = nullptr;
  L.watches.clear();
  void* records = L.records;
  L.records = nullptr;
  return records;
}

}  // namespace bp::cuda
