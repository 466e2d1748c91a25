// Scenario "fault NAME": one fault each; every rank checks that it gets the typed error it
// should (class and message fragments) and prints "EXPECTED <class>: <message>".
#include "dist_rank.hpp"

#include <backplane/nn.hpp>
#include <backplane/parallel.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <thread>
#include <utility>

namespace bpt {

namespace {

namespace d = bp::dist;
using bp::DType;
using bp::Tensor;

// The most specific class name of an error.
std::string class_of(const std::exception& e) {
  if (dynamic_cast<const d::MismatchError*>(&e)) return "MismatchError";
  if (dynamic_cast<const d::TimeoutError*>(&e)) return "TimeoutError";
  if (dynamic_cast<const d::PeerError*>(&e)) return "PeerError";
  if (dynamic_cast<const d::BackendUnavailable*>(&e)) return "BackendUnavailable";
  if (dynamic_cast<const d::RendezvousError*>(&e)) return "RendezvousError";
  if (dynamic_cast<const d::DistError*>(&e)) return "DistError";
  if (dynamic_cast<const bp::DeviceMismatch*>(&e)) return "DeviceMismatch";
  if (dynamic_cast<const bp::DTypeError*>(&e)) return "DTypeError";
  if (dynamic_cast<const bp::ShapeError*>(&e)) return "ShapeError";
  if (dynamic_cast<const bp::OutOfMemory*>(&e)) return "OutOfMemory";
  if (dynamic_cast<const bp::Error*>(&e)) return "Error";
  return "std::exception";
}

int rank_from_env() {
  const char* r = std::getenv("BACKPLANE_RANK");
  return r ? std::atoi(r) : 0;
}

// Runs `body`, which must throw `expected` with every fragment in its message.
int expect_error(const std::string& expected, const std::vector<std::string>& fragments,
                 const std::function<void()>& body) {
  int rank = rank_from_env();
  try {
    body();
  } catch (const std::exception& e) {
    std::string cls = class_of(e), msg = e.what();
    bool ok = cls == expected;
    std::string missing;
    for (const auto& f : fragments)
      if (msg.find(f) == std::string::npos) {
        ok = false;
        missing += " '" + f + "'";
      }
    std::printf("rank %d: %s %s: %s\n", rank, ok ? "EXPECTED" : "UNEXPECTED", cls.c_str(),
                msg.c_str());
    if (!ok)
      std::printf("rank %d: wanted %s%s%s\n", rank, expected.c_str(),
                  missing.empty() ? "" : " with", missing.c_str());
    std::fflush(stdout);
    return ok ? 0 : 1;
  }
  std::printf("rank %d: UNEXPECTED success: wanted %s\n", rank, expected.c_str());
  std::fflush(stdout);
  return 1;
}

std::string arg(const std::vector<std::string>& args, const char* name) {
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == name) return args[i + 1];
  return "";
}

Tensor f32(int64_t n) {
  return bp::full({n}, 1.0, bp::device("cpu:0"));
}

// Linear(8, 16) - Tanh - Linear(16, 4), seeded: the DDP fault scenarios' model and its first
// layer (where the faults hook in).
std::pair<std::shared_ptr<bp::nn::Sequential>, bp::nn::Linear*> small_net() {
  bp::manual_seed(7);
  auto net = std::make_shared<bp::nn::Sequential>();
  auto& first = net->add<bp::nn::Linear>(8, 16);
  net->add<bp::nn::Tanh>();
  net->add<bp::nn::Linear>(16, 4);
  return {net, &first};
}

bool have_opencl() {
  return bp::num_devices("opencl") > 0;
}

}  // namespace

int run_fault(const std::string& name, const std::vector<std::string>& args) {
  int rank = rank_from_env();
  if (name == "world_size_mismatch") {
    // Rank 1 believes in a world of 3.
    return expect_error("RendezvousError", {"world size"}, [&] {
      if (rank == 1)
        d::init_process_group({.rank = 1, .world_size = 3});
      else
        d::init_process_group();
    });
  }
  if (name == "duplicate_rank") {
    // Both processes say they are rank 0.
    return expect_error("RendezvousError", {"rank"},
                        [&] { d::init_process_group({.rank = 0, .world_size = 2}); });
  }
  if (name == "rank_out_of_range") {
    if (rank == 1)
      return expect_error("RendezvousError", {"not below the world size 2"},
                          [&] { d::init_process_group({.rank = 2, .world_size = 2}); });
    return expect_error("RendezvousError", {"did not join", "1"}, [&] { d::init_process_group(); });
  }
  if (name == "unreachable") {
    std::string url = "tcp://127.0.0.1:" + arg(args, "--port");
    return expect_error("RendezvousError", {"could not reach the rendezvous store", url},
                        [&] { d::init_process_group({.init_method = url}); });
  }
  if (name == "rank_exit" || name == "exit_mid_collective") {
    d::init_process_group();
    d::all_reduce(f32(16)).wait();  // the communicator exists
    if (rank == 1) {
      if (name == "exit_mid_collective") d::all_reduce(f32(1 << 23));  // 32 MiB, not waited on
      std::fflush(stdout);
      std::_Exit(3);
    }
    return expect_error("PeerError", {"rank 1"}, [&] {
      d::all_reduce(f32(1 << 23)).wait();
      d::all_reduce(f32(16)).wait();
    });
  }
  if (name == "mismatch_op" || name == "mismatch_shape" || name == "mismatch_dtype" ||
      name == "mismatch_device" || name == "mismatch_in_burst") {
    if (name == "mismatch_device" && !have_opencl()) {
      std::printf("rank %d: SKIP mismatch_device: no opencl device here\n", rank);
      return 0;
    }
    d::init_process_group();
    d::all_reduce(f32(4)).wait();
    std::vector<std::string> frags;
    std::function<void()> body;
    if (name == "mismatch_op") {
      frags = {"all_reduce f32 [1000]", "broadcast f32 [1000]"};
      body = [&] {
        Tensor t = f32(1000);
        (rank == 0 ? d::all_reduce(t) : d::broadcast(t, 0)).wait();
      };
    } else if (name == "mismatch_shape") {
      frags = {"f32 [1000]", "f32 [1001]"};
      body = [&] { d::all_reduce(f32(rank == 0 ? 1000 : 1001)).wait(); };
    } else if (name == "mismatch_in_burst") {
      // Twenty collectives queued back to back, so the monitor verifies them in batches
      // (Note [Collective checks]); rank 1's fifteenth differs.
      frags = {"ranks called different collectives as collective #", "f32 [1000]", "f32 [1001]"};
      body = [&] {
        std::vector<d::Work> works;
        for (int i = 0; i < 20; ++i)
          works.push_back(d::all_reduce(f32(i == 14 && rank == 1 ? 1001 : 1000)));
        for (auto& w : works) w.wait();
      };
    } else if (name == "mismatch_dtype") {
      frags = {"all_reduce f32 [1000]", "all_reduce i32 [1000]"};
      body = [&] { d::all_reduce(f32(1000).to(rank == 0 ? DType::f32 : DType::i32)).wait(); };
    } else {
      frags = {"on cpu", "on opencl"};
      body = [&] {
        Tensor t = f32(1000);
        d::all_reduce(rank == 0 ? t : t.to(bp::device("opencl:0"))).wait();
      };
    }
    return expect_error("MismatchError", frags, body);
  }
  if (name == "local_argument_errors") {
    // Errors found before anything is sent leave the group usable.
    d::init_process_group();
    int bad = 0;
    if (have_opencl())
      bad += expect_error("DeviceMismatch", {"all_gather", "opencl:0", "cpu:0"}, [&] {
        Tensor out = bp::zeros({2, 4}, bp::device("opencl:0"));
        d::all_gather(out, f32(4));
      });
    else
      std::printf("rank %d: SKIP DeviceMismatch case: no opencl device here\n", rank);
    bad += expect_error("DTypeError", {"all_gather", "i32", "f32"}, [&] {
      d::all_gather(bp::zeros({2, 4}), f32(4).to(DType::i32));
    });
    bad += expect_error("ShapeError", {"all_gather", "needs 8 elements"},
                        [&] { d::all_gather(bp::zeros({7}), f32(4)); });
    Tensor t = f32(5);
    d::all_reduce(t).wait();
    bool ok = t.to_vector<float>()[0] == static_cast<float>(d::get_world_size());
    std::printf("rank %d: %s group still usable after local errors\n", rank,
                ok ? "EXPECTED" : "UNEXPECTED");
    d::destroy_process_group();
    return bad || !ok ? 1 : 0;
  }
  if (name == "timeout") {
    // Rank 1 stops taking part; rank 0 must time out naming it, then rank 1 must learn of it.
    std::string marker = arg(args, "--marker");
    d::init_process_group();
    d::all_reduce(f32(4)).wait();
    if (rank == 0) {
      int rc = expect_error("TimeoutError", {"within"}, [&] { d::all_reduce(f32(64)).wait(); });
      std::ofstream(marker) << "timed out\n";
      return rc;
    }
    for (int i = 0; i < 1200 && !std::filesystem::exists(marker); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return expect_error("TimeoutError", {"another rank failed", "rank 0"},
                        [&] { d::all_reduce(f32(64)).wait(); });
  }
  if (name == "local_error_after_numbering") {
    // Review F18: rank 1's all_reduce is numbered, then staging its tensor to host memory fails
    // on rank 1 alone (the reference backend's fault async_fail: the mul before it leaves an
    // error for the staging copy's synchronisation). Rank 1 stays in the group until rank 0 is
    // done (--marker), so rank 0 can learn of it only through the group: at once, not by its own
    // timeout.
    std::string marker = arg(args, "--marker");
    if (rank == 1) ::setenv("BP_REFERENCE_FAULT", "async_fail", 1);
    d::init_process_group();
    d::all_reduce(f32(4)).wait();  // the Gloo communicator exists
    bp::Device& ref = bp::device("distref:0");
    Tensor t = bp::full({1000}, 1.5, ref) * bp::full({1000}, 2.0, ref);
    int rc;
    if (rank == 1) {
      // Note [Asynchronous errors]: the error names the mul that failed, not the staging copy.
      rc = expect_error("Error",
                        {"op mul (f32", "failed on the device", "simulated asynchronous fault"},
                        [&] { d::all_reduce(t).wait(); });
      for (int i = 0; i < 1200 && !std::filesystem::exists(marker); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } else {
      rc = expect_error("DistError",
                        {"another rank failed", "rank 1", "all_reduce on distref:0",
                         "simulated asynchronous fault"},
                        [&] { d::all_reduce(t).wait(); });
      std::ofstream(marker) << "done\n";
    }
    d::destroy_process_group();
    return rc;
  }
  if (name == "error_inside_group") {
    // Review F6, with the fixture communicator fxgroup (BACKPLANE_DIST_BACKEND=fxgroup): its
    // second send inside batch_isend_irecv's group fails; the host must still end the plugin's
    // group, or comm_create of the next process group on this thread never starts.
    d::init_process_group();
    int bad = 0;
    if (rank == 0)
      bad += expect_error("DistError", {"grouped", "refuses sends of 13 elements"}, [&] {
        d::batch_isend_irecv({{d::ProcessGroup::P2POp::Kind::send, f32(4), 1},
                              {d::ProcessGroup::P2POp::Kind::send, f32(13), 1}});
      });
    else
      bad += expect_error("DistError", {"another rank failed", "refuses sends of 13 elements"},
                          [&] { d::barrier(); });
    d::destroy_process_group();
    try {
      d::init_process_group();
      d::all_reduce(f32(8)).wait();
      d::batch_isend_irecv({{d::ProcessGroup::P2POp::Kind::send, f32(4), 1 - rank}});
      d::barrier();
      std::printf("rank %d: EXPECTED success: a new group on this thread after the failed one\n",
                  rank);
      d::destroy_process_group();
    } catch (const std::exception& e) {
      std::printf("rank %d: UNEXPECTED %s after re-initialising: %s\n", rank, class_of(e).c_str(),
                  e.what());
      ++bad;
    }
    std::fflush(stdout);
    return bad ? 1 : 0;
  }
  if (name == "ddp_backward_error") {
    // Review F20: rank 1's backward is interrupted (an out-of-memory error from a gradient hook
    // that runs before DDP's) after some buckets were launched. Its next forward must throw once
    // and abort the group, so rank 0 (waiting in its last reductions) learns at once; the
    // forward after that must work (the group stays failed, so its backward reports that).
    std::string marker = arg(args, "--marker");
    d::init_process_group();
    auto [net, first_layer] = small_net();
    bp::nn::Linear& first = *first_layer;
    if (rank == 1)
      first.weight().register_post_accumulate_grad_hook(
          [](const Tensor&) { throw bp::OutOfMemory("injected: out of memory inside backward"); });
    bp::nn::DistributedDataParallel ddp(net, {.bucket_cap_mb = 0.0001});
    Tensor x = bp::ones({4, 8});
    int bad = 0;
    if (rank == 1) {
      bad += expect_error("OutOfMemory", {"injected"}, [&] { ddp(x).sum().backward(); });
      bad += expect_error(
          "Error", {"the last backward did not finish", "0.weight", "the process group is aborted"},
          [&] { ddp(x); });
      try {
        Tensor y = ddp(x);
        std::printf("rank 1: EXPECTED success: the next forward runs\n");
        bad += expect_error("PeerError", {"aborted by rank 1"}, [&] { y.sum().backward(); });
      } catch (const std::exception& e) {
        std::printf("rank 1: UNEXPECTED %s from the forward after: %s\n", class_of(e).c_str(),
                    e.what());
        ++bad;
      }
      for (int i = 0; i < 1200 && !std::filesystem::exists(marker); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } else {
      bad += expect_error("PeerError", {"another rank failed", "the last backward did not finish"},
                          [&] { ddp(x).sum().backward(); });
      std::ofstream(marker) << "done\n";
    }
    std::fflush(stdout);
    d::destroy_process_group();
    return bad ? 1 : 0;
  }
  if (name == "ddp_last_reduction_fails") {
    // Review F11: the last bucket's reduction fails (rank 1 aborts the group from a hook that
    // runs just before that bucket would start). Rank 0 must get the error before its optimiser
    // step: from backward or, at the latest, from synchronize_gradients().
    std::string device = arg(args, "--device");
    bp::Device& dev = bp::device(device.empty() ? "cpu:0" : device);
    if (dev.type() == "opencl" && !have_opencl()) {
      std::printf("rank %d: SKIP: no opencl device here\n", rank);
      return 0;
    }
    d::init_process_group();
    auto [net, first_layer] = small_net();
    bp::nn::Linear& first = *first_layer;
    net->to(dev);
    // Rank 1 gives rank 0's backward up to 2 s to return (it does at once where backward does
    // not wait on the host), so the failure comes after it.
    std::string marker = arg(args, "--marker");
    if (rank == 1)
      first.weight().register_post_accumulate_grad_hook([&](const Tensor&) {
        for (int i = 0; i < 40 && !std::filesystem::exists(marker); ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        d::group().abort("injected before the last bucket");
      });
    bp::nn::DistributedDataParallel ddp(net, {.bucket_cap_mb = 0.0001});
    Tensor x = bp::ones({4, 8}, dev);
    int rc = expect_error("PeerError", {"injected before the last bucket"}, [&] {
      try {
        ddp(x).sum().backward();
      } catch (...) {
        if (rank == 0) std::ofstream(marker) << "backward returned\n";
        throw;
      }
      if (rank == 0) std::ofstream(marker) << "backward returned\n";
      ddp.synchronize_gradients();
    });
    d::destroy_process_group();
    return rc;
  }
  if (name == "dropped_work_timeout") {
    // Review F5, with BACKPLANE_DIST_CHECK=0 (so only the watchdog can notice): rank 0 drops the
    // Work of an all_reduce that rank 1 never joins. The watchdog must fail the group naming it,
    // the next call on rank 0 must report that, rank 1 must learn it, and both must leave.
    std::string marker = arg(args, "--marker");
    d::init_process_group();
    d::all_reduce(f32(4)).wait();  // the communicator exists
    int rc;
    if (rank == 0) {
      d::all_reduce(f32(64));  // dropped
      rc = expect_error("TimeoutError", {"all_reduce #2", "its Work was dropped"},
                        [&] { d::barrier(); });
      std::ofstream(marker) << "done\n";
    } else {
      for (int i = 0; i < 1200 && !std::filesystem::exists(marker); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      rc = expect_error("TimeoutError", {"another rank failed", "rank 0", "its Work was dropped"},
                        [&] { d::barrier(); });
    }
    d::destroy_process_group();
    std::printf("rank %d: EXPECTED success: destroy_process_group returned\n", rank);
    std::fflush(stdout);
    return rc;
  }
  if (name == "missing_library") {
    // BACKPLANE_DIST_BACKEND=cpu:nccl and BACKPLANE_NCCL_LIBRARY=/nonexistent/libnccl.so.2.
    d::init_process_group();
    return expect_error("BackendUnavailable", {"nccl", "/nonexistent/libnccl.so.2"},
                        [&] { d::all_reduce(f32(8)).wait(); });
  }
  std::printf("unknown fault scenario '%s'\n", name.c_str());
  return 2;
}

}  // namespace bpt
