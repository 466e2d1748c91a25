// fill, copy and cast for all eight dtypes. fill and copy move bits, so they are instantiated
// per element size; cast converts per (input, output) dtype pair following Note [CUDA
// conversions]. A dense copy is one cudaMemcpyAsync; a fill whose bytes are all equal (zero
// in particular) on a dense output is one cudaMemsetAsync.
#include "cuda_elementwise.cuh"

#include <backplane/abi/half.h>

#include <cstring>

namespace bp::cuda {
namespace {

template <class U>
struct FillF {
  static constexpr int kArity = 0;
  using Out = U;
  using In0 = None;
  using In1 = None;
  using In2 = None;
  U value;
  __device__ U operator()() const { return value; }
};

template <class U>
struct CopyF {
  static constexpr int kArity = 1;
  using Out = U;
  using In0 = U;
  using In1 = None;
  using In2 = None;
  __device__ U operator()(U x) const { return x; }
};

template <class SIn, class SOut>
struct CastF {
  static constexpr int kArity = 1;
  using Out = SOut;
  using In0 = SIn;
  using In1 = None;
  using In2 = None;
  __device__ SOut operator()(SIn x) const { return convert<SOut>(load(x)); }
};

// The bits of `value` (an INT attribute when is_int, else a FLOAT) stored as dtype `dtype`,
// converted as the cast op would (Note [CUDA conversions]).
uint64_t fill_bits(int32_t dtype, bool is_int, int64_t i, double v) {
  auto as_int = [&]() -> int64_t { return is_int ? i : float_to_int64(v); };
  auto as_float = [&]() -> float { return is_int ? static_cast<float>(i) : static_cast<float>(v); };
  uint64_t bits = 0;
  switch (dtype) {
    case BP_DTYPE_F32: {
      const float f = as_float();
      std::memcpy(&bits, &f, sizeof f);
      break;
    }
    case BP_DTYPE_F64: {
      const double d = is_int ? static_cast<double>(i) : v;
      std::memcpy(&bits, &d, sizeof d);
      break;
    }
    case BP_DTYPE_F16:
      bits = bp_float_to_f16(as_float());
      break;
    case BP_DTYPE_BF16:
      bits = bp_float_to_bf16(as_float());
      break;
    case BP_DTYPE_I32:
      bits = static_cast<uint32_t>(static_cast<int32_t>(as_int()));
      break;
    case BP_DTYPE_I64:
      bits = static_cast<uint64_t>(as_int());
      break;
    case BP_DTYPE_U8:
      bits = static_cast<uint8_t>(as_int());
      break;
    case BP_DTYPE_BOOL:
      bits = (is_int ? i != 0 : v != 0.0) ? 1 : 0;
      break;
    default:
      invalid("fill: unknown dtype");
  }
  return bits;
}

// Writes the element bit pattern `bits` to every element of `out`.
template <class U>
void fill_with(const LaunchArgs& a, const bp_tensor_desc& out, U bits) {
  const int64_t n = numel(out);
  if (n == 0) return;
  const bp_tensor_desc* t[1] = {&out};
  const Plan<1> plan = make_plan<1>(t);
  if (plan.contiguous()) {
    unsigned char bytes[sizeof(U)];
    std::memcpy(bytes, &bits, sizeof(U));
    bool uniform = true;
    for (size_t k = 1; k < sizeof(U); ++k) uniform = uniform && bytes[k] == bytes[0];
    if (uniform) {
      BP_CUDA_CHECK(cudaMemsetAsync(data_ptr<U>(out), bytes[0], static_cast<size_t>(n) * sizeof(U),
                                    a.stream));
      return;
    }
  }
  run_elementwise(a, FillF<U>{bits}, t);
}

void fill_dispatch(const LaunchArgs& a, const bp_tensor_desc& out, uint64_t bits) {
  switch (bp_dtype_size(out.dtype)) {
    case 1:
      fill_with<uint8_t>(a, out, static_cast<uint8_t>(bits));
      break;
    case 2:
      fill_with<uint16_t>(a, out, static_cast<uint16_t>(bits));
      break;
    case 4:
      fill_with<uint32_t>(a, out, static_cast<uint32_t>(bits));
      break;
    case 8:
      fill_with<uint64_t>(a, out, bits);
      break;
    default:
      invalid("fill: unknown dtype");
  }
}

template <int D>
void launch_fill(const LaunchArgs& a) {
  check_arity(a, 0, 1);
  check_desc(a.out[0], D, "output");
  const bp_attr* value = a.attrs->find(BP_ATTR_ID_VALUE);
  if (!value) invalid("fill needs attr 'value'");
  fill_dispatch(a, a.out[0], fill_bits(D, value->kind == BP_ATTR_INT, value->i, value->f));
}

// Note [Wide strided copies]
//   A strided copy whose innermost plan dimension is dense on both sides (a transpose that
//   keeps the last dimension, as attention's [B, T, H, D] <-> [B, H, T, D], or a write into a
//   slice of a wider row) moves words W of 16, 8 or 4 bytes instead of elements: the plan is
//   re-expressed with W as the element (innermost size divided by W / elem, every other stride
//   too), which needs that size and those strides divisible and both pointers aligned to W.
//   Each thread then moves 16 bytes with one offset computation instead of eight 2-byte
//   elements with eight. The widest W that fits is taken; otherwise the element copy runs.
template <class W>
bool copy_wide(const LaunchArgs& a, const bp_tensor_desc& out, const bp_tensor_desc& in,
               const Plan<2>& plan, size_t elem) {
  if (elem >= sizeof(W) || plan.rank < 2) return false;
  const int64_t k = static_cast<int64_t>(sizeof(W) / elem);
  if (plan.stride[0][0] != 1 || plan.stride[1][0] != 1 || plan.size[0] % k != 0) return false;
  for (int d = 1; d < plan.rank; ++d)
    if (plan.stride[0][d] % k != 0 || plan.stride[1][d] % k != 0) return false;
  if (!aligned_to(data_ptr<const void>(out), sizeof(W)) ||
      !aligned_to(data_ptr<const void>(in), sizeof(W)))
    return false;
  bp_tensor_desc o = out, i = in;  // the plan in row-major order, words as elements
  o.rank = i.rank = plan.rank;
  for (int d = 0; d < plan.rank; ++d) {
    const int r = plan.rank - 1 - d;
    o.shape[r] = i.shape[r] = d == 0 ? plan.size[0] / k : plan.size[d];
    o.strides[r] = d == 0 ? 1 : plan.stride[0][d] / k;
    i.strides[r] = d == 0 ? 1 : plan.stride[1][d] / k;
  }
  const bp_tensor_desc* t[2] = {&o, &i};
  run_elementwise(a, CopyF<W>{}, t);
  return true;
}

// Copies `in` to `out` (same dtype and shape, any strides).
template <class U>
void copy_elements(const LaunchArgs& a, const bp_tensor_desc& out, const bp_tensor_desc& in) {
  const int64_t n = numel(out);
  if (n == 0) return;
  const bp_tensor_desc* t[2] = {&out, &in};
  const Plan<2> plan = make_plan<2>(t);
  if (plan.contiguous()) {
    BP_CUDA_CHECK(cudaMemcpyAsync(data_ptr<U>(out), data_ptr<const U>(in),
                                  static_cast<size_t>(n) * sizeof(U), cudaMemcpyDeviceToDevice,
                                  a.stream));
    return;
  }
  // Note [Wide strided copies]
  if (copy_wide<uint4>(a, out, in, plan, sizeof(U)) ||
      copy_wide<uint2>(a, out, in, plan, sizeof(U)) ||
      copy_wide<uint32_t>(a, out, in, plan, sizeof(U)))
    return;
  run_elementwise(a, CopyF<U>{}, t);
}

void copy_dispatch(const LaunchArgs& a, const bp_tensor_desc& out, const bp_tensor_desc& in) {
  switch (bp_dtype_size(in.dtype)) {
    case 1:
      copy_elements<uint8_t>(a, out, in);
      break;
    case 2:
      copy_elements<uint16_t>(a, out, in);
      break;
    case 4:
      copy_elements<uint32_t>(a, out, in);
      break;
    case 8:
      copy_elements<uint64_t>(a, out, in);
      break;
    default:
      invalid("copy: unknown dtype");
  }
}

template <int D>
void launch_copy(const LaunchArgs& a) {
  check_arity(a, 1, 1);
  const bp_tensor_desc* t[2] = {&a.out[0], &a.in[0]};
  const int32_t dt[2] = {D, D};
  check_elementwise(t, 2, dt);
  copy_dispatch(a, a.out[0], a.in[0]);
}

template <int DIn, int DOut>
void cast_pair(const LaunchArgs& a) {
  const bp_tensor_desc* t[2] = {&a.out[0], &a.in[0]};
  run_elementwise(a, CastF<storage_t<DIn>, storage_t<DOut>>{}, t);
}

template <int DIn>
void launch_cast(const LaunchArgs& a) {
  check_arity(a, 1, 1);
  const int32_t out_dtype = a.out[0].dtype;
  if (out_dtype < 0 || out_dtype >= BP_DTYPE_COUNT)
    invalid(bp::sdk::format("cast: unknown output dtype %d", out_dtype));
  const bp_tensor_desc* t[2] = {&a.out[0], &a.in[0]};
  const int32_t dt[2] = {out_dtype, DIn};
  check_elementwise(t, 2, dt);
  if (out_dtype == DIn) {
    copy_dispatch(a, a.out[0], a.in[0]);
    return;
  }
  switch (out_dtype) {
    case BP_DTYPE_F32:
      cast_pair<DIn, BP_DTYPE_F32>(a);
      break;
    case BP_DTYPE_F64:
      cast_pair<DIn, BP_DTYPE_F64>(a);
      break;
    case BP_DTYPE_F16:
      cast_pair<DIn, BP_DTYPE_F16>(a);
      break;
    case BP_DTYPE_BF16:
      cast_pair<DIn, BP_DTYPE_BF16>(a);
      break;
    case BP_DTYPE_I32:
      cast_pair<DIn, BP_DTYPE_I32>(a);
      break;
    case BP_DTYPE_I64:
      cast_pair<DIn, BP_DTYPE_I64>(a);
      break;
    case BP_DTYPE_U8:
      cast_pair<DIn, BP_DTYPE_U8>(a);
      break;
    case BP_DTYPE_BOOL:
      cast_pair<DIn, BP_DTYPE_BOOL>(a);
      break;
    default:
      break;
  }
}

template <int D>
LaunchFn layout_for(Op op) {
  switch (op) {
    case Op::kFill:
      return &launch_fill<D>;
    case Op::kCopy:
      return &launch_copy<D>;
    case Op::kCast:
      return &launch_cast<D>;
    default:
      return nullptr;
  }
}

}  // namespace

LaunchFn layout_fn(Op op, int32_t dtype) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return layout_for<BP_DTYPE_F32>(op);
    case BP_DTYPE_F64:
      return layout_for<BP_DTYPE_F64>(op);
    case BP_DTYPE_F16:
      return layout_for<BP_DTYPE_F16>(op);
    case BP_DTYPE_BF16:
      return layout_for<BP_DTYPE_BF16>(op);
    case BP_DTYPE_I32:
      return layout_for<BP_DTYPE_I32>(op);
    case BP_DTYPE_I64:
      return layout_for<BP_DTYPE_I64>(op);
    case BP_DTYPE_U8:
      return layout_for<BP_DTYPE_U8>(op);
    case BP_DTYPE_BOOL:
      return layout_for<BP_DTYPE_BOOL>(op);
    default:
      return nullptr;
  }
}

void fill_tensor(const LaunchArgs& a, const bp_tensor_desc& out, double value) {
  fill_dispatch(a, out, fill_bits(out.dtype, false, 0, value));
}

}  // namespace bp::cuda
