/*
 * The routing sampler of the decode kernel: per-request popularity draws, one token's top-k (sticky
 * re-picks, weighted sampling without replacement, group-limited routing) or a recorded trace, and each
 * step's union of the batch's experts. Streams are named by (seed, configuration, sequence, step)
 * (ms_rng.c).
 */
#include <math.h>
#include <string.h>

#include "ms_internal.h"

#define MS_TINY 1e-300
#define MS_ALIAS_TRIES 16      /* alias draws of one pick before the cumulative scan (alias_draw) */

/* ------------------------------------------------------------------------- Exp(1) draws */

#define MS_ZIG_R 7.697117470131487         /* the ziggurat's rightmost strip edge */
#define MS_ZIG_V 3.949659822581572e-3      /* the area of each strip */
#define MS_TWO53 9007199254740992.0

/* The tables of the exponential ziggurat (Marsaglia & Tsang 2000, zigset), scaled to 53-bit draws. */
static void zig_build(ms_zig_t *z)
{
    double de = MS_ZIG_R, te = de, q = MS_ZIG_V / exp(-de);
    z->k[0] = (uint64_t) (de / q * MS_TWO53);
    z->k[1] = 0;
    z->w[0] = q / MS_TWO53;
    z->w[255] = de / MS_TWO53;
    z->f[0] = 1.0;
    z->f[255] = exp(-de);
    for (int i = 254; i >= 1; i--) {
        de = -log(MS_ZIG_V / de + exp(-de));
        z->k[i + 1] = (uint64_t) (de / te * MS_TWO53);
        te = de;
        z->f[i] = exp(-de);
        z->w[i] = de / MS_TWO53;
    }
}

/* One Exp(1) draw: the low 8 bits of a step pick the strip, its high 53 bits the value; outside the
 * strip's rectangle, the wedge test (one uniform, one exp) or the tail (r - log u), else a fresh step. */
static inline double zig_exp(const ms_zig_t *z, ms_rng_t *rng)
{
    for (;;) {
        uint64_t v = ms_rng_next_inline(rng), j = v >> 11;
        int32_t i = (int32_t) (v & 255);
        double x;
        if (j < z->k[i]) return (double) j * z->w[i];
        if (i == 0) return MS_ZIG_R - log(ms_rng_uniform_inline(rng));
        x = (double) j * z->w[i];
        if (z->f[i] + ms_rng_uniform_inline(rng) * (z->f[i - 1] - z->f[i]) < exp(-x)) return x;
    }
}

/* ------------------------------------------------------------------------- alias tables */

/* Walker's alias table of the m weights w (Vose's construction): column i keeps i with chance prob[i],
 * else gives alias[i] (an index in 0..m-1). Returns the sum of the weights. stk: 2m ints of scratch. */
static double alias_build(const double *w, int32_t m, double *prob, int32_t *alias, int32_t *stk)
{
    double tot = 0.0, scale;
    int32_t *small = stk, *large = stk + m, ns = 0, nl = 0;
    for (int32_t i = 0; i < m; i++) tot += w[i];
    scale = (double) m / tot;
    for (int32_t i = 0; i < m; i++) {
        prob[i] = w[i] * scale;
        alias[i] = i;
        if (prob[i] < 1.0) small[ns++] = i; else large[nl++] = i;
    }
    while (ns > 0 && nl > 0) {
        int32_t a = small[--ns], g = large[--nl];
        alias[a] = g;
        prob[g] = (prob[g] + prob[a]) - 1.0;
        if (prob[g] < 1.0) small[ns++] = g; else large[nl++] = g;
    }
    while (nl > 0) prob[large[--nl]] = 1.0;
    while (ns > 0) prob[small[--ns]] = 1.0;
    return tot;
}

/* The cumulative scan of alias_draw: one uniform against the cumulative weights of the experts of the
 * block not marked `stamp` in skip. */
static int32_t alias_scan(const double *w, int32_t base, int32_t m, const int32_t *skip, int32_t stamp,
                          ms_rng_t *rng)
{
    double tot = 0.0, u, cum = 0.0;
    int32_t last = -1;
    for (int32_t e = base; e < base + m; e++)
        if (skip[e] != stamp) tot += w[e];
    u = ms_rng_uniform_inline(rng) * tot;
    for (int32_t e = base; e < base + m; e++) {
        if (skip[e] == stamp) continue;
        last = e;
        cum += w[e];
        if (u < cum) return e;
    }
    return last;
}

/* One expert of block [base, base + m) in proportion to w among those not marked `stamp` in skip: up to
 * MS_ALIAS_TRIES alias draws of one uniform each (column floor(u m), its coin the fraction u m - column),
 * redrawn while they hit a skipped expert; then (rare: the skipped experts hold most of the weight) the
 * cumulative scan. Either way the pick has the same law, so every pick of a token is the next of sampling
 * without replacement. The block must hold an expert not skipped. */
static inline int32_t alias_draw(const double *w, const double *prob, const int32_t *alias, int32_t base,
                                 int32_t m, const int32_t *skip, int32_t stamp, ms_rng_t *rng)
{
    for (int32_t a = 0; a < MS_ALIAS_TRIES; a++) {
        double x = ms_rng_uniform_inline(rng) * m;
        int32_t i = (int32_t) x, e;
        if (i >= m) i = m - 1;
        e = base + (x - i < prob[base + i] ? i : alias[base + i]);
        if (skip[e] != stamp) return e;
    }
    return alias_scan(w, base, m, skip, stamp, rng);
}

/* Fresh request for sequence b: per-layer weights w ~ Dirichlet(beta * E * g) (unnormalised: the
 * sampler only compares ratios), or w = g without per-request skew, and their alias tables (one per
 * expert group under group-limited routing, else one per layer). */
static void new_request(const ms_routing_t *r, ws_t *ws, int32_t b, ms_rng_t *rng)
{
    int32_t E = ws->E, NB = ws->NB, per = E / NB;
    for (int32_t l = 0; l < ws->L; l++) {
        const double *lp = r->log_pop + (int64_t) l * E;
        int64_t row = ((int64_t) b * ws->L + l) * E;
        double *w = ws->w + row, mx = lp[0], z = 0.0;
        ws->nprev[b * ws->L + l] = 0;
        ws->nhist[b * ws->L + l] = 0;
        ws->hhead[b * ws->L + l] = 0;
        for (int32_t e = 1; e < E; e++) mx = fmax(mx, lp[e]);
        for (int32_t e = 0; e < E; e++) z += exp(lp[e] - mx);
        for (int32_t e = 0; e < E; e++) {
            double g = exp(lp[e] - mx) / z;
            double x = r->concentration > 0.0 ? ms_rng_gamma(rng, r->concentration * E * g) : g;
            w[e] = x > MS_TINY ? x : MS_TINY;
        }
        for (int32_t g = 0; g < NB; g++)
            ws->btot[((int64_t) b * ws->L + l) * NB + g] = alias_build(w + g * per, per, ws->aprob + row + g * per,
                                                                      ws->alias + row + g * per, ws->stk);
    }
}

/* The multi-lag memory: each of the K - n free slots copies, with probability recency[l], a uniformly
 * chosen expert of the token `lag` + 2 back (the token's lag, shared by its layers) unless it is already
 * picked or the request is not that long. Returns the new pick count. */
static int32_t recall_older(const ms_routing_t *r, ws_t *ws, int32_t b, int32_t l, ms_rng_t *rng, int32_t stamp,
                            int32_t lag, int32_t n, int32_t *out)
{
    int32_t K = ws->K, H = r->history, bl = b * ws->L + l, free = K - n;
    for (int32_t a = 0; a < free; a++) {
        int32_t e;
        if (!(ms_rng_uniform_inline(rng) < r->recency[l]) || lag >= ws->nhist[bl]) continue;
        e = ws->hist[((int64_t) bl * H + (ws->hhead[bl] - 1 - lag + H) % H) * K + (int32_t) (ms_rng_uniform_inline(rng) * K)];
        if (ws->chosen[e] == stamp) continue;
        out[n++] = e;
        ws->chosen[e] = stamp;
    }
    return n;
}

/* Cross-layer dependence: free slot a (of K - n) takes, with probability coupling[l], a partner of the
 * token's a-th expert at layer l - 1, chosen in proportion to the request's weights w (so requests prefer
 * their own paths), unless already picked. Returns the new pick count. */
static int32_t follow_partners(const ms_routing_t *r, ws_t *ws, int32_t l, ms_rng_t *rng, int32_t stamp,
                               const double *w, const int32_t *up, int32_t n, int32_t *out)
{
    int32_t K = ws->K, P = r->n_partners, free = K - n;
    const int32_t *pt = r->partners + (int64_t) (l - 1) * ws->E * P;
    for (int32_t a = 0; a < free; a++) {
        const int32_t *cand = pt + (int64_t) up[a] * P;
        double tot = 0.0, u, cum = 0.0;
        int32_t e = cand[P - 1];
        if (!(ms_rng_uniform_inline(rng) < r->coupling[l])) continue;
        for (int32_t i = 0; i < P; i++) tot += w[cand[i]];
        u = ms_rng_uniform_inline(rng) * tot;
        for (int32_t i = 0; i < P - 1; i++) {
            cum += w[cand[i]];
            if (u < cum) { e = cand[i]; break; }
        }
        if (ws->chosen[e] == stamp) continue;
        out[n++] = e;
        ws->chosen[e] = stamp;
    }
    return n;
}

/* The token's memory lag (index into recency_lag) for all its layers. */
static int32_t draw_lag(const ms_routing_t *r, ms_rng_t *rng)
{
    double u = ms_rng_uniform_inline(rng), cum = 0.0;
    for (int32_t i = 0; i < r->history - 1; i++) {
        cum += r->recency_lag[i];
        if (u < cum) return i;
    }
    return r->history - 1;
}

/* The next smallest race key Exp(1) / w_e of group g (its experts g per .. g per + per - 1) and its expert
 * (*e; -1 and an infinite key once every expert of the group is drawn). The keys of a group are independent
 * exponentials of rates w_e, so the next one is the last plus Exp(1) / (the weight not yet drawn; Exp(1)
 * from the ziggurat z) and its expert is drawn in proportion to w among those not yet drawn (memorylessness). */
static double next_key(const ms_zig_t *z, const double *w, const double *prob, const int32_t *alias, int32_t g,
                       int32_t per, ms_group_t *q, int32_t *seen, int32_t stamp, ms_rng_t *rng, int32_t *e)
{
    double k;
    if (q->n == per) {
        *e = -1;
        return HUGE_VAL;
    }
    k = q->c + zig_exp(z, rng) / q->rem;
    *e = alias_draw(w, prob, alias, g * per, per, seen, stamp, rng);
    seen[*e] = stamp;
    q->n++;
    q->c = k;
    q->rem -= w[*e];
    if (q->n < per && !(q->rem > q->tot * 1e-9)) {
        /* the running difference lost its digits: sum the weights not yet drawn */
        q->rem = 0.0;
        for (int32_t x = g * per; x < (g + 1) * per; x++)
            if (seen[x] != stamp) q->rem += w[x];
    }
    return k;
}

/* Group-limited routing, the free slots n..K-1 of a token: the race's keys Exp(1) / w_e are generated per
 * group from the smallest up (next_key), so a group ranks by its two smallest after two draws, not one per
 * expert: by a b, the order of log a + log b (the sum of its two best Gumbel scores) without the logs (keys
 * are ~1 / the group's weight, so the product stays normal unless a group's weight is below ~1e-150). The groups of the n kept experts come
 * first, the best others fill topk_group; the free slots take the smallest keys of the allowed groups not
 * already picked, merged across groups in key order (ties to the lower group). */
static void route_grouped(const ms_routing_t *r, ws_t *ws, const double *w, const double *prob,
                          const int32_t *alias, const double *btot, ms_rng_t *rng, int32_t stamp, int32_t n,
                          int32_t *out)
{
    int32_t E = ws->E, K = ws->K, G = r->n_group, per = E / G, picked = 0;
    ms_group_t *gr = ws->grp;
    for (int32_t g = 0; g < G; g++) {
        ms_group_t *q = &gr[g];
        double a;
        q->tot = q->rem = btot[g];
        q->c = 0.0;
        q->n = q->stage = q->pick = 0;
        a = next_key(ws->zig, w, prob, alias, g, per, q, ws->seen, stamp, rng, &q->he);
        q->hk = a;
        q->k2 = next_key(ws->zig, w, prob, alias, g, per, q, ws->seen, stamp, rng, &q->e2);
        q->score = per > 1 ? a * q->k2 : a;
    }
    for (int32_t j = 0; j < n; j++) {
        ms_group_t *q = &gr[out[j] / per];
        if (!q->pick) { q->pick = 1; picked++; }
    }
    while (picked < r->topk_group) {
        int32_t best = -1;
        for (int32_t g = 0; g < G; g++)
            if (!gr[g].pick && (best < 0 || gr[g].score < gr[best].score)) best = g;
        gr[best].pick = 1;
        picked++;
    }
    while (n < K) {
        int32_t best = -1, e;
        ms_group_t *q;
        for (int32_t g = 0; g < G; g++)
            if (gr[g].pick && gr[g].he >= 0 && (best < 0 || gr[g].hk < gr[best].hk)) best = g;
        q = &gr[best];
        e = q->he;
        if (q->stage == 0) {
            q->hk = q->k2;
            q->he = q->e2;
            q->stage = 1;
        } else {
            q->hk = next_key(ws->zig, w, prob, alias, best, per, q, ws->seen, stamp, rng, &q->he);
        }
        if (ws->chosen[e] != stamp) {
            out[n++] = e;
            ws->chosen[e] = stamp;
        }
    }
}

/* One token's top-k in routing layer l for sequence b; writes `out` (k ids), returns overlap with
 * the previous token's picks (-1 for a request's first token). Each kept expert of the previous
 * token stays with probability p; the other slots are the next picks of sampling without replacement in
 * proportion to the request's weights w (Plackett-Luce: the law of the K - n smallest race keys
 * Exp(1) / w_e, i.e. Gumbel-top-k on log w), one alias draw each (a redraw where it meets a picked expert).
 * Group-limited routing races the groups (route_grouped). */
static int32_t route_token(const ms_routing_t *r, ws_t *ws, int32_t b, int32_t l, ms_rng_t *rng, int32_t stamp,
                           int32_t lag, const int32_t *up, int32_t *out)
{
    int32_t E = ws->E, K = ws->K, n = 0, overlap = 0;
    int64_t bl = (int64_t) b * ws->L + l;
    int32_t *prev = ws->prev + bl * K;
    int32_t np = ws->nprev[bl];
    const double *w = ws->w + bl * E, *prob = ws->aprob + bl * E;
    const int32_t *alias = ws->alias + bl * E;
    double p = r->stickiness[l];
    /* the path through the layers first, so the memory below re-picks what the partners leave free */
    if (r->coupling && up && r->coupling[l] > 0.0) n = follow_partners(r, ws, l, rng, stamp, w, up, n, out);
    for (int32_t j = 0; j < np; j++) {
        /* one draw per previous expert whatever happens (the stream does not depend on the coupling) */
        if (ms_rng_uniform_inline(rng) < p && n < K && ws->chosen[prev[j]] != stamp) {
            out[n++] = prev[j];
            ws->chosen[prev[j]] = stamp;
        }
    }
    if (r->recency && np > 0) n = recall_older(r, ws, b, l, rng, stamp, lag, n, out);
    if (ws->NB > 1) {
        route_grouped(r, ws, w, prob, alias, ws->btot + bl * ws->NB, rng, stamp, n, out);
    } else {
        ms_rng_t lr = *rng;          /* a local copy stays in registers */
        for (; n < K; n++) {
            int32_t e = alias_draw(w, prob, alias, 0, E, ws->chosen, stamp, &lr);
            out[n] = e;
            ws->chosen[e] = stamp;
        }
        *rng = lr;
    }
    for (int32_t j = 0; j < np; j++) overlap += ws->chosen[prev[j]] == stamp;
    if (r->recency && np > 0) {   /* the previous token becomes lag 2 of the next */
        int32_t H = r->history;
        memcpy(ws->hist + (bl * H + ws->hhead[bl]) * K, prev, (size_t) K * sizeof(int32_t));
        ws->hhead[bl] = (ws->hhead[bl] + 1) % H;
        if (ws->nhist[bl] < H) ws->nhist[bl]++;
    }
    for (int32_t j = 0; j < K; j++) prev[j] = out[j];
    ws->nprev[bl] = K;
    return np > 0 ? overlap : -1;
}

/* One token's recorded picks for routing layer l of sequence b (trace row tp); *ov gets the overlap with
 * the previous token's picks (-1 for the first token). Returns 0 or MS_ERR_BAD_TRACE. */
static int replay_token(const ms_routing_t *r, ws_t *ws, int32_t b, int32_t l, int64_t tp, int32_t stamp,
                        int32_t *picks, int32_t *ov)
{
    int32_t E = ws->E, K = ws->K, L = ws->L;
    const int32_t *src = r->trace + (tp * r->trace_layers + (l % r->trace_layers)) * K;
    int32_t *prev = ws->prev + ((int64_t) b * L + l) * K;
    int32_t np = ws->nprev[b * L + l];
    *ov = 0;
    for (int32_t k = 0; k < K; k++) {
        if (src[k] < 0 || src[k] >= E) return MS_ERR_BAD_TRACE;
        picks[k] = src[k];
        ws->chosen[src[k]] = stamp;
    }
    for (int32_t k = 0; k < np; k++) *ov += ws->chosen[prev[k]] == stamp;
    if (np == 0) *ov = -1;
    for (int32_t k = 0; k < K; k++) prev[k] = picks[k];
    ws->nprev[b * L + l] = K;
    return 0;
}

/* Add one token's K picks in routing layer l to step t's union (row `row` of sel / cnt). */
static void add_to_union(ws_t *ws, int32_t l, int64_t t, int64_t row, int32_t *nsel, const int32_t *picks)
{
    int32_t E = ws->E;
    int32_t *mk = ws->mark + (int64_t) l * E;
    for (int32_t k = 0; k < ws->K; k++) {
        int32_t e = picks[k];
        if (mk[e] != (int32_t) (t + 1)) {
            mk[e] = (int32_t) (t + 1);
            ws->pos[(int64_t) l * E + e] = nsel[l];
            ws->sel[row + nsel[l]] = e;
            ws->cnt[row + nsel[l]] = 1;
            nsel[l]++;
        } else {
            ws->cnt[row + ws->pos[(int64_t) l * E + e]]++;
        }
    }
}

/* The step serves its experts in expert-id order (as fused MoE kernels walk them), so the order a cache
 * sees does not favour the first sequence's picks: re-order step t's unions by expert id. */
static void order_unions(ws_t *ws, int64_t t)
{
    int32_t E = ws->E, L = ws->L, W = ws->W;
    for (int32_t l = 0; l < L; l++) {
        int64_t row = (t * L + l) * (int64_t) W;
        const int32_t *mk = ws->mark + (int64_t) l * E;
        int32_t n = ws->nsel[t * L + l];
        if ((int64_t) n * n <= 4 * (int64_t) E) {
            /* a small union (batch 1: top-k of E): insertion-sort it rather than scan every expert */
            for (int32_t i = 0; i < n; i++) {
                int32_t e = ws->sel[row + i], c = ws->cnt[row + i], j = i;
                while (j > 0 && ws->usel[j - 1] > e) {
                    ws->usel[j] = ws->usel[j - 1];
                    ws->ucnt[j] = ws->ucnt[j - 1];
                    j--;
                }
                ws->usel[j] = e;
                ws->ucnt[j] = c;
            }
        } else {
            /* a compaction without branches: every expert is written, the next slot taken only if marked
             * (pos holds a position in 0..W-1 for every expert, so the count read is in the row) */
            const int32_t *ps = ws->pos + (int64_t) l * E;
            int32_t stamp = (int32_t) (t + 1);
            n = 0;
            for (int32_t e = 0; e < E; e++) {
                ws->usel[n] = e;
                ws->ucnt[n] = ws->cnt[row + ps[e]];
                n += mk[e] == stamp;
            }
        }
        memcpy(ws->sel + row, ws->usel, (size_t) n * sizeof(int32_t));
        memcpy(ws->cnt + row, ws->ucnt, (size_t) n * sizeof(int32_t));
    }
}

/* Reuse and selection counters of generate(). */
typedef struct {
    double reuse_num, reuse_den, selections;
} route_counts_t;

/* Token j of sequence b in step t: its picks in every routing layer (sampled or replayed), added to
 * the step's unions. Returns 0 or an error code. */
static int step_token(const ms_routing_t *r, const ms_decode_config_t *c, ws_t *ws, int64_t t, int32_t b, int32_t j,
                      ms_rng_t *rng, int32_t *stamp, route_counts_t *n)
{
    int32_t K = ws->K, L = ws->L, picks[MS_MAX_TOP_K], up[MS_MAX_TOP_K], lag = 0;
    int32_t *nsel = ws->nsel + t * L;
    int64_t tp = 0;
    if (r->trace) {
        tp = ws->trace_pos[b] % r->trace_tokens;
        ws->trace_pos[b] = tp + 1;
    } else if (ws->tok_in_req[b] == 0 || (r->request_tokens > 0 && ws->tok_in_req[b] >= r->request_tokens)) {
        new_request(r, ws, b, rng);
        ws->tok_in_req[b] = 0;
    }
    ws->tok_in_req[b]++;
    if (!r->trace && r->recency) lag = draw_lag(r, rng);
    for (int32_t l = 0; l < L; l++) {
        int64_t row = (t * L + l) * (int64_t) ws->W;
        int32_t ov;
        if (*stamp >= MS_STAMP_MAX) {
            /* restart the stamp (see MS_STAMP_MAX): T x B x tokens x L increments pass INT32_MAX in long runs */
            memset(ws->chosen, 0, (size_t) ws->E * sizeof(int32_t));
            memset(ws->seen, 0, (size_t) ws->E * sizeof(int32_t));
            *stamp = 0;
        }
        (*stamp)++;
        if (r->trace) {
            int rc = replay_token(r, ws, b, l, tp, *stamp, picks, &ov);
            if (rc) return rc;
        } else {
            ov = route_token(r, ws, b, l, rng, *stamp, lag, l > 0 ? up : NULL, picks);
        }
        if (ov >= 0 && t >= c->warmup) {
            n->reuse_num += ov;
            n->reuse_den += K;
        }
        n->selections += K;
        if (ws->tok_out)
            memcpy(ws->tok_out + ((((int64_t) t * ws->B + b) * c->tokens_per_step + j) * L + l) * K,
                   picks, (size_t) K * sizeof(int32_t));
        add_to_union(ws, l, t, row, nsel, picks);
        memcpy(up, picks, (size_t) K * sizeof(int32_t));
    }
    return 0;
}

/* 0, or 1 when the multi-lag or cross-layer tables are malformed (sizes, ids, probabilities). */
static int check_memory(const ms_routing_t *r)
{
    if (r->recency) {
        if (r->recency_lag == NULL || r->history <= 0 || r->history > MS_MAX_HISTORY) return 1;
        for (int32_t l = 0; l < r->n_layers; l++)
            if (!(r->recency[l] >= 0.0 && r->recency[l] <= 1.0)) return 1;
        for (int32_t i = 0; i < r->history; i++)
            if (!(r->recency_lag[i] >= 0.0 && r->recency_lag[i] <= 1.0)) return 1;
    }
    if (r->coupling) {
        if (r->partners == NULL || r->n_partners < 1 || r->n_partners > MS_MAX_PARTNERS) return 1;
        for (int32_t l = 0; l < r->n_layers; l++)
            if (!(r->coupling[l] >= 0.0 && r->coupling[l] <= 1.0)) return 1;
        for (int64_t i = 0; i < (int64_t) r->n_layers * r->n_experts * r->n_partners; i++)
            if (r->partners[i] < 0 || r->partners[i] >= r->n_experts) return 1;
    }
    return 0;
}

/* Fill sel/cnt/nsel for all steps: B sequences x tokens_per_step tokens per step. */
int ms_route_generate(const ms_routing_t *r, const ms_decode_config_t *c, ws_t *ws, double *reuse_num,
                    double *reuse_den, double *selections)
{
    int32_t E = ws->E, L = ws->L;
    int32_t stamp = 0;
    route_counts_t n = {*reuse_num, *reuse_den, *selections};
    ms_rng_t rng;
    if (r->n_layers == 0) return 0;
    if (ws->K > MS_MAX_TOP_K) return MS_ERR_BAD_ROUTING;
    if (check_memory(r)) return MS_ERR_BAD_ROUTING;
    memset(ws->mark, 0, (size_t) L * (size_t) E * sizeof(int32_t));
    memset(ws->pos, 0, (size_t) L * (size_t) E * sizeof(int32_t));
    memset(ws->chosen, 0, (size_t) E * sizeof(int32_t));
    memset(ws->seen, 0, (size_t) E * sizeof(int32_t));
    if (ws->NB > 1) zig_build(ws->zig);
    for (int32_t b = 0; b < ws->B; b++) {
        ws->tok_in_req[b] = 0;
        ws->trace_pos[b] = r->trace ? (r->trace_tokens * b) / ws->B : 0;
        for (int32_t l = 0; l < L; l++) ws->nprev[b * L + l] = ws->nhist[b * L + l] = ws->hhead[b * L + l] = 0;
    }
    for (int64_t t = 0; t < ws->T; t++) {
        int32_t *nsel = ws->nsel + t * L;
        for (int32_t l = 0; l < L; l++) nsel[l] = 0;
        for (int32_t b = 0; b < ws->B; b++) {
            /* the sequence's own stream, re-seeded per step so steps are independent of batch order */
            ms_rng_init(&rng, c->seed, c->index, ((uint64_t) b << 32) ^ (uint64_t) t);
            for (int32_t j = 0; j < c->tokens_per_step; j++) {
                int rc = step_token(r, c, ws, t, b, j, &rng, &stamp, &n);
                if (rc) {
                    *reuse_num = n.reuse_num;
                    *reuse_den = n.reuse_den;
                    *selections = n.selections;
                    return rc;
                }
            }
        }
        order_unions(ws, t);
    }
    *reuse_num = n.reuse_num;
    *reuse_den = n.reuse_den;
    *selections = n.selections;
    return 0;
}
