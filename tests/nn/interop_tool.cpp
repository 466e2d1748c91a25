// Backplane's side of the Python interop checks (interop_test.py with NumPy, torch_roundtrip.py
// with PyTorch). Values follow one formula known to both sides, so each side can check the
// other's file without sharing anything else.
//
//   nn_interop_tool write <file> [device]    writes the dtype "zoo" (zoo.<dtype> [2, 3, 4]) and
//                                            a seeded Linear(3,4)-ReLU-Linear(4,1) state dict
//                                            with "input" and Backplane's "output" on it
//   nn_interop_tool check <file> [device]    checks every zoo.* tensor in a file written by
//                                            Python against the formula
//   nn_interop_tool forward <file> [device]  loads 0.weight 0.bias 2.weight 2.bias into that
//                                            MLP on the device, runs it on "input", prints the
//                                            output as JSON and compares with "expected_output"
//
// The device defaults to the best one (cuda:0 when present, else cpu:0). Exit status 0 when
// every check passes.
#include <backplane/backplane.hpp>
#include <backplane/nn.hpp>
#include <backplane/serialize.hpp>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>

namespace {

// The zoo formula: element i of zoo.<dtype> (all exact in every dtype, bf16 included).
double zoo_value(bp::DType dt, int64_t i) {
  int64_t k = (i * 7) % 23;
  switch (dt) {
    case bp::DType::boolean:
      return i % 3 == 0 ? 1.0 : 0.0;
    case bp::DType::u8:
      return static_cast<double>((i * 37) % 251);
    case bp::DType::i32:
    case bp::DType::i64:
      return static_cast<double>((k - 11) * 1000003);
    default:
      return static_cast<double>(k - 11) * 0.25;
  }
}

const bp::DType kZoo[] = {bp::DType::f32, bp::DType::f64, bp::DType::f16, bp::DType::bf16,
                          bp::DType::i32, bp::DType::i64, bp::DType::u8,  bp::DType::boolean};

bp::Tensor zoo_tensor(bp::DType dt, bp::Device& d) {
  std::vector<double> v(24);
  for (int64_t i = 0; i < 24; ++i) v[static_cast<size_t>(i)] = zoo_value(dt, i);
  bp::Tensor t = bp::from_vector(v, {2, 3, 4}, bp::device("cpu:0")).to(dt);
  return t.to(d);
}

std::unique_ptr<bp::nn::Sequential> mlp(bp::Device& d) {
  auto net = std::make_unique<bp::nn::Sequential>();
  net->add<bp::nn::Linear>(3, 4, true, d);
  net->add<bp::nn::ReLU>();
  net->add<bp::nn::Linear>(4, 1, true, d);
  return net;
}

std::string json_list(const std::vector<double>& v) {
  std::string s = "[";
  char buf[64];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.9g", i ? ", " : "", v[i]);
    s += buf;
  }
  return s + "]";
}

int write(const std::string& path, bp::Device& d) {
  std::map<std::string, bp::Tensor> out;
  for (bp::DType dt : kZoo) {
    if (dt == bp::DType::f64 && !d.properties().supports_f64) continue;
    out["zoo." + std::string(bp::dtype_name(dt))] = zoo_tensor(dt, d);
  }
  bp::manual_seed(2026);
  auto net = mlp(d);
  for (auto& [k, t] : net->state_dict()) out[k] = t;
  bp::Tensor x = bp::uniform({5, 3}, -2.0, 2.0, d);
  bp::Tensor y = net->forward(x);
  out["input"] = x;
  out["output"] = y;
  bp::save(out, path, {{"format", "pt"}, {"written_by", "backplane nn_interop_tool"}});
  std::cout << "wrote " << path << " from " << d.str() << "\n";
  std::cout << "output " << json_list(y.to_vector<double>()) << "\n";
  return 0;
}

int check(const std::string& path, bp::Device& d) {
  auto all = bp::load_file(path, d);
  int failures = 0, checked = 0;
  for (bp::DType dt : kZoo) {
    auto it = all.find("zoo." + std::string(bp::dtype_name(dt)));
    if (it == all.end()) continue;
    ++checked;
    const bp::Tensor& t = it->second;
    bool ok = t.dtype() == dt && t.shape() == bp::Shape{2, 3, 4} && &t.device() == &d;
    std::vector<double> v = t.to_vector<double>();
    for (int64_t i = 0; ok && i < 24; ++i) ok = v[static_cast<size_t>(i)] == zoo_value(dt, i);
    std::cout << (ok ? "PASS " : "FAIL ") << it->first << " on " << d.str() << "\n";
    failures += !ok;
  }
  if (checked == 0) {
    std::cout << "FAIL no zoo.* tensors in " << path << "\n";
    return 1;
  }
  return failures ? 1 : 0;
}

int forward(const std::string& path, bp::Device& d) {
  auto net = mlp(bp::device("cpu:0"));
  bp::load(*net, path, d, bp::nn::LoadOptions{.strict = false});
  auto all = bp::load_file(path, d);
  bp::Tensor y = net->forward(all.at("input"));
  std::vector<double> got = y.to_vector<double>();
  std::cout << "output " << json_list(got) << "\n";
  auto it = all.find("expected_output");
  if (it == all.end()) return 0;
  std::vector<double> want = it->second.to_vector<double>();
  double err = 0, norm = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    err += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  double rel = std::sqrt(err / (norm > 0 ? norm : 1));
  bool ok = got.size() == want.size() && rel <= 1e-5;
  std::cout << (ok ? "PASS" : "FAIL") << " forward on " << d.str() << ": relative error " << rel
            << "\n";
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: nn_interop_tool write|check|forward <file> [device]\n";
    return 2;
  }
  std::string mode = argv[1], path = argv[2];
  try {
    bp::Device& d = argc > 3 ? bp::device(argv[3]) : bp::try_device("cuda:0");
    if (mode == "write") return write(path, d);
    if (mode == "check") return check(path, d);
    if (mode == "forward") return forward(path, d);
    std::cerr << "unknown mode '" << mode << "'\n";
    return 2;
  } catch (const bp::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
