// Random numbers: uniform, normal and dropout, following Note [Philox stream] of
// backplane/philox.h exactly. Philox-4x32-10 is transcribed below with the same 32-bit integer
// arithmetic (mul_hi gives the high word), so the words are identical on every device; the uniform
// mapping is exact in float and the program is compiled without FMA contraction, so uniform
// f32 values are bit-identical to the host reference (and f16/bf16 too, being rounded from
// them with half.h's arithmetic). Each work-item produces every element of one Philox counter
// (4 for uniform and dropout, 2 for normal) that falls inside [offset, offset + n).
//
// Note [Dropout mask]
//   dropout keeps element i when the uniform draw u = (w >> 8) * 2^-24 of index offset + i is
//   >= p. The host turns p into the integer threshold ceil(p * 2^24) (exact in double), and the
//   kernel compares w >> 8 with it: the mask is decided in integers, so it is the same bit for
//   bit on every device, with or without doubles (comparing u with p rounded to float would
//   drop a different element where float(p) < p equals some u). Kept elements are scaled by
//   1 / (1 - p), computed in double on the host and applied in the compute type.
#include "opencl_kernels.hpp"

#include <cmath>

namespace bp::opencl {
namespace {

constexpr const char* kPhiloxSource = R"CLC(
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
)CLC";

constexpr const char* kRandomTemplate = R"CLC(
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

constexpr const char* kDropoutSource = R"CLC(
__kernel void bp_dropout(__global T* y, __global const T* x, long y_off, long x_off, ulong seed,
                         ulong offset, uint threshold, A scale, long n) {
  ulong first = offset >> 2, count = ((offset + (ulong)n - 1) >> 2) - first + 1;
  ulong j = get_global_id(0);
  if (j >= count) return;
  ulong c = first + j;
  uint4 w4 = bp_philox4x32_10(c, seed);
  uint w[4] = {w4.x, w4.y, w4.z, w4.w};
  for (int q = 0; q < 4; ++q) {
    ulong g = c * 4 + (ulong)q;
    if (g >= offset && g - offset < (ulong)n) {
      long i = (long)(g - offset);
      A v = (w[q] >> 8) >= threshold ? (A)LD(x[x_off + i]) * scale : (A)0;
      y[y_off + i] = ST(v);
    }
  }
}
)CLC";

[[noreturn]] void bad_launch(const bp_kernel& k, const std::string& why) {
  sdk::fail(BP_ERROR_INVALID_ARGUMENT,
            sdk::format("opencl: %s: %s", op_label(k).c_str(), why.c_str()));
}

}  // namespace

const char* philox_source() {
  return kPhiloxSource;
}

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
  s += kPhiloxSource;
  s += kRandomTemplate;
  s += kDropoutSource;
  return s;
}

void create_random_kernels(bp_kernel& k, cl_program program) {
  const char* name = k.op == Op::kUniform  ? "bp_uniform"
                     : k.op == Op::kNormal ? "bp_normal"
                                           : "bp_dropout";
  cl_kernel kernel = create_kernel(k, program, name);
  k.kernels = {kernel};
  k.local_size = {pick_local_size(kernel, *k.device, 256)};
}

namespace {

void launch_dropout(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc& x,
                    const bp_tensor_desc& y, const sdk::Attrs& attrs) {
  const int64_t x_off = dense_offset(k, x, k.dtype, -1, "input 0 (x)");
  const int64_t y_off = dense_offset(k, y, k.dtype, x.rank, "output");
  check_same_shape(k, x, y, "input 0 (x)");
  const double p = attrs.f(BP_ATTR_ID_P, 0.5);
  if (!(p >= 0.0 && p < 1.0)) bad_launch(k, sdk::format("p = %g is outside [0, 1)", p));
  const int64_t n = sdk::numel(y);
  if (n == 0) return;
  // Note [Dropout mask]
  const cl_uint threshold = static_cast<cl_uint>(std::ceil(p * 16777216.0));
  const double scale = 1.0 / (1.0 - p);
  const cl_ulong seed = static_cast<cl_ulong>(attrs.i(BP_ATTR_ID_SEED, 0));
  const cl_ulong offset = static_cast<cl_ulong>(attrs.i(BP_ATTR_ID_OFFSET, 0));
  const uint64_t counters = (offset + static_cast<uint64_t>(n) - 1) / 4 - offset / 4 + 1;
  size_t local = k.local_size[0];
  size_t global = grid_size(counters, local);
  std::lock_guard<std::mutex> lock(k.mutex);
  KernelArgs args(k.kernels[0]);
  args.mem(y.buffer).mem(x.buffer).value(static_cast<cl_long>(y_off));
  args.value(static_cast<cl_long>(x_off)).value(seed).value(offset).value(threshold);
  if (k.dtype == BP_DTYPE_F64) {
    args.value(scale);
  } else {
    args.value(static_cast<float>(scale));
  }
  args.value(static_cast<cl_long>(n));
  enqueue_kernel(lc, k, 0, 1, &global, &local);
}

}  // namespace

void launch_random(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in, int32_t num_in,
                   const bp_tensor_desc* out, int32_t num_out, const sdk::Attrs& attrs) {
  if (k.op == Op::kDropout) {
    check_counts(k, num_in, num_out, 1, 1, 1, 1);
    return launch_dropout(k, lc, in[0], out[0], attrs);
  }
  check_counts(k, num_in, num_out, 0, 0, 1, 1);
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
