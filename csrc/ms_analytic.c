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

/* LRU on the windows (routing_window.py), lru_chain_hits' split in whole steps: with a(n) = a_e(n tps) summed
 * over experts, U(k) = E - a(k) experts were used in the last k steps; k = floor(T), T >= 1 solving
 * U(T) = C (window_capacity_tokens), gives U(k) <= C < U(k + 1). Experts used within k steps are resident,
 * those used exactly k + 1 back with rho = (C - U(k)) / (U(k + 1) - U(k)): hits per step =
 * E - a(1) - a(k) + a(k + 1) + rho (a(k) - 2 a(k + 1) + a(k + 2)). All experts ever used fit: hits = D. A
 * step's D >= C: the cache holds C of the previous step's D (id order, popularity-blind), so
 * hits = (C / D) sum_e P(e in both steps) = (C / D) sum_e 1 - 2 a_e(tps) + a_e(2 tps), less the needed
 * resident the step's first access evicts when every resident is needed again (lru_chain_hits). */
static double window_hits(const ms_routing_t *r, int32_t l, double B, double tps, double C, double D)
{
    int32_t E = r->n_experts, W = r->n_window, support = 0;
    const double *row = r->win_lq + (int64_t) l * E * W;
    double a1, k, ak, ak1, ak2, uk, uk1;
    for (int32_t e = 0; e < E; e++) support += row[(int64_t) e * W + W - 1] < 0.0;
    if ((double) support <= C) return D;
    if (C <= 0.0) return 0.0;
    a1 = (double) E - D;
    if (D >= C) {
        /* as lru_chain_hits with k = 0: less one hit when every resident is needed again */
        win_seg_t s1 = window_segment(r, tps), s2 = window_segment(r, 2.0 * tps);
        double lret = 0.0;
        for (int32_t e = 0; e < E; e++) {
            const double *q = row + (int64_t) e * W;
            double x1 = exp(B * window_lq(q, s1)), p = 1.0 - x1, both = 1.0 - 2.0 * x1 + exp(B * window_lq(q, s2));
            if (p > 0.0) lret += p * log(fmax(both / p, 1e-300));
        }
        return fmax(0.0, C / D * ((double) E - 2.0 * a1 + window_absent(r, l, B, 2.0 * tps))
                         - fmin(1.0, D - C) * exp(C * lret / D));
    }
    /* U(k) = E - a(k tps) <= C < U(k + 1), k >= 1 as U(1) = D < C: lru_chain_hits' split in whole steps */
    k = floor(window_capacity_tokens(r, l, B, tps, C) / tps);
    ak = window_absent(r, l, B, k * tps);
    ak1 = window_absent(r, l, B, (k + 1.0) * tps);
    ak2 = window_absent(r, l, B, (k + 2.0) * tps);
    uk = (double) E - ak;
    uk1 = (double) E - ak1;
    return (double) E - a1 - ak + ak1
           + (uk1 > uk ? fmin(1.0, fmax(0.0, (C - uk) / (uk1 - uk))) : 0.0) * (ak - 2.0 * ak1 + ak2);
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

/* Step-level LRU on a two-state chain per expert: e is in a step's set with probability p[e] (stationary);
 * after a step without it, with probability f[e] (a sticky routing re-picks only what the sequence used the
 * token before, so an absent expert returns through fresh picks alone: f < p; f = p is independent reference).
 * The cache holds the C most recently used experts; accesses within a step go in id order, so recency within a
 * step is popularity-blind. With U(k) = sum_e 1 - (1 - p)(1 - f)^(k-1) the experts used in the last k steps
 * (U(0) = 0, U(1) = D), the k with U(k) <= C < U(k + 1) splits them: an expert last used within k steps is
 * resident, one last used exactly k + 1 steps back with probability rho = (C - U(k)) / (U(k + 1) - U(k)).
 * Hits per step = sum_e P(e used now and within k) + rho P(e used now and exactly k + 1 back), where
 * P(used now, within k) = p - (1 - p) f (1 - f)^(k-1) and P(used now, exactly k + 1) = (1 - p) f^2 (1 - f)^(k-1)
 * (k = 0: rho = C / D of the previous step's set, sum_e p - (1 - p) f). k from Newton's method on the concave
 * increasing U(tau) - C from tau = 1 (the iterates rise to the root), floored. When k = 0 and every resident
 * is needed again, the step's first access (a miss, once the step needs more than C experts) finds no expert
 * it may evict and takes a needed one (ms_cache.c lru_victim): one hit fewer, with probability the product of
 * the residents' return rates p_e - (1 - p) f over p_e (its log-mean over the previous step's set) times the
 * share of D beyond C (capped at 1). Scratch lb: E doubles. */
static double lru_chain_hits(const double *p, const double *f, int32_t E, double C, double *lb)
{
    double D = 0.0, reach = 0.0, tau = 1.0, k, uk = 0.0, uk1 = 0.0, within = 0.0, exact = 0.0, lret = 0.0;
    int32_t support = 0;
    for (int32_t e = 0; e < E; e++) {
        support += p[e] > 0.0;
        D += p[e];
        reach += f[e] > 0.0 ? 1.0 : p[e];   /* U(infinity): what the cache could ever be asked to hold */
    }
    if ((double) support <= C || reach <= C) return D;
    if (C <= 0.0) return 0.0;
    for (int32_t e = 0; e < E; e++) lb[e] = log1p(-fmin(f[e], 1.0 - 1e-15));
    if (D < C) {
        /* start at the root for equal return rates (their mean over the support); from the right of the root
         * Newton's first step lands left of it (U is concave), then the iterates rise */
        double fsum = 0.0;
        for (int32_t e = 0; e < E; e++) fsum += p[e] > 0.0 ? f[e] : 0.0;
        if (fsum > 0.0 && fsum < (double) support)
            tau = fmax(1.0, 1.0 + log((support - C) / (support - D)) / log1p(-fsum / support));
        for (int it = 0; it < 200; it++) {
            double u = -C, du = 0.0, next;
            for (int32_t e = 0; e < E; e++) {
                double x = (1.0 - p[e]) * exp(lb[e] * (tau - 1.0));
                u += 1.0 - x;
                du -= lb[e] * x;
            }
            if (!(du > 0.0)) break;
            next = fmax(1.0, tau - u / du);
            if (!(fabs(next - tau) > 1e-14 * tau)) break;
            tau = next;
        }
        k = floor(tau);
    } else {
        k = 0.0;
    }
    for (int32_t e = 0; e < E; e++) {
        double a = 1.0 - p[e];
        if (k >= 1.0) {
            double g = exp(lb[e] * (k - 1.0)), z = a * f[e] * g;
            uk += 1.0 - a * g;
            uk1 += 1.0 - a * exp(lb[e] * k);
            within += p[e] - z;
            exact += z * f[e];
        } else if (p[e] > 0.0) {
            double both = p[e] - a * f[e];
            uk1 += p[e];
            exact += both;
            lret += p[e] * log(fmax(both / p[e], 1e-300));
        }
    }
    if (k < 1.0) return fmax(0.0, exact * C / D - fmin(1.0, D - C) * exp(C * lret / D));   /* >= 0 but for rounding */
    return within + (uk1 > uk ? fmin(1.0, fmax(0.0, (C - uk) / (uk1 - uk))) : 0.0) * exact;
}

/* Expected LRU hit rate of routing layer l's `C` GPU slots (lru_chain_hits per scenario combination):
 * superposed request streams, combination j gives sequence b scenario (j + b) mod S. Each sequence re-picks
 * the token before's experts with the layer's stickiness s, so it picks an expert it did not use the token
 * before with probability q (1 - s) / (1 - q s) (the stationary per-token rate staying q): an expert absent
 * from the step before returns with f = 1 - prod (1 - q)^tps / (1 - q s)^tps over the sequences. When S
 * divides the batch every combination holds every scenario batch / S times (the same step up to the order
 * of a sum): one combination stands for all. Scratch: pc, pf and che [E], lq [S][E] (log(1 - q) per scenario)
 * and ls [S][E] (log(1 - q s)). */
static double lru_hit_rate(const ms_routing_t *r, int32_t batch, int32_t tps, int32_t l, double C, double *pc,
                           double *pf, double *che, double *lq, double *ls)
{
    int32_t E = r->n_experts, S = r->n_scenarios, combos = batch % S == 0 ? 1 : S;
    double hsum = 0.0, dsum = 0.0, s = r->stickiness[l];
    for (int32_t k = 0; k < S; k++)
        for (int32_t e = 0; e < E; e++) {
            double q = fmin(r->q[((int64_t) k * r->n_layers + l) * E + e], 1.0 - 1e-16);
            lq[(int64_t) k * E + e] = log1p(-q);
            ls[(int64_t) k * E + e] = log1p(-q * s);
        }
    for (int32_t j = 0; j < combos; j++) {
        double dj = 0.0;
        for (int32_t e = 0; e < E; e++) {
            double lg = 0.0, lf = 0.0;
            for (int32_t b = 0; b < batch && b < S; b++) {
                int64_t reps = batch / S + (b < batch % S ? 1 : 0), at = (int64_t) ((j + b) % S) * E + e;
                lg += (double) reps * lq[at];
                lf += (double) reps * (lq[at] - ls[at]);
            }
            pc[e] = 1.0 - exp(tps * lg);
            pf[e] = 1.0 - exp(tps * lf);
            dj += pc[e];
        }
        hsum += lru_chain_hits(pc, pf, E, C, che);
        dsum += dj;
    }
    return dsum > 0.0 ? hsum / dsum : 0.0;
}

/* Scratch of layer_counts: p, pc, pf, che [E], lq and ls [S][E], usel [E]. */
typedef struct {
    double *p, *pc, *pf, *che, *lq, *ls;
    int32_t *usel;
} an_scratch_t;

/* The LRU hit rate of routing layer l's C slots: Che's approximation on the window tables (D: the step's
 * distinct experts from window_inclusion; the windows hold the stickiness and memory), else the sticky chain
 * per scenario combination (lru_hit_rate). What ms_che_table tabulates and a FETCH layer without a table
 * solves. */
static double lru_layer(const ms_routing_t *r, int32_t l, int32_t batch, int32_t tps, double C, double D,
                        const an_scratch_t *s)
{
    if (r->win_lq) return D > 0.0 ? window_hits(r, l, (double) batch, (double) tps, C, D) / D : 0.0;
    return lru_hit_rate(r, batch, tps, l, C, s->pc, s->pf, s->che, s->lq, s->ls);
}

/* The expected counts of routing layer l's step (batch x tps tokens) at `slots` GPU slots into row[MS_CHE_*]:
 * D, the selection and inclusion mass of the `slots` hottest experts (pinned) and of the rest (with
 * `pinned`; summed on both sides so "all pinned" is exact), the hit rate under `policy` (with `hit`: LRU's
 * rate with the stickiness (lru_hit_rate), else the pinned share: static, and LFU converges to the same set)
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
                    : policy == MS_POLICY_LRU ? lru_layer(r, l, batch, tps, (double) slots, D, s)
                    : (D > 0.0 ? pinned_p / D : 0.0);
    row[MS_CHE_REUSE] = r->win_lq ? window_reuse(r, l)
                      : r->stickiness[l] + (1.0 - r->stickiness[l]) * r->qsq[l] / ((double) S * K);
}

/* Expected work of a FETCH layer i (routing layer l) from its counts `row`; returns the hit rate. */
static double fetch_layer(const ms_routing_t *r, const ms_decode_config_t *c, int32_t i, int32_t l, const double *row,
                          layer_work_t *w)
{
    double D = row[MS_CHE_D], h = row[MS_CHE_HIT];
    double toks = (double) c->batch * c->tokens_per_step;
    if (c->policy == MS_POLICY_LRU) {
        w->n_fetch = D * (1.0 - h);         /* h holds the stickiness (lru_hit_rate) or the windows' memory */
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
    sc.pf = ws->che + E;             /* ws->che holds 2 E doubles */
    sc.lq = ws->lq;
    sc.ls = ws->lq + (int64_t) r->n_scenarios * E;
    sc.usel = ws->usel;
    if (row == NULL) {
        layer_counts(r, l, c->batch, c->tokens_per_step, m->slots[i], c->policy,
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
    return (4 * E + 2 * S * E) * (int64_t) sizeof(double) + E * (int64_t) sizeof(int32_t);
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

/* The scratch of layer_counts carved from a table call's workspace (ms_che_table_workspace_size). */
static void scratch_in(const ms_routing_t *r, void *workspace, an_scratch_t *sc)
{
    sc->p = (double *) workspace;
    sc->pc = sc->p + r->n_experts;
    sc->che = sc->pc + r->n_experts;
    sc->pf = sc->che + r->n_experts;
    sc->lq = sc->pf + r->n_experts;
    sc->ls = sc->lq + (int64_t) r->n_scenarios * r->n_experts;
    sc->usel = (int32_t *) (sc->ls + (int64_t) r->n_scenarios * r->n_experts);
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
    scratch_in(r, workspace, &sc);
    for (int32_t l = 0; l < r->n_layers; l++)
        layer_counts(r, l, batch, tokens_per_step, slots, policy, 1, 1, &sc, out + (int64_t) l * MS_CHE_FIELDS);
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
        double D = r->win_lq ? window_inclusion(r, l, (double) batch, (double) tokens_per_step, sc.p)
                             : step_inclusion(r, l, (double) batch * tokens_per_step, sc.p);
        out[l] = D > 0.0 ? lru_layer(r, l, batch, tokens_per_step, (double) page_slots, D, &sc) : 0.0;
    }
    return 0;
}
