/*
 * Sweep memory (ms_sweep_memory): bytes per tier, fits, max context / batch and the runtime's automatic
 * placement for the configurations of one lowered group.
 *
 * It mirrors ms_memory.c's account() over layer kinds instead of layers (the fits rule and the max-context
 * closed form are the shared ms_fits_rule / ms_linear_context of ms_internal.h): every byte count is an
 * exact integer (or a short dyadic fraction) far below 2^53, so the sums are the same numbers in any
 * order and fits / max context / max batch agree with ms_memory exactly (tests hold them equal).
 * The automatic placement mirrors engine.lower.placement (llama.cpp --fit, ktransformers). The
 * pure-Python twin is engine/reference/sweep.py.
 */
#include <math.h>
#include <string.h>

#include "ms_internal.h"

#ifdef MOESIM_HAVE_OPENMP
#include <omp.h>
#endif

/* ------------------------------------------------------------------------- memory */

typedef struct {
    double gpu, gpu_one, host, spill, kv, state, buf_host;
    int32_t fits;
} mem_eval_t;

/* Direct-mapped memo of a pure function of (place, x): any hit is the exact value. */
#define MEMO_SLOTS 1024
typedef struct {
    int64_t place[MEMO_SLOTS], x[MEMO_SLOTS], val[MEMO_SLOTS];
} memo_t;

typedef struct {
    memo_t max_batch;            /* x: padded context */
    int64_t last_place, last_cp, last_val;   /* the latest max batch */
    int64_t *mc_val;             /* [n_b] max context per batch index (-1: not computed yet) */
    int64_t *auto_cp, *auto_j;   /* [n_b] latest automatic placement per batch index (by padded context) */
    int64_t *hint;               /* [n_b] latest answer of the automatic placement's search */
    int64_t *fit_up;             /* [n_b] fit_limit up to FIT_CAP (-1: not computed yet) */
    kvpart_t k1;                 /* per-sequence sums at batch 1 of the latest (layout, cfg, context) */
} mem_ws_t;

#define WS_ARRAYS 5

int64_t ms_sweep_memory_workspace_size(int32_t n_b)
{
    return MS_ALIGN64((int64_t) sizeof(mem_ws_t))
           + MS_ALIGN64(WS_ARRAYS * (int64_t) (n_b > 0 ? n_b : 1) * (int64_t) sizeof(int64_t));
}

static int memo_slot(int64_t place, int64_t x)
{
    uint64_t h = ((uint64_t) x * 0x9E3779B97F4A7C15ULL) ^ ((uint64_t) place * 0xBF58476D1CE4E5B9ULL);
    return (int) (h >> 54);
}

static int memo_get(const memo_t *m, int64_t place, int64_t x, int64_t *val)
{
    int s = memo_slot(place, x);
    if (m->place[s] != place || m->x[s] != x) return 0;
    *val = m->val[s];
    return 1;
}

static void memo_put(memo_t *m, int64_t place, int64_t x, int64_t val)
{
    int s = memo_slot(place, x);
    m->place[s] = place;
    m->x[s] = x;
    m->val[s] = val;
}

static int64_t padded(int64_t c, int64_t gran)
{
    if (gran <= 1) return c;
    if ((gran & (gran - 1)) == 0) return (c + gran - 1) & ~(gran - 1);   /* llama.cpp's 256 */
    return ((c + gran - 1) / gran) * gran;
}

static void kv_part(const ms_sweep_mem_t *g, int32_t layout, int32_t cfgi, int64_t ctx, int64_t b, kvpart_t *k)
{
    const ms_mem_config_t *c = &g->cfg[cfgi];
    const int32_t *gc = g->gpu_count + (int64_t) layout * g->n_kinds;
    int64_t cp;
    double db = (double) b;
    if (k->layout == layout && k->cfg == cfgi && k->ctx == ctx && k->b == b) return;
    cp = padded(ctx, c->kv_granularity);
    k->layout = layout;
    k->cfg = cfgi;
    k->ctx = ctx;
    k->b = b;
    k->kv_g = k->kv_h = k->st_g = k->st_h = 0.0;
    for (int32_t q = 0; q < g->n_kinds; q++) {
        int64_t tokens = g->cap[q] > 0 ? (cp < g->cap[q] ? cp : g->cap[q]) : cp;
        double v = g->per_token[q] * (double) tokens, kvb, stb;
        if (g->ratio[q] > 0) v += (double) (cp / g->ratio[q]) * g->ratio_bytes[q];
        kvb = v * db;
        stb = g->state[q] * db;
        k->kv_g += (double) gc[q] * kvb;
        k->kv_h += (double) (g->count[q] - gc[q]) * kvb;
        k->st_g += (double) gc[q] * stb;
        k->st_h += (double) (g->count[q] - gc[q]) * stb;
    }
    k->buf_g = c->n_gpus > 0 ? (double) c->n_gpus * (c->gpu_fixed + c->gpu_buf0 + c->gpu_buf_ctx * (double) cp) : 0.0;
    k->buf_h = c->host_fixed + c->host_buf0 + c->host_buf_ctx * (double) cp;
}

/* The tail of ms_memory.c account(): tier totals, storage spill and fits bits (ms_fits_rule) from the
 * per-tier sums. */
static int32_t finish(const ms_sweep_mem_t *g, const ms_sweep_place_t *p, double kv_g, double kv_h, double st_g,
                      double st_h, double buf_g, double buf_h, mem_eval_t *r)
{
    const ms_mem_config_t *c = &g->cfg[p->cfg];
    double bg = p->any_gpu ? buf_g : 0.0;
    double gpu = p->w_gpu + kv_g + st_g + bg;
    /* ms_gpu_one's class order: the weight classes (w_gpu_one), KV, state, buffers */
    double one = p->w_gpu_one + kv_g / c->gpu_ways[MS_CLASS_KV] + st_g / c->gpu_ways[MS_CLASS_STATE]
                 + bg / c->gpu_ways[MS_CLASS_BUFFERS];
    double host = p->w_host + kv_h + st_h + buf_h, spill;
    int32_t fits = ms_fits_rule(c, gpu, one, host, p->w_host, buf_h, &spill);
    if (r) {
        r->gpu = gpu;
        r->gpu_one = one;
        r->host = host;
        r->spill = spill;
        r->kv = kv_g + kv_h;
        r->state = st_g + st_h;
        r->buf_host = buf_h;
        r->fits = fits;
    }
    return fits;
}

/* account() of ms_memory.c for candidate j at (ctx, b). Returns the fits bits. */
static int32_t account(const ms_sweep_mem_t *g, int32_t j, int64_t ctx, int64_t b, kvpart_t *k, mem_eval_t *r)
{
    const ms_sweep_place_t *p = &g->places[j];
    kv_part(g, p->layout, p->cfg, ctx, b, k);
    return finish(g, p, k->kv_g, k->kv_h, k->st_g, k->st_h, k->buf_g, k->buf_h, r);
}

/* The same from the per-sequence sums at batch 1 (k1, cached while the context stays): every term is
 * an exact byte count, so scaling by b gives the very numbers account() sums (tests hold them equal). */
static int32_t account_scaled(const ms_sweep_mem_t *g, int32_t j, int64_t ctx, int64_t b, kvpart_t *k1,
                              mem_eval_t *r)
{
    const ms_sweep_place_t *p = &g->places[j];
    double db = (double) b;
    kv_part(g, p->layout, p->cfg, ctx, 1, k1);
    return finish(g, p, k1->kv_g * db, k1->kv_h * db, k1->st_g * db, k1->st_h * db, k1->buf_g, k1->buf_h, r);
}

static int fits_at(const ms_sweep_mem_t *g, int32_t j, int64_t ctx, int64_t b, kvpart_t *k)
{
    return account(g, j, ctx, b, k, NULL) != 0;
}

static int fits_at1(const ms_sweep_mem_t *g, int32_t j, int64_t ctx, int64_t b, kvpart_t *k1)
{
    return account_scaled(g, j, ctx, b, k1, NULL) != 0;
}

/* ms_memory.c linear_context_candidate / max_context_search, for candidate j at batch b, up to cap. */
static int64_t max_context(const ms_sweep_mem_t *g, int32_t j, int64_t b, int64_t cap)
{
    const ms_mem_config_t *c = &g->cfg[g->places[j].cfg];
    int64_t lo = 1, hi = cap, cand = 0;
    int linear = ms_linear_in_context(c);
    kvpart_t k = {-1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    if (!fits_at(g, j, lo, b, &k)) return 0;
    if (fits_at(g, j, hi, b, &k)) return hi;
    for (int32_t q = 0; q < g->n_kinds && linear; q++)
        if (g->cap[q] != 0 || g->ratio[q] != 0) linear = 0;
    if (linear) {
        mem_eval_t s1, s2;
        account(g, j, 1, b, &k, &s1);
        account(g, j, 2, b, &k, &s2);
        cand = ms_linear_context(c, s1.gpu_one, s1.host - s1.spill, s2.gpu_one, s2.host - s2.spill, cap);
    }
    if (cand >= 1 && cand < hi && fits_at(g, j, cand, b, &k) && !fits_at(g, j, cand + 1, b, &k)) return cand;
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (fits_at(g, j, mid, b, &k)) lo = mid; else hi = mid;
    }
    return lo;
}

/* account()'s fits bits at batch b from the per-sequence sums at batch 1 (k1). */
static int32_t fits_scaled(const ms_sweep_mem_t *g, const ms_sweep_place_t *p, const kvpart_t *k1, int64_t b)
{
    double db = (double) b;
    return finish(g, p, k1->kv_g * db, k1->kv_h * db, k1->st_g * db, k1->st_h * db, k1->buf_g, k1->buf_h, NULL);
}

/* ms_memory.c max_batch_search for candidate j at context ctx: the boundary of a predicate monotone
 * in b, from the affine closed form, verified; the doubling search otherwise. */
static int64_t max_batch(const ms_sweep_mem_t *g, int32_t j, int64_t ctx)
{
    const ms_sweep_place_t *p = &g->places[j];
    const ms_mem_config_t *c = &g->cfg[p->cfg];
    const int64_t limit = (int64_t) 1 << 30;
    int64_t lo = 1, hi = 2;
    kvpart_t k = {-1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    double best = 1e300, sg, sh;
    kv_part(g, p->layout, p->cfg, ctx, 1, &k);
#define FITS(x) (fits_scaled(g, p, &k, (x)) != 0)
    if (!FITS(1)) return 0;
    /* bytes per sequence on the busiest GPU and on the host */
    sg = k.kv_g / c->gpu_ways[MS_CLASS_KV] + k.st_g / c->gpu_ways[MS_CLASS_STATE];
    sh = k.kv_h + k.st_h;
    if (sg > 0.0) {
        double room = c->gpu_capacity
                      - (p->w_gpu_one + (p->any_gpu ? k.buf_g / c->gpu_ways[MS_CLASS_BUFFERS] : 0.0));
        best = room / sg;
    }
    if (sh > 0.0) {
        double room = c->host_capacity - (p->w_host + k.buf_h), hb;
        if (c->storage_spill) room += p->w_host < c->storage_capacity ? p->w_host : c->storage_capacity;
        hb = room / sh;
        if (hb < best) best = hb;
    }
    if (best >= (double) limit) {
        if (FITS(limit)) return limit;
    } else if (best >= 1.0) {
        int64_t cand = (int64_t) best;
        for (int64_t d = 0; d <= 2; d++) {     /* the estimate, then its neighbours */
            for (int sgn = -1; sgn <= 1; sgn += 2) {
                int64_t x = cand + sgn * d;
                if (x >= 1 && x < limit && FITS(x) && !FITS(x + 1)) return x;
                if (d == 0) break;
            }
        }
    }
    while (hi < limit && FITS(hi)) { lo = hi; hi *= 2; }
    if (hi >= limit && FITS(limit)) return limit;
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (FITS(mid)) lo = mid; else hi = mid;
    }
    return lo;
#undef FITS
}

/* moesim._search.largest_true over candidates first + x, x in [lo, hi] (reverse: first + L - x);
 * -1 when the predicate fails at lo. Once the predicate holds at lo it is monotone (more on the GPU:
 * GPU bytes never fall, host bytes never rise), so its boundary is unique and is searched from the
 * previous configuration's answer *hint (bisection finds the same boundary). */
static int64_t largest_true(const ms_sweep_mem_t *g, int32_t first, int reverse, int64_t lo, int64_t hi,
                            int64_t ctx, int64_t b, kvpart_t *k, int64_t *hint)
{
#define PRED(x) fits_at1(g, (int32_t) (first + (reverse ? (g->n_layers - (x)) : (x))), ctx, b, k)
    int64_t h = *hint;
    if (!PRED(lo)) return -1;
    if (PRED(hi)) return hi;
    /* invariant: pred(lo) and not pred(hi) */
    if (h > lo && h < hi) {
        if (PRED(h)) {
            lo = h;
            if (h + 1 < hi && !PRED(h + 1)) hi = h + 1;
        } else {
            hi = h;
            if (h - 1 > lo && PRED(h - 1)) lo = h - 1;
        }
    }
    while (hi - lo > 1) {
        int64_t mid = (lo + hi) / 2;
        if (PRED(mid)) lo = mid; else hi = mid;
    }
    *hint = lo;
    return lo;
#undef PRED
}

/* The first of candidates first + from + step * i, i = 0 .. count - 1, that fits at (ctx, b); -1 when none
 * does (or first < 0: the group has no such run). */
static int32_t first_fitting(const ms_sweep_mem_t *g, int32_t first, int64_t from, int64_t step, int64_t count,
                             int64_t ctx, int64_t b, kvpart_t *k)
{
    if (first < 0) return -1;
    for (int64_t i = 0; i < count; i++) {
        int32_t j = (int32_t) (first + from + step * i);
        if (fits_at1(g, j, ctx, b, k)) return j;
    }
    return -1;
}

/* The automatic placement (engine.lower.placement) for the rules the C loop resolves per configuration. */
int32_t ms_sweep_choose(const ms_sweep_mem_t *g, int64_t ctx, int64_t b, int64_t fits_up_to, kvpart_t *k,
                        int64_t *hint)
{
    int32_t L = g->n_layers;
    /* past the largest context any candidate fits (when the caller knows it) nothing fits: the search
     * below would end at the same fallback, after probing every candidate */
    if (fits_up_to >= 0 && ctx > fits_up_to)
        return g->i_experts_cpu >= 0 ? g->i_experts_cpu : g->i_all_gpu;
    if (g->rule == MS_SWEEP_AUTO_KT) {
        int64_t n = largest_true(g, g->i_gpu_experts, 0, 0, g->n_experts, ctx, b, k, hint);
        int32_t j;
        if (n > 0) return g->i_gpu_experts + (int32_t) n;
        if (n == 0 || fits_at1(g, g->i_experts_cpu, ctx, b, k)) return g->i_experts_cpu;
        /* not even gpu-experts = 0 fits (a small host): the most experts on the GPU that does */
        j = first_fitting(g, g->i_gpu_experts, g->n_experts, -1, g->n_experts, ctx, b, k);
        return j >= 0 ? j : g->i_experts_cpu;
    }
    if (fits_at1(g, g->i_all_gpu, ctx, b, k)) return g->i_all_gpu;
    if (g->i_n_cpu_moe >= 0) {
        /* n-cpu-moe = L - n: largest n (layers whose experts stay on the GPU) that fits */
        int64_t n = largest_true(g, g->i_n_cpu_moe, 1, 0, L, ctx, b, k, hint);
        if (n >= 0) return n < L ? g->i_n_cpu_moe + (int32_t) (L - n) : g->i_all_gpu;
    }
    {
        int64_t n = largest_true(g, g->i_layers_gpu, 0, 0, L, ctx, b, k, hint);
        if (n > 0) return g->i_layers_gpu + (int32_t) n;
    }
    if (fits_at1(g, g->i_cpu_only, ctx, b, k)) return g->i_cpu_only;
    {
        /* the searches above start from the layout with the most in host RAM; when even that one does not
         * fit (a small host), a layout in between may: the first that fits, fewest experts in RAM first,
         * then most layers on the GPU down to none (-ngl 0 still keeps its compute buffers on the GPU, so
         * it can fit where cpu-only does not), so a context fits whenever any candidate fits there */
        int32_t j = first_fitting(g, g->i_n_cpu_moe, 1, 1, L - 1, ctx, b, k);
        if (j < 0) j = first_fitting(g, g->i_layers_gpu, L, -1, L + 1, ctx, b, k);
        if (j < 0 && g->i_experts_cpu >= 0 && fits_at1(g, g->i_experts_cpu, ctx, b, k)) j = g->i_experts_cpu;
        if (j >= 0) return j;
    }
    return g->i_experts_cpu >= 0 ? g->i_experts_cpu : g->i_all_gpu;
}

/* The largest context that fits at batch b under the best placement for that context. The rule's choice
 * is complete (ms_sweep_choose returns a candidate that fits whenever one does) and each candidate's
 * fits is monotone in context, so that is the largest of the candidates' own max contexts; a candidate
 * that does not fit one past the best so far cannot raise it and costs one account(). */
static int64_t fit_limit(const ms_sweep_mem_t *g, int64_t b, int64_t cap)
{
    int64_t best = 0;
    kvpart_t k = {-1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    if (g->rule == MS_SWEEP_FIXED) return max_context(g, 0, b, cap);
    for (int32_t j = 0; j < g->n_places && best < cap; j++) {
        int64_t v;
        if (!fits_at(g, j, best + 1, b, &k)) continue;
        v = max_context(g, j, b, cap);
        if (v > best) best = v;
    }
    return best;
}

int64_t ms_sweep_auto_max_context(const ms_sweep_mem_t *g, int64_t b)
{
    return fit_limit(g, b, g->max_context);
}

/* Sweeps may go past the trained maximum (filter.allow_beyond_max_context): the search bound there. */
#define FIT_CAP ((int64_t) 1 << 28)

/* The largest context any candidate fits at batch index bi when that is a real boundary (every larger
 * context fits nowhere), else -1: what lets ms_sweep_choose skip the search where nothing fits. */
static int64_t fitting_boundary(const ms_sweep_mem_t *g, int64_t ctx, int64_t b, int32_t bi, mem_ws_t *ws)
{
    if (ws->mc_val[bi] < g->max_context) return ws->mc_val[bi];
    if (ctx <= g->max_context) return -1;          /* some candidate fits here */
    if (ws->fit_up[bi] < 0) ws->fit_up[bi] = fit_limit(g, b, FIT_CAP);
    return ws->fit_up[bi] < FIT_CAP ? ws->fit_up[bi] : -1;
}

/* Candidates first .. first + span (a run of the placement table) all exist. */
static int in_places(const ms_sweep_mem_t *g, int32_t first, int64_t span)
{
    return first >= 0 && span >= 0 && (int64_t) first + span < (int64_t) g->n_places;
}

int ms_sweep_check_mem(const ms_sweep_mem_t *g)
{
    if (g == NULL || g->places == NULL || g->per_token == NULL || g->gpu_count == NULL) return MS_ERR_NULL_ARGUMENT;
    if (g->n_kinds > 0 && (g->ratio_bytes == NULL || g->state == NULL || g->cap == NULL || g->ratio == NULL
                           || g->count == NULL)) return MS_ERR_NULL_ARGUMENT;
    if (g->n_places < 1 || g->n_kinds < 0 || g->n_layouts < 1 || g->max_context < 1 || g->n_layers < 1)
        return MS_ERR_BAD_SIZE;
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < MS_N_CLASSES; k++)
            if (!(g->cfg[i].gpu_ways[k] > 0.0) || !isfinite(g->cfg[i].gpu_ways[k])) return MS_ERR_BAD_SIZE;
    for (int32_t j = 0; j < g->n_places; j++) {
        const ms_sweep_place_t *p = &g->places[j];
        if (p->layout < 0 || p->layout >= g->n_layouts || p->cfg < 0 || p->cfg > 1) return MS_ERR_BAD_SWEEP;
    }
    /* every candidate the rule may pick or probe is a row of places */
    if (g->rule == MS_SWEEP_AUTO_LLAMA) {
        if (!in_places(g, g->i_all_gpu, 0) || !in_places(g, g->i_layers_gpu, g->n_layers)
            || !in_places(g, g->i_cpu_only, 0)
            || (g->i_n_cpu_moe >= 0 && !in_places(g, g->i_n_cpu_moe, g->n_layers))
            || (g->i_experts_cpu >= 0 && !in_places(g, g->i_experts_cpu, 0))) return MS_ERR_BAD_SWEEP;
    } else if (g->rule == MS_SWEEP_AUTO_KT) {
        if (!in_places(g, g->i_gpu_experts, g->n_experts) || !in_places(g, g->i_experts_cpu, 0))
            return MS_ERR_BAD_SWEEP;
    } else if (g->rule != MS_SWEEP_FIXED) {
        return MS_ERR_BAD_SWEEP;
    }
    return 0;
}

static void memory_one(const ms_sweep_mem_t *g, int64_t ctx, int64_t b, int32_t bi, int32_t n_b, mem_ws_t *ws,
                       ms_sweep_mem_out_t *out, int64_t i)
{
    kvpart_t *k = &ws->k1;
    int64_t cp = padded(ctx, g->cfg[0].kv_granularity), E = g->n_experts, ps = E > 1 ? E : 1, v;
    int32_t j = 0;
    const ms_sweep_place_t *p;
    mem_eval_t r;
    /* one value per batch: under the best placement for each context, whichever is chosen here (the
     * fixed placement's for a fixed rule) */
    if (ws->mc_val[bi] < 0) ws->mc_val[bi] = ms_sweep_auto_max_context(g, b);
    if (g->rule != MS_SWEEP_FIXED) {
        /* a pure function of (padded context, batch) */
        if (ws->auto_cp[bi] == cp) {
            j = (int32_t) ws->auto_j[bi];
        } else {
            j = ms_sweep_choose(g, ctx, b, fitting_boundary(g, ctx, b, bi, ws), k, &ws->hint[bi]);
            ws->auto_cp[bi] = cp;
            ws->auto_j[bi] = j;
        }
    }
    p = &g->places[j];
    cp = padded(ctx, g->cfg[p->cfg].kv_granularity);
    account_scaled(g, j, ctx, b, k, &r);
    out->max_context[i] = ws->mc_val[bi];
    if (ws->last_place == j && ws->last_cp == cp) {
        v = ws->last_val;
    } else {
        /* memory depends on context only through its padded value */
        if (!memo_get(&ws->max_batch, j, cp, &v)) {
            v = max_batch(g, j, ctx);
            memo_put(&ws->max_batch, j, cp, v);
        }
        ws->last_place = j;
        ws->last_cp = cp;
        ws->last_val = v;
    }
    out->max_batch[i] = v;
    if (r.spill > 0.0 && E > 0) {
        /* decode.lower_model: the host page cache keeps the share of host experts that is not spilled */
        double frac = 0.0;
        if (p->routed_host > 0.0) {
            frac = 1.0 - r.spill / p->routed_host;
            if (frac < 0.0) frac = 0.0;
        }
        ps = (int64_t) floor((double) E * frac);
    }
    out->context[i] = ctx;
    out->batch[i] = b;
    out->placement[i] = p->label;
    out->fits[i] = g->fits_label[r.fits & 7];
    out->key[i] = (((int64_t) j * (E + 2) + ps) * n_b) + bi;
    out->weights[i] = p->w_gpu + p->w_host;
    out->kv[i] = r.kv;
    out->state[i] = r.state;
    out->gpu[i] = r.gpu;
    out->host[i] = r.host - r.spill;
    out->storage[i] = r.spill;
}

static void ws_init(mem_ws_t *ws, char *base, int32_t n_b)
{
    int64_t nb = n_b > 0 ? n_b : 1;
    ws->mc_val = (int64_t *) (base + MS_ALIGN64((int64_t) sizeof(mem_ws_t)));
    ws->auto_cp = ws->mc_val + nb;
    ws->auto_j = ws->auto_cp + nb;
    ws->hint = ws->auto_j + nb;
    ws->fit_up = ws->hint + nb;
    for (int s = 0; s < MEMO_SLOTS; s++) ws->max_batch.place[s] = -1;
    for (int32_t i = 0; i < n_b; i++) {
        ws->mc_val[i] = -1;
        ws->auto_cp[i] = -1;
        ws->hint[i] = -1;
        ws->fit_up[i] = -1;
    }
    ws->last_place = -1;
    ws->k1.layout = -1;
}

int ms_sweep_memory(const ms_sweep_mem_t *g, const ms_sweep_axes_t *axes, int64_t j0, int64_t n, int n_threads,
                    void *workspace, int64_t ws_bytes, ms_sweep_mem_out_t *out, int64_t *err_index)
{
    int rc = ms_sweep_check_mem(g);
    int64_t per = 0, bad = -1;
    if (err_index) *err_index = -1;
    if (rc) return rc;
    if (axes == NULL || axes->contexts == NULL || axes->batches == NULL || out == NULL || workspace == NULL)
        return MS_ERR_NULL_ARGUMENT;
    if (axes->n_c < 1 || axes->n_b < 1 || (axes->zipped && axes->n_c != axes->n_b) || j0 < 0 || n < 0
        || j0 + n > (axes->zipped ? axes->n_c : axes->n_c * axes->n_b)) return MS_ERR_BAD_SIZE;
    for (int64_t i = 0; i < axes->n_c; i++)
        if (axes->contexts[i] < 1) { bad = i; rc = MS_ERR_BAD_CONTEXT; break; }
    for (int32_t i = 0; i < axes->n_b && !rc; i++)
        if (axes->batches[i] < 1 || axes->batches[i] > ((int64_t) 1 << 30)) { bad = i; rc = MS_ERR_BAD_SIZE; }
    if (rc) {
        if (err_index) *err_index = bad;
        return rc;
    }
    n_threads = ms_useful_threads(n, n_threads, 8192);   /* ~100 ns a row */
#ifndef MOESIM_HAVE_OPENMP
    n_threads = 1;
#endif
    per = ms_sweep_memory_workspace_size(axes->n_b);
    if (ws_bytes < (int64_t) n_threads * per) return MS_ERR_BAD_WORKSPACE;
#ifdef MOESIM_HAVE_OPENMP
    #pragma omp parallel num_threads(n_threads)
#endif
    {
        int tid = 0;
#ifdef MOESIM_HAVE_OPENMP
        tid = omp_get_thread_num();
#endif
        /* the memos live in the caller's workspace (too large for the stack) */
        mem_ws_t *w = (mem_ws_t *) ((char *) workspace + (int64_t) tid * per);
        ws_init(w, (char *) w, axes->n_b);
        int nt = 1;
        int64_t i0, i1, j, ci;
        int32_t bi;
#ifdef MOESIM_HAVE_OPENMP
        nt = omp_get_num_threads();
#endif
        /* a contiguous block per thread; batch and context indices advance without divisions */
        i0 = n * tid / nt;
        i1 = n * (tid + 1) / nt;
        j = j0 + i0;
        ci = axes->zipped ? j : j / axes->n_b;
        bi = (int32_t) (axes->zipped ? j : j % axes->n_b);
        for (int64_t i = i0; i < i1; i++) {
            memory_one(g, axes->contexts[ci], axes->batches[bi], bi, axes->n_b, w, out, i);
            if (axes->zipped) {
                ci++;
                bi++;
            } else if (++bi == axes->n_b) {
                bi = 0;
                ci++;
            }
        }
    }
    return 0;
}
