# Declarations of the plain-C core (csrc/moesim.h) for the Cython glue.
from libc.stdint cimport int32_t, int64_t

cdef extern from "moesim.h" nogil:
    int MS_N_CLASSES
    int MS_N_TIERS

    const char *ms_strerror(int err)

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
        int64_t kv_granularity
        double gpu_fixed
        double gpu_buf0
        double gpu_buf_ctx
        double host_fixed
        double host_buf0
        double host_buf_ctx

    ctypedef struct ms_mem_result_t:
        double by_class[11][3]
        double tier[3]
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

    ctypedef struct ms_machine_t:
        double gpu_bw, host_bw, pcie_bw, storage_bw
        double gpu_flops, cpu_flops
        double interconnect_bw
        int32_t unified
        int32_t overlap
        double launch_s, sync_s, dma_s, allreduce_s, step_s, seq_s

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
        const double *qsq
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
    int ms_route_sample(const ms_routing_t *r, const ms_decode_config_t *c, int32_t *tokens_out, void *workspace,
                        int64_t workspace_bytes)
