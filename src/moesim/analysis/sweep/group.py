"""One group of a sweep: the configurations that share model, quant, machine, runtime, KV dtype,
placement axis value and policy, and differ only in context and batch. A group is lowered once: its
memory tables over layer kinds (``_kernel.SweepMemory``; candidate weights per tier from the memory
kernel) and its decode variants (:mod:`.variants`), grown on demand."""
from __future__ import annotations

import numpy as np

from ...engine.codes import CLASS_BUFFERS, CLASS_MTP, CLASS_ROUTED, POLICIES, TIER_GPU, TIER_HOST, placement_code
from ...engine.lower.attention import kv_read_fn, score_fn
from ...engine.lower.memory import configure, lower
from ...engine.memory import evaluate
from ...ingest import model as get_model
from ...spec import quants as Q
from ...spec.placement import Placement
from .spec import machine_label, make_machine_cached
from .variants import DecodeVariants


_MEM_CFG_KEYS = ("kv_bytes_per_elem", "mtp", "n_gpus", "gpu_capacity", "host_capacity", "storage_capacity",
                 "storage_spill", "embed_on_gpu", "kv_granularity", "gpu_fixed", "gpu_buf0", "gpu_buf_ctx",
                 "host_fixed", "host_buf0", "host_buf_ctx")
_WEIGHT_ROWS = tuple(range(CLASS_MTP + 1))   # the weight classes, as ms_memory.c sums them


def candidate_weights(low, cands, cfg: dict, engine: str = "c") -> dict:
    """Weight bytes per tier of each candidate placement, from the memory kernel (ms_memory.c account(),
    through :func:`moesim.engine.memory.evaluate`): configuration ``cfg`` (the group's all-GPU one: its
    embeddings rule) with each candidate's placement, at context 1 and batch 1, without MTP.

    ``w_gpu`` / ``w_host``: the weight classes summed per tier in the kernel's class order;
    ``routed_host``: routed experts in host RAM; ``any_gpu``: whether the kernel places anything on the
    GPU, which is exactly when it reserves GPU compute buffers -- read from a probe of one GPU with one
    byte of fixed buffer (weights do not depend on GPU count, buffers or capacities; capacities of 0
    make the kernel's max-context/max-batch searches stop at once)."""
    n = len(cands)
    cols = {k: np.full(n, v) for k, v in cfg.items()}
    cols.update(context=np.ones(n, dtype=np.int64), batch=np.ones(n, dtype=np.int64), mtp=np.zeros(n, dtype=np.int64),
                placement=np.array([placement_code(p) for p in cands], dtype=np.int64),
                placement_arg=np.array([max(0, p.arg) for p in cands], dtype=np.int64),
                n_gpus=np.ones(n, dtype=np.int64), gpu_fixed=np.ones(n), gpu_buf0=np.zeros(n), gpu_buf_ctx=np.zeros(n),
                gpu_capacity=np.zeros(n), host_capacity=np.zeros(n), storage_spill=np.zeros(n, dtype=np.int64))
    bc = evaluate(low, cols, engine=engine)["by_class"]
    w_gpu, w_host = [], []
    for j in range(n):
        g = h = 0.0
        for k in _WEIGHT_ROWS:
            g += float(bc[j, k, TIER_GPU])
            h += float(bc[j, k, TIER_HOST])
        w_gpu.append(g)
        w_host.append(h)
    return {"w_gpu": w_gpu, "w_host": w_host, "routed_host": [float(x) for x in bc[:, CLASS_ROUTED, TIER_HOST]],
            "any_gpu": [int(x > 0.0) for x in bc[:, CLASS_BUFFERS, TIER_GPU]]}


class Group:
    """One group's lowered tables: memory (``mem``, a SweepMemory over ``mem_tables``) and decode variants.

    Everything but the decode variant table is fixed at construction. The variant table grows on demand
    (:meth:`resolve_variants`): each growth builds a new immutable :class:`~.variants.VariantTable`
    under the group's lock and swaps it in with one assignment, so threads sharing the group always read
    one consistent table (the indices they resolved and the kernel tables those index)."""

    def __init__(self, plan, g: int):
        from ...engine.lower import routing as R_routing
        from ...spec import routing as R
        self.plan = plan
        self.g = g
        ix = plan.group_axes(g)
        self.ix = ix
        self.skip = plan.skipped(ix)
        v = plan.values
        self.labels = {"model": None, "machine": machine_label(v["machines"][ix["machines"]]),
                       "policy": v["policies"][ix["policies"]]}
        if self.skip:
            return
        m = self.m = get_model(v["models"][ix["models"]])
        self.q = plan.resolved[("q", ix["models"], ix["quants"])]
        self.machine = make_machine_cached(v["machines"][ix["machines"]])
        self.rt = plan.resolved[("rt", ix["models"], ix["quants"], ix["machines"], ix["runtimes"])]
        self.kv = plan.resolved[("kv", ix["models"], ix["quants"], ix["machines"], ix["runtimes"], ix["kv_dtypes"])]
        self.cands, self.rule = plan.resolved[("p", ix["models"], ix["machines"], ix["placements"], self.rt.id)]
        self.policy = POLICIES[self.labels["policy"]]
        self.low = lower(m, self.q)
        self.kernel_mix = Q.kernel_mix(m, self.q)
        self.kvb = Q.kv_dtype_bytes(self.kv)
        self.labels.update(model=m.id, quant=self.q.id, runtime=self.rt.id, kv_dtype=self.kv)
        self.codes = {k: plan._codes[k][self.labels[k]] for k in ("model", "quant", "machine", "runtime",
                                                                   "kv_dtype", "policy")}
        self.place_codes = np.array([plan._codes["placement"][str(p)] for p in self.cands], dtype=np.int32)
        self.E = m.n_experts
        self.mem_tables = self._memory_tables()
        from ...engine import _kernel
        self.mem = _kernel.SweepMemory(self.mem_tables)
        cfg = configure(m, self.low, self.machine, self.rt, self.cands[0], 1, 1, self.kv, 0)
        self.kv_bytes_per_token = float(evaluate(self.low, cfg)["kv_bytes_per_token"][0])
        # prefetch off: the analytic variants rely on it (variants.check_separable)
        self.routing = R_routing.lower(R_routing.RoutingDims.of(m), R.profile(None, family=m.family), plan.run["seed"],
                                       prefetch=False)
        self.layer_kv = [kv_read_fn(m, self.low, l, self.kvb) for l in range(m.n_layers)]
        self.layer_sf = [score_fn(layer) for layer in m.layers]
        fns: dict = {}
        self.layer_fn = np.array([fns.setdefault((kf, sf), len(fns)) for kf, sf in zip(self.layer_kv, self.layer_sf)],
                                 dtype=np.int32)
        self.fns = list(fns)
        self.variants = DecodeVariants(self)

    # ---------------------------------------------------------------- memory
    def _kv_kinds(self) -> tuple:
        """Layers grouped by their cache bytes rule: (kind rows, kind of each layer)."""
        low, kvb, L = self.low, self.kvb, self.m.n_layers
        kinds, kind_of = {}, np.empty(L, dtype=np.int64)
        for l in range(L):
            key = (float(low.kv_elems[l] * kvb + low.kv_fixed[l]), int(low.kv_cap[l]), int(low.kv_ratio[l]),
                   float(low.kv_ratio_elems[l] * kvb + low.kv_ratio_fixed[l]), float(low.kv_state[l]))
            kind_of[l] = kinds.setdefault(key, len(kinds))
        return list(kinds), kind_of

    def _places(self, cfg_gpu: dict) -> tuple:
        """Per-candidate rows of ms_sweep_place_t, and the first candidate of each placement kind."""
        pl = {k: [] for k in ("code", "arg", "layout", "cfg", "any_gpu", "label", "w_gpu", "w_host", "routed_host")}
        idx = {"all-gpu": -1, "n-cpu-moe": -1, "layers-gpu": -1, "cpu-only": -1, "experts-cpu": -1,
               "gpu-experts": -1}
        w = candidate_weights(self.low, self.cands, cfg_gpu)
        for j, p in enumerate(self.cands):
            if idx.get(p.kind, 0) == -1:
                idx[p.kind] = j
            cpu_only = p.kind == "cpu-only" or self.machine.n_gpus == 0
            pl["code"].append(placement_code(p))
            pl["arg"].append(max(0, p.arg))
            pl["layout"].append(1 if p.kind == "cpu-only" else (2 + p.arg if p.kind == "layers-gpu" else 0))
            pl["cfg"].append(1 if cpu_only else 0)
            pl["label"].append(int(self.place_codes[j]))
            for k in ("any_gpu", "w_gpu", "w_host", "routed_host"):
                pl[k].append(w[k][j])
        return pl, idx

    def _memory_tables(self) -> dict:
        m, low, mach = self.m, self.low, self.machine
        L = m.n_layers
        rows, kind_of = self._kv_kinds()
        K = len(rows)
        count = np.bincount(kind_of, minlength=K).astype(np.int32)
        gpu_count = np.zeros((L + 3, K), dtype=np.int32)
        gpu_count[0] = count                                  # layout 0: every layer on the GPU
        for k in range(L + 1):                                # layout 2 + k: layers-gpu = k
            gpu_count[2 + k] = np.bincount(kind_of[L - k:], minlength=K) if k else 0
        full = [configure(m, low, mach, self.rt, p, 1, 1, self.kv, 0)
                for p in (Placement("all-gpu"), Placement("cpu-only"))]
        cfgs = [{k: c[k] for k in _MEM_CFG_KEYS} for c in full]
        pl, idx = self._places(full[0])
        return dict(per_token=[r[0] for r in rows], cap=[r[1] for r in rows], ratio=[r[2] for r in rows],
                    ratio_bytes=[r[3] for r in rows], state=[r[4] for r in rows], count=count,
                    gpu_count=gpu_count, max_context=int(low.max_context), cfg=cfgs, places=pl, rule=self.rule,
                    n_layers=L, n_experts=self.E, i_all_gpu=idx["all-gpu"], i_n_cpu_moe=idx["n-cpu-moe"],
                    i_layers_gpu=idx["layers-gpu"], i_cpu_only=idx["cpu-only"], i_experts_cpu=idx["experts-cpu"],
                    i_gpu_experts=idx["gpu-experts"], fits_label=self.plan.fits_codes[1 if mach.unified else 0])

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
