/* Attention over the paged KV cache, per (run of up to QB queries of one sequence, head).
 *
 * As llama.cpp's default (non-flash) CPU path computes it, the reference we are held to: q
 * rounded to f16; scores from tinyBLAS's f16 gemm order (vops.qk_tile over one block = one tile
 * of KT keys), scaled, soft-capped, masked; softmax with ggml's exp, 16-value partial sums added
 * in double; probabilities rounded to f16; p.v in the same gemm order (vops.pv_tile, KT slot lanes
 * per output, reduced at the end). Masked slots weigh exactly 0 and tiles nobody sees are
 * skipped, so a query's result depends only on its own sequence's keys and their slots - not on
 * which other queries or sequences share the step (batch invariance), nor on how its sequence's
 * prompt was split into steps. With llama_order, a step of one token takes llama.cpp's vec_dot
 * order instead (vops.qk_tile_one; p.v lanes kept apart per tile index mod 4 and combined the
 * same way), so the single-stream API's decode steps give llama.cpp's bits. */
#include "engine_internal.h"

/* attention scratch per thread, in floats: queries, score tile, one row, p.v lanes (x4 for decode) */
size_t el_attention_scratch(int hk, int hv) {
    return (size_t)QB * hk + QB * KT + (size_t)EL_MAX(hk, hv) + 4 * (size_t)hv * KT;
}

static int visible(int ps, int p, int swa, int n_swa) { return ps >= 0 && ps <= p && !(swa && p - ps >= n_swa); }

void el_attention(el_engine *e, int l, int ith, int nth) {
    const el_model_desc *d = &e->d;
    const step_plan *pl = &e->plan;
    const el_batch *b = pl->b;
    const int g = layer_group(e, l), swa = g == G_SWA;
    const int hk = d->head_dim_k, hv = d->head_dim_v;
    const int group = d->n_head / d->n_head_kv;
    const int max_cap = e->n_ctx + KT;
    const int hmax = EL_MAX(hk, hv);
    float *sc = e->scores + (size_t)ith * QB * max_cap;     /* [QB][slots]: scores, then weights */
    float *qr = e->qround + (size_t)ith * el_attention_scratch(hk, hv); /* [QB][hk] queries rounded to f16 */
    float *tile = qr + (size_t)QB * hk;                     /* [QB][KT] scores of a tile */
    float *row = tile + QB * KT;                            /* one row */
    el_half *tmp = (el_half *)row;                          /* or 2*hmax halves */
    float *lanes = row + hmax;                              /* [4][hv][KT] p.v lanes of one query */
    const int one = b->llama_order && pl->n == 1;           /* llama.cpp's single-token order */
    const int od = d->n_head * hv, qd = d->n_head * hk;
    for (int task = ith; task < pl->n_qb * d->n_head; task += nth) {
        const int qb = task / d->n_head, h = task % d->n_head, kvh = h / group;
        const int s = pl->qb_seq[qb], m0 = pl->qb_row0[qb], mq = pl->qb_rows[qb];
        const int32_t *table = seq_table(b, g, s);
        const int n_slots = pl->row_slot[pl->seq_row0[s] + pl->seq_rows[s] - 1] + 1;
        const int n_tiles = (n_slots + KT - 1) / KT;
        int p_first = b->pos[m0], p_last = b->pos[m0];
        for (int j = 0; j < mq; j++) {
            p_first = EL_MIN(p_first, b->pos[m0 + j]);
            p_last = EL_MAX(p_last, b->pos[m0 + j]);
            e->vops.f32_to_f16(hk, e->q + (size_t)(m0 + j) * qd + (size_t)h * hk, tmp);
            e->vops.f16_to_f32(hk, tmp, qr + (size_t)j * hk);
        }
        float mx[QB];
        for (int j = 0; j < mq; j++) mx[j] = -INFINITY;
        int t_lo = n_tiles, t_hi = 0;  /* the tiles someone sees */
        for (int t = 0; t < n_tiles; t++) {
            const int blk = table[t];
            const int32_t *ps = blk >= 0 ? kv_pos(e, g, blk) : NULL;
            const int nt = EL_MIN(KT, n_slots - t * KT);
            int any = 0;
            for (int u = 0; u < nt && ps && !any; u++)
                any = ps[u] >= 0 && ps[u] <= p_last && !(swa && p_first - ps[u] >= d->n_swa && p_last - ps[u] >= d->n_swa);
            if (!any) {
                for (int j = 0; j < mq; j++)
                    for (int u = 0; u < KT; u++) sc[(size_t)j * max_cap + t * KT + u] = -INFINITY;
                continue;
            }
            t_lo = EL_MIN(t_lo, t);
            t_hi = t + 1;
            const el_half *K = kv_k(e, l, blk, kvh);
            if (one) e->vops.qk_tile_one(hk, qr, K, tile);
            else e->vops.qk_tile(hk, qr, mq, hk, K, tile);
            for (int j = 0; j < mq; j++) {
                const int p = b->pos[m0 + j];
                for (int u = 0; u < KT; u++) {
                    float v = -INFINITY;
                    if (u < nt && visible(ps[u], p, swa, d->n_swa)) {
                        v = tile[j * KT + u] * d->attn_scale;
                        if (d->attn_softcap > 0) v = d->attn_softcap * tanhf(v / d->attn_softcap);
                        if (v > mx[j]) mx[j] = v;
                    }
                    sc[(size_t)j * max_cap + t * KT + u] = v;
                }
            }
        }
        const int lo = t_lo * KT, n_pad = t_hi * KT;  /* the slots of the tiles seen */
        for (int j = 0; j < mq; j++) {
            float *out = e->xn + (size_t)(m0 + j) * od + (size_t)h * hv;
            if (t_lo >= t_hi) {  /* nothing visible (cannot happen for a query that sees itself) */
                memset(out, 0, sizeof(float) * hv);
                continue;
            }
            float *sj = sc + (size_t)j * max_cap;
            const double sum = e->vops.exp_sum(n_pad - lo, sj + lo, mx[j]);
            const float inv = sum > 0 ? (float)(1.0 / sum) : 0.0f;
            for (int u = lo; u < n_pad; u++) sj[u] *= inv;
            /* weights rounded to f16 (in place, through the vector conversions) */
            for (int s0 = lo; s0 < n_pad; s0 += 2 * hmax) {
                const int ns = EL_MIN(2 * hmax, n_pad - s0);
                e->vops.f32_to_f16(ns, sj + s0, tmp);
                e->vops.f16_to_f32(ns, tmp, sj + s0);
            }
            const size_t lsz = (size_t)hv * KT;
            memset(lanes, 0, sizeof(float) * lsz * (one ? 4 : 1));
            for (int t = t_lo; t < t_hi; t++) {
                int any = 0;
                for (int u = 0; u < KT; u++) any |= sj[t * KT + u] != 0.0f;
                if (any) e->vops.pv_tile(hv, sj + t * KT, kv_v(e, l, table[t], kvh), lanes + (one ? (size_t)(t % 4) * lsz : 0));
            }
            if (one)
                for (size_t i = 0; i < lsz; i++)
                    lanes[i] = (lanes[i] + lanes[2 * lsz + i]) + (lanes[lsz + i] + lanes[3 * lsz + i]);
            e->vops.sum16_rows(hv, lanes, out);
        }
    }
}
