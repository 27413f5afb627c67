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
