/*
 * max_dim, min_dim, gather and scatter_add along AXIS (Note [Op catalogue], minor 4), for every
 * dtype of their domains: values are compared as doubles (floating dtypes) or int64 (integer
 * dtypes) and copied bit for bit. A tensor of rank R is seen around its axis as [outer, len,
 * inner]. Every index is checked before anything is written: one outside [0, size) is
 * BP_ERROR_INVALID_ARGUMENT naming it, its position and the size.
 */
#include "template.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The product of shape[lo .. hi). */
static int64_t dims(const bp_tensor_desc* t, int32_t lo, int32_t hi) {
  int64_t n = 1;
  for (; lo < hi; ++lo) n *= t->shape[lo];
  return n;
}

static void copy_element(const bp_tensor_desc* dst, int64_t i, const bp_tensor_desc* src,
                         int64_t j) {
  const size_t size = bp_dtype_size(src->dtype);
  memcpy(dst->buffer->data + dst->offset + (size_t)i * size,
         src->buffer->data + src->offset + (size_t)j * size, size);
}

/* 1 when element a of x beats element b for max (is_max) or min: a NaN beats any number. */
static int beats(const bp_tensor_desc* x, int64_t a, int64_t b, int is_max) {
  if (template_is_float(x->dtype)) {
    const double va = template_load(x, a), vb = template_load(x, b);
    if (isnan(vb)) return 0;
    return isnan(va) || (is_max ? va > vb : va < vb);
  }
  return is_max ? template_load_int(x, a) > template_load_int(x, b)
                : template_load_int(x, a) < template_load_int(x, b);
}

/* x -> values, indices: the first extreme along the axis. */
static bp_error* reduce_dim(int32_t op, const bp_tensor_desc* in, int32_t nin,
                            const bp_tensor_desc* out, int32_t nout, int32_t axis) {
  const int64_t outer = dims(&in[0], 0, axis), len = in[0].shape[axis],
                inner = dims(&in[0], axis + 1, in[0].rank);
  int64_t o, i, j;
  bp_error* err = template_check_arity(op, nin, 1, 1, nout, 2, 2);
  if (err) return err;
  for (o = 0; o < outer; ++o)
    for (i = 0; i < inner; ++i) {
      int64_t best = o * len * inner + i, at = 0;
      for (j = 1; j < len; ++j) {
        const int64_t k = (o * len + j) * inner + i;
        if (beats(&in[0], k, best, op == BP_OP_MAX_DIM)) {
          best = k;
          at = j;
        }
      }
      copy_element(&out[0], o * inner + i, &in[0], best);
      template_store_int(&out[1], o * inner + i, at);
    }
  return NULL;
}

/* The row-major position in `t` of element i of `idx` (same rank) with its axis coordinate
 * replaced by `at`. */
static int64_t target(const bp_tensor_desc* t, const bp_tensor_desc* idx, int32_t axis, int64_t i,
                      int64_t at) {
  int64_t pos = 0, stride = 1;
  int32_t d;
  for (d = idx->rank - 1; d >= 0; --d) {
    const int64_t coord = i % idx->shape[d];
    i /= idx->shape[d];
    pos += (d == axis ? at : coord) * stride;
    stride *= t->shape[d];
  }
  return pos;
}

static bp_error* check_indices(int32_t op, const bp_tensor_desc* index, int64_t size,
                               int32_t axis) {
  int64_t i, n = template_numel(index);
  for (i = 0; i < n; ++i) {
    const int64_t at = template_load_int(index, i);
    if (at < 0 || at >= size)
      return template_error(BP_ERROR_INVALID_ARGUMENT,
                            TEMPLATE_NAME
                            ":0: %s: index %lld at position %lld of the index "
                            "tensor is outside [0, %lld) along axis %d",
                            bp_op_name(op), (long long)at, (long long)i, (long long)size,
                            (int)axis);
  }
  return NULL;
}

/* x, index -> out: out[i] = x[i with its axis coordinate = index[i]]. */
static bp_error* gather(const bp_tensor_desc* in, int32_t nin, const bp_tensor_desc* out,
                        int32_t nout, int32_t axis) {
  int64_t i, n = template_numel(out);
  bp_error* err = template_check_arity(BP_OP_GATHER, nin, 2, 2, nout, 1, 1);
  if (!err) err = check_indices(BP_OP_GATHER, &in[1], in[0].shape[axis], axis);
  if (err) return err;
  for (i = 0; i < n; ++i)
    copy_element(out, i, &in[0], target(&in[0], &in[1], axis, i, template_load_int(&in[1], i)));
  return NULL;
}

/* base, index, src -> out = base, then out[i with axis coordinate index[i]] += src[i] for
 * every i in row-major order, accumulated in double (floats) or int64 (integers, wrapped on
 * store) and rounded once. out may be base (INPLACE): base is read before out is written. */
static bp_error* scatter_add(const bp_tensor_desc* in, int32_t nin, const bp_tensor_desc* out,
                             int32_t nout, int32_t axis) {
  const int is_float = template_is_float(out->dtype);
  int64_t i, n_out = template_numel(out), n_src = template_numel(&in[2]);
  double* acc;
  int64_t* iacc;
  bp_error* err = template_check_arity(BP_OP_SCATTER_ADD, nin, 3, 3, nout, 1, 1);
  if (!err) err = check_indices(BP_OP_SCATTER_ADD, &in[1], in[0].shape[axis], axis);
  if (err) return err;
  acc = (double*)malloc((size_t)(n_out + 1) * sizeof *acc);
  iacc = (int64_t*)malloc((size_t)(n_out + 1) * sizeof *iacc);
  if (!acc || !iacc) {
    free(acc);
    free(iacc);
    return template_out_of_memory("scatter_add");
  }
  for (i = 0; i < n_out; ++i) {
    if (is_float)
      acc[i] = template_load(&in[0], i);
    else
      iacc[i] = template_load_int(&in[0], i);
  }
  for (i = 0; i < n_src; ++i) {
    const int64_t t = target(&in[0], &in[1], axis, i, template_load_int(&in[1], i));
    if (is_float)
      acc[t] += template_load(&in[2], i);
    else /* unsigned: wraps modulo 2^64 without undefined behaviour */
      iacc[t] = (int64_t)((uint64_t)iacc[t] + (uint64_t)template_load_int(&in[2], i));
  }
  for (i = 0; i < n_out; ++i) {
    if (is_float)
      template_store(out, i, acc[i]);
    else
      template_store_int(out, i, iacc[i]);
  }
  free(acc);
  free(iacc);
  return NULL;
}

bp_error* template_index_launch(int32_t op, const bp_tensor_desc* in, int32_t nin,
                                const bp_tensor_desc* out, int32_t nout, const bp_attr* attrs,
                                int32_t nattrs) {
  const int64_t axis = template_attr_int(attrs, nattrs, BP_ATTR_ID_AXIS, -1);
  if (nin < 1 || axis < 0 || axis >= in[0].rank)
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME
                          ":0: %s: attribute axis %lld is not a dimension of the "
                          "rank-%d input",
                          bp_op_name(op), (long long)axis, nin < 1 ? 0 : (int)in[0].rank);
  if (op == BP_OP_GATHER) return gather(in, nin, out, nout, (int32_t)axis);
  if (op == BP_OP_SCATTER_ADD) return scatter_add(in, nin, out, nout, (int32_t)axis);
  return reduce_dim(op, in, nin, out, nout, (int32_t)axis);
}
