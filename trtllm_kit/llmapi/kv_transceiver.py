"""The CPU ``LLM``'s cache transceiver: a context server hands a held request's KV blocks to a generation server
in another process over a Unix socket.

Context side: ``offer`` registers a finished context-only sequence (its blocks held by the engine) under a
random handle and returns the ``opaque_state`` naming the socket and the handle, signed with the transfer key
(``kv_state.py``); the socket (in a fresh 0700 directory, ``kv_dirs.py``) is opened on the first offer. A
fetch claims the handle, reads the blocks from the pool (they stay valid: nobody writes a held block), sends them
(``runtime/kv_transfer.py``'s wire form) and hands the sequence to ``release`` whether the send succeeded or the
receiver died mid-transfer. An offer nobody claims within ``timeout_s``
(``cache_transceiver_config.kv_transfer_timeout_ms``) is released by ``expired``.

Generation side: ``fetch(endpoint, handle, layout, num_tokens)``, for a state ``kv_state.verify`` accepted,
returns the blocks and the seconds the transfer took. The header is read up to ``MAX_HEADER_BYTES`` and checked
against the receiving pool before K and V are allocated; the whole transfer has ``FETCH_TIMEOUT_S``. Its errors
name no path: a caller learns nothing of the files on the server.
"""

from __future__ import annotations

import io
import json
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from trtllm_kit.errors import KitError
from trtllm_kit.llmapi.kv_dirs import SOCKET_NAME, make_socket_dir
from trtllm_kit.llmapi.kv_state import sign
from trtllm_kit.runtime.kv_transfer import MAX_HEADER_BYTES, KvBlocks, KvLayout, decode, decode_header
from trtllm_kit.runtime.sequence import Sequence

DEFAULT_TIMEOUT_S = 60.0  # when cache_transceiver_config sets no kv_transfer_timeout_ms
FETCH_TIMEOUT_S = 120.0  # a generation server's wait for one whole transfer
HANDLE_LINE_BYTES = 256  # a fetch's first line: {"handle": 32 hex digits}
CHUNK_BYTES = 1 << 20


class TransferError(RuntimeError):
    """A generation-only request's KV blocks could not be fetched."""


class KvTransceiver:
    """Holds offered sequences until fetched or expired and serves them over a Unix socket.

    Arguments:
        export: reads a held sequence's blocks (``Engine.export_kv``); release: frees them, from any thread
        (queued to the engine's thread); key: the transfer key that signs the states; tag: the socket directory's
        (``kv_dirs.dir_tag``); timeout_s: how long an offer waits for its fetch.
    """

    def __init__(self, export: Callable[[Sequence], KvBlocks], release: Callable[[Sequence], None], key: bytes,
                 tag: str = "", timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.export, self.release, self.key, self.tag, self.timeout_s = export, release, key, tag, timeout_s
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
        return sign(self.key, str(self._listen()), handle)

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
            self._dir = make_socket_dir(self.tag)  # mode 0700: this user only
            self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._server.bind(str(self._dir / SOCKET_NAME))
            self._server.listen(64)
            threading.Thread(target=self._accept, args=(self._server,), name="kv-transceiver", daemon=True).start()
        assert self._dir is not None
        return self._dir / SOCKET_NAME

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
                handle = json.loads(conn.makefile("rb").readline(HANDLE_LINE_BYTES) or b"{}").get("handle")
            except (OSError, ValueError, AttributeError, RecursionError):
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


def fetch(endpoint: str, handle: str, layout: KvLayout, num_tokens: int) -> tuple[KvBlocks, float]:
    """The KV blocks offered under ``handle`` at ``endpoint``, and the seconds the transfer took; ``TransferError``
    when the context server cannot hand them over or sends what this pool cannot hold.

    Arguments:
        endpoint, handle: from a verified ``opaque_state``; layout: the receiving pool's; num_tokens: the
        prompt's tokens.
    """
    started = time.perf_counter()
    deadline = time.monotonic() + FETCH_TIMEOUT_S
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(FETCH_TIMEOUT_S)
            conn.connect(endpoint)
            conn.sendall(json.dumps({"handle": handle}).encode() + b"\n")
            stream = conn.makefile("rb")
            line = stream.readline(MAX_HEADER_BYTES + 1)
            if not line.endswith(b"\n"):
                raise TransferError(f"the context server's first line was cut or longer than {MAX_HEADER_BYTES} "
                                    "bytes; serve the same kit version in both roles")
            reply = json.loads(line)
            if isinstance(reply, dict) and "error" in reply:
                raise TransferError(f"the context server refused the transfer: {str(reply['error'])[:200]}")
            header, num_bytes = decode_header(line.rstrip(b"\n"), layout, num_tokens)
            k_bytes, v_bytes = bytearray(num_bytes), bytearray(num_bytes)
            for buffer in (k_bytes, v_bytes):
                _read_into(conn, stream, buffer, deadline)
    except TransferError:
        raise
    except TimeoutError:
        raise TransferError(f"the context server did not hand the KV blocks over within {FETCH_TIMEOUT_S:g} s; "
                            "send the request again") from None
    except OSError as exc:
        raise TransferError(f"the context server that made this opaque_state could not be reached or left the "
                            f"transfer ({type(exc).__name__}); send the request again") from None
    except (ValueError, RecursionError, KitError) as exc:
        raise TransferError(f"the context server sent KV blocks this engine cannot take: {exc}") from None
    return decode(header, k_bytes, v_bytes), time.perf_counter() - started


def _read_into(conn: socket.socket, stream: io.BufferedIOBase, buffer: bytearray, deadline: float) -> None:
    """Fill ``buffer`` from ``stream`` before ``deadline`` (``TimeoutError`` past it, ``ConnectionError`` at an
    early end)."""
    view, filled = memoryview(buffer), 0
    while filled < len(buffer):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        conn.settimeout(remaining)
        count = stream.readinto(view[filled:filled + CHUNK_BYTES])
        if not count:
            raise ConnectionError(f"the transfer ended after {filled} of {len(buffer)} bytes")
        filled += count
