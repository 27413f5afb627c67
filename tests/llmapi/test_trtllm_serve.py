"""``trtllm-kit serve OUT --server trtllm-serve``: the artifact's recorded command, run as written on the serve
settings' host and port. trtllm-serve needs a GPU, so a fake on PATH records its argv and answers /health; the
test asserts that argv exactly, the stop on SIGTERM, and the one-sentence refusal where it is not installed."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from fake_trtllm_serve import TrtllmServePath

from trtllm_kit.serve.server.launcher import free_port


def test_runs_the_recorded_command_on_the_serve_port(engine_stage_out: Path,
                                                    fake_trtllm_serve: TrtllmServePath) -> None:
    out, port = engine_stage_out, free_port()
    serve = subprocess.Popen([sys.executable, "-m", "trtllm_kit", "serve", str(out), "--server", "trtllm-serve",
                              "--http-port", str(port), "--ready-timeout", "60"], env=fake_trtllm_serve.env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = serve.stderr.readline()  # the ready line (blocks until ready or exit)
        assert line.startswith("ready in") and f"127.0.0.1:{port}/v1" in line, line + serve.stderr.read()
        [call] = fake_trtllm_serve.calls()
        argv = call["argv"]
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


def test_without_trtllm_serve_one_sentence_names_what_to_install(engine_stage_out: Path,
                                                                  without_trtllm_serve: TrtllmServePath) -> None:
    result = subprocess.run([sys.executable, "-m", "trtllm_kit", "serve", str(engine_stage_out), "--server",
                             "trtllm-serve", "--http-port", str(free_port())], env=without_trtllm_serve.env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "trtllm-serve is not on PATH" in result.stderr and "pip install tensorrt_llm" in result.stderr
