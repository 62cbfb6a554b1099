"""Placement names (what lives where); the runtime flags that realise them are analysis.advice's."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import MoesimError


# The --placement names (DESIGN §4); engine.codes.PLACEMENT_CODES gives each its kernel code.
PLACEMENTS = ("all-gpu", "experts-cpu", "n-cpu-moe", "gpu-experts", "layers-gpu", "cpu-only", "unified",
              "offload-cache")
_NEEDS_ARG = {"n-cpu-moe", "gpu-experts", "layers-gpu"}
_OPTIONAL_ARG = {"offload-cache"}
_COUNTED = frozenset(_NEEDS_ARG | _OPTIONAL_ARG)     # names spelled with their count
# llama.cpp's own flags for these placements, as measurements and users write them ("--n-cpu-moe 30",
# "-ngl 20", "-ot exps=CPU"): the name each means (llama.cpp tools/main README; runtimes.md §1.7)
_FLAG_NAMES = {"cpu-moe": "experts-cpu", "ot-exps=cpu": "experts-cpu", "ot-.ffn_.*_exps.=cpu": "experts-cpu",
               "ncmoe": "n-cpu-moe", "ngl": "layers-gpu", "n-gpu-layers": "layers-gpu", "gpu-layers": "layers-gpu",
               "full-gpu": "all-gpu", "gpu": "all-gpu", "cpu": "cpu-only"}


def _flag_spelling(text: str) -> str:
    """``--n-cpu-moe 30`` -> ``n-cpu-moe=30``, ``-ngl 20`` -> ``layers-gpu=20``, ``-ot exps=CPU`` -> ``experts-cpu``;
    a placement name is returned as it is."""
    t = text.strip().lower().lstrip("-")
    whole = t.replace(" ", "-")
    if whole in _FLAG_NAMES:
        return _FLAG_NAMES[whole]
    name, sep, arg = t.replace(" ", "=", 1).partition("=")
    name = _FLAG_NAMES.get(name, name)
    return f"{name}{sep}{arg}" if sep else name


@dataclass(frozen=True)
class Placement:
    kind: str
    arg: int = 0

    def __str__(self) -> str:
        return f"{self.kind}={self.arg}" if self.kind in _COUNTED else self.kind


def parse(spec: "str | Placement", model=None, machine=None) -> Placement:
    """``n-cpu-moe=30`` -> Placement("n-cpu-moe", 30), validated against the model and machine."""
    if isinstance(spec, Placement):
        p = spec
    else:
        if not isinstance(spec, str) or not spec.strip():
            raise MoesimError(f"expected a placement name, got {spec!r}", "placement")
        name, _, arg = _flag_spelling(spec).partition("=")
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
