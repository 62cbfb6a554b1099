/*
 * moesim C core: memory accounting (and, later, the decode simulation kernel).
 *
 * Plain C99, no Python. Every function returns 0 or a negative MS_ERR_* code; callers own all
 * buffers. Inputs are validated by the Python layer before they reach here; the kernel re-checks
 * only what could make it crash or loop (defence in depth) and otherwise runs unchecked.
 */
#ifndef MOESIM_H
#define MOESIM_H

#include <stdint.h>

#define MS_ERR_NULL_ARGUMENT   (-1)
#define MS_ERR_BAD_SIZE        (-2)
#define MS_ERR_BAD_PLACEMENT   (-3)
#define MS_ERR_BAD_CONTEXT     (-4)
#define MS_ERR_BAD_CAPACITY    (-5)
#define MS_ERR_NO_MEMORY       (-6)

const char *ms_strerror(int err);

/* Tensor classes and memory tiers: the rows and columns of ms_mem_result_t.by_class. */
enum {
    MS_CLASS_ATTENTION = 0, MS_CLASS_ROUTER, MS_CLASS_SHARED, MS_CLASS_ROUTED, MS_CLASS_DENSE,
    MS_CLASS_EMBED, MS_CLASS_HEAD, MS_CLASS_MTP, MS_CLASS_KV, MS_CLASS_STATE, MS_CLASS_BUFFERS,
    MS_N_CLASSES
};
enum { MS_TIER_GPU = 0, MS_TIER_HOST, MS_TIER_STORAGE, MS_N_TIERS };

/* Placements (DESIGN §4 --placement); `placement_arg` carries N where the name has one. */
enum {
    MS_PLACE_ALL_GPU = 0, MS_PLACE_EXPERTS_CPU, MS_PLACE_N_CPU_MOE, MS_PLACE_GPU_EXPERTS,
    MS_PLACE_LAYERS_GPU, MS_PLACE_CPU_ONLY, MS_PLACE_UNIFIED, MS_PLACE_OFFLOAD_CACHE, MS_N_PLACEMENTS
};

/* Bits of ms_mem_result_t.fits: which tiers the configuration uses. 0 means it does not fit. */
#define MS_FITS_GPU     1
#define MS_FITS_HOST    2
#define MS_FITS_STORAGE 4

/* A model under one quantization, lowered to per-layer byte counts (caller-owned arrays). */
typedef struct {
    int32_t n_layers;
    const double *attn;          /* attention weights incl. norms, bytes */
    const double *router;        /* router / latent projections */
    const double *shared;        /* shared experts */
    const double *expert_one;    /* ONE routed expert's bytes (0 for a dense layer) */
    const int32_t *n_experts;    /* routed experts in the layer (0 = dense) */
    const double *dense;         /* dense FFN */
    /* Per-sequence cache of a layer at context C (see models.KVTerms):
     * (kv_elems*kvb + kv_fixed)*min(C, cap or C) + (C/ratio)*(ratio_elems*kvb + ratio_fixed) + state */
    const double *kv_elems, *kv_fixed, *kv_ratio_elems, *kv_ratio_fixed, *kv_state;
    const int64_t *kv_cap, *kv_ratio;
    double embed, head, mtp;     /* global weights; mtp counted only when the config enables it */
    int32_t mtp_layers;          /* MTP modules; each caches like the last layer */
    int64_t max_context;         /* the model's trained context */
} ms_model_t;

typedef struct {
    int64_t context, batch;
    double kv_bytes_per_elem;
    int32_t placement;
    int64_t placement_arg;
    int32_t mtp;                 /* 1: load MTP modules (speculative decoding) */
    int32_t n_gpus;              /* 0 for CPU-only machines */
    double gpu_capacity;         /* usable bytes per GPU (after runtime utilisation limits) */
    double host_capacity;        /* usable host RAM bytes */
    double storage_capacity;     /* bytes of storage that mmap'd weights may page from (0 = none) */
    int32_t storage_spill;       /* 1: host-resident weights may live on storage (mmap) */
    int32_t embed_on_gpu;        /* 0: runtime keeps token embeddings in host RAM (llama.cpp) */
    int64_t kv_granularity;      /* context is padded to a multiple of this (llama.cpp 256) */
    double gpu_fixed;            /* per GPU: CUDA context, runtime reserve */
    double gpu_buf0, gpu_buf_ctx;   /* per GPU compute buffer: buf0 + buf_ctx * C */
    double host_fixed;           /* host-side runtime overhead */
    double host_buf0, host_buf_ctx;
} ms_mem_config_t;

typedef struct {
    double by_class[MS_N_CLASSES][MS_N_TIERS];
    double tier[MS_N_TIERS];     /* bytes per tier (GPU summed over devices; storage = spilled weights) */
    double weights;              /* all weights, every tier */
    double kv;                   /* context-dependent cache, all sequences */
    double state;                /* context-independent per-sequence state, all sequences */
    double kv_bytes_per_token;   /* asymptotic cache bytes per token per sequence */
    int32_t fits;                /* MS_FITS_* bits; 0 = does not fit */
    int64_t max_context;         /* largest context that fits at this batch (0 if none) */
    int64_t max_batch;           /* largest batch that fits at this context (0 if none) */
} ms_mem_result_t;

int ms_memory(const ms_model_t *model, const ms_mem_config_t *cfg, ms_mem_result_t *out);

/* Evaluate n configurations; configuration i writes out[i]. With OpenMP, n_threads > 1 splits
 * the loop; each result depends only on its own inputs, so output is identical for any n_threads.
 * Returns the first error code met (its index in *err_index), else 0. */
int ms_memory_many(const ms_model_t *model, const ms_mem_config_t *cfgs, int64_t n,
                   ms_mem_result_t *out, int n_threads, int64_t *err_index);

#endif
