"""A draft model's tokenizer against the target's: the same vocabulary (token → id) and the same special tokens,
or the draft's tokens would not mean the target's; ``check_draft``, the check of a build's draft before any work
(heads: ``spec.heads_reader``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.hf_config import read_hf_config
from trtllm_kit.spec.heads_reader import HEADS_MODES, read_heads
from trtllm_kit.spec.speculative import Speculation, SpeculativeOptions

SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")
SPECIAL_TOKEN_FILES = ("tokenizer_config.json", "special_tokens_map.json")  # the first that names a token wins


@dataclass(frozen=True)
class TokenizerIdentity:
    """What decides whether two tokenizers speak the same ids: every token's id and the special tokens' ids."""

    vocab: dict[str, int]
    special_ids: dict[str, int | None]


def tokenizer_identity(model_dir: Path) -> TokenizerIdentity:
    """The vocabulary and special tokens of ``model_dir``'s tokenizer.

    Arguments:
        model_dir: a Hugging Face model or tokenizer directory.
    """
    if (model_dir / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        configs = [_json(model_dir / name) for name in SPECIAL_TOKEN_FILES]
        special: dict[str, int | None] = {}
        for key in SPECIAL_KEYS:
            text = next((t for t in (_text(c.get(key)) for c in configs) if t is not None), None)
            special[key] = None if text is None else tokenizer.token_to_id(text)
        return TokenizerIdentity(vocab, special)
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(str(model_dir))
    return TokenizerIdentity(dict(auto.get_vocab()), {key: getattr(auto, f"{key}_id") for key in SPECIAL_KEYS})


def check_draft_tokenizer(target_dir: Path, draft_dir: Path) -> None:
    """Refuse a draft whose tokenizer differs from the target's (vocabulary or special tokens).

    Arguments:
        target_dir: the target model's directory; draft_dir: the draft's.
    """
    if not draft_dir.is_dir():
        raise KitUsageError(f"--draft-model {draft_dir} is not a directory; pass the draft model's directory.")
    target, draft = tokenizer_identity(target_dir), tokenizer_identity(draft_dir)
    for key in SPECIAL_KEYS:
        if target.special_ids[key] != draft.special_ids[key]:
            raise KitUsageError(f"--draft-model {draft_dir} has {key} id {draft.special_ids[key]} where the target "
                                f"has {target.special_ids[key]}; use a draft with the target's tokenizer.")
    if target.vocab != draft.vocab:
        tokens = target.vocab.keys() | draft.vocab.keys()
        differ = sorted(t for t in tokens if target.vocab.get(t) != draft.vocab.get(t))
        raise KitUsageError(f"--draft-model {draft_dir} has a vocabulary of {len(draft.vocab)} tokens that differs "
                            f"from the target's {len(target.vocab)} ({len(differ)} tokens have another id or none, "
                            f"e.g. {differ[0]!r}); use a draft with the target's tokenizer.")


def check_draft(options: SpeculativeOptions, target_dir: Path) -> None:
    """For a draft-target build, refuse a draft whose tokenizer is not the target's; for Medusa and EAGLE, heads that
    are not such heads for the target (``spec.heads_reader``; nothing for other modes; a missing directory is
    ``speculative_support.check_build``'s refusal).

    Arguments:
        options: the ``[speculative]`` table; target_dir: the target model's directory.
    """
    if options.mode is Speculation.DRAFT_TARGET and options.draft_model is not None:
        check_draft_tokenizer(target_dir, options.draft_model)
    if options.mode in HEADS_MODES:
        read_heads(options, read_hf_config(target_dir))


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    value = json.loads(path.read_text())
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None
