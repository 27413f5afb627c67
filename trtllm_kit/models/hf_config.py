"""Reading a Hugging Face ``config.json`` ourselves, in both transformers 4 and 5 spellings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtllm_kit.errors import ModelError
from trtllm_kit.jsonfile import read_json

DTYPE_NAMES = {"float16": "float16", "fp16": "float16", "half": "float16",
               "bfloat16": "bfloat16", "bf16": "bfloat16",
               "float32": "float32", "fp32": "float32", "float": "float32"}


@dataclass(frozen=True)
class HFConfig:
    """The fields of an HF decoder config that conversion, planning and the runtime need."""

    model_type: str
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_parameters(self) -> int:
        """Parameter count from the shapes (embedding counted twice when not tied)."""
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * d * (self.num_attention_heads * 2 + self.num_key_value_heads * 2)
        per_layer = attn + 3 * h * i + 2 * h
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * per_layer + embeddings + h


def _rope(raw: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """``rope_theta`` and ``rope_scaling`` from the top level (v4) or ``rope_parameters`` (v5)."""
    params = raw.get("rope_parameters") or {}
    theta = raw.get("rope_theta", params.get("rope_theta", 10000.0))
    scaling = raw.get("rope_scaling")
    if scaling is None and params:
        scaling = {k: v for k, v in params.items() if k != "rope_theta"} or None
    if scaling is not None:
        scaling = dict(scaling)
        if "type" in scaling and "rope_type" not in scaling:
            scaling["rope_type"] = scaling.pop("type")
        if scaling.get("rope_type", "default") == "default":
            scaling = None
    return float(theta), scaling


def _eos_ids(raw: dict[str, Any]) -> tuple[int, ...]:
    eos = raw.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def parse_hf_config(raw: dict[str, Any], source: str = "config.json") -> HFConfig:
    """Normalise an HF config dict.

    Arguments:
        raw: the parsed ``config.json``.
        source: where it came from, for error messages.
    """
    if "model_type" not in raw:
        raise ModelError(f"{source} has no 'model_type' key; this is not a Hugging Face model config "
                         "(point the kit at the directory that holds the model's config.json).")
    if raw.get("auto_map"):
        raise ModelError(f"{source} needs remote code (auto_map: {sorted(raw['auto_map'])}); the kit never "
                         "runs trust_remote_code models: convert it to a supported architecture first.")
    try:
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        layers = int(raw["num_hidden_layers"])
        vocab = int(raw["vocab_size"])
        inter = int(raw["intermediate_size"])
    except KeyError as missing:
        raise ModelError(f"{source} lacks the key {missing.args[0]!r} that a decoder config must have.") from None
    theta, scaling = _rope(raw)
    dtype_name = str(raw.get("dtype") or raw.get("torch_dtype") or "float32")
    architectures = raw.get("architectures") or []
    return HFConfig(
        model_type=str(raw["model_type"]),
        architecture=str(architectures[0]) if architectures else "",
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        hidden_act=str(raw.get("hidden_act", "silu")),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(raw.get("attention_bias", raw.get("bias", False))),
        mlp_bias=bool(raw.get("mlp_bias", False)),
        sliding_window=raw.get("sliding_window") if raw.get("use_sliding_window", True) else None,
        dtype=DTYPE_NAMES.get(dtype_name.removeprefix("torch."), "float32"),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=_eos_ids(raw),
        raw=raw,
    )


def read_hf_config(model_dir: Path) -> HFConfig:
    """Read and normalise ``model_dir/config.json``.

    Arguments:
        model_dir: a local Hugging Face model directory.
    """
    path = model_dir / "config.json"
    raw = read_json(path, f"{model_dir} has no config.json; point the kit at a Hugging Face model directory.",
                    ModelError)
    if not isinstance(raw, dict):
        raise ModelError(f"{path} holds a {type(raw).__name__}, not a JSON object.")
    return parse_hf_config(raw, str(path))
