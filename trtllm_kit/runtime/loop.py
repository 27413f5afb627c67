"""The one loop around the CPU runtime's ``Executor``: its thread, its inbox, the requests it holds.

Everything that touches the engine runs on the loop's thread; other threads talk to it through the inbox:
``submit`` (a request and its ``Handle``), ``cancel`` (its owner's abort: the sequences end with finish reason
``cancelled`` and reach ``progress``), ``stop_request_id`` (a Triton stop request: the running requests of that
id fail as cancelled), ``release`` (a held context-only sequence's blocks) and ``call`` (any function). Each turn
takes what the inbox holds (waiting ``idle_timeout(num_active)`` seconds when the engine has nothing to do: None
waits for the next message), asks every active handle whether its client has gone, steps the engine once and hands
each sampled or finished sequence to its handle, then ``on_step(engine.stats())``; every turn ends with ``on_turn``
and the heartbeat's beat.

A request ends once, through its handle: its last sequence's ``progress(seq, is_last=True)``, or ``failed``:
a refused submission (``failure_of`` the exception), a sequence the engine could not run (``seq.error``,
invalid), a step that raised (every active request, with one message, internal), a client that left or a stop
request (cancelled), ``shutdown`` (its reason, unavailable; the queued submissions too).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trtllm_kit.runtime.handle import Failure, Handle, failure_of
from trtllm_kit.runtime.heartbeat import Heartbeat

if TYPE_CHECKING:
    from trtllm_kit.runtime.executor import Executor
    from trtllm_kit.runtime.kv_transfer import KvBlocks
    from trtllm_kit.runtime.lora import AdapterWeights
    from trtllm_kit.runtime.sequence import SamplingParams, Sequence
    from trtllm_kit.runtime.stats import ExecutorStats

logger = logging.getLogger(__name__)
CANCELLED = "the request was cancelled"
STOPPED = "the request was stopped"


def poll_while_active(num_active: int) -> float | None:
    """The Triton models' idle wait: 50 ms while requests are held (their clients may leave), else until a message.

    Arguments:
        num_active: requests the loop holds.
    """
    return 0.05 if num_active else None


@dataclass
class Submission:
    """A request on its way to the engine, as ``Executor.add_request`` takes it."""

    handle: Handle
    prompt_ids: list[int]
    params: SamplingParams
    lora: AdapterWeights | None = None
    hold_kv: bool = False
    prefilled: tuple[list[int], KvBlocks] | None = None
    request_id: str = ""  # what a stop request names ("": none)


@dataclass
class _Active:
    submission: Submission
    group: list[Sequence]


class EngineLoop:
    """The engine thread and the requests it holds.

    Arguments:
        engine: the engine it alone touches; idle_timeout: seconds to wait for a message when the engine has no
        work, given the number of active requests (None: until one comes); on_turn: run at the end of every turn
        (gauges, expiring KV offers); on_step: given the engine's stats after each step; name: the thread's name.
    """

    def __init__(self, engine: Executor, *, idle_timeout: Callable[[int], float | None] = poll_while_active,
                 on_turn: Callable[[], None] | None = None, on_step: Callable[[ExecutorStats], None] | None = None,
                 name: str = "trtllm-kit-engine") -> None:
        self.engine = engine
        self._idle_timeout, self._on_turn, self._on_step = idle_timeout, on_turn, on_step
        self._inbox: queue.Queue[Callable[[], None] | Submission | None] = queue.Queue()  # None: wake up
        self._active: dict[int, _Active] = {}  # seq_id → its request
        self._lock = threading.Lock()  # orders submissions against shutdown
        self._stopping = False
        self._reason, self._cancel_on_stop = "the server is shutting down", False
        self.heartbeat = Heartbeat()  # serve's watchdog: a loop that stops turning while it holds requests is hung
        self.heartbeat.beat(0)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, submission: Submission) -> None:
        """Queue a request; after ``shutdown`` it fails at once with the shutdown's reason.

        Arguments:
            submission: the request and its handle.
        """
        with self._lock:
            if not self._stopping:
                self._inbox.put(submission)
                return
        submission.handle.failed(self._reason, Failure.UNAVAILABLE)

    def cancel(self, handle: Handle) -> None:
        """End ``handle``'s request now: its sequences finish as ``cancelled`` and reach its ``progress``.

        Arguments:
            handle: a submitted request's handle (one already ended is left alone).
        """
        self.call(lambda: self._cancel(handle))

    def stop_request_id(self, request_id: str) -> None:
        """Fail the active requests submitted with ``request_id`` as cancelled ("the request was stopped").

        Arguments:
            request_id: the id a Triton stop request names ("" stops nothing).
        """
        self.call(lambda: self._stop(request_id))

    def release(self, seq: Sequence) -> None:
        """Free a held context-only sequence's blocks on the engine thread.

        Arguments:
            seq: a sequence submitted with ``hold_kv``.
        """
        self.call(lambda: self.engine.release(seq))

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the engine thread, after the messages already queued.

        Arguments:
            fn: what to run; it may touch the engine.
        """
        self._inbox.put(fn)

    def shutdown(self, reason: str, *, cancel_active: bool = False, timeout_s: float = 30) -> None:
        """Stop the thread; every active request fails with ``reason`` (unavailable), or with ``cancel_active``
        finishes as cancelled through ``progress``; queued and later submissions fail with ``reason``.

        Arguments:
            reason: the sentence a failed request carries; cancel_active: finish active requests as cancelled;
            timeout_s: how long to wait for the thread.
        """
        with self._lock:
            self._stopping, self._reason, self._cancel_on_stop = True, reason, cancel_active
        self._inbox.put(None)
        self._thread.join(timeout=timeout_s)

    @property
    def num_active(self) -> int:
        """Requests admitted and not yet ended."""
        return len({id(a) for a in self._active.values()})

    def _run(self) -> None:
        while not self._stopping:
            self._take_inbox()
            for active in self._requests():
                if active.submission.handle.is_cancelled():
                    self._end(active, CANCELLED, Failure.CANCELLED)
            if self.engine.has_work():
                self._step()
            if self._on_turn is not None:
                self._on_turn()
            self.heartbeat.beat(self.num_active + self._inbox.qsize())
        for active in self._requests():
            if self._cancel_on_stop:
                self._cancel(active.submission.handle)
            else:
                self._end(active, self._reason, Failure.UNAVAILABLE)
        while not self._inbox.empty():
            item = self._inbox.get_nowait()
            if isinstance(item, Submission):
                self._tell(item.handle, lambda h: h.failed(self._reason, Failure.UNAVAILABLE))

    def _take_inbox(self) -> None:
        timeout = 0 if self.engine.has_work() else self._idle_timeout(self.num_active)
        try:
            item = self._inbox.get_nowait() if timeout == 0 else self._inbox.get(timeout=timeout)
            while True:
                if isinstance(item, Submission):
                    self._admit(item)
                elif item is not None:
                    self._call(item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            pass

    def _step(self) -> None:
        try:
            sampled, finished = self.engine.step()
        except Exception as exc:  # a failing step must not leave clients waiting forever
            logger.error("CPU runtime step failed: %r", exc)
            for active in self._requests():
                self._end(active, f"the CPU runtime failed: {exc!r}", Failure.INTERNAL)
            return
        for seq in {s.seq_id: s for s in [*sampled, *finished]}.values():
            self._progress(seq)
        if self._on_step is not None:
            self._on_step(self.engine.stats())

    def _admit(self, submission: Submission) -> None:
        try:
            first = self.engine.add_request(submission.prompt_ids, submission.params, lora=submission.lora,
                                            hold_kv=submission.hold_kv, prefilled=submission.prefilled)
        except Exception as exc:  # a request that can never run ends at once with the reason
            message, kind = str(exc), failure_of(exc)
            self._tell(submission.handle, lambda h: h.failed(message, kind))
            return
        active = _Active(submission, first.group)
        for seq in first.group:
            self._active[seq.seq_id] = active
        if first.is_finished:  # a generation-only request its first tokens complete
            self._progress(first)

    def _progress(self, seq: Sequence) -> None:
        active = self._active.get(seq.seq_id)
        if active is None:
            return
        if seq.finish_reason == "error":  # this request alone could not run
            self._end(active, seq.error or "the request failed", Failure.INVALID)
            return
        if seq.is_finished:
            del self._active[seq.seq_id]
        is_last = seq.is_finished and not any(self._active.get(s.seq_id) is active for s in active.group)
        if not self._tell(active.submission.handle, lambda h: h.progress(seq, is_last)):
            self._end(active, "the response could not be sent", Failure.INTERNAL)

    def _cancel(self, handle: Handle) -> None:
        for active in self._requests():
            if active.submission.handle is handle:
                for seq in active.group:
                    self.engine.cancel(seq)
                for seq in active.group:
                    self._progress(seq)

    def _stop(self, request_id: str) -> None:
        for active in self._requests():
            if request_id and active.submission.request_id == request_id:
                self._end(active, STOPPED, Failure.CANCELLED)

    def _end(self, active: _Active, message: str, kind: Failure) -> None:
        """Cancel a request's sequences, forget it and tell its handle why."""
        for seq in active.group:
            self.engine.cancel(seq)
            self._active.pop(seq.seq_id, None)
        self._tell(active.submission.handle, lambda h: h.failed(message, kind))

    @staticmethod
    def _call(fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:  # a message's failure is its sender's; the loop goes on
            logger.exception("a call on the engine thread failed")

    def _requests(self) -> list[_Active]:
        return list({id(a): a for a in self._active.values()}.values())

    @staticmethod
    def _tell(handle: Handle, call: Callable[[Handle], None]) -> bool:
        """Call the handle; a handle that raises is logged and reported (False), never fatal to the loop."""
        try:
            call(handle)
        except Exception:
            logger.exception("a request's handle failed")
            return False
        return True
