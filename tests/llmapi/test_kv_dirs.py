"""A CPU ``LLM`` killed with SIGKILL while it offers KV blocks cannot remove its socket directory; the next
transceiver that opens its socket removes it, and only directories nobody listens on.

Before the fix: every killed context process left its ``trtllm-kit-kv-*`` directory in the temporary directory for
good."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from trtllm_kit.llmapi.unified import write_unified
from trtllm_kit.models.inspect import inspect_model

# A context process: one context-only request, then it prints its socket's path and waits to be killed.
CONTEXT = """
import asyncio, json, sys
from trtllm_kit.llmapi.cpu_llm import LLM, DisaggregatedParams, SamplingParams
llm = LLM(model=sys.argv[1], max_seq_len=128, cache_transceiver_config={"kv_transfer_timeout_ms": 600000})
async def one():
    result = llm.generate_async([1, 415, 565], SamplingParams(max_tokens=4),
                                disaggregated_params=DisaggregatedParams(request_type="context_only"))
    return (await result.aresult()).outputs[0].disaggregated_params.opaque_state
print(json.loads(asyncio.run(one()))["endpoint"], flush=True)
sys.stdin.read()
"""


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kvt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def context_process(ckpt: Path, tmp: Path) -> tuple[subprocess.Popen[str], Path]:
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", CONTEXT, str(ckpt)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip()).parent


def test_the_next_transceiver_removes_the_directories_of_killed_ones(tmp_path: Path, short_dir: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    write_unified(inspect_model("builtin:tiny-llama"), ckpt, "float32")
    killed, killed_dir = context_process(ckpt, short_dir)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert killed_dir.parent == short_dir and (killed_dir / "kv.sock").exists()  # nothing could remove it
    live = short_dir / "trtllm-kit-kv-listening"  # a directory whose socket still has a listener
    live.mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(live / "kv.sock"))
    listener.listen(1)
    try:
        later, later_dir = context_process(ckpt, short_dir)
        try:
            assert sorted(short_dir.iterdir()) == sorted([live, later_dir])
        finally:
            later.kill()
            later.wait()
    finally:
        listener.close()
