"""An API key given on the command line is not left in the process's ``/proc/PID/cmdline`` for other users, and
a key file is read as a regular file only."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from reliability_helpers import KIT, kit

from trtllm_kit.argv_secrets import hidden_args
from trtllm_kit.commands.serve import read_key_file
from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.server.launcher import free_endpoints, free_port
from trtllm_kit.serve.server.state import read_state

pytestmark = pytest.mark.slow

SECRET = "sk-0123456789abcdef-secret"


@pytest.mark.parametrize(("args", "expected"), [
    ([b"serve", b"out", b"--api-key", b"sk-long-secret"], [b"serve", b"out", b"--api-key", b"<hidden>"]),
    ([b"serve", b"--api-key=sk-long-secret", b"out"], [b"serve", b"--api-key=<hidden>", b"out"]),
    ([b"serve", b"--api-keys", b"keys.json"], [b"serve", b"--api-keys", b"keys.json"]),
    ([b"bench", b"--", b"--api-key", b"x"], [b"bench", b"--", b"--api-key", b"x"]),
])
def test_hidden_args_replace_only_the_secret_values(args: list[bytes], expected: list[bytes]) -> None:
    assert hidden_args(args) == expected


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def _status(url: str, key: str | None) -> int:
    body = json.dumps({"model": "builtin:tiny-llama", "prompt": "Hi", "max_tokens": 2}).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=60) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.parametrize("form", [["--api-key", SECRET], [f"--api-key={SECRET}"], ["--api-key", "abc"]])
def test_a_foreground_serve_hides_its_api_key_from_its_command_line(artifact_copy: Path, form: list[str]) -> None:
    """The serve in the foreground (not --detach, which passes the key by environment) still demands the key,
    and other users reading its /proc/PID/cmdline see ``<hidden>`` (or stars for a key shorter than that)."""
    key = form[-1].split("=", 1)[-1]
    ep, openai_port = free_endpoints(), free_port()
    proc = subprocess.Popen([*KIT, "serve", str(artifact_copy), "--http-port", str(ep.http_port), "--grpc-port",
                             str(ep.grpc_port), "--metrics-port", str(ep.metrics_port), "--openai-port",
                             str(openai_port), *form], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={k: v for k, v in os.environ.items() if k != "TRTLLM_KIT_API_KEY"})
    try:
        deadline = time.monotonic() + 240
        while not ((read_state(artifact_copy) or {}).get("ready")):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the serve was not ready in 240 s"
            time.sleep(0.1)
        shown = _cmdline(proc.pid)
        assert key.encode() not in shown, shown
        assert b"<hidden>" in shown or b"***" in shown, shown
        assert b"--openai-port\0" + str(openai_port).encode() in shown  # the other arguments are intact
        url = f"http://127.0.0.1:{openai_port}/v1/completions"
        assert _status(url, None) == 401
        assert _status(url, key) == 200
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_a_key_file_is_read_and_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    good = tmp_path / "key"
    good.write_text(f"{SECRET}\n# comment\n")
    assert read_key_file(good) == SECRET
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(KitUsageError, match=r"^--api-key-file .*fifo is a FIFO, not a regular file"):
        read_key_file(fifo)  # opened without blocking: no writer is needed for the refusal
    large = tmp_path / "large"
    large.write_bytes(b"k" * 4097)
    with pytest.raises(KitUsageError, match="is 4097 bytes, above the bound of 4096 bytes for an API key file"):
        read_key_file(large)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(KitUsageError, match="has no key on its first line"):
        read_key_file(empty)
    with pytest.raises(KitUsageError, match="cannot be opened"):
        read_key_file(tmp_path / "missing")


def test_key_file_and_key_together_are_a_usage_error(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text(SECRET)
    done = kit("serve", str(tmp_path / "nothing"), "--api-key-file", str(key), "--api-key", "x")
    assert done.returncode == 2
    assert "--api-key-file and --api-key (or TRTLLM_KIT_API_KEY) both give the key; pass one." in done.stderr
