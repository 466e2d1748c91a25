// Decompositions of catalogue ops into other catalogue ops (composites.hpp).
//
// Note [Composite decompositions]
//   Each is the op's definition written with ops of the catalogue, so that a device whose plugin
//   lacks the op still runs it on that device (PyTorch's CompositeImplicitAutograd ops are the
//   precedent). They are raw: the caller records autograd for the op it was asked for (so a
//   decomposed conv2d has the same backward graph as a native one, and its backward ops
//   decompose in their turn), and views are made with make_view, without recording.
//     matmul       a[..., m, k, 1] * b[..., 1, k, n] summed over k: m*k*n products in memory,
//                  so the rows of `a` go in chunks of at most kMaxProducts products.
//     conv2d       im2col: x, zero-padded when there is padding, viewed as
//                  [N, C, R, S, P, Q] with strides (C*Hp*Wp, Hp*Wp, dil_h*Wp, dil_w,
//                  stride_h*Wp, stride_w) and copied dense; then per group
//                  w[g] [K/G, C/G*R*S] @ cols[n, g] [C/G*R*S, P*Q] by matmul, plus the bias.
//     its input gradient: dcols = w[g]^T @ dy[n, g], then col2im: for each (r, s) the
//                  [N, C, P, Q] window of dcols is added into the padded gradient through the
//                  same strided view, R*S adds in order (windows overlap when stride < kernel).
//     its weight gradient: dy[n, g] @ cols[n, g]^T summed over n.
//     softmax      e = exp(x - max(x)), e / sum(e); log_softmax: (x - max) - log(sum(e)).
//     their backward: y * (dy - sum(dy * y)); dy - exp(y) * sum(dy).
//   Accuracy follows the ops used: a decomposed f16 matmul rounds each product to f16 before
//   the sum, where a native kernel accumulates in f32.
#include "tensor/composites.hpp"
#include "tensor/tensor_internal.hpp"
#include "tensor/tensor_nn_internal.hpp"

#include <algorithm>

namespace bp::detail {

Tensor unary_raw(Op op, const Tensor& a);
Tensor binary_raw(Op op, const Tensor& a, const Tensor& b, DType out_dtype);
Tensor reduce_raw(Op op, const Tensor& a, uint32_t axes, bool keepdim);
Tensor copy_raw(const Tensor& a);
Tensor matmul_raw(const Tensor& a, const Tensor& b);

namespace {

constexpr int64_t kMaxProducts = int64_t{1} << 24;

Tensor view_of(const Tensor& t, const Dims& shape, const Dims& strides, int64_t extra_offset = 0) {
  return make_view(t, shape, strides, impl(t).offset + extra_offset);
}
Tensor dense_view(const Tensor& t, const Dims& shape) {  // t must be contiguous
  return view_of(t, shape, contiguous_strides(shape));
}

struct ConvGeometry {
  int64_t N, C, H, W, K, Cg, R, S, P, Q, G, sh, sw, ph, pw, dh, dw, Hp, Wp;
  ConvGeometry(const Dims& x, const Dims& w, const Shape& c) {
    N = x.d[0], C = x.d[1], H = x.d[2], W = x.d[3];
    K = w.d[0], Cg = w.d[1], R = w.d[2], S = w.d[3];
    sh = c[0], sw = c[1], ph = c[2], pw = c[3], dh = c[4], dw = c[5], G = c[6];
    Hp = H + 2 * ph, Wp = W + 2 * pw;
    P = (Hp - dh * (R - 1) - 1) / sh + 1;
    Q = (Wp - dw * (S - 1) - 1) / sw + 1;
  }
  int64_t crs() const { return Cg * R * S; }  // rows of one group's columns
};

// [N, C*R*S, P*Q] columns of x (Note [Composite decompositions]).
Tensor im2col(const Tensor& x, const ConvGeometry& g) {
  Tensor xp = x;
  if (g.ph || g.pw) {
    xp = make_empty(x.device(), Dims{g.N, g.C, g.Hp, g.Wp}, x.dtype());
    xp.zero_();
    copy_into(view_of(xp, Dims{g.N, g.C, g.H, g.W}, Dims{g.C * g.Hp * g.Wp, g.Hp * g.Wp, g.Wp, 1},
                      g.ph * g.Wp + g.pw),
              x);
  }
  Tensor windows =
      view_of(xp, Dims{g.N, g.C, g.R, g.S, g.P, g.Q},
              Dims{g.C * g.Hp * g.Wp, g.Hp * g.Wp, g.dh * g.Wp, g.dw, g.sh * g.Wp, g.sw});
  return dense_view(copy_raw(windows), Dims{g.N, g.C * g.R * g.S, g.P * g.Q});
}

}  // namespace

Tensor matmul_decomposed(const Tensor& a, const Tensor& b) {
  NoGradGuard no_grad;
  const Dims& as = impl(a).shape;
  const Dims& bs = impl(b).shape;
  const int64_t m = as.d[as.rank - 2], k = as.d[as.rank - 1], n = bs.d[bs.rank - 1];
  // a[..., m, k] -> [..., m, k, 1]; b[..., k, n] -> [..., 1, k, n].
  auto with_unit = [](const Tensor& t, int at) {
    const Dims& s = impl(t).shape;
    const Dims& st = impl(t).strides;
    Dims shape, strides;
    for (int i = 0; i <= s.rank; ++i) {
      if (i == at) {
        shape.d[shape.rank++] = 1;
        strides.d[strides.rank++] = 1;
      }
      if (i < s.rank) {
        shape.d[shape.rank++] = s.d[i];
        strides.d[strides.rank++] = st.d[i];
      }
    }
    return make_view(t, shape, strides, impl(t).offset);
  };
  Tensor b4 = with_unit(b, bs.rank - 2);
  const int64_t rows = std::max<int64_t>(1, kMaxProducts / std::max<int64_t>(1, k * n));
  if (rows >= m) {
    Tensor prod = binary_raw(Op::mul, with_unit(a, as.rank), b4, a.dtype());
    return reduce_raw(Op::sum, prod, 1u << (impl(prod).shape.rank - 2), false);
  }
  // Rows of `a` in chunks, each written into its rows of the result.
  Tensor out;
  for (int64_t r0 = 0; r0 < m; r0 += rows) {
    const int64_t r1 = std::min(m, r0 + rows);
    Dims cs = as;
    cs.d[cs.rank - 2] = r1 - r0;
    Tensor chunk =
        make_view(a, cs, impl(a).strides, impl(a).offset + r0 * impl(a).strides.d[as.rank - 2]);
    Tensor prod = binary_raw(Op::mul, with_unit(chunk, cs.rank), b4, a.dtype());
    Tensor part = reduce_raw(Op::sum, prod, 1u << (impl(prod).shape.rank - 2), false);
    if (!out.defined()) {
      Dims os = impl(part).shape;
      os.d[os.rank - 2] = m;
      out = make_empty(a.device(), os, a.dtype());
    }
    const Dims& os = impl(out).shape;
    Dims ps = os;
    ps.d[ps.rank - 2] = r1 - r0;
    copy_into(view_of(out, ps, impl(out).strides, r0 * impl(out).strides.d[os.rank - 2]), part);
  }
  return out;
}

Tensor conv2d_decomposed(const Tensor& x, const Tensor& w, const Tensor& bias, const Shape& conv) {
  NoGradGuard no_grad;
  const ConvGeometry g(impl(x).shape, impl(w).shape, conv);
  Tensor cols = dense_view(im2col(x, g), Dims{g.N, g.G, g.crs(), g.P * g.Q});
  Tensor wg = dense_view(w, Dims{g.G, g.K / g.G, g.crs()});
  Tensor y = dense_view(matmul_raw(wg, cols), Dims{g.N, g.K, g.P, g.Q});
  if (bias.defined()) y = binary_raw(Op::add, y, dense_view(bias, Dims{1, g.K, 1, 1}), y.dtype());
  return y;
}

Tensor conv2d_backward_input_decomposed(const Tensor& dy0, const Tensor& w, const Shape& x_shape,
                                        const Shape& conv) {
  NoGradGuard no_grad;
  Tensor dy = dy0.contiguous();
  const ConvGeometry g(Dims(std::span<const int64_t>(x_shape)), impl(w).shape, conv);
  const int64_t Kg = g.K / g.G, PQ = g.P * g.Q;
  // w[g]^T: [G, C/G*R*S, K/G] as a transposed view of w [G, K/G, C/G*R*S].
  Tensor wt = view_of(w, Dims{g.G, g.crs(), Kg}, Dims{Kg * g.crs(), 1, g.crs()});
  Tensor dcols = matmul_raw(wt, dense_view(dy, Dims{g.N, g.G, Kg, PQ}));  // [N, C, R, S, P, Q]
  Tensor dxp = make_empty(dy.device(), Dims{g.N, g.C, g.Hp, g.Wp}, dy.dtype());
  dxp.zero_();
  for (int64_t r = 0; r < g.R; ++r)
    for (int64_t s = 0; s < g.S; ++s) {
      Tensor dst = view_of(dxp, Dims{g.N, g.C, g.P, g.Q},
                           Dims{g.C * g.Hp * g.Wp, g.Hp * g.Wp, g.sh * g.Wp, g.sw},
                           r * g.dh * g.Wp + s * g.dw);
      Tensor src = view_of(dcols, Dims{g.N, g.C, g.P, g.Q},
                           Dims{g.C * g.R * g.S * PQ, g.R * g.S * PQ, g.Q, 1}, (r * g.S + s) * PQ);
      dst.add_(src);
    }
  if (!g.ph && !g.pw) return dxp;
  return copy_raw(view_of(dxp, Dims{g.N, g.C, g.H, g.W},
                          Dims{g.C * g.Hp * g.Wp, g.Hp * g.Wp, g.Wp, 1}, g.ph * g.Wp + g.pw));
}

Tensor conv2d_backward_weight_decomposed(const Tensor& x, const Tensor& dy0, const Shape& w_shape,
                                         const Shape& conv) {
  NoGradGuard no_grad;
  Tensor dy = dy0.contiguous();
  const ConvGeometry g(impl(x).shape, Dims(std::span<const int64_t>(w_shape)), conv);
  const int64_t Kg = g.K / g.G, PQ = g.P * g.Q;
  Tensor cols = im2col(x, g);  // [N, G * C/G*R*S, P*Q]
  Tensor cols_t =
      view_of(cols, Dims{g.N, g.G, PQ, g.crs()}, Dims{g.G * g.crs() * PQ, g.crs() * PQ, 1, PQ});
  Tensor per_image = matmul_raw(dense_view(dy, Dims{g.N, g.G, Kg, PQ}), cols_t);
  Tensor dw = reduce_raw(Op::sum, per_image, 1u, false);  // [G, K/G, C/G*R*S]
  return dense_view(dw, Dims{g.K, g.Cg, g.R, g.S});
}

Tensor softmax_decomposed(Op op, const Tensor& x, int axis) {
  NoGradGuard no_grad;
  const uint32_t ax = 1u << axis;
  Tensor z = binary_raw(Op::sub, x, reduce_raw(Op::max, x, ax, true), x.dtype());
  Tensor e = unary_raw(Op::exp, z);
  Tensor s = reduce_raw(Op::sum, e, ax, true);
  if (op == Op::softmax) return binary_raw(Op::div, e, s, x.dtype());
  return binary_raw(Op::sub, z, unary_raw(Op::log, s), x.dtype());
}

Tensor softmax_backward_decomposed(Op op, const Tensor& y, const Tensor& dy, int axis) {
  NoGradGuard no_grad;
  const uint32_t ax = 1u << axis;
  const DType t = y.dtype();
  if (op == Op::softmax_backward) {
    Tensor dot = reduce_raw(Op::sum, binary_raw(Op::mul, dy, y, t), ax, true);
    return binary_raw(Op::mul, y, binary_raw(Op::sub, dy, dot, t), t);
  }
  Tensor sum = reduce_raw(Op::sum, dy, ax, true);
  return binary_raw(Op::sub, dy, binary_raw(Op::mul, unary_raw(Op::exp, y), sum, t), t);
}

}  // namespace bp::detail
