/* Reference twins of the K-quants (256-value super-blocks; block layouts in common.h as in
 * ggml's ggml-common.h).
 *
 * quantize_row_*_ref write the same bytes as ggml's quantize_row_*_ref (ggml-quants.c, no
 * importance matrix): same algorithms, same order of float operations, same round-half-to-even.
 * Changing the shape of any float expression here can change output bytes.
 * vec_dot_*_q8_K_generic: integer sums within a super-block, float accumulation across blocks,
 * as ggml-cpu's ggml_vec_dot_*_q8_K_generic. Plain C11: this is what SIMD kernels are tested
 * against. */

#include "common.h"
#include "api/quants_k.h"

/* Byte-exactness needs every multiply and add rounded on its own: no fused multiply-add. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* ggml-quants.c: a group whose largest |x| is below this quantizes to all zeros */
#define GROUP_MAX_EPS 1e-15f

static inline int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* ---------------------------------------------------------------------------------------
 * Scale search helpers (ggml-quants.c make_qx_quants / make_q3_quants / make_qkx2_quants)
 * --------------------------------------------------------------------------------------- */

/* Symmetric quantization of n values to [-nmax, nmax-1], weighted by x^2 (ggml's rmse_type 1,
 * no importance weights), trying 18 scales around nmax/max. L gets l + nmax. Returns the scale. */
static float qx_quants_rmse1(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        const float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = (float)(-nmax) / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        const int l = clamp_int(el_nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            const int l = clamp_int(el_nearest_int(iscale * x[i]), -nmax, nmax - 1);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i)
                L[i] = (int8_t)(nmax + clamp_int(el_nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Symmetric quantization to [-nmax, nmax-1] refined by coordinate descent on the x^2-weighted
 * error (ggml's make_q3_quants with do_rmse). L gets l + nmax. Returns the scale. */
static float q3_quants_rmse(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        const float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    const float iscale = (float)(-nmax) / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        const int l = clamp_int(el_nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * (float)L[i] * (float)L[i];
                const int new_l = clamp_int(el_nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    slx += w * x[i] * (float)new_l;
                    sl2 += w * (float)new_l * (float)new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; ++i) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Asymmetric quantization x ~ scale * L - the_min, L in [0, nmax], weighted; tries nstep+1
 * scales (rmin + rdelta*is + nmax)/(max - min), each with the least-squares scale and min for
 * its L, keeping the one of least weighted error (|diff| if use_mad, else diff^2).
 * ggml's make_qkx2_quants. Returns the scale; *the_min gets the (non-negative) min. */
static float qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                         float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                         int use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.f;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        const int l = el_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)clamp_int(l, 0, nmax);
        float diff = scale * (float)L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            const int l = clamp_int(el_nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            const float w = weights[i];
            sum_l += w * (float)l;
            sum_l2 += w * (float)l * (float)l;
            sum_xl += w * (float)l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * (float)Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* Q4_K / Q5_K: 8 pairs of 6-bit (scale, min) in 12 bytes, as ggml's get_scale_min_k4:
 * j < 4: scale = q[j] & 63, min = q[j+4] & 63; j >= 4: low nibbles in q[j+4], top two bits in
 * the top bits of q[j-4] (scale) and q[j] (min). */
static inline void get_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static inline void set_scale_min_k4(int j, uint8_t *q, uint8_t ls, uint8_t lm) {
    if (j < 4) {
        q[j] = ls;
        q[j + 4] = lm;
    } else {
        q[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
        q[j - 4] |= (uint8_t)((ls >> 4) << 6);
        q[j] |= (uint8_t)((lm >> 4) << 6);
    }
}

/* Q3_K: 16 6-bit scales in 12 bytes: low nibbles in bytes 0..7 (j < 8 low half, j >= 8 high
 * half of byte j-8), top two bits of scale j at bit 2*(j/4) of byte 8 + j%4. Returns scale - 32. */
static inline int q3_K_scale(const uint8_t *s, int j) {
    const int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
    const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

/* 2-bit packing shared by Q2_K and Q3_K: byte l of each 32-byte chunk holds values
 * l, l+32, l+64, l+96 of its 128 values at bits 0, 2, 4, 6. */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; ++l)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                      (L[j + l + 96] << 6));
}

/* value i of a 2-bit packed super-block */
static inline int unpack_2bit(const uint8_t *qs, int i) {
    return (qs[(i / 128) * 32 + i % 32] >> (2 * ((i % 128) / 32))) & 3;
}

/* ---------------------------------------------------------------------------------------
 * Q2_K: 16 groups of 16, x ~ d*sc*q - dmin*m, q 2-bit, sc/m 4-bit (scales[j] = sc | m << 4)
 * --------------------------------------------------------------------------------------- */

void quantize_row_q2_K_ref(const float *x, void *vy, int64_t k) {
    block_q2_K *y = vy;
    const int64_t nb = k / QK_K;
    const float q4scale = 15.f;
    uint8_t L[QK_K], Laux[16];
    float weights[16], mins[QK_K / 16], scales[QK_K / 16];

    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < QK_K / 16; ++j) {
            for (int l = 0; l < 16; ++l) weights[l] = fabsf(x[16 * j + l]);
            scales[j] = qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux,
                                    -0.5f, 0.1f, 15, 1);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < QK_K / 16; ++j)
                y[i].scales[j] = (uint8_t)el_nearest_int(iscale * scales[j]);
            y[i].d = EL_F2H(max_scale / q4scale);
        } else {
            memset(y[i].scales, 0, sizeof y[i].scales);
            y[i].d = EL_F2H(0.f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < QK_K / 16; ++j)
                y[i].scales[j] |= (uint8_t)(el_nearest_int(iscale * mins[j]) << 4);
            y[i].dmin = EL_F2H(max_min / q4scale);
        } else {
            y[i].dmin = EL_F2H(0.f);
        }
        /* requantize against the rounded scales; a group whose scale rounded to 0 keeps L */
        for (int j = 0; j < QK_K / 16; ++j) {
            const float d = EL_H2F(y[i].d) * (float)(y[i].scales[j] & 0xF);
            if (d == 0) continue;
            const float dm = EL_H2F(y[i].dmin) * (float)(y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ++ii)
                L[16 * j + ii] = (uint8_t)clamp_int(el_nearest_int((x[16 * j + ii] + dm) / d), 0, 3);
        }
        pack_2bit(L, y[i].qs);
    }
}

void dequantize_row_q2_K(const void *vx, float *y, int64_t k) {
    const block_q2_K *x = vx;
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; ++i) {
        const float d = EL_H2F(x[i].d), dmin = EL_H2F(x[i].dmin);
        for (int j = 0; j < QK_K / 16; ++j) {
            const uint8_t sc = x[i].scales[j];
            const float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
            for (int l = 0; l < 16; ++l)
                *y++ = dl * (float)unpack_2bit(x[i].qs, 16 * j + l) - ml;
        }
    }
}

/* ---------------------------------------------------------------------------------------
 * Q3_K: 16 groups of 16, x ~ d*(sc-32)*(q-4), q 3-bit (2 low bits in qs, high bit in hmask)
 * --------------------------------------------------------------------------------------- */

void quantize_row_q3_K_ref(const float *x, void *vy, int64_t k) {
    block_q3_K *y = vy;
    const int64_t nb = k / QK_K;
    int8_t L[QK_K];
    float scales[QK_K / 16];

    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < QK_K / 16; ++j) {
            scales[j] = q3_quants_rmse(16, 4, x + 16 * j, L + 16 * j);
            const float scale = fabsf(scales[j]);
            if (scale > amax) { amax = scale; max_scale = scales[j]; }
        }
        memset(y[i].scales, 0, sizeof y[i].scales);
        if (max_scale != 0) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < QK_K / 16; ++j) {
                /* ggml stores the rounded value in an int8_t before clamping */
                const int l = clamp_int((int8_t)el_nearest_int(iscale * scales[j]), -32, 31) + 32;
                if (j < 8) y[i].scales[j] = (uint8_t)(l & 0xF);
                else y[i].scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
                y[i].scales[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            y[i].d = EL_F2H(1 / iscale);
        } else {
            y[i].d = EL_F2H(0.f);
        }
        for (int j = 0; j < QK_K / 16; ++j) {
            const float d = EL_H2F(y[i].d) * (float)q3_K_scale(y[i].scales, j);
            if (d == 0) continue;
            for (int ii = 0; ii < 16; ++ii)
                L[16 * j + ii] = (int8_t)(clamp_int(el_nearest_int(x[16 * j + ii] / d), -4, 3) + 4);
        }
        /* high bit of value j goes to bit j/32 of hmask[j%32] */
        uint8_t low[QK_K];
        memset(y[i].hmask, 0, sizeof y[i].hmask);
        for (int j = 0; j < QK_K; ++j) {
            int l = L[j];
            if (l > 3) {
                y[i].hmask[j % 32] |= (uint8_t)(1 << (j / 32));
                l -= 4;
            }
            low[j] = (uint8_t)l;
        }
        pack_2bit(low, y[i].qs);
    }
}

void dequantize_row_q3_K(const void *vx, float *y, int64_t k) {
    const block_q3_K *x = vx;
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; ++i) {
        const float d_all = EL_H2F(x[i].d);
        for (int j = 0; j < QK_K / 16; ++j) {
            const float dl = d_all * (float)q3_K_scale(x[i].scales, j);
            for (int l = 0; l < 16; ++l) {
                const int v = 16 * j + l;
                const int hbit = (x[i].hmask[v % 32] >> (v / 32)) & 1;
                *y++ = dl * (float)(unpack_2bit(x[i].qs, v) - (hbit ? 0 : 4));
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------
 * Q4_K / Q5_K: 8 groups of 32, x ~ d*sc*q - dmin*m, sc/m 6-bit (get_scale_min_k4),
 * q 4-bit (Q4_K) or 5-bit (Q5_K, high bit in qh)
 * --------------------------------------------------------------------------------------- */

/* Shared first half of quantize_row_q4_K_ref / q5_K_ref: group scales, 6-bit packing, d and
 * dmin, then requantize into L (values 0..nmax). rmin and nstep are the scale search ranges. */
static void quantize_k4_scales(const float *x, int nmax, float rmin, int nstep, uint8_t *L,
                               el_half *yd, el_half *ydmin, uint8_t *yscales) {
    uint8_t Laux[32];
    float weights[32], mins[QK_K / 32], scales[QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; ++j) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin,
                                0.1f, nstep, 0);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < QK_K / 32; ++j) {
        /* ggml rounds into a uint8_t, then caps at 63 */
        const uint8_t ls = (uint8_t)el_nearest_int(inv_scale * scales[j]);
        const uint8_t lm = (uint8_t)el_nearest_int(inv_min * mins[j]);
        set_scale_min_k4(j, yscales, EL_MIN(63, ls), EL_MIN(63, lm));
    }
    *yd = EL_F2H(max_scale / 63.f);
    *ydmin = EL_F2H(max_min / 63.f);

    for (int j = 0; j < QK_K / 32; ++j) {
        uint8_t sc, m;
        get_scale_min_k4(j, yscales, &sc, &m);
        const float d = EL_H2F(*yd) * (float)sc;
        if (d == 0) continue;
        const float dm = EL_H2F(*ydmin) * (float)m;
        for (int ii = 0; ii < 32; ++ii)
            L[32 * j + ii] = (uint8_t)clamp_int(el_nearest_int((x[32 * j + ii] + dm) / d), 0, nmax);
    }
}

void quantize_row_q4_K_ref(const float *x, void *vy, int64_t k) {
    block_q4_K *y = vy;
    const int64_t nb = k / QK_K;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
        quantize_k4_scales(x, 15, -1.f, 20, L, &y[i].d, &y[i].dmin, y[i].scales);
        /* byte l of each 32-byte chunk: value l (low nibble) and value l+32 (high) of its 64 */
        for (int j = 0; j < QK_K; j += 64)
            for (int l = 0; l < 32; ++l)
                y[i].qs[j / 2 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

void quantize_row_q5_K_ref(const float *x, void *vy, int64_t k) {
    block_q5_K *y = vy;
    const int64_t nb = k / QK_K;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
        quantize_k4_scales(x, 31, -0.5f, 15, L, &y[i].d, &y[i].dmin, y[i].scales);
        /* low nibbles as Q4_K; the high bit of value v goes to bit v/32 of qh[v%32] */
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int v = 0; v < QK_K; ++v)
            if (L[v] > 15) y[i].qh[v % 32] |= (uint8_t)(1 << (v / 32));
        for (int j = 0; j < QK_K; j += 64)
            for (int l = 0; l < 32; ++l)
                y[i].qs[j / 2 + l] = (uint8_t)((L[j + l] & 0xF) | ((L[j + l + 32] & 0xF) << 4));
    }
}

/* value v (0..255) of a Q4_K / Q5_K super-block's 4-bit part */
static inline int unpack_4bit(const uint8_t *qs, int v) {
    const uint8_t b = qs[(v / 64) * 32 + v % 32];
    return (v % 64) < 32 ? (b & 0xF) : (b >> 4);
}

void dequantize_row_q4_K(const void *vx, float *y, int64_t k) {
    const block_q4_K *x = vx;
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; ++i) {
        const float d = EL_H2F(x[i].d), dmin = EL_H2F(x[i].dmin);
        for (int j = 0; j < QK_K / 32; ++j) {
            uint8_t sc, m;
            get_scale_min_k4(j, x[i].scales, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            for (int l = 0; l < 32; ++l) *y++ = dl * (float)unpack_4bit(x[i].qs, 32 * j + l) - ml;
        }
    }
}

void dequantize_row_q5_K(const void *vx, float *y, int64_t k) {
    const block_q5_K *x = vx;
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; ++i) {
        const float d = EL_H2F(x[i].d), dmin = EL_H2F(x[i].dmin);
        for (int j = 0; j < QK_K / 32; ++j) {
            uint8_t sc, m;
            get_scale_min_k4(j, x[i].scales, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            for (int l = 0; l < 32; ++l) {
                const int v = 32 * j + l;
                const int q = unpack_4bit(x[i].qs, v) | (((x[i].qh[l] >> j) & 1) << 4);
                *y++ = dl * (float)q - ml;
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------
 * Q6_K: 16 groups of 16, x ~ d*sc*(q-32), sc int8, q 6-bit (4 low bits in ql, 2 in qh)
 * --------------------------------------------------------------------------------------- */

void quantize_row_q6_K_ref(const float *x, void *vy, int64_t k) {
    block_q6_K *y = vy;
    const int64_t nb = k / QK_K;
    int8_t L[QK_K];
    float scales[QK_K / 16];

    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < QK_K / 16; ++ib) {
            scales[ib] = qx_quants_rmse1(16, 32, x + 16 * ib, L + 16 * ib);
            const float abs_scale = fabsf(scales[ib]);
            if (abs_scale > max_abs_scale) { max_abs_scale = abs_scale; max_scale = scales[ib]; }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -128.f / max_scale;
        y[i].d = EL_F2H(1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ++ib)
            y[i].scales[ib] = (int8_t)EL_MIN(127, el_nearest_int(iscale * scales[ib]));
        for (int j = 0; j < QK_K / 16; ++j) {
            const float d = EL_H2F(y[i].d) * (float)y[i].scales[j];
            if (d == 0) continue;
            for (int ii = 0; ii < 16; ++ii)
                L[16 * j + ii] = (int8_t)(clamp_int(el_nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
        }
        /* per 128 values: ql[l] = v[l] | v[l+64] << 4, ql[l+32] = v[l+32] | v[l+96] << 4,
         * qh[l] = the four high 2-bit pairs of v[l], v[l+32], v[l+64], v[l+96] */
        for (int j = 0; j < QK_K; j += 128) {
            uint8_t *ql = y[i].ql + j / 2, *qh = y[i].qh + j / 4;
            for (int l = 0; l < 32; ++l) {
                const uint8_t *v = (const uint8_t *)L + j + l;
                ql[l] = (uint8_t)((v[0] & 0xF) | ((v[64] & 0xF) << 4));
                ql[l + 32] = (uint8_t)((v[32] & 0xF) | ((v[96] & 0xF) << 4));
                qh[l] = (uint8_t)((v[0] >> 4) | ((v[32] >> 4) << 2) | ((v[64] >> 4) << 4) |
                                  ((v[96] >> 4) << 6));
            }
        }
    }
}

/* value v (0..255) of a Q6_K super-block, minus 32 */
static inline int unpack_q6(const block_q6_K *b, int v) {
    const int half = v / 128, r = v % 128, quarter = r / 32, l = r % 32;
    const uint8_t lo = b->ql[64 * half + 32 * (quarter & 1) + l];
    const int low4 = quarter < 2 ? (lo & 0xF) : (lo >> 4);
    const int high2 = (b->qh[32 * half + l] >> (2 * quarter)) & 3;
    return (low4 | (high2 << 4)) - 32;
}

void dequantize_row_q6_K(const void *vx, float *y, int64_t k) {
    const block_q6_K *x = vx;
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; ++i) {
        const float d = EL_H2F(x[i].d);
        for (int v = 0; v < QK_K; ++v)
            *y++ = d * (float)x[i].scales[v / 16] * (float)unpack_q6(&x[i], v);
    }
}

/* ---------------------------------------------------------------------------------------
 * Q8_K (activations): x ~ d*q, q int8, d float; bsums = sums of each 16 q
 * --------------------------------------------------------------------------------------- */

void quantize_row_q8_K_ref(const float *x, void *vy, int64_t k) {
    block_q8_K *y = vy;
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < QK_K; ++j) {
            const float ax = fabsf(x[j]);
            if (ax > amax) { amax = ax; max = x[j]; }
        }
        if (amax == 0) {
            /* ggml leaves bsums untouched here; we write zeros, which they are */
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        /* -127 (not -128) as ggml, so that every q fits in [-127, 127] */
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; ++j) y[i].qs[j] = (int8_t)EL_MIN(127, el_nearest_int(iscale * x[j]));
        for (int j = 0; j < QK_K / 16; ++j) {
            int sum = 0;
            for (int ii = 0; ii < 16; ++ii) sum += y[i].qs[16 * j + ii];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

void dequantize_row_q8_K(const void *vx, float *y, int64_t k) {
    const block_q8_K *x = vx;
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; ++i)
        for (int j = 0; j < QK_K; ++j) *y++ = x[i].d * (float)x[i].qs[j];
}

/* ---------------------------------------------------------------------------------------
 * Dot products with a Q8_K row. Per super-block everything is integer: isum =
 * sum(scale_g * sum_g(q_w * q_act)) and, for types with mins, summs = sum(m_g * bsum_g). The
 * float part is the one llama.cpp's tiled K-quant gemm uses (its path for batches, which the
 * reference outputs come from, as GCC compiles it): r = isum * d [then fma(-dmin, summs, r)],
 * and the row sum is fma(r, d_act, sum) super-block by super-block. Every SIMD path reproduces
 * these bits.
 * --------------------------------------------------------------------------------------- */

static inline float k_term(float sum, int isum, float d, float d_act) { return fmaf((float)isum * d, d_act, sum); }
static inline float k_term_min(float sum, int isum, int summs, float d, float dmin, float d_act) {
    return fmaf(fmaf(-dmin, (float)summs, (float)isum * d), d_act, sum);
}

/* sum over the 16-value group g of q8 * q */
static inline int dot16(const int8_t *q8, const int8_t *q, int g) {
    int s = 0;
    for (int l = 16 * g; l < 16 * g + 16; ++l) s += q8[l] * q[l];
    return s;
}

void vec_dot_q2_K_q8_K_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q2_K *x = vx;
    const block_q8_K *y = vy;
    const int nb = n / QK_K;
    int8_t q[QK_K];
    float sumf = 0;
    for (int i = 0; i < nb; ++i) {
        for (int v = 0; v < QK_K; ++v) q[v] = (int8_t)unpack_2bit(x[i].qs, v);
        int isum = 0, summs = 0;
        for (int g = 0; g < QK_K / 16; ++g) {
            isum += (x[i].scales[g] & 0xF) * dot16(y[i].qs, q, g);
            summs += y[i].bsums[g] * (x[i].scales[g] >> 4);
        }
        sumf = k_term_min(sumf, isum, summs, EL_H2F(x[i].d), EL_H2F(x[i].dmin), y[i].d);
    }
    *s = sumf;
}

void vec_dot_q3_K_q8_K_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    const int nb = n / QK_K;
    int8_t q[QK_K];
    float sumf = 0;
    for (int i = 0; i < nb; ++i) {
        for (int v = 0; v < QK_K; ++v) {
            const int hbit = (x[i].hmask[v % 32] >> (v / 32)) & 1;
            q[v] = (int8_t)(unpack_2bit(x[i].qs, v) - (hbit ? 0 : 4));
        }
        int isum = 0;
        for (int g = 0; g < QK_K / 16; ++g) isum += q3_K_scale(x[i].scales, g) * dot16(y[i].qs, q, g);
        sumf = k_term(sumf, isum, EL_H2F(x[i].d), y[i].d);
    }
    *s = sumf;
}

/* the small-batch orders' float step (ggml's x86 vec_dot of Q3_K, Q5_K, Q6_K): 8 integer lanes of
 * a super-block, acc[k] = fma(d_act * d, lane k, acc[k]) */
static inline void lanes8_fma(float acc[8], float d, const int lane[8]) {
    for (int k = 0; k < 8; ++k) acc[k] = fmaf(d, (float)lane[k], acc[k]);
}

/* llama.cpp's x86 vec_dot for Q3_K (below 8 activation rows; from 8 on its tiled gemm, whose
 * order is the one above): 8 integer lanes per super-block, lane k = sum over the values v with
 * (v % 32) / 4 == k of scale(v / 16) * q_v * q8_v (q signed, -4..3); lanes8_fma; el_hsum8 at the end */
void vec_dot_q3_K_q8_K_small_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    float acc[8] = {0};
    for (int i = 0; i < n / QK_K; ++i) {
        int lane[8] = {0};
        for (int v = 0; v < QK_K; ++v) {
            const int q = unpack_2bit(x[i].qs, v) - (((x[i].hmask[v % 32] >> (v / 32)) & 1) ? 0 : 4);
            lane[(v % 32) / 4] += q3_K_scale(x[i].scales, v / 16) * q * y[i].qs[v];
        }
        lanes8_fma(acc, y[i].d * EL_H2F(x[i].d), lane);
    }
    *s = el_hsum8(acc);
}

/* Q4_K / Q5_K integers over sub-blocks j0 .. j1-1 (32 values each) once the values are
 * unpacked into q[256]: *isum = sum sc * dot, *summs = sum m * bsum */
static void k4_ints(const block_q8_K *y, const int8_t *q, const uint8_t *scales, int j0, int j1, int *isum,
                    int *summs) {
    *isum = *summs = 0;
    for (int j = j0; j < j1; ++j) {
        uint8_t sc, m;
        get_scale_min_k4(j, scales, &sc, &m);
        *isum += sc * (dot16(y->qs, q, 2 * j) + dot16(y->qs, q, 2 * j + 1));
        *summs += m * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
    }
}

/* Q5_K once its values are unpacked into q[256] */
static float dot_k4_block(float sum, const block_q8_K *y, const int8_t *q, const uint8_t *scales, el_half d,
                          el_half dmin) {
    int isum, summs;
    k4_ints(y, q, scales, 0, QK_K / 32, &isum, &summs);
    return k_term_min(sum, isum, summs, EL_H2F(d), EL_H2F(dmin), y->d);
}

/* Q4_K is the exception: llama.cpp repacks Q4_K weights (8 rows interleaved). Its x86 gemm over
 * them accumulates in float every 64 values (span 2 sub-blocks), its gemv (the small-batch
 * kernel) every super-block (span 8): per span, the integer I = sum of sc * dot and
 * M = sum of m * bsum over its sub-blocks, then acc = fma(I, d * d_act, acc) and
 * accm = fma(M, dmin * d_act, accm); the result is acc - accm. */
static float q4_K_dot(int n, const block_q4_K *x, const block_q8_K *y, int span) {
    int8_t q[QK_K];
    float acc = 0.0f, accm = 0.0f;
    for (int i = 0; i < n / QK_K; ++i) {
        for (int v = 0; v < QK_K; ++v) q[v] = (int8_t)unpack_4bit(x[i].qs, v);
        const float dd = EL_H2F(x[i].d) * y[i].d, dm = EL_H2F(x[i].dmin) * y[i].d;
        for (int j = 0; j < QK_K / 32; j += span) {
            int isum, summs;
            k4_ints(&y[i], q, x[i].scales, j, j + span, &isum, &summs);
            acc = fmaf((float)isum, dd, acc);
            accm = fmaf((float)summs, dm, accm);
        }
    }
    return acc - accm;
}

void vec_dot_q4_K_q8_K_generic(int n, float *s, const void *vx, const void *vy) { *s = q4_K_dot(n, vx, vy, 2); }
void vec_dot_q4_K_q8_K_small_generic(int n, float *s, const void *vx, const void *vy) { *s = q4_K_dot(n, vx, vy, 8); }

void vec_dot_q5_K_q8_K_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    const int nb = n / QK_K;
    int8_t q[QK_K];
    float sumf = 0;
    for (int i = 0; i < nb; ++i) {
        for (int v = 0; v < QK_K; ++v)
            q[v] = (int8_t)(unpack_4bit(x[i].qs, v) | (((x[i].qh[v % 32] >> (v / 32)) & 1) << 4));
        sumf = dot_k4_block(sumf, &y[i], q, x[i].scales, x[i].d, x[i].dmin);
    }
    *s = sumf;
}

/* llama.cpp's x86 vec_dot for Q5_K (what it takes below 8 activation rows; from 8 on its tiled
 * gemm, whose order is the one above): 8 integer lanes per super-block, lane k = sum over the
 * eight 32-value sub-blocks s of sc_s * dot(values 32s + 4k .. 32s + 4k + 3); acc[k] =
 * fma(d_act * d, lane, acc[k]); the mins through a scalar chain summs = fma(-d_act * dmin,
 * sum m_s * bsum_s, summs); el_hsum8(acc) + summs at the end */
void vec_dot_q5_K_q8_K_small_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    const int nb = n / QK_K;
    float acc[8] = {0}, summs = 0.0f;
    for (int i = 0; i < nb; ++i) {
        int lane[8] = {0}, mins = 0;
        for (int sb = 0; sb < QK_K / 32; ++sb) {
            uint8_t sc, m;
            get_scale_min_k4(sb, x[i].scales, &sc, &m);
            mins += m * (y[i].bsums[2 * sb] + y[i].bsums[2 * sb + 1]);
            for (int l = 0; l < 32; ++l) {
                const int v = 32 * sb + l;
                const int q = unpack_4bit(x[i].qs, v) | (((x[i].qh[l] >> sb) & 1) << 4);
                lane[l / 4] += sc * q * y[i].qs[v];
            }
        }
        summs = fmaf(-y[i].d * EL_H2F(x[i].dmin), (float)mins, summs);
        lanes8_fma(acc, y[i].d * EL_H2F(x[i].d), lane);
    }
    *s = el_hsum8(acc) + summs;
}

void vec_dot_q6_K_q8_K_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    const int nb = n / QK_K;
    int8_t q[QK_K];
    float sumf = 0;
    for (int i = 0; i < nb; ++i) {
        for (int v = 0; v < QK_K; ++v) q[v] = (int8_t)unpack_q6(&x[i], v);
        int isum = 0;
        for (int g = 0; g < QK_K / 16; ++g) isum += x[i].scales[g] * dot16(y[i].qs, q, g);
        sumf = k_term(sumf, isum, EL_H2F(x[i].d), y[i].d);
    }
    *s = sumf;
}

/* llama.cpp's x86 vec_dot for Q6_K: 8 integer lanes per super-block, lane k = sum over the eight
 * 32-value chunks c of sc(16-group of values 4k..4k+3 of c) * dot(those 4 values, unbiased q)
 * minus 32 * (sc[2k] * bsum[2k] + sc[2k+1] * bsum[2k+1]); acc[k] = fma(d_act * d, lane, acc[k]);
 * el_hsum8 at the end (the lanes' integers differ from the plain sum, only their total is the same) */
void vec_dot_q6_K_q8_K_small_generic(int n, float *s, const void *vx, const void *vy) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    const int nb = n / QK_K;
    float acc[8] = {0};
    for (int i = 0; i < nb; ++i) {
        int lane[8] = {0};
        for (int v = 0; v < QK_K; ++v) {
            const int k = (v % 32) / 4;
            lane[k] += x[i].scales[v / 16] * (unpack_q6(&x[i], v) + 32) * y[i].qs[v];
        }
        for (int k = 0; k < 8; ++k)
            lane[k] -= 32 * (x[i].scales[2 * k] * y[i].bsums[2 * k] + x[i].scales[2 * k + 1] * y[i].bsums[2 * k + 1]);
        lanes8_fma(acc, y[i].d * EL_H2F(x[i].d), lane);
    }
    *s = el_hsum8(acc);
}
