/* Shared pieces of the AArch64 NEON kernels (arm_neon*.c): the int8 dot products at both levels
 * (plain NEON and sdot), lane helpers, and the macros that define each kernel at both levels.
 * Each arm_neon*.c file is its own translation unit with the library's flags (so a build compiles
 * them side by side); only they include this, and only on aarch64.
 *
 * Levels, chosen at run time: plain ARMv8.0 NEON (e.g. Cortex-A72) and the same kernels with the
 * int8 dot product `sdot` (FEAT_DotProd, ARMv8.2+: Cortex-A76, Apple M1). Every file of the
 * library is built with the same flags and no -march, and GCC 12 will not inline vdotq_s32 under
 * a target pragma or attribute, so `sdot` is emitted with inline assembly; it only runs inside
 * kernels registered when the CPU reports the feature (arm_neon.c).
 *
 * Numerics of the quantized types: integer sums are exact (int32) and the float steps are the
 * generic twins' (quants_generic.c, kquants_generic.c, iquants_generic.c): same operations, same
 * operands, same order, vfmaq where the twins call fmaf; each file says how it keeps that order. */
#ifndef EDGELLM_ARM_NEON_COMMON_H
#define EDGELLM_ARM_NEON_COMMON_H

/* every float multiply and add rounded on its own, as the twins: GCC writes vmulq_f32 as `a * b`,
 * which it could otherwise fuse with a following add */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <arm_neon.h>
#include "el_internal.h"

#define EL_INLINE static inline __attribute__((always_inline))
#define MAX_NC 8  /* activation rows one tile call keeps accumulators for */

/* hardware half -> float (exact for every non-NaN half) */
EL_INLINE float h2f(const el_half *p) {
    __fp16 h;
    memcpy(&h, p, sizeof h);
    return (float)h;
}

EL_INLINE int32x4_t sdot(int32x4_t acc, int8x16_t a, int8x16_t b) {
    __asm__(".arch armv8.2-a+dotprod\n\tsdot %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(a), "w"(b));
    return acc;
}

/* acc plus the 16 products a[i]*b[i] spread over its 4 lanes. Which lane gets which product
 * differs between the levels; callers only use the sum over all lanes, which is exact. */
EL_INLINE int32x4_t dot_s8(int32x4_t acc, int8x16_t a, int8x16_t b, const int dp) {
    if (dp) return sdot(acc, a, b);
    /* int8*int8 fits int16; pairs are added only once widened to int32 */
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
}

/* lane i = a[4i]*b[4i] + ... + a[4i+3]*b[4i+3] (exact). `narrow`: |a| <= 63, so a sum of two
 * products fits int16 (else a may be -128 and pairs are added in int32). */
EL_INLINE int32x4_t dot4_s8(int8x16_t a, int8x16_t b, const int dp, const int narrow) {
    if (dp) return sdot(vdupq_n_s32(0), a, b);
    const int16x8_t p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b)), p1 = vmull_high_s8(a, b);
    if (narrow) return vpaddlq_s16(vpaddq_s16(p0, p1));
    return vpaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1));
}

/* acc + x * d[lane] with one rounding; the lane a constant once inlined */
EL_INLINE float32x4_t fma_lane(float32x4_t acc, float32x4_t x, float32x4_t d, const int lane) {
    switch (lane) {
    case 0: return vfmaq_laneq_f32(acc, x, d, 0);
    case 1: return vfmaq_laneq_f32(acc, x, d, 1);
    case 2: return vfmaq_laneq_f32(acc, x, d, 2);
    default: return vfmaq_laneq_f32(acc, x, d, 3);
    }
}

/* Lane r = total of p[r] (R == 4); every lane = total of p[0] (R == 1). */
EL_INLINE int32x4_t row_sums(const int32x4_t *p, const int R) {
    if (R == 1) return vdupq_n_s32(vaddvq_s32(p[0]));
    return vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
}

/* Lane r = half *p[r] as float (R == 4); every lane = *p[0] (R == 1). */
EL_INLINE float32x4_t row_halves(const el_half *const *p, const int R) {
    if (R == 1) return vdupq_n_f32(h2f(p[0]));
    uint16x4_t h = vdup_n_u16(0);
    h = vld1_lane_u16(p[0], h, 0);
    h = vld1_lane_u16(p[1], h, 1);
    h = vld1_lane_u16(p[2], h, 2);
    h = vld1_lane_u16(p[3], h, 3);
    return vcvt_f32_f16(vreinterpret_f16_u16(h));
}

/* out[c*ldo + r] = lane r of acc[c], r < R */
EL_INLINE void store_tile(const float32x4_t *acc, const int R, const int nc, float *out, size_t ldo) {
    for (int c = 0; c < nc; c++) {
        if (R == 4) vst1q_f32(out + (size_t)c * ldo, acc[c]);
        else out[(size_t)c * ldo] = vgetq_lane_f32(acc[c], 0);
    }
}

/* the twins' el_hsum8 of lanes 0-3 in a, 4-7 in b: ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)) */
EL_INLINE float hsum8(float32x4_t a, float32x4_t b) {
    const float32x4_t s = vaddq_f32(a, b);
    return vpadds_f32(vadd_f32(vget_low_f32(s), vget_high_f32(s)));
}

/* clang checks inline assembly against the target features of the function it ends up in (it
 * ignores sdot()'s .arch directive), so under clang the dotprod level's entry points carry the
 * feature. GCC takes the directive; its build is left as it was checked. */
#if defined(__clang__)
#define LEVEL_ATTR_1 __attribute__((target("dotprod")))
#else
#define LEVEL_ATTR_1
#endif
#define LEVEL_ATTR_0
#define LEVEL_ATTR(DP) LEVEL_ATTR_##DP

#define DEFINE_QGEMM(NAME, DRIVER, T, SMALL, DP)                                                   \
    LEVEL_ATTR(DP) static void gemm_##NAME(int n, const void *w, size_t ldw, int nr, const void *a, \
                                           size_t lda, int nc, float *out, size_t ldo) {           \
        DRIVER(T, SMALL, n, w, ldw, nr, a, lda, nc, out, ldo, DP);                                 \
    }                                                                                              \
    LEVEL_ATTR(DP) static void vec_dot_##NAME(int n, float *s, const void *x, const void *y) {    \
        gemm_##NAME(n, x, 0, 1, y, 0, 1, s, 1);                                                    \
    }

/* gemm_NAME_neon / vec_dot_NAME_neon and gemm_NAME_dotprod / vec_dot_NAME_dotprod */
#define DEFINE_QGEMM_LEVELS(NAME, DRIVER, T, SMALL)          \
    DEFINE_QGEMM(NAME##_neon, DRIVER, T, SMALL, 0)           \
    DEFINE_QGEMM(NAME##_dotprod, DRIVER, T, SMALL, 1)

/* type id's vec_dot and gemm (NEON_SET_SMALL: its small-batch pair) at the level dp */
#define NEON_SET(t, id, NAME, dp)                                             \
    ((t)[id].vec_dot = (dp) ? vec_dot_##NAME##_dotprod : vec_dot_##NAME##_neon, \
     (t)[id].gemm = (dp) ? gemm_##NAME##_dotprod : gemm_##NAME##_neon)
#define NEON_SET_SMALL(t, id, NAME, dp)                                             \
    ((t)[id].vec_dot_small = (dp) ? vec_dot_##NAME##_dotprod : vec_dot_##NAME##_neon, \
     (t)[id].gemm_small = (dp) ? gemm_##NAME##_dotprod : gemm_##NAME##_neon)

/* each file registers the kernels it owns at level dp (arm_neon.c calls them) */
void el_neon_register_q32(el_type_traits *t, int dp);      /* arm_neon_q32.c: Q4_0 .. Q8_0 */
void el_neon_register_kquants(el_type_traits *t, int dp);  /* arm_neon_kquants.c: Q2_K .. Q6_K */
void el_neon_register_iq4(el_type_traits *t, int dp);      /* arm_neon_iq4.c: IQ4_NL, IQ4_XS */
void el_neon_register_vops(int dp);                        /* arm_neon_attn.c: el_vops */

#endif
