"""The ``cpu`` repository of every built-in tiny model on a real tritonserver: text in → text out through
``ensemble`` and ``tensorrt_llm_bls``, streaming and not, equal to the kit's own greedy CPU decoding."""

from __future__ import annotations

import queue
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from transformers import AutoTokenizer
from tritonclient.utils import InferenceServerException

from tests.integration.tritonserver import running_server
from trtllm_kit.build.pipeline import run_build
from trtllm_kit.models.builtin import BUILTIN_MODELS
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.spec import BuildSpec

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PROMPT = "The history of the city"
MAX_TOKENS = 12


def greedy_reference(out: Path, prompt: str, max_tokens: int) -> tuple[str, list[str]]:
    """The full text, and the text of each token on its own, of a plain full-recompute greedy loop."""
    tokenizer = AutoTokenizer.from_pretrained(out / "tokenizer")
    model = CheckpointModel.load(out / "checkpoint")
    ids = tokenizer(prompt)["input_ids"]
    generated: list[int] = []
    for _ in range(max_tokens):
        token = int(model.forward(torch.tensor([ids + generated]))[0, -1].argmax())
        if token == tokenizer.eos_token_id:
            break
        generated.append(token)
    return (tokenizer.decode(generated, skip_special_tokens=True),
            [tokenizer.decode([t], skip_special_tokens=True) for t in generated])


def serve(root: Path, model: str, **options):
    """Build ``model`` for the cpu target into ``root`` and serve its repository; yields (client, reference)."""
    torch.set_num_threads(1)
    out = root / "out"
    run_build(BuildSpec.from_dict({"model": f"builtin:{model}", "out": out, "build": {"verify": False}, "repo": {
        "preprocessing_instances": 1, "postprocessing_instances": 1, "bls_instances": 1, **options}}))
    with running_server(out / "repo", root) as server:
        client = grpcclient.InferenceServerClient(server.config.endpoints.url("grpc"))
        try:
            yield client, greedy_reference(out, PROMPT, MAX_TOKENS)
        finally:
            client.close()


@pytest.fixture(scope="module", params=sorted(BUILTIN_MODELS))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    yield from serve(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture(scope="module")
def served_sync(tmp_path_factory: pytest.TempPathFactory):
    """tiny-llama with decoupled = false: one response per request, no streaming."""
    yield from serve(tmp_path_factory.mktemp("sync"), "tiny-llama", decoupled=False)


def ask(client: grpcclient.InferenceServerClient, model: str, stream: bool) -> list[str] | str:
    """Send one request over a gRPC stream; the text of every response until the final one."""
    values = [("text_input", np.array([[PROMPT.encode()]], dtype=object), "BYTES"),
              ("max_tokens", np.array([[MAX_TOKENS]], np.int32), "INT32"),
              ("stream", np.array([[stream]], bool), "BOOL")]
    inputs = []
    for name, array, dtype in values:
        inputs.append(grpcclient.InferInput(name, list(array.shape), dtype))
        inputs[-1].set_data_from_numpy(array)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, request_id=f"{model}-{stream}", enable_empty_final_response=True)
        texts = []
        while True:
            result, error = responses.get(timeout=60)
            if error is not None:
                return error.message()
            text = result.as_numpy("text_output")
            if text is not None:
                texts.append(text.reshape(-1)[0].decode())
            if result.get_response().parameters["triton_final_response"].bool_param:
                return texts
    finally:
        client.stop_stream()


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_text_in_text_out_equals_cpu_greedy_decoding(served, model: str) -> None:
    client, (expected, per_token) = served
    assert expected  # the tiny models do generate text for this prompt
    assert ask(client, model, stream=False) == [expected]
    streamed = ask(client, model, stream=True)
    assert 1 < len(streamed) <= MAX_TOKENS + 1
    if model == "ensemble":  # postprocessing decodes each streamed token on its own
        assert [t for t in streamed if t] == [t for t in per_token if t]
    else:  # BLS accumulates tokens, so characters split across tokens come out whole
        assert "".join(streamed) == expected


def test_without_decoupled_mode_answers_whole_and_refuses_streaming(served_sync) -> None:
    client, (expected, _) = served_sync
    assert ask(client, "ensemble", stream=False) == [expected]
    assert ask(client, "tensorrt_llm_bls", stream=False) == [expected]
    assert ask(client, "tensorrt_llm_bls", stream=True) == (  # the code marks the message (wire/error_code.py)
        "[INVALID_ARG] stream=true needs a decoupled tensorrt_llm_bls model; regenerate the repository with "
        "decoupled = true or send stream=false.")
    inputs = [grpcclient.InferInput("text_input", [2, 1], "BYTES"),
              grpcclient.InferInput("max_tokens", [2, 1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([[b"a"], [b"b"]], dtype=object))
    inputs[1].set_data_from_numpy(np.array([[2], [2]], np.int32))
    with pytest.raises(InferenceServerException, match=r"\[INVALID_ARG\] tensorrt_llm_bls takes one prompt per "
                       r"request, got a batch "
                       r"of 2; send one request per prompt \(they are batched in flight anyway\)."):
        client.infer("tensorrt_llm_bls", inputs)
