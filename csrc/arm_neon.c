/* AArch64 NEON kernels: which level this CPU runs (plain ARMv8.0 NEON, or with the int8 dot
 * product sdot) and the registration of every NEON kernel at that level; the F32 / F16 rows.
 * The kernels live by what they own, each file its own translation unit (compiled side by side):
 *   arm_neon_common.h   shared pieces: int8 dot products at both levels, lane helpers, macros
 *   arm_neon_q32.c      legacy types Q4_0 .. Q8_0
 *   arm_neon_kquants.c  K-quants Q2_K .. Q6_K (and the small-batch orders of Q4_K / Q6_K)
 *   arm_neon_iq4.c      IQ4_NL, IQ4_XS
 *   arm_neon_attn.c     attention and FFN vector helpers (el_vops)
 *
 * F32 / F16: float products accumulated in double, 8 lanes (value i goes to lane i % 8), lanes
 * summed pairwise at the end, the last n % 8 products added in order; gemm and vec_dot share
 * this code, so they agree bit for bit (the generic twin sums in one sequential double). */
#if defined(__aarch64__)

#include "arm_neon_common.h"

#if defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)  /* Linux arch/arm64 uapi hwcap.h */
#endif
#elif defined(__APPLE__)
#include <sys/sysctl.h>
#endif

/* 1 when the CPU executes sdot (FEAT_DotProd) */
int el_neon_has_dotprod(void) {
#if defined(__linux__)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#elif defined(__APPLE__)
    int v = 0;
    size_t len = sizeof v;
    return sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &len, NULL, 0) == 0 && v != 0;
#else
    return 0;
#endif
}

/* ------------------------------------------------------------------------------------------ */
/* F32 / F16 rows                                                                             */

#define FSEG 256  /* F16 values converted to float at a time (a multiple of 8) */

/* acc lane (i % 8) += (double)(w[i] * a[i]) for i < n, n a multiple of 8 */
EL_INLINE void fdot_acc(float64x2_t *acc, const float *w, const float *a, int n) {
    for (int i = 0; i < n; i += 8) {
        const float32x4_t p0 = vmulq_f32(vld1q_f32(w + i), vld1q_f32(a + i));
        const float32x4_t p1 = vmulq_f32(vld1q_f32(w + i + 4), vld1q_f32(a + i + 4));
        acc[0] = vaddq_f64(acc[0], vcvt_f64_f32(vget_low_f32(p0)));
        acc[1] = vaddq_f64(acc[1], vcvt_high_f64_f32(p0));
        acc[2] = vaddq_f64(acc[2], vcvt_f64_f32(vget_low_f32(p1)));
        acc[3] = vaddq_f64(acc[3], vcvt_high_f64_f32(p1));
    }
}

/* the 8 lanes summed pairwise, then the tail products in order */
EL_INLINE float fdot_finish(const float64x2_t *acc, const float *w, const float *a, int tail) {
    const float64x2_t v = vaddq_f64(vaddq_f64(acc[0], acc[1]), vaddq_f64(acc[2], acc[3]));
    double s = vgetq_lane_f64(v, 0) + vgetq_lane_f64(v, 1);
    for (int i = 0; i < tail; i++) s += (double)(w[i] * a[i]);
    return (float)s;
}

EL_INLINE void halves_to_floats(const el_half *x, float *y, int n) {  /* n a multiple of 8 */
    for (int i = 0; i < n; i += 8) {
        const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(x + i));
        vst1q_f32(y + i, vcvt_f32_f16(vget_low_f16(h)));
        vst1q_f32(y + i + 4, vcvt_high_f32_f16(h));
    }
}

static void gemm_f32(int n, const void *w, size_t ldw, int nr, const void *a, size_t lda, int nc,
                     float *out, size_t ldo) {
    const int n8 = n & ~7;
    for (int r = 0; r < nr; r++) {
        const float *wr = (const float *)((const uint8_t *)w + (size_t)r * ldw);
        for (int c = 0; c < nc; c++) {
            const float *ac = (const float *)((const uint8_t *)a + (size_t)c * lda);
            float64x2_t acc[4] = {vdupq_n_f64(0.0), vdupq_n_f64(0.0), vdupq_n_f64(0.0), vdupq_n_f64(0.0)};
            fdot_acc(acc, wr, ac, n8);
            out[(size_t)c * ldo + r] = fdot_finish(acc, wr + n8, ac + n8, n - n8);
        }
    }
}

/* Up to 8 x 8 (row, activation) pairs per pass; each FSEG-value segment of a row is converted
 * to float once and used for all of the pass's pairs. */
static void gemm_f16(int n, const void *w, size_t ldw, int nr, const void *a, size_t lda, int nc,
                     float *out, size_t ldo) {
    const int n8 = n & ~7, tail = n - n8;
    float wf[FSEG] __attribute__((aligned(16)));
    float af[MAX_NC][FSEG] __attribute__((aligned(16)));
    float64x2_t acc[8][MAX_NC][4];
    for (int r0 = 0; r0 < nr; r0 += 8) {
        const int nrr = EL_MIN(8, nr - r0);
        for (int c0 = 0; c0 < nc; c0 += MAX_NC) {
            const int ncc = EL_MIN(MAX_NC, nc - c0);
#define WROW(r) ((const el_half *)((const uint8_t *)w + (size_t)(r0 + (r)) * ldw))
#define AROW(c) ((const el_half *)((const uint8_t *)a + (size_t)(c0 + (c)) * lda))
            for (int r = 0; r < nrr; r++)
                for (int c = 0; c < ncc; c++)
                    for (int l = 0; l < 4; l++) acc[r][c][l] = vdupq_n_f64(0.0);
            for (int s = 0; s < n8; s += FSEG) {
                const int len = EL_MIN(FSEG, n8 - s);
                for (int c = 0; c < ncc; c++) halves_to_floats(AROW(c) + s, af[c], len);
                for (int r = 0; r < nrr; r++) {
                    halves_to_floats(WROW(r) + s, wf, len);
                    for (int c = 0; c < ncc; c++) fdot_acc(acc[r][c], wf, af[c], len);
                }
            }
            for (int r = 0; r < nrr; r++) {
                float wt[8];
                for (int i = 0; i < tail; i++) wt[i] = h2f(WROW(r) + n8 + i);
                for (int c = 0; c < ncc; c++) {
                    float at[8];
                    for (int i = 0; i < tail; i++) at[i] = h2f(AROW(c) + n8 + i);
                    out[(size_t)(c0 + c) * ldo + r0 + r] = fdot_finish(acc[r][c], wt, at, tail);
                }
            }
#undef WROW
#undef AROW
        }
    }
}

static void vec_dot_f32(int n, float *s, const void *x, const void *y) { gemm_f32(n, x, 0, 1, y, 0, 1, s, 1); }
static void vec_dot_f16(int n, float *s, const void *x, const void *y) { gemm_f16(n, x, 0, 1, y, 0, 1, s, 1); }

/* ------------------------------------------------------------------------------------------ */

/* Registers the NEON kernels, with sdot when `dotprod` (only if the CPU has it). BF16 stays generic. */
void el_register_neon_level(el_type_traits *t, int dotprod) {
    t[EL_F32].vec_dot = vec_dot_f32;
    t[EL_F32].gemm = gemm_f32;
    t[EL_F16].vec_dot = vec_dot_f16;
    t[EL_F16].gemm = gemm_f16;
    el_neon_register_q32(t, dotprod);
    el_neon_register_kquants(t, dotprod);
    el_neon_register_iq4(t, dotprod);
    el_neon_register_vops(dotprod);
}

int el_register_neon(el_type_traits *t) {
    const int dotprod = el_neon_has_dotprod();
    el_register_neon_level(t, dotprod);
    return dotprod;
}

#endif /* __aarch64__ */
