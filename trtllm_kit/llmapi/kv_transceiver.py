"""The CPU ``LLM``'s cache transceiver: a context server hands a held request's KV blocks to a generation server
in another process over a Unix socket.

Context side: ``offer`` registers a finished context-only sequence (its blocks held by the engine) under a
random handle and returns the ``opaque_state`` naming the socket and the handle; the socket (in a fresh 0700
directory) is opened on the first offer. A fetch claims the handle, reads the blocks from the pool (they stay
valid: nobody writes a held block), sends them (``runtime/kv_transfer.py``'s wire form) and hands the sequence to
``release`` whether the send succeeded or the receiver died mid-transfer. An offer nobody claims within
``timeout_s`` (``cache_transceiver_config.kv_transfer_timeout_ms``) is released by ``expired``.

Generation side: ``fetch(opaque_state)`` returns the blocks and the seconds the transfer took.
"""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from trtllm_kit.errors import KitError
from trtllm_kit.runtime.kv_transfer import KvBlocks, decode, decode_header
from trtllm_kit.runtime.sequence import Sequence

DEFAULT_TIMEOUT_S = 60.0  # when cache_transceiver_config sets no kv_transfer_timeout_ms
FETCH_TIMEOUT_S = 120.0  # a generation server's wait for one transfer


class TransferError(RuntimeError):
    """A generation-only request's KV blocks could not be fetched."""


class KvTransceiver:
    """Holds offered sequences until fetched or expired and serves them over a Unix socket.

    Arguments:
        export: reads a held sequence's blocks (``Engine.export_kv``); release: frees them, from any thread
        (queued to the engine's thread); timeout_s: how long an offer waits for its fetch.
    """

    def __init__(self, export: Callable[[Sequence], KvBlocks], release: Callable[[Sequence], None],
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.export, self.release, self.timeout_s = export, release, timeout_s
        self._offers: dict[str, tuple[Sequence, float]] = {}  # handle → (sequence, deadline)
        self._lock = threading.Lock()
        self._dir: Path | None = None
        self._server: socket.socket | None = None

    def offer(self, seq: Sequence) -> bytes:
        """Register a held sequence; the ``opaque_state`` a generation server fetches it with.

        Arguments:
            seq: a context-only sequence whose blocks the engine holds.
        """
        handle = secrets.token_hex(16)
        with self._lock:
            self._offers[handle] = (seq, time.monotonic() + self.timeout_s)
        return json.dumps({"endpoint": str(self._listen()), "handle": handle}).encode()

    def expired(self) -> list[Sequence]:
        """Drop the offers past their deadline; their sequences, for the caller to release."""
        now = time.monotonic()
        with self._lock:
            gone = [handle for handle, (_, deadline) in self._offers.items() if deadline <= now]
            return [self._offers.pop(handle)[0] for handle in gone]

    def wait_s(self) -> float | None:
        """Seconds until the next offer expires (None: no offer waits)."""
        with self._lock:
            deadlines = [deadline for _, deadline in self._offers.values()]
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    @property
    def num_offers(self) -> int:
        return len(self._offers)

    def close(self) -> None:
        """Stop serving and remove the socket's directory; offers left are the engine's to free."""
        if self._server is not None:
            self._server.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _listen(self) -> Path:
        if self._server is None:
            self._dir = Path(tempfile.mkdtemp(prefix="trtllm-kit-kv-"))  # mode 0700: this user only
            self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._server.bind(str(self._dir / "kv.sock"))
            self._server.listen(64)
            threading.Thread(target=self._accept, args=(self._server,), name="kv-transceiver", daemon=True).start()
        assert self._dir is not None
        return self._dir / "kv.sock"

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._send, args=(conn,), daemon=True).start()

    def _send(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(FETCH_TIMEOUT_S)
            try:
                handle = json.loads(conn.makefile("rb").readline() or b"{}").get("handle")
            except (OSError, ValueError):
                return
            with self._lock:
                offer = self._offers.pop(str(handle), None)
            try:
                if offer is None:
                    reply = {"error": "no KV blocks are offered under this handle (fetched already or expired)"}
                    conn.sendall(json.dumps(reply).encode() + b"\n")
                else:
                    conn.sendall(self.export(offer[0]).encode())
            except OSError:
                pass  # the receiver left mid-transfer: the blocks are freed all the same
            finally:
                if offer is not None:
                    self.release(offer[0])


def fetch(opaque_state: bytes) -> tuple[KvBlocks, float]:
    """The KV blocks an ``opaque_state`` names, and the seconds the transfer took; ``TransferError`` when the
    context server cannot hand them over.

    Arguments:
        opaque_state: from the context-only request's ``DisaggregatedParams``.
    """
    started = time.perf_counter()
    try:
        state = json.loads(opaque_state)
        endpoint, handle = str(state["endpoint"]), str(state["handle"])
    except (ValueError, KeyError, TypeError):
        raise TransferError("opaque_state does not come from a CPU context server; send the context-only "
                            "response's disaggregated_params unchanged") from None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(FETCH_TIMEOUT_S)
            conn.connect(endpoint)
            conn.sendall(json.dumps({"handle": handle}).encode() + b"\n")
            stream = conn.makefile("rb")
            line = stream.readline()
            reply = json.loads(line) if line else {"error": "it closed the connection"}
            if "error" in reply:
                raise TransferError(f"the context server at {endpoint} refused the transfer: {reply['error']}")
            header, num_bytes = decode_header(line)
            k_bytes, v_bytes = stream.read(num_bytes), stream.read(num_bytes)
    except (OSError, ValueError, KitError) as exc:
        raise TransferError(f"the context server's KV blocks at {endpoint} could not be fetched: {exc}") from None
    if len(k_bytes) != num_bytes or len(v_bytes) != num_bytes:
        raise TransferError(f"the context server at {endpoint} closed the transfer after {len(k_bytes) + len(v_bytes)}"
                            f" of {2 * num_bytes} bytes")
    return decode(header, k_bytes, v_bytes), time.perf_counter() - started
