"""``bench cold-start``: one start of a served model on this machine, phase by phase.

1. artifact fetch: the build output as the ``.tar`` an init container fetches (``deploy k8s --artifact-url``),
   unpacked into an empty directory and flushed to disk (the tar is written beforehand, untimed);
2. weight read: every weight file (``*.safetensors``, ``*.engine``) of the unpacked copy read end to end, its pages
   first dropped from the page cache (``posix_fadvise DONTNEED``), so the bytes come from the disk;
3. runtime init: ``trtllm-kit serve`` of the copy until it reports ready (its own weight read is then served from
   the page cache: what remains is process start, the runtime and the model's set-up);
4. warm-up: the first completion (one token), which pays what the runtime does lazily;
5. first token: a streamed completion's time to its first chunk, once warm.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from trtllm_kit.artifact import Artifact
from trtllm_kit.artifact.archive import pack_archive
from trtllm_kit.errors import KitError

WEIGHT_SUFFIXES = (".safetensors", ".engine")
CHUNK = 16 << 20


@dataclass(frozen=True)
class ColdStart:
    """Seconds of each phase of one start, and the bytes behind the first two."""

    artifact_bytes: int
    weight_bytes: int
    fetch_s: float
    weight_read_s: float
    runtime_init_s: float
    warmup_s: float
    first_token_s: float

    @property
    def total_s(self) -> float:
        return self.fetch_s + self.weight_read_s + self.runtime_init_s + self.warmup_s + self.first_token_s

    def phases(self) -> dict[str, float]:
        """Phase name → seconds, in order."""
        return {"artifact fetch": self.fetch_s, "weight read": self.weight_read_s,
                "runtime init": self.runtime_init_s, "warm-up": self.warmup_s, "first token": self.first_token_s}

    def to_dict(self) -> dict[str, float | int]:
        return {**asdict(self), "total_s": round(self.total_s, 3)}

    def line(self) -> str:
        """One line of figures with units."""
        parts = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.phases().items())
        return (f"cold start {self.total_s:.2f} s: {parts} ({self.artifact_bytes / 1e6:.1f} MB fetched, "
                f"{self.weight_bytes / 1e6:.1f} MB of weights)")


def _unpack(archive: Path, into: Path) -> int:
    """Unpack ``archive`` into ``into`` and flush every file to disk; the bytes written."""
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    total = 0
    for path in into.rglob("*"):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())
            total += path.stat().st_size
    return total


def _read_cold(paths: list[Path]) -> int:
    """Read ``paths`` end to end after dropping their cached pages; the bytes read."""
    total = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            while chunk := os.read(fd, CHUNK):
                total += len(chunk)
        finally:
            os.close(fd)
    return total


def _completion(port: int, body: dict[str, object], *, stream: bool, timeout_s: float) -> float:
    """Seconds to the answer's first bytes of body (streamed: the first chunk; else the whole answer)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        started = time.perf_counter()
        connection.request("POST", "/v1/completions", json.dumps({**body, "stream": stream}),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise KitError(f"the served model answered {response.status}: {response.read()[:300]!r}")
        if stream:
            while line := response.readline():
                if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                    return time.perf_counter() - started
            raise KitError("the streamed completion ended without a chunk.")
        response.read()
        return time.perf_counter() - started
    finally:
        connection.close()


def measure_cold_start(out: Path, *, prompt: str = "The capital of France is", timeout_s: float = 600.0,
                       workdir: Path | None = None) -> ColdStart:
    """Start ``out`` once from its tar and time each phase.

    Arguments:
        out: a build output; prompt: the warm-up's and the timed request's prompt; timeout_s: the readiness
        bound; workdir: where the tar and the copy go (default: a temporary directory, removed after).
    """
    from trtllm_kit.serve.options import ServeOptions
    from trtllm_kit.serve.server.detach import serve_detached, stop_serving
    from trtllm_kit.serve.server.launcher import free_endpoints, free_port
    from trtllm_kit.spec import ServeSettings

    artifact = Artifact.read(out)
    work = workdir or Path(tempfile.mkdtemp(prefix="trtllm-kit-cold-start-"))
    try:
        archive = pack_archive(out, work / "artifact.tar")
        copy = work / "fetched"
        started = time.perf_counter()
        artifact_bytes = _unpack(archive, copy)
        fetch_s = time.perf_counter() - started
        weights = sorted(copy / name for name in artifact.files if name.endswith(WEIGHT_SUFFIXES))
        started = time.perf_counter()
        weight_bytes = _read_cold(weights)
        weight_read_s = time.perf_counter() - started
        endpoints, openai_port = free_endpoints(), free_port()
        settings = ServeSettings(host=endpoints.host, http_port=endpoints.http_port, grpc_port=endpoints.grpc_port,
                                 metrics_port=endpoints.metrics_port, openai_port=openai_port,
                                 ready_timeout_s=int(timeout_s))
        started = time.perf_counter()
        serve_detached(ServeOptions(out=copy, settings=settings))
        runtime_init_s = time.perf_counter() - started
        try:
            model = _model(openai_port)
            body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
            warmup_s = _completion(openai_port, body, stream=False, timeout_s=timeout_s)
            first_token_s = _completion(openai_port, {**body, "max_tokens": 4}, stream=True, timeout_s=timeout_s)
        finally:
            stop_serving(copy, 30)
    finally:
        if workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    return ColdStart(artifact_bytes, weight_bytes, round(fetch_s, 3), round(weight_read_s, 3),
                     round(runtime_init_s, 3), round(warmup_s, 3), round(first_token_s, 3))


def _model(port: int) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", "/v1/models")
        return str(json.loads(connection.getresponse().read())["data"][0]["id"])
    finally:
        connection.close()
