/*
 * Sweeps: millions of (context, batch) configurations of one lowered group per second. This file has
 * the context functions, the variant lookup and decode; memory is ms_sweep_memory.c.
 *
 * Decode adds, per attention kind, max(bytes / bw, FLOPs / rate) of the attention over the cache at the
 * configuration's context to a per-variant constant: the analytic kernel's step time with those zeroed (the cache
 * reads and scores are the only context-dependent terms of the cost model). Prefill is a per-variant constant: the
 * prompt is prefilled from an empty cache. The pure-Python twin is engine/reference/sweep.py.
 */
#include <math.h>
#include <string.h>

#include "ms_internal.h"

#ifdef MOESIM_HAVE_OPENMP
#include <omp.h>
#endif

/* ------------------------------------------------------------------------- context functions */

static int64_t cap64(int64_t c, int64_t cap) { return cap >= 0 && cap < c ? cap : c; }

double ms_ctx_eval(const ms_ctx_fn_t *f, int64_t c)
{
    double v = f->a1 * (double) cap64(c, f->c1);
    if (f->a2 != 0.0) v += f->a2 * (double) cap64(c, f->c2);
    if (f->r > 0) {
        int64_t e = c / f->r;
        if (f->b1 != 0.0) v += f->b1 * (double) cap64(e, f->k1);
        if (f->b2 != 0.0) v += f->b2 * (double) e;
    }
    return v + f->s;
}

/* ------------------------------------------------------------------------- variant lookup */

int64_t ms_sweep_lookup(const int64_t *keys, int64_t n, const int64_t *table_keys, int64_t n_table, int32_t *variant,
                        int64_t *missing, int64_t max_missing, int64_t *n_missing)
{
    /* keys repeat with the batch axis: a small direct-mapped cache in front of the binary search */
    int64_t cache_key[256], unknown = 0, nm = 0;
    int32_t cache_val[256];
    for (int s = 0; s < 256; s++) cache_key[s] = -1;
    for (int64_t i = 0; i < n; i++) {
        int64_t k = keys[i];
        int s = (int) (((uint64_t) k * 0x9E3779B97F4A7C15ULL) >> 56);
        int32_t v;
        if (cache_key[s] == k) {
            v = cache_val[s];
        } else {
            int64_t lo = 0, hi = n_table;      /* first index with table_keys >= k */
            while (lo < hi) {
                int64_t mid = lo + (hi - lo) / 2;
                if (table_keys[mid] < k) lo = mid + 1; else hi = mid;
            }
            v = lo < n_table && table_keys[lo] == k ? (int32_t) lo : -1;
            cache_key[s] = k;
            cache_val[s] = v;
            if (v < 0 && nm < max_missing) missing[nm++] = k;
        }
        variant[i] = v;
        unknown += v < 0;
    }
    if (n_missing) *n_missing = nm;
    return unknown;
}

/* ------------------------------------------------------------------------- decode */

static int argmax_res(const double *res)
{
    int best = 0;
    for (int k = 1; k < MS_N_RES; k++)
        if (res[k] > res[best]) best = k;
    return best;
}

/* Step seconds (with attribution to res) and prefill seconds of variant v at context ctx, batch b. */
/* The group's context functions at ctx (kept while successive configurations share the context). */
typedef struct {
    int64_t ctx;
    double kv[MS_SWEEP_MAX_FNS], sf[MS_SWEEP_MAX_FNS];
} fn_cache_t;

static const fn_cache_t *eval_fns(const ms_sweep_decode_t *d, int64_t ctx, fn_cache_t *fc)
{
    if (fc->ctx == ctx) return fc;
    for (int32_t f = 0; f < d->n_fns; f++) {
        fc->kv[f] = ms_ctx_eval(&d->fn_kv[f], ctx);
        fc->sf[f] = ms_ctx_eval(&d->fn_sf[f], ctx);
    }
    fc->ctx = ctx;
    return fc;
}

static void variant_times(const ms_sweep_decode_t *d, const ms_sweep_variant_t *v, const fn_cache_t *fc, int64_t b,
                          double *res, double *step_out, double *prefill_out)
{
    const double *kvv = fc->kv, *sfv = fc->sf;
    double step = v->step0, db = (double) b;
    for (int32_t k = 0; k < v->n_kinds; k++) {
        const ms_sweep_kind_t *q = &d->kinds[v->kind0 + k];
        int win;
        /* the attention over the cache (ms_kernel_time); the weight GEMVs are the variant's step0 */
        double ts = ms_kernel_time(db * kvv[q->fn] * q->kv_rate, db * (sfv[q->fn] * q->sf_rate), q->res_mem,
                                   q->res_flops, &win);
        res[win] += q->n * ts;
        step += q->n * ts;
    }
    *step_out = step;
    *prefill_out = v->prefill0;          /* the prompt is prefilled from an empty cache: no context term */
}

static void analytic_one(const ms_sweep_decode_t *d, int64_t ctx, int64_t b, const ms_sweep_variant_t *v,
                         fn_cache_t *fc, ms_sweep_dec_out_t *out, int64_t i)
{
    double res[MS_N_RES], step, pf, rate, inv;
    memcpy(res, v->by_resource, sizeof(res));
    variant_times(d, v, eval_fns(d, ctx, fc), b, res, &step, &pf);
    inv = 1.0 / (step * pf);             /* one division for both rates */
    rate = v->accepted * (pf * inv);
    out->decode_tok_s[i] = rate;
    out->aggregate_tok_s[i] = (double) b * rate;
    out->tpot_ms[i] = step * v->tpot_scale;
    if (out->tpot_p50_ms) out->tpot_p50_ms[i] = out->tpot_ms[i];
    if (out->tpot_p99_ms) out->tpot_p99_ms[i] = out->tpot_ms[i];
    out->prefill_tok_s[i] = d->prompt * (step * inv);
    out->hit_rate[i] = v->hit_rate < 0.0 ? NAN : v->hit_rate;
    out->bottleneck[i] = argmax_res(res);
}

/* The group's tables: every variant's slice of the kinds table inside it, every kind's resources and
 * context function in range, then every configuration's variant index (*bad gets the first bad one). */
static int check_variants(const ms_sweep_decode_t *d, const int32_t *variant, int64_t n, int64_t *bad)
{
    if (d == NULL || variant == NULL || d->variants == NULL) return MS_ERR_NULL_ARGUMENT;
    if (d->n_fns < 0 || d->n_fns > MS_SWEEP_MAX_FNS || (d->n_fns > 0 && (d->fn_kv == NULL || d->fn_sf == NULL)))
        return MS_ERR_BAD_SWEEP;
    if (d->n_variants < 0 || d->n_kinds < 0 || (d->n_kinds > 0 && d->kinds == NULL)) return MS_ERR_BAD_SWEEP;
    for (int32_t k = 0; k < d->n_kinds; k++) {
        const ms_sweep_kind_t *q = &d->kinds[k];
        if (q->res_mem < 0 || q->res_mem >= MS_N_RES || q->res_flops < 0 || q->res_flops >= MS_N_RES
            || q->fn < 0 || q->fn >= d->n_fns) return MS_ERR_BAD_SWEEP;
    }
    for (int32_t v = 0; v < d->n_variants; v++) {
        const ms_sweep_variant_t *x = &d->variants[v];
        if (x->kind0 < 0 || x->n_kinds < 0 || (int64_t) x->kind0 + x->n_kinds > d->n_kinds) return MS_ERR_BAD_SWEEP;
    }
    if (!(d->prompt >= 1.0)) return MS_ERR_BAD_SIZE;
    for (int64_t i = 0; i < n; i++) {
        if (variant[i] < 0 || variant[i] >= d->n_variants) { *bad = i; return MS_ERR_BAD_SWEEP; }
    }
    return 0;
}

int ms_sweep_analytic(const ms_sweep_decode_t *d, const int64_t *context, const int64_t *batch, const int32_t *variant,
                      int64_t n, int n_threads, ms_sweep_dec_out_t *out, int64_t *err_index)
{
    int64_t bad = -1;
    int rc;
    if (err_index) *err_index = -1;
    if (context == NULL || batch == NULL || out == NULL) return MS_ERR_NULL_ARGUMENT;
    rc = check_variants(d, variant, n, &bad);
    if (rc) {
        if (err_index) *err_index = bad;
        return rc;
    }
    n_threads = ms_useful_threads(n, n_threads, 8192);   /* ~100 ns a row */
#ifdef MOESIM_HAVE_OPENMP
    #pragma omp parallel num_threads(n_threads)
#endif
    {
        fn_cache_t fc;
        fc.ctx = -1;
#ifdef MOESIM_HAVE_OPENMP
        #pragma omp for schedule(static)
#endif
        for (int64_t i = 0; i < n; i++) analytic_one(d, context[i], batch[i], &d->variants[variant[i]], &fc, out, i);
    }
    return 0;
}

/* ------------------------------------------------------------------------- Monte Carlo */

static ms_decode_config_t mc_config(const ms_sweep_decode_t *d, int64_t b, uint64_t index)
{
    ms_decode_config_t c;
    memset(&c, 0, sizeof(c));
    c.batch = (int32_t) b;
    c.tokens_per_step = 1;
    c.drafts = 0;
    c.accepted = 1.0;
    c.steps = d->steps;
    c.warmup = d->warmup;
    c.policy = d->policy;
    c.mode = MS_MODE_MONTECARLO;
    c.seed = d->seed;
    c.index = index;
    return c;
}

int64_t ms_sweep_montecarlo_workspace_size(const ms_sweep_decode_t *d, int32_t max_batch)
{
    ms_decode_config_t c;
    int64_t w;
    if (d == NULL || d->mc_models == NULL || d->routing == NULL || d->n_templates < 1 || max_batch < 1) return 0;
    c = mc_config(d, max_batch, 0);
    /* every template has the group's n_layers (ms_sweep_montecarlo checks), so one size fits all */
    w = ms_decode_workspace_size(&d->mc_models[0], d->routing, &c);
    return MS_ALIGN64(2 * (int64_t) d->n_layers * (int64_t) sizeof(double)) + MS_ALIGN64(w);
}

/* The Monte Carlo tables: templates present, every variant's template index inside them, each template
 * as deep as the per-layer context functions (its kv / score arrays are sized n_layers), those functions
 * in range, and room for the per-layer arrays at the head of a thread's workspace. */
static int check_mc(const ms_sweep_decode_t *d, int64_t ws_bytes)
{
    if (d->mc_models == NULL || d->mc_machines == NULL || d->routing == NULL || d->layer_fn == NULL)
        return MS_ERR_NULL_ARGUMENT;
    if (d->n_templates < 1 || d->n_layers < 1) return MS_ERR_BAD_SWEEP;
    for (int32_t v = 0; v < d->n_variants; v++)
        if (d->variants[v].mc < 0 || d->variants[v].mc >= d->n_templates) return MS_ERR_BAD_SWEEP;
    for (int32_t t = 0; t < d->n_templates; t++)
        if (d->mc_models[t].n_layers != d->n_layers) return MS_ERR_BAD_SWEEP;
    for (int32_t l = 0; l < d->n_layers; l++)
        if (d->layer_fn[l] < 0 || d->layer_fn[l] >= d->n_fns) return MS_ERR_BAD_SWEEP;
    if (ws_bytes < MS_ALIGN64(2 * (int64_t) d->n_layers * (int64_t) sizeof(double))) return MS_ERR_BAD_WORKSPACE;
    return 0;
}

/* Configuration i on one thread's workspace `base` (ws_bytes): ms_decode of its variant's template with
 * the context's KV bytes and score FLOPs, into the output columns. Returns 0 or the error code. */
static int mc_one(const ms_sweep_decode_t *d, int64_t ctx, int64_t b, const ms_sweep_variant_t *v, uint64_t index,
                  char *base, int64_t ws_bytes, ms_sweep_dec_out_t *out, int64_t i)
{
    int64_t head = MS_ALIGN64(2 * (int64_t) d->n_layers * (int64_t) sizeof(double));
    double *kv = (double *) base, *sf = kv + d->n_layers;
    ms_decode_model_t m = d->mc_models[v->mc];
    ms_decode_config_t c;
    ms_decode_result_t r;
    double res[MS_N_RES], step, pf, acc;
    fn_cache_t fc;
    int e;
    if (b < 1 || b > INT32_MAX) return MS_ERR_BAD_SIZE;       /* ms_decode_config_t.batch is int32 */
    c = mc_config(d, b, index);
    for (int32_t l = 0; l < d->n_layers; l++) {
        kv[l] = ms_ctx_eval(&d->fn_kv[d->layer_fn[l]], ctx) * m.kv_bytes[l];   /* template: KV copies */
        sf[l] = ms_ctx_eval(&d->fn_sf[d->layer_fn[l]], ctx);
    }
    m.kv_bytes = kv;
    m.score_flops = sf;
    e = ms_decode(&m, &d->mc_machines[v->mc], d->routing, &c, base + head, ws_bytes - head, &r);
    if (e) return e;
    acc = r.accepted;
    fc.ctx = -1;
    memset(res, 0, sizeof(res));
    variant_times(d, v, eval_fns(d, ctx, &fc), b, res, &step, &pf);
    out->decode_tok_s[i] = acc / r.step_mean;
    out->aggregate_tok_s[i] = (double) b * acc / r.step_mean;
    out->tpot_ms[i] = 1e3 * r.step_mean / acc;
    if (out->tpot_p50_ms) out->tpot_p50_ms[i] = 1e3 * r.step_p50 / acc;
    if (out->tpot_p99_ms) out->tpot_p99_ms[i] = 1e3 * r.step_p99 / acc;
    out->prefill_tok_s[i] = d->prompt / pf;
    out->hit_rate[i] = r.hit_rate < 0.0 ? NAN : r.hit_rate;
    out->bottleneck[i] = argmax_res(r.by_resource);
    return 0;
}

int ms_sweep_montecarlo(const ms_sweep_decode_t *d, const int64_t *context, const int64_t *batch,
                        const int32_t *variant, const uint64_t *index, int64_t n, int n_threads, void *workspace,
                        int64_t ws_bytes, ms_sweep_dec_out_t *out, int64_t *err_index)
{
    int64_t bad = -1;
    int rc, first = 0;
    if (err_index) *err_index = -1;
    if (context == NULL || batch == NULL || index == NULL || out == NULL || workspace == NULL)
        return MS_ERR_NULL_ARGUMENT;
    rc = check_variants(d, variant, n, &bad);
    if (rc) {
        if (err_index) *err_index = bad;
        return rc;
    }
    rc = check_mc(d, ws_bytes);
    if (rc) return rc;
    n_threads = ms_useful_threads(n, n_threads, 1);      /* a decode each: never more threads than rows */
#ifndef MOESIM_HAVE_OPENMP
    n_threads = 1;
#endif
#ifdef MOESIM_HAVE_OPENMP
    #pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads)
#endif
    for (int64_t i = 0; i < n; i++) {
        int tid = 0;
#ifdef MOESIM_HAVE_OPENMP
        tid = omp_get_thread_num();
#endif
        int e = mc_one(d, context[i], batch[i], &d->variants[variant[i]], index[i],
                       (char *) workspace + (int64_t) tid * ws_bytes, ws_bytes, out, i);
        if (e) {
#ifdef MOESIM_HAVE_OPENMP
            #pragma omp critical
#endif
            {
                if (bad < 0 || i < bad) { bad = i; first = e; }
            }
        }
    }
    if (err_index) *err_index = bad;
    return first;
}
