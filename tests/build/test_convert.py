"""End-to-end conversion of tiny HF models written by ``transformers`` (docs/trtllm-checkpoint.md §2–§4).

Each test converts a real ``save_pretrained`` directory and reads the rank files back with the real
``safetensors`` library. The expected content of every rank file is built here by indexing the HF tensors
(head by head for q/k/v), independently of the kit's tables and split helpers.
"""

from __future__ import annotations

import copy
import errno
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from trtllm_kit import safetensors_io
from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.errors import CheckpointError, KitUsageError
from trtllm_kit.safetensors_io import SafetensorsWriter

DIMS = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
        "num_hidden_layers": 3, "vocab_size": 67, "max_position_embeddings": 128, "rms_norm_eps": 1e-5}
FAMILIES: dict[str, tuple[type[PretrainedConfig], type[PreTrainedModel]]] = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
}
MODELS: dict[str, tuple[str, dict[str, Any]]] = {  # name → (family, config beyond DIMS)
    "llama": ("llama", {"rope_theta": 500000.0}),
    "mistral": ("mistral", {}),
    "qwen2": ("qwen2", {"tie_word_embeddings": True}),  # q/k/v biases, tied lm_head
    "llama-head-dim": ("llama", {"head_dim": 32}),        # head_dim != hidden_size / heads
    "llama-bias": ("llama", {"attention_bias": True, "mlp_bias": True}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "llama-rope-scaling": ("llama", {"rope_theta": 500000.0, "rope_scaling": {  # Llama-3.1 style
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}}),
}
BASE_MODELS = ["llama", "mistral", "qwen2"]
LAYOUTS = [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (4, 2), (1, 3), (2, 3), (4, 3)]  # (tp, pp); tp=4 > Nkv=2

PORTABLE_KEYS = {
    "architecture", "dtype", "logits_dtype", "vocab_size", "max_position_embeddings", "hidden_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_size", "hidden_act",
    "intermediate_size", "norm_epsilon", "position_embedding_type", "rotary_base", "rotary_scaling",
    "use_parallel_embedding", "embedding_sharding_dim",
}  # spec §2.3
FAMILY_KEYS = {  # spec §2.4: fields of LLaMAConfig / QWenConfig that the releases accept
    "llama": {"mlp_bias", "attn_bias", "residual_mlp", "disable_weight_only_quant_plugin", "moe",
              "remove_duplicated_kv_heads", "fc_after_embed", "use_input_layernorm_in_first_layer",
              "use_last_layernorm", "layer_idx_offset", "tie_word_embeddings", "embedding_multiplier",
              "attention_multiplier", "residual_multiplier", "output_multiplier_scale"},
    "qwen2": {"qwen_type", "attn_bias", "mlp_bias", "seq_length", "use_logn_attn", "tie_word_embeddings",
              "moe", "num_labels"},
}
FAMILY_KEYS["mistral"] = FAMILY_KEYS["llama"]
QUANTIZATION = {"quant_algo": None, "kv_cache_quant_algo": None, "group_size": 128, "has_zero_point": False,
                "pre_quant_scale": False, "exclude_modules": None}


def tiny_model(name: str, seed: int = 0) -> PreTrainedModel:
    """A tiny seeded model whose every parameter (norms and biases included) holds distinct random values."""
    family, extra = MODELS[name]
    config_cls, model_cls = FAMILIES[family]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**DIMS, **copy.deepcopy(extra)))  # transformers 5 edits rope dicts in place
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape))
    return model


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """model name → HF directory (float32, one file); ``NAME-sharded``: the same weights in several files;
    ``llama-bf16``: a bfloat16 Llama."""
    root = tmp_path_factory.mktemp("hf")
    dirs: dict[str, Path] = {}
    for name in MODELS:
        model = tiny_model(name)
        model.save_pretrained(root / name)
        dirs[name] = root / name
        if name in BASE_MODELS:
            model.save_pretrained(root / f"{name}-sharded", max_shard_size="100KB")
            dirs[f"{name}-sharded"] = root / f"{name}-sharded"
    tiny_model("llama", seed=1).to(torch.bfloat16).save_pretrained(root / "llama-bf16")
    dirs["llama-bf16"] = root / "llama-bf16"
    return dirs


def hf_tensors(hf_dir: Path) -> dict[str, torch.Tensor]:
    files = sorted(hf_dir.glob("*.safetensors"))
    return {name: t for f in files for name, t in load_file(f).items()}


def rank_files(out: Path, world_size: int) -> list[dict[str, torch.Tensor]]:
    assert sorted(p.name for p in out.glob("rank*.safetensors")) == sorted(
        f"rank{r}.safetensors" for r in range(world_size))
    return [load_file(out / f"rank{r}.safetensors") for r in range(world_size)]


# --- the expected checkpoint, from spec §3.1/§4 by plain indexing -----------------------------------------

def rows(t: torch.Tensor, tp_size: int, tp_rank: int) -> torch.Tensor:
    n = t.shape[0] // tp_size
    return t[tp_rank * n:(tp_rank + 1) * n]


def cols(t: torch.Tensor, tp_size: int, tp_rank: int) -> torch.Tensor:
    n = t.shape[1] // tp_size
    return t[:, tp_rank * n:(tp_rank + 1) * n]


def qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_dim: int, tp_size: int, tp_rank: int) -> torch.Tensor:
    """Query heads of the rank, then its KV heads (original head tp_rank // (tp/Nkv) when Nkv < tp)."""
    num_heads, num_kv_heads = q.shape[0] // head_dim, k.shape[0] // head_dim
    q_ids = range(tp_rank * num_heads // tp_size, (tp_rank + 1) * num_heads // tp_size)
    if num_kv_heads >= tp_size:
        kv_ids = range(tp_rank * num_kv_heads // tp_size, (tp_rank + 1) * num_kv_heads // tp_size)
    else:
        kv_ids = range(tp_rank // (tp_size // num_kv_heads), tp_rank // (tp_size // num_kv_heads) + 1)
    return torch.cat([t[h * head_dim:(h + 1) * head_dim] for t, ids in ((q, q_ids), (k, kv_ids), (v, kv_ids))
                      for h in ids])


def vocab_rows(t: torch.Tensor, tp_size: int, tp_rank: int) -> torch.Tensor:
    per_rank = math.ceil(t.shape[0] / tp_size)
    part = torch.zeros(per_rank, *t.shape[1:], dtype=t.dtype)
    real = t[tp_rank * per_rank:(tp_rank + 1) * per_rank]
    part[:len(real)] = real
    return part


def expected_ranks(hf: dict[str, torch.Tensor], tp_size: int, pp_size: int) -> list[dict[str, torch.Tensor]]:
    """Per global rank r = tp_r + tp*pp_r: every TRT-LLM tensor, from the HF tensors.

    Biases are expected exactly where the HF model has them: q/k/v → ``qkv.bias`` (split like the weight),
    o_proj → ``dense.bias`` and down_proj → ``proj.bias`` (replicated), gate/up → ``fc``/``gate`` bias (rows).
    """
    d = hf["model.layers.0.self_attn.q_proj.weight"].shape[0] // DIMS["num_attention_heads"]
    stages = [t.tolist() for t in torch.tensor_split(torch.arange(DIMS["num_hidden_layers"]), pp_size)]
    lm_head = hf.get("lm_head.weight", hf["model.embed_tokens.weight"])
    out: list[dict[str, torch.Tensor]] = []
    for pp_rank, layers in enumerate(stages):
        for r in range(tp_size):
            ranks: dict[str, torch.Tensor] = {}
            if pp_rank == 0:
                ranks["transformer.vocab_embedding.weight"] = hf["model.embed_tokens.weight"]
            for i, layer in enumerate(layers):
                t, h = f"transformer.layers.{i}.", f"model.layers.{layer}."
                a = h + "self_attn."
                ranks[t + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"]
                ranks[t + "attention.qkv.weight"] = qkv(*(hf[a + f"{x}_proj.weight"] for x in "qkv"), d, tp_size, r)
                if a + "q_proj.bias" in hf:
                    ranks[t + "attention.qkv.bias"] = qkv(*(hf[a + f"{x}_proj.bias"] for x in "qkv"), d, tp_size, r)
                ranks[t + "attention.dense.weight"] = cols(hf[a + "o_proj.weight"], tp_size, r)
                if a + "o_proj.bias" in hf:
                    ranks[t + "attention.dense.bias"] = hf[a + "o_proj.bias"]
                ranks[t + "post_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"]
                ranks[t + "mlp.fc.weight"] = rows(hf[h + "mlp.gate_proj.weight"], tp_size, r)
                ranks[t + "mlp.gate.weight"] = rows(hf[h + "mlp.up_proj.weight"], tp_size, r)
                ranks[t + "mlp.proj.weight"] = cols(hf[h + "mlp.down_proj.weight"], tp_size, r)
                if h + "mlp.gate_proj.bias" in hf:
                    ranks[t + "mlp.fc.bias"] = rows(hf[h + "mlp.gate_proj.bias"], tp_size, r)
                    ranks[t + "mlp.gate.bias"] = rows(hf[h + "mlp.up_proj.bias"], tp_size, r)
                    ranks[t + "mlp.proj.bias"] = hf[h + "mlp.down_proj.bias"]
            if pp_rank == pp_size - 1:
                ranks["transformer.ln_f.weight"] = hf["model.norm.weight"]
                ranks["lm_head.weight"] = vocab_rows(lm_head, tp_size, r)
            out.append(ranks)
    return out


def assert_ranks_equal(got: list[dict[str, torch.Tensor]], want: list[dict[str, torch.Tensor]],
                       dtype: torch.dtype) -> None:
    assert len(got) == len(want)
    for rank, (g, w) in enumerate(zip(got, want, strict=True)):
        assert set(g) == set(w), f"rank {rank}: extra {sorted(set(g) - set(w))}, missing {sorted(set(w) - set(g))}"
        for name, expected in w.items():
            assert g[name].dtype == dtype, f"rank {rank} {name}: {g[name].dtype}"
            assert g[name].shape == expected.shape, f"rank {rank} {name}: {tuple(g[name].shape)}"
            assert torch.equal(g[name], expected.to(dtype)), f"rank {rank} {name} differs from the HF slice"


# --- tests -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("tp_size", "pp_size"), LAYOUTS)
@pytest.mark.parametrize("name", list(MODELS))
def test_every_tensor_is_the_hf_slice(name: str, tp_size: int, pp_size: int, hf_dirs: dict[str, Path],
                                      tmp_path: Path) -> None:
    result = convert_checkpoint(hf_dirs[name], tmp_path / "ckpt", tp_size=tp_size, pp_size=pp_size,
                                dtype="float32")
    assert result.dtype == "float32"
    assert [p.name for p in result.rank_files] == [f"rank{r}.safetensors" for r in range(tp_size * pp_size)]
    hf = hf_tensors(hf_dirs[name])
    got = rank_files(tmp_path / "ckpt", tp_size * pp_size)
    assert_ranks_equal(got, expected_ranks(hf, tp_size, pp_size), torch.float32)


@pytest.mark.parametrize("family", BASE_MODELS)
def test_qkv_reassembles_and_padding_is_zero(family: str, hf_dirs: dict[str, Path], tmp_path: Path) -> None:
    """tp=4 > Nkv=2: q reassembles from all ranks, k/v from ranks 0 and 2 (1 and 3 hold copies);
    the lm_head's padded row (67 → 68) is zero; a tied lm_head equals the embedding."""
    tp_size, d, q_rows = 4, 16, 16
    convert_checkpoint(hf_dirs[family], tmp_path, tp_size=tp_size, pp_size=1, dtype="float32")
    ranks, hf = rank_files(tmp_path, tp_size), hf_tensors(hf_dirs[family])
    for layer in range(3):
        fused = [ranks[r][f"transformer.layers.{layer}.attention.qkv.weight"] for r in range(tp_size)]
        assert all(f.shape == (q_rows + 2 * d, 64) for f in fused)
        a = f"model.layers.{layer}.self_attn."
        assert torch.equal(torch.cat([f[:q_rows] for f in fused]), hf[a + "q_proj.weight"])
        assert torch.equal(torch.cat([f[q_rows:q_rows + d] for f in fused[::2]]), hf[a + "k_proj.weight"])
        assert torch.equal(torch.cat([f[q_rows + d:] for f in fused[::2]]), hf[a + "v_proj.weight"])
        assert torch.equal(fused[0][q_rows:], fused[1][q_rows:]) and torch.equal(fused[2][q_rows:], fused[3][q_rows:])
    lm_head = torch.cat([ranks[r]["lm_head.weight"] for r in range(tp_size)])
    assert lm_head.shape == (68, 64)
    assert not lm_head[67:].any()
    source = "model.embed_tokens.weight" if family == "qwen2" else "lm_head.weight"
    assert torch.equal(lm_head[:67], hf[source])
    if family == "qwen2":
        assert "lm_head.weight" not in hf  # tied: save_pretrained wrote only the embedding
        assert torch.equal(lm_head[:67], ranks[0]["transformer.vocab_embedding.weight"])


@pytest.mark.parametrize("name", list(MODELS))
def test_config_json(name: str, hf_dirs: dict[str, Path], tmp_path: Path) -> None:
    family, extra = MODELS[name]
    convert_checkpoint(hf_dirs[name], tmp_path, tp_size=2, pp_size=3, dtype="float32")
    config = json.loads((tmp_path / "config.json").read_text())
    top = set(config) - {"mapping", "quantization"}
    assert top >= PORTABLE_KEYS, f"missing {PORTABLE_KEYS - top}"
    assert top - PORTABLE_KEYS <= FAMILY_KEYS[family], f"unexpected keys {top - PORTABLE_KEYS - FAMILY_KEYS[family]}"
    assert config["mapping"] == {"world_size": 6, "tp_size": 2, "pp_size": 3}
    assert config["quantization"] == QUANTIZATION
    assert config["architecture"] == FAMILIES[family][1].__name__
    assert config["dtype"] == "float32" and config["logits_dtype"] == "float32"
    assert config["vocab_size"] == 67  # unpadded
    assert config["num_hidden_layers"] == 3  # global, not per stage
    assert (config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]) == (64, 4, 2)
    assert (config["head_size"], config["intermediate_size"]) == (extra.get("head_dim", 16), 128)
    assert config["max_position_embeddings"] == 128
    assert config["hidden_act"] == "silu" and config["norm_epsilon"] == 1e-5
    assert config["position_embedding_type"] == "rope_gpt_neox"
    assert config["rotary_base"] == extra.get("rope_theta", 10000.0)
    assert config["rotary_scaling"] == extra.get("rope_scaling")  # transformers 5 writes rope_parameters
    assert config["use_parallel_embedding"] is False and config["embedding_sharding_dim"] == 0
    assert config["tie_word_embeddings"] is extra.get("tie_word_embeddings", False)
    if family == "qwen2":
        assert config["qwen_type"] == "qwen2" and config["attn_bias"] is True and config["mlp_bias"] is False
    else:
        assert "qwen_type" not in config
        assert config["attn_bias"] is extra.get("attention_bias", False)
        assert config["mlp_bias"] is extra.get("mlp_bias", False)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_explicit_dtype(family: str, dtype: torch.dtype, hf_dirs: dict[str, Path], tmp_path: Path) -> None:
    name = str(dtype).removeprefix("torch.")
    result = convert_checkpoint(hf_dirs[family], tmp_path, tp_size=2, pp_size=2, dtype=name)
    assert result.dtype == name
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == name
    want = expected_ranks(hf_tensors(hf_dirs[family]), 2, 2)
    assert_ranks_equal(rank_files(tmp_path, 4), want, dtype)  # layernorm weights too


@pytest.mark.parametrize(("source", "dtype_key", "expected"), [
    ("llama", "dtype", torch.float16),            # float32 HF model → float16
    ("llama-bf16", "dtype", torch.bfloat16),
    ("llama-bf16", "torch_dtype", torch.bfloat16),  # the transformers 4 spelling
])
def test_auto_dtype(source: str, dtype_key: str, expected: torch.dtype, hf_dirs: dict[str, Path],
                    tmp_path: Path) -> None:
    hf_dir = hf_dirs[source]
    if dtype_key != "dtype":
        hf_dir = tmp_path / "hf"
        hf_dir.mkdir()
        raw = json.loads((hf_dirs[source] / "config.json").read_text())
        raw[dtype_key] = raw.pop("dtype")
        (hf_dir / "config.json").write_text(json.dumps(raw))
        shutil.copy(hf_dirs[source] / "model.safetensors", hf_dir / "model.safetensors")  # a link outside is refused
    hf = hf_tensors(hf_dir)
    assert {t.dtype for t in hf.values()} == {torch.bfloat16 if "bf16" in source else torch.float32}
    result = convert_checkpoint(hf_dir, tmp_path / "ckpt", tp_size=2, pp_size=1)  # dtype defaults to auto
    name = str(expected).removeprefix("torch.")
    assert result.dtype == name
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["dtype"] == name
    assert_ranks_equal(rank_files(tmp_path / "ckpt", 2), expected_ranks(hf, 2, 1), expected)


@pytest.mark.parametrize("family", BASE_MODELS)
def test_sharded_hf_input_converts_identically(family: str, hf_dirs: dict[str, Path], tmp_path: Path) -> None:
    sharded = hf_dirs[f"{family}-sharded"]
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert len(list(sharded.glob("*.safetensors"))) > 1
    convert_checkpoint(hf_dirs[family], tmp_path / "single", tp_size=2, pp_size=2, dtype="float32")
    convert_checkpoint(sharded, tmp_path / "sharded", tp_size=2, pp_size=2, dtype="float32")
    for name in ["config.json"] + [f"rank{r}.safetensors" for r in range(4)]:
        assert (tmp_path / "sharded" / name).read_bytes() == (tmp_path / "single" / name).read_bytes(), name


@pytest.mark.parametrize(("tp_size", "pp_size", "message"), [
    (3, 1, "num_attention_heads 4 is not divisible by tp_size 3"),
    (8, 1, "num_attention_heads 4 is not divisible by tp_size 8"),
    (1, 4, "pp_size 4 is larger than the model's 3 layers"),
])
def test_refusals_write_no_rank_files(tp_size: int, pp_size: int, message: str, hf_dirs: dict[str, Path],
                                      tmp_path: Path) -> None:
    with pytest.raises(KitUsageError, match=message):
        convert_checkpoint(hf_dirs["llama"], tmp_path, tp_size=tp_size, pp_size=pp_size, dtype="float32")
    assert list(tmp_path.glob("rank*.safetensors")) == []


# --- kernel copies: tensors written unchanged are copied file to file ------------------------------------

def convert_bytes(hf_dir: Path, out: Path) -> dict[str, bytes]:
    convert_checkpoint(hf_dir, out, tp_size=2, pp_size=2, dtype="float32")
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.mark.parametrize("family", BASE_MODELS)
def test_kernel_copies_write_the_same_bytes_as_memory_writes(family: str, hf_dirs: dict[str, Path], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    if not hasattr(os, "copy_file_range"):
        pytest.skip("no copy_file_range on this platform")
    copied: list[int] = []
    real = os.copy_file_range

    def counted(*args: int) -> int:
        copied.append(real(*args))
        return copied[-1]

    monkeypatch.setattr(safetensors_io, "_kernel_copy", True)
    monkeypatch.setattr(os, "copy_file_range", counted)
    kernel = convert_bytes(hf_dirs[family], tmp_path / "kernel")
    total = sum(len(data) for name, data in kernel.items() if name.startswith("rank"))
    assert 0.5 * total < sum(copied) < total  # column-split tensors went file to file; row-split ones cannot
    monkeypatch.setattr(safetensors_io, "_kernel_copy", False)
    assert convert_bytes(hf_dirs[family], tmp_path / "memory") == kernel


def test_a_file_system_without_kernel_copies_falls_back(hf_dirs: dict[str, Path], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: int) -> int:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    expected = convert_bytes(hf_dirs["llama"], tmp_path / "expected")
    monkeypatch.setattr(safetensors_io, "_kernel_copy", True)
    monkeypatch.setattr(os, "copy_file_range", refuse, raising=False)
    assert convert_bytes(hf_dirs["llama"], tmp_path / "fallback") == expected
    assert safetensors_io._kernel_copy is False  # asked once, then never again


def test_only_unchanged_contiguous_views_of_a_source_are_file_slices(hf_dirs: dict[str, Path]) -> None:
    from contextlib import ExitStack

    from trtllm_kit.checkpoint.tensor_reader import SourceRead, TensorReader
    from trtllm_kit.models.inspect import inspect_model

    model = inspect_model(str(hf_dirs["llama"]))
    name = "model.layers.0.mlp.down_proj.weight"
    with ExitStack() as stack:
        reader = TensorReader(model, stack)
        weight = reader.read(name)
        locate = reader.locator([SourceRead(name, weight, weight)])
        rows = weight.shape[0] // 2
        second = locate(weight[rows:])
        assert second is not None and second.nbytes == weight[rows:].numel() * 4
        assert second.offset == model.tensors[name].offset + weight[:rows].numel() * 4
        assert locate(weight[:, : weight.shape[1] // 2]) is None  # a row-parallel split is strided
        assert locate(weight[rows:].clone()) is None  # new memory
        assert reader.locator([SourceRead(name, weight, weight.half())])(weight.half()) is None  # converted
        # a row slice is read alone and is still one byte range of the file, at its rows' offset
        part = reader.read(name, (10, 30))
        assert torch.equal(part, weight[10:30])
        found = reader.locator([SourceRead(name, part, part, (10, 30))])(part[5:15])
        assert found is not None and found.nbytes == 10 * weight.shape[1] * 4
        assert found.offset == model.tensors[name].offset + 15 * weight.shape[1] * 4


# --- the streaming writer against the real safetensors readers -------------------------------------------

def bits(t: torch.Tensor) -> torch.Tensor:
    """Raw bytes, so that float8 (no torch.equal) compares too."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def test_writer_files_are_read_by_safetensors(tmp_path: Path) -> None:
    torch.manual_seed(0)
    tensors = {
        "a.weight": torch.randn(5, 3),
        "b.half": torch.randn(4, 2, 3).half(),
        "c.bf16": torch.randn(7).bfloat16(),
        "d.int8": torch.randint(-128, 128, (3, 5), dtype=torch.int8),
        "e.fp8": torch.randn(6, 2).to(torch.float8_e4m3fn),
        "f.scale": torch.tensor([0.5]),
        "g.parts": torch.randn(9, 4),
    }
    path = tmp_path / "x.safetensors"
    entries = [(name, t.dtype, tuple(t.shape)) for name, t in tensors.items()]
    with SafetensorsWriter(path, entries, metadata={"format": "pt"}) as writer:
        for name in reversed(list(tensors)):  # any order: the writer seeks
            value = tensors[name]
            writer.write(name, [value[:2], value[2:7], value[7:]] if name == "g.parts" else value)
    loaded = load_file(path)
    assert set(loaded) == set(tensors)
    with safe_open(str(path), framework="pt") as f:
        assert set(f.keys()) == set(tensors)
        assert f.metadata() == {"format": "pt"}
        for name, value in tensors.items():
            for read in (f.get_tensor(name), loaded[name]):
                assert read.dtype == value.dtype and read.shape == value.shape
                assert torch.equal(bits(read), bits(value)), name
        assert torch.equal(f.get_slice("g.parts")[3:5], tensors["g.parts"][3:5])


def test_writer_refuses_wrong_shape_and_missing_tensors(tmp_path: Path) -> None:
    entries = [("a", torch.float32, (4, 2)), ("b", torch.float16, (3,))]
    with pytest.raises(CheckpointError, match="a"), SafetensorsWriter(tmp_path / "x.safetensors", entries) as w:
        w.write("a", torch.zeros(2, 4))
    with pytest.raises(CheckpointError, match="never written"), \
            SafetensorsWriter(tmp_path / "y.safetensors", entries) as w:
        w.write("a", torch.zeros(4, 2))


# --- Phi-3: fused HF qkv_proj and gate_up_proj, sliced by the rules -------------------------------------

PHI3_DIMS = {**DIMS, "rope_scaling": None, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
             "pad_token_id": 0}


def phi3_as_llama(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The Phi-3 tensors with q/k/v and gate/up cut apart by plain indexing (HF's own order: q, k, v; gate, up)."""
    d = DIMS["hidden_size"] // DIMS["num_attention_heads"]
    q, kv, inter = DIMS["num_attention_heads"] * d, DIMS["num_key_value_heads"] * d, DIMS["intermediate_size"]
    out = {}
    for name, t in hf.items():
        if name.endswith("qkv_proj.weight"):
            a = name.removesuffix("qkv_proj.weight")
            out |= {a + "q_proj.weight": t[:q], a + "k_proj.weight": t[q:q + kv], a + "v_proj.weight": t[q + kv:]}
        elif name.endswith("gate_up_proj.weight"):
            m = name.removesuffix("gate_up_proj.weight")
            out |= {m + "gate_proj.weight": t[:inter], m + "up_proj.weight": t[inter:]}
        else:
            out[name] = t
    return out


def phi3_expected(hf: dict[str, torch.Tensor], tp_size: int, pp_size: int) -> list[dict[str, torch.Tensor]]:
    """Llama's layout, except that each rank's ``mlp.fc`` is its rows of up, then its rows of gate (the halves
    ``[x; g]`` that TensorRT-LLM's swiglu reads as ``x * silu(g)``) and there is no ``mlp.gate``."""
    ranks = expected_ranks(phi3_as_llama(hf), tp_size, pp_size)
    for tensors in ranks:
        for name in [n for n in tensors if n.endswith("mlp.gate.weight")]:
            up = tensors.pop(name)
            fc = name.replace("mlp.gate.", "mlp.fc.")
            tensors[fc] = torch.cat([up, tensors[fc]])
    return ranks


@pytest.fixture(scope="module")
def phi3_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``random``: a seeded transformers Phi-3; ``arange``: the same shapes, every element its own index."""
    root = tmp_path_factory.mktemp("phi3")
    torch.manual_seed(0)
    model = Phi3ForCausalLM(Phi3Config(**PHI3_DIMS))
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape))
    model.save_pretrained(root / "random")
    offset = 0
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.arange(offset, offset + param.numel(), dtype=torch.float32).reshape(param.shape))
            offset += param.numel()
    assert offset < 2**24  # every index exact in float32
    model.save_pretrained(root / "arange")
    return {"random": root / "random", "arange": root / "arange"}


@pytest.mark.parametrize(("tp_size", "pp_size"), LAYOUTS)
def test_phi3_every_tensor_is_the_hf_slice(tp_size: int, pp_size: int, phi3_dirs: dict[str, Path],
                                           tmp_path: Path) -> None:
    convert_checkpoint(phi3_dirs["random"], tmp_path, tp_size=tp_size, pp_size=pp_size, dtype="float32")
    got = rank_files(tmp_path, tp_size * pp_size)
    assert_ranks_equal(got, phi3_expected(hf_tensors(phi3_dirs["random"]), tp_size, pp_size), torch.float32)


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_phi3_fused_slices_hold_the_exact_rows(tp_size: int, phi3_dirs: dict[str, Path], tmp_path: Path) -> None:
    """With every HF element equal to its index, each rank's rows are the HF rows named here by number:
    q heads 4r/tp.., then the rank's KV head (duplicated at tp=4), and up rows then gate rows of its share."""
    convert_checkpoint(phi3_dirs["arange"], tmp_path, tp_size=tp_size, pp_size=1, dtype="float32")
    hf, ranks = hf_tensors(phi3_dirs["arange"]), rank_files(tmp_path, tp_size)
    d, inter, h = 16, DIMS["intermediate_size"], DIMS["hidden_size"]
    qkv, gate_up = hf["model.layers.1.self_attn.qkv_proj.weight"], hf["model.layers.1.mlp.gate_up_proj.weight"]
    first_qkv, first_gate_up = int(qkv[0, 0]), int(gate_up[0, 0])
    for r, tensors in enumerate(ranks):
        q_heads = range(r * 4 // tp_size, (r + 1) * 4 // tp_size)
        kv_head = r * 2 // tp_size  # 2 KV heads: one per rank at tp=2, each on two ranks at tp=4
        kv_heads = [kv_head] if tp_size > 1 else [0, 1]
        rows = [h_ * d + i for h_ in q_heads for i in range(d)]
        rows += [64 + k * d + i for k in kv_heads for i in range(d)]  # k rows follow the 64 q rows
        rows += [96 + k * d + i for k in kv_heads for i in range(d)]  # v rows follow the 32 k rows
        fused = tensors["transformer.layers.1.attention.qkv.weight"]
        assert (fused[:, 0] - first_qkv).long().div(h, rounding_mode="floor").tolist() == rows
        share = inter // tp_size
        fc_rows = list(range(inter + r * share, inter + (r + 1) * share)) + list(range(r * share, (r + 1) * share))
        fc = tensors["transformer.layers.1.mlp.fc.weight"]
        assert fc.shape == (2 * share, h) and "transformer.layers.1.mlp.gate.weight" not in tensors
        assert (fc[:, 0] - first_gate_up).long().div(h, rounding_mode="floor").tolist() == fc_rows
        assert torch.equal(fc, gate_up[fc_rows])


def test_phi3_config_json(phi3_dirs: dict[str, Path], tmp_path: Path) -> None:
    """Phi3Config's keys (docs/phi3.md): hidden_act swiglu, rotary_pct, the tie flag; nothing unportable."""
    convert_checkpoint(phi3_dirs["random"], tmp_path, tp_size=2, pp_size=3, dtype="float32")
    config = json.loads((tmp_path / "config.json").read_text())
    top = set(config) - {"mapping", "quantization"}
    assert top == PORTABLE_KEYS | {"rotary_pct", "tie_word_embeddings"}
    assert config["architecture"] == "Phi3ForCausalLM" and config["hidden_act"] == "swiglu"
    assert (config["rotary_pct"], config["tie_word_embeddings"], config["rotary_scaling"]) == (1.0, False, None)
    assert config["position_embedding_type"] == "rope_gpt_neox" and config["rotary_base"] == 10000.0
    assert (config["head_size"], config["intermediate_size"], config["vocab_size"]) == (16, 128, 67)


@pytest.mark.parametrize(("changes", "message"), [
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
      "original_max_position_embeddings": 64}, "uses 'longrope' RoPE scaling"),
    ({"max_position_embeddings": 131072}, "uses 'longrope' RoPE scaling"),
    ({"partial_rotary_factor": 0.5}, "rotates only a fraction 0.5 of each head"),
])
def test_phi3_variants_the_kit_cannot_convert_are_refused(changes: dict[str, Any], message: str,
                                                          phi3_dirs: dict[str, Path], tmp_path: Path) -> None:
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    raw = json.loads((phi3_dirs["random"] / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**raw, **changes}))
    (hf_dir / "model.safetensors").symlink_to(phi3_dirs["random"] / "model.safetensors")
    with pytest.raises(KitUsageError, match=message):
        convert_checkpoint(hf_dir, tmp_path / "ckpt", dtype="float32")
    assert not (tmp_path / "ckpt").exists() or list((tmp_path / "ckpt").iterdir()) == []


def test_phi3_refuses_calibrated_quantization(phi3_dirs: dict[str, Path], tmp_path: Path) -> None:
    from trtllm_kit.quant.algos import QuantConfig

    with pytest.raises(KitUsageError, match="--quant fp8 --kv-cache auto needs calibration statistics per q/k/v"):
        convert_checkpoint(phi3_dirs["random"], tmp_path, quant=QuantConfig(quant="fp8"))
    convert_checkpoint(phi3_dirs["random"], tmp_path / "wo", tp_size=2, dtype="float32",
                       quant=QuantConfig(quant="int8-wo"))
    config = json.loads((tmp_path / "wo" / "config.json").read_text())
    assert config["quantization"]["quant_algo"] == "W8A16"
    assert_ranks_equal(rank_files(tmp_path / "wo", 2), phi3_expected(hf_tensors(phi3_dirs["random"]), 2, 1),
                       torch.float32)


def test_phi3_slices_are_copied_file_to_file(phi3_dirs: dict[str, Path], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A slice of a fused tensor is read alone and its column shards are byte ranges of the input file."""
    if not hasattr(os, "copy_file_range"):
        pytest.skip("no copy_file_range on this platform")
    copied: list[int] = []
    real = os.copy_file_range

    def counted(*args: int) -> int:
        copied.append(real(*args))
        return copied[-1]

    monkeypatch.setattr(safetensors_io, "_kernel_copy", True)
    monkeypatch.setattr(os, "copy_file_range", counted)
    kernel = convert_bytes(phi3_dirs["random"], tmp_path / "kernel")
    total = sum(len(data) for name, data in kernel.items() if name.startswith("rank"))
    assert 0.5 * total < sum(copied) < total
    monkeypatch.setattr(safetensors_io, "_kernel_copy", False)
    assert convert_bytes(phi3_dirs["random"], tmp_path / "memory") == kernel
