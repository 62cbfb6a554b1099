r"""llama.cpp tensor placement on real tensor names: ``-ot REGEX=DEVICE``, ``--cpu-moe``, ``--n-cpu-moe N``
and ``-ngl``, applied exactly as llama.cpp applies them.

llama.cpp (``common/arg.cpp``, ``common/common.h``, ``src/llama-model-loader.cpp``, ``src/llama-model.cpp``):

* ``--override-tensor/-ot`` takes ``PATTERN=BUFFER_TYPE[,PATTERN=BUFFER_TYPE...]``
  (``parse_tensor_buffer_overrides``: split on ``,``, each at its first ``=``); the option may repeat and
  every override is appended to ``tensor_buft_overrides`` in command-line order.
* ``--cpu-moe`` appends ``LLM_FFN_EXPS_REGEX = "\.ffn_(up|down|gate|gate_up)_(ch|)exps"`` -> CPU
  (``llm_ffn_exps_cpu_override``); ``--n-cpu-moe N`` appends, for i = 0..N-1,
  ``llm_ffn_exps_block_regex(i) = "blk\.<i>" + LLM_FFN_EXPS_REGEX`` -> CPU.
* When a tensor is created, the loader walks the overrides in order and the first whose
  ``std::regex`` (ECMAScript) matches anywhere in the full tensor name (``std::regex_search``) decides
  the buffer type (``break`` on the first hit).
* Without an override a tensor lives where its layer lives: with ``-ngl N`` the last N repeating
  layers are on the GPU (``i_gpu_start = max(n_layer - N, 0)``), the output layer only when N exceeds
  n_layer, and the input layer (``token_embd``) always on the CPU ("there is very little benefit to
  offloading the input layer").

Python's :mod:`re` stands in for ``std::regex``: patterns using syntax std::regex's ECMAScript grammar
lacks (``(?P<..>)``, ``(?<=..)``, inline flags, ``\A``/``\Z``) are refused rather than given a meaning
llama.cpp would not give them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import MoesimError
from .models import Model


LLM_FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
CPU = "CPU"
_DEVICE = re.compile(r"^[A-Za-z][A-Za-z0-9_:.\-\[\]]*$")
_NOT_ECMASCRIPT = re.compile(r"\(\?(P|<[=!]|<[A-Za-z]|[aiLmsux#-])|\\[AZ]")


def llm_ffn_exps_block_regex(i: int) -> str:
    """common/common.h: the pattern --n-cpu-moe pushes for block *i*."""
    return rf"blk\.{i}{LLM_FFN_EXPS_REGEX}"


@dataclass(frozen=True)
class Override:
    """One ``PATTERN=DEVICE`` tensor buffer override."""

    pattern: str
    device: str
    regex: re.Pattern = field(compare=False, repr=False, default=None)

    def __str__(self) -> str:
        return f"{self.pattern}={self.device}"

    def matches(self, name: str) -> bool:
        return self.regex.search(name) is not None


def _compile(pattern: str, field_name: str) -> re.Pattern:
    if not pattern:
        raise MoesimError("empty tensor pattern before '='", field_name)
    if len(pattern) > 4096:
        raise MoesimError(f"tensor pattern is {len(pattern)} characters long (limit 4096)", field_name)
    if _NOT_ECMASCRIPT.search(pattern):
        raise MoesimError(f"pattern {pattern!r} uses syntax std::regex (ECMAScript) does not have", field_name)
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise MoesimError(f"invalid regular expression {pattern!r}: {exc}", field_name) from None


def override(pattern: str, device: str, field_name: str = "--override-tensor") -> Override:
    device = device.strip()
    if not _DEVICE.match(device):
        raise MoesimError(f"invalid buffer type {device!r} (llama.cpp names: CPU, CUDA0, CUDA1, Metal, Vulkan0, "
                          "ROCm0, ...)", field_name)
    return Override(pattern, device, _compile(pattern, field_name))


def parse_overrides(text: str, field_name: str = "--override-tensor") -> list:
    """``PATTERN=DEVICE[,PATTERN=DEVICE...]`` as llama.cpp's parse_tensor_buffer_overrides splits it."""
    if not isinstance(text, str):
        raise MoesimError(f"expected PATTERN=DEVICE, got {text!r}", field_name)
    out = []
    for item in text.split(","):
        pos = item.find("=")
        if pos < 0:
            raise MoesimError(f"{item!r} is not PATTERN=DEVICE", field_name)
        out.append(override(item[:pos], item[pos + 1:], field_name))
    return out


def cpu_moe() -> Override:
    """--cpu-moe: every layer's routed experts on the CPU."""
    return override(LLM_FFN_EXPS_REGEX, CPU)


def n_cpu_moe(n: int) -> list:
    """--n-cpu-moe N: routed experts of blocks 0..N-1 on the CPU."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0 or n > 1 << 16:
        raise MoesimError(f"must be an integer >= 0, got {n!r}", "--n-cpu-moe")
    return [override(llm_ffn_exps_block_regex(i), CPU) for i in range(n)]


def as_overrides(items) -> list:
    """A list of Override from strings ``PATTERN=DEVICE`` (comma lists allowed) and Override objects."""
    if items is None:
        return []
    if isinstance(items, (str, Override)):
        items = [items]
    out = []
    for it in items:
        out.extend([it] if isinstance(it, Override) else parse_overrides(it))
    return out


def n_blocks(model: Model) -> int:
    """llama.cpp's n_layer: the repeating blocks including MTP/NextN blocks stored in the file."""
    return model.n_layers + (model.mtp_layers if model.mtp_layer is not None or model.stored else 0)


def default_device(model: Model, tensor, n_gpu_layers: int | None, gpu: str) -> str:
    """Where llama.cpp puts a tensor without an override (-ngl rules; token_embd always on the CPU)."""
    n_layer = n_blocks(model)
    ngl = n_layer + 1 if n_gpu_layers is None else max(0, n_gpu_layers)
    start = max(n_layer - ngl, 0)
    act = min(ngl, n_layer + 1)
    name = tensor.name
    if name.startswith("token_embd"):
        return CPU
    m = re.match(r"blk\.(\d+)\.", name)
    il = int(m.group(1)) if m else n_layer        # global non-input tensors belong to the output layer
    if il < start or il - start >= act:
        return CPU
    return gpu


def assign_devices(model: Model, overrides=(), n_gpu_layers: int | None = None, gpu: str = "CUDA0",
                   quant=None) -> list:
    """[(Tensor, type, bytes, device)] for every tensor of *model* (its file's tensors when read from a
    GGUF), with the first matching override deciding, as llama.cpp's model loader does."""
    from . import quants as Q
    ovs = as_overrides(overrides)
    if not _DEVICE.match(gpu or ""):
        raise MoesimError(f"invalid device name {gpu!r}", "gpu")
    q = Q.resolve(quant if quant is not None else "native", model)
    if q.kind == "stored" and model.stored.container != "gguf":
        raise MoesimError(f"tensor overrides match llama.cpp (GGUF) tensor names, and {model.id} was read from "
                          f"{model.stored.container} files with Hugging Face names; use the GGUF file, or the "
                          "config.json for the llama.cpp-named tensors of the same architecture", "--override-tensor")
    out = []
    for t, typ, nb in Q.assign(model, q, include_mtp=True):
        dev = None
        for o in ovs:
            if o.matches(t.name):
                dev = o.device
                break
        out.append((t, typ, nb, dev or default_device(model, t, n_gpu_layers, gpu)))
    return out


def by_device(placed: list, include_mtp: bool = False) -> dict:
    """{device: {"total": bytes, "by_class": {class: bytes}, "tensors": n}} of an assignment.

    MTP/NextN blocks are left out unless asked for: llama.cpp creates them with TENSOR_SKIP (kept in
    the file, not loaded), as moesim's memory view leaves them out unless MTP drafting is on."""
    out: dict = {}
    for t, _typ, nb, dev in placed:
        if t.cls == "mtp" and not include_mtp:
            continue
        d = out.setdefault(dev, {"total": 0, "by_class": {}, "tensors": 0})
        d["total"] += nb
        d["tensors"] += 1
        d["by_class"][t.cls] = d["by_class"].get(t.cls, 0) + nb
    return out


def equivalent_placement(model: Model, placed: list, gpu: str = "CUDA0"):
    """The moesim :class:`~moesim.placement.Placement` with the same weights on host and GPU, or None.

    Representable: nothing moved (``all-gpu``), the routed experts of blocks 0..k-1 moved to the CPU
    (``n-cpu-moe=k``), all of them (``experts-cpu``) -- expert biases (gpt-oss) are ignored in the
    comparison and every other tensor must stay where ``-ngl 999`` puts it -- or whole layers: the last
    N on the GPU with the output layer (``layers-gpu=N``, as ``-ngl`` with the output layer placed by
    ``-ot``), or nothing on the GPU (``cpu-only``); the input layer stays on the CPU either way.
    """
    p = _expert_moves(model, placed, gpu)
    return p if p is not None else _whole_layers(model, placed)


def _whole_layers(model: Model, placed: list):
    """layers-gpu=N when every tensor of the last N layers and of the output layer is on a GPU and every
    other on the CPU; cpu-only when all are on the CPU; else None (MTP blocks are not loaded)."""
    from .placement import Placement
    L = model.n_layers
    layer_on_cpu: dict = {}
    head_on_cpu = set()
    for t, _typ, _nb, dev in placed:
        if t.cls == "mtp":
            continue
        on_cpu = dev == CPU
        if t.name.startswith("token_embd"):
            if not on_cpu:
                return None
        elif 0 <= t.layer < L:
            if layer_on_cpu.setdefault(t.layer, on_cpu) != on_cpu:
                return None
        else:
            head_on_cpu.add(on_cpu)
    gpu_layers = sorted(l for l, c in layer_on_cpu.items() if not c)
    n = len(gpu_layers)
    if n == 0 and head_on_cpu <= {True}:
        return Placement("cpu-only")
    if gpu_layers != list(range(L - n, L)) or head_on_cpu != {False}:
        return None
    return Placement("layers-gpu", n)


def _expert_moves(model: Model, placed: list, gpu: str):
    """all-gpu / n-cpu-moe=k / experts-cpu (see :func:`equivalent_placement`), or None."""
    from .placement import Placement
    L = model.n_layers
    moved = set()
    for t, _typ, _nb, dev in placed:
        if t.cls == "mtp":
            continue                      # not loaded without MTP drafting (see by_device)
        want = default_device(model, t, None, gpu)
        is_exp_weight = t.cls == "routed_experts" and t.name.endswith("weight")
        if is_exp_weight and 0 <= t.layer < L:
            if dev == CPU:
                moved.add(t.layer)
            elif dev != want:
                return None
        elif t.cls == "routed_experts" and not t.name.endswith("weight"):
            continue
        elif dev != want:
            return None
    # every weight tensor of a moved layer must be on the CPU, and the moved layers a prefix
    for t, _typ, _nb, dev in placed:
        if t.cls == "routed_experts" and t.name.endswith("weight") and t.layer in moved and dev != CPU:
            return None
    moe_layers = [l.index for l in model.layers if l.ffn.kind == "moe"]
    if not moved:
        return Placement("all-gpu")
    k = max(moved) + 1
    if moved != {i for i in moe_layers if i < k}:
        return None
    if k >= (max(moe_layers) + 1 if moe_layers else 0):
        return Placement("experts-cpu")
    return Placement("n-cpu-moe", k)
