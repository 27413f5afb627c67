"""A served build for tests: the build made once per session from what it is built of, ``trtllm-kit serve`` of it
on free loopback ports with the OpenAI frontend, its ``url``, an ``openai`` ``client``, raw ``post`` and ``stop``; and
``open_stream``, a raw request a test can leave mid-stream.

``Builds`` and ``Servers`` (``tests/conftest.py`` gives one of each per session) let modules that serve the same
build share one running server. A test that changes its server (kills it, loads adapters, reloads, fills its disk,
edits its keys) starts a ``KitServer`` of its own, on its own copy of the build (``Builds.copy``).
"""

from __future__ import annotations

import json
import shutil
import socket
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

import openai

from trtllm_kit.build.pipeline import run_build
from trtllm_kit.errors import KitError
from trtllm_kit.serve.server.launcher import free_endpoints, free_port
from trtllm_kit.serve.service import ServeOptions, serve_detached, stop_serving
from trtllm_kit.spec import ServeSettings, build_spec

TINY = "builtin:tiny-llama"
ONE_EACH = {"preprocessing_instances": 1, "postprocessing_instances": 1, "bls_instances": 1}
READY_TIMEOUT_S = 120.0  # a loaded 2-core machine starts the tiny model's stubs in well under this
STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class BuildKey:
    """What a build output is made of: the model, the build table and the repo table (verify is off unless the
    build table turns it on). Equal keys are one build per session."""

    model: str = TINY
    build: tuple[tuple[str, Any], ...] = ()
    repo: tuple[tuple[str, Any], ...] = tuple(sorted(ONE_EACH.items()))  # sorted, as ``of`` makes them

    @classmethod
    def of(cls, model: str = TINY, *, repo: dict[str, Any] | None = None, **build: Any) -> BuildKey:
        """A key from keyword options, e.g. ``BuildKey.of(target="llmapi", max_batch_size=4)``.

        Arguments:
            model: what to build; repo: the repo table (default: one pre/post-processing and BLS instance);
            build: the build table's values.
        """
        return cls(model, tuple(sorted(build.items())), tuple(sorted((ONE_EACH if repo is None else repo).items())))

    def spec_values(self, out: Path) -> dict[str, Any]:
        """The values ``build_spec`` takes for this key built into ``out``."""
        return {"model": self.model, "out": out, "build": {"verify": False, **dict(self.build)},
                "repo": dict(self.repo)}


# the tiny model per target; the llmapi repo has no text models, so the instance counts change nothing in it and
# its key is the BuildKey.of(target="llmapi") other modules write: one build and one shared serve of it
TINY_BUILDS = {"cpu": BuildKey.of(), "llmapi": BuildKey.of(target="llmapi")}


class Builds:
    """The session's build outputs under ``root``, each built once per key; served outputs are shared, so a test
    that changes one works on a ``copy``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._outs: dict[BuildKey, Path] = {}

    def get(self, key: BuildKey) -> Path:
        """The output of ``key``, built on first use."""
        if key not in self._outs:
            out = self.root / f"build{len(self._outs)}" / "out"
            run_build(build_spec({}, key.spec_values(out)))
            self._outs[key] = out
        return self._outs[key]

    def copy(self, key: BuildKey, dest: Path) -> Path:
        """A private copy of ``key``'s output at ``dest`` (times kept, so it still matches its manifest)."""
        shutil.copytree(self.get(key), dest)
        return dest


class KitServer:
    """``trtllm-kit serve OUT --detach`` on free loopback ports with the OpenAI frontend, as a context manager.

    Arguments:
        out: the build output; api_key: the key clients send (``TRTLLM_KIT_API_KEY`` of the serve);
        more, names, aliases: further OUTs, ``--name`` and ``--alias`` values; settings: further ``ServeSettings``.
    """

    def __init__(self, out: Path, *, api_key: str | None = None, more: tuple[Path, ...] = (),
                 names: tuple[str, ...] = (), aliases: tuple[str, ...] = (), **settings: Any) -> None:
        self.out = out
        self.api_key = api_key
        settings = {"ready_timeout_s": READY_TIMEOUT_S, **settings}
        self.options = ServeOptions(out=out, settings=ServeSettings(**settings), api_key=api_key, more=more,
                                    names=names, aliases=aliases)
        self._pick_ports()
        self.state: dict[str, Any] = {}

    def _pick_ports(self) -> None:
        """Free loopback ports for tritonserver's endpoints and the OpenAI frontend (``port``)."""
        self.port = free_port()
        self.options = replace(self.options, settings=replace(self.options.settings, **asdict(free_endpoints()),
                                                              openai_port=self.port))

    def start(self) -> KitServer:
        """Serve and wait until ready; the serve's state (endpoints, pids) is ``state``. A port seen free can be taken
        by another process (the other worker's server) before the server binds it: the serve then starts once more,
        on ports picked again."""
        try:
            self.state = serve_detached(self.options)
        except KitError as exc:
            if "already in use" not in str(exc).lower():
                raise
            self._pick_ports()
            self.state = serve_detached(self.options)
        return self

    def stop(self) -> dict[str, Any]:
        """End the serve (SIGTERM, SIGKILL after 30 s); what ``stop_serving`` reports."""
        return stop_serving(self.out, STOP_TIMEOUT_S)

    def __enter__(self) -> KitServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The OpenAI frontend's base URL, e.g. ``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def grpc(self) -> str:
        """Triton's gRPC endpoint, ``host:port`` (the ports it was given)."""
        return self.options.endpoints.url("grpc")

    @property
    def metrics(self) -> str:
        """Triton's metrics endpoint, ``host:port`` (the ports it was given)."""
        return self.options.endpoints.url("metrics")

    def client(self, **kwargs: Any) -> openai.OpenAI:
        """An ``openai`` client of the frontend (no retries), sending the server's key when it has one."""
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.api_key or "none", max_retries=0,
                             **{"timeout": 120.0, **kwargs})

    def post(self, path: str, body: bytes, headers: dict[str, str] | None = None,
             timeout_s: float = 120.0) -> tuple[int, dict[str, str], bytes]:
        """POST raw bytes to the frontend; the status, headers and body, errors included.

        Arguments:
            path: e.g. ``/v1/completions``; body: the request's bytes; headers: more headers (the key is sent when
            the server has one and ``headers`` names no ``Authorization``); timeout_s: the socket timeout.
        """
        sent = {"Content-Type": "application/json", **(headers or {})}
        if self.api_key and "Authorization" not in sent:
            sent["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(f"{self.url}{path}", data=body, headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()


def open_stream(state: dict[str, Any], body: dict[str, Any], num_events: int = 3, path: str = "/v1/completions",
                headers: dict[str, str] | None = None, timeout_s: float = 60.0) -> socket.socket:
    """POST ``body`` to a serve's OpenAI frontend over a raw socket and read until ``num_events`` server-sent events
    arrived (0: none); the socket, for the caller to read on or close (a client that leaves).

    Arguments:
        state: the serve's state (its ``openai`` endpoint); body: the request; num_events: events to wait for;
        path: e.g. ``/v1/chat/completions``; headers: more headers (a key); timeout_s: the socket timeout.
    """
    host, port = state["openai"].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    data = json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{head}Content-Length: "
                 f"{len(data)}\r\n\r\n".encode() + data)
    received = b""
    while received.count(b"data: ") < num_events:
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
    return sock


class Servers:
    """Servers shared by the session, one per build key and serve settings, stopped when the session ends."""

    def __init__(self, builds: Builds) -> None:
        self.builds = builds
        self._running: dict[tuple[BuildKey, tuple[tuple[str, Any], ...]], KitServer] = {}

    def get(self, key: BuildKey, **settings: Any) -> KitServer:
        """The running shared server of ``key`` with ``settings``, started on first use. Its tests leave it as
        they found it (no adapters, keys or reloads)."""
        shared = (key, tuple(sorted(settings.items())))
        if shared not in self._running:
            is_served = any(running == key for running, _ in self._running)  # one OUT is served once at a time
            out = (self.builds.copy(key, self.builds.root / f"served{len(self._running)}" / "out") if is_served
                   else self.builds.get(key))
            self._running[shared] = KitServer(out, **settings).start()
        return self._running[shared]

    def stop_all(self) -> None:
        """Stop every shared server, all at once: each waits for its own processes to end."""
        with ThreadPoolExecutor(max(1, len(self._running))) as stopping:
            list(stopping.map(KitServer.stop, self._running.values()))
        self._running.clear()
