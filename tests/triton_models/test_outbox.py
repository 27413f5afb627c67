"""The tensorrt_llm model's outbox: its calls run off the caller's thread, in the order they were put, a failing one
logged and the rest still made; ``close`` makes the calls already put before it returns."""

from __future__ import annotations

import logging
import threading

import pytest

from trtllm_kit.triton_models.outbox import Outbox


def test_calls_run_in_order_on_the_outbox_thread_and_close_drains_them() -> None:
    made: list[tuple[int, str]] = []
    outbox = Outbox(name="outbox-under-test")
    for i in range(200):
        outbox.put(lambda i=i: made.append((i, threading.current_thread().name)))
    outbox.close()
    assert [i for i, _ in made] == list(range(200))
    assert {name for _, name in made} == {"outbox-under-test"}


def test_a_call_that_raises_is_logged_and_the_next_ones_are_made(caplog: pytest.LogCaptureFixture) -> None:
    made: list[int] = []

    def fail() -> None:
        raise RuntimeError("the response factory is gone")

    outbox = Outbox()
    with caplog.at_level(logging.ERROR, logger="trtllm_kit.triton_models.outbox"):
        outbox.put(lambda: made.append(1))
        outbox.put(fail)
        outbox.put(lambda: made.append(2))
        outbox.close()
    assert made == [1, 2]
    assert "the response factory is gone" in caplog.text


def test_put_returns_before_the_call_is_made() -> None:
    release = threading.Event()
    waited: list[bool] = []
    outbox = Outbox()
    outbox.put(lambda: waited.append(release.wait(30)))  # a put that waited for its call would time this out
    release.set()
    outbox.close()
    assert waited == [True]
