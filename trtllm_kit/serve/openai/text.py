"""Text around generation: stop sequences over a stream, streamed detokenization, the chat template and token
counts."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.chat_template import ChatTemplateError
from trtllm_kit.models.hf_tokenizer import HFTokenizer


class StopMatcher:
    """Cuts a stream of text before the stop sequence that ends first, holding back text that may begin one;
    how the stream is split into pieces does not change where it is cut.

    Each piece is searched only where a stop sequence can newly end (the held-back text, shorter than the longest
    stop sequence, plus the new text), so the work per piece is bounded by the stop sequences' lengths, whose
    total ``request_limits`` bounds, and the whole stream costs time linear in its length.

    Arguments:
        stops: the stop sequences (empty strings ignored).
        include: show the stop sequence itself (vLLM's ``include_stop_str_in_output``).
    """

    def __init__(self, stops: list[str], include: bool = False) -> None:
        self.stops = [s for s in stops if s]
        self.include = include
        self.pending = ""  # held back: no stop sequence lies wholly inside it
        self.stopped = False

    def feed(self, text: str) -> str:
        """Add ``text``; return what may be shown now (``stopped`` turns true at a stop sequence)."""
        if self.stopped:
            return ""
        searched = len(self.pending)
        self.pending += text
        found = ((self.pending.find(s, max(0, searched - len(s) + 1)), len(s)) for s in self.stops)
        hits = [(i + n, i) for i, n in found if i >= 0]  # the stop sequence that ends first, as if fed by character
        if hits:
            end, start = min(hits)
            shown, self.pending, self.stopped = self.pending[: end if self.include else start], "", True
            return shown
        hold = max((self._begun(s) for s in self.stops), default=0)
        shown = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(shown):]
        return shown

    def _begun(self, stop: str) -> int:
        """The length of the longest end of ``pending`` that begins ``stop`` (shorter than it), or 0."""
        start = max(0, len(self.pending) - len(stop) + 1)
        while (start := self.pending.find(stop[0], start)) >= 0:
            if stop.startswith(self.pending[start:]):
                return len(self.pending) - start
            start += 1
        return 0

    def flush(self) -> str:
        """The held-back text once the stream has ended without a stop sequence."""
        shown, self.pending = ("" if self.stopped else self.pending), ""
        return shown


class IncrementalDecoder:
    """Text of a stream of token ids, released once it is stable.

    Each new piece is the decoding of a short window (the previous piece's ids and the new ones) minus the
    decoding of its start, so spaces that depend on the previous token come out right; a piece that ends inside
    a multi-byte character (U+FFFD) waits for the next ids.

    Arguments:
        decode: ids → text (special tokens skipped).
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def feed(self, ids: Iterable[int]) -> str:
        """Add ``ids``; return the text that is now stable."""
        self.ids.extend(ids)
        prefix = self.decode(self.ids[self.prefix_offset:self.read_offset])
        text = self.decode(self.ids[self.prefix_offset:])
        if len(text) <= len(prefix) or text.endswith("\ufffd"):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return text[len(prefix):]

    def flush(self) -> str:
        """The text still held back when the stream ends."""
        prefix = self.decode(self.ids[self.prefix_offset:self.read_offset])
        text = self.decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(prefix):]


class Tokenizer:
    """The model's tokenizer, for the chat template, for counting prompt tokens and for decoding what the engine
    generates (``models/hf_tokenizer.py``: ``tokenizer.json`` as the preprocessing model reads it, without
    transformers).

    Arguments:
        directory: a Hugging Face tokenizer directory (the build's ``tokenizer/``).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.hf = HFTokenizer(directory)
        bos, first = self.hf.special_tokens.get("bos_token"), self.hf.encode("x")[:1]
        # the BOS text a chat template writes that encoding adds again (dropped from the prompt), or None
        self.added_bos = bos if bos and first == [self.hf.token_id("bos_token")] else None

    @property
    def vocab_size(self) -> int:
        return self.hf.vocab_size

    @property
    def eos_id(self) -> int | None:
        return self.hf.token_id("eos_token")

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids`` (special tokens skipped unless asked not to)."""
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def decoder(self, skip_special_tokens: bool = True) -> IncrementalDecoder:
        """A decoder for one generated stream (special tokens skipped unless asked not to)."""
        return IncrementalDecoder(lambda ids: self.hf.decode(ids, skip_special_tokens=skip_special_tokens))

    def encode(self, prompt: str) -> tuple[int, ...]:
        """``prompt``'s token ids as preprocessing encodes them (special tokens added)."""
        return tuple(self.hf.encode(prompt))

    def words(self, texts: list[str]) -> tuple[tuple[int, ...], ...]:
        """Each non-empty text's token ids without special tokens (stop sequences as the engine matches them)."""
        return tuple(tuple(self.hf.encode(text, add_special_tokens=False)) for text in texts if text)

    def count(self, prompt: str) -> int:
        """Tokens of ``prompt`` as preprocessing encodes it (special tokens added)."""
        return len(self.encode(prompt))

    def chat_prompt(self, messages: list[dict[str, Any]]) -> str:
        """``messages`` through the tokenizer's chat template, ending with the assistant's turn.

        The BOS token the template writes is dropped when the tokenizer adds one itself, so the model sees it once.

        Arguments:
            messages: OpenAI chat messages (``role`` and ``content``; content parts of type ``text`` are joined).
        """
        if self.hf.chat_template is None:
            raise KitUsageError(f"the tokenizer in {self.directory} has no chat template; use /v1/completions.")
        plain = [{"role": m["role"], "content": _content_text(m.get("content"))} for m in messages]
        try:
            prompt = self.hf.render_chat(plain)
        except ChatTemplateError as exc:  # the template's own raise_exception, undefined variables
            raise KitUsageError(f"the chat template rejected the messages: {exc}") from None
        if self.added_bos and prompt.startswith(self.added_bos):
            prompt = prompt[len(self.added_bos):]
        return prompt


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict) and
                       part.get("type") == "text")
    raise KitUsageError(f"message content must be a string or a list of text parts, got {type(content).__name__}.")
