"""The frontend's client of a disaggregated serve: upstream's two-step request (``trtllm-serve disaggregated``).

Every generation first goes to the context server as a copy with ``max_tokens`` 1 and ``disaggregated_params``
``{"request_type": "context_only"}`` (its one token arrives in one response); the parameters its final response
returns (first token, ``ctx_request_id``, ``encoded_opaque_state``) go with ``request_type`` ``generation_only``
and the original request to the generation server, whose responses (streamed or not) are the answer: they start
with the context's token.
A context response without ``encoded_opaque_state`` ended at its first token (the end token): it is the answer,
and no generation request is sent. A client that leaves between the steps leaves the context server's blocks held
until its ``kv_transfer_timeout_ms``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import replace

from trtllm_kit.serve.client import TextClient
from trtllm_kit.serve.generation import GenerationError
from trtllm_kit.wire import DisaggHandle, GenerationRequest, GenerationResponse


class TwoStepClient(TextClient):
    """Streams from the generation server after a context-only request to the context server.

    Arguments:
        url: the generation server's gRPC ``host:port``; context_url: the context server's; model, headers,
        token_model: as ``TextClient`` (both servers serve the same repository with the same token).
    """

    def __init__(self, url: str, context_url: str, model: str | None = None,
                 headers: tuple[tuple[str, str], ...] = (), *, token_model: str = "tensorrt_llm") -> None:
        super().__init__(url, model, headers, token_model=token_model)
        self.context = TextClient(context_url, model, headers, token_model=token_model)

    async def close(self) -> None:
        await self.context.close()
        await super().close()

    async def ready(self) -> bool:
        return await self.context.ready() and await super().ready()

    async def stream(self, req: GenerationRequest) -> AsyncGenerator[GenerationResponse, None]:
        """The two steps; leaving early cancels the step running.

        Arguments:
            req: the request as the client sent it.
        """
        context = replace(req.with_max_tokens(1), disaggregated=DisaggHandle(request_type="context_only"))
        chunks = [chunk async for chunk in self.context.stream(context)]
        handle = next((c.disaggregated for c in chunks if c.disaggregated is not None), None)
        if handle is None:
            raise GenerationError(f"the context server at {self.context.url} returned no disaggregated_params; "
                                  "serve an llmapi artifact that supports them on both roles.")
        if handle.opaque_state is None:
            for chunk in chunks:
                yield chunk
            return
        generation = replace(req, disaggregated=replace(handle, request_type="generation_only"))
        async for chunk in super().stream(generation):
            yield chunk
