/* AVX2 + FMA + F16C kernels, compiled with per-function target attributes so one build runs
 * on any x86-64 CPU; dispatch.c registers them only when the CPU has the features. */
#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#include "el_internal.h"

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static float dot_f16_f32_avx2(int n, const el_half *x, const float *y) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))), _mm256_loadu_ps(y + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i + 8))), _mm256_loadu_ps(y + i + 8), acc1);
    }
    float s = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) s += el_half_to_float(x[i]) * y[i];
    return s;
}

static void axpy_f16_avx2(int n, float a, const el_half *x, float *y) {
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * el_half_to_float(x[i]);
}

static void f32_to_f16_avx2(int n, const float *x, el_half *y) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = el_float_to_half(x[i]);
}

static void f16_to_f32_avx2(int n, const el_half *x, float *y) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = el_half_to_float(x[i]);
}

void el_register_avx2(el_type_traits *t) {
    (void)t;
    el_vops.dot_f16_f32 = dot_f16_f32_avx2;
    el_vops.axpy_f16 = axpy_f16_avx2;
    el_vops.f32_to_f16 = f32_to_f16_avx2;
    el_vops.f16_to_f32 = f16_to_f32_avx2;
}

#pragma GCC pop_options
#endif
