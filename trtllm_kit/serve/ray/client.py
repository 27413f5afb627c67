"""The frontend's client of the model deployment: a route's ``stream`` through a Ray Serve deployment handle.

The frontend (``serve/frontend.py``) streams from a route's client; here that client sends the request, shaped as
for an LLM API model (``serve/client.py`` ``llmapi_request``), to a replica through the handle and yields the
replica's responses as they come. A client that leaves cancels the handle's call, which Ray Serve passes to the
replica (its generation is aborted). Ray's refusal of a bad request is a 400, any other failure a 503.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Any

from trtllm_kit.serve.client import TextClient, llmapi_request
from trtllm_kit.serve.generation import GenerationError
from trtllm_kit.triton_models.llmapi_params import is_client_error
from trtllm_kit.wire import GenerationRequest, GenerationResponse


class ReplicaClient(TextClient):
    """Streams from the model deployment's replicas.

    Arguments:
        handle: the model deployment's handle (``ray.serve.handle.DeploymentHandle``); name: the deployment's name.
    """

    def __init__(self, handle: Any, name: str) -> None:
        super().__init__(f"ray-serve:{name}", name)
        self.handle = handle.options(stream=True)

    async def close(self) -> None:
        await super().close()

    async def ready(self) -> bool:
        return True  # the deployment is running once serve.run returned; a replica may still be starting (MIN 0)

    async def takes_lora_rows(self) -> bool:
        return False  # an adapter goes by name, as to an LLM API model

    async def stream(self, req: GenerationRequest) -> AsyncGenerator[GenerationResponse, None]:
        """Yield each of the replica's responses (token ids and what scores them, no text, for a token-id prompt);
        leaving early cancels the request in the replica.

        Arguments:
            req: the request.
        """
        call = self.handle.generate.remote(llmapi_request(req))
        finished = False
        try:
            async for response in call:
                yield replace(response, texts=()) if isinstance(req.prompt, tuple) else response
            finished = True
        except Exception as exc:
            cause = getattr(exc, "cause", None) or exc
            raise GenerationError(f"the replica failed the request: {type(cause).__name__}: {cause}",
                                  status=400 if is_client_error(cause) else 503) from None
        finally:
            if not finished:
                call.cancel()
