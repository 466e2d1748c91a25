// Indexing ops of the convolutional family: max_dim and min_dim (values and I64 positions
// along an axis), gather, scatter_add, and dropout (the Philox mask of Note [Philox stream]).
//
// Note [CPU deterministic scatter_add]
//   The catalogue fixes the order of the contributions to one element: row-major order of src.
//   Two positions of src can only reach the same element of out when they agree on every
//   coordinate but the axis, so the kernel splits the work by those coordinates ([outer, inner]
//   of src around the axis) and walks the axis in order inside each task: every element of out
//   receives its additions in src's row-major order on one thread, whatever the thread count,
//   and no atomics are needed. Each addition rounds to the dtype (f16/bf16 in f32, then stored),
//   exactly as `out[j] += src[i]` reads.
#include "cpu_nn.hpp"

#include <backplane/abi/philox.h>

#include <tbb/blocked_range.h>
#include <tbb/parallel_reduce.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace bp::cpu {
namespace {

template <class C>
bool is_nan(C v) {
  if constexpr (std::is_floating_point_v<C>)
    return std::isnan(v);
  else
    return false;
}

// ---- max_dim / min_dim --------------------------------------------------------------------

// True when v should replace the current extreme `best` (the first NaN wins, then strict order
// so the first position of the extreme is kept).
template <bool kMax, class C>
bool better(C v, C best) {
  if (is_nan(best)) return false;
  if (is_nan(v)) return true;
  return kMax ? v > best : v < best;
}

template <class T, bool kMax>
void extreme_dim_kernel(const Launch& l) {
  using C = compute_t<T>;
  check_arity(l, 1, 2);
  const bp_tensor_desc& x = l.inputs[0];
  const bp_tensor_desc& vals = l.outputs[0];
  const bp_tensor_desc& idx = l.outputs[1];
  const int rank = x.rank;
  const int axis = read_axis(l, rank);
  check_dense(l, x, rank, DType<T>::id, "input");
  check_dense(l, vals, rank, DType<T>::id, "values");
  check_dense(l, idx, rank, BP_DTYPE_I64, "indices");
  if (rank == 0) {  // a scalar is its own extreme, at position 0
    data<T>(vals)[0] = data<T>(x)[0];
    data<int64_t>(idx)[0] = 0;
    return;
  }
  for (int d = 0; d < rank; ++d) {
    const int64_t want = d == axis ? 1 : x.shape[d];
    if (vals.shape[d] != want || idx.shape[d] != want)
      launch_error(l, bp::sdk::format("values %s and indices %s must have the input's shape %s "
                                      "with size 1 along axis %d",
                                      describe(vals).c_str(), describe(idx).c_str(),
                                      describe(x).c_str(), axis));
  }
  const AxisView v = axis_view(x, axis);
  if (v.outer * v.inner == 0) return;
  if (v.length == 0)
    launch_error(l, bp::sdk::format("the %s of an empty dimension (axis %d of %s) is undefined",
                                    kMax ? "maximum" : "minimum", axis, describe(x).c_str()));
  const T* px = data<T>(x);
  T* pv = data<T>(vals);
  int64_t* pi = data<int64_t>(idx);
  // Units: one outer row times a block of inner columns, scanned along the axis row by row.
  constexpr int64_t kBlock = 256;
  const int64_t blocks = (v.inner + kBlock - 1) / kBlock;
  parallel_units(v.outer * blocks, v.length * std::min(v.inner, kBlock), Cost::kReduction,
                 [&](int64_t b, int64_t e) {
                   C best[kBlock];
                   int64_t at[kBlock];
                   for (int64_t u = b; u < e; ++u) {
                     const int64_t o = u / blocks, j0 = (u % blocks) * kBlock;
                     const int64_t nj = std::min(kBlock, v.inner - j0);
                     const T* base = px + o * v.length * v.inner + j0;
                     for (int64_t j = 0; j < nj; ++j) {
                       best[j] = DType<T>::load(base[j]);
                       at[j] = 0;
                     }
                     for (int64_t k = 1; k < v.length; ++k) {
                       const T* row = base + k * v.inner;
                       for (int64_t j = 0; j < nj; ++j) {
                         const C c = DType<T>::load(row[j]);
                         if (better<kMax>(c, best[j])) {
                           best[j] = c;
                           at[j] = k;
                         }
                       }
                     }
                     for (int64_t j = 0; j < nj; ++j) {
                       pv[o * v.inner + j0 + j] = DType<T>::store(best[j]);
                       pi[o * v.inner + j0 + j] = at[j];
                     }
                   }
                 });
}

// ---- gather / scatter_add -----------------------------------------------------------------

std::string position(const bp_tensor_desc& t, int64_t flat) {
  std::string s = "[";
  int64_t rest = flat;
  int64_t coords[BP_MAX_RANK] = {};
  for (int d = t.rank - 1; d >= 0; --d) {
    coords[d] = t.shape[d] ? rest % t.shape[d] : 0;
    rest = t.shape[d] ? rest / t.shape[d] : 0;
  }
  for (int d = 0; d < t.rank; ++d) (s += d ? "," : "") += std::to_string(coords[d]);
  return s + "]";
}

// Fails naming the first (row-major) entry of `index` outside [0, size), before any output is
// touched.
void check_indices(const Launch& l, const bp_tensor_desc& index, int axis, int64_t size) {
  const int64_t n = numel(index);
  const int64_t* p = data<int64_t>(index);
  const int64_t none = std::numeric_limits<int64_t>::max();
  const Parallelism& par = parallelism(Cost::kCheap);
  int64_t first = none;
  auto scan = [&](int64_t b, int64_t e, int64_t found) {
    for (int64_t i = b; i < e && i < found; ++i)
      if (p[i] < 0 || p[i] >= size) return i;
    return found;
  };
  if (n < par.serial_below) {
    first = scan(0, n, none);
  } else {
    first = tbb::parallel_reduce(
        tbb::blocked_range<int64_t>(0, n, static_cast<size_t>(par.grain)), none,
        [&](const tbb::blocked_range<int64_t>& r, int64_t found) {
          return std::min(found, scan(r.begin(), r.end(), none));
        },
        [](int64_t a, int64_t b) { return std::min(a, b); });
  }
  if (first != none)
    launch_error(l,
                 bp::sdk::format("index %lld at position %s of index %s is outside [0, %lld), "
                                 "the size of dimension %d",
                                 static_cast<long long>(p[first]), position(index, first).c_str(),
                                 describe(index).c_str(), static_cast<long long>(size), axis));
}

// Requires `small`.shape[d] <= `big`.shape[d] for every d != axis (same rank).
void check_fits(const Launch& l, const bp_tensor_desc& small, const bp_tensor_desc& big, int axis,
                const char* small_role, const char* big_role) {
  bool fits = small.rank == big.rank;
  for (int d = 0; fits && d < small.rank; ++d) fits = d == axis || small.shape[d] <= big.shape[d];
  if (!fits)
    launch_error(l, bp::sdk::format("%s %s must have %s %s's rank and no larger sizes outside "
                                    "axis %d",
                                    small_role, describe(small).c_str(), big_role,
                                    describe(big).c_str(), axis));
}

// Element i of a dense tensor of index's shape maps to x's element with the axis coordinate
// replaced: decomposed as (outer coords, k, inner coords) with x's strides.
struct IndexMap {
  int rank = 0, axis = 0;
  int64_t shape[BP_MAX_RANK] = {};    // index's shape
  int64_t xstride[BP_MAX_RANK] = {};  // the big tensor's dense strides
};
IndexMap index_map(const bp_tensor_desc& index, const bp_tensor_desc& big, int axis) {
  IndexMap m;
  m.rank = index.rank;
  m.axis = axis;
  int64_t s = 1;
  for (int d = big.rank - 1; d >= 0; --d) {
    m.xstride[d] = s;
    s *= big.shape[d];
  }
  for (int d = 0; d < index.rank; ++d) m.shape[d] = index.shape[d];
  return m;
}

template <size_t kSize>
struct Bytes {
  unsigned char b[kSize];
};

// out[i] = x[i with i_axis = index[i]], elements moved as bytes (every dtype).
template <size_t kSize>
void gather_bytes(const Launch& l, int axis) {
  using E = Bytes<kSize>;
  const bp_tensor_desc& x = l.inputs[0];
  const bp_tensor_desc& index = l.inputs[1];
  const bp_tensor_desc& out = l.outputs[0];
  const IndexMap m = index_map(index, x, axis);
  const int64_t n = numel(index);
  const E* px = data<E>(x);
  const int64_t* pi = data<int64_t>(index);
  E* po = data<E>(out);
  const int64_t last = m.shape[m.rank - 1];
  const int64_t rows = last ? n / last : 0;
  parallel_units(rows, last, Cost::kCheap, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      // Offset in x of the row's first element with the axis coordinate 0.
      int64_t rest = r, base = 0;
      for (int d = m.rank - 2; d >= 0; --d) {
        const int64_t c = rest % m.shape[d];
        rest /= m.shape[d];
        if (d != axis) base += c * m.xstride[d];
      }
      const int64_t* ir = pi + r * last;
      E* orow = po + r * last;
      if (axis == m.rank - 1) {
        for (int64_t j = 0; j < last; ++j) orow[j] = px[base + ir[j]];
      } else {
        const int64_t sa = m.xstride[axis], sl = m.xstride[m.rank - 1];
        for (int64_t j = 0; j < last; ++j) orow[j] = px[base + ir[j] * sa + j * sl];
      }
    }
  });
}

template <class T>
void gather_kernel(const Launch& l) {
  check_arity(l, 2, 1);
  const bp_tensor_desc& x = l.inputs[0];
  const bp_tensor_desc& index = l.inputs[1];
  const bp_tensor_desc& out = l.outputs[0];
  const int axis = read_axis(l, x.rank);
  check_dense(l, x, x.rank, DType<T>::id, "input");
  check_dense(l, index, x.rank, BP_DTYPE_I64, "index");
  check_dense(l, out, x.rank, DType<T>::id, "output");
  check_same_shape(l, index, out, "index");
  check_fits(l, index, x, axis, "index", "the input");
  if (numel(index) == 0) return;
  check_indices(l, index, axis, x.rank ? x.shape[axis] : 1);
  if (x.rank == 0) {
    data<T>(out)[0] = data<T>(x)[0];
    return;
  }
  gather_bytes<sizeof(T)>(l, axis);
}

template <class T>
void scatter_add_kernel(const Launch& l) {
  using C = compute_t<T>;
  check_arity(l, 3, 1);
  const bp_tensor_desc& base = l.inputs[0];
  const bp_tensor_desc& index = l.inputs[1];
  const bp_tensor_desc& src = l.inputs[2];
  const bp_tensor_desc& out = l.outputs[0];
  const int rank = base.rank;
  const int axis = read_axis(l, rank);
  check_dense(l, base, rank, DType<T>::id, "base");
  check_dense(l, index, rank, BP_DTYPE_I64, "index");
  check_dense(l, src, rank, DType<T>::id, "src");
  check_dense(l, out, rank, DType<T>::id, "output");
  check_same_shape(l, base, out, "base");
  check_same_shape(l, src, index, "src");
  check_fits(l, index, out, axis, "index", "the output");
  if (numel(index) != 0) check_indices(l, index, axis, rank ? out.shape[axis] : 1);
  const bool inplace = l.attrs.i(BP_ATTR_ID_INPLACE, 0) != 0 ||
                       (base.buffer == out.buffer && base.offset == out.offset);
  if (!inplace && numel(out) != 0)
    parallel_memcpy(data<T>(out), data<T>(base), static_cast<uint64_t>(numel(out)) * sizeof(T));
  if (numel(index) == 0) return;
  T* po = data<T>(out);
  const T* ps = data<T>(src);
  const int64_t* pi = data<int64_t>(index);
  if (rank == 0) {
    po[0] = DType<T>::store(wrap_add<C>(DType<T>::load(po[0]), DType<T>::load(ps[0])));
    return;
  }
  // Note [CPU deterministic scatter_add]: tasks over (outer, inner) of src, the axis in order.
  const AxisView sv = axis_view(index, axis);
  const IndexMap m = index_map(index, out, axis);
  const int64_t sa = m.xstride[axis];
  std::vector<int64_t> inner_off(static_cast<size_t>(sv.inner));
  for (int64_t j = 0; j < sv.inner; ++j) {
    int64_t off = 0, r2 = j;
    for (int d = rank - 1; d > axis; --d) {
      off += (r2 % m.shape[d]) * m.xstride[d];
      r2 /= m.shape[d];
    }
    inner_off[static_cast<size_t>(j)] = off;
  }
  const int64_t* io = inner_off.data();
  parallel_units(sv.outer, sv.length * sv.inner, Cost::kCheap, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      // out's offset of outer row o (coordinates of index's dims before the axis).
      int64_t rest = o, obase = 0;
      for (int d = axis - 1; d >= 0; --d) {
        obase += (rest % m.shape[d]) * m.xstride[d];
        rest /= m.shape[d];
      }
      for (int64_t k = 0; k < sv.length; ++k) {
        const int64_t* ir = pi + (o * sv.length + k) * sv.inner;
        const T* sr = ps + (o * sv.length + k) * sv.inner;
        for (int64_t j = 0; j < sv.inner; ++j) {
          T& dst = po[obase + ir[j] * sa + io[j]];
          dst = DType<T>::store(wrap_add<C>(DType<T>::load(dst), DType<T>::load(sr[j])));
        }
      }
    }
  });
}

// ---- dropout ------------------------------------------------------------------------------

// Note [CPU dropout]
//   Element i (row-major) is kept when u(seed, offset + i) >= p, u the uniform of Note [Philox
//   stream] (exact in float, compared with p in double, so no rounding of p moves the edge), and
//   then multiplied by scale = 1 / (1 - p), computed in double and rounded once to the compute
//   type (float for f32/f16/bf16), in that type, and rounded to the dtype. Dropped elements are
//   +0 (even for NaN or inf inputs: the mask, not a product, zeroes them).
template <class T>
void dropout_kernel(const Launch& l) {
  using C = compute_t<T>;
  check_arity(l, 1, 1);
  const bp_tensor_desc& x = l.inputs[0];
  const bp_tensor_desc& y = l.outputs[0];
  check_dense(l, x, x.rank, DType<T>::id, "input");
  check_dense(l, y, x.rank, DType<T>::id, "output");
  check_same_shape(l, x, y, "input");
  const double p = l.attrs.f(BP_ATTR_ID_P, 0.5);
  if (!(p >= 0.0 && p < 1.0)) launch_error(l, bp::sdk::format("p = %g is outside [0, 1)", p));
  const uint64_t seed = static_cast<uint64_t>(l.attrs.i(BP_ATTR_ID_SEED, 0));
  const uint64_t offset = static_cast<uint64_t>(l.attrs.i(BP_ATTR_ID_OFFSET, 0));
  const C scale = static_cast<C>(1.0 / (1.0 - p));
  const T* px = data<T>(x);
  T* py = data<T>(y);
  parallel_for_range(numel(x), Cost::kTranscendental, [&](int64_t b, int64_t e) {
    uint64_t cached = ~uint64_t{0};
    bp_philox_words w{};
    for (int64_t i = b; i < e; ++i) {
      const uint64_t g = offset + static_cast<uint64_t>(i);
      if ((g >> 2) != cached) {
        cached = g >> 2;
        w = bp_philox4x32_10(cached, seed);
      }
      const float u = static_cast<float>(w.w[g & 3u] >> 8) * (1.0f / 16777216.0f);
      py[i] = static_cast<double>(u) >= p ? DType<T>::store(DType<T>::load(px[i]) * scale)
                                          : DType<T>::store(C(0));
    }
  });
}

}  // namespace

KernelFn index_family(Op op, bp_dtype dtype) {
  return visit_dtype(dtype, [&]<class T>() -> KernelFn {
    constexpr bool kFloat = is_floating_v<T>;
    constexpr bool kSigned = kFloat || std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>;
    constexpr bool kArith = kSigned || std::is_same_v<T, uint8_t>;
    switch (op) {
      case Op::kMaxDim:
        if constexpr (kSigned) return &extreme_dim_kernel<T, true>;
        break;
      case Op::kMinDim:
        if constexpr (kSigned) return &extreme_dim_kernel<T, false>;
        break;
      case Op::kGather:
        return &gather_kernel<T>;
      case Op::kScatterAdd:
        if constexpr (kArith) return &scatter_add_kernel<T>;
        break;
      case Op::kDropout:
        if constexpr (kFloat) return &dropout_kernel<T>;
        break;
      default:
        break;
    }
    return nullptr;
  });
}

}  // namespace bp::cpu
