"""The model deployment: one replica holds the artifact's ``LLM`` in-process and streams the wire's responses.

A replica is a Ray Serve actor; ``generate`` takes the frontend's ``GenerationRequest`` and yields
``GenerationResponse``s, mapped to and from the LLM API as the llmapi target's Triton model maps them
(``triton_models/llmapi_params.py``, ``llmapi_outputs.py``). The classes are TensorRT-LLM's on a GPU, else the kit's
CPU runtime behind the same API (``llmapi_classes.py``); the artifact loads as the Dynamo worker loads it, and
computes with the runtime's default torch threads (``artifact_llm.py``). When the caller leaves, Ray Serve
cancels the generator and the request is aborted in the engine. The replica logs each request's end and its engine's
load (``engine_load.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from trtllm_kit.serve.ray.engine_load import SERVE_LOGGER, ended_line, watch_load
from trtllm_kit.serve.ray.prefix import prefix_key
from trtllm_kit.triton_models.llmapi_classes import llm_classes
from trtllm_kit.triton_models.llmapi_outputs import completion_responses
from trtllm_kit.triton_models.llmapi_params import check_mode, sampling_params
from trtllm_kit.wire import GenerationRequest, GenerationResponse


class Replica:
    """One replica of the model: its ``LLM``, loaded once.

    Arguments:
        out: the artifact (cpu or llmapi).
    """

    def __init__(self, out: str) -> None:
        # imported here, in the replica: the driver names this class and so starts Ray without loading torch
        from trtllm_kit.serve.artifact_llm import artifact_llm

        self.classes = llm_classes()
        self.llm, self.limits = artifact_llm(Path(out))
        self.logger = logging.getLogger(SERVE_LOGGER)
        self.watch: asyncio.Task[None] | None = None  # the load's log, started on the replica's loop

    async def generate(self, req: GenerationRequest) -> AsyncIterator[GenerationResponse]:
        """Stream the responses to ``req``: each step's when it is streamed, else the whole completions once.

        Arguments:
            req: the frontend's request, as the llmapi model reads it.
        """
        if self.watch is None:
            self.watch = asyncio.get_running_loop().create_task(watch_load(self.llm, self.logger))
        check_mode(req, decoupled=True)
        prompt: Any = req.prompt if isinstance(req.prompt, str) else list(req.prompt)
        result = self.llm.generate_async(prompt, sampling_params(req, self.classes.sampling_params,
                                                                 self.classes.guided_decoding_params),
                                         streaming=bool(req.streaming))
        reported: set[int] = set()  # completions whose finish was sent
        finished, how = False, "failed"
        try:
            if req.streaming:
                async for output in result:
                    for response in completion_responses(req, output, diff=True, reported=reported):
                        yield response
                    finished = output.finished
                how = "finished"
            else:
                output = await result.aresult()
                finished = True
                for response in completion_responses(req, output, diff=False, reported=reported):
                    yield response
                how = "finished"
        except (asyncio.CancelledError, GeneratorExit):
            how = "left"
            raise
        finally:
            if not finished:  # the caller left (Ray Serve cancelled this generator) or the step failed
                result.abort()
            self.logger.info(ended_line(how, sum(len(c.token_ids) for c in result.outputs),
                                        prefix_key(prompt, self.limits.tokens_per_block)))

    def __del__(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.shutdown()
