/*
 * The reference backend: the template backend (plugins/template) built in tree with fault
 * switches, the one C plugin behind the loader tests, the bp-conformance fault tests and
 * conformance.reference (README.md beside this file).
 *
 * It takes the template's table and replaces the slots a fault needs. Faults are named in the
 * environment variable BP_REFERENCE_FAULT (a comma-separated list, read once when the table is
 * first asked for), or, when that is unset, in the compile-time default REFERENCE_DEFAULT_FAULT
 * (how the loader's broken-plugin files are built). With no fault it is the template, plus two
 * contract checks: init runs once per process (Note [Plugin lifetime]) and mem_free names a
 * live stream (plugin_abi.h, mem_free).
 *
 * Compile-time only, since they change the file rather than the table:
 *   REFERENCE_NO_ENTRY    the entry symbol is misnamed (the loader reports it missing)
 *   REFERENCE_DEPENDENCY  init calls bp_fixture_dependency_answer of a library that is not on
 *                         the search path (the loader names the missing dependency)
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep, clock_gettime */

#include "template.h"

#include "reference_async.h"

#include <backplane/abi/op_table.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef REFERENCE_DEFAULT_FAULT
#define REFERENCE_DEFAULT_FAULT ""
#endif

#ifdef REFERENCE_DEPENDENCY
int bp_fixture_dependency_answer(void);
#endif

/* ---- The fault switches ------------------------------------------------------------------ */

enum {
  F_WRONG_ADD = 1 << 0,      /* add f32 returns a + b + 0.5: beyond any tolerance */
  F_OVERFLOW = 1 << 1,       /* fill, copy and copy_d2d write one element/byte past the end */
  F_CRASH = 1 << 2,          /* memset with value 0x5A dereferences address 16 (SIGSEGV) */
  F_HANG = 1 << 3,           /* copy_d2d of exactly 4097 bytes never returns */
  F_XFAIL = 1 << 4,          /* add, mul f32 declared EXPECTED_FAIL; mul returns 1.5 * a * b */
  F_MINOR0 = 1 << 5,         /* an ABI 1.0 table: minor 0, struct_size ending before list_ops */
  F_MINOR1_TRAPS = 1 << 6,   /* an ABI 1.1 table whose minor-2 slots past struct_size are traps */
  F_LEAK = 1 << 7,           /* memory_stats never sees a free: bytes do not return */
  F_PROPS = 1 << 8,          /* device_properties writes the whole struct whatever struct_size */
  F_STREAM_SCRATCH = 1 << 9, /* add f32 through an unguarded per-stream scratch array */
  F_NATIVE = 1 << 10,        /* (a feature) the native-handle slots of ABI 1.2 */
  F_NATIVE_BAD = 1 << 11,    /* native slots: buffer_native ignores the offset, a release twice */
  F_ABI_MAJOR2 = 1 << 12,    /* the table says ABI major 2 */
  F_INIT_FAILS = 1 << 13,    /* init returns BP_ERROR_UNAVAILABLE */
  F_WRONG_CONV = 1 << 14,    /* conv2d pads one row too many on top: its windows start a row high */
  F_INIT_SEGV = 1 << 15,     /* init dies of SIGSEGV (as a bad pointer would) */
  F_INIT_ABORT = 1 << 16,    /* init calls abort() */
  F_INIT_HANG = 1 << 17,     /* init never returns */
  F_BIG_STRUCT = 1 << 18,    /* the table declares struct_size 1 GiB */
  F_NULL_ALLOC = 1 << 19,    /* mem_alloc of more than 0 bytes gives NULL and no error */
  F_BAD_NAME = 1 << 20,      /* the device name is not UTF-8 and holds a terminal escape */
  F_INIT_EXIT = 1 << 21,     /* init calls exit(3) */
  F_SIDE_SYNC = 1 << 22,     /* stream_synchronize fails on every stream but the first one */
  F_NO_CONV = 1 << 23,       /* conv2d, its backward ops and the fused cross_entropy pair are
                                not implemented (UNSUPPORTED): the host decomposes them */
  F_ASYNC_FAIL = 1 << 24,    /* mul f32 fails "on the device": op failed (reference_async.c) */
  F_ASYNC_INDEX = 1 << 25,   /* an out-of-range index is found "on the device": op failed */
  F_ASYNC_POISON = 1 << 26,  /* ... and poisons its stream */
  F_DEVICE_LOST = 1 << 27,   /* ... and loses the device */
  F_MINOR5 = 1 << 28         /* with the faults above: an ABI 1.5 table, no op ids or records */
};

static const struct {
  const char* name;
  unsigned bit;
} kFaults[] = {{"wrong_add", F_WRONG_ADD},
               {"overflow", F_OVERFLOW},
               {"crash", F_CRASH},
               {"hang", F_HANG},
               {"xfail", F_XFAIL},
               {"minor0", F_MINOR0},
               {"minor1_traps", F_MINOR1_TRAPS},
               {"leak", F_LEAK},
               {"props", F_PROPS},
               {"stream_scratch", F_STREAM_SCRATCH},
               {"native", F_NATIVE},
               {"native_bad", F_NATIVE | F_NATIVE_BAD},
               {"abi_major2", F_ABI_MAJOR2},
               {"init_fails", F_INIT_FAILS},
               {"wrong_conv", F_WRONG_CONV},
               {"init_segv", F_INIT_SEGV},
               {"init_abort", F_INIT_ABORT},
               {"init_hang", F_INIT_HANG},
               {"big_struct", F_BIG_STRUCT},
               {"null_alloc", F_NULL_ALLOC},
               {"bad_name", F_BAD_NAME},
               {"init_exit", F_INIT_EXIT},
               {"side_sync_fails", F_SIDE_SYNC},
               {"no_conv", F_NO_CONV},
               {"async_fail", F_ASYNC_FAIL},
               {"async_index", F_ASYNC_INDEX},
               {"async_poison", F_ASYNC_POISON},
               {"device_lost", F_DEVICE_LOST},
               {"minor5", F_MINOR5}};
#define NUM_FAULTS (sizeof kFaults / sizeof kFaults[0])

static unsigned g_faults;
static char g_fault_error[512]; /* an unknown name: init fails with this message */

static int on(unsigned bit) {
  return (g_faults & bit) != 0;
}

/* Parses "a,b,c" ("" and "none": no fault) into g_faults. */
static void parse_faults(const char* spec) {
  const char* p = spec;
  while (*p) {
    size_t n = strcspn(p, ","), i;
    int known = n == 0 || (n == 4 && strncmp(p, "none", 4) == 0);
    for (i = 0; i < NUM_FAULTS && !known; ++i) {
      if (strlen(kFaults[i].name) == n && strncmp(p, kFaults[i].name, n) == 0) {
        g_faults |= kFaults[i].bit;
        known = 1;
      }
    }
    if (!known && !g_fault_error[0]) {
      size_t len;
      snprintf(g_fault_error, sizeof g_fault_error,
               TEMPLATE_NAME ": BP_REFERENCE_FAULT: unknown fault '%.*s' (known: none", (int)n, p);
      for (i = 0; i < NUM_FAULTS; ++i) {
        len = strlen(g_fault_error);
        snprintf(g_fault_error + len, sizeof g_fault_error - len, ", %s", kFaults[i].name);
      }
      len = strlen(g_fault_error);
      snprintf(g_fault_error + len, sizeof g_fault_error - len, ")");
    }
    p += n;
    if (*p == ',') ++p;
  }
}

static const bp_plugin_api* base(void) {
  return template_api_table();
}

static void sleep_ms(long ms) {
  struct timespec t;
  t.tv_sec = ms / 1000;
  t.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&t, NULL);
}

/* ---- Contract checks: init once, streams alive when a buffer is freed --------------------- */

/* A driver that dereferences a bad pointer. The signal is raised with its default action, so
 * the process dies of SIGSEGV in sanitizer builds as well, whose handlers would otherwise turn
 * the fault into a report and exit status 1. */
static void crash_with_segv(void) {
  signal(SIGSEGV, SIG_DFL);
  raise(SIGSEGV);
}

static int g_inits;
static bp_error* ref_init(void) {
  if (__atomic_add_fetch(&g_inits, 1, __ATOMIC_RELAXED) > 1)
    return template_error(BP_ERROR_INTERNAL,
                          TEMPLATE_NAME ": init called a second time in this process");
  if (g_fault_error[0]) return template_error(BP_ERROR_INVALID_ARGUMENT, "%s", g_fault_error);
#ifdef REFERENCE_DEPENDENCY
  (void)bp_fixture_dependency_answer();
#endif
  if (on(F_INIT_FAILS))
    return template_error(BP_ERROR_UNAVAILABLE,
                          TEMPLATE_NAME " init failure: simulated driver error 42");
  if (on(F_INIT_SEGV)) crash_with_segv();
  if (on(F_INIT_ABORT)) abort();
  if (on(F_INIT_EXIT)) exit(3);
  while (on(F_INIT_HANG)) sleep_ms(1000);
  return base()->init();
}

/* Live streams (and, for stream_scratch, each one's scratch array), guarded by g_mu. */
#define MAX_STREAMS 256
#define SCRATCH_FLOATS (1 << 16)
typedef struct stream_entry {
  bp_stream* stream;
  float* scratch; /* stream_scratch: created on first use and used without a lock */
  int inside;     /* stream_scratch: launches inside the scratch section (atomic) */
} stream_entry;
static stream_entry g_streams[MAX_STREAMS];
static bp_stream* g_first_stream; /* side_sync_fails: the first stream created (the default) */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static stream_entry* entry_of(bp_stream* s) { /* under g_mu; NULL when not live */
  int i;
  for (i = 0; i < MAX_STREAMS; ++i)
    if (g_streams[i].stream == s) return &g_streams[i];
  return NULL;
}

static bp_error* track_stream(bp_stream* s) {
  stream_entry* e;
  pthread_mutex_lock(&g_mu);
  e = entry_of(NULL);
  if (!g_first_stream) g_first_stream = s;
  if (e) {
    e->stream = s;
    e->scratch = NULL;
    e->inside = 0;
  }
  pthread_mutex_unlock(&g_mu);
  if (e) return NULL;
  base()->stream_destroy(s);
  return template_error(BP_ERROR_OUT_OF_MEMORY,
                        TEMPLATE_NAME ":0: stream_create: more than 256 live streams");
}

static bp_error* ref_stream_create(int32_t device, bp_stream** out) {
  bp_error* err = base()->stream_create(device, out);
  return err ? err : track_stream(*out);
}

static bp_error* ref_stream_destroy(bp_stream* s) {
  stream_entry* e;
  float* scratch = NULL;
  pthread_mutex_lock(&g_mu);
  e = entry_of(s);
  if (e) {
    scratch = e->scratch;
    e->stream = NULL;
  }
  if (s == g_first_stream) g_first_stream = NULL;
  pthread_mutex_unlock(&g_mu);
  free(scratch);
  return base()->stream_destroy(s);
}

/* ---- Imported buffers (native, native_bad) ------------------------------------------------ */

typedef struct import_entry {
  bp_buffer* buf;
  bp_release_fn release;
  void* ctx;
  int freed; /* mem_free came: release at the next stream_synchronize */
} import_entry;
#define MAX_IMPORTS 256
static import_entry g_imports[MAX_IMPORTS]; /* guarded by g_mu */

static import_entry* import_of(bp_buffer* b) { /* under g_mu */
  int i;
  for (i = 0; i < MAX_IMPORTS; ++i)
    if (g_imports[i].buf == b) return &g_imports[i];
  return NULL;
}

static bp_error* ref_buffer_native(bp_buffer* buf, uint64_t off, bp_native_buffer* out) {
  bp_native_buffer full;
  size_t n;
  if (!out || out->struct_size < sizeof(size_t) || !buf)
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME ":0: buffer_native: no buffer, or no struct_size");
  if (off > buf->size)
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME ":0: buffer_native: offset %llu past a %llu-byte buffer",
                          (unsigned long long)off, (unsigned long long)buf->size);
  if (on(F_NATIVE_BAD)) off = 0; /* the fault: every offset gives the buffer's start */
  memset(&full, 0, sizeof full);
  full.address = buf->data + off;
  full.device_ordinal = 0;
  full.dlpack_device_type = BP_DLPACK_CPU;
  n = out->struct_size < sizeof full ? out->struct_size : sizeof full;
  memcpy((char*)out + sizeof(size_t), (const char*)&full + sizeof(size_t), n - sizeof(size_t));
  return NULL;
}

static bp_error* ref_stream_native(bp_stream* s, void** out) {
  if (!s || !out)
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME ":0: stream_native: NULL stream or out_native");
  *out = NULL; /* eager streams have no native object */
  return NULL;
}

static bp_error* ref_buffer_import(int32_t device, void* address, uint64_t size,
                                   bp_release_fn release, void* ctx, bp_buffer** out) {
  bp_buffer* b;
  import_entry* e;
  bp_error* err = template_check_device(device, "buffer_import");
  if (err) return err;
  if (!out || (!address && size))
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME ":0: buffer_import: NULL address for %llu bytes",
                          (unsigned long long)size);
  b = (bp_buffer*)malloc(sizeof *b);
  if (!b) return template_error(BP_ERROR_OUT_OF_MEMORY, TEMPLATE_NAME ":0: out of host memory");
  b->data = (unsigned char*)address;
  b->size = size;
  b->stream = NULL;
  pthread_mutex_lock(&g_mu);
  e = import_of(NULL);
  if (e) {
    e->buf = b;
    e->release = release;
    e->ctx = ctx;
    e->freed = 0;
  }
  pthread_mutex_unlock(&g_mu);
  if (!e) {
    free(b);
    return template_error(BP_ERROR_OUT_OF_MEMORY,
                          TEMPLATE_NAME ":0: buffer_import: more than 256 live imports");
  }
  *out = b;
  return NULL;
}

static bp_error* ref_stream_import(int32_t device, void* native, bp_stream** out) {
  bp_error* err = template_check_device(device, "stream_import");
  if (err) return err;
  if (native)
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME ":0: stream_import: the only native stream is NULL");
  return ref_stream_create(device, out);
}

/* Deferred releases are due: the eager stream has nothing queued. Releases run with no lock
 * held (Note [Imported memory]). */
static bp_error* ref_stream_synchronize(bp_stream* s) {
  import_entry due[MAX_IMPORTS];
  int i, n = 0;
  pthread_mutex_lock(&g_mu);
  for (i = 0; i < MAX_IMPORTS; ++i) {
    if (g_imports[i].buf && g_imports[i].freed) {
      due[n++] = g_imports[i];
      g_imports[i].buf = NULL;
    }
  }
  pthread_mutex_unlock(&g_mu);
  for (i = 0; i < n; ++i) {
    if (due[i].release) due[i].release(due[i].ctx);
    free(due[i].buf);
  }
  return base()->stream_synchronize(s);
}

/* side_sync_fails: the first stream the host creates is the device's default stream; every
 * later one (the graph pool's, a user's) fails to synchronise, as after a device error seen on
 * that stream, while the default stream keeps working. */
static bp_error* ref_stream_synchronize_side(bp_stream* s) {
  int first;
  pthread_mutex_lock(&g_mu);
  first = s == g_first_stream;
  pthread_mutex_unlock(&g_mu);
  if (!first)
    return template_error(BP_ERROR_DEVICE, TEMPLATE_NAME
                          ":0: stream_synchronize: simulated device error on a "
                          "stream other than the default one (fault "
                          "side_sync_fails)");
  return on(F_NATIVE) ? ref_stream_synchronize(s) : base()->stream_synchronize(s);
}

/* ---- Memory ------------------------------------------------------------------------------- */

static uint64_t g_leaked_bytes, g_leaked_allocs; /* leak: frees the statistics never see */

static bp_error* ref_mem_free(int32_t device, bp_stream* s, bp_buffer* buf, uint64_t size) {
  int live;
  bp_error* err;
  if (!buf) return NULL;
  pthread_mutex_lock(&g_mu);
  if (on(F_NATIVE)) {
    import_entry* e = import_of(buf);
    if (e) {
      bp_release_fn r = e->release;
      void* ctx = e->ctx;
      e->freed = 1;
      pthread_mutex_unlock(&g_mu);
      if (on(F_NATIVE_BAD) && r) r(ctx); /* the fault: released now and again at the sync */
      return NULL;
    }
  }
  live = buf->stream == NULL || entry_of(buf->stream) != NULL;
  pthread_mutex_unlock(&g_mu);
  if (!live)
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME
                          ":0: mem_free: a buffer allocated on stream %p freed on stream %p after "
                          "its stream was destroyed",
                          (void*)buf->stream, (void*)s);
  err = base()->mem_free(device, s, buf, size);
  if (!err && on(F_LEAK)) {
    __atomic_add_fetch(&g_leaked_bytes, size, __ATOMIC_RELAXED);
    __atomic_add_fetch(&g_leaked_allocs, 1, __ATOMIC_RELAXED);
  }
  return err;
}

static bp_error* ref_memory_stats(int32_t device, bp_memory_stats* out) {
  bp_memory_stats full;
  size_t n;
  bp_error* err;
  memset(&full, 0, sizeof full);
  full.struct_size = sizeof full;
  err = base()->memory_stats(device, &full);
  if (err) return err;
  full.allocated += __atomic_load_n(&g_leaked_bytes, __ATOMIC_RELAXED);
  full.reserved += __atomic_load_n(&g_leaked_bytes, __ATOMIC_RELAXED);
  full.num_allocs += __atomic_load_n(&g_leaked_allocs, __ATOMIC_RELAXED);
  if (full.peak_allocated < full.allocated) full.peak_allocated = full.allocated;
  n = out->struct_size < sizeof full ? out->struct_size : sizeof full;
  if (n > sizeof(size_t))
    memcpy((char*)out + sizeof(size_t), (const char*)&full + sizeof(size_t), n - sizeof(size_t));
  return NULL;
}

static bp_error* ref_memset(bp_stream* s, bp_buffer* b, uint64_t off, int32_t value, uint64_t n) {
  if (on(F_CRASH) && value == 0x5A) {
    volatile uintptr_t bad = 16;
    *(volatile int*)bad = value;
  }
  return base()->memset(s, b, off, value, n);
}

static bp_error* ref_copy_d2d(bp_stream* s, bp_buffer* dst, uint64_t doff, bp_buffer* src,
                              uint64_t soff, uint64_t n) {
  bp_error* err;
  while (on(F_HANG) && n == 4097) sleep_ms(1000);
  err = base()->copy_d2d(s, dst, doff, src, soff, n);
  if (!err && n && on(F_OVERFLOW)) dst->data[doff + n] = 0xEE; /* into the slack at worst */
  return err;
}

static bp_error* ref_mem_alloc_null(int32_t device, bp_stream* s, uint64_t size,
                                    bp_buffer** out_buf) {
  if (size > 0) {
    *out_buf = NULL; /* the fault: no buffer, and no error */
    return NULL;
  }
  return base()->mem_alloc(device, s, size, out_buf);
}

static bp_error* ref_device_properties_bad_name(int32_t device, bp_device_properties* p) {
  bp_error* err = base()->device_properties(device, p);
  if (!err && p->struct_size >= offsetof(bp_device_properties, name) + sizeof p->name)
    snprintf(p->name, sizeof p->name, "Bad \xff\xfe name \"quoted\" \x1b[31mred");
  return err;
}

/* Ignores struct_size: writes the whole struct as this plugin knows it. */
static bp_error* ref_device_properties(int32_t device, bp_device_properties* p) {
  bp_device_properties full;
  bp_error* err;
  memset(&full, 0, sizeof full);
  full.struct_size = sizeof full;
  err = base()->device_properties(device, &full);
  if (err) return err;
  full.struct_size = p->struct_size;
  memcpy(p, &full, sizeof full);
  return NULL;
}

/* ---- Kernels ------------------------------------------------------------------------------ */

/* add f32 computed into the stream's scratch array, created on first use and read back without
 * a lock, as a plugin may have done under the ABI 1.1 sentence "calls on one stream are
 * serialised by the host"; a call waits up to 100 ms for a second one on its stream so that the
 * overlap is certain when the host does call concurrently (Note [Stream threading]). */
static int scratch_add(bp_kernel* k, bp_stream* s, const bp_tensor_desc* in, int32_t nin,
                       const bp_tensor_desc* out, const bp_attr* attrs, int32_t nattrs,
                       bp_error** err) {
  stream_entry* e;
  bp_buffer scratch_buf;
  bp_tensor_desc o = *out;
  struct timespec t0, now;
  int64_t n = template_numel(out);
  pthread_mutex_lock(&g_mu);
  e = entry_of(s);
  pthread_mutex_unlock(&g_mu);
  if (!e || n > SCRATCH_FLOATS || n == 0) return 0; /* not handled here */
  if (!e->scratch) e->scratch = (float*)malloc(SCRATCH_FLOATS * sizeof(float)); /* racy */
  scratch_buf.data = (unsigned char*)e->scratch;
  scratch_buf.size = SCRATCH_FLOATS * sizeof(float);
  scratch_buf.stream = s;
  o.buffer = &scratch_buf;
  o.offset = 0;
  __atomic_add_fetch(&e->inside, 1, __ATOMIC_SEQ_CST);
  *err = base()->launch(k, s, in, nin, &o, 1, attrs, nattrs);
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    long waited;
    clock_gettime(CLOCK_MONOTONIC, &now);
    waited = (now.tv_sec - t0.tv_sec) * 1000L + (now.tv_nsec - t0.tv_nsec) / 1000000L;
    if (__atomic_load_n(&e->inside, __ATOMIC_SEQ_CST) >= 2 || waited >= 100) break;
    sleep_ms(1);
  }
  sleep_ms(2);
  if (!*err) memcpy(out->buffer->data + out->offset, e->scratch, (size_t)n * sizeof(float));
  __atomic_sub_fetch(&e->inside, 1, __ATOMIC_SEQ_CST);
  return 1;
}

/* wrong_conv: conv2d launched with PAD_H one larger than the host sent (an off-by-one in the
 * padding): every window reads the rows one above the right ones, the output shape unchanged.
 * The attributes are copied into the current layout, whatever layout the host used. */
static bp_error* wrong_conv_launch(bp_kernel* k, bp_stream* s, const bp_tensor_desc* in,
                                   int32_t nin, const bp_tensor_desc* out, int32_t nout,
                                   const bp_attr* attrs, int32_t nattrs) {
  bp_attr copy[BP_ATTR_ID_COUNT + 1];
  const size_t stride = nattrs > 0 ? attrs[0].struct_size : sizeof(bp_attr);
  int32_t i, n = 0, padded = 0;
  for (i = 0; i < nattrs && n < BP_ATTR_ID_COUNT; ++i, ++n) {
    const bp_attr* a = (const bp_attr*)((const char*)attrs + (size_t)i * stride);
    memset(&copy[n], 0, sizeof copy[n]);
    memcpy(&copy[n], a, stride < sizeof(bp_attr) ? stride : sizeof(bp_attr));
    copy[n].struct_size = sizeof(bp_attr);
    copy[n].id = bp_attr_get_id(a, stride);
    if (copy[n].id == BP_ATTR_ID_PAD_H) {
      copy[n].i = bp_attr_int(&copy[n]) + 1;
      copy[n].kind = BP_ATTR_INT;
      padded = 1;
    }
  }
  if (!padded) {
    memset(&copy[n], 0, sizeof copy[n]);
    copy[n].struct_size = sizeof(bp_attr);
    copy[n].name = "pad_h";
    copy[n].kind = BP_ATTR_INT;
    copy[n].i = 1;
    copy[n].id = BP_ATTR_ID_PAD_H;
    ++n;
  }
  return base()->launch(k, s, in, nin, out, nout, copy, n);
}

static bp_error* ref_launch(bp_kernel* k, bp_stream* s, const bp_tensor_desc* in, int32_t nin,
                            const bp_tensor_desc* out, int32_t nout, const bp_attr* attrs,
                            int32_t nattrs) {
  bp_error* err;
  int64_t n, i;
  float* y;
  if (on(F_WRONG_CONV) && k->op == BP_OP_CONV2D)
    return wrong_conv_launch(k, s, in, nin, out, nout, attrs, nattrs);
  if (on(F_STREAM_SCRATCH) && k->op == BP_OP_ADD && nout == 1 && out->dtype == BP_DTYPE_F32 &&
      scratch_add(k, s, in, nin, out, attrs, nattrs, &err))
    return err;
  err = base()->launch(k, s, in, nin, out, nout, attrs, nattrs);
  if (err || nout != 1 || (n = template_numel(out)) == 0) return err;
  y = (float*)(out->buffer->data + out->offset);
  if (on(F_WRONG_ADD) && k->op == BP_OP_ADD)
    for (i = 0; i < n; ++i) y[i] += 0.5f;
  if (on(F_XFAIL) && k->op == BP_OP_MUL)
    for (i = 0; i < n; ++i) y[i] *= 1.5f;
  if (on(F_OVERFLOW) && k->op == BP_OP_FILL) y[n] = y[n - 1]; /* one past the dense output */
  if (on(F_OVERFLOW) && k->op == BP_OP_COPY) {
    int64_t last = template_offset_of(out, n - 1);
    y[last + 1] = y[last];
  }
  return NULL;
}

/* xfail: the template's op table with add and mul f32 declared broken. */
static bp_op_table g_xfail_ops;
static void xfail_resolve(void* user, int32_t op, int32_t dtype, bp_op_decl* d) {
  bp_kernel* k = NULL;
  bp_error* err = base()->find_kernel_id(0, op, dtype, &k);
  (void)user;
  d->reason = TEMPLATE_UNSUPPORTED_REASON;
  if (err) {
    template_error_free(err);
    return;
  }
  d->kernel = k;
  d->support = BP_SUPPORT_YES;
  if (dtype == BP_DTYPE_F32 && (op == BP_OP_ADD || op == BP_OP_MUL)) {
    d->support = BP_SUPPORT_EXPECTED_FAIL;
    d->reason = "declared broken by the xfail fault";
  }
}
static bp_error* xfail_list_ops(int32_t device, const bp_op_support** out, int32_t* count) {
  bp_error* err = template_check_device(device, "list_ops");
  if (err) return err;
  *out = g_xfail_ops.list;
  *count = BP_OP_TABLE_SIZE;
  return NULL;
}
static bp_error* ref_init_xfail(void) {
  bp_error* err = ref_init();
  if (!err) bp_op_table_build(&g_xfail_ops, xfail_resolve, NULL);
  return err;
}

/* no_conv: the template's op table without the convolutions and the fused loss, so that a host
 * has to decompose them (im2col and matmul; log_softmax and a gather); the template has no
 * matmul either. */
static bp_op_table g_no_conv_ops;
static int is_conv(int32_t op) {
  return op == BP_OP_CONV2D || op == BP_OP_CONV2D_BACKWARD_INPUT ||
         op == BP_OP_CONV2D_BACKWARD_WEIGHT || op == BP_OP_CROSS_ENTROPY ||
         op == BP_OP_CROSS_ENTROPY_BACKWARD;
}
static void no_conv_resolve(void* user, int32_t op, int32_t dtype, bp_op_decl* d) {
  bp_kernel* k = NULL;
  bp_error* err;
  (void)user;
  d->reason = "switched off by the no_conv fault (reference backend)";
  if (is_conv(op)) return;
  err = base()->find_kernel_id(0, op, dtype, &k);
  if (err) {
    d->reason = TEMPLATE_UNSUPPORTED_REASON;
    template_error_free(err);
    return;
  }
  d->kernel = k;
  d->support = BP_SUPPORT_YES;
}
static bp_error* no_conv_list_ops(int32_t device, const bp_op_support** out, int32_t* count) {
  bp_error* err = template_check_device(device, "list_ops");
  if (err) return err;
  *out = g_no_conv_ops.list;
  *count = BP_OP_TABLE_SIZE;
  return NULL;
}
static bp_error* no_conv_find_kernel_id(int32_t device, int32_t op, int32_t dtype,
                                        bp_kernel** out) {
  const char* reason = "";
  int32_t code;
  bp_error* err = template_check_device(device, "find_kernel");
  if (err) return err;
  code = bp_op_table_find(&g_no_conv_ops, op, dtype, out, &reason);
  if (code != 0)
    return template_error(code,
                          TEMPLATE_NAME ":0: no kernel for op '%s' (number %d) with dtype %s: %s",
                          bp_op_name(op), (int)op, bp_dtype_name(dtype), reason);
  return NULL;
}
static bp_error* no_conv_find_kernel(int32_t device, const char* op, int32_t dtype,
                                     bp_kernel** out) {
  const char* reason = "";
  int32_t code;
  bp_error* err = template_check_device(device, "find_kernel");
  if (err) return err;
  code = bp_op_table_find_name(&g_no_conv_ops, op, dtype, out, &reason);
  if (code != 0)
    return template_error(code, TEMPLATE_NAME ":0: no kernel for op '%s' with dtype %s: %s",
                          op ? op : "(NULL)", bp_dtype_name(dtype), reason);
  return NULL;
}
static bp_error* ref_init_no_conv(void) {
  bp_error* err = ref_init();
  if (!err) bp_op_table_build(&g_no_conv_ops, no_conv_resolve, NULL);
  return err;
}

/* ---- minor1_traps: slots a host must never read -------------------------------------------- */

#define TRAP_MESSAGE TEMPLATE_NAME ": the host called a minor-2 slot of an ABI 1.1 table"
static bp_error* trap_find_kernel_id(int32_t d, int32_t op, int32_t dt, bp_kernel** out) {
  (void)d;
  (void)op;
  (void)dt;
  (void)out;
  return template_error(BP_ERROR_INTERNAL, TRAP_MESSAGE " (find_kernel_id)");
}
static bp_error* trap_buffer_native(bp_buffer* b, uint64_t off, bp_native_buffer* out) {
  (void)b;
  (void)off;
  (void)out;
  return template_error(BP_ERROR_INTERNAL, TRAP_MESSAGE " (buffer_native)");
}
static bp_error* trap_stream_native(bp_stream* s, void** out) {
  (void)s;
  (void)out;
  return template_error(BP_ERROR_INTERNAL, TRAP_MESSAGE " (stream_native)");
}
static bp_error* trap_buffer_import(int32_t d, void* a, uint64_t n, bp_release_fn r, void* c,
                                    bp_buffer** out) {
  (void)d;
  (void)a;
  (void)n;
  (void)r;
  (void)c;
  (void)out;
  return template_error(BP_ERROR_INTERNAL, TRAP_MESSAGE " (buffer_import)");
}
static bp_error* trap_stream_import(int32_t d, void* q, bp_stream** out) {
  (void)d;
  (void)q;
  (void)out;
  return template_error(BP_ERROR_INTERNAL, TRAP_MESSAGE " (stream_import)");
}

/* ---- The table ---------------------------------------------------------------------------- */

static bp_plugin_api g_api;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void build_table(void) {
  const char* spec = getenv("BP_REFERENCE_FAULT");
  parse_faults(spec ? spec : REFERENCE_DEFAULT_FAULT);
  g_api = *base();
  g_api.init = on(F_XFAIL) ? ref_init_xfail : ref_init;
  g_api.stream_create = ref_stream_create;
  g_api.stream_destroy = ref_stream_destroy;
  g_api.mem_free = ref_mem_free;
  if (on(F_LEAK)) g_api.memory_stats = ref_memory_stats;
  if (on(F_CRASH)) g_api.memset = ref_memset;
  if (on(F_HANG | F_OVERFLOW)) g_api.copy_d2d = ref_copy_d2d;
  if (on(F_PROPS)) g_api.device_properties = ref_device_properties;
  if (on(F_WRONG_ADD | F_OVERFLOW | F_XFAIL | F_STREAM_SCRATCH | F_WRONG_CONV))
    g_api.launch = ref_launch;
  if (on(F_XFAIL)) {
    /* find_kernel (by name) stays the template's: the same kernels, whatever their support */
    g_api.list_ops = xfail_list_ops;
  }
  if (on(F_NO_CONV) && !on(F_XFAIL)) {
    g_api.init = ref_init_no_conv;
    g_api.list_ops = no_conv_list_ops;
    g_api.find_kernel_id = no_conv_find_kernel_id;
    g_api.find_kernel = no_conv_find_kernel;
  }
  if (on(F_NATIVE)) {
    g_api.buffer_native = ref_buffer_native;
    g_api.stream_native = ref_stream_native;
    g_api.buffer_import = ref_buffer_import;
    g_api.stream_import = ref_stream_import;
    g_api.stream_synchronize = ref_stream_synchronize;
  }
  if (on(F_SIDE_SYNC)) g_api.stream_synchronize = ref_stream_synchronize_side;
  if (on(F_MINOR0)) { /* an ABI 1.0 table ends before list_ops: the host probes find_kernel */
    g_api.abi_minor = 0;
    g_api.struct_size = BP_API_MINOR1_OFFSET;
    g_api.list_ops = NULL;
    g_api.find_kernel_id = NULL;
  }
  if (on(F_MINOR1_TRAPS)) { /* an ABI 1.1 table ends before the minor-2 slots */
    g_api.abi_minor = 1;
    g_api.struct_size = BP_API_MINOR2_OFFSET;
    g_api.find_kernel_id = trap_find_kernel_id;
    g_api.buffer_native = trap_buffer_native;
    g_api.stream_native = trap_stream_native;
    g_api.buffer_import = trap_buffer_import;
    g_api.stream_import = trap_stream_import;
  }
  if (on(F_ASYNC_FAIL | F_ASYNC_INDEX | F_ASYNC_POISON | F_DEVICE_LOST))
    reference_async_install(&g_api, (on(F_ASYNC_FAIL) ? REF_ASYNC_MUL : 0u) |
                                        (on(F_ASYNC_INDEX) ? REF_ASYNC_INDEX : 0u) |
                                        (on(F_ASYNC_POISON) ? REF_ASYNC_POISON : 0u) |
                                        (on(F_DEVICE_LOST) ? REF_ASYNC_LOST : 0u) |
                                        (on(F_MINOR5) ? REF_ASYNC_MINOR5 : 0u));
  if (on(F_ABI_MAJOR2)) g_api.abi_major = 2;
  if (on(F_BIG_STRUCT)) g_api.struct_size = (size_t)1 << 30;
  if (on(F_NULL_ALLOC)) g_api.mem_alloc = ref_mem_alloc_null;
  if (on(F_BAD_NAME)) g_api.device_properties = ref_device_properties_bad_name;
}

#ifdef REFERENCE_NO_ENTRY
BP_PLUGIN_EXPORT const bp_plugin_api* bp_plugin_get_api_misspelt(uint32_t major, uint32_t minor) {
#else
BP_PLUGIN_EXPORT const bp_plugin_api* bp_plugin_get_api(uint32_t major, uint32_t minor) {
#endif
  (void)major;
  (void)minor;
  pthread_once(&g_once, build_table);
  return &g_api;
}
