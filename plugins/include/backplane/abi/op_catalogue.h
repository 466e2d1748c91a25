/*
 * The op catalogue of Note [Op catalogue] in plugin_abi.h: the catalogue numbers (enum bp_op),
 * names and dtype domains generated from the X-macro BP_OP_CATALOGUE of backplane/op_list.h,
 * where each op is named once.
 *
 * Plain C99, header-only, no state: safe from any thread.
 */
#ifndef BACKPLANE_OP_CATALOGUE_H_
#define BACKPLANE_OP_CATALOGUE_H_

#include <backplane/abi/op_list.h>
#include <backplane/abi/plugin_abi.h>

#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Dtype domains (Note [Dtype domains] in plugin_abi.h): bit d set for bp_dtype d. An op is
 * defined for exactly the dtypes of its domain; a host rejects any other dtype before it asks
 * a plugin, and a plugin declares those pairs BP_SUPPORT_NO. */
#define BP_DOMAIN_FLOAT 0x0Fu  /* f32 f64 f16 bf16 */
#define BP_DOMAIN_SIGNED 0x3Fu /* f32 f64 f16 bf16 i32 i64 */
#define BP_DOMAIN_ARITH 0x7Fu  /* f32 f64 f16 bf16 i32 i64 u8 */
#define BP_DOMAIN_ALL 0xFFu    /* every dtype, bool included */

/* Catalogue numbers: BP_OP_FILL = 0, BP_OP_COPY = 1, ... Values are stable across minors. */
typedef enum bp_op {
#define BP_OP_X_ENUM(name, Name, NAME, ...) BP_OP_##NAME,
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

/* The dtype domain of op number `op` (BP_DOMAIN_* bits), or 0 out of range. */
static inline uint32_t bp_op_domain(int32_t op) {
#define BP_OP_X_DOMAIN(name, Name, NAME, DOMAIN) BP_DOMAIN_##DOMAIN,
  static const uint32_t domains[] = {BP_OP_CATALOGUE(BP_OP_X_DOMAIN)};
#undef BP_OP_X_DOMAIN
  return (op >= 0 && op < BP_OP_COUNT) ? domains[op] : 0u;
}

/* Non-zero when dtype `dtype` lies in the domain of op `op`. */
static inline int bp_op_in_domain(int32_t op, int32_t dtype) {
  return dtype >= 0 && dtype < BP_DTYPE_COUNT && ((bp_op_domain(op) >> dtype) & 1u) != 0;
}

/* The dtypes of op `op`'s domain as text: "f32 f64 f16 bf16", ... ("" out of range). */
static inline const char* bp_op_domain_text(int32_t op) {
  switch (bp_op_domain(op)) {
    case BP_DOMAIN_FLOAT:
      return "f32 f64 f16 bf16";
    case BP_DOMAIN_SIGNED:
      return "f32 f64 f16 bf16 i32 i64";
    case BP_DOMAIN_ARITH:
      return "f32 f64 f16 bf16 i32 i64 u8";
    case BP_DOMAIN_ALL:
      return "f32 f64 f16 bf16 i32 i64 u8 bool";
    default:
      return "";
  }
}

/* Why dtype `dtype` lies outside op `op`'s domain, as a plugin's list_ops reason and a host's
 * message ("defined for f32 f64 f16 bf16 only: cast to one first"); static. */
static inline const char* bp_op_domain_reason(int32_t op) {
  switch (bp_op_domain(op)) {
    case BP_DOMAIN_FLOAT:
      return "outside the op's dtype domain (op_catalogue.h): defined for f32 f64 f16 bf16 only; "
             "cast to a floating dtype first";
    case BP_DOMAIN_SIGNED:
      return "outside the op's dtype domain (op_catalogue.h): defined for f32 f64 f16 bf16 i32 "
             "i64 only; cast to a signed or floating dtype first";
    case BP_DOMAIN_ARITH:
      return "outside the op's dtype domain (op_catalogue.h): arithmetic is not defined on bool; "
             "cast to u8 or a wider dtype first";
    default:
      return "outside the op's dtype domain (op_catalogue.h)";
  }
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BACKPLANE_OP_CATALOGUE_H_ */
