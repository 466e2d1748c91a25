// The native suite: the minor-2 slots of Note [Native handles] in plugin_abi.h (buffer_native,
// stream_native, buffer_import, stream_import). Each test exercises its slot when the plugin
// sets it, checks a well-formed BP_ERROR_UNSUPPORTED when the plugin answers that (OpenCL's
// buffers), and otherwise names the host's default: a slot that is NULL, or absent from an
// older table (never read past struct_size), makes the host throw bp::UnsupportedError.
#include "conformance_data.hpp"
#include "conformance_suites.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

namespace bpc {

namespace {

// A minor-2 slot of the table, or nullptr when it is NULL or past the table's struct_size
// (Note [ABI versioning]: never read then).
#define BPC_SLOT(t, slot) (BP_API_HAS_SLOT(&(t), 2, slot) ? (t).slot : nullptr)

std::string default_note(const bp_plugin_api& t, bool in_table, const char* slot) {
  if (in_table)
    return format(
        "NULL: host default is bp::UnsupportedError naming the device, the plugin and "
        "the NULL slot %s",
        slot);
  return format(
      "not in this ABI %u.%u table (%zu bytes; minor-2 slots start at byte %zu), so "
      "never read: host default is bp::UnsupportedError naming the plugin's ABI",
      t.abi_major, t.abi_minor, t.struct_size, static_cast<size_t>(BP_API_MINOR2_OFFSET));
}
#define BPC_DEFAULT(c, slot) default_note((c).t(), BP_API_HAS_SLOT(&(c).t(), 2, slot), #slot)

// Checks an error the plugin returned instead of a result. BP_ERROR_UNSUPPORTED with a reason
// is an acceptable answer (returned as a note); anything else fails naming `what`.
std::string expect_unsupported(Context& c, bp_error* e, const std::string& what) {
  int32_t code = e->code;
  bool has_reason = e->message && std::strlen(e->message) > 10;
  bool has_plugin = e->plugin && *e->plugin;
  std::string desc = take_error(c.api(), e);
  if (code != BP_ERROR_UNSUPPORTED) throw Failure(what + " failed: " + desc);
  if (!has_reason || !has_plugin)
    throw Failure(what + ": BP_ERROR_UNSUPPORTED must carry a reason and the plugin name: " + desc);
  return "answers BP_ERROR_UNSUPPORTED with a reason: " + desc;
}

// A stream created for one test, synchronised and destroyed at scope exit.
class ScopedStream {
 public:
  explicit ScopedStream(Context& c) : c_(c) {
    c.check(c.t().stream_create(c.device(), &s_), "stream_create");
    if (!s_) throw Failure("stream_create returned NULL");
  }
  ~ScopedStream() {
    take_error(c_.api(), c_.t().stream_synchronize(s_));
    take_error(c_.api(), c_.t().stream_destroy(s_));
  }
  ScopedStream(const ScopedStream&) = delete;
  ScopedStream& operator=(const ScopedStream&) = delete;
  bp_stream* get() const { return s_; }

 private:
  Context& c_;
  bp_stream* s_ = nullptr;
};

// What release is called with: counts the calls and remembers the order they came in.
struct ReleaseProbe {
  std::atomic<int> calls{0};
  std::atomic<int>* order = nullptr;  // shared counter stamping each call
  int stamp = -1;
  static void release(void* ctx) {
    auto* p = static_cast<ReleaseProbe*>(ctx);
    if (p->order) p->stamp = p->order->fetch_add(1);
    p->calls.fetch_add(1);
  }
};

bp_native_buffer native_of(Context& c, bp_buffer* b, uint64_t offset, const std::string& what) {
  bp_native_buffer n{};
  n.struct_size = sizeof n;
  c.check(c.t().buffer_native(b, offset, &n), what);
  return n;
}

// Host memory an import may wrap: true for host-addressed device types.
bool is_host_type(int32_t dlpack) {
  return dlpack == BP_DLPACK_CPU || dlpack == BP_DLPACK_CUDA_HOST;
}

// Foreign memory for an import: ordinary host memory when the device's buffers are host
// memory, else the native address of a buffer of the plugin's own (an alias, as a DLPack
// round trip produces), owned by this object either way.
class ForeignMemory {
 public:
  ForeignMemory(Context& c, uint64_t bytes) : c_(c), bytes_(bytes) {
    DeviceBuffer probe(c, 64);
    bp_native_buffer n = native_of(c, probe.get(), 0, "buffer_native of a 64-byte buffer");
    host_ = is_host_type(n.dlpack_device_type);
    if (host_) {
      address_ = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
      if (!address_) throw Skipped("out of host memory");
    } else {
      owner_ = DeviceBuffer(c, bytes);
      address_ = native_of(c, owner_.get(), 0, "buffer_native of the owner buffer").address;
    }
  }
  ~ForeignMemory() {
    if (host_) std::free(address_);
  }
  ForeignMemory(const ForeignMemory&) = delete;
  ForeignMemory& operator=(const ForeignMemory&) = delete;

  void* address() const { return address_; }
  bool host() const { return host_; }
  // Writes bytes at `offset` (synchronously).
  void write(const void* data, uint64_t n, uint64_t offset = 0) {
    if (host_) {
      std::memcpy(static_cast<char*>(address_) + offset, data, n);
      return;
    }
    c_.check(c_.t().copy_h2d(c_.stream(), owner_.get(), offset, data, n), "copy_h2d (owner)");
    c_.sync(c_.stream());
  }
  // Reads bytes without waiting for any stream: directly for host memory, else through a
  // stream of its own that nothing else uses.
  void read(void* out, uint64_t n, uint64_t offset = 0) {
    if (host_) {
      std::memcpy(out, static_cast<char*>(address_) + offset, n);
      return;
    }
    ScopedStream s(c_);
    c_.check(c_.t().copy_d2h(s.get(), out, owner_.get(), offset, n), "copy_d2h (owner)");
    c_.sync(s.get());
  }

 private:
  Context& c_;
  uint64_t bytes_;
  bool host_ = false;
  void* address_ = nullptr;
  DeviceBuffer owner_;
};

// Resolves add f32, or nullptr when the plugin has none.
bp_kernel* add_kernel(Context& c) {
  bp_kernel* k = nullptr;
  bp_error* e = c.t().find_kernel(c.device(), "add", BP_DTYPE_F32, &k);
  take_error(c.api(), e);
  return e ? nullptr : k;
}

std::vector<float> random_floats(Context& c, const std::string& test, size_t n) {
  Rng rng(c.seed_for(test));
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.uniform(-4, 4));
  return v;
}

void expect_same(const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& what) {
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&got[i], &want[i], 4) != 0)
      throw Failure(format("%s: element %zu is %g, expected %g", what.c_str(), i,
                           static_cast<double>(got[i]), static_cast<double>(want[i])));
}

}  // namespace

void build_native_suite(Context& ctx, std::vector<TestCase>& out) {
  SuiteBuilder b(out, "native", ctx.device_label());

  b.add("buffer_native", [](Context& c) {
    if (!BPC_SLOT(c.t(), buffer_native)) {
      c.note(BPC_DEFAULT(c, buffer_native));
      return;
    }
    const uint64_t size = 4096 + 13;
    DeviceBuffer buf(c, size);
    bp_native_buffer n0{};
    n0.struct_size = sizeof n0;
    if (bp_error* e = c.t().buffer_native(buf.get(), 0, &n0)) {
      c.note(expect_unsupported(c, e, "buffer_native(offset 0)"));
      return;
    }
    if (!n0.address) throw Failure("buffer_native returned a NULL address for a 4109-byte buffer");
    if (n0.dlpack_device_type <= 0 || n0.device_ordinal < 0)
      throw Failure(format("buffer_native: DLPack device type %d, ordinal %d",
                           n0.dlpack_device_type, n0.device_ordinal));
    for (uint64_t off : {uint64_t{1}, uint64_t{13}, uint64_t{4096}, size, uint64_t{0}}) {
      bp_native_buffer n =
          native_of(c, buf.get(), off,
                    format("buffer_native(offset %llu)", static_cast<unsigned long long>(off)));
      if (n.address != static_cast<char*>(n0.address) + off ||
          n.device_ordinal != n0.device_ordinal || n.dlpack_device_type != n0.dlpack_device_type)
        throw Failure(
            format("buffer_native(offset %llu) gave %p (ordinal %d, type %d); expected "
                   "%p + %llu (ordinal %d, type %d)",
                   static_cast<unsigned long long>(off), n.address, n.device_ordinal,
                   n.dlpack_device_type, n0.address, static_cast<unsigned long long>(off),
                   n0.device_ordinal, n0.dlpack_device_type));
    }
    bp_device_properties props = read_properties(c);
    if (c.t().mem_host_pointer) {
      void* hp = c.t().mem_host_pointer(buf.get());
      if (hp && hp != n0.address)
        throw Failure(format("mem_host_pointer is %p but buffer_native(0) is %p", hp, n0.address));
    }
    if (is_host_type(n0.dlpack_device_type) != (props.unified_memory != 0))
      throw Failure(format(
          "DLPack device type %d %s host memory but unified_memory is %d", n0.dlpack_device_type,
          is_host_type(n0.dlpack_device_type) ? "says" : "does not say", props.unified_memory));
    if (is_host_type(n0.dlpack_device_type)) {
      // The address is the buffer: bytes copied in are there, bytes written there come out.
      std::vector<uint8_t> data = random_bytes(c.seed_for("buffer_native"), size), back(size);
      c.check(c.t().copy_h2d(c.stream(), buf.get(), 0, data.data(), size), "copy_h2d");
      c.sync(c.stream());
      if (std::memcmp(n0.address, data.data(), size) != 0)
        throw Failure("bytes copied into the buffer are not at its native address");
      for (uint64_t i = 0; i < size; ++i) static_cast<uint8_t*>(n0.address)[i] ^= 0x5A;
      c.check(c.t().copy_d2h(c.stream(), back.data(), buf.get(), 0, size), "copy_d2h");
      c.sync(c.stream());
      for (uint64_t i = 0; i < size; ++i)
        if (back[i] != (data[i] ^ 0x5A))
          throw Failure(format("byte %llu written at the native address is not in the buffer",
                               static_cast<unsigned long long>(i)));
    }
    // A host with a smaller bp_native_buffer (address only): nothing written past it.
    struct {
      bp_native_buffer n;
      uint8_t guard[64];
    } small;
    std::memset(&small, 0xC3, sizeof small);
    small.n.struct_size = offsetof(bp_native_buffer, device_ordinal);
    c.check(c.t().buffer_native(buf.get(), 5, &small.n), "buffer_native with a small struct");
    const auto* bytes = reinterpret_cast<const uint8_t*>(&small);
    for (size_t i = offsetof(bp_native_buffer, device_ordinal); i < sizeof small; ++i)
      if (bytes[i] != 0xC3)
        throw Failure(
            format("buffer_native with struct_size %zu wrote byte %zu", small.n.struct_size, i));
    if (small.n.address != static_cast<char*>(n0.address) + 5)
      throw Failure("buffer_native with a small struct gave another address");
    bp_error* null_out = c.t().buffer_native(buf.get(), 0, nullptr);
    if (!null_out) throw Failure("buffer_native accepted a NULL out_native");
    take_error(c.api(), null_out);
    c.note(
        format("address of offset k is base + k; DLPack device type %d, ordinal %d%s",
               n0.dlpack_device_type, n0.device_ordinal,
               is_host_type(n0.dlpack_device_type) ? "; bytes read and written through it" : ""));
  });

  b.add("stream_native", [](Context& c) {
    if (!BPC_SLOT(c.t(), stream_native)) {
      c.note(BPC_DEFAULT(c, stream_native));
      return;
    }
    ScopedStream s1(c), s2(c);
    void* h1 = reinterpret_cast<void*>(uintptr_t{1});
    if (bp_error* e = c.t().stream_native(s1.get(), &h1)) {
      c.note(expect_unsupported(c, e, "stream_native"));
      return;
    }
    void* again = reinterpret_cast<void*>(uintptr_t{1});
    void* h2 = reinterpret_cast<void*>(uintptr_t{1});
    c.check(c.t().stream_native(s1.get(), &again), "stream_native (second call)");
    c.check(c.t().stream_native(s2.get(), &h2), "stream_native (second stream)");
    if (again != h1) throw Failure(format("stream_native changed: %p then %p", h1, again));
    if ((h1 == nullptr) != (h2 == nullptr) || (h1 && h1 == h2))
      throw Failure(
          format("two streams have native handles %p and %p (expected two distinct "
                 "handles, or NULL for both on an eager backend)",
                 h1, h2));
    // The handle stays the same while the stream is used.
    DeviceBuffer tmp(c, 4096, s1.get());
    c.check(c.t().memset(s1.get(), tmp.get(), 0, 7, 4096), "memset");
    c.sync(s1.get());
    c.check(c.t().stream_native(s1.get(), &again), "stream_native (after work)");
    if (again != h1) throw Failure("stream_native changed after work on the stream");
    void* unused = nullptr;
    if (bp_error* e = c.t().stream_native(nullptr, &unused))
      take_error(c.api(), e);
    else
      throw Failure("stream_native(NULL stream) succeeded");
    c.note(h1 ? format("stable, distinct per stream (%p, %p)", h1, h2)
              : std::string("NULL for every stream: eager streams without a native object"));
  });

  b.add("buffer_import", [](Context& c) {
    auto import = BPC_SLOT(c.t(), buffer_import);
    if (!import) {
      c.note(BPC_DEFAULT(c, buffer_import));
      return;
    }
    const bool addressable = BPC_SLOT(c.t(), buffer_native) != nullptr && [&] {
      DeviceBuffer probe(c, 64);
      bp_native_buffer n{};
      n.struct_size = sizeof n;
      bp_error* e = c.t().buffer_native(probe.get(), 0, &n);
      take_error(c.api(), e);
      return e == nullptr;
    }();
    if (!addressable) {
      // Nothing pointer-addressable to import: the plugin must refuse, and never release.
      std::vector<uint8_t> host(256, 1);
      ReleaseProbe probe;
      bp_buffer* h = nullptr;
      bp_error* e =
          import(c.device(), host.data(), host.size(), &ReleaseProbe::release, &probe, &h);
      if (!e) {
        take_error(c.api(), c.t().mem_free(c.device(), c.stream(), h, host.size()));
        throw Failure("buffer_import succeeded on a device whose buffer_native is unavailable");
      }
      std::string note = expect_unsupported(c, e, "buffer_import");
      if (probe.calls.load() != 0) throw Failure("release was called although the import failed");
      c.note(note);
      return;
    }
    // N floats: long enough for queued work to still run on an asynchronous device.
    const uint64_t n = (uint64_t{1} << 21) + 3, bytes = n * 4;
    ForeignMemory mem(c, bytes);
    std::vector<float> x = random_floats(c, "buffer_import", n), got(n);
    mem.write(x.data(), bytes);
    bp_memory_stats before = read_stats(c);
    ReleaseProbe probe;
    bp_buffer* h = nullptr;
    c.check(import(c.device(), mem.address(), bytes, &ReleaseProbe::release, &probe, &h),
            "buffer_import");
    if (!h) throw Failure("buffer_import succeeded with a NULL buffer");
    bp_memory_stats during = read_stats(c);
    if (during.allocated != before.allocated || during.num_allocs != before.num_allocs)
      throw Failure(
          format("importing changed memory_stats: allocated %llu -> %llu, num_allocs "
                 "%llu -> %llu (imported memory is not counted)",
                 static_cast<unsigned long long>(before.allocated),
                 static_cast<unsigned long long>(during.allocated),
                 static_cast<unsigned long long>(before.num_allocs),
                 static_cast<unsigned long long>(during.num_allocs)));
    bp_native_buffer ni = native_of(c, h, 8, "buffer_native of the imported buffer");
    if (ni.address != static_cast<char*>(mem.address()) + 8)
      throw Failure(format("buffer_native(imported, 8) is %p, expected the imported %p + 8",
                           ni.address, mem.address()));
    // Reads and writes through the import: out = x + x from the imported memory, then the
    // result copied back into it, then a copy out of it at an odd offset.
    bp_stream* s = c.stream();
    DeviceBuffer o(c, bytes);
    std::vector<float> want(n);
    bp_kernel* k = add_kernel(c);
    std::vector<int64_t> shape = {static_cast<int64_t>(n)};
    if (k) {
      bp_tensor_desc in = make_desc(h, 0, BP_DTYPE_F32, shape, {1});
      bp_tensor_desc ins[2] = {in, in};
      bp_tensor_desc od = make_desc(o.get(), 0, BP_DTYPE_F32, shape, {1});
      c.check(c.t().launch(k, s, ins, 2, &od, 1, nullptr, 0), "launch add f32 on imported memory");
      for (uint64_t i = 0; i < n; ++i) want[i] = x[i] + x[i];
    } else {
      c.check(c.t().copy_d2d(s, o.get(), 0, h, 0, bytes), "copy_d2d from imported memory");
      want = x;
    }
    c.check(c.t().copy_d2d(s, h, 0, o.get(), 0, bytes), "copy_d2d into imported memory");
    c.check(c.t().copy_d2h(s, got.data(), h, 4, bytes - 4), "copy_d2h from imported memory");
    c.sync(s);
    expect_same(std::vector<float>(got.begin(), got.end() - 1),
                std::vector<float>(want.begin() + 1, want.end()), "copy_d2h from the import");
    // Free with more work queued that reads the memory, then check the release's timing.
    if (k) {
      bp_tensor_desc in = make_desc(h, 0, BP_DTYPE_F32, shape, {1});
      bp_tensor_desc ins[2] = {in, in};
      bp_tensor_desc od = make_desc(o.get(), 0, BP_DTYPE_F32, shape, {1});
      c.check(c.t().launch(k, s, ins, 2, &od, 1, nullptr, 0), "launch add f32 (queued)");
    }
    if (probe.calls.load() != 0) throw Failure("release was called before mem_free");
    c.check(c.t().mem_free(c.device(), s, h, bytes), "mem_free of the imported buffer");
    const bool at_once = probe.calls.load() == 1;
    if (at_once) {
      // Released at once: the queued work must already be done with the memory, so what it
      // wrote is complete when read on another stream.
      if (k) {
        std::vector<float> o_host(n), twice(n);
        ScopedStream other(c);
        c.check(c.t().copy_d2h(other.get(), o_host.data(), o.get(), 0, bytes), "copy_d2h");
        c.sync(other.get());
        for (uint64_t i = 0; i < n; ++i) twice[i] = want[i] + want[i];
        expect_same(o_host, twice, "work queued before the free, read when release ran");
      }
    }
    c.sync(s);
    int calls = probe.calls.load();
    if (calls != 1)
      throw Failure(
          format("release called %d times once the free and the stream's work were "
                 "done (expected exactly 1)",
                 calls));
    mem.read(got.data(), bytes);
    expect_same(got, want, "the imported memory after the device wrote into it");
    DeviceBuffer after(c, 4096);  // more calls never release again
    after.release();
    o.release();
    c.sync(s);
    if (probe.calls.load() != 1) throw Failure("release was called again after it had run");
    bp_memory_stats end = read_stats(c);
    if (end.allocated != before.allocated)
      throw Failure("memory_stats allocated did not return to its value before the import");
    c.note(
        format("%s memory, zero-copy reads and writes; released %s, exactly once; stats "
               "unchanged",
               mem.host() ? "host" : "aliased device",
               at_once ? "inside mem_free (queued work verified complete)"
                       : "after mem_free, by the stream's synchronisation"));
  });

  b.add("import_release_once", [](Context& c) {
    auto import = BPC_SLOT(c.t(), buffer_import);
    if (!import) {
      c.note(BPC_DEFAULT(c, buffer_import));
      return;
    }
    if (!BPC_SLOT(c.t(), buffer_native))
      throw Skipped("buffer_native is unavailable: no memory to import (see native.buffer_import)");
    DeviceBuffer probe_buf(c, 64);
    bp_native_buffer pn{};
    pn.struct_size = sizeof pn;
    if (bp_error* e = c.t().buffer_native(probe_buf.get(), 0, &pn)) {
      take_error(c.api(), e);
      throw Skipped("buffer_native answers an error: nothing to import (see native.buffer_import)");
    }
    // 64 imports of slices of one foreign block, freed in a shuffled order: each release runs
    // once with its own context. Plus an empty import with a NULL address and one without a
    // release function.
    const int kCount = 64;
    ForeignMemory mem(c, 64 * 256);
    std::atomic<int> order{0};
    std::vector<std::unique_ptr<ReleaseProbe>> probes;
    std::vector<bp_buffer*> handles;
    for (int i = 0; i < kCount; ++i) {
      probes.push_back(std::make_unique<ReleaseProbe>());
      probes.back()->order = &order;
      bp_buffer* h = nullptr;
      c.check(import(c.device(), static_cast<char*>(mem.address()) + 256 * i, 256,
                     &ReleaseProbe::release, probes.back().get(), &h),
              format("buffer_import #%d", i));
      handles.push_back(h);
    }
    Rng rng(c.seed_for("import_release_once"));
    std::vector<int> idx(kCount);
    for (int i = 0; i < kCount; ++i) idx[i] = i;
    for (int i = kCount - 1; i > 0; --i) std::swap(idx[i], idx[rng.integer(0, i)]);
    for (int i : idx) c.check(c.t().mem_free(c.device(), c.stream(), handles[i], 256), "mem_free");
    ReleaseProbe empty;
    bp_buffer* eh = nullptr;
    c.check(import(c.device(), nullptr, 0, &ReleaseProbe::release, &empty, &eh),
            "buffer_import of 0 bytes at NULL");
    c.check(c.t().mem_free(c.device(), c.stream(), eh, 0), "mem_free of the empty import");
    bp_buffer* nh = nullptr;
    c.check(import(c.device(), mem.address(), 256, nullptr, nullptr, &nh),
            "buffer_import without a release function");
    c.check(c.t().mem_free(c.device(), c.stream(), nh, 256), "mem_free (no release function)");
    c.sync(c.stream());
    for (int i = 0; i < kCount; ++i)
      if (probes[i]->calls.load() != 1)
        throw Failure(format("release of import #%d ran %d times", i, probes[i]->calls.load()));
    if (empty.calls.load() != 1)
      throw Failure(format("release of the empty import ran %d times", empty.calls.load()));
    c.note(
        format("%d imports freed in random order, an empty one and one without release: "
               "each released exactly once",
               kCount));
  });

  b.add("import_bad_arguments", [](Context& c) {
    auto import = BPC_SLOT(c.t(), buffer_import);
    if (!import) {
      c.note(BPC_DEFAULT(c, buffer_import));
      return;
    }
    ReleaseProbe probe;
    bp_buffer* h = nullptr;
    bp_error* e = import(c.device(), nullptr, 4096, &ReleaseProbe::release, &probe, &h);
    if (!e) throw Failure("buffer_import accepted a NULL address for 4096 bytes");
    int32_t code = e->code;
    std::string desc = take_error(c.api(), e);
    if (code != BP_ERROR_INVALID_ARGUMENT && code != BP_ERROR_UNSUPPORTED)
      throw Failure("buffer_import(NULL, 4096): expected BP_ERROR_INVALID_ARGUMENT, got " + desc);
    const char* reason = nullptr;
    int32_t n_dev = c.t().device_count(&reason);
    std::vector<uint8_t> host(64, 3);
    for (int32_t bad : {n_dev, -1}) {
      e = import(bad, host.data(), host.size(), &ReleaseProbe::release, &probe, &h);
      if (!e) throw Failure(format("buffer_import on device %d of %d succeeded", bad, n_dev));
      take_error(c.api(), e);
    }
    if (probe.calls.load() != 0) throw Failure("release was called for an import that failed");
    c.note("NULL address and bad device indices refused; release never called: " + desc);
  });

  b.add("stream_import", [](Context& c) {
    auto import = BPC_SLOT(c.t(), stream_import);
    if (!import) {
      c.note(BPC_DEFAULT(c, stream_import));
      return;
    }
    auto native = BPC_SLOT(c.t(), stream_native);
    if (!native) throw Skipped("stream_native is unavailable: no native stream to import");
    auto owner = std::make_unique<ScopedStream>(c);
    void* h = nullptr;
    if (bp_error* e = native(owner->get(), &h)) {
      take_error(c.api(), e);
      throw Skipped("stream_native answers an error: no native stream to import");
    }
    bp_stream* wrapped = nullptr;
    if (bp_error* e = import(c.device(), h, &wrapped)) {
      c.note(expect_unsupported(c, e, format("stream_import(%p)", h)));
      return;
    }
    void* again = reinterpret_cast<void*>(uintptr_t{1});
    c.check(native(wrapped, &again), "stream_native of the imported stream");
    if (again != h)
      throw Failure(format("the imported stream's native handle is %p, expected %p", again, h));
    // Work queued on the wrapper runs on the native queue, in order with the owner's work.
    const uint64_t n = (uint64_t{1} << 20) + 5;
    std::vector<float> x = random_floats(c, "stream_import", n), got(n), want(n);
    DeviceBuffer a(c, n * 4, wrapped), o(c, n * 4, wrapped);
    c.check(c.t().copy_h2d(wrapped, a.get(), 0, x.data(), n * 4), "copy_h2d on the import");
    bp_kernel* k = add_kernel(c);
    if (k) {
      std::vector<int64_t> shape = {static_cast<int64_t>(n)};
      bp_tensor_desc in = make_desc(a.get(), 0, BP_DTYPE_F32, shape, {1});
      bp_tensor_desc ins[2] = {in, in};
      bp_tensor_desc od = make_desc(o.get(), 0, BP_DTYPE_F32, shape, {1});
      c.check(c.t().launch(k, wrapped, ins, 2, &od, 1, nullptr, 0), "launch on the import");
      for (uint64_t i = 0; i < n; ++i) want[i] = x[i] + x[i];
    } else {
      c.check(c.t().copy_d2d(wrapped, o.get(), 0, a.get(), 0, n * 4), "copy_d2d on the import");
      want = x;
    }
    c.sync(wrapped);
    c.check(c.t().copy_d2h(owner->get(), got.data(), o.get(), 0, n * 4), "copy_d2h (owner)");
    c.sync(owner->get());
    expect_same(got, want, "work queued on the imported stream");
    a.release();
    o.release();
    c.sync(wrapped);
    c.check(c.t().stream_destroy(wrapped), "stream_destroy of the imported stream");
    // The native queue survives: the owner's stream still runs work.
    std::vector<uint8_t> bytes = random_bytes(c.seed_for("stream_import/after"), 4096), back(4096);
    DeviceBuffer t(c, 4096, owner->get());
    c.check(c.t().copy_h2d(owner->get(), t.get(), 0, bytes.data(), 4096), "copy_h2d (owner)");
    c.check(c.t().copy_d2h(owner->get(), back.data(), t.get(), 0, 4096), "copy_d2h (owner)");
    c.sync(owner->get());
    if (back != bytes)
      throw Failure("the owner's stream no longer works after the imported wrapper was destroyed");
    c.note(h ? format("native queue %p wrapped: same handle, work ordered, survives destroy", h)
             : std::string("the eager NULL stream wrapped: work runs, destroy leaves nothing"));
  });
}

}  // namespace bpc
