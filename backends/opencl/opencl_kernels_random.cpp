// Random numbers: uniform and normal, following Note [Philox stream] of backplane/philox.h
// exactly. Philox-4x32-10 is transcribed below with the same 32-bit integer arithmetic
// (mul_hi gives the high word), so the words are identical on every device; the uniform
// mapping is exact in float and the program is compiled without FMA contraction, so uniform
// f32 values are bit-identical to the host reference (and f16/bf16 too, being rounded from
// them with half.h's arithmetic). Each work-item produces every element of one Philox counter
// (4 for uniform, 2 for normal) that falls inside [offset, offset + n).
#include "opencl_kernels.hpp"

namespace bp::opencl {
namespace {

constexpr const char* kRandomTemplate = R"CLC(
uint4 bp_philox4x32_10(ulong counter, ulong seed) {
  uint c0 = (uint)counter, c1 = (uint)(counter >> 32), c2 = 0, c3 = 0;
  uint k0 = (uint)seed, k1 = (uint)(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint hi0 = mul_hi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    uint hi1 = mul_hi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    uint n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return (uint4)(c0, c1, c2, c3);
}

__kernel void bp_uniform(__global T* out, long base, ulong seed, ulong offset, A low, A high, long n) {
  ulong first = offset >> 2, count = ((offset + (ulong)n - 1) >> 2) - first + 1;
  ulong j = get_global_id(0);
  if (j >= count) return;
  A span = high - low;
  ulong c = first + j;
  uint4 w4 = bp_philox4x32_10(c, seed);
  uint w[4] = {w4.x, w4.y, w4.z, w4.w};
  for (int q = 0; q < 4; ++q) {
    ulong g = c * 4 + (ulong)q;
    if (g >= offset && g - offset < (ulong)n) {
      float u = (float)(w[q] >> 8) * (1.0f / 16777216.0f);
      A v = low + span * (A)u;
      out[base + (long)(g - offset)] = ST(v);
    }
  }
}

__kernel void bp_normal(__global T* out, long base, ulong seed, ulong offset, A mean, A stdv, long n) {
  ulong first = offset >> 1, count = ((offset + (ulong)n - 1) >> 1) - first + 1;
  ulong j = get_global_id(0);
  if (j >= count) return;
  ulong c = first + j;
  uint4 w = bp_philox4x32_10(c, seed);
  float u1 = (float)((w.x >> 8) + 1u) * (1.0f / 16777216.0f);
  float u2 = (float)(w.y >> 8) * (1.0f / 16777216.0f);
  A r = sqrt(BP_MINUS_TWO * log((A)u1));
  A theta = BP_TWO_PI * (A)u2;
  for (int q = 0; q < 2; ++q) {
    ulong g = c * 2 + (ulong)q;
    if (g >= offset && g - offset < (ulong)n) {
      A z = q == 0 ? r * cos(theta) : r * sin(theta);
      A v = mean + stdv * z;
      out[base + (long)(g - offset)] = ST(v);
    }
  }
}
)CLC";

[[noreturn]] void bad_launch(const bp_kernel& k, const std::string& why) {
  sdk::fail(BP_ERROR_INVALID_ARGUMENT,
            sdk::format("opencl: %s: %s", op_label(k).c_str(), why.c_str()));
}

}  // namespace

std::string random_source(int32_t dtype) {
  bool f64 = dtype == BP_DTYPE_F64;
  std::string s = kernel_prelude(dtype, f64);
  if (f64) {
    s += "#define A double\n#define BP_MINUS_TWO (-2.0)\n"
         "#define BP_TWO_PI 6.283185307179586476925\n";
  } else {
    s += "#define A float\n#define BP_MINUS_TWO (-2.0f)\n"
         "#define BP_TWO_PI 6.283185307179586476925f\n";
  }
  s += kRandomTemplate;
  return s;
}

void create_random_kernels(bp_kernel& k, cl_program program) {
  cl_kernel kernel = create_kernel(k, program, k.op == Op::kUniform ? "bp_uniform" : "bp_normal");
  k.kernels = {kernel};
  k.local_size = {pick_local_size(kernel, *k.device, 256)};
}

void launch_random(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* out,
                   int32_t num_out, const sdk::Attrs& attrs) {
  if (num_out != 1) bad_launch(k, sdk::format("expects 1 output, got %d", num_out));
  const bp_tensor_desc& o = out[0];
  int64_t off = checked_element_offset(k, o, k.dtype, "output");
  if (!sdk::is_contiguous(o))
    bad_launch(k, "the output must be dense (row-major contiguous), got shape " + shape_string(o));
  int64_t n = sdk::numel(o);
  if (n == 0) return;
  bool uniform = k.op == Op::kUniform;
  cl_ulong seed = static_cast<cl_ulong>(attrs.i(BP_ATTR_ID_SEED, 0));
  cl_ulong offset = static_cast<cl_ulong>(attrs.i(BP_ATTR_ID_OFFSET, 0));
  double p0 = uniform ? attrs.f(BP_ATTR_ID_LOW, 0.0) : attrs.f(BP_ATTR_ID_MEAN, 0.0);
  double p1 = uniform ? attrs.f(BP_ATTR_ID_HIGH, 1.0) : attrs.f(BP_ATTR_ID_STD, 1.0);
  uint64_t per_counter = uniform ? 4 : 2;
  uint64_t counters =
      (offset + static_cast<uint64_t>(n) - 1) / per_counter - offset / per_counter + 1;
  size_t local = k.local_size[0];
  size_t global = grid_size(counters, local);

  std::lock_guard<std::mutex> lock(k.mutex);
  KernelArgs args(k.kernels[0]);
  args.mem(o.buffer).value(static_cast<cl_long>(off)).value(seed).value(offset);
  if (k.dtype == BP_DTYPE_F64) {
    args.value(p0).value(p1);
  } else {
    args.value(static_cast<float>(p0)).value(static_cast<float>(p1));
  }
  args.value(static_cast<cl_long>(n));
  enqueue_kernel(lc, k, 0, 1, &global, &local);
}

}  // namespace bp::opencl
