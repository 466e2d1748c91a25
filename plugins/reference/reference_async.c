/*
 * The reference backend's asynchronous-error faults (reference_async.h). The backend is eager,
 * so "on the device" is simulated: a failing launch runs (or is refused by the template's own
 * checks), returns no error, and leaves the failure in its stream's record (Note [Asynchronous
 * errors] in plugin_abi.h) for the next synchronisation, host read or event. Events are added
 * (the template has none): an event is the record of its stream at record time.
 */
#include "reference_async.h"

#include "template.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bp_plugin_api g_next; /* the slots wrapped here, as the table had them */
static unsigned g_modes;
static __thread uint64_t t_op_id; /* op_begin's id for this thread's next queuing call */

typedef struct record_entry {
  bp_stream* stream;
  bp_stream_fault rec;
  uint64_t last_done; /* the op id of the newest work that ran without failing */
} record_entry;
#define MAX_RECORDS 256
static record_entry g_records[MAX_RECORDS]; /* guarded by g_rmu */
static bp_stream_fault g_lost;              /* device_lost: the loss, once it happened */
static pthread_mutex_t g_rmu = PTHREAD_MUTEX_INITIALIZER;

struct bp_event {
  bp_stream_fault rec; /* the record of the stream it was last recorded on */
};

static record_entry* record_of(bp_stream* s) { /* under g_rmu; NULL when not tracked */
  int i;
  for (i = 0; i < MAX_RECORDS; ++i)
    if (g_records[i].stream == s) return &g_records[i];
  return NULL;
}

/* The stream's record as the host sees it: a lost device beats it. Under g_rmu. */
static bp_stream_fault current(bp_stream* s) {
  bp_stream_fault none;
  record_entry* e;
  if (g_lost.severity) return g_lost;
  e = s ? record_of(s) : NULL;
  if (e) return e->rec;
  memset(&none, 0, sizeof none);
  return none;
}

static uint64_t take_op_id(void) {
  uint64_t id = t_op_id;
  t_op_id = 0;
  return id;
}

static void ra_op_begin(uint64_t op_id) {
  t_op_id = op_id;
}

/* Keeps the first failure of stream `s` (a loss: of the device). */
static void set_fault(bp_stream* s, int32_t severity, int32_t code, uint64_t op_id,
                      const char* message) {
  bp_stream_fault* r;
  record_entry* e;
  pthread_mutex_lock(&g_rmu);
  e = record_of(s);
  r = severity == BP_FAULT_DEVICE_LOST ? &g_lost : (e ? &e->rec : NULL);
  if (r && r->severity == BP_FAULT_NONE) {
    r->code = code;
    r->op_id = op_id;
    r->last_completed_op_id = e ? e->last_done : 0;
    snprintf(r->message, sizeof r->message, "%s", message);
    r->native_name[0] = '\0';
  }
  if (r && severity > r->severity) r->severity = severity;
  pthread_mutex_unlock(&g_rmu);
}

static bp_error* record_error(const bp_stream_fault* r) {
  return template_error(r->code, "%s", r->message);
}

/* Before a queuing call: the device's loss is an error, a poisoned stream skips the work
 * (*skip set), otherwise the call runs. */
static bp_error* before_queue(bp_stream* s, int* skip) {
  bp_stream_fault r;
  *skip = 0;
  pthread_mutex_lock(&g_rmu);
  r = current(s);
  pthread_mutex_unlock(&g_rmu);
  if (r.severity == BP_FAULT_DEVICE_LOST)
    return template_error(BP_ERROR_DEVICE, TEMPLATE_NAME ":0: the device was lost earlier: %s",
                          r.message);
  *skip = r.severity == BP_FAULT_STREAM_POISONED;
  return NULL;
}

static void ran(bp_stream* s, uint64_t op_id) {
  record_entry* e;
  pthread_mutex_lock(&g_rmu);
  e = record_of(s);
  if (e && op_id) e->last_done = op_id;
  pthread_mutex_unlock(&g_rmu);
}

/* ---- Streams ------------------------------------------------------------------------------ */

static bp_error* ra_stream_create(int32_t device, bp_stream** out) {
  record_entry* e;
  bp_error* err = NULL;
  int skip;
  if ((err = before_queue(NULL, &skip))) return err;
  err = g_next.stream_create(device, out);
  if (err) return err;
  pthread_mutex_lock(&g_rmu);
  e = record_of(NULL);
  if (e) {
    memset(e, 0, sizeof *e);
    e->stream = *out;
  }
  pthread_mutex_unlock(&g_rmu);
  return NULL; /* more than MAX_RECORDS streams: the extra ones keep no record */
}

static bp_error* ra_stream_destroy(bp_stream* s) {
  record_entry* e;
  pthread_mutex_lock(&g_rmu);
  e = record_of(s);
  if (e) e->stream = NULL;
  pthread_mutex_unlock(&g_rmu);
  return g_next.stream_destroy(s);
}

/* With a record: fails while it is set (the host clears it with stream_fault). Without
 * (minor5): fails once and clears it, as plugins before 1.6 do. */
static bp_error* ra_stream_synchronize(bp_stream* s) {
  bp_stream_fault r;
  pthread_mutex_lock(&g_rmu);
  r = current(s);
  if ((g_modes & REF_ASYNC_MINOR5) && r.severity != BP_FAULT_DEVICE_LOST) {
    record_entry* e = record_of(s);
    if (e) memset(&e->rec, 0, sizeof e->rec);
  }
  pthread_mutex_unlock(&g_rmu);
  if (r.severity) return record_error(&r);
  return g_next.stream_synchronize(s);
}

static bp_error* ra_stream_fault(bp_stream* s, int32_t clear, bp_stream_fault* out) {
  bp_stream_fault r;
  size_t n;
  if (!s || !out || out->struct_size < sizeof(size_t))
    return template_error(BP_ERROR_INVALID_ARGUMENT, TEMPLATE_NAME
                          ":0: stream_fault: NULL stream or out_fault, or no "
                          "struct_size");
  pthread_mutex_lock(&g_rmu);
  r = current(s);
  if (clear && !g_lost.severity) {
    record_entry* e = record_of(s);
    if (e) memset(&e->rec, 0, sizeof e->rec);
  }
  pthread_mutex_unlock(&g_rmu);
  r.struct_size = sizeof r;
  n = out->struct_size < sizeof r ? out->struct_size : sizeof r;
  memcpy((char*)out + sizeof(size_t), (const char*)&r + sizeof(size_t), n - sizeof(size_t));
  return NULL;
}

/* ---- Events: a copy of the stream's record ------------------------------------------------ */

static bp_error* ra_event_create(int32_t device, bp_event** out) {
  bp_error* err = template_check_device(device, "event_create");
  if (err) return err;
  if (!out)
    return template_error(BP_ERROR_INVALID_ARGUMENT, TEMPLATE_NAME ":0: event_create: NULL out");
  *out = (bp_event*)calloc(1, sizeof **out);
  if (!*out) return template_error(BP_ERROR_OUT_OF_MEMORY, TEMPLATE_NAME ":0: out of memory");
  return NULL;
}

static bp_error* ra_event_destroy(bp_event* e) {
  free(e);
  return NULL;
}

static bp_error* ra_event_record(bp_event* e, bp_stream* s) {
  if (!e || !s)
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME ":0: event_record: NULL event or stream");
  pthread_mutex_lock(&g_rmu);
  e->rec = current(s);
  pthread_mutex_unlock(&g_rmu);
  return NULL;
}

static bp_error* ra_stream_wait_event(bp_stream* s, bp_event* e) {
  bp_stream_fault r;
  if (!e || !s)
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME ":0: stream_wait_event: NULL event or stream");
  pthread_mutex_lock(&g_rmu);
  r = e->rec;
  pthread_mutex_unlock(&g_rmu);
  if (r.severity) /* the waiter would read what the failed op did not write */
    set_fault(s, r.severity > BP_FAULT_STREAM_POISONED ? r.severity : BP_FAULT_STREAM_POISONED,
              r.code, r.op_id, r.message);
  return NULL;
}

static bp_error* ra_event_synchronize(bp_event* e) {
  bp_stream_fault r;
  if (!e)
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME ":0: event_synchronize: NULL event");
  pthread_mutex_lock(&g_rmu);
  r = g_lost.severity ? g_lost : e->rec;
  pthread_mutex_unlock(&g_rmu);
  return r.severity ? record_error(&r) : NULL;
}

/* ---- Work --------------------------------------------------------------------------------- */

static int is_index_op(int32_t op) {
  return op == BP_OP_GATHER || op == BP_OP_SCATTER_ADD || op == BP_OP_EMBEDDING ||
         op == BP_OP_EMBEDDING_BACKWARD || op == BP_OP_CROSS_ENTROPY ||
         op == BP_OP_CROSS_ENTROPY_BACKWARD;
}

static bp_error* ra_launch(bp_kernel* k, bp_stream* s, const bp_tensor_desc* in, int32_t nin,
                           const bp_tensor_desc* out, int32_t nout, const bp_attr* attrs,
                           int32_t nattrs) {
  const uint64_t id = take_op_id();
  int skip;
  bp_error* err = before_queue(s, &skip);
  if (err || skip) return err;
  err = g_next.launch(k, s, in, nin, out, nout, attrs, nattrs);
  if (!err && (g_modes & REF_ASYNC_MUL) && k->op == BP_OP_MUL) {
    set_fault(s, BP_FAULT_OP_FAILED, BP_ERROR_INTERNAL, id,
              TEMPLATE_NAME
              ":0: simulated asynchronous fault of a mul launched earlier on this "
              "stream (fault async_fail)");
    return NULL;
  }
  if (err && err->code == BP_ERROR_INVALID_ARGUMENT && is_index_op(k->op) &&
      (g_modes & (REF_ASYNC_INDEX | REF_ASYNC_POISON | REF_ASYNC_LOST))) {
    char msg[512];
    const int lost = (g_modes & REF_ASYNC_LOST) != 0;
    snprintf(msg, sizeof msg, "%s (found on the device: fault %s)",
             err->message ? err->message : "",
             lost                           ? "device_lost"
             : (g_modes & REF_ASYNC_POISON) ? "async_poison"
                                            : "async_index");
    template_error_free(err);
    set_fault(s,
              lost                           ? BP_FAULT_DEVICE_LOST
              : (g_modes & REF_ASYNC_POISON) ? BP_FAULT_STREAM_POISONED
                                             : BP_FAULT_OP_FAILED,
              lost ? BP_ERROR_DEVICE : BP_ERROR_INVALID_ARGUMENT, id, msg);
    return NULL;
  }
  if (!err) ran(s, id);
  return err;
}

static bp_error* ra_memset(bp_stream* s, bp_buffer* b, uint64_t off, int32_t v, uint64_t n) {
  const uint64_t id = take_op_id();
  int skip;
  bp_error* err = before_queue(s, &skip);
  if (err || skip) return err;
  err = g_next.memset(s, b, off, v, n);
  if (!err) ran(s, id);
  return err;
}

static bp_error* ra_copy_h2d(bp_stream* s, bp_buffer* dst, uint64_t doff, const void* src,
                             uint64_t n) {
  const uint64_t id = take_op_id();
  int skip;
  bp_error* err = before_queue(s, &skip);
  if (err || skip) return err;
  err = g_next.copy_h2d(s, dst, doff, src, n);
  if (!err) ran(s, id);
  return err;
}

/* A host read: it waits for the stream, so it reports the record (a poisoned stream's too). */
static bp_error* ra_copy_d2h(bp_stream* s, void* dst, bp_buffer* src, uint64_t soff, uint64_t n) {
  const uint64_t id = take_op_id();
  bp_stream_fault r;
  bp_error* err;
  pthread_mutex_lock(&g_rmu);
  r = current(s);
  pthread_mutex_unlock(&g_rmu);
  if (r.severity && !(g_modes & REF_ASYNC_MINOR5)) return record_error(&r);
  err = g_next.copy_d2h(s, dst, src, soff, n);
  if (!err) ran(s, id);
  return err;
}

static bp_error* ra_copy_d2d(bp_stream* s, bp_buffer* dst, uint64_t doff, bp_buffer* src,
                             uint64_t soff, uint64_t n) {
  const uint64_t id = take_op_id();
  int skip;
  bp_error* err = before_queue(s, &skip);
  if (err || skip) return err;
  err = g_next.copy_d2d(s, dst, doff, src, soff, n);
  if (!err) ran(s, id);
  return err;
}

static bp_error* ra_mem_alloc(int32_t device, bp_stream* s, uint64_t size, bp_buffer** out) {
  int skip;
  bp_error* err = before_queue(NULL, &skip);
  return err ? err : g_next.mem_alloc(device, s, size, out);
}

void reference_async_install(bp_plugin_api* api, unsigned modes) {
  g_modes = modes;
  g_next = *api;
  api->stream_create = ra_stream_create;
  api->stream_destroy = ra_stream_destroy;
  api->stream_synchronize = ra_stream_synchronize;
  api->launch = ra_launch;
  api->memset = ra_memset;
  api->copy_h2d = ra_copy_h2d;
  api->copy_d2h = ra_copy_d2h;
  api->copy_d2d = ra_copy_d2d;
  api->mem_alloc = ra_mem_alloc;
  if (!api->event_create) {
    api->event_create = ra_event_create;
    api->event_destroy = ra_event_destroy;
    api->event_record = ra_event_record;
    api->stream_wait_event = ra_stream_wait_event;
    api->event_synchronize = ra_event_synchronize;
  }
  if (modes & REF_ASYNC_MINOR5) { /* an ABI 1.5 table: no op ids, no record */
    api->abi_minor = 5;
    api->struct_size = BP_API_MINOR6_OFFSET;
    api->op_begin = NULL;
    api->stream_fault = NULL;
  } else {
    api->op_begin = ra_op_begin;
    api->stream_fault = ra_stream_fault;
  }
}
