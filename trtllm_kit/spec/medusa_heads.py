"""A Medusa heads checkpoint (``--speculative medusa --draft-model DIR``) as TensorRT-LLM 1.2.1's Medusa converter
reads it (``examples/medusa/convert_checkpoint.py``, ``tensorrt_llm/models/medusa/weight.py`` ``load_medusa_hf``):
``config.json`` with ``medusa_num_heads`` (and ``medusa_num_layers``, default 1), and ``medusa_lm_head.safetensors``
where head ``h`` holds ``h.l.linear.weight`` [hidden, hidden] and ``h.l.linear.bias`` [hidden] per layer ``l``, then
its lm_head ``h.L.weight`` [vocab, hidden]. Read from headers only and checked against the base before any work;
the tree's depth against the heads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_kit.errors import CheckpointError, KitUsageError
from trtllm_kit.jsonfile import read_json
from trtllm_kit.models.base import Split
from trtllm_kit.models.hf_config import HFConfig
from trtllm_kit.spec.draft_tree import depth
from trtllm_kit.spec.heads import HeadTensor
from trtllm_kit.spec.speculative import SpeculativeOptions

WEIGHTS_FILE = "medusa_lm_head.safetensors"
PICKLE_FILE = "medusa_lm_head.pt"  # upstream's other spelling: a pickle, which the kit does not load
HEADS_KEY, LAYERS_KEY = "medusa_num_heads", "medusa_num_layers"
BASE_ARCHITECTURES = ("LlamaForCausalLM",)  # the converter reads the base as LlamaConfig / LlamaForCausalLM
MEDUSA_ARCHITECTURE = "MedusaForCausalLM"


@dataclass(frozen=True)
class MedusaHeads:
    """The heads of a checked Medusa checkpoint: its weights file, heads, layers per head and sizes."""

    weights: Path
    num_heads: int
    num_layers: int
    hidden_size: int
    vocab_size: int

    def tensors(self) -> list[HeadTensor]:
        """The heads' table: each linear split along its outputs, the lm_head's vocabulary padded then split (as
        ``load_medusa_hf`` and ``MedusaHead``'s ``ColumnLinear`` with the padded vocabulary)."""
        hidden, rows = self.hidden_size, []
        for head in range(self.num_heads):
            for layer in range(self.num_layers):
                prefix = f"medusa_heads.{head}.medusa_layers.{layer}.linear"
                rows += [HeadTensor((f"{head}.{layer}.linear.weight",), f"{prefix}.weight", (hidden, hidden),
                                    Split.COLUMN),
                         HeadTensor((f"{head}.{layer}.linear.bias",), f"{prefix}.bias", (hidden,), Split.COLUMN)]
            rows.append(HeadTensor((f"{head}.{self.num_layers}.weight",), f"medusa_heads.{head}.lm_head.weight",
                                   (self.vocab_size, hidden), Split.VOCAB))
        return rows

    def record(self) -> dict[str, Any]:
        """What the manifest's checkpoint record keeps of the heads."""
        return {"kind": "medusa", "source": str(self.weights.parent), "num_heads": self.num_heads,
                "num_layers": self.num_layers}

    def config_keys(self, base: dict[str, Any], draft_len: int) -> dict[str, Any]:
        """What the TensorRT-LLM checkpoint's ``config.json`` gains over the base's (``MedusaConfig.to_dict``).

        Arguments:
            base: the base's checkpoint ``config.json``; draft_len: the engine's draft tokens per step (the tree's
            nodes).
        """
        return {"architecture": MEDUSA_ARCHITECTURE, "num_medusa_heads": self.num_heads,
                "num_medusa_layers": self.num_layers, "max_draft_len": draft_len}


def read_medusa_heads(heads_dir: Path, base: HFConfig) -> MedusaHeads:
    """The heads in ``heads_dir``, refused in one sentence unless it is a Medusa heads checkpoint for ``base``.

    Arguments:
        heads_dir: --draft-model; base: the target model's config.
    """
    if base.architecture not in BASE_ARCHITECTURES:
        raise KitUsageError(f"--speculative medusa needs a base of architecture {' or '.join(BASE_ARCHITECTURES)} "
                            f"(TensorRT-LLM's MedusaForCausalLM), got {base.architecture}; use --speculative "
                            "draft-target or lookahead.")
    what = "pass the directory holding config.json (with medusa_num_heads) and medusa_lm_head.safetensors"
    config = read_json(heads_dir / "config.json", f"--draft-model {heads_dir} has no config.json, so it is not a "
                       f"Medusa heads checkpoint; {what}.", KitUsageError)
    num_heads = config.get(HEADS_KEY) if isinstance(config, dict) else None
    num_layers = config.get(LAYERS_KEY, 1) if isinstance(config, dict) else None
    if not _count(num_heads) or not _count(num_layers):
        raise KitUsageError(f"--draft-model {heads_dir}/config.json has {HEADS_KEY} {num_heads!r} and {LAYERS_KEY} "
                            f"{num_layers!r}, so it is not a Medusa heads checkpoint; {what}.")
    weights = heads_dir / WEIGHTS_FILE
    if not weights.is_file():
        found = f"only {PICKLE_FILE}, a pickle the kit does not load" if (heads_dir / PICKLE_FILE).is_file() else \
            f"no {WEIGHTS_FILE}"
        raise KitUsageError(f"--draft-model {heads_dir} has {found}; save the heads as {WEIGHTS_FILE}.")
    assert isinstance(num_heads, int) and isinstance(num_layers, int)
    heads = MedusaHeads(weights, num_heads, num_layers, base.hidden_size, base.vocab_size)
    _check_shapes(heads, heads_dir, base)
    return heads


def check_tree_depth(heads: MedusaHeads, options: SpeculativeOptions, heads_dir: Path) -> None:
    """Refuse a tree deeper than the heads: head ``d`` drafts the token at depth ``d + 1``.

    Arguments:
        heads: the checked heads; options: the ``[speculative]`` table (its tree); heads_dir: --draft-model.
    """
    deep = depth(options.tree)
    if deep <= heads.num_heads:
        return
    if options.draft_choices is None:
        raise KitUsageError(f"--max-draft-len {deep} exceeds the {heads.num_heads} heads of --draft-model "
                            f"{heads_dir} (the tree takes one token per head); pass --max-draft-len "
                            f"{heads.num_heads} or less.")
    raise KitUsageError(f"--draft-choices reaches depth {deep}, beyond the {heads.num_heads} heads of --draft-model "
                        f"{heads_dir}; pass paths of {heads.num_heads} indices or fewer.")


def _check_shapes(heads: MedusaHeads, heads_dir: Path, base: HFConfig) -> None:
    from trtllm_kit.safetensors_io import read_header  # imports torch

    try:
        header = read_header(heads.weights)
    except CheckpointError as exc:
        raise KitUsageError(f"--draft-model {heads_dir}: {exc}") from None
    for (name,), _, shape, _, _ in heads.tensors():
        if name not in header:
            raise KitUsageError(f"--draft-model {heads_dir}/{WEIGHTS_FILE} lacks the tensor {name!r} that "
                                f"{HEADS_KEY} {heads.num_heads} and {LAYERS_KEY} {heads.num_layers} imply; pass a "
                                "complete Medusa heads checkpoint.")
        found = tuple(header[name]["shape"])
        if found[-1:] != shape[-1:] or (len(shape) == 2 and name.endswith(".linear.weight") and found != shape):
            raise KitUsageError(f"--draft-model {heads_dir}/{WEIGHTS_FILE} has {name} of shape {list(found)}, heads "
                                f"of hidden size {found[-1]} where the base has {base.hidden_size}; use heads "
                                "trained on this base model.")
        if found != shape:
            raise KitUsageError(f"--draft-model {heads_dir}/{WEIGHTS_FILE} has {name} of shape {list(found)}, heads "
                                f"predicting {found[0]} tokens where the base's vocabulary has {base.vocab_size}; "
                                "use heads trained on this base model.")


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
