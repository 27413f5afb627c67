"""The kit's client of Dynamo's frontend on its connection: the ACKs of a streamed answer are not delayed, and a
whole answer with no stop strings is asked for whole and read once."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp import web

from trtllm_kit.serve.dynamo.frontend_client import (
    COMPLETIONS,
    DynamoFrontendClient,
    ack_at_once,
    completion_body,
    is_whole,
)
from trtllm_kit.wire import GenerationRequest, GenerationResponse

LINUX_ACKS = pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="TCP_QUICKACK is Linux's")


@pytest.fixture
def connected() -> Iterator[socket.socket]:
    """The client's end of a loopback TCP connection, its ACKs delayed (as a kept-alive connection's are)."""
    with socket.create_server(("127.0.0.1", 0)) as listener, socket.create_connection(listener.getsockname()) as client:
        server, _ = listener.accept()
        with server:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)
            yield client


def _answer(sock: socket.socket | None, *, has_connection: bool = True) -> Any:
    transport = SimpleNamespace(get_extra_info=lambda name: sock if name == "socket" else None)
    return SimpleNamespace(connection=SimpleNamespace(transport=transport) if has_connection else None)


@LINUX_ACKS
def test_a_streamed_answer_is_acknowledged_at_once(connected: socket.socket) -> None:
    assert connected.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK) == 0
    ack_at_once(cast(Any, _answer(connected)))
    assert connected.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK) == 1


def test_an_answer_without_a_tcp_connection_is_left_alone() -> None:
    ack_at_once(cast(Any, _answer(None, has_connection=False)))  # read whole: its connection is given back
    left, right = socket.socketpair()
    with left, right:
        ack_at_once(cast(Any, _answer(left)))  # not TCP: no error
        assert left.family == socket.AF_UNIX


@pytest.mark.parametrize("fields, streamed", [
    ({"streaming": False}, False),
    ({"streaming": False, "stop_strings": ("\n",)}, True),  # the kit's frontend cuts stop strings from the stream
    ({"streaming": True}, True), ({}, True)])
def test_a_whole_answer_is_asked_for_whole(fields: dict[str, Any], streamed: bool) -> None:
    req = GenerationRequest((1, 2, 3), 4, **fields)
    body = completion_body("tiny", req)
    assert (is_whole(req), body["stream"], "stream_options" in body) == (not streamed, streamed, streamed)


def test_a_whole_answer_is_read_once() -> None:
    asked: list[dict[str, Any]] = []
    channels: list[object] = []

    async def completions(request: web.Request) -> web.Response:  # Dynamo's frontend, answering whole
        asked.append(await request.json())
        return web.json_response({"choices": [{"text": "Paris", "index": 0, "finish_reason": "length"}],
                                  "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})

    async def run() -> list[GenerationResponse]:
        app = web.Application()
        app.router.add_post(COMPLETIONS, completions)
        runner = web.AppRunner(app)
        await runner.setup()
        listening = socket.create_server(("127.0.0.1", 0))
        await web.SockSite(runner, listening).start()
        port = listening.getsockname()[1]
        client = DynamoFrontendClient(f"http://127.0.0.1:{port}", "tiny")
        try:
            return [r async for r in client.stream(GenerationRequest((1, 2, 3), 2, streaming=False))]
        finally:
            channels.append(client._channel)  # the Triton gRPC channel of the base class: never opened here
            await client.close()
            await runner.cleanup()

    responses = asyncio.run(run())
    assert [(r.texts, r.num_input_tokens, r.num_output_tokens) for r in responses] == [(("Paris",), 3, 2)]
    assert [body["stream"] for body in asked] == [False]
    assert channels == [None]
