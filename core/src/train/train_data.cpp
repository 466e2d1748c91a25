// DataLoader: batches gathered from a host copy of in-memory tensors.
#include <backplane/train.hpp>

#include "tensor/tensor_internal.hpp"

#include <cstring>
#include <numeric>

namespace bp {

using detail::impl;
using detail::impl_ptr;
using detail::TensorImpl;

DataLoader::DataLoader(const Tensor& inputs, const Tensor& targets,
                       const DataLoaderOptions& options)
    : opt_(options), rng_(options.seed) {
  if (!inputs.defined() || !targets.defined())
    throw Error("DataLoader: inputs and targets must be defined tensors");
  if (inputs.rank() == 0 || targets.rank() == 0 || inputs.size(0) != targets.size(0))
    throw ShapeError("DataLoader: inputs " + inputs.dims().str() + " and targets " +
                     targets.dims().str() + " need one first dimension counting the examples");
  if (options.batch_size < 1)
    throw Error("DataLoader: batch_size must be at least 1, got " +
                std::to_string(options.batch_size));
  if (options.shuffle && options.sampler)
    throw Error(
        "DataLoader: shuffle and sampler are mutually exclusive (the sampler orders the "
        "examples; set shuffle = false)");
  n_ = inputs.size(0);
  auto load = [&](const Tensor& t) {
    Source s;
    // One explicit copy to the host (not an implicit sync in the sense of sync-debug).
    s.bytes = detail::read_bytes(t.detach().cpu(), "DataLoader");
    Shape shape = t.shape();
    s.row_shape.assign(shape.begin() + 1, shape.end());
    int64_t row = 1;
    for (int64_t d : s.row_shape) row *= d;
    s.dtype = t.dtype();
    s.row_bytes = static_cast<size_t>(row) * dtype_size(t.dtype());
    s.device = &t.device();
    return s;
  };
  x_ = load(inputs);
  y_ = load(targets);
  order_.resize(static_cast<size_t>(n_));
  std::iota(order_.begin(), order_.end(), int64_t{0});
}

int64_t DataLoader::epoch_size() const {
  return opt_.sampler ? opt_.sampler->num_samples(n_) : n_;
}

int64_t DataLoader::num_batches() const {
  int64_t bs = opt_.batch_size, n = epoch_size();
  return n / bs + (!opt_.drop_last && n % bs != 0);  // no n + bs - 1: bs may be INT64_MAX
}

DataLoader::Iterator DataLoader::begin() {
  if (opt_.sampler) {
    order_ = opt_.sampler->next_epoch(n_);
    for (int64_t i : order_)
      if (i < 0 || i >= n_)
        throw Error("DataLoader: the sampler gave index " + std::to_string(i) +
                    " for a dataset of " + std::to_string(n_) + " examples");
    return Iterator(this, 0);
  }
  order_.resize(static_cast<size_t>(n_));
  std::iota(order_.begin(), order_.end(), int64_t{0});
  if (opt_.shuffle) {
    // Fisher-Yates with an explicit reduction: the same order on every platform (unlike
    // std::shuffle, whose use of the generator is implementation-defined).
    for (size_t i = order_.size(); i > 1; --i) {
      size_t j = static_cast<size_t>(rng_() % i);
      std::swap(order_[i - 1], order_[j]);
    }
  }
  return Iterator(this, 0);
}

Tensor DataLoader::gather_one(const Source& s, const int64_t* rows, int64_t count) const {
  std::vector<char> buf(static_cast<size_t>(count) * s.row_bytes);
  for (int64_t k = 0; k < count; ++k) {
    size_t row = static_cast<size_t>(rows[k]);
    if (s.row_bytes)
      std::memcpy(buf.data() + static_cast<size_t>(k) * s.row_bytes,
                  s.bytes.data() + row * s.row_bytes, s.row_bytes);
  }
  Shape shape{count};
  shape.insert(shape.end(), s.row_shape.begin(), s.row_shape.end());
  return from_bytes(buf.data(), buf.size(), shape, s.dtype, *s.device);
}

Batch DataLoader::gather(int64_t batch) const {
  int64_t first = batch * opt_.batch_size;
  int64_t count = std::min(opt_.batch_size, static_cast<int64_t>(order_.size()) - first);
  const int64_t* rows = order_.data() + first;
  return Batch{gather_one(x_, rows, count), gather_one(y_, rows, count)};
}

Batch DataLoader::first_batch() const {
  if (n_ == 0) throw Error("DataLoader: no examples");
  int64_t count = std::min(opt_.batch_size, n_);
  std::vector<int64_t> rows(static_cast<size_t>(count));
  std::iota(rows.begin(), rows.end(), int64_t{0});  // data order, whatever the epoch's order
  return Batch{gather_one(x_, rows.data(), count), gather_one(y_, rows.data(), count)};
}

}  // namespace bp
