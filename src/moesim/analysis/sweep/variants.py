"""A group's decode variants: one per (placement candidate, host page-cache slots, batch), keyed
``(j * (E + 2) + page_slots) * n_batches + batch_index``.

An analytic variant is the analytic kernel's step at its batch with the attention over the cache zeroed plus,
per attention kind, that attention's cache reads and scores, the terms whose time depends on context
(``ms_sweep_kind_t``), evaluated per configuration in C. That split is exact only while no layer prefetches
(:func:`check_separable`). A Monte Carlo variant is a lowered decode model the kernel runs per configuration.

Variants are lowered on demand. The table the kernels read is an immutable :class:`VariantTable`
snapshot: growth happens under a lock and builds a new table, swapped in with one assignment, so a
thread that resolved its rows against one table evaluates them with that same table while others grow
the group."""
from __future__ import annotations

import threading
import weakref
from collections import Counter
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from ...engine import _kernel
from ...engine.decode import prepare, run_prepared
from ...engine.glue import seal
from ...engine.lower.decode_model import attention_key, kv_copies_of, lower_model, op_offload_threshold
from ...engine.lower.machine import lower_machine, placement_key
from ...engine.prefill import kernel_seconds_many, prefill_terms, rate_ttft
from ...errors import KernelError
from ...spec.placement import Placement
from .kept import kept, routing_key
from .che import (columns as che_columns, fingerprint as che_fingerprint, page_slots_of, sealed_routing,
                  slots_of as che_slots_of)


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


@dataclass(frozen=True)
class VariantTable:
    """One consistent state of a group's decode variants: the sorted keys, the kernel's input tables
    (variant rows in key order; read-only) and the ``_kernel.SweepDecode`` built from them."""

    keys: np.ndarray
    tables: "MappingProxyType | None"
    dec: object

    def __len__(self) -> int:
        return len(self.keys)


EMPTY = VariantTable(_frozen(np.zeros(0, dtype=np.int64)), None, None)


def check_separable(routing: dict) -> None:
    """Refuse analytic variants where step time does not split into (attention zeroed) + attention.

    ms_decode.c's step_time raises layer l-1's time to the copy time of layer l's prefetched experts
    (``max(copy, layer time)``), which couples attention time to expert copies: with prefetch on the
    zeroed step plus the attention terms is not the step. Prefetch happens exactly where the routing
    recall is positive, so every layer's recall must be 0."""
    recall = np.asarray(routing.get("recall", ()), dtype=np.float64)
    if recall.size and np.any(recall != 0.0):
        layers = np.flatnonzero(recall != 0.0)
        raise KernelError("sweep: analytic decode variants need prefetch off (step time = step with attention "
                          f"zeroed + attention terms holds only then); routing recall > 0 in layers "
                          f"{layers[:8].tolist()}")


def _frozen_tables(d: dict) -> MappingProxyType:
    """A lowered table several groups share, read-only: its arrays as read-only views (the arrays
    themselves, which may be a lowering cache's, keep their flags) in a read-only mapping."""
    return MappingProxyType({k: _frozen(v.view()) if isinstance(v, np.ndarray) else v for k, v in d.items()})


def kind_row(n: int, on_gpu: bool, fn: int, hw: dict, kv_copies: float = 1.0) -> tuple:
    """Precomputed decode coefficients of one attention kind's attention over the cache (ms_sweep_kind_t;
    kv_copies: the GPUs' KV read factor, lower_model's)."""
    bw = hw["gpu_bw"] if on_gpu else hw["host_bw"]
    # the scores at the CPU's attention-kernel rate (ms_machine_t.cpu_attn_flops)
    f64 = [float(n), kv_copies / bw, 1.0 / (hw["gpu_flops"] if on_gpu else hw["cpu_attn_flops"])]
    return f64, [0, 1, fn] if on_gpu else [2, 3, fn]


def _kind_block(kinds: tuple, hw: dict) -> tuple:
    """(f64 [k, 3], i32 [k, 3]): the :func:`kind_row` rows of ``kinds`` ((attention kind, layers) pairs) on machine
    rates ``hw`` as the kernel's arrays (read-only), which a group's table concatenates."""
    rows = [kind_row(n, on, int(fn), hw, copies) for (on, fn, copies), n in kinds]
    return (_frozen(np.array([r[0] for r in rows], dtype=np.float64).reshape(-1, 3)),
            _frozen(np.array([r[1] for r in rows], dtype=np.int32).reshape(-1, 3)))


def _zeroed(dm: dict, plan=None) -> dict:
    """The decode model with its attention over the cache zeroed (the cache reads and scores; with a plan: its one
    read-only zero column per size). The weight GEMVs stay: the kernel times them at the variant's batch."""
    z = dict(dm)
    for k in ("kv_bytes", "score_flops"):
        shape = np.shape(dm[k])
        z[k] = np.zeros(shape) if plan is None else plan.shared(("zeros", shape), lambda: _frozen(np.zeros(shape)))
    return z


def _decode_cols(batches: tuple, policy: int, run_cfg: dict, che_cols: dict | None = None, drafts: int = 0,
                 accepted: float = 1.0) -> dict:
    """Analytic decode configurations at these batches in the kernel's own column dtypes
    (ms_decode_config_t), checked once and sealed (engine.glue.seal): a plan's groups share them.
    ``che_cols``: their analytic table columns (sweep.che.columns), if any; ``drafts``: MTP draft tokens per
    step (1 + drafts tokens per sequence verified), ``accepted`` tokens per sequence per step."""
    n = len(batches)
    cols = dict(batch=np.array(batches, dtype=np.int32), tokens_per_step=np.full(n, 1 + drafts, dtype=np.int32),
                drafts=np.full(n, drafts, dtype=np.int32), accepted=np.full(n, float(accepted)),
                steps=np.full(n, run_cfg["tokens"], dtype=np.int64),
                warmup=np.full(n, run_cfg["warmup"], dtype=np.int64), policy=np.full(n, policy, dtype=np.int32),
                mode=np.ones(n, dtype=np.int32), seed=np.full(n, int(run_cfg["seed"]) & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64),
                index=np.zeros(n, dtype=np.uint64), **(che_cols or {}))
    return seal("ms_decode_config_t[]", cols)


def _kept_cols(key: tuple, build) -> "object":
    """Sealed decode columns kept for the process by everything they hold (policy, batches, the run's steps,
    warmup and seed, and the analytic tables' routing digest, GPU and page slots), as sweep.che keeps the
    table rows they are made of: a later sweep's groups reuse them instead of stacking and sealing again."""
    hit = _COLS.get(key)
    if hit is None:
        hit = build()
        size = sum(v.nbytes for v in hit.values() if isinstance(v, np.ndarray))
        if _cols_bytes[0] + size > _MAX_COLS_BYTES:         # bounded like sweep.che's rows
            _COLS.clear()
            _cols_bytes[0] = 0
        _cols_bytes[0] += size
        hit = _COLS.setdefault(key, hit)
    return hit


_COLS: dict = {}
_MAX_COLS_BYTES = 32 << 20
_cols_bytes = [0]


def sealed_decode_cols(plan, routing: dict, dm: dict, policy: int, batches: tuple, drafts: int = 0,
                       accepted: float = 1.0, slots: "tuple | None" = None):
    """:func:`_decode_cols` of a lowered model ``dm`` at these batches, with the analytic tables' columns its
    step counts, GPU and page-cache hit rates read (sweep.che), sealed once and kept by the plan and the
    process (:func:`_kept_cols`) under everything they hold. ``slots``: (sweep.che.slots_of, page_slots_of) of
    ``dm``, when the caller keeps them."""
    run_cfg = plan.run
    s, pps = _slots(plan, dm, policy, routing) if slots is None else slots
    ckey = () if s < 0 and pps < 0 else (che_fingerprint(plan, routing), s, pps)
    key = ("decode_cols", policy, batches, run_cfg["tokens"], run_cfg["warmup"], int(run_cfg["seed"]), drafts,
           float(accepted)) + ckey
    return plan.shared(key, lambda: _kept_cols(key, lambda: _decode_cols(
        batches, policy, run_cfg, che_columns(plan, routing, dm, policy, batches, 1 + drafts), drafts, accepted)))


def _slots(plan, dm, policy: int, routing: dict) -> tuple:
    """(sweep.che.slots_of, page_slots_of) of lowered model ``dm``, once per plan for each model, policy and routing
    object (the entry holds both, so their ids stay theirs): a whole-step group (.direct) asks at every group."""
    key = ("slots", id(dm), policy, id(routing))
    hit = plan._shared.get(key)
    if hit is None or hit[0] is not dm or hit[1] is not routing:
        hit = plan._shared[key] = (dm, routing, (che_slots_of(dm, policy, routing), page_slots_of(dm, routing)))
    return hit[2]


def _sealed_machine(g, p: Placement) -> tuple:
    """(sealed machine rates of group g's machine under placement p, the same prepared for the decode kernel)."""
    hw = seal("ms_machine_t", lower_machine(g.machine, g.rt, p, g.kernel_mix))
    return hw, prepare(hw=hw)


def _prepared_routing(plan, rt: dict):
    """The group routing's sealed table prepared for the decode kernel (engine.decode.prepare), once per plan."""
    key = ("prepared_routing", id(rt))
    hit = plan._shared.get(key)
    if hit is None or hit[0] is not rt:
        hit = plan.shared(key, lambda: (rt, prepare(rt=sealed_routing(plan, rt))))
    return hit[1]


class DecodeVariants:
    """The growing set of a group's decode variants and their current :class:`VariantTable`."""

    def __init__(self, group, analytic: bool = False):
        # a weak reference: the group holds this object, and a cycle would keep every group the plan's
        # cache evicts alive until a full collection (whose cost grows with them: issue 19's wide grids)
        self._group = weakref.ref(group)
        # analytic: a Monte Carlo sweep's analytic shadow of the group (.workloads)
        self.mc = group.plan.mode == "montecarlo" and not analytic
        # the group read its routing's prefetch once (Group.prefetch: any recall above 0, check_separable's test); a
        # group without it is separable
        if not self.mc and not group.direct and getattr(group, "prefetch", True):
            check_separable(group.routing)
        self._lock = threading.Lock()
        self._known: set = set()        # the keys lowered so far (the table holds their rows)
        self._kind_rows: list = []      # (f64 [k, 5], i32 [k, 3]) blocks of ms_sweep_kind_t rows
        self._n_kind_rows = 0
        self._mc_models: list = []
        self._mc_machines: list = []
        self._cand: dict = {}           # (candidate, lowering key) -> _candidate's
        self._lks: dict = {}            # (candidate, batch) -> lowering_key
        self._threshold = None          # op_offload_threshold of the group's runtime and model
        self._hw: dict = {}             # placement_key -> sealed machine rates
        self._kinds: dict = {}
        self._prefill: dict = {}
        self.table = EMPTY

    @property
    def group(self):
        return self._group()

    def decode_key(self, key: int) -> tuple:
        n_b = self.group.plan.n_b
        rest, bi = divmod(int(key), n_b)
        j, ps = divmod(rest, self.group.E + 2)
        return j, ps, bi

    # ---------------------------------------------------------------- reading
    def resolve(self, keys: np.ndarray, variant: np.ndarray) -> VariantTable:
        """Fill ``variant`` with each key's row index, lowering unknown keys first; returns the table
        those indices refer to (evaluate with its ``dec``, not with a later table)."""
        table = self.table
        # a new group's keys are all unknown, and the lookup returns them nearly distinct (C's direct-mapped cache of
        # the keys seen), which add's Python set then need not see row by row
        for _ in range(1000):
            unknown, missing = _kernel.sweep_lookup(keys, table.keys, variant)
            if unknown == 0:
                return table
            table = self.add(missing)
        raise KernelError("sweep: variant lookup did not converge")

    # ---------------------------------------------------------------- growing
    def add(self, keys) -> VariantTable:
        """Lower the variants of these keys (one analytic kernel run per placement and page-cache size)
        and swap in a table holding them; returns that table."""
        with self._lock:
            new = sorted(set(np.asarray(keys, dtype=np.int64).tolist()) - self._known)
            if new:
                self.table = self._build(*self._lower(new))
                self._known.update(new)
            return self.table

    def _lower(self, new: list) -> tuple:
        """(keys, f64 [n, 13], i32 [n, 3]): the ms_sweep_variant_t rows of keys ``new``, in an order of their own."""
        g = self.group                  # once: the helpers take it rather than dereference the weak reference
        todo: dict = {}
        n_b, n_ps, n_cands, lks = g.plan.n_b, g.E + 2, len(g.cands), self._lks
        batches = g.plan.batch_list
        for key in new:
            rest, bi = divmod(key, n_b)             # decode_key's, inline
            j, ps = divmod(rest, n_ps)
            if not (0 <= j < n_cands) or not (0 <= bi < n_b):
                raise KernelError(f"sweep: bad variant key {key}")
            b = batches[bi]
            lk = lks.get((j, b))
            if lk is None:
                lk = lks[(j, b)] = self.lowering_key(j, b)
            todo.setdefault((j, lk, ps), []).append((key, b))
        jobs: list = []
        pending: dict = {}              # prefill times not known yet: computed in one kernel call below
        staged = [self._lower_rows(g, j, lk, ps, items, jobs, pending) for (j, lk, ps), items in todo.items()]
        if pending:
            times = self._prefill_times(g, pending)
            staged = [(st[0], times[st[1]]) + st[2:] if type(st[1]) is tuple else st for st in staged]
        # every analytic variant of the group in one kernel call (the routing filled once for them all)
        f64 = run_prepared(_prepared_routing(g.plan, g.routing), jobs) if jobs else None
        counts = [len(st[0]) for st in staged]
        if f64 is None:                 # Monte Carlo templates: no analytic step
            f64 = np.zeros((sum(counts), 13))
            f64[:, 9] = 1.0
            f64[:, 11] = -1.0
        f64[:, 10] = 1e3 / f64[:, 9]
        # each unit's prefill time and (kind0, n_kinds, mc) on each of its rows, as lists (a few rows: np.repeat's
        # list conversion cost more than the rows)
        f64[:, 12] = [st[1] for st in staged for _ in st[0]]
        i32 = np.array([st[2:] for st in staged for _ in st[0]], dtype=np.int32).reshape(-1, 3)
        return [key for st in staged for key, _ in st[0]], f64, i32

    def _lower_rows(self, g, j: int, lk: tuple, ps: int, items: list, jobs: list, pending: dict) -> tuple:
        """What the variant rows of candidate j at page-cache size ps for (key, batch) items sharing one lowered
        model (lowering key lk, :meth:`_candidate`) hold besides their decode: (items, prefill seconds, first kind
        row, kinds, Monte Carlo template or -1); an analytic group's decode job (zeroed model, machine, columns)
        is appended to ``jobs``, and a prefill time not known yet to ``pending`` (its key in the prefill seconds'
        place: :meth:`_prefill_time`)."""
        dm0, terms = self._candidate(g, j, lk, items[0][1])
        hw, chw = self._machine(g, j)
        pf0 = self._prefill_time(g, j, lk, dm0, terms, hw, pending)
        kind0, nk = self._kind_slice(g, j, dm0, hw)
        mc_index = -1
        if self.mc:
            mc_index = len(self._mc_models)
            # ms_sweep.c mc_one scales each layer's context KV bytes by the template's kv_bytes: the KV copies
            dm = dict(self._paged(g, dm0, ps), kv_bytes=self._kv_copies(g, j))
            self._mc_models.append(dm)
            self._mc_machines.append(hw)
        else:
            batches = tuple(b for _, b in items)
            run_cfg = g.plan.run
            # the job but its machine rates reads the lowered model, page slots, policy, routing, batches and the
            # run's steps, warmup and seed: kept (.kept) for every machine, group and sweep that runs the same, and
            # found by the plan's groups under the ids the plan holds (no routing key to build per group)
            zdm, cols = g.plan.shared(("job", id(dm0), ps, g.policy, id(g.routing), batches), lambda: kept(
                ("job", id(dm0), ps, g.policy, routing_key(g.plan, g.routing), batches, run_cfg["tokens"],
                 run_cfg["warmup"], int(run_cfg["seed"])), lambda: self._job(g, dm0, ps, batches), dm0, g.routing))
            jobs.append((zdm, chw, cols))
        return items, pf0, kind0, nk, mc_index

    @staticmethod
    def _paged(g, dm0: dict, ps: int) -> dict:
        """Lowered model ``dm0`` at ps page slots, kept (.kept) for every machine and batch set that runs it."""
        return kept(("paged", id(dm0), ps),
                    lambda: dict(dm0, page_slots=_frozen(np.full(g.m.n_layers, ps, dtype=np.int32))), dm0)

    def _job(self, g, dm0: dict, ps: int, batches: tuple) -> tuple:
        """(zeroed model, decode columns) of an analytic decode job of ``dm0`` at ps page slots, prepared for the
        kernel (engine.decode.prepare)."""
        dm = self._paged(g, dm0, ps)
        # the slot counts the analytic tables are read at: the lowered model's, the same for every batch set
        slots = che_slots_of(dm, g.policy, g.routing), page_slots_of(dm, g.routing)
        cols = sealed_decode_cols(g.plan, g.routing, dm, g.policy, batches, slots=slots)
        # the zeroed model checked once (engine.glue.seal), kept for every machine that runs it
        zdm = kept(("zeroed", id(dm0), ps), lambda: prepare(dm=seal("ms_decode_model_t", _zeroed(dm, g.plan))), dm0)
        return zdm, prepare(cols=cols)

    @staticmethod
    def _kv_copies(g, j: int) -> np.ndarray:
        """Per layer, the KV read factor of group g's candidate j's multi-GPU layout (lower_model's)."""
        p = g.cands[j]
        # kv_copies_of reads the machine only through its GPU count: shared by the plan's machines alike in it
        return kept(("kv_copies", id(g.m), g.machine.n_gpus, id(g.rt), attention_key(p)),
                    lambda: _frozen(np.array(kv_copies_of(g.m, p, g.machine, g.rt), dtype=np.float64)), g.m, g.rt)

    def _op_offload(self, p: Placement, tokens_per_step: int) -> bool:
        """decode.lower_model's choice to copy CPU experts to the GPU at this step size (the one thing
        about a placement's lowered model that depends on the batch)."""
        g = self.group
        cpu_only = p.kind == "cpu-only" or g.machine.n_gpus == 0
        if cpu_only:
            return False
        if self._threshold is None:     # the group's runtime and model: once per group
            self._threshold = op_offload_threshold(g.rt, g.m)
        return tokens_per_step >= self._threshold

    def lowering_key(self, j: int, tokens: int) -> tuple:
        """What candidate j's lowered model depends on at ``tokens`` per step besides j: the op-offload
        choice, and under expert parallelism the tokens themselves (the busiest EP rank's load,
        engine.lower.parallel.layer_loads, grows with the tokens per step)."""
        g = self.group
        return self._op_offload(g.cands[j], tokens), tokens if g.rt.decode.expert_parallel > 1 else -1

    def _candidate(self, g, j: int, lk: tuple, b: int) -> tuple:
        """(decode model, prefill terms) of candidate j at batch b, whose :meth:`lowering_key` is lk: what reads
        no machine rate, one entry of the plan (plan.shared) under the ids of the objects it reads, which the plan
        holds, so each of its groups finds both with one look-up instead of building the process store's (.kept)
        keys of each again."""
        hit = self._cand.get((j, lk))
        if hit is None:
            # lower_model reads the machine only through its GPU count and the routing only under expert
            # parallelism (where lk holds the tokens); the routing's id keeps the prefill terms, which read it
            key = ("candidate", id(g.low), id(g.rt), g.machine.n_gpus, id(g.cands), j, lk, id(g.routing), g.prompt)
            hit = self._cand[(j, lk)] = g.plan.shared(key, lambda: self._lower_candidate(g, j, lk, b))
        return hit

    def _lower_candidate(self, g, j: int, lk: tuple, b: int) -> tuple:
        """:meth:`_candidate`'s two, each kept for the process (.kept) under what it reads."""
        p = g.cands[j]
        # the groups that differ only in the machine's other properties, the policy or the prefetch recall share
        # the lowered model, kept read-only (by later sweeps too; g.low is the (model, quant, KV dtype)'s
        # lowering, one object per process)
        routing = g.routing if g.rt.decode.expert_parallel > 1 else None
        key = ("dm", id(g.m), id(g.low), g.kv, id(g.rt), g.machine.n_gpus, p, lk,
               None if routing is None else routing_key(g.plan, routing))
        dm = kept(key, lambda: _frozen_tables(
            lower_model(g.m, g.low, p, g.machine, g.rt, 1, g.kv, b, routing=g.routing)), g.m, g.low, g.rt, routing)
        # what prefill reads besides the machine rates (prefill reads neither the page slots nor the swept
        # context: the prompt is prefilled from an empty cache), shared by the machines that share the lowered model
        prompt = g.prompt
        terms = kept(("prefill_terms", id(dm), routing_key(g.plan, g.routing), id(g.rt), prompt),
                     lambda: prefill_terms(g.m, dm, g.routing, g.rt, prompt), dm, g.routing, g.rt)
        return dm, terms

    def _machine(self, g, j: int) -> tuple:
        """Candidate j's machine rates and the same prepared for the decode kernel (engine.decode.prepare): the
        machine's under one runtime, kind of placement and kernel mix, shared by the groups (.kept) and, in the
        group, by the candidates of one kind (placement_key)."""
        p = g.cands[j]
        pk = placement_key(p)
        hw = self._hw.get(pk)
        if hw is None:
            hw = self._hw[pk] = kept(("hw", id(g.machine), id(g.rt), pk, g.kernel_mix),
                                     lambda: _sealed_machine(g, p), g.machine, g.rt)
        return hw

    def _prefill_time(self, g, j: int, lk: tuple, dm, terms: dict, hw, pending: dict):
        """Seconds to prefill the prompt on candidate j's lowered model ``dm`` (its prefill ``terms``,
        :meth:`_candidate`'s) and machine rates ``hw``. Keyed by those objects, the routing and the runtime,
        so the plan's groups that share them (groups that differ only in the policy) share the time. One the plan
        does not know yet is left to :meth:`_prefill_times` (``pending`` under its key, which is returned)."""
        pf = self._prefill.get((j, lk))
        if pf is None:
            key = ("prefill", id(dm), id(hw), id(g.routing), id(g.rt), g.prompt)
            pf = g.plan._shared.get(key)
            if pf is None:
                pending.setdefault(key, ((j, lk), terms, dm, hw))
                return key
            self._prefill[(j, lk)] = pf
        return pf

    def _prefill_times(self, g, pending: dict) -> dict:
        """The prefill seconds of ``pending`` (:meth:`_prefill_time`'s), in one kernel call
        (engine.prefill.kernel_seconds_many: prefill_seconds(..., terms=) of each), kept in the plan and the group."""
        seconds = kernel_seconds_many([(terms, dm, hw) for _, terms, dm, hw in pending.values()])
        out = {}
        for (key, (jl, _, _, _)), s in zip(pending.items(), seconds):
            out[key] = self._prefill[jl] = g.plan.shared(key, lambda: rate_ttft(g.prompt, s, 1)[1])
        return out

    def _kind_slice(self, g, j: int, dm: dict, hw: dict) -> tuple:
        """(first row, rows) of candidate j's attention kinds in the group's kind table; ``dm``: a lowered
        model the plan keeps (:meth:`_candidate`'s), which determines the kinds (its lowering's model, layer
        functions and KV copies): the plan's groups find them by its id."""
        if j in self._kinds:
            return self._kinds[j]
        kinds = g.plan.shared(("kinds", id(dm)), lambda: self._kinds_of(g, j, dm))
        start = self._n_kind_rows
        # the rows read the kinds and the machine rates alone: kept, as the kernel's arrays, for the groups and
        # sweeps that share both
        self._kind_rows.append(kept(("kind_rows", id(kinds), id(hw)), lambda: _kind_block(kinds, hw), kinds, hw))
        self._n_kind_rows += len(kinds)
        self._kinds[j] = (start, len(kinds))
        return self._kinds[j]

    def _kinds_of(self, g, j: int, dm: dict) -> tuple:
        """The (attention kind, layers) pairs of candidate j's lowered model ``dm``, kept (.kept)."""
        kvc = self._kv_copies(g, j)
        # layers alike in (attention on the GPU, context function, KV copies), in first-seen order (Counter counts
        # in C and keeps first-seen order): read from the lowered model alone, so the plan's machines that share it
        # share the count
        return kept(("kinds", id(dm), id(g.layer_fn), id(kvc)), lambda: tuple(Counter(zip(
            (np.asarray(dm["attn_on_gpu"]) != 0).tolist(), np.asarray(g.layer_fn).tolist(),
            kvc.tolist())).items()), dm, g.layer_fn, kvc)

    # ---------------------------------------------------------------- the table
    def _build(self, new: list, f64: np.ndarray, i32: np.ndarray) -> VariantTable:
        """A new table over the current one's variants and the rows (f64, i32) of keys ``new`` (the kernel indexes
        variants in sorted-key order)."""
        g = self.group
        keys = np.array(new, dtype=np.int64)
        old = self.table
        if len(old):
            keys = np.concatenate((old.keys, keys))
            f64 = np.concatenate((old.tables["variant_f64"], f64))
            i32 = np.concatenate((old.tables["variant_i32"], i32))
        order = np.argsort(keys)
        kr = self._kind_rows
        t = dict(variant_f64=f64[order], variant_i32=i32[order],
                 kind_f64=np.concatenate([r[0] for r in kr]) if kr else np.zeros((0, 3)),
                 kind_i32=np.concatenate([r[1] for r in kr]) if kr else np.zeros((0, 3), dtype=np.int32),
                 **g.fn_tables, prompt=float(g.prompt))
        if self.mc:
            run_cfg = g.plan.run
            t["mc"] = MappingProxyType(dict(
                layer_fn=g.layer_fn, models=tuple(self._mc_models), machines=tuple(self._mc_machines),
                routing=g.routing, steps=run_cfg["tokens"], warmup=run_cfg["warmup"], policy=g.policy,
                seed=run_cfg["seed"]))
        for k in ("variant_f64", "variant_i32", "kind_f64", "kind_i32"):    # the layer functions' are already
            _frozen(t[k])
        dec = _kernel.SweepDecode(t)
        return VariantTable(_frozen(keys[order]), MappingProxyType(t), dec)
