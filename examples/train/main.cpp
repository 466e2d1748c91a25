// docs/names.md, walkthrough item 13: a training loop that moves the model and each batch to the
// first GPU if there is one (the Trainer with num_gpus), so the same code runs on a CPU-only
// machine. A small MLP learns a synthetic regression problem; the same run is then repeated on the
// CPU and the two loss curves are compared. Progress shows on stderr (a redrawn line on a
// terminal), and the two loss curves are drawn into an SVG (argv[1], default train_loss.svg).
#include <backplane/backplane.hpp>
#include <backplane/nn.hpp>
#include <backplane/train.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

namespace {

// y = tanh(2 x0) + 0.5 x1^2 - x2 + noise: not linear, so the hidden layer has work to do.
// Made on the CPU from a fixed seed: the same data for every run.
bp::DataLoader make_data() {
  bp::Device& cpu = bp::device("cpu:0");
  bp::Generator gen(7);
  bp::Tensor X = bp::uniform({1024, 3}, -1.0, 1.0, cpu, bp::DType::f32, &gen);
  bp::Tensor x0 = X.slice(1, 0, 1), x1 = X.slice(1, 1, 2), x2 = X.slice(1, 2, 3);
  bp::Tensor noise = bp::uniform({1024, 1}, -0.01, 0.01, cpu, bp::DType::f32, &gen);
  bp::Tensor Y = (x0 * 2.0).tanh() + x1 * x1 * 0.5 - x2 + noise;
  return bp::DataLoader(X, Y, {.batch_size = 64, .shuffle = true, .seed = 1});
}

std::vector<double> train(const bp::TrainerOptions& where) {
  bp::manual_seed(42);  // the same initial weights on every device (Philox)
  bp::nn::Sequential net;
  net.add<bp::nn::LazyLinear>(32);  // input size taken from the first batch
  net.add<bp::nn::Tanh>();
  net.add<bp::nn::Linear>(32, 1);
  bp::DataLoader data = make_data();
  bp::TrainerOptions options = where;
  options.max_epochs = 15;
  options.gradient_clip_val = 1.0;
  options.on_epoch = [](int epoch, double loss) {
    std::printf("  epoch %2d  loss %.6f\n", epoch + 1, loss);
  };
  options.progress = bp::Progress::automatic;  // Note [Training progress]
  options.progress_every = 8;
  bp::Trainer trainer(options);
  std::cout << "training on " << trainer.device().str() << " ("
            << trainer.device().properties().name << ")\n";
  auto losses = trainer.fit(net, data, bp::nn::mse_loss, bp::sgd({.lr = 0.1, .momentum = 0.9}));
  std::cout << "  weight of layer 0 is on " << net.get<bp::nn::Linear>(0).weight().device().str()
            << "\n";
  return losses;
}

// The loss curves as a hand-written SVG: one polyline per run, loss on a log scale.
void write_loss_svg(const std::string& path,
                    const std::vector<std::pair<std::string, std::vector<double>>>& runs) {
  const double w = 640, h = 400, left = 70, right = 20, top = 40, bottom = 50;
  double lo = 1e300, hi = 0;
  size_t epochs = 0;
  for (const auto& [name, losses] : runs) {
    for (double l : losses) {
      lo = std::min(lo, std::max(l, 1e-12));
      hi = std::max(hi, l);
    }
    epochs = std::max(epochs, losses.size());
  }
  double ylo = std::floor(std::log10(lo)), yhi = std::ceil(std::log10(hi));
  if (yhi <= ylo) yhi = ylo + 1;
  auto x_of = [&](size_t e) {
    return left + (w - left - right) * (epochs > 1 ? double(e) / double(epochs - 1) : 0.5);
  };
  auto y_of = [&](double l) {
    return top + (h - top - bottom) * (yhi - std::log10(std::max(l, 1e-12))) / (yhi - ylo);
  };
  std::ofstream f(path);
  if (!f) throw bp::IOError("cannot write " + path);
  char buf[256];
  f << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << h
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << w / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">"
    << "Training loss per epoch</text>\n";
  for (double d = ylo; d <= yhi; d += 1) {  // decades
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%g\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                  "<text x=\"%g\" y=\"%.1f\" text-anchor=\"end\">1e%d</text>\n",
                  left, y_of(std::pow(10, d)), w - right, y_of(std::pow(10, d)), left - 6,
                  y_of(std::pow(10, d)) + 4, static_cast<int>(d));
    f << buf;
  }
  for (size_t e = 0; e < epochs; ++e) {
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\">%zu</text>\n",
                  x_of(e), h - bottom + 18, e + 1);
    f << buf;
  }
  f << "<text x=\"" << w / 2 << "\" y=\"" << h - 10 << "\" text-anchor=\"middle\">epoch</text>\n"
    << "<text x=\"16\" y=\"" << h / 2 << "\" transform=\"rotate(-90 16 " << h / 2
    << ")\" text-anchor=\"middle\">mean batch loss (MSE)</text>\n";
  const char* colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd"};
  for (size_t r = 0; r < runs.size(); ++r) {
    const char* c = colours[r % 4];
    f << "<polyline fill=\"none\" stroke=\"" << c << "\" stroke-width=\"2\""
      << (r ? " stroke-dasharray=\"6 4\"" : "") << " points=\"";
    for (size_t e = 0; e < runs[r].second.size(); ++e) {
      std::snprintf(buf, sizeof buf, "%s%.1f,%.1f", e ? " " : "", x_of(e), y_of(runs[r].second[e]));
      f << buf;
    }
    f << "\"/>\n";
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"%s\" stroke-width=\"2\"/>"
                  "<text x=\"%g\" y=\"%g\">",
                  w - right - 190, top + 12 + 18.0 * r, w - right - 160, top + 12 + 18.0 * r, c,
                  w - right - 152, top + 16 + 18.0 * r);
    f << buf << runs[r].first << "</text>\n";
  }
  f << "</svg>\n";
  if (!f) throw bp::IOError("writing " + path + " failed");
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string svg = argc > 1 ? argv[1] : "train_loss.svg";
  // The first GPU if there is one, else the CPU (like d2l's Trainer(num_gpus=1)).
  std::vector<double> best = train({.num_gpus = 1});
  std::string best_name = bp::Trainer({.num_gpus = 1}).device().str();
  std::cout << "\n";
  std::vector<double> cpu = train({.device = "cpu:0"});
  write_loss_svg(svg, {{best_name + " (num_gpus=1)", best}, {"cpu:0", cpu}});
  std::printf("\nloss curves written to %s\n", svg.c_str());

  bool falling = best.back() < best.front() / 5;
  double worst = 0;
  for (size_t e = 0; e < best.size(); ++e)
    worst = std::max(worst, std::fabs(best[e] - cpu[e]) / std::max(cpu[e], 1e-12));
  bool close = worst < 1e-2;
  std::printf("\nloss fell from %.4f to %.6f: %s\n", best.front(), best.back(),
              falling ? "yes" : "NO");
  std::printf("largest relative difference between the two devices' epoch losses: %.2e (%s)\n",
              worst, close ? "within 1e-2" : "OUT OF TOLERANCE");
  return falling && close ? 0 : 1;
} catch (const bp::Error& e) {
  std::cerr << "error: " << e.what() << "\n";
  return 1;
}
