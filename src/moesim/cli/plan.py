"""``moesim plan``: the Pareto front of quant x placement x KV dtype x context against decode tok/s."""
from __future__ import annotations

from ._args import _add_machine_flags, _machine_from, _positive_int, _print_json


def add_parsers(sub) -> None:
    p = sub.add_parser("plan", help="the trade-off of quant x placement x KV dtype x context against decode "
                                    "tok/s, as its Pareto front, each point with the runtime flags that realise it")
    p.add_argument("model", help="catalog model id (moesim models); the sweep engine takes catalog models")
    _add_machine_flags(p)
    p.add_argument("--quant", action="append", help="quantization (repeatable); default: the runtime's ladder "
                                                    "(GGUF for llama.cpp, the checkpoint's format for vLLM/SGLang)")
    p.add_argument("--kv-dtype", action="append", help="KV cache dtype (repeatable); default: f16, q8_0, q4_0 "
                                                       "(llama.cpp) or bf16, fp8 (vLLM/SGLang)")
    p.add_argument("--context", action="append", type=_positive_int,
                   help="context (repeatable); default: powers of two up to the trained maximum")
    p.add_argument("--placement", action="append", help="placement (repeatable); default: the runtime's own "
                                                        "choice and the layouts around it")
    p.add_argument("--runtime", help="llama.cpp | ik_llama.cpp | ollama | vllm | sglang | ...; default: the "
                                     "format's")
    p.add_argument("--batch", type=_positive_int, default=1, help="concurrent sequences")
    p.add_argument("--json", action="store_true")


def _cmd_plan(args) -> int:
    from ..analysis.plan import plan
    from ..report.plan import plan_text
    d = plan(args.model, _machine_from(args), quants=args.quant, kv_dtypes=args.kv_dtype, contexts=args.context,
             placements=args.placement, runtime=args.runtime, batch=args.batch)
    if args.json:
        return _print_json(d)
    print(plan_text(d))
    return 0


COMMANDS = {"plan": _cmd_plan}
