"""Text generation against a running server: one gRPC stream per request to ``ensemble`` or ``tensorrt_llm_bls``."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import replace

import grpc
import numpy as np
from tritonclient.grpc import InferResult, model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import serialize_byte_tensor

from trtllm_kit.serve.generation import GenerationError
from trtllm_kit.serve.servable import TEXT_MODELS
from trtllm_kit.wire import GenerationRequest, GenerationResponse, WireError
from trtllm_kit.wire.error_code import split_code
from trtllm_kit.wire.llmapi import encode_llmapi_request, speaks_llmapi
from trtllm_kit.wire.llmapi_response import decode_llmapi_response
from trtllm_kit.wire.logprobs import logits_scored
from trtllm_kit.wire.lora import lora_tensors
from trtllm_kit.wire.tensor import grpc_datatype
from trtllm_kit.wire.text import encode_text_request
from trtllm_kit.wire.trtllm import encode_trtllm_request, request_tensors
from trtllm_kit.wire.trtllm_response import decode_trtllm_response

LORA_INPUTS = tuple(t.name for t in lora_tensors("FP32"))  # upstream's LoRA inputs of tensorrt_llm
TOKEN_MODEL = "tensorrt_llm"
# the codes a model's error is marked with (wire/error_code.py), as HTTP statuses: a refusal (INVALID_ARG) is the
# request's fault; any other code, or none, is 500
MODEL_STATUS = {"INVALID_ARG": 400, "NOT_FOUND": 404, "UNAVAILABLE": 503}
END_WAIT_S = 10.0  # how long a client that half-closed waits for the server to end the stream, before cancelling


class TextClient:
    """Streams text from a model with the ensemble's text interface over one gRPC channel; token-id prompts go
    to ``tensorrt_llm`` itself and come back as token ids.

    Arguments:
        url: ``host:port`` of the server's gRPC endpoint.
        model: ``tensorrt_llm_bls`` or ``ensemble``; the first of them that is ready when None.
        headers: gRPC metadata sent with every call (the token of a server with restricted protocols).
        token_model: the model token-id prompts go to (``tensorrt_llm``, or its name in a merged repository).
    """

    def __init__(self, url: str, model: str | None = None, headers: tuple[tuple[str, str], ...] = (), *,
                 token_model: str = "tensorrt_llm") -> None:
        self.url = url
        self.model = model
        self.token_model = token_model
        self.metadata = tuple(headers) or None
        self._channel: grpc.aio.Channel | None = None  # opened on first use: a client over another transport never does
        self._service: service_pb2_grpc.GRPCInferenceServiceStub | None = None
        self._inputs: set[str] | None = None
        self._types: dict[str, str] = {}  # input name → Triton data type
        self._batched = True

    @property
    def _stub(self) -> service_pb2_grpc.GRPCInferenceServiceStub:
        """Triton's gRPC service at ``url``, over one channel opened on first use."""
        if self._service is None:
            self._channel = grpc.aio.insecure_channel(self.url)
            self._service = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        return self._service

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    async def resolve_model(self) -> str:
        """The model to call: the one given, else the first of ``TEXT_MODELS`` the server has ready."""
        if self.model is None:
            for name in (*TEXT_MODELS, TOKEN_MODEL):  # an llmapi repository's one model is tensorrt_llm
                try:
                    if (await self._stub.ModelReady(service_pb2.ModelReadyRequest(name=name),
                                                           metadata=self.metadata)).ready:
                        self.model = name
                        break
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.UNAVAILABLE:
                        raise GenerationError(f"no server answers at {self.url}: {exc.details()}; start one with "
                                              "trtllm-kit serve OUT or pass --url.", status=503) from None
            else:
                raise GenerationError(f"the server at {self.url} has none of {', '.join(TEXT_MODELS)} ready.",
                                      status=404)
        return self.model

    async def ready(self) -> bool:
        """Whether the server answers and the model this client calls is ready (False on any failure)."""
        try:
            model = await self.resolve_model()
            answer = await self._stub.ModelReady(service_pb2.ModelReadyRequest(name=model), metadata=self.metadata,
                                                 timeout=10)
        except (GenerationError, grpc.aio.AioRpcError):
            return False
        return bool(answer.ready)

    async def model_inputs(self) -> set[str]:
        """The names of the model's inputs (read once from its config)."""
        await self.resolve_model()
        if self._inputs is None:
            try:
                response = await self._stub.ModelConfig(service_pb2.ModelConfigRequest(name=self.model),
                                                       metadata=self.metadata)
            except grpc.aio.AioRpcError as exc:
                raise GenerationError(f"model {self.model!r} is not available at {self.url}: {exc.details()}",
                                      status=404 if exc.code() == grpc.StatusCode.NOT_FOUND else 503) from None
            self._inputs = {tensor.name for tensor in response.config.input}
            self._types = {t.name: model_config_pb2.DataType.Name(t.data_type)[len("TYPE_"):]
                           for t in response.config.input}
            self._batched = response.config.max_batch_size > 0
        return self._inputs

    async def _request(self, req: GenerationRequest) -> service_pb2.ModelInferRequest:
        try:
            return await self._encoded(req)
        except WireError as exc:
            raise GenerationError(str(exc), status=400) from None

    async def _encoded(self, req: GenerationRequest) -> service_pb2.ModelInferRequest:
        """The request in the dialect of the model it goes to: ``tensorrt_llm`` for token ids (unless the model is an
        llmapi one), the llmapi model's, or the text interface's; with the flags this transport reads by."""
        if isinstance(req.prompt, tuple) and self.model not in (None, self.token_model):
            return await self._token_request(req)
        names = await self.model_inputs()
        if speaks_llmapi(self._types):  # the llmapi target's model: text and token ids alike
            if req.lora is not None:
                self._check_lora(names, ("lora_name",))
            arrays = encode_llmapi_request(llmapi_request(req), declared=self._types)
            return _infer_request(await self.resolve_model(), req.request_id, arrays, self._batched)
        if isinstance(req.prompt, tuple):
            return await self._token_request(req)
        if self.model == self.token_model:
            raise GenerationError(f"the server at {self.url} has none of {', '.join(TEXT_MODELS)} ready.", status=404)
        if req.lora is not None:
            self._check_lora(names, LORA_INPUTS)
        gen = replace(req, streaming=True, exclude_input_in_output=True, return_num_input_tokens=True,
                      return_num_output_tokens=True)
        arrays = encode_text_request(gen, declared=self._types)
        return _infer_request(await self.resolve_model(), req.request_id, arrays, self._batched)

    async def _token_request(self, req: GenerationRequest) -> service_pb2.ModelInferRequest:
        """A token-id request to ``tensorrt_llm``, every input sent as set (the model is not asked for its
        config); the adapter's rows go in the ``lora_weights`` type of the model this client reads."""
        weights_type = "FP32"
        if req.lora is not None:
            self._check_lora(await self.model_inputs(), LORA_INPUTS)
            weights_type = self._types["lora_weights"]
        gen = replace(req, streaming=True, exclude_input_in_output=True)
        arrays = encode_trtllm_request(gen, declared=_every_input(weights_type))
        return _infer_request(self.token_model, req.request_id, arrays, batched=True)

    async def takes_lora_rows(self) -> bool:
        """Whether the model takes an adapter's rows (``tensorrt_llm`` and the text interface, when built for
        adapters) rather than its name alone (an llmapi model)."""
        names = await self.model_inputs()
        return not speaks_llmapi(self._types) and "lora_weights" in names

    def _response(self, req: GenerationRequest, request: service_pb2.ModelInferRequest,
                  result: InferResult) -> GenerationResponse | None:
        """One response, as the frontends read it: token ids and what scores them, with no text, for a token-id
        prompt (or a model that sends no text); else the text and the counts alone; None when it carries neither."""
        arrays = {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}
        is_llmapi = request.model_name == self.model and speaks_llmapi(self._types)
        by_logits = bool(req.return_context_logits) and "context_logits" in arrays
        prompt_ids = req.prompt if isinstance(req.prompt, tuple) and req.prompt_logprobs is not None else None
        try:
            if is_llmapi:
                response = decode_llmapi_response(arrays, prompt_ids)
            else:
                response = decode_trtllm_response(arrays, None if by_logits else prompt_ids)
        except WireError as exc:
            raise GenerationError(f"{request.model_name} answered what the kit cannot read: {exc}") from None
        if "output_ids" in arrays and (isinstance(req.prompt, tuple) or "text_output" not in arrays):
            logits = response.context_logits
            if by_logits and prompt_ids is not None and logits is not None and logits.size:
                response = replace(response, prompt_scored=logits_scored(logits, prompt_ids, req.prompt_logprobs or 0))
            return replace(response, texts=())
        if "text_output" in arrays:
            return GenerationResponse(texts=(response.text,), num_input_tokens=response.num_input_tokens,
                                      num_output_tokens=response.num_output_tokens)
        return None

    def _check_lora(self, names: set[str], needed: tuple[str, ...]) -> None:
        if not set(needed) <= names:
            raise GenerationError(f"the model {self.model!r} takes no LoRA adapters (it has no {needed[0]} input); "
                                  "serve an artifact built for adapters, or name the base model.", status=400)

    async def stream(self, req: GenerationRequest) -> AsyncGenerator[GenerationResponse, None]:
        """Yield each response (text, or token ids for a token-id prompt) until the final one; leaving early
        cancels the request.

        The answer ends the stream the way Triton's own clients end it: the client half-closes and the server ends
        the call. A model's error arrives in the open stream with its code in its message (``wire/error_code.py``),
        never as the stream's status (``triton_grpc_error``), on which Triton 2.51 aborts when an error races the
        stream's end.

        Arguments:
            req: the request.
        """
        request = await self._request(req)
        answered = asyncio.Event()

        async def requests() -> AsyncIterator[service_pb2.ModelInferRequest]:
            yield request
            await answered.wait()  # keep the stream open until the last response arrived

        call = self._stub.ModelStreamInfer(requests(), metadata=self.metadata)
        try:
            async for response in call:
                if response.error_message:
                    answered.set()
                    raise _generation_error(request.model_name, response.error_message)
                answer = self._response(req, request, InferResult(response.infer_response))
                if answer is not None:
                    yield answer
                if response.infer_response.parameters["triton_final_response"].bool_param:
                    answered.set()
                    break
        except grpc.aio.AioRpcError as exc:
            raise GenerationError(f"the server at {self.url} failed the request: {exc.code().name}: "
                                  f"{exc.details()}", status=503) from None
        finally:
            await _end(call, answered.is_set())


def llmapi_request(req: GenerationRequest) -> GenerationRequest:
    """``req`` as an LLM API model is sent it: the LLM API picks the best of ``best_of`` only once all are done, so
    such a request is answered whole; the frontend cuts the text at a stop string, so the engine keeps the one it
    stops on.

    Arguments:
        req: the frontend's request.
    """
    return replace(req, streaming=req.num_sequences == (req.n or 1), return_finish_reason=True,
                   include_stop_str_in_output=True if req.stop_strings else None)


async def _end(call: grpc.aio.StreamStreamCall, answered: bool) -> None:
    """End ``call``: once answered, wait for the server to end it after the client's half-close (cancelling it
    after ``END_WAIT_S``); else (the caller left early, the connection failed) cancel the request.

    Arguments:
        call: the request's stream; answered: whether its final response or its error arrived.
    """
    if answered:
        try:
            await asyncio.wait_for(call.code(), END_WAIT_S)
            return
        except (asyncio.TimeoutError, grpc.aio.AioRpcError):
            pass
    call.cancel()


def _generation_error(model: str, message: str) -> GenerationError:
    """The error of a model's failed request: its first line, with the HTTP status of the code that marks it.

    Arguments:
        model: the model called; message: its error as the stream brought it.
    """
    # the Python backend appends the failing model's traceback
    code, message = split_code(message.split("\n\nAt:")[0].strip())
    status = MODEL_STATUS.get(code or "", 500)
    unknown = "unknown model" in message
    if unknown and model.endswith(TOKEN_MODEL):
        return GenerationError(f"token-id prompts go to the {TOKEN_MODEL!r} model, which the server does not have; "
                               "send the prompt as text.", status=404)
    return GenerationError(f"{model}: {message}", status=404 if unknown else status)


def _infer_request(model: str, request_id: str, arrays: Mapping[str, np.ndarray],
                   batched: bool) -> service_pb2.ModelInferRequest:
    """A gRPC request of encoded tensors, with Triton's batch dimension for a batched model.

    Arguments:
        model: the model called; request_id: its id ("": one is made); arrays: the tensors by name; batched: the
        model's ``max_batch_size`` is above 0.
    """
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id or uuid.uuid4().hex)
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    for name, array in arrays.items():
        datatype = grpc_datatype(array)
        request.inputs.add(name=name, datatype=datatype, shape=[1, *array.shape] if batched else list(array.shape))
        request.raw_input_contents.append(serialize_byte_tensor(array).item() if datatype == "BYTES"
                                          else array.tobytes())
    return request


def _every_input(weights_type: str) -> dict[str, str]:
    """Every ``tensorrt_llm`` input of the wire, name → type, with ``lora_weights`` in ``weights_type``."""
    return {t.name: t.data_type for t in request_tensors(weights_type)}


async def generate_to(url: str, model: str | None, req: GenerationRequest, write: Callable[[str], object],
                      headers: tuple[tuple[str, str], ...] = ()) -> int:
    """Stream ``req``'s text through ``write`` as it arrives; returns the number of responses (tokens).

    Arguments:
        url: ``host:port`` of the gRPC endpoint.
        model: the model to call (the first of ``TEXT_MODELS`` ready when None).
        req: the request.
        write: called with each piece of text.
        headers: gRPC metadata for every call (the serve's token, ``launcher.grpc_headers``).
    """
    client = TextClient(url, model, headers)
    count = 0
    try:
        async for chunk in client.stream(req):
            write(chunk.text)
            count += 1
    finally:
        await client.close()
    return count
