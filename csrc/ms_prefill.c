/*
 * Prefill seconds of one prompt (engine/prefill.py prefill_seconds; twin engine/reference/prefill.py): per
 * ubatch, each layer's weight reads, GEMMs, attention, CPU KV reads and routed experts, then the head. The
 * arithmetic is numpy's, operation for operation, so a sweep's C prefill equals simulate's numpy one to the bit.
 */
#include <math.h>
#include <stddef.h>

#include "moesim.h"
#include "ms_prefill.h"

/* numpy's pairwise summation (pairwise_sum in numpy's loops_utils.h.src: 8 accumulators, blocks of 128):
 * ndarray.sum() of the same values adds in this order */
static double pairwise_sum(const double *a, int64_t n)
{
    if (n < 8) {
        double res = 0.0;
        for (int64_t i = 0; i < n; i++) res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8], res;
        int64_t i;
        for (int j = 0; j < 8; j++) r[j] = a[j];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

/* np.maximum's choice (the first unless the second is larger; a NaN first stays) */
static double np_max(double a, double b)
{
    return (a >= b || isnan(a)) ? a : b;
}

/* KV bytes layer l's CPU attention reads from DRAM in a ubatch of n_tok tokens (prefill.py _kv_reads) */
static double kv_reads(const ms_prefill_model_t *p, const ms_prefill_machine_t *h, int32_t l, int64_t n_tok,
                       double rows)
{
    double one = p->kv_one[l], heads = p->kv_heads[l], walks, spill = 1.0;
    if (rows <= 0.0) return one;
    walks = heads > 0.0 ? ceil((double) n_tok / rows) * heads : 1.0;
    if (h->cpu_llc_bytes > 0.0) {
        spill = 1.0 - h->cpu_llc_bytes / np_max(one, 1e-300);
        spill = spill < 0.0 ? 0.0 : (spill > 1.0 ? 1.0 : spill);
    }
    return one * (1.0 + (walks - 1.0) * spill);
}

/* every layer's seconds in ubatch size s before its routed experts (prefill_seconds' t, its CPU KV term included) */
static void dense_layers(const ms_prefill_model_t *p, const ms_prefill_machine_t *h, int32_t s, double *t)
{
    int64_t n_tok = p->sizes[2 * s];
    double nt = (double) n_tok, rows = p->size_rows[s];
    int tiled = p->kv_one != NULL && p->size_tiled[s];
    for (int32_t l = 0; l < p->n_layers; l++) {
        int g = p->on_gpu[l] != 0;
        double bw = g ? h->gpu_bw : h->host_bw, fl = g ? h->prefill_gemm_flops : h->cpu_flops;
        /* the tiled path scores the CPU's layers at its matmul rate, the per-row walk at its attention rate */
        double sc = p->score_flops[l] / (g ? h->prefill_attn_flops : (tiled ? h->cpu_flops : h->cpu_prefill_attn_flops));
        double pt = p->flops[l] / fl + sc;
        /* a tiled GPU GEMM sweeps its weights once per tile of tokens (prefill.py weight_passes) */
        double passes = (g && h->prefill_weight_pass_tokens > 0.0) ? ceil(nt / h->prefill_weight_pass_tokens) : 1.0;
        t[l] = p->weights[l] * passes / bw + nt * pt + nt * p->act[l] / bw + p->decompress_flops[l] / fl
               + (g ? h->launch_s : h->cpu_layer_s);
        if (p->kv_one != NULL)
            t[l] += np_max(kv_reads(p, h, l, n_tok, rows) / h->host_bw - nt * sc, 0.0);
    }
}

/* ggml-cuda's MMQ tile widths step by 8 tokens, and up to 8 tokens MUL_MAT_ID runs the mat-vec kernel (mmq.cuh
 * mmq_x loop, MMVQ_MAX_BATCH_SIZE); engine/prefill.py MMQ_X_STEP */
#define MS_MMQ_X_STEP 8

/* routed-expert seconds of expert layer i when some of its traffic is on the host (prefill.py _expert_times'
 * host branch) */
static double host_experts(const ms_prefill_model_t *p, const ms_prefill_machine_t *h, int32_t i, double distinct,
                           double pairs, double gemm, double passes, double t_gpu, int layerwise)
{
    double share = p->exp_share[i], eb = p->exp_bytes[i], ef = p->exp_flops[i];
    double host_distinct = distinct * (1.0 - share), host_pairs = pairs * (1.0 - share);
    double t_cgpu = host_distinct * passes * eb / h->gpu_bw + host_pairs * ef / gemm;
    if (layerwise) {
        double link = h->pcie_bw * h->pcie_links;
        if (h->host_bw < link) link = h->host_bw;
        return t_gpu + p->exp_layer_experts[i] * eb * (1.0 - share) / link + t_cgpu;
    }
    double t_copy = host_distinct * eb / h->pcie_bw;
    double fetched = t_gpu + (h->overlap ? np_max(t_copy, t_cgpu) : t_copy + t_cgpu);
    double amx = h->amx_flops * p->amx_per_cycle;
    /* AMX tiles once the ubatch gives each host expert more than 4 tokens on average */
    double rate = host_pairs > 4.0 * np_max(host_distinct, 1e-300) ? (amx > h->cpu_flops ? amx : h->cpu_flops)
                                                                    : h->cpu_flops;
    double t_cpu = host_distinct * eb / h->host_bw + host_pairs * ef / rate;
    double computed = (h->overlap ? np_max(t_gpu, t_cpu) : t_gpu + t_cpu) + h->sync_s;
    return (p->offload || p->exp_mode[i] == MS_EXP_FETCH) ? fetched : computed;
}

/* routed-expert seconds of expert layer i in a ubatch of n_tok tokens (prefill.py _expert_times) */
static double expert_time(const ms_prefill_model_t *p, const ms_prefill_machine_t *h, int32_t i, double distinct,
                          int64_t n_tok, int layerwise)
{
    double share = p->exp_share[i], gemm = h->prefill_expert_flops, passes = 1.0;
    double pairs = (double) (n_tok * p->top_k);
    double per_expert = pairs / np_max(distinct, 1e-300);
    if (h->prefill_moe_half_tokens > 0.0)
        gemm = gemm * per_expert / (per_expert + h->prefill_moe_half_tokens);
    /* tiles as wide as the ubatch (up to the widest) for every used expert: their padded columns are computed */
    if (h->prefill_moe_tile_tokens > 0.0 && n_tok > MS_MMQ_X_STEP) {
        double width = fmin(MS_MMQ_X_STEP * ceil((double) n_tok / MS_MMQ_X_STEP), h->prefill_moe_tile_tokens);
        double tiles = fmin(np_max(per_expert / width + 0.5, 1.0), ceil((double) n_tok / width));
        gemm = gemm * per_expert / (tiles * width);
    }
    /* each used expert's weights once per tile of its tokens, the last tile half full on average */
    if (h->prefill_weight_pass_tokens > 0.0)
        passes = np_max(per_expert / h->prefill_weight_pass_tokens + 0.5, 1.0);
    double reads = h->gpu_moe_rowwise ? pairs : distinct * passes;
    double t_gpu = reads * share * p->exp_bytes[i] / h->gpu_bw + pairs * share * p->exp_flops[i] / gemm;
    if (!(pairs * (1.0 - share) > 0.0)) return t_gpu;
    return host_experts(p, h, i, distinct, pairs, gemm, passes, t_gpu, layerwise);
}

static int check(const ms_prefill_model_t *p, const ms_prefill_machine_t *h, const double *t, const double *out)
{
    if (p == NULL || h == NULL || t == NULL || out == NULL) return MS_ERR_NULL_ARGUMENT;
    if (p->n_layers <= 0 || p->n_sizes < 0 || p->n_exp < 0 || p->n_exp > p->n_layers) return MS_ERR_BAD_SIZE;
    if (p->on_gpu == NULL || p->weights == NULL || p->flops == NULL || p->score_flops == NULL
        || p->decompress_flops == NULL || p->act == NULL || (p->kv_one == NULL) != (p->kv_heads == NULL))
        return MS_ERR_NULL_ARGUMENT;
    if (p->n_sizes > 0 && (p->sizes == NULL || p->size_rows == NULL || p->size_tiled == NULL))
        return MS_ERR_NULL_ARGUMENT;
    if (p->n_exp > 0 && (p->exp_layer == NULL || p->exp_mode == NULL || p->exp_share == NULL || p->exp_bytes == NULL
                         || p->exp_flops == NULL || p->exp_layer_experts == NULL || p->exp_distinct == NULL))
        return MS_ERR_NULL_ARGUMENT;
    for (int32_t i = 0; i < p->n_exp; i++)
        if (p->exp_layer[i] < 0 || p->exp_layer[i] >= p->n_layers) return MS_ERR_BAD_SIZE;
    for (int32_t s = 0; s < p->n_sizes; s++)
        if (p->sizes[2 * s] < 1 || p->sizes[2 * s + 1] < 0) return MS_ERR_BAD_SIZE;
    return 0;
}

int ms_prefill_seconds(const ms_prefill_model_t *p, const ms_prefill_machine_t *h, double *workspace, double *out)
{
    double total = 0.0;
    int rc = check(p, h, workspace, out);
    if (rc) return rc;
    for (int32_t s = 0; s < p->n_sizes; s++) {
        int64_t n_tok = p->sizes[2 * s];
        /* kt-kernel's layerwise prefill: a forward of at least `threshold` tokens streams each layer's experts */
        int layerwise = 0 < p->threshold && p->threshold <= n_tok;
        dense_layers(p, h, s, workspace);
        for (int32_t i = 0; i < p->n_exp; i++)
            workspace[p->exp_layer[i]] += expert_time(p, h, i, p->exp_distinct[(int64_t) s * p->n_exp + i], n_tok,
                                                      layerwise);
        double t_ub = pairwise_sum(workspace, p->n_layers) + p->head_bytes / h->gpu_bw
                      + p->head_flops / h->prefill_flops;
        total += (double) p->sizes[2 * s + 1] * t_ub;
    }
    /* the host builds the first graph before the device starts; later ones while it runs */
    *out = total + (p->n_sizes > 0 ? h->step_s : 0.0);
    return 0;
}
