"""Text generation against a running server: one gRPC stream per request to ``ensemble`` or ``tensorrt_llm_bls``."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass

import grpc
import numpy as np
from tritonclient.grpc import InferResult, service_pb2, service_pb2_grpc
from tritonclient.utils import serialize_byte_tensor

from trtllm_kit.errors import KitError
from trtllm_kit.serve.compat import TEXT_MODELS
from trtllm_kit.serve.llmapi_request import llmapi_values, speaks_llmapi


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
    disaggregated_params: dict | None = None  # the OpenAI wire form of DisaggregatedParams (llmapi models)


# One scored token: its id, its logprob (None for the first prompt token) and the best alternatives (id, logprob).
Scored = tuple[int, float | None, tuple[tuple[int, float], ...]]


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
    disaggregated_params: dict | None = None  # what a context-only request returned (its final response)


# (text interface input, tensorrt_llm input, Triton datatype, numpy dtype, GenerationRequest field)
SAMPLING_INPUTS = (("temperature", "temperature", "FP32", np.float32, "temperature"),
                   ("top_p", "runtime_top_p", "FP32", np.float32, "top_p"),
                   ("top_k", "runtime_top_k", "INT32", np.int32, "top_k"),
                   ("seed", "seed", "UINT64", np.uint64, "seed"),
                   ("min_tokens", "min_tokens", "INT32", np.int32, "min_tokens"),
                   ("end_id", "end_id", "INT32", np.int32, "end_id"),
                   ("priority", "priority", "FP32", np.float32, "priority"),
                   ("repetition_penalty", "repetition_penalty", "FP32", np.float32, "repetition_penalty"),
                   ("presence_penalty", "presence_penalty", "FP32", np.float32, "presence_penalty"),
                   ("frequency_penalty", "frequency_penalty", "FP32", np.float32, "frequency_penalty"),
                   ("runtime_min_p", "runtime_min_p", "FP32", np.float32, "min_p"))
# fields a model must declare to be sent: the others are left to the model's default when it lacks them
REFUSED_WHEN_MISSING = ("repetition_penalty", "presence_penalty", "frequency_penalty", "min_p")
TOKEN_MODEL = "tensorrt_llm"


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
        self._channel = grpc.aio.insecure_channel(url)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._inputs: set[str] | None = None
        self._batched = True

    async def close(self) -> None:
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
            self._batched = response.config.max_batch_size > 0
        return self._inputs

    async def _request(self, req: GenerationRequest) -> service_pb2.ModelInferRequest:
        if isinstance(req.prompt, tuple) and self.model not in (None, self.token_model):
            return self._token_request(req)
        names = await self.model_inputs()
        if speaks_llmapi(names):  # the llmapi target's model: text and token ids alike
            if req.logprobs is not None or req.prompt_logprobs is not None:
                raise GenerationError("logprobs are not served by this frontend on the llmapi target; leave "
                                      "logprobs, top_logprobs and echo out.", status=400)
            sampling = {field: getattr(req, field) for field in ("temperature", "top_p", "top_k", "seed",
                                                                 "min_tokens", "end_id", *REFUSED_WHEN_MISSING)}
            if "priority" in names:  # llmapi repositories built before the input existed do not declare it
                sampling["priority"] = req.priority
            llmapi = llmapi_values(req.prompt, req.max_tokens, **sampling) + _guide_values(req)
            if req.disaggregated_params is not None:
                if "disaggregated_params" not in names:
                    raise GenerationError(f"the model {self.model!r} at {self.url} takes no disaggregated_params "
                                          "(built before disaggregated serving); rebuild the llmapi artifact.")
                wire = json.dumps(req.disaggregated_params).encode()
                llmapi.append(("disaggregated_params", "BYTES", np.array([wire], dtype=np.object_)))
            return _infer_request(await self.resolve_model(), req.request_id, llmapi, self._batched)
        if isinstance(req.prompt, tuple):
            return self._token_request(req)
        if self.model == self.token_model:
            raise GenerationError(f"the server at {self.url} has none of {', '.join(TEXT_MODELS)} ready.", status=404)
        values: list[tuple[str, str, np.ndarray]] = [
            ("text_input", "BYTES", np.array([req.prompt.encode()], dtype=np.object_)),
            ("max_tokens", "INT32", np.array([req.max_tokens], dtype=np.int32)),
            ("stream", "BOOL", np.array([True])),
        ]
        for name, _, datatype, dtype, field in SAMPLING_INPUTS:
            value = getattr(req, field)
            if value is not None and name in names:
                values.append((name, datatype, np.array([value], dtype=dtype)))
            elif value is not None and field in REFUSED_WHEN_MISSING:
                raise GenerationError(f"{field} is not served by the model {self.model!r} (it has no {name} "
                                      "input); leave it out.", status=400)
        for flag in ("exclude_input_in_output", "return_num_input_tokens", "return_num_output_tokens"):
            if flag in names:
                values.append((flag, "BOOL", np.array([True])))
        return _infer_request(await self.resolve_model(), req.request_id, values, self._batched)

    def _token_request(self, req: GenerationRequest) -> service_pb2.ModelInferRequest:
        ids = np.asarray(req.prompt, dtype=np.int32)
        values: list[tuple[str, str, np.ndarray]] = [
            ("input_ids", "INT32", ids), ("input_lengths", "INT32", np.array([ids.size], np.int32)),
            ("request_output_len", "INT32", np.array([req.max_tokens], np.int32)),
        ]
        for _, name, datatype, dtype, field in SAMPLING_INPUTS:
            value = getattr(req, field)
            if value is not None:
                values.append((name, datatype, np.array([value], dtype=dtype)))
        values += [(flag, "BOOL", np.array([True])) for flag in ("streaming", "exclude_input_in_output")]
        values += _guide_values(req)
        if req.logprobs is not None or req.prompt_logprobs is not None:
            top = max(req.logprobs or 0, req.prompt_logprobs or 0)
            values.append(("num_top_log_probs", "INT32", np.array([top], np.int32)))
            values += [(flag, "BOOL", np.array([True])) for flag, asked in
                       (("return_log_probs", req.logprobs), ("return_prompt_log_probs", req.prompt_logprobs))
                       if asked is not None]
        return _infer_request(self.token_model, req.request_id, values, batched=True)

    async def stream(self, req: GenerationRequest) -> AsyncGenerator[Chunk, None]:
        """Yield each response (text, or token ids for a token-id prompt) until the final one; leaving early
        cancels the request.

        Arguments:
            req: the request.
        """
        request = await self._request(req)
        finished = asyncio.Event()

        async def requests() -> AsyncIterator[service_pb2.ModelInferRequest]:
            yield request
            await finished.wait()  # keep the stream open until the last response arrived

        call = self._stub.ModelStreamInfer(requests(), metadata=self.metadata)
        try:
            async for response in call:
                if response.error_message:
                    raise _generation_error(request.model_name, response.error_message)
                result = InferResult(response.infer_response)
                text, ids = result.as_numpy("text_output"), result.as_numpy("output_ids")
                if ids is not None and (isinstance(req.prompt, tuple) or text is None):  # llmapi sends text too
                    token_ids = tuple(int(t) for t in ids.reshape(-1))
                    prompt = req.prompt if req.prompt_logprobs is not None else ()
                    yield Chunk("", token_ids=token_ids, scored=_scored(result, "", token_ids),
                                prompt_scored=_scored(result, "prompt_", prompt),
                                disaggregated_params=_disaggregated(result))
                elif text is not None:
                    yield Chunk(b"".join(np.asarray(text).reshape(-1)).decode(errors="replace"),
                                _scalar(result, "num_input_tokens"), _scalar(result, "num_output_tokens"))
                if response.infer_response.parameters["triton_final_response"].bool_param:
                    break
        except grpc.aio.AioRpcError as exc:
            raise GenerationError(f"the server at {self.url} failed the request: {exc.code().name}: "
                                  f"{exc.details()}", status=503) from None
        finally:
            finished.set()
            call.cancel()


def _generation_error(model: str, message: str) -> GenerationError:
    message = message.split("\n\nAt:")[0].strip()  # the Python backend appends the failing model's traceback
    unknown = "unknown model" in message
    if unknown and model.endswith(TOKEN_MODEL):
        return GenerationError(f"token-id prompts go to the {TOKEN_MODEL!r} model, which the server does not have; "
                               "send the prompt as text.", status=404)
    return GenerationError(f"{model}: {message}", status=404 if unknown else 400 if "INVALID_ARG" in message else 500)


def _infer_request(model: str, request_id: str, values: list[tuple[str, str, np.ndarray]],
                   batched: bool) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id or uuid.uuid4().hex)
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    for name, datatype, array in values:
        shape = [1, *array.shape] if batched else list(array.shape)
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        raw = serialize_byte_tensor(array).item() if datatype == "BYTES" else array.tobytes()
        request.raw_input_contents.append(raw)
    return request


def _guide_values(req: GenerationRequest) -> list[tuple[str, str, np.ndarray]]:
    if req.guide is None:
        return []
    return [(name, "BYTES", np.array([value.encode()], dtype=np.object_)) for name, value in
            zip(("guided_decoding_guide_type", "guided_decoding_guide"), req.guide, strict=True)]


def _scored(result: InferResult, prefix: str, token_ids: tuple[int, ...] | str) -> tuple[Scored, ...]:
    """The logprobs of ``token_ids`` from the ``output_*`` (``prefix`` "") or ``prompt_*`` outputs; the first
    prompt token has none."""
    logprobs = result.as_numpy(f"{prefix or 'output_'}log_probs")
    if logprobs is None or isinstance(token_ids, str) or not token_ids:
        return ()
    logprobs = logprobs.reshape(-1)[-len(token_ids):]
    top_ids, top_logprobs = result.as_numpy(f"{prefix}top_log_prob_ids"), result.as_numpy(f"{prefix}top_log_probs")
    width = 0 if top_ids is None else top_ids.shape[-1]
    top_ids = np.zeros((len(token_ids), 0)) if top_ids is None else top_ids.reshape(-1, width)[-len(token_ids):]
    top_logprobs = np.zeros_like(top_ids) if top_logprobs is None else top_logprobs.reshape(-1, width)[
        -len(token_ids):]
    scored: list[Scored] = []
    for i, token in enumerate(token_ids):
        if prefix and i == 0:
            scored.append((token, None, ()))
            continue
        alternatives = tuple((int(a), float(b)) for a, b in zip(top_ids[i], top_logprobs[i], strict=True))
        scored.append((token, float(logprobs[i]), alternatives))
    return tuple(scored)


def _disaggregated(result: InferResult) -> dict | None:
    value = result.as_numpy("disaggregated_params")
    return json.loads(value.reshape(-1)[0]) if value is not None and value.size else None


def _scalar(result: InferResult, name: str) -> int | None:
    value = result.as_numpy(name)
    return int(value.reshape(-1)[0]) if value is not None and value.size else None


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
