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
 * Threads (Note [Stream threading]):
 *   Every slot but init and shutdown may be called from several threads at once, calls that
 *   name one stream included. The plugin orders the work of the calls on one stream in call
 *   order, as CUDA streams and OpenCL in-order queues do: work queued by a call that returned
 *   before another call began runs before that call's work; calls that overlap in time are
 *   ordered in some order, each as a whole. The host never serialises calls on a stream, so a
 *   plugin guards its own per-stream state (a workspace created on first use, a cache of freed
 *   blocks) as it guards per-device state. Exceptions: stream_destroy is not called while
 *   another call uses that stream, and event_destroy not while another call uses that event.
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
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BP_ABI_MAJOR 1
/* Minor history: see plugins/CHANGELOG.md. */
#define BP_ABI_MINOR 8

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
typedef struct bp_graph bp_graph;   /* work captured from a stream, replayable (minor 3) */

/* ---- Structs crossing the boundary ------------------------------------------------------ */

/* What a device is (bp_device_properties.kind). */
typedef enum bp_device_kind {
  BP_DEVICE_KIND_UNKNOWN = 0, /* not said (a plugin built before 1.2 leaves the zero) */
  BP_DEVICE_KIND_CPU = 1,     /* the host's processors, also behind OpenCL */
  BP_DEVICE_KIND_GPU = 2,
  BP_DEVICE_KIND_ACCELERATOR = 3 /* neither: NPU, FPGA, DSP, ... */
} bp_device_kind;

/* Static facts about one device. The host zero-fills the struct, sets struct_size and passes
 * it to device_properties, which fills fields up to min(struct_size, its own size). Strings
 * are copied into the fixed arrays, NUL-terminated. A field appended after the plugin was
 * built stays zero, so every appended field gives 0 the meaning "not said". */
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
  /* ---- appended in 1.2 ---- */
  int32_t kind; /* bp_device_kind: what chooses "the first GPU" without naming a backend. The
                 * host treats BP_DEVICE_KIND_UNKNOWN as CPU when unified_memory is set, else as
                 * ACCELERATOR. */
} bp_device_properties;

/* Memory statistics of one device's allocator, in bytes unless named otherwise.
 *
 * Who counts what (since 1.2; a documentation rule, no layout change): a host sees every size it
 * passes to mem_alloc and mem_free, so it can count live bytes, their peak and live allocations
 * itself, and libbackplane does (its MemoryStats; Note [Memory accounting] in
 * memory_counters.hpp): from this struct it reads only `reserved`, what the plugin alone knows.
 * A plugin still fills every field, for hosts that do not count and for bp-conformance, which
 * checks them: `allocated`, `peak_allocated` and `num_allocs` over the buffers of mem_alloc that
 * have not been freed (requested sizes; imported buffers and the plugin's own scratch memory
 * excluded), as plugins of 1.0 and 1.1 already do. bp::sdk::MemoryCounters
 * (memory_counters.hpp) keeps them without a lock. */
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

/* Attribute ids (minor 2; Note [Attribute ids]). Values are stable; new ones are appended. The
 * name of each is its lower-case suffix ("value", "allow_tf32"); Note [Op catalogue] says which
 * op takes which. */
typedef enum bp_attr_id {
  BP_ATTR_ID_NONE = 0, /* not set: the reader maps the name (hosts before minor 2) */
  BP_ATTR_ID_VALUE = 1,
  BP_ATTR_ID_SCALAR = 2,
  BP_ATTR_ID_REVERSE = 3,
  BP_ATTR_ID_INPLACE = 4,
  BP_ATTR_ID_ALLOW_TF32 = 5,
  BP_ATTR_ID_SEED = 6,
  BP_ATTR_ID_OFFSET = 7,
  BP_ATTR_ID_LOW = 8,
  BP_ATTR_ID_HIGH = 9,
  BP_ATTR_ID_MEAN = 10,
  BP_ATTR_ID_STD = 11,
  BP_ATTR_ID_ALPHA = 12,
  BP_ATTR_ID_ACTIVATION = 13,
  /* ---- minor 4: the convolutional family ---- */
  BP_ATTR_ID_AXIS = 14,
  BP_ATTR_ID_STRIDE_H = 15,
  BP_ATTR_ID_STRIDE_W = 16,
  BP_ATTR_ID_PAD_H = 17,
  BP_ATTR_ID_PAD_W = 18,
  BP_ATTR_ID_DILATION_H = 19,
  BP_ATTR_ID_DILATION_W = 20,
  BP_ATTR_ID_GROUPS = 21,
  BP_ATTR_ID_KERNEL_H = 22,
  BP_ATTR_ID_KERNEL_W = 23,
  BP_ATTR_ID_CEIL_MODE = 24,
  BP_ATTR_ID_COUNT_INCLUDE_PAD = 25,
  BP_ATTR_ID_TRAINING = 26,
  BP_ATTR_ID_MOMENTUM = 27,
  BP_ATTR_ID_EPS = 28,
  BP_ATTR_ID_P = 29,
  /* ---- minor 5: the transformer family ---- */
  BP_ATTR_ID_APPROXIMATE = 30,
  BP_ATTR_ID_SCALE = 31,
  BP_ATTR_ID_CAUSAL = 32,
  BP_ATTR_ID_DIAGONAL = 33,
  /* ---- minor 7: the fused optimiser update ---- */
  BP_ATTR_ID_LR = 34,
  BP_ATTR_ID_BETA1 = 35,
  BP_ATTR_ID_BETA2 = 36,
  BP_ATTR_ID_WEIGHT_DECAY = 37,
  BP_ATTR_ID_STEP = 38,
  BP_ATTR_ID_DECOUPLED = 39,
  /* ---- minor 8: the fused classification loss ---- */
  BP_ATTR_ID_IGNORE_INDEX = 40,
  BP_ATTR_ID_LABEL_SMOOTHING = 41,
  BP_ATTR_ID_COUNT = 42
} bp_attr_id;

/* Values of attribute ACTIVATION (op linear). */
typedef enum bp_activation { BP_ACTIVATION_NONE = 0, BP_ACTIVATION_RELU = 1 } bp_activation;

/* Values of attribute APPROXIMATE (ops gelu, gelu_backward; minor 5). */
typedef enum bp_gelu_approximate {
  BP_GELU_EXACT = 0, /* x Phi(x) = x (1 + erf(x / sqrt 2)) / 2 */
  BP_GELU_TANH = 1   /* x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) / 2 */
} bp_gelu_approximate;

/* A scalar attribute of a launch, named twice: by `name` (a static string owned by the host)
 * and, from minor 2, by `id`. */
typedef struct bp_attr {
  size_t struct_size;
  const char* name;
  int32_t kind; /* bp_attr_kind */
  int64_t i;
  double f;
  /* ---- minor 2 ---- */
  int32_t id; /* bp_attr_id; BP_ATTR_ID_NONE when the writer knows only the name */
} bp_attr;

/* bp_attr as minors 0 and 1 lay it out. A host passes arrays of this layout to plugins of
 * minor 0 or 1, which were compiled to step through them by its size (Note [Attribute ids]). */
typedef struct bp_attr_minor1 {
  size_t struct_size; /* sizeof(bp_attr_minor1) */
  const char* name;
  int32_t kind;
  int64_t i;
  double f;
} bp_attr_minor1;

/* Note [Attribute ids]
 *   Since minor 2 every attribute carries a fixed id besides its name, so that neither the host
 *   nor the plugin compares strings per launch.
 *   - A host of minor >= 2 sets both name and id. To a plugin of minor >= 2 it passes bp_attr
 *     arrays (struct_size = sizeof(bp_attr)); to a plugin of minor 0 or 1 it passes
 *     bp_attr_minor1 arrays (struct_size = sizeof(bp_attr_minor1)), the layout that plugin was
 *     compiled against.
 *   - A reader steps through an array by the struct_size of its first element (every element
 *     has the writer's size), reads `id` only when struct_size covers it and it is not
 *     BP_ATTR_ID_NONE, and maps the name with bp_attr_id_from_name otherwise: a plugin of minor
 *     2 loaded by a host of minor 1 still works. Attributes a reader does not know (a newer
 *     host's) are ignored, as they always were by name. */

/* Name of attribute id `id` ("value"), or "?" out of range. */
static inline const char* bp_attr_name(int32_t id) {
  /* clang-format off */
  static const char* const names[BP_ATTR_ID_COUNT] = {
      "?", "value", "scalar", "reverse",
      "inplace", "allow_tf32", "seed", "offset",
      "low", "high", "mean", "std",
      "alpha", "activation", "axis", "stride_h",
      "stride_w", "pad_h", "pad_w", "dilation_h",
      "dilation_w", "groups", "kernel_h", "kernel_w",
      "ceil_mode", "count_include_pad", "training", "momentum",
      "eps", "p", "approximate", "scale",
      "causal", "diagonal", "lr", "beta1",
      "beta2", "weight_decay", "step", "decoupled",
      "ignore_index", "label_smoothing"};
  /* clang-format on */
  return (id > 0 && id < BP_ATTR_ID_COUNT) ? names[id] : "?";
}

/* Id of the attribute named `name`, or BP_ATTR_ID_NONE when unknown (or NULL). Compares
 * strings: what a reader does for a writer of minor < 2 only. */
static inline int32_t bp_attr_id_from_name(const char* name) {
  int32_t id;
  if (!name) return BP_ATTR_ID_NONE;
  for (id = 1; id < BP_ATTR_ID_COUNT; ++id)
    if (strcmp(name, bp_attr_name(id)) == 0) return id;
  return BP_ATTR_ID_NONE;
}

/* The id of an attribute of an array whose elements are `struct_size` bytes (Note [Attribute
 * ids]). */
static inline int32_t bp_attr_get_id(const bp_attr* a, size_t struct_size) {
  if (struct_size >= offsetof(bp_attr, id) + sizeof(int32_t) && a->id != BP_ATTR_ID_NONE)
    return a->id;
  return bp_attr_id_from_name(a->name);
}

/* The attribute with id `id` in an array of `n` attributes from any writer (stride: the first
 * element's struct_size), or NULL. */
static inline const bp_attr* bp_attr_find(const bp_attr* attrs, int32_t n, int32_t id) {
  size_t stride;
  int32_t k;
  if (!attrs || n <= 0) return NULL;
  stride = attrs[0].struct_size;
  if (stride < sizeof(bp_attr_minor1)) return NULL; /* not an attribute array */
  for (k = 0; k < n; ++k) {
    const bp_attr* a = (const bp_attr*)((const char*)attrs + (size_t)k * stride);
    if (bp_attr_get_id(a, stride) == id) return a;
  }
  return NULL;
}

/* An attribute's value as a double (INT attributes converted). */
static inline double bp_attr_float(const bp_attr* a) {
  return a->kind == BP_ATTR_FLOAT ? a->f : (double)a->i;
}
/* An attribute's value as an int64 (FLOAT attributes truncated toward zero, NaN to 0,
 * saturated to the int64 range). */
static inline int64_t bp_attr_int(const bp_attr* a) {
  if (a->kind == BP_ATTR_INT) return a->i;
  if (!(a->f == a->f)) return 0;
  if (a->f >= 9223372036854775807.0) return INT64_MAX;
  if (a->f <= -9223372036854775808.0) return INT64_MIN;
  return (int64_t)a->f;
}

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

/* ---- Asynchronous errors (minor 6, Note [Asynchronous errors]) --------------------------- */

/* How far an asynchronous failure reaches (bp_stream_fault.severity). Values are ordered: a
 * record only ever moves to a higher one. */
typedef enum bp_fault_severity {
  BP_FAULT_NONE = 0,            /* no failure since the record was last cleared */
  BP_FAULT_OP_FAILED = 1,       /* one op failed; its outputs are undefined, later work ran */
  BP_FAULT_STREAM_POISONED = 2, /* later work on the stream did not run, until cleared */
  BP_FAULT_DEVICE_LOST = 3      /* the device runs nothing more in this process; never cleared */
} bp_fault_severity;

/* A stream's sticky error record (stream_fault). The host zero-fills the struct and sets
 * struct_size; the plugin fills fields up to min(struct_size, its own size). Strings are
 * copied into the fixed arrays, NUL-terminated (truncated when longer). */
typedef struct bp_stream_fault {
  size_t struct_size;
  int32_t severity; /* bp_fault_severity */
  int32_t code;     /* bp_error_code of the failure (BP_ERROR_DEVICE, BP_ERROR_INVALID_ARGUMENT) */
  uint64_t op_id;   /* op id (op_begin) of the first failed work on the stream; 0: not known */
  uint64_t last_completed_op_id; /* the newest work known to have finished before it; 0: not
                                  * known */
  char message[512];             /* the backend's message: device, op, offending value ("index 7 at
                                  * position 3 is outside [0, 5)") */
  char native_name[64];          /* vendor error name ("cudaErrorIllegalAddress") or "" */
} bp_stream_fault;

/* Note [Asynchronous errors] (minor 6)
 *   Work fails after the call that queued it returned: a kernel faults, an index checked on
 *   the device is out of range. Three parts let the host name the op that failed, not the one
 *   that happened to synchronise:
 *   - Op ids. Before each call that queues work (launch, memset, copy_h2d, copy_d2h, copy_d2d,
 *     copy_peer, graph_launch), a host of minor >= 6 calls op_begin(id) on the same thread. Ids
 *     are unique per device, increase, and are never 0. The plugin takes the thread's id in the
 *     queuing call (and forgets it there: a call with no op_begin before it has id 0, "not
 *     known") and tags the queued work with it. A host keeps its own record of what each id
 *     was (the op, its dtype, device and shapes), so the plugin reports only the number.
 *   - The record. Each stream keeps its first asynchronous failure since the record was last
 *     cleared: severity, code, op id, message (bp_stream_fault). A later failure never
 *     replaces the first, but raises its severity (to DEVICE_LOST, say). While the record is
 *     set, stream_synchronize of that stream, copy_d2h on it and event_synchronize of an event
 *     recorded on it after the failure return an error with the record's code and message;
 *     stream_fault(stream, 1, out) reads and clears it (OP_FAILED, STREAM_POISONED), after
 *     which the stream runs work again. DEVICE_LOST is never cleared: every stream of the
 *     device reports it, and the plugin may fail every later call on the device with
 *     BP_ERROR_DEVICE. A failure that a queuing call itself detects is returned by that call,
 *     as always, and does not go into the record.
 *   - Events. An event recorded on a stream whose record is set is poisoned: it carries a copy
 *     of the record. event_synchronize of it fails with the record's error, and
 *     stream_wait_event of it sets the waiting stream's record (severity at least
 *     STREAM_POISONED, the first failed op's id and message), so the waiter fails too instead
 *     of reading what the failed op did not write.
 *   A plugin without stream_fault (minor < 6, or a NULL slot) reports an asynchronous failure as
 *   an error of its next stream_synchronize and clears it itself, as before. The host then knows
 *   only that some work queued on the stream since its last successful synchronisation failed:
 *   it names that work from its own record (exactly, when it was one op), and
 *   BACKPLANE_LAUNCH_BLOCKING=1 narrows it to the op. */

/* ---- The op catalogue (Note [Op catalogue]) ----------------------------------------------
 * Ops are resolved once per (device, op, dtype): by catalogue number with find_kernel_id
 * (minor 2; numbers and the X-macro in backplane/op_catalogue.h) or by name with find_kernel.
 * The dtype is that of the first input (of the output for ops without inputs) and lies in the
 * op's dtype domain (Note [Dtype domains]); values convert by Note [Conversions]. Shapes given to
 * launch are already broadcast by the host: every input has the output's rank and shape, with
 * stride 0 on broadcast dimensions, unless the op says otherwise. Attributes are named by their
 * bp_attr_id (Note [Attribute ids]); an absent attribute takes the default shown.
 *
 *   fill        out;            VALUE (FLOAT, or INT for i64 exactness)
 *   copy        in -> out       same dtype, any strides (materialises views)
 *   cast        in -> out       out.dtype is the target; resolved by the input dtype
 *   add sub mul div pow maximum minimum
 *               a, b -> out     or a -> out with SCALAR (FLOAT, or INT) standing for b;
 *                               REVERSE (INT 1) computes scalar OP a.
 *                               add and sub with two inputs take ALPHA (minor 2; FLOAT, or INT
 *                               for integer dtypes; default 1): out = a + alpha*b and
 *                               out = a - alpha*b as one op, alpha converted to the dtype like
 *                               SCALAR, the product and the sum in the compute type. A host sends
 *                               ALPHA only to plugins of minor >= 2 (older ones get mul, add).
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
 *               batch strides may be 0. ALLOW_TF32 (INT 0/1, default 0).
 *   sumsq norm  a -> out        reduced like sum: the sum of squares and its square root (the
 *                               2-norm), reading a once; the squares accumulate as sum's do.
 *                               Zero elements give 0.
 *   linear      x[M,K], w[N,K] (, bias[N]) -> out[M,N], rank 2: out = x w^T (+ bias), then
 *               ACTIVATION (INT, default 0): 0 none, 1 relu (BP_ACTIVATION_*). x and w each
 *               have unit stride in one of their two dimensions, as for matmul; bias has rank 1
 *               and any stride (it is not broadcast by the host). ALLOW_TF32 as for matmul.
 *               The bias and the activation apply to the product rounded once to the dtype's
 *               compute type (f32 for f16/bf16), and the result is rounded once on store.
 *   uniform     -> out           SEED, OFFSET (INT, default 0), LOW, HIGH (FLOAT, default 0, 1)
 *   normal      -> out           SEED, OFFSET (INT, default 0), MEAN, STD (FLOAT, default 0, 1)
 *               Random numbers follow Note [Philox stream] in backplane/philox.h exactly, so
 *               one seed gives the same values on every device.
 *
 * Minor 4, the convolutional family. Every tensor of these ops is dense (row-major
 * contiguous; the host makes inputs so), images are NCHW, and shapes are not broadcast. The
 * host checks every shape and attribute before it launches (a plugin may rely on them) and
 * gives the output shapes. Spatial attributes (INT): STRIDE_H/W (default 1; pooling: the
 * kernel size), PAD_H/W (default 0, zeros on both sides; -inf for max pooling), DILATION_H/W
 * (default 1), GROUPS (default 1), KERNEL_H/W (pooling, required), CEIL_MODE (pooling, default
 * 0). Output size P = floor((H + 2 pad_h - dilation_h (R - 1) - 1) / stride_h) + 1 (Q likewise;
 * with CEIL_MODE the ceiling, less one when the last window would start in the right padding).
 * f16 and bf16 accumulate in f32 (Note [Conversions]).
 *   conv2d      x[N,C,H,W], w[K,C/G,R,S] (, bias[K]) -> y[N,K,P,Q]: the cross-correlation of
 *               torch.nn.functional.conv2d with G = GROUPS (C and K multiples of G); ALLOW_TF32
 *               as for matmul.
 *   conv2d_backward_input   dy[N,K,P,Q], w[K,C/G,R,S] -> dx[N,C,H,W]; conv2d's attributes.
 *   conv2d_backward_weight  x[N,C,H,W], dy[N,K,P,Q] -> dw[K,C/G,R,S]; conv2d's attributes.
 *               (The bias gradient is dy summed over N, P and Q: the host uses sum.)
 *   max_pool2d  x[N,C,H,W] -> y[N,C,P,Q], indices[N,C,P,Q] (I64): indices = h * W + w of each
 *               window's maximum, the first in row-major window order on ties; a NaN counts as
 *               the maximum (its first position). The host keeps PAD <= KERNEL / 2.
 *   max_pool2d_backward  dy[N,C,P,Q], indices[N,C,P,Q] (I64) -> dx[N,C,H,W]: dx = 0, then
 *               dx[n,c,indices[n,c,p,q]] += dy[n,c,p,q], adding in row-major (p, q) order.
 *   avg_pool2d  x[N,C,H,W] -> y[N,C,P,Q]: KERNEL, STRIDE, PAD, CEIL_MODE as max_pool2d;
 *               COUNT_INCLUDE_PAD (INT, default 1): the divisor is the window clipped to the
 *               padded input (1) or to the input itself (0), as torch.nn.functional.avg_pool2d.
 *   avg_pool2d_backward  dy[N,C,P,Q] -> dx[N,C,H,W]; avg_pool2d's attributes.
 *   adaptive_avg_pool2d  x[N,C,H,W] -> y[N,C,P,Q]: y[n,c,p,q] is the mean of rows
 *               floor(p H / P) .. ceil((p + 1) H / P) - 1 and columns floor(q W / Q) ..
 *               ceil((q + 1) W / Q) - 1.
 *   adaptive_avg_pool2d_backward  dy[N,C,P,Q] -> dx[N,C,H,W].
 *   batch_norm  x[N,C,L], weight[C], bias[C], running_mean[C], running_var[C] -> y[N,C,L]
 *               (, save_mean[C], save_invstd[C]). EPS (FLOAT, default 1e-5), TRAINING (INT,
 *               default 0), MOMENTUM (FLOAT, default 0.1). The host passes any [N, C, ...]
 *               input as [N,C,L]. The per-channel tensors are f32 when x is f16 or bf16 and of
 *               x's dtype otherwise. Training: per channel, mean and biased variance over N and
 *               L; y = (x - mean) * invstd * weight + bias with invstd = 1 / sqrt(var + eps);
 *               save_mean and save_invstd written; running_mean and running_var updated in
 *               place as r = (1 - momentum) r + momentum b, with the unbiased variance
 *               (var * n / (n - 1), n = N L >= 2). Evaluation: the running statistics
 *               normalise and only y is written (the save outputs may be absent).
 *   batch_norm_backward  dy[N,C,L], x[N,C,L], weight[C], save_mean[C], save_invstd[C] ->
 *               dx[N,C,L], dweight[C], dbias[C]: the gradient of training-mode batch_norm.
 *               Per-channel tensors typed as in batch_norm; EPS as there.
 *   dropout     x -> y: P (FLOAT in [0, 1)), SEED, OFFSET (INT). Element i (row-major) is kept
 *               when the uniform draw u of Note [Philox stream] for (seed, offset, i) is >= p,
 *               and scaled by 1 / (1 - p); the others are 0. So one seed gives the same mask on
 *               every device, and the backward is the same op on dy with the same seed and
 *               offset.
 *   max_dim min_dim  x -> values, indices (I64) along AXIS (INT, required): both have x's rank
 *               with size 1 on AXIS (length >= 1); the first position of the maximum (minimum);
 *               a NaN counts as the extreme, as in torch.max(x, dim).
 *   gather      x, index (I64) -> out along AXIS: index has x's rank and index.shape[d] <=
 *               x.shape[d] for d != AXIS; out has index's shape and out[i] = x[i with
 *               i_AXIS = index[i]]. An index outside [0, x.shape[AXIS]) is an error
 *               (BP_ERROR_INVALID_ARGUMENT naming the index, its position and the size).
 *   scatter_add base, index (I64), src -> out along AXIS: out = base, then out[i with i_AXIS =
 *               index[i]] += src[i] for every position i of src (index and src share a shape;
 *               gather's backward). Contributions to one element add in row-major order of
 *               src, so the result does not depend on the device. Index errors as gather. INPLACE
 *               as elsewhere (out is base).
 *   softmax log_softmax  x -> y along AXIS: exp(x - m) / sum(exp(x - m)) with m the maximum
 *               along AXIS, and its logarithm (x - m - log(sum(exp(x - m)))); finite for any
 *               finite input.
 *   softmax_backward      y, dy -> dx along AXIS: dx = y * (dy - sum(dy * y)).
 *   log_softmax_backward  y, dy -> dx along AXIS: dx = dy - exp(y) * sum(dy).
 *
 * Minor 5, the transformer family. Every tensor is dense, as in minor 4 (but for sin, cos and
 * rsqrt, elementwise ops like exp: strided and broadcast inputs, INPLACE), shapes are not
 * broadcast, and the host checks shapes and attributes first. f16 and bf16 compute in f32;
 * "stats" tensors (layer_norm's mean and rstd, attention's lse) are f32 for f16 and bf16 inputs
 * and of the input's dtype otherwise.
 *   layer_norm  x[M,N] (, weight[N] (, bias[N])) -> y[M,N] (, mean[M], rstd[M]): each row of N
 *               normalised with its mean and biased variance, rstd = 1 / sqrt(var + EPS) (FLOAT,
 *               default 1e-5); y = (x - mean) rstd, times weight and plus bias when given
 *               (weight and bias are of x's dtype; a host with a bias but no weight passes
 *               ones). The host passes any input as [M, N], N the product of the normalised
 *               dimensions. mean and rstd (stats) are written when present. N >= 1.
 *   layer_norm_backward  dy[M,N], x[M,N], mean[M], rstd[M] (, weight[N]) -> dx[M,N]
 *               (, dweight[N], dbias[N]): the gradient of layer_norm with the saved statistics;
 *               with xhat = (x - mean) rstd and g = dy weight (dy without weight),
 *               dx = rstd (g - mean_N(g) - xhat mean_N(g xhat)), dweight = sum_M(dy xhat),
 *               dbias = sum_M(dy) (of x's dtype, present only with weight).
 *   gelu        x -> y: APPROXIMATE (INT, default 0, bp_gelu_approximate): x Phi(x) with the
 *               exact normal CDF, or the tanh form of torch.nn.functional.gelu.
 *   gelu_backward  x, dy -> dx = dy gelu'(x) for the same APPROXIMATE.
 *   silu        x -> y = x sigmoid(x).
 *   silu_backward  x, dy -> dx = dy s (1 + x (1 - s)), s = sigmoid(x).
 *   embedding   weight[V,D], indices[M] (I64) -> out[M,D]: out[m] = weight[indices[m]]; the host
 *               passes any index shape as [M]. An index outside [0, V) is an error
 *               (BP_ERROR_INVALID_ARGUMENT naming the index, its position and V); a device that
 *               finds it asynchronously reports it at the next synchronisation, never a row of
 *               another index. Resolved by weight's dtype.
 *   embedding_backward  dy[M,D], indices[M] (I64) -> dweight[V,D]: dweight = 0, then
 *               dweight[indices[m]] += dy[m]. Each row of dweight is the sum of its
 *               contributions taken in increasing m, in the compute type, rounded once on store,
 *               so the result is the same on every device and every run. Index errors as
 *               embedding.
 *   scaled_dot_product_attention  q[B,H,L,E], k[B,H,S,E], v[B,H,S,Ev] -> out[B,H,L,Ev],
 *               lse[B,H,L] (stats): s_ij = SCALE q_i . k_j (SCALE FLOAT, default 1 / sqrt(E));
 *               with CAUSAL (INT 0/1, default 0) the pairs j > i are masked out (the top-left
 *               triangle of torch's is_causal); p_ij = exp(s_ij - lse_i) over the unmasked j,
 *               lse_i = log sum_j exp(s_ij) computed from the row's maximum (finite for any
 *               finite input, whatever the row's length); out_i = sum_j p_ij z_ij v_j. Dropout
 *               P (FLOAT in [0, 1), default 0), SEED, OFFSET (INT): z_ij = 0 when the uniform
 *               draw of Note [Philox stream] for (seed, offset, element ((b H + h) L + i) S + j)
 *               is < P, else 1 / (1 - P); with P = 0, z = 1. A row with no unmasked j (S = 0)
 *               gives out_i = 0 and lse_i = -inf.
 *   scaled_dot_product_attention_backward  q, k, v, out, dout[B,H,L,Ev], lse -> dq, dk, dv with
 *               the forward's attributes: with p and z recomputed from lse and the seed,
 *               D_i = dout_i . out_i and ds_ij = p_ij (z_ij dout_i . v_j - D_i),
 *               dq_i = SCALE sum_j ds_ij k_j, dk_j = SCALE sum_i ds_ij q_i,
 *               dv_j = sum_i p_ij z_ij dout_i.
 *   triu tril   x[..., R, C] -> y (rank >= 2): y = x where c - r >= DIAGONAL (triu) or
 *               c - r <= DIAGONAL (tril), else 0; DIAGONAL (INT, default 0) as torch.triu.
 *   cumsum      x -> y along AXIS (INT, required): y_i = sum_{k <= i} x_k, added in order of k in
 *               the compute type (integers wrap as sum's do).
 *   sin cos rsqrt  a -> out, as exp; rsqrt(a) = 1 / sqrt(a) (inf at 0, NaN below 0).
 *
 * Minor 6, the fused optimiser update (Note [Fused Adam]).
 *   adamw       N >= 1 parameters in one launch: inputs param_k, grad_k, exp_avg_k, exp_avg_sq_k
 *               for k = 0 .. N-1 (4 N, in that order), outputs param_k, exp_avg_k, exp_avg_sq_k
 *               (3 N): every output is the same memory as its input (the update is in place;
 *               INPLACE is not sent). The four tensors of one parameter are dense, share a shape
 *               and the dtype the op is resolved by (input 0's); parameters may differ in shape.
 *               LR, BETA1, BETA2, EPS, WEIGHT_DECAY (FLOAT; defaults 1e-3, 0.9, 0.999, 1e-8,
 *               0), STEP (INT >= 1, the step being taken: the bias corrections are
 *               c1 = 1 - BETA1^STEP and c2 = 1 - BETA2^STEP), DECOUPLED (INT 0/1, default 1).
 *               Per element, in the compute type (f32 for f16/bf16):
 *                 DECOUPLED 1 (torch.optim.AdamW): p = p (1 - LR WEIGHT_DECAY), g = grad;
 *                 DECOUPLED 0 (torch.optim.Adam):  g = grad + WEIGHT_DECAY p;
 *                 m = BETA1 m + (1 - BETA1) g;  v = BETA2 v + (1 - BETA2) g g;
 *                 p = p - (LR / c1) m / (sqrt(v) / sqrt(c2) + EPS);
 *               each of p, m and v rounded once on store.
 *
 * Minor 8, the fused classification loss (Note [Fused cross entropy]). Dense tensors, shapes
 * checked by the host, f16 and bf16 computed in f32; loss, lse and dloss are "stats" (f32 for
 * f16 and bf16 logits, of the logits' dtype otherwise). Resolved by the logits' dtype.
 *   cross_entropy  x[N,C], target[N] (I64) -> loss[N], lse[N]: per row n with t = target[n],
 *               lse_n = log sum_c exp(x_nc) computed from the row's maximum (finite for any
 *               finite row) and, with e = LABEL_SMOOTHING (FLOAT in [0, 1], default 0),
 *               loss_n = lse_n - (1 - e) x_nt - (e / C) sum_c x_nc (torch's
 *               cross_entropy(reduction='none', label_smoothing=e)). A row whose t equals
 *               IGNORE_INDEX (INT, default -100) has loss_n = 0 (lse_n is still written). Any
 *               other t outside [0, C) is an error (BP_ERROR_INVALID_ARGUMENT naming the target,
 *               its row and C); a device that finds it asynchronously reports it at the next
 *               synchronisation, never a loss of another class. C >= 1.
 *   cross_entropy_backward  x[N,C], target[N] (I64), lse[N], dloss[N] -> dx[N,C] (x's dtype):
 *               dx_nc = dloss_n (exp(x_nc - lse_n) - (1 - e) [c = t] - e / C), and dx_n = 0 for a
 *               row whose target is IGNORE_INDEX; the same attributes and target errors as the
 *               forward.
 * Outputs are dense (row-major contiguous) for every op but copy, whose output may be any
 * non-overlapping strided view (writing into a slice). Outputs never alias inputs unless the
 * host says so with INPLACE (INT 1), where out and input 0 describe the same memory (adamw's
 * outputs are its inputs by definition).
 */

/* Note [Fused Adam]
 *   torch.optim.Adam and AdamW with fused=True: one op updates a list of parameters with their
 *   optimiser state, so a backend can run the whole update in a few launches (the cuda backend
 *   packs the tensors' addresses into the launch's arguments, as PyTorch's multi_tensor_apply)
 *   instead of the dozen elementwise launches per parameter of the decomposition. The host
 *   groups the parameters that have a gradient by device, dtype and step count, and falls back
 *   to the decomposition (mul_, add_, sqrt, div ...) on a plugin without the op, so results agree
 *   within the dtype's rounding either way. A plugin may split a launch into chunks as it
 *   likes: the parameters are independent.
 */

/* Note [Fused cross entropy]
 *   torch.nn.functional.cross_entropy over class indices as one op forward and one backward. As
 *   log_softmax and a gather, a language model's loss reads and writes its [tokens, vocabulary]
 *   logits about six times (in f32 under autocast, plus the casts); fused, the forward reads
 *   the logits (of any float dtype) once or twice and writes two numbers a row, and the
 *   backward reads them once and writes the gradient once, in the logits' own dtype. The host
 *   reduces loss[N] itself ('mean' divides by the number of rows not ignored, as torch) and
 *   passes dloss[N] dense. A plugin without the ops gets log_softmax and a gather (the
 *   decomposition, which has no label smoothing: the host then composes it from sums).
 */

/* Note [Dtype domains]
 *   Each op is defined for the dtypes of its domain, the BP_DOMAIN_* column of the X-macro in
 *   backplane/op_catalogue.h (bp_op_domain, bp_op_in_domain):
 *     every dtype (ALL)           fill copy cast eq ne lt le gt ge where
 *     f32 f64 f16 bf16 i32 i64 u8 (ARITH, no bool)   add sub mul maximum minimum
 *     f32 f64 f16 bf16 i32 i64 (SIGNED)              neg relu abs sum max
 *     f32 f64 f16 bf16 (FLOAT)    div pow exp log sqrt sigmoid tanh mean matmul uniform normal
 *                                 sumsq norm linear conv2d conv2d_backward_input
 *                                 conv2d_backward_weight max_pool2d max_pool2d_backward
 *                                 avg_pool2d avg_pool2d_backward adaptive_avg_pool2d
 *                                 adaptive_avg_pool2d_backward batch_norm batch_norm_backward
 *                                 dropout softmax log_softmax softmax_backward
 *                                 log_softmax_backward
 *   minor 4 besides: max_dim min_dim (SIGNED), gather (ALL), scatter_add (ARITH)
 *   minor 5: FLOAT for layer_norm layer_norm_backward gelu gelu_backward silu silu_backward
 *   embedding embedding_backward scaled_dot_product_attention
 *   scaled_dot_product_attention_backward sin cos rsqrt; ALL for triu tril; SIGNED for cumsum
 *   minor 7: FLOAT for adamw
 *   minor 8: FLOAT for cross_entropy cross_entropy_backward
 *   A host never asks for a pair outside the domain (libbackplane raises DTypeError naming the
 *   op, the dtype and the domain); a plugin declares those pairs BP_SUPPORT_NO with
 *   bp_op_domain_reason. Inside the domain a plugin may still lack a pair (UNSUPPORTED, with
 *   its own reason); bp-conformance tests exactly the pairs inside the domain.
 *
 * Note [Conversions]
 *   The rules every plugin follows, so that one program gives the same bits everywhere:
 *   - Compute types: f16 and bf16 are loaded to f32, computed in f32 and rounded once on store;
 *     u8 computes in i32 and wraps on store; the others compute in their own type. Sums of
 *     floats may accumulate in a wider type (f32 in f64); the result is rounded once.
 *   - cast and scalar attributes (VALUE, SCALAR, ALPHA; converted to the tensor's dtype before
 *     use, so f16 x == 0.1 compares with f16(0.1)):
 *       float -> integer truncates toward zero; NaN gives 0; a value outside the int64 range
 *         saturates to it, and narrower integers then wrap modulo 2^bits (-1.0 -> u8 is 255,
 *         300.0 -> u8 is 44), as NumPy and PyTorch give on x86;
 *       integer -> integer wraps modulo 2^bits; x -> bool is x != 0 (NaN -> true);
 *       bool -> x is 0 or 1; to f16 / bf16 rounds to nearest even (f64 through f32).
 *   - Overflow: integer add, sub, mul (and the ALPHA product), neg and abs wrap modulo 2^bits
 *     (abs and neg of the minimum value give it back); sums of integers wrap the same way.
 *     Floating results overflow to +-inf as IEEE 754 says.
 *   - NaN: arithmetic and transcendental ops propagate it; maximum, minimum and the max
 *     reduction propagate a NaN from either operand (like torch.maximum); relu keeps NaN;
 *     comparisons with NaN are false, except ne, which is true; mean of zero elements is NaN.
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

  /* Release everything init loaded or started. Called once at most; optional (NULL: nothing).
   * The host calls it right after init when device_count returned 0 (nothing of the plugin can
   * be used, so what it loaded for the devices it looked for must go), and afterwards calls
   * nothing but device_count (same count and reason) and error_free. At process exit the host
   * does not call it: it waits for every stream's queued work instead, before any library's
   * static destructors run (work may still run on a plugin's own threads). */
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
   * size it was allocated with (sized deallocation, for statistics). Accepts NULL. The host
   * frees a buffer on the stream it was allocated on, and keeps that stream alive until then;
   * work on other streams that used the buffer is ordered before the free by the host. */
  bp_error* (*mem_free)(int32_t device, bp_stream* stream, bp_buffer* buf, uint64_t size);
  /* Host address of a buffer when device memory is host memory (unified_memory), else NULL.
   * Optional; NULL slot: the host always copies. */
  void* (*mem_host_pointer)(bp_buffer* buf);
  bp_error* (*memory_stats)(int32_t device, bp_memory_stats* out_stats);
  /* Reset peak_allocated to the current allocated. (libbackplane keeps its own peak and does
   * not call this.) */
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

  /* Kernels. find_kernel resolves an op of the catalogue, by name, for one dtype on one
   * device; it returns BP_ERROR_UNSUPPORTED when the plugin lacks it. The handle lives as long
   * as the plugin. launch queues the kernel on `stream` and returns without waiting; `attrs`
   * is an array of num_attrs attributes laid out as Note [Attribute ids] says. */
  bp_error* (*find_kernel)(int32_t device, const char* op, int32_t dtype, bp_kernel** out_kernel);
  bp_error* (*launch)(bp_kernel* kernel, bp_stream* stream, const bp_tensor_desc* inputs,
                      int32_t num_inputs, const bp_tensor_desc* outputs, int32_t num_outputs,
                      const bp_attr* attrs, int32_t num_attrs);

  /* ---- minor 1 ---- */

  /* The (op, dtype) pairs this plugin declares for `device`, with unsupported and expected
   * failures and their reasons. *out_list is static or valid while the plugin is loaded.
   * Optional; NULL (or a minor-0 plugin): the host probes find_kernel over the catalogue. */
  bp_error* (*list_ops)(int32_t device, const bp_op_support** out_list, int32_t* out_count);

  /* ---- minor 2 ---- */

  /* find_kernel by catalogue number (bp_op, backplane/op_catalogue.h) instead of name: the
   * same handle, or the same error, as find_kernel(device, bp_op_name(op), dtype), with no
   * string compared. An op or dtype number the plugin does not know (a newer host's) is
   * BP_ERROR_UNSUPPORTED. Optional; NULL (or a plugin of minor < 2): the host uses
   * find_kernel with the op's name. */
  bp_error* (*find_kernel_id)(int32_t device, int32_t op, int32_t dtype, bp_kernel** out_kernel);

  /* Note [Native handles] (minor 2): what a plugin holds, handed to interoperability layers
   * (DLPack, communicators, graphs), and foreign memory and queues wrapped without copying. Every
   * slot of this group is optional. When one is NULL, or the plugin's abi_minor is below 2, or its
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
   * the wrapper with stream_destroy, which unlike a plugin-made stream's may come while work it
   * queued is still pending: that work stays on the owner's native queue and completes there, and
   * the plugin must not wait for it (a DLPack consumer's stream is never blocked on). Errors:
   * BP_ERROR_INVALID_ARGUMENT for a queue of another device or context (named in the message),
   * BP_ERROR_UNSUPPORTED when the backend has no native queues to wrap. Thread-safe. */
  bp_error* (*stream_import)(int32_t device, void* native_stream, bp_stream** out_stream);

  /* ---- minor 3 ---- */

  /* Note [Native graphs] (minor 3): the work queued on one stream between graph_begin_capture
   * and graph_end_capture is not run but captured (kernel launches, memset, copy_d2d, and
   * copy_h2d / copy_d2h with page-locked host memory from host_alloc), and the graph replays it
   * with one submission per graph_launch. Every slot of this group is optional, and a plugin
   * has either all five or none: when any is NULL, or the plugin's abi_minor is below 3, or its
   * struct_size does not cover them, libbackplane records the launches itself and replays the
   * list (Note [Recorded graphs] in core; the documented default, which bp-conformance tests).
   * What the host guarantees while a stream is capturing: it queues on that stream only the
   * kinds of work listed above; it calls no synchronisation of that stream, records and waits
   * for no event on it, and frees no buffer on it; every buffer the captured work touches was
   * allocated on another stream (or before the capture) and stays alive until graph_destroy.
   * libbackplane captures on a stream of its own that only the capturing host thread uses
   * (Note [Capture threads] in core): no other thread queues work on a capturing stream, and
   * graph_launch runs the graph on another stream of the device (the default one).
   * What the plugin guarantees: memory it needs inside captured work (scratch, workspaces)
   * stays valid and private to the graph until graph_destroy, so replays may follow each other
   * and eager work on the same stream; a failed capture call leaves the stream as it was.
   *
   * Begins capturing `stream` (BP_ERROR_INVALID_ARGUMENT when it is already capturing). */
  bp_error* (*graph_begin_capture)(bp_stream* stream);
  /* Ends the capture of `stream` and returns what was captured in *out_graph (owned by the
   * caller: graph_destroy). The stream is back to eager execution whatever the result; on an
   * error (the capture was invalidated by something the driver refused) nothing is returned
   * and nothing of the captured work remains. */
  bp_error* (*graph_end_capture)(bp_stream* stream, bp_graph** out_graph);
  /* Prepares a captured graph for launching (cudaGraphInstantiate); called once, before the
   * first graph_launch. */
  bp_error* (*graph_instantiate)(bp_graph* graph);
  /* Queues one replay of an instantiated graph on `stream` (any stream of the graph's device)
   * and returns without waiting. Replays on one stream run in order, each after the work
   * queued before it. May be called from several threads at once for one graph: the plugin
   * serialises what its driver does not allow concurrently (a CUDA graph exec). */
  bp_error* (*graph_launch)(bp_graph* graph, bp_stream* stream);
  /* Destroys a graph, instantiated or not, and frees what the plugin kept for it. The host
   * calls it only after every replay has finished (it synchronises the stream first). */
  bp_error* (*graph_destroy)(bp_graph* graph);

  /* ---- minor 6 ---- */

  /* Note [Asynchronous errors]: both slots optional, independently. */
  /* The op id of the work that the calling thread queues next, with its next launch, memset,
   * copy or graph_launch on any stream of this plugin. Never fails, never blocks, queues
   * nothing; cheap (a thread-local store). NULL: the plugin ignores op ids and reports 0. */
  void (*op_begin)(uint64_t op_id);
  /* Copies the stream's error record into *out_fault (struct_size set by the caller; severity
   * BP_FAULT_NONE when nothing failed) without waiting for the stream. With `clear` non-zero a
   * record of severity OP_FAILED or STREAM_POISONED is reset afterwards and the stream runs
   * work again; DEVICE_LOST stays. Thread-safe. NULL: the host treats an error of
   * stream_synchronize as a failure of the work queued since its last synchronisation. */
  bp_error* (*stream_fault)(bp_stream* stream, int32_t clear, bp_stream_fault* out_fault);
} bp_plugin_api;

/* The slots every plugin sets (non-NULL), once: X(slot) for each. Every other slot is optional,
 * with the default its comment states; the event group (event_create, event_destroy,
 * event_record, stream_wait_event, event_synchronize) is all set or all NULL. */
/* clang-format off */
#define BP_PLUGIN_REQUIRED_SLOTS(X)                                                            \
  X(error_free) X(init) X(device_count) X(device_properties) X(stream_create) X(stream_destroy) \
  X(stream_synchronize) X(mem_alloc) X(mem_free) X(memory_stats) X(memory_reset_peak)          \
  X(memset) X(copy_h2d) X(copy_d2h) X(copy_d2d) X(find_kernel) X(launch)
/* clang-format on */

/* Byte offset of the first slot of minor 1: a table whose struct_size is at most this has
 * only minor-0 slots, whatever abi_minor it claims. */
#define BP_API_MINOR1_OFFSET offsetof(bp_plugin_api, list_ops)
/* Byte offset of the first slot of minor 2: a table whose struct_size is at most this has no
 * minor-2 slot, whatever abi_minor it claims. */
#define BP_API_MINOR2_OFFSET offsetof(bp_plugin_api, find_kernel_id)
/* Byte offset of the first slot of minor 3 (the native graph slots). */
#define BP_API_MINOR3_OFFSET offsetof(bp_plugin_api, graph_begin_capture)
/* Byte offset of the first slot of minor 6 (the asynchronous error slots); minors 4 and 5
 * added no slot, so this is where a table of minor 3 to 5 ends. */
#define BP_API_MINOR6_OFFSET offsetof(bp_plugin_api, op_begin)

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
