"""One request's fan-out against a real tritonserver and OpenAI frontend (the cpu target): a neighbour is answered
within a few engine steps while another request's 16 choices fill the batch; 64 prompts with ``n``, ``best_of`` or
``echo`` are answered whole while a neighbour sent meanwhile is answered too; a 429 comes only when the queue is
full of other requests, and the same request succeeds once it drains; a response that could hold more logprob
entries than the bound is a 400 naming the field.

Before the fix: the neighbour waited until the first eight choices had made all their tokens (22.5 s of 22.7 s
with n 16, top_logprobs 20 and 500 tokens); every 64-prompt request with n 2 was a 429 ("retry after 1 s") that
no retry could turn into an answer; n 16 x 500 tokens x top_logprobs 20 returned 13 MB.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from serving_helpers import MODEL, counters, open_stream, post, wait_idle

pytestmark = [pytest.mark.integration, pytest.mark.slow]
NEIGHBOUR = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
PROMPTS = [f"Prompt number {i}:" for i in range(64)]  # the most one request may hold
HANG_GUARD_S = 300  # generous: a loaded machine is slow, a wedged server never answers


def completion(state: dict[str, Any], body: dict[str, Any], path: str = "/v1/completions") -> tuple[int, dict]:
    """POST ``body``; its status and JSON body with its ``headers`` (a stream: its ``events``)."""
    status, headers, raw = post(f"http://{state['openai']}{path}", json.dumps(body).encode())
    if headers.get("Content-Type", "").startswith("text/event-stream"):
        lines = [line[len("data: "):] for line in raw.decode().split("\n\n") if line.startswith("data: ")]
        return status, {"events": [json.loads(line) for line in lines if line != "[DONE]"],
                        "done": lines[-1:] == ["[DONE]"], "headers": headers}
    return status, {**json.loads(raw), "headers": headers}


def wait_for(state: dict[str, Any], ready: Any, timeout_s: float = HANG_GUARD_S) -> dict[str, float]:
    """Poll the engine's counters until ``ready(counters)`` holds; fails after ``timeout_s``."""
    started = time.perf_counter()
    while not ready(now := counters(state)):
        assert time.perf_counter() - started < timeout_s, now
        time.sleep(0.02)
    return now


class Background(threading.Thread):
    """A completion request in a thread: its status and body once it ends."""

    def __init__(self, state: dict[str, Any], body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.state, self.body = state, body
        self.answer: tuple[int, dict] | None = None

    def run(self) -> None:
        self.answer = completion(self.state, self.body)

    def result(self) -> tuple[int, dict]:
        self.join(HANG_GUARD_S)
        assert self.answer is not None, "no answer in time"
        return self.answer


def test_a_neighbour_is_answered_within_a_few_steps_while_sixteen_choices_fill_the_batch(served):
    wait_idle(served, 60)
    big = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story."}], "n": 16,
           "max_tokens": 900, "temperature": 1.0, "ignore_eos": True, "stream": True}
    sock = open_stream(served, big, num_events=40, path="/v1/chat/completions")  # its choices are generating
    try:
        before = counters(served)
        assert before["active"] == 8  # the batch is full of its choices
        status, answer = completion(served, NEIGHBOUR)
        after = counters(served)
        assert status == 200 and answer["usage"]["completion_tokens"] == 4, answer
        # the neighbour needs 4 steps; it used to wait until the first 8 choices made their 900 tokens
        assert after["steps"] - before["steps"] < 450, (before, after)
        assert after["active"] > 0  # answered while the big request still runs
    finally:
        sock.close()  # the client leaves: its choices are cancelled
    wait_idle(served, 60)


@pytest.mark.parametrize("fields", [{"n": 2}, {"best_of": 2}, {"echo": True}, {"n": 2, "stream": True}],
                         ids=["n", "best_of", "echo", "n-streamed"])
def test_sixty_four_prompts_are_answered_whole_and_a_neighbour_sent_meanwhile_too(served, fields):
    wait_idle(served, 60)
    big = Background(served, {"model": MODEL, "prompt": PROMPTS, "max_tokens": 16, "temperature": 1.0, **fields})
    big.start()
    wait_for(served, lambda now: now["active"] > 0 or not big.is_alive())
    status, answer = completion(served, NEIGHBOUR)
    assert status == 200, answer
    status, answer = big.result()
    assert status == 200, str(answer)[:300]
    if fields.get("stream"):
        assert answer["done"] and not any("error" in event for event in answer["events"])
        choices = [c for event in answer["events"] for c in event["choices"] if c["finish_reason"] is not None]
    else:
        choices = answer["choices"]
    assert sorted(c["index"] for c in choices) == list(range(64 * fields.get("n", 1)))
    assert all(c["finish_reason"] in ("length", "stop") for c in choices)
    if fields.get("echo"):
        assert all(c["text"].startswith(PROMPTS[c["index"]]) for c in choices)


def test_a_full_queue_is_a_429_only_when_a_retry_succeeds(served):
    wait_idle(served, 60)
    others = [Background(served, {**NEIGHBOUR, "max_tokens": 100, "ignore_eos": True}) for _ in range(48)]
    for other in others:
        other.start()
    # every other request running, queued (8 run, 32 queue) or already answered (refused when the queue was full)
    wait_for(served, lambda now: now["active"] + now["waiting"] + sum(o.answer is not None for o in others) >= 48)
    request = {"model": MODEL, "prompt": PROMPTS, "n": 2, "max_tokens": 8}
    status, answer = completion(served, request)
    assert status in (200, 429), answer
    if status == 429:
        assert answer["error"]["code"] == "queue_full" and answer["headers"]["Retry-After"] == "1"
    outcomes = [other.result()[0] for other in others]
    assert set(outcomes) <= {200, 429}
    wait_idle(served, HANG_GUARD_S)
    status, answer = completion(served, request)  # the same request once the others are done
    assert status == 200, answer
    assert len(answer["choices"]) == 128


def test_a_response_of_too_many_logprob_entries_is_a_400_naming_the_field(served):
    big = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}], "n": 16,
           "logprobs": True, "top_logprobs": 20, "max_tokens": 500, "ignore_eos": True}
    status, answer = completion(served, big, "/v1/chat/completions")
    assert status == 400, str(answer)[:300]
    error = answer["error"]
    assert error["param"] == "top_logprobs"
    assert "168000 logprob entries" in error["message"] and "131072" in error["message"]
    echoed = {"model": MODEL, "prompt": ["word " * 200] * 8, "n": 16, "echo": True, "logprobs": 5, "max_tokens": 1}
    status, answer = completion(served, echoed)  # the echoed prompts' tokens count: 16 x 8 x ~201 x 6
    assert status == 400 and answer["error"]["param"] == "logprobs", str(answer)[:300]
    best = {"model": MODEL, "prompt": ["Hello"] * 2, "best_of": 16, "logprobs": 5, "max_tokens": 1000}
    status, answer = completion(served, best)  # best_of's sequences are all held: 16 x 2000 x 6
    assert status == 400 and "192000 logprob entries" in answer["error"]["message"], str(answer)[:300]
    status, answer = completion(served, {**echoed, "n": 2})  # within the bound: answered
    assert status == 200 and len(answer["choices"]) == 16, str(answer)[:300]
