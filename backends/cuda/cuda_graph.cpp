// Native graphs (plugin ABI 1.3, Note [Native graphs] in plugin_abi.h): CUDA stream capture.
//
// Note [Scratch in graphs]
//   A capture uses cudaStreamCaptureModeRelaxed: nothing queued on the capturing stream runs,
//   and this thread may still call the runtime for things that are not stream work (cudaMalloc,
//   cudaPointerGetAttributes, cuBLAS's host-side setup), which the stricter modes forbid.
//   Kernels that need scratch memory (reductions, CUB) take it from Device::allocate_scratch,
//   which for a capturing stream hands out blocks owned by the graph (cudaMalloc'd outside any
//   stream, reused by later ops of the same capture, since they run in capture order) instead of
//   the stream's block cache: a cached block would go back to the cache after the capture while
//   every replay still writes it. The blocks are freed by graph_destroy, after the host has
//   waited for the replays. The cuBLAS handle and the stream's workspace are set up before the
//   capture begins (Device::prepare_capture), since the workspace outlives every graph, and so
//   is the stream's cuDNN handle when cuDNN is already open.
#include "cuda_device.hpp"

#include "cuda_cudnn.hpp"

#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace bp::cuda {

struct CudaGraph {
  int device = 0;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::mutex mu;                     // guards the scratch lists, and graph_launch of the exec
  std::map<void*, uint64_t> blocks;  // every block and its size
  std::multimap<uint64_t, void*> free_blocks;  // size -> block, free during the capture
};

namespace {
void free_blocks_of(CudaGraph& g) noexcept {
  for (const auto& b : g.blocks) (void)cudaFree(b.first);
  g.blocks.clear();
  g.free_blocks.clear();
}
}  // namespace

void* graph_scratch(CudaGraph& g, uint64_t size) {
  std::lock_guard<std::mutex> lock(g.mu);
  auto it = g.free_blocks.lower_bound(size);
  if (it != g.free_blocks.end() && it->first <= 2 * size + 4096) {
    void* p = it->second;
    g.free_blocks.erase(it);
    return p;
  }
  use_device(g.device);
  void* p = nullptr;
  const uint64_t bytes = size == 0 ? 1 : size;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    bp::sdk::fail(e == cudaErrorMemoryAllocation ? BP_ERROR_OUT_OF_MEMORY : BP_ERROR_DEVICE,
                  bp::sdk::format("cuda:%d: %llu bytes of scratch memory for a graph: %s (%s)",
                                  g.device, static_cast<unsigned long long>(size),
                                  cudaGetErrorName(e), cudaGetErrorString(e)),
                  cudaGetErrorName(e));
  }
  g.blocks.emplace(p, bytes);
  return p;
}

void graph_scratch_free(CudaGraph& g, void* ptr, uint64_t) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(g.mu);
  auto it = g.blocks.find(ptr);
  if (it != g.blocks.end()) g.free_blocks.emplace(it->second, ptr);
}

CudaGraph* graph_begin_capture(CudaStream& s) {
  use_device(s.index);
  // Note [Scratch in graphs]. On a stream that is already capturing this finds both set up
  // (that capture's begin did it) and allocates nothing; the exchange below then refuses.
  s.device->prepare_capture(s);
  if (cudnn_loaded()) {  // Note [cuDNN per stream]: the handle is made outside the capture
    std::lock_guard<std::mutex> lock(s.cudnn_mutex);
    cudnn_handle(s);
  }
  // Note [Events and deferred index errors]: the check a watch needs cannot run in a capture.
  settle_index_watches(s);
  auto* g = new CudaGraph();
  g->device = s.index;
  CudaGraph* expected = nullptr;
  if (!s.capture.compare_exchange_strong(expected, g, std::memory_order_acq_rel)) {
    delete g;
    bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                  bp::sdk::format("cuda:%d: graph_begin_capture on a stream that is already "
                                  "capturing",
                                  s.index));
  }
  const cudaError_t e = cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeRelaxed);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    s.capture.store(nullptr, std::memory_order_release);
    delete g;
    BP_CUDA_CHECK(e);
  }
  return g;
}

CudaGraph* graph_end_capture(CudaStream& s) {
  CudaGraph* g = s.capture.exchange(nullptr, std::memory_order_acq_rel);
  if (!g)
    bp::sdk::fail(
        BP_ERROR_INVALID_ARGUMENT,
        bp::sdk::format("cuda:%d: graph_end_capture on a stream that is not capturing", s.index));
  use_device(s.index);
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(s.stream, &graph);
  if (e != cudaSuccess) {  // the capture was invalidated; the stream is eager again
    (void)cudaGetLastError();
    if (graph) (void)cudaGraphDestroy(graph);
    free_blocks_of(*g);
    delete g;
    BP_CUDA_CHECK(e);
  }
  g->graph = graph;
  std::lock_guard<std::mutex> lock(g->mu);
  g->free_blocks.clear();  // after the capture no block is reused: every replay writes them all
  return g;
}

void graph_instantiate(CudaGraph& g) {
  if (g.exec) return;
  use_device(g.device);
  BP_CUDA_CHECK(cudaGraphInstantiate(&g.exec, g.graph, 0));
}

void graph_launch(CudaGraph& g, CudaStream& s) {
  if (!g.exec)
    bp::sdk::fail(
        BP_ERROR_INVALID_ARGUMENT,
        bp::sdk::format("cuda:%d: graph_launch of a graph that was not instantiated", g.device));
  if (s.index != g.device)
    bp::sdk::fail(
        BP_ERROR_INVALID_ARGUMENT,
        bp::sdk::format("cuda:%d: graph_launch of a graph of cuda:%d", s.index, g.device));
  use_device(s.index);
  // A graph exec is not internally synchronised (CUDA's "Graph object thread safety"); the ABI
  // lets several threads launch one graph at once.
  std::lock_guard<std::mutex> lock(g.mu);
  BP_CUDA_CHECK(cudaGraphLaunch(g.exec, s.stream));
}

void graph_destroy(CudaGraph* g) {
  if (!g) return;
  use_device(g->device);
  if (g->exec) (void)cudaGraphExecDestroy(g->exec);
  if (g->graph) (void)cudaGraphDestroy(g->graph);
  free_blocks_of(*g);
  delete g;
}

}  // namespace bp::cuda
