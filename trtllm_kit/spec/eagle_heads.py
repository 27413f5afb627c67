"""An EAGLE-1 heads checkpoint (``--speculative eagle --draft-model DIR``) as TensorRT-LLM 1.2.1's EAGLE converter
reads it (``examples/eagle/convert_checkpoint.py``: ``LlamaConfig.from_pretrained(--eagle_model_dir)``;
``tensorrt_llm/models/eagle/weight.py`` ``load_eagle_hf``): a LLaMA ``config.json`` of one decoder layer, and
weights holding ``fc.weight`` [hidden, 2 hidden] and ``fc.bias`` (the fused embedding and hidden state), the layer
``layers.0.*`` without its input layernorm, and optionally ``embed_tokens.weight`` (else the base's embedding).

In the checkpoint (``EagleForCausalLM``, ``tensorrt_llm/models/eagle/model.py``) each of the ``num_eagle_layers``
EagleNets holds a copy: ``eagle_nets.{i}.drafter.{fc, vocab_embedding, layers.0.*}`` and ``eagle_nets.{i}.lm_head``,
the base's lm_head; ``config.json`` gains ``num_eagle_layers``, ``max_non_leaves_per_layer``, ``max_draft_len`` and
``eagle_net_config`` (a ``LlamaForCausalLM`` config of the heads). One EagleNet per depth of the draft tree
(``spec.draft_tree``: K for the top-1 path of K tokens). The EagleNets are written whole: the kit builds EAGLE at
tp 1, pp 1 (``check_eagle_layout``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_kit.errors import CheckpointError, KitError, KitUsageError
from trtllm_kit.jsonfile import read_json
from trtllm_kit.models.base import Split
from trtllm_kit.models.hf_config import HFConfig, parse_hf_config
from trtllm_kit.spec.draft_tree import depth, max_non_leaves
from trtllm_kit.spec.heads import HeadTensor
from trtllm_kit.spec.speculative import Speculation, SpeculativeOptions

WEIGHTS_FILE = "model.safetensors"
PICKLE_FILE = "pytorch_model.bin"  # EAGLE-1's own release format: a pickle, which the kit does not load
BASE_ARCHITECTURES = ("LlamaForCausalLM",)  # EagleConfig is a LLaMAConfig; the converter loads LlamaForCausalLM
EAGLE_ARCHITECTURE = "EagleForCausalLM"
MAX_NON_LEAVES_PER_LAYER = 10  # the converter's --max_non_leaves_per_layer default
LAYER = "layers.0"
# the heads' decoder layer: TensorRT-LLM name → HF sources (q, k and v fused), as convert_hf_llama names them
LAYER_TABLE = {
    "attention.qkv.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "attention.dense.weight": ("self_attn.o_proj.weight",),
    "mlp.fc.weight": ("mlp.gate_proj.weight",),
    "mlp.gate.weight": ("mlp.up_proj.weight",),
    "mlp.proj.weight": ("mlp.down_proj.weight",),
    "post_layernorm.weight": ("post_attention_layernorm.weight",),
}


@dataclass(frozen=True)
class EagleHeads:
    """A checked EAGLE-1 heads checkpoint: its weights file and config, and the base it drafts for."""

    weights: Path
    config: HFConfig  # the heads' decoder layer
    base: HFConfig
    num_eagle_layers: int  # EagleNets: the draft tree's depth
    has_embedding: bool  # embed_tokens.weight in the heads (else the base's)

    def tensors(self) -> list[HeadTensor]:
        """The heads' table: every EagleNet's copy, whole."""
        heads, base = self.config, self.base
        hidden, kv_rows = heads.hidden_size, heads.num_key_value_heads * heads.head_dim
        shapes = {"attention.qkv.weight": (heads.num_attention_heads * heads.head_dim + 2 * kv_rows, hidden),
                  "attention.dense.weight": (hidden, heads.num_attention_heads * heads.head_dim),
                  "mlp.fc.weight": (heads.intermediate_size, hidden),
                  "mlp.gate.weight": (heads.intermediate_size, hidden),
                  "mlp.proj.weight": (hidden, heads.intermediate_size), "post_layernorm.weight": (hidden,)}
        embedding = HeadTensor(("embed_tokens.weight",), "", (base.vocab_size, hidden), Split.REPLICATE) \
            if self.has_embedding else \
            HeadTensor(("model.embed_tokens.weight",), "", (base.vocab_size, hidden), Split.REPLICATE, True)
        lm_head = "model.embed_tokens.weight" if base.tie_word_embeddings else "lm_head.weight"
        rows = []
        for net in range(self.num_eagle_layers):
            drafter = f"eagle_nets.{net}.drafter"
            rows += [embedding._replace(name=f"{drafter}.vocab_embedding.weight"),
                     HeadTensor(("fc.weight",), f"{drafter}.fc.weight", (hidden, 2 * hidden), Split.REPLICATE),
                     HeadTensor(("fc.bias",), f"{drafter}.fc.bias", (hidden,), Split.REPLICATE)]
            rows += [HeadTensor(tuple(f"{LAYER}.{s}" for s in sources), f"{drafter}.{LAYER}.{name}", shapes[name],
                                Split.REPLICATE) for name, sources in LAYER_TABLE.items()]
            rows.append(HeadTensor((lm_head,), f"eagle_nets.{net}.lm_head.weight", (base.vocab_size, hidden),
                                   Split.REPLICATE, True))
        return rows

    def kv_bytes_per_token(self, kv_bytes: int) -> int:
        """The KV cache the EagleNets' layer adds per token (its layers follow the base's in the engine's cache).

        Arguments:
            kv_bytes: bytes per KV element.
        """
        heads = self.config
        return 2 * heads.num_hidden_layers * heads.num_key_value_heads * heads.head_dim * kv_bytes

    def record(self) -> dict[str, Any]:
        """What the manifest keeps of the heads."""
        return {"kind": "eagle", "source": str(self.weights.parent), "num_eagle_layers": self.num_eagle_layers,
                "embedding": "heads" if self.has_embedding else "base"}

    def config_keys(self, base: dict[str, Any], draft_len: int) -> dict[str, Any]:
        """What the checkpoint's ``config.json`` gains over the base's (``EagleConfig.to_dict``, the converter's
        ``eagle_net_config``: the base's dtype, rotary and layout with the heads' sizes).

        Arguments:
            base: the base's checkpoint ``config.json``; draft_len: the engine's draft tokens per step.
        """
        heads = self.config
        net = {key: base[key] for key in ("dtype", "logits_dtype", "vocab_size", "position_embedding_type",
                                          "hidden_act", "rotary_base", "rotary_scaling", "quantization", "mapping",
                                          "use_parallel_embedding", "embedding_sharding_dim")}
        net |= {"architecture": "LlamaForCausalLM", "num_hidden_layers": heads.num_hidden_layers,
                "num_attention_heads": heads.num_attention_heads, "hidden_size": heads.hidden_size,
                "intermediate_size": heads.intermediate_size, "num_key_value_heads": heads.num_key_value_heads,
                "max_position_embeddings": heads.max_position_embeddings, "norm_epsilon": heads.rms_norm_eps,
                "head_dim": heads.head_dim, "head_size": heads.head_dim}
        return {"architecture": EAGLE_ARCHITECTURE, "max_draft_len": draft_len,
                "num_eagle_layers": self.num_eagle_layers, "max_non_leaves_per_layer": MAX_NON_LEAVES_PER_LAYER,
                "eagle_net_config": net}


def read_eagle_heads(heads_dir: Path, base: HFConfig, tree: tuple[tuple[int, ...], ...]) -> EagleHeads:
    """The heads in ``heads_dir``, refused in one sentence unless it is an EAGLE-1 heads checkpoint for ``base``.

    Arguments:
        heads_dir: --draft-model; base: the target model's config; tree: the draft tree (its depth: the EagleNets).
    """
    if max_non_leaves(tree) > MAX_NON_LEAVES_PER_LAYER:
        raise KitUsageError(f"--draft-choices has {max_non_leaves(tree)} nodes with children at one depth, more than "
                            f"the engine's max_non_leaves_per_layer {MAX_NON_LEAVES_PER_LAYER}; pass a narrower "
                            "tree.")
    if base.architecture not in BASE_ARCHITECTURES:
        raise KitUsageError(f"--speculative eagle needs a base of architecture {' or '.join(BASE_ARCHITECTURES)} "
                            f"(TensorRT-LLM's EagleForCausalLM), got {base.architecture}; use --speculative "
                            "draft-target or lookahead.")
    what = f"pass the directory holding the heads' LLaMA config.json and {WEIGHTS_FILE} with fc.weight"
    raw = read_json(heads_dir / "config.json", f"--draft-model {heads_dir} has no config.json, so it is not an "
                    f"EAGLE heads checkpoint; {what}.", KitUsageError)
    try:
        config = parse_hf_config(raw if isinstance(raw, dict) else {}, f"--draft-model {heads_dir}/config.json")
    except KitError as exc:
        raise KitUsageError(f"{exc} It is not an EAGLE heads checkpoint; {what}.") from None
    weights = heads_dir / WEIGHTS_FILE
    if not weights.is_file():
        found = f"only {PICKLE_FILE}, a pickle the kit does not load" if (heads_dir / PICKLE_FILE).is_file() else \
            f"no {WEIGHTS_FILE}"
        raise KitUsageError(f"--draft-model {heads_dir} has {found}; save the heads as {WEIGHTS_FILE}.")
    from trtllm_kit.safetensors_io import read_header  # imports torch

    try:
        header = read_header(weights)
    except CheckpointError as exc:
        raise KitUsageError(f"--draft-model {heads_dir}: {exc}") from None
    where = f"--draft-model {heads_dir}/{WEIGHTS_FILE}"
    fc = tuple(header["fc.weight"]["shape"]) if "fc.weight" in header else None
    if any(name.startswith("midlayer.") for name in header) or fc == (config.hidden_size, 3 * config.hidden_size):
        raise KitUsageError(f"{where} holds EAGLE-3 heads (midlayer.*, fc.weight {list(fc or ())}), which "
                            "TensorRT-LLM 1.2.1 runs on the PyTorch path only; build with --target llmapi "
                            "--speculative eagle3.")
    if fc is None:
        raise KitUsageError(f"{where} has no fc.weight, so it is not an EAGLE heads checkpoint; {what}.")
    if config.hidden_size != base.hidden_size or config.vocab_size != base.vocab_size:
        raise KitUsageError(f"--draft-model {heads_dir} has hidden size {config.hidden_size} and vocabulary "
                            f"{config.vocab_size} where the base has {base.hidden_size} and {base.vocab_size}; use "
                            "heads trained on this base model.")
    if config.num_hidden_layers != 1:
        raise KitUsageError(f"--draft-model {heads_dir} has {config.num_hidden_layers} decoder layers where EAGLE-1 "
                            "heads have 1 (TensorRT-LLM's EagleNet drops the first layer's input layernorm only); "
                            "pass EAGLE-1 heads.")
    heads = EagleHeads(weights, config, base, depth(tree), "embed_tokens.weight" in header)
    for row in heads.tensors():
        parts = [tuple(header[name]["shape"]) if name in header else None for name in row.sources]
        if row.from_base or (None not in parts and _stacked(parts) == row.shape):
            continue
        missing = [name for name, shape in zip(row.sources, parts, strict=True) if shape is None]
        found = f"lacks the tensor {missing[0]!r}" if missing else f"has {'+'.join(row.sources)} of shape " \
            f"{list(_stacked(parts))} where {list(row.shape)} is expected"
        raise KitUsageError(f"{where} {found}; pass EAGLE-1 heads trained on this base model.")
    return heads


def check_eagle_layout(options: SpeculativeOptions, tp_size: int, pp_size: int) -> None:
    """Refuse EAGLE on a sharded target: the kit writes the EagleNets whole.

    Arguments:
        options: the ``[speculative]`` table; tp_size, pp_size: the target's layout.
    """
    if options.mode is Speculation.EAGLE and tp_size * pp_size > 1:
        raise KitUsageError(f"--speculative eagle on the engine target needs --tp 1 --pp 1 (the kit writes the "
                            f"EagleNets whole), got tp {tp_size} pp {pp_size}; build with --tp 1 --pp 1.")


def _stacked(shapes: list[tuple[int, ...] | None]) -> tuple[int, ...]:
    """The shape of tensors concatenated along dim 0."""
    first = shapes[0] or ()
    return (sum((s or (0,))[0] for s in shapes), *first[1:])
