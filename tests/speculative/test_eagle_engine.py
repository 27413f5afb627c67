"""``build --target engine --speculative eagle --draft-model HEADS``: an EAGLE-1 heads checkpoint checked before any
work, the EagleNets written into the checkpoint as upstream's converter lays them out (TensorRT-LLM 1.2.1
``tensorrt_llm/models/eagle/weight.py`` ``load_eagle_hf``: per EagleNet ``drafter.fc``, ``drafter.vocab_embedding``,
``drafter.layers.0.*`` without the input layernorm, and the base's lm_head), ``config.json`` as
``examples/eagle/convert_checkpoint.py`` writes it (``EagleForCausalLM``, ``num_eagle_layers``,
``max_non_leaves_per_layer``, ``eagle_net_config``), trtllm-build's ``--speculative_decoding_mode eagle``, the
``tensorrt_llm`` model's ``decoding_mode``/``eagle_choices``, the plan's count and the manifest's record.

``trtllm-build`` cannot run here: the fake of ``tests/build/fakes.py`` records its argv; the machine is a faked H100
host."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from speculative_engine_build import (
    LIMITS,
    UPSTREAM_DECODING_MODES,
    UPSTREAM_MODES,
    assert_refused_before_any_work,
    fake_gpu_host,
    flag_values,
    install_fake_build,
)

from trtllm_kit.artifact import Artifact
from trtllm_kit.cli import run
from trtllm_kit.model_repo.configs import BACKEND_DEFAULT_KEYS, parse_config
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.models.hf_config import read_hf_config
from trtllm_kit.safetensors_io import read_header
from trtllm_kit.spec.draft_tree import top1_chain
from trtllm_kit.spec.eagle_heads import read_eagle_heads

BASE = read_hf_config(builtin_dir("tiny-llama"))
DRAFT_LEN = 3
# the drafter layer's TensorRT-LLM names → HF sources, as upstream's convert_hf_llama names them
ATTN, MLP = "layers.0.self_attn", "layers.0.mlp"
LAYER = {"attention.qkv.weight": (f"{ATTN}.q_proj.weight", f"{ATTN}.k_proj.weight", f"{ATTN}.v_proj.weight"),
         "attention.dense.weight": (f"{ATTN}.o_proj.weight",), "mlp.fc.weight": (f"{MLP}.gate_proj.weight",),
         "mlp.gate.weight": (f"{MLP}.up_proj.weight",), "mlp.proj.weight": (f"{MLP}.down_proj.weight",),
         "post_layernorm.weight": ("layers.0.post_attention_layernorm.weight",)}


def make_heads(path: Path, *, embedding: bool = True, hidden: int | None = None, layers: int = 1,
               fc_inputs: int = 2, extra: dict[str, torch.Tensor] | None = None) -> Path:
    """An EAGLE-1 heads checkpoint for tiny-llama: its LLaMA config.json of one layer and model.safetensors."""
    config = json.loads((builtin_dir("tiny-llama") / "config.json").read_text())
    config |= {"num_hidden_layers": layers, "hidden_size": hidden or BASE.hidden_size}
    h, inter, q, kv = config["hidden_size"], BASE.intermediate_size, 4 * 64, 2 * 64
    generator = torch.Generator().manual_seed(1)
    shapes = {"fc.weight": (h, fc_inputs * h), "fc.bias": (h,), "layers.0.self_attn.q_proj.weight": (q, h),
              "layers.0.self_attn.k_proj.weight": (kv, h), "layers.0.self_attn.v_proj.weight": (kv, h),
              "layers.0.self_attn.o_proj.weight": (h, q), "layers.0.mlp.gate_proj.weight": (inter, h),
              "layers.0.mlp.up_proj.weight": (inter, h), "layers.0.mlp.down_proj.weight": (h, inter),
              "layers.0.post_attention_layernorm.weight": (h,)}
    if embedding:
        shapes["embed_tokens.weight"] = (BASE.vocab_size, h)
    tensors = {name: torch.randn(*shape, generator=generator) * 0.02 for name, shape in shapes.items()}
    path.mkdir(parents=True)
    save_file(tensors | (extra or {}), str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One EAGLE build on the faked H100 host (verified on the CPU): its output, heads and trtllm-build call."""
    root = tmp_path_factory.mktemp("eagle")
    heads = make_heads(root / "heads")
    with pytest.MonkeyPatch.context() as patch:
        install_fake_build(root, patch)
        out = root / "out"
        assert run(["build", "builtin:tiny-llama", *LIMITS, "--out", str(out), "--speculative", "eagle",
                    "--draft-model", str(heads), "--max-draft-len", str(DRAFT_LEN)]) == 0
        [argv] = [json.loads(line)["argv"] for line in (root / "argv.jsonl").read_text().splitlines()]
        yield {"out": out, "heads": heads, "argv": argv}


def test_trtllm_build_is_asked_for_an_eagle_engine(built: dict[str, Any]) -> None:
    flags = flag_values(built["argv"])
    assert flags["speculative_decoding_mode"] == "eagle" and flags["speculative_decoding_mode"] in UPSTREAM_MODES
    assert flags["max_draft_len"] == str(DRAFT_LEN)


def test_the_checkpoint_config_is_upstreams_eagle_config(built: dict[str, Any]) -> None:
    config = json.loads((built["out"] / "checkpoint" / "config.json").read_text())
    assert config["architecture"] == "EagleForCausalLM"
    assert (config["num_eagle_layers"], config["max_draft_len"], config["max_non_leaves_per_layer"]) == (
        DRAFT_LEN, DRAFT_LEN, 10)
    net = config["eagle_net_config"]
    assert net["architecture"] == "LlamaForCausalLM"
    assert (net["num_hidden_layers"], net["hidden_size"], net["num_key_value_heads"], net["vocab_size"]) == (
        1, BASE.hidden_size, BASE.num_key_value_heads, BASE.vocab_size)
    for key in ("dtype", "rotary_base", "rotary_scaling", "mapping", "position_embedding_type"):
        assert net[key] == config[key], key  # the base's, as the converter writes them


def test_every_eaglenet_holds_the_heads_and_the_bases_lm_head(built: dict[str, Any]) -> None:
    source = load_file(str(built["heads"] / "model.safetensors"))
    tensors = load_file(str(built["out"] / "checkpoint" / "rank0.safetensors"))
    for net in range(DRAFT_LEN):
        drafter = f"eagle_nets.{net}.drafter"
        assert torch.equal(tensors[f"{drafter}.fc.weight"], source["fc.weight"].to(torch.bfloat16))
        assert torch.equal(tensors[f"{drafter}.fc.bias"], source["fc.bias"].to(torch.bfloat16))
        assert torch.equal(tensors[f"{drafter}.vocab_embedding.weight"],
                           source["embed_tokens.weight"].to(torch.bfloat16))
        for name, sources in LAYER.items():
            expected = torch.cat([source[name] for name in sources]).to(torch.bfloat16)
            assert torch.equal(tensors[f"{drafter}.layers.0.{name}"], expected), name
        assert f"{drafter}.layers.0.input_layernorm.weight" not in tensors  # EagleNet's first layer has none
        assert torch.equal(tensors[f"eagle_nets.{net}.lm_head.weight"], tensors["lm_head.weight"])
    assert f"eagle_nets.{DRAFT_LEN}.drafter.fc.weight" not in tensors


def test_the_tensorrt_llm_model_decodes_with_the_eagle_tree(built: dict[str, Any]) -> None:
    config = parse_config((built["out"] / "repo" / "tensorrt_llm" / "config.pbtxt").read_text())
    values = {k: v.string_value for k, v in config.parameters.items()}
    assert values["decoding_mode"] == "eagle" and values["decoding_mode"] in UPSTREAM_DECODING_MODES
    assert values["eagle_choices"] == "{0}, {0, 0}, {0, 0, 0}"  # the backend's spelling: "{0, 0, 0}, {0, 1}"
    assert "eagle_choices" in BACKEND_DEFAULT_KEYS and "medusa_choices" not in values


def test_the_plan_counts_the_eaglenets_and_their_kv(built: dict[str, Any]) -> None:
    out = built["out"]
    [rank] = json.loads((out / "manifest.json").read_text())["summary"]["engine"]["plan"]["ranks"]
    header = read_header(out / "checkpoint" / "rank0.safetensors")
    total = sum(end - start for name, entry in header.items() if name != "__metadata__"
                for start, end in [entry["data_offsets"]])
    assert rank["weight_bytes"] == total
    per_layer_kv = 2 * BASE.num_key_value_heads * BASE.head_dim * 2  # bfloat16
    assert rank["kv_bytes_per_token"] == (BASE.num_hidden_layers + 1) * per_layer_kv


def test_the_manifest_records_the_heads(built: dict[str, Any]) -> None:
    record = Artifact.read(built["out"]).records.engine
    assert record is not None and record.heads == {"kind": "eagle", "source": str(built["heads"]),
                                                   "num_eagle_layers": DRAFT_LEN, "embedding": "heads"}


def test_heads_without_an_embedding_take_the_bases(tmp_path: Path) -> None:
    heads = read_eagle_heads(make_heads(tmp_path / "heads", embedding=False), BASE, top1_chain(2))
    [embedding] = [row for row in heads.tensors() if row.name == "eagle_nets.0.drafter.vocab_embedding.weight"]
    assert (embedding.sources, embedding.from_base) == (("model.embed_tokens.weight",), True)


def _refusals(tmp: Path) -> list[tuple[list[str], str]]:
    where = "model.safetensors"
    pickle_only = make_heads(tmp / "pickle")
    (pickle_only / "model.safetensors").rename(pickle_only / "pytorch_model.bin")
    eagle3 = make_heads(tmp / "eagle3", fc_inputs=3)
    wide = make_heads(tmp / "wide", hidden=2 * BASE.hidden_size)
    two = make_heads(tmp / "two", layers=2)
    no_fc = tmp / "no-fc"
    make_heads(no_fc)
    tensors = load_file(str(no_fc / "model.safetensors"))
    del tensors["fc.weight"]
    save_file(tensors, str(no_fc / "model.safetensors"))
    no_config = make_heads(tmp / "no-config")
    (no_config / "config.json").unlink()
    return [
        (["--draft-model", str(no_config)],
         f"Error: --draft-model {no_config} has no config.json, so it is not an EAGLE heads checkpoint; pass the "
         "directory holding the heads' LLaMA config.json and model.safetensors with fc.weight."),
        (["--draft-model", str(pickle_only)],
         f"Error: --draft-model {pickle_only} has only pytorch_model.bin, a pickle the kit does not load; save the "
         "heads as model.safetensors."),
        (["--draft-model", str(eagle3)],
         f"Error: --draft-model {eagle3}/{where} holds EAGLE-3 heads (midlayer.*, fc.weight [256, 768]), which "
         "TensorRT-LLM 1.2.1 runs on the PyTorch path only; build with --target llmapi --speculative eagle3."),
        (["--draft-model", str(no_fc)],
         f"Error: --draft-model {no_fc}/{where} has no fc.weight, so it is not an EAGLE heads checkpoint; pass the "
         "directory holding the heads' LLaMA config.json and model.safetensors with fc.weight."),
        (["--draft-model", str(wide)],
         f"Error: --draft-model {wide} has hidden size 512 and vocabulary 1031 where the base has 256 and 1031; use "
         "heads trained on this base model."),
        (["--draft-model", str(two)],
         f"Error: --draft-model {two} has 2 decoder layers where EAGLE-1 heads have 1 (TensorRT-LLM's EagleNet drops "
         "the first layer's input layernorm only); pass EAGLE-1 heads."),
        (["--draft-model", str(make_heads(tmp / "good")), "--tp", "2"],
         "Error: --speculative eagle on the engine target needs --tp 1 --pp 1 (the kit writes the EagleNets whole), "
         "got tp 2 pp 1; build with --tp 1 --pp 1."),
        ([], "Error: --speculative eagle needs --draft-model DIR (an EAGLE-1 heads checkpoint directory); none was "
             "given."),
    ]


@pytest.mark.parametrize("command", [["build"], ["plan"], ["build", "--dry-run"]])
def test_a_heads_directory_that_is_not_one_is_refused_before_any_work(command: list[str], tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpu_host(monkeypatch)
    assert_refused_before_any_work(command, "eagle", _refusals(tmp_path / "heads"), tmp_path / "out",
                                   lambda: capsys.readouterr().err)


@pytest.mark.parametrize(("flags", "message"), [
    (["builtin:tiny-llama", "--target", "llmapi"],
     "Error: --speculative eagle is not available on the llmapi target; build with --target engine."),
    (["builtin:tiny-qwen2", "--target", "engine"],
     "Error: --speculative eagle needs a base of architecture LlamaForCausalLM (TensorRT-LLM's EagleForCausalLM), "
     "got Qwen2ForCausalLM; use --speculative draft-target or lookahead."),
    (["builtin:tiny-llama", "--target", "engine", "--quant", "int8-wo"],
     "Error: --speculative eagle builds the heads unquantized, but the weights' quant_algo is W8A16; build with "
     "--quant none (--kv-cache may stay quantized)."),
])
def test_eagle_is_refused_where_it_cannot_build(flags: list[str], message: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    heads = make_heads(tmp_path / "heads")
    assert run(["build", *flags, "--out", str(tmp_path / "out"), "--gpu", "H100-80GB", "--dry-run",
                "--speculative", "eagle", "--draft-model", str(heads)]) != 0
    assert message in capsys.readouterr().err
