/*
 * Backplane communicator ABI — the whole contract between libbackplane (the host) and a
 * communicator plugin (libbackplane-comm-<name>.so) that runs collectives (all_reduce,
 * broadcast, all_gather, reduce_scatter, send/recv, barrier) between the processes of a
 * process group, on the memory of the device types it declares. First-party plugins: "nccl"
 * (cuda) and "gloo" (cpu). Plain C99; it shares bp_error, bp_dtype and the error codes with
 * plugin_abi.h. plugins/COMM-CHANGELOG.md records each minor version.
 *
 * Versioning (Note [Comm ABI versioning]) — the rules of plugin_abi.h's Note [ABI versioning]:
 *   - A plugin exports exactly one symbol, bp_comm_get_api(host_major, host_minor), returning
 *     its const bp_comm_api table (valid while the plugin is loaded) or NULL.
 *   - The host refuses a table of another major (a load error naming both versions). Minors only
 *     append slots to tables and fields to structs. Every struct starts with `size_t
 *     struct_size`, set by whoever fills it; a reader never touches a field past struct_size,
 *     and the host never calls a slot past the table's struct_size or newer than its minor.
 *
 * Errors (Note [Comm errors]):
 *   Every fallible slot returns NULL on success or a bp_error* that the caller frees with the
 *   same table's error_free. Besides plugin_abi.h's codes a communicator returns
 *   BP_COMM_ERROR_TIMEOUT, BP_COMM_ERROR_REMOTE and BP_COMM_ERROR_ABORTED (below). Messages name
 *   the operation, the rank, the element count and dtype; native_name carries the library's
 *   code ("ncclRemoteError", "gloo::IoException"). A plugin never aborts the process and never
 *   blocks without a bound: every wait ends by the communicator's timeout at the latest.
 *
 * Rendezvous (Note [Comm rendezvous]):
 *   The host owns the process group's key-value store (a file store or a TCP store, see
 *   backplane/dist.hpp) and hands it to comm_create as callbacks (bp_comm_host). Every rank
 *   calls comm_create with the same world size, each with its own rank; the plugin exchanges
 *   whatever it needs to connect (NCCL's unique id, Gloo's listening addresses) through the
 *   store. Keys are private to one communicator: the host prefixes them, so a plugin may use
 *   plain names such as "unique_id". The store is valid only during comm_create.
 *
 * Memory and streams (Note [Comm memory]):
 *   Buffers are native addresses (plugin_abi.h's bp_native_buffer::address: a CUDA device
 *   pointer, a host pointer for cpu) of contiguous elements; counts are elements, not bytes.
 *   `stream` is the native stream of the device (cudaStream_t, plugin_abi.h's stream_native) or
 *   NULL for device types without one (cpu).
 *   - Stream plugins (nccl) queue the operation on `stream` and return: later work on that
 *     stream sees the result. The work handle completes when the stream has passed the
 *     operation.
 *   - Host plugins (gloo) run the operation on their own threads: the caller must not read or
 *     write the buffers until the work has completed (work_test or work_wait succeeded).
 *   Operations of one communicator are issued from one thread at a time (the host serialises
 *   them) and every rank issues the collectives of a communicator in the same order.
 *   send and recv match in call order per pair of ranks.
 *
 * Threads: comm_abort, work_test and work_wait may be called from any thread at any time, also
 *   while another thread issues operations; every other slot of one communicator is called
 *   from one thread at a time. Every slot leaves the calling thread's current device (CUDA's
 *   cudaSetDevice, or the vendor's equivalent) as it found it.
 *
 * Fault recovery (Note [Comm fault recovery]):
 *   When a rank dies, the survivors agree through the store on who is left and build a
 *   communicator of those ranks: comm_shrink where the plugin has BP_COMM_CAP_SHRINK (NCCL >=
 *   2.27's ncclCommShrink), else a fresh comm_create among the survivors under a new key
 *   prefix (BP_COMM_CAP_REINIT; Gloo builds a new context). The host destroys the old one.
 */
#ifndef BACKPLANE_COMM_ABI_H_
#define BACKPLANE_COMM_ABI_H_

#include <backplane/abi/plugin_abi.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BP_COMM_ABI_MAJOR 1
/* Minor history: see plugins/COMM-CHANGELOG.md. */
#define BP_COMM_ABI_MINOR 2

/* Error codes of communicators, beside bp_error_code (their values never overlap). */
typedef enum bp_comm_error_code {
  BP_COMM_ERROR_TIMEOUT = 64, /* an operation or the rendezvous did not finish in time */
  BP_COMM_ERROR_REMOTE = 65,  /* a peer failed, exited or closed its connection */
  BP_COMM_ERROR_ABORTED = 66  /* the communicator was aborted (comm_abort, or the host asked) */
} bp_comm_error_code;

/* What a communicator can do beyond minor 0 (the capabilities slot, minor 2). A host reading a
 * plugin of minor < 2 assumes ABORT_ANY_THREAD | REINIT (the 1.0 contract). */
typedef enum bp_comm_capability {
  /* comm_abort may be called from any thread while another issues or waits (required of
   * every plugin since 1.0; the bit states it). */
  BP_COMM_CAP_ABORT_ANY_THREAD = 1u << 0,
  /* comm_shrink makes a communicator of the surviving ranks from an existing one. */
  BP_COMM_CAP_SHRINK = 1u << 1,
  /* comm_create may be called again after a failure, by any subset of the ranks renumbered
   * from 0, under a new key prefix (a new store epoch), while the aborted communicator still
   * exists: the host's recovery when the plugin cannot shrink. */
  BP_COMM_CAP_REINIT = 1u << 2
} bp_comm_capability;

/* Reductions. AVG is SUM divided by the world size, for floating dtypes only (integers and
 * BOOL: BP_ERROR_INVALID_ARGUMENT). On BOOL, SUM and MAX are a logical or, MIN a logical and.
 * f16 and bf16 may accumulate in a wider type; each result is rounded to the dtype. */
typedef enum bp_reduce_op {
  BP_REDUCE_SUM = 0,
  BP_REDUCE_AVG = 1,
  BP_REDUCE_MIN = 2,
  BP_REDUCE_MAX = 3,
  BP_REDUCE_COUNT = 4
} bp_reduce_op;

/* ---- Opaque handles ---------------------------------------------------------------------- */

typedef struct bp_comm bp_comm;           /* one rank's endpoint of a communicator */
typedef struct bp_comm_work bp_comm_work; /* one queued operation */

/* ---- What the host provides --------------------------------------------------------------- */

/* The host's side of comm_create: the process group's key-value store and a few services.
 * Every callback is thread-safe. A callback's bp_error* belongs to the plugin, which frees it
 * with host->error_free (not with its own error_free); to report it upwards, copy its
 * message into an error of the plugin's own. */
typedef struct bp_comm_host {
  size_t struct_size;
  void* ctx; /* passed back to every callback */

  /* Stores `size` bytes under `key` (overwriting). */
  bp_error* (*store_set)(void* ctx, const char* key, const void* value, uint64_t size);
  /* Waits up to timeout_ms for `key` to exist, then returns a copy of its value, which the
   * plugin frees with store_free. BP_COMM_ERROR_TIMEOUT when it did not appear in time;
   * BP_COMM_ERROR_ABORTED when the process group was aborted meanwhile. */
  bp_error* (*store_get)(void* ctx, const char* key, int64_t timeout_ms, void** out_value,
                         uint64_t* out_size);
  void (*store_free)(void* ctx, void* value);
  /* Adds `delta` to the 64-bit counter under `key` (created as 0) and returns the new value. */
  bp_error* (*store_add)(void* ctx, const char* key, int64_t delta, int64_t* out_value);
  void (*error_free)(void* ctx, bp_error* err);
  /* Non-zero once the host has given up on the process group (another rank failed, a
   * mismatch was found): a plugin waiting inside comm_create polls it and returns
   * BP_COMM_ERROR_ABORTED. */
  int32_t (*abort_requested)(void* ctx);
  /* Writes one line to the host's debug log (shown with BACKPLANE_DIST_DEBUG=1). */
  void (*log)(void* ctx, const char* message);
} bp_comm_host;

/* Which rank this is and where its memory lives. Filled by the host. */
typedef struct bp_comm_config {
  size_t struct_size;
  int32_t rank;               /* 0 .. world_size-1 */
  int32_t world_size;         /* >= 1 */
  const char* device_type;    /* the Backplane device type of the buffers: "cuda", "cpu" */
  int32_t device_ordinal;     /* vendor ordinal of the device (the CUDA device id); 0 on cpu */
  int32_t dlpack_device_type; /* DLPack DLDeviceType of the buffers: 1 kDLCPU, 2 kDLCUDA */
  int64_t timeout_ms;         /* bound on comm_create and on every operation (> 0) */
  /* The address of this host's interface that reached the rendezvous store ("10.0.0.2"), a
   * hint for plugins that listen on TCP; "" when the store is a file. */
  const char* local_address;
  /* ---- 1.1 (read only when struct_size covers it; a 1.0 host's config lacks it: flags 0) */
  uint32_t flags; /* BP_COMM_CONFIG_* bits */
} bp_comm_config;

/* bp_comm_config::flags (1.1). A plugin ignores bits it does not know.
 * NONBLOCKING: the host prefers a communicator whose calls never block the issuing thread
 *   (NCCL's non-blocking mode, ncclConfig_t::blocking = 0), at a cost per call. Without it a
 *   stream plugin enqueues inline on the caller's thread (Note [Comm hot path]). */
#define BP_COMM_CONFIG_NONBLOCKING (1u << 0)

/* Note [Comm hot path]
 *   A collective's latency is the host's issue cost plus the device's. Stream plugins enqueue
 *   on the caller's thread and return without polling; the host waits on a work by making the
 *   consumer's stream wait (plugin_abi.h's events) and tests the work from its watchdog, never
 *   spinning on the issuing thread. Plugins keep per-call allocations (events, strings) off
 *   this path. */

/* ---- The table ---------------------------------------------------------------------------- */

typedef struct bp_comm_api {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  const char* name;    /* plugin name, "nccl": the file is libbackplane-comm-<name>.so; static */
  const char* version; /* plugin version, "1.0.0"; static */
  /* The device types whose memory the plugin reduces, NULL-terminated ({"cuda", NULL});
   * static. Tensors of other types reach a communicator only through host staging. */
  const char* const* device_types;

  /* ---- minor 0 ---- */

  /* Frees an error returned by any slot of this table. Accepts NULL. */
  void (*error_free)(bp_error* err);
  /* Prepares the plugin. Called once, before any other slot but error_free, from one thread.
   * A missing vendor library is NOT an error: init succeeds and `available` says why. An
   * error here marks the plugin failed in the load report. */
  bp_error* (*init)(void);
  /* Releases everything; called at most once, at process exit. Optional (NULL: nothing). */
  void (*shutdown)(void);
  /* Never fails. Non-zero when communicators can be created. *out_reason (static, or valid
   * while the plugin is loaded) describes the library found ("NCCL 2.28.9 from
   * /usr/lib/libnccl.so.2") or why none can be used ("libnccl.so.2 not found: ...; set
   * BACKPLANE_NCCL_LIBRARY"). */
  int32_t (*available)(const char** out_reason);

  /* Joins the communicator of `config->world_size` ranks as `config->rank` (Note [Comm
   * rendezvous]). Collective: every rank calls it. Returns within config->timeout_ms:
   * BP_COMM_ERROR_TIMEOUT when the other ranks did not arrive, BP_COMM_ERROR_ABORTED when
   * host->abort_requested turned non-zero, BP_ERROR_UNAVAILABLE when the vendor library is
   * missing. `config` and `host` are valid during the call only. */
  bp_error* (*comm_create)(const bp_comm_config* config, const bp_comm_host* host,
                           bp_comm** out_comm);
  /* Releases the communicator. Work handles must have been freed. After comm_abort it
   * returns without waiting for the aborted operations (their resources may be released
   * later by the plugin). */
  bp_error* (*comm_destroy)(bp_comm* comm);
  /* Aborts every pending and future operation of the communicator: they complete with
   * BP_COMM_ERROR_ABORTED (and peers blocked on this rank see an error instead of waiting).
   * Thread-safe; may be called while an operation is being issued or waited on. Afterwards
   * only work_test, work_wait, work_free and comm_destroy are valid. */
  bp_error* (*comm_abort)(bp_comm* comm);

  /* Collectives (Note [Comm memory]). `send` and `recv` may be equal (in place) for
   * all_reduce and broadcast; for all_gather, send may be recv + rank * send_count (in place);
   * for reduce_scatter, recv may be send + rank * recv_count. Count 0 is valid and still a
   * collective. Each returns a work handle in *out_work, which the caller frees with
   * work_free (also after an error of the work). */
  /* recv[i] = op over ranks of send[i], i < count. */
  bp_error* (*all_reduce)(bp_comm* comm, const void* send, void* recv, uint64_t count,
                          int32_t dtype, int32_t op, void* stream, bp_comm_work** out_work);
  /* recv[i] = root's send[i]. `send` is read on the root only (non-roots may pass NULL). */
  bp_error* (*broadcast)(bp_comm* comm, const void* send, void* recv, uint64_t count, int32_t dtype,
                         int32_t root, void* stream, bp_comm_work** out_work);
  /* recv[r * send_count + i] = rank r's send[i]: recv holds world_size * send_count. */
  bp_error* (*all_gather)(bp_comm* comm, const void* send, void* recv, uint64_t send_count,
                          int32_t dtype, void* stream, bp_comm_work** out_work);
  /* recv[i] = op over ranks of send[rank * recv_count + i]: send holds world_size *
   * recv_count elements. */
  bp_error* (*reduce_scatter)(bp_comm* comm, const void* send, void* recv, uint64_t recv_count,
                              int32_t dtype, int32_t op, void* stream, bp_comm_work** out_work);
  /* Point to point: `count` elements to / from `peer` (!= own rank), matched in call order
   * per pair of ranks. Both sides must agree on count and dtype. A stream plugin may not
   * start a send before the peer's matching recv is queued: crossing transfers go in one
   * group (group_start / group_end). */
  bp_error* (*send)(bp_comm* comm, const void* buf, uint64_t count, int32_t dtype, int32_t peer,
                    void* stream, bp_comm_work** out_work);
  bp_error* (*recv)(bp_comm* comm, void* buf, uint64_t count, int32_t dtype, int32_t peer,
                    void* stream, bp_comm_work** out_work);
  /* Completes when every rank has called it. Optional (NULL: the host all_reduces one i32
   * element on the communicator's device and waits for it). */
  bp_error* (*barrier)(bp_comm* comm, void* stream, bp_comm_work** out_work);

  /* Grouping (optional as a pair: both NULL or both set). Operations issued between
   * group_start and group_end form one group that the plugin starts together, the way
   * ncclGroupStart/End do: a rank that sends to and receives from the same peer, whose peer
   * does the same, must group them or a stream plugin deadlocks. Work handles of grouped
   * operations are valid after group_end. Default when NULL: the host issues the operations
   * one by one (a host plugin posts send and recv at once, so they cannot deadlock). */
  bp_error* (*group_start)(bp_comm* comm);
  bp_error* (*group_end)(bp_comm* comm);

  /* Work handles. work_test sets *out_done to 1 when the operation has completed and 0 while
   * it runs; it returns the operation's error once it has failed. work_wait blocks the calling
   * thread up to timeout_ms (0: just test) and returns BP_COMM_ERROR_TIMEOUT when the
   * operation is still running (the work stays valid: wait again, or abort). Both may be
   * called any number of times, also after completion. work_free releases the handle: the
   * operation itself is not cancelled (its buffers must stay valid until it completes). */
  bp_error* (*work_test)(bp_comm_work* work, int32_t* out_done);
  bp_error* (*work_wait)(bp_comm_work* work, int64_t timeout_ms);
  void (*work_free)(bp_comm_work* work);

  /* ---- minor 2 (Note [Comm fault recovery]) ---- */

  /* Never fails. The bp_comm_capability bits this plugin has with the library it loaded;
   * *out_reason (static, or valid while the plugin is loaded) says why a bit is missing
   * ("ncclCommShrink needs NCCL >= 2.27; NCCL 2.21.5 is loaded"), "" when none is. NULL:
   * ABORT_ANY_THREAD | REINIT. */
  uint64_t (*capabilities)(const char** out_reason);
  /* Makes, from `comm`, the communicator of its ranks not listed in `excluded` (`excluded_count`
   * distinct ranks of comm, not this one); the others keep their order, renumbered from 0.
   * Collective over the remaining ranks only (the excluded ones may be dead). `config` gives
   * the new rank and world size (checked against comm's) and the timeout; `abort_pending`
   * non-zero aborts comm's pending operations first (a peer failed; NCCL_SHRINK_ABORT). `comm`
   * stays valid (the host destroys it afterwards). BP_ERROR_UNSUPPORTED, with the reason,
   * when the plugin or its library cannot shrink (capabilities lacks BP_COMM_CAP_SHRINK);
   * NULL slot: the same. */
  bp_error* (*comm_shrink)(bp_comm* comm, const int32_t* excluded, int32_t excluded_count,
                           const bp_comm_config* config, int32_t abort_pending, bp_comm** out_comm);
} bp_comm_api;

/* The slots every communicator plugin sets (non-NULL), once: X(slot) for each; group_start and
 * group_end are both set or both NULL. */
/* One slot a line, kept as written: clang-format reflows this list differently each run. */
/* clang-format off */
#define BP_COMM_REQUIRED_SLOTS(X) \
  X(error_free) \
  X(init) \
  X(available) \
  X(comm_create) \
  X(comm_destroy) \
  X(comm_abort) \
  X(all_reduce) \
  X(broadcast) \
  X(all_gather) \
  X(reduce_scatter) \
  X(send) \
  X(recv) \
  X(work_test) \
  X(work_wait) \
  X(work_free)
/* clang-format on */

/* The one exported symbol of a communicator plugin. */
typedef const bp_comm_api* (*bp_comm_get_api_fn)(uint32_t host_abi_major, uint32_t host_abi_minor);
#define BP_COMM_ENTRY_SYMBOL "bp_comm_get_api"

/* Canonical lower-case name of a reduction ("sum"), or "?" for an unknown value. */
static inline const char* bp_reduce_op_name(int32_t op) {
  static const char* const names[BP_REDUCE_COUNT] = {"sum", "avg", "min", "max"};
  return (op >= 0 && op < BP_REDUCE_COUNT) ? names[op] : "?";
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BACKPLANE_COMM_ABI_H_ */
