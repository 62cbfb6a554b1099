"""Pure-Python twin of ``csrc/ms_rng.c``: xoshiro256** streams seeded through splitmix64."""
from __future__ import annotations

import math


M64 = (1 << 64) - 1


class Rng:
    """xoshiro256** seeded through splitmix64 from (seed, a, b)."""

    def __init__(self, seed, a, b):
        x = seed & M64
        x, z = self._sm(x)
        x = z ^ (a & M64)
        x, z = self._sm(x)
        x = z ^ (b & M64)
        s = []
        for _ in range(4):
            x, z = self._sm(x)
            s.append(z)
        self.s = s

    @staticmethod
    def _sm(x):
        x = (x + 0x9E3779B97F4A7C15) & M64
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return x, z ^ (z >> 31)

    def next(self):
        s = self.s
        rotl = lambda v, k: ((v << k) | (v >> (64 - k))) & M64  # noqa: E731
        result = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result

    def uniform(self):
        return ((self.next() >> 11) + 0.5) * (1.0 / 9007199254740992.0)

    def gumbel(self):
        return -math.log(-math.log(self.uniform()))

    def normal(self):
        u1 = self.uniform()
        u2 = self.uniform()
        return math.sqrt(-2.0 * math.log(u1)) * math.cos(6.283185307179586 * u2)

    def gamma(self, shape):
        boost = 1.0
        if shape < 1.0:
            boost = math.pow(self.uniform(), 1.0 / shape)
            shape += 1.0
        d = shape - 1.0 / 3.0
        c = 1.0 / math.sqrt(9.0 * d)
        while True:
            x = self.normal()
            v = 1.0 + c * x
            if v <= 0.0:
                continue
            v = v * v * v
            u = self.uniform()
            if u < 1.0 - 0.0331 * x * x * x * x:
                return d * v * boost
            if math.log(u) < 0.5 * x * x + d * (1.0 - v + math.log(v)):
                return d * v * boost
