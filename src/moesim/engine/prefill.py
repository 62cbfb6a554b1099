"""The prefill (prompt processing) model: per-ubatch GEMMs, weight streaming, attention at depth."""
from __future__ import annotations

import math

import numpy as np

from ..spec.models import Model
from ..spec.runtimes import Runtime
from .codes import EXP_FETCH, EXP_GPU, EXP_NONE, EXP_SPLIT
from .glue import handle_library_error, kernel_module
from .lower.activations import prompt_activation_bytes
from .lower.decode_model import FA_TILE_Q, op_offload_threshold
from .lower.attention import ctx_eval, full_window_fn, mla_decompress_flops, prefill_score_flops, prefill_score_fn


def prefill(m: Model, dm: dict, hw: dict, rtab: dict, rt: Runtime, prompt: int, batch: int = 1,
            depth: int = 0) -> tuple:
    """(prefill tokens/s, time to first token) for a ``prompt``-token prompt on top of ``depth`` cached
    tokens, per ubatch (DESIGN §3); attention as :func:`prefill_score_flops`.

    Each ubatch reads every weight it uses once and then runs its tokens' multiply-adds at the prefill
    GEMM rate (the two add); experts in host RAM are computed on the CPU, or, under llama.cpp's op offload
    (ubatch >= 32) and on expert-cache engines, the experts the ubatch uses are copied over PCIe
    (RT §1.1-1.2). A ubatch of n tokens uses sum_e 1 - (1 - q_e)^n distinct experts per layer."""
    return rate_ttft(prompt, prefill_seconds(m, dm, hw, rtab, rt, prompt, depth), batch)


def rate_ttft(prompt: int, seconds: float, batch: int) -> tuple:
    """(prefill tokens/s, time to first token) of ``batch`` prompts from one prompt's
    :func:`prefill_seconds` (the batch's prompts run one after another)."""
    ttft = seconds * batch
    return prompt * batch / ttft, ttft


def prefill_seconds(m: Model, dm: dict, hw: dict, rtab: dict, rt: Runtime, prompt: int, depth: int = 0,
                    terms: "dict | None" = None, parts: "dict | None" = None) -> float:
    """Seconds to prefill one ``prompt``-token prompt (:func:`prefill`'s sum over ubatches). ``terms``:
    :func:`prefill_terms` of these arguments (a sweep keeps them per lowered model and routing). ``parts``, a
    dict, receives the seconds by phase (:data:`PREFILL_PHASES`), which sum to the total."""
    if terms is not None and parts is None:
        return _kernel_seconds(terms, dm, hw)       # the same arithmetic in C (ms_prefill.c), equal to the bit
    x = prefill_terms(m, dm, rtab, rt, prompt, depth) if terms is None else terms
    on_gpu, threshold, k = x["on_gpu"], x["threshold"], x["k"]
    gflops, gemm, cflops = hw["prefill_flops"], hw["prefill_gemm_flops"], hw["cpu_flops"]
    bw = np.where(on_gpu, hw["gpu_bw"], hw["host_bw"])
    fl = np.where(on_gpu, gemm, cflops)
    score = x["score_flops"] / np.where(on_gpu, hw["prefill_attn_flops"], hw["cpu_prefill_attn_flops"])
    # MLA's multi-head prefill decompresses the context's latent keys once per ubatch (a GEMM)
    decompress = x["decompress_flops"] / fl
    per_tok = x["flops"] / fl + score
    experts, kv = x["experts"], x["kv"]
    # ggml-cpu's 64-row tiled flash attention multiplies like a matmul: the scores of the CPU's layers at its
    # matmul rate, not at the per-row walk's share (cpu_prefill_attn_eff)
    score_tiled = x["score_flops"] / np.where(on_gpu, hw["prefill_attn_flops"], cflops) if kv is not None else score
    total = 0.0
    for n_tok, count in x["sizes"]:
        tiled = kv is not None and _fa_rows_per_read(dm, n_tok) >= FA_TILE_Q
        sc = score_tiled if tiled else score
        pt = x["flops"] / fl + sc if tiled else per_tok
        # a ubatch streams each weight matrix once and its tiles' loads are not hidden behind the
        # multiply-adds (llama.cpp PR #8495: LLaMA-8B Q5_K_S on a 4090 takes 9.1 ms per 16-token and
        # 48 ms per 512-token ubatch, weight reads + per-token work, not their max)
        # ... once per tile of tokens where the GPU's GEMM kernels tile them (weight_passes)
        reads = x["weights"] * np.where(on_gpu, weight_passes(hw, n_tok), 1.0) / bw
        # the graph's ops stream their activations through the GPU's memory (engine.lower.activations; 0 on
        # the CPU's layers, whose per-op tensors of a ubatch stay largely in its caches, and for fused runtimes)
        acts = n_tok * x["act"] / bw
        t = reads + n_tok * pt + acts + decompress + np.where(on_gpu, hw["launch_s"], hw["cpu_layer_s"])
        t_kv = 0.0
        if kv is not None:
            # the CPU's attention walks stream the KV while they score it: only the reads its arithmetic does not
            # cover add to the layer (a roofline, assumed: no measurement splits the two)
            t_kv = _kv_reads(dm, kv, n_tok, hw.get("cpu_llc_bytes", 0.0)) / hw["host_bw"]
            t_kv = np.maximum(t_kv - n_tok * sc, 0.0)        # GPU layers read none of it: 0 there
            t += t_kv
        t_exp = 0.0
        if experts is not None:
            # KT switches per forward: a chunk of num_tokens >= the threshold streams (KTSGL kt_ep_wrapper.py)
            t_exp = _expert_times(experts, dm, hw, n_tok, k, hw.get("prefill_expert_flops", gemm), cflops,
                                  x["terms"], layerwise=0 < threshold <= n_tok, offload=x["offload"],
                                  rowwise=bool(hw.get("gpu_moe_rowwise", 0)))
            t[experts["layers"]] += t_exp
        t_ub = float(t.sum()) + dm["head_bytes"] / hw["gpu_bw"] + dm["head_flops"] / gflops
        total += count * t_ub
        if parts is not None:
            phases = dict(weight_reads=reads, dense_gemm=n_tok * x["flops"] / fl,
                          attention=n_tok * sc, mla_decompress=decompress, cpu_kv_reads=t_kv, experts=t_exp,
                          activations=acts)
            _add_parts(parts, count, t_ub, phases)
    # the host builds and schedules the prompt's first graph before the device starts on it (the runtime's
    # per-step host work, step_s; later ubatches' graphs are built while the device runs the one before)
    step = hw.get("step_s", 0.0) if len(x["sizes"]) else 0.0
    if parts is not None:
        parts["launch_head"] = parts.get("launch_head", 0.0) + step
    return total + step


# ggml-cuda's MMQ tile widths step by 8 tokens, and up to 8 tokens MUL_MAT_ID runs the mat-vec kernel instead
# (mmq.cuh mul_mat_q_case's mmq_x loop; MMVQ_MAX_BATCH_SIZE)
MMQ_X_STEP = 8.0


def weight_passes(hw: dict, n_tok: int) -> float:
    """How many times a GPU GEMM of ``n_tok`` tokens reads its weights from memory: once per tile of
    ``prefill_weight_pass_tokens`` tokens (ggml-cuda's MMQ: mmq_x columns per tile; ggml-vulkan's mul_mm: BN;
    runtimes.toml [backends.*] weight_pass_tokens), once where the machine has no such term."""
    tile = hw.get("prefill_weight_pass_tokens", 0.0)
    return math.ceil(n_tok / tile) if tile > 0 else 1.0


def _kernel_seconds(x: dict, dm: dict, hw) -> float:
    """:func:`prefill_seconds` of terms ``x`` by ms_prefill_seconds: the terms are packed for the kernel once
    (kept in ``x``, which a sweep shares among the machines that run its lowered model), the machine once per
    table (:func:`_kernel_machine`)."""
    code, seconds = kernel_module().prefill_seconds(_packed(x, dm), _kernel_machine(hw))
    handle_library_error(code, "ms_prefill_seconds")
    return seconds


def kernel_seconds_many(items: list) -> list:
    """:func:`prefill_seconds` of each (terms, lowered model, machine rates) in ``items`` (terms: :func:`prefill_terms`'s,
    as a sweep keeps them), in one kernel call: the same ms_prefill_seconds per item as ``terms=`` calls, each
    item's terms packed for the kernel once (kept in them) and each machine table once."""
    models = [_packed(x, dm) for x, dm, _ in items]
    code, bad, seconds = kernel_module().prefill_many(models, [_kernel_machine(hw) for _, _, hw in items])
    handle_library_error(code, "ms_prefill_seconds", bad)
    return seconds


def _packed(x: dict, dm: dict):
    """Terms ``x``'s ms_prefill_model_t, packed once and kept in ``x``."""
    model = x.get("kernel")
    if model is None:
        model = x["kernel"] = kernel_module().PrefillModel(_kernel_model(x, dm))
    return model


def _kernel_model(x: dict, dm: dict) -> dict:
    """Terms ``x`` of lowered model ``dm`` as ms_prefill_model_t's fields (glue.PREFILL_MODEL): the ubatch
    sizes' KV-walk rows and each expert layer's distinct experts per size computed here, as prefill_seconds
    would per call."""
    e, kv, sizes = x["experts"], x["kv"], x["sizes"]
    rows = [float(_fa_rows_per_read(dm, n)) if kv is not None else 0.0 for n, _ in sizes]
    n_exp = 0 if e is None else len(e["layers"])
    exp = dict(exp_layer=np.zeros(0, np.int32), exp_mode=np.zeros(0, np.int32), exp_share=np.zeros(0),
               exp_bytes=np.zeros(0), exp_flops=np.zeros(0), exp_layer_experts=np.zeros(0))
    if e is not None:
        exp = dict(exp_layer=e["layers"].astype(np.int32), exp_mode=e["mode"].astype(np.int32), exp_share=e["gpu_share"],
                   exp_bytes=e["eb"], exp_flops=e["ef"], exp_layer_experts=e["layer_experts"])
    distinct = [_distinct(e, n, x["terms"]) for n, _ in sizes] if e is not None else []
    return dict(on_gpu=x["on_gpu"].astype(np.int32), weights=x["weights"], flops=x["flops"],
                score_flops=x["score_flops"], decompress_flops=x["decompress_flops"], act=x["act"],
                kv_one=None if kv is None else kv[0], kv_heads=None if kv is None else np.asarray(kv[1], dtype=np.float64),
                sizes=np.array(sizes, dtype=np.int64).reshape(-1, 2), size_rows=np.array(rows, dtype=np.float64),
                size_tiled=np.array([r >= FA_TILE_Q for r in rows], dtype=np.int32),
                exp_distinct=np.array(distinct, dtype=np.float64).reshape(len(sizes), n_exp), **exp,
                top_k=int(x["k"]), threshold=int(x["threshold"]), offload=int(bool(x["offload"])),
                head_bytes=dm["head_bytes"], head_flops=dm["head_flops"],
                amx_per_cycle=dm.get("amx_flops_per_cycle", 0.0))


def _kernel_machine(hw):
    """ms_prefill_machine_t of machine table ``hw`` (:func:`prefill_seconds`'s defaults for the keys it reads
    with one), built once per table object."""
    hit = _MACHINES.get(id(hw))
    if hit is None or hit[0] is not hw:
        from . import _kernel
        t = {k: hw[k] for k in _MACHINE_KEYS}
        t.update(prefill_expert_flops=hw.get("prefill_expert_flops", hw["prefill_gemm_flops"]),
                 cpu_llc_bytes=hw.get("cpu_llc_bytes", 0.0),
                 prefill_moe_half_tokens=hw.get("prefill_moe_half_tokens", 0.0),
                 prefill_weight_pass_tokens=hw.get("prefill_weight_pass_tokens", 0.0),
                 prefill_moe_tile_tokens=hw.get("prefill_moe_tile_tokens", 0.0), step_s=hw.get("step_s", 0.0),
                 overlap=int(bool(hw["overlap"])), gpu_moe_rowwise=int(bool(hw.get("gpu_moe_rowwise", 0))))
        if len(_MACHINES) > _MAX_MACHINES:
            _MACHINES.clear()
        hit = _MACHINES[id(hw)] = (hw, _kernel.PrefillMachine(t))     # holds hw, so its id stays its own
    return hit[1]


_MACHINES: dict = {}
# above the machine tables a sweep keeps (the 59-machine website grid: 5,576 (machine, runtime, placement kind,
# kernel mix) tables; at 4,096 every warm sweep cleared and packed them all again)
_MAX_MACHINES = 16384
_MACHINE_KEYS = ("gpu_bw", "host_bw", "pcie_bw", "pcie_links", "prefill_flops", "prefill_gemm_flops", "cpu_flops",
                 "prefill_attn_flops", "cpu_prefill_attn_flops", "launch_s", "cpu_layer_s", "sync_s", "amx_flops")


# the phases explain reports a prompt's seconds by: dense weight reads, dense GEMMs (attention projections,
# shared experts, dense FFNs), attention scores, MLA's latent decompression, the CPU attention's reads of the KV
# cache, routed experts (their reads, GEMMs, copies and CPU work together), the graph's activation traffic and
# the fixed rest (per-layer launch, the output head)
PREFILL_PHASES = ("weight_reads", "dense_gemm", "attention", "mla_decompress", "cpu_kv_reads", "experts",
                  "activations", "launch_head")


def _add_parts(parts: dict, count: int, t_ub: float, phases: dict) -> None:
    """Add ``count`` ubatches of ``t_ub`` seconds, split by ``phases`` (per-layer arrays), to ``parts``; the
    fixed costs are what remains of ``t_ub``."""
    sums = {k: float(np.sum(v)) for k, v in phases.items()}
    sums["launch_head"] = t_ub - sum(sums.values())
    for k in PREFILL_PHASES:
        parts[k] = parts.get(k, 0.0) + count * sums[k]


def prefill_terms(m: Model, dm: dict, rtab: dict, rt: Runtime, prompt: int, depth: int = 0) -> dict:
    """What :func:`prefill_seconds` reads of its arguments besides the machine rates: the ubatch sizes, the
    layers' placement, weights and FLOPs, the routed-expert and CPU-KV terms. They depend on the lowered
    model, routing, runtime, prompt and depth alone, so machines that share a lowered model share them."""
    threshold = dm.get("layerwise_prefill", 0)
    if threshold > 0:
        # kt-kernel under SGLang: the scheduler cuts a prompt into chunked-prefill-size forwards
        ub = max(1, min(prompt, rt.decode.layerwise_chunk_tokens))
    else:
        ub = max(1, min(prompt, rt.ubatch or rt.prefill_step or 2048))
    n_full, last = divmod(prompt, ub)
    on_gpu = np.asarray(dm["attn_on_gpu"], dtype=bool)
    mode = np.asarray(dm["expert_mode"])
    # prompt tokens route by the profile's prefill regime (or a trace's recorded prompts) where it has one
    terms = _routing_terms(rtab.get("prefill_q", rtab.get("q"))) if rtab.get("n_layers") else None
    mean_keys = depth + max(1, prompt // 2)     # the keys a prompt token attends to, on average
    # op offload copies CPU experts to a GPU, so only where there is one (a CPU-only run computes them in place)
    offload = bool(dm.get("gpu_offload", 1)) and ub >= op_offload_threshold(rt, m)
    out = dict(threshold=threshold, sizes=[(ub, n_full)] + ([(last, 1)] if last else []),
                offload=offload, on_gpu=on_gpu, k=rtab.get("top_k", 0), terms=terms,
                score_flops=_score_flops(m, rt, on_gpu, prompt, depth),
                # a runtime that attends on the latent (absorbed) decompresses no keys
                decompress_flops=mean_keys * mla_decompress_flops(m) * (not rt.decode.mla_prefill_absorbed),
                weights=np.asarray(dm["attn_bytes"]) + np.asarray(dm["shared_bytes"]),
                act=prompt_activation_bytes(m) * on_gpu if rt.decode.prompt_activations else np.zeros(m.n_layers),
                flops=np.asarray(dm["attn_flops"]) + np.asarray(dm["shared_flops"]),
                experts=_expert_layers(dm, rtab, mode, np.asarray(dm["moe_index"]), terms),
                kv=_cpu_kv_reads(dm, on_gpu, mean_keys))
    for v in out.values():
        if isinstance(v, np.ndarray):
            v.flags.writeable = False   # read-only: every machine's prefill of this lowered model reads them
    return out


def _score_flops(m: Model, rt: Runtime, on_gpu: np.ndarray, prompt: int, depth: int) -> np.ndarray:
    """:func:`prefill_score_flops`, the GPU's sliding-window layers over the whole cache under ``swa_full``
    (engine.lower.attention.full_window_fn; the CPU's kernel skips masked keys)."""
    absorbed = rt.decode.mla_prefill_absorbed
    score = prefill_score_flops(m, prompt, depth, absorbed)
    if rt.decode.swa_full:
        keys = depth + max(1, prompt // 2)
        for l, layer in enumerate(m.layers):
            if on_gpu[l]:
                score[l] = ctx_eval(full_window_fn(prefill_score_fn(layer, absorbed), layer), keys)
    return score


def _cpu_kv_reads(dm: dict, on_gpu: np.ndarray, context: int):
    """(KV bytes of one read at the prompt's mean context, query heads per KV head) of the layers whose
    attention runs on the CPU, zero elsewhere; None when no layer does or the model was lowered without
    them."""
    if "prefill_kv_fns" not in dm or on_gpu.all():
        return None
    one = np.array([0.0 if g else ctx_eval(fn, context) for fn, g in zip(dm["prefill_kv_fns"], on_gpu)])
    return one, np.asarray(dm["prefill_kv_heads"])


def _fa_rows_per_read(dm: dict, n_tok: int) -> float:
    """Query rows of a ``n_tok``-token ubatch that share one walk of the KV in CPU attention: the lowered tile
    (64 on an F16/F32 cache: ggml-cpu's tiled path) from 64 rows on, else the per-row walk's cpu_fa_query_rows;
    0 for kernels that read the KV once per ubatch."""
    return dm["cpu_fa_tile"] if n_tok >= FA_TILE_Q else dm["cpu_fa_rows"]


def _kv_reads(dm: dict, kv: tuple, n_tok: int, llc: float = 0.0) -> np.ndarray:
    """KV bytes a ``n_tok``-token ubatch reads from DRAM per layer in CPU attention: once per ubatch for tiled
    kernels (cpu_fa_query_rows 0) and recurrent layers, else once per group of cpu_fa_query_rows query rows
    per query head (ggml-cpu's one_chunk path walks the KV for every row; its tiled path for every
    GGML_FA_TILE_Q rows, from 64 rows on). The walks after the first re-read rows the CPU's last-level cache
    (``llc`` bytes) still holds: only the share of the layer's KV beyond it comes from DRAM again (the threads
    walk every KV head of the layer together); without a catalogued cache, all of it."""
    one, heads = kv
    rows = _fa_rows_per_read(dm, n_tok)
    if rows <= 0:
        return one
    walks = np.where(heads > 0, math.ceil(n_tok / rows) * heads, 1.0)
    spill = np.clip(1.0 - llc / np.maximum(one, 1e-300), 0.0, 1.0) if llc > 0 else 1.0
    return one * (1.0 + (walks - 1.0) * spill)


def _expert_layers(dm: dict, rtab: dict, mode: np.ndarray, moe_idx: np.ndarray, terms) -> "dict | None":
    """The layers with routed experts and what their prefill cost reads: each layer's mean inclusion
    probabilities (of the routing's :func:`_routing_terms`), its expert mode, and the share of its expert
    traffic that the GPU's pinned experts serve (the hottest ``slots`` experts of a split layer, all of a
    GPU layer)."""
    if terms is None:
        return None
    layers = np.nonzero(mode != EXP_NONE)[0]
    if layers.size == 0:
        return None
    rows = moe_idx[layers]
    q = _layer_q(terms, rows)
    lmode = mode[layers]
    gpu_share = (lmode == EXP_GPU).astype(float)
    split = np.nonzero(lmode == EXP_SPLIT)[0]
    if split.size:
        hot = np.asarray(rtab["hot"])[moe_idx[layers[split]]]
        slots = np.asarray(dm["slots"])[layers[split]]
        pinned = np.arange(hot.shape[1])[None, :] < slots[:, None]
        hot_q = np.take_along_axis(q[split], hot, axis=1)
        gpu_share[split] = np.where(pinned, hot_q, 0.0).sum(axis=1) / np.maximum(q[split].sum(axis=1), 1e-300)
    take = lambda key: np.asarray(dm[key], dtype=float)[layers]   # noqa: E731
    return dict(layers=layers, moe_rows=rows, q=q, mode=lmode, gpu_share=gpu_share, eb=take("expert_bytes"),
                ef=take("expert_flops"), layer_experts=take("layer_experts"))


def _routing_terms(q) -> dict:
    """What prefill reads of a routing's inclusion probabilities q [scenarios, layers, experts] that depends
    on q alone, kept per q array (the routing lowering's cached tables; every quant, placement and machine
    of a model shares them): ``qbar``, the mean over scenarios, its rows per set of MoE layers
    (:func:`_layer_q`) and the distinct experts per ubatch size (:func:`_distinct`)."""
    if not isinstance(q, np.ndarray):
        return {"qbar": np.asarray(q).mean(axis=0)}
    hit = _TERMS.get(id(q))
    if hit is None or hit[0] is not q:
        if len(_TERMS) > 256:
            _TERMS.clear()
        qbar = q.mean(axis=0)
        qbar.flags.writeable = False
        hit = _TERMS[id(q)] = (q, {"qbar": qbar})       # holds q, so its id stays its own
    return hit[1]


_TERMS: dict = {}


def _layer_q(terms: dict, rows: np.ndarray) -> np.ndarray:
    """qbar's rows of these MoE layers, read-only, kept in *terms* per row set: every quant and placement
    of a model asks for the same few, and copying [layers, experts] per call costs more than the lookup."""
    key = ("q", rows.tobytes())
    hit = terms.get(key)
    if hit is None:
        hit = terms["qbar"][rows]
        hit.flags.writeable = False
        terms[key] = hit
    return hit


def _distinct(x: dict, n_tok: int, terms: "dict | None") -> np.ndarray:
    """Expected distinct experts a ubatch of ``n_tok`` tokens uses in each layer of :func:`_expert_layers`:
    sum_e 1 - (1 - q_e)^n (routing alone: kept in *terms* per layer set and size)."""
    key = ("distinct", x["moe_rows"].tobytes(), n_tok)
    hit = terms.get(key) if terms is not None else None
    if hit is None:
        hit = (1.0 - (1.0 - x["q"]) ** n_tok).sum(axis=1)
        if terms is not None:
            hit.flags.writeable = False
            terms[key] = hit
    return hit


def _expert_times(x: dict, dm: dict, hw: dict, n_tok: int, k: int, gemm: float, cflops: float, terms,
                  layerwise: bool, offload: bool, rowwise: bool = False) -> np.ndarray:
    """Routed-expert seconds of one ubatch of ``n_tok`` tokens, per layer of :func:`_expert_layers`."""
    share, eb, ef = x["gpu_share"], x["eb"], x["ef"]
    distinct = _distinct(x, n_tok, terms)
    pairs = float(n_tok * k)
    half, tile = hw.get("prefill_moe_half_tokens", 0.0), hw.get("prefill_weight_pass_tokens", 0.0)
    per_expert = pairs / np.maximum(distinct, 1e-300)
    if half > 0:
        # a backend whose expert GEMMs lose rate on the few tokens each used expert gets (per-expert tiles
        # padded, launched one expert at a time): half the dense rate at `half` tokens per used expert
        gemm = gemm * per_expert / (per_expert + half)
    width_max = hw.get("prefill_moe_tile_tokens", 0.0)
    if width_max > 0 and n_tok > MMQ_X_STEP:
        # a tile as wide as the ubatch (up to its widest) for every used expert, padded past the expert's own
        # tokens: its whole tiles' columns are computed (runtimes.toml moe_padded_tiles)
        width = min(MMQ_X_STEP * math.ceil(n_tok / MMQ_X_STEP), width_max)
        tiles = np.minimum(np.maximum(per_expert / width + 0.5, 1.0), math.ceil(n_tok / width))
        gemm = gemm * per_expert / (tiles * width)
    # as for the dense GEMMs, each used expert's weights are read once per ubatch on top of its
    # multiply-adds (it serves only pairs / distinct tokens of the ubatch), once per tile of its tokens where
    # the kernels tile them (the last tile half full on average); a token-by-token MUL_MAT_ID
    # (llama.cpp before Jan 2024, PR #4406 / #4725) streams them once per token-expert pair, as decode does
    passes = np.maximum(per_expert / tile + 0.5, 1.0) if tile > 0 else 1.0
    reads = pairs if rowwise else distinct * passes
    t_gpu = reads * share * eb / hw["gpu_bw"] + pairs * share * ef / gemm
    host_distinct, host_pairs = distinct * (1 - share), pairs * (1 - share)
    if not (host_pairs > 0).any():
        return t_gpu                # every used expert on the GPU: the host terms below would go unused
    t_cgpu = host_distinct * passes * eb / hw["gpu_bw"] + host_pairs * ef / gemm
    if layerwise:
        # the layer's whole expert set crosses PCIe (double-buffered expert by expert), then the GPU
        # computes the layer: the load synchronises the device before and after it (KTSGL
        # kt_ep_wrapper.py load()), so copy and compute add. Under tensor parallelism each GPU pulls
        # its own slice over its own link, all fed from host DRAM
        t_copy = x["layer_experts"] * eb * (1 - share) / min(hw["pcie_bw"] * hw["pcie_links"], hw["host_bw"])
        host = t_gpu + t_copy + t_cgpu
    else:
        t_copy = host_distinct * eb / hw["pcie_bw"]
        fetched = t_gpu + (np.maximum(t_copy, t_cgpu) if hw["overlap"] else t_copy + t_cgpu)
        # AMX tiles once the ubatch gives each expert more than 4 tokens on average (RT §5.1)
        amx = hw["amx_flops"] * dm["amx_flops_per_cycle"]
        rate = np.where(host_pairs > 4.0 * np.maximum(host_distinct, 1e-300), max(cflops, amx), cflops)
        t_cpu = host_distinct * eb / hw["host_bw"] + host_pairs * ef / rate
        computed = (np.maximum(t_gpu, t_cpu) if hw["overlap"] else t_gpu + t_cpu) + hw["sync_s"]
        host = np.where(offload | (x["mode"] == EXP_FETCH), fetched, computed)
    return np.where(host_pairs > 0, host, t_gpu)
