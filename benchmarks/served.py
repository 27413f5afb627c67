"""A build of a model for the cpu target, served on free loopback ports for as long as a benchmark needs it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trtllm_kit.serve.server.launcher import free_endpoints, free_port  # noqa: E402
from trtllm_kit.serve.server.state import read_state  # noqa: E402

KIT = [sys.executable, "-m", "trtllm_kit"]


@contextmanager
def served_build(model: str, out: Path, *build_flags: str) -> Iterator[str]:
    """``model`` built for the cpu target into ``out`` (one instance, no verify, with ``build_flags``) and served
    with the OpenAI API; its base URL (``http://host:port/v1``). The server is stopped on the way out."""
    subprocess.run([*KIT, "build", model, "--target", "cpu", "--no-verify", "--instances", "1", *build_flags,
                    "--out", str(out)], check=True, capture_output=True)
    ep = free_endpoints()
    subprocess.run([*KIT, "serve", str(out), "--http-port", str(ep.http_port), "--grpc-port", str(ep.grpc_port),
                    "--metrics-port", str(ep.metrics_port), "--openai-port", str(free_port()), "--detach"],
                   check=True, capture_output=True)
    try:
        state = read_state(out)
        assert state is not None, f"serve of {out} left no state"
        yield f"http://{state['openai']}/v1"
    finally:
        subprocess.run([*KIT, "stop", str(out)], capture_output=True, timeout=120)
