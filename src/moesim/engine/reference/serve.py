"""Pure-Python twin of ``csrc/ms_serve.c``: the continuous-batching scheduler, line for line.

Same arithmetic in the same order (IEEE doubles both sides), so the event times are bit-identical to
the C core's for the same step table, configuration and random stream (tests/test_serve.py).
"""
from __future__ import annotations

import math

from ..codes import ERR_BAD_SERVE, ERR_KV_TOO_SMALL
from .rng import Rng


def interp(gx, gy, v, x: float, y: float) -> float:
    """Bilinear interpolation in the table v[i][j] over grids gx, gy, clamped at the edges."""
    nx, ny = len(gx), len(gy)
    i = j = 0
    fx = fy = 0.0
    if nx > 1:
        while i + 2 < nx and x >= gx[i + 1]:
            i += 1
        fx = min(1.0, max(0.0, (x - gx[i]) / (gx[i + 1] - gx[i])))
    if ny > 1:
        while j + 2 < ny and y >= gy[j + 1]:
            j += 1
        fy = min(1.0, max(0.0, (y - gy[j]) / (gy[j + 1] - gy[j])))
    a = v[i][j]
    b = v[i][j + 1] if ny > 1 else a
    a = a + (b - a) * fy
    if nx > 1:
        c = v[i + 1][j]
        d = v[i + 1][j + 1] if ny > 1 else c
        c = c + (d - c) * fy
        a = a + (c - a) * fx
    return a


class _Scheduler:
    """The scheduler's state and steps (the C static functions, as methods)."""

    def __init__(self, table: dict, cfg: dict, rng: Rng):
        self.t, self.c = table, cfg
        n = self.n = cfg["n_requests"]
        self.computed, self.generated, self.held, self.hit = [0] * n, [0] * n, [0] * n, [0] * n
        self.running, self.waiting = [], []
        self.free = cfg["n_blocks"]
        self.done = self.cache_ready = 0
        self.arrival, self.first, self.finish_s = [-1.0] * n, [-1.0] * n, [-1.0] * n
        self.preemptions = [0] * n
        self.steps = self.preempted = self.max_running = self.peak_blocks = 0
        self.busy_s = 0.0
        if cfg["closed_loop"]:
            self.issued = min(cfg["concurrency"], n)
            for k in range(self.issued):
                self.arrival[k] = 0.0
        else:
            t = 0.0
            for k in range(n):
                t += -math.log(rng.uniform()) / cfg["rate"]
                self.arrival[k] = t
            self.issued = n

    def hit_blocks(self) -> int:
        c = self.c
        return min(c["prefix_blocks"], (c["isl"] - 1) // c["block_size"])

    def blocks_for(self, tokens: int) -> int:
        return (tokens + self.c["block_size"] - 1) // self.c["block_size"]

    def preempt(self) -> None:
        v = self.running.pop()
        self.free += self.held[v] + self.c["state_blocks"]
        self.held[v] = self.computed[v] = self.hit[v] = 0
        self.preemptions[v] += 1
        self.preempted += 1
        self.waiting.insert(0, v)

    def schedule_running(self, sched: list) -> tuple:
        c = self.c
        budget, r, preempted = c["max_num_batched_tokens"], 0, False
        while r < len(self.running) and budget > 0:
            q = self.running[r]
            take = min(c["isl"] + self.generated[q] - self.computed[q], budget)
            extra = self.blocks_for(self.computed[q] + take) - self.hit[q] * self.hit_blocks() - self.held[q]
            self_out = False
            while extra > self.free:
                self_out = self.running[-1] == q
                self.preempt()
                preempted = True
                if self_out:
                    break
            if self_out:
                break
            if extra > 0:
                self.held[q] += extra
                self.free -= extra
            sched.append((q, take))
            budget -= take
            r += 1
        return c["max_num_batched_tokens"] - budget, preempted

    def admit(self, budget: int, sched: list) -> None:
        c = self.c
        while self.waiting and budget > 0 and len(self.running) < c["max_num_seqs"]:
            q, hit = self.waiting[0], self.cache_ready
            start = hit * self.hit_blocks() * c["block_size"]
            take = min(c["isl"] + self.generated[q] - start, budget)
            need = self.blocks_for(start + take) - hit * self.hit_blocks()
            if need + c["state_blocks"] > self.free:
                break
            self.waiting.pop(0)
            self.free -= need + c["state_blocks"]
            self.held[q], self.hit[q], self.computed[q] = need, hit, start
            self.running.append(q)
            sched.append((q, take))
            budget -= take

    def step_seconds(self, sched: list) -> float:
        t = self.t
        n_dec = ctx = pf = depth = t_dec = t_pf = 0.0
        for q, take in sched:
            if take == 1 and self.generated[q] > 0 and self.computed[q] > 0:
                n_dec += 1.0
                ctx += float(self.computed[q] + 1)
            else:
                pf += float(take)
                depth += float(take) * float(self.computed[q])
        if n_dec > 0.0:
            t_dec = interp(t["grid_b"], t["grid_c"], t["decode_s"], n_dec, ctx / n_dec)
        if pf > 0.0:
            t_pf = interp(t["grid_p"], t["grid_d"], t["prefill_s"], pf, depth / pf)
        if n_dec > 0.0 and pf > 0.0:
            shared = min(t["forward_s"], t_dec)
            shared = min(shared, t_pf)
            return t_dec + t_pf - shared
        return t_dec + t_pf

    def finish(self, q: int, now: float) -> None:
        c = self.c
        self.running.remove(q)
        self.free += self.held[q] + c["state_blocks"]
        self.held[q] = 0
        self.finish_s[q] = now
        self.done += 1
        if c["closed_loop"] and self.issued < self.n:
            self.arrival[self.issued] = now
            self.issued += 1

    def advance(self, sched: list, now: float) -> None:
        c = self.c
        cached_tokens = self.hit_blocks() * c["block_size"]
        for q, take in sched:
            self.computed[q] += take
            if (not self.cache_ready and cached_tokens > 0 and self.computed[q] >= cached_tokens and not self.hit[q]
                    and self.free >= c["snapshot_blocks"]):
                self.cache_ready, self.hit[q] = 1, 1
                self.held[q] -= self.hit_blocks()
                self.free -= c["snapshot_blocks"]
            if self.computed[q] == c["isl"] + self.generated[q]:
                self.generated[q] += 1
                if self.generated[q] == 1:
                    self.first[q] = now
                if self.generated[q] == c["osl"]:
                    self.finish(q, now)

    def outputs(self) -> dict:
        return dict(arrival_s=self.arrival, first_token_s=self.first, finish_s=self.finish_s,
                    preemptions=self.preemptions, steps=self.steps, preempted=self.preempted,
                    max_running=self.max_running, peak_blocks=self.peak_blocks, busy_s=self.busy_s)


def serve(table: dict, cfg: dict, seed: int = 0, stream: int = 0) -> tuple:
    """(code, outputs) as ``_kernel.serve``: 0 or an ``ERR_*`` code, and the per-request columns.
    The inputs are taken as checked (the glue's checks run before either side)."""
    s = _Scheduler(table, cfg, Rng(seed, stream, 0))
    now, nxt, loops = 0.0, 0, 0
    while s.done < s.n:
        while nxt < s.issued and s.arrival[nxt] <= now:
            s.waiting.append(nxt)
            nxt += 1
        if not s.running and not s.waiting:
            if nxt >= s.issued:
                return ERR_BAD_SERVE, None
            now = s.arrival[nxt]
            continue
        loops += 1
        if s.steps >= cfg["max_steps"] or loops > 2 * cfg["max_steps"]:
            return ERR_BAD_SERVE, None
        sched = []
        used, preempted = s.schedule_running(sched)
        if not preempted:
            s.admit(cfg["max_num_batched_tokens"] - used, sched)
        if not sched and not preempted:
            return ERR_KV_TOO_SMALL, None
        if not sched:
            continue
        s.max_running = max(s.max_running, len(s.running))
        s.peak_blocks = max(s.peak_blocks, cfg["n_blocks"] - s.free)
        dt = s.step_seconds(sched)
        now += dt
        s.busy_s += dt
        s.steps += 1
        s.advance(sched, now)
    return 0, s.outputs()
