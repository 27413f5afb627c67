"""``trtllm-kit serve OUT --disagg --server trtllm-serve``: a context and a generation worker and upstream's
``trtllm-serve disaggregated`` orchestrator. trtllm-serve needs a GPU, so a fake on PATH records each argv and
``CUDA_VISIBLE_DEVICES`` and answers /health on the port it was given; the test asserts the three argvs, the
orchestrator's config file and each role's LLM-API options exactly, the stop of all three on SIGTERM, and the
one-sentence refusal where trtllm-serve is not installed."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import yaml
from fake_trtllm_serve import TrtllmServePath

from trtllm_kit.serve.server.launcher import free_port
from trtllm_kit.serve.server.state import run_dir


def test_runs_two_workers_and_the_orchestrator_with_upstreams_config(engine_stage_out: Path,
                                                                    fake_trtllm_serve: TrtllmServePath) -> None:
    out, port = engine_stage_out, free_port()
    serve = subprocess.Popen([sys.executable, "-m", "trtllm_kit", "serve", str(out), "--disagg", "--server",
                              "trtllm-serve", "--openai-port", str(port), "--context-gpu-device-ids", "0,1",
                              "--generation-gpu-device-ids", "2", "--kv-transfer-timeout", "5", "--ready-timeout",
                              "60"], env=fake_trtllm_serve.env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        line = serve.stderr.readline()
        assert line.startswith("ready in") and f"127.0.0.1:{port}/v1" in line, line + serve.stderr.read()
        calls = fake_trtllm_serve.calls()
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


def test_without_trtllm_serve_it_stops_with_one_sentence(engine_stage_out: Path,
                                                         without_trtllm_serve: TrtllmServePath) -> None:
    result = subprocess.run([sys.executable, "-m", "trtllm_kit", "serve", str(engine_stage_out), "--disagg",
                             "--server", "trtllm-serve", "--openai-port", str(free_port())],
                            env=without_trtllm_serve.env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.startswith("Error: trtllm-serve is not on PATH, so ") and "--disagg --server trtllm-serve" \
        in result.stderr and "Traceback" not in result.stderr


def test_disagg_needs_the_openai_port(engine_stage_out: Path, without_trtllm_serve: TrtllmServePath) -> None:
    result = subprocess.run([sys.executable, "-m", "trtllm_kit", "serve", str(engine_stage_out), "--disagg"],
                            env=without_trtllm_serve.env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--disagg answers on the OpenAI port only (the two-step request); add --openai-port PORT." \
        in result.stderr
