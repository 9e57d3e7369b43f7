/* Runs of GGUF strings and an open-addressing hash index over them (api/vocab.h). */
#include "common.h"
#include "api/vocab.h"

int64_t el_str_bounds(const char *buf, uint64_t size, uint64_t pos, uint64_t n, int64_t *bounds) {
    for (uint64_t i = 0; i < n; i++) {
        if (pos > size || size - pos < 8) return (int64_t)i + 1;
        uint64_t len;
        memcpy(&len, buf + pos, 8);  /* GGUF is little-endian, as every CPU we build for */
        pos += 8;
        bounds[i] = (int64_t)pos;
        if (len > size - pos) return (int64_t)i + 1;
        pos += len;
    }
    bounds[n] = (int64_t)(pos + 8);
    return 0;
}

/* FNV-1a over the bytes, then a 64-bit finalizer (splitmix64's) so the low bits that pick the
 * slot depend on every byte. */
static uint64_t str_hash(const char *s, size_t len) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h;
}

static int str_equal(const el_str_index *ix, int64_t id, const char *key, size_t len) {
    int64_t start = ix->bounds[id];
    size_t n = (size_t)(ix->bounds[id + 1] - 8 - start);
    return n == len && memcmp(ix->base + start, key, len) == 0;
}

int64_t el_str_index_build(el_str_index *ix, int first_wins, int64_t *earlier) {
    for (int64_t id = 0; id < ix->n; id++) {
        const char *s = ix->base + ix->bounds[id];
        size_t len = (size_t)(ix->bounds[id + 1] - 8 - ix->bounds[id]);
        uint64_t slot = str_hash(s, len) & ix->mask;
        for (;; slot = (slot + 1) & ix->mask) {  /* linear probing */
            uint32_t held = ix->slots[slot];
            if (held == 0) {
                ix->slots[slot] = (uint32_t)(id + 1);
                break;
            }
            if (str_equal(ix, held - 1, s, len)) {
                if (first_wins) break;
                *earlier = held - 1;
                return id;
            }
        }
    }
    return -1;
}

int64_t el_str_index_find(const el_str_index *ix, const char *key, size_t len) {
    uint64_t slot = str_hash(key, len) & ix->mask;
    for (;; slot = (slot + 1) & ix->mask) {
        uint32_t held = ix->slots[slot];
        if (held == 0) return -1;
        if (str_equal(ix, held - 1, key, len)) return held - 1;
    }
}
