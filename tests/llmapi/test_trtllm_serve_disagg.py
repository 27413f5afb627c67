"""``trtllm-kit serve OUT --disagg --server trtllm-serve``: a context and a generation worker and upstream's
``trtllm-serve disaggregated`` orchestrator. trtllm-serve needs a GPU, so a fake on PATH records each argv and
``CUDA_VISIBLE_DEVICES`` and answers /health on the port it was given; the test asserts the three argvs, the
orchestrator's config file and each role's LLM-API options exactly, the stop of all three on SIGTERM, and the
one-sentence refusal where trtllm-serve is not installed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trtllm_kit.cli import run
from trtllm_kit.serve.server.launcher import free_port
from trtllm_kit.serve.server.state import run_dir

FAKE = '''#!{python}
import http.server, json, os, signal, sys, yaml
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}}) + "\\n")
if sys.argv[1] == "disaggregated":
    config = yaml.safe_load(open(sys.argv[sys.argv.index("-c") + 1]))
    host, port = config["hostname"], config["port"]
else:
    host, port = sys.argv[sys.argv.index("--host") + 1], int(sys.argv[sys.argv.index("--port") + 1])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer((host, port), Health)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
server.serve_forever()
'''


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trtllm-serve-disagg") / "out"
    assert run(["build", "builtin:tiny-llama", "--target", "llmapi", "--no-verify", "--until", "engine",
                "--out", str(out)]) == 0
    return out


def env_with(tmp_path: Path, fake: bool) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if fake:
        (bin_dir / "trtllm-serve").write_text(FAKE.format(python=sys.executable))
        (bin_dir / "trtllm-serve").chmod(0o755)
    path = [str(bin_dir), str(Path(sys.executable).parent), "/usr/bin", "/bin"]
    import os

    return {**os.environ, "PATH": os.pathsep.join(path), "FAKE_CALLS": str(tmp_path / "calls.jsonl")}


def test_runs_two_workers_and_the_orchestrator_with_upstreams_config(out: Path, tmp_path: Path) -> None:
    port = free_port()
    serve = subprocess.Popen([sys.executable, "-m", "trtllm_kit", "serve", str(out), "--disagg", "--server",
                              "trtllm-serve", "--openai-port", str(port), "--context-gpu-device-ids", "0,1",
                              "--generation-gpu-device-ids", "2", "--kv-transfer-timeout", "5", "--ready-timeout",
                              "60"], env=env_with(tmp_path, fake=True), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        line = serve.stderr.readline()
        assert line.startswith("ready in") and f"127.0.0.1:{port}/v1" in line, line + serve.stderr.read()
        calls = [json.loads(c) for c in (tmp_path / "calls.jsonl").read_text().splitlines()]
        root, state_dir = out.absolute(), run_dir(out)
        assert len(calls) == 3, calls  # two workers and the orchestrator, started together (in any order)
        workers = {call["gpus"]: call["argv"] for call in calls if call["gpus"] is not None}
        ports = {gpus: argv[argv.index("--port") + 1] for gpus, argv in workers.items()}
        for gpus, role in (("0,1", "context"), ("2", "generation")):
            assert workers[gpus] == [str(root / "checkpoint"), "--host", "127.0.0.1", "--port", ports[gpus],
                                     "--backend", "pytorch", "--extra_llm_api_options",
                                     str(state_dir / f"{role}.yaml")]
        assert [call for call in calls if call["gpus"] is None] == [
            {"argv": ["disaggregated", "-c", str(state_dir / "disagg_config.yaml"), "-t", "60"], "gpus": None}]
        assert yaml.safe_load((state_dir / "disagg_config.yaml").read_text()) == {
            "hostname": "127.0.0.1", "port": port, "backend": "pytorch",
            "context_servers": {"num_instances": 1, "urls": [f"127.0.0.1:{ports['0,1']}"],
                                "router": {"type": "round_robin"}},
            "generation_servers": {"num_instances": 1, "urls": [f"127.0.0.1:{ports['2']}"],
                                   "router": {"type": "round_robin"}}}
        recorded = yaml.safe_load((root / "trtllm-serve" / "extra_llm_api_options.yaml").read_text())
        transceiver = {"backend": "DEFAULT", "kv_transfer_timeout_ms": 5000}
        context = yaml.safe_load((state_dir / "context.yaml").read_text())
        generation = yaml.safe_load((state_dir / "generation.yaml").read_text())
        assert context == {**recorded, "cache_transceiver_config": transceiver, "disable_overlap_scheduler": True}
        assert generation == {**recorded, "cache_transceiver_config": transceiver}
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=30) == 0
        assert not (state_dir / "state.json").exists()
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()


def test_without_trtllm_serve_it_stops_with_one_sentence(out: Path, tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "trtllm_kit", "serve", str(out), "--disagg", "--server",
                             "trtllm-serve", "--openai-port", str(free_port())], env=env_with(tmp_path, fake=False),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.startswith("Error: trtllm-serve is not on PATH, so ") and "--disagg --server trtllm-serve" \
        in result.stderr and "Traceback" not in result.stderr


def test_disagg_needs_the_openai_port(out: Path, tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "trtllm_kit", "serve", str(out), "--disagg"],
                            env=env_with(tmp_path, fake=False), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--disagg answers on the OpenAI port only (the two-step request); add --openai-port PORT." \
        in result.stderr
