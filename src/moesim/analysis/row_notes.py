"""What a measured row's runtime column and notes say about the run: the runtime profile that models it
(aliases, the llama.cpp build's era and GPU backend, ktransformers' release), the settings its notes state
(ubatch, ktransformers' prefill threshold and chunk, decode threads, flash attention) and the month it ran.
:mod:`moesim.analysis.validate` builds a row's configuration from these; :mod:`.coverage` counts runtimes
with :func:`runtime_for`."""
from __future__ import annotations

import re

from ..engine.lower.decode_model import delta_net_ops
from ..spec.runtimes import FAMILIES, runtime as profile

# Runtimes in the data that moesim models through a profile of the same kind.
RUNTIME_ALIASES = {"moe-infinity": "offload", "mixtral-offloading": "offload", "fiddler": "offload",
                   "omlx": "mlx"}
NOT_MODELLED_RUNTIMES = {"exo": "exo pipelines one model over several networked Macs (multi-machine)"}
# a llama.cpp build dated before PR #7860 (June 2024): "May 2024", "2023 Metal dev commit"
_LCPP_BEFORE_MMA_NOTE = re.compile(r"\b(?:(?:Jan|Feb|Mar|Apr|May)[a-z]*\.? 2024|20(?:1\d|2[0-3]))\b")
# the months from which a dated llama.cpp run is modelled by the 2024h1 profile, then by the current one
_LCPP_2024H1, _LCPP_2024H2 = (2024, 1), (2024, 6)
# the month from which a dated Vulkan run has PR #18749's AMD coopmat GEMM tiles (before: llama.cpp-2025-vulkan)
_VULKAN_AMD_TILES = (2026, 1)
# a build of 2023 or earlier ("Dec 2023"): MUL_MAT_ID token by token on the GPU (llama.cpp PRs #4406, #4725)
_LCPP_2023_NOTE = re.compile(r"\b20(?:1\d|2[0-3])\b")
# the llama.cpp GPU backend a row's notes name; without one the vendor's own (CUDA, HIP, SYCL, Metal)
_VULKAN_NOTE = re.compile(r"(?<![a-z])vulkan(?![a-z])", re.I)    # "Vulkan", "llama.cpp-vulkan_amdvlk"
_SYCL_NOTE = re.compile(r"\bSYCL\b")
_HIP_NOTE = re.compile(r"(?<![A-Za-z])(?:HIP|hip|ROCm)(?![A-Za-z])")
_KT_LEGACY_NOTE = re.compile(r"\bv0\.[23]\b", re.I)     # ktransformers releases before kt-kernel + SGLang
# llama.cpp's physical batch as notes state it: "ub 2048", "-ub 4096", "b/ub 4096", and llama-bench's own column
# name "n_ubatch 2048" ("n_ubatch = 512" in a log)
_UBATCH_NOTE = re.compile(r"(?:(?:^|[\s;(/-])ub|\bn_ubatch\s*=?)\s+(\d+)\b")
# ktransformers' --kt-gpu-prefill-token-threshold as notes state it: "GPU prefill threshold 2048"
_KT_THRESHOLD_NOTE = re.compile(r"prefill threshold\s+(\d+)")
# SGLang's --chunked-prefill-size under ktransformers as notes state it: "chunked prefill 4096"
_KT_CHUNK_NOTE = re.compile(r"chunked prefill\s+(\d+)")
_NO_FA_NOTE = re.compile(r"\bno FA\b|\bfa 0\b|-fa (?:0|off)\b", re.I)   # flash attention off (llama-bench fa 0)
_FA_ON_NOTE = re.compile(r"(?<![\w-])-fa\b|\bfa 1\b|flash attention", re.I)
# llama.cpp's flash attention became default-on ("auto") at the end of August 2025 (LocalAI switched its
# llama.cpp backend to the new auto value on 2025-08-31, mudler/LocalAI PR #6168); before, -fa was opt-in
_FA_AUTO_SINCE = (2025, 9)
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTH_YEAR = re.compile(r"\b(" + "|".join(_MONTHS) + r")[a-z]*\.? (20\d\d)\b", re.I)
_ISO_MONTH = re.compile(r"\b(20\d\d)[-/](\d\d)\b")
# llama-bench's decode test with its own thread count: "tg128 4 threads"
_DECODE_THREADS_NOTE = re.compile(r"\btg\d*\s+(\d+)\s+threads?\b")


class Skip(Exception):
    """A row that cannot be turned into a configuration; the message says why."""


def runtime_for(row: dict, notes: str, assumed: list) -> str | None:
    """The runtime profile a row's runtime (and the build its notes, date or source date) is modelled by."""
    rid = row["runtime"].strip()
    if rid in NOT_MODELLED_RUNTIMES:
        raise Skip(NOT_MODELLED_RUNTIMES[rid])
    runtime = RUNTIME_ALIASES.get(rid, rid) or None
    if rid in RUNTIME_ALIASES:
        assumed.append(f"runtime {rid} modelled by the {runtime} profile")
    when = row_month(row, notes)
    if rid == "llama.cpp" and (_LCPP_BEFORE_MMA_NOTE.search(notes) or (when is not None and when < _LCPP_2024H2)):
        runtime = "llama.cpp-2024h1"
        assumed.append("llama.cpp build before June 2024 (notes or date): K-quant MMQ without int8 tensor cores, "
                       "2024 ggml-metal prompt GEMMs")
        if _LCPP_2023_NOTE.search(notes) or (when is not None and when < _LCPP_2024H1):
            runtime = "llama.cpp-2023"
            assumed.append("llama.cpp build of 2023 (notes or date): GPU MUL_MAT_ID token by token (before PR #4725)")
    if rid == "llama.cpp" and _VULKAN_NOTE.search(notes) and runtime != "llama.cpp-2023":
        if runtime == "llama.cpp" and when is not None and when < _VULKAN_AMD_TILES:
            runtime = "llama.cpp-2025"
            assumed.append("llama.cpp Vulkan build before January 2026 (date): AMD coopmat dense GEMMs before "
                           "PR #18749's tiles")
        runtime += "-vulkan"
        assumed.append(f"llama.cpp's Vulkan backend (notes): runtimes.toml [backends.{_backend_key(runtime)}]")
    elif rid == "llama.cpp" and _SYCL_NOTE.search(notes) and runtime == "llama.cpp":
        runtime = "llama.cpp-sycl"
        assumed.append("llama.cpp's SYCL backend (notes): runtimes.toml [backends.sycl]")
    elif rid == "llama.cpp" and _HIP_NOTE.search(notes) and runtime == "llama.cpp":
        runtime = "llama.cpp-hip"          # AMD's own backend: what an AMD card runs without a note, named
    if rid == "ktransformers" and _KT_LEGACY_NOTE.search(notes):
        runtime = "ktransformers-legacy"
        assumed.append("ktransformers v0.2 / v0.3 (notes): the standalone server, no layerwise prefill")
    return runtime


def _backend_key(runtime: str) -> str:
    """runtimes.toml's [backends.*] key of a llama.cpp runtime profile's GPU backend, quoted where TOML needs it."""
    name = profile(runtime).backend
    return f'"{name}"' if "-" in name else name


def note_settings(notes: str, runtime: str, assumed: list, when: tuple | None = None) -> dict:
    """RowConfig fields the notes state: llama.cpp ubatch, KT threshold and chunk, decode threads."""
    def stated(pattern, what, applies=True):
        match = pattern.search(notes) if applies else None
        if match:
            assumed.append(what.format(match.group(1)))
        return int(match.group(1)) if match else 0
    kt = (runtime or "").startswith("ktransformers")
    return {"ubatch": stated(_UBATCH_NOTE, "ubatch {} from the notes"),
            "kt_threshold": stated(_KT_THRESHOLD_NOTE, "GPU prefill threshold {} (notes)", kt),
            "kt_chunk": stated(_KT_CHUNK_NOTE, "chunked prefill {} (notes)", kt),
            "decode_threads": stated(_DECODE_THREADS_NOTE, "decode on {} threads (notes)"),
            "no_flash": no_flash(notes, when, assumed),
            "repacked_cpu_weights": repacked_cpu_weights(notes, runtime, assumed),
            "swa_full": swa_full(notes, runtime, assumed)}


# llama.cpp keeps a sliding-window layer's cache to the window plus a ubatch unless --swa-full keeps all of it
# (the SWA cache of llama.cpp PR #13194); a GPU's flash attention then walks the whole cache (ik_llama.cpp
# discussion #758's A/B on an RTX 4080: gpt-oss-20b tg512 at 28,672 tokens 114.7 t/s with it, 137.5 without)
_SWA_FULL_NOTE = re.compile(r"(?<![\w-])--swa-full\b")


def swa_full(notes: str, runtime: str | None, assumed: list) -> bool:
    """A mainline llama.cpp run with --swa-full (runtimes.toml swa_full for the row)."""
    if (runtime or "llama.cpp").startswith(("llama.cpp", "ollama")) and _SWA_FULL_NOTE.search(notes):
        assumed.append("--swa-full (notes): sliding-window layers keep their whole cache; a GPU walks all of it")
        return True
    return False


# ik_llama.cpp's -rtr / --run-time-repack rewrites CPU weights into row-interleaved types (ik PR #147) that
# no GPU backend reads, so ggml's scheduler keeps their large-batch matmuls on the CPU: "the weight repacking
# prevents offloading the prompt computation" (slaren, llama.cpp issue #12481). Mainline stopped repacking
# when a GPU is present for that reason (llama.cpp PR #12498, 2025-03-21).
_RUN_TIME_REPACK_NOTE = re.compile(r"(?<![\w-])(?:-rtr|--run-time-repack)\b")


def repacked_cpu_weights(notes: str, runtime: str | None, assumed: list) -> bool:
    """ik_llama.cpp run with -rtr: its CPU-resident weights are repacked and never copied to the GPU for a
    large batch (runtimes.toml op_offload_min_batch off for the row)."""
    if (runtime or "").startswith("ik_llama.cpp") and _RUN_TIME_REPACK_NOTE.search(notes):
        assumed.append("-rtr (notes): repacked CPU weights, prompt matmuls stay on the CPU (no op offload)")
        return True
    return False


def no_flash(notes: str, when: tuple | None, assumed: list) -> bool:
    """Flash attention off: the notes say so ("no FA", "fa 0"), or a run dated before llama.cpp's auto
    default whose notes do not turn it on. ggml then computes CPU attention as mul_mat over the whole
    ubatch, with no per-row walk of the KV cache (runtimes.toml cpu_fa_query_rows 0)."""
    if _NO_FA_NOTE.search(notes):
        assumed.append("flash attention off (notes): CPU attention as mul_mat, one KV read per ubatch")
        return True
    if when is not None and when < _FA_AUTO_SINCE and not _FA_ON_NOTE.search(notes):
        assumed.append(f"flash attention off: dated {when[0]}-{when[1]:02d}, before llama.cpp's -fa auto "
                       "default (2025-09) and not turned on in the notes")
        return True
    return False


def flash_month(row: dict, notes: str, runtime: str | None) -> tuple | None:
    """The run's month where its date decides flash attention: mainline llama.cpp and Ollama (whose CPU
    flash attention walks the KV per query row) with attention on the CPU; None elsewhere."""
    rid = runtime or "llama.cpp"
    mainline = FAMILIES.get(rid) == "llama.cpp" and rid != "ik_llama.cpp"      # every era and backend, and Ollama
    place = (row.get("placement") or "").strip()
    cpu_attention = place.startswith(("cpu-only", "layers-gpu")) or (row.get("gpus") or "").strip() == "0"
    return row_month(row, notes) if mainline and cpu_attention else None


# llama.cpp ran a Gated DeltaNet layer's decode recurrence as small ops until ggml's fused GATED_DELTA_NET op
# (PR #19504, 2026-02-11, added without wiring it into the model graphs) replaced them; llama.cpp PR #20091
# of 2026-03-03 still describes the decomposed graph, so mainline runs dated before March 2026 are unfused.
# ik_llama.cpp's fused delta-net is off unless -fdn / --fused-delta-net turns it on (its PR #1315).
_DELTA_NET_FUSED_SINCE = (2026, 3)
_FUSED_DELTA_NET_NOTE = re.compile(r"(?<![\w-])(?:-fdn|--fused-delta-net)\b")


def delta_net_fused(m, row: dict, notes: str, runtime: str | None, assumed: list) -> bool | None:
    """Whether the run's build fused the Gated DeltaNet / KDA recurrence (runtimes.toml delta_net_ops), where
    its notes or date say; None: the runtime profile's default (or no such layers)."""
    if not delta_net_ops(m, 1.0).any():
        return None
    rid = runtime or "llama.cpp"
    if rid.startswith("ik_llama.cpp"):
        if _FUSED_DELTA_NET_NOTE.search(notes):
            assumed.append("fused delta-net on (notes: -fdn)")
            return True
        return None
    when = row_month(row, notes)
    if (rid.startswith("llama.cpp") or rid == "ollama") and when is not None and when < _DELTA_NET_FUSED_SINCE:
        assumed.append(f"Gated DeltaNet recurrence unfused: dated {when[0]}-{when[1]:02d}, before llama.cpp's "
                       "fused GATED_DELTA_NET op reached the model graphs (2026-03)")
        return False
    return None


# llama.cpp replayed decode steps of more than one token as CUDA graphs only from PR #19645 (2026-02-15, up to 4
# tokens through MUL_MAT_ID) and at every quantized-MoE batch from PR #26802 (2026-08-09)
_GRAPH_ERAS = (((2026, 2), 1), ((2026, 8), 4))


def graph_max_batch(row: dict, notes: str, runtime: str | None, batch: int, assumed: list) -> int | None:
    """The decode batch a mainline llama.cpp (or Ollama) build dated by the row still captured as a CUDA
    graph (runtimes.toml graph_max_batch); None: the profile's (current builds), or a batch-1 run."""
    rid = runtime or "llama.cpp"
    if batch <= 1 or rid not in ("llama.cpp", "llama.cpp-hip", "ollama"):
        return None
    when = row_month(row, notes)
    for since, limit in _GRAPH_ERAS:
        if when is not None and when < since:
            if batch > limit:
                assumed.append(f"decode at batch {batch} without CUDA graphs: dated {when[0]}-{when[1]:02d}, when "
                               f"llama.cpp captured at most {limit} token(s) per step")
            return limit
    return None


# MLX's Neural Accelerator gather kernel took 64-row blocks whatever the expert runs until ml-explore/mlx PR #4023
# (merged 2026-08-05) dispatched 32-row blocks where runs average under 64 rows (runtimes.toml moe_half_tokens_matrix)
_NAX_BLOCK_SINCE = (2026, 8)
_NAX_BLOCK_BEFORE = 64.0


def nax_gather_block(row: dict, notes: str, runtime: str | None, assumed: list) -> float | None:
    """The rows per expert at which an MLX run dated before PR #4023 prompted its routed experts at half rate on the
    M5 Neural Accelerators (its fixed 64-row block); None: the profile's (current MLX, undated rows, other runtimes
    and chips: only M5 chips take the Neural Accelerator path, engine/lower/machine.py)."""
    when = row_month(row, notes)
    if runtime != "mlx" or when is None or when >= _NAX_BLOCK_SINCE or not str(row.get("gpu", "")).startswith("m5"):
        return None
    assumed.append(f"MLX dated {when[0]}-{when[1]:02d}: the Neural Accelerators' expert gather in 64-row blocks "
                   "(before ml-explore/mlx PR #4023)")
    return _NAX_BLOCK_BEFORE


# The CUDA GPUs a dated llama.cpp build replayed decode graphs on, by compute capability: none before PR #6766
# (merged May 2024; issue #6763 and the PR measured master without graphs on 2024-04-19), then Ampere (8.0) and up
# (ggml-cuda's architecture gate: PR #7302's thread asks for Turing on 2024-05-29/30), and Volta and Turing too from
# PR #25749 (opened 2026-07-16 and carried by a fork as an open PR on 2026-07-20; the gate PR #27721 changes on
# 2026-08-25 is Volta's). Ollama vendors the same ggml-cuda.
_GRAPH_CC_ERAS = (((2024, 5), 99.0), ((2026, 8), 8.0))
_GRAPH_BRANCH_NOTE = re.compile(r"\bwith CUDA graphs\b", re.I)     # a pre-merge graph branch the notes name


def graphs_min_cc(row: dict, notes: str, runtime: str | None, cc: str | None, assumed: list) -> float | None:
    """The lowest compute capability a mainline llama.cpp (or Ollama) build dated by the row replayed decode as
    CUDA graphs on (runtimes.toml graphs_min_cc), where the row's GPU (compute capability ``cc``) is below it;
    None: the profile's (current builds, a GPU the gate passes, a non-CUDA GPU or an undated row)."""
    rid = runtime or "llama.cpp"
    if cc is None or rid not in ("llama.cpp", "llama.cpp-2024h1", "llama.cpp-2023", "ollama") or \
            _GRAPH_BRANCH_NOTE.search(notes):
        return None
    when = row_month(row, notes)
    for since, gate in _GRAPH_CC_ERAS:
        if when is not None and when < since:
            if float(cc) < gate:
                assumed.append(f"decode without CUDA graphs: dated {when[0]}-{when[1]:02d}, when llama.cpp replayed "
                               + ("none" if gate > 50 else f"them on compute capability {gate:.1f} and up only"))
                return gate
            return None
    return None


# Source documents whose rows carry no date of their own, by the month the document dates them: XiongjieDai's
# README tables run Llama 3 (released 2024-04-18) and its rows that give a month say "May 2024" (the shared
# corpus's REF-01 notes); its Apple rows (REF-02) come from the same Overview tables
_SOURCE_MONTHS = {"github.com/XiongjieDai/GPU-Benchmarks-on-LLM-Inference": (2024, 5)}


def row_month(row: dict, notes: str) -> tuple | None:
    """(year, month) of a run: the row's date column, else a month and year in the notes, else a dated
    source address, else the month its source document dates it (:data:`_SOURCE_MONTHS`); None when nothing
    dates it."""
    for text in (row.get("date") or "", notes, row.get("source_url") or "", row.get("source") or ""):
        iso = _ISO_MONTH.search(text)
        if iso and 1 <= int(iso.group(2)) <= 12:
            return int(iso.group(1)), int(iso.group(2))
        named = _MONTH_YEAR.search(text)
        if named:
            return int(named.group(2)), _MONTHS.index(named.group(1)[:3].lower()) + 1
    source = (row.get("source") or "").strip()
    return next((m for doc, m in _SOURCE_MONTHS.items() if source.startswith(doc)), None)
