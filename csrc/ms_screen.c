/*
 * The sweep's consistency screen (ms_sweep_screen): one pass over a chunk's columns that flags every row
 * which could break a guarantee of moesim.analysis.consistency -- bytes finite, >= 0 and covering weights
 * + KV + state, fits against the capacities, max context / batch covering what fits, decode figures
 * finite and positive and agreeing with each other, hit rates in [0, 1]. Comparisons are exact, so a row
 * at a tolerance boundary is flagged and the Python explanation (with tolerances) decides. It replaces
 * some 35 numpy passes over the columns; its twin is consistency._screen (numpy), tested to flag alike.
 */
#include <math.h>
#include <stddef.h>

#include "ms_internal.h"

/* Whether row i could break a guarantee. Every test is evaluated (bitwise |, no early exit) so the
 * compiler can keep the loop free of branches; a NaN fails each comparison it enters. */
static inline int row_flagged(const ms_sweep_mem_out_t *m, const ms_sweep_dec_out_t *d, int64_t i,
                              const ms_screen_segment_t *s, const int8_t *lut, int32_t n_lut, double rel,
                              int64_t max_batch)
{
    double g = m->gpu[i], h = m->host[i], st = m->storage[i], w = m->weights[i], kv = m->kv[i], sa = m->state[i];
    double tiers = g + h + st, parts = w + kv + sa;
    double tok = d->decode_tok_s[i], t = d->tpot_ms[i] * tok, a = d->aggregate_tok_s[i] / tok / (double) m->batch[i];
    double pf = d->prefill_tok_s[i], hit = d->hit_rate[i];
    int64_t mc = m->max_context[i], mb = m->max_batch[i], ctx = m->context[i];
    int64_t need = ctx < s->max_context ? ctx : s->max_context;
    int32_t code = m->fits[i];
    int in_lut = code >= 0 && code < n_lut;
    int got = lut[in_lut ? code : 0];              /* fits bits: 1 fits, 2 GPU tier in use, 4 storage in use */
    int within = (g <= s->gpu_cap) & (h <= s->host_cap);
    int want = within | (((g > 0.0) & within & (s->gpu_cap > 0.0)) << 1) | (((st > 0.0) & within) << 2);
    int bad = !in_lut | (got != want);
    bad |= !((g >= 0.0) & (h >= 0.0) & (st >= 0.0) & (w >= 0.0) & (kv >= 0.0) & (sa >= 0.0));
    bad |= !isfinite(tiers) | !isfinite(parts) | (tiers < parts) | (st > s->storage_cap);
    bad |= (mc < 0) | (mc > s->context_bound) | (mb < 0) | (mb > max_batch);
    bad |= (got & 1) & ((mc < need) | (mb < m->batch[i]));
    bad |= !(tok > 0.0) | !((t >= 1e3 * (1.0 - rel)) & (t <= 1e3 * (1.0 + rel)));
    bad |= !((a >= 1.0 - rel) & (a <= 1.0 + rel)) | !(pf > 0.0) | !isfinite(pf) | (hit < 0.0) | (hit > 1.0);
    if (d->tpot_p50_ms != NULL) {
        double p50 = d->tpot_p50_ms[i], p99 = d->tpot_p99_ms[i];
        bad |= !(p50 > 0.0) | !isfinite(p99) | (p99 < p50);
    }
    return bad;
}

#define SCREEN_BLOCK 256

int ms_sweep_screen(const ms_sweep_mem_out_t *mem, const ms_sweep_dec_out_t *dec, const ms_screen_segment_t *segs,
                    int32_t n_segs, const int8_t *fits_lut, int32_t n_lut, double rel, int64_t max_batch,
                    int n_threads, int64_t *first_flagged)
{
    if (first_flagged == NULL) return MS_ERR_NULL_ARGUMENT;
    *first_flagged = -1;
    if (mem == NULL || dec == NULL || segs == NULL || fits_lut == NULL) return MS_ERR_NULL_ARGUMENT;
    if (n_segs < 0 || n_lut < 1 || !(rel >= 0.0)) return MS_ERR_BAD_SIZE;
    for (int32_t k = 0; k < n_segs; k++)
        if (segs[k].start < 0 || segs[k].end < segs[k].start) return MS_ERR_BAD_SIZE;
    for (int32_t k = 0; k < n_segs; k++) {
        const ms_screen_segment_t *s = &segs[k];
        int64_t n_blocks = (s->end - s->start + SCREEN_BLOCK - 1) / SCREEN_BLOCK, found = INT64_MAX;
        int nt = ms_useful_threads(s->end - s->start, n_threads, 32768);   /* ~30 ns a row */
        (void) nt;
#ifdef MOESIM_HAVE_OPENMP
        #pragma omp parallel for schedule(static) num_threads(nt) reduction(min: found)
#endif
        for (int64_t q = 0; q < n_blocks; q++) {
            int64_t b = s->start + q * SCREEN_BLOCK, e = b + SCREEN_BLOCK < s->end ? b + SCREEN_BLOCK : s->end;
            int any = 0;
            for (int64_t i = b; i < e; i++) any |= row_flagged(mem, dec, i, s, fits_lut, n_lut, rel, max_batch);
            for (int64_t i = b; any && i < e; i++) {    /* the block holds one: which */
                if (row_flagged(mem, dec, i, s, fits_lut, n_lut, rel, max_batch)) {
                    if (i < found) found = i;
                    break;
                }
            }
        }
        if (found != INT64_MAX) {
            *first_flagged = found;
            return 0;
        }
    }
    return 0;
}
