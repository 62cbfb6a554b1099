/*
 * The analytic decode path: the cost model of ms_decode.c on expected counts (distinct experts per
 * step from inclusion probabilities, static-cache hits from the pinned popularity mass, LRU hits by
 * Che's approximation). Orders of magnitude faster than Monte Carlo; under independent routing the
 * two agree closely (tests hold them together).
 */
#include <math.h>
#include <string.h>

#include "ms_internal.h"

/* ------------------------------------------------------------------------- analytic */

/* Che's approximation at step level: an expert the step needs is resident iff it was used within
 * the last tau steps, where tau makes the expected number of distinct experts used in tau steps
 * equal the capacity: sum_e (1 - (1 - p_e)^tau) = C (the cache never evicts an expert the current
 * step still needs, so a step's hits are exactly its experts already resident when it starts).
 * tau >= 1 when a step's D = sum_e p_e experts fit; Newton's method from tau = 1 (the left side is
 * concave and increasing, so the iterates rise monotonically to the root). When D > C the cache
 * holds C of the previous step's D experts, an id-ordered and so popularity-blind subset:
 * hits = (C / D) sum_e p_e^2. Returns the expected hits per step. */
static double che_hits(const double *p, int32_t E, double capacity, double *a)
{
    double tau = 1.0, hits = 0.0, D = 0.0;
    int32_t support = 0;
    for (int32_t e = 0; e < E; e++) {
        support += p[e] > 0.0;
        D += p[e];
    }
    if ((double) support <= capacity) return D;
    if (capacity <= 0.0) return 0.0;
    if (D >= capacity) {
        for (int32_t e = 0; e < E; e++) hits += p[e] * p[e];
        return hits * capacity / D;
    }
    for (int32_t e = 0; e < E; e++) a[e] = -log1p(-fmin(p[e], 1.0 - 1e-15));
    /* start at the root for equal p (exact when popularity is flat); Newton's first step from
     * the right of a concave root lands left of it, then the iterates rise monotonically */
    tau = fmax(1.0, log1p(-capacity / support) / log1p(-D / support));
    for (int it = 0; it < 200; it++) {
        double f = -capacity, df = 0.0, step;
        for (int32_t e = 0; e < E; e++) {
            double x = exp(-a[e] * tau);
            f += 1.0 - x;
            df += a[e] * x;
        }
        step = -f / df;
        tau = fmax(1.0, tau + step);
        if (!(fabs(step) > 1e-14 * tau)) break;
    }
    for (int32_t e = 0; e < E; e++) hits += p[e] * (1.0 - exp(-a[e] * tau));
    return hits;
}

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

/* Expected LRU hit rate of a FETCH layer's `C` GPU slots (Che's approximation per scenario combination):
 * superposed request streams, combination j gives sequence b scenario (j + b) mod S. */
static double lru_hit_rate(const ms_decode_model_t *m, const ms_routing_t *r, const ms_decode_config_t *c, ws_t *ws,
                           int32_t l, double C)
{
    int32_t E = r->n_experts, S = r->n_scenarios;
    double hsum = 0.0, dsum = 0.0;
    double *pc = ws->lt + m->n_layers;  /* E doubles after the per-layer times (ws_layout) */
    for (int32_t k = 0; k < S; k++)
        for (int32_t e = 0; e < E; e++)
            ws->lq[(int64_t) k * E + e] = log1p(-fmin(r->q[((int64_t) k * r->n_layers + l) * E + e], 1.0 - 1e-16));
    for (int32_t j = 0; j < S; j++) {
        double dj = 0.0;
        for (int32_t e = 0; e < E; e++) {
            double lg = 0.0;
            for (int32_t b = 0; b < c->batch && b < S; b++) {
                int64_t reps = c->batch / S + (b < c->batch % S ? 1 : 0);
                lg += (double) reps * ws->lq[(int64_t) ((j + b) % S) * E + e];
            }
            pc[e] = 1.0 - exp(c->tokens_per_step * lg);
            dj += pc[e];
        }
        hsum += che_hits(pc, E, C, ws->che);
        dsum += dj;
    }
    return dsum > 0.0 ? hsum / dsum : 0.0;
}

/* Expected work of a FETCH layer i (routing layer l) from its inclusion probabilities: D experts a step,
 * pinned_p of them among the hottest `slots`, free_p outside; returns the hit rate. */
static double fetch_layer(const ms_decode_model_t *m, const ms_routing_t *r, const ms_decode_config_t *c, ws_t *ws,
                          int32_t i, int32_t l, double D, double pinned_p, double free_p, layer_work_t *w)
{
    double C = (double) m->slots[i], h, toks = (double) c->batch * c->tokens_per_step;
    if (c->policy == MS_POLICY_LRU) {
        double sigma;
        h = lru_hit_rate(m, r, c, ws, l, C);
        /* a sticky expert was used by the previous token: resident while C covers a step's set */
        sigma = r->stickiness[l] * fmin(1.0, C / fmax(D, 1e-300));
        h = sigma + (1.0 - sigma) * h;
        w->n_fetch = D * (1.0 - h);
    } else {
        h = D > 0.0 ? pinned_p / D : 0.0;   /* static; LFU converges to the same set */
        w->n_fetch = free_p;
    }
    w->n_res = D;
    w->pairs_gpu = toks * r->top_k;
    if (r->recall[l] > 0.0 && i > 0) {
        w->n_pref = r->recall[l] * w->n_fetch;
        w->n_waste = w->n_fetch - w->n_pref;
    }
    return h;
}

/* Expected work of model layer i (routing layer l, expert mode `mode`) into ws->work[i]. */
static void analytic_layer(const ms_decode_model_t *m, const ms_routing_t *r, const ms_decode_config_t *c, ws_t *ws,
                           int32_t i, an_tally_t *n)
{
    int32_t E = r->n_experts, S = r->n_scenarios, K = r->top_k;
    int32_t l = m->moe_index[i], mode = m->expert_mode[i];
    layer_work_t *w = &ws->work[i];
    double toks = (double) c->batch * c->tokens_per_step;
    double D, pinned_q = 0.0, pinned_p = 0.0, free_q = 0.0, free_p = 0.0;
    double *p = ws->times;   /* >= E doubles (ws_layout) */
    const double *qbar = r->qbar + (int64_t) l * E;
    D = step_inclusion(r, l, toks, p);
    /* pinned = the `slots` most popular experts; sum both sides so "all pinned" is exact
     * (only SPLIT and FETCH layers use them) */
    if (mode == MS_EXP_SPLIT || mode == MS_EXP_FETCH) {
        for (int32_t e = 0; e < E; e++) ws->usel[e] = 0;
        for (int32_t j = 0; j < m->slots[i] && j < E; j++) ws->usel[r->hot[(int64_t) l * E + j]] = 1;
        for (int32_t e = 0; e < E; e++) {
            if (ws->usel[e]) {
                pinned_q += qbar[e];
                pinned_p += p[e];
            } else {
                free_q += qbar[e];
                free_p += p[e];
            }
        }
    }
    n->distinct += D;
    n->reuse += r->stickiness[l] + (1.0 - r->stickiness[l]) * r->qsq[l] / ((double) S * K);
    if (mode == MS_EXP_GPU) {
        w->n_res = D;
        w->pairs_gpu = toks * K;
    } else if (mode == MS_EXP_CPU) {
        w->n_cpu = D;
        w->pairs_cpu = toks * K;
    } else if (mode == MS_EXP_SPLIT) {
        w->n_res = pinned_p;
        w->n_cpu = free_p;
        w->pairs_gpu = toks * pinned_q;
        w->pairs_cpu = toks * free_q;
        n->hits += pinned_p;
        n->loads += D;
    } else {   /* FETCH */
        double h = fetch_layer(m, r, c, ws, i, l, D, pinned_p, free_p, w);
        n->hits += D * h;
        n->loads += D;
    }
    if (m->page_slots[i] < E && (mode == MS_EXP_CPU || mode == MS_EXP_SPLIT || mode == MS_EXP_FETCH)) {
        double host = mode == MS_EXP_FETCH ? w->n_fetch : w->n_cpu;
        double ph = D > 0.0 ? che_hits(p, E, (double) m->page_slots[i], ws->che) / D : 0.0;
        w->n_disk = host * (1.0 - ph);
        n->phits += host * ph;
        n->ploads += host;
    }
}

int ms_analytic(const ms_decode_model_t *m, const ms_machine_t *hw, const ms_routing_t *r,
                    const ms_decode_config_t *c, ws_t *ws, ms_decode_result_t *out)
{
    an_tally_t n = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    int32_t n_moe = 0;
    if (c->policy == MS_POLICY_BELADY) return MS_ERR_BAD_POLICY;
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
