# Declarations of the plain-C core (csrc/moesim.h) for the Cython glue.
from libc.stdint cimport int8_t, int32_t, int64_t, uint64_t

cdef extern from "moesim.h" nogil:
    int MS_N_CLASSES
    int MS_N_TIERS
    int MS_N_RES
    int MS_N_PHASES
    int MS_N_BYTES
    int MS_MAX_MOE_LAYERS
    int MS_MAX_TOP_K
    int MS_SWEEP_MAX_FNS

    const char *ms_strerror(int err)

    ctypedef struct ms_rng_t:
        uint64_t s[4]
    uint64_t ms_splitmix64_next(uint64_t *x)
    void ms_rng_init(ms_rng_t *rng, uint64_t seed, uint64_t a, uint64_t b)
    uint64_t ms_rng_next(ms_rng_t *rng)
    double ms_rng_uniform(ms_rng_t *rng)

    ctypedef struct ms_model_t:
        int32_t n_layers
        const double *attn
        const double *router
        const double *shared
        const double *expert_one
        const int32_t *n_experts
        const double *dense
        const double *kv_elems
        const double *kv_fixed
        const double *kv_ratio_elems
        const double *kv_ratio_fixed
        const double *kv_state
        const int64_t *kv_cap
        const int64_t *kv_ratio
        double embed
        double head
        double mtp
        int32_t mtp_layers
        int64_t max_context

    ctypedef struct ms_mem_config_t:
        int64_t context
        int64_t batch
        double kv_bytes_per_elem
        int32_t placement
        int64_t placement_arg
        int32_t mtp
        int32_t n_gpus
        double gpu_capacity
        double host_capacity
        double storage_capacity
        int32_t storage_spill
        int32_t embed_on_gpu
        double head_copy
        int64_t kv_granularity
        double gpu_fixed
        double gpu_buf0
        double gpu_buf_ctx
        double host_fixed
        double host_buf0
        double host_buf_ctx
        double gpu_ways[11]

    ctypedef struct ms_mem_result_t:
        double by_class[11][3]
        double tier[3]
        double gpu_per_gpu
        double weights
        double kv
        double state
        double kv_bytes_per_token
        int32_t fits
        int64_t max_context
        int64_t max_batch

    int ms_memory_many(const ms_model_t *model, const ms_mem_config_t *cfgs, int64_t n,
                       ms_mem_result_t *out, int n_threads, int64_t *err_index)

    ctypedef struct ms_decode_model_t:
        int32_t n_layers
        const double *attn_bytes
        const double *attn_flops
        const double *kv_bytes
        const double *score_flops
        const double *shared_bytes
        const double *shared_flops
        const double *expert_bytes
        const double *expert_flops
        const int32_t *attn_on_gpu
        const int32_t *expert_mode
        const int32_t *slots
        const int32_t *page_slots
        const int32_t *moe_index
        double head_bytes
        double head_flops
        int32_t head_on_gpu
        double draft_bytes
        double draft_flops
        double act_bytes
        double allreduce_bytes
        const double *ep_load_experts
        const double *ep_load_pairs
        double a2a_bytes
        const double *layer_ops
        const double *gemm_rows

    ctypedef struct ms_machine_t:
        double gpu_bw, host_bw, pcie_bw, storage_bw
        double gpu_flops, cpu_flops
        double interconnect_bw
        int32_t unified
        int32_t overlap
        double launch_s, sync_s, dma_s, allreduce_s, step_s, seq_s
        double a2a_bw, a2a_s
        double moe_s, cpu_layer_s
        double op_s, cpu_op_s
        int32_t graph_max_tokens
        double nograph_s, mmid_sync_s
        double cpu_attn_flops
        int32_t mm_min_tokens, mm_tile_tokens, mv_ext_cols, mv_ext_min_tokens, mv_ext_k_min_tokens, moe_rowwise_below
        double mv_ext_share, mv_ext_k_share
        int32_t mm_tile_rows
        double mm_slots
        double gemv_weight_s, gemv_token_rel

    ctypedef struct ms_routing_t:
        int32_t n_layers
        int32_t n_experts, top_k
        int32_t n_group, topk_group
        const double *log_pop
        const double *stickiness
        const double *recall
        const int32_t *hot
        double concentration
        int64_t request_tokens
        int32_t n_scenarios
        const double *q
        const double *qbar
        const double *lqbar
        int32_t n_window
        const double *win_n
        const double *win_lq
        int32_t n_moment
        const double *win_m
        const double *win_var
        const double *win_cov
        int32_t windows_checked
        const double *recency
        const double *recency_lag
        int32_t history
        const double *coupling
        const int32_t *partners
        int32_t n_partners
        const int32_t *trace
        int64_t trace_tokens
        int32_t trace_layers

    ctypedef struct ms_decode_config_t:
        int32_t batch
        int32_t tokens_per_step
        int32_t drafts
        double accepted
        int64_t steps, warmup
        int32_t policy
        int32_t mode
        unsigned long long seed
        unsigned long long index
        const double *che
        int32_t che_slots
        const double *page_hit
        int32_t page_hit_slots

    ctypedef struct ms_decode_result_t:
        double step_mean, step_p50, step_p99
        double accepted
        double hit_rate
        double page_hit_rate
        double distinct
        double reuse
        double by_resource[8]
        double by_phase[6]
        double bytes[4]
        double selections

    int64_t ms_decode_workspace_size(const ms_decode_model_t *m, const ms_routing_t *r, const ms_decode_config_t *c)
    int ms_decode_many(const ms_decode_model_t *m, const ms_machine_t *hw, const ms_routing_t *r,
                       const ms_decode_config_t *cfgs, int64_t n, ms_decode_result_t *out, int n_threads,
                       void *workspace, int64_t ws_bytes, int64_t *err_index)
    int64_t ms_cache_workspace_size(int32_t n_experts, int32_t n_layers, int64_t n_steps, int32_t width)
    int ms_cache_replay(const int32_t *sel, const int32_t *nsel, int64_t n_steps, int32_t n_layers, int32_t width,
                        int32_t n_experts, int32_t capacity, int32_t policy, const int32_t *hot, int64_t warmup,
                        void *workspace, int64_t workspace_bytes, double *hits, double *accesses)
    int MS_CHE_FIELDS
    int64_t ms_che_table_workspace_size(const ms_routing_t *r)
    int ms_che_table(const ms_routing_t *r, int32_t batch, int32_t tokens_per_step, int32_t slots, int32_t policy,
                     int64_t steps, int64_t warmup, void *workspace, int64_t workspace_bytes, double *out) nogil
    int ms_check_windows(const ms_routing_t *r)
    int ms_page_table(const ms_routing_t *r, int32_t batch, int32_t tokens_per_step, int32_t page_slots,
                      void *workspace, int64_t workspace_bytes, double *out) nogil
    int ms_route_sample(const ms_routing_t *r, const ms_decode_config_t *c, int32_t *tokens_out, void *workspace,
                        int64_t workspace_bytes)
    # ---------------------------------------------------------------- sweeps (ms_sweep.c)
    ctypedef struct ms_ctx_fn_t:
        double a1, a2, b1, b2, s
        int64_t c1, c2, r, k1

    double ms_ctx_eval(const ms_ctx_fn_t *f, int64_t context)
    double ms_weight_passes(const ms_machine_t *hw, double tokens)
    double ms_gemm_tokens(const ms_machine_t *hw, double tokens, double rows)
    double ms_gemv_time(const ms_machine_t *hw, double tokens, double passes, double weights, double *tokens_s)

    ctypedef struct ms_sweep_place_t:
        int32_t code
        int64_t arg
        int32_t layout
        int32_t cfg
        int32_t any_gpu
        int32_t label
        double w_gpu, w_host
        double w_gpu_one
        double routed_host

    ctypedef struct ms_sweep_mem_t:
        int32_t n_kinds
        const double *per_token
        const double *ratio_bytes
        const double *state
        const int64_t *cap
        const int64_t *ratio
        const int32_t *count
        int32_t n_layouts
        const int32_t *gpu_count
        int64_t max_context
        ms_mem_config_t cfg[2]
        int32_t n_places
        const ms_sweep_place_t *places
        int32_t rule
        int32_t n_layers, n_experts
        int32_t i_all_gpu, i_n_cpu_moe, i_layers_gpu, i_cpu_only, i_experts_cpu, i_gpu_experts
        int32_t fits_label[8]

    ctypedef struct ms_sweep_axes_t:
        const int64_t *contexts
        const int64_t *batches
        int64_t n_c
        int32_t n_b, zipped

    ctypedef struct ms_sweep_mem_out_t:
        int64_t *context
        int64_t *batch
        int32_t *placement
        int32_t *fits
        int64_t *key
        double *weights
        double *kv
        double *state
        double *gpu
        double *host
        double *storage
        int64_t *max_context
        int64_t *max_batch

    int64_t ms_sweep_memory_workspace_size(int32_t n_b)
    int ms_sweep_memory(const ms_sweep_mem_t *g, const ms_sweep_axes_t *axes, int64_t j0, int64_t n, int n_threads,
                        void *workspace, int64_t ws_bytes, ms_sweep_mem_out_t *out, int64_t *err_index)
    int64_t ms_sweep_lookup(const int64_t *keys, int64_t n, const int64_t *table_keys, int64_t n_table,
                            int32_t *variant, int64_t *missing, int64_t max_missing, int64_t *n_missing)

    ctypedef struct ms_sweep_kind_t:
        double n
        double kv_rate, sf_rate
        int32_t res_mem, res_flops
        int32_t fn

    ctypedef struct ms_sweep_variant_t:
        double step0
        double by_resource[8]
        double accepted
        double tpot_scale
        double hit_rate
        double prefill0
        int32_t kind0, n_kinds
        int32_t mc

    ctypedef struct ms_sweep_decode_t:
        const ms_sweep_variant_t *variants
        int32_t n_variants
        const ms_sweep_kind_t *kinds
        int32_t n_kinds
        int32_t n_fns
        const ms_ctx_fn_t *fn_kv
        const ms_ctx_fn_t *fn_sf
        double prompt
        int32_t n_layers
        const int32_t *layer_fn
        int32_t n_templates
        const ms_decode_model_t *mc_models
        const ms_machine_t *mc_machines
        const ms_routing_t *routing
        int64_t steps, warmup
        int32_t policy
        uint64_t seed

    ctypedef struct ms_sweep_dec_out_t:
        double *decode_tok_s
        double *aggregate_tok_s
        double *tpot_ms
        double *tpot_p50_ms
        double *tpot_p99_ms
        double *prefill_tok_s
        double *hit_rate
        int32_t *bottleneck

    int ms_sweep_analytic(const ms_sweep_decode_t *d, const int64_t *context, const int64_t *batch,
                          const int32_t *variant, int64_t n, int n_threads, ms_sweep_dec_out_t *out,
                          int64_t *err_index)
    int64_t ms_sweep_montecarlo_workspace_size(const ms_sweep_decode_t *d, int32_t max_batch)
    int ms_sweep_montecarlo(const ms_sweep_decode_t *d, const int64_t *context, const int64_t *batch,
                            const int32_t *variant, const uint64_t *index, int64_t n, int n_threads,
                            void *workspace, int64_t ws_bytes, ms_sweep_dec_out_t *out, int64_t *err_index)

# ---- automatic placement of one configuration (csrc/ms_place.c; glue in _place.pxi)
cdef extern from "moesim.h" nogil:
    ctypedef struct ms_screen_segment_t:
        int64_t start, end
        double gpu_cap, host_cap, storage_cap
        int64_t max_context
        int64_t context_bound
    int ms_sweep_screen(const ms_sweep_mem_out_t *mem, const ms_sweep_dec_out_t *dec,
                        const ms_screen_segment_t *segs, int32_t n_segs, const int8_t *fits_lut, int32_t n_lut,
                        double rel, int64_t max_batch, int n_threads, int64_t *first_flagged)
    int ms_auto_placement(const ms_sweep_mem_t *g, int64_t context, int64_t batch, int32_t *chosen)
    int ms_auto_max_context(const ms_sweep_mem_t *g, int64_t batch, int64_t *max_context)

    ctypedef struct ms_serve_table_t:
        int32_t n_b, n_c, n_p, n_d
        const double *grid_b
        const double *grid_c
        const double *decode_s
        const double *grid_p
        const double *grid_d
        const double *prefill_s
        double forward_s
    ctypedef struct ms_serve_config_t:
        int32_t closed_loop
        int64_t concurrency
        double rate
        int64_t n_requests, isl, osl, max_num_batched_tokens, max_num_seqs
        int64_t block_size, n_blocks, state_blocks, prefix_blocks, snapshot_blocks, max_steps
    ctypedef struct ms_serve_out_t:
        double *arrival_s
        double *first_token_s
        double *finish_s
        int32_t *preemptions
        int64_t steps, preempted, max_running, peak_blocks
        double busy_s
    double ms_serve_interp(const double *gx, int32_t nx, const double *gy, int32_t ny, const double *v, double x,
                           double y)
    int64_t ms_serve_workspace_size(const ms_serve_config_t *c)
    int ms_serve(const ms_serve_table_t *t, const ms_serve_config_t *c, ms_rng_t *rng, void *workspace,
                 int64_t workspace_bytes, ms_serve_out_t *out)


cdef extern from "ms_window.h" nogil:
    int64_t ms_window_workspace_size(int32_t n_experts, int32_t max_window)
    int ms_window_count(const int32_t *tokens, int64_t n_tokens, int32_t n_layers, int32_t top_k, int32_t n_experts,
                        const int32_t *nodes, int32_t n_nodes, void *workspace, int64_t workspace_bytes, int64_t *out)
    int64_t ms_window_moments_workspace_size(int64_t n_tokens, int32_t top_k, int32_t n_experts)
    int ms_window_moments(const int32_t *tokens, int64_t n_tokens, int32_t n_layers, int32_t top_k, int32_t n_experts,
                          int64_t request_tokens, const int32_t *nodes, int32_t n_nodes, void *workspace,
                          int64_t workspace_bytes, int64_t *out)


cdef extern from "ms_prefill.h" nogil:
    ctypedef struct ms_prefill_model_t:
        int32_t n_layers
        const int32_t *on_gpu
        const double *weights
        const double *flops
        const double *score_flops
        const double *decompress_flops
        const double *act
        const double *kv_one
        const double *kv_heads
        int32_t n_sizes
        const int64_t *sizes
        const double *size_rows
        const int32_t *size_tiled
        int32_t n_exp
        const int32_t *exp_layer
        const int32_t *exp_mode
        const double *exp_share
        const double *exp_bytes
        const double *exp_flops
        const double *exp_layer_experts
        const double *exp_distinct
        int32_t top_k, threshold
        int32_t offload
        double head_bytes, head_flops, amx_per_cycle
    ctypedef struct ms_prefill_machine_t:
        double gpu_bw, host_bw, pcie_bw, pcie_links, prefill_flops, prefill_gemm_flops, prefill_expert_flops, cpu_flops
        double prefill_attn_flops, cpu_prefill_attn_flops, launch_s, cpu_layer_s, sync_s, cpu_llc_bytes
        double prefill_moe_half_tokens, amx_flops
        double prefill_weight_pass_tokens, prefill_moe_tile_tokens, step_s
        int32_t overlap, gpu_moe_rowwise
    int ms_prefill_seconds(const ms_prefill_model_t *p, const ms_prefill_machine_t *h, double *workspace, double *out)
