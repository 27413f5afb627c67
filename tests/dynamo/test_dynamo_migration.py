"""The continuation of a migrated request: the workers' ledger of prompt lengths, and the settings that continue
exactly on the longer prompt or are refused in one sentence."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from trtllm_kit.llmapi.cpu_llm import GuidedDecodingParams, SamplingParams
from trtllm_kit.serve.dynamo.migration import Ledger, MigrationRefused, continuation
from trtllm_kit.serve.dynamo.request import PARAMS
from trtllm_kit.wire import GenerationRequest
from trtllm_kit.wire.fields import rows


def test_the_ledger_tells_a_migrated_request_by_its_id(tmp_path: Path) -> None:
    first, second = Ledger(tmp_path), Ledger(tmp_path)  # two workers of one serve
    assert first.begin("5f0c-1", 6) == 6
    assert second.begin("5f0c-1", 26) == 6  # the same request, 20 tokens in, on another worker
    second.end("5f0c-1")
    assert list(tmp_path.iterdir()) == []
    assert second.begin("5f0c-1", 26) == 26  # ended: a new request under that id starts afresh
    assert Ledger(tmp_path).begin("../escape", 4) == 4 and not (tmp_path.parent / "escape").exists()


def test_the_prompts_logprobs_are_not_asked_again() -> None:
    continued = continuation(SamplingParams(max_tokens=10, logprobs=2, prompt_logprobs=2), 20)
    assert (continued.prompt_logprobs, continued.logprobs) == (None, 2)  # the first chunk carried them


def test_min_tokens_continue_reduced_by_the_tokens_generated() -> None:
    assert continuation(SamplingParams(max_tokens=280, min_tokens=300), 20).min_tokens == 280
    assert continuation(SamplingParams(max_tokens=10, min_tokens=5), 20).min_tokens == 0


@pytest.mark.parametrize("sampling", [
    SamplingParams(temperature=0.0, seed=4), SamplingParams(temperature=0.8, top_k=1, seed=4),
    SamplingParams(temperature=0.8), SamplingParams(temperature=0.0, repetition_penalty=1.3),
])
def test_what_continues_exactly_is_unchanged(sampling: SamplingParams) -> None:
    assert continuation(sampling, 20) == sampling


@pytest.mark.parametrize("sampling, message", [
    (SamplingParams(temperature=0.8, seed=4), "the request lost its worker 20 tokens in and is not migrated: "
     "sampling_options.seed is 4, whose random stream another worker cannot resume; send it again, or without a "
     "seed to let it migrate."),
    (SamplingParams(temperature=0.0, presence_penalty=0.5), "the request lost its worker 20 tokens in and is not "
     "migrated: sampling_options.presence_penalty is 0.5, which counts output tokens another worker sees as prompt; "
     "send it again."),
    (SamplingParams(frequency_penalty=-0.25), "the request lost its worker 20 tokens in and is not migrated: "
     "sampling_options.frequency_penalty is -0.25, which counts"),
    (SamplingParams(guided_decoding=GuidedDecodingParams(regex="[a-z]+")), "the request lost its worker 20 tokens "
     "in and is not migrated: sampling_options.guided_decoding is set, whose grammar another worker would start "
     "again; send it again."),
])
def test_what_would_differ_is_refused(sampling: SamplingParams, message: str) -> None:
    with pytest.raises(MigrationRefused) as caught:
        continuation(sampling, 20)
    assert str(caught.value).startswith(message)


def test_each_rule_of_a_row_names_a_field_of_the_llm_apis_sampling_params() -> None:
    moved = {PARAMS[row.name]: row.wire.migration.rule for row in rows(GenerationRequest) if row.wire.migration}
    assert moved == {"seed": "refused", "min_tokens": "reduced", "presence_penalty": "refused",
                     "frequency_penalty": "refused", "prompt_logprobs": "dropped", "guided_decoding": "refused"}
    assert set(moved) <= {f.name for f in fields(SamplingParams)}
