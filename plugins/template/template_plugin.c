/*
 * The template backend's bp_plugin_api table and its one exported symbol. This is the only
 * file that touches the table; the slots live in template_memory.c and template_kernels.c.
 */
#include "template.h"

#include <backplane/abi/error.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Errors ------------------------------------------------------------------------------ */

/* Error objects come from backplane/abi/error.h: one allocation each, freed by error_free. */
bp_error* template_error(int32_t code, const char* fmt, ...) {
  bp_error* e;
  va_list ap;
  va_start(ap, fmt);
  e = bp_error_vcreate(TEMPLATE_NAME, code, "", fmt, ap);
  va_end(ap);
  return e;
}

void template_error_free(bp_error* err) {
  bp_error_destroy(err);
}

bp_error* template_check_device(int32_t device, const char* what) {
  if (device == 0) return NULL;
  return template_error(BP_ERROR_INVALID_ARGUMENT,
                        TEMPLATE_NAME ": %s: device %d does not exist (1 device: " TEMPLATE_NAME
                                      ":0)",
                        what, (int)device);
}

/* ---- Identity and devices ---------------------------------------------------------------- */

static bp_error* template_init(void) {
  template_kernels_init();
  return NULL;
}

static int32_t template_device_count(const char** out_reason) {
  *out_reason = "";
  return 1;
}

static bp_error* template_device_properties(int32_t device, bp_device_properties* out) {
  bp_device_properties full;
  size_t n;
  bp_error* err = template_check_device(device, "device_properties");
  if (err) return err;
  if (!out || out->struct_size < sizeof(size_t))
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME ":0: device_properties: no struct or struct_size");
  memset(&full, 0, sizeof full);
  snprintf(full.name, sizeof full.name, "Template host device");
  snprintf(full.vendor, sizeof full.vendor, "Backplane template backend");
  template_host_memory(&full.total_memory, &full.free_memory);
  full.cores = 1;
  full.supports_f64 = 0;   /* no f64 kernels */
  full.unified_memory = 1; /* buffers are host memory: mem_host_pointer returns them */
  full.kind = BP_DEVICE_KIND_CPU;
  /* Fill only what the caller's struct has room for (Note [ABI versioning]). */
  n = out->struct_size < sizeof full ? out->struct_size : sizeof full;
  memcpy((char*)out + sizeof(size_t), (const char*)&full + sizeof(size_t), n - sizeof(size_t));
  return NULL;
}

/* ---- The table --------------------------------------------------------------------------- */

static const bp_plugin_api template_api = {
    .struct_size = sizeof(bp_plugin_api),
    .abi_major = BP_ABI_MAJOR,
    .abi_minor = BP_ABI_MINOR,
    .name = TEMPLATE_NAME,
    .device_type = TEMPLATE_NAME,
    .version = TEMPLATE_VERSION,

    .error_free = template_error_free,
    .init = template_init,
    .shutdown = NULL, /* optional: nothing to release at exit */
    .device_count = template_device_count,
    .device_properties = template_device_properties,

    .stream_create = template_stream_create,
    .stream_destroy = template_stream_destroy,
    .stream_synchronize = template_stream_synchronize,

    /* Optional group left NULL: streams are eager, the host synchronises instead. */
    .event_create = NULL,
    .event_destroy = NULL,
    .event_record = NULL,
    .stream_wait_event = NULL,
    .event_synchronize = NULL,
    .event_elapsed_ms = NULL,

    .mem_alloc = template_mem_alloc,
    .mem_free = template_mem_free,
    .mem_host_pointer = template_mem_host_pointer,
    .memory_stats = template_memory_stats,
    .memory_reset_peak = template_memory_reset_peak,
    .memory_empty_cache = NULL, /* optional: no cache */
    .host_alloc = NULL,         /* optional: the host uses ordinary aligned memory */
    .host_free = NULL,

    .memset = template_memset,
    .copy_h2d = template_copy_h2d,
    .copy_d2h = template_copy_d2h,
    .copy_d2d = template_copy_d2d,
    .copy_peer = NULL, /* optional: one device */

    .find_kernel = template_find_kernel,
    .launch = template_launch,

    .list_ops = template_list_ops,

    .find_kernel_id = template_find_kernel_id,
};

#ifdef TEMPLATE_REFERENCE
const bp_plugin_api* template_api_table(void) {
  return &template_api;
}
#else
/* The one exported symbol. The host compares versions itself and reports a mismatch with both
 * numbers, so the table is returned whatever the host's version. */
BP_PLUGIN_EXPORT const bp_plugin_api* bp_plugin_get_api(uint32_t host_abi_major,
                                                        uint32_t host_abi_minor) {
  (void)host_abi_major;
  (void)host_abi_minor;
  return &template_api;
}
#endif
