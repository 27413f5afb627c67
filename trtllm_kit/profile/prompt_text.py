"""A prompt's token ids as text, for OpenAI servers that take only text prompts: decoded with the model's
tokenizer so that the server encodes it back to the prompt's length."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitUsageError
from trtllm_kit.profile.workload import Prompt


def text_decoder(tokenizer_dir: Path) -> Any:
    """``prompt → text`` with the model's ``tokenizer.json``, for servers that take only text prompts.

    Random token ids decode to text that encodes to other, usually more, tokens; the ids are trimmed until the
    text encodes to no more than ``prompt.isl`` tokens (special tokens included, as the server adds them) and
    the text is then padded with a word that is one token, so the server sees exactly ``prompt.isl``.

    Arguments:
        tokenizer_dir: a directory holding ``tokenizer.json``, or the file itself.
    """
    from tokenizers import Tokenizer

    path = tokenizer_dir / "tokenizer.json" if tokenizer_dir.is_dir() else tokenizer_dir
    if not path.is_file():
        raise KitUsageError(f"--tokenizer {tokenizer_dir} holds no tokenizer.json; "
                            "pass the model's tokenizer directory.")
    tokenizer = Tokenizer.from_file(str(path))
    specials = len(tokenizer.encode("", add_special_tokens=True).ids)
    filler = _one_token_word(tokenizer)

    def length(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    def text_of(prompt: Prompt) -> str:
        target = max(prompt.isl - specials, 1)
        body = list(prompt.input_ids[:target])
        text = tokenizer.decode(body, skip_special_tokens=True)
        while (excess := length(text) - target) > 0 and body:  # re-encoded bytes usually make more tokens
            body = body[:-excess]
            text = tokenizer.decode(body, skip_special_tokens=True)
        while filler and (missing := target - length(text)) > 0:  # pad with a word that stays one token
            text += filler * missing
        return text

    return text_of


def _one_token_word(tokenizer: Any) -> str | None:
    """A short word that encodes to one token after any text (a space, then letters), for padding prompts."""
    for word in (" the", " a", " and", " of"):
        if len(tokenizer.encode(word, add_special_tokens=False).ids) == 1 and \
                len(tokenizer.encode("x" + word, add_special_tokens=False).ids) == 2:
            return word
    return None
