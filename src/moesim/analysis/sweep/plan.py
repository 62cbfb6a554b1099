"""The plan of a sweep: its grid (zipped axes vary together), the groups of configurations that share
everything but context and batch, the chunks, the categorical dictionaries, and every combination
resolved (or refused) once."""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from ...engine.lower.memory import default_kv_dtype, lower
from ...engine.lower.placement import placement_candidates
from ...errors import MoesimError
from ...ingest import model as get_model
from ...spec import quants as Q
from ...spec.runtimes import check_runtime_applies, default_runtime, runtime as get_runtime
from .group import Group
from .kept import runtime as kept_runtime
from .spec import (OPTION_AXES, OPTION_DEFAULT, SLOW_AXES, _err, expand_int_axis, machine_label, make_machine_cached,
                   spec_hash)
from .table import CATEGORICAL, FITS_LABELS, RESOURCES, column_names


def option_placement(pname: str, cache_experts, m):
    """The placements-axis value a cache_experts value makes of it (simulate's configure_run:
    ``offload-cache=min(N, experts)`` under auto or offload-cache), or None where it does not apply."""
    if cache_experts is None:
        return pname
    if pname != "auto" and not pname.startswith("offload-cache"):
        return None
    return f"offload-cache={min(int(cache_experts), m.n_experts)}"


class OnceCache:
    """A small LRU map whose values are built once per key even when several threads ask at once (the
    first builds, the others wait for it and share the value)."""

    def __init__(self, size: int):
        self.size = size
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self._building: dict = {}

    def _hit(self, key):
        if key in self._items:
            self._items.move_to_end(key)
            return True, self._items[key]
        return False, None

    def get(self, key, build):
        with self._lock:
            found, value = self._hit(key)
            if found:
                return value
            building = self._building.setdefault(key, threading.Lock())
        with building:
            with self._lock:
                found, value = self._hit(key)
                if found:
                    return value
            value = build()
            with self._lock:
                self._items[key] = value
                self._building.pop(key, None)
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
            return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


class Plan:
    """The grid of a normalized spec: dimensions (zips vary together), groups, chunks, dictionaries.

    Read-only once built, except its cache of lowered groups (:meth:`group`), which is safe to use
    from several threads."""

    # threads an analytic table call (sweep.che: the expert- and page-cache rows a group lowers first) may use: the
    # sweep's own thread count, set by sweep() (the rows are the same on any count)
    table_threads = 1

    def __init__(self, norm: dict):
        self.norm = norm
        self.hash = spec_hash(norm)
        ax = norm["axes"]
        self.run = norm["run"]
        self.mode = self.run["mode"]
        self.contexts = expand_int_axis(ax["contexts"])
        self.batches = expand_int_axis(ax["batches"])
        self.batch_list = self.batches.tolist()     # Python ints, for per-key look-ups
        if self.batches.max() > 2**30:
            raise _err("axes.batches", f"batch {int(self.batches.max())} exceeds 2^30")
        self.values = {a: ax.get(a, OPTION_DEFAULT) for a in SLOW_AXES}
        self.options = tuple(a for a in OPTION_AXES if a in ax)      # the option axes the spec gives
        self.machines = [make_machine_cached(hv) for hv in self.values["machines"]]
        zipped = {a: tuple(g) for g in norm["zip"] for a in g}
        dims, done = [], set()
        for a in SLOW_AXES:
            if a in done:
                continue
            grp = zipped.get(a, (a,))
            done.update(grp)
            dims.append((grp, len(self.values[grp[0]])))
        self.dims = dims
        # group_axes' walk: the dimensions of more than one value (the others' index is 0 in every group)
        self._zero_axes = {a: 0 for grp, _ in dims for a in grp}
        self._varying = tuple((grp, n) for grp, n in reversed(dims) if n > 1)
        self.n_groups = int(np.prod([n for _, n in dims], dtype=np.int64)) if dims else 1
        self.fast_zipped = "contexts" in zipped
        self.n_c, self.n_b = len(self.contexts), len(self.batches)
        if self.fast_zipped and self.n_c != self.n_b:
            raise _err("zip", f"zipped contexts ({self.n_c}) and batches ({self.n_b}) differ in length "
                              "after expanding ranges")
        self.block = self.n_c if self.fast_zipped else self.n_c * self.n_b
        self.total = self.n_groups * self.block
        self.chunk_size = self.run["chunk_size"]
        self.n_chunks = max(1, -(-self.total // self.chunk_size))
        self.columns = column_names(self.mode, self.options)
        self._groups = OnceCache(8)
        self._shared: dict = {}
        self._check_combinations()

    # ---------------------------------------------------------------- indices
    def group_axes(self, g: int) -> dict:
        """Axis index per slow axis of group g (last dimension fastest)."""
        idx = dict(self._zero_axes)
        rest = g
        for grp, n in self._varying:
            rest, i = divmod(rest, n)
            for a in grp:
                idx[a] = i
        return idx

    def chunk_bounds(self, k: int) -> tuple:
        """Global configuration indices [start, end) of chunk k."""
        start = k * self.chunk_size
        return start, min(self.total, start + self.chunk_size)

    def chunk_len(self, k: int) -> int:
        start, end = self.chunk_bounds(k)
        return end - start

    # ---------------------------------------------------------------- combinations and dictionaries
    def _check_combinations(self):
        """Resolve every (model, quant), (model, machine, placement) and runtime/KV combination once:
        inapplicable ones are errors naming them, or skipped with filter.skip_inapplicable."""
        skip = self.norm["filter"].get("skip_inapplicable", False)
        v = self.values
        self.bad: dict = {}
        self.dicts = {k: [] for k in CATEGORICAL}
        self._codes = {k: {} for k in CATEGORICAL}
        self.resolved: dict = {}
        self._cand_codes: dict = {}     # id(candidate tuple) -> (the tuple, its placement codes)
        self._runtimes: dict = {}
        self.models = [get_model(mid) for mid in v["models"]]
        for mi, m in enumerate(self.models):
            self._code("model", m.id)
            self._check_drafts(m, mi, skip)
            for qi, qname in enumerate(v["quants"]):
                try:
                    q = Q.resolve(qname, m)
                    lower(m, q)
                except MoesimError as exc:
                    self._bad(("mq", mi, qi), skip, f"axes.quants[{qi}]",
                              f"{qname!r} does not apply to {m.id}: {exc}")
                    continue
                self.resolved[("q", mi, qi)] = q
                self._code("quant", q.id)
                for hi, hv in enumerate(v["machines"]):
                    self._check_machine(m, mi, q, qi, hi, hv, skip)
        self.machine_labels = [machine_label(hv) for hv in v["machines"]]     # one per machines-axis value
        for label in self.machine_labels:
            self._code("machine", label)
        for p in v["policies"]:
            self._code("policy", p)
        for col in ("parallel", "routing"):
            if col in self.options:
                for x in v[col]:
                    self._code(col, x)
        for lab in FITS_LABELS:
            self._code("fits", lab)
        self.fits_codes = np.array([[self._codes["fits"][FITS_LABELS[b]] for b in range(8)],
                                    [self._codes["fits"][FITS_LABELS[7 + b] if b else "no"] for b in range(8)]],
                                   dtype=np.int32)
        for r in RESOURCES:
            self._code("bottleneck", r)

    def _check_drafts(self, m, mi: int, skip: bool) -> None:
        """MTP drafts need the model's MTP modules; their acceptance is the axis value, else the family's
        measured one (simulate's resolve_acceptance): resolved per (model, mtp, mtp_acceptance)."""
        from ..speculation import accepted_per_step, resolve_acceptance
        for ti, mtp in enumerate(self.values["mtp"]):
            if mtp and not m.mtp_layers:
                self._bad(("mt", mi, ti), skip, f"axes.mtp[{ti}]", f"mtp = {mtp}: {m.id} has no MTP modules")
                continue
            for ui, acc in enumerate(self.values["mtp_acceptance"]):
                try:
                    rate = resolve_acceptance(m.family, mtp or 0, acc).rate
                except MoesimError as exc:
                    self._bad(("acc", mi, ti, ui), skip, f"axes.mtp[{ti}]", f"mtp = {mtp} on {m.id}: {exc}")
                    continue
                self.resolved[("acc", mi, ti, ui)] = accepted_per_step(mtp or 0, rate)

    def _check_machine(self, m, mi: int, q, qi: int, hi: int, hv, skip: bool) -> None:
        """Runtimes (under each parallel layout), KV dtypes and placement candidates of one (model, quant,
        machine)."""
        from ..resolve import _check_expert_parallel, with_parallel
        v = self.values
        mach = self.machines[hi]
        for ri, rname in enumerate(v["runtimes"]):
            base = self._runtime(rname, q, m, mach)
            for ai, par in enumerate(v["parallel"]):
                try:
                    rt = with_parallel(base, None if par in (None, "auto") else par, mach)
                    _check_expert_parallel(m, rt)
                except MoesimError as exc:
                    self._bad(("par", mi, qi, hi, ri, ai), skip, f"axes.parallel[{ai}]",
                              f"{par!r} on {m.id} / {machine_label(hv)}: {exc}")
                    continue
                for ui, ub in enumerate(v["ubatch"]):
                    try:
                        rtu = self._with_ubatch(rt, ub)
                    except MoesimError as exc:
                        self._bad(("ub", mi, qi, hi, ri, ai, ui), skip, f"axes.ubatch[{ui}]",
                                  f"{ub!r} on {m.id} / {machine_label(hv)}: {exc}")
                        continue
                    self._check_runtime(m, mi, q, qi, hi, hv, (ri, ai, ui), rtu, skip)

    def _with_ubatch(self, rt, ubatch):
        """resolve.with_ubatch, one object per (runtime, ubatch) of the plan (groups key on its identity)."""
        from ..resolve import with_ubatch
        key = ("ub", id(rt), ubatch)
        hit = self._runtimes.get(key)
        if hit is None:
            hit = self._runtimes[key] = (rt, with_ubatch(rt, ubatch))     # holds rt: its id stays its own
        return hit[1]

    def _process_runtime(self, rt):
        """kept.runtime(rt) once per profile object of the plan: groups key process-kept tables on its id."""
        key = ("process", id(rt))
        hit = self._runtimes.get(key)
        if hit is None:
            hit = self._runtimes[key] = (rt, kept_runtime(rt))     # holds rt: its id stays its own
        return hit[1]

    def _runtime(self, rname: str, q, m, mach):
        """The runtime profile of a runtimes-axis value for quant q of model m on machine mach, built once
        per plan (auto's depends on the quant and machine, a named one on the model's launch settings):
        the groups of one profile share one object."""
        key = (rname, q.id, id(mach)) if rname == "auto" else (rname, m.id)   # the plan holds its machines
        hit = self._runtimes.get(key)
        if hit is None:
            rt = default_runtime(q, mach) if rname == "auto" else get_runtime(rname, model=m.id)
            # equal profiles (auto's for every GGUF quant) as one object, so groups can key on its identity
            hit = self._runtimes[key] = next((x for x in self._runtimes.values() if x == rt), rt)
        return hit

    def _check_runtime(self, m, mi: int, q, qi: int, hi: int, hv, rix: tuple, rt, skip: bool) -> None:
        """KV dtypes and placements under runtime rt; ``rix``: its (runtimes, parallel, ubatch) indices."""
        v = self.values
        mach = self.machines[hi]
        r = (mi, qi, hi) + rix
        rt = self._process_runtime(rt)
        self.resolved[("rt",) + r] = rt
        self._code("runtime", rt.id)
        for ki, kname in enumerate(v["kv_dtypes"]):
            kv = Q.canonical_kv_dtype(default_kv_dtype(q, rt, m) if kname == "auto" else kname)
            self.resolved[("kv",) + r + (ki,)] = kv
            self._code("kv_dtype", kv)
        for pi, pname in enumerate(v["placements"]):
            try:
                check_runtime_applies(rt, mach, str(pname))
            except MoesimError as exc:
                self._bad(("rhp",) + r + (pi,), skip, f"axes.runtimes[{rix[0]}]",
                          f"{m.id} / {machine_label(hv)}: {exc}")
                continue
            for ci, ce in enumerate(v["cache_experts"]):
                self._check_placement(m, mi, hi, hv, pi, pname, ci, ce, rix[1:], rt, skip)

    def _check_placement(self, m, mi: int, hi: int, hv, pi: int, pname, ci: int, ce, aix: tuple, rt, skip: bool):
        """Placement candidates; ``aix``: the (parallel, ubatch) indices (the ubatch sets compute buffers)."""
        mach = self.machines[hi]
        key = ("p", mi, hi, pi, ci, rt.id) + aix
        if key in self.resolved or ("mhp", mi, hi, pi, ci) in self.bad:
            return
        eff = option_placement(str(pname), ce, m)
        if eff is None:
            self._bad(("mhp", mi, hi, pi, ci), skip, f"axes.cache_experts[{ci}]",
                      f"cache_experts = {ce} applies to the offload-cache placement, not {pname!r}")
            return
        try:
            cands, rule = placement_candidates(m, mach, rt, eff)
        except MoesimError as exc:
            where = f"axes.placements[{pi}]" if ce is None else f"axes.cache_experts[{ci}]"
            self._bad(("mhp", mi, hi, pi, ci), skip, where,
                      f"{eff!r} on {m.id} / {machine_label(hv)}: {exc}")
            return
        self.resolved[key] = (cands, rule)
        # one code array per candidate tuple (automatic placement's are shared by every model of a shape): later
        # machines' would only look up codes the first assigned, in the same order
        hit = self._cand_codes.get(id(cands))
        if hit is None or hit[0] is not cands:
            codes = np.array([self._code("placement", str(p)) for p in cands], dtype=np.int32)
            codes.flags.writeable = False
            hit = self._cand_codes[id(cands)] = (cands, codes)      # holds the tuple: its id stays its own
        self.resolved[("pc",) + key[1:]] = hit[1]

    def _bad(self, key, skip: bool, where: str, message: str):
        if not skip:
            raise _err(where, message + " (set filter.skip_inapplicable = true to drop such combinations)")
        self.bad[key] = message

    def _code(self, col: str, value: str) -> int:
        codes = self._codes[col]
        if value not in codes:
            codes[value] = len(self.dicts[col])
            self.dicts[col].append(value)
        return codes[value]

    def rt_key(self, ix: dict) -> tuple:
        """(model, quant, machine, runtime, parallel, ubatch) indices of group axes ix: its runtime's key."""
        return ix["models"], ix["quants"], ix["machines"], ix["runtimes"], ix["parallel"], ix["ubatch"]

    def skipped(self, ix: dict) -> bool:
        if not self.bad:                # nothing refused (skip_inapplicable's grids of applicable combinations)
            return False
        r = self.rt_key(ix)
        return (("mq", ix["models"], ix["quants"]) in self.bad
                or ("mt", ix["models"], ix["mtp"]) in self.bad
                or ("acc", ix["models"], ix["mtp"], ix["mtp_acceptance"]) in self.bad
                or ("par",) + r[:5] in self.bad
                or ("ub",) + r in self.bad
                or ("mhp", ix["models"], ix["machines"], ix["placements"], ix["cache_experts"]) in self.bad
                or ("rhp",) + r + (ix["placements"],) in self.bad)

    # ---------------------------------------------------------------- groups
    def shared(self, key: tuple, build):
        """A lowered piece several groups of this plan share (keyed by axis indices and the values it
        depends on), built by the first group that asks: what does not depend on the quant is lowered
        once per model instead of once per group. A race builds equal values twice; one is kept."""
        hit = self._shared.get(key)
        if hit is None:
            hit = self._shared.setdefault(key, build())
        return hit

    def drop_groups(self) -> None:
        """Forget the cached groups (rebuilt if asked for again): they hold the plan, a cycle."""
        self._groups.clear()

    def group(self, g: int):
        """Group g's lowered tables, built once (by one thread) and shared; the eight most recent are kept."""
        return self._groups.get(g, lambda: Group(self, g))
