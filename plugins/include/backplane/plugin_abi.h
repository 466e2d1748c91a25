/*
 * Backplane plugin ABI — the whole contract between libbackplane (the host) and a backend
 * plugin (libbackplane-<name>.so). Plain C99: no STL, no exceptions cross this boundary.
 *
 * Versioning (Note [ABI versioning]):
 *   - A plugin exports exactly one symbol, bp_plugin_get_api(host_major, host_minor), which
 *     returns a pointer to its const bp_plugin_api table (valid while the plugin is loaded),
 *     or NULL when it cannot produce one. The table records the ABI major.minor the plugin
 *     was built against; the host, not the plugin, decides whether they are compatible.
 *   - The host refuses a table whose major differs from its own (a typed load error naming both
 *     versions). Minors are backward compatible: slots are only ever appended to the table and
 *     fields only appended to structs. The host never calls a slot that lies past the
 *     struct_size the plugin reported, nor a slot added in a minor newer than the plugin's.
 *   - Every struct that crosses the boundary starts with `size_t struct_size`, set by whoever
 *     fills the struct's memory to sizeof(the struct as it knows it). A reader never touches a
 *     field past struct_size. plugins/CHANGELOG.md records what each minor appended.
 *
 * Errors (Note [Error objects]):
 *   Every fallible call returns NULL on success or a bp_error* allocated by the plugin. The
 *   caller owns it and frees it with the same plugin's error_free slot. Messages name the
 *   device, the op and the sizes; native_name carries the vendor's code name (for example
 *   "cudaErrorMemoryAllocation") or "" when there is none. A plugin never aborts the process.
 *
 * Threads: unless a slot says otherwise, calls on different streams may come from different
 *   threads at once; calls on one stream are serialised by the host.
 *
 * Handles: devices are indices 0..device_count-1. Streams, events and kernels are opaque
 *   pointers created and destroyed by the plugin. Device memory is an opaque buffer handle
 *   (bp_buffer*) plus a byte offset, so backends whose memory is not addressable by raw
 *   pointers (OpenCL's cl_mem) fit the same table.
 */
#ifndef BACKPLANE_PLUGIN_ABI_H_
#define BACKPLANE_PLUGIN_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BP_ABI_MAJOR 1
/* Minor history: see plugins/CHANGELOG.md. */
#define BP_ABI_MINOR 2

#define BP_MAX_RANK 8

#if defined(_WIN32)
#define BP_PLUGIN_EXPORT __declspec(dllexport)
#else
#define BP_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* ---- Scalars ------------------------------------------------------------------------------ */

/* Element types. Values are stable across minors; new types are only appended. */
typedef enum bp_dtype {
  BP_DTYPE_F32 = 0,
  BP_DTYPE_F64 = 1,
  BP_DTYPE_F16 = 2,
  BP_DTYPE_BF16 = 3,
  BP_DTYPE_I32 = 4,
  BP_DTYPE_I64 = 5,
  BP_DTYPE_U8 = 6,
  BP_DTYPE_BOOL = 7, /* one byte, 0 or 1 */
  BP_DTYPE_COUNT = 8
} bp_dtype;

/* Error codes. BP_ERROR_UNSUPPORTED means "this plugin does not implement that": the host
 * turns it into an error naming the devices that do. */
typedef enum bp_error_code {
  BP_ERROR_INTERNAL = 1,
  BP_ERROR_INVALID_ARGUMENT = 2,
  BP_ERROR_OUT_OF_MEMORY = 3,
  BP_ERROR_UNSUPPORTED = 4,
  BP_ERROR_UNAVAILABLE = 5, /* driver or device missing */
  BP_ERROR_DEVICE = 6       /* the device or its driver reported a failure */
} bp_error_code;

/* An error object. Allocated by the plugin; the caller frees it with api->error_free. All
 * strings are owned by the object and live as long as it does. */
typedef struct bp_error {
  size_t struct_size;
  int32_t code;            /* bp_error_code */
  const char* message;     /* human readable: device, op, sizes */
  const char* plugin;      /* plugin name, e.g. "cuda" */
  const char* native_name; /* vendor error name, e.g. "cudaErrorMemoryAllocation", or "" */
} bp_error;

/* ---- Opaque handles ---------------------------------------------------------------------- */

typedef struct bp_stream bp_stream; /* an ordered queue of work on one device */
typedef struct bp_event bp_event;   /* a marker recorded on a stream */
typedef struct bp_kernel bp_kernel; /* a resolved (op, dtype) implementation on one device */
typedef struct bp_buffer bp_buffer; /* a device allocation; address it with a byte offset */

/* ---- Structs crossing the boundary ------------------------------------------------------ */

/* Static facts about one device. The host zero-fills the struct, sets struct_size and passes
 * it to device_properties, which fills fields up to min(struct_size, its own size). Strings
 * are copied into the fixed arrays, NUL-terminated. */
typedef struct bp_device_properties {
  size_t struct_size;
  char name[256];      /* "NVIDIA H100 80GB HBM3", "AMD EPYC 9654 (16 threads)" */
  char vendor[64];     /* "NVIDIA", "GenuineIntel", ... */
  char uuid[64];       /* "GPU-xxxxxxxx-..." or "" */
  char pci_bus_id[32]; /* "0000:17:00.0" or "" */
  uint64_t total_memory;
  uint64_t free_memory;
  int32_t compute_major; /* compute capability, or 0 */
  int32_t compute_minor;
  int32_t cores;          /* multiprocessors / compute units / CPU threads */
  int32_t supports_f64;   /* non-zero when f64 kernels exist on this device */
  int32_t unified_memory; /* non-zero when device buffers are host memory (CPU) */
} bp_device_properties;

/* Memory statistics of one device's allocator, in bytes unless named otherwise. */
typedef struct bp_memory_stats {
  size_t struct_size;
  uint64_t allocated;      /* live bytes handed out */
  uint64_t reserved;       /* bytes held from the system, including caches */
  uint64_t peak_allocated; /* high-water mark of `allocated` since the last reset */
  uint64_t num_allocs;     /* live allocations */
} bp_memory_stats;

/* A strided view of device memory. shape/strides up to rank; strides are in elements and may
 * be 0 (broadcast) or negative never (the host materialises reversed views). rank 0 is a
 * scalar with one element. `buffer` may be NULL only when the tensor has zero elements. */
typedef struct bp_tensor_desc {
  size_t struct_size;
  bp_buffer* buffer;
  uint64_t offset; /* in bytes from the start of buffer */
  int32_t dtype;   /* bp_dtype */
  int32_t rank;
  int64_t shape[BP_MAX_RANK];
  int64_t strides[BP_MAX_RANK];
} bp_tensor_desc;

typedef enum bp_attr_kind { BP_ATTR_INT = 0, BP_ATTR_FLOAT = 1 } bp_attr_kind;

/* A named scalar attribute of a launch. `name` is a static string owned by the host. */
typedef struct bp_attr {
  size_t struct_size;
  const char* name;
  int32_t kind; /* bp_attr_kind */
  int64_t i;
  double f;
} bp_attr;

/* Support status of one (op, dtype) pair, as declared by the plugin (minor 1). */
typedef enum bp_support {
  BP_SUPPORT_YES = 0,
  BP_SUPPORT_NO = 1,           /* unsupported: reported as such by conformance, never a pass */
  BP_SUPPORT_EXPECTED_FAIL = 2 /* implemented but known wrong; conformance flags a pass */
} bp_support;

typedef struct bp_op_support {
  size_t struct_size;
  const char* op;     /* static string */
  int32_t dtype;      /* bp_dtype */
  int32_t support;    /* bp_support */
  const char* reason; /* static string; "" for BP_SUPPORT_YES */
} bp_op_support;

/* ---- Native handles (minor 2, Note [Native handles]) ------------------------------------ */

/* DLPack device types (DLDeviceType of dlpack.h) used in bp_native_buffer. Values are
 * DLPack's, not ours: a plugin may report any other DLDeviceType value it serves. */
typedef enum bp_dlpack_device_type {
  BP_DLPACK_CPU = 1,           /* kDLCPU: ordinary host memory */
  BP_DLPACK_CUDA = 2,          /* kDLCUDA: CUDA device memory */
  BP_DLPACK_CUDA_HOST = 3,     /* kDLCUDAHost: pinned host memory */
  BP_DLPACK_OPENCL = 4,        /* kDLOpenCL */
  BP_DLPACK_ROCM = 10,         /* kDLROCM */
  BP_DLPACK_CUDA_MANAGED = 13, /* kDLCUDAManaged: CUDA managed (unified) memory */
  BP_DLPACK_ONEAPI = 14        /* kDLOneAPI */
} bp_dlpack_device_type;

/* Where one byte of a buffer lives, in the vendor's own terms (buffer_native). The host
 * zero-fills the struct and sets struct_size; the plugin fills fields up to
 * min(struct_size, its own size). */
typedef struct bp_native_buffer {
  size_t struct_size;
  void* address;              /* address of byte `offset` of the buffer */
  int32_t device_ordinal;     /* vendor ordinal (CUDA device id); 0 for host memory */
  int32_t dlpack_device_type; /* bp_dlpack_device_type: 1 kDLCPU, 2 kDLCUDA, ... */
} bp_native_buffer;

/* Note [Imported memory]
 *   buffer_import lends memory to the plugin: the bp_buffer it returns aliases the owner's
 *   bytes (writes through either side are seen by the other, in stream order), and the owner
 *   keeps the memory valid until the plugin calls release. The lifetime runs
 *     buffer_import -> work on streams -> mem_free(device, stream, buf, size) -> (the plugin
 *     waits until the work queued on `stream` before the free is done) -> release(ctx)
 *   Work on other streams that uses the buffer must be ordered before the free by the host
 *   (an event waited on by `stream`), exactly as for the plugin's own allocations. The size
 *   given to mem_free is the size given to buffer_import.
 *
 * Called by a plugin exactly once to hand imported memory back to its owner (buffer_import).
 * `release_ctx` is the pointer given to buffer_import. */
typedef void (*bp_release_fn)(void* release_ctx);

/* ---- The op catalogue (Note [Op catalogue]) ----------------------------------------------
 * Ops are named by strings and resolved once per (device, op, dtype) with find_kernel; the
 * dtype is that of the first input (of the output for ops without inputs). Shapes given to
 * launch are already broadcast by the host: every input has the output's rank and shape, with
 * stride 0 on broadcast dimensions, unless the op says otherwise.
 *
 *   fill        out;            attr "value" (FLOAT, or INT for i64 exactness)
 *   copy        in -> out       same dtype, any strides (materialises views)
 *   cast        in -> out       out.dtype is the target; resolved by the input dtype
 *   add sub mul div pow maximum minimum
 *               a, b -> out     or a -> out with attr "scalar" (FLOAT) standing for b;
 *                               attr "reverse" (INT 1) computes scalar OP a
 *   eq ne lt le gt ge
 *               a, b -> out     out.dtype is BOOL; the scalar form as for add
 *   where       cond(BOOL), a, b -> out; resolved by a's dtype
 *   neg exp log sqrt relu sigmoid tanh abs
 *               a -> out
 *   sum mean max
 *               a -> out        out has a's rank; every dimension where out.shape is 1 and
 *                               a.shape is not is reduced. mean of zero elements is NaN; max
 *                               of zero elements is an error.
 *   matmul      a[B,M,K], b[B,K,N] -> out[B,M,N], rank 3. Each of a and b has unit stride in
 *               its last or its second-to-last dimension (row- or column-major matrices);
 *               batch strides may be 0. attr "allow_tf32" (INT 0/1).
 *   uniform     -> out           attrs "seed", "offset" (INT), "low", "high" (FLOAT)
 *   normal      -> out           attrs "seed", "offset" (INT), "mean", "std" (FLOAT)
 *               Random numbers follow Note [Philox stream] in backplane/philox.h exactly, so
 *               one seed gives the same values on every device.
 * Outputs are dense (row-major contiguous) for every op but copy, whose output may be any
 * non-overlapping strided view (writing into a slice). Outputs never alias inputs unless the
 * host says so with attr "inplace" (INT 1), where out and input 0 describe the same memory.
 */

/* ---- The table ---------------------------------------------------------------------------- */

typedef struct bp_plugin_api {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  const char* name;        /* plugin name, "cuda"; static */
  const char* device_type; /* device-string prefix, "cuda"; lower-case [a-z0-9_]+; static */
  const char* version;     /* plugin version, "1.0.0"; static */

  /* ---- minor 0 ---- */

  /* Free an error returned by any slot of this table. Accepts NULL. */
  void (*error_free)(bp_error* err);

  /* Prepare the plugin (load drivers, enumerate devices). Called once, before any other slot
   * but error_free, from one thread. An error here marks the plugin failed in the load
   * report; the plugin is then never called again. A missing driver is NOT an error: init
   * succeeds and device_count reports 0 with the reason. */
  bp_error* (*init)(void);

  /* Release everything. Called once at process exit at most; optional (NULL: nothing). */
  void (*shutdown)(void);

  /* Number of devices. Never fails: returns 0 and sets *out_reason (static or valid while the
   * plugin is loaded) when the driver or the hardware is missing. *out_reason is "" when the
   * count is positive. */
  int32_t (*device_count)(const char** out_reason);

  /* Fill properties of device `device`. free_memory is read at call time. */
  bp_error* (*device_properties)(int32_t device, bp_device_properties* out_props);

  /* Streams. stream_create makes a new in-order stream on a device; the caller destroys it
   * with stream_destroy after all work on it is finished or synchronised. */
  bp_error* (*stream_create)(int32_t device, bp_stream** out_stream);
  bp_error* (*stream_destroy)(bp_stream* stream);
  /* Block the calling thread until every piece of work queued on the stream has finished. */
  bp_error* (*stream_synchronize)(bp_stream* stream);

  /* Events (optional as a group: all five NULL or all set). Default when NULL: the host
   * synchronises the producing stream wherever it would have recorded and waited on an
   * event, and timing falls back to host clocks around synchronised regions. */
  bp_error* (*event_create)(int32_t device, bp_event** out_event);
  bp_error* (*event_destroy)(bp_event* event);
  bp_error* (*event_record)(bp_event* event, bp_stream* stream);
  /* Make future work on `stream` wait until `event` has completed; does not block the host. */
  bp_error* (*stream_wait_event)(bp_stream* stream, bp_event* event);
  bp_error* (*event_synchronize)(bp_event* event);
  /* Milliseconds between two recorded, completed events (optional; NULL: host clocks). */
  bp_error* (*event_elapsed_ms)(bp_event* start, bp_event* end, double* out_ms);

  /* Memory. mem_alloc is stream-ordered: the buffer may be used by work queued on `stream`
   * after this call. size 0 returns a valid (possibly NULL) handle. A request the device
   * cannot satisfy returns BP_ERROR_OUT_OF_MEMORY naming the request and the free memory;
   * the plugin first retries once after releasing its caches. */
  bp_error* (*mem_alloc)(int32_t device, bp_stream* stream, uint64_t size, bp_buffer** out_buf);
  /* Free after all work already queued on `stream` is done with the buffer. `size` is the
   * size it was allocated with (sized deallocation, for statistics). Accepts NULL. */
  bp_error* (*mem_free)(int32_t device, bp_stream* stream, bp_buffer* buf, uint64_t size);
  /* Host address of a buffer when device memory is host memory (unified_memory), else NULL.
   * Optional; NULL slot: the host always copies. */
  void* (*mem_host_pointer)(bp_buffer* buf);
  bp_error* (*memory_stats)(int32_t device, bp_memory_stats* out_stats);
  /* Reset peak_allocated to the current allocated. */
  bp_error* (*memory_reset_peak)(int32_t device);
  /* Return cached free memory to the system (optional; NULL: nothing to release). */
  bp_error* (*memory_empty_cache)(int32_t device);

  /* Page-locked host memory for staging (optional; NULL: the host uses ordinary 64-byte
   * aligned memory). Caller frees with host_free. */
  bp_error* (*host_alloc)(int32_t device, uint64_t size, void** out_ptr);
  bp_error* (*host_free)(int32_t device, void* ptr);

  /* Byte fill of [offset, offset+size) with `value`, ordered on stream. */
  bp_error* (*memset)(bp_stream* stream, bp_buffer* buf, uint64_t offset, int32_t value,
                      uint64_t size);
  /* Copies, ordered on `stream`. Host memory must stay valid and unchanged until the stream
   * has passed the copy (the host synchronises, or uses pinned memory and events). */
  bp_error* (*copy_h2d)(bp_stream* stream, bp_buffer* dst, uint64_t dst_offset, const void* src,
                        uint64_t size);
  bp_error* (*copy_d2h)(bp_stream* stream, void* dst, bp_buffer* src, uint64_t src_offset,
                        uint64_t size);
  bp_error* (*copy_d2d)(bp_stream* stream, bp_buffer* dst, uint64_t dst_offset, bp_buffer* src,
                        uint64_t src_offset, uint64_t size);
  /* Copy between two devices of this plugin, ordered on dst_stream (optional; NULL: the host
   * stages through pinned host memory). */
  bp_error* (*copy_peer)(bp_stream* dst_stream, int32_t dst_device, bp_buffer* dst,
                         uint64_t dst_offset, int32_t src_device, bp_buffer* src,
                         uint64_t src_offset, uint64_t size);

  /* Kernels. find_kernel resolves an op of the catalogue for one dtype on one device; it
   * returns BP_ERROR_UNSUPPORTED when the plugin lacks it. The handle lives as long as the
   * plugin. launch queues the kernel on `stream` and returns without waiting. */
  bp_error* (*find_kernel)(int32_t device, const char* op, int32_t dtype, bp_kernel** out_kernel);
  bp_error* (*launch)(bp_kernel* kernel, bp_stream* stream, const bp_tensor_desc* inputs,
                      int32_t num_inputs, const bp_tensor_desc* outputs, int32_t num_outputs,
                      const bp_attr* attrs, int32_t num_attrs);

  /* ---- minor 1 ---- */

  /* The (op, dtype) pairs this plugin declares for `device`, with unsupported and expected
   * failures and their reasons. *out_list is static or valid while the plugin is loaded.
   * Optional; NULL (or a minor-0 plugin): the host probes find_kernel over the catalogue. */
  bp_error* (*list_ops)(int32_t device, const bp_op_support** out_list, int32_t* out_count);

  /* ---- minor 2 ----
   * Note [Native handles]: what a plugin holds, handed to interoperability layers (DLPack,
   * communicators, graphs), and foreign memory and queues wrapped without copying. Every slot
   * of this group is optional. When one is NULL, or the plugin's abi_minor is below 2, or its
   * struct_size does not cover the slot, the host throws bp::UnsupportedError naming the
   * device, the plugin and the missing slot; nothing is emulated. */

  /* The native address of byte `offset` of `buf` (offset <= the buffer's size; the host checks
   * the bound), its device's vendor ordinal and its DLPack device type, into *out_native
   * (struct_size set by the caller, see bp_native_buffer). `buf` is never NULL: the host
   * answers for a NULL 0-byte allocation itself. cpu: host address, ordinal 0,
   * BP_DLPACK_CPU. cuda: device pointer, the CUDA device id, BP_DLPACK_CUDA (or
   * BP_DLPACK_CUDA_MANAGED for imported managed memory). A backend whose memory is not
   * pointer-addressable (OpenCL's cl_mem) returns BP_ERROR_UNSUPPORTED saying so. The address
   * stays valid while the buffer lives; it is the same for every call. Thread-safe; never
   * blocks; queues no work. */
  bp_error* (*buffer_native)(bp_buffer* buf, uint64_t offset, bp_native_buffer* out_native);

  /* The native queue behind `stream`: cudaStream_t on cuda, cl_command_queue on opencl; the
   * plugin keeps ownership (valid until stream_destroy; the caller must not destroy or
   * release it). *out_native is NULL with no error on a backend whose streams are eager and
   * have no native object (cpu). The same value on every call for one stream. A NULL stream is
   * BP_ERROR_INVALID_ARGUMENT. Thread-safe; never blocks. */
  bp_error* (*stream_native)(bp_stream* stream, void** out_native);

  /* Wraps `size` bytes at `address`, memory owned by someone else, as a buffer of `device`,
   * without copying (Note [Imported memory]). `address` is what buffer_native would report
   * for such memory: a host address on cpu, a device pointer of that CUDA device (or managed
   * memory) on cuda. It may be NULL only when size is 0. The buffer is used like any other
   * (launch, copies, memset, buffer_native at the same address); the caller frees it with
   * mem_free(device, stream, buf, size) (a NULL stream: after the whole device's work); its
   * bytes are not counted in memory_stats (allocated, reserved, peak, num_allocs), which
   * describe the plugin's own allocator. `release` may be NULL (nothing to call).
   * On success the plugin owns the duty to call release(release_ctx) exactly once, from a
   * host thread (never from a driver callback or a device-side thread), after mem_free of the
   * buffer AND after every piece of work queued on mem_free's stream before the free has
   * finished with the memory: for example it synchronises that stream, or records an event and
   * releases once the event has completed (at the latest when that stream or the device is
   * next synchronised through this table). No plugin lock is held while release runs, so
   * release may call back into the plugin. On error release is never called and the caller
   * keeps ownership. Errors: BP_ERROR_INVALID_ARGUMENT for a NULL address with a non-zero size,
   * an address that is not memory of `device` (named in the message), a bad device index;
   * BP_ERROR_UNSUPPORTED when the backend cannot wrap foreign memory (OpenCL). Thread-safe. */
  bp_error* (*buffer_import)(int32_t device, void* address, uint64_t size, bp_release_fn release,
                             void* release_ctx, bp_buffer** out_buf);

  /* Wraps a native queue of `device` (cudaStream_t, including the legacy default stream 0,
   * on cuda; cl_command_queue of the device's context, in order, on opencl; only NULL, the
   * eager stream, on cpu) as a bp_stream that does not own it: work queued on the bp_stream
   * goes onto that native queue, and stream_destroy of it releases only the plugin's wrapper,
   * never the native queue, which its owner must keep alive until then. The caller destroys
   * the wrapper with stream_destroy (after its work is finished or synchronised). Errors:
   * BP_ERROR_INVALID_ARGUMENT for a queue of another device or context (named in the message),
   * BP_ERROR_UNSUPPORTED when the backend has no native queues to wrap. Thread-safe. */
  bp_error* (*stream_import)(int32_t device, void* native_stream, bp_stream** out_stream);
} bp_plugin_api;

/* Byte offset of the first slot of minor 1: a table whose struct_size is at most this has
 * only minor-0 slots, whatever abi_minor it claims. */
#define BP_API_MINOR1_OFFSET offsetof(bp_plugin_api, list_ops)

/* Byte offset of the first slot of minor 2: a table whose struct_size is at most this is a
 * minor-1 (or older) table. */
#define BP_API_MINOR2_OFFSET offsetof(bp_plugin_api, buffer_native)

/* True when the host may read `slot` of `api`, a slot added in minor `minor`: the plugin
 * declares that minor and its struct_size covers the whole slot (Note [ABI versioning]).
 * The slot may still be NULL. */
#define BP_API_HAS_SLOT(api, minor, slot) \
  ((api)->abi_minor >= (minor) &&         \
   (api)->struct_size >= offsetof(bp_plugin_api, slot) + sizeof((api)->slot))

/* The one exported symbol of a plugin. */
typedef const bp_plugin_api* (*bp_plugin_get_api_fn)(uint32_t host_abi_major,
                                                     uint32_t host_abi_minor);
#define BP_PLUGIN_ENTRY_SYMBOL "bp_plugin_get_api"

/* Size in bytes of one element of a dtype; 0 for an unknown value. */
static inline size_t bp_dtype_size(int32_t dtype) {
  switch (dtype) {
    case BP_DTYPE_F64:
    case BP_DTYPE_I64:
      return 8;
    case BP_DTYPE_F32:
    case BP_DTYPE_I32:
      return 4;
    case BP_DTYPE_F16:
    case BP_DTYPE_BF16:
      return 2;
    case BP_DTYPE_U8:
    case BP_DTYPE_BOOL:
      return 1;
    default:
      return 0;
  }
}

/* Canonical lower-case name of a dtype ("f32"), or "?" for an unknown value. */
static inline const char* bp_dtype_name(int32_t dtype) {
  static const char* const names[BP_DTYPE_COUNT] = {"f32", "f64", "f16", "bf16",
                                                    "i32", "i64", "u8",  "bool"};
  return (dtype >= 0 && dtype < BP_DTYPE_COUNT) ? names[dtype] : "?";
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BACKPLANE_PLUGIN_ABI_H_ */
