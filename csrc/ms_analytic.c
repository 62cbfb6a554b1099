/*
 * The analytic decode path: the cost model of ms_decode.c on expected counts (distinct experts per
 * step from inclusion probabilities, static-cache hits from the pinned popularity mass, LRU hits by
 * Che's approximation; under token memory Che's approximation on the routing's window tables). Orders
 * of magnitude faster than Monte Carlo; the two agree closely (tests hold them together).
 */
#include <float.h>
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

/* ------------------------------------------------------------------------- token memory (windows) */

/* The segment of the window nodes r->win_n holding n (the end one beyond them): its nodes lo and hi,
 * n - x[lo] and x[hi] - x[lo]. Every expert's row shares the nodes, so a sum over experts finds the
 * segment once. */
typedef struct {
    int32_t lo, hi;
    double dn, dx;
} win_seg_t;

static win_seg_t window_segment(const ms_routing_t *r, double n)
{
    const double *x = r->win_n;
    win_seg_t s;
    int32_t lo = 0, hi = r->n_window - 1;
    while (hi - lo > 1) {               /* the segment [x[lo], x[hi]] holding n (or the end one) */
        int32_t mid = (lo + hi) / 2;
        if (x[mid] < n) lo = mid; else hi = mid;
    }
    s.lo = lo;
    s.hi = hi;
    s.dn = n - x[lo];
    s.dx = x[hi] - x[lo];
    return s;
}

/* log P(an expert is absent from n consecutive tokens of one sequence) from its window row lq at n's
 * segment s: linear in n between the nodes, the end segments extended beyond them. */
static double window_lq(const double *lq, win_seg_t s)
{
    return lq[s.lo] + (lq[s.hi] - lq[s.lo]) * s.dn / s.dx;
}

/* Expected experts of routing layer l absent from B sequences' n tokens each, summed: sum_e a_e(n) with
 * a_e(n) = exp(B lq_e(n)) (sequences are independent requests). */
static double window_absent(const ms_routing_t *r, int32_t l, double B, double n)
{
    int32_t E = r->n_experts, W = r->n_window;
    const double *row = r->win_lq + (int64_t) l * E * W;
    win_seg_t seg = window_segment(r, n);
    double s = 0.0;
    for (int32_t e = 0; e < E; e++) s += exp(B * window_lq(row + (int64_t) e * W, seg));
    return s;
}

/* Step inclusion p_e = 1 - a_e(tps) of routing layer l into p; returns their sum D. */
static double window_inclusion(const ms_routing_t *r, int32_t l, double B, double tps, double *p)
{
    int32_t E = r->n_experts, W = r->n_window;
    const double *row = r->win_lq + (int64_t) l * E * W;
    win_seg_t seg = window_segment(r, tps);
    double D = 0.0;
    for (int32_t e = 0; e < E; e++) {
        p[e] = 1.0 - exp(B * window_lq(row + (int64_t) e * W, seg));
        D += p[e];
    }
    return D;
}

/* sum_e exp(B lq_e[j]) of routing layer l: the experts absent from B sequences' x[j] tokens (a node). */
static double window_absent_node(const ms_routing_t *r, int32_t l, double B, int32_t j)
{
    int32_t E = r->n_experts, W = r->n_window;
    const double *row = r->win_lq + (int64_t) l * E * W + j;
    double s = 0.0;
    for (int32_t e = 0; e < E; e++) s += exp(B * row[(int64_t) e * W]);
    return s;
}

/* The n >= n0 solving E - window_absent(n) = C, given E - window_absent(n0) < C and a root (the experts
 * ever used outnumber C). The left side rises with n; between nodes lq is linear in n, so there it is
 * E minus a sum of exponentials of n: concave. A binary search over the nodes finds the segment that holds
 * the root (the end segment extended beyond the last node); Newton's method from the segment's left end
 * (or n0) then rises monotonically to the root, as tangents of a concave function lie above it. About a
 * dozen sums over the experts, where bisection in n took about fifty. Capped at n0 2^50 (a root that far
 * is a cache that never misses: the hits it gives are D). */
static double window_capacity_tokens(const ms_routing_t *r, int32_t l, double B, double n0, double C)
{
    int32_t E = r->n_experts, W = r->n_window, a, b;
    const double *x = r->win_n, *row = r->win_lq + (int64_t) l * E * W;
    double n, xlo, cap = n0 * 0x1p50;
    win_seg_t s = window_segment(r, n0);
    a = s.hi;
    b = W - 1;
    if ((double) E - window_absent_node(r, l, B, b) < C) {
        a = W - 1;                          /* the end segment, extended */
    } else {
        while (a < b) {                     /* the first node where the left side reaches C */
            int32_t mid = (a + b) / 2;
            if ((double) E - window_absent_node(r, l, B, mid) >= C) b = mid; else a = mid + 1;
        }
    }
    xlo = x[a - 1];
    n = fmax(n0, xlo);
    for (int it = 0; it < 100; it++) {
        double absent = 0.0, slope = 0.0, step;
        for (int32_t e = 0; e < E; e++) {
            const double *q = row + (int64_t) e * W;
            double ds = (q[a] - q[a - 1]) / (x[a] - xlo), v = exp(B * (q[a - 1] + ds * (n - xlo)));
            absent += v;
            slope -= B * ds * v;            /* d(E - absent)/dn >= 0 */
        }
        if (!(slope > 0.0)) break;
        step = (C - ((double) E - absent)) / slope;
        if (!(step > 1e-14 * n)) break;
        n += step;
        if (n >= cap) return cap;
    }
    return n;
}

/* Che's approximation on the windows (routing_window.py): an expert is resident iff used in the last T
 * steps, T >= 1 solving E - sum_e a_e(T tps) = C (window_capacity_tokens); hits per step =
 * sum_e 1 - a_e(tps) - a_e(T tps) + a_e((T + 1) tps). All experts ever used fit: hits = D. A
 * step's D >= C: the cache holds C of the previous step's D (id order, popularity-blind), so
 * hits = (C / D) sum_e P(e in both steps) = (C / D) sum_e 1 - 2 a_e(tps) + a_e(2 tps). */
static double window_hits(const ms_routing_t *r, int32_t l, double B, double tps, double C, double D)
{
    int32_t E = r->n_experts, W = r->n_window, support = 0;
    const double *row = r->win_lq + (int64_t) l * E * W;
    double a1, T;
    for (int32_t e = 0; e < E; e++) support += row[(int64_t) e * W + W - 1] < 0.0;
    if ((double) support <= C) return D;
    if (C <= 0.0) return 0.0;
    a1 = (double) E - D;
    if (D >= C) return C / D * ((double) E - 2.0 * a1 + window_absent(r, l, B, 2.0 * tps));
    T = window_capacity_tokens(r, l, B, tps, C) / tps;
    return (double) E - a1 - window_absent(r, l, B, T * tps) + window_absent(r, l, B, (T + 1.0) * tps);
}

/* The reuse statistic on the windows: sum_e P(e in two consecutive tokens) / k of one sequence,
 * P = 1 - 2 a_e(1) + a_e(2) with B = 1. */
static double window_reuse(const ms_routing_t *r, int32_t l)
{
    return ((double) r->n_experts - 2.0 * window_absent(r, l, 1.0, 1.0) + window_absent(r, l, 1.0, 2.0))
           / (double) r->top_k;
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

/* Expected LRU hit rate of routing layer l's `C` GPU slots (Che's approximation per scenario combination):
 * superposed request streams, combination j gives sequence b scenario (j + b) mod S. When S divides the
 * batch every combination holds every scenario batch / S times (the same step up to the order of a sum):
 * one combination stands for all. Scratch: pc and che [E], lq [S][E]. */
static double lru_hit_rate(const ms_routing_t *r, int32_t batch, int32_t tps, int32_t l, double C, double *pc,
                           double *che, double *lq)
{
    int32_t E = r->n_experts, S = r->n_scenarios, combos = batch % S == 0 ? 1 : S;
    double hsum = 0.0, dsum = 0.0;
    for (int32_t k = 0; k < S; k++)
        for (int32_t e = 0; e < E; e++)
            lq[(int64_t) k * E + e] = log1p(-fmin(r->q[((int64_t) k * r->n_layers + l) * E + e], 1.0 - 1e-16));
    for (int32_t j = 0; j < combos; j++) {
        double dj = 0.0;
        for (int32_t e = 0; e < E; e++) {
            double lg = 0.0;
            for (int32_t b = 0; b < batch && b < S; b++) {
                int64_t reps = batch / S + (b < batch % S ? 1 : 0);
                lg += (double) reps * lq[(int64_t) ((j + b) % S) * E + e];
            }
            pc[e] = 1.0 - exp(tps * lg);
            dj += pc[e];
        }
        hsum += che_hits(pc, E, C, che);
        dsum += dj;
    }
    return dsum > 0.0 ? hsum / dsum : 0.0;
}

/* The LRU hit rate of routing layer l's C slots before the stickiness term: Che's approximation on the
 * window tables (D: the step's distinct experts from window_inclusion), else per scenario combination.
 * What ms_che_table tabulates and a FETCH layer without a table solves. */
static double lru_layer(const ms_routing_t *r, int32_t l, int32_t batch, int32_t tps, double C, double D,
                        double *pc, double *che, double *lq)
{
    if (r->win_lq) return D > 0.0 ? window_hits(r, l, (double) batch, (double) tps, C, D) / D : 0.0;
    return lru_hit_rate(r, batch, tps, l, C, pc, che, lq);
}

/* Scratch of layer_counts: p, pc, che [E], lq [S][E], usel [E]. */
typedef struct {
    double *p, *pc, *che, *lq;
    int32_t *usel;
} an_scratch_t;

/* The expected counts of routing layer l's step (batch x tps tokens) at `slots` GPU slots into row[MS_CHE_*]:
 * D, the selection and inclusion mass of the `slots` hottest experts (pinned) and of the rest (with
 * `pinned`; summed on both sides so "all pinned" is exact), the hit rate under `policy` (with `hit`: LRU's
 * Che rate before the stickiness term, else the pinned share: static, and LFU converges to the same set)
 * and the reuse statistic; the inclusion probabilities are left in s->p. What ms_che_table tabulates and
 * analytic_layer computes for itself without a table. */
static void layer_counts(const ms_routing_t *r, int32_t l, int32_t batch, int32_t tps, int32_t slots, int32_t policy,
                         int pinned, int hit, const an_scratch_t *s, double *row)
{
    int32_t E = r->n_experts, S = r->n_scenarios, K = r->top_k;
    double D, pinned_q = 0.0, pinned_p = 0.0, free_q = 0.0, free_p = 0.0, *p = s->p;
    const double *qbar = r->qbar + (int64_t) l * E;
    D = r->win_lq ? window_inclusion(r, l, (double) batch, (double) tps, p)
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
                    : policy == MS_POLICY_LRU ? lru_layer(r, l, batch, tps, (double) slots, D, s->pc, s->che, s->lq)
                    : (D > 0.0 ? pinned_p / D : 0.0);
    row[MS_CHE_REUSE] = r->win_lq ? window_reuse(r, l)
                      : r->stickiness[l] + (1.0 - r->stickiness[l]) * r->qsq[l] / ((double) S * K);
}

/* Expected work of a FETCH layer i (routing layer l) from its counts `row`; returns the hit rate. */
static double fetch_layer(const ms_decode_model_t *m, const ms_routing_t *r, const ms_decode_config_t *c, int32_t i,
                          int32_t l, const double *row, layer_work_t *w)
{
    double C = (double) m->slots[i], D = row[MS_CHE_D], h = row[MS_CHE_HIT];
    double toks = (double) c->batch * c->tokens_per_step;
    if (c->policy == MS_POLICY_LRU) {
        if (!r->win_lq) {   /* the windows hold the stickiness and memory: no separate sticky term */
            /* a sticky expert was used by the previous token: resident while C covers a step's set */
            double sigma = r->stickiness[l] * fmin(1.0, C / fmax(D, 1e-300));
            h = sigma + (1.0 - sigma) * h;
        }
        w->n_fetch = D * (1.0 - h);
    } else {
        w->n_fetch = row[MS_CHE_FREE_P];
    }
    w->n_res = D;
    w->pairs_gpu = toks * r->top_k;
    if (r->recall[l] > 0.0 && i > 0) {
        w->n_pref = r->recall[l] * w->n_fetch;
        w->n_waste = w->n_fetch - w->n_pref;
    }
    return h;
}

/* The host page cache's hit rate of routing layer l at ps slots (its hits per step / D; 0 when the step has
 * no experts): Che's approximation on the window tables, else on the step's inclusion probabilities p
 * (independent picks; che: E doubles of scratch). What ms_page_table tabulates and a paged layer without a
 * table solves. */
static double page_layer(const ms_routing_t *r, int32_t l, int32_t batch, int32_t tps, double ps, double D,
                         const double *p, double *che)
{
    if (D <= 0.0) return 0.0;
    return (r->win_lq ? window_hits(r, l, (double) batch, (double) tps, ps, D) : che_hits(p, r->n_experts, ps, che)) / D;
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
    sc.lq = ws->lq;
    sc.usel = ws->usel;
    /* the page cache's Che (independent picks) without a table reads the inclusion probabilities themselves */
    if (row == NULL || (paged && !r->win_lq && !page_tabled)) {
        layer_counts(r, l, c->batch, c->tokens_per_step, m->slots[i], c->policy,
                     row == NULL && (mode == MS_EXP_SPLIT || mode == MS_EXP_FETCH), row == NULL && mode == MS_EXP_FETCH,
                     &sc, own);
        if (row == NULL) row = own;
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
        double h = fetch_layer(m, r, c, i, l, row, w);
        n->hits += D * h;
        n->loads += D;
    }
    if (paged) {
        double host = mode == MS_EXP_FETCH ? w->n_fetch : w->n_cpu;
        double ph = page_tabled ? c->page_hit[l]
                  : page_layer(r, l, c->batch, c->tokens_per_step, (double) m->page_slots[i], D, sc.p, ws->che);
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
    return (3 * E + S * E) * (int64_t) sizeof(double) + E * (int64_t) sizeof(int32_t);
}

/* The checks ms_decode makes of an analytic routing, for a table that runs without a configuration. */
static int check_che(const ms_routing_t *r, int32_t batch, int32_t tps, int32_t slots, int32_t policy)
{
    if (batch < 1 || tps < 1 || slots < 0) return MS_ERR_BAD_SIZE;
    if (policy < 0 || policy >= MS_N_POLICIES || policy == MS_POLICY_BELADY) return MS_ERR_BAD_POLICY;
    if (r->n_layers < 1 || r->n_layers > MS_MAX_MOE_LAYERS) return MS_ERR_BAD_SIZE;
    if (r->n_experts <= 0 || r->top_k <= 0 || r->top_k > r->n_experts || r->top_k > MS_MAX_TOP_K)
        return MS_ERR_BAD_ROUTING;
    if (r->n_scenarios <= 0 || r->q == NULL || r->qbar == NULL || r->lqbar == NULL || r->qsq == NULL
        || r->hot == NULL || r->stickiness == NULL || ms_windows_bad(r)) return MS_ERR_BAD_ROUTING;
    for (int64_t k = 0; k < (int64_t) r->n_layers * r->n_experts; k++)
        if (r->hot[k] < 0 || r->hot[k] >= r->n_experts) return MS_ERR_BAD_ROUTING;
    return 0;
}

int ms_che_table(const ms_routing_t *r, int32_t batch, int32_t tokens_per_step, int32_t slots, int32_t policy,
                 void *workspace, int64_t workspace_bytes, double *out)
{
    an_scratch_t sc;
    int rc;
    if (r == NULL || out == NULL || workspace == NULL) return MS_ERR_NULL_ARGUMENT;
    rc = check_che(r, batch, tokens_per_step, slots, policy);
    if (rc) return rc;
    if (workspace_bytes < ms_che_table_workspace_size(r)) return MS_ERR_BAD_WORKSPACE;
    sc.p = (double *) workspace;
    sc.pc = sc.p + r->n_experts;
    sc.che = sc.pc + r->n_experts;
    sc.lq = sc.che + r->n_experts;
    sc.usel = (int32_t *) (sc.lq + (int64_t) r->n_scenarios * r->n_experts);
    for (int32_t l = 0; l < r->n_layers; l++)
        layer_counts(r, l, batch, tokens_per_step, slots, policy, 1, 1, &sc, out + (int64_t) l * MS_CHE_FIELDS);
    return 0;
}

/* ------------------------------------------------------------------------- the page-cache hit-rate table */

int ms_page_table(const ms_routing_t *r, int32_t batch, int32_t tokens_per_step, int32_t page_slots, void *workspace,
                  int64_t workspace_bytes, double *out)
{
    double *p, *che;
    int rc;
    if (r == NULL || out == NULL || workspace == NULL) return MS_ERR_NULL_ARGUMENT;
    rc = check_che(r, batch, tokens_per_step, page_slots, MS_POLICY_LRU);
    if (rc) return rc;
    if (workspace_bytes < ms_che_table_workspace_size(r)) return MS_ERR_BAD_WORKSPACE;
    p = (double *) workspace;
    che = p + r->n_experts;
    for (int32_t l = 0; l < r->n_layers; l++) {
        /* the step's inclusion probabilities and D as layer_counts has them */
        double D = r->win_lq ? window_inclusion(r, l, (double) batch, (double) tokens_per_step, p)
                             : step_inclusion(r, l, (double) batch * tokens_per_step, p);
        out[l] = page_layer(r, l, batch, tokens_per_step, (double) page_slots, D, p, che);
    }
    return 0;
}
