"""What the frontend sends a ``tensorrt_llm`` model for the engine target's features, and how it reads the
answers: the request tensors (``num_return_sequences``, ``stop_words_list``, ``return_context_logits``,
``keep_end_token``, which logprobs ask for), prompt logprobs as the log-softmax of ``context_logits``, and whether
an engine route has context logits."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from trtllm_kit.artifact import Artifact
from trtllm_kit.artifact.records import EngineRecord
from trtllm_kit.serve.fleet.members import context_logits
from trtllm_kit.serve.openai.engine_input import engine_request
from trtllm_kit.serve.openai.requests import ChatRequest, CompletionRequest
from trtllm_kit.serve.openai.routes import Route
from trtllm_kit.wire import GenerationRequest
from trtllm_kit.wire.logprobs import logits_scored
from trtllm_kit.wire.trtllm import encode_trtllm_request, word_list


def tensors(req: GenerationRequest) -> dict[str, np.ndarray]:
    """The request's ``tensorrt_llm`` tensors, with Triton's batch dimension."""
    return {name: array[None] for name, array in encode_trtllm_request(req).items()}


def test_an_engine_request_as_tensors() -> None:
    sent = tensors(GenerationRequest((1, 5, 9), 4, top_k=1, n=2, best_of=3, stop_words=((7, 8), (), (9,)),
                                     logprobs=1, prompt_logprobs=1, return_context_logits=True))
    assert sent["num_return_sequences"].tolist() == [[3]]  # best_of generated, the frontend keeps the n best
    assert sent["stop_words_list"].tolist() == [[[7, 8, 9], [2, 3, -1]]]  # [1, 2, N]: ids, then end offsets
    assert sent["return_log_probs"].tolist() == [[True]] and sent["return_context_logits"].tolist() == [[True]]
    assert "return_prompt_log_probs" not in sent  # the C++ backend has no prompt-logprob output
    plain = tensors(GenerationRequest((1, 5, 9), 4, top_k=1))
    assert not {"num_return_sequences", "stop_words_list", "return_log_probs", "keep_end_token"} & set(plain)
    assert tensors(GenerationRequest((1, 5, 9), 4, keep_end_token=True))["keep_end_token"].tolist() == [[True]]
    ranked = tensors(GenerationRequest((1, 5, 9), 4, n=1, best_of=2))  # ranking needs the cumulative logprobs
    assert ranked["return_log_probs"].tolist() == [[True]] and "return_context_logits" not in ranked


def test_logprobs_ask_for_the_end_token_back() -> None:
    """A completion or chat request with logprobs asks the engine to keep the end token (scored and counted, as vLLM
    and OpenAI answer); one without leaves upstream's default."""
    route = Route("m", "tensorrt_llm_bls")
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    for req, keep in ((CompletionRequest.parse({"prompt": "p", "logprobs": 0}), True),
                      (CompletionRequest.parse({"prompt": "p", "echo": True}), False),
                      (ChatRequest.parse({**chat, "logprobs": True}), True), (ChatRequest.parse(chat), False)):
        gen = engine_request(route, (1, 5), req, "r")
        assert gen.keep_end_token is (True if keep else None), req


def test_a_word_list_of_one_word() -> None:
    assert word_list(((4,),)).tolist() == [[4], [1]]


def test_prompt_logprobs_are_the_log_softmax_of_the_context_logits() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    prompt = (3, 17, 2, 40)
    scored = logits_scored(logits.numpy().astype(np.float16), prompt, 3)
    expected = torch.log_softmax(logits.half().double(), dim=-1)
    assert scored[0] == (3, None, ())
    for i, (token, logprob, top) in enumerate(scored[1:]):
        assert token == prompt[i + 1] and abs(logprob - float(expected[i, token])) < 1e-9
        values, ids = expected[i].topk(3)
        assert [t for t, _ in top] == ids.tolist() and [v for _, v in top] == values.tolist()


def test_an_engine_route_knows_whether_its_engine_has_context_logits(make_out: Callable[..., Path],
                                                                     tmp_path: Path) -> None:
    artifact = Artifact.read(make_out(tmp_path / "out"))

    def served(target: str, command: list[str] | None) -> Artifact:
        records = replace(artifact.records, engine=EngineRecord(target, "planned", command=command))
        return replace(artifact, target=target, records=records)

    assert context_logits(served("engine", ["trtllm-build", "--gather_context_logits"])) is True
    assert context_logits(served("engine", ["trtllm-build"])) is False
    assert context_logits(served("cpu", None)) is None  # the CPU model scores prompts itself
