// Device memory of the CUDA backend: the per-stream cache of small freed blocks in front of a
// per-device stream-ordered pool.
//
// Note [Stream-ordered pool]
//   Each device owns one cudaMemPool_t created by the plugin (not the device's default pool,
//   so our settings and statistics never mix with other CUDA users in the process), with
//   cudaMemPoolAttrReleaseThreshold = UINT64_MAX: memory freed into the pool stays reserved and
//   is reused by later cudaMallocFromPoolAsync calls instead of going back to the driver at
//   every synchronisation. memory_empty_cache trims it to zero.
//
// Note [Small-block cache]
//   cudaMallocFromPoolAsync + cudaFreeAsync cost about 0.7 us per pair, a fifth of the per-op
//   budget of a one-element op. Blocks of up to 1 MiB are therefore rounded up to a size class
//   (four classes per power of two) and, when freed, parked in the SDK's lock-free cache
//   (bp::sdk::SizeClassCache, Note [Size-class cache] in size_class_cache.hpp) owned by the
//   stream they were freed on. A later allocation of the same class on the same stream
//   takes the block back without calling CUDA. This is safe for the same reason the pool's own
//   reuse is: work queued on a stream runs in order, so anything queued after the free runs
//   after every use of the block that the free was ordered behind. Blocks never move between
//   streams. The cache is bounded (16 blocks per class, kMaxCacheBytes per stream) and is
//   emptied by stream_destroy, memory_empty_cache and the out-of-memory retry.
//   Statistics (Note [Memory accounting] in memory_counters.hpp): libbackplane counts live
//   bytes itself; the plugin's `allocated`/`num_allocs` (for other hosts) count requested bytes
//   of live user allocations (cached blocks are not live), and `reserved` is the pool's
//   reserved memory (cached blocks are part of it).
#ifndef BACKPLANE_CUDA_MEMORY_HPP_
#define BACKPLANE_CUDA_MEMORY_HPP_

#include <backplane/sdk/memory_counters.hpp>
#include <backplane/sdk/size_class_cache.hpp>

#include <cstdint>

namespace bp::cuda {

// Freed blocks of one stream (Note [Small-block cache]): classes up to 1 MiB, 16 blocks each.
// Lock-free: take and put come from every thread that allocates or frees on the stream, drain
// from any thread (stream_destroy, empty_cache, the out-of-memory retry). Reuse stays
// stream-ordered whichever thread takes a block: the free that parked it was queued on the
// stream before the take, so the new owner's work runs after the old owner's.
using BlockCache = bp::sdk::SizeClassCache<void, 20, 16>;
constexpr uint64_t kMaxCacheBytes = uint64_t{64} << 20;  // per stream

}  // namespace bp::cuda

#endif  // BACKPLANE_CUDA_MEMORY_HPP_
