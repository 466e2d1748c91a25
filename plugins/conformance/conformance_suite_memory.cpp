// The memory suite (allocation edge cases, alignment, statistics and leaks) and the copies
// suite (h2d, d2h, d2d and memset with odd sizes and offsets, guard bytes on both sides).
#include "conformance_suites.hpp"

#include <algorithm>
#include <cstring>
#include <random>

namespace bpc {

namespace {

const uint64_t kSizes[] = {1, 7, 4097, (uint64_t{1} << 20) + 3};
const uint64_t kOffsets[] = {0, 1, 13};

std::string ull(uint64_t v) {
  return std::to_string(v);
}

void expect_stats_back(Context& c, const bp_memory_stats& base, const std::string& what) {
  bp_memory_stats now = read_stats(c);
  if (now.allocated != base.allocated || now.num_allocs != base.num_allocs)
    throw Failure(what + ": statistics did not return to the baseline: allocated " +
                  ull(now.allocated) + " bytes in " + ull(now.num_allocs) +
                  " allocations, expected " + ull(base.allocated) + " in " + ull(base.num_allocs) +
                  " (a leak, or frees not counted)");
}

// Checks a guarded buffer's payload: [off, off+n) holds `data` (or `fill` when data is null) and
// every other payload byte still holds the guard pattern.
void expect_region(const std::vector<uint8_t>& payload, uint64_t off, uint64_t n,
                   const uint8_t* data, int fill, const std::string& what) {
  for (uint64_t i = 0; i < payload.size(); ++i) {
    bool inside = i >= off && i < off + n;
    uint8_t want = inside ? (data ? data[i - off] : static_cast<uint8_t>(fill))
                          : guard_byte(GuardedBuffer::kGuard + i);
    if (payload[i] != want) {
      if (inside)
        throw Failure(format("%s: byte %llu of the %llu-byte region is 0x%02x, expected 0x%02x",
                             what.c_str(), static_cast<unsigned long long>(i - off),
                             static_cast<unsigned long long>(n), payload[i], want));
      if (i < off)
        throw Failure(
            format("%s: wrote before the start of the region: byte %llu before it "
                   "was overwritten",
                   what.c_str(), static_cast<unsigned long long>(off - i)));
      throw Failure(
          format("%s: wrote past the end of the region: byte %llu after it was "
                 "overwritten",
                 what.c_str(), static_cast<unsigned long long>(i - off - n)));
    }
  }
}

std::string copy_what(const char* op, uint64_t n, uint64_t off) {
  return format("%s of %llu bytes at offset %llu", op, static_cast<unsigned long long>(n),
                static_cast<unsigned long long>(off));
}

// Calls memory_stats with a smaller struct in guarded memory.
void stats_with_size(Context& c, size_t declared) {
  const size_t total = sizeof(bp_memory_stats) + 64;
  std::vector<uint8_t> mem(total);
  for (size_t i = 0; i < total; ++i) mem[i] = guard_byte(i);
  std::memset(mem.data(), 0, declared);
  std::memcpy(mem.data(), &declared, sizeof(size_t));
  c.check(c.t().memory_stats(c.device(), reinterpret_cast<bp_memory_stats*>(mem.data())),
          format("memory_stats with struct_size %zu", declared));
  for (size_t i = std::max(declared, sizeof(size_t)); i < total; ++i)
    if (mem[i] != guard_byte(i))
      throw Failure(format("memory_stats with struct_size %zu wrote byte %zu (past the struct)",
                           declared, i));
}

}  // namespace

void build_memory_suite(Context& ctx, std::vector<TestCase>& out) {
  SuiteBuilder b(out, "memory", ctx.device_label());

  b.add("zero_byte", [](Context& c) {
    c.sync(c.stream());
    bp_memory_stats base = read_stats(c);
    bool null_handle = false;
    for (int i = 0; i < 3; ++i) {
      bp_buffer* buf = nullptr;
      c.check(c.t().mem_alloc(c.device(), c.stream(), 0, &buf), "mem_alloc(0 bytes)");
      null_handle = buf == nullptr;
      c.check(c.t().mem_free(c.device(), c.stream(), buf, 0), "mem_free(0-byte buffer)");
    }
    c.sync(c.stream());
    expect_stats_back(c, base, "after three 0-byte allocations");
    c.note(null_handle ? "0 bytes gives a NULL handle" : "0 bytes gives a non-NULL handle");
  });

  b.add("free_null", [](Context& c) {
    c.check(c.t().mem_free(c.device(), c.stream(), nullptr, 0), "mem_free(NULL, 0)");
    c.check(c.t().mem_free(c.device(), c.stream(), nullptr, 64), "mem_free(NULL, 64)");
  });

  b.add("huge_request", [](Context& c) {
    c.sync(c.stream());
    bp_memory_stats base = read_stats(c);
    const uint64_t huge = uint64_t{1} << 60;
    bp_buffer* buf = nullptr;
    bp_error* e = c.t().mem_alloc(c.device(), c.stream(), huge, &buf);
    if (!e) {
      c.t().mem_free(c.device(), c.stream(), buf, huge);
      throw Failure("mem_alloc(2^60 bytes) succeeded");
    }
    int32_t code = e->code;
    std::string desc = take_error(c.api(), e);
    if (code != BP_ERROR_OUT_OF_MEMORY)
      throw Failure("mem_alloc(2^60 bytes): expected BP_ERROR_OUT_OF_MEMORY, got " + desc);
    {
      DeviceBuffer after(c, 1 << 20);  // the device still allocates afterwards
    }
    c.sync(c.stream());
    expect_stats_back(c, base, "after a failed 2^60-byte request");
    c.note(desc);
  });

  b.add("alignment", [](Context& c) {
    if (!c.t().mem_host_pointer)
      throw Skipped("mem_host_pointer is NULL (optional): buffers have no host address");
    bp_device_properties props = read_properties(c);
    int with_pointer = 0;
    for (uint64_t n : {uint64_t{1}, uint64_t{3}, uint64_t{64}, uint64_t{100}, uint64_t{4097},
                       uint64_t{1} << 20, uint64_t{3} << 20}) {
      DeviceBuffer buf(c, n);
      void* p = c.t().mem_host_pointer(buf.get());
      if (!p) {
        if (props.unified_memory)
          throw Failure(
              format("mem_host_pointer returned NULL for a %llu-byte buffer on a "
                     "unified-memory device",
                     static_cast<unsigned long long>(n)));
        continue;
      }
      ++with_pointer;
      if (reinterpret_cast<uintptr_t>(p) % 64 != 0)
        throw Failure(format("the %llu-byte buffer's host address %p is not 64-byte aligned",
                             static_cast<unsigned long long>(n), p));
      // The host address is the buffer's memory: writes through it are seen by copies.
      std::vector<uint8_t> data = random_bytes(c.seed_for("alignment") + n, n);
      c.sync(c.stream());
      std::memcpy(p, data.data(), n);
      std::vector<uint8_t> back(n);
      c.check(c.t().copy_d2h(c.stream(), back.data(), buf.get(), 0, n), "copy_d2h");
      c.sync(c.stream());
      if (back != data)
        throw Failure("bytes written through mem_host_pointer are not what copy_d2h reads");
    }
    if (!with_pointer)
      throw Skipped("mem_host_pointer returns NULL: device memory is not host memory");
    c.note("7 sizes, host addresses 64-byte aligned and coherent with copies");
  });

  b.add("leak_check", [](Context& c) {
    c.sync(c.stream());
    bp_memory_stats base = read_stats(c);
    const uint64_t sizes[] = {1, 7, 64, 4097, (uint64_t{1} << 20) + 3, uint64_t{3} << 20};
    uint64_t total = 0;
    {
      std::vector<DeviceBuffer> bufs;
      for (uint64_t n : sizes) {
        bufs.emplace_back(c, n);
        uint8_t byte = 0x42;
        c.check(c.t().copy_h2d(c.stream(), bufs.back().get(), n - 1, &byte, 1), "copy_h2d");
        total += n;
      }
      c.sync(c.stream());
      bp_memory_stats mid = read_stats(c);
      if (mid.allocated < base.allocated + total)
        throw Failure(format("with %llu bytes live, allocated grew by %lld only",
                             static_cast<unsigned long long>(total),
                             static_cast<long long>(mid.allocated - base.allocated)));
      if (mid.num_allocs != base.num_allocs + 6)
        throw Failure(format("num_allocs is %llu with 6 live allocations (baseline %llu)",
                             static_cast<unsigned long long>(mid.num_allocs),
                             static_cast<unsigned long long>(base.num_allocs)));
      if (mid.peak_allocated < mid.allocated) throw Failure("peak_allocated is below allocated");
      if (mid.reserved < mid.allocated) c.note("reserved < allocated");
    }
    c.sync(c.stream());
    expect_stats_back(c, base, "after freeing 6 buffers");
  });

  b.add("peak", [](Context& c) {
    c.sync(c.stream());
    c.check(c.t().memory_reset_peak(c.device()), "memory_reset_peak");
    bp_memory_stats s0 = read_stats(c);
    if (s0.peak_allocated != s0.allocated)
      throw Failure(format("after memory_reset_peak, peak %llu != allocated %llu",
                           static_cast<unsigned long long>(s0.peak_allocated),
                           static_cast<unsigned long long>(s0.allocated)));
    const uint64_t n = uint64_t{4} << 20;
    {
      DeviceBuffer buf(c, n);
      bp_memory_stats s1 = read_stats(c);
      if (s1.peak_allocated < s0.allocated + n)
        throw Failure("peak_allocated did not grow with a 4 MiB allocation");
    }
    c.sync(c.stream());
    bp_memory_stats s2 = read_stats(c);
    if (s2.peak_allocated < s0.allocated + n) throw Failure("peak_allocated dropped after a free");
    c.check(c.t().memory_reset_peak(c.device()), "memory_reset_peak");
    bp_memory_stats s3 = read_stats(c);
    if (s3.peak_allocated != s3.allocated)
      throw Failure("memory_reset_peak did not bring peak back to allocated");
  });

  b.add("stats_small_struct", [](Context& c) {
    for (size_t sz : {sizeof(size_t), offsetof(bp_memory_stats, reserved),
                      offsetof(bp_memory_stats, num_allocs)})
      stats_with_size(c, sz);
    c.note("no byte written past struct_size for 3 smaller sizes");
  });

  b.add("many_allocations", [](Context& c) {
    c.sync(c.stream());
    bp_memory_stats base = read_stats(c);
    std::mt19937_64 g(c.seed_for("many_allocations"));
    {
      std::vector<DeviceBuffer> bufs;
      for (int i = 0; i < 300; ++i) {
        uint64_t n = 1 + g() % 8192;
        bufs.emplace_back(c, n);
        uint8_t byte = static_cast<uint8_t>(i);
        c.check(c.t().copy_h2d(c.stream(), bufs.back().get(), n - 1, &byte, 1), "copy_h2d");
      }
      c.sync(c.stream());
      std::shuffle(bufs.begin(), bufs.end(), g);
      for (int i = 0; i < 300; i += 37) {
        uint8_t byte = 0;
        c.check(c.t().copy_d2h(c.stream(), &byte, bufs[i].get(), bufs[i].size() - 1, 1),
                "copy_d2h");
      }
      while (!bufs.empty()) bufs.pop_back();
    }
    c.sync(c.stream());
    expect_stats_back(c, base, "after 300 allocations freed in random order");
  });
}

void build_copies_suite(Context& ctx, std::vector<TestCase>& out) {
  SuiteBuilder b(out, "copies", ctx.device_label());

  b.add("h2d_d2h", [](Context& c) {
    for (uint64_t n : kSizes)
      for (uint64_t off : kOffsets) {
        std::string what = copy_what("copy_h2d/copy_d2h", n, off);
        GuardedBuffer gb(c, n + off + 3);
        std::vector<uint8_t> data = random_bytes(c.seed_for(what), n);
        c.check(c.t().copy_h2d(c.stream(), gb.get(), gb.offset() + off, data.data(), n),
                "copy_h2d " + what);
        GuardedHost host(n);
        c.check(c.t().copy_d2h(c.stream(), host.data(), gb.get(), gb.offset() + off, n),
                "copy_d2h " + what);
        c.sync(c.stream());
        host.check("copy_d2h " + what);
        if (std::memcmp(host.data(), data.data(), n) != 0)
          throw Failure(what + ": copy_d2h did not return what copy_h2d wrote");
        expect_region(gb.read_checked(what), off, n, data.data(), 0, "copy_h2d " + what);
      }
    c.note("sizes 1, 7, 4097, 2^20+3 at offsets 0, 1, 13");
  });

  b.add("d2d", [](Context& c) {
    const std::pair<uint64_t, uint64_t> offs[] = {{0, 0}, {1, 13}, {13, 1}};
    for (uint64_t n : kSizes)
      for (auto [soff, doff] : offs) {
        std::string what =
            format("copy_d2d of %llu bytes from offset %llu to offset %llu",
                   static_cast<unsigned long long>(n), static_cast<unsigned long long>(soff),
                   static_cast<unsigned long long>(doff));
        GuardedBuffer src(c, n + soff), dst(c, n + doff + 2);
        std::vector<uint8_t> data = random_bytes(c.seed_for(what), n);
        c.check(c.t().copy_h2d(c.stream(), src.get(), src.offset() + soff, data.data(), n),
                "copy_h2d");
        c.check(c.t().copy_d2d(c.stream(), dst.get(), dst.offset() + doff, src.get(),
                               src.offset() + soff, n),
                what);
        c.sync(c.stream());
        expect_region(dst.read_checked(what), doff, n, data.data(), 0, what);
        expect_region(src.read_checked(what + " (source)"), soff, n, data.data(), 0,
                      what + " (source must be unchanged)");
      }
  });

  b.add("memset", [](Context& c) {
    const int values[] = {0x5A, 0xFF, 0x00};
    int k = 0;
    for (uint64_t n : kSizes)
      for (uint64_t off : kOffsets) {
        int value = values[k++ % 3];
        std::string what = copy_what("memset", n, off) + format(" with 0x%02x", value);
        GuardedBuffer gb(c, n + off + 3);
        c.check(c.t().memset(c.stream(), gb.get(), gb.offset() + off, value, n), what);
        c.sync(c.stream());
        expect_region(gb.read_checked(what), off, n, nullptr, value, what);
      }
  });

  b.add("zero_size", [](Context& c) {
    GuardedBuffer a(c, 16), d(c, 16);
    uint8_t host[16] = {1, 2, 3};
    c.check(c.t().copy_h2d(c.stream(), a.get(), a.offset() + 3, host, 0), "copy_h2d of 0 bytes");
    c.check(c.t().copy_d2h(c.stream(), host, a.get(), a.offset() + 3, 0), "copy_d2h of 0 bytes");
    c.check(c.t().copy_d2d(c.stream(), d.get(), d.offset(), a.get(), a.offset(), 0),
            "copy_d2d of 0 bytes");
    c.check(c.t().memset(c.stream(), a.get(), a.offset() + 5, 0x11, 0), "memset of 0 bytes");
    c.sync(c.stream());
    expect_region(a.read_checked("0-byte operations"), 0, 0, nullptr, 0, "0-byte operations");
    expect_region(d.read_checked("0-byte copy_d2d"), 0, 0, nullptr, 0, "0-byte copy_d2d");
    if (host[0] != 1 || host[1] != 2 || host[2] != 3)
      throw Failure("copy_d2h of 0 bytes wrote to the host destination");
  });

  b.add("large", [](Context& c) {
    const uint64_t n = (uint64_t{16} << 20) + 5;
    std::vector<uint8_t> data = random_bytes(c.seed_for("large"), n);
    DeviceBuffer x(c, n), y(c, n);
    c.check(c.t().copy_h2d(c.stream(), x.get(), 0, data.data(), n), "copy_h2d of 16 MiB + 5");
    c.check(c.t().copy_d2d(c.stream(), y.get(), 0, x.get(), 0, n), "copy_d2d of 16 MiB + 5");
    std::vector<uint8_t> back(n);
    c.check(c.t().copy_d2h(c.stream(), back.data(), y.get(), 0, n), "copy_d2h of 16 MiB + 5");
    c.sync(c.stream());
    if (back != data) throw Failure("16 MiB + 5 bytes did not survive h2d -> d2d -> d2h");
  });
}

}  // namespace bpc
