"""What ``generate_async`` of the kit's CPU ``LLM`` returns: a ``RequestOutput`` that the engine thread updates
through its asyncio loop, one ``Update`` per sequence and step, with ``tensorrt_llm``'s fields (``outputs``,
``prompt_token_ids``, ``context_logits``, ``finished``) and finish reasons. Its ``ResultHandle`` is the request's
handle on the engine loop (``runtime/loop.py``): it turns each sequence's progress into an ``Update``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from trtllm_kit.llmapi.cpu_types import CompletionOutput, Logprob, SamplingParams, TokenLogprobs, logprob_dict
from trtllm_kit.runtime.handle import Failure
from trtllm_kit.runtime.sequence import Sequence
from trtllm_kit.wire import DraftAcceptance

ERROR = "error: "  # a finish reason that carries why the request could not run


class Owner(Protocol):
    """What a request needs of the ``LLM`` that runs it: its tokenizer (or None) and a way to cancel it."""

    tokenizer: Any

    def _cancel(self, request: RequestOutput) -> None: ...


class RequestError(RuntimeError):
    """A request the runtime refused (e.g. a prompt longer than max_seq_len, a token id outside the vocabulary)."""


FINISH_REASONS = {"end_id": "stop", "stop_words": "stop", "length": "length", "cancelled": "cancelled"}


@dataclass
class Update:
    """One sequence's progress, handed from the engine thread to the request's loop."""

    index: int
    token_ids: list[int]
    reason: str | None
    cumulative_logprob: float
    new_logprobs: TokenLogprobs = field(default_factory=list)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    generation_logits: Any = None
    context_logits: Any = None
    disaggregated_params: Any = None  # a finished context-only request's DisaggregatedParams
    draft_acceptance: DraftAcceptance | None = None  # the sequence's speculation so far (None: it drafted nothing)


class RequestOutput:
    """The result of ``generate_async``: iterate it (``async for``) when streaming, await ``aresult()`` otherwise.
    ``outputs`` holds ``n`` completions in index order (with ``best_of > n``, once finished: the ``n`` with the
    highest cumulative logprob, re-indexed); ``context_logits`` the prompt's logits on request."""

    def __init__(self, llm: Owner, prompt_token_ids: list[int], streaming: bool, params: SamplingParams) -> None:
        self.request_id = 0
        self.prompt_token_ids = prompt_token_ids
        self._all = [CompletionOutput(index=i) for i in range(params.best_of or params.n)]
        self._n = params.n
        self.outputs = self._all[:params.n] if params.best_of in (None, params.n) else []
        self.context_logits: Any = None
        self.finished = False
        self._llm, self._streaming = llm, streaming
        self._loop = asyncio.get_running_loop()
        self._updates: asyncio.Queue[Update] = asyncio.Queue()
        self._held: Update | None = None  # taken from the queue, but the next streamed output's
        self._marks: dict[int, tuple[str, int, int]] = {}  # index → (text, tokens, logprobs) before this step
        self.handle: ResultHandle | None = None  # its handle on the engine loop, once submitted

    def _push(self, update: Update) -> None:  # engine thread → request loop
        self._loop.call_soon_threadsafe(self._updates.put_nowait, update)

    def _apply(self, update: Update) -> None:
        if update.reason is not None and update.reason.startswith(ERROR):  # raised where the caller awaits
            self.finished = True
            raise RequestError(update.reason.removeprefix(ERROR))
        out = self._all[update.index]
        before_text, before_ids, before_logprobs = self._marks.get(update.index) or (
            out.text, len(out.token_ids), len(out.logprobs))
        out.token_ids = update.token_ids
        out.text = self._llm.tokenizer.decode(update.token_ids, skip_special_tokens=True) \
            if self._llm.tokenizer else ""
        out.text_diff, out.token_ids_diff = out.text[len(before_text):], update.token_ids[before_ids:]
        out.cumulative_logprob = update.cumulative_logprob
        out.logprobs = out.logprobs + update.new_logprobs
        out.logprobs_diff = out.logprobs[before_logprobs:]
        if update.prompt_logprobs is not None:
            out.prompt_logprobs = update.prompt_logprobs
        if update.generation_logits is not None:
            out.generation_logits = update.generation_logits
        if update.context_logits is not None:
            self.context_logits = update.context_logits
        if update.disaggregated_params is not None:
            out.disaggregated_params = update.disaggregated_params
        if update.draft_acceptance is not None:
            out.draft_acceptance = update.draft_acceptance
        if update.reason is not None:
            out.finish_reason = FINISH_REASONS.get(update.reason, update.reason)
        if all(o.finish_reason is not None for o in self._all):
            self.finished = True
            if len(self._all) > self._n:
                best = sorted(self._all, key=lambda o: -(o.cumulative_logprob or 0.0))[:self._n]
                self.outputs = [replace(o, index=i) for i, o in enumerate(best)]

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        update, self._held = self._held or await self._updates.get(), None
        # the diffs of this step run from each completion's state before it
        self._marks = {o.index: (o.text, len(o.token_ids), len(o.logprobs)) for o in self._all}
        for o in self._all:
            o.text_diff, o.token_ids_diff, o.logprobs_diff = "", [], []
        self._apply(update)
        stepped = {update.index}
        while not self._updates.empty():  # the other sequences' progress of the same step, one step each
            update = self._updates.get_nowait()
            if update.index in stepped:  # a later step, queued while this loop was busy: the next output's
                self._held = update
                break
            self._apply(update)
            stepped.add(update.index)
        self._marks = {}
        return self

    async def aresult(self) -> RequestOutput:
        """Wait until the request finishes; returns the final output."""
        while not self.finished:
            update, self._held = self._held or await self._updates.get(), None
            self._apply(update)
        return self

    def abort(self) -> None:
        """Cancel the request; its KV blocks are freed at the engine's next step."""
        self._llm._cancel(self)


class ResultHandle:
    """A request's handle on the engine loop: each sequence's progress as an ``Update`` of its ``RequestOutput`` (new
    tokens each step when streaming, else once finished), a failure as the error ``aresult`` raises.

    Arguments:
        output: the request's result; finished: what a finished sequence returns as ``disaggregated_params``
        (``Disaggregation.finished``; None for other requests).
    """

    def __init__(self, output: RequestOutput, finished: Callable[[Sequence], Any]) -> None:
        self.output, self._finished = output, finished
        self.num_sent: dict[int, int] = {}  # sequence index → output tokens pushed
        output.handle = self

    def progress(self, seq: Sequence, is_last: bool) -> None:
        sent, ids = self.num_sent.get(seq.index, 0), list(seq.output_ids)
        if seq.is_finished:
            reason: str | None = seq.finish_reason or "length"
        elif len(ids) > sent and self.output._streaming:
            self.num_sent[seq.index], reason = len(ids), None
        else:
            return
        params = seq.params
        self.output._push(Update(
            seq.index, ids, reason, seq.cum_logprob,
            [d for d in map(logprob_dict, seq.output_logprobs[sent:]) if d is not None],
            [logprob_dict(e) for e in seq.prompt_logprobs] if params.prompt_logprobs is not None and sent == 0
            else None,
            torch.stack(seq.generation_logits) if params.return_generation_logits and seq.generation_logits else None,
            torch.stack(seq.context_logits) if params.return_context_logits and sent == 0 and seq.context_logits
            else None, self._finished(seq) if seq.is_finished else None, seq.draft_counts.acceptance()))

    def failed(self, message: str, kind: Failure) -> None:
        self.output._push(Update(0, [], f"{ERROR}{message}", 0.0))

    def is_cancelled(self) -> bool:
        return False  # its owner cancels through the loop (``RequestOutput.abort``)
