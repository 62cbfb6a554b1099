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
