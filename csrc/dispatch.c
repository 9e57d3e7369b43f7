/* Kernel dispatch: the type-traits table, filled at run time for the ISA the CPU supports
 * (or the one forced by EDGELLM_ISA through el_set_isa). */
#include <stdlib.h>
#include "el_internal.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

el_type_traits el_traits[EL_NTYPES];
el_vec_ops el_vops;
static int current_isa = -1;
static int current_features = 0;  /* el_isa_features() */

/* from_float is only ever used on activations: Q8_0 / Q8_1 take the activation quantizers,
 * the other types their reference quantizer (Q8_K's is also ggml's activation quantizer). */

/* ---- generic float helpers ---- */
static void f32_to_f16_generic(int n, const float *x, el_half *y) {
    for (int i = 0; i < n; i++) y[i] = el_float_to_half(x[i]);
}

static void dequantize_row_f16_vop(int n, const el_half *x, float *y) { dequantize_row_f16(x, y, n); }

static void qk_tile_generic(int hk, const float *q, int nq, int ldq, const el_half *kt, float *out) {
    for (int j = 0; j < nq; j++) {
        const float *qj = q + (size_t)j * ldq;
        for (int l = 0; l < 16; l++) {
            float lane[16] = {0};
            for (int d = 0; d < hk; d++) lane[d % 16] += qj[d] * el_half_to_float(kt[d * 16 + l]);
            out[j * 16 + l] = el_sum16(lane);
        }
    }
}

static void qk_tile_one_generic(int hk, const float *q, int nq, int ldq, const el_half *kt, float *out,
                                const el_half *next) {
    const int h64 = hk / 64 * 64;
    el_prefetch_l2(next, (size_t)hk * 32);
    for (int j = 0; j < nq; j++) {
        const float *qj = q + (size_t)j * ldq;
        float a[64][16];
        memset(a, 0, sizeof a);
        for (int d = 0; d < h64; d++)  /* products of f16 values are exact: one rounding, as an fma */
            for (int t = 0; t < 16; t++) a[d % 64][t] += qj[d] * el_half_to_float(kt[(size_t)d * 16 + t]);
        for (int t = 0; t < 16; t++) {
            float l[16];
            for (int i = 0; i < 16; i++) l[i] = (a[i][t] + a[32 + i][t]) + (a[16 + i][t] + a[48 + i][t]);
            double s = el_sum16(l);
            for (int d = h64; d < hk; d++) s += (double)(qj[d] * el_half_to_float(kt[(size_t)d * 16 + t]));
            out[j * 16 + t] = (float)s;
        }
    }
}

/* A slot's row of nb q8_0 / q4_0 blocks <-> its place in a key tile (el_internal.h): its scale of
 * block b at d[b][slot], its quants 4g..4g+3 of block b (q4_0: qs bytes) at [b][g][slot]. */
static void kq_move(int type, uint8_t *kt, int hk, int slot, uint8_t *row, int to_tile) {
    const int nb = hk / 32, ng = el_kq_groups(type);
    const size_t bsz = type == EL_Q4_0 ? sizeof(block_q4_0) : sizeof(block_q8_0);  /* d first, then qs */
    uint8_t *qs = kt + (size_t)nb * 16 * sizeof(el_half);
    for (int b = 0; b < nb; b++) {
        uint8_t *blk = row + (size_t)b * bsz, *d = kt + ((size_t)b * 16 + slot) * sizeof(el_half);
        if (to_tile) memcpy(d, blk, sizeof(el_half));
        else memcpy(blk, d, sizeof(el_half));
        for (int g = 0; g < ng; g++) {
            uint8_t *t = qs + (((size_t)b * ng + g) * 16 + slot) * 4, *r = blk + sizeof(el_half) + 4 * g;
            if (to_tile) memcpy(t, r, 4);
            else memcpy(r, t, 4);
        }
    }
}
void el_kq_put(int type, uint8_t *kt, int hk, int slot, const uint8_t *row) { kq_move(type, kt, hk, slot, (uint8_t *)row, 1); }
void el_kq_get(int type, const uint8_t *kt, int hk, int slot, uint8_t *row) { kq_move(type, (uint8_t *)kt, hk, slot, row, 0); }

/* A slot's row (one q8_0 / q4_0 block) <-> its place in a value tile (el_internal.h): its scale at
 * d[slot], its quant bytes (q4_0: qs bytes) every other byte of its pair's, from (slot & 1). */
static void vq_move(int type, uint8_t *vt, int slot, uint8_t *row, int to_tile) {
    const int nq = (int)el_vq_pair_bytes(type) / 2;  /* quant bytes a slot */
    uint8_t *d = vt + (size_t)slot * sizeof(el_half);
    uint8_t *q = (uint8_t *)el_vq_pairs(vt) + (size_t)(slot / 2) * el_vq_pair_bytes(type) + (slot & 1);
    if (to_tile) memcpy(d, row, sizeof(el_half));
    else memcpy(row, d, sizeof(el_half));
    for (int i = 0; i < nq; i++) {
        if (to_tile) q[2 * i] = row[sizeof(el_half) + i];
        else row[sizeof(el_half) + i] = q[2 * i];
    }
}
void el_vq_put(int type, uint8_t *vt, int slot, const uint8_t *row) { vq_move(type, vt, slot, (uint8_t *)row, 1); }
void el_vq_get(int type, const uint8_t *vt, int slot, uint8_t *row) { vq_move(type, (uint8_t *)vt, slot, row, 0); }

static void qk_q_generic(int type, int hk, const uint8_t *q, size_t ldq, int nq, const uint8_t *kt, float *out) {
    const int nb = hk / 32, ng = el_kq_groups(type);
    const el_half *dk = (const el_half *)kt;
    const uint8_t *qs = kt + (size_t)nb * 16 * sizeof(el_half);
    for (int j = 0; j < nq; j++) {
        const block_q8_0 *qj = (const block_q8_0 *)(q + (size_t)j * ldq);
        for (int l = 0; l < 16; l++) {
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                int32_t s = 0;
                for (int g = 0; g < ng; g++) {
                    const uint8_t *k = qs + (((size_t)b * ng + g) * 16 + l) * 4;
                    for (int i = 0; i < 4; i++) {
                        if (type == EL_Q4_0)
                            s += ((k[i] & 15) - 8) * qj[b].qs[4 * g + i] + ((k[i] >> 4) - 8) * qj[b].qs[16 + 4 * g + i];
                        else
                            s += (int8_t)k[i] * qj[b].qs[4 * g + i];
                    }
                }
                acc = fmaf(el_half_to_float(dk[b * 16 + l]) * el_half_to_float(qj[b].d), (float)s, acc);
            }
            out[j * 16 + l] = acc;
        }
    }
}
static void qk_q8_0_generic(int hk, const uint8_t *q, size_t ldq, const int32_t *qsum, int nq, const uint8_t *kt,
                            float *out, const uint8_t *next) {
    (void)qsum;
    el_prefetch_l2(next, el_kq_tile_bytes(EL_Q8_0, hk));
    qk_q_generic(EL_Q8_0, hk, q, ldq, nq, kt, out);
}
static void qk_q4_0_generic(int hk, const uint8_t *q, size_t ldq, const int32_t *qsum, int nq, const uint8_t *kt,
                            float *out, const uint8_t *next) {
    (void)qsum;
    el_prefetch_l2(next, el_kq_tile_bytes(EL_Q4_0, hk));
    qk_q_generic(EL_Q4_0, hk, q, ldq, nq, kt, out);
}

static int any16_generic(const float *w) {
    int any = 0;
    for (int l = 0; l < 16; l++) any |= w[l] != 0.0f;
    return any;
}

static void pv_tiles_generic(int nd, int nt, const el_half *const *vt, int nh, const float *w, int ldw, float *acc,
                             int lda, int sets, int t0, const el_half *const *next, int nn) {
    (void)next, (void)nn;
    for (int r = 0; r < nh; r++)
        for (int t = 0; t < nt; t++) {
            const float *wt = w + (size_t)r * ldw + t * 16;
            if (!any16_generic(wt)) continue;
            float *a = acc + (size_t)r * lda + (sets == 4 ? (size_t)((t0 + t) & 3) * nd * 16 : 0);
            for (int d = 0; d < nd; d++)
                for (int l = 0; l < 16; l++) a[d * 16 + l] += wt[l] * el_half_to_float(vt[t][d * 16 + l]);
        }
}

/* quant i (0..31) of slot l of a q8_0 / q4_0 value tile (q4_0: nibble - 8; el_internal.h) */
static int tile_quant(int q4, const uint8_t *vt, int l, int i) {
    const uint8_t *pair = el_vq_pairs(vt) + (size_t)(l / 2) * el_vq_pair_bytes(q4 ? EL_Q4_0 : EL_Q8_0) + (l & 1);
    if (q4) return (i < 16 ? pair[2 * i] & 15 : pair[2 * (i - 16)] >> 4) - 8;
    return (int8_t)pair[2 * i];
}

/* el_internal.h's integer weights of one (row, tile): W[l] = w[l] * d[l] * p rounded to
 * nearest even, saturated to int16, p = 2^(141 - E) with E the exponent bits of the largest of
 * 2^-48 and |w[l] * d[l]|; returns 1 / p */
static float pv_q_weights(const float *w, const float *d, int16_t *W) {
    float wd[16], m = 0x1p-48f;
    for (int l = 0; l < 16; l++) {
        wd[l] = w[l] * d[l];
        m = fabsf(wd[l]) > m ? fabsf(wd[l]) : m;
    }
    float inv;
    const float p = el_pvq_powers(m, &inv);
    for (int l = 0; l < 16; l++) {
        const float v = nearbyintf(wd[l] * p);  /* (the default rounding: to nearest even) */
        W[l] = (int16_t)(v > 32767.0f ? 32767.0f : v < -32768.0f ? -32768.0f : v);
    }
    return inv;
}

static void pv_q_generic(int q4, int nt, const uint8_t *const *vt, int nh, const float *w, int ldw, float *acc,
                         int lda) {
    for (int r = 0; r < nh; r++) {
        float P[32] = {0}, *a = acc + (size_t)r * lda;
        int took = 0;  /* a tile summed in P */
        for (int t = 0; t < nt; t++) {
            const float *wt = w + (size_t)r * ldw + t * 16;
            if (!vt[t] || !any16_generic(wt)) continue;
            took = 1;
            float d[16];
            int16_t W[16];
            for (int l = 0; l < 16; l++) {
                el_half h;
                memcpy(&h, vt[t] + (size_t)l * sizeof h, sizeof h);
                d[l] = el_half_to_float(h);
            }
            const float inv = pv_q_weights(wt, d, W);
            for (int i = 0; i < 32; i++) {
                int32_t S = 0;
                for (int l = 0; l < 16; l++) S += W[l] * tile_quant(q4, vt[t], l, i);
                P[i] = P[i] + (float)S * inv;  /* (the product exact: one rounding, as an fma) */
            }
        }
        for (int i = 0; i < 32 && took; i++) a[i] = a[i] + P[i];
    }
}

static void pv_q8_0_generic(int nt, const uint8_t *const *vt, int nh, const float *w, int ldw, float *acc, int lda) {
    pv_q_generic(0, nt, vt, nh, w, ldw, acc, lda);
}
static void pv_q4_0_generic(int nt, const uint8_t *const *vt, int nh, const float *w, int ldw, float *acc, int lda) {
    pv_q_generic(1, nt, vt, nh, w, ldw, acc, lda);
}

static void sum16_rows_generic(int n, const float *acc, float *out) {
    for (int i = 0; i < n; i++) out[i] = el_sum16(acc + 16 * i);
}

/* exp_sums: the exponentials, each 16's el_sum16 kept in sums (unless NULL) and summed in double */
static double exp_sums_generic(int n, float *x, float max, float *sums) {
    double sum = 0.0;
    for (int i = 0; i < n; i += 16) {
        for (int l = 0; l < 16; l++) x[i + l] = el_expf(x[i + l] - max);
        const float s = el_sum16(x + i);
        if (sums) sums[i / 16] = s;
        sum += s;
    }
    return sum;
}

static void scale_max_generic(int nh, const float *src, float scale, float *dst, size_t ldd, float *lmax) {
    for (int r = 0; r < nh; r++)
        for (int l = 0; l < 16; l++) {
            const float v = src[r * 16 + l] * scale;
            dst[(size_t)r * ldd + l] = v;
            lmax[r * 16 + l] = v > lmax[r * 16 + l] ? v : lmax[r * 16 + l];
        }
}

static void f16_scale_generic(int n, float *x, float s) {
    for (int i = 0; i < n; i++) x[i] = el_half_to_float(el_float_to_half(x[i] * s));
}

static void silu_mul_generic(int64_t n, float *g, const float *u) {
    for (int64_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + el_expf(0.0f - g[i])) * u[i];
}

static void quantize_row_f32(const float *x, void *y, int64_t k) { memcpy(y, x, (size_t)k * 4); }
static void dequantize_row_f32(const void *x, float *y, int64_t k) { memcpy(y, x, (size_t)k * 4); }

void el_register_generic(el_type_traits *t) {
#define T(id, b, sz, vdt, ff, tf, vd) t[id] = (el_type_traits){b, sz, vdt, ff, tf, vd, NULL, NULL, NULL, NULL, NULL}
    T(EL_F32, 1, 4, EL_F32, quantize_row_f32, dequantize_row_f32, vec_dot_f32_f32_generic);
    T(EL_F16, 1, 2, EL_F16, quantize_row_f16_ref, dequantize_row_f16, vec_dot_f16_f16_generic);
    T(EL_BF16, 1, 2, EL_BF16, quantize_row_bf16_ref, dequantize_row_bf16, vec_dot_bf16_bf16_generic);
    T(EL_Q4_0, 32, 18, EL_Q8_0, quantize_row_q4_0_ref, dequantize_row_q4_0, vec_dot_q4_0_q8_0_generic);
    T(EL_Q4_1, 32, 20, EL_Q8_1, quantize_row_q4_1_ref, dequantize_row_q4_1, vec_dot_q4_1_q8_1_generic);
    T(EL_Q5_0, 32, 22, EL_Q8_0, quantize_row_q5_0_ref, dequantize_row_q5_0, vec_dot_q5_0_q8_0_generic);
    T(EL_Q5_1, 32, 24, EL_Q8_1, quantize_row_q5_1_ref, dequantize_row_q5_1, vec_dot_q5_1_q8_1_generic);
    T(EL_Q8_0, 32, 34, EL_Q8_0, quantize_row_q8_0, dequantize_row_q8_0, vec_dot_q8_0_q8_0_generic);
    T(EL_Q8_1, 32, 36, EL_Q8_1, quantize_row_q8_1, NULL, NULL);
    T(EL_Q2_K, 256, 84, EL_Q8_K, quantize_row_q2_K_ref, dequantize_row_q2_K, vec_dot_q2_K_q8_K_generic);
    T(EL_Q3_K, 256, 110, EL_Q8_K, quantize_row_q3_K_ref, dequantize_row_q3_K, vec_dot_q3_K_q8_K_generic);
    T(EL_Q4_K, 256, 144, EL_Q8_K, quantize_row_q4_K_ref, dequantize_row_q4_K, vec_dot_q4_K_q8_K_generic);
    T(EL_Q5_K, 256, 176, EL_Q8_K, quantize_row_q5_K_ref, dequantize_row_q5_K, vec_dot_q5_K_q8_K_generic);
    T(EL_Q6_K, 256, 210, EL_Q8_K, quantize_row_q6_K_ref, dequantize_row_q6_K, vec_dot_q6_K_q8_K_generic);
    T(EL_Q8_K, 256, 292, EL_Q8_K, quantize_row_q8_K_ref, dequantize_row_q8_K, NULL);
    T(EL_IQ4_NL, 32, 18, EL_Q8_0, quantize_row_iq4_nl_ref, dequantize_row_iq4_nl, vec_dot_iq4_nl_q8_0_generic);
    T(EL_IQ4_XS, 256, 136, EL_Q8_K, quantize_row_iq4_xs_ref, dequantize_row_iq4_xs, vec_dot_iq4_xs_q8_K_generic);
#undef T
    t[EL_Q4_K].vec_dot_small = vec_dot_q4_K_q8_K_small_generic;
    t[EL_Q3_K].vec_dot_small = vec_dot_q3_K_q8_K_small_generic;
    t[EL_IQ4_XS].vec_dot_small = vec_dot_iq4_xs_q8_K_small_generic;
    t[EL_Q5_K].vec_dot_small = vec_dot_q5_K_q8_K_small_generic;
    t[EL_Q6_K].vec_dot_small = vec_dot_q6_K_q8_K_small_generic;
    t[EL_Q4_1].vec_dot_batch = vec_dot_q4_1_q8_1_batch_generic;
    t[EL_Q5_0].vec_dot_batch = vec_dot_q5_0_q8_0_batch_generic;
    t[EL_Q5_1].vec_dot_batch = vec_dot_q5_1_q8_1_batch_generic;
    t[EL_Q8_0].vec_dot_batch = vec_dot_q8_0_q8_0_batch_generic;
}

/* ---- CPU features ---- */
int el_cpu_isa_best(void) {
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return EL_ISA_GENERIC;
    int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    if (!(osxsave && avx && fma && f16c)) return EL_ISA_GENERIC;
    unsigned xlo, xhi;
    __asm__("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 6) != 6) return EL_ISA_GENERIC;  /* OS saves XMM+YMM */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return EL_ISA_GENERIC;
    int avx2 = (b >> 5) & 1, avx512f = (b >> 16) & 1, avx512bw = (b >> 30) & 1, avx512vl = (b >> 31) & 1;
    if (!avx2) return EL_ISA_GENERIC;
    if (avx512f && avx512bw && avx512vl && (xlo & 0xe6) == 0xe6) return EL_ISA_AVX512;
    return EL_ISA_AVX2;
#elif defined(__aarch64__)
    return EL_ISA_NEON;
#else
    return EL_ISA_GENERIC;
#endif
}

int el_set_isa(int isa) {
    int best = el_cpu_isa_best();
    if (isa < 0 || isa > best) isa = best;
#if defined(__x86_64__)
    if (isa == EL_ISA_NEON) isa = best;
#else
    if (isa == EL_ISA_AVX2 || isa == EL_ISA_AVX512) isa = best;
#endif
    el_type_traits t[EL_NTYPES];
    memset(t, 0, sizeof(t));
    el_register_generic(t);
    el_vops.f32_to_f16 = f32_to_f16_generic;
    el_vops.f16_to_f32 = dequantize_row_f16_vop;
    el_vops.qk_tile = qk_tile_generic;
    el_vops.qk_tile_one = qk_tile_one_generic;
    el_vops.qk_q8_0 = qk_q8_0_generic;
    el_vops.qk_q4_0 = qk_q4_0_generic;
    el_vops.pv_tiles = pv_tiles_generic;
    el_vops.pv_q8_0 = pv_q8_0_generic;
    el_vops.pv_q4_0 = pv_q4_0_generic;
    el_vops.sum16_rows = sum16_rows_generic;
    el_vops.silu_mul = silu_mul_generic;
    el_vops.scale_max = scale_max_generic;
    el_vops.exp_sums = exp_sums_generic;
    el_vops.f16_scale = f16_scale_generic;
    el_vops.rope = el_rope;
    el_vops.rmsnorm_rows = el_rmsnorm_rows;
    int features = 0;
#if defined(__x86_64__)
    if (isa >= EL_ISA_AVX2) el_register_avx2(t);
    if (isa >= EL_ISA_AVX512) el_register_avx512(t);
#endif
#if defined(__aarch64__)
    if (isa == EL_ISA_NEON && el_register_neon(t)) features |= 1;
#endif
    memcpy(el_traits, t, sizeof(t));
    el_gelu_init();
    current_isa = isa;
    current_features = features;
    return isa;
}

int el_get_isa(void) {
    if (current_isa < 0) el_set_isa(-1);
    return current_isa;
}

int el_isa_features(void) {
    el_get_isa();
    return current_features;
}
