"""``build --target cpu --speculative draft-target``: the draft (another built-in family with the same tokenizer)
converted into ``draft_checkpoint/`` and recorded in the manifest, the repository in the ``spec_decode`` layout with
the CPU model in both slots, the ``tensorrt_llm`` model naming the draft to run in its own engine, and ``serve OUT``
answering ``/v1/completions`` with speculation (its ``usage.speculative`` and the ``vllm:spec_decode_*`` counters)
and, through its tritonserver, the BLS with speculation (``num_draft_tokens`` K): greedy text equal to the same
target's without speculation, whole and streamed."""

from __future__ import annotations

import json
import queue
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from kit_server import KitServer
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoTokenizer

from trtllm_kit.artifact import Artifact, CheckpointRecord
from trtllm_kit.cli import run
from trtllm_kit.errors import KitUsageError
from trtllm_kit.model_repo.configs import parse_config
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.names import BLS_MODEL, DRAFT_CHECKPOINT_DIR, DRAFT_MODEL
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.sequence import SamplingParams
from trtllm_kit.serve.servable import servable
from trtllm_kit.serve.server.launcher import GRPC_RESTRICTED_HEADER
from trtllm_kit.serve.server.state import TOKEN_FILE

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODEL, DRAFT = "builtin:tiny-llama", "tiny-qwen2"  # two families, one tokenizer
PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away,"]
MAX_TOKENS, K = 12, 3


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cpu-draft-target") / "out"
    assert run(["build", MODEL, "--target", "cpu", "--dtype", "float32", "--no-verify", "--speculative",
                "draft-target", "--draft-model", str(builtin_dir(DRAFT)), "--max-draft-len", str(K),
                "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def served(out: Path) -> Iterator[dict[str, Any]]:
    with KitServer(out) as server:
        yield server.state


@pytest.fixture(scope="module")
def expected(out: Path) -> dict[str, str]:
    """Each prompt's greedy text from the target's checkpoint alone, without speculation."""
    tokenizer = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    engine = Executor.from_checkpoint(out / "checkpoint", EngineConfig())
    texts: dict[str, str] = {}
    for prompt in PROMPTS:
        ids = engine.generate([tokenizer(prompt).input_ids],
                              [SamplingParams(max_tokens=MAX_TOKENS, end_id=tokenizer.eos_token_id)])[0]
        texts[prompt] = str(tokenizer.decode([t for t in ids if t != tokenizer.eos_token_id], skip_special_tokens=True))
    return texts


def test_the_draft_is_converted_recorded_and_served_from_its_checkpoint(out: Path) -> None:
    engine = Artifact.read(out).records.engine
    assert engine is not None
    assert engine.draft == CheckpointRecord(dir=DRAFT_CHECKPOINT_DIR, dtype="float32", world_size=1, tp_size=1,
                                            pp_size=1)
    draft_config = json.loads((out / DRAFT_CHECKPOINT_DIR / "config.json").read_text())
    assert draft_config["architecture"] == "Qwen2ForCausalLM"
    config = parse_config((out / "repo" / DRAFT_MODEL / "config.pbtxt").read_text())
    assert config.parameters["gpt_model_path"].string_value == str((out / DRAFT_CHECKPOINT_DIR).absolute())
    assert (out / "repo" / DRAFT_MODEL / "1" / "model.py").read_bytes() == \
        (out / "repo" / "tensorrt_llm" / "1" / "model.py").read_bytes()
    target = parse_config((out / "repo" / "tensorrt_llm" / "config.pbtxt").read_text())
    values = {k: v.string_value for k, v in target.parameters.items()}
    assert (values["speculative_decoding_mode"], values["max_draft_len"], values["draft_model_path"]) == \
        ("draft-target", str(K), str((out / DRAFT_CHECKPOINT_DIR).absolute()))
    assert "speculative_decoding_mode" not in config.parameters  # the draft's model runs no draft of its own


def test_serve_refuses_an_artifact_whose_draft_checkpoint_is_missing(out: Path, tmp_path: Path) -> None:
    copy = tmp_path / "out"
    shutil.copytree(out, copy, symlinks=True)
    (copy / DRAFT_CHECKPOINT_DIR / "rank0.safetensors").unlink()
    with pytest.raises(KitUsageError) as refused:
        servable(copy)
    assert str(refused.value).startswith(f"{copy} cannot be served here: its draft checkpoint {DRAFT_CHECKPOINT_DIR}/ "
                                         "lacks rank0.safetensors, which draft-target speculation serves;")


def post(served: dict[str, Any], path: str, body: dict[str, Any]) -> bytes:
    request = urllib.request.Request(f"http://{served['openai']}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.read()


@pytest.mark.parametrize("stream", [False, True])
def test_completions_answer_the_targets_greedy_text(served: dict[str, Any], expected: dict[str, str],
                                                     stream: bool) -> None:
    for prompt in PROMPTS:
        body = post(served, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS,
                                                 "temperature": 0, "stream": stream})
        if stream:
            events = [line[len("data: "):] for line in body.decode().split("\n\n") if line]
            assert events[-1] == "[DONE]"
            text = "".join(c["text"] for e in events[:-1] for c in json.loads(e)["choices"])
        else:
            text = json.loads(body)["choices"][0]["text"]
        assert text == expected[prompt], prompt


def spec_counters(served: dict[str, Any]) -> dict[str, float]:
    """The target model's ``vllm:spec_decode_*`` counters on Triton's /metrics, by name."""
    with urllib.request.urlopen(f"http://{served['metrics']}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {sample.name.removesuffix("_total"): sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name.startswith("vllm:spec_decode_num_")
            and sample.labels.get("model_name") == "tensorrt_llm" and "position" not in sample.labels}


@pytest.mark.parametrize("stream", [False, True])
def test_completions_speculate_with_the_draft_and_count_it(served: dict[str, Any], expected: dict[str, str],
                                                            stream: bool) -> None:
    before = spec_counters(served)
    totals = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}
    for prompt in PROMPTS:
        body = post(served, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS,
                                                 "temperature": 0, "stream": stream,
                                                 **({"stream_options": {"include_usage": True}} if stream else {})})
        if stream:
            events = [e[len("data: "):] for e in body.decode().split("\n\n") if e]
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            text = "".join(c["text"] for chunk in chunks for c in chunk["choices"])
            usage = chunks[-1]["usage"]
        else:
            answer = json.loads(body)
            text, usage = answer["choices"][0]["text"], answer["usage"]
        assert text == expected[prompt], prompt
        speculative = usage["speculative"]
        drafts, drafted, accepted = (speculative[k] for k in ("drafts", "draft_tokens", "accepted_tokens"))
        assert drafts > 0 and drafted <= K * drafts and 0 <= accepted <= drafted
        assert speculative["acceptance_length"] == round(1 + accepted / drafts, 4)
        assert drafts < usage["completion_tokens"]  # the prompt's step emits a token, each verifying step one or more
        for name in totals:
            totals[name] += speculative[name]
    after = spec_counters(served)
    rises = {name: after[f"vllm:spec_decode_num_{name}"] - before.get(f"vllm:spec_decode_num_{name}", 0.0)
             for name in totals}
    assert rises == totals  # the requests ran alone on the target: its counters rose by their usage


def ensemble_answer(served: dict[str, Any], prompt: str, stream: bool) -> tuple[str, dict[str, float]]:
    """The BLS's text for ``prompt`` with ``num_draft_tokens`` K, and its last acceptance outputs."""
    inputs = {"text_input": np.array([[prompt.encode()]], np.object_),
              "max_tokens": np.array([[MAX_TOKENS]], np.int32), "stream": np.array([[stream]], np.bool_),
              "num_draft_tokens": np.array([[K]], np.int32)}
    tensors = []
    for name, value in inputs.items():
        tensor = grpcclient.InferInput(name, list(value.shape), "BYTES" if value.dtype == np.object_ else
                                       {np.int32: "INT32", np.bool_: "BOOL"}[value.dtype.type])
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    token = (Path(served["run_dir"]) / TOKEN_FILE).read_text()
    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(served["grpc"])
    client.start_stream(callback=lambda result, error: events.put((result, error)),
                        headers={GRPC_RESTRICTED_HEADER: token})
    try:
        client.async_stream_infer(BLS_MODEL, tensors, enable_empty_final_response=True)
        text, figures = b"", {}
        while True:
            result, error = events.get(timeout=300)
            assert error is None, f"{error.status()}: {error.message()}"
            found = result.as_numpy("text_output")
            if found is not None:
                text += found.reshape(-1)[0]
                for name in ("total_draft_tokens", "total_accepted_draft_tokens"):
                    if (value := result.as_numpy(name)) is not None:
                        figures[name] = float(value.reshape(-1)[0])
            if result.get_response().parameters["triton_final_response"].bool_param:
                return text.decode(), figures
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("stream", [False, True])
def test_the_served_bls_speculates_with_the_qwen2_draft(served: dict[str, Any], expected: dict[str, str],
                                                             stream: bool) -> None:
    for prompt in PROMPTS:
        text, figures = ensemble_answer(served, prompt, stream)
        assert text == expected[prompt], prompt
        assert figures["total_draft_tokens"] > 0
        assert 0 <= figures["total_accepted_draft_tokens"] <= figures["total_draft_tokens"]

