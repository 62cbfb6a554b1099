"""The Python side of the C boundary: one ``handle_library_error``, the declared field table of every C
struct the glue fills, and the kernel limits checked before C runs.

Every C entry point is called with values :func:`check_struct` has checked against :data:`STRUCTS`: each
field present, of the declared type, and sized in terms of the struct's dimensions (``n_layers``,
``n_experts``, ...). Lowered tables are plain dicts that may carry Python-only keys as well; only the
declared fields reach C, and the glue never defaults a missing one. Fields the C may go without are
marked optional here and nowhere else.

A non-zero C return code means moesim itself let bad tables through: :func:`handle_library_error`
raises :class:`~moesim.errors.KernelError` naming the entry point, the configuration and the message
of ``ms_strerror``.
"""
from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import KernelError, MoesimError
from .codes import CHE_FIELDS, MAX_HISTORY, MAX_MOE_LAYERS, MAX_PARTNERS, MAX_TOP_K, N_CLASSES


def kernel_module():
    """The compiled kernel module (engine._kernel), imported on first use, so that the engine's modules load
    without it, and then held: a function-level import costs ~1 us a call, and a sweep calls the kernels per group."""
    if not _KERNEL:
        from . import _kernel
        _KERNEL.append(_kernel)
    return _KERNEL[0]


_KERNEL: list = []


def handle_library_error(code: int, where: str, index: int | None = None) -> None:
    """Raise KernelError for a non-zero *code* returned by the C entry point *where*; else return."""
    if not code:
        return
    from . import _kernel
    at = f" at configuration {index}" if index is not None and index >= 0 else ""
    raise KernelError(f"{where}: C kernel error{at}: {_kernel.strerror(int(code))} (code {int(code)})")


class StructError(KernelError):
    """A lowered table does not match its C struct (a field missing, mistyped or mis-sized): a moesim
    bug caught before the kernel runs. ``struct`` and ``field`` name the place."""

    def __init__(self, struct: str, field: str, message: str):
        self.struct = struct
        self.field = field
        super().__init__(f"{struct}.{field}: {message}")


# ------------------------------------------------------------------------------- field tables
F64, I32, I64, U64 = np.float64, np.int32, np.int64, np.uint64
REAL, INT, TABLE = "real", "int", "table"
_INT32 = (-(2**31), 2**31 - 1)


@dataclass(frozen=True)
class Field:
    """One field of a C struct: a scalar (``shape`` None; ``kind`` REAL or INT), an array of ``dtype``
    whose shape is a tuple of dimension names (bound by the first field that has them) or integers, or
    a nested TABLE. ``optional``: the value may be absent or None (C then gets NULL / nothing)."""

    name: str
    kind: object
    shape: tuple | None = None
    optional: bool = False
    note: str = ""


def _arrays(dtype, shape, *names, optional=False):
    return tuple(Field(n, dtype, shape, optional) for n in names)


def _scalars(kind, *names):
    return tuple(Field(n, kind) for n in names)


# ms_model_t (moesim.h): attributes of engine.lower.memory.LoweredModel; L = its layers.
MODEL = (_arrays(F64, ("n_layers",), "attn", "router", "shared", "expert_one")
         + _arrays(I32, ("n_layers",), "n_experts")
         + _arrays(F64, ("n_layers",), "dense", "kv_elems", "kv_fixed", "kv_ratio_elems", "kv_ratio_fixed", "kv_state")
         + _arrays(I64, ("n_layers",), "kv_cap", "kv_ratio")
         + _scalars(REAL, "embed", "head", "mtp") + _scalars(INT, "mtp_layers", "max_context"))

# ms_mem_config_t as columns of n configurations (engine.memory.evaluate builds them).
MEM_CONFIG_INT = ("context", "batch", "placement", "placement_arg", "mtp", "n_gpus", "storage_spill", "embed_on_gpu",
                  "kv_granularity")
MEM_CONFIG_REAL = ("kv_bytes_per_elem", "gpu_capacity", "host_capacity", "storage_capacity", "gpu_fixed", "gpu_buf0",
                   "gpu_buf_ctx", "host_fixed", "host_buf0", "host_buf_ctx", "head_copy")
_MEM_CONFIG_I64 = ("context", "batch", "placement_arg", "kv_granularity")     # the rest are int32_t
# gpu_ways [N_CLASSES]: each class's GPU bytes are divided that many ways over the GPUs (memory per GPU)
MEM_CONFIG_COLUMNS = (tuple(Field(f, I64 if f in _MEM_CONFIG_I64 else I32, ("n",)) for f in MEM_CONFIG_INT)
                      + _arrays(F64, ("n",), *MEM_CONFIG_REAL) + (Field("gpu_ways", F64, ("n", N_CLASSES)),))
# one ms_mem_config_t of a sweep group (context, batch and placement are set per configuration)
MEM_CONFIG = (_scalars(INT, *(f for f in MEM_CONFIG_INT if f not in ("context", "batch", "placement", "placement_arg")))
              + _scalars(REAL, *MEM_CONFIG_REAL) + (Field("gpu_ways", F64, (N_CLASSES,)),))

# ms_decode_model_t (engine.lower.decode_model.lower_model); L = its layers.
DECODE_MODEL = (_arrays(F64, ("n_layers",), "attn_bytes", "attn_flops", "kv_bytes", "score_flops", "shared_bytes",
                        "shared_flops", "expert_bytes", "expert_flops", "ep_load_experts", "ep_load_pairs",
                        "layer_ops", "gemm_rows")
                + _arrays(I32, ("n_layers",), "attn_on_gpu", "expert_mode", "slots", "page_slots", "moe_index")
                + _scalars(REAL, "head_bytes", "head_flops") + _scalars(INT, "head_on_gpu")
                + _scalars(REAL, "draft_bytes", "draft_flops", "act_bytes", "allreduce_bytes", "a2a_bytes"))

# ms_machine_t (engine.lower.machine.lower_machine).
MACHINE = (_scalars(REAL, "gpu_bw", "host_bw", "pcie_bw", "storage_bw", "gpu_flops", "cpu_flops", "interconnect_bw")
           + _scalars(INT, "unified", "overlap")
           + _scalars(REAL, "launch_s", "sync_s", "dma_s", "allreduce_s", "step_s", "seq_s", "a2a_bw", "a2a_s",
                      "moe_s", "cpu_layer_s", "op_s", "cpu_op_s")
           + _scalars(INT, "graph_max_tokens") + _scalars(REAL, "nograph_s", "mmid_sync_s", "cpu_attn_flops")
           + _scalars(INT, "mm_min_tokens", "mm_tile_tokens", "mv_ext_cols", "mv_ext_min_tokens", "mv_ext_k_min_tokens")
           + _scalars(REAL, "mv_ext_share", "mv_ext_k_share") + _scalars(INT, "moe_rowwise_below", "mm_tile_rows")
           + _scalars(REAL, "mm_slots", "gemv_weight_s", "gemv_token_rel"))

# ms_routing_t (engine.lower.routing.lower / lower_trace); L MoE layers, E experts, S request scenarios.
# A dense model (n_layers 0) has no per-layer tables: ROUTING_LAYERS are then absent and C gets NULL.
Q_TABLES = (Field("qbar", F64, ("n_layers", "n_experts")), Field("lqbar", F64, ("n_layers", "n_experts")))
ROUTING_DIMS = _scalars(INT, "n_layers", "n_experts", "top_k", "n_group", "topk_group")
ROUTING_LAYERS = (Field("log_pop", F64, ("n_layers", "n_experts")), Field("stickiness", F64, ("n_layers",)),
                  Field("recall", F64, ("n_layers",)), Field("hot", I32, ("n_layers", "n_experts")),
                  Field("q", F64, ("n_scenarios", "n_layers", "n_experts")), Field("q_tables", TABLE, Q_TABLES),
                  Field("recency", F64, ("n_layers",), optional=True,
                        note="the multi-lag memory: per-layer copy probability"),
                  Field("recency_lag", F64, ("history",), optional=True, note="the memory's lag distribution"),
                  Field("coupling", F64, ("n_layers",), optional=True, note="cross-layer coupling strength"),
                  Field("partners", I32, ("n_layers", "n_experts", "n_partners"), optional=True,
                        note="each expert's next-layer partners (with coupling)"),
                  Field("win_n", F64, ("n_window",), optional=True,
                        note="window lengths of the token-memory tables (analytic path)"),
                  Field("win_lq", F64, ("n_layers", "n_experts", "n_window"), optional=True,
                        note="log P(expert absent from a window) per layer, expert, window length"),
                  Field("win_m", F64, ("n_moment",), optional=True,
                        note="window lengths of the LFU count moments (with the windows)"),
                  Field("win_var", F64, ("n_layers", "n_experts", "n_moment"), optional=True,
                        note="variance of an expert's count over a window, per layer, expert, length"),
                  Field("win_cov", F64, ("n_layers", "n_experts", "n_moment"), optional=True,
                        note="covariance of that count with the expert in the next token"),
                  Field("trace", I32, ("trace_tokens", "trace_layers", "top_k"), optional=True,
                        note="a recorded trace replays instead of sampling"))
ROUTING = ROUTING_DIMS + _scalars(REAL, "concentration") + _scalars(INT, "request_tokens") + ROUTING_LAYERS
_ROUTING_DENSE = ROUTING[:len(ROUTING) - len(ROUTING_LAYERS)]        # a dense model's: no per-layer tables

# ms_decode_config_t as columns of n configurations (engine.decode.CONFIG_FIELDS); seed and index are
# taken modulo 2**64.
DECODE_CONFIG_COLUMNS = (_arrays(I32, ("n",), "batch", "tokens_per_step", "drafts") + _arrays(F64, ("n",), "accepted")
                         + _arrays(I64, ("n",), "steps", "warmup") + _arrays(I32, ("n",), "policy", "mode")
                         + _arrays(U64, ("n",), "seed", "index")
                         # analytic tables (engine.decode.che_table): row i for configuration i, read by its MoE
                         # layers of che_slots[i] slots (-1: none; both or neither present)
                         + (Field("che", F64, ("n", "che_layers", len(CHE_FIELDS)), optional=True,
                                  note="ms_che_table's step counts and hit rate per configuration and routing layer"),
                            Field("che_slots", I32, ("n",), optional=True,
                                  note="the slot count each che row was tabulated for (-1: no table)"),
                            # host page-cache tables (engine.decode.page_table): row i for configuration i, read
                            # by its paged MoE layers of page_hit_slots[i] page slots (-1: none; both or neither)
                            Field("page_hit", F64, ("n", "page_layers"), optional=True,
                                  note="ms_page_table's page-cache hit rate per configuration and routing layer"),
                            Field("page_hit_slots", I32, ("n",), optional=True,
                                  note="the page slot count each page_hit row was tabulated for (-1: no table)")))

# ms_sweep_place_t as columns of a group's candidate placements, and ms_sweep_mem_t (analysis.sweep
# Group._memory_tables); K layer kinds.
SWEEP_PLACES = (_arrays(I32, ("n_places",), "code") + _arrays(I64, ("n_places",), "arg")
                + _arrays(I32, ("n_places",), "layout", "cfg", "any_gpu", "label")
                + _arrays(F64, ("n_places",), "w_gpu", "w_host", "w_gpu_one", "routed_host"))
SWEEP_MEMORY = (_arrays(F64, ("n_kinds",), "per_token", "ratio_bytes", "state") + _arrays(I64, ("n_kinds",), "cap", "ratio")
                + _arrays(I32, ("n_kinds",), "count") + (Field("gpu_count", I32, ("n_layouts", "n_kinds")),)
                + _scalars(INT, "max_context") + (Field("places", TABLE, SWEEP_PLACES),)
                + _scalars(INT, "rule", "n_layers", "n_experts", "i_all_gpu", "i_n_cpu_moe", "i_layers_gpu",
                           "i_cpu_only", "i_experts_cpu", "i_gpu_experts")
                + (Field("fits_label", I32, (8,)),))
# "cfg": two MEM_CONFIG tables (the group's GPU and CPU-only configurations), checked one by one.

# ms_sweep_decode_t (analysis.sweep Group._build_decode): rows of ms_sweep_variant_t / ms_sweep_kind_t,
# context functions (5 coefficients, 4 caps each), and the optional Monte Carlo templates. Its counts are
# derived, not declared: n_variants / n_kinds / n_fns are the rows of the tables below, n_templates the
# length of mc["models"]; the C checks every variant's kind slice and template index against them.
SWEEP_MC = (Field("layer_fn", I32, ("n_layers",)),) + _scalars(INT, "steps", "warmup", "policy", "seed")
# "models" / "machines": lists of DECODE_MODEL / MACHINE tables (one per template); "routing": ROUTING.
SWEEP_DECODE = (Field("variant_f64", F64, ("n_variants", 13)), Field("variant_i32", I32, ("n_variants", 3)),
                Field("kind_f64", F64, ("n_kinds", 3)), Field("kind_i32", I32, ("n_kinds", 3)),
                Field("fn_kv_f", F64, ("n_fns", 5)), Field("fn_kv_c", I64, ("n_fns", 4)),
                Field("fn_sf_f", F64, ("n_fns", 5)), Field("fn_sf_c", I64, ("n_fns", 4)),
                Field("prompt", REAL), Field("mc", TABLE, SWEEP_MC, optional=True,
                                             note="only Monte Carlo sweeps have templates"))

# the arrays of ms_cache_replay(): a step's distinct experts per layer (sel [T, L, W], nsel valid of each
# row) and, for the static policy, each layer's experts by popularity
CACHE_REPLAY = (Field("sel", I32, ("n_steps", "n_layers", "width")), Field("nsel", I32, ("n_steps", "n_layers")),
                Field("hot", I32, ("n_layers", "n_experts"), optional=True, note="only the static policy reads it"))

# ms_prefill_model_t (engine.prefill's kernel path: prefill_terms packed once per lowered model); L layers, S
# ubatch sizes, X layers with routed experts.
PREFILL_MODEL = (_arrays(I32, ("n_layers",), "on_gpu")
                 + _arrays(F64, ("n_layers",), "weights", "flops", "score_flops", "decompress_flops", "act")
                 + (Field("kv_one", F64, ("n_layers",), optional=True, note="CPU attention's KV bytes of one read"),
                    Field("kv_heads", F64, ("n_layers",), optional=True, note="query heads per KV head (with kv_one)"),
                    Field("sizes", I64, ("n_sizes", 2)))
                 + _arrays(F64, ("n_sizes",), "size_rows") + _arrays(I32, ("n_sizes",), "size_tiled")
                 + _arrays(I32, ("n_exp",), "exp_layer", "exp_mode")
                 + _arrays(F64, ("n_exp",), "exp_share", "exp_bytes", "exp_flops", "exp_layer_experts")
                 + (Field("exp_distinct", F64, ("n_sizes", "n_exp")),)
                 + _scalars(INT, "top_k", "threshold", "offload") + _scalars(REAL, "head_bytes", "head_flops", "amx_per_cycle"))
# ms_prefill_machine_t: the machine rates prefill reads (lower_machine's keys of the same names).
PREFILL_MACHINE = (_scalars(REAL, "gpu_bw", "host_bw", "pcie_bw", "pcie_links", "prefill_flops", "prefill_gemm_flops",
                            "prefill_expert_flops", "cpu_flops", "prefill_attn_flops", "cpu_prefill_attn_flops",
                            "launch_s", "cpu_layer_s", "sync_s", "cpu_llc_bytes", "prefill_moe_half_tokens", "amx_flops",
                            "prefill_weight_pass_tokens", "prefill_moe_tile_tokens", "step_s")
                   + _scalars(INT, "overlap", "gpu_moe_rowwise"))

STRUCTS = {
    "ms_model_t": MODEL, "ms_mem_config_t[]": MEM_CONFIG_COLUMNS, "ms_mem_config_t": MEM_CONFIG,
    "ms_decode_model_t": DECODE_MODEL, "ms_machine_t": MACHINE, "ms_routing_t": ROUTING,
    "ms_decode_config_t[]": DECODE_CONFIG_COLUMNS, "ms_sweep_mem_t": SWEEP_MEMORY, "ms_sweep_place_t[]": SWEEP_PLACES,
    "ms_sweep_decode_t": SWEEP_DECODE, "ms_cache_replay()": CACHE_REPLAY,
    "ms_prefill_model_t": PREFILL_MODEL, "ms_prefill_machine_t": PREFILL_MACHINE,
}


# ------------------------------------------------------------------------------- checking
def _get(obj, name):
    if type(obj) is dict:                  # the common case, ahead of the abstract-class check
        return obj.get(name)
    if isinstance(obj, Mapping):           # dicts and read-only views of them (sweep variant tables)
        return obj.get(name)
    return getattr(obj, name, None)


def _scalar(struct: str, f: Field, v):
    if type(v) is float and f.kind == REAL:
        return v
    if type(v) is int and f.kind != REAL and (f.name in _WIDE_SCALARS or _INT32[0] <= v <= _INT32[1]):
        return v
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v[()]
    if f.kind == REAL:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise StructError(struct, f.name, f"expected a real number, got {type(v).__name__}")
        return float(v)
    try:
        i = operator.index(v)
    except TypeError:
        raise StructError(struct, f.name, f"expected an integer, got {type(v).__name__} {v!r}") from None
    if f.name not in _WIDE_SCALARS and not _INT32[0] <= i <= _INT32[1]:
        raise StructError(struct, f.name, f"{i} does not fit the C field's 32 bits")
    return i


# integer scalars the C declares 64-bit (seed: taken modulo 2**64); the rest are int32_t
_WIDE_SCALARS = {"max_context", "request_tokens", "steps", "warmup", "kv_granularity", "seed"}


def _array(struct: str, f: Field, v, dims: dict) -> np.ndarray:
    dtype = np.dtype(f.kind)
    if isinstance(v, np.ndarray) and v.dtype == dtype and v.flags.c_contiguous:
        arr = v                            # already what C reads: only its shape is left to check
    elif dtype == np.uint64:
        try:
            arr = np.array([int(x) & 0xFFFFFFFFFFFFFFFF for x in np.ravel(np.asarray(v, dtype=object))],
                           dtype=np.uint64).reshape(np.shape(v))
        except (TypeError, ValueError):
            raise StructError(struct, f.name, "expected integers") from None
    else:
        raw = np.asarray(v)
        if raw.dtype.kind not in "biuf":
            raise StructError(struct, f.name, f"expected numbers, got an array of {raw.dtype}")
        if dtype.kind == "i" and raw.dtype != dtype and raw.size:
            if raw.dtype.kind == "f" and not np.all(np.isfinite(raw) & (raw == np.round(raw))):
                raise StructError(struct, f.name, "expected integers, got non-integral values")
            info = np.iinfo(dtype)
            if raw.min() < info.min or raw.max() > info.max:
                raise StructError(struct, f.name, f"values outside {dtype} range")
        arr = np.ascontiguousarray(raw, dtype=dtype)
    if len(arr.shape) != len(f.shape):
        raise StructError(struct, f.name, f"expected {len(f.shape)} dimension(s) {_spell(f.shape, dims)}, got shape "
                          f"{arr.shape}")
    for d, size in zip(f.shape, arr.shape):
        want = d if isinstance(d, int) else dims.setdefault(d, size)
        if size != want:
            raise StructError(struct, f.name, f"shape {arr.shape}, expected {_spell(f.shape, dims)}")
    return arr


def _spell(shape: tuple, dims: dict) -> str:
    return "[" + ", ".join(str(d) if isinstance(d, int) else f"{d}={dims[d]}" if d in dims else d for d in shape) + "]"


class Sealed(Mapping):
    """A table the glue checked against its struct once and keeps read-only (:func:`seal`): a private copy
    of the fields, arrays copied and frozen, and the checked values C reads. check_struct returns those
    without checking again, so a table many kernel calls share (a sweep plan's machine rates and memory
    configurations) is validated where it is built, not at every call. Only the glue makes them; any
    other table is checked at every call."""

    __slots__ = ("struct", "checked", "dims", "_data")

    def __init__(self, struct: str, data: dict, checked: dict, dims: dict):
        self.struct, self._data, self.checked, self.dims = struct, data, checked, dims

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def seal(struct: str, table) -> Sealed:
    """*table* (a dict of a STRUCTS struct, top level; a ``[]`` struct's columns) checked once and kept
    read-only: see :class:`Sealed`."""
    data = {}
    for k, v in (table.items() if isinstance(table, Mapping) else vars(table).items()):
        if isinstance(v, np.ndarray):
            v = v.copy()
            v.flags.writeable = False
        data[k] = v
    dims: dict = {}
    checked = check_struct(struct, data, dims)
    return Sealed(struct, data, checked, dims)


def _sealed(struct: str, obj: Sealed, dims: dict) -> dict:
    """A sealed table's checked values, its dimensions bound into (or checked against) *dims*."""
    if obj.struct != struct:
        raise StructError(struct, "*", f"a table sealed as {obj.struct}")
    for d, size in obj.dims.items():
        if dims.setdefault(d, size) != size:
            raise StructError(struct, d, f"dimension {d} is {size}, expected {dims[d]}")
    return dict(obj.checked)                # the caller's to extend (check_columns adds n)


def check_struct(struct: str, obj, dims: dict | None = None, fields: tuple | None = None) -> dict:
    """The declared fields of ``struct`` (STRUCTS) from a dict or object, checked and converted: scalars
    to float / int, arrays to contiguous arrays of the C dtype, nested tables recursively. Dimensions
    named in ``dims`` are fixed; the others are bound by the first field that has them (and returned in
    ``dims``). Raises StructError naming the struct and field; optional fields absent are None. A
    :class:`Sealed` table of this struct was checked when sealed: its checked values are returned."""
    dims = {} if dims is None else dims
    if type(obj) is Sealed and fields is None:
        return _sealed(struct, obj, dims)
    out = {}
    plain = type(obj) is dict
    for f, kind, shape, dtype, fixed_int, wide, d0 in _compiled(STRUCTS[struct] if fields is None else fields):
        v = obj.get(f.name) if plain else _get(obj, f.name)
        if v is None:
            if f.optional:
                out[f.name] = None
                continue
            raise StructError(struct, f.name, "missing" + (f" ({f.note})" if f.note else ""))
        tv = type(v)
        if kind == TABLE:
            out[f.name] = check_struct(f"{struct}.{f.name}", v, dims, shape)
        elif shape is None:
            if tv is float and kind == REAL:
                out[f.name] = v
            elif tv is int and fixed_int and (wide or _INT32[0] <= v <= _INT32[1]):
                out[f.name] = v
            else:
                out[f.name] = _scalar(struct, f, v)
        elif tv is np.ndarray and v.dtype == dtype and v.flags.c_contiguous and (
                _shape_ok(shape, v.shape, dims) if d0 is None else len(v.shape) == 1 and (
                    d0 if type(d0) is int else dims.setdefault(d0, v.shape[0])) == v.shape[0]):
            out[f.name] = v                # already what C reads, of the declared shape (_array's fast path)
        else:
            out[f.name] = _array(struct, f, v, dims)   # converts, or names what is wrong
    return out


def _shape_ok(shape: tuple, got: tuple, dims: dict) -> bool:
    """Whether an array's shape is the field's (binding unbound dimension names, as _array does)."""
    if len(got) != len(shape):
        return False
    for d, size in zip(shape, got):
        if type(d) is not int:
            d = dims.setdefault(d, size)
        if d != size:
            return False
    return True


def _compiled(fields: tuple) -> tuple:
    """(field, kind, shape, C dtype, integer scalar, 64-bit scalar, the dimension of a one-dimensional array
    field (most fields; checked inline) else None) per field, built once per field tuple."""
    hit = _COMPILED.get(id(fields))
    if hit is None or hit[0] is not fields:
        rows = tuple((f, f.kind, f.shape, _DTYPES.get(f.kind), f.shape is None and f.kind == INT,
                      f.name in _WIDE_SCALARS, f.shape[0] if f.kind != TABLE and f.shape and len(f.shape) == 1
                      else None) for f in fields)
        hit = _COMPILED[id(fields)] = (fields, rows)   # holds the tuple: its id stays its own
    return hit[1]


_COMPILED: dict = {}
_DTYPES = {k: np.dtype(k) for k in (F64, I32, I64, U64)}


def check_columns(struct: str, cols, n: int | None = None) -> dict:
    """Columns of n configurations (a ``[]`` struct of STRUCTS), each of length n."""
    dims = {} if n is None else {"n": int(n)}
    out = check_struct(struct, cols, dims)
    out["n"] = dims.get("n", 0)
    return out


def check_che_columns(c: dict, n_layers: int) -> None:
    """The optional table columns of checked config columns (che / che_slots, page_hit / page_hit_slots): both
    or neither, one row per routing layer (the C refuses a count that is negative or not finite, or a hit rate
    above 1, on a che row that names a slot count, and a page_hit rate outside [0, 1]: MS_ERR_BAD_ROUTING)."""
    for name in ("che", "page_hit"):
        tab, slots = c.get(name), c.get(name + "_slots")
        if (tab is None) != (slots is None):
            raise StructError("ms_decode_config_t[]", name, f"{name} and {name}_slots go together")
        if tab is not None and tab.shape[1] != n_layers:
            raise StructError("ms_decode_config_t[]", name, f"{tab.shape[1]} layers, the routing has {n_layers}")


def seal_routing(rt) -> Sealed:
    """A routing table (ms_routing_t) checked once by :func:`check_routing` and kept read-only (see
    :class:`Sealed`): kernels that take it skip the checks (a sweep passes one routing to many calls)."""
    if type(rt) is Sealed and rt.struct == "ms_routing_t":
        return rt
    def frozen(v):
        if isinstance(v, np.ndarray):
            v = v.copy()
            v.flags.writeable = False
        elif isinstance(v, Mapping):            # nested tables (q_tables)
            v = {k: frozen(x) for k, x in v.items()}
        return v

    data = {k: frozen(v) for k, v in rt.items()}
    checked = check_routing(data)
    if checked.get("n_layers") and checked.get("win_lq") is not None:
        from . import _kernel
        # the C checks the window tables (L x E x W values) once here, not at every call: the copies sealed
        # here never change (a malformed table stays unmarked, and every call refuses it)
        checked["windows_checked"] = int(_kernel.check_windows(checked) == 0)
    return Sealed("ms_routing_t", data, checked, {})


def check_routing(rt) -> dict:
    """ms_routing_t checked: its dimensions, the kernel limits (MoesimError naming the field and the
    bound), and the per-layer tables unless the model is dense (n_layers 0). A table :func:`seal_routing`
    sealed was checked then: its checked values are returned."""
    if type(rt) is Sealed and rt.struct == "ms_routing_t":
        return dict(rt.checked)
    head = check_struct("ms_routing_t", rt, {}, ROUTING_DIMS)
    if head["n_layers"] > MAX_MOE_LAYERS:
        raise MoesimError(f"{head['n_layers']} MoE layers exceed the kernel limit MAX_MOE_LAYERS = {MAX_MOE_LAYERS} "
                          "(csrc/moesim.h MS_MAX_MOE_LAYERS)", "ms_routing_t.n_layers")
    if head["top_k"] > MAX_TOP_K:
        raise MoesimError(f"top-{head['top_k']} routing exceeds the kernel limit MAX_TOP_K = {MAX_TOP_K} "
                          "(csrc/moesim.h MS_MAX_TOP_K)", "ms_routing_t.top_k")
    fields = ROUTING if head["n_layers"] > 0 else _ROUTING_DENSE
    dims = {"n_layers": head["n_layers"], "n_experts": head["n_experts"], "top_k": head["top_k"]}
    out = check_struct("ms_routing_t", rt, dims, fields)
    if head["n_layers"] > 0 and dims["n_scenarios"] < 1:
        raise StructError("ms_routing_t", "q", "no request scenarios")
    out["n_scenarios"] = dims.get("n_scenarios", 0)
    if dims.get("history", 0) > MAX_HISTORY:
        raise MoesimError(f"{dims['history']} recency lags exceed MAX_HISTORY = {MAX_HISTORY}", "ms_routing_t.recency")
    if (rt.get("coupling") is None) != (rt.get("partners") is None):
        raise StructError("ms_routing_t", "partners", "coupling and partners come together")
    if (rt.get("win_n") is None) != (rt.get("win_lq") is None):
        raise StructError("ms_routing_t", "win_lq", "win_n and win_lq come together")
    moments = [rt.get(k) is None for k in ("win_m", "win_var", "win_cov")]
    if len(set(moments)) > 1 or (not moments[0] and rt.get("win_lq") is None):
        raise StructError("ms_routing_t", "win_var", "win_m, win_var and win_cov come together, with the windows")
    if dims.get("n_partners", 1) > MAX_PARTNERS:
        raise MoesimError(f"{dims['n_partners']} partners exceed MAX_PARTNERS = {MAX_PARTNERS}", "ms_routing_t.partners")
    _check_memory_tables(out, head["n_experts"])
    for f in ROUTING_LAYERS:
        out.setdefault(f.name, None)
    return out


def _check_memory_tables(t: dict, n_experts: int) -> None:
    """The multi-lag and cross-layer tables hold what the sampler can use (ms_route.c check_memory)."""
    rec, lag, cpl, pt = t.get("recency"), t.get("recency_lag"), t.get("coupling"), t.get("partners")
    if (rec is None) != (lag is None):
        raise StructError("ms_routing_t", "recency_lag", "recency and recency_lag come together")
    if rec is not None and not np.all((rec >= 0) & (rec <= 1)):
        raise MoesimError("recency probabilities must be in [0, 1]", "ms_routing_t.recency")
    if lag is not None and not (np.all((lag >= 0) & (lag <= 1)) and abs(lag.sum() - 1) < 1e-9):
        raise MoesimError("the recency lag distribution must be probabilities summing to 1", "ms_routing_t.recency_lag")
    if cpl is not None and not np.all((cpl >= 0) & (cpl <= 1)):
        raise MoesimError("coupling probabilities must be in [0, 1]", "ms_routing_t.coupling")
    if pt is not None and pt.size and (pt.min() < 0 or pt.max() >= n_experts):
        raise MoesimError(f"partner expert ids must be in [0, {n_experts})", "ms_routing_t.partners")
