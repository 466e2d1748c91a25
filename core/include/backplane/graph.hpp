// Graphs: the work queued on a device's stream, captured once and replayed with one submission
// (docs/graphs.md).
//
//   bp::Tensor x = bp::randn({256, 1024}, dev);        // static input: allocated before
//   bp::Graph g = bp::capture(dev, [&] {                // nothing runs during the capture
//     y = model.forward(x);
//   });
//   x.copy_(next_batch);                                // update the input in place
//   g.replay();                                         // y now holds model(next_batch)
//
// Note [Graph semantics]
//   - A capture belongs to the thread that began it. While it is open, the ops that thread
//     queues on the device's default stream are captured, not run. Every other thread's work
//     on the device runs eagerly as if no capture were open (its tensors, reads, syncs and
//     collectives included), and is never part of the graph: a native capture records on a
//     private stream of the device, not on the default stream. end_capture() must be called on
//     the capturing thread (Error otherwise); abort_capture() and ~Graph work from any thread.
//     Tensors created during the capture come from a private
//     pool owned by the graph: every replay writes the same addresses, so a tensor created in
//     the capture (y above) holds the result of the latest replay. Inputs are the tensors
//     allocated before the capture; update them in place (copy_, fill_, ...) between replays.
//     Scalars (x * 2.0, a learning rate) are fixed at capture.
//   - Tensors made from host data during the capture (bp::tensor, from_vector, arange) are
//     constants of the graph: uploaded once at capture time, never re-read.
//   - What cannot be captured throws CaptureError naming the op, does nothing, and leaves the
//     capture open: reading values on the host (to_vector, item, printing), synchronising the
//     device or its default stream, events on that stream, Allocator::allocate (an allocation
//     outside the graph's pool), copies from or to pageable host memory (Device::copy_from_host
//     and copy_to_host accept only memory from Device::host_alloc), copies between devices,
//     random tensors (their seed and offset would repeat on every replay), collectives, SGD
//     with momentum before its buffers exist and Adam (their per-step state lives on the host).
//   - With the CUDA backend a graph is a CUDA graph (stream capture; the plugin's native graph
//     slots, plugin ABI 1.3). For a backend without them libbackplane records the launches
//     (kernel handles, descriptors, attributes, memsets and copies) and replays the list,
//     skipping every check, lookup and allocation of the eager path (Note [Recorded graphs]).
//   - The graph keeps alive every buffer its work touches, pool and inputs alike, and the
//     page-locked host blocks it copies from or to: Device::host_free of such a block is
//     deferred until the last graph using it is destroyed. Replays run in order on the
//     device's default stream, after the work queued before them; replay() returns without
//     waiting where the device queues work (cuda, opencl). Replays of one graph from several
//     threads run one at a time. A native replay is one submission; a recorded one is one
//     plugin call per captured op, so another thread's work on the default stream may land
//     between two of its ops (update inputs from the thread that replays, or between replays).
//   - Gradients: backward() and an optimiser step can be captured, so a whole training step
//     replays. Call zero_grad() inside the captured step so that backward() writes the pool's
//     gradient tensors rather than adding to tensors from outside.
#pragma once

#include <backplane/export.hpp>

#include <cstdint>
#include <functional>
#include <memory>

namespace bp {

class Device;

namespace detail {
struct GraphState;
}

// How a capture is made. `automatic`: the backend's native graphs where it has them (CUDA
// graphs), else the recorded list; BACKPLANE_GRAPHS=recorded makes automatic mean recorded.
// `recorded`: the recorded list on every backend (Note [Recorded graphs]).
enum class GraphMode { automatic, recorded };

class BP_API Graph {
 public:
  Graph() noexcept;  // empty: nothing to replay
  ~Graph();          // waits for its replays to finish, then frees the pool
  Graph(Graph&&) noexcept;
  Graph& operator=(Graph&&) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Starts capturing what the calling thread queues on `device`'s default stream. Throws
  // CaptureError when a capture is open on the device (graphs are not nested: one capture at a
  // time per device; the message names the thread that holds it; the open capture is not
  // touched), Error when this graph already holds a capture or a graph, PluginError when the
  // backend refuses.
  void begin_capture(Device& device, GraphMode mode = GraphMode::automatic);
  // Ends the capture; the graph is then ready to replay. Throws Error without an open capture or
  // on a thread other than the capturing one (naming both), PluginError when the backend could not
  // capture the work (the graph stays empty and the stream is usable).
  void end_capture();
  // Drops an open capture without making a graph (what capture() does when its function
  // throws): the stream is back to eager execution and the pool is freed.
  void abort_capture() noexcept;

  // Queues the captured work once. Throws Error on an empty graph or one still capturing, and
  // CaptureError on a thread that is capturing the device (graphs are not nested); other threads
  // may replay while a capture is open.
  void replay();

  bool empty() const noexcept;
  bool capturing() const noexcept;
  Device& device() const;             // throws Error on an empty graph
  bool native() const noexcept;       // the backend's own graph (CUDA graph), else a recorded list
  uint64_t num_ops() const noexcept;  // launches, copies and memsets captured
  uint64_t pool_bytes() const noexcept;  // bytes of the private pool

 private:
  std::unique_ptr<detail::GraphState> s_;
};

// Captures what `fn` queues on `device` into a new graph. When fn throws, the capture is
// dropped (Graph::abort_capture) and the exception propagates.
BP_API Graph capture(Device& device, const std::function<void()>& fn,
                     GraphMode mode = GraphMode::automatic);

// True while the calling thread has a capture open on `device` (another thread's capture does
// not change what this thread's work does).
BP_API bool is_capturing(const Device& device) noexcept;

}  // namespace bp
