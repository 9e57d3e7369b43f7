/* Attention over the paged KV cache.
 *
 * The arithmetic is llama.cpp's default (non-flash) CPU path, the reference we are held to: q
 * rounded to f16; scores from tinyBLAS's f16 gemm order (vops.qk_tile over one block = one tile
 * of KT keys), scaled, soft-capped, masked; softmax with ggml's exp, 16-value partial sums added
 * in double in slot order; probabilities rounded to f16; p.v in the same gemm order
 * (vops.pv_tiles, KT slot lanes per output, reduced at the end). With llama_order, a step of one
 * token takes llama.cpp's vec_dot order instead (vops.qk_tile_one; p.v lanes kept apart per tile
 * index mod 4 and combined the same way), so the single-stream API's decode steps give
 * llama.cpp's bits. Masked slots weigh exactly 0 and tiles nobody sees are skipped, so a query's
 * result depends only on its own sequence's keys and their slots - not on which other queries or
 * sequences share the step (batch invariance), nor on how its prompt was split into steps.
 *
 * Quantized keys (q8_0 / q4_0; held to llama.cpp by perplexity and KL divergence, not bits): the
 * query is quantized to q8_0 as llama.cpp's mul_mat does, and a score is summed in our own order,
 * the one the key tiles make fast (vops.qk_q8_0 / qk_q4_0): per 32-dim block the exact integer
 * dot product of the quants, times dk * dq rounded, added with one fma to a single accumulator,
 * blocks in order. Quantized values: p.v of the exponentials themselves (not normalized, not
 * rounded to f16) in integers per tile and block (vops.pv_q8_0 / pv_q4_0), the tiles summed in
 * chunks of EL_PV_CHUNK (each from zero, then added in chunk order), the sums then times 1 / S
 * (att_inv; llama.cpp's flash attention, which its quantized V caches need, also divides at the
 * end). Every C path gives these bits; the numba twin the same order with numpy's exp.
 *
 * Work: a job is (a run of <= QB rows of one sequence, a kv head) with the rows' queries of every
 * head sharing that kv head, so each key and value tile is read once for all of them. With
 * enough jobs, each thread takes whole jobs (an atomic counter hands them out; fewer jobs than
 * threads are cut into runs of their heads, job_parts). A step with few jobs over many keys
 * (decode of one or two long sequences) is split across the threads instead:
 * the keys of each job in tile ranges for the scores, their exponentials and (f16 values) the
 * softmax weights (phases 1, 2 and 3, each followed by a barrier), then for p.v (phase 4) the
 * value dimensions, or with quantized values the keys again, cut at chunk ends (and the chunks'
 * sums added in phase 5). With quantized values there is no phase 3, and when every job's p.v is
 * cut at chunk ends each thread makes the exponentials of its own p.v share in phase 2, with no
 * barrier before phase 4: two of the split step's four barriers go. The
 * split changes no bit: every score, maximum, exponential and weight is computed alone; the
 * softmax sum is the same sequence of double additions of the same 16-value partial sums, in slot
 * order; each output dimension sums its p.v products in the same order (the same chunks, added in
 * the same order). The weights (f16 values) are made once, in place of the exponentials, and
 * p.v reads them there. So results do not depend on the number of threads nor on which mode ran
 * (tests/test_attention_split.py).
 */
#include <stdlib.h>
#include <stdatomic.h>
#include "engine_internal.h"

#define CT 32          /* tiles a p.v call takes (8 per lane set of a one-token step) */
#define NHB 8          /* query rows (x heads) per p.v pass */
#define SPLIT_MIN 32   /* a step's few jobs are split across threads from this many seen tiles */
#define PF_TILES 4     /* key tiles prefetched ahead: a tile's lines are read out of order, which the
                          hardware's streams follow too late (scripts/bench_attention_kernels.c: a
                          one-token step's keys from DRAM twice as fast; 4 ahead rather than 2, SmolLM2
                          shape from DRAM: f16 keys ~125 vs ~135 ns a tile, q8_0 52 vs 67, hk = 256 1%). Values: f16 p.v (a tile's dims
                          read a few at a time, tile after tile; a one-token step's four lane sets take
                          tiles 4 apart) is handed the tiles of its next call, which the AVX-512 kernel
                          prefetches a few lines at a time (a whole chunk at once measured slower; a
                          step of several rows at depth 1800, SmolLM2, 1 thread: 5-11% less time than
                          with none); quantized values
                          are read row after row, in order, and are not prefetched (slower). Into L2 (el_prefetch_l2): a burst of L1 prefetches (a whole tile)
                          stalls on the L1 miss buffers; f16 keys at hk = 256 read twice as fast into
                          L2. The key kernels but qk_tile are handed the tile and prefetch it (the
                          AVX-512 ones spread over their loop: f16 keys at hk = 256 another 2x) */

typedef struct { int32_t lo, hi, full; } tile_sum;  /* positions of a tile's valid slots; all 16 valid */

struct att_state {
    int nth, G;          /* G: the most query heads per kv head of any layer (scratch is sized for it) */
    int hk, hv;          /* the largest head sizes of any layer */
    size_t cap;          /* a score row: n_ctx + KT slots */
    size_t per_thread;   /* floats of each thread's scratch */
    float *sc;           /* score rows: per thread [QB * G][cap], or shared when split */
    float *psum;         /* split: 16-slot partial sums of each score row, [QB * G * nth][cap / KT] */
    float *pmax;         /* split: [nth][QB * G * nth] partial maxima */
    float *scratch;      /* [nth][per_thread] */
    tile_sum *ts;        /* this step's tile summaries: per sequence, per group, per tile */
    size_t ts_cap;
    int32_t *ts_off;     /* [n_batch] first summary of each sequence (group g: + g * its tiles) */
    int32_t *tlo, *thi;  /* [2][n_batch] tiles seen by each run of rows, per group */
    int split[2];        /* this step's jobs of group g are split across threads */
    int pv_tiles[2];     /* and p.v over quantized values of some of them by tiles (chunk_share) */
    float *part;         /* split, quantized values: p.v's chunk sums, [score row][part_k chunks][hv] */
    size_t part_cap;
    int part_k;
    int parts;           /* the most runs a layer's jobs were cut into this step (job_parts; tests) */
    atomic_int *next;    /* [n_layer] the next whole job of layer l */
};

/* rows of a p.v pass: NHB, or with llama.cpp's four lane sets (a step of one token, whose job has
 * G rows) NHB / 4 but at least G, so the values are read once for all the rows of a job */
static int pv_pass_rows(int G, int sets) { return sets == 4 ? EL_MAX(NHB / 4, G) : NHB; }

/* per-thread scratch in floats: rounded queries, a score tile, p.v lanes (a pass's rows x sets), a
 * query in f16, maxima */
static size_t pv_lane_floats(int G, int hv) {
    return (size_t)EL_MAX(pv_pass_rows(G, 1), 4 * pv_pass_rows(G, 4)) * hv * KT;
}
static size_t scratch_floats(int G, int hk, int hv) {
    return (size_t)QB * G * hk + (size_t)QB * G * KT + pv_lane_floats(G, hv) + (size_t)hk + (size_t)QB * G;
}

void el_attention_free(el_engine *e) {
    struct att_state *a = e->att;
    if (!a) return;
    free(a->sc); free(a->psum); free(a->pmax); free(a->scratch); free(a->part);
    free(a->ts); free(a->ts_off); free(a->tlo); free(a->thi); free(a->next);
    free(a);
    e->att = NULL;
}

int el_attention_init(el_engine *e) {
    el_attention_free(e);
    struct att_state *a = calloc(1, sizeof *a);
    if (!a) return -1;
    e->att = a;
    const int nth = e->n_threads;
    int G = 1;
    for (int l = 0; l < e->d.n_layer; l++) {
        G = EL_MAX(G, e->d.n_head / e->layers[l].n_head_kv);
        a->hk = EL_MAX(a->hk, e->layers[l].head_dim_k);
        a->hv = EL_MAX(a->hv, e->layers[l].head_dim_v);
    }
    a->nth = nth;
    a->G = G;
    a->cap = (size_t)e->n_ctx + KT;
    a->per_thread = scratch_floats(G, a->hk, a->hv);
    const size_t rows = (size_t)nth * QB * G;  /* score rows: each thread's, or all of them shared */
    a->sc = malloc(sizeof(float) * rows * a->cap);
    a->psum = malloc(sizeof(float) * rows * (a->cap / KT));
    a->pmax = malloc(sizeof(float) * (size_t)nth * rows);
    a->scratch = malloc(sizeof(float) * (size_t)nth * a->per_thread);
    a->ts_off = malloc(sizeof(int32_t) * (size_t)e->n_batch);
    a->tlo = malloc(sizeof(int32_t) * 2 * (size_t)e->n_batch);
    a->thi = malloc(sizeof(int32_t) * 2 * (size_t)e->n_batch);
    a->next = malloc(sizeof(atomic_int) * (size_t)e->d.n_layer);
    if (!a->sc || !a->psum || !a->pmax || !a->scratch || !a->ts_off || !a->tlo || !a->thi || !a->next) {
        el_attention_free(e);
        return -1;
    }
    return 0;
}

int el_engine_attention_parts(const el_engine *e) { return e->att ? e->att->parts : 0; }

int el_engine_attention_split(const el_engine *e) {
    const struct att_state *a = e->att;
    return a ? a->split[0] | a->split[1] << 1 | a->pv_tiles[0] << 2 | a->pv_tiles[1] << 3 : 0;
}

static int visible(int ps, int p, int swa, int n_swa) { return ps >= 0 && ps <= p && !(swa && p - ps >= n_swa); }

/* slots sequence s holds after this step */
static int seq_slots(const step_plan *pl, int s) { return pl->row_slot[pl->seq_row0[s] + pl->seq_rows[s] - 1] + 1; }

static const tile_sum *seq_tiles(const el_engine *e, int s, int g) {
    const struct att_state *a = e->att;
    return a->ts + a->ts_off[s] + (size_t)g * ((seq_slots(&e->plan, s) + KT - 1) / KT);
}

/* the chunk (EL_PV_CHUNK) of tile t, and the chunks [*k0, *k1) that tiles [ta, tb) touch */
static int chunk_of(int t) { return t / EL_PV_CHUNK; }
static void chunks(int ta, int tb, int *k0, int *k1) {
    *k0 = chunk_of(ta);
    *k1 = tb > ta ? chunk_of(tb - 1) + 1 : *k0;
}

/* Quantized values, split: thread ith's tiles [*ta, *tb) of a job's [tlo, thi), an even share with its ends
 * moved to the nearest chunk end; returns 0 when some thread's share would be more than 5/4 of
 * an even one (then the threads share the value groups instead: the same sums either way) */
static int chunk_share(int tlo, int thi, int ith, int nth, int *ta, int *tb) {
    const int64_t n = thi - tlo;
    int ok = n > 0;
    *ta = *tb = tlo;
    for (int t = 0; t < nth; t++) {
        int e[2];
        for (int i = 0; i < 2; i++) {
            const int x = tlo + (int)(n * (t + i) / nth);
            e[i] = x <= tlo || x >= thi ? x : EL_MIN(thi, EL_MAX(tlo, (x + EL_PV_CHUNK / 2) / EL_PV_CHUNK * EL_PV_CHUNK));
        }
        ok &= (int64_t)(e[1] - e[0]) * 4 * nth <= 5 * n;
        if (t == ith) *ta = e[0], *tb = e[1];
    }
    return ok;
}

/* Before a step: summaries of every tile of the batch's sequences, the tiles each run of rows
 * sees (a superset of the tiles holding a slot visible to one of its rows), and whether the
 * step's jobs are split across threads. -1 when out of memory. */
int el_attention_plan(el_engine *e) {
    struct att_state *a = e->att;
    const step_plan *pl = &e->plan;
    const el_batch *b = pl->b;
    const int ng = el_engine_has_swa(e) ? 2 : 1, n_swa = e->d.n_swa;
    size_t need = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        a->ts_off[s] = (int32_t)need;
        need += (size_t)ng * ((seq_slots(pl, s) + KT - 1) / KT);
    }
    if (need > a->ts_cap) {
        tile_sum *ts = realloc(a->ts, sizeof(tile_sum) * need);
        if (!ts) return -1;
        a->ts = ts;
        a->ts_cap = need;
    }
    for (int s = 0; s < b->n_seqs; s++) {
        const int n_slots = seq_slots(pl, s), n_tiles = (n_slots + KT - 1) / KT;
        for (int g = 0; g < ng; g++) {
            const int32_t *table = seq_table(b, g, s);
            tile_sum *ts = a->ts + a->ts_off[s] + (size_t)g * n_tiles;
            for (int t = 0; t < n_tiles; t++) {
                tile_sum x = {INT32_MAX, -1, 0};
                if (table[t] >= 0) {
                    const int32_t *ps = kv_pos(e, g, table[t]);
                    const int nt = EL_MIN(KT, n_slots - t * KT);
                    int valid = 0;
                    for (int u = 0; u < nt; u++)
                        if (ps[u] >= 0) {
                            valid++;
                            x.lo = EL_MIN(x.lo, ps[u]);
                            x.hi = EL_MAX(x.hi, ps[u]);
                        }
                    x.full = valid == KT;
                }
                ts[t] = x;
            }
        }
    }
    int max_seen[2] = {0, 0};
    for (int qb = 0; qb < pl->n_qb; qb++) {
        const int m0 = pl->qb_row0[qb], s = pl->qb_seq[qb];
        int p_first = b->pos[m0], p_last = b->pos[m0];
        for (int j = 1; j < pl->qb_rows[qb]; j++) {
            p_first = EL_MIN(p_first, b->pos[m0 + j]);
            p_last = EL_MAX(p_last, b->pos[m0 + j]);
        }
        const int n_tiles = (seq_slots(pl, s) + KT - 1) / KT;
        for (int g = 0; g < ng; g++) {
            const tile_sum *ts = seq_tiles(e, s, g);
            int lo = n_tiles, hi = 0;
            for (int t = 0; t < n_tiles; t++)
                if (ts[t].hi >= 0 && ts[t].lo <= p_last && !(g == G_SWA && p_first - ts[t].hi >= n_swa)) {
                    lo = EL_MIN(lo, t);
                    hi = t + 1;
                }
            a->tlo[g * e->n_batch + qb] = lo;
            a->thi[g * e->n_batch + qb] = EL_MAX(lo, hi);
            max_seen[g] = EL_MAX(max_seen[g], hi - lo);
        }
    }
    int has[2] = {0, 0}, n_kv[2] = {0, 0};  /* the most kv heads of a layer of the group */
    for (int l = 0; l < e->d.n_layer; l++) {
        const int g = layer_group(e, l);
        if (g == G_NONE) continue;  /* a recurrent layer (delta_net.c) */
        has[g] = 1;
        n_kv[g] = EL_MAX(n_kv[g], e->layers[l].n_head_kv);
    }
    int qv[2] = {0, 0};  /* a layer of the group stores quantized values */
    for (int l = 0; l < e->d.n_layer; l++)
        if (layer_group(e, l) != G_NONE) qv[layer_group(e, l)] |= e->vl[kv_owner(e, l)].type != EL_F16;
    for (int g = 0; g < 2; g++) {
        a->split[g] = has[g] && a->nth > 1 && pl->n * n_kv[g] <= a->nth * QB && pl->n_qb * n_kv[g] < 2 * a->nth &&
                      max_seen[g] >= SPLIT_MIN;
        a->pv_tiles[g] = 0;
        for (int qb = 0; qb < pl->n_qb && a->split[g] && qv[g]; qb++) {
            int ta, tb;
            a->pv_tiles[g] |= chunk_share(a->tlo[g * e->n_batch + qb], a->thi[g * e->n_batch + qb], 0, a->nth, &ta, &tb);
        }
    }
    if (a->pv_tiles[0] || a->pv_tiles[1]) {  /* the chunks a run of rows' seen tiles touch, for every score row of the step */
        a->part_k = EL_MAX(max_seen[0], max_seen[1]) / EL_PV_CHUNK + 2;
        const size_t need = (size_t)pl->n * e->d.n_head * a->part_k * a->hv;
        if (need > a->part_cap) {
            float *part = realloc(a->part, sizeof(float) * need);
            if (!part) return -1;
            a->part = part;
            a->part_cap = need;
        }
    }
    for (int l = 0; l < e->d.n_layer; l++) atomic_store(&a->next[l], 0);
    a->parts = 1;
    return 0;
}

typedef struct {
    int s, m0, mq, kvh, nh;  /* sequence, first row, rows, kv head, score rows (mq x G) */
    int G, hb;               /* query heads the job takes per row (all those of kv head kvh, or a part:
                                job_part) and the first of them */
    int n_slots, tlo, thi;   /* slots held; tiles seen [tlo, thi) */
    const int32_t *table;
    const tile_sum *ts;
    float *sc;               /* [nh][cap] scores, then exponentials */
} job_t;

static void job_get(const el_engine *e, int l, int j, float *sc, job_t *J) {
    const struct att_state *a = e->att;
    const step_plan *pl = &e->plan;
    const int g = layer_group(e, l), n_kv = e->layers[l].n_head_kv;
    const int qb = j / n_kv;
    J->s = pl->qb_seq[qb];
    J->m0 = pl->qb_row0[qb];
    J->mq = pl->qb_rows[qb];
    J->kvh = j % n_kv;
    J->G = e->d.n_head / n_kv;
    J->hb = J->kvh * J->G;
    J->nh = J->mq * J->G;
    J->n_slots = seq_slots(pl, J->s);
    J->tlo = a->tlo[g * e->n_batch + qb];
    J->thi = a->thi[g * e->n_batch + qb];
    J->table = seq_table(pl->b, g, J->s);
    J->ts = seq_tiles(e, J->s, g);
    J->sc = sc;
}

/* Whole-job mode with fewer jobs than threads (a one-row step of Gemma-3, whose one kv head
 * leaves the other thread idle): each job's query heads cut into as many runs as give every
 * thread one, each run a job of its own that reads the same tiles. (More jobs than threads but not
 * a multiple - SmolLM2's 3 kv heads on 2 threads - are left whole: with single heads for jobs, a
 * part's fixed costs, its own read of the tiles and its lanes, outweighed the better balance, in 7
 * alternating rounds at d = 200.) A head's numbers are its own whichever heads share its job. */
static int job_parts(int n_jobs, int G, int nth) {
    return n_jobs >= nth ? 1 : EL_MIN(G, (nth + n_jobs - 1) / n_jobs);
}

/* unit u of a layer's jobs cut into parts: job u / parts, its heads' part u % parts */
static void job_part(const el_engine *e, int l, int u, int parts, float *sc, job_t *J) {
    job_get(e, l, u / parts, sc, J);
    const int Gk = J->G, p = u % parts, h0 = Gk * p / parts, h1 = Gk * (p + 1) / parts;
    J->G = h1 - h0;
    J->hb = J->kvh * Gk + h0;
    J->nh = J->mq * J->G;
}

/* score row r of a job: query row r / G, head hb + r % G */
static int job_head(const job_t *J, int r) { return J->hb + r % J->G; }

/* Phase 1: scores of the job's rows against tiles [ta, tb), masked; mx[r] = their maximum. */
static void job_scores(el_engine *e, int l, const job_t *J, int ta, int tb, float *mx, float *scr) {
    const struct att_state *a = e->att;
    const el_model_desc *d = &e->d;
    const el_batch *b = e->plan.b;
    const int g = layer_group(e, l), swa = g == G_SWA, hk = e->layers[l].head_dim_k, G = J->G, nh = J->nh;
    const int qd = d->n_head * hk, Gs = a->G;   /* scratch is laid out for Gs >= G and the largest heads */
    const int one = b->llama_order && e->plan.n == 1;
    const kv_layout *kl = &e->kl[kv_owner(e, l)];
    float *qr = scr;                            /* [nh][hk] queries rounded to f16 */
    float *tile = qr + (size_t)QB * Gs * a->hk; /* [nh][KT] */
    el_half *tmp = (el_half *)(tile + (size_t)QB * Gs * KT + pv_lane_floats(Gs, a->hv));
    /* quantized keys: the queries as q8_0 rows (34 hk / 32 bytes), then the sums of their blocks'
     * quants ([nh][hk / 32] int32): together within qr's 4 hk bytes a row */
    const int nb = hk / 32;
    const size_t qrow = el_row_size(EL_Q8_0, hk);
    int32_t *qsum = (int32_t *)((uint8_t *)qr + ((size_t)QB * G * qrow + 3) / 4 * 4);
    for (int r = 0; r < nh; r++) mx[r] = -INFINITY;
    if (ta >= tb) return;
    for (int r = 0; r < nh; r++) {
        const float *q = e->q + (size_t)(J->m0 + r / G) * qd + (size_t)job_head(J, r) * hk;
        if (kl->type == EL_F16) {  /* rounded to f16, as llama.cpp's f16 K . q does */
            e->vops.f32_to_f16(hk, q, tmp);
            e->vops.f16_to_f32(hk, tmp, qr + (size_t)r * hk);
        } else {  /* quantized to q8_0 (the keys' dot product type), as llama.cpp's mul_mat does */
            const block_q8_0 *qb = (const block_q8_0 *)((uint8_t *)qr + (size_t)r * qrow);
            e->traits[EL_Q8_0].from_float(q, (uint8_t *)qb, hk);
            for (int i = 0; i < nb; i++) {
                int32_t sum = 0;
                for (int k = 0; k < QK8_0; k++) sum += qb[i].qs[k];
                qsum[r * nb + i] = sum;
            }
        }
    }
    const float scale = d->attn_scale, softcap = d->attn_softcap;
    const int capped = softcap > 0;
    const float uncap = capped ? 1.0f / softcap : 0.0f;  /* llama.cpp scales by the float 1 / cap */
    float lmax[nh * KT];  /* per row and lane: the maximum of the tiles it sees whole */
    for (int i = 0; i < nh * KT; i++) lmax[i] = -INFINITY;
    const size_t kbytes = kl->part;
    const int spread = one || kl->type != EL_F16;  /* the kernels but qk_tile prefetch the tile they are handed */
    for (int t = ta; t < EL_MIN(tb, ta + PF_TILES); t++)
        if (J->table[t] >= 0) el_prefetch_l2(kv_kb(e, l, J->table[t], J->kvh), kbytes);
    for (int t = ta; t < tb; t++) {
        const tile_sum ts = J->ts[t];
        const uint8_t *next = t + PF_TILES < tb && J->table[t + PF_TILES] >= 0 ? kv_kb(e, l, J->table[t + PF_TILES], J->kvh) : NULL;
        int cls[QB], any = 0;  /* per row: 0 sees none of the tile, 1 all of it, 2 some */
        for (int j = 0; j < J->mq; j++) {
            const int p = b->pos[J->m0 + j];
            if (ts.hi < 0 || ts.lo > p || (swa && p - ts.hi >= d->n_swa)) cls[j] = 0;
            else if (ts.full && ts.hi <= p && !(swa && p - ts.lo >= d->n_swa)) cls[j] = 1;
            else cls[j] = 2;
            any |= cls[j];
        }
        if (!spread || !any) el_prefetch_l2(next, kbytes);
        if (any) {
            const uint8_t *K = kv_kb(e, l, J->table[t], J->kvh);
            if (kl->type == EL_Q8_0) {  /* integer dot products straight from the key tile */
                e->vops.qk_q8_0(hk, (const uint8_t *)qr, qrow, qsum, nh, K, tile, next);
            } else if (kl->type == EL_Q4_0) {
                e->vops.qk_q4_0(hk, (const uint8_t *)qr, qrow, qsum, nh, K, tile, next);
            } else if (one) {
                e->vops.qk_tile_one(hk, qr, nh, hk, (const el_half *)K, tile, (const el_half *)next);
            } else {
                e->vops.qk_tile(hk, qr, nh, hk, (const el_half *)K, tile);
            }
        }
        const int32_t *ps = any ? kv_pos(e, g, J->table[t]) : NULL;
        const int nt = EL_MIN(KT, J->n_slots - t * KT);
        for (int j = 0; j < J->mq; j++) {  /* query row j: score rows j G .. j G + G - 1 */
            const int p = b->pos[J->m0 + j], r0 = j * G;
            float *dst0 = J->sc + (size_t)r0 * a->cap + (size_t)t * KT;
            if (!any || cls[j] == 0) {
                for (int r = 0; r < G; r++)
                    for (int u = 0; u < KT; u++) dst0[(size_t)r * a->cap + u] = -INFINITY;
                continue;
            }
            if (cls[j] == 1 && !capped) {  /* all visible: lane-wise maxima */
                e->vops.scale_max(G, tile + r0 * KT, scale, dst0, a->cap, lmax + (size_t)r0 * KT);
                continue;
            }
            for (int r = r0; r < r0 + G; r++) {
                float *dst = J->sc + (size_t)r * a->cap + (size_t)t * KT, *src = tile + r * KT, m = mx[r];
                for (int u = 0; u < KT; u++) {
                    float v = -INFINITY;
                    if (cls[j] == 1 || (u < nt && visible(ps[u], p, swa, d->n_swa))) {
                        /* soft-capped as llama.cpp's graph: tanh(s * (1 / cap)) * cap, then the
                         * softmax's scale */
                        v = capped ? tanhf(src[u] * uncap) * softcap * scale : src[u] * scale;
                        m = v > m ? v : m;
                    }
                    dst[u] = v;
                }
                mx[r] = m;
            }
        }
    }
    /* The maximum of a set does not depend on the order it is taken in (no NaN is ever kept;
     * of +0 and -0, whichever is kept gives the same exponentials x - max). */
    for (int r = 0; r < nh; r++)
        for (int u = 0; u < KT; u++) mx[r] = lmax[(size_t)r * KT + u] > mx[r] ? lmax[(size_t)r * KT + u] : mx[r];
}

/* 1 / S of a row's softmax sum S (0 when nothing is seen). Quantized values take the row's
 * exponentials as they are and their p.v sums times this at the end (as llama.cpp's flash
 * attention, which its quantized V caches need, divides by the sum at the end): no pass of their
 * own scales the weights, and a split step has no barrier between the exponentials and p.v */
static float att_inv(double S) { return S > 0 ? (float)(1.0 / S) : 0.0f; }

/* The softmax weights of row r of a job over tiles [ta, tb), in place: its exponentials in sc times
 * 1 / S (S: the row's softmax sum), rounded to f16 (llama.cpp's p.v takes them as f16) */
static void job_weights(const el_engine *e, const job_t *J, int r, int ta, int tb, double S) {
    const float inv = att_inv(S);
    if (tb > ta) e->vops.f16_scale((tb - ta) * KT, J->sc + (size_t)r * e->att->cap + (size_t)ta * KT, inv);
}

/* Phase 4, f16 values: p.v of the job's rows over its seen tiles, for value dimensions [d0, d1),
 * the weights in sc (job_weights). Writes the attention output. A chunk of tiles at a time, its
 * value groups (the stored parts, kv.c) in turn, each call handed the next call's tiles to
 * prefetch; a row's lanes are [segment][sets][segment dims][KT], a segment being [d0, d1)
 * within a group. */
static void job_pv(el_engine *e, int l, const job_t *J, int d0, int d1, float *scr) {
    const struct att_state *a = e->att;
    const el_model_desc *d = &e->d;
    const kv_layout *vl = &e->vl[kv_owner(e, l)];
    const int hv = e->layers[l].head_dim_v, G = J->G, Gs = a->G, nd = d1 - d0, gd = vl->dims;
    const int od = d->n_head * hv;
    const int sets = e->plan.b->llama_order && e->plan.n == 1 ? 4 : 1, nb = pv_pass_rows(G, sets);
    float *lanes = scr + (size_t)QB * Gs * a->hk + (size_t)QB * Gs * KT;  /* [nb][lsz] */
    const int ldw = (int)a->cap;
    if (nd <= 0) return;
    const el_half *vt[CT], *vn[CT];  /* vn: the tiles of the next call (prefetched) */
    const size_t lsz = (size_t)sets * nd * KT, lseg = (size_t)sets * KT;  /* per dim */
    const int passes = (J->nh + nb - 1) / nb;
    for (int k = 0, r0 = 0, nr; k < passes; k++, r0 += nr) {
        nr = (J->nh - r0) / (passes - k);  /* rows shared evenly: 9 as 4 + 5, not 8 + 1 */
        memset(lanes, 0, sizeof(float) * lsz * nr);
        for (int c0 = J->tlo; c0 < J->thi; c0 += CT) {
            const int nt = EL_MIN(CT, J->thi - c0);
            const float *w = J->sc + (size_t)r0 * a->cap + (size_t)c0 * KT;  /* [nr][ldw] from tile c0 */
            /* A share of the dimensions (a split step) reads every weight, half of them made by the
             * other thread, which writes those lines again in the next layer and then waits for this
             * core's copies to be invalidated. Prefetched non-temporally (into L1 only), fewer copies
             * remain: with the two vCPUs on different CCDs, a SmolLM2 f16 step at d = 8000 spends 4.0
             * instead of 5.4 ms in the scores, 10.2 instead of 11.8 in attention (medians of 10 and 9
             * runs); on one CCD no change (7.9 ms) */
            for (int r = 0; r < nr && nd < hv; r++)
                for (int t = 0; t < nt; t++) __builtin_prefetch(w + (size_t)r * a->cap + (size_t)t * KT, 0, 0);
            for (int s0 = d0; s0 < d1;) {  /* segments: [s0, s1) of value group c */
                const int c = s0 / gd, s1 = EL_MIN(d1, (c + 1) * gd), n = s1 - s0, off = s0 - c * gd;
                float *ls = lanes + (size_t)(s0 - d0) * lseg;
                for (int t = 0; t < nt; t++) {  /* absent blocks have all-zero weights */
                    const int blk = J->table[c0 + t];
                    vt[t] = blk >= 0 ? kv_v(e, l, blk, J->kvh, c) + (size_t)off * KT : NULL;
                }
                /* the next call's tiles: the next segment of this chunk, else the first of the next */
                const int c1 = s1 < d1 ? c0 : c0 + CT, g1 = (s1 < d1 ? s1 : d0) / gd;
                const int off1 = (s1 < d1 ? s1 : d0) - g1 * gd;
                const int nn = EL_MAX(0, EL_MIN(CT, J->thi - c1));
                for (int t = 0; t < nn; t++) {
                    const int blk = J->table[c1 + t];
                    vn[t] = blk >= 0 ? kv_v(e, l, blk, J->kvh, g1) + (size_t)off1 * KT : NULL;
                }
                e->vops.pv_tiles(n, nt, vt, nr, w, ldw, ls, (int)lsz, sets, c0, nn ? vn : NULL, nn);
                s0 = s1;
            }
        }
        for (int r = 0; r < nr; r++) {
            float *lr = lanes + (size_t)r * lsz;
            const int rr = r0 + r;
            float *out = e->xn + (size_t)(J->m0 + rr / G) * od + (size_t)job_head(J, rr) * hv + d0;
            for (int s0 = d0; s0 < d1;) {
                const int s1 = EL_MIN(d1, (s0 / gd + 1) * gd);
                float *ls = lr + (size_t)(s0 - d0) * lseg;
                const size_t n = (size_t)(s1 - s0) * KT;
                if (sets == 4)
                    for (size_t i = 0; i < n; i++) ls[i] = (ls[i] + ls[2 * n + i]) + (ls[n + i] + ls[3 * n + i]);
                e->vops.sum16_rows(s1 - s0, ls, out + (s0 - d0));
                s0 = s1;
            }
        }
    }
}

/* Quantized values (pv_q8_0 / pv_q4_0): p.v of rows [r0, r0 + nr) of a job over tiles [ta, tb),
 * value group c (one block of 32 dims), summed in chunks: a kernel call a chunk, whose sums it adds
 * to acc + (k - chunk_of(ta)) * ldc for chunk k, row r at + r * lda (ldc = 0: all into acc, in
 * chunk order). */
static void pv_q_tiles(el_engine *e, int l, const job_t *J, int c, int r0, int nr, int ta, int tb, float *acc,
                       int lda, int ldc) {
    const kv_layout *vl = &e->vl[kv_owner(e, l)];
    const int ldw = (int)e->att->cap;
    const uint8_t *vq[EL_PV_CHUNK];
    for (int c0 = ta, c1; c0 < tb; c0 = c1) {
        c1 = EL_MIN(tb, (chunk_of(c0) + 1) * EL_PV_CHUNK);
        for (int t = c0; t < c1; t++) {  /* absent blocks have all-zero weights */
            const int blk = J->table[t];
            vq[t - c0] = blk >= 0 ? kv_vb(e, l, blk, J->kvh, c) : NULL;
        }
        const float *w = J->sc + (size_t)r0 * ldw + (size_t)c0 * KT;
        float *a = acc + (size_t)(chunk_of(c0) - chunk_of(ta)) * ldc;
        if (vl->type == EL_Q8_0) e->vops.pv_q8_0(c1 - c0, vq, nr, w, ldw, a, lda);
        else e->vops.pv_q4_0(c1 - c0, vq, nr, w, ldw, a, lda);
    }
}

/* Phase 4, quantized values, value groups [g0, g1) of a job over all its tiles: a group at a time
 * (each group's parts read as one stream: Gemma-3-270M, d = 30000, 1 thread: attention 6.9 -> 6.3
 * ms a step), the chunks' sums added in order, times row r's inv[r] (the exponentials in sc are
 * not normalized: att_inv). Writes the attention output. */
static void job_pv_q(el_engine *e, int l, const job_t *J, int g0, int g1, const float *inv, float *scr) {
    const struct att_state *a = e->att;
    const int hv = e->layers[l].head_dim_v, G = J->G, gd = e->vl[kv_owner(e, l)].dims, nd = (g1 - g0) * gd;
    const int od = e->d.n_head * hv, nb = pv_pass_rows(G, 1), passes = (J->nh + nb - 1) / nb;
    float *sum = scr + (size_t)QB * a->G * a->hk + (size_t)QB * a->G * KT;  /* [nb][nd] */
    for (int p = 0, r0 = 0, nr; p < passes && nd > 0; p++, r0 += nr) {
        nr = (J->nh - r0) / (passes - p);  /* rows shared evenly: 9 as 4 + 5, not 8 + 1 */
        memset(sum, 0, sizeof(float) * (size_t)nr * nd);
        for (int c = g0; c < g1; c++) pv_q_tiles(e, l, J, c, r0, nr, J->tlo, J->thi, sum + (c - g0) * gd, nd, 0);
        for (int r = 0; r < nr; r++) {
            const int rr = r0 + r;
            float *out = e->xn + (size_t)(J->m0 + rr / G) * od + (size_t)job_head(J, rr) * hv + g0 * gd;
            for (int i = 0; i < nd; i++) out[i] = sum[(size_t)r * nd + i] * inv[rr];
        }
    }
}

/* a split step's softmax sum of score row i (job J's row i - its first): its tiles' 16-slot sums
 * (phase 2) added in double in slot order, as exp_sums adds them for a whole job */
static double row_sum(const struct att_state *a, const job_t *J, size_t i) {
    const float *ps = a->psum + i * (a->cap / KT);
    double sum = 0.0;
    for (int t = J->tlo; t < J->thi; t++) sum += ps[t];
    return sum;
}

/* a thread's share [*a, *b) of n items from lo, in units of `align` */
static void share(int lo, int hi, int ith, int nth, int align, int *a, int *b) {
    int64_t r0, r1;
    el_split(hi - lo, ith, nth, align, &r0, &r1);
    *a = lo + (int)r0;
    *b = lo + (int)r1;
}

/* o[i] += x[i], i < n */
static void add_to(int n, float *restrict o, const float *restrict x) {
    for (int i = 0; i < n; i++) o[i] += x[i];
}

void el_attention(el_engine *e, int l, int ith, int nth) {
    struct att_state *a = e->att;
    const step_plan *pl = &e->plan;
    const int g = layer_group(e, l), G = a->G, hv = e->layers[l].head_dim_v;
    const int qv = e->vl[kv_owner(e, l)].type != EL_F16, gd = e->vl[kv_owner(e, l)].dims;
    const int n_jobs = pl->n_qb * e->layers[l].n_head_kv;
    float *scr = a->scratch + (size_t)ith * a->per_thread;
    float *mx = scr + (a->per_thread - (size_t)QB * G);
    if (!a->split[g]) {  /* whole jobs (or their parts), one thread each */
        float *sc = a->sc + (size_t)ith * QB * G * a->cap;
        const int parts = job_parts(n_jobs, e->d.n_head / e->layers[l].n_head_kv, nth);
        if (ith == 0 && parts > a->parts) a->parts = parts;
        for (;;) {
            const int j = atomic_fetch_add(&a->next[l], 1);
            if (j >= n_jobs * parts) break;
            job_t J;
            job_part(e, l, j, parts, sc, &J);
            job_scores(e, l, &J, J.tlo, J.thi, mx, scr);
            float inv[QB * G];
            for (int r = 0; r < J.nh; r++) {
                float *x = J.sc + (size_t)r * a->cap + (size_t)J.tlo * KT;
                const double S = J.thi > J.tlo ? e->vops.exp_sums((J.thi - J.tlo) * KT, x, mx[r], NULL) : 0.0;
                if (qv) inv[r] = att_inv(S);
                else if (J.thi > J.tlo) job_weights(e, &J, r, J.tlo, J.thi, S);
            }
            if (qv) job_pv_q(e, l, &J, 0, hv / gd, inv, scr);
            else job_pv(e, l, &J, 0, hv, scr);
        }
        return;
    }
    /* split: every thread takes a share of every job (n_qb * n_kv < 2 nth jobs, whose score rows
     * all fit in the shared buffer) */
    const size_t n_rows = (size_t)pl->n * e->d.n_head;  /* score rows of all jobs */
    size_t row0 = 0;
    for (int j = 0; j < n_jobs; j++) {  /* phase 1: scores of a share of each job's tiles */
        job_t J;
        job_get(e, l, j, a->sc + row0 * a->cap, &J);
        int ta, tb;
        share(J.tlo, J.thi, ith, nth, 1, &ta, &tb);
        job_scores(e, l, &J, ta, tb, a->pmax + (size_t)ith * n_rows + row0, scr);
        row0 += (size_t)J.nh;
    }
    el_pool_barrier(e->pool);
    /* Quantized values: whether every job's p.v is split by tiles (chunk_share), each thread then
     * making the exponentials of its own p.v share, which needs no barrier in between */
    int by_tiles = qv;
    for (int j = 0; j < n_jobs && by_tiles; j++) {
        job_t J;
        int ta, tb;
        job_get(e, l, j, a->sc, &J);
        by_tiles = chunk_share(J.tlo, J.thi, ith, nth, &ta, &tb);
    }
    row0 = 0;
    for (int j = 0; j < n_jobs; j++) {  /* phase 2: exponentials and their 16-slot sums */
        job_t J;
        job_get(e, l, j, a->sc + row0 * a->cap, &J);
        int ta, tb;
        if (by_tiles) chunk_share(J.tlo, J.thi, ith, nth, &ta, &tb);
        else share(J.tlo, J.thi, ith, nth, 1, &ta, &tb);
        for (int r = 0; r < J.nh && ta < tb; r++) {
            float m = -INFINITY;
            for (int t = 0; t < nth; t++) {
                const float v = a->pmax[(size_t)t * n_rows + row0 + r];
                m = v > m ? v : m;
            }
            float *x = J.sc + (size_t)r * a->cap + (size_t)ta * KT;
            e->vops.exp_sums((tb - ta) * KT, x, m, a->psum + (row0 + r) * (a->cap / KT) + ta);
        }
        row0 += (size_t)J.nh;
    }
    if (!by_tiles) el_pool_barrier(e->pool);
    row0 = 0;
    if (!qv) {  /* (quantized values take the exponentials: no phase 3) */
        for (int j = 0; j < n_jobs; j++) {  /* phase 3: the weights of the same share (the sums in slot order) */
            job_t J;
            job_get(e, l, j, a->sc + row0 * a->cap, &J);
            int ta, tb;
            share(J.tlo, J.thi, ith, nth, 1, &ta, &tb);
            for (int r = 0; r < J.nh && ta < tb; r++) job_weights(e, &J, r, ta, tb, row_sum(a, &J, row0 + r));
            row0 += (size_t)J.nh;
        }
        el_pool_barrier(e->pool);
        row0 = 0;
        for (int j = 0; j < n_jobs; j++) {  /* phase 4: p.v over a share of the value dimensions */
            job_t J;
            job_get(e, l, j, a->sc + row0 * a->cap, &J);
            int d0, d1;
            share(0, hv, ith, nth, 8, &d0, &d1);
            job_pv(e, l, &J, d0, d1, scr);
            row0 += (size_t)J.nh;
        }
        return;
    }
    /* Quantized values, phase 4: a job's value groups, or when that shares them evenly its tiles cut
     * at chunk ends (each thread then reads the exponentials it made and the values of its own keys:
     * with the two threads apart on a two-CCD VM, a SmolLM2 q8_0 step at d = 8000 spends 37% less
     * in attention). There the thread whose share begins the job's tiles sums its chunks into one
     * running sum (slot 0 of each row's), the others each chunk into its own slot; phase 5: the
     * thread whose share ends them adds those to the running sum in chunk order (only the running
     * sum crosses between threads). */
    const int nb = pv_pass_rows(G, 1);
    const size_t ldp = (size_t)a->part_k * a->hv;  /* a score row's chunk sums */
    int any = 0;  /* a job split by tiles */
    for (int j = 0; j < n_jobs; j++) {
        job_t J;
        job_get(e, l, j, a->sc + row0 * a->cap, &J);
        int ta, tb, k0, k1, kj = chunk_of(J.tlo);  /* the job's first chunk: slot 0 */
        if (!chunk_share(J.tlo, J.thi, ith, nth, &ta, &tb)) {
            int g0, g1;
            share(0, hv / gd, ith, nth, 1, &g0, &g1);
            float inv[QB * G];
            for (int r = 0; r < J.nh; r++) inv[r] = att_inv(row_sum(a, &J, row0 + r));
            job_pv_q(e, l, &J, g0, g1, inv, scr);
            row0 += (size_t)J.nh;
            continue;
        }
        any = 1;
        chunks(ta, tb, &k0, &k1);
        if (tb > ta) {
            const int run = ta == J.tlo;
            const size_t n = (size_t)(run ? 1 : k1 - k0) * a->hv;
            float *p0 = a->part + row0 * ldp + (size_t)(k0 - kj) * a->hv;
            for (int r = 0; r < J.nh; r++) memset(p0 + r * ldp, 0, sizeof(float) * n);
            for (int r0 = 0, nr; r0 < J.nh; r0 += nr) {
                nr = EL_MIN(nb, J.nh - r0);
                for (int c = 0; c < hv / gd; c++)
                    pv_q_tiles(e, l, &J, c, r0, nr, ta, tb, p0 + r0 * ldp + c * gd, (int)ldp, run ? 0 : a->hv);
            }
        }
        row0 += (size_t)J.nh;
    }
    if (!any) return;
    el_pool_barrier(e->pool);
    row0 = 0;
    for (int j = 0; j < n_jobs; j++) {  /* phase 5: the running sum plus the later chunks' sums, in order */
        job_t J;
        job_get(e, l, j, a->sc + row0 * a->cap, &J);
        int ta, tb, first_end = J.tlo, last = -1;  /* the first share's end, the last share's thread */
        for (int t = 0; t < nth; t++) {
            if (!chunk_share(J.tlo, J.thi, t, nth, &ta, &tb)) break;
            if (tb > ta && first_end == J.tlo) first_end = tb;
            if (tb > ta) last = t;
        }
        if (last == ith) {
            int k0, k1;
            const int kl = chunk_of(first_end - 1) + 1;  /* the first chunk after the running sum's */
            chunks(J.tlo, J.thi, &k0, &k1);
            for (int r = 0; r < J.nh; r++) {
                float *out = e->xn + (size_t)(J.m0 + r / J.G) * e->d.n_head * hv + (size_t)job_head(&J, r) * hv;
                const float *p = a->part + (row0 + r) * ldp;
                memcpy(out, p, sizeof(float) * hv);
                for (int k = kl; k < k1; k++) add_to(hv, out, p + (size_t)(k - k0) * a->hv);
                const float inv = att_inv(row_sum(a, &J, row0 + r));
                for (int i = 0; i < hv; i++) out[i] *= inv;
            }
        }
        row0 += (size_t)J.nh;
    }
}
