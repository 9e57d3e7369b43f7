/* KV cache storage: per layer group, a pool of blocks of KT slots that grows a slab at a time.
 * Slabs are anonymous mappings, so a block costs memory only once it is written; the block
 * manager (src/edgellm/kv_cache.py) hands out low block ids first, which keeps the touched part
 * of the pool as small as the blocks in use. */
#include <stdlib.h>
#include <stdio.h>
#include <sys/mman.h>
#include "engine_internal.h"

static size_t k_block_bytes(const el_engine *e) { return sizeof(el_half) * (size_t)e->d.n_head_kv * e->d.head_dim_k * KT; }
static size_t v_block_bytes(const el_engine *e) { return sizeof(el_half) * (size_t)e->d.n_head_kv * e->d.head_dim_v * KT; }

static void *map_zeroed(size_t n) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

int el_kv_reserve(el_engine *e, int g, int n_blocks) {
    if (g < 0 || g > 1) return -1;
    kv_store *st = &e->kv[g];
    if (g == G_SWA && !el_engine_has_swa(e)) return 0;
    const int need = (n_blocks + SLAB_BLOCKS - 1) / SLAB_BLOCKS;
    if (need > st->cap_slabs) {
        const int cap = EL_MAX(need, 2 * st->cap_slabs);
        int32_t **pos = realloc(st->pos, sizeof(int32_t *) * (size_t)cap);
        if (!pos) return -1;
        st->pos = pos;
        for (int l = 0; l < e->d.n_layer; l++) {
            if (layer_group(e, l) != g) continue;
            el_half **k = realloc(st->k[l], sizeof(el_half *) * (size_t)cap);
            if (!k) return -1;
            st->k[l] = k;
            el_half **v = realloc(st->v[l], sizeof(el_half *) * (size_t)cap);
            if (!v) return -1;
            st->v[l] = v;
        }
        st->cap_slabs = cap;
    }
    while (st->n_slabs < need) {
        const int s = st->n_slabs;
        st->pos[s] = map_zeroed(sizeof(int32_t) * SLAB_BLOCKS * KT);
        if (!st->pos[s]) return -1;
        int ok = 1;
        for (int l = 0; l < e->d.n_layer && ok; l++) {
            if (layer_group(e, l) != g) continue;
            st->k[l][s] = map_zeroed(k_block_bytes(e) * SLAB_BLOCKS);
            st->v[l][s] = map_zeroed(v_block_bytes(e) * SLAB_BLOCKS);
            ok = st->k[l][s] && st->v[l][s];
            if (!ok) {  /* undo this slab */
                for (int m = 0; m <= l; m++) {
                    if (layer_group(e, m) != g) continue;
                    if (st->k[m][s]) munmap(st->k[m][s], k_block_bytes(e) * SLAB_BLOCKS);
                    if (st->v[m][s]) munmap(st->v[m][s], v_block_bytes(e) * SLAB_BLOCKS);
                }
                munmap(st->pos[s], sizeof(int32_t) * SLAB_BLOCKS * KT);
                return -1;
            }
        }
        st->n_slabs++;
    }
    st->n_blocks = EL_MAX(st->n_blocks, st->n_slabs * SLAB_BLOCKS);
    return st->n_blocks;
}

int el_kv_blocks(const el_engine *e, int g) { return g == 0 || g == 1 ? e->kv[g].n_blocks : -1; }

void el_kv_free_all(el_engine *e) {
    for (int g = 0; g < 2; g++) {
        kv_store *st = &e->kv[g];
        for (int s = 0; s < st->n_slabs; s++) {
            munmap(st->pos[s], sizeof(int32_t) * SLAB_BLOCKS * KT);
            for (int l = 0; l < e->d.n_layer; l++) {
                if (layer_group(e, l) != g) continue;
                munmap(st->k[l][s], k_block_bytes(e) * SLAB_BLOCKS);
                munmap(st->v[l][s], v_block_bytes(e) * SLAB_BLOCKS);
            }
        }
        if (st->k) for (int l = 0; l < e->d.n_layer; l++) { free(st->k[l]); free(st->v[l]); }
        free(st->k); free(st->v); free(st->pos);
        memset(st, 0, sizeof(*st));
    }
}

int el_kv_copy_block(el_engine *e, int g, int src, int dst) {
    const kv_store *st = &e->kv[g];
    if (g < 0 || g > 1 || src < 0 || dst < 0 || src >= st->n_blocks || dst >= st->n_blocks) return -2;
    if (src == dst) return 0;
    for (int l = 0; l < e->d.n_layer; l++) {
        if (layer_group(e, l) != g) continue;
        memcpy(kv_k(e, l, dst, 0), kv_k(e, l, src, 0), k_block_bytes(e));
        memcpy(kv_v(e, l, dst, 0), kv_v(e, l, src, 0), v_block_bytes(e));
    }
    memcpy(kv_pos(e, g, dst), kv_pos(e, g, src), sizeof(int32_t) * KT);
    return 0;
}

int el_kv_positions(const el_engine *e, int g, const int32_t *table, int n, int32_t *out) {
    if (g < 0 || g > 1 || n < 0) return -2;
    for (int i = 0; i < n; i++) {
        const int blk = table[i / KT];
        out[i] = blk >= 0 && blk < e->kv[g].n_blocks ? kv_pos(e, g, blk)[i % KT] : -1;
    }
    return 0;
}

/* rotate one stored key row (all kv heads of a slot) by the angles in rc */
static void rerope(el_engine *e, int l, int blk, int lane, const float *rc, float *buf, el_half *kp) {
    const el_model_desc *d = &e->d;
    const int hk = d->head_dim_k;
    for (int h = 0; h < d->n_head_kv; h++) {
        el_half *t = kv_k(e, l, blk, h);
        tile_get(t, hk, lane, kp);
        dequantize_row_f16(kp, buf, hk);
        el_rope(buf, 1, hk, d->n_rot, d->rope_type, rc);
        e->vops.f32_to_f16(hk, buf, kp);
        tile_put(t, hk, lane, kp);
    }
}

int el_kv_shift(el_engine *e, const int32_t *tables, int max_blocks, int n_slots, int n_keep, int n_discard) {
    const el_model_desc *d = &e->d;
    if (n_keep < 0 || n_discard <= 0 || n_keep + n_discard > n_slots || n_slots > max_blocks * KT) return -2;
    const int n_move = n_slots - n_keep - n_discard;
    /* every destination block must exist in the global group; in the sliding-window group those
     * whose sources exist */
    for (int g = 0; g < 2; g++) {
        if (g == G_SWA && !el_engine_has_swa(e)) continue;
        const int32_t *t = tables + (size_t)g * max_blocks;
        for (int s = n_keep; s < n_keep + n_move; s++) {
            const int src = t[(s + n_discard) / KT], dst = t[s / KT];
            if ((g == G_GLOBAL || src >= 0) && (dst < 0 || dst >= e->kv[g].n_blocks)) return -2;
            if (src >= e->kv[g].n_blocks) return -2;
        }
    }
    const int hk = d->head_dim_k, hv = d->head_dim_v;
    float *buf = malloc(sizeof(float) * (size_t)(hk + 2 * d->n_rot + 2));
    el_half *kp = malloc(sizeof(el_half) * (size_t)EL_MAX(hk, hv));
    if (!buf || !kp) { free(buf); free(kp); return -3; }
    float *rc = buf + hk;
    /* a rotation by -n_discard, without YaRN magnitude scaling (that is applied once already) */
    el_model_desc dd = *d;
    dd.yarn_attn_factor = 1.0f;
    for (int l = 0; l < d->n_layer; l++) {
        const el_layer *L = &e->layers[l];
        const int g = layer_group(e, l);
        const int32_t *t = tables + (size_t)g * max_blocks;
        if (d->n_rot) {
            el_rope_cache(rc, d->n_rot, (float)(-n_discard), L->rope_base, L->rope_scale, d->rope_freqs.data, &dd);
            if (d->yarn_ext_factor != 0.0f) {  /* undo the magnitude term el_rope_cache folded in */
                const float ms = 1.0f + 0.1f * logf(1.0f / L->rope_scale);
                for (int i = 0; i < d->n_rot; i++) rc[i] /= ms;
            }
        }
        for (int s = n_keep; s < n_keep + n_move; s++) {  /* ascending: sources lie ahead */
            const int src = t[(s + n_discard) / KT], dst = t[s / KT];
            if (src < 0) continue;
            const int ls = (s + n_discard) % KT, ld = s % KT;
            for (int h = 0; h < d->n_head_kv; h++) {
                tile_get(kv_k(e, l, src, h), hk, ls, kp);
                tile_put(kv_k(e, l, dst, h), hk, ld, kp);
                tile_get(kv_v(e, l, src, h), hv, ls, kp);
                tile_put(kv_v(e, l, dst, h), hv, ld, kp);
            }
            if (d->n_rot && L->use_rope) rerope(e, l, dst, ld, rc, buf, kp);
        }
    }
    for (int g = 0; g < 2; g++) {
        if (g == G_SWA && !el_engine_has_swa(e)) continue;
        const int32_t *t = tables + (size_t)g * max_blocks;
        for (int s = n_keep; s < n_keep + n_move; s++) {
            const int src = t[(s + n_discard) / KT], dst = t[s / KT];
            if (dst < 0 || src < 0) continue;  /* an absent source: the slot is out of every window */
            kv_pos(e, g, dst)[s % KT] = kv_pos(e, g, src)[(s + n_discard) % KT] - n_discard;
        }
    }
    free(buf);
    free(kp);
    return 0;
}
