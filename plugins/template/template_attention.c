/*
 * scaled_dot_product_attention and its backward (Note [Op catalogue], minor 5), one (batch,
 * head) and one query row at a time: the row's scores, their maximum, the log-sum-exp, then the
 * weighted sum of values. The dropout mask comes from Note [Philox stream] (philox.h), so every
 * device drops the same weights for one seed.
 */
#include "template.h"

#include <backplane/abi/philox.h>

#include <math.h>
#include <stdlib.h>

struct attention_attrs {
  double scale, p;
  int causal;
  uint64_t seed, offset;
};

/* z_ij of Note [Op catalogue]: 0 for a dropped weight, 1 / (1 - p) for a kept one. */
static double keep_scale(const struct attention_attrs* a, int64_t element) {
  if (a->p <= 0) return 1.0;
  return (double)bp_philox_uniform01(a->seed, a->offset + (uint64_t)element) < a->p
             ? 0.0
             : 1.0 / (1.0 - a->p);
}

/* The scores s_ij = scale q_i . k_j of one row (masked ones -inf) into s[S]; returns the row's
 * log-sum-exp. */
static double row_scores(const double* q, const double* k, int64_t i, int64_t S, int64_t E,
                         const struct attention_attrs* a, double* s) {
  double m = -INFINITY, sum = 0;
  int64_t j, e;
  for (j = 0; j < S; ++j) {
    double dot = 0;
    if (a->causal && j > i) {
      s[j] = -INFINITY;
      continue;
    }
    for (e = 0; e < E; ++e) dot += q[i * E + e] * k[j * E + e];
    s[j] = a->scale * dot;
    if (s[j] > m) m = s[j];
  }
  if (m == -INFINITY) return -INFINITY;
  for (j = 0; j < S; ++j) sum += exp(s[j] - m);
  return m + log(sum);
}

static bp_error* check_shapes(int32_t op, const bp_tensor_desc* q, const bp_tensor_desc* k,
                              const bp_tensor_desc* v) {
  if (q->rank != 4 || k->rank != 4 || v->rank != 4 || k->shape[0] != q->shape[0] ||
      v->shape[0] != q->shape[0] || k->shape[1] != q->shape[1] || v->shape[1] != q->shape[1] ||
      k->shape[3] != q->shape[3] || v->shape[2] != k->shape[2])
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME
                          ":0: %s: q [B,H,L,E], k [B,H,S,E] and v [B,H,S,Ev] do not agree",
                          bp_op_name(op));
  return NULL;
}

static void read_attrs(const bp_attr* attrs, int32_t nattrs, int64_t E, struct attention_attrs* a) {
  a->scale = template_attr_float(attrs, nattrs, BP_ATTR_ID_SCALE, E ? 1.0 / sqrt((double)E) : 1.0);
  a->p = template_attr_float(attrs, nattrs, BP_ATTR_ID_P, 0.0);
  a->causal = template_attr_int(attrs, nattrs, BP_ATTR_ID_CAUSAL, 0) != 0;
  a->seed = (uint64_t)template_attr_int(attrs, nattrs, BP_ATTR_ID_SEED, 0);
  a->offset = (uint64_t)template_attr_int(attrs, nattrs, BP_ATTR_ID_OFFSET, 0);
}

/* q, k, v -> out, lse. */
static bp_error* forward(const bp_tensor_desc* in, int32_t nin, const bp_tensor_desc* out,
                         int32_t nout, const bp_attr* attrs, int32_t nattrs) {
  int64_t B, H, L, S, E, Ev, bh, i, j, e;
  double *q, *k, *v, *o, *lse, *s;
  struct attention_attrs a;
  bp_error* err = template_check_arity(BP_OP_SCALED_DOT_PRODUCT_ATTENTION, nin, 3, 3, nout, 2, 2);
  if (!err) err = check_shapes(BP_OP_SCALED_DOT_PRODUCT_ATTENTION, &in[0], &in[1], &in[2]);
  if (err) return err;
  B = in[0].shape[0];
  H = in[0].shape[1];
  L = in[0].shape[2];
  E = in[0].shape[3];
  S = in[1].shape[2];
  Ev = in[2].shape[3];
  read_attrs(attrs, nattrs, E, &a);
  q = template_read(&in[0]);
  k = template_read(&in[1]);
  v = template_read(&in[2]);
  o = template_zeros(B * H * L * Ev);
  lse = template_zeros(B * H * L);
  s = template_zeros(S);
  if (!q || !k || !v || !o || !lse || !s) {
    err = template_out_of_memory("scaled_dot_product_attention");
  } else {
    for (bh = 0; bh < B * H; ++bh) {
      const double* qb = q + bh * L * E;
      const double* kb = k + bh * S * E;
      const double* vb = v + bh * S * Ev;
      for (i = 0; i < L; ++i) {
        const double l = row_scores(qb, kb, i, S, E, &a, s);
        double* orow = o + (bh * L + i) * Ev;
        lse[bh * L + i] = l;
        if (l == -INFINITY) continue;
        for (j = 0; j < S; ++j) {
          const double w = exp(s[j] - l) * keep_scale(&a, (bh * L + i) * S + j);
          if (w == 0) continue;
          for (e = 0; e < Ev; ++e) orow[e] += w * vb[j * Ev + e];
        }
      }
    }
    template_write(&out[0], o);
    template_write(&out[1], lse);
  }
  free(q);
  free(k);
  free(v);
  free(o);
  free(lse);
  free(s);
  return err;
}

/* q, k, v, out, dout, lse -> dq, dk, dv. */
static bp_error* backward(const bp_tensor_desc* in, int32_t nin, const bp_tensor_desc* out,
                          int32_t nout, const bp_attr* attrs, int32_t nattrs) {
  int64_t B, H, L, S, E, Ev, bh, i, j, e;
  double *q, *k, *v, *o, *dout, *lse, *dq, *dk, *dv, *s;
  struct attention_attrs a;
  bp_error* err =
      template_check_arity(BP_OP_SCALED_DOT_PRODUCT_ATTENTION_BACKWARD, nin, 6, 6, nout, 3, 3);
  if (!err) err = check_shapes(BP_OP_SCALED_DOT_PRODUCT_ATTENTION_BACKWARD, &in[0], &in[1], &in[2]);
  if (err) return err;
  B = in[0].shape[0];
  H = in[0].shape[1];
  L = in[0].shape[2];
  E = in[0].shape[3];
  S = in[1].shape[2];
  Ev = in[2].shape[3];
  read_attrs(attrs, nattrs, E, &a);
  q = template_read(&in[0]);
  k = template_read(&in[1]);
  v = template_read(&in[2]);
  o = template_read(&in[3]);
  dout = template_read(&in[4]);
  lse = template_read(&in[5]);
  dq = template_zeros(B * H * L * E);
  dk = template_zeros(B * H * S * E);
  dv = template_zeros(B * H * S * Ev);
  s = template_zeros(S);
  if (!q || !k || !v || !o || !dout || !lse || !dq || !dk || !dv || !s) {
    err = template_out_of_memory("scaled_dot_product_attention_backward");
  } else {
    for (bh = 0; bh < B * H; ++bh) {
      const double* qb = q + bh * L * E;
      const double* kb = k + bh * S * E;
      const double* vb = v + bh * S * Ev;
      for (i = 0; i < L; ++i) {
        const double l = lse[bh * L + i];
        const double* g = dout + (bh * L + i) * Ev;
        const double* orow = o + (bh * L + i) * Ev;
        double D = 0;
        if (l == -INFINITY) continue;
        (void)row_scores(qb, kb, i, S, E, &a, s); /* the saved lse normalises */
        for (e = 0; e < Ev; ++e) D += g[e] * orow[e];
        for (j = 0; j < S; ++j) {
          const double p = exp(s[j] - l);
          const double z = keep_scale(&a, (bh * L + i) * S + j);
          double gv = 0, ds;
          if (p == 0) continue;
          for (e = 0; e < Ev; ++e) {
            gv += g[e] * vb[j * Ev + e];
            dv[(bh * S + j) * Ev + e] += p * z * g[e];
          }
          ds = p * (z * gv - D);
          for (e = 0; e < E; ++e) {
            dq[(bh * L + i) * E + e] += a.scale * ds * kb[j * E + e];
            dk[(bh * S + j) * E + e] += a.scale * ds * qb[i * E + e];
          }
        }
      }
    }
    template_write(&out[0], dq);
    template_write(&out[1], dk);
    template_write(&out[2], dv);
  }
  free(q);
  free(k);
  free(v);
  free(o);
  free(dout);
  free(lse);
  free(dq);
  free(dk);
  free(dv);
  free(s);
  return err;
}

bp_error* template_attention_launch(int32_t op, const bp_tensor_desc* in, int32_t nin,
                                    const bp_tensor_desc* out, int32_t nout, const bp_attr* attrs,
                                    int32_t nattrs) {
  if (op == BP_OP_SCALED_DOT_PRODUCT_ATTENTION) return forward(in, nin, out, nout, attrs, nattrs);
  return backward(in, nin, out, nout, attrs, nattrs);
}
