/*
 * Error objects for plugins (Note [Error objects] in plugin_abi.h) and the names of every error
 * code, for hosts, plugins and tools alike. Plain C99, header-only, no state: a plugin written in
 * C makes its errors with bp_error_create and frees them in its error_free slot with
 * bp_error_destroy; the C++ SDK (backplane/sdk/plugin_sdk.hpp) uses the same two.
 */
#ifndef BACKPLANE_ERROR_H_
#define BACKPLANE_ERROR_H_

#include <backplane/abi/comm_abi.h>
#include <backplane/abi/plugin_abi.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* "BP_ERROR_OUT_OF_MEMORY", ... for every code of bp_error_code and bp_comm_error_code; NULL for
 * any other value. */
static inline const char* bp_error_code_name(int32_t code) {
  switch (code) {
    case BP_ERROR_INTERNAL:
      return "BP_ERROR_INTERNAL";
    case BP_ERROR_INVALID_ARGUMENT:
      return "BP_ERROR_INVALID_ARGUMENT";
    case BP_ERROR_OUT_OF_MEMORY:
      return "BP_ERROR_OUT_OF_MEMORY";
    case BP_ERROR_UNSUPPORTED:
      return "BP_ERROR_UNSUPPORTED";
    case BP_ERROR_UNAVAILABLE:
      return "BP_ERROR_UNAVAILABLE";
    case BP_ERROR_DEVICE:
      return "BP_ERROR_DEVICE";
    case BP_COMM_ERROR_TIMEOUT:
      return "BP_COMM_ERROR_TIMEOUT";
    case BP_COMM_ERROR_REMOTE:
      return "BP_COMM_ERROR_REMOTE";
    case BP_COMM_ERROR_ABORTED:
      return "BP_COMM_ERROR_ABORTED";
    default:
      return NULL;
  }
}

/* An error object is one allocation: the bp_error (first, so the pointer handed out frees the
 * whole block), a tag, then its message, plugin name and native name. The tag tells the objects
 * of bp_error_create from the static one it returns when even that allocation fails, which
 * bp_error_destroy leaves alone (whichever copy of this header made it). */
#define BP_ERROR_HEAP_TAG 0x42504552u /* "BPER" */
typedef struct bp_error_block {
  bp_error e;
  uint32_t tag;
} bp_error_block;

/* As bp_error_create, with a va_list. */
static inline bp_error* bp_error_vcreate(const char* plugin, int32_t code, const char* native_name,
                                         const char* fmt, va_list ap) {
  static bp_error_block oom = {{sizeof(bp_error), BP_ERROR_OUT_OF_MEMORY,
                                "out of host memory while reporting an error", "", ""},
                               0u};
  va_list ap2;
  int n;
  size_t plugin_len, native_len, message_len;
  bp_error_block* b;
  char* text;
  if (!plugin) plugin = "";
  if (!native_name) native_name = "";
  va_copy(ap2, ap);
  n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  message_len = n > 0 ? (size_t)n : 0;
  plugin_len = strlen(plugin);
  native_len = strlen(native_name);
  b = (bp_error_block*)malloc(sizeof *b + message_len + plugin_len + native_len + 3);
  if (!b) return &oom.e;
  text = (char*)(b + 1);
  if (n > 0)
    vsnprintf(text, message_len + 1, fmt, ap);
  else
    text[0] = '\0';
  memcpy(text + message_len + 1, plugin, plugin_len + 1);
  memcpy(text + message_len + plugin_len + 2, native_name, native_len + 1);
  b->e.struct_size = sizeof(bp_error);
  b->e.code = code;
  b->e.message = text;
  b->e.plugin = text + message_len + 1;
  b->e.native_name = text + message_len + plugin_len + 2;
  b->tag = BP_ERROR_HEAP_TAG;
  return &b->e;
}

/* A new error object of plugin `plugin` with code `code`, vendor error name `native_name` (NULL
 * or "" when there is none) and a printf-formatted message. The caller owns it and frees it with
 * bp_error_destroy. Never returns NULL: when out of memory, a static object saying so. */
static inline bp_error* bp_error_create(const char* plugin, int32_t code, const char* native_name,
                                        const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
static inline bp_error* bp_error_create(const char* plugin, int32_t code, const char* native_name,
                                        const char* fmt, ...) {
  bp_error* e;
  va_list ap;
  va_start(ap, fmt);
  e = bp_error_vcreate(plugin, code, native_name, fmt, ap);
  va_end(ap);
  return e;
}

/* Frees an object of bp_error_create (NULL and the static out-of-memory object are ignored). */
static inline void bp_error_destroy(bp_error* e) {
  if (e && ((bp_error_block*)e)->tag == BP_ERROR_HEAP_TAG) free(e);
}

#ifdef __cplusplus
}
#endif

#endif /* BACKPLANE_ERROR_H_ */
