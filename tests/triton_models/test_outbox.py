"""The tensorrt_llm model's outbox: its calls run off the caller's thread, in the order they were put, a failing one
logged and the rest still made; a put waits while ``max_pending`` calls wait; ``close`` makes the calls already put
before it returns, and returns after its timeout when a call hangs."""

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


def test_a_put_beyond_max_pending_waits_until_the_oldest_is_made() -> None:
    started, release, made = threading.Event(), threading.Event(), []

    def held() -> None:
        started.set()
        made.append(release.wait(30))

    outbox = Outbox(max_pending=2)
    outbox.put(held)
    assert started.wait(30)  # being made: the outbox thread waits in it
    outbox.put(lambda: made.append(True))
    outbox.put(lambda: made.append(True))  # two waiting: the most there may be
    third = threading.Thread(target=outbox.put, args=(lambda: made.append(True),))
    third.start()
    third.join(0.5)
    assert third.is_alive() and made == []  # the put waits for the blocked call
    release.set()
    third.join(30)
    outbox.close()
    assert not third.is_alive() and made == [True] * 4


def test_close_returns_after_its_timeout_when_a_call_hangs() -> None:
    started, release, made = threading.Event(), threading.Event(), []

    def hangs() -> None:
        started.set()
        release.wait(30)

    outbox = Outbox(max_pending=1)
    outbox.put(hangs)
    assert started.wait(30)
    outbox.put(lambda: made.append(True))  # the queue is full behind the hanging call
    outbox.close(timeout_s=0.2)
    assert made == []  # close returned without waiting for the hanging call
    release.set()
