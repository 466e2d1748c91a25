// Training: losses, gradient clipping, optimisers (backplane/optim.hpp), a DataLoader over
// in-memory tensors and a Trainer that runs the loop on the best device (d2l's Trainer with
// num_gpus).
//
// Note [Training on a device]
//   Everything a step computes stays on the model's device: the loss, the gradients, the
//   optimiser state and the parameter updates (in place, under NoGradGuard, with add_ / mul_).
//   Nothing is read back to the host inside a step; the Trainer accumulates the epoch loss on
//   the device and reads it once per epoch. Optimisers hold the parameter tensors they were
//   given: build them after moving the model (Module::to replaces the tensors) and after a
//   lazy model has run once; Trainer::fit does both.
//
// Thread-safety: none of these objects may be used from several threads at once.
#pragma once

#include <backplane/export.hpp>
#include <backplane/nn.hpp>
#include <backplane/optim.hpp>
#include <backplane/tensor.hpp>

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace bp {

namespace nn {

// mean((prediction - target)^2) over all elements, a 0-d tensor on their device. The shapes
// must be equal (ShapeError otherwise: broadcasting [N] against [N, 1] is a classic silent
// bug); DeviceMismatch / DTypeError as for any op.
BP_API Tensor mse_loss(const Tensor& prediction, const Tensor& target);

// torch.nn.functional.cross_entropy's options for class-index targets.
struct CrossEntropyOptions {
  std::string reduction = "mean";  // "mean", "sum" or "none"
  int64_t ignore_index = -100;     // rows with this target add nothing (and 'mean' skips them)
  double label_smoothing = 0.0;    // in [0, 1]: the target is (1 - e) one-hot + e / C uniform
};

// torch.nn.functional.cross_entropy with class-index targets: per row,
// -(1 - e) log softmax(logits)[label] - (e / C) sum_c log softmax(logits)[c], computed stably,
// then reduced: 'mean' divides the sum by the number of rows whose label is not ignore_index
// (NaN when there are none, as torch), 'sum', or 'none' (labels' shape). logits [N, C] or
// [N, C, d1, ...] floating; labels [N] or [N, d1, ...] of i64 or i32 on the same device. One
// fused op forward and one backward where the device has them (catalogue cross_entropy, Note
// [Fused cross entropy]): the logits are read in their own dtype (under autocast no cast to f32
// is made; the loss is f32 for f16/bf16 logits, as autocast's f32 policy gives) and their
// gradient is written once. A label outside [0, C) that is not ignore_index is an IndexError
// (AsyncError at the next synchronisation on devices that find it there). ShapeError /
// DTypeError for other shapes and dtypes, bp::Error for a bad reduction or label_smoothing.
//
// cross_entropy is a function object, so that `bp::nn::cross_entropy` names one thing that a
// LossFn (std::function of logits and labels) takes, as before the options came, and a call
// with options picks the other overload.
struct CrossEntropyFn {
  BP_API Tensor operator()(const Tensor& logits, const Tensor& labels,
                           const CrossEntropyOptions& options) const;
  // The mean over the batch, as (logits, labels, {}).
  BP_API Tensor operator()(const Tensor& logits, const Tensor& labels) const;
};
inline constexpr CrossEntropyFn cross_entropy{};

// Scales the gradients of `parameters` in place so that their global L2 norm is at most
// `max_norm` (like torch.nn.utils.clip_grad_norm_: coefficient min(1, max_norm / (norm +
// 1e-6)), applied always, so no host sync). Returns the norm before clipping as a 0-d tensor
// on the parameters' device (undefined when no parameter has a gradient). Parameters must
// share one device (DeviceMismatch otherwise).
BP_API Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm);

}  // namespace nn

struct Batch {
  Tensor x, y;
};

// Chooses the examples of each epoch for a DataLoader (bp::DistributedSampler in
// backplane/parallel.hpp gives each rank of a process group its own shard).
class Sampler {
 public:
  virtual ~Sampler() = default;
  // How many indices an epoch yields for a dataset of `dataset_size` examples.
  virtual int64_t num_samples(int64_t dataset_size) const = 0;
  // The next epoch's indices in order, each in [0, dataset_size).
  virtual std::vector<int64_t> next_epoch(int64_t dataset_size) = 0;
};

struct DataLoaderOptions {
  int64_t batch_size = 32;
  bool shuffle = false;
  uint64_t seed = 0;       // the shuffle order's seed: one seed gives one sequence of epochs
  bool drop_last = false;  // drop a last batch smaller than batch_size
  // When set, each epoch takes its indices from the sampler (shuffle must be false).
  std::shared_ptr<Sampler> sampler{};
};

// Batches of (inputs[i], targets[i]) over in-memory tensors whose first dimension counts the
// examples. The tensors are read to host memory once, at construction; each batch is
// gathered there and created on the device the inputs came from (a Trainer then moves it to
// its device). Each begin() starts an epoch: with shuffle, a new permutation drawn from a
// generator seeded once with `seed` (std::mt19937_64 and a Fisher-Yates shuffle, so the order
// is the same on every platform); with a sampler, the sampler's indices. ShapeError when the
// first dimensions differ or a tensor is 0-d, Error for batch_size < 1, for shuffle together
// with a sampler, and for a sampler index outside the dataset.
class BP_API DataLoader {
 public:
  DataLoader(const Tensor& inputs, const Tensor& targets, const DataLoaderOptions& options = {});

  int64_t size() const noexcept { return n_; }  // examples
  // Examples per epoch: size(), or what the sampler yields.
  int64_t epoch_size() const;
  int64_t num_batches() const;
  const DataLoaderOptions& options() const noexcept { return opt_; }
  // The first batch in data order, without starting an epoch (used to run lazy models once).
  Batch first_batch() const;

  class Iterator {
   public:
    using difference_type = std::ptrdiff_t;
    using value_type = Batch;
    Batch operator*() const { return loader_->gather(index_); }
    Iterator& operator++() {
      ++index_;
      return *this;
    }
    bool operator==(const Iterator& o) const { return index_ == o.index_; }
    bool operator!=(const Iterator& o) const { return index_ != o.index_; }

   private:
    friend class DataLoader;
    Iterator(const DataLoader* loader, int64_t index) : loader_(loader), index_(index) {}
    const DataLoader* loader_;
    int64_t index_;
  };
  Iterator begin();  // starts a new epoch
  Iterator end() const { return Iterator(this, num_batches()); }

 private:
  struct Source {
    std::vector<char> bytes;  // row-major host copy
    Shape row_shape;
    DType dtype = DType::f32;
    size_t row_bytes = 0;
    Device* device = nullptr;
  };
  Batch gather(int64_t batch) const;
  Tensor gather_one(const Source& s, const int64_t* rows, int64_t count) const;

  Source x_, y_;
  int64_t n_ = 0;
  DataLoaderOptions opt_;
  std::vector<int64_t> order_;
  std::mt19937_64 rng_;
};

using LossFn = std::function<Tensor(const Tensor& prediction, const Tensor& target)>;
using OptimizerFactory =
    std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor> parameters)>;

// Factories for Trainer::fit.
BP_API OptimizerFactory sgd(const optim::SGDOptions& options);
BP_API OptimizerFactory adam(const optim::AdamOptions& options);
BP_API OptimizerFactory adamw(const optim::AdamWOptions& options = {});

// Note [Training progress]
//   With progress on, fit() reports the epoch, the batch, the running mean loss of the epoch,
//   samples per second and the estimated time left. On a terminal one line is redrawn (at most
//   ten times a second, and at the end of each epoch); otherwise (or with Progress::lines) a
//   plain line is written every `progress_every` batches and at the end of each epoch:
//     epoch 1/3 batch 4/8 loss 0.512345 samples/s 1234.5 eta 0:00:02
//   Each report reads the epoch's loss sum from the device once (a synchronisation), so reports
//   are rate-limited; with progress off nothing is read inside an epoch.
//   `metrics_csv` names a file that gets the header
//     epoch,loss,batches,samples,seconds,samples_per_s
//   and one row per epoch (loss with 9 significant digits, written and flushed when the epoch
//   ends). IOError when it cannot be opened.
enum class Progress { off, automatic, terminal, lines };

struct TrainerOptions {
  int max_epochs = 10;
  // Where to train: a device string ("cuda:1", "cpu") when set; otherwise num_gpus == 0 means
  // cpu:0 and num_gpus >= 1 the first GPU of any backend if there is one (a device whose
  // properties().kind is DeviceKind::gpu, in the order of bp::devices()), else the first
  // other accelerator, else the CPU. Training runs on that one device; num_gpus > 1 does not
  // split batches across GPUs (d2l's Trainer in this chapter also uses gpus[0] only).
  std::string device{};
  int num_gpus = 1;
  double gradient_clip_val = 0.0;  // > 0: clip the gradients' global norm to this value
  // Called after every epoch with its index and mean batch loss (read once from the device).
  std::function<void(int epoch, double loss)> on_epoch{};
  // Note [Training progress]. automatic: a redrawn line when progress_stream is null and stderr
  // is a terminal, plain lines otherwise.
  Progress progress = Progress::off;
  std::ostream* progress_stream = nullptr;  // null: std::cerr
  int64_t progress_every = 0;               // lines: every N batches; 0: about ten per epoch
  std::string metrics_csv{};                // path of the per-epoch CSV log; empty: none
};

class BP_API Trainer {
 public:
  explicit Trainer(TrainerOptions options = {});
  // The device training runs on (resolved at construction; DeviceError for a bad string).
  Device& device() const noexcept { return *device_; }

  // Moves `model` to device(), runs a lazy model once on data.first_batch(), builds the
  // optimiser from model.parameters(), then for max_epochs epochs moves each batch to the
  // device and runs forward, loss, backward, optional clipping and the optimiser step (Note
  // [Training on a device]). Returns the mean batch loss of every epoch. Errors from the
  // model, loss or optimiser propagate; Error when the loader yields no batch.
  std::vector<double> fit(nn::Module& model, DataLoader& data, const LossFn& loss,
                          const OptimizerFactory& make_optimizer);
  // The optimiser of the last fit() (nullptr before).
  optim::Optimizer* optimizer() const noexcept { return optimizer_.get(); }

 private:
  TrainerOptions opt_;
  Device* device_;
  std::unique_ptr<optim::Optimizer> optimizer_;
};

}  // namespace bp
