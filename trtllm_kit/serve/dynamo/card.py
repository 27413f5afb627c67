"""The directory a kit worker registers with Dynamo as its model path: the artifact's tokenizer files and a Hugging
Face ``config.json``.

Dynamo's frontend builds its model card from that directory (tokenizer, chat template, context length, EOS) and
refuses one without a ``config.json`` that names ``architectures``. An llmapi artifact's unified checkpoint has
that file; a cpu artifact's TensorRT-LLM checkpoint has the same facts under other keys, written here in the
Hugging Face spelling (``CARD_KEYS``), with the family's ``model_type``, which Dynamo requires too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.registry import family_of_checkpoint

CONFIG_FILE = "config.json"
# Hugging Face config key → the TensorRT-LLM checkpoint config's key holding the same fact
CARD_KEYS = {"max_position_embeddings": "max_position_embeddings", "vocab_size": "vocab_size",
             "hidden_size": "hidden_size", "num_hidden_layers": "num_hidden_layers",
             "num_attention_heads": "num_attention_heads", "num_key_value_heads": "num_key_value_heads",
             "torch_dtype": "dtype"}


def write_card(out: Path, card_dir: Path) -> Path:
    """Fill ``card_dir`` with links to ``OUT/tokenizer``'s files and a Hugging Face ``config.json``.

    Arguments:
        out: the artifact (cpu or llmapi); card_dir: the directory to fill (made when missing).
    """
    tokenizer, checkpoint = out / "tokenizer", out / "checkpoint"
    if not tokenizer.is_dir():
        raise KitUsageError(f"{out} has no tokenizer/ directory, and Dynamo's frontend tokenizes the prompts; "
                            "rebuild it from a model with tokenizer files.")
    card_dir.mkdir(parents=True, exist_ok=True)
    for path in sorted(tokenizer.iterdir()):
        link = card_dir / path.name
        if path.is_file() and path.name != CONFIG_FILE and not link.exists():
            link.symlink_to(path.absolute())
    config = json.loads((checkpoint / CONFIG_FILE).read_text())
    (card_dir / CONFIG_FILE).write_text(json.dumps(card_config(config), indent=2))
    return card_dir


def card_config(config: dict[str, Any]) -> dict[str, Any]:
    """A Hugging Face config for the card: the checkpoint's own when it is one (``architectures``), else the
    TensorRT-LLM checkpoint's facts under their Hugging Face names.

    Arguments:
        config: the artifact's ``checkpoint/config.json``.
    """
    if "architectures" in config:
        return config
    if "architecture" not in config:
        raise KitUsageError("checkpoint/config.json names no architecture; rebuild the artifact.")
    family = family_of_checkpoint(config["architecture"], "checkpoint/config.json")
    return {"architectures": [config["architecture"]], "model_type": family.model_types[0],
            **{hf: config[kit] for hf, kit in CARD_KEYS.items() if config.get(kit) is not None}}
