"""Ingest: GGUF files (with llama.cpp splits), safetensors headers and indexes, HF config.json files,
llama.cpp -ot / --n-cpu-moe placement on real tensor names, and hostile input.

GGUF fixtures are written with gguf-py's own GGUFWriter (llama.cpp's Python package), so the reader is
checked against the format as llama.cpp's tooling writes it; expected byte counts are computed here
from gguf-py's GGML_QUANT_SIZES, independently of moesim's tables.
"""
from __future__ import annotations

import dataclasses
import json
import os
import struct
import time

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

import moesim
from moesim.spec import hardware
from moesim.ingest import gguf as GGUF
from moesim.ingest import safetensors as ST
from moesim.engine.lower import memory as mem
from moesim.engine import memory as EMEM
from moesim import ingest as models
from moesim.spec import overrides as O
from moesim.spec import quants as Q
from moesim.cli import main
from moesim.errors import MoesimError
from moesim.spec.models import Model

MACHINE = ["--gpu", "rtx-4090", "--host", "ddr5-6000x2", "--host-mem-gb", "128"]


# =================================================================================== GGUF fixtures
def _add(w: gguf.GGUFWriter, name: str, shape: tuple, typ: str) -> None:
    """Add a zero tensor of ggml *shape* (ne0 first) stored as *typ*."""
    t = T[typ]
    np_shape = tuple(reversed(shape))
    if t == T.F32:
        w.add_tensor(name, np.zeros(np_shape, np.float32))
    elif t == T.F16:
        w.add_tensor(name, np.zeros(np_shape, np.float16))
    else:
        blk, size = GGML_QUANT_SIZES[t]
        w.add_tensor(name, np.zeros(np_shape[:-1] + (np_shape[-1] // blk * size,), np.uint8), raw_dtype=t)


def _write(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def expected_bytes(shape, typ: str) -> int:
    blk, size = GGML_QUANT_SIZES[T[typ]]
    return int(np.prod(shape)) // blk * size


# A small but structurally real MoE (qwen3moe): 3 layers, 8 stacked experts, mixed quant types
# (Q4_K / Q6_K / Q8_0 / F16 / F32) as a llama.cpp Q4_K_M-style file would mix them.
H, L, E, K, FF, HEADS, KVH, HD, V = 256, 3, 8, 2, 256, 4, 2, 64, 512


def tiny_moe_tensors():
    out = [("token_embd.weight", (H, V), "Q4_K")]
    for i in range(L):
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", (H,), "F32"),
            (p + "attn_q.weight", (H, HEADS * HD), "Q4_K"),
            (p + "attn_k.weight", (H, KVH * HD), "Q4_K"),
            (p + "attn_v.weight", (H, KVH * HD), "Q6_K" if i != 1 else "Q4_K"),
            (p + "attn_output.weight", (HEADS * HD, H), "Q4_K"),
            (p + "attn_q_norm.weight", (HD,), "F32"),
            (p + "attn_k_norm.weight", (HD,), "F32"),
            (p + "ffn_norm.weight", (H,), "F32"),
            (p + "ffn_gate_inp.weight", (H, E), "F16"),
            (p + "ffn_gate_exps.weight", (H, FF, E), "Q4_K"),
            (p + "ffn_up_exps.weight", (H, FF, E), "Q8_0"),
            (p + "ffn_down_exps.weight", (FF, H, E), "Q6_K" if i != 1 else "Q4_K"),
        ]
    out += [("output_norm.weight", (H,), "F32"), ("output.weight", (H, V), "Q6_K")]
    return out


def tiny_moe_kv(w: gguf.GGUFWriter, arch="qwen3moe", blocks=L):
    w.add_uint32(f"{arch}.block_count", blocks)
    w.add_uint32(f"{arch}.context_length", 32768)
    w.add_uint32(f"{arch}.embedding_length", H)
    w.add_uint32(f"{arch}.feed_forward_length", 1024)
    w.add_uint32(f"{arch}.attention.head_count", HEADS)
    w.add_uint32(f"{arch}.attention.head_count_kv", KVH)
    w.add_uint32(f"{arch}.attention.key_length", HD)
    w.add_uint32(f"{arch}.attention.value_length", HD)
    w.add_uint32(f"{arch}.expert_count", E)
    w.add_uint32(f"{arch}.expert_used_count", K)
    w.add_uint32(f"{arch}.expert_feed_forward_length", FF)
    w.add_float32(f"{arch}.rope.freq_base", 1e6)
    w.add_uint32("general.file_type", 15)   # MOSTLY_Q4_K_M
    w.add_string("general.name", "Tiny-MoE")
    w.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(V)])
    w.add_array("tokenizer.ggml.token_type", [1] * V)
    w.add_string("tokenizer.ggml.model", "gpt2")


def write_tiny_moe(path, split_max_tensors=0, arch="qwen3moe", tensors=None, kv=None) -> str:
    w = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    tiny_moe_kv(w, arch)
    for k, v in (kv or {}).items():
        w.add_uint32(k, v)
    for name, shape, typ in (tensors or tiny_moe_tensors()):
        _add(w, name, shape, typ)
    _write(w)
    return str(path)


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    write_tiny_moe(d / "tiny.gguf")
    write_tiny_moe(d / "tiny-split.gguf", split_max_tensors=14)     # 40 tensors -> 3 shards
    return d


@pytest.fixture(scope="module")
def tiny(gguf_dir):
    return Model.from_gguf(gguf_dir / "tiny.gguf")


def _class_of(name: str) -> str:
    """Expected class by llama.cpp name, written out independently of moesim.ingest."""
    if name.startswith("token_embd"):
        return "embeddings"
    if name.startswith("output"):
        return "lm_head"
    if "_exps" in name:
        return "routed_experts"
    if "ffn_gate_inp" in name:
        return "router"
    return "attention"


# =================================================================================== GGUF reading
def test_reader_agrees_with_gguf_py_reader(gguf_dir):
    path = str(gguf_dir / "tiny.gguf")
    ref = gguf.GGUFReader(path)
    mine = GGUF.read_gguf_header(path)
    assert [t.name for t in mine.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(mine.tensors, ref.tensors):
        assert a.type_name == b.tensor_type.name
        assert a.shape == tuple(int(x) for x in b.shape)
        assert a.nbytes == b.n_bytes
        assert mine.data_offset + a.offset == b.data_offset
    assert mine.kv["general.architecture"] == "qwen3moe"
    assert mine.kv["qwen3moe.expert_count"] == E
    assert mine.kv["tokenizer.ggml.tokens"].count == V


def test_ggml_type_table_matches_gguf_py():
    for t, (blk, size) in GGML_QUANT_SIZES.items():
        if t.name == "Q8_1":
            # gguf-py 0.19 says 4 + 4 + 32 = 40 bytes; ggml's block_q8_1 is two fp16 (d, s) + 32 int8 =
            # 36 (static_assert in ggml-common.h, quants.md §1). Never a stored type either way.
            assert GGUF.ggml_type(int(t)) == ("Q8_1", 32, 36)
            continue
        assert GGUF.ggml_type(int(t))[1:] == (blk, size), t.name
        if t.name in Q.ggml_types():
            assert GGUF.ggml_type(int(t))[0] == t.name


def test_gguf_bytes_per_tensor_and_class_exact(tiny):
    spec = tiny_moe_tensors()
    table = {t.name: (t, typ, nb) for t, typ, nb in tiny.stored.table}
    assert list(table) == [n for n, _s, _t in spec]
    want_cls: dict = {}
    for name, shape, typ in spec:
        t, got_typ, nb = table[name]
        assert got_typ == typ and t.shape == shape
        assert nb == expected_bytes(shape, typ), name
        assert t.cls == _class_of(name), name
        want_cls[t.cls] = want_cls.get(t.cls, 0) + nb
    # the memory view sees exactly the file's bytes per class, through quants.assign / memory.lower
    low = mem.lower(tiny, "native")
    for cls, b in want_cls.items():
        assert low.weights_by_class[cls] == b, cls
    assert sum(low.expert_one * low.n_experts) == want_cls["routed_experts"]
    assert low.expert_one[1] == sum(expected_bytes(s, t) for n, s, t in spec if n.startswith("blk.1.") and "_exps" in n) / E


def test_gguf_architecture(tiny):
    assert tiny.family == "qwen3_moe" and tiny.name == "Tiny-MoE" and tiny.id == "tiny"
    assert (tiny.n_layers, tiny.hidden, tiny.vocab, tiny.max_context) == (L, H, V, 32768)
    assert (tiny.n_experts, tiny.top_k) == (E, K)
    a = tiny.layers[0].attention
    assert (a.kind, a.n_heads, a.n_kv_heads, a.head_dim, a.qk_norm) == ("gqa", HEADS, KVH, HD, True)
    assert tiny.layers[0].ffn.expert_intermediate == FF
    assert tiny.native_quant == "Q4_K_M"
    # KV bytes follow the architecture: 2 (K, V) x layers x kv heads x head_dim x 2 B
    r = EMEM.memory(tiny, hardware.machine("dgx-h200"), "native", context=4096, kv_dtype="f16")
    assert r.kv_bytes_per_token == 2 * L * KVH * HD * 2


def test_native_and_matching_quant_use_the_file_table(tiny):
    q = Q.resolve("native", tiny)
    assert q.kind == "stored" and q.id == "Q4_K_M" and q.is_gguf
    assert Q.resolve("Q4_K_M", tiny) == q and Q.resolve("q4_k_m", tiny) == q and Q.resolve("file", tiny) == q
    other = Q.resolve("Q2_K", tiny)
    assert other.kind == "gguf"
    # another quant re-derives types by llama.cpp's rules over the file's real tensors
    assert {t.name for t, _ty, _nb in Q.assign(tiny, other)} == {t.name for t, _ty, _nb in tiny.stored.table}
    with pytest.raises(MoesimError, match="stored tensor table"):
        Q.assign(models.model("qwen3-30b-a3b"), q)
    with pytest.raises(MoesimError, match="file"):
        Q.resolve("file", models.model("qwen3-30b-a3b"))


def test_fit_and_simulate_accept_gguf_paths(gguf_dir, capsys):
    path = str(gguf_dir / "tiny.gguf")
    total = sum(expected_bytes(s, t) for _n, s, t in tiny_moe_tensors())
    assert main(["fit", path, *MACHINE, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 1 and rows[0]["quant"] == "Q4_K_M" and rows[0]["quant_source"] == "file"
    assert rows[0]["weights_bytes"] == total
    assert main(["fit", path, *MACHINE, "--quant", "Q4_K_M", "--quant", "Q8_0", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["quant_source"] for r in rows] == ["file", "rules"]
    assert rows[0]["weights_bytes"] == total and rows[1]["weights_bytes"] != total
    assert main(["simulate", path, *MACHINE, "--tokens", "32", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["quant"] == "Q4_K_M" and d["decode_tok_s"] > 0 and d["weights_bytes"] == total
    assert moesim.model(path).stored is not None           # python API: a path wherever an id goes


# =================================================================================== splits
def test_split_shards_follow_llama_cpp_naming(gguf_dir):
    names = sorted(p.name for p in gguf_dir.glob("tiny-split-*.gguf"))
    assert names == [f"tiny-split-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    first = GGUF.read_gguf_header(gguf_dir / names[0])
    second = GGUF.read_gguf_header(gguf_dir / names[1])
    assert first.kv["split.count"] == 3 and first.kv["split.no"] == 0 and second.kv["split.no"] == 1
    assert first.kv["split.tensors.count"] == len(tiny_moe_tensors())
    assert "general.name" not in second.kv                       # metadata lives in the first shard


@pytest.mark.parametrize("shard", [1, 2, 3])
def test_split_reads_like_the_single_file(gguf_dir, tiny, shard):
    m = Model.from_gguf(gguf_dir / f"tiny-split-{shard:05d}-of-00003.gguf")
    assert [(t.name, t.shape, t.cls, typ, nb) for t, typ, nb in m.stored.table] == \
        [(t.name, t.shape, t.cls, typ, nb) for t, typ, nb in tiny.stored.table]
    assert len(m.stored.files) == 3 and m.id == "tiny-split"
    assert m.layers == tiny.layers
    assert mem.lower(m, "native").weights_by_class == mem.lower(tiny, "native").weights_by_class


def _copy_split(src_dir, dst_dir, prefix="tiny-split"):
    for p in src_dir.glob(f"{prefix}-*.gguf"):
        (dst_dir / p.name).write_bytes(p.read_bytes())
    return [dst_dir / f"{prefix}-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]


def _set_kv(path, key: str, value: int, vtype=None):
    """Rewrite one integer KV of a GGUF in place (same width)."""
    shard = GGUF.read_gguf_header(path)
    raw = bytearray(open(path, "rb").read())
    kb = key.encode()
    i = raw.find(struct.pack("<Q", len(kb)) + kb)
    assert i >= 0, key
    p = i + 8 + len(kb)
    vt = struct.unpack_from("<I", raw, p)[0]
    fmt = {2: "<H", 5: "<i", 4: "<I"}[vt]
    struct.pack_into(fmt, raw, p + 4, value)
    open(path, "wb").write(bytes(raw))
    return shard


def test_split_missing_shard(gguf_dir, tmp_path):
    paths = _copy_split(gguf_dir, tmp_path)
    paths[2].unlink()
    with pytest.raises(MoesimError, match=r"tiny-split-00003-of-00003\.gguf.*shard 3 of 3 is missing"):
        Model.from_gguf(paths[0])


@pytest.mark.parametrize("which, key, value, match", [
    (1, "split.no", 2, r"00002-of-00003\.gguf: split\.no is 2, expected 1"),
    (2, "split.count", 4, r"00003-of-00003\.gguf: split\.count is 4"),
    (0, "split.tensors.count", 41, r"00001-of-00003\.gguf: split\.tensors\.count says 41"),
    (0, "split.count", 2, r"00001-of-00003\.gguf: split\.count is 2 but the file name says 3"),
])
def test_split_shards_that_disagree(gguf_dir, tmp_path, which, key, value, match):
    paths = _copy_split(gguf_dir, tmp_path)
    _set_kv(paths[which], key, value)
    with pytest.raises(MoesimError, match=match):
        Model.from_gguf(paths[0])


def test_split_duplicate_tensor_across_shards(tmp_path):
    spec = tiny_moe_tensors()
    w = gguf.GGUFWriter(str(tmp_path / "dup.gguf"), "qwen3moe", split_max_tensors=20)
    tiny_moe_kv(w)
    for name, shape, typ in spec:
        _add(w, name, shape, typ)
    # GGUFWriter refuses duplicates itself: rename in the bytes of the second shard instead
    _write(w)
    second = tmp_path / "dup-00002-of-00002.gguf"
    raw = second.read_bytes()
    victim = next(n for n, _s, _t in spec[20:] if len(n) == len("blk.0.attn_k.weight"))
    raw = raw.replace(victim.encode(), b"blk.0.attn_k.weight", 1)
    second.write_bytes(raw)
    with pytest.raises(MoesimError, match=r"dup-00002-of-00002\.gguf: tensor 'blk\.0\.attn_k\.weight' is also in "
                                          r"dup-00001-of-00002\.gguf"):
        Model.from_gguf(tmp_path / "dup-00001-of-00002.gguf")


def test_split_architecture_disagrees(gguf_dir, tmp_path):
    paths = _copy_split(gguf_dir, tmp_path)
    # give shard 2 its own (different) architecture by rewriting it with a general.architecture KV
    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "llama")
    for n, s, t in tiny_moe_tensors()[14:28]:
        _add(w, n, s, t)
    w.add_uint16("split.no", 1)
    w.add_uint16("split.count", 3)
    w.add_int32("split.tensors.count", 40)
    _write(w)
    os.replace(tmp_path / "x.gguf", paths[1])
    with pytest.raises(MoesimError, match=r"00002-of-00003\.gguf: architecture 'llama' differs"):
        Model.from_gguf(paths[0])


# =================================================================================== -ot placement
def _devices(m, ovs, **kw):
    return {t.name: dev for t, _typ, _nb, dev in O.assign_devices(m, ovs, **kw)}


def test_ot_experts_to_cpu_exactly_as_llama_cpp(tiny):
    d = _devices(tiny, [r"\.ffn_.*_exps\.=CPU"])
    for name, dev in d.items():
        if "_exps" in name or name == "token_embd.weight":     # token_embd: input layer, always CPU
            assert dev == "CPU", name
        else:
            assert dev == "CUDA0", name


def test_n_cpu_moe_is_the_llama_cpp_block_regex(tiny):
    ovs = O.n_cpu_moe(2)
    assert [o.pattern for o in ovs] == [r"blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps",
                                        r"blk\.1\.ffn_(up|down|gate|gate_up)_(ch|)exps"]
    d = _devices(tiny, ovs)
    for name, dev in d.items():
        want = "CPU" if ("_exps" in name and name.startswith(("blk.0.", "blk.1."))) or name == "token_embd.weight" \
            else "CUDA0"
        assert dev == want, name
    # regex_search is unanchored, but the block pattern is followed by "\.ffn_": blk.1 is not blk.12
    assert not O.n_cpu_moe(2)[1].matches("blk.12.ffn_up_exps.weight")
    assert O.override(r"exps", "CPU").matches("blk.12.ffn_up_exps.weight")
    assert not O.cpu_moe().matches("blk.0.ffn_up_shexp.weight")
    assert O.cpu_moe().matches("blk.3.ffn_gate_up_exps.weight") and O.cpu_moe().matches("blk.3.ffn_down_chexps.weight")


def test_first_matching_override_wins(tiny):
    d = _devices(tiny, ["blk\\.0\\.=CUDA1", "exps=CPU", "blk\\.0\\.ffn_up_exps=CUDA2"])
    assert d["blk.0.ffn_up_exps.weight"] == "CUDA1"          # the first pattern matched first
    assert d["blk.0.attn_q.weight"] == "CUDA1"
    assert d["blk.1.ffn_up_exps.weight"] == "CPU"
    assert d["blk.1.attn_q.weight"] == "CUDA0"
    # comma lists split like parse_tensor_buffer_overrides; each item at its first '='
    ovs = O.parse_overrides("attn_q=CPU,ffn_gate_inp=CUDA1")
    assert [(o.pattern, o.device) for o in ovs] == [("attn_q", "CPU"), ("ffn_gate_inp", "CUDA1")]


def test_n_gpu_layers_rules(tiny):
    d = _devices(tiny, [], n_gpu_layers=1)             # only the last repeating layer on the GPU
    assert {n: v for n, v in d.items() if n.startswith("blk.0.")} and all(
        v == "CPU" for n, v in d.items() if n.startswith(("blk.0.", "blk.1.")))
    assert all(v == "CUDA0" for n, v in d.items() if n.startswith("blk.2."))
    assert d["output.weight"] == "CPU"                  # output layer needs -ngl > n_layer
    d = _devices(tiny, [], n_gpu_layers=L + 1)
    assert d["output.weight"] == "CUDA0" and d["token_embd.weight"] == "CPU"
    # an override still moves a tensor of a CPU layer to the GPU
    d = _devices(tiny, ["blk\\.0\\.attn=CUDA0"], n_gpu_layers=0)
    assert d["blk.0.attn_q.weight"] == "CUDA0" and d["blk.0.ffn_up_exps.weight"] == "CPU"


def test_bytes_per_device_and_equivalent_placement(tiny):
    placed = O.assign_devices(tiny, O.n_cpu_moe(2))
    bd = O.by_device(placed)
    total = sum(nb for _t, _ty, nb in tiny.stored.table)
    assert bd["CPU"]["total"] + bd["CUDA0"]["total"] == total
    exps01 = sum(expected_bytes(s, t) for n, s, t in tiny_moe_tensors()
                 if "_exps" in n and n.startswith(("blk.0.", "blk.1.")))
    assert bd["CPU"]["by_class"]["routed_experts"] == exps01
    assert bd["CPU"]["by_class"]["embeddings"] == expected_bytes((H, V), "Q4_K")
    assert str(O.equivalent_placement(tiny, placed)) == "n-cpu-moe=2"
    assert str(O.equivalent_placement(tiny, O.assign_devices(tiny, [O.cpu_moe()]))) == "experts-cpu"
    assert str(O.equivalent_placement(tiny, O.assign_devices(tiny, []))) == "all-gpu"
    assert O.equivalent_placement(tiny, O.assign_devices(tiny, ["blk\\.1\\.ffn_.*_exps=CPU"])) is None
    assert O.equivalent_placement(tiny, O.assign_devices(tiny, ["attn=CPU"])) is None
    assert O.equivalent_placement(tiny, O.assign_devices(tiny, ["ffn_down_exps=CPU"])) is None


def test_fit_with_ot_equals_the_placement(gguf_dir, capsys):
    path = str(gguf_dir / "tiny.gguf")
    assert main(["fit", path, *MACHINE, "-ot", "blk\\.[01]\\.ffn_.*_exps=CPU", "--json"]) == 0
    a = json.loads(capsys.readouterr().out)[0]
    assert main(["fit", path, *MACHINE, "--placement", "n-cpu-moe=2", "--json"]) == 0
    b = json.loads(capsys.readouterr().out)[0]
    assert a["placement"] == "n-cpu-moe=2" and a["memory_by_tier"] == b["memory_by_tier"]
    code = main(["fit", path, *MACHINE, "-ot", "attn_q=CPU"])
    assert code == 2 and "moesim inspect" in capsys.readouterr().err
    # catalog models have llama.cpp tensor names too
    assert main(["fit", "qwen3-30b-a3b", *MACHINE, "--quant", "Q4_K_M", "-ot", r"\.ffn_.*_exps\.=CPU", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["placement"] == "experts-cpu"


@pytest.mark.parametrize("spec, match", [
    ("noequals", "not PATTERN=DEVICE"), ("=CPU", "empty tensor pattern"), ("exps=", "invalid buffer type"),
    ("ex(ps=CPU", "invalid regular expression"), ("(?P<x>a)=CPU", "ECMAScript"), ("a=CP U", "invalid buffer type"),
])
def test_bad_overrides(spec, match):
    with pytest.raises(MoesimError, match=match):
        O.parse_overrides(spec)


def test_inspect_cli_per_device(gguf_dir, capsys):
    path = str(gguf_dir / "tiny-split-00001-of-00003.gguf")
    # CLI order is llama.cpp's order: -ot given first wins over the --n-cpu-moe patterns after it
    assert main(["inspect", path, "-ot", "blk\\.0\\.ffn_up_exps=CUDA1", "--n-cpu-moe", "1", "--tensors", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["format"] == "gguf" and d["exact"] and len(d["files"]) == 3 and d["tensors"] == len(tiny_moe_tensors())
    pl = d["placement"]
    assert pl["tensors"]["blk.0.ffn_up_exps.weight"] == "CUDA1"
    assert pl["tensors"]["blk.0.ffn_down_exps.weight"] == "CPU"
    assert pl["tensors"]["blk.1.ffn_down_exps.weight"] == "CUDA0"
    assert sum(v["total"] for v in pl["by_device"].values()) == d["weights_bytes"]
    assert d["architecture"]["experts"] == E and d["bytes_by_type"]["Q8_0"]["tensors"] == L
    assert main(["inspect", path, "--cpu-moe"]) == 0
    out = capsys.readouterr().out
    assert "CPU" in out and "moesim placement experts-cpu" in out and "Q4_K" in out


# =================================================================================== HF -> GGUF -> Model
def _small_hf_configs():
    base = dict(vocab_size=512, max_position_embeddings=4096, tie_word_embeddings=False)
    return {
        "qwen3moe": dict(base, model_type="qwen3_moe", hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                         moe_intermediate_size=32, intermediate_size=96),
        "deepseek2": dict(base, model_type="deepseek_v3", hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                          q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                          n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32,
                          intermediate_size=96, first_k_dense_replace=1, n_group=4, topk_group=2,
                          topk_method="noaux_tc"),
        "gpt-oss": dict(base, model_type="gpt_oss", hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
                        intermediate_size=32, sliding_window=128),
        "llama": dict(base, model_type="mixtral", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, intermediate_size=96),
    }


def _gguf_from_model(path, m: Model, arch: str):
    """Write a GGUF of *m*'s tensors (llama.cpp names) with the metadata llama.cpp's converter writes."""
    w = gguf.GGUFWriter(str(path), arch)
    A = arch
    w.add_uint32(f"{A}.block_count", m.n_layers)
    w.add_uint32(f"{A}.context_length", m.max_context)
    w.add_uint32(f"{A}.embedding_length", m.hidden)
    a = m.layers[-1].attention
    f = m.moe_layers[0].ffn
    w.add_uint32(f"{A}.attention.head_count", a.n_heads)
    w.add_uint32(f"{A}.expert_count", f.n_experts)
    w.add_uint32(f"{A}.expert_used_count", f.top_k)
    if a.kind == "mla":
        w.add_uint32(f"{A}.attention.q_lora_rank", a.q_lora_rank)
        w.add_uint32(f"{A}.attention.kv_lora_rank", a.kv_lora_rank)
        w.add_uint32(f"{A}.attention.key_length", a.kv_lora_rank + a.qk_rope_head_dim)
        w.add_uint32(f"{A}.attention.value_length", a.kv_lora_rank)
        w.add_uint32(f"{A}.attention.key_length_mla", a.qk_nope_head_dim + a.qk_rope_head_dim)
        w.add_uint32(f"{A}.attention.value_length_mla", a.v_head_dim)
        w.add_uint32(f"{A}.rope.dimension_count", a.qk_rope_head_dim)
        w.add_uint32(f"{A}.expert_shared_count", f.n_shared)
        w.add_uint32(f"{A}.expert_group_count", f.n_group)
        w.add_uint32(f"{A}.expert_group_used_count", f.topk_group)
    else:
        w.add_uint32(f"{A}.attention.head_count_kv", a.n_kv_heads)
        w.add_uint32(f"{A}.attention.key_length", a.head_dim)
        if a.window or m.layers[0].attention.window:
            w.add_uint32(f"{A}.attention.sliding_window", max(l.attention.window for l in m.layers))
    for t in m.tensors(include_mtp=False):
        _add(w, t.name, t.shape, "F32" if len(t.shape) == 1 else "F16")
    _write(w)
    return path


@pytest.mark.parametrize("arch", sorted(_small_hf_configs()))
def test_hf_config_and_gguf_give_the_same_layers(tmp_path, arch):
    hf = Model.from_hf_config(_small_hf_configs()[arch], id="x")
    g = Model.from_gguf(_gguf_from_model(tmp_path / "x.gguf", hf, arch))
    assert g.layers == hf.layers
    assert (g.hidden, g.vocab, g.tie_embeddings, g.max_context) == (hf.hidden, hf.vocab, hf.tie_embeddings, hf.max_context)
    assert g.param_counts() == hf.param_counts()
    low_g, low_h = mem.lower(g, "Q8_0"), mem.lower(hf, "Q8_0")      # llama.cpp's rules over the same tensors
    assert low_g.weights_by_class == low_h.weights_by_class
    assert np.array_equal(low_g.kv_elems, low_h.kv_elems) and np.array_equal(low_g.kv_cap, low_h.kv_cap)


def test_glm_nextn_block_is_mtp_as_llama_cpp_converts_it(tmp_path):
    # convert_hf_to_gguf Glm4MoeModel: block_count = num_hidden_layers + num_nextn_predict_layers; the
    # NextN block is stored (blk.<n>.*) and llama.cpp creates it with TENSOR_SKIP.
    cfg = dict(model_type="glm4_moe", hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
               moe_intermediate_size=32, intermediate_size=96, first_k_dense_replace=1, num_nextn_predict_layers=1,
               attention_bias=True, vocab_size=512, max_position_embeddings=4096, tie_word_embeddings=False)
    hf = Model.from_hf_config(cfg, id="glm")
    w = gguf.GGUFWriter(str(tmp_path / "glm.gguf"), "glm4moe")
    A = "glm4moe"
    for k, v in (("block_count", 4), ("nextn_predict_layers", 1), ("context_length", 4096), ("embedding_length", 64),
                 ("attention.head_count", 4), ("attention.head_count_kv", 2), ("attention.key_length", 16),
                 ("expert_count", 8), ("expert_used_count", 2), ("expert_shared_count", 1),
                 ("leading_dense_block_count", 1)):
        w.add_uint32(f"{A}.{k}", v)
    w.add_custom_alignment(64)
    for t in hf.tensors(include_mtp=True):
        _add(w, t.name, t.shape, "F32" if len(t.shape) == 1 else "F16")
    _write(w)
    g = Model.from_gguf(tmp_path / "glm.gguf")
    assert GGUF.read_gguf_header(tmp_path / "glm.gguf").alignment == 64
    assert g.layers == hf.layers and g.mtp_layers == 1 and g.mtp_layer == hf.mtp_layer
    mtp = [t for t, _ty, _nb in g.stored.table if t.cls == "mtp"]
    assert mtp and all(t.name.startswith("blk.3.") for t in mtp)
    placed = O.assign_devices(g, [O.cpu_moe()])
    assert str(O.equivalent_placement(g, placed)) == "experts-cpu"
    assert "mtp" not in O.by_device(placed)["CPU"]["by_class"]
    assert O.by_device(placed, include_mtp=True)["CPU"]["by_class"]["mtp"] > 0
    low = mem.lower(g, "native")
    assert low.mtp == sum(nb for t, _ty, nb in g.stored.table if t.cls == "mtp") and low.mtp_layers == 1


def test_inspect_config_and_refusals(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(_DS_V3))
    assert main(["inspect", str(tmp_path / "config.json"), "-ot", "exps=CPU", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    cat = models.model("deepseek-v3")
    assert d["format"] == "config" and not d["exact"] and d["quant"] == "fp8"
    assert d["weights_bytes"] == sum(Q.bytes_by_class(cat, "fp8").values())          # MTP reported apart
    assert d["mtp_bytes"] == Q.bytes_by_class(cat, "fp8", include_mtp=True)["mtp"] > 0
    assert d["kv_bytes_per_token"] == 70_272 and d["placement"]["equivalent"] == "experts-cpu"
    assert d["architecture"]["experts"] == 256 and d["architecture"]["mtp_layers"] == 1
    # a safetensors checkpoint has Hugging Face names: llama.cpp overrides do not apply to it
    write_hf_checkpoint(tmp_path / "ck", _ST_CFG)
    assert main(["inspect", str(tmp_path / "ck"), "--cpu-moe"]) == 2
    assert "Hugging Face names" in capsys.readouterr().err
    (tmp_path / "weights.bin").write_bytes(b"\0" * 64)
    with pytest.raises(MoesimError, match="is not a GGUF file, a safetensors"):
        moesim.model(str(tmp_path / "weights.bin"))


# =================================================================================== HF configs (models.md)
_DS_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"}, "aux_loss_alpha": 0.001,
    "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu",
    "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "pretraining_tp": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                                    "quant_method": "fp8", "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                            "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                            "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.46.3", "use_cache": True, "v_head_dim": 128, "vocab_size": 129280,
}
_ALT = ["sliding_attention", "full_attention"]
_SCOUT_TEXT = {
    "attention_bias": False, "attention_chunk_size": 8192, "attn_scale": 0.1, "attn_temperature_tuning": True,
    "bos_token_id": 200000, "eos_token_id": [200001, 200007, 200008], "floor_scale": 8192, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 5120, "interleave_moe_layer_step": 1, "intermediate_size": 8192,
    "intermediate_size_mlp": 16384, "max_position_embeddings": 10485760, "model_type": "llama4_text",
    "moe_layers": list(range(48)), "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(48)],
    "num_attention_heads": 40, "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8,
    "num_local_experts": 16, "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 16.0, "rope_type": "llama3"},
    "rope_theta": 500000.0, "torch_dtype": "bfloat16", "use_qk_norm": True, "vocab_size": 202048,
}
REAL_CONFIGS = {
    "deepseek-v3": _DS_V3,
    "kimi-k2": dict(_DS_V3, model_type="kimi_k2", num_attention_heads=64, num_key_value_heads=64,
                    n_routed_experts=384, first_k_dense_replace=1, n_group=1, topk_group=1,
                    routed_scaling_factor=2.827, num_nextn_predict_layers=0, max_position_embeddings=131072,
                    rope_theta=50000.0, vocab_size=163840),
    "deepseek-v2-lite": {
        "architectures": ["DeepseekV2ForCausalLM"], "aux_loss_alpha": 0.001, "first_k_dense_replace": 1,
        "hidden_size": 2048, "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
        "model_type": "deepseek_v2", "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1,
        "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": False, "num_attention_heads": 16,
        "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16, "q_lora_rank": None,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
        "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16",
        "v_head_dim": 128, "vocab_size": 102400,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                         "original_max_position_embeddings": 4096, "type": "yarn"}},
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
        "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
        "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
        "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 151936},
    "qwen3-next-80b-a3b": {
        "architectures": ["Qwen3NextForCausalLM"], "attention_bias": False, "decoder_sparse_step": 1,
        "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048,
        "intermediate_size": 5120, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
        "linear_num_value_heads": 32, "linear_value_head_dim": 128, "max_position_embeddings": 262144,
        "mlp_only_layers": [], "model_type": "qwen3_next", "moe_intermediate_size": 512, "norm_topk_prob": True,
        "num_attention_heads": 16, "num_experts": 512, "num_experts_per_tok": 10, "num_hidden_layers": 48,
        "num_key_value_heads": 2, "partial_rotary_factor": 0.25, "rope_theta": 10000000,
        "shared_expert_intermediate_size": 512, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "vocab_size": 151936},
    "gpt-oss-20b": {
        "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
        "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
        "initial_context_length": 4096, "intermediate_size": 2880, "layer_types": _ALT * 12,
        "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
        "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32,
        "pad_token_id": 199999,
        "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                           "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
        "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": False,
        "vocab_size": 201088},
    "mixtral-8x7b": {
        "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768,
        "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "num_local_experts": 8, "rms_norm_eps": 1e-05, "rope_theta": 1e6,
        "router_aux_loss_coef": 0.02, "sliding_window": None, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "vocab_size": 32000},
    "llama-4-scout": {
        "architectures": ["Llama4ForConditionalGeneration"], "boi_token_index": 200080, "model_type": "llama4",
        "text_config": _SCOUT_TEXT, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "vision_config": {"hidden_size": 1408, "model_type": "llama4_vision_model", "num_hidden_layers": 34}},
    "glm-4.5-air": {
        "architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
        "pad_token_id": 151329, "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 4096, "partial_rotary_factor": 0.5, "initializer_range": 0.02, "intermediate_size": 10944,
        "max_position_embeddings": 131072, "model_type": "glm4_moe", "moe_intermediate_size": 1408,
        "norm_topk_prob": True, "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 128,
        "n_shared_experts": 1, "routed_scaling_factor": 1.0, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
        "num_hidden_layers": 46, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000,
        "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "use_qk_norm": False, "vocab_size": 151552},
    "dbrx": {
        "architectures": ["DbrxForCausalLM"], "attn_config": {"clip_qkv": 8, "kv_n_heads": 8, "model_type": "",
                                                             "rope_theta": 500000},
        "d_model": 6144, "emb_pdrop": 0.0, "ffn_config": {"ffn_hidden_size": 10752, "model_type": "",
                                                          "moe_jitter_eps": 0.01, "moe_loss_weight": 0.05,
                                                          "moe_num_experts": 16, "moe_top_k": 4},
        "max_seq_len": 32768, "model_type": "dbrx", "n_heads": 48, "n_layers": 40, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "vocab_size": 100352},
    "minimax-m2": {
        "architectures": ["MiniMaxM2ForCausalLM"], "attn_type_list": [1] * 62, "head_dim": 128, "hidden_size": 3072,
        "intermediate_size": 1536, "max_position_embeddings": 196608, "model_type": "minimax_m2",
        "mtp_transformer_layers": 1, "num_attention_heads": 48, "num_experts_per_tok": 8, "num_hidden_layers": 62,
        "num_key_value_heads": 8, "num_local_experts": 256, "num_mtp_modules": 3, "qk_norm_type": "per_layer",
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "float8_e4m3fn", "quant_method": "fp8",
                                "weight_block_size": [128, 128],
                                "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"]},
        "rope_theta": 5000000, "rotary_dim": 64, "scoring_func": "sigmoid", "shared_intermediate_size": 0,
        "tie_word_embeddings": False, "use_mtp": True, "use_qk_norm": True, "use_routing_bias": True,
        "vocab_size": 200064},
    "ernie-4.5-300b-a47b": {
        "architectures": ["Ernie4_5_MoeForCausalLM"], "hidden_size": 8192, "intermediate_size": 28672,
        "max_position_embeddings": 131072, "model_type": "ernie4_5_moe", "num_attention_heads": 64,
        "num_key_value_heads": 8, "num_hidden_layers": 54, "rms_norm_eps": 1e-05, "vocab_size": 103424,
        "rope_theta": 500000, "use_bias": False, "tie_word_embeddings": True, "moe_num_experts": 64,
        "moe_num_shared_experts": 0, "moe_layer_start_index": 3, "moe_layer_end_index": -1,
        "moe_intermediate_size": 3584, "moe_capacity": [64, 64, 64], "moe_gate": "topk", "moe_k": 8,
        "moe_layer_interval": 1, "moe_use_aux_free": True, "torch_dtype": "bfloat16"},
    "kimi-linear-48b-a3b": {
        "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "hidden_size": 2304,
        "num_hidden_layers": 27, "vocab_size": 163840, "tie_word_embeddings": False, "num_attention_heads": 32,
        "num_key_value_heads": 32, "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True, "num_experts": 256,
        "num_experts_per_token": 8, "num_shared_experts": 1, "moe_intermediate_size": 1024,
        "intermediate_size": 9216, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "moe_router_activation_func": "sigmoid", "moe_renormalize": True, "num_expert_group": 1, "topk_group": 1,
        "routed_scaling_factor": 2.446, "max_position_embeddings": 1048576, "torch_dtype": "bfloat16",
        "linear_attn_config": {"full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
                               "kda_layers": [i for i in range(1, 28) if i not in (4, 8, 12, 16, 20, 24, 27)],
                               "num_heads": 32, "head_dim": 128, "short_conv_kernel_size": 4}},
    "llama-2-7b": {
        "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
        "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
        "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "tie_word_embeddings": False,
        "torch_dtype": "float16", "use_cache": True, "vocab_size": 32000},
}


@pytest.mark.parametrize("mid", sorted(REAL_CONFIGS))
def test_real_hf_configs_round_trip_to_catalog(mid, tmp_path):
    cat = models.model(mid)
    (tmp_path / "config.json").write_text(json.dumps(REAL_CONFIGS[mid]))
    parsed = Model.from_hf_config(tmp_path, id=mid)
    # MiniMax's real quantization_config carries modules_to_not_convert the catalog copy omits: the
    # scheme object differs, the bytes it gives do not.
    assert dataclasses.replace(parsed, quant_scheme=cat.quant_scheme) == cat
    assert parsed.param_counts() == cat.param_counts()
    assert Q.bytes_by_class(parsed, "native") == Q.bytes_by_class(cat, "native")
    assert parsed.native_quant == cat.native_quant


def test_ernie_end_index_minus_one_and_llama4_lists():
    cfg = dict(REAL_CONFIGS["ernie-4.5-300b-a47b"], moe_layer_end_index=53)
    assert Model.from_hf_config(cfg, id="e").layers == models.model("ernie-4.5-300b-a47b").layers
    # Maverick: interleave step 2 written out as moe_layers
    mav = dict(_SCOUT_TEXT, interleave_moe_layer_step=2, moe_layers=list(range(1, 48, 2)), num_local_experts=128,
               use_qk_norm=False, max_position_embeddings=1048576)
    m = Model.from_hf_config({"model_type": "llama4", "text_config": mav}, id="m")
    assert m.layers == models.model("llama-4-maverick").layers


# ------------------------------------------------------------------ quantization_config -> formats
def _types_by_class(m, quant="native"):
    out: dict = {}
    for t, typ, _nb in Q.assign(m, quant):
        out.setdefault(t.cls, set()).add(typ)
    return out


def test_kimi_k25_compressed_tensors_int4_experts_only():
    cfg = dict(REAL_CONFIGS["kimi-k2"], quantization_config={
        "config_groups": {"group_0": {"input_activations": None, "output_activations": None, "targets": ["Linear"],
                                      "weights": {"actorder": None, "dynamic": False, "group_size": 32, "num_bits": 4,
                                                  "observer": "minmax", "strategy": "group", "symmetric": True,
                                                  "type": "int"}}},
        "format": "pack-quantized", "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                                               "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
        "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed"})
    m = Model.from_hf_config(cfg, id="kimi-k2.5")
    assert m.native_quant == "int4-g32"
    types = _types_by_class(m)
    assert types["routed_experts"] == {"int4-g32"}
    assert types["shared_experts"] == types["dense_ffn"] == types["attention"] == {"bf16"}
    t, typ, nb = next(e for e in Q.assign(m, "native") if e[0].name == "blk.5.ffn_down_exps.weight")
    assert nb == t.n_elements // 2 + t.n_elements // 32 * 2       # 4-bit codes + a bf16 scale per 32 (4.5 bpw)


def test_gpt_oss_mxfp4_and_deepseek_fp8_per_tensor():
    m = Model.from_hf_config(REAL_CONFIGS["gpt-oss-20b"], id="g")
    types = _types_by_class(m)
    assert types["routed_experts"] == {"mxfp4", "bf16"}            # weights mxfp4, expert biases bf16
    assert types["attention"] == types["router"] == types["lm_head"] == {"bf16"}
    ds = Model.from_hf_config(_DS_V3, id="d")
    assert Q.bytes_by_class(ds, "native") == Q.bytes_by_class(ds, "fp8")
    t, typ, nb = next(e for e in Q.assign(ds, "native") if e[0].name == "blk.5.attn_q_a.weight")
    assert typ == "fp8" and nb == 7168 * 1536 + 56 * 12 * 4       # one fp32 scale per 128x128 block


def test_modelopt_nvfp4_excludes_attention_and_qwen_fp8_not_convert():
    cfg = dict(_DS_V3, quantization_config={"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                            "exclude_modules": ["lm_head", "model.layers.*.self_attn*"]})
    m = Model.from_hf_config(cfg, id="ds-nvfp4")
    types = _types_by_class(m)
    assert m.native_quant == "nvfp4" and types["routed_experts"] == types["shared_experts"] == {"nvfp4"}
    assert types["attention"] == {"bf16"} and types["lm_head"] == {"bf16"}
    q = dict(REAL_CONFIGS["qwen3-30b-a3b"], quantization_config={
        "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128],
        "modules_to_not_convert": ["lm_head"] + [f"model.layers.{i}.mlp.gate" for i in range(48)]})
    types = _types_by_class(Model.from_hf_config(q, id="q"))
    assert types["attention"] >= {"fp8"} and types["routed_experts"] == {"fp8"} and types["router"] == {"bf16"}


@pytest.mark.parametrize("qc, match", [
    ({"quant_method": "hqq"}, "unsupported quant_method"),
    ({"quant_method": "fp8", "weight_block_size": [0, 128]}, "weight_block_size"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 5}}}}, "num_bits"),
    ({"quant_method": "modelopt", "quant_algo": "W4A8"}, "quant_algo"),
    ("fp8", "must be an object"),
])
def test_bad_quantization_config(qc, match):
    with pytest.raises(MoesimError, match=match):
        Model.from_hf_config(dict(REAL_CONFIGS["qwen3-30b-a3b"], quantization_config=qc), id="x")


@pytest.mark.parametrize("change, field", [
    ({"num_hidden_layers": "48"}, "num_hidden_layers"), ({"mlp_only_layers": "all"}, "mlp_only_layers"),
    ({"decoder_sparse_step": "x"}, "decoder_sparse_step"), ({"model_type": "mamba"}, "model_type"),
])
def test_malformed_hf_config(change, field):
    with pytest.raises(MoesimError) as ei:
        Model.from_hf_config(dict(REAL_CONFIGS["qwen3-30b-a3b"], **change), id="x")
    assert ei.value.field == field


def test_bad_config_file(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{not json")
    with pytest.raises(MoesimError, match=r"config\.json.*not valid JSON"):
        Model.from_hf_config(p)
    for bad, field in (("[1, 2]", "config"), (json.dumps(dict(REAL_CONFIGS["qwen3-30b-a3b"], model_type="mamba")),
                                               "model_type"),
                       (json.dumps(dict(REAL_CONFIGS["qwen3-30b-a3b"], num_experts_per_tok=999)), "num_experts_per_tok")):
        p.write_text(bad)
        with pytest.raises(MoesimError) as ei:
            moesim.model(str(p))
        assert str(p) in str(ei.value) and ei.value.field == field and str(ei.value).count(f"{field}:") == 1
    with pytest.raises(MoesimError, match="no such file"):
        moesim.model(str(tmp_path / "missing" / "config.json"))


# =================================================================================== safetensors
def write_safetensors(path, tensors: dict, pad_to: int = 8) -> None:
    """{name: (dtype, torch shape)} as a safetensors file of zeros (header padded like the library)."""
    bits = ST.ST_DTYPE_BITS
    header, off = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = int(np.prod(shape)) * bits[dtype] // 8
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps({"__metadata__": {"format": "pt"}, **header}).encode()
    raw += b" " * (-len(raw) % pad_to)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(8 + len(raw) + off)


_ST_CFG = dict(model_type="qwen3_moe", hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=64, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
               intermediate_size=512, vocab_size=512, max_position_embeddings=4096, tie_word_embeddings=False)


def _hf_tensors(cfg, fp8=False):
    h, hd, nh, kv, ff, e = (cfg["hidden_size"], cfg["head_dim"], cfg["num_attention_heads"],
                            cfg["num_key_value_heads"], cfg["moe_intermediate_size"], cfg["num_experts"])
    lin = "F8_E4M3" if fp8 else "BF16"
    out = {"model.embed_tokens.weight": ("BF16", (cfg["vocab_size"], h))}

    def linear(name, o, i):
        out[name + ".weight"] = (lin, (o, i))
        if fp8:
            out[name + ".weight_scale_inv"] = ("F32", (-(-o // 128), -(-i // 128)))

    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = ("BF16", (h,))
        out[p + "post_attention_layernorm.weight"] = ("BF16", (h,))
        linear(p + "self_attn.q_proj", nh * hd, h)
        linear(p + "self_attn.k_proj", kv * hd, h)
        linear(p + "self_attn.v_proj", kv * hd, h)
        linear(p + "self_attn.o_proj", h, nh * hd)
        out[p + "self_attn.q_norm.weight"] = ("BF16", (hd,))
        out[p + "self_attn.k_norm.weight"] = ("BF16", (hd,))
        out[p + "mlp.gate.weight"] = ("BF16", (e, h))
        for x in range(e):
            linear(p + f"mlp.experts.{x}.gate_proj", ff, h)
            linear(p + f"mlp.experts.{x}.up_proj", ff, h)
            linear(p + f"mlp.experts.{x}.down_proj", h, ff)
    out["model.norm.weight"] = ("BF16", (h,))
    out["lm_head.weight"] = ("BF16", (cfg["vocab_size"], h))
    return out


def write_hf_checkpoint(d, cfg, fp8=False, shards=2):
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    tensors = _hf_tensors(cfg, fp8)
    names = list(tensors)
    per = -(-len(names) // shards)
    wm = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s * per:(s + 1) * per]}
        write_safetensors(d / fname, part)
        wm.update({n: fname for n in part})
    total = sum(int(np.prod(s)) * ST.ST_DTYPE_BITS[dt] // 8 for dt, s in tensors.values())
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": wm}))
    return tensors, total


@pytest.mark.parametrize("fp8", [False, True])
def test_safetensors_headers_exact_and_equal_to_the_config_inventory(tmp_path, fp8):
    cfg = dict(_ST_CFG)
    if fp8:
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": [128, 128]}
    tensors, total = write_hf_checkpoint(tmp_path / "ckpt", cfg, fp8=fp8)
    m = Model.from_safetensors(tmp_path / "ckpt" / "model.safetensors.index.json")
    assert m.stored is not None and m.stored.container == "safetensors"
    assert sum(nb for _t, _ty, nb in m.stored.table) == total
    assert m.stored.label == ("fp8" if fp8 else "bf16")
    # the exact bytes per class read from the headers equal what moesim derives from config.json alone
    from_headers = mem.lower(m, "native").weights_by_class
    checkpoint = Q.native_quant(Model.from_hf_config(cfg, id="c")) if fp8 else Q.Quant("bf16", "format")
    from_config = mem.lower(Model.from_hf_config(cfg, id="c"), checkpoint).weights_by_class
    assert from_headers == from_config
    assert from_headers["routed_experts"] > 0 and from_headers["router"] == 4 * 256 * 2 * 2
    # the directory and a single shard path resolve to the same artifact; fit accepts the directory
    assert Model.from_safetensors(tmp_path / "ckpt").stored == m.stored
    r = moesim.fit(str(tmp_path / "ckpt"), hardware.machine("dgx-h200"))
    assert r[0]["quant_source"] == "file" and r[0]["weights_bytes"] == total


def test_safetensors_index_only(tmp_path, capsys):
    tensors, total = write_hf_checkpoint(tmp_path / "c", _ST_CFG)
    for p in (tmp_path / "c").glob("*.safetensors"):
        p.unlink()
    m = Model.from_safetensors(tmp_path / "c" / "model.safetensors.index.json")
    assert m.stored is None and m.layers == Model.from_hf_config(_ST_CFG, id="x").layers
    assert main(["inspect", str(tmp_path / "c" / "model.safetensors.index.json"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["index"]["total_size"] == total and d["index"]["tensors"] == len(tensors)
    assert d["index"]["shards_present"] == 0 and not d["exact"]
    assert d["weights_bytes"] == total         # bf16 everywhere: the config-derived bytes agree with total_size


def test_safetensors_without_config_inspects_tensors_only(tmp_path, capsys):
    write_safetensors(tmp_path / "w.safetensors", {"a.weight": ("BF16", (4, 8)), "b": ("F32", (3,))})
    assert main(["inspect", str(tmp_path / "w.safetensors"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["weights_bytes"] == 4 * 8 * 2 + 12 and d["architecture"] is None and "config.json" in d["notes"][0]
    with pytest.raises(MoesimError, match="config.json"):
        Model.from_safetensors(tmp_path / "w.safetensors")


def _hostile_st(path, mutate):
    write_safetensors(path, {"a": ("F32", (2, 2)), "b": ("BF16", (4,))})
    raw = bytearray(path.read_bytes())
    n = struct.unpack_from("<Q", raw)[0]
    header = json.loads(raw[8:8 + n])
    out = mutate(raw, header)
    if isinstance(out, dict):
        hb = json.dumps(out).encode()
        raw = bytearray(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])
    elif out is not None:
        raw = out
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("mutate, match", [
    (lambda raw, h: raw[:5], "truncated"),
    (lambda raw, h: bytearray(struct.pack("<Q", 1 << 60)) + raw[8:], "exceeds the safetensors limit"),
    (lambda raw, h: bytearray(struct.pack("<Q", 10_000)) + raw[8:], "truncated"),
    (lambda raw, h: raw[:-3], "truncated"),
    (lambda raw, h: raw + b"xx", "follow the last tensor"),
    (lambda raw, h: dict(h, a=dict(h["a"], dtype="Q9")), "unknown dtype"),
    (lambda raw, h: dict(h, a=dict(h["a"], shape=[3, 3])), "needs 36 bytes"),
    (lambda raw, h: dict(h, a=dict(h["a"], shape=[-2, 2])), "invalid shape"),
    (lambda raw, h: dict(h, b=dict(h["b"], data_offsets=[20, 28])), "expected 16"),
    (lambda raw, h: dict(h, a=[1, 2]), "not an object"),
    (lambda raw, h: bytearray(struct.pack("<Q", 4)) + b"[1] " + raw[8:], "not a JSON object"),
    (lambda raw, h: bytearray(struct.pack("<Q", 8)) + b"{\"a\":\xff}" + raw[8:], "not valid JSON"),
])
def test_hostile_safetensors(tmp_path, mutate, match):
    p = tmp_path / "h.safetensors"
    _hostile_st(p, mutate)
    with pytest.raises(MoesimError, match=match) as ei:
        ST.read_safetensors_header(p)
    assert str(p) in str(ei.value)


def test_safetensors_index_disagreements(tmp_path):
    d = tmp_path / "c"
    write_hf_checkpoint(d, _ST_CFG)
    idx = d / "model.safetensors.index.json"
    good = json.loads(idx.read_text())
    # a tensor the index maps to shard 2 lives in shard 1
    bad = json.loads(json.dumps(good))
    name = next(n for n, f in bad["weight_map"].items() if f.startswith("model-00001"))
    bad["weight_map"][name] = "model-00002-of-00002.safetensors"
    idx.write_text(json.dumps(bad))
    with pytest.raises(MoesimError, match="shards disagree"):
        Model.from_safetensors(idx)
    # the index lists a tensor no shard holds
    bad = json.loads(json.dumps(good))
    bad["weight_map"]["model.layers.9.ghost.weight"] = "model-00001-of-00002.safetensors"
    idx.write_text(json.dumps(bad))
    with pytest.raises(MoesimError, match=r"model-00001-of-00002\.safetensors: lacks tensor 'model\.layers\.9\.ghost"):
        Model.from_safetensors(idx)
    # a shard holds a tensor the index does not list
    bad = json.loads(json.dumps(good))
    del bad["weight_map"][name]
    idx.write_text(json.dumps(bad))
    with pytest.raises(MoesimError, match="index does not list"):
        Model.from_safetensors(idx)
    # weight_map entries must be file names in the same directory
    bad = json.loads(json.dumps(good))
    bad["weight_map"][name] = "../../etc/passwd.safetensors"
    idx.write_text(json.dumps(bad))
    with pytest.raises(MoesimError, match="not a .safetensors file name"):
        Model.from_safetensors(idx)


# =================================================================================== hostile GGUF
@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory):
    """A few-KB valid GGUF (qwen3moe, 1 layer, F32/Q8_0) for hostile-input and fuzz tests."""
    d = tmp_path_factory.mktemp("small")
    h, e, ff, v = 32, 2, 32, 16
    w = gguf.GGUFWriter(str(d / "small.gguf"), "qwen3moe")
    for k, val in (("block_count", 1), ("context_length", 256), ("embedding_length", h),
                   ("attention.head_count", 2), ("attention.head_count_kv", 1), ("expert_count", e),
                   ("expert_used_count", 1), ("feed_forward_length", 64)):
        w.add_uint32(f"qwen3moe.{k}", val)
    w.add_uint32("general.file_type", 7)
    w.add_string("general.name", "small")
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(v)])
    w.add_array("qwen3moe.attention.head_count_kv_list", [1, 1])
    for name, shape, typ in [("token_embd.weight", (h, v), "Q8_0"), ("blk.0.attn_norm.weight", (h,), "F32"),
                             ("blk.0.attn_q.weight", (h, h), "Q8_0"), ("blk.0.attn_k.weight", (h, 16), "Q8_0"),
                             ("blk.0.attn_v.weight", (h, 16), "Q8_0"), ("blk.0.attn_output.weight", (h, h), "Q8_0"),
                             ("blk.0.ffn_gate_inp.weight", (h, e), "F32"),
                             ("blk.0.ffn_gate_exps.weight", (h, ff, e), "Q8_0"),
                             ("blk.0.ffn_up_exps.weight", (h, ff, e), "Q8_0"),
                             ("blk.0.ffn_down_exps.weight", (ff, h, e), "Q8_0"),
                             ("output_norm.weight", (h,), "F32")]:
        _add(w, name, shape, typ)
    _write(w)
    p = d / "small.gguf"
    assert Model.from_gguf(p).n_experts == e
    return p


def _header_end(path) -> int:
    return GGUF.read_gguf_header(path).data_offset


def _patch(raw: bytes, find: bytes, new: bytes, after: int = 0) -> bytes:
    i = raw.find(find)
    assert i >= 0, find
    return raw[:i + after] + new + raw[i + after + len(new):]


def _u64_after(raw: bytes, key: bytes, value: int) -> bytes:
    """Overwrite the u64 that follows key's bytes + a u32 value type (a string/array length)."""
    i = raw.find(key)
    assert i >= 0
    p = i + len(key) + 4
    return raw[:p] + struct.pack("<Q", value) + raw[p + 8:]


HOSTILE = {
    "wrong magic": (lambda r: b"GGML" + r[4:], "not a GGUF file"),
    "empty": (lambda r: b"", "truncated"),
    "header cut": (lambda r: r[:20], "truncated"),
    "version 1": (lambda r: r[:4] + struct.pack("<I", 1) + r[8:], "version 1"),
    "version 99": (lambda r: r[:4] + struct.pack("<I", 99) + r[8:], "unsupported GGUF version 99"),
    "big endian": (lambda r: r[:4] + struct.pack(">I", 3) + r[8:], "big-endian"),
    "absurd tensor count": (lambda r: r[:8] + struct.pack("<Q", 1 << 62) + r[16:], "claims 4611686018427387904 tensors"),
    "tensor count over file": (lambda r: r[:8] + struct.pack("<Q", 10_000) + r[16:], "claims 10000 tensors"),
    "absurd kv count": (lambda r: r[:16] + struct.pack("<Q", 1 << 40) + r[24:], "metadata keys"),
    "huge key length": (lambda r: r[:24] + struct.pack("<Q", 1 << 50) + r[32:], "limit"),
    "huge string value": (lambda r: _u64_after(r, b"general.name", 1 << 40), "general.name.*limit"),
    "huge array": (lambda r: _patch(r, b"tokenizer.ggml.tokens", struct.pack("<IQ", 8, 1 << 40),
                                    len(b"tokenizer.ggml.tokens") + 4), "claims 1099511627776 array elements"),
    "nested array": (lambda r: _patch(r, b"head_count_kv_list", struct.pack("<I", 9),
                                      len(b"head_count_kv_list") + 4), "nested array"),
    "unknown value type": (lambda r: _patch(r, b"general.name", struct.pack("<I", 77), len(b"general.name")),
                           "unknown value type 77"),
    "unknown ggml type": (lambda r: _patch(r, b"output_norm.weight", struct.pack("<I", 250),
                                           len(b"output_norm.weight") + 4 + 8), "unknown or removed ggml type id 250"),
    "removed ggml type": (lambda r: _patch(r, b"output_norm.weight", struct.pack("<I", 4),
                                           len(b"output_norm.weight") + 4 + 8), "removed ggml type id 4"),
    "too many dims": (lambda r: _patch(r, b"output_norm.weight", struct.pack("<I", 9), len(b"output_norm.weight")),
                      "9 dimensions"),
    "ne0 not a block multiple": (lambda r: _patch(r, b"blk.0.attn_q.weight", struct.pack("<Q", 33),
                                                  len(b"blk.0.attn_q.weight") + 4), "not a multiple of the block size 32"),
    "negative dim": (lambda r: _patch(r, b"output_norm.weight", struct.pack("<Q", 1 << 63),
                                      len(b"output_norm.weight") + 4), "negative dimension"),
    "bad offset": (lambda r: _patch(r, b"output_norm.weight", struct.pack("<Q", 7), len(b"output_norm.weight") + 16),
                   "has data offset 7, expected"),
    "duplicate tensor": (lambda r: _patch(r, b"blk.0.attn_k.weight", b"blk.0.attn_q.weight"), "duplicate tensor"),
    "duplicate key": (lambda r: _patch(r, b"qwen3moe.context_length", b"qwen3moe.embedding_leng"[:23]),
                      None),
    "data truncated": (lambda r: r[:-40], "data of tensor 'output_norm.weight' ends at byte"),
    "unknown architecture": (lambda r: _patch(r, b"qwen3moe", b"qwen9moe"), "unsupported GGUF architecture 'qwen9moe'"),
    "no block count": (lambda r: _patch(r, b"qwen3moe.block_count", b"qwen3moe.block_cOunt"),
                       "lacks required metadata 'qwen3moe.block_count'"),
    "block beyond count": (lambda r: _patch(r, b"blk.0.attn_v.weight", b"blk.7.attn_v.weight"),
                           "is in block 7 but qwen3moe.block_count is 1"),
    "expert count disagrees": (lambda r: _patch(r, b"qwen3moe.expert_count", struct.pack("<I", 64),
                                                len(b"qwen3moe.expert_count") + 4), "expert_count is 64"),
    "top-k above experts": (lambda r: _patch(r, b"qwen3moe.expert_used_count", struct.pack("<I", 9),
                                             len(b"qwen3moe.expert_used_count") + 4), "expert_used_count 9"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_gguf(small_gguf, tmp_path, case):
    mutate, match = HOSTILE[case]
    raw = mutate(small_gguf.read_bytes())
    p = tmp_path / "bad.gguf"
    p.write_bytes(raw)
    t0 = time.perf_counter()
    with pytest.raises(MoesimError) as ei:
        Model.from_gguf(p)
    assert time.perf_counter() - t0 < 1.0
    msg = str(ei.value)
    assert str(p) in msg, msg
    if match:
        import re
        assert re.search(match, msg), msg


def test_hostile_gguf_cli_one_line(small_gguf, tmp_path, capsys):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGML" + small_gguf.read_bytes()[4:])
    for argv in (["inspect", str(p)], ["fit", str(p), *MACHINE], ["simulate", str(p), *MACHINE]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not a GGUF file" in err and str(p) in err
    assert main(["inspect", str(tmp_path / "nope.gguf")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_header_only_prefix_is_truncated_not_silently_partial(small_gguf, tmp_path):
    raw = small_gguf.read_bytes()
    p = tmp_path / "prefix.gguf"
    p.write_bytes(raw[:_header_end(small_gguf)])
    with pytest.raises(MoesimError, match="truncated"):
        Model.from_gguf(p)
