"""Text generation against a running server: one gRPC stream per request to ``ensemble`` or ``tensorrt_llm_bls``."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable

import grpc
import numpy as np
from tritonclient.grpc import InferResult, model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import serialize_byte_tensor

from trtllm_kit.serve.compat import TEXT_MODELS
from trtllm_kit.serve.generation import Chunk, GenerationError, GenerationRequest
from trtllm_kit.serve.llmapi_request import INCLUDE_STOP_INPUT, STOP_INPUT, llmapi_values, speaks_llmapi
from trtllm_kit.serve.lora_wire import LORA_INPUTS, weights_as
from trtllm_kit.serve.scored import Scored, logits_scored, tensor_scored

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
        self._types: dict[str, str] = {}  # input name → Triton data type
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
            self._types = {t.name: model_config_pb2.DataType.Name(t.data_type)[len("TYPE_"):]
                           for t in response.config.input}
            self._batched = response.config.max_batch_size > 0
        return self._inputs

    async def _request(self, req: GenerationRequest) -> service_pb2.ModelInferRequest:
        if isinstance(req.prompt, tuple) and self.model not in (None, self.token_model):
            return self._token_request(req, await self._lora_values(req))
        names = await self.model_inputs()
        if speaks_llmapi(names):  # the llmapi target's model: text and token ids alike
            sampling = {field: getattr(req, field) for field in (
                "temperature", "top_p", "top_k", "seed", "min_tokens", "end_id", "n", "best_of", "logprobs",
                "prompt_logprobs", *REFUSED_WHEN_MISSING)}
            if "priority" in names:  # llmapi repositories built before the input existed do not declare it
                sampling["priority"] = req.priority
            if "keep_end_token" in names:  # the same
                sampling["keep_end_token"] = True if req.keep_end_token else None
            # the LLM API picks the best of best_of only once all are done: such a request is answered whole
            streaming = req.num_sequences == (req.n or 1)
            llmapi = llmapi_values(req.prompt, req.max_tokens, streaming=streaming, **sampling) + _guide_values(req)
            if req.stop_strings and {STOP_INPUT, INCLUDE_STOP_INPUT} <= names:  # the engine stops on them; the
                # frontend still cuts the text, so the engine keeps each stop string in what it returns
                llmapi += [(STOP_INPUT, "BYTES", np.array([s.encode() for s in req.stop_strings], dtype=np.object_)),
                           (INCLUDE_STOP_INPUT, "BOOL", np.array([True]))]
            if req.lora is not None:
                self._check_lora(names, ("lora_name",))
                llmapi.append(("lora_name", "BYTES", np.array([req.lora.name.encode()], dtype=np.object_)))
            if req.disaggregated_params is not None:
                if "disaggregated_params" not in names:
                    raise GenerationError(f"the model {self.model!r} at {self.url} takes no disaggregated_params "
                                          "(built before disaggregated serving); rebuild the llmapi artifact.")
                wire = json.dumps(req.disaggregated_params).encode()
                llmapi.append(("disaggregated_params", "BYTES", np.array([wire], dtype=np.object_)))
            return _infer_request(await self.resolve_model(), req.request_id, llmapi, self._batched)
        if isinstance(req.prompt, tuple):
            return self._token_request(req, await self._lora_values(req))
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
        values += await self._lora_values(req)
        return _infer_request(await self.resolve_model(), req.request_id, values, self._batched)

    async def _lora_values(self, req: GenerationRequest) -> list[tuple[str, str, np.ndarray]]:
        """The LoRA inputs of a request to ``tensorrt_llm`` (or the ensemble or BLS, which pass them on): the task id,
        and the rows in the model's ``lora_weights`` type when the request carries them."""
        if req.lora is None:
            return []
        names = await self.model_inputs()
        self._check_lora(names, LORA_INPUTS)
        values = [("lora_task_id", "UINT64", np.array([req.lora.task_id], np.uint64))]
        if req.lora.rows is not None:
            weights, config = await req.lora.rows()
            datatype = self._types["lora_weights"]
            values += [("lora_weights", datatype, weights_as(weights, datatype)),
                       ("lora_config", "INT32", config.astype(np.int32))]
        return values

    def _check_lora(self, names: set[str], needed: tuple[str, ...]) -> None:
        if not set(needed) <= names:
            raise GenerationError(f"the model {self.model!r} takes no LoRA adapters (it has no {needed[0]} input); "
                                  "serve an artifact built for adapters, or name the base model.", status=400)

    def _token_request(self, req: GenerationRequest,
                       lora: list[tuple[str, str, np.ndarray]] | None = None) -> service_pb2.ModelInferRequest:
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
        values += _guide_values(req) + (lora or [])
        if req.n is not None:  # one request for every sequence: the prompt is computed once
            values.append(("num_return_sequences", "INT32", np.array([req.num_sequences], np.int32)))
        if req.stop_words:
            values.append(("stop_words_list", "INT32", word_list(req.stop_words)))
        if req.keep_end_token:
            values.append(("keep_end_token", "BOOL", np.array([True])))
        ranked = req.num_sequences > (req.n or 1)  # best_of: ranked by cumulative logprob
        if req.logprobs is not None or req.prompt_logprobs is not None or ranked:
            top = max(req.logprobs or 0, req.prompt_logprobs or 0)
            values.append(("num_top_log_probs", "INT32", np.array([top], np.int32)))
            prompt_flag = "return_context_logits" if req.context_logits else "return_prompt_log_probs"
            values += [(flag, "BOOL", np.array([True])) for flag, asked in
                       (("return_log_probs", req.logprobs is not None or ranked),
                        (prompt_flag, req.prompt_logprobs is not None)) if asked]
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
                    cum_logprob = result.as_numpy("cum_log_probs")
                    yield Chunk("", token_ids=token_ids, scored=tensor_scored(result, "", token_ids),
                                prompt_scored=_prompt_scored(result, req),
                                disaggregated_params=_disaggregated(result),
                                sequence_index=_scalar(result, "sequence_index") or 0,
                                cum_logprob=None if cum_logprob is None else float(cum_logprob.reshape(-1)[0]))
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


def _prompt_scored(result: InferResult, req: GenerationRequest) -> tuple[Scored, ...]:
    """The prompt's logprobs in this response, when asked for: from the prompt outputs, or from the context logits."""
    if req.prompt_logprobs is None or isinstance(req.prompt, str):
        return ()
    logits = result.as_numpy("context_logits") if req.context_logits else None
    if logits is not None and logits.size:
        return logits_scored(logits, req.prompt, req.prompt_logprobs)
    return tensor_scored(result, "prompt_", req.prompt)


def word_list(words: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """Token-id words as TensorRT-LLM's ``[2, N]`` word list: the ids concatenated, then the cumulative end
    offsets padded with -1.

    Arguments:
        words: each word's token ids (empty ones are left out).
    """
    kept = [word for word in words if word]
    ids = [t for word in kept for t in word]
    ends = np.cumsum([len(word) for word in kept]).tolist()
    return np.array([ids, ends + [-1] * (len(ids) - len(ends))], np.int32)


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
