/*
 * Pooling over NCHW tensors (Note [Op catalogue], minor 4): max_pool2d (values and I64 indices
 * h * W + w of each window's first maximum, a NaN counting as the maximum) and its backward,
 * avg_pool2d (the divisor per COUNT_INCLUDE_PAD, as torch.nn.functional.avg_pool2d) and its
 * backward, adaptive_avg_pool2d and its backward. The host gives the output sizes, so
 * CEIL_MODE needs no code here: a window is clipped to the input wherever it lies.
 */
#include "template.h"

#include <math.h>
#include <stdlib.h>

typedef struct pool_geometry {
  int64_t planes, h, w, p, q; /* planes = N * C; x[planes, H, W], y[planes, P, Q] */
  int64_t kh, kw, sh, sw, ph, pw;
  int adaptive, count_include_pad;
} pool_geometry;

/* The window of output (p, q): rows [h0, h1) and columns [w0, w1) inside the input, and the
 * divisor of its average. */
typedef struct pool_window {
  int64_t h0, h1, w0, w1;
  double divisor;
} pool_window;

static int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}
static int64_t max64(int64_t a, int64_t b) {
  return a > b ? a : b;
}

static pool_window window_of(const pool_geometry* g, int64_t p, int64_t q) {
  pool_window win;
  if (g->adaptive) { /* rows floor(p H / P) .. ceil((p + 1) H / P) - 1, columns likewise */
    win.h0 = p * g->h / g->p;
    win.h1 = ((p + 1) * g->h + g->p - 1) / g->p;
    win.w0 = q * g->w / g->q;
    win.w1 = ((q + 1) * g->w + g->q - 1) / g->q;
    win.divisor = (double)((win.h1 - win.h0) * (win.w1 - win.w0));
  } else {
    /* The window clipped to the padded input, then to the input. */
    int64_t h0 = p * g->sh - g->ph, w0 = q * g->sw - g->pw;
    int64_t h1 = min64(h0 + g->kh, g->h + g->ph), w1 = min64(w0 + g->kw, g->w + g->pw);
    double padded = (double)((h1 - h0) * (w1 - w0));
    win.h0 = max64(h0, 0);
    win.w0 = max64(w0, 0);
    win.h1 = min64(h1, g->h);
    win.w1 = min64(w1, g->w);
    win.divisor = g->count_include_pad ? padded : (double)((win.h1 - win.h0) * (win.w1 - win.w0));
  }
  return win;
}

/* Max pooling: the value and row-major position of each window's maximum. */
static void max_pool(const pool_geometry* g, const double* x, double* y, int64_t* idx) {
  int64_t pl, p, q, h, w;
  for (pl = 0; pl < g->planes; ++pl)
    for (p = 0; p < g->p; ++p)
      for (q = 0; q < g->q; ++q) {
        pool_window win = window_of(g, p, q);
        const double* plane = &x[pl * g->h * g->w];
        double best = 0;
        int64_t at = -1;
        for (h = win.h0; h < win.h1; ++h)
          for (w = win.w0; w < win.w1; ++w) {
            double v = plane[h * g->w + w];
            /* The first maximum; the first NaN beats everything and is never beaten. */
            if (at < 0 || (!isnan(best) && (isnan(v) || v > best))) {
              best = v;
              at = h * g->w + w;
            }
          }
        y[(pl * g->p + p) * g->q + q] = best;
        idx[(pl * g->p + p) * g->q + q] = at;
      }
}

/* Average pooling (forward: y = mean of the window; backward: each window spreads dy /
 * divisor over its elements). */
static void avg_pool(const pool_geometry* g, int backward, double* x, double* y) {
  int64_t pl, p, q, h, w;
  for (pl = 0; pl < g->planes; ++pl)
    for (p = 0; p < g->p; ++p)
      for (q = 0; q < g->q; ++q) {
        pool_window win = window_of(g, p, q);
        double* plane = &x[pl * g->h * g->w];
        double* out = &y[(pl * g->p + p) * g->q + q];
        double sum = 0;
        for (h = win.h0; h < win.h1; ++h)
          for (w = win.w0; w < win.w1; ++w) {
            if (backward)
              plane[h * g->w + w] += *out / win.divisor;
            else
              sum += plane[h * g->w + w];
          }
        if (!backward) *out = sum / win.divisor;
      }
}

bp_error* template_pool_launch(int32_t op, const bp_tensor_desc* in, int32_t nin,
                               const bp_tensor_desc* out, int32_t nout, const bp_attr* attrs,
                               int32_t nattrs) {
  const int backward = op == BP_OP_MAX_POOL2D_BACKWARD || op == BP_OP_AVG_POOL2D_BACKWARD ||
                       op == BP_OP_ADAPTIVE_AVG_POOL2D_BACKWARD;
  const bp_tensor_desc* xd = backward ? &out[0] : &in[0];
  const bp_tensor_desc* yd = backward ? &in[0] : &out[0];
  pool_geometry g;
  double *x = NULL, *y = NULL;
  int64_t* idx = NULL;
  int64_t i, n_x, n_y;
  bp_error* err =
      template_check_arity(op, nin, 1, op == BP_OP_MAX_POOL2D_BACKWARD ? 2 : 1, nout,
                           op == BP_OP_MAX_POOL2D ? 2 : 1, op == BP_OP_MAX_POOL2D ? 2 : 1);
  if (err) return err;
  g.planes = xd->shape[0] * xd->shape[1];
  g.h = xd->shape[2];
  g.w = xd->shape[3];
  g.p = yd->shape[2];
  g.q = yd->shape[3];
  g.adaptive = op == BP_OP_ADAPTIVE_AVG_POOL2D || op == BP_OP_ADAPTIVE_AVG_POOL2D_BACKWARD;
  g.kh = template_attr_int(attrs, nattrs, BP_ATTR_ID_KERNEL_H, 1);
  g.kw = template_attr_int(attrs, nattrs, BP_ATTR_ID_KERNEL_W, 1);
  g.sh = template_attr_int(attrs, nattrs, BP_ATTR_ID_STRIDE_H, g.kh);
  g.sw = template_attr_int(attrs, nattrs, BP_ATTR_ID_STRIDE_W, g.kw);
  g.ph = template_attr_int(attrs, nattrs, BP_ATTR_ID_PAD_H, 0);
  g.pw = template_attr_int(attrs, nattrs, BP_ATTR_ID_PAD_W, 0);
  g.count_include_pad = template_attr_int(attrs, nattrs, BP_ATTR_ID_COUNT_INCLUDE_PAD, 1) != 0;
  n_x = template_numel(xd);
  n_y = template_numel(yd);

  x = backward ? template_zeros(n_x) : template_read(xd);
  y = backward ? template_read(yd) : template_zeros(n_y);
  idx = (int64_t*)malloc((size_t)(n_y + 1) * sizeof *idx);
  if (!x || !y || !idx) {
    err = template_out_of_memory(bp_op_name(op));
  } else if (op == BP_OP_MAX_POOL2D) {
    max_pool(&g, x, y, idx);
    template_write(&out[0], y);
    for (i = 0; i < n_y; ++i) template_store_int(&out[1], i, idx[i]);
  } else if (op == BP_OP_MAX_POOL2D_BACKWARD) {
    /* dx[plane, indices[plane, p, q]] += dy[plane, p, q], in row-major (p, q) order. */
    for (i = 0; i < n_y && !err; ++i) {
      int64_t at = template_load_int(&in[1], i);
      if (at < 0 || at >= g.h * g.w)
        err = template_error(BP_ERROR_INVALID_ARGUMENT,
                             TEMPLATE_NAME
                             ":0: max_pool2d_backward: index %lld at position %lld "
                             "is outside [0, %lld)",
                             (long long)at, (long long)i, (long long)(g.h * g.w));
      else
        x[(i / (g.p * g.q)) * g.h * g.w + at] += y[i];
    }
    if (!err) template_write(&out[0], x);
  } else {
    avg_pool(&g, backward, x, y);
    template_write(&out[0], backward ? x : y);
  }
  free(x);
  free(y);
  free(idx);
  return err;
}
