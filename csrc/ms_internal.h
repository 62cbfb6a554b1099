/* Internal helpers shared by the decode kernel's C files (not part of the public header). */
#ifndef MS_INTERNAL_H
#define MS_INTERNAL_H

#include "moesim.h"

/* One per-layer cache over caller-owned arrays. */
typedef struct {
    int32_t n_experts, capacity, policy, used, stamp;
    int32_t *where;      /* [E] slot holding expert e, or -1 */
    int32_t *need;       /* [E] == stamp: the current step still needs expert e (not evicted first) */
    int32_t *slot;       /* [E] expert in slot i (first `used` valid) */
    double *freq;        /* [E] accesses so far (LFU) */
    double *last;        /* [E] tick of last access (LRU, LFU ties) */
    double *next_use;    /* [E] position (step x width + slot) of next use (Belady) */
} ms_cache_t;

/* Bytes one cache needs; carve its arrays from p and return the advanced pointer. */
static inline int64_t ms_cache_bytes(int32_t n_experts)
{
    return (int64_t) n_experts * (3 * (int64_t) sizeof(double) + 4 * (int64_t) sizeof(int32_t));
}

static inline char *ms_cache_carve(ms_cache_t *c, char *p, int32_t n_experts)
{
    c->freq = (double *) p; p += n_experts * sizeof(double);
    c->last = (double *) p; p += n_experts * sizeof(double);
    c->next_use = (double *) p; p += n_experts * sizeof(double);
    c->where = (int32_t *) p; p += n_experts * sizeof(int32_t);
    c->slot = (int32_t *) p; p += n_experts * sizeof(int32_t);
    c->need = (int32_t *) p; p += 2 * n_experts * sizeof(int32_t);   /* one array + padding to 8 bytes */
    return p;
}

void ms_cache_reset(ms_cache_t *c, int32_t n_experts, int32_t capacity, int32_t policy, const int32_t *hot);
/* A new step will access the n distinct experts in sel: they are evicted only when nothing else can be. */
void ms_cache_begin_step(ms_cache_t *c, const int32_t *sel, int32_t n);
/* Access expert e at `tick` (its next use at step `next_use` for Belady). Returns 1 on a hit;
 * a miss inserts e (evicting per policy) unless the policy is static. */
int ms_cache_access(ms_cache_t *c, int32_t e, double tick, double next_use);
void ms_next_use(const int32_t *sel, const int32_t *nsel, int64_t n_steps, int32_t n_layers, int32_t width,
                 int32_t n_experts, int32_t *next_use, int32_t *last_seen);

/* ---- ms_sweep.c internals shared with ms_place.c (the automatic placement, implemented once) ---- */

/* The context- and batch-dependent part of account() for one KV layout and configuration,
 * cached while successive evaluations share (layout, cfg, context, batch); {-1, -1, 0...}: empty. */
typedef struct {
    int32_t layout, cfg;
    int64_t ctx, b;
    double kv_g, kv_h, st_g, st_h, buf_g, buf_h;
} kvpart_t;

/* 0 or the MS_ERR_* code of a malformed group table. */
int ms_sweep_check_mem(const ms_sweep_mem_t *g);
/* The candidate (index into g->places) the group's automatic-placement rule (MS_SWEEP_AUTO_*) picks at
 * (ctx, b); k caches partial sums, *hint is the previous answer of the search (-1: none). */
int32_t ms_sweep_choose(const ms_sweep_mem_t *g, int64_t ctx, int64_t b, kvpart_t *k, int64_t *hint);

#endif
