/*
 * Machine-level terms the decode kernels share under a backend's token-count kernel paths (ms_machine_t.mm_min_tokens
 * ...; runtimes.toml [backends.metal] decode_paths): how many times a step reads its dense weights, and how many
 * tokens its dense GEMMs' FLOPs count.
 */
#include <math.h>

#include "ms_internal.h"

/* 1 where the paths are off or for one token; ceil(tokens / mm_tile_tokens) from mm_min_tokens (mat-mat tiles);
 * below, the byte-weighted mean of ceil(tokens / mv_ext_cols) (the small-batch GEMV, from its weight types' fewest
 * tokens) and tokens (mul_mv: one read per token). */
double ms_weight_passes(const ms_machine_t *hw, double tokens)
{
    double ext, s_ext, k_ext;
    if (hw->mm_min_tokens <= 0 || tokens <= 1.0) return 1.0;
    if (tokens >= (double) hw->mm_min_tokens) return ceil(tokens / (double) hw->mm_tile_tokens);
    ext = ceil(tokens / (double) hw->mv_ext_cols);
    s_ext = tokens >= (double) hw->mv_ext_min_tokens ? ext : tokens;
    k_ext = tokens >= (double) hw->mv_ext_k_min_tokens ? ext : tokens;
    return hw->mv_ext_share * s_ext + hw->mv_ext_k_share * k_ext
           + fmax(0.0, 1.0 - hw->mv_ext_share - hw->mv_ext_k_share) * tokens;
}

/* tokens where the paths are off or below mm_min_tokens; from it, the mat-mat kernel's whole mm_tile_tokens tiles,
 * each of its rows / mm_tile_rows threadgroups: while a tile's threadgroups fill fewer than mm_slots the GPU holds
 * at once, the tile takes the time of mm_slots (the idle ones cost as much as the running). */
double ms_gemm_tokens(const ms_machine_t *hw, double tokens, double rows)
{
    double tiles, idle = 1.0;
    if (hw->mm_min_tokens <= 0 || tokens < (double) hw->mm_min_tokens) return tokens;
    tiles = ceil(tokens / (double) hw->mm_tile_tokens);
    if (hw->mm_slots > 0.0 && rows > 0.0) idle = fmax(1.0, hw->mm_slots * (double) hw->mm_tile_rows / (tiles * rows));
    return tiles * (double) hw->mm_tile_tokens * idle;
}

/* A GPU step's mat-vec kernels over `weights` weights in `passes` passes, timed by decoding them: ggml-metal's
 * GEMVs (mul_mv, mul_mv_ext, mul_mv_id) take gemv_weight_s per weight read, on Apple GPUs longer than streaming
 * the bytes of a 4-bit type (returned: it overlaps the weights' stream). Each token a pass serves past its first
 * adds gemv_token_rel of that (its dot products) to *tokens_s: time the stream does not hide (a bandwidth-bound
 * 7B Q8_0 still adds 1.6 ms a sequence at 2..4 sequences). The mat-mat path (from mm_min_tokens tokens) is timed
 * by its FLOPs instead; 0 off. */
double ms_gemv_time(const ms_machine_t *hw, double tokens, double passes, double weights, double *tokens_s)
{
    *tokens_s = 0.0;
    if (!(hw->gemv_weight_s > 0.0) || (hw->mm_min_tokens > 0 && tokens >= (double) hw->mm_min_tokens)) return 0.0;
    *tokens_s = weights * hw->gemv_weight_s * hw->gemv_token_rel * fmax(0.0, tokens - passes);
    return weights * hw->gemv_weight_s * passes;
}

/* 1 where a machine's rates are positive and its latencies and kernel-path terms in range (ms_decode's check). */
int ms_machine_valid(const ms_machine_t *hw)
{
    if (!(hw->gpu_bw > 0.0 && hw->host_bw > 0.0 && hw->pcie_bw > 0.0 && hw->storage_bw > 0.0
          && hw->gpu_flops > 0.0 && hw->cpu_flops > 0.0 && hw->interconnect_bw > 0.0)) return 0;
    if (!(hw->moe_s >= 0.0) || !(hw->cpu_layer_s >= 0.0)) return 0;
    if (!(hw->gemv_weight_s >= 0.0) || !(hw->gemv_token_rel >= 0.0)) return 0;
    if (!(hw->op_s >= 0.0) || !(hw->cpu_op_s >= 0.0)) return 0;
    if (hw->graph_max_tokens < 0 || !(hw->nograph_s >= 0.0) || !(hw->mmid_sync_s >= 0.0)) return 0;
    if (!(hw->cpu_attn_flops > 0.0)) return 0;
    if (hw->mm_min_tokens < 0 || hw->moe_rowwise_below < 0 || !(hw->mm_slots >= 0.0)) return 0;
    return !(hw->mm_min_tokens > 0 && (hw->mm_tile_tokens < 1 || hw->mm_tile_rows < 1 || hw->mv_ext_cols < 1
                                       || hw->mv_ext_min_tokens < 0 || hw->mv_ext_k_min_tokens < 0
                                       || !(hw->mv_ext_share >= 0.0) || !(hw->mv_ext_k_share >= 0.0)
                                       || hw->mv_ext_share + hw->mv_ext_k_share > 1.0 + 1e-9));
}
