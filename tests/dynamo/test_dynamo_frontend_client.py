"""The kit's client of Dynamo's frontend on its connection: the ACKs of a streamed answer are not delayed."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest

from trtllm_kit.serve.dynamo.frontend_client import ack_at_once

pytestmark = pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="TCP_QUICKACK is Linux's")


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
