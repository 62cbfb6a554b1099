"""Placement names (what lives where) and the runtime flags that realise them."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import MoesimError


# The --placement names (DESIGN §4); engine.codes.PLACEMENT_CODES gives each its kernel code.
PLACEMENTS = ("all-gpu", "experts-cpu", "n-cpu-moe", "gpu-experts", "layers-gpu", "cpu-only", "unified",
              "offload-cache")
_NEEDS_ARG = {"n-cpu-moe", "gpu-experts", "layers-gpu"}
_OPTIONAL_ARG = {"offload-cache"}


@dataclass(frozen=True)
class Placement:
    kind: str
    arg: int = 0

    def __str__(self) -> str:
        return f"{self.kind}={self.arg}" if self.kind in _NEEDS_ARG | _OPTIONAL_ARG else self.kind


def parse(spec: "str | Placement", model=None, machine=None) -> Placement:
    """``n-cpu-moe=30`` -> Placement("n-cpu-moe", 30), validated against the model and machine."""
    if isinstance(spec, Placement):
        p = spec
    else:
        if not isinstance(spec, str) or not spec.strip():
            raise MoesimError(f"expected a placement name, got {spec!r}", "placement")
        name, _, arg = spec.strip().lower().partition("=")
        if name not in PLACEMENTS:
            from ..errors import unknown_id
            raise unknown_id("placement", name, list(PLACEMENTS), "placement")
        if name in _NEEDS_ARG and not arg:
            raise MoesimError(f"{name} needs a count, e.g. {name}=8", "placement")
        if arg and name not in _NEEDS_ARG | _OPTIONAL_ARG:
            raise MoesimError(f"{name} takes no count", "placement")
        n = 0
        if arg:
            try:
                n = int(arg)
            except ValueError:
                raise MoesimError(f"{name} count must be an integer, got {arg!r}", "placement") from None
            if n < 0:
                raise MoesimError(f"{name} count must be >= 0, got {n}", "placement")
        if name == "offload-cache" and not arg:
            n = -1  # resolved below to 2 x top-k slots per layer
        p = Placement(name, n)
    if model is not None:
        if p.kind in ("n-cpu-moe", "layers-gpu") and p.arg > model.n_layers:
            raise MoesimError(f"{p.kind}={p.arg} exceeds the model's {model.n_layers} layers", "placement")
        if p.kind in ("experts-cpu", "n-cpu-moe", "gpu-experts", "offload-cache") and not model.n_experts:
            raise MoesimError(f"{p.kind} moves experts and {model.id} is a dense model "
                              "(use layers-gpu=N or cpu-only)", "placement")
        if p.kind == "gpu-experts" and p.arg > model.n_experts:
            raise MoesimError(f"gpu-experts={p.arg} exceeds the {model.n_experts} experts per layer", "placement")
        if p.kind == "offload-cache" and p.arg == -1:
            p = Placement("offload-cache", 2 * model.top_k)
    if machine is not None:
        if p.kind == "unified" and not machine.unified:
            raise MoesimError("unified placement needs a unified-memory machine (Apple M*, DGX Spark)", "placement")
        if machine.unified and p.kind not in ("unified", "all-gpu", "cpu-only"):
            raise MoesimError(f"{p.kind} offloads to host RAM, but {machine.gpu} has one unified pool "
                              "(use unified)", "placement")
        if machine.n_gpus == 0 and p.kind != "cpu-only":
            raise MoesimError(f"{p} needs a GPU and the machine has none (use cpu-only)", "placement")
        if machine.unified and p.kind == "all-gpu":
            p = Placement("unified")
    return p


def runtime_flags(p: Placement, runtime, model, machine, context: int, kv_dtype: str, batch: int) -> str:
    """Command-line flags of *runtime* that produce placement *p* (what a user would type)."""
    rid = runtime.id
    if runtime.llama_cpp_family:
        flags = []
        if p.kind in ("all-gpu", "unified"):
            flags.append("-ngl 999")
        elif p.kind == "experts-cpu":
            flags += ["-ngl 999", '-ot "\\.ffn_.*_exps\\.=CPU"']
        elif p.kind == "n-cpu-moe":
            flags += ["-ngl 999", f"--n-cpu-moe {p.arg}"]
        elif p.kind == "layers-gpu":
            flags.append(f"-ngl {p.arg}")
        elif p.kind == "cpu-only":
            flags.append("-ngl 0")
        elif p.kind == "offload-cache":
            flags += ["-ngl 999", f"(llama.cpp has no expert cache: {p.arg} cached experts/layer is the "
                      "MoE-Infinity / Mixtral-offloading style of serving)"]
        elif p.kind == "gpu-experts":
            # llama.cpp cannot split one layer's stacked expert tensor; ktransformers can
            flags += ["-ngl 999", "--cpu-moe", f"(llama.cpp has no per-expert split: {p.arg} GPU experts/layer "
                      "needs ktransformers --kt-num-gpu-experts)"]
        flags.append(f"-c {context}")
        if batch > 1:
            flags.append(f"-np {batch}")
        if kv_dtype not in ("f16",):
            flags.append(f"-fa on -ctk {kv_dtype} -ctv {kv_dtype}")
        return " ".join(flags)
    if rid in ("vllm", "sglang", "trtllm"):
        flags = []
        if machine.n_gpus > 1:
            flags.append(f"--tensor-parallel-size {machine.n_gpus}" if rid != "sglang" else f"--tp {machine.n_gpus}")
        flags.append(f"--max-model-len {context}" if rid != "sglang" else f"--context-length {context}")
        if batch > 1:
            flags.append(f"--max-num-seqs {batch}" if rid == "vllm" else f"--max-running-requests {batch}")
        if kv_dtype in ("fp8",):
            flags.append("--kv-cache-dtype fp8" if rid != "sglang" else "--kv-cache-dtype fp8_e4m3")
        return " ".join(flags)
    if rid == "ktransformers":
        n = p.arg if p.kind == "gpu-experts" else 0
        d = runtime.decode
        # the documented launch for this model (runtimes.toml [runtimes.ktransformers.models.<model>])
        stream = (f" --kt-gpu-prefill-token-threshold {d.layerwise_prefill_tokens} --chunked-prefill-size "
                  f"{d.layerwise_chunk_tokens}" if runtime.launch and d.layerwise_prefill_tokens > 0 else "")
        return f"--kt-num-gpu-experts {n} --context-length {context}{stream}"
    if rid == "mlx":
        return f"mlx_lm.generate --max-kv-size {context}"
    return ""
