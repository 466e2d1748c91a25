// Reductions: sum, mean, max, sumsq, norm over any set of dimensions (sumsq and norm square
// each element as it is loaded, norm takes the square root on store: one read of the input).
//
// Note [Reduction plan]
//   The host splits the input's dimensions into kept ones (out.shape == a.shape) and reduced
//   ones (out.shape 1, a.shape not 1), merges contiguous runs of each, and describes both in
//   bp_rix. Output o (row-major over kept dims) reduces n_red elements.
//   - Few elements per output (n_red <= 64) or very many outputs: bp_<op>_rows, one work-item
//     per output, summing serially.
//   - Otherwise bp_<op>_tree: n_out * nchunks work-groups; each reduces one chunk of one output
//     with a strided per-thread loop and a local-memory tree. With nchunks > 1 the group
//     results go to a temporary buffer (from the device allocator, freed stream-ordered) and
//     bp_<op>_partials combines them with a second tree.
//   Accuracy: f32/f16/bf16 accumulate in float, f64 in double, each thread with Kahan
//   compensation (guarded against infinities), and threads are combined by trees, so f32
//   sums stay within ~1e-6 relative of a float64 reference. Integer sums accumulate in 64-bit
//   unsigned arithmetic and wrap to the dtype. max propagates NaN. Zero elements: sum 0, mean
//   NaN, max an error.
#include "opencl_allocator.hpp"
#include "opencl_kernels.hpp"

#include <algorithm>
#include <utility>

namespace bp::opencl {
namespace {

constexpr const char* kReductionPrelude = R"CLC(
typedef struct {
  long kshape[8];
  long kin[8];
  long kout[8];
  long rshape[8];
  long rin[8];
  long in_off;
  long out_off;
  long n_out;
  long n_red;
  int krank;
  int rrank;
} bp_rix;

/* (input offset, output offset) of output o. */
long2 bp_kept(const bp_rix* x, long o) {
  long2 r = (long2)(x->in_off, x->out_off);
  long q = o;
  for (int d = x->krank - 1; d >= 0; --d) {
    long s = x->kshape[d];
    long p = d > 0 ? q / s : 0;
    long c = q - p * s;
    r += c * (long2)(x->kin[d], x->kout[d]);
    q = p;
  }
  return r;
}

/* Input offset of reduced element j, relative to the output's base. */
long bp_red(const bp_rix* x, long j) {
  long r = 0, q = j;
  for (int d = x->rrank - 1; d >= 0; --d) {
    long s = x->rshape[d];
    long p = d > 0 ? q / s : 0;
    r += (q - p * s) * x->rin[d];
    q = p;
  }
  return r;
}
)CLC";

constexpr const char* kReductionTemplate = R"CLC(
__kernel void bp_$OP_rows(__global T* out, __global const T* in, bp_rix rx) {
  long o = get_global_id(0);
  if (o >= rx.n_out) return;
  long2 base = bp_kept(&rx, o);
  $ACC s = $INIT, c = 0;
  if (rx.rrank == 1) {
    for (long j = 0; j < rx.n_red; ++j) {
      $ACC v = ($ACC)LD(in[base.x + j * rx.rin[0]]);
      $SQ$ADD;
    }
  } else {
    for (long j = 0; j < rx.n_red; ++j) {
      $ACC v = ($ACC)LD(in[base.x + bp_red(&rx, j)]);
      $SQ$ADD;
    }
  }
  $ACC r = $RES;
  out[base.y] = $FINAL;
}

__kernel void bp_$OP_tree(__global T* out, __global $ACC* partial, __global const T* in,
                          bp_rix rx, long nchunks, long chunk, __local $ACC* scratch) {
  long g = get_group_id(0);
  int lid = (int)get_local_id(0), L = (int)get_local_size(0);
  long o = g / nchunks, ch = g - o * nchunks;
  long2 base = bp_kept(&rx, o);
  long j0 = ch * chunk, j1 = min(j0 + chunk, rx.n_red);
  $ACC s = $INIT, c = 0;
  if (rx.rrank == 1) {
    for (long j = j0 + lid; j < j1; j += L) {
      $ACC v = ($ACC)LD(in[base.x + j * rx.rin[0]]);
      $SQ$ADD;
    }
  } else {
    for (long j = j0 + lid; j < j1; j += L) {
      $ACC v = ($ACC)LD(in[base.x + bp_red(&rx, j)]);
      $SQ$ADD;
    }
  }
  scratch[lid] = $RES;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int w = L >> 1; w > 0; w >>= 1) {
    if (lid < w) scratch[lid] = $COMB(scratch[lid], scratch[lid + w]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0) {
    $ACC r = scratch[0];
    if (nchunks == 1) {
      out[base.y] = $FINAL;
    } else {
      partial[g] = r;
    }
  }
}

__kernel void bp_$OP_partials(__global T* out, __global const $ACC* partial, bp_rix rx,
                              long nchunks, __local $ACC* scratch) {
  long o = get_group_id(0);
  int lid = (int)get_local_id(0), L = (int)get_local_size(0);
  $ACC s = $INIT;
  for (long j = lid; j < nchunks; j += L) s = $COMB(s, partial[o * nchunks + j]);
  scratch[lid] = s;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int w = L >> 1; w > 0; w >>= 1) {
    if (lid < w) scratch[lid] = $COMB(scratch[lid], scratch[lid + w]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0) {
    $ACC r = scratch[0];
    out[bp_kept(&rx, o).y] = $FINAL;
  }
}
)CLC";

// Host mirror of bp_rix.
struct ClReduceIndex {
  int64_t kshape[BP_MAX_RANK];
  int64_t kin[BP_MAX_RANK];
  int64_t kout[BP_MAX_RANK];
  int64_t rshape[BP_MAX_RANK];
  int64_t rin[BP_MAX_RANK];
  int64_t in_off, out_off, n_out, n_red;
  int32_t krank, rrank;
};

const char* acc_type(Op op, int32_t dtype) {
  switch (dtype) {
    case BP_DTYPE_F64:
      return "double";
    case BP_DTYPE_I32:
      return op == Op::kMax ? "int" : "ulong";
    case BP_DTYPE_I64:
      return op == Op::kMax ? "long" : "ulong";
    default:
      return "float";
  }
}

size_t acc_size(Op op, int32_t dtype) {
  std::string t = acc_type(op, dtype);
  return t == "float" || t == "int" ? 4 : 8;
}

std::string reduction_kernels(Op op, int32_t dtype) {
  bool fp = is_floating(dtype);
  bool max = op == Op::kMax;
  const char* init = !max ? "0" : fp ? "-INFINITY" : dtype == BP_DTYPE_I32 ? "INT_MIN" : "LONG_MIN";
  const char* add = max  ? "s = BP_MAX_ACC(s, v)"
                    : fp ? "{ $ACC y_ = v - c; $ACC t_ = s + y_; "
                           "c = isfinite(t_) ? (t_ - s) - y_ : ($ACC)0; s = t_; }"
                         : "s += v";
  const char* res = !max && fp ? "(s - c)" : "s";
  const char* comb = max ? "BP_MAX_ACC" : "BP_ADD_ACC";
  const char* fin = max               ? "ST(r)"
                    : op == Op::kMean ? "ST(rx.n_red ? r / ($ACC)rx.n_red : ($ACC)NAN)"
                    : op == Op::kNorm ? "ST((C)sqrt(r))"
                                      : "ST((C)r)";
  const char* sq = op == Op::kSumsq || op == Op::kNorm ? "v = v * v; " : "";
  std::string s = kReductionTemplate;
  // Placeholders whose text holds $ACC first.
  replace_all(s, "$SQ", sq);
  replace_all(s, "$ADD", add);
  replace_all(s, "$FINAL", fin);
  replace_all(s, "$OP", op_info(op).name);
  replace_all(s, "$ACC", acc_type(op, dtype));
  replace_all(s, "$INIT", init);
  replace_all(s, "$RES", res);
  replace_all(s, "$COMB", comb);
  return s;
}

[[noreturn]] void bad_launch(const bp_kernel& k, const std::string& why) {
  sdk::fail(BP_ERROR_INVALID_ARGUMENT,
            sdk::format("opencl: %s: %s", op_label(k).c_str(), why.c_str()));
}

}  // namespace

std::string reduction_source(int32_t dtype, bool fp64) {
  std::string s = kernel_prelude(dtype, fp64);
  s += kReductionPrelude;
  s += "#define BP_ADD_ACC(a, b) ((a) + (b))\n";
  s += is_floating(dtype) ? "#define BP_MAX_ACC(a, b) ((isnan(a) || (a) > (b)) ? (a) : (b))\n"
                          : "#define BP_MAX_ACC(a, b) max((a), (b))\n";
  for (Op op : {Op::kSum, Op::kMean, Op::kMax, Op::kSumsq, Op::kNorm})
    if ((op_info(op).dtypes >> dtype) & 1u) s += reduction_kernels(op, dtype);
  return s;
}

void create_reduction_kernels(bp_kernel& k, cl_program program) {
  std::string base = std::string("bp_") + op_info(k.op).name;
  for (const char* suffix : {"_rows", "_tree", "_partials"}) {
    cl_kernel kernel = create_kernel(k, program, (base + suffix).c_str());
    k.kernels.push_back(kernel);
    k.local_size.push_back(pick_local_size(kernel, *k.device, 256));
  }
}

void launch_reduction(bp_kernel& k, const LaunchContext& lc, const bp_tensor_desc* in,
                      int32_t num_in, const bp_tensor_desc* out, int32_t num_out) {
  if (num_in != 1 || num_out != 1)
    bad_launch(k, sdk::format("expects 1 input and 1 output, got %d and %d", num_in, num_out));
  const bp_tensor_desc& a = in[0];
  const bp_tensor_desc& o = out[0];
  int64_t in_off = checked_element_offset(k, a, k.dtype, "input 0");
  int64_t out_off = checked_element_offset(k, o, k.dtype, "output");
  if (a.rank != o.rank)
    bad_launch(k, sdk::format("output rank %d differs from input rank %d (input %s, output %s)",
                              o.rank, a.rank, shape_string(a).c_str(), shape_string(o).c_str()));

  ClReduceIndex rx{};
  rx.in_off = in_off;
  rx.out_off = out_off;
  rx.n_out = 1;
  rx.n_red = 1;
  for (int32_t d = 0; d < a.rank; ++d) {
    int64_t s = a.shape[d];
    if (o.shape[d] == s) {
      rx.n_out *= s;
      if (s == 1) continue;
      int32_t r = rx.krank;
      if (r > 0 && rx.kin[r - 1] == a.strides[d] * s && rx.kout[r - 1] == o.strides[d] * s) {
        rx.kshape[r - 1] *= s;
        rx.kin[r - 1] = a.strides[d];
        rx.kout[r - 1] = o.strides[d];
      } else {
        rx.kshape[r] = s;
        rx.kin[r] = a.strides[d];
        rx.kout[r] = o.strides[d];
        ++rx.krank;
      }
    } else if (o.shape[d] == 1) {
      rx.n_red *= s;
      int32_t r = rx.rrank;
      if (r > 0 && rx.rin[r - 1] == a.strides[d] * s) {
        rx.rshape[r - 1] *= s;
        rx.rin[r - 1] = a.strides[d];
      } else {
        rx.rshape[r] = s;
        rx.rin[r] = a.strides[d];
        ++rx.rrank;
      }
    } else {
      bad_launch(k, sdk::format("output dimension %d has extent %lld; it must be 1 (reduced) or "
                                "the input's %lld (input %s, output %s)",
                                d, static_cast<long long>(o.shape[d]), static_cast<long long>(s),
                                shape_string(a).c_str(), shape_string(o).c_str()));
    }
  }
  if (rx.n_out == 0) return;
  if (rx.n_red == 0 && k.op == Op::kMax)
    bad_launch(k, sdk::format("max of zero elements (input %s, output %s)", shape_string(a).c_str(),
                              shape_string(o).c_str()));

  const DeviceInfo& info = lc.device.info();
  if (rx.n_red <= 64 || rx.n_out >= 65536) {
    size_t local = k.local_size[0];
    size_t global = grid_size(static_cast<uint64_t>(rx.n_out), local);
    std::lock_guard<std::mutex> lock(k.mutex);
    KernelArgs(k.kernels[0]).mem(o.buffer).mem(a.buffer).value(rx);
    enqueue_kernel(lc, k, 0, 1, &global, &local);
    return;
  }

  size_t local = k.local_size[1];
  int64_t target_groups = int64_t{info.compute_units ? info.compute_units : 1} * 16;
  int64_t max_chunks =
      (rx.n_red + static_cast<int64_t>(local) * 8 - 1) / (static_cast<int64_t>(local) * 8);
  int64_t nchunks = std::clamp<int64_t>((target_groups + rx.n_out - 1) / rx.n_out, 1,
                                        std::max<int64_t>(max_chunks, 1));
  int64_t chunk = (rx.n_red + nchunks - 1) / nchunks;
  nchunks = (rx.n_red + chunk - 1) / chunk;
  size_t acc = acc_size(k.op, k.dtype);

  TempBuffer partial(lc, nchunks > 1 ? static_cast<uint64_t>(rx.n_out * nchunks) * acc : 0);
  std::lock_guard<std::mutex> lock(k.mutex);
  size_t global = static_cast<size_t>(rx.n_out * nchunks) * local;
  KernelArgs(k.kernels[1])
      .mem(o.buffer)
      .mem(partial.buf)
      .mem(a.buffer)
      .value(rx)
      .value(static_cast<cl_long>(nchunks))
      .value(static_cast<cl_long>(chunk))
      .local(local * acc);
  enqueue_kernel(lc, k, 1, 1, &global, &local);
  if (nchunks > 1) {
    size_t local2 = k.local_size[2];
    size_t global2 = static_cast<size_t>(rx.n_out) * local2;
    KernelArgs(k.kernels[2])
        .mem(o.buffer)
        .mem(partial.buf)
        .value(rx)
        .value(static_cast<cl_long>(nchunks))
        .local(local2 * acc);
    enqueue_kernel(lc, k, 2, 1, &global2, &local2);
  }
}

}  // namespace bp::opencl
