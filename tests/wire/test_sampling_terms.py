"""vLLM's and the LLM API's sampling fields in the wire's terms, and a request cut to fewer tokens: what the OpenAI
parse, the llmapi model and the CPU LLM class share (``wire/request.py``)."""

from __future__ import annotations

import pytest

from trtllm_kit.runtime.sequence import SamplingParams
from trtllm_kit.wire import GenerationRequest
from trtllm_kit.wire.request import MIN_TEMPERATURE, greedy_settings, sampled_settings


@pytest.mark.parametrize(("given", "said"), [
    ({"temperature": 0.0, "top_p": 0.5, "top_k": 8, "seed": 3}, {"top_k": 1, "seed": 3}),
    ({"temperature": MIN_TEMPERATURE / 2}, {"top_k": 1}),
    ({"temperature": MIN_TEMPERATURE}, {"temperature": MIN_TEMPERATURE, "top_p": 1.0}),
    ({"temperature": 0.7, "top_k": 4}, {"temperature": 0.7, "top_k": 4, "top_p": 1.0}),
    ({"temperature": 0.7, "top_p": 0.9}, {"temperature": 0.7, "top_p": 0.9}),
    ({"temperature": None, "top_p": None, "top_k": None}, {"temperature": None, "top_p": None, "top_k": None}),
])
def test_a_temperature_is_said_in_the_wires_terms(given: dict, said: dict) -> None:
    assert sampled_settings(dict(given)) == said


def test_the_wires_terms_run_as_the_llm_api_means_them() -> None:
    """Without top_p a temperature samples (the wire's top_p 0 with top_k 0 would be greedy); 0 is greedy."""
    assert SamplingParams(temperature=0.7).is_greedy  # in the wire's own terms
    assert not SamplingParams(**sampled_settings({"temperature": 0.7})).is_greedy
    assert SamplingParams(**sampled_settings({"temperature": 0.0, "top_p": 0.3})).is_greedy


def test_greedy_settings_leave_a_sampling_temperature_as_it_is() -> None:
    kwargs = {"temperature": 0.5, "top_k": 3}
    assert greedy_settings(kwargs) is kwargs and kwargs == {"temperature": 0.5, "top_k": 3}


@pytest.mark.parametrize(("min_tokens", "cut"), [(None, None), (0, 0), (1, 1), (5, 1)])
def test_a_request_cut_to_one_token_keeps_min_tokens_within_it(min_tokens: int | None, cut: int | None) -> None:
    req = GenerationRequest((1, 2), 8, min_tokens=min_tokens, seed=4)
    one = req.with_max_tokens(1)
    assert (one.max_tokens, one.min_tokens, one.seed, one.prompt) == (1, cut, 4, (1, 2))
    params = SamplingParams(max_tokens=8, min_tokens=min_tokens or 0, seed=4).with_max_tokens(1)
    assert (params.max_tokens, params.min_tokens, params.seed) == (1, min(min_tokens or 0, 1), 4)
