/* What the C checkers (tests/x86_emu/check_x86.c, tests/neon/test_neon.c) share: a seeded random
 * stream, a bit-for-bit float comparison, and quantized p.v called the way attention calls it.
 * Include after el_internal.h. */
#ifndef EL_C_CHECKS_H
#define EL_C_CHECKS_H

#include <string.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void) {  /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float uniform(void) { return (float)(next_u64() >> 40) * 0x1.0p-24f; }  /* [0, 1) */
static int below(int n) { return (int)(next_u64() % (uint64_t)n); }

static int same_bits(float a, float b) { return memcmp(&a, &b, 4) == 0; }

typedef void (*pv_q_fn)(int nt, const uint8_t *const *vt, int nh, const float *w, int ldw, float *acc, int lda);

/* vops.pv_q8_0 / pv_q4_0 over nt tiles, tile 0 being tile t0 of its sequence, as attention.c's
 * pv_q_tiles calls them: a call a chunk (EL_PV_CHUNK tiles), chunk k's sums into acc + (k - t0 /
 * EL_PV_CHUNK) * ldc (ldc 0: all into the same sums, chunk after chunk) */
static void pv_q_chunks(pv_q_fn pv, int nt, const uint8_t *const *vt, int nh, const float *w, int ldw, float *acc,
                        int lda, int t0, int ldc) {
    for (int c0 = 0, c1; c0 < nt; c0 = c1) {
        const int k = (t0 + c0) / EL_PV_CHUNK;
        c1 = (k + 1) * EL_PV_CHUNK - t0 < nt ? (k + 1) * EL_PV_CHUNK - t0 : nt;
        pv(c1 - c0, vt + c0, nh, w + 16 * c0, ldw, acc + (size_t)(k - t0 / EL_PV_CHUNK) * ldc, lda);
    }
}

#endif
