"""Draft-target speculation served for real: a repository of upstream's ``spec_decode`` layout made by the kit's
generator, the CPU ``tensorrt_llm`` model in both slots (the target, and a perturbed copy of it as
``tensorrt_llm_draft``), in a real tritonserver. Through the BLS and the ensemble, whole and streamed, the greedy text
equals the same target's without speculation, and the acceptance outputs count drafts both kept and rejected; the CPU
model verifies ``draft_input_ids`` in one step."""

from __future__ import annotations

import queue
import shutil
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families
from safetensors.torch import load_file, save_file

from tests.integration.tritonserver import grpc_inputs, running_server
from trtllm_kit.artifact import Artifact
from trtllm_kit.cli import run
from trtllm_kit.model_repo.repository import write_repository
from trtllm_kit.model_repo.spec_decode import DraftServing
from trtllm_kit.names import BLS_MODEL, DRAFT_MODEL, ENSEMBLE_MODEL, TOKENIZER_DIR
from trtllm_kit.spec.repo_options import RepoOptions
from trtllm_kit.targets import get_target

pytestmark = pytest.mark.integration
PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away,", "def add(a, b):"]
MAX_TOKENS = 14
K = 3


def perturbed_copy(checkpoint: Path, dest: Path) -> Path:
    """The checkpoint with its last layer's MLP scaled: a draft that agrees with the target only in part."""
    shutil.copytree(checkpoint, dest)
    weights = load_file(dest / "rank0.safetensors")
    last = max(int(name.split(".")[2]) for name in weights if name.startswith("transformer.layers."))
    for name in weights:
        if name.startswith(f"transformer.layers.{last}.mlp."):
            weights[name] = weights[name] * 1.5
    save_file(weights, dest / "rank0.safetensors")
    return dest


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("spec-decode-served")
    out = root / "out"
    assert run(["build", "builtin:tiny-llama", "--target", "cpu", "--dtype", "float32", "--no-verify", "--out",
                str(out)]) == 0
    record = Artifact.read(out).records.repo
    assert record is not None and isinstance(record.options, RepoOptions)
    draft = perturbed_copy(Path(record.gpt_model_path), root / "draft_checkpoint")
    limits = replace(record.limits, slot_model=get_target(record.target).slot_model)  # the manifest leaves it out
    repo = root / "repo"
    write_repository(repo, limits, record.options, model_path=Path(record.gpt_model_path),
                     tokenizer_files=sorted((out / "repo" / "preprocessing" / TOKENIZER_DIR).iterdir()),
                     draft=DraftServing(limits, draft))
    shipped = [(repo / name / "1" / "model.py").read_bytes() for name in (DRAFT_MODEL, "tensorrt_llm")]
    assert shipped[0] == shipped[1]  # the CPU model in both slots
    with running_server(repo, root, timeout_s=180) as served:
        yield served


def request(prompt: str, *, num_draft_tokens: int | None, stream: bool) -> dict[str, np.ndarray]:
    inputs = {"text_input": np.array([[prompt.encode()]], np.object_), "max_tokens": np.array([[MAX_TOKENS]], np.int32),
              "stream": np.array([[stream]], np.bool_)}
    if num_draft_tokens is not None:
        inputs["num_draft_tokens"] = np.array([[num_draft_tokens]], np.int32)
    return inputs


def answer(server, model: str, inputs: dict[str, np.ndarray]) -> tuple[str, list[dict[str, float]], str | None]:
    """The text of a request's responses, each response's acceptance outputs, and its error."""
    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.config.endpoints.url("grpc"))
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    try:
        client.async_stream_infer(model, grpc_inputs(inputs), enable_empty_final_response=True)
        text, figures = b"", []
        while True:
            result, error = events.get(timeout=300)
            if error is not None:
                return text.decode(), figures, str(error)
            found = result.as_numpy("text_output")
            if found is not None:
                text += found.reshape(-1)[0]
                names = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")
                figures.append({n: float(v.reshape(-1)[0]) for n in names if (v := result.as_numpy(n)) is not None})
            if result.get_response().parameters["triton_final_response"].bool_param:
                return text.decode(), figures, None
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("model", [BLS_MODEL, ENSEMBLE_MODEL])
@pytest.mark.parametrize("stream", [False, True])
def test_speculated_text_equals_the_targets_and_reports_acceptance(server, model: str, stream: bool) -> None:
    totals = {"total_draft_tokens": 0.0, "total_accepted_draft_tokens": 0.0}
    for prompt in PROMPTS:
        expected, _, error = answer(server, BLS_MODEL, request(prompt, num_draft_tokens=None, stream=False))
        assert error is None and expected
        text, figures, error = answer(server, model, request(prompt, num_draft_tokens=K, stream=stream))
        assert error is None and text == expected, prompt
        figures = [f for f in figures if f]  # the text held back for a split character comes last, without them
        last = figures[-1]
        assert set(last) == {"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"}
        drafted, accepted = last["total_draft_tokens"], last["total_accepted_draft_tokens"]
        assert drafted > 0 and accepted <= drafted and last["acceptance_rate"] == pytest.approx(accepted / drafted)
        if stream:  # one response per round, the figures rising
            assert len(figures) > 1
            assert [f["total_draft_tokens"] for f in figures] == sorted(f["total_draft_tokens"] for f in figures)
        for name in totals:
            totals[name] += last[name]
    assert 0 < totals["total_accepted_draft_tokens"] < totals["total_draft_tokens"]  # kept and rejected drafts


def test_refusals_reach_the_client_in_one_sentence(server) -> None:
    inputs = {**request(PROMPTS[0], num_draft_tokens=K, stream=False), "return_log_probs": np.array([[True]])}
    _, _, error = answer(server, BLS_MODEL, inputs)
    assert error is not None and "return_log_probs is not answered with speculation (num_draft_tokens > 0)" in error
    inputs = {**request(PROMPTS[0], num_draft_tokens=K, stream=False), "use_draft_logits": np.array([[True]])}
    _, _, error = answer(server, BLS_MODEL, inputs)
    assert error is not None and "draft_logits is not used by the CPU runtime" in error


def test_zero_draft_tokens_answers_without_speculation(server) -> None:
    expected, _, _ = answer(server, BLS_MODEL, request(PROMPTS[1], num_draft_tokens=None, stream=False))
    text, figures, error = answer(server, BLS_MODEL, request(PROMPTS[1], num_draft_tokens=0, stream=False))
    assert error is None and text == expected and figures == [{}]


def iterations(server, model: str) -> float:
    """``model``'s step counter (``nv_trt_llm_general_metrics``), once it stops moving."""
    url = f"http://{server.config.endpoints.url('metrics')}/metrics"
    last = None
    while True:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        value = next(s.value for family in text_string_to_metric_families(text)
                     if family.name == "nv_trt_llm_general_metrics" for s in family.samples
                     if s.labels.get("model") == model and s.labels.get("general_type") == "iteration_counter")
        if value == last:
            return value
        last = value
        time.sleep(0.5)


def generated(server, prompt: list[int], max_tokens: int, draft_ids: list[int] | None) -> list[int] | str:
    inputs = {"input_ids": np.array([prompt], np.int32), "input_lengths": np.array([[len(prompt)]], np.int32),
              "request_output_len": np.array([[max_tokens]], np.int32), "streaming": np.array([[False]], np.bool_)}
    if draft_ids is not None:
        inputs["draft_input_ids"] = np.array([draft_ids], np.int32)
    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.config.endpoints.url("grpc"))
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    try:
        client.async_stream_infer("tensorrt_llm", grpc_inputs(inputs), enable_empty_final_response=True)
        ids: list[int] = []
        while True:
            result, error = events.get(timeout=120)
            if error is not None:
                return str(error)
            if (found := result.as_numpy("output_ids")) is not None:
                ids = found.reshape(-1).tolist()
            if result.get_response().parameters["triton_final_response"].bool_param:
                return ids
    finally:
        client.stop_stream()
        client.close()


def test_the_cpu_model_verifies_draft_input_ids_in_one_step(server) -> None:
    prompt = [5, 77, 301, 9, 640, 12, 18]
    before = iterations(server, "tensorrt_llm")
    reference = generated(server, prompt, 6, None)
    plain = iterations(server, "tensorrt_llm") - before
    assert len(reference) == 6 and plain == 6  # the prompt's step, then one step a token
    before = iterations(server, "tensorrt_llm")
    assert generated(server, prompt, 6, reference[:5]) == reference
    assert iterations(server, "tensorrt_llm") - before == 2  # the prompt's step, then the five drafts verified in one


def test_a_stop_word_ends_the_speculated_text_where_it_ends_the_targets(server) -> None:
    prompt = PROMPTS[0]
    whole, _, _ = answer(server, BLS_MODEL, request(prompt, num_draft_tokens=None, stream=False))
    stopped = None
    # the first word the target stops at, short of its whole answer (as the tokenizer spells it mid-text or alone)
    for word in [spelled for piece in whole.split()[1:] for spelled in (f" {piece}", piece)]:
        inputs = {**request(prompt, num_draft_tokens=None, stream=False), "stop_words": np.array([[word.encode()]],
                                                                                                  np.object_)}
        text, _, error = answer(server, BLS_MODEL, inputs)
        if error is None and len(text) < len(whole):
            stopped = word, text
            break
    assert stopped is not None, whole
    word, expected = stopped
    for stream in (False, True):
        inputs = {**request(prompt, num_draft_tokens=K, stream=stream), "stop_words": np.array([[word.encode()]],
                                                                                                np.object_)}
        text, _, error = answer(server, BLS_MODEL, inputs)
        assert error is None and text == expected, (word, stream)


def test_a_draft_token_outside_the_vocabulary_fails_alone(server) -> None:
    error = generated(server, [5, 77, 301], 4, [3, 10**6])
    assert isinstance(error, str) and "draft_input_ids hold a token outside the vocabulary [0, 1031)" in error
    assert len(generated(server, [5, 77, 301], 4, None)) == 4  # the model still serves
