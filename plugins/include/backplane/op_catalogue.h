/*
 * The op catalogue of Note [Op catalogue] in plugin_abi.h, in catalogue order, as an X-macro:
 * BP_OP_CATALOGUE(X) expands X(name, Name, NAME) once per op. The position of an op in this
 * list is its catalogue number, the `op` of find_kernel_id (minor 2) and of enum bp_op. Hosts
 * and plugins generate their op enums and name tables from it, so an op is named in exactly one
 * place. Ops are only ever appended; write X-macros with a trailing `...` so that a column
 * appended later does not break them:
 *
 *   enum class Op { #define X(n, N, ...) k##N, ... BP_OP_CATALOGUE(X) ... kCount };
 *
 * Plain C99, header-only, no state: safe from any thread.
 */
#ifndef BACKPLANE_OP_CATALOGUE_H_
#define BACKPLANE_OP_CATALOGUE_H_

#include <backplane/plugin_abi.h>

#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* clang-format off */
#define BP_OP_CATALOGUE(X)                                                                   \
  X(fill, Fill, FILL)                                                                        \
  X(copy, Copy, COPY)                                                                        \
  X(cast, Cast, CAST)                                                                        \
  X(add, Add, ADD)                                                                           \
  X(sub, Sub, SUB)                                                                           \
  X(mul, Mul, MUL)                                                                           \
  X(div, Div, DIV)                                                                           \
  X(pow, Pow, POW)                                                                           \
  X(maximum, Maximum, MAXIMUM)                                                               \
  X(minimum, Minimum, MINIMUM)                                                               \
  X(eq, Eq, EQ)                                                                              \
  X(ne, Ne, NE)                                                                              \
  X(lt, Lt, LT)                                                                              \
  X(le, Le, LE)                                                                              \
  X(gt, Gt, GT)                                                                              \
  X(ge, Ge, GE)                                                                              \
  X(where, Where, WHERE)                                                                     \
  X(neg, Neg, NEG)                                                                           \
  X(exp, Exp, EXP)                                                                           \
  X(log, Log, LOG)                                                                           \
  X(sqrt, Sqrt, SQRT)                                                                        \
  X(relu, Relu, RELU)                                                                        \
  X(sigmoid, Sigmoid, SIGMOID)                                                               \
  X(tanh, Tanh, TANH)                                                                        \
  X(abs, Abs, ABS)                                                                           \
  X(sum, Sum, SUM)                                                                           \
  X(mean, Mean, MEAN)                                                                        \
  X(max, Max, MAX)                                                                           \
  X(matmul, Matmul, MATMUL)                                                                  \
  X(uniform, Uniform, UNIFORM)                                                               \
  X(normal, Normal, NORMAL)
/* clang-format on */

/* Catalogue numbers: BP_OP_FILL = 0, BP_OP_COPY = 1, ... Values are stable across minors. */
typedef enum bp_op {
#define BP_OP_X_ENUM(name, Name, NAME) BP_OP_##NAME,
  BP_OP_CATALOGUE(BP_OP_X_ENUM)
#undef BP_OP_X_ENUM
      BP_OP_COUNT /* number of ops in this version of the catalogue */
} bp_op;

/* Catalogue name of op number `op` ("fill"), or "?" out of range. */
static inline const char* bp_op_name(int32_t op) {
#define BP_OP_X_NAME(name, ...) #name,
  static const char* const names[] = {BP_OP_CATALOGUE(BP_OP_X_NAME)};
#undef BP_OP_X_NAME
  return (op >= 0 && op < BP_OP_COUNT) ? names[op] : "?";
}

/* Catalogue number of the op named `name`, or -1 when there is none (or name is NULL). Compares
 * strings: for resolving a name once, never per launch. */
static inline int32_t bp_op_from_name(const char* name) {
  int32_t op;
  if (!name) return -1;
  for (op = 0; op < BP_OP_COUNT; ++op)
    if (strcmp(name, bp_op_name(op)) == 0) return op;
  return -1;
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BACKPLANE_OP_CATALOGUE_H_ */
