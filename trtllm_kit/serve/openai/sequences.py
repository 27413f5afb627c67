"""One engine request for all of a prompt's choices (the engine's ``n``: the prompt computed once, its KV blocks
shared), split into one response stream per choice by the responses' ``sequence_index``.

With ``best_of`` > ``n`` the engine generates ``best_of`` sequences and the choices are the ``n`` with the highest
cumulative logprob, best first (the LLM API's and vLLM's rule); they are known only once every sequence has ended,
so such a request is not streamed. A model that picks them itself (the llmapi target's) answers with ``n``
sequences, which pass in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable

from trtllm_kit.wire import GenerationRequest, GenerationResponse

_END = None
Item = GenerationResponse | BaseException | None  # a response, the request's failure, or the end


class SharedSequences:
    """The response streams of one engine request's returned sequences.

    Arguments:
        send: the route's stream of a request (``Route.stream``: its client, with its adapter); gen: the request
        (``n``, and ``best_of`` when more are generated).
    """

    def __init__(self, send: Callable[[GenerationRequest], AsyncGenerator[GenerationResponse, None]],
                 gen: GenerationRequest) -> None:
        self.send, self.gen = send, gen
        self.n = gen.n or 1
        self.queues: list[asyncio.Queue[Item]] = [asyncio.Queue() for _ in range(self.n)]
        self.task: asyncio.Future[None] | None = None
        self.num_dropped_tokens = 0  # generated tokens of the sequences best_of left out

    def stream(self, index: int) -> AsyncGenerator[GenerationResponse, None]:
        """The responses of returned sequence ``index`` (the engine request starts with the first stream asked for)."""
        if self.task is None:
            self.task = asyncio.ensure_future(self._pump())
        return self._read(self.queues[index])

    def close(self) -> None:
        """Cancel the engine request (a client that left, or a failed choice)."""
        if self.task is not None:
            self.task.cancel()

    @staticmethod
    async def _read(queue: asyncio.Queue[Item]) -> AsyncGenerator[GenerationResponse, None]:
        while (item := await queue.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item

    async def _pump(self) -> None:
        try:
            if self.gen.num_sequences > self.n:
                await self._best()
            else:
                async for response in self.send(self.gen):
                    self.queues[response.sequence_index or 0].put_nowait(response)
        except Exception as exc:  # every choice fails with the request
            for queue in self.queues:
                queue.put_nowait(exc)
        finally:
            for queue in self.queues:
                queue.put_nowait(_END)

    async def _best(self) -> None:
        """Every sequence to its end, then the ``n`` of highest cumulative logprob, best first."""
        by_index: dict[int, list[GenerationResponse]] = {}
        async for response in self.send(self.gen):
            by_index.setdefault(response.sequence_index or 0, []).append(response)
        ranked = sorted(by_index)  # a model that picked the n itself sent them in order
        if len(ranked) > self.n:
            ranked.sort(key=lambda i: (-cumulative_logprob(by_index[i]), i))
        for queue, index in zip(self.queues, ranked, strict=False):
            for response in by_index[index]:
                queue.put_nowait(response)
        self.num_dropped_tokens = sum(len(response.token_ids or ()) for index in ranked[self.n:]
                                      for response in by_index[index])


def cumulative_logprob(responses: list[GenerationResponse]) -> float:
    """A sequence's cumulative logprob: the last one its responses report, else the sum of its tokens' logprobs.

    Arguments:
        responses: the sequence's responses in order.
    """
    reported = [response.cum_logprob for response in responses if response.cum_logprob is not None]
    if reported:
        return reported[-1]
    return sum(logprob for response in responses for _, logprob, _ in response.scored or () if logprob is not None)
