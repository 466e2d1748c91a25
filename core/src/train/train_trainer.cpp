// Trainer: the training loop on one device (Note [Training on a device] in train.hpp).
#include <backplane/errors.hpp>
#include <backplane/runtime.hpp>
#include <backplane/train.hpp>

#include <unistd.h>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

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
std::string hms(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) seconds = 0;
  auto t = static_cast<long long>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
  return buf;
}

// Note [Training progress] in train.hpp.
class ProgressReporter {
 public:
  ProgressReporter(const TrainerOptions& o, int64_t batches_per_epoch)
      : epochs_(o.max_epochs), batches_(batches_per_epoch), out_(o.progress_stream) {
    if (!out_) out_ = &std::cerr;
    mode_ = o.progress;
    if (mode_ == Progress::automatic)
      mode_ = (!o.progress_stream && isatty(STDERR_FILENO)) ? Progress::terminal : Progress::lines;
    every_ = o.progress_every > 0 ? o.progress_every : std::max<int64_t>(1, batches_ / 10);
    start_ = last_ = Clock::now();
  }
  bool on() const { return mode_ != Progress::off; }
  // After batch `batch` (1-based) of `epoch` (0-based); `samples` so far in the epoch. Returns
  // whether a report is due (the caller then reads the loss and calls report()).
  bool due(int64_t batch) {
    if (!on()) return false;
    if (batch == batches_) return true;
    if (mode_ == Progress::lines) return batch % every_ == 0;
    return Clock::now() - last_ >= std::chrono::milliseconds(100);
  }
  void report(int epoch, int64_t batch, double loss, int64_t samples_epoch) {
    auto now = Clock::now();
    last_ = now;
    double epoch_s = std::chrono::duration<double>(now - epoch_start_).count();
    double total_s = std::chrono::duration<double>(now - start_).count();
    int64_t done = static_cast<int64_t>(epoch) * batches_ + batch;
    int64_t left = static_cast<int64_t>(epochs_) * batches_ - done;
    double eta = done > 0 ? total_s / static_cast<double>(done) * static_cast<double>(left) : 0;
    double rate = epoch_s > 0 ? static_cast<double>(samples_epoch) / epoch_s : 0;
    char line[256];
    std::snprintf(line, sizeof line, "epoch %d/%d batch %lld/%lld loss %.6f samples/s %.1f eta %s",
                  epoch + 1, epochs_, static_cast<long long>(batch),
                  static_cast<long long>(batches_), loss, rate, hms(eta).c_str());
    if (mode_ == Progress::terminal) {
      *out_ << '\r' << line << "\033[K";
      if (batch == batches_) *out_ << '\n';
    } else {
      *out_ << line << '\n';
    }
    out_->flush();
  }
  void start_epoch() { epoch_start_ = Clock::now(); }

 private:
  using Clock = std::chrono::steady_clock;
  int epochs_;
  int64_t batches_;
  std::ostream* out_;
  Progress mode_;
  int64_t every_ = 1;
  Clock::time_point start_, last_, epoch_start_;
};

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
  ProgressReporter progress(opt_, data.num_batches());
  std::ofstream csv;
  if (!opt_.metrics_csv.empty()) {
    csv.open(opt_.metrics_csv, std::ios::trunc);
    if (!csv)
      throw IOError("Trainer: cannot open metrics_csv '" + opt_.metrics_csv +
                    "' for writing (does its folder exist?)");
    csv << "epoch,loss,batches,samples,seconds,samples_per_s\n";
    csv.flush();
  }
  for (int epoch = 0; epoch < opt_.max_epochs; ++epoch) {
    Tensor total;
    int64_t batches = 0, samples = 0;
    progress.start_epoch();
    auto epoch_start = std::chrono::steady_clock::now();
    for (Batch batch : data) {
      samples += batch.x.rank() > 0 ? batch.x.size(0) : 1;
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
      if (progress.due(batches) && batches < data.num_batches())
        progress.report(epoch, batches, total.cpu().item<double>() / static_cast<double>(batches),
                        samples);
    }
    // The one read of the epoch: an explicit copy to the host.
    double mean = total.cpu().item<double>() / static_cast<double>(batches);
    losses.push_back(mean);
    if (progress.on()) progress.report(epoch, batches, mean, samples);
    if (csv.is_open()) {
      double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
      char row[192];
      std::snprintf(row, sizeof row, "%d,%.9g,%lld,%lld,%.6f,%.3f\n", epoch + 1, mean,
                    static_cast<long long>(batches), static_cast<long long>(samples), secs,
                    secs > 0 ? static_cast<double>(samples) / secs : 0.0);
      csv << row;
      csv.flush();
      if (!csv) throw IOError("Trainer: writing metrics_csv '" + opt_.metrics_csv + "' failed");
    }
    if (opt_.on_epoch) opt_.on_epoch(epoch, mean);
  }
  return losses;
}

}  // namespace bp
