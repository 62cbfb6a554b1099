/*
 * Serving under load: a continuous-batching scheduler (vLLM v1's, runtimes.md §2.3) over a step-cost
 * table that the analytic kernel filled (moesim.analysis.serve). engine/reference/serve.py repeats it
 * line for line; tests/test_serve.py holds the two to bit-identical event times.
 *
 * One step: the running requests in admission order each take their next tokens (one decode token, or
 * the next chunk of a prompt or of a recomputation) within the token budget, allocating KV blocks as
 * they go; a request that needs a block when none is free preempts the last-admitted running request
 * (possibly itself; vLLM v1's FCFS `self.running.pop()`, vllm/v1/core/sched/scheduler.py), which frees its
 * blocks and waits at the head of the queue to be recomputed (docs.vllm.ai configuration/optimization). Only
 * when nothing was preempted are waiting requests admitted, in order, while budget, max_num_seqs and
 * free blocks allow. A request emits a token whenever every token it holds has its KV computed.
 */
#include <math.h>
#include <stdlib.h>

#include "moesim.h"

typedef struct {                     /* the scheduler's state, laid out in the caller's workspace */
    int64_t *computed, *generated, *held, *hit, *running, *waiting, *sched_req, *sched_new;
    int64_t n_running, w_head, w_count, free_blocks, issued, done, cache_ready;
} serve_state_t;

static int64_t idx_below(const double *g, int32_t n, double x)
{
    /* the cell [g[i], g[i+1]] holding x, clamped to the grid */
    int32_t i = 0;
    while (i + 2 < n && x >= g[i + 1]) i++;
    return i;
}

double ms_serve_interp(const double *gx, int32_t nx, const double *gy, int32_t ny, const double *v, double x,
                       double y)
{
    int64_t i = 0, j = 0;
    double fx = 0.0, fy = 0.0, a, b;
    if (nx > 1) {
        i = idx_below(gx, nx, x);
        fx = (x - gx[i]) / (gx[i + 1] - gx[i]);
        fx = fx < 0.0 ? 0.0 : (fx > 1.0 ? 1.0 : fx);
    }
    if (ny > 1) {
        j = idx_below(gy, ny, y);
        fy = (y - gy[j]) / (gy[j + 1] - gy[j]);
        fy = fy < 0.0 ? 0.0 : (fy > 1.0 ? 1.0 : fy);
    }
    a = v[i * ny + j];
    b = ny > 1 ? v[i * ny + j + 1] : a;
    a = a + (b - a) * fy;
    if (nx > 1) {
        double c = v[(i + 1) * ny + j], d = ny > 1 ? v[(i + 1) * ny + j + 1] : c;
        c = c + (d - c) * fy;
        a = a + (c - a) * fx;
    }
    return a;
}

int64_t ms_serve_workspace_size(const ms_serve_config_t *c)
{
    if (!c || c->n_requests < 1) return 0;
    return 8 * c->n_requests * (int64_t) sizeof(int64_t);
}

static int check_grid(const double *g, int32_t n)
{
    if (!g || n < 1) return MS_ERR_BAD_SERVE;
    for (int32_t i = 0; i < n; i++) {
        if (!isfinite(g[i]) || (i > 0 && !(g[i] > g[i - 1]))) return MS_ERR_BAD_SERVE;
    }
    return 0;
}

static int check_inputs(const ms_serve_table_t *t, const ms_serve_config_t *c)
{
    if (check_grid(t->grid_b, t->n_b) || check_grid(t->grid_c, t->n_c) || check_grid(t->grid_p, t->n_p)
        || check_grid(t->grid_d, t->n_d) || !t->decode_s || !t->prefill_s) return MS_ERR_BAD_SERVE;
    for (int64_t k = 0; k < (int64_t) t->n_b * t->n_c; k++)
        if (!isfinite(t->decode_s[k]) || t->decode_s[k] < 0.0) return MS_ERR_BAD_SERVE;
    for (int64_t k = 0; k < (int64_t) t->n_p * t->n_d; k++)
        if (!isfinite(t->prefill_s[k]) || t->prefill_s[k] < 0.0) return MS_ERR_BAD_SERVE;
    if (!isfinite(t->forward_s) || t->forward_s < 0.0) return MS_ERR_BAD_SERVE;
    if (c->n_requests < 1 || c->isl < 1 || c->osl < 1 || c->max_num_batched_tokens < 1 || c->max_num_seqs < 1
        || c->block_size < 1 || c->n_blocks < 0 || c->state_blocks < 0 || c->prefix_blocks < 0
        || c->snapshot_blocks < 0 || c->max_steps < 1) return MS_ERR_BAD_SERVE;
    if (c->closed_loop ? c->concurrency < 1 : !(isfinite(c->rate) && c->rate > 0.0)) return MS_ERR_BAD_SERVE;
    return 0;
}

static void layout(serve_state_t *s, void *ws, int64_t n)
{
    int64_t *p = (int64_t *) ws;
    s->computed = p; s->generated = p + n; s->held = p + 2 * n; s->hit = p + 3 * n;
    s->running = p + 4 * n; s->waiting = p + 5 * n; s->sched_req = p + 6 * n; s->sched_new = p + 7 * n;
    for (int64_t k = 0; k < 4 * n; k++) p[k] = 0;
}

static void push_back(serve_state_t *s, int64_t n, int64_t r)
{
    s->waiting[(s->w_head + s->w_count) % n] = r;
    s->w_count++;
}

static void push_front(serve_state_t *s, int64_t n, int64_t r)
{
    s->w_head = (s->w_head + n - 1) % n;
    s->waiting[s->w_head] = r;
    s->w_count++;
}

static int64_t blocks_for(int64_t tokens, int64_t bs) { return (tokens + bs - 1) / bs; }

/* The prefix tokens a request admitted now skips: whole cached blocks, short of its last prompt token. */
static int64_t hit_blocks(const ms_serve_config_t *c)
{
    int64_t most = (c->isl - 1) / c->block_size;
    return c->prefix_blocks < most ? c->prefix_blocks : most;
}

static void preempt(serve_state_t *s, const ms_serve_config_t *c, ms_serve_out_t *out, int64_t n)
{
    int64_t v = s->running[--s->n_running];
    s->free_blocks += s->held[v] + c->state_blocks;
    s->held[v] = 0;
    s->computed[v] = 0;
    s->hit[v] = 0;
    out->preemptions[v]++;
    out->preempted++;
    push_front(s, n, v);
}

/* Schedule the running requests; returns the tokens used, sets *preempted. */
static int64_t schedule_running(serve_state_t *s, const ms_serve_config_t *c, ms_serve_out_t *out, int64_t n,
                                int64_t *n_sched, int *preempted)
{
    int64_t budget = c->max_num_batched_tokens, r = 0;
    while (r < s->n_running && budget > 0) {
        int64_t q = s->running[r], target = c->isl + s->generated[q], take = target - s->computed[q], extra;
        int self = 0;
        if (take > budget) take = budget;
        extra = blocks_for(s->computed[q] + take, c->block_size) - s->hit[q] * hit_blocks(c) - s->held[q];
        while (extra > s->free_blocks) {
            self = s->running[s->n_running - 1] == q;
            preempt(s, c, out, n);
            *preempted = 1;
            if (self) break;
        }
        if (self) break;
        if (extra > 0) {
            s->held[q] += extra;
            s->free_blocks -= extra;
        }
        s->sched_req[*n_sched] = q;
        s->sched_new[(*n_sched)++] = take;
        budget -= take;
        r++;
    }
    return c->max_num_batched_tokens - budget;
}

/* Admit waiting requests in order while budget, max_num_seqs and free blocks allow. */
static void admit(serve_state_t *s, const ms_serve_config_t *c, int64_t n, int64_t budget, int64_t *n_sched)
{
    while (s->w_count > 0 && budget > 0 && s->n_running < c->max_num_seqs) {
        int64_t q = s->waiting[s->w_head], hit = s->cache_ready, start, take, need;
        start = hit * hit_blocks(c) * c->block_size;
        take = c->isl + s->generated[q] - start;
        if (take > budget) take = budget;
        need = blocks_for(start + take, c->block_size) - hit * hit_blocks(c);
        if (need + c->state_blocks > s->free_blocks) break;
        s->w_head = (s->w_head + 1) % n;
        s->w_count--;
        s->free_blocks -= need + c->state_blocks;
        s->held[q] = need;
        s->hit[q] = hit;
        s->computed[q] = start;
        s->running[s->n_running++] = q;
        s->sched_req[*n_sched] = q;
        s->sched_new[(*n_sched)++] = take;
        budget -= take;
    }
}

/* Seconds of the step just scheduled. */
static double step_seconds(const serve_state_t *s, const ms_serve_table_t *t, int64_t n_sched)
{
    double n_dec = 0.0, ctx = 0.0, pf = 0.0, depth = 0.0, t_dec = 0.0, t_pf = 0.0, shared;
    for (int64_t k = 0; k < n_sched; k++) {
        int64_t q = s->sched_req[k], take = s->sched_new[k];
        if (take == 1 && s->generated[q] > 0 && s->computed[q] > 0) {
            n_dec += 1.0;
            ctx += (double) (s->computed[q] + 1);
        } else {
            pf += (double) take;
            depth += (double) take * (double) s->computed[q];
        }
    }
    if (n_dec > 0.0) t_dec = ms_serve_interp(t->grid_b, t->n_b, t->grid_c, t->n_c, t->decode_s, n_dec, ctx / n_dec);
    if (pf > 0.0) t_pf = ms_serve_interp(t->grid_p, t->n_p, t->grid_d, t->n_d, t->prefill_s, pf, depth / pf);
    if (n_dec > 0.0 && pf > 0.0) {
        shared = t->forward_s < t_dec ? t->forward_s : t_dec;
        shared = shared < t_pf ? shared : t_pf;
        return t_dec + t_pf - shared;
    }
    return t_dec + t_pf;
}

static void finish(serve_state_t *s, const ms_serve_config_t *c, ms_serve_out_t *out, int64_t q, double now)
{
    int64_t r = 0;
    while (s->running[r] != q) r++;
    for (; r + 1 < s->n_running; r++) s->running[r] = s->running[r + 1];
    s->n_running--;
    s->free_blocks += s->held[q] + c->state_blocks;
    s->held[q] = 0;
    out->finish_s[q] = now;
    s->done++;
    if (c->closed_loop && s->issued < c->n_requests) out->arrival_s[s->issued++] = now;
}

/* Advance the scheduled requests by their tokens at time `now`; emit tokens, finish, cache the prefix. */
static void advance(serve_state_t *s, const ms_serve_config_t *c, ms_serve_out_t *out, int64_t n_sched, double now)
{
    int64_t cached_tokens = hit_blocks(c) * c->block_size;
    for (int64_t k = 0; k < n_sched; k++) {
        int64_t q = s->sched_req[k];
        s->computed[q] += s->sched_new[k];
        if (!s->cache_ready && cached_tokens > 0 && s->computed[q] >= cached_tokens && !s->hit[q]
            && s->free_blocks >= c->snapshot_blocks) {
            /* the first request through the prefix hands its blocks to the cache, plus the snapshots */
            s->cache_ready = 1;
            s->hit[q] = 1;
            s->held[q] -= hit_blocks(c);
            s->free_blocks -= c->snapshot_blocks;
        }
        if (s->computed[q] == c->isl + s->generated[q]) {
            s->generated[q]++;
            if (s->generated[q] == 1) out->first_token_s[q] = now;
            if (s->generated[q] == c->osl) finish(s, c, out, q, now);
        }
    }
}

static void start(serve_state_t *s, const ms_serve_config_t *c, ms_rng_t *rng, ms_serve_out_t *out)
{
    double t = 0.0;
    int64_t n = c->n_requests;
    s->n_running = s->w_head = s->w_count = s->done = s->cache_ready = 0;
    s->free_blocks = c->n_blocks;
    out->steps = out->preempted = out->max_running = out->peak_blocks = 0;
    out->busy_s = 0.0;
    for (int64_t k = 0; k < n; k++) {
        out->first_token_s[k] = out->finish_s[k] = -1.0;
        out->preemptions[k] = 0;
        out->arrival_s[k] = -1.0;
    }
    if (c->closed_loop) {
        s->issued = c->concurrency < n ? c->concurrency : n;
        for (int64_t k = 0; k < s->issued; k++) out->arrival_s[k] = 0.0;
    } else {
        for (int64_t k = 0; k < n; k++) {
            t += -log(ms_rng_uniform(rng)) / c->rate;
            out->arrival_s[k] = t;
        }
        s->issued = n;
    }
}

int ms_serve(const ms_serve_table_t *t, const ms_serve_config_t *c, ms_rng_t *rng, void *workspace,
             int64_t workspace_bytes, ms_serve_out_t *out)
{
    serve_state_t s;
    int64_t n, next = 0, n_sched, used, loops = 0;
    double now = 0.0;
    int err;
    if (!t || !c || !rng || !workspace || !out || !out->arrival_s || !out->first_token_s || !out->finish_s
        || !out->preemptions) return MS_ERR_NULL_ARGUMENT;
    if ((err = check_inputs(t, c))) return err;
    n = c->n_requests;
    if (workspace_bytes < ms_serve_workspace_size(c)) return MS_ERR_BAD_WORKSPACE;
    layout(&s, workspace, n);
    start(&s, c, rng, out);
    while (s.done < n) {
        int preempted = 0;
        while (next < s.issued && out->arrival_s[next] <= now) push_back(&s, n, next++);
        if (s.n_running == 0 && s.w_count == 0) {
            if (next >= s.issued) return MS_ERR_BAD_SERVE;
            now = out->arrival_s[next];      /* idle until the next arrival */
            continue;
        }
        if (out->steps >= c->max_steps || ++loops > 2 * c->max_steps) return MS_ERR_BAD_SERVE;
        n_sched = 0;
        used = schedule_running(&s, c, out, n, &n_sched, &preempted);
        if (!preempted) admit(&s, c, n, c->max_num_batched_tokens - used, &n_sched);
        if (n_sched == 0 && !preempted) return MS_ERR_KV_TOO_SMALL;
        if (n_sched == 0) continue;          /* the only running request preempted itself: admit it again */
        if (s.n_running > out->max_running) out->max_running = s.n_running;
        if (c->n_blocks - s.free_blocks > out->peak_blocks) out->peak_blocks = c->n_blocks - s.free_blocks;
        {
            double dt = step_seconds(&s, t, n_sched);
            now += dt;
            out->busy_s += dt;
        }
        out->steps++;
        advance(&s, c, out, n_sched, now);
    }
    return 0;
}
