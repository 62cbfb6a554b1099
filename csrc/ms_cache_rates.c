/*
 * The analytic path's cache hit rates (ms_analytic.c reads them): LRU in whole steps of recency on a sticky
 * two-state chain per expert (per scenario combination) or on a token-memory routing's window tables, and LFU
 * with counts since the run began. engine/reference/cache_rates.py and window.py are the Python twins.
 */
#include <float.h>
#include <math.h>

#include "ms_internal.h"

/* ------------------------------------------------------------------------- token memory (windows) */

/* The segment of the window nodes r->win_n holding n (the end one beyond them): its nodes lo and hi,
 * n - x[lo] and x[hi] - x[lo]. Every expert's row shares the nodes, so a sum over experts finds the
 * segment once. */
typedef struct { int32_t lo, hi; double dn, dx; } win_seg_t;

/* The segment [x[lo], x[hi]] of the increasing lengths x[0 .. count) holding n (or the end one). */
static void node_segment(const double *x, int32_t count, double n, int32_t *lo, int32_t *hi)
{
    *lo = 0; *hi = count - 1;
    while (*hi - *lo > 1) {
        int32_t mid = (*lo + *hi) / 2;
        if (x[mid] < n) *lo = mid; else *hi = mid;
    }
}

static win_seg_t window_segment(const ms_routing_t *r, double n)
{
    const double *x = r->win_n;
    win_seg_t s;
    int32_t lo, hi;
    node_segment(x, r->n_window, n, &lo, &hi);
    s.lo = lo; s.hi = hi;
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
double ms_window_inclusion(const ms_routing_t *r, int32_t l, double B, double tps, double *p)
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
 * step's D >= C: ms_full_step_hits with P(e in both steps) = 1 - 2 a_e(tps) + a_e(2 tps). Scratch p, both [E]. */
double ms_window_hits(const ms_routing_t *r, int32_t l, double B, double tps, double C, double D, double *p,
                      double *both)
{
    int32_t E = r->n_experts, W = r->n_window, support = 0;
    const double *row = r->win_lq + (int64_t) l * E * W;
    double a1, k, ak, ak1, ak2, uk, uk1;
    for (int32_t e = 0; e < E; e++) support += row[(int64_t) e * W + W - 1] < 0.0;
    if ((double) support <= C) return D;
    if (C <= 0.0) return 0.0;
    a1 = (double) E - D;
    if (D >= C) {
        win_seg_t s1 = window_segment(r, tps), s2 = window_segment(r, 2.0 * tps);
        for (int32_t e = 0; e < E; e++) {
            const double *q = row + (int64_t) e * W;
            double x1 = exp(B * window_lq(q, s1));
            p[e] = 1.0 - x1;
            both[e] = 1.0 - 2.0 * x1 + exp(B * window_lq(q, s2));
        }
        return ms_full_step_hits(p, both, E, C, D, r->top_k, 0.0);
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
double ms_window_reuse(const ms_routing_t *r, int32_t l)
{
    return ((double) r->n_experts - 2.0 * window_absent(r, l, 1.0, 1.0) + window_absent(r, l, 1.0, 2.0))
           / (double) r->top_k;
}

/* The sticky chain's reuse: sum_e P(e in two consecutive tokens) / k, P = q - (1 - q) f, over the scenarios. */
double ms_chain_reuse(const ms_routing_t *r, int32_t l)
{
    int32_t E = r->n_experts, S = r->n_scenarios;
    double s = r->stickiness[l], sum = 0.0;
    for (int32_t k = 0; k < S; k++)
        for (int32_t e = 0; e < E; e++) {
            double q = fmin(r->q[((int64_t) k * r->n_layers + l) * E + e], 1.0 - 1e-16);
            sum += q - (1.0 - q) * ms_fresh_rate(q, s, r->top_k);
        }
    return sum / ((double) S * r->top_k);
}

/* U(k) and U(k + 1) of lru_chain_hits, and the hits of the split at k >= 1. */
static void chain_split(const double *p, const double *f, const double *lb, int32_t E, double k, double *uk,
                        double *uk1, double *within, double *exact)
{
    *uk = *uk1 = *within = *exact = 0.0;
    for (int32_t e = 0; e < E; e++) {
        double a = 1.0 - p[e], g = exp(lb[e] * (k - 1.0)), z = a * f[e] * g;
        *uk += 1.0 - a * g;
        *uk1 += 1.0 - a * exp(lb[e] * k);
        *within += p[e] - z;
        *exact += z * f[e];
    }
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
 * increasing U(tau) - C (the iterates rise to the root) to a step under 1e-6, floored, then moved by whole
 * steps until U(k) <= C < U(k + 1) holds; k = 0 is ms_full_step_hits with P(e in both steps) = p - (1 - p) f (top_k
 * experts per token, V the variance of the step's distinct count). lb: E. */
static double lru_chain_hits(const double *p, const double *f, int32_t E, double C, int32_t top_k, double V, double *lb)
{
    double D = 0.0, reach = 0.0, fsum = 0.0, tau = 1.0, k, uk, uk1, within, exact = 0.0;
    int32_t support = 0;
    for (int32_t e = 0; e < E; e++) {
        support += p[e] > 0.0;
        D += p[e];
        reach += f[e] > 0.0 ? 1.0 : p[e];   /* U(infinity): what the cache could ever be asked to hold */
        fsum += p[e] > 0.0 ? f[e] : 0.0;
    }
    if ((double) support <= C || reach <= C) return D;
    if (C <= 0.0) return 0.0;
    if (D >= C) {                           /* k = 0: the step alone fills the cache */
        for (int32_t e = 0; e < E; e++) lb[e] = p[e] - (1.0 - p[e]) * f[e];
        return ms_full_step_hits(p, lb, E, C, D, top_k, V);
    }
    for (int32_t e = 0; e < E; e++) lb[e] = log1p(-fmin(f[e], 1.0 - 1e-15));
    /* start at the root for equal return rates (their mean over the support); from the right of the root
     * Newton's first step lands left of it (U is concave), then the iterates rise. Only floor(tau) is read,
     * so a step far below one ends it; the split then moves k until U(k) <= C < U(k + 1) */
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
        if (!(fabs(next - tau) > 1e-6)) { tau = next; break; }
        tau = next;
    }
    k = floor(tau);
    for (int moves = 0;; moves++) {         /* U(1) = D < C and U grows to reach > C: a k exists */
        chain_split(p, f, lb, E, k, &uk, &uk1, &within, &exact);
        if (moves >= 64 || !((uk > C && k > 1.0) || uk1 <= C)) break;
        k += uk1 <= C ? 1.0 : -1.0;
    }
    return within + (uk1 > uk ? fmin(1.0, fmax(0.0, (C - uk) / (uk1 - uk))) : 0.0) * exact;
}

/* log(1 - q) and log(1 - f) of every scenario's per-token picks of routing layer l into lq and lf [S][E], f the
 * rate at which a token picks e afresh when the token before did not (ms_fresh_rate: route_token frees K (1 - s)
 * slots a token on average, 1 + (K - 1)(1 - s) when e itself was dropped; docs/cost-model.md). */
static void scenario_logs(const ms_routing_t *r, int32_t l, double *lq, double *lf)
{
    int32_t E = r->n_experts;
    double s = r->stickiness[l];
    for (int32_t k = 0; k < r->n_scenarios; k++)
        for (int32_t e = 0; e < E; e++) {
            double q = fmin(r->q[((int64_t) k * r->n_layers + l) * E + e], 1.0 - 1e-16);
            lq[(int64_t) k * E + e] = log1p(-q);
            lf[(int64_t) k * E + e] = log1p(-ms_fresh_rate(q, s, r->top_k));
        }
}

/* Scenario combination j's step inclusion p (pc) and return rate f (pf): sequence b runs scenario (j + b) mod S
 * for tps tokens (ms_lru_hit_rate). Returns the step's distinct experts D. */
static double combination_rates(const ms_routing_t *r, int32_t batch, int32_t tps, int32_t j, const double *lq,
                                const double *lf, double *pc, double *pf)
{
    int32_t E = r->n_experts, S = r->n_scenarios;
    double D = 0.0;
    for (int32_t e = 0; e < E; e++) {
        double lg = 0.0, la = 0.0;
        for (int32_t b = 0; b < batch && b < S; b++) {
            int64_t reps = batch / S + (b < batch % S ? 1 : 0), at = (int64_t) ((j + b) % S) * E + e;
            lg += (double) reps * lq[at];
            la += (double) reps * lf[at];
        }
        pc[e] = 1.0 - exp(tps * lg);
        pf[e] = 1.0 - exp(tps * la);
        D += pc[e];
    }
    return D;
}

/* Expected LRU hit rate of routing layer l's `C` GPU slots (lru_chain_hits per scenario combination):
 * superposed request streams, combination j gives sequence b scenario (j + b) mod S. Each sequence re-picks
 * the token before's experts with the layer's stickiness s, so it picks an expert it did not use the token
 * before at the fresh rate f (scenario_logs; the stationary per-token rate staying q): an expert absent
 * from the step before returns with 1 - prod (1 - f)^tps over the sequences. When S
 * divides the batch every combination holds every scenario batch / S times (the same step up to the order
 * of a sum): one combination stands for all. Scratch: pc, pf and che [E], lq [S][E] (log(1 - q) per scenario)
 * and lf [S][E] (log(1 - f)). */
double ms_lru_hit_rate(const ms_routing_t *r, int32_t batch, int32_t tps, int32_t l, double C, double *pc,
                           double *pf, double *che, double *lq, double *lf)
{
    int32_t E = r->n_experts, S = r->n_scenarios, combos = batch % S == 0 ? 1 : S;
    double hsum = 0.0, dsum = 0.0;
    scenario_logs(r, l, lq, lf);
    for (int32_t j = 0; j < combos; j++) {
        double D = combination_rates(r, batch, tps, j, lq, lf, pc, pf), V = 0.0;
        if (D >= C && E <= MS_UNION_VAR_EXPERTS && (int64_t) batch * tps > 1)
            V = ms_union_variance(r, l, batch, tps, j, che);
        dsum += D;
        hsum += lru_chain_hits(pc, pf, E, C, r->top_k, V, che);
    }
    return dsum > 0.0 ? hsum / dsum : 0.0;
}

static double norm_cdf(double x) { return 0.5 * erfc(-x * 0.7071067811865476); }      /* standard normal */
static double norm_pdf(double x) { return exp(-0.5 * x * x) * 0.3989422804014327; }
/* One step of Newton's method on a decreasing function (value g, slope dg at th) that keeps to its bracket
 * [lo, hi], narrowed by th: the Newton iterate, or the bracket's midpoint where that leaves it. */
static double newton_in_bracket(double th, double g, double dg, double *lo, double *hi)
{
    double next;
    if (g > 0.0) *lo = th; else *hi = th;
    next = dg < 0.0 ? th - g / dg : 0.5 * (*lo + *hi);
    return next > *lo && next < *hi ? next : 0.5 * (*lo + *hi);
}

/* The count threshold th with sum_e P(n_e >= th) = cap for counts n_e ~ N(mu_e, sd_e^2): Newton's method from
 * th0 inside the bracket of a decreasing sum, bisecting whenever a step leaves it. */
static double lfu_threshold(const double *mu, const double *sd, int32_t E, double cap, double th0)
{
    double lo = DBL_MAX, hi = -DBL_MAX, th;
    for (int32_t e = 0; e < E; e++) {
        lo = fmin(lo, mu[e] - 40.0 * sd[e]);
        hi = fmax(hi, mu[e] + 40.0 * sd[e]);
    }
    th = th0 > lo && th0 < hi ? th0 : 0.5 * (lo + hi);
    for (int it = 0; it < 100; it++) {
        double g = -cap, dg = 0.0, next;
        for (int32_t e = 0; e < E; e++) {
            double z = (mu[e] - th) / sd[e];
            g += norm_cdf(z);
            dg -= norm_pdf(z) / sd[e];
        }
        next = newton_in_bracket(th, g, dg, &lo, &hi);
        if (!(fabs(next - th) > 1e-6 * (1.0 + fabs(th)))) return next;     /* counts: far finer than needed */
        th = next;
    }
    return th;
}

#define MS_LFU_POINTS 4
#define MS_LFU_COMBOS 4

/* Token memory, from the window tables: each expert's step inclusion pc (B sequences of tps tokens), return
 * rate pf (P(e in two consecutive steps) = 1 - 2 a(tps) + a(2 tps), so f = (p - both) / (1 - p)) and, unless
 * p1 is NULL, one sequence's per-token inclusion p1. */
static void lfu_window_rates(const ms_routing_t *r, int32_t batch, int32_t tps, int32_t l, double *pc, double *pf,
                             double *p1)
{
    int32_t E = r->n_experts, W = r->n_window;
    const double *row = r->win_lq + (int64_t) l * E * W;
    win_seg_t s0 = window_segment(r, 1.0), s1 = window_segment(r, tps), s2 = window_segment(r, 2.0 * tps);
    for (int32_t e = 0; e < E; e++) {
        double x1 = exp(batch * window_lq(row + (int64_t) e * W, s1));
        double x2 = exp(batch * window_lq(row + (int64_t) e * W, s2));
        pc[e] = 1.0 - x1;
        pf[e] = x1 > 0.0 ? fmin(1.0, fmax(0.0, (x1 - x2) / x1)) : 1.0;
        if (p1) p1[e] = 1.0 - exp(window_lq(row + (int64_t) e * W, s0));
    }
}

/* Point m of the MS_LFU_POINTS midpoints of [warmup, steps) at which the LFU rates are taken. */
static double lfu_point(int m, double steps, double warmup)
{
    return warmup + (m + 0.5) * (steps - warmup) / MS_LFU_POINTS;
}

/* log(1 - q) and log(1 - f) per scenario into lq and lf (scenario_logs), and the step inclusion's mean and variance over the
 * scenario combinations into pbar and pvar (what earlier requests counted). */
static void lfu_request_spread(const ms_routing_t *r, int32_t batch, int32_t tps, int32_t l, double *pbar,
                               double *pvar, double *lq, double *lf)
{
    int32_t E = r->n_experts, S = r->n_scenarios;
    scenario_logs(r, l, lq, lf);
    for (int32_t e = 0; e < E; e++) pbar[e] = pvar[e] = 0.0;
    for (int pass = 0; pass < 2; pass++)        /* the combinations' mean, then their variance */
        for (int32_t j = 0; j < S; j++)
            for (int32_t e = 0; e < E; e++) {
                double lg = 0.0, x;
                for (int32_t b = 0; b < batch && b < S; b++)
                    lg += (double) (batch / S + (b < batch % S ? 1 : 0)) * lq[(int64_t) ((j + b) % S) * E + e];
                x = 1.0 - exp(tps * lg);
                if (pass == 0) pbar[e] += x / S; else pvar[e] += (x - pbar[e]) * (x - pbar[e]) / S;
            }
}

/* A window length's place among the count moments' lengths r->win_m: the value there is (1 - w) row[lo] +
 * w row[hi], linear between the lengths and beyond the last; lo = -1 below the first (a count over no tokens
 * has no variance: from 0), as with a single length. */
typedef struct {
    int32_t lo, hi;
    double w;
} moment_seg_t;

static moment_seg_t moment_segment(const ms_routing_t *r, double n)
{
    const double *x = r->win_m;
    int32_t lo, hi;
    moment_seg_t s;
    if (n <= x[0] || r->n_moment == 1) {
        s.lo = -1;
        s.hi = 0;
        s.w = n / x[0];
        return s;
    }
    node_segment(x, r->n_moment, n, &lo, &hi);
    s.lo = lo;
    s.hi = hi;
    s.w = (n - x[lo]) / (x[hi] - x[lo]);
    return s;
}

static double moment_at(const double *row, moment_seg_t s)
{
    return (s.lo < 0 ? 0.0 : (1.0 - s.w) * row[s.lo]) + s.w * row[s.hi];
}

/* P(n >= x) for a count n ~ Gamma(shape k, scale theta) (mean k theta): Wilson and Hilferty's cube-root normal
 * approximation of the upper tail at x / theta (within ~0.002 of the regularized incomplete gamma on these
 * tables); 0 for a count that is always 0 (k <= 0). */
static double gamma_tail(double k, double theta, double x)
{
    if (!(k > 0.0)) return 0.0;
    if (!(x > 0.0)) return 1.0;
    return norm_cdf(-(cbrt(x / (k * theta)) - (1.0 - 1.0 / (9.0 * k))) * 3.0 * sqrt(k));
}

/* The count threshold th with sum_e P(n_e >= th) = cap for counts n_e ~ Gamma(k_e, theta_e): Newton's method on
 * the decreasing sum (its slope from the tails' normal densities) inside a bracket from [0, 40 x the largest
 * mean + sd], bisecting whenever a step leaves it. */
static double lfu_gamma_threshold(const double *k, const double *theta, int32_t E, double cap)
{
    double lo = 0.0, hi = 0.0, th;
    for (int32_t e = 0; e < E; e++) hi = fmax(hi, 40.0 * (k[e] * theta[e] + sqrt(k[e]) * theta[e]) + 1.0);
    th = 0.5 * hi;
    for (int it = 0; it < 100; it++) {
        double g = -cap, dg = 0.0, next;
        for (int32_t e = 0; e < E; e++) {
            double u, z;
            if (!(k[e] > 0.0)) continue;
            u = cbrt(th / (k[e] * theta[e]));
            z = (u - (1.0 - 1.0 / (9.0 * k[e]))) * 3.0 * sqrt(k[e]);
            g += norm_cdf(-z);
            dg -= norm_pdf(z) * sqrt(k[e]) / (u * u * k[e] * theta[e]);
        }
        next = newton_in_bracket(th, g, dg, &lo, &hi);
        if (!(fabs(next - th) > 1e-6 * (1.0 + fabs(th)))) return next;
        th = next;
    }
    return th;
}

/* Hits per step on the previous step's last miss, resident beside the C - 1 most counted: it returns with
 * probability back / miss (back = sum_e P(e in both steps) (1 - P(resident)), misses = sum_e p_e (1 - P)), unless
 * the step's first access misses (miss / D: accesses go in id order, popularity-blind) while every resident
 * is needed again (exp(all), all = sum_e P_e log P(e needed | resident)): ms_cache.c's victim() then takes the
 * least counted needed expert, the last miss, before its access. */
static double last_miss_hits(double miss, double back, double D, double all)
{
    if (!(miss > 0.0)) return 0.0;
    return fmin(1.0, miss) * back / miss * (1.0 - fmin(1.0, miss / D) * exp(all));
}

/* LFU under token memory at one token per step, from one sequence's count moments (win_var, win_cov): an
 * expert's step inclusion p over the batch's B sequences (the windows), its count over the t steps since the
 * run began with mean t p and variance V = t p (1 - p) + g K + 1/4, K = Var N_t - t p1 (1 - p1) (the sequence's
 * count variance beyond independent tokens, p1 its per-token inclusion; every sequence starts a request at step
 * 0, and the moments count inside requests as far as they last), and the step's presence x correlated with the
 * count: Cov = g Cov(N_t, x), where g = B ((1 - p) / (1 - p1))^2 carries one sequence's fluctuations to the
 * step's union (to first order). Counts are skewed where requests favour an expert or ignore it: a gamma of
 * that mean and variance (shape k = (t p)^2 / V, scale V / (t p)). The C - 1 most counted are resident
 * (lfu_gamma_threshold), the last miss beside them (as ms_lfu_hit_rate); x regressed on the count,
 * E[x 1{n >= th}] = p Q_k + (Cov / scale) (Q_k+1 - Q_k), Q_a = P(Gamma(a) >= th): the experts this stretch of
 * requests favours are both counted and asked for. Scratch pc, pf, mu (shapes), sd (scales), p1, cv [E]. */
static double lfu_moment_hits(const ms_routing_t *r, int32_t batch, int32_t l, double C, double steps,
                              double warmup, double *pc, double *pf, double *mu, double *sd, double *p1, double *cv, double *forced)
{
    int32_t E = r->n_experts, M = r->n_moment;
    double D = 0.0, support = 0.0, hsum = 0.0, dsum = 0.0, fsum = 0.0;
    lfu_window_rates(r, batch, 1, l, pc, pf, p1);
    for (int32_t e = 0; e < E; e++) {
        D += pc[e];
        support += pc[e] > 0.0;
    }
    for (int m = 0; m < MS_LFU_POINTS; m++) {
        double t = lfu_point(m, steps, warmup), h = 0.0, miss = 0.0, back = 0.0;
        moment_seg_t seg = moment_segment(r, t);
        for (int32_t e = 0; e < E; e++) {
            const double *v = r->win_var + ((int64_t) l * E + e) * M, *c = r->win_cov + ((int64_t) l * E + e) * M;
            double p = pc[e], ratio = p1[e] < 1.0 ? (1.0 - p) / (1.0 - p1[e]) : 0.0, gain = batch * ratio * ratio;
            double var = fmax(t * p * (1.0 - p) + gain * (moment_at(v, seg) - t * p1[e] * (1.0 - p1[e])), 0.0) + 0.25;
            mu[e] = p > 0.0 ? t * p * t * p / var : 0.0;        /* the gamma's shape */
            sd[e] = p > 0.0 ? var / (t * p) : 1.0;              /* and scale */
            cv[e] = gain * moment_at(c, seg);
        }
        if (support <= C) {
            h = D;
        } else if (C >= 1.0) {
            double th = C - 1.0 > 0.0 ? lfu_gamma_threshold(mu, sd, E, C - 1.0) : DBL_MAX, all = 0.0;
            for (int32_t e = 0; e < E; e++) {
                double q = gamma_tail(mu[e], sd[e], th), p = pc[e];
                double joint = pc[e] > 0.0 ? cv[e] / sd[e] * (gamma_tail(mu[e] + 1.0, sd[e], th) - q) : 0.0;
                h += p * q + joint;
                miss += p * (1.0 - q) - joint;
                back += (p - (1.0 - p) * pf[e]) * (1.0 - q);
                if (q > 0.0) all += q * log(fmax(fmin(1.0, (p * q + joint) / q), 1e-300));
            }
            h += last_miss_hits(miss, back, D, all);
            fsum += exp(all) * D;
        }
        hsum += fmin(fmax(h, 0.0), D);
        dsum += D;
    }
    *forced = dsum > 0.0 ? fsum / dsum : 0.0;
    return dsum > 0.0 ? hsum / dsum : 0.0;
}

/* Expected LFU hit rate of routing layer l's C GPU slots over steps [warmup, steps) of a run (ms_cache.c: every
 * access counts, every miss is inserted, the victim is the least counted expert the step no longer needs, so a
 * step's misses displace each other and one survives it). At step t the cache holds the C - 1 most counted
 * experts and the previous step's last miss. Counts since the run began: requests last request_tokens
 * tokens (R steps) and every sequence starts one at step 0, so at step t the current request has run tcur =
 * t mod R steps (t in the first request; where a quarter of the run spans a request or more, a stratified
 * phase in [0, R): points a whole number of requests apart would sit at one phase) with the combination's step inclusion p (a sticky chain: variance
 * p (1 - p)(2 p / f - 1) per step) and the earlier ones t - tcur steps at the mean over combinations (variance
 * p (1 - p) per step, plus R var_j(p) per step between requests). n_e ~ normal (the current request's skew is
 * in its combination's p); the threshold of the C - 1 most counted (lfu_threshold) gives P_e; hits per step =
 * sum_e p_e P_e + the last miss (last_miss_hits: misses = sum_e p_e (1 - P_e), back = sum_e both_e (1 - P_e),
 * both_e = p - (1 - p) f, e in two consecutive steps). Averaged at MS_LFU_POINTS midpoints of [warmup, steps)
 * and over scenario combinations (as ms_lru_hit_rate); under token memory p and f from the window tables (with
 * count moments at one token per step: lfu_moment_hits, whose counts hold the requests' skew: gammas). *forced: the
 * D-weighted share of steps needing every resident, exp(all) (ms_analytic.c lfu_layer). Scratch: pc, pf, mu, sd,
 * pbar, pvar [E], lq and lf [S][E]. */
double ms_lfu_hit_rate(const ms_routing_t *r, int32_t batch, int32_t tps, int32_t l, double C, double steps,
                           double warmup, double *pc, double *pf, double *mu, double *sd, double *pbar,
                           double *pvar, double *lq, double *lf, double *forced)
{
    /* up to MS_LFU_COMBOS combinations, spread over the S (the counts' threshold costs ~8 normal sums each) */
    int32_t E = r->n_experts, S = r->n_scenarios, combos = batch % S == 0 || r->win_lq ? 1 : S;
    int32_t stride = combos > MS_LFU_COMBOS ? combos / MS_LFU_COMBOS : 1;
    double R = r->request_tokens > 0 ? (double) r->request_tokens / tps : 0.0, hsum = 0.0, dsum = 0.0, th = 0.0;
    double width = (steps - warmup) / MS_LFU_POINTS, fsum = 0.0;
    if (r->win_lq && r->win_var && tps == 1)
        return lfu_moment_hits(r, batch, l, C, steps, warmup, pc, pf, mu, sd, pbar, pvar, forced);
    if (r->win_lq) {
        lfu_window_rates(r, batch, tps, l, pc, pf, NULL);
        for (int32_t e = 0; e < E; e++) {          /* one combination: the earlier requests' mean is its own */
            pbar[e] = pc[e];
            pvar[e] = 0.0;
        }
    } else {
        lfu_request_spread(r, batch, tps, l, pbar, pvar, lq, lf);
    }
    for (int32_t j = 0; j < combos; j += stride) {
        double D = 0.0, support = 0.0;
        if (!r->win_lq) combination_rates(r, batch, tps, j, lq, lf, pc, pf);
        for (int32_t e = 0; e < E; e++) {
            D += pc[e];
            support += pc[e] > 0.0;
        }
        for (int m = 0; m < MS_LFU_POINTS; m++) {
            /* a point of the run; past the first request its phase in the current one (above) */
            double t = lfu_point(m, steps, warmup);
            double tcur = R > 0.0 && t >= R ? (width < R ? fmod(t, R) : (m + 0.5) * R / MS_LFU_POINTS) : t;
            double tprev = t - tcur;
            double h = 0.0, miss = 0.0, back = 0.0, all = 0.0;
            for (int32_t e = 0; e < E; e++) {
                double p = pc[e], disp = pf[e] > 1e-12 ? fmax(2.0 * p / pf[e] - 1.0, 1.0) : 1e12;
                mu[e] = tprev * pbar[e] + tcur * p;
                sd[e] = sqrt(tprev * pbar[e] * (1.0 - pbar[e]) + tprev * R * pvar[e] + tcur * p * (1.0 - p) * disp + 0.25);
            }
            if (support <= C) {             /* every expert the combination uses fits: nothing is evicted */
                h = D;
            } else {
                th = lfu_threshold(mu, sd, E, fmax(C - 1.0, 0.0), th);
                for (int32_t e = 0; e < E; e++) {
                    double P = C - 1.0 > 0.0 ? norm_cdf((mu[e] - th) / sd[e]) : 0.0, p = pc[e];
                    h += p * P;
                    miss += p * (1.0 - P);
                    back += (p - (1.0 - p) * pf[e]) * (1.0 - P);
                    if (P > 0.0) all += P * log(fmax(p, 1e-300));
                }
                if (C >= 1.0) h += last_miss_hits(miss, back, D, all);
                fsum += C >= 1.0 ? exp(all) * D : 0.0;
            }
            hsum += fmin(h, D);
            dsum += D;
        }
    }
    *forced = dsum > 0.0 ? fsum / dsum : 0.0;
    return dsum > 0.0 ? hsum / dsum : 0.0;
}
