/*
 * Streams, memory and copies of the template backend: host memory, eager streams.
 */
#define _DEFAULT_SOURCE /* sysconf(_SC_PHYS_PAGES), posix_memalign */
#define _POSIX_C_SOURCE 200809L

#include "template.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Memory statistics of the one device. */
static pthread_mutex_t template_stats_mutex = PTHREAD_MUTEX_INITIALIZER;
static uint64_t template_allocated, template_peak, template_num_allocs;

void template_host_memory(uint64_t* total, uint64_t* available) {
  long page = sysconf(_SC_PAGESIZE);
  long pages = sysconf(_SC_PHYS_PAGES);
  long avail = sysconf(_SC_AVPHYS_PAGES);
  *total = (page > 0 && pages > 0) ? (uint64_t)page * (uint64_t)pages : 0;
  *available = (page > 0 && avail > 0) ? (uint64_t)page * (uint64_t)avail : 0;
}

/* ---- Streams: eager, so synchronising is a no-op ---------------------------------------- */

bp_error* template_stream_create(int32_t device, bp_stream** out_stream) {
  bp_stream* s;
  bp_error* err = template_check_device(device, "stream_create");
  if (err) return err;
  s = (bp_stream*)malloc(sizeof *s);
  if (!s)
    return template_error(BP_ERROR_OUT_OF_MEMORY,
                          TEMPLATE_NAME ":0: stream_create: out of host memory");
  s->device = device;
  *out_stream = s;
  return NULL;
}

bp_error* template_stream_destroy(bp_stream* stream) {
  free(stream);
  return NULL;
}

bp_error* template_stream_synchronize(bp_stream* stream) {
  (void)stream;
  return NULL;
}

/* ---- Allocation ----------------------------------------------------------------------------- */

bp_error* template_mem_alloc(int32_t device, bp_stream* stream, uint64_t size,
                             bp_buffer** out_buf) {
  bp_buffer* b;
  void* data = NULL;
  uint64_t total = 0, available = 0;
  bp_error* err = template_check_device(device, "mem_alloc");
  if (err) return err;
  /* 64 bytes of slack past the end, so that a kernel writing one element too far corrupts
   * padding (which bp-conformance's guard bytes still see), not the heap. A request larger than
   * the machine's memory is refused without asking the C library, which may abort instead of
   * failing (AddressSanitizer's allocator does). */
  if (size > ((uint64_t)1 << 32)) template_host_memory(&total, &available);
  if (size > 0 && (size > (uint64_t)SIZE_MAX - 128 || (total != 0 && size > total) ||
                   posix_memalign(&data, 64, (size_t)((size + 63) / 64 * 64 + 64)) != 0)) {
    template_host_memory(&total, &available);
    return template_error(BP_ERROR_OUT_OF_MEMORY,
                          TEMPLATE_NAME
                          ":0: out of memory allocating %llu bytes (%llu bytes of "
                          "host memory available)",
                          (unsigned long long)size, (unsigned long long)available);
  }
  b = (bp_buffer*)malloc(sizeof *b);
  if (!b) {
    free(data);
    return template_error(BP_ERROR_OUT_OF_MEMORY, TEMPLATE_NAME ":0: out of host memory");
  }
  b->data = (unsigned char*)data;
  b->size = size;
  b->stream = stream;
  pthread_mutex_lock(&template_stats_mutex);
  template_allocated += size;
  template_num_allocs += 1;
  if (template_allocated > template_peak) template_peak = template_allocated;
  pthread_mutex_unlock(&template_stats_mutex);
  *out_buf = b;
  return NULL;
}

bp_error* template_mem_free(int32_t device, bp_stream* stream, bp_buffer* buf, uint64_t size) {
  (void)device;
  (void)size; /* the buffer knows its size */
  if (!buf) return NULL;
  /* The host frees a buffer on the stream it was allocated on (plugin_abi.h, mem_free): a
   * backend with stream-ordered memory depends on it, so the template checks it. */
  if (stream != buf->stream)
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME
                          ":0: mem_free: a buffer allocated on stream %p freed on stream %p",
                          (void*)buf->stream, (void*)stream);
  pthread_mutex_lock(&template_stats_mutex);
  template_allocated -= buf->size;
  template_num_allocs -= 1;
  pthread_mutex_unlock(&template_stats_mutex);
  free(buf->data);
  free(buf);
  return NULL;
}

void* template_mem_host_pointer(bp_buffer* buf) {
  return buf ? buf->data : NULL;
}

bp_error* template_memory_stats(int32_t device, bp_memory_stats* out_stats) {
  bp_memory_stats full;
  size_t n;
  bp_error* err = template_check_device(device, "memory_stats");
  if (err) return err;
  memset(&full, 0, sizeof full);
  pthread_mutex_lock(&template_stats_mutex);
  full.allocated = full.reserved = template_allocated;
  full.peak_allocated = template_peak;
  full.num_allocs = template_num_allocs;
  pthread_mutex_unlock(&template_stats_mutex);
  n = out_stats->struct_size < sizeof full ? out_stats->struct_size : sizeof full;
  if (n > sizeof(size_t))
    memcpy((char*)out_stats + sizeof(size_t), (const char*)&full + sizeof(size_t),
           n - sizeof(size_t));
  return NULL;
}

bp_error* template_memory_reset_peak(int32_t device) {
  bp_error* err = template_check_device(device, "memory_reset_peak");
  if (err) return err;
  pthread_mutex_lock(&template_stats_mutex);
  template_peak = template_allocated;
  pthread_mutex_unlock(&template_stats_mutex);
  return NULL;
}

/* ---- Copies -------------------------------------------------------------------------------- */

/* NULL when [offset, offset + size) lies inside the buffer. */
static bp_error* template_check_range(const bp_buffer* buf, uint64_t offset, uint64_t size,
                                      const char* what) {
  uint64_t have = buf ? buf->size : 0;
  if (size == 0 || (offset <= have && size <= have - offset)) return NULL;
  return template_error(BP_ERROR_INVALID_ARGUMENT,
                        TEMPLATE_NAME
                        ":0: %s: bytes [%llu, %llu) are outside the %llu-byte "
                        "buffer",
                        what, (unsigned long long)offset, (unsigned long long)(offset + size),
                        (unsigned long long)have);
}

bp_error* template_memset(bp_stream* stream, bp_buffer* buf, uint64_t offset, int32_t value,
                          uint64_t size) {
  bp_error* err = template_check_range(buf, offset, size, "memset");
  (void)stream;
  if (err) return err;
  if (size) memset(buf->data + offset, value, (size_t)size);
  return NULL;
}

bp_error* template_copy_h2d(bp_stream* stream, bp_buffer* dst, uint64_t dst_offset, const void* src,
                            uint64_t size) {
  bp_error* err = template_check_range(dst, dst_offset, size, "copy_h2d");
  (void)stream;
  if (err) return err;
  if (size) memcpy(dst->data + dst_offset, src, (size_t)size);
  return NULL;
}

bp_error* template_copy_d2h(bp_stream* stream, void* dst, bp_buffer* src, uint64_t src_offset,
                            uint64_t size) {
  bp_error* err = template_check_range(src, src_offset, size, "copy_d2h");
  (void)stream;
  if (err) return err;
  if (size) memcpy(dst, src->data + src_offset, (size_t)size);
  return NULL;
}

bp_error* template_copy_d2d(bp_stream* stream, bp_buffer* dst, uint64_t dst_offset, bp_buffer* src,
                            uint64_t src_offset, uint64_t size) {
  bp_error* err = template_check_range(dst, dst_offset, size, "copy_d2d (destination)");
  (void)stream;
  if (!err) err = template_check_range(src, src_offset, size, "copy_d2d (source)");
  if (err) return err;
  if (size) memmove(dst->data + dst_offset, src->data + src_offset, (size_t)size);
  return NULL;
}
