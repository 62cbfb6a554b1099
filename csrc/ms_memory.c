/*
 * Memory accounting: bytes per tier and tensor class for one (model, quant, machine, placement,
 * context, batch), whether it fits, and the largest context and batch that fit.
 * The pure-Python twin is engine/reference/memory.py; tests hold the two equal.
 */
#include <math.h>
#include <string.h>

#include "ms_internal.h"

#ifdef MOESIM_HAVE_OPENMP
#include <omp.h>
#endif

static int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Context actually allocated: padded up to the runtime's granularity. */
static int64_t padded_context(int64_t c, int64_t gran)
{
    if (gran <= 1) return c;
    return ((c + gran - 1) / gran) * gran;
}

/* Per-sequence cache bytes of layer l at (padded) context c: (C-dependent part, fixed state). */
static void layer_cache(const ms_model_t *m, int32_t l, int64_t c, double kvb, double *kv, double *state)
{
    int64_t cap = m->kv_cap[l];
    int64_t tokens = cap > 0 ? imin64(c, cap) : c;
    double per_token = m->kv_elems[l] * kvb + m->kv_fixed[l];
    double v = per_token * (double) tokens;
    int64_t ratio = m->kv_ratio[l];
    if (ratio > 0)
        v += (double) (c / ratio) * (m->kv_ratio_elems[l] * kvb + m->kv_ratio_fixed[l]);
    *kv = v;
    *state = m->kv_state[l];
}

/* Is the layer's attention (and its KV, router, shared experts, dense FFN) on the GPU tier? */
static int layer_on_gpu(const ms_model_t *m, const ms_mem_config_t *c, int32_t l)
{
    if (c->placement == MS_PLACE_CPU_ONLY) return 0;
    if (c->placement == MS_PLACE_LAYERS_GPU) return (int64_t) l >= (int64_t) m->n_layers - c->placement_arg;
    return 1;
}

/* How many of layer l's routed experts live on the GPU tier (the rest are in host RAM), and how
 * many extra GPU cache slots (offload-cache keeps every expert in host RAM as well). */
static void routed_split(const ms_model_t *m, const ms_mem_config_t *c, int32_t l, double *gpu_experts,
                         double *host_experts)
{
    double e = (double) m->n_experts[l];
    *gpu_experts = 0.0;
    *host_experts = 0.0;
    if (m->n_experts[l] == 0) return;
    switch (c->placement) {
    case MS_PLACE_ALL_GPU:
    case MS_PLACE_UNIFIED:
        *gpu_experts = e;
        break;
    case MS_PLACE_EXPERTS_CPU:
    case MS_PLACE_CPU_ONLY:
        *host_experts = e;
        break;
    case MS_PLACE_N_CPU_MOE:
        /* llama.cpp --n-cpu-moe N: the routed experts of layers 0..N-1 stay in host RAM */
        if ((int64_t) l < c->placement_arg) *host_experts = e; else *gpu_experts = e;
        break;
    case MS_PLACE_GPU_EXPERTS: {
        double g = (double) imin64(c->placement_arg, m->n_experts[l]);
        *gpu_experts = g;
        *host_experts = e - g;
        break;
    }
    case MS_PLACE_LAYERS_GPU:
        if (layer_on_gpu(m, c, l)) *gpu_experts = e; else *host_experts = e;
        break;
    case MS_PLACE_OFFLOAD_CACHE:
        *gpu_experts = (double) imin64(c->placement_arg, m->n_experts[l]);
        *host_experts = e;
        break;
    default:
        break;
    }
}

/* Running sums of account() over the layers. */
typedef struct {
    double kv, state, slope;     /* all sequences' cache and state bytes; cache bytes per token */
    int any_gpu;                 /* anything on the GPU tier (its compute buffers are then allocated) */
} sums_t;

/* Weights and caches of every layer into by_class, at padded context cpad and batch b. */
static void account_layers(const ms_model_t *m, const ms_mem_config_t *c, int64_t cpad, int64_t b,
                           double (*bc)[MS_N_TIERS], sums_t *s)
{
    /* local accumulators: the by_class stores could alias *s and would pin it to memory */
    double kv_total = s->kv, state_total = s->state, kv_slope = s->slope;
    int any_gpu = s->any_gpu;
    for (int32_t l = 0; l < m->n_layers; l++) {
        int t = layer_on_gpu(m, c, l) ? MS_TIER_GPU : MS_TIER_HOST;
        double ge, he, kv, st;
        if (t == MS_TIER_GPU) any_gpu = 1;
        bc[MS_CLASS_ATTENTION][t] += m->attn[l];
        bc[MS_CLASS_ROUTER][t] += m->router[l];
        bc[MS_CLASS_SHARED][t] += m->shared[l];
        bc[MS_CLASS_DENSE][t] += m->dense[l];
        routed_split(m, c, l, &ge, &he);
        if (ge > 0.0) any_gpu = 1;
        bc[MS_CLASS_ROUTED][MS_TIER_GPU] += ge * m->expert_one[l];
        bc[MS_CLASS_ROUTED][MS_TIER_HOST] += he * m->expert_one[l];
        layer_cache(m, l, cpad, c->kv_bytes_per_elem, &kv, &st);
        bc[MS_CLASS_KV][t] += kv * (double) b;
        bc[MS_CLASS_STATE][t] += st * (double) b;
        kv_total += kv * (double) b;
        state_total += st * (double) b;
        if (m->kv_cap[l] == 0) kv_slope += m->kv_elems[l] * c->kv_bytes_per_elem + m->kv_fixed[l];
        if (m->kv_ratio[l] > 0)
            kv_slope += (m->kv_ratio_elems[l] * c->kv_bytes_per_elem + m->kv_ratio_fixed[l]) / (double) m->kv_ratio[l];
    }
    s->kv = kv_total;
    s->state = state_total;
    s->slope = kv_slope;
    s->any_gpu = any_gpu;
}

/* Embeddings, lm_head and the MTP modules (each caches like the last layer) into by_class. */
static void account_head(const ms_model_t *m, const ms_mem_config_t *c, int64_t cpad, int64_t b,
                         double (*bc)[MS_N_TIERS], sums_t *s)
{
    int head_t = c->placement == MS_PLACE_CPU_ONLY
                 || (c->placement == MS_PLACE_LAYERS_GPU && c->placement_arg == 0) ? MS_TIER_HOST : MS_TIER_GPU;
    int emb_t = (c->embed_on_gpu && head_t == MS_TIER_GPU) ? MS_TIER_GPU : MS_TIER_HOST;
    bc[MS_CLASS_EMBED][emb_t] += m->embed;
    bc[MS_CLASS_HEAD][head_t] += m->head + (emb_t != head_t ? c->head_copy : 0.0);
    if (c->mtp && m->mtp_layers > 0) {
        int32_t last = m->n_layers - 1;
        double kv, st;
        bc[MS_CLASS_MTP][head_t] += m->mtp;
        layer_cache(m, last, cpad, c->kv_bytes_per_elem, &kv, &st);
        bc[MS_CLASS_KV][head_t] += kv * (double) b * m->mtp_layers;
        bc[MS_CLASS_STATE][head_t] += st * (double) b * m->mtp_layers;
        s->kv += kv * (double) b * m->mtp_layers;
        s->state += st * (double) b * m->mtp_layers;
        /* each MTP module's cache grows per token like the last layer's */
        if (m->kv_cap[last] == 0) s->slope += (m->kv_elems[last] * c->kv_bytes_per_elem + m->kv_fixed[last]) * m->mtp_layers;
        if (m->kv_ratio[last] > 0)
            s->slope += (m->kv_ratio_elems[last] * c->kv_bytes_per_elem + m->kv_ratio_fixed[last])
                        / (double) m->kv_ratio[last] * m->mtp_layers;
    }
    if (head_t == MS_TIER_GPU) s->any_gpu = 1;
}

/* Tier totals, storage spill and fits bits (ms_fits_rule) from a filled by_class. Returns the fits bits. */
static int32_t account_tiers(const ms_mem_config_t *c, ms_mem_result_t *r)
{
    double (*bc)[MS_N_TIERS] = r->by_class;
    double gpu = 0.0, host = 0.0, host_weights = 0.0, spill;
    for (int k = 0; k < MS_N_CLASSES; k++) {
        gpu += bc[k][MS_TIER_GPU];
        host += bc[k][MS_TIER_HOST];
        if (k <= MS_CLASS_MTP) host_weights += bc[k][MS_TIER_HOST];
    }
    r->gpu_per_gpu = ms_gpu_one(c, (const double (*)[MS_N_TIERS]) bc);
    r->fits = ms_fits_rule(c, gpu, r->gpu_per_gpu, host, host_weights, bc[MS_CLASS_BUFFERS][MS_TIER_HOST], &spill);
    r->tier[MS_TIER_GPU] = gpu;
    r->tier[MS_TIER_HOST] = host - spill;
    r->tier[MS_TIER_STORAGE] = spill;
    r->weights = 0.0;
    for (int k = 0; k <= MS_CLASS_MTP; k++)
        r->weights += bc[k][MS_TIER_GPU] + bc[k][MS_TIER_HOST];
    return r->fits;
}

/* Fill r for context ctx and batch b. Returns the fits bits. */
static int32_t account(const ms_model_t *m, const ms_mem_config_t *c, int64_t ctx, int64_t b,
                       ms_mem_result_t *r)
{
    double (*bc)[MS_N_TIERS] = r->by_class;
    int64_t cpad = padded_context(ctx, c->kv_granularity);
    sums_t s = {0.0, 0.0, 0.0, 0};

    memset(bc, 0, sizeof(r->by_class));
    account_layers(m, c, cpad, b, bc, &s);
    account_head(m, c, cpad, b, bc, &s);
    if (c->n_gpus > 0 && s.any_gpu)
        bc[MS_CLASS_BUFFERS][MS_TIER_GPU] = (double) c->n_gpus * (c->gpu_fixed + c->gpu_buf0 + c->gpu_buf_ctx * (double) cpad);
    bc[MS_CLASS_BUFFERS][MS_TIER_HOST] = c->host_fixed + c->host_buf0 + c->host_buf_ctx * (double) cpad;
    r->kv = s.kv;
    r->state = s.state;
    r->kv_bytes_per_token = s.slope;
    return account_tiers(c, r);
}

static int32_t fits_at(const ms_model_t *m, const ms_mem_config_t *c, int64_t ctx, int64_t b, ms_mem_result_t *scratch)
{
    return account(m, c, ctx, b, scratch);
}

/* The closed form of the max context (ms_linear_context) where memory is linear in context: no
 * windows, no compression, no padding, no storage spill. Returns 0 when the form does not apply; the
 * caller verifies the candidate either way. */
static int64_t linear_context_candidate(const ms_model_t *m, const ms_mem_config_t *c, int64_t b, ms_mem_result_t *s)
{
    double g1, h1;
    if (!ms_linear_in_context(c)) return 0;
    for (int32_t l = 0; l < m->n_layers; l++)
        if (m->kv_cap[l] != 0 || m->kv_ratio[l] != 0) return 0;
    account(m, c, 1, b, s);
    g1 = s->gpu_per_gpu; h1 = s->tier[MS_TIER_HOST];
    account(m, c, 2, b, s);
    return ms_linear_context(c, g1, h1, s->gpu_per_gpu, s->tier[MS_TIER_HOST], m->max_context);
}

/* Largest x in [lo, hi] with pred(x) true, given pred monotone (true then false); lo-1 if none. */
static int64_t max_context_search(const ms_model_t *m, const ms_mem_config_t *c, int64_t b, ms_mem_result_t *s)
{
    int64_t lo = 1, hi = m->max_context, cand;
    if (!fits_at(m, c, lo, b, s)) return 0;
    if (fits_at(m, c, hi, b, s)) return hi;
    cand = linear_context_candidate(m, c, b, s);
    if (cand >= 1 && cand < hi && fits_at(m, c, cand, b, s) && !fits_at(m, c, cand + 1, b, s)) return cand;
    /* invariant: fits(lo) && !fits(hi) */
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (fits_at(m, c, mid, b, s)) lo = mid; else hi = mid;
    }
    return lo;
}

static int64_t max_batch_search(const ms_model_t *m, const ms_mem_config_t *c, int64_t ctx, ms_mem_result_t *s)
{
    int64_t lo = 1, hi = 2;
    const int64_t limit = (int64_t) 1 << 30;
    if (!fits_at(m, c, ctx, lo, s)) return 0;
    while (hi < limit && fits_at(m, c, ctx, hi, s)) { lo = hi; hi *= 2; }
    if (hi >= limit && fits_at(m, c, ctx, limit, s)) return limit;
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (fits_at(m, c, ctx, mid, s)) lo = mid; else hi = mid;
    }
    return lo;
}

static int check_inputs(const ms_model_t *m, const ms_mem_config_t *c)
{
    if (m == NULL || c == NULL) return MS_ERR_NULL_ARGUMENT;
    if (m->n_layers <= 0 || m->max_context <= 0 || c->batch <= 0 || c->n_gpus < 0) return MS_ERR_BAD_SIZE;
    if (c->context <= 0) return MS_ERR_BAD_CONTEXT;
    if (c->placement < 0 || c->placement >= MS_N_PLACEMENTS || c->placement_arg < 0) return MS_ERR_BAD_PLACEMENT;
    if (!(c->kv_bytes_per_elem >= 0.0) || !(c->gpu_capacity >= 0.0) || !(c->host_capacity >= 0.0)
        || !(c->storage_capacity >= 0.0) || !isfinite(c->gpu_capacity) || !isfinite(c->host_capacity))
        return MS_ERR_BAD_CAPACITY;
    for (int k = 0; k < MS_N_CLASSES; k++)
        if (!(c->gpu_ways[k] > 0.0) || !isfinite(c->gpu_ways[k])) return MS_ERR_BAD_SIZE;
    return 0;
}

int ms_memory(const ms_model_t *m, const ms_mem_config_t *c, ms_mem_result_t *out)
{
    ms_mem_result_t scratch;
    int err = check_inputs(m, c);
    if (err != 0) return err;
    if (out == NULL) return MS_ERR_NULL_ARGUMENT;
    out->max_context = max_context_search(m, c, c->batch, &scratch);
    out->max_batch = max_batch_search(m, c, c->context, &scratch);
    account(m, c, c->context, c->batch, out);
    return 0;
}

int ms_memory_many(const ms_model_t *m, const ms_mem_config_t *cfgs, int64_t n, ms_mem_result_t *out,
                   int n_threads, int64_t *err_index)
{
    int err = 0;
    int64_t bad = -1;
    if (cfgs == NULL || out == NULL) return MS_ERR_NULL_ARGUMENT;
#ifdef MOESIM_HAVE_OPENMP
    n_threads = ms_useful_threads(n, n_threads, 64);     /* ~10 us a configuration */
    #pragma omp parallel for schedule(static) num_threads(n_threads)
    for (int64_t i = 0; i < n; i++) {
        int e = ms_memory(m, &cfgs[i], &out[i]);
        if (e != 0) {
            #pragma omp critical
            {
                if (bad < 0 || i < bad) { bad = i; err = e; }
            }
        }
    }
#else
    (void) n_threads;
    for (int64_t i = 0; i < n; i++) {
        int e = ms_memory(m, &cfgs[i], &out[i]);
        if (e != 0) { bad = i; err = e; break; }
    }
#endif
    if (err_index != NULL) *err_index = bad;
    return err;
}
