"""Text ↔ token ids for the repository's Python models, from the tokenizer copied into the repository.

Shipped next to each ``model.py`` that needs it (``<model>/1/text_codec.py``); it needs only ``tokenizers``
(a ``tokenizer.json``) or, failing that, ``transformers`` with local files. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class TextCodec:
    """Encode prompts and decode generated ids with a Hugging Face tokenizer directory."""

    def __init__(self, tokenizer_dir: Path) -> None:
        """Arguments:
        tokenizer_dir: a directory with ``tokenizer.json`` (preferred) or other files ``AutoTokenizer`` reads.
        """
        tokenizer_dir = Path(tokenizer_dir)
        if not tokenizer_dir.is_dir():
            raise FileNotFoundError(f"tokenizer_dir {tokenizer_dir} does not exist; rebuild the repository.")
        config_path = tokenizer_dir / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self._fast: Any = None  # tokenizers.Tokenizer over tokenizer.json
        self._hf: Any = None  # transformers' tokenizer where there is no tokenizer.json
        if (tokenizer_dir / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            self._fast = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        else:
            from transformers import AutoTokenizer

            self._hf = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
        self.eos_id = self._special_id(config, "eos_token")
        self.pad_id = self._special_id(config, "pad_token")
        if self.pad_id is None:
            self.pad_id = self.eos_id

    def _special_id(self, config: dict[str, Any], key: str) -> int | None:
        if self._hf is not None:
            return getattr(self._hf, f"{key}_id", None)
        text = _token_text(config.get(key))
        return None if text is None else self._fast.token_to_id(text)

    @property
    def vocab_size(self) -> int:
        return self._fast.get_vocab_size() if self._fast is not None else len(self._hf)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``.

        Arguments:
            text: the prompt or a stop word; add_special_tokens: add BOS and the like as the tokenizer says.
        """
        if self._fast is not None:
            return self._fast.encode(text, add_special_tokens=add_special_tokens).ids
        return self._hf.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``.

        Arguments:
            ids: token ids; skip_special_tokens: drop BOS/EOS/pad and other special tokens.
        """
        if self._fast is not None:
            return self._fast.decode(ids, skip_special_tokens=skip_special_tokens)
        return self._hf.decode(ids, skip_special_tokens=skip_special_tokens)


def parameter(model_config: dict[str, Any], key: str, default: str | None = None) -> str | None:
    """A string parameter of a model config; empty and ``${...}`` values count as unset.

    Arguments:
        model_config: the parsed ``args["model_config"]``; key: the parameter; default: when unset.
    """
    value = (model_config.get("parameters", {}).get(key) or {}).get("string_value", "")
    if not value or (value.startswith("${") and value.endswith("}")):
        return default
    return value


def flag(model_config: dict[str, Any], key: str, default: bool) -> bool:
    """A boolean parameter (true/yes/1/t enable).

    Arguments:
        model_config: the parsed config; key: the parameter; default: when unset.
    """
    value = parameter(model_config, key)
    return default if value is None else value.strip().lower() in ("true", "yes", "1", "t")


def model_codec(args: dict[str, str], model_config: dict[str, Any], model: str) -> TextCodec:
    """The codec of a model's ``tokenizer_dir`` parameter.

    Arguments:
        args: ``initialize``'s arguments; model_config: the parsed ``args["model_config"]``; model: its name,
        for the error.
    """
    tokenizer_dir = parameter(model_config, "tokenizer_dir")
    if tokenizer_dir is None:
        raise ValueError(f"{model} needs the parameter tokenizer_dir; regenerate the repository.")
    return TextCodec(resolve_dir(args["model_repository"], tokenizer_dir))


def resolve_dir(model_dir: str, value: str) -> Path:
    """A directory parameter: absolute as given, relative to the model's directory otherwise.

    Arguments:
        model_dir: ``args["model_repository"]`` (the model's directory); value: the parameter.
    """
    path = Path(value)
    return path if path.is_absolute() else Path(model_dir) / path
