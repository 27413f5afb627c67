"""A model directory's tokenizer as text → ids plus its ``<bos>`` and ``<eos>`` ids, and every id that ends a
generation: the tokenizer's ``<eos>`` (for a chat model its end-of-turn token: SmolLM2's ``<|im_end|>``; the GGUF
import names the end-of-turn token there) and each ``eos_token_id`` of ``generation_config.json`` (one id or a
list: Llama 3 Instruct lists ``<|end_of_text|>``, ``<|eom_id|>`` and ``<|eot_id|>``).

``tokenizer.json`` is read with ``tokenizers`` alone (importing ``transformers`` and building its tokenizer costs
more than a second); the special tokens are named by ``tokenizer_config.json``, else ``special_tokens_map.json``,
as a string or as an object with a ``content``. Only a directory without ``tokenizer.json`` loads
``transformers.AutoTokenizer``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPECIAL_TOKEN_FILES = ("tokenizer_config.json", "special_tokens_map.json")  # the first that names a token wins


@dataclass(frozen=True)
class TextTokenizer:
    """Encodes text without special tokens; ``bos_id`` and ``eos_id`` are None where the tokenizer has none;
    ``end_ids`` are the ids any of which ends a generation, ``eos_id`` first."""

    encode: Callable[[str], list[int]]
    bos_id: int | None
    eos_id: int | None
    end_ids: tuple[int, ...] = ()


def load_text_tokenizer(model_dir: Path) -> TextTokenizer:
    """The tokenizer of ``model_dir``; raises OSError or ValueError (with the reason) when it cannot be used.

    Arguments:
        model_dir: a Hugging Face model or tokenizer directory.
    """
    if not (model_dir / "tokenizer.json").is_file():
        return _auto_tokenizer(model_dir)
    tokenizer = read_tokenizer_json(model_dir / "tokenizer.json")
    configs = [json_file(model_dir / name) for name in SPECIAL_TOKEN_FILES]

    def special_id(key: str) -> int | None:
        text = special_token_text(configs, key)
        return None if text is None else tokenizer.token_to_id(text)

    eos_id = special_id("eos_token")
    return TextTokenizer(lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
                         special_id("bos_token"), eos_id, end_ids_of(model_dir, eos_id))


def read_tokenizer_json(path: Path) -> Any:
    """``tokenizers.Tokenizer`` of a ``tokenizer.json``, without its truncation and padding (as transformers reads it:
    they would cut the texts); ValueError gives the reason a file cannot be read.

    Arguments:
        path: the ``tokenizer.json``.
    """
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises plain Exceptions for malformed files
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"its tokenizer.json cannot be read: {reason}") from None
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def _auto_tokenizer(model_dir: Path) -> TextTokenizer:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return TextTokenizer(lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
                         tokenizer.bos_token_id, tokenizer.eos_token_id,
                         end_ids_of(model_dir, tokenizer.eos_token_id))


def end_ids_of(model_dir: Path, eos_id: int | None) -> tuple[int, ...]:
    """``eos_id`` then every other ``eos_token_id`` of ``generation_config.json``, each once; ValueError names an
    entry that is not a token id.

    Arguments:
        model_dir: the model or tokenizer directory; eos_id: the tokenizer's end-of-sequence id, or None.
    """
    listed = json_file(model_dir / "generation_config.json").get("eos_token_id")
    listed = [] if listed is None else listed if isinstance(listed, list) else [listed]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in listed):
        raise ValueError(f"its generation_config.json has eos_token_id {listed!r}, not token ids")
    return tuple(dict.fromkeys([*([] if eos_id is None else [eos_id]), *listed]))


def json_file(path: Path) -> dict[str, Any]:
    """The object in ``path``, empty when there is no such file; ValueError names a file that is not one.

    Arguments:
        path: a tokenizer directory's JSON file (``tokenizer_config.json`` and the like).
    """
    if not path.is_file():
        return {}
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"its {path.name} is not JSON: {exc}") from None
    if not isinstance(content, dict):
        raise ValueError(f"its {path.name} holds a {type(content).__name__}, not an object")
    return content


def special_token_text(configs: list[dict[str, Any]], key: str) -> str | None:
    """The text of the special token ``key`` (``eos_token``) as the first of ``configs`` (the contents of
    ``SPECIAL_TOKEN_FILES``, in order) that names it gives it, or None."""
    return next((t for t in (token_text(c.get(key)) for c in configs) if t is not None), None)


def token_text(value: Any) -> str | None:
    """A special token's text as the tokenizer files write it: a string, or an object with a ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None
