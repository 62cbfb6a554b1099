"""Recorded expert-routing traces, read into one canonical form.

``load(path)`` returns a :class:`Trace`: one int32 array ``[tokens, layers, k]`` per request (expert
ids chosen by each token in each logged MoE layer, in generation/prompt order). Four public formats
are understood (see ../shared/traces/README.md):

* vLLM route log JSONL (OLMoE): a ``{"type": "meta"}`` line then ``{"type": "route", "req_id",
  "token_idx", "layer", "topk_ids"}`` rows; rows whose weights are all exactly 1/k come from a
  profiling pass and are dropped;
* speculative-moe JSONL (Mixtral): ``{"problem_id", "layer", "experts", "token_idx"}`` rows;
* moe-beyond CSV (DeepSeek-V2-Lite): ``Layer ID,Batch Number,Token,Activated Expert IDs`` per prompt;
* GPT-OSS expert-fingerprinting JSON: ``router_data`` = ``[{"token_N": {"layer_L": {"selected_experts"}}}]``;
* step-list router dump JSON (Llama-4-Maverick "Patterns behind Chaos" traces): a list of steps, step 0
  the prompt, each ``{layer_id: null | [[ids of token 0], [ids of token 1], ...]}`` (``null``: a dense
  layer, dropped); each later step is one decode token. Its prompt tokens are kept apart
  (``Trace.prompts``) and ``requests`` hold the decode tokens.

A directory loads every trace file in it (one request per CSV/JSON file).
"""
from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass

import numpy as np

from ..errors import MoesimError
from ..spec.limits import ARCH_BOUNDS


_MAX_FILE_BYTES = 512 * 2**20
_MAX_TOP_K = ARCH_BOUNDS["num_experts_per_tok"]
_MAX_EXPERTS = ARCH_BOUNDS["n_routed_experts"]
_MAX_LAYERS = ARCH_BOUNDS["num_hidden_layers"]


@dataclass
class Trace:
    requests: list          # int32 arrays [tokens, layers, k]
    layers: list            # logged layer ids (as recorded)
    top_k: int
    n_experts: int          # 1 + the largest id seen, or the file's own count
    source: str
    # "decode" (generated tokens), "prompt" (teacher-forced prompt tokens) or "unknown" (the format
    # does not say); prompts: each request's prompt tokens where the format records them apart
    phase: str = "unknown"
    prompts: list | None = None

    @property
    def n_tokens(self) -> int:
        return int(sum(r.shape[0] for r in self.requests))

    @property
    def n_prompt_tokens(self) -> int:
        return int(sum(r.shape[0] for r in self.prompts)) if self.prompts else 0


def _bad(path, msg):
    return MoesimError(f"{path}: {msg}", "trace")


def _assemble(path, by_req: dict, layers: list) -> list:
    """{req: {(token, layer): ids}} -> list of [tokens, layers, k] arrays (tokens missing a layer dropped)."""
    out = []
    lidx = {l: i for i, l in enumerate(layers)}
    for req in sorted(by_req, key=str):
        cells = by_req[req]
        tokens = sorted({t for t, _ in cells})
        ks = {len(v) for v in cells.values()}
        if len(ks) != 1:
            raise _bad(path, f"request {req!r} mixes top-k sizes {sorted(ks)}")
        k = ks.pop()
        arr = np.full((len(tokens), len(layers), k), -1, dtype=np.int32)
        for ti, t in enumerate(tokens):
            for l in layers:
                ids = cells.get((t, l))
                if ids is not None:
                    arr[ti, lidx[l]] = ids
        complete = (arr >= 0).all(axis=(1, 2))
        if complete.any():
            out.append(arr[complete])
    return out


def _ids(path, value, where):
    if not isinstance(value, list) or not value or not all(isinstance(x, int) and not isinstance(x, bool)
                                                            and 0 <= x < _MAX_EXPERTS for x in value):
        raise _bad(path, f"{where}: expert ids must be a non-empty list of non-negative integers")
    return value


def _load_jsonl(path) -> Trace:
    by_req, layers, meta = {}, set(), {}
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise _bad(path, f"line {n} is not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise _bad(path, f"line {n} is not a JSON object")
            if row.get("type") == "meta":
                meta = row
                continue
            if "topk_ids" in row:
                ids = _ids(path, row["topk_ids"], f"line {n}")
                w = row.get("topk_weights")
                if isinstance(w, list) and w and all(x == 1.0 / len(w) for x in w):
                    continue  # profiling pass (README: drop rows whose weights are all exactly 1/k)
                req = row.get("req_id")
            elif "experts" in row:
                ids = _ids(path, row["experts"], f"line {n}")
                req = row.get("problem_id")
            else:
                raise _bad(path, f"line {n} has neither 'topk_ids' nor 'experts'")
            try:
                tok, layer = int(row["token_idx"]), int(row["layer"])
            except (KeyError, TypeError, ValueError, OverflowError):   # OverflowError: 1e400 reads as inf
                raise _bad(path, f"line {n} lacks integer 'token_idx'/'layer'") from None
            by_req.setdefault(req, {})[(tok, layer)] = ids
            layers.add(layer)
    if not by_req:
        raise _bad(path, "no routing rows")
    layers = sorted(layers)
    reqs = _assemble(path, by_req, layers)
    return _trace(path, reqs, layers, meta.get("num_experts"))


def _load_csv(path) -> tuple:
    by_layer: dict = {}
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header or [h.strip() for h in header[:4]] != ["Layer ID", "Batch Number", "Token", "Activated Expert IDs"]:
            raise _bad(path, "not a moe-beyond CSV (expected header 'Layer ID,Batch Number,Token,Activated Expert IDs')")
        for n, row in enumerate(reader, 2):
            if len(row) < 4:
                raise _bad(path, f"row {n} has {len(row)} columns")
            try:
                layer = int(row[0])
                ids = json.loads(row[3])
            except (ValueError, json.JSONDecodeError):
                raise _bad(path, f"row {n}: bad layer id or expert list") from None
            by_layer.setdefault(layer, []).append(_ids(path, ids, f"row {n}"))
    if not by_layer:
        raise _bad(path, "no routing rows")
    layers = sorted(by_layer)
    t = min(len(v) for v in by_layer.values())  # rows are grouped by layer, tokens in order
    arr = np.array([[by_layer[l][i] for l in layers] for i in range(t)], dtype=np.int32)
    return arr, layers


def _read_json(path):
    with open(path, encoding="utf-8") as fh:
        try:
            return json.load(fh)
        except json.JSONDecodeError as exc:
            raise _bad(path, f"not JSON ({exc.msg})") from None


def _load_gptoss(path, d) -> tuple:
    rd = d.get("router_data") if isinstance(d, dict) else None
    if not isinstance(rd, list) or not rd:
        raise _bad(path, "no 'router_data' list")
    rows, layers = [], None
    for entry in rd:
        if not isinstance(entry, dict) or len(entry) != 1:
            raise _bad(path, "router_data entries must be {'token_N': {...}}")
        (_tok, per_layer), = entry.items()
        if not isinstance(per_layer, dict):
            raise _bad(path, "router_data token entry must map layer_L to selections")
        keys = sorted(per_layer, key=lambda s: int(str(s).split("_")[-1]))
        if layers is None:
            layers = [int(str(k).split("_")[-1]) for k in keys]
        rows.append([_ids(path, per_layer[k].get("selected_experts"), str(k)) for k in keys])
    return np.array(rows, dtype=np.int32), layers


def _layer_id(path, key) -> int:
    try:
        return int(str(key).rsplit("_", 1)[-1])
    except ValueError:
        raise _bad(path, f"layer key {key!r} is not a layer id") from None


def _step_tokens(path, step, n, layers):
    """One step of a step-list dump -> [tokens, moe layers, k] (dense layers, null, dropped)."""
    if not isinstance(step, dict) or not step:
        raise _bad(path, f"step {n} must map layer ids to expert lists or null")
    moe = {_layer_id(path, key): v for key, v in step.items() if v is not None}
    if not moe:
        raise _bad(path, f"step {n} routes no layer (every layer null)")
    if layers is not None and sorted(moe) != layers:
        raise _bad(path, f"step {n} routes layers {sorted(moe)}, step 0 routes {layers}")
    cols = []
    for l in sorted(moe):
        toks = moe[l]
        if isinstance(toks, list) and toks and all(isinstance(x, int) for x in toks):
            toks = [toks]                          # a decode step may list one token's ids flat
        if not isinstance(toks, list) or not toks:
            raise _bad(path, f"step {n} layer {l}: expected per-token expert lists")
        cols.append([_ids(path, t, f"step {n} layer {l}") for t in toks])
    if len({len(c) for c in cols}) != 1:
        raise _bad(path, f"step {n}: layers disagree on the number of tokens")
    return np.array(cols, dtype=np.int32).transpose(1, 0, 2), sorted(moe)


def _load_steplist(path, steps) -> Trace:
    if not steps:
        raise _bad(path, "empty step list")
    prompt, layers = _step_tokens(path, steps[0], 0, None)
    decode = [_step_tokens(path, st, n, layers)[0] for n, st in enumerate(steps[1:], 1)]
    dec = np.concatenate(decode) if decode else np.zeros((0,) + prompt.shape[1:], dtype=np.int32)
    tr = _trace(path, [dec if len(dec) else prompt], layers)
    tr.phase = "decode" if len(dec) else "prompt"
    tr.prompts = [prompt] if len(dec) else None
    return tr


def _trace(path, reqs, layers, n_experts=None) -> Trace:
    if not reqs:
        raise _bad(path, "no complete tokens")
    top = {r.shape[2] for r in reqs}
    if len(top) != 1:
        raise _bad(path, f"requests disagree on top-k: {sorted(top)}")
    k = top.pop()
    if reqs[0].ndim != 3 or not 1 <= k <= _MAX_TOP_K:
        raise _bad(path, f"top-k must be in [1, {_MAX_TOP_K}], got {k}")
    mx = int(max(r.max() for r in reqs)) + 1
    if n_experts is not None:
        if isinstance(n_experts, bool) or not isinstance(n_experts, int) or not mx <= n_experts <= _MAX_EXPERTS:
            raise _bad(path, f"num_experts must be an integer in [{mx}, {_MAX_EXPERTS}] (the largest id + 1 "
                             f"and the plausible maximum), got {n_experts!r}")
    elif mx > _MAX_EXPERTS:
        raise _bad(path, f"expert id {mx - 1} is above the plausible maximum {_MAX_EXPERTS - 1}")
    if len(layers) > _MAX_LAYERS:
        raise _bad(path, f"{len(layers)} logged layers is above the plausible maximum {_MAX_LAYERS}")
    return Trace(requests=reqs, layers=list(layers), top_k=k, n_experts=int(n_experts or mx), source=str(path))


def _phase(tr: Trace, phase: str) -> Trace:
    tr.phase = phase
    return tr


def load(path) -> Trace:
    """Read a trace file, or a directory of per-request trace files, into a :class:`Trace`."""
    path = os.fspath(path)
    if os.path.isdir(path):
        files = sorted(f for f in os.listdir(path) if f.endswith((".csv", ".json", ".jsonl")))
        if not files:
            raise _bad(path, "directory holds no .csv/.json/.jsonl trace files")
        parts = [load(os.path.join(path, f)) for f in files]
        layers = parts[0].layers
        if any(p.layers != layers for p in parts):
            raise _bad(path, "files log different layers")
        reqs = [r for p in parts for r in p.requests]
        tr = _trace(path, reqs, layers, max(p.n_experts for p in parts))
        tr.phase = parts[0].phase if all(p.phase == parts[0].phase for p in parts) else "unknown"
        if all(p.prompts for p in parts):
            tr.prompts = [r for p in parts for r in p.prompts]
        return tr
    if not os.path.isfile(path):
        raise MoesimError(f"no such trace file: {path}", "trace")
    if os.path.getsize(path) > _MAX_FILE_BYTES:
        raise _bad(path, f"larger than {_MAX_FILE_BYTES >> 20} MiB")
    if not path.endswith((".jsonl", ".csv", ".json")):
        raise _bad(path, "unknown trace format (expected .jsonl, .csv or .json)")
    try:
        if path.endswith(".jsonl"):
            return _load_jsonl(path)
        if path.endswith(".csv"):
            arr, layers = _load_csv(path)
            return _phase(_trace(path, [arr], layers), "prompt")   # moe-beyond: teacher-forced prompts
        d = _read_json(path)
        if isinstance(d, list):
            return _load_steplist(path, d)
        arr, layers = _load_gptoss(path, d)
        return _phase(_trace(path, [arr], layers), "decode")      # generated tokens
    except MoesimError:
        raise
    except OSError as exc:
        raise _bad(path, f"cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, ValueError, TypeError, AttributeError, KeyError, IndexError, RecursionError,
            OverflowError) as exc:
        # a malformed file: ragged rows, wrong types where ids or layer names belong, bad encoding
        raise _bad(path, f"malformed trace ({type(exc).__name__}: {str(exc)[:120]})") from None
