"""HF config.json reading: transformers 4 and 5 spellings give the same normalised config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtllm_kit.errors import ModelError
from trtllm_kit.models.hf_config import parse_hf_config
from trtllm_kit.models.registry import family_for

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "hf-configs"
LLAMA31 = json.loads((CONFIGS / "meta-llama--Llama-3.1-8B" / "config.json").read_text())


def as_transformers5(raw: dict) -> dict:
    """The same config as transformers 5 writes it: ``dtype`` and rope settings under ``rope_parameters``."""
    v5 = {k: v for k, v in raw.items() if k not in ("torch_dtype", "rope_theta", "rope_scaling")}
    v5["dtype"] = raw["torch_dtype"]
    v5["rope_parameters"] = {"rope_theta": raw["rope_theta"], **(raw.get("rope_scaling") or {"rope_type": "default"})}
    return v5


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.iterdir() if p.is_dir()))
def test_both_spellings_of_every_real_config_agree(name: str) -> None:
    raw = json.loads((CONFIGS / name / "config.json").read_text())
    v4, v5 = parse_hf_config(raw), parse_hf_config(as_transformers5(raw))
    assert v4 == v5
    assert v4.dtype == "bfloat16"
    assert family_for(v4).architectures[0] == raw["architectures"][0]


def test_llama31_rope_scaling_is_kept_verbatim() -> None:
    hf = parse_hf_config(LLAMA31)
    assert hf.rope_theta == 500000.0
    assert hf.rope_scaling == LLAMA31["rope_scaling"]
    assert (hf.head_dim, hf.num_key_value_heads, hf.eos_token_ids) == (128, 8, (128001,))


def test_default_rope_type_means_no_scaling_and_old_type_key_is_renamed() -> None:
    base = {k: v for k, v in LLAMA31.items() if k != "rope_scaling"}
    default = {**base, "rope_parameters": {"rope_theta": 1e4, "rope_type": "default"}}
    assert parse_hf_config(default).rope_scaling is None
    linear = parse_hf_config({**base, "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert linear.rope_scaling == {"rope_type": "linear", "factor": 2.0}


def test_qwen2_sliding_window_only_when_used() -> None:
    raw = json.loads((CONFIGS / "Qwen--Qwen2-7B" / "config.json").read_text())
    assert parse_hf_config(raw).sliding_window is None  # use_sliding_window: false
    mistral = json.loads((CONFIGS / "mistralai--Mistral-7B-v0.1" / "config.json").read_text())
    assert parse_hf_config(mistral).sliding_window == 4096


@pytest.mark.parametrize(("edit", "message"), [
    (lambda c: c.pop("model_type"), "has no 'model_type' key"),
    (lambda c: c.pop("hidden_size"), "lacks the key 'hidden_size'"),
    (lambda c: c.update(auto_map={"AutoModelForCausalLM": "modeling.Foo"}), "needs remote code"),
])
def test_malformed_configs_are_refused(edit, message: str) -> None:
    raw = dict(LLAMA31)
    edit(raw)
    with pytest.raises(ModelError, match=message):
        parse_hf_config(raw, "config.json")
