/* Tokenization by pair merges (api/vocab.h): SentencePiece as llama.cpp's llm_tokenizer_spm_session,
 * byte-level BPE as its llm_tokenizer_bpe_session. Both start from one symbol per UTF-8 character
 * and repeatedly merge the best adjacent pair (leftmost first on ties); they differ in what makes
 * a pair and what "best" is. */
#include <stdlib.h>
#include "common.h"
#include "api/vocab.h"

typedef struct {
    int32_t start;       /* byte offset of the symbol's text */
    int32_t n;           /* its length in bytes; 0 once merged into the left neighbour */
    int32_t prev, next;  /* neighbouring symbols, -1 at the ends */
} symbol;

typedef struct {
    double key;          /* lower merges first: -score (SPM) or the merge rank (BPE) */
    int32_t left, right;
    int32_t n;           /* bytes of the pair when queued: a later mismatch means outdated */
} bigram;

/* llm_bigram_spm / llm_bigram_bpe order: best key first, then the leftmost pair. */
static int before(const bigram *a, const bigram *b) {
    return a->key < b->key || (a->key == b->key && a->left < b->left);
}

static void heap_push(bigram *heap, int64_t *size, bigram item) {
    int64_t i = (*size)++;
    while (i > 0) {
        int64_t parent = (i - 1) / 2;
        if (!before(&item, &heap[parent])) break;
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = item;
}

static bigram heap_pop(bigram *heap, int64_t *size) {
    bigram top = heap[0], last = heap[--(*size)];
    int64_t i = 0, n = *size;
    for (;;) {
        int64_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && before(&heap[child + 1], &heap[child])) child++;
        if (!before(&heap[child], &last)) break;
        heap[i] = heap[child];
        i = child;
    }
    if (n > 0) heap[i] = last;
    return top;
}

/* What makes a pair: its key, or 0 when the two symbols do not merge. */
typedef struct merger merger;
struct merger {
    int (*pair_key)(merger *m, const symbol *l, const symbol *r, double *key);
    const char *text;
    const el_str_index *tokens;
    const float *scores;         /* SPM */
    const el_str_index *merges;  /* BPE: "left right" rule texts, rank = position */
    char *scratch;               /* BPE: room for a rule's text */
};

static int spm_pair(merger *m, const symbol *l, const symbol *r, double *key) {
    int64_t id = el_str_index_find(m->tokens, m->text + l->start, (size_t)(l->n + r->n));
    if (id < 0) return 0;
    *key = -(double)m->scores[id];
    return 1;
}

static int bpe_pair(merger *m, const symbol *l, const symbol *r, double *key) {
    memcpy(m->scratch, m->text + l->start, (size_t)l->n);
    m->scratch[l->n] = ' ';
    memcpy(m->scratch + l->n + 1, m->text + r->start, (size_t)r->n);
    int64_t rank = el_str_index_find(m->merges, m->scratch, (size_t)(l->n + 1 + r->n));
    if (rank < 0) return 0;
    *key = (double)rank;
    return 1;
}

static void try_pair(merger *m, symbol *sym, int32_t left, int32_t right, bigram *heap, int64_t *size) {
    double key;
    if (left < 0 || right < 0 || !m->pair_key(m, &sym[left], &sym[right], &key)) return;
    bigram b = {key, left, right, sym[left].n + sym[right].n};
    heap_push(heap, size, b);
}

/* Bytes of the UTF-8 character led by byte c (a stray continuation byte counts as one), as
 * llama.cpp's unicode_len_utf8. */
static int32_t utf8_len(uint8_t c) {
    static const int8_t by_high_nibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return by_high_nibble[c >> 4];
}

/* Splits text[0..len) into characters and merges them; returns the symbol array (the chain
 * starting at symbol 0 is the result) or NULL when memory runs out. */
static symbol *merge_all(merger *m, int64_t len) {
    const char *text = m->text;
    /* at most len symbols; each merge queues at most 2 pairs after the first len - 1 */
    symbol *sym = malloc((size_t)len * sizeof *sym);
    bigram *heap = malloc((size_t)(3 * len) * sizeof *heap);
    if (!sym || !heap) {
        free(sym);
        free(heap);
        return NULL;
    }
    int32_t n_sym = 0;
    for (int64_t offs = 0; offs < len; n_sym++) {
        int32_t n = utf8_len((uint8_t)text[offs]);
        if (n > len - offs) n = (int32_t)(len - offs);
        sym[n_sym] = (symbol){(int32_t)offs, n, n_sym - 1, n_sym + 1};
        offs += n;
    }
    sym[n_sym - 1].next = -1;

    int64_t size = 0;
    for (int32_t i = 1; i < n_sym; i++) try_pair(m, sym, i - 1, i, heap, &size);
    while (size > 0) {
        bigram b = heap_pop(heap, &size);
        symbol *l = &sym[b.left], *r = &sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.n) continue;  /* outdated pair */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = b.left;
        try_pair(m, sym, l->prev, b.left, heap, &size);
        try_pair(m, sym, b.left, l->next, heap, &size);
    }
    free(heap);
    return sym;
}

int64_t el_spm_encode(const el_str_index *ix, const float *scores, const int32_t *byte_ids,
                      const char *text, int64_t len, int32_t *out) {
    if (len <= 0) return 0;
    merger m = {spm_pair, text, ix, scores, NULL, NULL};
    symbol *sym = merge_all(&m, len);
    if (!sym) return EL_TOKENIZE_NO_MEMORY;
    int64_t n_out = 0;
    for (int32_t i = 0; i != -1; i = sym[i].next) {
        int64_t id = el_str_index_find(ix, text + sym[i].start, (size_t)sym[i].n);
        if (id >= 0) {
            out[n_out++] = (int32_t)id;
            continue;
        }
        /* only single characters can be missing: every merge makes a token */
        for (int32_t j = 0; j < sym[i].n; j++) {
            uint8_t c = (uint8_t)text[sym[i].start + j];
            if (byte_ids[c] < 0) {
                n_out = -1 - (int64_t)c;
                goto done;
            }
            out[n_out++] = byte_ids[c];
        }
    }
done:
    free(sym);
    return n_out;
}

int64_t el_bpe_encode(const el_str_index *tokens, const el_str_index *merges, const int32_t *byte_ids,
                      const char *word, int64_t len, int32_t *out) {
    if (len <= 0) return 0;
    char *scratch = malloc((size_t)len + 1);
    if (!scratch) return EL_TOKENIZE_NO_MEMORY;
    merger m = {bpe_pair, word, tokens, NULL, merges, scratch};
    symbol *sym = merge_all(&m, len);
    free(scratch);
    if (!sym) return EL_TOKENIZE_NO_MEMORY;
    int64_t n_out = 0;
    for (int32_t i = 0; i != -1; i = sym[i].next) {
        int64_t id = el_str_index_find(tokens, word + sym[i].start, (size_t)sym[i].n);
        if (id >= 0) {
            out[n_out++] = (int32_t)id;
            continue;
        }
        /* a symbol that is no token: the fallback token of each of its bytes; bytes without one
         * are dropped (llama.cpp does the same) */
        for (int32_t j = 0; j < sym[i].n; j++) {
            int32_t b = byte_ids[(uint8_t)word[sym[i].start + j]];
            if (b >= 0) out[n_out++] = b;
        }
    }
    free(sym);
    return n_out;
}
