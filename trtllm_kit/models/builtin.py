"""The built-in tiny models (``builtin:tiny-llama`` and friends), generated on first use and cached.

Each is a normal Hugging Face directory with random bfloat16 weights drawn from a seeded ``torch.Generator``
(never transformers' initialisers, which change between versions) and a byte-level BPE tokenizer trained on
the shipped corpus. The shapes exercise every conversion rule: GQA, an odd vocabulary (lm_head padding at
tp=2 and 4), three layers (an uneven pp=2 split), llama3 RoPE scaling, q/k/v biases, tied embeddings and Phi-3's
fused ``qkv_proj`` and ``gate_up_proj``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers
import torch
from safetensors.torch import save_file

from trtllm_kit.errors import ModelError
from trtllm_kit.models.cache_dir import STALE_TMP_SECONDS as STALE_TMP_SECONDS  # re-exported for its tests
from trtllm_kit.models.cache_dir import cache_root, cached_dir
from trtllm_kit.models.gguf.importer import import_gguf
from trtllm_kit.models.packaged import PACKAGED_MODELS, packaged_gguf
from trtllm_kit.models.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    TOKENIZER_VOCAB_SIZE,
    corpus_path,
    write_tokenizer,
)

BUILTIN_PREFIX = "builtin:"
GENERATOR_VERSION = 1  # bump whenever the recipe below changes what is written
QK_GAIN = 2.0  # q and k weights are this many times N(0, 1/in): attention scores of std ~QK_GAIN**2

ATTN, MLP = "model.layers.{}.self_attn", "model.layers.{}.mlp"


@dataclass(frozen=True)
class BuiltinModel:
    """One built-in model: its HF ``config.json`` content and the seed of its weights."""

    name: str
    description: str
    hf_config: dict[str, Any]
    seed: int

    def __post_init__(self) -> None:
        vocab_size = self.hf_config["vocab_size"]
        if vocab_size < TOKENIZER_VOCAB_SIZE or vocab_size % 2 == 0:
            raise ValueError(f"{self.name}: vocab_size must be odd and >= {TOKENIZER_VOCAB_SIZE} "
                             f"(the tokenizer's size), got {vocab_size}")

    def cache_key(self) -> str:
        """A short hash of everything that decides the generated files."""
        recipe = {
            "config": self.hf_config,
            "seed": self.seed,
            "generator": GENERATOR_VERSION,
            "corpus": hashlib.sha256(corpus_path().read_bytes()).hexdigest(),
            "torch": torch.__version__.split("+")[0],
            "tokenizers": tokenizers.__version__,
        }
        return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def _config(architecture: str, model_type: str, **family: Any) -> dict[str, Any]:
    """The shapes all built-in models share, plus the family's own keys."""
    return {
        "architectures": [architecture], "model_type": model_type,
        "vocab_size": 1031, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "hidden_act": "silu",
        "max_position_embeddings": 1024, "initializer_range": 0.02, "attention_dropout": 0.0,
        "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID,
        "torch_dtype": "bfloat16", "use_cache": True, **family,
    }


BUILTIN_MODELS: dict[str, BuiltinModel] = {m.name: m for m in (
    BuiltinModel(
        name="tiny-llama",
        description="Llama-3 style, GQA, llama3 RoPE scaling, untied; 3 layers, hidden 256, random weights",
        hf_config=_config(
            "LlamaForCausalLM", "llama", rms_norm_eps=1e-5, rope_theta=500000.0,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
            attention_bias=False, mlp_bias=False, pretraining_tp=1, tie_word_embeddings=False),
        seed=1001,
    ),
    BuiltinModel(
        name="tiny-mistral",
        description="Mistral style, GQA, sliding window 4096, untied; 3 layers, hidden 256, random weights",
        hf_config=_config("MistralForCausalLM", "mistral", rms_norm_eps=1e-5, rope_theta=10000.0,
                          sliding_window=4096, tie_word_embeddings=False),
        seed=1002,
    ),
    BuiltinModel(
        name="tiny-qwen2",
        description="Qwen2 style, GQA, q/k/v biases, tied embeddings; 3 layers, hidden 256, random weights",
        hf_config=_config("Qwen2ForCausalLM", "qwen2", rms_norm_eps=1e-6, rope_theta=1000000.0,
                          use_sliding_window=False, sliding_window=None, max_window_layers=3,
                          tie_word_embeddings=True),
        seed=1003,
    ),
    BuiltinModel(
        name="tiny-phi3",
        description="Phi-3 style, GQA, fused qkv_proj and gate_up_proj, untied; 3 layers, hidden 256, random weights",
        hf_config=_config("Phi3ForCausalLM", "phi3", rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None,
                          original_max_position_embeddings=1024, sliding_window=None, attention_bias=False,
                          resid_pdrop=0.0, embd_pdrop=0.0, tie_word_embeddings=False),
        seed=1004,
    ),
)}


def hf_weight_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of the HF checkpoint, in generation order, with ``{}`` layer slots filled in.

    Arguments:
        config: a built-in model's ``hf_config``.
    """
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q, kv = config["num_attention_heads"] * config["head_dim"], config["num_key_value_heads"] * config["head_dim"]
    has_qkv_bias = config["model_type"] == "qwen2"
    if config["model_type"] == "phi3":  # q, k, v and gate, up stacked along dim 0
        layer = {
            "model.layers.{}.input_layernorm.weight": (h,), f"{ATTN}.qkv_proj.weight": (q + 2 * kv, h),
            f"{ATTN}.o_proj.weight": (h, q), "model.layers.{}.post_attention_layernorm.weight": (h,),
            f"{MLP}.gate_up_proj.weight": (2 * i, h), f"{MLP}.down_proj.weight": (h, i),
        }
    else:
        layer = {
            "model.layers.{}.input_layernorm.weight": (h,),
            f"{ATTN}.q_proj.weight": (q, h), f"{ATTN}.k_proj.weight": (kv, h), f"{ATTN}.v_proj.weight": (kv, h),
            **({f"{ATTN}.q_proj.bias": (q,), f"{ATTN}.k_proj.bias": (kv,), f"{ATTN}.v_proj.bias": (kv,)}
               if has_qkv_bias else {}),
            f"{ATTN}.o_proj.weight": (h, q),
            "model.layers.{}.post_attention_layernorm.weight": (h,),
            f"{MLP}.gate_proj.weight": (i, h), f"{MLP}.up_proj.weight": (i, h), f"{MLP}.down_proj.weight": (h, i),
        }
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for n in range(config["num_hidden_layers"]):
        shapes.update({name.format(n): shape for name, shape in layer.items()})
    shapes["model.norm.weight"] = (h,)
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, h)
    return shapes


def random_weights(model: BuiltinModel) -> dict[str, torch.Tensor]:
    """The model's bfloat16 weights from its seed, drawn in ``hf_weight_shapes`` order.

    Linear weights are N(0, 1/in), except q and k (the q and k rows of a fused ``qkv_proj``) at N(0, 4/in) so
    attention is sharp and position-dependent;
    the embedding is N(0, 1/hidden), so a tied lm_head (Qwen2) gives unit-scale logits like an untied one and
    the input token does not dominate the residual stream; norms are 1 + 0.1·N(0, 1), biases 0.1·N(0, 1).
    Without the last two choices greedy decoding settles on repeating one token within a few steps.

    Arguments:
        model: the built-in model.
    """
    generator = torch.Generator().manual_seed(model.seed)
    weights: dict[str, torch.Tensor] = {}
    for name, shape in hf_weight_shapes(model.hf_config).items():
        x = torch.randn(shape, generator=generator, dtype=torch.float32)
        if name == "model.embed_tokens.weight":
            x = x / shape[1] ** 0.5
        elif name.endswith("norm.weight"):
            x = 1.0 + 0.1 * x
        elif name.endswith(".bias"):
            x = 0.1 * x
        elif name.endswith(("q_proj.weight", "k_proj.weight")):
            x = x * (QK_GAIN / shape[1] ** 0.5)
        elif name.endswith("qkv_proj.weight"):
            qk_rows = (model.hf_config["num_attention_heads"] + model.hf_config["num_key_value_heads"]) * \
                model.hf_config["head_dim"]
            x[:qk_rows] *= QK_GAIN
            x = x / shape[1] ** 0.5
        else:
            x = x / shape[1] ** 0.5
        weights[name] = x.to(torch.bfloat16)
    return weights


def write_model(model: BuiltinModel, model_dir: Path) -> None:
    """Write the model's HF files into an existing, empty directory.

    Arguments:
        model: the built-in model.
        model_dir: the directory to fill.
    """
    config = model.hf_config
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
                  "pad_token_id": config["pad_token_id"]}
    for name, content in {"config.json": config, "generation_config.json": generation}.items():
        (model_dir / name).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
    write_tokenizer(model_dir, config["max_position_embeddings"])
    save_file(random_weights(model), str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    for path in model_dir.iterdir():
        path.chmod(0o644)


def builtin_descriptions() -> dict[str, str]:
    """Every built-in model's name (with ``builtin:``) and description: the tiny random ones, then the trained ones
    fetched from the package index."""
    return {BUILTIN_PREFIX + name: m.description for models in (BUILTIN_MODELS, PACKAGED_MODELS)
            for name, m in models.items()}


def builtin_origin(name: str) -> Path | None:
    """The GGUF file a built-in model is imported from (None for the generated tiny models).

    Arguments:
        name: the model's name without the ``builtin:`` prefix.
    """
    return packaged_gguf(PACKAGED_MODELS[name]) if name in PACKAGED_MODELS else None


def builtin_dir(name: str) -> Path:
    """The HF directory of a built-in model, generated (or fetched and imported) into the cache on first use.

    Generation writes a temporary sibling directory and renames it into place (``cache_dir.cached_dir``), so the
    cache only ever holds complete models.

    Arguments:
        name: the model's name without the ``builtin:`` prefix, e.g. ``"tiny-llama"``.
    """
    if name in PACKAGED_MODELS:
        return import_gguf(packaged_gguf(PACKAGED_MODELS[name])).model_dir
    model = BUILTIN_MODELS.get(name)
    if model is None:
        raise ModelError(f"there is no built-in model {name!r}; the built-in models are "
                         f"{', '.join(builtin_descriptions())}.")
    final = cache_root() / "builtin" / f"{name}-{model.cache_key()}"
    return cached_dir(final, lambda directory: write_model(model, directory), f"{BUILTIN_PREFIX}{name}")
