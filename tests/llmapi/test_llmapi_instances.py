"""Several ``tensorrt_llm`` instances through ``--gpu-device-ids`` (validated against tp x pp, written into
config.pbtxt, explained by ``plan``, refused for other targets), served by a real tritonserver on the CPU where
both instances answer; and a request's ``priority`` reaching the CPU runtime's scheduler through the model file."""

from __future__ import annotations

import itertools
import json
import queue
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.integration.tritonserver import grpc_inputs, running_server
from trtllm_kit.cli import run
from trtllm_kit.errors import KitUsageError
from trtllm_kit.model_repo.configs import parse_config
from trtllm_kit.model_repo.llmapi_validate import validate_llmapi_repository
from trtllm_kit.spec.gpu_groups import check_gpu_groups, parse_gpu_device_ids

pytestmark = pytest.mark.slow

grpcclient = pytest.importorskip("tritonclient.grpc")
MODEL = "builtin:tiny-llama"


def test_gpu_groups_are_parsed_and_checked_against_tp_pp() -> None:
    assert parse_gpu_device_ids("0,1;2,3") == ((0, 1), (2, 3))
    check_gpu_groups(((0, 1), (2, 3)), 2, 1)
    for text, sentence in (("0,x;1", "is not a list of GPU groups"), ("0,0", "names GPU 0 twice")):
        with pytest.raises(KitUsageError, match=sentence):
            parse_gpu_device_ids(text)
    with pytest.raises(KitUsageError, match=r"instance 1 1 GPU\(s\) \(2\), but --tp 2 --pp 1 needs 2"):
        check_gpu_groups(((0, 1), (2,)), 2, 1)
    with pytest.raises(KitUsageError, match="gives GPU 1 to two instances"):
        check_gpu_groups(((0, 1), (1, 2)), 2, 1)


def test_build_refuses_groups_that_do_not_match_tp(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = run(["build", MODEL, "--target", "llmapi", "--tp", "2", "--gpu-device-ids", "0;1", "--out",
                str(tmp_path / "o")])
    assert code == 2 and "needs 2 per instance" in capsys.readouterr().err
    code = run(["build", MODEL, "--target", "cpu", "--gpu-device-ids", "0;1", "--out", str(tmp_path / "c")])
    assert code == 2 and "applies to --target llmapi only" in capsys.readouterr().err


def test_plan_explains_the_instances(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["plan", MODEL, "--target", "llmapi", "--tp", "2", "--gpu-device-ids", "0,1;2,3", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)["llmapi"]
    assert body["gpu_device_ids"] == [[0, 1], [2, 3]]
    assert body["instances"].startswith("2 tensorrt_llm instances, each its own LLM (instance 0 on GPU 0,1; "
                                        "instance 1 on GPU 2,3)")
    assert run(["plan", MODEL, "--target", "llmapi", "--gpu-device-ids", "0;1"]) == 0
    assert "Instances: 2 tensorrt_llm instances" in capsys.readouterr().out


@pytest.fixture(scope="module")
def two_instances(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("llmapi-instances")
    out = work / "out"
    assert run(["build", MODEL, "--target", "llmapi", "--no-verify", "--max-batch-size", "1",
                "--gpu-device-ids", "0;1", "--out", str(out)]) == 0
    with running_server(out / "repo", work, timeout_s=180) as process:
        yield out, process


def stream(process, inputs: dict[str, np.ndarray], done: queue.Queue, tag: str,
           started: threading.Event | None = None) -> None:
    """Send one streamed request; set ``started`` at its first token; put (tag, finish time, first-token time)
    on ``done`` when it ends."""
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(process.config.endpoints.url("grpc"))
    tensors = grpc_inputs(inputs)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("tensorrt_llm", tensors, enable_empty_final_response=True)
        first = None
        for _ in range(1024):  # bounded: one response per token at most, plus the final one
            result, error = results.get(timeout=120)
            assert error is None, error
            if result.get_response().outputs and first is None:
                first = time.perf_counter()
                if started is not None:
                    started.set()
            if result.get_response().parameters["triton_final_response"].bool_param:
                done.put((tag, time.perf_counter(), first))
                return
        raise AssertionError("no final response")
    finally:
        client.stop_stream()
        client.close()


def waiting(process) -> float:
    """The requests the server's ``tensorrt_llm`` instances hold queued (``nv_trt_llm_request_metrics``)."""
    with urllib.request.urlopen(f"http://{process.config.endpoints.url('metrics')}/metrics", timeout=10) as reply:
        lines = reply.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines
               if line.startswith("nv_trt_llm_request_metrics{") and 'request_type="waiting"' in line)


def wait_for_waiting(process, count: int) -> None:
    """Return once ``count`` requests wait in the queue (bounded: 600 polls, 60 s)."""
    for _ in range(600):
        if waiting(process) >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"{count} queued requests expected; the server holds {waiting(process)}")


def request(max_tokens: int, priority: float | None = None) -> dict[str, np.ndarray]:
    inputs = {"input_ids": np.array([1, 415, 565, 302, 843, 349], np.int32),
              "sampling_param_max_tokens": np.array([max_tokens], np.int32), "streaming": np.array([True]),
              "sampling_param_ignore_eos": np.array([True])}
    if priority is not None:
        inputs["priority"] = np.array([priority], np.float32)
    return inputs


def test_repository_runs_two_instances_and_both_answer(two_instances) -> None:
    out, process = two_instances
    config = parse_config((out / "repo" / "tensorrt_llm" / "config.pbtxt").read_text())
    assert config.instance_group[0].count == 2
    assert config.parameters["gpu_device_ids"].string_value == "0;1"
    assert validate_llmapi_repository(out / "repo") == []
    log = Path(process.log_path).read_text()
    assert "tensorrt_llm instance 0 of 2" in log and "tensorrt_llm instance 1 of 2" in log
    # Each instance has one batch slot, so two requests stream at the same time only on two instances: one
    # instance would start the second only after the first ended.
    done: queue.Queue = queue.Queue()
    threads = [threading.Thread(target=stream, args=(process, request(400), done, str(i))) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    spans = sorted((first, end) for _, end, first in (done.get(timeout=1) for _ in threads))
    overlaps = [(a, b) for a, b in itertools.pairwise(spans) if b[0] < a[1]]
    assert overlaps, f"no two requests streamed at once: {spans}"


def test_priority_reaches_the_cpu_runtime(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run(["build", MODEL, "--target", "llmapi", "--no-verify", "--max-batch-size", "1", "--out",
                str(out)]) == 0
    with running_server(out / "repo", tmp_path, timeout_s=180) as process:
        done: queue.Queue = queue.Queue()
        running = threading.Event()
        threads = [threading.Thread(target=stream, args=(process, request(1000, 0.1), done, "running", running))]
        threads[0].start()
        assert running.wait(120)  # the first low request holds the one batch slot for ~1000 steps; the rest wait
        for i in range(3):
            threads.append(threading.Thread(target=stream, args=(process, request(100, 0.1), done, f"low{i}")))
            threads[-1].start()
            wait_for_waiting(process, i + 1)  # arrival order: each low request is queued before the next is sent
        threads.append(threading.Thread(target=stream, args=(process, request(100, 0.9), done, "high")))
        threads[-1].start()
        for thread in threads:
            thread.join(timeout=300)
        ends = {tag: end for tag, end, _ in (done.get(timeout=1) for _ in threads)}
    order = sorted(ends, key=ends.__getitem__)
    # Sent last, the high request preempts the running low one and finishes first; the preempted one resumes at
    # the head of the queue, then the waiting low ones run in arrival order (FIFO, as without priorities).
    assert order == ["high", "running", "low0", "low1", "low2"], order


def test_clients_send_priority_to_an_llmapi_model() -> None:
    from trtllm_kit.wire import GenerationRequest
    from trtllm_kit.wire.llmapi import encode_llmapi_request
    from trtllm_kit.wire.tensor import grpc_datatype

    values = encode_llmapi_request(GenerationRequest((1, 415), 4, priority=0.75))
    assert grpc_datatype(values["priority"]) == "FP32" and values["priority"].tolist() == [0.75]
    assert "priority" not in encode_llmapi_request(GenerationRequest((1, 415), 4, priority=None))
