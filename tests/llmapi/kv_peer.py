"""A KV endpoint under a test's control: a Unix socket that counts who connects and answers each fetch with the
bytes it is given (a forged header, a cut transfer), and the states that point a generation server at it."""

from __future__ import annotations

import base64
import json
import socket
import threading
from pathlib import Path

from trtllm_kit.llmapi.kv_state import sign

HANDLE = "ab" * 16


class KvPeer:
    """Listens on ``path``; every connection is counted, its first line read, ``reply`` sent, then closed.

    Arguments:
        path: the socket (keep it short: 107 bytes at most); reply: what each fetch gets.
    """

    def __init__(self, path: Path, reply: bytes = b"") -> None:
        self.path, self.reply, self.num_connections = path, reply, 0
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self.num_connections += 1
            with conn:
                conn.settimeout(10)
                try:
                    conn.makefile("rb").readline(256)
                    conn.sendall(self.reply)
                except OSError:
                    pass

    def close(self) -> None:
        self._server.close()


def unsigned_state(endpoint: str) -> bytes:
    """An ``opaque_state`` as a client would forge it: an endpoint and a handle, no signature."""
    return json.dumps({"endpoint": endpoint, "handle": HANDLE}).encode()


def signed_state(key: str, endpoint: str) -> bytes:
    """An ``opaque_state`` signed with ``key`` (a peer that holds the roles' transfer key)."""
    return sign(key.encode(), endpoint, HANDLE)


def wire(opaque_state: bytes, first_token: int = 5) -> dict:
    """The ``disaggregated_params`` wire object of a generation-only request carrying ``opaque_state``."""
    return {"request_type": "generation_only", "first_gen_tokens": [first_token],
            "encoded_opaque_state": base64.b64encode(opaque_state).decode()}


def header(**changes: object) -> bytes:
    """A header line for a 3-token prompt of tiny-llama in float32 (3 layers, 2 KV heads of 64), changed."""
    fields: dict[str, object] = {"num_tokens": 3, "tokens_per_block": 32, "dtype": "float32",
                                 "shape": [3, 1, 32, 2, 64]}
    fields.update(changes)
    return json.dumps(fields).encode() + b"\n"
