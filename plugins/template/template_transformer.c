/*
 * The transformer family (Note [Op catalogue], minor 5): layer_norm and its backward, gelu,
 * silu and their backward, embedding and its backward, triu, tril, cumsum, sin, cos and rsqrt.
 * Attention is in template_attention.c. Like the other families, each kernel reads its floating
 * inputs into double arrays, computes in double with plain loops and writes every result once,
 * rounded to the output's dtype.
 */
#include "template.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const double kSqrt2OverPi = 0.79788456080286535588; /* sqrt(2 / pi) */
static const double kInvSqrt2 = 0.70710678118654752440;
static const double kInvSqrt2Pi = 0.39894228040143267794; /* 1 / sqrt(2 pi) */

/* ---- layer_norm ---------------------------------------------------------------------------- */

/* x[M,N] (, weight[N] (, bias[N])) -> y[M,N] (, mean[M], rstd[M]). */
static bp_error* layer_norm(const bp_tensor_desc* in, int32_t nin, const bp_tensor_desc* out,
                            int32_t nout, double eps) {
  int64_t M, N, m, j;
  double *x, *w = NULL, *b = NULL, *y, *mean, *rstd;
  bp_error* err = template_check_arity(BP_OP_LAYER_NORM, nin, 1, 3, nout, 1, 3);
  if (err) return err;
  if (nout == 2)
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME ":0: layer_norm: mean and rstd go together (2 outputs)");
  if (in[0].rank != 2)
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME ":0: layer_norm: x must be [M, N], got rank %d",
                          (int)in[0].rank);
  M = in[0].shape[0];
  N = in[0].shape[1];
  x = template_read(&in[0]);
  if (nin > 1) w = template_read(&in[1]);
  if (nin > 2) b = template_read(&in[2]);
  y = template_zeros(M * N);
  mean = template_zeros(M);
  rstd = template_zeros(M);
  if (!x || (nin > 1 && !w) || (nin > 2 && !b) || !y || !mean || !rstd) {
    err = template_out_of_memory("layer_norm");
  } else {
    for (m = 0; m < M; ++m) {
      const double* row = x + m * N;
      double s = 0, sq = 0;
      for (j = 0; j < N; ++j) s += row[j];
      mean[m] = N ? s / (double)N : 0;
      for (j = 0; j < N; ++j) sq += (row[j] - mean[m]) * (row[j] - mean[m]);
      rstd[m] = 1.0 / sqrt((N ? sq / (double)N : 0) + eps);
      for (j = 0; j < N; ++j) {
        double v = (row[j] - mean[m]) * rstd[m];
        if (w) v *= w[j];
        if (b) v += b[j];
        y[m * N + j] = v;
      }
    }
    template_write(&out[0], y);
    if (nout == 3) {
      template_write(&out[1], mean);
      template_write(&out[2], rstd);
    }
  }
  free(x);
  free(w);
  free(b);
  free(y);
  free(mean);
  free(rstd);
  return err;
}

/* dy[M,N], x[M,N], mean[M], rstd[M] (, weight[N]) -> dx[M,N] (, dweight[N], dbias[N]). */
static bp_error* layer_norm_backward(const bp_tensor_desc* in, int32_t nin,
                                     const bp_tensor_desc* out, int32_t nout) {
  int64_t M, N, m, j;
  double *dy, *x, *mean, *rstd, *w = NULL, *dx, *dw, *db;
  bp_error* err = template_check_arity(BP_OP_LAYER_NORM_BACKWARD, nin, 4, 5, nout, 1, 3);
  if (err) return err;
  if ((nin == 5) != (nout == 3))
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME
                          ":0: layer_norm_backward: dweight and dbias come with weight "
                          "(%d inputs, %d outputs; expected 4 and 1, or 5 and 3)",
                          (int)nin, (int)nout);
  M = in[1].shape[0];
  N = in[1].shape[1];
  dy = template_read(&in[0]);
  x = template_read(&in[1]);
  mean = template_read(&in[2]);
  rstd = template_read(&in[3]);
  if (nin == 5) w = template_read(&in[4]);
  dx = template_zeros(M * N);
  dw = template_zeros(N);
  db = template_zeros(N);
  if (!dy || !x || !mean || !rstd || (nin == 5 && !w) || !dx || !dw || !db) {
    err = template_out_of_memory("layer_norm_backward");
  } else {
    for (m = 0; m < M; ++m) {
      double sg = 0, sgx = 0;
      for (j = 0; j < N; ++j) {
        const double xhat = (x[m * N + j] - mean[m]) * rstd[m];
        const double g = dy[m * N + j] * (w ? w[j] : 1.0);
        sg += g;
        sgx += g * xhat;
        dw[j] += dy[m * N + j] * xhat;
        db[j] += dy[m * N + j];
      }
      for (j = 0; j < N; ++j) {
        const double xhat = (x[m * N + j] - mean[m]) * rstd[m];
        const double g = dy[m * N + j] * (w ? w[j] : 1.0);
        dx[m * N + j] = rstd[m] * (g - sg / (double)N - xhat * sgx / (double)N);
      }
    }
    template_write(&out[0], dx);
    if (nout == 3) {
      template_write(&out[1], dw);
      template_write(&out[2], db);
    }
  }
  free(dy);
  free(x);
  free(mean);
  free(rstd);
  free(w);
  free(dx);
  free(dw);
  free(db);
  return err;
}

/* ---- Activations and the elementwise ops ---------------------------------------------------- */

static double gelu(double x, int tanh_form) {
  if (tanh_form) return 0.5 * x * (1.0 + tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1.0 + erf(x * kInvSqrt2));
}

static double gelu_grad(double x, int tanh_form) {
  if (tanh_form) {
    const double u = kSqrt2OverPi * (x + 0.044715 * x * x * x);
    const double t = tanh(u);
    const double du = kSqrt2OverPi * (1.0 + 3.0 * 0.044715 * x * x);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
  }
  return 0.5 * (1.0 + erf(x * kInvSqrt2)) + x * kInvSqrt2Pi * exp(-0.5 * x * x);
}

static double sigmoid(double x) {
  return 1.0 / (1.0 + exp(-x));
}

/* gelu silu sin cos rsqrt (one input) and gelu_backward silu_backward (x, dy). */
static bp_error* pointwise(int32_t op, const bp_tensor_desc* in, int32_t nin,
                           const bp_tensor_desc* out, int32_t nout, int tanh_form) {
  const int backward = op == BP_OP_GELU_BACKWARD || op == BP_OP_SILU_BACKWARD;
  const int64_t n = template_numel(out);
  int64_t i;
  bp_error* err = template_check_arity(op, nin, backward ? 2 : 1, backward ? 2 : 1, nout, 1, 1);
  if (err) return err;
  for (i = 0; i < n; ++i) {
    /* Strided views (sin, cos, rsqrt): element i of each operand at its own offset. */
    const double x = template_load(&in[0], template_offset_of(&in[0], i));
    double r;
    switch (op) {
      case BP_OP_GELU:
        r = gelu(x, tanh_form);
        break;
      case BP_OP_GELU_BACKWARD:
        r = template_load(&in[1], template_offset_of(&in[1], i)) * gelu_grad(x, tanh_form);
        break;
      case BP_OP_SILU:
        r = x * sigmoid(x);
        break;
      case BP_OP_SILU_BACKWARD: {
        const double s = sigmoid(x);
        r = template_load(&in[1], template_offset_of(&in[1], i)) * s * (1.0 + x * (1.0 - s));
        break;
      }
      case BP_OP_SIN:
        r = sin(x);
        break;
      case BP_OP_COS:
        r = cos(x);
        break;
      default: /* rsqrt */
        r = 1.0 / sqrt(x);
        break;
    }
    template_store(out, template_offset_of(out, i), r);
  }
  return NULL;
}

/* ---- embedding ------------------------------------------------------------------------------ */

static bp_error* check_embedding_indices(int32_t op, const bp_tensor_desc* idx, int64_t V) {
  const int64_t M = template_numel(idx);
  int64_t m;
  if (idx->dtype != BP_DTYPE_I64)
    return template_error(BP_ERROR_INVALID_ARGUMENT, TEMPLATE_NAME ":0: %s: indices must be i64",
                          bp_op_name(op));
  for (m = 0; m < M; ++m) {
    const int64_t t = template_load_int(idx, m);
    if (t < 0 || t >= V)
      return template_error(BP_ERROR_INVALID_ARGUMENT,
                            TEMPLATE_NAME
                            ":0: %s: index %lld at position %lld is out of range for a "
                            "table of %lld rows (valid: 0 to %lld)",
                            bp_op_name(op), (long long)t, (long long)m, (long long)V,
                            (long long)V - 1);
  }
  return NULL;
}

/* weight[V,D], indices[M] -> out[M,D]. */
static bp_error* embedding(const bp_tensor_desc* in, int32_t nin, const bp_tensor_desc* out,
                           int32_t nout) {
  int64_t V, D, M, m, j;
  bp_error* err = template_check_arity(BP_OP_EMBEDDING, nin, 2, 2, nout, 1, 1);
  if (err) return err;
  V = in[0].shape[0];
  D = in[0].shape[1];
  M = template_numel(&in[1]);
  err = check_embedding_indices(BP_OP_EMBEDDING, &in[1], V);
  if (err) return err;
  for (m = 0; m < M; ++m) {
    const int64_t t = template_load_int(&in[1], m);
    for (j = 0; j < D; ++j) template_store(out, m * D + j, template_load(&in[0], t * D + j));
  }
  return NULL;
}

/* dy[M,D], indices[M] -> dweight[V,D]: rows summed in increasing m. */
static bp_error* embedding_backward(const bp_tensor_desc* in, int32_t nin,
                                    const bp_tensor_desc* out, int32_t nout) {
  int64_t V, D, M, m, j;
  double *dy, *dw;
  bp_error* err = template_check_arity(BP_OP_EMBEDDING_BACKWARD, nin, 2, 2, nout, 1, 1);
  if (err) return err;
  V = out->shape[0];
  D = out->shape[1];
  M = template_numel(&in[1]);
  err = check_embedding_indices(BP_OP_EMBEDDING_BACKWARD, &in[1], V);
  if (err) return err;
  dy = template_read(&in[0]);
  dw = template_zeros(V * D);
  if (!dy || !dw) {
    err = template_out_of_memory("embedding_backward");
  } else {
    for (m = 0; m < M; ++m) {
      const int64_t t = template_load_int(&in[1], m);
      for (j = 0; j < D; ++j) dw[t * D + j] += dy[m * D + j];
    }
    template_write(out, dw);
  }
  free(dy);
  free(dw);
  return err;
}

/* ---- triu, tril, cumsum --------------------------------------------------------------------- */

/* Element bytes copied or zeroed: every dtype, NaN payloads kept. */
static bp_error* triangle(int32_t op, const bp_tensor_desc* in, int32_t nin,
                          const bp_tensor_desc* out, int32_t nout, int64_t diagonal) {
  const size_t es = bp_dtype_size(out->dtype);
  const int64_t n = template_numel(out);
  int64_t R, C, i;
  const unsigned char* src;
  unsigned char* dst;
  bp_error* err = template_check_arity(op, nin, 1, 1, nout, 1, 1);
  if (err) return err;
  if (in[0].rank < 2)
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME ":0: %s: the input must have rank >= 2, got %d",
                          bp_op_name(op), (int)in[0].rank);
  if (n == 0) return NULL;
  R = in[0].shape[in[0].rank - 2];
  C = in[0].shape[in[0].rank - 1];
  src = (const unsigned char*)template_mem_host_pointer(in[0].buffer) + in[0].offset;
  dst = (unsigned char*)template_mem_host_pointer(out->buffer) + out->offset;
  for (i = 0; i < n; ++i) {
    const int64_t c = i % C, r = (i / C) % R;
    const int keep = op == BP_OP_TRIU ? c - r >= diagonal : c - r <= diagonal;
    if (keep)
      memcpy(dst + (size_t)i * es, src + (size_t)i * es, es);
    else
      memset(dst + (size_t)i * es, 0, es);
  }
  return NULL;
}

static bp_error* cumsum(const bp_tensor_desc* in, int32_t nin, const bp_tensor_desc* out,
                        int32_t nout, int64_t axis) {
  const int is_float = template_is_float(out->dtype);
  int64_t outer = 1, len, inner = 1, o, i, j;
  int32_t d;
  bp_error* err = template_check_arity(BP_OP_CUMSUM, nin, 1, 1, nout, 1, 1);
  if (err) return err;
  if (axis < 0 || axis >= (in[0].rank ? in[0].rank : 1))
    return template_error(BP_ERROR_INVALID_ARGUMENT,
                          TEMPLATE_NAME
                          ":0: cumsum: attribute axis %lld is not a dimension of the rank-%d "
                          "input",
                          (long long)axis, (int)in[0].rank);
  for (d = 0; d < in[0].rank; ++d) {
    if (d < axis) outer *= in[0].shape[d];
    if (d > axis) inner *= in[0].shape[d];
  }
  len = in[0].rank ? in[0].shape[axis] : 1;
  for (o = 0; o < outer; ++o)
    for (i = 0; i < inner; ++i) {
      double acc = 0;
      uint64_t iacc = 0; /* unsigned: wraps modulo 2^64 without undefined behaviour */
      for (j = 0; j < len; ++j) {
        const int64_t k = (o * len + j) * inner + i;
        if (is_float) {
          acc += template_load(&in[0], k);
          template_store(out, k, acc);
        } else {
          iacc += (uint64_t)template_load_int(&in[0], k);
          template_store_int(out, k, (int64_t)iacc);
        }
      }
    }
  return NULL;
}

bp_error* template_transformer_launch(int32_t op, const bp_tensor_desc* in, int32_t nin,
                                      const bp_tensor_desc* out, int32_t nout, const bp_attr* attrs,
                                      int32_t nattrs) {
  switch (op) {
    case BP_OP_LAYER_NORM:
      return layer_norm(in, nin, out, nout,
                        template_attr_float(attrs, nattrs, BP_ATTR_ID_EPS, 1e-5));
    case BP_OP_LAYER_NORM_BACKWARD:
      return layer_norm_backward(in, nin, out, nout);
    case BP_OP_EMBEDDING:
      return embedding(in, nin, out, nout);
    case BP_OP_EMBEDDING_BACKWARD:
      return embedding_backward(in, nin, out, nout);
    case BP_OP_TRIU:
    case BP_OP_TRIL:
      return triangle(op, in, nin, out, nout,
                      template_attr_int(attrs, nattrs, BP_ATTR_ID_DIAGONAL, 0));
    case BP_OP_CUMSUM:
      return cumsum(in, nin, out, nout, template_attr_int(attrs, nattrs, BP_ATTR_ID_AXIS, -1));
    default:
      return pointwise(
          op, in, nin, out, nout,
          template_attr_int(attrs, nattrs, BP_ATTR_ID_APPROXIMATE, BP_GELU_EXACT) == BP_GELU_TANH);
  }
}
