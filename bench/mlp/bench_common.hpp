// Shared by bench/mlp and bench/train: timing a step on a device, running the PyTorch
// counterpart script and printing the comparison table.
//
// Timing (the same in the PyTorch scripts): after `warmup` steps, `iters` single steps each
// followed by Device::synchronize(), reported as the median; then `iters` steps queued
// back to back and synchronised once, reported as the mean per step.
#pragma once

#include <backplane/backplane.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace bench {

struct Timing {
  double median_us = 0, queued_us = 0;
};

template <typename Step>
Timing measure(bp::Device& dev, Step&& step, int iters, int warmup) {
  using clock = std::chrono::steady_clock;
  for (int i = 0; i < warmup; ++i) step();
  dev.synchronize();
  std::vector<double> us;
  us.reserve(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    auto t0 = clock::now();
    step();
    dev.synchronize();
    us.push_back(std::chrono::duration<double, std::micro>(clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  Timing t;
  t.median_us = us[us.size() / 2];
  auto t0 = clock::now();
  for (int i = 0; i < iters; ++i) step();
  dev.synchronize();
  t.queued_us = std::chrono::duration<double, std::micro>(clock::now() - t0).count() / iters;
  return t;
}

struct TorchResult {
  std::string device_type;  // "cpu", "cuda"
  Timing timing;
  std::string description;
  bool has_graph = false;  // a GRAPH line: the step captured in a CUDA graph and replayed
  Timing graph;
};

// Runs `python script --machine --iters N` and reads its RESULT lines. `note` says why there
// are none (no python, no torch, script failed).
inline std::vector<TorchResult> run_torch(const std::string& python, const std::string& script,
                                          int iters, std::string& note) {
  std::vector<TorchResult> out;
  std::string cmd =
      python + " '" + script + "' --machine --iters " + std::to_string(iters) + " 2>&1";
  if (!std::filesystem::exists(script)) {
    note = "script " + script + " not found (pass --torch-script)";
    return out;
  }
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) {
    note = "could not start " + python;
    return out;
  }
  char line[1024];
  std::string all;
  while (std::fgets(line, sizeof line, p)) {
    std::string s(line);
    all += s;
    if (s.rfind("RESULT ", 0) == 0) {
      std::istringstream is(s.substr(7));
      TorchResult r;
      is >> r.device_type >> r.timing.median_us >> r.timing.queued_us;
      std::getline(is >> std::ws, r.description);
      out.push_back(r);
    } else if (s.rfind("GRAPH ", 0) == 0) {
      std::istringstream is(s.substr(6));
      std::string type;
      Timing t;
      is >> type >> t.median_us >> t.queued_us;
      for (TorchResult& r : out)
        if (r.device_type == type) {
          r.has_graph = true;
          r.graph = t;
        }
    } else if (s.rfind("UNAVAILABLE ", 0) == 0) {
      note = s.substr(12);
      if (!note.empty() && note.back() == '\n') note.pop_back();
    }
  }
  int rc = ::pclose(p);
  if (out.empty() && note.empty())
    note = "the PyTorch script failed (status " + std::to_string(rc) + "): " + all.substr(0, 300);
  return out;
}

struct Row {
  std::string device, description;
  Timing ours;
  const TorchResult* torch = nullptr;
};

inline void print_table(const std::string& title, const std::vector<Row>& rows,
                        const std::string& torch_note) {
  std::printf("\n%s\n", title.c_str());
  std::printf("%-8s | %14s %14s | %14s %14s | %9s %9s\n", "device", "Backplane med", "queued",
              "PyTorch med", "queued", "ratio med", "queued");
  std::printf("%s\n", std::string(99, '-').c_str());
  for (const Row& r : rows) {
    if (r.torch) {
      std::printf("%-8s | %11.1f us %11.1f us | %11.1f us %11.1f us | %8.2fx %8.2fx\n",
                  r.device.c_str(), r.ours.median_us, r.ours.queued_us, r.torch->timing.median_us,
                  r.torch->timing.queued_us, r.ours.median_us / r.torch->timing.median_us,
                  r.ours.queued_us / r.torch->timing.queued_us);
    } else {
      std::printf("%-8s | %11.1f us %11.1f us | %14s %14s | %9s %9s\n", r.device.c_str(),
                  r.ours.median_us, r.ours.queued_us, "-", "-", "-", "-");
    }
  }
  std::printf("\nratio = Backplane time / PyTorch time (below 1: Backplane is faster)\n");
  for (const Row& r : rows) {
    std::printf("  %-8s Backplane: %s", r.device.c_str(), r.description.c_str());
    if (r.torch) std::printf("; PyTorch: %s", r.torch->description.c_str());
    std::printf("\n");
  }
  if (!torch_note.empty()) std::printf("PyTorch: %s\n", torch_note.c_str());
}

struct Args {
  int iters = 300, warmup = 30;
  bool torch = true;
  std::string python = "python3";
  std::string torch_script;          // --torch-script; empty: the default below
  std::vector<std::string> devices;  // empty: every device
};

// The PyTorch script: --torch-script, else the path baked in at build time, else the same
// path relative to the working folder (a build copied to another machine, run from the repo).
inline std::string find_script(const Args& a, const std::string& baked, const std::string& rel) {
  if (!a.torch_script.empty()) return a.torch_script;
  if (std::filesystem::exists(baked)) return baked;
  return rel;
}

inline Args parse_args(int argc, char** argv, const char* usage) {
  Args a;
  if (const char* py = std::getenv("BP_PYTHON")) a.python = py;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << usage;
        std::exit(2);
      }
      return argv[++i];
    };
    if (s == "--iters")
      a.iters = std::max(1, std::stoi(value()));
    else if (s == "--warmup")
      a.warmup = std::max(0, std::stoi(value()));
    else if (s == "--no-torch")
      a.torch = false;
    else if (s == "--python")
      a.python = value();
    else if (s == "--torch-script")
      a.torch_script = value();
    else if (s == "--device")
      a.devices.push_back(value());
    else {
      std::cerr << usage;
      std::exit(s == "--help" || s == "-h" ? 0 : 2);
    }
  }
  return a;
}

inline std::vector<bp::Device*> selected_devices(const Args& a) {
  std::vector<bp::Device*> out;
  if (a.devices.empty()) return bp::devices();
  for (const std::string& d : a.devices) out.push_back(&bp::device(d));
  return out;
}

inline const TorchResult* torch_for(const std::vector<TorchResult>& results, const bp::Device& d) {
  // PyTorch runs on cuda:0 and the CPU; compare like with like.
  if (d.type() == "cuda" && d.index() != 0) return nullptr;
  for (const TorchResult& r : results)
    if (r.device_type == d.type()) return &r;
  return nullptr;
}

}  // namespace bench
