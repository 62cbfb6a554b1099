/*
 * Decode simulation: the per-step cost model of DESIGN §3 (each phase is the max over the resources it uses), the
 * workspace, Monte Carlo (real cache state step by step) and the entry points. The routing sampler is ms_route.c,
 * the analytic path (the same cost function on expected counts) ms_analytic.c; the Python twin reference/decode.py.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ms_internal.h"

#ifdef MOESIM_HAVE_OPENMP
#include <omp.h>
#endif

/* ------------------------------------------------------------------------- the cost model */

/* Add `t` seconds to resource r and phase ph. */
static void attribute(ms_decode_result_t *acc, int r, int ph, double t)
{
    acc->by_resource[r] += t;
    acc->by_phase[ph] += t;
}

/* max over candidate terms; the winner's resource gets the time. */
static double max_term(const double *t, const int *res, int n, int *winner)
{
    double best = t[0];
    *winner = res[0];
    for (int i = 1; i < n; i++)
        if (t[i] > best) { best = t[i]; *winner = res[i]; }
    return best;
}

/* Attention, router, shared experts and dense FFN of layer l: the weight GEMVs (weights once), then the
 * attention over the KV cache (KV per sequence), each kernel group's time by ms_kernel_time; then kernel
 * launches and the tensor-parallel all-reduce. */
static double layer_attention(const ms_decode_model_t *m, const ms_machine_t *hw, int32_t l, double seqs, double toks,
                              ms_decode_result_t *acc)
{
    double w_bytes = m->attn_bytes[l] + m->shared_bytes[l], kv_bytes = seqs * m->kv_bytes[l];
    int gpu = m->attn_on_gpu[l] != 0, win;
    /* a GPU's mat-mat kernel multiplies whole token tiles, and leaves idle the threadgroups few rows do not fill */
    double w_toks = gpu ? ms_gemm_tokens(hw, toks, m->gemm_rows ? m->gemm_rows[l] : 0.0) : toks;
    double w_flops = w_toks * (m->attn_flops[l] + m->shared_flops[l]), s_flops = toks * m->score_flops[l];
    double bw = gpu ? hw->gpu_bw : hw->host_bw, fl = gpu ? hw->gpu_flops : hw->cpu_flops;
    int res_mem = gpu ? MS_RES_GPU_MEM : MS_RES_HOST_MEM, res_flops = gpu ? MS_RES_GPU_COMPUTE : MS_RES_CPU_COMPUTE;
    /* a GPU backend whose GEMVs re-read the weights per token (or small-batch tile) reads them that often, and
     * decodes each pass's weights at the GEMV's own rate (ggml-metal; 0 elsewhere) */
    double passes = gpu ? ms_weight_passes(hw, toks) : 1.0;
    double t_tok = 0.0, t_dec = gpu ? ms_gemv_time(hw, toks, passes, 0.5 * (m->attn_flops[l] + m->shared_flops[l]),
                                                   &t_tok) : 0.0;
    double tw = ms_kernel_time(passes * (w_bytes / bw), fmax(w_flops / fl, t_dec), res_mem, res_flops, &win), ts, total;
    attribute(acc, win, MS_PHASE_ATTENTION, tw);
    attribute(acc, MS_RES_GPU_COMPUTE, MS_PHASE_ATTENTION, t_tok);
    tw += t_tok;
    ts = ms_kernel_time(kv_bytes / bw, s_flops / (gpu ? fl : hw->cpu_attn_flops), res_mem, res_flops, &win);
    attribute(acc, win, MS_PHASE_ATTENTION, ts);
    acc->bytes[gpu ? MS_BYTES_GPU_MEM : MS_BYTES_HOST_MEM] += passes * w_bytes + kv_bytes;
    total = tw + ts;
    if (m->attn_on_gpu[l] && hw->launch_s > 0.0) {
        /* a build that captures graphs only up to graph_max_tokens launches larger steps kernel by kernel */
        double tl = hw->launch_s + (hw->graph_max_tokens > 0 && toks > hw->graph_max_tokens ? hw->nograph_s : 0.0);
        attribute(acc, MS_RES_LATENCY, MS_PHASE_SYNC, tl);
        total += tl;
    }
    if (!m->attn_on_gpu[l] && hw->cpu_layer_s > 0.0) {
        /* a CPU layer's graph nodes each end in a barrier across the threads */
        attribute(acc, MS_RES_LATENCY, MS_PHASE_SYNC, hw->cpu_layer_s);
        total += hw->cpu_layer_s;
    }
    if (m->layer_ops && m->layer_ops[l] > 0.0) {
        double to = m->layer_ops[l] * (gpu ? hw->op_s : hw->cpu_op_s);
        attribute(acc, MS_RES_LATENCY, MS_PHASE_SYNC, to);
        total += to;
    }
    if (m->allreduce_bytes > 0.0 && m->attn_on_gpu[l]) {
        double tr = hw->allreduce_s + toks * m->allreduce_bytes / hw->interconnect_bw;
        attribute(acc, MS_RES_INTERCONNECT, MS_PHASE_TRANSFER, tr);
        total += tr;
    }
    return total;
}

/* The routed experts of layer l (work w): GPU, CPU, copies and page-ins, concurrent under overlap or
 * one backend at a time, then the CPU hand-off and the demand copies' latencies, each added in turn to
 * `total` (the layer's time so far), which is returned. */
static double layer_experts(const ms_decode_model_t *m, const ms_machine_t *hw, int32_t l, const layer_work_t *w,
                            double toks, double total, ms_decode_result_t *acc)
{
    double eb = m->expert_bytes[l], ef = m->expert_flops[l], t_tok;
    /* under moe_rowwise_below tokens each token-expert pair is multiplied alone (mul_mv_id), re-reading its rows */
    int rowwise = hw->moe_rowwise_below > 0 && toks < (double) hw->moe_rowwise_below;
    double g_bytes = (rowwise ? w->pairs_gpu : w->n_res) * eb, c_bytes = w->n_cpu * eb;
    double demand = (w->n_fetch - w->n_pref) * eb;
    /* under expert parallelism the busiest rank sets the GPU experts' time (the rates are the ranks' sum) */
    double tg_mem = g_bytes * (m->ep_load_experts ? m->ep_load_experts[l] : 1.0) / hw->gpu_bw;
    /* ... and from there its mat-mat kernel multiplies each used expert's tokens in whole mm_tile_tokens tiles */
    double pairs = hw->mm_min_tokens > 0 && hw->moe_rowwise_below > 0 && !rowwise
        ? fmax(w->pairs_gpu, w->n_res * (double) hw->mm_tile_tokens) : w->pairs_gpu;
    double tg_fl = pairs * ef * (m->ep_load_pairs ? m->ep_load_pairs[l] : 1.0) / hw->gpu_flops;
    if (rowwise) tg_fl = fmax(tg_fl, ms_gemv_time(hw, toks, toks, 0.5 * w->pairs_gpu * ef / toks, &t_tok));  /* pairs */
    double t_g = fmax(tg_mem, tg_fl);
    int r_g = tg_mem >= tg_fl ? MS_RES_GPU_MEM : MS_RES_GPU_COMPUTE;
    double t_c = fmax(c_bytes / hw->host_bw, w->pairs_cpu * ef / hw->cpu_flops);
    int r_c = c_bytes / hw->host_bw >= w->pairs_cpu * ef / hw->cpu_flops ? MS_RES_HOST_MEM : MS_RES_CPU_COMPUTE;
    double t_p = demand / hw->pcie_bw;
    double t_h = (c_bytes + demand) / hw->host_bw;
    double t_s = w->n_disk * eb / hw->storage_bw;
    double te;
    int win;
    acc->bytes[MS_BYTES_GPU_MEM] += g_bytes;
    acc->bytes[MS_BYTES_HOST_MEM] += c_bytes + (w->n_fetch + w->n_waste) * eb;
    acc->bytes[MS_BYTES_PCIE] += (w->n_fetch + w->n_waste) * eb;
    acc->bytes[MS_BYTES_STORAGE] += w->n_disk * eb;
    if (hw->overlap) {
        /* GPU experts, CPU experts, copies and page-ins proceed together */
        double t[6] = {t_g, t_c, t_p, t_h, t_s, hw->unified ? (g_bytes + c_bytes) / hw->gpu_bw : 0.0};
        int r[6] = {r_g, r_c, MS_RES_PCIE, MS_RES_HOST_MEM, MS_RES_STORAGE, MS_RES_GPU_MEM};
        te = max_term(t, r, 6, &win);
        attribute(acc, win, win == MS_RES_PCIE ? MS_PHASE_TRANSFER : MS_PHASE_EXPERTS, te);
    } else {
        /* one backend at a time (llama.cpp splits): copy, then GPU experts, then CPU experts */
        double t[3] = {t_c, t_h, t_s};
        int r[3] = {r_c, MS_RES_HOST_MEM, MS_RES_STORAGE};
        double tcpu = max_term(t, r, 3, &win);
        attribute(acc, win, MS_PHASE_EXPERTS, tcpu);
        attribute(acc, r_g, MS_PHASE_EXPERTS, t_g);
        attribute(acc, MS_RES_PCIE, MS_PHASE_TRANSFER, t_p);
        te = tcpu + t_g + t_p;
        if (hw->unified && (g_bytes + c_bytes) / hw->gpu_bw > t_g + tcpu) {
            double extra = (g_bytes + c_bytes) / hw->gpu_bw - (t_g + tcpu);
            attribute(acc, MS_RES_GPU_MEM, MS_PHASE_EXPERTS, extra);
            te += extra;
        }
    }
    total += te;
    if (w->n_cpu > 0.0) {
        /* hand-off to the CPU and back: synchronisation plus activations over PCIe */
        double ta = toks * m->act_bytes / hw->pcie_bw;
        attribute(acc, MS_RES_LATENCY, MS_PHASE_SYNC, hw->sync_s);
        attribute(acc, MS_RES_PCIE, MS_PHASE_TRANSFER, ta);
        acc->bytes[MS_BYTES_PCIE] += toks * m->act_bytes;
        total += hw->sync_s + ta;
    }
    if (w->n_fetch - w->n_pref > 0.0 && hw->dma_s > 0.0) {
        double td = (w->n_fetch - w->n_pref) * hw->dma_s;
        attribute(acc, MS_RES_LATENCY, MS_PHASE_SYNC, td);
        total += td;
    }
    return total;
}

/* Expert parallelism: the dispatch and combine all-to-all of MoE layer l, latency plus one rank's bytes
 * over its share of the scale-up fabric. */
static double layer_alltoall(const ms_decode_model_t *m, const ms_machine_t *hw, double toks, ms_decode_result_t *acc)
{
    double t;
    if (!(m->a2a_bytes > 0.0)) return 0.0;
    t = hw->a2a_s + toks * m->a2a_bytes / hw->a2a_bw;
    attribute(acc, MS_RES_INTERCONNECT, MS_PHASE_ALLTOALL, t);
    return t;
}

/* Time of layer l in one step (without the next layer's prefetch, the caller's); acc gets attribution and bytes. */
static double layer_time(const ms_decode_model_t *m, const ms_machine_t *hw, int32_t l, const layer_work_t *w,
                         double seqs, double toks, ms_decode_result_t *acc)
{
    double total = layer_attention(m, hw, l, seqs, toks, acc);
    if (m->expert_mode[l] != MS_EXP_NONE) {
        total = layer_experts(m, hw, l, w, toks, total, acc) + layer_alltoall(m, hw, toks, acc);
        /* the router, top-k, weighting and combining kernels beside the expert GEMMs; past the graph limit the
         * expert GEMMs take MMQ with expert ids, which synchronises the stream */
        double tm = hw->moe_s + (w->pairs_gpu > 0.0 && hw->graph_max_tokens > 0 && toks > hw->graph_max_tokens
                                  ? hw->mmid_sync_s : 0.0);
        if (m->attn_on_gpu[l] && tm > 0.0) {
            attribute(acc, MS_RES_LATENCY, MS_PHASE_SYNC, tm);
            total += tm;
        }
    }
    return total;
}

/* Head, drafts and per-step overhead. */
static double step_fixed(const ms_decode_model_t *m, const ms_machine_t *hw, const ms_decode_config_t *c,
                         double seqs, double toks, ms_decode_result_t *acc)
{
    int g = m->head_on_gpu != 0, r[2], win;
    double total = 0.0, t[2], bw = g ? hw->gpu_bw : hw->host_bw, fl = g ? hw->gpu_flops : hw->cpu_flops, t_tok = 0.0;
    double passes = g ? ms_weight_passes(hw, toks) : 1.0;
    t[0] = passes * (m->head_bytes / bw); r[0] = m->head_on_gpu ? MS_RES_GPU_MEM : MS_RES_HOST_MEM;
    t[1] = (m->head_on_gpu ? ms_gemm_tokens(hw, toks, 0.0) : toks) * m->head_flops / fl;
    if (m->head_on_gpu) t[1] = fmax(t[1], ms_gemv_time(hw, toks, passes, 0.5 * m->head_flops, &t_tok));
    r[1] = m->head_on_gpu ? MS_RES_GPU_COMPUTE : MS_RES_CPU_COMPUTE;
    total += max_term(t, r, 2, &win);
    attribute(acc, win, MS_PHASE_HEAD, total);
    attribute(acc, MS_RES_GPU_COMPUTE, MS_PHASE_HEAD, t_tok);
    total += t_tok;
    acc->bytes[m->head_on_gpu ? MS_BYTES_GPU_MEM : MS_BYTES_HOST_MEM] += passes * m->head_bytes;
    if (c->drafts > 0) {
        double td;
        t[0] = m->draft_bytes / bw;
        t[1] = seqs * m->draft_flops / fl;
        td = c->drafts * max_term(t, r, 2, &win);
        attribute(acc, win, MS_PHASE_HEAD, td);
        acc->bytes[m->head_on_gpu ? MS_BYTES_GPU_MEM : MS_BYTES_HOST_MEM] += c->drafts * m->draft_bytes;
        total += td;
    }
    if (hw->step_s + hw->seq_s * seqs > 0.0) {
        double ts = hw->step_s + hw->seq_s * seqs;
        attribute(acc, MS_RES_LATENCY, MS_PHASE_OVERHEAD, ts);
        total += ts;
    }
    return total;
}

/* Step time from per-layer work; prefetch of layer l's experts overlaps layer l-1. */
double ms_step_time(const ms_decode_model_t *m, const ms_machine_t *hw, const ms_decode_config_t *c,
                        const layer_work_t *work, double *lt, ms_decode_result_t *acc)
{
    double seqs = (double) c->batch, toks = (double) c->batch * c->tokens_per_step, total;
    for (int32_t l = 0; l < m->n_layers; l++) lt[l] = layer_time(m, hw, l, &work[l], seqs, toks, acc);
    for (int32_t l = 1; l < m->n_layers; l++) {
        const layer_work_t *w = &work[l];
        double bg;
        if (w->n_pref + w->n_waste <= 0.0) continue;
        bg = (w->n_pref + w->n_waste) * m->expert_bytes[l] / hw->pcie_bw;
        if (bg > lt[l - 1]) {
            attribute(acc, MS_RES_PCIE, MS_PHASE_TRANSFER, bg - lt[l - 1]);
            lt[l - 1] = bg;
        }
    }
    total = step_fixed(m, hw, c, seqs, toks, acc);
    for (int32_t l = 0; l < m->n_layers; l++) total += lt[l];
    return total;
}

/* ------------------------------------------------------------------------- workspace */

static int64_t union_width(const ms_routing_t *r, const ms_decode_config_t *c)
{
    int64_t w = (int64_t) c->batch * c->tokens_per_step * r->top_k;
    return w < r->n_experts ? w : r->n_experts;
}

static int64_t ws_layout(const ms_decode_model_t *m, const ms_routing_t *r, const ms_decode_config_t *c, char *base,
                         ws_t *ws)
{
    int64_t E = r->n_experts, L = r->n_layers > 0 ? r->n_layers : 1, K = r->top_k, B = c->batch;
    int64_t W = union_width(r, c), T = c->steps, off = 0;
    int64_t G = r->n_group > 1 ? r->n_group : 1;
    int mc = c->mode == MS_MODE_MONTECARLO;
#define TAKE(field, type, count) do { if (ws) ws->field = (type *) (base + off); off += ALIGN8((int64_t) (count) * (int64_t) sizeof(type)); } while (0)
    if (W < 1) W = 1;
    if (!mc) T = 0;
    TAKE(work, layer_work_t, m->n_layers);
    TAKE(lt, double, m->n_layers + E);          /* + E: analytic scratch */
    TAKE(times, double, T > E ? T : E);
    TAKE(w, double, mc ? B * L * E : 0);
    TAKE(aprob, double, mc ? B * L * E : 0);
    TAKE(alias, int32_t, mc ? B * L * E : 0);
    TAKE(btot, double, mc ? B * L * G : 0);
    TAKE(stk, int32_t, 2 * E);
    TAKE(seen, int32_t, E);
    TAKE(grp, ms_group_t, G);
    TAKE(zig, ms_zig_t, mc && G > 1 ? 1 : 0);
    TAKE(tok_in_req, int64_t, B);
    TAKE(trace_pos, int64_t, B);
    TAKE(sel, int32_t, T * L * W);
    TAKE(cnt, int32_t, T * L * W);
    TAKE(nsel, int32_t, T * L);
    TAKE(nu, int32_t, c->policy == MS_POLICY_BELADY ? T * L * W : 0);
    TAKE(prev, int32_t, mc ? B * L * K : 0);
    TAKE(nprev, int32_t, B * L);
    TAKE(hist, int32_t, mc && r->recency && r->history > 0 ? B * L * (int64_t) r->history * K : 0);
    TAKE(nhist, int32_t, B * L);
    TAKE(hhead, int32_t, B * L);
    TAKE(mark, int32_t, L * E);
    TAKE(pos, int32_t, L * E);
    TAKE(chosen, int32_t, E);
    TAKE(che, double, 4 * E);                   /* analytic: the LRU chain's and LFU's scratch */
    TAKE(lq, double, mc ? 0 : 2 * (int64_t) (r->n_scenarios > 0 ? r->n_scenarios : 1) * E);
    TAKE(usel, int32_t, E);
    TAKE(ucnt, int32_t, E);
    TAKE(last_seen, int32_t, E);
    TAKE(caches, char, mc ? 2 * L * ms_cache_bytes((int32_t) E) : 0);
#undef TAKE
    if (ws) {
        ws->E = (int32_t) E; ws->K = (int32_t) K; ws->L = (int32_t) L; ws->B = (int32_t) B;
        ws->W = (int32_t) W; ws->T = T;
        ws->NB = r->n_group > 1 && r->topk_group < r->n_group ? (int32_t) G : 1;
    }
    return off + 64;
}

int64_t ms_decode_workspace_size(const ms_decode_model_t *m, const ms_routing_t *r, const ms_decode_config_t *c)
{
    if (m == NULL || r == NULL || c == NULL) return 0;
    return ws_layout(m, r, c, NULL, NULL);
}

/* ------------------------------------------------------------------------- Monte Carlo */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

/* Hits, loads and distinct experts over the counted steps of a Monte Carlo run. */
typedef struct {
    double hits, loads, phits, ploads, distinct;
} mc_tally_t;

/* Carve the 2 x L per-layer caches (GPU, host page cache) from the workspace and reset them for each
 * model layer's expert mode. */
static void mc_caches(const ms_decode_model_t *m, const ms_routing_t *r, const ms_decode_config_t *c, ws_t *ws,
                      ms_cache_t *caches)
{
    int32_t E = ws->E, L = ws->L;
    ms_cache_t *gpu_c = caches, *page_c = caches + L;
    char *p = ws->caches;
    for (int32_t i = 0; i < 2 * L; i++) p = ms_cache_carve(&caches[i], p, E);
    for (int32_t i = 0; i < m->n_layers; i++) {
        int32_t l = m->moe_index[i];
        if (l < 0) continue;
        int32_t mode = m->expert_mode[i];
        int32_t pol = mode == MS_EXP_SPLIT ? MS_POLICY_STATIC : c->policy;
        ms_cache_reset(&gpu_c[l], E, mode == MS_EXP_SPLIT || mode == MS_EXP_FETCH ? m->slots[i] : 0, pol,
                       r->hot + (int64_t) l * E);
        ms_cache_reset(&page_c[l], E, m->page_slots[i], MS_POLICY_LRU, r->hot + (int64_t) l * E);
    }
}

/* Model layer i in step t: serve the step's union through the layer's caches into ws->work[i]. */
static void mc_layer(const ms_decode_model_t *m, const ms_routing_t *r, const ms_decode_config_t *c, ws_t *ws,
                     ms_cache_t *gpu_c, ms_cache_t *page_c, ms_rng_t *prng, int64_t t, int32_t i, mc_tally_t *n)
{
    int32_t E = ws->E, L = ws->L, W = ws->W;
    layer_work_t *w = &ws->work[i];
    int32_t l = m->moe_index[i], mode = m->expert_mode[i], k;
    double tick = (double) t * W;
    mc_tally_t a;                /* local tallies: the work stores could alias *n */
    int64_t row;
    memset(w, 0, sizeof(*w));
    if (l < 0 || mode == MS_EXP_NONE) return;
    a = *n;
    row = (t * L + l) * (int64_t) W;
    k = ws->nsel[t * L + l];
    if (t >= c->warmup) a.distinct += k;
    ms_cache_begin_step(&gpu_c[l], ws->sel + row, k);
    if (m->page_slots[i] < E) ms_cache_begin_step(&page_c[l], ws->sel + row, k);   /* else never accessed */
    for (int32_t j = 0; j < k; j++) {
        int32_t e = ws->sel[row + j];
        double pairs = ws->cnt[row + j];
        double nu = c->policy == MS_POLICY_BELADY ? (double) ws->nu[row + j] : 0.0;
        int on_gpu = 0, host_read = 0;
        if (mode == MS_EXP_GPU) {
            on_gpu = 1;
        } else if (mode == MS_EXP_CPU) {
            host_read = 1;
        } else {
            int hit = ms_cache_access(&gpu_c[l], e, tick + j, nu);
            if (t >= c->warmup) { a.hits += hit; a.loads += 1.0; }
            if (hit) {
                on_gpu = 1;
            } else if (mode == MS_EXP_FETCH) {
                on_gpu = 1;
                host_read = 1;
                w->n_fetch += 1.0;
                if (r->recall[l] > 0.0 && i > 0 && ms_rng_uniform(prng) < r->recall[l]) w->n_pref += 1.0;
            } else {
                host_read = 1;
            }
        }
        if (on_gpu) { w->n_res += 1.0; w->pairs_gpu += pairs; }
        if (host_read && mode != MS_EXP_FETCH) { w->n_cpu += 1.0; w->pairs_cpu += pairs; }
        if (host_read && m->page_slots[i] < E) {
            int ph = ms_cache_access(&page_c[l], e, tick + j, 0.0);
            if (t >= c->warmup) { a.phits += ph; a.ploads += 1.0; }
            if (!ph) w->n_disk += 1.0;
        }
    }
    if (r->recall[l] > 0.0 && i > 0) w->n_waste = w->n_fetch - w->n_pref;
    *n = a;
}

/* Means, p50 / p99 and rates of a Monte Carlo run from its `counted` step times and tallies. */
static void mc_summary(const ms_decode_model_t *m, ws_t *ws, int64_t counted, const mc_tally_t *n, double reuse_num,
                       double reuse_den, ms_decode_result_t *out)
{
    double sum = 0.0;
    int32_t n_moe = 0;
    for (int64_t i = 0; i < counted; i++) sum += ws->times[i];
    out->step_mean = sum / (double) counted;
    qsort(ws->times, (size_t) counted, sizeof(double), cmp_double);
    out->step_p50 = ws->times[(counted - 1) / 2];
    out->step_p99 = ws->times[(int64_t) ceil(0.99 * (double) counted) - 1];
    for (int i = 0; i < MS_N_RES; i++) out->by_resource[i] /= (double) counted;
    for (int i = 0; i < MS_N_PHASES; i++) out->by_phase[i] /= (double) counted;
    for (int i = 0; i < MS_N_BYTES; i++) out->bytes[i] /= (double) counted;
    for (int32_t i = 0; i < m->n_layers; i++) n_moe += m->moe_index[i] >= 0 && m->expert_mode[i] != MS_EXP_NONE;
    out->distinct = n_moe ? n->distinct / ((double) counted * n_moe) : 0.0;
    out->hit_rate = n->loads > 0.0 ? n->hits / n->loads : -1.0;
    out->page_hit_rate = n->ploads > 0.0 ? n->phits / n->ploads : -1.0;
    out->reuse = reuse_den > 0.0 ? reuse_num / reuse_den : 0.0;
}

static int montecarlo(const ms_decode_model_t *m, const ms_machine_t *hw, const ms_routing_t *r,
                      const ms_decode_config_t *c, ws_t *ws, ms_decode_result_t *out)
{
    double reuse_num = 0.0, reuse_den = 0.0;
    mc_tally_t n = {0.0, 0.0, 0.0, 0.0, 0.0};
    int64_t counted = 0;
    ms_cache_t caches[2 * MS_MAX_MOE_LAYERS];
    ms_rng_t prng;
    int rc;
    if (ws->L > MS_MAX_MOE_LAYERS) return MS_ERR_BAD_SIZE;
    rc = ms_route_generate(r, c, ws, &reuse_num, &reuse_den, &out->selections);
    if (rc) return rc;
    /* a dense model routes nothing: ms_route_generate() leaves the unions unset, so there is nothing to look ahead in */
    if (c->policy == MS_POLICY_BELADY && r->n_layers > 0)
        ms_next_use(ws->sel, ws->nsel, ws->T, ws->L, ws->W, ws->E, ws->nu, ws->last_seen);
    mc_caches(m, r, c, ws, caches);
    ms_rng_init(&prng, c->seed, c->index, 0xFFFFFFFFFFFFFFFFULL);
    for (int64_t t = 0; t < ws->T; t++) {
        ms_decode_result_t scratch;
        ms_decode_result_t *acc = t >= c->warmup ? out : &scratch;
        double st;
        memset(&scratch, 0, sizeof(scratch));
        for (int32_t i = 0; i < m->n_layers; i++) mc_layer(m, r, c, ws, caches, caches + ws->L, &prng, t, i, &n);
        st = ms_step_time(m, hw, c, ws->work, ws->lt, acc);
        if (t >= c->warmup) ws->times[counted++] = st;
    }
    if (counted == 0) return MS_ERR_BAD_SIZE;
    mc_summary(m, ws, counted, &n, reuse_num, reuse_den, out);
    return 0;
}

/* ------------------------------------------------------------------------- entry points */

/* 0, or 1 when the LFU count moments beside the windows are malformed: lengths increasing from >= 1, variances
 * >= 0, every value finite (none: 0). */
static int check_moments(const ms_routing_t *r, int64_t rows)
{
    int32_t M = r->n_moment;
    if (r->win_var == NULL && r->win_cov == NULL && r->win_m == NULL) return 0;
    if (r->win_var == NULL || r->win_cov == NULL || r->win_m == NULL || M < 1 || !(r->win_m[0] >= 1.0)) return 1;
    for (int32_t j = 0; j < M; j++)
        if (!isfinite(r->win_m[j]) || (j > 0 && !(r->win_m[j] > r->win_m[j - 1]))) return 1;
    for (int64_t i = 0; i < rows * M; i++)
        if (!(r->win_var[i] >= 0.0 && isfinite(r->win_var[i]) && isfinite(r->win_cov[i]))) return 1;
    return 0;
}

/* 0, or 1 when the token-memory window tables are malformed (moesim.h); the kernels test ms_windows_bad. */
int ms_check_windows(const ms_routing_t *r)
{
    int64_t rows = (int64_t) r->n_layers * r->n_experts;
    int32_t W = r->n_window;
    if (r->win_lq == NULL) return 0;
    if (r->win_n == NULL || W < 2 || !(r->win_n[0] == 1.0)) return 1;
    for (int32_t j = 1; j < W; j++)
        if (!(r->win_n[j] > r->win_n[j - 1]) || !isfinite(r->win_n[j])) return 1;
    for (int64_t i = 0; i < rows; i++) {
        const double *lq = r->win_lq + i * W;
        for (int32_t j = 0; j < W; j++)
            if (!(lq[j] <= 0.0 && isfinite(lq[j])) || (j > 0 && lq[j] > lq[j - 1])) return 1;
    }
    return check_moments(r, rows);
}

/* bad_windows: ms_check_windows(r) computed once by a caller that checks many analytic configurations (the
 * window tables are L x E x W values), or -1: check computes it where it needs it. */
static int check(const ms_decode_model_t *m, const ms_machine_t *hw, const ms_routing_t *r,
                 const ms_decode_config_t *c, int bad_windows)
{
    if (m == NULL || hw == NULL || r == NULL || c == NULL) return MS_ERR_NULL_ARGUMENT;
    if (m->n_layers <= 0 || c->batch <= 0 || c->tokens_per_step <= 0 || c->drafts < 0) return MS_ERR_BAD_SIZE;
    if (c->mode == MS_MODE_MONTECARLO && (c->steps <= c->warmup || c->warmup < 0)) return MS_ERR_BAD_SIZE;
    if (c->mode == MS_MODE_MONTECARLO && c->steps * (int64_t) r->n_experts >= INT32_MAX) return MS_ERR_BAD_SIZE;
    if (c->policy < 0 || c->policy >= MS_N_POLICIES) return MS_ERR_BAD_POLICY;
    if (!ms_machine_valid(hw)) return MS_ERR_BAD_MACHINE;
    if (m->a2a_bytes > 0.0 && !(hw->a2a_bw > 0.0 && hw->a2a_s >= 0.0)) return MS_ERR_BAD_MACHINE;
    if (!(m->a2a_bytes >= 0.0)) return MS_ERR_BAD_SIZE;
    if (r->n_layers > 0) {
        if (r->n_experts <= 0 || r->top_k <= 0 || r->top_k > r->n_experts) return MS_ERR_BAD_ROUTING;
        if (r->n_layers > MS_MAX_MOE_LAYERS) return MS_ERR_BAD_SIZE;
        if (r->top_k > MS_MAX_TOP_K) return MS_ERR_BAD_ROUTING;
        if (r->n_group > 1 && (r->n_experts % r->n_group != 0 || r->topk_group <= 0
                               || (int64_t) r->topk_group * (r->n_experts / r->n_group) < r->top_k))
            return MS_ERR_BAD_ROUTING;
        if (c->mode == MS_MODE_ANALYTIC && (r->n_scenarios <= 0 || r->q == NULL || r->qbar == NULL
                                            || r->lqbar == NULL)) return MS_ERR_BAD_ROUTING;
        if (c->mode == MS_MODE_MONTECARLO && r->trace == NULL && r->log_pop == NULL) return MS_ERR_BAD_ROUTING;
        if (c->mode == MS_MODE_ANALYTIC && (bad_windows < 0 ? ms_windows_bad(r) : bad_windows))
            return MS_ERR_BAD_ROUTING;
        if (r->trace && (r->trace_tokens <= 0 || r->trace_layers <= 0)) return MS_ERR_BAD_TRACE;
    }
    for (int32_t i = 0; i < m->n_layers; i++) {
        if (m->expert_mode[i] < 0 || m->expert_mode[i] >= MS_N_EXP_MODES) return MS_ERR_BAD_PLACEMENT;
        if (m->layer_ops && !(m->layer_ops[i] >= 0.0)) return MS_ERR_BAD_SIZE;
        if (m->gemm_rows && !(m->gemm_rows[i] >= 0.0)) return MS_ERR_BAD_SIZE;
        /* a routing row must exist for every layer that names one (the Monte Carlo caches are per row) */
        if ((m->expert_mode[i] != MS_EXP_NONE && m->moe_index[i] < 0) || m->moe_index[i] >= r->n_layers)
            return MS_ERR_BAD_ROUTING;
        if (m->slots[i] < 0 || m->page_slots[i] < 0) return MS_ERR_BAD_CAPACITY;
    }
    return 0;
}

/* ms_decode with the routing's window verdict given (check's bad_windows). */
static int decode_one(const ms_decode_model_t *m, const ms_machine_t *hw, const ms_routing_t *r,
                      const ms_decode_config_t *c, void *workspace, int64_t workspace_bytes, ms_decode_result_t *out,
                      int bad_windows)
{
    ws_t ws;
    int rc = check(m, hw, r, c, bad_windows);
    if (rc) return rc;
    if (workspace == NULL || out == NULL) return MS_ERR_NULL_ARGUMENT;
    if (workspace_bytes < ms_decode_workspace_size(m, r, c)) return MS_ERR_BAD_WORKSPACE;
    memset(out, 0, sizeof(*out));
    ws_layout(m, r, c, (char *) workspace, &ws);
    ws.tok_out = NULL;
    out->accepted = c->accepted;
    if (c->mode == MS_MODE_ANALYTIC) return ms_analytic(m, hw, r, c, &ws, out);
    return montecarlo(m, hw, r, c, &ws, out);
}

int ms_decode(const ms_decode_model_t *m, const ms_machine_t *hw, const ms_routing_t *r,
              const ms_decode_config_t *c, void *workspace, int64_t workspace_bytes, ms_decode_result_t *out)
{
    return decode_one(m, hw, r, c, workspace, workspace_bytes, out, -1);
}

int ms_route_sample(const ms_routing_t *r, const ms_decode_config_t *c, int32_t *tokens_out, void *workspace,
                    int64_t workspace_bytes)
{
    ws_t ws;
    ms_decode_model_t m;
    int32_t zero = 0, none = -1;
    double dz = 0.0, reuse_num = 0.0, reuse_den = 0.0, selections = 0.0;
    if (r == NULL || c == NULL || tokens_out == NULL || workspace == NULL) return MS_ERR_NULL_ARGUMENT;
    if (r->n_layers <= 0 || r->n_experts <= 0 || r->top_k <= 0 || r->top_k > r->n_experts) return MS_ERR_BAD_ROUTING;
    if (r->n_layers > MS_MAX_MOE_LAYERS) return MS_ERR_BAD_SIZE;
    if (r->top_k > MS_MAX_TOP_K) return MS_ERR_BAD_ROUTING;
    if (r->trace == NULL && r->log_pop == NULL) return MS_ERR_BAD_ROUTING;
    if (c->batch <= 0 || c->tokens_per_step <= 0 || c->steps <= 0) return MS_ERR_BAD_SIZE;
    /* the sampler fills Monte Carlo steps (an analytic layout has none, and would leave tokens_out unwritten);
     * the bound on steps is ms_decode's: a step's union marks are int32 */
    if (c->mode != MS_MODE_MONTECARLO || c->steps * (int64_t) r->n_experts >= INT32_MAX) return MS_ERR_BAD_SIZE;
    memset(&m, 0, sizeof(m));
    m.n_layers = 1;
    m.attn_bytes = m.attn_flops = m.kv_bytes = m.score_flops = &dz;
    m.shared_bytes = m.shared_flops = m.expert_bytes = m.expert_flops = &dz;
    m.attn_on_gpu = m.expert_mode = m.slots = m.page_slots = &zero;
    m.moe_index = &none;
    if (workspace_bytes < ms_decode_workspace_size(&m, r, c)) return MS_ERR_BAD_WORKSPACE;
    ws_layout(&m, r, c, (char *) workspace, &ws);
    ws.tok_out = tokens_out;
    return ms_route_generate(r, c, &ws, &reuse_num, &reuse_den, &selections);
}

int ms_decode_many(const ms_decode_model_t *m, const ms_machine_t *hw, const ms_routing_t *r,
                   const ms_decode_config_t *cfgs, int64_t n, ms_decode_result_t *out, int n_threads,
                   void *workspace, int64_t ws_bytes, int64_t *err_index)
{
    int first = 0, bad_windows = -1;
    int64_t bad = -1;
    if (cfgs == NULL || out == NULL || workspace == NULL) return MS_ERR_NULL_ARGUMENT;
    /* the routing's window tables checked once for all analytic configurations, not once each */
    for (int64_t i = 0; i < n && bad_windows < 0 && r != NULL && r->n_layers > 0 && r->n_experts > 0; i++)
        if (cfgs[i].mode == MS_MODE_ANALYTIC) bad_windows = ms_windows_bad(r);
    n_threads = ms_useful_threads(n, n_threads, 1);      /* a decode each: never more threads than rows */
#ifdef MOESIM_HAVE_OPENMP
    #pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads)
#endif
    for (int64_t i = 0; i < n; i++) {
        int tid = 0;
#ifdef MOESIM_HAVE_OPENMP
        tid = omp_get_thread_num();
#endif
        int rc = decode_one(m, hw, r, &cfgs[i], (char *) workspace + (int64_t) tid * ws_bytes, ws_bytes, &out[i],
                            bad_windows);
        if (rc) {
#ifdef MOESIM_HAVE_OPENMP
            #pragma omp critical
#endif
            {
                if (bad < 0 || i < bad) { bad = i; first = rc; }
            }
        }
    }
    if (err_index) *err_index = bad;
    return first;
}
