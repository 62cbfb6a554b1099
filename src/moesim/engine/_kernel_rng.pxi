# Random streams of the kernel (csrc/ms_rng.c), exposed for known-answer tests; included by _kernel.pyx.


def rng_outputs(state, int64_t n):
    """The first n outputs of the kernel's xoshiro256** from the raw 4-word state (known-answer tests)."""
    cdef ms_rng_t rng
    cdef int64_t i
    words = [int(w) & 0xFFFFFFFFFFFFFFFF for w in state]
    if len(words) != 4 or n < 0:
        raise ValueError("rng_outputs needs a 4-word state and n >= 0")
    for i in range(4):
        rng.s[i] = words[i]
    out = np.empty(n, dtype=np.uint64)
    cdef uint64_t[::1] v = out
    for i in range(n):
        v[i] = ms_rng_next(&rng)
    return out


def splitmix64_outputs(uint64_t seed, int64_t n):
    """The first n outputs of the kernel's splitmix64 started at *seed* (known-answer tests)."""
    cdef uint64_t x = seed
    cdef int64_t i
    out = np.empty(max(n, 0), dtype=np.uint64)
    cdef uint64_t[::1] v = out
    for i in range(max(n, 0)):
        v[i] = ms_splitmix64_next(&x)
    return out


def rng_stream(uint64_t seed, uint64_t a, uint64_t b, int64_t n):
    """(outputs, uniforms) of the stream named (seed, a, b), n of each from two fresh streams."""
    cdef ms_rng_t rng
    cdef int64_t i
    raw = np.empty(max(n, 0), dtype=np.uint64)
    uni = np.empty(max(n, 0), dtype=np.float64)
    cdef uint64_t[::1] vr = raw
    cdef double[::1] vu = uni
    ms_rng_init(&rng, seed, a, b)
    for i in range(max(n, 0)):
        vr[i] = ms_rng_next(&rng)
    ms_rng_init(&rng, seed, a, b)
    for i in range(max(n, 0)):
        vu[i] = ms_rng_uniform(&rng)
    return raw, uni
