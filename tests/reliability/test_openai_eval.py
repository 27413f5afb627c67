"""The OpenAI fields evaluation and benchmark clients send, against a served tiny model: stop strings beyond four
and ``include_stop_str_in_output``, the sampling extras."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from serving_helpers import MODEL

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def client(state: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{state['openai']}/v1", api_key="none", max_retries=0)


def greedy(state: dict[str, Any], **fields: Any) -> str:
    extra = {k: fields.pop(k) for k in list(fields) if k not in ("stop", "max_tokens", "seed", "temperature")}
    answer = client(state).completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24,
                                              temperature=0, extra_body=extra, **fields)
    return answer.choices[0].text


def test_many_stop_strings_and_the_stop_string_shown(served: dict[str, Any]) -> None:
    text = greedy(served)
    stop = text[6:9]
    cut = text.find(stop)
    others = [f"never-{i}" for i in range(20)]
    assert greedy(served, stop=[*others, stop]) == text[:cut]
    assert greedy(served, stop=[*others, stop], include_stop_str_in_output=True) == text[:cut + len(stop)]


def sampled(state: dict[str, Any], **extra: Any) -> str:
    answer = client(state).completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=1.0,
                                              seed=7, extra_body=extra)
    return answer.choices[0].text


def test_sampling_extras_reach_the_engine(served: dict[str, Any]) -> None:
    text = greedy(served)
    assert sampled(served, top_k=1) == text and sampled(served, min_p=1.0) == text  # both keep the top token only
    assert sampled(served) != text  # so sampling at temperature 1 differs without them
    assert greedy(served, repetition_penalty=2.0) != text
    assert greedy(served, frequency_penalty=2.0) != text
    assert greedy(served, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, top_k=-1) == text


@pytest.mark.parametrize(("field", "value", "message"), [
    ("min_p", 1.5, "min_p must be in [0, 1], got 1.5."),
    ("repetition_penalty", -1, "repetition_penalty must be greater than 0 (1 = off), got -1.0."),
    ("top_k", "5", "top_k must be an integer, got '5'."),
])
def test_an_extra_out_of_range_is_a_400_naming_it(served: dict[str, Any], field: str, value: Any,
                                                  message: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        greedy(served, **{field: value})
    assert info.value.body == {"message": message, "type": "invalid_request_error", "param": field, "code": None}
