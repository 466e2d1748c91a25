/*
 * softmax, log_softmax and their backward ops along AXIS (Note [Op catalogue], minor 4). Each
 * row (the elements along the axis at one outer and inner position) subtracts its maximum
 * before exp, so any finite input gives finite results.
 */
#include "template.h"

#include <math.h>
#include <stdlib.h>

bp_error* template_softmax_launch(int32_t op, const bp_tensor_desc* in, int32_t nin,
                                  const bp_tensor_desc* out, int32_t nout, const bp_attr* attrs,
                                  int32_t nattrs) {
  const int backward = op == BP_OP_SOFTMAX_BACKWARD || op == BP_OP_LOG_SOFTMAX_BACKWARD;
  const int log_form = op == BP_OP_LOG_SOFTMAX || op == BP_OP_LOG_SOFTMAX_BACKWARD;
  const int64_t axis = template_attr_int(attrs, nattrs, BP_ATTR_ID_AXIS, -1);
  int64_t outer = 1, len, inner = 1, o, i, j;
  int32_t d;
  double *x, *dy = NULL, *y;
  bp_error* err = template_check_arity(op, nin, backward ? 2 : 1, backward ? 2 : 1, nout, 1, 1);
  if (err) return err;
  if (axis < 0 || axis >= in[0].rank)
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME
                          ":0: %s: attribute axis %lld is not a dimension of the "
                          "rank-%d input",
                          bp_op_name(op), (long long)axis, (int)in[0].rank);
  for (d = 0; d < in[0].rank; ++d) {
    if (d < axis) outer *= in[0].shape[d];
    if (d > axis) inner *= in[0].shape[d];
  }
  len = in[0].shape[axis];
  x = template_read(&in[0]); /* x, or the forward's output y for the backward ops */
  if (backward) dy = template_read(&in[1]);
  y = template_zeros(template_numel(out));
  if (!x || !y || (backward && !dy)) {
    err = template_out_of_memory(bp_op_name(op));
  } else {
    for (o = 0; o < outer; ++o)
      for (i = 0; i < inner; ++i) {
        const int64_t first = o * len * inner + i; /* element j of the row: first + j * inner */
        double m = -INFINITY, sum = 0;
        if (!backward) {
          for (j = 0; j < len; ++j) m = fmax(m, x[first + j * inner]);
          for (j = 0; j < len; ++j) sum += exp(x[first + j * inner] - m);
          for (j = 0; j < len; ++j) {
            const double v = x[first + j * inner] - m;
            y[first + j * inner] = log_form ? v - log(sum) : exp(v) / sum;
          }
        } else if (!log_form) { /* dx = y (dy - sum(dy y)) */
          for (j = 0; j < len; ++j) sum += dy[first + j * inner] * x[first + j * inner];
          for (j = 0; j < len; ++j)
            y[first + j * inner] = x[first + j * inner] * (dy[first + j * inner] - sum);
        } else { /* dx = dy - exp(y) sum(dy) */
          for (j = 0; j < len; ++j) sum += dy[first + j * inner];
          for (j = 0; j < len; ++j)
            y[first + j * inner] = dy[first + j * inner] - exp(x[first + j * inner]) * sum;
        }
      }
    template_write(out, y);
  }
  free(x);
  free(dy);
  free(y);
  return err;
}
