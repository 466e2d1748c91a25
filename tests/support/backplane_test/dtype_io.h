/*
 * Reading one element of any dtype as a double, for hosts, tests and tools that compare
 * device results with a float64 reference. Plain C; depends on half.h for f16/bf16.
 */
#ifndef BACKPLANE_DTYPE_IO_H_
#define BACKPLANE_DTYPE_IO_H_

#include <backplane/abi/half.h>
#include <backplane/abi/plugin_abi.h>

#include <stdint.h>
#include <string.h>

/* Element `i` of a host array of `dtype` as a double. u8 and bool give the raw byte, so a
 * bool other than 0/1 shows up as a mismatch; an unknown dtype gives 0. */
static inline double bp_load_element(const void* data, int32_t dtype, size_t i) {
  const unsigned char* p = (const unsigned char*)data + i * bp_dtype_size(dtype);
  switch (dtype) {
    case BP_DTYPE_F32: {
      float v;
      memcpy(&v, p, sizeof v);
      return v;
    }
    case BP_DTYPE_F64: {
      double v;
      memcpy(&v, p, sizeof v);
      return v;
    }
    case BP_DTYPE_F16:
    case BP_DTYPE_BF16: {
      uint16_t h;
      memcpy(&h, p, sizeof h);
      return dtype == BP_DTYPE_F16 ? bp_f16_to_float(h) : bp_bf16_to_float(h);
    }
    case BP_DTYPE_I32: {
      int32_t v;
      memcpy(&v, p, sizeof v);
      return v;
    }
    case BP_DTYPE_I64: {
      int64_t v;
      memcpy(&v, p, sizeof v);
      return (double)v;
    }
    case BP_DTYPE_U8:
    case BP_DTYPE_BOOL:
      return *p;
    default:
      return 0.0;
  }
}

#endif /* BACKPLANE_DTYPE_IO_H_ */
