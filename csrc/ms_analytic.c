/*
 * The analytic decode path: the cost model of ms_decode.c on expected counts (distinct experts per
 * step from inclusion probabilities, static-cache hits from the pinned popularity mass, LRU hits in
 * whole steps of recency, Che-style, on a sticky two-state chain per expert; under token memory on the
 * routing's window tables). Orders of magnitude faster than Monte Carlo; the two agree closely (tests
 * hold them together).
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "ms_internal.h"

/* ------------------------------------------------------------------------- analytic */

/* Sums of the analytic path over MoE layers. */
typedef struct {
    double hits, loads, phits, ploads, distinct, reuse;
} an_tally_t;

/* Step inclusion probabilities p_e = 1 - (1 - qbar_e)^toks of routing layer l into p; returns their sum D
 * (the expected distinct experts per step; per-routing tables precomputed once). */
static double step_inclusion(const ms_routing_t *r, int32_t l, double toks, double *p)
{
    int32_t E = r->n_experts;
    const double *qbar = r->qbar + (int64_t) l * E, *lq = r->lqbar + (int64_t) l * E;
    double D = 0.0;
    if (toks == 1.0) {
        for (int32_t e = 0; e < E; e++) {
            p[e] = qbar[e];
            D += p[e];
        }
    } else {
        for (int32_t e = 0; e < E; e++) {
            p[e] = 1.0 - exp(toks * lq[e]);
            D += p[e];
        }
    }
    return D;
}

/* Scratch of layer_counts: p, pc, pf, che, mu, sd [E], lq and ls [S][E], usel [E]. */
typedef struct {
    double *p, *pc, *pf, *che, *mu, *sd, *lq, *ls;
    int32_t *usel;
} an_scratch_t;

/* The LRU hit rate of routing layer l's C slots: Che's approximation on the window tables (D: the step's
 * distinct experts from ms_window_inclusion; the windows hold the stickiness and memory), else the sticky chain
 * per scenario combination (ms_lru_hit_rate). What ms_che_table tabulates and a FETCH layer without a table
 * solves. */
static double lru_layer(const ms_routing_t *r, int32_t l, int32_t batch, int32_t tps, double C, double D,
                        const an_scratch_t *s)
{
    if (r->win_lq) {
        /* hits / D rounds a hair above 1 where the slots hold nearly every expert (C = E - 1): a rate stays <= 1,
         * as ms_page_table's readers check */
        double h = D > 0.0 ? ms_window_hits(r, l, (double) batch, (double) tps, C, D, s->pc, s->pf) / D : 0.0;
        return h > 1.0 ? 1.0 : h;
    }
    return ms_lru_hit_rate(r, batch, tps, l, C, s->pc, s->pf, s->che, s->lq, s->ls);
}

/* LFU's hit rate of routing layer l's C slots. ms_lfu_hit_rate's count model holds while some resident is not needed:
 * a miss then evicts the least counted of those. A step that needs every resident (its share: forced) may evict only
 * what it has already accessed, so the state it leaves is set by its access order (ids); where its D accesses sweep
 * the whole expert set it is its last accesses, LRU's state. That share, forced x D / E, takes LRU's rate: an
 * interpolation between the two end states (Mixtral, 8 experts, 4 slots, batch 16: Monte Carlo's LFU 0.380 and LRU
 * 0.379, the count model alone 0.426, this 0.381; docs/cost-model.md "Caches"). One slot has no choice of victim:
 * every policy's cache is LRU's. */
static double lfu_layer(const ms_routing_t *r, int32_t l, int32_t batch, int32_t tps, double C, double D, double steps,
                        double warmup, const an_scratch_t *s)
{
    double forced = 0.0, h;
    if (C <= 1.0) return lru_layer(r, l, batch, tps, C, D, s);
    h = ms_lfu_hit_rate(r, batch, tps, l, C, steps, warmup, s->pc, s->pf, s->mu, s->sd, s->p, s->che, s->lq, s->ls,
                        &forced);
    forced *= D / r->n_experts;
    return forced > 0.0 ? (1.0 - forced) * h + forced * lru_layer(r, l, batch, tps, C, D, s) : h;
}

/* The expected counts of routing layer l's step (batch x tps tokens) at `slots` GPU slots into row[MS_CHE_*]:
 * D, the selection and inclusion mass of the `slots` hottest experts (pinned) and of the rest (with
 * `pinned`; summed on both sides so "all pinned" is exact), the hit rate under `policy` (with `hit`: LRU's
 * rate with the stickiness (ms_lru_hit_rate), else the pinned share: static, and LFU converges to the same set)
 * and the reuse statistic; the inclusion probabilities are left in s->p. What ms_che_table tabulates and
 * analytic_layer computes for itself without a table. */
static void layer_counts(const ms_routing_t *r, int32_t l, int32_t batch, int32_t tps, int32_t slots, int32_t policy,
                         double steps, double warmup, int pinned, int hit, const an_scratch_t *s, double *row)
{
    int32_t E = r->n_experts;
    double D, pinned_q = 0.0, pinned_p = 0.0, free_q = 0.0, free_p = 0.0, *p = s->p;
    const double *qbar = r->qbar + (int64_t) l * E;
    D = r->win_lq ? ms_window_inclusion(r, l, (double) batch, (double) tps, p)
                  : step_inclusion(r, l, (double) batch * tps, p);
    if (pinned) {
        for (int32_t e = 0; e < E; e++) s->usel[e] = 0;
        for (int32_t j = 0; j < slots && j < E; j++) s->usel[r->hot[(int64_t) l * E + j]] = 1;
        for (int32_t e = 0; e < E; e++) {
            if (s->usel[e]) {
                pinned_q += qbar[e];
                pinned_p += p[e];
            } else {
                free_q += qbar[e];
                free_p += p[e];
            }
        }
    }
    row[MS_CHE_D] = D;
    row[MS_CHE_PINNED_Q] = pinned_q;
    row[MS_CHE_PINNED_P] = pinned_p;
    row[MS_CHE_FREE_Q] = free_q;
    row[MS_CHE_FREE_P] = free_p;
    row[MS_CHE_HIT] = !hit ? 0.0
                    : policy == MS_POLICY_LRU ? lru_layer(r, l, batch, tps, (double) slots, D, s)
                    : policy == MS_POLICY_LFU ? lfu_layer(r, l, batch, tps, (double) slots, D, steps, warmup, s)
                    : (D > 0.0 ? pinned_p / D : 0.0);
    row[MS_CHE_REUSE] = r->win_lq ? ms_window_reuse(r, l) : ms_chain_reuse(r, l);
}

/* Expected work of a FETCH layer i (routing layer l) from its counts `row`; returns the hit rate. */
static double fetch_layer(const ms_routing_t *r, const ms_decode_config_t *c, int32_t i, int32_t l, const double *row,
                          layer_work_t *w)
{
    double D = row[MS_CHE_D], h = row[MS_CHE_HIT];
    double toks = (double) c->batch * c->tokens_per_step;
    if (c->policy == MS_POLICY_LRU || c->policy == MS_POLICY_LFU) {
        /* misses at the policy's own hit rate: LRU's holds the stickiness (ms_lru_hit_rate) or the windows' memory,
         * LFU's its counts (lfu_layer), which differ from the pinned set's share (up to 40 % in tok/s) */
        w->n_fetch = D * (1.0 - h);
    } else {
        w->n_fetch = row[MS_CHE_FREE_P];    /* static: what the pinned set leaves */
    }
    w->n_res = D;
    w->pairs_gpu = toks * r->top_k;
    if (r->recall[l] > 0.0 && i > 0) {
        w->n_pref = r->recall[l] * w->n_fetch;
        w->n_waste = w->n_fetch - w->n_pref;
    }
    return h;
}

/* Expected work of model layer i (routing layer l, expert mode `mode`) into ws->work[i]: from the
 * configuration's table row when it was tabulated for this layer's slots (ms_che_table), else counted here;
 * a paged layer's page-cache hit rate from the configuration's page table when it was tabulated for this
 * layer's page slots (ms_page_table), else solved here. */
static void analytic_layer(const ms_decode_model_t *m, const ms_routing_t *r, const ms_decode_config_t *c, ws_t *ws,
                           int32_t i, an_tally_t *n)
{
    int32_t E = r->n_experts, K = r->top_k;
    int32_t l = m->moe_index[i], mode = m->expert_mode[i];
    int paged = m->page_slots[i] < E && (mode == MS_EXP_CPU || mode == MS_EXP_SPLIT || mode == MS_EXP_FETCH);
    int page_tabled = paged && c->page_hit && c->page_hit_slots == m->page_slots[i];
    layer_work_t *w = &ws->work[i];
    double toks = (double) c->batch * c->tokens_per_step, own[MS_CHE_FIELDS], D;
    const double *row = c->che && c->che_slots == m->slots[i] ? c->che + (int64_t) l * MS_CHE_FIELDS : NULL;
    an_scratch_t sc;
    sc.p = ws->times;                /* >= E doubles (ws_layout) */
    sc.pc = ws->lt + m->n_layers;    /* E doubles after the per-layer times */
    sc.che = ws->che;
    sc.pf = ws->che + E;             /* ws->che holds 4 E doubles */
    sc.mu = ws->che + 2 * E;
    sc.sd = ws->che + 3 * E;
    sc.lq = ws->lq;
    sc.ls = ws->lq + (int64_t) r->n_scenarios * E;
    sc.usel = ws->usel;
    if (row == NULL) {
        layer_counts(r, l, c->batch, c->tokens_per_step, m->slots[i], c->policy, (double) c->steps, (double) c->warmup,
                     mode == MS_EXP_SPLIT || mode == MS_EXP_FETCH, mode == MS_EXP_FETCH, &sc, own);
        row = own;
    }
    D = row[MS_CHE_D];
    n->distinct += D;
    n->reuse += row[MS_CHE_REUSE];
    if (mode == MS_EXP_GPU) {
        w->n_res = D;
        w->pairs_gpu = toks * K;
    } else if (mode == MS_EXP_CPU) {
        w->n_cpu = D;
        w->pairs_cpu = toks * K;
    } else if (mode == MS_EXP_SPLIT) {
        w->n_res = row[MS_CHE_PINNED_P];
        w->n_cpu = row[MS_CHE_FREE_P];
        w->pairs_gpu = toks * row[MS_CHE_PINNED_Q];
        w->pairs_cpu = toks * row[MS_CHE_FREE_Q];
        n->hits += row[MS_CHE_PINNED_P];
        n->loads += D;
    } else {   /* FETCH */
        double h = fetch_layer(r, c, i, l, row, w);
        n->hits += D * h;
        n->loads += D;
    }
    if (paged) {
        double host = mode == MS_EXP_FETCH ? w->n_fetch : w->n_cpu;
        /* the page cache is an LRU over the step's union, as the GPU cache (lru_layer) */
        double ph = page_tabled ? c->page_hit[l]
                  : lru_layer(r, l, c->batch, c->tokens_per_step, (double) m->page_slots[i], D, &sc);
        w->n_disk = host * (1.0 - ph);
        n->phits += host * ph;
        n->ploads += host;
    }
}

/* 0, or MS_ERR_BAD_ROUTING when a configuration's table holds a count that is negative or not finite, or a
 * hit rate above 1. */
static int check_table(const ms_routing_t *r, const double *t)
{
    int bad = 0;
    for (int32_t l = 0; l < r->n_layers; l++) {
        const double *row = t + (int64_t) l * MS_CHE_FIELDS;
        for (int f = 0; f < MS_CHE_FIELDS; f++) bad |= !(row[f] >= 0.0 && row[f] <= DBL_MAX);   /* NaN fails too */
        bad |= row[MS_CHE_HIT] > 1.0;
    }
    return bad ? MS_ERR_BAD_ROUTING : 0;
}

/* 0, or MS_ERR_BAD_ROUTING when a configuration's page table holds a hit rate outside [0, 1] (or NaN). */
static int check_page_table(const ms_routing_t *r, const double *t)
{
    int bad = 0;
    for (int32_t l = 0; l < r->n_layers; l++) bad |= !(t[l] >= 0.0 && t[l] <= 1.0);
    return bad ? MS_ERR_BAD_ROUTING : 0;
}

int ms_analytic(const ms_decode_model_t *m, const ms_machine_t *hw, const ms_routing_t *r,
                    const ms_decode_config_t *c, ws_t *ws, ms_decode_result_t *out)
{
    an_tally_t n = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    int32_t n_moe = 0;
    if (c->policy == MS_POLICY_BELADY) return MS_ERR_BAD_POLICY;
    if (c->che && check_table(r, c->che)) return MS_ERR_BAD_ROUTING;
    if (c->page_hit && check_page_table(r, c->page_hit)) return MS_ERR_BAD_ROUTING;
    for (int32_t i = 0; i < m->n_layers; i++) {
        memset(&ws->work[i], 0, sizeof(ws->work[i]));
        if (m->moe_index[i] < 0 || m->expert_mode[i] == MS_EXP_NONE) continue;
        n_moe++;
        analytic_layer(m, r, c, ws, i, &n);
    }
    out->step_mean = ms_step_time(m, hw, c, ws->work, ws->lt, out);
    out->step_p50 = out->step_p99 = out->step_mean;
    out->distinct = n_moe ? n.distinct / n_moe : 0.0;
    out->reuse = n_moe ? n.reuse / n_moe : 0.0;
    out->hit_rate = n.loads > 0.0 ? n.hits / n.loads : -1.0;
    out->page_hit_rate = n.ploads > 0.0 ? n.phits / n.ploads : -1.0;
    return 0;
}

/* ------------------------------------------------------------------------- the LRU hit-rate table */

int64_t ms_che_table_workspace_size(const ms_routing_t *r)
{
    int64_t E, S;
    if (r == NULL || r->n_experts <= 0) return 0;
    E = r->n_experts;
    S = r->n_scenarios > 0 ? r->n_scenarios : 1;
    return (6 * E + 2 * S * E) * (int64_t) sizeof(double) + E * (int64_t) sizeof(int32_t);
}

/* The checks ms_decode makes of an analytic routing, for a table that runs without a configuration. */
static int check_che(const ms_routing_t *r, int32_t batch, int32_t tps, int32_t slots, int32_t policy)
{
    if (batch < 1 || tps < 1 || slots < 0) return MS_ERR_BAD_SIZE;
    if (policy < 0 || policy >= MS_N_POLICIES || policy == MS_POLICY_BELADY) return MS_ERR_BAD_POLICY;
    if (r->n_layers < 1 || r->n_layers > MS_MAX_MOE_LAYERS) return MS_ERR_BAD_SIZE;
    if (r->n_experts <= 0 || r->top_k <= 0 || r->top_k > r->n_experts || r->top_k > MS_MAX_TOP_K)
        return MS_ERR_BAD_ROUTING;
    if (r->n_scenarios <= 0 || r->q == NULL || r->qbar == NULL || r->lqbar == NULL
        || r->hot == NULL || r->stickiness == NULL || ms_windows_bad(r)) return MS_ERR_BAD_ROUTING;
    for (int64_t k = 0; k < (int64_t) r->n_layers * r->n_experts; k++)
        if (r->hot[k] < 0 || r->hot[k] >= r->n_experts) return MS_ERR_BAD_ROUTING;
    return 0;
}

/* The scratch of layer_counts carved from a table call's workspace (ms_che_table_workspace_size). */
static void scratch_in(const ms_routing_t *r, void *workspace, an_scratch_t *sc)
{
    sc->p = (double *) workspace;
    sc->pc = sc->p + r->n_experts;
    sc->che = sc->pc + r->n_experts;
    sc->pf = sc->che + r->n_experts;
    sc->mu = sc->pf + r->n_experts;
    sc->sd = sc->mu + r->n_experts;
    sc->lq = sc->sd + r->n_experts;
    sc->ls = sc->lq + (int64_t) r->n_scenarios * r->n_experts;
    sc->usel = (int32_t *) (sc->ls + (int64_t) r->n_scenarios * r->n_experts);
}

int ms_che_table(const ms_routing_t *r, int32_t batch, int32_t tokens_per_step, int32_t slots, int32_t policy,
                 int64_t steps, int64_t warmup, void *workspace, int64_t workspace_bytes, double *out)
{
    an_scratch_t sc;
    int rc;
    if (r == NULL || out == NULL || workspace == NULL) return MS_ERR_NULL_ARGUMENT;
    rc = check_che(r, batch, tokens_per_step, slots, policy);
    if (rc) return rc;
    if (steps < 1 || warmup < 0 || warmup >= steps) return MS_ERR_BAD_SIZE;
    if (workspace_bytes < ms_che_table_workspace_size(r)) return MS_ERR_BAD_WORKSPACE;
    scratch_in(r, workspace, &sc);
    for (int32_t l = 0; l < r->n_layers; l++)
        layer_counts(r, l, batch, tokens_per_step, slots, policy, (double) steps, (double) warmup, 1, 1, &sc,
                     out + (int64_t) l * MS_CHE_FIELDS);
    return 0;
}

/* ------------------------------------------------------------------------- the page-cache hit-rate table */

int ms_page_table(const ms_routing_t *r, int32_t batch, int32_t tokens_per_step, int32_t page_slots, void *workspace,
                  int64_t workspace_bytes, double *out)
{
    an_scratch_t sc;
    int rc;
    if (r == NULL || out == NULL || workspace == NULL) return MS_ERR_NULL_ARGUMENT;
    rc = check_che(r, batch, tokens_per_step, page_slots, MS_POLICY_LRU);
    if (rc) return rc;
    if (workspace_bytes < ms_che_table_workspace_size(r)) return MS_ERR_BAD_WORKSPACE;
    scratch_in(r, workspace, &sc);
    for (int32_t l = 0; l < r->n_layers; l++) {
        /* the step's D as layer_counts has it (the windows read it) */
        double D = r->win_lq ? ms_window_inclusion(r, l, (double) batch, (double) tokens_per_step, sc.p)
                             : step_inclusion(r, l, (double) batch * tokens_per_step, sc.p);
        out[l] = D > 0.0 ? lru_layer(r, l, batch, tokens_per_step, (double) page_slots, D, &sc) : 0.0;
    }
    return 0;
}
