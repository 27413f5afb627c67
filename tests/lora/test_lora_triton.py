"""LoRA through a real tritonserver over the repository ``build`` generates: the CPU ``tensorrt_llm`` model takes
upstream's ``lora_task_id`` / ``lora_weights`` / ``lora_config`` (declared with the LoRA cache parameters); adapters
and the base in one stream equal PEFT, an id the cache evicted fails alone with the backend's sentence, and resent
weights give exact outputs again."""

from __future__ import annotations

import queue
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from transformers import AutoTokenizer
from tritonclient.grpc import model_config_pb2 as mc

from tests.integration.tritonserver import Streams, running_server, tensorrt_llm_inputs
from tests.lora.adapters import MAX_RANK, make_adapter, one_adapter_bytes, peft_greedy
from trtllm_kit.artifact import Artifact
from trtllm_kit.cli import run
from trtllm_kit.model_repo.configs import parse_config
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.lora import ADAPTER_FILE, load_adapter, to_rows

pytestmark = pytest.mark.integration
MAX_TOKENS = 8
PROMPT = [5, 77, 301, 9, 640, 12, 18, 999, 3]
ADAPTERS = {"qv4": (4, 8, ["q_proj", "v_proj"]), "mlp16": (16, 32, ["o_proj", "gate_proj", "up_proj", "down_proj"])}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("lora-triton")
    out = root / "out"
    assert run(["build", "builtin:tiny-llama", "--target", "cpu", "--dtype", "float32", "--no-verify",
                "--max-lora-rank", str(MAX_RANK), "--lora-cache-host-memory-bytes",
                str(one_adapter_bytes(builtin_dir("tiny-llama"))), "--out", str(out)]) == 0
    sources = {}
    for seed, (name, (rank, alpha, targets)) in enumerate(ADAPTERS.items()):
        sources[name] = make_adapter(builtin_dir("tiny-llama"), root / name, rank=rank, targets=targets,
                                     alpha=alpha, seed=seed)
        assert run(["lora", "add", str(out), name, str(sources[name])]) == 0
    with running_server(out / "repo", root) as server:
        yield server, out, sources


def peft_tokens(source: Path | None, prompt: list[int] = PROMPT) -> list[int]:
    return peft_greedy(builtin_dir("tiny-llama"), source, prompt, MAX_TOKENS)


def lora_inputs(out: Path, name: str, task_id: int, with_weights: bool) -> list[grpcclient.InferInput]:
    values = [("lora_task_id", np.array([[task_id]], np.uint64), "UINT64")]
    if with_weights:
        record = Artifact.read(out).records.adapters[name]
        weights, config = to_rows(load_adapter(out / record.dir / ADAPTER_FILE, torch.float32, 1 << 30))
        values += [("lora_weights", weights.numpy()[None], "FP32"), ("lora_config", config.numpy()[None], "INT32")]
    made = []
    for tensor_name, array, dtype in values:
        made.append(grpcclient.InferInput(tensor_name, list(array.shape), dtype))
        made[-1].set_data_from_numpy(array)
    return made


def send(streams: Streams, request_id: str, extra: list[grpcclient.InferInput]) -> None:
    streams.client.async_stream_infer("tensorrt_llm", tensorrt_llm_inputs(PROMPT, MAX_TOKENS) + extra,
                                      request_id=request_id, enable_empty_final_response=True)


def test_adapters_through_tritonserver_equal_peft_and_evictions_fail_alone(served) -> None:
    server, out, sources = served
    expected = {None: peft_tokens(None), **{name: peft_tokens(path) for name, path in sources.items()}}
    streams = Streams(server)
    send(streams, "base", [])
    send(streams, "qv4", lora_inputs(out, "qv4", 1, True))
    tokens, errors = streams.collect(2)
    assert not errors and tokens == {"base": expected[None], "qv4": expected["qv4"]}
    send(streams, "mlp16", lora_inputs(out, "mlp16", 2, True))  # the cache holds 1: qv4 is evicted
    tokens, errors = streams.collect(1)
    assert not errors and tokens == {"mlp16": expected["mlp16"]}
    send(streams, "again", lora_inputs(out, "qv4", 1, False))
    send(streams, "cached", lora_inputs(out, "mlp16", 2, False))
    tokens, errors = streams.collect(2)
    assert tokens == {"cached": expected["mlp16"]}
    assert len(errors) == 1 and "LoRA task 1 not found in cache. Please send LoRA weights with request." in errors[0]
    send(streams, "resent", lora_inputs(out, "qv4", 1, True))
    tokens, errors = streams.collect(1)
    streams.close()
    assert not errors and tokens == {"resent": expected["qv4"]}


def test_generated_repository_declares_lora_inputs_and_cache(served) -> None:
    _, out, _ = served
    configs = {name: parse_config((out / "repo" / name / "config.pbtxt").read_text())
               for name in ("tensorrt_llm", "ensemble", "tensorrt_llm_bls")}
    for config in configs.values():
        declared = {t.name: (mc.DataType.Name(t.data_type), list(t.dims), t.optional) for t in config.input}
        assert declared["lora_task_id"] == ("TYPE_UINT64", [1], True)
        assert declared["lora_weights"] == ("TYPE_FP32", [-1, -1], True)  # the checkpoint's dtype
        assert declared["lora_config"] == ("TYPE_INT32", [-1, 3], True)
    params = {k: v.string_value for k, v in configs["tensorrt_llm"].parameters.items()}
    assert (params["lora_cache_max_adapter_size"], params["lora_cache_optimal_adapter_size"]) == (str(MAX_RANK), "8")
    assert params["lora_cache_host_memory_bytes"] == str(one_adapter_bytes(builtin_dir("tiny-llama")))
    step = next(s for s in configs["ensemble"].ensemble_scheduling.step if s.model_name == "tensorrt_llm")
    assert {k: v for k, v in step.input_map.items() if k.startswith("lora_")} == {
        "lora_task_id": "lora_task_id", "lora_weights": "lora_weights", "lora_config": "lora_config"}


def test_the_ensemble_passes_the_lora_inputs_through(served) -> None:
    """Text in, the adapter's task id and rows beside it: the ensemble maps them onto tensorrt_llm (one whole
    response: a decoupled ensemble's streamed pieces may arrive out of order)."""
    server, out, sources = served
    text = "The kit serves adapters"
    values = [("text_input", np.array([[text.encode()]], np.object_), "BYTES"),
              ("max_tokens", np.array([[MAX_TOKENS]], np.int32), "INT32"), ("stream", np.array([[False]]), "BOOL"),
              ("end_id", np.array([[-1]], np.int32), "INT32")]
    made = []
    for name, array, dtype in values:
        made.append(grpcclient.InferInput(name, list(array.shape), dtype))
        made[-1].set_data_from_numpy(array)
    events: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.config.endpoints.url("grpc")) as client:
        client.start_stream(callback=lambda result, error: events.put((result, error)))
        client.async_stream_infer("ensemble", made + lora_inputs(out, "qv4", 7, True), enable_empty_final_response=True)
        texts = []
        while True:
            result, error = events.get(timeout=60)
            assert error is None, error
            piece = result.as_numpy("text_output")
            texts += [] if piece is None else [b"".join(piece.reshape(-1)).decode()]
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        client.stop_stream()
    tokenizer = AutoTokenizer.from_pretrained(builtin_dir("tiny-llama"))
    expected = peft_tokens(sources["qv4"], tokenizer(text).input_ids)
    assert expected != peft_tokens(None, tokenizer(text).input_ids)
    assert "".join(texts) == tokenizer.decode(expected, skip_special_tokens=True)
