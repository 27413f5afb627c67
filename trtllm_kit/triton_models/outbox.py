"""The ``tensorrt_llm`` model's calls to tritonserver that answer requests, made off the engine thread.

A response sender's ``send`` waits until tritonserver has handed the response on (to the ensemble, the BLS or the
frontend), and a request's ``is_cancelled`` until tritonserver has answered: in the python backend both are
messages to the server process that the calling thread waits for (``ResponseSender::Send``, ``PbCancel::
IsCancelled``), with the GIL released. The engine thread puts them in the ``Outbox`` instead and steps on; the
outbox's thread makes them one at a time in the order they were put, so a request's responses keep their order and
its final response comes last. The outbox holds at most ``max_pending`` calls: a put beyond waits for the oldest to be
made, so that an engine faster than tritonserver takes its responses steps at their pace, rather than running ahead
with tokens no client has yet (and that a cancelled request never gets).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


class Outbox:
    """A thread that runs calls in the order they were put, at most ``max_pending`` of them waiting.

    Arguments:
        name: the thread's name; max_pending: how many calls may wait to be made before a put waits.
    """

    def __init__(self, name: str = "trtllm-kit-outbox", max_pending: int = 64) -> None:
        self._calls: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=max_pending)  # None: stop
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, call: Callable[[], None]) -> None:
        """Run ``call`` on the outbox's thread after the calls already put (waiting while ``max_pending`` wait);
        what it raises is logged.

        Arguments:
            call: what to run (a response's send, a cancellation check).
        """
        self._calls.put(call)

    def close(self, timeout_s: float = 30) -> None:
        """Make the calls already put, then stop the thread (left behind, a daemon, when they take longer than
        ``timeout_s``).

        Arguments:
            timeout_s: how long to wait for them.
        """
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(queue.Full):
            self._calls.put(None, timeout=timeout_s)
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            try:
                call()
            except Exception:  # the call's owner learns of it its own way; the outbox goes on
                logger.exception("a call to tritonserver failed")
