/*
 * A backend's op table, built once from a resolver (Note [Op tables]): the one place a plugin
 * says which (op, dtype) pairs it has, from which find_kernel (by name), find_kernel_id (by
 * catalogue number) and list_ops all answer, so the three can never disagree. Plain C99,
 * header-only; the C++ SDK (plugin_sdk.hpp, bp::sdk::OpTable) wraps it.
 *
 * Note [Op tables]
 *   bp_op_table_build calls the backend's resolver once for every pair inside the op's dtype
 *   domain (Note [Dtype domains] in plugin_abi.h); pairs outside it are declared
 *   BP_SUPPORT_NO with bp_op_domain_reason without asking. The resolver receives
 *   {kernel NULL, BP_SUPPORT_NO, reason ""} and sets what the backend has: the kernel handle
 *   and BP_SUPPORT_YES (or BP_SUPPORT_EXPECTED_FAIL with a reason), or leaves the pair
 *   unsupported, ideally with a reason ("no f64 on this device"). A backend that creates its
 *   kernels lazily (per device, on first use) may declare a pair supported with a NULL kernel
 *   and create the handle itself after bp_op_table_find succeeds.
 *
 *   Minimal use in C (a backend with add for f32 only):
 *
 *     static bp_kernel my_add;
 *     static void resolve(void* user, int32_t op, int32_t dtype, bp_op_decl* d) {
 *       (void)user;
 *       if (op == BP_OP_ADD && dtype == BP_DTYPE_F32) {
 *         d->kernel = &my_add;
 *         d->support = BP_SUPPORT_YES;
 *       }
 *     }
 *     static bp_op_table table;  // in init: bp_op_table_build(&table, resolve, NULL);
 *     // find_kernel_id: code = bp_op_table_find(&table, op, dtype, out_kernel, &reason);
 *     //                 code != 0: return an error object with that code and the reason.
 *     // list_ops: *out_list = table.list; *out_count = BP_OP_TABLE_SIZE;
 *
 * A built table is read-only: any thread may read it at once.
 */
#ifndef BACKPLANE_OP_TABLE_H_
#define BACKPLANE_OP_TABLE_H_

#include <backplane/abi/op_catalogue.h>
#include <backplane/abi/plugin_abi.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a backend declares for one (op, dtype) pair. */
typedef struct bp_op_decl {
  bp_kernel* kernel;  /* the handle to return; NULL when unsupported or created lazily */
  int32_t support;    /* bp_support */
  const char* reason; /* static; "" for BP_SUPPORT_YES */
} bp_op_decl;

/* Fills *decl for pair (op, dtype) of op's domain; `user` is bp_op_table_build's argument. */
typedef void (*bp_op_resolver)(void* user, int32_t op, int32_t dtype, bp_op_decl* decl);

/* Number of entries of a table's list: every op of the catalogue x every dtype. */
#define BP_OP_TABLE_SIZE ((int32_t)BP_OP_COUNT * (int32_t)BP_DTYPE_COUNT)

typedef struct bp_op_table {
  bp_op_decl decls[BP_OP_COUNT][BP_DTYPE_COUNT];
  bp_op_support list[BP_OP_TABLE_SIZE]; /* what list_ops hands out, in catalogue order */
} bp_op_table;

/* Builds `t` by asking `resolve` about every pair inside its op's domain (Note [Op tables]). */
static inline void bp_op_table_build(bp_op_table* t, bp_op_resolver resolve, void* user) {
  int32_t op, dt;
  for (op = 0; op < BP_OP_COUNT; ++op) {
    for (dt = 0; dt < BP_DTYPE_COUNT; ++dt) {
      bp_op_decl* d = &t->decls[op][dt];
      bp_op_support* s = &t->list[op * BP_DTYPE_COUNT + dt];
      d->kernel = NULL;
      d->support = BP_SUPPORT_NO;
      d->reason = "";
      if (!bp_op_in_domain(op, dt)) {
        d->reason = bp_op_domain_reason(op);
      } else {
        resolve(user, op, dt, d);
        if (d->support == BP_SUPPORT_YES) {
          d->reason = "";
        } else {
          if (d->support != BP_SUPPORT_EXPECTED_FAIL) {
            d->support = BP_SUPPORT_NO;
            d->kernel = NULL;
          }
          if (!d->reason || !*d->reason)
            d->reason = d->support == BP_SUPPORT_NO ? "not implemented by this backend"
                                                    : "declared expected to fail";
        }
      }
      s->struct_size = sizeof(bp_op_support);
      s->op = bp_op_name(op);
      s->dtype = dt;
      s->support = d->support;
      s->reason = d->reason;
    }
  }
}

/* The declaration of (op, dtype), or NULL when either number is outside this plugin's
 * catalogue (a newer host's). */
static inline const bp_op_decl* bp_op_table_get(const bp_op_table* t, int32_t op, int32_t dtype) {
  if (op < 0 || op >= BP_OP_COUNT || dtype < 0 || dtype >= BP_DTYPE_COUNT) return NULL;
  return &t->decls[op][dtype];
}

/* find_kernel_id's answer: 0 with *out_kernel set (possibly NULL for a lazily created kernel),
 * or BP_ERROR_UNSUPPORTED with *out_reason (static) saying why. */
static inline int32_t bp_op_table_find(const bp_op_table* t, int32_t op, int32_t dtype,
                                       bp_kernel** out_kernel, const char** out_reason) {
  const bp_op_decl* d = bp_op_table_get(t, op, dtype);
  *out_reason = "";
  if (!d) {
    *out_reason = "the op or dtype number is not in this plugin's catalogue (a newer host?)";
    return BP_ERROR_UNSUPPORTED;
  }
  if (d->support == BP_SUPPORT_NO) {
    *out_reason = d->reason;
    return BP_ERROR_UNSUPPORTED;
  }
  *out_kernel = d->kernel;
  return 0;
}

/* find_kernel's answer: as bp_op_table_find, for an op given by name. */
static inline int32_t bp_op_table_find_name(const bp_op_table* t, const char* op, int32_t dtype,
                                            bp_kernel** out_kernel, const char** out_reason) {
  int32_t id = bp_op_from_name(op);
  if (id < 0) {
    *out_reason = "not an op of the catalogue (op_catalogue.h)";
    return BP_ERROR_UNSUPPORTED;
  }
  return bp_op_table_find(t, id, dtype, out_kernel, out_reason);
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BACKPLANE_OP_TABLE_H_ */
