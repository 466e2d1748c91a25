// The ops' families, the common OpenCL C prelude and the helpers every family's launch code
// uses.
#include "opencl_allocator.hpp"
#include "opencl_kernels.hpp"

#include <bit>
#include <cmath>
#include <cstring>

namespace bp::opencl {
namespace {

// The family of each catalogue op: which program holds its kernels and which launch code runs.
Family family_of(int32_t op) {
  switch (op) {
    case BP_OP_SUM:
    case BP_OP_MEAN:
    case BP_OP_MAX:
    case BP_OP_SUMSQ:
    case BP_OP_NORM:
      return Family::kReduction;
    case BP_OP_MATMUL:
    case BP_OP_LINEAR:
      return Family::kMatmul;
    case BP_OP_UNIFORM:
    case BP_OP_NORMAL:
    case BP_OP_DROPOUT:
      return Family::kRandom;
    case BP_OP_CONV2D:
    case BP_OP_CONV2D_BACKWARD_INPUT:
    case BP_OP_CONV2D_BACKWARD_WEIGHT:
      return Family::kConv;
    case BP_OP_MAX_POOL2D:
    case BP_OP_MAX_POOL2D_BACKWARD:
    case BP_OP_AVG_POOL2D:
    case BP_OP_AVG_POOL2D_BACKWARD:
    case BP_OP_ADAPTIVE_AVG_POOL2D:
    case BP_OP_ADAPTIVE_AVG_POOL2D_BACKWARD:
      return Family::kPool;
    case BP_OP_BATCH_NORM:
    case BP_OP_BATCH_NORM_BACKWARD:
      return Family::kNorm;
    case BP_OP_MAX_DIM:
    case BP_OP_MIN_DIM:
    case BP_OP_GATHER:
    case BP_OP_SCATTER_ADD:
      return Family::kIndex;
    case BP_OP_SOFTMAX:
    case BP_OP_LOG_SOFTMAX:
    case BP_OP_SOFTMAX_BACKWARD:
    case BP_OP_LOG_SOFTMAX_BACKWARD:
      return Family::kSoftmax;
    case BP_OP_LAYER_NORM:
    case BP_OP_LAYER_NORM_BACKWARD:
    case BP_OP_GELU:
    case BP_OP_GELU_BACKWARD:
    case BP_OP_SILU:
    case BP_OP_SILU_BACKWARD:
    case BP_OP_EMBEDDING:
    case BP_OP_EMBEDDING_BACKWARD:
    case BP_OP_TRIU:
    case BP_OP_TRIL:
    case BP_OP_CUMSUM:
      return Family::kTransformer;
    case BP_OP_SCALED_DOT_PRODUCT_ATTENTION:
    case BP_OP_SCALED_DOT_PRODUCT_ATTENTION_BACKWARD:
      return Family::kAttention;
    case BP_OP_ADAMW:
      return Family::kOptim;
    case BP_OP_CROSS_ENTROPY:
    case BP_OP_CROSS_ENTROPY_BACKWARD:
      return Family::kLoss;
    default:
      return Family::kElementwise;
  }
}

// half.h transcribed to OpenCL C (bit-exact: same integer arithmetic), plus the strided index.
constexpr const char* kPrelude = R"CLC(
#pragma OPENCL FP_CONTRACT OFF

float bp_bf16_to_float(ushort h) { return as_float(((uint)h) << 16); }

ushort bp_float_to_bf16(float f) {
  uint u = as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (ushort)(u >> 16);
}

float bp_f16_to_float(ushort h) {
  uint sign = ((uint)(h & 0x8000u)) << 16;
  uint ex = (h >> 10) & 0x1fu;
  uint man = h & 0x3ffu;
  uint u;
  if (ex == 0) {
    if (man == 0) {
      u = sign;
    } else {
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      u = sign | ((uint)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (ex == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((ex + 127 - 15) << 23) | (man << 13);
  }
  return as_float(u);
}

ushort bp_float_to_f16(float f) {
  uint u = as_uint(f);
  ushort sign = (ushort)((u >> 16) & 0x8000u);
  uint a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (ushort)(sign | 0x7e00u);
  if (a >= 0x477ff000u) return (ushort)(sign | 0x7c00u);
  if (a < 0x38800000u) {
    if (a < 0x33000000u) return sign;
    uint e = a >> 23;
    uint m = (a & 0x7fffffu) | 0x800000u;
    uint shift = 126 - e;
    uint hv = m >> shift;
    uint rem = m & ((1u << shift) - 1u);
    uint mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (hv & 1u))) ++hv;
    return (ushort)(sign | hv);
  }
  uint r = a + 0xfffu + ((a >> 13) & 1u);
  return (ushort)(sign | ((r - 0x38000000u) >> 13));
}

/* Up to four strided tensors over one shape; slot 0 is the output. Mirrors ClIndex. */
typedef struct {
  long shape[8];
  long st[4][8];
  long off[4];
  int rank;
  int small;  /* the element count fits in 31 bits: index arithmetic in 32 bits */
  int contig; /* every tensor is dense: offset + i */
  int pad;
} bp_ix;

/* Element offsets of the four tensors at row-major index i. */
long4 bp_offsets(const bp_ix* ix, long i) {
  long4 o = (long4)(ix->off[0], ix->off[1], ix->off[2], ix->off[3]);
  if (ix->contig) return o + i;
  if (ix->small) {
    uint r = (uint)i;
    for (int d = ix->rank - 1; d >= 0; --d) {
      uint s = (uint)ix->shape[d];
      uint q = d > 0 ? r / s : 0;
      long c = (long)(r - q * s);
      o += c * (long4)(ix->st[0][d], ix->st[1][d], ix->st[2][d], ix->st[3][d]);
      r = q;
    }
    return o;
  }
  long r = i;
  for (int d = ix->rank - 1; d >= 0; --d) {
    long s = ix->shape[d];
    long q = d > 0 ? r / s : 0;
    long c = r - q * s;
    o += c * (long4)(ix->st[0][d], ix->st[1][d], ix->st[2][d], ix->st[3][d]);
    r = q;
  }
  return o;
}

/* One element per work-item (Note [One item per work-item] in opencl_kernels_common.cpp). */
#define BP_ITEM(i, n)        \
  long i = get_global_id(0); \
  if (i >= (n)) return;
)CLC";

}  // namespace

const char* const kNoFp64Reason =
    "this OpenCL device has no double precision (cl_khr_fp64 missing or "
    "CL_DEVICE_DOUBLE_FP_CONFIG is 0)";

const OpInfo& op_info(Op op) {
  // Names and dtype domains are the header's (op_catalogue.h, Note [Dtype domains]).
  static const auto* ops = [] {
    auto* t = new OpInfo[kOpCount];  // lives as long as the plugin
    for (int32_t i = 0; i < kOpCount; ++i) t[i] = {bp_op_name(i), family_of(i), bp_op_domain(i)};
    return t;
  }();
  return ops[static_cast<int32_t>(op)];
}

const char* cl_storage_type(int32_t dtype) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return "float";
    case BP_DTYPE_F64:
      return "double";
    case BP_DTYPE_F16:
    case BP_DTYPE_BF16:
      return "ushort";
    case BP_DTYPE_I32:
      return "int";
    case BP_DTYPE_I64:
      return "long";
    default:
      return "uchar";
  }
}

std::string group_reduce_source() {
  return R"CLC(
#define BP_MAX(a, b) ((isnan(a) || (a) > (b)) ? (a) : (b))

/* Tree combine of the work-group's values (max when is_max, else sum); all work-items get it. */
ACC bp_group_reduce(ACC v, int is_max, __local ACC* scratch) {
  int lid = (int)get_local_id(0), L = (int)get_local_size(0);
  barrier(CLK_LOCAL_MEM_FENCE);
  scratch[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int w = L >> 1; w > 0; w >>= 1) {
    if (lid < w) {
      ACC o = scratch[lid + w];
      scratch[lid] = is_max ? BP_MAX(scratch[lid], o) : scratch[lid] + o;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  return scratch[0];
}
)CLC";
}

std::string kernel_prelude(int32_t dtype, bool fp64) {
  std::string s;
  if (fp64) s += "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n#define BP_FP64 1\n";
  s += kPrelude;
  s += sdk::format("#define T %s\n", cl_storage_type(dtype));
  switch (dtype) {
    case BP_DTYPE_F32:
      s += "#define C float\n#define LD(x) (x)\n#define ST(x) (x)\n#define BP_MULW(a, b) ((a) * "
           "(b))\n";
      break;
    case BP_DTYPE_F64:
      s += "#define C double\n#define LD(x) (x)\n#define ST(x) (x)\n#define BP_MULW(a, b) ((a) * "
           "(b))\n";
      break;
    case BP_DTYPE_F16:
      s += "#define C float\n#define LD(x) bp_f16_to_float(x)\n#define ST(x) bp_float_to_f16(x)\n"
           "#define BP_MULW(a, b) ((a) * (b))\n";
      break;
    case BP_DTYPE_BF16:
      s += "#define C float\n#define LD(x) bp_bf16_to_float(x)\n"
           "#define ST(x) bp_float_to_bf16(x)\n#define BP_MULW(a, b) ((a) * (b))\n";
      break;
    case BP_DTYPE_I32:
      s += "#define C int\n#define UC uint\n#define LD(x) (x)\n#define ST(x) ((int)(x))\n"
           "#define BP_MULW(a, b) ((C)((UC)(a) * (UC)(b)))\n";
      break;
    case BP_DTYPE_I64:
      s += "#define C long\n#define UC ulong\n#define LD(x) (x)\n#define ST(x) ((long)(x))\n"
           "#define BP_MULW(a, b) ((C)((UC)(a) * (UC)(b)))\n";
      break;
    case BP_DTYPE_U8:
      s += "#define C uchar\n#define UC uchar\n#define LD(x) (x)\n#define ST(x) ((uchar)(x))\n"
           "#define BP_MULW(a, b) ((C)((UC)(a) * (UC)(b)))\n";
      break;
    case BP_DTYPE_BOOL:
      s += "#define C uchar\n#define UC uchar\n#define LD(x) ((uchar)((x) != 0))\n"
           "#define ST(x) ((uchar)((x) != 0))\n#define BP_MULW(a, b) ((uchar)((a) && (b)))\n";
      break;
    default:
      break;
  }
  return s;
}

std::string program_source(int32_t dtype, Family family, const DeviceInfo& info) {
  switch (family) {
    case Family::kElementwise:
      return elementwise_source(dtype, info.fp64);
    case Family::kReduction:
      return reduction_source(dtype, info.fp64);
    case Family::kMatmul:
      return matmul_source(dtype, info);
    case Family::kRandom:
      return random_source(dtype);
    case Family::kConv:
      return conv_source(dtype, info);
    case Family::kPool:
      return pool_source(dtype, info.fp64);
    case Family::kNorm:
      return norm_source(dtype, info.fp64);
    case Family::kIndex:
      return index_source(dtype, info.fp64);
    case Family::kSoftmax:
      return softmax_source(dtype, info.fp64);
    case Family::kTransformer:
      return transformer_source(dtype, info.fp64);
    case Family::kAttention:
      return attention_source(dtype, info.fp64);
    case Family::kOptim:
      return optim_source(dtype, info.fp64);
    case Family::kLoss:
      return loss_source(dtype, info.fp64);
  }
  return "";
}

std::string op_label(const bp_kernel& k) {
  return sdk::format("%s %s on %s", op_info(k.op).name, bp_dtype_name(k.dtype),
                     k.device->label().c_str());
}

int64_t checked_element_offset(const bp_kernel& k, const bp_tensor_desc& t, int32_t dtype,
                               const char* role) {
  auto bad = [&](const std::string& why) {
    sdk::fail(BP_ERROR_INVALID_ARGUMENT, sdk::format("opencl: %s: %s %s: %s", op_label(k).c_str(),
                                                     role, shape_string(t).c_str(), why.c_str()));
  };
  if (t.rank < 0 || t.rank > BP_MAX_RANK)
    bad(sdk::format("rank %d is outside 0..%d", t.rank, BP_MAX_RANK));
  if (t.dtype != dtype)
    bad(sdk::format("dtype is %s, expected %s", bp_dtype_name(t.dtype), bp_dtype_name(dtype)));
  int64_t n = 1, last = 0;
  for (int32_t d = 0; d < t.rank; ++d) {
    if (t.shape[d] < 0) bad(sdk::format("negative extent in dimension %d", d));
    if (t.strides[d] < 0) bad(sdk::format("negative stride in dimension %d", d));
    n *= t.shape[d];
  }
  if (n == 0) return 0;
  for (int32_t d = 0; d < t.rank; ++d) last += (t.shape[d] - 1) * t.strides[d];
  size_t esize = bp_dtype_size(dtype);
  if (!t.buffer) bad("buffer is NULL for a non-empty tensor");
  if (t.offset % esize != 0)
    bad(sdk::format("byte offset %llu is not a multiple of the element size %zu",
                    static_cast<unsigned long long>(t.offset), esize));
  int64_t off = static_cast<int64_t>(t.offset / esize);
  uint64_t end_bytes = static_cast<uint64_t>(off + last + 1) * esize;
  if (end_bytes > t.buffer->size)
    bad(sdk::format("reaches byte %llu of a %llu-byte buffer",
                    static_cast<unsigned long long>(end_bytes),
                    static_cast<unsigned long long>(t.buffer->size)));
  return off;
}

void check_same_shape(const bp_kernel& k, const bp_tensor_desc& t, const bp_tensor_desc& ref,
                      const char* role) {
  bool same = t.rank == ref.rank;
  for (int32_t d = 0; same && d < t.rank; ++d) same = t.shape[d] == ref.shape[d];
  if (!same)
    sdk::fail(
        BP_ERROR_INVALID_ARGUMENT,
        sdk::format("opencl: %s: %s has shape %s but the output has shape %s", op_label(k).c_str(),
                    role, shape_string(t).c_str(), shape_string(ref).c_str()));
}

ClIndex make_index(const bp_tensor_desc* const* t, const int64_t* offsets, int32_t count) {
  ClIndex ix{};
  const bp_tensor_desc& ref = *t[0];
  int32_t r = 0;
  for (int32_t d = 0; d < ref.rank; ++d) {
    if (ref.shape[d] == 1) continue;
    bool merge = r > 0;
    for (int32_t j = 0; merge && j < count; ++j)
      merge = ix.st[j][r - 1] == t[j]->strides[d] * ref.shape[d];
    if (merge) {
      ix.shape[r - 1] *= ref.shape[d];
      for (int32_t j = 0; j < count; ++j) ix.st[j][r - 1] = t[j]->strides[d];
    } else {
      ix.shape[r] = ref.shape[d];
      for (int32_t j = 0; j < count; ++j) ix.st[j][r] = t[j]->strides[d];
      ++r;
    }
  }
  ix.rank = r;
  ix.small = sdk::numel(ref) <= INT32_MAX ? 1 : 0;
  bool contig = r == 0 || r == 1;
  for (int32_t j = 0; contig && r == 1 && j < count; ++j) contig = ix.st[j][0] == 1;
  ix.contig = contig ? 1 : 0;
  for (int32_t j = 0; j < count; ++j) ix.off[j] = offsets[j];
  return ix;
}

namespace {
std::string kernel_name(cl_kernel k) {
  char name[256] = {0};
  clGetKernelInfo(k, CL_KERNEL_FUNCTION_NAME, sizeof name - 1, name, nullptr);
  return name;
}
}  // namespace

KernelArgs& KernelArgs::mem(const bp_buffer* b) {
  return mem(b ? b->mem : nullptr);
}

KernelArgs& KernelArgs::mem(cl_mem m) {
  set(sizeof(cl_mem), &m);
  return *this;
}

void KernelArgs::set(size_t size, const void* value) {
  cl_int status = clSetKernelArg(k_, index_, size, value);
  if (status != CL_SUCCESS)
    fail_cl(
        status, "clSetKernelArg",
        sdk::format("kernel %s, argument %u (%zu bytes)", kernel_name(k_).c_str(), index_, size));
  ++index_;
}

// Note [PoCL dlhandle cache]
//   PoCL before 7.0 (Debian 12 ships 3.1) can abort with "pocl_release_dlhandle_cache:
//   Assertion `found->ref_count > 0' failed" when one kernel runs on several queues at once with
//   different grid sizes. Its CPU drivers cache the compiled work-group function per (kernel,
//   local size, grid width, global offset) and count the commands using each item, but the
//   release looks the item up by (kernel, local size) only, so it can decrement another item
//   than the one the command took. Fixed upstream by pocl/pocl commit c9ac4c0c3 ("fix dlhandle
//   cache", June 2024, first released in 7.0), which hands the item itself to the release.
//   bp-conformance's concurrency.threads_roundtrip (four threads, a stream each, add f32 of
//   random sizes) aborted in 2 of 200 runs on a 2-core machine with PoCL 3.1, and on a 16-thread
//   host. The plugin's use is legal OpenCL: kernels and programs live as long as the device,
//   clSetKernelArg and the enqueue of one cl_kernel run under its mutex.
//   On those versions (DeviceInfo::order_kernel_across_queues) every launch of a kernel waits
//   for the kernel's previous launch, on whichever queue it was, through its event wait list,
//   so PoCL never holds two commands of one kernel at once and each release finds its own item.
//   The host does not block, and each launch's queue is flushed so a wait on it makes progress;
//   on one queue the wait changes nothing. A CPU device loses nothing it had: each launch
//   already runs on every core.
void enqueue_kernel(const LaunchContext& lc, bp_kernel& bk, size_t slot, cl_uint dims,
                    const size_t* global, const size_t* local) {
  cl_kernel k = bk.kernels[slot];
  cl_int status;
  if (!lc.device.info().order_kernel_across_queues) {
    status = clEnqueueNDRangeKernel(lc.queue, k, dims, nullptr, global, local, 0, nullptr, nullptr);
  } else {
    if (bk.last_launch.size() < bk.kernels.size()) bk.last_launch.resize(bk.kernels.size());
    cl_event& last = bk.last_launch[slot];
    cl_event done = nullptr;
    status = clEnqueueNDRangeKernel(lc.queue, k, dims, nullptr, global, local, last ? 1 : 0,
                                    last ? &last : nullptr, &done);
    if (status == CL_SUCCESS) {
      if (last) clReleaseEvent(last);
      last = done;
      clFlush(lc.queue);
    }
  }
  if (status != CL_SUCCESS) {
    std::string sizes;
    for (cl_uint d = 0; d < dims; ++d)
      sizes += sdk::format("%s%zu/%zu", d ? " x " : "", global[d], local ? local[d] : 0);
    fail_cl(status, "clEnqueueNDRangeKernel",
            sdk::format("%s: kernel %s, global/local %s", lc.device.label().c_str(),
                        kernel_name(k).c_str(), sizes.c_str()));
  }
}

// Note [One item per work-item]
//   Elementwise, row-reduction and random kernels give each work-item one element (one output,
//   one Philox counter) and launch ceil(n / local) groups, guarding the tail, rather than a
//   grid-stride loop: GPUs do not care, but PoCL's work-group vectoriser does (a grid-stride
//   loop ran 20x slower on PoCL). Dense operands take a branch without index arithmetic
//   (bp_ix.contig), uniform across the launch.
size_t grid_size(uint64_t n, size_t local) {
  uint64_t groups = (n + local - 1) / local;
  if (groups == 0) groups = 1;
  return static_cast<size_t>(groups * local);
}

size_t pick_local_size(cl_kernel k, const Device& d, size_t cap) {
  size_t wg = 0;
  if (clGetKernelWorkGroupInfo(k, d.id(), CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, nullptr) !=
          CL_SUCCESS ||
      wg == 0)
    wg = d.info().max_work_group;
  size_t v = std::min(cap, std::max<size_t>(wg, 1));
  return std::bit_floor(v);
}

cl_kernel create_kernel(const bp_kernel& k, cl_program program, const char* name) {
  cl_int status = CL_SUCCESS;
  cl_kernel kernel = clCreateKernel(program, name, &status);
  if (status != CL_SUCCESS)
    fail_cl(status, "clCreateKernel", sdk::format("%s: kernel %s", op_label(k).c_str(), name));
  return kernel;
}

void fail_launch(const bp_kernel& k, const std::string& why) {
  sdk::fail(BP_ERROR_INVALID_ARGUMENT,
            sdk::format("opencl: %s: %s", op_label(k).c_str(), why.c_str()));
}

void check_counts(const bp_kernel& k, int32_t num_in, int32_t num_out, int32_t min_in,
                  int32_t max_in, int32_t min_out, int32_t max_out) {
  auto range = [](int32_t lo, int32_t hi) {
    return lo == hi ? sdk::format("%d", lo) : sdk::format("%d to %d", lo, hi);
  };
  if (num_in < min_in || num_in > max_in || num_out < min_out || num_out > max_out)
    fail_launch(k, sdk::format("expects %s inputs and %s outputs, got %d and %d",
                               range(min_in, max_in).c_str(), range(min_out, max_out).c_str(),
                               num_in, num_out));
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size())
    s.replace(pos, from.size(), to);
}

int64_t int_attr(const bp_kernel& k, const sdk::Attrs& attrs, bp_attr_id id, int64_t dflt,
                 int64_t least) {
  if (dflt < least && !attrs.has(id))
    fail_launch(k, sdk::format("attribute %s is required", bp_attr_name(id)));
  int64_t v = attrs.i(id, dflt);
  if (v < least)
    fail_launch(k, sdk::format("attribute %s is %lld; it must be at least %lld", bp_attr_name(id),
                               static_cast<long long>(v), static_cast<long long>(least)));
  return v;
}

int64_t dense_offset(const bp_kernel& k, const bp_tensor_desc& t, int32_t dtype, int32_t rank,
                     const char* role) {
  int64_t off = checked_element_offset(k, t, dtype, role);
  if (rank >= 0 && t.rank != rank)
    fail_launch(k, sdk::format("%s %s has rank %d, expected %d", role, shape_string(t).c_str(),
                               t.rank, rank));
  if (!sdk::is_contiguous(t))
    fail_launch(k, sdk::format("%s %s must be dense (row-major contiguous)", role,
                               shape_string(t).c_str()));
  return off;
}

TempBuffer::TempBuffer(const LaunchContext& c, uint64_t bytes) : lc(c) {
  if (bytes) buf = lc.device.allocator().allocate(bytes, lc.stream);
}

TempBuffer::~TempBuffer() {
  if (!buf) return;
  if (!lc.stream) clFinish(lc.queue);  // a stream-less release means "no pending work"
  lc.device.allocator().release(buf, lc.stream);
}

ErrorFlag::ErrorFlag(const bp_kernel& k, const LaunchContext& lc) : flag(lc, sizeof(cl_int)) {
  const cl_int zero = 0;
  BP_CL_CHECK(clEnqueueFillBuffer(lc.queue, flag.buf->mem, &zero, sizeof zero, 0, sizeof zero, 0,
                                  nullptr, nullptr),
              op_label(k) + ": clearing the error flag");
}

bool ErrorFlag::raised(const bp_kernel& k) const {
  cl_int r = 0;
  BP_CL_CHECK(clEnqueueReadBuffer(flag.lc.queue, flag.buf->mem, CL_TRUE, 0, sizeof r, &r, 0,
                                  nullptr, nullptr),
              op_label(k) + ": reading the error flag");
  return r != 0;
}

std::vector<int64_t> read_indices(const bp_kernel& k, const LaunchContext& lc,
                                  const bp_tensor_desc& t, int64_t off, int64_t n) {
  std::vector<int64_t> host(static_cast<size_t>(n));
  if (n > 0)
    BP_CL_CHECK(clEnqueueReadBuffer(lc.queue, t.buffer->mem, CL_TRUE, static_cast<size_t>(off) * 8,
                                    static_cast<size_t>(n) * 8, host.data(), 0, nullptr, nullptr),
                op_label(k) + ": reading the indices");
  return host;
}

int64_t saturate_to_i64(double v) {
  if (std::isnan(v)) return 0;
  if (v >= 9223372036854775807.0) return INT64_MAX;
  if (v <= -9223372036854775808.0) return INT64_MIN;
  return static_cast<int64_t>(v);
}

}  // namespace bp::opencl
