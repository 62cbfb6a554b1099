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
