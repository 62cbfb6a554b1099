/*
 * Random streams: xoshiro256** (Blackman & Vigna) seeded through splitmix64. A stream is named by
 * (seed, a, b), e.g. (user seed, configuration index, sequence index), so results never depend on
 * which thread ran a configuration. engine/reference/rng.py repeats these functions bit for bit;
 * tests/data/rng_known_answers.json holds vectors of the published reference implementations.
 */
#include <math.h>

#include "ms_internal.h"

uint64_t ms_splitmix64_next(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

void ms_rng_init(ms_rng_t *rng, uint64_t seed, uint64_t a, uint64_t b)
{
    uint64_t x = seed;
    x = ms_splitmix64_next(&x) ^ a;
    x = ms_splitmix64_next(&x) ^ b;
    for (int i = 0; i < 4; i++) rng->s[i] = ms_splitmix64_next(&x);
}

/* the step and the uniform are ms_internal.h's inline ones, so that the sampler's loops inline them */
uint64_t ms_rng_next(ms_rng_t *rng) { return ms_rng_next_inline(rng); }

double ms_rng_uniform(ms_rng_t *rng) { return ms_rng_uniform_inline(rng); }

double ms_rng_gumbel(ms_rng_t *rng)
{
    return -log(-log(ms_rng_uniform(rng)));
}

double ms_rng_normal(ms_rng_t *rng)
{
    /* Box-Muller, one variate per call (no cached pair: keeps the stream stateless to replicate) */
    double u1 = ms_rng_uniform(rng);
    double u2 = ms_rng_uniform(rng);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

double ms_rng_gamma(ms_rng_t *rng, double shape)
{
    /* Marsaglia & Tsang (2000); shape < 1 boosted by U^(1/shape). */
    double boost = 1.0, d, c;
    if (shape < 1.0) {
        boost = pow(ms_rng_uniform(rng), 1.0 / shape);
        shape += 1.0;
    }
    d = shape - 1.0 / 3.0;
    c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = ms_rng_normal(rng), v = 1.0 + c * x, u;
        if (v <= 0.0) continue;
        v = v * v * v;
        u = ms_rng_uniform(rng);
        if (u < 1.0 - 0.0331 * x * x * x * x) return d * v * boost;
        if (log(u) < 0.5 * x * x + d * (1.0 - v + log(v))) return d * v * boost;
    }
}
