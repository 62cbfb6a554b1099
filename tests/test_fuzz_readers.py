"""Fuzzing the model-file readers with counts (conftest.fuzz_count): a small valid GGUF with its header
mutated (bytes, u32/u64 fields set to edge values, truncation) and a safetensors file with its JSON
header mutated either parse into a model that lowers, or raise a MoesimError naming the file; never
a bare built-in exception, a MemoryError or more than a second per file."""
from __future__ import annotations

import random
import struct
import time

import pytest

from conftest import bounded, fuzz_count, mutate_bytes, rewrite
from moesim import MoesimError
from moesim.engine.lower import memory as mem
from moesim.ingest import gguf as GGUF
from moesim.ingest import safetensors as ST
from moesim.spec.models import Model
from test_ingest import small_gguf, write_safetensors  # noqa: F401  (small_gguf is a fixture)

pytestmark = pytest.mark.fuzz
EDGE = {4: [0, 1, 2, 3, 31, 255, 1 << 16, 1 << 31, (1 << 32) - 1],
        8: [0, 1, 2, 3, 31, 255, 1 << 16, 1 << 31, 1 << 62, 1 << 63, (1 << 64) - 1]}


def _mutate_header(raw: bytes, header: int, rng: random.Random) -> bytes:
    buf = bytearray(raw)
    for _ in range(rng.randint(1, 8)):
        pos = rng.randrange(header)
        size = rng.choice((1, 4, 8))
        if size == 1:
            buf[pos] = rng.randrange(256)
        else:
            buf[pos:pos + size] = rng.choice(EDGE[size]).to_bytes(size, "little")
    if rng.random() < 0.3:
        buf = buf[:rng.randrange(len(buf) + 1)]
    return bytes(buf)


def test_mutated_gguf_parses_and_lowers_or_is_refused(small_gguf, tmp_path, tally):  # noqa: F811
    raw = small_gguf.read_bytes()
    header = GGUF.read_gguf_header(small_gguf).data_offset
    rng = random.Random("gguf")
    p = tmp_path / "f.gguf"
    for i in range(fuzz_count(1500, 250_000)):
        data = _mutate_header(raw, header, rng)
        rewrite(p, data)
        t0 = time.perf_counter()
        with bounded(10, f"gguf mutant {i}"):
            try:
                m = Model.from_gguf(p)
                mem.lower(m, "native")          # a file that parses must also lower
            except MoesimError as exc:
                assert str(p) in str(exc), (i, exc)
                tally.refuse()
            else:
                tally.ok()
        assert time.perf_counter() - t0 < 1.0, i
    assert tally.refused > 0 and tally.inputs == fuzz_count(1500, 250_000)


def test_mutated_safetensors_header_is_read_or_refused(tmp_path, tally):
    p = tmp_path / "f.safetensors"
    write_safetensors(p, {"a.weight": ("BF16", (4, 8)), "b": ("F32", (3,)), "c": ("F8_E4M3", (16,))})
    seed = p.read_bytes()
    n = struct.unpack_from("<Q", seed)[0]
    rng = random.Random("safetensors")
    alphabet = b'{}[]",:-0123456789 eE.xa\xff\x00'
    count = fuzz_count(3000, 350_000)
    for i in range(count):
        if rng.random() < 0.5:          # JSON-ish bytes inside the header, the length intact
            buf = bytearray(seed)
            for _ in range(rng.randint(1, 6)):
                buf[rng.randrange(8, 8 + n)] = alphabet[rng.randrange(len(alphabet))]
            data = bytes(buf)
        else:                           # any edit, the length prefix included
            data = mutate_bytes(seed[:8 + n], rng) + seed[8 + n:]
        rewrite(p, data)
        with bounded(10, f"safetensors mutant {i}"):
            try:
                tensors, meta = ST.read_safetensors_header(p)
            except MoesimError as exc:
                assert str(p) in str(exc), (i, exc)
                tally.refuse()
                continue
        assert isinstance(tensors, list) and isinstance(meta, dict), i
        tally.ok()
    assert tally.refused > 0 and tally.accepted > 0 and tally.inputs == count


def test_layer_bound_error_names_the_file(small_gguf, tmp_path):  # noqa: F811
    """Regression (found by the --long run): a head count over its plausible bound raised a MoesimError
    that named the field but not the file."""
    raw = small_gguf.read_bytes()
    key = b"qwen3moe.attention.head_count"
    i = raw.find(key + struct.pack("<I", 4))          # the u32 value type, then the value
    assert i >= 0
    p = tmp_path / "heads.gguf"
    p.write_bytes(raw[:i + len(key) + 4] + struct.pack("<I", 20226) + raw[i + len(key) + 8:])
    with pytest.raises(MoesimError, match="above the plausible maximum") as ei:
        Model.from_gguf(p)
    assert str(p) in str(ei.value) and ei.value.field == "num_attention_heads", ei.value
