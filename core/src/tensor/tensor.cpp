// Tensor geometry, creation, views and data movement.
#include <backplane/runtime.hpp>
#include <backplane/tensor.hpp>

#include "runtime/interceptor.hpp"
#include "tensor/grad_record.hpp"
#include "tensor/tensor_internal.hpp"
#include "tensor/tensor_sizes.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

namespace bp {

// ---- Dims ------------------------------------------------------------------------------------

namespace {
void check_rank(size_t n) {
  if (n > static_cast<size_t>(kMaxRank))
    throw ShapeError("rank " + std::to_string(n) + " exceeds the maximum of " +
                     std::to_string(kMaxRank));
}
}  // namespace

Dims::Dims(std::initializer_list<int64_t> l)
    : Dims(std::span<const int64_t>(l.begin(), l.size())) {}
Dims::Dims(std::span<const int64_t> s) {
  check_rank(s.size());
  rank = static_cast<int32_t>(s.size());
  for (int i = 0; i < rank; ++i) d[i] = s[i];
}
bool Dims::operator==(const Dims& o) const {
  if (rank != o.rank) return false;
  for (int i = 0; i < rank; ++i)
    if (d[i] != o.d[i]) return false;
  return true;
}
std::string Dims::str() const {
  if (rank == 0) return "scalar";
  std::string s;
  for (int i = 0; i < rank; ++i) {
    if (i) s += 'x';
    s += std::to_string(d[i]);
  }
  return s;
}

namespace detail {

Dims contiguous_strides(const Dims& shape) {
  Dims s;
  s.rank = shape.rank;
  int64_t acc = 1;
  for (int i = shape.rank - 1; i >= 0; --i) {
    s.d[i] = acc;
    acc *= std::max<int64_t>(shape.d[i], 1);
  }
  return s;
}

namespace {
// A contiguous tensor of `shape` over `storage`.
Tensor dense_over(Device& dev, const Dims& shape, DType dtype, std::shared_ptr<Buffer> storage) {
  return make_tensor(std::make_shared<TensorImpl>(std::move(storage), &dev, dtype, shape,
                                                  contiguous_strides(shape)));
}
}  // namespace

Tensor make_empty(Device& dev, const Dims& shape, DType dtype) {
  uint64_t bytes = checked_bytes(shape, dtype, "");  // Note [Checked sizes]
  DeviceState& s = state(dev);
  if (s.interceptor.load(std::memory_order_acquire)) [[unlikely]] {  // Note [Interceptors]
    InterceptorPin p(s);
    if (p)
      if (std::shared_ptr<Buffer> b = p->allocate(bytes))
        return dense_over(dev, shape, dtype, std::move(b));
  }
  return dense_over(dev, shape, dtype, s.allocate(bytes, {}));
}

Tensor make_view(const Tensor& base, const Dims& shape, const Dims& strides, int64_t offset) {
  const TensorImpl& b = impl(base);
  return make_tensor(
      std::make_shared<TensorImpl>(b.storage, b.device, b.dtype, shape, strides, offset));
}

bp_tensor_desc desc(const Tensor& t) {
  const TensorImpl& i = impl(t);
  if (g_interceptors.load(std::memory_order_relaxed) != 0 && i.storage) [[unlikely]] {
    DeviceState& s = state(*i.device);
    if (s.interceptor.load(std::memory_order_acquire)) {
      InterceptorPin p(s);
      if (p) p->use(*i.storage);
    }
  }
  bp_tensor_desc d{};
  d.struct_size = sizeof d;
  d.buffer = i.storage ? handle(*i.storage) : nullptr;
  d.offset = static_cast<uint64_t>(i.offset) * dtype_size(i.dtype);
  d.dtype = static_cast<int32_t>(i.dtype);
  d.rank = i.shape.rank;
  for (int k = 0; k < i.shape.rank; ++k) {
    d.shape[k] = i.shape.d[k];
    d.strides[k] = i.strides.d[k];
  }
  return d;
}

bp_tensor_desc desc_broadcast(const Tensor& t, const Dims& out) {
  bp_tensor_desc d = desc(t);
  const TensorImpl& i = impl(t);
  int pad = out.rank - i.shape.rank;
  d.rank = out.rank;
  for (int k = out.rank - 1; k >= 0; --k) {
    int src = k - pad;
    d.shape[k] = out.d[k];
    d.strides[k] = (src >= 0 && i.shape.d[src] == out.d[k]) ? i.strides.d[src] : 0;
  }
  return d;
}

Dims broadcast_shapes(const Dims& a, const Dims& b, const char* op) {
  Dims out;
  out.rank = std::max(a.rank, b.rank);
  for (int k = 0; k < out.rank; ++k) {
    int ia = k - (out.rank - a.rank), ib = k - (out.rank - b.rank);
    int64_t da = ia >= 0 ? a.d[ia] : 1, db = ib >= 0 ? b.d[ib] : 1;
    if (da != db && da != 1 && db != 1)
      throw ShapeError(std::string(op) + ": shapes " + a.str() + " and " + b.str() +
                       " cannot be broadcast (dimension " + std::to_string(k) + ": " +
                       std::to_string(da) + " vs " + std::to_string(db) + ")");
    out.d[k] = da == 1 ? db : da;
  }
  return out;
}

void check_same_device(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = *ts.begin();
  for (const Tensor* t : ts) {
    if (!t->defined()) throw Error(std::string(op) + ": an operand is an undefined tensor");
    if (&t->device() != &first->device())
      throw DeviceMismatch(std::string(op) + ": expected all tensors on one device, found " +
                           first->device().str() + " and " + t->device().str() +
                           "; move one explicitly with .to(device)");
  }
}

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype())
    throw DTypeError(std::string(op) + ": dtypes differ, " + std::string(dtype_name(a.dtype())) +
                     " and " + std::string(dtype_name(b.dtype())) +
                     "; cast one with .to(DType::...) first");
}

int normalize_axis(int axis, int rank, const char* op) {
  int r = std::max(rank, 1);
  if (axis < -r || axis >= r)
    throw ShapeError(std::string(op) + ": axis " + std::to_string(axis) +
                     " is out of range for a tensor of rank " + std::to_string(rank) +
                     " (valid: " + std::to_string(-r) + " to " + std::to_string(r - 1) + ")");
  return axis < 0 ? axis + r : axis;
}

std::vector<char> read_bytes(const Tensor& t0, const char* what) {
  intercepted_host_op(state(t0.device()), nullptr, what,
                      "it reads values on the host, and the captured work runs only when the "
                      "graph is replayed; read the graph's output tensors after replay()");
  Tensor t = t0.contiguous();
  size_t n = static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
  std::vector<char> out(n);
  if (n == 0) return out;
  Device& dev = t.device();
  note_implicit_sync(dev, what);
  Stream& s = dev.default_stream();
  uint64_t off = static_cast<uint64_t>(t.offset()) * dtype_size(t.dtype());
  if (const char* hp = static_cast<const char*>(impl(t).storage->host_pointer())) {
    s.synchronize();
    std::memcpy(out.data(), hp + off, n);
  } else {
    dev.copy_to_host(s, out.data(), *impl(t).storage, off, n);
    s.synchronize();
  }
  return out;
}

}  // namespace detail

using namespace detail;
using autograd::GradKind;

namespace {
// Records a view or move of `in` as `kind` when gradients flow through it.
Tensor tracked(Tensor out, GradKind kind, const Tensor& in, Shape extra = {}) {
  if (autograd::needs_grad({&in})) autograd::record(kind, out, {in}, {}, 0.0, 0, std::move(extra));
  return out;
}
}  // namespace

// ---- accessors -----------------------------------------------------------------------------

namespace {
const TensorImpl& need(const std::shared_ptr<TensorImpl>& p) {
  if (!p) throw Error("operation on an undefined tensor (default-constructed bp::Tensor)");
  return *p;
}
}  // namespace

Device& Tensor::device() const {
  return *need(impl_).device;
}
DType Tensor::dtype() const {
  return need(impl_).dtype;
}
int Tensor::rank() const {
  return need(impl_).shape.rank;
}
Shape Tensor::shape() const {
  return need(impl_).shape.vec();
}
Shape Tensor::strides() const {
  return need(impl_).strides.vec();
}
int64_t Tensor::numel() const {
  return need(impl_).shape.numel();
}
int64_t Tensor::offset() const {
  return need(impl_).offset;
}
int64_t Tensor::size(int axis) const {
  return impl_->shape.d[normalize_axis(axis, rank(), "size")];
}
bool Tensor::is_contiguous() const {
  const TensorImpl& i = need(impl_);
  int64_t expected = 1;
  for (int k = i.shape.rank - 1; k >= 0; --k) {
    if (i.shape.d[k] != 1 && i.strides.d[k] != expected) return false;
    expected *= i.shape.d[k];
  }
  return true;
}
bool Tensor::shares_storage(const Tensor& o) const {
  return impl_ && o.impl_ && impl_->storage && impl_->storage == o.impl_->storage;
}
const Dims& Tensor::dims() const {
  return need(impl_).shape;
}
const Dims& Tensor::stride_dims() const {
  return need(impl_).strides;
}
const std::shared_ptr<Buffer>& Tensor::storage() const {
  return need(impl_).storage;
}
Device& Tensor::cpu_device() {
  return bp::device("cpu:0");
}

// ---- data movement -------------------------------------------------------------------------

Tensor Tensor::copy_to(Device& d) const {
  const TensorImpl& i = need(impl_);
  // A copy to a host device waits for the source's queued work (Note [Sync-debug]).
  if (&d != i.device && d.properties().unified_memory && !i.device->properties().unified_memory &&
      i.shape.numel() != 0)
    note_implicit_sync(*i.device, "copy_to()");
  Tensor src = contiguous();
  if (&d == i.device && src.impl_ != impl_) return src;  // contiguous() already copied
  Tensor out = make_empty(d, i.shape, i.dtype);
  uint64_t n = static_cast<uint64_t>(i.shape.numel()) * dtype_size(i.dtype);
  if (n != 0) {
    uint64_t off = static_cast<uint64_t>(src.offset()) * dtype_size(i.dtype);
    d.copy_from_device(*out.impl_->storage, 0, *src.impl_->storage, off, n);
  }
  return tracked(out, GradKind::to_device, src);
}

Tensor Tensor::to(Device& d) const {
  if (&d == need(impl_).device) return *this;
  return copy_to(d);
}

Tensor& Tensor::set_data(const Tensor& src) {
  if (!impl_) throw Error("set_data: operation on an undefined tensor");
  if (!src.defined()) throw Error("set_data: the source is an undefined tensor");
  TensorImpl& d = *impl_;
  if (src.impl_ == impl_) return *this;
  const TensorImpl& s = impl(src);
  bool keeps_grad = d.device == s.device && d.dtype == s.dtype;
  d.storage = s.storage;
  d.device = s.device;
  d.dtype = s.dtype;
  d.shape = s.shape;
  d.strides = s.strides;
  d.offset = s.offset;
  if (!keeps_grad) zero_grad();
  return *this;
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  std::vector<char> bytes = read_bytes(*this, "to_vector()");
  DType dt = dtype();
  size_t n = static_cast<size_t>(numel());
  std::vector<T> out(n);
  if constexpr (!std::is_same_v<T, bool>) {
    if (dt == dtype_of<T>) {
      if (n) std::memcpy(out.data(), bytes.data(), n * sizeof(T));
      return out;
    }
  }
  for (size_t k = 0; k < n; ++k) {
    double v = load_as_double(bytes.data(), dt, k);
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      store_from_double(&out[k], dtype_of<T>, 0, v);
    } else {
      out[k] = static_cast<T>(v);
    }
  }
  return out;
}

template <typename T>
T Tensor::item() const {
  if (numel() != 1)
    throw ShapeError("item(): the tensor has " + std::to_string(numel()) + " elements (shape " +
                     impl_->shape.str() + "); item() needs exactly one");
  SyncDebugCall call("item()");
  return to_vector<T>()[0];
}

#define BP_INSTANTIATE_HOST_READS(T)                    \
  template std::vector<T> Tensor::to_vector<T>() const; \
  template T Tensor::item<T>() const;
BP_INSTANTIATE_HOST_READS(float)
BP_INSTANTIATE_HOST_READS(double)
BP_INSTANTIATE_HOST_READS(int32_t)
BP_INSTANTIATE_HOST_READS(int64_t)
BP_INSTANTIATE_HOST_READS(uint8_t)
BP_INSTANTIATE_HOST_READS(bool)
BP_INSTANTIATE_HOST_READS(Half)
BP_INSTANTIATE_HOST_READS(BFloat16)
#undef BP_INSTANTIATE_HOST_READS

// ---- views ----------------------------------------------------------------------------------

namespace {
Dims infer_shape(const Shape& shape, int64_t numel, const char* op, const Dims& from) {
  Dims out{std::span<const int64_t>(shape)};
  int infer = -1;
  int64_t known = 1;
  for (int k = 0; k < out.rank; ++k) {
    if (out.d[k] == -1) {
      if (infer >= 0) throw ShapeError(std::string(op) + ": only one dimension may be -1");
      infer = k;
    } else if (out.d[k] < 0) {
      throw ShapeError(std::string(op) + ": invalid dimension " + std::to_string(out.d[k]));
    } else if (__builtin_mul_overflow(known, out.d[k], &known)) {
      throw ShapeError(std::string(op) + ": shape " + out.str() + " has more than 2^63 elements");
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel % known != 0)
      throw ShapeError(std::string(op) + ": cannot infer -1 when reshaping " + from.str() + " (" +
                       std::to_string(numel) + " elements)");
    out.d[infer] = numel / known;
  }
  if (checked_numel(out, op) != numel)
    throw ShapeError(std::string(op) + ": shape " + out.str() + " has " +
                     std::to_string(out.numel()) + " elements but the tensor (" + from.str() +
                     ") has " + std::to_string(numel));
  return out;
}

// Strides that view `t` as `shape` without copying, if they exist (NumPy's attempt_nocopy).
bool view_strides(const TensorImpl& t, const Dims& shape, Dims& out) {
  out.rank = shape.rank;
  if (t.shape.numel() == 0 || shape.rank == 0) {
    out = contiguous_strides(shape);
    return true;
  }
  // Drop size-1 dims of the source.
  int64_t od[kMaxRank], os[kMaxRank];
  int on = 0;
  for (int k = 0; k < t.shape.rank; ++k)
    if (t.shape.d[k] != 1) {
      od[on] = t.shape.d[k];
      os[on] = t.strides.d[k];
      ++on;
    }
  int oi = 0, ni = 0;
  while (ni < shape.rank) {
    if (shape.d[ni] == 1) {
      out.d[ni] = 1;
      ++ni;
      continue;
    }
    if (oi >= on) return false;
    // Group source dims [oi, oj) with new dims [ni, nj) of equal product.
    int64_t np = shape.d[ni], op_ = od[oi];
    int oj = oi + 1, nj = ni + 1;
    while (np != op_) {
      if (np < op_) {
        if (nj >= shape.rank) return false;
        np *= shape.d[nj++];
      } else {
        if (oj >= on) return false;
        op_ *= od[oj++];
      }
    }
    for (int k = oi; k < oj - 1; ++k)
      if (os[k] != os[k + 1] * od[k + 1]) return false;  // source group not contiguous
    int64_t stride = os[oj - 1];
    for (int k = nj - 1; k >= ni; --k) {
      out.d[k] = stride;
      stride *= shape.d[k];
    }
    oi = oj;
    ni = nj;
  }
  return oi == on;
}
}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  const TensorImpl& i = need(impl_);
  Dims s = infer_shape(shape, i.shape.numel(), "view", i.shape);
  Dims st;
  if (!view_strides(i, s, st))
    throw ShapeError("view: a tensor of shape " + i.shape.str() +
                     " with these strides cannot be viewed as " + s.str() +
                     "; use reshape() (which copies) or contiguous() first");
  return tracked(make_view(*this, s, st, i.offset), GradKind::reshape, *this);
}

Tensor Tensor::reshape(const Shape& shape) const {
  const TensorImpl& i = need(impl_);
  Dims s = infer_shape(shape, i.shape.numel(), "reshape", i.shape);
  Dims st;
  if (view_strides(i, s, st))
    return tracked(make_view(*this, s, st, i.offset), GradKind::reshape, *this);
  return contiguous().view(shape);
}

Tensor Tensor::transpose(int a, int b) const {
  const TensorImpl& i = need(impl_);
  if (i.shape.rank < 2 && a == -2 && b == -1) return *this;  // t() of a vector
  a = normalize_axis(a, i.shape.rank, "transpose");
  b = normalize_axis(b, i.shape.rank, "transpose");
  Dims s = i.shape, st = i.strides;
  std::swap(s.d[a], s.d[b]);
  std::swap(st.d[a], st.d[b]);
  Shape order(static_cast<size_t>(i.shape.rank));
  for (int k = 0; k < i.shape.rank; ++k) order[k] = k;
  std::swap(order[a], order[b]);
  return tracked(make_view(*this, s, st, i.offset), GradKind::permute, *this, order);
}

Tensor Tensor::permute(const Shape& order) const {
  const TensorImpl& i = need(impl_);
  if (static_cast<int>(order.size()) != i.shape.rank)
    throw ShapeError("permute: got " + std::to_string(order.size()) +
                     " axes for a tensor of rank " + std::to_string(i.shape.rank));
  Dims s, st;
  s.rank = st.rank = i.shape.rank;
  bool used[kMaxRank] = {};
  for (int k = 0; k < i.shape.rank; ++k) {
    int ax = normalize_axis64(order[k], i.shape.rank, "permute");
    if (used[ax]) throw ShapeError("permute: axis " + std::to_string(ax) + " appears twice");
    used[ax] = true;
    s.d[k] = i.shape.d[ax];
    st.d[k] = i.strides.d[ax];
  }
  Shape normalized(order.size());
  for (size_t k = 0; k < order.size(); ++k)
    normalized[k] = normalize_axis64(order[k], i.shape.rank, "permute");
  return tracked(make_view(*this, s, st, i.offset), GradKind::permute, *this, normalized);
}

Tensor Tensor::slice(int axis, int64_t start, int64_t end, int64_t step) const {
  const TensorImpl& i = need(impl_);
  axis = normalize_axis(axis, i.shape.rank, "slice");
  if (step <= 0) throw ShapeError("slice: step must be positive, got " + std::to_string(step));
  int64_t n = i.shape.d[axis];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Dims s = i.shape, st = i.strides;
  s.d[axis] = (end - start + step - 1) / step;
  st.d[axis] = i.strides.d[axis] * step;
  return tracked(make_view(*this, s, st, i.offset + start * i.strides.d[axis]), GradKind::slice,
                 *this, {axis, start, end, step});
}

Tensor Tensor::select(int axis, int64_t index) const {
  const TensorImpl& i = need(impl_);
  axis = normalize_axis(axis, i.shape.rank, "select");
  int64_t n = i.shape.d[axis];
  if (index < -n || index >= n)
    throw ShapeError("select: index " + std::to_string(index) + " is out of range for axis " +
                     std::to_string(axis) + " of size " + std::to_string(n));
  if (index < 0) index += n;
  return slice(axis, index, index + 1).squeeze(axis);
}

Tensor Tensor::squeeze(int axis) const {
  const TensorImpl& i = need(impl_);
  axis = normalize_axis(axis, i.shape.rank, "squeeze");
  if (i.shape.d[axis] != 1)
    throw ShapeError("squeeze: axis " + std::to_string(axis) + " has size " +
                     std::to_string(i.shape.d[axis]) + ", not 1");
  Dims s, st;
  for (int k = 0; k < i.shape.rank; ++k)
    if (k != axis) {
      s.d[s.rank++] = i.shape.d[k];
      st.d[st.rank++] = i.strides.d[k];
    }
  return tracked(make_view(*this, s, st, i.offset), GradKind::reshape, *this);
}

Tensor Tensor::unsqueeze(int axis) const {
  const TensorImpl& i = need(impl_);
  check_rank(i.shape.rank + 1);
  axis = normalize_axis(axis, i.shape.rank + 1, "unsqueeze");
  Dims s, st;
  s.rank = st.rank = i.shape.rank + 1;
  for (int k = 0, src = 0; k < s.rank; ++k) {
    if (k == axis) {
      s.d[k] = 1;
      st.d[k] = (src < i.shape.rank) ? i.strides.d[src] * i.shape.d[src] : 1;
    } else {
      s.d[k] = i.shape.d[src];
      st.d[k] = i.strides.d[src];
      ++src;
    }
  }
  return tracked(make_view(*this, s, st, i.offset), GradKind::reshape, *this);
}

Tensor Tensor::expand(const Shape& shape) const {
  const TensorImpl& i = need(impl_);
  Dims target{std::span<const int64_t>(shape)};
  checked_numel(target, "expand");
  Dims out = broadcast_shapes(i.shape, target, "expand");
  if (!(out == target))
    throw ShapeError("expand: shape " + i.shape.str() + " cannot be expanded to " + target.str());
  bp_tensor_desc d = desc_broadcast(*this, target);
  Dims st;
  st.rank = target.rank;
  for (int k = 0; k < target.rank; ++k) st.d[k] = d.strides[k];
  return tracked(make_view(*this, target, st, i.offset), GradKind::expand, *this);
}

// ---- creation -------------------------------------------------------------------------------

Tensor from_bytes(const void* data, size_t nbytes, const Shape& shape, DType dtype,
                  Device& device) {
  Dims s{std::span<const int64_t>(shape)};
  size_t expected = checked_bytes(s, dtype, "from_bytes");
  if (nbytes != expected)
    throw ShapeError("from_bytes: " + std::to_string(nbytes) + " bytes given, shape " + s.str() +
                     " of " + std::string(dtype_name(dtype)) + " needs " +
                     std::to_string(expected));
  // A constant of the graph (Note [Graph semantics] in graph.hpp): uploaded now, outside the
  // captured stream.
  if (DeviceState& ds = state(device); ds.interceptor.load(std::memory_order_acquire)) {
    InterceptorPin p(ds);
    if (p)
      if (std::shared_ptr<Buffer> b = p->constant(data, nbytes))
        return dense_over(device, s, dtype, std::move(b));
  }
  Tensor t = make_empty(device, s, dtype);
  if (nbytes == 0) return t;
  Stream& st = device.default_stream();
  if (void* hp = impl(t).storage->host_pointer()) {
    st.synchronize();
    std::memcpy(hp, data, nbytes);
  } else {
    device.copy_from_host(st, *impl(t).storage, 0, data, nbytes);
    st.synchronize();  // the caller's memory may go away when we return
  }
  return t;
}

template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device& device) {
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<uint8_t> bytes(values.begin(), values.end());
    return from_bytes(bytes.data(), bytes.size(), shape, DType::boolean, device);
  } else {
    return from_bytes(values.data(), values.size() * sizeof(T), shape, dtype_of<T>, device);
  }
}
template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape) {
  return from_vector(values, shape, default_device());
}
#define BP_INSTANTIATE_FROM_VECTOR(T)                                           \
  template Tensor from_vector<T>(const std::vector<T>&, const Shape&, Device&); \
  template Tensor from_vector<T>(const std::vector<T>&, const Shape&);
BP_INSTANTIATE_FROM_VECTOR(float)
BP_INSTANTIATE_FROM_VECTOR(double)
BP_INSTANTIATE_FROM_VECTOR(int32_t)
BP_INSTANTIATE_FROM_VECTOR(int64_t)
BP_INSTANTIATE_FROM_VECTOR(uint8_t)
BP_INSTANTIATE_FROM_VECTOR(bool)
BP_INSTANTIATE_FROM_VECTOR(Half)
BP_INSTANTIATE_FROM_VECTOR(BFloat16)
#undef BP_INSTANTIATE_FROM_VECTOR

Tensor tensor(std::initializer_list<float> values, Device& device) {
  return from_vector(std::vector<float>(values), {static_cast<int64_t>(values.size())}, device);
}
Tensor tensor(std::initializer_list<float> values) {
  return tensor(values, default_device());
}
Tensor tensor(std::initializer_list<std::initializer_list<float>> rows, Device& device) {
  std::vector<float> flat;
  size_t cols = rows.size() ? rows.begin()->size() : 0;
  for (const auto& r : rows) {
    if (r.size() != cols)
      throw ShapeError("tensor: ragged rows (" + std::to_string(r.size()) + " vs " +
                       std::to_string(cols) + " elements)");
    flat.insert(flat.end(), r.begin(), r.end());
  }
  return from_vector(flat, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(cols)}, device);
}
Tensor tensor(std::initializer_list<std::initializer_list<float>> rows) {
  return tensor(rows, default_device());
}

Tensor empty(const Shape& shape, Device& device, DType dtype) {
  return make_empty(device, Dims{std::span<const int64_t>(shape)}, dtype);
}
Tensor empty(const Shape& shape, DType dtype) {
  return empty(shape, default_device(), dtype);
}
Tensor full(const Shape& shape, double value, Device& device, DType dtype) {
  Tensor t = empty(shape, device, dtype);
  t.fill_(value);
  return t;
}
Tensor full(const Shape& shape, double value, DType dtype) {
  return full(shape, value, default_device(), dtype);
}
Tensor zeros(const Shape& shape, Device& device, DType dtype) {
  return full(shape, 0.0, device, dtype);
}
Tensor zeros(const Shape& shape, DType dtype) {
  return zeros(shape, default_device(), dtype);
}
Tensor ones(const Shape& shape, Device& device, DType dtype) {
  return full(shape, 1.0, device, dtype);
}
Tensor ones(const Shape& shape, DType dtype) {
  return ones(shape, default_device(), dtype);
}
Tensor zeros_like(const Tensor& t) {
  return zeros(t.shape(), t.device(), t.dtype());
}
Tensor ones_like(const Tensor& t) {
  return ones(t.shape(), t.device(), t.dtype());
}

Tensor arange(int64_t n, Device& device, DType dtype) {
  // Values are written on the host in the requested dtype, so devices without f64 need no cast.
  // The device's memory is taken first and the host stages at most kChunk values at a time: a
  // count no device can hold is that device's OutOfMemory, never a host allocation of the same
  // size (which sanitizers and overcommitting hosts answer by killing the process).
  const int64_t count = std::max<int64_t>(n, 0);
  const Dims shape{count};
  (void)checked_bytes(shape, dtype, "arange");
  const std::string what = "arange(" + std::to_string(n) + ")";
  const size_t esize = dtype_size(dtype);
  constexpr int64_t kChunk = int64_t{1} << 16;
  auto fill = [&](char* dst, int64_t first, int64_t len) {
    for (int64_t k = 0; k < len; ++k)
      store_from_double(dst, dtype, static_cast<size_t>(k), static_cast<double>(first + k));
  };
  if (DeviceState& ds = state(device); ds.interceptor.load(std::memory_order_acquire)) {
    // During a capture the values are a constant of the graph, uploaded by from_bytes.
    std::vector<char> bytes(static_cast<size_t>(count) * esize);
    fill(bytes.data(), 0, count);
    return from_bytes(bytes.data(), bytes.size(), {count}, dtype, device);
  }
  Tensor t;
  try {
    t = make_empty(device, shape, dtype);
  } catch (const OutOfMemory& e) {
    throw OutOfMemory(what + ": " + e.what());
  }
  if (count == 0) return t;
  Stream& st = device.default_stream();
  Buffer& storage = *impl(t).storage;
  if (auto* hp = static_cast<char*>(storage.host_pointer())) {
    st.synchronize();
    fill(hp, 0, count);
    return t;
  }
  std::vector<char> stage(static_cast<size_t>(std::min(count, kChunk)) * esize);
  for (int64_t first = 0; first < count; first += kChunk) {
    const int64_t len = std::min(kChunk, count - first);
    fill(stage.data(), first, len);
    device.copy_from_host(st, storage, static_cast<uint64_t>(first) * esize, stage.data(),
                          static_cast<uint64_t>(len) * esize);
    st.synchronize();  // the stage is refilled next
  }
  return t;
}
Tensor arange(int64_t n, DType dtype) {
  return arange(n, default_device(), dtype);
}

// ---- random ---------------------------------------------------------------------------------

uint64_t Generator::advance(uint64_t n) {
  uint64_t first = offset_;
  offset_ += (n + 3) / 4 * 4;
  return first;
}

namespace {
std::mutex g_gen_mu;
}
Generator& default_generator() {
  static Generator* g = new Generator();
  return *g;
}
void manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(g_gen_mu);
  default_generator() = Generator(seed);
}
RngState get_rng_state() {
  std::lock_guard<std::mutex> lock(g_gen_mu);
  return {default_generator().seed(), default_generator().offset()};
}
void set_rng_state(const RngState& state) {
  std::lock_guard<std::mutex> lock(g_gen_mu);
  default_generator() = Generator(state.seed, state.offset);
}

namespace detail {
void draw_philox(Device& dev, const char* what, Generator* gen, uint64_t n, uint64_t& seed,
                 uint64_t& offset) {
  intercepted_host_op(state(dev), nullptr, what,
                      "its seed and offset are fixed at capture, so every replay would draw the "
                      "same numbers; run it outside the capture");
  std::lock_guard<std::mutex> lock(g_gen_mu);
  Generator& g = gen ? *gen : default_generator();
  seed = g.seed();
  offset = g.advance(n);
}
}  // namespace detail

namespace {
Tensor random_tensor(Op op, const Shape& shape, Device& device, DType dtype, Generator* gen,
                     double p0, double p1) {
  check_domain(op, dtype);
  intercepted_host_op(state(device), nullptr, op == Op::uniform ? "rand/uniform" : "randn/normal",
                      "its seed and offset are fixed at capture, so every replay would repeat "
                      "the same numbers; make random tensors before the capture and copy them "
                      "into the graph's inputs");
  Tensor t = make_empty(device, Dims{std::span<const int64_t>(shape)}, dtype);
  uint64_t n = static_cast<uint64_t>(t.numel());
  uint64_t seed, offset;
  {
    std::lock_guard<std::mutex> lock(g_gen_mu);
    Generator& g = gen ? *gen : default_generator();
    seed = g.seed();
    offset = g.advance(n);
  }
  if (n == 0) return t;
  bool uniform = op == Op::uniform;
  bp_attr attrs[4] = {attr_i(BP_ATTR_ID_SEED, static_cast<int64_t>(seed)),
                      attr_i(BP_ATTR_ID_OFFSET, static_cast<int64_t>(offset)),
                      attr_f(uniform ? BP_ATTR_ID_LOW : BP_ATTR_ID_MEAN, p0),
                      attr_f(uniform ? BP_ATTR_ID_HIGH : BP_ATTR_ID_STD, p1)};
  bp_tensor_desc out = desc(t);
  launch(device, op, dtype, {}, {&out, 1}, attrs);
  return t;
}
}  // namespace

Tensor uniform(const Shape& shape, double low, double high, Device& device, DType dtype,
               Generator* gen) {
  return random_tensor(Op::uniform, shape, device, dtype, gen, low, high);
}
Tensor rand(const Shape& shape, Device& device, DType dtype, Generator* gen) {
  return random_tensor(Op::uniform, shape, device, dtype, gen, 0.0, 1.0);
}
Tensor rand(const Shape& shape, DType dtype) {
  return rand(shape, default_device(), dtype);
}
Tensor randn(const Shape& shape, Device& device, DType dtype, Generator* gen) {
  return random_tensor(Op::normal, shape, device, dtype, gen, 0.0, 1.0);
}
Tensor randn(const Shape& shape, DType dtype) {
  return randn(shape, default_device(), dtype);
}

}  // namespace bp
