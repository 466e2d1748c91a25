// fill, copy and cast kernels, and the byte copies behind the plugin's memcpy/memset slots.
#include "cpu_kernels.hpp"
#include "cpu_strided.hpp"
#include "cpu_types.hpp"

#include <algorithm>
#include <cstring>

namespace bp::cpu {

void parallel_memcpy(void* dst, const void* src, uint64_t size) {
  if (size == 0 || dst == src) return;
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  parallel_for_range(static_cast<int64_t>(size), Cost::kBytes,
                     [&](int64_t b, int64_t e) { std::memcpy(d + b, s + b, e - b); });
}

void parallel_memset(void* dst, int value, uint64_t size) {
  if (size == 0) return;
  char* d = static_cast<char*>(dst);
  parallel_for_range(static_cast<int64_t>(size), Cost::kBytes,
                     [&](int64_t b, int64_t e) { std::memset(d + b, value, e - b); });
}

namespace {

// ---- fill ----------------------------------------------------------------------------------

template <class T>
void fill_kernel(const Launch& l) {
  check_arity(l, 0, 1);
  const bp_tensor_desc& out = l.outputs[0];
  check_dtype(l, out, DType<T>::id, "output");
  const bp_attr* a = l.attrs.find(BP_ATTR_ID_VALUE);
  if (!a) launch_error(l, "missing attribute 'value'");
  // An INT value stays exact for integer dtypes (i64 beyond 2^53).
  const T v = a->kind == BP_ATTR_INT ? convert<T>(a->i) : convert<T>(a->f);
  if (numel(out) == 0) return;
  T* o = data<T>(out);
  const bp_tensor_desc* ts[1] = {&out};
  const Layout<1> lay = make_layout<1>(ts);
  const int64_t so = lay.inner(0);
  parallel_rows(lay, Cost::kCheap, [&](const int64_t* off, int64_t n) {
    T* p = o + off[0];
    if (so == 1) {
      std::fill_n(p, n, v);
    } else {
      for (int64_t i = 0; i < n; ++i) p[i * so] = v;
    }
  });
}

// ---- copy (and cast to the same dtype) -------------------------------------------------------

// Copies a strided view element by element; U is an unsigned integer of the element size.
template <class U>
void copy_strided(const bp_tensor_desc& in, const bp_tensor_desc& out) {
  const bp_tensor_desc* ts[2] = {&out, &in};
  const Layout<2> lay = make_layout<2>(ts);
  const size_t size = sizeof(U);
  char* o = data<char>(out);
  const char* a = data<const char>(in);
  if (lay.rank == 1 && lay.inner(0) == 1 && lay.inner(1) == 1) {
    parallel_memcpy(o, a, static_cast<uint64_t>(lay.numel) * size);
    return;
  }
  U* po = reinterpret_cast<U*>(o);
  const U* pa = reinterpret_cast<const U*>(a);
  const int64_t so = lay.inner(0), sa = lay.inner(1);
  parallel_rows(lay, Cost::kCheap, [&](const int64_t* off, int64_t n) {
    U* q = po + off[0];
    const U* p = pa + off[1];
    if (so == 1 && sa == 1) {
      std::memcpy(q, p, static_cast<size_t>(n) * size);
    } else if (so == 1 && sa == 0) {
      std::fill_n(q, n, *p);
    } else if (so == 1) {
      for (int64_t i = 0; i < n; ++i) q[i] = p[i * sa];
    } else {
      for (int64_t i = 0; i < n; ++i) q[i * so] = p[i * sa];
    }
  });
}

template <size_t kSize>
struct UnsignedOf;
template <>
struct UnsignedOf<1> {
  using type = uint8_t;
};
template <>
struct UnsignedOf<2> {
  using type = uint16_t;
};
template <>
struct UnsignedOf<4> {
  using type = uint32_t;
};
template <>
struct UnsignedOf<8> {
  using type = uint64_t;
};

template <class T>
void copy_kernel(const Launch& l) {
  check_arity(l, 1, 1);
  const bp_tensor_desc &in = l.inputs[0], &out = l.outputs[0];
  check_dtype(l, in, DType<T>::id, "input 0");
  check_dtype(l, out, DType<T>::id, "output");
  check_same_shape(l, in, out, "input 0");
  if (numel(out) == 0) return;
  copy_strided<typename UnsignedOf<sizeof(T)>::type>(in, out);
}

// ---- cast ----------------------------------------------------------------------------------

template <class Src, class Dst>
void cast_strided(const bp_tensor_desc& in, const bp_tensor_desc& out) {
  const bp_tensor_desc* ts[2] = {&out, &in};
  const Layout<2> lay = make_layout<2>(ts);
  Dst* po = data<Dst>(out);
  const Src* pa = data<const Src>(in);
  const int64_t so = lay.inner(0), sa = lay.inner(1);
  parallel_rows(lay, Cost::kCheap, [&](const int64_t* off, int64_t n) {
    Dst* q = po + off[0];
    const Src* p = pa + off[1];
    if (so == 1 && sa == 1) {
      for (int64_t i = 0; i < n; ++i) q[i] = convert<Dst>(DType<Src>::load(p[i]));
    } else {
      for (int64_t i = 0; i < n; ++i) q[i * so] = convert<Dst>(DType<Src>::load(p[i * sa]));
    }
  });
}

template <class Src>
void cast_kernel(const Launch& l) {
  check_arity(l, 1, 1);
  const bp_tensor_desc &in = l.inputs[0], &out = l.outputs[0];
  check_dtype(l, in, DType<Src>::id, "input 0");
  check_same_shape(l, in, out, "input 0");
  if (numel(out) == 0) return;
  visit_dtype(static_cast<bp_dtype>(out.dtype), [&]<class Dst>() {
    if constexpr (std::is_same_v<Src, Dst>) {
      copy_strided<typename UnsignedOf<sizeof(Src)>::type>(in, out);
    } else {
      cast_strided<Src, Dst>(in, out);
    }
  });
}

}  // namespace

KernelFn copy_family(Op op, bp_dtype dtype) {
  return visit_dtype(dtype, [&]<class T>() -> KernelFn {
    switch (op) {
      case Op::kFill:
        return &fill_kernel<T>;
      case Op::kCopy:
        return &copy_kernel<T>;
      case Op::kCast:
        return &cast_kernel<T>;
      default:
        return nullptr;
    }
  });
}

}  // namespace bp::cpu
