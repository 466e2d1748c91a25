// Asynchronous errors (Note [Asynchronous errors] in plugin_abi.h, Note [Op ring] and Note
// [Device lost]) on the reference backend's fault builds: ref_async (mul fails on the device),
// ref_asyncidx (an out-of-range index found on the device), ref_poison (... poisoning its
// stream), ref_lost (... losing the device) and ref_async5 (mul fails on the device of an ABI
// 1.5 plugin, which reports no op ids and keeps no record).
#include <gtest/gtest.h>
#include <backplane/backplane.hpp>
#include <backplane_test/child.hpp>
#include <backplane_test/plugin_test.hpp>
#include <backplane_test/seed.hpp>
#include <backplane_test/throws.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

bp::Device& ref_device(const char* rel, const char* spec) {
  bp::RegistryOptions o;
  o.plugin_paths = {bp_test::beside_exe(rel)};
  // Registries outlive their tensors: never destroyed, and reachable from a static pointer to
  // the end (a static vector's buffer is freed at exit, leaving them to LeakSanitizer).
  static auto* keep = new std::vector<bp::Registry*>();
  keep->push_back(new bp::Registry(o));
  return keep->back()->device(spec);
}

bp::Device& ref_async() {
  static bp::Device& d = ref_device(BP_REF_ASYNC_REL, "ref_async:0");
  return d;
}
bp::Device& ref_async5() {
  static bp::Device& d = ref_device(BP_REF_ASYNC5_REL, "ref_async5:0");
  return d;
}
bp::Device& ref_asyncidx() {
  static bp::Device& d = ref_device(BP_REF_ASYNCIDX_REL, "ref_asyncidx:0");
  return d;
}
bp::Device& ref_poison() {
  static bp::Device& d = ref_device(BP_REF_POISON_REL, "ref_poison:0");
  return d;
}
bp::Device& ref_lost() {
  static bp::Device& d = ref_device(BP_REF_LOST_REL, "ref_lost:0");
  return d;
}

// Runs f, which must throw exactly E; returns the exception.
template <class E, class F>
std::optional<E> catch_exact(F&& f) {
  try {
    f();
  } catch (const E& e) {
    if (typeid(e) != typeid(E)) {
      ADD_FAILURE() << "threw " << typeid(e).name() << ", expected " << typeid(E).name() << ": "
                    << e.what();
      return std::nullopt;
    }
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type " << typeid(e).name() << ": " << e.what();
    return std::nullopt;
  }
  ADD_FAILURE() << "no exception";
  return std::nullopt;
}

std::vector<float> random_floats(size_t n) {
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(bp_test::rng("bp_unit_tests"));
  return v;
}

int64_t random_int(int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(bp_test::rng("bp_unit_tests"));
}

// x [rows, 3] of random values and an index [2, 3] whose element 3 is `bad` (out of range).
struct BadGather {
  std::vector<float> xv;
  int64_t rows = 0, bad = 0;
  bp::Tensor x, index;
};
BadGather bad_gather(bp::Device& dev) {
  BadGather g;
  g.rows = random_int(4, 8);
  g.bad = g.rows + random_int(0, 999);
  g.xv = random_floats(static_cast<size_t>(g.rows * 3));
  std::vector<int64_t> iv(6);
  for (int64_t& v : iv) v = random_int(0, g.rows - 1);
  iv[3] = g.bad;
  g.x = bp::from_vector(g.xv, {g.rows, 3}, dev);
  g.index = bp::from_vector(iv, {2, 3}, dev);
  dev.synchronize();
  return g;
}
std::string gather_text(const BadGather& g) {
  return "op gather (f32, inputs [" + std::to_string(g.rows) + ",3], [2,3], outputs [2,3])";
}

std::vector<float> plus_one(const std::vector<float>& v) {
  std::vector<float> r(v);
  for (float& x : r) x += 1.0f;
  return r;
}

// The next host read after a failure names the op that failed, not the later ops. (The
// reference backend's memory is host memory: the read is a synchronisation.)
TEST(AsyncErrors, TheNextHostReadNamesTheFailedOp) {
  std::vector<float> av = random_floats(4);
  bp::Tensor a = bp::from_vector(av, {4}, ref_async());
  ref_async().synchronize();
  bp::Tensor b = a * a;  // fails on the device
  bp::Tensor c = b + a;
  auto e = catch_exact<bp::AsyncError>([&] { (void)c.to_vector<float>(); });
  ASSERT_TRUE(e);
  EXPECT_HAS(e->what(), "ref_async:0: op mul (f32, inputs [4], [4], outputs [4]) (op #");
  EXPECT_HAS(e->what(),
             ") failed on the device: ref_async:0: simulated asynchronous fault of a "
             "mul launched earlier on this stream (fault async_fail) (plugin "
             "ref_async); found by a later stream synchronize; its outputs are "
             "undefined, the work queued after it ran");
  EXPECT_HAS(e->what(), "BACKPLANE_LAUNCH_BLOCKING=1 reports a failure at the op's own call");
  EXPECT_EQ(e->op(), "mul");
  EXPECT_EQ(e->device(), "ref_async:0");
  EXPECT_EQ(e->severity(), bp::AsyncError::Severity::op_failed);
  EXPECT_GT(e->op_id(), 0u);
  // Reported once: the stream goes on, with the values of work queued after the report.
  EXPECT_EQ((a + 1.0).to_vector<float>(), plus_one(av));
}

TEST(AsyncErrors, ASynchronisationNamesTheFailedOp) {
  std::vector<float> av = random_floats(6);
  bp::Tensor a = bp::from_vector(av, {2, 3}, ref_async());
  ref_async().synchronize();
  bp::Tensor b = a * a;
  bp::Tensor c = b + a;
  bp::Tensor d = c + 2.0;
  auto e = catch_exact<bp::AsyncError>([&] { ref_async().synchronize(); });
  ASSERT_TRUE(e);
  EXPECT_HAS(e->what(), "ref_async:0: op mul (f32, inputs [2,3], [2,3], outputs [2,3]) (op #" +
                            std::to_string(e->op_id()) + ") failed on the device");
  EXPECT_HAS(e->what(), "found by a later stream synchronize");
  EXPECT_EQ(e->op(), "mul");
  ref_async().synchronize();  // reported once
  EXPECT_EQ((a + 1.0).to_vector<float>(), plus_one(av));
}

// An index found out of range on the device: the error names gather, its shapes and the value.
TEST(AsyncErrors, AnIndexFoundOnTheDeviceNamesGatherAndTheValue) {
  BadGather g = bad_gather(ref_asyncidx());
  bp::Tensor y = bp::gather(g.x, 0, g.index);  // returns: the index is checked "on the device"
  bp::Tensor z = y * 2.0;
  auto e = catch_exact<bp::AsyncError>([&] { (void)z.to_vector<float>(); });
  ASSERT_TRUE(e);
  EXPECT_HAS(e->what(), "ref_asyncidx:0: " + gather_text(g) + " (op #");
  EXPECT_HAS(e->what(), std::to_string(g.bad));
  EXPECT_HAS(e->what(), "(found on the device: fault async_index)");
  EXPECT_EQ(e->op(), "gather");
  EXPECT_EQ(e->severity(), bp::AsyncError::Severity::op_failed);
  EXPECT_EQ((g.x + 1.0).to_vector<float>(), plus_one(g.xv));
}

// A poisoned stream ran nothing after the failure; the error says so, and the stream runs work
// again once reported.
TEST(AsyncErrors, APoisonedStreamSaysLaterWorkDidNotRun) {
  BadGather g = bad_gather(ref_poison());
  bp::Tensor y = bp::gather(g.x, 0, g.index);
  bp::Tensor later = g.x + 1.0;  // skipped by the poisoned stream
  auto e = catch_exact<bp::AsyncError>([&] { ref_poison().synchronize(); });
  ASSERT_TRUE(e);
  EXPECT_HAS(e->what(), "ref_poison:0: " + gather_text(g));
  EXPECT_HAS(e->what(),
             "the work queued after it on that stream did not run (the stream was "
             "poisoned; it runs work again from now on)");
  EXPECT_EQ(e->severity(), bp::AsyncError::Severity::stream_poisoned);
  EXPECT_EQ((g.x + 1.0).to_vector<float>(), plus_one(g.xv));
}

// An event recorded after a failure fails its synchronisation, naming the op, and poisons a
// stream that waits on it; one recorded before is fine.
TEST(AsyncErrors, EventsRecordedAfterAFailureArePoisoned) {
  bp::Device& dev = ref_asyncidx();
  BadGather g = bad_gather(dev);
  auto before = dev.create_event(), after = dev.create_event();
  auto waiter = dev.create_stream();
  before->record(dev.default_stream());
  bp::Tensor y = bp::gather(g.x, 0, g.index);
  after->record(dev.default_stream());
  waiter->wait(*after);
  before->synchronize();
  auto e = catch_exact<bp::AsyncError>([&] { after->synchronize(); });
  ASSERT_TRUE(e);
  EXPECT_HAS(e->what(), "ref_asyncidx:0: " + gather_text(g));
  EXPECT_HAS(e->what(), "found by a later event synchronize");
  EXPECT_EQ(e->op(), "gather");
  auto w = catch_exact<bp::AsyncError>([&] { waiter->synchronize(); });
  ASSERT_TRUE(w);
  EXPECT_HAS(w->what(), "ref_asyncidx:0: " + gather_text(g));
  EXPECT_EQ(w->severity(), bp::AsyncError::Severity::stream_poisoned);
  EXPECT_EQ(w->op_id(), e->op_id());
  waiter->synchronize();
  dev.synchronize();
}

// An ABI 1.5 plugin reports only "a synchronisation failed": the host names the op when one was
// queued since the last synchronisation, and lists them otherwise.
TEST(AsyncErrors, AnOldPluginsFailureIsAttributedByTheHost) {
  bp::Device& dev = ref_async5();
  std::vector<float> av = random_floats(4);
  bp::Tensor a = bp::from_vector(av, {4}, dev);
  dev.synchronize();
  bp::Tensor b = a * a;
  auto one = catch_exact<bp::AsyncError>([&] { dev.synchronize(); });
  ASSERT_TRUE(one);
  EXPECT_HAS(one->what(), "ref_async5:0: op mul (f32, inputs [4], [4], outputs [4]) (op #");
  EXPECT_HAS(one->what(), "failed on the device: ref_async5:0: simulated asynchronous fault");
  EXPECT_EQ(one->op(), "mul");

  bp::Tensor c = a * a;
  bp::Tensor d = c + a;
  auto two = catch_exact<bp::AsyncError>([&] { dev.synchronize(); });
  ASSERT_TRUE(two);
  EXPECT_HAS(two->what(),
             "ref_async5:0: one of the 2 ops queued on this stream since its last "
             "synchronisation failed on the device: ref_async5:0: simulated asynchronous fault");
  EXPECT_HAS(two->what(),
             "the ops, oldest first: mul (f32, inputs [4], [4], outputs [4]), add "
             "(f32, inputs [4], [4], outputs [4])");
  EXPECT_EQ(two->op(), "");
  EXPECT_EQ(two->op_id(), 0u);
  dev.synchronize();  // reported once
  EXPECT_EQ((a + 1.0).to_vector<float>(), plus_one(av));
}

// A lost device: DeviceLost names the op, the callbacks run once, and every later call fails
// fast with the same description.
TEST(AsyncErrors, ALostDeviceFailsFastAndRunsTheCallbacksOnce) {
  std::atomic<int> calls{0};
  std::string seen;
  const uint64_t id = bp::on_device_lost([&](const bp::DeviceLost& e) {
    ++calls;
    seen = e.what();
  });
  bp::Device& dev = ref_lost();
  BadGather g = bad_gather(dev);
  bp::Tensor y = bp::gather(g.x, 0, g.index);
  auto e = catch_exact<bp::DeviceLost>([&] { dev.synchronize(); });
  ASSERT_TRUE(e);
  EXPECT_HAS(e->what(), "ref_lost:0: " + gather_text(g));
  EXPECT_HAS(e->what(), "(found on the device: fault device_lost)");
  EXPECT_HAS(e->what(),
             "the device is lost: every later call on ref_lost:0 fails with this "
             "error (bp::on_device_lost)");
  EXPECT_EQ(e->severity(), bp::AsyncError::Severity::device_lost);
  EXPECT_EQ(e->op(), "gather");
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(seen, e->what());
  for (int i = 0; i < 3; ++i) {
    std::string m = bp_test::expect_throw<bp::DeviceLost>([&] { (void)bp::full({2}, 1.0, dev); });
    EXPECT_HAS(m,
               "ref_lost:0 was lost earlier and runs nothing more in this process: ref_lost:0: " +
                   gather_text(g));
  }
  EXPECT_HAS(bp_test::expect_throw<bp::DeviceLost>([&] { (void)dev.create_stream(); }),
             "was lost earlier");
  EXPECT_HAS(bp_test::expect_throw<bp::DeviceLost>([&] { dev.synchronize(); }), "was lost earlier");
  EXPECT_HAS(bp_test::expect_throw<bp::DeviceLost>([&] { (void)(g.x + 1.0); }), "was lost earlier");
  EXPECT_EQ(calls.load(), 1);
  bp::remove_device_lost_callback(id);
  // Other devices go on.
  std::vector<float> av = random_floats(3);
  EXPECT_EQ((bp::from_vector(av, {3}, ref_async()) + 1.0).to_vector<float>(), plus_one(av));
}

// A class index outside the logits is an error of the fused cross_entropy op naming the value,
// its row and the number of classes, not a row silently left out of the loss.
TEST(AsyncErrors, ACrossEntropyLabelOutsideTheLogitsIsReported) {
  bp::Device& dev = ref_asyncidx();
  const int64_t classes = random_int(3, 9), bad = classes + random_int(0, 99);
  bp::Tensor logits =
      bp::from_vector(random_floats(static_cast<size_t>(4 * classes)), {4, classes}, dev);
  bp::Tensor labels = bp::from_vector(std::vector<int64_t>{0, bad, 1, 2}, {4}, dev);
  dev.synchronize();
  // The error may come from inside cross_entropy (the mean's ops synchronise where the
  // reference backend lacks them) or from the read.
  auto e = catch_exact<bp::AsyncError>(
      [&] { (void)bp::nn::cross_entropy(logits, labels).item<float>(); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->op(), "cross_entropy");
  EXPECT_HAS(e->what(), "op cross_entropy (f32, inputs [4," + std::to_string(classes) + "], [4]");
  EXPECT_HAS(e->what(), "target " + std::to_string(bad) + " of row 1 is outside [0, " +
                            std::to_string(classes) + ")");
}

// Out-of-range indices on cuda:0 (Note [Deferred index errors] in backends/cuda/cuda_index.cu):
// reported at the next synchronisation naming gather and the value; the device goes on. Skips
// without a GPU. With BACKPLANE_LAUNCH_BLOCKING=1 (the next test) the op's own call throws.
TEST(AsyncErrors, CudaGatherOutOfRangeIsNamedAtTheNextSynchronisation) {
  if (bp::num_devices("cuda") == 0) GTEST_SKIP() << "no cuda device";
  bp::Device& dev = bp::device("cuda:0");
  BadGather g = bad_gather(dev);
  bp::Tensor y = bp::gather(g.x, 0, g.index);
  bp::Tensor z = y * 2.0 + 1.0;  // later ops: not blamed
  auto e = catch_exact<bp::AsyncError>([&] { dev.synchronize(); });
  ASSERT_TRUE(e);
  std::fprintf(stderr, "reported: %s\n", e->what());
  EXPECT_HAS(e->what(), "cuda:0: " + gather_text(g) + " (op #");
  EXPECT_HAS(e->what(), "cuda:0: op 'gather': index " + std::to_string(g.bad) +
                            " at position 3 of the index tensor is outside [0, " +
                            std::to_string(g.rows) + ") along axis 0");
  EXPECT_HAS(e->what(), "found by a later stream synchronize");
  EXPECT_EQ(e->op(), "gather");
  EXPECT_EQ(e->severity(), bp::AsyncError::Severity::op_failed);
  dev.synchronize();  // reported once
  EXPECT_EQ((g.x + 1.0).to_vector<float>(), plus_one(g.xv));

  // Embedding and cross-entropy report the same way, each naming its own op.
  bp::Tensor table = bp::from_vector(random_floats(12), {4, 3}, dev);
  bp::Tensor rows = bp::nn::functional::embedding(
      bp::from_vector(std::vector<int64_t>{1, 4 + random_int(0, 50)}, {2}, dev), table);
  auto emb = catch_exact<bp::AsyncError>([&] { (void)rows.to_vector<float>(); });
  ASSERT_TRUE(emb);
  EXPECT_EQ(emb->op(), "embedding");
  EXPECT_HAS(emb->what(), "for a table of 4 rows (valid: 0 to 3)");
  bp::Tensor logits = bp::from_vector(random_floats(20), {4, 5}, dev);
  bp::Tensor labels = bp::from_vector(std::vector<int64_t>{0, 7, 1, 2}, {4}, dev);
  auto ce = catch_exact<bp::AsyncError>(
      [&] { (void)bp::nn::cross_entropy(logits, labels).item<float>(); });
  ASSERT_TRUE(ce);
  EXPECT_EQ(ce->op(), "cross_entropy");
  EXPECT_HAS(ce->what(), "cuda:0: op 'cross_entropy': target 7 of row 1 is outside [0, 5)");
}

TEST(AsyncErrors, CudaGatherOutOfRangeUnderLaunchBlockingIsNamedAtTheOp) {
  if (bp::num_devices("cuda") == 0) GTEST_SKIP() << "no cuda device";
  const char* v = std::getenv("BACKPLANE_LAUNCH_BLOCKING");
  if (!v || std::string(v) != "1") {  // read once per process: run again in a child
    const bp_test::ChildResult r =
        bp_test::rerun_self("BACKPLANE_LAUNCH_BLOCKING=1",
                            "AsyncErrors.CudaGatherOutOfRangeUnderLaunchBlockingIsNamedAtTheOp");
    EXPECT_TRUE(r.exited_zero()) << r.output;
    EXPECT_HAS(r.output, "[  PASSED  ] 1 test");
    std::fprintf(stderr, "%s", r.output.c_str());
    return;
  }
  bp::Device& dev = bp::device("cuda:0");
  BadGather g = bad_gather(dev);
  auto e = catch_exact<bp::AsyncError>([&] { bp::Tensor y = bp::gather(g.x, 0, g.index); });
  ASSERT_TRUE(e);
  std::fprintf(stderr, "reported: %s\n", e->what());
  EXPECT_HAS(e->what(), "cuda:0: " + gather_text(g) +
                            " failed while running (BACKPLANE_LAUNCH_BLOCKING=1): cuda:0: op "
                            "'gather': index " +
                            std::to_string(g.bad));
  EXPECT_EQ(e->op(), "gather");
  EXPECT_EQ((g.x + 1.0).to_vector<float>(), plus_one(g.xv));
}

// Note [Events and deferred index errors] (backends/cuda/cuda_index.cu): on cuda:0 a bad index
// is found only at a later check, yet an event recorded after the gather fails its
// synchronisation naming gather and poisons a stream that waits on it, while an event recorded
// before it (after a good gather, so it too waits for a check) stays clean, as on the reference
// backend above. Skips without a GPU.
TEST(AsyncErrors, CudaEventsRecordedAfterABadGatherArePoisoned) {
  if (bp::num_devices("cuda") == 0) GTEST_SKIP() << "no cuda device";
  bp::Device& dev = bp::device("cuda:0");
  BadGather g = bad_gather(dev);
  BadGather ok = bad_gather(dev);
  ok.index = bp::from_vector(std::vector<int64_t>{0, 1, 2, 3, 2, 1}, {2, 3}, dev);
  auto before = dev.create_event(), after = dev.create_event();
  auto waiter = dev.create_stream(), clean = dev.create_stream();
  bp::Tensor good = bp::gather(ok.x, 0, ok.index);
  before->record(dev.default_stream());
  bp::Tensor y = bp::gather(g.x, 0, g.index);
  after->record(dev.default_stream());
  waiter->wait(*after);
  clean->wait(*before);
  before->synchronize();
  auto e = catch_exact<bp::AsyncError>([&] { after->synchronize(); });
  ASSERT_TRUE(e);
  std::fprintf(stderr, "reported: %s\n", e->what());
  EXPECT_HAS(e->what(), "cuda:0: " + gather_text(g) + " (op #");
  EXPECT_HAS(e->what(), "index " + std::to_string(g.bad) + " at position 3");
  EXPECT_HAS(e->what(), "found by a later event synchronize");
  EXPECT_EQ(e->op(), "gather");
  EXPECT_EQ(e->severity(), bp::AsyncError::Severity::op_failed);
  auto w = catch_exact<bp::AsyncError>([&] { waiter->synchronize(); });
  ASSERT_TRUE(w);
  EXPECT_HAS(w->what(), "cuda:0: " + gather_text(g));
  EXPECT_EQ(w->severity(), bp::AsyncError::Severity::stream_poisoned);
  EXPECT_EQ(w->op_id(), e->op_id());
  clean->synchronize();
  waiter->synchronize();
  dev.synchronize();
  const std::vector<float> xv = ok.xv;
  EXPECT_EQ(good.to_vector<float>(),
            (std::vector<float>{xv[0], xv[4], xv[8], xv[9], xv[7], xv[5]}));
}

// The waiter asks first: its synchronisation runs the source stream's check, fails as
// poisoned, and the source stream then reports the gather as its own failure.
TEST(AsyncErrors, CudaAWaiterOfAnEventAfterABadGatherFailsFirst) {
  if (bp::num_devices("cuda") == 0) GTEST_SKIP() << "no cuda device";
  bp::Device& dev = bp::device("cuda:0");
  BadGather g = bad_gather(dev);
  auto after = dev.create_event();
  auto waiter = dev.create_stream();
  bp::Tensor y = bp::gather(g.x, 0, g.index);
  after->record(dev.default_stream());
  waiter->wait(*after);
  auto w = catch_exact<bp::AsyncError>([&] { waiter->synchronize(); });
  ASSERT_TRUE(w);
  EXPECT_HAS(w->what(), "cuda:0: " + gather_text(g) + " (op #");
  EXPECT_EQ(w->op(), "gather");
  EXPECT_EQ(w->severity(), bp::AsyncError::Severity::stream_poisoned);
  auto s = catch_exact<bp::AsyncError>([&] { dev.default_stream().synchronize(); });
  ASSERT_TRUE(s);
  EXPECT_EQ(s->op(), "gather");
  EXPECT_EQ(s->op_id(), w->op_id());
  EXPECT_EQ(s->severity(), bp::AsyncError::Severity::op_failed);
  dev.synchronize();
  EXPECT_EQ((g.x + 1.0).to_vector<float>(), plus_one(g.xv));
}

// Note [Op ring]: threads launching on one stream at once while one launch fails; the error
// still names that launch with its own shapes (the ring's slots are written concurrently).
TEST(AsyncErrors, ConcurrentLaunchesKeepTheFailedOpsDescription) {
  bp::Device& dev = ref_asyncidx();
  for (int round = 0; round < 20; ++round) {
    BadGather g = bad_gather(dev);
    std::vector<bp::Tensor> inputs;
    for (int t = 0; t < 4; ++t)
      inputs.push_back(bp::from_vector(random_floats(static_cast<size_t>(t + 2)), {t + 2}, dev));
    dev.synchronize();
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        for (int i = 0; i < 50; ++i) {
          bp::Tensor y = inputs[static_cast<size_t>(t)] + 1.0;
          if (t == 0 && i == 25) bp::Tensor bad = bp::gather(g.x, 0, g.index);
        }
      });
    for (std::thread& th : threads) th.join();
    auto e = catch_exact<bp::AsyncError>([&] { dev.synchronize(); });
    ASSERT_TRUE(e);
    EXPECT_HAS(e->what(), "ref_asyncidx:0: " + gather_text(g) + " (op #");
    EXPECT_EQ(e->op(), "gather");
  }
}

TEST(AsyncErrors, AnEmptyCallbackIsRefused) {
  EXPECT_HAS(bp_test::expect_throw<bp::Error>([] { (void)bp::on_device_lost({}); }),
             "on_device_lost: the callback is empty");
}

}  // namespace
