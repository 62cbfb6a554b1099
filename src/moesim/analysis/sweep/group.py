"""One group of a sweep: the configurations that share model, quant, machine, runtime, KV dtype,
placement axis value and policy, and differ only in context and batch. A group is lowered once: its
memory tables over layer kinds (``_kernel.SweepMemory``; candidate weights per tier from the memory
kernel) and its decode variants (:mod:`.variants`), grown on demand."""
from __future__ import annotations

import numpy as np

from ...engine import _kernel
from ...engine.codes import POLICIES
from ...engine.lower.attention import kv_read_fns, score_fns
from ...engine.lower.placement import memory_configs, memory_tables
from ...engine.lower.memory import configure, kv_columns_key, lower
from ...engine.memory import evaluate
from ...spec import quants as Q
from ..simulate import routing_table
from .kept import kept
from .spec import OPTION_AXES
from .variants import DecodeVariants




# Lowered pieces that depend on the model and KV dtype only, shared by every quant's and machine's group.
def _kv_bytes_per_token(low, cfg: tuple) -> float:
    """The memory kernel's cache bytes per token (ms_memory.c account's slope): it reads the lowered
    model's cache columns and MTP modules alone, which every quant of a model shares, so the kernel runs
    once per model, KV dtype and configuration rather than once per quant."""
    key = (kv_columns_key(low), int(low.mtp_layers), cfg)
    hit = _KV_PER_TOKEN.get(key)
    if hit is None:
        if len(_KV_PER_TOKEN) > 4096:
            _KV_PER_TOKEN.clear()
        hit = _KV_PER_TOKEN[key] = float(evaluate(low, dict(cfg))["kv_bytes_per_token"][0])
    return hit


_KV_PER_TOKEN: dict = {}


def _layer_functions(m, low, kvb: float) -> tuple:
    """(each layer's row into the attention-function table, read-only; the table of (KV read, score)
    coefficient pairs): what the sweep's context terms evaluate. They read only the lowered model's
    cache terms, which come from the model and the indexer cache's dtype (not the quant): one table per
    model, KV dtype and indexer entry size (the indexer's bytes are the cache's fixed terms)."""
    key = (m, kvb, low.kv_fixed.tobytes(), low.kv_ratio_fixed.tobytes())
    hit = _LAYER_FUNCTIONS.get(key)
    if hit is None:
        hit = _LAYER_FUNCTIONS[key] = _build_layer_functions(m, low, kvb)   # a race builds equal tables twice
    return hit


_LAYER_FUNCTIONS: dict = {}                 # (model, KV bytes per element, indexer terms) -> tables


def _build_layer_functions(m, low, kvb: float) -> tuple:
    fns: dict = {}
    layer_fn = np.array([fns.setdefault(pair, len(fns)) for pair in zip(kv_read_fns(m, low, kvb), score_fns(m))],
                        dtype=np.int32)
    fns = tuple(fns)
    # the function table as ms_sweep_decode_t's columns (5 coefficients, 4 caps each)
    tables = dict(fn_kv_f=np.array([f[0][0] for f in fns]).reshape(-1, 5),
                  fn_kv_c=np.array([f[0][1] for f in fns], dtype=np.int64).reshape(-1, 4),
                  fn_sf_f=np.array([f[1][0] for f in fns]).reshape(-1, 5),
                  fn_sf_c=np.array([f[1][1] for f in fns], dtype=np.int64).reshape(-1, 4))
    for a in (layer_fn, *tables.values()):
        a.flags.writeable = False
    return layer_fn, fns, tables


def _routing(rt: dict) -> tuple:
    """(routing table, whether any layer prefetches: a routing recall above 0), the latter read once per table."""
    recall = np.asarray(rt.get("recall", ()), dtype=np.float64)
    return rt, bool(np.any(recall != 0.0))


class ChunkFacts:
    """What a chunk's consistency check reads of a group (analysis.consistency.check_chunk: its memory
    configurations, lowered model and cache bytes per token), held by the chunk in the group's place: a
    chunk of many narrow groups then does not keep every group's tables and decode variants alive to its
    end (the plan's cache keeps the recent few), which a full collection would walk and free."""

    __slots__ = ("mem_tables", "low", "kv_bytes_per_token")

    def __init__(self, grp):
        self.mem_tables = {"cfg": grp.mem_tables["cfg"]}
        self.low, self.kv_bytes_per_token = grp.low, grp.kv_bytes_per_token


class Group:
    """One group's lowered tables: memory (``mem``, a SweepMemory over ``mem_tables``) and decode variants.

    Everything but the decode variant table is fixed at construction. The variant table grows on demand
    (:meth:`resolve_variants`): each growth builds a new immutable :class:`~.variants.VariantTable`
    under the group's lock and swaps it in with one assignment, so threads sharing the group always read
    one consistent table (the indices they resolved and the kernel tables those index)."""

    def __init__(self, plan, g: int):
        self.plan = plan
        self.g = g
        ix = plan.group_axes(g)
        self.ix = ix
        self.skip = plan.skipped(ix)
        v = plan.values
        self.labels = {"model": None, "machine": plan.machine_labels[ix["machines"]],
                       "policy": v["policies"][ix["policies"]]}
        self.opts = {a: v[a][ix[a]] for a in OPTION_AXES}
        self.workload_shadows = None    # (.workloads.shadows): built on the group's first evaluated rows
        if self.skip:
            return
        m = self.m = plan.models[ix["models"]]
        r = plan.rt_key(ix)
        self.q = plan.resolved[("q", ix["models"], ix["quants"])]
        self.machine = plan.machines[ix["machines"]]
        self.rt = plan.resolved[("rt",) + r]
        self.kv = plan.resolved[("kv",) + r + (ix["kv_dtypes"],)]
        pkey = (ix["models"], ix["machines"], ix["placements"], ix["cache_experts"], self.rt.id, ix["parallel"],
                ix["ubatch"])
        self.cands, self.rule = plan.resolved[("p",) + pkey]
        self.policy = POLICIES[self.labels["policy"]]
        # per (model, quant, KV dtype): the plan's machines share them, found with one look-up per group
        self.low, self.kernel_mix, self.kvb, self.E, (self.layer_fn, self.fns, self.fn_tables) = plan.shared(
            ("lowering", ix["models"], ix["quants"], self.kv), lambda: self._lowering(ix))
        self.labels.update(model=m.id, quant=self.q.id, runtime=self.rt.id, kv_dtype=self.kv)
        self.codes = {k: plan._codes[k][self.labels[k]] for k in ("model", "quant", "machine", "runtime",
                                                                   "kv_dtype", "policy")}
        self.codes.update({k: plan._codes[k][self.opts[k]] for k in ("parallel", "routing") if k in plan.options})
        self.option_values = {k: self.opts[k] for k in plan.options if k not in ("parallel", "routing")}
        self.mtp = self.opts["mtp"] or 0
        self.prompt = self.opts["prompt"] or plan.run["prompt"]      # the prompt axis, else run.prompt
        self.accepted = plan.resolved[("acc", ix["models"], ix["mtp"], ix["mtp_acceptance"])]
        self.place_codes = plan.resolved[("pc",) + pkey]
        # what does not depend on the quant is shared by the plan's groups of this model (plan.shared)
        mkey = (ix["models"], ix["machines"], id(self.rt), self.kv)
        # the memory tables and their checked kernel object read the placement axis, not the policy, prefetch
        # recall or routing: the plan's groups that differ only in those share one (read-only in the kernels), and
        # a later sweep's group of the same lowering, machine, runtime, candidates and output codes (.kept)
        self.mem_tables, self.mem = plan.shared(("mem", self.kv, bool(self.mtp), ix["placements"], ix["cache_experts"])
                                                + r, lambda: self._kept_memory(mkey))
        # configure reads the model, machine, runtime, KV dtype and placement, not the quant (as mem_cfg's tables)
        cfg = plan.shared(("cfg0",) + mkey + (self.cands[0], self.mtp), lambda: kept(
            ("cfg0", id(m), id(self.machine), id(self.rt), self.kv, self.cands[0], self.mtp), lambda: tuple(sorted(
                configure(m, self.low, self.machine, self.rt, self.cands[0], 1, 1, self.kv, self.mtp).items())),
            m, self.machine, self.rt))
        self.kv_bytes_per_token = _kv_bytes_per_token(self.low, cfg)
        self.facts = ChunkFacts(self)
        # simulate's routing tables (seed = run.seed); prefetch is on only where prefetch_recall > 0
        self.routing, self.prefetch = self.routing_tables(self.opts["routing"])
        # drafts and prefetch break the analytic variants' split (variants.check_separable): those groups
        # evaluate each (variant, context) whole, as simulate does (.direct)
        self.direct_hw: dict = {}
        self.direct = plan.mode != "montecarlo" and (self.mtp > 0 or self.prefetch)
        self.variants = DecodeVariants(self)

    def routing_tables(self, routing) -> tuple:
        """(simulate's routing tables of profile ``routing`` (None or "auto": the family's) at the group's prefetch
        recall and the run's seed, whether any layer prefetches), once per plan."""
        recall = self.opts["prefetch_recall"]
        return self.plan.shared(("routing", self.ix["models"], routing, recall), lambda: _routing(routing_table(
            self.m, None if routing in (None, "auto") else routing, recall, self.plan.run["seed"])[0]))

    def _lowering(self, ix: dict) -> tuple:
        """(lowering, kernel mix, KV bytes per element, experts, _layer_functions) of the group's (model, quant,
        KV dtype): lower's own cache returns the same lowering, after resolving and checking the quant again."""
        m, q = self.m, self.q
        low = lower(m, q, self.kv)
        kvb = Q.kv_dtype_bytes(self.kv)
        mix = self.plan.shared(("mix", ix["models"], ix["quants"]), lambda: Q.kernel_mix(m, q))
        return low, mix, kvb, m.n_experts, _layer_functions(m, low, kvb)

    # ---------------------------------------------------------------- memory
    def _kept_memory(self, mkey: tuple) -> tuple:
        """:meth:`_memory`, kept for the process (.kept) under what memory_tables reads: the (model, quant, KV
        dtype)'s lowering, the machine, runtime, MTP switch, candidate tuple and rule, and the plan's output codes
        of the candidates and fits bits (another plan's dictionaries may number them differently)."""
        fits = self.plan.fits_codes[1 if self.machine.unified else 0]
        key = ("mem", id(self.low), id(self.machine), id(self.rt), self.kv, bool(self.mtp), id(self.cands), self.rule,
               self.place_codes.tobytes(), fits.tobytes())
        return kept(key, lambda: self._memory(mkey), self.low, self.machine, self.rt, self.cands)

    def _memory(self, mkey: tuple) -> tuple:
        tables = self._memory_tables(mkey)
        return tables, _kernel.SweepMemory(tables)

    def _memory_tables(self, mkey: tuple) -> dict:
        n_mtp = int(self.low.mtp_layers) if self.mtp else 0
        configs = self.plan.shared(("mem_cfg",) + mkey + (n_mtp,), lambda: kept(
            ("mem_cfg", id(self.m), id(self.machine), id(self.rt), self.kv, n_mtp),
            lambda: memory_configs(self.m, self.low, self.machine, self.rt, self.kv, n_mtp), self.m, self.machine, self.rt))
        return memory_tables(self.m, self.low, self.machine, self.rt, self.kv, self.cands, self.rule,
                             mtp=1 if self.mtp else 0, labels=self.place_codes,
                             fits_label=self.plan.fits_codes[1 if self.machine.unified else 0], configs=configs)

    # ---------------------------------------------------------------- decode variants
    @property
    def table(self):
        """The current decode variant table (an immutable snapshot)."""
        return self.variants.table

    @property
    def table_keys(self) -> np.ndarray:
        return self.variants.table.keys

    @property
    def dec_tables(self) -> dict:
        return self.variants.table.tables

    @property
    def dec(self):
        return self.variants.table.dec

    def decode_key(self, key: int) -> tuple:
        return self.variants.decode_key(key)

    def add_variants(self, keys):
        """Lower the decode variants of these keys; returns the table that holds them."""
        return self.variants.add(keys)

    def resolve_variants(self, keys: np.ndarray, variant: np.ndarray):
        """Fill ``variant`` with each key's row; returns the table those rows index."""
        return self.variants.resolve(keys, variant)
