/*
 * The fused optimiser update (Note [Op catalogue], minor 7; Note [Fused Adam]): adamw over N
 * parameters, each read into double arrays, updated in double with the catalogue's formulas and
 * written back once, rounded to the dtype.
 */
#include "template.h"

#include <math.h>
#include <stdlib.h>

/* One parameter: p, grad, m, v (inputs 4k .. 4k + 3) -> p, m, v (outputs 3k .. 3k + 2). */
static bp_error* adamw_one(const bp_tensor_desc* in, const bp_tensor_desc* out, double lr,
                           double b1, double b2, double eps, double wd, double c1, double c2,
                           int decoupled) {
  const int64_t n = template_numel(&in[0]);
  int64_t i;
  bp_error* err = NULL;
  double* p = template_read(&in[0]);
  double* g = template_read(&in[1]);
  double* m = template_read(&in[2]);
  double* v = template_read(&in[3]);
  if (!p || !g || !m || !v) {
    err = template_out_of_memory("adamw");
  } else {
    for (i = 0; i < n; ++i) {
      double gi = g[i];
      if (decoupled)
        p[i] *= 1.0 - lr * wd;
      else
        gi += wd * p[i];
      m[i] = b1 * m[i] + (1.0 - b1) * gi;
      v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
      p[i] -= lr / c1 * m[i] / (sqrt(v[i]) / sqrt(c2) + eps);
    }
    template_write(&out[0], p);
    template_write(&out[1], m);
    template_write(&out[2], v);
  }
  free(p);
  free(g);
  free(m);
  free(v);
  return err;
}

bp_error* template_optim_launch(int32_t op, const bp_tensor_desc* in, int32_t nin,
                                const bp_tensor_desc* out, int32_t nout, const bp_attr* attrs,
                                int32_t nattrs) {
  const double lr = template_attr_float(attrs, nattrs, BP_ATTR_ID_LR, 1e-3);
  const double b1 = template_attr_float(attrs, nattrs, BP_ATTR_ID_BETA1, 0.9);
  const double b2 = template_attr_float(attrs, nattrs, BP_ATTR_ID_BETA2, 0.999);
  const double eps = template_attr_float(attrs, nattrs, BP_ATTR_ID_EPS, 1e-8);
  const double wd = template_attr_float(attrs, nattrs, BP_ATTR_ID_WEIGHT_DECAY, 0.0);
  const int64_t step = template_attr_int(attrs, nattrs, BP_ATTR_ID_STEP, 0);
  const int decoupled = template_attr_int(attrs, nattrs, BP_ATTR_ID_DECOUPLED, 1) != 0;
  int32_t k;
  if (op != BP_OP_ADAMW || nin < 4 || nin % 4 != 0 || nout != nin / 4 * 3)
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME
                          ":0: adamw: takes 4 N inputs and 3 N outputs, got %d "
                          "and %d",
                          (int)nin, (int)nout);
  if (step < 1)
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME ":0: adamw: step must be >= 1, got %lld", (long long)step);
  for (k = 0; k < nin / 4; ++k) {
    const double c1 = 1.0 - pow(b1, (double)step), c2 = 1.0 - pow(b2, (double)step);
    bp_error* err = adamw_one(in + 4 * k, out + 3 * k, lr, b1, b2, eps, wd, c1, c2, decoupled);
    if (err) return err;
  }
  return NULL;
}
