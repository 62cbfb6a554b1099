/* Internal helpers shared by the kernel's C files (not part of the public header). */
#ifndef MS_INTERNAL_H
#define MS_INTERNAL_H

#include <math.h>
#include <stddef.h>

#include "moesim.h"

/* ------------------------------------------------------------------------- memory: the fits rule
 * Written once for ms_memory.c (account over layers) and ms_sweep.c (account over layer kinds); the
 * pure-Python twin is engine/reference/memory.py fits_rule, shared by both reference twins. */

/* From the bytes each tier needs (gpu: all GPUs; gpu_one: the busiest GPU, ms_mem_config_t.gpu_ways; host:
 * everything not on the GPU), how many of the host's weight bytes page in from storage (mmap'd weights
 * beyond host RAM; caches and buffers cannot), written to *spill, and which tiers the configuration uses:
 * MS_FITS_* bits, 0 when it does not fit. The GPUs fit when the busiest one's bytes are within one GPU's
 * capacity (memory is per GPU, replicated tensors on each). */
static inline int32_t ms_fits_rule(const ms_mem_config_t *c, double gpu, double gpu_one, double host,
                                   double host_weights, double host_buffers, double *spill)
{
    double s = 0.0;
    int32_t fits = 0;
    if (host > c->host_capacity && c->storage_spill) {
        s = host - c->host_capacity;
        /* host - (host - capacity) can round one ulp above the capacity: spill that ulp too */
        while (host - s > c->host_capacity) s = nextafter(s, INFINITY);
        if (s > host_weights) s = host_weights;
        if (s > c->storage_capacity) s = c->storage_capacity;
    }
    if (gpu_one <= c->gpu_capacity && host - s <= c->host_capacity) {
        if (gpu > 0.0 && c->n_gpus > 0) fits |= MS_FITS_GPU;
        if (host - s - host_buffers > 0.0) fits |= MS_FITS_HOST;
        if (s > 0.0) fits |= MS_FITS_STORAGE;
        if (fits == 0) fits = MS_FITS_HOST;   /* nothing placed anywhere but buffers */
    }
    if (gpu > 0.0 && c->n_gpus == 0) fits = 0;
    *spill = s;
    return fits;
}

/* The busiest GPU's bytes of a [class, tier] table: each class's GPU bytes over its gpu_ways, in class
 * order (the sweep adds its weight, KV, state and buffer terms in the same order: the same numbers). */
static inline double ms_gpu_one(const ms_mem_config_t *c, const double (*bc)[MS_N_TIERS])
{
    double one = 0.0;
    for (int k = 0; k < MS_N_CLASSES; k++) one += bc[k][MS_TIER_GPU] / c->gpu_ways[k];
    return one;
}

/* Threads worth waking for n rows of about rows_per_ms rows per millisecond each: at most one per
 * millisecond of work, so a call of a few rows never pays for waking (or, on a busy machine,
 * waiting on) a thread team. Every row is independent, so the answers do not change; the C harness
 * builds with MS_THREAD_GRAIN 0 (a thread per row) so its thread comparisons run real teams. */
#ifndef MS_THREAD_GRAIN
#define MS_THREAD_GRAIN 1
#endif
static inline int ms_useful_threads(int64_t n, int n_threads, int64_t rows_per_ms)
{
    int64_t per = rows_per_ms * MS_THREAD_GRAIN, most = per > 0 ? n / per : n;
    if (n_threads < 1) n_threads = 1;
    if (most < 1) most = 1;
    return most < (int64_t) n_threads ? (int) most : n_threads;
}

/* Does memory grow linearly in context (no padding, no storage spill; the caller also checks that no
 * layer has a capped window or a compressed C / ratio term)? */
static inline int ms_linear_in_context(const ms_mem_config_t *c)
{
    return c->kv_granularity <= 1 && !c->storage_spill;
}

/* The max context in closed form where memory is linear in C: each tier is a + s*C, so from the busiest
 * GPU's and the host's bytes at C = 1 (g1, h1) and C = 2 (g2, h2) the boundary is min over tiers of
 * 1 + (cap - t1) / (t2 - t1).
 * Returns 0 when it lies outside [1, max_context]; callers verify the candidate either way. */
static inline int64_t ms_linear_context(const ms_mem_config_t *c, double g1, double h1, double g2, double h2,
                                        int64_t max_context)
{
    double best = 1e300;
    if (g2 > g1) best = 1.0 + (c->gpu_capacity - g1) / (g2 - g1);
    if (h2 > h1) {
        double hb = 1.0 + (c->host_capacity - h1) / (h2 - h1);
        if (hb < best) best = hb;
    }
    if (!(best >= 1.0) || best > (double) max_context) return 0;
    return (int64_t) floor(best);
}

/* ------------------------------------------------------------------------- decode: attention's time
 * A layer's attention (with its router, shared experts and dense FFN) in one step runs as two kernel groups
 * in turn: the weight GEMVs (projections, router, shared experts, dense FFN) and the attention over the KV
 * cache (scores and values). Each group takes the larger of its memory and compute terms, the memory term on
 * a tie (*res gets the resource that set it), and the layer's attention is their sum: a compute-bound
 * attention kernel at long context does not hide behind the memory-bound GEMVs before it. One rule for the
 * cost model (ms_decode.c layer_attention) and the sweep's per-kind context terms (ms_sweep.c variant_times). */
static inline double ms_kernel_time(double t_mem, double t_flops, int res_mem, int res_flops, int *res)
{
    if (t_flops > t_mem) {
        *res = res_flops;
        return t_flops;
    }
    *res = res_mem;
    return t_mem;
}

/* ------------------------------------------------------------------------- stamps
 * Marks "current" by equality with a running int32 stamp (the cache's step stamp, the sampler's
 * per-token picks and group mask). A stamp is only ever compared for equality with the current one, so
 * when it reaches MS_STAMP_MAX the caller clears its marks and restarts it at 1: the same answers, and
 * no signed overflow (undefined behaviour) however many steps, sequences and layers a run has. A test
 * build may define a small MS_STAMP_MAX to take the restart path every few increments
 * (tests/test_c_core.py compares that build's results with the default build's, bit for bit). */
#ifndef MS_STAMP_MAX
#define MS_STAMP_MAX INT32_MAX
#endif

/* One per-layer cache over caller-owned arrays. */
typedef struct {
    int32_t n_experts, capacity, policy, used, stamp;
    int32_t *where;      /* [E] slot holding expert e, or -1 */
    int32_t *need;       /* [E] == stamp: the current step still needs expert e (not evicted first); stamp in
                          * [0, MS_STAMP_MAX], restarted by ms_cache_begin_step */
    int32_t *slot;       /* [E] expert in slot i (first `used` valid) */
    int32_t oldest, newest;   /* LRU: ends of the recency list of resident experts (-1: empty) */
    int32_t *newer, *older;   /* [E] LRU: next more / less recently used resident expert, or -1 */
    double *freq;        /* [E] accesses so far (LFU; not kept under LRU, whose order is its list) */
    double *last;        /* [E] tick of last access (LFU ties; not kept under LRU) */
    double *next_use;    /* [E] position (step x width + slot) of next use (Belady; not kept under LRU) */
} ms_cache_t;

/* Bytes one cache needs; carve its arrays from p and return the advanced pointer. */
static inline int64_t ms_cache_bytes(int32_t n_experts)
{
    return (int64_t) n_experts * (3 * (int64_t) sizeof(double) + 6 * (int64_t) sizeof(int32_t));
}

static inline char *ms_cache_carve(ms_cache_t *c, char *p, int32_t n_experts)
{
    size_t e = (size_t) n_experts;   /* callers check n_experts > 0 */
    c->freq = (double *) p; p += e * sizeof(double);
    c->last = (double *) p; p += e * sizeof(double);
    c->next_use = (double *) p; p += e * sizeof(double);
    c->where = (int32_t *) p; p += e * sizeof(int32_t);
    c->slot = (int32_t *) p; p += e * sizeof(int32_t);
    c->newer = (int32_t *) p; p += e * sizeof(int32_t);
    c->older = (int32_t *) p; p += e * sizeof(int32_t);
    c->need = (int32_t *) p; p += 2 * e * sizeof(int32_t);   /* one array + padding to 8 bytes */
    return p;
}

void ms_cache_reset(ms_cache_t *c, int32_t n_experts, int32_t capacity, int32_t policy, const int32_t *hot);
/* A new step will access the n distinct experts in sel: they are evicted only when nothing else can be. */
void ms_cache_begin_step(ms_cache_t *c, const int32_t *sel, int32_t n);
/* Access expert e at `tick` (its next use at step `next_use` for Belady); ticks of one cache increase
 * strictly from call to call (LRU keeps its order as a list, which is the order of the ticks). Returns 1 on a hit;
 * a miss inserts e (evicting per policy) unless the policy is static. */
int ms_cache_access(ms_cache_t *c, int32_t e, double tick, double next_use);
void ms_next_use(const int32_t *sel, const int32_t *nsel, int64_t n_steps, int32_t n_layers, int32_t width,
                 int32_t n_experts, int32_t *next_use, int32_t *last_seen);

/* ------------------------------------------------------------------------- decode internals
 * Shared by ms_decode.c (cost model, workspace, Monte Carlo, entry points), ms_route.c (routing
 * sampler) and ms_analytic.c (analytic path). */

#define ALIGN8(x) (((x) + 7) & ~((int64_t) 7))
#define MS_ALIGN64(x) (((x) + 63) & ~((int64_t) 63))

/* Expected or sampled work of one MoE layer in one step. */
typedef struct {
    double n_res;       /* distinct experts read from GPU memory (resident, hits, fetched) */
    double n_cpu;       /* distinct experts computed on the CPU from host RAM */
    double n_fetch;     /* distinct experts copied host -> GPU this step */
    double n_pref;      /* of those, prefetched during the previous layer */
    double n_waste;     /* wrong prefetches (copied, not used) */
    double n_disk;      /* experts read from storage into the page cache */
    double pairs_gpu;   /* token-expert pairs computed on the GPU */
    double pairs_cpu;   /* ... on the CPU */
} layer_work_t;

/* xoshiro256** one step and its uniform, inline for the sampler's per-expert loops (a call each was a
 * third of the race); ms_rng_next / ms_rng_uniform (ms_rng.c) are these, exported. */
static inline uint64_t ms_rng_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t ms_rng_next_inline(ms_rng_t *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = ms_rng_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = ms_rng_rotl(s[3], 45);
    return result;
}

static inline double ms_rng_uniform_inline(ms_rng_t *rng)
{
    /* 53 random bits, offset by half a step: strictly inside (0, 1), so logs stay finite */
    return ((double) (ms_rng_next_inline(rng) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* The ziggurat of the exponential distribution (Marsaglia & Tsang 2000, 256 strips, 53-bit values): the
 * sampler's Exp(1) draws without a log in ~99 % of them (ms_route.c). */
typedef struct {
    uint64_t k[256];            /* strip i's fast-accept bound on the 53 high bits */
    double w[256], f[256];      /* value per unit of those bits; exp(-x) at the strip's edge */
} ms_zig_t;

/* One expert group's state while a token races group-limited routing (ms_route.c): the smallest race
 * keys of the group, generated in increasing order. */
typedef struct {
    double tot, rem;            /* the group's weight; the weight of its experts not yet drawn */
    double c;                   /* the last key drawn */
    double hk, k2, score;       /* the key at the head of the merge, the second key, the group's score */
    int32_t n, he, e2, stage, pick;  /* keys drawn, experts of hk and k2, head is k2 (1) or later, allowed */
    int32_t pad;
} ms_group_t;

/* The workspace of one configuration, carved by ws_layout (ms_decode.c). */
typedef struct {
    int32_t E, K, L, B, W;      /* experts, top-k, routing layers, batch, union width */
    int64_t T;                  /* steps */
    int32_t *sel, *cnt, *nsel;  /* [T][L][W], [T][L][W], [T][L] */
    int32_t *nu;                /* [T][L][W] Belady next use */
    int32_t NB;                 /* alias blocks per layer: n_group under group-limited routing, else 1 */
    double *w;                  /* [B][L][E] request weights (linear, > 0) */
    double *aprob;              /* [B][L][E] alias tables of w, one per block of E / NB experts: keep chance */
    int32_t *alias;             /* [B][L][E] ... and the alias (index within the block) */
    double *btot;               /* [B][L][NB] weight of each block */
    int32_t *stk;               /* [2E] scratch of the alias construction */
    int32_t *prev, *nprev;      /* [B][L][K], [B] */
    int32_t *hist, *nhist, *hhead;  /* [B][L][history][K] ring of older tokens' picks, [B][L] count, [B][L] next slot */
    int64_t *tok_in_req, *trace_pos;  /* [B] */
    int32_t *seen;              /* [E] stamp of the token whose race key of expert e is drawn (groups) */
    int32_t *mark;              /* [L][E] union stamp */
    int32_t *pos;               /* [L][E] position in the step's union */
    int32_t *chosen;            /* [E] stamp of the current token's picks */
    ms_group_t *grp;            /* [n_group] */
    ms_zig_t *zig;              /* the exponential ziggurat (group-limited routing) */
    int32_t *usel, *ucnt;       /* [E] scratch: a step's union re-ordered by expert id */
    double *che, *lq;           /* analytic scratch: [E] Che rates, [n_scenarios][E] log(1 - q) */
    char *caches;               /* 2 x L caches (GPU, page) */
    int32_t *last_seen;         /* [E] */
    layer_work_t *work;         /* [n_layers of the model] */
    double *lt;                 /* [n_layers] */
    double *times;              /* [T] */
    int32_t *tok_out;           /* optional [T][B][tokens_per_step][L][K] per-token picks */
} ws_t;

/* 1 where a machine's rates and terms are in range (what ms_decode checks before it runs); ms_machine.c. */
int ms_machine_valid(const ms_machine_t *hw);
/* Step time from per-layer work (attribution and byte counts into acc); ms_decode.c. */
double ms_step_time(const ms_decode_model_t *m, const ms_machine_t *hw, const ms_decode_config_t *c,
                    const layer_work_t *work, double *lt, ms_decode_result_t *acc);
/* Fill the step unions (sel / cnt / nsel) of every step, sampled or replayed; ms_route.c. */
int ms_route_generate(const ms_routing_t *r, const ms_decode_config_t *c, ws_t *ws, double *reuse_num,
                      double *reuse_den, double *selections);
/* 0, or 1 when a routing's token-memory window tables are malformed and not marked checked (windows_checked):
 * what the kernels test. */
static inline int ms_windows_bad(const ms_routing_t *r)
{
    return !r->windows_checked && ms_check_windows(r);
}
/* The analytic path on a laid-out workspace; ms_analytic.c. */
int ms_analytic(const ms_decode_model_t *m, const ms_machine_t *hw, const ms_routing_t *r,
                const ms_decode_config_t *c, ws_t *ws, ms_decode_result_t *out);

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
/* The automatic placement at (ctx, b); fits_up_to: the largest context any candidate fits at b if known
 * (ms_sweep_auto_max_context), else -1. */
int32_t ms_sweep_choose(const ms_sweep_mem_t *g, int64_t ctx, int64_t b, int64_t fits_up_to, kvpart_t *k,
                        int64_t *hint);
/* The largest context that fits at batch b under the best placement for that context (ms_sweep_memory.c). */
int64_t ms_sweep_auto_max_context(const ms_sweep_mem_t *g, int64_t b);

/* ms_cache_rates.c: the analytic path's cache hit rates (window tables of a token-memory routing, the sticky
 * LRU chain, LFU's counts). Scratch as documented there. */
double ms_window_inclusion(const ms_routing_t *r, int32_t l, double B, double tps, double *p);
double ms_window_hits(const ms_routing_t *r, int32_t l, double B, double tps, double C, double D, double *p,
                      double *both);
double ms_full_step_hits(const double *p, const double *both, int32_t E, double C, double D, int32_t k, double V);
double ms_union_variance(const ms_routing_t *r, int32_t l, int32_t batch, int32_t tps, int32_t j, double *a);
double ms_window_reuse(const ms_routing_t *r, int32_t l);
double ms_chain_reuse(const ms_routing_t *r, int32_t l);

/* The per-token rate at which a sticky routing (stickiness s, top-k picks) picks expert e afresh when the token
 * before did not use it, e's per-token inclusion q kept stationary (ms_cache_rates.c scenario_logs). */
static inline double ms_fresh_rate(double q, double s, int32_t k)
{
    return q * (1.0 - s) / (1.0 - q * s * (k - 1.0) / k);
}
double ms_lru_hit_rate(const ms_routing_t *r, int32_t batch, int32_t tps, int32_t l, double C, double *pc,
                       double *pf, double *che, double *lq, double *lf);
double ms_lfu_hit_rate(const ms_routing_t *r, int32_t batch, int32_t tps, int32_t l, double C, double steps,
                       double warmup, double *pc, double *pf, double *mu, double *sd, double *pbar, double *pvar,
                       double *lq, double *lf, double *forced);

#endif
