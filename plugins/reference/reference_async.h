/*
 * The reference backend's asynchronous-error faults (reference_async.c; Note [Asynchronous
 * errors] in plugin_abi.h): work that fails "on the device" after its call returned.
 */
#ifndef BACKPLANE_REFERENCE_ASYNC_H_
#define BACKPLANE_REFERENCE_ASYNC_H_

#include <backplane/abi/plugin_abi.h>

enum {
  REF_ASYNC_MUL = 1 << 0,    /* async_fail: every mul f32 fails on the device (op failed) */
  REF_ASYNC_INDEX = 1 << 1,  /* async_index: an out-of-range index of gather, scatter_add,
                              * embedding(_backward) is found on the device (op failed) */
  REF_ASYNC_POISON = 1 << 2, /* async_poison: as async_index, and the stream is poisoned */
  REF_ASYNC_LOST = 1 << 3,   /* device_lost: as async_index, and the device is lost */
  REF_ASYNC_MINOR5 = 1 << 4  /* minor5: an ABI 1.5 table, without op ids and records */
};

/* Wraps the slots of `api` that the faults in `modes` need; called once, last, when the table
 * is built. Adds op_begin and stream_fault (but with minor5) and events that carry records. */
void reference_async_install(bp_plugin_api* api, unsigned modes);

#endif /* BACKPLANE_REFERENCE_ASYNC_H_ */
