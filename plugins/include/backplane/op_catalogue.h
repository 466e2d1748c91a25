/*
 * The op catalogue of Note [Op catalogue] in plugin_abi.h as an X-macro, in catalogue order:
 * BP_OP_CATALOGUE(X) expands X(name, Name) once per op. Hosts and plugins generate their op
 * enums and name tables from it, so an op is named in exactly one place. Ops are only ever
 * appended (the order indexes caches and list_ops tables).
 *
 *   enum class Op { #define X(n, N) k##N, ... BP_OP_CATALOGUE(X) ... kCount };
 */
#ifndef BACKPLANE_OP_CATALOGUE_H_
#define BACKPLANE_OP_CATALOGUE_H_

/* clang-format off */
#define BP_OP_CATALOGUE(X)                                                                   \
  X(fill, Fill) X(copy, Copy) X(cast, Cast)                                                  \
  X(add, Add) X(sub, Sub) X(mul, Mul) X(div, Div) X(pow, Pow) X(maximum, Maximum)            \
  X(minimum, Minimum)                                                                        \
  X(eq, Eq) X(ne, Ne) X(lt, Lt) X(le, Le) X(gt, Gt) X(ge, Ge) X(where, Where)                \
  X(neg, Neg) X(exp, Exp) X(log, Log) X(sqrt, Sqrt) X(relu, Relu) X(sigmoid, Sigmoid)        \
  X(tanh, Tanh) X(abs, Abs)                                                                  \
  X(sum, Sum) X(mean, Mean) X(max, Max)                                                      \
  X(matmul, Matmul)                                                                          \
  X(uniform, Uniform) X(normal, Normal)
/* clang-format on */

/* Number of ops in the catalogue. */
#define BP_OP_X_COUNT(name, Name) +1
#define BP_OP_COUNT (0 BP_OP_CATALOGUE(BP_OP_X_COUNT))

/* Catalogue name of op number `op` ("fill"), or "?" out of range. */
static inline const char* bp_op_name(int op) {
#define BP_OP_X_NAME(name, Name) #name,
  static const char* const names[] = {BP_OP_CATALOGUE(BP_OP_X_NAME)};
#undef BP_OP_X_NAME
  return (op >= 0 && op < BP_OP_COUNT) ? names[op] : "?";
}

#endif /* BACKPLANE_OP_CATALOGUE_H_ */
