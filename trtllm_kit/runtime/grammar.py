"""Structured output with xgrammar: a guide (JSON schema, any JSON, regex, choice list or EBNF grammar) compiled
against the tokenizer, a matcher per sequence, and the token bitmask that sets disallowed logits to -inf.

A sequence's matcher masks its logits before penalties and sampling, accepts every sampled token, and ends the
sequence when it terminates (it accepted a stop token at the end of the grammar). Guide types are the
TensorRT-LLM backend's ``guided_decoding_guide_type`` values (``json`` = any JSON object, ``json_schema``,
``regex``, ``ebnf_grammar``) plus ``choice`` (one of a list of strings, given as a JSON array). JSON is compact
(xgrammar's ``any_whitespace=False``): a model cannot pad it with whitespace until it runs out of tokens.
The tokenizer comes from ``xgrammar_tokenizer_info.json`` (``trtllm_kit.model_repo.xgrammar_info``). A guide past
the bounds of ``guide_limits.py``, or one xgrammar cannot read, raises ``GuideRefused``; served models compile
through ``guide_service.py``, which runs this module's compiler in a process of its own.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trtllm_kit.errors import KitUsageError
from trtllm_kit.runtime.guide_limits import GuideRefused, guide_field, guide_problem

GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar", "choice")
ANY_OBJECT = '{"type": "object"}'  # the ``json`` guide: any JSON object, as OpenAI's json_object promises
# "[06:07:18] /project/cpp/grammar_parser.cc:820: " and "Check failed: (error.empty()) is false: " begin its messages
XGRAMMAR_PREFIX = re.compile(r"^(\[[\d:]+\] \S+:\d+: )?(Check failed: .*? is false: )?")
XGRAMMAR_QUOTE = ". The JSON string is:"  # what follows is the whole guide
MAX_REASON_CHARS = 300


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError:
        raise KitUsageError("structured output needs the xgrammar package; install trtllm-kit[structured].") from None
    return xgrammar


@dataclass(frozen=True)
class Guide:
    """What the output must match: ``guide_type`` (one of ``GUIDE_TYPES``) and its text (schema JSON, regex,
    EBNF, JSON array of choices; ignored for ``json``)."""

    guide_type: str
    guide: str = ""

    def __post_init__(self) -> None:
        if self.guide_type not in GUIDE_TYPES:
            raise KitUsageError(f"guided_decoding_guide_type is {self.guide_type!r}; use one of "
                                f"{', '.join(GUIDE_TYPES)}.")


class GuideMatcher:
    """One sequence's grammar state: masks its logits and accepts its tokens."""

    def __init__(self, compiled: Any, vocab_size: int) -> None:
        xgr = _xgrammar()
        self._xgr, self.vocab_size = xgr, vocab_size
        self._matcher = xgr.GrammarMatcher(compiled)
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def mask(self, row: torch.Tensor) -> torch.Tensor:
        """A copy of ``row`` with the tokens the grammar forbids next set to -inf.

        Arguments:
            row: [vocab] float32 logits.
        """
        self._matcher.fill_next_token_bitmask(self._bitmask)
        masked = row.clone()[None]
        self._xgr.apply_token_bitmask_inplace(masked, self._bitmask, vocab_size=self.vocab_size, backend="cpu")
        return masked[0]

    def accept(self, token_id: int) -> bool:
        """Advance over a sampled token; False when the grammar does not allow it.

        Arguments:
            token_id: the token.
        """
        return bool(self._matcher.accept_token(token_id))

    @property
    def is_terminated(self) -> bool:
        return bool(self._matcher.is_terminated())


class CompiledGuide:
    """A guide compiled for one tokenizer; ``matcher()`` starts a fresh sequence on it."""

    def __init__(self, compiled: Any, vocab_size: int) -> None:
        self._compiled, self.vocab_size = compiled, vocab_size

    @classmethod
    def from_json(cls, text: str, info: Any) -> CompiledGuide:
        """A guide compiled elsewhere (``to_json``), for the tokenizer described by ``info``.

        Arguments:
            text: the compiled guide as JSON; info: xgrammar's ``TokenizerInfo`` it was compiled for.
        """
        return cls(_xgrammar().CompiledGrammar.deserialize_json(text, info), info.vocab_size)

    def to_json(self) -> str:
        return str(self._compiled.serialize_json())

    @property
    def memory_bytes(self) -> int:
        return int(self._compiled.memory_size_bytes)

    def matcher(self) -> GuideMatcher:
        return GuideMatcher(self._compiled, self.vocab_size)


def tokenizer_info(tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> Any:
    """xgrammar's ``TokenizerInfo`` of a Hugging Face tokenizer.

    Arguments:
        tokenizer: a Hugging Face fast tokenizer; vocab_size: the model's (padded) vocabulary size, the width of its
        logits; stop_token_ids: tokens that end a finished grammar (the EOS token).
    """
    return _xgrammar().TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                      stop_token_ids=stop_token_ids)


def tokenizer_info_file(path: Path, vocab_size: int) -> Any:
    """xgrammar's ``TokenizerInfo`` of the tokenizer an ``xgrammar_tokenizer_info.json`` file describes.

    Arguments:
        path: the file; vocab_size: the model's vocabulary size.
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    try:
        info = json.loads(Path(path).read_text())
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(info["tokenizer_str"]))
    except (OSError, ValueError, KeyError) as exc:
        raise KitUsageError(f"xgrammar_tokenizer_info_path {path} is not a readable tokenizer info file "
                            f"({exc}); rebuild the repository to write it.") from None
    return tokenizer_info(tokenizer, vocab_size, [int(t) for t in info.get("stop_token_ids", [])])


class GrammarCompiler:
    """Compiles guides, in this process, for one tokenizer and model vocabulary (xgrammar's ``TokenizerInfo``).
    Serving compiles them in a process of their own (``guide_service.py``), which runs this class."""

    def __init__(self, info: Any) -> None:
        self.info, self.vocab_size = info, int(info.vocab_size)
        self._compiler = _xgrammar().GrammarCompiler(info, max_threads=1, cache_enabled=False)

    @classmethod
    def from_tokenizer_info(cls, path: Path, vocab_size: int) -> GrammarCompiler:
        """A compiler over the tokenizer described by an ``xgrammar_tokenizer_info.json`` file.

        Arguments:
            path: the file; vocab_size: the model's vocabulary size.
        """
        return cls(tokenizer_info_file(path, vocab_size))

    def compile(self, guide: Guide) -> CompiledGuide:
        """Compile a guide; one past the bounds of ``guide_limits`` or malformed raises ``GuideRefused`` naming it.

        Arguments:
            guide: what the output must match.
        """
        field = guide_field(guide.guide_type)
        problem = guide_problem(field, guide.guide_type, guide.guide)
        if problem is not None:
            raise GuideRefused(problem)
        try:
            if guide.guide_type == "json":
                compiled = self._compiler.compile_json_schema(ANY_OBJECT, any_whitespace=False)
            elif guide.guide_type == "json_schema":
                compiled = self._compiler.compile_json_schema(guide.guide, any_whitespace=False)
            elif guide.guide_type == "regex":
                compiled = self._compiler.compile_regex(guide.guide)
            elif guide.guide_type == "choice":
                compiled = self._compiler.compile_grammar(_choice_grammar(guide.guide))
            else:
                compiled = self._compiler.compile_grammar(guide.guide)
        except KitUsageError:
            raise
        except RecursionError:
            raise GuideRefused(f"{field} nests too deep to compile; flatten it.") from None
        except Exception as exc:  # xgrammar reports malformed schemas, regexes and grammars as RuntimeError
            if "bad_alloc" in str(exc):  # and running out of memory too
                raise MemoryError(str(exc)) from None
            raise GuideRefused(f"{field} cannot be compiled: {_reason(exc)}; fix the guide.") from None
        return CompiledGuide(compiled, self.vocab_size)


def _reason(exc: Exception) -> str:
    """xgrammar's message without the time, source location and check it begins with, nor the guide it quotes."""
    reason = XGRAMMAR_PREFIX.sub("", str(exc)).split(XGRAMMAR_QUOTE)[0].strip().rstrip(".")
    return (reason[:MAX_REASON_CHARS] + "..." if len(reason) > MAX_REASON_CHARS else reason) or type(exc).__name__


def _choice_grammar(choices_json: str) -> str:
    """An EBNF grammar whose root is one of the strings in the JSON array ``choices_json``."""
    try:
        choices = json.loads(choices_json)
    except ValueError:
        choices = None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
        raise GuideRefused(f"{guide_field('choice')} must be a JSON array of strings, got {choices_json[:80]!r}.")
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
