/* Shared helpers for every C file: half/bfloat conversion, rounding, block structs.
 * Block layouts follow ggml's ggml-common.h (the GGUF on-disk format). */
#ifndef EDGELLM_COMMON_H
#define EDGELLM_COMMON_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <math.h>

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_K 256
#define K_SCALE_SIZE 12
#define QK4_NL 32

typedef uint16_t el_half;  /* IEEE binary16 bits */
typedef uint16_t el_bf16;  /* bfloat16 bits */

typedef struct { el_half d; uint8_t qs[QK4_0 / 2]; } block_q4_0;
typedef struct { el_half d; el_half m; uint8_t qs[QK4_1 / 2]; } block_q4_1;
typedef struct { el_half d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;
typedef struct { el_half d; el_half m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1;
typedef struct { el_half d; int8_t qs[QK8_0]; } block_q8_0;
typedef struct { el_half d; el_half s; int8_t qs[QK8_1]; } block_q8_1; /* s = d * sum(qs) */

typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; el_half d; el_half dmin; } block_q2_K;
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; el_half d; } block_q3_K;
typedef struct { el_half d; el_half dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; } block_q4_K;
typedef struct { el_half d; el_half dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; el_half d; } block_q6_K;
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;

/* non-linear 4-bit types: each nibble indexes el_iq4nl_values (value j of a 32-value group in the
 * low nibble of byte j, value j+16 in its high nibble); IQ4_XS adds a 6-bit scale per 32 values,
 * low 4 bits in scales_l (two per byte, even groups low), high 2 bits at bit 2j of scales_h */
typedef struct { el_half d; uint8_t qs[QK4_NL / 2]; } block_iq4_nl;
typedef struct { el_half d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; } block_iq4_xs;

_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0");
_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1");
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0");
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1");
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0");
_Static_assert(sizeof(block_q8_1) == 36, "block_q8_1");
_Static_assert(sizeof(block_q2_K) == 84, "block_q2_K");
_Static_assert(sizeof(block_q3_K) == 110, "block_q3_K");
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K");
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K");
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K");
_Static_assert(sizeof(block_q8_K) == 292, "block_q8_K");
_Static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl");
_Static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs");

/* the 16 values an IQ4_NL / IQ4_XS nibble stands for (ggml's kvalues_iq4nl; iquants_generic.c) */
extern const int8_t el_iq4nl_values[16];

/* ---- float <-> half: IEEE binary16, round to nearest even (portable; no F16C needed) ---- */
static inline float el_fp32_from_bits(uint32_t w) { float f; memcpy(&f, &w, 4); return f; }
static inline uint32_t el_fp32_to_bits(float f) { uint32_t w; memcpy(&w, &f, 4); return w; }

static inline float el_half_to_float(el_half h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return el_fp32_from_bits(sign | 0x7f800000u | (man << 13));  /* inf / nan */
    if (exp != 0) return el_fp32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
    /* zero or subnormal: man * 2^-24 is exact in float */
    const float v = (float)man * 0x1.0p-24f;
    return sign ? -v : v;
}

static inline el_half el_float_to_half(float f) {
    const uint32_t w = el_fp32_to_bits(f);
    const uint16_t sign = (uint16_t)((w >> 16) & 0x8000u);
    const uint32_t aw = w & 0x7fffffffu;
    if (aw > 0x7f800000u) return (el_half)(sign | 0x7e00u);          /* nan */
    if (aw >= 0x477ff000u) return (el_half)(sign | 0x7c00u);         /* rounds to inf */
    if (aw < 0x38800000u) {                                          /* subnormal half or zero */
        /* value / 2^-24 rounded to nearest even; the float add does the rounding */
        const float a = el_fp32_from_bits(aw);
        const float r = a * 0x1.0p+24f;  /* exact: scales by a power of two */
        const uint32_t m = (uint32_t)lrintf(r);
        return (el_half)(sign | m);  /* m == 0x400 becomes the smallest normal, correctly */
    }
    /* normal: drop 13 mantissa bits with round-to-nearest-even; carry may bump the exponent */
    const uint32_t rebias = aw - (112u << 23);
    const uint32_t round = 0xfffu + ((rebias >> 13) & 1u);
    return (el_half)(sign | ((rebias + round) >> 13));
}

static inline float el_bf16_to_float(el_bf16 h) { return el_fp32_from_bits((uint32_t)h << 16); }

static inline el_bf16 el_float_to_bf16(float f) {  /* round to nearest even, NaN kept quiet */
    uint32_t u = el_fp32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (el_bf16)((u >> 16) | 64);
    return (el_bf16)((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

#define EL_H2F(x) el_half_to_float(x)
#define EL_F2H(x) el_float_to_half(x)

/* round to nearest, ties to even (the default FP rounding mode), as ggml's reference
 * quantizers round; callers keep |x| < 2^22 */
static inline int el_nearest_int(float fval) { return (int)lrintf(fval); }

/* the sum of 8 float lanes in the tree of llama.cpp's x86 hsum_float_8:
 * ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) */
static inline float el_hsum8(const float l[8]) {
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

#define EL_MIN(a, b) ((a) < (b) ? (a) : (b))
#define EL_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
