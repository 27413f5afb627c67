"""The engine requests of one OpenAI request of several prompts or choices (its parts), admitted as one unit.

At most a window of parts is in flight: the engine's ``max_batch_size`` in sequences (``DEFAULT_MAX_SEQUENCES``
when the model does not state it), so one request never fills the server's queue by itself and a neighbour sent
meanwhile finds room. A part the server refuses for a full queue while another part of the request holds a place
(answered, or not yet answered) is sent again when a part ends, or after ``RETRY_AFTER_S``: the request was
admitted, and its own parts make room. Only a request none of whose parts holds a place is refused, with a 429:
the queue is full of other requests, and a retry can succeed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable

from trtllm_kit.serve.generation import GenerationError
from trtllm_kit.serve.openai.errors import QUEUE_FULL, RETRY_AFTER_S
from trtllm_kit.wire import GenerationRequest, GenerationResponse

DEFAULT_MAX_SEQUENCES = 8  # the window in sequences of a model that states no max_batch_size (the CPU default)
Responses = AsyncGenerator[GenerationResponse, None]
Send = Callable[[GenerationRequest], Responses]


class FanOut:
    """The window and the resending of one request's parts.

    Arguments:
        max_sequences: the engine's ``max_batch_size`` (None: not stated); sequences_per_part: sequences each part
        generates (``best_of``, else ``n``, for one engine request per prompt; 1 for one per choice).
    """

    def __init__(self, max_sequences: int | None, sequences_per_part: int) -> None:
        self.window = max(1, (max_sequences or DEFAULT_MAX_SEQUENCES) // max(sequences_per_part, 1))
        self._slots = asyncio.Semaphore(self.window)
        self._num_unanswered = 0  # parts sent whose first response or refusal has not come
        self._num_accepted = 0  # parts that got a first response
        self._ended = asyncio.Event()  # replaced each time a part ends

    async def stream(self, send: Send, gen: GenerationRequest) -> Responses:
        """The responses of one part, sent once the window has room (and sent again while the queue is full).

        Arguments:
            send: the route's stream of a request; gen: the part.
        """
        async with self._slots:
            first, responses = await self._open(send, gen)
            try:
                if first is None:
                    return
                yield first
                async for response in responses:
                    yield response
            finally:
                await responses.aclose()
                self._ended.set()
                self._ended = asyncio.Event()

    async def _open(self, send: Send, gen: GenerationRequest) -> tuple[GenerationResponse | None, Responses]:
        """The part's first response and its stream, once the server accepted it."""
        while True:
            responses = send(gen)
            self._num_unanswered += 1
            try:
                first = await anext(responses, None)
            except GenerationError as exc:
                await responses.aclose()
                holds_place = self._num_accepted > 0 or self._num_unanswered > 1
                if not holds_place or not any(marker in str(exc) for marker in QUEUE_FULL):
                    raise
            else:
                self._num_accepted += 1
                return first, responses
            finally:
                self._num_unanswered -= 1
            ended = self._ended
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ended.wait(), RETRY_AFTER_S)
