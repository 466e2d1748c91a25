// Reductions: sum, mean, max, sumsq, norm over any set of dimensions.
//
// Note [CPU reduction plan]
//   The input's dimensions split into kept ones (out.shape[d] == in.shape[d]) and reduced ones
//   (out.shape[d] == 1 != in.shape[d]); each group is coalesced separately (cpu_strided.hpp).
//   Two loop orders cover every case:
//   - inner reduction, when the reduced group has the input's smallest stride (whole-tensor and
//     last-axis reductions among them): each output element reduces its reduced rows; a
//     unit-stride row goes through reduce_contig, eight independent accumulators that the
//     compiler vectorises, combined pairwise over blocks, so f64 sums and f16/bf16 sums (in
//     float) keep their accuracy on long rows; dense f32 rows go through vmath::sum (Note [CPU
//     f32 sums]: float blocks of 2048 elements added in double).
//   - outer reduction, when a kept dimension has the smallest stride (sum over dim 0 of a
//     row-major matrix): a tile of up to kTile outputs keeps its accumulators in an array and
//     the loop adds whole contiguous input rows into it, again a vectorisable loop.
//   Parallelism is over outputs when there are enough of them; otherwise the reduced range is
//   split with tbb::parallel_deterministic_reduce, so results do not change from run to run.
//   Accumulators: sum/mean of f32 and f64 in double (dense f32 rows through vmath::sum, float
//   blocks added in double), of f16/bf16 in float; sums of i32/i64
//   wrap in 64 bits; max compares in the compute type and propagates NaN.
#include "cpu_kernels.hpp"
#include "cpu_strided.hpp"
#include "cpu_types.hpp"
#include "cpu_vmath.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_reduce.h>
#include <tbb/task_arena.h>

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace bp::cpu {
namespace {

template <class T>
using sum_acc_t =
    std::conditional_t<std::is_same_v<compute_t<T>, float> && !std::is_same_v<T, float>, float,
                       std::conditional_t<is_floating_v<T>, double, uint64_t>>;

template <class T>
struct SumR {
  using Acc = sum_acc_t<T>;
  static Acc init() { return Acc(0); }
  static Acc load(T x) {
    if constexpr (std::is_integral_v<Acc>) {
      return static_cast<Acc>(static_cast<int64_t>(DType<T>::load(x)));
    } else {
      return static_cast<Acc>(DType<T>::load(x));
    }
  }
  static Acc combine(Acc a, Acc b) { return a + b; }
  static T finish(Acc a, int64_t) {
    if constexpr (std::is_integral_v<Acc>) {
      return convert<T>(static_cast<int64_t>(a));
    } else {
      return DType<T>::store(static_cast<compute_t<T>>(a));
    }
  }
};

template <class T>
struct MeanR : SumR<T> {
  using Acc = sum_acc_t<T>;
  static T finish(Acc a, int64_t n) {
    if (n == 0) return DType<T>::store(std::numeric_limits<compute_t<T>>::quiet_NaN());
    return DType<T>::store(static_cast<compute_t<T>>(a / static_cast<Acc>(n)));
  }
};

// Note [One-pass norms]: sumsq squares each element as it is loaded into the accumulator
// (double for f32/f64, float for f16/bf16) and norm takes the square root of that sum when the
// output is stored, so both read the input once.
template <class T>
struct SumSqR : SumR<T> {
  using Acc = sum_acc_t<T>;
  static Acc load(T x) {
    const Acc v = static_cast<Acc>(DType<T>::load(x));
    return v * v;
  }
};

template <class T>
struct NormR : SumSqR<T> {
  using Acc = sum_acc_t<T>;
  static T finish(Acc a, int64_t) {
    return DType<T>::store(static_cast<compute_t<T>>(std::sqrt(a)));
  }
};

template <class T>
struct MaxR {
  using Acc = compute_t<T>;
  static Acc init() {
    if constexpr (std::is_floating_point_v<Acc>) {
      return -std::numeric_limits<Acc>::infinity();
    } else {
      return std::numeric_limits<Acc>::lowest();
    }
  }
  static Acc load(T x) { return DType<T>::load(x); }
  static Acc combine(Acc a, Acc b) { return (a > b || a != a) ? a : b; }
  static T finish(Acc a, int64_t) { return DType<T>::store(a); }
};

constexpr int64_t kLanes = 8;
constexpr int64_t kPairwiseBlock = 4096;
constexpr int64_t kTile = 512;

// Reduces n contiguous elements: kLanes accumulators, blocks combined pairwise.
template <class R, class T>
typename R::Acc reduce_contig(const T* p, int64_t n) {
  using Acc = typename R::Acc;
  if constexpr (std::is_same_v<T, float> && std::is_base_of_v<SumSqR<float>, R>) {
    return vmath::sum_of_squares(p, n);  // vectorised past the baseline ISA
  } else if constexpr (std::is_same_v<T, float> && std::is_base_of_v<SumR<float>, R>) {
    return vmath::sum(p, n);  // (Note [CPU vector math])
  }
  if (n > kPairwiseBlock) {
    const int64_t half = (n / 2 + kLanes - 1) / kLanes * kLanes;
    return R::combine(reduce_contig<R>(p, half), reduce_contig<R>(p + half, n - half));
  }
  Acc lane[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) lane[j] = R::init();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) lane[j] = R::combine(lane[j], R::load(p[i + j]));
  for (; i < n; ++i) lane[0] = R::combine(lane[0], R::load(p[i]));
  for (int64_t w = kLanes / 2; w > 0; w /= 2)
    for (int64_t j = 0; j < w; ++j) lane[j] = R::combine(lane[j], lane[j + w]);
  return lane[0];
}

template <class R, class T>
typename R::Acc reduce_strided(const T* p, int64_t n, int64_t stride) {
  typename R::Acc acc = R::init();
  for (int64_t i = 0; i < n; ++i) acc = R::combine(acc, R::load(p[i * stride]));
  return acc;
}

// The split of Note [CPU reduction plan].
struct Plan {
  Layout<2> kept;     // operands: 0 = output, 1 = input
  Layout<1> reduced;  // operand 0 = input
  int kept_dims = 0, reduced_dims = 0;
  int64_t nk = 1, nr = 1;
};

Plan make_plan(const Launch& l, const bp_tensor_desc& in, const bp_tensor_desc& out) {
  if (out.rank != in.rank)
    launch_error(l, bp::sdk::format("output rank %d differs from the input's %s",
                                    static_cast<int>(out.rank), describe(in).c_str()));
  int64_t ks[BP_MAX_RANK], kin[BP_MAX_RANK], kout[BP_MAX_RANK], rs[BP_MAX_RANK], rin[BP_MAX_RANK];
  int nk = 0, nr = 0;
  Plan p;
  for (int d = 0; d < in.rank; ++d) {
    if (out.shape[d] == in.shape[d]) {
      ks[nk] = in.shape[d];
      kin[nk] = in.strides[d];
      kout[nk] = out.strides[d];
      p.kept_dims += in.shape[d] != 1;
      ++nk;
    } else if (out.shape[d] == 1) {
      rs[nr] = in.shape[d];
      rin[nr] = in.strides[d];
      ++p.reduced_dims;
      ++nr;
    } else {
      launch_error(l, bp::sdk::format("output %s is not a reduction of the input %s",
                                      describe(out).c_str(), describe(in).c_str()));
    }
  }
  const int64_t* kst[2] = {kout, kin};
  const int64_t* rst[1] = {rin};
  p.kept = make_layout<2>(nk, ks, kst);
  p.reduced = make_layout<1>(nr, rs, rst);
  p.nk = p.kept.numel;
  p.nr = p.reduced.numel;
  return p;
}

// Reduces the input elements [rb, re) (row-major over the reduced group) starting at `base`.
template <class R, class T>
typename R::Acc reduce_range(const T* in, int64_t base, const Layout<1>& rl, int64_t rb,
                             int64_t re) {
  typename R::Acc acc = R::init();
  const int64_t s = rl.inner(0);
  for_each_row(rl, rb, re, [&](const int64_t* off, int64_t n) {
    const T* p = in + base + off[0];
    acc = R::combine(acc, s == 1 ? reduce_contig<R>(p, n) : reduce_strided<R>(p, n, s));
  });
  return acc;
}

// Adds the reduced elements [rb, re) of kept outputs [kb, ke) into acc[0, ke - kb).
template <class R, class T>
void accumulate_tile(const T* in, const Plan& p, int64_t kb, int64_t ke, int64_t rb, int64_t re,
                     typename R::Acc* acc) {
  const int64_t sk = p.kept.inner(1);
  const int64_t sr = p.reduced.inner(0);
  for_each_row(p.reduced, rb, re, [&](const int64_t* roff, int64_t rn) {
    for (int64_t r = 0; r < rn; ++r) {
      const T* base = in + roff[0] + r * sr;
      int64_t pos = 0;
      for_each_row(p.kept, kb, ke, [&](const int64_t* koff, int64_t m) {
        const T* q = base + koff[1];
        typename R::Acc* a = acc + pos;
        if (sk == 1) {
          for (int64_t j = 0; j < m; ++j) a[j] = R::combine(a[j], R::load(q[j]));
        } else {
          for (int64_t j = 0; j < m; ++j) a[j] = R::combine(a[j], R::load(q[j * sk]));
        }
        pos += m;
      });
    }
  });
}

// Stores finished accumulators of kept outputs [kb, ke).
template <class R, class T>
void store_tile(T* out, const Plan& p, int64_t kb, int64_t ke, const typename R::Acc* acc) {
  const int64_t so = p.kept.inner(0);
  int64_t pos = 0;
  for_each_row(p.kept, kb, ke, [&](const int64_t* koff, int64_t m) {
    for (int64_t j = 0; j < m; ++j) out[koff[0] + j * so] = R::finish(acc[pos + j], p.nr);
    pos += m;
  });
}

template <class R, class T>
void reduce_inner(const T* in, T* out, const Plan& p, const Parallelism& pol, int concurrency) {
  using Acc = typename R::Acc;
  const int64_t so = p.kept.inner(0), si = p.kept.inner(1);
  const bool serial = p.nk * p.nr < pol.serial_below;
  if (serial || p.nk >= 2 * concurrency) {
    const int64_t grain = std::max<int64_t>(pol.grain / p.nr, 1);  // in outputs
    parallel_for_range(p.nk, serial ? p.nk + 1 : 0, grain, [&](int64_t kb, int64_t ke) {
      for_each_row(p.kept, kb, ke, [&](const int64_t* koff, int64_t m) {
        for (int64_t j = 0; j < m; ++j)
          out[koff[0] + j * so] =
              R::finish(reduce_range<R>(in, koff[1] + j * si, p.reduced, 0, p.nr), p.nr);
      });
    });
    return;
  }
  // Few outputs, long reductions: split each reduction across threads, in about eight pieces
  // per thread (never below the measured grain): a 2^26-element sum in 32K-element leaves spent
  // a quarter of its time creating and joining oneTBB tasks on the 16-thread host. The split
  // depends only on the size and the thread count, so results do not change from run to run.
  const size_t grain = static_cast<size_t>(
      std::max<int64_t>({pol.grain, (p.nr + 8 * concurrency - 1) / (8 * concurrency), 1}));
  for_each_row(p.kept, 0, p.nk, [&](const int64_t* koff, int64_t m) {
    for (int64_t j = 0; j < m; ++j) {
      const int64_t base = koff[1] + j * si;
      const Acc acc = tbb::parallel_deterministic_reduce(
          tbb::blocked_range<int64_t>(0, p.nr, grain), R::init(),
          [&](const tbb::blocked_range<int64_t>& r, Acc a) {
            return R::combine(a, reduce_range<R>(in, base, p.reduced, r.begin(), r.end()));
          },
          [](Acc a, Acc b) { return R::combine(a, b); });
      out[koff[0] + j * so] = R::finish(acc, p.nr);
    }
  });
}

template <class R, class T>
void reduce_outer(const T* in, T* out, const Plan& p, const Parallelism& pol, int concurrency) {
  using Acc = typename R::Acc;
  const int64_t tiles = (p.nk + kTile - 1) / kTile;
  const bool serial = p.nk * p.nr < pol.serial_below;
  if (serial || tiles >= 2 * concurrency) {
    const int64_t grain = std::max<int64_t>(pol.grain / (kTile * p.nr), 1);  // in tiles
    parallel_for_range(tiles, serial ? tiles + 1 : 0, grain, [&](int64_t tb, int64_t te) {
      Acc acc[kTile];
      for (int64_t t = tb; t < te; ++t) {
        const int64_t kb = t * kTile, ke = std::min(p.nk, kb + kTile);
        for (int64_t j = 0; j < ke - kb; ++j) acc[j] = R::init();
        accumulate_tile<R>(in, p, kb, ke, 0, p.nr, acc);
        store_tile<R>(out, p, kb, ke, acc);
      }
    });
    return;
  }
  // Few outputs, long reductions: split the reduced range, one accumulator tile per task.
  const size_t grain =
      static_cast<size_t>(std::max<int64_t>(pol.grain / std::min<int64_t>(p.nk, kTile), 1));
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t kb = t * kTile, ke = std::min(p.nk, kb + kTile);
    const std::vector<Acc> acc = tbb::parallel_deterministic_reduce(
        tbb::blocked_range<int64_t>(0, p.nr, grain), std::vector<Acc>(ke - kb, R::init()),
        [&](const tbb::blocked_range<int64_t>& r, std::vector<Acc> a) {
          accumulate_tile<R>(in, p, kb, ke, r.begin(), r.end(), a.data());
          return a;
        },
        [](std::vector<Acc> a, const std::vector<Acc>& b) {
          for (size_t j = 0; j < a.size(); ++j) a[j] = R::combine(a[j], b[j]);
          return a;
        });
    store_tile<R>(out, p, kb, ke, acc.data());
  }
}

template <class T, template <class> class RT>
void reduction_kernel(const Launch& l) {
  using R = RT<T>;
  check_arity(l, 1, 1);
  const bp_tensor_desc &in = l.inputs[0], &out = l.outputs[0];
  check_dtype(l, in, DType<T>::id, "input 0");
  check_dtype(l, out, DType<T>::id, "output");
  const Plan p = make_plan(l, in, out);
  if (p.nk == 0) return;
  T* po = data<T>(out);
  if (p.nr == 0) {
    if constexpr (std::is_same_v<R, MaxR<T>>)
      launch_error(l, bp::sdk::format("the max of zero elements is undefined (input %s)",
                                      describe(in).c_str()));
    const T v = R::finish(R::init(), 0);
    const bp_tensor_desc* ts[1] = {&out};
    const Layout<1> lay = make_layout<1>(ts);
    parallel_rows(lay, Cost::kCheap, [&](const int64_t* off, int64_t n) {
      for (int64_t i = 0; i < n; ++i) po[off[0] + i * lay.inner(0)] = v;
    });
    return;
  }
  const T* pi = data<const T>(in);
  const int concurrency = tbb::this_task_arena::max_concurrency();
  const Parallelism& pol = parallelism(Cost::kReduction);
  const bool inner =
      p.kept_dims == 0 || (p.reduced_dims > 0 && p.reduced.inner(0) <= p.kept.inner(1));
  if (inner) {
    reduce_inner<R>(pi, po, p, pol, concurrency);
  } else {
    reduce_outer<R>(pi, po, p, pol, concurrency);
  }
}

}  // namespace

KernelFn reduction_family(Op op, bp_dtype dtype) {
  return visit_dtype(dtype, [&]<class T>() -> KernelFn {
    constexpr bool kSummable = !std::is_same_v<T, uint8_t> && !std::is_same_v<T, boolean>;
    if constexpr (kSummable) {
      if (op == Op::kSum) return &reduction_kernel<T, SumR>;
      if (op == Op::kMax) return &reduction_kernel<T, MaxR>;
      if constexpr (is_floating_v<T>)
        if (op == Op::kMean) return &reduction_kernel<T, MeanR>;
      if constexpr (is_floating_v<T>) {
        if (op == Op::kSumsq) return &reduction_kernel<T, SumSqR>;
        if (op == Op::kNorm) return &reduction_kernel<T, NormR>;
      }
    }
    return nullptr;
  });
}

}  // namespace bp::cpu
