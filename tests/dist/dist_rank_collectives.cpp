// Scenario "collectives": every collective, dtype and reduction against a float64 host
// reference, odd sizes, empty and non-contiguous tensors, point to point, barriers. Every rank
// regenerates every rank's inputs from the shared seed, so each checks the whole result.
#include "dist_rank.hpp"

#include <backplane_test/compare.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>

namespace bpt {

namespace {

namespace d = bp::dist;
using bp::DType;
using bp::Tensor;

const DType kDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                         DType::i32, DType::i64, DType::u8,  DType::boolean};
const d::ReduceOp kOps[] = {d::ReduceOp::sum, d::ReduceOp::avg, d::ReduceOp::min, d::ReduceOp::max};

std::string name_of(DType t) {
  return std::string(bp::dtype_name(t));
}

// Fresh random values of `dt` for (rank, case), on the CPU: floats in [-1, 1), integers in
// [-1000, 1000), u8 small enough that a sum over the world stays below 256, bool 0/1.
Tensor make_data(DType dt, int64_t n, uint64_t seed, int rank, int salt, int world) {
  bp::Device& cpu = bp::device("cpu:0");
  bp::Generator gen(seed * 1000003ull + static_cast<uint64_t>(salt) * 131ull +
                    static_cast<uint64_t>(rank));
  switch (dt) {
    case DType::i32:
    case DType::i64:
      return bp::uniform({n}, -1000.0, 1000.0, cpu, DType::f64, &gen).to(dt);
    case DType::u8:
      return bp::uniform({n}, 0.0, 255.0 / world, cpu, DType::f64, &gen).to(dt);
    case DType::boolean:
      return bp::gt(bp::uniform({n}, 0.0, 1.0, cpu, DType::f64, &gen), 0.5);
    default:
      return bp::uniform({n}, -1.0, 1.0, cpu, DType::f64, &gen).to(dt);
  }
}

std::vector<double> host(const Tensor& t) {
  return t.to_vector<double>();
}

bool floating(DType t) {
  return bp::is_floating(t);
}

double reduce2(double a, double b, d::ReduceOp op, DType dt) {
  if (dt == DType::boolean) return op == d::ReduceOp::min ? (a && b) : (a || b);
  switch (op) {
    case d::ReduceOp::min:
      return std::min(a, b);
    case d::ReduceOp::max:
      return std::max(a, b);
    default:
      return a + b;
  }
}

std::vector<double> reference(const std::vector<std::vector<double>>& per_rank, d::ReduceOp op,
                              DType dt) {
  std::vector<double> r = per_rank[0];
  for (size_t k = 1; k < per_rank.size(); ++k)
    for (size_t i = 0; i < r.size(); ++i) r[i] = reduce2(r[i], per_rank[k][i], op, dt);
  if (op == d::ReduceOp::avg)
    for (double& v : r) v /= static_cast<double>(per_rank.size());
  if (dt == DType::u8 && op == d::ReduceOp::sum)
    for (double& v : r) v = std::fmod(v, 256.0);
  return r;
}

// Per element, the sum of |x| over the ranks (divided by the world size for avg): the scale of
// a sum's or average's rounding error. Empty for other ops.
std::vector<double> magnitude(const std::vector<std::vector<double>>& per_rank, d::ReduceOp op) {
  if (op != d::ReduceOp::sum && op != d::ReduceOp::avg) return {};
  std::vector<double> m(per_rank[0].size(), 0.0);
  for (const auto& v : per_rank)
    for (size_t i = 0; i < m.size(); ++i) m[i] += std::fabs(v[i]);
  if (op == d::ReduceOp::avg)
    for (double& v : m) v /= static_cast<double>(per_rank.size());
  return m;
}

// Through the tests' one comparison (tests/support's compare.hpp): integers and bool exactly;
// floating point with the table's reduction tolerance, times the world size for f16/bf16 (whose
// partial sums each round), each element measured against `mag`, the sum of the magnitudes
// reduced into it, when given (values of both signs can cancel to almost nothing, where an error
// relative to the result means nothing). "" when they agree, else the reason.
std::string compare(const std::vector<double>& out, const std::vector<double>& ref, DType dt,
                    int world, const std::vector<double>& mag = {}) {
  const int32_t id = static_cast<int32_t>(dt);
  bp_test::Tolerance tol;
  if (floating(dt))
    tol.rtol = bp_test::rtol(id, bp_test::OpClass::reduction) *
               (dt == DType::f16 || dt == DType::bf16 ? world : 1);
  tol.magnitude = mag;
  bp_test::Verdict v = bp_test::compare(id, out, ref, tol);
  return v ? "" : v.message;
}

struct Ctx {
  Checker& ck;
  bp::Device& dev;
  uint64_t seed;
  int rank, world;
  int salt = 0;
  bool staged = false;  // no loaded communicator plugin declares dev's type (Note [Host staging])
  void expect(const std::string& name, const std::string& why) {
    if (why.empty())
      ck.pass(name);
    else
      ck.fail(name, why);
  }
  std::vector<std::vector<double>> all_inputs(DType dt, int64_t n, int s) {
    std::vector<std::vector<double>> v;
    for (int r = 0; r < world; ++r) v.push_back(host(make_data(dt, n, seed, r, s, world)));
    return v;
  }
  Tensor mine(DType dt, int64_t n, int s) { return make_data(dt, n, seed, rank, s, world).to(dev); }
};

std::string case_name(const char* op, DType dt, int64_t n, const std::string& extra = "") {
  return std::string(op) + "[" + name_of(dt) + ",n=" + std::to_string(n) +
         (extra.empty() ? "" : "," + extra) + "]";
}

void all_reduce_cases(Ctx& c) {
  for (DType dt : kDTypes)
    for (d::ReduceOp op : kOps)
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{4097}, int64_t{100003}}) {
        std::string name = case_name("all_reduce", dt, n, d::reduce_op_name(op));
        if (op == d::ReduceOp::avg && !floating(dt)) {
          try {
            d::all_reduce(c.mine(dt, n, c.salt), op);
            c.expect(name, "avg on an integer dtype did not throw");
          } catch (const bp::DTypeError& e) {
            c.expect(name,
                     std::string(e.what()).find("avg needs a floating dtype") != std::string::npos
                         ? ""
                         : std::string("unexpected message: ") + e.what());
          }
          continue;
        }
        int s = ++c.salt;
        Tensor t = c.mine(dt, n, s);
        d::Work w = d::all_reduce(t, op);
        w.wait();
        auto all = c.all_inputs(dt, n, s);
        std::string why = compare(host(t), reference(all, op, dt), dt, c.world, magnitude(all, op));
        if (why.empty() && w.staged() != c.staged)
          why = "staged() is " + std::to_string(w.staged()) + " on " + c.dev.str();
        c.expect(name, why);
      }
}

// Note [Collective checks]: a repeated signature is compared once (the default) or every time
// (BACKPLANE_DIST_CHECK=full); the flight recorder says which, and every result is right
// either way (on cuda, after a wait() that is a stream wait).
void check_mode_cases(Ctx& c) {
  const char* mode = std::getenv("BACKPLANE_DIST_CHECK");
  const bool full = mode && std::string(mode) == "full";
  std::vector<std::string> expected;
  for (int64_t n : {int64_t{3001}, int64_t{3001}, int64_t{3001}, int64_t{3001}, int64_t{3002}}) {
    const bool first = expected.empty() || n == 3002;
    expected.push_back(full || first ? "compared" : "repeat");
    int s = ++c.salt;
    Tensor t = c.mine(DType::f32, n, s);
    d::all_reduce(t).wait();
    auto all = c.all_inputs(DType::f32, n, s);
    c.expect(case_name("checks all_reduce", DType::f32, n, full ? "full" : "first call"),
             compare(host(t), reference(all, d::ReduceOp::sum, DType::f32), DType::f32, c.world,
                     magnitude(all, d::ReduceOp::sum)));
  }
  nlohmann::json rec = nlohmann::json::parse(d::flight_record());
  const auto& es = rec["entries"];
  std::string why;
  if (rec["rank"] != c.rank || rec["world_size"] != c.world || es.size() < expected.size()) {
    why = "flight record header or length wrong: " + rec.dump().substr(0, 300);
  } else {
    for (size_t i = 0; i < expected.size(); ++i) {
      const auto& e = es[es.size() - expected.size() + i];
      if (e["check"] != expected[i] || e["op"] != "all_reduce")
        why += "entry " + e.dump() + " should be an all_reduce with check " + expected[i] + "; ";
    }
    const int64_t s0 = es[es.size() - expected.size()]["seq"].get<int64_t>();
    for (size_t i = 1; i < expected.size(); ++i)
      if (es[es.size() - expected.size() + i]["seq"].get<int64_t>() != s0 + static_cast<int64_t>(i))
        why += "sequence numbers are not consecutive; ";
  }
  c.expect(std::string("flight record check labels (") + (full ? "full" : "first call") + ")", why);
}

void broadcast_cases(Ctx& c) {
  for (DType dt : {DType::f32, DType::i64, DType::bf16, DType::boolean, DType::u8})
    for (int root = 0; root < c.world; ++root) {
      int s = ++c.salt;
      int64_t n = 1001;
      Tensor t = c.mine(dt, n, s);
      d::broadcast(t, root).wait();
      c.expect(case_name("broadcast", dt, n, "root " + std::to_string(root)),
               compare(host(t), c.all_inputs(dt, n, s)[static_cast<size_t>(root)], dt, c.world));
    }
}

void all_gather_cases(Ctx& c) {
  for (DType dt : kDTypes)
    for (int64_t n : {int64_t{1}, int64_t{513}}) {
      int s = ++c.salt;
      Tensor in = c.mine(dt, n, s);
      Tensor out = bp::zeros({c.world, n}, c.dev, dt);
      d::all_gather(out, in).wait();
      std::vector<double> ref;
      for (auto& v : c.all_inputs(dt, n, s)) ref.insert(ref.end(), v.begin(), v.end());
      c.expect(case_name("all_gather", dt, n), compare(host(out), ref, dt, c.world));
    }
}

void reduce_scatter_cases(Ctx& c) {
  for (DType dt : kDTypes)
    for (d::ReduceOp op : kOps) {
      if (op == d::ReduceOp::avg && !floating(dt)) continue;
      int s = ++c.salt;
      int64_t n = 257;
      Tensor in = c.mine(dt, n * c.world, s);
      Tensor out = bp::zeros({n}, c.dev, dt);
      d::reduce_scatter(out, in, op).wait();
      auto all = c.all_inputs(dt, n * c.world, s);
      auto full = reference(all, op, dt), full_mag = magnitude(all, op);
      std::vector<double> ref(full.begin() + c.rank * n, full.begin() + (c.rank + 1) * n), mag;
      if (!full_mag.empty())
        mag.assign(full_mag.begin() + c.rank * n, full_mag.begin() + (c.rank + 1) * n);
      c.expect(case_name("reduce_scatter", dt, n, d::reduce_op_name(op)),
               compare(host(out), ref, dt, c.world, mag));
    }
}

void p2p_cases(Ctx& c) {
  for (DType dt : {DType::f32, DType::i32, DType::f16}) {
    int s = ++c.salt;
    int64_t n = 4099;
    int to = (c.rank + 1) % c.world, from = (c.rank + c.world - 1) % c.world;
    Tensor mine = c.mine(dt, n, s);
    Tensor got = bp::zeros({n}, c.dev, dt);
    // A ring exchange: every rank sends and receives, so the two go in one group.
    auto works = d::batch_isend_irecv({{d::ProcessGroup::P2POp::Kind::send, mine, to},
                                       {d::ProcessGroup::P2POp::Kind::recv, got, from}});
    for (auto& w : works) w.wait();
    c.expect(case_name("batch_isend_irecv_ring", dt, n),
             compare(host(got), c.all_inputs(dt, n, s)[static_cast<size_t>(from)], dt, c.world));
  }
  // One way: rank 0 sends to every other rank in turn, each receives once (plain send/recv).
  int s = ++c.salt;
  int64_t n = 777;
  if (c.rank == 0) {
    std::vector<d::Work> ws;
    for (int r = 1; r < c.world; ++r) ws.push_back(d::send(c.mine(DType::i64, n, s), r));
    for (auto& w : ws) w.wait();
    c.expect("send[i64,n=777,rank 0 to all]", "");
  } else {
    Tensor got = bp::zeros({n}, c.dev, DType::i64);
    d::recv(got, 0).wait();
    c.expect("recv[i64,n=777,from rank 0]",
             compare(host(got), c.all_inputs(DType::i64, n, s)[0], DType::i64, c.world));
  }
}

// Many receives from one peer in flight at once: rank 0 sends eight tensors of equal size and
// distinct values to rank 1 in one batch_isend_irecv, `rounds` times; every payload must land
// in the receive posted for it (send and recv match in call order per pair, comm_abi.h).
void p2p_burst_cases(Ctx& c, int rounds) {
  const int64_t n = 4096;
  const int per_batch = 8;
  int wrong = 0, first_round = -1, first_item = -1;
  for (int round = 0; round < rounds; ++round) {
    int s = c.salt;
    c.salt += per_batch;
    std::vector<d::ProcessGroup::P2POp> ops;
    std::vector<Tensor> got;
    for (int k = 0; k < per_batch; ++k) {
      if (c.rank == 0) {
        ops.push_back({d::ProcessGroup::P2POp::Kind::send, c.mine(DType::f32, n, s + k), 1});
      } else if (c.rank == 1) {
        got.push_back(bp::zeros({n}, c.dev, DType::f32));
        ops.push_back({d::ProcessGroup::P2POp::Kind::recv, got.back(), 0});
      }
    }
    if (ops.empty()) continue;
    for (auto& w : d::batch_isend_irecv(ops)) w.wait();
    for (size_t k = 0; k < got.size(); ++k) {
      std::vector<double> want =
          host(make_data(DType::f32, n, c.seed, 0, s + static_cast<int>(k), c.world));
      if (!compare(host(got[k]), want, DType::f32, c.world).empty()) {
        if (wrong++ == 0) {
          first_round = round;
          first_item = static_cast<int>(k);
        }
      }
    }
  }
  if (c.rank != 1) {
    c.expect("batch_isend_irecv_burst[send side]", "");
    return;
  }
  c.expect("batch_isend_irecv_burst[f32,n=4096,8 per batch,x" + std::to_string(rounds) + "]",
           wrong == 0
               ? ""
               : std::to_string(wrong) + " of " + std::to_string(rounds * per_batch) +
                     " receives held another send's payload (first: round " +
                     std::to_string(first_round) + ", receive " + std::to_string(first_item) + ")");
}

void empty_cases(Ctx& c) {
  Tensor e = bp::zeros({0}, c.dev);
  d::all_reduce(e).wait();
  d::broadcast(e, c.world - 1).wait();
  Tensor out = bp::zeros({c.world, 0}, c.dev);
  d::all_gather(out, e).wait();
  d::reduce_scatter(e, bp::zeros({0}, c.dev)).wait();
  c.expect("empty_tensors[all_reduce,broadcast,all_gather,reduce_scatter]",
           e.numel() == 0 && out.numel() == 0 ? "" : "shapes changed");
}

void noncontiguous_cases(Ctx& c) {
  int s = ++c.salt;
  // all_reduce on a transposed view: the base must hold the reduced values in its layout.
  Tensor base = c.mine(DType::f32, 48, s).reshape({6, 8});
  Tensor view = base.t();
  d::all_reduce(view).wait();
  auto all = c.all_inputs(DType::f32, 48, s);
  c.expect("all_reduce[noncontiguous,f32,8x6 view]",
           compare(host(base), reference(all, d::ReduceOp::sum, DType::f32), DType::f32, c.world,
                   magnitude(all, d::ReduceOp::sum)));
  // all_gather into a non-contiguous output and from a strided input.
  s = ++c.salt;
  Tensor src = c.mine(DType::f64, 10, s);
  Tensor strided = src.slice(0, 0, 10, 2);  // 5 elements, stride 2
  Tensor out_base = bp::zeros({5, c.world}, c.dev, DType::f64);
  Tensor out = out_base.t();  // [world, 5], non-contiguous
  d::all_gather(out, strided).wait();
  std::vector<double> ref;
  for (auto& v : c.all_inputs(DType::f64, 10, s))
    for (size_t i = 0; i < 10; i += 2) ref.push_back(v[i]);
  c.expect("all_gather[noncontiguous,f64,strided in, transposed out]",
           compare(host(out), ref, DType::f64, c.world));
  // Review F10: the Work dropped without wait(); the copy-back into the view's base still
  // happens, and a later barrier on this thread finds it done.
  s = ++c.salt;
  Tensor dropped_base = c.mine(DType::f32, 48, s).reshape({6, 8});
  d::all_reduce(dropped_base.t());
  d::barrier();
  auto dropped_all = c.all_inputs(DType::f32, 48, s);
  c.expect("all_reduce[noncontiguous,f32,8x6 view,Work dropped,checked after a barrier]",
           compare(host(dropped_base), reference(dropped_all, d::ReduceOp::sum, DType::f32),
                   DType::f32, c.world, magnitude(dropped_all, d::ReduceOp::sum)));
}

void barrier_cases(Ctx& c) {
  for (int i = 0; i < 3; ++i) d::barrier();
  c.expect("barrier[x3]", "");
}

std::string arg_value(const std::vector<std::string>& args, const char* name, const char* def) {
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == name) return args[i + 1];
  return def;
}

}  // namespace

uint64_t shared_seed(const std::vector<std::string>& args) {
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == "--seed") return std::strtoull(args[i + 1].c_str(), nullptr, 0);
  if (const char* s = std::getenv("BP_TEST_SEED")) return std::strtoull(s, nullptr, 0);
  // Rank 0 draws a fresh seed and shares it (printed, so a failure can be repeated).
  Tensor t = bp::zeros({1}, bp::device("cpu:0"), DType::i64);
  if (d::get_rank() == 0) {
    std::random_device rd;
    t = bp::from_vector<int64_t>({static_cast<int64_t>(rd() % 1000000007u)}, {1},
                                 bp::device("cpu:0"));
  }
  d::broadcast(t, 0).wait();
  return static_cast<uint64_t>(t.item<int64_t>());
}

int run_collectives(const std::vector<std::string>& args) {
  d::init_process_group();
  Checker ck;
  ck.rank = d::get_rank();
  ck.seed = shared_seed(args);
  std::string device = arg_value(args, "--device", "cpu:0");
  // "local": cuda:<local rank> (one GPU per rank), the CPU without GPUs.
  bp::Device& dev = device == "local" ? d::local_device("cuda") : bp::device(device);
  if (ck.rank == 0)
    std::printf("collectives on %s, %d ranks, seed %llu\n", dev.str().c_str(), d::get_world_size(),
                static_cast<unsigned long long>(ck.seed));
  Ctx c{ck, dev, ck.seed, d::get_rank(), d::get_world_size()};
  c.staged = true;
  for (const auto& r : d::comm_load_report())
    for (const auto& t : r.device_types)
      if (t == dev.type() && r.status == bp::PluginReport::Status::loaded) c.staged = false;
  std::string only = arg_value(args, "--only", "");
  auto want = [&](const char* g) { return only.empty() || only == g; };
  if (want("all_reduce")) all_reduce_cases(c);
  if (want("broadcast")) broadcast_cases(c);
  if (want("all_gather")) all_gather_cases(c);
  if (want("reduce_scatter")) reduce_scatter_cases(c);
  if (want("p2p")) p2p_cases(c);
  if (want("empty")) empty_cases(c);
  if (want("noncontiguous")) noncontiguous_cases(c);
  if (want("barrier")) barrier_cases(c);
  if (want("checks")) check_mode_cases(c);
  // Only on request: a stress of one pair (its own gtest).
  if (only == "p2p_burst")
    p2p_burst_cases(c, std::atoi(arg_value(args, "--rounds", "200").c_str()));
  d::destroy_process_group();
  return ck.finish("collectives");
}

}  // namespace bpt
