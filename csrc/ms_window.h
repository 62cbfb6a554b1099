/*
 * The analytic path's window statistics of a sampled token stream (ms_window.c): the window tables of
 * token-memory routings and the LFU path's count moments, counted once per lowered profile
 * (engine/lower/routing_window.py). Plain C99; 0 or a negative MS_ERR_* code (moesim.h).
 */
#ifndef MS_WINDOW_H
#define MS_WINDOW_H

#include <stdint.h>

/* The analytic path's window tables (ms_window.c): out[l][e][j] = how many of the n_tokens - n + 1
 * windows of n = nodes[j] consecutive tokens of the stream tokens [n_tokens][n_layers][top_k] hold expert e
 * in layer l. nodes increasing from >= 1 to <= n_tokens (else MS_ERR_BAD_SIZE), ids in [0, n_experts)
 * (else MS_ERR_BAD_ROUTING). Workspace: ms_window_workspace_size(n_experts, nodes[n_nodes - 1]) bytes. */
int64_t ms_window_workspace_size(int32_t n_experts, int32_t max_window);
int ms_window_count(const int32_t *tokens, int64_t n_tokens, int32_t n_layers, int32_t top_k, int32_t n_experts,
                    const int32_t *nodes, int32_t n_nodes, void *workspace, int64_t workspace_bytes, int64_t *out);
/* The LFU analytic path's count moments of a sampled stream tokens [n_tokens][n_layers][top_k] whose requests
 * restart every request_tokens tokens (0: one request): for every window length nodes[j] (increasing,
 * 1 <= nodes[j] < n_tokens) over the windows of that many tokens that have a next token (inside one request
 * when shorter than one), per layer and expert, out[l][e][j][0..3] = sums of the window's count N, of N^2, of
 * N x and of x, x = 1 when the expert is in the next token (ms_window.c). Workspace:
 * ms_window_moments_workspace_size bytes. */
int64_t ms_window_moments_workspace_size(int64_t n_tokens, int32_t top_k, int32_t n_experts);
int ms_window_moments(const int32_t *tokens, int64_t n_tokens, int32_t n_layers, int32_t top_k, int32_t n_experts,
                      int64_t request_tokens, const int32_t *nodes, int32_t n_nodes, void *workspace,
                      int64_t workspace_bytes, int64_t *out);

#endif
