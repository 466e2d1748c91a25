// The CPU backend's kernel objects (one per (op, dtype) the families implement), the
// launch-time descriptor checks and the serial thresholds. Which pairs exist is declared to the
// host by the op table in cpu_plugin.cpp, built from kernel_for.
#include "cpu_kernels.hpp"

#include "cpu_nn.hpp"

#include <omp.h>
#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>

namespace bp::cpu {
namespace {

KernelFn family_kernel(Op op, bp_dtype dtype) {
  switch (op) {
    case Op::kFill:
    case Op::kCopy:
    case Op::kCast:
      return copy_family(op, dtype);
    case Op::kSum:
    case Op::kMean:
    case Op::kMax:
    case Op::kSumsq:
    case Op::kNorm:
      return reduction_family(op, dtype);
    case Op::kMatmul:
    case Op::kLinear:
      return matmul_family(op, dtype);
    case Op::kUniform:
    case Op::kNormal:
      return random_family(op, dtype);
    case Op::kConv2d:
    case Op::kConv2dBackwardInput:
    case Op::kConv2dBackwardWeight:
      return conv_family(op, dtype);
    case Op::kMaxPool2d:
    case Op::kMaxPool2dBackward:
    case Op::kAvgPool2d:
    case Op::kAvgPool2dBackward:
    case Op::kAdaptiveAvgPool2d:
    case Op::kAdaptiveAvgPool2dBackward:
      return pool_family(op, dtype);
    case Op::kBatchNorm:
    case Op::kBatchNormBackward:
      return norm_family(op, dtype);
    case Op::kDropout:
    case Op::kMaxDim:
    case Op::kMinDim:
    case Op::kGather:
    case Op::kScatterAdd:
      return index_family(op, dtype);
    case Op::kSoftmax:
    case Op::kLogSoftmax:
    case Op::kSoftmaxBackward:
    case Op::kLogSoftmaxBackward:
      return softmax_family(op, dtype);
    case Op::kLayerNorm:
    case Op::kLayerNormBackward:
    case Op::kGelu:
    case Op::kGeluBackward:
    case Op::kSilu:
    case Op::kSiluBackward:
    case Op::kEmbedding:
    case Op::kEmbeddingBackward:
    case Op::kTriu:
    case Op::kTril:
    case Op::kCumsum:
      return transformer_family(op, dtype);
    case Op::kScaledDotProductAttention:
    case Op::kScaledDotProductAttentionBackward:
      return attention_family(op, dtype);
    case Op::kAdamw:
      return optim_family(op, dtype);
    case Op::kCrossEntropy:
    case Op::kCrossEntropyBackward:
      return loss_family(op, dtype);
    default:
      return elementwise_family(op, dtype);
  }
}

// Every (op, dtype) kernel object; fn is nullptr for the pairs the families lack.
struct Kernels {
  CpuKernel k[kNumOps][BP_DTYPE_COUNT];
  Kernels() {
    for (int o = 0; o < kNumOps; ++o)
      for (int d = 0; d < BP_DTYPE_COUNT; ++d)
        k[o][d] = CpuKernel{static_cast<Op>(o), static_cast<bp_dtype>(d),
                            family_kernel(static_cast<Op>(o), static_cast<bp_dtype>(d))};
  }
};

// Defaults measured with tests/cpu_threshold_bench.cpp on a 16-core Xeon (README.md, "Serial
// thresholds"): where the parallel launch starts to win, and the grain that was fastest.
constexpr int64_t kCheapSerialBelow = 131072;
constexpr Parallelism kDefaults[] = {
    {kCheapSerialBelow, 8192},  // kCheap: elements
    {16384, 4096},              // kTranscendental: elements
    {65536, 32768},             // kReduction: input elements
    {2 << 20, 256 << 10},       // kBytes: bytes
};
static_assert(sizeof(kDefaults) / sizeof(kDefaults[0]) == static_cast<size_t>(Cost::kCount));

Parallelism g_parallelism[] = {kDefaults[0], kDefaults[1], kDefaults[2], kDefaults[3]};

}  // namespace

const CpuKernel* kernel_for(int32_t op, int32_t dtype) {
  static const Kernels kernels;
  if (op < 0 || op >= kNumOps || dtype < 0 || dtype >= BP_DTYPE_COUNT) return nullptr;
  const CpuKernel& k = kernels.k[op][dtype];
  return k.fn ? &k : nullptr;
}

std::string describe(const bp_tensor_desc& t) {
  std::string s = "[";
  const int rank = (t.rank >= 0 && t.rank <= BP_MAX_RANK) ? t.rank : 0;
  for (int d = 0; d < rank; ++d) (s += d ? "," : "") += std::to_string(t.shape[d]);
  s += "] strides [";
  for (int d = 0; d < rank; ++d) (s += d ? "," : "") += std::to_string(t.strides[d]);
  s += "] ";
  s += bp_dtype_name(t.dtype);
  return s;
}

void launch_error(const Launch& l, const std::string& what) {
  bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                bp::sdk::format("cpu:0: %s(%s): %s", op_name(l.kernel.op),
                                bp_dtype_name(l.kernel.dtype), what.c_str()));
}

void check_arity(const Launch& l, int32_t num_inputs, int32_t num_outputs) {
  if (l.num_inputs != num_inputs || l.num_outputs != num_outputs)
    launch_error(l, bp::sdk::format("expects %d input(s) and %d output(s), got %d and %d",
                                    num_inputs, num_outputs, l.num_inputs, l.num_outputs));
}

void check_dtype(const Launch& l, const bp_tensor_desc& t, int32_t dtype, const char* role) {
  if (t.dtype != dtype)
    launch_error(l, bp::sdk::format("%s has dtype %s, expected %s", role, bp_dtype_name(t.dtype),
                                    bp_dtype_name(dtype)));
}

void check_same_shape(const Launch& l, const bp_tensor_desc& t, const bp_tensor_desc& out,
                      const char* role) {
  bool same = t.rank == out.rank;
  for (int d = 0; same && d < t.rank; ++d) same = t.shape[d] == out.shape[d];
  if (!same)
    launch_error(l, bp::sdk::format("%s %s does not match the output %s", role, describe(t).c_str(),
                                    describe(out).c_str()));
}

namespace {
void check_desc(const Launch& l, const bp_tensor_desc& t, const char* kind, int index) {
  if (t.struct_size < sizeof(bp_tensor_desc))
    launch_error(l, bp::sdk::format("%s %d: struct_size %zu is smaller than bp_tensor_desc (%zu)",
                                    kind, index, t.struct_size, sizeof(bp_tensor_desc)));
  if (t.rank < 0 || t.rank > BP_MAX_RANK)
    launch_error(l, bp::sdk::format("%s %d: rank %d outside [0, %d]", kind, index,
                                    static_cast<int>(t.rank), BP_MAX_RANK));
  if (t.dtype < 0 || t.dtype >= BP_DTYPE_COUNT)
    launch_error(l, bp::sdk::format("%s %d: dtype value %d is not a bp_dtype", kind, index,
                                    static_cast<int>(t.dtype)));
  for (int d = 0; d < t.rank; ++d)
    if (t.shape[d] < 0 || t.strides[d] < 0)
      launch_error(l, bp::sdk::format("%s %d: negative size or stride in %s", kind, index,
                                      describe(t).c_str()));
  if (!t.buffer && numel(t) != 0)
    launch_error(l, bp::sdk::format("%s %d: NULL buffer for %s", kind, index, describe(t).c_str()));
}
}  // namespace

void run_kernel(const CpuKernel& kernel, const bp_tensor_desc* inputs, int32_t num_inputs,
                const bp_tensor_desc* outputs, int32_t num_outputs, const bp::sdk::Attrs& attrs) {
  const Launch l{kernel, inputs, num_inputs, outputs, num_outputs, attrs};
  if (num_inputs < 0 || num_outputs < 0 || (num_inputs > 0 && !inputs) ||
      (num_outputs > 0 && !outputs))
    launch_error(l, "invalid tensor arrays");
  for (int32_t i = 0; i < num_inputs; ++i) check_desc(l, inputs[i], "input", i);
  for (int32_t i = 0; i < num_outputs; ++i) check_desc(l, outputs[i], "output", i);
  kernel.fn(l);
}

// Note [OpenMP loops]
//   The kernels' parallel loops run on oneTBB's workers, and oneDNN's convolutions on an
//   OpenMP team of the whole machine (Note [CPU convolution] in cpu_conv.cpp). After a parallel
//   region libgomp's threads busy-wait for the next one (300,000 spins of `pause` by default,
//   milliseconds on a Xeon), and oneTBB workers started meanwhile fight them for the cores:
//   ResNet-18's f32 training step on the GPU machine's 16-core host ran at 113-122 img/s so,
//   against PyTorch's 205-243, whose every loop runs on its one OpenMP team. So a loop that
//   starts within kTeamWarmNs of the last use of the team runs on that team too (its threads
//   are still spinning, so starting them costs nothing), and the next convolution finds them
//   spinning in turn: 256 img/s against PyTorch's 213 in the same run, inference at batch 1
//   3.5 ms against 5.2. Loops in programs that run no convolution (an MLP) stay on oneTBB: with
//   every loop on OpenMP the MLP benchmark's forward pass took 3.1x PyTorch's time on that
//   host instead of 1.03x. Only one thread at a time drives the team (g_team; another host
//   thread, or a oneTBB worker, takes oneTBB's route), and each region uses the whole team (a
//   team that changes size between regions sends libgomp's surplus threads to sleep and wakes
//   them). BACKPLANE_CPU_LOOPS=tbb|openmp (read at init) fixes the choice either way; auto is
//   the default.
namespace {
enum class Loops { kAuto, kTbb, kOpenmp };
Loops g_loops = Loops::kAuto;
std::atomic<bool> g_team{false};
constexpr int64_t kTeamWarmNs = 20'000'000;
std::atomic<int64_t> g_team_used_ns{INT64_MIN / 2};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void note_team_use() {
  g_team_used_ns.store(now_ns(), std::memory_order_relaxed);
}

void configure_loops() {
  const char* env = std::getenv("BACKPLANE_CPU_LOOPS");
  if (!env || !*env || std::strcmp(env, "auto") == 0)
    g_loops = Loops::kAuto;
  else if (std::strcmp(env, "tbb") == 0)
    g_loops = Loops::kTbb;
  else if (std::strcmp(env, "openmp") == 0)
    g_loops = Loops::kOpenmp;
  else
    bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                  bp::sdk::format("cpu: BACKPLANE_CPU_LOOPS='%s' is not 'auto' (the default), "
                                  "'tbb' or 'openmp'",
                                  env));
}

void parallel_for_chunks(int64_t n, int64_t grain, void (*fn)(void* ctx, int64_t, int64_t),
                         void* ctx) {
  const bool openmp = g_loops == Loops::kOpenmp ||
                      (g_loops == Loops::kAuto &&
                       now_ns() - g_team_used_ns.load(std::memory_order_relaxed) < kTeamWarmNs);
  if (openmp && tbb::this_task_arena::current_thread_index() <= 0 && !omp_in_parallel() &&
      !g_team.exchange(true, std::memory_order_acquire)) {
    // oneTBB's worker count, and any limit set on it (a TSan build sets 1: Note [CPU backend
    // under ThreadSanitizer] in cpu_plugin.cpp).
    const int team = static_cast<int>(std::min<size_t>(
        static_cast<size_t>(tbb::this_task_arena::max_concurrency()),
        tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism)));
    const int64_t g = std::max<int64_t>(grain, 1);
    const int64_t pieces = std::min<int64_t>(team, (n + g - 1) / g);
    const int64_t step = (n + pieces - 1) / pieces;
#pragma omp parallel num_threads(team)
    {
      const int64_t b = omp_get_thread_num() * step;
      if (b < n) fn(ctx, b, std::min(n, b + step));
    }
    g_team.store(false, std::memory_order_release);
    note_team_use();
    return;
  }
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, n, static_cast<size_t>(std::max<int64_t>(grain, 1))),
      [fn, ctx](const tbb::blocked_range<int64_t>& r) { fn(ctx, r.begin(), r.end()); });
}

const Parallelism& parallelism(Cost cost) {
  return g_parallelism[static_cast<int>(cost)];
}

void set_parallelism(Cost cost, Parallelism p) {
  p.serial_below = std::max<int64_t>(p.serial_below, 0);
  p.grain = std::max<int64_t>(p.grain, 1);
  g_parallelism[static_cast<int>(cost)] = p;
}

void set_serial_threshold(int64_t cheap_elements) {
  const int64_t n = std::max<int64_t>(cheap_elements, 1);
  for (int c = 0; c < static_cast<int>(Cost::kCount); ++c) {
    const int64_t serial = std::max<int64_t>(n * kDefaults[c].serial_below / kCheapSerialBelow, 1);
    set_parallelism(static_cast<Cost>(c), {serial, std::max<int64_t>(serial / 2, 1)});
  }
}

bool env_switch(const char* var, const char* usual, const char* other) {
  const char* env = std::getenv(var);
  if (!env || !*env || std::strcmp(env, usual) == 0) return false;
  if (std::strcmp(env, other) == 0) return true;
  bp::sdk::fail(
      BP_ERROR_INVALID_ARGUMENT,
      bp::sdk::format("cpu: %s='%s' is not '%s' (the default) or '%s'", var, env, usual, other));
}

void configure_thresholds_from_environment() {
  const char* env = std::getenv("BACKPLANE_CPU_SERIAL_THRESHOLD");
  if (!env || !*env) return;
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  if (*end != '\0' || v <= 0)
    bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                  bp::sdk::format("cpu: BACKPLANE_CPU_SERIAL_THRESHOLD='%s' is not a positive "
                                  "integer (elements)",
                                  env));
  set_serial_threshold(v);
}

}  // namespace bp::cpu
