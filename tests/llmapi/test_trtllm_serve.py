"""``trtllm-kit serve OUT --server trtllm-serve``: the artifact's recorded command, run as written on the serve
settings' host and port. trtllm-serve needs a GPU, so a fake on PATH records its argv and answers /health; the
test asserts that argv exactly, the stop on SIGTERM, and the one-sentence refusal where it is not installed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trtllm_kit.cli import run

FAKE = '''#!{python}
import http.server, json, os, signal, sys
with open(os.environ["FAKE_ARGV"], "w") as f:
    json.dump(sys.argv[1:], f)
port = int(sys.argv[sys.argv.index("--port") + 1])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer((sys.argv[sys.argv.index("--host") + 1], port), Health)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
server.serve_forever()
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trtllm-serve") / "out"
    assert run(["build", "builtin:tiny-llama", "--target", "llmapi", "--no-verify", "--until", "engine",
                "--out", str(out)]) == 0
    return out


def serve_env(tmp_path: Path, with_fake: bool) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if with_fake:
        fake = bin_dir / "trtllm-serve"
        fake.write_text(FAKE.format(python=sys.executable))
        fake.chmod(0o755)
    path = [str(bin_dir)] + [p for p in os.environ["PATH"].split(os.pathsep)
                             if not (Path(p) / "trtllm-serve").exists()]
    return {**os.environ, "PATH": os.pathsep.join(path), "FAKE_ARGV": str(tmp_path / "argv.json")}


def test_runs_the_recorded_command_on_the_serve_port(out: Path, tmp_path: Path) -> None:
    port = free_port()
    env = serve_env(tmp_path, with_fake=True)
    serve = subprocess.Popen([sys.executable, "-m", "trtllm_kit", "serve", str(out), "--server", "trtllm-serve",
                              "--http-port", str(port), "--ready-timeout", "60"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = serve.stderr.readline()  # the ready line (blocks until ready or exit)
        assert line.startswith("ready in") and f"127.0.0.1:{port}/v1" in line, line + serve.stderr.read()
        argv = json.loads((tmp_path / "argv.json").read_text())
        root = out.absolute()
        assert argv == [str(root / "checkpoint"), "--host", "127.0.0.1", "--port", str(port), "--backend", "pytorch",
                        "--extra_llm_api_options", str(root / "trtllm-serve" / "extra_llm_api_options.yaml")]
        assert (root / "trtllm-serve" / "extra_llm_api_options.yaml").is_file()
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=30) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
    deadline = time.monotonic() + 60  # the fake's port is free again: the server was stopped (a hang guard)
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return
        time.sleep(0.1)
    raise AssertionError("trtllm-serve still listens after serve stopped")


def test_without_trtllm_serve_one_sentence_names_what_to_install(out: Path, tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "trtllm_kit", "serve", str(out), "--server", "trtllm-serve",
                             "--http-port", str(free_port())], env=serve_env(tmp_path, with_fake=False),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "trtllm-serve is not on PATH" in result.stderr and "pip install tensorrt_llm" in result.stderr
