"""OpenAI's logprobs: what a request asks to be scored (``Scoring``, from the fields ``requests.py`` parses:
completions ``logprobs`` 0-5 and ``echo``, chat ``logprobs`` and ``top_logprobs`` 0-20) and the response objects built
from the engine's scored tokens.

A completion's ``logprobs`` object holds ``tokens``, ``token_logprobs``, ``top_logprobs`` (token → logprob: the
``logprobs`` most likely, and the scored token when it is not among them) and
``text_offset`` (where each token's text begins in the choice's text); with ``echo`` the prompt's tokens come first,
and the first of them has no logprob (null). A chat choice's ``logprobs`` is ``{"content": [...]}``, one entry of
``token``, ``logprob``, ``bytes`` and ``top_logprobs`` per generated token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtllm_kit.serve.openai.text import Tokenizer
from trtllm_kit.wire import Scored

MAX_COMPLETION_LOGPROBS = 5  # OpenAI's bound on completions ``logprobs``
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on chat ``top_logprobs``


@dataclass(frozen=True)
class Scoring:
    """What a request asks to be scored: the generated tokens with ``logprobs`` alternatives (None: not at all),
    and whether the prompt is echoed (its tokens scored too when ``logprobs`` is set)."""

    logprobs: int | None = None
    echo: bool = False


class LogprobText:
    """The text of scored tokens, one token at a time: each token's string (its own decoding, the key of
    ``top_logprobs``) and where it begins in the choice's text (``text_offset``).

    Arguments:
        tokenizer: the model's tokenizer; skip_special_tokens: as the choice's text is decoded;
        offset: where the first token's text begins.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True, offset: int = 0) -> None:
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.decoder = tokenizer.decoder(skip_special_tokens)
        self.offset = offset

    def token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=self.skip)

    def completion(self, scored: tuple[Scored, ...]) -> dict[str, Any]:
        """A completion's ``logprobs`` object for ``scored`` (offsets continue from the previous call)."""
        tokens, offsets = [], []
        for token_id, _, _ in scored:
            tokens.append(self.token(token_id))
            offsets.append(self.offset)
            self.offset += len(self.decoder.feed([token_id]))
        return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in scored],
                "top_logprobs": [None if lp is None else self.top(token, lp, top)
                                 for token, (_, lp, top) in zip(tokens, scored, strict=True)],
                "text_offset": offsets}

    def top(self, token: str, logprob: float, alternatives: tuple[tuple[int, float], ...]) -> dict[str, float]:
        """A completion's ``top_logprobs`` entry: the alternatives, most likely first, then the scored token itself
        when it is not among them (as OpenAI answers: up to ``logprobs`` + 1 entries)."""
        found = {self.token(a): b for a, b in alternatives}
        found.setdefault(token, logprob)
        return found

    def chat(self, scored: tuple[Scored, ...]) -> dict[str, Any]:
        """A chat choice's ``logprobs`` object for ``scored``."""
        def entry(token_id: int, logprob: float | None) -> dict[str, Any]:
            text = self.token(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        return {"content": [{**entry(token_id, lp), "top_logprobs": [entry(a, b) for a, b in top]}
                            for token_id, lp, top in scored]}


def joined(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """Completion ``logprobs`` objects of consecutive tokens as one."""
    return {key: [item for obj in objects for item in obj[key]] for key in
            ("tokens", "token_logprobs", "top_logprobs", "text_offset")}



class Scorer:
    """The echoed prompt and the logprobs of one choice, whole or streamed.

    Arguments:
        scoring: what the request asks for; kind: ``text_completion`` or ``chat.completion``;
        tokenizer: the model's tokenizer (None: nothing is scored); skip_special_tokens: as the text is decoded;
        prompt_text: the prompt as text (what ``echo`` shows).
    """

    def __init__(self, scoring: Scoring, kind: str, tokenizer: Tokenizer | None, skip_special_tokens: bool,
                 prompt_text: str) -> None:
        self.scoring, self.kind = scoring, kind
        self.echo_text = prompt_text if scoring.echo else ""
        self.prompt_text = None if tokenizer is None else LogprobText(tokenizer, skip_special_tokens)
        self.text = None if tokenizer is None else LogprobText(tokenizer, skip_special_tokens, len(self.echo_text))

    def prompt(self, scored: tuple[Scored, ...]) -> dict[str, Any] | None:
        """The echoed prompt's ``logprobs`` object (None unless both ``echo`` and ``logprobs`` are asked)."""
        if self.prompt_text is None or self.scoring.logprobs is None or not self.scoring.echo:
            return None
        return self.prompt_text.completion(scored)

    def tokens(self, scored: tuple[Scored, ...]) -> dict[str, Any] | None:
        """The ``logprobs`` object of generated tokens (offsets continue from the previous call)."""
        if self.text is None or self.scoring.logprobs is None:
            return None
        return self.text.completion(scored) if self.kind == "text_completion" else self.text.chat(scored)

    def whole(self, prompt_scored: tuple[Scored, ...], scored: tuple[Scored, ...]) -> dict[str, Any] | None:
        """A whole choice's ``logprobs`` object: the echoed prompt's tokens, then the generated ones."""
        prompt, tokens = self.prompt(prompt_scored), self.tokens(scored)
        return tokens if prompt is None or tokens is None else joined([prompt, tokens])
