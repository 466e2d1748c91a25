// The graphs suite: the minor-3 native graph slots (Note [Native graphs] in plugin_abi.h),
// driven through the C table as a host drives them, and the host's default for plugins without
// them (Note [Recorded graphs] in core/src/graph/graph.cpp), driven through libbackplane with this
// plugin loaded: both are tested for every plugin that has the slots, the default for every one.
#include "conformance_data.hpp"
#include "conformance_suites.hpp"

#include <backplane/abi/op_catalogue.h>
#include <backplane/graph.hpp>
#include <backplane/runtime.hpp>
#include <backplane/tensor.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>

namespace bpc {

namespace {

constexpr int64_t kN = 1000;

bool has_graph_slots(const bp_plugin_api& t) {
  return BP_API_HAS_SLOT(&t, 3, graph_destroy) && t.graph_begin_capture && t.graph_end_capture &&
         t.graph_instantiate && t.graph_launch && t.graph_destroy;
}
bool has_any_graph_slot(const bp_plugin_api& t) {
  return BP_API_HAS_SLOT(&t, 3, graph_destroy) &&
         (t.graph_begin_capture || t.graph_end_capture || t.graph_instantiate || t.graph_launch ||
          t.graph_destroy);
}

std::vector<float> random_floats(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

void upload(Context& c, bp_stream* s, bp_buffer* dst, const std::vector<float>& v) {
  c.check(c.t().copy_h2d(s, dst, 0, v.data(), v.size() * sizeof(float)), "copy_h2d");
  c.sync(s);
}

std::vector<float> download(Context& c, bp_stream* s, bp_buffer* src, size_t n) {
  std::vector<float> v(n);
  c.check(c.t().copy_d2h(s, v.data(), src, 0, n * sizeof(float)), "copy_d2h");
  c.sync(s);
  return v;
}

bp_tensor_desc vec_desc(bp_buffer* b, int64_t n) {
  return make_desc(b, 0, BP_DTYPE_F32, {n}, {1});
}

void expect_values(const std::vector<float>& got, const std::vector<double>& want,
                   const std::string& what) {
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = 1e-5 * (1.0 + std::fabs(want[i]));
    if (!(std::fabs(got[i] - want[i]) <= tol))
      throw Failure(format("%s: element %zu is %.9g, expected %.9g", what.c_str(), i,
                           static_cast<double>(got[i]), want[i]));
  }
}

// A graph handle destroyed at scope exit (after the caller synchronised its replays).
struct GraphGuard {
  Context& c;
  bp_graph* g = nullptr;
  ~GraphGuard() {
    if (g) take_error(c.api(), c.t().graph_destroy(g));
  }
};

}  // namespace

void build_graphs_suite(Context& ctx, std::vector<TestCase>& out) {
  SuiteBuilder b(out, "graphs", ctx.device_label());

  // The slots themselves: capture an add, an in-place accumulation, a device copy and a memset,
  // check that nothing ran during the capture, then replay three times.
  b.add("native_slots", [](Context& c) {
    const bp_plugin_api& t = c.t();
    if (!has_graph_slots(t)) {
      if (has_any_graph_slot(t))
        throw Failure(
            "the plugin sets some of the five graph slots but not all: a host treats a "
            "partial set as none (Note [Native graphs]); set all five or none");
      c.note(
          "no native graph slots: the host records launches and replays the list (tested by "
          "graphs.recorded_default)");
      return;
    }
    bp_kernel* add = nullptr;
    if (bp_error* e = t.find_kernel_id(c.device(), BP_OP_ADD, BP_DTYPE_F32, &add)) {
      c.note("no f32 add: " + take_error(c.api(), e));
      return;
    }
    bp_stream* s = c.stream();
    const uint64_t bytes = kN * sizeof(float);
    DeviceBuffer a(c, bytes, s), bb(c, bytes, s), acc(c, bytes, s), sum(c, bytes, s),
        copy(c, bytes, s), zeroed(c, bytes, s);
    auto av = random_floats(c.seed_for("graphs.a"), kN),
         bv = random_floats(c.seed_for("graphs.b"), kN),
         accv = random_floats(c.seed_for("graphs.acc"), kN);
    upload(c, s, a.get(), av);
    upload(c, s, bb.get(), bv);
    upload(c, s, acc.get(), accv);
    upload(c, s, zeroed.get(), accv);
    c.check(t.graph_begin_capture(s), "graph_begin_capture");
    GraphGuard g{c};
    {
      // A second begin on the capturing stream is refused; the capture goes on.
      bp_error* again = t.graph_begin_capture(s);
      if (!again) {
        take_error(c.api(), t.graph_end_capture(s, &g.g));
        throw Failure("graph_begin_capture on a capturing stream succeeded");
      }
      take_error(c.api(), again);
    }
    bp_tensor_desc in[2] = {vec_desc(a.get(), kN), vec_desc(bb.get(), kN)};
    bp_tensor_desc o = vec_desc(sum.get(), kN);
    bp_tensor_desc acc_in[2] = {vec_desc(acc.get(), kN), vec_desc(bb.get(), kN)};
    bp_tensor_desc acc_out = vec_desc(acc.get(), kN);
    bp_error* err = c.launch(add, s, in, 2, &o, 1, {});
    if (!err) err = c.launch(add, s, acc_in, 2, &acc_out, 1, {});
    if (!err) err = t.copy_d2d(s, copy.get(), 0, sum.get(), 0, bytes);
    if (!err) err = t.memset(s, zeroed.get(), 0, 0, bytes);
    bp_error* end = t.graph_end_capture(s, &g.g);
    if (err) {
      take_error(c.api(), end);
      throw Failure("captured work failed: " + take_error(c.api(), err));
    }
    c.check(end, "graph_end_capture");
    if (!g.g) throw Failure("graph_end_capture returned no graph");
    c.sync(s);  // the stream is eager again
    expect_values(download(c, s, acc.get(), kN), std::vector<double>(accv.begin(), accv.end()),
                  "acc after the capture (the captured add ran during the capture)");
    c.check(t.graph_instantiate(g.g), "graph_instantiate");
    for (int r = 0; r < 3; ++r) c.check(t.graph_launch(g.g, s), "graph_launch");
    c.sync(s);
    std::vector<double> want_sum(kN), want_acc(kN);
    for (int64_t i = 0; i < kN; ++i) {
      want_sum[i] = double(av[i] + bv[i]);
      float x = accv[i];
      for (int r = 0; r < 3; ++r) x += bv[i];
      want_acc[i] = x;
    }
    expect_values(download(c, s, sum.get(), kN), want_sum, "a + b after three replays");
    expect_values(download(c, s, copy.get(), kN), want_sum, "the captured copy_d2d");
    expect_values(download(c, s, acc.get(), kN), want_acc, "acc += b replayed three times");
    expect_values(download(c, s, zeroed.get(), kN), std::vector<double>(kN, 0.0),
                  "the captured memset");
    // The stream runs eager work again after the graph.
    c.check(c.launch(add, s, in, 2, &o, 1, {}), "an eager launch after the replays");
    c.sync(s);
    c.note("5 slots: capture, refused double begin, nothing run during capture, 3 replays");
  });

  // The host's default (and, for a plugin with the slots, its native path) through
  // libbackplane with this plugin loaded: bp::Graph over tensors.
  auto through_host = [](Context& c, bp::GraphMode mode) {
    bp::RegistryOptions o;
    o.plugin_paths = {c.plugin_path()};
    o.search_library_dir = false;
    bp::Registry reg(o);
    bp::Device& d = reg.device(c.device_label());
    auto av = random_floats(c.seed_for("graphs.host.a"), kN),
         bv = random_floats(c.seed_for("graphs.host.b"), kN);
    bp::Tensor x = bp::from_vector(av, {kN}, d), y = bp::from_vector(bv, {kN}, d);
    bp::Tensor acc = bp::from_vector(av, {kN}, d), out;
    bp::Graph g = bp::capture(
        d,
        [&] {
          out = (x + y) * 2.0;
          acc.add_(y);
        },
        mode);
    if (g.num_ops() != 3)
      throw Failure(format("the graph holds %llu ops, expected 3 (add, mul, add_)",
                           static_cast<unsigned long long>(g.num_ops())));
    for (int r = 0; r < 3; ++r) g.replay();
    std::vector<double> want_out(kN), want_acc(kN);
    for (int64_t i = 0; i < kN; ++i) {
      want_out[i] = double((av[i] + bv[i]) * 2.0f);
      float v = av[i];
      for (int r = 0; r < 3; ++r) v += bv[i];
      want_acc[i] = v;
    }
    expect_values(out.to_vector<float>(), want_out, "(x + y) * 2 replayed");
    expect_values(acc.to_vector<float>(), want_acc, "acc.add_(y) replayed three times");
    return g.native();
  };
  b.add("recorded_default", [through_host](Context& c) {
    through_host(c, bp::GraphMode::recorded);
    c.note("the host's recorded list (Note [Recorded graphs]): 3 ops replayed 3 times");
  });
  b.add("through_host", [through_host](Context& c) {
    const bool native = through_host(c, bp::GraphMode::automatic);
    if (native != has_graph_slots(c.t()))
      throw Failure(format("bp::Graph made a %s graph, but the plugin %s the native slots",
                           native ? "native" : "recorded",
                           has_graph_slots(c.t()) ? "has" : "lacks"));
    c.note(native ? "bp::Graph used the plugin's native graph" : "bp::Graph recorded the launches");
  });
}

}  // namespace bpc
