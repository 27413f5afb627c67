"""The CPU ``tensorrt_llm`` model's request handle: its responses are sent by the outbox, which asks tritonserver
after each whether the request was cancelled, so the engine thread's ``is_cancelled`` asks only for a request the
outbox has not asked about since the loop last looked, at most every ``ASK_PERIOD_S``. tritonserver's request and
sender are stand-ins recording the calls (the real ones exist only in a Python-backend stub; the served path is
tests/reliability/test_serve_cancel.py and tests/integration/test_tensorrt_llm_cpu.py)."""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from trtllm_kit.model_repo.repository import python_source
from trtllm_kit.triton_models.outbox import Outbox

FINAL = 1


class Request:
    """tritonserver's request as the handle calls it: counts ``is_cancelled`` and on which thread."""

    def __init__(self) -> None:
        self.cancelled = False
        self.asked_on: list[str] = []  # the threads that asked

    def is_cancelled(self) -> bool:
        self.asked_on.append(threading.current_thread().name)
        return self.cancelled


class Sender:
    def __init__(self, failing: bool = False) -> None:
        self.sent: list[tuple[Any, int]] = []
        self.failing = failing

    def send(self, response: Any, flags: int = 0) -> None:
        if self.failing:
            raise RuntimeError("the response factory is gone")
        self.sent.append((response, flags))


@pytest.fixture
def cpu_model(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils",
                        SimpleNamespace(TRITONSERVER_RESPONSE_COMPLETE_FINAL=FINAL))
    spec = importlib.util.spec_from_file_location("cpu_model_under_test", python_source("tensorrt_llm_cpu.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def handle_of(cpu_model: Any, request: Request, sender: Sender, outbox: Outbox) -> Any:
    model = SimpleNamespace(parameters=SimpleNamespace(exclude_input=True), outbox=outbox)
    return cpu_model._Request(model, request, sender)


def test_the_outbox_sends_in_order_and_asks_after_each_response_but_the_final(cpu_model: Any) -> None:
    request, sender, outbox = Request(), Sender(), Outbox(name="outbox-under-test")
    handle = handle_of(cpu_model, request, sender, outbox)
    assert handle.is_cancelled() is False  # never asked: the engine thread asks at once
    assert request.asked_on == [threading.current_thread().name]
    for token in ("a", "b"):
        handle._send(token, 0)
    handle.answer("end")
    outbox.close()
    assert sender.sent == [("a", 0), ("b", 0), ("end", FINAL)]
    assert request.asked_on[1:] == ["outbox-under-test"] * 2


def test_the_engine_thread_asks_only_when_the_outbox_has_not_since_it_last_looked(cpu_model: Any) -> None:
    request, outbox = Request(), Outbox()
    handle = handle_of(cpu_model, request, Sender(), outbox)
    handle.is_cancelled()
    assert len(request.asked_on) == 1
    handle.is_cancelled()  # asked within ASK_PERIOD_S
    assert len(request.asked_on) == 1
    request.cancelled = True
    handle._send("a", 0)
    outbox.close()  # the outbox asked after the response and learnt of the cancellation
    assert len(request.asked_on) == 2
    assert handle.is_cancelled() is True
    assert len(request.asked_on) == 2  # the outbox's answer, not a new question


def test_a_request_without_responses_is_asked_again_after_the_period(cpu_model: Any) -> None:
    request, outbox = Request(), Outbox()
    handle = handle_of(cpu_model, request, Sender(), outbox)
    assert handle.is_cancelled() is False
    request.cancelled = True  # the client leaves while the prompt is computed: no response goes out
    deadline = time.monotonic() + 10
    while not handle.is_cancelled():
        assert time.monotonic() < deadline, "the engine thread never asked again"
        time.sleep(cpu_model.ASK_PERIOD_S / 4)
    assert len(request.asked_on) == 2
    outbox.close()


def test_a_send_that_failed_on_the_outbox_fails_the_next(cpu_model: Any) -> None:
    outbox = Outbox()
    handle = handle_of(cpu_model, Request(), Sender(failing=True), outbox)
    handle._send("a", 0)
    outbox.close()
    with pytest.raises(RuntimeError, match=r"^the response factory is gone$"):  # the loop ends the request
        handle._send("b", 0)
