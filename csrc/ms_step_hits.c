/*
 * LRU hits per step when one step needs more experts than the slots hold (D > C): the analytic path's
 * (ms_cache_rates.c lru_chain_hits, ms_window_hits) reading of what the Monte Carlo cache does then. A step
 * serves its union in id order (ms_route.c order_unions), so after a step the C slots hold its C highest-id
 * experts; the next step hits those it needs, less one when every resident is needed again and the step's
 * first access misses (ms_cache.c lru_victim then evicts the oldest resident, a needed one).
 */
#include <math.h>

#include "ms_internal.h"

/* The id-order reading, experts independent: R = the previous step's C highest-id experts. Hits per step =
 * sum_a P(a in both steps) P(fewer than C of the previous step above a), less
 * sum_a P(a is R's lowest, R inside the step) P(some expert below a in the step); the first from a walk down the
 * ids over j = previous-step experts seen above (g_j), the second over the same with all of them returning (h_j).
 * C < MS_MAX_TOP_K (the caller's limit). */
static double id_order_hits(const double *p, const double *both, int32_t E, int32_t C)
{
    double g[MS_MAX_TOP_K], h[MS_MAX_TOP_K], lsum = 0.0, labove = 0.0, hits = 0.0, loss = 0.0;
    int32_t zeros = 0, zabove = 0;
    for (int32_t e = 0; e < E; e++) {
        if (p[e] < 1.0) lsum += log1p(-p[e]);
        else zeros++;
    }
    for (int32_t j = 0; j < C; j++) g[j] = h[j] = 0.0;
    g[0] = h[0] = 1.0;
    for (int32_t a = E - 1; a >= 0; a--) {
        double q = p[a], b = both[a], fewer = 0.0, below;
        if (q < 1.0) labove += log1p(-q);
        else zabove++;
        /* prod_{e < a} (1 - p_e): none below a in the step */
        below = zeros > zabove ? 0.0 : exp(lsum - labove);
        for (int32_t j = 0; j < C; j++) fewer += g[j];
        hits += b * fewer;
        loss += h[C - 1] * b * (1.0 - below);
        for (int32_t j = C - 1; j >= 1; j--) {
            g[j] = g[j] * (1.0 - q) + g[j - 1] * q;
            h[j] = h[j] * (1.0 - q) + h[j - 1] * b;
        }
        g[0] *= 1.0 - q;
        h[0] *= 1.0 - q;
    }
    return fmax(0.0, hits - loss);
}

/* The popularity-blind reading over the previous step's distinct count d, a normal of mean D and variance V on
 * d = 1..E (C / d is convex: at the mean D it reads the steps with few distinct experts low): d >= C keeps C of the
 * d, less the first-access loss; d < C keeps all d and C - d older experts, each back at the rate of an expert
 * absent from the step before (f = (p - both) / (1 - p), weighted by p (1 - p)). */
static double mixed_blind(const double *p, const double *both, int32_t E, double C, double D, double V,
                          double both_sum, double lret)
{
    double fnum = 0.0, fden = 0.0, fbar, wsum = 0.0, h = 0.0;
    for (int32_t e = 0; e < E; e++) {
        fnum += p[e] * (p[e] - both[e]);
        fden += p[e] * (1.0 - p[e]);
    }
    fbar = fden > 0.0 ? fnum / fden : 0.0;
    for (int32_t d = 1; d <= E; d++) {
        double wd = exp(-0.5 * (d - D) * (d - D) / V), hd;
        hd = d >= C ? both_sum * C / d - fmin(1.0, d - C) * exp(C * lret / d) : both_sum + (C - d) * fbar;
        wsum += wd;
        h += wd * fmax(0.0, hd);
    }
    return wsum > 0.0 ? h / wsum : 0.0;
}

/* The variance of scenario combination j's step union count over routing layer l's experts (sequence b runs
 * scenario (j + b) mod S for tps tokens; tokens independent, each picking exactly k: a single token's count does
 * not vary): sum_e a_e (1 - a_e) + sum_{e != f} (a_ef - a_e a_f), a_e = P(e absent) = prod (1 - q_e), a_ef =
 * prod (1 - q_e - q_f + q_ef) with a fixed-size design's pair inclusion q_ef = q_e q_f (k - 1) / (k - (q_e + q_f) / 2)
 * (its sum over f is (k - 1) q_e). O(E^2 min(batch, S)), so read up to MS_UNION_VAR_EXPERTS experts: the spread
 * matters where a step holds few experts (Mixtral and grok-1 at 4 slots, batch 4: -0.019 / -0.021 -> -0.002 against
 * Monte Carlo); the catalog's 32-expert families read within 0.007 without it (bench_che.py --families). Scratch a [E]. */
double ms_union_variance(const ms_routing_t *r, int32_t l, int32_t batch, int32_t tps, int32_t j, double *a)
{
    int32_t E = r->n_experts, S = r->n_scenarios, L = r->n_layers, B = batch < S ? batch : S, more = batch % S;
    /* sequences b < batch mod S run reps + 1 times, the rest reps (batch < S: each once, all b < more): two
     * products, two powers (an empty product is 1, and pow(1, n) = 1) */
    double k = r->top_k, V = 0.0, n1 = (double) (batch / S + 1) * tps, n0 = (double) (batch / S) * tps;
    for (int32_t e = 0; e < E; e++) {
        double x1 = 1.0, x0 = 1.0;
        for (int32_t b = 0; b < B; b++) {
            double x = 1.0 - fmin(r->q[((int64_t) ((j + b) % S) * L + l) * E + e], 1.0 - 1e-16);
            if (b < more) x1 *= x; else x0 *= x;
        }
        a[e] = pow(x1, n1) * pow(x0, n0);
    }
    for (int32_t e = 0; e < E; e++) {
        V += a[e] * (1.0 - a[e]);
        for (int32_t f = e + 1; f < E; f++) {
            double x1 = 1.0, x0 = 1.0;
            for (int32_t b = 0; b < B; b++) {
                const double *q = r->q + ((int64_t) ((j + b) % S) * L + l) * E;
                double qe = fmin(q[e], 1.0 - 1e-16), qf = fmin(q[f], 1.0 - 1e-16);
                double x = fmax(1.0 - qe - qf + qe * qf * (k - 1.0) / (k - 0.5 * (qe + qf)), 0.0);
                if (b < more) x1 *= x; else x0 *= x;
            }
            V += 2.0 * (pow(x1, n1) * pow(x0, n0) - a[e] * a[f]);
        }
    }
    return fmax(V, 0.0);
}

/* Hits per step of C slots when the step needs D > C experts: p[e] the step's inclusion, both[e] P(e in two
 * consecutive steps), k experts per token. The popularity-blind reading: C of the previous step's D experts stay,
 * so (C / D) sum_e both_e, less the needed resident the first access evicts when every resident is needed again,
 * with probability the product of the residents' return rates (exp(C lret / D), lret = sum_e p_e log(both_e / p_e))
 * times the share of D beyond C (capped at 1). It misses that the first access may be a resident, which counts
 * while the slots hold under a step's picks: up to D / 2 slots the id-order reading (id_order_hits) is used, from
 * 3D / 4 on the blind one, linearly between, D at least k (the hand-over chosen against Monte Carlo,
 * docs/cost-model.md; at k rather than D, Mixtral at 2 slots and batch 2 read 0.022 low, at D 0.017). V > 0: the
 * variance of the previous step's distinct count, read by mixed_blind (V = 0: the mean D alone). */
double ms_full_step_hits(const double *p, const double *both, int32_t E, double C, double D, int32_t k, double V)
{
    double both_sum = 0.0, lret = 0.0, blind, w;
    for (int32_t e = 0; e < E; e++) {
        if (!(p[e] > 0.0)) continue;
        both_sum += both[e];
        lret += p[e] * log(fmax(both[e] / p[e], 1e-300));
    }
    blind = V > 0.0 ? mixed_blind(p, both, E, C, D, V, both_sum, lret)
                    : fmax(0.0, both_sum * C / D - fmin(1.0, D - C) * exp(C * lret / D));
    w = fmin(1.0, fmax(0.0, 3.0 - 4.0 * C / fmax(D, (double) k)));
    if (!(w > 0.0) || C < 1.0 || C >= MS_MAX_TOP_K) return blind;   /* id_order_hits' arrays hold MS_MAX_TOP_K */
    return w * id_order_hits(p, both, E, (int32_t) C) + (1.0 - w) * blind;
}
