// Strided iteration for the CPU kernels: N operands that share one shape, each with its own
// element strides (0 = broadcast), walked in row-major order of the shape.
//
// make_layout coalesces the shape first (drops size-1 dimensions, merges dimensions that are
// contiguous in every operand), so a dense tensor becomes one dimension and kernels see long
// inner rows. for_each_row hands a kernel one inner row at a time as N element offsets plus a
// count; the kernel's row loop is where vectorisation happens (see Note [Row loops] in
// cpu_elementwise.cpp). parallel_for_range splits a linear range across oneTBB workers.
//
// Note [One parallel_for instantiation]
//   oneTBB's parallel_for is a deep template; instantiated once per kernel body (every
//   elementwise op x dtype x row form), it made cpu_elementwise.cpp alone take minutes to
//   compile. parallel_for_range therefore hands oneTBB a type-erased body (a function pointer
//   and a context; parallel_for_chunks in cpu_kernels.cpp is the one instantiation), which
//   costs one indirect call per chunk of at least `grain` elements. The row loops inside a
//   chunk stay fully inlined.
//
// Internal to backends/cpu; header-only apart from parallel_for_chunks; no shared state.
#ifndef BACKPLANE_CPU_STRIDED_HPP_
#define BACKPLANE_CPU_STRIDED_HPP_

#include "cpu_kernels.hpp"

#include <backplane/abi/plugin_abi.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>

namespace bp::cpu {

// A coalesced iteration space for N operands. rank >= 1; shape[rank-1] is the inner row.
template <int N>
struct Layout {
  int rank = 1;
  int64_t numel = 1;
  int64_t shape[BP_MAX_RANK] = {1};
  int64_t stride[N][BP_MAX_RANK] = {};

  // Inner (row) stride of operand k.
  int64_t inner(int k) const { return stride[k][rank - 1]; }
};

// Builds the layout of `shape` (rank dims) with per-operand strides strides[k][0..rank).
template <int N>
Layout<N> make_layout(int rank, const int64_t* shape, const int64_t* const (&strides)[N]) {
  Layout<N> l;
  l.rank = 0;
  l.numel = 1;
  for (int d = 0; d < rank; ++d) l.numel *= shape[d];
  for (int d = 0; d < rank; ++d) {
    if (shape[d] == 1) continue;
    if (l.rank > 0) {
      bool merge = true;
      for (int k = 0; k < N; ++k)
        if (l.stride[k][l.rank - 1] != shape[d] * strides[k][d]) merge = false;
      if (merge) {
        l.shape[l.rank - 1] *= shape[d];
        for (int k = 0; k < N; ++k) l.stride[k][l.rank - 1] = strides[k][d];
        continue;
      }
    }
    l.shape[l.rank] = shape[d];
    for (int k = 0; k < N; ++k) l.stride[k][l.rank] = strides[k][d];
    ++l.rank;
  }
  if (l.rank == 0) {  // a scalar, or all dimensions of size 1
    l.rank = 1;
    l.shape[0] = l.numel;  // 1, or 0 when some dimension is 0 (never iterated then)
    for (int k = 0; k < N; ++k) l.stride[k][0] = 0;
  }
  return l;
}

// Layout of N descriptors of the same shape (the shape of ts[0]).
template <int N>
Layout<N> make_layout(const bp_tensor_desc* const (&ts)[N]) {
  const int64_t* strides[N];
  for (int k = 0; k < N; ++k) strides[k] = ts[k]->strides;
  const int64_t* const(&s)[N] = strides;
  return make_layout<N>(ts[0]->rank, ts[0]->shape, s);
}

// Calls row(off, count) for the rows covering linear elements [begin, end) in row-major
// order: off[k] is operand k's element offset of the row's first element, the row has `count`
// elements, and consecutive ones are l.inner(k) elements apart in operand k.
template <int N, class Row>
void for_each_row(const Layout<N>& l, int64_t begin, int64_t end, Row&& row) {
  if (begin >= end) return;
  const int r = l.rank;
  const int64_t inner = l.shape[r - 1];
  int64_t idx[BP_MAX_RANK] = {};
  int64_t base[N] = {};
  int64_t rest = begin / inner;
  int64_t i0 = begin % inner;
  for (int d = r - 2; d >= 0; --d) {
    idx[d] = rest % l.shape[d];
    rest /= l.shape[d];
    for (int k = 0; k < N; ++k) base[k] += idx[d] * l.stride[k][d];
  }
  while (begin < end) {
    const int64_t count = std::min(inner - i0, end - begin);
    int64_t off[N];
    for (int k = 0; k < N; ++k) off[k] = base[k] + i0 * l.stride[k][r - 1];
    row(static_cast<const int64_t*>(off), count);
    begin += count;
    i0 = 0;
    for (int d = r - 2; d >= 0; --d) {
      for (int k = 0; k < N; ++k) base[k] += l.stride[k][d];
      if (++idx[d] < l.shape[d]) break;
      for (int k = 0; k < N; ++k) base[k] -= l.shape[d] * l.stride[k][d];
      idx[d] = 0;
    }
  }
}

// Runs body(begin, end) over [0, n): on the calling thread when n < serial_below, else split
// into oneTBB tasks of at least `grain` elements.
// (Note [One parallel_for instantiation]: oneTBB sees only the type-erased form.)
void parallel_for_chunks(int64_t n, int64_t grain, void (*fn)(void* ctx, int64_t, int64_t),
                         void* ctx);

template <class Body>
void parallel_for_range(int64_t n, int64_t serial_below, int64_t grain, Body&& body) {
  if (n <= 0) return;
  if (n < serial_below || n <= grain) {
    body(int64_t{0}, n);
    return;
  }
  using B = std::remove_reference_t<Body>;
  parallel_for_chunks(
      n, grain, [](void* ctx, int64_t b, int64_t e) { (*static_cast<B*>(ctx))(b, e); },
      const_cast<void*>(static_cast<const void*>(std::addressof(body))));
}

// parallel_for_range with the policy of a cost class (Note [CPU serial thresholds]).
template <class Body>
void parallel_for_range(int64_t n, Cost cost, Body&& body) {
  const Parallelism& p = parallelism(cost);
  parallel_for_range(n, p.serial_below, p.grain, body);
}

// for_each_row over the whole layout, split across threads as `cost` says.
template <int N, class Row>
void parallel_rows(const Layout<N>& l, Cost cost, Row&& row) {
  parallel_for_range(l.numel, cost, [&](int64_t b, int64_t e) { for_each_row(l, b, e, row); });
}

}  // namespace bp::cpu

#endif  // BACKPLANE_CPU_STRIDED_HPP_
