// Data-parallel training across the ranks of a process group (backplane/dist.hpp):
// bp::nn::DistributedDataParallel, which keeps replicas of a model in step by averaging their
// gradients during backward, and bp::DistributedSampler, which gives each rank its own shard
// of a dataset for the DataLoader (backplane/train.hpp).
//
//   bp::dist::init_process_group();
//   auto& dev = bp::dist::local_device("cuda");                 // cuda:<local rank> or cpu
//   auto net = std::make_shared<bp::nn::Sequential>(); ...; net->to(dev);
//   bp::nn::DistributedDataParallel ddp(net);                   // rank 0's weights everywhere
//   bp::DataLoader data(X, Y, {.batch_size = 32,
//                              .sampler = std::make_shared<bp::DistributedSampler>()});
//   bp::optim::SGD opt(ddp.parameters(), {.lr = 0.1});
//   for (auto batch : data) { opt.zero_grad(); loss(ddp(batch.x.to(dev)), ...).backward();
//   opt.step(); }
//
// Note [Gradient buckets]
//   At construction the parameters are broadcast from rank 0 (and buffers with them), then laid
//   out, in reverse registration order (the order backward produces their gradients), into
//   buckets of about bucket_cap_mb, one flat tensor per bucket and dtype. A hook on each
//   parameter (Tensor::register_post_accumulate_grad_hook) copies its gradient into its bucket
//   when backward has finished it; a full bucket is all_reduced (avg) at once, so
//   communication overlaps the rest of backward. Buckets start in index order on every rank,
//   whatever order their gradients finish in, so the ranks issue the same collectives. When the
//   last bucket has been reduced, every parameter's gradient becomes a view of its bucket: the
//   average over ranks, which for a loss averaged over each rank's batch (of equal size) is the
//   gradient of the loss averaged over the combined batch.
//   On devices with ordered streams (cuda) the reductions run on a stream of their own that
//   waits for the gradients, and the device's default stream waits for them (no host
//   synchronisation); on the CPU, whose stream is eager, the reductions run on the
//   communicator's thread and the last hook waits for them.
//   A parameter that gets no gradient leaves its bucket unfinished: the next forward() throws
//   naming it (PyTorch's find_unused_parameters is not supported). Errors: Note [DDP errors] in
//   nn_parallel.cpp.
#pragma once

#include <backplane/dist.hpp>
#include <backplane/export.hpp>
#include <backplane/nn.hpp>
#include <backplane/train.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace bp {

namespace nn {

struct DistributedDataParallelOptions {
  double bucket_cap_mb = 25.0;          // bucket size (PyTorch's default)
  int root = 0;                         // whose parameters every rank starts from
  bool broadcast_buffers = true;        // buffers too, at construction
  dist::ProcessGroup* group = nullptr;  // nullptr: the default group
};

// Wraps a model whose parameters are initialised and on one device (move it with to() and run
// a lazy model once first). The state keys get the prefix "module." like PyTorch's DDP.
// Error when no process group is initialised, for uninitialised parameters, for parameters on
// several devices; collective errors of the broadcast as bp::dist errors.
class BP_API DistributedDataParallel : public Module {
 public:
  explicit DistributedDataParallel(std::shared_ptr<Module> module,
                                   const DistributedDataParallelOptions& options = {});
  ~DistributedDataParallel() override;

  // Finishes the previous iteration's reductions, then runs the module. Throws, once, the dist
  // error of a failed reduction, or Error naming the parameters that got no gradient when the
  // last backward did not finish (an exception inside it, an unused parameter); the iteration
  // is dropped and, with more than one rank, the process group aborted so the others learn.
  Tensor forward(const Tensor& input) override;
  std::string name() const override;

  Module& module() const noexcept { return *module_; }
  // Waits on the host until every gradient of the last backward() is averaged and throws the
  // error of a reduction that failed (or, as forward() does, Error when backward did not
  // finish). On devices with ordered streams backward itself does not wait on the host: call
  // this before the optimiser step or a checkpoint when a failed reduction must never reach the
  // parameters or the file, and before reading gradients outside a training loop.
  void synchronize_gradients();
  // Buckets as (number of parameters, bytes), in launch order (for tests and tuning).
  std::vector<std::pair<size_t, uint64_t>> bucket_layout() const;

 private:
  struct Bucket;
  struct Slot;
  void on_grad_ready(size_t slot);
  void launch_ready_buckets();
  void finish_backward();  // the last hook's part (Note [DDP errors])
  void finish_iteration(bool throw_unused);
  void reset_iteration();

  std::shared_ptr<Module> module_;
  DistributedDataParallelOptions opt_;
  dist::ProcessGroup* pg_;
  Device* device_ = nullptr;
  std::unique_ptr<Stream> comm_stream_;  // devices with ordered streams only
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  size_t next_launch_ = 0;  // buckets start in index order
  bool in_iteration_ = false;
  bool synced_ = false;  // gradients are bucket views for this iteration
};

}  // namespace nn

struct DistributedSamplerOptions {
  int num_replicas = -1;  // -1: the default group's world size (1 without a group)
  int rank = -1;          // -1: the default group's rank (0 without a group)
  bool shuffle = true;
  uint64_t seed = 0;  // the same on every rank
  // false: the index list is padded (repeating its start) to a multiple of num_replicas, so
  // every rank gets the same number; true: the tail that does not divide evenly is dropped.
  bool drop_last = false;
};

// Each rank's share of a dataset, like torch.utils.data.DistributedSampler: epoch e permutes
// 0..n-1 with a generator seeded with seed + e (std::mt19937_64 and a Fisher-Yates shuffle, the
// DataLoader's), pads or trims it to a multiple of num_replicas, and gives rank r the indices
// at positions r, r + num_replicas, ... — disjoint shards whose union is the whole epoch.
// Unlike PyTorch's, the epoch advances by itself after each pass (set_epoch overrides it), so a
// loop that forgets set_epoch still reshuffles. Error for rank outside [0, num_replicas).
class BP_API DistributedSampler : public Sampler {
 public:
  explicit DistributedSampler(const DistributedSamplerOptions& options = {});
  void set_epoch(int64_t epoch) noexcept { epoch_ = epoch; }
  int64_t epoch() const noexcept { return epoch_; }  // the next pass's
  int num_replicas() const noexcept { return replicas_; }
  int rank() const noexcept { return rank_; }
  int64_t num_samples(int64_t dataset_size) const override;
  std::vector<int64_t> next_epoch(int64_t dataset_size) override;
  // The indices of `epoch` for this rank, without advancing.
  std::vector<int64_t> indices(int64_t dataset_size, int64_t epoch) const;

 private:
  DistributedSamplerOptions opt_;
  int replicas_, rank_;
  int64_t epoch_ = 0;
};

}  // namespace bp
