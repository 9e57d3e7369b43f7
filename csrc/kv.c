/* KV cache storage: per layer group, a pool of blocks of KT slots that grows a slab at a time.
 * Slabs are anonymous memory, so a block costs memory only once it is written; the block
 * manager (src/edgellm/kv_cache.py) hands out low block ids first, which keeps the touched part
 * of the pool as small as the blocks in use (and contiguous: el_kv_settle).
 *
 * Cache types (for keys and values separately): f16, stored as [dim][KT] tiles per head (what
 * attention's f16 tiles read), or q8_0 / q4_0: keys as key tiles (per 32-dim block the KT slots'
 * quants side by side, el_internal.h), values as value tiles (per 32-dim group the KT slots' scales,
 * then their quants interleaved a pair of slots at a time, el_internal.h); values in groups of
 * dims, each group's parts of a slab's blocks consecutive (engine_internal.h). Rows
 * are quantized as llama.cpp copies rows into such a cache (q8_0 with the activation quantizer,
 * q4_0 with the reference one), after the engine rotated them by a Walsh-Hadamard matrix
 * (d.rot_k / d.rot_v; kv_cache.kv_rotation). A context shift dequantizes a moved key, rotates
 * it back, applies RoPE, rotates and quantizes it again. */
#include <stdlib.h>
#include <stdio.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#include "engine_internal.h"

/* layer l's keys (values) of one block */
static size_t k_block_bytes(const el_engine *e, int l) {
    return e->kl[l].part * (size_t)e->kl[l].groups * e->layers[l].n_head_kv;
}
static size_t v_block_bytes(const el_engine *e, int l) {
    return e->vl[l].part * (size_t)e->vl[l].groups * e->layers[l].n_head_kv;
}
/* layer l of group g holds a cache (gemma4's last layers read an earlier one's) */
static int holds(const el_engine *e, int l, int g) { return layer_group(e, l) == g && !e->layers[l].kv_share; }

/* Value groups: a quantized type's blocks (32 dims); f16: 32 dims where they divide head_dim_v,
 * else 16 or 8, else one group (attention splits the value dims of a step at multiples of 8) */
static int layout(kv_layout *x, int type, int dims, int is_v) {
    int gd = dims;
    if (type == EL_Q8_0 || type == EL_Q4_0) {
        if (dims % QK8_0) return -1;  /* whole blocks per head */
        gd = is_v ? QK8_0 : dims;
    } else if (type != EL_F16) {
        return -1;
    } else if (is_v) {
        gd = dims % 32 == 0 ? 32 : dims % 16 == 0 ? 16 : dims % 8 == 0 ? 8 : dims;
    }
    x->type = type;
    x->dims = gd;
    x->groups = dims / gd;
    x->row = type == EL_F16 ? sizeof(el_half) * (size_t)gd : el_row_size(type, gd);
    x->part = x->row * KT;
    return 0;
}

int el_kv_init(el_engine *e, int type_k, int type_v) {
    free(e->kl);
    free(e->vl);
    e->kl = calloc((size_t)e->d.n_layer, sizeof(kv_layout));
    e->vl = calloc((size_t)e->d.n_layer, sizeof(kv_layout));
    if (!e->kl || !e->vl) return -1;
    for (int l = 0; l < e->d.n_layer; l++)
        if (layout(&e->kl[l], type_k, e->layers[l].head_dim_k, 0) != 0 ||
            layout(&e->vl[l], type_v, e->layers[l].head_dim_v, 1) != 0)
            return -1;
    return 0;
}

/* one slot's row in a [dim][KT] tile */
static void tile_put(el_half *t, int dim, int lane, const el_half *src) {
    for (int i = 0; i < dim; i++) t[(size_t)i * KT + lane] = src[i];
}
static void tile_get(const el_half *t, int dim, int lane, el_half *dst) {
    for (int i = 0; i < dim; i++) dst[i] = t[(size_t)i * KT + lane];
}

/* head h's keys (v = 0) or values (v = 1) of a block: the part of group c */
static uint8_t *part_of(const el_engine *e, int v, int l, int blk, int h, int c) {
    return v ? kv_vb(e, l, blk, h, c) : kv_kb(e, l, blk, h);
}

/* slot `lane`'s row of a quantized part: values as a value tile (el_vq_put), keys as a key tile
 * (el_kq_put) */
static void qrow_get(const kv_layout *x, int v, const uint8_t *part, int lane, uint8_t *row) {
    if (v) el_vq_get(x->type, part, lane, row);
    else el_kq_get(x->type, part, x->dims, lane, row);
}
static void qrow_put(const kv_layout *x, int v, uint8_t *part, int lane, const uint8_t *row) {
    if (v) el_vq_put(x->type, part, lane, row);
    else el_kq_put(x->type, part, x->dims, lane, row);
}

/* slot `lane` of head h's keys or values in a block, as floats (all the head's dims); h16: a
 * group's halves */
static void slot_get(const el_engine *e, int v, int l, int blk, int h, int lane, float *out, el_half *h16) {
    const kv_layout *x = v ? &e->vl[l] : &e->kl[l];
    uint8_t row[x->row];
    for (int c = 0; c < x->groups; c++) {
        const uint8_t *p = part_of(e, v, l, blk, h, c);
        float *o = out + (size_t)c * x->dims;
        if (x->type == EL_F16) {
            tile_get((const el_half *)p, x->dims, lane, h16);
            e->vops.f16_to_f32(x->dims, h16, o);
        } else {
            qrow_get(x, v, p, lane, row);
            e->traits[x->type].to_float(row, o, x->dims);
        }
    }
}
static void slot_put(const el_engine *e, int v, int l, int blk, int h, int lane, const float *in, el_half *h16) {
    const kv_layout *x = v ? &e->vl[l] : &e->kl[l];
    uint8_t row[x->row];
    for (int c = 0; c < x->groups; c++) {
        uint8_t *p = part_of(e, v, l, blk, h, c);
        const float *s = in + (size_t)c * x->dims;
        if (x->type == EL_F16) {
            e->vops.f32_to_f16(x->dims, s, h16);
            tile_put((el_half *)p, x->dims, lane, h16);
        } else {
            e->traits[x->type].from_float(s, row, x->dims);
            qrow_put(x, v, p, lane, row);
        }
    }
}
/* the stored bytes of a slot moved as they are */
static void slot_move(const el_engine *e, int v, int l, int src, int ls, int dst, int ld, int h, el_half *h16) {
    const kv_layout *x = v ? &e->vl[l] : &e->kl[l];
    uint8_t row[x->row];
    for (int c = 0; c < x->groups; c++) {
        const uint8_t *ps = part_of(e, v, l, src, h, c);
        uint8_t *pd = part_of(e, v, l, dst, h, c);
        if (x->type == EL_F16) {
            tile_get((const el_half *)ps, x->dims, ls, h16);
            tile_put((el_half *)pd, x->dims, ld, h16);
        } else {
            qrow_get(x, v, ps, ls, row);
            qrow_put(x, v, pd, ld, row);
        }
    }
}

void el_kv_store(el_engine *e, int l, int blk, int lane, int v, int h, const float *x, el_half *buf) {
    slot_put(e, v, l, blk, h, lane, x, buf);
}

/* Slab memory. An extent reserves address space for many slabs at once, without access (it
 * costs no memory), 2 MB aligned; a slab is made readable and writable when the pool grows into
 * it. Within a slab, each layer of the group has its keys then its values (SLAB_BLOCKS blocks
 * each, page-aligned), then come the blocks' positions. So the blocks in use (low ids first, as
 * the block manager hands them out) are one contiguous run of memory from the extent's start,
 * which el_kv_settle can move into 2 MB pages as whole slabs fill: attention at depth streams
 * this run, and on 4 KB pages every page of it is a TLB miss. */
#define HUGE_BYTES ((size_t)2 << 20)
#define EXTENT_MIN_SLABS 64 /* the first reservation: 64 slabs (65,536 slots) of address space */

static size_t page_bytes(void) {
    const long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}
static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* the bytes of one slab of group g; the offsets of each layer's keys and values in it, and of
 * the positions, when asked */
static size_t slab_layout(const el_engine *e, int g, size_t *koff, size_t *voff, size_t *poff) {
    const size_t pg = page_bytes();
    size_t o = 0;
    for (int l = 0; l < e->d.n_layer; l++) {
        if (!holds(e, l, g)) continue;
        if (koff) koff[l] = o;
        o = round_up(o + k_block_bytes(e, l) * SLAB_BLOCKS, pg);
        if (voff) voff[l] = o;
        o = round_up(o + v_block_bytes(e, l) * SLAB_BLOCKS, pg);
    }
    if (poff) *poff = o;
    return round_up(o + sizeof(int32_t) * SLAB_BLOCKS * KT, pg);
}

static size_t extent_bytes(const kv_store *st, const kv_extent *x) { return round_up(x->cap * st->slab, HUGE_BYTES); }

/* address space for cap slabs, 2 MB aligned, without access; NULL when refused */
static uint8_t *reserve_space(size_t n) {
    const size_t len = n + HUGE_BYTES;
    uint8_t *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    uint8_t *q = (uint8_t *)round_up((uintptr_t)p, HUGE_BYTES);
    if (q > p) munmap(p, (size_t)(q - p));
    munmap(q + n, (size_t)(p + len - (q + n)));  /* at least a page: q - p < HUGE_BYTES */
    return q;
}

/* slabs [x->made, to) of extent x become usable and are entered in the slab tables */
static int open_slabs(el_engine *e, int g, kv_extent *x, int to, const size_t *koff, const size_t *voff, size_t poff) {
    kv_store *st = &e->kv[g];
    const size_t pg = page_bytes();
    uint8_t *a = x->base + (size_t)x->made * st->slab, *b = x->base + (size_t)to * st->slab;
    if (mprotect(a, round_up((size_t)(b - a), pg), PROT_READ | PROT_WRITE) != 0) return -1;
    for (int i = x->made; i < to; i++) {
        uint8_t *slab = x->base + (size_t)i * st->slab;
        const int s = x->first + i;
        for (int l = 0; l < e->d.n_layer; l++) {
            if (!holds(e, l, g)) continue;
            st->k[l][s] = slab + koff[l];
            st->v[l][s] = slab + voff[l];
        }
        st->pos[s] = (int32_t *)(slab + poff);
    }
    x->made = to;
    st->n_slabs = x->first + to;
    return 0;
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
            if (!holds(e, l, g)) continue;
            uint8_t **k = realloc(st->k[l], sizeof(uint8_t *) * (size_t)cap);
            if (!k) return -1;
            st->k[l] = k;
            uint8_t **v = realloc(st->v[l], sizeof(uint8_t *) * (size_t)cap);
            if (!v) return -1;
            st->v[l] = v;
        }
        st->cap_slabs = cap;
    }
    if (st->n_slabs >= need) return st->n_blocks;
    size_t *koff = malloc(sizeof(size_t) * 2 * (size_t)e->d.n_layer), *voff = koff + e->d.n_layer, poff;
    if (!koff) return -1;
    st->slab = slab_layout(e, g, koff, voff, &poff);
    int rc = 0;
    while (rc == 0 && st->n_slabs < need) {
        kv_extent *x = st->n_ext ? &st->ext[st->n_ext - 1] : NULL;
        if (!x || x->made == x->cap) {  /* a new extent: twice the slabs so far, or what is asked */
            if (st->n_ext == KV_EXTENTS) { rc = -1; break; }
            x = &st->ext[st->n_ext];
            *x = (kv_extent){.first = st->n_slabs, .cap = EL_MAX(need - st->n_slabs, EL_MAX(st->n_slabs, EXTENT_MIN_SLABS))};
            x->base = reserve_space(extent_bytes(st, x));
            if (!x->base) {  /* little address space (a 32-bit process): just what is asked */
                x->cap = need - st->n_slabs;
                x->base = reserve_space(extent_bytes(st, x));
            }
            if (!x->base) { rc = -1; break; }
            st->n_ext++;
        }
        rc = open_slabs(e, g, x, EL_MIN(x->cap, need - x->first), koff, voff, poff);
    }
    free(koff);
    st->n_blocks = EL_MAX(st->n_blocks, st->n_slabs * SLAB_BLOCKS);
    return rc == 0 ? st->n_blocks : -1;
}

int el_kv_blocks(const el_engine *e, int g) { return g == 0 || g == 1 ? e->kv[g].n_blocks : -1; }

#if defined(__linux__) && !defined(MADV_COLLAPSE)
#define MADV_COLLAPSE 25  /* Linux 6.1; older C libraries lack the name */
#endif

long long el_kv_settle(el_engine *e, int g, int n_written) {
    if (g < 0 || g > 1) return -2;
    kv_store *st = &e->kv[g];
    long long moved = 0;
#ifdef MADV_COLLAPSE
    for (int i = 0; i < st->n_ext; i++) {
        kv_extent *x = &st->ext[i];
        const int full = EL_MIN(x->made, EL_MAX(0, n_written / SLAB_BLOCKS - x->first));
        if (full <= x->settled) continue;
        /* the 2 MB ranges that hold only full slabs and were not whole at the last call */
        const size_t lo = x->settled * st->slab / HUGE_BYTES * HUGE_BYTES;
        const size_t hi = full * st->slab / HUGE_BYTES * HUGE_BYTES;
        x->settled = full;
        for (size_t o = lo; o < hi; o += HUGE_BYTES)  /* refused (an old kernel, no huge page free
                                                         now, pages never written): left as is */
            if (madvise(x->base + o, HUGE_BYTES, MADV_COLLAPSE) == 0) moved += (long long)HUGE_BYTES;
    }
#else
    (void)n_written;
    (void)st;
#endif
    return moved;
}

void el_kv_free_all(el_engine *e) {
    for (int g = 0; g < 2; g++) {
        kv_store *st = &e->kv[g];
        for (int i = 0; i < st->n_ext; i++) munmap(st->ext[i].base, extent_bytes(st, &st->ext[i]));
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
        if (!holds(e, l, g)) continue;
        for (int h = 0; h < e->layers[l].n_head_kv; h++) {
            memcpy(kv_kb(e, l, dst, h), kv_kb(e, l, src, h), e->kl[l].part);
            for (int c = 0; c < e->vl[l].groups; c++)
                memcpy(kv_vb(e, l, dst, h, c), kv_vb(e, l, src, h, c), e->vl[l].part);
        }
    }
    memcpy(kv_pos(e, g, dst), kv_pos(e, g, src), sizeof(int32_t) * KT);
    return 0;
}

int el_kv_clear_block(el_engine *e, int g, int blk) {
    if (g < 0 || g > 1 || blk < 0 || blk >= e->kv[g].n_blocks) return -2;
    for (int l = 0; l < e->d.n_layer; l++) {
        if (!holds(e, l, g)) continue;
        for (int h = 0; h < e->layers[l].n_head_kv; h++) {
            memset(kv_kb(e, l, blk, h), 0, e->kl[l].part);
            for (int c = 0; c < e->vl[l].groups; c++) memset(kv_vb(e, l, blk, h, c), 0, e->vl[l].part);
        }
    }
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

/* rotate the keys of one slot (all kv heads) by the angles in rc */
static void rerope(el_engine *e, int l, int blk, int lane, const float *rc, float *buf, el_half *h16) {
    const el_model_desc *d = &e->d;
    const int hk = e->layers[l].head_dim_k;
    for (int h = 0; h < e->layers[l].n_head_kv; h++) {
        slot_get(e, 0, l, blk, h, lane, buf, h16);
        if (d->rot_k) el_fwht(buf, hk, d->rot_k);  /* stored rotated: back, RoPE, and rotated again */
        e->vops.rope(buf, 1, hk, e->layers[l].n_rot, d->rope_type, rc);
        if (d->rot_k) el_fwht(buf, hk, d->rot_k);
        slot_put(e, 0, l, blk, h, lane, buf, h16);
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
    int hk = 0, hv = 0, n_rot = 0;  /* the largest of the layers' */
    for (int l = 0; l < d->n_layer; l++) {
        hk = EL_MAX(hk, e->layers[l].head_dim_k);
        hv = EL_MAX(hv, e->layers[l].head_dim_v);
        n_rot = EL_MAX(n_rot, e->layers[l].n_rot);
    }
    float *buf = malloc(sizeof(float) * (size_t)(hk + 2 * n_rot + 2));
    el_half *kp = malloc(sizeof(el_half) * (size_t)EL_MAX(hk, hv));
    if (!buf || !kp) { free(buf); free(kp); return -3; }
    float *rc = buf + hk;
    /* a rotation by -n_discard, without YaRN magnitude scaling (that is applied once already) */
    el_model_desc dd = *d;
    dd.yarn_attn_factor = 1.0f;
    for (int l = 0; l < d->n_layer; l++) {
        const el_layer *L = &e->layers[l];
        const int g = layer_group(e, l);
        if (g == G_NONE) continue;
        const int32_t *t = tables + (size_t)g * max_blocks;
        if (L->kv_share) continue;  /* its keys are another layer's */
        if (L->n_rot) {
            el_rope_cache(rc, L->n_rot, (float)(-n_discard), L->rope_base, L->rope_scale,
                          L->rope_freqs ? d->rope_freqs.data : NULL, &dd);
            if (d->yarn_ext_factor != 0.0f) {  /* undo the magnitude term el_rope_cache folded in */
                const float ms = fmaf(0.1f, logf(1.0f / L->rope_scale), 1.0f);  /* as el_rope_cache's */
                for (int i = 0; i < L->n_rot; i++) rc[i] /= ms;
            }
        }
        for (int s = n_keep; s < n_keep + n_move; s++) {  /* ascending: sources lie ahead */
            const int src = t[(s + n_discard) / KT], dst = t[s / KT];
            if (src < 0) continue;
            const int ls = (s + n_discard) % KT, ld = s % KT;
            for (int h = 0; h < L->n_head_kv; h++) {
                slot_move(e, 0, l, src, ls, dst, ld, h, kp);
                slot_move(e, 1, l, src, ls, dst, ld, h, kp);
            }
            if (L->n_rot && L->use_rope) rerope(e, l, dst, ld, rc, buf, kp);
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

/* A block's contents in the portable layout (the numba engine's and the state files'): per layer
 * of the group in order, the keys as [n_head_kv][KT] rows of the key type (f16: head_dim_k halves),
 * then the values the same; then the KT positions. */
size_t el_kv_block_bytes(const el_engine *e, int g) {
    size_t n = sizeof(int32_t) * KT;
    for (int l = 0; l < e->d.n_layer; l++)
        if (holds(e, l, g)) n += k_block_bytes(e, l) + v_block_bytes(e, l);
    return n;
}

/* head h's keys (v = 0) or values (v = 1) of a block <-> KT rows of all its dims in the portable
 * layout (rows: row bytes apart): f16 tiles and quantized key and value tiles transposed, group by
 * group */
static void head_rows(el_engine *e, int v, int l, int blk, int h, uint8_t *rows, size_t row, int to_rows) {
    const kv_layout *x = v ? &e->vl[l] : &e->kl[l];
    for (int c = 0; c < x->groups; c++) {
        uint8_t *part = part_of(e, v, l, blk, h, c);
        for (int lane = 0; lane < KT; lane++) {
            uint8_t *r = rows + (size_t)lane * row + (size_t)c * x->row;  /* a group's bytes of a row */
            if (x->type == EL_F16) {
                if (to_rows) tile_get((const el_half *)part, x->dims, lane, (el_half *)r);
                else tile_put((el_half *)part, x->dims, lane, (const el_half *)r);
            } else if (to_rows) {
                qrow_get(x, v, part, lane, r);
            } else {
                qrow_put(x, v, part, lane, r);
            }
        }
    }
}

static int block_io(el_engine *e, int g, int blk, uint8_t *buf, int to_buf) {
    if (g < 0 || g > 1 || blk < 0 || blk >= e->kv[g].n_blocks) return -2;
    uint8_t *p = buf;
    for (int l = 0; l < e->d.n_layer; l++) {
        if (!holds(e, l, g)) continue;
        /* a slot's row of one head */
        const size_t krow = e->kl[l].row * e->kl[l].groups, vrow = e->vl[l].row * e->vl[l].groups;
        for (int h = 0; h < e->layers[l].n_head_kv; h++, p += krow * KT) head_rows(e, 0, l, blk, h, p, krow, to_buf);
        for (int h = 0; h < e->layers[l].n_head_kv; h++, p += vrow * KT) head_rows(e, 1, l, blk, h, p, vrow, to_buf);
    }
    if (to_buf) memcpy(p, kv_pos(e, g, blk), sizeof(int32_t) * KT);
    else memcpy(kv_pos(e, g, blk), p, sizeof(int32_t) * KT);
    return 0;
}

int el_kv_read_block(el_engine *e, int g, int blk, uint8_t *out) { return block_io(e, g, blk, out, 1); }
int el_kv_write_block(el_engine *e, int g, int blk, const uint8_t *in) { return block_io(e, g, blk, (uint8_t *)in, 0); }
