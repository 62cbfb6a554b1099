/*
 * C test harness of the moesim core: calls every public entry point of csrc/moesim.h directly, on edge
 * cases and on randomized inputs, and checks invariants (never a crash, an error code for bad input,
 * finite non-negative results, tiers that add up, the same answer on any thread count). Built by
 * tests/test_c_core.py with -Wall -Wextra -Werror -Wshadow -Wconversion under AddressSanitizer and
 * UndefinedBehaviorSanitizer; prints "N passed, M failed" and exits non-zero on any failure.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moesim.h"
#include "ms_window.h"
#include "ms_internal.h"     /* the cache view and MS_STAMP_MAX: the stamp-restart test drives them directly */

static int n_pass = 0, n_fail = 0;

#define CHECK(cond) do { if (cond) n_pass++; else { n_fail++; \
    fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)

/* ---------------------------------------------------------------------------- a small model */
#define L 6
#define E 16
#define K 2

static double attn[L], router[L], shared[L], expert_one[L], dense[L];
static int32_t n_experts[L];
static double kv_elems[L], kv_fixed[L], kv_ratio_elems[L], kv_ratio_fixed[L], kv_state[L];
static int64_t kv_cap[L], kv_ratio[L];

static ms_model_t make_model(int moe)
{
    ms_model_t m;
    memset(&m, 0, sizeof(m));
    for (int l = 0; l < L; l++) {
        attn[l] = 1e7 + 1e5 * l;
        router[l] = moe ? 1e4 : 0.0;
        shared[l] = moe ? 2e6 : 0.0;
        expert_one[l] = moe ? 3e6 : 0.0;
        n_experts[l] = moe ? E : 0;
        dense[l] = moe ? 0.0 : 5e7;
        kv_elems[l] = 512.0;
        kv_fixed[l] = 0.0;
        kv_cap[l] = l % 3 == 0 ? 1024 : 0;     /* every third layer a sliding window */
        kv_ratio[l] = 0;
        kv_ratio_elems[l] = kv_ratio_fixed[l] = 0.0;
        kv_state[l] = l == L - 1 ? 4096.0 : 0.0;
    }
    m.n_layers = L;
    m.attn = attn; m.router = router; m.shared = shared; m.expert_one = expert_one; m.n_experts = n_experts;
    m.dense = dense;
    m.kv_elems = kv_elems; m.kv_fixed = kv_fixed; m.kv_ratio_elems = kv_ratio_elems;
    m.kv_ratio_fixed = kv_ratio_fixed; m.kv_state = kv_state; m.kv_cap = kv_cap; m.kv_ratio = kv_ratio;
    m.embed = 3e7; m.head = 3e7; m.mtp = 0.0; m.mtp_layers = 0;
    m.max_context = 32768;
    return m;
}

static ms_mem_config_t make_mem_config(int32_t placement, int64_t arg, int64_t ctx, int64_t batch, double gpu_gb,
                                       double host_gb)
{
    ms_mem_config_t c;
    memset(&c, 0, sizeof(c));
    c.context = ctx; c.batch = batch; c.kv_bytes_per_elem = 2.0;
    c.placement = placement; c.placement_arg = arg; c.mtp = 0;
    c.n_gpus = gpu_gb > 0.0 ? 1 : 0;
    c.gpu_capacity = gpu_gb * 1e9; c.host_capacity = host_gb * 1e9; c.storage_capacity = 0.0;
    c.storage_spill = 0; c.embed_on_gpu = 1; c.kv_granularity = 256;
    c.gpu_fixed = 3e8; c.gpu_buf0 = 1e8; c.gpu_buf_ctx = 1e3;
    c.host_fixed = 1e8; c.host_buf0 = 1e7; c.host_buf_ctx = 1e2;
    for (int k = 0; k < MS_N_CLASSES; k++) c.gpu_ways[k] = 1.0;   /* one GPU */
    return c;
}

static uint64_t lcg_state = 88172645463325252ULL;
static uint64_t rnd(void)
{
    lcg_state ^= lcg_state << 13; lcg_state ^= lcg_state >> 7; lcg_state ^= lcg_state << 17;
    return lcg_state;
}
static int64_t rnd_range(int64_t lo, int64_t hi) { return lo + (int64_t) (rnd() % (uint64_t) (hi - lo + 1)); }
static double rnd_unit(void) { return (double) (rnd() >> 11) * (1.0 / 9007199254740992.0); }

/* ---------------------------------------------------------------------------- error table and RNG */
static void test_strerror_and_rng(void)
{
    for (int code = 0; code >= -14; code--) {
        const char *s = ms_strerror(code);
        CHECK(s != NULL && strlen(s) > 0 && strcmp(s, "unknown moesim error") != 0);
    }
    CHECK(strcmp(ms_strerror(-999), "unknown moesim error") == 0);
    uint64_t x = 1234567;                  /* the published first output of splitmix64(1234567) */
    CHECK(ms_splitmix64_next(&x) == 6457827717110365317ULL);
    ms_rng_t a, b;
    ms_rng_init(&a, 7, 1, 2);
    ms_rng_init(&b, 7, 1, 2);
    int same = 1, inside = 1;
    for (int i = 0; i < 10000; i++) {
        double u = ms_rng_uniform(&a);
        same &= u == ms_rng_uniform(&b);
        inside &= u > 0.0 && u < 1.0;
    }
    CHECK(same);
    CHECK(inside);
    int finite = 1;
    for (int i = 0; i < 2000; i++) {
        finite &= isfinite(ms_rng_gumbel(&a)) && isfinite(ms_rng_normal(&a));
        double g = ms_rng_gamma(&a, 0.05 + 5.0 * rnd_unit());
        finite &= isfinite(g) && g >= 0.0;
    }
    CHECK(finite);
}

/* ---------------------------------------------------------------------------- memory */
static void check_memory_result(const ms_mem_result_t *r)
{
    double tiers = 0.0, classes = 0.0;
    for (int t = 0; t < MS_N_TIERS; t++) {
        CHECK(isfinite(r->tier[t]) && r->tier[t] >= 0.0);
        tiers += r->tier[t];
    }
    for (int k = 0; k < MS_N_CLASSES; k++)
        for (int t = 0; t < MS_N_TIERS; t++) classes += r->by_class[k][t];
    CHECK(fabs(tiers - classes) <= 1e-9 * fmax(1.0, classes));
    CHECK(r->weights > 0.0 && r->kv >= 0.0 && r->state >= 0.0 && r->kv_bytes_per_token >= 0.0);
    CHECK(r->fits >= 0 && r->fits <= 7 && r->max_context >= 0 && r->max_batch >= 0);
}

static void test_memory(void)
{
    ms_model_t m = make_model(1);
    ms_mem_result_t r;
    ms_mem_config_t c = make_mem_config(MS_PLACE_ALL_GPU, 0, 4096, 1, 24.0, 64.0);
    CHECK(ms_memory(&m, &c, &r) == 0);
    check_memory_result(&r);
    CHECK(r.fits & MS_FITS_GPU);
    CHECK(ms_memory(NULL, &c, &r) == MS_ERR_NULL_ARGUMENT);
    CHECK(ms_memory(&m, NULL, &r) == MS_ERR_NULL_ARGUMENT);
    CHECK(ms_memory(&m, &c, NULL) == MS_ERR_NULL_ARGUMENT);
    ms_mem_config_t bad = c;
    bad.placement = 99;
    CHECK(ms_memory(&m, &bad, &r) == MS_ERR_BAD_PLACEMENT);
    bad = c; bad.context = 0;
    CHECK(ms_memory(&m, &bad, &r) != 0);
    bad = c; bad.gpu_capacity = -1.0;
    CHECK(ms_memory(&m, &bad, &r) != 0);
    bad = c; bad.kv_bytes_per_elem = NAN;
    CHECK(ms_memory(&m, &bad, &r) != 0);
    bad = c; bad.batch = 0;
    CHECK(ms_memory(&m, &bad, &r) != 0);
    ms_model_t dense_model = make_model(0);
    for (int32_t p = 0; p < MS_N_PLACEMENTS; p++) {          /* every placement on both models */
        for (int moe = 0; moe < 2; moe++) {
            ms_model_t *mm = moe ? &m : &dense_model;
            ms_mem_config_t cc = make_mem_config(p, p == MS_PLACE_LAYERS_GPU ? 3 : 2, 8192, 2, 24.0, 128.0);
            int code = ms_memory(mm, &cc, &r);
            CHECK(code == 0);
            if (code == 0) check_memory_result(&r);
        }
    }
    /* randomized: more memory never fits less; results finite; many == one by one on any thread count */
    enum { N = 400 };
    ms_mem_config_t *cfgs = malloc(N * sizeof(*cfgs));
    ms_mem_result_t *out1 = malloc(N * sizeof(*out1)), *out2 = malloc(N * sizeof(*out2));
    for (int i = 0; i < N; i++) {
        int32_t p = (int32_t) rnd_range(0, MS_N_PLACEMENTS - 1);
        cfgs[i] = make_mem_config(p, rnd_range(0, L), rnd_range(1, 1 << 20), rnd_range(1, 512),
                                  (double) rnd_range(0, 200), (double) rnd_range(1, 1024));
        if (cfgs[i].n_gpus == 0) cfgs[i].placement = MS_PLACE_CPU_ONLY;
    }
    int64_t bad_index = -1;
    CHECK(ms_memory_many(&m, cfgs, N, out1, 1, &bad_index) == 0);
    CHECK(ms_memory_many(&m, cfgs, N, out2, 2, &bad_index) == 0);
    CHECK(memcmp(out1, out2, N * sizeof(*out1)) == 0);
    int monotone = 1;
    for (int i = 0; i < N; i++) {
        check_memory_result(&out1[i]);
        ms_mem_config_t more = cfgs[i];
        more.gpu_capacity *= 2.0; more.host_capacity *= 2.0;
        ms_mem_result_t r2;
        if (ms_memory(&m, &more, &r2) == 0 && out1[i].fits && !r2.fits) monotone = 0;
        if (r2.max_context < out1[i].max_context || r2.max_batch < out1[i].max_batch) monotone = 0;
    }
    CHECK(monotone);
    cfgs[N / 2].placement = -5;                                 /* an error names its configuration */
    CHECK(ms_memory_many(&m, cfgs, N, out1, 2, &bad_index) == MS_ERR_BAD_PLACEMENT && bad_index == N / 2);
    free(cfgs); free(out1); free(out2);
}

/* ---------------------------------------------------------------------------- decode */
static double d_attn_b[L], d_attn_f[L], d_kv[L], d_sf[L], d_sh_b[L], d_sh_f[L], d_ex_b[L], d_ex_f[L];
static int32_t d_on_gpu[L], d_mode[L], d_slots[L], d_pages[L], d_moe[L];
static double r_logpop[L * E], r_stick[L], r_recall[L], r_q[L * E], r_qbar[L * E], r_lqbar[L * E];
static int32_t r_hot[L * E];

static ms_decode_model_t make_decode_model(int32_t mode, int moe)
{
    ms_decode_model_t m;
    memset(&m, 0, sizeof(m));
    for (int l = 0; l < L; l++) {
        d_attn_b[l] = 1e7; d_attn_f[l] = 2e7; d_kv[l] = 1e6; d_sf[l] = 1e6; d_sh_b[l] = 2e6; d_sh_f[l] = 4e6;
        d_ex_b[l] = moe ? 3e6 : 0.0; d_ex_f[l] = moe ? 6e6 : 0.0;
        d_on_gpu[l] = mode == MS_EXP_CPU ? 1 : 1;
        d_mode[l] = moe ? mode : MS_EXP_NONE;
        d_slots[l] = 4; d_pages[l] = E;
        d_moe[l] = moe ? l : -1;
    }
    m.n_layers = L;
    m.attn_bytes = d_attn_b; m.attn_flops = d_attn_f; m.kv_bytes = d_kv; m.score_flops = d_sf;
    m.shared_bytes = d_sh_b; m.shared_flops = d_sh_f; m.expert_bytes = d_ex_b; m.expert_flops = d_ex_f;
    m.attn_on_gpu = d_on_gpu; m.expert_mode = d_mode; m.slots = d_slots; m.page_slots = d_pages; m.moe_index = d_moe;
    m.head_bytes = 3e7; m.head_flops = 6e7; m.head_on_gpu = 1; m.act_bytes = 8192.0;
    return m;
}

static ms_machine_t make_machine(void)
{
    ms_machine_t h;
    memset(&h, 0, sizeof(h));
    h.gpu_bw = 8e11; h.host_bw = 6e10; h.pcie_bw = 2.4e10; h.storage_bw = 5e9;
    h.gpu_flops = 1e14; h.cpu_flops = 1e12; h.interconnect_bw = 1e11; h.cpu_attn_flops = 1e11;
    h.launch_s = 5e-6; h.sync_s = 2e-5; h.dma_s = 1e-5; h.step_s = 1e-4;
    return h;
}

static ms_routing_t make_routing(int moe)
{
    ms_routing_t r;
    memset(&r, 0, sizeof(r));
    if (!moe) return r;                                  /* a dense model routes nothing */
    for (int l = 0; l < L; l++) {
        for (int e = 0; e < E; e++) {
            r_logpop[l * E + e] = -0.3 * e;
            r_hot[l * E + e] = e;
            r_q[l * E + e] = (double) K / E;
            r_qbar[l * E + e] = (double) K / E;
            r_lqbar[l * E + e] = log1p(-(double) K / E);
        }
        r_stick[l] = 0.3; r_recall[l] = 0.0;
    }
    r.n_layers = L; r.n_experts = E; r.top_k = K; r.n_group = 0; r.topk_group = 0;
    r.log_pop = r_logpop; r.stickiness = r_stick; r.recall = r_recall; r.hot = r_hot;
    r.concentration = 0.0; r.request_tokens = 0;
    r.n_scenarios = 1; r.q = r_q; r.qbar = r_qbar; r.lqbar = r_lqbar;
    return r;
}

static ms_decode_config_t make_decode_config(int32_t batch, int64_t steps, int32_t policy, int32_t mode)
{
    ms_decode_config_t c;
    memset(&c, 0, sizeof(c));
    c.batch = batch; c.tokens_per_step = 1; c.drafts = 0; c.accepted = 1.0;
    c.steps = steps; c.warmup = steps / 4; c.policy = policy; c.mode = mode; c.seed = 3; c.index = 0;
    return c;
}

static void check_decode_result(const ms_decode_result_t *r)
{
    CHECK(isfinite(r->step_mean) && r->step_mean > 0.0);
    CHECK(r->step_p50 > 0.0 && r->step_p99 >= r->step_p50 * (1.0 - 1e-12));
    CHECK(r->hit_rate == -1.0 || (r->hit_rate >= 0.0 && r->hit_rate <= 1.0));
    CHECK(r->page_hit_rate == -1.0 || (r->page_hit_rate >= 0.0 && r->page_hit_rate <= 1.0));
    double res = 0.0;
    for (int k = 0; k < MS_N_RES; k++) { CHECK(r->by_resource[k] >= 0.0); res += r->by_resource[k]; }
    CHECK(fabs(res - r->step_mean) <= 1e-9 * r->step_mean);
}

static int run_decode(const ms_decode_model_t *m, const ms_machine_t *h, const ms_routing_t *r,
                      const ms_decode_config_t *c, ms_decode_result_t *out)
{
    int64_t ws = ms_decode_workspace_size(m, r, c);
    if (ws <= 0) return -1000;
    void *buf = malloc((size_t) ws);
    int code = ms_decode(m, h, r, c, buf, ws, out);
    free(buf);
    return code;
}

static void test_decode(void)
{
    ms_machine_t h = make_machine();
    ms_decode_result_t out;
    int32_t modes[] = {MS_EXP_GPU, MS_EXP_CPU, MS_EXP_SPLIT, MS_EXP_FETCH};
    for (int moe = 0; moe < 2; moe++) {
        ms_routing_t r = make_routing(moe);
        for (int mi = 0; mi < 4; mi++) {
            ms_decode_model_t m = make_decode_model(modes[mi], moe);
            for (int32_t pol = 0; pol < MS_N_POLICIES; pol++) {
                for (int32_t mode = 0; mode < 2; mode++) {
                    ms_decode_config_t c = make_decode_config(3, 64, pol, mode);
                    int code = run_decode(&m, &h, &r, &c, &out);
                    if (mode == MS_MODE_ANALYTIC && pol == MS_POLICY_BELADY) {
                        CHECK(code == MS_ERR_BAD_POLICY);   /* Belady needs the future: Monte Carlo only */
                        continue;
                    }
                    CHECK(code == 0);                       /* Belady on a dense model used to segfault */
                    if (code == 0) check_decode_result(&out);
                }
            }
        }
    }
    ms_routing_t r = make_routing(1);
    ms_decode_model_t m = make_decode_model(MS_EXP_FETCH, 1);
    ms_decode_config_t c = make_decode_config(2, 32, MS_POLICY_LRU, MS_MODE_MONTECARLO);
    int64_t ws = ms_decode_workspace_size(&m, &r, &c);
    void *buf = malloc((size_t) ws);
    CHECK(ms_decode(&m, &h, &r, &c, buf, ws - 8, &out) == MS_ERR_BAD_WORKSPACE);
    CHECK(ms_decode(NULL, &h, &r, &c, buf, ws, &out) == MS_ERR_NULL_ARGUMENT);
    ms_machine_t slow = h; slow.gpu_bw = 0.0;
    CHECK(ms_decode(&m, &slow, &r, &c, buf, ws, &out) == MS_ERR_BAD_MACHINE);
    ms_routing_t wide = r; wide.top_k = MS_MAX_TOP_K + 1;
    CHECK(ms_decode(&m, &h, &wide, &c, buf, ws, &out) != 0);
    wide = r; wide.top_k = E + 1;
    CHECK(ms_decode(&m, &h, &wide, &c, buf, ws, &out) != 0);
    ms_routing_t deep = r; deep.n_layers = MS_MAX_MOE_LAYERS + 1;
    CHECK(ms_decode(&m, &h, &deep, &c, buf, ws, &out) != 0);
    ms_decode_config_t bc = c; bc.policy = 17;
    CHECK(ms_decode(&m, &h, &r, &bc, buf, ws, &out) == MS_ERR_BAD_POLICY);
    bc = c; bc.batch = 0;
    CHECK(ms_decode(&m, &h, &r, &bc, buf, ws, &out) != 0);
    free(buf);
    /* more bandwidth is never slower; the same seed gives the same result on any thread count */
    enum { N = 24 };
    ms_decode_config_t cfgs[N];
    ms_decode_result_t o1[N], o2[N];
    for (int i = 0; i < N; i++) {
        cfgs[i] = make_decode_config((int32_t) rnd_range(1, 16), rnd_range(8, 96), (int32_t) rnd_range(0, 2),
                                     (int32_t) rnd_range(0, 1));
        cfgs[i].index = (uint64_t) i;
    }
    int64_t wsb = 0;
    for (int i = 0; i < N; i++) {
        int64_t w = ms_decode_workspace_size(&m, &r, &cfgs[i]);
        if (w > wsb) wsb = w;
    }
    void *ws2 = malloc((size_t) wsb * 2);
    int64_t bad = -1;
    CHECK(ms_decode_many(&m, &h, &r, cfgs, N, o1, 1, ws2, wsb, &bad) == 0);
    CHECK(ms_decode_many(&m, &h, &r, cfgs, N, o2, 2, ws2, wsb, &bad) == 0);
    CHECK(memcmp(o1, o2, sizeof(o1)) == 0);
    ms_machine_t fast = h; fast.host_bw *= 2.0; fast.pcie_bw *= 2.0; fast.gpu_bw *= 2.0;
    CHECK(ms_decode_many(&m, &fast, &r, cfgs, N, o2, 1, ws2, wsb, &bad) == 0);
    int never_slower = 1;
    for (int i = 0; i < N; i++) never_slower &= o2[i].step_mean <= o1[i].step_mean * (1.0 + 1e-12);
    CHECK(never_slower);
    free(ws2);
}

/* The analytic table: a configuration reading it gives the result of counting and solving Che itself,
 * bit for bit, under every analytic policy; bad arguments and table entries are refused with codes. */
static void test_che_table(void)
{
    enum { F = MS_CHE_FIELDS };
    ms_machine_t h = make_machine();
    ms_routing_t r = make_routing(1), none = make_routing(0);
    int32_t modes[] = {MS_EXP_GPU, MS_EXP_CPU, MS_EXP_SPLIT, MS_EXP_FETCH};
    int64_t wsb = ms_che_table_workspace_size(&r);
    void *tw = malloc((size_t) wsb);
    double tab[L * F], bad[L * F];
    ms_decode_result_t solved, read;
    CHECK(wsb > 0 && ms_che_table_workspace_size(NULL) == 0);
    for (int mi = 0; mi < 4; mi++) {
        ms_decode_model_t m = make_decode_model(modes[mi], 1);
        for (int32_t pol = 0; pol < MS_POLICY_BELADY; pol++) {
            for (int32_t b = 1; b <= 9; b += 4) {
                ms_decode_config_t c = make_decode_config(b, 32, pol, MS_MODE_ANALYTIC);
                CHECK(ms_che_table(&r, b, 1, 4, pol, c.steps, c.warmup, tw, wsb, tab) == 0);
                for (int l = 0; l < L; l++) CHECK(tab[l * F + MS_CHE_HIT] >= 0.0 && tab[l * F + MS_CHE_HIT] <= 1.0);
                CHECK(run_decode(&m, &h, &r, &c, &solved) == 0);
                c.che = tab; c.che_slots = 4;
                CHECK(run_decode(&m, &h, &r, &c, &read) == 0);
                CHECK(memcmp(&solved, &read, sizeof(solved)) == 0);
                memcpy(bad, tab, sizeof(bad));
                for (int l = 0; l < L; l++) bad[l * F + MS_CHE_HIT] = 1.0;
                c.che = bad;
                c.che_slots = 5;                     /* a table for another slot count is not read */
                CHECK(run_decode(&m, &h, &r, &c, &read) == 0 && memcmp(&solved, &read, sizeof(solved)) == 0);
                c.che_slots = 4;
                CHECK(run_decode(&m, &h, &r, &c, &read) == 0);
                if (modes[mi] == MS_EXP_FETCH) CHECK(read.hit_rate > solved.hit_rate);
                bad[F + MS_CHE_HIT] = 1.5;
                CHECK(run_decode(&m, &h, &r, &c, &read) == MS_ERR_BAD_ROUTING);
                bad[F + MS_CHE_HIT] = 1.0;
                bad[F + MS_CHE_D] = NAN;
                CHECK(run_decode(&m, &h, &r, &c, &read) == MS_ERR_BAD_ROUTING);
                bad[F + MS_CHE_D] = -1.0;
                CHECK(run_decode(&m, &h, &r, &c, &read) == MS_ERR_BAD_ROUTING);
            }
        }
    }
    CHECK(ms_che_table(&r, 2, 1, 0, MS_POLICY_LRU, 256, 32, tw, wsb, tab) == 0 && tab[MS_CHE_HIT] == 0.0);
    CHECK(ms_che_table(&r, 2, 1, E, MS_POLICY_LRU, 256, 32, tw, wsb, tab) == 0 && tab[MS_CHE_HIT] == 1.0);
    CHECK(ms_che_table(&r, 2, 1, E, MS_POLICY_STATIC, 256, 32, tw, wsb, tab) == 0 && tab[MS_CHE_FREE_P] == 0.0);
    CHECK(ms_che_table(NULL, 1, 1, 4, MS_POLICY_LRU, 256, 32, tw, wsb, tab) == MS_ERR_NULL_ARGUMENT);
    CHECK(ms_che_table(&r, 1, 1, 4, MS_POLICY_LRU, 256, 32, tw, wsb, NULL) == MS_ERR_NULL_ARGUMENT);
    CHECK(ms_che_table(&r, 0, 1, 4, MS_POLICY_LRU, 256, 32, tw, wsb, tab) == MS_ERR_BAD_SIZE);
    CHECK(ms_che_table(&r, 1, 0, 4, MS_POLICY_LRU, 256, 32, tw, wsb, tab) == MS_ERR_BAD_SIZE);
    CHECK(ms_che_table(&r, 1, 1, -1, MS_POLICY_LRU, 256, 32, tw, wsb, tab) == MS_ERR_BAD_SIZE);
    CHECK(ms_che_table(&r, 1, 1, 4, MS_POLICY_LFU, 0, 0, tw, wsb, tab) == MS_ERR_BAD_SIZE);
    CHECK(ms_che_table(&r, 1, 1, 4, MS_POLICY_LFU, 32, 32, tw, wsb, tab) == MS_ERR_BAD_SIZE);
    CHECK(ms_che_table(&r, 1, 1, 4, MS_POLICY_LFU, 32, -1, tw, wsb, tab) == MS_ERR_BAD_SIZE);
    CHECK(ms_che_table(&r, 1, 1, 4, MS_POLICY_BELADY, 256, 32, tw, wsb, tab) == MS_ERR_BAD_POLICY);
    CHECK(ms_che_table(&r, 1, 1, 4, 17, 256, 32, tw, wsb, tab) == MS_ERR_BAD_POLICY);
    CHECK(ms_che_table(&r, 1, 1, 4, MS_POLICY_LRU, 256, 32, tw, wsb - 8, tab) == MS_ERR_BAD_WORKSPACE);
    CHECK(ms_che_table(&none, 1, 1, 4, MS_POLICY_LRU, 256, 32, tw, wsb, tab) != 0);
    ms_routing_t noq = r; noq.q = NULL;
    CHECK(ms_che_table(&noq, 1, 1, 4, MS_POLICY_LRU, 256, 32, tw, wsb, tab) == MS_ERR_BAD_ROUTING);
    ms_routing_t wide = r; wide.top_k = E + 1;
    CHECK(ms_che_table(&wide, 1, 1, 4, MS_POLICY_LRU, 256, 32, tw, wsb, tab) == MS_ERR_BAD_ROUTING);
    free(tw);
}

/* The page-cache table: paged layers reading it give the result of solving Che themselves, bit for bit,
 * under every analytic policy and expert mode that reads host memory; bad arguments and rates are refused. */
static void test_page_table(void)
{
    enum { F = MS_CHE_FIELDS };
    static int32_t few_pages[L] = {6, 6, 6, 6, 6, 6};
    ms_machine_t h = make_machine();
    ms_routing_t r = make_routing(1), none = make_routing(0);
    int32_t modes[] = {MS_EXP_CPU, MS_EXP_SPLIT, MS_EXP_FETCH};
    int64_t wsb = ms_che_table_workspace_size(&r);
    void *tw = malloc((size_t) wsb);
    double page[L], ones[L], che[L * F];
    ms_decode_result_t solved, read;
    for (int l = 0; l < L; l++) ones[l] = 1.0;
    for (int mi = 0; mi < 3; mi++) {
        ms_decode_model_t m = make_decode_model(modes[mi], 1);
        m.page_slots = few_pages;
        for (int32_t pol = 0; pol < MS_POLICY_BELADY; pol++) {
            for (int32_t b = 1; b <= 9; b += 4) {
                ms_decode_config_t c = make_decode_config(b, 32, pol, MS_MODE_ANALYTIC);
                CHECK(ms_page_table(&r, b, 1, 6, tw, wsb, page) == 0);
                for (int l = 0; l < L; l++) CHECK(page[l] >= 0.0 && page[l] <= 1.0);
                CHECK(run_decode(&m, &h, &r, &c, &solved) == 0 && solved.page_hit_rate < 1.0);
                c.page_hit = page; c.page_hit_slots = 6;
                CHECK(run_decode(&m, &h, &r, &c, &read) == 0 && memcmp(&solved, &read, sizeof(solved)) == 0);
                CHECK(ms_che_table(&r, b, 1, 4, pol, c.steps, c.warmup, tw, wsb, che) == 0);
                c.che = che; c.che_slots = 4;       /* both tables: still the solved result */
                CHECK(run_decode(&m, &h, &r, &c, &read) == 0 && memcmp(&solved, &read, sizeof(solved)) == 0);
                c.che = NULL; c.che_slots = -1;
                c.page_hit = ones; c.page_hit_slots = 7;   /* a table for another page-slot count is not read */
                CHECK(run_decode(&m, &h, &r, &c, &read) == 0 && memcmp(&solved, &read, sizeof(solved)) == 0);
                c.page_hit_slots = 6;
                CHECK(run_decode(&m, &h, &r, &c, &read) == 0 && read.page_hit_rate == 1.0);
                ones[1] = 1.5;
                CHECK(run_decode(&m, &h, &r, &c, &read) == MS_ERR_BAD_ROUTING);
                ones[1] = NAN;
                CHECK(run_decode(&m, &h, &r, &c, &read) == MS_ERR_BAD_ROUTING);
                ones[1] = -0.5;
                CHECK(run_decode(&m, &h, &r, &c, &read) == MS_ERR_BAD_ROUTING);
                ones[1] = 1.0;
            }
        }
    }
    CHECK(ms_page_table(&r, 2, 1, 0, tw, wsb, page) == 0 && page[0] == 0.0);
    CHECK(ms_page_table(&r, 2, 1, E, tw, wsb, page) == 0 && page[0] == 1.0);
    CHECK(ms_page_table(NULL, 1, 1, 4, tw, wsb, page) == MS_ERR_NULL_ARGUMENT);
    CHECK(ms_page_table(&r, 1, 1, 4, tw, wsb, NULL) == MS_ERR_NULL_ARGUMENT);
    CHECK(ms_page_table(&r, 0, 1, 4, tw, wsb, page) == MS_ERR_BAD_SIZE);
    CHECK(ms_page_table(&r, 1, 0, 4, tw, wsb, page) == MS_ERR_BAD_SIZE);
    CHECK(ms_page_table(&r, 1, 1, -1, tw, wsb, page) == MS_ERR_BAD_SIZE);
    CHECK(ms_page_table(&r, 1, 1, 4, tw, wsb - 8, page) == MS_ERR_BAD_WORKSPACE);
    CHECK(ms_page_table(&none, 1, 1, 4, tw, wsb, page) != 0);
    ms_routing_t noq = r; noq.q = NULL;
    CHECK(ms_page_table(&noq, 1, 1, 4, tw, wsb, page) == MS_ERR_BAD_ROUTING);
    free(tw);
}

/* Window tables: ms_check_windows judges them whatever windows_checked says; the kernels check them unless
 * windows_checked marks them checked (the glue sets it once for the tables it seals). */
static void test_windows_checked(void)
{
    static double nodes[2] = {1.0, 2.0}, lq[L * E * 2];
    ms_machine_t h = make_machine();
    ms_routing_t r = make_routing(1);
    ms_decode_model_t m = make_decode_model(MS_EXP_CPU, 1);
    ms_decode_config_t c = make_decode_config(2, 32, MS_POLICY_LRU, MS_MODE_ANALYTIC);
    ms_decode_result_t plain, marked;
    int64_t wsb = ms_che_table_workspace_size(&r);
    void *tw = malloc((size_t) wsb);
    double tab[L * MS_CHE_FIELDS];
    for (int i = 0; i < L * E; i++) { lq[2 * i] = log1p(-(double) K / E); lq[2 * i + 1] = 1.8 * lq[2 * i]; }
    r.n_window = 2; r.win_n = nodes; r.win_lq = lq;
    CHECK(ms_check_windows(&r) == 0);
    CHECK(run_decode(&m, &h, &r, &c, &plain) == 0);
    r.windows_checked = 1;
    CHECK(run_decode(&m, &h, &r, &c, &marked) == 0 && memcmp(&plain, &marked, sizeof(plain)) == 0);
    lq[5] = 0.5;                                       /* malformed: a log probability above 0 */
    CHECK(ms_check_windows(&r) == 1);                  /* judged whatever the mark says */
    CHECK(run_decode(&m, &h, &r, &c, &marked) == 0);   /* marked: not checked again */
    CHECK(ms_che_table(&r, 2, 1, 4, MS_POLICY_LRU, 256, 32, tw, wsb, tab) == 0);
    r.windows_checked = 0;
    CHECK(run_decode(&m, &h, &r, &c, &marked) == MS_ERR_BAD_ROUTING);
    CHECK(ms_che_table(&r, 2, 1, 4, MS_POLICY_LRU, 256, 32, tw, wsb, tab) == MS_ERR_BAD_ROUTING);
    CHECK(ms_page_table(&r, 2, 1, 4, tw, wsb, tab) == MS_ERR_BAD_ROUTING);
    lq[5] = 1.8 * lq[4];
    free(tw);
}

/* LFU count moments: ms_window_moments on a hand-checked stream (expert 0 in tokens 0, 1, 3: windows of one token
 * with a next token count 1, 1, 0, 1, 0 and the next tokens hold it 1, 0, 1, 0, 0), requests of 3 tokens cutting
 * the windows that cross them; the LFU table reads moments beside the windows, and refuses a negative variance. */
static void test_window_moments(void)
{
    static const int32_t stream[6] = {0, 0, 1, 0, 1, 1}, lens[2] = {1, 2};
    static const int64_t whole[16] = {3, 3, 1, 2, 5, 7, 1, 1, 2, 2, 1, 3, 3, 3, 2, 3};
    static const int64_t requests[16] = {3, 3, 1, 1, 3, 5, 0, 0, 1, 1, 1, 3, 1, 1, 1, 2};
    static double nodes[2] = {1.0, 2.0}, lq[L * E * 2], mn[2] = {1.0, 4.0}, var[L * E * 2], cov[L * E * 2];
    int64_t out[16], wsb = ms_window_moments_workspace_size(6, 1, 2);
    void *ws = malloc((size_t) wsb);
    ms_routing_t r = make_routing(1);
    int64_t tsb = ms_che_table_workspace_size(&r);
    void *tw = malloc((size_t) tsb);
    double tab[L * MS_CHE_FIELDS];
    CHECK(ms_window_moments(stream, 6, 1, 1, 2, 0, lens, 2, ws, wsb, out) == 0 && memcmp(out, whole, sizeof(out)) == 0);
    CHECK(ms_window_moments(stream, 6, 1, 1, 2, 3, lens, 2, ws, wsb, out) == 0 && memcmp(out, requests, sizeof(out)) == 0);
    CHECK(ms_window_moments(stream, 6, 1, 1, 2, 0, lens, 2, ws, wsb - 1, out) == MS_ERR_BAD_WORKSPACE);
    CHECK(ms_window_moments(stream, 6, 1, 1, 1, 0, lens, 2, ws, wsb, out) == MS_ERR_BAD_ROUTING);   /* id 1 of 1 */
    for (int i = 0; i < L * E; i++) {
        lq[2 * i] = log1p(-(double) K / E);
        lq[2 * i + 1] = 1.8 * lq[2 * i];
        var[2 * i] = 0.1;
        var[2 * i + 1] = 2.0;
        cov[2 * i] = 0.02;
        cov[2 * i + 1] = 0.05;
    }
    r.n_window = 2; r.win_n = nodes; r.win_lq = lq;
    r.n_moment = 2; r.win_m = mn; r.win_var = var; r.win_cov = cov;
    CHECK(ms_check_windows(&r) == 0);
    CHECK(ms_che_table(&r, 1, 1, 4, MS_POLICY_LFU, 256, 32, tw, tsb, tab) == 0);
    for (int l = 0; l < L; l++) CHECK(tab[l * MS_CHE_FIELDS + MS_CHE_HIT] >= 0.0 && tab[l * MS_CHE_FIELDS + MS_CHE_HIT] <= 1.0);
    var[3] = -1.0;
    CHECK(ms_check_windows(&r) == 1);
    CHECK(ms_che_table(&r, 1, 1, 4, MS_POLICY_LFU, 256, 32, tw, tsb, tab) == MS_ERR_BAD_ROUTING);
    free(tw);
    free(ws);
}

/* ---------------------------------------------------------------------------- routing and caches */
static void test_route_and_cache(void)
{
    ms_routing_t r = make_routing(1);
    ms_decode_config_t c = make_decode_config(2, 40, MS_POLICY_LRU, MS_MODE_MONTECARLO);
    ms_decode_model_t m = make_decode_model(MS_EXP_GPU, 1);
    int64_t ws = ms_decode_workspace_size(&m, &r, &c);
    void *buf = malloc((size_t) ws);
    int32_t *tok = malloc((size_t) (40 * 2 * 1 * L * K) * sizeof(int32_t));
    CHECK(ms_route_sample(&r, &c, tok, buf, ws) == 0);
    int ok = 1;
    for (int64_t i = 0; i < 40 * 2 * L * K; i++) ok &= tok[i] >= 0 && tok[i] < E;
    CHECK(ok);
    CHECK(ms_route_sample(&r, &c, NULL, buf, ws) == MS_ERR_NULL_ARGUMENT);
    free(tok); free(buf);
    /* cache replay: random step unions, every policy; hits never exceed accesses, capacity E always hits */
    enum { T = 50, W = 4 };
    int32_t sel[T * L * W], nsel[T * L];
    for (int t = 0; t < T; t++)
        for (int l = 0; l < L; l++) {
            int32_t n = (int32_t) rnd_range(1, W);
            nsel[t * L + l] = n;
            for (int j = 0; j < n; j++) sel[(t * L + l) * W + j] = (int32_t) ((t + 3 * j) % E);  /* distinct */
        }
    double hits[L], acc[L];
    for (int32_t pol = 0; pol < MS_N_POLICIES; pol++) {
        for (int32_t cap = 0; cap <= E; cap += 5) {
            int64_t cw = ms_cache_workspace_size(E, L, T, W);
            void *cb = malloc((size_t) cw);
            int code = ms_cache_replay(sel, nsel, T, L, W, E, cap, pol, r_hot, 0, cb, cw, hits, acc);
            CHECK(code == 0);
            int sane = 1;
            for (int l = 0; l < L; l++) sane &= hits[l] >= 0.0 && hits[l] <= acc[l];
            CHECK(sane);
            free(cb);
        }
    }
    int32_t badsel[T * L * W];
    memcpy(badsel, sel, sizeof(sel));
    badsel[0] = E + 3;                                   /* an expert id past the table (entry 0 is valid) */
    int64_t cw = ms_cache_workspace_size(E, L, T, W);
    void *cb = malloc((size_t) cw);
    CHECK(ms_cache_replay(badsel, nsel, T, L, W, E, 4, MS_POLICY_LRU, r_hot, 0, cb, cw, hits, acc) == MS_ERR_BAD_TRACE);
    CHECK(ms_cache_replay(sel, nsel, T, L, W, E, 4, 9, r_hot, 0, cb, cw, hits, acc) == MS_ERR_BAD_POLICY);
    free(cb);
}

/* ---------------------------------------------------------------------------- stamps
 * ms_cache_t.stamp and the sampler's stamp are int32 and count up once per step (cache) or per token and
 * layer (sampler: T x B x tokens x L increments, past INT32_MAX at e.g. Mixtral, 100k tokens x batch 700).
 * The kernel restarts them at MS_STAMP_MAX (INT32_MAX unless a test build lowers it). Here a cache whose
 * stamp is preset 3 below INT32_MAX is stepped 40 times next to a fresh one: the old `c->stamp++` passed
 * INT32_MAX on the 4th step (signed overflow, which UBSan turns into an abort in this build); now both
 * caches must give the same hits, the same resident experts and the stamp must have restarted. */
static int32_t next_stamp(int32_t s) { return s >= MS_STAMP_MAX ? 1 : s + 1; }

static void test_stamp_restart(void)
{
    enum { T = 40, EE = 16, CAP = 5 };
    int64_t nb = ms_cache_bytes(EE);
    char *buf_a = malloc((size_t) nb), *buf_b = malloc((size_t) nb);
    int32_t hot[EE];
    for (int e = 0; e < EE; e++) hot[e] = EE - 1 - e;
    for (int32_t pol = 0; pol < MS_N_POLICIES; pol++) {
        ms_cache_t a, b;
        int32_t expect_a = 0, expect_b = INT32_MAX - 3;
        int same = 1;
        ms_cache_carve(&a, buf_a, EE);
        ms_cache_carve(&b, buf_b, EE);
        ms_cache_reset(&a, EE, CAP, pol, hot);
        ms_cache_reset(&b, EE, CAP, pol, hot);
        b.stamp = INT32_MAX - 3;
        for (int t = 0; t < T; t++) {
            int32_t sel[8], n = (int32_t) rnd_range(1, 8);
            for (int j = 0; j < n; j++) sel[j] = (int32_t) ((t * 5 + j * 3 + (t % 3)) % EE);   /* distinct */
            ms_cache_begin_step(&a, sel, n);
            ms_cache_begin_step(&b, sel, n);
            expect_a = next_stamp(expect_a);
            expect_b = next_stamp(expect_b);
            for (int j = 0; j < n; j++) {
                double tick = (double) (t * 8 + j), nu = (double) rnd_range(0, 400);
                same &= ms_cache_access(&a, sel[j], tick, nu) == ms_cache_access(&b, sel[j], tick, nu);
            }
            same &= a.used == b.used;
            for (int e = 0; e < EE; e++) same &= a.where[e] == b.where[e];
        }
        CHECK(same);
        CHECK(a.stamp == expect_a && b.stamp == expect_b);
        CHECK(b.stamp >= 1 && b.stamp <= T);                 /* it restarted instead of passing INT32_MAX */
    }
    free(buf_a); free(buf_b);
}

/* A digest of results that go through every stamp (sampler, group mask, step unions, both caches):
 * Monte Carlo decodes on every policy and expert mode with batch and tokens per step above 1, group-limited
 * routing, per-request skew, a replayed trace, the sampler's raw picks and cache replays. tests/test_c_core.py
 * builds the harness again with -DMS_STAMP_MAX=3 (a restart every few tokens) and requires the same digest:
 * restarting a stamp never changes an answer. */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) { h ^= c[i]; h *= 1099511628211ULL; }
    return h;
}

static uint64_t stamp_digest(void)
{
    uint64_t h = 14695981039346656037ULL;
    ms_machine_t hw = make_machine();
    ms_decode_result_t out;
    int32_t modes[] = {MS_EXP_GPU, MS_EXP_CPU, MS_EXP_SPLIT, MS_EXP_FETCH};
    static int32_t trace[37 * 3 * K];
    for (int i = 0; i < 37 * 3 * K; i += K) { trace[i] = (i / K) % E; trace[i + 1] = (i / K * 7 + 3) % E; }
    for (int variant = 0; variant < 4; variant++) {
        ms_routing_t r = make_routing(1);
        if (variant == 1) { r.n_group = 4; r.topk_group = 2; }
        if (variant == 2) { r.concentration = 0.3; r.request_tokens = 9; }
        if (variant == 3) { r.trace = trace; r.trace_tokens = 37; r.trace_layers = 3; }
        for (int mi = 0; mi < 8; mi++) {
            static int32_t few_pages[L] = {6, 6, 6, 6, 6, 6};       /* weights spill: a host page cache of 6 */
            ms_decode_model_t m = make_decode_model(modes[mi % 4], 1);
            if (mi >= 4) m.page_slots = few_pages;
            for (int32_t pol = 0; pol < MS_N_POLICIES; pol++) {
                ms_decode_config_t c = make_decode_config(7, 48, pol, MS_MODE_MONTECARLO);
                c.tokens_per_step = 2;
                c.index = (uint64_t) (variant * 32 + mi * 4 + pol);
                int code = run_decode(&m, &hw, &r, &c, &out);
                CHECK(code == 0);
                h = fnv(h, &code, sizeof(code));
                h = fnv(h, &out, sizeof(out));
            }
        }
        {
            ms_decode_config_t c = make_decode_config(5, 30, MS_POLICY_LRU, MS_MODE_MONTECARLO);
            ms_decode_model_t m = make_decode_model(MS_EXP_GPU, 1);
            int64_t ws = ms_decode_workspace_size(&m, &r, &c);
            void *buf = malloc((size_t) ws);
            int32_t *tok = malloc((size_t) (30 * 5 * L * K) * sizeof(int32_t));
            CHECK(ms_route_sample(&r, &c, tok, buf, ws) == 0);
            h = fnv(h, tok, (size_t) (30 * 5 * L * K) * sizeof(int32_t));
            free(tok); free(buf);
        }
    }
    {
        enum { TT = 60, WW = 6 };
        int32_t sel[TT * L * WW], nsel[TT * L];
        double hits[L], acc[L];
        for (int i = 0; i < TT * L; i++) {
            nsel[i] = 1 + i % WW;
            for (int j = 0; j < nsel[i]; j++) sel[i * WW + j] = (i * 3 + j * 5) % E;
        }
        int64_t cw = ms_cache_workspace_size(E, L, TT, WW);
        void *cb = malloc((size_t) cw);
        for (int32_t pol = 0; pol < MS_N_POLICIES; pol++) {
            CHECK(ms_cache_replay(sel, nsel, TT, L, WW, E, 5, pol, r_hot, 4, cb, cw, hits, acc) == 0);
            h = fnv(h, hits, sizeof(hits));
            h = fnv(h, acc, sizeof(acc));
        }
        free(cb);
    }
    return h;
}

/* ---------------------------------------------------------------------------- sweep helpers */
static void test_ctx_and_lookup(void)
{
    ms_ctx_fn_t f = {2.0, 1.0, 3.0, 0.5, 7.0, 1024, -1, 4, 512};
    CHECK(ms_ctx_eval(&f, 1) == 2.0 + 1.0 + 7.0);
    double v = ms_ctx_eval(&f, 8192);
    CHECK(v == 2.0 * 1024 + 8192.0 + 3.0 * 512 + 0.5 * 2048 + 7.0);
    int monotone = 1;
    double prev = -1.0;
    for (int64_t c = 1; c < 100000; c += 37) { double x = ms_ctx_eval(&f, c); monotone &= x >= prev; prev = x; }
    CHECK(monotone);
    int64_t table[] = {3, 5, 9, 12}, keys[] = {5, 4, 12, 3, 100}, missing[8], n_missing = 0;
    int32_t var[5];
    int64_t unknown = ms_sweep_lookup(keys, 5, table, 4, var, missing, 8, &n_missing);
    CHECK(unknown == 2 && var[0] == 1 && var[1] == -1 && var[2] == 3 && var[3] == 0 && var[4] == -1);
    CHECK(n_missing == 2);
}

/* ---------------------------------------------------------------------------- sweeps: memory and placement
 * A hand-built group of SL layers in two kinds (full attention; a 1024-token window with a fixed state),
 * and the candidates engine.lower.placement lists: all-gpu, n-cpu-moe=0..SL, layers-gpu=0..SL, cpu-only,
 * experts-cpu (llama.cpp's rule), or gpu-experts=0..E, experts-cpu (ktransformers'). Labels are the
 * candidate indices, so a placement column names the candidate picked. */
#define SL 4
#define SNK 2
static double s_per_token[SNK] = {4096.0, 2048.0}, s_ratio_bytes[SNK] = {0.0, 0.0}, s_state[SNK] = {0.0, 1e5};
static int64_t s_cap[SNK] = {0, 1024}, s_ratio[SNK] = {0, 0};
static int32_t s_count[SNK] = {2, 2}, s_gpu_count[(SL + 1) * SNK];

static ms_sweep_place_t place(int32_t code, int64_t arg, int32_t layout, int32_t cfg, double w_gpu, double w_host,
                              double routed_host)
{
    ms_sweep_place_t p;
    memset(&p, 0, sizeof(p));
    p.code = code; p.arg = arg; p.layout = layout; p.cfg = cfg; p.any_gpu = w_gpu > 0.0;
    p.w_gpu = w_gpu; p.w_host = w_host; p.routed_host = routed_host;
    p.w_gpu_one = w_gpu;                     /* one GPU: it holds every GPU byte */
    return p;
}

/* places must hold 2 * SL + 5 (llama) or E + 2 (kt) entries */
static ms_sweep_mem_t make_group(int32_t rule, ms_sweep_place_t *places)
{
    const double a = 1e9, x = 4e9;           /* attention and routed experts per layer */
    ms_sweep_mem_t g;
    int32_t n = 0;
    memset(&g, 0, sizeof(g));
    for (int32_t l = 0; l <= SL; l++) {
        s_gpu_count[l * SNK] = l < 2 ? l : 2;
        s_gpu_count[l * SNK + 1] = l > 2 ? l - 2 : 0;
    }
    g.n_kinds = SNK; g.per_token = s_per_token; g.ratio_bytes = s_ratio_bytes; g.state = s_state;
    g.cap = s_cap; g.ratio = s_ratio; g.count = s_count; g.n_layouts = SL + 1; g.gpu_count = s_gpu_count;
    g.max_context = 32768;
    g.cfg[0] = make_mem_config(MS_PLACE_ALL_GPU, 0, 1, 1, 24.0, 40.0);
    g.cfg[1] = make_mem_config(MS_PLACE_CPU_ONLY, 0, 1, 1, 0.0, 40.0);
    g.rule = rule; g.n_layers = SL; g.n_experts = E;
    g.i_all_gpu = g.i_n_cpu_moe = g.i_layers_gpu = g.i_cpu_only = g.i_experts_cpu = g.i_gpu_experts = -1;
    if (rule == MS_SWEEP_AUTO_KT) {
        g.i_gpu_experts = n;
        for (int32_t e = 0; e <= E; e++)
            places[n++] = place(MS_PLACE_GPU_EXPERTS, e, SL, 0, SL * a + SL * x * e / E, SL * x * (E - e) / E,
                                SL * x * (E - e) / E);
    } else {
        g.i_all_gpu = n;
        places[n++] = place(MS_PLACE_ALL_GPU, 0, SL, 0, SL * (a + x), 0.0, 0.0);
        g.i_n_cpu_moe = n;
        for (int32_t k = 0; k <= SL; k++)
            places[n++] = place(MS_PLACE_N_CPU_MOE, k, SL, 0, SL * a + (SL - k) * x, k * x, k * x);
        g.i_layers_gpu = n;
        for (int32_t l = 0; l <= SL; l++)
            places[n++] = place(MS_PLACE_LAYERS_GPU, l, l, 0, l * (a + x), (SL - l) * (a + x), (SL - l) * x);
        g.i_cpu_only = n;
        places[n++] = place(MS_PLACE_CPU_ONLY, 0, 0, 1, 0.0, SL * (a + x), SL * x);
    }
    g.i_experts_cpu = n;
    places[n++] = place(MS_PLACE_EXPERTS_CPU, 0, SL, 0, SL * a, SL * x, SL * x);
    for (int32_t j = 0; j < n; j++) places[j].label = j;
    for (int b = 0; b < 8; b++) g.fits_label[b] = b;
    g.n_places = n;
    g.places = places;
    return g;
}

enum { SN = 15 };
typedef struct {
    int64_t context[SN], batch[SN], key[SN], max_context[SN], max_batch[SN];
    int32_t placement[SN], fits[SN];
    double weights[SN], kv[SN], state[SN], gpu[SN], host[SN], storage[SN];
} mem_cols_t;

static ms_sweep_mem_out_t mem_out(mem_cols_t *c)
{
    ms_sweep_mem_out_t o = {c->context, c->batch, c->placement, c->fits, c->key, c->weights, c->kv, c->state,
                            c->gpu, c->host, c->storage, c->max_context, c->max_batch};
    return o;
}

static int run_sweep_memory(const ms_sweep_mem_t *g, const ms_sweep_axes_t *ax, int64_t j0, int64_t n, int threads,
                            mem_cols_t *c, int64_t *bad)
{
    int64_t per = ms_sweep_memory_workspace_size(ax->n_b);
    void *ws = malloc((size_t) (2 * per));
    ms_sweep_mem_out_t o = mem_out(c);
    memset(c, 0, sizeof(*c));
    int code = ms_sweep_memory(g, ax, j0, n, threads, ws, 2 * per, &o, bad);
    free(ws);
    return code;
}

static void test_sweep_memory_and_placement(void)
{
    static ms_sweep_place_t places[2 * SL + 5 + E + 2];
    int64_t ctx[5] = {1, 700, 4096, 20000, 32768}, bat[3] = {1, 3, 16}, bad = -7;
    ms_sweep_axes_t ax = {ctx, bat, 5, 3, 0};
    mem_cols_t c1, c2;
    int32_t rules[3] = {MS_SWEEP_FIXED, MS_SWEEP_AUTO_LLAMA, MS_SWEEP_AUTO_KT};
    int32_t seen[2 * SL + 5 + E + 2] = {0};
    for (int ri = 0; ri < 3; ri++) {
        ms_sweep_mem_t g = make_group(rules[ri], places);
        CHECK(run_sweep_memory(&g, &ax, 0, SN, 1, &c1, &bad) == 0 && bad == -1);
        CHECK(run_sweep_memory(&g, &ax, 0, SN, 2, &c2, &bad) == 0);
        CHECK(memcmp(&c1, &c2, sizeof(c1)) == 0);
        int sane = 1, agree = 1;
        for (int i = 0; i < SN; i++) {
            int32_t chosen = -1;
            int64_t mc = -1;
            CHECK(ms_auto_placement(&g, c1.context[i], c1.batch[i], &chosen) == 0);
            CHECK(ms_auto_max_context(&g, c1.batch[i], &mc) == 0);
            agree &= chosen == c1.placement[i] && mc == c1.max_context[i];
            if (chosen >= 0 && chosen < g.n_places) seen[chosen] = 1;
            sane &= c1.context[i] == ctx[i / 3] && c1.batch[i] == bat[i % 3];
            sane &= c1.fits[i] >= 0 && c1.fits[i] <= 7;
            sane &= isfinite(c1.gpu[i]) && c1.gpu[i] >= 0.0 && isfinite(c1.host[i]) && c1.host[i] >= 0.0
                    && c1.storage[i] >= 0.0 && c1.kv[i] >= 0.0 && c1.state[i] >= 0.0;
            sane &= c1.max_context[i] >= 0 && c1.max_context[i] <= g.max_context && c1.max_batch[i] >= 0;
            if (c1.fits[i]) sane &= c1.max_context[i] >= c1.context[i] && c1.max_batch[i] >= c1.batch[i];
        }
        CHECK(sane);
        CHECK(agree);                        /* the sweep and moesim.fit's entry point pick the same */
        /* a chunk of the configurations equals that slice of the whole */
        mem_cols_t part;
        CHECK(run_sweep_memory(&g, &ax, 4, 7, 2, &part, &bad) == 0);
        int chunk = 1;
        for (int i = 0; i < 7; i++)
            chunk &= part.placement[i] == c1.placement[4 + i] && part.gpu[i] == c1.gpu[4 + i]
                     && part.max_context[i] == c1.max_context[4 + i] && part.max_batch[i] == c1.max_batch[4 + i];
        CHECK(chunk);
        /* zipped axes */
        ms_sweep_axes_t zip = {ctx, ctx, 5, 5, 1};
        CHECK(run_sweep_memory(&g, &zip, 0, 5, 1, &part, &bad) == 0 && part.batch[4] == ctx[4]);
    }
    int spread = 0;                          /* the search walks through several candidates */
    for (int j = 0; j < 2 * SL + 5 + E + 2; j++) spread += seen[j];
    CHECK(spread >= 4);
    /* malformed tables: an error code, never a read outside them */
    ms_sweep_mem_t good = make_group(MS_SWEEP_AUTO_LLAMA, places), g;
    ms_sweep_place_t bad_places[2 * SL + 5];
    int32_t chosen;
    int codes[12];
    memcpy(bad_places, places, sizeof(bad_places));
    g = good; g.places = bad_places; bad_places[2].layout = SL + 1;
    codes[0] = ms_sweep_check_mem(&g);
    bad_places[2].layout = places[2].layout; bad_places[3].cfg = 2;
    codes[1] = ms_sweep_check_mem(&g);
    g = good; g.i_layers_gpu = g.n_places - SL;
    codes[2] = ms_sweep_check_mem(&g);
    g = good; g.i_experts_cpu = g.n_places;
    codes[3] = ms_sweep_check_mem(&g);
    g = good; g.i_cpu_only = g.n_places;
    codes[4] = ms_sweep_check_mem(&g);
    g = good; g.i_all_gpu = -1;
    codes[5] = ms_sweep_check_mem(&g);
    g = good; g.i_n_cpu_moe = g.n_places - 1;
    codes[6] = ms_sweep_check_mem(&g);
    g = good; g.rule = 9;
    codes[7] = ms_sweep_check_mem(&g);
    g = make_group(MS_SWEEP_AUTO_KT, places); g.n_experts = -1;
    codes[8] = ms_sweep_check_mem(&g);
    g = make_group(MS_SWEEP_AUTO_KT, places); g.n_experts = E + 2;   /* gpu-experts=0..E+2 past the table */
    codes[9] = ms_sweep_check_mem(&g);
    g = make_group(MS_SWEEP_AUTO_KT, places); g.i_experts_cpu = -1;
    codes[10] = ms_sweep_check_mem(&g);
    g = good; g.n_layers = 1 << 30;
    codes[11] = ms_sweep_check_mem(&g);
    for (int i = 0; i < 12; i++) CHECK(codes[i] == MS_ERR_BAD_SWEEP);
    good = make_group(MS_SWEEP_AUTO_LLAMA, places);
    g = good; g.i_experts_cpu = g.n_places;           /* the same through both entry points */
    CHECK(ms_auto_placement(&g, 4096, 1, &chosen) == MS_ERR_BAD_SWEEP);
    CHECK(run_sweep_memory(&g, &ax, 0, SN, 1, &c1, &bad) == MS_ERR_BAD_SWEEP);
    g = good; g.cap = NULL;
    CHECK(ms_sweep_check_mem(&g) == MS_ERR_NULL_ARGUMENT);
    g = good; g.n_places = 0;
    CHECK(ms_sweep_check_mem(&g) == MS_ERR_BAD_SIZE);
    CHECK(ms_auto_placement(NULL, 4096, 1, &chosen) == MS_ERR_NULL_ARGUMENT);
    CHECK(ms_auto_placement(&good, 4096, 1, NULL) == MS_ERR_NULL_ARGUMENT);
    CHECK(ms_auto_placement(&good, 0, 1, &chosen) == MS_ERR_BAD_CONTEXT);
    CHECK(ms_auto_placement(&good, 4096, 0, &chosen) == MS_ERR_BAD_SIZE);
    {
        int64_t mc = -1;
        CHECK(ms_auto_max_context(NULL, 1, &mc) == MS_ERR_NULL_ARGUMENT);
        CHECK(ms_auto_max_context(&good, 1, NULL) == MS_ERR_NULL_ARGUMENT);
        CHECK(ms_auto_max_context(&good, 0, &mc) == MS_ERR_BAD_SIZE && mc == -1);
        g = good; g.i_experts_cpu = g.n_places;
        CHECK(ms_auto_max_context(&g, 1, &mc) == MS_ERR_BAD_SWEEP && mc == -1);
    }
    ms_sweep_axes_t bax = ax;
    bax.n_b = 0;
    CHECK(run_sweep_memory(&good, &bax, 0, 1, 1, &c1, &bad) == MS_ERR_BAD_SIZE);
    CHECK(run_sweep_memory(&good, &ax, 10, 6, 1, &c1, &bad) == MS_ERR_BAD_SIZE);   /* past the grid */
    CHECK(run_sweep_memory(&good, &ax, -1, 2, 1, &c1, &bad) == MS_ERR_BAD_SIZE);
    int64_t bctx[5] = {1, 700, 0, 20000, 32768}, bbat[3] = {1, 0, 16};
    bax = ax; bax.contexts = bctx;
    CHECK(run_sweep_memory(&good, &bax, 0, SN, 1, &c1, &bad) == MS_ERR_BAD_CONTEXT && bad == 2);
    bax = ax; bax.batches = bbat;
    CHECK(run_sweep_memory(&good, &bax, 0, SN, 1, &c1, &bad) == MS_ERR_BAD_SIZE && bad == 1);
    {
        ms_sweep_mem_out_t o = mem_out(&c1);
        int64_t per = ms_sweep_memory_workspace_size(3);
        void *ws = malloc((size_t) per);
        CHECK(ms_sweep_memory(&good, &ax, 0, SN, 1, ws, per - 8, &o, &bad) == MS_ERR_BAD_WORKSPACE);
        CHECK(ms_sweep_memory(&good, &ax, 0, SN, 1, ws, per, NULL, &bad) == MS_ERR_NULL_ARGUMENT);
        free(ws);
    }
}

/* ---------------------------------------------------------------------------- sweeps: decode
 * Two variants over a table of three attention kinds and two context functions; Monte Carlo with two
 * templates (routed experts fetched into a GPU cache; computed on the CPU). Tables live on the heap so
 * that any read past them is an ASan error. */
enum { DN = 8 };
typedef struct {
    double dec[DN], agg[DN], tpot[DN], p50[DN], p99[DN], pre[DN], hit[DN];
    int32_t bn[DN];
} dec_cols_t;

static ms_sweep_dec_out_t dec_out(dec_cols_t *c, int with_p)
{
    ms_sweep_dec_out_t o = {c->dec, c->agg, c->tpot, with_p ? c->p50 : NULL, with_p ? c->p99 : NULL, c->pre, c->hit,
                            c->bn};
    return o;
}

typedef struct {
    ms_sweep_decode_t d;
    ms_sweep_variant_t *variants;
    ms_sweep_kind_t *kinds;
    ms_ctx_fn_t *fns;
    int32_t *layer_fn;
    ms_decode_model_t *models;
    ms_machine_t *machines;
    ms_routing_t routing;
} dec_group_t;

static int32_t cpu_modes[L] = {MS_EXP_CPU, MS_EXP_CPU, MS_EXP_CPU, MS_EXP_CPU, MS_EXP_CPU, MS_EXP_CPU};

static void make_dec_group(dec_group_t *g)
{
    ms_ctx_fn_t full = {1e5, 0.0, 0.0, 0.0, 0.0, -1, -1, 0, -1}, window = {1e5, 0.0, 0.0, 0.0, 512.0, 1024, -1, 0, -1};
    ms_ctx_fn_t score = {2e3, 0.0, 0.0, 0.0, 0.0, -1, -1, 0, -1}, wscore = {2e3, 0.0, 0.0, 0.0, 0.0, 1024, -1, 0, -1};
    memset(g, 0, sizeof(*g));
    g->variants = calloc(2, sizeof(ms_sweep_variant_t));
    g->kinds = calloc(3, sizeof(ms_sweep_kind_t));
    g->fns = calloc(4, sizeof(ms_ctx_fn_t));
    g->layer_fn = calloc(L, sizeof(int32_t));
    g->models = calloc(2, sizeof(ms_decode_model_t));
    g->machines = calloc(2, sizeof(ms_machine_t));
    g->fns[0] = full; g->fns[1] = window; g->fns[2] = score; g->fns[3] = wscore;
    for (int k = 0; k < 3; k++) {
        ms_sweep_kind_t *q = &g->kinds[k];
        q->n = 4.0 - k; q->kv_rate = 1.0 / 8e11; q->sf_rate = 1.0 / 1e14;
        q->res_mem = k == 2 ? MS_RES_HOST_MEM : MS_RES_GPU_MEM;
        q->res_flops = k == 2 ? MS_RES_CPU_COMPUTE : MS_RES_GPU_COMPUTE;
        q->fn = k % 2;
    }
    for (int v = 0; v < 2; v++) {
        ms_sweep_variant_t *x = &g->variants[v];
        x->step0 = 1e-3 * (v + 1);
        x->by_resource[v ? MS_RES_HOST_MEM : MS_RES_GPU_MEM] = x->step0;
        x->accepted = v ? 1.5 : 1.0;
        x->tpot_scale = 1e3 / x->accepted;
        x->hit_rate = v ? 0.6 : -1.0;
        x->prefill0 = 0.05 * (v + 1);
        x->kind0 = v; x->n_kinds = 2; x->mc = v;
    }
    for (int l = 0; l < L; l++) g->layer_fn[l] = l % 2;
    g->models[0] = make_decode_model(MS_EXP_FETCH, 1);
    g->models[1] = g->models[0];
    g->models[1].expert_mode = cpu_modes;
    g->machines[0] = make_machine();
    g->machines[1] = make_machine();
    g->machines[1].host_bw = 3e10;
    g->routing = make_routing(1);
    g->d.variants = g->variants; g->d.n_variants = 2; g->d.kinds = g->kinds; g->d.n_kinds = 3;
    g->d.n_fns = 2; g->d.fn_kv = g->fns; g->d.fn_sf = g->fns + 2; g->d.prompt = 512.0;
    g->d.n_layers = L; g->d.layer_fn = g->layer_fn; g->d.n_templates = 2; g->d.mc_models = g->models;
    g->d.mc_machines = g->machines; g->d.routing = &g->routing;
    g->d.steps = 40; g->d.warmup = 8; g->d.policy = MS_POLICY_LRU; g->d.seed = 5;
}

static void free_dec_group(dec_group_t *g)
{
    free(g->variants); free(g->kinds); free(g->fns); free(g->layer_fn); free(g->models); free(g->machines);
}

static int run_mc(const ms_sweep_decode_t *d, const int64_t *ctx, const int64_t *bat, const int32_t *var,
                  const uint64_t *idx, int threads, dec_cols_t *c, int64_t *bad)
{
    int64_t wsb = ms_sweep_montecarlo_workspace_size(d, 4);
    if (wsb <= 0) wsb = 64;
    void *ws = malloc((size_t) (2 * wsb));
    ms_sweep_dec_out_t o = dec_out(c, 1);
    memset(c, 0, sizeof(*c));
    int code = ms_sweep_montecarlo(d, ctx, bat, var, idx, DN, threads, ws, wsb, &o, bad);
    free(ws);
    return code;
}

static void test_sweep_decode(void)
{
    dec_group_t G;
    int64_t ctx[DN] = {1, 512, 4096, 100000, 1, 512, 4096, 100000}, bat[DN] = {1, 4, 1, 4, 4, 1, 4, 1}, bad = -7;
    int32_t var[DN] = {0, 1, 0, 1, 1, 0, 1, 0};
    uint64_t idx[DN] = {10, 11, 12, 13, 14, 15, 16, 17};
    dec_cols_t a, b;
    ms_sweep_dec_out_t oa = dec_out(&a, 1), ob = dec_out(&b, 0);
    make_dec_group(&G);
    memset(&a, 0, sizeof(a)); memset(&b, 0, sizeof(b));
    CHECK(ms_sweep_analytic(&G.d, ctx, bat, var, DN, 1, &oa, &bad) == 0 && bad == -1);
    CHECK(ms_sweep_analytic(&G.d, ctx, bat, var, DN, 2, &ob, &bad) == 0);
    int sane = 1;
    for (int i = 0; i < DN; i++) {
        sane &= a.dec[i] == b.dec[i] && a.tpot[i] == b.tpot[i] && a.bn[i] == b.bn[i] && a.pre[i] == b.pre[i];
        sane &= isfinite(a.dec[i]) && a.dec[i] > 0.0 && a.agg[i] == (double) bat[i] * a.dec[i] && a.tpot[i] > 0.0;
        sane &= a.p50[i] == a.tpot[i] && a.p99[i] == a.tpot[i] && a.pre[i] > 0.0;
        sane &= a.bn[i] >= 0 && a.bn[i] < MS_N_RES;
        sane &= var[i] ? a.hit[i] == 0.6 : isnan(a.hit[i]);
    }
    CHECK(sane);
    CHECK(a.dec[3] < a.dec[1]);                       /* a longer context decodes slower */
    /* Monte Carlo: each configuration is ms_decode of its template at its context, on any thread count */
    CHECK(run_mc(&G.d, ctx, bat, var, idx, 1, &a, &bad) == 0 && bad == -1);
    CHECK(run_mc(&G.d, ctx, bat, var, idx, 2, &b, &bad) == 0);
    CHECK(memcmp(&a, &b, sizeof(a)) == 0);
    int direct = 1;
    for (int i = 0; i < DN; i++) {
        double kv[L], sf[L];
        ms_decode_model_t m = G.models[var[i]];
        ms_decode_config_t c = make_decode_config((int32_t) bat[i], 40, MS_POLICY_LRU, MS_MODE_MONTECARLO);
        ms_decode_result_t r;
        for (int l = 0; l < L; l++) {
            kv[l] = ms_ctx_eval(&G.fns[G.layer_fn[l]], ctx[i]) * m.kv_bytes[l];   /* template: KV copies */
            sf[l] = ms_ctx_eval(&G.fns[2 + G.layer_fn[l]], ctx[i]);
        }
        m.kv_bytes = kv; m.score_flops = sf;
        c.warmup = 8; c.seed = 5; c.index = idx[i];
        direct &= run_decode(&m, &G.machines[var[i]], &G.routing, &c, &r) == 0 && a.dec[i] == r.accepted / r.step_mean
                  && a.p99[i] == 1e3 * r.step_p99 / r.accepted;
    }
    CHECK(direct);
    /* bad indices and tables: an error code before anything is read */
    int32_t bvar[DN];
    memcpy(bvar, var, sizeof(bvar));
    bvar[3] = 2;
    CHECK(ms_sweep_analytic(&G.d, ctx, bat, bvar, DN, 1, &oa, &bad) == MS_ERR_BAD_SWEEP && bad == 3);
    CHECK(run_mc(&G.d, ctx, bat, bvar, idx, 1, &a, &bad) == MS_ERR_BAD_SWEEP && bad == 3);
    bvar[3] = var[3]; bvar[5] = -1;
    CHECK(ms_sweep_analytic(&G.d, ctx, bat, bvar, DN, 2, &oa, &bad) == MS_ERR_BAD_SWEEP && bad == 5);
    ms_sweep_decode_t d = G.d;
    d.n_kinds = 2;                                    /* variant 1's slice [1, 3) runs past the table */
    CHECK(ms_sweep_analytic(&d, ctx, bat, var, DN, 1, &oa, &bad) == MS_ERR_BAD_SWEEP);
    CHECK(run_mc(&d, ctx, bat, var, idx, 1, &a, &bad) == MS_ERR_BAD_SWEEP);
    int codes[10];
    G.variants[1].kind0 = 2;                          /* [2, 4) of 3 kinds */
    codes[0] = ms_sweep_analytic(&G.d, ctx, bat, var, DN, 1, &oa, &bad);
    G.variants[1].kind0 = -1;
    codes[1] = ms_sweep_analytic(&G.d, ctx, bat, var, DN, 1, &oa, &bad);
    G.variants[1].kind0 = 1; G.variants[1].n_kinds = INT32_MAX;   /* kind0 + n_kinds overflows int32 */
    codes[2] = ms_sweep_analytic(&G.d, ctx, bat, var, DN, 1, &oa, &bad);
    G.variants[1].n_kinds = 2; G.kinds[2].fn = 2;
    codes[3] = ms_sweep_analytic(&G.d, ctx, bat, var, DN, 1, &oa, &bad);
    G.kinds[2].fn = 0; G.kinds[0].res_mem = MS_N_RES;
    codes[4] = ms_sweep_analytic(&G.d, ctx, bat, var, DN, 1, &oa, &bad);
    G.kinds[0].res_mem = MS_RES_GPU_MEM;
    d = G.d; d.n_fns = MS_SWEEP_MAX_FNS + 1;
    codes[5] = ms_sweep_analytic(&d, ctx, bat, var, DN, 1, &oa, &bad);
    G.variants[1].mc = 2;                             /* past the two templates */
    codes[6] = run_mc(&G.d, ctx, bat, var, idx, 1, &a, &bad);
    G.variants[1].mc = -1;
    codes[7] = run_mc(&G.d, ctx, bat, var, idx, 1, &a, &bad);
    G.variants[1].mc = 1; G.layer_fn[3] = 2;
    codes[8] = run_mc(&G.d, ctx, bat, var, idx, 1, &a, &bad);
    G.layer_fn[3] = 1;
    d = G.d; d.n_layers = L - 1;                      /* templates deeper than the per-layer functions */
    codes[9] = run_mc(&d, ctx, bat, var, idx, 1, &a, &bad);
    for (int i = 0; i < 10; i++) CHECK(codes[i] == MS_ERR_BAD_SWEEP);
    d = G.d; d.n_templates = 0;
    CHECK(ms_sweep_montecarlo_workspace_size(&d, 4) == 0);
    CHECK(run_mc(&d, ctx, bat, var, idx, 1, &a, &bad) == MS_ERR_BAD_SWEEP);
    d = G.d; d.prompt = 0.0;
    CHECK(ms_sweep_analytic(&d, ctx, bat, var, DN, 1, &oa, &bad) == MS_ERR_BAD_SIZE);
    CHECK(ms_sweep_analytic(&G.d, ctx, bat, NULL, DN, 1, &oa, &bad) == MS_ERR_NULL_ARGUMENT);
    CHECK(ms_sweep_analytic(NULL, ctx, bat, var, DN, 1, &oa, &bad) == MS_ERR_NULL_ARGUMENT);
    {
        void *ws = malloc(64);
        ms_sweep_dec_out_t o = dec_out(&a, 1);
        CHECK(ms_sweep_montecarlo(&G.d, ctx, bat, var, idx, DN, 1, ws, 8, &o, &bad) == MS_ERR_BAD_WORKSPACE);
        free(ws);
    }
    int64_t bbat[DN];
    memcpy(bbat, bat, sizeof(bbat));
    bbat[5] = 0;
    CHECK(run_mc(&G.d, ctx, bbat, var, idx, 2, &a, &bad) == MS_ERR_BAD_SIZE && bad == 5);
    bbat[5] = 1; bbat[2] = ((int64_t) 1 << 32) + 3;   /* would have run as batch 3 under an int32 cast */
    CHECK(run_mc(&G.d, ctx, bbat, var, idx, 1, &a, &bad) == MS_ERR_BAD_SIZE && bad == 2);
    free_dec_group(&G);
}

/* The consistency screen: a consistent row passes, each kind of break is the first flagged row, and
 * malformed calls are error codes. */
static void test_screen(void)
{
    int64_t ctx[3] = {50, 50, 50}, bat[3] = {2, 2, 2}, mc[3] = {100, 100, 100}, mb[3] = {4, 4, 4};
    int32_t fits[3] = {1, 1, 1};
    double w[3] = {1, 1, 1}, kv[3] = {0.5, 0.5, 0.5}, st[3] = {0.5, 0.5, 0.5};
    double gpu[3] = {1, 1, 1}, host[3] = {1, 1, 1}, sto[3] = {0, 0, 0};
    double dec[3] = {10, 10, 10}, agg[3] = {20, 20, 20}, tpot[3] = {100, 100, 100}, pf[3] = {5, 5, 5};
    double hit[3] = {0.5, NAN, 0.5}, p50[3] = {90, 90, 90}, p99[3] = {120, 120, 120};
    int8_t lut[2] = {0, 3};                        /* code 1: fits, GPU tier in use */
    ms_sweep_mem_out_t m = {ctx, bat, NULL, fits, NULL, w, kv, st, gpu, host, sto, mc, mb};
    ms_sweep_dec_out_t d = {dec, agg, tpot, NULL, NULL, pf, hit, NULL};
    ms_screen_segment_t seg = {0, 3, 10.0, 10.0, 0.0, 1000, 1000};
    int64_t first = 7;
    CHECK(ms_sweep_screen(&m, &d, &seg, 1, lut, 2, 1e-9, 1 << 30, 2, &first) == 0 && first == -1);
    d.tpot_p50_ms = p50; d.tpot_p99_ms = p99;
    CHECK(ms_sweep_screen(&m, &d, &seg, 1, lut, 2, 1e-9, 1 << 30, 2, &first) == 0 && first == -1);
    p99[2] = 80;                                   /* p99 < p50 */
    CHECK(ms_sweep_screen(&m, &d, &seg, 1, lut, 2, 1e-9, 1 << 30, 2, &first) == 0 && first == 2);
    p99[2] = 120; gpu[1] = 11;                     /* over the GPU's capacity, yet said to fit */
    CHECK(ms_sweep_screen(&m, &d, &seg, 1, lut, 2, 1e-9, 1 << 30, 2, &first) == 0 && first == 1);
    gpu[1] = 1; kv[0] = NAN;
    CHECK(ms_sweep_screen(&m, &d, &seg, 1, lut, 2, 1e-9, 1 << 30, 2, &first) == 0 && first == 0);
    kv[0] = 0.5; mc[2] = 10;                       /* fits at 50 but max context 10 */
    CHECK(ms_sweep_screen(&m, &d, &seg, 1, lut, 2, 1e-9, 1 << 30, 2, &first) == 0 && first == 2);
    mc[2] = 100; agg[1] = 21; seg.start = 2;       /* a segment sees only its own rows */
    CHECK(ms_sweep_screen(&m, &d, &seg, 1, lut, 2, 1e-9, 1 << 30, 2, &first) == 0 && first == -1);
    seg.start = 0;
    CHECK(ms_sweep_screen(&m, &d, &seg, 1, lut, 2, 1e-9, 1 << 30, 2, &first) == 0 && first == 1);
    agg[1] = 20; fits[0] = 5;                      /* a fits code outside the table */
    CHECK(ms_sweep_screen(&m, &d, &seg, 1, lut, 2, 1e-9, 1 << 30, 2, &first) == 0 && first == 0);
    fits[0] = 1;
    CHECK(ms_sweep_screen(&m, &d, &seg, 1, lut, 2, 1e-9, 1 << 30, 2, NULL) == MS_ERR_NULL_ARGUMENT);
    CHECK(ms_sweep_screen(NULL, &d, &seg, 1, lut, 2, 1e-9, 1 << 30, 2, &first) == MS_ERR_NULL_ARGUMENT && first == -1);
    CHECK(ms_sweep_screen(&m, &d, &seg, 1, lut, 0, 1e-9, 1 << 30, 2, &first) == MS_ERR_BAD_SIZE);
    seg.end = -1;
    CHECK(ms_sweep_screen(&m, &d, &seg, 1, lut, 2, 1e-9, 1 << 30, 2, &first) == MS_ERR_BAD_SIZE);
}

/* ---------------------------------------------------------------------------- serving scheduler */
static void test_serve(void)
{
    static const double gb[2] = {1.0, 8.0}, gc[2] = {1.0, 1000.0}, dec[4] = {0.01, 0.02, 0.02, 0.04};
    static const double gp[2] = {1.0, 512.0}, gd[2] = {0.0, 1000.0}, pf[4] = {0.01, 0.02, 0.1, 0.2};
    ms_serve_table_t t = {2, 2, 2, 2, gb, gc, dec, gp, gd, pf, 0.01};
    ms_serve_config_t c = {1, 8, 0.0, 32, 100, 50, 256, 8, 16, 1000, 0, 0, 0, 1000000};
    double arr[32], first[32], fin[32];
    int32_t pre[32];
    ms_serve_out_t out = {arr, first, fin, pre, 0, 0, 0, 0, 0.0};
    ms_rng_t rng;
    int64_t ws_bytes = ms_serve_workspace_size(&c);
    void *ws = malloc((size_t) ws_bytes);
    int ok = 1;
    ms_rng_init(&rng, 1, 2, 0);
    CHECK(ws != NULL && ws_bytes == 8 * 32 * (int64_t) sizeof(int64_t));
    CHECK(ms_serve(NULL, &c, &rng, ws, ws_bytes, &out) == MS_ERR_NULL_ARGUMENT);
    CHECK(ms_serve(&t, &c, &rng, ws, ws_bytes - 1, &out) == MS_ERR_BAD_WORKSPACE);
    CHECK(ms_serve(&t, &c, &rng, ws, ws_bytes, &out) == 0);
    for (int i = 0; i < 32; i++) ok &= fin[i] >= first[i] && first[i] >= arr[i] && arr[i] >= 0.0;
    CHECK(ok && out.steps > 0 && out.preempted == 0 && out.max_running == 8);
    c.n_blocks = 20;                         /* two whole requests: preemption and recompute */
    CHECK(ms_serve(&t, &c, &rng, ws, ws_bytes, &out) == 0 && out.preempted > 0 && out.peak_blocks <= 20);
    c.n_blocks = 3;                          /* not even one prompt chunk */
    CHECK(ms_serve(&t, &c, &rng, ws, ws_bytes, &out) == MS_ERR_KV_TOO_SMALL);
    c.n_blocks = 1000;
    c.closed_loop = 0;
    c.rate = 0.0;
    CHECK(ms_serve(&t, &c, &rng, ws, ws_bytes, &out) == MS_ERR_BAD_SERVE);
    c.rate = 50.0;
    c.max_steps = 3;
    CHECK(ms_serve(&t, &c, &rng, ws, ws_bytes, &out) == MS_ERR_BAD_SERVE);
    c.max_steps = 1000000;
    CHECK(ms_serve(&t, &c, &rng, ws, ws_bytes, &out) == 0 && arr[31] > arr[0]);
    t.grid_b = gc;                           /* still ascending: fine */
    CHECK(ms_serve(&t, &c, &rng, ws, ws_bytes, &out) == 0);
    t.n_b = 0;
    CHECK(ms_serve(&t, &c, &rng, ws, ws_bytes, &out) == MS_ERR_BAD_SERVE);
    CHECK(fabs(ms_serve_interp(gb, 2, gc, 2, dec, 4.5, 1.0) - 0.015) < 1e-15);
    free(ws);
}

int main(void)
{
    test_strerror_and_rng();
    test_memory();
    test_decode();
    test_che_table();
    test_page_table();
    test_windows_checked();
    test_window_moments();
    test_route_and_cache();
    test_ctx_and_lookup();
    test_stamp_restart();
    test_sweep_memory_and_placement();
    test_sweep_decode();
    test_screen();
    test_serve();
    printf("stamp digest %016llx (MS_STAMP_MAX %d)\n", (unsigned long long) stamp_digest(), (int) MS_STAMP_MAX);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
