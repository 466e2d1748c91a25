// Lists and times cuDNN's graph-API engine configurations for one 2-D convolution forward, in
// the order each source gives them (heuristics mode A, mode B, the fallback list), so a choice
// rule (backends/cuda/cuda_conv.cpp, Note [cuDNN graph convolutions]) can be judged against
// every candidate. Compiled and run on the GPU machine by tools/gpu/cudnn_engines.sh:
//   cudnn_engines N C H W K R S STRIDE PAD f32|bf16
// Prints one line per configuration: source, rank, engine global index, numerical notes,
// knobs, workspace, median milliseconds of 20 runs and TFLOP/s; "filtered" marks configs the
// plugin refuses (f32 without TF32: tensor-core or down-converting engines; reduced-precision
// reductions).
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudnnStatus_t s_ = (x);                                                                    \
    if (s_ != CUDNN_STATUS_SUCCESS) {                                                          \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudnnGetErrorString(s_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t t) {
  cudnnBackendDescriptor_t d = nullptr;
  CK(cudnnBackendCreateDescriptor(t, &d));
  return d;
}

cudnnBackendDescriptor_t tensor(int64_t id, const int64_t dims[4], cudnnDataType_t type) {
  cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t strides[4] = {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
  const int64_t align = 16;
  CK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type));
  CK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims));
  CK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides));
  CK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id));
  CK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align));
  CK(cudnnBackendFinalize(t));
  return t;
}

std::vector<cudnnBackendDescriptor_t> configs(cudnnBackendDescriptor_t graph,
                                              cudnnBackendHeurMode_t mode) {
  cudnnBackendDescriptor_t heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  CK(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph));
  CK(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
  if (cudnnBackendFinalize(heur) != CUDNN_STATUS_SUCCESS) return {};
  int64_t count = 0;
  CK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                              &count, nullptr));
  std::vector<cudnnBackendDescriptor_t> cfgs(static_cast<size_t>(count));
  for (auto& c : cfgs) c = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  int64_t got = 0;
  CK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                              count, &got, cfgs.data()));
  cfgs.resize(static_cast<size_t>(std::min(got, count)));
  return cfgs;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 11) {
    std::fprintf(stderr, "usage: cudnn_engines N C H W K R S STRIDE PAD f32|bf16\n");
    return 2;
  }
  int64_t v[9];
  for (int i = 0; i < 9; ++i) v[i] = std::atoll(argv[i + 1]);
  const int64_t n = v[0], c = v[1], h = v[2], w = v[3], k = v[4], r = v[5], s = v[6], st = v[7],
                pad = v[8];
  const bool f32 = std::string(argv[10]) == "f32";
  const cudnnDataType_t type = f32 ? CUDNN_DATA_FLOAT : CUDNN_DATA_BFLOAT16;
  const int64_t p = (h + 2 * pad - r) / st + 1, q = (w + 2 * pad - s) / st + 1;
  const double flops = 2.0 * n * k * p * q * c * r * s;
  cudnnHandle_t handle;
  CK(cudnnCreate(&handle));
  const size_t esize = f32 ? 4 : 2;
  void *x = nullptr, *wt = nullptr, *y = nullptr;
  cudaMalloc(&x, n * c * h * w * esize);
  cudaMalloc(&wt, k * c * r * s * esize);
  cudaMalloc(&y, n * k * p * q * esize);
  cudaMemset(x, 0x3c, n * c * h * w * esize);
  cudaMemset(wt, 0x3c, k * c * r * s * esize);
  const int64_t xd[4] = {n, c, h, w}, wd[4] = {k, c, r, s}, yd[4] = {n, k, p, q};
  cudnnBackendDescriptor_t tx = tensor(1, xd, type), tw = tensor(2, wd, type),
                           ty = tensor(3, yd, type);
  cudnnBackendDescriptor_t conv = make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t dims = 2, one[2] = {1, 1}, strides[2] = {st, st}, pads[2] = {pad, pad};
  CK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1,
                              &compute));
  CK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE,
                              1, &mode));
  CK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1,
                              &dims));
  CK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, one));
  CK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2,
                              strides));
  CK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2,
                              pads));
  CK(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2,
                              pads));
  CK(cudnnBackendFinalize(conv));
  cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
  const float alpha = 1.0f, beta = 0.0f;
  CK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tx));
  CK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tw));
  CK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ty));
  CK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv));
  CK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT,
                              1, &alpha));
  CK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT,
                              1, &beta));
  CK(cudnnBackendFinalize(op));
  cudnnBackendDescriptor_t graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  CK(cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                              1, &op));
  CK(cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1,
                              &handle));
  CK(cudnnBackendFinalize(graph));
  std::printf("conv fwd %s N=%lld C=%lld %lldx%lld K=%lld %lldx%lld stride %lld pad %lld\n",
              argv[10], (long long)n, (long long)c, (long long)h, (long long)w, (long long)k,
              (long long)r, (long long)s, (long long)st, (long long)pad);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  const struct {
    const char* name;
    cudnnBackendHeurMode_t mode;
  } sources[] = {
      {"A", CUDNN_HEUR_MODE_A}, {"B", CUDNN_HEUR_MODE_B}, {"fallback", CUDNN_HEUR_MODE_FALLBACK}};
  for (const auto& src : sources) {
    std::vector<cudnnBackendDescriptor_t> cfgs = configs(graph, src.mode);
    std::printf("-- source %s: %zu configurations\n", src.name, cfgs.size());
    int rank = 0;
    for (cudnnBackendDescriptor_t cfg : cfgs) {
      ++rank;
      cudnnBackendDescriptor_t engine = make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
      int64_t got = 0, gidx = -1;
      CK(cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                  1, &got, &engine));
      cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got,
                               &gidx);
      cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
      int64_t nn = 0;
      cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn, notes);
      std::string note_s;
      bool filtered = false;
      for (int64_t i = 0; i < nn; ++i) {
        note_s += std::to_string(static_cast<int>(notes[i])) + ",";
        if (notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION) filtered = true;
        if (f32 && (notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE ||
                    notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS))
          filtered = true;
      }
      std::vector<cudnnBackendDescriptor_t> knobs(CUDNN_KNOB_TYPE_COUNTS);
      for (auto& kd : knobs) kd = make(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
      int64_t nk = 0;
      cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, CUDNN_KNOB_TYPE_COUNTS, &nk,
                               knobs.data());
      std::string knob_s;
      for (int64_t i = 0; i < nk; ++i) {
        cudnnBackendKnobType_t kt;
        int64_t kv = 0;
        cudnnBackendGetAttribute(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE,
                                 1, &got, &kt);
        cudnnBackendGetAttribute(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1,
                                 &got, &kv);
        knob_s += "k" + std::to_string(static_cast<int>(kt)) + "=" + std::to_string(kv) + " ";
      }
      cudnnBackendDescriptor_t plan = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                               &handle);
      cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
      if (cudnnBackendFinalize(plan) != CUDNN_STATUS_SUCCESS) {
        std::printf("%-8s %2d eng%-3lld notes[%s] %s plan refused%s\n", src.name, rank,
                    (long long)gidx, note_s.c_str(), knob_s.c_str(), filtered ? " filtered" : "");
        continue;
      }
      int64_t ws = 0;
      cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                               &got, &ws);
      void* work = nullptr;
      if (ws > 0 && cudaMalloc(&work, static_cast<size_t>(ws)) != cudaSuccess) {
        std::printf("%-8s %2d eng%-3lld workspace %lld not allocated\n", src.name, rank,
                    (long long)gidx, (long long)ws);
        continue;
      }
      void* ptrs[3] = {x, wt, y};
      int64_t uids[3] = {1, 2, 3};
      cudnnBackendDescriptor_t pack = make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
      CK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                  3, ptrs));
      CK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3,
                                  uids));
      CK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                                  &work));
      CK(cudnnBackendFinalize(pack));
      bool ok = true;
      for (int i = 0; i < 3 && ok; ++i)
        ok = cudnnBackendExecute(handle, plan, pack) == CUDNN_STATUS_SUCCESS;
      std::vector<float> ms;
      for (int i = 0; i < 20 && ok; ++i) {
        cudaEventRecord(e0);
        ok = cudnnBackendExecute(handle, plan, pack) == CUDNN_STATUS_SUCCESS;
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        ms.push_back(t);
      }
      if (!ok) {
        std::printf("%-8s %2d eng%-3lld execute failed\n", src.name, rank, (long long)gidx);
      } else {
        std::sort(ms.begin(), ms.end());
        const double med = ms[ms.size() / 2];
        std::printf("%-8s %2d eng%-3lld notes[%s] %s ws=%lld %.4f ms %.2f TFLOP/s%s\n", src.name,
                    rank, (long long)gidx, note_s.c_str(), knob_s.c_str(), (long long)ws, med,
                    flops / med / 1e9, filtered ? " filtered" : "");
      }
      if (work) cudaFree(work);
      cudnnBackendDestroyDescriptor(pack);
      cudnnBackendDestroyDescriptor(plan);
    }
  }
  return 0;
}
