"""One choice's generation as its client sees it: the engine's responses as chunks of text through the stop matcher
(and, for token-id prompts, the ids that arrived), its tokens counted, its finish reason."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from trtllm_kit.serve.http.errors import HTTPError
from trtllm_kit.serve.openai.routes import Route
from trtllm_kit.serve.openai.sampling_fields import OpenAIRequest
from trtllm_kit.serve.openai.text import StopMatcher
from trtllm_kit.wire import DraftAcceptance, GenerationRequest, GenerationResponse, Scored


@dataclass(frozen=True)
class Chunk:
    """What one streamed chunk carries: text that may be shown, and for token-id prompts the ids that arrived."""

    text: str
    token_ids: tuple[int, ...] | None = None
    scored: tuple[Scored, ...] = ()  # the logprobs of the tokens that arrived, when asked for


class ChoiceStream:
    """One choice's generation: streams text through the stop matcher and counts tokens.

    Token-id prompts, and text prompts the frontend has tokenized (``show_ids`` False), go to ``tensorrt_llm``
    and are decoded here; text prompts of a route without a tokenizer go to the ensemble or BLS. Text prompts
    yield only non-empty text. Token-id prompts yield every response's ids, with the text they complete (often
    empty while a multi-byte character or a stop sequence is pending), so clients can count tokens as they arrive.
    ``responses`` gives the responses of one of a shared request's sequences (``sequences.py``), or of a request sent
    through a request's fan-out (``fanout.py``), in place of a request of its own.
    """

    def __init__(self, route: Route, gen: GenerationRequest, req: OpenAIRequest, *, show_ids: bool = True,
                 responses: Callable[[], AsyncGenerator[GenerationResponse, None]] | None = None) -> None:
        self.route, self.gen, self.req, self.show_ids = route, gen, req, show_ids
        self.responses = responses
        self.num_responses = 0  # one token each unless the model reports its count
        self.num_reported: int | None = None
        self.num_input_tokens: int | None = len(gen.prompt) if isinstance(gen.prompt, tuple) else None
        self.finish_reason = "stop"
        self.last_token_id: int | None = None
        self.prompt_scored: tuple[Scored, ...] = ()  # the prompt's logprobs, when asked for
        self.draft_acceptance: DraftAcceptance | None = None  # the latest counts of a speculating sequence

    async def chunks(self) -> AsyncGenerator[Chunk, None]:
        """The chunks of the answer as they may be shown."""
        matcher = StopMatcher(self.req.stops, self.req.include_stop_str_in_output)
        tokenizer = self.route.tokenizer
        decoder = None
        if isinstance(self.gen.prompt, tuple) and tokenizer is not None:
            decoder = tokenizer.decoder(self.req.skip_special_tokens)
        stream = self.route.stream(self.gen) if self.responses is None else self.responses()
        try:
            async for response in stream:
                if self.gen.prompt_logprobs is not None and not self.prompt_scored:
                    if not response.prompt_scored:  # the C++ backend has no prompt logprobs output
                        raise HTTPError("echo with logprobs needs the prompt's logprobs, which this model's "
                                        "tensorrt_llm does not return; leave echo or logprobs out.", param="echo")
                    self.prompt_scored = response.prompt_scored
                if self.req.max_tokens == 0:  # echo scoring the prompt alone: the one token made is dropped
                    self.num_reported, self.finish_reason = 0, "length"
                    return
                self._count(response)
                if decoder is not None and not response.texts:  # token ids
                    scored = response.scored or ()
                    shown = matcher.feed(decoder.feed(response.token_ids))
                    if self.show_ids:
                        yield Chunk(shown, response.token_ids, scored)
                    elif shown or scored:
                        yield Chunk(shown, None, scored)
                else:
                    shown = matcher.feed(response.text)
                    if shown:
                        yield Chunk(shown)
                if matcher.stopped:
                    return
            rest = matcher.flush() if decoder is None else matcher.feed(decoder.flush()) + matcher.flush()
            if rest:
                yield Chunk(rest, () if decoder is not None and self.show_ids else None)
            limit = self.gen.max_tokens
            if limit is not None and self.num_output_tokens >= limit and not self.ended_on_end_token:
                self.finish_reason = "length"
        finally:
            await stream.aclose()

    def _count(self, response: GenerationResponse) -> None:
        if response.draft_acceptance is not None:  # cumulative
            self.draft_acceptance = response.draft_acceptance
        if not response.texts:  # token ids (the client leaves a token-id answer's text out)
            self.num_reported = (self.num_reported or 0) + len(response.token_ids)
            self.last_token_id = response.token_ids[-1] if response.token_ids else self.last_token_id
            return
        if response.num_output_tokens is not None:  # reported counts are cumulative
            self.num_reported = max(self.num_reported or 0, response.num_output_tokens)
        self.num_responses += 1
        if response.num_input_tokens is not None:
            self.num_input_tokens = response.num_input_tokens

    @property
    def ended_on_end_token(self) -> bool:
        """Whether the last token is the end token (sent back with ``keep_end_token``): the model ended the answer,
        even when that token is the last ``max_tokens`` allows."""
        return self.last_token_id is not None and self.last_token_id == self.gen.end_id

    @property
    def num_output_tokens(self) -> int:
        return self.num_reported if self.num_reported is not None else self.num_responses

    def usage(self) -> dict[str, int]:
        prompt_tokens = self.num_input_tokens
        if prompt_tokens is None:
            tokenizer = self.route.tokenizer
            prompt = self.gen.prompt
            prompt_tokens = tokenizer.count(prompt) if tokenizer is not None and isinstance(prompt, str) else 0
            self.num_input_tokens = prompt_tokens
        return {"prompt_tokens": prompt_tokens, "completion_tokens": self.num_output_tokens,
                "total_tokens": prompt_tokens + self.num_output_tokens}
