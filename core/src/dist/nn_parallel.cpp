// DistributedDataParallel (Note [Gradient buckets] in backplane/parallel.hpp) and
// DistributedSampler.
#include <backplane/parallel.hpp>

#include <algorithm>
#include <numeric>
#include <random>

namespace bp {

namespace nn {

struct DistributedDataParallel::Slot {
  Tensor param;
  std::string key;
  int64_t hook = 0;
  size_t bucket = 0;
  int64_t offset = 0;  // elements into the bucket
  bool ready = false;
};

struct DistributedDataParallel::Bucket {
  Tensor flat;  // the gradients of its parameters, back to back
  std::vector<size_t> slots;
  size_t pending = 0;  // parameters whose gradient has not arrived this iteration
  bool launched = false;
  dist::Work work;
  uint64_t bytes = 0;
};

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<Module> module,
                                                 const DistributedDataParallelOptions& options)
    : module_(std::move(module)), opt_(options) {
  if (!module_) throw Error("DistributedDataParallel: the module is null");
  pg_ = opt_.group ? opt_.group : &dist::group();
  if (module_->has_uninitialized_parameters())
    throw Error(
        "DistributedDataParallel: the module has uninitialised (lazy) parameters; run one "
        "forward pass (or load a state) before wrapping it");
  if (opt_.bucket_cap_mb <= 0)
    throw Error("DistributedDataParallel: bucket_cap_mb must be positive, got " +
                std::to_string(opt_.bucket_cap_mb));
  if (opt_.root < 0 || opt_.root >= pg_->size())
    throw Error("DistributedDataParallel: root " + std::to_string(opt_.root) +
                " is not a rank of the group of " + std::to_string(pg_->size()));
  register_module("module", module_);

  auto params = module_->named_parameters();
  for (const auto& [key, t] : params) {
    if (!device_) device_ = &t.device();
    if (&t.device() != device_)
      throw DeviceMismatch("DistributedDataParallel: parameters on several devices (" +
                           device_->str() + " and " + t.device().str() + ", " + key +
                           "); move the model to one device first");
  }
  // Everyone starts from the root's values.
  {
    NoGradGuard no_grad;
    std::vector<dist::Work> works;
    for (const auto& [key, t] : params) works.push_back(pg_->broadcast(t, opt_.root));
    if (opt_.broadcast_buffers)
      for (const auto& [key, t] : module_->named_buffers())
        works.push_back(pg_->broadcast(t, opt_.root));
    for (auto& w : works) w.wait();
  }
  if (params.empty()) return;
  // Buckets in reverse registration order, split at bucket_cap_mb and at dtype changes.
  uint64_t cap = static_cast<uint64_t>(opt_.bucket_cap_mb * 1024 * 1024);
  std::vector<std::vector<size_t>> groups;
  std::vector<uint64_t> sizes;
  DType group_dtype = DType::f32;
  for (size_t k = params.size(); k-- > 0;) {
    const Tensor& t = params[k].second;
    slots_.push_back(Slot{t, params[k].first});
    uint64_t bytes = static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype());
    if (groups.empty() || t.dtype() != group_dtype ||
        (sizes.back() > 0 && sizes.back() + bytes > cap)) {
      groups.emplace_back();
      sizes.push_back(0);
      group_dtype = t.dtype();
    }
    groups.back().push_back(slots_.size() - 1);
    sizes.back() += bytes;
  }
  for (size_t b = 0; b < groups.size(); ++b) {
    Bucket bucket;
    int64_t n = 0;
    for (size_t s : groups[b]) {
      slots_[s].bucket = b;
      slots_[s].offset = n;
      n += slots_[s].param.numel();
    }
    DType dt = slots_[groups[b][0]].param.dtype();
    bucket.flat = zeros({n}, *device_, dt);
    bucket.slots = groups[b];
    bucket.pending = groups[b].size();
    bucket.bytes = sizes[b];
    buckets_.push_back(std::move(bucket));
  }
  if (!device_->properties().unified_memory) comm_stream_ = device_->create_stream();
  for (size_t s = 0; s < slots_.size(); ++s)
    slots_[s].hook = slots_[s].param.register_post_accumulate_grad_hook(
        [this, s](const Tensor&) { on_grad_ready(s); });
}

DistributedDataParallel::~DistributedDataParallel() {
  for (auto& s : slots_)
    if (s.hook) s.param.remove_post_accumulate_grad_hook(s.hook);
}

std::string DistributedDataParallel::name() const {
  return "DistributedDataParallel(rank " + std::to_string(pg_->rank()) + " of " +
         std::to_string(pg_->size()) + ", " + std::to_string(buckets_.size()) + " buckets)";
}

std::vector<std::pair<size_t, uint64_t>> DistributedDataParallel::bucket_layout() const {
  std::vector<std::pair<size_t, uint64_t>> out;
  for (const auto& b : buckets_) out.emplace_back(b.slots.size(), b.bytes);
  return out;
}

void DistributedDataParallel::on_grad_ready(size_t s) {
  Slot& slot = slots_[s];
  // A second backward without a forward in between accumulates locally only (the reduction
  // of this iteration has started).
  if (slot.ready) return;
  Bucket& b = buckets_[slot.bucket];
  Tensor g = slot.param.grad();
  int64_t n = slot.param.numel();
  b.flat.slice(0, slot.offset, slot.offset + n).copy_(g.reshape({-1}));
  slot.ready = true;
  in_iteration_ = true;
  --b.pending;
  launch_ready_buckets();
}

void DistributedDataParallel::launch_ready_buckets() {
  // In index order on every rank (Note [Gradient buckets]). A bucket counts as launched only
  // once all_reduce returned: a refused call (CaptureError) numbered nothing.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    Bucket& b = buckets_[next_launch_];
    b.work = pg_->all_reduce(b.flat, dist::ReduceOp::avg, comm_stream_.get());
    b.launched = true;
    ++next_launch_;
  }
  if (next_launch_ == buckets_.size()) finish_backward();
}

// Note [DDP errors]
//   The last gradient hook (the end of backward) makes the gradients bucket views. On devices
//   with ordered streams the default stream waits for the reductions, without a host wait, and
//   a failure that is already known (the group failed, a reduction returned an error) is thrown
//   from backward; one that happens later is thrown by synchronize_gradients() (a host wait:
//   call it before the optimiser step or a checkpoint when a failed reduction must never reach
//   the parameters) and by the next forward() at the latest. On the CPU, and for reductions
//   staged through host memory (whose results reach the bucket only when waited for), the hook
//   waits on the host, so every failure is thrown from backward.
//   An iteration that did not finish (backward interrupted by an exception, a parameter that
//   got no gradient, a reduction refused) is dropped by the next forward() or
//   synchronize_gradients(), which throw once, naming the parameters; the iteration state is
//   reset, so the wrapper stays usable. With more than one rank the other ranks may be waiting
//   in reductions this rank never issued, or would pair them with the next iteration's, so the
//   process group is aborted with the same message: every rank learns at once, and training
//   resumes from a new group (and a checkpoint), as with PyTorch's elastic restarts.
void DistributedDataParallel::finish_backward() {
  if (synced_) return;
  synced_ = true;
  bool host_wait = !comm_stream_;
  for (const auto& b : buckets_) host_wait = host_wait || b.work.staged();
  if (!host_wait) {
    // Stream-ordered: the default stream waits for the reductions.
    std::unique_ptr<Event> e = device_->create_event();
    e->record(*comm_stream_);
    device_->default_stream().wait(*e);
  }
  for (auto& b : buckets_) {
    if (host_wait)
      b.work.wait();
    else
      b.work.is_completed();  // throws a failure already known; never blocks
  }
  for (auto& s : slots_) {
    const Bucket& b = buckets_[s.bucket];
    s.param.set_grad(
        b.flat.slice(0, s.offset, s.offset + s.param.numel()).reshape(s.param.shape()));
  }
}

void DistributedDataParallel::synchronize_gradients() {
  if (!in_iteration_) return;
  if (next_launch_ < buckets_.size()) finish_iteration(true);  // throws (Note [DDP errors])
  finish_backward();
  // A host wait (Note [Work waits]: wait() alone is a stream wait on GPUs), so a failed
  // reduction throws here, before the optimiser step or a checkpoint uses the gradients.
  for (auto& b : buckets_) b.work.wait(pg_->timeout());
}

void DistributedDataParallel::reset_iteration() {
  for (auto& b : buckets_) {
    b.pending = b.slots.size();
    b.launched = false;
    b.work = dist::Work();
  }
  for (auto& s : slots_) s.ready = false;
  next_launch_ = 0;
  in_iteration_ = false;
  synced_ = false;
}

void DistributedDataParallel::finish_iteration(bool throw_unused) {
  if (in_iteration_ && next_launch_ < buckets_.size()) {
    std::string missing;
    size_t count = 0;
    for (const auto& s : slots_)
      if (!s.ready) {
        if (count++ < 8) missing += (missing.empty() ? "" : ", ") + s.key;
      }
    std::string msg =
        "DistributedDataParallel: the last backward did not finish: " +
        (count ? std::to_string(count) + " parameter(s) got no gradient (" + missing +
                     (count > 8 ? ", ..." : "") + ")"
               : std::string("every gradient arrived")) +
        " and " + std::to_string(buckets_.size() - next_launch_) + " of " +
        std::to_string(buckets_.size()) +
        " buckets were not reduced; either backward was interrupted by an exception, or a "
        "parameter does not take part in the loss (unused parameters are not supported). The "
        "iteration is dropped";
    reset_iteration();
    if (pg_->size() > 1) {
      msg += "; the ranks are out of step, so the process group is aborted";
      pg_->abort(msg);
    }
    if (throw_unused) throw Error(msg);
    return;
  }
  // Errors of the last reductions surface here at the latest (Note [DDP errors]).
  try {
    for (auto& b : buckets_)
      if (b.launched) b.work.wait();
  } catch (...) {
    reset_iteration();
    throw;
  }
  reset_iteration();
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  finish_iteration(true);
  // The hooks sit on the parameter tensors of construction time and the buckets on their
  // dtypes and device: load_state_dict replaces tensors, and to() / to(DType) change them in
  // place (Note [Module state] in nn.hpp).
  auto now = module_->parameters();
  bool same = now.size() == slots_.size();
  std::string changed;
  for (size_t k = 0; same && k < now.size(); ++k) {
    const Slot& slot = slots_[now.size() - 1 - k];
    same = now[k].is_same(slot.param);
    const DType built = buckets_[slot.bucket].flat.dtype();
    if (same && (now[k].dtype() != built || &now[k].device() != device_)) {
      same = false;
      changed = " (" + slot.key + " is now " + std::string(dtype_name(now[k].dtype())) + " on " +
                now[k].device().str() + "; the buckets hold " + std::string(dtype_name(built)) +
                " on " + device_->str() + ")";
    }
  }
  if (!same)
    throw Error(
        "DistributedDataParallel: the module's parameters were replaced or changed after it "
        "was wrapped" +
        changed +
        " (load_state_dict makes new tensors, to() and to(DType) change them); move or load "
        "the model first, then build DistributedDataParallel");
  return module_->forward(input);
}

}  // namespace nn

// ---- DistributedSampler -------------------------------------------------------------------------

DistributedSampler::DistributedSampler(const DistributedSamplerOptions& options) : opt_(options) {
  bool group = dist::is_initialized();
  replicas_ = opt_.num_replicas >= 0 ? opt_.num_replicas : group ? dist::get_world_size() : 1;
  rank_ = opt_.rank >= 0 ? opt_.rank : group ? dist::get_rank() : 0;
  if (replicas_ < 1)
    throw Error("DistributedSampler: num_replicas must be at least 1, got " +
                std::to_string(replicas_));
  if (rank_ >= replicas_)
    throw Error("DistributedSampler: rank " + std::to_string(rank_) +
                " is not below num_replicas " + std::to_string(replicas_));
}

int64_t DistributedSampler::num_samples(int64_t n) const {
  int64_t r = replicas_;
  if (opt_.drop_last && n % r != 0) return std::max<int64_t>((n - r + r - 1) / r, 0);
  return (n + r - 1) / r;
}

std::vector<int64_t> DistributedSampler::indices(int64_t n, int64_t epoch) const {
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), int64_t{0});
  if (opt_.shuffle) {
    // The DataLoader's shuffle (Fisher-Yates with an explicit reduction), seeded per epoch.
    std::mt19937_64 rng(opt_.seed + static_cast<uint64_t>(epoch));
    for (size_t i = all.size(); i > 1; --i) {
      size_t j = static_cast<size_t>(rng() % i);
      std::swap(all[i - 1], all[j]);
    }
  }
  int64_t per = num_samples(n);
  size_t total = static_cast<size_t>(per * replicas_);
  if (!opt_.drop_last) {
    all.reserve(total);
    for (size_t k = 0; all.size() < total && n > 0; ++k) all.push_back(all[k]);  // pad
  } else {
    all.resize(total);
  }
  std::vector<int64_t> mine;
  for (size_t k = static_cast<size_t>(rank_); k < total; k += static_cast<size_t>(replicas_))
    mine.push_back(all[k]);
  return mine;
}

std::vector<int64_t> DistributedSampler::next_epoch(int64_t n) {
  return indices(n, epoch_++);
}

}  // namespace bp
