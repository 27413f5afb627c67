"""Streaming clients on one asyncio event loop: what the load generator needs of one (``StreamClient``), and
Triton gRPC (``ModelStreamInfer``); the OpenAI HTTP/SSE client is ``openai_client.py``.

Each ``run(prompt, record)`` fills a ``RequestRecord``: ``t_send`` right before the call is handed to the
transport, one ``[t, n_tokens]`` per streamed response, ``t_end`` at the final response, the server's token
count and perf timestamps. Errors never raise; they are recorded by category.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import serialize_byte_tensor

from trtllm_kit.errors import KitError
from trtllm_kit.profile.records import RequestRecord
from trtllm_kit.profile.workload import Prompt
from trtllm_kit.wire import GenerationRequest
from trtllm_kit.wire.llmapi import encode_llmapi_request, speaks_llmapi
from trtllm_kit.wire.request import FORCED_LENGTH, NEVER_END_ID
from trtllm_kit.wire.scalars import field_row
from trtllm_kit.wire.tensor import grpc_datatype

PERF_OUTPUTS = {"arrival_time_ns": "arrival_ns", "first_scheduled_time_ns": "first_scheduled_ns",
                "first_token_time_ns": "first_token_ns", "last_token_time_ns": "last_token_ns",
                "kv_cache_reused_blocks": "kv_reused_blocks", "kv_cache_alloc_new_blocks": "kv_new_blocks"}
NUMPY_TYPES = {"INT32": np.int32, "INT64": np.int64}


def _trtllm(field: str) -> str:
    name = field_row(field).tensor("trtllm")
    assert name is not None, f"{field} has no tensorrt_llm input"
    return name


# the tensorrt_llm inputs of a benchmark request, named by the wire and written here as raw bytes (the load
# generator's hot loop): the forced length sets each of LENGTHS to the output length (``with_length``)
LENGTHS = tuple(_trtllm(name) for name in FORCED_LENGTH)
END_ID = _trtllm("end_id")
FLAGS = tuple(_trtllm(name) for name in (
    "streaming", "exclude_input_in_output", "return_num_output_tokens", "return_perf_metrics"))


class StreamClient(Protocol):
    """What the load generator needs from a client."""

    async def run(self, prompt: Prompt, record: RequestRecord) -> None: ...

    async def close(self) -> None: ...


def _tensor(name: str, datatype: str, shape: list[int], contents: bytes) -> tuple[Any, bytes]:
    return service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape), contents


class _Stream:
    """One bidirectional ``ModelStreamInfer`` call shared by many requests; responses are routed by request id."""

    def __init__(self, stub: Any) -> None:
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.waiters: dict[str, asyncio.Queue] = {}
        self.failure: grpc.aio.AioRpcError | None = None
        self.call = stub.ModelStreamInfer(self._requests())
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _requests(self):
        while (request := await self.outbox.get()) is not None:
            yield request

    async def _read(self) -> None:
        try:
            async for response in self.call:
                waiter = self.waiters.get(response.infer_response.id)
                if waiter is not None:
                    waiter.put_nowait((time.monotonic_ns(), response))
        except grpc.aio.AioRpcError as exc:
            self.failure = exc
        except asyncio.CancelledError:
            return
        for waiter in self.waiters.values():  # the stream ended: wake every request still waiting
            waiter.put_nowait((time.monotonic_ns(), None))

    async def close(self) -> None:
        self.outbox.put_nowait(None)
        self.call.cancel()
        self.reader.cancel()


class TritonStreamClient:
    """Calls a ``tensorrt_llm``-interface model over gRPC streaming, multiplexing requests over a few
    long-lived bidirectional streams (``num_streams``) as Triton's own clients do."""

    def __init__(self, url: str, model: str = "tensorrt_llm", timeout_s: float = 600.0,
                 end_id: int = NEVER_END_ID, num_streams: int = 4) -> None:
        self.target = target = url.removeprefix("grpc://")
        self.model, self.timeout_s, self.end_id, self.num_streams = model, timeout_s, end_id, num_streams
        self.channel = grpc.aio.insecure_channel(target, options=[("grpc.max_receive_message_length", 1 << 30),
                                                                  ("grpc.max_send_message_length", 1 << 30)])
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.streams: list[_Stream] = []
        self.sent = 0
        self.llmapi = False  # the llmapi target's model (read by check_ready): its tensors, unbatched

    def request(self, prompt: Prompt, request_id: str | None = None) -> service_pb2.ModelInferRequest:
        """The streaming request: forced OSL (``GenerationRequest.with_length``), counts and perf metrics on."""
        one = np.array([[1]], np.int32).tobytes()
        scalar = {"input_lengths": prompt.isl, **{name: prompt.osl for name in LENGTHS}, END_ID: self.end_id}
        req = service_pb2.ModelInferRequest(model_name=self.model, id=request_id or prompt.request_id)
        req.parameters["triton_enable_empty_final_response"].bool_param = True
        if self.llmapi:  # the llmapi target's model: its tensors, encoded by the wire
            gen = GenerationRequest(tuple(prompt.input_ids), end_id=self.end_id, streaming=True,
                                    return_finish_reason=True).with_length(prompt.osl)
            for name, array in encode_llmapi_request(gen).items():
                datatype = grpc_datatype(array)
                req.inputs.append(service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype=datatype,
                                                                                 shape=list(array.shape)))
                req.raw_input_contents.append(serialize_byte_tensor(array).item() if datatype == "BYTES"
                                              else array.tobytes())
            return req
        tensors = [_tensor("input_ids", "INT32", [1, prompt.isl], np.asarray(prompt.input_ids, np.int32).tobytes())]
        tensors += [_tensor(k, "INT32", [1, 1], np.array([[v]], np.int32).tobytes()) for k, v in scalar.items()]
        tensors += [_tensor(k, "BOOL", [1, 1], one[:1]) for k in FLAGS]
        for tensor, contents in tensors:
            req.inputs.append(tensor)
            req.raw_input_contents.append(contents)
        return req

    async def check_ready(self) -> None:
        """Raise a KitError naming what to do when the server or the model is not ready."""
        try:
            ready = await self.stub.ModelReady(service_pb2.ModelReadyRequest(name=self.model), timeout=10)
        except grpc.aio.AioRpcError as exc:
            raise KitError(f"cannot reach Triton at {self.target} ({exc.code().name}); start a server with "
                           "`trtllm-kit serve OUT` or pass --url grpc://HOST:PORT.") from None
        if not ready.ready:
            index = await self.stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True), timeout=10)
            names = ", ".join(sorted(m.name for m in index.models)) or "none"
            raise KitError(f"model {self.model!r} is not ready at {self.target} (ready: {names}); "
                           "pass --model NAME.")
        config = await self.stub.ModelConfig(service_pb2.ModelConfigRequest(name=self.model), timeout=10)
        self.llmapi = speaks_llmapi({tensor.name for tensor in config.config.input})

    def _stream(self) -> _Stream:
        self.streams = [s for s in self.streams if s.failure is None and not s.reader.done()]
        if len(self.streams) < self.num_streams:
            self.streams.append(_Stream(self.stub))
            return self.streams[-1]
        return self.streams[self.sent % len(self.streams)]

    async def run(self, prompt: Prompt, record: RequestRecord) -> None:
        """Send ``prompt`` and record every streamed response until the final one.

        Arguments:
            prompt: the request.
            record: filled in place.
        """
        self.sent += 1
        request_id = f"{prompt.request_id}#{self.sent}"  # unique on the stream even if a prompt repeats
        stream = self._stream()
        inbox: asyncio.Queue = asyncio.Queue()
        stream.waiters[request_id] = inbox
        request = self.request(prompt, request_id)
        record.t_send_ns = time.monotonic_ns()
        stream.outbox.put_nowait(request)
        try:
            await asyncio.wait_for(self._receive(stream, inbox, record), self.timeout_s)
        except asyncio.TimeoutError:
            record.fail("timeout", f"no final response within {self.timeout_s:g} s")
        finally:
            record.t_end_ns = time.monotonic_ns()
            stream.waiters.pop(request_id, None)

    async def _receive(self, stream: _Stream, inbox: asyncio.Queue, record: RequestRecord) -> None:
        while True:
            now, response = await inbox.get()
            if response is None:
                exc = stream.failure
                record.fail("transport", f"{exc.code().name}: {exc.details()}" if exc else "the stream ended")
                return
            if response.error_message:
                record.fail("server", response.error_message)
                return
            if self._read(response.infer_response, record, now):
                return

    def _read(self, response: Any, record: RequestRecord, now: int) -> bool:
        outputs = {o.name: (o, raw) for o, raw in zip(response.outputs, response.raw_output_contents, strict=True)}
        final = response.parameters["triton_final_response"].bool_param
        if "output_ids" in outputs:
            record.add_chunk(now, int(outputs["output_ids"][0].shape[-1]))
        elif not final or response.outputs:
            record.add_chunk(now, 0)
        for name, (tensor, raw) in outputs.items():
            if tensor.datatype in NUMPY_TYPES and len(raw) >= 4 and (name in PERF_OUTPUTS or
                                                                      name == "num_output_tokens"):
                value = int(np.frombuffer(raw, NUMPY_TYPES[tensor.datatype])[0])
                if name == "num_output_tokens":  # the count so far: the final response's value is the total
                    record.osl_server = value
                else:
                    record.server[PERF_OUTPUTS[name]] = value
        return final

    async def close(self) -> None:
        for stream in self.streams:
            await stream.close()
        await self.channel.close()
