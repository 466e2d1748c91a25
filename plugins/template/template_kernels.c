/*
 * Kernels of the template backend: fill, copy, add, mul and sum for f32, on strided views
 * (Note [Op catalogue] in plugin_abi.h), and the convolutional family of minor 4 and the
 * transformer family of minor 5 for every dtype of each op's domain (template_conv.c,
 * template_pool.c, template_norm.c, template_index.c, template_softmax.c,
 * template_transformer.c, template_attention.c, adamw of minor 7 in template_optim.c and
 * cross_entropy of minor 8 in template_loss.c, on the element helpers at the end of this
 * file). Every
 * other (op, dtype) pair of the catalogue is declared BP_SUPPORT_NO.
 *
 * The op table (backplane/op_table.h, Note [Op tables]) is the one declaration of what exists:
 * find_kernel (by name), find_kernel_id (by catalogue number) and list_ops all answer from it.
 * Adding an op: write the loop, add a row to template_kernel_table, and dispatch on it in
 * template_launch. Adding a dtype: accept it in template_resolve and dispatch on kernel and
 * dtype in template_launch.
 */
#include "template.h"

#include <backplane/abi/half.h>
#include <backplane/abi/op_table.h>

#include <stdlib.h>
#include <string.h>

/* ---- The op table ----------------------------------------------------------------------- */

static struct bp_kernel template_kernel_table[] = {{BP_OP_FILL},
                                                   {BP_OP_COPY},
                                                   {BP_OP_ADD},
                                                   {BP_OP_MUL},
                                                   {BP_OP_SUM},
                                                   {BP_OP_CONV2D},
                                                   {BP_OP_CONV2D_BACKWARD_INPUT},
                                                   {BP_OP_CONV2D_BACKWARD_WEIGHT},
                                                   {BP_OP_MAX_POOL2D},
                                                   {BP_OP_MAX_POOL2D_BACKWARD},
                                                   {BP_OP_AVG_POOL2D},
                                                   {BP_OP_AVG_POOL2D_BACKWARD},
                                                   {BP_OP_ADAPTIVE_AVG_POOL2D},
                                                   {BP_OP_ADAPTIVE_AVG_POOL2D_BACKWARD},
                                                   {BP_OP_BATCH_NORM},
                                                   {BP_OP_BATCH_NORM_BACKWARD},
                                                   {BP_OP_DROPOUT},
                                                   {BP_OP_MAX_DIM},
                                                   {BP_OP_MIN_DIM},
                                                   {BP_OP_GATHER},
                                                   {BP_OP_SCATTER_ADD},
                                                   {BP_OP_SOFTMAX},
                                                   {BP_OP_LOG_SOFTMAX},
                                                   {BP_OP_SOFTMAX_BACKWARD},
                                                   {BP_OP_LOG_SOFTMAX_BACKWARD},
                                                   {BP_OP_LAYER_NORM},
                                                   {BP_OP_LAYER_NORM_BACKWARD},
                                                   {BP_OP_GELU},
                                                   {BP_OP_GELU_BACKWARD},
                                                   {BP_OP_SILU},
                                                   {BP_OP_SILU_BACKWARD},
                                                   {BP_OP_EMBEDDING},
                                                   {BP_OP_EMBEDDING_BACKWARD},
                                                   {BP_OP_SCALED_DOT_PRODUCT_ATTENTION},
                                                   {BP_OP_SCALED_DOT_PRODUCT_ATTENTION_BACKWARD},
                                                   {BP_OP_TRIU},
                                                   {BP_OP_TRIL},
                                                   {BP_OP_CUMSUM},
                                                   {BP_OP_SIN},
                                                   {BP_OP_COS},
                                                   {BP_OP_RSQRT},
                                                   {BP_OP_ADAMW},
                                                   {BP_OP_CROSS_ENTROPY},
                                                   {BP_OP_CROSS_ENTROPY_BACKWARD}};
#define TEMPLATE_NUM_KERNELS (sizeof template_kernel_table / sizeof template_kernel_table[0])

static bp_op_table template_ops;

/* The family of an op of minor 4 or 5 (catalogue numbers from BP_OP_CONV2D on), else NULL. */
static template_family_fn template_family(int32_t op) {
  switch (op) {
    case BP_OP_CONV2D:
    case BP_OP_CONV2D_BACKWARD_INPUT:
    case BP_OP_CONV2D_BACKWARD_WEIGHT:
      return template_conv_launch;
    case BP_OP_MAX_POOL2D:
    case BP_OP_MAX_POOL2D_BACKWARD:
    case BP_OP_AVG_POOL2D:
    case BP_OP_AVG_POOL2D_BACKWARD:
    case BP_OP_ADAPTIVE_AVG_POOL2D:
    case BP_OP_ADAPTIVE_AVG_POOL2D_BACKWARD:
      return template_pool_launch;
    case BP_OP_BATCH_NORM:
    case BP_OP_BATCH_NORM_BACKWARD:
    case BP_OP_DROPOUT:
      return template_norm_launch;
    case BP_OP_MAX_DIM:
    case BP_OP_MIN_DIM:
    case BP_OP_GATHER:
    case BP_OP_SCATTER_ADD:
      return template_index_launch;
    case BP_OP_SOFTMAX:
    case BP_OP_LOG_SOFTMAX:
    case BP_OP_SOFTMAX_BACKWARD:
    case BP_OP_LOG_SOFTMAX_BACKWARD:
      return template_softmax_launch;
    case BP_OP_SCALED_DOT_PRODUCT_ATTENTION:
    case BP_OP_SCALED_DOT_PRODUCT_ATTENTION_BACKWARD:
      return template_attention_launch;
    case BP_OP_LAYER_NORM:
    case BP_OP_LAYER_NORM_BACKWARD:
    case BP_OP_GELU:
    case BP_OP_GELU_BACKWARD:
    case BP_OP_SILU:
    case BP_OP_SILU_BACKWARD:
    case BP_OP_EMBEDDING:
    case BP_OP_EMBEDDING_BACKWARD:
    case BP_OP_TRIU:
    case BP_OP_TRIL:
    case BP_OP_CUMSUM:
    case BP_OP_SIN:
    case BP_OP_COS:
    case BP_OP_RSQRT:
      return template_transformer_launch;
    case BP_OP_ADAMW:
      return template_optim_launch;
    case BP_OP_CROSS_ENTROPY:
    case BP_OP_CROSS_ENTROPY_BACKWARD:
      return template_loss_launch;
    default:
      return NULL;
  }
}

/* The resolver: asked once per (op, dtype) of each op's dtype domain. The first five ops are
 * f32 only; the convolutional family takes every dtype it is asked for (its domain). */
static void template_resolve(void* user, int32_t op, int32_t dtype, bp_op_decl* decl) {
  size_t i;
  (void)user;
  decl->reason = TEMPLATE_UNSUPPORTED_REASON;
  if (dtype != BP_DTYPE_F32 && !template_family(op)) return;
  for (i = 0; i < TEMPLATE_NUM_KERNELS; ++i) {
    if (template_kernel_table[i].op == op) {
      decl->kernel = &template_kernel_table[i];
      decl->support = BP_SUPPORT_YES;
    }
  }
}

void template_kernels_init(void) {
  bp_op_table_build(&template_ops, template_resolve, NULL);
}

bp_error* template_list_ops(int32_t device, const bp_op_support** out_list, int32_t* out_count) {
  bp_error* err = template_check_device(device, "list_ops");
  if (err) return err;
  *out_list = template_ops.list;
  *out_count = BP_OP_TABLE_SIZE;
  return NULL;
}

bp_error* template_find_kernel_id(int32_t device, int32_t op, int32_t dtype,
                                  bp_kernel** out_kernel) {
  const char* reason = "";
  int32_t code;
  bp_error* err = template_check_device(device, "find_kernel");
  if (err) return err;
  code = bp_op_table_find(&template_ops, op, dtype, out_kernel, &reason);
  if (code != 0)
    return template_error(code,
                          TEMPLATE_NAME ":0: no kernel for op '%s' (number %d) with dtype %s: %s",
                          bp_op_name(op), (int)op, bp_dtype_name(dtype), reason);
  return NULL;
}

bp_error* template_find_kernel(int32_t device, const char* op, int32_t dtype,
                               bp_kernel** out_kernel) {
  const char* reason = "";
  int32_t code;
  bp_error* err = template_check_device(device, "find_kernel");
  if (err) return err;
  code = bp_op_table_find_name(&template_ops, op, dtype, out_kernel, &reason);
  if (code != 0)
    return template_error(code, TEMPLATE_NAME ":0: no kernel for op '%s' with dtype %s: %s",
                          op ? op : "(NULL)", bp_dtype_name(dtype), reason);
  return NULL;
}

/* ---- Helpers ---------------------------------------------------------------------------- */

int64_t template_numel(const bp_tensor_desc* t) {
  int64_t n = 1;
  int32_t d;
  for (d = 0; d < t->rank; ++d) n *= t->shape[d];
  return n;
}

int64_t template_offset_of(const bp_tensor_desc* t, int64_t i) {
  int64_t off = 0;
  int32_t d;
  for (d = t->rank - 1; d >= 0; --d) {
    off += (i % t->shape[d]) * t->strides[d];
    i /= t->shape[d];
  }
  return off;
}

static float* template_data(const bp_tensor_desc* t) {
  return (float*)(t->buffer->data + t->offset);
}

/* NULL when the descriptor is a tensor of a known dtype (f32 unless `any_dtype`) and rank <=
 * BP_MAX_RANK whose elements lie in its buffer (checked at the extremes: strides are
 * non-negative). */
static bp_error* template_check_tensor(const bp_tensor_desc* t, const char* op, const char* role,
                                       int any_dtype) {
  int64_t n, last = 0;
  int32_t d;
  if (any_dtype ? (t->dtype < 0 || t->dtype >= BP_DTYPE_COUNT) : t->dtype != BP_DTYPE_F32)
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME
                          ":0: %s: %s has dtype %s, "
                          "expected %s",
                          op, role, bp_dtype_name(t->dtype), any_dtype ? "a bp_dtype" : "f32");
  if (t->rank < 0 || t->rank > BP_MAX_RANK)
    return template_error(BP_ERROR_INVALID_ARGUMENT, TEMPLATE_NAME ":0: %s: %s has rank %d", op,
                          role, (int)t->rank);
  n = template_numel(t);
  if (n == 0) return NULL;
  for (d = 0; d < t->rank; ++d) last += (t->shape[d] - 1) * t->strides[d];
  if (!t->buffer || t->offset + (uint64_t)(last + 1) * bp_dtype_size(t->dtype) > t->buffer->size)
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME
                          ":0: %s: %s (%lld elements at byte offset %llu) lies "
                          "outside its buffer",
                          op, role, (long long)n, (unsigned long long)t->offset);
  return NULL;
}

/* ---- Kernels ---------------------------------------------------------------------------- */

static void template_fill(const bp_tensor_desc* out, float value) {
  int64_t i, n = template_numel(out);
  float* y = n ? template_data(out) : NULL;
  for (i = 0; i < n; ++i) y[i] = value;
}

/* copy writes through the output's strides: its output may be a slice of a larger tensor
 * (Note [Op catalogue]); every other op's output is dense. */
static void template_copy(const bp_tensor_desc* in, const bp_tensor_desc* out) {
  int64_t i, n = template_numel(out);
  if (n == 0) return;
  {
    const float* x = template_data(in);
    float* y = template_data(out);
    for (i = 0; i < n; ++i) y[template_offset_of(out, i)] = x[template_offset_of(in, i)];
  }
}

/* out = a OP alpha*b, or a OP scalar (scalar OP a when reverse). alpha is 1 but for add with
 * attribute ALPHA. Safe in place: element i of a is read before element i of out is written. */
static void template_binary(int is_add, const bp_tensor_desc* a, const bp_tensor_desc* b,
                            float alpha, float scalar, int reverse, const bp_tensor_desc* out) {
  int64_t i, n = template_numel(out);
  if (n == 0) return;
  {
    const float* x = template_data(a);
    const float* z = b ? template_data(b) : NULL;
    float* y = template_data(out);
    for (i = 0; i < n; ++i) {
      float l = x[template_offset_of(a, i)];
      float r = z ? alpha * z[template_offset_of(b, i)] : scalar;
      if (!z && reverse) {
        float t = l;
        l = r;
        r = t;
      }
      y[i] = is_add ? l + r : l * r;
    }
  }
}

/* Reduces every dimension where out has size 1 and in does not, accumulating in double. */
static bp_error* template_sum(const bp_tensor_desc* in, const bp_tensor_desc* out) {
  int64_t i, n_in = template_numel(in), n_out = template_numel(out);
  int32_t d;
  double* acc;
  if (in->rank != out->rank)
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME ":0: sum: input rank %d, output rank %d", (int)in->rank,
                          (int)out->rank);
  for (d = 0; d < in->rank; ++d)
    if (out->shape[d] != 1 && out->shape[d] != in->shape[d])
      return template_error(BP_ERROR_INVALID_ARGUMENT,
                            TEMPLATE_NAME ":0: sum: output dim %d is %lld, input %lld", (int)d,
                            (long long)out->shape[d], (long long)in->shape[d]);
  if (n_out == 0) return NULL;
  acc = (double*)calloc((size_t)n_out, sizeof *acc);
  if (!acc)
    return template_error(BP_ERROR_OUT_OF_MEMORY, TEMPLATE_NAME ":0: sum: out of host memory");
  {
    const float* x = n_in ? template_data(in) : NULL;
    float* y = template_data(out);
    for (i = 0; i < n_in; ++i) {
      int64_t rest = i, o = 0, ostride = 1;
      for (d = in->rank - 1; d >= 0; --d) {
        int64_t idx = rest % in->shape[d];
        rest /= in->shape[d];
        if (out->shape[d] != 1) o += idx * ostride;
        ostride *= out->shape[d];
      }
      acc[o] += x[template_offset_of(in, i)];
    }
    for (i = 0; i < n_out; ++i) y[i] = (float)acc[i];
  }
  free(acc);
  return NULL;
}

bp_error* template_launch(bp_kernel* kernel, bp_stream* stream, const bp_tensor_desc* inputs,
                          int32_t num_inputs, const bp_tensor_desc* outputs, int32_t num_outputs,
                          const bp_attr* attrs, int32_t num_attrs) {
  const int32_t id = kernel->op;
  const char* op = bp_op_name(id); /* for messages */
  const bp_tensor_desc* out = outputs;
  int32_t i;
  bp_error* err;
  (void)stream; /* eager: the work is done when launch returns */
  if (template_family(id)) {
    for (i = 0; i < num_inputs; ++i) {
      err = template_check_tensor(&inputs[i], op, "an input", 1);
      if (err) return err;
    }
    for (i = 0; i < num_outputs; ++i) {
      err = template_check_tensor(&outputs[i], op, "an output", 1);
      if (err) return err;
    }
    return template_family(id)(id, inputs, num_inputs, outputs, num_outputs, attrs, num_attrs);
  }
  if (num_outputs != 1)
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME
                          ":0: %s: %d outputs, "
                          "expected 1",
                          op, (int)num_outputs);
  err = template_check_tensor(out, op, "output", 0);
  if (err) return err;
  for (i = 0; i < num_inputs; ++i) {
    err = template_check_tensor(&inputs[i], op, i == 0 ? "input 0" : "input 1", 0);
    if (err) return err;
  }

  if (id == BP_OP_FILL) {
    const bp_attr* v = bp_attr_find(attrs, num_attrs, BP_ATTR_ID_VALUE);
    if (num_inputs != 0 || !v)
      return template_error(BP_ERROR_INVALID_ARGUMENT,
                            TEMPLATE_NAME ":0: fill takes no inputs and attr \"value\"");
    template_fill(out, (float)bp_attr_float(v));
    return NULL;
  }
  if (id == BP_OP_SUM) {
    if (num_inputs != 1)
      return template_error(BP_ERROR_INVALID_ARGUMENT,
                            TEMPLATE_NAME ":0: sum takes 1 input, got %d", (int)num_inputs);
    return template_sum(&inputs[0], out);
  }
  if (id == BP_OP_COPY) {
    if (num_inputs != 1 || inputs[0].rank != out->rank)
      return template_error(BP_ERROR_INVALID_ARGUMENT,
                            TEMPLATE_NAME ":0: copy takes 1 input of the output's rank");
    template_copy(&inputs[0], out);
    return NULL;
  }
  /* add, mul: two inputs, or one and attribute SCALAR (REVERSE = 1: scalar OP a); add with two
   * inputs takes ALPHA (Note [Op catalogue] in plugin_abi.h). */
  {
    const bp_attr* s = bp_attr_find(attrs, num_attrs, BP_ATTR_ID_SCALAR);
    const bp_attr* r = bp_attr_find(attrs, num_attrs, BP_ATTR_ID_REVERSE);
    const bp_attr* alpha = bp_attr_find(attrs, num_attrs, BP_ATTR_ID_ALPHA);
    int is_add = id == BP_OP_ADD;
    int32_t want_inputs = s ? 1 : 2;
    if (num_inputs != want_inputs)
      return template_error(BP_ERROR_INVALID_ARGUMENT,
                            TEMPLATE_NAME ":0: %s takes %d input(s)%s, got %d", op,
                            (int)want_inputs, s ? " with attr \"scalar\"" : "", (int)num_inputs);
    for (i = 0; i < num_inputs; ++i)
      if (inputs[i].rank != out->rank)
        return template_error(BP_ERROR_INVALID_ARGUMENT,
                              TEMPLATE_NAME ":0: %s: input %d has rank %d, output %d", op, (int)i,
                              (int)inputs[i].rank, (int)out->rank);
    template_binary(is_add, &inputs[0], s ? NULL : &inputs[1],
                    is_add && alpha ? (float)bp_attr_float(alpha) : 1.0f,
                    s ? (float)bp_attr_float(s) : 0.0f, r && bp_attr_int(r) == 1, out);
    return NULL;
  }
}

/* ---- Element helpers of the convolutional family (template.h) ---------------------------- */

int template_is_float(int32_t dtype) {
  return dtype == BP_DTYPE_F32 || dtype == BP_DTYPE_F64 || dtype == BP_DTYPE_F16 ||
         dtype == BP_DTYPE_BF16;
}

double template_load(const bp_tensor_desc* t, int64_t i) {
  const unsigned char* p = t->buffer->data + t->offset;
  switch (t->dtype) {
    case BP_DTYPE_F32:
      return ((const float*)p)[i];
    case BP_DTYPE_F64:
      return ((const double*)p)[i];
    case BP_DTYPE_F16:
      return bp_f16_to_float(((const uint16_t*)p)[i]);
    case BP_DTYPE_BF16:
      return bp_bf16_to_float(((const uint16_t*)p)[i]);
    default:
      return (double)template_load_int(t, i);
  }
}

void template_store(const bp_tensor_desc* t, int64_t i, double v) {
  unsigned char* p = t->buffer->data + t->offset;
  switch (t->dtype) {
    case BP_DTYPE_F32:
      ((float*)p)[i] = (float)v;
      break;
    case BP_DTYPE_F64:
      ((double*)p)[i] = v;
      break;
    case BP_DTYPE_F16:
      ((uint16_t*)p)[i] = bp_float_to_f16((float)v);
      break;
    case BP_DTYPE_BF16:
      ((uint16_t*)p)[i] = bp_float_to_bf16((float)v);
      break;
    default:
      template_store_int(t, i, (int64_t)v);
      break;
  }
}

int64_t template_load_int(const bp_tensor_desc* t, int64_t i) {
  const unsigned char* p = t->buffer->data + t->offset;
  switch (t->dtype) {
    case BP_DTYPE_I32:
      return ((const int32_t*)p)[i];
    case BP_DTYPE_I64:
      return ((const int64_t*)p)[i];
    case BP_DTYPE_U8:
    case BP_DTYPE_BOOL:
      return p[i];
    default:
      return (int64_t)template_load(t, i);
  }
}

void template_store_int(const bp_tensor_desc* t, int64_t i, int64_t v) {
  unsigned char* p = t->buffer->data + t->offset;
  switch (t->dtype) {
    case BP_DTYPE_I32:
      ((int32_t*)p)[i] = (int32_t)(uint32_t)v; /* wraps modulo 2^32 */
      break;
    case BP_DTYPE_I64:
      ((int64_t*)p)[i] = v;
      break;
    case BP_DTYPE_U8:
      p[i] = (unsigned char)v; /* wraps modulo 2^8 */
      break;
    case BP_DTYPE_BOOL:
      p[i] = v != 0;
      break;
    default:
      template_store(t, i, (double)v);
      break;
  }
}

double* template_read(const bp_tensor_desc* t) {
  int64_t i, n = template_numel(t);
  double* v = (double*)malloc((size_t)(n + 1) * sizeof *v);
  if (v)
    for (i = 0; i < n; ++i) v[i] = template_load(t, i);
  return v;
}

void template_write(const bp_tensor_desc* t, const double* v) {
  int64_t i, n = template_numel(t);
  for (i = 0; i < n; ++i) template_store(t, i, v[i]);
}

double* template_zeros(int64_t n) {
  return (double*)calloc((size_t)n + 1, sizeof(double));
}

bp_error* template_out_of_memory(const char* op) {
  return template_error(BP_ERROR_OUT_OF_MEMORY, TEMPLATE_NAME ":0: %s: out of host memory", op);
}

int64_t template_attr_int(const bp_attr* attrs, int32_t n, int32_t id, int64_t dflt) {
  const bp_attr* a = bp_attr_find(attrs, n, id);
  return a ? bp_attr_int(a) : dflt;
}

double template_attr_float(const bp_attr* attrs, int32_t n, int32_t id, double dflt) {
  const bp_attr* a = bp_attr_find(attrs, n, id);
  return a ? bp_attr_float(a) : dflt;
}

bp_error* template_check_arity(int32_t op, int32_t nin, int32_t want_in_lo, int32_t want_in_hi,
                               int32_t nout, int32_t want_out_lo, int32_t want_out_hi) {
  if (nin >= want_in_lo && nin <= want_in_hi && nout >= want_out_lo && nout <= want_out_hi)
    return NULL;
  return template_error(BP_ERROR_INVALID_ARGUMENT,
                        TEMPLATE_NAME
                        ":0: %s takes %d to %d inputs and %d to %d outputs, got %d "
                        "and %d",
                        bp_op_name(op), (int)want_in_lo, (int)want_in_hi, (int)want_out_lo,
                        (int)want_out_hi, (int)nin, (int)nout);
}
