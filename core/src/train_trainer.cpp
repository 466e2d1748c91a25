// Trainer: the training loop on one device (Note [Training on a device] in train.hpp).
#include <backplane/runtime.hpp>
#include <backplane/train.hpp>

#include <cmath>

namespace bp {

namespace {
Device& pick_device(const TrainerOptions& o) {
  if (!o.device.empty()) return device(o.device);
  if (o.num_gpus < 0)
    throw Error("Trainer: num_gpus must be >= 0, got " + std::to_string(o.num_gpus));
  if (o.num_gpus == 0) return device("cpu:0");
  // The first GPU of any backend, else the first other accelerator, else the CPU: the kind
  // the backend declares decides (DeviceProperties::kind), never its name.
  Registry& reg = Registry::process_default();
  for (DeviceKind kind : {DeviceKind::gpu, DeviceKind::accelerator}) {
    std::vector<Device*> found = reg.devices(kind);
    if (!found.empty()) return *found.front();
  }
  return device("cpu:0");
}
}  // namespace

Trainer::Trainer(TrainerOptions options) : opt_(std::move(options)), device_(&pick_device(opt_)) {
  if (opt_.max_epochs < 0)
    throw Error("Trainer: max_epochs must be >= 0, got " + std::to_string(opt_.max_epochs));
}

std::vector<double> Trainer::fit(nn::Module& model, DataLoader& data, const LossFn& loss_fn,
                                 const OptimizerFactory& make_optimizer) {
  Device& dev = *device_;
  if (data.num_batches() == 0)
    throw Error("Trainer::fit: the DataLoader yields no batch (" + std::to_string(data.size()) +
                " examples, batch_size " + std::to_string(data.options().batch_size) +
                (data.options().drop_last ? ", drop_last" : "") + ")");
  model.to(dev);
  if (model.has_uninitialized_parameters()) {
    NoGradGuard no_grad;
    model(data.first_batch().x.to(dev));
  }
  optimizer_ = make_optimizer(model.parameters());
  optim::Optimizer& opt = *optimizer_;
  model.train();
  std::vector<double> losses;
  for (int epoch = 0; epoch < opt_.max_epochs; ++epoch) {
    Tensor total;
    int64_t batches = 0;
    for (Batch batch : data) {
      Tensor x = batch.x.to(dev), y = batch.y.to(dev);
      Tensor loss = loss_fn(model(x), y);
      opt.zero_grad();
      loss.backward();
      if (opt_.gradient_clip_val > 0) nn::clip_grad_norm_(opt.parameters(), opt_.gradient_clip_val);
      opt.step();
      NoGradGuard no_grad;
      Tensor l = loss.detach();
      total = total.defined() ? total + l : l.clone();
      ++batches;
    }
    // The one read of the epoch: an explicit copy to the host.
    double mean = total.cpu().item<double>() / static_cast<double>(batches);
    losses.push_back(mean);
    if (opt_.on_epoch) opt_.on_epoch(epoch, mean);
  }
  return losses;
}

}  // namespace bp
