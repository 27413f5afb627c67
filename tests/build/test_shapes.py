"""Name/shape tables for real configs on the meta device (docs/trtllm-checkpoint.md §3.1, §3.2, §4).

The HF names and shapes come from ``transformers`` itself (the model instantiated on ``meta``), never from
the kit's family tables; the expected TensorRT-LLM table per rank is computed here from the spec's formulas.
The converter's own loop (``work_items`` + ``iter_shards``) runs on meta tensors, so a 70B model costs
nothing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, Phi3Config

from trtllm_kit.checkpoint.convert import TORCH_DTYPES, check_sources, convert, iter_shards, rank_entries, work_items
from trtllm_kit.checkpoint.trtllm_config import checkpoint_config, resolve_dtype
from trtllm_kit.errors import KitUsageError
from trtllm_kit.layout import QuantLayout, rank_tensors
from trtllm_kit.mapping import Mapping, check_tp
from trtllm_kit.models.hf_config import parse_hf_config
from trtllm_kit.models.inspect import ModelSpec, TensorInfo
from trtllm_kit.models.registry import family_for

CONFIG_DIRS = (Path(__file__).parents[1] / "data" / "hf-configs",
               Path(__file__).resolve().parents[3] / "shared" / "data" / "hf-configs")
CONFIG_DIR = next((d for d in CONFIG_DIRS if d.is_dir()), None)
if CONFIG_DIR is None:
    pytest.skip(f"no HF config directory among {[str(d) for d in CONFIG_DIRS]}", allow_module_level=True)

MODELS = [
    "meta-llama--Meta-Llama-3-8B",
    "meta-llama--Meta-Llama-3-70B",
    "meta-llama--Llama-3.1-8B",          # rope_scaling
    "mistralai--Mistral-7B-v0.1",
    "Qwen--Qwen2-7B",                    # qkv bias; 28 heads
    "Qwen--Qwen2-0.5B",                  # tied embeddings; 14 heads, 2 KV heads
    "TinyLlama--TinyLlama-1.1B-Chat-v1.0",  # 4 KV heads → duplication at tp=8; 22 layers → uneven pp=4
]
TP_SIZES = (1, 2, 4, 8)
PP_SIZES = (1, 2, 4)

Table = dict[str, tuple[tuple[int, ...], tuple[str, ...]]]  # TRT-LLM name → (shape, HF sources)


class MetaModel:
    """One HF model instantiated on the meta device: its raw config and its (deduplicated) parameters."""

    def __init__(self, name: str, raw: dict[str, Any] | None = None) -> None:
        self.name = name
        self.raw: dict[str, Any] = raw or json.loads((CONFIG_DIR / name / "config.json").read_text())
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**self.raw))
        # named_parameters() drops the tied lm_head, as save_pretrained does on disk
        self.tensors = {n: (p.dtype, tuple(p.shape)) for n, p in model.named_parameters()}
        assert all(p.is_meta for p in model.parameters())

    def spec(self) -> ModelSpec:
        hf = parse_hf_config(self.raw, self.name)
        tensors = {n: TensorInfo(Path("meta"), dtype, shape) for n, (dtype, shape) in self.tensors.items()}
        return ModelSpec(self.name, Path("meta"), hf, family_for(hf, self.name), "safetensors", tensors, ())

    def read(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        dtype, shape = self.tensors[name]
        if rows is not None:
            shape = (rows[1] - rows[0], *shape[1:])
        return torch.empty(shape, dtype=dtype, device="meta")


class MetaModels(dict[str, MetaModel]):
    """Instantiates each HF model on first use only."""

    def __missing__(self, name: str) -> MetaModel:
        self[name] = MetaModel(name)
        return self[name]


@pytest.fixture(scope="module")
def models() -> MetaModels:
    return MetaModels()


@pytest.fixture(scope="module", params=MODELS)
def meta_model(request: pytest.FixtureRequest, models: MetaModels) -> MetaModel:
    return models[request.param]


def refusal(raw: dict[str, Any], tp_size: int) -> list[str]:
    """The config keys that break spec §4.3: Nq % tp == 0, I % tp == 0, and Nkv % tp == 0 or tp % Nkv == 0."""
    nkv = raw["num_key_value_heads"]
    kv_ok = nkv % tp_size == 0 if nkv >= tp_size else tp_size % nkv == 0
    return [key for key, ok in (("num_attention_heads", raw["num_attention_heads"] % tp_size == 0),
                                ("intermediate_size", raw["intermediate_size"] % tp_size == 0),
                                ("num_key_value_heads", kv_ok)) if not ok]


def expected_tables(raw: dict[str, Any], tp_size: int, pp_size: int) -> list[Table]:
    """Per global rank r = tp_r + tp*pp_r: TRT-LLM name → (shape, HF sources), from spec §3.1/§3.2/§4."""
    h, nq, nkv = raw["hidden_size"], raw["num_attention_heads"], raw["num_key_value_heads"]
    inter, vocab, num_layers = raw["intermediate_size"], raw["vocab_size"], raw["num_hidden_layers"]
    d = raw.get("head_dim") or h // nq
    qkv_rows = (nq // tp_size + 2 * math.ceil(nkv / tp_size)) * d
    has_qkv_bias = raw["model_type"] == "qwen2"
    lm_head_source = "model.embed_tokens.weight" if raw.get("tie_word_embeddings") else "lm_head.weight"
    stages = [t.tolist() for t in torch.tensor_split(torch.arange(num_layers), pp_size)]
    tables: list[Table] = []
    for pp_rank, layers in enumerate(stages):
        table: Table = {}
        if pp_rank == 0:
            table["transformer.vocab_embedding.weight"] = ((vocab, h), ("model.embed_tokens.weight",))
        for i, layer in enumerate(layers):
            t, a, m = f"transformer.layers.{i}", f"model.layers.{layer}.self_attn", f"model.layers.{layer}.mlp"
            table[f"{t}.input_layernorm.weight"] = ((h,), (f"model.layers.{layer}.input_layernorm.weight",))
            table[f"{t}.attention.qkv.weight"] = ((qkv_rows, h), tuple(f"{a}.{x}_proj.weight" for x in "qkv"))
            if has_qkv_bias:
                table[f"{t}.attention.qkv.bias"] = ((qkv_rows,), tuple(f"{a}.{x}_proj.bias" for x in "qkv"))
            table[f"{t}.attention.dense.weight"] = ((h, nq * d // tp_size), (f"{a}.o_proj.weight",))
            table[f"{t}.post_layernorm.weight"] = ((h,), (f"model.layers.{layer}.post_attention_layernorm.weight",))
            table[f"{t}.mlp.fc.weight"] = ((inter // tp_size, h), (f"{m}.gate_proj.weight",))
            table[f"{t}.mlp.gate.weight"] = ((inter // tp_size, h), (f"{m}.up_proj.weight",))
            table[f"{t}.mlp.proj.weight"] = ((h, inter // tp_size), (f"{m}.down_proj.weight",))
        if pp_rank == pp_size - 1:
            table["transformer.ln_f.weight"] = ((h,), ("model.norm.weight",))
            table["lm_head.weight"] = ((math.ceil(vocab / tp_size), h), (lm_head_source,))
        tables += [table] * tp_size
    return tables


def joined(parts: torch.Tensor | list[torch.Tensor]) -> tuple[tuple[int, ...], torch.dtype]:
    """Shape and dtype of one rank's tensor from what ``iter_shards`` yields for it: the tensor, or parts that
    concatenate along dim 0 (computed without ``torch.cat``, which is slow on meta)."""
    parts = [parts] if isinstance(parts, torch.Tensor) else parts
    assert all(p.is_meta for p in parts)
    assert len({(p.dtype, tuple(p.shape[1:])) for p in parts}) == 1, [(p.dtype, p.shape) for p in parts]
    return (sum(p.shape[0] for p in parts), *parts[0].shape[1:]), parts[0].dtype


def run_meta(model: MetaModel, tp_size: int, pp_size: int) -> tuple[list[Table], list[list[tuple]], torch.dtype]:
    """Run the converter's loop on meta tensors: per rank TRT-LLM name → (shape, sources), in write order."""
    spec, mapping = model.spec(), Mapping(tp_size, pp_size)
    dtype = resolve_dtype("auto", spec.hf)
    items = work_items(spec, mapping)
    check_sources(spec, items)  # the kit's HF shape table agrees with transformers
    produced: list[Table] = [{} for _ in range(mapping.world_size)]
    written: list[list[tuple]] = [[] for _ in range(mapping.world_size)]
    for item, _, shards, _ in iter_shards(spec, items, mapping, dtype, model.read):
        assert len(shards) == tp_size
        for tp_rank, parts in enumerate(shards):
            shape, tensor_dtype = joined(parts)
            assert tensor_dtype == TORCH_DTYPES[dtype]
            rank = mapping.rank(tp_rank, item.pp_rank)
            assert item.target not in produced[rank], f"{item.target} written twice to rank {rank}"
            produced[rank][item.target] = (shape, item.sources)
            written[rank].append((item.target, tensor_dtype, shape))
    assert rank_entries(spec, mapping, dtype) == written
    return produced, written, TORCH_DTYPES[dtype]


@pytest.mark.parametrize("pp_size", PP_SIZES)
@pytest.mark.parametrize("tp_size", TP_SIZES)
def test_rank_tables(meta_model: MetaModel, tp_size: int, pp_size: int) -> None:
    raw = meta_model.raw
    offending = refusal(raw, tp_size)
    if offending:
        with pytest.raises(KitUsageError) as refused:
            check_tp(raw["num_attention_heads"], raw["num_key_value_heads"], raw["intermediate_size"], tp_size)
        message = str(refused.value)
        assert f"tp_size {tp_size}" in message
        assert any(f"{key} {raw[key]} " in message for key in offending), message
        return
    produced, _, dtype = run_meta(meta_model, tp_size, pp_size)
    expected = expected_tables(raw, tp_size, pp_size)
    assert len(produced) == tp_size * pp_size
    for rank, (got, want) in enumerate(zip(produced, expected, strict=True)):
        assert set(got) == set(want), f"rank {rank}: extra {set(got) - set(want)}, missing {set(want) - set(got)}"
        wrong = [f"{n} {got[n]} != {want[n]}" for n in want if got[n] != want[n]]
        assert not wrong, f"rank {rank}: {wrong}"
    assert dtype == torch.bfloat16  # every config here is bfloat16; `auto` keeps it
    # every HF parameter is read by some rank (nothing is silently dropped)
    read = {s for table in produced for _, sources in table.values() for s in sources}
    assert read == set(meta_model.tensors)


@pytest.mark.parametrize(
    ("name", "tp_size", "message"),
    [
        ("Qwen--Qwen2-7B", 8, "num_attention_heads 28 is not divisible by tp_size 8"),
        ("Qwen--Qwen2-0.5B", 4, "num_attention_heads 14 is not divisible by tp_size 4"),
        ("Qwen--Qwen2-0.5B", 3, "num_attention_heads 14 is not divisible by tp_size 3"),
        ("meta-llama--Meta-Llama-3-8B", 3, "num_attention_heads 32 is not divisible by tp_size 3"),
        ("meta-llama--Meta-Llama-3-8B", 64, "num_attention_heads 32 is not divisible by tp_size 64"),
    ],
)
def test_convert_refuses_tp_with_the_numbers(name: str, tp_size: int, message: str, tmp_path: Path,
                                             models: MetaModels) -> None:
    model = models[name]
    with pytest.raises(KitUsageError, match=message):
        convert(model.spec(), tmp_path, Mapping(tp_size, 1), "auto")
    assert list(tmp_path.iterdir()) == []


def test_kv_refusals_name_the_sizes() -> None:
    with pytest.raises(KitUsageError, match="num_key_value_heads 12 is not divisible by tp_size 8"):
        check_tp(48, 12, 4096, 8)
    with pytest.raises(KitUsageError, match="tp_size 8 is not a multiple of num_key_value_heads 3"):
        check_tp(24, 3, 4096, 8)
    with pytest.raises(KitUsageError, match="intermediate_size 100 is not divisible by tp_size 8"):
        check_tp(32, 8, 100, 8)


def test_llama3_8b_worked_shapes(models: MetaModels) -> None:
    """Spec §4.5, Llama-3-8B: tp=1, tp=2 and tp=16 (Nkv < tp, reps = 2)."""
    model = models["meta-llama--Meta-Llama-3-8B"]
    worked = {
        1: (6144, (4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096)),
        2: (3072, (4096, 2048), (7168, 4096), (4096, 7168), (64128, 4096)),
        16: (512, (4096, 256), (896, 4096), (4096, 896), (8016, 4096)),
    }
    for tp_size, (qkv_rows, dense, fc, proj, lm_head) in worked.items():
        produced, _, _ = run_meta(model, tp_size, 1)
        for table in produced:
            assert table["transformer.layers.0.attention.qkv.weight"][0] == (qkv_rows, 4096)
            assert table["transformer.layers.31.attention.dense.weight"][0] == dense
            assert table["transformer.layers.7.mlp.fc.weight"][0] == fc
            assert table["transformer.layers.7.mlp.gate.weight"][0] == fc
            assert table["transformer.layers.7.mlp.proj.weight"][0] == proj
            assert table["lm_head.weight"][0] == lm_head
            assert table["transformer.vocab_embedding.weight"][0] == (128256, 4096)


def test_llama3_8b_tp2_pp2_stage_layout(models: MetaModels) -> None:
    """Spec §4.4: stage 1 renumbers HF layers 16..31 as 0..15 and owns ln_f and lm_head."""
    produced, _, _ = run_meta(models["meta-llama--Meta-Llama-3-8B"], 2, 2)
    assert [("transformer.vocab_embedding.weight" in t, "lm_head.weight" in t) for t in produced] == [
        (True, False), (True, False), (False, True), (False, True)]
    for rank in (2, 3):
        assert produced[rank]["transformer.layers.0.mlp.fc.weight"][1] == ("model.layers.16.mlp.gate_proj.weight",)
        assert produced[rank]["transformer.layers.15.mlp.gate.weight"][1] == ("model.layers.31.mlp.up_proj.weight",)
        assert "transformer.layers.16.input_layernorm.weight" not in produced[rank]


def test_tinyllama_uneven_pipeline_and_kv_duplication(models: MetaModels) -> None:
    """22 layers on pp=4 → 6, 6, 5, 5 layers; 4 KV heads on tp=8 → one (duplicated) KV head per rank."""
    produced, _, _ = run_meta(models["TinyLlama--TinyLlama-1.1B-Chat-v1.0"], 8, 4)
    counts = [sum(n.endswith("input_layernorm.weight") for n in t) for t in produced]
    assert counts == [6] * 8 + [6] * 8 + [5] * 8 + [5] * 8
    assert produced[0]["transformer.layers.0.attention.qkv.weight"][0] == ((32 // 8 + 2 * 1) * 64, 2048)
    assert produced[31]["lm_head.weight"][0] == (4000, 2048)


def test_qwen2_tied_lm_head_reads_the_embedding(models: MetaModels) -> None:
    model = models["Qwen--Qwen2-0.5B"]
    assert "lm_head.weight" not in model.tensors  # tied: only the embedding exists
    produced, _, _ = run_meta(model, 2, 2)
    assert produced[3]["lm_head.weight"] == ((75968, 896), ("model.embed_tokens.weight",))
    assert produced[0]["transformer.layers.0.attention.qkv.bias"][0] == ((14 // 2 + 2 * 1) * 64,)


@pytest.mark.parametrize("name", MODELS)
def test_checkpoint_config_of_real_configs(name: str) -> None:
    """Unpadded vocab, global layer count, head size, rope values verbatim (Llama-3.1's llama3 scaling)."""
    raw = json.loads((CONFIG_DIR / name / "config.json").read_text())
    hf = parse_hf_config(raw, name)
    config = checkpoint_config(hf, family_for(hf, name), Mapping(2, 2), "bfloat16")
    assert config["architecture"] == raw["architectures"][0]
    assert config["vocab_size"] == raw["vocab_size"]
    assert config["num_hidden_layers"] == raw["num_hidden_layers"]
    assert config["head_size"] == raw["hidden_size"] // raw["num_attention_heads"]
    assert config["rotary_base"] == raw["rope_theta"]
    assert config["rotary_scaling"] == raw.get("rope_scaling")
    assert config["norm_epsilon"] == raw["rms_norm_eps"]
    assert config["mapping"] == {"world_size": 4, "tp_size": 2, "pp_size": 2}
    if raw["model_type"] == "qwen2":
        assert config["qwen_type"] == "qwen2"


# --- Phi-3-mini-4k: transformers' Phi3Config() defaults are its dimensions ------------------------------

def phi3_mini() -> MetaModel:
    config = Phi3Config()
    dims = (config.vocab_size, config.hidden_size, config.intermediate_size, config.num_hidden_layers,
            config.num_attention_heads, config.num_key_value_heads, config.max_position_embeddings)
    assert dims == (32064, 3072, 8192, 32, 32, 32, 4096)  # microsoft/Phi-3-mini-4k-instruct
    raw = {**config.to_dict(), "architectures": ["Phi3ForCausalLM"], "dtype": "bfloat16"}
    return MetaModel("Phi3Config()", raw)


def phi3_table(tp_size: int, pp_size: int) -> list[dict[str, tuple[int, ...]]]:
    """Per rank, from the dimensions alone: fused qkv 3·3072/tp rows (MHA), fused fc 2·8192/tp rows (up and
    gate), no mlp.gate, lm_head 32064/tp rows (no padding needed at tp 2 and 4)."""
    h, i, v = 3072, 8192, 32064
    tables = []
    for layers in torch.tensor_split(torch.arange(32), pp_size):
        table: dict[str, tuple[int, ...]] = {}
        if layers[0] == 0:
            table["transformer.vocab_embedding.weight"] = (v, h)
        for n in range(len(layers)):
            t = f"transformer.layers.{n}."
            table |= {t + "input_layernorm.weight": (h,), t + "attention.qkv.weight": (3 * h // tp_size, h),
                      t + "attention.dense.weight": (h, h // tp_size), t + "post_layernorm.weight": (h,),
                      t + "mlp.fc.weight": (2 * i // tp_size, h), t + "mlp.proj.weight": (h, i // tp_size)}
        if layers[-1] == 31:
            table |= {"transformer.ln_f.weight": (h,), "lm_head.weight": (v // tp_size, h)}
        tables += [table] * tp_size
    return tables


@pytest.mark.parametrize("pp_size", [1, 2])
@pytest.mark.parametrize("tp_size", [2, 4])
def test_phi3_mini_rank_tensors(tp_size: int, pp_size: int) -> None:
    """``rank_tensors`` names and shapes every rank's tensors; the converter's loop on meta tensors writes them."""
    model = phi3_mini()
    spec, mapping = model.spec(), Mapping(tp_size, pp_size)
    assert spec.family.name == "phi3"
    want = phi3_table(tp_size, pp_size)
    for rank in mapping.ranks():
        tensors = rank_tensors(spec.hf, spec.family, mapping, rank, None, "bfloat16")
        assert {n: t.shape for n, t in tensors.items()} == want[rank], f"rank {rank}"
        assert {t.dtype for t in tensors.values()} == {"bfloat16"}
    produced, _, _ = run_meta(model, tp_size, pp_size)  # asserts rank_entries == what was written
    assert [{n: shape for n, (shape, _) in table.items()} for table in produced] == want
    assert produced[0]["transformer.layers.0.attention.qkv.weight"][1] == (
        ("model.layers.0.self_attn.qkv_proj.weight",) * 3)
    assert produced[0]["transformer.layers.5.mlp.fc.weight"][1] == ("model.layers.5.mlp.gate_up_proj.weight",) * 2
    read = {s for table in produced for _, sources in table.values() for s in sources}
    assert read == set(model.tensors)


def test_phi3_mini_w8a16_and_kv_scales_in_the_layout() -> None:
    """The layout of W8A16 with an INT8 KV cache: model-dtype weights and one KV scale per layer."""
    spec = phi3_mini().spec()
    tensors = rank_tensors(spec.hf, spec.family, Mapping(2, 1), 1, QuantLayout("W8A16", "INT8"), "float16")
    scales = [n for n in tensors if n.endswith("kv_cache_scaling_factor")]
    assert len(scales) == 32 and tensors[scales[0]].shape == (1,) and tensors[scales[0]].dtype == "float32"
    assert tensors["transformer.layers.0.mlp.fc.weight"].dtype == "float16"
