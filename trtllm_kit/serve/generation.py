"""What a generation request asks and what comes back: the request, one streamed chunk, and the error a server's
refusal becomes. The frontends build and read them; ``to_wire`` is the request as the wire carries it, which the
client (``serve/client.py``) encodes for Triton."""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_kit import wire
from trtllm_kit.errors import KitError
from trtllm_kit.serve.lora_wire import LoraInputs
from trtllm_kit.serve.scored import Scored


class GenerationError(KitError):
    """The server refused or failed a generation request."""

    def __init__(self, message: str, *, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class GenerationRequest:
    """One request: text for the ensemble's interface, or token ids for ``tensorrt_llm`` (``None``: the model's
    default)."""

    prompt: str | tuple[int, ...]
    max_tokens: int = 16
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    min_tokens: int | None = None
    end_id: int | None = None
    request_id: str = ""
    priority: float | None = None  # TensorRT-LLM's request priority in [0, 1], higher first
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: int | None = None  # the generated tokens' logprobs with this many alternatives (None: none)
    prompt_logprobs: int | None = None  # the prompt tokens' logprobs with this many alternatives (None: none)
    guide: tuple[str, str] | None = None  # structured output: (guided_decoding_guide_type, guided_decoding_guide)
    n: int | None = None  # sequences returned, each response tagged with its ``sequence_index`` (None: one, untagged)
    best_of: int | None = None  # sequences generated, when more than ``n``
    stop_words: tuple[tuple[int, ...], ...] = ()  # stop sequences as token ids (the engine's ``stop_words_list``)
    stop_strings: tuple[str, ...] = ()  # the stop strings themselves (the LLM API's ``SamplingParams.stop``)
    context_logits: bool = False  # prompt logprobs computed here from ``context_logits`` (the C++ backend's way)
    keep_end_token: bool = False  # the end token comes back as the last token, with its logprob (the CPU runtime)
    lora: LoraInputs | None = None  # the adapter the request runs with (None: the base model)
    disaggregated_params: dict | None = None  # the OpenAI wire form of DisaggregatedParams (llmapi models)

    @property
    def num_sequences(self) -> int:
        """Sequences the engine generates: ``best_of``, else ``n``, else one."""
        return max(self.n or 1, self.best_of or 1)

    async def to_wire(self, with_rows: bool = True) -> wire.GenerationRequest:
        """The request as the wire carries it (a value the wire refuses raises ``WireError`` naming the field).

        Arguments:
            with_rows: read the adapter's rows, when it has them (``tensorrt_llm`` takes them; an llmapi model
            takes the adapter's name alone).
        """
        lora = None
        if self.lora is not None:
            rows = await self.lora.rows() if with_rows and self.lora.rows is not None else (None, None)
            lora = wire.LoraAdapter(self.lora.name, self.lora.task_id, *rows)
        handle = self.disaggregated_params
        return wire.GenerationRequest(
            self.prompt, self.max_tokens, self.request_id, temperature=self.temperature, top_k=self.top_k,
            top_p=self.top_p, min_p=self.min_p, seed=self.seed, min_tokens=self.min_tokens, end_id=self.end_id,
            priority=self.priority, repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty, n=self.n,
            best_of=self.best_of, logprobs=self.logprobs, prompt_logprobs=self.prompt_logprobs,
            stop_words=self.stop_words, stop_strings=self.stop_strings, guide=self.guide,
            keep_end_token=self.keep_end_token or None,
            return_context_logits=True if self.context_logits and self.prompt_logprobs is not None else None,
            lora=lora, disaggregated=None if handle is None else wire.DisaggHandle.from_wire(handle))


@dataclass(frozen=True)
class Chunk:
    """One streamed response: the new text (or, for token-id prompts, the new ``token_ids``) and, when the model
    reports them, the prompt's token count and the number of tokens generated so far."""

    text: str
    num_input_tokens: int | None = None
    num_output_tokens: int | None = None
    token_ids: tuple[int, ...] | None = None
    scored: tuple[Scored, ...] = ()  # the new tokens' logprobs, when asked for
    prompt_scored: tuple[Scored, ...] = ()  # the prompt's logprobs, in the first response, when asked for
    sequence_index: int = 0  # which of the request's sequences it continues
    cum_logprob: float | None = None  # that sequence's cumulative logprob so far, when the model reports it
    disaggregated_params: dict | None = None  # what a context-only request returned (its final response)
