/*
 * IEEE binary16 (f16) and bfloat16 (bf16) conversions to and from float, round to nearest
 * even, NaN preserved. Plain C so that hosts and plugins share one definition; define
 * BP_HALF_FN (for example as __host__ __device__ inline) before including to change linkage.
 */
#ifndef BACKPLANE_HALF_H_
#define BACKPLANE_HALF_H_

#include <stdint.h>
#include <string.h>

#ifndef BP_HALF_FN
#define BP_HALF_FN static inline
#endif

BP_HALF_FN uint32_t bp_float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

BP_HALF_FN float bp_bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

BP_HALF_FN float bp_bf16_to_float(uint16_t h) { return bp_bits_float((uint32_t)h << 16); }

BP_HALF_FN uint16_t bp_float_to_bf16(float f) {
  uint32_t u = bp_float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

BP_HALF_FN float bp_f16_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else { /* subnormal: normalise */
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  return bp_bits_float(u);
}

BP_HALF_FN uint16_t bp_float_to_f16(float f) {
  uint32_t u = bp_float_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);    /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);   /* overflow (after rounding) */
  if (a < 0x38800000u) {                                       /* subnormal or zero */
    if (a < 0x33000000u) return sign;                          /* rounds to zero */
    uint32_t e = a >> 23;
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;                                  /* 14 + (113 - e) - 1 */
    uint32_t half = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return (uint16_t)(sign | half);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u); /* round to nearest even at bit 13 */
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

#endif /* BACKPLANE_HALF_H_ */
