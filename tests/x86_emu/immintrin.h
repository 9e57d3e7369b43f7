/* Stands in for the compiler's <immintrin.h> when tests/x86_emu builds csrc/x86_avx2.c and
 * csrc/x86_avx512.c with EL_X86_EMULATED: every intrinsic from SIMDe's portable C implementations
 * (Debian's libsimde-dev, header-only), so the AVX-VNNI and AVX-512 kernels run on any x86-64.
 * Added here: what SIMDe 0.7.4 lacks, and fused multiply-adds that round once (SIMDe's portable
 * ones round the product and the sum separately, which is not what the instruction does). */
#ifndef EL_X86_EMU_IMMINTRIN_H
#define EL_X86_EMU_IMMINTRIN_H

#define SIMDE_ENABLE_NATIVE_ALIASES
#define SIMDE_NO_NATIVE
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>
#include <simde/x86/fma.h>

typedef simde__mmask16 __mmask16;
typedef simde__mmask32 __mmask32;
typedef simde__mmask64 __mmask64;

/* AVX-VNNI: the VEX forms compute what the AVX512-VL ones do */
#define _mm256_dpbusd_avx_epi32 _mm256_dpbusd_epi32
#define _mm256_dpwssd_avx_epi32 _mm256_dpwssd_epi32

static inline float _cvtsh_ss(unsigned short h) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16((short)h))); }

static inline __m512 _mm512_cvtepi32_ps(__m512i x) {
    int32_t a[16];
    float f[16];
    _mm512_storeu_si512(a, x);
    for (int i = 0; i < 16; i++) f[i] = (float)a[i];
    return _mm512_loadu_ps(f);
}
#define _mm512_extractf32x8_ps(v, i) _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), i))
static inline __m512d _mm512_cvtps_pd(__m256 v) {  /* (vcvtps2pd: exact) */
    float f[8];
    double d[8];
    _mm256_storeu_ps(f, v);
    for (int i = 0; i < 8; i++) d[i] = (double)f[i];
    return _mm512_loadu_pd(d);
}
static inline __m512i _mm512_cvtepu16_epi32(__m256i x) {
    uint16_t h[16];
    int32_t a[16];
    _mm256_storeu_si256((__m256i *)h, x);
    for (int i = 0; i < 16; i++) a[i] = h[i];
    return _mm512_loadu_si512(a);
}
static inline float _mm512_cvtss_f32(__m512 v) { return _mm_cvtss_f32(_mm512_castps512_ps128(v)); }
static inline __m512i _mm512_zextsi256_si512(__m256i x) { return _mm512_inserti64x4(_mm512_setzero_si512(), x, 0); }
static inline __m512i _mm512_cvtepi8_epi32(__m128i x) {
    int8_t b[16];
    int32_t a[16];
    _mm_storeu_si128((__m128i *)b, x);
    for (int i = 0; i < 16; i++) a[i] = b[i];
    return _mm512_loadu_si512(a);
}
static inline __m512 _mm512_cvtph_ps(__m256i h) {
    const __m256 lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h)), hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

/* AVX-512 (F) narrowing (vpmovdw) and gather (vpgatherdd), lane by lane */
static inline __m256i _mm512_cvtepi32_epi16(__m512i x) {
    int32_t a[16];
    int16_t h[16];
    _mm512_storeu_si512(a, x);
    for (int i = 0; i < 16; i++) h[i] = (int16_t)a[i];
    return _mm256_loadu_si256((const __m256i *)h);
}
static inline __m512i _mm512_cvtps_epi32(__m512 v) {  /* vcvtps2dq: to nearest even (the default MXCSR) */
    float f[16];
    int32_t a[16];
    memcpy(f, &v, sizeof f);
    for (int i = 0; i < 16; i++) a[i] = fabsf(f[i]) < 0x1p31f ? (int32_t)nearbyintf(f[i]) : INT32_MIN;
    return _mm512_loadu_si512(a);
}
#define _mm512_shuffle_f32x4(a, b, imm) _mm512_castsi512_ps(_mm512_shuffle_i32x4(_mm512_castps_si512(a), _mm512_castps_si512(b), imm))
static inline __m512 _mm512_permute_ps(__m512 v, int imm) {  /* within each 128-bit lane */
    float a[16], r[16];
    memcpy(a, &v, sizeof a);
    for (int i = 0; i < 16; i++) r[i] = a[(i & ~3) + ((imm >> (2 * (i & 3))) & 3)];
    memcpy(&v, r, sizeof r);
    return v;
}
static inline __m512i emu_i32gather_epi32(__m512i vindex, const void *base, int scale) {
    int32_t ix[16], v[16];
    _mm512_storeu_si512(ix, vindex);
    for (int i = 0; i < 16; i++) memcpy(&v[i], (const char *)base + (int64_t)ix[i] * scale, 4);
    return _mm512_loadu_si512(v);
}
#define _mm512_i32gather_epi32(vindex, base, scale) emu_i32gather_epi32(vindex, base, scale)

#undef _mm_fmadd_ps
#undef _mm256_fmadd_ps
#undef _mm512_fmadd_ps
#undef _mm_fnmadd_ps
#undef _mm256_fnmadd_ps
#undef _mm512_fnmadd_ps
/* a * b + c (sign -1: -(a * b) + c) lane by lane, rounded once */
#define EMU_FMA(NAME, T, N, LOAD, STORE, SIGN)                 \
    static inline T NAME(T a, T b, T c) {                      \
        float x[16], y[16], z[16];                             \
        STORE(x, a);                                           \
        STORE(y, b);                                           \
        STORE(z, c);                                           \
        for (int i = 0; i < N; i++) z[i] = fmaf(SIGN x[i], y[i], z[i]); \
        return LOAD(z);                                        \
    }
EMU_FMA(_mm_fmadd_ps, __m128, 4, _mm_loadu_ps, _mm_storeu_ps, +)
EMU_FMA(_mm256_fmadd_ps, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, +)
EMU_FMA(_mm512_fmadd_ps, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, +)
EMU_FMA(_mm_fnmadd_ps, __m128, 4, _mm_loadu_ps, _mm_storeu_ps, -)
EMU_FMA(_mm256_fnmadd_ps, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, -)
EMU_FMA(_mm512_fnmadd_ps, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, -)
#undef EMU_FMA
/* a * b - c rounded once; a * b - c in the even lanes and a * b + c in the odd ones (rope_avx2) */
#undef _mm256_fmsub_ps
#undef _mm256_fmaddsub_ps
static inline __m256 _mm256_fmsub_ps(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, _mm256_xor_ps(c, _mm256_set1_ps(-0.0f))); }
static inline __m256 _mm256_fmaddsub_ps(__m256 a, __m256 b, __m256 c) {
    float x[8], y[8], z[8];
    _mm256_storeu_ps(x, a);
    _mm256_storeu_ps(y, b);
    _mm256_storeu_ps(z, c);
    for (int i = 0; i < 8; i++) z[i] = fmaf(x[i], y[i], i % 2 ? z[i] : -z[i]);
    return _mm256_loadu_ps(z);
}
/* vcvtps2ph of 16 lanes (the 8-lane F16C form twice) and the horizontal sum and maximum (no NaN
 * lanes: any order): SIMDe 0.7.4 lacks these 512-bit forms */
#define _mm512_cvtps_ph(v, rounding)                                                                   \
    _mm256_inserti128_si256(_mm256_castsi128_si256(_mm256_cvtps_ph(_mm512_castps512_ps256(v), rounding)), \
                            _mm256_cvtps_ph(_mm512_extractf32x8_ps(v, 1), rounding), 1)
static inline int _mm512_reduce_add_epi32(__m512i x) {
    int32_t a[16];
    _mm512_storeu_si512(a, x);
    int s = 0;
    for (int i = 0; i < 16; i++) s += a[i];
    return s;
}
static inline float _mm512_reduce_max_ps(__m512 x) {
    float a[16];
    _mm512_storeu_ps(a, x);
    float m = a[0];
    for (int i = 1; i < 16; i++) m = a[i] > m ? a[i] : m;
    return m;
}
/* lanes of k: a * b + c rounded once; the others keep c (SIMDe 0.7.4 lacks it) */
static inline __m512 _mm512_mask3_fmadd_ps(__m512 a, __m512 b, __m512 c, __mmask16 k) {
    return _mm512_mask_mov_ps(c, k, _mm512_fmadd_ps(a, b, c));
}
/* lanes of k: a + b; the others keep src (SIMDe 0.7.4 lacks the 256-bit form) */
static inline __m256i _mm256_mask_add_epi8(__m256i src, __mmask32 k, __m256i a, __m256i b) {
    return _mm512_castsi512_si256(_mm512_mask_add_epi8(_mm512_castsi256_si512(src), (__mmask64)k,
                                                       _mm512_castsi256_si512(a), _mm512_castsi256_si512(b)));
}

#endif
