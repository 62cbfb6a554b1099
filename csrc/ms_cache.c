/*
 * Per-layer expert caches (GPU expert cache, host page cache): LRU, LFU, static pinning and the
 * Belady (MIN) offline optimum. A cache is a view over caller-owned arrays; nothing is allocated.
 * engine/reference/cache.py has the same policies in plain Python.
 */
#include <stdint.h>
#include <string.h>

#include "ms_internal.h"

void ms_cache_reset(ms_cache_t *c, int32_t n_experts, int32_t capacity, int32_t policy, const int32_t *hot)
{
    c->n_experts = n_experts;
    c->capacity = capacity < n_experts ? capacity : n_experts;
    c->policy = policy;
    c->used = 0;
    c->stamp = 0;
    c->oldest = c->newest = -1;
    for (int32_t e = 0; e < n_experts; e++) {
        c->where[e] = -1;
        c->newer[e] = c->older[e] = -1;
        c->need[e] = 0;
        c->freq[e] = 0.0;
        c->last[e] = -1.0;
        c->next_use[e] = 0.0;
    }
    if (policy == MS_POLICY_STATIC) {
        /* pinned: the `capacity` most popular experts, never replaced */
        for (int32_t i = 0; i < c->capacity; i++) {
            c->slot[i] = hot[i];
            c->where[hot[i]] = i;
        }
        c->used = c->capacity;
    }
}

void ms_cache_begin_step(ms_cache_t *c, const int32_t *sel, int32_t n)
{
    if (c->stamp >= MS_STAMP_MAX) {
        /* restart the stamp (see MS_STAMP_MAX): no mark may equal a future stamp */
        for (int32_t e = 0; e < c->n_experts; e++) c->need[e] = 0;
        c->stamp = 0;
    }
    c->stamp++;
    for (int32_t j = 0; j < n; j++) c->need[sel[j]] = c->stamp;
}

/* LRU's recency list: resident experts from the least recently used (oldest) to the newest. Every access
 * moves its expert to the newest end, and ticks increase strictly, so the list is the order of `last`. */
static void lru_unlink(ms_cache_t *c, int32_t e)
{
    int32_t o = c->older[e], n = c->newer[e];
    if (o >= 0) c->newer[o] = n; else c->oldest = n;
    if (n >= 0) c->older[n] = o; else c->newest = o;
}

static void lru_push(ms_cache_t *c, int32_t e)
{
    c->older[e] = c->newest;
    c->newer[e] = -1;
    if (c->newest >= 0) c->newer[c->newest] = e; else c->oldest = e;
    c->newest = e;
}

/* LRU's victim slot: the oldest expert the step no longer needs, else the oldest of all -- the slot the
 * scan of victim() picks (the smallest `last`: ticks are distinct, so there are no ties), without the scan. */
static int32_t lru_victim(const ms_cache_t *c)
{
    int32_t x = c->oldest;
    while (x >= 0 && c->need[x] == c->stamp) x = c->newer[x];
    if (x < 0) x = c->oldest;
    return c->where[x];
}

/* The slot to evict under LFU (least frequent, then least recent) or Belady (used furthest in the future),
 * among experts the current step no longer needs; only when every resident expert is still needed does it
 * fall back to all slots. Ties go to the lowest slot. LRU reads its recency list instead (lru_victim), the
 * same slot this scan over `last` picked. */
static int32_t victim(const ms_cache_t *c)
{
    int32_t best = -1, pass;
    for (pass = 0; pass < 2 && best < 0; pass++) {
    for (int32_t i = 0; i < c->used; i++) {
        int32_t e = c->slot[i], b;
        if (pass == 0 && c->need[e] == c->stamp) continue;
        if (best < 0) { best = i; continue; }
        b = c->slot[best];
        if (c->policy == MS_POLICY_BELADY) {
            if (c->next_use[e] > c->next_use[b]) best = i;
        } else if (c->freq[e] < c->freq[b] || (c->freq[e] == c->freq[b] && c->last[e] < c->last[b])) {
            best = i;
        }
    }
    }
    return best;
}

int ms_cache_access(ms_cache_t *c, int32_t e, double tick, double next_use)
{
    int hit = c->where[e] >= 0;
    c->need[e] = 0;
    if (c->policy != MS_POLICY_LRU) {
        /* what the scan of victim() reads (LRU's order is its list) */
        c->freq[e] += 1.0;
        c->last[e] = tick;
        c->next_use[e] = next_use;
    }
    if (hit) {
        if (c->policy == MS_POLICY_LRU && c->newest != e) {
            lru_unlink(c, e);
            lru_push(c, e);
        }
        return hit;
    }
    if (c->policy == MS_POLICY_STATIC || c->capacity == 0) return hit;
    if (c->used < c->capacity) {
        c->slot[c->used] = e;
        c->where[e] = c->used++;
    } else {
        int32_t i = c->policy == MS_POLICY_LRU ? lru_victim(c) : victim(c);
        if (c->policy == MS_POLICY_LRU) lru_unlink(c, c->slot[i]);
        c->where[c->slot[i]] = -1;
        c->slot[i] = e;
        c->where[e] = i;
    }
    if (c->policy == MS_POLICY_LRU) lru_push(c, e);
    return 0;
}

/* next_use[t][l][j]: the position (step x width + slot) at which expert sel[t][l][j] is next used
 * in layer l (n_steps x width if never), so MIN evicts the expert needed furthest ahead. */
void ms_next_use(const int32_t *sel, const int32_t *nsel, int64_t n_steps, int32_t n_layers, int32_t width,
                 int32_t n_experts, int32_t *next_use, int32_t *last_seen)
{
    for (int32_t l = 0; l < n_layers; l++) {
        for (int32_t e = 0; e < n_experts; e++) last_seen[e] = (int32_t) (n_steps * width);
        for (int64_t t = n_steps - 1; t >= 0; t--) {
            int64_t row = (t * n_layers + l) * (int64_t) width;
            int32_t n = nsel[t * n_layers + l];
            for (int32_t j = 0; j < n; j++) next_use[row + j] = last_seen[sel[row + j]];
            for (int32_t j = 0; j < n; j++) last_seen[sel[row + j]] = (int32_t) (t * width + j);
        }
    }
}

int64_t ms_cache_workspace_size(int32_t n_experts, int32_t n_layers, int64_t n_steps, int32_t width)
{
    int64_t cache = ms_cache_bytes(n_experts);
    int64_t nu = n_steps * (int64_t) n_layers * width * (int64_t) sizeof(int32_t);
    return cache + nu + (int64_t) n_experts * (int64_t) sizeof(int32_t) + 64;
}

int ms_cache_replay(const int32_t *sel, const int32_t *nsel, int64_t n_steps, int32_t n_layers, int32_t width,
                    int32_t n_experts, int32_t capacity, int32_t policy, const int32_t *hot, int64_t warmup,
                    void *workspace, int64_t workspace_bytes, double *hits, double *accesses)
{
    ms_cache_t c;
    char *p = (char *) workspace;
    int32_t *nu, *last_seen;
    if (sel == NULL || nsel == NULL || workspace == NULL || hits == NULL || accesses == NULL) return MS_ERR_NULL_ARGUMENT;
    if (n_experts <= 0 || n_layers <= 0 || width <= 0 || n_steps < 0 || capacity < 0) return MS_ERR_BAD_SIZE;
    if (n_steps * (int64_t) width >= INT32_MAX) return MS_ERR_BAD_SIZE;
    if (policy < 0 || policy >= MS_N_POLICIES) return MS_ERR_BAD_POLICY;
    if (policy == MS_POLICY_STATIC && hot == NULL) return MS_ERR_NULL_ARGUMENT;
    if (workspace_bytes < ms_cache_workspace_size(n_experts, n_layers, n_steps, width)) return MS_ERR_BAD_WORKSPACE;
    for (int64_t i = 0; i < n_steps * n_layers; i++) {
        if (nsel[i] < 0 || nsel[i] > width) return MS_ERR_BAD_TRACE;
        for (int32_t j = 0; j < nsel[i]; j++)
            if (sel[i * width + j] < 0 || sel[i * width + j] >= n_experts) return MS_ERR_BAD_TRACE;
    }
    p = ms_cache_carve(&c, p, n_experts);
    nu = (int32_t *) p;
    p += n_steps * (int64_t) n_layers * width * (int64_t) sizeof(int32_t);
    last_seen = (int32_t *) p;
    if (policy == MS_POLICY_BELADY)
        ms_next_use(sel, nsel, n_steps, n_layers, width, n_experts, nu, last_seen);
    for (int32_t l = 0; l < n_layers; l++) {
        double tick = 0.0;
        hits[l] = 0.0;
        accesses[l] = 0.0;
        ms_cache_reset(&c, n_experts, capacity, policy, hot == NULL ? NULL : hot + (int64_t) l * n_experts);
        for (int64_t t = 0; t < n_steps; t++) {
            int64_t row = (t * n_layers + l) * (int64_t) width;
            int32_t n = nsel[t * n_layers + l];
            ms_cache_begin_step(&c, sel + row, n);
            for (int32_t j = 0; j < n; j++) {
                double next = policy == MS_POLICY_BELADY ? (double) nu[row + j] : 0.0;
                int hit = ms_cache_access(&c, sel[row + j], tick, next);
                tick += 1.0;
                if (t >= warmup) {
                    hits[l] += hit;
                    accesses[l] += 1.0;
                }
            }
        }
    }
    return 0;
}
