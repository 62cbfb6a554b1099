/*
 * Prefill seconds of one prompt on one lowered model and machine (ms_prefill.c; engine/prefill.py
 * prefill_seconds is the model, engine/reference/prefill.py the twin). Plain C99; 0 or a negative MS_ERR_*
 * code (moesim.h). Values are not judged: the numpy path they replace computes whatever they give.
 */
#ifndef MS_PREFILL_H
#define MS_PREFILL_H

#include <stdint.h>

/* What prefill reads of a lowered model, routing, runtime and prompt (engine/prefill.py prefill_terms), none
 * of it machine rates: a sweep builds it once per lowered model and runs it on every machine. */
typedef struct {
    int32_t n_layers;
    const int32_t *on_gpu;                 /* [n_layers] attention and dense work on a GPU */
    const double *weights, *flops;         /* [n_layers] attention + shared weight bytes, FLOPs per token */
    const double *score_flops;             /* [n_layers] attention score FLOPs per token */
    const double *decompress_flops;        /* [n_layers] MLA latent decompression FLOPs per ubatch */
    const double *act;                     /* [n_layers] activation bytes a token's graph ops move through the
                                              GPU's memory (0 on CPU layers and for fused runtimes) */
    const double *kv_one, *kv_heads;       /* [n_layers] CPU attention: KV bytes of one read, query heads per
                                              KV head; both NULL when no layer's attention runs on the CPU */
    int32_t n_sizes;
    const int64_t *sizes;                  /* [n_sizes][2] ubatch tokens, how many such ubatches */
    const double *size_rows;               /* [n_sizes] query rows per KV walk (prefill.py _fa_rows_per_read) */
    const int32_t *size_tiled;             /* [n_sizes] 1: ggml-cpu's tiled attention path at that size */
    int32_t n_exp;                         /* layers with routed experts */
    const int32_t *exp_layer, *exp_mode;   /* [n_exp] their layer and expert mode */
    const double *exp_share;               /* [n_exp] share of expert traffic the GPU's experts serve */
    const double *exp_bytes, *exp_flops;   /* [n_exp] one expert's bytes and FLOPs per token */
    const double *exp_layer_experts;       /* [n_exp] the layer's experts */
    const double *exp_distinct;            /* [n_sizes][n_exp] distinct experts a ubatch of that size uses */
    int32_t top_k, threshold;              /* experts per token; layerwise prefill from this many tokens (0: off) */
    int32_t offload;                       /* op offload: CPU experts copied to the GPU */
    double head_bytes, head_flops, amx_per_cycle;
} ms_prefill_model_t;

/* The machine rates prefill reads (engine/lower/machine.py lower_machine's keys of the same names). */
typedef struct {
    double gpu_bw, host_bw, pcie_bw, pcie_links, prefill_flops, prefill_gemm_flops, prefill_expert_flops, cpu_flops;
    double prefill_attn_flops, cpu_prefill_attn_flops, launch_s, cpu_layer_s, sync_s, cpu_llc_bytes;
    double prefill_moe_half_tokens, amx_flops;
    double prefill_weight_pass_tokens;     /* tokens per pass of a GPU GEMM over its weights (MMQ's mmq_x; 0: one pass) */
    double prefill_moe_tile_tokens;        /* widest tile a ubatch-wide routed-expert tile pads each used expert's
                                              tokens to (0: each expert computes its own tokens only) */
    double step_s;                         /* host work before the prompt's first graph runs (once per prompt) */
    int32_t overlap, gpu_moe_rowwise;
} ms_prefill_machine_t;

/* *out = seconds to prefill the prompt; workspace: n_layers doubles. Missing tables are MS_ERR_NULL_ARGUMENT,
 * counts or layer indices out of range MS_ERR_BAD_SIZE. Sums over layers add as numpy's pairwise sum does, so
 * the result equals prefill.py's to the bit. */
int ms_prefill_seconds(const ms_prefill_model_t *p, const ms_prefill_machine_t *h, double *workspace, double *out);

#endif
