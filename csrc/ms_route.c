/*
 * The routing sampler of the decode kernel: per-request popularity draws, one token's top-k (sticky
 * re-picks, Gumbel-top-k races, group-limited routing) or a recorded trace, and each step's union of
 * the batch's experts. Streams are named by (seed, configuration, sequence, step) (ms_rng.c).
 */
#include <math.h>
#include <string.h>

#include "ms_internal.h"

#define MS_TINY 1e-300

/* ------------------------------------------------------------------------- routing */

/* Fresh request for sequence b: per-layer weights w ~ Dirichlet(beta * E * g) (unnormalised: the
 * race below only compares ratios), or w = g without per-request skew. */
static void new_request(const ms_routing_t *r, ws_t *ws, int32_t b, ms_rng_t *rng)
{
    int32_t E = ws->E;
    for (int32_t l = 0; l < ws->L; l++) {
        const double *lp = r->log_pop + (int64_t) l * E;
        double *w = ws->w + ((int64_t) b * ws->L + l) * E, mx = lp[0], z = 0.0;
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

/* Whether expert e's race key -log(u) / w cannot beat `bound` (key >= bound), decided without the log:
 * -log(u) >= 1 - u, so (1 - u) >= bound w means key >= bound. The 1e-12 margin covers the roundings of
 * both sides (1 - u >= 2^-54, so the product is never subnormal near the edge): the verdict is always
 * the one the key itself gives, and the sampler's picks are those of taking every log. */
static inline int key_cannot_beat(double u, double w, double bound)
{
    return 1.0 - u >= bound * w * (1.0 + 1e-12);
}

/* Expert e's race key Exp(1) / w_e = -log(u_e) / w_e, taken once per token (keyed marks it). */
static inline double race_key(ws_t *ws, const double *w, int32_t e, int32_t stamp)
{
    if (ws->keyed[e] != stamp) {
        ws->score[e] = -log(ws->unif[e]) / w[e];
        ws->keyed[e] = stamp;
    }
    return ws->score[e];
}

/* Group-limited routing: draws the token's E uniforms (into unif, in expert order), then allows the
 * groups holding the n kept experts first and the best others by their two best race keys, up to
 * topk_group groups (allowed[e] = stamp). */
static void allow_groups(const ms_routing_t *r, ws_t *ws, ms_rng_t *rng, int32_t stamp, const double *w,
                         const int32_t *out, int32_t n)
{
    int32_t E = ws->E, G = r->n_group, per = E / G, picked = 0;
    ms_rng_t lr = *rng;          /* a local copy stays in registers */
    for (int32_t e = 0; e < E; e++) ws->unif[e] = ms_rng_uniform_inline(&lr);
    *rng = lr;
    for (int32_t g = 0; g < G; g++) {
        double a = HUGE_VAL, bb = HUGE_VAL;
        for (int32_t e = g * per; e < (g + 1) * per; e++) {
            double k;
            if (key_cannot_beat(ws->unif[e], w[e], bb)) continue;
            k = race_key(ws, w, e, stamp);
            if (k < a) { bb = a; a = k; } else if (k < bb) bb = k;
        }
        ws->gscore[g] = log(a) + (per > 1 ? log(bb) : 0.0);
        ws->gpick[g] = 0;
    }
    for (int32_t j = 0; j < n; j++) {
        int32_t g = out[j] / per;
        if (!ws->gpick[g]) { ws->gpick[g] = 1; picked++; }
    }
    while (picked < r->topk_group) {
        int32_t best = -1;
        for (int32_t g = 0; g < G; g++)
            if (!ws->gpick[g] && (best < 0 || ws->gscore[g] < ws->gscore[best])) best = g;
        ws->gpick[best] = 1;
        picked++;
    }
    for (int32_t e = 0; e < E; e++) ws->allowed[e] = ws->gpick[e / per] ? stamp : 0;
}

/* One token's top-k in routing layer l for sequence b; writes `out` (k ids), returns overlap with
 * the previous token's picks (-1 for a request's first token). Each kept expert of the previous
 * token stays with probability p; the other slots go to the smallest race keys Exp(1) / w_e, which
 * is Gumbel-top-k on log w (Plackett-Luce sampling without replacement) at one uniform per expert, the
 * log only where the key can still win (key_cannot_beat).
 * Group-limited routing ranks groups by their two best keys (sum of the two best Gumbel scores). */
static int32_t route_token(const ms_routing_t *r, ws_t *ws, int32_t b, int32_t l, ms_rng_t *rng, int32_t stamp,
                           int32_t lag, const int32_t *up, int32_t *out)
{
    int32_t E = ws->E, K = ws->K, n = 0, overlap = 0;
    int32_t *prev = ws->prev + ((int64_t) b * ws->L + l) * K;
    int32_t np = ws->nprev[b * ws->L + l];
    const double *w = ws->w + ((int64_t) b * ws->L + l) * E;
    double *key = ws->score, p = r->stickiness[l];
    int grouped = r->n_group > 1 && r->topk_group < r->n_group;
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
    /* one uniform per expert, drawn in expert order whatever is picked (the stream is the race's): all
     * first where groups are ranked, else in the pass below */
    if (grouped) allow_groups(r, ws, rng, stamp, w, out, n);
    {   /* the K - n smallest keys in one pass (insertion into a short sorted list) */
        int32_t need = K - n, have = 0, *top = out + n;
        ms_rng_t lr = *rng;          /* a local copy stays in registers */
        for (int32_t e = 0; e < E; e++) {
            int32_t i;
            double k, u = grouped ? ws->unif[e] : ms_rng_uniform_inline(&lr);
            if (need == 0 || (grouped && ws->allowed[e] != stamp) || ws->chosen[e] == stamp) continue;
            if (have == need && key_cannot_beat(u, w[e], key[top[have - 1]])) continue;
            if (grouped) {
                k = race_key(ws, w, e, stamp);
            } else {
                k = key[e] = -log(u) / w[e];     /* each expert met once: no memo */
            }
            if (have == need && !(k < key[top[have - 1]])) continue;
            i = have < need ? have++ : have - 1;
            while (i > 0 && k < key[top[i - 1]]) {
                top[i] = top[i - 1];
                i--;
            }
            top[i] = e;
        }
        *rng = lr;
        for (int32_t j = 0; j < need; j++) ws->chosen[top[j]] = stamp;
        n = K;
    }
    for (int32_t j = 0; j < np; j++) overlap += ws->chosen[prev[j]] == stamp;
    if (r->recency && np > 0) {   /* the previous token becomes lag 2 of the next */
        int32_t bl = b * ws->L + l, H = r->history;
        memcpy(ws->hist + ((int64_t) bl * H + ws->hhead[bl]) * K, prev, (size_t) K * sizeof(int32_t));
        ws->hhead[bl] = (ws->hhead[bl] + 1) % H;
        if (ws->nhist[bl] < H) ws->nhist[bl]++;
    }
    for (int32_t j = 0; j < K; j++) prev[j] = out[j];
    ws->nprev[b * ws->L + l] = K;
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
            n = 0;
            for (int32_t e = 0; e < E; e++) {
                if (mk[e] != (int32_t) (t + 1)) continue;
                ws->usel[n] = e;
                ws->ucnt[n++] = ws->cnt[row + ws->pos[(int64_t) l * E + e]];
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
            memset(ws->allowed, 0, (size_t) ws->E * sizeof(int32_t));
            memset(ws->keyed, 0, (size_t) ws->E * sizeof(int32_t));
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
    memset(ws->chosen, 0, (size_t) E * sizeof(int32_t));
    memset(ws->allowed, 0, (size_t) E * sizeof(int32_t));
    memset(ws->keyed, 0, (size_t) E * sizeof(int32_t));
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
