/* moesim C core: memory accounting, decode, routing, sweeps, serving. Plain C99, no Python. Every function returns
 * 0 or a negative MS_ERR_* code; callers own all buffers. Inputs are validated by the Python layer before they reach
 * here; the kernel re-checks only what could make it crash or loop (defence in depth) and otherwise runs unchecked. */
#ifndef MOESIM_H
#define MOESIM_H

#include <stdint.h>
#define MS_ERR_NULL_ARGUMENT   (-1)
#define MS_ERR_BAD_SIZE        (-2)
#define MS_ERR_BAD_PLACEMENT   (-3)
#define MS_ERR_BAD_CONTEXT     (-4)
#define MS_ERR_BAD_CAPACITY    (-5)
#define MS_ERR_NO_MEMORY       (-6)
#define MS_ERR_BAD_ROUTING     (-7)
#define MS_ERR_BAD_POLICY      (-8)
#define MS_ERR_BAD_TRACE       (-9)
#define MS_ERR_BAD_WORKSPACE   (-10)
#define MS_ERR_BAD_MACHINE     (-11)
#define MS_ERR_BAD_SWEEP       (-12)
#define MS_ERR_BAD_SERVE       (-13)
#define MS_ERR_KV_TOO_SMALL    (-14)

const char *ms_strerror(int err);

/* Kernel limits, checked by the Python glue before any call (a MoesimError naming the field and the
 * bound) and again here (MS_ERR_BAD_SIZE / MS_ERR_BAD_ROUTING, never a crash): the Monte Carlo path
 * keeps two caches per MoE layer and one token's top-k picks in fixed-size stack arrays. They hold for
 * every entry point that takes an ms_routing_t (Monte Carlo, analytic, route sampling, sweeps). */
#define MS_MAX_MOE_LAYERS 256    /* ms_routing_t.n_layers: MoE layers */
#define MS_MAX_TOP_K      512    /* ms_routing_t.top_k: experts per token */
#define MS_MAX_HISTORY    256    /* ms_routing_t.history: recency lags */
#define MS_MAX_PARTNERS   64     /* ms_routing_t.n_partners */
#define MS_UNION_VAR_EXPERTS 16  /* the analytic LRU reads a step's distinct-count spread up to this many experts */

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
    double head_copy;            /* a tied head's matrix loaded again on the head's tier when the embeddings sit on
                                  * the other (llama.cpp's TENSOR_DUPLICATED output on a discrete GPU), bytes */
    int64_t kv_granularity;      /* context is padded to a multiple of this (llama.cpp 256) */
    double gpu_fixed;            /* per GPU: CUDA context, runtime reserve */
    double gpu_buf0, gpu_buf_ctx;   /* per GPU compute buffer: buf0 + buf_ctx * C */
    double host_fixed, host_buf0, host_buf_ctx;   /* host-side runtime overhead; host compute buffer */
    /* Per GPU (issue 16): the GPU-tier bytes of class k are divided gpu_ways[k] ways over the GPUs (1 = replicated
     * on every GPU; engine.lower.memory.memory_split_ways), so the busiest GPU holds sum_k by_class[k][GPU] /
     * gpu_ways[k], and fits the GPUs only within gpu_capacity. Each > 0 and finite; all 1 on one GPU. */
    double gpu_ways[MS_N_CLASSES];
} ms_mem_config_t;

typedef struct {
    double by_class[MS_N_CLASSES][MS_N_TIERS];
    double tier[MS_N_TIERS];     /* bytes per tier (GPU summed over devices; storage = spilled weights) */
    double gpu_per_gpu;          /* the busiest GPU's bytes (ms_mem_config_t.gpu_ways), what the fit checks */
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

/* ================================================================ decode simulation
 *
 * One configuration = a lowered model (per-layer bytes and FLOPs at the measured context, where
 * each layer's attention and routed experts live), a machine (effective bandwidths and FLOP rates,
 * fixed latencies), a routing profile or a recorded trace, and a workload (batch, tokens per step,
 * policy, seed). Monte Carlo walks `steps` decode steps with real cache state; the analytic path
 * evaluates the same cost function on expected counts. Both fill ms_decode_result_t.
 */

/* ---- random numbers: xoshiro256** seeded through splitmix64 from (seed, a, b) so every
 * configuration and sequence owns its stream (numpy.random style: state passed in). */
typedef struct { uint64_t s[4]; } ms_rng_t;
/* One step of splitmix64 (Vigna's reference): advances *x and returns the next output. */
uint64_t ms_splitmix64_next(uint64_t *x);
void ms_rng_init(ms_rng_t *rng, uint64_t seed, uint64_t a, uint64_t b);
uint64_t ms_rng_next(ms_rng_t *rng);
double ms_rng_uniform(ms_rng_t *rng);      /* in (0, 1), never 0 or 1 */
double ms_rng_gumbel(ms_rng_t *rng);
double ms_rng_normal(ms_rng_t *rng);
double ms_rng_gamma(ms_rng_t *rng, double shape);

/* Where a layer's routed experts are served from. */
enum {
    MS_EXP_NONE = 0,      /* dense layer: no routed experts */
    MS_EXP_GPU,           /* all resident in GPU memory (or the unified pool) */
    MS_EXP_CPU,           /* host RAM, computed on the CPU (llama.cpp -ot exps=CPU, ktransformers) */
    MS_EXP_SPLIT,         /* `slots` hottest experts pinned on the GPU, the rest computed on the CPU */
    MS_EXP_FETCH,         /* host RAM, copied to a GPU expert cache of `slots` experts on a miss */
    MS_N_EXP_MODES
};
enum { MS_POLICY_LRU = 0, MS_POLICY_LFU, MS_POLICY_STATIC, MS_POLICY_BELADY, MS_N_POLICIES };
enum { MS_MODE_MONTECARLO = 0, MS_MODE_ANALYTIC };

/* Resources a step's time is attributed to (the term that set each max), and byte counters. */
enum {
    MS_RES_GPU_MEM = 0, MS_RES_GPU_COMPUTE, MS_RES_HOST_MEM, MS_RES_CPU_COMPUTE, MS_RES_PCIE,
    MS_RES_STORAGE, MS_RES_LATENCY, MS_RES_INTERCONNECT, MS_N_RES
};
enum { MS_BYTES_GPU_MEM = 0, MS_BYTES_HOST_MEM, MS_BYTES_PCIE, MS_BYTES_STORAGE, MS_N_BYTES };
/* Phases of a step (breakdown by phase). */
enum {
    MS_PHASE_ATTENTION = 0, MS_PHASE_EXPERTS, MS_PHASE_TRANSFER, MS_PHASE_SYNC, MS_PHASE_HEAD,
    MS_PHASE_OVERHEAD, MS_PHASE_ALLTOALL, MS_N_PHASES
};

typedef struct {
    int32_t n_layers;
    /* per layer, all per step and per token at the measured context */
    const double *attn_bytes;        /* attention + router + norms weights read once per step */
    const double *attn_flops;        /* FLOPs per token for those weights (2 x params) */
    const double *kv_bytes;          /* KV / state bytes read per sequence per step */
    const double *score_flops;       /* attention-score FLOPs per token at this context */
    const double *shared_bytes;      /* shared experts + dense FFN weights, read once per step */
    const double *shared_flops;      /* their FLOPs per token */
    const double *expert_bytes;      /* ONE routed expert's weights */
    const double *expert_flops;      /* FLOPs per token through one routed expert */
    const int32_t *attn_on_gpu;      /* 1: attention, shared and dense parts run on the GPU */
    const int32_t *expert_mode;      /* MS_EXP_* */
    const int32_t *slots;            /* GPU slots for SPLIT / FETCH layers */
    const int32_t *page_slots;       /* host page-cache slots (experts) when weights spill to storage; >= E = none */
    const int32_t *moe_index;        /* row in the routing tables, -1 for dense layers */
    double head_bytes, head_flops;   /* lm_head (+ final norm), per step / per token */
    int32_t head_on_gpu;
    double draft_bytes, draft_flops; /* one speculative draft pass (MTP module), per step / per token */
    double act_bytes;                /* activations crossing PCIe per token per CPU-expert layer (both ways) */
    double allreduce_bytes;          /* per token per layer under tensor parallelism (0 = none) */
    /* expert parallelism: the busiest rank's share over the mean, per layer (1 = balanced or no EP), for the
     * experts it reads (weight bytes) and for the token-expert pairs it computes (FLOPs); NULL = all 1 */
    const double *ep_load_experts;
    const double *ep_load_pairs;
    double a2a_bytes;                /* dispatch + combine bytes one rank sends per step token per MoE layer (0 = no EP) */
    /* graph nodes layer l runs per step beyond the runtime's count for an attention layer (an unfused
     * recurrence: Gated DeltaNet before ggml's fused op), each at op_s on the GPU, cpu_op_s on the CPU; NULL = none */
    const double *layer_ops;
    const double *gemm_rows;         /* layer l's dense GEMMs' output rows, FLOP-weighted harmonic mean (NULL: unknown) */
} ms_decode_model_t;

typedef struct {
    double gpu_bw, host_bw, pcie_bw, storage_bw;  /* effective bytes/s (peak x efficiency) */
    double gpu_flops, cpu_flops;                  /* effective FLOP/s */
    double interconnect_bw;                       /* GPU-GPU bytes/s for all-reduce */
    int32_t unified;                              /* 1: GPU and CPU draw on one memory pool */
    int32_t overlap;                              /* 1: GPU and CPU experts of a layer run concurrently */
    double launch_s;                              /* per GPU layer per step (kernel launches) */
    double sync_s;                                /* per CPU-expert layer per step (GPU<->CPU handoff) */
    double dma_s;                                 /* per demand transfer (expert copy) */
    double allreduce_s;                           /* per layer per step under tensor parallelism */
    double a2a_bw;                                /* one rank's all-to-all bytes/s (scale-up fabric x efficiency) */
    double a2a_s;                                 /* dispatch + combine latency per MoE layer per step */
    double cpu_layer_s;                           /* per layer whose attention runs on the CPU, per step: the CPU
                                                   * graph's thread barriers and small ops */
    double moe_s;                                 /* routing / weighting / combining kernels per MoE layer on the
                                                   * GPU per step (latency beside the expert GEMMs) */
    double step_s, seq_s;                         /* host overhead per step (sampling, scheduling), per sequence */
    double op_s, cpu_op_s;                        /* per extra graph node of a layer (layer_ops): GPU, CPU */
    int32_t graph_max_tokens;                     /* steps of more tokens run without CUDA graphs (0: none do) */
    double nograph_s, mmid_sync_s;                /* ... each GPU layer then pays nograph_s, each MoE one mmid_sync_s */
    double cpu_attn_flops;                        /* attention scores' FLOP/s on the CPU (its kernel, not cpu_flops) */
    /* token-count kernel paths (ggml-metal; mm_min_tokens 0: off): ms_weight_passes, ms_gemm_tokens; moe_rowwise_below */
    int32_t mm_min_tokens, mm_tile_tokens, mv_ext_cols, mv_ext_min_tokens, mv_ext_k_min_tokens, moe_rowwise_below;
    double mv_ext_share, mv_ext_k_share;          /* dense weight byte shares the small-batch GEMV takes */
    int32_t mm_tile_rows; double mm_slots;        /* mat-mat tile rows; threadgroups the GPU runs at once (0: off) */
    double gemv_weight_s, gemv_token_rel;         /* GEMV s per weight decoded (0: off); a pass's later tokens at rel */
} ms_machine_t;

/* A dense model routes nothing: with n_layers 0 every array below may be NULL. */
typedef struct {
    int32_t n_layers;            /* MoE layers (rows), at most MS_MAX_MOE_LAYERS */
    int32_t n_experts, top_k;    /* top_k at most MS_MAX_TOP_K */
    int32_t n_group, topk_group; /* group-limited routing; n_group <= 1 = off */
    const double *log_pop;       /* [n_layers][n_experts] log global popularity (any constant offset) */
    const double *stickiness;    /* [n_layers] per-slot probability of re-picking the previous token's expert */
    const double *recall;        /* [n_layers] prefetch predictor recall for this layer (0 = none) */
    const int32_t *hot;          /* [n_layers][n_experts] expert ids by descending popularity (static pinning) */
    double concentration;        /* per-request Dirichlet beta (x E x g); <= 0 = no per-request skew */
    int64_t request_tokens;      /* tokens per request before a fresh request starts (0 = never) */
    /* Analytic path: per-token inclusion probabilities for n_scenarios request draws. */
    int32_t n_scenarios;
    const double *q;             /* [n_scenarios][n_layers][n_experts] */
    const double *qbar;          /* [n_layers][n_experts] mean of q over scenarios */
    const double *lqbar;         /* [n_layers][n_experts] log(1 - qbar) (qbar capped below 1) */
    /* Analytic path under token memory (NULL = tokens pick independently from q): the stationary window
     * statistics of one sequence (engine/lower/routing_window.py). win_lq[l][e][j] = log P(expert e is
     * absent from win_n[j] consecutive tokens), <= 0 and non-increasing in j; win_n increasing from 1,
     * n_window >= 2 nodes, read linearly in n between them and beyond the last. With them distinct
     * experts, LRU and page-cache hits (Che's approximation on the windows) and reuse read the windows. */
    int32_t n_window;
    const double *win_n;         /* [n_window] window lengths in tokens */
    const double *win_lq;        /* [n_layers][n_experts][n_window] */
    /* With the windows (or NULL): one sequence's count moments for LFU at n_moment lengths win_m (increasing from 1):
     * e's count variance over win_m[j] tokens and its covariance with e in the next token (routing_window.py). */
    int32_t n_moment;
    const double *win_m;         /* [n_moment] */
    const double *win_var;       /* [n_layers][n_experts][n_moment] */
    const double *win_cov;       /* [n_layers][n_experts][n_moment] */
    int32_t windows_checked;     /* 1: ms_check_windows found these window tables well formed and they have not
                                  * changed since (engine.glue.seal_routing sets it on the copies it seals):
                                  * kernels skip the check; 0: every kernel call checks them */
    /* Multi-lag memory (Monte Carlo only; NULL = off): each token draws one lag d from recency_lag
     * (entry i: lag i + 2) for all its layers, and at layer l each slot not kept from the previous token
     * copies, with probability recency[l], a uniformly chosen expert of the token d back in the request
     * (the token re-follows part of an earlier token's path, across layers alike). */
    const double *recency;       /* [n_layers] */
    const double *recency_lag;   /* [history], sums to 1 */
    int32_t history;             /* lags held beyond the previous token, at most MS_MAX_HISTORY */
    /* Cross-layer dependence (Monte Carlo only; NULL = off): at layer l each slot still free after the
     * memory takes, with probability coupling[l], a partner partners[l - 1][e][i] (i uniform) of the token's
     * layer l - 1 expert e in the same slot: a sparse stand-in for the co-activation table. Partners come
     * before the memory, so a path through the layers repeats when the memory repeats its first layer. */
    const double *coupling;      /* [n_layers] probabilities (entry 0 unused) */
    const int32_t *partners;     /* [n_layers][n_experts][n_partners] expert ids of the next layer */
    int32_t n_partners;
    /* Trace replay (Monte Carlo only): [trace_tokens][trace_layers][top_k] expert ids. */
    const int32_t *trace;
    int64_t trace_tokens;
    int32_t trace_layers;
} ms_routing_t;

typedef struct {
    int32_t batch;               /* concurrent sequences B */
    int32_t tokens_per_step;     /* 1 + speculative drafts verified per step */
    int32_t drafts;              /* draft passes per step (0 = none) */
    double accepted;             /* accepted tokens per sequence per step */
    int64_t steps, warmup;       /* simulated steps; the first `warmup` are not counted */
    int32_t policy;              /* MS_POLICY_* */
    int32_t mode;                /* MS_MODE_* */
    uint64_t seed;
    uint64_t index;              /* configuration index: part of every stream's seed */
    /* Analytic path (NULL = count per configuration): che[l][MS_CHE_*], l < the routing's n_layers, the row
     * ms_che_table tabulated for these routing tables, batch, tokens per step and policy at che_slots GPU
     * slots. MoE layers holding che_slots slots read their step's counts and hit rate from it instead of
     * counting experts and solving Che's equation; a count negative or not finite, or a hit rate above 1, is
     * MS_ERR_BAD_ROUTING. The caller owns it and keeps it matched. */
    const double *che;
    int32_t che_slots;
    /* Analytic path (NULL = solve per configuration): page_hit[l], l < the routing's n_layers, the host page
     * cache's hit rate ms_page_table tabulated for these routing tables, batch and tokens per step at
     * page_hit_slots page slots. Paged MoE layers holding page_hit_slots page slots read it instead of solving
     * Che's equation; a rate outside [0, 1] is MS_ERR_BAD_ROUTING. The caller owns it and keeps it matched. */
    const double *page_hit;
    int32_t page_hit_slots;
} ms_decode_config_t;

typedef struct {
    double step_mean, step_p50, step_p99;   /* seconds per step */
    double accepted;                        /* tokens per sequence per step */
    double hit_rate;                        /* GPU expert hits / loads in SPLIT and FETCH layers (-1: none) */
    double page_hit_rate;                   /* host page-cache hits / host expert loads (-1: none) */
    double distinct;                        /* distinct experts per MoE layer per step */
    double reuse;                           /* fraction of a token's experts re-picked by its next token */
    double by_resource[MS_N_RES];           /* seconds per step attributed to each resource */
    double by_phase[MS_N_PHASES];           /* seconds per step by phase */
    double bytes[MS_N_BYTES];               /* bytes moved per step */
    double selections;                      /* expert selections sampled or replayed */
} ms_decode_result_t;

/* Bytes of workspace one configuration needs (per thread). */
int64_t ms_decode_workspace_size(const ms_decode_model_t *m, const ms_routing_t *r, const ms_decode_config_t *c);

/* A GPU step's dense weight reads, and the tokens its GEMM FLOPs count (csrc/ms_machine.c; twins: lower.machine) */
double ms_weight_passes(const ms_machine_t *hw, double tokens);
double ms_gemm_tokens(const ms_machine_t *hw, double tokens, double rows);
double ms_gemv_time(const ms_machine_t *hw, double tokens, double passes, double weights, double *tokens_s);

int ms_decode(const ms_decode_model_t *m, const ms_machine_t *hw, const ms_routing_t *r,
              const ms_decode_config_t *c, void *workspace, int64_t workspace_bytes, ms_decode_result_t *out);

/* n configurations sharing model, machine and routing; per-thread workspace of ws_bytes each. */
int ms_decode_many(const ms_decode_model_t *m, const ms_machine_t *hw, const ms_routing_t *r,
                   const ms_decode_config_t *cfgs, int64_t n, ms_decode_result_t *out, int n_threads,
                   void *workspace, int64_t ws_bytes, int64_t *err_index);

/* The analytic path's table (ms_analytic.c): per routing layer l, out[l][MS_CHE_*] = the expected counts of
 * one step of `batch` sequences x `tokens_per_step` tokens with `slots` GPU expert slots under `policy`: the
 * distinct experts D, the selection (q, per token) and inclusion (p, per step) mass of the `slots` hottest
 * experts (pinned) and of the rest (free), the GPU hit rate (LRU: a sticky chain in whole steps of recency
 * per scenario combination, or on the window tables of a token-memory routing; LFU: counts since the run
 * began, averaged over steps [warmup, steps); static: the pinned share) and the reuse statistic. They depend
 * on nothing else (not the model, machine, context or prefetch recall), so a sweep computes them once and
 * passes them to every configuration that shares them (ms_decode_config_t.che). batch, tokens_per_step, steps
 * < 1, slots < 0 or warmup outside [0, steps) is MS_ERR_BAD_SIZE, Belady or an unknown policy MS_ERR_BAD_POLICY,
 * a routing without analytic tables or malformed MS_ERR_BAD_ROUTING. Workspace: ms_che_table_workspace_size(r). */
enum { MS_CHE_D = 0, MS_CHE_PINNED_Q, MS_CHE_PINNED_P, MS_CHE_FREE_Q, MS_CHE_FREE_P, MS_CHE_HIT, MS_CHE_REUSE,
       MS_CHE_FIELDS };
int64_t ms_che_table_workspace_size(const ms_routing_t *r);
int ms_che_table(const ms_routing_t *r, int32_t batch, int32_t tokens_per_step, int32_t slots, int32_t policy,
                 int64_t steps, int64_t warmup, void *workspace, int64_t workspace_bytes, double *out);

/* 0, or 1 when a routing's token-memory window tables are malformed (nodes not increasing from 1, log
 * probabilities above 0, not finite or rising with the window); 0 without them. Ignores windows_checked:
 * what a caller runs once to set it (ms_decode.c). */
int ms_check_windows(const ms_routing_t *r);

/* The analytic path's host page-cache table (ms_analytic.c): out[l] = the hit rate (hits per step / distinct
 * experts D; 0 when D is 0) of routing layer l's host page cache of `page_slots` experts over one step of
 * `batch` sequences x `tokens_per_step` tokens: Che's approximation on the window tables of a token-memory
 * routing, else on the step's inclusion probabilities (independent picks). It depends on nothing else (not
 * the placement, GPU slots, policy, machine or context), so a sweep computes it once and passes it to every
 * configuration that shares it (ms_decode_config_t.page_hit). Errors as ms_che_table (page_slots < 0 is
 * MS_ERR_BAD_SIZE). Workspace: ms_che_table_workspace_size(r) bytes. */
int ms_page_table(const ms_routing_t *r, int32_t batch, int32_t tokens_per_step, int32_t page_slots, void *workspace,
                  int64_t workspace_bytes, double *out);

/* Sample the routing only (Monte Carlo config c; another mode, or steps x n_experts >= INT32_MAX, is
 * MS_ERR_BAD_SIZE): writes every token's picks to tokens_out [steps][batch][tokens_per_step][n_layers][top_k].
 * Workspace as ms_decode_workspace_size. */
int ms_route_sample(const ms_routing_t *r, const ms_decode_config_t *c, int32_t *tokens_out, void *workspace,
                    int64_t workspace_bytes);

/* Replay a routing sequence through one per-layer cache: hits / accesses per layer. `sel` is
 * [n_steps][n_layers][width] with `nsel` [n_steps][n_layers] valid entries (a step's distinct experts).
 * Workspace: ms_cache_workspace_size(...) bytes. */
int64_t ms_cache_workspace_size(int32_t n_experts, int32_t n_layers, int64_t n_steps, int32_t width);
int ms_cache_replay(const int32_t *sel, const int32_t *nsel, int64_t n_steps, int32_t n_layers, int32_t width,
                    int32_t n_experts, int32_t capacity, int32_t policy, const int32_t *hot, int64_t warmup,
                    void *workspace, int64_t workspace_bytes, double *hits, double *accesses);

/* ================================================================ sweeps (ms_sweep.c)
 *
 * Two levels. A *group* (model, quant, machine, runtime, KV dtype, placement rule, policy) is lowered
 * once, in Python, to the tables below; its configurations (context, batch) then run in tight loops:
 * memory (bytes per tier, fits, max context / batch, the runtime's automatic placement) from layer
 * *kinds* (layers with identical per-sequence caches), and decode / prefill time as a per-variant
 * constant (everything but attention, from the analytic kernel with attention zeroed) plus a sum over
 * attention kinds of the attention term, which depends on context.
 */

/* A quantity of context C, per layer or kind of layer:
 *   a1*min(C, c1) + a2*min(C, c2) + b1*min(C / r, k1) + b2*(C / r) + s
 * c1, c2, k1 < 0: no cap; r <= 0: no C / r terms. */
typedef struct {
    double a1, a2, b1, b2, s;
    int64_t c1, c2, r, k1;
} ms_ctx_fn_t;

double ms_ctx_eval(const ms_ctx_fn_t *f, int64_t context);

/* Group rules for the placement of each configuration. */
enum { MS_SWEEP_FIXED = 0, MS_SWEEP_AUTO_LLAMA, MS_SWEEP_AUTO_KT };

/* One candidate placement of a group: its weights per tier (exact byte sums) and KV layout. */
typedef struct {
    int32_t code;                /* MS_PLACE_* */
    int64_t arg;
    int32_t layout;              /* row of gpu_count: which layers' attention and KV live on the GPU */
    int32_t cfg;                 /* 0: the group's GPU configuration, 1: its CPU-only configuration */
    int32_t any_gpu;             /* anything on the GPU tier (its compute buffers are then allocated) */
    int32_t label;               /* output code of the placement column */
    double w_gpu, w_host;        /* weight bytes (every weight class) on each tier */
    double w_gpu_one;            /* the busiest GPU's weight bytes: sum of each class's GPU bytes / gpu_ways */
    double routed_host;          /* routed-expert bytes in host RAM (host page-cache share) */
} ms_sweep_place_t;

typedef struct {
    /* layer kinds: per-sequence cache of a layer at padded context P is
     * per_token*min(P, cap or P) + (P / ratio)*ratio_bytes, plus a fixed state */
    int32_t n_kinds;
    const double *per_token, *ratio_bytes, *state;   /* [n_kinds] */
    const int64_t *cap, *ratio;                      /* [n_kinds] */
    const int32_t *count;                            /* [n_kinds] layers of the kind */
    int32_t n_layouts;
    const int32_t *gpu_count;                        /* [n_layouts][n_kinds] layers of the kind on the GPU */
    int64_t max_context;                             /* the model's trained context */
    ms_mem_config_t cfg[2];                          /* capacities and buffers (context, batch, placement unused) */
    int32_t n_places;
    const ms_sweep_place_t *places;
    int32_t rule;                                    /* MS_SWEEP_*; FIXED uses places[0] */
    int32_t n_layers, n_experts;
    /* first candidate of each kind (-1: absent): all-gpu, n-cpu-moe=0..L, layers-gpu=0..L, cpu-only,
     * experts-cpu, gpu-experts=0..E */
    int32_t i_all_gpu, i_n_cpu_moe, i_layers_gpu, i_cpu_only, i_experts_cpu, i_gpu_experts;
    int32_t fits_label[8];                           /* output code of the fits column per MS_FITS_* bits */
} ms_sweep_mem_t;

/* The fast axes of a group: its configuration j is (contexts[j / n_b], batches[j % n_b]), or
 * (contexts[j], batches[j]) when the two axes are zipped. */
typedef struct {
    const int64_t *contexts, *batches;
    int64_t n_c;
    int32_t n_b, zipped;
} ms_sweep_axes_t;

typedef struct {                 /* caller-owned columns of n entries */
    int64_t *context, *batch;
    int32_t *placement, *fits;   /* output codes */
    int64_t *key;                /* decode variant key ((place * (E + 2) + page_slots) * n_b + batch index) */
    double *weights, *kv, *state, *gpu, *host, *storage;
    int64_t *max_context, *max_batch;
} ms_sweep_mem_out_t;

/* Bytes of per-thread workspace ms_sweep_memory needs (memos of max context and max batch). */
int64_t ms_sweep_memory_workspace_size(int32_t n_b);

/* Configurations j0 .. j0 + n - 1 of a group: placement, bytes per tier, fits, max context and batch. */
int ms_sweep_memory(const ms_sweep_mem_t *g, const ms_sweep_axes_t *axes, int64_t j0, int64_t n, int n_threads,
                    void *workspace, int64_t ws_bytes, ms_sweep_mem_out_t *out, int64_t *err_index);

/* Map keys to variants (sorted table_keys[n_table] -> index); unknown keys get -1 and are listed
 * (at most max_missing, each once per cache refill) in missing. Returns the number of unknown configurations. */
int64_t ms_sweep_lookup(const int64_t *keys, int64_t n, const int64_t *table_keys, int64_t n_table, int32_t *variant,
                        int64_t *missing, int64_t max_missing, int64_t *n_missing);

typedef struct {                 /* one attention kind of a decode variant (coefficients precomputed) */
    double n;                    /* layers of the kind */
    double kv_rate, sf_rate;     /* its cache reads B * kv(C) * kv_rate and scores B * sf(C) * sf_rate (1 / bw, 1 / fl) */
    int32_t res_mem, res_flops;  /* MS_RES_* the time goes to */
    int32_t fn;                  /* its (kv, sf) context functions */
} ms_sweep_kind_t;

typedef struct {
    double step0;                /* seconds per step with the attention over the cache zeroed (analytic kernel) */
    double by_resource[MS_N_RES];
    double accepted;             /* tokens per sequence per step */
    double tpot_scale;           /* 1e3 / accepted */
    double hit_rate;             /* GPU expert hit rate (-1: none) */
    double prefill0;             /* prefill seconds of the prompt (one sequence, from an empty cache) */
    int32_t kind0, n_kinds;      /* its slice of the kinds table */
    int32_t mc;                  /* its Monte Carlo template (-1: none) */
} ms_sweep_variant_t;

#define MS_SWEEP_MAX_FNS 64

/* Every index is checked against its table before any configuration runs (MS_ERR_BAD_SWEEP, never a
 * read out of bounds): each variant's slice kind0 .. kind0 + n_kinds - 1 against n_kinds below, each
 * kind's fn against n_fns, and (Monte Carlo) each variant's mc against n_templates, each layer_fn
 * against n_fns, each template's n_layers against n_layers. */
typedef struct {
    const ms_sweep_variant_t *variants;
    int32_t n_variants;
    const ms_sweep_kind_t *kinds;
    int32_t n_kinds;                                 /* rows of kinds */
    int32_t n_fns;                                   /* distinct (kv, sf) context functions of the group */
    const ms_ctx_fn_t *fn_kv, *fn_sf;                /* KV bytes per sequence, score FLOPs per token */
    double prompt;                                   /* prefill tokens/s = prompt / prefill seconds */
    /* Monte Carlo */
    int32_t n_layers;
    const int32_t *layer_fn;                         /* [n_layers] index into fn_kv / fn_sf */
    int32_t n_templates;                             /* rows of mc_models / mc_machines */
    const ms_decode_model_t *mc_models;              /* [n_templates]: kv_bytes holds each layer's KV copies (the
                                                        context KV bytes are scaled by it), score_flops set per config */
    const ms_machine_t *mc_machines;                 /* [n_templates] */
    const ms_routing_t *routing;
    int64_t steps, warmup;
    int32_t policy;
    uint64_t seed;
} ms_sweep_decode_t;

typedef struct {                 /* caller-owned columns of n entries; p50 / p99 may be NULL (analytic) */
    double *decode_tok_s, *aggregate_tok_s, *tpot_ms, *tpot_p50_ms, *tpot_p99_ms, *prefill_tok_s, *hit_rate;
    int32_t *bottleneck;         /* MS_RES_* with the most time per step */
} ms_sweep_dec_out_t;

int ms_sweep_analytic(const ms_sweep_decode_t *d, const int64_t *context, const int64_t *batch, const int32_t *variant,
                      int64_t n, int n_threads, ms_sweep_dec_out_t *out, int64_t *err_index);

/* Bytes of per-thread workspace ms_sweep_montecarlo needs for batches up to max_batch. */
int64_t ms_sweep_montecarlo_workspace_size(const ms_sweep_decode_t *d, int32_t max_batch);

/* Monte Carlo: configuration i runs ms_decode with stream (seed, index[i]); a batch outside [1, INT32_MAX]
 * is MS_ERR_BAD_SIZE at its index. */
int ms_sweep_montecarlo(const ms_sweep_decode_t *d, const int64_t *context, const int64_t *batch,
                        const int32_t *variant, const uint64_t *index, int64_t n, int n_threads, void *workspace,
                        int64_t ws_bytes, ms_sweep_dec_out_t *out, int64_t *err_index);

/* The rows [start, end) of one group in a chunk's columns, with what the screen compares them to. */
typedef struct {
    int64_t start, end;
    double gpu_cap, host_cap, storage_cap;   /* n_gpus x GPU capacity; host RAM; storage (0: no paging) */
    int64_t max_context;                     /* the model's trained maximum */
    int64_t context_bound;                   /* the largest max_context allowed */
} ms_screen_segment_t;

/* The consistency screen of a sweep chunk (csrc/ms_screen.c): *first_flagged gets the first row of the
 * segments that could break a result guarantee (-1: none). fits_lut maps an output fits code to bits
 * 1 fits, 2 GPU tier in use, 4 storage in use; rel is the relative slack of the decode identities.
 * The caller owns the columns (mem and dec, every segment's rows within them). */
int ms_sweep_screen(const ms_sweep_mem_out_t *mem, const ms_sweep_dec_out_t *dec, const ms_screen_segment_t *segs,
                    int32_t n_segs, const int8_t *fits_lut, int32_t n_lut, double rel, int64_t max_batch,
                    int n_threads, int64_t *first_flagged);

/* =====================================================================================================
 * Automatic placement of one configuration (csrc/ms_place.c).
 *
 * The runtime's own fitting (llama.cpp --fit, ktransformers) is implemented once, in the sweep's
 * choose(); moesim.fit asks it for one (context, batch) through this entry point. g is a group table
 * as for ms_sweep_memory (candidates in the order engine.lower.placement lists them); *chosen gets
 * the index into g->places of the candidate picked (0 for MS_SWEEP_FIXED).
 * ===================================================================================================== */
int ms_auto_placement(const ms_sweep_mem_t *g, int64_t context, int64_t batch, int32_t *chosen);

/* The largest context (at most g->max_context, 0 if none) that fits at this batch under the placement the
 * rule picks for that context: the largest of the candidates' own (the rule picks one that fits whenever
 * one does); for MS_SWEEP_FIXED that of candidate 0. Sweeps report the same value. */
int ms_auto_max_context(const ms_sweep_mem_t *g, int64_t batch, int64_t *max_context);

/* =====================================================================================================
 * Serving under load (csrc/ms_serve.c): a continuous-batching scheduler over a step-cost table.
 *
 * Requests of isl prompt and osl output tokens arrive (Poisson at `rate`, or a closed loop of
 * `concurrency` clients); each step schedules the running requests first (a decode token, or the next
 * chunk of a prompt), then, if nothing was preempted, admits waiting ones in arrival order, all under
 * max_num_batched_tokens and max_num_seqs (vLLM v1's scheduler). KV lives in blocks of block_size
 * tokens; a request that needs a block when none is free preempts the last-admitted running request,
 * whose KV is freed and recomputed when it is admitted again (vLLM v1: recompute). A step's seconds:
 * decode(b, mean context) + prefill(tokens, token-weighted depth) - min(forward_s, either), both by
 * bilinear interpolation in the tables (clamped at their edges).
 * ===================================================================================================== */
typedef struct {
    int32_t n_b, n_c, n_p, n_d;
    const double *grid_b, *grid_c;   /* decode batch sizes, mean contexts (ascending) */
    const double *decode_s;          /* [n_b][n_c] seconds of a decode step */
    const double *grid_p, *grid_d;   /* prompt tokens in a step, their token-weighted mean depth (ascending) */
    const double *prefill_s;         /* [n_p][n_d] seconds of a forward over those prompt tokens */
    double forward_s;                /* a forward's fixed cost (weights, launches), paid once by a mixed step */
} ms_serve_table_t;

typedef struct {
    int32_t closed_loop;             /* 1: `concurrency` clients, each sends its next request when one ends */
    int64_t concurrency;
    double rate;                     /* Poisson arrivals per second (closed_loop 0) */
    int64_t n_requests;
    int64_t isl, osl;                /* prompt and output tokens per request */
    int64_t max_num_batched_tokens, max_num_seqs;
    int64_t block_size, n_blocks;    /* KV pool: blocks of block_size tokens */
    int64_t state_blocks;            /* blocks a running request's recurrent state takes (linear attention) */
    int64_t prefix_blocks;           /* shared-prefix blocks a later request skips (0: no prefix caching) */
    int64_t snapshot_blocks;         /* extra blocks the cached prefix keeps (recurrent-state snapshots) */
    int64_t max_steps;               /* defence: more steps is MS_ERR_BAD_SERVE */
} ms_serve_config_t;

typedef struct {                     /* caller-owned per-request columns of n_requests entries */
    double *arrival_s, *first_token_s, *finish_s;
    int32_t *preemptions;
    int64_t steps, preempted, max_running, peak_blocks;
    double busy_s;                   /* seconds with at least one step running */
} ms_serve_out_t;

double ms_serve_interp(const double *gx, int32_t nx, const double *gy, int32_t ny, const double *v, double x,
                       double y);
int64_t ms_serve_workspace_size(const ms_serve_config_t *c);
int ms_serve(const ms_serve_table_t *t, const ms_serve_config_t *c, ms_rng_t *rng, void *workspace,
             int64_t workspace_bytes, ms_serve_out_t *out);

#endif
