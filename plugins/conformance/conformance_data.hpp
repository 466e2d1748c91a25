// Host-side tensors for the kernel tests: values of any dtype held as doubles, strided views,
// random data, their device mirrors with guard bytes, and the comparison against a float64
// reference (||out - ref|| / ||ref|| with a per-dtype tolerance; integers and bools exact).
#pragma once

#include "conformance_harness.hpp"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace bpc {

bool is_float_dtype(int32_t dt);
// Writes v as element i of a host array of dtype dt (round to nearest for floats, the value
// converted as-is for integers, v != 0 for bool).
void store_value(uint8_t* base, int32_t dt, size_t i, double v);
double load_value(const uint8_t* base, int32_t dt, size_t i);
// v rounded to what dtype dt can hold.
double round_to(int32_t dt, double v);
// Relative-error tolerance of a dtype (Note [Tolerances] in conformance_data.cpp); 0: exact.
double tolerance(int32_t dt, bool matmul = false);

// Deterministic random numbers for one test.
class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  double uniform(double lo, double hi);
  int64_t integer(int64_t lo, int64_t hi);  // inclusive
  bool coin() { return (g_() >> 63) != 0; }

 private:
  std::mt19937_64 g_;
};

// A value distribution for generated inputs.
struct Range {
  double lo = -4, hi = 4;
  bool integral = false;    // draw integers in [lo, hi]
  bool avoid_zero = false;  // |x| >= 0.5 for floats, x != 0 for integers
  bool small_set = false;   // draw from {-3..3} (comparisons need equal values)
};

// A strided tensor on the host: storage values (already rounded to dtype) plus a view.
struct HostTensor {
  int32_t dtype = BP_DTYPE_F32;
  std::vector<int64_t> shape, strides;  // strides in elements; 0 = broadcast
  int64_t offset = 0;                   // view offset into storage, in elements
  std::vector<double> storage;

  int64_t numel() const;
  // Values of the view in row-major order.
  std::vector<double> logical() const;
  std::string describe() const;  // "f32[3,5,7] strides (1,3,15)"
};

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape);
// Storage element offsets of a view's elements, in row-major order of the view.
std::vector<int64_t> view_offsets(const HostTensor& t);
int64_t count(const std::vector<int64_t>& shape);
std::string shape_str(const std::vector<int64_t>& shape);

// A dense tensor of `shape` filled from `r`.
HostTensor random_dense(Rng& rng, int32_t dt, const std::vector<int64_t>& shape, const Range& r);
// A view of `shape` whose storage is laid out in the dimension order `perm` (storage dim k is
// view dim perm[k]): a transposed / permuted view with no unit stride in the last dim.
HostTensor random_permuted(Rng& rng, int32_t dt, const std::vector<int64_t>& shape,
                           const std::vector<int>& perm, const Range& r);
// A view of `shape` broadcast along every dimension where `keep[d]` is false (stride 0).
HostTensor random_broadcast(Rng& rng, int32_t dt, const std::vector<int64_t>& shape,
                            const std::vector<bool>& keep, const Range& r);
// A view of `shape` that is a slice of a larger padded storage (row pitch > row length) that
// starts `offset` elements in.
HostTensor random_padded(Rng& rng, int32_t dt, const std::vector<int64_t>& shape, int64_t pad,
                         int64_t offset, const Range& r);

// A tensor mirrored on the device with guard bytes around its storage.
struct DeviceTensor {
  GuardedBuffer buffer;  // empty when the tensor has no elements
  bp_tensor_desc desc{};
  int32_t dtype = BP_DTYPE_F32;
  std::vector<int64_t> shape;
  int64_t storage_elems = 0;
  int64_t view_offset = 0;  // element offset of the view in storage
};

bp_tensor_desc make_desc(bp_buffer* buf, uint64_t offset_bytes, int32_t dt,
                         const std::vector<int64_t>& shape, const std::vector<int64_t>& strides);
// Uploads a host tensor (its whole storage) and describes its view.
DeviceTensor upload(Context& ctx, const HostTensor& t);
// A dense output of `shape`; its memory holds the guard pattern until a kernel writes it.
DeviceTensor make_output(Context& ctx, int32_t dt, const std::vector<int64_t>& shape);
// Reads a dense tensor back (checking guards) and returns its values in row-major order.
std::vector<double> read_dense(DeviceTensor& t, const std::string& what);

// Compares out with ref through the shared comparison (Note [Tolerances]). Floats: NaN/inf must
// match in place, the rest by relative L2 error against tol with the dtype's subnormal floor
// (tol 0: exact); integer and bool dtypes must match exactly. Throws Failure with `what`, the
// error, the worst element and both values.
void expect_close(const std::vector<double>& out, const std::vector<double>& ref, int32_t dt,
                  double tol, const std::string& what);
// Bitwise comparison of two host arrays of dtype dt (uniform must be bit-identical).
void expect_bits(const std::vector<double>& out, const std::vector<double>& ref, int32_t dt,
                 const std::string& what);

}  // namespace bpc
