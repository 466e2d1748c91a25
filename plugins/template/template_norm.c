/*
 * batch_norm, batch_norm_backward and dropout (Note [Op catalogue], minor 4).
 *
 * batch_norm takes x[N,C,L] and per-channel weight, bias, running_mean and running_var (f32
 * for f16 and bf16 inputs, the input's dtype otherwise: template_load/template_store read each
 * tensor by its own dtype). Training computes each channel's mean and biased variance in two
 * passes, writes save_mean and save_invstd, and updates the running statistics in place with
 * the unbiased variance; evaluation normalises with the running statistics.
 *
 * dropout keeps element i when the Philox uniform for (seed, offset + i) is >= p (Note [Philox
 * stream] in philox.h), scaled by 1 / (1 - p); the backward is the same launch on dy.
 */
#include "template.h"

#include <backplane/abi/philox.h>

#include <math.h>
#include <stdlib.h>

static bp_error* batch_norm(const bp_tensor_desc* in, int32_t nin, const bp_tensor_desc* out,
                            int32_t nout, const bp_attr* attrs, int32_t nattrs) {
  const int64_t n = in[0].shape[0], c = in[0].shape[1], l = in[0].shape[2], m = n * l;
  const double eps = template_attr_float(attrs, nattrs, BP_ATTR_ID_EPS, 1e-5);
  const double momentum = template_attr_float(attrs, nattrs, BP_ATTR_ID_MOMENTUM, 0.1);
  const int training = template_attr_int(attrs, nattrs, BP_ATTR_ID_TRAINING, 0) != 0;
  int64_t ch, b, i;
  bp_error* err = template_check_arity(BP_OP_BATCH_NORM, nin, 5, 5, nout, training ? 3 : 1, 3);
  if (err) return err;
  for (ch = 0; ch < c; ++ch) {
    double mean, var, invstd;
    if (training) {
      double sum = 0, sq = 0;
      for (b = 0; b < n; ++b)
        for (i = 0; i < l; ++i) sum += template_load(&in[0], (b * c + ch) * l + i);
      mean = sum / (double)m;
      for (b = 0; b < n; ++b)
        for (i = 0; i < l; ++i) {
          double d = template_load(&in[0], (b * c + ch) * l + i) - mean;
          sq += d * d;
        }
      var = sq / (double)m;
      invstd = 1.0 / sqrt(var + eps);
      template_store(&out[1], ch, mean);
      template_store(&out[2], ch, invstd);
      template_store(&in[3], ch, (1 - momentum) * template_load(&in[3], ch) + momentum * mean);
      template_store(&in[4], ch,
                     (1 - momentum) * template_load(&in[4], ch) +
                         momentum * var * (double)m / (double)(m - 1));
    } else {
      mean = template_load(&in[3], ch);
      invstd = 1.0 / sqrt(template_load(&in[4], ch) + eps);
    }
    {
      const double w = template_load(&in[1], ch), bias = template_load(&in[2], ch);
      for (b = 0; b < n; ++b)
        for (i = 0; i < l; ++i) {
          const int64_t k = (b * c + ch) * l + i;
          template_store(&out[0], k, (template_load(&in[0], k) - mean) * invstd * w + bias);
        }
    }
  }
  return NULL;
}

/* dy, x, weight, save_mean, save_invstd -> dx, dweight, dbias: with xhat = (x - mean) invstd,
 * dbias = sum(dy), dweight = sum(dy xhat), dx = weight invstd (dy - dbias / m - xhat dweight /
 * m) over the m = N L elements of each channel. */
static bp_error* batch_norm_backward(const bp_tensor_desc* in, int32_t nin,
                                     const bp_tensor_desc* out, int32_t nout) {
  const int64_t n = in[1].shape[0], c = in[1].shape[1], l = in[1].shape[2], m = n * l;
  int64_t ch, b, i;
  bp_error* err = template_check_arity(BP_OP_BATCH_NORM_BACKWARD, nin, 5, 5, nout, 3, 3);
  if (err) return err;
  for (ch = 0; ch < c; ++ch) {
    const double w = template_load(&in[2], ch), mean = template_load(&in[3], ch),
                 invstd = template_load(&in[4], ch);
    double dbias = 0, dweight = 0;
    for (b = 0; b < n; ++b)
      for (i = 0; i < l; ++i) {
        const int64_t k = (b * c + ch) * l + i;
        const double dy = template_load(&in[0], k);
        dbias += dy;
        dweight += dy * (template_load(&in[1], k) - mean) * invstd;
      }
    for (b = 0; b < n; ++b)
      for (i = 0; i < l; ++i) {
        const int64_t k = (b * c + ch) * l + i;
        const double xhat = (template_load(&in[1], k) - mean) * invstd;
        const double dy = template_load(&in[0], k);
        template_store(&out[0], k,
                       w * invstd * (dy - dbias / (double)m - xhat * dweight / (double)m));
      }
    template_store(&out[1], ch, dweight);
    template_store(&out[2], ch, dbias);
  }
  return NULL;
}

static bp_error* dropout(const bp_tensor_desc* in, int32_t nin, const bp_tensor_desc* out,
                         int32_t nout, const bp_attr* attrs, int32_t nattrs) {
  const double p = template_attr_float(attrs, nattrs, BP_ATTR_ID_P, 0.5);
  const uint64_t seed = (uint64_t)template_attr_int(attrs, nattrs, BP_ATTR_ID_SEED, 0);
  const uint64_t offset = (uint64_t)template_attr_int(attrs, nattrs, BP_ATTR_ID_OFFSET, 0);
  int64_t i, count = template_numel(out);
  bp_error* err = template_check_arity(BP_OP_DROPOUT, nin, 1, 1, nout, 1, 1);
  if (err) return err;
  for (i = 0; i < count; ++i) {
    const float u = bp_philox_uniform01(seed, offset + (uint64_t)i);
    template_store(out, i, u >= p ? template_load(in, i) / (1.0 - p) : 0.0);
  }
  return NULL;
}

bp_error* template_norm_launch(int32_t op, const bp_tensor_desc* in, int32_t nin,
                               const bp_tensor_desc* out, int32_t nout, const bp_attr* attrs,
                               int32_t nattrs) {
  if (op == BP_OP_BATCH_NORM) return batch_norm(in, nin, out, nout, attrs, nattrs);
  if (op == BP_OP_BATCH_NORM_BACKWARD) return batch_norm_backward(in, nin, out, nout);
  return dropout(in, nin, out, nout, attrs, nattrs);
}
