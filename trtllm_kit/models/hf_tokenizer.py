"""A Hugging Face tokenizer directory as a server needs it: encode, decode, the named special tokens and the chat
template, read without importing ``transformers`` (a second of CPU at every serve start) wherever the directory has
``tokenizer.json``.

``tokenizer.json`` runs through ``tokenizers``, as the repository's preprocessing and postprocessing models run it,
so the ids the frontend counts are the ids the engine gets. Decoding follows transformers' fast tokenizers:
``clean_up_tokenization_spaces`` from ``tokenizer_config.json`` (off by default) removes the space before
punctuation and contractions, except for BPE models, which it would corrupt. The special tokens are named by
``tokenizer_config.json``, else ``special_tokens_map.json``. A directory without ``tokenizer.json`` (a
SentencePiece model alone) is read by ``transformers.AutoTokenizer``, behind the same methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtllm_kit.models.chat_template import read_chat_template, render_chat
from trtllm_kit.models.text_tokenizer import SPECIAL_TOKEN_FILES, json_file, read_tokenizer_json, special_token_text

NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# what transformers' clean_up_tokenization replaces, in its order
CLEAN_UPS = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
             (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


class HFTokenizer:
    """The tokenizer of ``directory`` (raises OSError or ValueError, with the reason, when it cannot be read).

    Arguments:
        directory: a Hugging Face tokenizer or model directory.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        config = json_file(directory / "tokenizer_config.json")
        self.chat_template = read_chat_template(directory, config)
        self._fast: Any = None  # tokenizers.Tokenizer over tokenizer.json
        self._auto: Any = None  # transformers' tokenizer where there is no tokenizer.json
        self._clean_up = False  # transformers' decode cleans up spaces itself
        if (directory / "tokenizer.json").is_file():
            self._fast = read_tokenizer_json(directory / "tokenizer.json")
            configs = [config, json_file(directory / SPECIAL_TOKEN_FILES[1])]
            named = {key: special_token_text(configs, key) for key in NAMED_SPECIAL_TOKENS}
            forced = bool(config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"))
            self._clean_up = bool(config.get("clean_up_tokenization_spaces")) and (
                type(self._fast.model).__name__ != "BPE" or forced)
        else:
            from transformers import AutoTokenizer

            self._auto = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
            named = {key: getattr(self._auto, key, None) for key in NAMED_SPECIAL_TOKENS}
            found = self._auto.chat_template  # a template, or named ones as transformers loads them
            self.chat_template = self.chat_template or (found.get("default") if isinstance(found, dict) else found)
        self.special_tokens = {key: str(text) for key, text in named.items() if text is not None}

    @property
    def vocab_size(self) -> int:
        """Token ids in use, the added tokens included."""
        if self._fast is not None:
            return int(self._fast.get_vocab_size(with_added_tokens=True))
        return len(self._auto)

    def token_id(self, key: str) -> int | None:
        """The id of a named special token (``bos_token``), or None when the tokenizer has none."""
        text = self.special_tokens.get(key)
        if text is None:
            return None
        if self._fast is not None:
            return self._fast.token_to_id(text)
        return self._auto.convert_tokens_to_ids(text)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of ``text``, with the tokenizer's special tokens (BOS and the like) unless told not to."""
        if self._fast is not None:
            return list(self._fast.encode(text, add_special_tokens=add_special_tokens).ids)
        return list(self._auto(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids``, special tokens skipped unless told not to."""
        if self._fast is None:
            return str(self._auto.decode(list(ids), skip_special_tokens=skip_special_tokens))
        text: str = self._fast.decode(list(ids), skip_special_tokens=skip_special_tokens)
        if self._clean_up:
            for before, after in CLEAN_UPS:
                text = text.replace(before, after)
        return text

    def render_chat(self, messages: list[dict[str, Any]]) -> str:
        """``messages`` through the chat template, ending with the assistant's turn opened (ValueError when the
        directory has no template; ``ChatTemplateError`` when the template refuses the messages)."""
        if self.chat_template is None:
            raise ValueError(f"the tokenizer in {self.directory} has no chat template")
        return render_chat(self.chat_template, messages, self.special_tokens)

