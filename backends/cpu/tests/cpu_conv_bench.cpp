// Times conv2d and its two backward ops at ResNet-18 shapes (batch 32 by default), calling the
// kernels directly. Not a test: run it by hand; BACKPLANE_CPU_CONV_LAYOUT=plain|blocked picks
// the layouts (Note [CPU convolution layouts] in cpu_conv.cpp).
//
// Usage: cpu_conv_bench [batch (default 32)] [repetitions (default 5)] [dtype f32|bf16|f16|f64]
#include "../cpu_kernels.hpp"

#include <backplane/abi/plugin_abi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

struct Buffer {
  std::vector<unsigned char> bytes;
  bp_tensor_desc desc{};
};

Buffer make(bp_dtype dtype, std::vector<int64_t> shape, std::mt19937& rng) {
  Buffer b;
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  b.bytes.resize(static_cast<size_t>(n) * bp_dtype_size(dtype) + 64);
  b.desc.struct_size = sizeof(bp_tensor_desc);
  b.desc.buffer = reinterpret_cast<bp_buffer*>(b.bytes.data());
  b.desc.dtype = dtype;
  b.desc.rank = static_cast<int32_t>(shape.size());
  int64_t stride = 1;
  for (int d = b.desc.rank - 1; d >= 0; --d) {
    b.desc.shape[d] = shape[static_cast<size_t>(d)];
    b.desc.strides[d] = stride;
    stride *= shape[static_cast<size_t>(d)];
  }
  // Small random bit patterns of the dtype's width: values are irrelevant to the timing, but
  // zeros and denormals are avoided (every byte from 0x30..0x3f).
  std::uniform_int_distribution<int> byte(0x30, 0x3f);
  for (auto& c : b.bytes) c = static_cast<unsigned char>(byte(rng));
  return b;
}

bp_attr attr(const char* name, int64_t v) {
  bp_attr a{};
  a.struct_size = sizeof(a);
  a.name = name;
  a.kind = BP_ATTR_INT;
  a.i = v;
  a.id = bp_attr_id_from_name(name);
  return a;
}

double median_ms(const char* op, bp_dtype dtype, const std::vector<bp_tensor_desc>& in,
                 const bp_tensor_desc& out, const std::vector<bp_attr>& attrs, int reps) {
  const bp::cpu::CpuKernel* k =
      bp::cpu::kernel_for(bp_op_from_name(op), static_cast<int32_t>(dtype));
  if (!k) {
    std::fprintf(stderr, "no kernel %s(%s)\n", op, bp_dtype_name(dtype));
    std::exit(1);
  }
  const bp::sdk::Attrs a(attrs.data(), static_cast<int32_t>(attrs.size()));
  std::vector<double> t;
  for (int r = 0; r < reps + 2; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    bp::cpu::run_kernel(*k, in.data(), static_cast<int32_t>(in.size()), &out, 1, a);
    const auto t1 = std::chrono::steady_clock::now();
    if (r >= 2) t.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t batch = argc > 1 ? std::atoll(argv[1]) : 32;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  const std::string dname = argc > 3 ? argv[3] : "f32";
  const bp_dtype dtype = dname == "bf16"  ? BP_DTYPE_BF16
                         : dname == "f16" ? BP_DTYPE_F16
                         : dname == "f64" ? BP_DTYPE_F64
                                          : BP_DTYPE_F32;
  const char* layout = std::getenv("BACKPLANE_CPU_CONV_LAYOUT");
  bp::cpu::configure_matmul();
  struct Shape {
    int64_t C, H, K, stride;
  };
  std::mt19937 rng(1);
  std::printf("conv2d %s, batch %lld, layout %s, median of %d (ms)\n", bp_dtype_name(dtype),
              static_cast<long long>(batch), layout ? layout : "default", reps);
  std::printf("| shape | forward | backward input | backward weight |\n|---|---|---|---|\n");
  for (const Shape& s : {Shape{64, 32, 64, 1}, Shape{128, 16, 128, 1}, Shape{128, 16, 256, 2}}) {
    const int64_t P = (s.H + 2 - 3) / s.stride + 1;
    Buffer x = make(dtype, {batch, s.C, s.H, s.H}, rng);
    Buffer w = make(dtype, {s.K, s.C, 3, 3}, rng);
    Buffer y = make(dtype, {batch, s.K, P, P}, rng);
    Buffer dy = make(dtype, {batch, s.K, P, P}, rng);
    Buffer dx = make(dtype, {batch, s.C, s.H, s.H}, rng);
    Buffer dw = make(dtype, {s.K, s.C, 3, 3}, rng);
    const std::vector<bp_attr> attrs = {attr("stride_h", s.stride), attr("stride_w", s.stride),
                                        attr("pad_h", 1), attr("pad_w", 1)};
    const double f = median_ms("conv2d", dtype, {x.desc, w.desc}, y.desc, attrs, reps);
    const double bi =
        median_ms("conv2d_backward_input", dtype, {dy.desc, w.desc}, dx.desc, attrs, reps);
    const double bw =
        median_ms("conv2d_backward_weight", dtype, {x.desc, dy.desc}, dw.desc, attrs, reps);
    std::printf("| %lldx%lldx%lld -> %lldx%lldx%lld 3x3 s%lld | %.2f | %.2f | %.2f |\n",
                static_cast<long long>(s.C), static_cast<long long>(s.H),
                static_cast<long long>(s.H), static_cast<long long>(s.K), static_cast<long long>(P),
                static_cast<long long>(P), static_cast<long long>(s.stride), f, bi, bw);
  }
  return 0;
}
