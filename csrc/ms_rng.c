/*
 * Random streams: xoshiro256** (Blackman & Vigna) seeded through splitmix64. A stream is named by
 * (seed, a, b), e.g. (user seed, configuration index, sequence index), so results never depend on
 * which thread ran a configuration. engine/reference/rng.py repeats these functions bit for bit;
 * tests/data/rng_known_answers.json holds vectors of the published reference implementations.
 */
#include <math.h>

#include "moesim.h"

uint64_t ms_splitmix64_next(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void ms_rng_init(ms_rng_t *rng, uint64_t seed, uint64_t a, uint64_t b)
{
    uint64_t x = seed;
    x = ms_splitmix64_next(&x) ^ a;
    x = ms_splitmix64_next(&x) ^ b;
    for (int i = 0; i < 4; i++) rng->s[i] = ms_splitmix64_next(&x);
}

uint64_t ms_rng_next(ms_rng_t *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double ms_rng_uniform(ms_rng_t *rng)
{
    /* 53 random bits, offset by half a step: strictly inside (0, 1), so logs stay finite */
    return ((double) (ms_rng_next(rng) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

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
