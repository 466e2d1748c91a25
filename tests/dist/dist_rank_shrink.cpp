// Scenario "shrink": data-parallel training of a small MLP with plain all_reduce loops; the
// ranks of --victim (one, or several as 1,3) kill themselves (SIGKILL) at step --kill-step; the
// survivors get a PeerError, shrink the group (agreeing through the store on who is alive, or
// with --explicit passing the victims), roll back to the last step every survivor completed,
// and train on. With --retire the victims leave cleanly instead (destroy_process_group) and the
// others shrink a group that has not failed. With --mismatch nobody dies: a MismatchError fails
// the group and shrink re-initialises the same ranks from a new store epoch. Every reduced gradient
// is checked against the sum of the participants' gradients, which each rank recomputes from the
// shared seed; after the shrink, the world size, the renumbered ranks (all_gather of the old
// ranks) and a broadcast from the last new rank are checked too.
#include "dist_rank.hpp"

#include <backplane_test/compare.hpp>

#include <backplane/nn.hpp>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>

namespace bpt {

namespace {

namespace d = bp::dist;
using bp::DType;
using bp::Tensor;

std::string arg(const std::vector<std::string>& args, const char* name, const char* def) {
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == name) return args[i + 1];
  return def;
}
std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t c; (c = s.find(',', start)) != std::string::npos; start = c + 1)
    out.push_back(s.substr(start, c - start));
  out.push_back(s.substr(start));
  return out;
}
bool flag(const std::vector<std::string>& args, const char* name) {
  for (const auto& a : args)
    if (a == name) return true;
  return false;
}

std::shared_ptr<bp::nn::Sequential> make_mlp(uint64_t seed) {
  bp::manual_seed(seed);
  auto net = std::make_shared<bp::nn::Sequential>();
  net->add<bp::nn::Linear>(8, 16);
  net->add<bp::nn::Tanh>();
  net->add<bp::nn::Linear>(16, 1);
  return net;
}

// Rank `who`'s batch of step `step` (fresh random data from the shared seed).
std::pair<Tensor, Tensor> batch(uint64_t seed, int who, int step) {
  bp::Generator gen(seed * 1000003ull + static_cast<uint64_t>(step) * 131ull +
                    static_cast<uint64_t>(who));
  bp::Device& cpu = bp::device("cpu:0");
  Tensor X = bp::uniform({32, 8}, -1.0, 1.0, cpu, DType::f32, &gen);
  Tensor Y = X.slice(1, 0, 1) * 0.7 - X.slice(1, 1, 2) * X.slice(1, 2, 3) +
             bp::uniform({32, 1}, -0.05, 0.05, cpu, DType::f32, &gen);
  return {X, Y};
}

// The flat f32 gradient of the MSE loss on rank `who`'s batch of `step` at the current
// parameters, and the loss.
Tensor local_gradient(bp::nn::Module& model, uint64_t seed, int who, int step, double* loss) {
  auto [X, Y] = batch(seed, who, step);
  auto params = model.parameters();
  for (auto& p : params) p.zero_grad();
  Tensor l = bp::nn::mse_loss(model(X), Y);
  l.backward();
  if (loss) *loss = l.item<double>();
  std::vector<float> flat;
  for (auto& p : params)
    for (float v : p.grad().to_vector<float>()) flat.push_back(v);
  return bp::from_vector<float>(flat, {static_cast<int64_t>(flat.size())}, bp::device("cpu:0"));
}

std::vector<Tensor> snapshot(bp::nn::Module& model) {
  std::vector<Tensor> s;
  for (auto& p : model.parameters()) s.push_back(p.clone());
  return s;
}

void restore(bp::nn::Module& model, const std::vector<Tensor>& s) {
  bp::NoGradGuard ng;
  auto params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(s[i]);
}

// p -= lr * mean gradient.
void sgd_step(bp::nn::Module& model, const Tensor& summed, int participants, double lr) {
  bp::NoGradGuard ng;
  int64_t at = 0;
  for (auto& p : model.parameters()) {
    int64_t n = p.numel();
    Tensor g = summed.slice(0, at, at + n).reshape(p.shape());
    p.copy_(p - g * (lr / participants));
    at += n;
  }
}

}  // namespace

int run_shrink(const std::vector<std::string>& args) {
  d::init_process_group();
  Checker ck;
  const int old_rank = d::get_rank(), old_world = d::get_world_size();
  ck.rank = old_rank;
  // --mismatch: nobody dies; at --kill-step rank 0 reduces with max where the others sum, every
  // rank gets a MismatchError, and shrink re-initialises the same ranks under a new epoch.
  const bool mismatch = flag(args, "--mismatch");
  std::vector<int> victims;
  if (!mismatch)
    for (const std::string& v : split(arg(args, "--victim", "2"))) victims.push_back(std::stoi(v));
  std::sort(victims.begin(), victims.end());
  auto is_victim = [&](int r) { return std::count(victims.begin(), victims.end(), r) > 0; };
  const bool retire = flag(args, "--retire");
  // --device cuda: the collectives run on cuda:<local rank> (NCCL), the checks on the host.
  bp::Device& dev = d::local_device(arg(args, "--device", "cpu"));
  const int kill_step = std::atoi(arg(args, "--kill-step", "5").c_str());
  const int steps = std::atoi(arg(args, "--steps", "20").c_str());
  const bool explicit_list = flag(args, "--explicit");
  ck.seed = shared_seed(args);
  if (old_rank == 0)
    std::printf("shrink: %d ranks, victim(s) %s %s at step %d, seed %llu\n", old_world,
                arg(args, "--victim", "2").c_str(), retire ? "leave" : "die", kill_step,
                static_cast<unsigned long long>(ck.seed));
  std::fflush(stdout);
  auto model = make_mlp(ck.seed);
  std::vector<int> participants;
  for (int r = 0; r < old_world; ++r) participants.push_back(r);

  // The loss on held-out batches, before and after training.
  auto eval_loss = [&] {
    bp::NoGradGuard ng;
    double sum = 0;
    for (int k = 0; k < 8; ++k) {
      auto [X, Y] = batch(ck.seed, 1000 + k, 0);
      sum += bp::nn::mse_loss((*model)(X), Y).item<double>();
    }
    return sum / 8;
  };
  const double first_loss = eval_loss();
  // Checks the shrink's result: the ranks dropped, the renumbering, an all_gather of the old
  // ranks and a broadcast from the last new rank.
  auto after_shrink = [&](const std::vector<int>& dropped) {
    if (dropped != victims)
      ck.fail("dropped", "shrink dropped " + std::to_string(dropped.size()) +
                             " rank(s), the first " +
                             (dropped.empty() ? "none" : std::to_string(dropped[0])));
    else
      ck.pass("dropped");
    for (int v : victims)
      participants.erase(std::find(participants.begin(), participants.end(), v));
    const int want_rank =
        old_rank - static_cast<int>(std::count_if(victims.begin(), victims.end(),
                                                  [&](int v) { return v < old_rank; }));
    const int want_world = old_world - static_cast<int>(victims.size());
    if (d::get_world_size() != want_world || d::get_rank() != want_rank)
      ck.fail("renumbered", "rank " + std::to_string(d::get_rank()) + " of " +
                                std::to_string(d::get_world_size()) + ", wanted " +
                                std::to_string(want_rank) + " of " + std::to_string(want_world));
    else
      ck.pass("renumbered");
    Tensor mine = bp::from_vector<int64_t>({old_rank}, {1}, dev);
    Tensor all = bp::zeros({d::get_world_size()}, dev, DType::i64);
    d::all_gather(all, mine).wait();
    std::vector<int64_t> want(participants.begin(), participants.end());
    if (all.to_vector<int64_t>() != want)
      ck.fail("all_gather_old_ranks", "the survivors' old ranks are not in order");
    else
      ck.pass("all_gather_old_ranks");
    Tensor b = bp::from_vector<int64_t>({old_rank * 100 + 7}, {1}, dev);
    d::broadcast(b, d::get_world_size() - 1).wait();
    if (b.item<int64_t>() != participants.back() * 100 + 7)
      ck.fail("broadcast_from_last", "got " + std::to_string(b.item<int64_t>()));
    else
      ck.pass("broadcast_from_last");
  };
  bool shrunk = false;
  std::vector<Tensor> before_step = snapshot(*model), before_previous = before_step;
  for (int step = 0; step < steps; ++step) {
    if (is_victim(old_rank) && step == kill_step) {
      if (retire) {
        std::printf("rank %d: leaving at step %d\n", old_rank, step);
        std::fflush(stdout);
        d::destroy_process_group();
        return 0;
      }
      std::printf("rank %d: killing itself at step %d\n", old_rank, step);
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
    if (retire && step == kill_step && !shrunk) {  // a planned shrink: no failure first
      after_shrink(explicit_list ? d::shrink_group(victims) : d::shrink_group());
      shrunk = true;
    }
    before_previous = std::move(before_step);
    before_step = snapshot(*model);
    Tensor g = local_gradient(*model, ck.seed, old_rank, step, nullptr);
    try {
      Tensor on_dev = g.to(dev);
      const bool odd_one = mismatch && !shrunk && step == kill_step && old_rank == 0;
      // A host wait (Note [Work waits]): on cuda, wait() is a stream wait, and a reduction
      // that a dead rank never joined is aborted by the watchdog with its output undefined;
      // the host wait throws before the gradient is used, as DDP's synchronize_gradients does.
      d::all_reduce(on_dev, odd_one ? d::ReduceOp::max : d::ReduceOp::sum)
          .wait(d::group().timeout());
      g = on_dev.to(bp::device("cpu:0"));
    } catch (const d::DistError& e) {
      std::string msg = e.what();
      const bool right_class = mismatch ? dynamic_cast<const d::MismatchError*>(&e) != nullptr
                                        : dynamic_cast<const d::PeerError*>(&e) != nullptr;
      if (!right_class)
        ck.fail("error_class", std::string("wanted a ") +
                                   (mismatch ? "MismatchError" : "PeerError") + ", got: " + msg);
      else if (mismatch && (shrunk || step != kill_step))
        ck.fail("mismatch_step", "a MismatchError at step " + std::to_string(step) + ": " + msg);
      else if (mismatch)
        ck.pass("mismatch_error");
      else if (shrunk || step < kill_step - 1 || step > kill_step)
        ck.fail("peer_error_step", "a PeerError at step " + std::to_string(step) + ": " + msg);
      else if (std::none_of(victims.begin(), victims.end(), [&](int v) {
                 return msg.find("rank " + std::to_string(v)) != std::string::npos;
               }))
        ck.fail("peer_error_names_victim", msg);
      else
        ck.pass("peer_error");
      after_shrink(explicit_list ? d::shrink_group(victims) : d::shrink_group());
      shrunk = true;
      // Resume from the first step some survivor did not complete.
      Tensor s = bp::from_vector<int64_t>({step}, {1}, dev);
      d::all_reduce(s, d::ReduceOp::min).wait();
      int resume = static_cast<int>(s.item<int64_t>());
      if (resume < step) restore(*model, before_previous);
      if (resume == step) restore(*model, before_step);
      step = resume - 1;
      before_step = snapshot(*model);
      continue;
    }
    // The reference: every participant's gradient at these parameters, summed in f64.
    std::vector<std::vector<double>> per;
    for (int p : participants)
      per.push_back(local_gradient(*model, ck.seed, p, step, nullptr).to_vector<double>());
    std::vector<double> ref(per[0].size(), 0.0), mag(per[0].size(), 0.0);
    for (const auto& v : per)
      for (size_t i = 0; i < v.size(); ++i) {
        ref[i] += v[i];
        mag[i] += std::fabs(v[i]);
      }
    bp_test::Tolerance tol;
    tol.rtol = bp_test::rtol(BP_DTYPE_F32, bp_test::OpClass::reduction);
    tol.magnitude = mag;
    bp_test::Verdict v = bp_test::compare(BP_DTYPE_F32, g.to_vector<double>(), ref, tol);
    std::string name = "gradient[step " + std::to_string(step) + ", " +
                       std::to_string(participants.size()) + " ranks]";
    if (v)
      ck.pass(name);
    else
      ck.fail(name, v.message);
    sgd_step(*model, g, static_cast<int>(participants.size()), 0.2);
  }
  if (!shrunk) ck.fail("shrunk", "no rank died: the group was never shrunk");
  // The survivors hold the same parameters, and the loss fell.
  std::vector<float> all_params;
  for (auto& p : model->parameters())
    for (float x : p.to_vector<float>()) all_params.push_back(x);
  Tensor mine = bp::from_vector<float>(all_params, {static_cast<int64_t>(all_params.size())}, dev);
  Tensor gathered = bp::zeros({d::get_world_size(), mine.numel()}, dev);
  d::all_gather(gathered, mine).wait();
  auto gv = gathered.to(bp::device("cpu:0")).to_vector<float>();
  bool same = true;
  for (int r = 0; r < d::get_world_size(); ++r)
    for (size_t i = 0; i < all_params.size(); ++i)
      same = same && gv[static_cast<size_t>(r) * all_params.size() + i] == all_params[i];
  if (same)
    ck.pass("same_parameters");
  else
    ck.fail("same_parameters", "the survivors' parameters differ");
  const double last_loss = eval_loss();
  if (last_loss < first_loss)
    ck.pass("loss_fell");
  else
    ck.fail("loss_fell", std::to_string(first_loss) + " -> " + std::to_string(last_loss));
  d::destroy_process_group();
  return ck.finish("shrink");
}

}  // namespace bpt
