"""The BLS route's client (``bls_route.py``): text to ``tensorrt_llm_bls`` (or the ensemble) with ``num_draft_tokens``,
and its draft-target rounds read back as the frontend reads the direct route's responses.

The BLS streams one response per round (this client always streams) with upstream's acceptance outputs, summed over
the request's rounds so far (``total_draft_tokens``, ``total_accepted_draft_tokens``); a response whose
``total_draft_tokens`` grew is a verifying step that carried a draft, so the three counts of ``usage.speculative``
come out as the direct route's. The rounds report no token counts: a choice's completion tokens are its text so far
encoded again by the tokenizer (no special tokens added), which differs from the tokens generated only where the
text encodes otherwise than the model wrote it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, replace

import numpy as np
from tritonclient.grpc import InferResult, service_pb2

from trtllm_kit.serve.client import TextClient
from trtllm_kit.serve.generation import GenerationError
from trtllm_kit.serve.openai.text import Tokenizer
from trtllm_kit.triton_models.draft_rounds import NUM_DRAFT_TOKENS
from trtllm_kit.wire import DraftAcceptance, GenerationRequest, GenerationResponse

# upstream's BLS outputs of draft-target speculation, cumulative over the request's rounds
DRAFT_TOKENS_OUTPUT, ACCEPTED_OUTPUT = "total_draft_tokens", "total_accepted_draft_tokens"


@dataclass
class Rounds:
    """One request's rounds so far: the drafts counted from the BLS's cumulative outputs, and its text."""

    tokenizer: Tokenizer | None
    num_drafts: int = 0
    num_draft_tokens: int = 0
    text: str = ""

    def read(self, response: GenerationResponse, drafted: int | None, accepted: int | None) -> GenerationResponse:
        """A round's response with the request's counts so far (acceptance None when it carries no figures).

        Arguments:
            response: the round's text; drafted, accepted: its ``total_draft_tokens`` and
            ``total_accepted_draft_tokens`` (None: not in the response).
        """
        self.text += response.text
        acceptance = None
        if drafted is not None and accepted is not None:
            if drafted > self.num_draft_tokens:  # this round's target verified a draft
                self.num_drafts += 1
            self.num_draft_tokens = drafted
            acceptance = DraftAcceptance(self.num_drafts, drafted, accepted)
        num_output_tokens = (response.num_output_tokens if self.tokenizer is None
                             else len(self.tokenizer.hf.encode(self.text, add_special_tokens=False)))
        return replace(response, draft_acceptance=acceptance, num_output_tokens=num_output_tokens)


class BlsClient(TextClient):
    """A ``TextClient`` whose text requests speculate through the BLS with ``num_draft_tokens``.

    Arguments:
        url, model, headers, token_model: as ``TextClient``'s; num_draft_tokens: K, sent with every text request;
        tokenizer: counts the completion's tokens (None: one per response).
    """

    def __init__(self, url: str, model: str | None, headers: tuple[tuple[str, str], ...] = (), *,
                 token_model: str = "tensorrt_llm", num_draft_tokens: int, tokenizer: Tokenizer | None) -> None:
        super().__init__(url, model, headers, token_model=token_model)
        self.num_draft_tokens = num_draft_tokens
        self.tokenizer = tokenizer
        self._rounds: dict[str, Rounds] = {}  # the requests in flight, by request id

    async def _encoded(self, req: GenerationRequest) -> service_pb2.ModelInferRequest:
        request = await super()._encoded(req)
        if request.model_name == self.token_model:  # token ids: the frontend refuses them on this route
            return request
        if NUM_DRAFT_TOKENS not in await self.model_inputs():
            raise GenerationError(f"{request.model_name} has no {NUM_DRAFT_TOKENS} input, so it cannot speculate; "
                                  "rebuild the artifact with --speculative draft-target.", status=500)
        request.inputs.add(name=NUM_DRAFT_TOKENS, datatype="INT32", shape=[1, 1] if self._batched else [1])
        request.raw_input_contents.append(np.array([self.num_draft_tokens], np.int32).tobytes())
        return request

    def _response(self, req: GenerationRequest, request: service_pb2.ModelInferRequest,
                  result: InferResult) -> GenerationResponse | None:
        response = super()._response(req, request, result)
        rounds = self._rounds.get(request.id)
        if response is None or rounds is None or not response.texts:
            return response
        drafted, accepted = (result.as_numpy(name) for name in (DRAFT_TOKENS_OUTPUT, ACCEPTED_OUTPUT))
        return rounds.read(response, None if drafted is None else int(drafted.reshape(-1)[0]),
                           None if accepted is None else int(accepted.reshape(-1)[0]))

    async def stream(self, req: GenerationRequest) -> AsyncGenerator[GenerationResponse, None]:
        """``TextClient.stream``, each text response carrying the request's acceptance and token counts so far.

        Arguments:
            req: the request.
        """
        req = replace(req, request_id=req.request_id or uuid.uuid4().hex)
        if req.request_id in self._rounds:
            raise GenerationError(f"request id {req.request_id!r} is in flight already; send each request with an "
                                  "id of its own.", status=400)
        self._rounds[req.request_id] = Rounds(self.tokenizer)
        responses = super().stream(req)
        try:
            async for response in responses:
                yield response
        finally:
            await responses.aclose()
            del self._rounds[req.request_id]
