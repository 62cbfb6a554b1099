/*
 * The analytic path's window tables (engine/lower/routing_window.py): how many windows of n consecutive
 * tokens of a sampled stream contain each expert, for every window length at once. A window lies inside
 * the stream (N - n + 1 of them per length); it misses expert e iff it sits inside one of e's absence runs
 * (maximal runs of tokens without e, the stream's edges included), and a run of g tokens holds
 * max(0, g - n + 1) windows of n. So one pass over the picks (a histogram of run lengths per expert) and
 * suffix sums over it give every length: O(N k + E n_max) per layer, exact integer counts.
 */
#include <string.h>

#include "ms_internal.h"
#include "ms_window.h"

int64_t ms_window_workspace_size(int32_t n_experts, int32_t max_window)
{
    if (n_experts <= 0 || max_window <= 0) return 0;
    return (int64_t) n_experts * ((int64_t) max_window + 4) * (int64_t) sizeof(int64_t);
}

/* 0 or MS_ERR_BAD_SIZE when the nodes are not increasing from >= 1 up to <= n_tokens. */
static int check_nodes(const int32_t *nodes, int32_t n_nodes, int64_t n_tokens)
{
    if (n_nodes <= 0 || nodes[0] < 1) return MS_ERR_BAD_SIZE;
    for (int32_t j = 1; j < n_nodes; j++)
        if (nodes[j] <= nodes[j - 1]) return MS_ERR_BAD_SIZE;
    return (int64_t) nodes[n_nodes - 1] > n_tokens ? MS_ERR_BAD_SIZE : 0;
}

/* Add an absence run of g >= 1 tokens to expert e's histogram (runs longer than nmax: count and sum). */
static void add_run(int64_t *h, int64_t *tail, int32_t nmax, int64_t g)
{
    if (g <= 0) return;
    if (g <= nmax) h[g]++;
    else {
        tail[0]++;
        tail[1] += g;
    }
}

/* One layer: windows containing each expert, out[e][j] for window length nodes[j]. */
static int count_layer(const int32_t *tokens, int64_t N, int32_t L, int32_t l, int32_t K, int32_t E,
                       const int32_t *nodes, int32_t W, int64_t *out, int64_t *ws)
{
    int32_t nmax = nodes[W - 1];
    int64_t stride = (int64_t) nmax + 4;   /* h[0..nmax], last, tail count, tail sum */
    memset(ws, 0, (size_t) E * (size_t) stride * sizeof(int64_t));
    for (int32_t e = 0; e < E; e++) ws[(int64_t) e * stride + nmax + 1] = -1;
    for (int64_t t = 0; t < N; t++) {
        const int32_t *pk = tokens + (t * L + l) * K;
        for (int32_t k = 0; k < K; k++) {
            int32_t e = pk[k];
            int64_t *h, *last;
            if (e < 0 || e >= E) return MS_ERR_BAD_ROUTING;
            h = ws + (int64_t) e * stride;
            last = h + nmax + 1;
            if (*last == t) continue;              /* a repeated pick within the token */
            add_run(h, h + nmax + 2, nmax, t - *last - 1);
            *last = t;
        }
    }
    for (int32_t e = 0; e < E; e++) {
        int64_t *h = ws + (int64_t) e * stride, s0, s1;
        int32_t j = W - 1;
        add_run(h, h + nmax + 2, nmax, N - 1 - h[nmax + 1]);   /* the run after the last occurrence */
        s0 = h[nmax + 2];
        s1 = h[nmax + 3];
        /* walk g down from nmax: s0 = #runs >= g, s1 = sum of their lengths; absent(n) = s1 - (n - 1) s0 */
        for (int32_t g = nmax; g >= 1 && j >= 0; g--) {
            s0 += h[g];
            s1 += h[g] * (int64_t) g;
            if (g == nodes[j]) {
                out[(int64_t) e * W + j] = (N - g + 1) - (s1 - (int64_t) (g - 1) * s0);
                j--;
            }
        }
    }
    return 0;
}

int ms_window_count(const int32_t *tokens, int64_t n_tokens, int32_t n_layers, int32_t top_k, int32_t n_experts,
                    const int32_t *nodes, int32_t n_nodes, void *workspace, int64_t workspace_bytes, int64_t *out)
{
    int rc;
    if (!tokens || !nodes || !out || !workspace) return MS_ERR_NULL_ARGUMENT;
    if (n_tokens <= 0 || n_layers <= 0 || top_k <= 0 || n_experts <= 0) return MS_ERR_BAD_SIZE;
    if ((rc = check_nodes(nodes, n_nodes, n_tokens))) return rc;
    if (workspace_bytes < ms_window_workspace_size(n_experts, nodes[n_nodes - 1])) return MS_ERR_BAD_WORKSPACE;
    for (int32_t l = 0; l < n_layers; l++) {
        rc = count_layer(tokens, n_tokens, n_layers, l, top_k, n_experts, nodes, n_nodes,
                         out + (int64_t) l * n_experts * n_nodes, (int64_t *) workspace);
        if (rc) return rc;
    }
    return 0;
}

/* ------------------------------------------------------------------------- count moments (LFU) */

/* The LFU analytic path's moments (ms_cache_rates.c lfu_moment_hits): over the windows of n consecutive tokens
 * that have a next token, per expert e with count N_i = #{e in tokens [i, i + n)} and x_i = [e in token i + n]:
 * sums of N_i, N_i^2, N_i x_i and x_i, exact integers. A run counts from a request's first token (every
 * sequence starts one at step 0, ms_route.c), so a window shorter than a request counts only inside one
 * (the stream restarts requests every request_tokens tokens, as a run does); longer ones anywhere. From e's
 * sorted occurrence positions alone: N_i = b - a with a = #positions < i and b = #positions < i + n, step
 * functions of i, so a sweep over their steps sums N_i and N_i^2 in O(occurrences); N_i x_i sums, over the
 * occurrences j >= n, the occurrences in [j - n, j). O(N k + E) per layer and length. */
int64_t ms_window_moments_workspace_size(int64_t n_tokens, int32_t top_k, int32_t n_experts)
{
    if (n_tokens <= 0 || top_k <= 0 || n_experts <= 0) return 0;
    return ((int64_t) n_experts + 1 + n_tokens * top_k) * (int64_t) sizeof(int64_t);
}

/* Add to out[0..3] the sums of the windows of n tokens inside the segment [base, base + N) from its n_pos sorted
 * occurrence positions pos (absolute). */
static void moment_sums(const int64_t *pos, int64_t n_pos, int64_t base, int64_t N, int64_t n, int64_t *out)
{
    int64_t last = N - n - 1, i = 0, a = 0, b = 0, lo = 0;
    while (i <= last) {
        int64_t next = last + 1, c;
        while (a < n_pos && pos[a] - base + 1 <= i) a++;       /* a: positions < i */
        while (b < n_pos && pos[b] - base - n + 1 <= i) b++;   /* b: positions < i + n */
        if (a < n_pos && pos[a] - base + 1 < next) next = pos[a] - base + 1;
        if (b < n_pos && pos[b] - base - n + 1 < next) next = pos[b] - base - n + 1;
        c = b - a;
        out[0] += c * (next - i);
        out[1] += c * c * (next - i);
        i = next;
    }
    for (int64_t q = 0; q < n_pos; q++) {
        int64_t j = pos[q] - base;
        if (j < n) continue;
        while (pos[lo] - base < j - n) lo++;                   /* the first occurrence in [j - n, j) */
        out[2] += q - lo;
        out[3]++;
    }
}

/* Expert e's sums at window length n from its n_pos sorted occurrence positions in a stream of N tokens:
 * request by request for windows shorter than a request (request_tokens > 0), else over the whole stream. */
static void expert_moments(const int64_t *pos, int64_t n_pos, int64_t N, int64_t n, int64_t request_tokens,
                           int64_t *out)
{
    int64_t seg = request_tokens > 0 && n < request_tokens ? request_tokens : N, first = 0;
    out[0] = out[1] = out[2] = out[3] = 0;
    for (int64_t base = 0; base < N; base += seg) {
        int64_t end = first;
        while (end < n_pos && pos[end] < base + seg) end++;
        moment_sums(pos + first, end - first, base, base + seg < N ? seg : N - base, n, out);
        first = end;
    }
}

/* Layer l's occurrence positions, expert by expert (a repeated pick within a token once): start[e] .. start[e + 1]
 * index pos. 0 or MS_ERR_BAD_ROUTING. */
static int layer_positions(const int32_t *tokens, int64_t N, int32_t L, int32_t l, int32_t K, int32_t E,
                           int64_t *start, int64_t *pos)
{
    memset(start, 0, ((size_t) E + 1) * sizeof(int64_t));
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t t = 0; t < N; t++)
            for (int32_t k = 0; k < K; k++) {
                const int32_t *pk = tokens + (t * L + l) * K;
                int32_t e = pk[k], dup = 0;
                if (e < 0 || e >= E) return MS_ERR_BAD_ROUTING;
                for (int32_t k2 = 0; k2 < k; k2++) dup |= pk[k2] == e;
                if (dup) continue;
                if (pass == 0) start[e + 1]++;
                else pos[start[e]++] = t;
            }
        if (pass == 0)
            for (int32_t e = 0; e < E; e++) start[e + 1] += start[e];
    }
    for (int32_t e = E; e > 0; e--) start[e] = start[e - 1];     /* back to each expert's first */
    start[0] = 0;
    return 0;
}

int ms_window_moments(const int32_t *tokens, int64_t n_tokens, int32_t n_layers, int32_t top_k, int32_t n_experts,
                      int64_t request_tokens, const int32_t *nodes, int32_t n_nodes, void *workspace,
                      int64_t workspace_bytes, int64_t *out)
{
    int64_t *start = (int64_t *) workspace, *pos = start + n_experts + 1;
    int rc;
    if (!tokens || !nodes || !out || !workspace) return MS_ERR_NULL_ARGUMENT;
    if (n_tokens <= 0 || n_layers <= 0 || top_k <= 0 || n_experts <= 0 || request_tokens < 0) return MS_ERR_BAD_SIZE;
    if ((rc = check_nodes(nodes, n_nodes, n_tokens - 1))) return rc;       /* every length leaves a next token */
    if (workspace_bytes < ms_window_moments_workspace_size(n_tokens, top_k, n_experts)) return MS_ERR_BAD_WORKSPACE;
    for (int32_t l = 0; l < n_layers; l++) {
        if ((rc = layer_positions(tokens, n_tokens, n_layers, l, top_k, n_experts, start, pos))) return rc;
        for (int32_t e = 0; e < n_experts; e++)
            for (int32_t j = 0; j < n_nodes; j++)
                expert_moments(pos + start[e], start[e + 1] - start[e], n_tokens, nodes[j], request_tokens,
                               out + (((int64_t) l * n_experts + e) * n_nodes + j) * 4);
    }
    return 0;
}
