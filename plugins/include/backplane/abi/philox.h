/*
 * Philox-4x32-10 and the mapping from its words to Backplane's random tensors. Plain C so that
 * every backend (C++, CUDA with BP_PHILOX_FN defined as __host__ __device__, a C plugin) uses
 * the same arithmetic; the OpenCL backend carries a transcription in OpenCL C.
 *
 * Note [Philox stream]
 *   A draw is keyed by (seed, offset), both 64-bit. Element i (row-major order of the output)
 *   uses global index g = offset + i.
 *   uniform: counter = (lo32(g/4), hi32(g/4), 0, 0), key = (lo32(seed), hi32(seed)); take word
 *            w = philox(counter, key)[g % 4]; u = (w >> 8) * 2^-24 in [0, 1) (exact in f32);
 *            value = low + (high - low) * u, computed in float for f32/f16/bf16 and double for
 *            f64, then rounded to the output dtype.
 *   normal:  counter = (lo32(g/2), hi32(g/2), 0, 0); words x0 = word[0], x1 = word[1];
 *            u1 = ((x0 >> 8) + 1) * 2^-24 in (0, 1], u2 = (x1 >> 8) * 2^-24;
 *            r = sqrt(-2 ln u1); z = r cos(2 pi u2) for even g, r sin(2 pi u2) for odd g;
 *            value = mean + std * z, in float (double for f64).
 *   The host advances its offset by the element count rounded up to a multiple of 4 after
 *   each draw. Uniform values are bit-identical across devices; normal values agree to the
 *   accuracy of each device's log/sqrt/sin/cos.
 */
#ifndef BACKPLANE_PHILOX_H_
#define BACKPLANE_PHILOX_H_

#include <stdint.h>

#ifndef BP_PHILOX_FN
#define BP_PHILOX_FN static inline
#endif

typedef struct bp_philox_words {
  uint32_t w[4];
} bp_philox_words;

BP_PHILOX_FN void bp_philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  uint64_t p = (uint64_t)a * (uint64_t)b;
  *hi = (uint32_t)(p >> 32);
  *lo = (uint32_t)p;
}

/* Philox-4x32 with 10 rounds (Salmon et al., SC'11). */
BP_PHILOX_FN bp_philox_words bp_philox4x32_10(uint64_t counter, uint64_t seed) {
  uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    bp_philox_mulhilo(0xD2511F53u, c0, &hi0, &lo0);
    bp_philox_mulhilo(0xCD9E8D57u, c2, &hi1, &lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  bp_philox_words out;
  out.w[0] = c0;
  out.w[1] = c1;
  out.w[2] = c2;
  out.w[3] = c3;
  return out;
}

/* u in [0, 1) for global index g (see Note [Philox stream]). */
BP_PHILOX_FN float bp_philox_uniform01(uint64_t seed, uint64_t g) {
  bp_philox_words r = bp_philox4x32_10(g >> 2, seed);
  return (float)(r.w[g & 3u] >> 8) * (1.0f / 16777216.0f);
}

/* The two uniforms (u1 in (0,1], u2 in [0,1)) feeding the Box-Muller transform of index g. */
BP_PHILOX_FN void bp_philox_normal_uniforms(uint64_t seed, uint64_t g, float* u1, float* u2) {
  bp_philox_words r = bp_philox4x32_10(g >> 1, seed);
  *u1 = (float)((r.w[0] >> 8) + 1u) * (1.0f / 16777216.0f);
  *u2 = (float)(r.w[1] >> 8) * (1.0f / 16777216.0f);
}

#endif /* BACKPLANE_PHILOX_H_ */
