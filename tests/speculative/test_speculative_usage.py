"""A speculating sequence's counts reach the OpenAI ``usage``: the runtime's ``DraftAcceptance`` in the
``tensorrt_llm`` response tensors (``total_drafts``, ``total_draft_tokens``, ``total_accepted_draft_tokens``) and
back, kept by the choice's stream (cumulative: the last response's), summed over choices into ``usage.speculative``
(absent when no choice speculated), which the ``openai`` client's usage type keeps as an extra field, and which
``bench`` reads from the usage chunk into its summary's acceptance length."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

import pytest
from openai.types import CompletionUsage

from trtllm_kit.profile.bench import across_repeats
from trtllm_kit.profile.compare import compare
from trtllm_kit.profile.metrics import summarize
from trtllm_kit.profile.openai_client import OpenAIStreamClient
from trtllm_kit.profile.records import RequestRecord
from trtllm_kit.serve.openai.choice_stream import ChoiceStream
from trtllm_kit.serve.openai.responses import speculative_usage
from trtllm_kit.wire import DraftAcceptance, GenerationRequest, GenerationResponse
from trtllm_kit.wire.trtllm_response import decode_trtllm_response, encode_trtllm_response


@pytest.mark.parametrize("acceptance", [DraftAcceptance(4, 12, 6), None])
def test_the_tensors_carry_the_counts_only_when_the_sequence_speculated(acceptance: DraftAcceptance | None) -> None:
    arrays = encode_trtllm_response(GenerationResponse(token_ids=(5, 6), draft_acceptance=acceptance))
    names = {"total_drafts", "total_draft_tokens", "total_accepted_draft_tokens"}
    assert (names <= arrays.keys()) == (acceptance is not None)
    assert decode_trtllm_response(arrays).draft_acceptance == acceptance


def test_acceptance_length_is_tokens_per_verifying_step() -> None:
    assert DraftAcceptance(4, 12, 6).acceptance_length == 2.5
    assert DraftAcceptance(0, 0, 0).acceptance_length == 1.0


def choice_stream(responses: list[GenerationResponse]) -> ChoiceStream:
    async def stream() -> AsyncGenerator[GenerationResponse, None]:
        for response in responses:
            yield response

    req: Any = SimpleNamespace(stops=[], include_stop_str_in_output=False, max_tokens=8, prompt_logprobs=None)
    route: Any = SimpleNamespace(tokenizer=None)
    return ChoiceStream(route, GenerationRequest(prompt="hi", max_tokens=8), req, responses=stream)


def test_the_choice_keeps_the_last_counts_and_usage_sums_the_choices() -> None:
    first = choice_stream([GenerationResponse(texts=("a",), draft_acceptance=DraftAcceptance(1, 3, 2)),
                           GenerationResponse(texts=("b",), draft_acceptance=DraftAcceptance(2, 6, 2)),
                           GenerationResponse(texts=("c",))])
    plain = choice_stream([GenerationResponse(texts=("a",))])

    async def drain(stream: ChoiceStream) -> str:
        return "".join([chunk.text async for chunk in stream.chunks()])

    assert asyncio.run(drain(first)) == "abc" and asyncio.run(drain(plain)) == "a"
    assert (first.draft_acceptance, plain.draft_acceptance) == (DraftAcceptance(2, 6, 2), None)
    usage = speculative_usage([DraftAcceptance(2, 6, 2), DraftAcceptance(1, 3, 3)])
    assert usage == {"drafts": 3, "draft_tokens": 9, "accepted_tokens": 5, "acceptance_length": round(1 + 5 / 3, 4)}
    assert speculative_usage([]) is None


def test_the_openai_client_keeps_the_extension() -> None:
    body = {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12,
            "speculative": speculative_usage([DraftAcceptance(4, 12, 6)])}
    usage = CompletionUsage.model_validate(body)
    assert usage.completion_tokens == 9
    assert usage.model_extra == {"speculative": {"drafts": 4, "draft_tokens": 12, "accepted_tokens": 6,
                                                 "acceptance_length": 2.5}}


def test_bench_reads_the_usage_chunk_and_reports_the_acceptance_length() -> None:
    records = []
    for n, speculative in enumerate([{"drafts": 4, "draft_tokens": 12, "accepted_tokens": 6}, None]):
        record = RequestRecord(f"r{n}", isl=3, osl_requested=2, t_send_ns=0, t_end_ns=10**9)
        OpenAIStreamClient._read({"choices": [{"text": "ab"}]}, record, 10**8)
        usage = {"prompt_tokens": 3, "completion_tokens": 2, **({} if speculative is None else
                                                                {"speculative": speculative})}
        OpenAIStreamClient._read({"choices": [], "usage": usage}, record, 2 * 10**8)
        records.append(record)
    assert records[0].server == {"prompt_tokens": 3, "drafts": 4, "draft_tokens": 12, "accepted_tokens": 6}
    summary = summarize(records)
    assert summary["speculative"] == {"num_requests": 1, "drafts": 4, "draft_tokens": 12, "accepted_tokens": 6,
                                      "acceptance_length": 2.5}
    assert "speculative" not in summarize(records[1:])


def test_bench_compare_of_a_build_without_speculation_gives_the_speedup() -> None:
    def level(tok_per_s: float, acceptance_length: float | None) -> dict[str, Any]:
        run: dict[str, Any] = {"output_tok_per_s": tok_per_s, "request_per_s": 1.0,
                               **{name: {"p50": 10.0} for name in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")}}
        if acceptance_length is not None:
            run["speculative"] = {"acceptance_length": acceptance_length}
        return across_repeats([run, run])

    with_speculation = level(30.0, 2.5)
    assert with_speculation["speculative_acceptance_length"]["mean"] == 2.5
    without = level(20.0, None)
    assert "speculative_acceptance_length" not in without
    deltas = compare({"levels": {"1": without}}, {"levels": {"1": with_speculation}}).deltas
    assert [d.change for d in deltas if d.metric == "output_tok_per_s"] == [0.5]  # 1.5x
