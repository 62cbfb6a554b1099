"""What to type to run a configuration, said in each runtime's own terms, and why.

One place turns a placement into runtime settings (``fit``'s ``flags``, the ``advice`` of ``fit`` and
``simulate``, each point of ``plan``):

* llama.cpp / ik_llama.cpp: ``llama-server`` flags. Placement by ``-ngl``, ``--cpu-moe``,
  ``--n-cpu-moe N`` and ``-ot PATTERN=DEVICE`` (LCPP ``common/arg.cpp``; llama.cpp PRs #14992, #15077;
  ik_llama.cpp PR #672 ports both options), placed by the rules :mod:`moesim.spec.overrides` applies to
  tensor names, so the flags reproduce the simulated placement tensor by tensor. ``-fa on`` (llama.cpp's
  -fa takes on|off|auto; ik_llama.cpp has flash attention on by default, its PR #863). ``-c`` is the cells of
  all slots together (``n_ctx_seq = n_ctx / n_seq_max``, ../shared/reference/runtimes.md §1.5), quantized
  V caches need flash attention (§1.5), MTP drafting is ``--spec-type draft-mtp --spec-draft-n-max N``
  (llama.cpp PR #22673, merged 2026-05).
* Ollama: Modelfile parameters (``num_gpu`` is passed as ``-ngl``, ``num_ctx``) and environment variables
  (``OLLAMA_FLASH_ATTENTION``, ``OLLAMA_KV_CACHE_TYPE``, ``OLLAMA_NUM_PARALLEL``); Ollama runs upstream
  ``llama-server`` and starts it with ``-c num_ctx x num_parallel -np num_parallel`` (runtimes.md §7).
  Expert placement has no Modelfile parameter: llama-server reads ``LLAMA_ARG_CPU_MOE`` /
  ``LLAMA_ARG_N_CPU_MOE`` from the environment Ollama starts it in (third-party report, ollama issue
  #11772, runtimes.md §7).
* vLLM / SGLang: ``--tensor-parallel-size`` / ``--tp``, ``--max-model-len`` / ``--context-length``,
  ``--kv-cache-dtype``, ``--quantization`` only where the checkpoint is quantized online (vLLM reads a
  pre-quantized checkpoint's format from its config), MTP as vLLM ``--speculative-config`` (docs.vllm.ai
  features/speculative_decoding/mtp) or SGLang's EAGLE options (runtimes.md §3.3).
"""
from __future__ import annotations

import shlex

from .._catalog import load as _load_catalog
from ..spec.overrides import n_blocks
from ..spec import quants as Q
from ..spec.runtimes import catalog_ubatch
from .speculation import accepted_per_step

GB = 1e9
_GPU_DEVICE = {"nvidia": "CUDA0", "amd": "ROCm0", "intel": "SYCL0"}   # ggml's name of the first GPU buffer
_LLAMA_KV = ("f16", "f32", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")
_OLLAMA_KV = ("f16", "q8_0", "q4_0")      # OLLAMA_KV_CACHE_TYPE's values (Ollama docs/faq.mdx, runtimes.md §7)
_SERVED_KV = {"vllm": {"fp8": "fp8"}, "sglang": {"fp8": "fp8_e4m3", "fp4": "fp4_e2m1"}, "trtllm": {"fp8": "fp8"}}
# the output layer: every tensor llama.cpp gives that layer starts "output" (output.weight, output_norm.*)
OUTPUT_LAYER_REGEX = "^output"


def gpu_device(machine) -> str:
    """ggml's buffer-type name of the machine's first GPU (CUDA0 for NVIDIA, ROCm0, SYCL0; Metal on Apple)."""
    if machine.unified:
        return "Metal" if (machine.cpu_isa and "neon" in machine.cpu_isa) else "CUDA0"
    gpus = _load_catalog("hardware").get("gpu", {})
    return _GPU_DEVICE.get(str(gpus.get(machine.gpu, {}).get("vendor", "nvidia")), "CUDA0")


def model_file(m, quant, gguf: bool = True) -> str:
    """The weights a command loads: the file the model was read from, else the quant's GGUF file for
    llama.cpp (*gguf*), the checkpoint (named by the model id) for a server that loads checkpoints."""
    if quant.is_stored and m.stored is not None and m.stored.files:
        return str(m.stored.files[0])
    return f"{m.id}-{quant.id}.gguf" if gguf and quant.is_gguf else m.id


# ------------------------------------------------------------------------------------ llama.cpp
def llama_placement(p, m, machine) -> tuple:
    """(argv, exact, why) placing the model's tensors as placement *p*: *exact* is False where llama.cpp
    cannot realise *p* (one layer's stacked expert tensor cannot be split, nor cached)."""
    if p.kind in ("all-gpu", "unified"):
        return ["-ngl", "999"], True, ["-ngl 999: every layer on the GPU"]
    if p.kind == "experts-cpu":
        return ["-ngl", "999", "--cpu-moe"], True, [
            "--cpu-moe: every layer's routed experts in host RAM, the rest of each layer on the GPU"]
    if p.kind == "n-cpu-moe" and p.arg == 0:
        return ["-ngl", "999", "--n-cpu-moe", "0"], True, ["--n-cpu-moe 0: no routed experts in host RAM"]
    if p.kind == "n-cpu-moe":
        return ["-ngl", "999", "--n-cpu-moe", str(p.arg)], True, [
            f"--n-cpu-moe {p.arg}: the routed experts of blocks 0-{p.arg - 1} in host RAM, "
            "every other tensor on the GPU"]
    if p.kind == "cpu-only":
        return ["-ngl", "0"], True, ["-ngl 0: every layer in host RAM, computed by the CPU"]
    if p.kind == "layers-gpu":
        if p.arg == 0:
            return ["-ngl", "0"], True, ["-ngl 0: no layer on the GPU"]
        # llama.cpp counts the file's NextN/MTP blocks among its layers and puts the last -ngl of them on
        # the GPU; the output layer joins them only past n_layer, so it is placed by name
        ngl = p.arg + n_blocks(m) - m.n_layers
        dev = gpu_device(machine)
        return ["-ngl", str(ngl), "-ot", f"{OUTPUT_LAYER_REGEX}={dev}"], True, [
            f"-ngl {ngl}: the last {p.arg} layers on the GPU, the first {m.n_layers - p.arg} in host RAM",
            f"-ot {OUTPUT_LAYER_REGEX}={dev}: the output layer on the GPU too, as the simulated placement has it"]
    if p.kind == "gpu-experts":
        return ["-ngl", "999", "--cpu-moe"], False, [
            f"llama.cpp keeps one layer's experts in one tensor and cannot split it: {p.arg} GPU experts "
            "per layer needs ktransformers (--kt-num-gpu-experts); --cpu-moe is the nearest llama.cpp layout"]
    return ["-ngl", "999", "--cpu-moe"], False, [
        f"llama.cpp has no GPU expert cache: {p.arg} cached experts per layer is the MoE-Infinity / "
        "Mixtral-offloading style of serving; --cpu-moe is the nearest llama.cpp layout"]


def _llama_kv(rt, kv: str) -> tuple:
    if kv == "f16":
        return [], []
    if kv not in _LLAMA_KV:
        return [], [f"llama.cpp has no {kv} KV cache (-ctk/-ctv take f16, bf16, q8_0, q4_0, ...)"]
    why = [f"-ctk/-ctv {kv}: the KV cache in {kv}" + ("; a quantized V cache needs flash attention"
                                                       if kv.startswith(("q", "iq")) else "")]
    if rt.id == "ik_llama.cpp":
        # ik_llama.cpp turned flash attention on by default and its flag into -no-fa (ik_llama.cpp PR #863)
        return ["-ctk", kv, "-ctv", kv], why + ["flash attention is on by default in ik_llama.cpp"]
    # llama.cpp's -fa takes on|off|auto since 2025-09 (auto may leave it off; on makes it certain)
    return ["-fa", "on", "-ctk", kv, "-ctv", kv], why


def llama_launch(p, rt, m, machine, quant, context: int, kv: str, batch: int, mtp: int = 0,
                 parallel: str | None = None) -> dict:
    """``llama-server`` argv for the configuration, with why each flag is there."""
    place, exact, why = llama_placement(p, m, machine)
    args = ["-m", model_file(m, quant)] + place + ["-c", str(context * batch)]
    if batch > 1:
        args += ["-np", str(batch)]
        why.append(f"-c {context * batch} -np {batch}: {batch} slots of {context} tokens each "
                   "(llama.cpp splits -c between the slots)")
    kv_args, kv_why = _llama_kv(rt, kv)
    args += kv_args
    why += kv_why
    default_ub = catalog_ubatch(rt.id)
    if rt.ubatch and rt.ubatch != default_ub:
        # llama.cpp clamps -ub to -b (2048 by default): a larger physical batch needs the logical one too
        ub = ["-ub", str(rt.ubatch)] + (["-b", str(rt.ubatch)] if rt.ubatch > 2048 else [])
        args += ub
        why.append(f"{' '.join(ub)}: prefill passes of {rt.ubatch} prompt tokens (default {default_ub})")
    exact = exact and not (kv_why and not kv_args)
    if parallel and machine.n_gpus > 1:
        # -sm layer (the default) / row, and -sm tensor, llama.cpp's tensor-parallel split (used with
        # --tensor-split in llama.cpp PR #22673's comments; issue #24309); no expert-parallel mode
        spec = parallel.lower()
        mode = {"layer-split": "layer", "pipeline": "layer", "row-split": "row"}.get(
            spec, "layer" if spec.startswith("pp") else "tensor")
        args += ["-sm", mode]
        why.append(f"-sm {mode}: the {parallel} multi-GPU layout")
        if "ep" in spec:
            exact = False
            why.append(f"llama.cpp has no expert-parallel layout: {parallel} is approximated by -sm {mode}")
    if mtp:
        if rt.id == "llama.cpp":
            args += ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(mtp)]
            why.append(f"--spec-type draft-mtp --spec-draft-n-max {mtp}: draft {mtp} tokens per step "
                       "with the model's own MTP modules")
        else:
            why.append(f"MTP drafting ({mtp} drafts) is simulated; no {rt.id} flag for it is known to moesim")
    return {"program": "llama-server", "args": args, "env": {}, "modelfile": {}, "exact": exact, "why": why}


# ------------------------------------------------------------------------------------ Ollama
def ollama_launch(p, rt, m, machine, quant, context: int, kv: str, batch: int, mtp: int = 0) -> dict:
    """Modelfile parameters and environment variables that give Ollama's llama-server this placement."""
    place, exact, why = llama_placement(p, m, machine)
    ngl = int(place[place.index("-ngl") + 1])
    params = {"num_gpu": ngl, "num_ctx": context}
    env = {}
    why = [f"PARAMETER num_gpu {ngl}: Ollama passes it to llama-server as -ngl {ngl}"]
    if "--cpu-moe" in place:
        env["LLAMA_ARG_CPU_MOE"] = "1"
        why.append("LLAMA_ARG_CPU_MOE=1: llama-server's --cpu-moe, read from the environment (every layer's "
                   "routed experts in host RAM)")
    if "--n-cpu-moe" in place:
        env["LLAMA_ARG_N_CPU_MOE"] = str(p.arg)
        why.append(f"LLAMA_ARG_N_CPU_MOE={p.arg}: llama-server's --n-cpu-moe {p.arg}, read from the environment")
    if "-ot" in place:
        exact = False
        why.append("Ollama has no setting for llama-server's -ot: with num_gpu alone the output layer stays "
                   "in host RAM, where the simulated placement has it on the GPU")
    if not exact and p.kind in ("gpu-experts", "offload-cache"):
        why.append(f"Ollama cannot realise {p}: the nearest is every layer's experts in host RAM")
    why.append(f"PARAMETER num_ctx {context}: {context} tokens of context per sequence")
    if batch > 1:
        env["OLLAMA_NUM_PARALLEL"] = str(batch)
        why.append(f"OLLAMA_NUM_PARALLEL={batch}: {batch} sequences at once (llama-server gets -c "
                   f"{context * batch} -np {batch})")
    if kv != "f16":
        env["OLLAMA_FLASH_ATTENTION"] = "1"
        env["OLLAMA_KV_CACHE_TYPE"] = kv
        why.append(f"OLLAMA_KV_CACHE_TYPE={kv} with OLLAMA_FLASH_ATTENTION=1: a {kv} KV cache (Ollama "
                   "quantizes the cache only with flash attention on)")
        if kv not in _OLLAMA_KV:
            exact = False
            why.append(f"OLLAMA_KV_CACHE_TYPE takes {', '.join(_OLLAMA_KV)}, not {kv}")
    if mtp:
        why.append(f"MTP drafting ({mtp} drafts) is simulated; Ollama has no setting for it")
    return {"program": "ollama", "args": [], "env": env, "modelfile": params, "exact": exact, "why": why}


# ------------------------------------------------------------------------------------ served
# The multi-GPU options of each served runtime: (tensor parallel, expert parallel, attention DP,
# pipeline). vLLM: docs.vllm.ai serve args (--enable-expert-parallel, runtimes.md §2.5); SGLang:
# server_args.py (--tp, --ep-size, --enable-dp-attention --dp, runtimes.md §3.2); TensorRT-LLM:
# trtllm-serve (--tp_size, --ep_size, --pp_size; nvidia.github.io/TensorRT-LLM commands/trtllm-serve).
_SERVED = {
    "vllm": dict(program="vllm serve", tp="--tensor-parallel-size", ep=("--enable-expert-parallel",),
                 dp="--data-parallel-size", pp="--pipeline-parallel-size", ctx="--max-model-len",
                 seqs="--max-num-seqs", quant="--quantization"),
    "sglang": dict(program="python -m sglang.launch_server --model-path", tp="--tp", ep="--ep-size", dp="--dp",
                   pp="--pp-size", ctx="--context-length", seqs="--max-running-requests", quant="--quantization"),
    "trtllm": dict(program="trtllm-serve", tp="--tp_size", ep="--ep_size", dp=None, pp="--pp_size",
                   ctx="--max_seq_len", seqs="--max_batch_size", quant=None),
}


def _layout(parallel: str | None, n_gpus: int) -> tuple:
    """(tensor-parallel degree, expert-parallel degree, attention-DP, pipeline degree) of a --parallel name."""
    import re
    if n_gpus <= 1:
        return 1, 1, False, 1
    spec = (parallel or f"tp{n_gpus}").lower()
    if spec in ("layer-split", "pipeline", "row-split"):
        return (n_gpus, 1, False, 1) if spec == "row-split" else (1, 1, False, n_gpus)
    mt = re.match(r"^(tp|ep|pp)(\d+)(?:-ep(\d+))?(-attn-dp)?$", spec)
    kind, deg = mt.group(1), int(mt.group(2))
    if kind == "pp":
        return 1, 1, False, deg
    ep = int(mt.group(3)) if mt.group(3) else (deg if kind == "ep" else 1)
    return deg, ep, bool(mt.group(4)) or kind == "ep", 1


def _served_parallel(o: dict, rid: str, tp: int, ep: int, dp: bool, pp: int) -> tuple:
    args, why = [], []
    if dp and o["dp"]:
        args += ([o["tp"], str(tp)] if rid == "sglang" else []) + [o["dp"], str(tp)]
        args += ["--enable-dp-attention"] if rid == "sglang" else list(o["ep"])
        why.append(f"attention data-parallel over {tp} GPUs, experts spread over them")
    elif tp > 1:
        args += [o["tp"], str(tp)]
        why.append(f"{o['tp']} {tp}: every layer split over {tp} GPUs")
    if ep > 1 and not dp:
        args += list(o["ep"]) if isinstance(o["ep"], tuple) else [o["ep"], str(ep)]
        why.append(f"expert parallel over {ep} GPUs")
    if pp > 1:
        args += [o["pp"], str(pp)]
        why.append(f"{o['pp']} {pp}: the layers in {pp} stages, one per GPU")
    return args, why


def served_launch(p, rt, m, machine, quant, context: int, kv: str, batch: int, mtp: int = 0,
                  parallel: str | None = None) -> dict:
    """vLLM / SGLang / TensorRT-LLM server options for an all-GPU configuration."""
    rid = rt.id
    o = _SERVED[rid]
    args, why = _served_parallel(o, rid, *_layout(parallel, machine.n_gpus))
    exact = p.kind == "all-gpu"
    if not exact:
        why.append(f"{rid} keeps every weight on the GPU; {p} is not one of its layouts")
    args += [o["ctx"], str(context)]
    why.append(f"{o['ctx']} {context}: room for {context} tokens per sequence")
    if batch > 1:
        args += [o["seqs"], str(batch)]
    native = quant.is_stored or quant.scheme is not None or _is_native(m, quant)
    if quant.is_gguf and not native:
        exact = False
        why.append(f"{quant.id} is a llama.cpp (GGUF) file type; {rid} serves the checkpoint's own format "
                   f"({m.native_quant}): use --quant native or a checkpoint format")
    elif not native:
        if quant.id == "fp8" and o["quant"]:
            args += [o["quant"], "fp8"]
            why.append(f"{o['quant']} fp8: the {m.native_quant} checkpoint quantized to fp8 as it loads")
        else:
            why.append(f"load a checkpoint already quantized to {quant.id} ({rid} reads its format from the "
                       "checkpoint's config)")
    else:
        why.append(f"the checkpoint's own format ({quant.id}): {rid} reads it from the config, no "
                   "--quantization needed")
    kv, indexer = Q.kv_dtype_parts(kv)
    args += _indexer_flags(rid, indexer, why)
    exact = exact and (indexer is None or (rid == "vllm" and indexer != "bf16"))
    kv_flag = _SERVED_KV.get(rid, {}).get(kv)
    if kv_flag:
        args += ["--kv-cache-dtype", kv_flag] if rid != "trtllm" else []
        why.append(f"KV cache in {kv}" + ("" if rid != "trtllm" else " (kv_cache_config.dtype in the --config YAML)"))
    elif kv not in ("bf16", "f16"):
        exact = False
        why.append(f"{rid} has no {kv} KV cache")
    args += _served_mtp(rid, mtp, why)
    weights = model_file(m, quant, gguf=not native and quant.is_gguf)
    return {"program": o["program"], "args": [weights] + args, "env": {}, "modelfile": {}, "exact": exact,
            "why": why}


def _indexer_flags(rid: str, indexer: str | None, why: list) -> list:
    """The sparse-attention indexer cache's format (a KV dtype ATTN+INDEXER): vLLM's switch for fp4; its
    default is fp8 (runtimes.md §2.2), and no runtime stores it in bf16."""
    if indexer is None:
        return []
    if rid == "vllm" and indexer == "fp4":
        why.append("--attention_config.use_fp4_indexer_cache=True: the indexer cache in MXFP4 (68 B per entry)")
        return ["--attention_config.use_fp4_indexer_cache=True"]
    if rid == "vllm" and indexer == "fp8":
        why.append("the indexer cache in fp8, vLLM's default")
        return []
    why.append(f"{rid}: no launch option moesim knows puts the indexer cache in {indexer}")
    return []


def _is_native(m, quant) -> bool:
    """The checkpoint's own format (a 16-bit checkpoint resolves to the BF16 / F16 type of the same bytes)."""
    return bool(m.native_quant) and quant.id.lower() == Q.native_quant(m).id.lower()


def _served_mtp(rid: str, mtp: int, why: list) -> list:
    if not mtp:
        return []
    if rid == "vllm":
        why.append(f"--speculative-config: {mtp} MTP draft tokens per step")
        return ["--speculative-config", '{"method":"mtp","num_speculative_tokens":%d}' % mtp]
    if rid == "sglang":
        why.append(f"EAGLE-style MTP drafting, a chain of {mtp} drafts (top-1)")
        return ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(mtp),
                "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(mtp + 1)]
    why.append(f"MTP drafting ({mtp} drafts) goes in the speculative_config of the --config YAML")
    return []


# ------------------------------------------------------------------------------------ the rest
def _other_launch(p, rt, context: int) -> dict:
    if rt.family == "ktransformers":
        n = p.arg if p.kind == "gpu-experts" else 0
        d = rt.decode
        # the documented launch for this model (runtimes.toml [runtimes.ktransformers.models.<model>])
        stream = (["--kt-gpu-prefill-token-threshold", str(d.layerwise_prefill_tokens), "--chunked-prefill-size",
                   str(d.layerwise_chunk_tokens)] if rt.launch and d.layerwise_prefill_tokens > 0 else [])
        return {"program": "python -m sglang.launch_server", "args": ["--kt-num-gpu-experts", str(n),
                "--context-length", str(context)] + stream, "env": {}, "modelfile": {},
                "exact": p.kind in ("gpu-experts", "experts-cpu"),
                "why": [f"--kt-num-gpu-experts {n}: {n} experts of each layer on the GPU, the rest on the CPU"]}
    if rt.id == "mlx":
        return {"program": "mlx_lm.generate", "args": ["--max-kv-size", str(context)], "env": {}, "modelfile": {},
                "exact": True, "why": ["MLX keeps the model in unified memory"]}
    if rt.family == "offload":
        return {"program": "", "args": [], "env": {}, "modelfile": {}, "exact": True,
                "why": ["the offload runtime models MoE-Infinity / Mixtral-offloading style serving (a GPU cache "
                        "of experts copied from host RAM), not one program's command line"]}
    return {"program": rt.id, "args": [], "env": {}, "modelfile": {}, "exact": False,
            "why": [f"moesim knows no command line for {rt.id}"]}


def launch(p, rt, m, machine, quant, context: int, kv: str, batch: int, mtp: int = 0,
           parallel: str | None = None) -> dict:
    """The runtime's own settings for one configuration: ``program``, ``args`` (argv after it), ``env``,
    ``modelfile`` (Ollama PARAMETERs), ``exact`` (they realise placement *p* exactly), ``why`` (one line per
    setting) and ``flags``, the one-line form ``fit`` prints."""
    if rt.id == "ollama":
        d = ollama_launch(p, rt, m, machine, quant, context, kv, batch, mtp)
    elif rt.llama_cpp_family:
        d = llama_launch(p, rt, m, machine, quant, context, kv, batch, mtp, parallel)
    elif rt.id in _SERVED:
        d = served_launch(p, rt, m, machine, quant, context, kv, batch, mtp, parallel)
    else:
        d = _other_launch(p, rt, context)
    d["runtime"] = rt.id
    d["flags"] = flags_line(d)
    return d


def flags_line(d: dict) -> str:
    """One line a user can paste: environment, program and argv (shell-quoted), then Ollama's Modelfile."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in d["env"].items())
    cmd = " ".join(x for x in (env, shlex.join(d["args"])) if x)
    if d["modelfile"]:
        cmd = " ".join(x for x in (env, "ollama serve") if x) + "; Modelfile: " + ", ".join(
            f"PARAMETER {k} {v}" for k, v in d["modelfile"].items())
    return cmd


# ------------------------------------------------------------------------------------ advice
def overflow(rec: dict, caps: dict) -> list:
    """[{tier, need_gb, have_gb, over_gb}] for each memory tier the configuration overfills."""
    out = []
    tiers = rec["memory_by_tier"]
    for tier in ("gpu", "host", "storage"):
        t = tiers.get(tier) or (tiers.get("unified") if tier == "gpu" else None)
        if t is None:
            continue
        have, need = caps[tier], t["total"]
        if tier == "gpu" and caps.get("n_gpus", 0) > 1 and rec.get("gpu_bytes_per_gpu") is not None:
            have, need = caps["gpu_one"], rec["gpu_bytes_per_gpu"]      # memory is per GPU: the busiest one
        if tier == "storage" and not caps.get("storage_spill"):
            continue
        if need > have:
            out.append({"tier": "unified" if tier == "gpu" and "unified" in tiers else tier,
                        "need_gb": need / GB, "have_gb": have / GB, "over_gb": (need - have) / GB})
    return out


def speed_options(options: dict) -> list:
    """One line for each option that changes speed (or memory) and was set away from its default."""
    o = options or {}
    lines = []
    if o.get("mtp"):
        a = o.get("mtp_acceptance", 0.8)
        lines.append(f"MTP: {o['mtp']} draft tokens per step, each accepted with probability {a:g} "
                     f"(about {accepted_per_step(o['mtp'], a):.2f} tokens per step)")
    if o.get("parallel"):
        lines.append(f"multi-GPU layout {o['parallel']}")
    if o.get("cache_experts") is not None:
        lines.append(f"GPU expert cache: {o['cache_experts']} slots per MoE layer, {o.get('policy', 'lru')} "
                     "replacement")
    elif o.get("policy", "lru") != "lru":
        lines.append(f"expert cache policy {o['policy']}")
    if o.get("prefetch_recall"):
        lines.append(f"next-layer expert prefetch at recall {o['prefetch_recall']:g}")
    if o.get("routing") is not None:
        lines.append(f"routing profile {o['routing']}")
    return lines


def advise(m, machine, rec: dict, caps: dict, quant, placement, runtime, mtp: int = 0,
           options: dict | None = None, auto: bool = False) -> dict:
    """The ``advice`` field of a fit / simulate record: the runtime's settings (:func:`launch`), what
    overflows and by how much when it does not fit, and the speed options in force. *auto*: the
    placement is the runtime's own choice (said, since then the runtime needs no placement flags)."""
    d = launch(placement, runtime, m, machine, quant, rec["context"], rec["kv_dtype"], rec["batch"], mtp,
               (options or {}).get("parallel"))
    auto = auto and rec["fits"] != "no"
    if auto and runtime.id == "ollama":
        d["why"].insert(0, "Ollama's default (no num_gpu) lets llama-server's --fit choose this placement; "
                           "these settings pin it")
    elif auto and runtime.id == "llama.cpp":
        d["why"].insert(0, "llama.cpp's --fit picks this placement by itself; the flags pin it (--fit "
                           "changes nothing once -ngl or -ot is given, runtimes.md §1.7)")
    elif auto and runtime.llama_cpp_family:
        d["why"].insert(0, "the placement that keeps the most on the GPU and fits (the rule of llama.cpp's "
                           f"--fit); the flags set it for {runtime.id}")
    d["overflow"] = overflow(rec, caps) if rec["fits"] == "no" else []
    spill = rec["memory_by_tier"].get("storage", {}).get("total", 0.0)
    if spill > 0:
        d["why"].append(f"{spill / GB:.1f} GB of weights do not fit in host RAM and page from storage as they "
                        "are read (mmap): more host RAM or a smaller quant removes the storage reads")
    d["options"] = speed_options(dict(options or {}, mtp=mtp))
    return d
