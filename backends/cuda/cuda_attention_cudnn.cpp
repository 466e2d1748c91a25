// scaled_dot_product_attention forward and backward through cuDNN's fused flash attention,
// built with cudnn-frontend's graph API (Note [cuDNN attention]).
//
// Note [cuDNN attention]
//   For f16 and bf16 without dropout, an attention launch first asks cuDNN: a graph of one
//   SDPA node (forward: q, k, v -> out and the softmax statistics; backward: q, k, v, out, dout
//   and the statistics -> dq, dk, dv), attention scale as a pass-by-value scalar, the causal
//   mask as cuDNN's top-left diagonal band (key j visible to query i when j <= i, the
//   catalogue's mask, also where L != S), accumulation in f32. cuDNN's statistics are the
//   row's log-sum-exp of the scaled scores in f32 (max + log sum exp(s - max)), which is the
//   catalogue's saved lse, so a backward through cuDNN may follow a forward through our own
//   kernels and the other way round. The graph is built once per (device, direction, dtype,
//   B, H, L, S, E, Ev, scale, causal, determinism) and cached for the process; a problem cuDNN
//   refuses (head sizes it has no engine for, a cuDNN too old for the graph, cuDNN missing) is
//   cached as refused with cuDNN's reason (printed once to stderr when BACKPLANE_CUDNN_ATTENTION
//   is set explicitly), and every launch of it runs our own kernels (Note [CUDA attention]).
//   Dropout stays with our kernels: its mask is the catalogue's Philox stream, which cuDNN's
//   generator does not reproduce. The backward lets cuDNN accumulate dq with atomics, as PyTorch's
//   fused attention does: two runs may differ in the last bits of dq.
//   BACKPLANE_CUDNN_ATTENTION=deterministic asks for cuDNN's deterministic algorithm instead (dq
//   summed in a fixed order: the same bits every run, as our own kernels give, for a training run
//   that must repeat exactly; forward and backward 8-37% slower on an H100 at 1k-16k), and
//   BACKPLANE_CUDNN_ATTENTION=0 turns cuDNN attention off. Building a graph queues no device work
//   (safe inside a graph capture); execution uses the stream's cuDNN handle under its cudnn_mutex
//   (Note [cuDNN per stream]) and a workspace of the launching stream's scratch memory.
//   cudnn-frontend resolves cuDNN through the handle Note [cuDNN at run time] opened
//   (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING).
#include "cuda_attention_cudnn.hpp"

#include "cuda_cudnn.hpp"
#include "cuda_device.hpp"
#include "cuda_dnn.hpp"

#include <cudnn_frontend.h>

#include <array>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace cudnn_frontend {
// The cuDNN library cudnn-frontend calls into (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING); set to the
// handle of Note [cuDNN at run time] before the first graph is built.
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace bp::cuda {
namespace {

namespace fe = cudnn_frontend;

// BACKPLANE_CUDNN_ATTENTION, read once: unset or 1 (cuDNN), deterministic (cuDNN with its
// deterministic backward), 0 (our kernels only). `explicit_` when set: a refused problem is then
// announced.
struct Mode {
  bool on = true, deterministic = false, explicit_ = false;
  std::string bad;  // the value, when it is none of those
};

const Mode& mode() {
  static const Mode m = [] {
    Mode r;
    const char* v = std::getenv("BACKPLANE_CUDNN_ATTENTION");
    if (!v || !*v) return r;
    r.explicit_ = true;
    if (std::strcmp(v, "0") == 0)
      r.on = false;
    else if (std::strcmp(v, "deterministic") == 0)
      r.deterministic = true;
    else if (std::strcmp(v, "1") != 0)
      r.bad = std::string(v).substr(0, 64);
    return r;
  }();
  return m;
}

// Tensor uids of the graphs.
enum : int64_t { kQ = 1, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV };

struct Key {
  std::array<int64_t, 11> v;
  bool operator<(const Key& o) const { return v < o.v; }
};

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;  // null: refused
  int64_t workspace = 0;
  std::string reason;  // why refused
};

struct Cache {
  std::mutex mu;
  std::map<Key, std::shared_ptr<const Plan>> plans;
};

Cache& cache() {
  static Cache* c = new Cache();  // lives as long as the plugin
  return *c;
}

Key key_of(int device, int32_t dtype, bool backward, const AttnProblem& p, bool deterministic) {
  return Key{{device, backward ? 1 : 0, dtype, p.B, p.H, p.L, p.S, p.E, p.Ev,
              static_cast<int64_t>(std::bit_cast<uint64_t>(p.scale)),
              (p.causal ? 1 : 0) | (deterministic ? 2 : 0)}};
}

std::vector<int64_t> dims(int64_t b, int64_t h, int64_t n, int64_t d) {
  return {b, h, n, d};
}
std::vector<int64_t> strides(int64_t h, int64_t n, int64_t d) {
  return {h * n * d, n * d, d, 1};
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name,
                                                    int64_t uid, std::vector<int64_t> dim,
                                                    std::vector<int64_t> stride) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(std::move(dim))
                      .set_stride(std::move(stride)));
}

void output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid,
            std::vector<int64_t> dim, std::vector<int64_t> stride) {
  t->set_output(true).set_uid(uid).set_dim(std::move(dim)).set_stride(std::move(stride));
}

// Builds the graph of one direction; a refusal leaves plan.graph null with cuDNN's reason.
std::shared_ptr<const Plan> build(cudnnHandle_t h, int32_t dtype, bool backward,
                                  const AttnProblem& p, bool deterministic) {
  auto plan = std::make_shared<Plan>();
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(dtype == BP_DTYPE_F16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = input(*g, "q", kQ, dims(p.B, p.H, p.L, p.E), strides(p.H, p.L, p.E));
  auto k = input(*g, "k", kK, dims(p.B, p.H, p.S, p.E), strides(p.H, p.S, p.E));
  auto v = input(*g, "v", kV, dims(p.B, p.H, p.S, p.Ev), strides(p.H, p.S, p.Ev));
  const std::vector<int64_t> stat_dims{p.B, p.H, p.L, 1}, stat_strides{p.H * p.L, p.L, 1, 1};
  if (!backward) {
    auto attrs = fe::graph::SDPA_attributes()
                     .set_name("scaled_dot_product_attention")
                     .set_generate_stats(true)
                     .set_attn_scale(static_cast<float>(p.scale));
    if (p.causal) attrs.set_causal_mask(true);
    auto [o, stats] = g->sdpa(q, k, v, std::move(attrs));
    output(o, kO, dims(p.B, p.H, p.L, p.Ev), strides(p.H, p.L, p.Ev));
    output(stats, kStats, stat_dims, stat_strides);
    stats->set_data_type(fe::DataType_t::FLOAT);
  } else {
    auto o = input(*g, "out", kO, dims(p.B, p.H, p.L, p.Ev), strides(p.H, p.L, p.Ev));
    auto dout = input(*g, "dout", kDO, dims(p.B, p.H, p.L, p.Ev), strides(p.H, p.L, p.Ev));
    auto stats = input(*g, "lse", kStats, stat_dims, stat_strides);
    stats->set_data_type(fe::DataType_t::FLOAT);
    auto attrs = fe::graph::SDPA_backward_attributes()
                     .set_name("scaled_dot_product_attention_backward")
                     .set_attn_scale(static_cast<float>(p.scale))
                     .set_deterministic_algorithm(deterministic);
    if (p.causal) attrs.set_causal_mask(true);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, std::move(attrs));
    output(dq, kDQ, dims(p.B, p.H, p.L, p.E), strides(p.H, p.L, p.E));
    output(dk, kDK, dims(p.B, p.H, p.S, p.E), strides(p.H, p.S, p.E));
    output(dv, kDV, dims(p.B, p.H, p.S, p.Ev), strides(p.H, p.S, p.Ev));
  }
  auto refuse = [&](const char* step, fe::error_t e) {
    plan->reason = std::string(step) + ": " + e.get_message();
    return plan;
  };
  if (auto e = g->validate(); e.is_bad()) return refuse("validate", e);
  if (auto e = g->build_operation_graph(h); e.is_bad()) return refuse("operation graph", e);
  if (auto e = g->create_execution_plans({fe::HeurMode_t::A}); e.is_bad())
    return refuse("heuristics", e);
  if (auto e = g->check_support(h); e.is_bad()) return refuse("support", e);
  if (auto e = g->build_plans(h); e.is_bad()) return refuse("plans", e);
  if (auto e = g->get_workspace_size(plan->workspace); e.is_bad()) return refuse("workspace", e);
  plan->graph = std::move(g);
  return plan;
}

// The cached plan of a launch, built on a miss; the caller holds the stream's cudnn_mutex.
std::shared_ptr<const Plan> plan_for(const LaunchArgs& a, cudnnHandle_t h, bool backward,
                                     const AttnProblem& p) {
  const bool deterministic = mode().deterministic;
  const Key key = key_of(a.device->index(), a.dtype, backward, p, deterministic);
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.plans.find(key);
    if (it != c.plans.end()) return it->second;
  }
  std::shared_ptr<const Plan> plan;
  try {
    plan = build(h, a.dtype, backward, p, deterministic);
  } catch (const std::exception& e) {  // cudnn-frontend reports a missing symbol by throwing
    auto refused = std::make_shared<Plan>();
    refused->reason = e.what();
    plan = std::move(refused);
  }
  std::lock_guard<std::mutex> lock(c.mu);
  auto [it, inserted] = c.plans.emplace(key, std::move(plan));  // the first one inserted wins
  if (inserted && !it->second->graph && mode().explicit_)
    std::fprintf(stderr,
                 "backplane: cuda:%d %s %s B=%lld H=%lld L=%lld S=%lld E=%lld Ev=%lld%s: cuDNN "
                 "refused fused attention (%s); using Backplane's kernels\n",
                 a.device->index(), op_name(a.op), a.dtype == BP_DTYPE_F16 ? "f16" : "bf16",
                 static_cast<long long>(p.B), static_cast<long long>(p.H),
                 static_cast<long long>(p.L), static_cast<long long>(p.S),
                 static_cast<long long>(p.E), static_cast<long long>(p.Ev),
                 p.causal ? " causal" : "", it->second->reason.c_str());
  return it->second;
}

bool applies(const LaunchArgs& a, std::initializer_list<const void*> ptrs) {
  const Mode& m = mode();
  if (!m.bad.empty()) [[unlikely]]
    invalid("BACKPLANE_CUDNN_ATTENTION='" + m.bad + "' is not 0, 1 or deterministic");
  if (!m.on) return false;
  if (a.dtype != BP_DTYPE_F16 && a.dtype != BP_DTYPE_BF16) return false;
  for (const void* p : ptrs)  // cuDNN's attention engines read 16-byte vectors
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  const CudnnApi& api = cudnn_api();
  if (!api.loaded) return false;
  static std::once_flag once;
  std::call_once(once, [&] { fe::cudnn_dlhandle = api.handle; });
  return true;
}

bool run(const LaunchArgs& a, bool backward, const AttnProblem& p,
         std::unordered_map<int64_t, void*>& pack) {
  std::lock_guard<std::mutex> lock(a.s->cudnn_mutex);
  cudnnHandle_t h = cudnn_handle(*a.s);
  const std::shared_ptr<const Plan> plan = plan_for(a, h, backward, p);
  if (!plan->graph) return false;
  Workspace ws(a, static_cast<size_t>(plan->workspace));
  fe::error_t e = plan->graph->execute(h, pack, ws.get());
  if (e.is_bad())
    bp::sdk::fail(BP_ERROR_DEVICE, std::string(op_name(a.op)) +
                                       ": cuDNN fused attention failed: " + e.get_message());
  return true;
}

}  // namespace

bool cudnn_attention_forward(const LaunchArgs& a, const AttnProblem& p, const void* q,
                             const void* k, const void* v, void* out, float* lse) {
  if (!applies(a, {q, k, v, out, lse})) return false;
  std::unordered_map<int64_t, void*> pack{{kQ, const_cast<void*>(q)},
                                          {kK, const_cast<void*>(k)},
                                          {kV, const_cast<void*>(v)},
                                          {kO, out},
                                          {kStats, lse}};
  return run(a, false, p, pack);
}

bool cudnn_attention_backward(const LaunchArgs& a, const AttnProblem& p, const void* q,
                              const void* k, const void* v, const void* out, const void* dout,
                              const float* lse, void* dq, void* dk, void* dv) {
  if (!applies(a, {q, k, v, out, dout, lse, dq, dk, dv})) return false;
  std::unordered_map<int64_t, void*> pack{{kQ, const_cast<void*>(q)},
                                          {kK, const_cast<void*>(k)},
                                          {kV, const_cast<void*>(v)},
                                          {kO, const_cast<void*>(out)},
                                          {kDO, const_cast<void*>(dout)},
                                          {kStats, const_cast<float*>(lse)},
                                          {kDQ, dq},
                                          {kDK, dk},
                                          {kDV, dv}};
  return run(a, true, p, pack);
}

}  // namespace bp::cuda
