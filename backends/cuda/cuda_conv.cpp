// conv2d and its two backward ops through cuDNN (Note [cuDNN convolution plans]), for f32,
// f64, f16 and bf16 (f16/bf16 accumulate in f32).
//
// Note [cuDNN convolution plans]
//   A launch looks its plan up in a per-process cache keyed by (device, op, dtype, TF32, every
//   shape and attribute): the tensor, filter and convolution descriptors, the algorithm and its
//   workspace size. On a miss cuDNN's heuristics (cudnnGetConvolution*Algorithm_v7, which queue
//   no device work and so are safe inside a graph capture) rank the algorithms; the first that
//   succeeds with a workspace of at most kMaxWorkspace wins, as PyTorch does without
//   cudnn.benchmark; with BACKPLANE_CUDNN_BENCHMARK=1 (like cudnn.benchmark) the first launch
//   of a shape times the candidates instead (cudnnFind*Ex on the launch's own tensors, the
//   output overwritten, outside graph captures only). The math type comes from that result, except
//   that f32 without ALLOW_TF32 is always CUDNN_FMA_MATH (CUDNN_DEFAULT_MATH would let cuDNN use
//   TF32 tensor cores). Plans are immutable once cached, so concurrent launches share them without
//   a lock. The workspace is scratch memory of the launching stream (Device::allocate_scratch: the
//   stream's block cache, or the graph's blocks while it captures; Note [Scratch in graphs]) freed
//   in stream order after the call.
#include "cuda_common.hpp"
#include "cuda_cudnn.hpp"
#include "cuda_device.hpp"
#include "cuda_dnn.hpp"
#include "cuda_kernels.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace bp::cuda {

cudnnDataType_t cudnn_dtype(int32_t dtype) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return CUDNN_DATA_FLOAT;
    case BP_DTYPE_F64:
      return CUDNN_DATA_DOUBLE;
    case BP_DTYPE_F16:
      return CUDNN_DATA_HALF;
    case BP_DTYPE_BF16:
      return CUDNN_DATA_BFLOAT16;
    default:
      invalid(bp::sdk::format("cuDNN has no type for dtype %s", bp_dtype_name(dtype)));
  }
}

int to_int(int64_t v, const char* what) {
  if (v > INT_MAX) [[unlikely]]
    bp::sdk::fail(BP_ERROR_UNSUPPORTED, bp::sdk::format("%s %lld exceeds cuDNN's 32-bit sizes",
                                                        what, static_cast<long long>(v)));
  return static_cast<int>(v);
}

TensorDesc::TensorDesc(cudnnDataType_t type, int64_t n, int64_t c, int64_t h, int64_t w) {
  const CudnnApi& api = cudnn();
  if (n * c * h * w > INT_MAX) [[unlikely]]
    bp::sdk::fail(BP_ERROR_UNSUPPORTED,
                  bp::sdk::format("a tensor of [%lld, %lld, %lld, %lld] exceeds cuDNN's 2^31 "
                                  "elements",
                                  static_cast<long long>(n), static_cast<long long>(c),
                                  static_cast<long long>(h), static_cast<long long>(w)));
  BP_CUDNN_CHECK(api.cudnnCreateTensorDescriptor(&d));
  BP_CUDNN_CHECK(api.cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, type, to_int(n, "N"),
                                                to_int(c, "C"), to_int(h, "H"), to_int(w, "W")));
}

TensorDesc::~TensorDesc() {
  if (d) (void)cudnn_api().cudnnDestroyTensorDescriptor(d);
}

namespace {

constexpr size_t kMaxWorkspace = size_t{4} << 30;

enum class ConvKind : int { kForward, kBackwardData, kBackwardFilter };

// Every number a plan depends on (Note [cuDNN convolution plans]).
struct ConvKey {
  std::array<int64_t, 22> v{};
  bool operator==(const ConvKey& o) const { return v == o.v; }
};
struct ConvKeyHash {
  size_t operator()(const ConvKey& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t x : k.v) h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc(cudnnDataType_t type, int64_t k, int64_t c, int64_t r, int64_t s) {
    const CudnnApi& api = cudnn();
    BP_CUDNN_CHECK(api.cudnnCreateFilterDescriptor(&d));
    BP_CUDNN_CHECK(api.cudnnSetFilter4dDescriptor(d, type, CUDNN_TENSOR_NCHW, to_int(k, "K"),
                                                  to_int(c, "C/G"), to_int(r, "R"),
                                                  to_int(s, "S")));
  }
  ~FilterDesc() {
    if (d) (void)cudnn_api().cudnnDestroyFilterDescriptor(d);
  }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
};

struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  ConvDesc() { BP_CUDNN_CHECK(cudnn().cudnnCreateConvolutionDescriptor(&d)); }
  ~ConvDesc() {
    if (d) (void)cudnn_api().cudnnDestroyConvolutionDescriptor(d);
  }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};

// Note [cuDNN graph convolutions]
//   cuDNN 9's legacy convolution calls (cudnnConvolutionForward with the _v7 heuristics or
//   cudnnFind) reach only the legacy algorithms, which for f16/bf16 forward ran at a third to
//   three quarters of what PyTorch (graph API) got on the H100 (72-143 against 208-285 TFLOP/s
//   for ResNet-18's 3x3 layers in bf16). So the forward of f32, f16 and bf16 goes through the
//   graph (backend) API, as PyTorch does: one convolution-forward operation, heuristics mode A
//   (PyTorch's default without cudnn.benchmark), and the first engine configuration whose plan
//   finalises, whose workspace fits kMaxWorkspace and whose numerical notes keep the
//   catalogue's numerics: no reduced-precision reduction (f16/bf16 accumulate in f32), and for
//   f32 no down-converted inputs and, without ALLOW_TF32, no tensor cores. Plans depend on the
//   pointers' alignment, which is part of the key. Where the graph API gives no plan the legacy
//   path runs; BACKPLANE_CUDNN_GRAPH=0 turns the graph API off.
struct GraphPlan {
  std::vector<cudnnBackendDescriptor_t> keep;  // every descriptor, destroyed in reverse
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace = 0;
  GraphPlan() = default;
  GraphPlan(const GraphPlan&) = delete;
  GraphPlan& operator=(const GraphPlan&) = delete;
  ~GraphPlan() {
    const CudnnApi& api = cudnn_api();
    for (auto it = keep.rbegin(); it != keep.rend(); ++it)
      (void)api.cudnnBackendDestroyDescriptor(*it);
  }
  // A new descriptor of type t owned by this plan, or nullptr.
  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t t) {
    cudnnBackendDescriptor_t d = nullptr;
    if (cudnn_api().cudnnBackendCreateDescriptor(t, &d) != CUDNN_STATUS_SUCCESS) return nullptr;
    keep.push_back(d);
    return d;
  }
};

struct ConvPlan {
  std::unique_ptr<GraphPlan> graph;  // Note [cuDNN graph convolutions]; null: legacy
  std::unique_ptr<TensorDesc> x, y, bias;
  std::unique_ptr<FilterDesc> w;
  ConvDesc conv;
  int algo = 0;  // cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t
  size_t workspace = 0;
};

// The geometry of one launch, read from the descriptors and attributes (the host checked
// them: Note [Op catalogue]).
struct ConvGeom {
  int64_t n, c, h, w, k, r, s, p, q;
  int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups;
};

ConvGeom geometry(const bp_tensor_desc& x, const bp_tensor_desc& w, const bp_tensor_desc& y,
                  const bp::sdk::Attrs& at) {
  ConvGeom g{};
  g.n = x.shape[0];
  g.c = x.shape[1];
  g.h = x.shape[2];
  g.w = x.shape[3];
  g.k = w.shape[0];
  g.r = w.shape[2];
  g.s = w.shape[3];
  g.p = y.shape[2];
  g.q = y.shape[3];
  g.stride_h = at.i(BP_ATTR_ID_STRIDE_H, 1);
  g.stride_w = at.i(BP_ATTR_ID_STRIDE_W, 1);
  g.pad_h = at.i(BP_ATTR_ID_PAD_H, 0);
  g.pad_w = at.i(BP_ATTR_ID_PAD_W, 0);
  g.dil_h = at.i(BP_ATTR_ID_DILATION_H, 1);
  g.dil_w = at.i(BP_ATTR_ID_DILATION_W, 1);
  g.groups = at.i(BP_ATTR_ID_GROUPS, 1);
  return g;
}

// The math type to set before asking the heuristics (see the Note).
cudnnMathType_t base_math(int32_t dtype, bool tf32) {
  if (dtype == BP_DTYPE_F32) return tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  if (dtype == BP_DTYPE_F64) return CUDNN_DEFAULT_MATH;
  return CUDNN_TENSOR_OP_MATH;
}

template <class Perf>
const Perf* pick(const Perf* perf, int count) {
  for (int i = 0; i < count; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= kMaxWorkspace) return &perf[i];
  return nullptr;
}

bool graph_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("BACKPLANE_CUDNN_GRAPH");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

// The largest power of two (at most 16) dividing every address.
int64_t alignment_of(const void* a, const void* b, const void* c) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
                         reinterpret_cast<uintptr_t>(c) | 16u;
  return static_cast<int64_t>(bits & (~bits + 1));
}

// The engine configurations cuDNN's heuristics (or its fallback list) give for a finalised
// operation graph, in their order; empty where there are none.
std::vector<cudnnBackendDescriptor_t> engine_configs(GraphPlan& gp, cudnnBackendDescriptor_t graph,
                                                     cudnnBackendHeurMode_t mode) {
  const CudnnApi& api = cudnn();
  cudnnBackendDescriptor_t heur = gp.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  if (!heur ||
      api.cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                   &graph) != CUDNN_STATUS_SUCCESS ||
      api.cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1,
                                   &mode) != CUDNN_STATUS_SUCCESS ||
      api.cudnnBackendFinalize(heur) != CUDNN_STATUS_SUCCESS)
    return {};
  int64_t count = 0;
  if (api.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                   nullptr) != CUDNN_STATUS_SUCCESS ||
      count <= 0)
    return {};
  std::vector<cudnnBackendDescriptor_t> cfgs;
  for (int64_t i = 0; i < count; ++i) {
    cudnnBackendDescriptor_t c = gp.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    if (!c) return {};
    cfgs.push_back(c);
  }
  int64_t got = 0;
  if (api.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                   cfgs.data()) != CUDNN_STATUS_SUCCESS)
    return {};
  cfgs.resize(static_cast<size_t>(std::clamp<int64_t>(got, 0, count)));
  return cfgs;
}

// Sets gp's plan to the first of cfgs whose numerical notes keep the catalogue's numerics, whose
// plan finalises and whose workspace fits (Note [cuDNN graph convolutions]); false if none.
bool try_configs(GraphPlan& gp, cudnnHandle_t h, int32_t dtype, bool tf32,
                 const std::vector<cudnnBackendDescriptor_t>& cfgs) {
  const CudnnApi& api = cudnn();
  for (cudnnBackendDescriptor_t cfg : cfgs) {
    cudnnBackendDescriptor_t engine = gp.make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    int64_t n = 0;
    if (!engine || api.cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                                &engine) != CUDNN_STATUS_SUCCESS)
      continue;
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t nnotes = 0;
    if (api.cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                     CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT,
                                     &nnotes, notes) != CUDNN_STATUS_SUCCESS)
      continue;
    bool usable = true;
    for (int64_t k = 0; k < nnotes; ++k) {
      const cudnnBackendNumericalNote_t note = notes[k];
      if (note == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION) usable = false;
      if (dtype == BP_DTYPE_F32 && note == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) usable = false;
      if (dtype == BP_DTYPE_F32 && !tf32 && note == CUDNN_NUMERICAL_NOTE_TENSOR_CORE)
        usable = false;
    }
    if (!usable) continue;
    cudnnBackendDescriptor_t plan = gp.make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    if (!plan ||
        api.cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                                     &h) != CUDNN_STATUS_SUCCESS ||
        api.cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                     &cfg) != CUDNN_STATUS_SUCCESS ||
        api.cudnnBackendFinalize(plan) != CUDNN_STATUS_SUCCESS)
      continue;
    int64_t ws = 0;
    if (api.cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                     CUDNN_TYPE_INT64, 1, &n, &ws) != CUDNN_STATUS_SUCCESS ||
        ws < 0 || static_cast<uint64_t>(ws) > kMaxWorkspace)
      continue;
    gp.plan = plan;
    gp.workspace = ws;
    return true;
  }
  return false;
}

// Note [cuDNN graph convolutions]: the forward plan, or nullptr where the graph API has none.
std::unique_ptr<GraphPlan> make_graph_forward(cudnnHandle_t h, int32_t dtype, bool tf32,
                                              const ConvGeom& g, int64_t align) {
  const CudnnApi& api = cudnn();
  auto gp = std::make_unique<GraphPlan>();
  bool ok = true;
  auto set = [&](cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t n,
                 cudnnBackendAttributeType_t t, int64_t count, const void* v) {
    ok = ok && d && api.cudnnBackendSetAttribute(d, n, t, count, v) == CUDNN_STATUS_SUCCESS;
  };
  auto finalize = [&](cudnnBackendDescriptor_t d) {
    ok = ok && d && api.cudnnBackendFinalize(d) == CUDNN_STATUS_SUCCESS;
  };
  const cudnnDataType_t type = cudnn_dtype(dtype);
  auto tensor = [&](int64_t id, int64_t n, int64_t c, int64_t hh, int64_t ww) {
    cudnnBackendDescriptor_t t = gp->make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t dims[4] = {n, c, hh, ww};
    const int64_t strides[4] = {c * hh * ww, hh * ww, ww, 1};
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id);
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    finalize(t);
    return t;
  };
  cudnnBackendDescriptor_t x = tensor(1, g.n, g.c, g.h, g.w);
  cudnnBackendDescriptor_t w = tensor(2, g.k, g.c / g.groups, g.r, g.s);
  cudnnBackendDescriptor_t y = tensor(3, g.n, g.k, g.p, g.q);
  cudnnBackendDescriptor_t conv = gp->make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t dims = 2;
  const int64_t dil[2] = {g.dil_h, g.dil_w}, stride[2] = {g.stride_h, g.stride_w},
                pad[2] = {g.pad_h, g.pad_w};
  set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
  set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims);
  set(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil);
  set(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride);
  set(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  set(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  finalize(conv);
  cudnnBackendDescriptor_t op = gp->make(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
  const float alpha = 1.0f, beta = 0.0f;
  set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w);
  set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
      &conv);
  set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
  set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
  finalize(op);
  cudnnBackendDescriptor_t graph = gp->make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op);
  set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  finalize(graph);
  if (!ok) return nullptr;
  // Heuristics mode A's list first, then cuDNN's fallback list, each whole: for f32 without
  // TF32 the first configurations are often tensor-core ones, all refused below.
  for (const cudnnBackendHeurMode_t heur_mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    if (try_configs(*gp, h, dtype, tf32, engine_configs(*gp, graph, heur_mode))) return gp;
  }
  return nullptr;
}

// Runs a graph plan on x, w -> y (Note [cuDNN graph convolutions]).
void run_graph(cudnnHandle_t h, const GraphPlan& gp, const void* x, const void* w, void* y,
               void* workspace) {
  const CudnnApi& api = cudnn();
  cudnnBackendDescriptor_t vp = nullptr;
  BP_CUDNN_CHECK(api.cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp));
  struct Destroy {
    cudnnBackendDescriptor_t d;
    ~Destroy() { (void)cudnn_api().cudnnBackendDestroyDescriptor(d); }
  } destroy{vp};
  const int64_t ids[3] = {1, 2, 3};
  void* ptrs[3] = {const_cast<void*>(x), const_cast<void*>(w), y};
  BP_CUDNN_CHECK(api.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                              CUDNN_TYPE_INT64, 3, ids));
  BP_CUDNN_CHECK(api.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                              CUDNN_TYPE_VOID_PTR, 3, ptrs));
  BP_CUDNN_CHECK(api.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                              CUDNN_TYPE_VOID_PTR, 1, &workspace));
  BP_CUDNN_CHECK(api.cudnnBackendFinalize(vp));
  BP_CUDNN_CHECK(api.cudnnBackendExecute(h, gp.plan, vp));
}

// The tensors of the launch that makes a plan: what cudnnFind* runs on (Note [cuDNN
// convolution plans]). x, w and y in forward terms; the op's output is overwritten.
struct ConvData {
  const void* x;
  const void* w;
  const void* y;
};

// BACKPLANE_CUDNN_BENCHMARK=1: time the candidates once per plan (cudnnFind*Ex).
bool benchmark_mode() {
  static const bool on = [] {
    const char* v = std::getenv("BACKPLANE_CUDNN_BENCHMARK");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

constexpr size_t kFindWorkspace = size_t{512} << 20;

std::unique_ptr<ConvPlan> make_plan(const LaunchArgs& a, cudnnHandle_t h, ConvKind kind, bool tf32,
                                    const ConvGeom& g, bool with_bias, const ConvData& data) {
  const int32_t dtype = a.dtype;
  const bool find = benchmark_mode() && !a.s->capture.load(std::memory_order_acquire);
  const CudnnApi& api = cudnn();
  const cudnnDataType_t type = cudnn_dtype(dtype);
  auto plan = std::make_unique<ConvPlan>();
  plan->x = std::make_unique<TensorDesc>(type, g.n, g.c, g.h, g.w);
  plan->y = std::make_unique<TensorDesc>(type, g.n, g.k, g.p, g.q);
  plan->w = std::make_unique<FilterDesc>(type, g.k, g.c / g.groups, g.r, g.s);
  if (with_bias) plan->bias = std::make_unique<TensorDesc>(type, 1, g.k, 1, 1);
  const cudnnDataType_t compute = dtype == BP_DTYPE_F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  cudnnConvolutionDescriptor_t cd = plan->conv.d;
  BP_CUDNN_CHECK(api.cudnnSetConvolution2dDescriptor(
      cd, to_int(g.pad_h, "pad_h"), to_int(g.pad_w, "pad_w"), to_int(g.stride_h, "stride_h"),
      to_int(g.stride_w, "stride_w"), to_int(g.dil_h, "dilation_h"), to_int(g.dil_w, "dilation_w"),
      CUDNN_CROSS_CORRELATION, compute));
  BP_CUDNN_CHECK(api.cudnnSetConvolutionGroupCount(cd, to_int(g.groups, "groups")));
  const cudnnMathType_t math = base_math(dtype, tf32);
  BP_CUDNN_CHECK(api.cudnnSetConvolutionMathType(cd, math));
  cudnnMathType_t chosen = math;
  // cudnnFind times only the legacy algorithms, which for f16/bf16 forward are far slower than
  // the graph API's engines (Note [cuDNN graph convolutions]): those keep the graph API in
  // benchmark mode too (measured on the H100: bf16 forward 0.26-0.61x PyTorch through the
  // search, 1.03-1.11x through the graph API).
  const bool half = dtype == BP_DTYPE_F16 || dtype == BP_DTYPE_BF16;
  if (kind == ConvKind::kForward && (!find || half) && dtype != BP_DTYPE_F64 && graph_enabled()) {
    plan->graph = make_graph_forward(h, dtype, tf32, g, alignment_of(data.x, data.w, data.y));
    if (plan->graph) {
      plan->workspace = static_cast<size_t>(plan->graph->workspace);
      return plan;
    }
  }
  constexpr int kMax = 16;
  int found = 0;
  const char* what = "";
  bool ok = false;
  // Fills perf[] with cuDNN's candidates, timed on the real buffers in benchmark mode (`run_find`
  // with a scratch workspace) or from its heuristics (`run_get`), and takes the first usable one.
  auto choose = [&](auto* perf, const char* name, auto run_find, auto run_get) {
    if (find) {
      Workspace ws(a, kFindWorkspace);
      run_find(ws);
    } else {
      run_get();
    }
    if (const auto* p = pick(perf, found)) {
      plan->algo = p->algo;
      chosen = p->mathType;
      ok = true;
    }
    what = name;
  };
  switch (kind) {
    case ConvKind::kForward: {
      cudnnConvolutionFwdAlgoPerf_t perf[kMax];
      choose(
          perf, "forward",
          [&](Workspace& ws) {
            BP_CUDNN_CHECK(api.cudnnFindConvolutionForwardAlgorithmEx(
                h, plan->x->d, data.x, plan->w->d, data.w, cd, plan->y->d,
                const_cast<void*>(data.y), kMax, &found, perf, ws.get(), ws.size()));
          },
          [&] {
            BP_CUDNN_CHECK(api.cudnnGetConvolutionForwardAlgorithm_v7(
                h, plan->x->d, plan->w->d, cd, plan->y->d, kMax, &found, perf));
          });
      break;
    }
    case ConvKind::kBackwardData: {
      cudnnConvolutionBwdDataAlgoPerf_t perf[kMax];
      choose(
          perf, "backward data",
          [&](Workspace& ws) {
            BP_CUDNN_CHECK(api.cudnnFindConvolutionBackwardDataAlgorithmEx(
                h, plan->w->d, data.w, plan->y->d, data.y, cd, plan->x->d,
                const_cast<void*>(data.x), kMax, &found, perf, ws.get(), ws.size()));
          },
          [&] {
            BP_CUDNN_CHECK(api.cudnnGetConvolutionBackwardDataAlgorithm_v7(
                h, plan->w->d, plan->y->d, cd, plan->x->d, kMax, &found, perf));
          });
      break;
    }
    case ConvKind::kBackwardFilter: {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[kMax];
      choose(
          perf, "backward filter",
          [&](Workspace& ws) {
            BP_CUDNN_CHECK(api.cudnnFindConvolutionBackwardFilterAlgorithmEx(
                h, plan->x->d, data.x, plan->y->d, data.y, cd, plan->w->d,
                const_cast<void*>(data.w), kMax, &found, perf, ws.get(), ws.size()));
          },
          [&] {
            BP_CUDNN_CHECK(api.cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                h, plan->x->d, plan->y->d, cd, plan->w->d, kMax, &found, perf));
          });
      break;
    }
  }
  if (!ok)
    bp::sdk::fail(BP_ERROR_UNSUPPORTED,
                  bp::sdk::format("cuDNN has no %s convolution algorithm for this shape and "
                                  "dtype (%d candidates, none usable)",
                                  what, found));
  if (dtype == BP_DTYPE_F32 && !tf32) chosen = CUDNN_FMA_MATH;
  BP_CUDNN_CHECK(api.cudnnSetConvolutionMathType(cd, chosen));
  size_t ws = 0;
  switch (kind) {
    case ConvKind::kForward:
      BP_CUDNN_CHECK(api.cudnnGetConvolutionForwardWorkspaceSize(
          h, plan->x->d, plan->w->d, cd, plan->y->d,
          static_cast<cudnnConvolutionFwdAlgo_t>(plan->algo), &ws));
      break;
    case ConvKind::kBackwardData:
      BP_CUDNN_CHECK(api.cudnnGetConvolutionBackwardDataWorkspaceSize(
          h, plan->w->d, plan->y->d, cd, plan->x->d,
          static_cast<cudnnConvolutionBwdDataAlgo_t>(plan->algo), &ws));
      break;
    case ConvKind::kBackwardFilter:
      BP_CUDNN_CHECK(api.cudnnGetConvolutionBackwardFilterWorkspaceSize(
          h, plan->x->d, plan->y->d, cd, plan->w->d,
          static_cast<cudnnConvolutionBwdFilterAlgo_t>(plan->algo), &ws));
      break;
  }
  plan->workspace = ws;
  return plan;
}

struct PlanCache {
  std::mutex mu;
  std::unordered_map<ConvKey, std::unique_ptr<ConvPlan>, ConvKeyHash> plans;
};

PlanCache& plan_cache() {
  static PlanCache* cache = new PlanCache();  // lives as long as the plugin
  return *cache;
}

// The cached plan of a launch, made on a miss; the caller holds the stream's cudnn_mutex.
const ConvPlan& plan_for(const LaunchArgs& a, cudnnHandle_t h, ConvKind kind, bool tf32,
                         const ConvGeom& g, bool with_bias, const ConvData& data) {
  ConvKey key;
  key.v = {a.device->index(),
           static_cast<int>(kind),
           a.dtype,
           tf32,
           with_bias,
           g.n,
           g.c,
           g.h,
           g.w,
           g.k,
           g.r,
           g.s,
           g.p,
           g.q,
           g.stride_h,
           g.stride_w,
           g.pad_h,
           g.pad_w,
           g.dil_h,
           g.dil_w,
           g.groups,
           alignment_of(data.x, data.w, data.y)};
  PlanCache& cache = plan_cache();
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.plans.find(key);
    if (it != cache.plans.end()) return *it->second;
  }
  // Made outside the lock (the heuristics take tens of microseconds); a racing launch may make
  // the same plan, and the first one inserted wins.
  std::unique_ptr<ConvPlan> plan = make_plan(a, h, kind, tf32, g, with_bias, data);
  std::lock_guard<std::mutex> lock(cache.mu);
  auto [it, inserted] = cache.plans.emplace(key, std::move(plan));
  (void)inserted;
  return *it->second;
}

struct Scale {
  float f[2] = {1.0f, 0.0f};
  double d[2] = {1.0, 0.0};
  const void* one(int32_t dtype) const {
    return dtype == BP_DTYPE_F64 ? static_cast<const void*>(&d[0]) : &f[0];
  }
  const void* zero(int32_t dtype) const {
    return dtype == BP_DTYPE_F64 ? static_cast<const void*>(&d[1]) : &f[1];
  }
};

void check_conv_descs(const LaunchArgs& a, const char* in0, const char* in1, const char* out) {
  check_desc(a.in[0], a.dtype, in0);
  check_desc(a.in[1], a.dtype, in1);
  check_desc(a.out[0], a.dtype, out);
  if (a.in[0].rank != 4 || a.in[1].rank != 4 || a.out[0].rank != 4)
    invalid(bp::sdk::format("needs rank-4 tensors, got ranks %d, %d -> %d", a.in[0].rank,
                            a.in[1].rank, a.out[0].rank));
}

void launch_conv2d(const LaunchArgs& a) {
  if (a.nin != 2 && a.nin != 3)
    invalid(bp::sdk::format("conv2d takes x, w and an optional bias; got %d inputs", a.nin));
  check_arity(a, a.nin, 1);
  check_conv_descs(a, "input 0 (x)", "input 1 (w)", "output (y)");
  const bp_tensor_desc& X = a.in[0];
  const bp_tensor_desc& W = a.in[1];
  const bp_tensor_desc& Y = a.out[0];
  const bp_tensor_desc* B = a.nin == 3 ? &a.in[2] : nullptr;
  if (B) check_desc(*B, a.dtype, "input 2 (bias)");
  if (numel(Y) == 0) return;
  const ConvGeom g = geometry(X, W, Y, *a.attrs);
  if (numel(X) == 0 || numel(W) == 0) {  // C == 0: an empty sum
    fill_tensor(a, Y, 0.0);
    if (B) {
      const CudnnApi& api = cudnn();
      const cudnnDataType_t type = cudnn_dtype(a.dtype);
      const TensorDesc yd(type, g.n, g.k, g.p, g.q), bd(type, 1, g.k, 1, 1);
      const Scale sc;
      std::lock_guard<std::mutex> lock(a.s->cudnn_mutex);
      BP_CUDNN_CHECK(api.cudnnAddTensor(cudnn_handle(*a.s), sc.one(a.dtype), bd.d,
                                        data_ptr<const char>(*B), sc.one(a.dtype), yd.d,
                                        data_ptr<char>(Y)));
    }
    return;
  }
  const bool tf32 = a.dtype == BP_DTYPE_F32 && a.attrs->i(BP_ATTR_ID_ALLOW_TF32, 0) != 0;
  const CudnnApi& api = cudnn();
  std::lock_guard<std::mutex> lock(a.s->cudnn_mutex);
  cudnnHandle_t h = cudnn_handle(*a.s);
  const ConvPlan& plan =
      plan_for(a, h, ConvKind::kForward, tf32, g, B != nullptr,
               {data_ptr<const char>(X), data_ptr<const char>(W), data_ptr<const char>(Y)});
  Workspace ws(a, plan.workspace);
  const Scale sc;
  if (plan.graph)
    run_graph(h, *plan.graph, data_ptr<const char>(X), data_ptr<const char>(W), data_ptr<char>(Y),
              ws.get());
  else
    BP_CUDNN_CHECK(api.cudnnConvolutionForward(
        h, sc.one(a.dtype), plan.x->d, data_ptr<const char>(X), plan.w->d, data_ptr<const char>(W),
        plan.conv.d, static_cast<cudnnConvolutionFwdAlgo_t>(plan.algo), ws.get(), ws.size(),
        sc.zero(a.dtype), plan.y->d, data_ptr<char>(Y)));
  if (B)
    BP_CUDNN_CHECK(api.cudnnAddTensor(h, sc.one(a.dtype), plan.bias->d, data_ptr<const char>(*B),
                                      sc.one(a.dtype), plan.y->d, data_ptr<char>(Y)));
}

void launch_conv2d_backward_input(const LaunchArgs& a) {
  check_arity(a, 2, 1);
  check_conv_descs(a, "input 0 (dy)", "input 1 (w)", "output (dx)");
  const bp_tensor_desc& DY = a.in[0];
  const bp_tensor_desc& W = a.in[1];
  const bp_tensor_desc& DX = a.out[0];
  if (numel(DX) == 0) return;
  const ConvGeom g = geometry(DX, W, DY, *a.attrs);
  if (numel(DY) == 0 || numel(W) == 0) {
    fill_tensor(a, DX, 0.0);
    return;
  }
  const bool tf32 = a.dtype == BP_DTYPE_F32 && a.attrs->i(BP_ATTR_ID_ALLOW_TF32, 0) != 0;
  const CudnnApi& api = cudnn();
  std::lock_guard<std::mutex> lock(a.s->cudnn_mutex);
  cudnnHandle_t h = cudnn_handle(*a.s);
  const ConvPlan& plan =
      plan_for(a, h, ConvKind::kBackwardData, tf32, g, false,
               {data_ptr<const char>(DX), data_ptr<const char>(W), data_ptr<const char>(DY)});
  Workspace ws(a, plan.workspace);
  const Scale sc;
  BP_CUDNN_CHECK(api.cudnnConvolutionBackwardData(
      h, sc.one(a.dtype), plan.w->d, data_ptr<const char>(W), plan.y->d, data_ptr<const char>(DY),
      plan.conv.d, static_cast<cudnnConvolutionBwdDataAlgo_t>(plan.algo), ws.get(), ws.size(),
      sc.zero(a.dtype), plan.x->d, data_ptr<char>(DX)));
}

void launch_conv2d_backward_weight(const LaunchArgs& a) {
  check_arity(a, 2, 1);
  check_conv_descs(a, "input 0 (x)", "input 1 (dy)", "output (dw)");
  const bp_tensor_desc& X = a.in[0];
  const bp_tensor_desc& DY = a.in[1];
  const bp_tensor_desc& DW = a.out[0];
  if (numel(DW) == 0) return;
  const ConvGeom g = geometry(X, DW, DY, *a.attrs);
  if (numel(X) == 0 || numel(DY) == 0) {  // N == 0: an empty sum
    fill_tensor(a, DW, 0.0);
    return;
  }
  const bool tf32 = a.dtype == BP_DTYPE_F32 && a.attrs->i(BP_ATTR_ID_ALLOW_TF32, 0) != 0;
  const CudnnApi& api = cudnn();
  std::lock_guard<std::mutex> lock(a.s->cudnn_mutex);
  cudnnHandle_t h = cudnn_handle(*a.s);
  const ConvPlan& plan =
      plan_for(a, h, ConvKind::kBackwardFilter, tf32, g, false,
               {data_ptr<const char>(X), data_ptr<const char>(DW), data_ptr<const char>(DY)});
  Workspace ws(a, plan.workspace);
  const Scale sc;
  BP_CUDNN_CHECK(api.cudnnConvolutionBackwardFilter(
      h, sc.one(a.dtype), plan.x->d, data_ptr<const char>(X), plan.y->d, data_ptr<const char>(DY),
      plan.conv.d, static_cast<cudnnConvolutionBwdFilterAlgo_t>(plan.algo), ws.get(), ws.size(),
      sc.zero(a.dtype), plan.w->d, data_ptr<char>(DW)));
}

}  // namespace

LaunchFn conv_fn(Op op, int32_t dtype) {
  if (dtype != BP_DTYPE_F32 && dtype != BP_DTYPE_F64 && dtype != BP_DTYPE_F16 &&
      dtype != BP_DTYPE_BF16)
    return nullptr;
  switch (op) {
    case Op::kConv2d:
      return &launch_conv2d;
    case Op::kConv2dBackwardInput:
      return &launch_conv2d_backward_input;
    case Op::kConv2dBackwardWeight:
      return &launch_conv2d_backward_weight;
    default:
      return nullptr;
  }
}

}  // namespace bp::cuda
