/* Runs of GGUF strings and a hash index over them (text -> position), so a 262k-token vocabulary
 * is looked up in place, without one Python object per token. Implemented in vocab_index.c.
 *
 * A run is n strings stored back to back as GGUF writes a string array: each is a u64
 * little-endian byte length followed by that many bytes. bounds[i] is where string i's bytes
 * start and bounds[n] is 8 bytes past the end of the last one, so string i occupies
 * [bounds[i], bounds[i+1] - 8). */

/* Walks the n strings of a run that starts (at its first length field) at buf[pos], buf holding
 * size bytes; fills bounds[0..n]. Returns 0, or i + 1 when string i (its length field or its
 * bytes) runs past the end of buf. */
int64_t el_str_bounds(const char *buf, uint64_t size, uint64_t pos, uint64_t n, int64_t *bounds);

typedef struct {
    const char *base;       /* the buffer the run's bounds refer to */
    const int64_t *bounds;  /* n + 1 entries, as above */
    int64_t n;
    uint32_t *slots;        /* n_slots entries, a power of two > n: position + 1, 0 = empty */
    uint64_t mask;          /* n_slots - 1 */
} el_str_index;

/* Inserts every string (slots all zero on entry). With first_wins a repeated string keeps its
 * first position and the call returns -1; otherwise it stops at the first repeat and returns
 * its position, with *earlier set to the first one. n must be below 2^32 - 1. */
int64_t el_str_index_build(el_str_index *ix, int first_wins, int64_t *earlier);

/* Position of the string equal to key[0..len), or -1. */
int64_t el_str_index_find(const el_str_index *ix, const char *key, size_t len);

/* Tokenization by pair merges (merge_tokenize.c): both start from one symbol per UTF-8 character
 * and repeatedly merge the best adjacent pair, leftmost first on ties. out needs room for len ids.
 * They return the number of ids written, or EL_TOKENIZE_NO_MEMORY. */
#define EL_TOKENIZE_NO_MEMORY -1000

/* SentencePiece, as llama.cpp's llm_tokenizer_spm_session, on text[0..len) (valid UTF-8, spaces
 * already written as U+2581): the best pair is the one whose concatenation is the token of highest
 * score (ix indexes the token texts, scores[id] their scores); a final symbol that is no token is
 * written as the tokens of its bytes, byte_ids[byte]. Returns -1 - b when byte b is needed but
 * byte_ids[b] < 0. */
int64_t el_spm_encode(const el_str_index *ix, const float *scores, const int32_t *byte_ids,
                      const char *text, int64_t len, int32_t *out);

/* BPE, as llama.cpp's llm_tokenizer_bpe_session, on one pre-token word[0..len) (mapped through
 * GPT-2's byte map, or raw UTF-8 for SPM-style vocabularies): the best pair is the one whose rule
 * "left right" has the lowest rank (merges indexes the rule texts, rank = position); a final
 * symbol that is no token is written as the fallback tokens of its bytes, byte_ids[byte] (the
 * byte alone, or <0xAB>), leaving out the bytes whose entry is < 0. */
int64_t el_bpe_encode(const el_str_index *tokens, const el_str_index *merges, const int32_t *byte_ids,
                      const char *word, int64_t len, int32_t *out);
