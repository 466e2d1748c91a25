/*
 * conv2d and its two backward ops (Note [Op catalogue], minor 4): the cross-correlation of
 * torch.nn.functional.conv2d over NCHW tensors, with stride, zero padding, dilation and groups,
 * as direct loops in double. One loop nest visits every product x[n, c, h, w] * w[k, c', r, s]
 * of the forward; the three ops differ only in which factor is the unknown.
 */
#include "template.h"

#include <stdlib.h>

/* The geometry of one launch: x[N,C,H,W], w[K,C/G,R,S], y[N,K,P,Q]. */
typedef struct conv_geometry {
  int64_t n, c, h, w, k, r, s, p, q, groups, cg, kg;
  int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
} conv_geometry;

static conv_geometry conv_geometry_of(const bp_tensor_desc* x, const bp_tensor_desc* w,
                                      const bp_tensor_desc* y, const bp_attr* attrs,
                                      int32_t nattrs) {
  conv_geometry g;
  g.n = x->shape[0];
  g.c = x->shape[1];
  g.h = x->shape[2];
  g.w = x->shape[3];
  g.k = w->shape[0];
  g.r = w->shape[2];
  g.s = w->shape[3];
  g.p = y->shape[2];
  g.q = y->shape[3];
  g.groups = template_attr_int(attrs, nattrs, BP_ATTR_ID_GROUPS, 1);
  g.cg = g.c / g.groups;
  g.kg = g.k / g.groups;
  g.stride_h = template_attr_int(attrs, nattrs, BP_ATTR_ID_STRIDE_H, 1);
  g.stride_w = template_attr_int(attrs, nattrs, BP_ATTR_ID_STRIDE_W, 1);
  g.pad_h = template_attr_int(attrs, nattrs, BP_ATTR_ID_PAD_H, 0);
  g.pad_w = template_attr_int(attrs, nattrs, BP_ATTR_ID_PAD_W, 0);
  g.dil_h = template_attr_int(attrs, nattrs, BP_ATTR_ID_DILATION_H, 1);
  g.dil_w = template_attr_int(attrs, nattrs, BP_ATTR_ID_DILATION_W, 1);
  return g;
}

/* Which factor of x * w = y the launch computes. */
enum { CONV_Y, CONV_DX, CONV_DW };

/* For every output position (n, k, p, q) and every tap (c', r, s) whose input position (h, w)
 * lies inside the image (the padding contributes zeros):
 *   CONV_Y:  y[n,k,p,q]     += x[n,c,h,w] * w[k,c',r,s]
 *   CONV_DX: dx[n,c,h,w]    += dy[n,k,p,q] * w[k,c',r,s]
 *   CONV_DW: dw[k,c',r,s]   += x[n,c,h,w] * dy[n,k,p,q]
 * with c = group(k) * C/G + c'. */
static void conv_loops(int what, const conv_geometry* g, double* x, double* w, double* y) {
  int64_t n, k, p, q, ci, r, s;
  for (n = 0; n < g->n; ++n)
    for (k = 0; k < g->k; ++k)
      for (p = 0; p < g->p; ++p)
        for (q = 0; q < g->q; ++q) {
          const int64_t c0 = (k / g->kg) * g->cg;
          double* yv = &y[((n * g->k + k) * g->p + p) * g->q + q];
          for (ci = 0; ci < g->cg; ++ci)
            for (r = 0; r < g->r; ++r) {
              const int64_t h = p * g->stride_h - g->pad_h + r * g->dil_h;
              if (h < 0 || h >= g->h) continue;
              for (s = 0; s < g->s; ++s) {
                const int64_t col = q * g->stride_w - g->pad_w + s * g->dil_w;
                double* xv;
                double* wv;
                if (col < 0 || col >= g->w) continue;
                xv = &x[((n * g->c + c0 + ci) * g->h + h) * g->w + col];
                wv = &w[((k * g->cg + ci) * g->r + r) * g->s + s];
                if (what == CONV_Y)
                  *yv += *xv * *wv;
                else if (what == CONV_DX)
                  *xv += *yv * *wv;
                else
                  *wv += *xv * *yv;
              }
            }
        }
}

bp_error* template_conv_launch(int32_t op, const bp_tensor_desc* in, int32_t nin,
                               const bp_tensor_desc* out, int32_t nout, const bp_attr* attrs,
                               int32_t nattrs) {
  const bp_tensor_desc *xd, *wd, *yd, *result;
  double *x = NULL, *w = NULL, *y = NULL;
  conv_geometry g;
  int what;
  int64_t i;
  bp_error* err = template_check_arity(op, nin, 2, op == BP_OP_CONV2D ? 3 : 2, nout, 1, 1);
  if (err) return err;
  if (op == BP_OP_CONV2D) { /* x, w (, bias) -> y */
    xd = &in[0], wd = &in[1], yd = &out[0], result = yd, what = CONV_Y;
  } else if (op == BP_OP_CONV2D_BACKWARD_INPUT) { /* dy, w -> dx */
    xd = &out[0], wd = &in[1], yd = &in[0], result = xd, what = CONV_DX;
  } else { /* x, dy -> dw */
    xd = &in[0], wd = &out[0], yd = &in[1], result = wd, what = CONV_DW;
  }
  g = conv_geometry_of(xd, wd, yd, attrs, nattrs);
  /* The inputs are read; the result starts at zero (at the bias for conv2d). */
  x = what == CONV_DX ? template_zeros(template_numel(xd)) : template_read(xd);
  w = what == CONV_DW ? template_zeros(template_numel(wd)) : template_read(wd);
  y = what == CONV_Y ? template_zeros(template_numel(yd)) : template_read(yd);
  if (!x || !w || !y) {
    err = template_out_of_memory(bp_op_name(op));
  } else {
    if (op == BP_OP_CONV2D && nin == 3)
      for (i = 0; i < template_numel(yd); ++i)
        y[i] = template_load(&in[2], (i / (g.p * g.q)) % g.k);
    conv_loops(what, &g, x, w, y);
    template_write(result, what == CONV_Y ? y : what == CONV_DX ? x : w);
  }
  free(x);
  free(w);
  free(y);
  return err;
}
