/*
 * Internal contract of the template backend: the pieces template_plugin.c puts into the
 * bp_plugin_api table. Nothing here is exported; the plugin's only exported symbol is
 * bp_plugin_get_api (template_plugin.c).
 *
 * The device is host memory: one device, "template:0"; buffers are 64-byte aligned malloc'd
 * blocks; streams are eager (every call has finished when it returns), so the optional event
 * slots are left NULL and the host applies its default (synchronise the stream).
 *
 * Thread-safety: every function may be called from several threads at once; the only shared
 * state, the memory statistics, is guarded by a mutex in template_memory.c.
 *
 * Rename "template" (the file names, the TEMPLATE_ prefix and the strings in template_plugin.c)
 * when you copy this folder to start a new backend (README.md).
 */
#ifndef BACKPLANE_TEMPLATE_H_
#define BACKPLANE_TEMPLATE_H_

#include <backplane/abi/op_catalogue.h>
#include <backplane/abi/plugin_abi.h>

#include <stdint.h>

#ifndef TEMPLATE_NAME /* the reference backend (plugins/reference) builds these files renamed */
#define TEMPLATE_NAME "template" /* plugin name and device type */
#endif
#define TEMPLATE_VERSION "0.1.0"

/* The opaque handles of plugin_abi.h, completed here. */
struct bp_buffer {
  unsigned char* data; /* 64-byte aligned, 64 bytes of slack past size; NULL for 0 bytes */
  uint64_t size;
  bp_stream* stream; /* the stream it was allocated on: mem_free must name the same one */
};
struct bp_stream {
  int32_t device;
};
struct bp_kernel {
  int32_t op; /* bp_op; an entry of the kernel table in template_kernels.c */
};

/* ---- Errors (template_plugin.c) ---- */

/* Allocates an error object with a printf-formatted message; the caller owns it and frees it
 * with template_error_free. Never returns NULL: out of memory gives a static object. */
bp_error* template_error(int32_t code, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void template_error_free(bp_error* err);
/* NULL when `device` exists, else BP_ERROR_INVALID_ARGUMENT naming `what`. */
bp_error* template_check_device(int32_t device, const char* what);

/* ---- Streams and memory (template_memory.c) ---- */

bp_error* template_stream_create(int32_t device, bp_stream** out_stream);
bp_error* template_stream_destroy(bp_stream* stream);
bp_error* template_stream_synchronize(bp_stream* stream);

bp_error* template_mem_alloc(int32_t device, bp_stream* stream, uint64_t size, bp_buffer** out_buf);
bp_error* template_mem_free(int32_t device, bp_stream* stream, bp_buffer* buf, uint64_t size);
void* template_mem_host_pointer(bp_buffer* buf);
bp_error* template_memory_stats(int32_t device, bp_memory_stats* out_stats);
bp_error* template_memory_reset_peak(int32_t device);
/* Total and currently available host memory in bytes. */
void template_host_memory(uint64_t* total, uint64_t* available);

bp_error* template_memset(bp_stream* stream, bp_buffer* buf, uint64_t offset, int32_t value,
                          uint64_t size);
bp_error* template_copy_h2d(bp_stream* stream, bp_buffer* dst, uint64_t dst_offset, const void* src,
                            uint64_t size);
bp_error* template_copy_d2h(bp_stream* stream, void* dst, bp_buffer* src, uint64_t src_offset,
                            uint64_t size);
bp_error* template_copy_d2d(bp_stream* stream, bp_buffer* dst, uint64_t dst_offset, bp_buffer* src,
                            uint64_t src_offset, uint64_t size);

/* ---- Kernels (template_kernels.c) ---- */

/* Elements of a descriptor (the product of its shape). */
int64_t template_numel(const bp_tensor_desc* t);
/* Element offset of row-major element i of a strided view. */
int64_t template_offset_of(const bp_tensor_desc* t, int64_t i);

/* Why every other (op, dtype) pair is BP_SUPPORT_NO. */
#define TEMPLATE_UNSUPPORTED_REASON                                                         \
  "the " TEMPLATE_NAME                                                                      \
  " backend implements fill, copy, add, mul and sum for f32 only (and "                     \
  "the convolutional and transformer families, adamw and cross_entropy for every dtype of " \
  "their domains)"

/* ---- The convolutional family (Note [Op catalogue], minor 4) ----
 * Every tensor of these ops is dense and every shape was checked by the host. A kernel reads
 * its floating inputs into double arrays (template_read), computes in double with plain loops
 * and writes each result once, rounded to the output's dtype (template_write): one loop nest
 * serves f32, f64, f16 and bf16. Each family's launch returns NULL or an error object. */
typedef bp_error* (*template_family_fn)(int32_t op, const bp_tensor_desc* in, int32_t nin,
                                        const bp_tensor_desc* out, int32_t nout,
                                        const bp_attr* attrs, int32_t nattrs);
bp_error* template_conv_launch(int32_t op, const bp_tensor_desc* in, int32_t nin,
                               const bp_tensor_desc* out, int32_t nout, const bp_attr* attrs,
                               int32_t nattrs); /* template_conv.c */
bp_error* template_pool_launch(int32_t op, const bp_tensor_desc* in, int32_t nin,
                               const bp_tensor_desc* out, int32_t nout, const bp_attr* attrs,
                               int32_t nattrs); /* template_pool.c */
bp_error* template_norm_launch(int32_t op, const bp_tensor_desc* in, int32_t nin,
                               const bp_tensor_desc* out, int32_t nout, const bp_attr* attrs,
                               int32_t nattrs); /* template_norm.c: batch_norm, dropout */
bp_error* template_index_launch(int32_t op, const bp_tensor_desc* in, int32_t nin,
                                const bp_tensor_desc* out, int32_t nout, const bp_attr* attrs,
                                int32_t nattrs); /* template_index.c */
bp_error* template_softmax_launch(int32_t op, const bp_tensor_desc* in, int32_t nin,
                                  const bp_tensor_desc* out, int32_t nout, const bp_attr* attrs,
                                  int32_t nattrs); /* template_softmax.c */
/* The transformer family (Note [Op catalogue], minor 5), with the same conventions. */
bp_error* template_transformer_launch(int32_t op, const bp_tensor_desc* in, int32_t nin,
                                      const bp_tensor_desc* out, int32_t nout, const bp_attr* attrs,
                                      int32_t nattrs); /* template_transformer.c */
bp_error* template_attention_launch(int32_t op, const bp_tensor_desc* in, int32_t nin,
                                    const bp_tensor_desc* out, int32_t nout, const bp_attr* attrs,
                                    int32_t nattrs); /* template_attention.c */
/* The fused optimiser update (Note [Op catalogue], minor 7): adamw. */
bp_error* template_optim_launch(int32_t op, const bp_tensor_desc* in, int32_t nin,
                                const bp_tensor_desc* out, int32_t nout, const bp_attr* attrs,
                                int32_t nattrs); /* template_optim.c */
/* The fused classification loss (Note [Op catalogue], minor 8): cross_entropy and its
 * backward. */
bp_error* template_loss_launch(int32_t op, const bp_tensor_desc* in, int32_t nin,
                               const bp_tensor_desc* out, int32_t nout, const bp_attr* attrs,
                               int32_t nattrs); /* template_loss.c */

/* Element i of a dense tensor as a double (floating dtypes) or an int64 (integer and bool
 * dtypes), and the stores back: floats round to nearest even (f16 and bf16 through float, Note
 * [Conversions]), integers wrap to their width. */
double template_load(const bp_tensor_desc* t, int64_t i);
void template_store(const bp_tensor_desc* t, int64_t i, double v);
int64_t template_load_int(const bp_tensor_desc* t, int64_t i);
void template_store_int(const bp_tensor_desc* t, int64_t i, int64_t v);
int template_is_float(int32_t dtype);
/* All of a dense floating tensor as a malloc'd double array (one spare element, so never NULL
 * but out of memory), and the whole of `v` written to one. */
double* template_read(const bp_tensor_desc* t);
void template_write(const bp_tensor_desc* t, const double* v);
/* A zeroed double array of n elements (never NULL but out of memory). */
double* template_zeros(int64_t n);
bp_error* template_out_of_memory(const char* op);
/* An attribute's value, or `dflt` when the host did not send it. */
int64_t template_attr_int(const bp_attr* attrs, int32_t n, int32_t id, int64_t dflt);
double template_attr_float(const bp_attr* attrs, int32_t n, int32_t id, double dflt);
/* BP_ERROR_INVALID_ARGUMENT unless nin and nout are what `op` takes. */
bp_error* template_check_arity(int32_t op, int32_t nin, int32_t want_in_lo, int32_t want_in_hi,
                               int32_t nout, int32_t want_out_lo, int32_t want_out_hi);

/* Builds the op table (backplane/op_table.h) that find_kernel, find_kernel_id and list_ops
 * answer from; called once from init. */
void template_kernels_init(void);
bp_error* template_find_kernel(int32_t device, const char* op, int32_t dtype,
                               bp_kernel** out_kernel);
bp_error* template_find_kernel_id(int32_t device, int32_t op, int32_t dtype,
                                  bp_kernel** out_kernel);
bp_error* template_launch(bp_kernel* kernel, bp_stream* stream, const bp_tensor_desc* inputs,
                          int32_t num_inputs, const bp_tensor_desc* outputs, int32_t num_outputs,
                          const bp_attr* attrs, int32_t num_attrs);
bp_error* template_list_ops(int32_t device, const bp_op_support** out_list, int32_t* out_count);

#ifdef TEMPLATE_REFERENCE
/* The table, for the reference backend (plugins/reference), which wraps it with its fault
 * switches and exports its own bp_plugin_get_api. A copy of the template never defines this. */
const bp_plugin_api* template_api_table(void);
#endif

#endif /* BACKPLANE_TEMPLATE_H_ */
