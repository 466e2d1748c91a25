/*
 * The fused classification loss (Note [Op catalogue], minor 8; Note [Fused cross entropy]):
 * cross_entropy and cross_entropy_backward over logits x[N, C], one row at a time in double.
 * Every target is checked before anything is written: one outside [0, C) that is not the
 * ignore index fails the launch, naming it, its row and C.
 */
#include "template.h"

#include <math.h>
#include <stdlib.h>

static bp_error* check_targets(int32_t op, const bp_tensor_desc* target, int64_t n, int64_t c,
                               int64_t ignore) {
  int64_t r;
  if (target->dtype != BP_DTYPE_I64)
    return template_error(BP_ERROR_INVALID_ARGUMENT, TEMPLATE_NAME ":0: %s: targets must be i64",
                          bp_op_name(op));
  for (r = 0; r < n; ++r) {
    const int64_t t = template_load_int(target, r);
    if (t != ignore && (t < 0 || t >= c))
      return template_error(BP_ERROR_INVALID_ARGUMENT,
                            TEMPLATE_NAME
                            ":0: %s: target %lld of row %lld is outside [0, %lld) and is not "
                            "the ignore index %lld",
                            bp_op_name(op), (long long)t, (long long)r, (long long)c,
                            (long long)ignore);
  }
  return NULL;
}

/* log sum exp of row[0 .. c), from its maximum. */
static double row_lse(const double* row, int64_t c) {
  double m = -INFINITY, s = 0;
  int64_t j;
  for (j = 0; j < c; ++j) m = fmax(m, row[j]);
  if (isinf(m)) m = 0; /* an infinite maximum: -inf or +inf as torch's logsumexp */
  for (j = 0; j < c; ++j) s += exp(row[j] - m);
  return m + log(s);
}

bp_error* template_loss_launch(int32_t op, const bp_tensor_desc* in, int32_t nin,
                               const bp_tensor_desc* out, int32_t nout, const bp_attr* attrs,
                               int32_t nattrs) {
  const int backward = op == BP_OP_CROSS_ENTROPY_BACKWARD;
  const int64_t ignore = template_attr_int(attrs, nattrs, BP_ATTR_ID_IGNORE_INDEX, -100);
  const double e = template_attr_float(attrs, nattrs, BP_ATTR_ID_LABEL_SMOOTHING, 0.0);
  int64_t n, c, r, j;
  double *x, *lse = NULL, *dloss = NULL, *y;
  bp_error* err = template_check_arity(op, nin, backward ? 4 : 2, backward ? 4 : 2, nout,
                                       backward ? 1 : 2, backward ? 1 : 2);
  if (err) return err;
  if (in[0].rank != 2)
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME ":0: %s: logits must be [N, C], got rank %d",
                          bp_op_name(op), (int)in[0].rank);
  n = in[0].shape[0];
  c = in[0].shape[1];
  err = check_targets(op, &in[1], n, c, ignore);
  if (err) return err;
  x = template_read(&in[0]);
  if (backward) {
    lse = template_read(&in[2]);
    dloss = template_read(&in[3]);
  }
  y = template_zeros(backward ? n * c : 2 * n); /* dx, or loss then lse */
  if (!x || !y || (backward && (!lse || !dloss))) {
    err = template_out_of_memory(bp_op_name(op));
  } else {
    for (r = 0; r < n; ++r) {
      const double* row = x + r * c;
      const int64_t t = template_load_int(&in[1], r);
      if (!backward) {
        double sum = 0;
        y[n + r] = row_lse(row, c);
        if (t == ignore) continue; /* loss 0 */
        /* Without smoothing the row's sum is no term (a -inf logit leaves the loss finite). */
        if (e > 0)
          for (j = 0; j < c; ++j) sum += row[j];
        y[r] = y[n + r] - (1 - e) * row[t] - (e > 0 ? e / (double)c * sum : 0);
      } else if (t != ignore) {
        for (j = 0; j < c; ++j)
          y[r * c + j] = dloss[r] * (exp(row[j] - lse[r]) - (j == t ? 1 - e : 0) - e / (double)c);
      }
    }
    if (backward) {
      template_write(&out[0], y);
    } else {
      template_write(&out[0], y);
      template_write(&out[1], y + n);
    }
  }
  free(x);
  free(lse);
  free(dloss);
  free(y);
  return err;
}
