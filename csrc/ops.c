/* Small float ops of the forward pass: RMS norm, RoPE, activations. */
#include "el_internal.h"

void el_rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    el_rmsnorm_from(y, x, w, n, eps, 0, 0.0);
}

void el_rmsnorm_from(float *y, const float *x, const float *w, int n, float eps, int i, double ss) {
    for (; i < n; i++) ss += (double)(x[i] * x[i]);  /* double accumulation, as ggml's rms_norm */
    const float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    if (w) for (int k = 0; k < n; k++) y[k] = x[k] * scale * w[k];
    else for (int k = 0; k < n; k++) y[k] = x[k] * scale;
}

void el_rmsnorm_rows(int rows, float *y, size_t ldy, const float *x, size_t ldx, const float *w, int n, float eps) {
    for (int r = 0; r < rows; r++) el_rmsnorm(y + (size_t)r * ldy, x + (size_t)r * ldx, w, n, eps);
}

/* YaRN correction range (dims whose wavelength crosses the original context), as
 * ggml_rope_yarn_corr_dims computes it. */
static float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return n_dims * logf(n_ctx_orig / (n_rot * 2.0f * (float)M_PI)) / (2.0f * logf(base));
}

/* cos/sin for one position: cache[2i], cache[2i+1] for rotation pair i < n_rot/2.
 * theta_i = pos * base^(-2i/n_rot) (computed by repeated multiplication as ggml does),
 * divided by freq_factors[i] when present, scaled by `scale` (linear) and YaRN-mixed. */
void el_rope_cache(float *cache, int n_rot, float pos, float base, float scale,
                   const float *freq_factors, const el_model_desc *d) {
    const float theta_scale = powf(base, -2.0f / n_rot);
    const float ext = d->yarn_ext_factor;
    float mscale = d->yarn_attn_factor > 0 ? d->yarn_attn_factor : 1.0f;
    float lo = 0, hi = 0;
    if (ext != 0.0f) {
        lo = floorf(yarn_corr_dim(n_rot, d->n_ctx_orig, d->yarn_beta_fast, base));
        hi = ceilf(yarn_corr_dim(n_rot, d->n_ctx_orig, d->yarn_beta_slow, base));
        lo = EL_MAX(0, lo);
        hi = EL_MIN(n_rot - 1, hi);
        mscale *= fmaf(0.1f, logf(1.0f / scale), 1.0f);
    }
    float theta = pos;
    for (int i = 0; i < n_rot / 2; i++) {
        const float extrap = freq_factors ? theta / freq_factors[i] : theta;
        float t = scale * extrap;
        if (ext != 0.0f) {
            const float y = (i - lo) / EL_MAX(0.001f, hi - lo);
            const float ramp = (1.0f - EL_MIN(1.0f, EL_MAX(0.0f, y))) * ext;
            /* llama.cpp's ggml-cpu is built with FMA and GCC's default contraction, which fuses the
             * first product of rope_yarn's `interp * (1 - mix) + extrap * mix` (its disassembly:
             * vfmadd132ss on interp, 1 - mix and the rounded extrap * mix) */
            t = fmaf(t, 1.0f - ramp, extrap * ramp);
        }
        cache[2 * i] = cosf(t) * mscale;
        cache[2 * i + 1] = sinf(t) * mscale;
        theta *= theta_scale;
    }
}

/* Rotate n_heads heads of head_dim values in place; NORM pairs (2i, 2i+1), NEOX pairs
 * (i, i + n_rot/2). Dims past n_rot are left as they are. */
/* x[0, n) by the orthonormal Walsh-Hadamard matrix of size `chunk` (a power of two), chunk by
 * chunk: scaled by 1/sqrt(chunk) first, then butterflies of span 1, 2, 4, ... (llama.cpp's FWHT
 * order). The matrix is symmetric and its own inverse. */
void el_fwht(float *x, int n, int chunk) {
    const float scale = 1.0f / sqrtf((float)chunk);
    for (int c0 = 0; c0 < n; c0 += chunk) {
        float *y = x + c0;
        for (int j = 0; j < chunk; j++) y[j] *= scale;
        for (int len = 1; len < chunk; len <<= 1)
            for (int i = 0; i < chunk; i += 2 * len)
                for (int j = i; j < i + len; j++) {
                    const float u = y[j], v = y[j + len];
                    y[j] = u + v;
                    y[j + len] = u - v;
                }
    }
}

void el_rope(float *x, int n_heads, int head_dim, int n_rot, int rope_type, const float *cache) {
    for (int h = 0; h < n_heads; h++) el_rope_pairs(x + (size_t)h * head_dim, n_rot, rope_type, cache, 0);
}

void el_rope_pairs(float *v, int n_rot, int rope_type, const float *cache, int i) {
    const int half = n_rot / 2;
    for (; i < half; i++) {
        const float c = cache[2 * i], s = cache[2 * i + 1];
        const int a = rope_type == EL_ROPE_NEOX ? i : 2 * i;
        const int b = rope_type == EL_ROPE_NEOX ? i + half : 2 * i + 1;
        const float x0 = v[a], x1 = v[b];
        /* the first product fused, as GCC contracts ggml's rotate_pairs */
        v[a] = fmaf(x0, c, -(x1 * s));
        v[b] = fmaf(x0, s, x1 * c);
    }
}

static float gelu_tanh_exact(float x) {
    const float k = 0.79788456080286535588f;  /* sqrt(2/pi) */
    /* the inner 1 + a*x*x fused, as GCC contracts ggml's ggml_gelu_f32 that fills its table */
    return 0.5f * x * (1.0f + tanhf(k * x * fmaf(0.044715f * x, x, 1.0f)));
}

/* GELU (tanh form) at half precision, as ggml computes it on CPU: the input is rounded to
 * f16 and the result is looked up in an f16 table; |x| >= 10 passes through (x or 0).
 * Matching this keeps gemma's FFN outputs where llama.cpp's are. */
static el_half gelu_table[1 << 16];
static int gelu_ready;

void el_gelu_init(void) {
    if (gelu_ready) return;
    for (int i = 0; i < (1 << 16); i++) gelu_table[i] = el_float_to_half(gelu_tanh_exact(el_half_to_float((el_half)i)));
    gelu_ready = 1;
}

/* gate[i] = gelu(gate[i]) * up[i] for n values (up NULL: gelu(gate[i]) alone): GELU from the f16
 * table (|x| >= 10 passes through as x or 0), the f16 conversions done by the vector helpers */
void el_geglu(const el_vec_ops *v, int64_t n, float *gate, const float *up) {
    el_half h[256];
    float g[256];
    for (int64_t i0 = 0; i0 < n; i0 += 256) {
        const int m = (int)EL_MIN(256, n - i0);
        v->f32_to_f16(m, gate + i0, h);
        for (int i = 0; i < m; i++) h[i] = gelu_table[h[i]];
        v->f16_to_f32(m, h, g);
        for (int i = 0; i < m; i++) {
            const float x = gate[i0 + i];
            const float y = x <= -10.0f ? 0.0f : x >= 10.0f ? x : g[i];
            gate[i0 + i] = up ? y * up[i0 + i] : y;
        }
    }
}
