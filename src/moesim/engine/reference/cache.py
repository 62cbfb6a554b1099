"""Pure-Python twin of ``csrc/ms_cache.c``: the expert caches (LRU, LFU, static, Belady)."""
from __future__ import annotations

from ..codes import POLICY_BELADY, POLICY_LFU, POLICY_STATIC


class Cache:
    """One per-layer expert cache (LRU, LFU, static pinning, Belady)."""

    def __init__(self, n_experts, capacity, policy, hot):
        self.capacity = min(capacity, n_experts)
        self.policy = policy
        self.slots = []              # expert per slot, in slot order
        self.freq = [0.0] * n_experts
        self.last = [-1.0] * n_experts
        self.next_use = [0.0] * n_experts
        if policy == POLICY_STATIC:
            self.slots = [int(e) for e in hot[:self.capacity]]
        self.resident = set(self.slots)
        self.need = set()

    def begin_step(self, sel):
        """The step's experts are evicted only when nothing else can be."""
        self.need = set(sel)

    def access(self, e, tick, next_use):
        hit = e in self.resident
        self.need.discard(e)
        self.freq[e] += 1.0
        self.last[e] = tick
        self.next_use[e] = next_use
        if hit or self.policy == POLICY_STATIC or self.capacity == 0:
            return hit
        if len(self.slots) < self.capacity:
            self.slots.append(e)
        else:
            candidates = [i for i, x in enumerate(self.slots) if x not in self.need] or range(len(self.slots))
            best = None
            for i in candidates:
                if best is None:
                    best = i
                    continue
                a, b = self.slots[i], self.slots[best]
                if self.policy == POLICY_LFU:
                    if self.freq[a] < self.freq[b] or (self.freq[a] == self.freq[b] and self.last[a] < self.last[b]):
                        best = i
                elif self.policy == POLICY_BELADY:
                    if self.next_use[a] > self.next_use[b]:
                        best = i
                elif self.last[a] < self.last[b]:
                    best = i
            self.resident.discard(self.slots[best])
            self.slots[best] = e
        self.resident.add(e)
        return False


def next_use(sel, n_steps, n_layers, width):
    """nu[t][l][j]: position (t' x width + j') of the next use of sel[t][l][j] in layer l (n_steps x width if never)."""
    nu = [[None] * n_layers for _ in range(n_steps)]
    for l in range(n_layers):
        last = {}
        for t in range(n_steps - 1, -1, -1):
            nu[t][l] = [last.get(e, n_steps * width) for e in sel[t][l]]
            for j, e in enumerate(sel[t][l]):
                last[e] = t * width + j
    return nu
