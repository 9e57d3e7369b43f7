/* SentencePiece merges (api/vocab.h), following llama.cpp's llm_tokenizer_spm_session. */
#include <stdlib.h>
#include "common.h"
#include "api/vocab.h"

typedef struct {
    int32_t start;  /* byte offset of the symbol's text */
    int32_t n;      /* its length in bytes; 0 once merged into the left neighbour */
    int32_t prev, next;  /* neighbouring symbols, -1 at the ends */
} spm_symbol;

typedef struct {
    float score;     /* score of the token the pair would make */
    int32_t left, right;
    int32_t n;       /* bytes of the pair when it was queued: a later mismatch means outdated */
} spm_bigram;

/* Max-heap order: higher score first, then the leftmost pair (llm_bigram_spm's comparator). */
static int before(const spm_bigram *a, const spm_bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(spm_bigram *heap, int64_t *size, spm_bigram item) {
    int64_t i = (*size)++;
    while (i > 0) {
        int64_t parent = (i - 1) / 2;
        if (!before(&item, &heap[parent])) break;
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = item;
}

static spm_bigram heap_pop(spm_bigram *heap, int64_t *size) {
    spm_bigram top = heap[0], last = heap[--(*size)];
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

/* Queues the pair (left, right) when their text together is a token. */
static void try_pair(const el_str_index *ix, const float *scores, const char *text, const spm_symbol *sym,
                     int32_t left, int32_t right, spm_bigram *heap, int64_t *size) {
    if (left < 0 || right < 0) return;
    int32_t n = sym[left].n + sym[right].n;
    int64_t id = el_str_index_find(ix, text + sym[left].start, (size_t)n);
    if (id < 0) return;
    spm_bigram b = {scores[id], left, right, n};
    heap_push(heap, size, b);
}

/* Bytes of the UTF-8 character led by byte c (a stray continuation byte counts as one), as
 * llama.cpp's unicode_len_utf8. */
static int32_t utf8_len(uint8_t c) {
    static const int8_t by_high_nibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return by_high_nibble[c >> 4];
}

int64_t el_spm_encode(const el_str_index *ix, const float *scores, const int32_t *byte_ids,
                      const char *text, int64_t len, int32_t *out) {
    if (len <= 0) return 0;
    /* at most len symbols; each merge queues at most 2 pairs after the first len - 1 */
    spm_symbol *sym = malloc((size_t)len * sizeof *sym);
    spm_bigram *heap = malloc((size_t)(3 * len) * sizeof *heap);
    if (!sym || !heap) {
        free(sym);
        free(heap);
        return -1000;
    }
    int32_t n_sym = 0;
    for (int64_t offs = 0; offs < len; n_sym++) {
        int32_t n = utf8_len((uint8_t)text[offs]);
        if (n > len - offs) n = (int32_t)(len - offs);
        sym[n_sym] = (spm_symbol){(int32_t)offs, n, n_sym - 1, n_sym + 1};
        offs += n;
    }
    sym[n_sym - 1].next = -1;

    int64_t size = 0;
    for (int32_t i = 1; i < n_sym; i++) try_pair(ix, scores, text, sym, i - 1, i, heap, &size);
    while (size > 0) {
        spm_bigram b = heap_pop(heap, &size);
        spm_symbol *l = &sym[b.left], *r = &sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.n) continue;  /* outdated pair */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = b.left;
        try_pair(ix, scores, text, sym, l->prev, b.left, heap, &size);
        try_pair(ix, scores, text, sym, b.left, l->next, heap, &size);
    }

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
    free(heap);
    return n_out;
}
