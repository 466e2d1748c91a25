#include "conformance_data.hpp"

#include <backplane/abi/half.h>
#include <backplane_test/dtype_io.h>
#include <backplane_test/compare.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace bpc {

bool is_float_dtype(int32_t dt) {
  return dt == BP_DTYPE_F32 || dt == BP_DTYPE_F64 || dt == BP_DTYPE_F16 || dt == BP_DTYPE_BF16;
}

void store_value(uint8_t* base, int32_t dt, size_t i, double v) {
  switch (dt) {
    case BP_DTYPE_F32: {
      float f = static_cast<float>(v);
      std::memcpy(base + 4 * i, &f, 4);
      break;
    }
    case BP_DTYPE_F64:
      std::memcpy(base + 8 * i, &v, 8);
      break;
    case BP_DTYPE_F16: {
      uint16_t h = bp_float_to_f16(static_cast<float>(v));
      std::memcpy(base + 2 * i, &h, 2);
      break;
    }
    case BP_DTYPE_BF16: {
      uint16_t h = bp_float_to_bf16(static_cast<float>(v));
      std::memcpy(base + 2 * i, &h, 2);
      break;
    }
    case BP_DTYPE_I32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(base + 4 * i, &x, 4);
      break;
    }
    case BP_DTYPE_I64: {
      int64_t x = static_cast<int64_t>(v);
      std::memcpy(base + 8 * i, &x, 8);
      break;
    }
    case BP_DTYPE_U8:
      base[i] = static_cast<uint8_t>(static_cast<int64_t>(v));
      break;
    case BP_DTYPE_BOOL:
      base[i] = v != 0.0 ? 1 : 0;
      break;
    default:
      break;
  }
}

double load_value(const uint8_t* base, int32_t dt, size_t i) {
  return bp_load_element(base, dt, i);
}

double round_to(int32_t dt, double v) {
  uint8_t tmp[8];
  store_value(tmp, dt, 0, v);
  return load_value(tmp, dt, 0);
}

// Note [Tolerances]
//   The shared comparison of every Backplane test suite (Note [Tolerance over the whole range]
//   in tests/support/backplane_test/compare.hpp): relative L2 error against each element's
//   scale max(|ref|, smallest normal of the dtype), so results on subnormals are judged by an
//   absolute floor; defaults f32 1e-5 (matmul 1e-4, which leaves room for blocked accumulation
//   orders), f64 1e-12, f16 2e-3, bf16 1e-2; integer and bool results must be exact. The
//   numbers are the one table of tests/support/backplane_test/tolerance.hpp.
double tolerance(int32_t dt, bool matmul) {
  return bp_test::rtol(dt, matmul ? bp_test::OpClass::matmul : bp_test::OpClass::elementwise);
}

double Rng::uniform(double lo, double hi) {
  return std::uniform_real_distribution<double>(lo, hi)(g_);
}

int64_t Rng::integer(int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(g_);
}

namespace {

double draw(Rng& rng, int32_t dt, const Range& r) {
  if (dt == BP_DTYPE_BOOL) return rng.coin() ? 1.0 : 0.0;
  if (r.small_set) {
    double v = static_cast<double>(rng.integer(-3, 3));
    if (dt == BP_DTYPE_U8) v += 3;
    return v;
  }
  if (r.integral || !is_float_dtype(dt)) {
    for (;;) {
      int64_t v = rng.integer(static_cast<int64_t>(std::ceil(r.lo)),
                              static_cast<int64_t>(std::floor(r.hi)));
      if (!r.avoid_zero || v != 0) return static_cast<double>(v);
    }
  }
  for (;;) {
    double v = round_to(dt, rng.uniform(r.lo, r.hi));
    if (!r.avoid_zero || std::fabs(v) >= 0.5) return v;
  }
}

void fill_storage(Rng& rng, HostTensor& t, int64_t n, const Range& r) {
  t.storage.resize(static_cast<size_t>(n));
  for (auto& v : t.storage) v = draw(rng, t.dtype, r);
}

}  // namespace

int64_t count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> st(shape.size());
  int64_t e = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    st[d] = e;
    e *= shape[d];
  }
  return st;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t HostTensor::numel() const {
  return count(shape);
}

std::vector<int64_t> view_offsets(const HostTensor& t) {
  int64_t n = t.numel();
  std::vector<int64_t> out(static_cast<size_t>(n));
  if (n == 0) return out;
  size_t rank = t.shape.size();
  std::vector<int64_t> idx(rank, 0);
  int64_t pos = t.offset;
  for (int64_t i = 0; i < n; ++i) {
    out[static_cast<size_t>(i)] = pos;
    for (size_t d = rank; d-- > 0;) {
      if (++idx[d] < t.shape[d]) {
        pos += t.strides[d];
        break;
      }
      pos -= t.strides[d] * (t.shape[d] - 1);
      idx[d] = 0;
    }
  }
  return out;
}

std::vector<double> HostTensor::logical() const {
  std::vector<int64_t> offs = view_offsets(*this);
  std::vector<double> out(offs.size());
  for (size_t i = 0; i < offs.size(); ++i) out[i] = storage[static_cast<size_t>(offs[i])];
  return out;
}

std::string HostTensor::describe() const {
  std::string s = std::string(bp_dtype_name(dtype)) + shape_str(shape);
  if (strides != contiguous_strides(shape)) s += " strides " + shape_str(strides);
  if (offset) s += " offset " + std::to_string(offset);
  return s;
}

HostTensor random_dense(Rng& rng, int32_t dt, const std::vector<int64_t>& shape, const Range& r) {
  HostTensor t;
  t.dtype = dt;
  t.shape = shape;
  t.strides = contiguous_strides(shape);
  fill_storage(rng, t, count(shape), r);
  return t;
}

HostTensor random_permuted(Rng& rng, int32_t dt, const std::vector<int64_t>& shape,
                           const std::vector<int>& perm, const Range& r) {
  HostTensor t;
  t.dtype = dt;
  t.shape = shape;
  std::vector<int64_t> storage_shape(shape.size());
  for (size_t k = 0; k < perm.size(); ++k) storage_shape[k] = shape[static_cast<size_t>(perm[k])];
  std::vector<int64_t> sst = contiguous_strides(storage_shape);
  t.strides.assign(shape.size(), 0);
  for (size_t k = 0; k < perm.size(); ++k) t.strides[static_cast<size_t>(perm[k])] = sst[k];
  fill_storage(rng, t, count(shape), r);
  return t;
}

HostTensor random_broadcast(Rng& rng, int32_t dt, const std::vector<int64_t>& shape,
                            const std::vector<bool>& keep, const Range& r) {
  HostTensor t;
  t.dtype = dt;
  t.shape = shape;
  std::vector<int64_t> reduced(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) reduced[d] = keep[d] ? shape[d] : 1;
  std::vector<int64_t> st = contiguous_strides(reduced);
  t.strides.resize(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) t.strides[d] = keep[d] ? st[d] : 0;
  fill_storage(rng, t, count(reduced), r);
  return t;
}

HostTensor random_padded(Rng& rng, int32_t dt, const std::vector<int64_t>& shape, int64_t pad,
                         int64_t offset, const Range& r) {
  HostTensor t;
  t.dtype = dt;
  t.shape = shape;
  t.offset = offset;
  std::vector<int64_t> padded = shape;
  if (!padded.empty()) padded.back() += pad;
  t.strides = contiguous_strides(padded);
  fill_storage(rng, t, offset + count(padded), r);
  return t;
}

bp_tensor_desc make_desc(bp_buffer* buf, uint64_t offset_bytes, int32_t dt,
                         const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  bp_tensor_desc d{};
  d.struct_size = sizeof(bp_tensor_desc);
  d.buffer = buf;
  d.offset = offset_bytes;
  d.dtype = dt;
  d.rank = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    d.shape[i] = shape[i];
    d.strides[i] = strides[i];
  }
  return d;
}

DeviceTensor upload(Context& ctx, const HostTensor& t) {
  DeviceTensor d;
  d.dtype = t.dtype;
  d.shape = t.shape;
  d.storage_elems = static_cast<int64_t>(t.storage.size());
  d.view_offset = t.offset;
  size_t es = bp_dtype_size(t.dtype);
  if (t.numel() == 0) {
    d.desc = make_desc(nullptr, 0, t.dtype, t.shape, t.strides);
    return d;
  }
  std::vector<uint8_t> bytes(t.storage.size() * es);
  for (size_t i = 0; i < t.storage.size(); ++i) store_value(bytes.data(), t.dtype, i, t.storage[i]);
  d.buffer = GuardedBuffer(ctx, bytes.size());
  ctx.check(
      ctx.t().copy_h2d(ctx.stream(), d.buffer.get(), d.buffer.offset(), bytes.data(), bytes.size()),
      "copy_h2d (input " + t.describe() + ")");
  ctx.sync(ctx.stream());
  d.desc = make_desc(d.buffer.get(), d.buffer.offset() + static_cast<uint64_t>(t.offset) * es,
                     t.dtype, t.shape, t.strides);
  return d;
}

DeviceTensor make_output(Context& ctx, int32_t dt, const std::vector<int64_t>& shape) {
  DeviceTensor d;
  d.dtype = dt;
  d.shape = shape;
  d.storage_elems = count(shape);
  if (d.storage_elems == 0) {
    d.desc = make_desc(nullptr, 0, dt, shape, contiguous_strides(shape));
    return d;
  }
  d.buffer = GuardedBuffer(ctx, static_cast<uint64_t>(d.storage_elems) * bp_dtype_size(dt));
  d.desc = make_desc(d.buffer.get(), d.buffer.offset(), dt, shape, contiguous_strides(shape));
  return d;
}

std::vector<double> read_dense(DeviceTensor& t, const std::string& what) {
  std::vector<double> out(static_cast<size_t>(t.storage_elems));
  if (t.storage_elems == 0) return out;
  std::vector<uint8_t> bytes = t.buffer.read_checked(what);
  for (size_t i = 0; i < out.size(); ++i) out[i] = load_value(bytes.data(), t.dtype, i);
  return out;
}

namespace {

std::string element_str(const std::vector<double>& out, const std::vector<double>& ref, size_t i) {
  return format("element %zu: got %.9g, expected %.9g", i, out[i], ref[i]);
}

}  // namespace

void expect_close(const std::vector<double>& out, const std::vector<double>& ref, int32_t dt,
                  double tol, const std::string& what) {
  bp_test::Verdict v = bp_test::compare(dt, out, ref, {.rtol = tol});
  if (!v.ok) throw Failure(what + ": " + v.message);
}

void expect_bits(const std::vector<double>& out, const std::vector<double>& ref, int32_t dt,
                 const std::string& what) {
  if (out.size() != ref.size())
    throw Failure(format("%s: %zu values, expected %zu", what.c_str(), out.size(), ref.size()));
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (std::memcmp(&out[i], &ref[i], sizeof(double)) != 0) {
      if (!bad) first = i;
      ++bad;
    }
  }
  if (bad)
    throw Failure(format(
        "%s: %zu of %zu %s values are not bit-identical to the philox.h "
        "reference; first at %s",
        what.c_str(), bad, out.size(), bp_dtype_name(dt), element_str(out, ref, first).c_str()));
}

}  // namespace bpc
