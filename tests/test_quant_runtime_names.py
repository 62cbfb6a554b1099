"""Quantization and runtime names as measurements and users write them: Unsloth's UD-*_XL files resolve to
the nearest llama.cpp file type (quants.toml [ftype_aliases]), front ends and other spellings of a runtime
to its profile (runtimes.toml [runtime_aliases]); unknown names still error."""
from __future__ import annotations

import pytest

import moesim
from moesim import _catalog
from moesim.spec import quants as Q
from moesim.spec import runtimes as R


@pytest.mark.parametrize("name,ftype", [("UD-Q4_K_XL", "Q4_K_M"), ("Q4_K_XL", "Q4_K_M"), ("ud-q3_k_xl", "Q3_K_M"),
                                        ("UD-Q5_K_XL", "Q5_K_M"), ("Q6_K_XL", "Q6_K"), ("UD-Q8_K_XL", "Q8_0"),
                                        ("UD-IQ2_M", "IQ2_M"), ("UD-Q2_K_XL", "IQ2_M")])
def test_unsloth_file_names_resolve(name, ftype):
    assert Q.resolve(name).id == ftype


def test_every_ftype_alias_names_a_file_type():
    t = _catalog.load("quants")
    for alias, target in t["ftype_aliases"].items():
        assert target in t["ftypes"], alias
        assert alias not in t["ftypes"], alias


def test_xl_files_weigh_like_their_file_type():
    # unsloth/gpt-oss-120b-GGUF: Q4_K_XL 58.69 GiB vs Q4_K_M 58.46, Q8_K_XL 60.05 vs Q8_0 59.03
    m = moesim.model("gpt-oss-120b")
    for xl, published in (("Q4_K_XL", 58.69), ("Q8_K_XL", 60.05)):
        assert float(Q.weight_table(m, xl).nbytes.sum()) / 2 ** 30 == pytest.approx(published, rel=0.02)


@pytest.mark.parametrize("name,rid", [("llamacpp", "llama.cpp"), ("LM-Studio", "llama.cpp"), ("mlx-lm", "mlx"),
                                      ("TensorRT-LLM", "trtllm"), ("llama.cpp-rocm", "llama.cpp-hip"),
                                      ("ik-llama.cpp", "ik_llama.cpp"), ("vLLM", "vllm")])
def test_runtime_spellings_resolve(name, rid):
    assert R.runtime(name).id == rid


def test_every_runtime_alias_names_a_profile_and_unknown_runtimes_error():
    t = _catalog.load("runtimes")
    for alias, target in t["runtime_aliases"].items():
        assert target in t["runtimes"] and alias not in t["runtimes"], alias
    with pytest.raises(moesim.MoesimError, match="runtime"):
        R.runtime("exllamav2")


@pytest.mark.parametrize("flag,name", [("--cpu-moe", "experts-cpu"), ("-ot exps=CPU", "experts-cpu"),
                                       ("--n-cpu-moe 30", "n-cpu-moe=30"), ("ncmoe=30", "n-cpu-moe=30"),
                                       ("-ngl 20", "layers-gpu=20"), ("--n-gpu-layers 20", "layers-gpu=20"),
                                       ("n-cpu-moe=12", "n-cpu-moe=12"), ("cpu", "cpu-only")])
def test_llama_cpp_flag_spellings_name_placements(flag, name):
    from moesim.spec.placement import parse
    assert str(parse(flag)) == name


def test_unknown_placements_and_missing_counts_still_error():
    from moesim.spec.placement import parse
    for bad in ("hybrid", "n-cpu-moe", "--n-cpu-moe"):
        with pytest.raises(moesim.MoesimError, match="placement"):
            parse(bad)
