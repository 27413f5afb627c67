"""The CPU ``tensorrt_llm`` model on a real tritonserver: streaming requests are batched in flight, a cancelled
stream frees its blocks, a full queue answers with a clear error, and output equals the engine's."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from tests.integration.tritonserver import Streams, metrics, running_server
from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.sequence import SamplingParams

pytestmark = pytest.mark.integration
MODEL_PY = Path(__file__).parents[2] / "trtllm_kit" / "triton_models" / "tensorrt_llm_cpu.py"
INPUTS = [("input_ids", "INT32", [-1]), ("input_lengths", "INT32", [1]), ("request_output_len", "INT32", [1]),
          ("end_id", "INT32", [1]), ("pad_id", "INT32", [1]), ("streaming", "BOOL", [1]),
          ("runtime_top_k", "INT32", [1]), ("temperature", "FP32", [1]), ("seed", "UINT64", [1]),
          ("stop_words_list", "INT32", [2, -1]), ("exclude_input_in_output", "BOOL", [1])]
OUTPUTS = [("output_ids", "INT32", [-1, -1]), ("sequence_length", "INT32", [-1])]
PARAMETERS = {"max_batch_size": "4", "max_num_tokens": "256", "tokens_per_block": "8",
              "max_tokens_in_paged_kv_cache": "2048", "batch_scheduler_policy": "max_utilization",
              "enable_kv_cache_reuse": "true", "enable_chunked_context": "true", "max_queue_size": "2",
              "exclude_input_in_output": "true", "cpu_threads": "1"}


def tensorrt_llm_config(ckpt: Path) -> mc.ModelConfig:
    config = mc.ModelConfig(name="tensorrt_llm", backend="python", max_batch_size=4)
    config.model_transaction_policy.decoupled = True
    config.dynamic_batching.SetInParent()
    for name, dtype, dims in INPUTS:
        entry = config.input.add(name=name, data_type=mc.DataType.Value(f"TYPE_{dtype}"), dims=dims,
                                 optional=name not in ("input_ids", "input_lengths", "request_output_len"))
        entry.allow_ragged_batch = -1 in dims
    for name, dtype, dims in OUTPUTS:
        config.output.add(name=name, data_type=mc.DataType.Value(f"TYPE_{dtype}"), dims=dims)
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    for key, value in {**PARAMETERS, "gpt_model_path": str(ckpt)}.items():
        config.parameters[key].string_value = value
    return config


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("serve")
    ckpt = convert_checkpoint(builtin_dir("tiny-llama"), root / "ckpt", dtype="float32") and root / "ckpt"
    model_dir = root / "repo" / "tensorrt_llm"
    (model_dir / "1").mkdir(parents=True)
    shutil.copy(MODEL_PY, model_dir / "1" / "model.py")
    (model_dir / "config.pbtxt").write_text(text_format.MessageToString(tensorrt_llm_config(ckpt)))
    with running_server(root / "repo", root) as running:
        running.ckpt = ckpt
        yield running


def prompt(i: int, length: int = 12) -> list[int]:
    return [(37 * i + 11 * j) % 1000 + 1 for j in range(length)]


def test_concurrent_streams_are_batched_and_equal_the_engine(server):
    streams = Streams(server)
    for i in range(4):
        streams.send(f"r{i}", prompt(i), 24)
    tokens, errors = streams.collect(4)
    streams.close()
    assert not errors
    engine = Executor.from_checkpoint(server.ckpt, EngineConfig(tokens_per_block=8))
    expected = engine.generate([prompt(i) for i in range(4)], [SamplingParams(max_tokens=24)] * 4)
    assert [tokens[f"r{i}"] for i in range(4)] == expected
    batch = metrics(server, "trtllm_kit_batch_metrics")
    general = metrics(server, "nv_trt_llm_general_metrics")
    assert batch["peak_scheduled"] > 1  # the four requests shared steps
    assert batch["total_scheduled_requests"] / general["iteration_counter"] > 1


def test_cancelled_stream_frees_its_blocks(server):
    streams = Streams(server)
    streams.send("long", prompt(9, 40), 1000)
    seen = 0
    while seen < 3:
        result, error = streams.events.get(timeout=30)
        assert error is None
        seen += result.as_numpy("output_ids") is not None
    blocks = metrics(server, "nv_trt_llm_kv_cache_block_metrics")
    assert blocks["used"] >= 6  # 40 prompt tokens and more in 8-token blocks
    assert 0 < blocks["fraction"] <= 1  # the C++ backend's share of used blocks
    streams.close(cancel=True)
    deadline = time.monotonic() + 60  # a hang guard only
    while metrics(server, "nv_trt_llm_kv_cache_block_metrics")["used"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metrics(server, "nv_trt_llm_kv_cache_block_metrics")["used"] == 0
    assert metrics(server, "nv_trt_llm_kv_cache_block_metrics")["fraction"] == 0
    assert metrics(server, "nv_trt_llm_request_metrics")["active"] == 0


def test_full_queue_gives_a_clear_error(server):
    streams = Streams(server)
    for i in range(10):  # 4 run, 2 wait, the rest find the queue full
        streams.send(f"q{i}", prompt(i), 64)
    tokens, errors = streams.collect(10)
    streams.close()
    assert errors and all("the request queue is full" in e and "max_queue_size 2" in e for e in errors)
    assert len(tokens) == 10 - len(errors) >= 6 and all(len(t) == 64 for t in tokens.values())
