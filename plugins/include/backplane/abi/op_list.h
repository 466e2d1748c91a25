/*
 * The op catalogue of Note [Op catalogue] in plugin_abi.h, in catalogue order, as an X-macro:
 * BP_OP_CATALOGUE(X) expands X(name, Name, NAME, DOMAIN) once per op, DOMAIN naming the op's
 * dtype domain BP_DOMAIN_<DOMAIN> (Note [Dtype domains]; the BP_DOMAIN_* values are in
 * op_catalogue.h). The position of an op in this list is its catalogue number, the `op` of
 * find_kernel_id (minor 2) and of enum bp_op. Hosts and plugins generate their op enums and name
 * tables from it, so an op is named in exactly one place. Ops are only ever appended; write
 * X-macros with a trailing `...` so that a column appended later does not break them:
 *
 *   enum class Op { #define X(n, N, ...) k##N, ... BP_OP_CATALOGUE(X) ... kCount };
 *
 * Nothing but the macro: no types, no includes, so that C++ headers which must not depend on
 * the plugin ABI (libbackplane's public headers) can generate their op enum from it too.
 */
#ifndef BACKPLANE_OP_LIST_H_
#define BACKPLANE_OP_LIST_H_

/* clang-format off */
#define BP_OP_CATALOGUE(X)                                                               \
  X(fill, Fill, FILL, ALL)                                                               \
  X(copy, Copy, COPY, ALL)                                                               \
  X(cast, Cast, CAST, ALL)                                                               \
  X(add, Add, ADD, ARITH)                                                                \
  X(sub, Sub, SUB, ARITH)                                                                \
  X(mul, Mul, MUL, ARITH)                                                                \
  X(div, Div, DIV, FLOAT)                                                                \
  X(pow, Pow, POW, FLOAT)                                                                \
  X(maximum, Maximum, MAXIMUM, ARITH)                                                    \
  X(minimum, Minimum, MINIMUM, ARITH)                                                    \
  X(eq, Eq, EQ, ALL)                                                                     \
  X(ne, Ne, NE, ALL)                                                                     \
  X(lt, Lt, LT, ALL)                                                                     \
  X(le, Le, LE, ALL)                                                                     \
  X(gt, Gt, GT, ALL)                                                                     \
  X(ge, Ge, GE, ALL)                                                                     \
  X(where, Where, WHERE, ALL)                                                            \
  X(neg, Neg, NEG, SIGNED)                                                               \
  X(exp, Exp, EXP, FLOAT)                                                                \
  X(log, Log, LOG, FLOAT)                                                                \
  X(sqrt, Sqrt, SQRT, FLOAT)                                                             \
  X(relu, Relu, RELU, SIGNED)                                                            \
  X(sigmoid, Sigmoid, SIGMOID, FLOAT)                                                    \
  X(tanh, Tanh, TANH, FLOAT)                                                             \
  X(abs, Abs, ABS, SIGNED)                                                               \
  X(sum, Sum, SUM, SIGNED)                                                               \
  X(mean, Mean, MEAN, FLOAT)                                                             \
  X(max, Max, MAX, SIGNED)                                                               \
  X(matmul, Matmul, MATMUL, FLOAT)                                                       \
  X(uniform, Uniform, UNIFORM, FLOAT)                                                    \
  X(normal, Normal, NORMAL, FLOAT)                                                       \
  X(sumsq, Sumsq, SUMSQ, FLOAT)                                                          \
  X(norm, Norm, NORM, FLOAT)                                                             \
  X(linear, Linear, LINEAR, FLOAT)                                                       \
  X(conv2d, Conv2d, CONV2D, FLOAT)                                                       \
  X(conv2d_backward_input, Conv2dBackwardInput, CONV2D_BACKWARD_INPUT, FLOAT)            \
  X(conv2d_backward_weight, Conv2dBackwardWeight, CONV2D_BACKWARD_WEIGHT, FLOAT)         \
  X(max_pool2d, MaxPool2d, MAX_POOL2D, FLOAT)                                            \
  X(max_pool2d_backward, MaxPool2dBackward, MAX_POOL2D_BACKWARD, FLOAT)                  \
  X(avg_pool2d, AvgPool2d, AVG_POOL2D, FLOAT)                                            \
  X(avg_pool2d_backward, AvgPool2dBackward, AVG_POOL2D_BACKWARD, FLOAT)                  \
  X(adaptive_avg_pool2d, AdaptiveAvgPool2d, ADAPTIVE_AVG_POOL2D, FLOAT)                  \
  X(adaptive_avg_pool2d_backward, AdaptiveAvgPool2dBackward, ADAPTIVE_AVG_POOL2D_BACKWARD, FLOAT) \
  X(batch_norm, BatchNorm, BATCH_NORM, FLOAT)                                            \
  X(batch_norm_backward, BatchNormBackward, BATCH_NORM_BACKWARD, FLOAT)                  \
  X(dropout, Dropout, DROPOUT, FLOAT)                                                    \
  X(max_dim, MaxDim, MAX_DIM, SIGNED)                                                    \
  X(min_dim, MinDim, MIN_DIM, SIGNED)                                                    \
  X(gather, Gather, GATHER, ALL)                                                         \
  X(scatter_add, ScatterAdd, SCATTER_ADD, ARITH)                                         \
  X(softmax, Softmax, SOFTMAX, FLOAT)                                                    \
  X(log_softmax, LogSoftmax, LOG_SOFTMAX, FLOAT)                                         \
  X(softmax_backward, SoftmaxBackward, SOFTMAX_BACKWARD, FLOAT)                          \
  X(log_softmax_backward, LogSoftmaxBackward, LOG_SOFTMAX_BACKWARD, FLOAT)                \
  X(layer_norm, LayerNorm, LAYER_NORM, FLOAT)                                            \
  X(layer_norm_backward, LayerNormBackward, LAYER_NORM_BACKWARD, FLOAT)                  \
  X(gelu, Gelu, GELU, FLOAT)                                                             \
  X(gelu_backward, GeluBackward, GELU_BACKWARD, FLOAT)                                   \
  X(silu, Silu, SILU, FLOAT)                                                             \
  X(silu_backward, SiluBackward, SILU_BACKWARD, FLOAT)                                   \
  X(embedding, Embedding, EMBEDDING, FLOAT)                                              \
  X(embedding_backward, EmbeddingBackward, EMBEDDING_BACKWARD, FLOAT)                    \
  X(scaled_dot_product_attention, ScaledDotProductAttention, SCALED_DOT_PRODUCT_ATTENTION, FLOAT) \
  X(scaled_dot_product_attention_backward, ScaledDotProductAttentionBackward,            \
    SCALED_DOT_PRODUCT_ATTENTION_BACKWARD, FLOAT)                                        \
  X(triu, Triu, TRIU, ALL)                                                               \
  X(tril, Tril, TRIL, ALL)                                                               \
  X(cumsum, Cumsum, CUMSUM, SIGNED)                                                      \
  X(sin, Sin, SIN, FLOAT)                                                                \
  X(cos, Cos, COS, FLOAT)                                                                \
  X(rsqrt, Rsqrt, RSQRT, FLOAT)                                                          \
  X(adamw, Adamw, ADAMW, FLOAT)                                                          \
  X(cross_entropy, CrossEntropy, CROSS_ENTROPY, FLOAT)                                   \
  X(cross_entropy_backward, CrossEntropyBackward, CROSS_ENTROPY_BACKWARD, FLOAT)
/* clang-format on */

#endif /* BACKPLANE_OP_LIST_H_ */
