"""Logprobs through Dynamo's frontend, as the kit's client asks for and reads them: tokens named by id, the worker's
alternatives first, the token's logprob at full precision, more alternatives than the frontend's bound asked for
in the kit's annotation, the prompt's in the first chunk's engine data. Answers are shaped as Dynamo 1.6's frontend
answered the kit's worker (observed)."""

from __future__ import annotations

from typing import Any

import pytest

from trtllm_kit.serve.dynamo.frontend_client import chunk_response, completion_body, is_whole, refusal
from trtllm_kit.serve.dynamo.logprobs import LOGPROBS_ANNOTATION, PROMPT_LOGPROBS_ANNOTATION, scored_tokens
from trtllm_kit.serve.dynamo.request import response_chunk
from trtllm_kit.serve.generation import GenerationError
from trtllm_kit.wire import GenerationRequest

# one streamed chunk of Dynamo's frontend for ``logprobs`` 2 with return_tokens_as_token_ids (observed): the
# worker sent alternatives 200 and 100 for token 450, which the frontend appended; token_logprobs in float32 digits
STREAMED = {"id": "cmpl-1", "choices": [{"text": " are", "index": 0, "logprobs": {
    "tokens": ["token_id:450"], "token_logprobs": [-0.1],
    "top_logprobs": [{"token_id:200": -0.10000000149011612, "token_id:100": -2.0,
                      "token_id:450": -0.10000000149011612}],
    "text_offset": []}}], "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


def _logprobs(tokens: list[str], values: list[float], tops: list[dict[str, float]]) -> dict[str, Any]:
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": []}


def test_a_streamed_chunk_is_read_as_token_ids_and_their_scores() -> None:
    response = chunk_response(STREAMED, 2)
    assert response is not None
    assert response.token_ids == (450,) and response.texts == ()  # the kit's frontend decodes the ids itself
    assert response.scored == ((450, -0.10000000149011612, ((200, -0.10000000149011612), (100, -2.0))),)
    assert response.num_top == 2


def test_without_logprobs_a_chunk_is_read_as_text() -> None:
    response = chunk_response(STREAMED)
    assert response is not None and response.texts == (" are",) and response.token_ids == ()
    assert response.scored is None and response.num_output_tokens == 1


def test_a_chunk_of_usage_alone_carries_no_tokens() -> None:
    assert chunk_response({"choices": [], "usage": STREAMED["usage"]}, 2) is None


def test_a_token_among_its_alternatives_keeps_their_order() -> None:
    scored = scored_tokens(_logprobs(["token_id:7", "token_id:9"], [-0.5, -3.0],
                                     [{"token_id:7": -0.5, "token_id:8": -1.5},
                                      {"token_id:4": -1.0, "token_id:5": -2.0, "token_id:9": -3.0}]), 2)
    assert scored == ((7, -0.5, ((7, -0.5), (8, -1.5))), (9, -3.0, ((4, -1.0), (5, -2.0))))


def test_no_alternatives_asked_leaves_the_appended_token_out() -> None:
    assert scored_tokens(_logprobs(["token_id:7"], [-0.5], [{"token_id:7": -0.5}]), 0) == ((7, -0.5, ()),)


@pytest.mark.parametrize("token", [" are", "token_id:", "token_id:-3"])
def test_a_token_named_by_text_is_an_error(token: str) -> None:
    with pytest.raises(GenerationError) as caught:
        scored_tokens(_logprobs([token], [-0.5], [{}]), 0)
    assert str(caught.value) == (f"Dynamo's frontend named a logprobs token {token!r}, not token_id:N; run an "
                                 "ai-dynamo that honours return_tokens_as_token_ids.")
    assert caught.value.status == 502


def test_logprobs_of_unequal_lengths_are_an_error() -> None:
    with pytest.raises(GenerationError, match="scored 2 tokens with 1 logprobs and 2 top_logprobs"):
        scored_tokens(_logprobs(["token_id:1", "token_id:2"], [-0.5], [{}, {}]), 0)


@pytest.mark.parametrize("num_top, sent", [(0, 0), (5, 5), (20, 5)])
def test_logprobs_are_asked_by_id_and_beyond_the_frontends_bound_by_annotation(num_top: int, sent: int) -> None:
    body = completion_body("tiny", GenerationRequest((1, 2, 3), 4, logprobs=num_top))
    assert (body["logprobs"], body["return_tokens_as_token_ids"]) == (sent, True)
    assert body["nvext"] == {"annotations": [f"{LOGPROBS_ANNOTATION}{num_top}"]}
    plain = completion_body("tiny", GenerationRequest((1, 2, 3), 4))
    assert not {"logprobs", "return_tokens_as_token_ids", "nvext"} & set(plain)


def test_the_prompts_logprobs_are_asked_by_annotation_streamed_with_the_engine_data() -> None:
    req = GenerationRequest((1, 2, 3), 4, logprobs=2, prompt_logprobs=2, streaming=False)
    body = completion_body("tiny", req)
    assert body["nvext"] == {"annotations": [f"{LOGPROBS_ANNOTATION}2", f"{PROMPT_LOGPROBS_ANNOTATION}2"],
                             "extra_fields": ["engine_data"]}
    assert not is_whole(req) and body["stream"] is True  # the prompt's logprobs come with the first chunk
    assert refusal(req) is None


def test_the_first_chunk_carries_the_prompts_logprobs_as_the_worker_sent_them() -> None:
    prompt = ((1, None, ()), (5, -2.5, ((7, -0.5), (5, -2.5))))
    sent = response_chunk([450], None, 2, 1, ((450, -0.1, ()),), prompt)
    event = {**STREAMED, "nvext": {"engine_data": sent["engine_data"]}}  # as the frontend passes it on
    response = chunk_response(event, 2)
    assert response is not None and response.prompt_scored == prompt
    assert response.token_ids == (450,)
    assert chunk_response(STREAMED, 2).prompt_scored is None  # type: ignore[union-attr]


def test_prompt_logprobs_without_logprobs_are_refused() -> None:
    assert refusal(GenerationRequest((1, 2, 3), 4, prompt_logprobs=1)) == (
        "prompt_logprobs is 1 without logprobs; serve --dynamo's workers score a prompt only with its answer: set "
        "logprobs too, or serve without --dynamo.")
